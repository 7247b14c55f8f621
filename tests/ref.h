/* Reference values for the multi-rank correctness tests: deterministic inputs per
 * (rank, index), the expected results computed in plain C, independent of the library's
 * kernels (its own fp16/bf16 conversions included). */
#ifndef TH_REF_H
#define TH_REF_H

#include <stddef.h>
#include <stdint.h>

#include <tutti/tutti.h>

#define GUARD_BYTES 64
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define GUARD_BYTE 0xA5
#define GARBAGE_BYTE 0x5A

extern const tutti_dtype_t all_dtypes[8];
extern const tutti_dtype_t more_dtypes[4];
extern const tutti_redop_t all_ops[5];
/* BAND, BOR, BXOR, LAND, LOR, LXOR: integer dtypes only (tutti_redop_supported) */
extern const tutti_redop_t bit_ops[6];
/* every op an integer dtype takes: all_ops, then bit_ops */
extern const tutti_redop_t int_ops[11];

float ref_half_to_float(uint16_t h);
uint16_t ref_float_to_half(float f);
float ref_bf16_to_float(uint16_t b);
uint16_t ref_float_to_bf16(float f);
int is_float(tutti_dtype_t dt);
int is_unsigned(tutti_dtype_t dt);
uint64_t mix64(uint64_t x);
uint64_t gen_bits(uint64_t seed, int rank, size_t i);
double gen_float(tutti_redop_t op, uint64_t bits);
uint64_t gen_int(tutti_redop_t op, uint64_t bits);
void put_elem(void *buf, tutti_dtype_t dt, size_t i, uint64_t u, double d);
void gen_elem(void *out, tutti_dtype_t dt, tutti_redop_t op, int rank, size_t i, uint64_t seed);
void fill_input(void *buf, tutti_dtype_t dt, tutti_redop_t op, int rank, size_t count,
                uint64_t seed);
int64_t int_value(tutti_dtype_t dt, uint64_t u);
void expected_elem(void *out, tutti_dtype_t dt, tutti_redop_t op, int nranks, size_t i,
                   uint64_t seed);
double elem_as_double(const void *p, tutti_dtype_t dt);
uint64_t elem_bits(const void *p, size_t es);

#endif /* TH_REF_H */
