/* TCP transport: choosing an address, and connecting the full mesh on a libuv loop.
 * Rank r listens, publishes "ip port" under tcp/r, connects to every lower rank and
 * accepts every higher one. Each connection starts with the hello exchange described
 * in tcp.h: both ends check the other's version, rank, job instance and checksum mode,
 * and, when the job has a secret, each proves it by answering the other's fresh
 * challenge (the secret stays in the library: host->auth_answer). A connection takes
 * its rank's slot only once both ends are satisfied; anything else that reaches the
 * listener (a stray, a forger, another job, an older tutti, a slow or silent client) is
 * refused with its reason and the rank keeps waiting for the genuine peer until the
 * deadline. A connecting rank that is refused, or that finds the listener is not its
 * peer, fails at once with the reason.
 * With TLS (tcp_tls.h) a connection first runs the TLS handshake, both ends verifying
 * the other's certificate, and the hello exchange then runs inside the session; a
 * rank's published address says whether it runs TLS, so that a rank whose peer differs
 * fails at once naming both, instead of meeting bytes it cannot read. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tcp.h"

#define LOGF(lvl, ...) tp->host->log(tp->host->ctx, (lvl), __VA_ARGS__)
/* a refused connecting rank retries after this long (transient failures only) */
#define CONN_RETRY_MS 20

typedef struct setup setup_t;
typedef struct conn conn_t;

/* What a connection is reading: the parts of a hello, then of a verdict. */
enum {
    PH_IDLE,           /* nothing: bytes that follow are not the set-up's */
    PH_HELLO_V1,       /* the first 16 bytes of a hello (a version 1 hello's all) */
    PH_HELLO_REST,     /* the rest of its fixed part */
    PH_HELLO_INST,     /* the job instance */
    PH_VERDICT,        /* a verdict's fixed part */
    PH_VERDICT_REASON, /* its reason text */
};

/* Why a rank's slot is still empty: the last refusal of a connection that claimed it,
 * or the last failure connecting to it; for the deadline's message. */
typedef struct slot_note {
    int status; /* < 0: a refusal with this status; 0: a transient failure */
    char msg[400];
} slot_note_t;

#define WBUF_BYTES (sizeof(tcp_hello_t) + TCP_MAX_INSTANCE + sizeof(tcp_verdict_t) + TCP_MAX_REASON)

struct conn {
    setup_t *s;
    uv_tcp_t h;
    uv_connect_t creq;
    uv_write_t wreq[2];
    uv_timer_t retry;
    int peer; /* outgoing: the rank called; incoming: the rank claimed, -1 before */
    int outgoing;
    int open; /* h initialised and not closed */
    int retry_open;
    int phase;    /* PH_* */
    size_t got;   /* bytes of the current part */
    int verdicts; /* verdicts received */
    int hello_sent;
    int active;           /* lazy, outgoing: a call under way (open, or waiting to retry) */
    int closing;          /* lazy, outgoing: h is closing (not to be reused before) */
    int addr_known;       /* lazy, outgoing: addr read from the store */
    int refuse_flags;     /* the next refusal's verdict flags (TCP_VERDICT_CROSSED) */
    tcp_tlsio_t *tls;     /* TLS: the session (to the link once established) */
    int tls_up;           /* TLS: its handshake is done */
    uint64_t deadline_ns; /* lazy: an outgoing call's, an incoming hello's (tp_now_ns) */
    char who[128];        /* the peer's address */
    uint8_t challenge[TCP_CHALLENGE_LEN]; /* ours, fresh for each connection */
    tcp_hello_t ph;                       /* the peer's hello */
    char pinst[TCP_MAX_INSTANCE + 1];
    tcp_verdict_t pv; /* the peer's latest verdict */
    char preason[TCP_MAX_REASON + 1];
    unsigned char wbuf[2][WBUF_BYTES];
    struct sockaddr_storage addr;
    conn_t *prev, *next; /* incoming connections, newest first */
};

struct setup {
    tcp_tp_t *tp;
    /* Eagerly, a loop of its own (own_loop), closed before the data path starts: the
     * set-up's handles are all gone before the data path's loop watches the sockets.
     * Lazily, the data path's loop: a connection's handle is closed (libuv takes its
     * socket out of the epoll set then) before the link's watcher is made on the dup. */
    uv_loop_t own_loop;
    uv_loop_t *loop;
    int lazy;
    conn_t *out;            /* lazy: nranks outgoing calls, one a peer */
    unsigned char *crossed; /* lazy: nranks: our call was refused as crossed; theirs comes */
    int refused_status;     /* lazy: after tcp_setup_failed, what every call is told */
    char refused_msg[TCP_MAX_REASON + 1];
    uv_tcp_t listener;
    uv_timer_t deadline;
    uint64_t deadline_ns;     /* tp_now_ns: the whole set-up's, store reads included */
    uv_timer_t watch;         /* eager: asks the host whether a peer failed its set-up */
    unsigned long long pidns; /* this process's pid namespace (tp_pidns), 0 unknown */
    int needed, done;
    int status, err_peer;
    char err[1536];
    conn_t *incoming;
    int nincoming;
    unsigned char *claimed; /* nranks: a connection holds the rank's slot */
    slot_note_t *notes;     /* nranks */
    conn_t *calling;        /* eager: the calls to lower ranks (connect_lower), for the
                               deadline's message */
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

static int is_link_local6(const uv_interface_address_t *a)
{
    const uint8_t *b = a->address.address6.sin6_addr.s6_addr;
    return a->address.address4.sin_family == AF_INET6 && b[0] == 0xfe && (b[1] & 0xc0) == 0x80;
}

static int choose_address(tcp_tp_t *tp, struct sockaddr_storage *out, char *ifname, size_t iflen)
{
    const char *spec = tp->host->config(tp->host->ctx, "SOCKET_IFNAME");
    const char *fams = tp->host->config(tp->host->ctx, "SOCKET_FAMILY");
    char *fend = NULL;
    long fam = fams && *fams ? strtol(fams, &fend, 10) : 0;
    if (fams && *fams && (*fend || (fam != 0 && fam != 4 && fam != 6))) {
        /* another number (5) or none: no family filter would be a silent "any" */
        const char *env = getenv("TUTTI_SOCKET_FAMILY");
        if (env && !strcmp(fams, "-1")) /* the library's mark for a value not a number */
            fams = env;
        int other = env && strcmp(env, fams);
        return tp->host->error(tp->host->ctx, TUTTI_ERR_CONFIG, -1, 0,
                               "tcp: TUTTI_SOCKET_FAMILY=%.32s: expected 0 (either, IPv4 "
                               "preferred), 4 (IPv4) or 6 (IPv6)%s%.32s%s",
                               fams, other ? " (the environment has \"" : "", other ? env : "",
                               other ? "\")" : "");
    }
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
        if (spec && !tp_ifname_matches(spec, a->name))
            continue;
        /* a real interface over a virtual one over loopback, IPv4 over IPv6 */
        int score = tp_ifaddr_score(a->name, a->is_internal, af == AF_INET);
        if (score > best_score) {
            best = i;
            best_score = score;
        }
    }
    if (best < 0) {
        const char *shown, *var = tp_socket_ifname_var(spec, &shown);
        tp->host->error(tp->host->ctx, TUTTI_ERR_NO_DEVICE, -1, 0,
                        "tcp: no interface matches %s=%s%s%s (interfaces: %s)", var, shown,
                        fam ? " with TUTTI_SOCKET_FAMILY=" : "", fam ? fams : "", seen);
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

static void on_handle_closed(uv_handle_t *h)
{
    (void)h;
}

/* Incoming connections are freed when their handle has closed. */
static void on_conn_closed(uv_handle_t *h)
{
    conn_t *c = h->data;
    if (c->outgoing) {
        c->closing = 0;
        return;
    }
    setup_t *s = c->s;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->incoming = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nincoming--;
    free(c);
}

/* TLS: the connection's session, gone (a closed or retried connection makes a new one) */
static void conn_tls_drop(conn_t *c)
{
    tcp_tlsio_free(c->tls);
    c->tls = NULL;
    c->tls_up = 0;
}

static void conn_close(conn_t *c)
{
    conn_tls_drop(c);
    if (c->open) {
        c->open = 0;
        c->phase = PH_IDLE;
        c->closing = 1;
        uv_close((uv_handle_t *)&c->h, on_conn_closed);
    }
    if (c->s && c->s->lazy && c->outgoing) {
        c->active = 0; /* the retry timer stays, for the next call */
        if (c->retry_open)
            uv_timer_stop(&c->retry);
        return;
    }
    if (c->retry_open) {
        uv_close((uv_handle_t *)&c->retry, on_handle_closed);
        c->retry_open = 0;
    }
}

static void setup_fail(setup_t *s, int status, int peer, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void setup_fail(setup_t *s, int status, int peer, const char *fmt, ...)
{
    if (s->lazy) {
        /* the link to peer fails (with every request on it); without a peer, each link
         * still waiting for its connection */
        char msg[1536];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        for (int i = 0; i < s->tp->nranks; i++) {
            if (i == peer || (peer < 0 && i != s->tp->rank && s->tp->links[i].fd < 0 &&
                              tutti_tp_host_serves(s->tp->host, i))) {
                if (s->out[i].active)
                    conn_close(&s->out[i]);
                s->tp->link_failed(s->tp, i, status, msg);
            }
        }
        return;
    }
    if (s->status < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof(s->err), fmt, ap);
    va_end(ap);
    s->status = status;
    s->err_peer = peer;
    uv_stop(s->loop);
}

/* Text from the network, made fit for a log line: printable ASCII only. */
static void printable(char *dst, size_t cap, const char *src, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len && n + 1 < cap; i++)
        dst[n++] = src[i] >= 0x20 && src[i] < 0x7f ? src[i] : '?';
    dst[n] = '\0';
}

/* 1 if equal; the time taken does not depend on where they differ. */
static int ct_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
    volatile uint8_t d = 0;
    for (size_t i = 0; i < n; i++)
        d |= a[i] ^ b[i];
    return d == 0;
}

static int random_bytes(uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(buf + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

/* The answer `prover` gives `verifier` for challenge: the context names the direction,
 * both ranks and the instance, so an answer cannot be replayed on another connection
 * or reflected back at its asker. */
static int hello_answer(setup_t *s, int prover, int verifier, const uint8_t *challenge,
                        uint8_t answer[32])
{
    tcp_tp_t *tp = s->tp;
    char ctx[64 + TCP_MAX_INSTANCE];
    snprintf(ctx, sizeof(ctx), "tcp-hello %d->%d %s", prover, verifier, tp->instance);
    int st = tp->host->auth_answer(tp->host->ctx, ctx, challenge, answer);
    if (st < 0)
        setup_fail(s, st, -1, "tcp: the library could not answer a challenge (status %d)", st);
    return st;
}

static size_t put_hello(const conn_t *c, unsigned char *buf)
{
    const tcp_tp_t *tp = c->s->tp;
    tcp_hello_t h = {
        .magic = TCP_HELLO_MAGIC,
        .version = TCP_HELLO_VERSION,
        .rank = tp->rank,
        .nranks = tp->nranks,
        .checksum = (uint32_t)tp->csum,
        .auth = (uint32_t)tp->auth,
        .inst_len = (uint32_t)strlen(tp->instance),
        .flags = tp->lazy ? TCP_HELLO_LAZY : 0,
    };
    memcpy(h.challenge, c->challenge, sizeof(h.challenge));
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), tp->instance, h.inst_len);
    return sizeof(h) + h.inst_len;
}

static size_t put_verdict(unsigned char *buf, int status, const uint8_t *answer, const char *reason,
                          uint32_t flags)
{
    tcp_verdict_t v = { .magic = TCP_VERDICT_MAGIC, .status = status, .flags = flags };
    if (answer)
        memcpy(v.answer, answer, sizeof(v.answer));
    size_t rl = reason ? strlen(reason) : 0;
    if (rl > TCP_MAX_REASON)
        rl = TCP_MAX_REASON;
    v.reason_len = (uint32_t)rl;
    memcpy(buf, &v, sizeof(v));
    if (rl)
        memcpy(buf + sizeof(v), reason, rl);
    return sizeof(v) + rl;
}

/* Remember why a connection for `rank` got nowhere (the last reason wins). */
static void note_slot(setup_t *s, int rank, int status, const char *msg)
{
    if (rank < 0 || rank >= s->tp->nranks)
        return;
    s->notes[rank].status = status;
    snprintf(s->notes[rank].msg, sizeof(s->notes[rank].msg), "%s", msg);
}

/* 1 when the connection never leaves this host's network stack: the peer is at a
 * loopback address or at this end's own address (traffic to a local address goes over
 * the loopback device whatever the interface). Both ends see the same. */
static int link_stays_here(int fd)
{
    struct sockaddr_storage me, peer;
    socklen_t lm = sizeof(me), lp = sizeof(peer);
    if (getsockname(fd, (struct sockaddr *)&me, &lm) < 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &lp) < 0 || me.ss_family != peer.ss_family)
        return 0;
    if (peer.ss_family == AF_INET) {
        struct in_addr a = ((struct sockaddr_in *)&me)->sin_addr;
        struct in_addr b = ((struct sockaddr_in *)&peer)->sin_addr;
        return a.s_addr == b.s_addr || (ntohl(b.s_addr) >> 24) == 127;
    }
    if (peer.ss_family == AF_INET6) {
        const struct in6_addr *a = &((struct sockaddr_in6 *)&me)->sin6_addr;
        const struct in6_addr *b = &((struct sockaddr_in6 *)&peer)->sin6_addr;
        return !memcmp(a, b, sizeof(*a)) || IN6_IS_ADDR_LOOPBACK(b) ||
               (IN6_IS_ADDR_V4MAPPED(b) && b->s6_addr[12] == 127);
    }
    return 0;
}

