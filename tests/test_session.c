/* Job identity and restart in place (issue 10, defects 1, 2 and 6's store litter): two
 * jobs on one store directory never mix, a rerun on a used directory works (after a
 * clean exit and after a crash), destroy + init cycles in one process keep fds, memory
 * and /dev/shm flat, and a finished job leaves no keys behind. */
#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "store/store_impl.h"

static int quick(void)
{
    return getenv("TT_TEST_QUICK") != NULL;
}

#define sleep_ms th_sleep_ms

/* One rank of a job (th_job_rank): 20 allreduces of 4 elements, on the file store in dir. */
static int job_rank(int job, int rank, int nranks, const char *dir, const char *job_id,
                    const char *transport)
{
    th_job_t j = {
        .job_id = job_id, .transport = transport, .timeout_ms = 4000, .iters = 20, .count = 4
    };
    return th_job_rank(job, rank, nranks, dir, &j);
}

/* ---- two jobs, one directory ---- */

typedef struct two_jobs {
    int nranks;         /* per job */
    int delay_ms[8];    /* start delay of harness rank i: job i / nranks, rank i % nranks */
    const char *ids[2]; /* job ids (NULL: none) */
    const char *transport;
} two_jobs_t;

static int rank_two_jobs(int hr, int total, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)total;
    (void)unused;
    const two_jobs_t *t = arg;
    int job = hr / t->nranks, rank = hr % t->nranks;
    sleep_ms(t->delay_ms[hr]);
    return job_rank(job, rank, t->nranks, dir, t->ids[job], t->transport);
}

/* Interleavings of 2 jobs x 2 ranks: start delays in ms for A0 A1 B0 B1. */
static const int orders[][4] = {
    { 0, 0, 0, 0 },    { 0, 40, 20, 60 }, { 0, 60, 40, 20 }, { 40, 0, 60, 20 },    { 0, 30, 0, 30 },
    { 20, 60, 0, 40 }, { 0, 20, 10, 30 }, { 60, 0, 0, 60 },  { 0, 200, 100, 300 },
};
#define NORDERS ((int)(sizeof(orders) / sizeof(orders[0])))

static void run_two_jobs(const char *ida, const char *idb, const char *transport, int order,
                         int codes[4])
{
    two_jobs_t t = { .nranks = 2, .ids = { ida, idb }, .transport = transport };
    memcpy(t.delay_ms, orders[order], sizeof(orders[order]));
    th_run_apart(4, rank_two_jobs, &t, 30000, codes);
}

/* With job ids (as every launcher gives): both jobs always run, each on its own sums. */
START_TEST(two_jobs_with_ids)
{
    const char *tp = _i ? "shm" : "tcp";
    for (int o = 0; o < NORDERS; o++) {
        int codes[4];
        run_two_jobs("job-a", "job-b", tp, o, codes);
        for (int i = 0; i < 4; i++)
            ck_assert_msg(codes[i] == TH_JR_OK, "%s, order %d: job %d rank %d exited %d", tp, o,
                          i / 2, i % 2, codes[i]);
    }
}
END_TEST

/* Without ids: a job never computes with another job's ranks; when starts overlap, the
 * later job (or both) fails with TUTTI_ERR_IN_USE, never with wrong sums. */
START_TEST(two_jobs_without_ids)
{
    const char *tp = _i ? "shm" : "tcp";
    int ran = 0, refused = 0;
    for (int o = 0; o < NORDERS; o++) {
        int codes[4];
        run_two_jobs(NULL, NULL, tp, o, codes);
        for (int i = 0; i < 4; i++) {
            ck_assert_msg(codes[i] != TH_JR_WRONG, "%s, order %d: job %d rank %d met the other job",
                          tp, o, i / 2, i % 2);
            ck_assert_msg(codes[i] == TH_JR_OK || codes[i] == TH_JR_IN_USE ||
                              codes[i] == TH_JR_TIMEOUT || codes[i] == TH_JR_OP_FAILED,
                          "%s, order %d: job %d rank %d exited %d", tp, o, i / 2, i % 2, codes[i]);
            ran += codes[i] == TH_JR_OK;
            refused += codes[i] == TH_JR_IN_USE;
        }
    }
    fprintf(stderr, "two_jobs_without_ids over %s: %d rank runs passed, %d refused (in use)\n", tp,
            ran, refused);
}
END_TEST

