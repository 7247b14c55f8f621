/* TLS on the tcp transport's links: see tcp_tls.h. */
#include "tcp_tls.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>

#ifdef TUTTI_HAVE_TLS
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#endif

static int knob_missing(const tutti_tp_host_v1_t *host, const char *set, const char *need)
{
    return host->error(host->ctx, TUTTI_ERR_CONFIG, -1, 0,
                       "tcp: TLS: %s is set but %s is not: TLS needs this rank's certificate "
                       "(TUTTI_TLS_CERT), its private key (TUTTI_TLS_KEY) and the CAs that "
                       "verify the peers' (TUTTI_TLS_CA_FILE or TUTTI_TLS_CA_PATH)",
                       set, need);
}

/* The knobs, checked for what goes together; *on 1 when TLS is asked for. */
static int knobs(const tutti_tp_host_v1_t *host, const char **cert, const char **key,
                 const char **caf, const char **cap, int *on)
{
    *cert = host->config(host->ctx, "TLS_CERT");
    *key = host->config(host->ctx, "TLS_KEY");
    *caf = host->config(host->ctx, "TLS_CA_FILE");
    *cap = host->config(host->ctx, "TLS_CA_PATH");
    const char **all[] = { cert, key, caf, cap };
    static const char *const names[] = { "TUTTI_TLS_CERT", "TUTTI_TLS_KEY", "TUTTI_TLS_CA_FILE",
                                         "TUTTI_TLS_CA_PATH" };
    /* set but empty is an error, never "no TLS": a variable meant to name a file that
     * came out empty must not leave the links in the clear */
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (*all[i] && !**all[i])
            return host->error(host->ctx, TUTTI_ERR_CONFIG, -1, 0,
                               "tcp: TLS: %s is set but empty (unset it for no TLS)", names[i]);
    *on = *cert || *key || *caf || *cap;
    const char *gloo = getenv("GLOO_DEVICE_TRANSPORT");
    if (!*on && gloo && !strcasecmp(gloo, "TCP_TLS"))
        /* a Gloo user's job that asks for TLS must not run in the clear here either */
        return host->error(host->ctx, TUTTI_ERR_CONFIG, -1, 0,
                           "tcp: TLS: GLOO_DEVICE_TRANSPORT=%s asks for TLS, but no certificate "
                           "is set (TUTTI_TLS_CERT, TUTTI_TLS_KEY and TUTTI_TLS_CA_FILE, or "
                           "Gloo's GLOO_DEVICE_TRANSPORT_TCP_TLS_CERT, _PKEY and _CA_FILE)",
                           gloo);
    if (!*on)
        return TUTTI_OK;
    const char *set = *cert  ? "TUTTI_TLS_CERT"
                      : *key ? "TUTTI_TLS_KEY"
                      : *caf ? "TUTTI_TLS_CA_FILE"
                             : "TUTTI_TLS_CA_PATH";
    if (!*cert)
        return knob_missing(host, set, "TUTTI_TLS_CERT");
    if (!*key)
        return knob_missing(host, set, "TUTTI_TLS_KEY");
    if (!*caf && !*cap)
        return knob_missing(host, set, "TUTTI_TLS_CA_FILE (or TUTTI_TLS_CA_PATH)");
    return TUTTI_OK;
}

#ifndef TUTTI_HAVE_TLS

