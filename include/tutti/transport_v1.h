/* tutti transport plugin ABI, version 1.
 *
 * A transport moves bytes between ranks; it never sees dtypes or collectives. It offers
 * ordered, reliable point-to-point streams: the k-th send posted to peer P on this rank
 * matches the k-th receive posted from this rank on P. Each message carries a 32-byte
 * envelope chosen by the library (sequence number, fingerprint of the collective, tag);
 * the receiver checks it, and the length, against what it expected before it writes a
 * byte of payload, so ranks that disagree get a mismatch instead of garbage.
 *
 * A transport is a `static const tutti_transport_ops_v1_t` table registered with
 * TUTTI_TRANSPORT_REGISTER_V1(name, table): built into libtutti, or compiled into a
 * shared object libtutti-transport-NAME.so that exports `tutti_transport_v1()`. The
 * loader checks the table's size and ABI version and refuses a mismatched plugin.
 *
 * Threading: create/post/progress/cancel_all/notify_error/destroy are called by one
 * thread at a time; abort() may be called from any thread at any time.
 */
#ifndef TUTTI_TRANSPORT_V1_H
#define TUTTI_TRANSPORT_V1_H

#include <stddef.h>
#include <stdint.h>

#include <tutti/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TUTTI_TRANSPORT_ABI_V1 1u

enum { TUTTI_LOG_ERROR = 0, TUTTI_LOG_WARN = 1, TUTTI_LOG_INFO = 2, TUTTI_LOG_TRACE = 3 };

/* What the library gives a transport: identity, limits, the store, logging and error
 * recording. Owned by the library; valid until destroy() returns. */
typedef struct tutti_tp_host_v1 {
    size_t size;          /* sizeof(tutti_tp_host_v1_t) */
    uint32_t abi_version; /* TUTTI_TRANSPORT_ABI_V1 */
    int rank;             /* this rank */
    int nranks;           /* ranks in the communicator */
    int timeout_ms;       /* deadline for connecting to all peers */
    int spin_us;          /* busy-poll budget before progress() blocks */
    void *ctx;            /* the library's context: pass back to the callbacks */
    /* The communicator's store (keys are already prefixed per communicator). */
    int (*store_set)(void *ctx, const char *key, const void *value, size_t len);
    int (*store_get)(void *ctx, const char *key, void **value_p, size_t *len_p,
                     int timeout_ms); /* value freed with free_value */
    void (*free_value)(void *value);
    /* A TUTTI_* knob without its prefix ("SOCKET_IFNAME"), or NULL when unset. */
    const char *(*config)(void *ctx, const char *name);
    /* One log line at level (TUTTI_LOG_*), prefixed by the library with host/pid/rank. */
    void (*log)(void *ctx, int level, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 3, 4)))
#endif
        ;
    /* Record why something failed: status, the peer (-1 if none), errno (0 if none) and
     * a message. Returns status, so `return host->error(...)` reads well. */
    int (*error)(void *ctx, int status, int peer, int err_no, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 5, 6)))
#endif
        ;
    /* Which peers this transport serves (the library may split peers between
     * transports, e.g. shm for ranks on this host and tcp for the rest). NULL: every
     * peer. Otherwise peers[r] != 0 for each rank r the transport must connect to; it
     * must not wait for, or touch, the others, and no request names them. Appended in
     * ABI 1.1: read it only when size > offsetof(tutti_tp_host_v1_t, peers). */
    const unsigned char *peers;
    /* This host's identity as the library sees it (hostname and boot id, or
     * TUTTI_HOST_ID); ranks with equal host ids share a kernel. Appended in ABI 1.1. */
    const char *host_id;
    /* ---- Appended in ABI 1.2: job identity and authentication. Read them only when
     * tutti_tp_host_has(h, field). ---- */
    /* The job instance this communicator belongs to ("<job id>/<nonce>", agreed through
     * the store): two jobs, or two runs of one job, never share one. A connection
     * set-up (hello) must carry it, and a transport must refuse a peer whose hello
     * names another instance. Store keys are already scoped to it. */
    const char *instance;
    /* Prove membership of the job: answer = HMAC-SHA256 of the job secret over
     * `context` and the 32-byte `challenge` (the secret never leaves the library).
     * Returns TUTTI_ERR_UNSUPPORTED when the job has no secret (authentication off);
     * then hellos carry no proof and none is asked for. A hello should be mutual: each
     * side sends a fresh random challenge and checks the other's answer, with a
     * context naming the direction ("tcp-hello 3->1 <instance>") so answers cannot be
     * replayed. */
    int (*auth_answer)(void *ctx, const char *context, const uint8_t challenge[32],
                       uint8_t answer[32]);
    /* ---- Appended in ABI 1.3. Read it only when tutti_tp_host_has(h, req_size). ---- */
    /* sizeof the request struct the library posts (tutti_tp_req_v2_t as the library was
     * built): a request field appended later is read only where this covers it
     * (tutti_tp_req_has in transport_v2.h). 0 or absent: only the first v2 fields. */
    size_t req_size;
    /* ---- Appended in ABI 1.5. Read it only when tutti_tp_host_has(h, setup_check). ---- */
    /* During create(): should set-up go on? 0: yes. < 0: a peer failed its own set-up
     * and will not come; fail create() with this status (the host has the peer's reason
     * and puts it in the init's error, so the transport's own message may be short).
     * Cheap (the host reads the store at most every 100 ms); a transport that waits for
     * peers other than in store_get (accepting connections, polling files) asks every
     * 200 ms or so. The host's store_get waits of set-up end so already. 0 after set-up,
     * and NULL in hosts older than this. */
    int (*setup_check)(void *ctx);
    /* ---- Appended in ABI 1.6. Read it only when tutti_tp_host_has(h, features). ---- */
    /* TUTTI_TP_HOST_* bits: what this library does that a transport may rely on. */
    uint32_t features;
} tutti_tp_host_v1_t;

