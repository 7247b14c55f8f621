/* Errors: bad arguments, mismatched collectives, a rank killed mid-allreduce, a hung
 * rank, abort, unreachable stores and interfaces, init from the environment. Every
 * multi-rank case bounds its time and asserts how fast survivors fail. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <tutti/tutti.h>

#include "harness.h"


/* ---- bad arguments ---- */

static int rank_bad_args(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)nranks;
    (void)dir;
    (void)arg;
    float buf[8] = {0}, out[8];
    int st;
    st = tutti_allreduce(comm, buf, NULL, 8, TUTTI_FP32, TUTTI_SUM);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG, "NULL recvbuf gave %d", st);
    FAIL_IF(!strstr(tutti_comm_last_error(comm), "recvbuf"), "message: %s",
            tutti_comm_last_error(comm));
    st = tutti_allreduce(comm, NULL, out, 8, TUTTI_FP32, TUTTI_SUM);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG, "NULL sendbuf gave %d", st);
    st = tutti_allreduce(comm, buf, out, 8, (tutti_dtype_t)42, TUTTI_SUM);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG, "bad dtype gave %d", st);
    FAIL_IF(!strstr(tutti_comm_last_error(comm), "dtype 42"), "message: %s",
            tutti_comm_last_error(comm));
    st = tutti_allreduce(comm, buf, out, 8, TUTTI_FP32, (tutti_redop_t)-3);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG, "bad op gave %d", st);
    FAIL_IF(!strstr(tutti_comm_last_error(comm), "op -3"), "message: %s",
            tutti_comm_last_error(comm));
    st = tutti_allreduce(comm, buf + 1, buf, 4, TUTTI_FP32, TUTTI_SUM);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG, "overlap gave %d", st);
    st = tutti_allreduce(comm, buf, out, SIZE_MAX / 2, TUTTI_FP32, TUTTI_SUM);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG, "huge count gave %d", st);
    st = tutti_broadcast(comm, buf, buf, 8, TUTTI_FP32, 7);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG, "root 7 gave %d", st);
    FAIL_IF(!strstr(tutti_comm_last_error(comm), "root 7"), "message: %s",
            tutti_comm_last_error(comm));
    st = tutti_broadcast(comm, buf, buf, 8, TUTTI_FP32, -1);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG, "root -1 gave %d", st);
    st = tutti_allreduce_async(comm, buf, out, 8, TUTTI_FP32, TUTTI_SUM, NULL);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG, "NULL work_p gave %d", st);
    FAIL_IF(tutti_allreduce(NULL, buf, out, 8, TUTTI_FP32, TUTTI_SUM) != TUTTI_ERR_INVALID_ARG,
            "NULL comm accepted");
    FAIL_IF(tutti_wait(NULL, 0) != TUTTI_ERR_INVALID_ARG, "wait(NULL) accepted");
    /* Bad calls are caught before any communication: the communicator still works. */
    for (int i = 0; i < 8; i++)
        buf[i] = (float)(rank + i);
    st = tutti_allreduce(comm, buf, out, 8, TUTTI_FP32, TUTTI_SUM);
    FAIL_IF(st != TUTTI_OK, "allreduce after bad calls: %s", tutti_comm_last_error(comm));
    for (int i = 0; i < 8; i++)
        FAIL_IF(out[i] != (float)(1 + 2 * i), "out[%d] = %g", i, (double)out[i]);
    return 0;
}

START_TEST(bad_arguments)
{
    ck_assert_int_eq(th_run(2, rank_bad_args, NULL, 30000), 0);
}
END_TEST

