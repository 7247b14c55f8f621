/* The fuser: buckets of small tensors, issued as one async allreduce each, in bucket
 * order on every rank; and the coalesced broadcast/allreduce. Written against the
 * public API only (the communicator is opaque here). */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tutti/fuse.h>
#include <tutti/tutti.h>

#include "base/base.h"
#include "core/fault.h"
#include "core/stage.h"
#include "device/device.h"
#include "reduce/reduce.h"

#define TT_FUSE_ALIGN 64 /* every tensor starts on a cache line of its bucket */
#define TT_FUSE_DEFAULT_CAP ((size_t)25 << 20)
#define TT_FUSE_DEFAULT_FIRST_CAP ((size_t)1 << 20)
#define TT_FUSE_DEFAULT_LAST_CAP ((size_t)1 << 20)
#define TT_FUSE_DEFAULT_MIN_BUCKETS 32

typedef struct tt_fuse_tensor {
    void *user; /* registered storage (NULL with bucket views) */
    size_t count, bytes;
    tutti_dtype_t dtype;
    int bucket;
    size_t offset;          /* bytes into the bucket buffer */
    _Atomic uint64_t *word; /* its word of the bucket's arrival bitmap, */
    uint64_t bit, full;     /* its bit there, and the word's value when full */
    atomic_uchar unused;    /* declared (or went out as) unused this step */
} tt_fuse_tensor_t;

/* A mark costs one atomic OR into its bucket's arrival bitmap: the bit says the tensor
 * arrived (a second mark finds it set), and the mark that fills a word counts the word
 * down; the mark that empties words_left completes the bucket and takes the lock. */
typedef struct tt_fuse_bucket {
    tutti_dtype_t dtype;
    int *tensors;
    int ntensors;
    size_t bytes, count, cap;
    unsigned char *buf;
    uint16_t *scratch;         /* fp16/bf16 copy when compressed */
    _Atomic uint64_t *arrived; /* one bit per tensor, this step */
    int nwords;
    atomic_int words_left; /* words of `arrived` not yet full */
    int status;
    tutti_work_t *work;
} tt_fuse_bucket_t;

struct tutti_fuse {
    tutti_comm_t *comm;
    tutti_fuse_opts_t opts;
    tutti_fuse_hook_t hook;
    int has_hook;
    int rank, nranks;
    pthread_mutex_t lock;
    pthread_mutex_t err_lock; /* f->err only: errors come from any thread, locked or not */
    tt_fuse_tensor_t *tensors;
    int ntensors, cap_tensors;
    tt_fuse_bucket_t *buckets;
    int nbuckets;
    int *layout_order; /* tensor order the layout was built from */
    atomic_int built;  /* marks read it without the lock */
    int steps_done;
    int next_issue;   /* next bucket to issue this step */
    int *ready_order; /* first step: order of arrival */
    atomic_int nready;
    int no_rebuild;        /* static, or the rebuild already happened (else this step records) */
    atomic_int any_unused; /* some tensor is unused this step */
    /* The ranks' registrations, compared once (registration_issue, _agree). */
    int check_issued; /* 1: issued with the first step's last bucket; 2: evaluated */
    int check_st;     /* its issue's status */
    tutti_work_t *check_work;
    uint64_t check_v[4];
    int broken; /* they differ: every later mark and wait fails with this status */
    /* The first error of a step is kept until the step's wait has returned: what
     * follows from it (a peer's mismatch, the order broadcast) would hide the cause. */
    atomic_int in_step; /* a tensor arrived, or wait runs: a step is open */
    int err_held;       /* err holds the open step's first error (err_lock) */
    char err[1024];
};

/* The fuser whose hook runs on this thread: its lock is held there, so a hook that
 * calls back into that fuser gets an error instead of a deadlock. */
static _Thread_local const tutti_fuse_t *tt_fuse_in_hook;

static int reentered(const tutti_fuse_t *f)
{
    return f && tt_fuse_in_hook == f;
}

static int fuse_error(tutti_fuse_t *f, int st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int reentry_error(tutti_fuse_t *f, const char *what)
{
    return fuse_error(f, TUTTI_ERR_INVALID_ARG,
                      "%s: called from this fuser's hook (its lock is held there)", what);
}

static int fuse_error(tutti_fuse_t *f, int st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&f->err_lock);
    if (!f->err_held) {
        vsnprintf(f->err, sizeof(f->err), fmt, ap);
        f->err_held = atomic_load_explicit(&f->in_step, memory_order_relaxed);
        TT_TRACE("fuse: %s -> %s", f->err, tutti_status_name(st));
    }
    pthread_mutex_unlock(&f->err_lock);
    va_end(ap);
    return st;
}

static size_t align_up(size_t x)
{
    return (x + TT_FUSE_ALIGN - 1) & ~(size_t)(TT_FUSE_ALIGN - 1);
}

static int compressible(const tutti_fuse_t *f, tutti_dtype_t dt)
{
    return f->opts.compress != TUTTI_FUSE_COMPRESS_NONE && (dt == TUTTI_FP32 || dt == TUTTI_FP64);
}

/* ---- options, create, destroy, register ---- */

int tutti_fuse_opts_init(tutti_fuse_opts_t *opts)
{
    if (!opts)
        return TUTTI_ERR_INVALID_ARG;
    memset(opts, 0, sizeof(*opts));
    opts->size = sizeof(*opts);
    opts->bucket_cap_bytes = TT_FUSE_DEFAULT_CAP;
    opts->first_bucket_cap_bytes = TT_FUSE_DEFAULT_FIRST_CAP;
    opts->last_bucket_cap_bytes = TT_FUSE_DEFAULT_LAST_CAP;
    opts->min_buckets = tt_env_int("FUSE_MIN_BUCKETS", TT_FUSE_DEFAULT_MIN_BUCKETS);
    opts->op = TUTTI_SUM;
    static const char *const names[3] = { "FUSE_BUCKET_CAP", "FUSE_FIRST_BUCKET_CAP",
                                          "FUSE_LAST_BUCKET_CAP" };
    size_t *fields[3] = { &opts->bucket_cap_bytes, &opts->first_bucket_cap_bytes,
                          &opts->last_bucket_cap_bytes };
    for (int i = 0; i < 3; i++) {
        const char *v = tt_env(names[i]);
        size_t x;
        if (v && tt_parse_size(v, &x) == 0)
            *fields[i] = x;
        else if (v && tt_warn_first(names[i], v)) /* once a process */
            TT_WARN("TUTTI_%s=%s is not a size (like 25M or 512K); ignored", names[i], v);
    }
    return TUTTI_OK;
}

