/* TCP store server: a libuv loop in a thread of its own, holding the keys in a hash table.
 * Design notes: docs/internals.md, "The TCP store server". */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uv.h>

#include "base/auth.h"
#include "store/store_impl.h"

#define SRV_READ_CHUNK 65536u
#define SRV_HELLO_MS 10000
#define SRV_HELLO_GRACE_MS 1000
#define SRV_STALL_GRACE_MS 1000 /* replies unread this long: evictable */
#define SRV_ACCEPT_PAUSE_MS 100
#define SRV_ACCEPT_BURST 64
#define SRV_WARN_EVERY_MS 10000
#define SRV_MAX_LISTEN 8 /* addresses of one host name */

typedef struct srv_conn srv_conn_t;
typedef struct srv_waiter srv_waiter_t;
typedef struct srv_entry srv_entry_t;

/* A stored value, shared by the entry and the replies being written. One that the entry
 * let go of (replaced, deleted) while replies still hold it is pinned: counted in
 * srv->pinned, against the memory limit, until the last of them is written. */
typedef struct srv_value {
    unsigned refs;
    int pinned;
    size_t len;
    char data[];
} srv_value_t;

typedef struct srv_link {
    srv_waiter_t *w;
    srv_entry_t *entry;           /* NULL once the key was set */
    struct srv_link *prev, *next; /* in entry->waiters */
} srv_link_t;

struct srv_entry {
    srv_entry_t *next; /* bucket chain */
    uint32_t hash;
    char *key;
    size_t keylen;
    srv_value_t *value; /* NULL: no value, only waiters */
    srv_link_t *waiters;
};

struct srv_waiter {
    srv_conn_t *conn;
    srv_entry_t *get_entry; /* GET: reply with this entry's value */
    size_t charge;          /* bytes counted in srv->buffered for it */
    size_t remaining;
    size_t nlinks;
    srv_link_t links[];
};

enum { SRV_HELLO, SRV_AUTH, SRV_READY };

struct srv_conn {
    uv_tcp_t tcp;
    tt_store_server_t *srv;
    char peer[80];
    int state;
    uint8_t challenge[TT_AUTH_CHALLENGE_LEN]; /* ours, answered by the client's AUTH */
    char *buf;                                /* input; freed whenever it is empty */
    size_t len, cap;
    size_t discard; /* bytes of a refused frame still to read and drop */
    int discard_status;
    char discard_msg[200];
    size_t reply_bytes; /* copied bytes of replies being written */
    srv_waiter_t *waiter;
    int writes_pending;
    uint64_t last_sent; /* uv_now: replies last moved (or the first was queued) */
    size_t unsent_seen; /* srv_unsent when last looked at */
    int reading;
    int closing;
    int close_after_write;       /* the reply being written is the last */
    uint64_t since, last_active; /* uv_now: accepted; last byte read or reply written */
    srv_conn_t *prev, *next;
};

typedef struct srv_write {
    uv_write_t req;
    srv_conn_t *conn;
    srv_value_t *value; /* a shared value sent, or NULL */
    size_t owned;       /* bytes of data[] */
    unsigned char head[5];
    char data[];
} srv_write_t;

struct tt_store_server {
    uv_loop_t loop;
    /* one listener per address of the host (localhost: 127.0.0.1 and ::1), so that
     * every spelling of the host reaches this server and no second one takes the port */
    int listen_fd[SRV_MAX_LISTEN];
    uv_poll_t listen_poll[SRV_MAX_LISTEN];
    int nlisten;
    uv_timer_t sweep_timer;  /* hello and idle timeouts */
    uv_timer_t accept_timer; /* resumes accepting after a pause */
    uv_timer_t drain_timer;  /* ends the drain at stop */
    uv_async_t stop_async;
    pthread_t thread;
    pid_t pid;
    char addr[96];
    tt_store_tcp_cfg_t cfg; /* strings owned */
    char *secret;
    char *instance;
    int max_conns;
    int hello_ms;
    uint8_t id[TT_STORE_ID_LEN];
    int reserve_fd; /* spent to turn a client away when fds run out */
    int listening;
    int stopping, finished;
    srv_conn_t *conns;
    size_t nconns;   /* in the list, closing ones included */
    size_t nopen;    /* not closing: what the limit counts */
    size_t buffered; /* input buffers, copied replies and waiters of all conns */
    size_t pinned;   /* bytes of values only replies being written hold (srv_value_t) */
    uint64_t last_warn;
    size_t evicted, turned_away; /* since the last warning */
    srv_entry_t **buckets;
    size_t nbuckets, nentries;
    char scratch[SRV_READ_CHUNK]; /* where refused frames are read to be dropped */
};

static void srv_conn_close(srv_conn_t *c);
static void srv_process(srv_conn_t *c);
static void srv_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void srv_on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);
static void srv_finish(tt_store_server_t *srv);

/* ---- values and the key table ---- */

static srv_value_t *srv_value_new(const void *data, size_t len)
{
    srv_value_t *v = malloc(sizeof(*v) + len + 1);
    if (!v)
        return NULL;
    v->refs = 1;
    v->pinned = 0;
    v->len = len;
    if (len)
        memcpy(v->data, data, len);
    v->data[len] = '\0';
    return v;
}

static void srv_value_unref(tt_store_server_t *srv, srv_value_t *v)
{
    if (!v || --v->refs)
        return;
    if (v->pinned)
        srv->pinned -= v->len;
    free(v);
}

/* The entry lets go of its value (replaced or deleted); replies still being written keep
 * it, counted against the memory limit. */
static void srv_value_drop(tt_store_server_t *srv, srv_entry_t *e)
{
    srv_value_t *v = e->value;
    e->value = NULL;
    if (v && v->refs > 1 && !v->pinned) {
        v->pinned = 1;
        srv->pinned += v->len;
    }
    srv_value_unref(srv, v);
}

static uint32_t srv_hash(const char *key, size_t len)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)key[i]) * 16777619u;
    return h;
}

static srv_entry_t *srv_find(tt_store_server_t *srv, const char *key, size_t len)
{
    uint32_t h = srv_hash(key, len);
    for (srv_entry_t *e = srv->buckets[h & (srv->nbuckets - 1)]; e; e = e->next)
        if (e->hash == h && e->keylen == len && !memcmp(e->key, key, len))
            return e;
    return NULL;
}

static void srv_grow(tt_store_server_t *srv)
{
    size_t n = srv->nbuckets * 2;
    srv_entry_t **b = calloc(n, sizeof(*b));
    if (!b)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < srv->nbuckets; i++) {
        while (srv->buckets[i]) {
            srv_entry_t *e = srv->buckets[i];
            srv->buckets[i] = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
        }
    }
    free(srv->buckets);
    srv->buckets = b;
    srv->nbuckets = n;
}

static srv_entry_t *srv_find_or_add(tt_store_server_t *srv, const char *key, size_t len)
{
    srv_entry_t *e = srv_find(srv, key, len);
    if (e)
        return e;
    e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->key = malloc(len + 1);
    if (!e->key) {
        free(e);
        return NULL;
    }
    memcpy(e->key, key, len);
    e->key[len] = '\0';
    e->keylen = len;
    e->hash = srv_hash(key, len);
    if (srv->nentries >= srv->nbuckets)
        srv_grow(srv);
    size_t b = e->hash & (srv->nbuckets - 1);
    e->next = srv->buckets[b];
    srv->buckets[b] = e;
    /* atomic: tt_store_server_nkeys reads it from other threads (the tests') */
    __atomic_fetch_add(&srv->nentries, 1, __ATOMIC_RELAXED);
    return e;
}

/* Drop an entry that has neither a value nor waiters. */
static void srv_maybe_remove(tt_store_server_t *srv, srv_entry_t *e)
{
    if (e->value || e->waiters)
        return;
    srv_entry_t **pp = &srv->buckets[e->hash & (srv->nbuckets - 1)];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    __atomic_fetch_sub(&srv->nentries, 1, __ATOMIC_RELAXED);
    free(e->key);
    free(e);
}

static void srv_link_remove(srv_link_t *l)
{
    srv_entry_t *e = l->entry;
    if (!e)
        return;
    if (l->prev)
        l->prev->next = l->next;
    else
        e->waiters = l->next;
    if (l->next)
        l->next->prev = l->prev;
    l->entry = NULL;
    l->prev = l->next = NULL;
}

