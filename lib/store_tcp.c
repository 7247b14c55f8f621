/* TCP store client.
 *
 * Requests go out one at a time per connection and each waits for its reply, with poll()
 * bounding every wait by the call's deadline. A handle keeps a small pool of connections
 * so that one thread blocked in get does not hold up the others (usually the pool holds
 * one). A connection on which anything went wrong, a deadline included, is closed rather
 * than returned: a reply that arrives late can then never be taken for the answer to a
 * later request. The next call connects again.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "store_impl.h"

typedef struct tcp_conn {
    int fd;
    pid_t pid;              /* a forked child must not talk on its parent's sockets */
    struct tcp_conn *next;
} tcp_conn_t;

typedef struct tcp_store {
    char *host;             /* where the client connects */
    int port;
    char addr[300];         /* host:port for messages */
    pthread_mutex_t lock;   /* guards idle */
    tcp_conn_t *idle;
    tt_store_server_t *server; /* embedded server, if this handle started one */
} tcp_store_t;

/* Whatever the requests carries; a field is a length and bytes. */
typedef struct tcp_field {
    const void *data;
    size_t len;
} tcp_field_t;

#define TCP_MAX_FIELDS_INLINE 8

static tcp_store_t *ts_of(tutti_store_t *s) { return s->impl; }

static void put_be64(unsigned char *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

static uint64_t get_be64(const unsigned char *p)
{
    return (uint64_t)get_be32(p) << 32 | get_be32(p + 4);
}

static void tcp_sleep_until(uint64_t ns, uint64_t deadline)
{
    uint64_t now = tt_now_ns();
    if (deadline != UINT64_MAX)
        ns = deadline <= now ? 0 : TT_MIN(ns, deadline - now);
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Wait for events on fd until the deadline: 1 ready, 0 deadline passed, -errno. */
static int tcp_poll(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int ms = tt_ms_left(deadline);
        if (ms == 0 && tt_now_ns() >= deadline)
            return 0;
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r > 0)
            return 1;
    }
}

static void tcp_sockaddr_str(const struct sockaddr *sa, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
        port = ntohs(a->sin6_port);
        snprintf(buf, len, "[%s]:%d", ip, port);
    } else {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
        port = ntohs(a->sin_port);
        snprintf(buf, len, "%s:%d", ip, port);
    }
}

/* One connect attempt to one address: fd on success, -errno. */
static int tcp_connect_addr(const struct addrinfo *ai, uint64_t deadline)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int e = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        if (errno != EINPROGRESS) {
            e = errno;
            goto err_close;
        }
        int r = tcp_poll(fd, POLLOUT, deadline);
        if (r <= 0) {
            e = r == 0 ? ETIMEDOUT : -r;
            goto err_close;
        }
        socklen_t elen = sizeof(e);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) < 0)
            e = errno;
        if (e)
            goto err_close;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;

err_close:
    close(fd);
    return -e;
}

/* Connect to the store, retrying with backoff until the deadline. */
static int tcp_connect(tcp_store_t *ts, uint64_t deadline, int *fd_p, tt_store_err_t *err)
{
    char portstr[16], tried[80] = "";
    snprintf(portstr, sizeof(portstr), "%d", ts->port);
    uint64_t start = tt_now_ns(), backoff = 10000000ull;
    int last = 0;
    const char *gai = NULL;
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
        struct addrinfo *res = NULL;
        int r = getaddrinfo(ts->host, portstr, &hints, &res);
        if (r != 0) {
            gai = gai_strerror(r);
        } else {
            gai = NULL;
            for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                int fd = tcp_connect_addr(ai, deadline);
                if (fd >= 0) {
                    freeaddrinfo(res);
                    *fd_p = fd;
                    return TUTTI_OK;
                }
                /* an attempt cut short by the deadline says less than the one before */
                if (fd != -ETIMEDOUT || !last)
                    last = -fd;
                tcp_sockaddr_str(ai->ai_addr, tried, sizeof(tried));
            }
            freeaddrinfo(res);
        }
        if (tt_now_ns() >= deadline)
            break;
        tcp_sleep_until(backoff, deadline);
        backoff = TT_MIN(backoff * 2, 500000000ull);
    }
    uint64_t ms = (tt_now_ns() - start) / 1000000u;
    if (gai)
        tt_store_err_set(err, "cannot resolve %s within %" PRIu64 " ms: %s", ts->addr, ms, gai);
    else
        tt_store_err_set(err, "cannot connect to %s within %" PRIu64 " ms: %s (last tried %s)",
                         ts->addr, ms, strerror(last), tried[0] ? tried : ts->addr);
    return TUTTI_ERR_TIMEOUT;
}

