/* Pairwise alltoall: every send (to rank + s, s = 1..n-1) and every receive (from rank
 * - s) is posted at once, each straight between the user's buffers, and this rank's own
 * block is copied meanwhile. The transport drives all links together: the fastest way
 * when memory for n-1 messages in flight is no concern. Sends go first
 * (docs/architecture.md, "Sends first"): a small one leaves at its post, and the peer
 * waits for it, not for our receives.
 *
 * In place (sendbuf == recvbuf, one layout) the outgoing blocks are copied to scratch
 * first, since incoming ones overwrite them.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

int tt_alltoall_pairwise(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    const size_t *scnt = op->sendcounts, *sdsp = op->sdispls;
    const size_t *rcnt = op->recvcounts, *rdsp = op->rdispls;
    const unsigned char *send = op->sendbuf;
    unsigned char *recv = op->recvbuf;

    if (send == recv) {
        size_t extent = 0;
        for (int j = 0; j < n; j++)
            if (scnt[j])
                extent = TT_MAX(extent, sdsp[j] + scnt[j]);
        if (extent) {
            unsigned char *copy = tt_op_scratch(op, 0, extent * es);
            if (!copy)
                return TUTTI_ERR_NOMEM;
            tt_copy(copy, send, extent * es);
            send = copy;
        }
    }

    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, 2 * (size_t)n);
    if (!reqs)
        return TUTTI_ERR_NOMEM;
    int st = TUTTI_OK;
    /* empty blocks go too: a rank that expects nothing where its peer sends something
     * (or the reverse) fails on the length, instead of leaving it in the stream */
    for (int s = 1; s < n; s++) {
        const int to = (r + s) % n;
        TT_CHECK_GOTO(tt_p2p_send(op, to, send + sdsp[to] * es, scnt[to] * es, (uint32_t)s,
                                  &reqs[n + s]),
                      st, out);
    }
    for (int s = 1; s < n; s++) {
        const int from = (r - s + n) % n;
        TT_CHECK_GOTO(tt_p2p_recv(op, from, recv + rdsp[from] * es, rcnt[from] * es, (uint32_t)s,
                                  &reqs[s]),
                      st, out);
    }
    if (rcnt[r] && recv + rdsp[r] * es != send + sdsp[r] * es)
        tt_copy(recv + rdsp[r] * es, send + sdsp[r] * es, rcnt[r] * es);
    st = tt_p2p_wait_all(op, reqs, 2 * (size_t)n);
out:
    tt_reqs_put(&hold);
    return st;
}
