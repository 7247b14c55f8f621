/* Redis store client: redis://[[user]:password@]host[:port][/db] (what Gloo's RedisStore
 * offers, without hiredis).
 *
 * Commands go out in RESP2 (arrays of bulk strings) one at a time per connection, and
 * every wait, connecting included, is bounded by the call's deadline with poll(). As in
 * the tcp client, a handle pools its connections, a connection on which anything went
 * wrong (a deadline included) is closed rather than pooled, a forked child never uses
 * its parent's, and a request whose connection was closed before any reply arrived goes
 * again on a new one only where repeating it is harmless (GET, EXISTS, SET).
 *
 * Mapping: set SET; get GET, polled until the key exists; add INCRBY (values are decimal
 * text, as the other stores keep counters); check and wait EXISTS; del DEL; del_prefix
 * SCAN MATCH then DEL; compare_set and compare_del a Lua script each (EVAL), so each is one
 * atomic step on the server. Redis has no way to wait for a key without configuring the
 * server (keyspace notifications), so waits poll: 1 ms at first, doubling up to 20 ms.
 * Replies are parsed with limits (line length, bulk size, array size, nesting, and a
 * budget of elements and bytes for a whole reply; no array where the command answers
 * with none): a server that is not Redis gets a protocol error naming the byte it sent,
 * never a crash nor memory without bound.
 *
 * The host name is resolved within the call's deadline (store_net.c's helper thread), and
 * resolved again after a connect that failed on every address, so that a server moved to
 * another address (a DNS failover) is followed. Connecting retries only what may pass
 * (refused connections, closed ones, LOADING, BUSY, a full client table); the server's
 * other refusals (protected mode's DENIED, an unknown command, NOAUTH, WRONGPASS) fail the
 * call at once with its words.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store/store_impl.h"
#include "store/store_net.h"

#define RD_LINE_MAX 65536u /* status, error and length lines */
#define RD_BULK_MAX ((size_t)TUTTI_STORE_MAX_VALUE + 65536u)
#define RD_ARRAY_MAX 100000u
#define RD_DEPTH_MAX 3
/* One whole reply, nested arrays included: at most this many array elements and bytes on
 * the wire (the biggest value and then some), so that a server cannot make the client
 * build a tree of nested arrays without end (each element of a few bytes on the wire is
 * a much bigger rd_reply_t here). */
#define RD_REPLY_ELEMS_MAX RD_ARRAY_MAX
#define RD_REPLY_BYTES_MAX (RD_BULK_MAX + (4u << 20))
#define RD_POLL_FIRST_NS 1000000ull
#define RD_POLL_MAX_NS 20000000ull
#define RD_LAST_POLL_NS 50000000ull
#define RD_SCAN_COUNT "1000"
#define RD_POOL_BUF_MAX (1u << 20) /* a pooled connection keeps at most this buffer */

typedef struct rd_conn {
    int fd;
    pid_t pid;
    char *buf; /* bytes received and not yet parsed: buf[pos..len) */
    size_t len, pos, cap;
    uint64_t rx; /* bytes received in all */
    struct rd_conn *next;
} rd_conn_t;

typedef struct rd_store {
    char *host;
    int port;
    int db;
    char *user;     /* NULL: AUTH with the password alone */
    char *password; /* NULL: no AUTH */
    char addr[300]; /* host:port for messages */
    pthread_mutex_t lock;
    rd_conn_t *idle;
    tt_net_dialer_t dialer; /* the host and its addresses */
} rd_store_t;

typedef struct rd_reply {
    char type; /* '+' status, '-' error, ':' integer, '$' bulk, '*' array */
    int nil;   /* $-1 or *-1 */
    int64_t i;
    char *s; /* '+', '-', '$': the bytes, NUL after them */
    size_t len;
    size_t n; /* '*': elements */
    struct rd_reply *el;
} rd_reply_t;

/* A request's outcome apart from a reply: the connection is gone (-errno) or the server
 * sent what RESP does not allow. */
enum { RD_EPROTO = -100000 };

static rd_store_t *rs_of(tutti_store_t *s)
{
    return s->impl;
}

static void rd_reply_free(rd_reply_t *r)
{
    if (!r)
        return;
    for (size_t k = 0; k < r->n; k++)
        rd_reply_free(&r->el[k]);
    free(r->el);
    free(r->s);
    r->el = NULL;
    r->s = NULL;
    r->n = 0;
}

/* ---- connections ---- */

static void rd_conn_drop(rd_conn_t *c)
{
    if (!c)
        return;
    close(c->fd);
    free(c->buf);
    free(c);
}

/* More bytes into c->buf: 0, -errno, -ETIMEDOUT, or -EPIPE when the server closed. */
static int rd_fill(rd_conn_t *c, uint64_t deadline)
{
    if (c->pos > 0 && c->pos == c->len)
        c->pos = c->len = 0;
    if (c->cap - c->len < 4096) {
        if (c->pos > 0) {
            memmove(c->buf, c->buf + c->pos, c->len - c->pos);
            c->len -= c->pos;
            c->pos = 0;
        }
        if (c->cap - c->len < 4096) {
            size_t cap = c->cap ? c->cap * 2 : 16384;
            char *b = realloc(c->buf, cap);
            if (!b)
                return -ENOMEM;
            c->buf = b;
            c->cap = cap;
        }
    }
    for (;;) {
        ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (r > 0) {
            c->len += (size_t)r;
            c->rx += (uint64_t)r;
            return 0;
        }
        if (r == 0)
            return -EPIPE;
        int e = tt_net_io_retry(c->fd, POLLIN, deadline);
        if (e < 0)
            return e;
    }
}