/* ---- reruns in place ---- */

typedef struct rerun {
    int crash_rank; /* -1: none; else this rank SIGKILLs itself after set-up */
} rerun_t;

static int rank_rerun(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const rerun_t *r = arg;
    unsetenv("TUTTI_JOB_ID"); /* every run the same job, as a user's rerun would be */
    if (r->crash_rank < 0)
        return job_rank(0, rank, nranks, dir, NULL, NULL);
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 10000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 3000;
    tutti_comm_t *comm = NULL;
    FAIL_IF(tutti_comm_init(&comm, store, rank, nranks, &o) != 0, "init");
    if (rank == r->crash_rank)
        raise(SIGKILL);
    int32_t v = 1;
    tutti_allreduce(comm, TUTTI_IN_PLACE, &v, 1, TUTTI_INT32, TUTTI_SUM);
    sleep_ms(200);
    /* a survivor of a crash ends as it can: no destroy, like a killed launcher's ranks */
    _exit(0);
}

/* Names in dir: every entry but "." and ".." (dot_files 1), or only those not starting
 * with '.' (dot_files 0: a file store's few ".lock.NN" stripe files are the store's, not
 * anybody's keys). */
static int count_names(const char *dir, int dot_files)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += dot_files ? strcmp(e->d_name, ".") && strcmp(e->d_name, "..") : e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Runs of a 3-rank job on one directory with the default transport (shm between local
 * ranks): a clean run, a rerun, a crashed run, a rerun, another crash (rank 0, which
 * holds the instance record), a rerun. */
START_TEST(rerun_in_place)
{
    char dir[] = "/tmp/tt-session-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    static const int crash[] = { -1, -1, 1, -1, 0, -1 };
    char why[256] = "";
    for (size_t k = 0; k < sizeof(crash) / sizeof(crash[0]) && !why[0]; k++) {
        rerun_t r = { .crash_rank = crash[k] };
        th_spec_t spec = { .nranks = 3,
                           .fn = rank_rerun,
                           .arg = &r,
                           .timeout_ms = 20000,
                           .flags = TH_NO_COMM | TH_NO_KILL_ON_FAIL,
                           .store_dir = dir };
        int codes[3];
        th_run_ex(&spec, codes);
        for (int i = 0; i < 3 && !why[0]; i++) {
            if (crash[k] < 0 && codes[i] != 0)
                snprintf(why, sizeof(why), "run %zu (clean): rank %d exited %d", k, i, codes[i]);
            else if (crash[k] == i && codes[i] != 128 + SIGKILL)
                snprintf(why, sizeof(why), "run %zu: rank %d should have crashed, exited %d", k, i,
                         codes[i]);
        }
    }
    th_rmtree_gone(dir);
    ck_assert_msg(!why[0], "%s", why);
}
END_TEST

/* ---- destroy + init in one process ---- */

static int fd_count(void)
{
    return count_names("/proc/self/fd", 1);
}

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2)
            res = 0;
        fclose(f);
    }
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* this process's shm segments (others' tests may run beside this one) */
static int shm_count(void)
{
    char mine[32];
    snprintf(mine, sizeof(mine), "tutti-shm-%d-", (int)getpid());
    DIR *d = opendir("/dev/shm");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += !strncmp(e->d_name, mine, strlen(mine));
    closedir(d);
    return n;
}

typedef struct cycles {
    int n;
    int env;  /* 1: tutti_comm_init_env (a new store handle per cycle) over the
                         file store; 2: the same over a tcp store hosted by rank 0 */
    int port; /* env 2: the store's port */
    const char *transport;
} cycles_t;

