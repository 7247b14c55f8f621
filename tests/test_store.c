/* Store tests: the file store and the TCP store (embedded server on loopback) through the
 * public API, plus raw-socket abuse of the server, killed writers and a full disk for the
 * file store. Every multi-process test bounds its waits and kills its children on
 * failure. */
#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tutti/store.h>

#include "harness.h"

#include "store_checks.h"
#include "store/store_impl.h"

enum { K_FILE = 0, K_TCP = 1, K_REDIS = 2 };
static const char *kind_name[] = { "file", "tcp", "redis" };

static char g_root[64]; /* temp dir of the whole run, removed by main */

#define now_ms th_now_ms
#define sleep_ms th_sleep_ms

/* in children: fail with a code and a line on stderr */
#define CHILD_OK(call, code)                                                                       \
    do {                                                                                           \
        int st_ = (call);                                                                          \
        if (st_ != 0) {                                                                            \
            fprintf(stderr, "child %d: %s -> %s\n", (int)getpid(), #call, tutti_status_name(st_)); \
            _exit(code);                                                                           \
        }                                                                                          \
    } while (0)

typedef struct ctx {
    int kind;
    char dir[256];
    int port;
    pid_t redis; /* K_REDIS: the test's redis-server */
    char url[64];
    tutti_store_t *s;
} ctx_t;

/* redis://127.0.0.1:port/db with timeout_ms */
static int redis_open(tutti_store_t **s_p, int port, int db, int timeout_ms)
{
    char url[64];
    tutti_store_opts_t o;
    tutti_store_opts_init(&o);
    o.timeout_ms = timeout_ms;
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/%d", port, db);
    return tutti_store_open(s_p, url, &o);
}

static void ctx_open(ctx_t *c, int kind, int timeout_ms)
{
    memset(c, 0, sizeof(*c));
    c->kind = kind;
    if (kind == K_FILE) {
        snprintf(c->dir, sizeof(c->dir), "%s/s%d-XXXXXX", g_root, (int)getpid());
        ck_assert_ptr_nonnull(mkdtemp(c->dir));
        OK(NULL, tutti_store_open_file(&c->s, c->dir, timeout_ms));
        c->port = -1;
    } else if (kind == K_REDIS) {
        snprintf(c->dir, sizeof(c->dir), "%s/r%d-XXXXXX", g_root, (int)getpid());
        ck_assert_ptr_nonnull(mkdtemp(c->dir));
        c->port = th_redis_start(c->dir, NULL, &c->redis);
        OK(NULL, redis_open(&c->s, c->port, 0, timeout_ms));
        snprintf(c->url, sizeof(c->url), "redis://127.0.0.1:%d/0", c->port);
        ck_assert_str_eq(tutti_store_url(c->s), c->url);
    } else {
        OK(NULL, tutti_store_open_tcp(&c->s, "127.0.0.1", 0, 1, timeout_ms));
        c->port = tutti_store_port(c->s);
        ck_assert_int_gt(c->port, 0);
    }
}

/* Another handle on the same store (for other processes and threads). */
static int ctx_client(const ctx_t *c, tutti_store_t **s_p, int timeout_ms)
{
    if (c->kind == K_FILE)
        return tutti_store_open_file(s_p, c->dir, timeout_ms);
    if (c->kind == K_REDIS)
        return redis_open(s_p, c->port, 0, timeout_ms);
    return tutti_store_open_tcp(s_p, "127.0.0.1", c->port, 0, timeout_ms);
}

/* Forks a child with its own client of c's store in *s_p (the child exits 2 when it
 * cannot open one): 0 in the child, the child's pid in the parent. */
static pid_t fork_client(const ctx_t *c, tutti_store_t **s_p, int timeout_ms)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        CHILD_OK(ctx_client(c, s_p, timeout_ms), 2);
    return pid;
}

static void ctx_close(ctx_t *c)
{
    tutti_store_close(c->s);
    c->s = NULL;
    if (c->kind == K_REDIS)
        th_redis_stop(c->redis);
    c->redis = 0;
}

enum {
    REAP_KEEP = 1,  /* a child that fails is no reason to kill the others */
    REAP_QUIET = 2, /* failures are expected: say nothing */
};

/* Wait for n children until timeout_ms; on a failure (unless REAP_KEEP) or the timeout
 * kill the rest. Returns 0 when all exited 0; codes (may be NULL) gets exit codes (-sig
 * when killed by a signal, -1000 when killed here). */
static int reap_children_ex(pid_t *pids, int n, int timeout_ms, int *codes, int flags)
{
    double end = now_ms() + timeout_ms;
    int left = n, failed = 0;
    int done[64] = { 0 };
    ck_assert_int_le(n, 64);
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            if (done[i])
                continue;
            int status;
            pid_t r = waitpid(pids[i], &status, WNOHANG);
            if (r != pids[i])
                continue;
            done[i] = 1;
            left--;
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
            if (codes)
                codes[i] = code;
            if (code != 0 && !(flags & REAP_QUIET))
                fprintf(stderr, "child %d (#%d) failed: %s %d\n", (int)pids[i], i,
                        code < 0 ? "signal" : "exit", code < 0 ? -code : code);
            failed |= code != 0;
        }
        if (left == 0)
            break;
        int timed_out = now_ms() > end;
        if ((failed && !(flags & REAP_KEEP)) || timed_out) {
            if (timed_out)
                fprintf(stderr, "children still running after %d ms: killing them\n", timeout_ms);
            for (int i = 0; i < n; i++) {
                if (done[i])
                    continue;
                kill(pids[i], SIGKILL);
                waitpid(pids[i], NULL, 0);
                if (codes)
                    codes[i] = -1000;
            }
            return 1;
        }
        sleep_ms(2);
    }
    return failed;
}

static int reap_children(pid_t *pids, int n, int timeout_ms, int *codes)
{
    return reap_children_ex(pids, n, timeout_ms, codes, 0);
}

static int count_tmp_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return -1;
    struct dirent *e;
    while ((e = readdir(d)))
        n += !strncmp(e->d_name, ".tmp.", 5);
    closedir(d);
    return n;
}

/* ---- every store: file, tcp and redis ---- */

START_TEST(test_set_get)
{
    ctx_t c;
    ctx_open(&c, _i, 5000);
    void *v;
    size_t len;
    OK(c.s, tutti_store_set(c.s, "a", "hello", 5));
    OK(c.s, tutti_store_get(c.s, "a", &v, &len, -1));
    ck_assert_uint_eq(len, 5);
    ck_assert_str_eq(v, "hello"); /* NUL after the value */
    free(v);
    OK(c.s, tutti_store_set(c.s, "a", "world!!", 7));
    OK(c.s, tutti_store_get(c.s, "a", &v, &len, 100));
    ck_assert_uint_eq(len, 7);
    ck_assert_str_eq(v, "world!!");
    free(v);
    OK(c.s, tutti_store_set(c.s, "empty", NULL, 0));
    OK(c.s, tutti_store_get(c.s, "empty", &v, NULL, 100));
    ck_assert_str_eq(v, "");
    free(v);
    /* a second handle sees the same keys */
    tutti_store_t *s2;
    OK(NULL, ctx_client(&c, &s2, 2000));
    OK(s2, tutti_store_get(s2, "a", &v, &len, 100));
    ck_assert_str_eq(v, "world!!");
    free(v);
    tutti_store_close(s2);
    ck_assert_str_eq(tutti_store_last_error(c.s), "");
    ctx_close(&c);
}
END_TEST

START_TEST(test_get_timeout)
{
    ctx_t c;
    ctx_open(&c, _i, 300);
    ck_assert_int_eq(tutti_store_timeout(c.s), 300);
    void *v = (void *)0x1;
    size_t len = 77;
    double t0 = now_ms();
    EXPECT(c.s, tutti_store_get(c.s, "missing-key", &v, &len, -1), TUTTI_ERR_TIMEOUT);
    double el = now_ms() - t0;
    ck_assert_msg(el >= 300 && el <= 1300, "%s get timed out after %.0f ms, not ~300",
                  kind_name[_i], el);
    ck_assert_ptr_eq(v, (void *)0x1); /* out-parameters untouched on failure */
    ck_assert_uint_eq(len, 77);
    const char *msg = tutti_store_last_error(c.s);
    ck_assert_msg(strstr(msg, "missing-key") && strstr(msg, tutti_store_url(c.s)),
                  "message lacks key or url: %s", msg);

    /* an explicit timeout wins over the store's */
    t0 = now_ms();
    EXPECT(c.s, tutti_store_get(c.s, "missing-key", &v, &len, 100), TUTTI_ERR_TIMEOUT);
    el = now_ms() - t0;
    ck_assert_msg(el >= 100 && el <= 1100, "get(100 ms) took %.0f ms", el);

    /* wait names a missing key */
    OK(c.s, tutti_store_set(c.s, "here", "1", 1));
    const char *keys[] = { "here", "not-here-either" };
    t0 = now_ms();
    EXPECT(c.s, tutti_store_wait(c.s, keys, 2, 200), TUTTI_ERR_TIMEOUT);
    el = now_ms() - t0;
    ck_assert_msg(el >= 200 && el <= 1200, "wait(200 ms) took %.0f ms", el);
    msg = tutti_store_last_error(c.s);
    ck_assert_msg(strstr(msg, "not-here-either"), "wait message lacks the key: %s", msg);
    /* ... and so does multi_get (it named the first key, which is set: session 100) */
    void *mv[2];
    EXPECT(c.s, tutti_store_multi_get(c.s, keys, 2, mv, NULL, 100), TUTTI_ERR_TIMEOUT);
    msg = tutti_store_last_error(c.s);
    ck_assert_msg(strstr(msg, "not-here-either") && !strstr(msg, "'here'"),
                  "multi_get message names the wrong key: %s", msg);
    /* among many keys, the one missing, found soon after the deadline */
    enum { NW = 300, MISSING = 137 };
    char names[NW][16];
    const char *many[NW];
    for (int k = 0; k < NW; k++) {
        snprintf(names[k], sizeof(names[k]), "w%03d", k);
        many[k] = names[k];
        if (k != MISSING)
            OK(c.s, tutti_store_set(c.s, names[k], "1", 1));
    }
    t0 = now_ms();
    EXPECT(c.s, tutti_store_wait(c.s, many, NW, 200), TUTTI_ERR_TIMEOUT);
    el = now_ms() - t0;
    ck_assert_msg(el >= 200 && el <= 1200, "wait(200 ms) of %d keys took %.0f ms", NW, el);
    msg = tutti_store_last_error(c.s);
    ck_assert_msg(strstr(msg, "'w137'"), "wait message lacks the missing key: %s", msg);

    /* the store still works after a timeout (tcp: a new connection) */
    OK(c.s, tutti_store_get(c.s, "here", &v, &len, 100));
    ck_assert_str_eq(v, "1");
    free(v);
    /* a timeout of 0: what is there comes back, what is not times out at once */
    OK(c.s, tutti_store_get(c.s, "here", &v, &len, 0));
    ck_assert_str_eq(v, "1");
    free(v);
    OK(c.s, tutti_store_wait(c.s, many, MISSING, 0));
    t0 = now_ms();
    EXPECT(c.s, tutti_store_wait(c.s, many, NW, 0), TUTTI_ERR_TIMEOUT);
    EXPECT(c.s, tutti_store_get(c.s, "missing-key", &v, &len, 0), TUTTI_ERR_TIMEOUT);
    el = now_ms() - t0;
    ck_assert_msg(el <= 1000, "wait(0) and get(0) took %.0f ms", el);
    ctx_close(&c);
}
END_TEST

START_TEST(test_add_basic)
{
    ctx_t c;
    ctx_open(&c, _i, 2000);
    int64_t r = 0;
    OK(c.s, tutti_store_add(c.s, "n", 5, &r));
    ck_assert_int_eq(r, 5);
    OK(c.s, tutti_store_add(c.s, "n", -7, &r));
    ck_assert_int_eq(r, -2);
    OK(c.s, tutti_store_add(c.s, "n", 7, NULL));
    void *v;
    size_t len;
    OK(c.s, tutti_store_get(c.s, "n", &v, &len, 100));
    ck_assert_str_eq(v, "5"); /* counters are decimal text, as in PyTorch's TCPStore */
    ck_assert_uint_eq(len, 1);
    free(v);
    OK(c.s, tutti_store_set(c.s, "n2", "40", 2));
    OK(c.s, tutti_store_add(c.s, "n2", 2, &r));
    ck_assert_int_eq(r, 42);
    OK(c.s, tutti_store_add(c.s, "n2", 0, &r));
    ck_assert_int_eq(r, 42);

    OK(c.s, tutti_store_set(c.s, "text", "abc", 3));
    r = 99;
    EXPECT(c.s, tutti_store_add(c.s, "text", 1, &r), TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(r, 99);
    ck_assert_ptr_nonnull(strstr(tutti_store_last_error(c.s), "text"));
    OK(c.s, tutti_store_add(c.s, "big", INT64_MAX, &r));
    EXPECT(c.s, tutti_store_add(c.s, "big", 1, &r), TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(r, INT64_MAX);
    /* counters in the canonical form only, on every store alike (Redis's rule) */
    static const char *const bad[] = { "+12", "007", "-0", " 5", "5 ", "-", "" };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        OK(c.s, tutti_store_set(c.s, "odd", bad[k], strlen(bad[k])));
        EXPECT(c.s, tutti_store_add(c.s, "odd", 1, &r), TUTTI_ERR_INVALID_ARG);
    }
    static const char *const good[] = { "0", "-12", "9223372036854775806" };
    static const int64_t after[] = { 1, -11, INT64_MAX };
    for (size_t k = 0; k < sizeof(good) / sizeof(good[0]); k++) {
        OK(c.s, tutti_store_set(c.s, "ok", good[k], strlen(good[k])));
        OK(c.s, tutti_store_add(c.s, "ok", 1, &r));
        ck_assert_int_eq(r, after[k]);
    }
    ctx_close(&c);
}
END_TEST

START_TEST(test_add_many_procs)
{
    enum { NCHILD = 8, NADD = 500 };
    ctx_t c;
    ctx_open(&c, _i, 10000);
    pid_t pids[NCHILD];
    double t0 = now_ms();
    for (int i = 0; i < NCHILD; i++) {
        tutti_store_t *s;
        pids[i] = fork_client(&c, &s, 10000);
        if (pids[i] == 0) {
            int64_t last = 0;
            for (int k = 0; k < NADD; k++) {
                int64_t r;
                CHILD_OK(tutti_store_add(s, "counter", 1, &r), 3);
                if (r <= last || r > NCHILD * NADD)
                    _exit(4); /* each add sees a value above its previous one */
                last = r;
            }
            tutti_store_close(s);
            _exit(0);
        }
    }
    ck_assert_int_eq(reap_children(pids, NCHILD, 20000, NULL), 0);
    void *v;
    OK(c.s, tutti_store_get(c.s, "counter", &v, NULL, 100));
    ck_assert_str_eq(v, "4000");
    free(v);
    fprintf(stderr, "%s store: %d adds from %d processes in %.0f ms\n", kind_name[_i],
            NCHILD * NADD, NCHILD, now_ms() - t0);
    ctx_close(&c);
}
END_TEST

START_TEST(test_compare_set)
{
    ctx_t c;
    ctx_open(&c, _i, 2000);
    void *cur;
    size_t curlen;
    int exists;
    const char *k[] = { "cas" };

    /* missing key, non-empty expected: nothing set, the value after is empty */
    OK(c.s, tutti_store_compare_set(c.s, "cas", "x", 1, "first", 5, &cur, &curlen));
    ck_assert_uint_eq(curlen, 0);
    free(cur);
    OK(c.s, tutti_store_check(c.s, k, 1, &exists));
    ck_assert_int_eq(exists, 0);

    /* each step: expected, desired, and the value after it (which comes back) */
    static const struct {
        const char *why, *expected, *desired, *after;
    } steps[] = {
        { "missing key, empty expected: set", NULL, "first", "first" },
        { "existing key, empty expected: not equal", "", "other", "first" },
        { "mismatch", "firsT", "second", "first" },
        { "a prefix of the value is not equal either", "firs", "second", "first" },
        { "match", "first", "second", "second" },
    };
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        const char *e = steps[i].expected, *d = steps[i].desired;
        OK(c.s,
           tutti_store_compare_set(c.s, "cas", e, e ? strlen(e) : 0, d, strlen(d), &cur, &curlen));
        ck_assert_msg(curlen == strlen(steps[i].after) && strcmp(cur, steps[i].after) == 0,
                      "%s: %zu bytes \"%s\", want \"%s\"", steps[i].why, curlen, (char *)cur,
                      steps[i].after);
        free(cur);
    }
    void *v;
    OK(c.s, tutti_store_get(c.s, "cas", &v, NULL, 100));
    ck_assert_str_eq(v, "second");
    free(v);

    /* binary values and NULL out-parameters */
    const char bin1[] = { 0, 1, 0, 2 }, bin2[] = { 0, 0, 0 };
    OK(c.s, tutti_store_set(c.s, "cbin", bin1, sizeof(bin1)));
    OK(c.s,
       tutti_store_compare_set(c.s, "cbin", bin1, sizeof(bin1), bin2, sizeof(bin2), NULL, NULL));
    size_t len;
    OK(c.s, tutti_store_get(c.s, "cbin", &v, &len, 100));
    ck_assert_uint_eq(len, 3);
    ck_assert_mem_eq(v, bin2, 3);
    free(v);

    /* set to empty, then an empty expected matches the empty value */
    OK(c.s, tutti_store_compare_set(c.s, "cbin", bin2, 3, "", 0, NULL, NULL));
    OK(c.s, tutti_store_compare_set(c.s, "cbin", "", 0, "z", 1, &cur, &curlen));
    ck_assert_str_eq(cur, "z");
    free(cur);
    ctx_close(&c);
}
END_TEST