/* The next line (without its CRLF) at c->buf + *start, *n bytes; consumed. */
static int rd_line(rd_conn_t *c, uint64_t deadline, size_t *start, size_t *n, char *why,
                   size_t whylen)
{
    size_t scanned = c->pos;
    for (;;) {
        for (size_t k = scanned; k + 1 < c->len; k++) {
            if (c->buf[k] == '\r' && c->buf[k + 1] == '\n') {
                *start = c->pos;
                *n = k - c->pos;
                c->pos = k + 2;
                return 0;
            }
        }
        if (c->len - c->pos > RD_LINE_MAX) {
            snprintf(why, whylen, "a reply line longer than %u bytes", RD_LINE_MAX);
            return RD_EPROTO;
        }
        scanned = c->len > c->pos ? c->len - 1 : c->pos;
        size_t off = scanned - c->pos;
        int e = rd_fill(c, deadline);
        if (e < 0)
            return e;
        scanned = c->pos + off; /* rd_fill may have moved the bytes */
    }
}

/* "-12" or "34" as a whole line: 0, or -1. */
static int rd_parse_int(const char *p, size_t n, int64_t *v)
{
    char tmp[32];
    if (n == 0 || n >= sizeof(tmp))
        return -1;
    memcpy(tmp, p, n);
    tmp[n] = '\0';
    char *end;
    errno = 0;
    long long x = strtoll(tmp, &end, 10);
    if (errno || *end || !(isdigit((unsigned char)tmp[0]) || tmp[0] == '-'))
        return -1;
    *v = x;
    return 0;
}

/* What is left to one reply of RD_REPLY_ELEMS_MAX and RD_REPLY_BYTES_MAX. */
typedef struct rd_budget {
    size_t elems, bytes;
} rd_budget_t;

static int rd_over_budget(char *why, size_t whylen)
{
    snprintf(why, whylen, "a reply of more than %u array elements or %zu bytes in all",
             RD_REPLY_ELEMS_MAX, (size_t)RD_REPLY_BYTES_MAX);
    return RD_EPROTO;
}

/* One reply, nested arrays included, within what is left of b; expect (depth 0 only, 0:
 * any) the type the command answers with, so that an array where none is due is refused
 * before anything is built for it: 0, -errno, or RD_EPROTO with why. */
static int rd_read_reply(rd_conn_t *c, uint64_t deadline, rd_reply_t *r, int depth, char expect,
                         rd_budget_t *b, char *why, size_t whylen)
{
    size_t start, n;
    memset(r, 0, sizeof(*r));
    int e = rd_line(c, deadline, &start, &n, why, whylen);
    if (e < 0)
        return e;
    if (n + 2 > b->bytes)
        return rd_over_budget(why, whylen);
    b->bytes -= n + 2;
    const char *p = c->buf + start;
    if (n == 0) {
        snprintf(why, whylen, "an empty line where a reply should start");
        return RD_EPROTO;
    }
    r->type = p[0];
    switch (p[0]) {
    case '+':
    case '-':
        r->s = malloc(n);
        if (!r->s)
            return -ENOMEM;
        memcpy(r->s, p + 1, n - 1);
        r->s[n - 1] = '\0';
        r->len = n - 1;
        return 0;
    case ':':
        if (rd_parse_int(p + 1, n - 1, &r->i) < 0) {
            snprintf(why, whylen, "an integer reply that is not a number");
            return RD_EPROTO;
        }
        return 0;
    case '$': {
        int64_t len;
        if (rd_parse_int(p + 1, n - 1, &len) < 0 || len < -1 ||
            (len >= 0 && (uint64_t)len > RD_BULK_MAX)) {
            snprintf(why, whylen, "a bulk reply with a bad length ('%.*s')", (int)TT_MIN(n, 24u),
                     p);
            return RD_EPROTO;
        }
        if (len == -1) {
            r->nil = 1;
            return 0;
        }
        if ((uint64_t)len + 2 > b->bytes)
            return rd_over_budget(why, whylen);
        b->bytes -= (size_t)len + 2;
        /* the buffer grows as the bytes arrive, not on the length's word */
        size_t want = (size_t)len + 2;
        while (c->len - c->pos < want) {
            e = rd_fill(c, deadline);
            if (e < 0)
                return e;
        }
        const char *d = c->buf + c->pos;
        if (d[len] != '\r' || d[len + 1] != '\n') {
            snprintf(why, whylen, "a bulk reply not ended by CRLF");
            return RD_EPROTO;
        }
        r->s = malloc((size_t)len + 1);
        if (!r->s)
            return -ENOMEM;
        memcpy(r->s, d, (size_t)len);
        r->s[len] = '\0';
        r->len = (size_t)len;
        c->pos += want;
        return 0;
    }
    case '*': {
        int64_t cnt;
        if (rd_parse_int(p + 1, n - 1, &cnt) < 0 || cnt < -1 || cnt > RD_ARRAY_MAX ||
            depth >= RD_DEPTH_MAX) {
            snprintf(why, whylen, "an array reply with a bad length or nesting ('%.*s')",
                     (int)TT_MIN(n, 24u), p);
            return RD_EPROTO;
        }
        if (depth == 0 && expect && expect != '*') {
            snprintf(why, whylen, "an array reply ('%.*s') where one of type '%c' is due",
                     (int)TT_MIN(n, 24u), p, expect);
            return RD_EPROTO;
        }
        if (cnt == -1) {
            r->nil = 1;
            return 0;
        }
        if ((uint64_t)cnt > b->elems)
            return rd_over_budget(why, whylen);
        b->elems -= (size_t)cnt;
        if (cnt == 0)
            return 0;
        r->el = calloc((size_t)cnt, sizeof(*r->el));
        if (!r->el)
            return -ENOMEM;
        for (int64_t k = 0; k < cnt; k++) {
            r->n = (size_t)k + 1;
            e = rd_read_reply(c, deadline, &r->el[k], depth + 1, 0, b, why, whylen);
            if (e < 0)
                return e;
        }
        return 0;
    }
    default:
        snprintf(why, whylen, "byte 0x%02x where a reply should start: not a Redis server?",
                 (unsigned char)p[0]);
        return RD_EPROTO;
    }
}

