/* Multi-rank test harness: see harness.h. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define TH_DEFAULT_TIMEOUT_MS 60000
/* exit codes of a rank whose harness part failed; fn owns 1..125 */
#define TH_EXIT_SETUP 126
#define TH_EXIT_DESTROY 127

double th_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int th_rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb;
    (void)type;
    (void)ftw;
    if (remove(path) != 0 && errno != ENOENT)
        fprintf(stderr, "th: removing %s: %s\n", path, strerror(errno));
    return 0;
}

void th_rmtree(const char *dir)
{
    nftw(dir, th_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void th_sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

TCase *th_add_case(Suite *s, const char *name, const TTest *t, int loops, int timeout_s)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, timeout_s);
    tcase_add_loop_test(tc, t, 0, loops);
    suite_add_tcase(s, tc);
    return tc;
}

TCase *th_add_tests(Suite *s, const char *name, int timeout_s, const TTest *const *tests)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, timeout_s);
    for (; *tests; tests++)
        tcase_add_test(tc, *tests);
    suite_add_tcase(s, tc);
    return tc;
}

TCase *th_add_looped(Suite *s, const char *name, int timeout_s, int loops,
                     const TTest *const *tests)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, timeout_s);
    for (; *tests; tests++)
        tcase_add_loop_test(tc, *tests, 0, loops);
    suite_add_tcase(s, tc);
    return tc;
}

int th_main(Suite *s)
{
    setenv("TUTTI_SOCKET_IFNAME", "lo", 0);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

__attribute__((noreturn)) static void th_child(const th_spec_t *spec, int rank, const char *dir,
                                               pid_t parent, const char *job_id)
{
    /* A harness that dies (Check's timeout kills it) must not leave ranks behind; the
     * getppid check closes the race with a parent that died before the prctl. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        _exit(TH_EXIT_SETUP);
    setenv("TUTTI_SOCKET_IFNAME", "lo", 0);
    /* a launcher gives its ranks a job id (tests of id-less jobs unset it) */
    setenv("TUTTI_JOB_ID", job_id, 0);

    int rc;
    if (spec->flags & TH_NO_COMM) {
        rc = spec->fn(rank, spec->nranks, NULL, dir, spec->arg);
    } else {
        int timeout = spec->timeout_ms > 0 ? spec->timeout_ms : TH_DEFAULT_TIMEOUT_MS;
        tutti_store_t *store = NULL;
        tutti_comm_t *comm = NULL;
        int st = tutti_store_open_file(&store, dir, timeout);
        if (st != TUTTI_OK) {
            fprintf(stderr, "th: rank %d: opening the file store in %s: %s (%s)\n", rank, dir,
                    tutti_status_name(st), store ? tutti_store_last_error(store) : "");
            fflush(NULL);
            _exit(TH_EXIT_SETUP);
        }
        st = tutti_comm_init(&comm, store, rank, spec->nranks, spec->opts);
        if (st != TUTTI_OK) {
            fprintf(stderr, "th: rank %d: tutti_comm_init: %s: %s\n", rank, tutti_status_name(st),
                    tutti_store_last_error(store));
            fflush(NULL);
            _exit(TH_EXIT_SETUP);
        }
        rc = spec->fn(rank, spec->nranks, comm, dir, spec->arg);
        st = tutti_comm_destroy(comm);
        if (st != TUTTI_OK) {
            fprintf(stderr, "th: rank %d: tutti_comm_destroy: %s\n", rank, tutti_status_name(st));
            if (rc == 0)
                rc = TH_EXIT_DESTROY;
        }
        tutti_store_close(store);
    }
    if (rc < 0 || rc > 125) {
        fprintf(stderr, "th: rank %d: body returned %d, outside 0..125; exiting with 125\n", rank,
                rc);
        rc = 125;
    }
    fflush(NULL);
    _exit(rc);
}

/* A rank that outlived the harness's deadline: where each of its threads waits (from
 * /proc), and their stacks when gdb is there, so that a hang seen once in CI says where
 * it was. TH_NO_GDB=1 skips gdb. */
static void th_dump_hung(int rank, pid_t pid)
{
    char path[96];
    snprintf(path, sizeof(path), "/proc/%ld/task", (long)pid);
    DIR *d = opendir(path);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char f[160], comm[64] = "?", wchan[64] = "?", sys[64] = "?", stat[512] = "";
        const char *names[] = { "comm", "wchan", "syscall", "stat" };
        char *outs[] = { comm, wchan, sys, stat };
        const size_t lens[] = { sizeof(comm), sizeof(wchan), sizeof(sys), sizeof(stat) };
        for (int k = 0; k < 4; k++) {
            snprintf(f, sizeof(f), "%s/%s/%s", path, e->d_name, names[k]);
            FILE *fp = fopen(f, "r");
            if (fp) {
                if (!fgets(outs[k], (int)lens[k], fp))
                    outs[k][0] = 0;
                fclose(fp);
                outs[k][strcspn(outs[k], "\n")] = 0;
            }
        }
        /* stat: "tid (comm) S ...": the state follows the last ')' */
        const char *rp = strrchr(stat, ')');
        char state = rp && rp[1] && rp[2] ? rp[2] : '?';
        sys[strcspn(sys, " ")] = 0; /* the syscall number alone */
        fprintf(stderr, "th: rank %d pid %ld thread %s (%s): state %c, wchan %s, syscall %s\n",
                rank, (long)pid, e->d_name, comm, state, wchan, sys);
    }
    closedir(d);
    const char *no = getenv("TH_NO_GDB");
    if ((!no || strcmp(no, "1")) && access("/usr/bin/gdb", X_OK) == 0) {
        char cmd[256];
        snprintf(
            cmd, sizeof(cmd),
            "timeout -s KILL 20 /usr/bin/gdb -nx -batch -p %ld -ex 'thread apply all bt' "
            "</dev/null 2>&1 | grep -E '^(Thread |#)' | head -80 | sed 's/^/th: rank %d: /' >&2",
            (long)pid, rank);
        fflush(NULL);
        if (system(cmd) != 0)
            fprintf(stderr, "th: rank %d: gdb could not show its stacks\n", rank);
    }
}