START_TEST(test_wait_other_process)
{
    ctx_t c;
    ctx_open(&c, _i, 5000);
    tutti_store_t *s;
    pid_t pid = fork_client(&c, &s, 5000);
    if (pid == 0) {
        sleep_ms(150);
        CHILD_OK(tutti_store_set(s, "w1", "one", 3), 3);
        sleep_ms(50);
        CHILD_OK(tutti_store_set(s, "w3", "three", 5), 3);
        sleep_ms(50);
        CHILD_OK(tutti_store_set(s, "w2", "two", 3), 3);
        tutti_store_close(s);
        _exit(0);
    }
    const char *keys[] = { "w1", "w2", "w3" };
    double t0 = now_ms();
    int st = tutti_store_wait(c.s, keys, 3, 5000);
    double el = now_ms() - t0;
    int exists = 0;
    if (st == 0)
        st = tutti_store_check(c.s, keys, 3, &exists);
    int rc = reap_children(&pid, 1, 5000, NULL);
    ck_assert_msg(st == 0, "wait: %s", tutti_store_last_error(c.s));
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(exists, 1);
    ck_assert_msg(el >= 200 && el < 3000, "wait returned after %.0f ms", el);

    /* multi_get of keys set later by another process */
    pid = fork_client(&c, &s, 5000);
    if (pid == 0) {
        sleep_ms(100);
        CHILD_OK(tutti_store_set(s, "m2", "bb", 2), 3);
        CHILD_OK(tutti_store_set(s, "m1", "a", 1), 3);
        tutti_store_close(s);
        _exit(0);
    }
    const char *mk[] = { "m1", "m2", "w2" };
    void *vals[3];
    size_t lens[3];
    st = tutti_store_multi_get(c.s, mk, 3, vals, lens, 5000);
    rc = reap_children(&pid, 1, 5000, NULL);
    ck_assert_msg(st == 0, "multi_get: %s", tutti_store_last_error(c.s));
    ck_assert_int_eq(rc, 0);
    ck_assert_str_eq(vals[0], "a");
    ck_assert_str_eq(vals[1], "bb");
    ck_assert_str_eq(vals[2], "two");
    ck_assert_uint_eq(lens[1], 2);
    for (int i = 0; i < 3; i++)
        free(vals[i]);
    ctx_close(&c);
}
END_TEST

START_TEST(test_check_delete)
{
    ctx_t c;
    ctx_open(&c, _i, 2000);
    const char *ka[] = { "a" }, *kab[] = { "a", "b" };
    int exists = -1, deleted = -1;
    OK(c.s, tutti_store_check(c.s, ka, 1, &exists));
    ck_assert_int_eq(exists, 0);
    OK(c.s, tutti_store_set(c.s, "a", "1", 1));
    OK(c.s, tutti_store_check(c.s, ka, 1, &exists));
    ck_assert_int_eq(exists, 1);
    OK(c.s, tutti_store_check(c.s, kab, 2, &exists));
    ck_assert_int_eq(exists, 0);
    OK(c.s, tutti_store_check(c.s, kab, 0, &exists));
    ck_assert_int_eq(exists, 1); /* no keys: all of them exist */
    OK(c.s, tutti_store_delete(c.s, "a", &deleted));
    ck_assert_int_eq(deleted, 1);
    OK(c.s, tutti_store_delete(c.s, "a", &deleted));
    ck_assert_int_eq(deleted, 0);
    OK(c.s, tutti_store_delete(c.s, "never", NULL));
    OK(c.s, tutti_store_check(c.s, ka, 1, &exists));
    ck_assert_int_eq(exists, 0);
    void *v;
    EXPECT(c.s, tutti_store_get(c.s, "a", &v, NULL, 50), TUTTI_ERR_TIMEOUT);
    /* a deleted counter starts again from 0 */
    int64_t r;
    OK(c.s, tutti_store_add(c.s, "a", 3, &r));
    ck_assert_int_eq(r, 3);
    ctx_close(&c);
}
END_TEST

/* How many of keys (n) start with prefix: the reference tutti_store_count must match. */
static size_t count_ref(const char *const *keys, size_t n, const char *prefix)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += keys[i] && !strncmp(keys[i], prefix, strlen(prefix));
    return c;
}

START_TEST(test_count)
{
    ctx_t c;
    ctx_open(&c, _i, 2000);
    tutti_store_t *v, *vx;
    OK(c.s, tutti_store_open_prefixed(&v, c.s, "cnt/"));
    OK(v, tutti_store_open_prefixed(&vx, v, "x/"));
    /* long keys (the file store splits their names into directories of 200 escaped
     * bytes), two sharing their first 300 bytes; keys needing escapes */
    static char long1[400], long2[400];
    memset(long1, 'L', 350);
    long1[0] = 'x', long1[1] = '/';
    long1[350] = '\0';
    memcpy(long2, long1, sizeof(long2));
    long2[340] = 'M';
    const char *keys[] = { "a", "b", "x/1", "x/2", "x/dir/3", "n", long1, long2, "sp ace/%2F/.." };
    size_t nk = sizeof(keys) / sizeof(keys[0]);
    size_t got = 99;
    OK(v, tutti_store_count(v, "", &got));
    ck_assert_uint_eq(got, 0);
    for (size_t i = 0; i < nk; i++) {
        if (!strcmp(keys[i], "n")) {
            int64_t r;
            OK(v, tutti_store_add(v, "n", 1, &r)); /* a counter is a key too */
        } else {
            OK(v, tutti_store_set(v, keys[i], "v", 1));
        }
    }
    char p300[310];
    snprintf(p300, sizeof(p300), "%.300s", long1);
    char p345[350];
    snprintf(p345, sizeof(p345), "%.345s", long1);
    const char *prefixes[] = { "",    "x/", "x/1", "x/d",       "a", "nope",
                               "x/L", p300, p345,  "sp ace/%2", NULL };
    for (int i = 0; prefixes[i]; i++) {
        OK(v, tutti_store_count(v, prefixes[i], &got));
        ck_assert_msg(got == count_ref(keys, nk, prefixes[i]),
                      "store %d: prefix \"%.40s\" (%zu bytes): %zu keys, want %zu", c.kind,
                      prefixes[i], strlen(prefixes[i]), got, count_ref(keys, nk, prefixes[i]));
    }
    /* a view counts its own keys; the base store counts them under the view's prefix */
    OK(vx, tutti_store_count(vx, NULL, &got));
    ck_assert_uint_eq(got, count_ref(keys, nk, "x/"));
    OK(c.s, tutti_store_count(c.s, "cnt/x/", &got));
    ck_assert_uint_eq(got, count_ref(keys, nk, "x/"));
    /* deleted keys leave the count */
    int deleted;
    OK(v, tutti_store_delete(v, "x/2", &deleted));
    OK(v, tutti_store_delete(v, long2, &deleted));
    keys[3] = keys[7] = NULL;
    OK(v, tutti_store_count(v, "", &got));
    ck_assert_uint_eq(got, count_ref(keys, nk, ""));
    OK(v, tutti_store_count(v, p300, &got));
    ck_assert_uint_eq(got, count_ref(keys, nk, p300));
    EXPECT(v, tutti_store_count(v, "", NULL), TUTTI_ERR_INVALID_ARG);
    tutti_store_close(vx);
    tutti_store_close(v);
    ctx_close(&c);
}
END_TEST

START_TEST(test_multi_get)
{
    ctx_t c;
    ctx_open(&c, _i, 2000);
    OK(c.s, tutti_store_set(c.s, "x", "xx", 2));
    OK(c.s, tutti_store_set(c.s, "y", "", 0));
    OK(c.s, tutti_store_set(c.s, "z", "zzz", 3));
    const char *keys[] = { "z", "x", "y", "x" };
    void *vals[4];
    size_t lens[4];
    OK(c.s, tutti_store_multi_get(c.s, keys, 4, vals, lens, 100));
    ck_assert_str_eq(vals[0], "zzz");
    ck_assert_str_eq(vals[1], "xx");
    ck_assert_str_eq(vals[2], "");
    ck_assert_str_eq(vals[3], "xx");
    ck_assert_uint_eq(lens[0], 3);
    ck_assert_uint_eq(lens[2], 0);
    for (int i = 0; i < 4; i++)
        free(vals[i]);
    /* one missing: nothing returned */
    const char *keys2[] = { "x", "nope", "z" };
    void *vals2[3] = { (void *)1, (void *)1, (void *)1 };
    EXPECT(c.s, tutti_store_multi_get(c.s, keys2, 3, vals2, NULL, 100), TUTTI_ERR_TIMEOUT);
    ck_assert_ptr_eq(vals2[0], (void *)1);
    ck_assert_ptr_eq(vals2[2], (void *)1);
    ck_assert_ptr_nonnull(strstr(tutti_store_last_error(c.s), "nope"));
    ctx_close(&c);
}
END_TEST

START_TEST(test_many_keys)
{
    /* 3000 keys in one check, wait and multi_get: more iovecs than one sendmsg takes
     * (IOV_MAX 1024; the tcp client failed at 512 keys with "Message too long") */
    enum { N = 3000 };
    ctx_t c;
    ctx_open(&c, _i, 5000);
    static char names[N + 1][24], vals[N][24];
    const char *keys[N + 1];
    for (int i = 0; i <= N; i++) {
        snprintf(names[i], sizeof(names[i]), "many/%d", i);
        keys[i] = names[i];
    }
    int exists = -1;
    OK(c.s, tutti_store_check(c.s, keys, N, &exists));
    ck_assert_int_eq(exists, 0);
    for (int i = 0; i < N; i++) {
        int n = snprintf(vals[i], sizeof(vals[i]), "value %d", i * 7);
        OK(c.s, tutti_store_set(c.s, keys[i], vals[i], (size_t)n));
    }
    OK(c.s, tutti_store_check(c.s, keys, N, &exists));
    ck_assert_int_eq(exists, 1);
    OK(c.s, tutti_store_wait(c.s, keys, N, 2000));
    /* the last one (never set) missing: check says so, wait times out naming it */
    OK(c.s, tutti_store_check(c.s, keys, N + 1, &exists));
    ck_assert_int_eq(exists, 0);
    EXPECT(c.s, tutti_store_wait(c.s, keys, N + 1, 100), TUTTI_ERR_TIMEOUT);
    ck_assert_ptr_nonnull(strstr(tutti_store_last_error(c.s), names[N]));
    void **got = calloc(N, sizeof(*got));
    size_t *lens = calloc(N, sizeof(*lens));
    ck_assert(got && lens);
    OK(c.s, tutti_store_multi_get(c.s, keys, N, got, lens, 2000));
    for (int i = 0; i < N; i++) {
        ck_assert_uint_eq(lens[i], strlen(vals[i]));
        ck_assert_str_eq(got[i], vals[i]);
        free(got[i]);
        void *v;
        size_t len;
        OK(c.s, tutti_store_get(c.s, keys[i], &v, &len, 100));
        ck_assert_uint_eq(len, strlen(vals[i]));
        ck_assert_str_eq(v, vals[i]);
        free(v);
    }
    free(got);
    free(lens);
    ctx_close(&c);
}
END_TEST

