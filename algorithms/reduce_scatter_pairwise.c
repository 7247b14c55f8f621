/* Pairwise reduce-scatter: step s (1..n-1) sends this rank's input block (rank + s) to
 * rank (rank + s) and receives block `rank` of rank (rank - s), reducing it into an
 * accumulator that starts as this rank's own input block. Every message goes straight
 * from the input to its final reducer: n-1 messages per rank, no forwarding, which
 * suits a network where every pair of ranks has its own path.
 *
 * Each block travels in pieces of chunk_bytes. All sends are posted at once (they only
 * read the input); the receives stream through two piece-sized slots, two pieces ahead
 * of the reduction, so that each piece is reduced while it is still in cache and while
 * the next one arrives. (Whole blocks landed out of cache first: over loopback tcp the
 * 2-rank 16 MiB call took half as long again as an allgather of the same traffic.)
 *
 * Pieces and their tags: common.h.
 * Operand order: own block, then ranks r-1, r-2, ... : fixed for a given rank count.
 * Out of place the accumulator is recvbuf; in place it is scratch, copied to the start
 * of the buffer once every send has finished.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

#include "common.h"

int tt_reduce_scatter_pairwise(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    const size_t *cnt = op->recvcounts, *dsp = op->rdispls;
    const unsigned char *send = op->sendbuf;
    unsigned char *recv = op->recvbuf;
    const size_t len = cnt[r];
    const int in_place = op->sendbuf == op->recvbuf;
    const size_t piece = tt_piece_elems(op);
    const size_t slot = TT_MIN(len, piece);
    const size_t rk = tt_pieces(len, piece);   /* pieces received per step */
    const size_t total = (size_t)(n - 1) * rk; /* pieces received in all */
    size_t nsend = 0;
    for (int s = 1; s < n; s++)
        nsend += tt_pieces(cnt[(r + s) % n], piece);

    /* scratch 0: two receive slots, then the accumulator in place (never asked for 0
     * bytes: the first request of a communicator's scratch would give NULL) */
    unsigned char *scr = tt_op_scratch(op, 0,
                                       TT_MAX((2 * slot + (in_place ? len : 0)) * es, (size_t)1));
    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, nsend + 2);
    if (!scr || !reqs) {
        tt_reqs_put(&hold);
        return TUTTI_ERR_NOMEM;
    }
    tt_req_t *rreq = reqs, *sreq = reqs + 2; /* rreq[i & 1] for piece i */
    unsigned char *tmp[2] = { scr, scr + slot * es };
    unsigned char *acc = in_place ? scr + 2 * slot * es : recv;
    int st = TUTTI_OK;

#define PIECE_POST(i)                                                                              \
    do {                                                                                           \
        size_t s_ = 1 + (i) / rk, k_ = (i) % rk, cl_ = tt_piece_len(len, piece, k_);               \
        TT_CHECK_GOTO(tt_p2p_recv(op, (r - (int)s_ + n) % n, tmp[(i)&1], cl_ * es,                 \
                                  tt_piece_tag(n, (int)s_, k_, rk), &rreq[(i)&1]),                 \
                      st, out);                                                                    \
    } while (0)

    for (int s = 1, j = 0; s < n; s++) {
        const int to = (r + s) % n;
        const size_t c = cnt[to], nk = tt_pieces(c, piece);
        const unsigned char *src = send + dsp[to] * es;
        for (size_t k = 0; k < nk; k++, j++) {
            TT_CHECK_GOTO(tt_p2p_send(op, to, src + k * piece * es, tt_piece_len(c, piece, k) * es,
                                      tt_piece_tag(n, s, k, nk), &sreq[j]),
                          st, out);
        }
    }
    for (size_t i = 0; i < total && i < 2; i++)
        PIECE_POST(i);
    for (size_t i = 0; i < total; i++) {
        size_t s = 1 + i / rk, c0 = (i % rk) * piece, cl = tt_piece_len(len, piece, i % rk);
        TT_CHECK_GOTO(tt_p2p_wait(op, &rreq[i & 1]), st, out);
        if (cl)
            tt_reduce3(acc + c0 * es, s == 1 ? send + (dsp[r] + c0) * es : acc + c0 * es,
                       tmp[i & 1], cl, op->dtype, op->redop);
        if (i + 2 < total)
            PIECE_POST(i + 2);
    }
#undef PIECE_POST
    TT_CHECK_GOTO(tt_p2p_wait_all(op, sreq, nsend), st, out);
    if (len && in_place)
        tt_copy(recv, acc, len * es);
out:
    tt_reqs_put(&hold);
    return st;
}
