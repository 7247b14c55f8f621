/* tutti transport plugin ABI, version 2.
 *
 * The contract of version 1 (transport_v1.h: ordered, reliable point-to-point streams
 * with a checked 32-byte envelope; the host struct; the threading rules) holds
 * unchanged. Version 2 adds what the library needs to stop knowing transports by name,
 * and room for device memory:
 *   - a properties block in the ops table (reach, cost hints, memory kinds);
 *   - a memory kind, a registration handle and a stream on every request;
 *   - optional register_mem/deregister_mem;
 *   - optional probe (appended: v2 tables built before it end before the slot).
 * A transport registers with TUTTI_TRANSPORT_REGISTER_V2(name, table); a plugin exports
 * `tutti_transport_v2()`. The loader tries that symbol first and runs a plugin that only
 * exports `tutti_transport_v1()` through a shim, so v1 plugins keep working.
 */
#ifndef TUTTI_TRANSPORT_V2_H
#define TUTTI_TRANSPORT_V2_H

#include <stddef.h>
#include <stdint.h>

#include <tutti/transport_v1.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TUTTI_TRANSPORT_ABI_V2 2u

/* The host struct is v1's, unchanged: its abi_version stays TUTTI_TRANSPORT_ABI_V1 (it
 * names the host struct's layout) and its size field lets it grow. */
typedef tutti_tp_host_v1_t tutti_tp_host_v2_t;

/* Where a request's buffer lives. */
enum {
    TUTTI_MEM_HOST = 0, /* ordinary process memory */
    TUTTI_MEM_CUDA = 1  /* reserved: device memory (no transport takes it yet) */
};
#define TUTTI_MEM_BIT(kind) (1u << (kind))

/* Properties flags. */
#define TUTTI_TP_LOCAL_ONLY 0x1u /* reaches only ranks on this host (same host id) */
/* Channels (ABI 1.6): bit 63 of a message's env[3] is its channel, 0 or 1 (the library
 * sends point-to-point messages on 1, collectives on 0), and a message's key is 0 on
 * channel 0 and its whole env[3] (the tag) on channel 1. A receive takes the next
 * message from its peer with its own key, not merely the next message: one that
 * arrives while only receives of other keys are posted is read aside into the
 * transport's own buffer (the stream must go on for them) and taken, copied, by the
 * next receive of its key; with no receive posted at all it stays in the stream.
 * probe() then reports messages of channel 1 only: where the host sets
 * TUTTI_TP_HOST_PROBE_KEY (transport_v1.h), the first one whose env[3] is found_p's on
 * input, reading aside the messages of other keys that stand in front of it with no
 * receive posted; else the first of channel 1. Without this flag the library knows that
 * every message must be received in the order sent. */
#define TUTTI_TP_CHANNELS 0x2u
/* Any key (ABI 1.7, with TUTTI_TP_CHANNELS): where the host sets
 * TUTTI_TP_HOST_PROBE_KEY and found_p's env[3] is 0 on input (bit 63 clear: no key),
 * probe() reports the first message of channel 1 from peer, in arrival order, that no
 * posted receive takes (passing over those of keys with receives posted, which it leaves
 * to them), as the library's TUTTI_ANY_TAG needs. Without this flag such a probe's
 * answer is undefined and the library refuses TUTTI_ANY_TAG (TUTTI_ERR_UNSUPPORTED). */
#define TUTTI_TP_PROBE_ANY 0x4u

/* What the library may assume about a transport, constant for the table. */
typedef struct tutti_tp_props_v2 {
    uint32_t flags;     /* TUTTI_TP_* bits */
    uint32_t mem_kinds; /* TUTTI_MEM_BIT(kind) for each memory kind post_* accepts;
                           TUTTI_MEM_HOST must be among them */
    /* Cost hints for algorithm selection (lib/coll/cost.c): latency of a small
     * message in microseconds, and one direction's bandwidth of a large one in GB/s.
     * 0 means "no idea": the library assumes a socket-like transport (10 us, 2 GB/s). */
    double alpha_us;
    double bw_gbs;
} tutti_tp_props_v2_t;

/* One posted send or receive. The first fields are v1's, in v1's order (a v1 plugin is
 * handed a v2 request as its own type); v2 fields follow. Owned by the library until it
 * completes or cancel_all() returns. */