/* One whole reply, with a budget of its own. */
static int rd_read_reply_top(rd_conn_t *c, uint64_t deadline, rd_reply_t *r, char expect, char *why,
                             size_t whylen)
{
    rd_budget_t b = { RD_REPLY_ELEMS_MAX, RD_REPLY_BYTES_MAX };
    return rd_read_reply(c, deadline, r, 0, expect, &b, why, whylen);
}

/* A command as RESP into one buffer: *argc then each argument as a bulk string. */
static char *rd_format(int argc, const char *const *argv, const size_t *argl, size_t *len_p)
{
    size_t total = 24;
    for (int k = 0; k < argc; k++)
        total += argl[k] + 24;
    char *b = malloc(total);
    if (!b)
        return NULL;
    size_t o = (size_t)snprintf(b, total, "*%d\r\n", argc);
    for (int k = 0; k < argc; k++) {
        o += (size_t)snprintf(b + o, total - o, "$%zu\r\n", argl[k]);
        memcpy(b + o, argv[k], argl[k]);
        o += argl[k];
        b[o++] = '\r';
        b[o++] = '\n';
    }
    *len_p = o;
    return b;
}

/* Send one command and read its reply on c. */
static int rd_exchange(rd_conn_t *c, int argc, const char *const *argv, const size_t *argl,
                       char expect, uint64_t deadline, rd_reply_t *r, size_t *got_p, char *why,
                       size_t whylen)
{
    size_t len;
    char *cmd = rd_format(argc, argv, argl, &len);
    if (!cmd)
        return -ENOMEM;
    struct iovec iov = { cmd, len };
    int e = tt_net_send_iov(c->fd, &iov, 1, deadline);
    if (!strcmp(argv[0], "AUTH"))
        explicit_bzero(cmd, len); /* it held the password */
    free(cmd);
    if (e < 0)
        return e;
    uint64_t before = c->rx;
    e = rd_read_reply_top(c, deadline, r, expect, why, whylen);
    *got_p = (size_t)(c->rx - before);
    if (e < 0)
        rd_reply_free(r);
    return e;
}

static const char *rd_lost_str(int e)
{
    return e == -EPIPE ? "closed by the server" : strerror(-e);
}

/* A Redis error reply as a tutti status. */
static int rd_error_status(const char *msg)
{
    if (!strncmp(msg, "NOAUTH", 6) || !strncmp(msg, "WRONGPASS", 9) ||
        !strncmp(msg, "ERR AUTH", 8) || !strncmp(msg, "ERR invalid password", 20) ||
        !strncmp(msg, "NOPERM", 6))
        return TUTTI_ERR_AUTH;
    if (!strncmp(msg, "ERR value is not an integer", 27) || !strncmp(msg, "ERR increment", 13))
        return TUTTI_ERR_INVALID_ARG;
    if (!strncmp(msg, "ERR DB index", 12) || !strncmp(msg, "DENIED", 6))
        return TUTTI_ERR_CONFIG;
    return TUTTI_ERR_STORE;
}

/* Redis answers these before doing anything, and a later try may be served: the command
 * (or the connection's handshake) may go again. Anything else is the server's final word
 * (protected mode's DENIED, an unknown or renamed command, a refused password...). */
static int rd_error_transient(const char *msg)
{
    return !strncmp(msg, "LOADING", 7) || !strncmp(msg, "BUSY ", 5) ||
           !strncmp(msg, "TRYAGAIN", 8) || !strncmp(msg, "MASTERDOWN", 10) ||
           !strncmp(msg, "ERR max number of clients reached", 33);
}

/* AUTH and SELECT on a new connection, or PING when neither is needed, so that every
 * connection starts with the server shown to be a Redis that serves us: TUTTI_OK, or a
 * status with cause; *transient_p 1 when another connection may fare better (this one
 * was lost or timed out, or the server said to come back later). */
