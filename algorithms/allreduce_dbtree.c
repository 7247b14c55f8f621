/* Double binary tree allreduce (NCCL's): the vector is split in two halves; each half
 * is reduced up one of two binary trees to its root and broadcast back down the same
 * tree. The trees are complementary: the leaves of one (about half the ranks) are
 * interior nodes of the other, so every rank sends and receives about the same in
 * total, and the depth is log2(n) either way.
 * Design notes: docs/internals.md, "The double binary tree allreduce". */
#include <stdlib.h>
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

enum { DBT_UP = 0, DBT_DOWN = 1 };

typedef struct dbt_tree {
    int parent;         /* -1 at the root */
    int child[2];       /* left, right (in virtual order); -1 where absent */
    int parent_is_root; /* the parent sends chunk k down at key (k, t, up) */
    size_t off, len;    /* the half of the vector this tree carries, in elements */
    size_t nchunks;
    /* per chunk: receives from child 0, child 1 and the parent; sends to the parent
     * (or none) and to the two children */
    tt_req_t *rreq, *sreq;
} dbt_tree_t;

typedef struct dbt {
    tt_op_t *op;
    size_t chunk; /* elements per chunk */
    size_t slot;  /* elements per scratch slot */
    unsigned char *scratch;
    dbt_tree_t tree[2];
} dbt_t;

/* NCCL's binary tree on virtual ranks 0..n-1, virtual rank v: parent and children, -1
 * where there is none. */
static void dbt_btree(int n, int v, int *parent_p, int *left_p, int *right_p)
{
    int bit = 1;
    while (bit < n && !(bit & v))
        bit <<= 1;
    *parent_p = *left_p = *right_p = -1;
    if (v == 0) {
        if (n > 1)
            *right_p = bit >> 1;
        return;
    }
    int up = (v ^ bit) | (bit << 1);
    *parent_p = up < n ? up : v ^ bit;
    int low = bit >> 1;
    if (low) {
        *left_p = v - low;
        int d = low;
        while (d && v + d >= n)
            d >>= 1;
        if (d)
            *right_p = v + d;
    }
}

/* Virtual rank of rank r in tree t, and back. */
static int dbt_virt(int n, int t, int r)
{
    if (t == 0)
        return r;
    return n % 2 ? (r - 1 + n) % n : n - 1 - r;
}

static int dbt_real(int n, int t, int v)
{
    if (t == 0 || v < 0)
        return v;
    return n % 2 ? (v + 1) % n : n - 1 - v;
}

static void dbt_tree_init(dbt_t *d, int t, size_t off, size_t len)
{
    const int n = d->op->nranks;
    dbt_tree_t *tr = &d->tree[t];
    int vp, vl, vr;
    dbt_btree(n, dbt_virt(n, t, d->op->rank), &vp, &vl, &vr);
    tr->parent = dbt_real(n, t, vp);
    tr->child[0] = dbt_real(n, t, vl);
    tr->child[1] = dbt_real(n, t, vr);
    tr->parent_is_root = vp == 0;
    tr->off = off;
    tr->len = len;
    tr->nchunks = len / d->chunk + (len % d->chunk != 0);
}

/* Unique per (chunk, tree, direction) within the op; wraps only past 2^32 messages,
 * and then still agrees on both sides. */
static uint32_t dbt_tag(size_t k, int t, int dir)
{
    return (uint32_t)(((uint64_t)k * 2 + (uint64_t)t) * 2 + (uint64_t)dir);
}

static void dbt_chunk(const dbt_t *d, const dbt_tree_t *tr, size_t k, size_t *off_p, size_t *len_p)
{
    size_t c0 = k * d->chunk;
    *off_p = tr->off + c0;
    *len_p = TT_MIN(d->chunk, tr->len - c0);
}

static unsigned char *dbt_slot(const dbt_t *d, int t, int c, size_t k)
{
    size_t idx = ((size_t)t * 2 + (size_t)c) * 2 + (k & 1);
    return d->scratch + idx * d->slot * d->op->elem_size;
}

static int dbt_post_down_recv(dbt_t *d, dbt_tree_t *tr, int t, size_t k)
{
    tt_op_t *op = d->op;
    size_t off, len;
    dbt_chunk(d, tr, k, &off, &len);
    return tt_p2p_recv(op, tr->parent, (unsigned char *)op->recvbuf + off * op->elem_size,
                       len * op->elem_size, dbt_tag(k, t, DBT_DOWN), &tr->rreq[3 * k + 2]);
}

/* The receives of the messages with key (k, ., .), in key order. */
static int dbt_post_recvs(dbt_t *d, size_t k)
{
    tt_op_t *op = d->op;
    for (int t = 0; t < 2; t++) {
        dbt_tree_t *tr = &d->tree[t];
        if (k < tr->nchunks) {
            size_t off, len;
            dbt_chunk(d, tr, k, &off, &len);
            for (int c = 0; c < 2; c++)
                if (tr->child[c] >= 0)
                    TT_CHECK(tt_p2p_recv(op, tr->child[c], dbt_slot(d, t, c, k),
                                         len * op->elem_size, dbt_tag(k, t, DBT_UP),
                                         &tr->rreq[3 * k + (size_t)c]));
            if (tr->parent >= 0 && tr->parent_is_root)
                TT_CHECK(dbt_post_down_recv(d, tr, t, k));
        }
        if (tr->parent >= 0 && !tr->parent_is_root && k >= 1 && k - 1 < tr->nchunks)
            TT_CHECK(dbt_post_down_recv(d, tr, t, k - 1));
    }
    return TUTTI_OK;
}

