/* Ring reduce-scatter: step t (of n-1) sends the partial result of block
 * (rank - t - 1) to the next rank and receives that of block (rank - t - 2) from the
 * previous one, reducing this rank's input block into it; the last step receives this
 * rank's own block, which then holds everybody's contribution. Every rank sends and
 * receives (n-1)/n of the input once: bandwidth optimal. Any layout (reduce_scatterv):
 * message sizes come from recvcounts.
 *
 * Partial results live in two scratch halves used in turn (the one received at step t
 * is sent at step t+1 while the next arrives in the other). Step 0 sends straight from
 * the input. In place the result goes to the start of the input buffer, which other
 * blocks' input may still occupy until the last step: it is written only at the end.
 * Operand order: block b's partial result starts at rank b+1 and grows around the ring,
 * fixed for a given rank count.
 */
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

int tt_reduce_scatter_ring(tt_op_t *op)
{
    /* every step waits for its send and its receive alike: nothing to overlap */
    op->tp_hints |= TUTTI_TP_HINT_SINGLE_COPY;
    const int n = op->nranks, r = op->rank;
    const size_t *cnt = op->recvcounts, *dsp = op->rdispls;
    const size_t es = op->elem_size;
    const unsigned char *send = op->sendbuf;

    size_t maxlen = 0;
    for (int i = 0; i < n; i++)
        maxlen = TT_MAX(maxlen, cnt[i]);
    unsigned char *half[2];
    half[0] = tt_op_scratch(op, 0, TT_MAX(2 * maxlen * es, (size_t)1));
    if (!half[0])
        return TUTTI_ERR_NOMEM;
    half[1] = half[0] + maxlen * es;

    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    tt_req_t req[2];
    const unsigned char *out = NULL;
    for (int t = 0; t < n - 1; t++) {
        const int sb = ((r - t - 1) % n + n) % n, rb = ((r - t - 2) % n + n) % n;
        unsigned char *in = half[t & 1];
        if (t == 0)
            out = send + dsp[sb] * es;
        /* empty blocks go too: a disagreement about a block's size fails on its length */
        TT_CHECK(tt_p2p_recv(op, prev, in, cnt[rb] * es, (uint32_t)t, &req[0]));
        TT_CHECK(tt_p2p_send(op, next, out, cnt[sb] * es, (uint32_t)t, &req[1]));
        /* both: the next step receives into the half this step's send reads */
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
        if (cnt[rb])
            tt_reduce(in, send + dsp[rb] * es, cnt[rb], op->dtype, op->redop);
        out = in;
    }
    /* out holds block r; every send is done and the input fully read */
    if (cnt[r])
        memcpy(op->recvbuf, out, cnt[r] * es);
    return TUTTI_OK;
}