static int rd_handshake(rd_store_t *rs, rd_conn_t *c, uint64_t deadline, int *transient_p,
                        char *cause, size_t causelen)
{
    *transient_p = 0;
    for (int step = 0; step < 3; step++) {
        const char *argv[3];
        size_t argl[3];
        int argc = 0;
        char dbs[16];
        if (step == 0) {
            if (!rs->password)
                continue;
            argv[argc++] = "AUTH";
            if (rs->user)
                argv[argc++] = rs->user;
            argv[argc++] = rs->password;
        } else if (step == 1) {
            if (rs->db == 0)
                continue;
            snprintf(dbs, sizeof(dbs), "%d", rs->db);
            argv[argc++] = "SELECT";
            argv[argc++] = dbs;
        } else {
            if (rs->password || rs->db)
                continue;
            argv[argc++] = "PING";
        }
        for (int k = 0; k < argc; k++)
            argl[k] = strlen(argv[k]);
        rd_reply_t r;
        size_t got;
        char why[160] = "";
        int e = rd_exchange(c, argc, argv, argl, '+', deadline, &r, &got, why, sizeof(why));
        if (e == RD_EPROTO) {
            snprintf(cause, causelen, "%s: bad reply to %s: %s", rs->addr, argv[0], why);
            return TUTTI_ERR_PROTOCOL;
        }
        if (e < 0) {
            snprintf(cause, causelen, "%s: %s: %s", rs->addr, argv[0],
                     e == -ETIMEDOUT ? "no reply before the deadline" : rd_lost_str(e));
            *transient_p = e != -ENOMEM;
            return e == -ETIMEDOUT ? TUTTI_ERR_TIMEOUT
                   : e == -ENOMEM  ? TUTTI_ERR_NOMEM
                                   : TUTTI_ERR_STORE;
        }
        int st = TUTTI_OK;
        if (r.type == '-' && rd_error_transient(r.s)) {
            snprintf(cause, causelen, "%s: %s refused for now: %.*s", rs->addr, argv[0],
                     (int)TT_MIN(r.len, 200u), r.s);
            *transient_p = 1;
            st = TUTTI_ERR_STORE;
        } else if (r.type == '-') {
            st = rd_error_status(r.s);
            if (step == 0 && st == TUTTI_ERR_STORE)
                st = TUTTI_ERR_AUTH;
            /* A server may quote AUTH's arguments back ("unknown command 'AUTH', with args
             * beginning with: '<password>'"): of such a reply only its first word shows. */
            int quoted = step == 0 && (strchr(r.s, '\'') || strchr(r.s, '"') ||
                                       (rs->password && strstr(r.s, rs->password)));
            snprintf(cause, causelen, "%s: %s refused: %.*s%s%s", rs->addr, argv[0],
                     quoted ? (int)strcspn(r.s, " ") : (int)r.len, r.s,
                     quoted ? " (the rest of the server's reply withheld: it quotes the "
                              "arguments)"
                            : "",
                     step == 0 ? " (the password comes from the URL or TUTTI_STORE_PASSWORD)" : "");
        } else if (r.type != '+' || (step == 2 && strcmp(r.s, "PONG"))) {
            snprintf(cause, causelen, "%s: unexpected reply to %s", rs->addr, argv[0]);
            st = TUTTI_ERR_PROTOCOL;
        }
        rd_reply_free(&r);
        if (st < 0)
            return st;
    }
    return TUTTI_OK;
}

/* Connect (and AUTH, SELECT), retrying with backoff until the deadline: a Redis server
 * started after the ranks is waited for, as the tcp store's is, and so is one that
 * refused for a while (loading its data, busy, at its client limit) or closed the
 * connection; a refusal that another try would meet again (protected mode, a command
 * unknown to the server, a password refused) fails at once with the server's words. */
typedef struct rd_dial {
    rd_store_t *rs;
    rd_conn_t *conn; /* the connection made */
} rd_dial_t;

static int rd_hello(void *ctx, int fd, uint64_t deadline, char *cause, size_t causelen,
                    tt_store_err_t *err)
{
    rd_dial_t *dl = ctx;
    rd_conn_t *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        tt_store_err_set(err, "out of memory");
        return TUTTI_ERR_NOMEM;
    }
    c->fd = fd;
    c->pid = getpid();
    int transient = 0;
    int st = rd_handshake(dl->rs, c, deadline, &transient, cause, causelen);
    if (st == TUTTI_OK) {
        dl->conn = c;
        return TT_NET_HELLO_OK;
    }
    rd_conn_drop(c);
    if (transient)
        return TT_NET_HELLO_RETRY;
    tt_store_err_set(err, "%s", cause); /* it answered: the address is right */
    return st;
}

static int rd_connect(rd_store_t *rs, uint64_t deadline, rd_conn_t **conn_p, tt_store_err_t *err)
{
    rd_dial_t dl = { .rs = rs };
    tt_net_hello_t h = { .hello = rd_hello, .ctx = &dl };
    int st = tt_net_dial(&rs->dialer, deadline, &h, err);
    *conn_p = dl.conn; /* NULL unless st is TUTTI_OK */
    return st;
}

/* A pooled connection of this process that the server has not closed (it would read as
 * ready), or a new one. */
static int rd_conn_take(rd_store_t *rs, uint64_t deadline, rd_conn_t **conn_p, tt_store_err_t *err)
{
    for (;;) {
        pthread_mutex_lock(&rs->lock);
        rd_conn_t *c = rs->idle;
        if (c)
            rs->idle = c->next;
        pthread_mutex_unlock(&rs->lock);
        if (!c)
            break;
        struct pollfd p = { .fd = c->fd, .events = POLLIN };
        if (c->pid == getpid() && poll(&p, 1, 0) == 0 && c->pos == c->len) {
            *conn_p = c;
            return TUTTI_OK;
        }
        /* a connection of the parent (after fork) is closed here too, its copy of the
         * socket: the parent's stays open, and the child never speaks on it */
        rd_conn_drop(c);
    }
    return rd_connect(rs, deadline, conn_p, err);
}

