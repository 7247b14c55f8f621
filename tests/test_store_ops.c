/* Caller-supplied stores (tutti_store_open_ops): a key-value map written here, in memory
 * shared by forked ranks under a process-shared mutex, behind the callback table; the
 * public store calls through it, communicators of 2 and 3 ranks over tcp and shm (with a
 * split) checked against a reference sum and leaving the map empty, what stays without
 * the optional garbage-collection callbacks, and callbacks that fail or time out. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tutti/tutti.h>

#include "harness.h"
#include "store_checks.h"

#define MAP_SLOTS 1024
#define MAP_KEY (TUTTI_STORE_MAX_KEY + 1)
#define MAP_VAL 4096

enum {
    CB_SET,
    CB_GET,
    CB_ADD,
    CB_CAS,
    CB_CHECK,
    CB_DEL,
    CB_WAIT,
    CB_DELPFX,
    CB_CAD,
    CB_COUNT,
    CB_CLOSE,
    NCB
};
static const char *cb_names[NCB] = { "set",          "get",           "add",
                                     "compare_set",  "check",         "del",
                                     "wait",         "delete_prefix", "compare_delete",
                                     "count_prefix", "close" };

typedef struct slot {
    int used;
    char key[MAP_KEY];
    size_t len;
    unsigned char val[MAP_VAL];
} slot_t;

/* The map, shared by the forked ranks. fail_status: every callback but close returns it
 * (after honouring its timeout when it is TUTTI_ERR_TIMEOUT), with fail_text. */
typedef struct shmap {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    int calls[NCB];
    int fail_status;
    char fail_text[128];
    char fail_check_suffix[32]; /* check of a key ending so fails (TUTTI_ERR_IO) */
    slot_t slots[MAP_SLOTS];
} shmap_t;

static shmap_t *map_new(void)
{
    shmap_t *m = th_shared_zeroed(sizeof(*m));
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&m->lock, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cv, &ca);
    pthread_condattr_destroy(&ca);
    return m;
}

static slot_t *map_find(shmap_t *m, const char *key)
{
    for (int i = 0; i < MAP_SLOTS; i++)
        if (m->slots[i].used && !strcmp(m->slots[i].key, key))
            return &m->slots[i];
    return NULL;
}

static int map_used(shmap_t *m)
{
    int n = 0;
    for (int i = 0; i < MAP_SLOTS; i++)
        n += m->slots[i].used;
    return n;
}

/* Lock the map and count the call; a failure the test asked for comes back as nonzero. */
static int map_enter(shmap_t *m, int cb, int timeout_ms, char *errbuf, size_t errlen)
{
    pthread_mutex_lock(&m->lock);
    m->calls[cb]++;
    int st = m->fail_status;
    if (!st)
        return 0;
    snprintf(errbuf, errlen, "%s (%s, timeout %d ms)", m->fail_text, cb_names[cb], timeout_ms);
    pthread_mutex_unlock(&m->lock);
    if (st == TUTTI_ERR_TIMEOUT && timeout_ms > 0)
        th_sleep_ms(timeout_ms);
    return st;
}

static int map_put(shmap_t *m, const char *key, const void *v, size_t len, char *errbuf,
                   size_t errlen)
{
    if (len > MAP_VAL) {
        snprintf(errbuf, errlen, "value of %zu bytes: the test map holds %d", len, MAP_VAL);
        return TUTTI_ERR_INVALID_ARG;
    }
    slot_t *s = map_find(m, key);
    for (int i = 0; !s && i < MAP_SLOTS; i++)
        if (!m->slots[i].used)
            s = &m->slots[i];
    if (!s) {
        snprintf(errbuf, errlen, "the test map is full");
        return TUTTI_ERR_NOMEM;
    }
    s->used = 1;
    snprintf(s->key, sizeof(s->key), "%s", key);
    memcpy(s->val, v, len);
    s->len = len;
    pthread_cond_broadcast(&m->cv);
    return TUTTI_OK;
}

static void *dup_val(const slot_t *s)
{
    void *v = malloc(s && s->len ? s->len : 1);
    if (s)
        memcpy(v, s->val, s->len);
    return v;
}

