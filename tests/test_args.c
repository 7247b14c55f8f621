/* Arguments and set-up: status strings, bad arguments to init and to every collective,
 * init from the environment, unreachable stores and interfaces, IPv6 loopback, and a
 * stray connection during set-up. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <tutti/tutti.h>

#include "harness.h"
#include "base/base.h"
#include "base/hostlist.h"
#include "core/state.h"
#include "fake_host.h"
#include "../transports/kit/util.h"

static int rank_bad_args(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)nranks;
    (void)dir;
    (void)arg;
    float buf[8] = { 0 }, out[8];
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

TH_RUN_TEST(bad_arguments, th_run(2, rank_bad_args, NULL, 30000))

static int rank_bad_args2(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    float buf[64] = { 0 };
    size_t counts[2] = { 4, 4 }, huge[2] = { SIZE_MAX / 2, 1 };
    int st;
#define EXPECT_BAD(call, needle)                                                                   \
    do {                                                                                           \
        st = (call);                                                                               \
        FAIL_IF(st != TUTTI_ERR_INVALID_ARG, "%s gave %s", #call, tutti_status_name(st));          \
        FAIL_IF(!strstr(tutti_comm_last_error(comm), needle), "%s: message \"%s\"", #call,         \
                tutti_comm_last_error(comm));                                                      \
    } while (0)
    EXPECT_BAD(tutti_reduce(comm, buf, buf, 4, TUTTI_FP32, TUTTI_SUM, nranks), "root 2");
    EXPECT_BAD(tutti_reduce(comm, buf, buf, 4, TUTTI_FP32, (tutti_redop_t)19, 0), "op 19");
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
    /* buffers that overlap without being one (no algorithm reads them as in place) */
    EXPECT_BAD(tutti_reduce(comm, buf + 1, buf, 4, TUTTI_FP32, TUTTI_SUM, rank), "overlap");
    EXPECT_BAD(tutti_reduce_scatter(comm, buf, buf + 3, 4, TUTTI_FP32, TUTTI_SUM), "overlap");
    EXPECT_BAD(tutti_alltoall(comm, buf + 2, buf, 4, TUTTI_FP32), "overlap");
    {
        size_t sc[2] = { 2, 6 }, rc[2] = { 4, 4 };
        EXPECT_BAD(tutti_alltoallv(comm, buf, sc, NULL, buf, rc, NULL, TUTTI_FP32),
                   "layouts that differ");
    }
    if (rank == 0)
        EXPECT_BAD(tutti_gatherv(comm, buf, 3, buf, counts, NULL, TUTTI_FP32, 0),
                   "differs from recvcounts[root]");
    /* bitwise ops on floats: refused on every reducing entry point, naming both */
    EXPECT_BAD(tutti_allreduce(comm, buf, buf, 4, TUTTI_FP32, TUTTI_BAND),
               "allreduce: op band reduces integer dtypes only, not f32");
    EXPECT_BAD(tutti_reduce(comm, buf, buf, 4, TUTTI_FP64, TUTTI_BOR, 0),
               "reduce: op bor reduces integer dtypes only, not f64");
    EXPECT_BAD(tutti_reduce_scatter(comm, buf, buf + 8, 2, TUTTI_BF16, TUTTI_BXOR),
               "op bxor reduces integer dtypes only, not bf16");
    EXPECT_BAD(tutti_reduce_scatterv(comm, buf, buf + 8, counts, TUTTI_FP16, TUTTI_BXOR),
               "op bxor reduces integer dtypes only, not f16");
    {
        tutti_work_t *w = NULL;
        EXPECT_BAD(tutti_allreduce_async(comm, buf, buf, 4, TUTTI_FP32, TUTTI_BOR, &w), "op bor");
        FAIL_IF(w != NULL, "a refused call handed back work");
    }
    /* the in-place marker where a call takes a buffer (it was dereferenced: SIGSEGV) */
    EXPECT_BAD(tutti_send(comm, TUTTI_IN_PLACE, 4, TUTTI_FP32, 1 - rank, 0),
               "send: buf is the in-place marker");
    EXPECT_BAD(tutti_recv(comm, TUTTI_IN_PLACE_OUT, 4, TUTTI_FP32, 1 - rank, 0),
               "recv: buf is the in-place marker");
    EXPECT_BAD(tutti_send(comm, NULL, 4, TUTTI_FP32, 1 - rank, 0), "send: buf is NULL");
    EXPECT_BAD(tutti_allreduce(comm, buf, TUTTI_IN_PLACE_OUT, 4, TUTTI_FP32, TUTTI_SUM),
               "recvbuf is the in-place marker");
    EXPECT_BAD(tutti_allgather(comm, buf, TUTTI_IN_PLACE_OUT, 4, TUTTI_FP32),
               "recvbuf is the in-place marker");
    EXPECT_BAD(tutti_alltoall(comm, buf, TUTTI_IN_PLACE_OUT, 4, TUTTI_FP32),
               "recvbuf is the in-place marker");
    if (rank == 0) {
        EXPECT_BAD(tutti_scatter(comm, TUTTI_IN_PLACE, buf, 4, TUTTI_FP32, 0),
                   "sendbuf (in place at the root: recvbuf TUTTI_IN_PLACE_OUT) is the in-place");
        EXPECT_BAD(tutti_gather(comm, buf, TUTTI_IN_PLACE_OUT, 4, TUTTI_FP32, 0),
                   "recvbuf is the in-place marker");
        EXPECT_BAD(tutti_reduce(comm, buf, TUTTI_IN_PLACE_OUT, 4, TUTTI_FP32, TUTTI_SUM, 0),
                   "recvbuf is the in-place marker");
    } else {
        EXPECT_BAD(tutti_scatter(comm, buf, TUTTI_IN_PLACE_OUT, 4, TUTTI_FP32, 0),
                   "TUTTI_IN_PLACE_OUT is for the root only");
        EXPECT_BAD(tutti_reduce(comm, TUTTI_IN_PLACE, buf, 4, TUTTI_FP32, TUTTI_SUM, 0),
                   "TUTTI_IN_PLACE is for the root only");
    }
    /* in place, recvbuf is the whole input even where this rank's block is empty */
    {
        size_t c40[2] = { 4, 0 };
        EXPECT_BAD(tutti_reduce_scatterv(comm, TUTTI_IN_PLACE, NULL, c40, TUTTI_FP32, TUTTI_SUM),
                   "recvbuf is NULL");
    }
    /* a block per rank whose total overflows (count x ranks: the buffer's extent wrapped
     * to 0, and a NULL recvbuf passed) */
    {
        size_t big = SIZE_MAX / 6; /* x 4 fits, x 4 x 2 ranks does not */
        EXPECT_BAD(tutti_gather(comm, buf, NULL, big, TUTTI_UINT8, 0), "too large");
        EXPECT_BAD(tutti_scatter(comm, NULL, buf, big, TUTTI_UINT8, 0), "too large");
        EXPECT_BAD(tutti_alltoall(comm, buf, NULL, big, TUTTI_UINT8), "too large");
    }
    /* receive blocks that overlap: ranks' data on the same elements */
    {
        size_t c2[2] = { 2, 2 }, d01[2] = { 0, 1 }, d00[2] = { 0, 0 }, far[2] = { 0, SIZE_MAX / 8 };
        EXPECT_BAD(tutti_allgatherv(comm, buf, buf + 8, c2, d01, TUTTI_FP32),
                   "recvcounts blocks of ranks 0 and 1 overlap (elements [0, 2) and [1, 3))");
        EXPECT_BAD(tutti_alltoallv(comm, buf, c2, NULL, buf + 8, c2, d00, TUTTI_FP32), "overlap");
        if (rank == 0)
            EXPECT_BAD(tutti_gatherv(comm, buf, 2, buf + 8, c2, d01, TUTTI_FP32, 0), "overlap");
        EXPECT_BAD(tutti_allgatherv(comm, buf, buf + 8, c2, far, TUTTI_FP32),
                   "recvcounts[1] = 2 or its displacement");
        /* sends may read one block twice; empty blocks overlap nothing */
        size_t c10[2] = { 1, 0 };
        float out[8] = { 0 }, in[4] = { 1, 2, 3, 4 };
        size_t rcv[2] = { 2, 2 };
        st = tutti_alltoallv(comm, in, c2, d00, out, rcv, NULL, TUTTI_FP32);
        FAIL_IF(st != 0 || out[0] != 1 || out[1] != 2 || out[2] != 1 || out[3] != 2,
                "alltoallv reading one block twice: %s, %g %g %g %g", tutti_status_name(st), out[0],
                out[1], out[2], out[3]);
        float g[2] = { 0, 0 }, mine = (float)rank + 1;
        st = tutti_allgatherv(comm, &mine, g, c10, d00, TUTTI_FP32);
        FAIL_IF(st != 0 || g[0] != 1, "allgatherv with an empty block at a taken place: %s, %g",
                tutti_status_name(st), g[0]);
    }
