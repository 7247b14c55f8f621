/* Reference fp8 (OCP E4M3 "fn" and E5M2) conversions for the tests, written from the
 * formats' definitions (ldexp and a search over the codes), independent of the library's
 * bit manipulations (tests/ref.c). */
#ifndef TH_REF_FP8_H
#define TH_REF_FP8_H

#include <stdint.h>

#include <tutti/tutti.h>

/* The value of code v of dtype (TUTTI_FP8_E4M3 or TUTTI_FP8_E5M2): exact; NaN codes NaN. */
double ref_fp8_to_d(tutti_dtype_t dtype, uint8_t v);

/* x rounded to dtype: the nearest finite code, on a tie the even one; past the largest
 * finite value (an infinity too) that value, as NCCL's fp8 reductions saturate; NaN a
 * NaN code. */
uint8_t ref_d_to_fp8(tutti_dtype_t dtype, double x);

#endif /* TH_REF_FP8_H */
