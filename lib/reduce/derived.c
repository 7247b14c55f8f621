/* Derived datatypes (derived.h): the constructors MPI has (contiguous, vector, hvector,
 * indexed, hindexed, indexed_block, struct, subarray, resized, dup), a table of the
 * values they hand out, and packing. A type is built by placing runs of its parts'
 * elements at byte displacements; the result is flattened to an element's runs of bytes
 * (in the map's order, neighbours merged), its bounds and the one dtype its bytes are. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "reduce/derived.h"
#include "reduce/reduce.h"

#define TT_EXPORT __attribute__((visibility("default")))
#define TT_NTYPES (TUTTI_DTYPE_USER_LAST - TUTTI_DTYPE_USER_FIRST + 1)
/* The most runs one element may have (16 bytes each): a vector of 16 Mi single doubles
 * is 256 MiB of map; beyond that, a call would spend its time walking the map anyway. */
#define TT_MAX_RUNS ((size_t)1 << 24)

static tt_derived_t *tt_types[TT_NTYPES];
static char tt_type_names[TT_NTYPES][48]; /* kept past a free: tutti_dtype_name's pointer */
static pthread_mutex_t tt_types_lock = PTHREAD_MUTEX_INITIALIZER;

static int slot_of(tutti_dtype_t d)
{
    return tt_dtype_in_user_range(d) ? (int)((unsigned)d - TUTTI_DTYPE_USER_FIRST) : -1;
}

tt_derived_t *tt_derived_hold(tutti_dtype_t dtype)
{
    int i = slot_of(dtype);
    if (i < 0)
        return NULL;
    pthread_mutex_lock(&tt_types_lock);
    tt_derived_t *t = tt_types[i];
    if (t)
        atomic_fetch_add(&t->refs, 1);
    pthread_mutex_unlock(&tt_types_lock);
    return t;
}

void tt_derived_release(tt_derived_t *t)
{
    if (t && atomic_fetch_sub(&t->refs, 1) == 1) {
        free(t->blk);
        free(t);
    }
}

size_t tt_derived_size(tutti_dtype_t dtype)
{
    tt_derived_t *t = tt_derived_hold(dtype);
    size_t s = t ? t->size : 0;
    tt_derived_release(t);
    return s;
}

const char *tt_derived_name(tutti_dtype_t dtype)
{
    int i = slot_of(dtype);
    return i >= 0 && tt_type_names[i][0] ? tt_type_names[i] : NULL;
}

TT_EXPORT size_t tutti_dtype_size(tutti_dtype_t dtype)
{
    if ((unsigned)dtype < TUTTI_DTYPE_COUNT)
        return tt_dtype_basic_size(dtype);
    return tt_derived_size(dtype); /* (a derived type's, packed: MPI_Type_size) */
}

TT_EXPORT const char *tutti_dtype_name(tutti_dtype_t dtype)
{
    if ((unsigned)dtype < TUTTI_DTYPE_COUNT)
        return tt_dtype_basic_name(dtype);
    const char *d = tt_derived_name(dtype);
    return d ? d : "?";
}

TT_EXPORT int tutti_redop_supported(tutti_redop_t op, tutti_dtype_t dtype)
{
    if ((unsigned)dtype >= TUTTI_DTYPE_COUNT) { /* a derived type reduces as its base */
        tt_derived_t *t = tt_derived_hold(dtype);
        tutti_dtype_t base = t ? t->base : TUTTI_DTYPE_COUNT;
        tt_derived_release(t);
        return (unsigned)base < TUTTI_DTYPE_COUNT && tt_reduce_supported(base, op);
    }
    return tt_reduce_supported(dtype, op);
}

/* ---- packing ---- */

/* one run's bytes: the short ones of predefined dtypes by constant-size moves (a call
 * of memcpy per 4 or 8 bytes packed a struct at 2.5 GB/s: bench/pack-bench) */
static inline void copy_run(char *dst, const char *src, size_t len)
{
    switch (len) {
    case 1: *dst = *src; break;
    case 2: memcpy(dst, src, 2); break;
    case 4: memcpy(dst, src, 4); break;
    case 8: memcpy(dst, src, 8); break;
    case 16: memcpy(dst, src, 16); break;
    default: memcpy(dst, src, len);
    }
}

