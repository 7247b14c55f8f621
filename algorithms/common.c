/* Helpers shared by the algorithms (see common.h): the binomial tree's layout, the
 * linear rooted exchange behind gather_linear and scatter_linear, and the linear
 * reducing root of allreduce_linear and reduce_scatter_linear.
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
    int copy_own = 0;
    if (to_root) {
        /* the root's own block: copied now if sendbuf lies where a block will land */
        tt_own_block_src(op, &copy_own);
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
    if (to_root && copy_own)
        tt_copy(tt_blk(op->recvbuf, dsp, root, es), op->sendbuf, op->count * es);
    const int late = !to_root && tt_scatter_own_late(op);
    if (!to_root && op->count && !late) {
        const void *from = tt_cblk(op->sendbuf, dsp, root, es);
        if (op->recvbuf != from)
            tt_copy(op->recvbuf, from, op->count * es);
    }
    st = tt_p2p_wait_all(op, reqs, (size_t)n);
    if (st == TUTTI_OK && late)
        memmove(op->recvbuf, tt_cblk(op->sendbuf, dsp, root, es), op->count * es);
out:
    tt_reqs_put(&hold);
    return st;
}

int tt_linear_reduce_root(tt_op_t *op, int root, const void *in, void *acc, size_t bytes,
                          uint32_t tag, unsigned char *tmp, tt_req_t *req)
{
    const int n = op->nranks;
#define LIN_SLOT(i) (tmp + (size_t)((i) < root ? (i) : (i)-1) * bytes)
    for (int i = 0, k = 0; i < n; i++)
        if (i != root)
            TT_CHECK(tt_p2p_recv(op, i, LIN_SLOT(i), bytes, tag, &req[k++]));
    TT_CHECK(tt_p2p_wait_all(op, req, (size_t)(n - 1)));
    const void *cur = root == 0 ? in : LIN_SLOT(0);
    for (int i = 1; i < n && bytes; i++) {
        void *dst = i < root ? LIN_SLOT(0) : acc;
        tt_reduce3(dst, cur, i == root ? in : LIN_SLOT(i), op->count, op->dtype, op->redop);
        cur = dst;
    }
#undef LIN_SLOT
    return TUTTI_OK;
}

int tt_linear_root_bufs(tt_op_t *op, size_t bytes, unsigned char **tmp, tt_reqs_t *hold,
                        tt_req_t **req)
{
    *tmp = tt_op_scratch(op, 0, (size_t)(op->nranks - 1) * bytes);
    if (!*tmp)
        return TUTTI_ERR_NOMEM;
    *req = tt_reqs_get(hold, (size_t)(op->nranks - 1));
    return *req ? TUTTI_OK : TUTTI_ERR_NOMEM;
}

const unsigned char *tt_own_block_src(const tt_op_t *op, int *copy_later)
{
    const size_t es = op->elem_size, *cnt = op->recvcounts, *dsp = op->rdispls;
    const int r = op->rank;
    unsigned char *own = (unsigned char *)op->recvbuf + dsp[r] * es;
    const unsigned char *s = op->sendbuf, *rb = op->recvbuf;
    *copy_later = 0;
    if (!cnt[r] || s == own)
        return own;
    size_t ext = 0;
    for (int i = 0; i < op->nranks; i++)
        ext = TT_MAX(ext, (dsp[i] + cnt[i]) * es);
    if (s + cnt[r] * es <= rb || rb + ext <= s) {
        *copy_later = 1;
        return s;
    }
    tt_copy_overlapping(own, s, cnt[r] * es);
    return own;
}

int tt_scatter_own_late(const tt_op_t *op)
{
    const size_t es = op->elem_size, *cnt = op->sendcounts, *dsp = op->sdispls;
    const unsigned char *s = op->sendbuf, *r = op->recvbuf;
    if (op->rank != op->root || !op->count || !s || !r || r == s + dsp[op->rank] * es)
        return 0;
    size_t ext = 0;
    for (int i = 0; i < op->nranks; i++)
        ext = TT_MAX(ext, (dsp[i] + cnt[i]) * es);
    return r < s + ext && s < r + op->count * es;
}

int tt_hosts_map(const tt_op_t *op, tt_hosts_t *h)
{
    const int n = op->nranks, r = op->rank;
    const int *host = tt_op_host_map(op);
    memset(h, 0, sizeof(*h));
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
    const int mine = host ? host[r] : r;
    for (int q = 0; q < n; q++) {
        int hq = host ? host[q] : q;
        if (hq == mine) {
            if (q == r)
                h->li = h->nl;
            h->local[h->nl++] = q;
        }
        cnt[hq]++;
    }
    h->shards = n;
    int even = 1;
    for (int k = 0; k < nh; k++) {
        h->shards = TT_MIN(h->shards, cnt[k]);
        even &= cnt[k] == h->nl;
    }
    h->nx = nh;
    h->xi = mine;
    /* the li-th rank of each host that has one; the grid, where hosts are even */
    h->grid = even ? malloc((size_t)n * sizeof(int)) : NULL;
    if (even && !h->grid) {
        free(cnt);
        return TUTTI_ERR_NOMEM;
    }
    memset(cnt, 0, (size_t)nh * sizeof(int));
    for (int q = 0; q < n; q++) {
        int hq = host ? host[q] : q, c = cnt[hq]++;
        if (c == h->li)
            h->cross[hq] = q;
        if (h->grid)
            h->grid[hq * h->nl + c] = q;
    }
    free(cnt);
    return TUTTI_OK;
}

void tt_hosts_free(tt_hosts_t *h)
{
    free(h->local);
    free(h->cross);
    free(h->grid);
    h->local = h->cross = h->grid = NULL;
}

void tt_stream_to_one(tt_op_t *op, int receivers, size_t bytes)
{
    if (receivers == 1 && bytes < TT_STREAM_ONE_BYTES && !tt_op_host_crowded(op))
        op->tp_hints &= ~TUTTI_TP_HINT_SINGLE_COPY;
}
