/* Hierarchical reduce-scatter for ranks on several hosts, H hosts of S ranks each: the
 * mirror of allgather_hier.c. For each host j in turn, the ranks of this host run a ring
 * reduce-scatter within it over host j's S blocks, which leaves the c-th local rank with
 * this host's sum of block (j, c) (host j's c-th rank's block). The ranks with the same
 * local index (a column, one per host) then run a ring reduce-scatter across hosts over
 * those partial sums, which ends with each rank's own block reduced over every rank. A
 * host's link carries (H - 1)/H of the input each way, shared by its S ranks, where a
 * flat ring over hosts carries (p - 1)/p of it across every boundary it crosses.
 *
 * The two overlap: step t across hosts sends host (xi - t - 1)'s partial and receives
 * host (xi - t - 2)'s, and the ring within the host that makes this host's partial of the
 * latter runs while the step is on its way; the local rings go in that order (host xi - 1
 * first, this rank's own host last), the same on every rank of a host, which is how the
 * messages of a pair match. Each block is reduced along one path, so every rank's block
 * has one operand order, fixed for a given host map.
 *
 * Any layout (reduce_scatterv): sizes from recvcounts, input blocks at rdispls, as the
 * ring. In place (sendbuf == recvbuf) the result goes to the start of the buffer, written
 * only after the last local ring has read the input. Hosts with different rank counts,
 * one host, or one rank a host run the flat ring (the cost model never picks hier there).
 */
#include <stdint.h>
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

#include "common.h"

#define RSH_TAG_CROSS (1u << 28)
#define RSH_TAG_LOCAL (2u << 28)

typedef struct {
    tt_op_t *op;
    const tt_hosts_t *h;
    int K;                          /* segments a block */
    size_t poff[TT_HIER_MAX_HOSTS]; /* host j's partial of a segment at part[] + poff[j] */
    unsigned char *part[2];         /* a segment's partials of this column, by parity */
    unsigned char *xtmp[2];         /* where a segment's step across hosts lands */
    unsigned char *cur, *tmp;       /* a local ring's partial, and where its pieces land */
    unsigned char *res;             /* the result, where recvbuf overlaps the input */
    tt_req_t xr[2][2];              /* a segment's step across hosts, by parity */
} rsh_t;

static size_t col_cnt(const rsh_t *g, int hh)
{
    return g->op->recvcounts[g->h->grid[hh * g->h->nl + g->h->li]];
}

/* The ring within this host over segment k of host hh's blocks: this rank's host sum of
 * segment k of block (hh, li) into part */
static int rsh_local(const rsh_t *g, int k, int hh, uint32_t pass)
{
    tt_op_t *op = g->op;
    const tt_hosts_t *h = g->h;
    const int S = h->nl, li = h->li;
    const size_t es = op->elem_size, *cnt = op->recvcounts, *dsp = op->rdispls;
    const unsigned char *send = op->sendbuf;
    const int *row = h->grid + hh * S;
    const int next = h->local[tt_mod(li + 1, S)], prev = h->local[tt_mod(li - 1, S)];
    tt_req_t req[2];
    for (int s = 0; s < S - 1; s++) {
        const int sb = row[tt_mod(li - s - 1, S)], rb = row[tt_mod(li - s - 2, S)];
        const size_t sl = tt_seg_len(cnt[sb], g->K, k), rl = tt_seg_len(cnt[rb], g->K, k);
        const uint32_t tag = RSH_TAG_LOCAL + pass * (uint32_t)S + (uint32_t)s;
        TT_CHECK(tt_p2p_recv(op, prev, g->tmp, rl * es, tag, &req[0]));
        TT_CHECK(tt_p2p_send(op, next,
                             s == 0 ? send + (dsp[sb] + tt_seg_off(cnt[sb], g->K, k)) * es : g->cur,
                             sl * es, tag, &req[1]));
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
        unsigned char *dst = s == S - 2 ? g->part[k & 1] + g->poff[hh] * es : g->cur;
        if (rl)
            tt_reduce3(dst, send + (dsp[rb] + tt_seg_off(cnt[rb], g->K, k)) * es, g->tmp, rl,
                       op->dtype, op->redop);
    }
    return TUTTI_OK;
}

/* Post step t across hosts of segment k: this host's partial of host (xi - t - 1) on,
 * host (xi - t - 2)'s from the previous host in */
static int rsh_post(rsh_t *g, int k, int t, int xnext, int xprev)
{
    tt_op_t *op = g->op;
    const int H = g->h->nx, xi = g->h->xi;
    const int sh = tt_mod(xi - t - 1, H), rh = tt_mod(xi - t - 2, H);
    const size_t es = op->elem_size;
    const uint32_t tag = RSH_TAG_CROSS + (uint32_t)(k * (H - 1) + t);
    TT_CHECK(tt_p2p_recv(op, xprev, g->xtmp[k & 1], tt_seg_len(col_cnt(g, rh), g->K, k) * es, tag,
                         &g->xr[k & 1][0]));
    return tt_p2p_send(op, xnext, g->part[k & 1] + g->poff[sh] * es,
                       tt_seg_len(col_cnt(g, sh), g->K, k) * es, tag, &g->xr[k & 1][1]);
}