/* n runs of len bytes, src_step apart, to dst_step apart (a strided column packed, or
 * unpacked): constant-size moves for the 4- and 8-byte runs of the predefined dtypes
 * (a memcpy call each unpacked a column at 3.6 GB/s: bench/pack-bench) */
static void strided(char *dst, size_t dst_step, const char *src, size_t src_step, size_t len,
                    size_t n)
{
    if (len == 8)
        for (size_t i = 0; i < n; i++, dst += dst_step, src += src_step)
            memcpy(dst, src, 8);
    else if (len == 4)
        for (size_t i = 0; i < n; i++, dst += dst_step, src += src_step)
            memcpy(dst, src, 4);
    else
        for (size_t i = 0; i < n; i++, dst += dst_step, src += src_step)
            memcpy(dst, src, len);
}

void tt_derived_pack(const tt_derived_t *t, const void *in, size_t count, void *out)
{
    const char *p = in;
    char *o = out;
    if (!count || !t->size)
        return;
    if (t->nblk == 1 && t->blk[0].len == t->extent) { /* contiguous */
        memcpy(o, p + t->blk[0].off, count * t->size);
        return;
    }
    if (t->nblk == 1) { /* a strided column: the common halo type */
        strided(o, t->blk[0].len, p + t->blk[0].off, t->extent, t->blk[0].len, count);
        return;
    }
    for (size_t i = 0; i < count; i++, p += t->extent)
        for (size_t b = 0; b < t->nblk; b++) {
            copy_run(o, p + t->blk[b].off, t->blk[b].len);
            o += t->blk[b].len;
        }
}

void tt_derived_unpack(const tt_derived_t *t, const void *in, size_t nbytes, void *out,
                       size_t count)
{
    const char *s = in;
    char *p = out;
    if (!t->size)
        return;
    size_t whole = TT_MIN(count, nbytes / t->size);
    if (t->nblk == 1 && t->blk[0].len == t->extent) {
        memcpy(p + t->blk[0].off, s, TT_MIN(nbytes, count * t->size));
        return;
    }
    if (t->nblk == 1) { /* a strided column, as tt_derived_pack's */
        strided(p + t->blk[0].off, t->extent, s, t->blk[0].len, t->blk[0].len, whole);
        s += whole * t->blk[0].len;
        p += whole * t->extent;
    } else {
        for (size_t i = 0; i < whole; i++, p += t->extent)
            for (size_t b = 0; b < t->nblk; b++) {
                copy_run(p + t->blk[b].off, s, t->blk[b].len);
                s += t->blk[b].len;
            }
    }
    size_t left = whole < count ? nbytes - whole * t->size : 0; /* a part of the next one */
    for (size_t b = 0; b < t->nblk && left; b++) {
        size_t n = TT_MIN(left, t->blk[b].len);
        memcpy(p + t->blk[b].off, s, n);
        s += n;
        left -= n;
    }
}

/* ---- building ---- */

/* Any type as the constructors read it: a predefined dtype is one run of its size. */
typedef struct view {
    size_t size, extent, align, nbase;
    ptrdiff_t lb;
    tutti_dtype_t base;
    int marked; /* its bounds came from a resize (no struct padding over it) */
    size_t nblk;
    const tt_blk_t *blk;
    tt_blk_t one;
    tt_derived_t *held;
} view_t;

static size_t dtype_align(tutti_dtype_t d)
{
    switch (d) {
    case TUTTI_COMPLEX64: return _Alignof(float);
    case TUTTI_COMPLEX128: return _Alignof(double);
    case TUTTI_FLOAT_INT: return _Alignof(tt_pair_float_int_t);
    case TUTTI_DOUBLE_INT: return _Alignof(tt_pair_double_int_t);
    case TUTTI_LONG_INT: return _Alignof(tt_pair_long_int_t);
    case TUTTI_2INT: return _Alignof(tt_pair_2int_t);
    case TUTTI_SHORT_INT: return _Alignof(tt_pair_short_int_t);
    default: return tt_dtype_basic_size(d);
    }
}