static int rank_bad_args2(int rank, int nranks, tutti_comm_t *comm, const char *dir,
                          void *arg)
{
    (void)dir;
    (void)arg;
    float buf[64] = {0};
    size_t counts[2] = {4, 4}, huge[2] = {SIZE_MAX / 2, 1};
    int st;
#define EXPECT_BAD(call, needle)                                                        \
    do {                                                                                \
        st = (call);                                                                    \
        FAIL_IF(st != TUTTI_ERR_INVALID_ARG, "%s gave %s", #call, tutti_status_name(st)); \
        FAIL_IF(!strstr(tutti_comm_last_error(comm), needle), "%s: message \"%s\"", #call, \
                tutti_comm_last_error(comm));                                           \
    } while (0)
    EXPECT_BAD(tutti_reduce(comm, buf, buf, 4, TUTTI_FP32, TUTTI_SUM, nranks), "root 2");
    EXPECT_BAD(tutti_reduce(comm, buf, buf, 4, TUTTI_FP32, (tutti_redop_t)9, 0), "op 9");
    EXPECT_BAD(tutti_allgather(comm, buf, NULL, 4, TUTTI_FP32), "recvbuf");
    EXPECT_BAD(tutti_allgatherv(comm, buf, buf, NULL, NULL, TUTTI_FP32), "recvcounts is NULL");
    EXPECT_BAD(tutti_allgatherv(comm, buf, buf, huge, NULL, TUTTI_FP32), "too large");
    EXPECT_BAD(tutti_reduce_scatter(comm, NULL, buf, 4, TUTTI_FP32, TUTTI_SUM), "sendbuf");
    EXPECT_BAD(tutti_reduce_scatterv(comm, buf, buf, counts, (tutti_dtype_t)77, TUTTI_SUM),
               "dtype 77");
    EXPECT_BAD(tutti_gather(comm, buf, buf, 4, TUTTI_FP32, -1), "root -1");
    EXPECT_BAD(tutti_scatter(comm, buf, NULL, 4, TUTTI_FP32, 0), "recvbuf");
    EXPECT_BAD(tutti_alltoall(comm, NULL, buf, 4, TUTTI_FP32), "sendbuf");
    EXPECT_BAD(tutti_alltoallv(comm, buf, NULL, NULL, buf, counts, NULL, TUTTI_FP32),
               "sendcounts is NULL");
    EXPECT_BAD(tutti_allgather_async(comm, buf, buf, 4, TUTTI_FP32, NULL), "work_p");
    if (rank == 0)
        EXPECT_BAD(tutti_gatherv(comm, buf, 3, buf, counts, NULL, TUTTI_FP32, 0),
                   "differs from recvcounts[root]");
#undef EXPECT_BAD
    /* nothing was sent: the communicator still works */
    st = tutti_barrier(comm);
    FAIL_IF(st != TUTTI_OK, "barrier: %s", tutti_comm_last_error(comm));
    return 0;
}

START_TEST(bad_arguments_other_collectives)
{
    ck_assert_int_eq(th_run(2, rank_bad_args2, NULL, 30000), 0);
}
END_TEST

/* The new collectives: counts that differ between ranks are a mismatch on every rank,
 * and the async forms run in issue order with the right results. */
static int rank_new_mismatch(int rank, int nranks, tutti_comm_t *comm, const char *dir,
                             void *arg)
{
    (void)dir;
    int which = *(int *)arg;
    int32_t in[64], out[64 * 8];
    for (int i = 0; i < 64; i++)
        in[i] = rank * 100 + i;
    int st;
    size_t c = rank == 1 ? 5 : 6;
    if (which == 0)
        st = tutti_allgather(comm, in, out, c, TUTTI_INT32);
    else if (which == 1)
        st = tutti_reduce_scatter(comm, in, out, c, TUTTI_INT32, TUTTI_SUM);
    else
        st = tutti_alltoall(comm, in, out, c, TUTTI_INT32);
    const char *msg = tutti_comm_last_error(comm);
    FAIL_IF(st != TUTTI_ERR_MISMATCH, "which %d: got %s: %s", which, tutti_status_name(st), msg);
    FAIL_IF(!strstr(msg, "count=5") && !strstr(msg, "bytes"), "message: %s", msg);
    (void)nranks;
    return 0;
}

START_TEST(mismatch_other_collectives)
{
    for (int which = 0; which < 3; which++) {
        tutti_comm_opts_t o;
        tutti_comm_opts_init(&o);
        o.timeout_ms = 20000;
        th_spec_t spec = {.nranks = 3, .fn = rank_new_mismatch, .arg = &which,
                          .timeout_ms = 30000, .opts = &o};
        double t0 = th_now_ms();
        ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
        ck_assert_msg(th_now_ms() - t0 < 10000, "collective %d: took %.0f ms", which,
                      th_now_ms() - t0);
    }
}
END_TEST

static int rank_new_async(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    enum { C = 1000 };
    int64_t *ag_in = malloc(C * sizeof(int64_t)), *ag_out = malloc((size_t)nranks * C * 8);
    int64_t *rs_in = malloc((size_t)nranks * C * 8), rs_out[C];
    int64_t a2a_in[8 * 16], a2a_out[8 * 16];
    FAIL_IF(!ag_in || !ag_out || !rs_in, "malloc");
    for (int i = 0; i < C; i++)
        ag_in[i] = rank * 1000003LL + i;
    for (int b = 0; b < nranks; b++)
        for (int i = 0; i < C; i++)
            rs_in[b * C + i] = (rank + 1) * (b * C + i);
    for (int j = 0; j < nranks; j++)
        for (int i = 0; i < 16; i++)
            a2a_in[j * 16 + i] = rank * 1000 + j * 16 + i;
    tutti_work_t *w[3];
    FAIL_IF(tutti_allgather_async(comm, ag_in, ag_out, C, TUTTI_INT64, &w[0]) != 0, "ag");
    FAIL_IF(tutti_reduce_scatter_async(comm, rs_in, rs_out, C, TUTTI_INT64, TUTTI_SUM, &w[1]),
            "rs");
    FAIL_IF(tutti_alltoall_async(comm, a2a_in, a2a_out, 16, TUTTI_INT64, &w[2]) != 0, "a2a");
    for (int k = 2; k >= 0; k--) { /* waiting out of order is fine */
        int st = tutti_wait(w[k], -1);
        FAIL_IF(st != 0, "work %d: %s", k, tutti_work_error(w[k]));
        tutti_work_free(w[k]);
    }
    for (int r = 0; r < nranks; r++)
        for (int i = 0; i < C; i++)
            FAIL_IF(ag_out[r * C + i] != r * 1000003LL + i, "allgather [%d][%d]", r, i);
    int64_t tri = (int64_t)nranks * (nranks + 1) / 2;
    for (int i = 0; i < C; i++)
        FAIL_IF(rs_out[i] != tri * (rank * C + i), "reduce_scatter [%d] = %lld", i,
                (long long)rs_out[i]);
    for (int j = 0; j < nranks; j++)
        for (int i = 0; i < 16; i++)
            FAIL_IF(a2a_out[j * 16 + i] != j * 1000 + rank * 16 + i, "alltoall [%d][%d]", j, i);
    free(ag_in);
    free(ag_out);
    free(rs_in);
    return 0;
}

START_TEST(async_other_collectives)
{
    for (int n = 2; n <= 4; n++)
        ck_assert_int_eq(th_run(n, rank_new_async, NULL, 30000), 0);
}
END_TEST

/* ---- point to point ---- */

static int rank_p2p(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    const size_t big = 1u << 20; /* 4 MiB of int32: more than the sockets buffer */
    int32_t *out = malloc(big * 4), *in = malloc(big * 4);
    FAIL_IF(!out || !in, "malloc");
    int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < big; i++)
            out[i] = (int32_t)(rank * 7919 + round * 31 + (int)i);
        memset(in, 0, big * 4);
        /* everybody sends first, then receives: would deadlock if a send held the queue */
        tutti_work_t *ws, *wr;
        FAIL_IF(tutti_send_async(comm, out, big, TUTTI_INT32, right, 7, &ws) != 0, "send");
        FAIL_IF(tutti_recv_async(comm, in, big, TUTTI_INT32, left, 7, &wr) != 0, "recv");
        FAIL_IF(tutti_wait(ws, -1) != 0, "send: %s", tutti_work_error(ws));
        FAIL_IF(tutti_wait(wr, -1) != 0, "recv: %s", tutti_work_error(wr));
        tutti_work_free(ws);
        tutti_work_free(wr);
        for (size_t i = 0; i < big; i++)
            FAIL_IF(in[i] != (int32_t)(left * 7919 + round * 31 + (int)i), "in[%zu]", i);
        /* interleaved with collectives, in the same order everywhere */
        int64_t x = rank, y = 0;
        FAIL_IF(tutti_allreduce(comm, &x, &y, 1, TUTTI_INT64, TUTTI_SUM) != 0, "allreduce: %s",
                tutti_comm_last_error(comm));
        FAIL_IF(y != (int64_t)nranks * (nranks - 1) / 2, "sum %lld", (long long)y);
    }
    /* blocking ping-pong between 0 and 1, small messages */
    if (rank < 2) {
        for (int k = 0; k < 100; k++) {
            double v = k + 0.5, got = 0;
            if (rank == 0) {
                FAIL_IF(tutti_send(comm, &v, 1, TUTTI_FP64, 1, (uint32_t)k) != 0, "send %d", k);
                FAIL_IF(tutti_recv(comm, &got, 1, TUTTI_FP64, 1, (uint32_t)k) != 0, "recv %d", k);
            } else {
                FAIL_IF(tutti_recv(comm, &got, 1, TUTTI_FP64, 0, (uint32_t)k) != 0, "recv %d", k);
                FAIL_IF(tutti_send(comm, &got, 1, TUTTI_FP64, 0, (uint32_t)k) != 0, "send %d", k);
            }
            FAIL_IF(got != v && rank == 0, "pong %d: %g", k, got);
        }
    }
    FAIL_IF(tutti_barrier(comm) != 0, "barrier: %s", tutti_comm_last_error(comm));
    /* bad arguments */
    FAIL_IF(tutti_send(comm, out, 1, TUTTI_INT32, rank, 0) != TUTTI_ERR_INVALID_ARG, "self");
    FAIL_IF(tutti_recv(comm, in, 1, TUTTI_INT32, nranks, 0) != TUTTI_ERR_INVALID_ARG, "range");
    FAIL_IF(!strstr(tutti_comm_last_error(comm), "peer"), "message: %s",
            tutti_comm_last_error(comm));
    free(out);
    free(in);
    return 0;
}

