/* Pairwise allgather: this rank's block goes to every other rank and every other rank's
 * block comes straight into its place in recvbuf, all n-1 sends (to rank + s, s = 1..n-1)
 * and n-1 receives (from rank - s) posted at once, as the pairwise alltoall's. The bytes
 * are the ring's ((n-1)/n of the result in and out of each rank, each block copied once
 * by each rank that receives it: a transport that pulls does so from the owner's
 * buffer), the rounds one instead of n-1: no rank waits for a block to come round
 * through the ranks before it. Works for any layout (allgatherv): message sizes come
 * from recvcounts, the same on every rank; where a block lands comes from this rank's
 * rdispls.
 */
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

#include "common.h"

int tt_allgather_pairwise(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    unsigned char *recv = op->recvbuf;
    const size_t *cnt = op->recvcounts, *dsp = op->rdispls;

    /* in place, this rank's block is already there; out of place, the sends go from
     * sendbuf and the block is copied into recvbuf while they run */
    int copy_own;
    const unsigned char *own_src = tt_own_block_src(op, &copy_own);

    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, 2 * (size_t)n);
    if (!reqs)
        return TUTTI_ERR_NOMEM;
    int st = TUTTI_OK;
    /* sends first (docs/architecture.md, "Sends first"); empty blocks go too: a
     * disagreement about a block's size fails on its length */
    for (int s = 1; s < n; s++)
        TT_CHECK_GOTO(tt_p2p_send(op, (r + s) % n, own_src, cnt[r] * es, (uint32_t)s, &reqs[n + s]),
                      st, out);
    for (int s = 1; s < n; s++) {
        const int from = (r - s + n) % n;
        TT_CHECK_GOTO(tt_p2p_recv(op, from, recv + dsp[from] * es, cnt[from] * es, (uint32_t)s,
                                  &reqs[s]),
                      st, out);
    }
    if (copy_own)
        tt_copy(recv + dsp[r] * es, op->sendbuf, cnt[r] * es);
    st = tt_p2p_wait_all(op, reqs, 2 * (size_t)n);
out:
    tt_reqs_put(&hold);
    return st;
}
