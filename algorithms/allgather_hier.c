/* Hierarchical allgather for ranks on several hosts, H hosts of S ranks each (Open MPI's
 * han and NCCL's intra/inter split): the ranks with the same local index (a column, one
 * per host) run a ring across hosts, which leaves each rank with its column's H blocks;
 * then the ranks of a host run a ring within it for each host's S blocks in turn. A
 * host's link carries (H - 1)/H of the result each way, shared by its S ranks, where a
 * flat ring over hosts carries (p - 1)/p of it across every boundary it crosses (3/4
 * against 1/2 for 2 hosts of 2; with the hosts interleaved in rank order the flat ring
 * crosses at every step).
 *
 * The two overlap: the ring within the host for host (xi - t)'s blocks runs while step
 * t across hosts is on its way, since each rank of the host got its block of that host
 * at step t - 1 (at t = 0 it is its own host's). Blocks of more than 1 MiB go in
 * segments (at most 16), and the last ring within the host of one segment runs while
 * the next segment's first step across is on its way, so the link is seldom idle. While
 * a rank waits on the local transport, the multiplexer drives the remote one's requests
 * too. Every rank of a host runs the local rings in the same order, which is how the
 * messages of a pair match.
 *
 * Any layout (allgatherv): sizes from recvcounts, places from this rank's rdispls, as
 * the ring. Hosts with different rank counts, one host, or one rank a host run the flat
 * ring (the cost model never picks hier there).
 */
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

#include "common.h"

/* tags: one range across hosts, one within (messages of a pair match in order) */
#define AGH_TAG_CROSS (1u << 28)
#define AGH_TAG_LOCAL (2u << 28)

typedef struct {
    tt_op_t *op;
    const tt_hosts_t *h;
    int K;                    /* segments a block */
    const unsigned char *own; /* this rank's block: sendbuf, or its place in recvbuf */
    tt_req_t xr[2];           /* the step across hosts on its way (one at a time) */
} agh_t;

/* The ring within this host over segment k of host hh's blocks (the c-th of which the
 * c-th local rank holds) */
static int agh_local(const agh_t *g, int k, int hh, uint32_t pass)
{
    tt_op_t *op = g->op;
    const tt_hosts_t *h = g->h;
    const int S = h->nl, li = h->li;
    const size_t es = op->elem_size, *cnt = op->recvcounts, *dsp = op->rdispls;
    unsigned char *recv = op->recvbuf;
    const int *row = h->grid + hh * S;
    const int next = h->local[tt_mod(li + 1, S)], prev = h->local[tt_mod(li - 1, S)];
    tt_req_t req[2];
    for (int s = 0; s < S - 1; s++) {
        const int sb = row[tt_mod(li - s, S)], rb = row[tt_mod(li - s - 1, S)];
        const size_t so = tt_seg_off(cnt[sb], g->K, k), ro = tt_seg_off(cnt[rb], g->K, k);
        const void *src = sb == op->rank ? g->own + so * es : recv + (dsp[sb] + so) * es;
        const uint32_t tag = AGH_TAG_LOCAL + pass * (uint32_t)S + (uint32_t)s;
        TT_CHECK(tt_p2p_send(op, next, src, tt_seg_len(cnt[sb], g->K, k) * es, tag, &req[1]));
        TT_CHECK(tt_p2p_recv(op, prev, recv + (dsp[rb] + ro) * es,
                             tt_seg_len(cnt[rb], g->K, k) * es, tag, &req[0]));
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
    }
    return TUTTI_OK;
}

/* Post step t across hosts of segment k: host (xi - t)'s block of this column on, host
 * (xi - t - 1)'s in */
static int agh_post(agh_t *g, int k, int t)
{
    tt_op_t *op = g->op;
    const tt_hosts_t *h = g->h;
    const int H = h->nx, S = h->nl, li = h->li, xi = h->xi;
    const size_t es = op->elem_size, *cnt = op->recvcounts, *dsp = op->rdispls;
    unsigned char *recv = op->recvbuf;
    const int sb = h->grid[tt_mod(xi - t, H) * S + li],
              rb = h->grid[tt_mod(xi - t - 1, H) * S + li];
    const size_t so = tt_seg_off(cnt[sb], g->K, k), ro = tt_seg_off(cnt[rb], g->K, k);
    const uint32_t tag = AGH_TAG_CROSS + (uint32_t)(k * (H - 1) + t);
    const int xnext = h->grid[tt_mod(xi + 1, H) * S + li],
              xprev = h->grid[tt_mod(xi - 1, H) * S + li];
    TT_CHECK(tt_p2p_send(op, xnext, t == 0 ? g->own + so * es : recv + (dsp[sb] + so) * es,
                         tt_seg_len(cnt[sb], g->K, k) * es, tag, &g->xr[1]));
    return tt_p2p_recv(op, xprev, recv + (dsp[rb] + ro) * es, tt_seg_len(cnt[rb], g->K, k) * es,
                       tag, &g->xr[0]);
}

/* Segment by segment: the ring within the host for host (xi - t)'s blocks while step t
 * across hosts is on its way; the last one (host xi + 1's) while the next segment's
 * first step is */
static int agh_run(tt_op_t *op, const tt_hosts_t *h)
{
    const int H = h->nx;
    const size_t es = op->elem_size, *cnt = op->recvcounts;
    agh_t g = { .op = op, .h = h };
    size_t maxlen = 0;
    for (int q = 0; q < op->nranks; q++)
        maxlen = TT_MAX(maxlen, cnt[q]);
    g.K = tt_hier_block_segs(maxlen * es);
    int copy_own;
    g.own = tt_own_block_src(op, &copy_own);
    TT_CHECK(agh_post(&g, 0, 0));
    if (copy_own)
        tt_copy((unsigned char *)op->recvbuf + op->rdispls[op->rank] * es, op->sendbuf,
                cnt[op->rank] * es);
    uint32_t pass = 0;
    for (int k = 0; k < g.K; k++)
        for (int t = 0; t < H; t++) {
            TT_CHECK(agh_local(&g, k, tt_mod(h->xi - t, H), pass++));
            if (t == H - 1)
                continue;
            TT_CHECK(tt_p2p_wait_all(op, g.xr, 2));
            if (t + 1 < H - 1)
                TT_CHECK(agh_post(&g, k, t + 1));
            else if (k + 1 < g.K)
                TT_CHECK(agh_post(&g, k + 1, 0));
        }
    return TUTTI_OK;
}

int tt_allgather_hier(tt_op_t *op)
{
    tt_hosts_t h;
    int st = tt_hosts_map(op, &h);
    if (st == TUTTI_OK)
        st = h.grid && h.nx > 1 && h.nl > 1 ? agh_run(op, &h) : tt_allgather_ring(op);
    tt_hosts_free(&h);
    return st;
}
