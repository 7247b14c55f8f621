/* Shared-memory transport internals: the shared layouts (doorbells, per-pair segments
 * with one SPSC byte ring per direction) and the local per-peer state. The design is
 * described at the top of shm.c; set-up (segments, store records, the single-copy probe,
 * liveness) lives in shm_setup.c. Only the ABI header and libc are used. */
#ifndef SHM_SHM_H
#define SHM_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <poll.h>
#include <stdint.h>
#include <sys/types.h>

#include "../kit/chan.h"
#include "../kit/link.h"
#include "../kit/queue.h"
#include "../kit/util.h"

#define SHM_LINE 64
/* the smallest ring a pair may have (shm_setup.c's ring_fit shrinks them to it) */
#define SHM_RING_FLOOR ((size_t)4096)
/* names in /dev/shm whose creator is gone are removed once this old (seconds) */
#define SHM_STALE_S 600
#define SHM_SEG_MAGIC 0x4d485354u /* "TSHM" */
/* a doorbell's set-up state: a rank says READY only when nothing of its set-up can fail
 * any more, and returns only once every local peer said READY; a failed one says FAILED
 * (or, before its record is in the store, publishes a record that says why) */
#define SHM_SETUP_BUSY 0u
#define SHM_SETUP_READY 1u
#define SHM_SETUP_FAILED 2u
#define SHM_VERSION 8u
#define SHM_REC_MAGIC 0x5453u
#define SHM_REC_INLINE 1 /* payload follows the header in the ring */
#define SHM_REC_CMA 2    /* payload stays in the sender: the receiver pulls it */
#define SHM_REC_SHORT 3  /* a short payload beside a digest of the envelope (shm_short_t) */
#define SHM_HDR_BYTES 56 /* header bytes of a record; inline payload starts here */
#define SHM_HDR_WHOLE 1u /* flags: the whole record was written before its stamp */
#define SHM_MAX_ERRMSG 2048
/* TUTTI_SHM_CMA_HINT_BYTES unset or "auto": decided at set-up, once it is known whether
 * this host's ranks outnumber its CPUs (docs/architecture.md, "The shm transport"). Where each
 * rank has a CPU, sender and receiver copy through a cache-hot ring at once, and two
 * copies beat or match one pull below 16 MiB here (2 ranks: allgather 0.7-0.9x the time at
 * 4-16 MiB, broadcast 0.3-0.8x at 2-16 MiB, alltoall and allreduce level; from 32 MiB the
 * alltoall's pulls win, 0.85-0.9x). Where they do not, nothing is pulled: since a rank
 * woken with bytes to move spins on (session 55) the ring's hand-offs no longer wait a
 * sleep each, and streaming took 0.5-0.9x a pull's time at most sizes of 1-256 MiB at 4
 * ranks on 2 CPUs, the pull ahead only for the alltoall at 4-16 MiB and the broadcast at
 * 16 or 256 MiB, by 8-35 % (session 60; pulls had won there from 128 KiB). */
#define SHM_CMA_HINT_AUTO ((size_t)-1)
#define SHM_CMA_HINT_SPARE ((size_t)16 << 20)
#define SHM_CMA_HINT_CROWDED ((size_t)0)
/* TUTTI_SHM_NT_STORES: how a sender stores a step of SHM_NT_MIN or more into the ring */
#define SHM_NT_OFF 0  /* through the cache */
#define SHM_NT_ON 1   /* streamed past it */
#define SHM_NT_AUTO 2 /* the faster of the two as measured, per link */
/* tp->reserve: MADV_POPULATE_WRITE on the mapping (Linux 5.14; a full /dev/shm is an
 * error, not SIGBUS), else posix_fallocate on the segment's descriptor, which each end
 * then keeps until the pair's first use (one more open file per local peer) */
/* TUTTI_SHM_RESERVE_AT: when a pair's rings are reserved (room_check) */
enum { SHM_AT_AUTO, SHM_AT_SETUP, SHM_AT_FIRST_USE };
#define SHM_RESERVE_AUTO 0
#define SHM_RESERVE_MADVISE 1
#define SHM_RESERVE_FALLOCATE 2
#define SHM_NT_MIN ((size_t)16 << 10)
/* auto: the way that costs the sender less, streamed only if under 1/SHM_NT_MARGIN of
 * the cached way's cost; every SHM_NT_EXPLORE-th step takes the other way, to time it */
