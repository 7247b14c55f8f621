/* ibverbs transport internals. The design is described at the top of ib.c; set-up
 * (device, GID, queue pairs, the store exchange) is in ib_setup.c, the memory
 * registration cache in ib_mr.c. Only the ABI header and libibverbs are used. */
#ifndef IB_IB_H
#define IB_IB_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <infiniband/verbs.h>

#include "../kit/chan.h"
#include "../kit/link.h"
#include "../kit/queue.h"
#include "../kit/util.h"

#define IB_MAGIC 0x42495454u      /* "TTIB": slot headers */
#define IB_ADDR_MAGIC 0x52444154u /* the record each rank publishes */
#define IB_LAZY_MAGIC 0x5a4c4954u /* the record of a rank that connects lazily */
#define IB_UD_MAGIC 0x55444954u   /* a connection datagram (TUTTI_IB_CONNECT=lazy) */
#define IB_VERSION 2u             /* 2: rd_atom */
#define IB_HDR_BYTES 64u
#define IB_ERRBOX_BYTES 2048u /* an incoming error report lands here (ring's tail) */
#define IB_MAX_ERRMSG (IB_ERRBOX_BYTES - 1)
#define IB_SQ_RESERVE 4u /* send-queue entries kept for control and error writes */

/* ---- on the wire (little-endian hosts; checked through the published record) ---- */

enum { IB_MSG_EAGER = 1, IB_MSG_RTS = 2 };

/* The head of every ring slot. EAGER: len bytes of payload follow. RTS (ready to
 * send): the payload stays in the sender's registered buffer at addr/rkey, for the
 * receiver to RDMA READ. */
typedef struct ib_hdr {
    uint32_t magic;
    uint16_t kind;
    uint16_t flags;
    uint32_t rkey;
    uint32_t reserved;
    uint64_t len;
    uint64_t addr;
    uint64_t env[4];
} ib_hdr_t;

/* Immediate data of every RDMA WRITE WITH IMMEDIATE: type (4 bits), then two 14-bit
 * fields. DATA: a slot was written; CTRL: nothing written; both carry returned credits
 * and FINs (RDMA READs of this side's buffers that the peer completed). ERROR: the
 * error box was written; the low bits hold -status. NOP: a keep-alive probe. */
enum { IB_IMM_DATA = 1, IB_IMM_CTRL = 2, IB_IMM_ERROR = 3, IB_IMM_NOP = 4 };
#define IB_IMM_FIELD_MAX 0x3fffu

/* What each rank publishes under ib/addr/<rank>: its port, then one entry per rank. */
typedef struct ib_addr_rec {
    uint32_t magic;
    uint32_t version;
    int32_t rank;
    int32_t nranks;
    uint32_t slots;
    uint32_t slot_bytes;
    uint16_t lid;
    uint8_t mtu;        /* enum ibv_mtu */
    uint8_t link_layer; /* IBV_LINK_LAYER_* */
    uint32_t gid_index;
    uint8_t gid[16];
    char dev[32];
    uint8_t rd_atom; /* RDMA reads this rank's queue pairs take in flight (responder
                        resources): a peer's initiator depth toward it stays within */
    uint8_t reserved8[3];
} ib_addr_rec_t;

typedef struct ib_peer_rec {
    uint32_t qpn;
    uint32_t psn;
    uint64_t ring_addr;
    uint32_t ring_rkey;
    uint32_t reserved;
} ib_peer_rec_t;

/* Lazily (TUTTI_IB_CONNECT=lazy) ib/addr/<rank> is the port record (magic
 * IB_LAZY_MAGIC) and this: the rank's connection queue pair (UD), which takes the
 * datagrams below. */
typedef struct ib_ud_rec {
    uint32_t qpn;
    uint32_t qkey;
} ib_ud_rec_t;

/* A connection datagram (ib_lazy.c). REQ: "connect your queue pair for me to this one"
 * (the sender's port record, QP, PSN and ring); REP: the same from the rank that did,
 * which can receive from then on; REJ: a REQ refused, qp.reserved saying why (IB_REJ_*;
 * the qp fields otherwise zero). mac: HMAC-SHA256 of the job secret over the fields (as
 * text, ud_context in ib_lazy.c) and nonce, where the job has a secret (auth 1; never
 * on a REJ, which may answer a rank with another secret). */
