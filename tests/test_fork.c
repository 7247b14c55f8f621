/* A child forked after tutti_comm_init: the communicator is its parent's.
 *
 * child_refused: every rank forks a child while its communicator is busy (rank 0's
 * progress thread is inside an allreduce the others join later). The child's calls on
 * the inherited communicator (collectives, point to point, waits on the parent's works,
 * split, agree, revoke, abort, destroy) are refused with TUTTI_ERR_INVALID_ARG and a
 * message naming both pids, at once, touching nothing of the parent's: its destroy
 * returns (before, it hung in pthread_cond_destroy, and two children's destroys deleted
 * the live job's keys from the store). The parents' collectives after are checked
 * against plain C, the store keeps every key, and a split works.
 *
 * tcp_parent_death: over tcp, rank 0 forks a child that lives on, then dies; rank 1's
 * allreduce fails at once naming rank 0 (before, the child held the link sockets open
 * and rank 1 waited out its whole timeout). */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define NR 3
#define BIG (1u << 16)

/* allreduces (float sums of small integers: exact) of 7, 4096 and BIG elements and
 * broadcasts from each root in turn, every element checked; 0 or 1 (printed why) */
static int colls(tutti_comm_t *comm, int n, int seed, const char *tag)
{
    int rank = tutti_comm_rank(comm), size = tutti_comm_size(comm);
    static float buf[BIG];
    for (int it = 0; it < n; it++) {
        size_t cnt = it % 3 == 0 ? 7 : it % 3 == 1 ? 4096 : BIG;
        for (size_t i = 0; i < cnt; i++)
            buf[i] = (float)(rank + 1 + seed + it + (int)(i % 13));
        int st = tutti_allreduce(comm, TUTTI_IN_PLACE, buf, cnt, TUTTI_FP32, TUTTI_SUM);
        FAIL_IF(st != TUTTI_OK, "%s rank %d: allreduce %d: %s", tag, rank, it,
                tutti_comm_last_error(comm));
        for (size_t i = 0; i < cnt; i++) {
            float want = 0;
            for (int r = 0; r < size; r++)
                want += (float)(r + 1 + seed + it + (int)(i % 13));
            FAIL_IF(buf[i] != want, "%s rank %d: allreduce %d [%zu] = %g, want %g", tag, rank, it,
                    i, (double)buf[i], (double)want);
        }
        int64_t v = rank == it % size ? 1000 * seed + it : -1;
        st = tutti_broadcast(comm, TUTTI_IN_PLACE, &v, 1, TUTTI_INT64, it % size);
        FAIL_IF(st != TUTTI_OK || v != 1000 * seed + it, "%s rank %d: broadcast %d: %d %lld (%s)",
                tag, rank, it, st, (long long)v, tutti_comm_last_error(comm));
    }
    return 0;
}

/* the store's files (the file store: a file a key), but its locks */
static int store_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* refused as a forked child's call: INVALID_ARG, and the message names both pids */
static int refused(tutti_comm_t *comm, int st, const char *what)
{
    char want[96];
    const char *msg = tutti_comm_last_error(comm);
    snprintf(want, sizeof(want), "used in pid %d, a forked child", (int)getpid());
    if (st != TUTTI_ERR_INVALID_ARG || !strstr(msg, want) || !strstr(msg, what)) {
        fprintf(stderr, "child %d: %s: status %d, message \"%s\"\n", (int)getpid(), what, st, msg);
        return 1;
    }
    return 0;
}

