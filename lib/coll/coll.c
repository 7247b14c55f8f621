/* The collectives beyond allreduce/broadcast/barrier: argument checks, and the layout
 * arrays (counts and displacements per rank) copied into one block the executor owns,
 * so that async calls need not keep the caller's arrays alive. */
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "base/base.h"

/* What a public entry point knows; coll_issue turns it into an op. */
typedef struct coll_desc {
    const char *name;
    tt_coll_t coll;
    const void *sendbuf;
    void *recvbuf;
    size_t count;          /* reduce: elements; gather: sendcount; scatter: recvcount */
    const size_t *sendcounts, *sdispls, *recvcounts, *rdispls; /* user's, may be NULL */
    size_t equal;          /* equal-block forms: the block; 0 for v forms */
    int is_v;
    tutti_dtype_t dtype;
    tutti_redop_t redop;
    int has_redop;
    int root;
    int has_root;
} coll_desc_t;

static int fail(tutti_comm_t *comm, const char *name, const char *what)
{
    return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: %s", name, what);
}

/* counts[i] (and displs[i], or prefix sums when displs is NULL) into dst_counts and
 * dst_displs; checks that every block fits in SIZE_MAX bytes. Returns the extent (the
 * elements a buffer must hold) in *extent_p. */
static int copy_layout(tutti_comm_t *comm, const char *name, const char *what, int n,
                       size_t es, const size_t *counts, const size_t *displs, size_t *dst_counts,
                       size_t *dst_displs, size_t *extent_p)
{
    size_t extent = 0, sum = 0;
    if (!counts) {
        tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: %s is NULL", name, what);
        return TUTTI_ERR_INVALID_ARG;
    }
    const size_t limit = SIZE_MAX / es / 4;
    for (int i = 0; i < n; i++) {
        size_t d = displs ? displs[i] : sum;
        if (counts[i] > limit || d > limit)
            return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                     "%s: %s[%d] = %zu (or its displacement) is too large", name,
                                     what, i, counts[i]);
        dst_counts[i] = counts[i];
        dst_displs[i] = d;
        sum += counts[i];
        if (sum > limit)
            return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: %s sum to too much",
                                     name, what);
        extent = TT_MAX(extent, d + counts[i]);
    }
    *extent_p = extent;
    return TUTTI_OK;
}

static void fill_equal(int n, size_t block, size_t *counts, size_t *displs)
{
    for (int i = 0; i < n; i++) {
        counts[i] = block;
        displs[i] = (size_t)i * block;
    }
}