typedef struct tutti_tp_req_v2 {
    /* set by the library before posting (as in v1) */
    int kind;        /* TUTTI_TP_SEND or TUTTI_TP_RECV (set by post_send/post_recv too) */
    int peer;        /* rank of the peer */
    void *buf;       /* send: the data; receive: where it lands */
    size_t len;      /* bytes; 0 is allowed (the envelope still travels) */
    uint64_t env[4]; /* send: envelope to transmit; receive: envelope expected */
    /* set by the transport (as in v1) */
    volatile int status; /* 1 while pending, 0 done, a TUTTI_ERR_* on failure;
                            TUTTI_ERR_MISMATCH when the envelope or length differ */
    uint64_t got_env[4]; /* receive: the envelope that arrived (also on mismatch) */
    size_t got_len;      /* receive: the length that arrived (also on mismatch) */
    size_t xfer;         /* bytes moved so far */
    void *tp_private[4]; /* the transport's own */
    /* ---- v2, set by the library before posting ---- */
    /* TUTTI_MEM_* of buf; a kind outside props.mem_kinds is refused with
     * TUTTI_ERR_UNSUPPORTED. */
    uint32_t mem;
    /* What register_mem returned for memory that holds buf, or NULL (the transport
     * then copies or registers on its own, as in v1). */
    void *mem_handle;
    /* Reserved for a device stream or event to order the transfer after: must be NULL
     * for now; a transport refuses a request with another value (TUTTI_ERR_UNSUPPORTED). */
    void *stream;
    /* ---- appended in ABI 1.3: read only where tutti_tp_req_has(host, hints) ---- */
    /* TUTTI_TP_HINT_* bits: advice about this transfer, which a transport may ignore. */
    uint32_t hints;
} tutti_tp_req_v2_t;

/* Request hints. */
/* The sender has nothing to overlap with this send (it waits for it, and its peer is
 * busy sending to it as well, as in an all-to-all exchange): a transport that can move
 * the bytes once, straight from the sender's buffer into the receiver's (a pull,
 * RDMA read), should, even where it would otherwise stage them to free the sender
 * early. */
#define TUTTI_TP_HINT_SINGLE_COPY 0x1u

/* Does the library that made host post requests with `field` (a request field appended
 * after the first v2 ones)? */
#define tutti_tp_req_has(h, field)                                                                 \
    (tutti_tp_host_has(h, req_size) &&                                                             \
     (h)->req_size >= __builtin_offsetof(tutti_tp_req_v2_t, field) +                               \
                          sizeof(((const tutti_tp_req_v2_t *)0)->field))

/* What probe() found: the next message from a peer, arrived and not yet taken. */
typedef struct tutti_tp_probe {
    uint64_t env[4]; /* its envelope */
    size_t len;      /* its length in bytes */
} tutti_tp_probe_t;