#define SHM_NT_EXPLORE 64u
#define SHM_NT_MARGIN 1.5f

/* auto's bookkeeping: a step took `sample` cycles a KiB the way `nt` says. cost[2] holds
 * each way's running estimate (0: none yet), last[2] its latest sample. What counts is
 * the lower of the sample and the one before it, so one step that a preemption slowed
 * counts for nothing, while a slow state counts from its second step: believed half
 * way when lower than the estimate, a quarter of the way (at most 4x it) when higher.
 * Returns the way to use: 1 to stream. */
static inline int shm_nt_learn(float cost[2], float last[2], int nt, float sample)
{
    float s = last[nt] > 0.0f && last[nt] < sample ? last[nt] : sample, *e = &cost[nt];
    last[nt] = sample;
    if (*e == 0.0f)
        *e = s;
    else if (s < *e)
        *e = (*e + s) / 2;
    else
        *e += ((s < 4 * *e ? s : 4 * *e) - *e) / 4;
    return cost[0] > 0.0f && cost[1] > 0.0f && cost[1] * SHM_NT_MARGIN < cost[0];
}

#define SHM_CPU_WORDS 16 /* 1024 CPUs, as cpu_set_t */

/* A record in a ring: 64-byte aligned, so a header never wraps. The stamp, written last
 * (release), is the record's stream position XOR the direction's key: the receiver polls
 * the record's own line for it instead of the sender's head, one cache line from the
 * sender to the receiver per small message instead of two. A stale line from an earlier
 * lap (a header at another position, or payload) carries another value, short of a
 * 2^-64 chance for payload bytes, as the key is random. A SHM_REC_CMA record's payload
 * is the sender's buffer address (8 bytes at SHM_HDR_BYTES). */
typedef struct shm_hdr {
    uint16_t magic;
    uint16_t type;
    uint32_t flags;         /* SHM_HDR_WHOLE */
    uint64_t len;           /* the message's length */
    uint64_t env[4];        /* its envelope */
    _Atomic uint64_t stamp; /* position ^ key: the header (and, whole, the record) is there */
} shm_hdr_t;
_Static_assert(sizeof(shm_hdr_t) == SHM_HDR_BYTES, "record header layout");

/* A short record (SHM_REC_SHORT): a message of SHM_INLINE_ONE_LINE + 1 to SHM_SHORT_MAX
 * bytes, which after a whole header would spill into a second line. Its first line holds
 * the length, a 64-bit digest of the envelope (shm_env_digest) and the whole payload
 * around the stamp, which sits where a header's does; the envelope itself goes in the
 * second line, which the receiver reads only where the digest or length differs from its
 * receive's (to describe the mismatch) or for a probe. One line from the sender to the
 * receiver per message instead of two: a 2-rank 16-byte broadcast over shm took 0.55 us
 * with the envelope in the first line and the payload in the second (docs/internals.md,
 * "Short records"). Written whole, at once (2 lines). */
#define SHM_INLINE_ONE_LINE (SHM_LINE - SHM_HDR_BYTES) /* inline bytes a header's line holds */
#define SHM_SHORT_LO 32                                /* payload bytes before the stamp */
#define SHM_SHORT_MAX (SHM_SHORT_LO + SHM_LINE - SHM_HDR_BYTES) /* 40 */
_Static_assert(SHM_SHORT_MAX == 40, "short record payload");
typedef struct shm_short {
    uint16_t magic;
    uint16_t type;
    uint32_t len;
    uint64_t digest;                            /* shm_env_digest of its envelope */
    unsigned char lo[SHM_SHORT_LO];             /* payload bytes 0..31 */
    _Atomic uint64_t stamp;                     /* as shm_hdr_t's, at the same offset */
    unsigned char hi[SHM_LINE - SHM_HDR_BYTES]; /* payload bytes 32..39 */
} shm_short_t;
_Static_assert(sizeof(shm_short_t) == SHM_LINE, "short record layout");
_Static_assert(offsetof(shm_short_t, stamp) == offsetof(shm_hdr_t, stamp), "stamp offset");

/* The envelope's digest: each word through a bijective mixer into the next, so two
 * envelopes that differ in one word always differ here, and in several words match by a
 * 2^-64 chance. */
