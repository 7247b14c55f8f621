/* Reduction kernels and datatype conversions. */
#ifndef TT_REDUCE_H
#define TT_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include <tutti/tutti.h>

/* dst[i] = dst[i] op src[i] for i < count. AVG reduces as SUM (the caller divides at
 * the end with tt_reduce_avg_finish). fp16/bf16 are computed in fp32 and rounded back
 * (round to nearest even). Integer SUM/PROD wrap around (two's complement); MIN/MAX
 * of floats: NaN in either input gives NaN. Buffers may be unaligned; dst and src must
 * not overlap unless equal. */
void tt_reduce(void *dst, const void *src, size_t count, tutti_dtype_t dtype, tutti_redop_t op);

/* dst[i] = a[i] op b[i]; dst may equal a or b. */
void tt_reduce3(void *dst, const void *a, const void *b, size_t count, tutti_dtype_t dtype,
                tutti_redop_t op);

/* 1 if dtype x op has a kernel (every op for the integer dtypes; the bitwise ops for no
 * float dtype), 0 if not or either is out of range: tutti_redop_supported. */
int tt_reduce_supported(tutti_dtype_t dtype, tutti_redop_t op);

/* buf[i] /= nranks (after an AVG computed as SUM). */
void tt_reduce_avg_finish(void *buf, size_t count, tutti_dtype_t dtype, int nranks);

/* The kernel set in use: "generic", "avx2" or "avx512" (TUTTI_REDUCE_ISA caps it). */
const char *tt_reduce_isa_name(void);

/* IEEE binary16 and bfloat16 conversions (round to nearest even; NaN stays NaN). */
float tt_half_to_float(uint16_t h);
uint16_t tt_float_to_half(float f);
float tt_bf16_to_float(uint16_t b);
uint16_t tt_float_to_bf16(float f);

#endif /* TT_REDUCE_H */
