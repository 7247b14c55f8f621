/* Per-peer transports: ranks told (through TUTTI_HOST_ID) that they sit on different
 * hosts reach their host-mates through one transport and the others through another,
 * and every collective still gives the plain-C answer. Two copies of the TCP transport
 * (the built-in and the plugin .so) stand in for "local" and "remote" wherever shm is
 * not built; with shm, auto is shm+tcp. Also: bad TUTTI_TRANSPORT strings, and shm
 * forced on ranks of different hosts, are config errors that say why. And TUTTI_BIND:
 * which CPU each host's ranks hold their large collectives on when they outnumber its
 * CPUs (from the host ids, as the transports are chosen). */
#include <check.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tutti/tutti.h>

#include "harness.h"
#include "base/base.h"
#include "plugin/transport.h"
#include "core/opts.h"
#include "core/state.h"

#define TCP_PLUGIN TT_BUILD_DIR "/lib/libtutti-transport-tcp.so"
#define SHM_PLUGIN TT_BUILD_DIR "/lib/libtutti-transport-shm.so"
/* the tcp sources built against ABI v1 (tests/meson.build), behind the loader's shim */
#define V1_PLUGIN TT_BUILD_DIR "/tests/libtutti-transport-tcpv1.so"

typedef struct mux_case {
    const char *transport;
    const char *hosts;  /* one letter per rank: its host id */
    const char *expect; /* tutti_comm_transport(), or NULL when init must fail */
    int expect_status;
} mux_case_t;

/* comm may be NULL where init must fail (a communicator made anyway is not kept). */
/* quiet: no spin, and a stall check every 60 s (waits end by wake-ups alone) */
static int open_comm_q(int rank, int nranks, const char *dir, const mux_case_t *c, int quiet,
                       tutti_store_t **store, tutti_comm_t **comm)
{
    tutti_comm_t *unkept = NULL;
    if (!comm)
        comm = &unkept;
    if (tutti_store_open_file(store, dir, 20000) != 0)
        return TUTTI_ERR_STORE;
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 20000;
    o.transport = c->transport;
    if (quiet) {
        o.spin_us = 0;
        o.stall_check_ms = 60000;
    }
    char hid[8];
    snprintf(hid, sizeof(hid), "host%c", c->hosts[rank]);
    o.host_id = hid;
    return tutti_comm_init(comm, *store, rank, nranks, &o);
}

static int open_comm(int rank, int nranks, const char *dir, const mux_case_t *c,
                     tutti_store_t **store, tutti_comm_t **comm)
{
    return open_comm_q(rank, nranks, dir, c, 0, store, comm);
}