static int ctx_make(const tutti_tp_host_v1_t *host, const char *cert, const char *key,
                    const char *caf, const char *cap, void **ctx_p)
{
    (void)key, (void)caf, (void)cap, (void)ctx_p;
    return host->error(host->ctx, TUTTI_ERR_UNSUPPORTED, -1, 0,
                       "tcp: TLS is asked for (TUTTI_TLS_CERT=%s), but this tutti was built "
                       "without OpenSSL (install libssl-dev and rebuild: meson option tls)",
                       cert);
}
void tcp_tls_ctx_free(void *ctx)
{
    (void)ctx;
}
tcp_tlsio_t *tcp_tlsio_new(void *ctx, int server)
{
    (void)ctx;
    (void)server;
    return NULL;
}
void tcp_tlsio_free(tcp_tlsio_t *io)
{
    (void)io;
}
void *tcp_tlsio_inbuf(tcp_tlsio_t *io, size_t *len_p, size_t *room_p)
{
    (void)io;
    *len_p = *room_p = 0;
    return NULL;
}
void tcp_tlsio_fed(tcp_tlsio_t *io, size_t n)
{
    (void)io;
    (void)n;
}
int tcp_tlsio_handshake(tcp_tlsio_t *io)
{
    (void)io;
    return -1;
}
ssize_t tcp_tlsio_read(tcp_tlsio_t *io, void *buf, size_t len)
{
    (void)io;
    (void)buf;
    (void)len;
    return -1;
}
int tcp_tlsio_write(tcp_tlsio_t *io, const void *buf, size_t len)
{
    (void)io;
    (void)buf;
    (void)len;
    return -1;
}
void *tcp_tlsio_take_out(tcp_tlsio_t *io, size_t *len_p)
{
    (void)io;
    *len_p = 0;
    return NULL;
}
void tcp_tlsio_attach(tcp_tlsio_t *io, int fd)
{
    (void)io;
    (void)fd;
}
ssize_t tcp_tlsio_recv(tcp_tlsio_t *io, void *buf, size_t len)
{
    (void)io;
    (void)buf;
    (void)len;
    errno = EPROTO;
    return -1;
}
ssize_t tcp_tlsio_sendv(tcp_tlsio_t *io, const struct iovec *iov, int n)
{
    (void)io;
    (void)iov;
    (void)n;
    errno = EPROTO;
    return -1;
}
size_t tcp_tlsio_pending(const tcp_tlsio_t *io)
{
    (void)io;
    return 0;
}
size_t tcp_tlsio_unsent(const tcp_tlsio_t *io)
{
    (void)io;
    return 0;
}
const char *tcp_tlsio_reason(const tcp_tlsio_t *io)
{
    (void)io;
    return "";
}

#else /* TUTTI_HAVE_TLS */

/* A record's plaintext at most (TLS), and what its ciphertext may add. */
#define TLS_RECORD 16384u
#define TLS_IN_BYTES (TLS_RECORD + 2048u + 5u)
/* The data path encrypts up to this much plaintext ahead of the socket and sends it in
 * one call (a send a record took 4-7x plain tcp's time at 64 KiB-64 MiB, session 109);
 * and reads up to this much of the socket at once (OpenSSL's read-ahead) */
#define TLS_BATCH (256u << 10)
#define TLS_BATCH_RECORDS ((int)(TLS_BATCH / TLS_RECORD) + 1)
#define TLS_READ_BUFFER (64u << 10)

struct tcp_tlsio {
    SSL *ssl;
    int fd; /* >= 0: the data path */
    int err;
    /* the set-up's input: bytes libuv read for OpenSSL, and what it asked for */
    unsigned char *in;
    size_t in_len, in_off, want;
    /* the set-up's output: ciphertext for uv_write */
    unsigned char *out;
    size_t out_len, out_cap;
    /* the data path: a message's first bytes gathered into one record */
    unsigned char *stage;
    /* the data path's sends: ciphertext of records encrypted and not yet sent (wq,
     * from wq_off), each record's plaintext length and where its ciphertext ends */
    unsigned char *wq;
    size_t wq_cap, wq_off, wq_len;
    size_t rec_plain[TLS_BATCH_RECORDS], rec_end[TLS_BATCH_RECORDS];
    int nrec, rec_done;
    char reason[256];
};

/* ---- the BIO under each session: the set-up's buffers, then the socket ---- */

static int bio_read(BIO *b, char *buf, int len)
{
    tcp_tlsio_t *io = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    if (len <= 0)
        return 0;
    if (io->in_off < io->in_len) {
        size_t n = io->in_len - io->in_off;
        if (n > (size_t)len)
            n = (size_t)len;
        memcpy(buf, io->in + io->in_off, n);
        io->in_off += n;
        if (io->in_off == io->in_len)
            io->in_off = io->in_len = 0;
        return (int)n;
    }
    if (io->fd < 0) {
        io->want = (size_t)len;
        BIO_set_retry_read(b);
        return -1;
    }
    for (;;) {
        ssize_t r = recv(io->fd, buf, (size_t)len, MSG_DONTWAIT);
        if (r >= 0)
            return (int)r; /* 0: the peer closed */
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            BIO_set_retry_read(b);
        else
            io->err = errno;
        return -1;
    }
}

