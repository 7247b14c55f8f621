/* Device buffers staged through host memory (device.h): which bytes of a call's
 * buffers it reads and writes, one host block for those in device memory, the copy in
 * at the call and the copy back at its end. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "coll/names.h"
#include "core/fault.h" /* tt_comm_set_error */
#include "core/state.h"
#include "core/envelope.h" /* TT_FP_V */
#include "core/stage.h"
#include "device/device.h"
#include "coll/extent.h"
#include "coll/topo.h"

/* A run of bytes of the user's device memory and its copy in the host block. */
typedef struct seg {
    char *dev, *host;
    size_t len;
} seg_t;

/* One op's staging: the host block (from the communicator's pool), the bytes copied in
 * when the op starts (the send extent's device part) and the runs copied back at its
 * end (exactly the bytes the op writes, so that nothing else of the buffer is reverted:
 * an allgatherv's gaps, the other blocks of an in-place reduce_scatter). */
typedef struct tt_dev_stage {
    tt_comm_t *comm; /* its layer is comm->dev */
    tt_stage_block_t blk;
    seg_t in; /* in.len 0: nothing to copy in */
    void *in_ctx, *back_ctx;
    const char *back_what;
    int fail_st; /* < 0: staging failed at the call (fail says why); the op fails when it
                    starts, on every rank (exec.c), not at the call on this rank alone */
    char fail[200];
    /* stream-ordered (tt_dev_enqueue): the stream and its context, the events after the
     * copy in and after the copy back, the word the stream waits on (at blk.p +
     * word_off), the next record the stream still holds (comm->dev_pending) */
    void *stream, *sctx, *ev_in, *ev_out;
    size_t word_off;
    int all_dev; /* every buffer the op touches is device memory (else not streamed) */
    int enq;     /* something was enqueued: the stream uses the block */
    int held;    /* the wait on the word was enqueued: the stream waits for the op's end */
    int drained; /* the call waited for the stream (tt_dev_drain) and runs as without one */
    struct tt_dev_stage *next;
    int nback;
    seg_t back[]; /* sorted, merged */
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

/* written()'s runs into an array of segments (at most tt_op_runs_max of them) */
typedef struct seg_acc {
    seg_t *segs;
    int n;
} seg_acc_t;

static void add_seg(void *ctx, char *p, size_t len)
{
    seg_acc_t *a = ctx;
    a->segs[a->n++] = (seg_t){ p, NULL, len };
}

static int written(const tt_op_t *op, seg_t *segs)
{
    seg_acc_t a = { segs, 0 };
    tt_op_written(op, add_seg, &a);
    return a.n;
}

static int seg_cmp(const void *a, const void *b)
{
    const seg_t *x = a, *y = b;
    return x->dev < y->dev ? -1 : x->dev > y->dev;
}

/* sorted, and runs that touch or overlap made one */
static int merge(seg_t *segs, int n)
{
    if (n < 2)
        return n;
    qsort(segs, (size_t)n, sizeof(*segs), seg_cmp);
    int k = 0;
    for (int i = 1; i < n; i++) {
        char *end = segs[k].dev + segs[k].len;
        if (segs[i].dev <= end) {
            char *e2 = segs[i].dev + segs[i].len;
            if (e2 > end)
                segs[k].len = (size_t)(e2 - segs[k].dev);
        } else {
            segs[++k] = segs[i];
        }
    }
    return k + 1;
}

/* A region of a call's buffers: [lo, lo + len), device memory or not. */
typedef struct region {
    char *lo;
    size_t len;
    int dev;
    void *ctx;
    char *host; /* its copy in the host block */
} region_t;

/* r's kind: device memory, staged; managed memory (query's 2) is staged as device
 * memory only in a call stream-ordered on comm's stream (streamed), which must read it
 * where the stream's earlier work has written it: otherwise the host touches it in
 * place */
static int query(tt_comm_t *comm, region_t *r, const char *what, int streamed, char *why,
                 size_t whylen)
{
    char err[160] = "";
    r->dev = 0;
    if (!r->lo || !r->len)
        return TUTTI_OK;
    int k = comm->dev->query(r->lo, &r->ctx, err, sizeof(err));
    if (k < 0) {
        snprintf(why, whylen, "asking %s what %s %p is: %s", comm->dev->name, what, (void *)r->lo,
                 err);
        return TUTTI_ERR_DEVICE;
    }
    r->dev = k == 1 || (k == 2 && streamed);
    return TUTTI_OK;
}

/* p, if inside r, moved to r's host copy */
static void *moved(const region_t *r, const void *p)
{
    const char *c = p;
    return r->dev && c && c >= r->lo && c < r->lo + r->len ? r->host + (c - r->lo) : (void *)p;
}

/* op->dev = a staging with room for nseg runs copied back, and its failure (st < 0) if
 * any; NULL without memory for even that */
static tt_dev_stage_t *new_stage(tt_comm_t *comm, tt_op_t *op, int nseg, int st, const char *why)
{
    tt_dev_stage_t *d = calloc(1, sizeof(*d) + (size_t)nseg * sizeof(seg_t));
    if (!d)
        return NULL;
    d->comm = comm;
    d->fail_st = st;
    snprintf(d->fail, sizeof(d->fail), "%s", why);
    op->dev = d;
    return d;
}

/* The communicator's staging blocks between calls (comm->dev_pool, under stage_lock):
 * at most DEV_POOL_MAX of them, of at most as many bytes as its ops (and streams) have
 * held at once so far (peak), the least recently returned let go first, so that a
 * steady workload (a training step's calls, the same sizes each step, many in flight
 * behind a stream) pins nothing per call, one that changes keeps the blocks it uses
 * now, and what is kept is never more than the program has needed at once. The
 * fuser's rule, the two largest, had every call in flight but two pin a block of its
 * own: 159 cuMemHostRegister calls for 200 stream-ordered calls (found by review). */
enum { DEV_POOL_MAX = 128 };
typedef struct tt_dev_pool {
    tt_stage_block_t b[DEV_POOL_MAX]; /* the least recently returned first */
    int n;
    size_t bytes;      /* in b */
    size_t held, peak; /* out of the pool now, the most at once */
} tt_dev_pool_t;

/* the pool (made at the first use; NULL without memory: nothing kept), locked */
static tt_dev_pool_t *pool_lock(tt_comm_t *comm)
{
    pthread_mutex_lock(&comm->stage_lock);
    if (!comm->dev_pool)
        comm->dev_pool = calloc(1, sizeof(tt_dev_pool_t));
    return comm->dev_pool;
}

static void held_add(tt_dev_pool_t *pl, size_t len)
{
    if (pl) {
        pl->held += len;
        pl->peak = TT_MAX(pl->peak, pl->held);
    }
}

/* A new host block of at least bytes for copies of ctx's memory (page-aligned, pinned
 * where the layer can: a copy from pageable memory goes through the driver's own bounce
 * buffer, at a fraction of the speed). */
static tt_stage_block_t block_new(tt_comm_t *comm, size_t bytes, void *ctx)
{
    tt_stage_block_t b = { 0 };
    b.len = (TT_MAX(bytes, (size_t)1) + 4095) & ~(size_t)4095;
    if (!(b.p = aligned_alloc(4096, b.len)))
        return (tt_stage_block_t){ 0 };
    char err[200] = "";
    if (comm->dev->pin && comm->dev->pin(ctx, b.p, b.len, err, sizeof(err)) == 0) {
        b.pin = ctx;
    } else if (comm->dev->pin) {
        static atomic_int said;
        if (!atomic_exchange(&said, 1))
            TT_WARN(
                "%s: host copies of device memory stay pageable (slower): pinning %zu bytes: %s",
                comm->dev->name, b.len, err);
    }
    held_add(pool_lock(comm), b.len);
    pthread_mutex_unlock(&comm->stage_lock);
    return b;
}

/* A block of at least bytes: the smallest of the pool's that wastes at most
 * max(bytes, 1 MiB) (a small call does not take a large call's block, which that call
 * would then pin again), or a new one. A block whose pinning failed is pinned again
 * when taken: one failure (a transient out of memory) otherwise left it pageable in the
 * pool for good, its calls staged slower and, with a stream set, not stream-ordered. */
static tt_stage_block_t block_get(tt_comm_t *comm, size_t bytes, void *ctx)
{
    tt_stage_block_t b = { 0 };
    tt_dev_pool_t *pl = pool_lock(comm);
    int best = -1;
    for (int i = 0; pl && i < pl->n; i++) {
        const size_t len = pl->b[i].len;
        if (len >= bytes && len - bytes <= TT_MAX(bytes, (size_t)1 << 20) &&
            (best < 0 || len < pl->b[best].len))
            best = i;
    }
    if (best >= 0) {
        b = pl->b[best];
        memmove(&pl->b[best], &pl->b[best + 1], (size_t)(--pl->n - best) * sizeof(b));
        pl->bytes -= b.len;
        held_add(pl, b.len);
    }
    pthread_mutex_unlock(&comm->stage_lock);
    if (!b.p)
        return block_new(comm, bytes, ctx);
    char err[200];
    /* pinning that failed (a transient limit) is tried again once at its reuse, not at
     * every call that takes the block */
    if (!b.pin && !b.pin_retried && comm->dev->pin) {
        if (comm->dev->pin(ctx, b.p, b.len, err, sizeof(err)) == 0)
            b.pin = ctx;
        else
            b.pin_retried = 1;
    }
    return b;
}

static void block_free(const tt_dev_ops_t *ops, tt_stage_block_t b)
{
    if (b.p && b.pin && ops->unpin)
        ops->unpin(b.pin, b.p);
    free(b.p);
}

/* b back to the communicator's pool; the least recently returned let go (unpinned and
 * freed, outside the lock) while it holds more than peak bytes or DEV_POOL_MAX blocks */
static void block_put(tt_comm_t *comm, tt_stage_block_t b)
{
    if (!b.p)
        return;
    tt_stage_block_t drop[DEV_POOL_MAX + 1];
    int ndrop = 0;
    tt_dev_pool_t *pl = pool_lock(comm);
    if (!pl) {
        drop[ndrop++] = b;
    } else {
        pl->held -= TT_MIN(pl->held, b.len);
        pl->b[pl->n++] = b; /* room: n < DEV_POOL_MAX between calls */
        pl->bytes += b.len;
        int old = 0;
        while (old < pl->n && (pl->bytes > pl->peak || pl->n - old == DEV_POOL_MAX)) {
            drop[ndrop++] = pl->b[old];
            pl->bytes -= pl->b[old++].len;
        }
        pl->n -= old;
        memmove(pl->b, pl->b + old, (size_t)pl->n * sizeof(b));
    }
    pthread_mutex_unlock(&comm->stage_lock);
    for (int i = 0; i < ndrop; i++)
        block_free(comm->dev, drop[i]);
}

/* d kept until its stream has passed it (reap_streamed) */
static void pend(tt_comm_t *comm, struct tt_dev_stage *d)
{
    pthread_mutex_lock(&comm->stage_lock);
    d->next = comm->dev_pending;
    /* stored atomically: reap_some looks without the lock */
    __atomic_store_n(&comm->dev_pending, d, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&comm->stage_lock);
}

static void reap_streamed(tt_comm_t *comm, int wait_ms);

void tt_dev_free_blocks(tt_comm_t *comm)
{
    if (__atomic_load_n(&comm->dev_pending, __ATOMIC_ACQUIRE))
        reap_streamed(comm, tt_comm_timeout_ms(comm) > 0 ? tt_comm_timeout_ms(comm) : 30000);
    tt_dev_pool_t *pl = comm->dev_pool;
    comm->dev_pool = NULL;
    for (int i = 0; pl && i < pl->n; i++)
        block_free(comm->dev, pl->b[i]);
    free(pl);
}

/* Stage the send extent [*s, +sl) and the receive extent [*r, +rl) where they are device
 * memory; the runs copied back: the whole receive extent (whole) or written()'s. Nothing
 * is copied here: tt_dev_copy_in does that when the op starts. A failure here (the layer
 * cannot say what a pointer is, no memory for the host copy) is kept for then too, so
 * that the op fails on every rank; only one without memory to keep it fails now. */
static int stage(tt_comm_t *comm, tt_op_t *op, const void **s, size_t sl, void **r, size_t rl,
                 int whole, int streamed, const char *name, const char *rwhat)
{
    region_t rs = { .lo = (char *)(s ? *s : NULL), .len = sl };
    region_t rr = { .lo = r ? *r : NULL, .len = rl };
    char why[200] = "";
    int st = query(comm, &rs, "sendbuf", streamed, why, sizeof(why));
    if (st == TUTTI_OK)
        st = query(comm, &rr, rwhat, streamed, why, sizeof(why));
    if (st == TUTTI_OK && !rs.dev && !rr.dev)
        return TUTTI_OK; /* host memory: the common case stops here */
    tt_dev_stage_t *d = new_stage(comm, op, rr.dev ? (whole ? 1 : tt_op_runs_max(op)) : 0, st, why);
    if (!d)
        return tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "%s: out of memory", name);
    if (st < 0)
        return TUTTI_OK;
    /* stream-ordered only where nothing of it is host memory: a host part would be read
     * or written after the call returned */
    d->all_dev = (!rs.lo || !rs.len || rs.dev) && (!rr.lo || !rr.len || rr.dev);
    /* in place (or a block of one inside the other): one region */
    const int one = rs.dev && rr.dev && rs.lo < rr.lo + rr.len && rr.lo < rs.lo + rs.len;
    region_t ru = rr;
    if (one) {
        char *lo = TT_MIN(rs.lo, rr.lo), *hi = TT_MAX(rs.lo + rs.len, rr.lo + rr.len);
        ru.lo = lo;
        ru.len = (size_t)(hi - lo);
    }
    size_t salign = rs.dev && !one ? (rs.len + 63) & ~(size_t)63 : 0;
    size_t bytes = salign + (ru.dev ? ru.len : 0);
    d->word_off = (bytes + 63) & ~(size_t)63; /* a stream-ordered op's word */
    bytes = d->word_off + 64;
    d->blk = block_get(comm, bytes, ru.dev ? ru.ctx : rs.ctx);
    void *host = d->blk.p;
    if (!host) {
        d->fail_st = TUTTI_ERR_NOMEM;
        snprintf(d->fail, sizeof(d->fail),
                 "out of memory for a host copy of %zu bytes of device memory", bytes);
        return TUTTI_OK;
    }
    rs.host = one ? NULL : host;
    ru.host = (char *)host + salign;
    if (one)
        rs = (region_t){ 0 };
    const void *s_user = s ? *s : NULL;
    /* what the op reads: the send extent, alone or inside the one region */
    if (sl && (rs.dev || (one && s_user))) {
        d->in = (seg_t){ (char *)s_user, moved(one ? &ru : &rs, s_user), sl };
        d->in_ctx = one ? ru.ctx : rs.ctx;
    }
    if (ru.dev) {
        if (whole)
            d->back[0] = (seg_t){ rr.lo, NULL, rr.len }, d->nback = 1;
        else
            d->nback = merge(d->back, written(op, d->back));
        for (int i = 0; i < d->nback; i++)
            d->back[i].host = moved(&ru, d->back[i].dev);
    }
    d->back_ctx = ru.ctx;
    d->back_what = rwhat;
    if (s)
        *s = moved(&ru, moved(&rs, *s));
    if (r)
        *r = moved(&ru, *r);
    return TUTTI_OK;
}