static int rank_mixed(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const mux_case_t *c = arg;
    tutti_store_t *store = NULL;
    tutti_comm_t *comm = NULL;
    int st = open_comm(rank, nranks, dir, c, &store, &comm);
    FAIL_IF(st != 0, "init: %s: %s", tutti_status_name(st),
            comm ? tutti_comm_last_error(comm) : "");
    /* "a+b": a rank with host-mates and others uses both; one with only others uses b */
    char want[64];
    snprintf(want, sizeof(want), "%s", c->expect);
    int mates = 0, others = 0;
    for (int r = 0; r < nranks; r++)
        if (r != rank)
            c->hosts[r] == c->hosts[rank] ? mates++ : others++;
    char *plus = strchr(want, '+');
    if (plus && !mates)
        memmove(want, plus + 1, strlen(plus));
    else if (plus && !others)
        *plus = 0;
    FAIL_IF(strcmp(tutti_comm_transport(comm), want), "transport %s, expected %s",
            tutti_comm_transport(comm), want);

    /* allreduce, small to pipelined */
    const size_t counts[] = { 1, 1000, 300001 };
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        size_t n = counts[k];
        int64_t *x = malloc(n * sizeof(int64_t)), *y = malloc(n * sizeof(int64_t));
        FAIL_IF(!x || !y, "malloc");
        for (size_t i = 0; i < n; i++)
            x[i] = (int64_t)(rank + 1) * (int64_t)(i % 977) - rank;
        st = tutti_allreduce(comm, x, y, n, TUTTI_INT64, TUTTI_SUM);
        FAIL_IF(st != 0, "allreduce %zu: %s", n, tutti_comm_last_error(comm));
        int64_t ranksum = (int64_t)nranks * (nranks + 1) / 2,
                rsum = (int64_t)nranks * (nranks - 1) / 2;
        for (size_t i = 0; i < n; i++)
            FAIL_IF(y[i] != ranksum * (int64_t)(i % 977) - rsum, "allreduce %zu: [%zu] = %lld", n,
                    i, (long long)y[i]);
        free(x);
        free(y);
    }

    /* broadcast from the last rank */
    size_t bn = 100003;
    uint8_t *b = malloc(bn);
    FAIL_IF(!b, "malloc");
    for (size_t i = 0; i < bn; i++)
        b[i] = rank == nranks - 1 ? (uint8_t)(i * 7 + 3) : 0;
    st = tutti_broadcast(comm, TUTTI_IN_PLACE, b, bn, TUTTI_UINT8, nranks - 1);
    FAIL_IF(st != 0, "broadcast: %s", tutti_comm_last_error(comm));
    for (size_t i = 0; i < bn; i++)
        FAIL_IF(b[i] != (uint8_t)(i * 7 + 3), "broadcast [%zu] = %u", i, b[i]);
    free(b);

    /* alltoall: every pair talks, through whichever transport serves it */
    size_t blk = 513;
    int32_t *s = malloc((size_t)nranks * blk * 4), *r = malloc((size_t)nranks * blk * 4);
    FAIL_IF(!s || !r, "malloc");
    for (int j = 0; j < nranks; j++)
        for (size_t i = 0; i < blk; i++)
            s[(size_t)j * blk + i] = rank * 1000000 + j * 1000 + (int32_t)i;
    st = tutti_alltoall(comm, s, r, blk, TUTTI_INT32);
    FAIL_IF(st != 0, "alltoall: %s", tutti_comm_last_error(comm));
    for (int j = 0; j < nranks; j++)
        for (size_t i = 0; i < blk; i++)
            FAIL_IF(r[(size_t)j * blk + i] != j * 1000000 + rank * 1000 + (int32_t)i,
                    "alltoall from %d [%zu]", j, i);
    free(s);
    free(r);

    /* point to point around the ring, both directions in flight at once */
    int32_t out[64], in[64];
    for (int i = 0; i < 64; i++)
        out[i] = rank * 64 + i;
    tutti_work_t *ws = NULL, *wr = NULL;
    st = tutti_send_async(comm, out, 64, TUTTI_INT32, (rank + 1) % nranks, 7, &ws);
    FAIL_IF(st != 0, "isend: %s", tutti_comm_last_error(comm));
    st = tutti_recv_async(comm, in, 64, TUTTI_INT32, (rank + nranks - 1) % nranks, 7, &wr);
    FAIL_IF(st != 0, "irecv: %s", tutti_comm_last_error(comm));
    FAIL_IF(tutti_wait(wr, -1) != 0 || tutti_wait(ws, -1) != 0, "p2p: %s",
            tutti_comm_last_error(comm));
    tutti_work_free(ws);
    tutti_work_free(wr);
    int from = (rank + nranks - 1) % nranks;
    for (int i = 0; i < 64; i++)
        FAIL_IF(in[i] != from * 64 + i, "recv [%d] = %d", i, in[i]);

    /* tutti_cancel through the mux: rank 0's receives from every rank, posted in the
     * transport serving each, taken back (not by a v1 plugin, which has no cancel slot:
     * that one waits for its message); then each rank sends, and the receives issued
     * after take the messages (the numbers given back), the old uncancelled ones theirs */
    FAIL_IF(tutti_barrier(comm) != 0, "barrier: %s", tutti_comm_last_error(comm));
    if (rank == 0) {
        tutti_work_t *wc[16] = { NULL };
        int32_t got[16];
        for (int p = 1; p < nranks && p < 16; p++)
            FAIL_IF(tutti_recv_async(comm, &got[p], 1, TUTTI_INT32, p, 4242, &wc[p]) != 0,
                    "irecv %d", p);
        usleep(20 * 1000); /* (posted by then) */
        for (int p = 1; p < nranks && p < 16; p++) {
            int cancelled = -1,
                v1 = c->transport && strstr(c->transport, "tcpv1") && c->hosts[p] != c->hosts[0];
            FAIL_IF(tutti_cancel(wc[p], &cancelled) != 0 || cancelled != !v1,
                    "cancel of the receive from rank %d (%s): %d", p, v1 ? "v1 plugin" : "",
                    cancelled);
            if (cancelled) {
                tutti_work_free(wc[p]); /* freed at once: the mux must not look at it again */
                wc[p] = NULL;
            }
        }
        FAIL_IF(tutti_barrier(comm) != 0, "barrier: %s", tutti_comm_last_error(comm));
        for (int p = 1; p < nranks && p < 16; p++) {
            got[0] = -1;
            if (wc[p])
                FAIL_IF(tutti_wait(wc[p], -1) != 0, "old receive from %d", p);
            else
                FAIL_IF(tutti_recv(comm, &got[p], 1, TUTTI_INT32, p, 4242) != 0,
                        "receive from %d: %s", p, tutti_comm_last_error(comm));
            FAIL_IF(got[p] != 10 * p, "from %d: %d", p, got[p]);
            tutti_work_free(wc[p]);
        }
    } else {
        FAIL_IF(tutti_barrier(comm) != 0, "barrier: %s", tutti_comm_last_error(comm));
        int32_t v = 10 * rank;
        FAIL_IF(tutti_send(comm, &v, 1, TUTTI_INT32, 0, 4242) != 0, "send: %s",
                tutti_comm_last_error(comm));
    }

    FAIL_IF(tutti_barrier(comm) != 0, "barrier: %s", tutti_comm_last_error(comm));
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

