/* Which bytes of a call's buffers its op reads and writes, from its layout (extent.h). */
#include "base/base.h"
#include "coll/extent.h"
#include "coll/topo.h"
#include "core/state.h"

/* The end of the furthest block of a layout, in elements. */
static size_t span(const size_t *counts, const size_t *displs, int n)
{
    size_t end = 0;
    for (int i = 0; i < n; i++)
        if (counts[i])
            end = TT_MAX(end, displs[i] + counts[i]);
    return end;
}

void tt_op_extents(const tt_op_t *op, size_t *sl, size_t *rl)
{
    const size_t es = op->elem_size;
    const int n = op->nranks, me = op->rank;
    *sl = *rl = 0;
    switch (op->coll) {
    case TT_COLL_BROADCAST: /* the root's data only */
        *sl = me == op->root ? op->count * es : 0;
        *rl = op->count * es;
        break;
    case TT_COLL_ALLREDUCE:
    case TT_COLL_SCAN:
    case TT_COLL_EXSCAN:
    case TT_COLL_REDUCE: *sl = *rl = op->count * es; break;
    case TT_COLL_ALLGATHER:
        *sl = op->recvcounts[me] * es;
        *rl = span(op->recvcounts, op->rdispls, n) * es;
        break;
    case TT_COLL_REDUCE_SCATTER:
        *sl = op->count * es;
        *rl = op->recvcounts[me] * es;
        break;
    case TT_COLL_GATHER:
        *sl = op->count * es;
        *rl = me == op->root ? span(op->recvcounts, op->rdispls, n) * es : 0;
        break;
    case TT_COLL_SCATTER:
        *sl = me == op->root ? span(op->sendcounts, op->sdispls, n) * es : 0;
        *rl = op->count * es;
        break;
    case TT_COLL_ALLTOALL:
        *sl = span(op->sendcounts, op->sdispls, n) * es;
        *rl = span(op->recvcounts, op->rdispls, n) * es;
        break;
    case TT_COLL_NEIGHBOR_ALLGATHER:
    case TT_COLL_NEIGHBOR_ALLTOALL: /* per edge (lib/core/op.h) */
        *sl = span(op->sendcounts, op->sdispls, op->comm->topo->outdeg) * es;
        *rl = span(op->recvcounts, op->rdispls, op->comm->topo->indeg) * es;
        break;
    default: break;
    }
}

int tt_op_runs_max(const tt_op_t *op)
{
    const int nb = op->coll == TT_COLL_NEIGHBOR_ALLGATHER || op->coll == TT_COLL_NEIGHBOR_ALLTOALL;
    return nb ? TT_MAX(op->nranks, op->comm->topo->indeg) : op->nranks;
}

/* add(ctx, p, len) for a run that has bytes */
static void add_seg(tt_run_fn add, void *ctx, int *n, const char *p, size_t len)
{
    if (p && len) {
        add(ctx, (char *)p, len);
        (*n)++;
    }
}

int tt_op_written(const tt_op_t *op, tt_run_fn add, void *ctx)
{
    const size_t es = op->elem_size;
    const int n = op->nranks, me = op->rank, root = me == op->root;
    const char *s = op->sendbuf, *r = op->recvbuf;
    int k = 0;
    switch (op->coll) {
    case TT_COLL_BROADCAST:
        if (!root || s != r)
            add_seg(add, ctx, &k, r, op->count * es);
        break;
    case TT_COLL_REDUCE:
        if (root)
            add_seg(add, ctx, &k, r, op->count * es);
        break;
    case TT_COLL_EXSCAN:
        if (me > 0)
            add_seg(add, ctx, &k, r, op->count * es);
        break;
    case TT_COLL_ALLREDUCE:
    case TT_COLL_SCAN: add_seg(add, ctx, &k, r, op->count * es); break;
    case TT_COLL_REDUCE_SCATTER: add_seg(add, ctx, &k, r, op->recvcounts[me] * es); break;
    case TT_COLL_SCATTER:
        if (!(root && r == s + op->sdispls[me] * es))
            add_seg(add, ctx, &k, r, op->count * es);
        break;
    case TT_COLL_GATHER:
        if (!root)
            break;
        /* fall through */
    case TT_COLL_ALLGATHER:
    case TT_COLL_ALLTOALL:
        for (int i = 0; i < n && r; i++) {
            const char *b = r + op->rdispls[i] * es;
            size_t len = op->recvcounts[i] * es;
            /* one rank's alltoallv copies its sendcount (algorithms/local.c) */
            if (n == 1 && op->coll == TT_COLL_ALLTOALL)
                len = TT_MIN(len, op->sendcounts[0] * es);
            if (i != me || op->coll == TT_COLL_ALLTOALL || b != s)
                add_seg(add, ctx, &k, b, len);
        }
        break;
    case TT_COLL_NEIGHBOR_ALLGATHER:
    case TT_COLL_NEIGHBOR_ALLTOALL: /* each source's block (none from TUTTI_PROC_NULL) */
        for (int j = 0; j < op->comm->topo->indeg && r; j++)
            if (op->comm->topo->sources[j] != TUTTI_PROC_NULL)
                add_seg(add, ctx, &k, r + op->rdispls[j] * es, op->recvcounts[j] * es);
        break;
    default: break;
    }
    return k;
}
