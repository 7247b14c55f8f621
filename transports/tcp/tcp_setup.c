/* TCP transport: choosing an address, and connecting the full mesh on a libuv loop.
 * Rank r listens, publishes "ip port" under tcp/r, connects to every lower rank and
 * accepts every higher one; each connection starts with a hello naming its rank. */
#include <errno.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp.h"

#define LOGF(lvl, ...) tp->host->log(tp->host->ctx, (lvl), __VA_ARGS__)

typedef struct setup setup_t;

typedef struct conn {
    setup_t *s;
    uv_tcp_t h;
    uv_connect_t creq;
    uv_write_t wreq;
    uv_timer_t retry;
    int peer;           /* -1 until an accepted connection said hello */
    int outgoing;
    int open;           /* h initialised and not closed */
    int retry_open;
    tcp_hello_t hello;  /* outgoing: ours; incoming: theirs */
    size_t hello_got;
    struct sockaddr_storage addr;
    struct conn *next;
} conn_t;

struct setup {
    tcp_tp_t *tp;
    /* A loop of its own, closed before the data path starts: the sockets outlive their
     * set-up handles (dup), and epoll would keep their old registrations while any
     * copy of a socket is open, so they must die with the whole epoll instance. */
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_timer_t deadline;
    int needed, done;
    int status;
    char err[512];
    conn_t *conns;
};

static void fmt_addr(const struct sockaddr *sa, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        uv_ip6_name(a, ip, sizeof(ip));
        port = ntohs(a->sin6_port);
        snprintf(buf, len, "[%s]:%d", ip, port);
    } else {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        uv_ip4_name(a, ip, sizeof(ip));
        port = ntohs(a->sin_port);
        snprintf(buf, len, "%s:%d", ip, port);
    }
}

/* ---- address choice: TUTTI_SOCKET_IFNAME ("eth,ib" prefixes, "^lo" excludes,
 * "=eth0" exact) and TUTTI_SOCKET_FAMILY (4, 6) ---- */

static int name_matches(const char *spec, const char *name)
{
    int exclude = spec[0] == '^';
    const char *p = spec + exclude;
    int exact = p[0] == '=';
    p += exact;
    int hit = 0;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n && (exact ? (strlen(name) == n && !strncmp(name, p, n)) : !strncmp(name, p, n)))
            hit = 1;
        p += n + (e ? 1 : 0);
    }
    return exclude ? !hit : hit;
}

static int is_link_local6(const uv_interface_address_t *a)
{
    const uint8_t *b = a->address.address6.sin6_addr.s6_addr;
    return a->address.address4.sin_family == AF_INET6 && b[0] == 0xfe && (b[1] & 0xc0) == 0x80;
}

static int choose_address(tcp_tp_t *tp, struct sockaddr_storage *out, char *ifname,
                          size_t iflen)
{
    const char *spec = tp->host->config(tp->host->ctx, "SOCKET_IFNAME");
    const char *fams = tp->host->config(tp->host->ctx, "SOCKET_FAMILY");
    int fam = fams ? atoi(fams) : 0;
    uv_interface_address_t *ifs;
    int n;
    int st = uv_interface_addresses(&ifs, &n);
    if (st < 0)
        return tp->host->error(tp->host->ctx, TUTTI_ERR_NO_DEVICE, -1, -st,
                               "tcp: cannot list network interfaces");
    int best = -1, best_score = -1;
    char seen[512] = "";
    for (int i = 0; i < n; i++) {
        const uv_interface_address_t *a = &ifs[i];
        int af = a->address.address4.sin_family;
        if (!strstr(seen, a->name) && strlen(seen) + strlen(a->name) + 3 < sizeof(seen)) {
            strcat(seen, seen[0] ? ", " : "");
            strcat(seen, a->name);
        }
        if ((fam == 4 && af != AF_INET) || (fam == 6 && af != AF_INET6))
            continue;
        if (is_link_local6(a))
            continue; /* would need a scope id per peer */
        if (spec && !name_matches(spec, a->name))
            continue;
        /* Without a spec: prefer a real interface over loopback, IPv4 over IPv6. */
        int score = (a->is_internal ? 0 : 2) + (af == AF_INET ? 1 : 0);
        if (score > best_score) {
            best = i;
            best_score = score;
        }
    }
    if (best < 0) {
        tp->host->error(tp->host->ctx, TUTTI_ERR_NO_DEVICE, -1, 0,
                        "tcp: no interface matches TUTTI_SOCKET_IFNAME=%s%s%s (interfaces: %s)",
                        spec ? spec : "(unset)", fam ? " with TUTTI_SOCKET_FAMILY=" : "",
                        fam ? fams : "", seen);
        uv_free_interface_addresses(ifs, n);
        return TUTTI_ERR_NO_DEVICE;
    }
    memset(out, 0, sizeof(*out));
    if (ifs[best].address.address4.sin_family == AF_INET6)
        memcpy(out, &ifs[best].address.address6, sizeof(struct sockaddr_in6));
    else
        memcpy(out, &ifs[best].address.address4, sizeof(struct sockaddr_in));
    snprintf(ifname, iflen, "%s", ifs[best].name);
    if (!spec && ifs[best].is_internal)
        LOGF(TUTTI_LOG_INFO, "tcp: no interface but loopback; using %s", ifname);
    uv_free_interface_addresses(ifs, n);
    return TUTTI_OK;
}