/* Wait (the lock held) until every key exists or timeout_ms passes. */
static int map_wait_keys(shmap_t *m, const char *const *keys, size_t n, int timeout_ms,
                         char *errbuf, size_t errlen)
{
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    long long ns = (long long)dl.tv_nsec + (long long)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000;
    dl.tv_sec += (time_t)(ns / 1000000000);
    dl.tv_nsec = (long)(ns % 1000000000);
    for (size_t i = 0; i < n; i++) {
        while (!map_find(m, keys[i])) {
            int e = timeout_ms < 0    ? pthread_cond_wait(&m->cv, &m->lock)
                    : timeout_ms == 0 ? ETIMEDOUT
                                      : pthread_cond_timedwait(&m->cv, &m->lock, &dl);
            if (e == ETIMEDOUT && !map_find(m, keys[i])) {
                snprintf(errbuf, errlen, "test map: no key %s after %d ms", keys[i], timeout_ms);
                return TUTTI_ERR_TIMEOUT;
            }
        }
    }
    return TUTTI_OK;
}

static int cb_set(void *ctx, const char *key, const void *value, size_t len, int timeout_ms,
                  char *errbuf, size_t errlen)
{
    shmap_t *m = ctx;
    int st = map_enter(m, CB_SET, timeout_ms, errbuf, errlen);
    if (st)
        return st;
    st = map_put(m, key, value, len, errbuf, errlen);
    pthread_mutex_unlock(&m->lock);
    return st;
}

/* get (value_p: a copy of the one key's value) and wait: until the keys exist. */
static int map_fetch(shmap_t *m, int cb, const char *const *keys, size_t n, void **value_p,
                     size_t *len_p, int timeout_ms, char *errbuf, size_t errlen)
{
    int st = map_enter(m, cb, timeout_ms, errbuf, errlen);
    if (!st) {
        st = map_wait_keys(m, keys, n, timeout_ms, errbuf, errlen);
        slot_t *s = map_find(m, keys[0]);
        if (!st && value_p) {
            *value_p = dup_val(s);
            *len_p = s->len;
        }
        pthread_mutex_unlock(&m->lock);
    }
    return st;
}

static int cb_get(void *ctx, const char *key, void **value_p, size_t *len_p, int timeout_ms,
                  char *errbuf, size_t errlen)
{
    return map_fetch(ctx, CB_GET, &key, 1, value_p, len_p, timeout_ms, errbuf, errlen);
}

static int cb_add(void *ctx, const char *key, int64_t delta, int64_t *result_p, int timeout_ms,
                  char *errbuf, size_t errlen)
{
    shmap_t *m = ctx;
    int st = map_enter(m, CB_ADD, timeout_ms, errbuf, errlen);
    if (st)
        return st;
    slot_t *s = map_find(m, key);
    char buf[32];
    snprintf(buf, sizeof(buf), "%.*s", s ? (int)(s->len < 31 ? s->len : 31) : 0,
             s ? (char *)s->val : "");
    int64_t v = strtoll(buf, NULL, 10) + delta;
    int n = snprintf(buf, sizeof(buf), "%" PRId64, v);
    st = map_put(m, key, buf, (size_t)n, errbuf, errlen);
    pthread_mutex_unlock(&m->lock);
    *result_p = v;
    return st;
}

static int cb_cas(void *ctx, const char *key, const void *expected, size_t elen,
                  const void *desired, size_t dlen, void **current_p, size_t *curlen_p,
                  int timeout_ms, char *errbuf, size_t errlen)
{
    shmap_t *m = ctx;
    int st = map_enter(m, CB_CAS, timeout_ms, errbuf, errlen);
    if (st)
        return st;
    slot_t *s = map_find(m, key);
    int match = s ? s->len == elen && !memcmp(s->val, expected, elen) : elen == 0;
    if (match)
        st = map_put(m, key, desired, dlen, errbuf, errlen);
    s = map_find(m, key);
    *current_p = dup_val(s);
    *curlen_p = s ? s->len : 0;
    pthread_mutex_unlock(&m->lock);
    return st;
}

/* check (keys: how many of them exist) and delete_prefix (prefix: delete the keys under
 * it, how many). */