enum { IB_UD_REQ = 1, IB_UD_REP = 2, IB_UD_REJ = 3 };
enum { IB_REJ_PROOF = 1, IB_REJ_NO_PROOF = 2, IB_REJ_UNWANTED_PROOF = 3 };
typedef struct ib_ud_msg {
    uint32_t magic;
    uint16_t kind;
    uint16_t auth;
    int32_t from, to;
    uint64_t instance; /* FNV-1a of the job instance */
    ib_addr_rec_t port;
    ib_peer_rec_t qp;
    uint8_t nonce[32];
    uint8_t mac[32];
} ib_ud_msg_t;
#define IB_UD_GRH 40u /* a UD receive starts with the global routing header */

/* ---- the memory registration cache (ib_mr.c) ---- */

enum {
    IB_MRC_OFF = 0,     /* register per message, deregister when it completes */
    IB_MRC_PAGEMAP = 1, /* cached; each hit checks the pages are still the ones pinned */
    IB_MRC_ODP = 2,     /* cached on-demand-paging MRs: the kernel follows the mappings */
    IB_MRC_TRUST = 3,   /* cached, unchecked: the caller promises not to unmap buffers */
};

typedef struct ib_mr_entry {
    struct ib_mr_entry *prev, *next; /* LRU list, most recent first */
    uintptr_t start, end;            /* page-aligned range registered */
    struct ibv_mr *mr;
    int access;
    int refs;
    int cached;    /* in the list (else freed on the last put) */
    uint64_t *pfn; /* IB_MRC_PAGEMAP: the page frames pinned, one per page */
} ib_mr_entry_t;

typedef struct ib_mrc {
    struct ibv_pd *pd;
    int mode;
    size_t limit_bytes;
    size_t bytes;
    int entries;
    ib_mr_entry_t *head, *tail;
    size_t page;
    int pagemap_fd;
    pid_t pagemap_pid;
    unsigned long hits, misses, invalidations, evictions;
} ib_mrc_t;

/* mode: "auto" (NULL), "off", "pagemap", "odp", "trust"; odp_ok: the device can do
 * on-demand paging for RC READ. Writes a reason to err when the mode cannot be had. */
int ib_mrc_init(ib_mrc_t *c, struct ibv_pd *pd, const char *mode, size_t limit_bytes, int odp_ok,
                char *err, size_t errlen);
/* A registration covering [addr, addr+len) for the peer to READ (remote_read) or for us
 * to write into (local_write); holds a reference until ib_mrc_put. errno on failure. */
int ib_mrc_get(ib_mrc_t *c, const void *addr, size_t len, int local_write, ib_mr_entry_t **e_p);
/* ib_mrc_get for memory the transport frees itself (a buffered message, kit/chan.h): a
 * registration of its own, kept out of the cache (trust mode would take a later buffer
 * at the same address for it); ib_mrc_put ends it. */
int ib_mrc_get_once(ib_mrc_t *c, const void *addr, size_t len, ib_mr_entry_t **e_p);
void ib_mrc_put(ib_mrc_t *c, ib_mr_entry_t *e);
void ib_mrc_destroy(ib_mrc_t *c);
const char *ib_mrc_mode_name(int mode);

/* ---- the transport ---- */

typedef struct ib_tp ib_tp_t;

enum { IB_WR_DATA = 1, IB_WR_CTRL, IB_WR_READ, IB_WR_ERROR, IB_WR_NOP };

/* One posted send-queue work request; completions come back in this order. */
typedef struct ib_sqe {
    uint8_t kind;
    uint8_t last;      /* READ: the last chunk of its receive */
    tp_req_t *req;     /* READ: the receive it fills (NULL once given up) */
    ib_mr_entry_t *mr; /* READ, last chunk: the destination's registration */
} ib_sqe_t;