/* ---- the mesh ---- */

static void on_handle_closed(uv_handle_t *h) { (void)h; }

static void conn_close(conn_t *c)
{
    if (c->open) {
        uv_close((uv_handle_t *)&c->h, on_handle_closed);
        c->open = 0;
    }
    if (c->retry_open) {
        uv_close((uv_handle_t *)&c->retry, on_handle_closed);
        c->retry_open = 0;
    }
}

static void setup_fail(setup_t *s, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void setup_fail(setup_t *s, int status, const char *fmt, ...)
{
    if (s->status < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof(s->err), fmt, ap);
    va_end(ap);
    s->status = status;
    uv_stop(&s->loop);
}

/* A connection said or heard hello: it becomes the link to c->peer. */
static void conn_established(conn_t *c)
{
    setup_t *s = c->s;
    tcp_tp_t *tp = s->tp;
    tcp_link_t *L = &tp->links[c->peer];
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->h, &fd) < 0 || (L->fd = dup(fd)) < 0) {
        setup_fail(s, TUTTI_ERR_IO, "tcp: cannot take over the socket of rank %d: %s", c->peer,
                   strerror(errno));
        return;
    }
    int one = 1;
    setsockopt(L->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (tp->sockbuf > 0) {
        setsockopt(L->fd, SOL_SOCKET, SO_SNDBUF, &tp->sockbuf, sizeof(tp->sockbuf));
        setsockopt(L->fd, SOL_SOCKET, SO_RCVBUF, &tp->sockbuf, sizeof(tp->sockbuf));
    }
    if (c->outgoing) {
        fmt_addr((struct sockaddr *)&c->addr, L->addr, sizeof(L->addr));
    } else {
        struct sockaddr_storage ss;
        int len = sizeof(ss);
        if (uv_tcp_getpeername(&c->h, (struct sockaddr *)&ss, &len) == 0)
            fmt_addr((struct sockaddr *)&ss, L->addr, sizeof(L->addr));
    }
    conn_close(c);
    if (++s->done == s->needed)
        uv_stop(&s->loop);
}

static void on_hello_written(uv_write_t *w, int status)
{
    conn_t *c = w->data;
    if (status < 0) {
        setup_fail(c->s, TUTTI_ERR_PEER, "tcp: sending hello to rank %d failed: %s", c->peer,
                   uv_strerror(status));
        return;
    }
    conn_established(c);
}

static void conn_start(conn_t *c);

static void on_retry(uv_timer_t *t)
{
    conn_t *c = t->data;
    conn_start(c);
}

static void on_connect(uv_connect_t *req, int status)
{
    conn_t *c = req->data;
    if (status < 0) {
        if (status == UV_ECANCELED)
            return;
        /* The peer listens before it publishes its address, so a refusal is transient
         * (a backlog overflow, a restarting host): retry until the deadline. */
        tcp_tp_t *tp = c->s->tp;
        LOGF(TUTTI_LOG_TRACE, "tcp: connect to rank %d failed (%s); retrying", c->peer,
             uv_strerror(status));
        uv_close((uv_handle_t *)&c->h, on_handle_closed);
        c->open = 0;
        uv_update_time(&c->s->loop);
        uv_timer_start(&c->retry, on_retry, 20, 0);
        return;
    }
    uv_buf_t b = uv_buf_init((char *)&c->hello, sizeof(c->hello));
    c->wreq.data = c;
    int st = uv_write(&c->wreq, (uv_stream_t *)&c->h, &b, 1, on_hello_written);
    if (st < 0)
        setup_fail(c->s, TUTTI_ERR_IO, "tcp: cannot send hello to rank %d: %s", c->peer,
                   uv_strerror(st));
}

static void conn_start(conn_t *c)
{
    uv_tcp_init(&c->s->loop, &c->h);
    c->h.data = c;
    c->open = 1;
    c->creq.data = c;
    int st = uv_tcp_connect(&c->creq, &c->h, (struct sockaddr *)&c->addr, on_connect);
    if (st < 0)
        on_connect(&c->creq, st);
}

