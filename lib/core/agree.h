/* The rooted collectives' agreement messages checked after their call (agree.c). */
#ifndef TT_AGREE_H
#define TT_AGREE_H

#include "core/op.h"

/* One call's record in the communicator's ring. */
typedef struct tt_agree_rec {
    tt_req_t *reqs; /* cap of them allocated, nreq in use */
    int nreq, cap;
    tt_coll_t coll; /* the call, to name it if its check fails */
    uint64_t seq, fingerprint, env_count;
    uint32_t algo_id;
    size_t count;
    tutti_dtype_t dtype;
    int root;
} tt_agree_rec_t;

/* Room for op's nreq agreement requests (zeroed, for tt_p2p_send/recv to post into),
 * after reaping the ring; waits for the oldest record when the ring is full. < 0 when
 * an earlier record failed (op failed with its description) or out of memory. */
int tt_agree_begin(tt_op_t *op, int nreq, tt_req_t **reqs_p);

/* Reap finished records (oldest first); wait for the oldest while fewer than `room`
 * slots are free. < 0 when one failed: op fails with it, named as the earlier call's. */
int tt_agree_settle(tt_op_t *op, int room);

/* Free the ring (the transport is gone: nothing is posted any more). */
struct tutti_comm;
void tt_agree_free(struct tutti_comm *comm);

#endif /* TT_AGREE_H */