/* The child's calls; its exit code: 0, or the first that was not refused. */
static int child_calls(tutti_comm_t *comm, tutti_work_t *pending, tutti_work_t *done)
{
    alarm(10); /* a hang: killed by SIGALRM, which the parent reports */
    float x[16] = { 0 };
    tutti_work_t *w = NULL;
    tutti_comm_t *sub = (tutti_comm_t *)1;
    uint32_t flag = 1;
    int d = 0;
    if (refused(comm, tutti_allreduce(comm, TUTTI_IN_PLACE, x, 16, TUTTI_FP32, TUTTI_SUM),
                "allreduce"))
        return 2;
    if (refused(comm, tutti_allreduce_async(comm, TUTTI_IN_PLACE, x, 16, TUTTI_FP32, TUTTI_SUM, &w),
                "allreduce_async") ||
        w)
        return 3;
    if (refused(comm, tutti_barrier(comm), "barrier"))
        return 4;
    if (refused(comm, tutti_send(comm, x, 1, TUTTI_FP32, (tutti_comm_rank(comm) + 1) % NR, 0),
                "send"))
        return 5;
    if (refused(comm, tutti_wait(pending, 1000), "wait") ||
        refused(comm, tutti_wait(done, -1), "wait"))
        return 6;
    if (refused(comm, tutti_test(pending, &d), "test"))
        return 7;
    if (refused(comm, tutti_comm_split(comm, 0, 0, &sub), "split") || sub)
        return 8;
    if (refused(comm, tutti_comm_agree(comm, 100, &flag, NULL, NULL), "agree"))
        return 9;
    if (refused(comm, tutti_comm_revoke(comm), "revoke") ||
        refused(comm, tutti_comm_abort(comm), "abort"))
        return 10;
    tutti_work_free(done); /* the child's copy: left */
    double t0 = th_now_ms();
    if (refused(comm, tutti_comm_destroy(comm), "destroy"))
        return 11;
    if (th_now_ms() - t0 > 1000)
        return 12;
    return 0;
}

/* A child that only destroys (as a C++ global destructor run by exit() would). */
static int child_destroys(tutti_comm_t *comm)
{
    alarm(10);
    double t0 = th_now_ms();
    if (refused(comm, tutti_comm_destroy(comm), "destroy"))
        return 11;
    return th_now_ms() - t0 > 1000 ? 12 : 0;
}

/* arg: NULL, the child makes every call (child_calls); else it only destroys */
static int rank_child_refused(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    if (colls(comm, 6, 1, "before"))
        return 1;
    float a[1024], b[1024];
    for (int i = 0; i < 1024; i++)
        a[i] = b[i] = (float)(rank + i % 7);
    tutti_work_t *done = NULL, *pending = NULL;
    FAIL_IF(tutti_allreduce_async(comm, TUTTI_IN_PLACE, a, 1024, TUTTI_FP32, TUTTI_SUM, &done) ||
                tutti_wait(done, -1),
            "rank %d: async allreduce: %s", rank, tutti_comm_last_error(comm));
    FAIL_IF(tutti_barrier(comm), "rank %d: barrier: %s", rank, tutti_comm_last_error(comm));
    int files = rank == 0 ? store_files(dir) : 0;
    /* rank 0's op waits for the others, which come 300 ms later: its progress thread is
     * inside it (and holds `executing`) when rank 0 forks */
    if (rank != 0)
        th_sleep_ms(300);
    FAIL_IF(tutti_allreduce_async(comm, TUTTI_IN_PLACE, b, 1024, TUTTI_FP32, TUTTI_SUM, &pending),
            "rank %d: second async allreduce: %s", rank, tutti_comm_last_error(comm));
    pid_t child = fork();
    FAIL_IF(child < 0, "fork: %s", strerror(errno));
    if (child == 0)
        _exit(arg ? child_destroys(comm) : child_calls(comm, pending, done));
    int s = 0, k;
    for (k = 0; k < 150 && waitpid(child, &s, WNOHANG) != child; k++)
        th_sleep_ms(100);
    if (k == 150) {
        kill(child, SIGKILL);
        waitpid(child, &s, 0);
    }
    /* (waited for first: its buffer is on this stack) */
    int pst = tutti_wait(pending, -1);
    /* a failed child is reported at the end: what it did to the parents is checked first */
    int child_bad = k == 150 || !WIFEXITED(s) || WEXITSTATUS(s) != 0;
    if (child_bad)
        fprintf(stderr,
                "rank %d: the child %s %d (exit codes: the first call child_calls saw not "
                "refused, 11/12 its destroy; signal 14: it hung)\n",
                rank,
                k == 150         ? "hung: killed"
                : WIFSIGNALED(s) ? "died of signal"
                                 : "exited",
                WIFSIGNALED(s) ? WTERMSIG(s) : WEXITSTATUS(s));
    FAIL_IF(pst != TUTTI_OK, "rank %d: pending allreduce: %s", rank, tutti_comm_last_error(comm));
    for (int i = 0; i < 1024; i++) {
        float want = 0;
        for (int r = 0; r < nranks; r++)
            want += (float)(r + i % 7);
        FAIL_IF(a[i] != want || b[i] != want, "rank %d: async [%d] = %g, %g, want %g", rank, i,
                (double)a[i], (double)b[i], (double)want);
    }
    tutti_work_free(done);
    tutti_work_free(pending);
    if (colls(comm, 30, 2, "after"))
        return 1;
    /* every child is gone: the job's keys are all there (before, the children's destroys
     * counted themselves out of the job and the last deleted its instance) */
    FAIL_IF(tutti_barrier(comm), "rank %d: barrier after: %s", rank, tutti_comm_last_error(comm));
    if (rank == 0) {
        int now = store_files(dir);
        FAIL_IF(now != files, "the store held %d keys before the children, %d after", files, now);
    }
    tutti_comm_t *sub = NULL;
    FAIL_IF(tutti_comm_split(comm, rank % 2, rank, &sub) || !sub, "rank %d: split: %s", rank,
            tutti_comm_last_error(comm));
    int bad = colls(sub, 6, 3, "split");
    tutti_comm_destroy(sub);
    FAIL_IF(child_bad, "rank %d: its child failed (above)", rank);
    return bad;
}