static void srv_waiter_free(tt_store_server_t *srv, srv_waiter_t *w)
{
    for (size_t i = 0; i < w->nlinks; i++) {
        srv_entry_t *e = w->links[i].entry;
        srv_link_remove(&w->links[i]);
        if (e)
            srv_maybe_remove(srv, e);
    }
    srv->buffered -= w->charge;
    free(w);
}

/* ---- input buffers, counted against the limits ---- */

static int srv_buf_resize(srv_conn_t *c, size_t cap)
{
    char *nb = realloc(c->buf, cap);
    if (!nb)
        return -1;
    c->srv->buffered = c->srv->buffered - c->cap + cap;
    c->buf = nb;
    c->cap = cap;
    return 0;
}

static void srv_buf_release(srv_conn_t *c)
{
    c->srv->buffered -= c->cap;
    free(c->buf);
    c->buf = NULL;
    c->cap = 0;
    c->len = 0;
}

/* Read while there is room for input, a refused frame to drop, and no last reply. */
static void srv_update_reading(srv_conn_t *c)
{
    int want = !c->closing && !c->close_after_write && (c->discard || !c->buf || c->len < c->cap);
    if (want == c->reading)
        return;
    c->reading = want;
    if (!want) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        return;
    }
    int r = uv_read_start((uv_stream_t *)&c->tcp, srv_on_alloc, srv_on_read);
    if (r < 0) {
        TT_TRACE("store server %s: cannot read from %s: %s", c->srv->addr, c->peer, uv_strerror(r));
        srv_conn_close(c);
    }
}

/* ---- replies ---- */

static void srv_on_write(uv_write_t *req, int status)
{
    srv_write_t *w = (srv_write_t *)req;
    srv_conn_t *c = w->conn;
    srv_value_unref(c->srv, w->value);
    c->reply_bytes -= w->owned;
    c->srv->buffered -= w->owned;
    free(w);
    c->writes_pending--;
    if (c->closing)
        return;
    c->last_active = c->last_sent = uv_now(&c->srv->loop);
    if (status < 0) {
        TT_TRACE("store server %s: write to %s failed: %s", c->srv->addr, c->peer,
                 uv_strerror(status));
        srv_conn_close(c);
        return;
    }
    if (c->close_after_write) {
        if (!c->writes_pending)
            srv_conn_close(c);
        return;
    }
    srv_process(c);
}

/* Send status and payload: copied (data, len), or a reference to a stored value. */
static void srv_send(srv_conn_t *c, int status, const void *data, size_t len, srv_value_t *value)
{
    size_t owned = value ? 0 : len;
    srv_write_t *w = malloc(sizeof(*w) + owned);
    if (!w) {
        TT_WARN("store server %s: out of memory for a reply of %zu bytes to %s; closing it",
                c->srv->addr, len, c->peer);
        srv_conn_close(c);
        return;
    }
    w->conn = c;
    w->value = value;
    w->owned = owned;
    if (value) {
        value->refs++;
        data = value->data;
        len = value->len;
    } else if (len) {
        memcpy(w->data, data, len);
        data = w->data;
    }
    put_be32(w->head, (uint32_t)(len + 1));
    w->head[4] = (unsigned char)(int8_t)status;
    uv_buf_t bufs[2] = { uv_buf_init((char *)w->head, 5),
                         uv_buf_init((char *)data, (unsigned)len) };
    c->reply_bytes += owned;
    c->srv->buffered += owned;
    if (!c->writes_pending++)
        c->last_sent = uv_now(&c->srv->loop);
    int r = uv_write(&w->req, (uv_stream_t *)&c->tcp, bufs, len ? 2 : 1, srv_on_write);
    if (r < 0) {
        c->writes_pending--;
        c->reply_bytes -= owned;
        c->srv->buffered -= owned;
        srv_value_unref(c->srv, value);
        free(w);
        srv_conn_close(c);
    }
}

static void srv_reply(srv_conn_t *c, int status, const void *payload, size_t len)
{
    srv_send(c, status, payload, len, NULL);
}

static void srv_reply_value(srv_conn_t *c, srv_value_t *v)
{
    srv_send(c, TUTTI_OK, NULL, 0, v);
}