/* The library puts the key it looks for in probe()'s found_p->env[3] before the call
 * (transport_v2.h, TUTTI_TP_CHANNELS); without the bit that word is not set, and a
 * probe reports the next message of channel 1 whatever its tag. */
#define TUTTI_TP_HOST_PROBE_KEY 0x1u

/* Does this host struct have `field` (appended in a later minor version)? */
#define tutti_tp_host_has(h, field)                                                                \
    ((h)->size >= __builtin_offsetof(tutti_tp_host_v1_t, field) + sizeof((h)->field))

/* Does the transport serve `peer`? (ABI 1.1 field, absent in older hosts.) */
static inline int tutti_tp_host_serves(const tutti_tp_host_v1_t *h, int peer)
{
    if (h->size <= __builtin_offsetof(tutti_tp_host_v1_t, peers) || !h->peers)
        return peer != h->rank;
    return peer != h->rank && h->peers[peer] != 0;
}

enum { TUTTI_TP_SEND = 0, TUTTI_TP_RECV = 1 };

/* One posted send or receive, owned by the library until it completes or
 * cancel_all() returns. */
typedef struct tutti_tp_req_v1 {
    /* set by the library before posting */
    int kind;        /* TUTTI_TP_SEND or TUTTI_TP_RECV (set by post_send/post_recv too) */
    int peer;        /* rank of the peer */
    void *buf;       /* send: the data; receive: where it lands */
    size_t len;      /* bytes; 0 is allowed (the envelope still travels) */
    uint64_t env[4]; /* send: envelope to transmit; receive: envelope expected */
    /* set by the transport */
    volatile int status; /* 1 while pending, 0 done, a TUTTI_ERR_* on failure;
                            TUTTI_ERR_MISMATCH when the envelope or length differ */
    uint64_t got_env[4]; /* receive: the envelope that arrived (also on mismatch) */
    size_t got_len;      /* receive: the length that arrived (also on mismatch) */
    size_t xfer;         /* bytes moved so far */
    void *tp_private[4]; /* the transport's own */
} tutti_tp_req_v1_t;

typedef struct tutti_transport_ops_v1 {
    size_t size;          /* sizeof(tutti_transport_ops_v1_t) */
    uint32_t abi_version; /* TUTTI_TRANSPORT_ABI_V1 */
    const char *name;     /* "tcp" */
    /* Connect to every peer (addresses exchanged through the store), bounded by
     * host->timeout_ms. The host struct outlives the transport. */
    int (*create)(const tutti_tp_host_v1_t *host, void **tp_p);
    /* Close everything; pending requests are dropped. */
    void (*destroy)(void *tp);
    /* Queue a send / receive; returns an error only for bad arguments or a link
     * already failed (then req->status holds it too). */
    int (*post_send)(void *tp, tutti_tp_req_v1_t *req);
    int (*post_recv)(void *tp, tutti_tp_req_v1_t *req);
    /* Move bytes for posted requests. timeout_ms 0: do what can be done without
     * waiting; > 0: spin up to host->spin_us, then block until some request completes
     * or fails, or the timeout passes. Request failures are reported in req->status;
     * the return value is an error only when the whole transport failed or was aborted
     * (TUTTI_ERR_ABORTED). */
    int (*progress)(void *tp, int timeout_ms);
    /* Forget every posted request (they are failed with status); links whose stream
     * position became unknown are marked failed. */
    void (*cancel_all)(void *tp, int status);
    /* Best effort, non-blocking: tell every peer that this rank failed (status and a
     * message), so that their pending and future receives from this rank fail with
     * that status and message instead of waiting for the timeout. */
    void (*notify_error)(void *tp, int status, const char *msg);
    /* Thread-safe: make progress() return TUTTI_ERR_ABORTED promptly, now and later. */
    void (*abort)(void *tp);
    /* "host:port" (or another printable address) of a peer, for error messages. */
    const char *(*peer_address)(void *tp, int peer);
} tutti_transport_ops_v1_t;

/* The symbol a plugin exports; the ABI number is part of its name so that a stale
 * plugin fails to load instead of corrupting memory. */
#define TUTTI_TRANSPORT_SYMBOL_V1 "tutti_transport_v1"
typedef const tutti_transport_ops_v1_t *(*tutti_transport_entry_v1_fn)(void);

#ifdef TUTTI_TRANSPORT_BUILTIN
/* Inside libtutti: a lookup function the built-in registry lists. */
#define TUTTI_TRANSPORT_REGISTER_V1(name, table)                                                   \
    const tutti_transport_ops_v1_t *tt_builtin_transport_##name(void);                             \
    const tutti_transport_ops_v1_t *tt_builtin_transport_##name(void)                              \
    {                                                                                              \
        return &(table);                                                                           \
    }
#else
/* In libtutti-transport-NAME.so: the exported entry point. */
#define TUTTI_TRANSPORT_REGISTER_V1(name, table)                                                   \
    __attribute__((visibility("default"))) const tutti_transport_ops_v1_t *tutti_transport_v1(     \
        void);                                                                                     \
    __attribute__((visibility("default"))) const tutti_transport_ops_v1_t *tutti_transport_v1(     \
        void)                                                                                      \
    {                                                                                              \
        return &(table);                                                                           \
    }
#endif

#ifdef __cplusplus
}
#endif
#endif /* TUTTI_TRANSPORT_V1_H */