static int rank_refused(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const mux_case_t *c = arg;
    tutti_store_t *store = NULL;
    int st = open_comm(rank, nranks, dir, c, &store, NULL);
    FAIL_IF(st != c->expect_status, "init gave %s, expected %s", tutti_status_name(st),
            tutti_status_name(c->expect_status));
    tutti_store_close(store);
    return 0;
}

static int have(const char *name)
{
    const tutti_transport_ops_v2_t *ops;
    void *h = NULL;
    char err[512];
    for (const tt_builtin_transport_t *b = tt_builtin_transports; b->name; b++)
        if (!strcmp(b->name, name))
            return tt_transport_load(name, NULL, &ops, &h, err, sizeof(err)) == 0;
    return 0;
}

static const mux_case_t tcp_cases[] = {
    { "local=" TCP_PLUGIN ",remote=tcp", "AABB", "tcp+tcp", 0 },
    { "local=" TCP_PLUGIN ",remote=tcp", "ABAB", "tcp+tcp", 0 },
    { "local=" TCP_PLUGIN ",remote=tcp", "AAB", "tcp+tcp", 0 },
    { "local=" TCP_PLUGIN, "AABBA", "tcp+tcp", 0 },
    { "local=" TCP_PLUGIN ",remote=tcp", "AAAA", "tcp", 0 }, /* one host: no mux */
    { "local=tcp,remote=" V1_PLUGIN, "AAB", "tcp+tcp", 0 },  /* a v1 plugin in the mux */
};

/* One mixed-transport case: a rank per letter of c->hosts. */
static void run_mixed(const mux_case_t *c)
{
    th_spec_t spec = { .nranks = (int)strlen(c->hosts),
                       .fn = rank_mixed,
                       .arg = (void *)c,
                       .timeout_ms = 60000,
                       .flags = TH_NO_COMM };
    ck_assert_msg(th_run_ex(&spec, NULL) == 0, "%s on hosts %s", c->transport, c->hosts);
}

START_TEST(mixed_tcp)
{
    const mux_case_t *c = &tcp_cases[_i];
    run_mixed(c);
}
END_TEST

