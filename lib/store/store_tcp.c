/* TCP store client.
 *
 * Requests go out one at a time per connection and each waits for its reply, with poll()
 * bounding every wait, reconnecting included, by the call's deadline. A handle keeps a
 * small pool of connections so that one thread blocked in get does not hold up the others
 * (usually the pool holds one). A connection on which anything went wrong, a deadline
 * included, is closed rather than returned: a reply that arrives late can then never be
 * taken for the answer to a later request. The next call connects again.
 *
 * Every connection starts with the hello (store_impl.h). The first one tells the handle
 * which server instance it talks to; a later connection that reaches another instance
 * (the server was restarted and its keys are gone) fails, and one that reaches a server
 * with another label (a previous run's) is dropped and tried again. A stopping server
 * closes its listener first, so once a handle has talked to its server, a refused
 * connection means that server is gone: calls fail at once instead of retrying until
 * their deadline. Servers close idle connections (the hello says after how long): pooled
 * connections about that old are not used, and a request whose connection the server
 * closed before replying goes again on a new one where repeating it is harmless.
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

#include "base/auth.h"
#include "store/store_impl.h"
#include "store/store_net.h"

typedef struct tcp_conn {
    int fd;
    pid_t pid;        /* a forked child must not talk on its parent's sockets */
    uint64_t used_ns; /* when its last request ended */
    struct tcp_conn *next;
} tcp_conn_t;

typedef struct tcp_store {
    char *host; /* where the client connects */
    int port;
    char addr[300]; /* host:port for messages */
    char *secret;   /* the job secret; NULL: none */
    size_t secret_len;
    char *instance;       /* the only server label this handle accepts; NULL: any */
    pthread_mutex_t lock; /* guards idle and what the hello told */
    tcp_conn_t *idle;
    tt_net_dialer_t dialer; /* the host and its addresses */
    int known;              /* a hello succeeded, so the server's facts below are set */
    uint8_t server_id[TT_STORE_ID_LEN];
    uint32_t server_idle_ms;
    uint64_t server_quota;
    tt_store_server_t *server; /* embedded server, if this handle started one */
} tcp_store_t;

/* Whatever the requests carries; a field is a length and bytes. */
typedef struct tcp_field {
    const void *data;
    size_t len;
} tcp_field_t;

#define TCP_MAX_FIELDS_INLINE 8
#define TCP_MAX_HELLO_REPLY 1024u

static tcp_store_t *ts_of(tutti_store_t *s)
{
    return s->impl;
}

static const char *tcp_lost_str(int e)
{
    return e == -EPIPE ? "closed by the server" : strerror(-e);
}

/* ---- the hello ---- */

static size_t tcp_put_field(unsigned char *p, const void *data, size_t len)
{
    put_be32(p, (uint32_t)len);
    if (len)
        memcpy(p + 4, data, len);
    return 4 + len;
}

/* Next field of a reply; 0, or -1 when the payload ends inside it. */
static int tcp_take_field(const unsigned char **p, const unsigned char *end,
                          const unsigned char **data_p, uint32_t *len_p)
{
    if (end - *p < 4)
        return -1;
    uint32_t len = get_be32(*p);
    if ((size_t)(end - *p - 4) < len)
        return -1;
    *data_p = *p + 4;
    *len_p = len;
    *p += 4 + (size_t)len;
    return 0;
}

/* A small frame out, its reply in (payload NUL-terminated in reply, at most cap bytes):
 * 0 or -errno as tt_net_recv_all; -EPROTO for a reply longer than cap. */
static int tcp_exchange(int fd, unsigned char *frame, size_t len, uint64_t deadline, int *status_p,
                        unsigned char *reply, size_t cap, size_t *rlen_p)
{
    struct iovec iov = { frame, len };
    unsigned char head[5];
    int e = tt_net_send_iov(fd, &iov, 1, deadline);
    if (!e)
        e = tt_net_recv_all(fd, head, sizeof(head), deadline, NULL);
    if (e)
        return e;
    uint32_t rlen = get_be32(head);
    if (rlen < 1 || rlen - 1 > cap)
        return -EPROTO;
    e = tt_net_recv_all(fd, reply, rlen - 1, deadline, NULL);
    if (e)
        return e;
    reply[rlen - 1] = '\0';
    *status_p = (int8_t)head[4];
    *rlen_p = rlen - 1;
    return 0;
}

enum { TCP_HELLO_OK = TT_NET_HELLO_OK, TCP_HELLO_RETRY = TT_NET_HELLO_RETRY };

