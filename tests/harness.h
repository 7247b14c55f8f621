/* Multi-rank test harness: fork N ranks on this machine, each with a communicator over
 * a file store in a fresh temp dir; bound the whole run by a timeout and kill every
 * child on failure or timeout. Tests that use it stay on loopback (TUTTI_SOCKET_IFNAME=lo
 * is set by the harness unless already set). */
#ifndef TH_HARNESS_H
#define TH_HARNESS_H

#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include <check.h>

#include <tutti/tutti.h>

/* Body of one rank. comm is NULL with TH_NO_COMM (then store_dir is the file store's
 * directory, to open stores by hand). Return 0 for success, 1..125 for failures (the
 * child exits with that code); print what failed to stderr. */
typedef int (*th_rank_fn)(int rank, int nranks, tutti_comm_t *comm, const char *store_dir,
                          void *arg);

enum {
    TH_NO_COMM = 1,         /* don't create a communicator */
    TH_NO_KILL_ON_FAIL = 2, /* a failing rank does not make the harness kill the others
                               (fault tests: survivors must fail on their own) */
};

typedef struct th_spec {
    int nranks;
    th_rank_fn fn;
    void *arg;
    int timeout_ms;                /* whole run; children killed after it */
    int flags;                     /* TH_* */
    const tutti_comm_opts_t *opts; /* comm options (NULL: defaults + environment) */
    const char *store_dir;         /* the file store's directory, kept afterwards (NULL:
                                        a fresh temp dir, removed afterwards) */
} th_spec_t;

/* Run and collect: exit_codes[r] is the rank's exit code, 128+signal if it died of a
 * signal, -1 if the harness killed it at the timeout. Returns 0 when every rank exited
 * 0, else 1. exit_codes may be NULL. */
int th_run_ex(const th_spec_t *spec, int *exit_codes);

/* th_run_ex with defaults: kill everything on the first failure. */
int th_run(int nranks, th_rank_fn fn, void *arg, int timeout_ms);

/* The full store key of a communicator's key (e.g. "tcp/0", as a transport wrote it)
 * under base (e.g. "tutti/comm0/"; NULL: the first communicator's default with this
 * process's TUTTI_JOB_ID): keys live under the job instance's nonce, which rank 0
 * publishes in base + "instance". Waits up to timeout_ms for it. 0 on success. */
int th_comm_key(tutti_store_t *store, const char *base, const char *key, char *out, size_t len,
                int timeout_ms);

/* Every rank of nranks (at most 64) has reached phase: each sets prefix/phase/<rank> in
 * store, then waits up to timeout_ms for all of them. 0 on success. */
int th_store_barrier(tutti_store_t *store, const char *prefix, int rank, int nranks,
                     const char *phase, int timeout_ms);

/* Every pair at once: each rank (of at most 32) posts a send of rank * 100 + j to every
 * other rank j and a receive from it, all with tag, then waits and checks what came.
 * 0 on success; else 1, with the reason on stderr. */
int th_all_pairs(tutti_comm_t *comm, int rank, int nranks, uint32_t tag);

/* 1 in an AddressSanitizer build: freed memory sits in its quarantine, so RSS checks
 * measure the sanitizer, not the code. */
#if defined(__SANITIZE_ADDRESS__)
#define TH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TH_ASAN 1
#endif
#endif
#ifndef TH_ASAN
#define TH_ASAN 0
#endif

/* 1 in a ThreadSanitizer build: every byte a process touches costs it 4 more of shadow
 * memory (x86-64), so RSS bounds scale by TH_RSS_SCALE. */
#if defined(__SANITIZE_THREAD__)
#define TH_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TH_TSAN 1
#endif
#endif
#ifndef TH_TSAN
#define TH_TSAN 0
#endif
#define TH_RSS_SCALE (TH_TSAN ? 5 : 1)

/* Elapsed milliseconds helper for tests. */
double th_now_ms(void);

/* Remove dir and everything under it (best effort). */
void th_rmtree(const char *dir);

/* Sleep ms milliseconds (signals do not cut it short). */
void th_sleep_ms(int ms);

/* A test case of its own (so CK_RUN_CASE=name runs just it), looped loops times with
 * _i = 0..loops-1, under a timeout of timeout_s seconds; returned for tcase_set_tags. */
