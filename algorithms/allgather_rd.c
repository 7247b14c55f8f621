/* Latency-bound allgather for small messages: log2 rounds instead of the ring's n-1.
 *
 * Powers of two: recursive doubling. In round k a rank swaps everything it has (the
 * blocks of the 2^k ranks that share its rank's upper bits) with the rank whose number
 * differs in bit k. Blocks go as separate messages, straight from and into recvbuf: a
 * group's blocks need not be contiguous there (allgatherv displacements may differ
 * between ranks), and message sizes must only depend on recvcounts.
 *
 * Other rank counts: Bruck. A packed scratch holds the blocks of ranks r, r+1, ...
 * (mod n) back to back; round k (distance d = 2^k) sends its first min(d, n-d) blocks
 * to rank r - d and receives as many from rank r + d after its first d. ceil(log2 n)
 * messages, each one contiguous piece of the scratch, then the blocks are unpacked into
 * recvbuf. Message sizes are sums of recvcounts over the same ranks on both sides.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

#include "common.h"

static int ag_rd_pow2(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    unsigned char *recv = op->recvbuf;
    const size_t *cnt = op->recvcounts, *dsp = op->rdispls;
    /* in place, this rank's block is already there; out of place, round 0 sends it from
     * sendbuf and copies it into recvbuf while the messages move */
    int copy_own;
    const unsigned char *own_src = tt_own_block_src(op, &copy_own);

    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, 2 * (size_t)n);
    if (!reqs)
        return TUTTI_ERR_NOMEM;
    int st = TUTTI_OK;
    int round = 0;
    for (int mask = 1; mask < n; mask <<= 1, round++) {
        const int peer = r ^ mask;
        const int mine = r & ~(mask - 1), theirs = peer & ~(mask - 1);
        memset(reqs, 0, 2 * (size_t)n * sizeof(*reqs));
        /* receives first, in block order on both sides; sends likewise */
        /* empty blocks go too: ranks that disagree about a block's size then fail on
         * its length, instead of one rank skipping what the other sends */
        for (int i = 0; i < mask; i++) {
            int b = theirs + i;
            TT_CHECK_GOTO(tt_p2p_recv(op, peer, recv + dsp[b] * es, cnt[b] * es,
                                      (uint32_t)(round * n + b), &reqs[i]),
                          st, out);
        }
        for (int i = 0; i < mask; i++) {
            int b = mine + i;
            const void *src = b == r && round == 0 ? own_src : recv + dsp[b] * es;
            TT_CHECK_GOTO(tt_p2p_send(op, peer, src, cnt[b] * es, (uint32_t)(round * n + b),
                                      &reqs[n + i]),
                          st, out);
        }
        if (copy_own) {
            tt_copy(recv + dsp[r] * es, op->sendbuf, cnt[r] * es);
            copy_own = 0;
        }
        TT_CHECK_GOTO(tt_p2p_wait_all(op, reqs, 2 * (size_t)n), st, out);
    }
out:
    tt_reqs_put(&hold);
    return st;
}

static int ag_bruck(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    unsigned char *recv = op->recvbuf;
    const size_t *cnt = op->recvcounts, *dsp = op->rdispls;

    /* poff[i]: where rank (r + i)'s block sits in the packed scratch */
    size_t *poff = malloc(((size_t)n + 1) * sizeof(*poff));
    if (!poff)
        return TUTTI_ERR_NOMEM;
    poff[0] = 0;
    for (int i = 0; i < n; i++)
        poff[i + 1] = poff[i] + cnt[(r + i) % n];
    unsigned char *pk = tt_op_scratch(op, 0, TT_MAX(poff[n] * es, (size_t)1));
    if (!pk) {
        free(poff);
        return TUTTI_ERR_NOMEM;
    }
    if (cnt[r])
        tt_copy(pk, recv + dsp[r] * es, cnt[r] * es);

    int st = TUTTI_OK;
    tt_req_t req[2];
    int round = 0;
    for (int d = 1; d < n; d <<= 1, round++) {
        const int m = TT_MIN(d, n - d);
        const size_t slen = poff[m], rlen = poff[d + m] - poff[d];
        memset(req, 0, sizeof(req));
        TT_CHECK_GOTO(tt_p2p_recv(op, (r + d) % n, pk + poff[d] * es, rlen * es, (uint32_t)round,
                                  &req[0]),
                      st, out);
        TT_CHECK_GOTO(tt_p2p_send(op, (r - d + n) % n, pk, slen * es, (uint32_t)round, &req[1]), st,
                      out);
        TT_CHECK_GOTO(tt_p2p_wait_all(op, req, 2), st, out);
    }
    for (int i = 1; i < n; i++) {
        int b = (r + i) % n;
        if (cnt[b])
            tt_copy(recv + dsp[b] * es, pk + poff[i] * es, cnt[b] * es);
    }
out:
    free(poff);
    return st;
}

int tt_allgather_rd(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    if ((n & (n - 1)) == 0)
        return ag_rd_pow2(op);
    /* in place, this rank's block is already there */
    if (op->recvcounts[r]) {
        unsigned char *own = (unsigned char *)op->recvbuf + op->rdispls[r] * es;
        if (op->sendbuf != own)
            tt_copy_overlapping(own, op->sendbuf, op->recvcounts[r] * es);
    }
    return ag_bruck(op);
}
