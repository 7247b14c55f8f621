/* Linear scan and exscan (op->coll says which): a pipelined chain in rank order,
 * 0 -> 1 -> ... -> p-1, in chunks of chunk_bytes. Rank i receives the prefix of ranks
 * 0..i-1 chunk by chunk, reduces its own input into it (prefix op x_i: the lower ranks
 * are always the first operand, so an op that does not commute keeps rank order) and
 * sends the chunk on while the next one is on its way. p - 1 + chunks - 1 steps of a
 * chunk: the choice for large vectors, where recursive doubling (scan_rd.c) moves the
 * whole vector ceil(log2 p) times and reduces it twice a round.
 *
 * Exscan's result at rank i is the prefix it received; rank 0's recvbuf is not written
 * (MPI leaves it undefined).
 *
 * Buffers: scan receives into scratch 0 and reduces into recvbuf, which it then sends
 * (in place too: recvbuf = prefix op sendbuf element by element, dst == b). Exscan
 * receives into recvbuf (into scratch 0 when in place, copied to recvbuf once its
 * chunk's reduction has read the input) and sends prefix op input from scratch 1.
 * Nothing sent is written again in the call, so a transport may pull it late (the
 * single-copy hint, algos.def).
 */
#include <string.h>

#include "common.h"
#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

int tt_scan_linear(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank, ex = op->coll == TT_COLL_EXSCAN;
    const size_t es = op->elem_size, count = op->count;
    const unsigned char *in = op->sendbuf;
    unsigned char *out = op->recvbuf;

    if (count == 0)
        return TUTTI_OK;

    const size_t chunk = tt_piece_elems(op), nck = tt_pieces(count, chunk);
    const int last = r == n - 1;
    unsigned char *pre = NULL, *fwd = NULL; /* the prefix received; exscan's sent one */
    if (r > 0) {
        pre = ex && in != out ? out : tt_op_scratch(op, 0, count * es);
        fwd = ex && !last ? tt_op_scratch(op, 1, count * es) : NULL;
        if (!pre || (ex && !last && !fwd))
            return TUTTI_ERR_NOMEM;
    }

    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, 2 * nck);
    if (!reqs)
        return TUTTI_ERR_NOMEM;
    tt_req_t *rreq = reqs, *sreq = reqs + nck;
    int st = TUTTI_OK;

    if (r == 0) { /* its input is the prefix it passes on */
        for (size_t k = 0; k < nck; k++) {
            size_t off = k * chunk * es, clen = tt_piece_len(count, chunk, k);
            TT_CHECK_GOTO(tt_p2p_send(op, 1, in + off, clen * es, (uint32_t)k, &sreq[k]), st, out);
        }
        if (!ex && in != out) /* overlaps whatever the transport does with the sends */
            tt_copy(out, in, count * es);
        TT_CHECK_GOTO(tt_p2p_wait_all(op, sreq, nck), st, out);
        goto out;
    }

    for (size_t k = 0; k < nck; k++) {
        size_t off = k * chunk * es, clen = tt_piece_len(count, chunk, k);
        TT_CHECK_GOTO(tt_p2p_recv(op, r - 1, pre + off, clen * es, (uint32_t)k, &rreq[k]), st, out);
    }
    for (size_t k = 0; k < nck; k++) {
        size_t off = k * chunk * es, clen = tt_piece_len(count, chunk, k);
        TT_CHECK_GOTO(tt_p2p_wait(op, &rreq[k]), st, out);
        const unsigned char *next = NULL;
        if (!ex) {
            tt_reduce3(out + off, pre + off, in + off, clen, op->dtype, op->redop);
            next = out + off;
        } else {
            if (!last) {
                tt_reduce3(fwd + off, pre + off, in + off, clen, op->dtype, op->redop);
                next = fwd + off;
            }
            if (pre != out) /* in place: the input of this chunk was read above */
                tt_copy(out + off, pre + off, clen * es);
        }
        if (!last)
            TT_CHECK_GOTO(tt_p2p_send(op, r + 1, next, clen * es, (uint32_t)k, &sreq[k]), st, out);
    }
    if (!last)
        TT_CHECK_GOTO(tt_p2p_wait_all(op, sreq, nck), st, out);

out:
    tt_reqs_put(&hold);
    return st;
}