static inline uint64_t shm_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}
static inline uint64_t shm_env_digest(const uint64_t env[4])
{
    uint64_t h = shm_mix64(env[0] ^ 0x9e3779b97f4a7c15ull);
    h = shm_mix64(h ^ env[1]);
    h = shm_mix64(h ^ env[2]);
    return shm_mix64(h ^ env[3]);
}

/* How a doorbell's owner sleeps (its `sleeping`): not at all (0), on the futex, or armed
 * (the ABI's arm(): in poll() on its wake-up socket, with other transports' descriptors). */
#define SHM_SLEEP_FUTEX 1u
#define SHM_SLEEP_FD 2u

/* A rank's doorbell: every sender bumps `seq` and wakes its owner only while the owner
 * announced in `sleeping` that it sleeps, and how: FUTEX_WAKE on `seq`, or a byte down
 * the owner's wake-up socket (a datagram socket beside the segments, "...-wake"). */
typedef struct shm_bell {
    _Alignas(SHM_LINE) _Atomic uint32_t seq;
    _Atomic uint32_t sleeping;                    /* 0 or SHM_SLEEP_* */
    _Alignas(SHM_LINE) _Atomic uint32_t attached; /* set-up: peers that mapped it */
    _Atomic uint32_t state; /* set-up: SHM_SETUP_BUSY, then READY or FAILED (shm_setup.c) */
    uint32_t magic;
    int32_t owner;
    _Atomic uint32_t wake_ok;      /* set-up: the owner made its wake-up socket */
    _Atomic uint32_t wake_missing; /* set-up: peers that could not open it (the owner
                                      then never sleeps armed) */
    _Atomic uint32_t locked;       /* set-up: the owner holds an OFD lock on byte 0 of
                                      this segment for its life (shm_setup.c, bell_lock) */
    /* the CPU the owner last waited on (-1: not known); written when it changes */
    _Alignas(SHM_LINE) _Atomic int32_t cpu;
    /* set-up: the CPUs the owner may run on (a bit per CPU, SHM_CPU_WORDS words), written
     * before its record goes to the store */
    uint64_t cpus[SHM_CPU_WORDS];
} shm_bell_t;

/* One direction of a pair: sender -> receiver. Each line has one writer. */
typedef struct shm_dir {
    /* written by the sender */
    _Alignas(SHM_LINE) _Atomic uint64_t head; /* bytes published */
    /* written by the receiver */
    _Alignas(SHM_LINE) _Atomic uint64_t tail; /* bytes consumed */
    _Atomic uint64_t acked;                   /* single-copy records pulled */
    _Atomic uint64_t pulled;                  /* bytes of the pulls begun so far */
    _Atomic uint32_t cma_ok;                  /* 0 unknown, 1 pull works, 2 refused */
    /* written by the sender, rarely */
    _Alignas(SHM_LINE) uint64_t probe_addr; /* &probe_val in the sender's mapping */
    uint64_t probe_val;                     /* random: proves the pid is the sender */
    uint64_t key;                           /* records' stamps (shm_hdr_t), random, set-up */
    _Atomic uint32_t revoked;               /* the sender withdrew unacked pulls */
    _Atomic uint32_t broken;                /* ... or cut a message: nothing more comes */
    _Atomic uint32_t closed; /* the sender destroyed its transport: nothing comes after what
                                the ring holds, and nothing sent to it is read */
    /* the sender's failure report (seqlock: odd while being written) */
    _Alignas(SHM_LINE) _Atomic uint32_t err_seq;
    _Atomic uint32_t err_set;
    int32_t err_status;
    char err_msg[SHM_MAX_ERRMSG + 1];
} shm_dir_t;

/* The segment of a pair (lo < hi), created by lo: a header, dir[0] for lo -> hi,
 * dir[1] for hi -> lo, then the two rings (ring_bytes each, page aligned). */
typedef struct shm_pair {
    _Alignas(SHM_LINE) uint32_t magic;
    uint32_t version;
    int32_t lo, hi;
    uint64_t ring_bytes;
    uint64_t rings_off;
    _Atomic uint32_t attached; /* hi mapped it */
    shm_dir_t dir[2];
} shm_pair_t;

typedef struct shm_tp shm_tp_t;

