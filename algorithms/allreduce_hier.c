/* Hierarchical allreduce for ranks on several hosts (NCCL's intra/inter split): a ring
 * reduce-scatter within each host leaves each of the first S ranks of the host (S: the
 * fewest ranks on any host) with one shard, 1/S of the vector; the ranks with the same
 * local index allreduce their shard across hosts (ring, or recursive doubling where the
 * cost model prefers it); a ring allgather within the host spreads the result. Only 1/S
 * of the vector per rank crosses the slow link, and the S ranks of a host share it.
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

/* One ring pass of m - 1 steps. reduce 1: reduce-scatter of src into dst (this rank's
 * block ends reduced in dst; src may equal dst; the incoming block lands in scratch);
 * 0: allgather of dst's blocks. Empty blocks send nothing, on both ends alike. reqs:
 * 2 maxck requests. */
static int grp_ring(const grp_t *g, const unsigned char *src, unsigned char *dst, int reduce,
                    unsigned char *scratch, tt_req_t *reqs, uint32_t tag0)
{
    tt_op_t *op = g->op;
    const size_t es = op->elem_size;
    const int next = g->rk[grp_mod(g, g->me + 1)], prev = g->rk[grp_mod(g, g->me - 1)];
    for (int t = 0; t < g->m - 1; t++) {
        const int sb = grp_mod(g, g->me - t - reduce), rb = grp_mod(g, g->me - t - 1 - reduce);
        const unsigned char *from = (reduce && t == 0 ? src : dst) + grp_off(g, sb) * es;
        unsigned char *into = reduce ? scratch : dst + grp_off(g, rb) * es;
        const size_t slen = grp_len(g, sb), rlen = grp_len(g, rb);
        const size_t nr = grp_nchunks(g, rlen), ns = grp_nchunks(g, slen);
        const uint32_t tag = tag0 + (uint32_t)((size_t)t * g->maxck);
        for (size_t k = 0; k < nr; k++)
            TT_CHECK(tt_p2p_recv(op, prev, into + k * g->chunk * es,
                                 TT_MIN(g->chunk, rlen - k * g->chunk) * es, tag + (uint32_t)k,
                                 &reqs[k]));
        for (size_t k = 0; k < ns; k++)
            TT_CHECK(tt_p2p_send(op, next, from + k * g->chunk * es,
                                 TT_MIN(g->chunk, slen - k * g->chunk) * es, tag + (uint32_t)k,
                                 &reqs[g->maxck + k]));
        for (size_t k = 0; k < nr; k++) {
            TT_CHECK(tt_p2p_wait(op, &reqs[k]));
            size_t c0 = grp_off(g, rb) + k * g->chunk;
            if (reduce)
                tt_reduce3(dst + c0 * es, src + c0 * es, scratch + k * g->chunk * es,
                           TT_MIN(g->chunk, rlen - k * g->chunk), op->dtype, op->redop);
        }
        TT_CHECK(tt_p2p_wait_all(op, reqs + g->maxck, ns));
    }
    return TUTTI_OK;
}

/* Where this rank sits: its host's ranks (local, in rank order), the ranks with its
 * local index on every host (cross, in host order), and S. */
typedef struct hier {
    int *local, nl, li;
    int *cross, nx, xi;
    int shards;
} hier_t;