int tutti_fuse_create(tutti_fuse_t **fuse_p, tutti_comm_t *comm, const tutti_fuse_opts_t *opts)
{
    if (!fuse_p || !comm)
        return TUTTI_ERR_INVALID_ARG;
    if (tt_comm_foreign(comm))
        return tt_comm_refuse_foreign(comm, "fuse_create", 0);
    tutti_fuse_opts_t o;
    tutti_fuse_opts_init(&o);
    if (opts) {
        if (opts->size < sizeof(o))
            return TUTTI_ERR_INVALID_ARG;
        o = *opts;
        o.size = sizeof(o);
    }
    if (o.bucket_cap_bytes == 0)
        o.bucket_cap_bytes = TT_FUSE_DEFAULT_CAP;
    if (o.first_bucket_cap_bytes == 0)
        o.first_bucket_cap_bytes = o.bucket_cap_bytes;
    if (o.op != TUTTI_SUM && o.op != TUTTI_AVG)
        return TUTTI_ERR_INVALID_ARG;
    if (o.compress < TUTTI_FUSE_COMPRESS_NONE || o.compress > TUTTI_FUSE_COMPRESS_BF16)
        return TUTTI_ERR_INVALID_ARG;
    if (o.hook && !o.hook->issue)
        return TUTTI_ERR_INVALID_ARG;
    if (o.hook && o.compress != TUTTI_FUSE_COMPRESS_NONE)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "fuse_create: compress and a hook together: the hook "
                                 "reduces the bucket itself (compress inside the hook)");
    tutti_fuse_t *f = calloc(1, sizeof(*f));
    if (!f)
        return TUTTI_ERR_NOMEM;
    f->comm = comm;
    f->opts = o;
    if (o.hook) {
        f->hook = *o.hook;
        f->has_hook = 1;
    }
    f->opts.hook = NULL;
    f->rank = tutti_comm_rank(comm);
    f->nranks = tutti_comm_size(comm);
    f->no_rebuild = o.static_layout;
    pthread_mutex_init(&f->lock, NULL);
    pthread_mutex_init(&f->err_lock, NULL);
    *fuse_p = f;
    return TUTTI_OK;
}

static void buckets_free(tt_fuse_bucket_t *b, int n)
{
    for (int i = 0; i < n; i++) {
        if (b[i].work)
            tutti_work_free(b[i].work);
        free(b[i].tensors);
        free((void *)b[i].arrived);
        free(b[i].buf);
        free(b[i].scratch);
    }
    free(b);
}

int tutti_fuse_destroy(tutti_fuse_t *f)
{
    if (!f)
        return TUTTI_OK;
    /* a forked child's copy: its works and locks are the parent's (left, as the
     * communicator's own copy is) */
    if (tt_comm_foreign(f->comm))
        return tt_comm_refuse_foreign(f->comm, "fuse_destroy", 1);
    if (reentered(f))
        return reentry_error(f, "destroy");
    /* A step left in flight: let its work finish before the buffers go. */
    for (int i = 0; i < f->nbuckets; i++)
        if (f->buckets[i].work)
            tutti_wait(f->buckets[i].work, -1);
    if (f->check_work) {
        tutti_wait(f->check_work, -1);
        tutti_work_free(f->check_work);
    }
    buckets_free(f->buckets, f->nbuckets);
    free(f->tensors);
    free(f->layout_order);
    free(f->ready_order);
    pthread_mutex_destroy(&f->lock);
    pthread_mutex_destroy(&f->err_lock);
    free(f);
    return TUTTI_OK;
}

int tutti_fuse_register(tutti_fuse_t *f, void *data, size_t count, tutti_dtype_t dtype,
                        int *index_p)
{
    if (!f || !index_p)
        return TUTTI_ERR_INVALID_ARG;
    if (tt_comm_foreign(f->comm))
        return tt_comm_refuse_foreign(f->comm, "fuse_register", 0);
    if (reentered(f))
        return reentry_error(f, "register");
    if ((unsigned)dtype >= TUTTI_DTYPE_COUNT)
        return fuse_error(f, TUTTI_ERR_INVALID_ARG, "register: invalid dtype %d", (int)dtype);
    if (!f->opts.hook && !tutti_redop_supported(f->opts.op, dtype)) {
        /* (a value-index pair under sum or avg): refused now, not at every step's wait */
        char why[160];
        tt_redop_unsupported(why, sizeof(why), f->opts.op, dtype);
        return fuse_error(f, TUTTI_ERR_INVALID_ARG, "register: %s", why);
    }
    if (count > SIZE_MAX / 16)
        return fuse_error(f, TUTTI_ERR_INVALID_ARG, "register: bad count %zu", count);
    /* A tensor of no elements has no bytes and no place in a bucket; any pointer goes. */
    if (count && (f->opts.bucket_views ? data != NULL : data == NULL))
        return fuse_error(f, TUTTI_ERR_INVALID_ARG,
                          "register: data must be %s with bucket views %s",
                          f->opts.bucket_views ? "NULL" : "non-NULL",
                          f->opts.bucket_views ? "on" : "off");
    if (!count)
        data = NULL;
    const char *kind;
    if (count && tt_dev_is_device(f->comm, data, &kind) != 0) /* the buckets copy with memcpy */
        return fuse_error(f, TUTTI_ERR_UNSUPPORTED,
                          "register: tensor %p is %s device memory (or its layer cannot tell); "
                          "the fuser takes host memory only",
                          data, kind);
    pthread_mutex_lock(&f->lock);
    int st = TUTTI_OK;
    if (f->built) {
        st = fuse_error(f, TUTTI_ERR_INVALID_ARG, "register: the layout is already built");
        goto out_unlock;
    }
    if (f->ntensors == f->cap_tensors) {
        int ncap = f->cap_tensors ? 2 * f->cap_tensors : 64;
        tt_fuse_tensor_t *nt = realloc(f->tensors, (size_t)ncap * sizeof(*nt));
        if (!nt) {
            st = TUTTI_ERR_NOMEM;
            goto out_unlock;
        }
        f->tensors = nt;
        f->cap_tensors = ncap;
    }
    tt_fuse_tensor_t *t = &f->tensors[f->ntensors];
    memset(t, 0, sizeof(*t));
    t->user = data;
    t->count = count;
    t->dtype = dtype;
    t->bytes = count * tutti_dtype_size(dtype);
    t->bucket = -1;
    *index_p = f->ntensors++;
out_unlock:
    pthread_mutex_unlock(&f->lock);
    return st;
}

/* ---- layout ---- */

/* The tensors ready last, up to the last-bucket cap, get buckets of their own: their
 * allreduce cannot start before backward ends, so they set the exposed tail. Returns the
 * position in `order` where that tail starts (n: no tail). */
static int layout_tail(const tutti_fuse_t *f, const int *order)
{
    int n = f->ntensors, tail = n;
    size_t tail_bytes = 0;
    /* tail_bytes <= the cap throughout: the subtraction cannot wrap (a sum could) */
    while (f->opts.last_bucket_cap_bytes && tail > 0 &&
           align_up(f->tensors[order[tail - 1]].bytes) <=
               f->opts.last_bucket_cap_bytes - tail_bytes)
        tail_bytes += align_up(f->tensors[order[--tail]].bytes);
    if (tail == 0)
        tail = n; /* everything fits in the cap: the usual rules alone */
    return tail;
}

/* When backward computes about as fast as the buckets communicate, a bucket's
 * allreduce lags its last tensor by the bucket's own length, so the step ends about
 * one large bucket after backward: keep buckets to 1/min_buckets of the model (not
 * below 1 MiB, where per-bucket latency would start to count). */
static size_t layout_cap(const tutti_fuse_t *f)
{
    size_t cap = f->opts.bucket_cap_bytes;
    if (f->opts.min_buckets > 0) {
        size_t total = 0; /* saturating: huge tensors must not wrap it */
        for (int i = 0; i < f->ntensors; i++) {
            size_t b = align_up(f->tensors[i].bytes);
            total = b > SIZE_MAX - total ? SIZE_MAX : total + b;
        }
        size_t share = TT_MAX(total / (size_t)f->opts.min_buckets, (size_t)1 << 20);
        cap = TT_MIN(cap, share);
    }
    return cap;
}