static void rd_conn_give(rd_store_t *rs, rd_conn_t *c)
{
    if (c->cap > RD_POOL_BUF_MAX && c->pos == c->len) { /* a big reply's buffer goes */
        free(c->buf);
        c->buf = NULL;
        c->cap = c->len = c->pos = 0;
    }
    pthread_mutex_lock(&rs->lock);
    c->next = rs->idle;
    rs->idle = c;
    pthread_mutex_unlock(&rs->lock);
}

static void rd_pool_flush(rd_store_t *rs)
{
    pthread_mutex_lock(&rs->lock);
    rd_conn_t *c = rs->idle;
    rs->idle = NULL;
    pthread_mutex_unlock(&rs->lock);
    while (c) {
        rd_conn_t *next = c->next;
        rd_conn_drop(c);
        c = next;
    }
}

/* One command and its reply (an error reply is a status with the server's text in err).
 * retry_safe: the command may go again when the connection closed before any reply. */
static int rd_cmd(tutti_store_t *s, int argc, const char *const *argv, const size_t *argl,
                  int retry_safe, char expect, uint64_t deadline, rd_reply_t *r,
                  tt_store_err_t *err)
{
    rd_store_t *rs = rs_of(s);
    uint64_t start = tt_now_ns(), backoff = RD_POLL_FIRST_NS;
    for (int attempt = 0;; attempt++) {
        rd_conn_t *c;
        TT_CHECK(rd_conn_take(rs, deadline, &c, err));
        size_t got = 0;
        char why[200] = "";
        int e = rd_exchange(c, argc, argv, argl, expect, deadline, r, &got, why, sizeof(why));
        if (e == 0) {
            rd_conn_give(rs, c);
            if (r->type != '-')
                return TUTTI_OK;
            if (rd_error_transient(r->s) && tt_now_ns() < deadline) {
                rd_reply_free(r);
                tt_net_sleep_until(backoff, deadline);
                backoff = TT_MIN(backoff * 2, RD_POLL_MAX_NS * 5);
                continue;
            }
            int st = rd_error_status(r->s);
            tt_store_err_set(err, "redis %s: %s %s", rs->addr, argv[0], r->s);
            rd_reply_free(r);
            return st;
        }
        rd_conn_drop(c);
        if (e == RD_EPROTO) {
            tt_store_err_set(err, "bad reply from %s to %s: %s", rs->addr, argv[0], why);
            return TUTTI_ERR_PROTOCOL;
        }
        if (e == -ENOMEM) {
            tt_store_err_set(err, "out of memory for a reply from %s", rs->addr);
            return TUTTI_ERR_NOMEM;
        }
        if (attempt == 0 && got == 0 && (e == -EPIPE || e == -ECONNRESET) && retry_safe) {
            rd_pool_flush(rs);
            continue;
        }
        if (e == -ETIMEDOUT) {
            tt_store_err_set(err, "%s: no reply from %s after %" PRIu64 " ms", argv[0], rs->addr,
                             (tt_now_ns() - start) / 1000000u);
            return TUTTI_ERR_TIMEOUT;
        }
        tt_store_err_set(err, "connection to %s lost in %s: %s%s", rs->addr, argv[0],
                         rd_lost_str(e),
                         retry_safe ? "" : " (it may or may not have been carried out)");
        return TUTTI_ERR_STORE;
    }
}

/* The reply was not of the type the command gives. */
static int rd_unexpected(tutti_store_t *s, const char *what, rd_reply_t *r, tt_store_err_t *err)
{
    tt_store_err_set(err, "bad reply from %s to %s: type '%c'", rs_of(s)->addr, what,
                     isprint((unsigned char)r->type) ? r->type : '?');
    rd_reply_free(r);
    return TUTTI_ERR_PROTOCOL;
}

/* ---- the operations ---- */

static int rd_set(tutti_store_t *s, const char *key, const void *value, size_t len,
                  uint64_t deadline, tt_store_err_t *err)
{
    const char *argv[] = { "SET", key, value };
    size_t argl[] = { 3, strlen(key), len };
    rd_reply_t r;
    TT_CHECK(rd_cmd(s, 3, argv, argl, 1, '+', deadline, &r, err));
    if (r.type != '+')
        return rd_unexpected(s, "SET", &r, err);
    rd_reply_free(&r);
    return TUTTI_OK;
}

/* Sleep before the next poll of a wait: 1 ms, doubling to 20 ms. */
static void rd_poll_sleep(uint64_t *backoff, uint64_t deadline)
{
    tt_net_sleep_until(*backoff, deadline);
    *backoff = TT_MIN(*backoff * 2, RD_POLL_MAX_NS);
}

/* The deadline of one poll of a wait: the wait's, but the last poll, made when the wait's
 * deadline has just passed, still gets RD_LAST_POLL_NS for its answer. */
static uint64_t rd_poll_deadline(uint64_t deadline)
{
    uint64_t now = tt_now_ns();
    return deadline != UINT64_MAX && deadline < now + RD_LAST_POLL_NS ? now + RD_LAST_POLL_NS
                                                                      : deadline;
}