int tt_dev_is_device(tt_comm_t *comm, const void *p, const char **what)
{
    char err[256];
    void *ctx;
    *what = comm->dev ? comm->dev->name : "";
    int k = comm->dev && p ? comm->dev->query(p, &ctx, err, sizeof(err)) : 0;
    return k == 2 ? 0 : k; /* managed memory is the host's to touch */
}

/* Stream-ordered calls' records the stream has passed freed, their blocks back in the
 * pool, at every call of any kind (one look at a pointer where none is pending): else
 * only the next stream-ordered call did, and blocks and events stayed through a run of
 * host-buffer calls */
static void reap_some(tt_comm_t *comm)
{
    if (__atomic_load_n(&comm->dev_pending, __ATOMIC_ACQUIRE))
        reap_streamed(comm, 0);
}

int tt_dev_stage_op(tt_comm_t *comm, tt_op_t *op, int streamed, const char *name)
{
    reap_some(comm);
    size_t sl, rl;
    tt_op_extents(op, &sl, &rl);
    return stage(comm, op, &op->sendbuf, sl, &op->recvbuf, rl, 0, streamed && comm->stream, name,
                 "recvbuf");
}

int tt_dev_stage_p2p(tt_comm_t *comm, tt_op_t *op, void **buf, size_t len, int is_send,
                     const char *name)
{
    reap_some(comm);
    if (is_send) {
        const void *s = *buf;
        TT_CHECK(stage(comm, op, &s, len, NULL, 0, 1, 0, name, "buf"));
        *buf = (void *)s;
        return TUTTI_OK;
    }
    return stage(comm, op, NULL, 0, buf, len, 1, 0, name, "buf");
}