static int rank_cycles(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const cycles_t *c = arg;
    char url[512];
    setenv("TUTTI_JOB_ID", "cycles", 1); /* one job: every cycle on the same prefix */
    if (c->env == 2)
        snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", c->port);
    else
        snprintf(url, sizeof(url), "file://%s", dir);
    th_set_rank_env(url, rank, nranks);
    tutti_store_t *store = NULL;
    if (!c->env)
        FAIL_IF(tutti_store_open_file(&store, dir, 10000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 10000;
    o.transport = c->transport;
    int fds0 = 0, shm0 = 0;
    long rss0 = 0;
    int warm = c->n / 10; /* allocator and caches settle first */
    for (int i = 0; i < c->n; i++) {
        if (i == warm) {
            fds0 = fd_count();
            rss0 = rss_kb();
            shm0 = shm_count();
        }
        tutti_comm_t *comm = NULL;
        int st = c->env ? tutti_comm_init_env(&comm, &o)
                        : tutti_comm_init(&comm, store, rank, nranks, &o);
        FAIL_IF(st != 0, "cycle %d: init: %s", i, tutti_status_name(st));
        int32_t v = rank + i;
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, &v, 1, TUTTI_INT32, TUTTI_SUM);
        FAIL_IF(st != 0, "cycle %d: allreduce: %s", i, tutti_comm_last_error(comm));
        FAIL_IF(v != nranks * (nranks - 1) / 2 + nranks * i, "cycle %d: sum %d", i, v);
        FAIL_IF(tutti_comm_destroy(comm) != 0, "cycle %d: destroy", i);
    }
    int fds1 = fd_count(), shm1 = shm_count();
    long rss1 = rss_kb();
    if (rank == 0)
        fprintf(stderr, "%d cycles (%s, %s): fds %d -> %d, RSS %ld -> %ld KiB, /dev/shm %d -> %d\n",
                c->n,
                c->env == 2 ? "init_env, tcp store"
                : c->env    ? "init_env"
                            : "init",
                c->transport, fds0, fds1, rss0, rss1, shm0, shm1);
    FAIL_IF(fds1 > fds0, "fds grew from %d to %d over %d cycles", fds0, fds1, c->n - warm);
    FAIL_IF(!TH_ASAN && rss1 > rss0 + 4096, "RSS grew from %ld to %ld KiB", rss0, rss1);
    FAIL_IF(shm1 > shm0, "/dev/shm grew from %d to %d entries", shm0, shm1);
    if (store)
        tutti_store_close(store);
    return 0;
}

START_TEST(destroy_init_cycles)
{
    static const char *const tps[] = { "tcp", "shm" };
    for (int env = 0; env < 3; env++) {
        cycles_t c = {
            .n = quick() ? 60 : 300, .env = env, .transport = tps[_i], .port = th_free_port()
        };
        ck_assert_int_eq(th_run_nocomm(2, rank_cycles, &c, 170000), 0);
    }
}
END_TEST

/* ---- a finished job leaves no keys ---- */

static int litter_port;

static int rank_litter(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const int tcp = *(const int *)arg;
    for (int k = 0; k < 3; k++) {
        int rc;
        if (tcp) {
            /* a job on a tcp store this test's process serves */
            tutti_store_t *store;
            FAIL_IF(tutti_store_open_tcp(&store, "127.0.0.1", litter_port, 0, 10000) != 0,
                    "tcp store");
            tutti_comm_t *comm = NULL;
            FAIL_IF(tutti_comm_init(&comm, store, rank, nranks, NULL) != 0, "init");
            int32_t v = 1;
            FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, &v, 1, TUTTI_INT32, TUTTI_SUM) != 0 ||
                        v != nranks,
                    "allreduce");
            tutti_comm_destroy(comm);
            tutti_store_close(store);
            rc = 0;
        } else {
            rc = job_rank(0, rank, nranks, dir, NULL, NULL);
        }
        FAIL_IF(rc != 0, "run %d exited %d", k, rc);
    }
    return 0;
}

/* Three runs of a job, one after the other, then nothing of theirs is left in the store:
 * neither the instances' keys (transport addresses, claims, counters, cost model, host
 * ids) nor their records. */
