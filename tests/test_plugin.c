/* The transport plugin ABI: a plugin with the wrong ABI version is refused with a clear
 * message; the TCP transport built as libtutti-transport-tcp.so (ABI v2) and as a v1
 * plugin (through the loader's shim) loads and runs collectives. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tutti/tutti.h>

#include "harness.h"
#include "coll/cost.h"
#include "plugin/transport.h"

#define BAD_PLUGIN TT_BUILD_DIR "/tests/libtutti-transport-badabi.so"
#define TCP_PLUGIN TT_BUILD_DIR "/lib/libtutti-transport-tcp.so"
/* the tcp sources built against ABI v1 (tests/meson.build): what an old plugin is */
#define V1_PLUGIN TT_BUILD_DIR "/tests/libtutti-transport-tcpv1.so"

START_TEST(bad_abi_refused)
{
    const tutti_transport_ops_v2_t *ops = NULL;
    void *h = NULL;
    char err[512];
    int st = tt_transport_load_file(BAD_PLUGIN, &ops, &h, err, sizeof(err));
    ck_assert_int_eq(st, TUTTI_ERR_PLUGIN);
    ck_assert_ptr_null(ops);
    ck_assert_msg(strstr(err, "ABI version 99") && strstr(err, "speaks version 2 (and 1)"), "%s",
                  err);

    /* by name through TUTTI_PLUGIN_PATH, as a user would */
    st = tt_transport_load("badabi", TT_BUILD_DIR "/tests", &ops, &h, err, sizeof(err));
    ck_assert_int_eq(st, TUTTI_ERR_PLUGIN);
    ck_assert_msg(strstr(err, "ABI version 99"), "%s", err);
}
END_TEST

START_TEST(unknown_transport)
{
    const tutti_transport_ops_v2_t *ops = NULL;
    void *h = NULL;
    char err[1024];
    int st = tt_transport_load("nosuch", "/nonexistent", &ops, &h, err, sizeof(err));
    ck_assert_int_eq(st, TUTTI_ERR_PLUGIN);
    ck_assert_msg(strstr(err, "nosuch") && strstr(err, "built in: ") && strstr(err, "tcp"), "%s",
                  err);
    st = tt_transport_load("../evil", NULL, &ops, &h, err, sizeof(err));
    ck_assert_int_lt(st, 0);
}
END_TEST