static int coll_issue(tutti_comm_t *comm, const coll_desc_t *d, tutti_work_t **work_p,
                      int async)
{
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (async && !work_p)
        return fail(comm, d->name, "work_p is NULL");
    const int n = comm->nranks, me = comm->rank;
    if ((unsigned)d->dtype >= TUTTI_DTYPE_COUNT)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: invalid dtype %d", d->name,
                                 (int)d->dtype);
    if (d->has_redop && (unsigned)d->redop >= TUTTI_REDOP_COUNT)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: invalid op %d", d->name,
                                 (int)d->redop);
    if (d->has_root && (d->root < 0 || d->root >= n))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: root %d is not in [0, %d)",
                                 d->name, d->root, n);
    const size_t es = tutti_dtype_size(d->dtype);
    if (d->count > SIZE_MAX / es / 4 || d->equal > SIZE_MAX / es / 4 / (size_t)n)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: count is too large",
                                 d->name);
    const int is_root = d->has_root && me == d->root;

    size_t *layout = calloc(4 * (size_t)n, sizeof(size_t));
    if (!layout)
        return TUTTI_ERR_NOMEM;
    size_t *sc = layout, *sd = layout + n, *rc = layout + 2 * n, *rd = layout + 3 * n;
    tt_op_t o;
    memset(&o, 0, sizeof(o));
    o.comm = comm;
    o.rank = me;
    o.nranks = n;
    o.coll = d->coll;
    o.dtype = d->dtype;
    o.elem_size = es;
    o.redop = d->has_redop && d->redop == TUTTI_AVG ? TUTTI_SUM : d->redop;
    o.root = d->has_root ? d->root : 0;
    o.chunk_bytes = comm->opts.chunk_bytes;
    o.sendcounts = sc;
    o.sdispls = sd;
    o.recvcounts = rc;
    o.rdispls = rd;
    int in_place = d->sendbuf == TUTTI_IN_PLACE;
    size_t ext = 0, sext = 0;
    int st = TUTTI_OK;
    const char *s = in_place ? NULL : d->sendbuf;
    char *r = d->recvbuf;

    switch (d->coll) {
    case TT_COLL_REDUCE:
        o.count = d->count;
        o.env_count = d->count;
        if (d->count && !is_root && !s)
            st = fail(comm, d->name, "sendbuf is NULL");
        else if (d->count && is_root && !r)
            st = fail(comm, d->name, "recvbuf is NULL at the root");
        else if (d->count && is_root && !s && !in_place)
            st = fail(comm, d->name, "sendbuf is NULL (use TUTTI_IN_PLACE for in place)");
        o.sendbuf = (is_root && (in_place || !s)) ? r : s;
        o.recvbuf = is_root ? r : NULL;
        break;
    case TT_COLL_ALLGATHER:
        if (d->is_v)
            st = copy_layout(comm, d->name, "recvcounts", n, es, d->recvcounts, d->rdispls, rc,
                             rd, &ext);
        else
            fill_equal(n, d->equal, rc, rd), ext = (size_t)n * d->equal;
        if (st < 0)
            break;
        for (int i = 0; i < n; i++)
            o.count += rc[i];
        o.env_count = o.count;
        if (ext && !r)
            st = fail(comm, d->name, "recvbuf is NULL");
        else if (rc[me] && !in_place && !s)
            st = fail(comm, d->name, "sendbuf is NULL (use TUTTI_IN_PLACE for in place)");
        o.recvbuf = r;
        o.sendbuf = in_place ? r + rd[me] * es : s;
        break;
    case TT_COLL_REDUCE_SCATTER:
        if (d->is_v)
            st = copy_layout(comm, d->name, "recvcounts", n, es, d->recvcounts, NULL, rc, rd,
                             &ext);
        else
            fill_equal(n, d->equal, rc, rd), ext = (size_t)n * d->equal;
        if (st < 0)
            break;
        o.count = ext;
        o.env_count = ext;
        if (ext && !r && rc[me])
            st = fail(comm, d->name, "recvbuf is NULL");
        else if (ext && !in_place && !s)
            st = fail(comm, d->name, "sendbuf is NULL (use TUTTI_IN_PLACE for in place)");
        o.recvbuf = r;
        o.sendbuf = in_place ? r : s;
        break;
    case TT_COLL_GATHER:
        o.count = d->count;
        if (d->is_v) {
            /* recvcounts matter at the root only; elsewhere the layout holds this
             * rank's own block */
            if (is_root)
                st = copy_layout(comm, d->name, "recvcounts", n, es, d->recvcounts, d->rdispls,
                                 rc, rd, &ext);
            else
                rc[me] = d->count;
            o.env_count = 0;
            if (st == TUTTI_OK && is_root && rc[me] != d->count)
                st = tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                       "%s: the root's sendcount %zu differs from "
                                       "recvcounts[root] = %zu", d->name, d->count, rc[me]);
        } else {
            fill_equal(n, d->count, rc, rd);
            ext = (size_t)n * d->count;
            o.env_count = d->count;
        }
        if (st < 0)
            break;
        if (is_root && ext && !r)
            st = fail(comm, d->name, "recvbuf is NULL at the root");
        else if (d->count && !in_place && !s)
            st = fail(comm, d->name, "sendbuf is NULL");
        else if (in_place && !is_root)
            st = fail(comm, d->name, "TUTTI_IN_PLACE is for the root only");
        o.recvbuf = is_root ? r : NULL;
        o.sendbuf = in_place ? r + rd[me] * es : s;
        break;
    case TT_COLL_SCATTER:
        o.count = d->count;
        if (d->is_v) {
            if (is_root)
                st = copy_layout(comm, d->name, "sendcounts", n, es, d->sendcounts, d->rdispls,
                                 sc, sd, &sext);
            else
                sc[me] = d->count;
            o.env_count = 0;
            if (st == TUTTI_OK && is_root && sc[me] != d->count)
                st = tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                       "%s: the root's recvcount %zu differs from "
                                       "sendcounts[root] = %zu", d->name, d->count, sc[me]);
        } else {
            fill_equal(n, d->count, sc, sd);
            sext = (size_t)n * d->count;
            o.env_count = d->count;
        }
        if (st < 0)
            break;
        if (is_root && sext && !d->sendbuf)
            st = fail(comm, d->name, "sendbuf is NULL at the root");
        else if (d->count && !r)
            st = fail(comm, d->name, "recvbuf is NULL");
        o.sendbuf = is_root ? d->sendbuf : NULL;
        o.recvbuf = (is_root && r == TUTTI_IN_PLACE_OUT) ? (char *)d->sendbuf + sd[me] * es : r;
        break;
    case TT_COLL_ALLTOALL:
        if (d->is_v) {
            st = copy_layout(comm, d->name, "recvcounts", n, es, d->recvcounts, d->rdispls, rc,
                             rd, &ext);
            if (st == TUTTI_OK && !in_place)
                st = copy_layout(comm, d->name, "sendcounts", n, es, d->sendcounts, d->sdispls,
                                 sc, sd, &sext);
            else if (st == TUTTI_OK) {
                memcpy(sc, rc, (size_t)n * sizeof(size_t));
                memcpy(sd, rd, (size_t)n * sizeof(size_t));
                sext = ext;
            }
            o.env_count = 0;
        } else {
            fill_equal(n, d->count, rc, rd);
            fill_equal(n, d->count, sc, sd);
            ext = sext = (size_t)n * d->count;
            o.env_count = d->count;
        }
        if (st < 0)
            break;
        for (int i = 0; i < n; i++)
            o.count += sc[i];
        if (ext && !r)
            st = fail(comm, d->name, "recvbuf is NULL");
        else if (sext && !in_place && !s)
            st = fail(comm, d->name, "sendbuf is NULL (use TUTTI_IN_PLACE for in place)");
        o.recvbuf = r;
        o.sendbuf = in_place ? r : s;
        break;
    default:
        st = TUTTI_ERR_INTERNAL;
        break;
    }
    if (st < 0) {
        free(layout);
        return st;
    }
    o.fingerprint = tt_fingerprint(d->coll, d->dtype, d->has_redop ? d->redop : 0,
                                   d->has_root ? d->root : 0) |
                    (d->is_v ? TT_FP_V : 0);
    return tt_exec_issue(comm, &o, d->has_redop ? d->redop : TUTTI_SUM, layout,
                         async ? work_p : NULL);
}

