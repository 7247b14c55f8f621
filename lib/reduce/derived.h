/* Derived datatypes (MPI's MPI_Type_vector ...): a type's map flattened to the runs of
 * bytes one element covers, in the map's order, and the packing of elements into a
 * contiguous stream of those bytes and back. Calls that take a derived type run on its
 * packed form (lib/coll/packed.c); nothing below the public entry points sees one. */
#ifndef TT_DERIVED_H
#define TT_DERIVED_H

#include <stdatomic.h>
#include <stddef.h>

#include <tutti/tutti.h>

/* One run of an element's bytes: at off from the element's address, len bytes. */
typedef struct tt_blk {
    ptrdiff_t off;
    size_t len;
} tt_blk_t;

/* A defined type; immutable once made, freed when the last holder lets go (the table
 * holds it from create to tutti_type_free, each call that uses it from issue to end). */
typedef struct tt_derived {
    size_t size;       /* packed bytes of one element (MPI_Type_size) */
    ptrdiff_t lb;      /* MPI_Type_get_extent: lower bound and extent (>= 0) */
    size_t extent;     /* element i sits at buf + i * extent */
    ptrdiff_t true_lb; /* the bytes an element touches: [true_lb, true_lb + true_extent) */
    size_t true_extent;
    tutti_dtype_t base; /* the one predefined dtype all its bytes are, or TUTTI_DTYPE_COUNT
                             (mixed: it moves as bytes and reduces with nothing); a type of
                             no bytes counts as TUTTI_UINT8 */
    size_t nbase;       /* elements of base per element (size / its size) */
    size_t align;       /* the largest alignment of its parts (struct's padding) */
    int marked;         /* its bounds were set (resized, subarray, or made of such parts):
                             no struct padding over them (MPI's sticky markers) */
    size_t nblk;
    tt_blk_t *blk; /* merged where one run ends where the next begins */
    _Atomic int refs;
    char name[48];
} tt_derived_t;

/* Whether dtype lies in the defined types' range (defined now or not). */
static inline int tt_dtype_in_user_range(tutti_dtype_t dtype)
{
    return (unsigned)dtype >= TUTTI_DTYPE_USER_FIRST && (unsigned)dtype <= TUTTI_DTYPE_USER_LAST;
}

/* What "invalid dtype N" adds for a value of the defined types' range */
static inline const char *tt_dtype_invalid_hint(tutti_dtype_t dtype)
{
    return tt_dtype_in_user_range(dtype) ? " (not a defined type now: freed, or never made)" : "";
}

/* The type of value dtype, held (release with tt_derived_release), or NULL: not a
 * defined type (freed, never made, a predefined one). */
tt_derived_t *tt_derived_hold(tutti_dtype_t dtype);
void tt_derived_release(tt_derived_t *t);
/* Another hold on a type already held (a persistent request's, for its rounds). */
static inline tt_derived_t *tt_derived_ref(tt_derived_t *t)
{
    atomic_fetch_add(&t->refs, 1);
    return t;
}

/* Size (packed bytes) of a defined type, 0 where it is none; its name ("type 257
 * (vector of f64)"), NULL where it is none (the text of a freed one stays readable). */
size_t tt_derived_size(tutti_dtype_t dtype);
const char *tt_derived_name(tutti_dtype_t dtype);

/* count elements of t at in (element i at in + i * extent) into out, packed (count *
 * t->size bytes). */
void tt_derived_pack(const tt_derived_t *t, const void *in, size_t count, void *out);

/* The first nbytes of a packed stream (at most count elements' worth) into count
 * elements of t at out; only the bytes of t's map are written. */
void tt_derived_unpack(const tt_derived_t *t, const void *in, size_t nbytes, void *out,
                       size_t count);

#endif /* TT_DERIVED_H */