START_TEST(point_to_point)
{
    for (int n = 2; n <= 4; n++)
        ck_assert_int_eq(th_run(n, rank_p2p, NULL, 60000), 0);
}
END_TEST

static int rank_p2p_mismatch(int rank, int nranks, tutti_comm_t *comm, const char *dir,
                             void *arg)
{
    (void)dir;
    (void)arg;
    (void)nranks;
    int32_t v[4] = {1, 2, 3, 4};
    int st;
    if (rank == 0)
        st = tutti_send(comm, v, 4, TUTTI_INT32, 1, 5);
    else
        st = tutti_recv(comm, v, 4, TUTTI_INT32, 0, 6);
    /* The receiver fails at once; an eager send may already be done, and its rank
     * learns at its next call, from the receiver's report. */
    if (rank == 0 && st == TUTTI_OK)
        st = tutti_barrier(comm);
    const char *msg = tutti_comm_last_error(comm);
    FAIL_IF(st != TUTTI_ERR_MISMATCH, "got %s: %s", tutti_status_name(st), msg);
    FAIL_IF(!strstr(msg, "tag 5") || !strstr(msg, "tag 6"), "message: %s", msg);
    return 0;
}

START_TEST(point_to_point_mismatch)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 20000;
    th_spec_t spec = {.nranks = 2, .fn = rank_p2p_mismatch, .timeout_ms = 30000, .opts = &o};
    double t0 = th_now_ms();
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    ck_assert_msg(th_now_ms() - t0 < 10000, "took %.0f ms", th_now_ms() - t0);
}
END_TEST