START_TEST(test_prefix)
{
    ctx_t c;
    ctx_open(&c, _i, 2000);
    tutti_store_t *a, *b, *ax;
    OK(c.s, tutti_store_open_prefixed(&a, c.s, "a/"));
    OK(c.s, tutti_store_open_prefixed(&b, c.s, "b/"));
    OK(a, tutti_store_open_prefixed(&ax, a, "x/"));
    ck_assert_str_eq(tutti_store_url(a), tutti_store_url(c.s));
    ck_assert_int_eq(tutti_store_port(a), tutti_store_port(c.s));
    OK(a, tutti_store_set(a, "k", "in a", 4));
    OK(b, tutti_store_set(b, "k", "in b", 4));
    OK(ax, tutti_store_set(ax, "k", "in ax", 5));
    void *v;
    OK(a, tutti_store_get(a, "k", &v, NULL, 100));
    ck_assert_str_eq(v, "in a");
    free(v);
    OK(b, tutti_store_get(b, "k", &v, NULL, 100));
    ck_assert_str_eq(v, "in b");
    free(v);
    OK(c.s, tutti_store_get(c.s, "a/x/k", &v, NULL, 100));
    ck_assert_str_eq(v, "in ax");
    free(v);
    OK(c.s, tutti_store_get(c.s, "b/k", &v, NULL, 100));
    ck_assert_str_eq(v, "in b");
    free(v);
    const char *kk[] = { "k" };
    int exists, deleted;
    EXPECT(c.s, tutti_store_get(c.s, "k", &v, NULL, 50), TUTTI_ERR_TIMEOUT);
    OK(b, tutti_store_delete(b, "k", &deleted));
    ck_assert_int_eq(deleted, 1);
    OK(b, tutti_store_check(b, kk, 1, &exists));
    ck_assert_int_eq(exists, 0);
    OK(a, tutti_store_check(a, kk, 1, &exists));
    ck_assert_int_eq(exists, 1);
    int64_t r;
    OK(ax, tutti_store_add(ax, "n", 2, &r));
    OK(a, tutti_store_add(a, "x/n", 3, &r));
    ck_assert_int_eq(r, 5);
    OK(a, tutti_store_wait(a, kk, 1, 100));
    /* failures are recorded on the handle that failed, with the full key */
    EXPECT(b, tutti_store_get(b, "gone", &v, NULL, 50), TUTTI_ERR_TIMEOUT);
    ck_assert_ptr_nonnull(strstr(tutti_store_last_error(b), "b/gone"));
    ck_assert_str_eq(tutti_store_last_error(a), "");
    /* timeouts: a view starts with its parent's, then has its own */
    tutti_store_set_timeout(a, 123);
    tutti_store_t *ay;
    OK(a, tutti_store_open_prefixed(&ay, a, "y/"));
    ck_assert_int_eq(tutti_store_timeout(ay), 123);
    ck_assert_int_eq(tutti_store_timeout(c.s), 2000);
    /* communicator ids count per prefix (a view is a key space of its own, as Gloo's
     * PrefixStore): the base's, a's and ax's apart; two views of one prefix together */
    ck_assert_uint_eq(tt_store_next_comm_id(c.s), 0);
    ck_assert_uint_eq(tt_store_next_comm_id(a), 0);
    ck_assert_uint_eq(tt_store_next_comm_id(ax), 0);
    ck_assert_uint_eq(tt_store_next_comm_id(c.s), 1);
    ck_assert_uint_eq(tt_store_next_comm_id(a), 1);
    tutti_store_t *a2;
    OK(c.s, tutti_store_open_prefixed(&a2, c.s, "a/"));
    ck_assert_uint_eq(tt_store_next_comm_id(a2), 2);
    tutti_store_close(a2);
    /* a prefix that leaves no room for keys */
    char longp[TUTTI_STORE_MAX_KEY + 2];
    memset(longp, 'p', sizeof(longp) - 1);
    longp[sizeof(longp) - 1] = '\0';
    tutti_store_t *bad = (tutti_store_t *)0x1;
    EXPECT(c.s, tutti_store_open_prefixed(&bad, c.s, longp), TUTTI_ERR_INVALID_ARG);
    ck_assert_ptr_eq(bad, (void *)0x1);
    longp[TUTTI_STORE_MAX_KEY - 1] = '\0'; /* with "a/y/": room for one byte */
    OK(c.s, tutti_store_open_prefixed(&bad, ay, longp + 4));
    EXPECT(bad, tutti_store_set(bad, "kk", "1", 1), TUTTI_ERR_INVALID_ARG);
    OK(bad, tutti_store_set(bad, "k", "1", 1));
    tutti_store_close(bad);
    tutti_store_close(ay);
    tutti_store_close(ax);
    tutti_store_close(b);
    tutti_store_close(a);
    ctx_close(&c);
}
END_TEST

START_TEST(test_binary_and_keys)
{
    ctx_t c;
    ctx_open(&c, _i, 2000);
    unsigned char bin[256];
    for (int i = 0; i < 256; i++)
        bin[i] = (unsigned char)i;
    /* keys that must not collide or escape the directory */
    char longk[TUTTI_STORE_MAX_KEY + 1];
    for (int i = 0; i < TUTTI_STORE_MAX_KEY; i++)
        longk[i] = (char)(1 + i % 250);
    longk[TUTTI_STORE_MAX_KEY] = '\0';
    const char *keys[] = {
        "bin",        "A",        "%41",        "a/b",          "a%2Fb", "..", "../../etc/passwd",
        ".tmp.1.2.x", ".lock.00", "with space", "\x01\xff\x7f", "",      longk
    };
    size_t n = sizeof(keys) / sizeof(keys[0]);
    for (size_t i = 0; i < n; i++) {
        unsigned char val[260];
        memcpy(val, bin, 256);
        memcpy(val + 256, &i, 4);
        OK(c.s, tutti_store_set(c.s, keys[i], val, sizeof(val)));
    }
    for (size_t i = 0; i < n; i++) {
        void *v;
        size_t len;
        OK(c.s, tutti_store_get(c.s, keys[i], &v, &len, 100));
        ck_assert_uint_eq(len, 260);
        ck_assert_mem_eq(v, bin, 256);
        ck_assert_mem_eq((char *)v + 256, &i, 4);
        ck_assert_int_eq(((char *)v)[260], 0);
        free(v);
    }
    if (_i == K_FILE) {
        /* every key stayed inside the directory, as a key file or a key directory */
        DIR *d = opendir(c.dir);
        struct dirent *e;
        while ((e = readdir(d)))
            ck_assert_msg(e->d_name[0] == 'k' || e->d_name[0] == 'd' ||
                              !strncmp(e->d_name, ".lock.", 6) || !strcmp(e->d_name, ".") ||
                              !strcmp(e->d_name, ".."),
                          "unexpected file %s", e->d_name);
        closedir(d);
    }
    char toolong[TUTTI_STORE_MAX_KEY + 2];
    memset(toolong, 'k', sizeof(toolong) - 1);
    toolong[sizeof(toolong) - 1] = '\0';
    EXPECT(c.s, tutti_store_set(c.s, toolong, "1", 1), TUTTI_ERR_INVALID_ARG);
    int exists;
    const char *kl[] = { longk };
    OK(c.s, tutti_store_check(c.s, kl, 1, &exists));
    ck_assert_int_eq(exists, 1);
    int deleted;
    OK(c.s, tutti_store_delete(c.s, longk, &deleted));
    ck_assert_int_eq(deleted, 1);
    ctx_close(&c);
}
END_TEST

START_TEST(test_large_values)
{
    ctx_t c;
    ctx_open(&c, _i, 10000);
    size_t sz = (3u << 20) + 12345;
    unsigned char *big = malloc(sz);
    ck_assert_ptr_nonnull(big);
    uint32_t x = 12345;
    for (size_t i = 0; i < sz; i++) {
        x = x * 1103515245u + 12345u;
        big[i] = (unsigned char)(x >> 16);
    }
    OK(c.s, tutti_store_set(c.s, "big", big, sz));
    void *v;
    size_t len;
    OK(c.s, tutti_store_get(c.s, "big", &v, &len, 1000));
    ck_assert_uint_eq(len, sz);
    ck_assert_int_eq(memcmp(v, big, sz), 0);
    free(v);
    /* compare_set with large values on both sides */
    void *cur;
    big[0] ^= 1;
    OK(c.s, tutti_store_compare_set(c.s, "big", NULL, 0, "x", 1, &cur, &len));
    ck_assert_uint_eq(len, sz);
    free(cur);
    big[0] ^= 1;
    unsigned char *big2 = malloc(sz);
    ck_assert_ptr_nonnull(big2);
    memset(big2, 0xab, sz);
    OK(c.s, tutti_store_compare_set(c.s, "big", big, sz, big2, sz, &cur, &len));
    ck_assert_uint_eq(len, sz);
    ck_assert_int_eq(memcmp(cur, big2, sz), 0);
    free(cur);
    /* over the limit: refused before anything is read from the buffer */
    EXPECT(c.s, tutti_store_set(c.s, "huge", big, (size_t)TUTTI_STORE_MAX_VALUE + 1),
           TUTTI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tutti_store_last_error(c.s), "huge"));
    free(big2);
    free(big);
    ctx_close(&c);
}
END_TEST

typedef struct thr_arg {
    const ctx_t *c;
    tutti_store_t *s;
    int st;
    double ms;
} thr_arg_t;

static void *thr_get(void *p)
{
    thr_arg_t *a = p;
    void *v = NULL;
    double t0 = now_ms();
    a->st = tutti_store_get(a->s, "late", &v, NULL, 5000);
    a->ms = now_ms() - t0;
    if (a->st == 0 && strcmp(v, "now"))
        a->st = TUTTI_ERR_INTERNAL;
    free(v);
    return NULL;
}

static void *thr_add(void *p)
{
    thr_arg_t *a = p;
    for (int i = 0; i < 200 && a->st == 0; i++)
        a->st = tutti_store_add(a->s, "tcount", 1, NULL);
    return NULL;
}

START_TEST(test_threads)
{
    /* one handle used by several threads: a blocked get must not hold up a set */
    ctx_t c;
    ctx_open(&c, _i, 5000);
    thr_arg_t g = { &c, c.s, -1, 0 };
    pthread_t tg, ta[4];
    thr_arg_t aa[4];
    ck_assert_int_eq(pthread_create(&tg, NULL, thr_get, &g), 0);
    for (int i = 0; i < 4; i++) {
        aa[i] = (thr_arg_t){ &c, c.s, 0, 0 };
        ck_assert_int_eq(pthread_create(&ta[i], NULL, thr_add, &aa[i]), 0);
    }
    sleep_ms(100);
    OK(c.s, tutti_store_set(c.s, "late", "now", 3));
    pthread_join(tg, NULL);
    for (int i = 0; i < 4; i++) {
        pthread_join(ta[i], NULL);
        ck_assert_msg(aa[i].st == 0, "add thread: %s", tutti_status_name(aa[i].st));
    }
    ck_assert_msg(g.st == 0, "get thread: %s", tutti_status_name(g.st));
    ck_assert_msg(g.ms < 2000, "get took %.0f ms", g.ms);
    int64_t r;
    OK(c.s, tutti_store_add(c.s, "tcount", 0, &r));
    ck_assert_int_eq(r, 800);
    ctx_close(&c);
}
END_TEST

/* ---- arguments and URLs ---- */

START_TEST(test_args_and_urls)
{
    tutti_store_t *s = (tutti_store_t *)0x1;
    const char *bad[] = { "",
                          "http://x:1",
                          "tcp://host",
                          "tcp://host:",
                          "tcp://:5",
                          "tcp://host:99999",
                          "tcp://host:12a",
                          "tcp://::1:5",
                          "tcp://[::1]5",
                          "tcp://[::1:5",
                          "file://relative/dir",
                          "file://",
                          "tcp://h:1/x",
                          "tcp://h:0" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int st = tutti_store_open(&s, bad[i], NULL);
        ck_assert_msg(st == TUTTI_ERR_INVALID_ARG, "'%s' -> %s", bad[i], tutti_status_name(st));
        ck_assert_ptr_eq(s, (void *)0x1);
        ck_assert_msg(tutti_store_last_error(NULL)[0], "no message for '%s'", bad[i]);
    }
    ck_assert_ptr_nonnull(strstr(tutti_store_last_error(NULL), "tcp://h:0"));
    /* a malformed URL is named in the message, its password never */
    const char *secret[] = { "http://bob:hunter22@x:1", "tcp://bob:hunter22@x:1",
                             "bob:hunter22@x:1", " redis-ish://hunter22@x" };
    for (size_t i = 0; i < sizeof(secret) / sizeof(secret[0]); i++) {
        EXPECT(NULL, tutti_store_open(&s, secret[i], NULL), TUTTI_ERR_INVALID_ARG);
        const char *m = tutti_store_last_error(NULL);
        ck_assert_msg(strstr(m, "***@x") && !strstr(m, "hunter22"), "'%s': %s", secret[i], m);
    }
    EXPECT(NULL, tutti_store_open(NULL, "file:///tmp/x", NULL), TUTTI_ERR_INVALID_ARG);
    EXPECT(NULL, tutti_store_open(&s, NULL, NULL), TUTTI_ERR_INVALID_ARG);
    EXPECT(NULL, tutti_store_open_file(&s, "", 100), TUTTI_ERR_INVALID_ARG);
    EXPECT(NULL, tutti_store_open_tcp(&s, NULL, 1, 0, 100), TUTTI_ERR_INVALID_ARG);
    EXPECT(NULL, tutti_store_open_tcp(&s, "127.0.0.1", 70000, 0, 100), TUTTI_ERR_INVALID_ARG);
    tutti_store_opts_t o = { 0 };
    EXPECT(NULL, tutti_store_open(&s, "file:///tmp/x", &o), TUTTI_ERR_INVALID_ARG);
    EXPECT(NULL, tutti_store_opts_init(NULL), TUTTI_ERR_INVALID_ARG);
    ck_assert_ptr_eq(s, (void *)0x1);

    /* defaults and the environment */
    unsetenv("TUTTI_STORE_TIMEOUT_MS");
    OK(NULL, tutti_store_opts_init(&o));
    ck_assert_uint_eq(o.size, sizeof(o));
    ck_assert_int_eq(o.timeout_ms, 30000);
    ck_assert_int_eq(o.is_server, 0);
    setenv("TUTTI_STORE_TIMEOUT_MS", "1234", 1);
    OK(NULL, tutti_store_opts_init(&o));
    ck_assert_int_eq(o.timeout_ms, 1234);

    /* file URL: the directory is created, the URL is absolute */
    char dir[300], url[320];
    snprintf(dir, sizeof(dir), "%s/url%d/sub/dir", g_root, (int)getpid());
    snprintf(url, sizeof(url), "file://%s", dir);
    OK(NULL, tutti_store_open(&s, url, &o));
    ck_assert_str_eq(tutti_store_url(s), url);
    ck_assert_int_eq(tutti_store_port(s), -1);
    ck_assert_int_eq(tutti_store_timeout(s), 1234);
    OK(s, tutti_store_set(s, "k", "v", 1));

    /* the API refuses bad arguments on a good handle, with a message */
    void *v;
    int x;
    EXPECT(s, tutti_store_set(s, NULL, "v", 1), TUTTI_ERR_INVALID_ARG);
    EXPECT(s, tutti_store_set(s, "k", NULL, 1), TUTTI_ERR_INVALID_ARG);
    EXPECT(s, tutti_store_get(s, "k", NULL, NULL, 10), TUTTI_ERR_INVALID_ARG);
    EXPECT(s, tutti_store_check(s, NULL, 1, &x), TUTTI_ERR_INVALID_ARG);
    EXPECT(s, tutti_store_check(s, (const char *const[]){ "k" }, 1, NULL), TUTTI_ERR_INVALID_ARG);
    EXPECT(s, tutti_store_wait(s, (const char *const[]){ "k", NULL }, 2, 10),
           TUTTI_ERR_INVALID_ARG);
    EXPECT(s, tutti_store_compare_set(s, "k", NULL, 3, "x", 1, NULL, NULL), TUTTI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tutti_store_last_error(s), "expected"));
    EXPECT(NULL, tutti_store_set(NULL, "k", "v", 1), TUTTI_ERR_INVALID_ARG);
    EXPECT(NULL, tutti_store_get(NULL, "k", &v, NULL, 1), TUTTI_ERR_INVALID_ARG);
    OK(s, tutti_store_wait(s, NULL, 0, 10));
    tutti_store_close(s);
    tutti_store_close(NULL);
    ck_assert_str_eq(tutti_store_url(NULL), "");
    ck_assert_int_eq(tutti_store_port(NULL), -1);
}
END_TEST