typedef struct shm_link {
    shm_tp_t *tp;
    int peer;
    int served;
    pid_t pid;
    int pidfd;                     /* -1: liveness through /proc */
    int unwatched;                 /* neither pidfd nor /proc sees it: never "gone" */
    int bell_fd;                   /* its doorbell, where the lock on it is the watch (another pid
                    namespace), or -1 */
    unsigned long long start_time; /* /proc/PID/stat field 22, for the fallback */
    char addr[48];
    /* shared */
    shm_pair_t *seg;
    size_t seg_bytes;
    int seg_fd; /* SHM_RESERVE_FALLOCATE: the pair's segment until its rings are reserved
                   (shm_link_activate), or -1 */
    int active; /* the rings are reserved and mapped: the link may touch them */
    shm_dir_t *tx, *rx;
    unsigned char *txring, *rxring;
    uint64_t cap, mask;
    shm_bell_t *peer_bell;
    size_t peer_bell_bytes;
    int peer_wake_fd; /* connected to the peer's wake-up socket, or -1 */
    /* link state */
    tp_link_fail_t fail;
    int peer_dead;  /* its process is gone (seen by a liveness check) */
    int progressed; /* moved something in this sweep */
    int notify;     /* published something the peer may sleep on */
    int cma;        /* sender side: -1 unknown, 0 stream, 1 pull */
    /* send side */
    tp_req_t *sq_head, *sq_tail; /* queued, the head possibly half written */
    tp_req_t *aq_head, *aq_tail; /* pulls published, waiting for their ack */
    uint64_t tx_pos, tx_tail_seen;
    uint64_t tx_pf; /* ring lines before this position were prefetched for writing */
    uint64_t tx_rec, tx_span, tx_sent; /* current record: start, size, bytes written */
    int tx_cur_cma;
    int tx_started;
    int tx_broken; /* a message was cut or withdrawn: nothing more goes */
    uint64_t cma_sent;
    uint64_t pulled_seen; /* the receiver's `pulled` when we last looked */
    /* how ring_put stores a step (TUTTI_SHM_NT_STORES auto, docs/internals.md "Stores
     * into the ring"): cycles per KiB of cached (0) and streamed (1) puts, running
     * estimates (0: none yet), and the way in use */
    float put_cost[2];
    float put_last[2];    /* each way's latest sample */
    unsigned nt_puts;     /* puts of SHM_NT_MIN or more so far */
    unsigned nt_streamed; /* of which streamed */
    int nt_on;
    /* receive side */
    tp_req_t *rq_head, *rq_tail;
    tp_uxq_t ux; /* messages buffered for a channel with no receive posted (kit/chan.h) */
    uint64_t rx_pos, rx_head_seen;
    unsigned rx_misses;      /* rec_ready's looks that found no stamp */
    uint64_t tx_key, rx_key; /* the directions' stamp keys */
    shm_hdr_t rhdr;
    uint64_t raddr;   /* rhdr's SHM_REC_CMA address */
    uint64_t rdigest; /* rhdr's SHM_REC_SHORT digest of the envelope */
    int renv_later;   /* rhdr.env is not read yet (a short record's second line) */
    int rhdr_valid;   /* rhdr holds the record at rx_pos (maybe parked) */
    int rhdr_matched;
    int probe_watch; /* probe found nothing: a record that comes ends progress() */
    uint64_t rx_span, rx_got;
    uint64_t rx_acked;
    uint64_t rx_pulled;      /* what we published in rx->pulled */
    int rx_withdrawn;        /* the matched pull was revoked by the sender */
    uint64_t broken_seen_ns; /* when we found the sender's direction broken */
} shm_link_t;