/* The congestion control a link starts with, set on its socket before the connection
 * exists (NULL: the system's): a listener's passes to every connection it accepts, and
 * a connecting socket has it before connect(). Set only once connected, it comes too
 * late: the system's algorithm has started the connection by then, and BBR's start marks
 * the socket for pacing, which no later change of algorithm undoes, so that reno still
 * spaced a message's segments by timer. A 2-rank exchange of 64 KiB (two segments on
 * loopback, with the frame header) took 80-90 us after 3 ms idle against 25-27 with reno
 * from the first packet (docs/benchmarks.md, session 67). auto starts every link on
 * reno and gives a link that leaves the host the system's once connected
 * (link_congestion). */
static const char *cc_initial(const tcp_tp_t *tp)
{
    return tp->cc_mode == TCP_CC_NAMED ? tp->cc_name : tp->cc_mode == TCP_CC_AUTO ? "reno" : NULL;
}

static void socket_cc_initial(const tcp_tp_t *tp, int fd, const char *what)
{
    const char *name = cc_initial(tp);
    if (!name)
        return;
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)strlen(name)) != 0)
        LOGF(TUTTI_LOG_TRACE,
             "tcp: rank %d: cannot set congestion control %s on %s: %s (each link tries "
             "again once connected)",
             tp->rank, name, what, strerror(errno));
}

/* The congestion control of a socket, or "" (buf holds cap bytes). */
static const char *socket_cc(int fd, char *buf, size_t cap)
{
    socklen_t len = (socklen_t)cap - 1;
    memset(buf, 0, cap);
    if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, buf, &len) != 0)
        buf[0] = '\0';
    return buf;
}

/* TUTTI_TCP_CONGESTION on a new link, once connected. Congestion control has nothing to
 * do on a link that never leaves the host, and a rate-based one hurts there: under BBR
 * (this VM's default) the kernel paces every loopback segment by timer, and a 2-rank
 * allreduce of 4 MiB took 1.7-1.8 ms against 0.95-1.04 under reno or cubic (16 MiB:
 * 7.5-7.8 against 4.7). So auto keeps reno (which any process may choose) on such links
 * and gives the others the system's. A named one goes on every link, or the set-up
 * fails. */
static int link_congestion(setup_t *s, tcp_link_t *L, int peer)
{
    tcp_tp_t *tp = s->tp;
    int here = tp->cc_mode == TCP_CC_AUTO && link_stays_here(L->fd);
    const char *name = tp->cc_mode == TCP_CC_NAMED                      ? tp->cc_name
                       : here                                           ? "reno"
                       : tp->cc_mode == TCP_CC_AUTO && tp->cc_system[0] ? tp->cc_system
                                                                        : NULL;
    if (!name)
        return 0;
    char now[sizeof(tp->cc_name)];
    L->cc_early = !strcmp(socket_cc(L->fd, now, sizeof(now)), name);
    if (L->cc_early ||
        setsockopt(L->fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)strlen(name)) == 0) {
        LOGF(TUTTI_LOG_TRACE, "tcp: rank %d: congestion control %s on the link to rank %d%s%s",
             tp->rank, name, peer,
             tp->cc_mode != TCP_CC_AUTO ? ""
             : here                     ? " (it stays on this host)"
                                        : " (the system's: it leaves this host)",
             L->cc_early ? ", from its first packet" : "");
        return 0;
    }
    int err = errno;
    if (tp->cc_mode == TCP_CC_AUTO) {
        LOGF(TUTTI_LOG_TRACE, "tcp: rank %d: cannot set %s on the link to rank %d (%s): %s",
             tp->rank, name, peer, L->addr, strerror(err));
        return 0;
    }
    setup_fail(s, TUTTI_ERR_CONFIG, peer,
               "tcp: rank %d cannot use congestion control \"%s\" (TUTTI_TCP_CONGESTION) on the "
               "link to rank %d: %s (net.ipv4.tcp_available_congestion_control lists what this "
               "kernel has, net.ipv4.tcp_allowed_congestion_control what a process without "
               "CAP_NET_ADMIN may choose)",
               tp->rank, name, peer, strerror(err));
    return -1;
}

/* A connection holds its rank's slot: it becomes the link to c->peer. */
static void conn_established(conn_t *c)
{
    setup_t *s = c->s;
    tcp_tp_t *tp = s->tp;
    tcp_link_t *L = &tp->links[c->peer];
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->h, &fd) < 0 || (L->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        int err = errno, peer = c->peer;
        L->fd = -1;
        conn_close(c); /* the peer reads the end of it */
        setup_fail(s, TUTTI_ERR_IO, peer, "tcp: cannot take over the socket of rank %d: %s", peer,
                   strerror(err));
        return;
    }
    if (c->tls) { /* the session goes on on the link's socket */
        L->tls = c->tls;
        c->tls = NULL;
        tcp_tlsio_attach(L->tls, L->fd);
    }
    int one = 1;
    setsockopt(L->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (tp->sockbuf > 0) {
        setsockopt(L->fd, SOL_SOCKET, SO_SNDBUF, &tp->sockbuf, sizeof(tp->sockbuf));
        setsockopt(L->fd, SOL_SOCKET, SO_RCVBUF, &tp->sockbuf, sizeof(tp->sockbuf));
        /* A buffer under two segments leaves the receiver a window the kernel's
         * silly-window avoidance will not announce: the sender then moves a segment a
         * persist timer (4 KiB on loopback, whose segments are 32-64 KiB: a 64 KiB
         * broadcast took 1.5 s, session 109). Allowed (a choice), but said once. */
        int mss = 0;
        socklen_t ml = sizeof(mss);
        if (!tp->sockbuf_warned && getsockopt(L->fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &ml) == 0 &&
            mss > 0 && tp->sockbuf < 2 * mss) {
            tp->sockbuf_warned = 1;
            LOGF(TUTTI_LOG_WARN,
                 "tcp: TUTTI_SOCKET_BUFFER=%d is under two segments of the link to rank %d "
                 "(%d bytes each): the kernel then sends about a segment per persist timer "
                 "(hundreds of ms); use 0 (autotuning) or at least %d",
                 tp->sockbuf, c->peer, mss, 2 * mss);
        }
    }
    snprintf(L->addr, sizeof(L->addr), "%s", c->who);
    LOGF(s->lazy ? TUTTI_LOG_INFO : TUTTI_LOG_TRACE, "tcp: rank %d connected to rank %d (%s)%s",
         tp->rank, c->peer, c->who,
         !s->lazy      ? ""
         : c->outgoing ? ", at its first use"
                       : ", at its first use there");
    int cc = link_congestion(s, L, c->peer);
    int peer = c->peer;
    conn_close(c);
    if (cc < 0) {
        if (s->lazy) { /* the link failed (setup_fail): the peer reads the end of it */
            close(L->fd);
            L->fd = -1;
            tcp_tlsio_free(L->tls);
            L->tls = NULL;
        }
        return;
    }
    if (s->lazy) {
        conn_t *o = &s->out[peer];
        if (o != c && o->active)
            conn_close(o); /* ours, superseded by the higher rank's (it refuses ours) */
        s->crossed[peer] = 0;
        tp->link_up(tp, peer);
        return;
    }
    if (++s->done == s->needed)
        uv_stop(s->loop);
}