static void srv_reply_error(srv_conn_t *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void srv_reply_error(srv_conn_t *c, int status, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    srv_reply(c, status, msg, n < 0 ? 0 : TT_MIN((size_t)n, sizeof(msg) - 1));
}

static void srv_reply_nomem(srv_conn_t *c)
{
    srv_reply_error(c, TUTTI_ERR_NOMEM, "server out of memory");
}

/* A waiter whose keys are all there: answer and forget it. */
static void srv_waiter_done(srv_waiter_t *w)
{
    srv_conn_t *c = w->conn;
    tt_store_server_t *srv = c->srv;
    c->waiter = NULL;
    if (w->get_entry)
        srv_reply_value(c, w->get_entry->value);
    else
        srv_reply(c, TUTTI_OK, NULL, 0);
    /* requests buffered behind this one go on when the reply is written */
    srv_waiter_free(srv, w);
}

/* key e was set: wake who waits on it */
static void srv_notify(srv_entry_t *e)
{
    srv_link_t *l;
    /* completing a waiter unlinks all of its links, so start from the head each time */
    while ((l = e->waiters)) {
        srv_waiter_t *w = l->w;
        srv_link_remove(l);
        if (--w->remaining == 0)
            srv_waiter_done(w);
    }
}

static int srv_set_value(tt_store_server_t *srv, srv_entry_t *e, const void *value, size_t len)
{
    srv_value_t *v = srv_value_new(value, len);
    if (!v)
        return TUTTI_ERR_NOMEM;
    srv_value_drop(srv, e);
    e->value = v;
    return TUTTI_OK;
}

/* ---- requests ---- */

typedef struct srv_field {
    const char *data;
    size_t len;
} srv_field_t;

/* Next field of a frame; 0, or -1 when the frame ends inside it. */
static int srv_next_field(const unsigned char **p, const unsigned char *end, srv_field_t *f)
{
    if (end - *p < 4)
        return -1;
    uint32_t len = get_be32(*p);
    if ((size_t)(end - *p - 4) < len)
        return -1;
    f->data = (const char *)*p + 4;
    f->len = len;
    *p += 4 + (size_t)len;
    return 0;
}

/* Parse exactly n fields with the given maximum lengths; why says what was wrong. */
static int srv_fields(const unsigned char *p, const unsigned char *end, srv_field_t *f, size_t n,
                      const size_t *max, const char **why)
{
    for (size_t i = 0; i < n; i++) {
        if (srv_next_field(&p, end, &f[i]) < 0) {
            *why = "truncated field";
            return -1;
        }
        if (f[i].len > max[i]) {
            *why = i == 0 ? "key too long" : "value too long";
            return -1;
        }
    }
    if (p != end) {
        *why = "bytes after the last field";
        return -1;
    }
    return 0;
}

static const size_t max_k[] = { TUTTI_STORE_MAX_KEY };
static const size_t max_kv[] = { TUTTI_STORE_MAX_KEY, TUTTI_STORE_MAX_VALUE };
static const size_t max_kvv[] = { TUTTI_STORE_MAX_KEY, TUTTI_STORE_MAX_VALUE,
                                  TUTTI_STORE_MAX_VALUE };
static const size_t max_k8[] = { TUTTI_STORE_MAX_KEY, 8 };
static const size_t max_hello[] = { 32, 4, TT_AUTH_CHALLENGE_LEN };
static const size_t max_auth[] = { TT_SHA256_LEN };

static void srv_cmd_add(srv_conn_t *c, const srv_field_t *f)
{
    tt_store_server_t *srv = c->srv;
    if (f[1].len != 8) {
        srv_reply_error(c, TUTTI_ERR_PROTOCOL, "add: delta of %zu bytes", f[1].len);
        return;
    }
    int64_t delta = (int64_t)get_be64((const unsigned char *)f[1].data);
    srv_entry_t *e = srv_find_or_add(srv, f[0].data, f[0].len);
    if (!e) {
        srv_reply_nomem(c);
        return;
    }
    int64_t v = 0;
    if (e->value && tt_store_parse_i64(e->value->data, e->value->len, &v) < 0) {
        srv_reply_error(c, TUTTI_ERR_INVALID_ARG,
                        "value (%zu bytes) is not a decimal 64-bit integer", e->value->len);
        return;
    }
    if (__builtin_add_overflow(v, delta, &v)) {
        srv_reply_error(c, TUTTI_ERR_INVALID_ARG, "adding %" PRId64 " overflows 64 bits", delta);
        srv_maybe_remove(srv, e);
        return;
    }
    char text[32];
    int n = snprintf(text, sizeof(text), "%" PRId64, v);
    if (srv_set_value(srv, e, text, (size_t)n) < 0) {
        srv_maybe_remove(srv, e);
        srv_reply_nomem(c);
        return;
    }
    unsigned char out[8];
    put_be64(out, (uint64_t)v);
    srv_reply(c, TUTTI_OK, out, 8);
    srv_notify(e);
}

static void srv_cmd_cas(srv_conn_t *c, const srv_field_t *f)
{
    tt_store_server_t *srv = c->srv;
    srv_entry_t *e = srv_find(srv, f[0].data, f[0].len);
    srv_value_t *cur = e ? e->value : NULL;
    int equal = cur ? (cur->len == f[1].len && !memcmp(cur->data, f[1].data, f[1].len))
                    : f[1].len == 0;
    if (!equal) {
        if (cur)
            srv_reply_value(c, cur);
        else
            srv_reply(c, TUTTI_OK, NULL, 0);
        return;
    }
    if (!e)
        e = srv_find_or_add(srv, f[0].data, f[0].len);
    if (!e || srv_set_value(srv, e, f[2].data, f[2].len) < 0) {
        if (e)
            srv_maybe_remove(srv, e);
        srv_reply_nomem(c);
        return;
    }
    srv_reply_value(c, e->value);
    srv_notify(e);
}

/* DELETE_PREFIX (del: the values of every key that starts with the prefix, a finished
 * communicator's keys; entries with waiters stay, as DELETE leaves them) and COUNT_PREFIX
 * (the keys with a value under the prefix, counted). */
static void srv_prefix(srv_conn_t *c, const srv_field_t *f, int del)
{
    tt_store_server_t *srv = c->srv;
    uint64_t n = 0;
    for (size_t b = 0; b < srv->nbuckets; b++) {
        for (srv_entry_t *e = srv->buckets[b], *next; e; e = next) {
            next = e->next;
            if (!e->value || e->keylen < f[0].len || memcmp(e->key, f[0].data, f[0].len))
                continue;
            n++;
            if (!del)
                continue;
            srv_value_drop(srv, e);
            srv_maybe_remove(srv, e);
        }
    }
    unsigned char out[8];
    put_be64(out, n);
    srv_reply(c, TUTTI_OK, out, 8);
}

static void srv_cmd_delete_prefix(srv_conn_t *c, const srv_field_t *f)
{
    srv_prefix(c, f, 1);
}

static void srv_cmd_count_prefix(srv_conn_t *c, const srv_field_t *f)
{
    srv_prefix(c, f, 0);
}

/* Delete key only if its value is the expected one (releasing a record that is still
 * ours, never one a newer owner wrote). */
static void srv_cmd_cad(srv_conn_t *c, const srv_field_t *f)
{
    srv_entry_t *e = srv_find(c->srv, f[0].data, f[0].len);
    unsigned char deleted = e && e->value && e->value->len == f[1].len &&
                            !memcmp(e->value->data, f[1].data, f[1].len);
    if (deleted) {
        srv_value_drop(c->srv, e);
        srv_maybe_remove(c->srv, e);
    }
    srv_reply(c, TUTTI_OK, &deleted, 1);
}

enum { SRV_FITS, SRV_OVER_QUOTA, SRV_OVER_MEMORY };

/* Which limit client c taking bytes more of the server's memory would break, held bytes
 * of its own given back at the same time: its quota (with its unread replies), or the
 * server-wide limit (every client's requests in flight, waiters and unread replies). */
static int srv_limit(const srv_conn_t *c, size_t bytes, size_t held)
{
    const tt_store_server_t *srv = c->srv;
    if (bytes + c->reply_bytes > srv->cfg.client_quota)
        return SRV_OVER_QUOTA;
    if (srv->buffered + srv->pinned - held + bytes > srv->cfg.memory_limit)
        return SRV_OVER_MEMORY;
    return SRV_FITS;
}

/* Whether a waiter of cost bytes may be left, as a request of that size would be
 * admitted (srv_admit): one within a read chunk always, a bigger one within the limits;
 * otherwise the client is told which limit. */
static int srv_waiter_fits(srv_conn_t *c, size_t nkeys, size_t cost)
{
    const tt_store_tcp_cfg_t *cfg = &c->srv->cfg;
    if (cost <= SRV_READ_CHUNK)
        return 1;
    int over = srv_limit(c, cost, 0);
    if (over == SRV_OVER_QUOTA)
        srv_reply_error(c, TUTTI_ERR_NOMEM,
                        "waiting on %zu keys takes %zu bytes of the server's memory, over its "
                        "per-client quota of %zu bytes (TUTTI_STORE_CLIENT_QUOTA)",
                        nkeys, cost, cfg->client_quota);
    else if (over == SRV_OVER_MEMORY)
        srv_reply_error(c, TUTTI_ERR_NOMEM,
                        "waiting on %zu keys (%zu bytes) refused: the server's memory limit "
                        "(%zu bytes, TUTTI_STORE_MEMORY_LIMIT) is in use by other clients; "
                        "try again later",
                        nkeys, cost, cfg->memory_limit);
    else
        return 1;
    return 0;
}

/* WAIT (get_entry NULL) or GET on keys; answers now or leaves a waiter, whose memory
 * counts against the limits. */
static void srv_cmd_wait(srv_conn_t *c, const srv_field_t *keys, size_t n, int is_get)
{
    tt_store_server_t *srv = c->srv;
    size_t missing = 0, cost = 0;
    for (size_t i = 0; i < n; i++) {
        srv_entry_t *e = srv_find(srv, keys[i].data, keys[i].len);
        if (!e || !e->value) {
            missing++;
            cost += TT_STORE_WAIT_KEY_COST + keys[i].len;
        } else if (is_get) {
            srv_reply_value(c, e->value);
            return;
        }
    }
    if (!missing) {
        srv_reply(c, TUTTI_OK, NULL, 0);
        return;
    }
    if (!srv_waiter_fits(c, missing, cost))
        return;
    srv_waiter_t *w = calloc(1, sizeof(*w) + missing * sizeof(srv_link_t));
    if (!w) {
        srv_reply_nomem(c);
        return;
    }
    w->conn = c;
    w->charge = cost;
    srv->buffered += cost;
    for (size_t i = 0; i < n; i++) {
        srv_entry_t *e = srv_find_or_add(srv, keys[i].data, keys[i].len);
        if (!e) {
            srv_waiter_free(srv, w);
            srv_reply_nomem(c);
            return;
        }
        if (e->value)
            continue;
        srv_link_t *l = &w->links[w->nlinks++];
        l->w = w;
        l->entry = e;
        l->prev = NULL;
        l->next = e->waiters;
        if (e->waiters)
            e->waiters->prev = l;
        e->waiters = l;
        if (is_get)
            w->get_entry = e;
    }
    w->remaining = w->nlinks;
    c->waiter = w;
}

static void srv_cmd_keys(srv_conn_t *c, int cmd, srv_field_t *keys, size_t n)
{
    if (cmd == TT_STORE_CMD_WAIT) {
        srv_cmd_wait(c, keys, n, 0);
        return;
    }
    unsigned char all = 1;
    for (size_t i = 0; i < n && all; i++) {
        srv_entry_t *e = srv_find(c->srv, keys[i].data, keys[i].len);
        all = e && e->value;
    }
    srv_reply(c, TUTTI_OK, &all, 1);
}

/* Answer an error and close once it is written. */
static void srv_refuse(srv_conn_t *c, int status, const char *msg)
{
    srv_reply(c, status, msg, strlen(msg));
    c->close_after_write = 1;
    srv_update_reading(c);
}

static unsigned char *srv_put_field(unsigned char *p, const void *data, size_t len)
{
    put_be32(p, (uint32_t)len);
    if (len)
        memcpy(p + 4, data, len);
    return p + 4 + len;
}

static int srv_cmd_hello(srv_conn_t *c, const srv_field_t *f, const char **why)
{
    tt_store_server_t *srv = c->srv;
    if (f[0].len != strlen(TT_STORE_MAGIC) || memcmp(f[0].data, TT_STORE_MAGIC, f[0].len) ||
        f[1].len != 4) {
        *why = "not a tutti store hello";
        return -1;
    }
    uint32_t version = get_be32((const unsigned char *)f[1].data);
    if (version != TT_STORE_PROTOCOL) {
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "store protocol mismatch: the client speaks %" PRIu32
                 ", this server %u (mixed tutti versions)",
                 version, TT_STORE_PROTOCOL);
        srv_refuse(c, TUTTI_ERR_PROTOCOL, msg);
        return 0;
    }
    if (f[2].len != 0 && f[2].len != TT_AUTH_CHALLENGE_LEN) {
        *why = "bad challenge length";
        return -1;
    }
    if (srv->secret && f[2].len == 0) {
        TT_WARN("store server %s: refusing %s: it has no job secret", srv->addr, c->peer);
        srv_refuse(c, TUTTI_ERR_AUTH,
                   "this store requires the job secret (TUTTI_AUTH_TOKEN "
                   "or TUTTI_AUTH_TOKEN_FILE) and the client has none");
        return 0;
    }
    unsigned char out[8 * 4 + 4 + 4 + 4 + 8 + TT_STORE_ID_LEN + TT_STORE_MAX_INSTANCE +
                      TT_AUTH_CHALLENGE_LEN + TT_SHA256_LEN];
    unsigned char num[8], *q = out;
    put_be32(num, TT_STORE_PROTOCOL);
    q = srv_put_field(q, num, 4);
    put_be32(num, srv->secret ? TT_STORE_HELLO_AUTH : 0);
    q = srv_put_field(q, num, 4);
    put_be32(num, (uint32_t)srv->cfg.idle_timeout_ms);
    q = srv_put_field(q, num, 4);
    put_be64(num, srv->cfg.client_quota);
    q = srv_put_field(q, num, 8);
    q = srv_put_field(q, srv->id, TT_STORE_ID_LEN);
    q = srv_put_field(q, srv->instance, srv->instance ? strlen(srv->instance) : 0);
    if (srv->secret) {
        uint8_t answer[TT_SHA256_LEN];
        if (tt_auth_random(c->challenge, sizeof(c->challenge)) < 0) {
            srv_refuse(c, TUTTI_ERR_INTERNAL, "server has no random bytes for a challenge");
            return 0;
        }
        tt_auth_answer(srv->secret, srv->cfg.secret_len, TT_STORE_CTX_SERVER,
                       (const uint8_t *)f[2].data, answer);
        q = srv_put_field(q, c->challenge, sizeof(c->challenge));
        q = srv_put_field(q, answer, sizeof(answer));
        c->state = SRV_AUTH;
    } else {
        c->state = SRV_READY;
    }
    srv_reply(c, TUTTI_OK, out, (size_t)(q - out));
    return 0;
}