/* Segment by segment, each segment's step t across hosts on its way while the ring
 * within the host makes the partial it will be reduced with; the next segment's first
 * partial is made, and its first step posted, while the last step of this one moves */
static int rsh_run(tt_op_t *op, const tt_hosts_t *h)
{
    const int H = h->nx, S = h->nl, li = h->li, xi = h->xi, n = op->nranks;
    const size_t es = op->elem_size, *cnt = op->recvcounts, *dsp = op->rdispls;
    if (H > TT_HIER_MAX_HOSTS)
        return tt_reduce_scatter_ring(op);
    rsh_t g = { .op = op, .h = h };
    size_t maxlen = 0, extent = 0;
    for (int q = 0; q < n; q++) {
        maxlen = TT_MAX(maxlen, cnt[q]);
        extent = TT_MAX(extent, dsp[q] + cnt[q]);
    }
    g.K = tt_hier_block_segs(maxlen * es);
    size_t colsum = 0, colmax = 0, seg_max = tt_seg_len(maxlen, g.K, 0);
    for (int j = 0; j < H; j++) { /* segment 0 is the longest */
        const size_t c = tt_seg_len(cnt[h->grid[j * S + li]], g.K, 0);
        g.poff[j] = colsum;
        colsum += c;
        colmax = TT_MAX(colmax, c);
    }
    /* the result goes to recvbuf as each segment ends, unless recvbuf overlaps input a
     * later segment still reads: then to res, copied at the end */
    const uintptr_t send = (uintptr_t)op->sendbuf, recv = (uintptr_t)op->recvbuf;
    const int overlap = recv < send + extent * es && send < recv + cnt[op->rank] * es;
    const size_t need = 2 * colsum + 2 * colmax + 2 * seg_max + (overlap ? cnt[op->rank] : 0);
    unsigned char *scratch = tt_op_scratch(op, 0, TT_MAX(need * es, (size_t)1));
    if (!scratch)
        return TUTTI_ERR_NOMEM;
    g.part[0] = scratch;
    g.part[1] = g.part[0] + colsum * es;
    g.xtmp[0] = g.part[1] + colsum * es;
    g.xtmp[1] = g.xtmp[0] + colmax * es;
    g.cur = g.xtmp[1] + colmax * es;
    g.tmp = g.cur + seg_max * es;
    g.res = overlap ? g.tmp + seg_max * es : op->recvbuf;
    const int xnext = h->grid[tt_mod(xi + 1, H) * S + li],
              xprev = h->grid[tt_mod(xi - 1, H) * S + li];
    uint32_t pass = 0; /* local rings so far: their tags */
    TT_CHECK(rsh_local(&g, 0, tt_mod(xi - 1, H), pass++));
    TT_CHECK(rsh_post(&g, 0, 0, xnext, xprev));
    for (int k = 0; k < g.K; k++) {
        for (int t = 0; t < H - 1; t++) {
            const int rh = tt_mod(xi - t - 2, H);
            const size_t rl = tt_seg_len(col_cnt(&g, rh), g.K, k);
            unsigned char *mine = g.part[k & 1] + g.poff[rh] * es;
            TT_CHECK(rsh_local(&g, k, rh, pass++)); /* this host's partial of what comes in */
            if (t == H - 2 && k + 1 < g.K) {        /* the next segment's first step, ready to go */
                TT_CHECK(rsh_local(&g, k + 1, tt_mod(xi - 1, H), pass++));
                TT_CHECK(rsh_post(&g, k + 1, 0, xnext, xprev));
            }
            TT_CHECK(tt_p2p_wait_all(op, g.xr[k & 1], 2));
            /* the last step brings this rank's own block */
            unsigned char *dst = t == H - 2 ? g.res + tt_seg_off(cnt[op->rank], g.K, k) * es : mine;
            if (rl)
                tt_reduce3(dst, mine, g.xtmp[k & 1], rl, op->dtype, op->redop);
            if (t < H - 2)
                TT_CHECK(rsh_post(&g, k, t + 1, xnext, xprev));
        }
    }
    if (overlap && cnt[op->rank]) /* every input read, every send done */
        memmove(op->recvbuf, g.res, cnt[op->rank] * es);
    return TUTTI_OK;
}

int tt_reduce_scatter_hier(tt_op_t *op)
{
    tt_hosts_t h;
    int st = tt_hosts_map(op, &h);
    if (st == TUTTI_OK)
        st = h.grid && h.nx > 1 && h.nl > 1 ? rsh_run(op, &h) : tt_reduce_scatter_ring(op);
    tt_hosts_free(&h);
    return st;
}
