/* Recursive doubling scan and exscan (op->coll says which; MPICH's algorithm): in
 * round k this rank exchanges with rank ^ 2^k (where that rank exists) the reduction
 * of its aligned block of 2^k ranks. A block from below (the peer is lower) is reduced
 * into the result and into this rank's block as the first operand, a block from above
 * into the block as the second, so every reduction keeps rank order. ceil(log2 p)
 * rounds of the whole vector, with up to two reductions a round: the choice for small
 * vectors where ranks have CPUs of their own (cost.c). The last round's blocks go up
 * only: nothing after it needs the upper rank's.
 *
 * Exscan's result at rank i is the reduction of ranks 0..i-1, first written by the
 * first block from below (rank 0 has none: its recvbuf is not written). Scan's is that
 * op x_i, first written as block op sendbuf, so out of place needs no copy.
 *
 * Buffers: the block in scratch 0 (the input itself until the first reduction writes
 * it), the peer's in scratch 1 (exscan's first one from below, if it comes in the last
 * round, straight into recvbuf). In place, the block is written before the result each
 * round: the result's first write may overwrite the input the block still reads.
 */
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

int tt_scan_rd(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank, ex = op->coll == TT_COLL_EXSCAN;
    const size_t count = op->count, bytes = count * op->elem_size;
    const tutti_dtype_t dt = op->dtype;
    const tutti_redop_t rop = op->redop;
    unsigned char *out = op->recvbuf;

    if (count == 0)
        return TUTTI_OK;
    unsigned char *blk = tt_op_scratch(op, 0, bytes), *tmp = tt_op_scratch(op, 1, bytes);
    if (!blk || !tmp)
        return TUTTI_ERR_NOMEM;

    const void *cur = op->sendbuf; /* this rank's block */
    int have = 0;                  /* recvbuf holds a partial result */
    tt_req_t req[2];
    for (int mask = 1, round = 0; mask < n; mask <<= 1, round++) {
        const int peer = r ^ mask;
        if (peer >= n)
            continue;
        /* the upper rank needs the lower one's block for its result; the lower one needs
         * the upper one's only to build its block for a later round: the last round's
         * upper ranks only receive, its lower ones only send (2 ranks: one message) */
        const int more = (mask << 1) < n, up = peer < r;
        memset(req, 0, sizeof(req));
        if (!up || more)
            TT_CHECK(tt_p2p_send(op, peer, cur, bytes, (uint32_t)round, &req[1]));
        /* exscan's first block from below in the last round is the result as it is:
         * straight into recvbuf (this rank sends nothing that round, nor reads its
         * input after it, so in place too), not through tmp and a copy (2 ranks, 16 MiB:
         * 2.2 ms against the chain's 0.8) */
        const int direct = up && ex && !have && !more;
        if (up || more)
            TT_CHECK(tt_p2p_recv(op, peer, direct ? out : tmp, bytes, (uint32_t)round, &req[0]));
        /* both: the reductions may overwrite what the send reads */
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
        if (up) {
            if (more) {
                tt_reduce3(blk, tmp, cur, count, dt, rop);
                cur = blk;
            }
            if (have)
                tt_reduce3(out, tmp, out, count, dt, rop);
            else if (!ex)
                tt_reduce3(out, tmp, op->sendbuf, count, dt, rop);
            else if (!direct)
                tt_copy(out, tmp, bytes);
            have = 1;
        } else if (more) {
            tt_reduce3(blk, cur, tmp, count, dt, rop);
            cur = blk;
        }
    }
    /* rank 0 of a scan: its input is its result */
    if (!have && !ex && op->sendbuf != out)
        tt_copy(out, op->sendbuf, bytes);
    return TUTTI_OK;
}
