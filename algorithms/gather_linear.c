/* Linear gather: every rank sends its block to the root, which posts all n-1 receives
 * at once, each straight into its place in recvbuf. One message per rank and no
 * forwarding: the root's link is the bottleneck either way, so this is the choice for
 * few ranks or large blocks, and the only one for gatherv (non-roots need not know the
 * other ranks' counts).
 */
#include <stdlib.h>
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

int tt_gather_linear(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank, root = op->root;
    const size_t es = op->elem_size;
    tt_req_t req;

    /* an empty block goes too: a root that expects one of another size (or none) then
     * fails on its length */
    if (r != root) {
        TT_CHECK(tt_p2p_send(op, root, op->sendbuf, op->count * es, 0, &req));
        return tt_p2p_wait(op, &req);
    }

    unsigned char *recv = op->recvbuf;
    const size_t *cnt = op->recvcounts, *dsp = op->rdispls;
    tt_req_t *reqs = calloc((size_t)n, sizeof(*reqs));
    if (!reqs)
        return TUTTI_ERR_NOMEM;
    int st = TUTTI_OK;
    for (int j = 0; j < n; j++)
        if (j != root)
            TT_CHECK_GOTO(tt_p2p_recv(op, j, recv + dsp[j] * es, cnt[j] * es, 0, &reqs[j]), st,
                          out);
    /* in place, the root's block is already there */
    if (op->count && op->sendbuf != recv + dsp[root] * es)
        memcpy(recv + dsp[root] * es, op->sendbuf, op->count * es);
    st = tt_p2p_wait_all(op, reqs, (size_t)n);
out:
    free(reqs);
    return st;
}