/* ---- the entry points ---- */

#define REDUCE_DESC(nm)                                                                 \
    coll_desc_t d = {.name = nm, .coll = TT_COLL_REDUCE, .sendbuf = sendbuf,            \
                     .recvbuf = recvbuf, .count = count, .dtype = dtype, .redop = op,   \
                     .has_redop = 1, .root = root, .has_root = 1}

int tutti_reduce(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                 tutti_dtype_t dtype, tutti_redop_t op, int root)
{
    REDUCE_DESC("reduce");
    return coll_issue(comm, &d, NULL, 0);
}

int tutti_reduce_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                       tutti_dtype_t dtype, tutti_redop_t op, int root, tutti_work_t **work_p)
{
    REDUCE_DESC("reduce_async");
    return coll_issue(comm, &d, work_p, 1);
}

#define ALLGATHER_DESC(nm, v)                                                           \
    coll_desc_t d = {.name = nm, .coll = TT_COLL_ALLGATHER, .sendbuf = sendbuf,         \
                     .recvbuf = recvbuf, .dtype = dtype, .is_v = v}

int tutti_allgather(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                    tutti_dtype_t dtype)
{
    ALLGATHER_DESC("allgather", 0);
    d.equal = sendcount;
    return coll_issue(comm, &d, NULL, 0);
}