START_TEST(bad_init_arguments)
{
    tutti_comm_t *comm = NULL;
    tutti_store_t *store;
    char dir[] = "/tmp/tutti-errXXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(tutti_store_open_file(&store, dir, 1000), 0);
    ck_assert_int_eq(tutti_comm_init(&comm, store, 2, 2, NULL), TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(tutti_comm_init(&comm, store, -1, 2, NULL), TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(tutti_comm_init(&comm, NULL, 0, 1, NULL), TUTTI_ERR_INVALID_ARG);
    ck_assert_ptr_null(comm);
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.algo = "allreduce:rign";
    ck_assert_int_lt(tutti_comm_init(&comm, store, 0, 1, &o), 0);
    ck_assert_ptr_null(comm);
    o.algo = NULL;
    o.transport = "nosuch";
    int st = tutti_comm_init(&comm, store, 0, 1, &o);
    ck_assert_int_eq(st, TUTTI_ERR_PLUGIN);
    ck_assert_ptr_null(comm);
    tutti_store_close(store);
    char cmd[64];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* ---- mismatched collectives ---- */

typedef enum { MM_COUNT, MM_DTYPE, MM_COLL, MM_ROOT, MM_OP } mm_kind_t;

static int rank_mismatch(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)nranks;
    (void)dir;
    mm_kind_t kind = *(mm_kind_t *)arg;
    float buf[64] = {0};
    int odd = rank == 1;
    int st = TUTTI_OK;
    double t0 = th_now_ms();
    /* One good collective first, so the mismatch is not on the first message. */
    FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, buf, 64, TUTTI_FP32, TUTTI_SUM) != 0,
            "warm-up: %s", tutti_comm_last_error(comm));
    switch (kind) {
    case MM_COUNT:
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, buf, odd ? 10 : 11, TUTTI_FP32, TUTTI_SUM);
        break;
    case MM_DTYPE:
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, buf, 16, odd ? TUTTI_INT32 : TUTTI_FP32,
                             TUTTI_SUM);
        break;
    case MM_OP:
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, buf, 16, TUTTI_FP32,
                             odd ? TUTTI_MAX : TUTTI_SUM);
        break;
    case MM_COLL:
        st = odd ? tutti_broadcast(comm, buf, buf, 16, TUTTI_FP32, 0)
                 : tutti_allreduce(comm, TUTTI_IN_PLACE, buf, 16, TUTTI_FP32, TUTTI_SUM);
        break;
    case MM_ROOT:
        st = tutti_broadcast(comm, buf, buf, 16, TUTTI_FP32, odd ? 1 : 0);
        break;
    }
    double dt = th_now_ms() - t0;
    const char *msg = tutti_comm_last_error(comm);
    fprintf(stderr, "rank %d: status %s after %.0f ms: %s\n", rank, tutti_status_name(st), dt,
            msg);
    FAIL_IF(st != TUTTI_ERR_MISMATCH, "got %s, want TUTTI_ERR_MISMATCH: %s",
            tutti_status_name(st), msg);
    FAIL_IF(dt > 5000, "took %.0f ms (timeout is 20000): should fail at once", dt);
    /* Every rank's message shows both fingerprints (directly or as reported). */
    switch (kind) {
    case MM_COUNT:
        FAIL_IF(!strstr(msg, "count=10") || !strstr(msg, "count=11"), "message: %s", msg);
        break;
    case MM_DTYPE:
        FAIL_IF(!strstr(msg, "i32") || !strstr(msg, "f32"), "message: %s", msg);
        break;
    case MM_OP:
        FAIL_IF(!strstr(msg, "max") || !strstr(msg, "sum"), "message: %s", msg);
        break;
    case MM_COLL:
        FAIL_IF(!strstr(msg, "broadcast") || !strstr(msg, "allreduce"), "message: %s", msg);
        break;
    case MM_ROOT:
        FAIL_IF(!strstr(msg, "root=1") || !strstr(msg, "root=0"), "message: %s", msg);
        break;
    }
    /* The communicator stays failed: later calls fail at once, naming the cause. */
    st = tutti_barrier(comm);
    FAIL_IF(st != TUTTI_ERR_MISMATCH, "barrier after failure gave %s", tutti_status_name(st));
    return 0;
}