/* What the hello reply says. */
typedef struct tcp_hello_reply {
    uint32_t version, flags, idle_ms;
    uint64_t quota;
    const unsigned char *id;
    char label[TT_STORE_MAX_INSTANCE + 1];
    const unsigned char *challenge, *answer; /* NULL without authentication */
} tcp_hello_reply_t;

static int tcp_parse_hello(const unsigned char *p, size_t len, tcp_hello_reply_t *h)
{
    static const uint32_t sizes[] = { 4, 4, 4, 8, TT_STORE_ID_LEN };
    const unsigned char *end = p + len, *f[8];
    uint32_t flen[8];
    int n = 0;
    while (p < end && n < 8) {
        if (tcp_take_field(&p, end, &f[n], &flen[n]) < 0)
            return -1;
        n++;
    }
    if (n < 6 || flen[5] > TT_STORE_MAX_INSTANCE || (n != 6 && n != 8))
        return -1;
    for (int i = 0; i < 5; i++)
        if (flen[i] != sizes[i])
            return -1;
    h->version = get_be32(f[0]);
    h->flags = get_be32(f[1]);
    h->idle_ms = get_be32(f[2]);
    h->quota = get_be64(f[3]);
    h->id = f[4];
    memcpy(h->label, f[5], flen[5]);
    h->label[flen[5]] = '\0';
    h->challenge = h->answer = NULL;
    if (n == 8) {
        if (flen[6] != TT_AUTH_CHALLENGE_LEN || flen[7] != TT_SHA256_LEN)
            return -1;
        h->challenge = f[6];
        h->answer = f[7];
    }
    return 0;
}

/* The connection failed during the hello (e as tt_net_recv_all): worth another try, unless
 * the server's reply made no sense. */
static int tcp_hello_lost(tcp_store_t *ts, int e, const char *step, char *cause, size_t causelen,
                          tt_store_err_t *err)
{
    if (e == -EPROTO) {
        tt_store_err_set(err, "bad %s reply from %s: not a tutti store server?", step, ts->addr);
        return TUTTI_ERR_PROTOCOL;
    }
    if (e == -ETIMEDOUT) {
        /* cut short by the deadline: the attempt before says more */
        if (!cause[0] || !strncmp(cause, "connect to", 10))
            snprintf(cause, causelen, "no answer to the %s from %s", step, ts->addr);
    } else if (e == -EPIPE || e == -ECONNRESET)
        snprintf(cause, causelen,
                 "%s closed the connection during the %s (busy, stopping, "
                 "or a tutti-store older than protocol %u)",
                 ts->addr, step, TT_STORE_PROTOCOL);
    else
        snprintf(cause, causelen, "%s from %s: %s", step, ts->addr, strerror(-e));
    return TCP_HELLO_RETRY;
}

/* The server answered the hello with an error: refusals are final, being busy is not. */
static int tcp_hello_refused(tcp_store_t *ts, int status, const char *msg, char *cause,
                             size_t causelen, tt_store_err_t *err)
{
    if (status == TUTTI_ERR_AUTH || status == TUTTI_ERR_PROTOCOL) {
        tt_store_err_set(err, "store server %s refused this client: %s", ts->addr, msg);
        return status;
    }
    snprintf(cause, causelen, "store server %s: %s", ts->addr, msg);
    return TCP_HELLO_RETRY;
}

/* Both sides must have the secret, and the server must prove it has ours. */
static int tcp_hello_check_auth(tcp_store_t *ts, const tcp_hello_reply_t *h,
                                const uint8_t *challenge, tt_store_err_t *err)
{
    if (!ts->secret && !h->challenge) {
        if (h->flags & TT_STORE_HELLO_AUTH) {
            tt_store_err_set(err,
                             "store server %s requires the job secret (TUTTI_AUTH_TOKEN "
                             "or TUTTI_AUTH_TOKEN_FILE) and this client has none",
                             ts->addr);
            return TUTTI_ERR_AUTH;
        }
        return TUTTI_OK;
    }
    if (!ts->secret || !(h->flags & TT_STORE_HELLO_AUTH) || !h->challenge) {
        tt_store_err_set(err,
                         "store server %s does not check the job secret (it was started "
                         "without one) but this client has one: not trusting it",
                         ts->addr);
        return TUTTI_ERR_AUTH;
    }
    uint8_t want[TT_SHA256_LEN];
    tt_auth_answer(ts->secret, ts->secret_len, TT_STORE_CTX_SERVER, challenge, want);
    if (!tt_auth_equal(want, h->answer, sizeof(want))) {
        tt_store_err_set(err,
                         "store server %s does not know this job secret: the secrets "
                         "differ, or it is not this job's store",
                         ts->addr);
        return TUTTI_ERR_AUTH;
    }
    return TUTTI_OK;
}