static const char *op_name(const tt_op_t *op)
{
    const char *n = tt_coll_name(op->coll);
    return op->coll == TT_COLL_P2P ? (op->dev && op->dev->in.len ? "send" : "recv") : n ? n : "op";
}

/* ---- stream-ordered calls ---- */

static void nap_us(long us)
{
    struct timespec ts = { 0, us * 1000 };
    nanosleep(&ts, NULL);
}

int tt_dev_streamed(const tt_comm_t *comm, const tt_op_t *op)
{
    return comm->stream && op->dev && op->dev->fail_st >= 0;
}

int tt_dev_timeout_ms(const tt_op_t *op)
{
    const tt_dev_stage_t *d = op->dev;
    const int t = op->timeout_ms, late = op->comm->opts.stream_timeout_ms;
    if (!d || (!d->stream && !d->drained))
        return t;
    return late < 0 || late > INT32_MAX / 2 - t ? INT32_MAX / 2 : t + late;
}

/* d's failure to enqueue: the op fails when it starts, on every rank */
static void enqueue_failed(tt_dev_stage_t *d, const char *what, const char *why)
{
    d->fail_st = TUTTI_ERR_DEVICE;
    snprintf(d->fail, sizeof(d->fail), "enqueuing %s on the %s stream %p: %s", what,
             d->comm->dev->name, d->stream, why);
}