/* ---- tcp ---- */

START_TEST(test_tcp_url_and_port)
{
    ctx_t c;
    ctx_open(&c, K_TCP, 2000);
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", c.port);
    ck_assert_str_eq(tutti_store_url(c.s), url);
    tutti_store_opts_t o;
    OK(NULL, tutti_store_opts_init(&o));
    o.timeout_ms = 2000;
    tutti_store_t *s2;
    OK(NULL, tutti_store_open(&s2, url, &o));
    ck_assert_int_eq(tutti_store_port(s2), c.port);
    OK(s2, tutti_store_set(s2, "via-url", "1", 1));
    void *v;
    OK(c.s, tutti_store_get(c.s, "via-url", &v, NULL, 100));
    ck_assert_str_eq(v, "1");
    free(v);
    /* a second server on a port in use fails with a message */
    tutti_store_t *s3 = (tutti_store_t *)0x1;
    int st = tutti_store_open_tcp(&s3, "127.0.0.1", c.port, 1, 500);
    ck_assert_int_lt(st, 0);
    ck_assert_ptr_eq(s3, (void *)0x1);
    ck_assert_msg(strstr(tutti_store_last_error(NULL), "in use"), "%s",
                  tutti_store_last_error(NULL));
    tutti_store_close(s2);
    ctx_close(&c);
}
END_TEST

START_TEST(test_tcp_ipv6)
{
    tutti_store_t *s;
    int st = tutti_store_open_tcp(&s, "::1", 0, 1, 2000);
    if (st < 0) {
        fprintf(stderr, "test_tcp_ipv6: skipped, no ::1 here (%s)\n", tutti_store_last_error(NULL));
        return;
    }
    int port = tutti_store_port(s);
    char url[64];
    snprintf(url, sizeof(url), "tcp://[::1]:%d", port);
    ck_assert_str_eq(tutti_store_url(s), url);
    tutti_store_t *c2;
    OK(NULL, tutti_store_open(&c2, url, NULL));
    OK(c2, tutti_store_set(c2, "v6", "six", 3));
    void *v;
    OK(s, tutti_store_get(s, "v6", &v, NULL, 100));
    ck_assert_str_eq(v, "six");
    free(v);
    EXPECT(c2, tutti_store_get(c2, "none", &v, NULL, 50), TUTTI_ERR_TIMEOUT);
    ck_assert_ptr_nonnull(strstr(tutti_store_last_error(c2), "[::1]"));
    tutti_store_close(c2);
    tutti_store_close(s);
}
END_TEST

static void be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void raw_send(int fd, const void *buf, size_t len)
{
    ck_assert_int_eq(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* Protocol 2 hello without a secret; the reply is read and checked (status 0). */
static void raw_hello(int fd)
{
    unsigned char f[5 + 4 + 11 + 4 + 4 + 4];
    be32(f, sizeof(f) - 4);
    f[4] = TT_STORE_CMD_HELLO;
    be32(f + 5, 11);
    memcpy(f + 9, TT_STORE_MAGIC, 11);
    be32(f + 20, 4);
    be32(f + 24, TT_STORE_PROTOCOL);
    be32(f + 28, 0);
    raw_send(fd, f, sizeof(f));
    unsigned char head[5], body[1024];
    ck_assert_int_eq(recv(fd, head, 5, MSG_WAITALL), 5);
    uint32_t n = get_be32(head) - 1;
    ck_assert_uint_le(n, sizeof(body));
    ck_assert_int_eq(head[4], 0);
    ck_assert_int_eq(recv(fd, body, n, MSG_WAITALL), (ssize_t)n);
}

static void check_still_serving(tutti_store_t *s, int port, int round)
{
    char val[32];
    int n = snprintf(val, sizeof(val), "round %d", round);
    OK(s, tutti_store_set(s, "alive", val, (size_t)n));
    void *v;
    OK(s, tutti_store_get(s, "alive", &v, NULL, 1000));
    ck_assert_str_eq(v, val);
    free(v);
    tutti_store_t *fresh;
    OK(NULL, tutti_store_open_tcp(&fresh, "127.0.0.1", port, 0, 2000));
    int64_t r;
    OK(fresh, tutti_store_add(fresh, "alive-n", 1, &r));
    ck_assert_int_eq(r, round + 1);
    tutti_store_close(fresh);
}

START_TEST(test_tcp_bad_clients)
{
    ctx_t c;
    ctx_open(&c, K_TCP, 3000);
    tutti_store_t *good;
    OK(NULL, tutti_store_open_tcp(&good, "127.0.0.1", c.port, 0, 3000));
    OK(good, tutti_store_set(good, "k", "v", 1));
    int round = 0;

    /* garbage: an HTTP request reads as a frame length far over the limit */
    int fd = raw_connect(c.port);
    const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    raw_send(fd, http, sizeof(http) - 1);
    ck_assert_msg(raw_closed(fd, 0), "server kept a client sending HTTP");
    close(fd);
    check_still_serving(good, c.port, round++);

    /* random bytes after a plausible header: unknown command */
    fd = raw_connect(c.port);
    unsigned char junk[64];
    be32(junk, 60);
    for (int i = 4; i < 64; i++)
        junk[i] = (unsigned char)(0xee ^ (i * 37));
    raw_send(fd, junk, sizeof(junk));
    ck_assert_msg(raw_closed(fd, 0), "server kept a client sending junk");
    close(fd);
    check_still_serving(good, c.port, round++);

    /* oversized frame header, no body */
    fd = raw_connect(c.port);
    unsigned char hdr[5];
    be32(hdr, 0xffffffffu);
    hdr[4] = TT_STORE_CMD_SET;
    raw_send(fd, hdr, 5);
    ck_assert_msg(raw_closed(fd, 0), "server kept a client with a 4 GiB frame");
    close(fd);
    check_still_serving(good, c.port, round++);

    /* zero-length frame */
    fd = raw_connect(c.port);
    be32(hdr, 0);
    raw_send(fd, hdr, 4);
    ck_assert_msg(raw_closed(fd, 0), "server kept a client with an empty frame");
    close(fd);

    /* a field running past its frame */
    fd = raw_connect(c.port);
    raw_hello(fd);
    unsigned char tr[4 + 1 + 4 + 3 + 4 + 8];
    be32(tr, sizeof(tr) - 4);
    tr[4] = TT_STORE_CMD_SET;
    be32(tr + 5, 3);
    memcpy(tr + 9, "key", 3);
    be32(tr + 12, 1000); /* claims 1000 bytes, 8 follow */
    memset(tr + 16, 'x', 8);
    raw_send(fd, tr, sizeof(tr));
    ck_assert_msg(raw_closed(fd, 0), "server kept a client with a truncated field");
    close(fd);
    check_still_serving(good, c.port, round++);

    /* a key over the limit inside a well-formed frame */
    fd = raw_connect(c.port);
    raw_hello(fd);
    size_t kl = TUTTI_STORE_MAX_KEY + 1;
    unsigned char *kf = calloc(1, 4 + 1 + 4 + kl);
    be32(kf, (uint32_t)(1 + 4 + kl));
    kf[4] = TT_STORE_CMD_GET;
    be32(kf + 5, (uint32_t)kl);
    memset(kf + 9, 'k', kl);
    raw_send(fd, kf, 4 + 1 + 4 + kl);
    free(kf);
    ck_assert_msg(raw_closed(fd, 0), "server kept a client with a long key");
    close(fd);

    /* half a frame, then the client goes away */
    fd = raw_connect(c.port);
    raw_hello(fd);
    raw_send(fd, tr, 10);
    close(fd);
    check_still_serving(good, c.port, round++);

    /* a client that leaves while its GET waits: the waiter must go with it */
    fd = raw_connect(c.port);
    raw_hello(fd);
    unsigned char gf[4 + 1 + 4 + 5];
    be32(gf, 1 + 4 + 5);
    gf[4] = TT_STORE_CMD_GET;
    be32(gf + 5, 5);
    memcpy(gf + 9, "ghost", 5);
    raw_send(fd, gf, sizeof(gf));
    sleep_ms(50);
    close(fd);
    sleep_ms(50);
    OK(good, tutti_store_set(good, "ghost", "boo", 3));
    check_still_serving(good, c.port, round++);

    /* requests sent behind a waiting GET are answered in order, after it */
    fd = raw_connect(c.port);
    raw_hello(fd);
    unsigned char pf[(4 + 1 + 4 + 4) + (4 + 1 + 4 + 4 + 4 + 1)];
    unsigned char *q = pf;
    be32(q, 1 + 4 + 4);
    q[4] = TT_STORE_CMD_GET;
    be32(q + 5, 4);
    memcpy(q + 9, "pipe", 4);
    q += 13;
    be32(q, 1 + 4 + 4 + 4 + 1);
    q[4] = TT_STORE_CMD_SET;
    be32(q + 5, 4);
    memcpy(q + 9, "pipe", 4);
    be32(q + 13, 1);
    q[17] = 'x';
    raw_send(fd, pf, sizeof(pf));
    sleep_ms(50);
    OK(good, tutti_store_set(good, "pipe", "y", 1));
    unsigned char rb[11];
    ck_assert_int_eq(recv(fd, rb, sizeof(rb), MSG_WAITALL), (ssize_t)sizeof(rb));
    const unsigned char want[11] = { 0, 0, 0, 2, 0, 'y', 0, 0, 0, 1, 0 };
    ck_assert_mem_eq(rb, want, sizeof(want));
    close(fd);
    void *pv;
    OK(good, tutti_store_get(good, "pipe", &pv, NULL, 100));
    ck_assert_str_eq(pv, "x");
    free(pv);
    check_still_serving(good, c.port, round++);

    tutti_store_close(good);
    ctx_close(&c);
}
END_TEST

START_TEST(test_tcp_random_frames)
{
    /* frames with sane lengths and random contents, sent and dropped at once: whatever the
     * server makes of them, it must go on serving (run under ASan to see the memory); half
     * before the hello, half after */
    setenv("TUTTI_DEBUG", "error", 1); /* 400 closed connections are 400 warnings */
    ctx_t c;
    ctx_open(&c, K_TCP, 3000);
    unsigned seed = 4242;
    unsigned char f[4 + 96];
    for (int i = 0; i < 400; i++) {
        uint32_t len = 1 + rand_r(&seed) % 96;
        be32(f, len);
        f[4] = (unsigned char)(rand_r(&seed) % 10);
        for (uint32_t k = 1; k < len; k++) {
            /* mostly small field lengths, so some frames parse */
            int r = rand_r(&seed) % 8;
            f[4 + k] = r < 5 ? 0 : (unsigned char)(r == 5 ? rand_r(&seed) % 12 : rand_r(&seed));
        }
        int fd = raw_connect(c.port);
        if (i % 2) /* the others test the hello's own parsing */
            raw_hello(fd);
        raw_send(fd, f, 4 + len);
        close(fd);
    }
    check_still_serving(c.s, c.port, 0);
    ctx_close(&c);
}
END_TEST

START_TEST(test_tcp_timeout_no_desync)
{
    /* a get that times out must not leave its late answer to be read by the next call */
    ctx_t c;
    ctx_open(&c, K_TCP, 2000);
    tutti_store_t *s;
    OK(NULL, tutti_store_open_tcp(&s, "127.0.0.1", c.port, 0, 2000));
    void *v;
    EXPECT(s, tutti_store_get(s, "slow", &v, NULL, 100), TUTTI_ERR_TIMEOUT);
    OK(c.s, tutti_store_set(c.s, "slow", "late answer", 11));
    OK(c.s, tutti_store_set(c.s, "next", "right answer", 12));
    OK(s, tutti_store_get(s, "next", &v, NULL, 500));
    ck_assert_str_eq(v, "right answer");
    free(v);
    int64_t r;
    OK(s, tutti_store_add(s, "cnt", 7, &r));
    ck_assert_int_eq(r, 7);
    tutti_store_close(s);
    ctx_close(&c);
}
END_TEST

START_TEST(test_tcp_unreachable)
{
    /* a port nobody listens on: bound, not listening, and held until the attempt is
     * over (closed at once, another test's server running meanwhile could take it, or
     * the client's own ephemeral port could be it: a fresh clone's ASan run once got
     * TUTTI_OK here) */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t alen = sizeof(a);
    getsockname(fd, (struct sockaddr *)&a, &alen);
    int port = ntohs(a.sin_port);

    tutti_store_t *s = (tutti_store_t *)0x1;
    double t0 = now_ms();
    int st = tutti_store_open_tcp(&s, "127.0.0.1", port, 0, 300);
    double el = now_ms() - t0;
    close(fd);
    ck_assert_msg(st == TUTTI_ERR_TIMEOUT || st == TUTTI_ERR_STORE, "got %s",
                  tutti_status_name(st));
    ck_assert_ptr_eq(s, (void *)0x1);
    ck_assert_msg(el >= 300 && el <= 1300, "gave up after %.0f ms, not ~300", el);
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    const char *msg = tutti_store_last_error(NULL);
    ck_assert_msg(strstr(msg, addr) && strstr(msg, strerror(ECONNREFUSED)), "message: %s", msg);

    /* a server that goes away: calls fail with the address, and do not hang */
    ctx_t c;
    ctx_open(&c, K_TCP, 300);
    tutti_store_t *cl;
    OK(NULL, tutti_store_open_tcp(&cl, "127.0.0.1", c.port, 0, 300));
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", c.port);
    ctx_close(&c);
    t0 = now_ms();
    st = tutti_store_set(cl, "k", "v", 1);
    el = now_ms() - t0;
    ck_assert_int_lt(st, 0);
    ck_assert_msg(el <= 1300, "set on a dead server took %.0f ms", el);
    ck_assert_msg(strstr(tutti_store_last_error(cl), addr), "%s", tutti_store_last_error(cl));
    tutti_store_close(cl);
}
END_TEST

/* Run the standalone server (when it was built) and talk to it. */
START_TEST(test_tcp_tool)
{
    const char *tool = TH_STORE_TOOL;
    if (access(tool, X_OK) < 0) {
        fprintf(stderr, "test_tcp_tool: skipped, %s not built\n", tool);
        return;
    }
    const char *const first[] = { tool, "--host", "127.0.0.1", "--port", "0", NULL };
    char line[256];
    pid_t pid;
    tool_start(first, &pid, line, sizeof(line));
    int port = 0;
    if (sscanf(line, "tutti-store listening on tcp://127.0.0.1:%d", &port) != 1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        ck_abort_msg("tool printed '%s'", line);
    }
    tutti_store_t *s;
    int st = tutti_store_open_tcp(&s, "127.0.0.1", port, 0, 2000);
    if (st == 0) {
        st = tutti_store_set(s, "t", "ool", 3);
        tutti_store_close(s);
    }
    /* a second one on the same port cannot listen: exit 1 */
    char ports[16];
    snprintf(ports, sizeof(ports), "%d", port);
    pid_t pids[4];
    const char *args[4][6] = { { tool, "--host", "127.0.0.1", "--port", ports, NULL },
                               { tool, "--help", NULL },
                               { tool, "--port", "x", NULL },
                               { tool, NULL } };
    for (int i = 0; i < 4; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            int devnull = open("/dev/null", O_WRONLY);
            dup2(devnull, 1);
            dup2(devnull, 2);
            execv(tool, (char *const *)args[i]);
            _exit(127);
        }
    }
    int codes[4];
    reap_children_ex(pids, 4, 5000, codes, REAP_KEEP | REAP_QUIET);
    kill(pid, SIGTERM);
    int code;
    reap_children(&pid, 1, 5000, &code);
    ck_assert_msg(st == 0, "talking to the tool: %s", tutti_status_name(st));
    ck_assert_int_eq(codes[0], 1);
    ck_assert_int_eq(codes[1], 0);
    ck_assert_int_eq(codes[2], 2);
    ck_assert_int_eq(codes[3], 2);
    ck_assert_int_eq(code, 0);
}
END_TEST

/* ---- file ---- */

START_TEST(test_file_killed_writer)
{
    enum { KILLS = 6 };
    const size_t sz = 16u << 20;
    ctx_t c;
    ctx_open(&c, K_FILE, 10000);
    char *buf = malloc(sz);
    ck_assert_ptr_nonnull(buf);
    memset(buf, 1, sz);
    OK(c.s, tutti_store_set(c.s, "big", buf, sz));
    free(buf);

    tutti_store_t *s;
    pid_t reader = fork_client(&c, &s, 10000);
    if (reader == 0) {
        const char *stop[] = { "stop" };
        int stopped = 0, reads = 0;
        double end = now_ms() + 20000;
        while (!stopped && now_ms() < end) {
            void *v;
            size_t len;
            CHILD_OK(tutti_store_get(s, "big", &v, &len, 2000), 3);
            const unsigned char *b = v;
            if (len != sz || b[0] == 0 || memcmp(b, b + 1, sz - 1)) {
                fprintf(stderr, "reader: partial value: %zu bytes, first %u\n", len, b[0]);
                _exit(4);
            }
            free(v);
            reads++;
            CHILD_OK(tutti_store_check(s, stop, 1, &stopped), 5);
        }
        fprintf(stderr, "reader: %d complete reads\n", reads);
        _exit(stopped && reads > 0 ? 0 : 6);
    }
    unsigned seed = (unsigned)getpid();
    for (int k = 0; k < KILLS; k++) {
        pid_t w = fork();
        if (w < 0)
            break;
        if (w == 0) {
            tutti_store_t *s;
            CHILD_OK(ctx_client(&c, &s, 10000), 2);
            char *b = malloc(sz);
            for (unsigned i = 0;; i++) {
                memset(b, (int)(1 + (k * 37 + i) % 250), sz);
                CHILD_OK(tutti_store_set(s, "big", b, sz), 3);
            }
        }
        sleep_ms(20 + (int)(rand_r(&seed) % 150));
        kill(w, SIGKILL);
        int code;
        reap_children_ex(&w, 1, 5000, &code, REAP_QUIET);
        if (code != -SIGKILL) {
            kill(reader, SIGKILL);
            waitpid(reader, NULL, 0);
            ck_abort_msg("writer ended with %d before it was killed", code);
        }
    }
    OK(c.s, tutti_store_set(c.s, "stop", "1", 1));
    int rc = reap_children(&reader, 1, 10000, NULL);
    ck_assert_msg(rc == 0, "the reader saw a partial value or failed");
    void *v;
    size_t len;
    OK(c.s, tutti_store_get(c.s, "big", &v, &len, 100));
    ck_assert_uint_eq(len, sz);
    free(v);
    /* the dead writers' temp files go at the next open */
    int before = count_tmp_files(c.dir);
    tutti_store_t *s2;
    OK(NULL, tutti_store_open_file(&s2, c.dir, 1000));
    ck_assert_int_eq(count_tmp_files(c.dir), 0);
    fprintf(stderr, "killed writer: %d temp files left by %d kills, removed at open\n", before,
            KILLS);
    tutti_store_close(s2);
    ctx_close(&c);
}
END_TEST

START_TEST(test_file_full_disk)
{
    ctx_t c;
    ctx_open(&c, K_FILE, 2000);
    tutti_store_t *s;
    pid_t pid = fork_client(&c, &s, 2000);
    if (pid == 0) {
        struct rlimit rl = { 1u << 20, 1u << 20 };
        signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &rl) < 0)
            _exit(3);
        size_t sz = 4u << 20;
        char *b = calloc(1, sz);
        int st = tutti_store_set(s, "full", b, sz);
        const char *msg = tutti_store_last_error(s);
        fprintf(stderr, "full disk: %s\n", msg);
        if (st != TUTTI_ERR_IO || !strstr(msg, strerror(EFBIG)) || !strstr(msg, c.dir) ||
            !strstr(msg, "full"))
            _exit(4);
        int exists = 1;
        const char *k[] = { "full" };
        CHILD_OK(tutti_store_check(s, k, 1, &exists), 5);
        if (exists || count_tmp_files(c.dir) != 0)
            _exit(6);
        /* a counter cannot grow past the limit either, but small values still fit */
        CHILD_OK(tutti_store_set(s, "small", "ok", 2), 7);
        CHILD_OK(tutti_store_add(s, "n", 1, NULL), 8);
        free(b);
        tutti_store_close(s);
        _exit(0);
    }
    int code;
    reap_children(&pid, 1, 10000, &code);
    ck_assert_msg(code == 0, "full-disk child exited %d", code);
    ctx_close(&c);
}
END_TEST

