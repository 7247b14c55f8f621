/* Helpers shared by the algorithms (see common.h): the binomial tree's layout and the
 * linear rooted exchange behind gather_linear and scatter_linear.
 */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "coll/algo.h"
#include "base/base.h"
#include "reduce/reduce.h"

int tt_btree_init(tt_op_t *op, const size_t *cnt, tt_btree_t *t_p)
{
    const int n = op->nranks, root = op->root;
    tt_btree_t *t = t_p;

    t->vr = (op->rank - root + n) % n;
    t->sub = n; /* the root's bound: no parent */
    t->lowbit = 0;
    if (t->vr) {
        t->lowbit = t->vr & -t->vr;
        t->sub = TT_MIN(t->lowbit, n - t->vr);
    }
    t->pk = NULL;
    t->poff = malloc(((size_t)t->sub + 1) * sizeof(*t->poff));
    t->reqs = calloc(TT_BTREE_REQS, sizeof(*t->reqs));
    if (!t->poff || !t->reqs)
        return TUTTI_ERR_NOMEM;
    t->poff[0] = 0;
    for (int i = 0; i < t->sub; i++)
        t->poff[i + 1] = t->poff[i] + (i == 0 ? op->count : cnt[(t->vr + i + root) % n]);
    t->pk = tt_op_scratch(op, 0, TT_MAX(t->poff[t->sub] * op->elem_size, (size_t)1));
    return t->pk ? TUTTI_OK : TUTTI_ERR_NOMEM;
}

void tt_btree_free(tt_btree_t *t)
{
    free(t->poff);
    free(t->reqs);
}

int tt_btree_run(tt_op_t *op, const size_t *cnt, int (*linear)(tt_op_t *),
                 int (*body)(tt_op_t *, const tt_btree_t *))
{
    if (op->env_count == 0)
        return linear(op);
    tt_btree_t t;
    int st = tt_btree_init(op, cnt, &t);
    if (st == TUTTI_OK)
        st = body(op, &t);
    tt_btree_free(&t);
    return st;
}

int tt_btree_contig(const tt_op_t *op, const size_t *cnt, const size_t *dsp, int c, int csub)
{
    const int n = op->nranks, root = op->root;
    int contig = 1;
    for (int i = c; i + 1 < c + csub && contig; i++) {
        int a = (i + root) % n, b = (i + 1 + root) % n;
        contig = dsp[b] == dsp[a] + cnt[a];
    }
    return contig;
}

/* The root posts all n-1 operations at once, each straight to or from its place in the
 * root's buffer (recvbuf for gather, sendbuf for scatter). */
int tt_linear_rooted(tt_op_t *op, int to_root)
{
    const int n = op->nranks, root = op->root;
    const size_t es = op->elem_size;
    tt_req_t req;

    /* an empty block goes too: a rank that expects one of another size (or none) then
     * fails on its length */
    if (op->rank != root) {
        if (to_root)
            TT_CHECK(tt_p2p_send(op, root, op->sendbuf, op->count * es, 0, &req));
        else
            TT_CHECK(tt_p2p_recv(op, root, op->recvbuf, op->count * es, 0, &req));
        return tt_p2p_wait(op, &req);
    }

    const size_t *cnt = to_root ? op->recvcounts : op->sendcounts;
    const size_t *dsp = to_root ? op->rdispls : op->sdispls;
    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, (size_t)n);
    if (!reqs)
        return TUTTI_ERR_NOMEM;
    int st = TUTTI_OK;
    if (to_root) {
        for (int j = 0; j < n; j++)
            if (j != root)
                TT_CHECK_GOTO(tt_p2p_recv(op, j, tt_blk(op->recvbuf, dsp, j, es), cnt[j] * es, 0,
                                          &reqs[j]),
                              st, out);
    } else {
        for (int j = 0; j < n; j++)
            if (j != root)
                TT_CHECK_GOTO(tt_p2p_send(op, j, tt_cblk(op->sendbuf, dsp, j, es), cnt[j] * es, 0,
                                          &reqs[j]),
                              st, out);
    }
    /* in place, the root's block is already where it belongs */
    if (op->count) {
        unsigned char *own = to_root ? tt_blk(op->recvbuf, dsp, root, es) : op->recvbuf;
        const void *from = to_root ? op->sendbuf : tt_cblk(op->sendbuf, dsp, root, es);
        if (own != from)
            memcpy(own, from, op->count * es);
    }
    st = tt_p2p_wait_all(op, reqs, (size_t)n);
out:
    tt_reqs_put(&hold);
    return st;
}

/* ---- the ring reduce-scatter in pieces ---- */

