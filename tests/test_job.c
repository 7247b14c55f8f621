/* Job identity under attack (lib/core/job.c), from a review: a rank that lost its slot to
 * another job, rank 0 retrying init in one process, ranks in other pid namespaces, clocks
 * that differ between hosts, a rank restarted in place, a stalled store during the
 * contest check, destroy + init cycles with nothing in between. Each case failed on
 * 676abfb (the first job identity commit). */

#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

/* CLOCK_REALTIME of this process, shifted by clock_skew_s seconds (set in one rank only):
 * a host whose wall clock is off. Every other clock, and every other process, untouched. */
static volatile long clock_skew_s;
int clock_gettime(clockid_t c, struct timespec *ts)
{
    int r = (int)syscall(SYS_clock_gettime, c, ts);
    if (r == 0 && c == CLOCK_REALTIME)
        ts->tv_sec += clock_skew_s;
    return r;
}

#define sleep_ms th_sleep_ms

enum { JR_SKIP = 77 }; /* th_job_rank's codes, and: this case cannot run here */

/* Two ranks of one job apart: 0 when both exit 0, or rank 1 exits skip_code (this case
 * cannot run here); else 1, after saying how they exited. */
static int run_two(th_rank_fn fn, int skip_code)
{
    int codes[2];
    th_run_apart(2, fn, NULL, 20000, codes);
    if (codes[1] == skip_code || (codes[0] == 0 && codes[1] == 0))
        return 0;
    fprintf(stderr, "rank 0 exited %d, rank 1 %d\n", codes[0], codes[1]);
    return 1;
}

/* ---- 1. a rank that lost its slot to another job joins that job's next instance ----
 *
 * A0 creates A's instance; B1 (the other job, started 10 ms later) claims slot 1 in it;
 * A1 finds slot 1 taken, contests A and waited for "its" rank 0; B0, 500 ms later, found
 * A finished and replaced it; A1 joined B0's instance: A1 and B0 summed each other's
 * tensors. Now A1 fails at once (IN_USE) and A0/B1 see the contest within the settle
 * time. (Two runs that share one job id cannot be told apart at all: an id names one
 * run, as launchers make it; not tested.) */

typedef struct two {
    const char *id;  /* both jobs' id (NULL: none) */
    int delay_ms[4]; /* A0 A1 B0 B1 */
} two_t;

static int rank_two(int hr, int total, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)total;
    (void)unused;
    const two_t *t = arg;
    sleep_ms(t->delay_ms[hr]);
    th_job_t j = { .job_id = t->id, .transport = "tcp", .timeout_ms = 4000 };
    return th_job_rank(hr / 2, hr % 2, 2, dir, &j);
}

START_TEST(rejected_rank_joins_next_job)
{
    two_t t = { .id = NULL, .delay_ms = { 0, 30, 500, 10 } };
    int codes[4];
    th_run_apart(4, rank_two, &t, 30000, codes);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(codes[i] != TH_JR_WRONG, "job %c rank %d met the other job's ranks",
                      'A' + i / 2, i % 2);
}
END_TEST

/* ---- 2. rank 0 retries init in the same process after its first attempt failed ----
 *
 * Its failed instance is neither finished, ready nor dead (its rank 0, this very
 * process, is alive): the retry fails with TUTTI_ERR_IN_USE naming itself. */

static int rank_retry(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    th_job_t j = { .job_id = "", .transport = "tcp", .timeout_ms = 4000 };
    if (rank == 1) {
        sleep_ms(1500); /* after rank 0's first attempt gave up, during its second */
        return th_job_rank(0, rank, nranks, dir, &j);
    }
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 10000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 1000;
    o.transport = "tcp";
    tutti_comm_t *comm = NULL;
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    FAIL_IF(st == 0, "the first attempt should time out (rank 1 is not there yet)");
    tutti_store_close(store); /* a new store handle for the retry, as init_env would */
    int rc = th_job_rank(0, rank, nranks, dir, &j);
    FAIL_IF(rc != TH_JR_OK, "the retry failed (%d)", rc);
    return 0;
}

TH_RUN_TEST(root_retries_after_failed_init, run_two(rank_retry, -1))

/* ---- 3. ranks on one host in different pid namespaces (containers sharing the host's
 * name and kernel: host networking) ----
 *
 * The record's pid is looked up in the reader's /proc: rank 1 finds no such process (or
 * another one) and judges its own job's live instance dead. */