static void th_describe_exit(int rank, int nranks, int code)
{
    if (code == TH_EXIT_SETUP)
        fprintf(stderr, "th: rank %d/%d failed to set up (store or communicator)\n", rank, nranks);
    else if (code == TH_EXIT_DESTROY)
        fprintf(stderr, "th: rank %d/%d passed but tutti_comm_destroy failed\n", rank, nranks);
    else if (code > 128)
        fprintf(stderr, "th: rank %d/%d died of signal %d (%s)\n", rank, nranks, code - 128,
                strsignal(code - 128));
    else
        fprintf(stderr, "th: rank %d/%d exited with code %d\n", rank, nranks, code);
}

int th_run_ex(const th_spec_t *spec, int *exit_codes)
{
    if (!spec || !spec->fn || spec->nranks < 1) {
        fprintf(stderr, "th: bad spec\n");
        return 1;
    }
    const int n = spec->nranks;
    const int timeout = spec->timeout_ms > 0 ? spec->timeout_ms : TH_DEFAULT_TIMEOUT_MS;

    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/tutti-th-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (spec->store_dir)
        snprintf(dir, sizeof(dir), "%s", spec->store_dir);
    else if (!mkdtemp(dir)) {
        fprintf(stderr, "th: mkdtemp %s: %s\n", dir, strerror(errno));
        return 1;
    }

    pid_t *pids = calloc((size_t)n, sizeof(*pids));
    int *codes = calloc((size_t)n, sizeof(*codes));
    if (!pids || !codes) {
        fprintf(stderr, "th: out of memory\n");
        free(pids);
        free(codes);
        if (!spec->store_dir)
            th_rmtree(dir);
        return 1;
    }
    for (int r = 0; r < n; r++)
        codes[r] = -1;

    /* unflushed output would be written once by every child */
    fflush(NULL);
    const pid_t self = getpid();
    static unsigned runs;
    char job_id[64];
    snprintf(job_id, sizeof(job_id), "th-%ld-%u-%lld", (long)self, runs++, (long long)th_now_ms());
    int started = 0, fork_failed = 0;
    /* The ranks start together, once every one is forked: a rank that talks to a server
     * thread of this process (a tcp store) while the next fork happens could leave that
     * thread holding a lock (the allocator's, under ASan) in the next child, which then
     * waits on it for ever. A child reads the gate until the parent closes it. */
    int gate[2];
    if (pipe(gate) != 0)
        gate[0] = gate[1] = -1;
    for (; started < n; started++) {
        pid_t pid = fork();
        if (pid == 0) {
            if (gate[1] >= 0) {
                char c;
                close(gate[1]);
                while (read(gate[0], &c, 1) < 0 && errno == EINTR)
                    ;
                close(gate[0]);
            }
            th_child(spec, started, dir, self, job_id);
        }
        if (pid < 0) {
            fprintf(stderr, "th: fork of rank %d: %s\n", started, strerror(errno));
            fork_failed = 1;
            break;
        }
        pids[started] = pid;
    }
    if (gate[1] >= 0) {
        close(gate[1]);
        close(gate[0]);
    }

    const double deadline = th_now_ms() + timeout;
    double last_look = th_now_ms();
    int alive = started, killing = fork_failed, timed_out = 0;
    if (killing)
        for (int r = 0; r < started; r++)
            kill(pids[r], SIGKILL);

    while (alive > 0) {
        int reaped = 0;
        for (int r = 0; r < started; r++) {
            if (!pids[r])
                continue;
            int status;
            pid_t w = waitpid(pids[r], &status, WNOHANG);
            if (w == 0 || (w < 0 && errno == EINTR))
                continue;
            reaped = 1;
            pids[r] = 0;
            alive--;
            if (w < 0) {
                fprintf(stderr, "th: waitpid rank %d: %s\n", r, strerror(errno));
                continue; /* codes[r] stays -1 */
            }
            if (timed_out)
                continue; /* killed by us: stays -1 */
            codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            if (codes[r] == 0)
                continue;
            /* the SIGKILLs we sent ourselves are summed up where they are sent */
            if (!killing || codes[r] != 128 + SIGKILL)
                th_describe_exit(r, n, codes[r]);
            if (!killing) {
                if (!(spec->flags & TH_NO_KILL_ON_FAIL)) {
                    killing = 1;
                    for (int o = 0; o < started; o++)
                        if (pids[o])
                            kill(pids[o], SIGKILL);
                    if (alive)
                        fprintf(stderr,
                                "th: killing the %d other running rank(s) after "
                                "rank %d failed\n",
                                alive, r);
                }
            }
        }
        const double now = th_now_ms();
        if (now - last_look > 5000)
            fprintf(stderr,
                    "th: this harness was not scheduled for %.0f ms: the machine stalled, "
                    "so the ranks' own timers may not have run either\n",
                    now - last_look);
        last_look = now;
        if (alive && !timed_out && now >= deadline) {
            timed_out = 1;
            fprintf(stderr, "th: timed out after %d ms; where the living ranks are:\n", timeout);
            for (int r = 0; r < started; r++)
                if (pids[r])
                    th_dump_hung(r, pids[r]);
            fprintf(stderr, "th: timed out after %d ms; killing rank(s):", timeout);
            for (int r = 0; r < started; r++)
                if (pids[r]) {
                    fprintf(stderr, " %d", r);
                    kill(pids[r], SIGKILL);
                }
            fprintf(stderr, "\n");
            last_look = th_now_ms();
        }
        if (alive && !reaped)
            th_sleep_ms(2);
    }

    int ok = !fork_failed;
    for (int r = 0; r < n; r++)
        if (codes[r] != 0)
            ok = 0;
    if (exit_codes)
        memcpy(exit_codes, codes, (size_t)n * sizeof(*codes));
    free(pids);
    free(codes);
    if (!spec->store_dir)
        th_rmtree(dir);
    return ok ? 0 : 1;
}