START_TEST(no_litter)
{
    int tcp = _i;
    char dir[] = "/tmp/tt-session-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    tutti_store_t *server = NULL;
    if (tcp) {
        ck_assert_int_eq(tutti_store_open_tcp(&server, "127.0.0.1", 0, 1, 10000), 0);
        litter_port = tutti_store_port(server);
    }
    th_spec_t spec = { .nranks = 3,
                       .fn = rank_litter,
                       .arg = &tcp,
                       .timeout_ms = 30000,
                       .flags = TH_NO_COMM,
                       .store_dir = dir };
    int rc = th_run_ex(&spec, NULL);
    long left = tcp ? (long)tt_store_tcp_server_keys(server) : count_names(dir, 0);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "ls -la %s >&2; rm -rf %s", dir, dir);
    if (left && !tcp)
        ck_assert_int_eq(system(cmd), 0);
    else
        th_rmtree(dir); /* the file store's lock files (.lock.NN) stay by design */
    if (server)
        tutti_store_close(server);
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(left == 0, "3 finished runs left %ld keys in the %s store", left,
                  tcp ? "tcp" : "file");
}
END_TEST

/* TUTTI_CHECKSUM is checked by the library, not only by the transport that uses it: a
 * job on shm alone once took any value silently. */
START_TEST(bad_checksum_without_tcp)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.transport = "shm";
    o.checksum = "md5";
    char err[1024];
    ck_assert_int_eq(th_init_one(&o, err, sizeof(err), NULL, NULL), TUTTI_ERR_CONFIG);
    ck_assert_msg(strstr(err, "TUTTI_CHECKSUM=md5"), "%s", err);
}
END_TEST

/* ---- ranks as threads of one process (ncclCommInitAll's, gloo's tests') ---- */

/* Three ranks as threads of this process, joined through one unique id (made here: the
 * process serves its store), each with allreduces of growing counts checked, a split
 * and a barrier on it, then destroyed; over the suite's transport. */
enum { THR_RANKS = 3 };
static tutti_unique_id_t thr_id;

static void *thr_rank(void *arg)
{
    int r = (int)(long)arg;
    tutti_comm_t *c = NULL, *sub = NULL;
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 20000;
    if (tutti_comm_init_rank(&c, THR_RANKS, &thr_id, r, &o) != 0) {
        fprintf(stderr, "thread rank %d: init_rank: %s\n", r, tutti_comm_last_error(NULL));
        return (void *)1;
    }
    long bad = 0;
    for (int it = 0; it < 20 && !bad; it++) {
        size_t n = 1 + (size_t)it * 5003;
        double *b = malloc(n * sizeof(*b));
        for (size_t i = 0; b && i < n; i++)
            b[i] = r + (double)i;
        if (!b || tutti_allreduce(c, TUTTI_IN_PLACE, b, n, TUTTI_FP64, TUTTI_SUM) != 0) {
            fprintf(stderr, "thread rank %d: allreduce %d: %s\n", r, it, tutti_comm_last_error(c));
            bad = 1;
        }
        for (size_t i = 0; !bad && i < n; i++)
            if (b[i] != THR_RANKS * (THR_RANKS - 1) / 2.0 + THR_RANKS * (double)i) {
                fprintf(stderr, "thread rank %d: allreduce %d: [%zu] = %g\n", r, it, i, b[i]);
                bad = 1;
            }
        free(b);
    }
    if (!bad && (tutti_comm_split(c, r % 2, -r, &sub) != 0 || tutti_barrier(sub) != 0 ||
                 tutti_comm_size(sub) != (r % 2 ? 1 : 2))) {
        fprintf(stderr, "thread rank %d: split: %s\n", r, tutti_comm_last_error(c));
        bad = 1;
    }
    tutti_comm_destroy(sub);
    tutti_comm_destroy(c);
    return (void *)bad;
}

START_TEST(ranks_as_threads)
{
    ck_assert_msg(tutti_get_unique_id(&thr_id) == 0, "%s", tutti_comm_last_error(NULL));
    pthread_t t[THR_RANKS];
    for (long r = 0; r < THR_RANKS; r++)
        ck_assert_int_eq(pthread_create(&t[r], NULL, thr_rank, (void *)r), 0);
    long bad = 0;
    for (int r = 0; r < THR_RANKS; r++) {
        void *v = NULL;
        pthread_join(t[r], &v);
        bad += (long)v;
    }
    ck_assert_int_eq(tutti_unique_id_release(&thr_id), 0);
    ck_assert_msg(bad == 0, "%ld thread rank(s) failed (above)", bad);
}
END_TEST

