/* Blocking socket steps of the store clients (store_tcp.c, store_redis.c), each bounded
 * by an absolute deadline (tt_now_ns() scale, UINT64_MAX: none). */
#ifndef TT_STORE_NET_H
#define TT_STORE_NET_H

#include <netdb.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

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
/* Send the iovecs whole (any number: IOV_MAX at a time), or fail: 0, or -errno
 * (-ETIMEDOUT at the deadline). The iovecs are consumed. */
int tt_net_send_iov(int fd, struct iovec *iov, int iovcnt, uint64_t deadline);
/* Receive exactly len bytes: 0, -errno, -ETIMEDOUT, or -EPIPE when the peer closed.
 * *got_p (may be NULL) counts the bytes that did arrive. */
int tt_net_recv_all(int fd, void *buf, size_t len, uint64_t deadline, size_t *got_p);

#endif /* TT_STORE_NET_H */