int th_run(int nranks, th_rank_fn fn, void *arg, int timeout_ms)
{
    th_spec_t spec = {
        .nranks = nranks,
        .fn = fn,
        .arg = arg,
        .timeout_ms = timeout_ms,
    };
    return th_run_ex(&spec, NULL);
}

int th_store_barrier(tutti_store_t *store, const char *prefix, int rank, int nranks,
                     const char *phase, int timeout_ms)
{
    char key[128], *keys[64];
    snprintf(key, sizeof(key), "%s/%s/%d", prefix, phase, rank);
    if (nranks > 64 || tutti_store_set(store, key, "1", 1) != 0)
        return -1;
    for (int i = 0; i < nranks; i++) {
        keys[i] = malloc(128);
        if (keys[i])
            snprintf(keys[i], 128, "%s/%s/%d", prefix, phase, i);
    }
    int st = -1;
    int ok = 1;
    for (int i = 0; i < nranks; i++)
        ok &= keys[i] != NULL;
    if (ok)
        st = tutti_store_wait(store, (const char *const *)keys, (size_t)nranks, timeout_ms);
    for (int i = 0; i < nranks; i++)
        free(keys[i]);
    return st;
}

int th_all_pairs(tutti_comm_t *comm, int rank, int nranks, uint32_t tag)
{
    tutti_work_t *w[64];
    int32_t send[32], recv[32];
    int nw = 0, rc = 0;
    if (nranks > 32)
        return 1;
    for (int j = 0; j < nranks && !rc; j++) {
        send[j] = rank * 100 + j;
        recv[j] = -1;
        if (j == rank)
            continue;
        if (tutti_send_async(comm, &send[j], 1, TUTTI_INT32, j, tag, &w[nw]) != 0) {
            rc = 1;
            break;
        }
        nw++;
        if (tutti_recv_async(comm, &recv[j], 1, TUTTI_INT32, j, tag, &w[nw]) != 0) {
            rc = 1;
            break;
        }
        nw++;
    }
    if (rc)
        fprintf(stderr, "rank %d: all pairs: post: %s\n", rank, tutti_comm_last_error(comm));
    for (int k = 0; k < nw; k++) {
        if (tutti_wait(w[k], -1) != 0 && !rc) {
            fprintf(stderr, "rank %d: all pairs: %s\n", rank, tutti_comm_last_error(comm));
            rc = 1;
        }
        tutti_work_free(w[k]);
    }
    for (int j = 0; j < nranks && !rc; j++)
        if (j != rank && recv[j] != j * 100 + rank) {
            fprintf(stderr, "rank %d: all pairs: from %d: %d, want %d\n", rank, j, recv[j],
                    j * 100 + rank);
            rc = 1;
        }
    return rc;
}

