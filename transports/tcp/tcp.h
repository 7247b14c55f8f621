/* TCP transport internals. The connection set-up runs on a libuv loop (concurrent
 * connects and accepts under one deadline); the data path moves bytes with
 * non-blocking sendmsg/recv straight into the caller's buffers, spinning briefly and
 * then blocking in the same libuv loop (uv_poll on every busy link, a timer for the
 * deadline, an async handle for abort). Only the ABI header and libuv are used. */
#ifndef TCP_TCP_H
#define TCP_TCP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "../kit/chan.h"
#include "../kit/link.h"
#include "../kit/progress.h"
#include "../kit/queue.h"
#include "../kit/util.h"
#include "tcp_tls.h"

#define TCP_MAGIC 0x49545554u /* "TUTI" */
#define TCP_HELLO_MAGIC 0x4f4c4c48u
#define TCP_VERDICT_MAGIC 0x54434456u
/* 1: magic, version, rank, size. 2: + job instance, checksum mode, mutual
 * challenge-response, verdicts; 56-byte frame headers with a header CRC. */
#define TCP_HELLO_VERSION 2u
#define TCP_FRAME_DATA 1
#define TCP_FRAME_ERROR 2
#define TCP_MAX_ERRMSG 2048
#define TCP_MAX_INSTANCE 256
#define TCP_MAX_REASON 512
#define TCP_CHALLENGE_LEN 32
/* receives up to this size come with their header in one recv() through a staging
 * buffer, instead of two */
#define TCP_STAGE_BYTES 4096
/* a rank's store value "ip port pid pidns tls host" (tcp_setup.c) */
#define TCP_ADDR_VALUE_MAX 512
/* checksum mode: a CRC-32C of each frame header (in it) and of each payload (in a
 * 4-byte trailer after it) */
enum { TCP_CSUM_NONE = 0, TCP_CSUM_CRC32C = 1 };
#define TCP_TRAILER_BYTES 4
/* the sender checksums a payload this far ahead of what it sends; a smaller rest is
 * taken with the step before it */
#define TCP_CSUM_STEP_BYTES (256u << 10)
#define TCP_CSUM_EAGER_BYTES (64u << 10)
/* The most payload one sendmsg offers. By our reading of tcp_sendmsg the kernel pushes
 * what a call queued when the call ends (within one, only past half the window), so a
 * 64 MiB sendmsg reaches the receiver in a few late bursts. Capped at 1 MiB, a 2-rank
 * 64 MiB broadcast over loopback went from 24 to 13 ms and 16 MiB from 4.0-4.7 to
 * 2.4-2.9 ms; messages of 1 MiB and less are unchanged (512 KiB gained less, 2 MiB the
 * same). */
#define TCP_SEND_SLICE_BYTES ((size_t)1 << 20)

/* On the wire, little-endian hosts assumed (checked at set-up through the hello). */
typedef struct tcp_hdr {
    uint32_t magic;
    uint16_t type;
    uint16_t flags;
    uint64_t len;
    uint64_t env[4];
    uint32_t hcrc; /* checksum mode: CRC-32C of the 48 bytes above; else 0 */
    uint32_t reserved;
} tcp_hdr_t;

/* Set-up (tcp_setup.c). The higher rank C connects to the lower rank A:
 *   C -> A  hello (C's identity and challenge) + C's instance
 *   A -> C  hello + A's instance, verdict (0 and A's answer to C's challenge, or a
 *           refusal with its reason)
 *   C -> A  verdict (0 and C's answer to A's challenge, or a refusal)
 *   A -> C  verdict (0: the link is up; or a refusal)
 * A connection takes its rank's slot only after the last step. The first 16 bytes are
 * the version 1 hello, so an older peer is refused naming both versions.
 * Lazily (TUTTI_TCP_CONNECT=lazy), the set-up only listens and publishes; a link is
 * connected when a request is first posted on it, by either end, through the same
 * exchange on the data path's loop. When both ends call at once, the higher rank's
 * connection is the link: the higher rank refuses the lower one's with
 * TCP_VERDICT_CROSSED while its own call is in progress, and the lower one accepts the
 * higher one's whatever it is doing, then waits. */
typedef struct tcp_hello {
    uint32_t magic;
    uint32_t version;
    int32_t rank;
    int32_t nranks;
    uint32_t checksum; /* TCP_CSUM_* */
    uint32_t auth;     /* 1: this rank has the job secret and wants proof of it */
    uint32_t inst_len; /* bytes of job instance that follow, <= TCP_MAX_INSTANCE */
    uint32_t flags;    /* TCP_HELLO_LAZY: this rank connects on first use */
    uint8_t challenge[TCP_CHALLENGE_LEN]; /* fresh random bytes (zeros without auth) */
} tcp_hello_t;
#define TCP_HELLO_LAZY 1u
#define TCP_HELLO_V1_BYTES 16
_Static_assert(sizeof(tcp_hdr_t) == 56, "tcp frame header layout");
_Static_assert(sizeof(tcp_hello_t) == 64, "tcp hello layout");