int tt_dev_stream_check(tt_comm_t *comm, const char *name)
{
    const tt_dev_ops_t *ops = comm->dev;
    char why[200] = "";
    int k = ops->stream_capturing
                ? ops->stream_capturing(comm->stream, comm->stream_ctx, why, sizeof(why))
                : 0;
    if (k == 0)
        return TUTTI_OK;
    /* a graph would hold a wait on a word of a block the library reuses: refused, as
     * NCCL's graph support is work this staging path does not have */
    return tt_comm_set_error(comm, k < 0 ? TUTTI_ERR_DEVICE : TUTTI_ERR_UNSUPPORTED,
                             "%s: the %s stream %p %s", name, ops->name, comm->stream,
                             k < 0 ? why : "is being captured into a graph: not supported");
}

static int stream_reach(tt_comm_t *comm, void *stream, void *sctx, void *ev, char *err,
                        size_t errlen);

void tt_dev_drain(tt_comm_t *comm, tt_op_t *op)
{
    tt_dev_stage_t *d = op->dev;
    const tt_dev_ops_t *ops = comm->dev;
    char why[200] = "", fail[sizeof(d->fail)] = "";
    void *ev = NULL;
    d->drained = 1;
    int st = ops->event_record(comm->stream, comm->stream_ctx, &ev, why, sizeof(why));
    if (st < 0)
        snprintf(fail, sizeof(fail), "waiting for the %s stream %p: %s", ops->name, comm->stream,
                 why);
    else
        st = stream_reach(comm, comm->stream, comm->stream_ctx, ev, fail, sizeof(fail));
    if (ev)
        ops->event_free(comm->stream_ctx, ev);
    /* a failure is the op's: it fails when it starts, on every rank (an aborted or
     * failed communicator's fails as such then) */
    if (st < 0 && d->fail_st >= 0 && !atomic_load(&comm->aborted) &&
        atomic_load(&comm->failed) >= 0) {
        d->fail_st = st;
        snprintf(d->fail, sizeof(d->fail), "%s", fail);
    }
}

