/* tutti stores: the key-value rendezvous that ranks meet through.
 *
 *   file:///dir          a directory shared by the ranks (the embedded default, no server)
 *   tcp://host:port      a TCP store server, embedded in one process or run standalone
 *                        (tools/tutti-store)
 *   redis://[[user]:password@]host[:port][/db]
 *                        a Redis server (port 6379 and db 0 by default; the password
 *                        percent-encoded, or in tutti_store_opts_t.password)
 *   ops://label          the caller's own store behind a table of callbacks
 *                        (tutti_store_open_ops), e.g. a framework's rendezvous store
 *
 * Keys are strings (any bytes but NUL, at most TUTTI_STORE_MAX_KEY bytes), values are
 * byte strings of at most TUTTI_STORE_MAX_VALUE bytes. A prefixed view shares its base
 * store and puts a prefix before every key, so several communicators share one store.
 * All functions return a tutti status (see <tutti/status.h>); tutti_store_last_error()
 * explains failures with the store's address. A store handle is safe to use from
 * several threads.
 */
#ifndef TUTTI_STORE_H
#define TUTTI_STORE_H

#include <stddef.h>
#include <stdint.h>

#include <tutti/status.h>

#include <tutti/export.h>

TUTTI_BEGIN_DECLS

#define TUTTI_STORE_MAX_KEY 1024
#define TUTTI_STORE_MAX_VALUE (64u << 20)

typedef struct tutti_store tutti_store_t;

typedef struct tutti_store_opts {
    size_t size;    /* sizeof(tutti_store_opts_t), set by tutti_store_opts_init */
    int timeout_ms; /* TUTTI_STORE_TIMEOUT_MS: default deadline of blocking calls and
                         of connecting (default 30000; 0 is the default, as the
                         communicator's timeout_ms of 0 is; negative: no deadline). The
                         store tutti_store_open_env and tutti_comm_init_env open takes,
                         where TUTTI_STORE_TIMEOUT_MS is unset, their opts' timeout_ms
                         (the communicator's, TUTTI_TIMEOUT_MS) when opts is given */
    int is_server;  /* tcp: host the server in this process (port 0 picks a free one).
                       Not from TUTTI_STORE_SERVER, which only tutti_store_open_env and
                       tutti_comm_init_env read (for their rank 0); default 0 */
    /* ---- appended in 0.2 (older callers' smaller structs keep working) ---- */
    const char *auth_token;      /* TUTTI_AUTH_TOKEN: the job secret. A tcp server with one
                                    serves only clients that prove they know it, and a
                                    client with one trusts only such a server (mutual
                                    challenge-response: the secret never travels). Wins
                                    over auth_token_file, unless only the file was
                                    set after tutti_store_opts_init */
    const char *auth_token_file; /* TUTTI_AUTH_TOKEN_FILE: a file holding the secret */
    const char *instance;        /* tcp: a label (at most 255 bytes) the server announces;
                                    a client with one keeps away from servers announcing
                                    another (a previous run's, still stopping). NULL: none */
    int idle_timeout_ms;         /* TUTTI_STORE_IDLE_TIMEOUT_MS, server: close a connection
                                    with no request pending that sent nothing for this
                                    long (clients reconnect transparently), or whose
                                    client has not read its replies for as long; 0 never.
                                    Default 300000 */
    int max_connections;         /* TUTTI_STORE_MAX_CONNECTIONS, server: beyond this many
                                    the idlest connection is evicted. 0 (default): three
                                    quarters of RLIMIT_NOFILE */
    size_t client_quota_bytes;   /* TUTTI_STORE_CLIENT_QUOTA, server: bytes one connection
                                    may have buffered (its request in flight, replies
                                    being written, the keys it waits on); a bigger request
                                    fails. Default: one maximal SET (64 MiB + 64 KiB) */
    size_t memory_limit_bytes;   /* TUTTI_STORE_MEMORY_LIMIT, server: bytes all connections
                                    together may have buffered, values only unread replies
                                    hold included; a request that would pass it fails.
                                    Default: twice the client quota */
    /* ---- appended in 0.3 ---- */
    const char *password; /* TUTTI_STORE_PASSWORD, redis://: the password sent with AUTH
                             when the URL carries none (so that it stays out of URLs,
                             logs and process listings). NULL: none */
    /* ---- appended in 0.4 ---- */
    int fsync; /* TUTTI_STORE_FSYNC, file://: fsync each value before it becomes visible
                  (stores on disks that may lose power); default 0 */
} tutti_store_opts_t;

/* Defaults, then the TUTTI_STORE_* (not TUTTI_STORE_SERVER: is_server above) and
 * TUTTI_AUTH_* environment. */
int tutti_store_opts_init(tutti_store_opts_t *opts);