/* A pooled connection, or a new one. */
static int tcp_conn_take(tcp_store_t *ts, uint64_t deadline, tcp_conn_t **conn_p,
                         tt_store_err_t *err)
{
    pid_t me = getpid();
    for (;;) {
        pthread_mutex_lock(&ts->lock);
        tcp_conn_t *c = ts->idle;
        if (c)
            ts->idle = c->next;
        pthread_mutex_unlock(&ts->lock);
        if (!c)
            break;
        /* an idle connection with something to read was closed by the server (or
         * carries garbage): either way it is of no use */
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (c->pid == me && poll(&p, 1, 0) == 0) {
            *conn_p = c;
            return TUTTI_OK;
        }
        close(c->fd);
        free(c);
    }
    tcp_conn_t *c = calloc(1, sizeof(*c));
    if (!c) {
        tt_store_err_set(err, "out of memory");
        return TUTTI_ERR_NOMEM;
    }
    int st = tcp_connect(ts, deadline, &c->fd, err);
    if (st < 0) {
        free(c);
        return st;
    }
    c->pid = me;
    *conn_p = c;
    return TUTTI_OK;
}

static void tcp_conn_give(tcp_store_t *ts, tcp_conn_t *c)
{
    pthread_mutex_lock(&ts->lock);
    c->next = ts->idle;
    ts->idle = c;
    pthread_mutex_unlock(&ts->lock);
}

static void tcp_conn_drop(tcp_conn_t *c)
{
    close(c->fd);
    free(c);
}

/* Send the iovecs whole, or fail: 0, or -errno (-ETIMEDOUT at the deadline). */
static int tcp_send_iov(int fd, struct iovec *iov, int iovcnt, uint64_t deadline)
{
    while (iovcnt > 0) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return -errno;
            int r = tcp_poll(fd, POLLOUT, deadline);
            if (r < 0)
                return r;
            if (r == 0)
                return -ETIMEDOUT;
            continue;
        }
        size_t n = (size_t)w;
        while (iovcnt > 0 && n >= iov->iov_len) {
            n -= iov->iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= n;
        }
    }
    return 0;
}

/* Receive exactly len bytes: 0, -errno, -ETIMEDOUT, or -EPIPE when the server closed. */
static int tcp_recv_all(int fd, void *buf, size_t len, uint64_t deadline)
{
    char *p = buf;
    while (len > 0) {
        ssize_t r = recv(fd, p, len, 0);
        if (r > 0) {
            p += r;
            len -= (size_t)r;
            continue;
        }
        if (r == 0)
            return -EPIPE;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        int pr = tcp_poll(fd, POLLIN, deadline);
        if (pr < 0)
            return pr;
        if (pr == 0)
            return -ETIMEDOUT;
    }
    return 0;
}

/* One request and its reply. On success *reply_p is the malloc'ed payload (NUL after it)
 * and the return value the server's status; a negative server status comes back with
 * its message in err. timeout_what names what a deadline means, for the message. */