static int rank_pidns(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    th_job_t j = { .job_id = "", .transport = "tcp", .timeout_ms = 3000 };
    if (rank == 0)
        return th_job_rank(0, rank, nranks, dir, &j);
    sleep_ms(100);
    if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) {
        fprintf(stderr, "rank 1: unshare: %s: skipping\n", strerror(errno));
        return JR_SKIP;
    }
    FAIL_IF(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0, "mount private");
    pid_t pid = fork();
    FAIL_IF(pid < 0, "fork");
    if (pid == 0) { /* pid 1 of the new namespace, with its own /proc */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (mount("proc", "/proc", "proc", 0, NULL) != 0)
            _exit(JR_SKIP);
        _exit(th_job_rank(0, rank, nranks, dir, &j));
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TH_RUN_TEST(rank_in_own_pid_namespace, run_two(rank_pidns, JR_SKIP))

/* ---- 4. wall clocks that differ between hosts ----
 *
 * Rank 1's host clock is 10 s ahead of rank 0's (timeout 2 s): it reads rank 0's fresh
 * record as older than timeout + 2 s, judges it dead, and never joins its own job. */

static int rank_skew(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    th_job_t j = {
        .job_id = "", .transport = "tcp", .timeout_ms = 2000, .host_id = rank ? "host-b" : "host-a"
    };
    if (rank == 1)
        clock_skew_s = 10;
    return th_job_rank(0, rank, nranks, dir, &j);
}

TH_RUN_TEST(clock_skew_between_hosts, run_two(rank_skew, -1))

/* ---- 5. a rank restarted during set-up, after its first process claimed its slot and
 * died ----
 *
 * The claim names a pid on this host that no longer exists, yet the new process never
 * gets the slot: it waits the whole timeout and fails with TUTTI_ERR_IN_USE ("already
 * used by another job"), and the others time out. */

static int rank_restart(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    th_job_t j = { .job_id = "", .transport = "tcp", .timeout_ms = 3000 };
    if (rank == 1) {
        /* the first rank 1: claims its slot, then dies */
        pid_t dead = fork();
        FAIL_IF(dead < 0, "fork");
        if (dead == 0)
            _exit(0);
        waitpid(dead, NULL, 0);
        tutti_store_t *store;
        FAIL_IF(tutti_store_open_file(&store, dir, 10000) != 0, "store");
        char base[256], key[512];
        snprintf(base, sizeof(base), "tutti/job/%s/comm0/", getenv("TUTTI_JOB_ID"));
        FAIL_IF(th_comm_key(store, base, "claim/1", key, sizeof(key), 3000) != 0,
                "no instance record");
        char rk[300];
        snprintf(rk, sizeof(rk), "%sinstance", base);
        void *rec = NULL;
        size_t rlen = 0;
        FAIL_IF(tutti_store_get(store, rk, &rec, &rlen, 1000) != 0, "record");
        const char *host = rec;              /* the record's last field: rank 0's host, this host */
        for (int f = 0; f < 14 && host; f++) /* (format 6: 14 fields before it) */
            host = strchr(host, ' ') ? strchr(host, ' ') + 1 : NULL;
        FAIL_IF(!host, "record %s", (char *)rec);
        struct stat ns;
        FAIL_IF(stat("/proc/self/ns/pid", &ns) != 0, "pid namespace");
        char claim[512]; /* as lib/core/job.c writes one: pid, start, pid namespace, nonce, host */
        int n = snprintf(claim, sizeof(claim), "claim 1 %d 12345 %llu 0123456789abcdef %s",
                         (int)dead, (unsigned long long)ns.st_ino, host);
        FAIL_IF(tutti_store_set(store, key, claim, (size_t)n + 1) != 0, "claim");
        free(rec);
        tutti_store_close(store);
    }
    return th_job_rank(0, rank, nranks, dir, &j);
}

TH_RUN_TEST(restarted_rank_rejoins, run_two(rank_restart, -1))

/* ---- 5b. a job restarted in place across hosts after it crashed, a rank first ----
 *
 * Two ranks on two hosts (host ids), set up and past an allreduce, die (SIGKILL: no
 * destroy); the launcher restarts both on the same store and job id, rank 1 (on host-b)
 * 300 ms before rank 0. Rank 1 cannot look rank 0's pid up and the record is young:
 * it took its old slot over (its holder, a dead pid of its host, was gone) in an
 * instance whose every rank had set up, and connected to the dead rank 0's address,
 * while the new rank 0 replaced the record and waited for rank 1: both failed at their
 * timeout. Now rank 1 takes that instance for a previous run's and waits for the new
 * one. */

static int rank_crash_restart(int rank, int nranks, tutti_comm_t *unused, const char *dir,
                              void *arg)
{
    (void)unused;
    (void)arg;
    th_job_t j = {
        .job_id = "", .transport = "tcp", .timeout_ms = 3000, .host_id = rank ? "host-b" : "host-a"
    };
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 10000) != 0, "store");
    fflush(NULL);
    pid_t first = fork(); /* the first run's rank: set up, one allreduce, then killed */
    FAIL_IF(first < 0, "fork");
    if (first == 0) {
        tutti_comm_opts_t o;
        tutti_comm_opts_init(&o);
        o.timeout_ms = j.timeout_ms;
        o.transport = j.transport;
        o.host_id = j.host_id;
        tutti_comm_t *comm = NULL;
        int64_t v = 1;
        if (tutti_comm_init(&comm, store, rank, nranks, &o) != 0 ||
            tutti_allreduce(comm, TUTTI_IN_PLACE, &v, 1, TUTTI_INT64, TUTTI_SUM) != 0 ||
            th_store_barrier(store, "test/crash", rank, nranks, "reduced", 10000) != 0)
            _exit(1);
        kill(getpid(), SIGKILL);
    }
    int status = 0;
    waitpid(first, &status, 0);
    FAIL_IF(!WIFSIGNALED(status), "the first run's rank did not get as far as its crash");
    FAIL_IF(th_store_barrier(store, "test/crash", rank, nranks, "dead", 10000) != 0, "barrier");
    tutti_store_close(store);
    if (rank == 0)
        sleep_ms(300);
    return th_job_rank(0, rank, nranks, dir, &j);
}

TH_RUN_TEST(restarted_across_hosts, run_two(rank_crash_restart, -1))

/* ---- 6. the contest check fails open when the store is slow ----
 *
 * tt_job_check_contested returns TUTTI_OK when reading "<nonce>/contested" fails. Two
 * id-less jobs meet (A0 with B1; A1 finds its slot taken and marks A contested), and
 * the store server stalls for 6 s during their settle wait: their contest check errs,
 * they return from init as one communicator and sum each other's tensors. */

typedef struct slow {
    char url[64];
    pid_t server;
} slow_t;

static int rank_slow(int hr, int total, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)total;
    (void)unused;
    const slow_t *s = arg;
    if (hr == 3) { /* the store stalls (a busy server, a paused VM, a slow network) */
        sleep_ms(120);
        kill(s->server, SIGSTOP);
        sleep_ms(6000);
        kill(s->server, SIGCONT);
        return 0;
    }
    static const int delay[] = { 0, 10, 30 }; /* A0, B1, A1 */
    static const int job[] = { 0, 1, 0 }, rank[] = { 0, 1, 1 };
    sleep_ms(delay[hr]);
    th_job_t j = { .job_id = NULL, .transport = "tcp", .timeout_ms = 4000, .url = s->url };
    return th_job_rank(job[hr], rank[hr], 2, dir, &j);
}

START_TEST(contest_check_fails_open)
{
    int pfd[2];
    ck_assert_int_eq(pipe(pfd), 0);
    fflush(NULL);
    pid_t server = fork();
    ck_assert_int_ge(server, 0);
    if (server == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        tutti_store_t *st;
        int port = -1;
        if (tutti_store_open_tcp(&st, "127.0.0.1", 0, 1, 5000) == 0)
            port = tutti_store_port(st);
        if (write(pfd[1], &port, sizeof(port)) != sizeof(port))
            _exit(1);
        for (;;)
            pause();
    }
    int port = -1;
    ck_assert_int_eq(read(pfd[0], &port, sizeof(port)), (int)sizeof(port));
    ck_assert_int_gt(port, 0);
    slow_t s = { .server = server };
    snprintf(s.url, sizeof(s.url), "tcp://127.0.0.1:%d", port);
    int codes[4];
    th_run_apart(4, rank_slow, &s, 30000, codes);
    kill(server, SIGCONT);
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
    close(pfd[0]);
    close(pfd[1]);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(codes[i] != TH_JR_WRONG, "harness rank %d (A0, B1, A1) met the other job", i);
}
END_TEST

/* ---- 7. destroy + init cycles with no collective in between ----
 *
 * tutti_comm_init_env (a new store handle each time, so the same prefix comm0) in a loop
 * that only creates and destroys: rank 1 finishes cycle k and starts cycle k+1 while
 * rank 0 of cycle k has not yet counted itself ready. Rank 1 reads cycle k's record,
 * finds its slot taken (by its own earlier claim), sees the instance "starting" and
 * contests it: rank 0 fails with TUTTI_ERR_IN_USE ("a second rank 1 ... ranks of two
 * jobs may have met"), then rank 1 too. */