static const mux_case_t shm_cases[] = {
    { "auto", "AABB", "shm+tcp", 0 },
    { NULL, "ABBA", "shm+tcp", 0 },
    { "local=shm,remote=tcp", "AAB", "shm+tcp", 0 },
    { "auto", "AAA", "shm", 0 },
    { "auto", "ABC", "tcp", 0 }, /* nobody local: tcp alone */
    { "local=" SHM_PLUGIN ",remote=tcp", "AAB", "shm+tcp", 0 },
};

START_TEST(mixed_shm)
{
    if (!have("shm")) {
        fprintf(stderr, "mixed_shm: shm is not built in; skipped\n");
        return;
    }
    const mux_case_t *c = &shm_cases[_i];
    run_mixed(c);
}
END_TEST

START_TEST(shm_forced_across_hosts)
{
    if (!have("shm")) {
        fprintf(stderr, "shm_forced_across_hosts: shm is not built in; skipped\n");
        return;
    }
    /* by name, and as a plugin file: its properties say local-only, not its name */
    mux_case_t c[] = { { "shm", "AB", NULL, TUTTI_ERR_CONFIG },
                       { SHM_PLUGIN, "AB", NULL, TUTTI_ERR_CONFIG } };
    for (int k = 0; k < 2; k++) {
        th_spec_t spec = {
            .nranks = 2, .fn = rank_refused, .arg = &c[k], .timeout_ms = 30000, .flags = TH_NO_COMM
        };
        ck_assert_msg(th_run_ex(&spec, NULL) == 0, "%s", c[k].transport);
    }
}
END_TEST

/* A rank blocked on a hung rank learns promptly that a third rank failed, even when
 * that rank's report arrives on a link nothing reads (here on the other transport). A
 * tree broadcast from rank 1, which never calls it: rank 0 waits on its host-mate
 * rank 1 (local transport), rank 2 on another host waits on rank 1 too (remote), times
 * out after 300 ms and reports. Rank 0 must fail within the stall check (1 s) naming
 * rank 2 with rank 2's status, not when rank 1 exits (4 s) or at its own timeout (20 s). */