static int tcp_rpc(tutti_store_t *s, uint8_t cmd, const tcp_field_t *fields, size_t nfields,
                   uint64_t deadline, const char *timeout_what, void **reply_p,
                   size_t *replylen_p, tt_store_err_t *err)
{
    tcp_store_t *ts = ts_of(s);
    struct iovec iov_inline[2 + 2 * TCP_MAX_FIELDS_INLINE];
    unsigned char hdr_inline[4 * TCP_MAX_FIELDS_INLINE];
    struct iovec *iov = iov_inline;
    unsigned char *lens = hdr_inline;
    unsigned char head[5];
    int st;
    uint64_t start = tt_now_ns();

    if (nfields > TCP_MAX_FIELDS_INLINE) {
        iov = malloc((2 + 2 * nfields) * sizeof(*iov));
        lens = malloc(4 * nfields);
        if (!iov || !lens) {
            tt_store_err_set(err, "out of memory for a request of %zu fields", nfields);
            st = TUTTI_ERR_NOMEM;
            goto out_free_iov;
        }
    }
    uint64_t total = 1;
    int iovcnt = 0;
    iov[iovcnt++] = (struct iovec){head, sizeof(head)};
    for (size_t i = 0; i < nfields; i++) {
        put_be32(lens + 4 * i, (uint32_t)fields[i].len);
        iov[iovcnt++] = (struct iovec){lens + 4 * i, 4};
        if (fields[i].len)
            iov[iovcnt++] = (struct iovec){(void *)fields[i].data, fields[i].len};
        total += 4 + fields[i].len;
    }
    if (total > TT_STORE_MAX_FRAME) {
        tt_store_err_set(err, "request of %" PRIu64 " bytes is over the limit of %u", total,
                         TT_STORE_MAX_FRAME);
        st = TUTTI_ERR_INVALID_ARG;
        goto out_free_iov;
    }
    put_be32(head, (uint32_t)total);
    head[4] = cmd;

    tcp_conn_t *c;
    TT_CHECK_GOTO(tcp_conn_take(ts, deadline, &c, err), st, out_free_iov);
    int e = tcp_send_iov(c->fd, iov, iovcnt, deadline);
    unsigned char rhead[5];
    if (!e)
        e = tcp_recv_all(c->fd, rhead, sizeof(rhead), deadline);
    if (e) {
        tcp_conn_drop(c);
        uint64_t ms = (tt_now_ns() - start) / 1000000u;
        if (e == -ETIMEDOUT) {
            tt_store_err_set(err, "%s after %" PRIu64 " ms (server %s)", timeout_what, ms,
                             ts->addr);
            st = TUTTI_ERR_TIMEOUT;
        } else {
            tt_store_err_set(err, "connection to %s lost: %s",
                             ts->addr, e == -EPIPE ? "closed by the server" : strerror(-e));
            st = TUTTI_ERR_STORE;
        }
        goto out_free_iov;
    }
    uint32_t rlen = get_be32(rhead);
    if (rlen < 1 || rlen > TT_STORE_MAX_REPLY) {
        tcp_conn_drop(c);
        tt_store_err_set(err, "bad reply from %s: frame of %" PRIu32 " bytes", ts->addr, rlen);
        st = TUTTI_ERR_PROTOCOL;
        goto out_free_iov;
    }
    size_t plen = rlen - 1;
    char *payload = malloc(plen + 1);
    if (!payload) {
        tcp_conn_drop(c);
        tt_store_err_set(err, "out of memory for a reply of %zu bytes", plen);
        st = TUTTI_ERR_NOMEM;
        goto out_free_iov;
    }
    e = tcp_recv_all(c->fd, payload, plen, deadline);
    if (e) {
        tcp_conn_drop(c);
        free(payload);
        tt_store_err_set(err, "connection to %s lost in a reply: %s", ts->addr,
                         e == -ETIMEDOUT ? "timed out" : e == -EPIPE ? "closed by the server"
                                                                    : strerror(-e));
        st = e == -ETIMEDOUT ? TUTTI_ERR_TIMEOUT : TUTTI_ERR_STORE;
        goto out_free_iov;
    }
    payload[plen] = '\0';
    tcp_conn_give(ts, c);
    st = (int8_t)rhead[4];
    if (st > 0) {
        free(payload);
        tt_store_err_set(err, "bad reply from %s: status %d", ts->addr, st);
        st = TUTTI_ERR_PROTOCOL;
        goto out_free_iov;
    }
    if (st < 0) {
        tt_store_err_set(err, "server %s: %s", ts->addr, payload);
        free(payload);
        goto out_free_iov;
    }
    *reply_p = payload;
    *replylen_p = plen;
out_free_iov:
    if (iov != iov_inline) {
        free(iov);
        free(lens);
    }
    return st;
}

static int tcp_bad_reply(tutti_store_t *s, tt_store_err_t *err, void *reply, size_t len)
{
    free(reply);
    tt_store_err_set(err, "bad reply from %s: %zu bytes", ts_of(s)->addr, len);
    return TUTTI_ERR_PROTOCOL;
}