static int view_of(tutti_dtype_t d, view_t *v, const char *fn)
{
    memset(v, 0, sizeof(*v));
    if ((unsigned)d < TUTTI_DTYPE_COUNT) {
        v->size = v->extent = tt_dtype_basic_size(d);
        v->align = dtype_align(d);
        v->base = d;
        v->nbase = 1;
        v->one = (tt_blk_t){ 0, v->size };
        v->blk = &v->one;
        v->nblk = 1;
        return TUTTI_OK;
    }
    tt_derived_t *t = tt_derived_hold(d);
    if (!t)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                   "%s: type %d is no dtype (not a predefined one, nor a "
                                   "defined one now: freed, or never made)",
                                   fn, (int)d);
    *v = (view_t){ .size = t->size,
                   .extent = t->extent,
                   .align = t->align,
                   .nbase = t->nbase,
                   .lb = t->lb,
                   .base = t->base,
                   .marked = t->marked,
                   .nblk = t->nblk,
                   .blk = t->blk,
                   .held = t };
    return TUTTI_OK;
}

typedef struct builder {
    const char *fn;
    tt_blk_t *blk;
    size_t n, cap, size, align;
    ptrdiff_t lb, ub;   /* over the parts placed (any: one was) */
    ptrdiff_t mlb, mub; /* over the marked parts (marked: one was): MPI's sticky bounds */
    int any, marked, mixed;
    tutti_dtype_t base; /* TUTTI_DTYPE_COUNT: none yet */
    int st;
} builder_t;

static int b_fail(builder_t *b, int st, const char *why)
{
    if (b->st == TUTTI_OK)
        b->st = tt_thread_error_set(st, "%s: %s", b->fn, why);
    return b->st;
}

static void put_run(builder_t *b, ptrdiff_t off, size_t len)
{
    if (!len || b->st < 0)
        return;
    if (b->n && b->blk[b->n - 1].off + (ptrdiff_t)b->blk[b->n - 1].len == off) {
        b->blk[b->n - 1].len += len;
        return;
    }
    if (b->n == b->cap) {
        if (b->cap >= TT_MAX_RUNS) {
            b_fail(b, TUTTI_ERR_INVALID_ARG,
                   "the type's map has more than 16 Mi separate runs of bytes (make it of "
                   "larger blocks, or pack it yourself)");
            return;
        }
        size_t cap = b->cap ? 2 * b->cap : 8;
        tt_blk_t *nb = realloc(b->blk, cap * sizeof(*nb));
        if (!nb) {
            b_fail(b, TUTTI_ERR_NOMEM, "out of memory for the type's map");
            return;
        }
        b->blk = nb;
        b->cap = cap;
    }
    b->blk[b->n++] = (tt_blk_t){ off, len };
}

/* c elements of v, back to back from byte displacement d */
static void place(builder_t *b, ptrdiff_t d, size_t c, const view_t *v)
{
    if (!c || b->st < 0)
        return;
    ptrdiff_t span, lo, hi;
    size_t bytes;
    if (c > (size_t)PTRDIFF_MAX ||
        __builtin_mul_overflow((ptrdiff_t)c, (ptrdiff_t)v->extent, &span) ||
        __builtin_add_overflow(d, v->lb, &lo) || __builtin_add_overflow(lo, span, &hi) ||
        __builtin_mul_overflow(c, v->size, &bytes) ||
        __builtin_add_overflow(b->size, bytes, &b->size)) {
        b_fail(b, TUTTI_ERR_INVALID_ARG, "its displacements or sizes overflow the address space");
        return;
    }
    b->lb = b->any ? TT_MIN(b->lb, lo) : lo;
    b->ub = b->any ? TT_MAX(b->ub, hi) : hi;
    b->any = 1;
    if (v->marked) {
        b->mlb = b->marked ? TT_MIN(b->mlb, lo) : lo;
        b->mub = b->marked ? TT_MAX(b->mub, hi) : hi;
        b->marked = 1;
    }
    b->align = TT_MAX(b->align, v->align);
    if (v->size) {
        if (b->base == TUTTI_DTYPE_COUNT && !b->mixed)
            b->base = v->base;
        else if (b->base != v->base)
            b->mixed = 1;
    }
    if (v->nblk == 1 && v->blk[0].len == v->extent) { /* contiguous: one run */
        put_run(b, d + v->blk[0].off, c * v->blk[0].len);
        return;
    }
    for (size_t j = 0; j < c && b->st == TUTTI_OK; j++)
        for (size_t k = 0; k < v->nblk; k++)
            put_run(b, d + (ptrdiff_t)j * (ptrdiff_t)v->extent + v->blk[k].off, v->blk[k].len);
}

static void release_view(view_t *v)
{
    tt_derived_release(v->held);
    v->held = NULL;
}

