/* Ring alltoall, the low-memory variant: step s (1..n-1) sends to rank + s and receives
 * from rank - s, one exchange at a time, straight between the user's buffers. Two
 * messages in flight per rank whatever n, and no scratch out of place.
 *
 * In place (sendbuf == recvbuf, one layout) an incoming block would overwrite an
 * outgoing one not sent yet, so the exchanges become swaps: at step s (0..n-1) rank r
 * swaps block p with rank p = s - r (mod n), which at that step swaps with r; the
 * outgoing block is first copied to a one-block scratch. Ranks with p == r sit the step
 * out. n steps, one block of scratch.
 */
#include <string.h>

#include "common.h"
#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

static int a2a_swaps(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    const size_t *scnt = op->sendcounts, *sdsp = op->sdispls;
    const size_t *rcnt = op->recvcounts, *rdsp = op->rdispls;
    unsigned char *buf = op->recvbuf;

    size_t maxlen = 0;
    for (int j = 0; j < n; j++)
        maxlen = TT_MAX(maxlen, scnt[j]);
    unsigned char *tmp = tt_op_scratch(op, 0, TT_MAX(maxlen * es, (size_t)1));
    if (!tmp)
        return TUTTI_ERR_NOMEM;
    tt_req_t req[2];
    for (int s = 0; s < n; s++) {
        const int p = ((s - r) % n + n) % n;
        if (p == r)
            continue;
        memset(req, 0, sizeof(req));
        if (scnt[p])
            tt_copy(tmp, buf + sdsp[p] * es, scnt[p] * es);
        /* empty blocks go too (see alltoall_pairwise.c) */
        TT_CHECK(tt_p2p_recv(op, p, buf + rdsp[p] * es, rcnt[p] * es, (uint32_t)s, &req[0]));
        TT_CHECK(tt_p2p_send(op, p, tmp, scnt[p] * es, (uint32_t)s, &req[1]));
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
    }
    return TUTTI_OK;
}

int tt_alltoall_ring(tt_op_t *op)
{
    if (op->sendbuf == op->recvbuf)
        return a2a_swaps(op);

    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    const size_t *scnt = op->sendcounts, *rcnt = op->recvcounts;
    if (rcnt[r])
        tt_copy(tt_blk(op->recvbuf, op->rdispls, r, es), tt_cblk(op->sendbuf, op->sdispls, r, es),
                rcnt[r] * es);
    tt_req_t req[2];
    for (int s = 1; s < n; s++) {
        const int to = (r + s) % n, from = (r - s + n) % n;
        memset(req, 0, sizeof(req));
        TT_CHECK(tt_p2p_recv(op, from, tt_blk(op->recvbuf, op->rdispls, from, es), rcnt[from] * es,
                             (uint32_t)s, &req[0]));
        TT_CHECK(tt_p2p_send(op, to, tt_cblk(op->sendbuf, op->sdispls, to, es), scnt[to] * es,
                             (uint32_t)s, &req[1]));
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
    }
    return TUTTI_OK;
}