static int tcp_set(tutti_store_t *s, const char *key, const void *value, size_t len,
                   uint64_t deadline, tt_store_err_t *err)
{
    tcp_field_t f[2] = {{key, strlen(key)}, {value, len}};
    void *r;
    size_t rlen;
    TT_CHECK(tcp_rpc(s, TT_STORE_CMD_SET, f, 2, deadline, "no reply", &r, &rlen, err));
    free(r);
    return TUTTI_OK;
}

static int tcp_get(tutti_store_t *s, const char *key, void **value_p, size_t *len_p,
                   uint64_t deadline, tt_store_err_t *err)
{
    tcp_field_t f[1] = {{key, strlen(key)}};
    char what[200], kd[160];
    snprintf(what, sizeof(what), "key '%s' not set",
             tt_store_key_display(key, kd, sizeof(kd)));
    TT_CHECK(tcp_rpc(s, TT_STORE_CMD_GET, f, 1, deadline, what, value_p, len_p, err));
    return TUTTI_OK;
}

static int tcp_add(tutti_store_t *s, const char *key, int64_t delta, int64_t *result_p,
                   uint64_t deadline, tt_store_err_t *err)
{
    unsigned char d[8];
    put_be64(d, (uint64_t)delta);
    tcp_field_t f[2] = {{key, strlen(key)}, {d, 8}};
    void *r;
    size_t rlen;
    TT_CHECK(tcp_rpc(s, TT_STORE_CMD_ADD, f, 2, deadline, "no reply", &r, &rlen, err));
    if (rlen != 8)
        return tcp_bad_reply(s, err, r, rlen);
    *result_p = (int64_t)get_be64(r);
    free(r);
    return TUTTI_OK;
}

static int tcp_compare_set(tutti_store_t *s, const char *key, const void *expected, size_t elen,
                           const void *desired, size_t dlen, void **current_p,
                           size_t *curlen_p, uint64_t deadline, tt_store_err_t *err)
{
    tcp_field_t f[3] = {{key, strlen(key)}, {expected, elen}, {desired, dlen}};
    TT_CHECK(tcp_rpc(s, TT_STORE_CMD_CAS, f, 3, deadline, "no reply", current_p, curlen_p,
                     err));
    return TUTTI_OK;
}

static int tcp_keys_rpc(tutti_store_t *s, uint8_t cmd, const char *const *keys, size_t n,
                        uint64_t deadline, const char *what, void **reply_p, size_t *rlen_p,
                        tt_store_err_t *err)
{
    tcp_field_t inline_f[TCP_MAX_FIELDS_INLINE] = {{0}};
    tcp_field_t *f = n > TCP_MAX_FIELDS_INLINE ? malloc(n * sizeof(*f)) : inline_f;
    if (!f) {
        tt_store_err_set(err, "out of memory for %zu keys", n);
        return TUTTI_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++)
        f[i] = (tcp_field_t){keys[i], strlen(keys[i])};
    int st = tcp_rpc(s, cmd, f, n, deadline, what, reply_p, rlen_p, err);
    if (f != inline_f)
        free(f);
    return st;
}

static int tcp_wait(tutti_store_t *s, const char *const *keys, size_t n, uint64_t deadline,
                    tt_store_err_t *err)
{
    char what[256], kd[160];
    if (n == 1)
        snprintf(what, sizeof(what), "key '%s' not set",
                 tt_store_key_display(keys[0], kd, sizeof(kd)));
    else
        snprintf(what, sizeof(what), "not all of %zu keys set (first '%s', last '%s')", n,
                 tt_store_key_display(keys[0], kd, 72),
                 tt_store_key_display(keys[n - 1], kd + 80, 72));
    void *r;
    size_t rlen;
    TT_CHECK(tcp_keys_rpc(s, TT_STORE_CMD_WAIT, keys, n, deadline, what, &r, &rlen, err));
    free(r);
    return TUTTI_OK;
}

