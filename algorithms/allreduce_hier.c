/* Hierarchical allreduce for ranks on several hosts (NCCL's intra/inter split): a ring
 * reduce-scatter within each host leaves each of the first S ranks of the host (S: the
 * fewest ranks on any host) with one shard, 1/S of the vector; the ranks with the same
 * local index allreduce their shard across hosts (ring, or recursive doubling where the
 * cost model prefers it); a ring allgather within the host spreads the result. Only 1/S
 * of the vector per rank crosses the slow link, and the S ranks of a host share it.
 * Large vectors go in segments, pipelined (hier_ticks): one segment's shard crosses
 * hosts while the next is reduce-scattered and an earlier one allgathered within the
 * host, so the link and the local copies overlap instead of taking turns.
 *
 * Uneven hosts (different rank counts) take the general form: the local rings of a host
 * with more than S ranks give its extra ranks empty blocks (they reduce and pass blocks
 * on, own no shard and sit out the step across hosts). With one rank on some host, S is
 * 1: a chain reduce and broadcast within each host around a flat allreduce of leaders.
 * Without a host map (one transport served every peer) every rank counts as a host of
 * its own, and hier is the flat ring or rd.
 */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

/* tags: one range per phase (messages of a pair match in order; tags check it) */
#define HIER_TAG_LOCAL_RS (1u << 28)
#define HIER_TAG_CROSS_RS (2u << 28)
#define HIER_TAG_CROSS_AG (3u << 28)
#define HIER_TAG_CROSS_RD (4u << 28)
#define HIER_TAG_LOCAL_AG (5u << 28)

/* A ring among m ranks (rk[0..m-1], this rank rk[me]) over nb blocks laid back to back
 * from element `start`: block j < nb has base + (j < rem) elements, blocks nb..m-1 none. */
typedef struct grp {
    tt_op_t *op;
    const int *rk;
    int m, me, nb;
    size_t start, base, rem;
    size_t chunk, maxck; /* elements per message; messages of the largest block */
    size_t window;       /* a reducing step's receives posted ahead into as many scratch
                            slots (TT_RING_WINDOW, common.h); 0: all at once */
} grp_t;

static int grp_mod(const grp_t *g, int x)
{
    return ((x % g->m) + g->m) % g->m;
}

static size_t grp_len(const grp_t *g, int j)
{
    return j < g->nb ? g->base + ((size_t)j < g->rem) : 0;
}

static size_t grp_off(const grp_t *g, int j)
{
    return g->start + (size_t)j * g->base + TT_MIN((size_t)j, g->rem);
}

static size_t grp_nchunks(const grp_t *g, size_t len)
{
    return len / g->chunk + (len % g->chunk != 0);
}

/* Where chunk k of a reducing step lands in the scratch */
static unsigned char *grp_slot(const grp_t *g, unsigned char *scratch, size_t k)
{
    return scratch + (g->window ? k % g->window : k) * g->chunk * g->op->elem_size;
}

/* Receive chunk k of step t: into its scratch slot when reducing, else into dst */
static int grp_post_recv(const grp_t *g, unsigned char *dst, int reduce, unsigned char *scratch,
                         tt_req_t *reqs, uint32_t tag0, int t, size_t k)
{
    tt_op_t *op = g->op;
    const size_t es = op->elem_size;
    const int prev = g->rk[grp_mod(g, g->me - 1)], rb = grp_mod(g, g->me - t - 1 - reduce);
    const size_t rlen = grp_len(g, rb);
    unsigned char *into = reduce ? grp_slot(g, scratch, k)
                                 : dst + (grp_off(g, rb) + k * g->chunk) * es;
    return tt_p2p_recv(op, prev, into, TT_MIN(g->chunk, rlen - k * g->chunk) * es,
                       tag0 + (uint32_t)((size_t)t * g->maxck + k), &reqs[k]);
}

/* Step t of a ring pass of m - 1 steps. reduce 1: reduce-scatter of src into dst (this
 * rank's block ends reduced in dst; src may equal dst; the incoming block lands in
 * scratch, chunk k in slot k, or k % window with a window); 0: allgather of dst's
 * blocks. Empty blocks send nothing, on both ends alike. reqs: 2 maxck requests.
 * grp_post posts the step's receives (a window's, reducing with one) and sends;
 * grp_finish waits for them, reducing each piece as it lands and posting the receive
 * a window ahead into the slot it freed. */
