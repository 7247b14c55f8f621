/* TCP store server: a libuv loop in a thread of its own, holding the keys in a hash table.
 *
 * Each connection's requests are handled strictly in order, one at a time: while a GET
 * or WAIT waits for keys, or a reply is still being written, further bytes are only
 * buffered. That keeps replies in request order and bounds what one client can make the
 * server hold (one frame of input, one reply). Anything malformed closes that client's
 * connection, never the server. Waiters hang on the entries of the keys they wait for
 * (entries without a value exist only while someone waits on them) and leave with their
 * connection.
 */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "store_impl.h"

#define SRV_READ_CHUNK 65536u
/* input one connection may buffer: a whole frame and one read beyond it */
#define SRV_MAX_INPUT ((size_t)TT_STORE_MAX_FRAME + 4 + SRV_READ_CHUNK)
#define SRV_KEEP_BUF (1u << 20) /* input buffers above this are freed when empty */

typedef struct srv_conn srv_conn_t;
typedef struct srv_waiter srv_waiter_t;
typedef struct srv_entry srv_entry_t;

typedef struct srv_link {
    srv_waiter_t *w;
    srv_entry_t *entry;            /* NULL once the key was set */
    struct srv_link *prev, *next;  /* in entry->waiters */
} srv_link_t;

struct srv_entry {
    srv_entry_t *next;             /* bucket chain */
    uint32_t hash;
    int has_value;
    char *key;
    size_t keylen;
    char *value;
    size_t vlen;
    srv_link_t *waiters;
};

struct srv_waiter {
    srv_conn_t *conn;
    srv_entry_t *get_entry;        /* GET: reply with this entry's value */
    size_t remaining;
    size_t nlinks;
    srv_link_t links[];
};

struct srv_conn {
    uv_tcp_t tcp;
    tt_store_server_t *srv;
    char peer[80];
    char *buf;
    size_t len, cap, need;         /* need: bytes of the frame being received, once known */
    srv_waiter_t *waiter;
    int writes_pending;
    int closing;
    srv_conn_t *prev, *next;
};

typedef struct srv_write {
    uv_write_t req;
    srv_conn_t *conn;
    unsigned char head[5];
    char data[];
} srv_write_t;

struct tt_store_server {
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_async_t stop_async;
    pthread_t thread;
    pid_t pid;
    char addr[96];
    srv_conn_t *conns;
    srv_entry_t **buckets;
    size_t nbuckets, nentries;
};

static void srv_conn_close(srv_conn_t *c);
static void srv_process(srv_conn_t *c);

/* ---- key table ---- */

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
    srv->nentries++;
    return e;
}

/* Drop an entry that has neither a value nor waiters. */
static void srv_maybe_remove(tt_store_server_t *srv, srv_entry_t *e)
{
    if (e->has_value || e->waiters)
        return;
    srv_entry_t **pp = &srv->buckets[e->hash & (srv->nbuckets - 1)];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    srv->nentries--;
    free(e->key);
    free(e->value);
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
    free(w);
}

/* ---- replies ---- */

static void srv_on_write(uv_write_t *req, int status)
{
    srv_write_t *w = (srv_write_t *)req;
    srv_conn_t *c = w->conn;
    free(w);
    c->writes_pending--;
    if (c->closing)
        return;
    if (status < 0) {
        TT_TRACE("store server %s: write to %s failed: %s", c->srv->addr, c->peer,
                 uv_strerror(status));
        srv_conn_close(c);
        return;
    }
    srv_process(c);
}