static int tcp_check(tutti_store_t *s, const char *const *keys, size_t n, int *exists_p,
                     uint64_t deadline, tt_store_err_t *err)
{
    void *r;
    size_t rlen;
    TT_CHECK(tcp_keys_rpc(s, TT_STORE_CMD_CHECK, keys, n, deadline, "no reply", &r, &rlen,
                          err));
    if (rlen != 1)
        return tcp_bad_reply(s, err, r, rlen);
    *exists_p = ((unsigned char *)r)[0] != 0;
    free(r);
    return TUTTI_OK;
}

static int tcp_del(tutti_store_t *s, const char *key, int *deleted_p, uint64_t deadline,
                   tt_store_err_t *err)
{
    tcp_field_t f[1] = {{key, strlen(key)}};
    void *r;
    size_t rlen;
    TT_CHECK(tcp_rpc(s, TT_STORE_CMD_DELETE, f, 1, deadline, "no reply", &r, &rlen, err));
    if (rlen != 1)
        return tcp_bad_reply(s, err, r, rlen);
    *deleted_p = ((unsigned char *)r)[0] != 0;
    free(r);
    return TUTTI_OK;
}

static void tcp_close(tutti_store_t *s)
{
    tcp_store_t *ts = ts_of(s);
    while (ts->idle) {
        tcp_conn_t *c = ts->idle;
        ts->idle = c->next;
        tcp_conn_drop(c);
    }
    if (ts->server)
        tt_store_server_stop(ts->server);
    pthread_mutex_destroy(&ts->lock);
    free(ts->host);
    free(ts);
    s->impl = NULL;
}

static const tt_store_ops_t tcp_ops = {
    .name = "tcp",
    .set = tcp_set,
    .get = tcp_get,
    .add = tcp_add,
    .compare_set = tcp_compare_set,
    .wait = tcp_wait,
    .check = tcp_check,
    .del = tcp_del,
    .multi_get = NULL,
    .close = tcp_close,
};

int tt_store_tcp_open(tutti_store_t **store_p, const char *host, int port, int is_server,
                      int timeout_ms, tt_store_err_t *err)
{
    int st;
    uint64_t deadline = tt_deadline_ns(timeout_ms);
    int v6 = strchr(host, ':') != NULL;
    tcp_store_t *ts = calloc(1, sizeof(*ts));
    if (!ts) {
        tt_store_err_set(err, "out of memory");
        return TUTTI_ERR_NOMEM;
    }
    pthread_mutex_init(&ts->lock, NULL);
    ts->port = port;
    if (is_server) {
        TT_CHECK_GOTO(tt_store_server_start(host, port, &ts->server, &ts->port, err), st,
                      err_free_ts);
    }
    /* the embedded client reaches a wildcard server over loopback */
    const char *connect_host = host;
    if (is_server && (!strcmp(host, "0.0.0.0") || !strcmp(host, "*") || !strcmp(host, "")))
        connect_host = "127.0.0.1";
    else if (is_server && !strcmp(host, "::"))
        connect_host = "::1";
    ts->host = strdup(connect_host);
    if (!ts->host) {
        tt_store_err_set(err, "out of memory");
        st = TUTTI_ERR_NOMEM;
        goto err_stop_server;
    }
    snprintf(ts->addr, sizeof(ts->addr), v6 ? "[%s]:%d" : "%s:%d", host, ts->port);

    /* connect now, so that an unreachable store fails here, within the open's deadline */
    tcp_conn_t *c;
    TT_CHECK_GOTO(tcp_conn_take(ts, deadline, &c, err), st, err_free_host);
    tcp_conn_give(ts, c);

    char url[320];
    snprintf(url, sizeof(url), "tcp://%s", ts->addr);
    tutti_store_t *s = tt_store_alloc(&tcp_ops, url, ts->port, timeout_ms);
    if (!s) {
        tt_store_err_set(err, "out of memory");
        st = TUTTI_ERR_NOMEM;
        goto err_free_host;
    }
    s->impl = ts;
    *store_p = s;
    return TUTTI_OK;

err_free_host:
    while (ts->idle) {
        tcp_conn_t *c2 = ts->idle;
        ts->idle = c2->next;
        tcp_conn_drop(c2);
    }
    free(ts->host);
err_stop_server:
    if (ts->server)
        tt_store_server_stop(ts->server);
err_free_ts:
    pthread_mutex_destroy(&ts->lock);
    free(ts);
    return st;
}