static int dbt_send_down(dbt_t *d, dbt_tree_t *tr, int t, size_t k)
{
    tt_op_t *op = d->op;
    const size_t es = op->elem_size;
    size_t off, len;
    dbt_chunk(d, tr, k, &off, &len);
    for (int c = 0; c < 2; c++)
        if (tr->child[c] >= 0)
            TT_CHECK(tt_p2p_send(op, tr->child[c], (unsigned char *)op->recvbuf + off * es,
                                 len * es, dbt_tag(k, t, DBT_DOWN),
                                 &tr->sreq[3 * k + 1 + (size_t)c]));
    return TUTTI_OK;
}

/* Key (k, t, up): reduce chunk k (left child, own, right child) and send it on. */
static int dbt_up(dbt_t *d, int t, size_t k)
{
    tt_op_t *op = d->op;
    dbt_tree_t *tr = &d->tree[t];
    const size_t es = op->elem_size;
    size_t off, len;
    dbt_chunk(d, tr, k, &off, &len);
    const unsigned char *own = (const unsigned char *)op->sendbuf + off * es;
    unsigned char *dst = (unsigned char *)op->recvbuf + off * es;
    const unsigned char *acc = own;
    if (tr->child[0] >= 0) {
        TT_CHECK(tt_p2p_wait(op, &tr->rreq[3 * k]));
        tt_reduce3(dst, dbt_slot(d, t, 0, k), acc, len, op->dtype, op->redop);
        acc = dst;
    }
    if (tr->child[1] >= 0) {
        TT_CHECK(tt_p2p_wait(op, &tr->rreq[3 * k + 1]));
        tt_reduce3(dst, acc, dbt_slot(d, t, 1, k), len, op->dtype, op->redop);
        acc = dst;
    }
    if (tr->parent < 0)
        return dbt_send_down(d, tr, t, k); /* the root: acc == dst, the final result */
    /* a leaf sends its input as it is */
    return tt_p2p_send(op, tr->parent, acc, len * es, dbt_tag(k, t, DBT_UP), &tr->sreq[3 * k]);
}

/* Key (k, t, down): chunk k-1 arrived from the parent; pass it on. */
static int dbt_down(dbt_t *d, int t, size_t k)
{
    dbt_tree_t *tr = &d->tree[t];
    TT_CHECK(tt_p2p_wait(d->op, &tr->rreq[3 * (k - 1) + 2]));
    return dbt_send_down(d, tr, t, k - 1);
}

/* Wait for every send posted (requests never posted are zeroed: status 0, done). */
static int dbt_wait_sends(dbt_t *d)
{
    for (int t = 0; t < 2; t++)
        if (d->tree[t].nchunks)
            TT_CHECK(tt_p2p_wait_all(d->op, d->tree[t].sreq, 3 * d->tree[t].nchunks));
    return TUTTI_OK;
}

int tt_allreduce_dbtree(tt_op_t *op)
{
    const size_t es = op->elem_size;

    if (op->count == 0)
        return TUTTI_OK;

    dbt_t d = { .op = op };
    if (op->chunk_bytes == 0) {
        d.chunk = SIZE_MAX; /* no pipelining */
    } else {
        d.chunk = op->chunk_bytes / es;
        if (!d.chunk)
            d.chunk = 1;
    }
    /* the larger half first: tree 0 carries the odd element */
    const size_t half0 = op->count - op->count / 2;
    dbt_tree_init(&d, 0, 0, half0);
    dbt_tree_init(&d, 1, half0, op->count / 2);
    d.slot = TT_MIN(d.chunk, half0);

    /* 2 trees x 2 children x 2 slots */
    d.scratch = tt_op_scratch(op, 0, 8 * d.slot * es);
    if (!d.scratch)
        return TUTTI_ERR_NOMEM;
    const size_t nck = d.tree[0].nchunks + d.tree[1].nchunks;
    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, 6 * nck);
    if (!reqs)
        return TUTTI_ERR_NOMEM;
    d.tree[0].rreq = reqs;
    d.tree[0].sreq = reqs + 3 * d.tree[0].nchunks;
    d.tree[1].rreq = reqs + 6 * d.tree[0].nchunks;
    d.tree[1].sreq = d.tree[1].rreq + 3 * d.tree[1].nchunks;

    /* iterations 0..K: the last one only brings the last chunk down */
    const size_t iters = TT_MAX(d.tree[0].nchunks, d.tree[1].nchunks) + 1;
    int st;
    TT_CHECK_GOTO(dbt_post_recvs(&d, 0), st, out);
    for (size_t k = 0; k < iters; k++) {
        if (k + 1 < iters)
            TT_CHECK_GOTO(dbt_post_recvs(&d, k + 1), st, out);
        for (int t = 0; t < 2; t++) {
            dbt_tree_t *tr = &d.tree[t];
            if (k < tr->nchunks)
                TT_CHECK_GOTO(dbt_up(&d, t, k), st, out);
            if (tr->parent >= 0 && k >= 1 && k - 1 < tr->nchunks)
                TT_CHECK_GOTO(dbt_down(&d, t, k), st, out);
        }
    }
    TT_CHECK_GOTO(dbt_wait_sends(&d), st, out);

out:
    tt_reqs_put(&hold);
    return st;
}