static int bio_write(BIO *b, const char *buf, int len)
{
    tcp_tlsio_t *io = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    if (len <= 0)
        return 0;
    if (io->fd >= 0) { /* the data path: into wq, sent by tcp_tlsio_sendv */
        if (io->wq_len + (size_t)len > io->wq_cap) {
            io->err = ENOBUFS; /* sized for a batch: cannot happen */
            return -1;
        }
        memcpy(io->wq + io->wq_len, buf, (size_t)len);
        io->wq_len += (size_t)len;
        return len;
    }
    if (io->out_len + (size_t)len > io->out_cap) { /* the set-up: into out, for uv_write */
        size_t cap = io->out_cap ? io->out_cap : 4096;
        while (cap < io->out_len + (size_t)len)
            cap *= 2;
        unsigned char *p = realloc(io->out, cap);
        if (!p) {
            io->err = ENOMEM;
            return -1;
        }
        io->out = p;
        io->out_cap = cap;
    }
    memcpy(io->out + io->out_len, buf, (size_t)len);
    io->out_len += (size_t)len;
    return len;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b;
    (void)num;
    (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int bio_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static void bio_method_init(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "tutti-tcp");
    if (m && BIO_meth_set_read(m, bio_read) && BIO_meth_set_write(m, bio_write) &&
        BIO_meth_set_ctrl(m, bio_ctrl) && BIO_meth_set_create(m, bio_create))
        bio_method = m;
    else if (m)
        BIO_meth_free(m);
}

/* ---- the context ---- */

/* OpenSSL's queue of errors as one line (emptied). */
static void ssl_errors(char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    unsigned long e;
    while ((e = ERR_get_error()) != 0) {
        char one[160];
        ERR_error_string_n(e, one, sizeof(one));
        /* "error:0A000086:SSL routines::certificate verify failed": the reason */
        const char *r = strrchr(one, ':');
        r = r && r[1] ? r + 1 : one;
        if (n + 3 < cap && !strstr(buf, r)) /* "system lib" comes once a layer */
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? "; " : "", r);
    }
    if (!n)
        snprintf(buf, cap, "no reason given");
}

static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return 0;
}

static int load_failed(const tutti_tp_host_v1_t *host, SSL_CTX *ctx, const char *knob,
                       const char *path)
{
    char why[400];
    ssl_errors(why, sizeof(why));
    SSL_CTX_free(ctx);
    return host->error(host->ctx, TUTTI_ERR_CONFIG, -1, 0, "tcp: TLS: %s=%s: %s%s", knob, path, why,
                       !strcmp(knob, "TUTTI_TLS_KEY") ? " (the key must be unencrypted: no "
                                                        "passphrase is asked for)"
                                                      : "");
}

