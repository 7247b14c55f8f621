/* Reduction kernels and datatype conversions. */
#ifndef TT_REDUCE_H
#define TT_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include <tutti/tutti.h>

/* A predefined dtype's size and name (0, "?" for any other value; dtype.c), under
 * tutti_dtype_size and tutti_dtype_name, which know derived types too (derived.c). */
size_t tt_dtype_basic_size(tutti_dtype_t dtype);
const char *tt_dtype_basic_name(tutti_dtype_t dtype);

/* dst[i] = dst[i] op src[i] for i < count. AVG reduces as SUM (the caller divides at
 * the end with tt_reduce_avg_finish). fp16/bf16/fp8 are computed in fp32 and rounded back
 * (round to nearest even; fp8 saturates). Integer SUM/PROD wrap around (two's complement); MIN/MAX
 * of floats: NaN in either input gives NaN. Buffers may be unaligned; dst and src must
 * not overlap unless equal. */
void tt_reduce(void *dst, const void *src, size_t count, tutti_dtype_t dtype, tutti_redop_t op);

/* dst[i] = a[i] op b[i]; dst may equal a or b. A defined op's function is called with
 * (dst, a, b); tt_reduce's with (dst, dst, src). */
void tt_reduce3(void *dst, const void *a, const void *b, size_t count, tutti_dtype_t dtype,
                tutti_redop_t op);

/* 1 if dtype x op has a kernel (every op for the integer dtypes; the bitwise ops for no
 * float dtype), 0 if not or either is out of range: tutti_redop_supported. */
int tt_reduce_supported(tutti_dtype_t dtype, tutti_redop_t op);

/* The complex dtypes, and the real dtype of their parts (fp32 for c64, fp64 for c128). */
static inline int tt_dtype_is_complex(tutti_dtype_t dtype)
{
    return dtype == TUTTI_COMPLEX64 || dtype == TUTTI_COMPLEX128;
}

static inline tutti_dtype_t tt_complex_part(tutti_dtype_t dtype)
{
    return dtype == TUTTI_COMPLEX64 ? TUTTI_FP32 : TUTTI_FP64;
}

/* The value-index pairs as C lays them out (MPI's MPI_FLOAT_INT ...): sizes and offsets
 * come from these, so that a host whose alignment differs (i386's 4-byte double) has its
 * own C's layout. */
typedef struct {
    float v;
    int32_t i;
} tt_pair_float_int_t;
typedef struct {
    double v;
    int32_t i;
} tt_pair_double_int_t;
typedef struct {
    int64_t v;
    int32_t i;
} tt_pair_long_int_t;
typedef struct {
    int32_t v, i;
} tt_pair_2int_t;
typedef struct {
    int16_t v;
    int32_t i;
} tt_pair_short_int_t;

/* The value-index pair dtypes (MPI's MPI_FLOAT_INT ...), which MINLOC and MAXLOC reduce. */
static inline int tt_dtype_is_pair(tutti_dtype_t dtype)
{
    return dtype >= TUTTI_FLOAT_INT && dtype <= TUTTI_SHORT_INT;
}

/* Why built-in op does not reduce dtype, where tutti_redop_supported says so (dtype.c):
 * "op band reduces integer dtypes only, not f32", "op max does not reduce complex
 * numbers (c64): sum, prod and avg do". */
void tt_redop_unsupported(char *buf, size_t len, tutti_redop_t op, tutti_dtype_t dtype);

/* An op the caller defined (userop.c). */
typedef struct tt_userop {
    tutti_redop_fn fn;
    void *ctx;
    unsigned flags; /* TUTTI_REDOP_COMMUTATIVE */
    char name[32];
} tt_userop_t;

/* The defined op of value op, or NULL (a built-in op, or a value neither defined now
 * nor held by a call in flight). */
const tt_userop_t *tt_userop(tutti_redop_t op);

/* A call's hold on its op from issue to completion (a defined op stays callable for
 * it after tutti_redop_free, and its value is not made again while held): 1 held, 0 a
 * built-in op (nothing to hold), -1 not defined now. Release once per hold of 1. */
int tt_userop_hold(tutti_redop_t op);
void tt_userop_release(tutti_redop_t op);

/* A value in the user range: the op's name, or "user<value>" when it is not defined
 * now; NULL outside that range. */
const char *tt_userop_name(tutti_redop_t op);

/* 1 for a built-in op or one defined now, else 0; for an invalid op, what a message
 * adds after its value ("" or why a defined op's value is not one now). */
int tt_redop_valid(tutti_redop_t op);
const char *tt_redop_invalid_hint(tutti_redop_t op);

/* 0 for a defined op made without TUTTI_REDOP_COMMUTATIVE (its operands must stay in
 * rank order: lib/coll/coll.c marks the call's fingerprint TT_FP_ORDERED, and
 * lib/core/exec.c then runs an algorithm that keeps it), else 1. */
int tt_redop_commutes(tutti_redop_t op);

/* buf[i] /= nranks (after an AVG computed as SUM). */
void tt_reduce_avg_finish(void *buf, size_t count, tutti_dtype_t dtype, int nranks);
/* 1 for the dtypes whose AVG scales its inputs first (fp16 and the fp8 dtypes: their
 * range is small). */
int tt_dtype_avg_prescaled(tutti_dtype_t dtype);

/* Such a dtype: buf[i] = buf[i] * mul / div, computed in fp32 and rounded once (another
 * dtype: nothing). Its AVG scales each input by 2^-k (2^k >= the rank count: exact where
 * the scaled value stays above the dtype's normal minimum, 2^-14, 2^-6, 2^-14; below it
 * bits are lost, down to 0) before the sum and the sum by 2^k / nranks after it, so that
 * a sum past the largest value (65504, 448, 57344) whose mean fits does not overflow;
 * where neither happens the result is the plain division's (lib/core/exec.c). */
void tt_reduce_scale(void *buf, size_t count, tutti_dtype_t dtype, float mul, float div);

/* The kernel set in use: "generic", "avx2" or "avx512" (TUTTI_REDUCE_ISA caps it). */
const char *tt_reduce_isa_name(void);

/* fp8 (dtype TUTTI_FP8_E4M3 or E5M2, another: as E5M2) <-> float: exact one way; the
 * other rounds to nearest even, saturating to the largest finite value (see tutti.h). */
float tt_fp8_to_float(uint8_t v, tutti_dtype_t dtype);
uint8_t tt_float_to_fp8(float f, tutti_dtype_t dtype);

/* IEEE binary16 and bfloat16 conversions (round to nearest even; NaN stays NaN). */
float tt_half_to_float(uint16_t h);
uint16_t tt_float_to_half(float f);
float tt_bf16_to_float(uint16_t b);
uint16_t tt_float_to_bf16(float f);

#endif /* TT_REDUCE_H */