static int rd_get(tutti_store_t *s, const char *key, void **value_p, size_t *len_p,
                  uint64_t deadline, tt_store_err_t *err)
{
    const char *argv[] = { "GET", key };
    size_t argl[] = { 3, strlen(key) };
    uint64_t start = tt_now_ns(), backoff = RD_POLL_FIRST_NS;
    for (;;) {
        rd_reply_t r;
        TT_CHECK(rd_cmd(s, 2, argv, argl, 1, '$', rd_poll_deadline(deadline), &r, err));
        if (r.type != '$')
            return rd_unexpected(s, "GET", &r, err);
        if (!r.nil) {
            *value_p = r.s;
            *len_p = r.len;
            return TUTTI_OK;
        }
        if (tt_now_ns() >= deadline) {
            char kd[160];
            tt_store_err_set(err, "'%s' not set within %" PRIu64 " ms (server %s)",
                             tt_store_key_display(key, kd, sizeof(kd)),
                             (tt_now_ns() - start) / 1000000u, rs_of(s)->addr);
            return TUTTI_ERR_TIMEOUT;
        }
        rd_poll_sleep(&backoff, deadline);
    }
}

static int rd_add(tutti_store_t *s, const char *key, int64_t delta, int64_t *result_p,
                  uint64_t deadline, tt_store_err_t *err)
{
    char d[32];
    snprintf(d, sizeof(d), "%" PRId64, delta);
    const char *argv[] = { "INCRBY", key, d };
    size_t argl[] = { 6, strlen(key), strlen(d) };
    rd_reply_t r;
    TT_CHECK(rd_cmd(s, 3, argv, argl, 0, ':', deadline, &r, err));
    if (r.type != ':')
        return rd_unexpected(s, "INCRBY", &r, err);
    if (result_p)
        *result_p = r.i;
    return TUTTI_OK;
}

/* A missing key equals an empty expected; the value after comes back ("" when missing). */
static const char rd_cas_script[] = "local v = redis.call('GET', KEYS[1]) "
                                    "if v == ARGV[1] or (v == false and ARGV[1] == '') then "
                                    "redis.call('SET', KEYS[1], ARGV[2]) return ARGV[2] end "
                                    "if v == false then return '' end return v";

static int rd_compare_set(tutti_store_t *s, const char *key, const void *expected, size_t elen,
                          const void *desired, size_t dlen, void **current_p, size_t *curlen_p,
                          uint64_t deadline, tt_store_err_t *err)
{
    const char *argv[] = {
        "EVAL", rd_cas_script, "1", key, expected ? expected : "", desired ? desired : ""
    };
    size_t argl[] = { 4, sizeof(rd_cas_script) - 1, 1, strlen(key), elen, dlen };
    rd_reply_t r;
    TT_CHECK(rd_cmd(s, 6, argv, argl, 0, '$', deadline, &r, err));
    if (r.type != '$' || r.nil)
        return rd_unexpected(s, "EVAL (compare and set)", &r, err);
    if (current_p) {
        *current_p = r.s;
        *curlen_p = r.len;
    } else {
        free(r.s);
    }
    return TUTTI_OK;
}

/* EXISTS of n keys: *count_p of them exist (a key named twice counts twice). */
static int rd_exists(tutti_store_t *s, const char *const *keys, size_t n, int64_t *count_p,
                     uint64_t deadline, tt_store_err_t *err)
{
    if (n + 1 > INT32_MAX) {
        tt_store_err_set(err, "%zu keys in one call", n);
        return TUTTI_ERR_INVALID_ARG;
    }
    const char **argv = malloc((n + 1) * sizeof(*argv));
    size_t *argl = malloc((n + 1) * sizeof(*argl));
    int st = TUTTI_ERR_NOMEM;
    if (!argv || !argl) {
        tt_store_err_set(err, "out of memory for %zu keys", n);
        goto out;
    }
    argv[0] = "EXISTS";
    argl[0] = 6;
    for (size_t k = 0; k < n; k++) {
        argv[k + 1] = keys[k];
        argl[k + 1] = strlen(keys[k]);
    }
    rd_reply_t r;
    st = rd_cmd(s, (int)n + 1, argv, argl, 1, ':', deadline, &r, err);
    if (st == TUTTI_OK) {
        if (r.type != ':') {
            st = rd_unexpected(s, "EXISTS", &r, err);
            goto out;
        }
        *count_p = r.i;
    }
out:
    free(argv);
    free(argl);
    return st;
}

static int rd_check(tutti_store_t *s, const char *const *keys, size_t n, int *exists_p,
                    uint64_t deadline, tt_store_err_t *err)
{
    int64_t count = 0;
    if (n == 0) {
        *exists_p = 1;
        return TUTTI_OK;
    }
    TT_CHECK(rd_exists(s, keys, n, &count, deadline, err));
    *exists_p = count == (int64_t)n;
    return TUTTI_OK;
}

static int rd_wait(tutti_store_t *s, const char *const *keys, size_t n, uint64_t deadline,
                   tt_store_err_t *err)
{
    uint64_t start = tt_now_ns(), backoff = RD_POLL_FIRST_NS;
    for (;;) {
        int all;
        TT_CHECK(rd_check(s, keys, n, &all, rd_poll_deadline(deadline), err));
        if (all)
            return TUTTI_OK;
        if (tt_now_ns() >= deadline) {
            /* (with several keys, store.c then names the first one missing) */
            uint64_t ms = (tt_now_ns() - start) / 1000000u;
            char kd[160];
            if (n == 1)
                tt_store_err_set(err, "'%s' not set within %" PRIu64 " ms (server %s)",
                                 tt_store_key_display(keys[0], kd, sizeof(kd)), ms, rs_of(s)->addr);
            else
                tt_store_err_set(err, "not all of %zu keys set within %" PRIu64 " ms (server %s)",
                                 n, ms, rs_of(s)->addr);
            return TUTTI_ERR_TIMEOUT;
        }
        rd_poll_sleep(&backoff, deadline);
    }
}