int tt_dev_enqueue(tt_comm_t *comm, tt_op_t *op)
{
    tt_dev_stage_t *d = op->dev;
    const tt_dev_ops_t *ops = comm->dev;
    char why[200] = "";
    if (!d->blk.pin || !d->all_dev) {
        /* not stream-ordered (the stream waits on a word of a pinned, mapped block, and
         * host parts would be touched after the call): the stream's earlier work is
         * waited for, and the call runs as without a stream */
        tt_dev_drain(comm, op);
        return 0;
    }
    d->stream = comm->stream;
    d->sctx = comm->stream_ctx;
    atomic_store((_Atomic uint32_t *)((char *)d->blk.p + d->word_off), 0);
    if (d->in.len) {
        if (ops->copy_async(d->stream, d->sctx, d->in.host, d->in.dev, d->in.len, 1, why,
                            sizeof(why)))
            return enqueue_failed(d, "the copy of sendbuf", why), 0;
        d->enq = 1;
    }
    if (ops->event_record(d->stream, d->sctx, &d->ev_in, why, sizeof(why)))
        return enqueue_failed(d, "an event", why), 0;
    d->enq = 1;
    /* from here the stream holds the block until it has passed ev_out */
    if (ops->wait_word(d->stream, d->sctx, d->blk.p, d->word_off, why, sizeof(why)))
        return enqueue_failed(d, "a wait for the op", why), 0;
    d->held = 1;
    for (int i = 0; i < d->nback; i++) {
        const seg_t *b = &d->back[i];
        if (ops->copy_async(d->stream, d->sctx, b->dev, b->host, b->len, 0, why, sizeof(why))) {
            enqueue_failed(d, "the copy back", why);
            break;
        }
    }
    if (ops->event_record(d->stream, d->sctx, &d->ev_out, why, sizeof(why)) && d->fail_st >= 0)
        enqueue_failed(d, "an event", why);
    return 1;
}