/* A pid that no process of this namespace has (a child's, reaped). */
static pid_t dead_pid(void)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(0);
    waitpid(pid, NULL, 0);
    return pid;
}

static unsigned long own_pidns(void)
{
    struct stat sb;
    ck_assert_int_eq(stat("/proc/self/ns/pid", &sb), 0);
    return (unsigned long)sb.st_ino;
}

static void own_host(char *host, size_t len)
{
    memset(host, 0, len);
    if (gethostname(host, len - 1) < 0)
        snprintf(host, len, "localhost");
    for (char *p = host; *p; p++)
        if (*p == '/')
            *p = '_';
}

/* A temp file at dir/name, its mtime age_s seconds ago. */
static void make_tmp(const char *dir, const char *name, int age_s)
{
    char path[1400];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
    ck_assert_int_eq(write(fd, "x", 1), 1);
    close(fd);
    if (age_s) {
        struct timespec t[2] = { { time(NULL) - age_s, 0 }, { time(NULL) - age_s, 0 } };
        ck_assert_int_eq(utimensat(AT_FDCWD, path, t, 0), 0);
    }
}

static int path_exists(const char *dir, const char *name)
{
    char path[1400];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* Which temp files an open removes: those of a dead writer of this host and pid namespace
 * at once; of another pid namespace (another container with the same host name: its pid
 * means nothing here) or of the older name form without a namespace only when old; in the
 * root and in long keys' directories alike. */
START_TEST(test_file_tmp_cleanup)
{
    ctx_t c;
    ctx_open(&c, K_FILE, 2000);
    char host[64], longkey[301], sub[256];
    own_host(host, sizeof(host));
    unsigned long ns = own_pidns();
    long dead = (long)dead_pid();
    memset(longkey, 'a', 300);
    longkey[300] = '\0';
    OK(c.s, tutti_store_set(c.s, longkey, "v", 1));
    char d[220];
    d[0] = 'd';
    memset(d + 1, 'a', 200);
    d[201] = '\0';
    snprintf(sub, sizeof(sub), "%s/%s", c.dir, d);
    static const struct {
        const char *what;
        int ns; /* 1 ours, 2 another, 0 the older form */
        int age_s, in_sub, removed;
    } cases[] = {
        { "ours, dead", 1, 0, 0, 1 },
        { "ours, dead, in a long key's directory", 1, 0, 1, 1 },
        { "another pid namespace, new", 2, 0, 0, 0 },
        { "another pid namespace, new, in a long key's directory", 2, 0, 1, 0 },
        { "another pid namespace, 2 h old", 2, 7200, 0, 1 },
        { "older form, new", 0, 0, 0, 0 },
        { "older form, 2 h old", 0, 7200, 0, 1 },
        { "older form, 2 h old, in a long key's directory", 0, 7200, 1, 1 },
    };
    char names[8][200];
    for (int i = 0; i < 8; i++) {
        if (cases[i].ns)
            snprintf(names[i], sizeof(names[i]), ".tmp.%ld-%lu.%d.%s", dead,
                     cases[i].ns == 1 ? ns : ns + 1, 1000 + i, host);
        else
            snprintf(names[i], sizeof(names[i]), ".tmp.%ld.%d.%s", dead, 1000 + i, host);
        make_tmp(cases[i].in_sub ? sub : c.dir, names[i], cases[i].age_s);
    }
    tutti_store_t *s2;
    OK(NULL, tutti_store_open_file(&s2, c.dir, 1000));
    for (int i = 0; i < 8; i++)
        ck_assert_msg(path_exists(cases[i].in_sub ? sub : c.dir, names[i]) == !cases[i].removed,
                      "%s: %s %s", cases[i].what, names[i],
                      cases[i].removed ? "left behind" : "removed");
    tutti_store_close(s2);
    ctx_close(&c);
}
END_TEST

/* A writer in another pid namespace (another container on a host of the same name) whose
 * pid is no process here: opens of the store meanwhile leave its temp files alone (before,
 * they looked dead and went mid-write, and the writer's set failed). */
START_TEST(test_file_other_pidns_writer)
{
    if (geteuid() != 0) {
        fprintf(stderr, "other pid namespace: skipped (needs root)\n");
        return;
    }
    ctx_t c;
    ctx_open(&c, K_FILE, 5000);
    pid_t want = dead_pid(); /* the writer's pid in its namespace, no process here */
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t outer = fork();
    ck_assert_int_ge(outer, 0);
    if (outer == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(60);
        close(ready[0]);
        if (unshare(CLONE_NEWPID) < 0)
            _exit(99);
        pid_t init = fork(); /* pid 1 of the new namespace */
        if (init < 0)
            _exit(98);
        if (init == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "w");
            if (!f || fprintf(f, "%d", (int)want - 1) < 0 || fclose(f) != 0)
                _exit(99);
            pid_t w = fork();
            if (w == 0) {
                if (getpid() != want)
                    _exit(99);
                tutti_store_t *s;
                CHILD_OK(ctx_client(&c, &s, 5000), 2);
                size_t sz = 16u << 20;
                char *b = malloc(sz);
                memset(b, 'x', sz);
                ck_assert_int_eq(write(ready[1], "r", 1), 1);
                for (int i = 0; i < 40; i++)
                    CHILD_OK(tutti_store_set(s, "big", b, sz), 3);
                _exit(0);
            }
            int code = 98;
            if (w > 0 && waitpid(w, &code, 0) == w)
                code = WIFEXITED(code) ? WEXITSTATUS(code) : 97;
            _exit(code);
        }
        int code = 98;
        if (waitpid(init, &code, 0) == init)
            code = WIFEXITED(code) ? WEXITSTATUS(code) : 97;
        _exit(code);
    }
    close(ready[1]);
    char r;
    int got = (int)read(ready[0], &r, 1);
    close(ready[0]);
    int opens = 0;
    if (got == 1) {
        /* opens, each cleaning up, while the writer writes */
        for (double end = now_ms() + 20000; now_ms() < end; opens++) {
            tutti_store_t *s;
            OK(NULL, tutti_store_open_file(&s, c.dir, 1000));
            tutti_store_close(s);
            siginfo_t si = { 0 }; /* the writer done (waitpid takes no WNOWAIT: EINVAL) */
            if (waitid(P_PID, (id_t)outer, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                si.si_pid == outer)
                break;
            usleep(200);
        }
    }
    int code = -1;
    reap_children(&outer, 1, 40000, &code);
    ctx_close(&c);
    if (code == 99) {
        fprintf(stderr, "other pid namespace: skipped (no pid namespace, or no pid %d in it)\n",
                (int)want);
        return;
    }
    fprintf(stderr, "other pid namespace: writer (pid %d there) exited %d after %d opens\n",
            (int)want, code, opens);
    ck_assert_msg(code == 0, "the writer in another pid namespace failed (%d)", code);
}
END_TEST

/* Deleting a long key removes the directories it emptied; its key is set again after. */
START_TEST(test_file_long_key_dirs)
{
    ctx_t c;
    ctx_open(&c, K_FILE, 2000);
    char k1[701], k2[701];
    memset(k1, 'b', 700);
    k1[700] = '\0';
    memcpy(k2, k1, sizeof(k1));
    k2[650] = 'c'; /* shares the first three directories */
    OK(c.s, tutti_store_set(c.s, k1, "1", 1));
    OK(c.s, tutti_store_set(c.s, k2, "2", 1));
    int del;
    OK(c.s, tutti_store_delete(c.s, k1, &del));
    ck_assert_int_eq(del, 1);
    void *v;
    size_t len;
    OK(c.s, tutti_store_get(c.s, k2, &v, &len, 100));
    free(v);
    OK(c.s, tutti_store_delete(c.s, k2, &del));
    ck_assert_int_eq(del, 1);
    DIR *d = opendir(c.dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    int dirs = 0;
    while ((e = readdir(d)))
        dirs += e->d_name[0] == 'd';
    closedir(d);
    ck_assert_msg(dirs == 0, "%d long-key directories left after deleting the keys", dirs);
    OK(c.s, tutti_store_set(c.s, k1, "3", 1));
    OK(c.s, tutti_store_get(c.s, k1, &v, &len, 100));
    ck_assert_int_eq(((char *)v)[0], '3');
    free(v);
    ctx_close(&c);
}
END_TEST

START_TEST(test_file_unwritable)
{
    if (geteuid() == 0) {
        fprintf(stderr, "test_file_unwritable: skipped as root (permissions do not apply)\n");
        return;
    }
    ctx_t c;
    ctx_open(&c, K_FILE, 2000);
    chmod(c.dir, 0555);
    int st = tutti_store_set(c.s, "k", "v", 1);
    chmod(c.dir, 0755);
    ck_assert_int_eq(st, TUTTI_ERR_IO);
    ck_assert_ptr_nonnull(strstr(tutti_store_last_error(c.s), strerror(EACCES)));
    ctx_close(&c);
}
END_TEST

/* TUTTI_STORE_FSYNC had no field: opts.fsync (tutti_store_open of a file:// URL) asks for
 * the fsync of each value, and tutti_store_opts_init fills it from the variable, which
 * tutti_store_open_file still reads. fsync is this file's (the static library binds to
 * it), counting its calls. */
static atomic_int fsyncs;
int fsync(int fd)
{
    atomic_fetch_add(&fsyncs, 1);
    return (int)syscall(SYS_fsync, fd);
}

/* How many fsyncs a set on a fresh file store opened as asked took. */
static int fsyncs_of_set(int fsync_field, const char *env, int open_file)
{
    char dir[128], url[160];
    snprintf(dir, sizeof(dir), "%s/fsync%d-XXXXXX", g_root, (int)getpid());
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(url, sizeof(url), "file://%s", dir);
    if (env)
        setenv("TUTTI_STORE_FSYNC", env, 1);
    else
        unsetenv("TUTTI_STORE_FSYNC");
    tutti_store_opts_t o;
    tutti_store_opts_init(&o);
    if (fsync_field >= 0)
        o.fsync = fsync_field;
    tutti_store_t *s = NULL;
    if (open_file)
        OK(NULL, tutti_store_open_file(&s, dir, 2000));
    else
        OK(NULL, tutti_store_open(&s, url, &o));
    unsetenv("TUTTI_STORE_FSYNC");
    int before = atomic_load(&fsyncs);
    OK(s, tutti_store_set(s, "k", "v", 1));
    int n = atomic_load(&fsyncs) - before;
    tutti_store_close(s);
    return n;
}

START_TEST(test_file_fsync_field)
{
    ck_assert_int_eq(fsyncs_of_set(-1, NULL, 0), 0);
    ck_assert_int_gt(fsyncs_of_set(1, NULL, 0), 0); /* the field alone */
    ck_assert_int_eq(fsyncs_of_set(0, "1", 0), 0);  /* the field wins over the variable */
    ck_assert_int_gt(fsyncs_of_set(-1, "1", 0), 0); /* the variable through opts_init */
    ck_assert_int_gt(fsyncs_of_set(-1, "1", 1), 0); /* and tutti_store_open_file */
    ck_assert_int_eq(fsyncs_of_set(-1, NULL, 1), 0);
}
END_TEST

/* ---- redis ---- */

/* The replies to raw (inline) commands on 127.0.0.1:port, read until an integer reply
 * came or 3 s passed. */
static void redis_raw(int port, const char *cmd, char *out, size_t outlen)
{
    int fd = raw_connect(port);
    size_t o = 0;
    out[0] = '\0';
    ck_assert_int_eq(write(fd, cmd, strlen(cmd)), (ssize_t)strlen(cmd));
    while (o + 1 < outlen && !strstr(out, "\r\n:")) {
        ssize_t n = read(fd, out + o, outlen - 1 - o);
        if (n <= 0)
            break;
        o += (size_t)n;
        out[o] = '\0';
    }
    close(fd);
}

START_TEST(test_redis_urls)
{
    tutti_store_t *s = (tutti_store_t *)0x1;
    const char *bad[] = { "redis://",         "redis://h:0",       "redis://h:x",
                          "redis://h:1/x",    "redis://h:1/1?x=1", "redis://u:%zz@h:1",
                          "redis://u:a%00@h", "redis://@",         "redis://h:1#f",
                          "redis://::1:5",    "redis://[::1" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int st = tutti_store_open(&s, bad[i], NULL);
        ck_assert_msg(st == TUTTI_ERR_INVALID_ARG, "'%s' -> %s", bad[i], tutti_status_name(st));
        ck_assert_ptr_eq(s, (void *)0x1);
        const char *msg = tutti_store_last_error(NULL);
        ck_assert_msg(strstr(msg, "redis://[[user]:password@]host[:port][/db]"), "'%s': %s", bad[i],
                      msg);
    }
    /* a password never shows, not even in the message of a bad URL */
    EXPECT(NULL, tutti_store_open(&s, "redis://u:hunter2@h:1/zz", NULL), TUTTI_ERR_INVALID_ARG);
    ck_assert_ptr_null(strstr(tutti_store_last_error(NULL), "hunter2"));
    /* a query string (redis-py's ?db=, ?ssl=) is named as such, not as a bad database;
     * rediss:// as TLS (session 102) */
    const char *query[] = { "redis://h:1/0?db=3", "redis://h:1?ssl=true", "redis://h:1/#x" };
    for (size_t i = 0; i < sizeof(query) / sizeof(query[0]); i++) {
        EXPECT(NULL, tutti_store_open(&s, query[i], NULL), TUTTI_ERR_INVALID_ARG);
        ck_assert_msg(strstr(tutti_store_last_error(NULL), "query strings and fragments"),
                      "'%s': %s", query[i], tutti_store_last_error(NULL));
    }
    EXPECT(NULL, tutti_store_open(&s, "rediss://u:hunter2@h:1", NULL), TUTTI_ERR_INVALID_ARG);
    ck_assert_msg(strstr(tutti_store_last_error(NULL), "TLS (rediss://) is not supported") &&
                      !strstr(tutti_store_last_error(NULL), "hunter2"),
                  "%s", tutti_store_last_error(NULL));

    char dir[256];
    snprintf(dir, sizeof(dir), "%s/ru%d", g_root, (int)getpid());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    pid_t pid;
    int port = th_redis_start(dir, NULL, &pid);
    char url[128], want[128];
    /* the port and the db may be left out: 6379 and 0 (nobody listens on 6379 here, or
     * an unknown server does: either way the URL parses and the attempt is bounded) */
    tutti_store_opts_t o;
    tutti_store_opts_init(&o);
    o.timeout_ms = 200;
    int st = tutti_store_open(&s, "redis://127.0.0.1", &o);
    if (st == TUTTI_OK) {
        ck_assert_str_eq(tutti_store_url(s), "redis://127.0.0.1:6379/0");
        tutti_store_close(s);
    } else {
        ck_assert_ptr_nonnull(strstr(tutti_store_last_error(NULL), "127.0.0.1:6379"));
    }
    snprintf(url, sizeof(url), "redis://localhost:%d/", port);
    snprintf(want, sizeof(want), "redis://localhost:%d/0", port);
    OK(NULL, tutti_store_open(&s, url, &o));
    ck_assert_str_eq(tutti_store_url(s), want);
    ck_assert_int_eq(tutti_store_port(s), -1);
    tutti_store_close(s);
    /* databases keep keys apart; one beyond the server's count is refused at open */
    tutti_store_t *d1, *d2;
    OK(NULL, redis_open(&d1, port, 1, 500));
    OK(NULL, redis_open(&d2, port, 2, 500));
    OK(d1, tutti_store_set(d1, "k", "one", 3));
    int exists;
    OK(d2, tutti_store_check(d2, (const char *const[]){ "k" }, 1, &exists));
    ck_assert_int_eq(exists, 0);
    tutti_store_close(d1);
    tutti_store_close(d2);
    EXPECT(NULL, redis_open(&s, port, 99, 500), TUTTI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(tutti_store_last_error(NULL), "SELECT"));
    th_redis_stop(pid);
}
END_TEST

START_TEST(test_redis_auth)
{
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/ra%d", g_root, (int)getpid());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    pid_t pid;
    int port = th_redis_start(dir, (const char *const[]){ "--requirepass", "p@ss/w:rd", NULL },
                              &pid);
    tutti_store_t *s;
    char url[160], want[160];
    tutti_store_opts_t o;
    tutti_store_opts_init(&o);
    o.timeout_ms = 2000;
    /* no password: refused at open, at once, saying why */
    double t0 = now_ms();
    EXPECT(NULL, redis_open(&s, port, 0, 2000), TUTTI_ERR_AUTH);
    ck_assert_msg(now_ms() - t0 < 1000, "refusal took %.0f ms", now_ms() - t0);
    ck_assert_ptr_nonnull(strstr(tutti_store_last_error(NULL), "NOAUTH"));
    /* a wrong one */
    snprintf(url, sizeof(url), "redis://:wrong@127.0.0.1:%d", port);
    EXPECT(NULL, tutti_store_open(&s, url, &o), TUTTI_ERR_AUTH);
    const char *msg = tutti_store_last_error(NULL);
    ck_assert_msg(strstr(msg, "AUTH") && !strstr(msg, "wrong@"), "%s", msg);
    /* the right one, percent-encoded in the URL (and never shown) */
    snprintf(url, sizeof(url), "redis://:p%%40ss%%2Fw%%3Ard@127.0.0.1:%d/3", port);
    OK(NULL, tutti_store_open(&s, url, &o));
    ck_assert_ptr_null(strstr(tutti_store_url(s), "ss"));
    OK(s, tutti_store_set(s, "k", "v", 1));
    tutti_store_close(s);
    /* the password alone before '@', as redis-cli takes it */
    snprintf(url, sizeof(url), "redis://p%%40ss%%2Fw%%3Ard@127.0.0.1:%d", port);
    OK(NULL, tutti_store_open(&s, url, &o));
    tutti_store_close(s);
    /* from the options (TUTTI_STORE_PASSWORD), and the URL's wins over it */
    o.password = "p@ss/w:rd";
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/3", port);
    OK(NULL, tutti_store_open(&s, url, &o));
    void *v;
    OK(s, tutti_store_get(s, "k", &v, NULL, 100));
    ck_assert_str_eq(v, "v");
    free(v);
    tutti_store_close(s);
    snprintf(url, sizeof(url), "redis://:nope@127.0.0.1:%d/3", port);
    EXPECT(NULL, tutti_store_open(&s, url, &o), TUTTI_ERR_AUTH);
    setenv("TUTTI_STORE_PASSWORD", "p@ss/w:rd", 1);
    tutti_store_opts_init(&o);
    ck_assert_str_eq(o.password, "p@ss/w:rd");
    unsetenv("TUTTI_STORE_PASSWORD");
    /* a user name (ACL): the default user with its password */
    snprintf(url, sizeof(url), "redis://default:p%%40ss%%2Fw%%3Ard@127.0.0.1:%d/3", port);
    o.password = NULL;
    OK(NULL, tutti_store_open(&s, url, &o));
    snprintf(url, sizeof(url), "redis://default@127.0.0.1:%d/3", port);
    ck_assert_str_eq(tutti_store_url(s), url);
    tutti_store_close(s);
    /* an ACL user of its own: its name in the URL, its password from the options */
    char reply[512];
    redis_raw(port, "AUTH p@ss/w:rd\r\nACL SETUSER alice on >alice-pw ~* +@all\r\nDBSIZE\r\n",
              reply, sizeof(reply));
    ck_assert_msg(strstr(reply, "+OK\r\n+OK\r\n:"), "%s", reply);
    o.password = "alice-pw";
    snprintf(url, sizeof(url), "redis://alice:@127.0.0.1:%d", port); /* empty: the options' */
    OK(NULL, tutti_store_open(&s, url, &o));
    snprintf(want, sizeof(want), "redis://alice@127.0.0.1:%d/0", port);
    ck_assert_str_eq(tutti_store_url(s), want);
    OK(s, tutti_store_set(s, "alice", "1", 1));
    tutti_store_close(s);
    /* a lone field is the password even with the options holding one: never shown as a user */
    snprintf(url, sizeof(url), "redis://p%%40ss%%2Fw%%3Ard@127.0.0.1:%d", port);
    o.password = "not-this-one";
    OK(NULL, tutti_store_open(&s, url, &o)); /* the default user's, and the URL's wins */
    snprintf(want, sizeof(want), "redis://127.0.0.1:%d/0", port);
    ck_assert_str_eq(tutti_store_url(s), want);
    tutti_store_close(s);
    snprintf(url, sizeof(url), "redis://s3cret-lone@127.0.0.1:%d", port);
    EXPECT(NULL, tutti_store_open(&s, url, &o), TUTTI_ERR_AUTH);
    msg = tutti_store_last_error(NULL);
    ck_assert_msg(!strstr(msg, "s3cret-lone"), "%s", msg);
    o.password = "alice-pw";
    snprintf(url, sizeof(url), "redis://alice:@127.0.0.1:%d", port);
    o.password = "wrong";
    EXPECT(NULL, tutti_store_open(&s, url, &o), TUTTI_ERR_AUTH);
    msg = tutti_store_last_error(NULL);
    ck_assert_msg(strstr(msg, "WRONGPASS") && !strstr(msg, "wrong "), "%s", msg);
    /* a user and no password anywhere: said at once */
    o.password = NULL;
    EXPECT(NULL, tutti_store_open(&s, url, &o), TUTTI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tutti_store_last_error(NULL), "names a user but no password"));
    th_redis_stop(pid);

    /* A server that echoes AUTH's arguments in its error (AUTH renamed away): the reply's
     * first word shows, the password never */
    port = th_redis_start(dir, (const char *const[]){ "--rename-command", "AUTH", "", NULL }, &pid);
    snprintf(url, sizeof(url), "redis://:hunter22@127.0.0.1:%d", port);
    EXPECT(NULL, tutti_store_open(&s, url, &o), TUTTI_ERR_AUTH);
    msg = tutti_store_last_error(NULL);
    ck_assert_msg(strstr(msg, "AUTH refused: ERR (the rest") && !strstr(msg, "hunter22"), "%s",
                  msg);
    snprintf(url, sizeof(url), "redis://bob:hunter22@127.0.0.1:%d", port);
    EXPECT(NULL, tutti_store_open(&s, url, &o), TUTTI_ERR_AUTH);
    msg = tutti_store_last_error(NULL);
    ck_assert_msg(!strstr(msg, "hunter22"), "%s", msg);
    th_redis_stop(pid);

    /* tutti_store_open_env names its store without the password, in the log and in
     * tutti_comm_last_error */
    setenv("TUTTI_STORE", "redis://carol:s3cr3t@pw@127.0.0.1:1/2", 1);
    setenv("TUTTI_RANK", "0", 1);
    setenv("TUTTI_WORLD_SIZE", "1", 1);
    setenv("TUTTI_STORE_TIMEOUT_MS", "200", 1);
    int r, n;
    EXPECT(NULL, tutti_store_open_env(&s, &r, &n, NULL), TUTTI_ERR_TIMEOUT);
    msg = tutti_comm_last_error(NULL);
    ck_assert_msg(strstr(msg, "redis://carol:***@127.0.0.1:1/2") && !strstr(msg, "s3cr3t"), "%s",
                  msg);
    unsetenv("TUTTI_STORE");
    unsetenv("TUTTI_RANK");
    unsetenv("TUTTI_WORLD_SIZE");
    unsetenv("TUTTI_STORE_TIMEOUT_MS");
}
END_TEST

static void fake_stop(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* A scripted server of the test's own on ip:port (port 0: a free one, in *port_p): answer
 * is called after each read of each connection (conn and k count from 0) to write what it
 * likes; a connection stays open until the client closes it. A child process (fake_stop
 * it); -1 when the address cannot be bound. */
typedef void (*fake_answer_fn)(int fd, int conn, int k, const void *arg);

static pid_t fake_serve(const char *ip, int port, int *port_p, fake_answer_fn answer,
                        const void *arg)
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    ck_assert_int_eq(inet_pton(AF_INET, ip, &a.sin_addr), 1);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        close(lfd);
        return -1;
    }
    ck_assert_int_eq(listen(lfd, 16), 0);
    socklen_t alen = sizeof(a);
    getsockname(lfd, (struct sockaddr *)&a, &alen);
    *port_p = ntohs(a.sin_port);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        signal(SIGPIPE, SIG_IGN);
        for (int conn = 0;; conn++) {
            int fd = accept(lfd, NULL, NULL);
            if (fd < 0)
                continue;
            if (fork() == 0) { /* one process a connection, so that none holds up the next */
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                close(lfd);
                char buf[4096];
                for (int k = 0; read(fd, buf, sizeof(buf)) > 0; k++)
                    answer(fd, conn, k, arg);
                _exit(0);
            }
            close(fd);
            while (waitpid(-1, NULL, WNOHANG) > 0)
                ;
        }
    }
    close(lfd);
    return pid;
}