static int srv_cmd_auth(srv_conn_t *c, const srv_field_t *f)
{
    tt_store_server_t *srv = c->srv;
    uint8_t want[TT_SHA256_LEN];
    tt_auth_answer(srv->secret, srv->cfg.secret_len, TT_STORE_CTX_CLIENT, c->challenge, want);
    if (f[0].len != sizeof(want) || !tt_auth_equal(f[0].data, want, sizeof(want))) {
        TT_WARN("store server %s: %s failed authentication (wrong job secret)", srv->addr, c->peer);
        srv_refuse(c, TUTTI_ERR_AUTH, "wrong job secret");
        return 0;
    }
    c->state = SRV_READY;
    srv_reply(c, TUTTI_OK, NULL, 0);
    return 0;
}

/* A frame before the hello is done. */
static int srv_handle_hello(srv_conn_t *c, const unsigned char *frame, size_t len, const char **why)
{
    const unsigned char *p = frame + 1, *end = frame + len;
    srv_field_t f[3];
    if (c->state == SRV_HELLO && frame[0] == TT_STORE_CMD_HELLO)
        return srv_fields(p, end, f, 3, max_hello, why) < 0 ? -1 : srv_cmd_hello(c, f, why);
    if (c->state == SRV_AUTH && frame[0] == TT_STORE_CMD_AUTH)
        return srv_fields(p, end, f, 1, max_auth, why) < 0 ? -1 : srv_cmd_auth(c, f);
    if (c->state == SRV_HELLO && frame[0] >= TT_STORE_CMD_SET && frame[0] <= TT_STORE_CMD_PING) {
        /* a protocol 1 client: tell it, in a reply it can read */
        srv_refuse(c, TUTTI_ERR_PROTOCOL,
                   "this store server speaks protocol 2 and expects a "
                   "hello first: the client is an older tutti");
        return 0;
    }
    *why = c->state == SRV_HELLO ? "expected a hello" : "expected the authentication";
    return -1;
}

static void srv_cmd_set(srv_conn_t *c, const srv_field_t *f)
{
    tt_store_server_t *srv = c->srv;
    srv_entry_t *e = srv_find_or_add(srv, f[0].data, f[0].len);
    if (!e || srv_set_value(srv, e, f[1].data, f[1].len) < 0) {
        if (e)
            srv_maybe_remove(srv, e);
        srv_reply_nomem(c);
        return;
    }
    srv_reply(c, TUTTI_OK, NULL, 0);
    srv_notify(e);
}

static void srv_cmd_get(srv_conn_t *c, const srv_field_t *f)
{
    srv_cmd_wait(c, f, 1, 1);
}

static void srv_cmd_delete(srv_conn_t *c, const srv_field_t *f)
{
    tt_store_server_t *srv = c->srv;
    srv_entry_t *e = srv_find(srv, f[0].data, f[0].len);
    unsigned char existed = e && e->value;
    if (existed) {
        srv_value_drop(srv, e);
        srv_maybe_remove(srv, e);
    }
    srv_reply(c, TUTTI_OK, &existed, 1);
}

/* CHECK and WAIT: up to TT_STORE_MAX_KEYS keys (a frame with more is answered with an
 * error: one frame of tiny keys must not hold the loop, nor grow the table, for long). */
