/* Blocking socket steps of the store clients (store_tcp.c, store_redis.c), each bounded
 * by an absolute deadline (tt_now_ns() scale, UINT64_MAX: none). */
#ifndef TT_STORE_NET_H
#define TT_STORE_NET_H

#include <netdb.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "store/store_impl.h"

/* Sleep ns, but not past the deadline. */
void tt_net_sleep_until(uint64_t ns, uint64_t deadline);
/* Wait for events on fd until the deadline: 1 ready, 0 deadline passed, -errno. */
int tt_net_poll(int fd, short events, uint64_t deadline);
/* After a send or receive failed with errno: 0 to try again (interrupted, or fd became
 * ready for events), else -errno, or -ETIMEDOUT at the deadline. */
int tt_net_io_retry(int fd, short events, uint64_t deadline);
/* "ip:port" or "[ip6]:port" into buf. */
void tt_net_sockaddr_str(const struct sockaddr *sa, char *buf, size_t len);
/* One connect attempt to one address (non-blocking fd, TCP_NODELAY): fd, or -errno. */
int tt_net_connect_addr(const struct addrinfo *ai, uint64_t deadline);
/* getaddrinfo(host, port) for TCP, bounded by the deadline: it runs in a detached helper
 * thread of its own state (a resolver that outlives the deadline finishes there and
 * frees what it made), the caller waiting for it no longer than the deadline (getaddrinfo
 * itself follows resolv.conf's timeouts, 5 s a try by default). 0 with *res_p (for
 * freeaddrinfo); -ETIMEDOUT at the deadline, or another -errno (-ENOENT: the name does not
 * resolve), with cause naming the host. With no deadline it is a plain call. */
int tt_net_resolve(const char *host, int port, uint64_t deadline, struct addrinfo **res_p,
                   char *cause, size_t causelen);
/* ---- connecting to a store server, retried until the deadline ---- */

/* A server's name, and its addresses as last resolved (shared by the connects under way:
 * a reconnect waits on no name service), for one store handle. */
typedef struct tt_net_addrs tt_net_addrs_t;
typedef struct tt_net_dialer {
    pthread_mutex_t lock;
    const char *host; /* the handle's, outliving the dialer */
    int port;
    tt_net_addrs_t *addrs; /* NULL until resolved, or once forgotten */
} tt_net_dialer_t;

void tt_net_dialer_init(tt_net_dialer_t *d, const char *host, int port);
void tt_net_dialer_fini(tt_net_dialer_t *d);

enum { TT_NET_HELLO_OK = 0, TT_NET_HELLO_RETRY = 1 };

/* What a store says on a new connection. */
typedef struct tt_net_hello {
    /* fd (connected, non-blocking) is the callee's: kept in ctx on TT_NET_HELLO_OK,
     * closed otherwise. TT_NET_HELLO_RETRY with the reason in cause (the next address,
     * then another round), or a negative status with the reason in err (returned at
     * once: the server answered, and another try would meet the same). */
    int (*hello)(void *ctx, int fd, uint64_t deadline, char *cause, size_t causelen,
                 tt_store_err_t *err);
    /* NULL, or whether a refusal at every address means the server is gone (it answered
     * this handle before, and a stopping server closes its listener first) */
    int (*gone_if_refused)(void *ctx);
    void *ctx;
} tt_net_hello_t;

/* Resolve (within the deadline, once, then from the cache), connect and hello, address
 * by address, retrying with backoff (10 ms doubling to 500 ms) until the deadline, so
 * that a server started after its clients is waited for. A connect that failed on every
 * address forgets addresses that served before (a server that moved: a DNS failover is
 * followed at once) or that are at least a second old (a name that pointed elsewhere at
 * first); a server not up yet costs a lookup a second, not one a try. TUTTI_OK, or a
 * status with err: what the hello returned, TUTTI_ERR_STORE for a server gone,
 * TUTTI_ERR_NOMEM, TUTTI_ERR_TIMEOUT with the last cause met. */
int tt_net_dial(tt_net_dialer_t *d, uint64_t deadline, const tt_net_hello_t *h,
                tt_store_err_t *err);

/* Send the iovecs whole (any number: IOV_MAX at a time), or fail: 0, or -errno
 * (-ETIMEDOUT at the deadline). The iovecs are consumed. */
int tt_net_send_iov(int fd, struct iovec *iov, int iovcnt, uint64_t deadline);
/* Receive exactly len bytes: 0, -errno, -ETIMEDOUT, or -EPIPE when the peer closed.
 * *got_p (may be NULL) counts the bytes that did arrive. */
int tt_net_recv_all(int fd, void *buf, size_t len, uint64_t deadline, size_t *got_p);

#endif /* TT_STORE_NET_H */