static int map_scan(shmap_t *m, int cb, const char *const *keys, size_t n, const char *prefix,
                    size_t *count_p, int timeout_ms, char *errbuf, size_t errlen)
{
    int st = map_enter(m, cb, timeout_ms, errbuf, errlen);
    if (st)
        return st;
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        size_t kl = strlen(keys[i]), sl = strlen(m->fail_check_suffix);
        if (sl && kl >= sl && !strcmp(keys[i] + kl - sl, m->fail_check_suffix)) {
            pthread_mutex_unlock(&m->lock);
            snprintf(errbuf, errlen, "checking %s fails here", keys[i]);
            return TUTTI_ERR_IO;
        }
        count += map_find(m, keys[i]) != NULL;
    }
    for (int i = 0; prefix && i < MAP_SLOTS; i++) {
        slot_t *s = &m->slots[i];
        if (s->used && !strncmp(s->key, prefix, strlen(prefix)))
            count += cb == CB_COUNT ? 1 : s->used--;
    }
    pthread_mutex_unlock(&m->lock);
    *count_p = count;
    return TUTTI_OK;
}

static int cb_check(void *ctx, const char *const *keys, size_t n, int *exists_p, int timeout_ms,
                    char *errbuf, size_t errlen)
{
    size_t found = 0;
    int st = map_scan(ctx, CB_CHECK, keys, n, NULL, &found, timeout_ms, errbuf, errlen);
    *exists_p = found == n;
    return st;
}

/* Delete key if it exists and (with expected) has that value. */
static int map_del(shmap_t *m, int cb, const char *key, const void *expected, size_t elen,
                   int *deleted_p, int timeout_ms, char *errbuf, size_t errlen)
{
    int st = map_enter(m, cb, timeout_ms, errbuf, errlen);
    if (st)
        return st;
    slot_t *s = map_find(m, key);
    if (s && expected && (s->len != elen || memcmp(s->val, expected, elen)))
        s = NULL;
    if (s)
        s->used = 0;
    pthread_mutex_unlock(&m->lock);
    if (deleted_p)
        *deleted_p = s != NULL;
    return TUTTI_OK;
}

static int cb_del(void *ctx, const char *key, int *deleted_p, int timeout_ms, char *errbuf,
                  size_t errlen)
{
    return map_del(ctx, CB_DEL, key, NULL, 0, deleted_p, timeout_ms, errbuf, errlen);
}

static int cb_cad(void *ctx, const char *key, const void *expected, size_t elen, int *deleted_p,
                  int timeout_ms, char *errbuf, size_t errlen)
{
    return map_del(ctx, CB_CAD, key, expected ? expected : "", elen, deleted_p, timeout_ms, errbuf,
                   errlen);
}

static int cb_wait(void *ctx, const char *const *keys, size_t n, int timeout_ms, char *errbuf,
                   size_t errlen)
{
    return map_fetch(ctx, CB_WAIT, keys, n, NULL, NULL, timeout_ms, errbuf, errlen);
}

static int cb_delete_prefix(void *ctx, const char *prefix, size_t *count_p, int timeout_ms,
                            char *errbuf, size_t errlen)
{
    return map_scan(ctx, CB_DELPFX, NULL, 0, prefix, count_p, timeout_ms, errbuf, errlen);
}

static int cb_count_prefix(void *ctx, const char *prefix, size_t *count_p, int timeout_ms,
                           char *errbuf, size_t errlen)
{
    return map_scan(ctx, CB_COUNT, NULL, 0, prefix, count_p, timeout_ms, errbuf, errlen);
}

static void cb_close(void *ctx)
{
    shmap_t *m = ctx;
    pthread_mutex_lock(&m->lock);
    m->calls[CB_CLOSE]++;
    pthread_mutex_unlock(&m->lock);
}

/* The whole table; gc 0 leaves out the optional clean-up callbacks. */
static tutti_store_ops_t map_ops(int gc)
{
    return (tutti_store_ops_t){
        .size = sizeof(tutti_store_ops_t),
        .set = cb_set,
        .get = cb_get,
        .add = cb_add,
        .compare_set = cb_cas,
        .check = cb_check,
        .del = cb_del,
        .wait = cb_wait,
        .delete_prefix = gc ? cb_delete_prefix : NULL,
        .compare_delete = gc ? cb_cad : NULL,
        .close = cb_close,
        .count_prefix = gc ? cb_count_prefix : NULL,
    };
}

static int contains(const char *hay, const char *needle)
{
    return strstr(hay, needle) != NULL;
}

/* ---- the store calls ---- */