static int srv_handle_keys(srv_conn_t *c, int cmd, const unsigned char *p, const unsigned char *end,
                           const char **why)
{
    /* count and check the keys first, then collect them */
    size_t n = 0;
    srv_field_t k;
    for (const unsigned char *q = p; q != end; n++) {
        if (n == TT_STORE_MAX_KEYS) {
            srv_reply_error(c, TUTTI_ERR_INVALID_ARG,
                            "%s of more than %u keys: over this server's limit of keys in "
                            "one request",
                            cmd == TT_STORE_CMD_WAIT ? "wait" : "check", TT_STORE_MAX_KEYS);
            return 0;
        }
        if (srv_next_field(&q, end, &k) < 0) {
            *why = "truncated field";
            return -1;
        }
        if (k.len > TUTTI_STORE_MAX_KEY) {
            *why = "key too long";
            return -1;
        }
    }
    if (n == 0) {
        *why = "no keys";
        return -1;
    }
    srv_field_t *keys = malloc(n * sizeof(*keys));
    if (!keys) {
        srv_reply_nomem(c);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        srv_next_field(&p, end, &keys[i]);
    srv_cmd_keys(c, cmd, keys, n);
    free(keys);
    return 0;
}

/* The commands with a fixed number of fields: how many, their largest sizes, the handler. */
static const struct {
    size_t nfields;
    const size_t *max;
    void (*fn)(srv_conn_t *c, const srv_field_t *f);
} srv_fixed[] = {
    [TT_STORE_CMD_SET] = { 2, max_kv, srv_cmd_set },
    [TT_STORE_CMD_GET] = { 1, max_k, srv_cmd_get },
    [TT_STORE_CMD_ADD] = { 2, max_k8, srv_cmd_add },
    [TT_STORE_CMD_CAS] = { 3, max_kvv, srv_cmd_cas },
    [TT_STORE_CMD_DELETE] = { 1, max_k, srv_cmd_delete },
    [TT_STORE_CMD_DELETE_PREFIX] = { 1, max_k, srv_cmd_delete_prefix },
    [TT_STORE_CMD_CAD] = { 2, max_kv, srv_cmd_cad },
    [TT_STORE_CMD_COUNT_PREFIX] = { 1, max_k, srv_cmd_count_prefix },
};

/* Handle one frame (cmd and fields); returns -1 with why set when the frame is bad. */
static int srv_handle(srv_conn_t *c, const unsigned char *frame, size_t len, const char **why)
{
    const unsigned char *p = frame + 1, *end = frame + len;
    srv_field_t f[3];
    if (c->state != SRV_READY)
        return srv_handle_hello(c, frame, len, why);
    if (frame[0] < sizeof(srv_fixed) / sizeof(srv_fixed[0]) && srv_fixed[frame[0]].fn) {
        if (srv_fields(p, end, f, srv_fixed[frame[0]].nfields, srv_fixed[frame[0]].max, why) < 0)
            return -1;
        srv_fixed[frame[0]].fn(c, f);
        return 0;
    }
    switch (frame[0]) {
    case TT_STORE_CMD_CHECK:
    case TT_STORE_CMD_WAIT: return srv_handle_keys(c, frame[0], p, end, why);
    case TT_STORE_CMD_PING:
        if (p != end) {
            *why = "bytes after the last field";
            return -1;
        }
        srv_reply(c, TUTTI_OK, NULL, 0);
        return 0;
    case TT_STORE_CMD_HELLO:
    case TT_STORE_CMD_AUTH: *why = "a second hello"; return -1;
    default: *why = "unknown command"; return -1;
    }
}

static void srv_bad_client(srv_conn_t *c, const char *why)
{
    TT_WARN("store server %s: closing the connection from %s: %s", c->srv->addr, c->peer, why);
    srv_conn_close(c);
}

/* The frame at the head of the buffer needs total bytes, more than the buffer holds:
 * grow the buffer to exactly that within the limits, or drop the frame as it arrives and
 * answer it with an error. */
static void srv_admit(srv_conn_t *c, size_t total)
{
    tt_store_server_t *srv = c->srv;
    const tt_store_tcp_cfg_t *cfg = &srv->cfg;
    char *msg = c->discard_msg;
    size_t msglen = sizeof(c->discard_msg);
    int over = srv_limit(c, total, c->cap);
    if (over == SRV_OVER_QUOTA) {
        snprintf(msg, msglen,
                 "request of %zu bytes is over this server's per-client quota "
                 "of %zu bytes (TUTTI_STORE_CLIENT_QUOTA)",
                 total, cfg->client_quota);
    } else if (over == SRV_OVER_MEMORY) {
        snprintf(msg, msglen,
                 "request of %zu bytes refused: the server's memory limit for "
                 "requests in flight and unread replies (%zu bytes, TUTTI_STORE_MEMORY_LIMIT) "
                 "is in use by other clients; try again later",
                 total, cfg->memory_limit);
    } else if (srv_buf_resize(c, total) < 0) {
        snprintf(msg, msglen, "server out of memory for a request of %zu bytes", total);
    } else {
        return;
    }
    TT_INFO("store server %s: %s: %s", srv->addr, c->peer, msg);
    c->discard_status = TUTTI_ERR_NOMEM;
    c->discard = total - c->len;
    srv_buf_release(c);
}

/* Handle the complete frames buffered, while nothing is pending for this client. */
static void srv_process(srv_conn_t *c)
{
    size_t off = 0;
    while (!c->closing && !c->close_after_write && !c->waiter && !c->writes_pending &&
           !c->discard && c->len - off >= 4) {
        uint32_t flen = get_be32((unsigned char *)c->buf + off);
        uint32_t limit = c->state == SRV_READY ? TT_STORE_MAX_FRAME : TT_STORE_HELLO_MAX_FRAME;
        if (flen == 0 || flen > limit) {
            char why[96];
            snprintf(why, sizeof(why), "frame length %" PRIu32 " (limit %" PRIu32 "%s)", flen,
                     limit, c->state == SRV_READY ? "" : " before the hello");
            srv_bad_client(c, why);
            return;
        }
        size_t total = 4 + (size_t)flen;
        if (c->len - off < total) {
            if (total > c->cap) {
                c->len -= off;
                memmove(c->buf, c->buf + off, c->len);
                off = 0;
                srv_admit(c, total);
            }
            break;
        }
        const char *why = NULL;
        if (srv_handle(c, (unsigned char *)c->buf + off + 4, flen, &why) < 0) {
            char msg[96];
            snprintf(msg, sizeof(msg), "%s in a frame of command %u", why,
                     ((unsigned char *)c->buf)[off + 4]);
            srv_bad_client(c, msg);
            return;
        }
        off += total;
    }
    if (c->closing)
        return;
    if (off) {
        c->len -= off;
        memmove(c->buf, c->buf + off, c->len);
    }
    /* idle connections hold no buffer (a big one was exactly one frame: it goes too) */
    if (c->buf && c->len == 0)
        srv_buf_release(c);
    srv_update_reading(c);
}

static void srv_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    TT_UNUSED(suggested);
    srv_conn_t *c = h->data;
    if (c->discard) {
        *buf = uv_buf_init(c->srv->scratch, (unsigned)TT_MIN(c->discard, sizeof(c->srv->scratch)));
        return;
    }
    if (!c->buf && srv_buf_resize(c, SRV_READ_CHUNK) < 0) {
        *buf = uv_buf_init(NULL, 0); /* UV_ENOBUFS */
        return;
    }
    *buf = uv_buf_init(c->buf + c->len, (unsigned)(c->cap - c->len));
}

static void srv_on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    TT_UNUSED(buf);
    srv_conn_t *c = stream->data;
    if (c->closing || nread == 0)
        return;
    if (nread < 0) {
        if (nread == UV_ENOBUFS) {
            srv_bad_client(c, "out of memory for its input");
        } else {
            TT_TRACE("store server %s: %s disconnected (%s)", c->srv->addr, c->peer,
                     uv_strerror((int)nread));
            srv_conn_close(c);
        }
        return;
    }
    c->last_active = uv_now(&c->srv->loop);
    if (c->discard) {
        c->discard -= (size_t)nread;
        if (!c->discard)
            srv_reply_error(c, c->discard_status, "%s", c->discard_msg);
        srv_update_reading(c);
        return;
    }
    c->len += (size_t)nread;
    srv_process(c);
}

static void srv_on_close(uv_handle_t *h)
{
    srv_conn_t *c = h->data;
    tt_store_server_t *srv = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv->nconns--;
    srv_buf_release(c);
    free(c);
    if (srv->stopping && !srv->conns)
        srv_finish(srv);
}

static void srv_conn_close(srv_conn_t *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    c->reading = 0;
    c->srv->nopen--;
    if (c->waiter) {
        srv_waiter_free(c->srv, c->waiter);
        c->waiter = NULL;
    }
    uv_close((uv_handle_t *)&c->tcp, srv_on_close);
}

/* ---- connections: accepting, limits, eviction ---- */

/* Reply bytes the client has not taken yet: libuv's write queue and the socket's (sent
 * but not acknowledged, or not sent). The kernel takes more of libuv's queue only once a
 * good part of its own has gone, so the queue alone moves in steps of a megabyte or so. */
static size_t srv_unsent(srv_conn_t *c)
{
    size_t n = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    uv_os_fd_t fd;
    int q = 0;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0 && ioctl(fd, SIOCOUTQ, &q) == 0 && q > 0)
        n += (size_t)q;
    return n;
}

/* Note whether c's replies moved since last looked at (fewer bytes unsent: the client
 * read some; a completed write notes it in srv_on_write). Returns when they last did. */
static uint64_t srv_write_progress(srv_conn_t *c, uint64_t now)
{
    size_t unsent = srv_unsent(c);
    if (unsent < c->unsent_seen)
        c->last_sent = now;
    c->unsent_seen = unsent;
    return c->last_sent;
}

/* One warning per SRV_WARN_EVERY_MS about clients evicted or turned away: a flood must
 * not become a flood of log lines. */
static void srv_pressure_warn(tt_store_server_t *srv, const char *why)
{
    uint64_t now = uv_now(&srv->loop);
    if (srv->last_warn && now - srv->last_warn < SRV_WARN_EVERY_MS)
        return;
    TT_WARN("store server %s: %s: %zu connections evicted, %zu clients turned away "
            "(%zu connections open, limit %d)",
            srv->addr, why, srv->evicted, srv->turned_away, srv->nopen, srv->max_conns);
    srv->last_warn = now;
    srv->evicted = srv->turned_away = 0;
}

/* The connection whose loss matters least: one that had time for its hello and is still
 * in it (oldest first), else one whose client has not read its reply for a while (the
 * longest stalled), else the longest idle, else the one waiting longest for a key; never
 * one in the middle of a request (its client could not tell whether it was served), nor
 * one just accepted (evicting those would let none of a burst of new clients through). */