/* The context from the knobs (all present): TUTTI_ERR_CONFIG naming what does not load. */
static int ctx_make(const tutti_tp_host_v1_t *host, const char *cert, const char *key,
                    const char *caf, const char *cap, void **ctx_p)
{
    pthread_once(&bio_once, bio_method_init);
    ERR_clear_error();
    SSL_CTX *ctx = bio_method ? SSL_CTX_new(TLS_method()) : NULL;
    if (!ctx)
        return host->error(host->ctx, TUTTI_ERR_NOMEM, -1, 0, "tcp: TLS: no context (%s)",
                           bio_method ? "SSL_CTX_new failed" : "no BIO method");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* both ends prove themselves; no session outlives its connection (and no ticket
     * arrives after the handshake, on the data path); an end without close_notify is
     * a closed connection, as a plain socket's */
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF /* OpenSSL 3: else an end without it is already
                                       SSL_ERROR_SYSCALL with no error (io_failed) */
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
#endif
    /* a key with a passphrase fails to load (a prompt on the terminal would hang a rank) */
    SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_read_ahead(ctx, 0); /* the set-up relies on it (tcp_tls.h) */
    /* the data path reads ahead (tcp_tlsio_attach) into a buffer this large: made now,
     * at the handshake's first read */
    SSL_CTX_set_default_read_buffer_len(ctx, TLS_READ_BUFFER);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1)
        return load_failed(host, ctx, "TUTTI_TLS_CERT", cert);
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1)
        return load_failed(host, ctx, "TUTTI_TLS_KEY", key);
    if (SSL_CTX_check_private_key(ctx) != 1)
        return load_failed(host, ctx, "TUTTI_TLS_KEY (against TUTTI_TLS_CERT)", key);
    struct stat sb;
    if (cap && (stat(cap, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
        int err = errno;
        SSL_CTX_free(ctx);
        return host->error(host->ctx, TUTTI_ERR_CONFIG, -1, 0, "tcp: TLS: TUTTI_TLS_CA_PATH=%s: %s",
                           cap, stat(cap, &sb) != 0 ? strerror(err) : "not a directory");
    }
    if (SSL_CTX_load_verify_locations(ctx, caf, cap) != 1)
        return load_failed(host, ctx, caf ? "TUTTI_TLS_CA_FILE" : "TUTTI_TLS_CA_PATH",
                           caf ? caf : cap);
    if (host->log)
        host->log(host->ctx, TUTTI_LOG_INFO, "tcp: TLS on every link (certificate %s, CAs %s%s%s)",
                  cert, caf ? caf : "", caf && cap ? " and " : "", cap ? cap : "");
    *ctx_p = ctx;
    return TUTTI_OK;
}

void tcp_tls_ctx_free(void *ctx)
{
    SSL_CTX_free(ctx);
}

/* ---- sessions ---- */

tcp_tlsio_t *tcp_tlsio_new(void *ctx, int server)
{
    tcp_tlsio_t *io = calloc(1, sizeof(*io));
    if (!io)
        return NULL;
    io->fd = -1;
    io->in = malloc(TLS_IN_BYTES);
    io->ssl = io->in ? SSL_new(ctx) : NULL;
    BIO *b = io->ssl ? BIO_new(bio_method) : NULL;
    if (!b) {
        tcp_tlsio_free(io);
        return NULL;
    }
    BIO_set_data(b, io);
    SSL_set_bio(io->ssl, b, b);
    if (server)
        SSL_set_accept_state(io->ssl);
    else
        SSL_set_connect_state(io->ssl);
    return io;
}

void tcp_tlsio_free(tcp_tlsio_t *io)
{
    if (!io)
        return;
    SSL_free(io->ssl);
    free(io->in);
    free(io->out);
    free(io->stage);
    free(io->wq);
    free(io);
}

/* Why a call failed, into io->reason: the peer's alert, the verification's verdict,
 * OpenSSL's queue, or the socket's error. */
static void note_failure(tcp_tlsio_t *io, int ret)
{
    int e = SSL_get_error(io->ssl, ret);
    char q[200];
    ssl_errors(q, sizeof(q));
    long v = SSL_get_verify_result(io->ssl);
    if (e == SSL_ERROR_ZERO_RETURN)
        snprintf(io->reason, sizeof(io->reason), "the peer closed the TLS session");
    else if (e == SSL_ERROR_SYSCALL && io->err)
        snprintf(io->reason, sizeof(io->reason), "%s", strerror(io->err));
    else if (e == SSL_ERROR_SYSCALL)
        snprintf(io->reason, sizeof(io->reason), "the connection closed");
    else if (v != X509_V_OK)
        snprintf(io->reason, sizeof(io->reason), "%s: the peer's certificate: %s", q,
                 X509_verify_cert_error_string(v));
    else
        snprintf(io->reason, sizeof(io->reason), "%s", q);
}

void *tcp_tlsio_inbuf(tcp_tlsio_t *io, size_t *len_p, size_t *room_p)
{
    size_t room = io->in ? TLS_IN_BYTES - io->in_len : 0;
    *len_p = io->want < room ? io->want : room;
    *room_p = room;
    return io->in ? io->in + io->in_len : NULL;
}

void tcp_tlsio_fed(tcp_tlsio_t *io, size_t n)
{
    io->in_len += n;
    io->want = io->want > n ? io->want - n : 0;
}

/* A set-up call that did not complete: 0 it waits for the peer's bytes, -2 the peer
 * ended the session, -1 it failed (io->reason). */
static int setup_stalled(tcp_tlsio_t *io, int r)
{
    int e = SSL_get_error(io->ssl, r);
    if (e == SSL_ERROR_WANT_READ && !io->err)
        return 0;
    note_failure(io, r);
    return e == SSL_ERROR_ZERO_RETURN ? -2 : -1;
}

int tcp_tlsio_handshake(tcp_tlsio_t *io)
{
    ERR_clear_error();
    int r = SSL_do_handshake(io->ssl);
    return r == 1 ? 1 : setup_stalled(io, r);
}

ssize_t tcp_tlsio_read(tcp_tlsio_t *io, void *buf, size_t len)
{
    size_t n = 0;
    ERR_clear_error();
    int r = SSL_read_ex(io->ssl, buf, len, &n);
    return r == 1 ? (ssize_t)n : setup_stalled(io, r);
}

int tcp_tlsio_write(tcp_tlsio_t *io, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    while (len) {
        size_t w = 0;
        ERR_clear_error();
        int r = SSL_write_ex(io->ssl, p, len, &w);
        if (r != 1) {
            note_failure(io, r);
            return -1;
        }
        p += w;
        len -= w;
    }
    return 0;
}

void *tcp_tlsio_take_out(tcp_tlsio_t *io, size_t *len_p)
{
    void *p = io->out_len ? io->out : NULL;
    *len_p = io->out_len;
    if (p) {
        io->out = NULL;
        io->out_len = io->out_cap = 0;
    }
    return p;
}

void tcp_tlsio_attach(tcp_tlsio_t *io, int fd)
{
    io->fd = fd;
    io->want = 0;
    if (io->in_off == io->in_len) { /* the set-up's input buffer: done with (bio_read
                                       would serve what it still held first) */
        free(io->in);
        io->in = NULL;
        io->in_off = io->in_len = 0;
    }
    /* a read takes what the socket has, up to the buffer: a record's header and body no
     * longer cost a recv() each, nor does each record of a large message. What it read
     * beyond the record asked for waits in the session (tcp_tlsio_pending). */
    SSL_set_read_ahead(io->ssl, 1);
}

/* A data-path call that did not move bytes: errno as recv()/sendmsg() would set it. */
static ssize_t io_failed(tcp_tlsio_t *io, int r)
{
    int e = SSL_get_error(io->ssl, r);
    if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) && !io->err) {
        errno = EAGAIN;
        return -1;
    }
    if (e == SSL_ERROR_ZERO_RETURN)
        return 0;
    if (e == SSL_ERROR_SYSCALL && io->err) {
        errno = io->err;
        return -1;
    }
    note_failure(io, r);
    if (e == SSL_ERROR_SYSCALL)
        return 0; /* the connection ended mid-record */
    errno = EPROTO;
    return -1;
}