static int grp_post(const grp_t *g, const unsigned char *src, unsigned char *dst, int reduce,
                    unsigned char *scratch, tt_req_t *reqs, uint32_t tag0, int t)
{
    tt_op_t *op = g->op;
    const size_t es = op->elem_size;
    const int next = g->rk[grp_mod(g, g->me + 1)];
    const int sb = grp_mod(g, g->me - t - reduce), rb = grp_mod(g, g->me - t - 1 - reduce);
    const unsigned char *from = (reduce && t == 0 ? src : dst) + grp_off(g, sb) * es;
    const size_t slen = grp_len(g, sb), rlen = grp_len(g, rb);
    size_t nr = grp_nchunks(g, rlen);
    const size_t ns = grp_nchunks(g, slen);
    const uint32_t tag = tag0 + (uint32_t)((size_t)t * g->maxck);
    if (reduce && g->window)
        nr = TT_MIN(nr, g->window);
    for (size_t k = 0; k < nr; k++)
        TT_CHECK(grp_post_recv(g, dst, reduce, scratch, reqs, tag0, t, k));
    for (size_t k = 0; k < ns; k++)
        TT_CHECK(tt_p2p_send(op, next, from + k * g->chunk * es,
                             TT_MIN(g->chunk, slen - k * g->chunk) * es, tag + (uint32_t)k,
                             &reqs[g->maxck + k]));
    return TUTTI_OK;
}

static int grp_finish(const grp_t *g, const unsigned char *src, unsigned char *dst, int reduce,
                      unsigned char *scratch, tt_req_t *reqs, uint32_t tag0, int t)
{
    tt_op_t *op = g->op;
    const size_t es = op->elem_size;
    const int sb = grp_mod(g, g->me - t - reduce), rb = grp_mod(g, g->me - t - 1 - reduce);
    const size_t rlen = grp_len(g, rb), nr = grp_nchunks(g, rlen);
    for (size_t k = 0; k < nr; k++) {
        TT_CHECK(tt_p2p_wait(op, &reqs[k]));
        size_t c0 = grp_off(g, rb) + k * g->chunk;
        if (!reduce)
            continue;
        tt_reduce3(dst + c0 * es, src + c0 * es, grp_slot(g, scratch, k),
                   TT_MIN(g->chunk, rlen - k * g->chunk), op->dtype, op->redop);
        if (g->window && k + g->window < nr)
            TT_CHECK(grp_post_recv(g, dst, reduce, scratch, reqs, tag0, t, k + g->window));
    }
    return tt_p2p_wait_all(op, reqs + g->maxck, grp_nchunks(g, grp_len(g, sb)));
}

/* A whole ring pass: its m - 1 steps in turn */
static int grp_ring(const grp_t *g, const unsigned char *src, unsigned char *dst, int reduce,
                    unsigned char *scratch, tt_req_t *reqs, uint32_t tag0)
{
    for (int t = 0; t < g->m - 1; t++) {
        TT_CHECK(grp_post(g, src, dst, reduce, scratch, reqs, tag0, t));
        TT_CHECK(grp_finish(g, src, dst, reduce, scratch, reqs, tag0, t));
    }
    return TUTTI_OK;
}

/* The ring among the hosts for this rank's shard of local group lg (elements off ..
 * off + len of recvbuf), of 2(nx - 1) steps: a reduce-scatter, then an allgather */
static grp_t hier_xgrp(const tt_hosts_t *h, const grp_t *lg, size_t chunk)
{
    grp_t xg = *lg;
    const size_t len = grp_len(lg, h->li);
    xg.rk = h->cross;
    xg.m = xg.nb = h->nx;
    xg.me = h->xi;
    xg.start = grp_off(lg, h->li);
    xg.base = len / (size_t)h->nx;
    xg.rem = len % (size_t)h->nx;
    xg.chunk = chunk;
    xg.window = 0; /* posted a tick ahead of their waits: all at once */
    xg.maxck = grp_nchunks(&xg, grp_len(&xg, 0));
    return xg;
}