static int rank_nocoll(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    char url[600];
    snprintf(url, sizeof(url), "file://%s", dir);
    th_set_rank_env(url, rank, nranks);
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 3000;
    o.transport = "tcp";
    for (int i = 0; i < 60; i++) {
        tutti_comm_t *comm = NULL;
        int st = tutti_comm_init_env(&comm, &o);
        FAIL_IF(st != 0, "cycle %d: init: %s", i, tutti_status_name(st));
        FAIL_IF(tutti_comm_destroy(comm) != 0, "cycle %d: destroy", i);
    }
    return 0;
}

TH_RUN_TEST(cycles_without_collectives, th_run_nocomm(2, rank_nocoll, NULL, 40000))

/* ---- 8. a settle time of a second or more is waited for ----
 *
 * An id-less job's set-up waits until its instance is job_settle_ms old. A wait of 1000
 * ms or more once went into nanosleep's nanoseconds whole, was refused, and did not
 * happen: TUTTI_JOB_SETTLE_MS=1500 waited 0 ms. */

/* A rank of a job without an id: the file store in dir, options with this timeout and
 * transport spec. 0, or -1 when the store cannot be opened. */
static int open_idless(const char *dir, int timeout_ms, const char *transport,
                       tutti_store_t **store_p, tutti_comm_opts_t *o)
{
    unsetenv("TUTTI_JOB_ID");
    if (tutti_store_open_file(store_p, dir, 10000) != 0)
        return -1;
    tutti_comm_opts_init(o);
    o->timeout_ms = timeout_ms;
    o->transport = transport;
    return 0;
}

static int rank_settle(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    tutti_store_t *store;
    tutti_comm_opts_t o;
    FAIL_IF(open_idless(dir, 10000, "tcp", &store, &o) != 0, "store");
    o.job_settle_ms = 1500;
    tutti_comm_t *comm = NULL;
    double t0 = th_now_ms();
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    double took = th_now_ms() - t0;
    FAIL_IF(st != 0, "init: %s", tutti_status_name(st));
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    FAIL_IF(took < 1400, "rank %d: set-up took %.0f ms with job_settle_ms 1500", rank, took);
    return 0;
}

TH_RUN_TEST(settle_of_seconds_is_waited, th_run_nocomm(2, rank_settle, NULL, 20000))

/* ---- 9. ranks that mean different transports ----
 *
 * One rank with TUTTI_TRANSPORT=tcp, the other with auto (shm here, tcp elsewhere):
 * each waited for the other's keys (tcp's addresses, the host ids) until the timeout,
 * and neither said why. Now the rank that differs from rank 0 fails at once with a
 * config error naming both, and leaves that reason in rank 0's starting instance:
 * rank 0 fails within a slice of its set-up wait (0.2 s), not at its 20 s timeout, naming
 * rank 1 and the knob. Specs that mean the same ("auto" and "remote=tcp") connect. */

typedef struct specs {
    const char *spec[2];
    int same;
} specs_t;

static int rank_spec(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const specs_t *t = arg;
    unsetenv("TUTTI_TRANSPORT");
    tutti_store_t *store;
    tutti_comm_opts_t o;
    FAIL_IF(open_idless(dir, 20000, t->spec[rank], &store, &o) != 0, "store");
    tutti_comm_t *comm = NULL;
    double t0 = th_now_ms();
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    double took = th_now_ms() - t0;
    if (t->same) {
        FAIL_IF(st != 0, "rank %d (%s): init: %s", rank, o.transport ? o.transport : "(unset)",
                tutti_status_name(st));
        float v = (float)rank + 1;
        FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, &v, 1, TUTTI_FP32, TUTTI_SUM) != 0 || v != 3,
                "rank %d: allreduce %g", rank, v);
        tutti_comm_destroy(comm);
    } else if (rank == 1) {
        const char *e = tutti_comm_last_error(NULL);
        FAIL_IF(st != TUTTI_ERR_CONFIG, "rank 1: init: %s, wanted TUTTI_ERR_CONFIG",
                tutti_status_name(st));
        FAIL_IF(took > 2000, "rank 1: the mismatch took %.0f ms to see", took);
        /* auto's local half is shm where it is built in ("auto:shm,tcp"), else tcp */
        FAIL_IF(!strstr(e, "\"auto:") || !strstr(e, "\"tcp,tcp\"") || !strstr(e, "TUTTI_TRANSPORT"),
                "rank 1: the error does not name both: %s", e);
    } else {
        const char *e = tutti_comm_last_error(NULL);
        FAIL_IF(st != TUTTI_ERR_CONFIG, "rank 0: init: %s, wanted TUTTI_ERR_CONFIG",
                tutti_status_name(st));
        FAIL_IF(took > 5000, "rank 0: init took %.0f ms with a timeout of 20000", took);
        FAIL_IF(!strstr(e, "rank 1 failed its set-up") || !strstr(e, "did not join") ||
                    !strstr(e, "TUTTI_TRANSPORT"),
                "rank 0: the error does not name rank 1 and why: %s", e);
    }
    tutti_store_close(store);
    return 0;
}

/* A rank whose set-up fails on its own (an unknown knob on rank 2 of 3, found before it
 * publishes anything) leaves its reason; the others, waiting for it in their own set-up,
 * fail within a slice of that wait with its status and reason, not at their 20 s timeout
 * naming a missing key or connection. tcp: ranks 0 and 1 wait for rank 2 to connect
 * (the host's setup_check); shm: in store reads of rank 2's keys (sliced waits). */
static const char *const peer_setup_knob[][3] = {
    { "tcp", "TCP_CONNECT=sometimes", "TUTTI_TRANSPORT_OPTIONS's TCP_CONNECT" },
    { "shm", "SHM_RESERVE=sometimes", "TUTTI_TRANSPORT_OPTIONS's SHM_RESERVE" },
};

static int rank_peer_setup(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const char *const *k = peer_setup_knob[*(const int *)arg];
    tutti_store_t *store;
    tutti_comm_opts_t o;
    FAIL_IF(open_idless(dir, 20000, k[0], &store, &o) != 0, "store");
    o.transport_options = rank == 2 ? k[1] : NULL;
    tutti_comm_t *comm = NULL;
    double t0 = th_now_ms();
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    double took = th_now_ms() - t0;
    const char *e = tutti_comm_last_error(NULL);
    fprintf(stderr, "rank %d: %s after %.0f ms: %s\n", rank, tutti_status_name(st), took, e);
    FAIL_IF(st != TUTTI_ERR_CONFIG, "rank %d: init: %s", rank, tutti_status_name(st));
    FAIL_IF(!strstr(e, k[2]), "rank %d: the error does not say why: %s", rank, e);
    FAIL_IF(rank != 2 && !strstr(e, "rank 2 failed its set-up"),
            "rank %d: the error does not name rank 2: %s", rank, e);
    FAIL_IF(took > 5000, "rank %d: init took %.0f ms with a timeout of 20000", rank, took);
    tutti_store_close(store);
    return 0;
}