int th_comm_key(tutti_store_t *store, const char *base, const char *key, char *out, size_t len,
                int timeout_ms)
{
    char k[512], def[256];
    if (!base) {
        const char *id = getenv("TUTTI_JOB_ID");
        snprintf(def, sizeof(def), "tutti/%s%s%scomm0/", id ? "job/" : "", id ? id : "",
                 id ? "/" : "");
        base = def;
    }
    snprintf(k, sizeof(k), "%sinstance", base);
    void *v = NULL;
    size_t vlen = 0;
    if (tutti_store_get(store, k, &v, &vlen, timeout_ms) != 0)
        return -1;
    char nonce[64] = "";
    /* lib/core/job.c's record: "tutti-instance <format> <tutti version> <nonce> ..." */
    int ok = sscanf((const char *)v, "tutti-instance %*d %*s %63s", nonce) == 1;
    free(v);
    if (!ok)
        return -1;
    snprintf(out, len, "%s%s/%s", base, nonce, key);
    return 0;
}

int th_job_rank(int job, int rank, int nranks, const char *dir, const th_job_t *j)
{
    if (!j->job_id)
        unsetenv("TUTTI_JOB_ID");
    else if (*j->job_id)
        setenv("TUTTI_JOB_ID", j->job_id, 1);
    tutti_store_t *store;
    if ((j->url ? tutti_store_open(&store, j->url, NULL)
                : tutti_store_open_file(&store, dir, 10000)) != 0)
        return TH_JR_INIT_OTHER;
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = j->timeout_ms;
    o.transport = j->transport;
    o.host_id = j->host_id;
    tutti_comm_t *comm = NULL;
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    if (st != 0) {
        tutti_store_close(store);
        fprintf(stderr, "job %d rank %d: init: %s\n", job, rank, tutti_status_name(st));
        return st == TUTTI_ERR_IN_USE    ? TH_JR_IN_USE
               : st == TUTTI_ERR_TIMEOUT ? TH_JR_TIMEOUT
                                         : TH_JR_INIT_OTHER;
    }
    const int iters = j->iters ? j->iters : 5, count = j->count ? j->count : 1;
    int64_t expect = 0, v[16];
    for (int r = 0; r < nranks; r++)
        expect += job * 1000 + r + 1;
    int rc = TH_JR_OK;
    for (int i = 0; i < iters && rc == TH_JR_OK; i++) {
        for (int k = 0; k < count; k++)
            v[k] = job * 1000 + rank + 1;
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, v, (size_t)count, TUTTI_INT64, TUTTI_SUM);
        if (st != 0) {
            fprintf(stderr, "job %d rank %d: allreduce: %s\n", job, rank,
                    tutti_comm_last_error(comm));
            rc = TH_JR_OP_FAILED;
            break;
        }
        for (int k = 0; k < count && rc == TH_JR_OK; k++) {
            if (v[k] != expect) {
                fprintf(stderr,
                        "job %d rank %d: allreduce gave %lld, its job's sum is %lld: "
                        "ranks of two jobs met\n",
                        job, rank, (long long)v[k], (long long)expect);
                rc = TH_JR_WRONG;
            }
        }
    }
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return rc;
}

