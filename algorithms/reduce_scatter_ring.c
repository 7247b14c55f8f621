/* Ring reduce-scatter: step t (of n-1) sends the partial result of block
 * (rank - t - 1) to the next rank and receives that of block (rank - t - 2) from the
 * previous one, reducing this rank's input block into it; the last step receives this
 * rank's own block, which then holds everybody's contribution. Every rank sends and
 * receives (n-1)/n of the input once: bandwidth optimal. Any layout (reduce_scatterv):
 * message sizes come from recvcounts.
 *
 * Blocks travel in pieces of chunk_bytes (common.h), pipelined across steps as in the
 * ring allreduce: the receives stream through two piece-sized slots, two pieces ahead,
 * and each piece is reduced while still in cache and forwarded at once as the next
 * step's piece. Partial results live in two scratch halves used in turn (step t reduces
 * into half t & 1, which step t+1 sends from); before step t+1 writes a half, step t's
 * sends, which read it, are waited for. Step 0 sends straight from the input. Out of
 * place the last step reduces straight into recvbuf. In place the result goes to the
 * start of the input buffer, which other blocks' input may still occupy until the last
 * step: it is written only at the end. Operand order: block b's partial result starts
 * at rank b+1 and grows around the ring, fixed for a given rank count.
 */
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

#include "common.h"

typedef struct {
    tt_op_t *op;
    size_t piece;      /* elements per piece */
    size_t slot;       /* elements per receive slot */
    unsigned char *sl; /* two receive slots */
    tt_req_t *rreq;    /* rreq[i & 1]: receive piece i */
} rs_ring_t;

static int rmod(int x, int n)
{
    return ((x % n) + n) % n;
}

/* Receive piece i of the stream: step i's block pieces in order, step by step. */
static int post_piece(const rs_ring_t *g, size_t i, size_t t, size_t k)
{
    tt_op_t *op = g->op;
    const int n = op->nranks;
    const size_t c = op->recvcounts[rmod(op->rank - (int)t - 2, n)];
    const size_t nk = tt_pieces(c, g->piece), cl = tt_piece_len(c, g->piece, k);
    return tt_p2p_recv(op, rmod(op->rank - 1, n), g->sl + (i & 1) * g->slot * op->elem_size,
                       cl * op->elem_size, tt_piece_tag(n, (int)t, k, nk), &g->rreq[i & 1]);
}

int tt_reduce_scatter_ring(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t *cnt = op->recvcounts, *dsp = op->rdispls;
    const size_t es = op->elem_size;
    const unsigned char *send = op->sendbuf;
    const int in_place = op->sendbuf == op->recvbuf;
    rs_ring_t g = { .op = op, .piece = tt_piece_elems(op) };

    size_t maxlen = 0;
    for (int i = 0; i < n; i++)
        maxlen = TT_MAX(maxlen, cnt[i]);
    g.slot = TT_MIN(maxlen, g.piece);
    const size_t maxpk = tt_pieces(maxlen, g.piece);
    unsigned char *half[2];
    half[0] = tt_op_scratch(op, 0, TT_MAX((2 * maxlen + 2 * g.slot) * es, (size_t)1));
    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, 2 + 2 * maxpk);
    if (!half[0] || !reqs) {
        tt_reqs_put(&hold);
        return TUTTI_ERR_NOMEM;
    }
    half[1] = half[0] + maxlen * es;
    g.sl = half[1] + maxlen * es;
    g.rreq = reqs;
    tt_req_t *sreq[2] = { reqs + 2, reqs + 2 + maxpk }; /* sends of step t: sreq[t & 1] */
    const int next = (r + 1) % n;
    const size_t steps = (size_t)n - 1;
    int st = TUTTI_OK;

    /* the stream of received pieces: piece i is step ti's piece ki; two posted ahead */
    size_t i_post = 0, ti = 0, ki = 0;
#define POST_AHEAD(upto)                                                                           \
    do {                                                                                           \
        for (; i_post < (upto) && ti < steps; i_post++) {                                          \
            TT_CHECK_GOTO(post_piece(&g, i_post, ti, ki), st, out);                                \
            if (++ki == tt_pieces(cnt[rmod(r - (int)ti - 2, n)], g.piece)) {                       \
                ki = 0;                                                                            \
                ti++;                                                                              \
            }                                                                                      \
        }                                                                                          \
    } while (0)
    POST_AHEAD(2);

    /* step 0's sends, straight from this rank's input */
    {
        const int sb = rmod(r - 1, n);
        const size_t c = cnt[sb], nk = tt_pieces(c, g.piece);
        for (size_t k = 0; k < nk; k++) {
            size_t c0 = k * g.piece, cl = tt_piece_len(c, g.piece, k);
            TT_CHECK_GOTO(tt_p2p_send(op, next, send + (dsp[sb] + c0) * es, cl * es,
                                      tt_piece_tag(n, 0, k, nk), &sreq[0][k]),
                          st, out);
        }
    }
    size_t i = 0;
    for (size_t t = 0; t < steps; t++) {
        const int rb = rmod(r - (int)t - 2, n);
        const size_t c = cnt[rb], nk = tt_pieces(c, g.piece);
        const int last = t + 1 == steps;
        unsigned char *part = last && !in_place ? op->recvbuf : half[t & 1];
        for (size_t k = 0; k < nk; k++, i++) {
            size_t c0 = k * g.piece, cl = tt_piece_len(c, g.piece, k);
            TT_CHECK_GOTO(tt_p2p_wait(op, &g.rreq[i & 1]), st, out);
            if (cl)
                tt_reduce3(part + c0 * es, send + (dsp[rb] + c0) * es, g.sl + (i & 1) * g.slot * es,
                           cl, op->dtype, op->redop);
            POST_AHEAD(i + 3);
            if (!last)
                TT_CHECK_GOTO(tt_p2p_send(op, next, part + c0 * es, cl * es,
                                          tt_piece_tag(n, (int)t + 1, k, nk),
                                          &sreq[(t + 1) & 1][k]),
                              st, out);
        }
        /* step t's sends read the half that step t+1 reduces into */
        const size_t sc = cnt[rmod(r - (int)t - 1, n)];
        TT_CHECK_GOTO(tt_p2p_wait_all(op, sreq[t & 1], tt_pieces(sc, g.piece)), st, out);
    }
#undef POST_AHEAD
    /* every send is done and the input fully read */
    if (in_place && cnt[r])
        tt_copy(op->recvbuf, half[(steps - 1) & 1], cnt[r] * es);
out:
    tt_reqs_put(&hold);
    return st;
}