static void fake_write(int fd, const void *buf, size_t len)
{
    for (size_t o = 0; o < len;) {
        ssize_t w = write(fd, (const char *)buf + o, len - o);
        if (w <= 0)
            _exit(0); /* the client left */
        o += (size_t)w;
    }
}

/* A server of the test's own on 127.0.0.1:port (0: a free one; the port in *port_p): each
 * connection gets reply (len bytes) after its first bytes, then is closed; with reply
 * NULL it gets nothing and stays open. fake_stop it; -1 when the port cannot be bound. */
typedef struct fake_reply {
    const char *reply;
    size_t len;
} fake_reply_t;

static void answer_once(int fd, int conn, int k, const void *arg)
{
    (void)conn;
    (void)k;
    const fake_reply_t *r = arg;
    if (!r->reply)
        return; /* never answered, never closed */
    fake_write(fd, r->reply, r->len);
    _exit(0); /* closes the connection */
}

static pid_t fake_server(int port, int *port_p, const char *reply, size_t len)
{
    const fake_reply_t r = { reply, len }; /* the child's copy of this frame holds it */
    return fake_serve("127.0.0.1", port, port_p, answer_once, &r);
}

/* arg: a NULL-terminated list of replies, the k-th read of every connection gets the k-th
 * (the last one again after the end); "A|B": A to the first connection, B to the others. */
