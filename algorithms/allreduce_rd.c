/* Recursive doubling allreduce: log2(p) rounds, each exchanging the whole vector with
 * the partner whose (folded) rank differs in one bit. Latency optimal, so it serves
 * small messages; every round moves the full vector, so large ones go to the ring.
 *
 * Non-power-of-two rank counts fold first: with p the largest power of two <= n, the
 * first 2 (n - p) ranks pair up, each odd one hands its vector to the even one below
 * it, sits out the rounds and gets the result back at the end. The remaining p ranks
 * run the rounds under folded ranks 0..p-1.
 *
 * Every rank must end with the same bits, floats included, so each reduction takes the
 * lower rank's partial result as the first operand, whichever side computes it. Except
 * a NaN's sign and payload: where two NaNs meet in a SUM or PROD, the kernels (k2 on the
 * lower side, k2r on the upper, vector body or scalar tail) keep either operand's, as
 * the compiler ordered the instruction's operands; every rank has a NaN in the same
 * elements (tutti.h; a review in session 97 saw +NaN and -NaN mixed at 5 ranks).
 *
 * The same rounds run among a group of ranks (tt_rd_group): hier's step across hosts.
 */
#include <string.h>

#include "common.h"
#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

enum {
    RD_TAG_FOLD = 1,    /* odd rank -> even partner, before the rounds */
    RD_TAG_UNFOLD = 2,  /* the result back, after them */
    RD_TAG_ROUND0 = 16, /* + round number */
};

static int rd_rank(const int *grp, int i)
{
    return grp ? grp[i] : i;
}

int tt_rd_group(tt_op_t *op, const int *grp, int n, int r, const void *send, void *recv,
                size_t count, void *tmp, uint32_t tag0)
{
    const size_t bytes = count * op->elem_size;

    int p = 1;
    while (p <= n / 2)
        p *= 2;
    const int extra = n - p;

    tt_req_t req[2];
    /* This rank's partial result: send until the first reduction writes recv, so that
     * out of place needs no copy. */
    const void *cur = send;
    int folded;

    if (r < 2 * extra) {
        if (r & 1) {
            /* In place, the result lands where the send reads: finish the send first. */
            TT_CHECK(tt_p2p_send(op, rd_rank(grp, r - 1), cur, bytes, tag0 + RD_TAG_FOLD, &req[0]));
            TT_CHECK(tt_p2p_wait(op, &req[0]));
            TT_CHECK(
                tt_p2p_recv(op, rd_rank(grp, r - 1), recv, bytes, tag0 + RD_TAG_UNFOLD, &req[0]));
            return tt_p2p_wait(op, &req[0]);
        }
        TT_CHECK(tt_p2p_recv(op, rd_rank(grp, r + 1), tmp, bytes, tag0 + RD_TAG_FOLD, &req[0]));
        TT_CHECK(tt_p2p_wait(op, &req[0]));
        tt_reduce3(recv, cur, tmp, count, op->dtype, op->redop);
        cur = recv;
        folded = r / 2;
    } else {
        folded = r - extra;
    }

    for (int mask = 1, round = 0; mask < p; mask <<= 1, round++) {
        int pf = folded ^ mask;
        int peer = pf < extra ? 2 * pf : pf + extra;
        uint32_t tag = tag0 + RD_TAG_ROUND0 + (uint32_t)round;
        TT_CHECK(tt_p2p_send(op, rd_rank(grp, peer), cur, bytes, tag, &req[1]));
        TT_CHECK(tt_p2p_recv(op, rd_rank(grp, peer), tmp, bytes, tag, &req[0]));
        /* both: the reduction may overwrite what the send reads */
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
        if (r < peer)
            tt_reduce3(recv, cur, tmp, count, op->dtype, op->redop);
        else
            tt_reduce3(recv, tmp, cur, count, op->dtype, op->redop);
        cur = recv;
    }

    if (r < 2 * extra) {
        TT_CHECK(tt_p2p_send(op, rd_rank(grp, r + 1), recv, bytes, tag0 + RD_TAG_UNFOLD, &req[0]));
        TT_CHECK(tt_p2p_wait(op, &req[0]));
    }
    return TUTTI_OK;
}

int tt_allreduce_rd(tt_op_t *op)
{
    if (op->count == 0)
        return TUTTI_OK;
    void *tmp = tt_op_scratch(op, 0, op->count * op->elem_size);
    if (!tmp)
        return TUTTI_ERR_NOMEM;
    return tt_rd_group(op, NULL, op->nranks, op->rank, op->sendbuf, op->recvbuf, op->count, tmp, 0);
}
