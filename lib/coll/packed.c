/* Derived datatypes in calls: the packed copy an op runs on (packed.h). */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "coll/extent.h"
#include "coll/packed.h"
#include "core/fault.h" /* tt_comm_set_error */
#include "core/state.h"
#include "device/device.h"

/* A run of the caller's receive buffer the op writes: count elements at user, their
 * packed bytes at packed. */
typedef struct back {
    char *user, *packed;
    size_t count;
} back_t;

typedef struct tt_packed {
    tt_derived_t *type; /* held */
    char *block;
    int p2p_recv;        /* a receive: its one run is unpacked as far as bytes came */
    tutti_dtype_t dtype; /* the caller's (a receive's count and dtype said in it) */
    int nback;
    back_t back[];
} tt_packed_t;

static tt_packed_t *new_packed(tt_derived_t *t, int nback, size_t bytes)
{
    tt_packed_t *p = calloc(1, sizeof(*p) + (size_t)nback * sizeof(back_t));
    if (!p)
        return NULL;
    if (bytes && !(p->block = malloc(bytes))) {
        free(p);
        return NULL;
    }
    atomic_fetch_add(&t->refs, 1);
    p->type = t;
    return p;
}

/* the packed form's dtype and its elements per element of t */
static tutti_dtype_t packed_dtype(const tt_derived_t *t, size_t *k_p, size_t *bs_p)
{
    const int mixed = t->base == TUTTI_DTYPE_COUNT;
    *k_p = mixed ? t->size : t->nbase;
    *bs_p = mixed ? 1 : tutti_dtype_size(t->base);
    return mixed ? TUTTI_UINT8 : t->base;
}

tutti_dtype_t tt_packed_dtype(const tt_derived_t *t, size_t *k_p)
{
    size_t bs;
    return packed_dtype(t, k_p, &bs);
}

static int device_refused(tt_comm_t *comm, const char *name, const void *p, size_t len)
{
    const char *what;
    if (!comm->dev || !p || !len || tt_dev_is_device(comm, p, &what) == 0)
        return TUTTI_OK;
    return tt_comm_set_error(comm, TUTTI_ERR_UNSUPPORTED,
                             "%s: a derived type's buffer is %s device memory (or its layer "
                             "cannot tell): derived types take host memory only",
                             name, what);
}

typedef struct run_acc {
    tt_packed_t *p;
    const char *recvbuf, *pr;
    size_t ext, size;
} run_acc_t;

static void add_back(void *ctx, char *ptr, size_t len)
{
    run_acc_t *a = ctx;
    const size_t j = (size_t)(ptr - a->recvbuf) / a->ext;
    a->p->back[a->p->nback++] = (back_t){ ptr, (char *)a->pr + j * a->size, len / a->ext };
}

static void scale(size_t *v, size_t n, size_t k)
{
    for (size_t i = 0; i < n; i++)
        v[i] *= k;
}

/* What op reads of sendbuf packed at ps: the blocks of a layout read by block (an
 * alltoallv's, a scatterv root's, a neighbourhood alltoallv's: their gaps are never
 * read, as without a derived type), else its first se elements. */
static void pack_send(const tt_op_t *op, const tt_derived_t *t, char *ps, size_t se)
{
    const int by_block = op->coll == TT_COLL_ALLTOALL || op->coll == TT_COLL_SCATTER ||
                         op->coll == TT_COLL_NEIGHBOR_ALLTOALL;
    if (!by_block || !op->sendcounts) {
        tt_derived_pack(t, op->sendbuf, se, ps);
        return;
    }
    const size_t n = (size_t)(op->sdispls - op->sendcounts);
    for (size_t i = 0; i < n; i++)
        if (op->sendcounts[i] && op->sdispls[i] < se)
            tt_derived_pack(t, (const char *)op->sendbuf + op->sdispls[i] * t->extent,
                            TT_MIN(op->sendcounts[i], se - op->sdispls[i]),
                            ps + op->sdispls[i] * t->size);
}