static int rank_report(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)nranks;
    const mux_case_t *c = arg;
    tutti_store_t *store = NULL;
    FAIL_IF(tutti_store_open_file(&store, dir, 20000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = rank == 2 ? 300 : 20000;
    o.algo = "broadcast:tree"; /* rank 0 receives from the root, rank 1 */
    o.transport = c->transport;
    char hid[8];
    snprintf(hid, sizeof(hid), "host%c", c->hosts[rank]);
    o.host_id = hid;
    tutti_comm_t *comm = NULL;
    int st = tutti_comm_init(&comm, store, rank, 3, &o);
    FAIL_IF(st != 0, "init: %s", tutti_status_name(st));
    FAIL_IF(strcmp(tutti_comm_transport(comm), rank == 2 ? "tcp" : c->expect), "transport %s",
            tutti_comm_transport(comm));
    FAIL_IF(tutti_barrier(comm) != 0, "barrier: %s", tutti_comm_last_error(comm));
    int32_t v = 0;
    double t0 = th_now_ms();
    if (rank == 0) {
        st = tutti_broadcast(comm, TUTTI_IN_PLACE, &v, 1, TUTTI_INT32, 1);
        double ms = th_now_ms() - t0;
        FAIL_IF(st != TUTTI_ERR_TIMEOUT, "got %s, want rank 2's own status, TIMEOUT: %s",
                tutti_status_name(st), tutti_comm_last_error(comm));
        FAIL_IF(ms > 3000, "failed only after %.0f ms: %s", ms, tutti_comm_last_error(comm));
        FAIL_IF(!strstr(tutti_comm_last_error(comm), "rank 2"),
                "after %.0f ms: \"%s\" names "
                "no rank 2",
                ms, tutti_comm_last_error(comm));
    } else if (rank == 1) {
        usleep(4000000); /* silent, then gone */
    } else {
        st = tutti_broadcast(comm, TUTTI_IN_PLACE, &v, 1, TUTTI_INT32, 1);
        FAIL_IF(st != TUTTI_ERR_TIMEOUT, "rank 2: %s", tutti_status_name(st));
    }
    if (rank != 1)
        tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

START_TEST(report_on_idle_transport)
{
    mux_case_t c[2] = { { "local=" TCP_PLUGIN ",remote=tcp", "AAB", "tcp+tcp", 0 },
                        { "local=shm,remote=tcp", "AAB", "shm+tcp", 0 } };
    for (int k = 0; k < (have("shm") ? 2 : 1); k++) {
        th_spec_t spec = { .nranks = 3,
                           .fn = rank_report,
                           .arg = &c[k],
                           .timeout_ms = 30000,
                           .flags = TH_NO_COMM | TH_NO_KILL_ON_FAIL };
        int codes[3];
        ck_assert_msg(th_run_ex(&spec, codes) == 0, "%s: exit codes %d %d %d", c[k].transport,
                      codes[0], codes[1], codes[2]);
    }
}
END_TEST

/* ---- a wait with requests on two transports sleeps on both (the ABI's arm()) ----
 * Through the communicator's transport table (the multiplexer), between collectives:
 * rank 0 posts a receive from rank 1 (local) and one from rank 2 (remote) and calls
 * progress() with a 10 s timeout until one of them is done, while the other stays
 * pending; that one's sender sends 50 ms later, when rank 0 sleeps. Without a spin and
 * with shm's liveness checks and ibverbs' keepalive probes every 60 s, only the
 * message's wake-up ends the sleep: a lost one holds progress() for 10 s. Then the same
 * the other way round. */
static void raw_req(tutti_tp_req_v2_t *r, int peer, int32_t *buf, int k)
{
    memset(r, 0, sizeof(*r));
    r->peer = peer;
    r->buf = buf;
    r->len = sizeof(*buf);
    r->env[0] = 0x5eed;
    r->env[1] = (uint64_t)k;
    r->mem = TUTTI_MEM_HOST;
}

static int rank_both(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const mux_case_t *c = arg;
    setenv("TUTTI_SHM_LIVENESS_MS", "60000", 1);
    setenv("TUTTI_IB_KEEPALIVE_MS", "60000", 1);
    tutti_store_t *store = NULL;
    tutti_comm_t *comm = NULL;
    int st = open_comm_q(rank, nranks, dir, c, 1, &store, &comm);
    FAIL_IF(st != 0, "init: %s", tutti_status_name(st));
    const char *remote = strchr(c->expect, '+') + 1; /* rank 2's only transport */
    FAIL_IF(strcmp(tutti_comm_transport(comm), rank == 2 ? remote : c->expect), "transport %s",
            tutti_comm_transport(comm));
    const tutti_transport_ops_v2_t *ops = comm->tp_ops;
    for (int k = 0; k < 2; k++) {
        int awaited = k == 0 ? 2 : 1, other = 3 - awaited;
        char posted[16], got[16];
        snprintf(posted, sizeof(posted), "posted%d", k);
        snprintf(got, sizeof(got), "got%d", k);
        if (rank == 0) {
            int32_t in[3] = { -1, -1, -1 };
            tutti_tp_req_v2_t r[3];
            for (int p = 1; p < 3; p++) {
                raw_req(&r[p], p, &in[p], k);
                FAIL_IF(ops->post_recv(comm->tp, &r[p]) != 0, "post_recv from %d", p);
            }
            FAIL_IF(tutti_store_set(store, posted, "1", 1) != 0, "store set");
            double t0 = th_now_ms();
            while (r[awaited].status == 1 && th_now_ms() - t0 < 20000)
                FAIL_IF(ops->progress(comm->tp, 10000) < 0, "progress");
            double dt = th_now_ms() - t0;
            FAIL_IF(r[awaited].status != 0 || dt > 5000,
                    "rank %d's message (rank %d's pending): status %d after %.0f ms (a lost "
                    "wake-up?)",
                    awaited, other, r[awaited].status, dt);
            FAIL_IF(r[other].status != 1, "rank %d's message came early", other);
            FAIL_IF(tutti_store_set(store, got, "1", 1) != 0, "store set");
            t0 = th_now_ms();
            while (r[other].status == 1 && th_now_ms() - t0 < 20000)
                FAIL_IF(ops->progress(comm->tp, 10000) < 0, "progress");
            FAIL_IF(r[other].status != 0, "rank %d's message: status %d", other, r[other].status);
            for (int p = 1; p < 3; p++)
                FAIL_IF(in[p] != 1000 * k + p, "from rank %d: %d", p, in[p]);
        } else {
            void *val = NULL;
            size_t len = 0;
            FAIL_IF(tutti_store_get(store, rank == awaited ? posted : got, &val, &len, 20000) != 0,
                    "store get");
            free(val);
            if (rank == awaited)
                th_sleep_ms(50);
            int32_t v = 1000 * k + rank;
            tutti_tp_req_v2_t r;
            raw_req(&r, 0, &v, k);
            FAIL_IF(ops->post_send(comm->tp, &r) != 0, "post_send");
            double t0 = th_now_ms();
            while (r.status == 1 && th_now_ms() - t0 < 20000)
                FAIL_IF(ops->progress(comm->tp, 100) < 0, "progress");
            FAIL_IF(r.status != 0, "send: status %d", r.status);
        }
    }
    FAIL_IF(tutti_barrier(comm) != 0, "barrier: %s", tutti_comm_last_error(comm));
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

/* TT_TEST_IB_MUX=1 (the soft-RoCE guest, tests/rdma/guest-suite.sh): shm+ibverbs too */
START_TEST(sleeps_on_both)
{
    mux_case_t c[3] = { { "local=" TCP_PLUGIN ",remote=tcp", "AAB", "tcp+tcp", 0 },
                        { "local=shm,remote=tcp", "AAB", "shm+tcp", 0 },
                        { "local=shm,remote=ibverbs", "AAB", "shm+ibverbs", 0 } };
    const char *ib = getenv("TT_TEST_IB_MUX");
    int n = ib && !strcmp(ib, "1") ? 3 : have("shm") ? 2 : 1;
    for (int k = 0; k < n; k++) {
        if (strstr(c[k].transport, ".so") && access(TCP_PLUGIN, R_OK) != 0) {
            fprintf(stderr, "sleeps_on_both: %s is not here; skipped\n", TCP_PLUGIN);
            continue;
        }
        th_spec_t spec = {
            .nranks = 3, .fn = rank_both, .arg = &c[k], .timeout_ms = 60000, .flags = TH_NO_COMM
        };
        ck_assert_msg(th_run_ex(&spec, NULL) == 0, "%s: see above", c[k].transport);
    }
}
END_TEST

/* rm -rf dir: system()'s result */
static int rm_rf(const char *dir)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd);
}

START_TEST(bad_spec)
{
    char dir[] = "/tmp/tutti-mux-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    tutti_store_t *store = NULL;
    ck_assert_int_eq(tutti_store_open_file(&store, dir, 5000), 0);
    const char *bad[] = { "local=tcp,far=tcp", "remote=shm", "local=", "remote=" SHM_PLUGIN };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tutti_comm_opts_t o;
        tutti_comm_opts_init(&o);
        o.transport = bad[i];
        tutti_comm_t *comm = NULL;
        int st = tutti_comm_init(&comm, store, 0, 1, &o);
        ck_assert_msg(st == TUTTI_ERR_CONFIG, "%s: %s", bad[i], tutti_status_name(st));
        ck_assert_ptr_null(comm);
    }
    tutti_store_close(store);
    ck_assert_int_eq(rm_rf(dir), 0);
}
END_TEST