START_TEST(peer_setup_failure_ends_the_wait)
{
    int which = _i;
    ck_assert_int_eq(th_run_nocomm(3, rank_peer_setup, &which, 60000), 0);
}
END_TEST

/* Rank 2 of 3 told the job has 4 ranks: it finds rank 0's record of 3 and fails with
 * TUTTI_ERR_MISMATCH; ranks 0 and 1, in set-up waiting for rank 2, fail with its status
 * and reason within a slice of their wait instead of at their 20 s timeout. */
static int rank_world_size(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    tutti_store_t *store;
    tutti_comm_opts_t o;
    FAIL_IF(open_idless(dir, 20000, "tcp", &store, &o) != 0, "store");
    tutti_comm_t *comm = NULL;
    double t0 = th_now_ms();
    int st = tutti_comm_init(&comm, store, rank, rank == 2 ? nranks + 1 : nranks, &o);
    double took = th_now_ms() - t0;
    const char *e = tutti_comm_last_error(NULL);
    fprintf(stderr, "rank %d: %s after %.0f ms: %s\n", rank, tutti_status_name(st), took, e);
    FAIL_IF(st != TUTTI_ERR_MISMATCH, "rank %d: init: %s, wanted TUTTI_ERR_MISMATCH", rank,
            tutti_status_name(st));
    FAIL_IF(!strstr(e, "disagree on the world size"), "rank %d: the error does not say why: %s",
            rank, e);
    FAIL_IF(rank != 2 && !strstr(e, "rank 2 failed its set-up"),
            "rank %d: the error does not name rank 2: %s", rank, e);
    FAIL_IF(took > 5000, "rank %d: init took %.0f ms with a timeout of 20000", rank, took);
    tutti_store_close(store);
    return 0;
}

TH_RUN_TEST(rank_of_another_world_size, th_run_nocomm(3, rank_world_size, NULL, 60000))

/* ---- 10. a record of another tutti version ----
 *
 * Ranks on different versions: the record's format was read as "tutti-instance 3" only;
 * a member took another as nothing yet and polled until its timeout, and rank 0
 * replaced it with a "garbled" warning, whoever's it was. Now a member meeting one
 * of a starting instance fails at once (TUTTI_ERR_CONFIG) naming its rank 0, the version
 * (record format) that wrote it and its own, and leaves that reason for the instance's
 * ranks; rank 0 does not take a live one over. A previous run's (set up, or dead) is
 * waited past and replaced, as for this version's. */

enum { OV_MEMBER_OLD, OV_MEMBER_NEWER, OV_ROOT_NEWER, OV_RERUN_READY, OV_RERUN_DEAD };

/* Put a record of format fmt (3: format 4's fields without a version; else with version
 * ver, from 5 on the chunk size and the override's hash, from 6 the secret's proof) of a 2-rank instance, created age_ms ago by pid 4242 on another host, in
 * this job's record key; with ready, count its 2 ranks ready. The key's base in base. */
static int forge_record(tutti_store_t *store, int fmt, const char *ver, long long age_ms, int ready,
                        char *base, size_t blen)
{
    snprintf(base, blen, "tutti/job/%s/comm0/", getenv("TUTTI_JOB_ID"));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    char rec[256], key[512], v[16];
    int n = snprintf(rec, sizeof(rec),
                     "tutti-instance %d%s%s 0123456789abcdef 2 4242 1 1 %lld 60000 "
                     "tcp,tcp %selsewhere/x",
                     fmt, fmt >= 4 ? " " : "", fmt >= 4 ? ver : "", now - age_ms,
                     fmt >= 6   ? "1048576 - - "
                     : fmt >= 5 ? "1048576 - "
                                : "");
    snprintf(key, sizeof(key), "%sinstance", base);
    if (tutti_store_set(store, key, rec, (size_t)n + 1) != 0)
        return -1;
    snprintf(key, sizeof(key), "%s0123456789abcdef/ready", base);
    n = snprintf(v, sizeof(v), "2");
    return ready ? tutti_store_set(store, key, v, (size_t)n + 1) : 0;
}

static int rank_other_version(int rank, int nranks, tutti_comm_t *unused, const char *dir,
                              void *arg)
{
    (void)unused;
    const int kind = *(const int *)arg;
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 10000) != 0, "store");
    char base[256], key[512];
    if (kind >= OV_RERUN_READY) {
        /* a previous run of another version, on another host: crashed while running
         * (young, every rank ready), or dead (older than its timeout + 60 s) */
        if (rank == 1)
            FAIL_IF(forge_record(store, 3, NULL, kind == OV_RERUN_DEAD ? 200000 : 0,
                                 kind == OV_RERUN_READY, base, sizeof(base)) != 0,
                    "record");
        FAIL_IF(th_store_barrier(store, "test/ov", rank, nranks, "forged", 10000) != 0, "barrier");
        tutti_store_close(store);
        if (rank == 0)
            sleep_ms(300); /* rank 1 meets the old record first */
        th_job_t j = { .job_id = "", .transport = "tcp", .timeout_ms = 5000 };
        return th_job_rank(0, rank, nranks, dir, &j);
    }
    /* one process: rank 1 (or 0) of 2 meets a live instance of another version */
    int me = kind == OV_ROOT_NEWER ? 0 : 1;
    FAIL_IF(forge_record(store, kind == OV_MEMBER_OLD ? 3 : 9, "9.9.9", 0, 0, base, sizeof(base)) !=
                0,
            "record");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 5000;
    o.transport = "tcp";
    tutti_comm_t *comm = NULL;
    double t0 = th_now_ms();
    int st = tutti_comm_init(&comm, store, me, 2, &o);
    double took = th_now_ms() - t0;
    const char *e = tutti_comm_last_error(NULL);
    fprintf(stderr, "rank %d: %s after %.0f ms: %s\n", me, tutti_status_name(st), took, e);
    FAIL_IF(st != TUTTI_ERR_CONFIG, "init: %s, wanted TUTTI_ERR_CONFIG", tutti_status_name(st));
    FAIL_IF(took > 2000, "init took %.0f ms with a timeout of 5000", took);
    char mine[64];
    snprintf(mine, sizeof(mine), "this rank runs tutti %s (record format 6)",
             tutti_version_string());
    FAIL_IF(!strstr(e, "its rank 0 is pid 4242 on host elsewhere/x") || !strstr(e, mine) ||
                !strstr(e, kind == OV_MEMBER_OLD ? "record format 3, which names no version"
                                                 : "tutti 9.9.9 (record format 9)") ||
                !strstr(e, "same tutti version"),
            "the error does not name rank 0 and both versions: %s", e);
    void *v = NULL;
    size_t len = 0;
    if (me == 1) { /* the reason, for the instance's ranks waiting in its set-up */
        snprintf(key, sizeof(key), "%s0123456789abcdef/init_failed_first", base);
        FAIL_IF(tutti_store_get(store, key, &v, &len, 0) != 0, "no reason left for the others");
        FAIL_IF(!strstr(v, "did not join") || !strstr(v, mine), "the reason left: %s", (char *)v);
    } else { /* not taken over */
        snprintf(key, sizeof(key), "%sinstance", base);
        FAIL_IF(tutti_store_get(store, key, &v, &len, 0) != 0 ||
                    strncmp(v, "tutti-instance 9 9.9.9 ", 23),
                "the record was replaced: %s", v ? (char *)v : "(none)");
    }
    free(v);
    tutti_store_close(store);
    return 0;
}

