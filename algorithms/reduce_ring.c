/* Ring reduce: a ring reduce-scatter (as in allreduce_ring), then every rank sends the
 * block it finished to the root. Each rank sends and receives about (n-1)/n of the
 * vector in the ring plus 1/n to the root, where the tree sends the whole vector log2 n
 * times in sequence: the choice for large messages.
 *
 * The vector is cut into n blocks (count/n elements, the remainder spread over the
 * first blocks). The reduce-scatter is tt_ring_rs (common.c: blocks in pieces, each
 * reduced as it lands), shifted by one: step t (of n-1) sends block (rank - t) and
 * receives block (rank - t - 1), so that rank r finishes block r + 1. Partial results
 * start at the block's own rank and grow around the ring, so the operand order is fixed
 * for a given rank count (not for the root, unlike the tree's).
 *
 * The root's input is only read during the ring, and the blocks are received into its
 * recvbuf only after it, so in place needs nothing special.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

#include "common.h"

int tt_reduce_ring(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank, root = op->root;
    const size_t es = op->elem_size, count = op->count;

    if (count == 0)
        return TUTTI_OK;

    /* the root's own block straight into recvbuf, unless in place (its input may be
     * read until the ring ends) */
    const tt_blocks_t blk = { .count = count };
    const unsigned char *out = NULL;
    unsigned char *dst = NULL;
    if (r == root && op->sendbuf != op->recvbuf)
        dst = (unsigned char *)op->recvbuf + tt_blocks_off(&blk, n, (r + 1) % n) * es;
    TT_CHECK(tt_ring_rs(op, &blk, 1, dst, &out));

    /* rank j finished block j + 1 */
    const uint32_t tag = (uint32_t)0xfffffff0u; /* apart from the ring's piece tags */
    tt_req_t req[1];
    if (r != root) {
        size_t len = tt_blocks_len(&blk, n, (r + 1) % n);
        if (!len)
            return TUTTI_OK;
        TT_CHECK(tt_p2p_send(op, root, out, len * es, tag, &req[0]));
        return tt_p2p_wait(op, &req[0]);
    }

    unsigned char *recv = op->recvbuf;
    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, (size_t)n);
    if (!reqs)
        return TUTTI_ERR_NOMEM;
    for (int j = 0; j < n; j++) {
        const int b = (j + 1) % n;
        const size_t len = tt_blocks_len(&blk, n, b), off = tt_blocks_off(&blk, n, b);
        if (j == root || !len)
            continue;
        int st = tt_p2p_recv(op, j, recv + off * es, len * es, tag, &reqs[j]);
        if (st < 0) {
            tt_reqs_put(&hold);
            return st;
        }
    }
    if (!dst) {
        const int b = (root + 1) % n;
        memcpy(recv + tt_blocks_off(&blk, n, b) * es, out, tt_blocks_len(&blk, n, b) * es);
    }
    int st = tt_p2p_wait_all(op, reqs, (size_t)n);
    tt_reqs_put(&hold);
    return st;
}