START_TEST(calls_reach_the_map)
{
    shmap_t *m = map_new();
    tutti_store_ops_t ops = map_ops(1);
    tutti_store_t *base, *s;
    OK(NULL, tutti_store_open_ops(&base, &ops, m, "testmap"));
    ck_assert_str_eq(tutti_store_url(base), "ops://testmap");
    OK(base, tutti_store_open_prefixed(&s, base, "view/"));
    OK(s, tutti_store_set(s, "a", "hello", 5));
    slot_t *a = map_find(m, "view/a");
    ck_assert_msg(a && a->len == 5 && !memcmp(a->val, "hello", 5), "set did not reach the map");
    void *v;
    size_t len;
    OK(s, tutti_store_get(s, "a", &v, &len, 1000));
    ck_assert_uint_eq(len, 5);
    ck_assert_str_eq(v, "hello"); /* the NUL byte after the value */
    free(v);
    int64_t r;
    OK(s, tutti_store_add(s, "n", 40, &r));
    OK(s, tutti_store_add(s, "n", 2, &r));
    ck_assert_int_eq(r, 42);
    ck_assert_int_eq(strtoll((char *)map_find(m, "view/n")->val, NULL, 10), 42);
    OK(s, tutti_store_compare_set(s, "c", "", 0, "one", 3, &v, &len));
    ck_assert(len == 3 && !memcmp(v, "one", 3));
    free(v);
    OK(s, tutti_store_compare_set(s, "c", "two", 3, "three", 5, &v, &len));
    ck_assert(len == 3 && !memcmp(v, "one", 3)); /* no match: unchanged */
    free(v);
    const char *keys[] = { "a", "c", "missing" };
    int exists = -1;
    OK(s, tutti_store_check(s, keys, 2, &exists));
    ck_assert_int_eq(exists, 1);
    OK(s, tutti_store_check(s, keys, 3, &exists));
    ck_assert_int_eq(exists, 0);
    OK(s, tutti_store_wait(s, keys, 2, 1000));
    void *vals[2];
    size_t lens[2];
    OK(s, tutti_store_multi_get(s, keys, 2, vals, lens, 1000));
    ck_assert(lens[0] == 5 && lens[1] == 3 && !memcmp(vals[1], "one", 3));
    free(vals[0]);
    free(vals[1]);
    int deleted = -1;
    OK(s, tutti_store_delete(s, "a", &deleted));
    ck_assert_int_eq(deleted, 1);
    ck_assert_ptr_null(map_find(m, "view/a"));
    OK(s, tutti_store_delete(s, "a", &deleted));
    ck_assert_int_eq(deleted, 0);
    /* left in the view: n and c; the base store counts them under the view's prefix */
    OK(base, tutti_store_set(base, "elsewhere", "x", 1));
    size_t count = 0;
    OK(s, tutti_store_count(s, "", &count));
    ck_assert_uint_eq(count, 2);
    OK(base, tutti_store_count(base, "view/", &count));
    ck_assert_uint_eq(count, 2);
    OK(base, tutti_store_count(base, NULL, &count));
    ck_assert_uint_eq(count, 3);
    ck_assert_uint_eq(m->calls[CB_COUNT], 3);
    ck_assert_ptr_nonnull(map_find(m, "view/n")); /* counted, not deleted */
    for (int cb = 0; cb < CB_DELPFX; cb++)
        ck_assert_msg(m->calls[cb] > 0, "the %s callback was never called", cb_names[cb]);
    tutti_store_close(s);
    ck_assert_int_eq(m->calls[CB_CLOSE], 0); /* a view's close is not the store's */
    tutti_store_close(base);
    ck_assert_int_eq(m->calls[CB_CLOSE], 1);
    /* no count_prefix, or a table of the size before it: counting is refused, saying so */
    for (int old = 0; old < 2; old++) {
        tutti_store_ops_t o = map_ops(old);
        if (old)
            o.size = offsetof(tutti_store_ops_t, count_prefix);
        OK(NULL, tutti_store_open_ops(&base, &o, m, "nocount"));
        EXPECT(base, tutti_store_count(base, "", &count), TUTTI_ERR_UNSUPPORTED);
        ck_assert_msg(contains(tutti_store_last_error(base), "cannot count its keys"), "%s",
                      tutti_store_last_error(base));
        tutti_store_close(base);
    }
    ck_assert_uint_eq(m->calls[CB_COUNT], 3);
}
END_TEST