static void on_hello_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    conn_t *c = h->data;
    /* exactly the hello's bytes: data the peer sends after it stays in the socket */
    *buf = uv_buf_init((char *)&c->hello + c->hello_got, sizeof(c->hello) - c->hello_got);
}

static void on_hello_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    conn_t *c = st->data;
    setup_t *s = c->s;
    tcp_tp_t *tp = s->tp;
    if (nread < 0) {
        LOGF(TUTTI_LOG_WARN, "tcp: an incoming connection closed before saying hello (%s)",
             uv_strerror((int)nread));
        conn_close(c);
        return;
    }
    c->hello_got += (size_t)nread;
    if (c->hello_got < sizeof(c->hello))
        return;
    uv_read_stop(st);
    const tcp_hello_t *h = &c->hello;
    if (h->magic != TCP_HELLO_MAGIC || h->version != 1 || h->nranks != tp->nranks ||
        h->rank <= tp->rank || h->rank >= tp->nranks || tp->links[h->rank].fd >= 0 ||
        !tutti_tp_host_serves(tp->host, h->rank)) {
        /* Not one of ours (a stray client, another job, a duplicate): drop it and keep
         * waiting for the real peers. */
        LOGF(TUTTI_LOG_WARN,
             "tcp: rejected an incoming connection: hello magic 0x%08x version %u rank %d of "
             "%d (this is rank %d of %d)",
             h->magic, h->version, h->rank, h->nranks, tp->rank, tp->nranks);
        conn_close(c);
        return;
    }
    c->peer = h->rank;
    conn_established(c);
}

static void on_incoming(uv_stream_t *server, int status)
{
    setup_t *s = server->data;
    tcp_tp_t *tp = s->tp;
    if (status < 0) {
        LOGF(TUTTI_LOG_WARN, "tcp: accept failed: %s", uv_strerror(status));
        return;
    }
    conn_t *c = calloc(1, sizeof(*c));
    if (!c) {
        setup_fail(s, TUTTI_ERR_NOMEM, "tcp: out of memory accepting a connection");
        return;
    }
    c->s = s;
    c->peer = -1;
    c->next = s->conns;
    s->conns = c;
    uv_tcp_init(&s->loop, &c->h);
    c->h.data = c;
    c->open = 1;
    if (uv_accept(server, (uv_stream_t *)&c->h) < 0) {
        conn_close(c);
        return;
    }
    uv_read_start((uv_stream_t *)&c->h, on_hello_alloc, on_hello_read);
}

static void on_deadline(uv_timer_t *t)
{
    setup_t *s = t->data;
    tcp_tp_t *tp = s->tp;
    char missing[256] = "";
    for (int i = 0; i < tp->nranks; i++) {
        if (!tutti_tp_host_serves(tp->host, i) || tp->links[i].fd >= 0)
            continue;
        size_t n = strlen(missing);
        if (n < sizeof(missing) - 16)
            snprintf(missing + n, sizeof(missing) - n, "%s%d", n ? ", " : "", i);
    }
    setup_fail(s, TUTTI_ERR_TIMEOUT,
               "tcp: connected to %d of %d peers within %d ms; still missing rank(s) %s",
               s->done, s->needed, tp->host->timeout_ms, missing);
}

static int peer_addr_from_store(tcp_tp_t *tp, int peer, struct sockaddr_storage *out)
{
    char key[64];
    snprintf(key, sizeof(key), "tcp/%d", peer);
    void *val = NULL;
    size_t len = 0;
    int st = tp->host->store_get(tp->host->ctx, key, &val, &len, tp->host->timeout_ms);
    if (st < 0)
        return tp->host->error(tp->host->ctx, st, peer, 0,
                               "tcp: rank %d never published its address (store key %s, "
                               "status %d)", peer, key, st);
    char ip[INET6_ADDRSTRLEN + 1] = "";
    int port = 0;
    int ok = len < 128 && sscanf((const char *)val, "%46s %d", ip, &port) == 2;
    tp->host->free_value(val);
    memset(out, 0, sizeof(*out));
    if (ok && strchr(ip, ':'))
        ok = uv_ip6_addr(ip, port, (struct sockaddr_in6 *)out) == 0;
    else if (ok)
        ok = uv_ip4_addr(ip, port, (struct sockaddr_in *)out) == 0;
    if (!ok)
        return tp->host->error(tp->host->ctx, TUTTI_ERR_PROTOCOL, peer, 0,
                               "tcp: rank %d published a bad address under %s", peer, key);
    return TUTTI_OK;
}