typedef struct tcp_verdict {
    uint32_t magic;      /* TCP_VERDICT_MAGIC */
    int32_t status;      /* 0, or the TUTTI_ERR_* of a refusal */
    uint32_t reason_len; /* bytes of reason text that follow, <= TCP_MAX_REASON */
    uint32_t flags;      /* TCP_VERDICT_CROSSED (with a refusal) */
    uint8_t answer[32];  /* the answer to the peer's challenge (zeros without auth) */
} tcp_verdict_t;
/* Lazy connections: the refused rank is the lower of two that called each other at once;
 * the higher one's connection is the link, the lower one waits for it. */
#define TCP_VERDICT_CROSSED 1u
_Static_assert(sizeof(tcp_verdict_t) == 48, "tcp verdict layout");

typedef struct tcp_tp tcp_tp_t;

typedef struct tcp_link {
    tcp_tp_t *tp;
    int peer;
    long pid; /* a lower rank's pid when it runs on this host in this pid namespace, else 0 */
    int cpu;  /* with pid: the CPU it last ran on when last looked at (tcp_shares), or -1 */
    int fd;
    tcp_tlsio_t *tls; /* TLS: the link's session (tcp_tls.h), else NULL */
    char addr[96];
    tp_link_fail_t fail;
    int tx_broken; /* a send was cut mid-message: no more frames fit */
    int cc_early;  /* the link ran its congestion control from its first packet (tests) */
    /* send side: queue of requests, the head one possibly half sent */
    tp_req_t *sq_head, *sq_tail;
    tcp_hdr_t shdr;
    size_t shdr_off;
    uint32_t scrc;     /* checksum mode: CRC of the head's payload so far */
    size_t scrc_upto;  /* ... over its first scrc_upto bytes */
    uint32_t strail;   /* the trailer, once scrc_upto == len */
    size_t strail_off; /* trailer bytes sent */
    /* receive side */
    tp_req_t *rq_head, *rq_tail;
    tcp_hdr_t rhdr;
    size_t rhdr_got;  /* == sizeof(rhdr): a header is parked, waiting */
    int rhdr_seen;    /* the complete header was validated */
    int rhdr_matched; /* the parked header was matched to rq_head */
    int probe_watch;  /* probe found nothing: a header that comes ends progress() */
    char *stage;      /* header + small payload, read in one go */
    /* bytes the stage read beyond a frame shorter than the receive it was read for (a
     * message of the other channel): the next reads take them first */
    char *pb;
    size_t pb_off, pb_len;
    tp_uxq_t ux;  /* messages buffered for a channel with no receive posted (kit/chan.h) */
    char *errbuf; /* payload of an incoming error frame */
    size_t errgot;
    uint32_t rcrc;   /* checksum mode: CRC of the payload received so far */
    uint32_t rtrail; /* the trailer that came after it */
    size_t rtrail_got;
    /* libuv watcher used when blocking */
    uv_poll_t poll;
    int poll_inited;
    int poll_active;
    int poll_events;
} tcp_link_t;

struct tcp_tp {
    const tutti_tp_host_v1_t *host;
    int rank, nranks;
    tcp_link_t *links; /* nranks entries, links[rank] unused */
    uv_loop_t loop;
    uv_async_t wake;
    uv_timer_t timer;
    atomic_int aborted;
    unsigned long completions;
    unsigned long moved; /* reads and writes that moved bytes (tp_progress_hop) */
    tp_hop_t hop;        /* leaving a CPU shared with a lower local rank (kit/progress.h) */
    int hop_look;        /* the lower rank tcp_shares looks at next */
    int sockbuf;
    int sockbuf_warned;   /* a TUTTI_SOCKET_BUFFER under two segments was said */
    int cc_mode;          /* TCP_CC_*, from TUTTI_TCP_CONGESTION */
    char cc_name[16];     /* TCP_CC_NAMED: the algorithm (TCP_CA_NAME_MAX is 16) */
    char cc_system[16];   /* the system's, as a new socket gets it ("" if unknown) */
    int csum;             /* TCP_CSUM_*, from TUTTI_CHECKSUM */
    int auth;             /* the library has a job secret: hellos prove it */
    void *tls_ctx;        /* TLS (TUTTI_TLS_*): what each link's session is made from */
    const char *instance; /* the job instance hellos must agree on ("" if none) */
    int lazy;             /* TUTTI_TCP_CONNECT=lazy: links connect at their first use */
    struct setup *setup;  /* lazy: the listener and the connections in progress */
    unsigned lazy_tick;   /* lazy: sweeps since the loop last ran (incoming connections) */
    /* lazy: what the set-up tells the data path, which set them (tcp_setup.c calls into
     * tcp.c only through these): the link to peer is up (its fd set), or could not be
     * connected */
    void (*link_up)(tcp_tp_t *tp, int peer);
    void (*link_failed)(tcp_tp_t *tp, int peer, int status, const char *msg);
    /* on the list of live contexts whose sockets a forked child closes (tcp.c,
     * tcp_fork_child), under its lock */
    int live;
    tcp_tp_t *live_prev, *live_next;
};

