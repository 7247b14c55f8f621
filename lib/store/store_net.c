/* Blocking socket steps shared by the store clients (store_net.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "base/bounded.h"
#include "store/store_net.h"

void tt_net_sleep_until(uint64_t ns, uint64_t deadline)
{
    uint64_t now = tt_now_ns();
    if (deadline != UINT64_MAX)
        ns = deadline <= now ? 0 : TT_MIN(ns, deadline - now);
    struct timespec ts = { (time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull) };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Wait for events on fd until the deadline: 1 ready, 0 deadline passed, -errno. */
int tt_net_poll(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd p = { .fd = fd, .events = events };
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

/* After a send or receive failed with errno: 0 to try again (interrupted, or fd became
 * ready for events), else -errno, or -ETIMEDOUT at the deadline. */
int tt_net_io_retry(int fd, short events, uint64_t deadline)
{
    if (errno == EINTR)
        return 0;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
        return -errno;
    int r = tt_net_poll(fd, events, deadline);
    if (r < 0)
        return r;
    return r == 0 ? -ETIMEDOUT : 0;
}

void tt_net_sockaddr_str(const struct sockaddr *sa, char *buf, size_t len)
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
int tt_net_connect_addr(const struct addrinfo *ai, uint64_t deadline)
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
        int r = tt_net_poll(fd, POLLOUT, deadline);
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

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

/* Send the iovecs whole, or fail: 0, or -errno (-ETIMEDOUT at the deadline). The iovecs
 * are consumed. At most IOV_MAX go to one sendmsg (more fail with EMSGSIZE: a check of
 * 512 keys is 1025 of them); a partial send leaves the rest for the next. */
int tt_net_send_iov(int fd, struct iovec *iov, int iovcnt, uint64_t deadline)
{
    while (iovcnt > 0) {
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)TT_MIN(iovcnt, IOV_MAX) };
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            int r = tt_net_io_retry(fd, POLLOUT, deadline);
            if (r < 0)
                return r;
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

/* Receive exactly len bytes: 0, -errno, -ETIMEDOUT, or -EPIPE when the server closed.
 * *got_p (may be NULL) counts the bytes that did arrive. */
int tt_net_recv_all(int fd, void *buf, size_t len, uint64_t deadline, size_t *got_p)
{
    char *p = buf;
    while (len > 0) {
        ssize_t r = recv(fd, p, len, 0);
        if (r > 0) {
            p += r;
            len -= (size_t)r;
            if (got_p)
                *got_p += (size_t)r;
            continue;
        }
        if (r == 0)
            return -EPIPE;
        int pr = tt_net_io_retry(fd, POLLIN, deadline);
        if (pr < 0)
            return pr;
    }
    return 0;
}

/* ---- name resolution bounded by a deadline ---- */

/* One lookup, run bounded by the caller's deadline (base/bounded.h). */
typedef struct net_gai {
    tt_bounded_t job;
    int rc, err;
    struct addrinfo *res; /* the helper's result, until the caller takes it */
    char port[16];
    char host[]; /* NUL-terminated */
} net_gai_t;

static void gai_release(tt_bounded_t *job)
{
    net_gai_t *g = (net_gai_t *)job;
    if (g->res)
        freeaddrinfo(g->res);
    free(g);
}

static void gai_run(tt_bounded_t *job)
{
    net_gai_t *g = (net_gai_t *)job;
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
    struct addrinfo *res = NULL;
    g->rc = getaddrinfo(g->host, g->port, &hints, &res);
    g->err = errno;
    g->res = g->rc == 0 ? res : NULL;
}

static int gai_result(const char *host, int rc, int err, char *cause, size_t causelen)
{
    if (rc == 0)
        return 0;
    snprintf(cause, causelen, "cannot resolve %s: %s", host,
             rc == EAI_SYSTEM ? strerror(err) : gai_strerror(rc));
    return rc == EAI_MEMORY ? -ENOMEM : -ENOENT;
}

int tt_net_resolve(const char *host, int port, uint64_t deadline, struct addrinfo **res_p,
                   char *cause, size_t causelen)
{
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    *res_p = NULL;
    /* an address as it is needs no name service */
    struct addrinfo numeric = { .ai_flags = AI_NUMERICHOST,
                                .ai_family = AF_UNSPEC,
                                .ai_socktype = SOCK_STREAM };
    if (getaddrinfo(host, portstr, &numeric, res_p) == 0)
        return 0;
    *res_p = NULL;
    if (deadline == UINT64_MAX) {
        struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
        int rc = getaddrinfo(host, portstr, &hints, res_p);
        return gai_result(host, rc, errno, cause, causelen);
    }
    size_t hl = strlen(host);
    net_gai_t *g = calloc(1, sizeof(*g) + hl + 1);
    if (!g) {
        snprintf(cause, causelen, "cannot resolve %s: out of memory", host);
        return -ENOMEM;
    }
    memcpy(g->host, host, hl + 1);
    memcpy(g->port, portstr, sizeof(portstr));
    int done = tt_bounded_run(&g->job, gai_run, gai_release, deadline);
    if (done < 0) {
        snprintf(cause, causelen, "cannot resolve %s: no thread for the lookup: %s", host,
                 strerror(-done));
        tt_bounded_put(&g->job);
        return done;
    }
    int rc = 0, err = 0;
    if (done) {
        rc = g->rc;
        err = g->err;
        *res_p = g->res;
        g->res = NULL;
    }
    tt_bounded_put(&g->job);
    if (!done) {
        snprintf(cause, causelen,
                 "cannot resolve %s: no answer from the name service before the deadline "
                 "(resolv.conf's servers)",
                 host);
        return -ETIMEDOUT;
    }
    return gai_result(host, rc, err, cause, causelen);
}

/* ---- connecting to a store server ---- */

/* The addresses as resolved once, shared by the connects under way (refs, under the
 * dialer's lock: the cache's own and one per connect using them). */
struct tt_net_addrs {
    int refs;
    struct addrinfo *ai;
    uint64_t at; /* when resolved (tt_now_ns) */
    int served;  /* a connection made through them worked (under the lock) */
};

#define NET_RESOLVE_AGAIN_NS 1000000000ull

void tt_net_dialer_init(tt_net_dialer_t *d, const char *host, int port)
{
    pthread_mutex_init(&d->lock, NULL);
    d->host = host;
    d->port = port;
    d->addrs = NULL;
}

static void addrs_put(tt_net_dialer_t *d, tt_net_addrs_t *a)
{
    pthread_mutex_lock(&d->lock);
    int last = --a->refs == 0;
    pthread_mutex_unlock(&d->lock);
    if (last) {
        freeaddrinfo(a->ai);
        free(a);
    }
}

void tt_net_dialer_fini(tt_net_dialer_t *d)
{
    if (d->addrs)
        addrs_put(d, d->addrs);
    d->addrs = NULL;
    pthread_mutex_destroy(&d->lock);
}

/* The cached addresses, or the host resolved now (within the deadline): 0 with *a_p
 * (addrs_put it), or -errno with cause. */
static int addrs_get(tt_net_dialer_t *d, uint64_t deadline, tt_net_addrs_t **a_p, char *cause,
                     size_t causelen)
{
    pthread_mutex_lock(&d->lock);
    tt_net_addrs_t *a = d->addrs;
    if (a)
        a->refs++;
    pthread_mutex_unlock(&d->lock);
    if (a) {
        *a_p = a;
        return 0;
    }
    struct addrinfo *ai;
    int e = tt_net_resolve(d->host, d->port, deadline, &ai, cause, causelen);
    if (e < 0)
        return e;
    a = malloc(sizeof(*a));
    if (!a) {
        freeaddrinfo(ai);
        snprintf(cause, causelen, "out of memory");
        return -ENOMEM;
    }
    a->refs = 2;
    a->ai = ai;
    a->at = tt_now_ns();
    a->served = 0;
    pthread_mutex_lock(&d->lock);
    tt_net_addrs_t *other = d->addrs;
    if (other) /* another thread's came first: that one */
        other->refs++;
    else
        d->addrs = a;
    pthread_mutex_unlock(&d->lock);
    if (other) {
        freeaddrinfo(ai);
        free(a);
        a = other;
    }
    *a_p = a;
    return 0;
}

/* After a connect failed on every address of a: the next one resolves the name again,
 * where tt_net_dial's rule says so. */
static void addrs_forget(tt_net_dialer_t *d, tt_net_addrs_t *a)
{
    pthread_mutex_lock(&d->lock);
    int cached = d->addrs == a && (a->served || tt_now_ns() - a->at >= NET_RESOLVE_AGAIN_NS);
    if (cached)
        d->addrs = NULL;
    pthread_mutex_unlock(&d->lock);
    if (cached)
        addrs_put(d, a);
}

int tt_net_dial(tt_net_dialer_t *d, uint64_t deadline, const tt_net_hello_t *h, tt_store_err_t *err)
{
    char cause[400] = "";
    uint64_t start = tt_now_ns(), backoff = 10000000ull;
    int resolve_timeout = 0;
    for (;;) {
        tt_net_addrs_t *a = NULL;
        char rcause[300];
        int e = addrs_get(d, deadline, &a, rcause, sizeof(rcause));
        if (e == -ENOMEM) {
            tt_store_err_set(err, "%s", rcause);
            return TUTTI_ERR_NOMEM;
        }
        if (e == -ETIMEDOUT) { /* (after earlier tries, what they met says more) */
            resolve_timeout = !cause[0];
            if (!cause[0])
                snprintf(cause, sizeof(cause), "%s", rcause);
            break;
        }
        if (e < 0)
            snprintf(cause, sizeof(cause), "%s", rcause);
        int tried = 0, refused = 0;
        for (const struct addrinfo *ai = a ? a->ai : NULL; ai; ai = ai->ai_next, tried++) {
            char where[80];
            tt_net_sockaddr_str(ai->ai_addr, where, sizeof(where));
            int fd = tt_net_connect_addr(ai, deadline);
            if (fd < 0) {
                refused += fd == -ECONNREFUSED;
                /* an attempt cut short by the deadline says less than the one before */
                if (fd != -ETIMEDOUT || !cause[0])
                    snprintf(cause, sizeof(cause), "connect to %s: %s", where, strerror(-fd));
                continue;
            }
            int r = h->hello(h->ctx, fd, deadline, cause, sizeof(cause), err);
            if (r == TT_NET_HELLO_OK) {
                pthread_mutex_lock(&d->lock);
                a->served = 1;
                pthread_mutex_unlock(&d->lock);
                addrs_put(d, a);
                return TUTTI_OK;
            }
            if (r < 0) {
                addrs_put(d, a);
                return r;
            }
        }
        if (tried && refused == tried && h->gone_if_refused && h->gone_if_refused(h->ctx)) {
            addrs_put(d, a);
            tt_store_err_set(err, "%s: the store server is gone (it answered before)", cause);
            return TUTTI_ERR_STORE;
        }
        if (a) {
            addrs_forget(d, a);
            addrs_put(d, a);
        }
        if (tt_now_ns() >= deadline)
            break;
        tt_net_sleep_until(backoff, deadline);
        backoff = TT_MIN(backoff * 2, 500000000ull);
    }
    tt_store_err_set(err, "%s (%s for %" PRIu64 " ms)", cause[0] ? cause : "no address",
                     resolve_timeout ? "waited" : "retried", (tt_now_ns() - start) / 1000000u);
    return TUTTI_ERR_TIMEOUT;
}