int th_run_apart(int nranks, th_rank_fn fn, void *arg, int timeout_ms, int *exit_codes)
{
    th_spec_t spec = { .nranks = nranks,
                       .fn = fn,
                       .arg = arg,
                       .timeout_ms = timeout_ms,
                       .flags = TH_NO_COMM | TH_NO_KILL_ON_FAIL };
    return th_run_ex(&spec, exit_codes);
}

int th_main_in_tmpdir(Suite *s, char *root, size_t len, const char *template, int mode)
{
    snprintf(root, len, "%s", template);
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    if (mode)
        chmod(root, (mode_t)mode);
    int failed = th_main(s);
    th_rmtree(root);
    return failed ? 1 : 0;
}

void th_add_cases(Suite *s, const th_case_t *cases, size_t n, int timeout_s)
{
    for (size_t i = 0; i < n; i++)
        th_add_case(s, cases[i].name, cases[i].test, cases[i].loops, timeout_s);
}

void th_run_each(int from, int to, th_rank_fn fn, void *arg, int timeout_ms)
{
    for (int n = from; n <= to; n++)
        ck_assert_msg(th_run(n, fn, arg, timeout_ms) == 0, "%d ranks failed", n);
}

int th_run_comm_timeout(int nranks, th_rank_fn fn, void *arg, int timeout_ms, int comm_timeout_ms,
                        int flags, int *exit_codes)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = comm_timeout_ms;
    th_spec_t spec = {
        .nranks = nranks, .fn = fn, .arg = arg, .timeout_ms = timeout_ms, .flags = flags, .opts = &o
    };
    return th_run_ex(&spec, exit_codes);
}