typedef struct tutti_transport_ops_v2 {
    size_t size;          /* sizeof(tutti_transport_ops_v2_t) as the transport was built:
                             fields appended later are read only when size covers them */
    uint32_t abi_version; /* TUTTI_TRANSPORT_ABI_V2 */
    const char *name;     /* "tcp" */
    tutti_tp_props_v2_t props;
    /* The calls below behave as their v1 namesakes (see transport_v1.h). */
    int (*create)(const tutti_tp_host_v2_t *host, void **tp_p);
    void (*destroy)(void *tp);
    int (*post_send)(void *tp, tutti_tp_req_v2_t *req);
    int (*post_recv)(void *tp, tutti_tp_req_v2_t *req);
    int (*progress)(void *tp, int timeout_ms);
    void (*cancel_all)(void *tp, int status);
    void (*notify_error)(void *tp, int status, const char *msg);
    void (*abort)(void *tp);
    const char *(*peer_address)(void *tp, int peer);
    /* Optional (NULL: nothing to register, requests carry mem_handle NULL): make len
     * bytes at buf, of memory kind mem, ready for transfers and return a handle for
     * requests on that memory; undone by deregister_mem, before the memory is freed
     * and before destroy(). */
    int (*register_mem)(void *tp, void *buf, size_t len, uint32_t mem, void **handle_p);
    int (*deregister_mem)(void *tp, void *handle);
    /* ---- appended after the first v2 tables: read only where size covers the slot
     * (tutti_tp_ops_has) ---- */
    /* Optional (NULL: the library cannot receive from any source over this transport,
     * and TUTTI_ANY_SOURCE fails with TUTTI_ERR_UNSUPPORTED). Whether the next message
     * from peer has arrived (its header is visible to this rank) while no receive is
     * posted for peer: 1 with *found_p filled (its envelope and length); 0 when there
     * is none (nothing arrived yet, or a posted receive will take it); < 0 when the link
     * to peer failed (its status: not reported through host->error for this), or
     * TUTTI_ERR_INVALID_ARG for a peer the transport does not serve. Consumes nothing:
     * the message goes, as ever, to the next receive posted for peer. It may read from
     * the link to see a header (never a payload byte) and keep it for that receive.
     * Called by the thread that calls progress(), under the same rules. */
    int (*probe)(void *tp, int peer, tutti_tp_probe_t *found_p);
    /* ---- appended in ABI 1.4 (read only where tutti_tp_ops_has(ops, arm)) ---- */
    /* Optional (NULL: the library cannot sleep on this transport and another at once;
     * with several in use it then blocks in each one's progress() in turn, a slice at a
     * time). Get ready to sleep outside progress(), so that a caller with requests on
     * several transports can sleep until any of them has something to do (as UCX's
     * worker event fd and ucp_worker_arm):
     *   0: armed. *fd_p is a descriptor that poll() reports readable (POLLIN) once
     *      progress() has something to do (a peer sent, a request can move, abort() was
     *      called), and *timeout_ms_p the longest the caller may sleep on it before it
     *      calls progress() (-1: no limit; the transport's own checks, such as a peer's
     *      liveness, need it).
     *   1: there is something to do now: call progress() instead of sleeping.
     *   < 0: a failure status, or TUTTI_ERR_UNSUPPORTED when this instance cannot (the
     *      caller then takes turns as without the slot).
     * An armed transport stays armed until the next progress() call, which the caller
     * makes after its sleep whether the descriptor became readable or not (that call
     * disarms it and drains the descriptor). The descriptor belongs to the transport.
     * Called by the thread that calls progress(), under the same rules. */
    int (*arm)(void *tp, int *fd_p, int *timeout_ms_p);
    /* ---- appended in ABI 1.7 (read only where tutti_tp_ops_has(ops, cancel)) ---- */
    /* Optional (NULL: a posted receive cannot be taken back, and tutti_cancel leaves it
     * to complete). Take back receive req, posted and not yet completed: 0 when no
     * message has matched it yet (it is the library's again: the transport forgets it,
     * never completes nor counts it); 1 when one has (its transfer is under way or done:
     * it completes as ever); TUTTI_ERR_INVALID_ARG for a request that is no receive.
     * Called by the thread that calls progress(), under the same rules. */
    int (*cancel)(void *tp, tutti_tp_req_v2_t *req);
} tutti_transport_ops_v2_t;

/* Does ops (a v2 table) have the appended slot `field`? (It may still be NULL.) */
#define tutti_tp_ops_has(ops, field)                                                               \
    ((ops)->size >= __builtin_offsetof(tutti_transport_ops_v2_t, field) + sizeof((ops)->field))

#define TUTTI_TRANSPORT_SYMBOL_V2 "tutti_transport_v2"
typedef const tutti_transport_ops_v2_t *(*tutti_transport_entry_v2_fn)(void);

/* Inside libtutti the entry is a lookup function the built-in registry lists; in
 * libtutti-transport-NAME.so it is the exported tutti_transport_v2(). */
#ifdef TUTTI_TRANSPORT_BUILTIN
#define TUTTI_TP_ENTRY_V2_(name) tt_builtin_transport_##name
#define TUTTI_TP_EXPORT_V2_
#else
#define TUTTI_TP_ENTRY_V2_(name) tutti_transport_v2
#define TUTTI_TP_EXPORT_V2_ __attribute__((visibility("default")))
#endif
#define TUTTI_TRANSPORT_REGISTER_V2(name, table)                                                   \
    TUTTI_TP_EXPORT_V2_ const tutti_transport_ops_v2_t *TUTTI_TP_ENTRY_V2_(name)(void);            \
    TUTTI_TP_EXPORT_V2_ const tutti_transport_ops_v2_t *TUTTI_TP_ENTRY_V2_(name)(void)             \
    {                                                                                              \
        return &(table);                                                                           \
    }

#ifdef __cplusplus
}
#endif
#endif /* TUTTI_TRANSPORT_V2_H */