/* Size the buckets: tensor i goes to bucket tb[i] at offset toff[i]; lo gets `order`.
 * A tensor of no bytes gets no bucket (tb[i] = -1). Returns the number of buckets. An
 * open bucket's bytes are below its cap, so `cap - bytes` does not wrap where
 * `bytes + need` could (caps near SIZE_MAX, tensors near SIZE_MAX / 2). */
static int layout_assign(const tutti_fuse_t *f, const int *order, int tail, size_t cap,
                         tt_fuse_bucket_t *b, int *tb, size_t *toff, int *lo)
{
    int n = f->ntensors, nb = 0;
    int open[TUTTI_DTYPE_COUNT];
    for (int d = 0; d < TUTTI_DTYPE_COUNT; d++)
        open[d] = -1;
    for (int k = 0; k < n; k++) {
        int i = order[k];
        lo[k] = i;
        const tt_fuse_tensor_t *t = &f->tensors[i];
        size_t need = align_up(t->bytes);
        if (k == tail)
            for (int d = 0; d < TUTTI_DTYPE_COUNT; d++)
                open[d] = -1;
        if (need == 0) {
            tb[i] = -1;
            toff[i] = 0;
            continue;
        }
        int ob = open[t->dtype];
        if (ob >= 0 && need <= b[ob].cap - b[ob].bytes) {
            tb[i] = ob;
            toff[i] = b[ob].bytes;
            b[ob].bytes += need;
            b[ob].ntensors++;
            if (b[ob].bytes == b[ob].cap)
                open[t->dtype] = -1;
            continue;
        }
        int nbk = nb++;
        b[nbk].dtype = t->dtype;
        b[nbk].cap = nbk == 0    ? f->opts.first_bucket_cap_bytes
                     : k >= tail ? f->opts.last_bucket_cap_bytes
                                 : cap;
        b[nbk].bytes = need;
        b[nbk].ntensors = 1;
        tb[i] = nbk;
        toff[i] = 0;
        open[t->dtype] = need >= b[nbk].cap ? -1 : nbk;
    }
    return nb;
}

/* Allocate the sized buckets' buffers, tensor lists and arrival words. */
static int buckets_alloc(const tutti_fuse_t *f, tt_fuse_bucket_t *b, int nb)
{
    int st = TUTTI_OK;
    for (int j = 0; j < nb; j++) {
        size_t es = tutti_dtype_size(b[j].dtype);
        b[j].count = b[j].bytes / es;
        b[j].tensors = malloc(sizeof(int) * (size_t)b[j].ntensors);
        b[j].nwords = (b[j].ntensors + 63) / 64;
        b[j].arrived = calloc((size_t)b[j].nwords, sizeof(*b[j].arrived));
        atomic_init(&b[j].words_left, b[j].nwords);
        void *p = NULL;
        if (!b[j].tensors || !b[j].arrived || posix_memalign(&p, TT_FUSE_ALIGN, b[j].bytes) != 0) {
            st = TUTTI_ERR_NOMEM;
            b[j].buf = NULL;
            continue;
        }
        b[j].buf = p;
        memset(b[j].buf, 0, b[j].bytes); /* padding stays zero for good */
        if (compressible(f, b[j].dtype)) {
            b[j].scratch = malloc(b[j].count * sizeof(uint16_t));
            if (!b[j].scratch)
                st = TUTTI_ERR_NOMEM;
        }
        b[j].ntensors = 0; /* refilled by buckets_fill */
    }
    return st;
}

/* List each bucket's tensors in `order` and give each tensor its arrival bit. */
static void buckets_fill(tutti_fuse_t *f, const int *order, tt_fuse_bucket_t *b, int nb,
                         const int *tb)
{
    for (int k = 0; k < f->ntensors; k++) {
        int i = order[k];
        if (tb[i] < 0) { /* no bytes: no bucket, no arrival bit */
            f->tensors[i].word = NULL;
            continue;
        }
        tt_fuse_bucket_t *bk = &b[tb[i]];
        bk->tensors[bk->ntensors++] = i;
    }
    for (int j = 0; j < nb; j++) {
        for (int slot = 0; slot < b[j].ntensors; slot++) {
            tt_fuse_tensor_t *t = &f->tensors[b[j].tensors[slot]];
            int w = slot / 64, in_word = TT_MIN(64, b[j].ntensors - 64 * w);
            t->word = &b[j].arrived[w];
            t->bit = (uint64_t)1 << (slot % 64);
            t->full = in_word == 64 ? ~(uint64_t)0 : ((uint64_t)1 << in_word) - 1;
        }
    }
}

/* Assign tensors to buckets following `order` (a permutation of the tensors): one open
 * bucket per dtype; a bucket closes when the next tensor would overflow its cap; a
 * tensor at least as large as the cap gets a bucket of its own. Buckets are numbered in
 * the order they were opened, i.e. by their first tensor's position. Called with the
 * lock held. With views, the old buffers' contents move into the new ones. */
static int layout_build(tutti_fuse_t *f, const int *order)
{
    int n = f->ntensors;
    int *tb = malloc(sizeof(int) * (size_t)(n ? n : 1));
    size_t *toff = malloc(sizeof(size_t) * (size_t)(n ? n : 1));
    tt_fuse_bucket_t *b = calloc((size_t)(n ? n : 1), sizeof(*b));
    int *lo = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!tb || !toff || !b || !lo) {
        free(tb);
        free(toff);
        free(b);
        free(lo);
        return TUTTI_ERR_NOMEM;
    }
    int nb = layout_assign(f, order, layout_tail(f, order), layout_cap(f), b, tb, toff, lo);
    int st = buckets_alloc(f, b, nb);
    if (st < 0) {
        buckets_free(b, nb);
        free(tb);
        free(toff);
        free(lo);
        return st;
    }
    buckets_fill(f, order, b, nb, tb);
    for (int i = 0; i < n; i++) {
        tt_fuse_tensor_t *t = &f->tensors[i];
        if (f->opts.bucket_views && f->built && t->bucket >= 0)
            tt_copy(b[tb[i]].buf + toff[i], f->buckets[t->bucket].buf + t->offset, t->bytes);
        t->bucket = tb[i];
        t->offset = toff[i];
    }
    buckets_free(f->buckets, f->nbuckets);
    free(f->layout_order);
    f->buckets = b;
    f->nbuckets = nb;
    f->layout_order = lo;
    atomic_store_explicit(&f->built, 1, memory_order_release);
    free(tb);
    free(toff);
    TT_INFO("fuse: %d tensors in %d buckets", n, nb);
    return TUTTI_OK;
}

static int ensure_built(tutti_fuse_t *f)
{
    if (f->built)
        return TUTTI_OK;
    int *order = malloc(sizeof(int) * (size_t)(f->ntensors ? f->ntensors : 1));
    if (!f->ready_order)
        f->ready_order = calloc((size_t)(f->ntensors ? f->ntensors : 1), sizeof(int));
    if (!order || !f->ready_order) {
        free(order);
        return TUTTI_ERR_NOMEM;
    }
    for (int i = 0; i < f->ntensors; i++)
        order[i] = i;
    int st = layout_build(f, order);
    free(order);
    return st;
}