static srv_conn_t *srv_pick_victim(tt_store_server_t *srv)
{
    srv_conn_t *best = NULL;
    int best_class = 4;
    uint64_t best_t = UINT64_MAX, now = uv_now(&srv->loop);
    for (srv_conn_t *c = srv->conns; c; c = c->next) {
        int cls;
        uint64_t t;
        if (c->closing)
            continue;
        if (c->state != SRV_READY) {
            if (now - c->since < SRV_HELLO_GRACE_MS)
                continue;
            cls = 0;
            t = c->since;
        } else if (c->writes_pending) {
            if (now - srv_write_progress(c, now) < SRV_STALL_GRACE_MS)
                continue;
            cls = 1;
            t = c->last_sent;
        } else if (c->discard || (c->len && !c->waiter)) {
            continue;
        } else {
            cls = c->waiter ? 3 : 2;
            t = c->last_active;
        }
        if (cls < best_class || (cls == best_class && t < best_t)) {
            best = c;
            best_class = cls;
            best_t = t;
        }
    }
    return best;
}

static int srv_evict(tt_store_server_t *srv, const char *why)
{
    srv_conn_t *c = srv_pick_victim(srv);
    if (!c)
        return 0;
    TT_TRACE("store server %s: %s: evicting %s", srv->addr, why, c->peer);
    srv_conn_close(c); /* its fd is closed now, the handle freed later */
    srv->evicted++;
    srv_pressure_warn(srv, why);
    return 1;
}

/* Tell a client we cannot take why, in the reply to the hello it is sending, and close.
 * What it sent already is read first: closing over unread bytes would send a reset, which
 * may overtake the reply. */
static void srv_turn_away(tt_store_server_t *srv, int fd, const char *why)
{
    unsigned char frame[5 + 160];
    int n = snprintf((char *)frame + 5, sizeof(frame) - 5, "busy (%s); try again", why);
    n = TT_MIN(n, (int)sizeof(frame) - 6);
    put_be32(frame, (uint32_t)n + 1);
    frame[4] = (unsigned char)(int8_t)TUTTI_ERR_STORE;
    ssize_t r = send(fd, frame, 5 + (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
    for (int i = 0; i < 4 && r >= 0; i++)
        r = recv(fd, srv->scratch, sizeof(srv->scratch), MSG_DONTWAIT);
    shutdown(fd, SHUT_WR);
    close(fd);
    srv->turned_away++;
    srv_pressure_warn(srv, why);
}

static void srv_on_listen(uv_poll_t *p, int status, int events);

static void srv_accept_resume(uv_timer_t *t)
{
    tt_store_server_t *srv = t->data;
    for (int i = 0; srv->listening && i < srv->nlisten; i++)
        uv_poll_start(&srv->listen_poll[i], UV_READABLE, srv_on_listen);
}

/* Nothing can be accepted for now: stop polling the listener (level-triggered, it would
 * wake the loop at once) and look again shortly. Clients wait in the backlog. */
static void srv_accept_pause(tt_store_server_t *srv)
{
    for (int i = 0; i < srv->nlisten; i++)
        uv_poll_stop(&srv->listen_poll[i]);
    uv_timer_start(&srv->accept_timer, srv_accept_resume, SRV_ACCEPT_PAUSE_MS, 0);
}

/* Out of file descriptors and nobody to evict: spend the reserve fd on telling every
 * client waiting in the backlog so (they retry), then pause accepting. */
static void srv_out_of_fds(tt_store_server_t *srv)
{
    if (srv->reserve_fd < 0) /* none since start, or lost to a race: try again */
        srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (srv->reserve_fd >= 0) {
        close(srv->reserve_fd);
        srv->reserve_fd = -1;
        for (int l = 0; l < srv->nlisten; l++) {
            for (int i = 0; i < 1024; i++) {
                int fd = accept4(srv->listen_fd[l], NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0 && (errno == EINTR || errno == ECONNABORTED))
                    continue;
                if (fd < 0)
                    break;
                srv_turn_away(srv, fd, "out of file descriptors");
            }
        }
        srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    srv_pressure_warn(srv, "out of file descriptors");
    srv_accept_pause(srv);
}

static void srv_conn_add(tt_store_server_t *srv, int fd)
{
    srv_conn_t *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        TT_WARN("store server %s: out of memory for a connection", srv->addr);
        return;
    }
    c->srv = srv;
    uv_tcp_init(&srv->loop, &c->tcp);
    c->tcp.data = c;
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    srv->nconns++;
    srv->nopen++;
    c->since = c->last_active = uv_now(&srv->loop);
    snprintf(c->peer, sizeof(c->peer), "?");
    if (uv_tcp_open(&c->tcp, fd) < 0) {
        close(fd);
        srv_conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    /* a waiting client whose host vanished sends no FIN: keepalive finds it */
    uv_tcp_keepalive(&c->tcp, 1, 60);
    struct sockaddr_storage ss;
    int sslen = sizeof(ss);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sslen) == 0) {
        char ip[64] = "?";
        if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            uv_ip6_name(a, ip, sizeof(ip));
            snprintf(c->peer, sizeof(c->peer), "[%s]:%d", ip, ntohs(a->sin6_port));
        } else {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            uv_ip4_name(a, ip, sizeof(ip));
            snprintf(c->peer, sizeof(c->peer), "%s:%d", ip, ntohs(a->sin_port));
        }
    }
    srv_update_reading(c);
}

static void srv_on_listen(uv_poll_t *p, int status, int events)
{
    TT_UNUSED(events);
    tt_store_server_t *srv = p->data;
    int lfd = srv->listen_fd[p - srv->listen_poll];
    if (status < 0) {
        TT_WARN("store server %s: listening socket: %s", srv->addr, uv_strerror(status));
        srv_accept_pause(srv);
        return;
    }
    /* a burst at a time, so connected clients are served between bursts */
    for (int i = 0; i < SRV_ACCEPT_BURST && srv->listening; i++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EINTR || e == ECONNABORTED)
                continue;
            if (e == EAGAIN || e == EWOULDBLOCK)
                return;
            if (e == EMFILE || e == ENFILE) {
                if (srv_evict(srv, "out of file descriptors"))
                    continue;
                srv_out_of_fds(srv);
                return;
            }
            TT_WARN("store server %s: accept failed: %s", srv->addr, strerror(e));
            srv_accept_pause(srv);
            return;
        }
        if ((int)srv->nopen >= srv->max_conns && !srv_evict(srv, "connection limit")) {
            srv_turn_away(srv, fd, "connection limit reached and every connection is busy");
            continue;
        }
        srv_conn_add(srv, fd);
    }
}

/* ---- timeouts ---- */

/* Whether the client of a connection that is not reading hung up (FIN, reset, or
 * keepalive gave up): with reading paused (a full input buffer behind a waiting GET or a
 * reply being written) libuv would not tell, and a waiter is never idle. */
static int srv_hung_up(srv_conn_t *c)
{
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) < 0)
        return 0;
    struct pollfd p = { .fd = fd, .events = POLLRDHUP };
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static void srv_on_sweep(uv_timer_t *t)
{
    tt_store_server_t *srv = t->data;
    uint64_t now = uv_now(&srv->loop);
    uint64_t idle = (uint64_t)srv->cfg.idle_timeout_ms;
    for (srv_conn_t *c = srv->conns; c; c = c->next) {
        if (c->closing)
            continue;
        if (c->state != SRV_READY) {
            if (now - c->since >= (uint64_t)srv->hello_ms) {
                TT_INFO("store server %s: %s did not finish its hello within %d ms: closing",
                        srv->addr, c->peer, srv->hello_ms);
                srv_conn_close(c);
            }
            continue;
        }
        if (!c->reading && !c->close_after_write && srv_hung_up(c)) {
            TT_TRACE("store server %s: %s hung up while its input waited: closing", srv->addr,
                     c->peer);
            srv_conn_close(c);
            continue;
        }
        if (c->writes_pending) {
            /* a client that stops reading holds the connection and the replies' values:
             * its replies unmoved as long as the idle timeout, it is closed */
            uint64_t moved = srv_write_progress(c, now);
            if (idle && now - moved >= idle) {
                TT_INFO("store server %s: %s has not read its reply for %" PRIu64 " ms: closing",
                        srv->addr, c->peer, now - moved);
                srv_conn_close(c);
            }
            continue;
        }
        if (!idle || c->waiter)
            continue;
        if (now - c->last_active >= idle) {
            TT_TRACE("store server %s: %s idle for %" PRIu64 " ms: closing", srv->addr, c->peer,
                     now - c->last_active);
            srv_conn_close(c);
        }
    }
}

/* ---- start and stop ---- */

