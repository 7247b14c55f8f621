/* Reduction kernels: dst = dst op src over every dtype x op, the inner loop of every
 * reducing collective.
 * Design notes: docs/internals.md, "The reduction kernels". */
#include <pthread.h>
#include <string.h>

#include "base/base.h"
#include "reduce/reduce.h"

/* GCC will not if-convert (so not vectorise) the fp16 conversions while it must keep FP
 * exception flags exact. Nothing here reads those flags or unmasks FP traps, and
 * -fno-trapping-math changes no result (no reassociation, no signed-zero games). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#if defined(__x86_64__) || defined(__i386__)
#define TT_REDUCE_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define TT_REDUCE_X86 0
#endif

/* Declared here until reduce.h carries it: the name of the kernel set in use. */
const char *tt_reduce_isa_name(void);

/* Element types for possibly unaligned buffers. */
typedef int8_t tt_ui8_t;
typedef uint8_t tt_uu8_t;
typedef int16_t tt_ui16_t __attribute__((aligned(1), may_alias));
typedef int32_t tt_ui32_t __attribute__((aligned(1), may_alias));
typedef uint32_t tt_uu32_t __attribute__((aligned(1), may_alias));
typedef int64_t tt_ui64_t __attribute__((aligned(1), may_alias));
typedef uint64_t tt_uu64_t __attribute__((aligned(1), may_alias));
typedef uint16_t tt_uu16_t __attribute__((aligned(1), may_alias));
typedef float tt_uf32_t __attribute__((aligned(1), may_alias));
typedef double tt_uf64_t __attribute__((aligned(1), may_alias));

#define TT_INLINE static inline __attribute__((always_inline))

/* ---- fp16 / bf16 scalar conversions (portable, bit-exact with F16C) ---------------- */

TT_INLINE uint32_t tt_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

TT_INLINE float tt_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Both conversions compute every case and select, without branches, so that loops over
 * them vectorise on any target (the F16C kernels use hardware conversions instead). */
TT_INLINE float tt_h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    /* inf, or NaN made quiet with its payload kept */
    uint32_t special = 0x7f800000u | (em & 0x3ffu) << 13 | (em > 0x7c00u ? 0x400000u : 0);
    /* normal: rebias the exponent from 15 to 127 */
    uint32_t normal = (em << 13) + ((127u - 15u) << 23);
    /* zero or subnormal: em * 2^-24, exact in fp32 */
    uint32_t subnormal = tt_f32_bits((float)(int32_t)em * 0x1p-24f);
    uint32_t u = subnormal;
    u = em >= 0x400u ? normal : u;
    u = em >= 0x7c00u ? special : u;
    return tt_f32_from_bits(sign | u);
}

/* Round to nearest even. The subnormal case lets the FPU round: |f| + 0.5 has its last
 * mantissa bit worth 2^-24, one fp16 subnormal step (Giesen's float_to_half_fast3_rtne);
 * this assumes the default rounding mode, which the fp32 arithmetic of the kernels
 * assumes anyway, and works under FTZ/DAZ too. */
