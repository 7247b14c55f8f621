/* Pairwise reduce-scatter: step s (1..n-1) sends this rank's input block (rank + s) to
 * rank (rank + s) and receives block `rank` of rank (rank - s), reducing it into an
 * accumulator that starts as this rank's own input block. Every message goes straight
 * from the input to its final reducer: n-1 messages per rank, no forwarding, which
 * suits a network where every pair of ranks has its own path.
 *
 * All sends are posted at once (they only read the input); receives run two ahead of
 * the reduction, in two scratch buffers. Operand order: own block, then ranks r-1,
 * r-2, ... : fixed for a given rank count. Out of place the accumulator is recvbuf; in
 * place it is scratch, copied to the start of the buffer once every send has finished.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

int tt_reduce_scatter_pairwise(tt_op_t *op)
{
    /* every step waits for its send and its receive alike: nothing to overlap */
    op->tp_hints |= TUTTI_TP_HINT_SINGLE_COPY;
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    const size_t *cnt = op->recvcounts, *dsp = op->rdispls;
    const unsigned char *send = op->sendbuf;
    unsigned char *recv = op->recvbuf;
    const size_t len = cnt[r];
    const int in_place = op->sendbuf == op->recvbuf;

    /* scratch 0: two receive buffers, then the accumulator in place (never asked for 0
     * bytes: the first request of a communicator's scratch would give NULL) */
    unsigned char *scr = tt_op_scratch(op, 0, TT_MAX((in_place ? 3 : 2) * len * es, (size_t)1));
    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, 2 * (size_t)n);
    if (!scr || !reqs) {
        tt_reqs_put(&hold);
        return TUTTI_ERR_NOMEM;
    }
    tt_req_t *sreq = reqs, *rreq = reqs + n; /* by step; rreq[s & 1] */
    unsigned char *tmp[2] = { scr, scr + len * es };
    unsigned char *acc = in_place ? scr + 2 * len * es : recv;
    int st = TUTTI_OK;

    /* empty blocks go too: a disagreement about a block's size fails on its length */
    for (int s = 1; s < n && s <= 2; s++)
        TT_CHECK_GOTO(tt_p2p_recv(op, (r - s + n) % n, tmp[s & 1], len * es, (uint32_t)s,
                                  &rreq[s & 1]),
                      st, out);
    for (int s = 1; s < n; s++) {
        const int to = (r + s) % n;
        TT_CHECK_GOTO(tt_p2p_send(op, to, send + dsp[to] * es, cnt[to] * es, (uint32_t)s, &sreq[s]),
                      st, out);
    }
    for (int s = 1; s < n; s++) {
        TT_CHECK_GOTO(tt_p2p_wait(op, &rreq[s & 1]), st, out);
        if (len)
            tt_reduce3(acc, s == 1 ? send + dsp[r] * es : acc, tmp[s & 1], len, op->dtype,
                       op->redop);
        if (s + 2 < n)
            TT_CHECK_GOTO(tt_p2p_recv(op, (r - s - 2 + 2 * n) % n, tmp[s & 1], len * es,
                                      (uint32_t)(s + 2), &rreq[s & 1]),
                          st, out);
    }
    TT_CHECK_GOTO(tt_p2p_wait_all(op, sreq, (size_t)n), st, out);
    if (len && in_place)
        memcpy(recv, acc, len * es);
out:
    tt_reqs_put(&hold);
    return st;
}