/* The builder's type into the table: *new_p its value. pad: a struct's (its extent
 * rounded up to its parts' alignment, as C pads a struct, unless a part was resized);
 * given: the bounds are lb and extent (resized, subarray, dup), marked as such. */
static int finish(builder_t *b, const char *what, int pad, int given, ptrdiff_t lb, size_t extent,
                  int marked, tutti_dtype_t *new_p)
{
    if (b->st < 0) {
        free(b->blk);
        return b->st;
    }
    tt_derived_t *t = calloc(1, sizeof(*t));
    if (!t) {
        free(b->blk);
        return tt_thread_error_set(TUTTI_ERR_NOMEM, "%s: out of memory", b->fn);
    }
    t->blk = b->blk;
    t->nblk = b->n;
    t->size = b->size;
    t->align = b->align ? b->align : 1;
    /* MPI's bounds: those of the parts' markers where a part has them (a resized or
     * subarray part sets its struct's extent), else the parts' own */
    t->lb = b->marked ? b->mlb : b->any ? b->lb : 0;
    size_t ext = b->marked ? (size_t)(b->mub - b->mlb) : b->any ? (size_t)(b->ub - b->lb) : 0;
    if (pad && !b->marked && t->align > 1 && ext % t->align)
        ext += t->align - ext % t->align;
    t->extent = ext;
    if (given) {
        t->lb = lb;
        t->extent = extent;
    }
    t->marked = given ? marked : b->marked;
    ptrdiff_t lo = 0, hi = 0;
    for (size_t i = 0; i < t->nblk; i++) {
        lo = i ? TT_MIN(lo, t->blk[i].off) : t->blk[i].off;
        hi = i ? TT_MAX(hi, t->blk[i].off + (ptrdiff_t)t->blk[i].len)
               : t->blk[i].off + (ptrdiff_t)t->blk[i].len;
    }
    t->true_lb = lo;
    t->true_extent = (size_t)(hi - lo);
    t->base = b->mixed ? TUTTI_DTYPE_COUNT : t->size ? b->base : TUTTI_UINT8;
    t->nbase = t->base == TUTTI_DTYPE_COUNT ? t->size : t->size / tt_dtype_basic_size(t->base);
    if (t->size && !t->extent) {
        free(t->blk);
        free(t);
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                   "%s: an extent of 0 with %zu bytes of data (every element "
                                   "would land on the first)",
                                   b->fn, b->size);
    }
    atomic_init(&t->refs, 1);
    pthread_mutex_lock(&tt_types_lock);
    int i = 0;
    while (i < TT_NTYPES && tt_types[i])
        i++;
    if (i == TT_NTYPES) {
        pthread_mutex_unlock(&tt_types_lock);
        free(t->blk);
        free(t);
        return tt_thread_error_set(TUTTI_ERR_NOMEM,
                                   "%s: every value of the defined types' range is taken (%d "
                                   "types defined: free some with tutti_type_free)",
                                   b->fn, TT_NTYPES);
    }
    const tutti_dtype_t v = (tutti_dtype_t)(TUTTI_DTYPE_USER_FIRST + i);
    snprintf(t->name, sizeof(t->name), "type %d (%s of %s)", (int)v, what,
             t->base == TUTTI_DTYPE_COUNT ? "mixed" : tt_dtype_basic_name(t->base));
    memcpy(tt_type_names[i], t->name, sizeof(t->name));
    tt_types[i] = t;
    pthread_mutex_unlock(&tt_types_lock);
    *new_p = v;
    return TUTTI_OK;
}

static builder_t builder(const char *fn)
{
    return (builder_t){ .fn = fn, .base = TUTTI_DTYPE_COUNT, .st = TUTTI_OK };
}

/* The constructors of one old type: count blocks of lens[i] (or len) elements at
 * displacements displs[i] (or i * stride), in old's extents (bytes: 0) or bytes (1);
 * arrays: 1 blocklens (lens) must be given, 2 displs must. */