static void run_mismatch(mm_kind_t kind, int nranks)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 20000;
    th_spec_t spec = {.nranks = nranks, .fn = rank_mismatch, .arg = &kind,
                      .timeout_ms = 30000, .opts = &o};
    int codes[8];
    ck_assert_int_eq(th_run_ex(&spec, codes), 0);
}

START_TEST(mismatch_count) { run_mismatch(MM_COUNT, 3); }
END_TEST
START_TEST(mismatch_count_2ranks) { run_mismatch(MM_COUNT, 2); }
END_TEST
START_TEST(mismatch_dtype) { run_mismatch(MM_DTYPE, 4); }
END_TEST
START_TEST(mismatch_op) { run_mismatch(MM_OP, 3); }
END_TEST
START_TEST(mismatch_coll) { run_mismatch(MM_COLL, 3); }
END_TEST
START_TEST(mismatch_root) { run_mismatch(MM_ROOT, 3); }
END_TEST

/* ---- a rank SIGKILLed in the middle of an allreduce ---- */

static void *killer(void *arg)
{
    usleep((useconds_t)(*(int *)arg) * 1000);
    kill(getpid(), SIGKILL);
    return NULL;
}

static int rank_killed(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    const size_t count = 4u << 20; /* 16 MiB of floats: each call takes a while */
    float *buf = malloc(count * sizeof(float));
    FAIL_IF(!buf, "malloc");
    for (size_t i = 0; i < count; i++)
        buf[i] = 1.0f;
    int victim = nranks - 1;
    pthread_t t;
    int delay_ms = 300;
    if (rank == victim)
        pthread_create(&t, NULL, killer, &delay_ms);
    double t_fail = 0;
    int st = TUTTI_OK;
    for (int it = 0; it < 10000 && st == TUTTI_OK; it++) {
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, buf, count, TUTTI_FP32, TUTTI_MAX);
        t_fail = th_now_ms();
    }
    const char *msg = tutti_comm_last_error(comm);
    fprintf(stderr, "rank %d: %s: %s\n", rank, tutti_status_name(st), msg);
    FAIL_IF(rank == victim, "the victim survived");
    FAIL_IF(st != TUTTI_ERR_PEER, "got %s, want TUTTI_ERR_PEER", tutti_status_name(st));
    char name[32];
    snprintf(name, sizeof(name), "rank %d", victim);
    FAIL_IF(!strstr(msg, name), "message does not name %s: %s", name, msg);
    (void)t_fail;
    free(buf);
    return 0;
}

START_TEST(rank_killed_mid_allreduce)
{
    for (int n = 2; n <= 4; n++) {
        tutti_comm_opts_t o;
        tutti_comm_opts_init(&o);
        o.timeout_ms = 60000; /* survivors must not need it */
        o.algo = "allreduce:ring";
        th_spec_t spec = {.nranks = n, .fn = rank_killed, .timeout_ms = 20000,
                          .flags = TH_NO_KILL_ON_FAIL, .opts = &o};
        int codes[8];
        double t0 = th_now_ms();
        th_run_ex(&spec, codes);
        double dt = th_now_ms() - t0;
        for (int r = 0; r < n - 1; r++)
            ck_assert_msg(codes[r] == 0, "%d ranks: survivor %d exited %d", n, r, codes[r]);
        ck_assert_int_eq(codes[n - 1], 128 + SIGKILL);
        /* The whole run, set-up included, ends long before the 60 s timeout. */
        ck_assert_msg(dt < 10000, "%d ranks took %.0f ms", n, dt);
    }
}
END_TEST

/* ---- a hung rank: the others time out, naming it ---- */

static int rank_hung(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    float buf[16] = {0};
    if (rank == nranks - 1) {
        raise(SIGSTOP);
        return 0;
    }
    double t0 = th_now_ms();
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, buf, 16, TUTTI_FP32, TUTTI_SUM);
    double dt = th_now_ms() - t0;
    const char *msg = tutti_comm_last_error(comm);
    fprintf(stderr, "rank %d: %s after %.0f ms: %s\n", rank, tutti_status_name(st), dt, msg);
    FAIL_IF(st != TUTTI_ERR_TIMEOUT && st != TUTTI_ERR_PEER, "got %s", tutti_status_name(st));
    FAIL_IF(dt < 900 || dt > 4000, "failed after %.0f ms with a 1000 ms timeout", dt);
    if (st == TUTTI_ERR_TIMEOUT) {
        char name[32];
        snprintf(name, sizeof(name), "rank %d", nranks - 1);
        FAIL_IF(!strstr(msg, name) && !strstr(msg, "reported"), "message: %s", msg);
    }
    return 0;
}