/* A best-effort write that never waits (a refusal's verdict, just before the close);
 * through the session with TLS, once its handshake is done (before, nothing goes). */
static void conn_try_write(conn_t *c, const void *buf, size_t n)
{
    void *out = NULL;
    if (c->tls) {
        if (!c->tls_up || tcp_tlsio_write(c->tls, buf, n) < 0 ||
            !(out = tcp_tlsio_take_out(c->tls, &n)))
            return;
        buf = out;
    }
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)n);
    uv_try_write((uv_stream_t *)&c->h, &b, 1);
    free(out);
}

/* ---- refusals ---- */

/* An incoming connection is not (or not yet provably) the peer it claims: tell it why
 * (best effort, never waiting for a slow reader), remember it, close it. */
static void incoming_refuse(conn_t *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void incoming_refuse(conn_t *c, int status, const char *fmt, ...)
{
    setup_t *s = c->s;
    tcp_tp_t *tp = s->tp;
    char why[TCP_MAX_REASON + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    uint32_t flags = (uint32_t)c->refuse_flags;
    LOGF(flags ? TUTTI_LOG_TRACE : TUTTI_LOG_WARN,
         "tcp: rank %d refused a connection from %s: %s (status %d)", tp->rank, c->who, why,
         status);
    if (!flags) {
        char note[400];
        snprintf(note, sizeof(note), "%s, claiming rank %d, was refused: %s", c->who, c->peer, why);
        note_slot(s, c->peer, status, note);
    }
    unsigned char *buf = c->wbuf[1];
    size_t n = 0;
    if (!c->hello_sent)
        n = put_hello(c, buf);
    n += put_verdict(buf + n, status, NULL, why, flags);
    conn_try_write(c, buf, n);
    int peer = c->peer;
    conn_close(c);
    if (s->lazy && !flags && peer >= 0 && peer < tp->nranks && s->crossed[peer])
        setup_fail(s, status, peer, "tcp: rank %d could not connect to rank %d: %s", tp->rank, peer,
                   why); /* the call this rank waits for is not the peer's */
}

/* The listener this rank called is not its peer, or refused it: tell it (best effort)
 * and fail the set-up at once; retrying would meet the same answer. */
static void outgoing_fail(conn_t *c, int status, int tell, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void outgoing_fail(conn_t *c, int status, int tell, const char *fmt, ...)
{
    char why[TCP_MAX_REASON + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (tell) {
        size_t n = put_verdict(c->wbuf[1], status, NULL, why, 0);
        conn_try_write(c, c->wbuf[1], n);
    }
    setup_t *s = c->s;
    if (s->lazy)
        conn_close(c);
    setup_fail(s, status, c->peer, "tcp: rank %d could not connect to rank %d (%s): %s",
               s->tp->rank, c->peer, c->who, why);
}

/* Whether the peer's hello fits this rank: 0, or a status with the reason in why. */
static int hello_check(conn_t *c, char *why, size_t len)
{
    tcp_tp_t *tp = c->s->tp;
    const tcp_hello_t *h = &c->ph;
    char inst[96];
    printable(inst, sizeof(inst), c->pinst, h->inst_len);
    if (h->nranks != tp->nranks) {
        snprintf(why, len, "%s says it is rank %d of %d, but this communicator has %d ranks",
                 c->who, h->rank, h->nranks, tp->nranks);
        return TUTTI_ERR_CONFIG;
    }
    if (c->outgoing && h->rank != c->peer) {
        snprintf(why, len,
                 "%s answered as rank %d, not rank %d (a stale or rewritten address "
                 "in the store?)",
                 c->who, h->rank, c->peer);
        return TUTTI_ERR_PROTOCOL;
    }
    if (!c->outgoing && ((tp->lazy ? h->rank == tp->rank || h->rank < 0 : h->rank <= tp->rank) ||
                         h->rank >= tp->nranks || !tutti_tp_host_serves(tp->host, h->rank))) {
        snprintf(why, len, "%s claims rank %d, which does not connect to rank %d", c->who, h->rank,
                 tp->rank);
        return TUTTI_ERR_PROTOCOL;
    }
    if (h->inst_len != strlen(tp->instance) || memcmp(c->pinst, tp->instance, h->inst_len)) {
        snprintf(why, len,
                 "rank %d (%s) belongs to job instance \"%s\", rank %d to \"%s\": "
                 "ranks of different jobs, or of different runs of one job, never connect",
                 h->rank, c->who, inst, tp->rank, tp->instance);
        return TUTTI_ERR_IN_USE;
    }
    if (h->checksum != (uint32_t)tp->csum) {
        snprintf(why, len,
                 "rank %d (%s) runs with TUTTI_CHECKSUM=%s, rank %d with %s: set it "
                 "alike on every rank",
                 h->rank, c->who, tcp_csum_name(h->checksum), tp->rank,
                 tcp_csum_name((uint32_t)tp->csum));
        return TUTTI_ERR_CONFIG;
    }
    if ((h->flags & TCP_HELLO_LAZY) != (tp->lazy ? TCP_HELLO_LAZY : 0u)) {
        snprintf(why, len,
                 "rank %d (%s) connects %s and rank %d %s: set TUTTI_TCP_CONNECT alike on "
                 "every rank",
                 h->rank, c->who, h->flags & TCP_HELLO_LAZY ? "lazily" : "eagerly", tp->rank,
                 tp->lazy ? "lazily" : "eagerly");
        return TUTTI_ERR_CONFIG;
    }
    if (h->auth != (uint32_t)tp->auth) {
        snprintf(why, len,
                 "rank %d (%s) has %s job secret and rank %d has %s: give every rank "
                 "the same TUTTI_AUTH_TOKEN (or TUTTI_AUTH_TOKEN_FILE)",
                 h->rank, c->who, h->auth ? "a" : "no", tp->rank, tp->auth ? "one" : "none");
        return TUTTI_ERR_AUTH;
    }
    return TUTTI_OK;
}

/* ---- the steps ---- */

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void outgoing_retry(conn_t *c, const char *what, int uv_status);

static void *part(conn_t *c, size_t *len)
{
    switch (c->phase) {
    case PH_HELLO_V1: *len = TCP_HELLO_V1_BYTES; return &c->ph;
    case PH_HELLO_REST:
        *len = sizeof(tcp_hello_t) - TCP_HELLO_V1_BYTES;
        return (char *)&c->ph + TCP_HELLO_V1_BYTES;
    case PH_HELLO_INST: *len = c->ph.inst_len; return c->pinst;
    case PH_VERDICT: *len = sizeof(tcp_verdict_t); return &c->pv;
    case PH_VERDICT_REASON: *len = c->pv.reason_len; return c->preason;
    }
    *len = 0;
    return NULL;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    conn_t *c = h->data;
    size_t len;
    if (c->tls) {
        /* what the session asked for (a record's header, then its body), or a header's
         * worth where it has room: bytes it has not asked for yet wait in its buffer
         * (none: libuv reports no buffer, a failure) */
        size_t room;
        char *p = tcp_tlsio_inbuf(c->tls, &len, &room);
        *buf = len ? uv_buf_init(p, (unsigned)len)
                   : uv_buf_init(room ? p : NULL, (unsigned)TT_KIT_MIN(room, 5));
        return;
    }
    char *p = part(c, &len);
    /* exactly the part's bytes: what the peer sends after the set-up stays in the
     * socket for the data path */
    *buf = p && len > c->got ? uv_buf_init(p + c->got, (unsigned)(len - c->got))
                             : uv_buf_init(NULL, 0);
}

/* A write of wbuf[which] is out (or failed); which -1: the TLS handshake's bytes. */
static void written(conn_t *c, int which, int status)
{
    if (status == UV_ECANCELED || !c->open)
        return;
    if (status < 0) {
        if (c->outgoing) {
            outgoing_retry(c, which < 0 ? "in the TLS handshake" : "sending the hello", status);
        } else {
            if (which == 1)
                c->s->claimed[c->peer] = 0; /* the genuine peer may come again */
            conn_close(c);
        }
        return;
    }
    if (!c->outgoing && which == 1)
        conn_established(c); /* the last verdict is out: the slot is taken */
}

static void on_written(uv_write_t *w, int status)
{
    conn_t *c = w->data;
    written(c, w == &c->wreq[1] ? 1 : 0, status);
}

/* TLS: a write of the session's output, which it owns. */
typedef struct tls_wreq {
    uv_write_t req;
    conn_t *c;
    int which;
    void *buf;
} tls_wreq_t;

static void on_tls_written(uv_write_t *req, int status)
{
    tls_wreq_t *w = req->data;
    conn_t *c = w->c;
    int which = w->which;
    free(w->buf);
    free(w);
    written(c, which, status);
}

/* TLS: send what the session has produced (as the write of wbuf[which]). 0 or a libuv
 * error. */
static int tls_flush(conn_t *c, int which)
{
    size_t n;
    void *p = tcp_tlsio_take_out(c->tls, &n);
    if (!p)
        return 0;
    tls_wreq_t *w = malloc(sizeof(*w));
    if (!w) {
        free(p);
        return UV_ENOMEM;
    }
    *w = (tls_wreq_t){ .c = c, .which = which, .buf = p };
    w->req.data = w;
    uv_buf_t b = uv_buf_init(p, (unsigned)n);
    int st = uv_write(&w->req, (uv_stream_t *)&c->h, &b, 1, on_tls_written);
    if (st < 0) {
        free(p);
        free(w);
    }
    return st;
}

static int conn_write(conn_t *c, int which, size_t len)
{
    if (c->tls)
        return tcp_tlsio_write(c->tls, c->wbuf[which], len) < 0 ? UV_EPROTO : tls_flush(c, which);
    uv_buf_t b = uv_buf_init((char *)c->wbuf[which], (unsigned)len);
    c->wreq[which].data = c;
    return uv_write(&c->wreq[which], (uv_stream_t *)&c->h, &b, 1, on_written);
}

/* Whether an incoming connection from the rank it claims may hold that rank's slot:
 * 0, or a refusal's status with its reason in why (and c->refuse_flags). Checked at its
 * hello and again at its last step. */
static int incoming_may(conn_t *c, char *why, size_t len)
{
    setup_t *s = c->s;
    tcp_tp_t *tp = s->tp;
    const tcp_link_t *L = &tp->links[c->peer];
    if (s->lazy && s->refused_status < 0) {
        snprintf(why, len, "rank %d failed: %s", tp->rank, s->refused_msg);
        return s->refused_status;
    }
    if (L->fd >= 0 || s->claimed[c->peer]) {
        /* lazily, the late half of two calls that crossed: the caller has closed it */
        c->refuse_flags = s->lazy ? TCP_VERDICT_CROSSED : 0;
        snprintf(why, len, "rank %d is already connected to rank %d", c->peer, tp->rank);
        return TUTTI_ERR_PROTOCOL;
    }
    if (s->lazy && L->fail.status) {
        snprintf(why, len, "rank %d's link to rank %d failed: %s", tp->rank, c->peer, L->fail.msg);
        return L->fail.status;
    }
    if (s->lazy && c->peer < tp->rank && s->out[c->peer].active) {
        c->refuse_flags = TCP_VERDICT_CROSSED;
        snprintf(why, len,
                 "rank %d is calling rank %d at the same time (the higher rank's call "
                 "makes the link)",
                 tp->rank, c->peer);
        return TUTTI_ERR_PROTOCOL;
    }
    return TUTTI_OK;
}

/* Incoming: the claimant's whole hello is here. */
static void incoming_hello(conn_t *c)
{
    setup_t *s = c->s;
    tcp_tp_t *tp = s->tp;
    char why[TCP_MAX_REASON + 1];
    c->peer = c->ph.rank;
    int st = hello_check(c, why, sizeof(why));
    if (st == 0)
        st = incoming_may(c, why, sizeof(why));
    if (st < 0) {
        incoming_refuse(c, st, "%s", why);
        return;
    }
    uint8_t answer[32] = { 0 };
    if (tp->auth && (random_bytes(c->challenge, sizeof(c->challenge)) < 0 ||
                     hello_answer(s, tp->rank, c->peer, c->ph.challenge, answer) < 0)) {
        setup_fail(s, TUTTI_ERR_IO, -1, "tcp: no random bytes for a challenge: %s",
                   strerror(errno));
        return;
    }
    size_t n = put_hello(c, c->wbuf[0]);
    n += put_verdict(c->wbuf[0] + n, TUTTI_OK, answer, NULL, 0);
    c->hello_sent = 1;
    int w = conn_write(c, 0, n);
    if (w < 0) {
        LOGF(TUTTI_LOG_WARN, "tcp: cannot answer the hello from %s: %s", c->who, uv_strerror(w));
        conn_close(c);
        return;
    }
    c->phase = PH_VERDICT;
}

/* Incoming: the claimant's verdict on this rank's hello, with its proof. */
static void incoming_verdict(conn_t *c)
{
    setup_t *s = c->s;
    tcp_tp_t *tp = s->tp;
    if (c->pv.status < 0) {
        char why[TCP_MAX_REASON + 1], note[400];
        printable(why, sizeof(why), c->preason, c->pv.reason_len);
        LOGF(TUTTI_LOG_WARN, "tcp: %s (claiming rank %d) refused rank %d: %s", c->who, c->peer,
             tp->rank, why);
        snprintf(note, sizeof(note), "%s, claiming rank %d, refused rank %d: %s", c->who, c->peer,
                 tp->rank, why);
        note_slot(s, c->peer, c->pv.status, note);
        int peer = c->peer, st = c->pv.status;
        conn_close(c);
        if (s->lazy && s->crossed[peer]) /* the call this rank waits for has failed */
            setup_fail(s, st, peer, "tcp: rank %d could not connect to rank %d: %s", tp->rank, peer,
                       note);
        return;
    }
    if (tp->auth) {
        uint8_t want[32];
        if (hello_answer(s, c->peer, tp->rank, c->challenge, want) < 0)
            return;
        if (!ct_equal(want, c->pv.answer, sizeof(want))) {
            incoming_refuse(c, TUTTI_ERR_AUTH,
                            "%s, claiming rank %d, failed to prove the job secret (a wrong "
                            "TUTTI_AUTH_TOKEN, or not a rank of this job)",
                            c->who, c->peer);
            return;
        }
    }
    char why[TCP_MAX_REASON + 1];
    int st = incoming_may(c, why, sizeof(why));
    if (st < 0) {
        incoming_refuse(c, st, "%s", why);
        return;
    }
    s->claimed[c->peer] = 1;
    size_t n = put_verdict(c->wbuf[1], TUTTI_OK, NULL, NULL, 0);
    int w = conn_write(c, 1, n);
    if (w < 0) {
        s->claimed[c->peer] = 0;
        LOGF(TUTTI_LOG_WARN, "tcp: cannot accept rank %d from %s: %s", c->peer, c->who,
             uv_strerror(w));
        conn_close(c);
    }
}

/* Outgoing: the peer refused this call. Lazily, a call refused as crossed is no failure:
 * the peer, the higher rank, is calling this one, whose listener takes that call. */
static void outgoing_refused(conn_t *c)
{
    setup_t *s = c->s;
    const tcp_tp_t *tp = s->tp;
    char why[TCP_MAX_REASON + 1];
    printable(why, sizeof(why), c->preason, c->pv.reason_len);
    if (s->lazy && (c->pv.flags & TCP_VERDICT_CROSSED) && c->peer > tp->rank) {
        LOGF(TUTTI_LOG_TRACE, "tcp: rank %d's call to rank %d crossed its call: %s", tp->rank,
             c->peer, why);
        s->crossed[c->peer] = 1;
        conn_close(c);
        return;
    }
    outgoing_fail(c, c->pv.status, 0, "refused: %s", why);
}

/* Outgoing: the peer's hello and its first verdict are here. */
static void outgoing_first_verdict(conn_t *c)
{
    setup_t *s = c->s;
    tcp_tp_t *tp = s->tp;
    char why[TCP_MAX_REASON + 1];
    if (c->pv.status < 0) {
        outgoing_refused(c);
        return;
    }
    int st = hello_check(c, why, sizeof(why));
    if (st < 0) {
        outgoing_fail(c, st, 1, "%s", why);
        return;
    }
    uint8_t answer[32] = { 0 };
    if (tp->auth) {
        uint8_t want[32];
        if (hello_answer(s, c->peer, tp->rank, c->challenge, want) < 0)
            return;
        if (!ct_equal(want, c->pv.answer, sizeof(want))) {
            outgoing_fail(c, TUTTI_ERR_AUTH, 1,
                          "%s, answering as rank %d, failed to prove the job secret (a wrong "
                          "TUTTI_AUTH_TOKEN, or not a rank of this job)",
                          c->who, c->peer);
            return;
        }
        if (hello_answer(s, tp->rank, c->peer, c->ph.challenge, answer) < 0)
            return;
    }
    size_t n = put_verdict(c->wbuf[1], TUTTI_OK, answer, NULL, 0);
    int w = conn_write(c, 1, n);
    if (w < 0) {
        outgoing_retry(c, "sending the verdict", w);
        return;
    }
    c->phase = PH_VERDICT;
}

/* Outgoing: the peer's last verdict. */
static void outgoing_last_verdict(conn_t *c)
{
    if (c->pv.status < 0) {
        outgoing_refused(c);
        return;
    }
    conn_established(c);
}

/* The current part is complete: check it and move on. Returns 0 to read on, -1 when
 * the connection stopped reading (closed, refused, waiting, or done). */
static int conn_part_done(conn_t *c)
{
    setup_t *s = c->s;
    tcp_tp_t *tp = s->tp;
    c->got = 0;
    switch (c->phase) {
    case PH_HELLO_V1:
        if (c->ph.magic != TCP_HELLO_MAGIC) {
            if (c->outgoing) {
                outgoing_fail(c, TUTTI_ERR_PROTOCOL, 0,
                              "the listener there answered with something that is not a "
                              "tutti hello (magic 0x%08x)",
                              c->ph.magic);
            } else {
                /* not one of ours at all: no answer */
                LOGF(TUTTI_LOG_WARN,
                     "tcp: rank %d dropped a connection from %s: not a tutti "
                     "hello (magic 0x%08x)",
                     tp->rank, c->who, c->ph.magic);
                conn_close(c);
            }
            return -1;
        }
        /* claimed: refusals are noted under it; a rank out of range is none (hello_check
         * refuses it once the hello is in; the eviction below indexes by it meanwhile) */
        if (!c->outgoing)
            c->peer = c->ph.rank >= 0 && c->ph.rank < tp->nranks ? c->ph.rank : -1;
        if (c->ph.version != TCP_HELLO_VERSION) {
            if (c->outgoing)
                outgoing_fail(c, TUTTI_ERR_PROTOCOL, 0,
                              "it speaks hello version %u, this rank version %u (mixed tutti "
                              "builds?)",
                              c->ph.version, TCP_HELLO_VERSION);
            else
                incoming_refuse(c, TUTTI_ERR_PROTOCOL,
                                "hello version %u from %s (claiming rank %d), but rank %d "
                                "speaks version %u (mixed tutti builds?)",
                                c->ph.version, c->who, c->ph.rank, tp->rank, TCP_HELLO_VERSION);
            return -1;
        }
        c->phase = PH_HELLO_REST;
        return 0;
    case PH_HELLO_REST:
        if (c->ph.inst_len > TCP_MAX_INSTANCE) {
            if (c->outgoing)
                outgoing_fail(c, TUTTI_ERR_PROTOCOL, 1, "its hello has a %u-byte instance",
                              c->ph.inst_len);
            else
                incoming_refuse(c, TUTTI_ERR_PROTOCOL, "a %u-byte instance (at most %d)",
                                c->ph.inst_len, TCP_MAX_INSTANCE);
            return -1;
        }
        c->phase = PH_HELLO_INST;
        return 0;
    case PH_HELLO_INST:
        c->pinst[c->ph.inst_len] = '\0';
        if (c->outgoing) {
            c->phase = PH_VERDICT;
            return 0;
        }
        c->phase = PH_IDLE;
        incoming_hello(c);
        return c->phase == PH_IDLE ? -1 : 0;
    case PH_VERDICT:
        if (c->pv.magic != TCP_VERDICT_MAGIC || c->pv.reason_len > TCP_MAX_REASON ||
            c->pv.status > 0 || c->pv.status <= TUTTI_STATUS_LAST_) {
            if (c->outgoing)
                outgoing_fail(c, TUTTI_ERR_PROTOCOL, 1, "a malformed verdict (magic 0x%08x)",
                              c->pv.magic);
            else
                incoming_refuse(c, TUTTI_ERR_PROTOCOL, "a malformed verdict (magic 0x%08x)",
                                c->pv.magic);
            return -1;
        }
        c->phase = PH_VERDICT_REASON;
        return 0;
    case PH_VERDICT_REASON:
        c->preason[c->pv.reason_len] = '\0';
        c->phase = PH_IDLE;
        c->verdicts++;
        if (!c->outgoing)
            incoming_verdict(c);
        else if (c->verdicts == 1)
            outgoing_first_verdict(c);
        else
            outgoing_last_verdict(c);
        return c->phase == PH_IDLE ? -1 : 0;
    }
    return -1;
}

/* TLS: the session failed (its reason in tcp_tlsio_reason), when. A session that
 * ended is a connection that closed (retried, as without TLS); any other failure is
 * the handshake's or the peer's alert: an outgoing call fails at once with it, an
 * incoming one is dropped (its rank is not known yet). */
static void tls_failed(conn_t *c, int how, const char *when)
{
    setup_t *s = c->s;
    tcp_tp_t *tp = s->tp;
    const char *why = tcp_tlsio_reason(c->tls);
    if (c->outgoing && how == -2) {
        outgoing_retry(c, when, UV_EOF);
        return;
    }
    if (c->outgoing) {
        /* the session is dead: read no more of it (eagerly, outgoing_fail leaves the
         * handle to the set-up's end) */
        if (c->open)
            uv_read_stop((uv_stream_t *)&c->h);
        c->phase = PH_IDLE;
        outgoing_fail(c, TUTTI_ERR_AUTH, 0, "TLS %s: %s", when, why);
        return;
    }
    LOGF(how == -2 && !c->tls_up ? TUTTI_LOG_INFO : TUTTI_LOG_WARN,
         "tcp: rank %d dropped a connection from %s: TLS %s: %s", tp->rank, c->who, when, why);
    conn_close(c);
}

static void outgoing_hello(conn_t *c);

/* TLS: a step of the handshake, and what it wrote sent: 1 done, 0 it waits for the
 * peer, -1 the connection failed (handled). */
static int tls_handshake(conn_t *c)
{
    int h = tcp_tlsio_handshake(c->tls);
    int w = tls_flush(c, -1);
    if (h < 0) {
        tls_failed(c, h, "handshake");
        return -1;
    }
    if (w < 0) {
        written(c, -1, w);
        return -1;
    }
    return h;
}

/* TLS: nread bytes of the session's came: drive the handshake, then read the parts'
 * plaintext through it. */
static void tls_on_read(conn_t *c, size_t nread)
{
    tcp_tlsio_fed(c->tls, nread);
    if (!c->tls_up) {
        if (tls_handshake(c) <= 0)
            return;
        c->tls_up = 1;
        if (c->outgoing) {
            outgoing_hello(c);
            if (!c->open || !c->tls)
                return;
        }
    }
    for (;;) {
        size_t len;
        char *p = part(c, &len);
        if (!p)
            break;
        while (c->got < len) {
            ssize_t r = tcp_tlsio_read(c->tls, p + c->got, len - c->got);
            if (r == 0)
                return;
            if (r < 0) {
                tls_failed(c, (int)r,
                           c->outgoing ? "after the handshake (the peer's verdict on this "
                                         "rank's certificate, or its end)"
                                       : "in the hello");
                return;
            }
            c->got += (size_t)r;
        }
        if (conn_part_done(c) < 0)
            break;
    }
    if (c->open && c->phase == PH_IDLE)
        uv_read_stop((uv_stream_t *)&c->h);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    conn_t *c = st->data;
    setup_t *s = c->s;
    tcp_tp_t *tp = s->tp;
    if (nread == 0 || !c->open)
        return;
    if (c->tls && nread > 0) {
        tls_on_read(c, (size_t)nread);
        return;
    }
    if (nread < 0) {
        if (c->outgoing) {
            outgoing_retry(c, "during the hello", (int)nread);
        } else {
            LOGF(c->ph.magic ? TUTTI_LOG_INFO : TUTTI_LOG_WARN,
                 "tcp: a connection from %s closed during the hello (%s)", c->who,
                 uv_strerror((int)nread));
            conn_close(c);
        }
        return;
    }
    c->got += (size_t)nread;
    for (;;) {
        size_t len;
        if (!part(c, &len) || c->got < len)
            break;
        if (conn_part_done(c) < 0)
            break;
    }
    if (c->open && c->phase == PH_IDLE)
        uv_read_stop(st);
}

static void conn_start(conn_t *c);

static void on_retry(uv_timer_t *t)
{
    conn_t *c = t->data;
    if (c->closing) { /* the last call's handle has not finished closing */
        uv_timer_start(&c->retry, on_retry, CONN_RETRY_MS, 0);
        return;
    }
    if (c->s->lazy && !c->addr_known) { /* lazily: the peer's address, asked again */
        c->active = 0;
        tcp_setup_need(c->s->tp, c->peer);
        return;
    }
    conn_start(c);
}

/* Outgoing: a transient failure (refused, reset, closed before answering): try again
 * until the deadline, which names what happened last. */
static void outgoing_retry(conn_t *c, const char *what, int uv_status)
{
    setup_t *s = c->s;
    tcp_tp_t *tp = s->tp;
    if (s->lazy && ((uv_status == UV_ECONNREFUSED && !strcmp(what, "to connect")) ||
                    tp_now_ns() >= c->deadline_ns)) {
        /* It listened before it published, and keeps listening while its communicator
         * lives: no listener is a rank gone. */
        int gone = uv_status == UV_ECONNREFUSED;
        conn_close(c);
        setup_fail(s, gone ? TUTTI_ERR_PEER : TUTTI_ERR_TIMEOUT, c->peer,
                   "tcp: rank %d could not connect to rank %d (%s) at the link's first use: %s%s",
                   tp->rank, c->peer, c->who,
                   gone ? "nothing listens there any more (it exited, or destroyed its "
                          "communicator): "
                        : "",
                   uv_strerror(uv_status));
        return;
    }
    char note[400];
    snprintf(note, sizeof(note), "the last attempt to connect to rank %d (%s) failed %s: %s%s",
             c->peer, c->who, what, uv_strerror(uv_status),
             uv_status == UV_EOF && c->ph.magic == 0 ? " (it closed without answering the "
                                                       "hello: an older tutti?)"
                                                     : "");
    note_slot(s, c->peer, 0, note);
    LOGF(TUTTI_LOG_TRACE, "tcp: %s; retrying", note);
    if (c->open) {
        c->open = 0;
        c->closing = 1;
        uv_close((uv_handle_t *)&c->h, on_conn_closed);
    }
    conn_tls_drop(c);
    c->phase = PH_IDLE;
    uv_update_time(s->loop);
    uv_timer_start(&c->retry, on_retry, CONN_RETRY_MS, 0);
}

static void on_connect(uv_connect_t *req, int status)
{
    conn_t *c = req->data;
    if (status == UV_ECANCELED || !c->open)
        return;
    if (status < 0) {
        /* The peer listens before it publishes its address, so a refusal is transient
         * (a backlog overflow, a restarting host). */
        outgoing_retry(c, "to connect", status);
        return;
    }
    uv_tcp_nodelay(&c->h, 1);
    c->phase = PH_HELLO_V1;
    if (c->s->tp->tls_ctx) { /* the handshake first; the hello once it is done */
        if (!(c->tls = tcp_tlsio_new(c->s->tp->tls_ctx, 0))) {
            setup_fail(c->s, TUTTI_ERR_NOMEM, -1, "tcp: out of memory for a TLS session");
            return;
        }
        if (tls_handshake(c) < 0)
            return;
    } else {
        outgoing_hello(c);
        if (!c->open)
            return;
    }
    uv_read_start((uv_stream_t *)&c->h, on_alloc, on_read);
}

/* Outgoing: this rank's hello, once connected (with TLS, once the handshake is done). */
static void outgoing_hello(conn_t *c)
{
    size_t n = put_hello(c, c->wbuf[0]);
    c->hello_sent = 1;
    int st = conn_write(c, 0, n);
    if (st < 0)
        outgoing_retry(c, "sending the hello", st);
}

static void conn_start(conn_t *c)
{
    setup_t *s = c->s;
    memset(&c->ph, 0, sizeof(c->ph));
    memset(&c->pv, 0, sizeof(c->pv));
    c->got = 0;
    c->verdicts = 0;
    c->hello_sent = 0;
    c->phase = PH_IDLE;
    if (s->tp->auth && random_bytes(c->challenge, sizeof(c->challenge)) < 0) {
        setup_fail(s, TUTTI_ERR_IO, -1, "tcp: no random bytes for a challenge: %s",
                   strerror(errno));
        return;
    }
    uv_os_fd_t fd;
    if (uv_tcp_init_ex(s->loop, &c->h, c->addr.ss_family) < 0)
        uv_tcp_init(s->loop, &c->h); /* the socket comes with connect() */
    else if (uv_fileno((uv_handle_t *)&c->h, &fd) == 0)
        socket_cc_initial(s->tp, fd, "a connecting socket");
    c->h.data = c;
    c->open = 1;
    c->creq.data = c;
    int st = uv_tcp_connect(&c->creq, &c->h, (struct sockaddr *)&c->addr, on_connect);
    if (st < 0)
        outgoing_retry(c, "to connect", st);
}

/* At most this many connections wait in set-up at once; beyond, the oldest goes (a
 * genuine peer that loses its place connects again). */
static int incoming_cap(const tcp_tp_t *tp)
{
    return 2 * tp->nranks + 64;
}

static void on_incoming(uv_stream_t *server, int status)
{
    setup_t *s = server->data;
    tcp_tp_t *tp = s->tp;
    if (status < 0) {
        LOGF(TUTTI_LOG_WARN, "tcp: accept failed: %s", uv_strerror(status));
        return;
    }
    if (s->nincoming >= incoming_cap(tp)) {
        conn_t *old = NULL;
        for (conn_t *c = s->incoming; c; c = c->next)
            if (c->open &&
                !(c->peer >= 0 && c->peer < tp->nranks && s->claimed[c->peer] && c->verdicts))
                old = c; /* the last such in the list is the oldest */
        if (old) {
            LOGF(TUTTI_LOG_WARN,
                 "tcp: rank %d has %d connections in set-up; dropping the "
                 "oldest, from %s",
                 tp->rank, s->nincoming, old->who);
            conn_close(old);
        }
    }
    conn_t *c = calloc(1, sizeof(*c));
    if (!c) {
        setup_fail(s, TUTTI_ERR_NOMEM, -1, "tcp: out of memory accepting a connection");
        return;
    }
    c->s = s;
    c->peer = -1;
    /* lazy: the listener lives as long as the communicator, with no set-up deadline; an
     * incoming hello gets the communicator's timeout (a silent stray would keep the
     * loop running at every sweep, and its descriptor, for good) */
    c->deadline_ns = tp_now_ns() + (uint64_t)TT_KIT_MAX(tp->host->timeout_ms, 0) * 1000000u;
    c->next = s->incoming;
    if (s->incoming)
        s->incoming->prev = c;
    s->incoming = c;
    s->nincoming++;
    uv_tcp_init(s->loop, &c->h);
    c->h.data = c;
    c->open = 1;
    snprintf(c->who, sizeof(c->who), "?");
    if (uv_accept(server, (uv_stream_t *)&c->h) < 0) {
        conn_close(c);
        return;
    }
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    if (uv_tcp_getpeername(&c->h, (struct sockaddr *)&ss, &len) == 0)
        fmt_addr((struct sockaddr *)&ss, c->who, sizeof(c->who));
    uv_tcp_nodelay(&c->h, 1);
    c->phase = PH_HELLO_V1;
    if (tp->tls_ctx) { /* the handshake first: the session asks for the client's hello */
        if (!(c->tls = tcp_tlsio_new(tp->tls_ctx, 1))) {
            LOGF(TUTTI_LOG_WARN, "tcp: out of memory for a TLS session with %s", c->who);
            conn_close(c);
            return;
        }
        if (tls_handshake(c) < 0)
            return;
    }
    uv_read_start((uv_stream_t *)&c->h, on_alloc, on_read);
}

/* The eager set-up gives up (status: TUTTI_ERR_TIMEOUT at the deadline, or the status of
 * another rank's failed set-up), naming who is missing and the likeliest cause found. */
static void setup_give_up(setup_t *s, int status, const char *when)
{
    tcp_tp_t *tp = s->tp;
    char missing[256] = "", notes[1024] = "";
    int first = -1;
    const int given = status;
    size_t nn = 0;
    for (int i = 0; i < tp->nranks; i++) {
        if (!tutti_tp_host_serves(tp->host, i) || tp->links[i].fd >= 0)
            continue;
        size_t n = strlen(missing);
        if (n < sizeof(missing) - 16)
            snprintf(missing + n, sizeof(missing) - n, "%s%d", n ? ", " : "", i);
        if (first < 0)
            first = i;
        if (s->notes[i].msg[0] && nn < sizeof(notes)) {
            if (s->notes[i].status < 0 && status == given) {
                status = s->notes[i].status; /* the likely cause, rather than the clock */
                first = i;
            }
            nn += (size_t)snprintf(notes + nn, sizeof(notes) - nn, "; %s", s->notes[i].msg);
        } else if (s->calling && i < tp->rank && s->calling[i].open && !s->calling[i].hello_sent &&
                   nn < sizeof(notes)) {
            /* a connect still in flight: its SYNs got no answer at all (no refusal,
             * which would have left a note) */
            nn += (size_t)snprintf(notes + nn, sizeof(notes) - nn,
                                   "; the connect to rank %d at %s got no answer (a firewall, "
                                   "or the hosts cut off from each other?)",
                                   i, s->calling[i].who);
        }
    }
    /* a missing rank that connects lazily never calls at set-up (the first few asked) */
    for (int i = 0, asked = 0; i < tp->nranks && asked < 8 && nn < sizeof(notes); i++) {
        if (!tutti_tp_host_serves(tp->host, i) || tp->links[i].fd >= 0 || i == tp->rank)
            continue;
        char key[64];
        void *v = NULL;
        size_t vlen = 0;
        snprintf(key, sizeof(key), "tcp/%d/lazy", i);
        asked++;
        if (tp->host->store_get(tp->host->ctx, key, &v, &vlen, 1) == 0) {
            tp->host->free_value(v);
            status = TUTTI_ERR_CONFIG;
            first = i;
            nn += (size_t)snprintf(notes + nn, sizeof(notes) - nn,
                                   "; rank %d connects lazily and rank %d eagerly: set "
                                   "TUTTI_TCP_CONNECT alike on every rank",
                                   i, tp->rank);
            break;
        }
    }
    setup_fail(s, status, first,
               "tcp: rank %d connected to %d of %d peers %s; still missing rank(s) %s%s", tp->rank,
               s->done, s->needed, when, missing, notes);
}

static void on_deadline(uv_timer_t *t)
{
    setup_t *s = t->data;
    char when[64];
    snprintf(when, sizeof(when), "within %d ms", s->tp->host->timeout_ms);
    setup_give_up(s, TUTTI_ERR_TIMEOUT, when);
}

/* What is left of the set-up's time, in ms (at least 1: a store read of 0 ms is not
 * "no wait" everywhere). */
static int setup_ms_left(const setup_t *s)
{
    uint64_t now = tp_now_ns();
    if (now >= s->deadline_ns)
        return 1;
    uint64_t ms = (s->deadline_ns - now + 999999u) / 1000000u;
    return ms > (uint64_t)INT_MAX ? INT_MAX : (int)ms;
}

/* The address rank peer published (and its pid, where it runs beside this rank); why
 * (whylen bytes) says what failed. */
static int peer_addr_from_store(setup_t *s, int peer, struct sockaddr_storage *out, int wait_ms,
                                char *why, size_t whylen)
{
    tcp_tp_t *tp = s->tp;
    char key[64];
    snprintf(key, sizeof(key), "tcp/%d", peer);
    void *val = NULL;
    size_t len = 0;
    int st = tp->host->store_get(tp->host->ctx, key, &val, &len, wait_ms);
    if (st < 0) {
        snprintf(why, whylen, "tcp: rank %d never published its address (store key %s, status %d)",
                 peer, key, st);
        return st;
    }
    char ip[INET6_ADDRSTRLEN + 1] = "", text[TCP_ADDR_VALUE_MAX];
    int port = 0, tls = 0;
    int ok = len < sizeof(text);
    if (ok) {
        memcpy(text, val, len); /* the value need not end in a NUL */
        text[len] = '\0';
        ok = sscanf(text, "%46s %d", ip, &port) == 2 && port > 0 && port < 65536;
        /* its pid, when it runs on this host in this pid namespace (tcp_shares) */
        long pid = 0;
        unsigned long long ns = 0;
        int off = 0;
        const char *me = tp->host->host_id;
        /* (a bare "ip port", as a test's proxy publishes, is a rank without TLS) */
        if (ok && sscanf(text, "%*s %*d %ld %llu %d %n", &pid, &ns, &tls, &off) == 3 && off > 0 &&
            me && *me && !strcmp(text + off, me) && ns && ns == s->pidns)
            tp->links[peer].pid = pid;
    }
    tp->host->free_value(val);
    if (len < sizeof(text) && !strncmp(text, "! ", 2)) {
        snprintf(why, whylen, "tcp: rank %d could not set up: %s", peer, text + 2);
        return TUTTI_ERR_PEER;
    }
    if (ok && tls != (tp->tls_ctx != NULL)) {
        int on = tls ? peer : tp->rank, off = tls ? tp->rank : peer;
        snprintf(why, whylen,
                 "tcp: rank %d runs its links with TLS and rank %d without (set TUTTI_TLS_CERT, "
                 "TUTTI_TLS_KEY and TUTTI_TLS_CA_FILE on every rank, or on none)",
                 on, off);
        return TUTTI_ERR_CONFIG;
    }
    memset(out, 0, sizeof(*out));
    if (ok && strchr(ip, ':'))
        ok = uv_ip6_addr(ip, port, (struct sockaddr_in6 *)out) == 0;
    else if (ok)
        ok = uv_ip4_addr(ip, port, (struct sockaddr_in *)out) == 0;
    if (!ok) {
        snprintf(why, whylen, "tcp: rank %d published a bad address under %s", peer, key);
        return TUTTI_ERR_PROTOCOL;
    }
    return TUTTI_OK;
}

/* Bind the listener to the chosen address (the kernel picks the port) and listen. */
static int setup_listen(setup_t *s, struct sockaddr_storage *me, const char *ifname)
{
    tcp_tp_t *tp = s->tp;
    char mine[96];
    int rc = uv_tcp_bind(&s->listener, (struct sockaddr *)me, 0);
    uv_os_fd_t fd;
    if (rc == 0 && uv_fileno((uv_handle_t *)&s->listener, &fd) == 0) {
        socket_cc(fd, tp->cc_system, sizeof(tp->cc_system)); /* before ours goes on it */
        socket_cc_initial(tp, fd, "the listener");
    }
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, tp->nranks + 64, on_incoming);
    int len = sizeof(*me);
    if (rc == 0)
        rc = uv_tcp_getsockname(&s->listener, (struct sockaddr *)me, &len);
    fmt_addr((struct sockaddr *)me, mine, sizeof(mine));
    if (rc < 0)
        return tp->host->error(tp->host->ctx, TUTTI_ERR_IO, -1, -rc,
                               "tcp: cannot listen on %s (%s): %s", mine, ifname, uv_strerror(rc));
    LOGF(TUTTI_LOG_INFO, "tcp: rank %d listens on %s (interface %s)", tp->rank, mine, ifname);
    return TUTTI_OK;
}

/* Publish "ip port ..." of the listener under tcp/<rank>, for the higher ranks to connect. */
static int publish_address(const setup_t *s, const struct sockaddr_storage *me)
{
    tcp_tp_t *tp = s->tp;
    const tutti_tp_host_v1_t *host = tp->host;
    char ip[INET6_ADDRSTRLEN], val[TCP_ADDR_VALUE_MAX];
    if (me->ss_family == AF_INET6)
        uv_ip6_name((const struct sockaddr_in6 *)me, ip, sizeof(ip));
    else
        uv_ip4_name((const struct sockaddr_in *)me, ip, sizeof(ip));
    /* the address, then what tells a rank on the same host where this one runs (a pid
     * is only meaningful in its own pid namespace), whether its links run TLS, and its
     * host: "ip port pid pidns tls host" */
    snprintf(val, sizeof(val), "%s %d %ld %llu %d %s", ip,
             ntohs(me->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)me)->sin6_port
                                             : ((const struct sockaddr_in *)me)->sin_port),
             (long)getpid(), s->pidns, tp->tls_ctx != NULL, host->host_id ? host->host_id : "");
    char key[64];
    snprintf(key, sizeof(key), "tcp/%d", tp->rank);
    int st = host->store_set(host->ctx, key, val, strlen(val) + 1);
    if (st < 0)
        host->error(host->ctx, st, -1, 0,
                    "tcp: cannot publish this rank's address (store status %d)", st);
    return st;
}

/* Outgoing connections to every lower rank, all at once; *out_p the array of them
 * (NULL when it could not be allocated), for setup_close. */
static int connect_lower(setup_t *s, conn_t **out_p)
{
    tcp_tp_t *tp = s->tp;
    conn_t *out = *out_p = calloc((size_t)tp->nranks, sizeof(conn_t));
    if (!out)
        return TUTTI_ERR_NOMEM;
    s->calling = out;
    for (int j = 0; j < tp->rank; j++) {
        if (!tutti_tp_host_serves(tp->host, j))
            continue;
        conn_t *c = &out[j];
        c->s = s;
        c->peer = j;
        c->outgoing = 1;
        char why[TCP_ADDR_VALUE_MAX + 128];
        /* one deadline for every lower rank's address, not a whole timeout each */
        int st = peer_addr_from_store(s, j, &c->addr, setup_ms_left(s), why, sizeof(why));
        if (st < 0)
            return tp->host->error(tp->host->ctx, st, j, 0, "%s", why);
        fmt_addr((struct sockaddr *)&c->addr, c->who, sizeof(c->who));
        uv_timer_init(s->loop, &c->retry);
        c->retry.data = c;
        c->retry_open = 1;
        conn_start(c);
    }
    return TUTTI_OK;
}

/* Every 200 ms of an eager set-up's wait: a peer that failed its own set-up will not
 * connect (host ABI 1.5), so this one ends now, not at the deadline. */
static void on_watch(uv_timer_t *t)
{
    setup_t *s = t->data;
    const tutti_tp_host_v1_t *h = s->tp->host;
    int st = h->setup_check(h->ctx);
    if (st < 0) /* what this rank can tell of the missing ones may be the better cause */
        setup_give_up(s, st, "when another rank failed its set-up");
}

/* Run the loop until every link is up, something failed, or the deadline passed. */
static int setup_wait(setup_t *s)
{
    tcp_tp_t *tp = s->tp;
    if (s->needed > 0 && tutti_tp_host_has(tp->host, setup_check) && tp->host->setup_check)
        uv_timer_start(&s->watch, on_watch, 200, 200);
    if (s->needed > 0) {
        /* what is left of the one deadline, on a fresh clock: the loop's goes stale
         * while connect_lower waits on the store, and a timer armed from it would fire
         * early */
        uv_update_time(s->loop);
        uv_timer_start(&s->deadline, on_deadline, (uint64_t)setup_ms_left(s), 0);
        while (s->done < s->needed && s->status == 0)
            uv_run(s->loop, UV_RUN_ONCE);
    }
    if (s->status < 0)
        return tp->host->error(tp->host->ctx, s->status, s->err_peer, 0, "%s", s->err);
    LOGF(TUTTI_LOG_INFO, "tcp: rank %d connected to %d peers", tp->rank, s->needed);
    return TUTTI_OK;
}

/* Close every connection still in setup and the loop, and free what setup held. */
static void setup_close(setup_t *s, conn_t *out)
{
    for (int j = 0; out && j < s->tp->rank; j++)
        conn_close(&out[j]);
    for (conn_t *c = s->incoming; c; c = c->next)
        conn_close(c);
    uv_close((uv_handle_t *)&s->listener, on_handle_closed);
    uv_close((uv_handle_t *)&s->deadline, on_handle_closed);
    uv_close((uv_handle_t *)&s->watch, on_handle_closed);
    /* One loop turn runs every close callback (and cancels pending connects and
     * writes) requested above, before the memory behind the handles goes. */
    uv_run(s->loop, UV_RUN_NOWAIT);
    if (uv_loop_close(s->loop) != 0) {
        uv_run(s->loop, UV_RUN_DEFAULT);
        uv_loop_close(s->loop);
    }
    while (s->incoming) { /* freed by their close callbacks; this is only a safety net */
        conn_t *c = s->incoming;
        s->incoming = c->next;
        free(c);
    }
    free(out);
    free(s->claimed);
    free(s->notes);
}

/* TUTTI_TCP_CONGESTION: auto (unset), system, or an algorithm's name. */
static int congestion_knob(tcp_tp_t *tp)
{
    const tutti_tp_host_v1_t *host = tp->host;
    const char *cc = host->config(host->ctx, "TCP_CONGESTION");
    tp->cc_mode = TCP_CC_AUTO;
    tp->cc_name[0] = '\0';
    if (!cc || !*cc || !strcmp(cc, "auto"))
        return TUTTI_OK;
    if (!strcmp(cc, "system")) {
        tp->cc_mode = TCP_CC_SYSTEM;
        return TUTTI_OK;
    }
    size_t n = strlen(cc);
    int ok = n < sizeof(tp->cc_name);
    for (size_t i = 0; ok && i < n; i++)
        ok = (cc[i] >= 'a' && cc[i] <= 'z') || (cc[i] >= '0' && cc[i] <= '9') || cc[i] == '_';
    if (!ok)
        return host->error(host->ctx, TUTTI_ERR_CONFIG, -1, 0,
                           "tcp: TUTTI_TCP_CONGESTION=\"%.64s\" is neither auto, system nor the "
                           "name of a congestion control (at most %zu of a-z, 0-9, _)",
                           cc, sizeof(tp->cc_name) - 1);
    tp->cc_mode = TCP_CC_NAMED;
    memcpy(tp->cc_name, cc, n + 1);
    return TUTTI_OK;
}

/* TUTTI_TCP_CONNECT: eager (unset) or lazy; *lazy_p. */
static int connect_knob(const tutti_tp_host_v1_t *host, int *lazy_p)
{
    const char *v = host->config(host->ctx, "TCP_CONNECT");
    *lazy_p = v && !strcmp(v, "lazy");
    if (!v || !*v || *lazy_p || !strcmp(v, "eager"))
        return TUTTI_OK;
    return host->error(host->ctx, TUTTI_ERR_CONFIG, -1, 0,
                       "tcp: TUTTI_TCP_CONNECT=\"%.64s\" is neither eager nor lazy", v);
}

/* Lazily: what stays after tcp_setup_connect, on the data path's loop. */
static int setup_lazy(tcp_tp_t *tp, const setup_t *proto, const struct sockaddr_storage *me_in,
                      const char *ifname, int *published)
{
    const tutti_tp_host_v1_t *host = tp->host;
    struct sockaddr_storage me = *me_in;
    setup_t *s = tp->setup = malloc(sizeof(*s));
    if (s) {
        *s = *proto;
        s->claimed = calloc((size_t)tp->nranks, 1);
        s->notes = calloc((size_t)tp->nranks, sizeof(*s->notes));
        s->crossed = calloc((size_t)tp->nranks, 1);
        s->out = calloc((size_t)tp->nranks, sizeof(conn_t));
    }
    if (!s || !s->claimed || !s->notes || !s->crossed || !s->out) {
        tcp_setup_free_lazy(tp);
        return host->error(host->ctx, TUTTI_ERR_NOMEM, -1, 0, "tcp: out of memory");
    }
    s->lazy = 1;
    s->loop = &tp->loop;
    for (int j = 0; j < tp->nranks; j++) {
        s->out[j].s = s;
        s->out[j].peer = j;
        s->out[j].outgoing = 1;
    }
    uv_tcp_init(s->loop, &s->listener);
    s->listener.data = s;
    char key[64];
    snprintf(key, sizeof(key), "tcp/%d/lazy", tp->rank); /* for an eager rank's deadline */
    int st = setup_listen(s, &me, ifname);
    if (st >= 0 && (st = host->store_set(host->ctx, key, "1", 2)) < 0)
        host->error(host->ctx, st, -1, 0, "tcp: cannot publish this rank's mode (store status %d)",
                    st);
    if (st >= 0 && (st = publish_address(s, &me)) >= 0)
        *published = 1;
    if (st >= 0)
        LOGF(TUTTI_LOG_INFO,
             "tcp: rank %d connects each link at its first use (TUTTI_TCP_CONNECT=lazy)", tp->rank);
    return st; /* on failure, tcp_destroy closes and frees what is here */
}

int tcp_setup_connect(tcp_tp_t *tp, int *published, char *why, size_t whylen)
{
    const tutti_tp_host_v1_t *host = tp->host;
    setup_t s = { .tp = tp,
                  .deadline_ns = tp_now_ns() + (uint64_t)TT_KIT_MAX(host->timeout_ms, 0) * 1000000u,
                  .pidns = tp_pidns() };
    s.loop = &s.own_loop;
    for (int i = 0; i < tp->nranks; i++) /* possibly a subset: others use another transport */
        s.needed += tutti_tp_host_serves(host, i);
    const char *sb = host->config(host->ctx, "SOCKET_BUFFER");
    tp->sockbuf = sb ? atoi(sb) : 0;
    int st = congestion_knob(tp);
    if (st == 0)
        st = connect_knob(host, &tp->lazy);
    if (st < 0)
        return st;
    struct sockaddr_storage me;
    conn_t *out = NULL;
    char ifname[64];
    st = choose_address(tp, &me, ifname, sizeof(ifname));
    if (st < 0)
        return st;
    if (tp->lazy)
        return setup_lazy(tp, &s, &me, ifname, published);
    s.claimed = calloc((size_t)tp->nranks, 1);
    s.notes = calloc((size_t)tp->nranks, sizeof(*s.notes));
    if (!s.claimed || !s.notes) {
        free(s.claimed);
        free(s.notes);
        return host->error(host->ctx, TUTTI_ERR_NOMEM, -1, 0, "tcp: out of memory");
    }
    int rc0 = uv_loop_init(s.loop);
    if (rc0 < 0) {
        free(s.claimed);
        free(s.notes);
        snprintf(why, whylen, "tcp: uv_loop_init failed (%s)", uv_strerror(rc0));
        return host->error(host->ctx, TUTTI_ERR_INTERNAL, -1, -rc0, "%s", why);
    }
    uv_tcp_init(s.loop, &s.listener);
    s.listener.data = &s;
    uv_timer_init(s.loop, &s.deadline);
    s.deadline.data = &s;
    uv_timer_init(s.loop, &s.watch);
    s.watch.data = &s;
    if ((st = setup_listen(&s, &me, ifname)) >= 0 && (st = publish_address(&s, &me)) >= 0) {
        *published = 1;
        if ((st = connect_lower(&s, &out)) >= 0)
            st = setup_wait(&s);
    }
    setup_close(&s, out);
    return st;
}

int tcp_setup_fd_room(const tutti_tp_host_v1_t *host, char *why, size_t whylen)
{
    int needed = 0, lazy = 0;
    for (int i = 0; i < host->nranks; i++)
        needed += tutti_tp_host_serves(host, i);
    if (connect_knob(host, &lazy) < 0) {
        snprintf(why, whylen, "tcp: TUTTI_TCP_CONNECT is neither eager nor lazy");
        return TUTTI_ERR_CONFIG;
    }
    /* a socket a peer, and while set-up hands it to the data path (a dup) two; its own:
     * two loops (an epoll and an eventfd each), the listener, one open for a moment */
    const int per_peer[2] = { 1, 2 };
    if (tp_fd_room(host, "tcp", needed, per_peer, 8, why, whylen) < 0) {
        if (!lazy)
            return host->error(host->ctx, TUTTI_ERR_IO, -1, EMFILE, "%s", why);
        /* a link's socket comes at its first use: short only for a rank that talks to
         * that many peers (its link then fails naming EMFILE) */
        host->log(host->ctx, TUTTI_LOG_INFO, "%s; connecting lazily, set-up goes on", why);
        why[0] = '\0';
    }
    return TUTTI_OK;
}

void tcp_setup_refuse(const tutti_tp_host_v1_t *host, int status, const char *why)
{
    char key[64], val[TCP_ADDR_VALUE_MAX];
    snprintf(key, sizeof(key), "tcp/%d", host->rank);
    if (why && why[0])
        snprintf(val, sizeof(val), "! %s", why);
    else
        snprintf(val, sizeof(val),
                 "! tcp set-up failed before this rank listened (status %d; its log says why)",
                 status);
    host->store_set(host->ctx, key, val, strlen(val) + 1);
}

/* ---- fuzzing ---- */

int tcp_setup_fuzz_input(tcp_tp_t *tp, int outgoing, int peer, const uint8_t *data, size_t len,
                         size_t chunk)
{
    setup_t s = { .tp = tp, .needed = 1 };
    s.loop = &s.own_loop;
    int sv[2];
    s.claimed = calloc((size_t)tp->nranks, 1);
    s.notes = calloc((size_t)tp->nranks, sizeof(*s.notes));
    conn_t *c = calloc(1, sizeof(*c));
    if (!s.claimed || !s.notes || !c || uv_loop_init(s.loop) < 0) {
        free(s.claimed);
        free(s.notes);
        free(c);
        return -1;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0) {
        uv_loop_close(s.loop);
        free(s.claimed);
        free(s.notes);
        free(c);
        return -1;
    }
    c->s = &s;
    c->outgoing = outgoing;
    c->peer = outgoing ? peer : -1;
    snprintf(c->who, sizeof(c->who), "fuzz");
    uv_tcp_init(s.loop, &c->h);
    c->h.data = c;
    c->open = 1;
    uv_tcp_open(&c->h, sv[0]);
    if (outgoing) {
        /* as conn_start and a successful connect leave it: hello sent, reading */
        uv_timer_init(s.loop, &c->retry);
        c->retry.data = c;
        c->retry_open = 1;
        c->creq.data = c;
        on_connect(&c->creq, 0);
    } else {
        /* as on_incoming leaves an accepted connection */
        s.incoming = c;
        s.nincoming = 1;
        c->phase = PH_HELLO_V1;
        uv_read_start((uv_stream_t *)&c->h, on_alloc, on_read);
    }
    /* libuv's reads, by hand, of at most chunk bytes each (0: whole parts), with the
     * loop run between them for the writes; until the input is spent, the connection
     * stops reading, or the set-up ends (done or failed). */
    size_t off = 0;
    char sink[4096];
    while (off < len && s.status == 0 && s.done < s.needed) {
        while (read(sv[1], sink, sizeof(sink)) > 0)
            ;
        uv_run(s.loop, UV_RUN_NOWAIT);
        if ((!outgoing && !s.nincoming) || !c->open || c->phase == PH_IDLE)
            break; /* (an incoming one closed is freed by now) */
        uv_buf_t buf;
        on_alloc((uv_handle_t *)&c->h, 65536, &buf);
        if (!buf.base || !buf.len)
            break;
        size_t n = len - off < buf.len ? len - off : buf.len;
        if (chunk && n > chunk)
            n = chunk;
        memcpy(buf.base, data + off, n);
        off += n;
        on_read((uv_stream_t *)&c->h, (ssize_t)n, &buf);
    }
    if (outgoing || s.nincoming)
        conn_close(c); /* an incoming one is freed by its close callback */
    close(sv[1]);
    uv_run(s.loop, UV_RUN_NOWAIT);
    if (uv_loop_close(s.loop) != 0) {
        uv_run(s.loop, UV_RUN_DEFAULT);
        uv_loop_close(s.loop);
    }
    if (outgoing)
        free(c);
    for (int i = 0; i < tp->nranks; i++) { /* links conn_established took */
        if (tp->links[i].fd >= 0) {
            close(tp->links[i].fd);
            tp->links[i].fd = -1;
        }
    }
    free(s.claimed);
    free(s.notes);
    return 0;
}

/* ---- lazily: connections at a link's first use ---- */

void tcp_setup_need(tcp_tp_t *tp, int peer)
{
    setup_t *s = tp->setup;
    const tcp_link_t *L = &tp->links[peer];
    if (!s || L->fd >= 0 || L->fail.status || s->claimed[peer])
        return;
    conn_t *c = &s->out[peer];
    if (c->active || c->closing)
        return;
    uint64_t now = tp_now_ns();
    if (s->crossed[peer]) {
        /* the higher rank's call, which crossed ours, has not come */
        if (now >= c->deadline_ns)
            setup_fail(s, TUTTI_ERR_TIMEOUT, peer,
                       "tcp: rank %d called rank %d (%s) at the link's first use while rank %d "
                       "called it, and rank %d's call has not come within %d ms",
                       tp->rank, peer, c->who, peer, peer, tp->host->timeout_ms);
        return;
    }
    if (s->refused_status < 0)
        return;
    if (!c->retry_open) {
        uv_timer_init(s->loop, &c->retry);
        c->retry.data = c;
        c->retry_open = 1;
    }
    if (!c->addr_known) {
        /* It published before its init returned; a rank still in its init soon will.
         * Asked without waiting, and again every CONN_RETRY_MS (the retry timer) until
         * the call's deadline: a store wait here would hold up every other link. */
        if (!c->deadline_ns)
            c->deadline_ns = now + (uint64_t)TT_KIT_MAX(tp->host->timeout_ms, 0) * 1000000u;
        char why[TCP_ADDR_VALUE_MAX + 128];
        int st = peer_addr_from_store(s, peer, &c->addr, 1, why, sizeof(why));
        if (st == TUTTI_ERR_TIMEOUT && now < c->deadline_ns) {
            c->active = 1; /* pending: sweeps run the loop, whose timer asks again */
            uv_timer_start(&c->retry, on_retry, CONN_RETRY_MS, 0);
            return;
        }
        if (st < 0) {
            setup_fail(s, st, peer, "%s", why);
            return;
        }
        fmt_addr((struct sockaddr *)&c->addr, c->who, sizeof(c->who));
        c->addr_known = 1;
    }
    s->deadline_ns = now + (uint64_t)TT_KIT_MAX(tp->host->timeout_ms, 0) * 1000000u;
    c->deadline_ns = s->deadline_ns;
    LOGF(TUTTI_LOG_TRACE, "tcp: rank %d calls rank %d (%s) at the link's first use", tp->rank, peer,
         c->who);
    c->active = 1;
    conn_start(c);
}

int tcp_setup_answering(tcp_tp_t *tp)
{
    setup_t *s = tp->setup;
    if (!s || s->nincoming == 0)
        return 0;
    if (s->lazy) {
        uint64_t now = tp_now_ns();
        for (conn_t *c = s->incoming, *next; c; c = next) {
            next = c->next;
            if (c->open && c->deadline_ns && now > c->deadline_ns) {
                LOGF(TUTTI_LOG_WARN,
                     "tcp: rank %d dropped a connection from %s: no hello within %d ms", tp->rank,
                     c->who, tp->host->timeout_ms);
                conn_close(c);
            }
        }
    }
    return s->nincoming > 0;
}

void tcp_setup_failed(tcp_tp_t *tp, int status, const char *msg)
{
    setup_t *s = tp->setup;
    if (!s || s->refused_status < 0)
        return;
    s->refused_status = status < 0 ? status : TUTTI_ERR_PEER;
    printable(s->refused_msg, sizeof(s->refused_msg), msg, strlen(msg));
}

void tcp_setup_close_lazy(tcp_tp_t *tp)
{
    setup_t *s = tp->setup;
    if (!s)
        return;
    for (int j = 0; j < tp->nranks; j++) {
        conn_t *c = &s->out[j];
        if (c->open) {
            c->open = 0;
            uv_close((uv_handle_t *)&c->h, on_conn_closed);
        }
        if (c->retry_open) {
            uv_close((uv_handle_t *)&c->retry, on_handle_closed);
            c->retry_open = 0;
        }
    }
    for (conn_t *c = s->incoming; c; c = c->next)
        conn_close(c);
    uv_close((uv_handle_t *)&s->listener, on_handle_closed);
}

static void fork_close_handle(uv_tcp_t *h)
{
    uv_os_fd_t fd;
    if (uv_fileno((const uv_handle_t *)h, &fd) == 0 && fd >= 0)
        close(fd);
}

void tcp_setup_fork_child(tcp_tp_t *tp)
{
    setup_t *s = tp->setup;
    if (!s)
        return;
    /* the listener: else a peer's call to this rank after the parent died is taken into
     * its backlog and waits out its deadline for a hello */
    fork_close_handle(&s->listener);
    for (int j = 0; s->out && j < tp->nranks; j++)
        if (s->out[j].open)
            fork_close_handle(&s->out[j].h);
    for (conn_t *c = s->incoming; c; c = c->next)
        if (c->open)
            fork_close_handle(&c->h);
}

void tcp_setup_free_lazy(tcp_tp_t *tp)
{
    setup_t *s = tp->setup;
    if (!s)
        return;
    while (s->incoming) { /* freed by their close callbacks; this is only a safety net */
        conn_t *c = s->incoming;
        s->incoming = c->next;
        free(c);
    }
    free(s->out);
    free(s->crossed);
    free(s->claimed);
    free(s->notes);
    free(s);
    tp->setup = NULL;
}