#undef EXPECT_BAD
    /* nothing was sent: the communicator still works */
    st = tutti_barrier(comm);
    FAIL_IF(st != TUTTI_OK, "barrier: %s", tutti_comm_last_error(comm));
    return 0;
}

TH_RUN_TEST(bad_arguments_other_collectives, th_run(2, rank_bad_args2, NULL, 30000))

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
    th_rmtree_gone(dir);
}
END_TEST

/* Work handles outlive their communicator: a framework's handle (torch's Work, a
 * Python object) is waited for, tested and freed after the destroy. Until session 96
 * tutti_wait locked the freed communicator's queue (found by review; valgrind's invalid
 * read; here ASan's). A done op keeps its status and error: an allreduce's OK and
 * result, an op issued after an abort its TUTTI_ERR_ABORTED. */
START_TEST(work_outlives_comm)
{
    tutti_comm_t *comm = NULL;
    tutti_store_t *store;
    char dir[] = "/tmp/tutti-workXXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(tutti_store_open_file(&store, dir, 5000), 0);
    ck_assert_int_eq(tutti_comm_init(&comm, store, 0, 1, NULL), 0);
    float v[4] = { 1, 2, 3, 4 }, out[4] = { 0 };
    tutti_work_t *waited = NULL, *unwaited = NULL, *aborted = NULL;
    ck_assert_int_eq(tutti_allreduce_async(comm, v, out, 4, TUTTI_FP32, TUTTI_SUM, &waited), 0);
    ck_assert_int_eq(tutti_wait(waited, -1), 0);
    ck_assert_int_eq(tutti_allreduce_async(comm, TUTTI_IN_PLACE, v, 4, TUTTI_FP32, TUTTI_MAX,
                                           &unwaited),
                     0);
    ck_assert_int_eq(tutti_comm_abort(comm), 0);
    int bst = tutti_barrier_async(comm, &aborted);
    ck_assert_int_eq(tutti_comm_destroy(comm), 0);
    int done = 0;
    ck_assert_int_eq(tutti_wait(waited, 1000), 0);
    ck_assert_int_eq(tutti_test(waited, &done), 0);
    ck_assert_int_eq(done, 1);
    ck_assert_str_eq(tutti_work_error(waited), "");
    ck_assert(out[0] == 1 && out[3] == 4);
    /* queued before the abort: run by the destroy, or failed by the abort */
    int st = tutti_wait(unwaited, 1000);
    ck_assert(st == TUTTI_OK || st == TUTTI_ERR_ABORTED);
    ck_assert_int_eq(tutti_test(unwaited, &done), st);
    ck_assert_int_eq(done, 1);
    if (aborted) {
        ck_assert_int_eq(tutti_wait(aborted, -1), TUTTI_ERR_ABORTED);
        ck_assert_str_ne(tutti_work_error(aborted), "");
    } else {
        ck_assert_int_eq(bst, TUTTI_ERR_ABORTED); /* refused at the call instead */
    }
    tutti_work_free(waited);
    tutti_work_free(unwaited);
    tutti_work_free(aborted);
    tutti_store_close(store);
    th_rmtree_gone(dir);
}
END_TEST

/* ---- mismatched collectives ---- */

START_TEST(unreachable_store_via_env)
{
    char url[64], port[16];
    int p = th_free_port();
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

static int rank_bad_ifname(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
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

TH_RUN_TEST(bad_ifname, th_run_nocomm(2, rank_bad_ifname, NULL, 20000))

/* TUTTI_SOCKET_FAMILY other than 0, 4 or 6 (the field's 5, the environment's "abc") is
 * TUTTI_ERR_CONFIG naming the value: tcp read it with atoi, and 5 or "abc" meant either
 * family, without a word. */
static int rank_bad_family(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)comm;
    (void)arg;
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 5000) != 0, "store");
    for (int k = 0; k < 2; k++) {
        if (k == 1)
            setenv("TUTTI_SOCKET_FAMILY", "abc", 1);
        tutti_comm_opts_t o;
        tutti_comm_opts_init(&o);
        if (k == 0)
            o.socket_family = 5;
        o.timeout_ms = 5000;
        o.transport = "tcp";
        tutti_comm_t *c = NULL;
        int st = tutti_comm_init(&c, store, rank, nranks, &o);
        unsetenv("TUTTI_SOCKET_FAMILY");
        const char *e = tutti_comm_last_error(NULL);
        FAIL_IF(st != TUTTI_ERR_CONFIG, "socket family %s: got %s", k ? "abc" : "5",
                tutti_status_name(st));
        FAIL_IF(c != NULL, "comm set on failure");
        FAIL_IF(!strstr(e, k ? "TUTTI_SOCKET_FAMILY=abc:" : "TUTTI_SOCKET_FAMILY=5:"),
                "the error does not name the value: %s", e);
    }
    tutti_store_close(store);
    return 0;
}

