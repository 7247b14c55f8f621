/* Ring alltoall, the low-memory variant: one exchange at a time, straight between the
 * user's buffers. Two messages in flight per rank whatever n, and no scratch out of
 * place.
 *
 * The exchanges are swaps: at step s (0..n-1) rank r swaps its block p with rank
 * p = s - r (mod n), which at that step swaps with r; ranks with p == r sit the step
 * out. n steps, n-1 exchanges a rank. In place (sendbuf == recvbuf, one layout) an
 * incoming block would overwrite the outgoing one, so that is first copied to a
 * one-block scratch. One schedule for both, so ranks in place and ranks not can call
 * one alltoall together (until session 96 out of place was a shift, to r + s and from
 * r - s, and a mix of the two failed as a mismatch; the swaps measured 0.84x its time
 * at 4 MiB and 0.99x at 16 MiB, 4 ranks over tcp, 4 pairs).
 */
#include <string.h>

#include "common.h"
#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

int tt_alltoall_ring(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    const size_t *scnt = op->sendcounts, *sdsp = op->sdispls;
    const size_t *rcnt = op->recvcounts, *rdsp = op->rdispls;
    unsigned char *buf = op->recvbuf;
    const unsigned char *in = op->sendbuf;
    const int in_place = op->sendbuf == op->recvbuf;

    unsigned char *tmp = NULL;
    if (in_place) {
        size_t maxlen = 0;
        for (int j = 0; j < n; j++)
            maxlen = TT_MAX(maxlen, scnt[j]);
        tmp = tt_op_scratch(op, 0, TT_MAX(maxlen * es, (size_t)1));
        if (!tmp)
            return TUTTI_ERR_NOMEM;
    } else if (rcnt[r]) {
        tt_copy(buf + rdsp[r] * es, in + sdsp[r] * es, rcnt[r] * es);
    }
    tt_req_t req[2];
    for (int s = 0; s < n; s++) {
        const int p = ((s - r) % n + n) % n;
        if (p == r)
            continue;
        memset(req, 0, sizeof(req));
        const unsigned char *out = in + sdsp[p] * es;
        if (in_place && scnt[p]) {
            tt_copy(tmp, out, scnt[p] * es);
            out = tmp;
        }
        /* empty blocks go too (see alltoall_pairwise.c) */
        TT_CHECK(tt_p2p_recv(op, p, buf + rdsp[p] * es, rcnt[p] * es, (uint32_t)s, &req[0]));
        TT_CHECK(tt_p2p_send(op, p, out, scnt[p] * es, (uint32_t)s, &req[1]));
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
    }
    return TUTTI_OK;
}