static int rd_del(tutti_store_t *s, const char *key, int *deleted_p, uint64_t deadline,
                  tt_store_err_t *err)
{
    const char *argv[] = { "DEL", key };
    size_t argl[] = { 3, strlen(key) };
    rd_reply_t r;
    TT_CHECK(rd_cmd(s, 2, argv, argl, 0, ':', deadline, &r, err));
    if (r.type != ':')
        return rd_unexpected(s, "DEL", &r, err);
    if (deleted_p)
        *deleted_p = r.i > 0;
    return TUTTI_OK;
}

/* prefix as a SCAN MATCH pattern: glob characters escaped, '*' after. */
static char *rd_glob(const char *prefix, size_t *len_p)
{
    size_t n = strlen(prefix);
    char *g = malloc(2 * n + 2);
    if (!g)
        return NULL;
    size_t o = 0;
    for (size_t k = 0; k < n; k++) {
        if (strchr("*?[]\\^-", prefix[k]))
            g[o++] = '\\';
        g[o++] = prefix[k];
    }
    g[o++] = '*';
    g[o] = '\0';
    *len_p = o;
    return g;
}

static int rd_strcmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Keys SCAN returned, to count each once (SCAN may return a key twice). */
typedef struct {
    char **k;
    size_t n, cap;
} rd_seen_t;

static int rd_seen_add(rd_seen_t *seen, const rd_reply_t *keys)
{
    for (size_t i = 0; i < keys->n; i++) {
        if (seen->n == seen->cap) {
            size_t cap = seen->cap ? 2 * seen->cap : 64;
            char **k = realloc(seen->k, cap * sizeof(*k));
            if (!k)
                return -1;
            seen->k = k;
            seen->cap = cap;
        }
        if (!(seen->k[seen->n] = strndup(keys->el[i].s, keys->el[i].len)))
            return -1;
        seen->n++;
    }
    return 0;
}

static size_t rd_seen_count(rd_seen_t *seen)
{
    size_t u = 0;
    if (seen->n)
        qsort(seen->k, seen->n, sizeof(*seen->k), rd_strcmp);
    for (size_t i = 0; i < seen->n; i++)
        u += i == 0 || strcmp(seen->k[i], seen->k[i - 1]) != 0;
    for (size_t i = 0; i < seen->n; i++)
        free(seen->k[i]);
    free(seen->k);
    return u;
}

/* SCAN the keys under prefix and DEL each batch (del), or count them: keys set meanwhile
 * may stay, or be left out of the count, as they may on the other stores. */
static int rd_prefix(tutti_store_t *s, const char *prefix, size_t *count_p, int del,
                     uint64_t deadline, tt_store_err_t *err)
{
    size_t glen, total = 0;
    char *glob = rd_glob(prefix, &glen);
    char cursor[32] = "0";
    int st = TUTTI_OK;
    rd_seen_t seen = { NULL, 0, 0 };
    if (!glob) {
        tt_store_err_set(err, "out of memory");
        return TUTTI_ERR_NOMEM;
    }
    do {
        const char *argv[] = { "SCAN", cursor, "MATCH", glob, "COUNT", RD_SCAN_COUNT };
        size_t argl[] = { 4, strlen(cursor), 5, glen, 5, sizeof(RD_SCAN_COUNT) - 1 };
        rd_reply_t r;
        st = rd_cmd(s, 6, argv, argl, 1, '*', deadline, &r, err);
        if (st < 0)
            break;
        if (r.type != '*' || r.n != 2 || r.el[0].type != '$' || r.el[0].nil ||
            r.el[0].len >= sizeof(cursor) || r.el[1].type != '*') {
            st = rd_unexpected(s, "SCAN", &r, err);
            break;
        }
        memcpy(cursor, r.el[0].s, r.el[0].len + 1);
        rd_reply_t *keys = &r.el[1];
        int bad = 0;
        for (size_t k = 0; k < keys->n; k++)
            bad |= keys->el[k].type != '$' || keys->el[k].nil;
        if (bad) {
            st = rd_unexpected(s, "SCAN", &r, err);
        } else if (!del && rd_seen_add(&seen, keys) < 0) {
            tt_store_err_set(err, "out of memory");
            st = TUTTI_ERR_NOMEM;
        } else if (del && keys->n > 0) {
            const char **dv = malloc((keys->n + 1) * sizeof(*dv));
            size_t *dl = malloc((keys->n + 1) * sizeof(*dl));
            if (!dv || !dl) {
                free(dv);
                free(dl);
                rd_reply_free(&r);
                tt_store_err_set(err, "out of memory");
                st = TUTTI_ERR_NOMEM;
                break;
            }
            dv[0] = "DEL";
            dl[0] = 3;
            for (size_t k = 0; k < keys->n; k++) {
                dv[k + 1] = keys->el[k].s;
                dl[k + 1] = keys->el[k].len;
            }
            rd_reply_t d;
            st = rd_cmd(s, (int)keys->n + 1, dv, dl, 0, ':', deadline, &d, err);
            if (st == TUTTI_OK && d.type != ':')
                st = rd_unexpected(s, "DEL", &d, err);
            else if (st == TUTTI_OK)
                total += (size_t)d.i;
            free(dv);
            free(dl);
        }
        rd_reply_free(&r);
    } while (st == TUTTI_OK && strcmp(cursor, "0"));
    free(glob);
    size_t counted = rd_seen_count(&seen);
    if (count_p)
        *count_p = del ? total : counted;
    return st;
}

