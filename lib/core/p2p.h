/* The internal point-to-point API that algorithms are written against. Algorithms
 * never see sockets or transports: they post sends and receives to peer ranks, wait
 * for them, and reduce. Messages between two ranks match in posting order; each
 * carries an envelope (sequence number, the collective's fingerprint, algorithm id and
 * a tag the algorithm chooses), checked on arrival, so ranks that disagree get
 * TUTTI_ERR_MISMATCH instead of wrong data.
 *
 * Error rule: when a tt_p2p_* call fails it has already cancelled every posted request
 * of the operation, so the algorithm just returns the status. An algorithm that fails
 * for another reason while requests are posted calls tt_p2p_fail(op, status) first.
 */
#ifndef TT_P2P_H
#define TT_P2P_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/op.h"

/* Post a send of len bytes to peer / a receive of len bytes from peer. tag tells
 * messages of one collective apart (e.g. step and chunk); both sides must use the same
 * tag for the same message. */
int tt_p2p_send(tt_op_t *op, int peer, const void *buf, size_t len, uint32_t tag, tt_req_t *req);
int tt_p2p_recv(tt_op_t *op, int peer, void *buf, size_t len, uint32_t tag, tt_req_t *req);

/* Wait for one / all of n requests (bounded by the operation's deadline). */
int tt_p2p_wait(tt_op_t *op, tt_req_t *req);
int tt_p2p_wait_all(tt_op_t *op, tt_req_t *reqs, size_t n);

/* One step of progress while req is pending, bounded by the op's deadline: < 0 when
 * the op failed (timed out, a link failed), described as req's wait. */
int tt_p2p_progress(tt_op_t *op, tt_req_t *req);

/* An op's request array: up to TT_REQS_FEW requests in the holder (on the caller's
 * stack), more from the heap. A small call is a few hundred nanoseconds over shm, and a
 * malloc and free per call was a tenth of that. tt_reqs_get returns n requests that
 * read as complete (status 0) until posted, so that a wait may pass over one never
 * posted; posting sets the rest (NULL when out of memory); tt_reqs_put frees what get
 * allocated. */
#define TT_REQS_FEW 8
typedef struct tt_reqs {
    tt_req_t few[TT_REQS_FEW];
    tt_req_t *heap;
} tt_reqs_t;
tt_req_t *tt_reqs_get(tt_reqs_t *r, size_t n);
static inline void tt_reqs_put(tt_reqs_t *r)
{
    if (r->heap) { /* inline, and no free(NULL) through the PLT on every small call */
        free(r->heap);
        r->heap = NULL;
    }
}

/* Cancel every posted request of op and record status; returns status. */
int tt_p2p_fail(tt_op_t *op, int status);

/* A scratch buffer of at least bytes bytes, owned by the communicator and reused
 * across operations (valid until the operation ends). NULL if out of memory: get it
 * before posting anything. Index 0 and 1 are two independent buffers. */
void *tt_op_scratch(tt_op_t *op, int index, size_t bytes);

#endif /* TT_P2P_H */