/* Staging records whose stream has passed their ev_out (or, wait_ms > 0, all of them,
 * waiting up to wait_ms) freed, their blocks back in the pool. A record the stream has
 * not passed by then is left (its block leaked, not freed under the stream's copies). */
static void reap_streamed(tt_comm_t *comm, int wait_ms)
{
    pthread_mutex_lock(&comm->stage_lock);
    tt_dev_stage_t *list = comm->dev_pending, *keep = NULL;
    __atomic_store_n(&comm->dev_pending, NULL, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&comm->stage_lock);
    const uint64_t deadline = tt_now_ns() + (uint64_t)(wait_ms > 0 ? wait_ms : 0) * 1000000;
    while (list) {
        tt_dev_stage_t *d = list;
        list = d->next;
        char why[160] = "no event marks where the stream is done with it";
        /* the last event the stream passes while it uses the block */
        void *end = d->ev_out ? d->ev_out : d->held ? NULL : d->ev_in;
        int done = !end ? -1 : comm->dev->event_query(d->sctx, end, why, sizeof(why));
        while (done == 0 && wait_ms > 0 && tt_now_ns() < deadline) {
            nap_us(100);
            done = comm->dev->event_query(d->sctx, end, why, sizeof(why));
        }
        if (done == 0 && wait_ms <= 0) {
            d->next = keep;
            keep = d;
            continue;
        }
        if (done == 1) {
            block_put(comm, d->blk);
        } else {
            TT_WARN("rank %d: the %s stream %p has not passed a stream-ordered call's end (%s): "
                    "its %zu-byte host block is left allocated",
                    comm->rank, comm->dev->name, d->stream, done < 0 ? why : "still waiting",
                    d->blk.len);
        }
        if (d->ev_in)
            comm->dev->event_free(d->sctx, d->ev_in);
        if (d->ev_out) /* a pending event's resources go when the stream passes it */
            comm->dev->event_free(d->sctx, d->ev_out);
        free(d);
    }
    if (keep) {
        pthread_mutex_lock(&comm->stage_lock);
        tt_dev_stage_t **pp = &keep;
        while (*pp)
            pp = &(*pp)->next;
        *pp = comm->dev_pending;
        __atomic_store_n(&comm->dev_pending, keep, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&comm->stage_lock);
    }
}

