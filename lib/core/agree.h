/* The rooted collectives' agreement messages checked after their call (agree.c). */
#ifndef TT_AGREE_H
#define TT_AGREE_H

#include "core/op.h"

/* The agreement messages' tags (algorithms/handshake.c) */
#define TT_CONFIRM_TAG 0x7fff0001u
#define TT_RELEASE_TAG 0x7fff0002u

/* A call, as its agreement check names it. */
typedef struct tt_agree_call {
    tt_coll_t coll;
    uint64_t seq, fingerprint, env_count;
    uint32_t algo_id;
    size_t count;
    tutti_dtype_t dtype;
    int root;
} tt_agree_call_t;

/* One record in the communicator's ring: a call's messages, or a batch of confirms or
 * of releases. */
typedef struct tt_agree_rec {
    tt_req_t *reqs; /* cap of them allocated, nreq in use */
    uint64_t *got;  /* the digests received: a confirm batch's root, one from each
                       non-root (cap of them); a release batch's non-root, the root's */
    int nreq, cap;
    tt_agree_call_t call; /* the call (a batch's last), to name it if its check fails */
    int ncalls;           /* calls it checks: 1, or a batch's (from seq0) */
    int batch;            /* a batch: TT_BATCH_CONFIRM (digests checked at its checker) or
                             TT_BATCH_RELEASE (checked at every other rank); 0: one call */
    uint64_t seq0, want;  /* a batch: its first call; its digest (sent, or expected) */
    int checker;          /* a batch: the rank that holds the confirms or sends the
                             releases, its first call's root */
} tt_agree_rec_t;

/* The kinds of batch: a broadcast's or scatter's confirms (non-roots to the root), a
 * reduce's, gather's or scan's releases (the root to the non-roots). */
#define TT_BATCH_CONFIRM 1
#define TT_BATCH_RELEASE 2

/* The calls whose agreement messages are not sent yet (comm->confirm): calls back to
 * back of one kind share one message, whose payload is a digest of every call's
 * envelope; the first call's root is the batch's checker, whatever the later calls'
 * roots. */
typedef struct tt_confirm_batch {
    int n;      /* calls in it (0: none) */
    int kind;   /* TT_BATCH_* */
    int passed; /* ops of no batch that went by since it opened */
    int root;   /* the checker: the first call's root */
    uint64_t seq0, digest;
    tt_agree_call_t last;
} tt_confirm_batch_t;

/* Room for op's nreq agreement requests (zeroed, for tt_p2p_send/recv to post into),
 * after reaping the ring; waits for the oldest record when the ring is full. < 0 when
 * an earlier record failed (op failed with its description) or out of memory. */
int tt_agree_begin(tt_op_t *op, int nreq, tt_req_t **reqs_p);

/* Whether any record in the ring failed, reaping nothing: < 0 when one did (op fails
 * with it, named as the earlier call's), else TUTTI_OK. For the stall check: a receive
 * of op queued on a link behind a failed agreement message never completes (the
 * transport stops reading a link at a mismatch), and op would wait out its timeout. */
int tt_agree_failed(tt_op_t *op);

/* Reap finished records (oldest first); wait for the oldest while the calls they check
 * and `room` more are over agree_lag. < 0 when one failed: op fails with it, named as
 * the earlier call's. */
int tt_agree_settle(tt_op_t *op, int room);

/* A reduce's, gather's or scan's release, checked later: op joins the batch of releases
 * as a broadcast's confirm joins one of confirms (below). */
int tt_agree_release_later(tt_op_t *op);

/* A broadcast's or scatter's confirm, checked later: op joins the batch (sent when it
 * holds TT_CONFIRM_BATCH calls, or at the next op that does not join it). */
int tt_agree_confirm_later(tt_op_t *op);

/* Before op's algorithm runs: the pending batch goes out (posted before any message of
 * op, on every rank alike) where op is of the other kind (`kind`: the TT_BATCH_* op's own
 * agreement message will join, 0 none; it joins a batch of its kind, whatever its root),
 * or is the TT_CONFIRM_BATCH-th (at most agree_lag-th) op of no batch (kind 0) since the
 * batch opened: ops that send no agreement message let it wait for more calls, up to
 * that many. */
int tt_agree_flush(tt_op_t *op, int kind);

struct tutti_comm;
/* At destroy, before the transport closes: wait, within the communicator's timeout, for
 * the agreement messages this rank posted (the batch still waiting is never sent, on
 * any rank alike). A peer that is behind still sends its confirms to a root that has
 * left, or awaits a root's releases: closed first, the link broke under them. A record
 * that fails, times out or differs is logged (TT_WARN), no more: the peers are not
 * told and the store gets no record; tutti_comm_abort ends the wait. */
void tt_agree_drain(struct tutti_comm *comm);

/* Free the ring (the transport is gone: nothing is posted any more). */
void tt_agree_free(struct tutti_comm *comm);

#endif /* TT_AGREE_H */