int tutti_fuse_tensor_data(tutti_fuse_t *f, int index, void **data_p)
{
    if (!f || !data_p)
        return TUTTI_ERR_INVALID_ARG;
    if (reentered(f))
        return reentry_error(f, "tensor_data");
    pthread_mutex_lock(&f->lock);
    int st = TUTTI_OK;
    if (index < 0 || index >= f->ntensors) {
        st = fuse_error(f, TUTTI_ERR_INVALID_ARG, "tensor_data: no tensor %d", index);
        goto out_unlock;
    }
    if (!f->opts.bucket_views) {
        *data_p = f->tensors[index].user;
        goto out_unlock;
    }
    TT_CHECK_GOTO(ensure_built(f), st, out_unlock);
    tt_fuse_tensor_t *t = &f->tensors[index];
    *data_p = t->bucket < 0 ? NULL : f->buckets[t->bucket].buf + t->offset;
out_unlock:
    pthread_mutex_unlock(&f->lock);
    return st;
}

int tutti_fuse_num_buckets(tutti_fuse_t *f, int *n_p)
{
    if (!f || !n_p)
        return TUTTI_ERR_INVALID_ARG;
    if (reentered(f))
        return reentry_error(f, "num_buckets");
    pthread_mutex_lock(&f->lock);
    int st = ensure_built(f);
    if (st == TUTTI_OK)
        *n_p = f->nbuckets;
    pthread_mutex_unlock(&f->lock);
    return st;
}

int tutti_fuse_tensor_bucket(tutti_fuse_t *f, int index, int *bucket_p)
{
    if (!f || !bucket_p)
        return TUTTI_ERR_INVALID_ARG;
    if (reentered(f))
        return reentry_error(f, "tensor_bucket");
    pthread_mutex_lock(&f->lock);
    int st = ensure_built(f);
    if (st == TUTTI_OK && (index < 0 || index >= f->ntensors))
        st = fuse_error(f, TUTTI_ERR_INVALID_ARG, "tensor_bucket: no tensor %d", index);
    if (st == TUTTI_OK)
        *bucket_p = f->tensors[index].bucket;
    pthread_mutex_unlock(&f->lock);
    return st;
}

const char *tutti_fuse_last_error(const tutti_fuse_t *f)
{
    return f ? f->err : "";
}

/* ---- the ranks' registrations, compared once ---- */