/* Until the stream (in sctx) has passed ev (the call's place on it): 0; or the layer
 * failed, the communicator was aborted or failed meanwhile, or TUTTI_STREAM_TIMEOUT_MS
 * passed first: the status, err saying why. The bound: a stream held by work that never
 * ends would otherwise keep the op, the ranks waiting on it, and a destroy behind it,
 * forever; not the op timeout, which the GPU work queued ahead of a call may rightly
 * outlast. */
static int stream_reach(tt_comm_t *comm, void *stream, void *sctx, void *ev, char *err,
                        size_t errlen)
{
    char why[160] = "";
    const uint64_t deadline = tt_deadline_ns(comm->opts.stream_timeout_ms);
    for (int spins = 0;; spins += spins <= 200) {
        int done = comm->dev->event_query(sctx, ev, why, sizeof(why));
        if (done == 1)
            return TUTTI_OK;
        if (done < 0) {
            snprintf(err, errlen, "waiting for the %s stream %p: %s", comm->dev->name, stream, why);
            return TUTTI_ERR_DEVICE;
        }
        if (atomic_load(&comm->aborted) || atomic_load(&comm->failed) < 0) {
            snprintf(err, errlen, "the communicator %s while the op waited for its stream",
                     atomic_load(&comm->aborted) ? "was aborted" : "failed");
            return atomic_load(&comm->aborted) ? TUTTI_ERR_ABORTED : atomic_load(&comm->failed);
        }
        if (spins > 200 && tt_now_ns() > deadline) {
            snprintf(err, errlen,
                     "the %s stream %p did not reach the call within %d ms "
                     "(TUTTI_STREAM_TIMEOUT_MS): work queued on it before the call has not "
                     "ended",
                     comm->dev->name, stream, comm->opts.stream_timeout_ms);
            return TUTTI_ERR_TIMEOUT;
        }
        if (spins > 200)
            nap_us(20);
    }
}

/* The stream's copy in: passed (stream_reach) */
static int wait_in(tt_dev_stage_t *d, char *err, size_t errlen)
{
    return stream_reach(d->comm, d->stream, d->sctx, d->ev_in, err, errlen);
}

int tutti_comm_set_stream(tutti_comm_t *comm, void *stream)
{
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (tt_comm_foreign(comm))
        return tt_comm_refuse_foreign(comm, "set_stream", 0);
    const tt_dev_ops_t *ops = comm->dev;
    if (!stream) { /* unset: calls complete at the call again */
        comm->stream = comm->stream_ctx = NULL;
        atomic_store(&comm->stream_st, 0);
        return TUTTI_OK;
    }
    if (!ops)
        return tt_comm_set_error(comm, TUTTI_ERR_NO_DEVICE,
                                 "set_stream: no device layer (tutti_comm_device is NULL; "
                                 "TUTTI_CUDA)");
    if (!ops->stream_ctx)
        return tt_comm_set_error(comm, TUTTI_ERR_UNSUPPORTED,
                                 "set_stream: the %s layer has no streams", ops->name);
    void *ctx = NULL;
    char why[200] = "";
    /* the stream's context, and a wait enqueued on a word already set: a driver that
     * cannot make a stream wait on host memory refuses it now, not at the first call.
     * The stream holds the word's block until it passes the event after the wait: a
     * staging record of its own, reaped as the calls' are. */
    int st = ops->stream_ctx(stream, &ctx, why, sizeof(why));
    tt_dev_stage_t *d = st == TUTTI_OK ? calloc(1, sizeof(*d)) : NULL;
    if (st == TUTTI_OK && !d)
        snprintf(why, sizeof(why), "out of memory"), st = TUTTI_ERR_NOMEM;
    if (d) {
        *d = (tt_dev_stage_t){ .comm = comm, .stream = stream, .sctx = ctx };
        d->blk = block_new(comm, 64, ctx); /* not a large one of the pool's */
        if (!d->blk.p)
            snprintf(why, sizeof(why), "out of memory"), st = TUTTI_ERR_NOMEM;
        else if (!d->blk.pin)
            snprintf(why, sizeof(why), "host memory cannot be pinned"), st = TUTTI_ERR_DEVICE;
        if (st == TUTTI_OK) {
            atomic_store((_Atomic uint32_t *)d->blk.p, 1);
            st = ops->wait_word(stream, ctx, d->blk.p, 0, why, sizeof(why));
        }
        if (st == TUTTI_OK) {
            d->enq = d->held = 1;
            if (ops->event_record(stream, ctx, &d->ev_out, why, sizeof(why)) < 0)
                TT_WARN("rank %d: set_stream(%p): %s: a 64-byte block is left allocated",
                        comm->rank, stream, why);
            pend(comm, d);
        } else {
            block_put(comm, d->blk);
            free(d);
        }
    }
    if (st < 0)
        return tt_comm_set_error(comm, st, "set_stream(%p): %s", stream, why);
    comm->stream = stream;
    comm->stream_ctx = ctx;
    atomic_store(&comm->stream_st, 0);
    return TUTTI_OK;
}

