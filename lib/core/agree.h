/* The rooted collectives' agreement messages checked after their call (agree.c). */
#ifndef TT_AGREE_H
#define TT_AGREE_H

#include "core/agree_types.h"
#include "core/op.h"

/* The agreement messages' tags (algorithms/handshake.c) */
#define TT_CONFIRM_TAG 0x7fff0001u
#define TT_RELEASE_TAG 0x7fff0002u

/* Room for op's nreq agreement requests (zeroed, for tt_p2p_send/recv to post into),
 * after reaping the ring; waits for the oldest record when the ring is full. < 0 when
 * an earlier record failed (op failed with its description) or out of memory. */
int tt_agree_begin(tt_op_t *op, int nreq, tt_req_t **reqs_p);

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