int th_quick(void)
{
    const char *q = getenv("TT_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

int th_max_ranks(void)
{
    const char *v = getenv("TT_TEST_MAX_RANKS");
    if (!v || !*v)
        return INT_MAX;
    char *end = NULL;
    long n = strtol(v, &end, 10);
    return !*end && n >= 1 && n < INT_MAX ? (int)n : INT_MAX;
}

int th_run_nocomm(int nranks, th_rank_fn fn, void *arg, int timeout_ms)
{
    th_spec_t spec = {
        .nranks = nranks, .fn = fn, .arg = arg, .timeout_ms = timeout_ms, .flags = TH_NO_COMM
    };
    return th_run_ex(&spec, NULL);
}

int th_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    ck_assert_msg(port > 0, "no loopback port: %s", strerror(errno));
    if (fd >= 0)
        close(fd);
    return port;
}

/* +PONG from 127.0.0.1:port within 200 ms: 1, else 0. */
static int redis_pong(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    struct timeval tv = { 0, 200000 };
    char buf[16] = "";
    int ok = 0;
    if (fd < 0)
        return 0;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && write(fd, "PING\r\n", 6) == 6 &&
        read(fd, buf, sizeof(buf) - 1) >= 5)
        ok = !strncmp(buf, "+PONG", 5) || !strncmp(buf, "-NOAUTH", 7); /* --requirepass */
    close(fd);
    return ok;
}

int th_redis_start(const char *dir, const char *const *extra, pid_t *pid_p)
{
    static const char *const paths[] = { "/usr/bin/redis-server", "/usr/local/bin/redis-server",
                                         NULL };
    const char *bin = NULL;
    for (int k = 0; paths[k] && !bin; k++)
        if (access(paths[k], X_OK) == 0)
            bin = paths[k];
    ck_assert_msg(bin, "redis-server is not installed (apt-get install redis-server; "
                       "./run.sh test installs it)");
    for (int attempt = 0; attempt < 5; attempt++) {
        int port = th_free_port();
        char ports[16], logf[PATH_MAX];
        snprintf(ports, sizeof(ports), "%d", port);
        snprintf(logf, sizeof(logf), "%s/redis-%d.log", dir, port);
        const char *argv[64] = { bin,         "--port",      ports, "--bind",
                                 "127.0.0.1", "--save",      "",    "--appendonly",
                                 "no",        "--dir",       dir,   "--logfile",
                                 logf,        "--daemonize", "no",  "--protected-mode",
                                 "no" };
        int argc = 17;
        for (int k = 0; extra && extra[k] && argc < 62; k++)
            argv[argc++] = extra[k];
        argv[argc] = NULL;
        pid_t parent = getpid();
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(127);
            execv(bin, (char *const *)argv);
            _exit(127);
        }
        for (int t = 0; t < 250; t++) {
            if (waitpid(pid, NULL, WNOHANG) == pid) {
                pid = -1; /* exited: the port was taken meanwhile, or a bad argument */
                break;
            }
            if (redis_pong(port)) {
                *pid_p = pid;
                return port;
            }
            th_sleep_ms(20);
        }
        if (pid > 0)
            th_redis_stop(pid);
    }
    ck_abort_msg("redis-server did not start in %s (see its redis-*.log there)", dir);
    return -1;
}