/* Whether this is the server instance the handle talks to; remembers it the first time.
 * A handle that knows its server and meets another instance fails: its keys are gone. One
 * that has not met its server yet passes over a server with another label (a previous
 * run's, still stopping): its own may come up yet. */
static int tcp_hello_check_server(tcp_store_t *ts, const tcp_hello_reply_t *h, char *cause,
                                  size_t causelen, tt_store_err_t *err)
{
    int st = TCP_HELLO_OK;
    pthread_mutex_lock(&ts->lock);
    if (ts->known) {
        if (memcmp(ts->server_id, h->id, TT_STORE_ID_LEN))
            st = TUTTI_ERR_STORE;
    } else if (ts->instance && strcmp(ts->instance, h->label)) {
        st = TCP_HELLO_RETRY;
    } else {
        ts->known = 1;
        memcpy(ts->server_id, h->id, TT_STORE_ID_LEN);
        ts->server_idle_ms = h->idle_ms;
        ts->server_quota = h->quota;
    }
    pthread_mutex_unlock(&ts->lock);
    if (st == TUTTI_ERR_STORE)
        tt_store_err_set(err,
                         "the store server at %s was restarted: another server instance "
                         "answered, without the keys set before",
                         ts->addr);
    else if (st == TCP_HELLO_RETRY)
        snprintf(cause, causelen,
                 "the store server at %s is instance '%.64s', not '%.64s' "
                 "(a previous run's server still up?)",
                 ts->addr, h->label, ts->instance);
    return st;
}

/* Prove the secret to the server, answering its challenge. */
static int tcp_hello_auth(tcp_store_t *ts, int fd, const tcp_hello_reply_t *h, uint64_t deadline,
                          char *cause, size_t causelen, tt_store_err_t *err)
{
    unsigned char frame[5 + 4 + TT_SHA256_LEN], reply[256];
    uint8_t answer[TT_SHA256_LEN];
    tt_auth_answer(ts->secret, ts->secret_len, TT_STORE_CTX_CLIENT, h->challenge, answer);
    size_t n = 5 + tcp_put_field(frame + 5, answer, sizeof(answer));
    put_be32(frame, (uint32_t)(n - 4));
    frame[4] = TT_STORE_CMD_AUTH;
    int status;
    size_t rlen;
    int e = tcp_exchange(fd, frame, n, deadline, &status, reply, sizeof(reply) - 1, &rlen);
    if (e)
        return tcp_hello_lost(ts, e, "authentication", cause, causelen, err);
    if (status < 0)
        return tcp_hello_refused(ts, status, (char *)reply, cause, causelen, err);
    return TCP_HELLO_OK;
}

/* The hello on a new connection: TCP_HELLO_OK, TCP_HELLO_RETRY with the reason in cause,
 * or a negative status with the reason in err. */
static int tcp_hello(tcp_store_t *ts, int fd, uint64_t deadline, char *cause, size_t causelen,
                     tt_store_err_t *err)
{
    uint8_t challenge[TT_AUTH_CHALLENGE_LEN];
    unsigned char frame[5 + 3 * 4 + 32 + 4 + TT_AUTH_CHALLENGE_LEN], num[4];
    unsigned char reply[TCP_MAX_HELLO_REPLY + 1];
    if (ts->secret && tt_auth_random(challenge, sizeof(challenge)) < 0) {
        tt_store_err_set(err, "no random bytes for a challenge");
        return TUTTI_ERR_IO;
    }
    size_t n = 5;
    put_be32(num, TT_STORE_PROTOCOL);
    n += tcp_put_field(frame + n, TT_STORE_MAGIC, strlen(TT_STORE_MAGIC));
    n += tcp_put_field(frame + n, num, 4);
    n += tcp_put_field(frame + n, challenge, ts->secret ? sizeof(challenge) : 0);
    put_be32(frame, (uint32_t)(n - 4));
    frame[4] = TT_STORE_CMD_HELLO;
    int status;
    size_t rlen;
    int e = tcp_exchange(fd, frame, n, deadline, &status, reply, TCP_MAX_HELLO_REPLY, &rlen);
    if (e)
        return tcp_hello_lost(ts, e, "hello", cause, causelen, err);
    if (status < 0)
        return tcp_hello_refused(ts, status, (char *)reply, cause, causelen, err);
    tcp_hello_reply_t h;
    if (status > 0 || tcp_parse_hello(reply, rlen, &h) < 0 || h.version != TT_STORE_PROTOCOL) {
        tt_store_err_set(err,
                         "bad hello reply from %s (%zu bytes): not a tutti store server "
                         "of protocol %u?",
                         ts->addr, rlen, TT_STORE_PROTOCOL);
        return TUTTI_ERR_PROTOCOL;
    }
    TT_CHECK(tcp_hello_check_auth(ts, &h, challenge, err));
    int r = tcp_hello_check_server(ts, &h, cause, causelen, err);
    if (r != TCP_HELLO_OK || !ts->secret)
        return r;
    return tcp_hello_auth(ts, fd, &h, deadline, cause, causelen, err);
}