START_TEST(hung_rank_times_out)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 1000;
    th_spec_t spec = {.nranks = 3, .fn = rank_hung, .timeout_ms = 5000,
                      .flags = TH_NO_KILL_ON_FAIL, .opts = &o};
    int codes[8];
    th_run_ex(&spec, codes);
    ck_assert_int_eq(codes[0], 0);
    ck_assert_int_eq(codes[1], 0);
    ck_assert_int_ne(codes[2], 0); /* stopped, then killed by the harness */
}
END_TEST

/* ---- abort ---- */

typedef struct {
    tutti_comm_t *comm;
    int delay_ms;
} abort_arg_t;

static void *aborter(void *arg)
{
    abort_arg_t *a = arg;
    usleep((useconds_t)a->delay_ms * 1000);
    tutti_comm_abort(a->comm);
    return NULL;
}

static int rank_abort(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)nranks;
    (void)dir;
    (void)arg;
    float buf[1024] = {0};
    if (rank == 1) {
        sleep(3); /* never joins: rank 0's allreduce cannot finish */
        return 0;
    }
    tutti_work_t *w[3];
    for (int i = 0; i < 3; i++)
        FAIL_IF(tutti_allreduce_async(comm, TUTTI_IN_PLACE, buf, 1024, TUTTI_FP32, TUTTI_SUM,
                                      &w[i]) != 0, "async");
    int done = 1;
    FAIL_IF(tutti_test(w[0], &done) != 0 || done, "test reported done");
    FAIL_IF(tutti_wait(w[0], 100) != TUTTI_ERR_TIMEOUT, "wait with 100 ms did not time out");
    abort_arg_t a = {comm, 200};
    pthread_t t;
    pthread_create(&t, NULL, aborter, &a);
    double t0 = th_now_ms();
    for (int i = 0; i < 3; i++) {
        int st = tutti_wait(w[i], -1);
        FAIL_IF(st != TUTTI_ERR_ABORTED, "work %d: %s", i, tutti_status_name(st));
        tutti_work_free(w[i]);
    }
    double dt = th_now_ms() - t0;
    pthread_join(t, NULL);
    FAIL_IF(dt > 1500, "abort took %.0f ms", dt);
    FAIL_IF(tutti_barrier(comm) != TUTTI_ERR_ABORTED, "barrier after abort");
    return 0;
}

START_TEST(abort_fails_pending)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 20000;
    th_spec_t spec = {.nranks = 2, .fn = rank_abort, .timeout_ms = 15000,
                      .flags = TH_NO_KILL_ON_FAIL, .opts = &o};
    int codes[2];
    th_run_ex(&spec, codes);
    ck_assert_int_eq(codes[0], 0);
}
END_TEST

/* A rank that aborts its own communicator leaves that in the store; a peer blocked on it
 * learns it at its stall check as a failed peer (TUTTI_ERR_PEER naming it), not as an
 * abort of its own (callers read TUTTI_ERR_ABORTED as "I asked for this"). */
static int rank_peer_abort(int rank, int nranks, tutti_comm_t *comm, const char *dir,
                           void *arg)
{
    (void)nranks;
    (void)dir;
    (void)arg;
    int32_t v = 0;
    if (rank == 1) {
        tutti_work_t *w;
        FAIL_IF(tutti_recv_async(comm, &v, 1, TUTTI_INT32, 0, 9, &w) != 0, "irecv");
        abort_arg_t a = {comm, 100};
        pthread_t t;
        pthread_create(&t, NULL, aborter, &a);
        int st = tutti_wait(w, -1);
        pthread_join(t, NULL);
        tutti_work_free(w);
        FAIL_IF(st != TUTTI_ERR_ABORTED, "rank 1's own receive: %s", tutti_status_name(st));
        sleep(4); /* alive: rank 0 must learn it from the store, not from a closed socket */
        return 0;
    }
    double t0 = th_now_ms();
    int st = tutti_broadcast(comm, TUTTI_IN_PLACE, &v, 1, TUTTI_INT32, 1);
    double ms = th_now_ms() - t0;
    FAIL_IF(st != TUTTI_ERR_PEER, "got %s after %.0f ms, want TUTTI_ERR_PEER: %s",
            tutti_status_name(st), ms, tutti_comm_last_error(comm));
    FAIL_IF(ms > 3000, "took %.0f ms", ms);
    FAIL_IF(!strstr(tutti_comm_last_error(comm), "rank 1 had failed"), "\"%s\"",
            tutti_comm_last_error(comm));
    return 0;
}

START_TEST(peer_abort_is_peer_failure)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 20000;
    th_spec_t spec = {.nranks = 2, .fn = rank_peer_abort, .timeout_ms = 15000,
                      .flags = TH_NO_KILL_ON_FAIL, .opts = &o};
    int codes[2];
    th_run_ex(&spec, codes);
    ck_assert_int_eq(codes[0], 0);
    ck_assert_int_eq(codes[1], 0);
}
END_TEST