ssize_t tcp_tlsio_recv(tcp_tlsio_t *io, void *buf, size_t len)
{
    size_t n = 0;
    io->err = 0;
    ERR_clear_error();
    int r = SSL_read_ex(io->ssl, buf, len, &n);
    return r == 1 ? (ssize_t)n : io_failed(io, r);
}

/* Send what wq holds, and take the records it finished off the list: the plaintext
 * bytes they carried (0 none), or -1 (errno: EAGAIN with nothing finished, or the
 * socket's error). */
static ssize_t wq_flush(tcp_tlsio_t *io)
{
    while (io->wq_off < io->wq_len) {
        ssize_t w = send(io->fd, io->wq + io->wq_off, io->wq_len - io->wq_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            io->wq_off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        break;
    }
    size_t done = 0;
    while (io->rec_done < io->nrec && io->rec_end[io->rec_done] <= io->wq_off)
        done += io->rec_plain[io->rec_done++];
    if (io->wq_off == io->wq_len)
        io->wq_off = io->wq_len = 0, io->nrec = io->rec_done = 0;
    if (!done) {
        errno = EAGAIN;
        return -1;
    }
    return (ssize_t)done;
}

ssize_t tcp_tlsio_sendv(tcp_tlsio_t *io, const struct iovec *iov, int n)
{
    /* Records encrypted by an earlier call go first; the caller offers the same bytes
     * again from where it stands (what it was told is sent), so nothing new is taken
     * until they have all left. */
    io->err = 0;
    if (io->wq_len)
        return wq_flush(io);
    /* the queue as large as this batch needs (an error report on a link that never sent
     * more must not cost a whole batch's buffer on every link), grown when one needs more */
    size_t offered = 0;
    for (int k = 0; k < n && offered < TLS_BATCH; k++)
        offered += iov[k].iov_len;
    size_t need = (offered < TLS_BATCH ? offered : TLS_BATCH) + TLS_RECORD +
                  (size_t)TLS_BATCH_RECORDS * 512u;
    if (io->wq_cap < need) {
        unsigned char *q = realloc(io->wq, need);
        if (!q) {
            errno = ENOMEM;
            return -1;
        }
        io->wq = q;
        io->wq_cap = need;
    }
    /* up to TLS_BATCH bytes as records: straight from a piece with a record's worth left,
     * else gathered (a frame's header and what follows it) through the stage */
    int i = 0;
    size_t at = 0, total = 0;
    while (i < n && total < TLS_BATCH && io->nrec < TLS_BATCH_RECORDS) {
        if (at == iov[i].iov_len) {
            i++, at = 0;
            continue;
        }
        const unsigned char *p = (const unsigned char *)iov[i].iov_base + at;
        size_t len = iov[i].iov_len - at;
        if (len >= TLS_RECORD || i == n - 1) {
            len = len < TLS_RECORD ? len : TLS_RECORD;
            at += len;
        } else {
            if (!io->stage && !(io->stage = malloc(TLS_RECORD))) {
                if (total)
                    break; /* what was encrypted goes first */
                errno = ENOMEM;
                return -1;
            }
            len = 0;
            while (i < n && len < TLS_RECORD) {
                size_t take = iov[i].iov_len - at;
                take = take < TLS_RECORD - len ? take : TLS_RECORD - len;
                memcpy(io->stage + len, (const unsigned char *)iov[i].iov_base + at, take);
                len += take;
                at += take;
                if (at == iov[i].iov_len)
                    i++, at = 0;
            }
            p = io->stage;
        }
        if (total + len > TLS_BATCH && total)
            break; /* (a gathered record would overrun the batch: the next call's) */
        size_t w = 0;
        ERR_clear_error();
        int r = SSL_write_ex(io->ssl, p, len, &w);
        if (r != 1 || w != len) {
            note_failure(io, r);
            if (total)
                break; /* what was encrypted goes; the failure shows next call */
            errno = EPROTO;
            return -1;
        }
        io->rec_plain[io->nrec] = len;
        io->rec_end[io->nrec++] = io->wq_len;
        total += len;
    }
    return wq_flush(io);
}

size_t tcp_tlsio_unsent(const tcp_tlsio_t *io)
{
    return io->wq_len - io->wq_off;
}

size_t tcp_tlsio_pending(const tcp_tlsio_t *io)
{
    return (size_t)SSL_has_pending(io->ssl);
}

const char *tcp_tlsio_reason(const tcp_tlsio_t *io)
{
    return io->reason;
}

#endif /* TUTTI_HAVE_TLS */

int tcp_tls_ctx_new(const tutti_tp_host_v1_t *host, void **ctx_p)
{
    const char *cert, *key, *caf, *cap;
    int on = 0;
    *ctx_p = NULL;
    int st = knobs(host, &cert, &key, &caf, &cap, &on);
    return st < 0 || !on ? st : ctx_make(host, cert, key, caf, cap, ctx_p);
}