int tt_packed_stage_op(tt_comm_t *comm, tt_op_t *op, tt_derived_t *t, const char *name)
{
    size_t k, bs;
    const tutti_dtype_t pd = packed_dtype(t, &k, &bs);
    const size_t ext = t->extent, size = t->size;
    size_t sl = 0, rl = 0;
    if (ext)
        tt_op_extents(op, &sl, &rl);
    /* in elements; nothing received where there is no receive buffer (a reduce's other
     * ranks), and a broadcast root's one buffer is one copy (it writes nothing) */
    const int one = op->coll == TT_COLL_BROADCAST && sl && op->sendbuf == op->recvbuf;
    const size_t se = ext ? sl / ext : 0, re = ext && op->recvbuf && !one ? rl / ext : 0;
    size_t sbytes, rbytes, total, scaled; /* (scaled: the count in the packed dtype) */
    if (__builtin_mul_overflow(se, size, &sbytes) || __builtin_mul_overflow(re, size, &rbytes) ||
        __builtin_mul_overflow(op->count, k, &scaled) || sbytes > SIZE_MAX - 63 ||
        __builtin_add_overflow((sbytes + 63) & ~(size_t)63, rbytes, &total))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "%s: the count's packed bytes of %s overflow", name, t->name);
    TT_CHECK(device_refused(comm, name, op->sendbuf, sl));
    TT_CHECK(device_refused(comm, name, op->recvbuf, rl));
    if (size && (sbytes || rbytes)) {
        tt_packed_t *p = new_packed(t, rbytes ? tt_op_runs_max(op) : 0, total);
        if (!p)
            return tt_comm_set_error(comm, TUTTI_ERR_NOMEM,
                                     "%s: out of memory for a packed copy of %zu bytes of %s", name,
                                     total, t->name);
        p->dtype = op->dtype;
        char *ps = p->block, *pr = p->block + ((sbytes + 63) & ~(size_t)63);
        pack_send(op, t, ps, se);
        if (one)
            pr = ps;
        if (rbytes) {
            run_acc_t a = { p, op->recvbuf, pr, ext, size };
            tt_op_written(op, add_back, &a);
        }
        /* a rank that reads nothing reads its receive buffer where the fill said so (a
         * broadcast's other ranks) */
        op->sendbuf = !sl && op->sendbuf == op->recvbuf ? pr : ps;
        if (op->recvbuf)
            op->recvbuf = pr;
        op->packed = p;
    }
    /* the layout, in the packed dtype's elements */
    if (op->sendcounts) {
        const size_t n = (size_t)(op->sdispls - op->sendcounts); /* (nranks, or per edge) */
        scale((size_t *)op->sendcounts, 4 * n, k); /* (one block: the op's own copy) */
    }
    op->count = scaled;
    op->env_count *= k;
    op->dtype = pd;
    op->elem_size = bs;
    return TUTTI_OK;
}

int tt_packed_stage_p2p(tt_comm_t *comm, tt_op_t *op, void **buf, size_t *count,
                        tutti_dtype_t *dtype, tt_derived_t *held, int is_send, const char *name)
{
    tt_derived_t *t = held ? tt_derived_ref(held) : tt_derived_hold(*dtype);
    if (!t)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: invalid dtype %d%s", name,
                                 (int)*dtype, tt_dtype_invalid_hint(*dtype));
    size_t k, bs, bytes;
    const tutti_dtype_t pd = packed_dtype(t, &k, &bs);
    int st = TUTTI_OK;
    if (__builtin_mul_overflow(*count, t->size, &bytes))
        st = tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                               "%s: the count's packed bytes of %s overflow", name, t->name);
    if (st == TUTTI_OK)
        st = device_refused(comm, name, *buf, *count * t->extent);
    if (st == TUTTI_OK && bytes) {
        tt_packed_t *p = new_packed(t, 1, bytes);
        if (!p) {
            st = tt_comm_set_error(comm, TUTTI_ERR_NOMEM,
                                   "%s: out of memory for a packed copy of %zu bytes of %s", name,
                                   bytes, t->name);
        } else {
            p->dtype = *dtype;
            if (is_send) {
                tt_derived_pack(t, *buf, *count, p->block);
            } else {
                p->p2p_recv = 1;
                p->back[0] = (back_t){ *buf, p->block, *count };
                p->nback = 1;
            }
            *buf = p->block;
            op->packed = p;
        }
    }
    if (st == TUTTI_OK) {
        *count *= k;
        *dtype = pd;
    }
    tt_derived_release(t);
    return st;
}

int tt_packed_finish(tt_op_t *op, int st)
{
    tt_packed_t *p = op->packed;
    if (!p)
        return st;
    op->packed = NULL;
    const tt_derived_t *t = p->type;
    if (st >= 0 && p->p2p_recv) {
        size_t k, bs;
        packed_dtype(t, &k, &bs);
        const size_t got = op->count * op->elem_size; /* what came (recv_upto: up to) */
        tt_derived_unpack(t, p->back[0].packed, got, p->back[0].user, p->back[0].count);
        op->count = k ? op->count / k : 0;
        op->dtype = p->dtype;
        op->elem_size = t->extent;
    } else if (st >= 0) {
        for (int i = 0; i < p->nback; i++)
            tt_derived_unpack(t, p->back[i].packed, p->back[i].count * t->size, p->back[i].user,
                              p->back[i].count);
    }
    free(p->block);
    tt_derived_release(p->type);
    free(p);
    return st;
}