struct shm_tp {
    const tutti_tp_host_v1_t *host;
    int rank, nranks;
    shm_link_t *links;
    shm_bell_t *bell; /* ours */
    size_t bell_bytes;
    int bell_fd;   /* ours, holding its lock, or -1 */
    int published; /* our record "shm/<rank>" is in the store */
    char why[320]; /* set-up: the last error it reported (a failed record carries it) */
    int wake_fd;   /* our wake-up socket, or -1: arm() unsupported */
    int wake_self; /* connected to it, for abort() */
    int armed;     /* arm() announced SHM_SLEEP_FD: the next progress() disarms */
    int look_head; /* rec_ready reads the head at every look (before a sleep) */
    atomic_int aborted;
    unsigned long completions;
    unsigned long pulls_moved; /* pulls of our buffers seen to begin */
    unsigned long steps_moved; /* ring steps this rank wrote or read */
    uint64_t pull_bytes;       /* the bytes of the last one seen */
    size_t cma_min;            /* TUTTI_SHM_CMA_BYTES: messages this large are pulled
                            with process_vm_readv where the peer allows it; 0 never */
    size_t cma_hint_min;       /* TUTTI_SHM_CMA_HINT_BYTES: the same for requests hinted
                            TUTTI_TP_HINT_SINGLE_COPY; 0 never; SHM_CMA_HINT_AUTO until
                            set-up resolves it */
    size_t ring_bytes;         /* of the rings this rank creates (its pairs with higher ranks) */
    int keep_cpu;              /* TUTTI_BIND=none: no move off a CPU (spin()) */
    int ring_auto;             /* TUTTI_SHM_RING_BYTES unset or auto: ring_fit may shrink them */
    size_t step;               /* TUTTI_SHM_STEP_BYTES: ring copies go in steps of this */
    int nt_stores;             /* TUTTI_SHM_NT_STORES: SHM_NT_OFF, SHM_NT_ON or SHM_NT_AUTO */
    int eager;         /* /dev/shm is tight: every pair's rings reserved in set-up (room_check) */
    uint64_t promised; /* bytes of rings this transport may still take (room_check) */
    /* TUTTI_SHM_RESERVE: how a pair's rings are reserved at its first use,
     * SHM_RESERVE_MADVISE or _FALLOCATE (AUTO until set-up asks the kernel) */
    int reserve;
    int reserve_at; /* TUTTI_SHM_RESERVE_AT: SHM_AT_AUTO, SHM_AT_SETUP or SHM_AT_FIRST_USE */
    int prefetchw;  /* the CPU has PREFETCHW (CPUID 0x80000001 ECX bit 8) */
    int liveness_ms;
    int oversubscribed;   /* more local ranks than CPUs: yield while spinning */
    unsigned spin_misses; /* waits in a row the brief pure spin did not end */
    unsigned spin_probe;
    int cpu;               /* the CPU we last waited on, as published in our bell */
    unsigned moves;        /* times we moved to another CPU */
    uint64_t next_move_ns; /* not before this */
    uint64_t next_look_ns; /* oversubscribed: even_out_cpus not before this */
    uint64_t next_liveness_ns;
    /* names still linked (unlinked as soon as the peers mapped them) */
    char bell_name[64];
    char wake_path[96]; /* the wake-up socket's path, until unlinked */
    char **pair_names;  /* nranks entries, for the pairs this rank created */
    pid_t pid;
    uint64_t nonce;
    struct pollfd *pfds; /* liveness: one per peer with a pidfd */
    int *pfd_peer;
    int npfds;
};

/* Fuzzing and tests only (fuzz/fuzz_shm_ring.c): a transport whose link to rank 1
 * receives through the direction rx and its ring (cap bytes, a power of two) as a peer
 * fills them: the receives reqs are posted on it and the link is swept; after every sweep
 * publish(ctx) may write more (head, the ring, the report), and returns 0 once the peer
 * is done. What is left is cancelled. The peer's process is this one (single-copy pulls
 * read its memory). host: rank 0 of at least 2. step: TUTTI_SHM_STEP_BYTES (>= SHM_LINE).
 * start: the stream position reading begins at (a multiple of SHM_LINE). Returns how
 * many messages were read aside (kit/chan.h: of another key than the receives'), or -1
 * when it could not set up. */
int shm_recv_fuzz_input(const tutti_tp_host_v1_t *host, shm_dir_t *rx, unsigned char *ring,
                        uint64_t cap, size_t step, uint64_t start, tp_req_t *reqs, size_t nreqs,
                        int (*publish)(void *ctx), void *ctx);

/* shm_setup.c */
int shm_setup(shm_tp_t *tp);
void shm_teardown(shm_tp_t *tp);
/* A pair's rings are reserved in /dev/shm and mapped at the link's first use, not at
 * set-up (a job uses few of its pairs unless it exchanges with every rank): reserve and
 * map them now if not yet. 0, or an error (reported, naming the peer) when /dev/shm has
 * no room left for them. */
int shm_link_activate(shm_tp_t *tp, shm_link_t *L);
/* 1 if the peer's process is gone. */
int shm_peer_gone(shm_link_t *L);
/* Poll every peer with pending work (or all with `all`); marks peer_dead. */
void shm_check_liveness(shm_tp_t *tp, int all);
long shm_futex(_Atomic uint32_t *addr, int op, uint32_t val, int timeout_ms);

#endif /* SHM_SHM_H */