enum { NEED_LENS = 1, NEED_DISPLS = 2 };
static int make(const char *fn, const char *what, size_t count, const size_t *lens, size_t len,
                const ptrdiff_t *displs, ptrdiff_t stride, int bytes, int arrays, tutti_dtype_t old,
                tutti_dtype_t *new_p)
{
    if (!new_p)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "%s: newtype_p is NULL", fn);
    if (count && (arrays & NEED_LENS) && !lens)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "%s: blocklens is NULL with count %zu",
                                   fn, count);
    if (count && (arrays & NEED_DISPLS) && !displs)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "%s: displs is NULL with count %zu", fn,
                                   count);
    view_t v;
    TT_CHECK(view_of(old, &v, fn));
    builder_t b = builder(fn);
    /* blocks of a contiguous type that meet (a vector of stride blocklen): one block, not
     * count placements merged one by one (2^30 of them took 9 s: review) */
    size_t all;
    const int contig = v.nblk == 1 && v.blk[0].len == v.extent && v.blk[0].off == v.lb;
    if (!lens && !displs && count && contig && !__builtin_mul_overflow(count, len, &all) &&
        stride == (ptrdiff_t)(bytes ? len * v.extent : len) && len <= (size_t)PTRDIFF_MAX) {
        place(&b, 0, all, &v);
        count = 0;
    }
    for (size_t i = 0; i < count && b.st == TUTTI_OK; i++) {
        ptrdiff_t d = displs ? displs[i] : 0;
        if (!displs && __builtin_mul_overflow((ptrdiff_t)i, stride, &d))
            b_fail(&b, TUTTI_ERR_INVALID_ARG, "its displacements overflow the address space");
        if (!bytes && __builtin_mul_overflow(d, (ptrdiff_t)v.extent, &d))
            b_fail(&b, TUTTI_ERR_INVALID_ARG, "its displacements overflow the address space");
        place(&b, d, lens ? lens[i] : len, &v);
    }
    release_view(&v);
    return finish(&b, what, 0, 0, 0, 0, 0, new_p);
}

TT_EXPORT int tutti_type_contiguous(size_t count, tutti_dtype_t oldtype, tutti_dtype_t *newtype_p)
{
    return make("type_contiguous", "contiguous", 1, NULL, count, NULL, 0, 1, 0, oldtype, newtype_p);
}

TT_EXPORT int tutti_type_vector(size_t count, size_t blocklen, ptrdiff_t stride,
                                tutti_dtype_t oldtype, tutti_dtype_t *newtype_p)
{
    return make("type_vector", "vector", count, NULL, blocklen, NULL, stride, 0, 0, oldtype,
                newtype_p);
}

TT_EXPORT int tutti_type_hvector(size_t count, size_t blocklen, ptrdiff_t stride_bytes,
                                 tutti_dtype_t oldtype, tutti_dtype_t *newtype_p)
{
    return make("type_hvector", "hvector", count, NULL, blocklen, NULL, stride_bytes, 1, 0, oldtype,
                newtype_p);
}

TT_EXPORT int tutti_type_indexed(size_t count, const size_t *blocklens, const ptrdiff_t *displs,
                                 tutti_dtype_t oldtype, tutti_dtype_t *newtype_p)
{
    return make("type_indexed", "indexed", count, blocklens, 0, displs, 0, 0,
                NEED_LENS | NEED_DISPLS, oldtype, newtype_p);
}

TT_EXPORT int tutti_type_hindexed(size_t count, const size_t *blocklens,
                                  const ptrdiff_t *displs_bytes, tutti_dtype_t oldtype,
                                  tutti_dtype_t *newtype_p)
{
    return make("type_hindexed", "hindexed", count, blocklens, 0, displs_bytes, 0, 1,
                NEED_LENS | NEED_DISPLS, oldtype, newtype_p);
}

TT_EXPORT int tutti_type_indexed_block(size_t count, size_t blocklen, const ptrdiff_t *displs,
                                       tutti_dtype_t oldtype, tutti_dtype_t *newtype_p)
{
    return make("type_indexed_block", "indexed_block", count, NULL, blocklen, displs, 0, 0,
                NEED_DISPLS, oldtype, newtype_p);
}

TT_EXPORT int tutti_type_struct(size_t count, const size_t *blocklens,
                                const ptrdiff_t *displs_bytes, const tutti_dtype_t *types,
                                tutti_dtype_t *newtype_p)
{
    const char *fn = "type_struct";
    if (!newtype_p)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "%s: newtype_p is NULL", fn);
    if (count && (!blocklens || !displs_bytes || !types))
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                   "%s: blocklens, displs or types is NULL with count %zu", fn,
                                   count);
    builder_t b = builder(fn);
    for (size_t i = 0; i < count && b.st == TUTTI_OK; i++) {
        view_t v;
        if (view_of(types[i], &v, fn) < 0) {
            free(b.blk);
            return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                       "%s: types[%zu] = %d is no dtype (not a predefined one, "
                                       "nor a defined one now)",
                                       fn, i, (int)types[i]);
        }
        place(&b, displs_bytes[i], blocklens[i], &v);
        release_view(&v);
    }
    return finish(&b, "struct", 1, 0, 0, 0, 0, newtype_p);
}