static void answer_script(int fd, int conn, int k, const void *arg)
{
    const char *const *r = arg;
    int n = 0;
    while (r[n + 1] && n < k)
        n++;
    char buf[512];
    const char *pick = strchr(r[n], '|'); /* "first connections|later ones" */
    if (pick) {
        size_t first = (size_t)(pick - r[n]);
        if (conn == 0) {
            memcpy(buf, r[n], first);
            buf[first] = '\0';
        } else {
            snprintf(buf, sizeof(buf), "%s", pick + 1);
        }
    } else {
        snprintf(buf, sizeof(buf), "%s", r[n]);
    }
    fake_write(fd, buf, strlen(buf));
}

/* PING's answer, then to SCAN an array of arrays of 99999 elements each (8 MB of them),
 * or with arg "bytes" an array of 1 MB bulk strings (80 MB); then silence. */
static void answer_huge(int fd, int conn, int k, const void *arg)
{
    (void)conn;
    if (k == 0) {
        fake_write(fd, "+PONG\r\n", 7);
        return;
    }
    if (!strcmp(arg, "bytes")) {
        static char bulk[(1u << 20) + 32];
        int h = snprintf(bulk, sizeof(bulk), "$%u\r\n", 1u << 20);
        memset(bulk + h, 'x', 1u << 20);
        memcpy(bulk + h + (1u << 20), "\r\n", 2);
        static const char head[] = "*2\r\n$1\r\n0\r\n*80\r\n";
        fake_write(fd, head, sizeof(head) - 1);
        for (int i = 0; i < 80; i++)
            fake_write(fd, bulk, (size_t)h + (1u << 20) + 2);
    } else {
        /* keys: 99999 arrays of 99999 integers, 20 of them sent (8 MB) */
        static char block[8 + 99999 * 4];
        memcpy(block, "*99999\r\n", 8);
        for (size_t i = 8; i < sizeof(block); i += 4)
            memcpy(block + i, ":1\r\n", 4);
        static const char head[] = "*2\r\n$1\r\n0\r\n*99999\r\n";
        fake_write(fd, head, sizeof(head) - 1);
        for (int i = 0; i < 20; i++)
            fake_write(fd, block, sizeof(block));
    }
    pause();
}

/* The client sets a bound on a whole reply: a server cannot make it build nested arrays,
 * or keep bulk strings, without end (before, 100 MB of tiny elements on the wire took
 * 1.2 GB here). */
START_TEST(test_redis_reply_budget)
{
    static const struct {
        const char *what, *arg;
        const char *says;
    } cases[] = {
        { "nested arrays of 99999 elements", "elems", "array elements" },
        { "80 bulk strings of 1 MB", "bytes", "array elements or" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int port;
        pid_t srv = fake_serve("127.0.0.1", 0, &port, answer_huge, cases[i].arg);
        ck_assert_int_gt(srv, 0);
        tutti_store_t *s;
        OK(NULL, redis_open(&s, port, 0, 4000));
        struct rusage ru0, ru1;
        getrusage(RUSAGE_SELF, &ru0);
        double t0 = now_ms();
        size_t n = 12345;
        int st = tutti_store_count(s, "", &n);
        double el = now_ms() - t0;
        getrusage(RUSAGE_SELF, &ru1);
        const char *msg = tutti_store_last_error(s);
        ck_assert_msg(st == TUTTI_ERR_PROTOCOL && strstr(msg, cases[i].says) &&
                          strstr(msg, "in all"),
                      "%s: %s: %s", cases[i].what, tutti_status_name(st), msg);
        ck_assert_msg(el < 3000, "%s: refused after %.0f ms (timeout 4000)", cases[i].what, el);
        ck_assert_uint_eq(n, 12345);
        fprintf(stderr, "reply budget, %s: refused after %.0f ms, peak RSS %ld -> %ld MB\n",
                cases[i].what, el, ru0.ru_maxrss / 1024, ru1.ru_maxrss / 1024);
        tutti_store_close(s);
        fake_stop(srv);
    }
    /* nesting beyond the limit where an array is due (SCAN), and an array where none is */
    static const char *const deep[] = { "+PONG\r\n", "*2\r\n$1\r\n0\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
                                        NULL };
    static const char *const arr[] = { "+PONG\r\n", "*2\r\n$1\r\na\r\n$1\r\nb\r\n", NULL };
    int port;
    pid_t srv = fake_serve("127.0.0.1", 0, &port, answer_script, deep);
    tutti_store_t *s;
    OK(NULL, redis_open(&s, port, 0, 2000));
    size_t n;
    EXPECT(s, tutti_store_count(s, "", &n), TUTTI_ERR_PROTOCOL);
    ck_assert_msg(strstr(tutti_store_last_error(s), "nesting"), "%s", tutti_store_last_error(s));
    tutti_store_close(s);
    fake_stop(srv);
    srv = fake_serve("127.0.0.1", 0, &port, answer_script, arr);
    OK(NULL, redis_open(&s, port, 0, 2000));
    void *v = NULL;
    EXPECT(s, tutti_store_get(s, "k", &v, NULL, 500), TUTTI_ERR_PROTOCOL);
    ck_assert_msg(strstr(tutti_store_last_error(s), "an array reply ('*2') where one of type '$'"),
                  "%s", tutti_store_last_error(s));
    ck_assert_ptr_null(v);
    tutti_store_close(s);
    fake_stop(srv);
}
END_TEST

/* A refusal that another try would meet again fails the open at once with the server's
 * words; one that says "later" is tried again until the deadline (before, all of them
 * were, and the open ended in a timeout). */
START_TEST(test_redis_refusals)
{
    static const struct {
        const char *what, *reply;
        int want;
        const char *says;
    } cases[] = {
        { "protected mode", "-DENIED Redis is running in protected mode because ...\r\n",
          TUTTI_ERR_CONFIG, "DENIED Redis is running in protected mode" },
        { "PING renamed away", "-ERR unknown command 'PING', with args beginning with: \r\n",
          TUTTI_ERR_STORE, "ERR unknown command" },
        { "a password needed", "-NOAUTH Authentication required.\r\n", TUTTI_ERR_AUTH, "NOAUTH" },
        { "a password refused", "-WRONGPASS invalid username-password pair\r\n", TUTTI_ERR_AUTH,
          "WRONGPASS" },
        { "loading its data", "-LOADING Redis is loading the dataset in memory\r\n",
          TUTTI_ERR_TIMEOUT, "LOADING" },
        { "at its client limit", "-ERR max number of clients reached\r\n", TUTTI_ERR_TIMEOUT,
          "max number of clients" },
        { "busy", "-BUSY Redis is busy running a script.\r\n", TUTTI_ERR_TIMEOUT, "BUSY" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *const script[] = { cases[i].reply, NULL };
        int port;
        pid_t srv = fake_serve("127.0.0.1", 0, &port, answer_script, script);
        ck_assert_int_gt(srv, 0);
        tutti_store_t *s = (tutti_store_t *)0x1;
        double t0 = now_ms();
        int st = redis_open(&s, port, 0, 1000);
        double el = now_ms() - t0;
        const char *msg = tutti_store_last_error(NULL);
        ck_assert_msg(st == cases[i].want && strstr(msg, cases[i].says), "%s: %s: %s",
                      cases[i].what, tutti_status_name(st), msg);
        if (st == TUTTI_ERR_TIMEOUT)
            ck_assert_msg(el >= 1000 && el < 2500, "%s: gave up after %.0f ms, not ~1000",
                          cases[i].what, el);
        else
            ck_assert_msg(el < 500, "%s: failed after %.0f ms, not at once", cases[i].what, el);
        ck_assert_ptr_eq(s, (void *)0x1);
        fake_stop(srv);
    }
    /* loading at the first connection, serving at the next: the open waits it out */
    static const char *const later[] = { "-LOADING Redis is loading the dataset\r\n|+PONG\r\n",
                                         "+OK\r\n", NULL };
    int port;
    pid_t srv = fake_serve("127.0.0.1", 0, &port, answer_script, later);
    tutti_store_t *s;
    OK(NULL, redis_open(&s, port, 0, 3000));
    OK(s, tutti_store_set(s, "k", "v", 1));
    tutti_store_close(s);
    fake_stop(srv);
}
END_TEST

/* Run fn in a child with a mount namespace of its own (so that it can bind-mount over
 * /etc files), bounded by 30 s; the child's exit code, or -1 when namespaces are not for
 * this process (then the caller skips). */
static int in_mount_ns(int (*fn)(void *), void *arg)
{
    if (geteuid() != 0)
        return -1;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(30);
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
            _exit(99);
        _exit(fn(arg));
    }
    int code = -1;
    reap_children(&pid, 1, 40000, &code);
    if (code == 99)
        return -1;
    return code < 0 ? 1000 - code : code; /* killed: 1000 + the signal */
}

/* Bind-mount a file of text over path (in the child's mount namespace): 0, or -1. */
static int bind_text(const char *path, const char *file, const char *text)
{
    FILE *f = fopen(file, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0)
        return -1;
    return mount(file, path, NULL, MS_BIND, NULL);
}

/* Rewrite file's text in place (the inode that is bind-mounted). */
static int rewrite_text(const char *file, const char *text)
{
    FILE *f = fopen(file, "r+");
    if (!f)
        return -1;
    int r = ftruncate(fileno(f), 0) == 0 && fputs(text, f) >= 0 ? 0 : -1;
    return fclose(f) == 0 ? r : -1;
}

/* A name server that takes queries on 127.0.0.213:53 and never answers. */
static int blackhole_dns(void)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(53) };
    inet_pton(AF_INET, "127.0.0.213", &a.sin_addr);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        fprintf(stderr, "blackhole dns: bind 127.0.0.213:53: %s\n", strerror(errno));
        return -1;
    }
    int tfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(tfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(tfd, (struct sockaddr *)&a, sizeof(a)) == 0)
        listen(tfd, 8); /* a TCP query is taken and never answered too */
    return fd;
}

static int dns_child(void *arg)
{
    (void)arg;
    char file[300];
    snprintf(file, sizeof(file), "%s/resolv.blackhole", g_root);
    if (blackhole_dns() < 0)
        return 2;
    if (bind_text("/etc/resolv.conf", file,
                  "nameserver 127.0.0.213\noptions timeout:5 attempts:2\n") < 0) {
        fprintf(stderr, "dns: cannot bind-mount a resolv.conf: %s\n", strerror(errno));
        return 3;
    }
    const char *urls[] = { "redis://tutti-blackhole.example.com:6379",
                           "tcp://tutti-blackhole.example.com:29500" };
    for (int i = 0; i < 2; i++) {
        tutti_store_opts_t o;
        tutti_store_opts_init(&o);
        o.timeout_ms = 1000;
        tutti_store_t *s = NULL;
        double t0 = now_ms();
        int st = tutti_store_open(&s, urls[i], &o);
        double el = now_ms() - t0;
        const char *msg = tutti_store_last_error(NULL);
        fprintf(stderr, "dns black hole, %s: %s after %.0f ms: %s\n", urls[i],
                tutti_status_name(st), el, msg);
        if (st != TUTTI_ERR_TIMEOUT || !strstr(msg, "cannot resolve tutti-blackhole.example.com"))
            return 4 + i;
        if (el < 900 || el > 2000)
            return 6 + i;
    }
    return 0;
}

/* Resolving the store's host is bounded by the store's timeout, as everything else is
 * (before, a name server that never answered held the open for resolv.conf's 5 s a try). */
START_TEST(test_store_dns_timeout)
{
    int code = in_mount_ns(dns_child, NULL);
    if (code < 0) {
        fprintf(stderr, "dns timeout: skipped (needs root and mount namespaces)\n");
        return;
    }
    ck_assert_msg(code == 0, "the child failed with %d (see its lines above)", code);
}
END_TEST

static int failover_child(void *arg)
{
    (void)arg;
    static const char *const ok[] = { "+PONG\r\n", "+OK\r\n", NULL };
    char file[300];
    snprintf(file, sizeof(file), "%s/hosts.failover", g_root);
    if (bind_text("/etc/hosts", file, "127.0.0.2 tutti-failover.test\n") < 0) {
        fprintf(stderr, "failover: cannot bind-mount a hosts file: %s\n", strerror(errno));
        return 2;
    }
    int port, port2;
    pid_t a = fake_serve("127.0.0.2", 0, &port, answer_script, ok);
    if (a < 0)
        return 3;
    char url[96];
    snprintf(url, sizeof(url), "redis://tutti-failover.test:%d", port);
    tutti_store_opts_t o;
    tutti_store_opts_init(&o);
    o.timeout_ms = 3000;
    tutti_store_t *s;
    if (tutti_store_open(&s, url, &o) != 0 || tutti_store_set(s, "k", "v", 1) != 0) {
        fprintf(stderr, "failover: first server: %s\n", tutti_store_last_error(NULL));
        return 4;
    }
    /* the server moves to another address, and the name follows it */
    fake_stop(a);
    pid_t b = fake_serve("127.0.0.3", port, &port2, answer_script, ok);
    if (b < 0 || rewrite_text(file, "127.0.0.3 tutti-failover.test\n") < 0)
        return 5;
    double t0 = now_ms();
    int st = tutti_store_set(s, "k", "v", 1);
    fprintf(stderr, "failover: set after the move: %s after %.0f ms%s%s\n", tutti_status_name(st),
            now_ms() - t0, st ? ": " : "", st ? tutti_store_last_error(s) : "");
    tutti_store_close(s);
    fake_stop(b);
    return st == 0 ? 0 : 6;
}