/* Step i of that ring: posting it (post 1) or waiting for it */
static int hier_xstep(const grp_t *xg, int i, int post, unsigned char *scratch, tt_req_t *reqs,
                      uint32_t seg_tag)
{
    unsigned char *buf = xg->op->recvbuf;
    const int steps = xg->m - 1, reduce = i < steps, t = i % steps;
    const uint32_t tag0 = (reduce ? HIER_TAG_CROSS_RS : HIER_TAG_CROSS_AG) + seg_tag;
    return post ? grp_post(xg, buf, buf, reduce, scratch, reqs, tag0, t)
                : grp_finish(xg, buf, buf, reduce, scratch, reqs, tag0, t);
}

/* Local group lg set to segment s of nseg (the segments lie back to back, as blocks) */
static void hier_seg(grp_t *lg, const tt_hosts_t *h, size_t count, int nseg, int s)
{
    const grp_t all = {
        .m = nseg, .nb = nseg, .base = count / (size_t)nseg, .rem = count % (size_t)nseg
    };
    const size_t len = grp_len(&all, s);
    lg->start = grp_off(&all, s);
    lg->base = len / (size_t)h->shards;
    lg->rem = len % (size_t)h->shards;
}

/* Segments on their way across hosts at once: those of the last D + 1 ticks */
static int hier_slots(int nseg, int D)
{
    return TT_MIN(nseg, D + 1);
}

/* Segment s's tag offset in a phase: each segment's ring passes of m - 1 steps, maxck
 * messages a step, after those of the segments before it */
static uint32_t hier_seg_tag(int s, int m, size_t maxck)
{
    return (uint32_t)((size_t)s * (size_t)(m - 1) * maxck);
}

static size_t hier_align(size_t bytes)
{
    return (bytes + 63) & ~(size_t)63;
}

/* In ticks t = 0, 1, ...: segment t is reduce-scattered within the host and its shard's
 * first step across hosts posted; each segment already on its way finishes one step
 * and posts the next; the segment whose last step finished is allgathered within the
 * host. While a rank waits on one transport the other's requests progress too (the
 * multiplexer drives both), so the link stays busy during the local copies. Every
 * rank of a host runs the local rings in the same order (the same ticks), and the
 * ranks of a shard across hosts post their steps in the same order, which is how
 * messages of a pair match. D steps across hosts (0 with one host, or with recursive
 * doubling, which runs whole at the segment's tick: only ever with one segment). */
static int hier_ticks(tt_op_t *op, const tt_hosts_t *h, grp_t *lg, int nseg, int rd, int D,
                      const grp_t *xg0, unsigned char *lscratch, tt_req_t *lreqs,
                      unsigned char *xscratch, size_t xstride, tt_req_t *xreqs)
{
    const size_t es = op->elem_size;
    const int nslot = hier_slots(nseg, D);
    grp_t xs[2 * TT_HIER_MAX_HOSTS - 1];
    if (nslot > (int)(sizeof(xs) / sizeof(xs[0])))
        return TUTTI_ERR_INTERNAL;
    for (int t = 0; t < nseg + D; t++) {
        if (t < nseg) {
            hier_seg(lg, h, op->count, nseg, t);
            const uint32_t ltag = hier_seg_tag(t, h->nl, lg->maxck);
            if (h->nl > 1)
                TT_CHECK(grp_ring(lg, op->sendbuf, op->recvbuf, 1, lscratch, lreqs,
                                  HIER_TAG_LOCAL_RS + ltag));
            else if (op->sendbuf != op->recvbuf)
                tt_copy((unsigned char *)op->recvbuf + lg->start * es,
                        (const unsigned char *)op->sendbuf + lg->start * es,
                        (lg->base * (size_t)h->shards + lg->rem) * es);
            /* a shard of the same length on every host: all of them skip an empty one */
            if (rd && h->li < h->shards && grp_len(lg, h->li) > 0) {
                unsigned char *b = (unsigned char *)op->recvbuf + grp_off(lg, h->li) * es;
                TT_CHECK(tt_rd_group(op, h->cross, h->nx, h->xi, b, b, grp_len(lg, h->li), xscratch,
                                     HIER_TAG_CROSS_RD));
            }
        }
        for (int s = TT_MAX(0, t - D); s <= t && s < nseg; s++) {
            const int i = t - s; /* steps across hosts segment s has finished by now */
            hier_seg(lg, h, op->count, nseg, s);
            if (D && h->li < h->shards && grp_len(lg, h->li) > 0) {
                grp_t *x = &xs[s % nslot];
                unsigned char *sc = xscratch + (size_t)(s % nslot) * xstride;
                tt_req_t *rq = xreqs + (size_t)(s % nslot) * 2 * xg0->maxck;
                const uint32_t stag = hier_seg_tag(s, h->nx, xg0->maxck);
                if (i == 0) { /* just reduce-scattered: on its way */
                    *x = hier_xgrp(h, lg, xg0->chunk);
                    x->maxck = xg0->maxck;
                } else {
                    TT_CHECK(hier_xstep(x, i - 1, 0, sc, rq, stag));
                }
                if (i < D)
                    TT_CHECK(hier_xstep(x, i, 1, sc, rq, stag));
            }
            if (i == D && h->nl > 1) {
                const uint32_t ltag = hier_seg_tag(s, h->nl, lg->maxck);
                TT_CHECK(grp_ring(lg, op->recvbuf, op->recvbuf, 0, lscratch, lreqs,
                                  HIER_TAG_LOCAL_AG + ltag));
            }
        }
    }
    return TUTTI_OK;
}