static void srv_stop_listening(tt_store_server_t *srv)
{
    if (!srv->listening)
        return;
    srv->listening = 0;
    for (int i = 0; i < srv->nlisten; i++) {
        uv_poll_stop(&srv->listen_poll[i]);
        uv_close((uv_handle_t *)&srv->listen_poll[i], NULL);
        close(srv->listen_fd[i]);
        srv->listen_fd[i] = -1;
    }
    uv_timer_stop(&srv->accept_timer);
}

static void srv_finish(tt_store_server_t *srv)
{
    if (srv->finished)
        return;
    srv->finished = 1;
    uv_close((uv_handle_t *)&srv->sweep_timer, NULL);
    uv_close((uv_handle_t *)&srv->accept_timer, NULL);
    uv_close((uv_handle_t *)&srv->drain_timer, NULL);
    uv_close((uv_handle_t *)&srv->stop_async, NULL);
}

static void srv_on_drained(uv_timer_t *t)
{
    tt_store_server_t *srv = t->data;
    size_t n = 0;
    for (srv_conn_t *c = srv->conns; c; c = c->next) {
        n += !c->closing;
        srv_conn_close(c);
    }
    if (n)
        TT_INFO("store server %s: closing %zu connections still open %d ms after stop", srv->addr,
                n, srv->cfg.drain_ms);
}

static void srv_on_stop(uv_async_t *a)
{
    tt_store_server_t *srv = a->data;
    srv->stopping = 1;
    /* first: nobody new reaches a server that is going away */
    srv_stop_listening(srv);
    for (srv_conn_t *c = srv->conns; c; c = c->next)
        if (c->state != SRV_READY)
            srv_conn_close(c);
    if (!srv->conns)
        srv_finish(srv);
    else
        uv_timer_start(&srv->drain_timer, srv_on_drained, (uint64_t)srv->cfg.drain_ms, 0);
}

static void *srv_thread(void *arg)
{
    tt_store_server_t *srv = arg;
    uv_run(&srv->loop, UV_RUN_DEFAULT);
    return NULL;
}

static void srv_free(tt_store_server_t *srv)
{
    for (size_t i = 0; srv->buckets && i < srv->nbuckets; i++) {
        while (srv->buckets[i]) {
            srv_entry_t *e = srv->buckets[i];
            srv->buckets[i] = e->next;
            free(e->key);
            srv_value_unref(srv, e->value);
            free(e);
        }
    }
    free(srv->buckets);
    if (srv->secret)
        memset(srv->secret, 0, srv->cfg.secret_len);
    free(srv->secret);
    free(srv->instance);
    if (srv->reserve_fd >= 0)
        close(srv->reserve_fd);
    for (int i = 0; i < srv->nlisten; i++)
        if (srv->listen_fd[i] >= 0)
            close(srv->listen_fd[i]);
    free(srv);
}

static void srv_walk_close(uv_handle_t *h, void *arg)
{
    TT_UNUSED(arg);
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Whether a is one of the n addresses in b (getaddrinfo may name one twice). */
static int srv_addr_seen(const struct sockaddr *a, socklen_t alen, const struct sockaddr_storage *b,
                         const socklen_t *blen, int n)
{
    for (int i = 0; i < n; i++)
        if (blen[i] == alen && !memcmp(&b[i], a, alen))
            return 1;
    return 0;
}

/* One try at listening on every address in res at its port (0: the first address picks,
 * the others take its port). 0; or -1 with *e, and *held where an address had the port taken
 * (where: that address). */
static int srv_listen_try(tt_store_server_t *srv, const struct addrinfo *res, int *e, int *held,
                          char *where, size_t wherelen)
{
    struct sockaddr_storage bound[SRV_MAX_LISTEN];
    socklen_t boundlen[SRV_MAX_LISTEN];
    int naddr = 0, real_port = 0;
    for (const struct addrinfo *ai = res; ai; ai = ai->ai_next)
        naddr++;
    *held = 0;
    for (const struct addrinfo *ai = res; ai && srv->nlisten < SRV_MAX_LISTEN; ai = ai->ai_next) {
        if (ai->ai_addrlen > sizeof(bound[0]) ||
            srv_addr_seen(ai->ai_addr, ai->ai_addrlen, bound, boundlen, srv->nlisten))
            continue;
        struct sockaddr_storage sa;
        memcpy(&sa, ai->ai_addr, ai->ai_addrlen);
        if (real_port && sa.ss_family == AF_INET6)
            ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)real_port);
        else if (real_port)
            ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)real_port);
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            *e = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        /* beside an IPv4 address of the same name (localhost: ::1 and 127.0.0.1), an IPv6
         * listener is IPv6 only; a lone "::" stays dual-stack as the system makes it */
        if (ai->ai_family == AF_INET6 && naddr > 1)
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
        if (bind(fd, (struct sockaddr *)&sa, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
            socklen_t len = sizeof(sa);
            if (!real_port && getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
                real_port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                           : ((struct sockaddr_in *)&sa)->sin_port);
            memcpy(&bound[srv->nlisten], ai->ai_addr, ai->ai_addrlen);
            boundlen[srv->nlisten] = ai->ai_addrlen;
            srv->listen_fd[srv->nlisten++] = fd;
            continue;
        }
        *e = errno;
        close(fd);
        if (*e == EADDRINUSE) { /* another server has this host's port on that address */
            *held = 1;
            if (getnameinfo((struct sockaddr *)&sa, ai->ai_addrlen, where, (socklen_t)wherelen,
                            NULL, 0, NI_NUMERICHOST) != 0)
                where[0] = '\0';
            break;
        }
    }
    if (*held || !srv->nlisten) {
        for (int i = 0; i < srv->nlisten; i++)
            close(srv->listen_fd[i]);
        srv->nlisten = 0;
        return -1;
    }
    return 0;
}

/* Listening sockets on every address of host, at port. SO_REUSEADDR lets a new server
 * take the port of one that just stopped (its closed connections linger in TIME_WAIT).
 * An address the machine lacks (no IPv6) is passed over; the port held on any address
 * fails the start, or two servers would split the clients between them by spelling
 * (localhost reaching ::1, 127.0.0.1 the other). With port 0, the others take the port
 * the first got, and where one of them has it taken, every address tries a fresh one. */
static int srv_listen(tt_store_server_t *srv, const char *host, int port, tt_store_err_t *err)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC,
                              .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE };
    struct addrinfo *res = NULL;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    int r = getaddrinfo(host, portstr, &hints, &res);
    if (r != 0) {
        tt_store_err_set(err, "cannot resolve %s to listen on: %s", host, gai_strerror(r));
        return TUTTI_ERR_IO;
    }
    int e = EINVAL, held = 0, tries = port ? 1 : 16;
    char where[80] = "";
    while (tries-- > 0 && srv_listen_try(srv, res, &e, &held, where, sizeof(where)) < 0 && held)
        ;
    freeaddrinfo(res);
    if (!srv->nlisten) {
        /* the address taken, where the name has several */
        char at[100] = "";
        if (held && where[0] && strcmp(host, where) != 0)
            snprintf(at, sizeof(at), " at %s", where);
        tt_store_err_set(err, "cannot listen on %s port %d: %s%s%s", host, port, strerror(e), at,
                         e == EADDRINUSE ? " (another server holds the port; ranks use a "
                                           "standalone tutti-store with TUTTI_STORE_SERVER=0)"
                                         : "");
        return TUTTI_ERR_IO;
    }
    return TUTTI_OK;
}

/* Connections the server may hold when the caller sets no limit: most of the fd limit,
 * leaving a quarter (at least 32) to the process, which an embedded server shares with
 * the application and its transports. */
static int srv_auto_max_conns(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY ||
        rl.rlim_cur > 65536 * 2)
        return 65536;
    long n = (long)rl.rlim_cur;
    return (int)TT_MAX(16, n - TT_MAX(32, n / 4));
}

static int srv_copy_cfg(tt_store_server_t *srv, const tt_store_tcp_cfg_t *cfg)
{
    srv->cfg = *cfg;
    srv->cfg.secret = NULL;
    srv->cfg.instance = NULL;
    if (cfg->secret) {
        srv->secret = malloc(cfg->secret_len + 1);
        if (!srv->secret)
            return -1;
        memcpy(srv->secret, cfg->secret, cfg->secret_len);
        srv->secret[cfg->secret_len] = '\0';
    }
    if (cfg->instance && !(srv->instance = strdup(cfg->instance)))
        return -1;
    srv->max_conns = cfg->max_connections > 0 ? cfg->max_connections : srv_auto_max_conns();
    srv->hello_ms = cfg->idle_timeout_ms > 0 ? TT_MIN(cfg->idle_timeout_ms, SRV_HELLO_MS)
                                             : SRV_HELLO_MS;
    return 0;
}

