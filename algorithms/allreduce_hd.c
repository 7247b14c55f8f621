/* Halving-doubling allreduce (Rabenseifner): a reduce-scatter by recursive halving,
 * then an allgather by recursive doubling. 2 log2(p) rounds like recursive doubling's
 * log2(p), but each rank sends and reduces only 2 (p-1)/p of the vector, like the ring:
 * the choice for mid-sized messages on power-of-two rank counts.
 *
 * The vector is cut into p blocks (count/p elements, the remainder spread over the
 * first blocks). Round j of the reduce-scatter (mask p/2, p/4, .. 1) splits the run of
 * blocks a rank still holds in two: the rank whose folded rank has the mask bit clear
 * keeps the lower half, its partner the upper one; each sends the half it gives away
 * and reduces the half it keeps with what the partner sent. Folded rank f ends with
 * block f fully reduced; the allgather retraces the rounds backwards (mask 1 .. p/2),
 * each rank swapping the run it holds for its partner's. Empty blocks (count < p)
 * make empty halves, which neither side sends: both compute the same lengths.
 *
 * Non-power-of-two rank counts fold first, as recursive doubling does: with p the
 * largest power of two <= n, the first 2 (n - p) ranks pair up, each odd one hands its
 * vector to the even one below it, sits out the rounds and gets the result back at
 * the end. The remaining p ranks run the rounds under folded ranks 0..p-1.
 *
 * Every block is reduced by exactly one rank and then only copied, so every rank ends
 * with the same bits; each reduction still takes the lower rank's partial result as
 * the first operand, so the result does not depend on which side of a pair computes.
 */
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

enum {
    HD_TAG_FOLD = 1,   /* odd rank -> even partner, before the rounds */
    HD_TAG_UNFOLD = 2, /* the result back, after them */
    HD_TAG_RS0 = 16,   /* + reduce-scatter round */
    HD_TAG_AG0 = 80,   /* + allgather round */
};

typedef struct hd {
    size_t base, rem; /* block b: base + (b < rem) elements */
    int extra;        /* ranks folded away: n - p */
} hd_t;

/* Offset, in elements, of block b (b == p: the end of the vector). */
static size_t hd_block_off(const hd_t *h, int b)
{
    return (size_t)b * h->base + TT_MIN((size_t)b, h->rem);
}

/* The rank that runs the rounds as folded rank f. */
static int hd_unfold(const hd_t *h, int f)
{
    return f < h->extra ? 2 * f : f + h->extra;
}

/* Exchange with peer: send blocks [sb, sb + nb) from src, receive the peer's blocks
 * [rb, rb + nb) into dst (both in elements from the start of the vector), then wait
 * for both. Empty runs are skipped on both sides alike. */
static int hd_exchange(tt_op_t *op, const hd_t *h, int peer, uint32_t tag, const unsigned char *src,
                       int sb, unsigned char *dst, int rb, int nb)
{
    const size_t es = op->elem_size;
    const size_t soff = hd_block_off(h, sb), slen = hd_block_off(h, sb + nb) - soff;
    const size_t roff = hd_block_off(h, rb), rlen = hd_block_off(h, rb + nb) - roff;
    tt_req_t req[2];
    size_t nreq = 0;
    if (rlen)
        TT_CHECK(tt_p2p_recv(op, peer, dst, rlen * es, tag, &req[nreq++]));
    if (slen)
        TT_CHECK(tt_p2p_send(op, peer, src + soff * es, slen * es, tag, &req[nreq++]));
    return nreq ? tt_p2p_wait_all(op, req, nreq) : TUTTI_OK;
}

int tt_allreduce_hd(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    const size_t bytes = op->count * es;
    unsigned char *recv = op->recvbuf;

    if (op->count == 0)
        return TUTTI_OK;

    int p = 1;
    while (p <= n / 2)
        p *= 2;
    const hd_t h = {
        .base = op->count / (size_t)p,
        .rem = op->count % (size_t)p,
        .extra = n - p,
    };
    const int folds = r < 2 * h.extra;

    /* The fold receives a whole vector; the first round the largest half (the lower
     * one, which holds the remainder); later rounds less. */
    unsigned char *tmp = tt_op_scratch(op, 0, folds ? bytes : hd_block_off(&h, p / 2) * es);
    if (!tmp)
        return TUTTI_ERR_NOMEM;

    tt_req_t req;
    /* This rank's partial result: sendbuf until the first reduction writes recvbuf, so
     * that out of place needs no copy. Later rounds only read what a reduction wrote. */
    const unsigned char *cur = op->sendbuf;
    int f;

    if (folds) {
        if (r & 1) {
            /* In place, the result lands where the send reads: finish the send first. */
            TT_CHECK(tt_p2p_send(op, r - 1, cur, bytes, HD_TAG_FOLD, &req));
            TT_CHECK(tt_p2p_wait(op, &req));
            TT_CHECK(tt_p2p_recv(op, r - 1, recv, bytes, HD_TAG_UNFOLD, &req));
            return tt_p2p_wait(op, &req);
        }
        TT_CHECK(tt_p2p_recv(op, r + 1, tmp, bytes, HD_TAG_FOLD, &req));
        TT_CHECK(tt_p2p_wait(op, &req));
        tt_reduce3(recv, cur, tmp, op->count, op->dtype, op->redop);
        cur = recv;
        f = r / 2;
    } else {
        f = r - h.extra;
    }

    /* Reduce-scatter: this rank holds blocks [b0, b0 + 2 mask) at the start of a round
     * and keeps the half on its side of the mask bit. The received half lands in tmp;
     * the half given away is not touched again until the allgather brings it back
     * (after the send has completed: every round waits for both directions). */
    int b0 = 0;
    uint32_t round = 0;
    for (int mask = p / 2; mask >= 1; mask >>= 1, round++) {
        const int pf = f ^ mask, peer = hd_unfold(&h, pf);
        const int keep = (f & mask) ? b0 + mask : b0;
        const int give = (f & mask) ? b0 : b0 + mask;
        TT_CHECK(hd_exchange(op, &h, peer, HD_TAG_RS0 + round, cur, give, tmp, keep, mask));
        const size_t off = hd_block_off(&h, keep);
        const size_t len = hd_block_off(&h, keep + mask) - off;
        if (len) {
            if (r < peer)
                tt_reduce3(recv + off * es, cur + off * es, tmp, len, op->dtype, op->redop);
            else
                tt_reduce3(recv + off * es, tmp, cur + off * es, len, op->dtype, op->redop);
        }
        cur = recv;
        b0 = keep;
    }

    /* Allgather: before the round of a mask, this rank holds blocks
     * [f & ~(mask - 1), + mask), its partner the run next to it. */
    round = 0;
    for (int mask = 1; mask < p; mask <<= 1, round++) {
        const int pf = f ^ mask, peer = hd_unfold(&h, pf);
        TT_CHECK(hd_exchange(op, &h, peer, HD_TAG_AG0 + round, recv, f & ~(mask - 1),
                             recv + hd_block_off(&h, pf & ~(mask - 1)) * es, pf & ~(mask - 1),
                             mask));
    }

    if (folds) {
        TT_CHECK(tt_p2p_send(op, r + 1, recv, bytes, HD_TAG_UNFOLD, &req));
        TT_CHECK(tt_p2p_wait(op, &req));
    }
    return TUTTI_OK;
}