TH_RUN_TEST(bad_socket_family, th_run_nocomm(2, rank_bad_family, NULL, 20000))

/* ---- init from the environment: TUTTI_* with a file store, torchrun's with TCP ---- */

static int rank_env(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    int port = *(int *)arg; /* 0: TUTTI_* with a file store; else torchrun's, TCP */
    int torchrun = port != 0;
    char v[256];
    if (torchrun) {
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        th_setenv_int("MASTER_PORT", port);
        th_setenv_int("RANK", rank);
        th_setenv_int("WORLD_SIZE", nranks);
    } else {
        snprintf(v, sizeof(v), "file://%s", dir);
        th_set_rank_env(v, rank, nranks);
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
    ck_assert_int_eq(th_run_nocomm(3, rank_env, &port, 20000), 0);
    port = th_free_port();
    ck_assert_int_eq(th_run_nocomm(3, rank_env, &port, 20000), 0);
}
END_TEST

/* ---- init from the launchers' variables (tests/test_mpirun.sh and test_slurm.sh run the
 * real ones) ---- */

/* the launchers' variables a case sets; from MPI_OMPI_TWO_HOSTS on, init must fail */
typedef enum {
    MPI_OMPI, /* with a stale RANK and TUTTI_STORE_SERVER=0 about, twice in a row */
    MPI_PMI,
    MPI_SLURM,
    MPI_SLURM_PMI2,  /* srun --mpi=pmi2: PMI_RANK/PMI_SIZE, no MPI_LOCALNRANKS */
    MPI_SLURM_NODES, /* a step on 2 nodes, "localhost" first: the store there */
    MPI_OMPI_TWO_HOSTS,
    MPI_PMI_NO_JOB,
    MPI_SLURM_TWO_NODES,
    MPI_SLURM_BATCH,
    MPI_TUTTI_OVER_OMPI, /* TUTTI_RANK/TUTTI_WORLD_SIZE win, and name no store */
    MPI_TUTTI_HALF       /* TUTTI_RANK alone: an error, not srun's pair instead */
} mpi_env_t;

/* The variables a launcher (or another test) may have left, so that only the case's own
 * are seen: a rank from TUTTI_RANK would win over the launcher's. */
static void unset_launch_env(void)
{
    static const char *const names[] = { "TUTTI_RANK",
                                         "TUTTI_WORLD_SIZE",
                                         "TUTTI_LOCAL_SIZE",
                                         "TUTTI_STORE",
                                         "RANK",
                                         "WORLD_SIZE",
                                         "LOCAL_WORLD_SIZE",
                                         "MASTER_ADDR",
                                         "MASTER_PORT",
                                         "TUTTI_STORE_SERVER",
                                         "OMPI_COMM_WORLD_RANK",
                                         "OMPI_COMM_WORLD_SIZE",
                                         "OMPI_COMM_WORLD_LOCAL_SIZE",
                                         "PMI_RANK",
                                         "PMI_SIZE",
                                         "MPI_LOCALNRANKS",
                                         "SLURM_JOB_ID",
                                         "SLURM_STEP_ID",
                                         "SLURM_PROCID",
                                         "SLURM_NTASKS",
                                         "SLURM_STEP_NUM_TASKS",
                                         "SLURM_STEP_NUM_NODES",
                                         "SLURM_STEP_NODELIST",
                                         "SLURMD_NODENAME",
                                         "PMIX_NAMESPACE",
                                         "OMPI_MCA_ess_base_jobid",
                                         "TORCHELASTIC_RUN_ID" };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        unsetenv(names[i]);
}

static int rank_mpi_env(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)dir;
    mpi_env_t kind = *(mpi_env_t *)arg;
    static int again; /* MPI_OMPI: the second communicator (each rank is a process) */
    unset_launch_env();
    int pmi = kind == MPI_PMI || kind == MPI_PMI_NO_JOB;
    int slurm = kind == MPI_SLURM || kind == MPI_SLURM_PMI2 || kind == MPI_SLURM_TWO_NODES ||
                kind == MPI_SLURM_BATCH || kind == MPI_TUTTI_HALF || kind == MPI_SLURM_NODES;
    const char *rank_var = pmi ? "PMI_RANK" : slurm ? "SLURM_PROCID" : "OMPI_COMM_WORLD_RANK";
    th_setenv_int(rank_var, rank);
    if (slurm) {
        /* srun's, in a step of job 4242 (the harness's TUTTI_JOB_ID stays first) */
        th_setenv_int("SLURM_STEP_NUM_TASKS", nranks);
        th_setenv_int("SLURM_NTASKS", nranks);
        th_setenv_int("SLURM_STEP_NUM_NODES",
                      kind == MPI_SLURM_TWO_NODES || kind == MPI_SLURM_NODES ? 2 : 1);
        if (kind == MPI_SLURM_NODES) { /* tests/test_slurm_nodes.sh has real nodes */
            setenv("SLURM_STEP_NODELIST", "localhost,elsewhere[1-3]", 1);
            setenv("SLURMD_NODENAME", "localhost", 1);
        }
        setenv("SLURM_JOB_ID", "4242", 1);
        if (kind != MPI_SLURM_BATCH) /* a batch script has SLURM_PROCID=0, but no step */
            setenv("SLURM_STEP_ID", "0", 1);
    } else {
        th_setenv_int(pmi ? "PMI_SIZE" : "OMPI_COMM_WORLD_SIZE", nranks);
        th_setenv_int(pmi ? "MPI_LOCALNRANKS" : "OMPI_COMM_WORLD_LOCAL_SIZE",
                      kind == MPI_OMPI_TWO_HOSTS ? nranks - 1 : nranks);
    }
    if (kind == MPI_PMI_NO_JOB) {
        unsetenv("TUTTI_JOB_ID"); /* the harness's */
        unsetenv("PMI_FD");       /* nor a hydra proxy to take one from */
    }
    if (kind == MPI_SLURM_PMI2) {
        th_setenv_int("PMI_RANK", rank);
        th_setenv_int("PMI_SIZE", nranks);
    }
    if (kind == MPI_TUTTI_HALF) {
        th_setenv_int("TUTTI_RANK", rank);
        rank_var = "TUTTI_RANK";
    }
    if (kind == MPI_OMPI) {
        /* an outer launcher's rank without its size hides nothing; rank 0 hosts the
         * job's loopback store whatever TUTTI_STORE_SERVER says */
        setenv("RANK", "0", 1);
        setenv("TUTTI_STORE_SERVER", "0", 1);
    }
    if (kind == MPI_TUTTI_OVER_OMPI) {
        /* tutti's own variables win over mpirun's, and never make up a store */
        th_setenv_int("TUTTI_RANK", rank);
        th_setenv_int("TUTTI_WORLD_SIZE", nranks);
        th_setenv_int("TUTTI_LOCAL_SIZE", nranks);
        rank_var = "TUTTI_RANK";
    }
    tutti_comm_t *comm = NULL;
    int st = tutti_comm_init_env(&comm, NULL);
    if (kind >= MPI_OMPI_TWO_HOSTS) {
        /* no rank, or no store named and none can be made up: a clear error, at once */
        const char *e = tutti_comm_last_error(NULL);
        FAIL_IF(st != TUTTI_ERR_CONFIG || comm, "case %d: got %s", (int)kind,
                tutti_status_name(st));
        if (kind == MPI_TUTTI_HALF) {
            FAIL_IF(!strstr(e, "missing the world size"), "error: %s", e);
            return 0;
        }
        if (kind == MPI_SLURM_BATCH) {
            FAIL_IF(!strstr(e, "missing the rank (in a Slurm job but outside its steps, no rank: "
                               "start the ranks with srun)"),
                    "error: %s", e);
            return 0;
        }
        char want[64];
        snprintf(want, sizeof(want), "rank %d of %d (%s)", rank, nranks, rank_var);
        FAIL_IF(!strstr(e, want) || !strstr(e, "TUTTI_STORE"), "error: %s", e);
        if (kind == MPI_TUTTI_OVER_OMPI) {
            FAIL_IF(strstr(e, "loopback"), "error: %s", e);
            return 0;
        }
        const char *why = kind == MPI_PMI_NO_JOB ? "there is no job id"
                          : kind == MPI_SLURM_TWO_NODES
                              ? "the step spans 2 nodes (e.g. MASTER_ADDR=$(scontrol show hostnames"
                              : "2 of the 3 ranks are on this host";
        FAIL_IF(!strstr(e, why), "error: %s", e);
        return 0;
    }
    FAIL_IF(st != 0, "init_env: %s: %s", tutti_status_name(st), tutti_comm_last_error(NULL));
    FAIL_IF(tutti_comm_rank(comm) != rank || tutti_comm_size(comm) != nranks, "rank/size");
    int64_t x = 10 * rank + 1, y = 0, want = 0;
    for (int r = 0; r < nranks; r++)
        want += 10 * r + 1;
    st = tutti_allreduce(comm, &x, &y, 1, TUTTI_INT64, TUTTI_SUM);
    FAIL_IF(st != 0, "allreduce: %s", tutti_comm_last_error(comm));
    FAIL_IF(y != want, "sum %lld, want %lld", (long long)y, (long long)want);
    FAIL_IF(tutti_barrier(comm) != 0, "barrier"); /* rank 0 hosts the store */
    tutti_comm_destroy(comm);
    if (kind == MPI_OMPI && !again) {
        /* a second communicator on the same port, rank 0's first server gone */
        again = 1;
        return rank_mpi_env(rank, nranks, unused, dir, arg);
    }
    return 0;
}