typedef struct {
    tt_op_t *op;
    const tt_blocks_t *blk;
    int shift;
    size_t piece;      /* elements per piece */
    size_t slot;       /* elements per receive slot */
    unsigned char *sl; /* two receive slots */
    tt_req_t *rreq;    /* rreq[i & 1]: receive piece i */
} ring_rs_t;

static int rmod(int x, int n)
{
    return ((x % n) + n) % n;
}

/* the block that step t receives (sends: t - 1) */
static int rs_recv_block(const ring_rs_t *g, size_t t)
{
    return rmod(g->op->rank - (int)t - 2 + g->shift, g->op->nranks);
}

/* Receive piece i of the stream (step t's piece k): step by step, each block in order. */
static int rs_post_piece(const ring_rs_t *g, size_t i, size_t t, size_t k)
{
    tt_op_t *op = g->op;
    const int n = op->nranks;
    const size_t c = tt_blocks_len(g->blk, n, rs_recv_block(g, t));
    const size_t nk = tt_pieces(c, g->piece), c0 = k * g->piece;
    const size_t cl = c ? TT_MIN(g->piece, c - c0) : 0;
    return tt_p2p_recv(op, rmod(op->rank - 1, n), g->sl + (i & 1) * g->slot * op->elem_size,
                       cl * op->elem_size, tt_piece_tag(n, (int)t, k, nk), &g->rreq[i & 1]);
}

int tt_ring_rs(tt_op_t *op, const tt_blocks_t *blk, int shift, void *dst,
               const unsigned char **out_p)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    const unsigned char *send = op->sendbuf;
    ring_rs_t g = { .op = op, .blk = blk, .shift = shift, .piece = tt_piece_elems(op) };

    size_t maxlen = 0;
    for (int i = 0; i < n; i++)
        maxlen = TT_MAX(maxlen, tt_blocks_len(blk, n, i));
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
            TT_CHECK_GOTO(rs_post_piece(&g, i_post, ti, ki), st, out);                             \
            if (++ki == tt_pieces(tt_blocks_len(blk, n, rs_recv_block(&g, ti)), g.piece)) {        \
                ki = 0;                                                                            \
                ti++;                                                                              \
            }                                                                                      \
        }                                                                                          \
    } while (0)
    POST_AHEAD(2);

    /* step 0's sends, straight from this rank's input */
    {
        const int sb = rmod(r - 1 + shift, n);
        const size_t c = tt_blocks_len(blk, n, sb), nk = tt_pieces(c, g.piece);
        const unsigned char *src = send + tt_blocks_off(blk, n, sb) * es;
        for (size_t k = 0; k < nk; k++) {
            size_t c0 = k * g.piece, cl = c ? TT_MIN(g.piece, c - c0) : 0;
            TT_CHECK_GOTO(tt_p2p_send(op, next, src + c0 * es, cl * es, tt_piece_tag(n, 0, k, nk),
                                      &sreq[0][k]),
                          st, out);
        }
    }
    size_t i = 0;
    unsigned char *part = NULL;
    for (size_t t = 0; t < steps; t++) {
        const int rb = rs_recv_block(&g, t);
        const size_t c = tt_blocks_len(blk, n, rb), nk = tt_pieces(c, g.piece);
        const unsigned char *in = send + tt_blocks_off(blk, n, rb) * es;
        const int last = t + 1 == steps;
        part = last && dst ? dst : half[t & 1];
        for (size_t k = 0; k < nk; k++, i++) {
            size_t c0 = k * g.piece, cl = c ? TT_MIN(g.piece, c - c0) : 0;
            TT_CHECK_GOTO(tt_p2p_wait(op, &g.rreq[i & 1]), st, out);
            if (cl)
                tt_reduce3(part + c0 * es, in + c0 * es, g.sl + (i & 1) * g.slot * es, cl,
                           op->dtype, op->redop);
            POST_AHEAD(i + 3);
            if (!last)
                TT_CHECK_GOTO(tt_p2p_send(op, next, part + c0 * es, cl * es,
                                          tt_piece_tag(n, (int)t + 1, k, nk),
                                          &sreq[(t + 1) & 1][k]),
                              st, out);
        }
        /* step t's sends read the half that step t+1 reduces into */
        const size_t sc = tt_blocks_len(blk, n, rmod(r - (int)t - 1 + shift, n));
        TT_CHECK_GOTO(tt_p2p_wait_all(op, sreq[t & 1], tt_pieces(sc, g.piece)), st, out);
    }
#undef POST_AHEAD
    *out_p = part;
out:
    tt_reqs_put(&hold);
    return st;
}