static void srv_reply(srv_conn_t *c, int status, const void *payload, size_t len)
{
    srv_write_t *w = malloc(sizeof(*w) + len);
    if (!w) {
        TT_WARN("store server %s: out of memory for a reply of %zu bytes to %s; closing it",
                c->srv->addr, len, c->peer);
        srv_conn_close(c);
        return;
    }
    w->conn = c;
    put_be32(w->head, (uint32_t)(len + 1));
    w->head[4] = (unsigned char)(int8_t)status;
    if (len)
        memcpy(w->data, payload, len);
    uv_buf_t bufs[2] = {uv_buf_init((char *)w->head, 5), uv_buf_init(w->data, (unsigned)len)};
    int r = uv_write(&w->req, (uv_stream_t *)&c->tcp, bufs, len ? 2 : 1, srv_on_write);
    if (r < 0) {
        free(w);
        srv_conn_close(c);
        return;
    }
    c->writes_pending++;
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
        srv_reply(c, TUTTI_OK, w->get_entry->value, w->get_entry->vlen);
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

static int srv_set_value(srv_entry_t *e, const void *value, size_t len)
{
    char *v = malloc(len + 1);
    if (!v)
        return TUTTI_ERR_NOMEM;
    if (len)
        memcpy(v, value, len);
    v[len] = '\0';
    free(e->value);
    e->value = v;
    e->vlen = len;
    e->has_value = 1;
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
static int srv_fields(const unsigned char *p, const unsigned char *end, srv_field_t *f,
                      size_t n, const size_t *max, const char **why)
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

static const size_t max_k[] = {TUTTI_STORE_MAX_KEY};
static const size_t max_kv[] = {TUTTI_STORE_MAX_KEY, TUTTI_STORE_MAX_VALUE};
static const size_t max_kvv[] = {TUTTI_STORE_MAX_KEY, TUTTI_STORE_MAX_VALUE,
                                 TUTTI_STORE_MAX_VALUE};
static const size_t max_k8[] = {TUTTI_STORE_MAX_KEY, 8};

static void srv_cmd_add(srv_conn_t *c, srv_field_t *f)
{
    tt_store_server_t *srv = c->srv;
    if (f[1].len != 8) {
        srv_reply_error(c, TUTTI_ERR_PROTOCOL, "add: delta of %zu bytes", f[1].len);
        return;
    }
    const unsigned char *d = (const unsigned char *)f[1].data;
    int64_t delta = (int64_t)((uint64_t)get_be32(d) << 32 | get_be32(d + 4));
    srv_entry_t *e = srv_find_or_add(srv, f[0].data, f[0].len);
    if (!e) {
        srv_reply_nomem(c);
        return;
    }
    int64_t v = 0;
    if (e->has_value && tt_store_parse_i64(e->value, e->vlen, &v) < 0) {
        srv_reply_error(c, TUTTI_ERR_INVALID_ARG,
                        "value (%zu bytes) is not a decimal 64-bit integer", e->vlen);
        return;
    }
    if (__builtin_add_overflow(v, delta, &v)) {
        srv_reply_error(c, TUTTI_ERR_INVALID_ARG, "adding %" PRId64 " overflows 64 bits",
                        delta);
        srv_maybe_remove(srv, e);
        return;
    }
    char text[32];
    int n = snprintf(text, sizeof(text), "%" PRId64, v);
    if (srv_set_value(e, text, (size_t)n) < 0) {
        srv_maybe_remove(srv, e);
        srv_reply_nomem(c);
        return;
    }
    unsigned char out[8];
    put_be32(out, (uint32_t)((uint64_t)v >> 32));
    put_be32(out + 4, (uint32_t)v);
    srv_reply(c, TUTTI_OK, out, 8);
    srv_notify(e);
}

static void srv_cmd_cas(srv_conn_t *c, srv_field_t *f)
{
    tt_store_server_t *srv = c->srv;
    srv_entry_t *e = srv_find(srv, f[0].data, f[0].len);
    int exists = e && e->has_value;
    int equal = exists ? (e->vlen == f[1].len && !memcmp(e->value, f[1].data, f[1].len))
                       : f[1].len == 0;
    if (!equal) {
        srv_reply(c, TUTTI_OK, exists ? e->value : NULL, exists ? e->vlen : 0);
        return;
    }
    if (!e)
        e = srv_find_or_add(srv, f[0].data, f[0].len);
    if (!e || srv_set_value(e, f[2].data, f[2].len) < 0) {
        if (e)
            srv_maybe_remove(srv, e);
        srv_reply_nomem(c);
        return;
    }
    srv_reply(c, TUTTI_OK, e->value, e->vlen);
    srv_notify(e);
}

/* WAIT (get_entry NULL) or GET on keys; answers now or leaves a waiter. */
static void srv_cmd_wait(srv_conn_t *c, const srv_field_t *keys, size_t n, int is_get)
{
    tt_store_server_t *srv = c->srv;
    size_t missing = 0;
    for (size_t i = 0; i < n; i++) {
        srv_entry_t *e = srv_find(srv, keys[i].data, keys[i].len);
        if (!e || !e->has_value)
            missing++;
        else if (is_get) {
            srv_reply(c, TUTTI_OK, e->value, e->vlen);
            return;
        }
    }
    if (!missing) {
        srv_reply(c, TUTTI_OK, NULL, 0);
        return;
    }
    srv_waiter_t *w = calloc(1, sizeof(*w) + missing * sizeof(srv_link_t));
    if (!w) {
        srv_reply_nomem(c);
        return;
    }
    w->conn = c;
    for (size_t i = 0; i < n; i++) {
        srv_entry_t *e = srv_find_or_add(srv, keys[i].data, keys[i].len);
        if (!e) {
            srv_waiter_free(srv, w);
            srv_reply_nomem(c);
            return;
        }
        if (e->has_value)
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

/* Handle one frame (cmd and fields); returns -1 with why set when the frame is bad. */
static int srv_handle(srv_conn_t *c, const unsigned char *frame, size_t len, const char **why)
{
    tt_store_server_t *srv = c->srv;
    const unsigned char *p = frame + 1, *end = frame + len;
    srv_field_t f[3];
    switch (frame[0]) {
    case TT_STORE_CMD_SET: {
        if (srv_fields(p, end, f, 2, max_kv, why) < 0)
            return -1;
        srv_entry_t *e = srv_find_or_add(srv, f[0].data, f[0].len);
        if (!e || srv_set_value(e, f[1].data, f[1].len) < 0) {
            if (e)
                srv_maybe_remove(srv, e);
            srv_reply_nomem(c);
            return 0;
        }
        srv_reply(c, TUTTI_OK, NULL, 0);
        srv_notify(e);
        return 0;
    }
    case TT_STORE_CMD_GET:
        if (srv_fields(p, end, f, 1, max_k, why) < 0)
            return -1;
        srv_cmd_wait(c, f, 1, 1);
        return 0;
    case TT_STORE_CMD_ADD:
        if (srv_fields(p, end, f, 2, max_k8, why) < 0)
            return -1;
        srv_cmd_add(c, f);
        return 0;
    case TT_STORE_CMD_CAS:
        if (srv_fields(p, end, f, 3, max_kvv, why) < 0)
            return -1;
        srv_cmd_cas(c, f);
        return 0;
    case TT_STORE_CMD_DELETE: {
        if (srv_fields(p, end, f, 1, max_k, why) < 0)
            return -1;
        srv_entry_t *e = srv_find(srv, f[0].data, f[0].len);
        unsigned char existed = e && e->has_value;
        if (existed) {
            free(e->value);
            e->value = NULL;
            e->vlen = 0;
            e->has_value = 0;
            srv_maybe_remove(srv, e);
        }
        srv_reply(c, TUTTI_OK, &existed, 1);
        return 0;
    }
    case TT_STORE_CMD_CHECK:
    case TT_STORE_CMD_WAIT: {
        /* count and check the keys first, then collect them */
        size_t n = 0;
        srv_field_t k;
        for (const unsigned char *q = p; q != end; n++) {
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
        if (frame[0] == TT_STORE_CMD_WAIT) {
            srv_cmd_wait(c, keys, n, 0);
        } else {
            unsigned char all = 1;
            for (size_t i = 0; i < n && all; i++) {
                srv_entry_t *e = srv_find(srv, keys[i].data, keys[i].len);
                all = e && e->has_value;
            }
            srv_reply(c, TUTTI_OK, &all, 1);
        }
        free(keys);
        return 0;
    }
    case TT_STORE_CMD_PING:
        if (p != end) {
            *why = "bytes after the last field";
            return -1;
        }
        srv_reply(c, TUTTI_OK, NULL, 0);
        return 0;
    default:
        *why = "unknown command";
        return -1;
    }
}

static void srv_bad_client(srv_conn_t *c, const char *why)
{
    TT_WARN("store server %s: closing the connection from %s: %s", c->srv->addr, c->peer,
            why);
    srv_conn_close(c);
}

/* Handle the complete frames buffered, while nothing is pending for this client. */
static void srv_process(srv_conn_t *c)
{
    size_t off = 0;
    while (!c->closing && !c->waiter && !c->writes_pending && c->len - off >= 4) {
        uint32_t flen = get_be32((unsigned char *)c->buf + off);
        if (flen == 0 || flen > TT_STORE_MAX_FRAME) {
            char why[96];
            snprintf(why, sizeof(why), "frame length %" PRIu32 " (limit %u)", flen,
                     TT_STORE_MAX_FRAME);
            srv_bad_client(c, why);
            return;
        }
        if (c->len - off < 4 + (size_t)flen) {
            c->need = 4 + (size_t)flen;
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
        off += 4 + (size_t)flen;
        c->need = 0;
    }
    if (c->closing || off == 0)
        return;
    c->len -= off;
    if (c->len)
        memmove(c->buf, c->buf + off, c->len);
    else if (c->cap > SRV_KEEP_BUF) {
        free(c->buf);
        c->buf = NULL;
        c->cap = 0;
    }
}

static void srv_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    TT_UNUSED(suggested);
    srv_conn_t *c = h->data;
    size_t want = c->len + SRV_READ_CHUNK;
    /* grow toward the announced frame size as its bytes arrive, not at once */
    if (c->need > want)
        want = TT_MIN(c->need, TT_MAX(want, 2 * c->cap));
    want = TT_MIN(want, SRV_MAX_INPUT);
    if (c->cap < want) {
        char *nb = realloc(c->buf, want);
        if (nb) {
            c->buf = nb;
            c->cap = want;
        }
    }
    *buf = uv_buf_init(c->buf ? c->buf + c->len : NULL, (unsigned)(c->cap - c->len));
}

static void srv_on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    TT_UNUSED(buf);
    srv_conn_t *c = stream->data;
    if (c->closing)
        return;
    if (nread < 0) {
        if (nread == UV_ENOBUFS) {
            srv_bad_client(c, c->len >= SRV_MAX_INPUT - SRV_READ_CHUNK
                                  ? "sent more than a frame while a request was pending"
                                  : "out of memory for its input");
        } else {
            TT_TRACE("store server %s: %s disconnected (%s)", c->srv->addr, c->peer,
                     uv_strerror((int)nread));
            srv_conn_close(c);
        }
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
    free(c->buf);
    free(c);
}

static void srv_conn_close(srv_conn_t *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    if (c->waiter) {
        srv_waiter_free(c->srv, c->waiter);
        c->waiter = NULL;
    }
    uv_close((uv_handle_t *)&c->tcp, srv_on_close);
}

static void srv_on_connection(uv_stream_t *listener, int status)
{
    tt_store_server_t *srv = listener->data;
    if (status < 0) {
        TT_WARN("store server %s: accept failed: %s", srv->addr, uv_strerror(status));
        return;
    }
    srv_conn_t *c = calloc(1, sizeof(*c));
    if (!c) {
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
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) < 0) {
        srv_conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    struct sockaddr_storage ss;
    int sslen = sizeof(ss);
    snprintf(c->peer, sizeof(c->peer), "?");
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
    int r = uv_read_start((uv_stream_t *)&c->tcp, srv_on_alloc, srv_on_read);
    if (r < 0) {
        TT_WARN("store server %s: cannot read from %s: %s", srv->addr, c->peer,
                uv_strerror(r));
        srv_conn_close(c);
    }
}

static void srv_on_stop(uv_async_t *a)
{
    tt_store_server_t *srv = a->data;
    uv_close((uv_handle_t *)&srv->listener, NULL);
    for (srv_conn_t *c = srv->conns; c; c = c->next)
        srv_conn_close(c);
    uv_close((uv_handle_t *)&srv->stop_async, NULL);
}

static void *srv_thread(void *arg)
{
    tt_store_server_t *srv = arg;
    uv_run(&srv->loop, UV_RUN_DEFAULT);
    return NULL;
}

static void srv_free_table(tt_store_server_t *srv)
{
    for (size_t i = 0; i < srv->nbuckets; i++) {
        while (srv->buckets[i]) {
            srv_entry_t *e = srv->buckets[i];
            srv->buckets[i] = e->next;
            free(e->key);
            free(e->value);
            free(e);
        }
    }
    free(srv->buckets);
}

/* Close whatever the loop holds and run it until they are gone. */
static void srv_loop_drain(tt_store_server_t *srv)
{
    uv_run(&srv->loop, UV_RUN_DEFAULT);
    uv_loop_close(&srv->loop);
}

static void srv_walk_close(uv_handle_t *h, void *arg)
{
    TT_UNUSED(arg);
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static int srv_listen(tt_store_server_t *srv, const char *host, int port, tt_store_err_t *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    int r = getaddrinfo(host, portstr, &hints, &res);
    if (r != 0) {
        tt_store_err_set(err, "cannot resolve %s to listen on: %s", host, gai_strerror(r));
        return TUTTI_ERR_IO;
    }
    r = UV_EINVAL;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        uv_tcp_init(&srv->loop, &srv->listener);
        srv->listener.data = srv;
        r = uv_tcp_bind(&srv->listener, ai->ai_addr, 0);
        if (r == 0)
            r = uv_listen((uv_stream_t *)&srv->listener, 1024, srv_on_connection);
        if (r == 0)
            break;
        /* run the loop once so the failed handle is closed before it is reused */
        uv_close((uv_handle_t *)&srv->listener, NULL);
        uv_run(&srv->loop, UV_RUN_NOWAIT);
    }
    freeaddrinfo(res);
    if (r < 0) {
        tt_store_err_set(err, "cannot listen on %s port %d: %s", host, port, uv_strerror(r));
        return TUTTI_ERR_IO;
    }
    return TUTTI_OK;
}

int tt_store_server_start(const char *host, int port, tt_store_server_t **srv_p, int *port_p,
                          tt_store_err_t *err)
{
    int st, r;
    if (!host)
        host = "0.0.0.0";
    tt_store_server_t *srv = calloc(1, sizeof(*srv));
    if (!srv)
        goto err_nomem;
    srv->nbuckets = 64;
    srv->buckets = calloc(srv->nbuckets, sizeof(*srv->buckets));
    if (!srv->buckets)
        goto err_free_srv_nomem;
    r = uv_loop_init(&srv->loop);
    if (r < 0) {
        tt_store_err_set(err, "cannot start an event loop: %s", uv_strerror(r));
        st = TUTTI_ERR_INTERNAL;
        goto err_free_srv;
    }
    TT_CHECK_GOTO(srv_listen(srv, host, port, err), st, err_close_loop);
    struct sockaddr_storage ss;
    int sslen = sizeof(ss);
    r = uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&ss, &sslen);
    if (r < 0) {
        tt_store_err_set(err, "cannot read the listening address: %s", uv_strerror(r));
        st = TUTTI_ERR_IO;
        goto err_close_loop;
    }
    int real_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                              : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    snprintf(srv->addr, sizeof(srv->addr), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host,
             real_port);
    r = uv_async_init(&srv->loop, &srv->stop_async, srv_on_stop);
    if (r < 0) {
        tt_store_err_set(err, "cannot create the stop signal: %s", uv_strerror(r));
        st = TUTTI_ERR_INTERNAL;
        goto err_close_loop;
    }
    srv->stop_async.data = srv;
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
    TT_INFO("store server listening on %s", srv->addr);
    *srv_p = srv;
    *port_p = real_port;
    return TUTTI_OK;

err_close_loop:
    uv_walk(&srv->loop, srv_walk_close, NULL);
    srv_loop_drain(srv);
err_free_srv:
    free(srv->buckets);
    free(srv);
    return st;
err_free_srv_nomem:
    free(srv);
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
    srv_free_table(srv);
    free(srv);
}