TT_EXPORT int tutti_type_subarray(int ndims, const size_t *sizes, const size_t *subsizes,
                                  const size_t *starts, int order, tutti_dtype_t oldtype,
                                  tutti_dtype_t *newtype_p)
{
    const char *fn = "type_subarray";
    if (!newtype_p)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "%s: newtype_p is NULL", fn);
    if (ndims < 1 || ndims > 32)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "%s: ndims %d is not in [1, 32]", fn,
                                   ndims);
    if (!sizes || !subsizes || !starts)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "%s: sizes, subsizes or starts is NULL",
                                   fn);
    if (order != TUTTI_ORDER_C && order != TUTTI_ORDER_FORTRAN)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                   "%s: order %d is neither TUTTI_ORDER_C nor TUTTI_ORDER_FORTRAN",
                                   fn, order);
    size_t total = 1, sub = 1;
    for (int k = 0; k < ndims; k++) {
        if (subsizes[k] > sizes[k] || starts[k] > sizes[k] - subsizes[k])
            return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                       "%s: dimension %d: start %zu + subsize %zu is beyond its "
                                       "size %zu",
                                       fn, k, starts[k], subsizes[k], sizes[k]);
        if (__builtin_mul_overflow(total, sizes[k], &total) || total > (size_t)PTRDIFF_MAX)
            return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "%s: the array's size overflows", fn);
        sub *= subsizes[k];
    }
    view_t v;
    TT_CHECK(view_of(oldtype, &v, fn));
    size_t full_bytes;
    if (__builtin_mul_overflow(total, v.extent, &full_bytes) || full_bytes > (size_t)PTRDIFF_MAX) {
        release_view(&v);
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "%s: the array's size overflows", fn);
    }
    /* dims from the slowest to the fastest varying */
    size_t dim[32], subd[32], st[32], stride[32], idx[32] = { 0 };
    for (int k = 0; k < ndims; k++) {
        int src = order == TUTTI_ORDER_C ? k : ndims - 1 - k;
        dim[k] = sizes[src];
        subd[k] = subsizes[src];
        st[k] = starts[src];
    }
    stride[ndims - 1] = 1;
    for (int k = ndims - 2; k >= 0; k--)
        stride[k] = stride[k + 1] * dim[k + 1];
    builder_t b = builder(fn);
    /* a run of the fastest dimension's subsize per index of the others */
    while (sub && b.st == TUTTI_OK) {
        size_t e = st[ndims - 1];
        for (int k = 0; k < ndims - 1; k++)
            e += (st[k] + idx[k]) * stride[k];
        place(&b, (ptrdiff_t)(e * v.extent), subd[ndims - 1], &v);
        int k = ndims - 2;
        while (k >= 0 && ++idx[k] == subd[k])
            idx[k--] = 0;
        if (k < 0)
            break;
    }
    release_view(&v);
    return finish(&b, "subarray", 0, 1, 0, full_bytes, 1, newtype_p);
}

TT_EXPORT int tutti_type_resized(tutti_dtype_t oldtype, ptrdiff_t lb, size_t extent,
                                 tutti_dtype_t *newtype_p)
{
    const char *fn = "type_resized";
    if (!newtype_p)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "%s: newtype_p is NULL", fn);
    if (extent > (size_t)PTRDIFF_MAX)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "%s: extent %zu is too large", fn,
                                   extent);
    view_t v;
    TT_CHECK(view_of(oldtype, &v, fn));
    builder_t b = builder(fn);
    place(&b, 0, 1, &v);
    release_view(&v);
    return finish(&b, "resized", 0, 1, lb, extent, 1, newtype_p);
}

TT_EXPORT int tutti_type_dup(tutti_dtype_t oldtype, tutti_dtype_t *newtype_p)
{
    const char *fn = "type_dup";
    if (!newtype_p)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "%s: newtype_p is NULL", fn);
    view_t v;
    TT_CHECK(view_of(oldtype, &v, fn));
    builder_t b = builder(fn);
    place(&b, 0, 1, &v);
    const int marked = v.marked;
    const ptrdiff_t lb = v.lb;
    const size_t ext = v.extent;
    release_view(&v);
    return finish(&b, "dup", 0, 1, lb, ext, marked, newtype_p);
}