TCase *th_add_case(Suite *s, const char *name, const TTest *t, int loops, int timeout_s);

/* A test case named name (so CK_RUN_CASE=name runs just it) holding the tests of the
 * NULL-terminated list, under a timeout of timeout_s seconds each; returned for
 * tcase_set_tags. */
TCase *th_add_tests(Suite *s, const char *name, int timeout_s, const TTest *const *tests);

/* th_add_tests for tests each run loops times (_i = 0..loops-1); the test case, to add
 * more to. */
TCase *th_add_looped(Suite *s, const char *name, int timeout_s, int loops,
                     const TTest *const *tests);

/* A suite's main: run s (tests stay on loopback), 0 when every test passed, else 1. */
int th_main(Suite *s);

/* In a rank body (where `rank` is in scope): fail the rank with a message naming it and
 * the line. */
#define FAIL_IF(cond, ...)                                                                         \
    do {                                                                                           \
        if (cond) {                                                                                \
            fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__);                         \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* A test whose whole body is one run of ranks that must pass (return 0), e.g.
 * TH_RUN_TEST(defer, th_run(3, rank_defer, NULL, 60000)); _i is in scope, as in any test. */
#define TH_RUN_TEST(name, run)                                                                     \
    START_TEST(name)                                                                               \
    {                                                                                              \
        ck_assert_int_eq((run), 0);                                                                \
    }                                                                                              \
    END_TEST

/* A test whose whole body is th_run_each(from, to, fn, arg, timeout_ms). */
#define TH_EACH_TEST(name, from, to, fn, arg, timeout_ms)                                          \
    START_TEST(name)                                                                               \
    {                                                                                              \
        th_run_each((from), (to), (fn), (arg), (timeout_ms));                                      \
    }                                                                                              \
    END_TEST

/* ---- one rank of a job that must not meet another job's ranks ---- */

/* th_job_rank's exit codes */
enum {
    TH_JR_OK = 0,
    TH_JR_IN_USE = 10,
    TH_JR_TIMEOUT = 11,
    TH_JR_OP_FAILED = 12,
    TH_JR_INIT_OTHER = 13,
    TH_JR_WRONG = 20
};

typedef struct th_job {
    const char *job_id; /* NULL: none (unset TUTTI_JOB_ID); "": keep the harness's */
    const char *transport;
    const char *host_id; /* NULL: the real one */
    int timeout_ms;
    const char *url;  /* a store URL (NULL: the file store in dir) */
    int iters, count; /* allreduces of count int64 each (0: 5 of 1) */
} th_job_t;

/* Rank `rank` of job `job`: init on the store (TH_JR_IN_USE, TH_JR_TIMEOUT or
 * TH_JR_INIT_OTHER when that fails), allreduces of job * 1000 + rank + 1, each element
 * checked against its own job's sum (TH_JR_WRONG: ranks of two jobs met; TH_JR_OP_FAILED:
 * an allreduce failed), destroy. Prints what failed to stderr. */
int th_job_rank(int job, int rank, int nranks, const char *dir, const th_job_t *j);

/* th_run_ex of ranks on their own: TH_NO_COMM | TH_NO_KILL_ON_FAIL. */
int th_run_apart(int nranks, th_rank_fn fn, void *arg, int timeout_ms, int *exit_codes);

/* th_main with a fresh directory: root (len bytes) gets the mkdtemp of template, chmod
 * to mode when mode is not 0, removed with everything under it afterwards. */
int th_main_in_tmpdir(Suite *s, char *root, size_t len, const char *template, int mode);

/* One th_add_case: the test named as in the source, looped loops times. */
typedef struct th_case {
    const char *name;
    const TTest *test;
    int loops;
} th_case_t;
#define TH_CASE(t, loops)                                                                          \
    {                                                                                              \
#t, t, loops                                                                               \
    }

/* th_add_case for each of the n cases, under a timeout of timeout_s seconds each. */
void th_add_cases(Suite *s, const th_case_t *cases, size_t n, int timeout_s);

/* th_main of a suite named name holding the n cases (th_add_cases). */
int th_main_cases(const char *name, const th_case_t *cases, size_t n, int timeout_s);

/* A suite's whole main: the cases listed (TH_CASE ...), each under timeout_s seconds. */
#define TH_CASES_MAIN(name, timeout_s, ...)                                                        \
    int main(void)                                                                                 \
    {                                                                                              \
        const th_case_t cases_[] = { __VA_ARGS__ };                                                \
        return th_main_cases(name, cases_, sizeof(cases_) / sizeof(cases_[0]), timeout_s);         \
    }

/* th_run with from, from + 1, ..., to ranks: each run must pass (a check failure names
 * the rank count). */
void th_run_each(int from, int to, th_rank_fn fn, void *arg, int timeout_ms);

/* th_run_ex of nranks ranks with flags (TH_*) whose communicators time out after
 * comm_timeout_ms (other options: defaults + environment); exit_codes may be NULL. */
int th_run_comm_timeout(int nranks, th_rank_fn fn, void *arg, int timeout_ms, int comm_timeout_ms,
                        int flags, int *exit_codes);

/* 1 when TT_TEST_QUICK is set to something other than "0" (sanitizer builds shrink
 * their larger cases). */
int th_quick(void);

/* TT_TEST_MAX_RANKS when set to a count of 1 or more, else INT_MAX: the matrices leave out
 * their larger rank counts (the soft-RoCE guest, where 5 ranks share 2 emulated CPUs). */
int th_max_ranks(void);

/* th_run_ex of nranks ranks with TH_NO_COMM (they make their own communicators). */
int th_run_nocomm(int nranks, th_rank_fn fn, void *arg, int timeout_ms);

/* A loopback TCP port that nobody listens on (bound once, then closed). */
int th_free_port(void);

/* A redis-server of the test's own on 127.0.0.1 (dir: its working directory, which must
 * exist; extra: more "--name value" arguments, NULL-terminated, or NULL), killed when the
 * test process dies. Fails the test, saying so, when redis-server is not installed or
 * does not answer PING within 5 s. Returns its port; *pid_p its pid. */
int th_redis_start(const char *dir, const char *const *extra, pid_t *pid_p);
/* Stop a th_redis_start server (SIGKILL) and reap it. */
void th_redis_stop(pid_t pid);

/* setenv(name, v in decimal). */
void th_setenv_int(const char *name, int v);

/* A launcher's environment for tutti_comm_init_env: TUTTI_STORE=url, TUTTI_RANK=rank,
 * TUTTI_WORLD_SIZE=nranks. */
void th_set_rank_env(const char *url, int rank, int nranks);

/* th_rmtree, then a check that dir is gone. */
void th_rmtree_gone(const char *dir);

/* A communicator of one rank made with opts over a file store in a fresh temp directory
 * (gone afterwards, checked): with(comm, arg) if the init succeeded (with may be NULL),
 * then destroyed. Returns the init's status; err gets why it failed
 * (tutti_comm_last_error(NULL)), "" if it did not. */
int th_init_one(const tutti_comm_opts_t *opts, char *err, size_t errlen,
                void (*with)(tutti_comm_t *comm, void *arg), void *arg);

/* size zeroed bytes shared with the ranks forked after (MAP_SHARED); checked. */
void *th_shared_zeroed(size_t size);

/* Entries of /dev/shm named after one of the processes pids[n] (those > 0), as the shm
 * transport names its segments ("tutti-shm-<pid>-..."), created at `since` or later
 * (older ones were left by an earlier process with the same pid): how many, each named
 * on stderr. */
int th_shm_leftovers(const int *pids, int n, time_t since);

/* SIGKILL this process ms milliseconds from now (from a thread of its own): a rank that
 * dies in the middle of whatever it is doing then. */
void th_kill_self_after(int ms);

/* fn(arg) from a thread of its own, ms milliseconds from now; the thread, to join. */
pthread_t th_after_ms(int ms, void (*fn)(void *), void *arg);

/* In rank, after victim died under it: st (printed, with msg) must be TUTTI_ERR_PEER and
 * msg must name "rank <victim>"; the victim itself must not get here. 0 when so, else 1
 * (printed why). */
int th_check_peer_died(int rank, int victim, int st, const char *msg);

/* stderr (the log) into a file from th_capture_begin until th_capture_end, which returns
 * what was written (malloc'd) and shows it again on the test's own stderr. */
typedef struct th_capture {
    int saved;
    FILE *f;
} th_capture_t;
void th_capture_begin(th_capture_t *c);
char *th_capture_end(th_capture_t *c);

#endif /* TH_HARNESS_H */