int tutti_allgather_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                          size_t sendcount, tutti_dtype_t dtype, tutti_work_t **work_p)
{
    ALLGATHER_DESC("allgather_async", 0);
    d.equal = sendcount;
    return coll_issue(comm, &d, work_p, 1);
}

int tutti_allgatherv(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                     const size_t *recvcounts, const size_t *displs, tutti_dtype_t dtype)
{
    ALLGATHER_DESC("allgatherv", 1);
    d.recvcounts = recvcounts;
    d.rdispls = displs;
    return coll_issue(comm, &d, NULL, 0);
}

int tutti_allgatherv_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                           const size_t *recvcounts, const size_t *displs, tutti_dtype_t dtype,
                           tutti_work_t **work_p)
{
    ALLGATHER_DESC("allgatherv_async", 1);
    d.recvcounts = recvcounts;
    d.rdispls = displs;
    return coll_issue(comm, &d, work_p, 1);
}

#define RS_DESC(nm, v)                                                                  \
    coll_desc_t d = {.name = nm, .coll = TT_COLL_REDUCE_SCATTER, .sendbuf = sendbuf,    \
                     .recvbuf = recvbuf, .dtype = dtype, .redop = op, .has_redop = 1,   \
                     .is_v = v}

int tutti_reduce_scatter(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                         size_t recvcount, tutti_dtype_t dtype, tutti_redop_t op)
{
    RS_DESC("reduce_scatter", 0);
    d.equal = recvcount;
    return coll_issue(comm, &d, NULL, 0);
}

int tutti_reduce_scatter_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                               size_t recvcount, tutti_dtype_t dtype, tutti_redop_t op,
                               tutti_work_t **work_p)
{
    RS_DESC("reduce_scatter_async", 0);
    d.equal = recvcount;
    return coll_issue(comm, &d, work_p, 1);
}

int tutti_reduce_scatterv(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                          const size_t *recvcounts, tutti_dtype_t dtype, tutti_redop_t op)
{
    RS_DESC("reduce_scatterv", 1);
    d.recvcounts = recvcounts;
    return coll_issue(comm, &d, NULL, 0);
}

int tutti_reduce_scatterv_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                                const size_t *recvcounts, tutti_dtype_t dtype,
                                tutti_redop_t op, tutti_work_t **work_p)
{
    RS_DESC("reduce_scatterv_async", 1);
    d.recvcounts = recvcounts;
    return coll_issue(comm, &d, work_p, 1);
}

#define GATHER_DESC(nm, v, cnt)                                                         \
    coll_desc_t d = {.name = nm, .coll = TT_COLL_GATHER, .sendbuf = sendbuf,            \
                     .recvbuf = recvbuf, .count = cnt, .dtype = dtype, .root = root,    \
                     .has_root = 1, .is_v = v}

int tutti_gather(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                 tutti_dtype_t dtype, int root)
{
    GATHER_DESC("gather", 0, sendcount);
    return coll_issue(comm, &d, NULL, 0);
}

int tutti_gather_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                       size_t sendcount, tutti_dtype_t dtype, int root, tutti_work_t **work_p)
{
    GATHER_DESC("gather_async", 0, sendcount);
    return coll_issue(comm, &d, work_p, 1);
}