TT_INLINE uint16_t tt_f2h(float f)
{
    uint32_t u = tt_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    /* NaN: quiet, top payload bits kept */
    uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    /* >= 2^-14: normal half; the carry of the rounding may bump the exponent */
    uint32_t normal = (a - ((127u - 15u) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    uint32_t subnormal = tt_f32_bits(tt_f32_from_bits(a) + 0.5f) - 0x3f000000u;
    uint32_t h = subnormal;
    h = a >= 0x38800000u ? normal : h;
    h = a >= 0x477ff000u ? 0x7c00u : h; /* >= 65520 rounds to inf (so does inf) */
    h = a > 0x7f800000u ? nan : h;
    return (uint16_t)(h | sign);
}

TT_INLINE float tt_bf2f(uint16_t b)
{
    return tt_f32_from_bits((uint32_t)b << 16);
}

TT_INLINE uint16_t tt_f2bf(float f)
{
    uint32_t u = tt_f32_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* ---- fp8 (OCP E4M3 "fn", E5M2) scalar conversions --------------------------------- */

/* E4M3: bias 7, three mantissa bits, no infinity, S.1111.111 NaN. Exact. */
TT_INLINE float tt_e4m3_2f(uint8_t v)
{
    uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    uint32_t em = v & 0x7fu;
    uint32_t normal = (em << 20) + ((127u - 7u) << 23);
    uint32_t subnormal = tt_f32_bits((float)(int32_t)em * 0x1p-9f); /* em * 2^-9 */
    uint32_t u = em >= 0x08u ? normal : subnormal;
    u = em == 0x7fu ? 0x7fc00000u : u;
    return tt_f32_from_bits(sign | u);
}

/* E5M2 is the upper byte of an fp16. Exact. */
TT_INLINE float tt_e5m2_2f(uint8_t v)
{
    return tt_h2f((uint16_t)(v << 8));
}

/* Round to nearest even and saturate as CUDA's __NV_SATFINITE conversions (NCCL's fp8
 * reductions store through them): beyond the largest finite value (infinity included)
 * gives it, NaN gives NaN. E4M3 (e5 0: bias 7, three mantissa bits) or E5M2 (e5 1: bias
 * 15, two); e5 is a constant where it is inlined. The subnormal case lets the FPU round,
 * as tt_f2h does: |f| + 2^14 (E4M3) or 2^7 (E5M2) has its last mantissa bit worth one
 * subnormal step (2^-9, 2^-16). Saturation starts past 464 for E4M3 (448 and half a
 * step; 464 itself ties to 448) and at 61440 for E5M2 (a tie that goes to infinity). */
TT_INLINE uint8_t tt_f2f8(float f, int e5)
{
    const uint32_t shift = e5 ? 21u : 20u, bias = e5 ? 15u : 7u;
    uint32_t u = tt_f32_bits(f);
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t a = u & 0x7fffffffu;
    uint32_t normal = (a - ((127u - bias) << 23) + ((1u << (shift - 1)) - 1u) +
                       ((a >> shift) & 1u)) >>
                      shift;
    uint32_t subnormal = e5 ? tt_f32_bits(tt_f32_from_bits(a) + 0x1p7f) - 0x43000000u
                            : tt_f32_bits(tt_f32_from_bits(a) + 0x1p14f) - 0x46800000u;
    uint32_t r = a >= (e5 ? 0x38800000u : 0x3c800000u) ? normal : subnormal; /* least normal */
    r = a >= (e5 ? 0x47700000u : 0x43e80001u) ? (e5 ? 0x7bu : 0x7eu) : r;
    r = a > 0x7f800000u ? (e5 ? 0x7eu : 0x7fu) : r; /* NaN (quiet) */
    return (uint8_t)(r | sign);
}

TT_INLINE uint8_t tt_f2e4m3(float f)
{
    return tt_f2f8(f, 0);
}

TT_INLINE uint8_t tt_f2e5m2(float f)
{
    return tt_f2f8(f, 1);
}

float tt_fp8_to_float(uint8_t v, tutti_dtype_t dtype)
{
    return dtype == TUTTI_FP8_E4M3 ? tt_e4m3_2f(v) : tt_e5m2_2f(v);
}

uint8_t tt_float_to_fp8(float f, tutti_dtype_t dtype)
{
    return dtype == TUTTI_FP8_E4M3 ? tt_f2e4m3(f) : tt_f2e5m2(f);
}

float tt_half_to_float(uint16_t h)
{
    return tt_h2f(h);
}

uint16_t tt_float_to_half(float f)
{
    return tt_f2h(f);
}

float tt_bf16_to_float(uint16_t b)
{
    return tt_bf2f(b);
}

uint16_t tt_float_to_bf16(float f)
{
    return tt_f2bf(f);
}

/* ---- element ops ------------------------------------------------------------------- */

#define TT_OP_SUM(x, y) ((x) + (y))
#define TT_OP_PROD(x, y) ((x) * (y))
#define TT_OP_MIN(x, y) ((x) < (y) ? (x) : (y))
#define TT_OP_MAX(x, y) ((x) > (y) ? (x) : (y))
/* NaN in x: x; NaN in y only: the comparison fails and gives y; equal: y. */
#define TT_OP_FMIN(x, y) (((x) < (y) || (x) != (x)) ? (x) : (y))
#define TT_OP_FMAX(x, y) (((x) > (y) || (x) != (x)) ? (x) : (y))
/* integer types only (on the unsigned type of the width) */
#define TT_OP_BAND(x, y) ((x) & (y))
#define TT_OP_BOR(x, y) ((x) | (y))
#define TT_OP_BXOR(x, y) ((x) ^ (y))
/* MPI's logical ops: 1 or 0 (of the dtype) by whether each operand is nonzero */
#define TT_OP_LAND(x, y) ((x) != 0 && (y) != 0)
#define TT_OP_LOR(x, y) ((x) != 0 || (y) != 0)
#define TT_OP_LXOR(x, y) (((x) != 0) != ((y) != 0))

#define TT_LD_ID(v) (v)
#define TT_ST_ID(v) (v)
#define TT_LD_H(v) tt_h2f(v)
#define TT_ST_H(v) tt_f2h(v)
#define TT_LD_BF(v) tt_bf2f(v)
#define TT_ST_BF(v) tt_f2bf(v)
#define TT_LD_E4M3(v) tt_e4m3_2f(v)
#define TT_ST_E4M3(v) tt_f2e4m3(v)
#define TT_LD_E5M2(v) tt_e5m2_2f(v)
#define TT_ST_E5M2(v) tt_f2e5m2(v)

/* fp8 MIN/MAX on the stored bytes: compared as floats (TT_OP_FMIN/FMAX's rule), the
 * operand itself returned (no saturation of an E5M2 infinity). */
TT_INLINE uint8_t tt_f8_min(uint8_t x, uint8_t y, float fx, float fy)
{
    return (fx < fy || fx != fx) ? x : y;
}

TT_INLINE uint8_t tt_f8_max(uint8_t x, uint8_t y, float fx, float fy)
{
    return (fx > fy || fx != fx) ? x : y;
}

#define TT_OP_E4M3_MIN(x, y) tt_f8_min(x, y, tt_e4m3_2f(x), tt_e4m3_2f(y))
#define TT_OP_E4M3_MAX(x, y) tt_f8_max(x, y, tt_e4m3_2f(x), tt_e4m3_2f(y))
#define TT_OP_E5M2_MIN(x, y) tt_f8_min(x, y, tt_e5m2_2f(x), tt_e5m2_2f(y))
#define TT_OP_E5M2_MAX(x, y) tt_f8_max(x, y, tt_e5m2_2f(x), tt_e5m2_2f(y))

/* Elements per inner block: a multiple of every vector width, with a known trip count
 * so that GCC vectorises it at -O2 (the "very cheap" cost model refuses loops that need
 * a scalar epilogue). */
#define TT_BLK 64

typedef void (*tt_k2_fn)(void *dst, const void *src, size_t n);
typedef void (*tt_k3_fn)(void *dst, const void *a, const void *b, size_t n);

/* d[i] = a[i] OP b[i] for i < n, in blocks of TT_BLK the compiler vectorises, then the
 * tail. CT is the type computed in. */
#define TT_KLOOP(d, a, b, CT, LD, STO, OP)                                                         \
    size_t i = 0;                                                                                  \
    for (; i + TT_BLK <= n; i += TT_BLK)                                                           \
        for (size_t k = 0, j = i; k < TT_BLK; k++, j++) {                                          \
            CT x = LD(a[j]), y = LD(b[j]);                                                         \
            d[j] = STO(OP(x, y));                                                                  \
        }                                                                                          \
    for (; i < n; i++) {                                                                           \
        CT x = LD(a[i]), y = LD(b[i]);                                                             \
        d[i] = STO(OP(x, y));                                                                      \
    }

/* One dtype x op, three shapes: k2 dst = dst op src, k2r dst = src op dst (tt_reduce3
 * with dst == b), k3 dst = a op b (a may equal b: both are only read). ST is the stored
 * element type, CT the type computed in. */
/* k2 (X = d, Y = s) or k2r (X = s, Y = d) for one dtype and op. */
#define TT_DEF_K2(k, isa, attr, nm, ST, CT, LD, STO, OP, X, Y)                                     \
    attr static void tt_##k##_##nm##_##isa(void *restrict dv, const void *restrict sv, size_t n)   \
    {                                                                                              \
        ST *restrict d = dv;                                                                       \
        const ST *restrict s = sv;                                                                 \
        TT_KLOOP(d, X, Y, CT, LD, STO, OP)                                                         \
    }

#define TT_DEF_KERNELS(isa, attr, nm, ST, CT, LD, STO, OP)                                         \
    TT_DEF_K2(k2, isa, attr, nm, ST, CT, LD, STO, OP, d, s)                                        \
    TT_DEF_K2(k2r, isa, attr, nm, ST, CT, LD, STO, OP, s, d)                                       \
    attr static void tt_k3_##nm##_##isa(void *restrict dv, const void *restrict av,                \
                                        const void *restrict bv, size_t n)                         \
    {                                                                                              \
        ST *restrict d = dv;                                                                       \
        const ST *restrict a = av;                                                                 \
        const ST *restrict b = bv;                                                                 \
        TT_KLOOP(d, a, b, CT, LD, STO, OP)                                                         \
    }

/* Every dtype x op for one ISA level. Sums and products of signed integers run on the
 * unsigned type of the same width (same bits, defined wraparound). */
#define TT_DEF_OPS(isa, attr, dt, SST, SCT, UST, UCT, LD, STO, OPMIN, OPMAX)                       \
    TT_DEF_KERNELS(isa, attr, dt##_sum, UST, UCT, LD, STO, TT_OP_SUM)                              \
    TT_DEF_KERNELS(isa, attr, dt##_prod, UST, UCT, LD, STO, TT_OP_PROD)                            \
    TT_DEF_KERNELS(isa, attr, dt##_min, SST, SCT, LD, STO, OPMIN)                                  \
    TT_DEF_KERNELS(isa, attr, dt##_max, SST, SCT, LD, STO, OPMAX)

/* The bitwise ops of one integer dtype, on its unsigned type. */
#define TT_DEF_BITS(isa, attr, dt, UST, UCT)                                                       \
    TT_DEF_KERNELS(isa, attr, dt##_band, UST, UCT, TT_LD_ID, TT_ST_ID, TT_OP_BAND)                 \
    TT_DEF_KERNELS(isa, attr, dt##_bor, UST, UCT, TT_LD_ID, TT_ST_ID, TT_OP_BOR)                   \
    TT_DEF_KERNELS(isa, attr, dt##_bxor, UST, UCT, TT_LD_ID, TT_ST_ID, TT_OP_BXOR)                 \
    TT_DEF_KERNELS(isa, attr, dt##_land, UST, UCT, TT_LD_ID, TT_ST_ID, TT_OP_LAND)                 \
    TT_DEF_KERNELS(isa, attr, dt##_lor, UST, UCT, TT_LD_ID, TT_ST_ID, TT_OP_LOR)                   \
    TT_DEF_KERNELS(isa, attr, dt##_lxor, UST, UCT, TT_LD_ID, TT_ST_ID, TT_OP_LXOR)

/* Every op of one integer dtype: arithmetic (signed compare for MIN/MAX), then bits. */
#define TT_DEF_INT(isa, attr, dt, SST, SCT, UST, UCT)                                              \
    TT_DEF_OPS(isa, attr, dt, SST, SCT, UST, UCT, TT_LD_ID, TT_ST_ID, TT_OP_MIN, TT_OP_MAX)        \
    TT_DEF_BITS(isa, attr, dt, UST, UCT)

/* An fp8 dtype: SUM and PROD from a table of every pair's result (64 KiB per dtype and
 * op, made once at first use from the fp32 arithmetic and tt_f2e4m3/tt_f2e5m2: one load
 * an element, 1.4-1.6 GB/s in bench/reduce-bench here where the conversions' arithmetic,
 * vectorised by GCC or not, gave 0.3-0.6), MIN and MAX on the bytes (TT_OP_E4M3_MIN ...). */
static uint8_t tt_f8_tab[2][2][65536]; /* [E5M2][PROD][a << 8 | b] = a op b */
static pthread_once_t tt_f8_once = PTHREAD_ONCE_INIT;

static void tt_f8_build(void)
{
    for (unsigned a = 0; a < 256; a++)
        for (unsigned b = 0; b < 256; b++) {
            float x4 = tt_e4m3_2f((uint8_t)a), y4 = tt_e4m3_2f((uint8_t)b);
            float x5 = tt_e5m2_2f((uint8_t)a), y5 = tt_e5m2_2f((uint8_t)b);
            tt_f8_tab[0][0][a << 8 | b] = tt_f2e4m3(x4 + y4);
            tt_f8_tab[0][1][a << 8 | b] = tt_f2e4m3(x4 * y4);
            tt_f8_tab[1][0][a << 8 | b] = tt_f2e5m2(x5 + y5);
            tt_f8_tab[1][1][a << 8 | b] = tt_f2e5m2(x5 * y5);
        }
}

static const uint8_t *tt_f8_table(int e5m2, int prod)
{
    pthread_once(&tt_f8_once, tt_f8_build);
    return tt_f8_tab[e5m2][prod];
}

/* d[i] = a[i] op b[i] by table t; d may be a or b (each element read before written). */
static void tt_f8_k3(uint8_t *d, const uint8_t *a, const uint8_t *b, size_t n, const uint8_t *t)
{
    for (size_t i = 0; i < n; i++)
        d[i] = t[(unsigned)a[i] << 8 | b[i]];
}

/* k2, k2r and k3 of one fp8 dtype's SUM or PROD (the same for every ISA) */
#define TT_DEF_F8_TAB(isa, dt, e5m2, nm, prod)                                                     \
    static void tt_k2_##dt##_##nm##_##isa(void *dv, const void *sv, size_t n)                      \
    {                                                                                              \
        tt_f8_k3(dv, dv, sv, n, tt_f8_table(e5m2, prod));                                          \
    }                                                                                              \
    static void tt_k2r_##dt##_##nm##_##isa(void *dv, const void *sv, size_t n)                     \
    {                                                                                              \
        tt_f8_k3(dv, sv, dv, n, tt_f8_table(e5m2, prod));                                          \
    }                                                                                              \
    static void tt_k3_##dt##_##nm##_##isa(void *dv, const void *av, const void *bv, size_t n)      \
    {                                                                                              \
        tt_f8_k3(dv, av, bv, n, tt_f8_table(e5m2, prod));                                          \
    }

#define TT_DEF_F8(isa, attr, dt, e5m2, OPMIN, OPMAX)                                               \
    TT_DEF_F8_TAB(isa, dt, e5m2, sum, 0)                                                           \
    TT_DEF_F8_TAB(isa, dt, e5m2, prod, 1)                                                          \
    TT_DEF_KERNELS(isa, attr, dt##_min, tt_uu8_t, uint8_t, TT_LD_ID, TT_ST_ID, OPMIN)              \
    TT_DEF_KERNELS(isa, attr, dt##_max, tt_uu8_t, uint8_t, TT_LD_ID, TT_ST_ID, OPMAX)

/* 16-bit integers compute in uint32_t: a uint16_t product would be promoted to int,
 * and 65535 * 65535 overflows it; the store keeps the low 16 bits (the same wrap). */
#define TT_DEF_INT16(isa, attr)                                                                    \
    TT_DEF_INT(isa, attr, i16, tt_ui16_t, int16_t, tt_uu16_t, uint32_t)                            \
    TT_DEF_INT(isa, attr, u16, tt_uu16_t, uint16_t, tt_uu16_t, uint32_t)

#define TT_DEF_ISA(isa, attr, HALF_OPS)                                                            \
    TT_DEF_INT(isa, attr, i8, tt_ui8_t, int8_t, tt_uu8_t, uint8_t)                                 \
    TT_DEF_INT(isa, attr, u8, tt_uu8_t, uint8_t, tt_uu8_t, uint8_t)                                \
    TT_DEF_INT(isa, attr, i32, tt_ui32_t, int32_t, tt_uu32_t, uint32_t)                            \
    TT_DEF_INT(isa, attr, i64, tt_ui64_t, int64_t, tt_uu64_t, uint64_t)                            \
    TT_DEF_INT16(isa, attr)                                                                        \
    TT_DEF_INT(isa, attr, u32, tt_uu32_t, uint32_t, tt_uu32_t, uint32_t)                           \
    TT_DEF_INT(isa, attr, u64, tt_uu64_t, uint64_t, tt_uu64_t, uint64_t)                           \
    HALF_OPS(isa, attr)                                                                            \
    TT_DEF_F8(isa, attr, e4m3, 0, TT_OP_E4M3_MIN, TT_OP_E4M3_MAX)                                  \
    TT_DEF_F8(isa, attr, e5m2, 1, TT_OP_E5M2_MIN, TT_OP_E5M2_MAX)                                  \
    TT_DEF_OPS(isa, attr, f32, tt_uf32_t, float, tt_uf32_t, float, TT_LD_ID, TT_ST_ID, TT_OP_FMIN, \
               TT_OP_FMAX)                                                                         \
    TT_DEF_OPS(isa, attr, f64, tt_uf64_t, double, tt_uf64_t, double, TT_LD_ID, TT_ST_ID,           \
               TT_OP_FMIN, TT_OP_FMAX)

/* fp16 and bf16 through the portable conversions. */
#define TT_HALF_PORTABLE(isa, attr)                                                                \
    TT_DEF_OPS(isa, attr, f16, tt_uu16_t, float, tt_uu16_t, float, TT_LD_H, TT_ST_H, TT_OP_FMIN,   \
               TT_OP_FMAX)                                                                         \
    TT_DEF_OPS(isa, attr, bf16, tt_uu16_t, float, tt_uu16_t, float, TT_LD_BF, TT_ST_BF,            \
               TT_OP_FMIN, TT_OP_FMAX)

/* A dtype's kernels by op (AVG's column stays empty: it runs as SUM; a float dtype's
 * bitwise columns too: tutti_redop_supported refuses them before a kernel is needed). */
#define TT_ROW(k, isa, dt)                                                                         \
    [TUTTI_SUM] = k##_##dt##_sum_##isa, [TUTTI_PROD] = k##_##dt##_prod_##isa,                      \
    [TUTTI_MIN] = k##_##dt##_min_##isa, [TUTTI_MAX] = k##_##dt##_max_##isa
#define TT_ROW_INT(k, isa, dt)                                                                     \
    TT_ROW(k, isa, dt), [TUTTI_BAND] = k##_##dt##_band_##isa, [TUTTI_BOR] = k##_##dt##_bor_##isa,  \
                        [TUTTI_BXOR] = k##_##dt##_bxor_##isa,                                      \
                        [TUTTI_LAND] = k##_##dt##_land_##isa, [TUTTI_LOR] = k##_##dt##_lor_##isa,  \
                        [TUTTI_LXOR] = k##_##dt##_lxor_##isa

#define TT_TABLE(k, isa, hisa)                                                                     \
    {                                                                                              \
        [TUTTI_INT8] = { TT_ROW_INT(k, isa, i8) }, [TUTTI_UINT8] = { TT_ROW_INT(k, isa, u8) },     \
        [TUTTI_INT32] = { TT_ROW_INT(k, isa, i32) }, [TUTTI_INT64] = { TT_ROW_INT(k, isa, i64) },  \
        [TUTTI_FP16] = { TT_ROW(k, hisa, f16) }, [TUTTI_BF16] = { TT_ROW(k, hisa, bf16) },         \
        [TUTTI_FP32] = { TT_ROW(k, isa, f32) }, [TUTTI_FP64] = { TT_ROW(k, isa, f64) },            \
        [TUTTI_INT16] = { TT_ROW_INT(k, isa, i16) }, [TUTTI_UINT16] = { TT_ROW_INT(k, isa, u16) }, \
        [TUTTI_UINT32] = { TT_ROW_INT(k, isa, u32) },                                              \
        [TUTTI_UINT64] = { TT_ROW_INT(k, isa, u64) }, [TUTTI_FP8_E4M3] = { TT_ROW(k, isa, e4m3) }, \
        [TUTTI_FP8_E5M2] = { TT_ROW(k, isa, e5m2) },                                               \
    }

#define TT_NOPS TUTTI_REDOP_COUNT

typedef struct tt_reduce_isa {
    const char *name;
    tt_k2_fn k2[TUTTI_DTYPE_COUNT][TT_NOPS];
    tt_k2_fn k2r[TUTTI_DTYPE_COUNT][TT_NOPS];
    tt_k3_fn k3[TUTTI_DTYPE_COUNT][TT_NOPS];
} tt_reduce_isa_t;

#define TT_ISA_TABLE(isa, hisa)                                                                    \
    {                                                                                              \
        .name = #isa, .k2 = TT_TABLE(tt_k2, isa, hisa), .k2r = TT_TABLE(tt_k2r, isa, hisa),        \
        .k3 = TT_TABLE(tt_k3, isa, hisa),                                                          \
    }

/* Baseline: whatever the build targets (SSE2 on x86-64). */
TT_DEF_ISA(generic, , TT_HALF_PORTABLE)
static const tt_reduce_isa_t tt_isa_generic = TT_ISA_TABLE(generic, generic);

#if TT_REDUCE_X86
/* fp16 and bf16 by hand on 256-bit vectors: F16C converts fp16, AVX2 shifts and rounds
 * bf16; the tails run the portable code (bit-identical). Used by the AVX2 and AVX-512
 * tables both. MIN/MAX follow TT_OP_FMIN/FMAX: min_ps(x, y) is x < y ? x : y (y on ties
 * and on any NaN), then a NaN x is put back. */
#define TT_AVX_INLINE static inline __attribute__((always_inline, target("avx")))

/* r where x is a number, x where it is NaN. (Not _mm256_blendv_ps: GCC 12 folds it to a
 * generic select and then expands that into per-lane branches.) */
TT_AVX_INLINE __m256 tt_v_nan_x(__m256 r, __m256 x)
{
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_or_ps(_mm256_and_ps(nan, x), _mm256_andnot_ps(nan, r));
}

TT_AVX_INLINE __m256 tt_v_min(__m256 x, __m256 y)
{
    return tt_v_nan_x(_mm256_min_ps(x, y), x);
}

TT_AVX_INLINE __m256 tt_v_max(__m256 x, __m256 y)
{
    return tt_v_nan_x(_mm256_max_ps(x, y), x);
}

#define TT_V_SUM(x, y) _mm256_add_ps(x, y)
#define TT_V_PROD(x, y) _mm256_mul_ps(x, y)
#define TT_V_MIN(x, y) tt_v_min(x, y)
#define TT_V_MAX(x, y) tt_v_max(x, y)

/* 8 fp16 at p <-> 8 floats. */
#define TT_F16C_ATTR __attribute__((target("avx,f16c")))
#define TT_F16C_STEP 8
#define TT_F16C_BODY(d, x, y, VOP)                                                                 \
    _mm_storeu_si128((__m128i_u *)(d),                                                             \
                     _mm256_cvtps_ph(VOP(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i_u *)(x))), \
                                         _mm256_cvtph_ps(                                          \
                                             _mm_loadu_si128((const __m128i_u *)(y)))),            \
                                     _MM_FROUND_TO_NEAREST_INT))

/* 16 bf16: unpacking with zeros below gives the fp32 bits of elements 0-3 and 8-11 (lo),
 * 4-7 and 12-15 (hi); packus_epi32 of the rounded halves restores the order. */
#define TT_BF16_ATTR __attribute__((target("avx2")))
#define TT_BF16_STEP 16

TT_BF16_ATTR static inline __attribute__((always_inline)) __m256 tt_bf16_lo(__m256i v)
{
    return _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), v));
}

TT_BF16_ATTR static inline __attribute__((always_inline)) __m256 tt_bf16_hi(__m256i v)
{
    return _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), v));
}

/* fp32 -> bf16 in the low half of each 32-bit lane, as tt_f2bf: add 0x7fff + lsb and
 * shift; a NaN gets its quiet bit instead of the rounding. */
TT_BF16_ATTR static inline __attribute__((always_inline)) __m256i tt_bf16_round(__m256 r)
{
    __m256i u = _mm256_castps_si256(r);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(r, r, _CMP_UNORD_Q));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i bias = _mm256_andnot_si256(nan, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i quiet = _mm256_and_si256(nan, _mm256_set1_epi32(0x400000));
    return _mm256_srli_epi32(_mm256_add_epi32(_mm256_or_si256(u, quiet), bias), 16);
}

#define TT_BF16_BODY(d, x, y, VOP)                                                                 \
    do {                                                                                           \
        __m256i vx_ = _mm256_loadu_si256((const __m256i_u *)(x));                                  \
        __m256i vy_ = _mm256_loadu_si256((const __m256i_u *)(y));                                  \
        __m256 lo_ = VOP(tt_bf16_lo(vx_), tt_bf16_lo(vy_));                                        \
        __m256 hi_ = VOP(tt_bf16_hi(vx_), tt_bf16_hi(vy_));                                        \
        _mm256_storeu_si256((__m256i_u *)(d),                                                      \
                            _mm256_packus_epi32(tt_bf16_round(lo_), tt_bf16_round(hi_)));          \
    } while (0)

/* STEP elements of d = a VOP b per BODY (16-bit elements; byte pointers). */
#define TT_V16LOOP(d, a, b, STEP, BODY, VOP)                                                       \
    size_t i = 0;                                                                                  \
    for (; i + STEP <= n; i += STEP)                                                               \
        BODY(d + 2 * i, a + 2 * i, b + 2 * i, VOP);

/* k2, k2r and k3 for one 16-bit float type and op: STEP elements per BODY, then the
 * portable kernel of the same shape for the tail. */
/* k2 (X = d, Y = s) or k2r (X = s, Y = d) for one 16-bit float type and op. */
#define TT_DEF_V16_K2(k, dt, nm, ATTR, STEP, BODY, VOP, X, Y)                                      \
    ATTR static void tt_##k##_##dt##_##nm##_x86(void *restrict dv, const void *restrict sv,        \
                                                size_t n)                                          \
    {                                                                                              \
        char *restrict d = dv;                                                                     \
        const char *restrict s = sv;                                                               \
        TT_V16LOOP(d, X, Y, STEP, BODY, VOP)                                                       \
        tt_##k##_##dt##_##nm##_generic(d + 2 * i, s + 2 * i, n - i);                               \
    }

#define TT_DEF_V16(dt, nm, ATTR, STEP, BODY, VOP)                                                  \
    TT_DEF_V16_K2(k2, dt, nm, ATTR, STEP, BODY, VOP, d, s)                                         \
    TT_DEF_V16_K2(k2r, dt, nm, ATTR, STEP, BODY, VOP, s, d)                                        \
    ATTR static void tt_k3_##dt##_##nm##_x86(void *restrict dv, const void *restrict av,           \
                                             const void *restrict bv, size_t n)                    \
    {                                                                                              \
        char *restrict d = dv;                                                                     \
        const char *restrict a = av;                                                               \
        const char *restrict b = bv;                                                               \
        TT_V16LOOP(d, a, b, STEP, BODY, VOP)                                                       \
        tt_k3_##dt##_##nm##_generic(d + 2 * i, a + 2 * i, b + 2 * i, n - i);                       \
    }

#define TT_DEF_V16_OPS(dt, ATTR, STEP, BODY)                                                       \
    TT_DEF_V16(dt, sum, ATTR, STEP, BODY, TT_V_SUM)                                                \
    TT_DEF_V16(dt, prod, ATTR, STEP, BODY, TT_V_PROD)                                              \
    TT_DEF_V16(dt, min, ATTR, STEP, BODY, TT_V_MIN)                                                \
    TT_DEF_V16(dt, max, ATTR, STEP, BODY, TT_V_MAX)

TT_DEF_V16_OPS(f16, TT_F16C_ATTR, TT_F16C_STEP, TT_F16C_BODY)
TT_DEF_V16_OPS(bf16, TT_BF16_ATTR, TT_BF16_STEP, TT_BF16_BODY)

#define TT_HALF_NONE(isa, attr)

#define TT_AVX2_ATTR __attribute__((target("avx2")))
TT_DEF_ISA(avx2, TT_AVX2_ATTR, TT_HALF_NONE)
static const tt_reduce_isa_t tt_isa_avx2 = TT_ISA_TABLE(avx2, x86);

#define TT_AVX512_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
TT_DEF_ISA(avx512, TT_AVX512_ATTR, TT_HALF_NONE)
static const tt_reduce_isa_t tt_isa_avx512 = TT_ISA_TABLE(avx512, x86);

static int tt_cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    return (c & bit_F16C) != 0;
}
#endif /* TT_REDUCE_X86 */

/* The best kernel set for this CPU, capped by TUTTI_REDUCE_ISA. */
static const tt_reduce_isa_t *tt_reduce_select(void)
{
#if TT_REDUCE_X86
    const char *cap = tt_env("REDUCE_ISA");
    int max_level = 2;
    if (cap && strcmp(cap, "generic") == 0)
        max_level = 0;
    else if (cap && strcmp(cap, "avx2") == 0)
        max_level = 1;
    else if (cap && strcmp(cap, "avx512") != 0)
        TT_WARN("TUTTI_REDUCE_ISA=%s: expected generic, avx2 or avx512; ignored", cap);
    __builtin_cpu_init();
    /* AVX2/AVX-512 CPUs all have F16C, but the fp16 rows need it: check. */
    int f16c = tt_cpu_has_f16c();
    if (max_level >= 2 && f16c && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        return &tt_isa_avx512;
    if (max_level >= 1 && f16c && __builtin_cpu_supports("avx2"))
        return &tt_isa_avx2;
#endif
    return &tt_isa_generic;
}

static const tt_reduce_isa_t *tt_reduce_isa(void)
{
    static const tt_reduce_isa_t *isa;
    const tt_reduce_isa_t *t = __atomic_load_n(&isa, __ATOMIC_ACQUIRE);
    if (!t) { /* racing first calls pick the same table */
        t = tt_reduce_select();
        __atomic_store_n(&isa, t, __ATOMIC_RELEASE);
        TT_INFO("reduce kernels: %s", t->name);
    }
    return t;
}

const char *tt_reduce_isa_name(void)
{
    return tt_reduce_isa()->name;
}

/* dst[i] = dst[i] op dst[i]: the only case where tt_reduce's operands alias. Rare, so
 * the baseline code only. */
#define TT_DEF_SELF(nm, ST, CT, LD, STO, OP)                                                       \
    static void tt_k1_##nm(void *dv, size_t n)                                                     \
    {                                                                                              \
        ST *d = dv;                                                                                \
        for (size_t i = 0; i < n; i++) {                                                           \
            CT x = LD(d[i]);                                                                       \
            d[i] = STO(OP(x, x));                                                                  \
        }                                                                                          \
    }
#define TT_DEF_SELF_OPS(dt, SST, SCT, UST, UCT, LD, STO, OPMIN, OPMAX)                             \
    TT_DEF_SELF(dt##_sum, UST, UCT, LD, STO, TT_OP_SUM)                                            \
    TT_DEF_SELF(dt##_prod, UST, UCT, LD, STO, TT_OP_PROD)                                          \
    TT_DEF_SELF(dt##_min, SST, SCT, LD, STO, OPMIN)                                                \
    TT_DEF_SELF(dt##_max, SST, SCT, LD, STO, OPMAX)
#define TT_DEF_SELF_INT(dt, SST, SCT, UST, UCT)                                                    \
    TT_DEF_SELF_OPS(dt, SST, SCT, UST, UCT, TT_LD_ID, TT_ST_ID, TT_OP_MIN, TT_OP_MAX)              \
    TT_DEF_SELF(dt##_band, UST, UCT, TT_LD_ID, TT_ST_ID, TT_OP_BAND)                               \
    TT_DEF_SELF(dt##_bor, UST, UCT, TT_LD_ID, TT_ST_ID, TT_OP_BOR)                                 \
    TT_DEF_SELF(dt##_bxor, UST, UCT, TT_LD_ID, TT_ST_ID, TT_OP_BXOR)                               \
    TT_DEF_SELF(dt##_land, UST, UCT, TT_LD_ID, TT_ST_ID, TT_OP_LAND)                               \
    TT_DEF_SELF(dt##_lor, UST, UCT, TT_LD_ID, TT_ST_ID, TT_OP_LOR)                                 \
    TT_DEF_SELF(dt##_lxor, UST, UCT, TT_LD_ID, TT_ST_ID, TT_OP_LXOR)

TT_DEF_SELF_INT(i8, tt_ui8_t, int8_t, tt_uu8_t, uint8_t)
TT_DEF_SELF_INT(u8, tt_uu8_t, uint8_t, tt_uu8_t, uint8_t)
TT_DEF_SELF_INT(i32, tt_ui32_t, int32_t, tt_uu32_t, uint32_t)
TT_DEF_SELF_INT(i64, tt_ui64_t, int64_t, tt_uu64_t, uint64_t)
TT_DEF_SELF_INT(i16, tt_ui16_t, int16_t, tt_uu16_t, uint32_t)
TT_DEF_SELF_INT(u16, tt_uu16_t, uint16_t, tt_uu16_t, uint32_t)
TT_DEF_SELF_INT(u32, tt_uu32_t, uint32_t, tt_uu32_t, uint32_t)
TT_DEF_SELF_INT(u64, tt_uu64_t, uint64_t, tt_uu64_t, uint64_t)
TT_DEF_SELF_OPS(f16, tt_uu16_t, float, tt_uu16_t, float, TT_LD_H, TT_ST_H, TT_OP_FMIN, TT_OP_FMAX)
TT_DEF_SELF_OPS(bf16, tt_uu16_t, float, tt_uu16_t, float, TT_LD_BF, TT_ST_BF, TT_OP_FMIN,
                TT_OP_FMAX)
#define TT_DEF_SELF_F8(dt, LD, STO, OPMIN, OPMAX)                                                  \
    TT_DEF_SELF(dt##_sum, tt_uu8_t, float, LD, STO, TT_OP_SUM)                                     \
    TT_DEF_SELF(dt##_prod, tt_uu8_t, float, LD, STO, TT_OP_PROD)                                   \
    TT_DEF_SELF(dt##_min, tt_uu8_t, uint8_t, TT_LD_ID, TT_ST_ID, OPMIN)                            \
    TT_DEF_SELF(dt##_max, tt_uu8_t, uint8_t, TT_LD_ID, TT_ST_ID, OPMAX)
TT_DEF_SELF_F8(e4m3, TT_LD_E4M3, TT_ST_E4M3, TT_OP_E4M3_MIN, TT_OP_E4M3_MAX)
TT_DEF_SELF_F8(e5m2, TT_LD_E5M2, TT_ST_E5M2, TT_OP_E5M2_MIN, TT_OP_E5M2_MAX)
TT_DEF_SELF_OPS(f32, tt_uf32_t, float, tt_uf32_t, float, TT_LD_ID, TT_ST_ID, TT_OP_FMIN, TT_OP_FMAX)
TT_DEF_SELF_OPS(f64, tt_uf64_t, double, tt_uf64_t, double, TT_LD_ID, TT_ST_ID, TT_OP_FMIN,
                TT_OP_FMAX)

typedef void (*tt_k1_fn)(void *dst, size_t n);
#define TT_SELF_COLS(dt)                                                                           \
    [TUTTI_SUM] = tt_k1_##dt##_sum, [TUTTI_PROD] = tt_k1_##dt##_prod,                              \
    [TUTTI_MIN] = tt_k1_##dt##_min, [TUTTI_MAX] = tt_k1_##dt##_max
#define TT_SELF_ROW(dt)                                                                            \
    {                                                                                              \
        TT_SELF_COLS(dt)                                                                           \
    }
#define TT_SELF_ROW_INT(dt)                                                                        \
    {                                                                                              \
        TT_SELF_COLS(dt), [TUTTI_BAND] = tt_k1_##dt##_band, [TUTTI_BOR] = tt_k1_##dt##_bor,        \
                          [TUTTI_BXOR] = tt_k1_##dt##_bxor, [TUTTI_LAND] = tt_k1_##dt##_land,      \
                          [TUTTI_LOR] = tt_k1_##dt##_lor, [TUTTI_LXOR] = tt_k1_##dt##_lxor         \
    }
static const tt_k1_fn tt_k1[TUTTI_DTYPE_COUNT][TT_NOPS] = {
    [TUTTI_INT8] = TT_SELF_ROW_INT(i8),    [TUTTI_UINT8] = TT_SELF_ROW_INT(u8),
    [TUTTI_INT32] = TT_SELF_ROW_INT(i32),  [TUTTI_INT64] = TT_SELF_ROW_INT(i64),
    [TUTTI_FP16] = TT_SELF_ROW(f16),       [TUTTI_BF16] = TT_SELF_ROW(bf16),
    [TUTTI_FP32] = TT_SELF_ROW(f32),       [TUTTI_FP64] = TT_SELF_ROW(f64),
    [TUTTI_INT16] = TT_SELF_ROW_INT(i16),  [TUTTI_UINT16] = TT_SELF_ROW_INT(u16),
    [TUTTI_UINT32] = TT_SELF_ROW_INT(u32), [TUTTI_UINT64] = TT_SELF_ROW_INT(u64),
    [TUTTI_FP8_E4M3] = TT_SELF_ROW(e4m3),  [TUTTI_FP8_E5M2] = TT_SELF_ROW(e5m2),
};

/* ---- complex: SUM (and AVG's) as the parts' dtype, PROD here ---------------------- */

/* d = a * b for n complex elements, on pairs (re, im) of T; d may be a or b (each
 * element's four parts are read before it is written). No contraction into fused
 * multiply-adds, so that every build (and an FMA machine's) rounds each product alone:
 * the result is the plain C expression's. */
#if defined(__clang__)
#define TT_NO_CONTRACT_ATTR
#define TT_NO_CONTRACT_BODY _Pragma("clang fp contract(off)")
#else
#define TT_NO_CONTRACT_ATTR __attribute__((optimize("fp-contract=off")))
#define TT_NO_CONTRACT_BODY
#endif
#define TT_DEF_CPROD(nm, T, UT)                                                                    \
    TT_NO_CONTRACT_ATTR static void tt_cprod_##nm(void *dv, const void *av, const void *bv,        \
                                                  size_t n)                                        \
    {                                                                                              \
        TT_NO_CONTRACT_BODY                                                                        \
        UT *d = dv;                                                                                \
        const UT *a = av, *b = bv;                                                                 \
        for (size_t i = 0; i < 2 * n; i += 2) {                                                    \
            T ar = a[i], ai = a[i + 1], br = b[i], bi = b[i + 1];                                  \
            T re = ar * br - ai * bi, im = ar * bi + ai * br;                                      \
            d[i] = re;                                                                             \
            d[i + 1] = im;                                                                         \
        }                                                                                          \
    }
TT_DEF_CPROD(c64, float, tt_uf32_t)
TT_DEF_CPROD(c128, double, tt_uf64_t)

static void tt_reduce_complex(void *dst, const void *a, const void *b, size_t count,
                              tutti_dtype_t dtype, tutti_redop_t op)
{
    if (op == TUTTI_SUM || op == TUTTI_AVG)
        tt_reduce3(dst, a, b, 2 * count, tt_complex_part(dtype),
                   TUTTI_SUM); /* (its aliasing cases too) */
    else if (op == TUTTI_PROD)
        (dtype == TUTTI_COMPLEX64 ? tt_cprod_c64 : tt_cprod_c128)(dst, a, b, count);
}

/* ---- value-index pairs: MINLOC, MAXLOC (MPI's) ------------------------------------- */

/* Does pair (x, i) win over (y, j)? The lesser (greater) value, a NaN before any number;
 * on equal values (two NaNs included) the lesser index. A total order on the pairs but
 * for +0/-0 of one index, so the result is the same whatever the grouping. */
#define TT_PAIR_WINS(x, i, y, j, maxloc, NAN_)                                                     \
    (NAN_(x)      ? (NAN_(y) ? (i) < (j) : 1)                                                      \
     : NAN_(y)    ? 0                                                                              \
     : (x) == (y) ? (i) < (j)                                                                      \
     : (maxloc)   ? (x) > (y)                                                                      \
                  : (x) < (y))
#define TT_PAIR_FNAN(v) ((v) != (v))
#define TT_PAIR_INAN(v) 0

/* d = a op b for n pairs of value type VT at offset 0 and an int32_t at IOFF, each SIZE
 * bytes (C's struct layout, reduce.h's types; padding copied with the winner); d may be a or
 * b. memcpy: the buffers need not be aligned to the pair. */
#define TT_DEF_PAIR(nm, VT, IOFF, SIZE, NAN_)                                                      \
    static void tt_pair_##nm(void *dv, const void *av, const void *bv, size_t n, int maxloc)       \
    {                                                                                              \
        unsigned char *d = dv;                                                                     \
        const unsigned char *a = av, *b = bv;                                                      \
        for (size_t k = 0; k < n; k++, d += SIZE, a += SIZE, b += SIZE) {                          \
            VT x, y;                                                                               \
            int32_t i, j;                                                                          \
            memcpy(&x, a, sizeof(x));                                                              \
            memcpy(&y, b, sizeof(y));                                                              \
            memcpy(&i, a + IOFF, sizeof(i));                                                       \
            memcpy(&j, b + IOFF, sizeof(j));                                                       \
            const unsigned char *w = TT_PAIR_WINS(x, i, y, j, maxloc, NAN_) ? a : b;               \
            if (w != d)                                                                            \
                memmove(d, w, SIZE);                                                               \
        }                                                                                          \
    }
TT_DEF_PAIR(float_int, float, offsetof(tt_pair_float_int_t, i), sizeof(tt_pair_float_int_t),
            TT_PAIR_FNAN)
TT_DEF_PAIR(double_int, double, offsetof(tt_pair_double_int_t, i), sizeof(tt_pair_double_int_t),
            TT_PAIR_FNAN)
TT_DEF_PAIR(long_int, int64_t, offsetof(tt_pair_long_int_t, i), sizeof(tt_pair_long_int_t),
            TT_PAIR_INAN)
TT_DEF_PAIR(2int, int32_t, offsetof(tt_pair_2int_t, i), sizeof(tt_pair_2int_t), TT_PAIR_INAN)
TT_DEF_PAIR(short_int, int16_t, offsetof(tt_pair_short_int_t, i), sizeof(tt_pair_short_int_t),
            TT_PAIR_INAN)

static void tt_reduce_pair(void *dst, const void *a, const void *b, size_t count,
                           tutti_dtype_t dtype, tutti_redop_t op)
{
    static void (*const fn[])(void *, const void *, const void *, size_t, int) = {
        [TUTTI_FLOAT_INT - TUTTI_FLOAT_INT] = tt_pair_float_int,
        [TUTTI_DOUBLE_INT - TUTTI_FLOAT_INT] = tt_pair_double_int,
        [TUTTI_LONG_INT - TUTTI_FLOAT_INT] = tt_pair_long_int,
        [TUTTI_2INT - TUTTI_FLOAT_INT] = tt_pair_2int,
        [TUTTI_SHORT_INT - TUTTI_FLOAT_INT] = tt_pair_short_int,
    };
    if (op == TUTTI_MINLOC || op == TUTTI_MAXLOC)
        fn[dtype - TUTTI_FLOAT_INT](dst, a, b, count, op == TUTTI_MAXLOC);
}

/* Row and column of (dtype, op) in the tables, or -1 (out of range, or no kernel: a
 * bitwise op on a float dtype, which every entry point refuses first). */
static int tt_reduce_index(tutti_dtype_t dtype, tutti_redop_t op, unsigned *op_idx_p)
{
    if ((unsigned)dtype >= TUTTI_DTYPE_COUNT || (unsigned)op >= TUTTI_REDOP_COUNT)
        return -1;
    *op_idx_p = op == TUTTI_AVG ? (unsigned)TUTTI_SUM : (unsigned)op;
    return tt_k1[dtype][*op_idx_p] ? 0 : -1;
}

int tt_reduce_supported(tutti_dtype_t dtype, tutti_redop_t op)
{
    unsigned o;
    if ((unsigned)op >= TUTTI_REDOP_USER_FIRST) /* defined now (not freed) */
        return tt_redop_valid(op) && (unsigned)dtype < TUTTI_DTYPE_COUNT;
    if (tt_dtype_is_complex(dtype))
        return op == TUTTI_SUM || op == TUTTI_PROD || op == TUTTI_AVG;
    if (tt_dtype_is_pair(dtype))
        return op == TUTTI_MINLOC || op == TUTTI_MAXLOC;
    return tt_reduce_index(dtype, op, &o) == 0;
}

/* A defined op: its function (a value not defined, as any unknown op, does nothing:
 * every entry point refused it first) */
static void tt_reduce_user(void *dst, const void *a, const void *b, size_t count,
                           tutti_dtype_t dtype, tutti_redop_t op)
{
    const tt_userop_t *u = tt_userop(op);
    if (u)
        u->fn(dst, a, b, count, dtype, u->ctx);
}

void tt_reduce(void *dst, const void *src, size_t count, tutti_dtype_t dtype, tutti_redop_t op)
{
    unsigned o;
    if (count && (unsigned)op >= TUTTI_REDOP_USER_FIRST) {
        tt_reduce_user(dst, dst, src, count, dtype, op);
        return;
    }
    if (tt_dtype_is_complex(dtype)) {
        tt_reduce_complex(dst, dst, src, count, dtype, op);
        return;
    }
    if (tt_dtype_is_pair(dtype)) {
        tt_reduce_pair(dst, dst, src, count, dtype, op);
        return;
    }
    if (count == 0 || tt_reduce_index(dtype, op, &o) < 0)
        return;
    if (dst == src)
        tt_k1[dtype][o](dst, count);
    else
        tt_reduce_isa()->k2[dtype][o](dst, src, count);
}

void tt_reduce3(void *dst, const void *a, const void *b, size_t count, tutti_dtype_t dtype,
                tutti_redop_t op)
{
    unsigned o;
    if (count && (unsigned)op >= TUTTI_REDOP_USER_FIRST) {
        tt_reduce_user(dst, a, b, count, dtype, op);
        return;
    }
    if (tt_dtype_is_complex(dtype)) {
        tt_reduce_complex(dst, a, b, count, dtype, op);
        return;
    }
    if (tt_dtype_is_pair(dtype)) {
        tt_reduce_pair(dst, a, b, count, dtype, op);
        return;
    }
    if (count == 0 || tt_reduce_index(dtype, op, &o) < 0)
        return;
    const tt_reduce_isa_t *isa = tt_reduce_isa();
    if (dst == a && dst == b)
        tt_k1[dtype][o](dst, count);
    else if (dst == a)
        isa->k2[dtype][o](dst, b, count);
    else if (dst == b)
        isa->k2r[dtype][o](dst, a, count);
    else
        isa->k3[dtype][o](dst, a, b, count);
}

/* ---- AVG: the final division ------------------------------------------------------- */

#define TT_DEF_DIV(nm, ST, CT, LD, STO)                                                            \
    static void tt_div_##nm(void *bv, size_t n, int nranks)                                        \
    {                                                                                              \
        ST *b = bv;                                                                                \
        CT div = (CT)nranks;                                                                       \
        for (size_t i = 0; i < n; i++)                                                             \
            b[i] = STO(LD(b[i]) / div);                                                            \
    }

/* Integer quotients are computed in a type at least as wide as the element's, signed
 * for signed elements (int32_t, int64_t) and unsigned for unsigned ones (uint8_t in
 * int32_t): |q| <= |x|, so the result fits, and nranks >= 1 rules out INT_MIN / -1. */
TT_DEF_DIV(i8, tt_ui8_t, int32_t, TT_LD_ID, (int8_t))
TT_DEF_DIV(u8, tt_uu8_t, int32_t, TT_LD_ID, (uint8_t))
TT_DEF_DIV(i32, tt_ui32_t, int64_t, TT_LD_ID, (int32_t))
TT_DEF_DIV(i64, tt_ui64_t, int64_t, TT_LD_ID, TT_ST_ID)
TT_DEF_DIV(f16, tt_uu16_t, float, TT_LD_H, TT_ST_H)
TT_DEF_DIV(bf16, tt_uu16_t, float, TT_LD_BF, TT_ST_BF)
TT_DEF_DIV(f32, tt_uf32_t, float, TT_LD_ID, TT_ST_ID)
TT_DEF_DIV(f64, tt_uf64_t, double, TT_LD_ID, TT_ST_ID)
TT_DEF_DIV(i16, tt_ui16_t, int32_t, TT_LD_ID, (int16_t))
TT_DEF_DIV(u16, tt_uu16_t, uint32_t, TT_LD_ID, (uint16_t))
TT_DEF_DIV(u32, tt_uu32_t, uint32_t, TT_LD_ID, TT_ST_ID)
TT_DEF_DIV(u64, tt_uu64_t, uint64_t, TT_LD_ID, TT_ST_ID)
TT_DEF_DIV(e4m3, tt_uu8_t, float, TT_LD_E4M3, TT_ST_E4M3)
TT_DEF_DIV(e5m2, tt_uu8_t, float, TT_LD_E5M2, TT_ST_E5M2)

int tt_dtype_avg_prescaled(tutti_dtype_t dtype)
{
    return dtype == TUTTI_FP16 || dtype == TUTTI_FP8_E4M3 || dtype == TUTTI_FP8_E5M2;
}

void tt_reduce_scale(void *buf, size_t count, tutti_dtype_t dtype, float mul, float div)
{
    if (dtype == TUTTI_FP16) {
        tt_uu16_t *b = buf;
        for (size_t i = 0; i < count; i++)
            b[i] = TT_ST_H(TT_LD_H(b[i]) * mul / div);
    } else if (dtype == TUTTI_FP8_E4M3) {
        tt_uu8_t *b = buf;
        for (size_t i = 0; i < count; i++)
            b[i] = TT_ST_E4M3(TT_LD_E4M3(b[i]) * mul / div);
    } else if (dtype == TUTTI_FP8_E5M2) {
        tt_uu8_t *b = buf;
        for (size_t i = 0; i < count; i++)
            b[i] = TT_ST_E5M2(TT_LD_E5M2(b[i]) * mul / div);
    }
}

void tt_reduce_avg_finish(void *buf, size_t count, tutti_dtype_t dtype, int nranks)
{
    static void (*const div[TUTTI_DTYPE_COUNT])(void *, size_t, int) = {
        [TUTTI_INT8] = tt_div_i8,       [TUTTI_UINT8] = tt_div_u8,      [TUTTI_INT32] = tt_div_i32,
        [TUTTI_INT64] = tt_div_i64,     [TUTTI_FP16] = tt_div_f16,      [TUTTI_BF16] = tt_div_bf16,
        [TUTTI_FP32] = tt_div_f32,      [TUTTI_FP64] = tt_div_f64,      [TUTTI_INT16] = tt_div_i16,
        [TUTTI_UINT16] = tt_div_u16,    [TUTTI_UINT32] = tt_div_u32,    [TUTTI_UINT64] = tt_div_u64,
        [TUTTI_FP8_E4M3] = tt_div_e4m3, [TUTTI_FP8_E5M2] = tt_div_e5m2,
    };
    if (tt_dtype_is_complex(dtype)) { /* each part divided */
        count *= 2;
        dtype = tt_complex_part(dtype);
    }
    if (count == 0 || nranks <= 1 || (unsigned)dtype >= TUTTI_DTYPE_COUNT)
        return;
    div[dtype](buf, count, nranks);
}
