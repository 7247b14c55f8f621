/* Store internals: the backend table behind tutti_store_t, shared by store.c (the public
 * functions, prefixing, error recording) and the backends (store_file.c, store_tcp.c,
 * store_server.c, store_ops.c), and the helpers they share (store_util.c). Keys reaching a backend already carry the view's prefix and have been
 * checked (length, NULL); values have been checked against TUTTI_STORE_MAX_VALUE. */
#ifndef TT_STORE_IMPL_H
#define TT_STORE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <tutti/store.h>

#include "base/base.h"

/* A backend writes the cause of a failure here (with strerror(errno) where one applies);
 * store.c adds the operation, key and store address before recording it on the handle. */
typedef struct tt_store_err {
    char msg[512];
} tt_store_err_t;

/* (store_util.c, as are tt_store_alloc, tt_store_free, tt_store_key_display and
 * tt_store_parse_i64 below) */
void tt_store_err_set(tt_store_err_t *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Record on s, as its last error, how op on key (the caller's, without the view's prefix)
 * ended (status st, cause as printf): for a caller that waited in slices (core/job.c's
 * set-up waits), whose last slice's own message would give the slice's length. */
void tt_store_note(tutti_store_t *s, const char *op, const char *key, int st, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Every function gets the base store (never a view) and an absolute deadline
 * (tt_now_ns() scale, UINT64_MAX: none). Values returned are malloc'ed with a NUL byte
 * after them. wait and multi_get may be NULL: store.c builds them from get. */
typedef struct tt_store_ops {
    const char *name;
    int (*set)(tutti_store_t *s, const char *key, const void *value, size_t len, uint64_t deadline,
               tt_store_err_t *err);
    int (*get)(tutti_store_t *s, const char *key, void **value_p, size_t *len_p, uint64_t deadline,
               tt_store_err_t *err);
    int (*add)(tutti_store_t *s, const char *key, int64_t delta, int64_t *result_p,
               uint64_t deadline, tt_store_err_t *err);
    int (*compare_set)(tutti_store_t *s, const char *key, const void *expected, size_t elen,
                       const void *desired, size_t dlen, void **current_p, size_t *curlen_p,
                       uint64_t deadline, tt_store_err_t *err);
    int (*wait)(tutti_store_t *s, const char *const *keys, size_t n, uint64_t deadline,
                tt_store_err_t *err);
    int (*check)(tutti_store_t *s, const char *const *keys, size_t n, int *exists_p,
                 uint64_t deadline, tt_store_err_t *err);
    int (*del)(tutti_store_t *s, const char *key, int *deleted_p, uint64_t deadline,
               tt_store_err_t *err);
    int (*multi_get)(tutti_store_t *s, const char *const *keys, size_t n, void **values_p,
                     size_t *lens_p, uint64_t deadline, tt_store_err_t *err);
    /* Garbage collection (may be NULL: TUTTI_ERR_UNSUPPORTED): delete every key that
     * starts with prefix, counting them; delete key only if its value is expected. */
    int (*del_prefix)(tutti_store_t *s, const char *prefix, size_t *count_p, uint64_t deadline,
                      tt_store_err_t *err);
    int (*compare_del)(tutti_store_t *s, const char *key, const void *expected, size_t elen,
                       int *deleted_p, uint64_t deadline, tt_store_err_t *err);
    /* The keys that start with prefix ("": every key), counted (may be NULL:
     * TUTTI_ERR_UNSUPPORTED). */
    int (*count_prefix)(tutti_store_t *s, const char *prefix, size_t *count_p, uint64_t deadline,
                        tt_store_err_t *err);
    /* Frees impl; the handle itself is freed by store.c. */
    void (*close)(tutti_store_t *s);
} tt_store_ops_t;

/* A backend's entries named pfx##_set, pfx##_get, ..., for a backend with all of them
 * but the optional wait and multi_get (set those apart). */
#define TT_STORE_OPS_FNS(pfx)                                                                      \
    .set = pfx##_set, .get = pfx##_get, .add = pfx##_add, .compare_set = pfx##_compare_set,        \
    .check = pfx##_check, .del = pfx##_del, .del_prefix = pfx##_del_prefix,                        \
    .compare_del = pfx##_compare_del, .count_prefix = pfx##_count_prefix, .close = pfx##_close

struct tutti_store {
    const tt_store_ops_t *ops;
    tutti_store_t *base; /* the store that owns the backend; itself for a base store */
    char *prefix;        /* views: the whole prefix (a view of a view concatenates) */
    size_t prefix_len;
    char *url; /* "file:///dir", "tcp://host:port", "tcp://[::1]:port" */
    int port;  /* -1 for non-tcp stores */
    atomic_int timeout_ms;
    /* base only: the communicators made so far on each view's prefix (tt_store_next_comm_id),
     * under comm_ids_lock */
    struct tt_comm_ids *comm_ids;
    pthread_mutex_t comm_ids_lock;
    atomic_int refs; /* base only: the opener's, plus one per tt_store_retain */
    pthread_mutex_t err_lock;
    char last_error[1024];
    void *impl; /* backend state; NULL for views */
};

/* Allocate a base store handle for a backend (url copied); NULL when out of memory. */
tutti_store_t *tt_store_alloc(const tt_store_ops_t *ops, const char *url, int port, int timeout_ms);
/* A store's timeout as given at open: 0 is the default (TUTTI_STORE_TIMEOUT_MS when that
 * is above 0, else 30000 ms), as the communicator's timeout_ms of 0 is its default; a
 * negative one is no deadline. */
#define TT_STORE_DEFAULT_TIMEOUT_MS 30000
int tt_store_open_timeout_ms(int timeout_ms);
/* Free a handle made by tt_store_alloc without calling ops->close. */
void tt_store_free(tutti_store_t *s);

/* 0, 1, 2, ... on successive calls on views of one prefix (the base's own keys are the
 * prefix ""), counted on their base store (thread-safe). The communicator uses it to give
 * each communicator on one key space a prefix of its own. Per prefix, as Gloo's and
 * torch's PrefixStore are key spaces of their own: counted on the base for all views, a
 * 2-rank communicator on view "pair/" made the next on "world/" comm1 on its ranks and
 * comm0 on the third, which waited out its timeout (review, session 100). (store.c) */
unsigned tt_store_next_comm_id(tutti_store_t *store);
/* Frees a base store's counts (tt_store_free). */
void tt_store_comm_ids_free(tutti_store_t *base);

/* Take a reference to store's base store, which tutti_store_close of it gives back: the
 * base closes with its last reference. Returns the base. (store.c) */
tutti_store_t *tt_store_retain(tutti_store_t *store);

/* Copy key into dst (size dstlen) for messages: non-printable bytes as \xNN, long keys cut
 * with "...". Returns dst. */
const char *tt_store_key_display(const char *key, char *dst, size_t dstlen);
/* url for a message: any user information before the last '@' becomes "***" (a user before
 * ':' stays), file:// URLs as they are (store.c). */
const char *tt_store_url_redact(const char *url, char *dst, size_t dstlen);

/* Parse a counter value as ADD stores it (decimal text, optional sign, nothing else);
 * 0 or TUTTI_ERR_INVALID_ARG. */
int tt_store_parse_i64(const void *value, size_t len, int64_t *out_p);

/* What a tcp store handle (and the server it may start) is told at open, from
 * tutti_store_opts_t; strings belong to the caller and are copied. */
typedef struct tt_store_tcp_cfg {
    int timeout_ms;
    const char *secret; /* the job secret, NULL: no authentication */
    size_t secret_len;
    const char *instance; /* server: label it announces; client: the only label it
                                 accepts (NULL: any) */
    int idle_timeout_ms;  /* server: close connections idle this long (0: never) */
    int max_connections;  /* server: 0 picks one from RLIMIT_NOFILE */
    size_t client_quota;  /* server: bytes one connection may have buffered */
    size_t memory_limit;  /* server: bytes all connections may have buffered */
    int drain_ms;         /* server: how long stopping serves connected clients */
} tt_store_tcp_cfg_t;

/* Backends. On failure they leave the cause in err and set nothing. */
int tt_store_file_open(tutti_store_t **store_p, const char *dir, int timeout_ms, int do_fsync,
                       tt_store_err_t *err);
int tt_store_tcp_open(tutti_store_t **store_p, const char *host, int port, int is_server,
                      const tt_store_tcp_cfg_t *cfg, tt_store_err_t *err);
/* What a redis store handle is told at open (strings copied). */
typedef struct tt_store_redis_cfg {
    const char *host;
    int port;
    int db;
    const char *user;     /* NULL: AUTH with the password alone */
    const char *password; /* NULL: no AUTH */
    int timeout_ms;
} tt_store_redis_cfg_t;
int tt_store_redis_open(tutti_store_t **store_p, const tt_store_redis_cfg_t *cfg,
                        tt_store_err_t *err);
/* The caller's callbacks (ops checked: size and the required ones); url "ops://label". */
int tt_store_ops_open(tutti_store_t **store_p, const tutti_store_ops_t *ops, void *ctx,
                      const char *url, tt_store_err_t *err);

/* Wire format shared by the TCP client and server. Every frame is a u32 length (big
 * endian, the bytes after it), then for a request a u8 command and fields, each a u32
 * length and bytes; for a reply an i8 tutti status and the payload (the value, an 8-byte
 * big-endian integer, a byte, fields, or the error message when the status is negative).
 *
 * Protocol 2 begins every connection with a HELLO (magic, version, the client's challenge
 * when it has a job secret). The reply's fields: version, flags (TT_STORE_HELLO_AUTH),
 * the server's idle timeout in ms, the largest request it admits (8 bytes), its 16-byte
 * instance id (new at every start), its label, and with a secret the server's challenge
 * and its answer to the client's. The client checks that answer, then sends AUTH with its
 * own answer; only then are requests served. Answers are tt_auth_answer with the
 * contexts TT_STORE_CTX_SERVER and TT_STORE_CTX_CLIENT, so neither side's answer can be
 * replayed as the other's. Protocol 1 had no hello; a server of protocol 2 answers a
 * request before the hello with an error that says so. */
enum {
    TT_STORE_CMD_SET = 1,            /* key value -> ok */
    TT_STORE_CMD_GET = 2,            /* key -> value, deferred until the key exists */
    TT_STORE_CMD_ADD = 3,            /* key delta(8 bytes) -> new value (8 bytes) */
    TT_STORE_CMD_CAS = 4,            /* key expected desired -> value after */
    TT_STORE_CMD_CHECK = 5,          /* key... -> u8 all exist */
    TT_STORE_CMD_DELETE = 6,         /* key -> u8 existed */
    TT_STORE_CMD_WAIT = 7,           /* key... -> ok, deferred until all exist */
    TT_STORE_CMD_PING = 8,           /* -> ok */
    TT_STORE_CMD_HELLO = 9,          /* magic version challenge -> hello fields (see above) */
    TT_STORE_CMD_AUTH = 10,          /* answer -> ok */
    TT_STORE_CMD_DELETE_PREFIX = 11, /* prefix -> u64 keys deleted (waiters stay) */
    TT_STORE_CMD_CAD = 12,          /* key expected -> u8 deleted (only if the value is expected) */
    TT_STORE_CMD_COUNT_PREFIX = 13, /* prefix -> u64 keys under it (a server before session
                                       92 answers "unknown command" and drops the link) */
};
#define TT_STORE_PROTOCOL 2u
#define TT_STORE_MAGIC "tutti-store"
#define TT_STORE_HELLO_AUTH 1u
#define TT_STORE_ID_LEN 16
#define TT_STORE_MAX_INSTANCE 255
#define TT_STORE_CTX_SERVER "store-server"
#define TT_STORE_CTX_CLIENT "store-client"
/* Frames before the hello is done are small: nobody unauthenticated makes the server
 * buffer more than this. */
#define TT_STORE_HELLO_MAX_FRAME 1024u
#define TT_STORE_FRAME_MARGIN 4096u
/* Largest request: CAS with two maximal values. */
#define TT_STORE_MAX_FRAME                                                                         \
    (2u * (uint32_t)TUTTI_STORE_MAX_VALUE + TUTTI_STORE_MAX_KEY + TT_STORE_FRAME_MARGIN)
/* Most keys in one CHECK or WAIT: a frame with more is answered TUTTI_ERR_INVALID_ARG
 * (the client splits longer lists). A 64 MiB frame of 5-byte keys was 7.46 M keys. */
#define TT_STORE_MAX_KEYS (1u << 17)
/* Server memory a WAIT or GET holds per key it waits on, beyond the key's length (its
 * entry, the waiter's link, the key's copy, allocator overhead): the waiter is charged
 * this against the client quota and the memory limit. */
#define TT_STORE_WAIT_KEY_COST 160u
/* Largest reply: a value plus the status byte. */
#define TT_STORE_MAX_REPLY ((uint32_t)TUTTI_STORE_MAX_VALUE + TT_STORE_FRAME_MARGIN)

/* Server defaults (tutti_store_opts_t documents them). */
#define TT_STORE_DEFAULT_IDLE_MS 300000
#define TT_STORE_DEFAULT_QUOTA ((size_t)TUTTI_STORE_MAX_VALUE + 65536u)
#define TT_STORE_DEFAULT_MEMORY (2 * TT_STORE_DEFAULT_QUOTA)
#define TT_STORE_MIN_QUOTA 65536u

/* The TCP store server (libuv loop in a thread of its own). host may be NULL
 * ("127.0.0.1"); port 0 picks a free port, returned in *port_p. cfg is copied. */
typedef struct tt_store_server tt_store_server_t;
int tt_store_server_start(const char *host, int port, const tt_store_tcp_cfg_t *cfg,
                          tt_store_server_t **srv_p, int *port_p, tt_store_err_t *err);
/* Stop accepting, serve the connected clients until they leave (at most cfg->drain_ms),
 * close the rest, stop the loop thread and free everything. In a forked child (which has
 * no loop thread) it only forgets the server. */
void tt_store_server_stop(tt_store_server_t *srv);
/* Fuzzing and tests only (fuzz/fuzz_store_server.c): run one client's bytes through the
 * server's own frame splitting and request handling, on a fresh server with no listener
 * and no thread (a socketpair stands in for the connection; replies are dropped). The
 * bytes arrive in reads of at most chunk bytes (0: as many as fit), so frames split
 * across reads are exercised too. with_secret: the server requires authentication.
 * Returns 0, or -1 when it could not set up. */
int tt_store_server_fuzz_input(const uint8_t *data, size_t len, int with_secret, size_t chunk);
/* Fuzzing only (fuzz/fuzz_redis_reply.c): parse data as the redis client's replies until
 * one fails, the first split bytes already buffered and the rest arriving on a socket
 * (at most what a socket buffer holds). Returns 0, or -1 when it could not set up. */
int tt_store_redis_fuzz_input(const uint8_t *data, size_t len, size_t split);
/* Tests: how many keys the server holds (racy snapshot). */
size_t tt_store_server_nkeys(tt_store_server_t *srv);
/* Tests: keys held by the server embedded in this tcp store handle, (size_t)-1 if none. */
size_t tt_store_tcp_server_keys(tutti_store_t *store);

/* Big-endian 32-bit fields of the TCP store's wire format (client and server). */
static inline void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline uint32_t get_be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void put_be64(unsigned char *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

static inline uint64_t get_be64(const unsigned char *p)
{
    return (uint64_t)get_be32(p) << 32 | get_be32(p + 4);
}

#endif /* TT_STORE_IMPL_H */
