/* Ring allgather: step t (of n-1) sends block (rank - t) to the next rank and receives
 * block (rank - t - 1) from the previous one, straight into its place in recvbuf; the
 * block received at step t is the one sent at step t+1. Every rank sends and receives
 * (n-1)/n of the result once, over one link each way: bandwidth optimal, for large
 * messages. Works for any layout (allgatherv): message sizes come from recvcounts, the
 * same on every rank; where a block lands comes from this rank's rdispls.
 */
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

#include "common.h"

int tt_allgather_ring(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    unsigned char *recv = op->recvbuf;
    const size_t *cnt = op->recvcounts, *dsp = op->rdispls;

    /* in place, this rank's block is already there; out of place, the first step sends
     * it from sendbuf and copies it into recvbuf while the transfer runs */
    int copy_own;
    const unsigned char *own_src = tt_own_block_src(op, &copy_own);

    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    tt_req_t req[2];
    for (int t = 0; t < n - 1; t++) {
        const int sb = ((r - t) % n + n) % n, rb = ((r - t - 1) % n + n) % n;
        const void *src = t == 0 ? own_src : recv + dsp[sb] * es;
        /* empty blocks go too: a disagreement about a block's size fails on its length */
        TT_CHECK(tt_p2p_send(op, next, src, cnt[sb] * es, (uint32_t)t, &req[1]));
        TT_CHECK(tt_p2p_recv(op, prev, recv + dsp[rb] * es, cnt[rb] * es, (uint32_t)t, &req[0]));
        if (t == 0 && copy_own)
            tt_copy(recv + dsp[r] * es, op->sendbuf, cnt[r] * es);
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
    }
    return TUTTI_OK;
}