typedef struct ib_link {
    ib_tp_t *tp;
    int peer;
    int served;
    struct ibv_qp *qp;
    uint32_t psn;
    char addr[96];
    tp_link_fail_t fail;
    /* the peer's ring */
    uint64_t r_ring;
    uint32_t r_rkey;
    /* our ring (the peer writes into it) and our staging slots (we write from them) */
    char *ring;
    struct ibv_mr *ring_mr;
    char *stage;
    struct ibv_mr *stage_mr;
    /* send side */
    tp_req_t *sq_head, *sq_tail;   /* posted sends not yet written */
    tp_req_t *fin_head, *fin_tail; /* RTS written, waiting for the peer's READ */
    uint64_t tx_seq;
    unsigned credits;      /* free slots in the peer's ring */
    unsigned credits_owed; /* slots of our ring freed, not yet returned */
    unsigned fins_owed;    /* the peer's buffers we finished reading, not yet said */
    ib_sqe_t *sqe;         /* ring of posted send WRs */
    unsigned sqe_head, sqe_count, sq_depth;
    /* receive side */
    tp_req_t *rq_head, *rq_tail; /* posted receives not yet matched */
    tp_uxq_t ux; /* messages buffered for a channel with no receive posted (kit/chan.h) */
    uint64_t rx_arrived, rx_next; /* slots written by the peer / consumed */
    unsigned rq_depth;
    unsigned reads;   /* receives being READ */
    tp_req_t *rd_req; /* the receive whose READs are being posted */
    ib_mr_entry_t *rd_mr;
    size_t rd_off;
    uint64_t rd_raddr;
    uint32_t rd_rkey;
    int rd_posted_last;
    int qp_stopped; /* moved to the error state by us */
    /* connecting (always IB_CONN_UP with peer_ready eagerly; lazily: ib_lazy.c) */
    int conn;           /* IB_CONN_* */
    int peer_ready;     /* the peer's QP can receive: we may write */
    int hello_owed;     /* tell the peer we can receive (a zero-credit control write) */
    int wanted;         /* a request waits for the connection (counted in tp->lazy_waiting) */
    int have_rec;       /* prec and ud are the peer's published ones */
    ib_addr_rec_t prec; /* the peer's port */
    ib_ud_rec_t ud;     /* the peer's connection QP */
    struct ibv_ah *ah;  /* to the peer's connection QP */
    uint32_t r_qpn;     /* the peer's QP this one is connected to */
    unsigned tries;
    uint64_t next_try_ns, deadline_ns;
    int rec_status;    /* the last store read of the peer's record, while it fails */
    uint8_t nonce[32]; /* this link's REQs and REPs carry it; a REJ must echo it */
    int error_sent;
    int nop_inflight;
    uint64_t last_heard_ns;
} ib_link_t;

enum { IB_CONN_NONE = 0, IB_CONN_ASKING = 1, IB_CONN_UP = 2 };

struct ib_tp {
    const tutti_tp_host_v1_t *host;
    int rank, nranks;
    ib_link_t *links;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    int cq_size;
    unsigned cq_unacked;
    char dev_name[64];
    int port;
    int gid_index;
    union ibv_gid gid;
    uint16_t lid;
    uint8_t link_layer;
    enum ibv_mtu mtu;
    uint32_t max_msg; /* bytes per READ work request */
    int rd_init;      /* RDMA reads this rank's queue pairs issue in flight (initiator depth):
                    the device's, at most TUTTI_IB_MAX_RD_ATOMIC */
    int rd_resp;      /* reads they take in flight (responder resources), the same way */
    uint32_t max_inline;
    unsigned slots;    /* ring slots per peer */
    size_t slot_bytes; /* header + eager payload */
    size_t eager_max;
    int qp_timeout; /* local ACK timeout exponent: 4.096 us * 2^t */
    int keepalive_ms;
    int wake_fd; /* eventfd: abort() wakes a blocked progress() */
    int arm_fd;  /* epoll over the completion channel and wake_fd, for arm(); or -1 */
    atomic_int aborted;
    unsigned long completions;
    ib_mrc_t mrc;
    unsigned long eager_msgs, rdv_msgs;
    int errors_inflight; /* error reports posted, not yet completed */
    /* TUTTI_IB_CONNECT=lazy (ib_lazy.c) */
    int lazy;
    int auth;             /* the job has a secret: datagrams carry a MAC */
    const char *instance; /* the job instance ("" from an older library) */
    uint64_t inst_hash;
    uint32_t qkey;
    struct ibv_qp *ud_qp;
    char *ud_buf; /* IB_UD_RQ receive slots, then IB_UD_SQ send slots */
    struct ibv_mr *ud_mr;
    unsigned ud_sent, ud_sq_busy;
    int lazy_waiting; /* links with wanted set */
    uint64_t lazy_next_ns;
    unsigned long ud_dropped; /* datagrams refused (logged) */
    unsigned ud_flushed;      /* receives of the connection QP flushed (logged once) */
    /* set by ib.c: a link failed / came up (lazily, the set-up code reaches the data
     * path only through these) */
    void (*link_failed)(ib_link_t *L, int status, const char *msg);
};