/* ---- unreachable things ---- */

static int closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    socklen_t len = sizeof(a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd); /* nobody listens there now */
    return ntohs(a.sin_port);
}

START_TEST(unreachable_store_via_env)
{
    char url[64], port[16];
    int p = closed_port();
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", p);
    snprintf(port, sizeof(port), "%d", p);
    setenv("TUTTI_STORE", url, 1);
    setenv("TUTTI_RANK", "1", 1);
    setenv("TUTTI_WORLD_SIZE", "2", 1);
    setenv("TUTTI_STORE_TIMEOUT_MS", "500", 1);
    tutti_comm_t *comm = NULL;
    double t0 = th_now_ms();
    int st = tutti_comm_init_env(&comm, NULL);
    double dt = th_now_ms() - t0;
    ck_assert_msg(st == TUTTI_ERR_TIMEOUT || st == TUTTI_ERR_STORE, "got %s",
                  tutti_status_name(st));
    ck_assert_ptr_null(comm);
    ck_assert_msg(dt >= 400 && dt < 3000, "took %.0f ms", dt);
    /* and the store call itself says where it tried */
    tutti_store_t *store = NULL;
    st = tutti_store_open_tcp(&store, "127.0.0.1", p, 0, 300);
    ck_assert_int_lt(st, 0);
    ck_assert_ptr_null(store);
}
END_TEST

static int rank_bad_ifname(int rank, int nranks, tutti_comm_t *comm, const char *dir,
                           void *arg)
{
    (void)comm;
    (void)arg;
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 5000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.socket_ifname = "=nosuchif0";
    o.timeout_ms = 5000;
    o.transport = "tcp"; /* the interface choice is tcp's, whatever the suite runs over */
    tutti_comm_t *c = NULL;
    int st = tutti_comm_init(&c, store, rank, nranks, &o);
    FAIL_IF(st != TUTTI_ERR_NO_DEVICE, "got %s", tutti_status_name(st));
    FAIL_IF(c != NULL, "comm set on failure");
    /* never silently falls back to loopback: the choice was explicit */
    o.socket_ifname = "lo";
    st = tutti_comm_init(&c, store, rank, nranks, &o);
    FAIL_IF(st != 0, "with lo: %s", tutti_status_name(st));
    tutti_comm_destroy(c);
    tutti_store_close(store);
    return 0;
}