static uint64_t fp_mix(uint64_t h, uint64_t x)
{
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

/* What must be equal on every rank: the registered tensors (count and dtype, in
 * registration order: [0]) and what the layout and the step's collectives follow from
 * ([1]: the effective caps, op, compression, static layout, find_unused, a hook). */
static void fingerprints(const tutti_fuse_t *f, uint64_t fp[2])
{
    uint64_t h = fp_mix(0x7475747469667573ull, (uint64_t)f->ntensors);
    for (int i = 0; i < f->ntensors; i++)
        h = fp_mix(fp_mix(h, (uint64_t)f->tensors[i].count), (uint64_t)f->tensors[i].dtype);
    fp[0] = h;
    const uint64_t o[] = { layout_cap(f),
                           f->opts.first_bucket_cap_bytes,
                           f->opts.last_bucket_cap_bytes,
                           (uint64_t)f->opts.op,
                           (uint64_t)f->opts.compress,
                           (uint64_t) !!f->opts.static_layout,
                           (uint64_t) !!f->opts.find_unused,
                           (uint64_t)f->has_hook };
    h = 0x6f707473ull;
    for (size_t i = 0; i < sizeof(o) / sizeof(o[0]); i++)
        h = fp_mix(h, o[i]);
    fp[1] = h;
}

static void spec_text(char *buf, size_t len, int64_t count, int64_t dtype, int64_t n)
{
    if (dtype < 0)
        snprintf(buf, len, "not registered (%lld tensors)", (long long)n);
    else
        snprintf(buf, len, "%lld x %s", (long long)count, tutti_dtype_name((tutti_dtype_t)dtype));
}

/* The lists differ somewhere: name the first difference on every rank. Rank 0's list
 * (padded to the longest) goes to every rank; each finds its first index that differs;
 * the smallest (index, rank) wins, and that rank sends its entry. Collective; only on
 * the mismatch path. */
static int registration_diff(tutti_fuse_t *f)
{
    tutti_comm_t *c = f->comm;
    int64_t nmax = f->ntensors, n0 = f->ntensors;
    int st = tutti_allreduce(c, TUTTI_IN_PLACE, &nmax, 1, TUTTI_INT64, TUTTI_MAX);
    if (st == TUTTI_OK)
        st = tutti_broadcast(c, TUTTI_IN_PLACE, &n0, 1, TUTTI_INT64, 0);
    if (st < 0)
        return st;
    int64_t *ref = malloc(sizeof(int64_t) * 2 * (size_t)(nmax ? nmax : 1));
    if (!ref)
        return TUTTI_ERR_NOMEM; /* every rank then stops here or fails in the broadcast */
    for (int64_t i = 0; i < nmax; i++) {
        int in = i < f->ntensors;
        ref[2 * i] = in ? (int64_t)f->tensors[i].count : 0;
        ref[2 * i + 1] = in ? (int64_t)f->tensors[i].dtype : -1;
    }
    int64_t mine[2] = { 0, -1 };
    uint64_t key = UINT64_MAX;
    st = tutti_broadcast(c, TUTTI_IN_PLACE, ref, 2 * (size_t)nmax, TUTTI_INT64, 0);
    for (int64_t i = 0; i < nmax && st == TUTTI_OK; i++) {
        int in = i < f->ntensors;
        int64_t cnt = in ? (int64_t)f->tensors[i].count : 0;
        int64_t dt = in ? (int64_t)f->tensors[i].dtype : -1;
        if (ref[2 * i] != cnt || ref[2 * i + 1] != dt) {
            key = (uint64_t)i << 32 | (uint32_t)f->rank;
            mine[0] = cnt;
            mine[1] = dt;
            break;
        }
    }
    if (st == TUTTI_OK)
        st = tutti_allreduce(c, TUTTI_IN_PLACE, &key, 1, TUTTI_UINT64, TUTTI_MIN);
    if (st == TUTTI_OK && key != UINT64_MAX) {
        int idx = (int)(key >> 32), who = (int)(key & 0xffffffffu);
        int64_t theirs[2] = { mine[0], mine[1] }, n_who = f->ntensors;
        st = tutti_broadcast(c, TUTTI_IN_PLACE, theirs, 2, TUTTI_INT64, who);
        if (st == TUTTI_OK)
            st = tutti_broadcast(c, TUTTI_IN_PLACE, &n_who, 1, TUTTI_INT64, who);
        if (st == TUTTI_OK) {
            char a[96], b[96];
            spec_text(a, sizeof(a), ref[2 * idx], ref[2 * idx + 1], n0);
            spec_text(b, sizeof(b), theirs[0], theirs[1], n_who);
            free(ref);
            return fuse_error(f, TUTTI_ERR_MISMATCH,
                              "the ranks registered different tensors: tensor %d is %s on rank "
                              "0 but %s on rank %d (this rank, %d, registered %d tensors)",
                              idx, a, b, who, f->rank, f->ntensors);
        }
    } else if (st == TUTTI_OK) {
        st = TUTTI_ERR_INTERNAL; /* the fingerprints differed, the lists do not */
    }
    free(ref);
    return st;
}

/* Once, at the end of the first step's issues (so in the same place of every rank's
 * sequence, after its buckets; async, so a first wait is not collective beyond its
 * buckets): one allreduce of MAX over {h, ~h} of both fingerprints gives every rank
 * their largest and smallest values. Lock held. */
static void registration_issue(tutti_fuse_t *f)
{
    uint64_t fp[2];
    fingerprints(f, fp);
    f->check_v[0] = fp[0];
    f->check_v[1] = ~fp[0];
    f->check_v[2] = fp[1];
    f->check_v[3] = ~fp[1];
    f->check_issued = 1;
    f->check_st = tutti_allreduce_async(f->comm, TUTTI_IN_PLACE, f->check_v, 4, TUTTI_UINT64,
                                        TUTTI_MAX, &f->check_work);
}

/* The check's outcome, in wait before anything is unpacked. Every rank learns the same
 * one, and a mismatch makes the fuser fail for good on every rank (f->broken). A check
 * that failed to run leaves its text in *why (the buckets' errors, which come first,
 * are usually its cause). */
static int registration_agree(tutti_fuse_t *f, char *why, size_t len)
{
    int st = f->check_st;
    if (st < 0)
        snprintf(why, len, "%s", tutti_comm_last_error(f->comm));
    if (f->check_work) {
        st = tutti_wait(f->check_work, -1);
        if (st < 0)
            snprintf(why, len, "%s", tutti_work_error(f->check_work));
        tutti_work_free(f->check_work);
        f->check_work = NULL;
    }
    if (st < 0)
        return st;
    const uint64_t *v = f->check_v;
    if (v[0] != ~v[1]) {
        f->broken = TUTTI_ERR_MISMATCH;
        st = registration_diff(f);
        if (st != TUTTI_ERR_MISMATCH)
            fuse_error(f, TUTTI_ERR_MISMATCH,
                       "the ranks registered different tensors (count and dtype, in "
                       "registration order; naming the first difference failed: %s)",
                       tutti_strerror(st));
        return TUTTI_ERR_MISMATCH;
    }
    if (v[2] != ~v[3]) {
        f->broken = TUTTI_ERR_MISMATCH;
        return fuse_error(f, TUTTI_ERR_MISMATCH,
                          "the ranks created the fuser with different options (effective "
                          "bucket caps, op, compress, static_layout, find_unused or a hook)");
    }
    return TUTTI_OK;
}

/* ---- issuing buckets ---- */

static void compress_down(tutti_fuse_t *f, tt_fuse_bucket_t *b)
{
    float scale = f->opts.op == TUTTI_AVG ? 1.0f / (float)f->nranks : 1.0f;
    int bf = f->opts.compress == TUTTI_FUSE_COMPRESS_BF16;
    for (size_t i = 0; i < b->count; i++) {
        float x;
        if (b->dtype == TUTTI_FP32) {
            memcpy(&x, b->buf + 4 * i, 4);
        } else {
            double d;
            memcpy(&d, b->buf + 8 * i, 8);
            x = (float)d;
        }
        x *= scale;
        b->scratch[i] = bf ? tt_float_to_bf16(x) : tt_float_to_half(x);
    }
}

static void compress_up(tutti_fuse_t *f, tt_fuse_bucket_t *b)
{
    int bf = f->opts.compress == TUTTI_FUSE_COMPRESS_BF16;
    for (size_t i = 0; i < b->count; i++) {
        float x = bf ? tt_bf16_to_float(b->scratch[i]) : tt_half_to_float(b->scratch[i]);
        if (b->dtype == TUTTI_FP32) {
            memcpy(b->buf + 4 * i, &x, 4);
        } else {
            double d = x;
            memcpy(b->buf + 8 * i, &d, 8);
        }
    }
}

static void bucket_info(tutti_fuse_t *f, int j, tutti_fuse_bucket_t *info)
{
    tt_fuse_bucket_t *b = &f->buckets[j];
    *info = (tutti_fuse_bucket_t){ .index = j,
                                   .data = b->buf,
                                   .count = b->count,
                                   .dtype = b->dtype,
                                   .op = f->opts.op,
                                   .nranks = f->nranks };
}

static void bucket_issue(tutti_fuse_t *f, int j)
{
    tt_fuse_bucket_t *b = &f->buckets[j];
    int st;
    b->work = NULL;
    if (f->has_hook) {
        tutti_fuse_bucket_t info;
        bucket_info(f, j, &info);
        const tutti_fuse_t *outer = tt_fuse_in_hook;
        tt_fuse_in_hook = f;
        st = f->hook.issue(f->hook.arg, f->comm, &info, &b->work);
        tt_fuse_in_hook = outer;
        if (st == TUTTI_OK && !b->work)
            st = TUTTI_ERR_INVALID_ARG;
        if (st < 0)
            fuse_error(f, st, "bucket %d: hook failed: %s", j, tutti_strerror(st));
    } else if (b->scratch) {
        compress_down(f, b);
        tutti_dtype_t wire = f->opts.compress == TUTTI_FUSE_COMPRESS_BF16 ? TUTTI_BF16 : TUTTI_FP16;
        st = tutti_allreduce_async(f->comm, TUTTI_IN_PLACE, b->scratch, b->count, wire, TUTTI_SUM,
                                   &b->work);
    } else {
        st = tutti_allreduce_async(f->comm, TUTTI_IN_PLACE, b->buf, b->count, b->dtype, f->opts.op,
                                   &b->work);
    }
    if (st < 0 && !f->has_hook)
        fuse_error(f, st, "bucket %d: %s", j, tutti_comm_last_error(f->comm));
    b->status = st < 0 ? st : TUTTI_OK;
}

static int bucket_complete(tt_fuse_bucket_t *b)
{
    return atomic_load_explicit(&b->words_left, memory_order_acquire) == 0;
}

/* Issue every complete bucket from next_issue on, stopping at the first incomplete
 * one: buckets go out in index order on every rank. The call that issues the step's
 * last bucket issues deferred: every tensor has arrived, so tutti_fuse_wait comes
 * next and runs those buckets on its own thread. Lock held. */
static void issue_ready(tutti_fuse_t *f)
{
    int end = f->next_issue;
    while (end < f->nbuckets && bucket_complete(&f->buckets[end]))
        end++;
    int last = end == f->nbuckets;
    if (last)
        tt_exec_defer(1);
    while (f->next_issue < end)
        bucket_issue(f, f->next_issue++);
    if (last && !f->check_issued)
        registration_issue(f);
    if (last)
        tt_exec_defer(0);
}

static int tensor_arrived(const tt_fuse_tensor_t *t)
{
    return (atomic_load_explicit(t->word, memory_order_acquire) & t->bit) != 0;
}

/* Set t's arrival bit once its place in the bucket is filled. 1: this completed the
 * bucket; 0: not; -1: the bit was set already (a second mark, at the same time). */
static int arrive_bit(tutti_fuse_t *f, const tt_fuse_tensor_t *t)
{
    uint64_t old = atomic_fetch_or_explicit(t->word, t->bit, memory_order_acq_rel);
    if (old & t->bit)
        return -1;
    if ((old | t->bit) != t->full)
        return 0;
    return atomic_fetch_sub_explicit(&f->buckets[t->bucket].words_left, 1, memory_order_acq_rel) ==
           1;
}

static int arrive_error(tutti_fuse_t *f, int index, const char *what)
{
    return fuse_error(f, TUTTI_ERR_INVALID_ARG, "%s: tensor %d already arrived this step", what,
                      index);
}

/* t counts as zeros this step (declared unused, or forgotten): its place is zeroed, and
 * its own storage keeps its values at wait. */
static void arrive_as_zeros(tutti_fuse_t *f, tt_fuse_tensor_t *t)
{
    memset(f->buckets[t->bucket].buf + t->offset, 0, t->bytes);
    atomic_store_explicit(&t->unused, 1, memory_order_relaxed);
    atomic_store_explicit(&f->any_unused, 1, memory_order_relaxed);
}

/* A tensor arrived (ready or unused): fill its place, set its bit, and if that
 * completed a bucket, issue what is complete. No lock until a bucket completes: the
 * tensor's place is its own until its bucket goes out, so threads marking tensors copy
 * in parallel. Marks run between waits (never beside one), so the layout is stable. */
static int tensor_arrive(tutti_fuse_t *f, int index, int unused, const char *what)
{
    if (!f)
        return TUTTI_ERR_INVALID_ARG;
    if (reentered(f))
        return reentry_error(f, what);
    if (index < 0 || index >= f->ntensors)
        return fuse_error(f, TUTTI_ERR_INVALID_ARG, "%s: no tensor %d", what, index);
    if (f->broken)
        return fuse_error(f, f->broken, "%s: the ranks registered different tensors", what);
    /* written once a step, not by every tensor's thread onto one shared line */
    if (!atomic_load_explicit(&f->in_step, memory_order_relaxed))
        atomic_store_explicit(&f->in_step, 1, memory_order_relaxed);
    if (!atomic_load_explicit(&f->built, memory_order_acquire)) {
        pthread_mutex_lock(&f->lock);
        int st = ensure_built(f);
        pthread_mutex_unlock(&f->lock);
        TT_CHECK(st);
    }
    tt_fuse_tensor_t *t = &f->tensors[index];
    if (t->bucket < 0) /* no bytes: nothing to reduce, complete whatever happens */
        return TUTTI_OK;
    if (tensor_arrived(t)) /* before touching the bucket, which may be in flight */
        return arrive_error(f, index, what);
    if (unused)
        arrive_as_zeros(f, t);
    else if (!f->opts.bucket_views)
        tt_copy(f->buckets[t->bucket].buf + t->offset, t->user, t->bytes);
    int done = arrive_bit(f, t);
    if (done < 0)
        return arrive_error(f, index, what);
    if (!unused && !f->no_rebuild)
        f->ready_order[atomic_fetch_add_explicit(&f->nready, 1, memory_order_relaxed)] = index;
    if (done) {
        pthread_mutex_lock(&f->lock);
        issue_ready(f);
        pthread_mutex_unlock(&f->lock);
    }
    return TUTTI_OK;
}

int tutti_fuse_mark_ready(tutti_fuse_t *f, int index)
{
    if (f && tt_comm_foreign(f->comm))
        return tt_comm_refuse_foreign(f->comm, "fuse_mark_ready", 0);
    return tensor_arrive(f, index, 0, "mark_ready");
}

int tutti_fuse_mark_unused(tutti_fuse_t *f, int index)
{
    if (f && tt_comm_foreign(f->comm))
        return tt_comm_refuse_foreign(f->comm, "fuse_mark_unused", 0);
    if (f && !f->opts.find_unused)
        return fuse_error(f, TUTTI_ERR_INVALID_ARG,
                          "mark_unused: the fuser was created without find_unused");
    return tensor_arrive(f, index, 1, "mark_unused");
}

/* ---- the end of a step ---- */

/* Every rank must have declared the same tensors unused. One allreduce of a 0/1 array:
 * a sum other than 0 or nranks names a tensor the ranks disagree on. */
static int unused_agree(tutti_fuse_t *f)
{
    int n = f->ntensors;
    int32_t *v = malloc(sizeof(int32_t) * (size_t)n);
    if (!v)
        return TUTTI_ERR_NOMEM;
    for (int i = 0; i < n; i++)
        v[i] = atomic_load_explicit(&f->tensors[i].unused, memory_order_relaxed);
    int st = tutti_allreduce(f->comm, TUTTI_IN_PLACE, v, (size_t)n, TUTTI_INT32, TUTTI_SUM);
    if (st < 0) {
        fuse_error(f, st, "unused-tensor check: %s", tutti_comm_last_error(f->comm));
    } else {
        for (int i = 0; i < n; i++) {
            if (v[i] != 0 && v[i] != f->nranks) {
                st = fuse_error(f, TUTTI_ERR_MISMATCH,
                                "tensor %d is unused on %d of %d ranks (this rank: %s)", i, v[i],
                                f->nranks,
                                atomic_load_explicit(&f->tensors[i].unused, memory_order_relaxed)
                                    ? "unused"
                                    : "used");
                break;
            }
        }
    }
    free(v);
    return st;
}

/* End of the first step: rank 0's arrival order (then its unused tensors, in index
 * order) reaches every rank, and every rank rebuilds from it, unless it is the order
 * the layout already has. */
static int rebuild_from_order(tutti_fuse_t *f)
{
    int n = f->ntensors;
    int32_t *ord = malloc(sizeof(int32_t) * (size_t)n);
    int *seen = calloc((size_t)n, sizeof(int));
    int *order = malloc(sizeof(int) * (size_t)n);
    int st = TUTTI_OK;
    if (!ord || !seen || !order) {
        st = TUTTI_ERR_NOMEM;
        goto out_free;
    }
    int k = 0;
    int nready = TT_MIN(atomic_load_explicit(&f->nready, memory_order_relaxed), n);
    for (int j = 0; j < nready; j++) {
        int x = f->ready_order[j]; /* a mark beside the wait (a misuse) may leave junk */
        if (x >= 0 && x < n && !seen[x]) {
            ord[k++] = x;
            seen[x] = 1;
        }
    }
    for (int i = 0; i < n; i++)
        if (!seen[i])
            ord[k++] = i;
    st = tutti_broadcast(f->comm, TUTTI_IN_PLACE, ord, (size_t)n, TUTTI_INT32, 0);
    if (st < 0) {
        fuse_error(f, st, "broadcasting the recorded order: %s", tutti_comm_last_error(f->comm));
        goto out_free;
    }
    memset(seen, 0, sizeof(int) * (size_t)n);
    int same = 1;
    for (int i = 0; i < n; i++) {
        if (ord[i] < 0 || ord[i] >= n || seen[ord[i]]) {
            st = fuse_error(f, TUTTI_ERR_PROTOCOL,
                            "recorded order from rank 0 is not a "
                            "permutation (entry %d)",
                            i);
            goto out_free;
        }
        seen[ord[i]] = 1;
        order[i] = ord[i];
        same &= order[i] == f->layout_order[i];
    }
    if (!same)
        st = layout_build(f, order);
out_free:
    free(ord);
    free(seen);
    free(order);
    return st;
}

static int wait_step(tutti_fuse_t *f)
{
    if (f->broken) /* every rank knows: none communicates */
        return fuse_error(f, f->broken, "wait: the ranks registered different tensors");
    pthread_mutex_lock(&f->lock);
    int st = ensure_built(f);
    if (st < 0) {
        pthread_mutex_unlock(&f->lock);
        return st;
    }
    /* Forgotten tensors go out as zeros so that this rank issues every bucket. */
    int forgotten = -1;
    for (int j = 0; j < f->nbuckets; j++) {
        tt_fuse_bucket_t *b = &f->buckets[j];
        for (int k = 0; !bucket_complete(b) && k < b->ntensors; k++) {
            tt_fuse_tensor_t *t = &f->tensors[b->tensors[k]];
            if (tensor_arrived(t))
                continue;
            if (forgotten < 0 || b->tensors[k] < forgotten)
                forgotten = b->tensors[k];
            arrive_as_zeros(f, t);
            arrive_bit(f, t);
        }
    }
    issue_ready(f);
    pthread_mutex_unlock(&f->lock);

    /* The first wait compares the ranks' registrations before anything is unpacked: a
     * difference whose buckets happen to match in size would reduce mismatched data.
     * (Its allreduce went out after the buckets, so it completes after them.) */
    int cst = TUTTI_OK;
    char why[512] = "";
    if (f->check_issued == 1) {
        f->check_issued = 2;
        cst = registration_agree(f, why, sizeof(why));
    }

    /* Only this thread touches the buckets from here on. */
    for (int j = 0; j < f->nbuckets; j++) {
        tt_fuse_bucket_t *b = &f->buckets[j];
        int bst = b->status;
        if (b->work) {
            int ws = tutti_wait(b->work, -1);
            if (ws < 0 && bst == TUTTI_OK) {
                bst = ws;
                fuse_error(f, ws, "bucket %d: %s", j, tutti_work_error(b->work));
            }
            tutti_work_free(b->work);
            b->work = NULL;
        }
        if (f->broken)
            continue; /* waited for; nothing unpacked */
        if (bst == TUTTI_OK && b->scratch)
            compress_up(f, b);
        if (bst == TUTTI_OK && f->has_hook && f->hook.finish) {
            tutti_fuse_bucket_t info;
            bucket_info(f, j, &info);
            bst = f->hook.finish(f->hook.arg, &info);
            if (bst < 0)
                fuse_error(f, bst, "bucket %d: hook finish failed: %s", j, tutti_strerror(bst));
        }
        if (bst == TUTTI_OK && !f->opts.bucket_views) {
            for (int k = 0; k < b->ntensors; k++) {
                tt_fuse_tensor_t *t = &f->tensors[b->tensors[k]];
                if (!atomic_load_explicit(&t->unused, memory_order_relaxed))
                    tt_copy(t->user, b->buf + t->offset, t->bytes);
            }
        }
        if (bst < 0 && st == TUTTI_OK)
            st = bst;
    }
    /* a difference in registrations is the cause of whatever else failed; a failed
     * check alone follows from the buckets' errors */
    if (f->broken)
        st = f->broken;
    else if (cst < 0 && st == TUTTI_OK)
        st = fuse_error(f, cst, "comparing the ranks' registrations: %s", why);
    if (forgotten >= 0 && st == TUTTI_OK)
        st = fuse_error(f, TUTTI_ERR_INVALID_ARG,
                        "tensor %d (and maybe more) was neither marked ready nor unused; "
                        "it went out as zeros",
                        forgotten);
    if (f->opts.find_unused && !f->broken) {
        int ust = unused_agree(f);
        if (ust < 0 && (st == TUTTI_OK || ust == TUTTI_ERR_MISMATCH))
            st = ust;
    }

    pthread_mutex_lock(&f->lock);
    if (!f->no_rebuild && !f->broken) {
        /* Attempted whatever happened above, so that every rank calls the broadcast. */
        int rst = rebuild_from_order(f);
        if (rst < 0 && st == TUTTI_OK)
            st = rst;
        f->no_rebuild = 1;
    }
    if (atomic_exchange_explicit(&f->any_unused, 0, memory_order_relaxed))
        for (int i = 0; i < f->ntensors; i++)
            atomic_store_explicit(&f->tensors[i].unused, 0, memory_order_relaxed);
    for (int j = 0; j < f->nbuckets; j++) {
        tt_fuse_bucket_t *b = &f->buckets[j];
        for (int w = 0; w < b->nwords; w++)
            atomic_store_explicit(&b->arrived[w], 0, memory_order_relaxed);
        atomic_store_explicit(&b->words_left, b->nwords, memory_order_relaxed);
        b->status = TUTTI_OK;
    }
    f->next_issue = 0;
    f->steps_done++;
    pthread_mutex_unlock(&f->lock);
    return st;
}

int tutti_fuse_wait(tutti_fuse_t *f)
{
    if (!f)
        return TUTTI_ERR_INVALID_ARG;
    if (tt_comm_foreign(f->comm))
        return tt_comm_refuse_foreign(f->comm, "fuse_wait", 0);
    if (reentered(f))
        return reentry_error(f, "wait");
    atomic_store_explicit(&f->in_step, 1, memory_order_relaxed);
    int st = wait_step(f);
    /* the step is over: its first error stays readable, the next step's replaces it */
    pthread_mutex_lock(&f->err_lock);
    atomic_store_explicit(&f->in_step, 0, memory_order_relaxed);
    f->err_held = 0;
    pthread_mutex_unlock(&f->err_lock);
    return st;
}

/* ---- coalesced collectives ---- */

typedef struct tt_coal_slot {
    tutti_work_t *work;
    unsigned char *stage;
    size_t stage_cap;
    int first, last; /* the positions in small[] packed into the stage */
} tt_coal_slot_t;

typedef struct tt_coal {
    tutti_comm_t *comm;
    int bcast, root, rank;
    tutti_redop_t op;
    tutti_dtype_t dtype; /* UINT8 for broadcast: bytes are bytes */
    void *const *bufs;
    const size_t *bytes;
    const int *idx;
} tt_coal_t;

/* Wait for a stage's collective and unpack it into its tensors. */
static int coal_finish(const tt_coal_t *c, const int *small, tt_coal_slot_t *s)
{
    if (!s->work)
        return TUTTI_OK;
    int st = tutti_wait(s->work, -1);
    tutti_work_free(s->work);
    s->work = NULL;
    if (st < 0 || (c->bcast && c->rank == c->root))
        return st;
    size_t off = 0;
    for (int k = s->first; k < s->last; k++) {
        tt_copy(c->bufs[small[k]], s->stage + off, c->bytes[small[k]]);
        off += c->bytes[small[k]];
    }
    return TUTTI_OK;
}

/* One collective on buf in place: blocking when work_p is NULL. */
static int coal_issue(const tt_coal_t *c, void *buf, size_t bytes, tutti_work_t **work_p)
{
    size_t count = bytes / tutti_dtype_size(c->dtype);
    if (c->bcast)
        return work_p ? tutti_broadcast_async(c->comm, TUTTI_IN_PLACE, buf, count, c->dtype,
                                              c->root, work_p)
                      : tutti_broadcast(c->comm, TUTTI_IN_PLACE, buf, count, c->dtype, c->root);
    return work_p
               ? tutti_allreduce_async(c->comm, TUTTI_IN_PLACE, buf, count, c->dtype, c->op, work_p)
               : tutti_allreduce(c->comm, TUTTI_IN_PLACE, buf, count, c->dtype, c->op);
}

/* A tensor this big is bandwidth-bound on its own on any transport: packing it would
 * only add copies. */
#define TT_COAL_DIRECT_BYTES ((size_t)1 << 20)

/* Run one group (m tensors idx[0..m) of one dtype). A tensor worth packing is smaller
 * than a stage (the cap, at most 1 MiB) and than the size below which its copies cost
 * less than the collective's latency (tt_comm_pack_below: about 36 KB over shm, 360 KB
 * over tcp with the table's parameters). Others go alone, in place, as blocking calls:
 * nothing to pack, and no thread handoff. Small ones are packed in index order (big
 * ones between them do not cut a stage) into stages, two in flight: the progress
 * thread runs one while this thread packs the next; the last stage is issued deferred,
 * since this thread waits for it next. */
static int coal_run(const tt_coal_t *c, int m, size_t cap_bytes)
{
    size_t cap = TT_MIN(cap_bytes, TT_COAL_DIRECT_BYTES); /* a stage's bytes */
    size_t alone = TT_MIN(cap, TT_MAX(tt_comm_pack_below(c->comm, c->bcast), (size_t)1));
    int *small = malloc(sizeof(int) * (size_t)(m ? m : 1));
    if (!small)
        return TUTTI_ERR_NOMEM;
    int ns = 0, st = TUTTI_OK;
    size_t small_bytes = 0;
    for (int k = 0; k < m && st == TUTTI_OK; k++) {
        int i = c->idx[k];
        if (c->bytes[i] >= alone) {
            st = coal_issue(c, c->bufs[i], c->bytes[i], NULL);
        } else {
            small[ns++] = i;
            small_bytes += c->bytes[i];
        }
    }
    size_t stage_bytes = TT_MIN(small_bytes, cap);
    tt_coal_slot_t slot[2];
    memset(slot, 0, sizeof(slot));
    for (int s = 0; s < 2 && stage_bytes && st == TUTTI_OK; s++) {
        slot[s].stage = tt_comm_stage_get(c->comm, stage_bytes, &slot[s].stage_cap);
        if (!slot[s].stage)
            st = TUTTI_ERR_NOMEM;
    }
    int g = 0;
    for (int k = 0; k < ns && st == TUTTI_OK; g++) {
        tt_coal_slot_t *s = &slot[g & 1];
        st = coal_finish(c, small, s);
        if (st < 0)
            break;
        size_t sum = 0;
        int j = k;
        while (j < ns && sum + c->bytes[small[j]] <= cap)
            sum += c->bytes[small[j++]];
        if (!c->bcast || c->rank == c->root) {
            size_t off = 0;
            for (int q = k; q < j; q++) {
                tt_copy(s->stage + off, c->bufs[small[q]], c->bytes[small[q]]);
                off += c->bytes[small[q]];
            }
        }
        s->first = k;
        s->last = k = j;
        int last = k == ns;
        if (last)
            tt_exec_defer(1);
        st = coal_issue(c, s->stage, sum, &s->work);
        if (last)
            tt_exec_defer(0);
    }
    /* the older slot first: completion is in issue order anyway */
    int st1 = coal_finish(c, small, &slot[g & 1]);
    int st2 = coal_finish(c, small, &slot[(g + 1) & 1]);
    if (st == TUTTI_OK)
        st = st1 < 0 ? st1 : st2;
    tt_comm_stage_put(c->comm, slot[0].stage, slot[0].stage_cap);
    tt_comm_stage_put(c->comm, slot[1].stage, slot[1].stage_cap);
    free(small);
    return st;
}

static int coal_check(tutti_comm_t *comm, void *const *bufs, const size_t *counts,
                      const tutti_dtype_t *dtypes, int n, size_t **bytes_p, int **idx_p)
{
    /* each refusal says why (session 97: they left last_error as it was) */
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (tt_comm_foreign(comm))
        return tt_comm_refuse_foreign(comm, "coalesced call", 0);
    if (n < 0 || (n > 0 && (!bufs || !counts || !dtypes)))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "coalesced call: %s",
                                 n < 0 ? "a negative tensor count" : "bufs, counts or dtypes NULL");
    for (int i = 0; i < n; i++) {
        if ((unsigned)dtypes[i] >= TUTTI_DTYPE_COUNT)
            return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                     "coalesced call: tensor %d: invalid dtype %d", i,
                                     (int)dtypes[i]);
        if (counts[i] > SIZE_MAX / 16 || (counts[i] && (!bufs[i] || bufs[i] == TUTTI_IN_PLACE)))
            return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "coalesced call: tensor %d: %s",
                                     i,
                                     counts[i] > SIZE_MAX / 16 ? "count too large"
                                     : !bufs[i]
                                         ? "NULL buffer with a count > 0"
                                         : "the in-place marker (TUTTI_IN_PLACE) is no buffer (a "
                                           "coalesced call is in place: pass the tensor)");
        const char *kind; /* small tensors are packed with memcpy */
        if (counts[i] && tt_dev_is_device(comm, bufs[i], &kind) != 0)
            return tt_comm_set_error(comm, TUTTI_ERR_UNSUPPORTED,
                                     "coalesced call: tensor %d is %s device memory (or its layer "
                                     "cannot tell); the coalesced calls take host memory only "
                                     "(call the collective for each tensor)",
                                     i, kind);
    }
    *bytes_p = malloc(sizeof(size_t) * (size_t)(n ? n : 1));
    *idx_p = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!*bytes_p || !*idx_p) {
        free(*bytes_p);
        free(*idx_p);
        return TUTTI_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++)
        (*bytes_p)[i] = counts[i] * tutti_dtype_size(dtypes[i]);
    return TUTTI_OK;
}