/* ib_setup.c */
int ib_setup_device(ib_tp_t *tp);
int ib_setup_links(ib_tp_t *tp);
void ib_teardown(ib_tp_t *tp);
const char *ib_mtu_str(enum ibv_mtu m);
/* The QP (in INIT, receives posted), rings and staging slots for L's peer. */
int ib_link_create(ib_tp_t *tp, ib_link_t *L, char *why, size_t whylen);
/* The address of rec's port (its LID, and its GID where routing needs one: RoCE, or a
 * GID set on InfiniBand), for a QP's RTR and the connection QP's address handles. */
void ib_ah_attr(const ib_tp_t *tp, const ib_addr_rec_t *rec, struct ibv_ah_attr *a);
/* L's QP through RTR to RTS, to the peer's port rec and its QP for us, pr. */
int ib_link_connect(ib_tp_t *tp, ib_link_t *L, const ib_addr_rec_t *rec, const ib_peer_rec_t *pr,
                    char *why, size_t whylen);
/* Rank i's port record (vlen bytes, rec_len expected) agrees with this rank's set-up,
 * including the connect mode. These three return a status, with the reason in why on
 * failure (not reported: the caller does). */
int ib_check_peer_rec(ib_tp_t *tp, int i, const ib_addr_rec_t *pr, size_t vlen, size_t rec_len,
                      char *why, size_t whylen);
void ib_port_rec(const ib_tp_t *tp, ib_addr_rec_t *rec);

/* ib_lazy.c: TUTTI_IB_CONNECT=lazy */
#define IB_UD_BIT (1ull << 62) /* wr_id of the connection QP's work requests */
#define IB_UD_RQ 64u
#define IB_UD_SQ 32u
#define IB_UD_SLOT 512u
/* The connection QP, published with the port record; no peer is read or waited for. */
int ib_lazy_setup(ib_tp_t *tp);
/* A request was posted on L, which is not connected: connect it (from the progress
 * that follows). */
void ib_lazy_need(ib_tp_t *tp, ib_link_t *L);
/* From each sweep while links wait: read addresses, (re)send requests, time out. */
void ib_lazy_tick(ib_tp_t *tp);
/* A completion of the connection QP. */
void ib_lazy_wc(ib_tp_t *tp, const struct ibv_wc *wc);
/* ms until the next thing ib_lazy_tick has to do (or -1: nothing). */
int ib_lazy_sleep_ms(const ib_tp_t *tp);
void ib_lazy_teardown(ib_tp_t *tp);

/* ---- test hooks (tests/test_ibverbs.c links the static internals) ---- */

typedef struct tt_ib_stats {
    unsigned long mr_hits, mr_misses, mr_invalidations, mr_evictions;
    size_t mr_bytes;
    int mr_entries;
    const char *mr_mode;
    unsigned long eager_msgs, rdv_msgs;
    int gid_index;
    int lazy;                 /* TUTTI_IB_CONNECT=lazy */
    int qps;                  /* RC queue pairs made (one a peer eagerly; lazily, as used) */
    unsigned long ud_dropped; /* connection datagrams refused */
} tt_ib_stats_t;

/* The ibverbs transport most recently created in this process (NULL if none). */
void *tt_ib_debug_current(void);
/* Counters of tp (NULL: the current one). */
int tt_ib_debug_stats(void *tp, tt_ib_stats_t *out);
/* Move the queue pair to `peer` into the error state, as a broken link would be. */
int tt_ib_debug_break_qp(void *tp, int peer);
/* The queue pair to peer as the device has it: reads in flight it issues (*init_p) and
 * takes (*resp_p). */
int tt_ib_debug_qp_rd_atomic(void *tp, int peer, int *init_p, int *resp_p);

#endif /* IB_IB_H */
