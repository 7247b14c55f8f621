/* Linear scatter: the root posts all n-1 sends at once, each straight from its block in
 * sendbuf; every other rank receives its block into recvbuf. The mirror of
 * gather_linear: for few ranks or large blocks, and the only one for scatterv.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

int tt_scatter_linear(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank, root = op->root;
    const size_t es = op->elem_size;
    tt_req_t req;

    /* empty blocks go too: a rank that expects another size (or none) then fails on its
     * length */
    if (r != root) {
        TT_CHECK(tt_p2p_recv(op, root, op->recvbuf, op->count * es, 0, &req));
        return tt_p2p_wait(op, &req);
    }

    const unsigned char *send = op->sendbuf;
    const size_t *cnt = op->sendcounts, *dsp = op->sdispls;
    tt_req_t *reqs = calloc((size_t)n, sizeof(*reqs));
    if (!reqs)
        return TUTTI_ERR_NOMEM;
    int st = TUTTI_OK;
    for (int j = 0; j < n; j++)
        if (j != root)
            TT_CHECK_GOTO(tt_p2p_send(op, j, send + dsp[j] * es, cnt[j] * es, 0, &reqs[j]), st,
                          out);
    /* in place, the root's block stays where it is */
    if (op->count && op->recvbuf != send + dsp[root] * es)
        memcpy(op->recvbuf, send + dsp[root] * es, op->count * es);
    st = tt_p2p_wait_all(op, reqs, (size_t)n);
out:
    free(reqs);
    return st;
}