START_TEST(transport_options)
{
    char buf[64];
    const char *l = "SHM_RING_BYTES=1M,IB_DEV=mlx5_0:1,SHM=x";
    ck_assert_str_eq(tt_kv_lookup(l, "SHM_RING_BYTES", buf, sizeof(buf)), "1M");
    ck_assert_str_eq(tt_kv_lookup(l, "IB_DEV", buf, sizeof(buf)), "mlx5_0:1");
    ck_assert_str_eq(tt_kv_lookup(l, "SHM", buf, sizeof(buf)), "x");
    ck_assert_ptr_null(tt_kv_lookup(l, "SHM_RING", buf, sizeof(buf)));
    ck_assert_ptr_null(tt_kv_lookup(l, "IB_GID_INDEX", buf, sizeof(buf)));
    ck_assert_ptr_null(tt_kv_lookup(NULL, "X", buf, sizeof(buf)));
    ck_assert_str_eq(tt_kv_lookup("A=,B=2", "A", buf, sizeof(buf)), ""); /* set, empty */
}
END_TEST

/* TUTTI_BIND. The test process runs on two CPUs (a, b) and its ranks inherit them. */
typedef struct bind_case {
    const char *transport, *bind;
    const char *hosts;  /* one letter per rank: its host id */
    const char *expect; /* per rank: 'a' or 'b', the CPU it holds large ops on; '-' none */
    int pin;            /* 1: each rank narrows itself to a or b first (a launcher's placement) */
} bind_case_t;

