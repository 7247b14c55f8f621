/* Device buffers staged through host memory (device.h): which bytes of a call's
 * buffers it reads and writes, one host block for those in device memory, the copy in
 * at the call and the copy back at its end. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "coll/names.h"
#include "core/comm.h"
#include "core/envelope.h" /* TT_FP_V */
#include "core/stage.h"
#include "device/device.h"

/* One op's staging: the host block (from the communicator's pool) and the region copied
 * back at the end. */
typedef struct tt_dev_stage {
    tt_comm_t *comm;
    const tt_dev_ops_t *ops;
    void *host;
    size_t cap;
    void *back_dev, *back_host, *back_ctx; /* back_dev NULL: nothing to copy back */
    size_t back_len;
    const char *back_what; /* "recvbuf" or "buf" */
} tt_dev_stage_t;

static const tt_dev_ops_t *_Atomic dev_override;

void tt_dev_override(const tt_dev_ops_t *ops)
{
    atomic_store(&dev_override, ops);
}

int tt_dev_resolve(const char *mode, const tt_dev_ops_t **ops_p, char *err, size_t errlen)
{
    *ops_p = atomic_load(&dev_override);
    if (*ops_p)
        return TUTTI_OK;
    if (mode && !strcmp(mode, "off"))
        return TUTTI_OK;
    if (mode && *mode && strcmp(mode, "auto") && strcmp(mode, "on")) {
        snprintf(err, errlen, "TUTTI_CUDA=%s: expected auto, on or off", mode);
        return TUTTI_ERR_CONFIG;
    }
    const int on = mode && !strcmp(mode, "on");
    char why[256] = "";
    *ops_p = tt_dev_cuda(on, why, sizeof(why));
    if (!*ops_p && on) {
        snprintf(err, errlen, "TUTTI_CUDA=on: no CUDA driver to use (libcuda.so.1): %s", why);
        return TUTTI_ERR_NO_DEVICE;
    }
    return TUTTI_OK;
}

/* The end of the furthest block of a layout, in elements. */
static size_t span(const size_t *counts, const size_t *displs, int n)
{
    size_t end = 0;
    for (int i = 0; i < n; i++)
        if (counts[i])
            end = TT_MAX(end, displs[i] + counts[i]);
    return end;
}

/* The bytes an op reads (sendbuf, *sl) and writes (recvbuf, *rl), and whether it writes
 * every byte of the latter (then it need not be copied in). The fill (coll.c) made
 * sendbuf an address (never TUTTI_IN_PLACE) and the layouts whole where they matter. */
static void extents(const tt_op_t *op, size_t *sl, size_t *rl, int *whole)
{
    const size_t es = op->elem_size;
    const int n = op->nranks, me = op->rank, v = (op->fingerprint & TT_FP_V) != 0;
    *sl = *rl = 0;
    *whole = 1;
    switch (op->coll) {
    case TT_COLL_EXSCAN: /* rank 0's recvbuf is not written */
        *whole = 0;
        /* fall through */
    case TT_COLL_ALLREDUCE:
    case TT_COLL_SCAN:
    case TT_COLL_BROADCAST:
    case TT_COLL_REDUCE: *sl = *rl = op->count * es; break;
    case TT_COLL_ALLGATHER:
        *sl = op->recvcounts[me] * es;
        *rl = span(op->recvcounts, op->rdispls, n) * es;
        *whole = !v;
        break;
    case TT_COLL_REDUCE_SCATTER:
        *sl = op->count * es;
        *rl = op->recvcounts[me] * es;
        break;
    case TT_COLL_GATHER:
        *sl = op->count * es;
        *rl = me == op->root ? span(op->recvcounts, op->rdispls, n) * es : 0;
        *whole = !v;
        break;
    case TT_COLL_SCATTER:
        *sl = me == op->root ? span(op->sendcounts, op->sdispls, n) * es : 0;
        *rl = op->count * es;
        break;
    case TT_COLL_ALLTOALL:
        *sl = span(op->sendcounts, op->sdispls, n) * es;
        *rl = span(op->recvcounts, op->rdispls, n) * es;
        *whole = !v;
        break;
    default: break;
    }
}

/* A region of a call's buffers: [lo, lo + len), device memory or not. */
typedef struct region {
    char *lo;
    size_t len;
    int dev;
    void *ctx;
    char *host; /* its copy in the host block */
} region_t;

static int query(tt_comm_t *comm, region_t *r, const char *name, const char *what)
{
    char err[256] = "";
    r->dev = 0;
    if (!r->lo || !r->len)
        return TUTTI_OK;
    int k = comm->dev->query(r->lo, &r->ctx, err, sizeof(err));
    if (k < 0)
        return tt_comm_set_error(comm, TUTTI_ERR_DEVICE, "rank %d: %s: asking %s what %s %p is: %s",
                                 comm->rank, name, comm->dev->name, what, (void *)r->lo, err);
    r->dev = k > 0;
    return TUTTI_OK;
}