int tutti_gatherv(tutti_comm_t *comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                  const size_t *recvcounts, const size_t *displs, tutti_dtype_t dtype, int root)
{
    GATHER_DESC("gatherv", 1, sendcount);
    d.recvcounts = recvcounts;
    d.rdispls = displs;
    return coll_issue(comm, &d, NULL, 0);
}

int tutti_gatherv_async(tutti_comm_t *comm, const void *sendbuf, size_t sendcount,
                        void *recvbuf, const size_t *recvcounts, const size_t *displs,
                        tutti_dtype_t dtype, int root, tutti_work_t **work_p)
{
    GATHER_DESC("gatherv_async", 1, sendcount);
    d.recvcounts = recvcounts;
    d.rdispls = displs;
    return coll_issue(comm, &d, work_p, 1);
}

#define SCATTER_DESC(nm, v, cnt)                                                        \
    coll_desc_t d = {.name = nm, .coll = TT_COLL_SCATTER, .sendbuf = sendbuf,           \
                     .recvbuf = recvbuf, .count = cnt, .dtype = dtype, .root = root,    \
                     .has_root = 1, .is_v = v}

int tutti_scatter(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                  tutti_dtype_t dtype, int root)
{
    SCATTER_DESC("scatter", 0, recvcount);
    return coll_issue(comm, &d, NULL, 0);
}

int tutti_scatter_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                        size_t recvcount, tutti_dtype_t dtype, int root, tutti_work_t **work_p)
{
    SCATTER_DESC("scatter_async", 0, recvcount);
    return coll_issue(comm, &d, work_p, 1);
}

int tutti_scatterv(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                   const size_t *displs, void *recvbuf, size_t recvcount, tutti_dtype_t dtype,
                   int root)
{
    SCATTER_DESC("scatterv", 1, recvcount);
    d.sendcounts = sendcounts;
    d.rdispls = displs; /* the root's displacements, read as sdispls */
    return coll_issue(comm, &d, NULL, 0);
}

int tutti_scatterv_async(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                         const size_t *displs, void *recvbuf, size_t recvcount,
                         tutti_dtype_t dtype, int root, tutti_work_t **work_p)
{
    SCATTER_DESC("scatterv_async", 1, recvcount);
    d.sendcounts = sendcounts;
    d.rdispls = displs;
    return coll_issue(comm, &d, work_p, 1);
}

#define A2A_DESC(nm, v)                                                                 \
    coll_desc_t d = {.name = nm, .coll = TT_COLL_ALLTOALL, .sendbuf = sendbuf,          \
                     .recvbuf = recvbuf, .dtype = dtype, .is_v = v}

int tutti_alltoall(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                   tutti_dtype_t dtype)
{
    A2A_DESC("alltoall", 0);
    d.count = count;
    return coll_issue(comm, &d, NULL, 0);
}

int tutti_alltoall_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                         tutti_dtype_t dtype, tutti_work_t **work_p)
{
    A2A_DESC("alltoall_async", 0);
    d.count = count;
    return coll_issue(comm, &d, work_p, 1);
}

int tutti_alltoallv(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                    const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                    const size_t *rdispls, tutti_dtype_t dtype)
{
    A2A_DESC("alltoallv", 1);
    d.sendcounts = sendcounts;
    d.sdispls = sdispls;
    d.recvcounts = recvcounts;
    d.rdispls = rdispls;
    return coll_issue(comm, &d, NULL, 0);
}

int tutti_alltoallv_async(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                          const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                          const size_t *rdispls, tutti_dtype_t dtype, tutti_work_t **work_p)
{
    A2A_DESC("alltoallv_async", 1);
    d.sendcounts = sendcounts;
    d.sdispls = sdispls;
    d.recvcounts = recvcounts;
    d.rdispls = rdispls;
    return coll_issue(comm, &d, work_p, 1);
}