/* Open a store by URL ("file:///tmp/job", "tcp://10.0.0.1:29500", "tcp://[::1]:29500").
 * opts may be NULL (defaults and the environment). A tcp server listens on the URL's
 * host. Authentication and limits apply to tcp stores. */
int tutti_store_open(tutti_store_t **store_p, const char *url, const tutti_store_opts_t *opts);

/* Open a file store rooted at dir (created if missing). A timeout_ms of 0 here and in
 * tutti_store_open_tcp is the default, as in tutti_store_opts_t. */
int tutti_store_open_file(tutti_store_t **store_p, const char *dir, int timeout_ms);

/* Open a TCP store. With is_server, start a server on host:port in this process (in a
 * thread of its own) and connect to it; port 0 picks a free port (see
 * tutti_store_port). Without, connect, retrying until timeout_ms passes. The job secret
 * and the limits come from the environment (see tutti_store_opts_t). */
int tutti_store_open_tcp(tutti_store_t **store_p, const char *host, int port, int is_server,
                         int timeout_ms);

/* ---- A store of the caller's: callbacks ----
 *
 * Every callback gets the ctx given to tutti_store_open_ops, full keys (the views'
 * prefixes already put before them), and timeout_ms: the milliseconds left of the
 * library's deadline for the call, 0 "answer from what is there now, do not wait", -1
 * "no deadline". A callback must honour it: the library's own error paths (fault
 * records, stall checks, the last rank's clean-up) pass short timeouts so that a store
 * that hangs cannot hang them, and nothing can interrupt a callback that overruns.
 * Callbacks may be called from several threads at once.
 *
 * A callback returns a tutti status: TUTTI_OK, TUTTI_ERR_TIMEOUT when timeout_ms passed,
 * any other TUTTI_ERR_* for other failures (a value that is not a tutti status counts as
 * TUTTI_ERR_STORE). On failure it may write a NUL-terminated explanation into errbuf
 * (errlen bytes, "" on entry); the library puts the store's label, the operation and the
 * key before it in tutti_store_last_error and in communicators' error messages. Values
 * handed back (get, compare_set) are malloc()ed by the callback; the library free()s them.
 * *value_p is NULL on entry, and whatever the callback leaves there is the library's
 * whatever it returns: on failure too it is free()d (a callback that fails must not free
 * it itself after storing it there).
 * Semantics are those of the tutti_store_* functions below. */
typedef struct tutti_store_ops {
    size_t size; /* sizeof(tutti_store_ops_t): fields appended later stay NULL for
                    callers built against an older table */
    /* Required. */
    int (*set)(void *ctx, const char *key, const void *value, size_t len, int timeout_ms,
               char *errbuf, size_t errlen);
    /* Wait until key exists (at most timeout_ms): TUTTI_ERR_TIMEOUT if it does not. */
    int (*get)(void *ctx, const char *key, void **value_p, size_t *len_p, int timeout_ms,
               char *errbuf, size_t errlen);
    int (*add)(void *ctx, const char *key, int64_t delta, int64_t *result_p, int timeout_ms,
               char *errbuf, size_t errlen);
    /* A missing key equals an empty expected (elen 0); *current_p: the value after. */
    int (*compare_set)(void *ctx, const char *key, const void *expected, size_t elen,
                       const void *desired, size_t dlen, void **current_p, size_t *curlen_p,
                       int timeout_ms, char *errbuf, size_t errlen);
    int (*check)(void *ctx, const char *const *keys, size_t n, int *exists_p, int timeout_ms,
                 char *errbuf, size_t errlen);
    int (*del)(void *ctx, const char *key, int *deleted_p, int timeout_ms, char *errbuf,
               size_t errlen);
    /* Optional (NULL: the library does without). wait: the library gets each key in turn
     * instead. */
    int (*wait)(void *ctx, const char *const *keys, size_t n, int timeout_ms, char *errbuf,
                size_t errlen);
    /* delete_prefix: delete every key that starts with prefix, *count_p of them. Without
     * it, the last rank to destroy a communicator leaves the keys of its job instance in
     * the store, all under "<communicator prefix><nonce>/" (the communicator prefix:
     * "tutti/[job/<id>/]comm<N>/" or TUTTI_PREFIX's; a split's:
     * "<parent's communicator prefix><parent's nonce>-split<S>-<color>/"), and says so
     * at info level. */
    int (*delete_prefix)(void *ctx, const char *prefix, size_t *count_p, int timeout_ms,
                         char *errbuf, size_t errlen);
    /* compare_delete: delete key only if its value is expected (atomically). Without it,
     * an instance record the last rank emptied stays as an empty value (which counts as
     * missing everywhere the library looks). */
    int (*compare_delete)(void *ctx, const char *key, const void *expected, size_t elen,
                          int *deleted_p, int timeout_ms, char *errbuf, size_t errlen);
    /* close: called once, by tutti_store_close of the store (not of its views). */
    void (*close)(void *ctx);
    /* count_prefix: how many keys start with prefix ("": every key), into *count_p.
     * Without it, tutti_store_count fails with TUTTI_ERR_UNSUPPORTED. (Session 92;
     * after close, so a table of an older size leaves it NULL.) */
    int (*count_prefix)(void *ctx, const char *prefix, size_t *count_p, int timeout_ms,
                        char *errbuf, size_t errlen);
} tutti_store_ops_t;

