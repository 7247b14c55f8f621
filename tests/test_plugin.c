/* The transport plugin ABI: a plugin with the wrong ABI version is refused with a clear
 * message; the TCP transport built as libtutti-transport-tcp.so loads through the same
 * table the built-in uses and runs collectives. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tutti/tutti.h>

#include "harness.h"
#include "plugin/transport.h"

#define BAD_PLUGIN TT_BUILD_DIR "/tests/libtutti-transport-badabi.so"
#define TCP_PLUGIN TT_BUILD_DIR "/lib/libtutti-transport-tcp.so"

START_TEST(bad_abi_refused)
{
    const tutti_transport_ops_v1_t *ops = NULL;
    void *h = NULL;
    char err[512];
    int st = tt_transport_load_file(BAD_PLUGIN, &ops, &h, err, sizeof(err));
    ck_assert_int_eq(st, TUTTI_ERR_PLUGIN);
    ck_assert_ptr_null(ops);
    ck_assert_msg(strstr(err, "ABI version 99") && strstr(err, "speaks version 1"), "%s", err);

    /* by name through TUTTI_PLUGIN_PATH, as a user would */
    st = tt_transport_load("badabi", TT_BUILD_DIR "/tests", &ops, &h, err, sizeof(err));
    ck_assert_int_eq(st, TUTTI_ERR_PLUGIN);
    ck_assert_msg(strstr(err, "ABI version 99"), "%s", err);
}
END_TEST

START_TEST(unknown_transport)
{
    const tutti_transport_ops_v1_t *ops = NULL;
    void *h = NULL;
    char err[1024];
    int st = tt_transport_load("nosuch", "/nonexistent", &ops, &h, err, sizeof(err));
    ck_assert_int_eq(st, TUTTI_ERR_PLUGIN);
    ck_assert_msg(strstr(err, "nosuch") && strstr(err, "built in: ") && strstr(err, "tcp"), "%s", err);
    st = tt_transport_load("../evil", NULL, &ops, &h, err, sizeof(err));
    ck_assert_int_lt(st, 0);
}
END_TEST

START_TEST(builtin_and_plugin_tables)
{
    const tutti_transport_ops_v1_t *builtin = NULL, *plugin = NULL;
    void *h = NULL;
    char err[512];
    ck_assert_int_eq(tt_transport_load("tcp", NULL, &builtin, &h, err, sizeof(err)), 0);
    ck_assert_ptr_null(h);
    ck_assert_int_eq(tt_transport_load_file(TCP_PLUGIN, &plugin, &h, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(h);
    ck_assert_ptr_ne(builtin, plugin); /* really a second copy, from the .so */
    ck_assert_str_eq(plugin->name, "tcp");
    ck_assert_uint_eq(plugin->size, sizeof(tutti_transport_ops_v1_t));
    ck_assert_uint_eq(plugin->abi_version, TUTTI_TRANSPORT_ABI_V1);
    tt_transport_unload(h);
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
    int32_t x[3] = {rank, rank * 2, 7}, y[3];
    if (tutti_allreduce(comm, x, y, 3, TUTTI_INT32, TUTTI_SUM) != 0) {
        fprintf(stderr, "%s\n", tutti_comm_last_error(comm));
        return 2;
    }
    int s = nranks * (nranks - 1) / 2;
    return (y[0] == s && y[1] == 2 * s && y[2] == 7 * nranks) ? 0 : 3;
}

START_TEST(collectives_through_plugin)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.transport = TCP_PLUGIN; /* a path loads that file */
    th_spec_t spec = {.nranks = 3, .fn = rank_plugin, .timeout_ms = 20000, .opts = &o};
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("plugin");
    TCase *tc = tcase_create("plugin");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, bad_abi_refused);
    tcase_add_test(tc, unknown_transport);
    tcase_add_test(tc, builtin_and_plugin_tables);
    tcase_add_test(tc, collectives_through_plugin);
    suite_add_tcase(s, tc);
    setenv("TUTTI_SOCKET_IFNAME", "lo", 0); /* tests stay on loopback */
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