START_TEST(init_from_mpirun_env)
{
    /* Open MPI's variables, every rank on this host, the harness's job id: the ranks meet
     * on a loopback store whose port comes from the job id, with no store named */
    mpi_env_t kind = MPI_OMPI;
    ck_assert_int_eq(th_run_nocomm(3, rank_mpi_env, &kind, 20000), 0);
    kind = MPI_PMI; /* MPICH's, with a TUTTI_JOB_ID */
    ck_assert_int_eq(th_run_nocomm(3, rank_mpi_env, &kind, 20000), 0);
    kind = MPI_SLURM; /* srun's, a step on one node */
    ck_assert_int_eq(th_run_nocomm(3, rank_mpi_env, &kind, 20000), 0);
    kind = MPI_SLURM_PMI2; /* PMI's pair, the step's place */
    ck_assert_int_eq(th_run_nocomm(3, rank_mpi_env, &kind, 20000), 0);
    kind = MPI_SLURM_NODES; /* a step on two nodes: its first node's store */
    ck_assert_int_eq(th_run_nocomm(3, rank_mpi_env, &kind, 20000), 0);
    for (kind = MPI_OMPI_TWO_HOSTS; kind <= MPI_TUTTI_HALF; kind++)
        ck_assert_int_eq(th_run_nocomm(3, rank_mpi_env, &kind, 20000), 0);
}
END_TEST

/* A rank or world size beyond an int, from any launcher's pair, is refused with the
 * CONFIG error that names the variables: TUTTI_WORLD_SIZE=4294967297 ran as one rank
 * (truncated to an int), and a launcher's count beyond one matched another's. */
START_TEST(huge_rank_or_size_refused)
{
    static const char *const pairs[][2] = {
        { "TUTTI_RANK", "TUTTI_WORLD_SIZE" },
        { "RANK", "WORLD_SIZE" },
        { "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE" },
        { "PMI_RANK", "PMI_SIZE" },
    };
    static const char *const values[][2] = {
        { "0", "4294967297" },           /* 2^32 + 1: was 1 */
        { "4294967296", "4294967297" },  /* was rank 0 of 1 */
        { "0", "2147483648" },           /* INT_MAX + 1: was negative */
        { "0", "99999999999999999999" }, /* beyond a long: ERANGE */
    };
    char dir[] = "/tmp/tutti-hugeXXXXXX", url[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(url, sizeof(url), "file://%s", dir);
    for (size_t p = 0; p < sizeof(pairs) / sizeof(pairs[0]); p++) {
        for (size_t v = 0; v < sizeof(values) / sizeof(values[0]); v++) {
            unset_launch_env();
            setenv("TUTTI_STORE", url, 1);
            setenv(pairs[p][0], values[v][0], 1);
            setenv(pairs[p][1], values[v][1], 1);
            tutti_store_t *store = NULL;
            int rank = -1, size = -1;
            int st = tutti_store_open_env(&store, &rank, &size, NULL);
            const char *e = tutti_comm_last_error(NULL);
            ck_assert_msg(st == TUTTI_ERR_CONFIG && !store,
                          "%s=%s %s=%s: %s (rank %d of %d), wanted TUTTI_ERR_CONFIG", pairs[p][0],
                          values[v][0], pairs[p][1], values[v][1], tutti_status_name(st), rank,
                          size);
            ck_assert_msg(strstr(e, values[v][1]) && strstr(e, pairs[p][1]) &&
                              strstr(e, "not a rank in [0, size)"),
                          "the error does not name the size: %s", e);
        }
    }
    unset_launch_env();
    th_rmtree(dir);
    /* a launcher's count (local size, node count): beyond an int is none, as is ERANGE */
    static const struct {
        const char *v;
        long want;
    } counts[] = { { "12", 12 },
                   { "2147483647", 2147483647L },
                   { "2147483648", -1 },
                   { "99999999999999999999", -1 },
                   { "-1", -1 } };
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
        setenv("TT_TEST_COUNT", counts[i].v, 1);
        ck_assert_msg(tt_env_count("TT_TEST_COUNT") == counts[i].want, "%s: %ld", counts[i].v,
                      tt_env_count("TT_TEST_COUNT"));
    }
    unsetenv("TT_TEST_COUNT");
}
END_TEST