/* A get that cannot be answered ends at its timeout, with the map's own words. */
START_TEST(timeout_is_honoured_and_explained)
{
    shmap_t *m = map_new();
    tutti_store_ops_t ops = map_ops(1);
    tutti_store_t *s;
    OK(NULL, tutti_store_open_ops(&s, &ops, m, "testmap"));
    void *v = NULL;
    double t0 = th_now_ms();
    EXPECT(s, tutti_store_get(s, "nobody", &v, NULL, 300), TUTTI_ERR_TIMEOUT);
    double took = th_now_ms() - t0;
    ck_assert_msg(took >= 250 && took < 2000, "get with a 300 ms timeout took %.0f ms", took);
    const char *e = tutti_store_last_error(s);
    ck_assert_msg(contains(e, "ops://testmap") && contains(e, "test map: no key nobody") &&
                      contains(e, "TUTTI_ERR_TIMEOUT"),
                  "%s", e);
    tutti_store_close(s);
}
END_TEST

static int cb_not_a_status(void *ctx, const char *key, const void *value, size_t len,
                           int timeout_ms, char *errbuf, size_t errlen)
{
    (void)ctx, (void)key, (void)value, (void)len, (void)timeout_ms, (void)errbuf, (void)errlen;
    return 7;
}

START_TEST(bad_tables_and_statuses)
{
    shmap_t *m = map_new();
    tutti_store_ops_t ops = map_ops(1);
    tutti_store_t *s = NULL;
    ops.add = NULL;
    EXPECT(NULL, tutti_store_open_ops(&s, &ops, m, "t"), TUTTI_ERR_INVALID_ARG);
    ck_assert_msg(contains(tutti_store_last_error(NULL), "add is NULL"), "%s",
                  tutti_store_last_error(NULL));
    ops = map_ops(1);
    ops.size = 8;
    EXPECT(NULL, tutti_store_open_ops(&s, &ops, m, "t"), TUTTI_ERR_INVALID_ARG);
    ck_assert_msg(contains(tutti_store_last_error(NULL), "ops->size is 8"), "%s",
                  tutti_store_last_error(NULL));
    ops = map_ops(1);
    ops.set = cb_not_a_status;
    OK(NULL, tutti_store_open_ops(&s, &ops, m, NULL));
    ck_assert_str_eq(tutti_store_url(s), "ops://store");
    EXPECT(s, tutti_store_set(s, "k", "v", 1), TUTTI_ERR_STORE);
    ck_assert_msg(contains(tutti_store_last_error(s), "returned 7, which is not a tutti status"),
                  "%s", tutti_store_last_error(s));
    m->fail_status = TUTTI_ERR_IO;
    snprintf(m->fail_text, sizeof(m->fail_text), "backend unreachable");
    EXPECT(s, tutti_store_add(s, "k", 1, NULL), TUTTI_ERR_IO);
    ck_assert_msg(contains(tutti_store_last_error(s), "add callback: backend unreachable"), "%s",
                  tutti_store_last_error(s));
    tutti_store_close(s);
    ck_assert_int_eq(m->calls[CB_CLOSE], 1);
}
END_TEST

/* Callbacks that hand back a value (1 MiB, malloc'ed) and then fail: the library owns what
 * they left in *value_p and frees it (before, it leaked). */
static int cb_get_then_fail(void *ctx, const char *key, void **value_p, size_t *len_p,
                            int timeout_ms, char *errbuf, size_t errlen)
{
    (void)ctx, (void)key, (void)timeout_ms;
    *value_p = malloc(1u << 20);
    memset(*value_p, 1, 1u << 20);
    *len_p = 1u << 20;
    snprintf(errbuf, errlen, "lost the backend after reading");
    return TUTTI_ERR_IO;
}

static int cb_cas_then_not_a_status(void *ctx, const char *key, const void *expected, size_t elen,
                                    const void *desired, size_t dlen, void **current_p,
                                    size_t *curlen_p, int timeout_ms, char *errbuf, size_t errlen)
{
    (void)ctx, (void)key, (void)expected, (void)elen, (void)desired, (void)dlen;
    (void)timeout_ms, (void)errbuf, (void)errlen;
    *current_p = malloc(1u << 20);
    memset(*current_p, 1, 1u << 20);
    *curlen_p = 1u << 20;
    return 3;
}

static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