/* Open a store whose every operation is a callback of ops (copied; as far as ops->size
 * reaches). label (at most 200 bytes; NULL: "store") names the store in messages and
 * gives its URL, "ops://<label>". Its default deadline is TUTTI_STORE_TIMEOUT_MS (30000;
 * tutti_store_set_timeout changes it). The store works everywhere a store handle does:
 * prefixed views, tutti_comm_init, tutti_comm_split. */
int tutti_store_open_ops(tutti_store_t **store_p, const tutti_store_ops_t *ops, void *ctx,
                         const char *label);

/* A view of base that puts prefix before every key. base must outlive the view. */
int tutti_store_open_prefixed(tutti_store_t **store_p, tutti_store_t *base, const char *prefix);

/* Close a store handle. A communicator split from another holds a reference to the
 * store: closing it then only gives up the caller's, and the store closes when the last
 * such communicator is destroyed. An embedded server stops accepting at once, serves the clients
 * still connected until they leave (at most 2 s, or the store's timeout if shorter),
 * then closes the rest; its port is free for a new server right after. */
void tutti_store_close(tutti_store_t *store);

/* The store's URL, e.g. "tcp://127.0.0.1:29500" (with the real port when 0 was asked). */
const char *tutti_store_url(const tutti_store_t *store);
/* TCP port of a tcp store (the bound one for an embedded server), -1 for others. */
int tutti_store_port(const tutti_store_t *store);
/* The explanation of the last failure on this handle ("" if none). */
const char *tutti_store_last_error(const tutti_store_t *store);
/* Default deadline of blocking calls on this handle (and views made from it later). */
void tutti_store_set_timeout(tutti_store_t *store, int timeout_ms);
int tutti_store_timeout(const tutti_store_t *store);

/* Set key to value (overwrites). */
int tutti_store_set(tutti_store_t *store, const char *key, const void *value, size_t len);

/* Wait until key exists (or timeout_ms passes; -1: the store's default) and return a
 * malloc'ed copy of its value (free() it); a NUL byte follows the value. */
int tutti_store_get(tutti_store_t *store, const char *key, void **value_p, size_t *len_p,
                    int timeout_ms);

/* Atomically add delta to the 64-bit counter at key (missing counts as 0) and return
 * the new value in *result_p (may be NULL). */
int tutti_store_add(tutti_store_t *store, const char *key, int64_t delta, int64_t *result_p);

/* Atomically: if key's value equals expected (a missing key equals an empty expected,
 * elen 0), set it to desired. Returns the value after the operation in *current_p
 * (malloc'ed; may be NULL). */
int tutti_store_compare_set(tutti_store_t *store, const char *key, const void *expected,
                            size_t elen, const void *desired, size_t dlen, void **current_p,
                            size_t *curlen_p);

/* Wait until all n keys exist. */
int tutti_store_wait(tutti_store_t *store, const char *const *keys, size_t n, int timeout_ms);

/* Whether all n keys exist now (no waiting): *exists_p is 1 or 0. */
int tutti_store_check(tutti_store_t *store, const char *const *keys, size_t n, int *exists_p);

/* Delete key; *deleted_p (may be NULL) says whether it existed. */
int tutti_store_delete(tutti_store_t *store, const char *key, int *deleted_p);

/* How many keys start with prefix (NULL or "": every key) in store, a view counting only
 * its own (those under its prefix), into *count_p: torch's Store.num_keys. A count taken
 * while others set or delete keys may or may not include theirs. Stores opened with
 * tutti_store_open_ops without count_prefix: TUTTI_ERR_UNSUPPORTED; a tcp store server
 * older than this call (session 92) closes the connection on it (TUTTI_ERR_STORE,
 * "connection lost"). */
int tutti_store_count(tutti_store_t *store, const char *prefix, size_t *count_p);

/* Get n keys, waiting for each; values_p[i] are malloc'ed (free() each). On error no
 * value is returned. */
int tutti_store_multi_get(tutti_store_t *store, const char *const *keys, size_t n, void **values_p,
                          size_t *lens_p, int timeout_ms);

TUTTI_END_DECLS
#endif /* TUTTI_STORE_H */
