/* TLS on the tcp transport's links (TUTTI_TLS_CERT, TUTTI_TLS_KEY, TUTTI_TLS_CA_FILE,
 * TUTTI_TLS_CA_PATH; Gloo's GLOO_DEVICE_TRANSPORT_TCP_TLS_* where ours are unset),
 * through OpenSSL: each connection runs a TLS handshake (TLS 1.2 or later, both ends
 * presenting a certificate the other's CA list verifies) before the hello, and every
 * byte after it travels encrypted and authenticated.
 *
 * One object per connection carries the TLS session from the set-up to the data path.
 * In the set-up (libuv streams) it reads from a buffer libuv fills with exactly the
 * bytes OpenSSL last asked for (OpenSSL reads a record's header, then its body, and no
 * further: no read-ahead), and what it writes collects in a buffer the set-up hands to
 * uv_write; so when the set-up ends, nothing of the peer's first data frames has been
 * read from the socket. Then tcp_tlsio_attach gives it the link's socket, which it
 * reads and writes without blocking, as the plain data path does.
 *
 * Built without OpenSSL, tcp_tls_ctx_new fails with TUTTI_ERR_UNSUPPORTED when a knob
 * asks for TLS, and nothing else here is called. */
#ifndef TCP_TLS_H
#define TCP_TLS_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <tutti/transport_v1.h>

typedef struct tcp_tlsio tcp_tlsio_t;

/* The knobs: *ctx_p NULL where none is set (plain tcp), else the context every link's
 * session is made from. A knob set without the others it needs, a file that does not
 * load, or a key that does not fit the certificate: TUTTI_ERR_CONFIG, reported through
 * host->error naming the knob and the file. */
int tcp_tls_ctx_new(const tutti_tp_host_v1_t *host, void **ctx_p);
void tcp_tls_ctx_free(void *ctx);

/* A session for one connection: server (the accepting end) or client. NULL: no memory. */
tcp_tlsio_t *tcp_tlsio_new(void *ctx, int server);
void tcp_tlsio_free(tcp_tlsio_t *io);

/* ---- the set-up ---- */
/* Where libuv should put the next bytes of the socket, and how many it may (what
 * OpenSSL last asked for); *len_p 0 when it has asked for nothing; *room_p what the
 * buffer has room for. */
void *tcp_tlsio_inbuf(tcp_tlsio_t *io, size_t *len_p, size_t *room_p);
/* libuv put n bytes there. */
void tcp_tlsio_fed(tcp_tlsio_t *io, size_t n);
/* Drive the handshake: 1 done, 0 it waits for the peer, -1 failed (tcp_tlsio_reason),
 * -2 the peer ended the session. */
int tcp_tlsio_handshake(tcp_tlsio_t *io);
/* Plaintext the peer sent: > 0 bytes, 0 none yet (more bytes are wanted), -1 the
 * session failed (tcp_tlsio_reason: the handshake's verdict, the peer's alert), -2 the
 * peer ended it. */
ssize_t tcp_tlsio_read(tcp_tlsio_t *io, void *buf, size_t len);
/* Encrypt len bytes for the peer (into the output buffer). 0, or -1 (reason). */
int tcp_tlsio_write(tcp_tlsio_t *io, const void *buf, size_t len);
/* The output so far (malloc'ed, the caller's to free), and none is left; NULL and 0
 * when there is none. */
void *tcp_tlsio_take_out(tcp_tlsio_t *io, size_t *len_p);

/* ---- the data path ---- */
/* From now on the session reads and writes fd (non-blocking). */
void tcp_tlsio_attach(tcp_tlsio_t *io, int fd);
/* recv() and sendmsg() through the session, with their returns: > 0 bytes moved; 0 the
 * peer closed (recv); -1 with errno EAGAIN (would block), EPROTO (the session failed:
 * tcp_tlsio_reason), or the socket's. A send encrypts up to 256 KiB ahead as records
 * and says sent only what has left whole records; the caller offers the rest again,
 * the same bytes from where it stands, and nothing new is taken until what was
 * encrypted has left (so a send's bytes must not change, or be dropped, while some are
 * unsent: tcp_tlsio_unsent). */
ssize_t tcp_tlsio_recv(tcp_tlsio_t *io, void *buf, size_t len);
ssize_t tcp_tlsio_sendv(tcp_tlsio_t *io, const struct iovec *iov, int n);
/* Bytes the session read ahead of what was asked (decrypted or not): a reader must not
 * wait for the socket before a read has found them wanting. */
size_t tcp_tlsio_pending(const tcp_tlsio_t *io);
/* Encrypted bytes not yet sent: the stream is in the middle of a record. */
size_t tcp_tlsio_unsent(const tcp_tlsio_t *io);
/* Why the session last failed ("" if it has not). */
const char *tcp_tlsio_reason(const tcp_tlsio_t *io);

#endif /* TCP_TLS_H */