int tcp_setup_connect(tcp_tp_t *tp)
{
    const tutti_tp_host_v1_t *host = tp->host;
    setup_t s = {.tp = tp};
    for (int i = 0; i < tp->nranks; i++) /* possibly a subset: others use another transport */
        s.needed += tutti_tp_host_serves(host, i);
    const char *sb = host->config(host->ctx, "SOCKET_BUFFER");
    tp->sockbuf = sb ? atoi(sb) : 0;
    struct sockaddr_storage me;
    conn_t *out = NULL;
    char ifname[64], mine[96];
    int st = choose_address(tp, &me, ifname, sizeof(ifname));
    if (st < 0)
        return st;
    int rc0;

    rc0 = uv_loop_init(&s.loop);
    if (rc0 < 0)
        return host->error(host->ctx, TUTTI_ERR_INTERNAL, -1, -rc0, "tcp: uv_loop_init failed");
    uv_tcp_init(&s.loop, &s.listener);
    s.listener.data = &s;
    uv_timer_init(&s.loop, &s.deadline);
    s.deadline.data = &s;
    int rc = uv_tcp_bind(&s.listener, (struct sockaddr *)&me, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s.listener, tp->nranks + 64, on_incoming);
    int len = sizeof(me);
    if (rc == 0)
        rc = uv_tcp_getsockname(&s.listener, (struct sockaddr *)&me, &len);
    fmt_addr((struct sockaddr *)&me, mine, sizeof(mine));
    if (rc < 0) {
        st = host->error(host->ctx, TUTTI_ERR_IO, -1, -rc, "tcp: cannot listen on %s (%s): %s",
                         mine, ifname, uv_strerror(rc));
        goto out_close;
    }
    LOGF(TUTTI_LOG_INFO, "tcp: rank %d listens on %s (interface %s)", tp->rank, mine, ifname);

    char ip[INET6_ADDRSTRLEN], val[128];
    if (me.ss_family == AF_INET6)
        uv_ip6_name((struct sockaddr_in6 *)&me, ip, sizeof(ip));
    else
        uv_ip4_name((struct sockaddr_in *)&me, ip, sizeof(ip));
    snprintf(val, sizeof(val), "%s %d",  ip,
             ntohs(me.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&me)->sin6_port
                                            : ((struct sockaddr_in *)&me)->sin_port));
    char key[64];
    snprintf(key, sizeof(key), "tcp/%d", tp->rank);
    st = host->store_set(host->ctx, key, val, strlen(val) + 1);
    if (st < 0) {
        host->error(host->ctx, st, -1, 0,
                    "tcp: cannot publish this rank's address (store status %d)", st);
        goto out_close;
    }

    /* Outgoing connections to every lower rank, all at once. */
    out = calloc((size_t)tp->nranks, sizeof(conn_t));
    if (!out) {
        st = TUTTI_ERR_NOMEM;
        goto out_close;
    }
    for (int j = 0; j < tp->rank; j++) {
        if (!tutti_tp_host_serves(host, j))
            continue;
        conn_t *c = &out[j];
        c->s = &s;
        c->peer = j;
        c->outgoing = 1;
        c->hello = (tcp_hello_t){TCP_HELLO_MAGIC, 1, tp->rank, tp->nranks};
        st = peer_addr_from_store(tp, j, &c->addr);
        if (st < 0)
            goto out_free;
        uv_timer_init(&s.loop, &c->retry);
        c->retry.data = c;
        c->retry_open = 1;
        conn_start(c);
    }
    if (s.needed > 0) {
        uv_timer_start(&s.deadline, on_deadline, (uint64_t)host->timeout_ms, 0);
        while (s.done < s.needed && s.status == 0)
            uv_run(&s.loop, UV_RUN_ONCE);
    }
    if (s.status < 0) {
        st = host->error(host->ctx, s.status, -1, 0, "%s", s.err);
    } else {
        st = TUTTI_OK;
        LOGF(TUTTI_LOG_INFO, "tcp: rank %d connected to %d peers", tp->rank, s.needed);
    }

out_free:
    for (int j = 0; j < tp->rank; j++)
        conn_close(&out[j]);
out_close:
    for (conn_t *c = s.conns; c; c = c->next)
        conn_close(c);
    uv_close((uv_handle_t *)&s.listener, on_handle_closed);
    uv_close((uv_handle_t *)&s.deadline, on_handle_closed);
    /* One loop turn runs every close callback (and cancels pending connects and
     * writes) requested above, before the memory behind the handles goes. */
    uv_run(&s.loop, UV_RUN_NOWAIT);
    if (uv_loop_close(&s.loop) != 0) {
        uv_run(&s.loop, UV_RUN_DEFAULT);
        uv_loop_close(&s.loop);
    }
    while (s.conns) {
        conn_t *c = s.conns;
        s.conns = c->next;
        free(c);
    }
    free(out);
    return st;
}