void th_redis_stop(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

void th_setenv_int(const char *name, int v)
{
    char s[16];
    snprintf(s, sizeof(s), "%d", v);
    setenv(name, s, 1);
}

void th_set_rank_env(const char *url, int rank, int nranks)
{
    setenv("TUTTI_STORE", url, 1);
    th_setenv_int("TUTTI_RANK", rank);
    th_setenv_int("TUTTI_WORLD_SIZE", nranks);
}

int th_main_cases(const char *name, const th_case_t *cases, size_t n, int timeout_s)
{
    Suite *s = suite_create(name);
    th_add_cases(s, cases, n, timeout_s);
    return th_main(s);
}

void th_rmtree_gone(const char *dir)
{
    th_rmtree(dir);
    ck_assert_msg(access(dir, F_OK) != 0, "%s is still there", dir);
}

int th_init_one(const tutti_comm_opts_t *opts, char *err, size_t errlen,
                void (*with)(tutti_comm_t *comm, void *arg), void *arg)
{
    char dir[] = "/tmp/tutti-test-one-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    tutti_store_t *store;
    ck_assert_int_eq(tutti_store_open_file(&store, dir, 5000), 0);
    tutti_comm_t *comm = NULL;
    int st = tutti_comm_init(&comm, store, 0, 1, opts);
    snprintf(err, errlen, "%s", st < 0 ? tutti_comm_last_error(NULL) : "");
    ck_assert_msg((st < 0) == !comm, "init returned %d with comm %p", st, (void *)comm);
    if (comm && with)
        with(comm, arg);
    if (comm)
        ck_assert_int_eq(tutti_comm_destroy(comm), 0);
    tutti_store_close(store);
    th_rmtree_gone(dir);
    return st;
}

void *th_shared_zeroed(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(p, MAP_FAILED);
    memset(p, 0, size);
    return p;
}

int th_shm_leftovers(const int *pids, int n, time_t since)
{
    int found = 0;
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        for (int r = 0; r < n; r++) {
            char pre[64], path[320];
            struct stat sb;
            snprintf(pre, sizeof(pre), "tutti-shm-%d-", pids[r]);
            snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
            if (pids[r] > 0 && !strncmp(e->d_name, pre, strlen(pre)) &&
                !(stat(path, &sb) == 0 && sb.st_ctime < since)) {
                fprintf(stderr, "left over: %s\n", path);
                found++;
            }
        }
    }
    closedir(d);
    return found;
}

typedef struct th_after {
    int ms;
    void (*fn)(void *);
    void *arg;
} th_after_t;

static void *th_after_run(void *p)
{
    th_after_t a = *(th_after_t *)p;
    free(p);
    th_sleep_ms(a.ms);
    a.fn(a.arg);
    return NULL;
}

pthread_t th_after_ms(int ms, void (*fn)(void *), void *arg)
{
    th_after_t *a = malloc(sizeof(*a));
    ck_assert_ptr_nonnull(a);
    *a = (th_after_t){ ms, fn, arg };
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, th_after_run, a), 0);
    return t;
}

static void th_kill_self(void *unused)
{
    (void)unused;
    kill(getpid(), SIGKILL);
}

void th_kill_self_after(int ms)
{
    pthread_detach(th_after_ms(ms, th_kill_self, NULL));
}

int th_check_peer_died(int rank, int victim, int st, const char *msg)
{
    fprintf(stderr, "rank %d: %s: %s\n", rank, tutti_status_name(st), msg);
    FAIL_IF(rank == victim, "the victim survived");
    FAIL_IF(st != TUTTI_ERR_PEER, "got %s, want TUTTI_ERR_PEER", tutti_status_name(st));
    char name[32];
    snprintf(name, sizeof(name), "rank %d", victim);
    FAIL_IF(!strstr(msg, name), "message does not name %s: %s", name, msg);
    return 0;
}

void th_capture_begin(th_capture_t *c)
{
    fflush(stderr);
    c->f = tmpfile();
    c->saved = dup(STDERR_FILENO);
    dup2(fileno(c->f), STDERR_FILENO);
}

char *th_capture_end(th_capture_t *c)
{
    fflush(stderr);
    dup2(c->saved, STDERR_FILENO);
    close(c->saved);
    long n = ftell(c->f);
    char *text = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
    rewind(c->f);
    if (n > 0 && fread(text, 1, (size_t)n, c->f) != (size_t)n)
        text[0] = '\0';
    fclose(c->f);
    fputs(text, stderr); /* still shown in the test log */
    return text;
}
