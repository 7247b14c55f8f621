/* Ring reduce: a ring reduce-scatter (as in allreduce_ring), then every rank sends the
 * block it finished to the root. Each rank sends and receives about (n-1)/n of the
 * vector in the ring plus 1/n to the root, where the tree sends the whole vector log2 n
 * times in sequence: the choice for large messages.
 *
 * The vector is cut into n blocks (count/n elements, the remainder spread over the
 * first blocks). Step t (of n-1) sends block (rank - t) to the next rank and receives
 * block (rank - t - 1) from the previous one, reducing it with this rank's input; after
 * the last step rank r holds the full reduction of block r + 1. The partial results
 * live in two block-sized scratch halves used in turn: the one received at step t is
 * sent at step t+1 while step t+1's arrives in the other. Partial results start at the
 * block's own rank and grow around the ring, so the operand order is fixed for a given
 * rank count (not for the root, unlike the tree's).
 *
 * Not in pieces (as reduce_scatter_ring.c is): through them, in one
 * bench/ab.sh run (5 pairs, the thirteenth session), the 16-64 MiB reduce went 0.75-0.88
 * of the time over tcp but 1.07-1.49 over shm at 1-16 MiB (1.29-1.49 at 1-4 MiB even
 * with the single-copy hint), where this version reduces into the block it just
 * received, in cache, and the pieced one writes a third buffer. Not investigated further.
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

static size_t rr_block_len(size_t count, int n, int b)
{
    return count / (size_t)n + ((size_t)b < count % (size_t)n);
}

static size_t rr_block_off(size_t count, int n, int b)
{
    return (size_t)b * (count / (size_t)n) + TT_MIN((size_t)b, count % (size_t)n);
}

int tt_reduce_ring(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank, root = op->root;
    const size_t es = op->elem_size, count = op->count;
    const unsigned char *send = op->sendbuf;

    if (count == 0)
        return TUTTI_OK;

    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    const size_t maxlen = rr_block_len(count, n, 0);
    unsigned char *half[2];
    half[0] = tt_op_scratch(op, 0, 2 * maxlen * es);
    if (!half[0])
        return TUTTI_ERR_NOMEM;
    half[1] = half[0] + maxlen * es;

    tt_req_t req[2];
    const unsigned char *out = send + rr_block_off(count, n, r) * es; /* step 0: own block */
    for (int t = 0; t < n - 1; t++) {
        const int sb = ((r - t) % n + n) % n, rb = ((r - t - 1) % n + n) % n;
        const size_t slen = rr_block_len(count, n, sb), rlen = rr_block_len(count, n, rb);
        unsigned char *in = half[t & 1];
        memset(req, 0, sizeof(req));
        if (rlen)
            TT_CHECK(tt_p2p_recv(op, prev, in, rlen * es, (uint32_t)t, &req[0]));
        if (slen)
            TT_CHECK(tt_p2p_send(op, next, out, slen * es, (uint32_t)t, &req[1]));
        /* both: the next step receives into the half this step's send reads */
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
        tt_reduce(in, send + rr_block_off(count, n, rb) * es, rlen, op->dtype, op->redop);
        out = in;
    }

    /* rank j finished block j + 1 */
    const uint32_t tag = (uint32_t)n;
    if (r != root) {
        size_t len = rr_block_len(count, n, (r + 1) % n);
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
        const size_t len = rr_block_len(count, n, b), off = rr_block_off(count, n, b);
        if (j == root || !len)
            continue;
        int st = tt_p2p_recv(op, j, recv + off * es, len * es, tag, &reqs[j]);
        if (st < 0) {
            tt_reqs_put(&hold);
            return st;
        }
    }
    {
        const int b = (root + 1) % n;
        tt_copy(recv + rr_block_off(count, n, b) * es, out, rr_block_len(count, n, b) * es);
    }
    int st = tt_p2p_wait_all(op, reqs, (size_t)n);
    tt_reqs_put(&hold);
    return st;
}