int tutti_broadcast_coalesced(tutti_comm_t *comm, void *const *bufs, const size_t *counts,
                              const tutti_dtype_t *dtypes, int n, int root, size_t cap_bytes)
{
    size_t *bytes;
    int *idx;
    if (comm && (root < 0 || root >= tutti_comm_size(comm)))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "broadcast_coalesced: root %d is not a rank (0..%d)", root,
                                 tutti_comm_size(comm) - 1);
    TT_CHECK(coal_check(comm, bufs, counts, dtypes, n, &bytes, &idx));
    int m = 0;
    for (int i = 0; i < n; i++)
        if (bytes[i])
            idx[m++] = i;
    tt_coal_t c = { .comm = comm,
                    .bcast = 1,
                    .root = root,
                    .rank = tutti_comm_rank(comm),
                    .dtype = TUTTI_UINT8,
                    .bufs = bufs,
                    .bytes = bytes,
                    .idx = idx };
    int st = coal_run(&c, m, cap_bytes ? cap_bytes : TT_FUSE_DEFAULT_CAP);
    free(bytes);
    free(idx);
    return st;
}

int tutti_allreduce_coalesced(tutti_comm_t *comm, void *const *bufs, const size_t *counts,
                              const tutti_dtype_t *dtypes, int n, tutti_redop_t op,
                              size_t cap_bytes)
{
    size_t *bytes;
    int *idx;
    if (comm && tt_comm_foreign(comm))
        return tt_comm_refuse_foreign(comm, "allreduce_coalesced", 0);
    if (comm && !tt_redop_valid(op))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "allreduce_coalesced: invalid op %d%s", (int)op,
                                 tt_redop_invalid_hint(op));
    TT_CHECK(coal_check(comm, bufs, counts, dtypes, n, &bytes, &idx));
    int st = TUTTI_OK;
    /* refused before any tensor is reduced, not when its dtype's turn comes */
    for (int i = 0; i < n && st == TUTTI_OK; i++)
        if (!tutti_redop_supported(op, dtypes[i])) {
            char why[128];
            tt_redop_unsupported(why, sizeof(why), op, dtypes[i]);
            st = tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                   "allreduce_coalesced: tensor %d: %s", i, why);
        }
    for (int d = 0; d < TUTTI_DTYPE_COUNT && st == TUTTI_OK; d++) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (dtypes[i] == (tutti_dtype_t)d && bytes[i])
                idx[m++] = i;
        if (!m)
            continue;
        tt_coal_t c = { .comm = comm,
                        .op = op,
                        .rank = tutti_comm_rank(comm),
                        .dtype = (tutti_dtype_t)d,
                        .bufs = bufs,
                        .bytes = bytes,
                        .idx = idx };
        st = coal_run(&c, m, cap_bytes ? cap_bytes : TT_FUSE_DEFAULT_CAP);
    }
    free(bytes);
    free(idx);
    return st;
}