START_TEST(failed_callbacks_values_are_freed)
{
    shmap_t *m = map_new();
    tutti_store_ops_t ops = map_ops(1);
    ops.get = cb_get_then_fail;
    ops.compare_set = cb_cas_then_not_a_status;
    tutti_store_t *s;
    OK(NULL, tutti_store_open_ops(&s, &ops, m, "leaky"));
    void *v = (void *)0x1;
    size_t len = 7;
    EXPECT(s, tutti_store_get(s, "k", &v, &len, 100), TUTTI_ERR_IO); /* warm up */
    size_t before = heap_in_use();
    for (int i = 0; i < 32; i++) {
        EXPECT(s, tutti_store_get(s, "k", &v, &len, 100), TUTTI_ERR_IO);
        EXPECT(s, tutti_store_compare_set(s, "k", "a", 1, "b", 1, &v, &len), TUTTI_ERR_STORE);
    }
    size_t after = heap_in_use();
    ck_assert_ptr_eq(v, (void *)0x1);
    ck_assert_uint_eq(len, 7);
    ck_assert_msg(after < before + (4u << 20), "heap grew by %zu KiB over 64 failed calls",
                  (after - before) >> 10);
    tutti_store_close(s);
}
END_TEST

/* ---- communicators ---- */

typedef struct job {
    shmap_t *map;
    int gc;                /* the table has the clean-up callbacks */
    const char *transport; /* "tcp" or "shm" */
} job_t;

static int open_map(int rank, const job_t *j, tutti_store_t **s_p)
{
    tutti_store_ops_t ops = map_ops(j->gc);
    int st = tutti_store_open_ops(s_p, &ops, j->map, "testmap");
    FAIL_IF(st, "open: %s", tutti_store_last_error(NULL));
    return 0;
}

/* An allreduce on comm of (r + 1) * (i + 1) from each rank r of the nparent ranks of its
 * parent that have rank's parity (every one of them when parity is 0), against the same
 * sum added up here. */
static int check_allreduce(int rank, tutti_comm_t *comm, int nparent, int parity)
{
    enum { COUNT = 3000 };
    int64_t *buf = malloc(COUNT * sizeof(*buf)), *want = calloc(COUNT, sizeof(*want));
    for (int i = 0; i < COUNT; i++) {
        buf[i] = (int64_t)(rank + 1) * (i + 1);
        for (int r = 0; r < nparent; r++)
            want[i] += !parity || r % 2 == rank % 2 ? (int64_t)(r + 1) * (i + 1) : 0;
    }
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, buf, COUNT, TUTTI_INT64, TUTTI_SUM);
    int same = !memcmp(buf, want, COUNT * sizeof(*buf));
    free(buf);
    free(want);
    FAIL_IF(st, "allreduce: %s", tutti_comm_last_error(comm));
    FAIL_IF(!same, "allreduce: wrong sums");
    return 0;
}

/* init over the map, an allreduce, a split by parity with an allreduce on each half, and
 * destroy (the parent first on the odd ranks). */
static int rank_job(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused, (void)dir;
    const job_t *j = arg;
    tutti_store_t *s;
    if (open_map(rank, j, &s))
        return 1;
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.transport = j->transport;
    o.timeout_ms = 10000;
    tutti_comm_t *comm = NULL, *half = NULL;
    int st = tutti_comm_init(&comm, s, rank, nranks, &o);
    FAIL_IF(st, "init over %s: %s", j->transport, tutti_status_name(st));
    FAIL_IF(strcmp(tutti_comm_transport(comm), j->transport), "transport %s",
            tutti_comm_transport(comm));
    if (check_allreduce(rank, comm, nranks, 0))
        return 1;
    st = tutti_comm_split(comm, rank % 2, rank, &half);
    FAIL_IF(st, "split: %s", tutti_comm_last_error(comm));
    if (check_allreduce(rank, half, nranks, 1))
        return 1;
    if (rank % 2)
        tutti_comm_destroy(comm);
    tutti_comm_destroy(half);
    if (rank % 2 == 0)
        tutti_comm_destroy(comm);
    tutti_store_close(s);
    return 0;
}

/* With the clean-up callbacks, nothing stays; every callback the library needs ran. */
static void run_job(int nranks, const char *transport)
{
    job_t j = { .map = map_new(), .gc = 1, .transport = transport };
    ck_assert_int_eq(th_run_nocomm(nranks, rank_job, &j, 60000), 0);
    ck_assert_msg(map_used(j.map) == 0, "%d keys left, e.g. %s", map_used(j.map),
                  j.map->slots[0].used ? j.map->slots[0].key : "(not slot 0)");
    int need[] = { CB_SET, CB_GET, CB_ADD, CB_CAS, CB_CHECK, CB_DELPFX, CB_CAD, CB_CLOSE };
    for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++)
        ck_assert_msg(j.map->calls[need[i]] > 0, "%s never called", cb_names[need[i]]);
    ck_assert_int_eq(j.map->calls[CB_CLOSE], nranks);
}