/* A tcp store's name that pointed at the wrong address when the client first looked it
 * up (the record not updated yet): the client looks again once a second while it waits. */
static int tcp_moved_child(void *arg)
{
    (void)arg;
    char file[300];
    snprintf(file, sizeof(file), "%s/hosts.tcpmoved", g_root);
    if (bind_text("/etc/hosts", file, "127.0.0.2 tutti-moved.test\n") < 0) {
        fprintf(stderr, "tcp moved: cannot bind-mount a hosts file: %s\n", strerror(errno));
        return 2;
    }
    tutti_store_t *srv, *s;
    if (tutti_store_open_tcp(&srv, "127.0.0.3", 0, 1, 3000) != 0)
        return 3;
    int port = tutti_store_port(srv);
    pid_t mover = fork();
    if (mover == 0) { /* the record changes 1.2 s in */
        usleep(1200000);
        _exit(rewrite_text(file, "127.0.0.3 tutti-moved.test\n") < 0 ? 1 : 0);
    }
    double t0 = now_ms();
    int st = tutti_store_open_tcp(&s, "tutti-moved.test", port, 0, 6000);
    fprintf(stderr, "tcp moved: open: %s after %.0f ms%s%s\n", tutti_status_name(st), now_ms() - t0,
            st ? ": " : "", st ? tutti_store_last_error(NULL) : "");
    int code = 0;
    waitpid(mover, &code, 0);
    if (st == 0) {
        st = tutti_store_set(s, "k", "v", 1);
        tutti_store_close(s);
    }
    tutti_store_close(srv);
    return st == 0 && code == 0 ? 0 : 4;
}

START_TEST(test_tcp_dns_moved)
{
    int code = in_mount_ns(tcp_moved_child, NULL);
    if (code < 0) {
        fprintf(stderr, "tcp moved: skipped (needs root and mount namespaces)\n");
        return;
    }
    ck_assert_msg(code == 0, "the child failed with %d (see its lines above)", code);
}
END_TEST

/* A Redis host name whose address changes (a DNS failover) is followed: the address is
 * resolved again after a connect fails (before, the first one was kept for good). */
START_TEST(test_redis_dns_failover)
{
    int code = in_mount_ns(failover_child, NULL);
    if (code < 0) {
        fprintf(stderr, "dns failover: skipped (needs root and mount namespaces)\n");
        return;
    }
    ck_assert_msg(code == 0, "the child failed with %d (see its lines above)", code);
}
END_TEST

START_TEST(test_redis_bad_servers)
{
    static char longline[70000];
    memset(longline, 'a', sizeof(longline));
    longline[0] = '+';
    static const struct {
        const char *what, *reply;
        size_t len;
        int want;
        const char *says;
    } cases[] = {
        { "an HTTP server", "HTTP/1.1 400 Bad Request\r\n\r\n", 28, TUTTI_ERR_PROTOCOL,
          "not a Redis server" },
        { "a bulk length beyond the limit", "$99999999999\r\n", 14, TUTTI_ERR_PROTOCOL,
          "bad length" },
        { "a negative array length", "*-7\r\n", 5, TUTTI_ERR_PROTOCOL, "bad length" },
        /* (nesting beyond the limit where an array is due: test_redis_reply_budget) */
        { "an array where none is due", "*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n", 20, TUTTI_ERR_PROTOCOL,
          "an array reply" },
        { "a bulk not ended by CRLF", "$3\r\nabcXY", 9, TUTTI_ERR_PROTOCOL, "CRLF" },
        { "a line with no end", longline, sizeof(longline), TUTTI_ERR_PROTOCOL, "longer than" },
        { "an integer that is not", ":12x\r\n", 6, TUTTI_ERR_PROTOCOL, "not a number" },
        { "a close before any reply", "", 0, TUTTI_ERR_STORE, "closed by the server" },
        { "a server that never answers", NULL, 0, TUTTI_ERR_TIMEOUT, "no reply" },
    };
    /* the open (with a db, so it sends SELECT) and a GET on an open handle both see it */
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int port;
        pid_t srv = fake_server(0, &port, cases[i].reply, cases[i].len);
        ck_assert_int_gt(srv, 0);
        tutti_store_t *s = (tutti_store_t *)0x1;
        double t0 = now_ms();
        int st = redis_open(&s, port, 1, 400);
        double el = now_ms() - t0;
        const char *msg = tutti_store_last_error(NULL);
        /* a closed connection is tried again until the deadline: a timeout then */
        int want = cases[i].want == TUTTI_ERR_STORE ? TUTTI_ERR_TIMEOUT : cases[i].want;
        ck_assert_msg(st == want && strstr(msg, cases[i].says), "%s: %s: %s", cases[i].what,
                      tutti_status_name(st), msg);
        ck_assert_msg(el <= 1400, "%s: open took %.0f ms (timeout 400)", cases[i].what, el);
        ck_assert_ptr_eq(s, (void *)0x1);
        fake_stop(srv);
    }
    /* a handle whose server is replaced by each of them */
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/rb%d", g_root, (int)getpid());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        pid_t rpid;
        int port = th_redis_start(dir, NULL, &rpid);
        tutti_store_t *s;
        OK(NULL, redis_open(&s, port, 0, 400));
        OK(s, tutti_store_set(s, "k", "v", 1));
        th_redis_stop(rpid);
        /* the fake takes the port over (SO_REUSEADDR; the old server is gone) */
        pid_t srv = -1;
        int fport = 0;
        for (int t = 0; t < 100 && srv < 0; t++) {
            srv = fake_server(port, &fport, cases[i].reply, cases[i].len);
            if (srv < 0)
                sleep_ms(20);
        }
        ck_assert_int_gt(srv, 0);
        void *v = (void *)0x1;
        double t0 = now_ms();
        int st = tutti_store_get(s, "k", &v, NULL, 400);
        double el = now_ms() - t0;
        const char *msg = tutti_store_last_error(s);
        /* a connection closed before the PING's answer: tried again until the deadline */
        int want = cases[i].want == TUTTI_ERR_STORE ? TUTTI_ERR_TIMEOUT : cases[i].want;
        ck_assert_msg(st == want && strstr(msg, cases[i].says) && strstr(msg, "'k'"),
                      "%s, after a real server: %s: %s", cases[i].what, tutti_status_name(st), msg);
        ck_assert_msg(el <= 1400, "%s: get took %.0f ms (timeout 400)", cases[i].what, el);
        ck_assert_ptr_eq(v, (void *)0x1);
        tutti_store_close(s);
        fake_stop(srv);
    }
}
END_TEST

/* A store timeout of 0 at open is the default on every store (before, it was "now", and
 * a Redis store could never connect); TUTTI_STORE_TIMEOUT_MS gives that default. */
START_TEST(test_store_timeout_zero)
{
    char dir[256], url[300];
    snprintf(dir, sizeof(dir), "%s/tz%d", g_root, (int)getpid());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    pid_t rpid;
    int port = th_redis_start(dir, NULL, &rpid);
    for (int env = 0; env < 2; env++) {
        if (env)
            setenv("TUTTI_STORE_TIMEOUT_MS", "1234", 1);
        else
            unsetenv("TUTTI_STORE_TIMEOUT_MS");
        int want = env ? 1234 : 30000;
        tutti_store_t *s, *srv;
        OK(NULL, redis_open(&s, port, 0, 0));
        ck_assert_int_eq(tutti_store_timeout(s), want);
        OK(s, tutti_store_set(s, "k", "v", 1));
        tutti_store_close(s);
        OK(NULL, tutti_store_open_file(&s, dir, 0));
        ck_assert_int_eq(tutti_store_timeout(s), want);
        tutti_store_close(s);
        snprintf(url, sizeof(url), "file://%s", dir);
        tutti_store_opts_t o;
        tutti_store_opts_init(&o);
        ck_assert_int_eq(o.timeout_ms, want);
        o.timeout_ms = 0;
        OK(NULL, tutti_store_open(&s, url, &o));
        ck_assert_int_eq(tutti_store_timeout(s), want);
        tutti_store_close(s);
        OK(NULL, tutti_store_open_tcp(&srv, "127.0.0.1", 0, 1, 0));
        ck_assert_int_eq(tutti_store_timeout(srv), want);
        OK(NULL, tutti_store_open_tcp(&s, "127.0.0.1", tutti_store_port(srv), 0, 0));
        ck_assert_int_eq(tutti_store_timeout(s), want);
        OK(s, tutti_store_set(s, "k", "v", 1));
        tutti_store_close(s);
        tutti_store_close(srv);
    }
    /* the variable at 0 is the default too */
    setenv("TUTTI_STORE_TIMEOUT_MS", "0", 1);
    tutti_store_opts_t o;
    tutti_store_opts_init(&o);
    ck_assert_int_eq(o.timeout_ms, 30000);
    /* negative: no deadline, by the options and by an open's 0 alike (the open gave
     * 30000) */
    setenv("TUTTI_STORE_TIMEOUT_MS", "-1", 1);
    tutti_store_opts_init(&o);
    ck_assert_int_eq(o.timeout_ms, -1);
    tutti_store_t *s;
    OK(NULL, tutti_store_open_file(&s, dir, 0));
    ck_assert_int_eq(tutti_store_timeout(s), -1);
    tutti_store_close(s);
    unsetenv("TUTTI_STORE_TIMEOUT_MS");
    th_redis_stop(rpid);
}
END_TEST

START_TEST(test_redis_server_dies)
{
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/rd%d", g_root, (int)getpid());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    /* no server yet: open waits for one until its deadline, naming the address */
    int port = th_free_port();
    tutti_store_t *s = (tutti_store_t *)0x1;
    double t0 = now_ms();
    EXPECT(NULL, redis_open(&s, port, 0, 300), TUTTI_ERR_TIMEOUT);
    double el = now_ms() - t0;
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    const char *msg = tutti_store_last_error(NULL);
    ck_assert_msg(strstr(msg, addr) && strstr(msg, strerror(ECONNREFUSED)), "%s", msg);
    ck_assert_msg(el >= 300 && el <= 1300, "gave up after %.0f ms, not ~300", el);

    /* killed while a rank waits on a key: the wait ends by its deadline, saying why */
    pid_t pid;
    port = th_redis_start(dir, NULL, &pid);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    OK(NULL, redis_open(&s, port, 0, 5000));
    OK(s, tutti_store_set(s, "there", "1", 1));
    pid_t killer = fork();
    ck_assert_int_ge(killer, 0);
    if (killer == 0) {
        usleep(200000);
        kill(pid, SIGKILL);
        _exit(0);
    }
    t0 = now_ms();
    void *v;
    int st = tutti_store_get(s, "never", &v, NULL, 1500);
    el = now_ms() - t0;
    waitpid(killer, NULL, 0);
    th_redis_stop(pid);
    msg = tutti_store_last_error(s);
    ck_assert_msg(st == TUTTI_ERR_TIMEOUT && strstr(msg, "never") && strstr(msg, addr), "%s: %s",
                  tutti_status_name(st), msg);
    ck_assert_msg(el >= 1500 && el <= 2500, "get ended after %.0f ms, not ~1500", el);
    /* counters do not go again on a lost connection */
    t0 = now_ms();
    EXPECT(s, tutti_store_add(s, "n", 1, NULL), TUTTI_ERR_TIMEOUT);
    ck_assert_msg(now_ms() - t0 <= 6000, "add took %.0f ms", now_ms() - t0);
    tutti_store_close(s);
}
END_TEST

/* Ranks of a communicator on a redis store: a real allreduce, and no key left after. */
static int redis_rank(int rank, int nranks, tutti_comm_t *unused, const char *store_dir, void *arg)
{
    (void)unused;
    (void)store_dir;
    int port = *(int *)arg;
    tutti_store_t *s;
    tutti_comm_t *comm;
    if (redis_open(&s, port, 5, 20000) != 0)
        return 10;
    int st = tutti_comm_init(&comm, s, rank, nranks, NULL);
    if (st != 0) {
        fprintf(stderr, "rank %d: init: %s\n", rank, tutti_comm_last_error(NULL));
        return 11;
    }
    enum { N = 1000 };
    double in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = rank * 1000.0 + i;
    for (int round = 0; round < 3; round++) {
        if (tutti_allreduce(comm, in, out, N, TUTTI_FP64, TUTTI_SUM) != 0)
            return 12;
        for (int i = 0; i < N; i++) {
            double want = 0;
            for (int r = 0; r < nranks; r++)
                want += r * 1000.0 + i;
            if (out[i] != want) {
                fprintf(stderr, "rank %d: out[%d] %g, want %g\n", rank, i, out[i], want);
                return 13;
            }
        }
    }
    tutti_comm_destroy(comm);
    tutti_store_close(s);
    return 0;
}

START_TEST(test_redis_collectives)
{
    char dir[256], reply[64];
    snprintf(dir, sizeof(dir), "%s/rc%d", g_root, (int)getpid());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    pid_t pid;
    int port = th_redis_start(dir, NULL, &pid);
    ck_assert_int_eq(th_run_nocomm(3, redis_rank, &port, 60000), 0);
    /* the last rank out removed the job's keys */
    redis_raw(port, "SELECT 5\r\nDBSIZE\r\n", reply, sizeof(reply));
    th_redis_stop(pid);
    ck_assert_msg(strstr(reply, "+OK\r\n:0\r\n"), "keys left in db 5: %s", reply);
}
END_TEST

static Suite *store_suite(void)
{
    Suite *s = suite_create("store");
    /* _i: 0 the file store, 1 the tcp one, 2 a redis-server */
    TCase *both = th_add_looped(s, "both", 30, 3,
                                (const TTest *const[]){
                                    test_set_get, test_get_timeout, test_add_basic,
                                    test_add_many_procs, test_compare_set, test_wait_other_process,
                                    test_check_delete, test_count, test_multi_get, test_many_keys,
                                    test_prefix, test_binary_and_keys, test_large_values,
                                    test_threads, NULL });
    tcase_add_test(both, test_args_and_urls);

    th_add_tests(s, "tcp", 30,
                 (const TTest *const[]){ test_tcp_url_and_port, test_tcp_ipv6, test_tcp_bad_clients,
                                         test_tcp_random_frames, test_tcp_timeout_no_desync,
                                         test_tcp_unreachable, test_tcp_tool, NULL });

    th_add_tests(s, "redis", 60,
                 (const TTest *const[]){ test_redis_urls, test_redis_auth, test_redis_bad_servers,
                                         test_redis_reply_budget, test_redis_refusals,
                                         test_redis_dns_failover, test_tcp_dns_moved,
                                         test_store_dns_timeout, test_store_timeout_zero,
                                         test_redis_server_dies, test_redis_collectives, NULL });

    th_add_tests(s, "file", 60,
                 (const TTest *const[]){ test_file_killed_writer, test_file_full_disk,
                                         test_file_unwritable, test_file_tmp_cleanup,
                                         test_file_other_pidns_writer, test_file_long_key_dirs,
                                         test_file_fsync_field, NULL });
    return s;
}

int main(void)
{
    return th_main_in_tmpdir(store_suite(), g_root, sizeof(g_root), "/tmp/tutti-test-store-XXXXXX",
                             0);
}