static int hier_run(tt_op_t *op, const tt_hosts_t *h)
{
    const size_t es = op->elem_size;
    const size_t chunk = op->chunk_bytes ? TT_MAX(op->chunk_bytes / es, (size_t)1) : SIZE_MAX;
    const int nseg = tt_cost_hier_segments(tt_op_cost(op), op->count * es, h->nx, h->shards,
                                           op->chunk_bytes);
    /* the first segment is the largest: it sizes the buffers and the tags' strides */
    grp_t lg = {
        .op = op, .rk = h->local, .m = h->nl, .me = h->li, .nb = h->shards, .chunk = chunk
    };
    hier_seg(&lg, h, op->count, nseg, 0);
    lg.maxck = grp_nchunks(&lg, grp_len(&lg, 0));
    lg.window = TT_MIN(lg.maxck, (size_t)TT_RING_WINDOW);
    /* a shard is at most grp_len(&lg, 0) long */
    const size_t shard_max = grp_len(&lg, 0);
    const int rd = h->nx > 1 && nseg == 1 &&
                   tt_cost_hier_cross_rd(tt_op_cost(op), shard_max * es, h->nx, h->shards,
                                         op->chunk_bytes);
    const int D = h->nx > 1 && !rd ? 2 * (h->nx - 1) : 0;
    const grp_t xg0 = hier_xgrp(h, &lg, chunk);
    /* the local rings' window of slots (lg.window chunks: no more than a shard) */
    const size_t lbytes = hier_align(TT_MAX(TT_MIN(shard_max, lg.window * chunk) * es, (size_t)1));
    /* recursive doubling wants a whole shard of scratch; a ring step one block of it */
    const size_t xstride = hier_align(rd ? shard_max * es
                                         : TT_MAX(grp_len(&xg0, 0), (size_t)1) * es);
    const size_t nslot = (size_t)hier_slots(nseg, D);
    unsigned char *scratch = tt_op_scratch(op, 0, lbytes + nslot * xstride);
    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, 2 * lg.maxck + nslot * 2 * xg0.maxck);
    int st = scratch && reqs ? TUTTI_OK : TUTTI_ERR_NOMEM;
    if (st == TUTTI_OK)
        st = hier_ticks(op, h, &lg, nseg, rd, D, &xg0, scratch, reqs, scratch + lbytes, xstride,
                        reqs + 2 * lg.maxck);
    tt_reqs_put(&hold);
    return st;
}

int tt_allreduce_hier(tt_op_t *op)
{
    if (op->count == 0)
        return TUTTI_OK;
    tt_hosts_t h;
    int st = tt_hosts_map(op, &h);
    if (st == TUTTI_OK)
        st = hier_run(op, &h);
    tt_hosts_free(&h);
    return st;
}