START_TEST(record_of_another_version)
{
    int kind = _i;
    ck_assert_int_eq(th_run_nocomm(kind >= OV_RERUN_READY ? 2 : 1, rank_other_version, &kind,
                                   20000),
                     0);
}
END_TEST

/* ---- 11. a rank claimed twice ----
 *
 * Two processes given rank 1 (or 0) of 3, rank 2 never coming: the second claimant
 * failed at once and marked the instance contested, but the others read that mark only
 * at the end of their set-up, which waited for rank 2: they failed at their timeout
 * naming rank 2. Now the second claimant leaves the contest as the instance's first
 * failure, and every rank fails at once with TUTTI_ERR_IN_USE and "rank R claimed twice
 * (pid A on host H, pid B on host H)", the slot's first claimant too. */

static int rank_twice(int hr, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)nranks;
    const int twice = *(const int *)arg; /* the rank claimed twice: harness ranks 1 and 2 */
    const int rank = hr == 0 ? 1 - twice : twice;
    tutti_store_t *store;
    tutti_comm_opts_t o;
    FAIL_IF(open_idless(dir, 20000, "tcp", &store, &o) != 0, "store");
    setenv("TUTTI_JOB_ID", "twice", 1); /* the settle time would see the second claimant */
    if (hr == 2)
        sleep_ms(300); /* after the others claimed */
    tutti_comm_t *comm = NULL;
    double t0 = th_now_ms();
    int st = tutti_comm_init(&comm, store, rank, 3, &o);
    double took = th_now_ms() - t0;
    const char *e = tutti_comm_last_error(NULL);
    fprintf(stderr, "harness rank %d (rank %d): %s after %.0f ms: %s\n", hr, rank,
            tutti_status_name(st), took, e);
    FAIL_IF(st != TUTTI_ERR_IN_USE, "init: %s, wanted TUTTI_ERR_IN_USE", tutti_status_name(st));
    char want[64], pid[32];
    snprintf(want, sizeof(want), "rank %d claimed twice (pid ", twice);
    snprintf(pid, sizeof(pid), "pid %d on host", (int)getpid());
    FAIL_IF(!strstr(e, want) || (hr != 0 && !strstr(e, pid)),
            "the error does not name the rank and both claimants: %s", e);
    FAIL_IF(took > 5000, "init took %.0f ms with a timeout of 20000", took);
    tutti_store_close(store);
    return 0;
}

START_TEST(rank_claimed_twice)
{
    int twice = _i;
    ck_assert_int_eq(th_run_nocomm(3, rank_twice, &twice, 60000), 0);
}
END_TEST

START_TEST(ranks_mean_other_transports)
{
    specs_t differ = { { NULL, "tcp" }, 0 };
    ck_assert_int_eq(th_run_nocomm(2, rank_spec, &differ, 20000), 0);
    specs_t same = { { "auto", "remote=tcp" }, 1 };
    ck_assert_int_eq(th_run_nocomm(2, rank_spec, &same, 20000), 0);
}
END_TEST

/* ---- 12. settings every rank must share, checked at set-up ----
 *
 * TUTTI_CHUNK_BYTES and TUTTI_ALGO decide which algorithm every rank runs and how it
 * cuts its messages: a rank whose value differed from the others' picked another
 * algorithm, and every rank failed its first collective as "ranks called mismatched
 * collectives", blaming calls that were the same. A TUTTI_ALGO that did not parse on
 * rank 2 failed rank 2 at once while the others waited out their timeout ("still missing
 * rank(s) 2"); a TUTTI_COST_MODEL that did not parse there (rank 0's model wins, but the
 * value is a mistake) failed rank 2 alone, the others' init succeeded and their first
 * collective failed with "rank 2 closed the connection". Now rank 0's record carries
 * the chunk size and a hash of the override's canonical form: the rank that differs
 * fails TUTTI_ERR_CONFIG naming the setting and both values, a rank with a value that
 * does not parse fails once it joined, and the others, waiting for it, fail within a
 * slice of that wait with its reason (timeout 20 s). Spellings that mean the same
 * connect. */
typedef struct setting_case {
    int rank;                  /* the rank that differs */
    size_t chunk[3];           /* chunk_bytes of each rank (0: the default) */
    const char *algo[3];       /* TUTTI_ALGO of each rank */
    const char *model[3];      /* TUTTI_COST_MODEL of each rank */
    const char *its_err[3];    /* what its error must say (NULL-terminated) */
    const char *others_err[3]; /* what the others' must say, with "rank R failed" */
    const char *checksum[3];   /* TUTTI_CHECKSUM of each rank */
    const char *bind[3];       /* TUTTI_BIND of each rank */
} setting_case_t;