/* p, if inside r, moved to r's host copy */
static void *moved(const region_t *r, const void *p)
{
    const char *c = p;
    return r->dev && c && c >= r->lo && c < r->lo + r->len ? r->host + (c - r->lo) : (void *)p;
}

/* Stage the send region [*s, +sl) and the receive region [*r, +rl) where they are device
 * memory; whole: the op writes all of the receive region. */
static int stage(tt_comm_t *comm, tt_op_t *op, const void **s, size_t sl, void **r, size_t rl,
                 int whole, const char *name, const char *rwhat)
{
    region_t rs = { .lo = (char *)(s ? *s : NULL), .len = sl };
    region_t rr = { .lo = r ? *r : NULL, .len = rl };
    TT_CHECK(query(comm, &rs, name, "sendbuf"));
    TT_CHECK(query(comm, &rr, name, rwhat));
    if (!rs.dev && !rr.dev)
        return TUTTI_OK;
    /* in place (or a block of one inside the other): one region, copied in whole */
    if (rs.dev && rr.dev && rs.lo < rr.lo + rr.len && rr.lo < rs.lo + rs.len) {
        char *lo = TT_MIN(rs.lo, rr.lo), *hi = TT_MAX(rs.lo + rs.len, rr.lo + rr.len);
        rr.lo = lo;
        rr.len = (size_t)(hi - lo);
        rs.dev = 0;
        whole = 0;
    }
    size_t salign = rs.dev ? (rs.len + 63) & ~(size_t)63 : 0;
    size_t bytes = salign + (rr.dev ? rr.len : 0);
    tt_dev_stage_t *d = calloc(1, sizeof(*d));
    size_t cap = 0;
    void *host = d ? tt_comm_stage_get(comm, bytes, &cap) : NULL;
    if (!host) {
        free(d);
        return tt_comm_set_error(comm, TUTTI_ERR_NOMEM,
                                 "rank %d: %s: out of memory for a host copy of %zu bytes of "
                                 "device memory",
                                 comm->rank, name, bytes);
    }
    d->comm = comm;
    d->ops = comm->dev;
    d->host = host;
    d->cap = cap;
    rs.host = host;
    rr.host = (char *)host + salign;
    char err[256] = "";
    const char *failed = NULL;
    size_t flen = 0;
    if (rs.dev && comm->dev->copy(rs.ctx, rs.host, rs.lo, rs.len, 1, err, sizeof(err)) < 0)
        failed = "sendbuf", flen = rs.len;
    else if (rr.dev && !whole &&
             comm->dev->copy(rr.ctx, rr.host, rr.lo, rr.len, 1, err, sizeof(err)) < 0)
        failed = rwhat, flen = rr.len;
    if (failed) {
        tt_comm_stage_put(comm, host, cap);
        free(d);
        return tt_comm_set_error(comm, TUTTI_ERR_DEVICE,
                                 "rank %d: %s: copying %s (%zu bytes) from %s device memory: %s",
                                 comm->rank, name, failed, flen, comm->dev->name, err);
    }
    if (rr.dev) {
        d->back_dev = rr.lo;
        d->back_host = rr.host;
        d->back_ctx = rr.ctx;
        d->back_len = rr.len;
        d->back_what = rwhat;
    }
    /* the op's pointers into either region now point into its copy */
    if (s)
        *s = moved(rr.dev ? &rr : &rs, moved(&rs, *s));
    if (r)
        *r = moved(&rr, *r);
    op->dev = d;
    return TUTTI_OK;
}

int tt_dev_stage_op(tt_comm_t *comm, tt_op_t *op, const char *name)
{
    size_t sl, rl;
    int whole;
    extents(op, &sl, &rl, &whole);
    return stage(comm, op, &op->sendbuf, sl, &op->recvbuf, rl, whole, name, "recvbuf");
}

int tt_dev_stage_p2p(tt_comm_t *comm, tt_op_t *op, void **buf, size_t len, int is_send,
                     const char *name)
{
    if (is_send) {
        const void *s = *buf;
        TT_CHECK(stage(comm, op, &s, len, NULL, 0, 1, name, "buf"));
        *buf = (void *)s;
        return TUTTI_OK;
    }
    return stage(comm, op, NULL, 0, buf, len, 1, name, "buf");
}

int tt_dev_finish(tt_op_t *op, int st, char *err, size_t errlen)
{
    tt_dev_stage_t *d = op->dev;
    if (!d)
        return st;
    op->dev = NULL;
    if (st >= 0 && d->back_dev) {
        char why[256] = "";
        if (d->ops->copy(d->back_ctx, d->back_dev, d->back_host, d->back_len, 0, why, sizeof(why)) <
            0) {
            snprintf(err, errlen,
                     "rank %d: %s seq %llu: copying the result (%s, %zu bytes) back to %s "
                     "device memory: %s",
                     op->rank, op->coll == TT_COLL_P2P ? "recv" : tt_coll_name(op->coll),
                     (unsigned long long)op->seq, d->back_what, d->back_len, d->ops->name, why);
            st = TUTTI_ERR_DEVICE;
        }
    }
    tt_comm_stage_put(d->comm, d->host, d->cap);
    free(d);
    return st;
}