/* ---- connections ---- */

static int tcp_known(tcp_store_t *ts)
{
    pthread_mutex_lock(&ts->lock);
    int k = ts->known;
    pthread_mutex_unlock(&ts->lock);
    return k;
}

typedef struct tcp_dial {
    tcp_store_t *ts;
    int fd; /* the connection made */
} tcp_dial_t;

static int tcp_dial_hello(void *ctx, int fd, uint64_t deadline, char *cause, size_t causelen,
                          tt_store_err_t *err)
{
    tcp_dial_t *dl = ctx;
    int r = tcp_hello(dl->ts, fd, deadline, cause, causelen, err);
    if (r == TCP_HELLO_OK)
        dl->fd = fd;
    else
        close(fd);
    return r;
}

static int tcp_dial_gone(void *ctx)
{
    return tcp_known(((tcp_dial_t *)ctx)->ts);
}

/* Connect and say hello, retrying with backoff until the deadline. Once this handle has
 * talked to its server, a refusal on every address means that server stopped (it closes
 * its listener first): no use retrying. */
static int tcp_connect(tcp_store_t *ts, uint64_t deadline, int *fd_p, tt_store_err_t *err)
{
    tcp_dial_t dl = { .ts = ts, .fd = -1 };
    tt_net_hello_t h = { .hello = tcp_dial_hello, .gone_if_refused = tcp_dial_gone, .ctx = &dl };
    int st = tt_net_dial(&ts->dialer, deadline, &h, err);
    *fd_p = dl.fd; /* -1 unless st is TUTTI_OK */
    return st;
}

static void tcp_conn_drop(tcp_conn_t *c)
{
    close(c->fd);
    free(c);
}

/* Whether a pooled connection can carry a request: this process's, not closed by the
 * server (then it would read as ready), and not so long unused that the server is about
 * to close it as idle. */
static int tcp_conn_usable(tcp_store_t *ts, tcp_conn_t *c, uint64_t now)
{
    if (c->pid != getpid())
        return 0;
    struct pollfd p = { .fd = c->fd, .events = POLLIN };
    if (poll(&p, 1, 0) != 0)
        return 0;
    uint64_t idle = ts->server_idle_ms;
    if (idle) {
        uint64_t margin = TT_MIN(1000u, idle / 4);
        if (now - c->used_ns >= (idle - margin) * 1000000ull)
            return 0;
    }
    return 1;
}