static const setting_case_t setting_cases[] = {
    { 1,
      { 0, 8192, 0 },
      { NULL },
      { NULL },
      { "TUTTI_CHUNK_BYTES=1048576, rank 1 with 8192", NULL },
      { "TUTTI_CHUNK_BYTES=1048576, rank 1 with 8192", NULL },
      { NULL },
      { NULL } },
    { 1,
      { 0 },
      { "allreduce:ring;broadcast:chain", "allreduce:rd", "allreduce:ring;broadcast:chain" },
      { NULL },
      { "TUTTI_ALGO=\"allreduce:ring;broadcast:chain\", rank 1 with \"allreduce:rd\"", NULL },
      { "TUTTI_ALGO=\"allreduce:ring;broadcast:chain\", rank 1 with \"allreduce:rd\"", NULL },
      { NULL },
      { NULL } },
    { 2,
      { 0 },
      { NULL, NULL, "ring" },
      { NULL },
      { "TUTTI_ALGO=none, rank 2 with \"ring\"", NULL },
      { "TUTTI_ALGO=none, rank 2 with \"ring\"", NULL },
      { NULL },
      { NULL } },
    { 2,
      { 0 },
      { NULL, NULL, "allreduce:bogus" },
      { NULL },
      { "TUTTI_ALGO: unknown allreduce algorithm \"bogus\"", NULL },
      { "TUTTI_ALGO: unknown allreduce algorithm \"bogus\"", NULL },
      { NULL },
      { NULL } },
    { 2,
      { 0 },
      { NULL },
      { "table", "table", "bw=fast" },
      { "TUTTI_COST_MODEL=\"bw=fast\": cannot read", NULL },
      { "TUTTI_COST_MODEL=\"bw=fast\": cannot read", NULL },
      { NULL },
      { NULL } },
    /* rank 0's own does not parse: the others, whose override differs from the text,
     * are not refused for it but learn rank 0's reason */
    { 0,
      { 0 },
      { "allreduce:bogus", "allreduce:ring", "allreduce:ring" },
      { NULL },
      { "TUTTI_ALGO: unknown allreduce algorithm \"bogus\"", NULL },
      { "TUTTI_ALGO: unknown allreduce algorithm \"bogus\"", NULL },
      { NULL },
      { NULL } },
    /* other values this rank checks alone, refused where it joined: the others learn
     * why at once (they waited out their timeout, "still missing rank(s) 2") */
    { 2,
      { 0 },
      { NULL },
      { NULL },
      { "TUTTI_CHECKSUM=md5: expected none or crc32c", NULL },
      { "TUTTI_CHECKSUM=md5: expected none or crc32c", NULL },
      { NULL, NULL, "md5" },
      { NULL } },
    { 2,
      { 0 },
      { NULL },
      { NULL },
      { "TUTTI_BIND=always: expected auto or none", NULL },
      { "TUTTI_BIND=always: expected auto or none", NULL },
      { NULL },
      { NULL, NULL, "always" } },
    /* the same meaning, spelt three ways (64K, a later entry replacing an earlier one,
     * white space); and chunk sizes the library raises to its least, 4096 */
    { -1,
      { 1000, 4096, 0 },
      { "allreduce:ring@<64K,rd", " allreduce : ring@<65536 , rd ;",
        "allreduce:linear;allreduce:ring@<64K,rd;" },
      { NULL },
      { NULL },
      { NULL },
      { NULL },
      { NULL } },
};

static int rank_setting(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const setting_case_t *c = arg;
    tutti_store_t *store;
    tutti_comm_opts_t o;
    FAIL_IF(open_idless(dir, 20000, "tcp", &store, &o) != 0, "store");
    if (c->chunk[rank])
        o.chunk_bytes = c->chunk[rank];
    if (c->chunk[0] && rank == 2 && !c->chunk[2])
        o.chunk_bytes = 4096; /* the "same" case: the others' 1000 and 4096 */
    o.algo = c->algo[rank];
    o.cost_model = c->model[rank];
    if (c->checksum[rank])
        o.checksum = c->checksum[rank];
    if (c->bind[rank])
        o.bind = c->bind[rank];
    tutti_comm_t *comm = NULL;
    double t0 = th_now_ms();
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    double took = th_now_ms() - t0;
    const char *e = tutti_comm_last_error(NULL);
    fprintf(stderr, "rank %d: %s after %.0f ms: %s\n", rank, tutti_status_name(st), took, e);
    if (c->rank < 0) {
        FAIL_IF(st != 0, "rank %d: init: %s", rank, e);
        int32_t v[4] = { rank, rank, rank, rank };
        FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, v, 4, TUTTI_INT32, TUTTI_SUM) != 0 ||
                    v[3] != 3,
                "rank %d: allreduce: %s", rank, tutti_comm_last_error(comm));
        tutti_comm_destroy(comm);
        tutti_store_close(store);
        return 0;
    }
    FAIL_IF(st != TUTTI_ERR_CONFIG, "rank %d: init: %s, wanted TUTTI_ERR_CONFIG", rank,
            tutti_status_name(st));
    const char *const *want = rank == c->rank ? c->its_err : c->others_err;
    for (int i = 0; want[i]; i++)
        FAIL_IF(!strstr(e, want[i]), "rank %d: the error does not say \"%s\": %s", rank, want[i],
                e);
    char who[48];
    snprintf(who, sizeof(who), "rank %d failed its set-up", c->rank);
    /* a rank that reads rank 0's failure before it joins names the instance too */
    int named = strstr(e, who) || (c->rank == 0 && strstr(e, "rank 0 of job instance") &&
                                   strstr(e, "failed its set-up"));
    FAIL_IF(rank != c->rank && !named, "rank %d: the error does not name rank %d: %s", rank,
            c->rank, e);
    FAIL_IF(took > 5000, "rank %d: init took %.0f ms with a timeout of 20000", rank, took);
    tutti_store_close(store);
    return 0;
}

START_TEST(settings_checked_at_setup)
{
    ck_assert_int_eq(th_run_nocomm(3, rank_setting, (void *)&setting_cases[_i], 60000), 0);
}
END_TEST

/* ---- a /proc/<pid>/stat that cannot be read (fd limit, memory) is not a death ----
 *
 * A rank judges rank 0's record alive by rank 0's start time, read from its
 * /proc/<pid>/stat; rank 0 wrote its own, read the same way. Any failure to open that
 * file (EMFILE near the fd limit, ENOMEM) read as "no such process": a rank whose read
 * failed took a live rank 0 for dead ("... is gone, did this job's rank 0 fail or not
 * start?") and waited for another until both timed out; a rank 0 whose own read failed
 * published start 0, which every other rank took for dead. Here fopen of those files
 * fails with EMFILE in one rank: a reader now judges the record by its age (alive),
 * and a rank 0 that cannot read its own start fails its set-up at once, saying why. */

static volatile int stat_fail_others, stat_fail_own; /* set in one rank only */