/* Handles of the loop besides the connections. */
static int srv_init_handles(tt_store_server_t *srv, tt_store_err_t *err)
{
    int r;
    for (int i = 0; i < srv->nlisten; i++) {
        r = uv_poll_init_socket(&srv->loop, &srv->listen_poll[i], srv->listen_fd[i]);
        if (r < 0) {
            tt_store_err_set(err, "cannot watch the listening socket: %s", uv_strerror(r));
            return TUTTI_ERR_INTERNAL;
        }
        srv->listen_poll[i].data = srv;
    }
    srv->listening = 1;
    uv_timer_init(&srv->loop, &srv->sweep_timer);
    uv_timer_init(&srv->loop, &srv->accept_timer);
    uv_timer_init(&srv->loop, &srv->drain_timer);
    srv->sweep_timer.data = srv->accept_timer.data = srv->drain_timer.data = srv;
    r = uv_async_init(&srv->loop, &srv->stop_async, srv_on_stop);
    if (r < 0) {
        tt_store_err_set(err, "cannot create the stop signal: %s", uv_strerror(r));
        return TUTTI_ERR_INTERNAL;
    }
    srv->stop_async.data = srv;
    for (int i = 0; i < srv->nlisten; i++)
        uv_poll_start(&srv->listen_poll[i], UV_READABLE, srv_on_listen);
    uint64_t period = (uint64_t)TT_MIN(srv->hello_ms, srv->cfg.idle_timeout_ms > 0
                                                          ? srv->cfg.idle_timeout_ms
                                                          : SRV_HELLO_MS) /
                      4;
    period = TT_MAX(20u, TT_MIN(1000u, period));
    uv_timer_start(&srv->sweep_timer, srv_on_sweep, period, period);
    return TUTTI_OK;
}

int tt_store_server_start(const char *host, int port, const tt_store_tcp_cfg_t *cfg,
                          tt_store_server_t **srv_p, int *port_p, tt_store_err_t *err)
{
    int st, r;
    if (!host)
        host = "127.0.0.1";
    tt_store_server_t *srv = calloc(1, sizeof(*srv));
    if (!srv)
        goto err_nomem;
    srv->reserve_fd = -1;
    srv->nbuckets = 64;
    srv->buckets = calloc(srv->nbuckets, sizeof(*srv->buckets));
    if (!srv->buckets || srv_copy_cfg(srv, cfg) < 0)
        goto err_free_srv_nomem;
    if (tt_auth_random(srv->id, sizeof(srv->id)) < 0) {
        tt_store_err_set(err, "no random bytes for the server's instance id");
        st = TUTTI_ERR_IO;
        goto err_free_srv;
    }
    srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    r = uv_loop_init(&srv->loop);
    if (r < 0) {
        tt_store_err_set(err, "cannot start an event loop: %s", uv_strerror(r));
        st = TUTTI_ERR_INTERNAL;
        goto err_free_srv;
    }
    TT_CHECK_GOTO(srv_listen(srv, host, port, err), st, err_close_loop);
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof(ss);
    if (getsockname(srv->listen_fd[0], (struct sockaddr *)&ss, &sslen) < 0) {
        tt_store_err_set(err, "cannot read the listening address: %s", strerror(errno));
        st = TUTTI_ERR_IO;
        goto err_close_loop;
    }
    int real_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    snprintf(srv->addr, sizeof(srv->addr), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host,
             real_port);
    TT_CHECK_GOTO(srv_init_handles(srv, err), st, err_close_loop);
    srv->pid = getpid();

    /* signals are for the application's threads, not for ours */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    r = pthread_create(&srv->thread, NULL, srv_thread, srv);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r != 0) {
        tt_store_err_set(err, "cannot start the server thread: %s", strerror(r));
        st = TUTTI_ERR_INTERNAL;
        goto err_close_loop;
    }
    TT_INFO("store server listening on %s%s (at most %d connections)", srv->addr,
            srv->secret ? ", clients must prove the job secret" : "", srv->max_conns);
    *srv_p = srv;
    *port_p = real_port;
    return TUTTI_OK;

err_close_loop:
    uv_walk(&srv->loop, srv_walk_close, NULL);
    uv_run(&srv->loop, UV_RUN_DEFAULT);
    uv_loop_close(&srv->loop);
err_free_srv:
    srv_free(srv);
    return st;
err_free_srv_nomem:
    srv_free(srv);
err_nomem:
    tt_store_err_set(err, "out of memory");
    return TUTTI_ERR_NOMEM;
}

void tt_store_server_stop(tt_store_server_t *srv)
{
    if (!srv)
        return;
    /* a forked child has the memory but not the thread: leave both alone */
    if (srv->pid != getpid())
        return;
    uv_async_send(&srv->stop_async);
    pthread_join(srv->thread, NULL);
    uv_loop_close(&srv->loop);
    srv_free(srv);
}

size_t tt_store_server_nkeys(tt_store_server_t *srv)
{
    return __atomic_load_n(&srv->nentries, __ATOMIC_RELAXED);
}

/* ---- fuzzing ---- */

/* Drain what the server wrote to the client's end (replies are not checked here). */
static void srv_fuzz_drain(int fd)
{
    char sink[4096];
    while (read(fd, sink, sizeof(sink)) > 0)
        ;
}

int tt_store_server_fuzz_input(const uint8_t *data, size_t len, int with_secret, size_t chunk)
{
    tt_store_server_t *srv = calloc(1, sizeof(*srv));
    int sv[2] = { -1, -1 };
    if (!srv)
        return -1;
    srv->reserve_fd = -1;
    srv->nbuckets = 4; /* small: the fuzzer reaches srv_grow */
    srv->buckets = calloc(srv->nbuckets, sizeof(*srv->buckets));
    tt_store_tcp_cfg_t cfg = { .secret = with_secret ? "fuzz-secret" : NULL,
                               .secret_len = with_secret ? 11 : 0,
                               .instance = "fuzz",
                               .idle_timeout_ms = TT_STORE_DEFAULT_IDLE_MS,
                               .max_connections = 4,
                               .client_quota = TT_STORE_DEFAULT_QUOTA,
                               .memory_limit = TT_STORE_DEFAULT_MEMORY };
    if (!srv->buckets || srv_copy_cfg(srv, &cfg) < 0 || uv_loop_init(&srv->loop) < 0) {
        srv_free(srv);
        return -1;
    }
    snprintf(srv->addr, sizeof(srv->addr), "fuzz");
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0) {
        uv_loop_close(&srv->loop);
        srv_free(srv);
        return -1;
    }
    srv_conn_add(srv, sv[0]);
    size_t off = 0;
    chunk = chunk ? TT_MIN(chunk, (size_t)SRV_READ_CHUNK) : SRV_READ_CHUNK;
    /* libuv's reads, by hand: only while the connection reads (as uv_read_start would),
     * with the loop run between them so that replies complete and buffered requests go
     * on. Stops when the input is spent, the connection closed, or nothing can move
     * (a GET waiting for a key no one will set). */
    for (int idle = 0; idle < 64;) {
        srv_fuzz_drain(sv[1]);
        uv_run(&srv->loop, UV_RUN_NOWAIT);
        srv_conn_t *c = srv->conns;
        if (!c || c->closing)
            break;
        if (off == len || !c->reading) {
            if (!c->writes_pending && (off == len || c->waiter))
                break;
            idle++;
            continue;
        }
        uv_buf_t buf;
        srv_on_alloc((uv_handle_t *)&c->tcp, SRV_READ_CHUNK, &buf);
        if (!buf.base) {
            srv_on_read((uv_stream_t *)&c->tcp, UV_ENOBUFS, &buf);
            continue;
        }
        size_t n = TT_MIN(TT_MIN(len - off, chunk), (size_t)buf.len);
        memcpy(buf.base, data + off, n);
        off += n;
        idle = 0;
        srv_on_read((uv_stream_t *)&c->tcp, (ssize_t)n, &buf);
    }
    if (srv->conns)
        srv_conn_close(srv->conns);
    close(sv[1]);
    uv_run(&srv->loop, UV_RUN_DEFAULT);
    uv_loop_close(&srv->loop);
    srv_free(srv);
    return 0;
}