START_TEST(child_refused)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 5000; /* a child's stolen op fails within the child's alarm */
    th_spec_t spec = { .nranks = NR, .fn = rank_child_refused, .timeout_ms = 60000, .opts = &o };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* Every rank's child only destroys: before, it hung in pthread_cond_destroy (the conds'
 * waiters are the parent's threads), after reading the parent's sockets (agreement
 * drain), and the children counted themselves out of the job in the store. */
START_TEST(child_destroy)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 5000;
    th_spec_t spec = {
        .nranks = NR, .fn = rank_child_refused, .arg = (void *)1, .timeout_ms = 60000, .opts = &o
    };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* ---- tcp: a parent's death while its child lives ---- */

#define DEATH_TIMEOUT_MS 20000

static int rank_parent_dies(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)nranks;
    (void)dir;
    volatile int *child_pid = arg;
    FAIL_IF(strcmp(tutti_comm_transport(comm), "tcp"), "transport %s", tutti_comm_transport(comm));
    if (colls(comm, 3, 1, "before"))
        return 1;
    if (rank == 0) {
        pid_t parent = getpid();
        pid_t child = fork();
        FAIL_IF(child < 0, "fork: %s", strerror(errno));
        if (child == 0) { /* lives on until its parent is gone, and a while after */
            for (int k = 0; k < 100 && getppid() == parent; k++)
                th_sleep_ms(100);
            th_sleep_ms(8000); /* (the test kills it sooner) */
            _exit(0);
        }
        *child_pid = child;
        th_sleep_ms(200);
        raise(SIGKILL);
    }
    double t0 = th_now_ms();
    float x[1024] = { 0 };
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, x, 1024, TUTTI_FP32, TUTTI_SUM);
    double ms = th_now_ms() - t0;
    fprintf(stderr, "rank %d: allreduce after rank 0 died: %s after %.0f ms\n", rank,
            tutti_strerror(st), ms);
    FAIL_IF(*child_pid <= 0 || kill(*child_pid, 0) != 0,
            "rank 0's child (%d) is not alive: the case shows nothing", *child_pid);
    if (th_check_peer_died(rank, 0, st, tutti_comm_last_error(comm)))
        return 1;
    /* rank 0 dies 200 ms in: its end closes then, not when its child exits (8 s after)
     * or after the timeout */
    FAIL_IF(ms > 2000, "rank %d: rank 0's death took %.0f ms to see (timeout %d ms)", rank, ms,
            DEATH_TIMEOUT_MS);
    return 0;
}

START_TEST(tcp_parent_death)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.transport = "tcp";
    o.timeout_ms = DEATH_TIMEOUT_MS;
    volatile int *child_pid = th_shared_zeroed(sizeof(int));
    int codes[2];
    th_spec_t spec = { .nranks = 2,
                       .fn = rank_parent_dies,
                       .arg = (void *)child_pid,
                       .timeout_ms = 60000,
                       .flags = TH_NO_KILL_ON_FAIL,
                       .opts = &o };
    th_run_ex(&spec, codes);
    if (*child_pid > 0)
        kill(*child_pid, SIGKILL); /* (reparented: not ours to reap) */
    ck_assert_msg(codes[0] == 128 + SIGKILL, "rank 0 exited %d", codes[0]);
    ck_assert_msg(codes[1] == 0, "rank 1 exited %d", codes[1]);
}
END_TEST

TH_CASES_MAIN("fork", 90, TH_CASE(child_refused, 2), TH_CASE(child_destroy, 2),
              TH_CASE(tcp_parent_death, 1))