/* A Slurm step across nodes: the first host of its node list (a hostlist expression) is
 * where rank 0 must be; a rank 0 elsewhere, or a list that does not parse, is refused at
 * once with the reason (no store is opened). */
START_TEST(slurm_node_lists)
{
    static const struct {
        const char *list, *me, *want;
    } cases[] = {
        { "gpu[07-09,12],cpu3", "cpu3",
          "rank 0 runs on node cpu3, not on the step's first node gpu07" },
        { "a,b", "b", "not on the step's first node a," },
        { "rack[2-3]-ib[0-1]", "rack3-ib0", "not on the step's first node rack2-ib0," },
        { "n[5,7]", "n7", "not on the step's first node n5," },
        { "n[1-2", "n1", "SLURM_STEP_NODELIST=n[1-2 does not parse as a host list" },
        { "n[x-2]", "n1", "does not parse as a host list" },
        { ",n1", "n1", "does not parse as a host list" },
        { "n[]", "n1", "does not parse as a host list" },
        { "n[-3],n1", "n1", "does not parse as a host list" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        unset_launch_env();
        setenv("SLURM_PROCID", "0", 1);
        setenv("SLURM_STEP_NUM_TASKS", "4", 1);
        setenv("SLURM_STEP_NUM_NODES", "2", 1);
        setenv("SLURM_JOB_ID", "77", 1);
        setenv("SLURM_STEP_ID", "0", 1);
        setenv("SLURM_STEP_NODELIST", cases[i].list, 1);
        setenv("SLURMD_NODENAME", cases[i].me, 1);
        tutti_store_t *st = NULL;
        int rank = -1, size = -1;
        int rc = tutti_store_open_env(&st, &rank, &size, NULL);
        const char *e = tutti_comm_last_error(NULL);
        ck_assert_msg(rc == TUTTI_ERR_CONFIG && !st && strstr(e, cases[i].want), "%s on %s: %s: %s",
                      cases[i].list, cases[i].me, tutti_status_name(rc), e);
    }
    unset_launch_env();
}
END_TEST

/* Slurm's host lists expanded (lib/base/hostlist.c: the library's step and tutti-run's
 * batch allocation), against lists written out by hand. */
static int join_host(void *ctx, const char *host)
{
    char *out = ctx;
    size_t n = strlen(out);
    snprintf(out + n, 1024 - n, "%s%s", n ? " " : "", host);
    return 0;
}

static int count_host(void *ctx, const char *host)
{
    (void)host;
    ++*(int *)ctx;
    return 0;
}

static int stop_at_two(void *ctx, const char *host)
{
    join_host(ctx, host);
    return strchr(ctx, ' ') != NULL;
}

START_TEST(slurm_hostlist_expand)
{
    static const struct {
        const char *list, *want; /* want NULL: does not parse */
    } cases[] = {
        { "gpu[07-09,12],cpu3", "gpu07 gpu08 gpu09 gpu12 cpu3" },
        { "rack[2-3]-ib[0-1]", "rack2-ib0 rack2-ib1 rack3-ib0 rack3-ib1" },
        { "n[8-10]", "n8 n9 n10" },
        { "n[098-101]x", "n098x n099x n100x n101x" },
        { "tn[01-02]", "tn01 tn02" },
        { "10.0.0.[1-2],a", "10.0.0.1 10.0.0.2 a" },
        { "[1-2]", "1 2" },
        { "x", "x" },
        { "n[1-2", NULL },
        { "n[x-2]", NULL },
        { ",n1", NULL },
        { "a,", NULL },
        { "a,,b", NULL },
        { "n[]", NULL },
        { "n[-3],n1", NULL },
        { "n[3-1]", NULL },
        { "n[1,,2]", NULL },
        { "n[1-]", NULL },
        { "a b", NULL },
        { "n]1", NULL },
        { "n[[1]]", NULL },
        { "n[1]]", NULL },
        { "", NULL },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[1024] = "";
        int n = tt_hostlist_each(cases[i].list, join_host, out);
        if (!cases[i].want) {
            ck_assert_msg(n == -1 && !out[0], "'%s': %d hosts '%s', expected -1 and none",
                          cases[i].list, n, out);
            continue;
        }
        int words = 1;
        for (const char *c = cases[i].want; *c; c++)
            words += *c == ' ';
        ck_assert_msg(n == words && !strcmp(out, cases[i].want), "'%s': %d '%s', expected %d '%s'",
                      cases[i].list, n, out, words, cases[i].want);
    }
    /* stopping early, and the first host */
    char out[1024] = "", first[8];
    ck_assert_int_eq(tt_hostlist_each("a[1-100000000]", stop_at_two, out), 2);
    ck_assert_str_eq(out, "a1 a2");
    ck_assert_int_eq(tt_hostlist_first("gpu[07-09]", first, sizeof(first)), 0);
    ck_assert_str_eq(first, "gpu07");
    ck_assert_int_eq(tt_hostlist_first("longname[1-2]", first, sizeof(first)), -1);
    /* a product too big to walk: checked at once, and stopped at the second host */
    char prod[400] = "p";
    for (int k = 0; k < 70; k++)
        strcat(prod, "[1-2]");
    out[0] = '\0';
    ck_assert_int_eq(tt_hostlist_each(prod, stop_at_two, out), 2);
    ck_assert_int_eq(strlen(out), 2 * 71 + 1);
    /* a host of 256 bytes or more, literal or from a range, does not parse, and then no
     * host is given at all (the list is checked first) */
    char big[300];
    int count = 0;
    memset(big, 'h', sizeof(big));
    big[255] = '\0';
    ck_assert_int_eq(tt_hostlist_each(big, count_host, &count), 1); /* 255 bytes */
    big[255] = 'h';
    big[256] = '\0';
    ck_assert_int_eq(tt_hostlist_each(big, count_host, &count), -1); /* 256 */
    snprintf(big + 253, sizeof(big) - 253, "[8-12]");                /* 254 and 255 bytes */
    ck_assert_int_eq(tt_hostlist_each(big, count_host, &count), 5);
    snprintf(big + 254, sizeof(big) - 254, "[8-12]"); /* 255, then 256 at h..h10 */
    count = 0;
    ck_assert_int_eq(tt_hostlist_each(big, count_host, &count), -1);
    ck_assert_int_eq(count, 0);
}
END_TEST

/* ---- IPv6 on loopback ---- */

static int have_ipv6_loopback(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
    int ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

static int rank_sum3(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    int64_t x[3] = { rank, 1, -rank }, y[3];
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
    th_spec_t spec = { .nranks = 3, .fn = rank_sum3, .timeout_ms = 20000, .opts = &o };
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
            struct sockaddr_in a = { .sin_family = AF_INET,
                                     .sin_port = htons((uint16_t)port),
                                     .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
            FAIL_IF(connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0, "connect");
            if (k == 0) {
                char junk[64];
                memset(junk, 0xA5, sizeof(junk));
                FAIL_IF(write(fd, junk, sizeof(junk)) != (ssize_t)sizeof(junk), "write");
            } else {
                uint32_t hello[4] = { 0x4f4c4c48u, 1, 1, 99 }; /* wrong size: 99 ranks */
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

TH_RUN_TEST(stray_connection_during_setup, th_run_nocomm(2, rank_stray, NULL, 20000))

/* ---- the log and the environment's warnings ---- */

/* How many times needle occurs in text. */
static int count_of(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* The log line of this process that ends in message has rank (a number, or "-") in its
 * prefix, "tutti host:pid:rank WARN message". */
static int logged_as(const char *text, const char *rank, const char *message)
{
    char want[256];
    snprintf(want, sizeof(want), ":%d:%s WARN %s\n", (int)getpid(), rank, message);
    return strstr(text, want) != NULL;
}

/* World rank r of 2 makes a communicator of its own (1 rank) after the world's: the
 * prefix keeps the world's rank (it showed the solo's rank 0, the last made); once the
 * world is destroyed, the solo's; before any, '-'. */
static int rank_log_prefix(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    th_capture_t cap;
    th_capture_begin(&cap);
    tt_log(TUTTI_LOG_WARN, "mark: before");
    tutti_store_t *store = NULL, *solo_store = NULL;
    tutti_comm_t *world = NULL, *solo = NULL;
    char solo_dir[512], r[16];
    snprintf(solo_dir, sizeof(solo_dir), "%s/solo%d", dir, rank);
    snprintf(r, sizeof(r), "%d", rank);
    int st = tutti_store_open_file(&store, dir, 5000);
    if (st == 0)
        st = tutti_comm_init(&world, store, rank, nranks, NULL);
    tt_log(TUTTI_LOG_WARN, "mark: world");
    if (st == 0)
        st = tutti_store_open_file(&solo_store, solo_dir, 5000);
    if (st == 0)
        st = tutti_comm_init(&solo, solo_store, 0, 1, NULL);
    tt_log(TUTTI_LOG_WARN, "mark: solo");
    if (st == 0)
        st = tutti_barrier(world);
    tutti_comm_destroy(world);
    tt_log(TUTTI_LOG_WARN, "mark: world gone");
    tutti_comm_destroy(solo);
    tt_log(TUTTI_LOG_WARN, "mark: none live");
    char *text = th_capture_end(&cap);
    FAIL_IF(st != 0, "set-up: %s", tutti_status_name(st));
    FAIL_IF(!logged_as(text, "-", "mark: before"), "before any communicator");
    FAIL_IF(!logged_as(text, r, "mark: world"), "with the world");
    FAIL_IF(!logged_as(text, r, "mark: solo"), "the solo communicator took the prefix");
    FAIL_IF(!logged_as(text, "0", "mark: world gone"), "after the world's destroy");
    FAIL_IF(!logged_as(text, "0", "mark: none live"), "with none live");
    free(text);
    tutti_store_close(solo_store);
    tutti_store_close(store);
    return 0;
}

TH_RUN_TEST(log_prefix_rank, th_run_nocomm(2, rank_log_prefix, NULL, 30000))

/* A value with control characters, quoted in a warning, stays in its one line. */
START_TEST(log_one_line)
{
    setenv("TUTTI_TIMEOUT_MS", "12\nforged line\r\x1b[2J", 1);
    th_capture_t cap;
    th_capture_begin(&cap);
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    char *text = th_capture_end(&cap);
    unsetenv("TUTTI_TIMEOUT_MS");
    ck_assert_msg(strstr(text, "TUTTI_TIMEOUT_MS=12\\nforged line\\r\\x1b[2J"), "log: %s", text);
    ck_assert_int_eq(count_of(text, "\n"), 1);
    ck_assert_int_eq(count_of(text, "\x1b"), 0);
    free(text);
}
END_TEST

/* TUTTI_DEBUG: the documented values in any case; anything else is warn, said once. */
START_TEST(log_level_values)
{
    ck_assert_int_eq(tt_log_level_parse("WARN"), TUTTI_LOG_WARN);
    ck_assert_int_eq(tt_log_level_parse("Info"), TUTTI_LOG_INFO);
    ck_assert_int_eq(tt_log_level_parse("trace"), TUTTI_LOG_TRACE);
    ck_assert_int_eq(tt_log_level_parse("error"), TUTTI_LOG_ERROR);
    ck_assert_int_eq(tt_log_level_parse("None"), TUTTI_LOG_ERROR);
    ck_assert_int_eq(tt_log_level_parse(NULL), TUTTI_LOG_WARN);
    ck_assert_int_eq(tt_log_level_parse("verbose"), -1);
    /* this test's own process has not read the level yet (check forks each test) */
    setenv("TUTTI_DEBUG", "verbose", 1);
    th_capture_t cap;
    th_capture_begin(&cap);
    int a = tt_log_level(), b = tt_log_level();
    char *text = th_capture_end(&cap);
    unsetenv("TUTTI_DEBUG");
    ck_assert_int_eq(a, TUTTI_LOG_WARN);
    ck_assert_int_eq(b, TUTTI_LOG_WARN);
    ck_assert_int_eq(count_of(text, "TUTTI_DEBUG=verbose is none of"), 1);
    free(text);
}
END_TEST

/* TUTTI_DEBUG_FILE (NCCL_DEBUG_FILE's): lines go to the file named with %h and %p, not
 * to stderr; a forked child writes to its own (%p); a name that cannot be opened leaves
 * them on stderr, said once. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *buf = calloc(1, 65536);
    size_t n = buf ? fread(buf, 1, 65535, f) : 0;
    (void)n;
    fclose(f);
    return buf;
}

START_TEST(log_to_a_file)
{
    char dir[] = "/tmp/tutti-logfile-XXXXXX", pat[256], mine[512], childs[512], host[64] = "?";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    gethostname(host, sizeof(host) - 1);
    snprintf(pat, sizeof(pat), "%s/log.%%h.%%p.txt", dir);
    snprintf(mine, sizeof(mine), "%s/log.%s.%d.txt", dir, host, (int)getpid());
    setenv("TUTTI_DEBUG_FILE", pat, 1);
    th_capture_t cap;
    th_capture_begin(&cap);
    tt_log(TUTTI_LOG_WARN, "mark: parent one");
    pid_t child = fork();
    if (child == 0) {
        tt_log(TUTTI_LOG_WARN, "mark: child");
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    tt_log(TUTTI_LOG_WARN, "mark: parent two");
    char *err = th_capture_end(&cap);
    snprintf(childs, sizeof(childs), "%s/log.%s.%d.txt", dir, host, (int)child);
    char *a = slurp(mine), *b = slurp(childs);
    ck_assert_msg(a && strstr(a, "mark: parent one") && strstr(a, "mark: parent two") &&
                      !strstr(a, "mark: child"),
                  "%s: %s", mine, a ? a : "(none)");
    ck_assert_msg(b && strstr(b, "mark: child") && !strstr(b, "parent"), "%s: %s", childs,
                  b ? b : "(none)");
    ck_assert_msg(!strstr(err, "mark:"), "stderr: %s", err);
    free(a);
    free(b);
    free(err);
    unsetenv("TUTTI_DEBUG_FILE");
    unlink(mine);
    unlink(childs);
    rmdir(dir);
}
END_TEST

/* (a test of its own: check runs it in a fresh process, whose log has no file yet) */
START_TEST(log_file_unopenable)
{
    setenv("TUTTI_DEBUG_FILE", "/nonexistent-dir-tutti/x.log", 1);
    th_capture_t cap;
    th_capture_begin(&cap);
    tt_log(TUTTI_LOG_WARN, "mark: one");
    tt_log(TUTTI_LOG_WARN, "mark: two");
    char *err = th_capture_end(&cap);
    unsetenv("TUTTI_DEBUG_FILE");
    ck_assert_msg(count_of(err, "TUTTI_DEBUG_FILE=/nonexistent-dir-tutti/x.log: cannot open") ==
                          1 &&
                      strstr(err, "mark: one") && strstr(err, "mark: two"),
                  "stderr: %s", err);
    free(err);
}
END_TEST

/* A bad value in the environment is warned about once per process: tutti_comm_opts_init,
 * then each communicator's own reading (tt_comm_opts_resolve), said it again (as rank -1,
 * then as the rank). A negative timeout, which becomes the default, is said once too. */
static int rank_warn_once(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    th_capture_t cap;
    th_capture_begin(&cap);
    tutti_store_t *store = NULL;
    tutti_comm_t *c1 = NULL, *c2 = NULL;
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = -5;
    int st = tutti_store_open_file(&store, dir, 5000);
    if (st == 0)
        st = tutti_comm_init(&c1, store, rank, nranks, &o);
    if (st == 0)
        st = tutti_comm_init(&c2, store, rank, nranks, &o);
    int timeout = st == 0 ? c1->opts.timeout_ms : -1;
    tutti_comm_destroy(c2);
    tutti_comm_destroy(c1);
    char *text = th_capture_end(&cap);
    FAIL_IF(st != 0, "init: %s", tutti_status_name(st));
    FAIL_IF(count_of(text, "TUTTI_SPIN_US=garbage is neither auto nor an integer; using auto") != 1,
            "TUTTI_SPIN_US=garbage warned %d times", count_of(text, "TUTTI_SPIN_US=garbage"));
    FAIL_IF(count_of(text, "TUTTI_CHUNK_BYTES=lots is not a size") != 1, "TUTTI_CHUNK_BYTES");
    FAIL_IF(count_of(text, "timeout_ms (TUTTI_TIMEOUT_MS) -5") != 1, "timeout -5 warned %d times",
            count_of(text, "timeout_ms (TUTTI_TIMEOUT_MS) -5"));
    FAIL_IF(timeout != 30000, "timeout -5 gave %d", timeout);
    free(text);
    tutti_store_close(store);
    return 0;
}

START_TEST(env_warned_once)
{
    setenv("TUTTI_SPIN_US", "garbage", 1);
    setenv("TUTTI_CHUNK_BYTES", "lots", 1);
    int st = th_run_nocomm(2, rank_warn_once, NULL, 30000);
    unsetenv("TUTTI_SPIN_US");
    unsetenv("TUTTI_CHUNK_BYTES");
    ck_assert_int_eq(st, 0);
}
END_TEST

/* One size grammar (transports/kit/util.h tp_parse_size) for the library's sizes and the
 * transports' knobs: the kit refused "1MB", which the library took; TUTTI_IB_MR_CACHE_BYTES
 * took hex; TUTTI_SOCKET_BUFFER=4M was "not an integer; using 0". */
START_TEST(size_grammar)
{
    static const struct {
        const char *s;
        size_t v; /* SIZE_MAX: not a size */
    } cases[] = {
        { "4096", 4096 },
        { "64K", 65536 },
        { "64k", 65536 },
        { "1M", 1 << 20 },
        { "1MB", 1 << 20 },
        { "2gb", (size_t)2 << 30 },
        { "0", 0 },
        { "0x10", SIZE_MAX },
        { "-1", SIZE_MAX },
        { "1.5M", SIZE_MAX },
        { "1 M", SIZE_MAX },
        { " 1M", SIZE_MAX },
        { "1MiB", SIZE_MAX },
        { "", SIZE_MAX },
        { "M", SIZE_MAX },
        { "1B", SIZE_MAX },
        { "99999999999999999999", SIZE_MAX },
    };
    for (size_t i = 0; i < TT_ARRAY_SIZE(cases); i++) {
        size_t lib = 7, kit = 7;
        int a = tt_parse_size(cases[i].s, &lib), b = tp_parse_size(cases[i].s, &kit);
        ck_assert_msg((a == 0) == (cases[i].v != SIZE_MAX) && (b == 0) == (a == 0),
                      "\"%s\": library %d, kit %d", cases[i].s, a, b);
        if (a == 0)
            ck_assert_msg(lib == cases[i].v && kit == lib, "\"%s\": %zu, %zu", cases[i].s, lib,
                          kit);
    }
    /* a transport's knob, as the host answers it */
    th_host_t t;
    th_host_init(&t, NULL, 0, 1, 1000, NULL);
    t.knobs = "SHM_STEP_BYTES=1MB,IB_MR_CACHE_BYTES=0x40000000,IB_EAGER_BYTES=4K";
    const tutti_tp_host_v1_t *h = &t.h;
    ck_assert_uint_eq(tp_knob_size(h, "SHM_STEP_BYTES", 65536), 1 << 20);
    ck_assert_uint_eq(tp_knob_size(h, "IB_MR_CACHE_BYTES", 123), 123);
    size_t x;
    const char *raw;
    ck_assert_int_eq(tp_knob_bytes(h, "IB_EAGER_BYTES", 8192, 0, 1 << 20, &x, &raw), 0);
    ck_assert_uint_eq(x, 4096);
    ck_assert_int_eq(tp_knob_bytes(h, "IB_EAGER_BYTES", 8192, 0, 1024, &x, &raw), TUTTI_ERR_CONFIG);
    ck_assert_uint_eq(x, 8192);
    /* the library's own: TUTTI_SOCKET_BUFFER is a size */
    setenv("TUTTI_SOCKET_BUFFER", "4M", 1);
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    unsetenv("TUTTI_SOCKET_BUFFER");
    ck_assert_int_eq(o.socket_buffer_bytes, 4 << 20);
}
END_TEST

/* TUTTI_TRANSPORT_OPTIONS names the transports' knobs: an entry that names none (a
 * typo), is not NAME=VALUE, or names an option with a field of its own (never read from
 * there) was ignored without a word. Each is warned about once per process, whichever
 * transport runs (the knobs of every built-in one are known); known knobs are not. */
static int rank_tp_options(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    th_capture_t cap;
    th_capture_begin(&cap);
    tutti_store_t *store = NULL;
    tutti_comm_t *c1 = NULL, *c2 = NULL;
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.transport_options = "SHM_RING_BYTE=1M,garbage,SOCKET_IFNAME=lo,TCP_CONNECT=eager,"
                          "IB_DEV=mlx5_0,SHM_STEP_BYTES=64K,,=3";
    int st = tutti_store_open_file(&store, dir, 5000);
    if (st == 0)
        st = tutti_comm_init(&c1, store, rank, nranks, &o);
    if (st == 0)
        st = tutti_comm_init(&c2, store, rank, nranks, &o);
    tutti_comm_destroy(c2);
    tutti_comm_destroy(c1);
    char *text = th_capture_end(&cap);
    FAIL_IF(st != 0, "init: %s", tutti_status_name(st));
    static const char *const want[] = {
        "TUTTI_TRANSPORT_OPTIONS: \"SHM_RING_BYTE=1M\" names no knob of the transports: ignored "
        "(SHM_RING_BYTES?)",
        "TUTTI_TRANSPORT_OPTIONS: \"garbage\" is not NAME=VALUE",
        "TUTTI_TRANSPORT_OPTIONS: \"=3\" is not NAME=VALUE",
        "TUTTI_TRANSPORT_OPTIONS: \"SOCKET_IFNAME=lo\" is an option of its own",
    };
    for (size_t i = 0; i < TT_ARRAY_SIZE(want); i++)
        FAIL_IF(count_of(text, want[i]) != 1, "%d times: %s", count_of(text, want[i]), want[i]);
    FAIL_IF(count_of(text, "TUTTI_TRANSPORT_OPTIONS") != (int)TT_ARRAY_SIZE(want),
            "%d warnings about TUTTI_TRANSPORT_OPTIONS", count_of(text, "TUTTI_TRANSPORT_OPTIONS"));
    free(text);
    tutti_store_close(store);
    return 0;
}

TH_RUN_TEST(transport_options_checked, th_run_nocomm(2, rank_tp_options, NULL, 30000))

/* A transport's knob with a bad value, given in TUTTI_TRANSPORT_OPTIONS: the error and
 * the warning name it there, not as a TUTTI_ variable of its own that is not set
 * (session 102): shm's SHM_NT_STORES (an error: init fails) and SHM_RING_BYTES (a
 * warning: the default is used). */
static int rank_tp_option_named(int rank, int nranks, tutti_comm_t *unused, const char *dir,
                                void *arg)
{
    (void)unused, (void)arg;
    tutti_store_t *store = NULL;
    tutti_comm_t *c = NULL;
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.transport = "shm";
    o.timeout_ms = 5000;
    o.transport_options = "SHM_RING_BYTES=abc,SHM_NT_STORES=x";
    th_capture_t cap;
    th_capture_begin(&cap);
    int st = tutti_store_open_file(&store, dir, 5000);
    FAIL_IF(st != 0, "store");
    st = tutti_comm_init(&c, store, rank, nranks, &o);
    char err[512];
    snprintf(err, sizeof(err), "%s", tutti_comm_last_error(NULL));
    char *text = th_capture_end(&cap);
    FAIL_IF(st != TUTTI_ERR_CONFIG, "init: %s: %s", tutti_status_name(st), err);
    FAIL_IF(!strstr(err, "TUTTI_TRANSPORT_OPTIONS's SHM_NT_STORES=\"x\" is none of") ||
                strstr(err, "TUTTI_SHM_NT_STORES"),
            "error: %s", err);
    FAIL_IF(!strstr(text, "TUTTI_TRANSPORT_OPTIONS's SHM_RING_BYTES=abc is not a size") ||
                strstr(text, "TUTTI_SHM_RING_BYTES"),
            "log: %s", text);
    free(text);
    tutti_store_close(store);
    return 0;
}

TH_RUN_TEST(transport_option_named, th_run_nocomm(2, rank_tp_option_named, NULL, 30000))

/* The headers, the library and meson.build's project version say one version. */
START_TEST(version_agrees)
{
    char want[32];
    snprintf(want, sizeof(want), "%d.%d.%d", TUTTI_VERSION_MAJOR, TUTTI_VERSION_MINOR,
             TUTTI_VERSION_PATCH);
    ck_assert_str_eq(want, TT_PROJECT_VERSION);
    ck_assert_str_eq(tutti_version_string(), TT_PROJECT_VERSION);
    int major, minor, patch;
    ck_assert_int_eq(sscanf(TT_PROJECT_VERSION, "%d.%d.%d", &major, &minor, &patch), 3);
    ck_assert_int_eq(tutti_version(), major * 10000 + minor * 100 + patch);
    ck_assert_int_eq(tutti_version(), TUTTI_VERSION_CODE);
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
    Suite *s = suite_create("args");
    th_add_tests(s, "status", 90, (const TTest *const[]){ status_strings, version_agrees, NULL });
    th_add_tests(s, "arguments", 90,
                 (const TTest *const[]){ bad_init_arguments, bad_arguments,
                                         bad_arguments_other_collectives, work_outlives_comm,
                                         NULL });
    th_add_tests(s, "env", 90,
                 (const TTest *const[]){ unreachable_store_via_env, bad_ifname, init_from_env,
                                         init_from_mpirun_env, huge_rank_or_size_refused,
                                         slurm_node_lists, slurm_hostlist_expand, NULL });
    th_add_tests(s, "log", 90,
                 (const TTest *const[]){ log_prefix_rank, log_one_line, log_level_values,
                                         log_to_a_file, log_file_unopenable, NULL });
    th_add_tests(s, "knobs", 90,
                 (const TTest *const[]){ env_warned_once, size_grammar, transport_options_checked,
                                         transport_option_named, NULL });
    th_add_tests(s, "setup", 90,
                 (const TTest *const[]){ ipv6_loopback, bad_socket_family,
                                         stray_connection_during_setup, NULL });
    return s;
}

int main(void)
{
    return th_main(suite());
}