/* TUTTI_TCP_CONGESTION: which congestion control a link runs (tcp_setup.c). */
enum {
    TCP_CC_AUTO,   /* reno on links that never leave this host, the system's elsewhere */
    TCP_CC_SYSTEM, /* the system's (net.ipv4.tcp_congestion_control) everywhere */
    TCP_CC_NAMED,  /* cc_name on every link */
};

/* "none" or "crc32c" */
static inline const char *tcp_csum_name(uint32_t mode)
{
    return mode == TCP_CSUM_NONE ? "none" : mode == TCP_CSUM_CRC32C ? "crc32c" : "unknown";
}

/* Fuzzing and tests only (fuzz/fuzz_tcp_frames.c): a transport whose link to rank 1 has
 * received `data` (frame headers, payloads, trailers, error frames) and then closed,
 * and the receive requests reqs posted on it, progressed until they are done or stuck;
 * whatever is left is cancelled and the transport destroyed. host: rank 0 of at least
 * 2, with log and error. csum: TCP_CSUM_*. Returns 0, or -1 when it could not set up. */
int tcp_recv_fuzz_input(const tutti_tp_host_v1_t *host, int csum, const uint8_t *data, size_t len,
                        tp_req_t *reqs, size_t nreqs);

/* tcp_setup.c */
/* The set-up: *published once this rank's address is in the store; why (whylen bytes)
 * says what failed where it can, else stays as it was. */
int tcp_setup_connect(tcp_tp_t *tp, int *published, char *why, size_t whylen);
/* Whether RLIMIT_NOFILE has room for the set-up (kit/util.h tp_fd_room: raised where
 * short); else an error, reported, and why says what is short. */
int tcp_setup_fd_room(const tutti_tp_host_v1_t *host, char *why, size_t whylen);
/* A rank that fails before its address is in the store puts why there instead (for the
 * higher ranks, which read it, to fail at once naming it). */
void tcp_setup_refuse(const tutti_tp_host_v1_t *host, int status, const char *why);
/* Lazily: a request waits on the link to peer, which is not connected; connect it unless
 * a connection to or from peer is under way. */
void tcp_setup_need(tcp_tp_t *tp, int peer);
/* Lazily: connections from peers are in their hello (the data path's sweeps run the loop
 * for them, as for this rank's own calls, which wait on links with requests posted). */
int tcp_setup_answering(tcp_tp_t *tp);
/* Lazily: connections that come after this rank reported status (msg) are refused with
 * it. */
void tcp_setup_failed(tcp_tp_t *tp, int status, const char *msg);
/* Lazily: close the listener and every connection in progress (their handles close on
 * the loop's next run), and free what the set-up holds once they have. */
void tcp_setup_close_lazy(tcp_tp_t *tp);
void tcp_setup_free_lazy(tcp_tp_t *tp);
/* In a forked child (its pthread_atfork handler, the only thread): close the sockets the
 * lazy set-up holds in libuv's handles (the listener, connections in their hello),
 * without libuv: the child never runs this context's loop or closes its handles. */
void tcp_setup_fork_child(tcp_tp_t *tp);
/* Fuzzing and tests only (fuzz/fuzz_tcp_hello.c): run one peer's bytes through the
 * hello/verdict exchange of a single connection, with no listener and no connect (a
 * socketpair stands in; what this rank writes is dropped). outgoing: this rank called
 * `peer` and has sent its hello; else the bytes arrive at its listener. tp needs host,
 * rank, nranks, links (fds -1; a link the exchange establishes is closed again), csum,
 * auth and instance. The bytes arrive in reads of at most chunk bytes (0: whole parts).
 * Returns 0, or -1 when it could not set up. */
int tcp_setup_fuzz_input(tcp_tp_t *tp, int outgoing, int peer, const uint8_t *data, size_t len,
                         size_t chunk);

#endif /* TCP_TCP_H */