/* tutti_comm_init_all (ncclCommInitAll): three ranks made by one call, driven from this
 * one thread with _async calls and tutti_wait_all (NCCL's group calls' way): an
 * allreduce and a broadcast checked on each; one rank alone; bad arguments. */
START_TEST(init_all_driven_by_one_thread)
{
    enum { N = 3, COUNT = 40000 };
    tutti_comm_t *comms[N];
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 20000;
    ck_assert_msg(tutti_comm_init_all(comms, N, &o) == 0, "%s", tutti_comm_last_error(NULL));
    static int64_t buf[N][COUNT], bc[N][4];
    tutti_work_t *w[2 * N];
    for (int r = 0; r < N; r++) {
        ck_assert_int_eq(tutti_comm_rank(comms[r]), r);
        ck_assert_int_eq(tutti_comm_size(comms[r]), N);
        for (int i = 0; i < COUNT; i++)
            buf[r][i] = (int64_t)(r + 1) * i;
        for (int i = 0; i < 4; i++)
            bc[r][i] = r == 2 ? 70 + i : -1;
    }
    for (int r = 0; r < N; r++)
        ck_assert_int_eq(tutti_allreduce_async(comms[r], TUTTI_IN_PLACE, buf[r], COUNT, TUTTI_INT64,
                                               TUTTI_SUM, &w[r]),
                         0);
    for (int r = 0; r < N; r++)
        ck_assert_int_eq(tutti_broadcast_async(comms[r], bc[r], bc[r], 4, TUTTI_INT64, 2,
                                               &w[N + r]),
                         0);
    ck_assert_int_eq(tutti_wait_all(2 * N, w, 20000), 0);
    for (int r = 0; r < N; r++) {
        for (int i = 0; i < COUNT; i += 997)
            ck_assert_int_eq(buf[r][i], (int64_t)6 * i);
        ck_assert_int_eq(buf[r][COUNT - 1], (int64_t)6 * (COUNT - 1));
        for (int i = 0; i < 4; i++)
            ck_assert_int_eq(bc[r][i], 70 + i);
        tutti_work_free(w[r]);
        tutti_work_free(w[N + r]);
    }
    for (int r = 0; r < N; r++)
        tutti_comm_destroy(comms[r]);
    tutti_comm_t *one;
    ck_assert_int_eq(tutti_comm_init_all(&one, 1, NULL), 0);
    int64_t x = 5;
    ck_assert_int_eq(tutti_allreduce(one, TUTTI_IN_PLACE, &x, 1, TUTTI_INT64, TUTTI_SUM), 0);
    ck_assert_int_eq(x, 5);
    tutti_comm_destroy(one);
    /* a failure: none is left, the rank and the cause said */
    o.transport = "nosuch";
    ck_assert_int_lt(tutti_comm_init_all(comms, N, &o), 0);
    ck_assert_msg(!comms[0] && !comms[1] && !comms[2], "a communicator left");
    ck_assert_msg(strstr(tutti_comm_last_error(NULL), "tutti_comm_init_all: rank ") &&
                      strstr(tutti_comm_last_error(NULL), "nosuch"),
                  "%s", tutti_comm_last_error(NULL));
    ck_assert_int_eq(tutti_comm_init_all(comms, 0, NULL), TUTTI_ERR_INVALID_ARG);
    ck_assert_msg(strstr(tutti_comm_last_error(NULL), "n must be 1 or more"), "%s",
                  tutti_comm_last_error(NULL));
}
END_TEST

TH_CASES_MAIN("session", 200, TH_CASE(two_jobs_with_ids, 2), TH_CASE(two_jobs_without_ids, 2),
              TH_CASE(rerun_in_place, 1), TH_CASE(destroy_init_cycles, 2), TH_CASE(no_litter, 2),
              TH_CASE(bad_checksum_without_tcp, 1), TH_CASE(ranks_as_threads, 1),
              TH_CASE(init_all_driven_by_one_thread, 1))