FILE *fopen(const char *path, const char *mode)
{
    static FILE *(*real)(const char *, const char *);
    long pid;
    char tail[8];
    if ((stat_fail_others || stat_fail_own) && sscanf(path, "/proc/%ld/%7s", &pid, tail) == 2 &&
        !strcmp(tail, "stat")) {
        int own = pid == (long)getpid();
        if (own ? stat_fail_own : stat_fail_others) {
            errno = EMFILE;
            return NULL;
        }
    }
    if (!real)
        real = (FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen");
    return real(path, mode);
}

static int rank_stat_unreadable(int rank, int nranks, tutti_comm_t *unused, const char *dir,
                                void *arg)
{
    (void)unused;
    (void)arg;
    tutti_store_t *store;
    tutti_comm_opts_t o;
    FAIL_IF(open_idless(dir, 4000, "tcp", &store, &o) != 0, "store");
    if (rank == 1) {
        stat_fail_others = 1;
        sleep_ms(200); /* rank 0's record is there to judge */
    }
    tutti_comm_t *comm = NULL;
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    FAIL_IF(st != 0, "init: %s: %s", tutti_status_name(st), tutti_comm_last_error(NULL));
    int32_t v[2] = { rank, 1 };
    st = tutti_allreduce(comm, TUTTI_IN_PLACE, v, 2, TUTTI_INT32, TUTTI_SUM);
    FAIL_IF(st != 0 || v[0] != 1 || v[1] != 2, "allreduce: %s", tutti_comm_last_error(comm));
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

static int rank_own_stat_unreadable(int rank, int nranks, tutti_comm_t *unused, const char *dir,
                                    void *arg)
{
    (void)unused;
    (void)arg;
    tutti_store_t *store;
    tutti_comm_opts_t o;
    FAIL_IF(open_idless(dir, 4000, "tcp", &store, &o) != 0, "store");
    stat_fail_own = 1;
    tutti_comm_t *comm = NULL;
    double t0 = th_now_ms();
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    double took = th_now_ms() - t0;
    const char *e = tutti_comm_last_error(NULL);
    FAIL_IF(st != TUTTI_ERR_IO, "init: %s (%s), wanted TUTTI_ERR_IO", tutti_status_name(st),
            st ? e : "it published start time 0, which others take for a dead rank 0");
    FAIL_IF(!strstr(e, "/proc/self/stat") || !strstr(e, strerror(EMFILE)),
            "the error names neither the file nor its errno: %s", e);
    FAIL_IF(took > 2000, "init took %.0f ms to fail", took);
    tutti_store_close(store);
    return 0;
}

START_TEST(proc_stat_unreadable_is_not_death)
{
    int codes[2];
    ck_assert_int_eq(th_run_apart(2, rank_stat_unreadable, NULL, 20000, codes), 0);
    ck_assert_int_eq(th_run_apart(1, rank_own_stat_unreadable, NULL, 20000, codes), 0);
}
END_TEST

/* ---- a rank whose set-up failed after it connected names its reason to its peers ----
 *
 * Rank 0's progress thread cannot start (pthread_create: EAGAIN), at init or at a
 * split's set-up, after its connections are up: it fails its set-up, leaving its reason
 * under init_failed/0, and closes them. Rank 1's set-up has ended; its next operation
 * failed with "rank 0 closed the connection (did it exit, crash or get killed?)" only,
 * and rank 0's own error named no errno. Now both name the cause. */

void *tt_exec_worker_main(void *arg);     /* the progress thread's body (core/comm.h) */
static volatile int fail_progress_thread; /* set in one rank only */

int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg)
{
    static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    if (fail_progress_thread && fn == tt_exec_worker_main)
        return EAGAIN;
    if (!real)
        real = (int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *),
                        void *))dlsym(RTLD_NEXT, "pthread_create");
    return real(t, a, fn, arg);
}

