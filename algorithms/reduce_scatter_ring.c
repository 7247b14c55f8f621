/* Ring reduce-scatter: step t (of n-1) sends the partial result of block
 * (rank - t - 1) to the next rank and receives that of block (rank - t - 2) from the
 * previous one, reducing this rank's input block into it; the last step receives this
 * rank's own block, which then holds everybody's contribution. Every rank sends and
 * receives (n-1)/n of the input once: bandwidth optimal. Any layout (reduce_scatterv):
 * message sizes come from recvcounts.
 *
 * The body is tt_ring_rs (common.c). Blocks travel in pieces of chunk_bytes (common.h),
 * pipelined across steps as in the ring allreduce: the receives stream through two
 * piece-sized slots, two pieces ahead, and each piece is reduced while still in cache
 * and forwarded at once as the next step's piece. Partial results live in two scratch
 * halves used in turn (step t reduces into half t & 1, which step t+1 sends from);
 * before step t+1 writes a half, step t's sends, which read it, are waited for. Step 0
 * sends straight from the input. Out of place the last step reduces straight into
 * recvbuf. In place the result goes to the start of the input buffer, which other
 * blocks' input may still occupy until the last step: it is written only at the end.
 * Operand order: block b's partial result starts at rank b+1 and grows around the ring,
 * fixed for a given rank count.
 */
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

#include "common.h"

int tt_reduce_scatter_ring(tt_op_t *op)
{
    /* every step waits for its send and its receive alike: nothing to overlap */
    op->tp_hints |= TUTTI_TP_HINT_SINGLE_COPY;
    const tt_blocks_t blk = { .cnt = op->recvcounts, .dsp = op->rdispls };
    const int in_place = op->sendbuf == op->recvbuf;
    const unsigned char *out = NULL;
    TT_CHECK(tt_ring_rs(op, &blk, 0, in_place ? NULL : op->recvbuf, &out));
    /* every send is done and the input fully read */
    const size_t len = op->recvcounts[op->rank];
    if (in_place && len)
        memcpy(op->recvbuf, out, len * op->elem_size);
    return TUTTI_OK;
}