TT_EXPORT int tutti_type_free(tutti_dtype_t type)
{
    int i = slot_of(type);
    pthread_mutex_lock(&tt_types_lock);
    tt_derived_t *t = i >= 0 ? tt_types[i] : NULL;
    if (t)
        tt_types[i] = NULL;
    pthread_mutex_unlock(&tt_types_lock);
    if (!t)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                   "type_free: %d is not a defined type (a predefined dtype, one "
                                   "freed already, or never made)",
                                   (int)type);
    tt_derived_release(t);
    return TUTTI_OK;
}

static int bounds(const char *fn, tutti_dtype_t type, int true_, ptrdiff_t *lb_p, size_t *extent_p)
{
    if ((unsigned)type < TUTTI_DTYPE_COUNT) {
        if (lb_p)
            *lb_p = 0;
        if (extent_p)
            *extent_p = tt_dtype_basic_size(type);
        return TUTTI_OK;
    }
    tt_derived_t *t = tt_derived_hold(type);
    if (!t)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "%s: type %d is no dtype", fn, (int)type);
    if (lb_p)
        *lb_p = true_ ? t->true_lb : t->lb;
    if (extent_p)
        *extent_p = true_ ? t->true_extent : t->extent;
    tt_derived_release(t);
    return TUTTI_OK;
}

TT_EXPORT int tutti_type_extent(tutti_dtype_t type, ptrdiff_t *lb_p, size_t *extent_p)
{
    return bounds("type_extent", type, 0, lb_p, extent_p);
}

TT_EXPORT int tutti_type_true_extent(tutti_dtype_t type, ptrdiff_t *lb_p, size_t *extent_p)
{
    return bounds("type_true_extent", type, 1, lb_p, extent_p);
}

/* tutti_pack and tutti_unpack: a predefined dtype as a view too */
static int pack_view(const char *fn, tutti_dtype_t type, size_t count, size_t room, size_t pos,
                     view_t *v, tt_derived_t *tmp, size_t *bytes_p)
{
    TT_CHECK(view_of(type, v, fn));
    size_t bytes;
    if (__builtin_mul_overflow(count, v->size, &bytes) || pos > room || bytes > room - pos) {
        release_view(v);
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                   "%s: %zu x %s at position %zu needs %zu bytes more than the "
                                   "%zu the buffer has",
                                   fn, count, tutti_dtype_name(type), pos,
                                   pos > room ? 0 : bytes - (room - pos), room);
    }
    *tmp = (tt_derived_t){
        .size = v->size, .extent = v->extent, .nblk = v->nblk, .blk = (tt_blk_t *)v->blk
    };
    *bytes_p = bytes;
    return TUTTI_OK;
}

/* tutti_pack (unpack 0) and tutti_unpack (1): count elements of type at user, their
 * packed bytes at packed + *position_p, room bytes there */
static int pack_io(const char *fn, int unpack, void *user, size_t count, tutti_dtype_t type,
                   void *packed, size_t room, size_t *position_p)
{
    if (!position_p || (count && (!user || !packed)))
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "%s: a NULL buffer or position_p", fn);
    view_t v;
    tt_derived_t t;
    size_t bytes = 0;
    TT_CHECK(pack_view(fn, type, count, room, *position_p, &v, &t, &bytes));
    char *at = (char *)packed + *position_p;
    if (unpack)
        tt_derived_unpack(&t, at, bytes, user, count);
    else
        tt_derived_pack(&t, user, count, at);
    *position_p += bytes;
    release_view(&v);
    return TUTTI_OK;
}

TT_EXPORT int tutti_pack(const void *inbuf, size_t incount, tutti_dtype_t type, void *outbuf,
                         size_t outsize, size_t *position_p)
{
    return pack_io("pack", 0, (void *)inbuf, incount, type, outbuf, outsize, position_p);
}

TT_EXPORT int tutti_unpack(const void *inbuf, size_t insize, size_t *position_p, void *outbuf,
                           size_t outcount, tutti_dtype_t type)
{
    return pack_io("unpack", 1, outbuf, outcount, type, (void *)inbuf, insize, position_p);
}