static int rank_no_progress_thread(int rank, int nranks, tutti_comm_t *unused, const char *dir,
                                   void *arg)
{
    (void)unused;
    const int at_split = *(const int *)arg;
    tutti_store_t *store;
    tutti_comm_opts_t o;
    FAIL_IF(open_idless(dir, 10000, "tcp", &store, &o) != 0, "store");
    char want[128];
    snprintf(want, sizeof(want), "cannot start progress thread: %s", strerror(EAGAIN));
    fail_progress_thread = rank == 0 && !at_split;
    tutti_comm_t *comm = NULL, *sub = NULL, *use;
    double t0 = th_now_ms();
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    const char *e = tutti_comm_last_error(NULL);
    use = comm;
    if (st == 0 && at_split) {
        fail_progress_thread = rank == 0;
        st = tutti_comm_split(comm, 0, rank, &sub);
        e = tutti_comm_last_error(comm);
        use = sub;
    }
    if (rank == 0) {
        FAIL_IF(st != TUTTI_ERR_NOMEM, "%s: %s, wanted TUTTI_ERR_NOMEM",
                at_split ? "split" : "init", tutti_status_name(st));
        FAIL_IF(!strstr(e, want), "rank 0's own error names no errno: %s", e);
    } else {
        if (st == 0) { /* set-up ended before rank 0's failed: the first op fails */
            int32_t v = 1;
            st = tutti_allreduce(use, TUTTI_IN_PLACE, &v, 1, TUTTI_INT32, TUTTI_SUM);
            e = tutti_comm_last_error(use);
        }
        FAIL_IF(st == 0, "rank 0 failed, yet this rank's set-up and allreduce passed");
        FAIL_IF(!strstr(e, want) || !strstr(e, "rank 0"),
                "the error does not give rank 0's reason: %s", e);
    }
    double took = th_now_ms() - t0;
    FAIL_IF(took > 5000, "took %.0f ms with a timeout of 10000", took);
    if (sub)
        tutti_comm_destroy(sub);
    if (comm)
        tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

START_TEST(peer_without_progress_thread)
{
    int codes[2], at_split = _i;
    ck_assert_int_eq(th_run_apart(2, rank_no_progress_thread, &at_split, 30000, codes), 0);
}
END_TEST

/* Prefixed views are key spaces of their own (Gloo's and torch's PrefixStore): ranks 0-1
 * make a communicator on view "pair/", then all three one on "world/" (and, _i = 1, two
 * on "world/" one after the other). Counted on the base store for every view, the
 * "world/" one was comm1 on ranks 0-1 and comm0 on rank 2: every rank waited out its
 * timeout (review, session 100). */
static int rank_views(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const int twice = *(int *)arg;
    tutti_store_t *base = NULL, *pair = NULL, *world = NULL;
    FAIL_IF(tutti_store_open_file(&base, dir, 10000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 5000;
    o.job_id = "views";
    tutti_comm_t *c = NULL;
    if (rank < 2) {
        FAIL_IF(tutti_store_open_prefixed(&pair, base, "pair/") != 0, "view");
        FAIL_IF(tutti_comm_init(&c, pair, rank, 2, &o) != 0, "pair: %s",
                tutti_comm_last_error(NULL));
        tutti_comm_destroy(c);
    }
    FAIL_IF(tutti_store_open_prefixed(&world, base, "world/") != 0, "view");
    for (int k = 0; k <= twice; k++) {
        double t0 = th_now_ms();
        FAIL_IF(tutti_comm_init(&c, world, rank, nranks, &o) != 0, "world %d: %s", k,
                tutti_comm_last_error(NULL));
        int32_t v = rank + 1;
        FAIL_IF(tutti_allreduce(c, TUTTI_IN_PLACE, &v, 1, TUTTI_INT32, TUTTI_SUM) != 0 || v != 6,
                "allreduce: %s", tutti_comm_last_error(c));
        FAIL_IF(th_now_ms() - t0 > 4000, "world %d took %.0f ms", k, th_now_ms() - t0);
        tutti_comm_destroy(c);
    }
    tutti_store_close(world);
    if (pair)
        tutti_store_close(pair);
    tutti_store_close(base);
    return 0;
}

START_TEST(views_count_apart)
{
    int twice = _i;
    int codes[3];
    ck_assert_int_eq(th_run_apart(3, rank_views, &twice, 30000, codes), 0);
}
END_TEST

/* tutti_get_unique_id / tutti_comm_init_rank (NCCL's bootstrap): rank 0 makes the id
 * and hands it over through a file (as a program would through MPI_Bcast); the three
 * join, allreduce and split through it. An id with a byte changed is refused as none;
 * one whose secret was changed cannot reach the store (refused by the server, within
 * the timeout); once released and its communicator destroyed, the maker serves it no
 * more; a second release is refused. */
static int rank_uid(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const tutti_unique_id_t *given = arg;
    tutti_unique_id_t id;
    char path[512], tmp[520];
    snprintf(path, sizeof(path), "%s/uid", dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if (given) {
        id = *given; /* made by the test's own process before the fork */
    } else if (rank == 0) {
        FAIL_IF(tutti_get_unique_id(&id) != 0, "get_unique_id: %s", tutti_comm_last_error(NULL));
        FILE *f = fopen(tmp, "wb");
        FAIL_IF(!f || fwrite(&id, sizeof(id), 1, f) != 1 || fclose(f) != 0 || rename(tmp, path),
                "writing the id");
    } else {
        FILE *f = NULL;
        for (int i = 0; i < 1000 && !(f = fopen(path, "rb")); i++)
            usleep(10000);
        FAIL_IF(!f || fread(&id, sizeof(id), 1, f) != 1, "reading the id");
        fclose(f);
    }
    tutti_comm_t *comm = NULL, *half = NULL;
    tutti_comm_opts_t eo, *opts = NULL;
    if (given) {
        /* options from an environment that differs between the ranks (a job id and a
         * secret each): the id's own win over them (they did, and each rank waited for
         * a job of its own) */
        char v[64];
        snprintf(v, sizeof(v), "env-job-%d", rank);
        setenv("TUTTI_JOB_ID", v, 1);
        snprintf(v, sizeof(v), "env-secret-%d", rank);
        setenv("TUTTI_AUTH_TOKEN", v, 1);
        tutti_comm_opts_init(&eo);
        eo.timeout_ms = 10000;
        opts = &eo;
    }
    FAIL_IF(tutti_comm_init_rank(&comm, nranks, &id, rank, opts) != 0, "init_rank: %s",
            tutti_comm_last_error(NULL));
    int64_t v[3] = { rank + 1, 10 * (rank + 1), -rank };
    FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, v, 3, TUTTI_INT64, TUTTI_SUM) != 0,
            "allreduce: %s", tutti_comm_last_error(comm));
    int64_t n = nranks;
    FAIL_IF(v[0] != n * (n + 1) / 2 || v[1] != 10 * v[0] || v[2] != -(n * (n - 1) / 2),
            "allreduce: %lld %lld %lld", (long long)v[0], (long long)v[1], (long long)v[2]);
    FAIL_IF(tutti_comm_split(comm, rank % 2, 0, &half) != 0, "split: %s",
            tutti_comm_last_error(comm));
    FAIL_IF(tutti_barrier(half) != 0, "barrier on the split: %s", tutti_comm_last_error(half));
    tutti_comm_destroy(half);
    tutti_comm_destroy(comm);
    if (rank != 0 || given)
        return 0;
    /* what a bad id gets: the maker alone, as a one-rank job */
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 1500;
    tutti_unique_id_t bad = id;
    bad.internal[0] ^= 1;
    FAIL_IF(tutti_comm_init_rank(&comm, 1, &bad, 0, &o) != TUTTI_ERR_INVALID_ARG || comm ||
                !strstr(tutti_comm_last_error(NULL), "not one tutti_get_unique_id made"),
            "a changed byte: %s", tutti_comm_last_error(NULL));
    bad = id;
    char *sec = strrchr(bad.internal, ' ') - 1; /* the secret's last digit */
    *sec = *sec == '0' ? '1' : '0';
    FAIL_IF(tutti_comm_init_rank(&comm, 1, &bad, 0, &o) >= 0 || comm ||
                !strstr(tutti_comm_last_error(NULL), "cannot reach the id's store"),
            "another secret: %s", tutti_comm_last_error(NULL));
    FAIL_IF(tutti_unique_id_release(&id) != 0, "release: %s", tutti_comm_last_error(NULL));
    FAIL_IF(tutti_unique_id_release(&id) != TUTTI_ERR_INVALID_ARG ||
                !strstr(tutti_comm_last_error(NULL), "not made by this process"),
            "a second release: %s", tutti_comm_last_error(NULL));
    FAIL_IF(tutti_comm_init_rank(&comm, 1, &id, 0, &o) >= 0 || comm ||
                !strstr(tutti_comm_last_error(NULL), "cannot reach the id's store"),
            "after the release: %s", tutti_comm_last_error(NULL));
    return 0;
}

TH_RUN_TEST(unique_id_bootstrap, th_run_nocomm(3, rank_uid, NULL, 60000))

/* The id made by a process that is no rank (a launcher's): it serves the store. Its
 * ranks pass options from environments that disagree about the job id and secret. */
START_TEST(unique_id_of_a_launcher)
{
    tutti_unique_id_t id;
    ck_assert_msg(tutti_get_unique_id(&id) == 0, "%s", tutti_comm_last_error(NULL));
    int rc = th_run_nocomm(2, rank_uid, &id, 60000);
    ck_assert_int_eq(tutti_unique_id_release(&id), 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

TH_CASES_MAIN("job", 60, TH_CASE(views_count_apart, 2), TH_CASE(unique_id_bootstrap, 1),
              TH_CASE(unique_id_of_a_launcher, 1), TH_CASE(rejected_rank_joins_next_job, 1),
              TH_CASE(root_retries_after_failed_init, 1), TH_CASE(rank_in_own_pid_namespace, 1),
              TH_CASE(clock_skew_between_hosts, 1), TH_CASE(restarted_rank_rejoins, 1),
              TH_CASE(restarted_across_hosts, 1), TH_CASE(contest_check_fails_open, 1),
              TH_CASE(cycles_without_collectives, 1), TH_CASE(settle_of_seconds_is_waited, 1),
              TH_CASE(ranks_mean_other_transports, 1), TH_CASE(peer_setup_failure_ends_the_wait, 2),
              TH_CASE(rank_of_another_world_size, 1), TH_CASE(record_of_another_version, 5),
              TH_CASE(rank_claimed_twice, 2), TH_CASE(settings_checked_at_setup, 9),
              TH_CASE(proc_stat_unreadable_is_not_death, 1),
              TH_CASE(peer_without_progress_thread, 2))