START_TEST(comm_2_tcp)
{
    run_job(2, "tcp");
}
END_TEST

START_TEST(comm_3_tcp)
{
    run_job(3, "tcp");
}
END_TEST

START_TEST(comm_2_shm)
{
    run_job(2, "shm");
}
END_TEST

START_TEST(comm_3_shm)
{
    run_job(3, "shm");
}
END_TEST

/* The length of a nonce (16 hex digits) at s, else 0. */
static size_t nonce_at(const char *s)
{
    for (int i = 0; i < 16; i++)
        if (!s[i] || !strchr("0123456789abcdef", s[i]))
            return 0;
    return 16;
}

/* Without them, what stays is what the header says: the emptied instance records, and
 * keys under "<base><nonce>/" (the world's instance) and, for the split's halves, under
 * "<base><nonce>-split0-<color>/<their nonce>/". */
START_TEST(without_gc_callbacks_keys_stay_where_promised)
{
    job_t j = { .map = map_new(), .gc = 0, .transport = "tcp" };
    ck_assert_int_eq(th_run_nocomm(2, rank_job, &j, 60000), 0);
    const char *base = NULL; /* the world's record: the shortest "...instance" */
    for (int i = 0; i < MAP_SLOTS; i++) {
        slot_t *s = &j.map->slots[i];
        size_t n = strlen(s->key);
        if (s->used && n > 8 && !strcmp(s->key + n - 8, "instance") && (!base || n < strlen(base)))
            base = s->key;
    }
    ck_assert_msg(base, "no instance record left for the world");
    size_t blen = strlen(base) - 8;
    int records = 0, keys = 0;
    for (int i = 0; i < MAP_SLOTS; i++) {
        slot_t *s = &j.map->slots[i];
        if (!s->used)
            continue;
        ck_assert_msg(!strncmp(s->key, base, blen), "key %s outside %.*s", s->key, (int)blen, base);
        const char *rest = s->key + blen;
        if (nonce_at(rest) && !strncmp(rest + 16, "-split0-", 8) &&
            (rest[24] == '0' || rest[24] == '1') && rest[25] == '/')
            rest += 26; /* a half's key space */
        if (!strcmp(rest, "instance")) {
            ck_assert_msg(s->len == 0, "record %s not emptied", s->key);
            records++;
            continue;
        }
        ck_assert_msg(nonce_at(rest) && rest[16] == '/' && rest[17], "key %s not under an instance",
                      s->key);
        keys++;
    }
    ck_assert_int_eq(records, 3); /* the world's and the two halves' */
    ck_assert_int_gt(keys, 0);
    ck_assert_int_eq(j.map->calls[CB_DELPFX] + j.map->calls[CB_CAD], 0);
}
END_TEST

/* tutti_comm_init expected to fail, with what it writes on stderr captured into text
 * (a file in dir) and its duration in *took_ms. Returns its status, or 1 when stderr
 * could not be redirected. */
static int init_captured(tutti_store_t *s, int rank, int nranks, const tutti_comm_opts_t *o,
                         const char *dir, char *text, size_t len, double *took_ms)
{
    char log[512];
    snprintf(log, sizeof(log), "%s/stderr.%d", dir, rank);
    int fd = open(log, O_CREAT | O_TRUNC | O_RDWR, 0600), saved = dup(2);
    FAIL_IF(fd < 0 || saved < 0, "cannot redirect stderr");
    dup2(fd, 2);
    tutti_comm_t *comm = NULL;
    double t0 = th_now_ms();
    int st = tutti_comm_init(&comm, s, rank, nranks, o);
    *took_ms = th_now_ms() - t0;
    dup2(saved, 2);
    close(saved);
    ssize_t n = pread(fd, text, len - 1, 0);
    text[n > 0 ? n : 0] = '\0';
    close(fd);
    if (st == 0)
        tutti_comm_destroy(comm);
    return st;
}