/* A pooled connection, or a new one. */
static int tcp_conn_take(tcp_store_t *ts, uint64_t deadline, tcp_conn_t **conn_p,
                         tt_store_err_t *err)
{
    uint64_t now = tt_now_ns();
    for (;;) {
        pthread_mutex_lock(&ts->lock);
        tcp_conn_t *c = ts->idle;
        if (c)
            ts->idle = c->next;
        pthread_mutex_unlock(&ts->lock);
        if (!c)
            break;
        if (tcp_conn_usable(ts, c, now)) {
            *conn_p = c;
            return TUTTI_OK;
        }
        tcp_conn_drop(c);
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
    c->pid = getpid();
    *conn_p = c;
    return TUTTI_OK;
}

static void tcp_conn_give(tcp_store_t *ts, tcp_conn_t *c)
{
    c->used_ns = tt_now_ns();
    pthread_mutex_lock(&ts->lock);
    c->next = ts->idle;
    ts->idle = c;
    pthread_mutex_unlock(&ts->lock);
}

/* Close the pooled connections (the server closed one: the others are likely gone too). */
static void tcp_pool_flush(tcp_store_t *ts)
{
    pthread_mutex_lock(&ts->lock);
    tcp_conn_t *c = ts->idle;
    ts->idle = NULL;
    pthread_mutex_unlock(&ts->lock);
    while (c) {
        tcp_conn_t *next = c->next;
        tcp_conn_drop(c);
        c = next;
    }
}

/* ---- requests ---- */

/* Requests that may go again when the server closed the connection before replying (it
 * closes idle connections, and evicts them under pressure): repeating them changes
 * nothing, or, for SET, no more than if the first had arrived later. Never ADD, CAS or
 * DELETE: the first one may have been served. */
static int tcp_retry_safe(uint8_t cmd)
{
    return cmd == TT_STORE_CMD_GET || cmd == TT_STORE_CMD_WAIT || cmd == TT_STORE_CMD_CHECK ||
           cmd == TT_STORE_CMD_SET || cmd == TT_STORE_CMD_PING;
}

/* Send a request and read its reply's head: 0 or -errno; *got_p counts reply bytes. */
static int tcp_rpc_send(tcp_conn_t *c, const struct iovec *iov, struct iovec *work, int iovcnt,
                        uint64_t deadline, unsigned char rhead[5], size_t *got_p)
{
    memcpy(work, iov, (size_t)iovcnt * sizeof(*iov));
    *got_p = 0;
    int e = tt_net_send_iov(c->fd, work, iovcnt, deadline);
    if (!e)
        e = tt_net_recv_all(c->fd, rhead, 5, deadline, got_p);
    return e;
}

/* The reply's payload, after its head: 0 with *reply_p malloc'ed, or a status. */
static int tcp_rpc_payload(tcp_store_t *ts, tcp_conn_t *c, const unsigned char rhead[5],
                           uint64_t deadline, char **reply_p, size_t *plen_p, tt_store_err_t *err)
{
    uint32_t rlen = get_be32(rhead);
    if (rlen < 1 || rlen > TT_STORE_MAX_REPLY) {
        tt_store_err_set(err, "bad reply from %s: frame of %" PRIu32 " bytes", ts->addr, rlen);
        return TUTTI_ERR_PROTOCOL;
    }
    size_t plen = rlen - 1;
    char *payload = malloc(plen + 1);
    if (!payload) {
        tt_store_err_set(err, "out of memory for a reply of %zu bytes", plen);
        return TUTTI_ERR_NOMEM;
    }
    int e = tt_net_recv_all(c->fd, payload, plen, deadline, NULL);
    if (e) {
        free(payload);
        tt_store_err_set(err, "connection to %s lost in a reply: %s", ts->addr,
                         e == -ETIMEDOUT ? "timed out" : tcp_lost_str(e));
        return e == -ETIMEDOUT ? TUTTI_ERR_TIMEOUT : TUTTI_ERR_STORE;
    }
    payload[plen] = '\0';
    *reply_p = payload;
    *plen_p = plen;
    return TUTTI_OK;
}

/* One request and its reply. On success *reply_p is the malloc'ed payload (NUL after it)
 * and the return value the server's status; a negative server status comes back with
 * its message in err. timeout_what names what a deadline means, for the message. */
static int tcp_rpc(tutti_store_t *s, uint8_t cmd, const tcp_field_t *fields, size_t nfields,
                   uint64_t deadline, const char *timeout_what, void **reply_p, size_t *replylen_p,
                   tt_store_err_t *err)
{
    tcp_store_t *ts = ts_of(s);
    struct iovec iov_inline[2 * (2 + 2 * TCP_MAX_FIELDS_INLINE)];
    unsigned char hdr_inline[4 * TCP_MAX_FIELDS_INLINE];
    struct iovec *iov = iov_inline;
    unsigned char *lens = hdr_inline;
    unsigned char head[5], rhead[5];
    int st;
    uint64_t start = tt_now_ns();

    if (nfields > TCP_MAX_FIELDS_INLINE) {
        iov = malloc(2 * (2 + 2 * nfields) * sizeof(*iov));
        lens = malloc(4 * nfields);
        if (!iov || !lens) {
            tt_store_err_set(err, "out of memory for a request of %zu fields", nfields);
            st = TUTTI_ERR_NOMEM;
            goto out_free_iov;
        }
    }
    uint64_t total = 1;
    int iovcnt = 0;
    iov[iovcnt++] = (struct iovec){ head, sizeof(head) };
    for (size_t i = 0; i < nfields; i++) {
        put_be32(lens + 4 * i, (uint32_t)fields[i].len);
        iov[iovcnt++] = (struct iovec){ lens + 4 * i, 4 };
        if (fields[i].len)
            iov[iovcnt++] = (struct iovec){ (void *)fields[i].data, fields[i].len };
        total += 4 + fields[i].len;
    }
    uint64_t quota = ts->server_quota;
    if (total > TT_STORE_MAX_FRAME || (quota && total + 4 > quota)) {
        tt_store_err_set(err, "request of %" PRIu64 " bytes is over %s of %" PRIu64 " bytes",
                         total + 4,
                         total > TT_STORE_MAX_FRAME
                             ? "the limit"
                             : "the store server's per-client quota (TUTTI_STORE_CLIENT_QUOTA)",
                         total > TT_STORE_MAX_FRAME ? (uint64_t)TT_STORE_MAX_FRAME : quota);
        st = TUTTI_ERR_INVALID_ARG;
        goto out_free_iov;
    }
    put_be32(head, (uint32_t)total);
    head[4] = cmd;

    tcp_conn_t *c;
    for (int attempt = 0;; attempt++) {
        TT_CHECK_GOTO(tcp_conn_take(ts, deadline, &c, err), st, out_free_iov);
        size_t got;
        int e = tcp_rpc_send(c, iov, iov + iovcnt, iovcnt, deadline, rhead, &got);
        if (!e)
            break;
        tcp_conn_drop(c);
        if (attempt == 0 && got == 0 && (e == -EPIPE || e == -ECONNRESET) && tcp_retry_safe(cmd)) {
            tcp_pool_flush(ts);
            continue;
        }
        uint64_t ms = (tt_now_ns() - start) / 1000000u;
        if (e == -ETIMEDOUT) {
            tt_store_err_set(err, "%s after %" PRIu64 " ms (server %s)", timeout_what, ms,
                             ts->addr);
            st = TUTTI_ERR_TIMEOUT;
        } else {
            tt_store_err_set(err, "connection to %s lost: %s", ts->addr, tcp_lost_str(e));
            st = TUTTI_ERR_STORE;
        }
        goto out_free_iov;
    }
    char *payload;
    size_t plen;
    st = tcp_rpc_payload(ts, c, rhead, deadline, &payload, &plen, err);
    if (st < 0) {
        tcp_conn_drop(c);
        goto out_free_iov;
    }
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

/* An rpc whose reply is exactly len bytes, copied to out. */
static int tcp_rpc_exact(tutti_store_t *s, uint8_t cmd, const tcp_field_t *f, size_t n,
                         uint64_t deadline, void *out, size_t len, tt_store_err_t *err)
{
    void *r;
    size_t rlen;
    TT_CHECK(tcp_rpc(s, cmd, f, n, deadline, "no reply", &r, &rlen, err));
    if (rlen != len)
        return tcp_bad_reply(s, err, r, rlen);
    memcpy(out, r, len);
    free(r);
    return TUTTI_OK;
}

static int tcp_set(tutti_store_t *s, const char *key, const void *value, size_t len,
                   uint64_t deadline, tt_store_err_t *err)
{
    tcp_field_t f[2] = { { key, strlen(key) }, { value, len } };
    void *r;
    size_t rlen;
    TT_CHECK(tcp_rpc(s, TT_STORE_CMD_SET, f, 2, deadline, "no reply", &r, &rlen, err));
    free(r);
    return TUTTI_OK;
}

static int tcp_get(tutti_store_t *s, const char *key, void **value_p, size_t *len_p,
                   uint64_t deadline, tt_store_err_t *err)
{
    tcp_field_t f[1] = { { key, strlen(key) } };
    char what[200], kd[160];
    snprintf(what, sizeof(what), "key '%s' not set", tt_store_key_display(key, kd, sizeof(kd)));
    TT_CHECK(tcp_rpc(s, TT_STORE_CMD_GET, f, 1, deadline, what, value_p, len_p, err));
    return TUTTI_OK;
}

static int tcp_add(tutti_store_t *s, const char *key, int64_t delta, int64_t *result_p,
                   uint64_t deadline, tt_store_err_t *err)
{
    unsigned char d[8];
    put_be64(d, (uint64_t)delta);
    tcp_field_t f[2] = { { key, strlen(key) }, { d, 8 } };
    TT_CHECK(tcp_rpc_exact(s, TT_STORE_CMD_ADD, f, 2, deadline, d, 8, err));
    *result_p = (int64_t)get_be64(d);
    return TUTTI_OK;
}

static int tcp_compare_set(tutti_store_t *s, const char *key, const void *expected, size_t elen,
                           const void *desired, size_t dlen, void **current_p, size_t *curlen_p,
                           uint64_t deadline, tt_store_err_t *err)
{
    tcp_field_t f[3] = { { key, strlen(key) }, { expected, elen }, { desired, dlen } };
    TT_CHECK(tcp_rpc(s, TT_STORE_CMD_CAS, f, 3, deadline, "no reply", current_p, curlen_p, err));
    return TUTTI_OK;
}

/* How many of the n keys, from the first, go in one CHECK or WAIT: at most
 * TT_STORE_MAX_KEYS, in a frame within the limit and the server's quota, together with
 * the memory a WAIT's waiter holds there (TT_STORE_WAIT_KEY_COST a key, as the server
 * counts it). At least one. */
static size_t tcp_keys_batch(const tcp_store_t *ts, uint8_t cmd, const tcp_field_t *f, size_t n)
{
    uint64_t budget = TT_STORE_MAX_FRAME, used = 0;
    if (ts->server_quota && ts->server_quota < budget)
        budget = ts->server_quota;
    budget = budget > TT_STORE_FRAME_MARGIN ? budget - TT_STORE_FRAME_MARGIN : 0;
    size_t i;
    for (i = 0; i < n && i < TT_STORE_MAX_KEYS; i++) {
        uint64_t cost = 4 + (uint64_t)f[i].len;
        if (cmd == TT_STORE_CMD_WAIT)
            cost += TT_STORE_WAIT_KEY_COST + f[i].len;
        if (i && used + cost > budget)
            break;
        used += cost;
    }
    return i;
}

/* CHECK (*all_p: whether every key exists) or WAIT on n keys, in as many requests as the
 * server's limits take (tcp_keys_batch): a WAIT waits for each batch in turn, a CHECK
 * stops at the first batch that lacks a key. */
static int tcp_keys_rpc(tutti_store_t *s, uint8_t cmd, const char *const *keys, size_t n,
                        uint64_t deadline, const char *what, int *all_p, tt_store_err_t *err)
{
    tcp_field_t inline_f[TCP_MAX_FIELDS_INLINE] = { { 0 } };
    tcp_field_t *f = n > TCP_MAX_FIELDS_INLINE ? malloc(n * sizeof(*f)) : inline_f;
    if (!f) {
        tt_store_err_set(err, "out of memory for %zu keys", n);
        return TUTTI_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++)
        f[i] = (tcp_field_t){ keys[i], strlen(keys[i]) };
    int st = TUTTI_OK, all = 1;
    for (size_t off = 0, m; off < n && all && st >= 0; off += m) {
        m = tcp_keys_batch(ts_of(s), cmd, f + off, n - off);
        void *r;
        size_t rlen;
        st = tcp_rpc(s, cmd, f + off, m, deadline, what, &r, &rlen, err);
        if (st < 0)
            break;
        if (cmd == TT_STORE_CMD_CHECK && rlen != 1)
            st = tcp_bad_reply(s, err, r, rlen);
        else if (cmd == TT_STORE_CMD_CHECK)
            all = ((unsigned char *)r)[0] != 0;
        if (st >= 0)
            free(r);
    }
    if (f != inline_f)
        free(f);
    if (st >= 0 && all_p)
        *all_p = all;
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
    return tcp_keys_rpc(s, TT_STORE_CMD_WAIT, keys, n, deadline, what, NULL, err);
}

static int tcp_check(tutti_store_t *s, const char *const *keys, size_t n, int *exists_p,
                     uint64_t deadline, tt_store_err_t *err)
{
    return tcp_keys_rpc(s, TT_STORE_CMD_CHECK, keys, n, deadline, "no reply", exists_p, err);
}

static int tcp_del(tutti_store_t *s, const char *key, int *deleted_p, uint64_t deadline,
                   tt_store_err_t *err)
{
    tcp_field_t f[1] = { { key, strlen(key) } };
    unsigned char r;
    TT_CHECK(tcp_rpc_exact(s, TT_STORE_CMD_DELETE, f, 1, deadline, &r, 1, err));
    *deleted_p = r != 0;
    return TUTTI_OK;
}

/* DELETE_PREFIX or COUNT_PREFIX: the count of keys under prefix. */
static int tcp_prefix(tutti_store_t *s, int cmd, const char *prefix, size_t *count_p,
                      uint64_t deadline, tt_store_err_t *err)
{
    tcp_field_t f[1] = { { prefix, strlen(prefix) } };
    unsigned char r[8];
    TT_CHECK(tcp_rpc_exact(s, cmd, f, 1, deadline, r, 8, err));
    *count_p = (size_t)get_be64(r);
    return TUTTI_OK;
}

static int tcp_del_prefix(tutti_store_t *s, const char *prefix, size_t *count_p, uint64_t deadline,
                          tt_store_err_t *err)
{
    return tcp_prefix(s, TT_STORE_CMD_DELETE_PREFIX, prefix, count_p, deadline, err);
}

static int tcp_count_prefix(tutti_store_t *s, const char *prefix, size_t *count_p,
                            uint64_t deadline, tt_store_err_t *err)
{
    return tcp_prefix(s, TT_STORE_CMD_COUNT_PREFIX, prefix, count_p, deadline, err);
}

static int tcp_compare_del(tutti_store_t *s, const char *key, const void *expected, size_t elen,
                           int *deleted_p, uint64_t deadline, tt_store_err_t *err)
{
    tcp_field_t f[2] = { { key, strlen(key) }, { expected, elen } };
    unsigned char r;
    TT_CHECK(tcp_rpc_exact(s, TT_STORE_CMD_CAD, f, 2, deadline, &r, 1, err));
    *deleted_p = r != 0;
    return TUTTI_OK;
}

static void tcp_free(tcp_store_t *ts)
{
    tcp_pool_flush(ts);
    if (ts->server)
        tt_store_server_stop(ts->server);
    tt_net_dialer_fini(&ts->dialer);
    if (ts->secret)
        memset(ts->secret, 0, ts->secret_len);
    free(ts->secret);
    free(ts->instance);
    pthread_mutex_destroy(&ts->lock);
    free(ts->host);
    free(ts);
}

static void tcp_close(tutti_store_t *s)
{
    tcp_free(ts_of(s));
    s->impl = NULL;
}

/* no multi_get: store.c builds it from get */
static const tt_store_ops_t tcp_ops = {
    .name = "tcp",
    TT_STORE_OPS_FNS(tcp),
    .wait = tcp_wait,
};

static int tcp_copy_cfg(tcp_store_t *ts, const tt_store_tcp_cfg_t *cfg)
{
    if (cfg->secret) {
        ts->secret = malloc(cfg->secret_len + 1);
        if (!ts->secret)
            return TUTTI_ERR_NOMEM;
        memcpy(ts->secret, cfg->secret, cfg->secret_len);
        ts->secret[cfg->secret_len] = '\0';
        ts->secret_len = cfg->secret_len;
    }
    if (cfg->instance && !(ts->instance = strdup(cfg->instance)))
        return TUTTI_ERR_NOMEM;
    return TUTTI_OK;
}

int tt_store_tcp_open(tutti_store_t **store_p, const char *host, int port, int is_server,
                      const tt_store_tcp_cfg_t *cfg, tt_store_err_t *err)
{
    int st;
    uint64_t deadline = tt_deadline_ns(cfg->timeout_ms);
    int v6 = strchr(host, ':') != NULL;
    tcp_store_t *ts = calloc(1, sizeof(*ts));
    if (!ts) {
        tt_store_err_set(err, "out of memory");
        return TUTTI_ERR_NOMEM;
    }
    pthread_mutex_init(&ts->lock, NULL);
    tt_net_dialer_init(&ts->dialer, NULL, 0); /* its server's place below */
    ts->port = port;
    /* the embedded client reaches a wildcard server over loopback */
    const char *connect_host = host;
    if (is_server && (!strcmp(host, "0.0.0.0") || !strcmp(host, "*") || !strcmp(host, "")))
        connect_host = "127.0.0.1";
    else if (is_server && !strcmp(host, "::"))
        connect_host = "::1";
    ts->host = strdup(connect_host);
    if (!ts->host || tcp_copy_cfg(ts, cfg) < 0) {
        tt_store_err_set(err, "out of memory");
        st = TUTTI_ERR_NOMEM;
        goto err_free_ts;
    }
    if (is_server)
        TT_CHECK_GOTO(tt_store_server_start(host, port, cfg, &ts->server, &ts->port, err), st,
                      err_free_ts);
    snprintf(ts->addr, sizeof(ts->addr), v6 ? "[%s]:%d" : "%s:%d", host, ts->port);
    ts->dialer.host = ts->host;
    ts->dialer.port = ts->port;

    /* connect now, so that an unreachable store fails here, within the open's deadline */
    tcp_conn_t *c;
    TT_CHECK_GOTO(tcp_conn_take(ts, deadline, &c, err), st, err_free_ts);
    tcp_conn_give(ts, c);

    char url[320];
    snprintf(url, sizeof(url), "tcp://%s", ts->addr);
    tutti_store_t *s = tt_store_alloc(&tcp_ops, url, ts->port, cfg->timeout_ms);
    if (!s) {
        tt_store_err_set(err, "out of memory");
        st = TUTTI_ERR_NOMEM;
        goto err_free_ts;
    }
    s->impl = ts;
    *store_p = s;
    return TUTTI_OK;

err_free_ts:
    tcp_free(ts);
    return st;
}

size_t tt_store_tcp_server_keys(tutti_store_t *store)
{
    tutti_store_t *b = store ? store->base : NULL;
    if (!b || b->ops != &tcp_ops)
        return (size_t)-1;
    tcp_store_t *ts = b->impl;
    return ts->server ? tt_store_server_nkeys(ts->server) : (size_t)-1;
}
