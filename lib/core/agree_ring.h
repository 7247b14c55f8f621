/* The rooted calls' agreement records as failure paths read them (agree_ring.c): below
 * p2p.c, which asks tt_agree_failed when the stall check found nothing else. */
#ifndef TT_AGREE_RING_H
#define TT_AGREE_RING_H

#include "core/agree_types.h"
#include "core/op.h"

struct tutti_comm;
/* The k-th record from the oldest. */
tt_agree_rec_t *tt_agree_at(struct tutti_comm *comm, int k);
/* op, described as the call c (an earlier one) */
tt_op_t tt_agree_as_call(const tt_op_t *op, const tt_agree_call_t *c);
/* A record's requests: 1 when all completed, 0 when some are still posted, < 0 (the
 * failed one in *bad_p) when one failed. */
int tt_agree_rec_state(tt_agree_rec_t *rec, tt_req_t **bad_p);
/* Fail op with a record's failure, described as the earlier call's. */
int tt_agree_rec_fail(tt_op_t *op, tt_agree_rec_t *rec, tt_req_t *bad);
/* Whether any record in the ring failed, reaping nothing: < 0 when one did (op fails
 * with it, named as the earlier call's), else TUTTI_OK. For the stall check: a receive
 * of op queued on a link behind a failed agreement message never completes (the
 * transport stops reading a link at a mismatch), and op would wait out its timeout. */
int tt_agree_failed(tt_op_t *op);

#endif /* TT_AGREE_RING_H */