/* A store that fails every call: init fails with the store's label and the callback's
 * words, in the status and on stderr (the communicator's error message), within its
 * bounds when the failure is a timeout. */
static int rank_broken(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    job_t *j = arg;
    tutti_store_t *s;
    if (open_map(rank, j, &s))
        return 1;
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 1500;
    char text[8192] = "";
    double took;
    int st = init_captured(s, rank, nranks, &o, dir, text, sizeof(text), &took);
    FAIL_IF(st != j->map->fail_status, "init: %s, wanted %s", tutti_status_name(st),
            tutti_status_name(j->map->fail_status));
    FAIL_IF(took > 1500 + 3000, "init took %.0f ms with a timeout of 1500", took);
    FAIL_IF(!contains(text, "ops://testmap") || !contains(text, "callback: it is down"),
            "the error does not name the store and the cause: %s", text);
    tutti_store_close(s);
    return 0;
}

static void run_broken(int status)
{
    job_t j = { .map = map_new(), .gc = 1, .transport = "tcp" };
    j.map->fail_status = status;
    snprintf(j.map->fail_text, sizeof(j.map->fail_text), "it is down");
    ck_assert_int_eq(th_run_nocomm(2, rank_broken, &j, 30000), 0);
}

START_TEST(failing_callbacks_name_the_store)
{
    run_broken(TUTTI_ERR_IO);
}
END_TEST

START_TEST(timing_out_callbacks_name_the_store)
{
    run_broken(TUTTI_ERR_TIMEOUT);
}
END_TEST

/* Rank 0 meets another host's job instance, still starting, in the record, and a store
 * that answers the swap (with that record) but not the check of the record: it cannot
 * tell whether the record changed meanwhile. It must give up by its timeout, saying so,
 * not ask again for ever (it once did: that path skipped the deadline). */
static int rank_unreadable_record(int rank, int nranks, tutti_comm_t *unused, const char *dir,
                                  void *arg)
{
    (void)unused;
    job_t *j = arg;
    unsetenv("TUTTI_JOB_ID"); /* the record's key: tutti/comm0/instance */
    tutti_store_t *s;
    if (open_map(rank, j, &s))
        return 1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char rec[256]; /* lib/core/job.c's format: another host's rank 0, created just now */
    int n = snprintf(rec, sizeof(rec),
                     "tutti-instance 6 %s 0123456789abcdef 2 4242 1 1 %lld 60000 tcp,tcp "
                     "1048576 - - elsewhere/x",
                     tutti_version_string(), (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
    FAIL_IF(tutti_store_set(s, "tutti/comm0/instance", rec, (size_t)n + 1) != 0, "record");
    snprintf(j->map->fail_check_suffix, sizeof(j->map->fail_check_suffix), "/instance");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 1500;
    o.transport = "tcp";
    char text[8192] = "";
    double took;
    int st = init_captured(s, rank, nranks, &o, dir, text, sizeof(text), &took);
    FAIL_IF(st != TUTTI_ERR_TIMEOUT, "init: %s, wanted TUTTI_ERR_TIMEOUT", tutti_status_name(st));
    FAIL_IF(took > 1500 + 3000, "init took %.0f ms with a timeout of 1500", took);
    FAIL_IF(!contains(text, "could not take the job record over") ||
                !contains(text, "0123456789abcdef"),
            "the error does not say what happened: %s", text);
    tutti_store_close(s);
    return 0;
}

START_TEST(unreadable_record_is_bounded)
{
    job_t j = { .map = map_new(), .gc = 1, .transport = "tcp" };
    ck_assert_int_eq(th_run_nocomm(1, rank_unreadable_record, &j, 20000), 0);
}
END_TEST

TH_CASES_MAIN("store_ops", 120, TH_CASE(calls_reach_the_map, 1),
              TH_CASE(timeout_is_honoured_and_explained, 1), TH_CASE(bad_tables_and_statuses, 1),
              TH_CASE(comm_2_tcp, 1), TH_CASE(comm_3_tcp, 1), TH_CASE(comm_2_shm, 1),
              TH_CASE(comm_3_shm, 1), TH_CASE(without_gc_callbacks_keys_stay_where_promised, 1),
              TH_CASE(failing_callbacks_name_the_store, 1),
              TH_CASE(timing_out_callbacks_name_the_store, 1),
              TH_CASE(unreadable_record_is_bounded, 1),
              TH_CASE(failed_callbacks_values_are_freed, 1))