static int hier_map(const tt_op_t *op, hier_t *h)
{
    const int n = op->nranks, r = op->rank;
    const int *host = tt_op_host_map(op);
    int nh = 0;
    for (int q = 0; q < n; q++)
        nh = TT_MAX(nh, host ? host[q] + 1 : q + 1);
    int *cnt = calloc((size_t)nh, sizeof(int));
    h->local = malloc((size_t)n * sizeof(int));
    h->cross = malloc((size_t)nh * sizeof(int));
    if (!cnt || !h->local || !h->cross) {
        free(cnt);
        return TUTTI_ERR_NOMEM;
    }
    h->nl = 0;
    for (int q = 0; q < n; q++) {
        int hq = host ? host[q] : q;
        if (hq == (host ? host[r] : r)) {
            if (q == r)
                h->li = h->nl;
            h->local[h->nl++] = q;
        }
        cnt[hq]++;
    }
    h->shards = n;
    for (int k = 0; k < nh; k++)
        h->shards = TT_MIN(h->shards, cnt[k]);
    /* the li-th rank of each host: hosts with fewer ranks never reach here (li < S) */
    h->nx = nh;
    h->xi = host ? host[r] : r;
    memset(cnt, 0, (size_t)nh * sizeof(int));
    for (int q = 0; q < n; q++) {
        int hq = host ? host[q] : q;
        if (cnt[hq]++ == h->li)
            h->cross[hq] = q;
    }
    free(cnt);
    return TUTTI_OK;
}

/* This rank's shard (elements off .. off + len) across hosts, in place in recvbuf */
static int hier_cross(tt_op_t *op, const hier_t *h, const grp_t *lg, unsigned char *scratch,
                      tt_req_t *reqs)
{
    const size_t es = op->elem_size, off = grp_off(lg, h->li), len = grp_len(lg, h->li);
    unsigned char *buf = op->recvbuf;
    if (tt_cost_hier_cross_rd(tt_op_cost(op), len * es, h->nx, h->shards, op->chunk_bytes))
        return tt_rd_group(op, h->cross, h->nx, h->xi, buf + off * es, buf + off * es, len, scratch,
                           HIER_TAG_CROSS_RD);
    grp_t xg = *lg;
    xg.rk = h->cross;
    xg.m = xg.nb = h->nx;
    xg.me = h->xi;
    xg.start = off;
    xg.base = len / (size_t)h->nx;
    xg.rem = len % (size_t)h->nx;
    TT_CHECK(grp_ring(&xg, buf, buf, 1, scratch, reqs, HIER_TAG_CROSS_RS));
    return grp_ring(&xg, buf, buf, 0, scratch, reqs, HIER_TAG_CROSS_AG);
}

static int hier_run(tt_op_t *op, const hier_t *h)
{
    const size_t es = op->elem_size;
    grp_t lg = { .op = op, .rk = h->local, .m = h->nl, .me = h->li, .nb = h->shards };
    lg.base = op->count / (size_t)h->shards;
    lg.rem = op->count % (size_t)h->shards;
    lg.chunk = op->chunk_bytes ? TT_MAX(op->chunk_bytes / es, (size_t)1) : SIZE_MAX;
    lg.maxck = grp_nchunks(&lg, grp_len(&lg, 0));
    unsigned char *scratch = tt_op_scratch(op, 0, TT_MAX(grp_len(&lg, 0) * es, (size_t)1));
    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, 2 * lg.maxck);
    int st = scratch && reqs ? TUTTI_OK : TUTTI_ERR_NOMEM;
    if (st == TUTTI_OK && h->nl > 1)
        st = grp_ring(&lg, op->sendbuf, op->recvbuf, 1, scratch, reqs, HIER_TAG_LOCAL_RS);
    else if (st == TUTTI_OK && op->sendbuf != op->recvbuf)
        memcpy(op->recvbuf, op->sendbuf, op->count * es);
    /* a shard of the same length on every host: all of them skip an empty one */
    if (st == TUTTI_OK && h->li < h->shards && h->nx > 1 && grp_len(&lg, h->li) > 0)
        st = hier_cross(op, h, &lg, scratch, reqs);
    if (st == TUTTI_OK && h->nl > 1)
        st = grp_ring(&lg, op->recvbuf, op->recvbuf, 0, scratch, reqs, HIER_TAG_LOCAL_AG);
    tt_reqs_put(&hold);
    return st;
}

int tt_allreduce_hier(tt_op_t *op)
{
    if (op->count == 0)
        return TUTTI_OK;
    hier_t h = { 0 };
    int st = hier_map(op, &h);
    if (st == TUTTI_OK)
        st = hier_run(op, &h);
    free(h.local);
    free(h.cross);
    return st;
}