START_TEST(builtin_and_plugin_tables)
{
    const tutti_transport_ops_v2_t *builtin = NULL, *plugin = NULL;
    void *h = NULL;
    char err[512];
    ck_assert_int_eq(tt_transport_load("tcp", NULL, &builtin, &h, err, sizeof(err)), 0);
    ck_assert_ptr_null(h);
    ck_assert_int_eq(tt_transport_load_file(TCP_PLUGIN, &plugin, &h, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(h);
    ck_assert_ptr_ne(builtin, plugin); /* really a second copy, from the .so */
    ck_assert_str_eq(plugin->name, "tcp");
    ck_assert_uint_eq(plugin->size, sizeof(tutti_transport_ops_v2_t));
    ck_assert_uint_eq(plugin->abi_version, TUTTI_TRANSPORT_ABI_V2);
    /* the plugin's properties are the built-in's: the core reads them, not names */
    ck_assert_int_eq(memcmp(&plugin->props, &builtin->props, sizeof(plugin->props)), 0);
    ck_assert(plugin->props.mem_kinds & TUTTI_MEM_BIT(TUTTI_MEM_HOST));
    ck_assert(!(plugin->props.flags & TUTTI_TP_LOCAL_ONLY));
    tt_transport_unload(h);
    const tutti_tp_props_v2_t *shm = tt_transport_builtin_props("shm");
    if (shm)
        ck_assert(shm->flags & TUTTI_TP_LOCAL_ONLY);
    ck_assert_ptr_null(tt_transport_builtin_props("nosuch"));
}
END_TEST

/* A v1 plugin loads through the shim: a v2 table with default properties, whose posts
 * refuse what v1 cannot carry. Loading it twice shares one shim slot. */
START_TEST(v1_plugin_through_shim)
{
    const tutti_transport_ops_v2_t *ops = NULL, *again = NULL;
    void *h = NULL, *h2 = NULL;
    char err[512];
    ck_assert_msg(tt_transport_load_file(V1_PLUGIN, &ops, &h, err, sizeof(err)) == 0, "%s", err);
    ck_assert_str_eq(ops->name, "tcp");
    ck_assert_uint_eq(ops->abi_version, TUTTI_TRANSPORT_ABI_V2);
    ck_assert_uint_eq(ops->props.flags, 0);
    ck_assert_uint_eq(ops->props.mem_kinds, TUTTI_MEM_BIT(TUTTI_MEM_HOST));
    ck_assert(ops->props.alpha_us == 0 && ops->props.bw_gbs == 0); /* no hints in v1 */
    ck_assert_ptr_null(ops->register_mem);
    ck_assert_int_eq(tt_transport_load("tcpv1", TT_BUILD_DIR "/tests", &again, &h2, err,
                                       sizeof(err)),
                     0);
    ck_assert_ptr_eq(again, ops);
    tt_transport_unload(h2);
    /* device memory and streams do not pass the shim (the v1 plugin never sees them) */
    tutti_tp_req_v2_t r = { .peer = 1, .len = 0, .mem = TUTTI_MEM_CUDA };
    ck_assert_int_eq(ops->post_send(NULL, &r), TUTTI_ERR_UNSUPPORTED);
    ck_assert_int_eq(r.status, TUTTI_ERR_UNSUPPORTED);
    r = (tutti_tp_req_v2_t){ .peer = 1, .stream = &r };
    ck_assert_int_eq(ops->post_recv(NULL, &r), TUTTI_ERR_UNSUPPORTED);
    tt_transport_unload(h);
}
END_TEST

/* The cost model takes the transports' own hints, whatever their names; a part without
 * hints (a v1 plugin) counts as a socket transport, and the slowest part sets the pace. */
START_TEST(cost_from_properties)
{
    tt_cost_t c, tcp;
    tt_cost_table(&tcp, "tcp");
    const tutti_tp_props_v2_t fast = { .mem_kinds = 1, .alpha_us = 0.5, .bw_gbs = 50 },
                              none = { .mem_kinds = 1 };
    const tutti_tp_props_v2_t *p[2] = { &fast, &none };
    tt_cost_from_props(&c, "fab", p, 1);
    ck_assert(c.alpha_us == 0.5 && c.beta_ns == 1.0 / 50);
    ck_assert_str_eq(c.source, "table fab");
    tt_cost_from_props(&c, "fab+old", p, 2);
    ck_assert(c.alpha_us == tcp.alpha_us && c.beta_ns == tcp.beta_ns);
    ck_assert_str_eq(c.source, "table tcp");
    /* the built-ins' hints are what the name table used to say */
    ck_assert(tcp.alpha_us == 10.0 && tcp.beta_ns == 1.0 / 2.0);
}
END_TEST

static int rank_plugin(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    if (strcmp(tutti_comm_transport(comm), "tcp")) {
        fprintf(stderr, "transport %s\n", tutti_comm_transport(comm));
        return 1;
    }
    int32_t x[3] = { rank, rank * 2, 7 }, y[3];
    if (tutti_allreduce(comm, x, y, 3, TUTTI_INT32, TUTTI_SUM) != 0) {
        fprintf(stderr, "%s\n", tutti_comm_last_error(comm));
        return 2;
    }
    int s = nranks * (nranks - 1) / 2;
    return (y[0] == s && y[1] == 2 * s && y[2] == 7 * nranks) ? 0 : 3;
}

/* collectives through the v2 plugin, then through the v1 one (behind the shim) */
START_TEST(collectives_through_plugin)
{
    static const char *const paths[] = { TCP_PLUGIN, V1_PLUGIN };
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.transport = paths[_i]; /* a path loads that file */
    th_spec_t spec = { .nranks = 3, .fn = rank_plugin, .timeout_ms = 20000, .opts = &o };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* A transport whose create fails without a reason (out of memory, say): init names its
 * status, not an empty cause ("transport nomem failed to connect 2 ranks: ") */
static int rank_nomem(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 10000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.transport = "nomem";
    o.plugin_path = TT_BUILD_DIR "/tests";
    o.timeout_ms = 5000;
    tutti_comm_t *comm = NULL;
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    const char *e = tutti_comm_last_error(NULL);
    FAIL_IF(st != TUTTI_ERR_NOMEM, "init: %s (%s), wanted TUTTI_ERR_NOMEM", tutti_status_name(st),
            e);
    FAIL_IF(!strstr(e, "transport nomem failed to connect 2 ranks: out of memory"),
            "the error gives no cause: %s", e);
    tutti_store_close(store);
    return 0;
}

START_TEST(silent_transport_failure_named)
{
    th_spec_t spec = { .nranks = 2, .fn = rank_nomem, .timeout_ms = 20000, .flags = TH_NO_COMM };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("plugin");
    TCase *tc = tcase_create("plugin");
    tcase_set_timeout(tc, 60);
    const TTest *const tests[] = { bad_abi_refused,
                                   unknown_transport,
                                   builtin_and_plugin_tables,
                                   v1_plugin_through_shim,
                                   cost_from_properties,
                                   silent_transport_failure_named,
                                   NULL };
    for (const TTest *const *t = tests; *t; t++)
        tcase_add_test(tc, *t);
    tcase_add_loop_test(tc, collectives_through_plugin, 0, 2);
    suite_add_tcase(s, tc);
    return th_main(s); /* tests stay on loopback */
}