int tutti_comm_stream_error(tutti_comm_t *comm)
{
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (tt_comm_foreign(comm))
        return tt_comm_refuse_foreign(comm, "stream_error", 0);
    char msg[TT_ERRMSG_LEN];
    pthread_mutex_lock(&comm->err_lock);
    int st = atomic_load(&comm->stream_st);
    snprintf(msg, sizeof(msg), "%s", st < 0 ? comm->stream_err : "");
    pthread_mutex_unlock(&comm->err_lock);
    if (st < 0)
        tt_comm_set_error(comm, st, "%s", msg);
    return st;
}

/* ---- the op's start and end ---- */

int tt_dev_copy_in(tt_op_t *op, char *err, size_t errlen)
{
    tt_dev_stage_t *d = op->dev;
    if (d && d->fail_st < 0) {
        snprintf(err, errlen, "%s", d->fail);
        return d->fail_st;
    }
    if (d && d->stream)
        return wait_in(d, err, errlen);
    if (!d || !d->in.len)
        return TUTTI_OK;
    char why[256] = "";
    const tt_dev_ops_t *ops = d->comm->dev;
    if (ops->copy(d->in_ctx, d->in.host, d->in.dev, d->in.len, 1, why, sizeof(why)) < 0) {
        snprintf(err, errlen, "copying sendbuf (%zu bytes) from %s device memory: %s", d->in.len,
                 ops->name, why);
        return TUTTI_ERR_DEVICE;
    }
    return TUTTI_OK;
}

int tt_dev_finish(tt_op_t *op, int st, char *err, size_t errlen)
{
    tt_dev_stage_t *d = op->dev;
    if (!d)
        return st;
    const char *name = op_name(op);
    op->dev = NULL;
    if (d->stream) { /* the stream copies back: let it go on, keep the block till then */
        tt_comm_t *comm = d->comm;
        pthread_mutex_lock(&comm->err_lock); /* the status and its message together */
        if (st < 0 && atomic_load(&comm->stream_st) == 0) {
            atomic_store(&comm->stream_st, st);
            snprintf(comm->stream_err, sizeof(comm->stream_err),
                     "%s seq %llu, stream-ordered on %p: %s", name, (unsigned long long)op->seq,
                     d->stream, err[0] ? err : tutti_strerror(st));
        }
        pthread_mutex_unlock(&comm->err_lock);
        if (d->enq) {
            atomic_store((_Atomic uint32_t *)((char *)d->blk.p + d->word_off), 1);
            pend(comm, d);
        } else { /* nothing was enqueued */
            block_put(comm, d->blk);
            free(d);
        }
        return st;
    }
    for (int i = 0; st >= 0 && i < d->nback; i++) {
        char why[256] = "";
        const seg_t *b = &d->back[i];
        if (d->comm->dev->copy(d->back_ctx, b->dev, b->host, b->len, 0, why, sizeof(why)) < 0) {
            snprintf(err, errlen,
                     "rank %d: %s seq %llu: copying the result (%zu bytes of %s) back to %s "
                     "device memory: %s",
                     op->rank, name, (unsigned long long)op->seq, b->len, d->back_what,
                     d->comm->dev->name, why);
            st = TUTTI_ERR_DEVICE;
        }
    }
    block_put(d->comm, d->blk);
    free(d);
    return st;
}