static int rd_del_prefix(tutti_store_t *s, const char *prefix, size_t *count_p, uint64_t deadline,
                         tt_store_err_t *err)
{
    return rd_prefix(s, prefix, count_p, 1, deadline, err);
}

static int rd_count_prefix(tutti_store_t *s, const char *prefix, size_t *count_p, uint64_t deadline,
                           tt_store_err_t *err)
{
    return rd_prefix(s, prefix, count_p, 0, deadline, err);
}

static const char rd_cad_script[] = "if redis.call('GET', KEYS[1]) == ARGV[1] then "
                                    "return redis.call('DEL', KEYS[1]) end return 0";

static int rd_compare_del(tutti_store_t *s, const char *key, const void *expected, size_t elen,
                          int *deleted_p, uint64_t deadline, tt_store_err_t *err)
{
    const char *argv[] = { "EVAL", rd_cad_script, "1", key, expected ? expected : "" };
    size_t argl[] = { 4, sizeof(rd_cad_script) - 1, 1, strlen(key), elen };
    rd_reply_t r;
    TT_CHECK(rd_cmd(s, 5, argv, argl, 0, ':', deadline, &r, err));
    if (r.type != ':')
        return rd_unexpected(s, "EVAL (compare and delete)", &r, err);
    if (deleted_p)
        *deleted_p = r.i > 0;
    return TUTTI_OK;
}

int tt_store_redis_fuzz_input(const uint8_t *data, size_t len, size_t split)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return -1;
    rd_conn_t c = { .fd = sv[0], .pid = getpid() };
    split = TT_MIN(split, len);
    /* the bytes before split are in the buffer already, the rest arrive by recv */
    c.buf = malloc(split + 1);
    c.cap = split + 1;
    if (!c.buf ||
        (len > split && write(sv[1], data + split, len - split) != (ssize_t)(len - split))) {
        free(c.buf);
        close(sv[0]);
        close(sv[1]);
        return -1;
    }
    close(sv[1]);
    memcpy(c.buf, data, split);
    c.len = split;
    for (;;) {
        rd_reply_t r;
        char why[200];
        if (rd_read_reply_top(&c, tt_deadline_ns(1000), &r, 0, why, sizeof(why)) < 0) {
            rd_reply_free(&r);
            break;
        }
        rd_reply_free(&r);
    }
    free(c.buf);
    close(sv[0]);
    return 0;
}

static void rd_free(rd_store_t *rs)
{
    rd_pool_flush(rs);
    tt_net_dialer_fini(&rs->dialer);
    pthread_mutex_destroy(&rs->lock);
    free(rs->host);
    free(rs->user);
    if (rs->password) {
        memset(rs->password, 0, strlen(rs->password));
        free(rs->password);
    }
    free(rs);
}

static void rd_close(tutti_store_t *s)
{
    rd_free(rs_of(s));
}

static const tt_store_ops_t rd_ops = {
    .name = "redis",
    TT_STORE_OPS_FNS(rd),
    .wait = rd_wait,
};

int tt_store_redis_open(tutti_store_t **store_p, const tt_store_redis_cfg_t *cfg,
                        tt_store_err_t *err)
{
    rd_store_t *rs = calloc(1, sizeof(*rs));
    if (!rs) {
        tt_store_err_set(err, "out of memory");
        return TUTTI_ERR_NOMEM;
    }
    pthread_mutex_init(&rs->lock, NULL);
    rs->port = cfg->port;
    rs->db = cfg->db;
    rs->host = tt_strdup(cfg->host);
    tt_net_dialer_init(&rs->dialer, rs->host, rs->port);
    rs->user = cfg->user ? tt_strdup(cfg->user) : NULL;
    rs->password = cfg->password ? tt_strdup(cfg->password) : NULL;
    if (!rs->host || (cfg->user && !rs->user) || (cfg->password && !rs->password)) {
        rd_free(rs);
        tt_store_err_set(err, "out of memory");
        return TUTTI_ERR_NOMEM;
    }
    snprintf(rs->addr, sizeof(rs->addr), strchr(rs->host, ':') ? "[%s]:%d" : "%s:%d", rs->host,
             rs->port);
    char url[400];
    snprintf(url, sizeof(url), "redis://%s%s%s/%d", rs->user ? rs->user : "", rs->user ? "@" : "",
             rs->addr, rs->db);
    tutti_store_t *s = tt_store_alloc(&rd_ops, url, -1, cfg->timeout_ms);
    if (!s) {
        rd_free(rs);
        tt_store_err_set(err, "out of memory");
        return TUTTI_ERR_NOMEM;
    }
    s->impl = rs;
    /* Reach the server now, so that a wrong address, password or db shows at open. */
    rd_conn_t *c;
    int st = rd_connect(rs, tt_deadline_ns(cfg->timeout_ms), &c, err);
    if (st < 0) {
        tt_store_free(s);
        rd_free(rs);
        return st;
    }
    rd_conn_give(rs, c);
    *store_p = s;
    return TUTTI_OK;
}