static const bind_case_t bind_cases[] = {
    { "tcp", NULL, "AAA", "aab", 0 },      /* crowded: neighbours together */
    { "auto", "auto", "AAAA", "aabb", 0 }, /* shm where built */
    { "tcp", "none", "AAA", "---", 0 },
    { "tcp", NULL, "AA", "--", 0 },     /* a CPU each: not crowded */
    { "tcp", NULL, "AAA", "---", 1 },   /* placed by a launcher: left there */
    { "tcp", NULL, "ABAA", "a-ab", 0 }, /* per host: ranks 0, 2, 3 share host A */
};

static int cpu_nth(const cpu_set_t *set, int k)
{
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, set) && k-- == 0)
            return c;
    return -1;
}

static int rank_bind(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const bind_case_t *c = arg;
    cpu_set_t two, now;
    FAIL_IF(sched_getaffinity(0, sizeof(two), &two) != 0 || CPU_COUNT(&two) != 2, "two CPUs");
    const int a = cpu_nth(&two, 0), b = cpu_nth(&two, 1);
    const int want = c->expect[rank] == 'a' ? a : c->expect[rank] == 'b' ? b : -1;
    cpu_set_t mine = two;
    if (c->pin) {
        CPU_ZERO(&mine);
        CPU_SET(rank % 2 ? b : a, &mine);
        FAIL_IF(sched_setaffinity(0, sizeof(mine), &mine) != 0, "pin");
    }
    tutti_store_t *store = NULL;
    tutti_comm_t *comm = NULL;
    FAIL_IF(tutti_store_open_file(&store, dir, 20000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 20000;
    o.transport = c->transport;
    o.bind = c->bind;
    char hid[8];
    snprintf(hid, sizeof(hid), "host%c", c->hosts[rank]);
    o.host_id = hid;
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    FAIL_IF(st != 0, "init: %s", tutti_status_name(st));
    FAIL_IF(comm->bind_cpu != want, "%s on %s: rank %d holds on CPU %d, expected %d", c->transport,
            c->hosts, rank, comm->bind_cpu, want);

    /* one op at TT_BIND_MIN_BYTES (held where a CPU was chosen) and one below (never),
     * each checked against the plain-C sum, the thread's mask its own again after each */
    const size_t sizes[] = { TT_BIND_MIN_BYTES / 4, TT_BIND_MIN_BYTES / 4 - 1 };
    for (size_t k = 0; k < 2; k++) {
        size_t n = sizes[k];
        unsigned long before = atomic_load(&comm->bound_ops);
        int32_t *x = malloc(n * 4), *y = malloc(n * 4);
        FAIL_IF(!x || !y, "malloc");
        for (size_t i = 0; i < n; i++)
            x[i] = (int32_t)((size_t)(rank + 1) * (i % 1001));
        st = tutti_allreduce(comm, x, y, n, TUTTI_INT32, TUTTI_SUM);
        FAIL_IF(st != 0, "allreduce %zu: %s", n, tutti_comm_last_error(comm));
        for (size_t i = 0; i < n; i++)
            FAIL_IF(y[i] != (int32_t)((size_t)nranks * (nranks + 1) / 2 * (i % 1001)),
                    "allreduce %zu: [%zu] = %d", n, i, y[i]);
        free(x);
        free(y);
        unsigned long held = atomic_load(&comm->bound_ops) - before;
        FAIL_IF(held != (k == 0 && want >= 0), "allreduce of %zu B: held %lu times", n * 4, held);
        FAIL_IF(sched_getaffinity(0, sizeof(now), &now) != 0 || !CPU_EQUAL(&now, &mine),
                "allreduce of %zu B: the thread's mask was not given back (%d CPUs)", n * 4,
                CPU_COUNT(&now));
    }
    /* broadcast is never held (its chain wants neighbours apart) */
    unsigned long before = atomic_load(&comm->bound_ops);
    uint8_t *bb = malloc(TT_BIND_MIN_BYTES);
    FAIL_IF(!bb, "malloc");
    for (size_t i = 0; i < TT_BIND_MIN_BYTES; i++)
        bb[i] = rank == 0 ? (uint8_t)(i * 5 + 1) : 0;
    st = tutti_broadcast(comm, TUTTI_IN_PLACE, bb, TT_BIND_MIN_BYTES, TUTTI_UINT8, 0);
    FAIL_IF(st != 0, "broadcast: %s", tutti_comm_last_error(comm));
    for (size_t i = 0; i < TT_BIND_MIN_BYTES; i++)
        FAIL_IF(bb[i] != (uint8_t)(i * 5 + 1), "broadcast [%zu] = %u", i, bb[i]);
    free(bb);
    FAIL_IF(atomic_load(&comm->bound_ops) != before, "a broadcast was held");
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

START_TEST(bind)
{
    const bind_case_t *c = &bind_cases[_i];
    cpu_set_t all, two;
    ck_assert_int_eq(sched_getaffinity(0, sizeof(all), &all), 0);
    if (CPU_COUNT(&all) < 2) {
        fprintf(stderr, "bind: this process may use 1 CPU; skipped\n");
        return;
    }
    CPU_ZERO(&two);
    CPU_SET(cpu_nth(&all, 0), &two);
    CPU_SET(cpu_nth(&all, 1), &two);
    ck_assert_int_eq(sched_setaffinity(0, sizeof(two), &two), 0);
    th_spec_t spec = { .nranks = (int)strlen(c->hosts),
                       .fn = rank_bind,
                       .arg = (void *)c,
                       .timeout_ms = 60000,
                       .flags = TH_NO_COMM };
    int rc = th_run_ex(&spec, NULL);
    ck_assert_int_eq(sched_setaffinity(0, sizeof(all), &all), 0);
    ck_assert_msg(rc == 0, "%s, bind %s, hosts %s", c->transport, c->bind ? c->bind : "(env)",
                  c->hosts);
}
END_TEST

/* TUTTI_BIND neither auto nor none: a config error that names it */
START_TEST(bind_bad_value)
{
    tutti_store_t *store = NULL;
    char dir[] = "/tmp/tutti-mux-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(tutti_store_open_file(&store, dir, 5000), 0);
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.bind = "always";
    tutti_comm_t *comm = NULL;
    ck_assert_int_eq(tutti_comm_init(&comm, store, 0, 1, &o), TUTTI_ERR_CONFIG);
    ck_assert_ptr_null(comm);
    ck_assert_ptr_nonnull(strstr(tutti_comm_last_error(NULL), "TUTTI_BIND=always"));
    tutti_store_close(store);
    ck_assert_int_eq(rm_rf(dir), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("mux");
    TCase *tc = tcase_create("mux");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, mixed_tcp, 0, sizeof(tcp_cases) / sizeof(tcp_cases[0]));
    tcase_add_loop_test(tc, mixed_shm, 0, sizeof(shm_cases) / sizeof(shm_cases[0]));
    tcase_add_test(tc, shm_forced_across_hosts);
    tcase_add_test(tc, bad_spec);
    tcase_add_test(tc, report_on_idle_transport);
    tcase_add_test(tc, transport_options);
    tcase_add_loop_test(tc, bind, 0, sizeof(bind_cases) / sizeof(bind_cases[0]));
    tcase_add_test(tc, bind_bad_value);
    suite_add_tcase(s, tc);
    TCase *sl = tcase_create("sleeps"); /* alone in the soft-RoCE guest */
    tcase_set_timeout(sl, 120);
    tcase_add_test(sl, sleeps_on_both);
    suite_add_tcase(s, sl);
    return th_main(s);
}