START_TEST(bad_ifname)
{
    th_spec_t spec = {.nranks = 2, .fn = rank_bad_ifname, .timeout_ms = 20000,
                      .flags = TH_NO_COMM};
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* ---- init from the environment: TUTTI_* with a file store, torchrun's with TCP ---- */

static int rank_env(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    int port = *(int *)arg; /* 0: TUTTI_* with a file store; else torchrun's, TCP */
    int torchrun = port != 0;
    char v[256];
    if (torchrun) {
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        snprintf(v, sizeof(v), "%d", port);
        setenv("MASTER_PORT", v, 1);
        snprintf(v, sizeof(v), "%d", rank);
        setenv("RANK", v, 1);
        snprintf(v, sizeof(v), "%d", nranks);
        setenv("WORLD_SIZE", v, 1);
    } else {
        snprintf(v, sizeof(v), "file://%s", dir);
        setenv("TUTTI_STORE", v, 1);
        snprintf(v, sizeof(v), "%d", rank);
        setenv("TUTTI_RANK", v, 1);
        snprintf(v, sizeof(v), "%d", nranks);
        setenv("TUTTI_WORLD_SIZE", v, 1);
    }
    tutti_comm_t *comm = NULL;
    int st = tutti_comm_init_env(&comm, NULL);
    FAIL_IF(st != 0, "init_env: %s", tutti_status_name(st));
    FAIL_IF(tutti_comm_rank(comm) != rank || tutti_comm_size(comm) != nranks, "rank/size");
    int64_t x = rank + 1, y = 0;
    st = tutti_allreduce(comm, &x, &y, 1, TUTTI_INT64, TUTTI_SUM);
    FAIL_IF(st != 0, "allreduce: %s", tutti_comm_last_error(comm));
    FAIL_IF(y != (int64_t)nranks * (nranks + 1) / 2, "sum %lld", (long long)y);
    /* rank 0 hosts the TCP store: it must outlive the others' last store use */
    FAIL_IF(tutti_barrier(comm) != 0, "barrier");
    tutti_comm_destroy(comm);
    return 0;
}

START_TEST(init_from_env)
{
    int port = 0;
    th_spec_t spec = {.nranks = 3, .fn = rank_env, .arg = &port, .timeout_ms = 20000,
                      .flags = TH_NO_COMM};
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    port = closed_port();
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* ---- IPv6 on loopback ---- */

static int have_ipv6_loopback(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

static int rank_sum3(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    int64_t x[3] = {rank, 1, -rank}, y[3];
    int st = tutti_allreduce(comm, x, y, 3, TUTTI_INT64, TUTTI_SUM);
    FAIL_IF(st != 0, "allreduce: %s", tutti_comm_last_error(comm));
    int64_t s = (int64_t)nranks * (nranks - 1) / 2;
    FAIL_IF(y[0] != s || y[1] != nranks || y[2] != -s, "wrong sums");
    return 0;
}

START_TEST(ipv6_loopback)
{
    if (!have_ipv6_loopback()) {
        fprintf(stderr, "ipv6_loopback: skipped: ::1 is not available here\n");
        return;
    }
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.socket_family = 6;
    o.socket_ifname = "lo";
    o.transport = "tcp";
    th_spec_t spec = {.nranks = 3, .fn = rank_sum3, .timeout_ms = 20000, .opts = &o};
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* ---- a stray client sends garbage to a rank's listener during set-up ---- */

static int rank_stray(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 10000) != 0, "store");
    if (rank == 1) {
        /* Before joining: find rank 0's listener and throw garbage (and a fake hello
         * claiming rank 1) at it; rank 0 must drop both and wait for the real rank 1. */
        void *v = NULL;
        size_t len = 0;
        char key[256];
        FAIL_IF(th_comm_key(store, NULL, "tcp/0", key, sizeof(key), 10000) != 0,
                "rank 0 never created the job instance");
        FAIL_IF(tutti_store_get(store, key, &v, &len, 10000) != 0,
                "rank 0 never published its address");
        char ip[64];
        int port = 0;
        FAIL_IF(sscanf((const char *)v, "%63s %d", ip, &port) != 2, "address %s", (char *)v);
        free(v);
        FAIL_IF(strcmp(ip, "127.0.0.1"), "rank 0 listens on %s, not loopback", ip);
        for (int k = 0; k < 2; k++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                    .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
            FAIL_IF(connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0, "connect");
            if (k == 0) {
                char junk[64];
                memset(junk, 0xA5, sizeof(junk));
                FAIL_IF(write(fd, junk, sizeof(junk)) != (ssize_t)sizeof(junk), "write");
            } else {
                uint32_t hello[4] = {0x4f4c4c48u, 1, 1, 99}; /* wrong size: 99 ranks */
                FAIL_IF(write(fd, hello, sizeof(hello)) != (ssize_t)sizeof(hello), "write");
            }
            usleep(50000);
            close(fd);
        }
    }
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 10000;
    o.transport = "tcp"; /* the listener under test; auto would pick shm */
    tutti_comm_t *comm = NULL;
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    FAIL_IF(st != 0, "init: %s", tutti_status_name(st));
    st = rank_sum3(rank, nranks, comm, dir, NULL);
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return st;
}

START_TEST(stray_connection_during_setup)
{
    th_spec_t spec = {.nranks = 2, .fn = rank_stray, .timeout_ms = 20000, .flags = TH_NO_COMM};
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

START_TEST(status_strings)
{
    ck_assert_str_eq(tutti_strerror(TUTTI_OK), "success");
    ck_assert_str_eq(tutti_status_name(TUTTI_ERR_TIMEOUT), "TUTTI_ERR_TIMEOUT");
    ck_assert_str_eq(tutti_strerror(-1000), "unknown status");
    for (int s = 0; s > TUTTI_STATUS_LAST_; s--)
        ck_assert_str_ne(tutti_strerror(s), "unknown status");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("errors");
    TCase *tc = tcase_create("errors");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, status_strings);
    tcase_add_test(tc, bad_init_arguments);
    tcase_add_test(tc, bad_arguments);
    tcase_add_test(tc, bad_arguments_other_collectives);
    tcase_add_test(tc, mismatch_other_collectives);
    tcase_add_test(tc, async_other_collectives);
    tcase_add_test(tc, point_to_point);
    tcase_add_test(tc, point_to_point_mismatch);
    tcase_add_test(tc, mismatch_count);
    tcase_add_test(tc, mismatch_count_2ranks);
    tcase_add_test(tc, mismatch_dtype);
    tcase_add_test(tc, mismatch_op);
    tcase_add_test(tc, mismatch_coll);
    tcase_add_test(tc, mismatch_root);
    tcase_add_test(tc, rank_killed_mid_allreduce);
    tcase_add_test(tc, hung_rank_times_out);
    tcase_add_test(tc, abort_fails_pending);
    tcase_add_test(tc, peer_abort_is_peer_failure);
    tcase_add_test(tc, unreachable_store_via_env);
    tcase_add_test(tc, bad_ifname);
    tcase_add_test(tc, init_from_env);
    tcase_add_test(tc, ipv6_loopback);
    tcase_add_test(tc, stray_connection_during_setup);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    setenv("TUTTI_SOCKET_IFNAME", "lo", 0); /* tests stay on loopback */
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
