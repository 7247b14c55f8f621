/* Reduction kernels, fp16/bf16 conversions, dtype and op names.
 *
 * Every kernel is checked against a scalar reference written here independently of
 * lib/reduce/reduce.c (wider integer arithmetic, libm-based half/bf16 rounding). The suite
 * runs once per kernel set the CPU supports (TUTTI_REDUCE_ISA=generic, avx2, avx512),
 * unless TUTTI_REDUCE_ISA is already set or Check runs without fork. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <tutti/tutti.h>

#include "reduce/reduce.h"
#include "base/base.h"
#include "../transports/kit/copy.h"
#include "harness.h"
#include "ref_fp8.h"

/* Defined in lib/reduce/reduce.c (not yet declared in reduce.h). */
const char *tt_reduce_isa_name(void);

static const size_t lengths[] = { 0, 1, 3, 7, 15, 17, 31, 33, 63, 65, 1000, 4097 };
#define NLENGTHS (sizeof(lengths) / sizeof(lengths[0]))
#define MAXLEN 4097
#define GUARD 16
#define GUARD_BYTE 0xa5

/* ---- random numbers (deterministic) -------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng(void)
{
    uint64_t x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545f4914f6cdd1dull;
}

static void rng_seed(uint64_t seed)
{
    rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
}

/* ---- reference conversions ----------------------------------------------------- */

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* A 16-bit float format: exponent and mantissa widths (sign in bit 15). */
typedef struct fmt16 {
    int ebits, mbits;
} fmt16_t;

static const fmt16_t F_HALF = { 5, 10 }, F_BF16 = { 8, 7 };

static int fmt_bias(fmt16_t f)
{
    return (1 << (f.ebits - 1)) - 1;
}

static double ref_16to_d(fmt16_t f, uint16_t h)
{
    int emax = (1 << f.ebits) - 1, e = (h >> f.mbits) & emax, m = h & ((1 << f.mbits) - 1);
    int bias = fmt_bias(f);
    double v;
    if (e == emax)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, 1 - bias - f.mbits);
    else
        v = ldexp((1 << f.mbits) + m, e - bias - f.mbits);
    return (h & 0x8000) ? -v : v;
}

/* Nearest value of format f to x (a float value), ties to even; NaN -> the quiet NaN
 * with only the top mantissa bit. */
static uint16_t ref_d_to16(fmt16_t f, double x)
{
    int bias = fmt_bias(f);
    uint16_t inf = (uint16_t)(((1 << f.ebits) - 1) << f.mbits);
    if (isnan(x))
        return inf | (uint16_t)(1 << (f.mbits - 1));
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double ax = fabs(x);
    if (ax >= ldexp(1, bias + 1)) /* inf, or past the largest binade */
        return sign | inf;
    if (ax < ldexp(1, 1 - bias)) /* zero or subnormal */
        return sign | (uint16_t)nearbyint(ldexp(ax, bias - 1 + f.mbits));
    int e;
    frexp(ax, &e);
    int E = e - 1;
    double q = nearbyint(ldexp(ax, f.mbits - E)); /* 2^mbits .. 2^(mbits+1); overflow
                                                      lands on inf */
    return sign | (uint16_t)(((E + bias) << f.mbits) + ((int)q - (1 << f.mbits)));
}

static double ref_h2d(uint16_t h)
{
    return ref_16to_d(F_HALF, h);
}
static uint16_t ref_d2h(double x)
{
    return ref_d_to16(F_HALF, x);
}
static double ref_bf2d(uint16_t b)
{
    return ref_16to_d(F_BF16, b);
}
static uint16_t ref_d2bf(double x)
{
    return ref_d_to16(F_BF16, x);
}

static int half_is_nan(uint16_t h)
{
    return isnan(ref_h2d(h));
}
static int bf16_is_nan(uint16_t b)
{
    return isnan(ref_bf2d(b));
}

/* ---- reference reduction ------------------------------------------------------- */

static const size_t dsize[TUTTI_DTYPE_COUNT] = { 1, 1, 4, 8, 2, 2, 4, 8, 2, 2, 4, 8, 8, 16, 1, 1,
                                                 /* the value-index pairs: C's struct sizes */
                                                 8, 16, 16, 8, 8 };

static int64_t wrap_signed(unsigned __int128 v, int bits)
{
    uint64_t mask = bits == 64 ? ~0ull : ((1ull << bits) - 1);
    uint64_t u = (uint64_t)v & mask;
    if (bits < 64 && (u >> (bits - 1)))
        return (int64_t)(u | ~mask);
    return (int64_t)u;
}

/* Float SUM/PROD (AVG reduces as SUM). */
static double ref_fop(tutti_redop_t op, double a, double b)
{
    return op == TUTTI_PROD ? a * b : a + b;
}

/* Float MIN/MAX: NaN in either -> NaN (*nan_p); otherwise which operand is the result:
 * 0 the first, 1 the second (also on ties: +0 and -0). */
static int ref_fpick(tutti_redop_t op, double a, double b, int *nan_p)
{
    *nan_p = isnan(a) || isnan(b);
    return op == TUTTI_MIN ? !(a < b) : !(a > b);
}

static int is_minmax(tutti_redop_t op)
{
    return op == TUTTI_MIN || op == TUTTI_MAX;
}

static int is_unsigned(tutti_dtype_t dt)
{
    return dt == TUTTI_UINT8 || dt == TUTTI_UINT16 || dt == TUTTI_UINT32 || dt == TUTTI_UINT64;
}

/* a op b on integers widened to 64 bits (load_int: unsigned 64-bit ones as their bits),
 * wrapped to `bits`; uns: compare as unsigned. */
static int64_t ref_iop(tutti_redop_t op, int64_t a, int64_t b, int bits, int uns)
{
    if (uns && (op == TUTTI_MIN || op == TUTTI_MAX)) {
        int a_less = (uint64_t)a < (uint64_t)b;
        return op == TUTTI_MIN ? (a_less ? a : b) : (a_less ? b : a);
    }
    switch (op) {
    case TUTTI_SUM:
    case TUTTI_AVG: return wrap_signed((unsigned __int128)((__int128)a + b), bits);
    case TUTTI_PROD: return wrap_signed((unsigned __int128)((__int128)a * b), bits);
    case TUTTI_MIN: return a < b ? a : b;
    case TUTTI_MAX: return a > b ? a : b;
    /* on the two's complement bits, truncated to the width on store */
    case TUTTI_BAND: return a & b;
    case TUTTI_BOR: return a | b;
    case TUTTI_BXOR: return wrap_signed((unsigned __int128)(uint64_t)(a ^ b), bits);
    /* MPI's: the truth of each, 1 or 0 */
    case TUTTI_LAND: return a != 0 && b != 0;
    case TUTTI_LOR: return a != 0 || b != 0;
    case TUTTI_LXOR: return (a != 0) != (b != 0);
    default: abort();
    }
}

static int is_bitwise(tutti_redop_t op)
{
    return op == TUTTI_BAND || op == TUTTI_BOR || op == TUTTI_BXOR || op == TUTTI_LAND ||
           op == TUTTI_LOR || op == TUTTI_LXOR;
}

static int is_fp8(tutti_dtype_t dt)
{
    return dt == TUTTI_FP8_E4M3 || dt == TUTTI_FP8_E5M2;
}

static int is_float(tutti_dtype_t dt)
{
    return dt == TUTTI_FP16 || dt == TUTTI_BF16 || dt == TUTTI_FP32 || dt == TUTTI_FP64 ||
           is_fp8(dt);
}

static int is_complex(tutti_dtype_t dt)
{
    return dt == TUTTI_COMPLEX64 || dt == TUTTI_COMPLEX128;
}

/* A complex dtype's parts: fp32 or fp64. */
static tutti_dtype_t part_of(tutti_dtype_t dt)
{
    return dt == TUTTI_COMPLEX64 ? TUTTI_FP32 : TUTTI_FP64;
}

static int is_pair(tutti_dtype_t dt)
{
    return dt == TUTTI_FLOAT_INT || dt == TUTTI_DOUBLE_INT || dt == TUTTI_LONG_INT ||
           dt == TUTTI_2INT || dt == TUTTI_SHORT_INT;
}

/* A value-index pair as plain C declares it (MPI's struct { float; int; } ...): its value
 * widened (long double holds int64 and double exactly), its index, and whether the value
 * is a NaN. */
typedef struct {
    long double v;
    int32_t i;
    int nan;
} pair_t;

static pair_t load_pair(tutti_dtype_t dt, const void *p)
{
    pair_t r = { 0, 0, 0 };
    switch (dt) {
    case TUTTI_FLOAT_INT: {
        struct {
            float v;
            int32_t i;
        } x;
        memcpy(&x, p, sizeof(x));
        r.v = x.v, r.i = x.i, r.nan = isnan(x.v);
        break;
    }
    case TUTTI_DOUBLE_INT: {
        struct {
            double v;
            int32_t i;
        } x;
        memcpy(&x, p, sizeof(x));
        r.v = x.v, r.i = x.i, r.nan = isnan(x.v);
        break;
    }
    case TUTTI_LONG_INT: {
        struct {
            int64_t v;
            int32_t i;
        } x;
        memcpy(&x, p, sizeof(x));
        r.v = x.v, r.i = x.i;
        break;
    }
    case TUTTI_2INT: {
        struct {
            int32_t v, i;
        } x;
        memcpy(&x, p, sizeof(x));
        r.v = x.v, r.i = x.i;
        break;
    }
    default: {
        struct {
            int16_t v;
            int32_t i;
        } x;
        memcpy(&x, p, sizeof(x));
        r.v = x.v, r.i = x.i;
    }
    }
    return r;
}

/* MPI's MINLOC/MAXLOC of a and b (MPI 4.0, 6.9.4: the extreme value; on a tie the least
 * index), NaN (tutti.h) ahead of every number, the least index among NaNs: which of the
 * two is the result, 0 a, 1 b. */
static int ref_loc_pick(tutti_redop_t op, pair_t a, pair_t b)
{
    if (a.nan || b.nan)
        return a.nan && b.nan ? b.i < a.i : b.nan;
    if (a.v == b.v)
        return b.i < a.i;
    return op == TUTTI_MAXLOC ? b.v > a.v : b.v < a.v;
}

/* One element of any dtype, as memcpy'd from a buffer. */
typedef union elem {
    int8_t i8;
    uint8_t u8;
    int16_t i16;
    uint16_t u16;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint16_t h; /* fp16 or bf16 bits */
    float f;
    double d;
} elem_t;

/* Integer element at p, widened. */
static int64_t load_int(tutti_dtype_t dt, const void *p)
{
    elem_t v;
    memcpy(&v, p, dsize[dt]);
    switch (dt) {
    case TUTTI_INT8: return v.i8;
    case TUTTI_UINT8: return v.u8;
    case TUTTI_INT16: return v.i16;
    case TUTTI_UINT16: return v.u16;
    case TUTTI_INT32: return v.i32;
    case TUTTI_UINT32: return v.u32;
    default: return v.i64; /* int64, and uint64 as its bits */
    }
}

/* x (already in range, or to be truncated to the low bits) into the integer element p. */
static void store_int(tutti_dtype_t dt, void *p, int64_t x)
{
    elem_t v;
    switch (dt) {
    case TUTTI_INT8: v.i8 = (int8_t)x; break;
    case TUTTI_UINT8: v.u8 = (uint8_t)x; break;
    case TUTTI_INT16: v.i16 = (int16_t)x; break;
    case TUTTI_UINT16: v.u16 = (uint16_t)x; break;
    case TUTTI_INT32: v.i32 = (int32_t)x; break;
    case TUTTI_UINT32: v.u32 = (uint32_t)x; break;
    default: v.i64 = x; break;
    }
    memcpy(p, &v, dsize[dt]);
}

/* Float element at p, exactly, as a double (reference conversions for fp16/bf16). */
static double load_f(tutti_dtype_t dt, const void *p)
{
    elem_t v;
    memcpy(&v, p, dsize[dt]);
    if (is_fp8(dt))
        return ref_fp8_to_d(dt, v.u8);
    return dt == TUTTI_FP16   ? ref_h2d(v.h)
           : dt == TUTTI_BF16 ? ref_bf2d(v.h)
           : dt == TUTTI_FP32 ? v.f
                              : v.d;
}

/* x rounded to the float element p (fp16/bf16: from a float value, as the kernels do;
 * fp8: from any double, rounded once). */
static void store_f(tutti_dtype_t dt, void *p, double x)
{
    elem_t v;
    if (is_fp8(dt))
        v.u8 = ref_d_to_fp8(dt, x);
    else if (dt == TUTTI_FP16)
        v.h = ref_d2h(x);
    else if (dt == TUTTI_BF16)
        v.h = ref_d2bf(x);
    else if (dt == TUTTI_FP32)
        v.f = (float)x;
    else
        v.d = x;
    memcpy(p, &v, dsize[dt]);
}

/* Bits of the integer arithmetic per integer dtype: the signed types wrap at their
 * width; the unsigned ones (non-negative when widened, but uint64) in 64, truncated on
 * store. */
static int ibits(tutti_dtype_t dt)
{
    switch (dt) {
    case TUTTI_INT8: return 8;
    case TUTTI_INT16: return 16;
    case TUTTI_INT32: return 32;
    default: return 64;
    }
}

/* Complex out = a op b (SUM, AVG's sum, PROD), each part's arithmetic in its own type,
 * one rounding per operation (volatile: no fused multiply-add), by the textbook product. */
static void ref_complex(tutti_dtype_t dt, tutti_redop_t op, void *out, const void *pa,
                        const void *pb)
{
    if (dt == TUTTI_COMPLEX64) {
        float a[2], b[2], r[2];
        memcpy(a, pa, 8), memcpy(b, pb, 8);
        if (op == TUTTI_PROD) {
            volatile float p1 = a[0] * b[0], p2 = a[1] * b[1], p3 = a[0] * b[1], p4 = a[1] * b[0];
            r[0] = p1 - p2, r[1] = p3 + p4;
        } else {
            r[0] = a[0] + b[0], r[1] = a[1] + b[1];
        }
        memcpy(out, r, 8);
    } else {
        double a[2], b[2], r[2];
        memcpy(a, pa, 16), memcpy(b, pb, 16);
        if (op == TUTTI_PROD) {
            volatile double p1 = a[0] * b[0], p2 = a[1] * b[1], p3 = a[0] * b[1], p4 = a[1] * b[0];
            r[0] = p1 - p2, r[1] = p3 + p4;
        } else {
            r[0] = a[0] + b[0], r[1] = a[1] + b[1];
        }
        memcpy(out, r, 16);
    }
}

/* out = a op b for one element of dtype. */
static void ref_elem(tutti_dtype_t dt, tutti_redop_t op, void *out, const void *pa, const void *pb)
{
    if (is_complex(dt)) {
        ref_complex(dt, op, out, pa, pb);
        return;
    }
    if (is_pair(dt)) {
        memcpy(out, ref_loc_pick(op, load_pair(dt, pa), load_pair(dt, pb)) ? pb : pa, dsize[dt]);
        return;
    }
    if (!is_float(dt)) {
        store_int(dt, out,
                  ref_iop(op, load_int(dt, pa), load_int(dt, pb), ibits(dt), is_unsigned(dt)));
        return;
    }
    double x = load_f(dt, pa), y = load_f(dt, pb);
    if (is_minmax(op)) {
        int nan;
        memcpy(out, ref_fpick(op, x, y, &nan) ? pb : pa, dsize[dt]);
        if (nan)
            store_f(dt, out, NAN);
        return;
    }
    /* below fp64 computed in fp32 (double then float: exact or one innocuous rounding);
     * fp8 rounded once from the exact double (the kernels' fp32 step must not show) */
    double r = ref_fop(op, x, y);
    store_f(dt, out, dt == TUTTI_FP64 || is_fp8(dt) ? r : (float)r);
}

/* Same element? Bitwise, except that any NaN matches any NaN. */
static int elem_equal(tutti_dtype_t dt, const void *got, const void *want)
{
    if (is_complex(dt)) { /* part by part */
        size_t h = dsize[dt] / 2;
        return elem_equal(part_of(dt), got, want) &&
               elem_equal(part_of(dt), (const char *)got + h, (const char *)want + h);
    }
    if (is_pair(dt)) { /* value and index: not the padding, which either operand gives */
        pair_t g = load_pair(dt, got), w = load_pair(dt, want);
        return g.i == w.i && (w.nan ? g.nan : !g.nan && g.v == w.v);
    }
    if (is_float(dt) && isnan(load_f(dt, want)))
        return isnan(load_f(dt, got));
    return memcmp(got, want, dsize[dt]) == 0;
}

static void elem_hex(char *buf, size_t len, tutti_dtype_t dt, const void *p)
{
    const unsigned char *b = p;
    size_t n = 0;
    buf[0] = 0;
    for (size_t i = dsize[dt]; i-- > 0 && n + 3 < len;)
        n += (size_t)snprintf(buf + n, len - n, "%02x", b[i]);
}

/* Index of the first of n elements where got differs from want (elem_equal), or n;
 * that element's hex forms in g and w (20 bytes each). */
static size_t first_diff(tutti_dtype_t dt, const unsigned char *got, const unsigned char *want,
                         size_t n, char *g, char *w)
{
    size_t es = dsize[dt], i = 0;
    while (i < n && elem_equal(dt, got + i * es, want + i * es))
        i++;
    if (i < n) {
        elem_hex(g, 20, dt, got + i * es);
        elem_hex(w, 20, dt, want + i * es);
    }
    return i;
}

/* ---- test data ----------------------------------------------------------------- */

static const float f32_specials[] = { 0.0f,   -0.0f,   INFINITY,      -INFINITY, NAN,  -NAN,
                                      1e-40f, -1e-45f, 3.4028235e38f, 1.0f,      -1.0f };

static void fill_random(tutti_dtype_t dt, void *buf, size_t n)
{
    if (is_complex(dt)) { /* parts as fp32/fp64 values: specials and NaNs included */
        fill_random(part_of(dt), buf, 2 * n);
        return;
    }
    if (is_pair(dt)) { /* values from few (ties), with NaNs and -0 for the floats; indexes
                          from few too (ties of both), negative ones included; padding
                          random */
        unsigned char *q = buf;
        for (size_t i = 0; i < n; i++, q += dsize[dt]) {
            uint64_t r = rng(), pad = rng();
            memcpy(q, &pad, 8);
            if (dsize[dt] == 16)
                memcpy(q + 8, &r, 8);
            int32_t idx = (int32_t)((r >> 8) % 7) - 2;
            int v = (int)(r % 9) - 4;
            size_t ioff = dsize[dt] == 16 ? 8 : 4;
            if (dt == TUTTI_FLOAT_INT || dt == TUTTI_DOUBLE_INT) {
                double d = (r >> 16) % 16 == 0 ? NAN : (r >> 16) % 16 == 1 ? -0.0 : v * 0.5;
                if (dt == TUTTI_FLOAT_INT) {
                    float f = (float)d;
                    memcpy(q, &f, 4);
                } else {
                    memcpy(q, &d, 8);
                }
            } else if (dt == TUTTI_LONG_INT) {
                int64_t x = (int64_t)v * (1ll << 40) + ((r >> 20) % 2); /* past double's 53 */
                x = (r >> 24) % 2 ? x + (1ll << 62) : x;
                memcpy(q, &x, 8);
            } else if (dt == TUTTI_2INT) {
                int32_t x = v * 100000;
                memcpy(q, &x, 4);
            } else {
                int16_t x = (int16_t)(v * 1000);
                memcpy(q, &x, 2);
            }
            memcpy(q + ioff, &idx, 4);
        }
        return;
    }
    unsigned char *p = buf;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng();
        switch (dt) {
        case TUTTI_FP32:
        case TUTTI_FP64: {
            unsigned kind = (unsigned)(r >> 56);
            uint32_t u = (uint32_t)r;
            if (kind >= 20 && kind < 60) /* any bits, NaNs included */
                memcpy(p + i * dsize[dt], dt == TUTTI_FP32 ? (void *)&u : (void *)&r, dsize[dt]);
            else if (kind < 20)
                store_f(dt, p + i * dsize[dt],
                        f32_specials[(r >> 8) % (sizeof(f32_specials) / sizeof(f32_specials[0]))]);
            else
                store_f(dt, p + i * dsize[dt],
                        dt == TUTTI_FP32 ? (double)(int32_t)u / 65536.0
                                         : (double)(int64_t)r / 0x1p40);
            break;
        }
        case TUTTI_FP16:
        case TUTTI_BF16: {
            uint16_t h = (uint16_t)r;
            if ((r >> 40) % 4 != 0) /* mostly moderate magnitudes so sums stay finite */
                h = dt == TUTTI_FP16 ? (uint16_t)((h & 0x83ff) | (((r >> 20) % 12 + 9) << 10))
                                     : (uint16_t)((h & 0x807f) | (((r >> 20) % 30 + 112) << 7));
            memcpy(p + i * 2, &h, 2);
            break;
        }
        case TUTTI_FP8_E4M3:
        case TUTTI_FP8_E5M2: {
            uint8_t b = (uint8_t)r; /* any code; half of them of middling exponent */
            if ((r >> 40) % 2)
                b = dt == TUTTI_FP8_E4M3 ? (uint8_t)((b & 0x87) | (((r >> 20) % 6 + 4) << 3))
                                         : (uint8_t)((b & 0x83) | (((r >> 20) % 12 + 9) << 2));
            p[i] = b;
            break;
        }
        default: /* any bits, a quarter of them 0 (the logical ops' false) */
            if (r >> 62 == 0)
                r = 0;
            memcpy(p + i * dsize[dt], &r, dsize[dt]);
        }
    }
}

/* A buffer of n elements at a byte offset from an 8-aligned base, with guard bytes. */
typedef struct gbuf {
    unsigned char *base;
    unsigned char *p;
    size_t bytes;
} gbuf_t;

static void gbuf_init(gbuf_t *g, size_t bytes, size_t offset)
{
    g->bytes = bytes;
    g->base = malloc(bytes + 2 * GUARD + 8);
    ck_assert_ptr_nonnull(g->base);
    memset(g->base, GUARD_BYTE, bytes + 2 * GUARD + 8);
    g->p = g->base + GUARD + offset;
}

static void gbuf_check(const gbuf_t *g, const char *what)
{
    size_t off = (size_t)(g->p - g->base);
    size_t total = g->bytes + 2 * GUARD + 8;
    for (size_t i = 0; i < off; i++)
        if (g->base[i] != GUARD_BYTE)
            ck_abort_msg("%s: byte %zu before the buffer overwritten", what, off - i);
    for (size_t i = off + g->bytes; i < total; i++)
        if (g->base[i] != GUARD_BYTE)
            ck_abort_msg("%s: byte %zu after the buffer overwritten", what, i - off - g->bytes);
}

static void gbuf_free(gbuf_t *g)
{
    free(g->base);
}

/* Runs tt_reduce or tt_reduce3 and compares every element with the reference.
 * alias: 0 distinct buffers, 1 dst == a, 2 dst == b, 3 a == b, 4 dst == a == b,
 * -1 tt_reduce(dst, src), -2 tt_reduce(dst, dst). */
static void check_one(tutti_dtype_t dt, tutti_redop_t op, size_t n, size_t doff, size_t aoff,
                      size_t boff, int alias)
{
    size_t es = dsize[dt], bytes = n * es;
    gbuf_t d, a, b;
    gbuf_init(&d, bytes, doff);
    gbuf_init(&a, bytes, aoff);
    gbuf_init(&b, bytes, boff);
    fill_random(dt, a.p, n);
    fill_random(dt, b.p, n);
    fill_random(dt, d.p, n);
    if (alias == 3 || alias == 4 || alias == -2)
        memcpy(b.p, a.p, bytes);
    if (alias == -1 || alias == 1 || alias == 4 || alias == -2)
        memcpy(d.p, a.p, bytes);
    if (alias == 2)
        memcpy(d.p, b.p, bytes);

    unsigned char *want = malloc(bytes + 1);
    ck_assert_ptr_nonnull(want);
    for (size_t i = 0; i < n; i++)
        ref_elem(dt, op, want + i * es, a.p + i * es, b.p + i * es);

    if (alias < 0) {
        tt_reduce(d.p, alias == -1 ? b.p : d.p, n, dt, op);
    } else {
        unsigned char *s1 = alias == 1 || alias == 4 ? d.p : a.p;
        unsigned char *s2 = alias == 2 || alias == 4 ? d.p : alias == 3 ? a.p : b.p;
        tt_reduce3(d.p, s1, s2, n, dt, op);
    }

    char g[20], w[20], x[20], y[20];
    size_t i = first_diff(dt, d.p, want, n, g, w);
    if (i < n) {
        elem_hex(x, sizeof(x), dt, a.p + i * es);
        elem_hex(y, sizeof(y), dt, b.p + i * es);
        ck_abort_msg("%s %s n=%zu offsets %zu/%zu/%zu alias %d [%zu]: %s op %s gave %s, "
                     "want %s",
                     tutti_dtype_name(dt), tutti_redop_name(op), n, doff, aoff, boff, alias, i, x,
                     y, g, w);
    }
    gbuf_check(&d, "dst");
    gbuf_check(&a, "a");
    gbuf_check(&b, "b");
    free(want);
    gbuf_free(&d);
    gbuf_free(&a);
    gbuf_free(&b);
}

/* ---- names --------------------------------------------------------------------- */

START_TEST(test_dtype_names)
{
    static const char *const names[] = {
        "i8",     "u8",     "i32",       "i64",        "f16",      "bf16", "f32",
        "f64",    "i16",    "u16",       "u32",        "u64",      "c64",  "c128",
        "f8e4m3", "f8e5m2", "float_int", "double_int", "long_int", "2int", "short_int"
    };
    ck_assert_int_eq(TUTTI_DTYPE_COUNT, sizeof(names) / sizeof(names[0]));
    for (int i = 0; i < TUTTI_DTYPE_COUNT; i++) {
        tutti_dtype_t dt = TUTTI_DTYPE_COUNT;
        ck_assert_str_eq(tutti_dtype_name((tutti_dtype_t)i), names[i]);
        ck_assert_uint_eq(tutti_dtype_size((tutti_dtype_t)i), dsize[i]);
        ck_assert_int_eq(tutti_dtype_parse(names[i], &dt), TUTTI_OK);
        ck_assert_int_eq(dt, i);
    }
    static const struct {
        const char *name;
        tutti_dtype_t dt;
    } aliases[] = {
        { "int8", TUTTI_INT8 },
        { "uint8", TUTTI_UINT8 },
        { "int32", TUTTI_INT32 },
        { "int", TUTTI_INT32 },
        { "int64", TUTTI_INT64 },
        { "long", TUTTI_INT64 },
        { "half", TUTTI_FP16 },
        { "float16", TUTTI_FP16 },
        { "fp16", TUTTI_FP16 },
        { "bfloat16", TUTTI_BF16 },
        { "float", TUTTI_FP32 },
        { "float32", TUTTI_FP32 },
        { "fp32", TUTTI_FP32 },
        { "double", TUTTI_FP64 },
        { "float64", TUTTI_FP64 },
        { "fp64", TUTTI_FP64 },
        { "FP32", TUTTI_FP32 },
        { "Float", TUTTI_FP32 },
        { "BF16", TUTTI_BF16 },
        { "int16", TUTTI_INT16 },
        { "short", TUTTI_INT16 },
        { "uint16", TUTTI_UINT16 },
        { "uint32", TUTTI_UINT32 },
        { "UInt64", TUTTI_UINT64 },
        { "complex64", TUTTI_COMPLEX64 },
        { "cfloat", TUTTI_COMPLEX64 },
        { "complex128", TUTTI_COMPLEX128 },
        { "cdouble", TUTTI_COMPLEX128 },
        { "Complex", TUTTI_COMPLEX128 },
        { "float8_e4m3fn", TUTTI_FP8_E4M3 },
        { "float8_e5m2", TUTTI_FP8_E5M2 },
        { "fp8_e4m3", TUTTI_FP8_E4M3 },
        { "FP8_E5M2", TUTTI_FP8_E5M2 },
        { "e4m3", TUTTI_FP8_E4M3 },
        { "E5M2", TUTTI_FP8_E5M2 },
        { "f32_i32", TUTTI_FLOAT_INT },
        { "F64_I32", TUTTI_DOUBLE_INT },
        { "i64_i32", TUTTI_LONG_INT },
        { "i32_i32", TUTTI_2INT },
        { "i16_i32", TUTTI_SHORT_INT },
        { "FLOAT_INT", TUTTI_FLOAT_INT },
    };
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++) {
        tutti_dtype_t dt = TUTTI_DTYPE_COUNT;
        ck_assert_msg(tutti_dtype_parse(aliases[i].name, &dt) == TUTTI_OK, "%s", aliases[i].name);
        ck_assert_msg(dt == aliases[i].dt, "%s -> %d", aliases[i].name, dt);
    }
    static const char *const bad[] = { "",     "f31", "float128", "i128",   "f32 ",
                                       " f32", "bf",  "fp",       "u128",   "uint",
                                       "f8",   "fp8", "e4m4",     "float8", "float8_e4m3" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tutti_dtype_t dt = TUTTI_FP64;
        ck_assert_int_eq(tutti_dtype_parse(bad[i], &dt), TUTTI_ERR_INVALID_ARG);
        ck_assert_int_eq(dt, TUTTI_FP64); /* untouched on failure */
    }
    tutti_dtype_t dt;
    ck_assert_int_eq(tutti_dtype_parse(NULL, &dt), TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(tutti_dtype_parse("f32", NULL), TUTTI_ERR_INVALID_ARG);
    ck_assert_str_eq(tutti_dtype_name(TUTTI_DTYPE_COUNT), "?");
    ck_assert_str_eq(tutti_dtype_name((tutti_dtype_t)-1), "?");
    ck_assert_uint_eq(tutti_dtype_size(TUTTI_DTYPE_COUNT), 0);
    ck_assert_uint_eq(tutti_dtype_size((tutti_dtype_t)-1), 0);
}
END_TEST

START_TEST(test_redop_names)
{
    static const char *const names[] = { "sum",  "prod",   "min",    "max",  "avg", "band", "bor",
                                         "bxor", "minloc", "maxloc", "land", "lor", "lxor" };
    ck_assert_int_eq(TUTTI_REDOP_COUNT, sizeof(names) / sizeof(names[0]));
    for (int i = 0; i < TUTTI_REDOP_COUNT; i++) {
        tutti_redop_t op = TUTTI_REDOP_COUNT;
        ck_assert_str_eq(tutti_redop_name((tutti_redop_t)i), names[i]);
        ck_assert_int_eq(tutti_redop_parse(names[i], &op), TUTTI_OK);
        ck_assert_int_eq(op, i);
    }
    tutti_redop_t op = TUTTI_REDOP_COUNT;
    ck_assert_int_eq(tutti_redop_parse("SUM", &op), TUTTI_OK);
    ck_assert_int_eq(op, TUTTI_SUM);
    ck_assert_int_eq(tutti_redop_parse("bitwise_and", &op), TUTTI_OK);
    ck_assert_int_eq(op, TUTTI_BAND);
    ck_assert_int_eq(tutti_redop_parse("BOR", &op), TUTTI_OK);
    ck_assert_int_eq(op, TUTTI_BOR);
    ck_assert_int_eq(tutti_redop_parse("bitwise_xor", &op), TUTTI_OK);
    ck_assert_int_eq(op, TUTTI_BXOR);
    ck_assert_int_eq(tutti_redop_parse("logical_or", &op), TUTTI_OK);
    ck_assert_int_eq(op, TUTTI_LOR);
    static const char *const bad[] = { "", "sums", "su", "minimum", "avg ", "xor", "and" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        op = TUTTI_MAX;
        ck_assert_int_eq(tutti_redop_parse(bad[i], &op), TUTTI_ERR_INVALID_ARG);
        ck_assert_int_eq(op, TUTTI_MAX);
    }
    ck_assert_int_eq(tutti_redop_parse(NULL, &op), TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(tutti_redop_parse("sum", NULL), TUTTI_ERR_INVALID_ARG);
    ck_assert_str_eq(tutti_redop_name(TUTTI_REDOP_COUNT), "?");
    ck_assert_str_eq(tutti_redop_name((tutti_redop_t)-1), "?");
}
END_TEST

/* Every op reduces every integer dtype; the bitwise ops no float dtype; nothing out of
 * range is supported. */
START_TEST(test_redop_supported)
{
    for (int op = 0; op < TUTTI_REDOP_COUNT; op++)
        for (int dt = 0; dt < TUTTI_DTYPE_COUNT; dt++) {
            int loc = op == TUTTI_MINLOC || op == TUTTI_MAXLOC;
            int want = !(is_bitwise((tutti_redop_t)op) && is_float((tutti_dtype_t)dt)) && !loc;
            if (is_complex((tutti_dtype_t)dt)) /* MPI's rule: no order, no bits */
                want = op == TUTTI_SUM || op == TUTTI_PROD || op == TUTTI_AVG;
            if (is_pair((tutti_dtype_t)dt)) /* and the pairs for MINLOC/MAXLOC only */
                want = loc;
            ck_assert_msg(tutti_redop_supported((tutti_redop_t)op, (tutti_dtype_t)dt) == want,
                          "%s %s: want %d", tutti_redop_name((tutti_redop_t)op),
                          tutti_dtype_name((tutti_dtype_t)dt), want);
        }
    ck_assert_int_eq(tutti_redop_supported(TUTTI_REDOP_COUNT, TUTTI_INT32), 0);
    ck_assert_int_eq(tutti_redop_supported((tutti_redop_t)-1, TUTTI_INT32), 0);
    ck_assert_int_eq(tutti_redop_supported(TUTTI_SUM, TUTTI_DTYPE_COUNT), 0);
    ck_assert_int_eq(tutti_redop_supported(TUTTI_BAND, (tutti_dtype_t)-1), 0);
}
END_TEST

/* ---- kernels against the reference --------------------------------------------- */

/* The kernel sweeps, each a loop test over dtypes (i): every op and length, at offsets
 * and aliasings of its own. */
typedef enum {
    SW_REDUCE,  /* tt_reduce(dst, src) at a spread of unaligned offsets */
    SW_REDUCE3, /* tt_reduce3 with every aliasing */
    SW_SELF,    /* tt_reduce(dst, dst) */
} sweep_t;

static void sweep(sweep_t w, int i)
{
    tutti_dtype_t dt = (tutti_dtype_t)i;
    rng_seed(100 * (uint64_t)(w + 1) + (uint64_t)i);
    const int variants = w == SW_REDUCE ? 8 : w == SW_REDUCE3 ? 5 : 1;
    for (int op = 0; op < TUTTI_REDOP_COUNT; op++)
        for (size_t l = 0; l < NLENGTHS && tutti_redop_supported((tutti_redop_t)op, dt); l++)
            for (int v = 0; v < variants; v++) {
                size_t d = (size_t)v, a = 0, b = (d * 5 + 3) % 8;
                int alias = -1;
                if (w == SW_REDUCE3) {
                    d = (l + (size_t)v) % 8, a = (d + 1) % 8, b = (d + 6) % 8;
                    alias = v;
                } else if (w == SW_SELF) {
                    d = l % 8, a = (l + 3) % 8, b = 0;
                    alias = -2;
                }
                check_one(dt, (tutti_redop_t)op, lengths[l], d, a, b, alias);
            }
}

START_TEST(test_reduce_vs_reference)
{
    sweep(SW_REDUCE, _i);
}
END_TEST

START_TEST(test_reduce3_vs_reference)
{
    sweep(SW_REDUCE3, _i);
}
END_TEST

START_TEST(test_reduce_self)
{
    sweep(SW_SELF, _i);
}
END_TEST

/* ---- AVG ----------------------------------------------------------------------- */

static void ref_div(tutti_dtype_t dt, void *p, int n)
{
    if (is_complex(dt)) {
        ref_div(part_of(dt), p, n);
        ref_div(part_of(dt), (char *)p + dsize[dt] / 2, n);
        return;
    }
    if (dt == TUTTI_UINT64) {
        store_int(dt, p, (int64_t)((uint64_t)load_int(dt, p) / (uint64_t)n));
        return;
    }
    if (!is_float(dt)) {
        __int128 w = load_int(dt, p);
        store_int(dt, p, (int64_t)(w < 0 ? -(-w / n) : w / n));
        return;
    }
    double v = load_f(dt, p) / n;
    store_f(dt, p, dt == TUTTI_FP64 || is_fp8(dt) ? v : (float)v);
}

START_TEST(test_avg)
{
    tutti_dtype_t dt = (tutti_dtype_t)_i;
    size_t es = dsize[dt];
    if (!tutti_redop_supported(TUTTI_AVG, dt)) /* (the pairs) */
        return;
    static const int nranks[] = { 1, 2, 3, 5, 8, 1000 };
    rng_seed(400 + (uint64_t)_i);
    for (size_t r = 0; r < sizeof(nranks) / sizeof(nranks[0]); r++) {
        for (size_t l = 0; l < NLENGTHS; l++) {
            size_t n = lengths[l], bytes = n * es, off = (r + l) % 8;
            gbuf_t d, s;
            gbuf_init(&d, bytes, off);
            gbuf_init(&s, bytes, (off + 3) % 8);
            fill_random(dt, d.p, n);
            fill_random(dt, s.p, n);
            unsigned char *want = malloc(bytes + 1);
            for (size_t i = 0; i < n; i++) {
                ref_elem(dt, TUTTI_SUM, want + i * es, d.p + i * es, s.p + i * es);
                if (nranks[r] > 1)
                    ref_div(dt, want + i * es, nranks[r]);
            }
            tt_reduce(d.p, s.p, n, dt, TUTTI_AVG);
            tt_reduce_avg_finish(d.p, n, dt, nranks[r]);
            char g[20], w[20];
            size_t i = first_diff(dt, d.p, want, n, g, w);
            if (i < n)
                ck_abort_msg("avg %s n=%zu nranks=%d [%zu]: got %s want %s", tutti_dtype_name(dt),
                             n, nranks[r], i, g, w);
            gbuf_check(&d, "avg");
            free(want);
            gbuf_free(&d);
            gbuf_free(&s);
        }
    }
}
END_TEST

START_TEST(test_avg_cases)
{
    int32_t i32[] = { -7, 7, -1, 1, INT32_MIN, INT32_MAX };
    tt_reduce_avg_finish(i32, 6, TUTTI_INT32, 2);
    ck_assert_int_eq(i32[0], -3); /* truncation toward zero */
    ck_assert_int_eq(i32[1], 3);
    ck_assert_int_eq(i32[2], 0);
    ck_assert_int_eq(i32[3], 0);
    ck_assert_int_eq(i32[4], INT32_MIN / 2);
    ck_assert_int_eq(i32[5], INT32_MAX / 2);
    int64_t i64[] = { INT64_MIN, -9 };
    tt_reduce_avg_finish(i64, 2, TUTTI_INT64, 3);
    ck_assert(i64[0] == INT64_MIN / 3 && i64[1] == -3);
    int8_t i8[] = { -128, 127, -5 };
    tt_reduce_avg_finish(i8, 3, TUTTI_INT8, 4);
    ck_assert(i8[0] == -32 && i8[1] == 31 && i8[2] == -1);
    uint8_t u8[] = { 255, 200, 2 };
    tt_reduce_avg_finish(u8, 3, TUTTI_UINT8, 3);
    ck_assert(u8[0] == 85 && u8[1] == 66 && u8[2] == 0);
    float f[] = { 3.0f, -1.0f, INFINITY };
    tt_reduce_avg_finish(f, 3, TUTTI_FP32, 4);
    ck_assert(f[0] == 0.75f && f[1] == -0.25f && isinf(f[2]));
    uint16_t h[] = { 0x4200 /* 3.0 */, 0x0001 /* 2^-24 */ };
    tt_reduce_avg_finish(h, 2, TUTTI_FP16, 2);
    ck_assert_uint_eq(h[0], 0x3e00); /* 1.5 */
    ck_assert_uint_eq(h[1], 0x0000); /* 2^-25: tie, to even */
    uint16_t bf[] = { 0x4040 /* 3.0 */ };
    tt_reduce_avg_finish(bf, 1, TUTTI_BF16, 2);
    ck_assert_uint_eq(bf[0], 0x3fc0);
    /* nranks < 1 and invalid dtypes leave the buffer alone */
    int32_t keep[] = { 10, -10 };
    tt_reduce_avg_finish(keep, 2, TUTTI_INT32, 0);
    tt_reduce_avg_finish(keep, 2, TUTTI_INT32, -3);
    tt_reduce_avg_finish(keep, 2, TUTTI_DTYPE_COUNT, 2);
    ck_assert(keep[0] == 10 && keep[1] == -10);
    tt_reduce_avg_finish(NULL, 0, TUTTI_FP32, 2);
}
END_TEST

/* ---- integer wraparound and float specials -------------------------------------- */

START_TEST(test_int_wrap)
{
    int8_t a8[] = { 127, -128, -128, 64, -1 }, b8[] = { 1, -1, -1, 2, -1 };
    tt_reduce(a8, b8, 2, TUTTI_INT8, TUTTI_SUM);
    tt_reduce(a8 + 2, b8 + 2, 3, TUTTI_INT8, TUTTI_PROD);
    ck_assert(a8[0] == -128 && a8[1] == 127 && a8[2] == -128 && a8[3] == -128 && a8[4] == 1);
    uint8_t u8[] = { 255, 16, 0 }, v8[] = { 1, 16, 1 };
    tt_reduce(u8, v8, 1, TUTTI_UINT8, TUTTI_SUM);
    tt_reduce(u8 + 1, v8 + 1, 1, TUTTI_UINT8, TUTTI_PROD);
    ck_assert(u8[0] == 0 && u8[1] == 0);
    uint8_t m8[] = { 0, 255 }, n8[] = { 255, 0 };
    tt_reduce(m8, n8, 2, TUTTI_UINT8, TUTTI_MIN); /* unsigned compare */
    ck_assert(m8[0] == 0 && m8[1] == 0);
    int32_t a32[] = { INT32_MAX, INT32_MIN, 65536, INT32_MIN }, b32[] = { 1, -1, 65536, -1 };
    tt_reduce(a32, b32, 2, TUTTI_INT32, TUTTI_SUM);
    tt_reduce(a32 + 2, b32 + 2, 2, TUTTI_INT32, TUTTI_PROD);
    ck_assert(a32[0] == INT32_MIN && a32[1] == INT32_MAX && a32[2] == 0 && a32[3] == INT32_MIN);
    int64_t a64[] = { INT64_MAX, INT64_MIN, INT64_C(1) << 32, INT64_MIN, 3 };
    int64_t b64[] = { 1, -1, INT64_C(1) << 32, -1, INT64_MAX };
    tt_reduce(a64, b64, 2, TUTTI_INT64, TUTTI_SUM);
    tt_reduce(a64 + 2, b64 + 2, 3, TUTTI_INT64, TUTTI_PROD);
    ck_assert(a64[0] == INT64_MIN && a64[1] == INT64_MAX && a64[2] == 0 && a64[3] == INT64_MIN &&
              a64[4] == INT64_MAX - 2);
    int64_t c64[] = { INT64_MIN, -1 }, d64[] = { INT64_MAX, INT64_MIN };
    tt_reduce(c64, d64, 2, TUTTI_INT64, TUTTI_MAX);
    ck_assert(c64[0] == INT64_MAX && c64[1] == -1);
}
END_TEST

/* The later integer dtypes at their edges: 16-bit products past int's range (computed
 * in uint32_t, not in a promoted int), unsigned MIN/MAX above the sign bit, unsigned AVG. */
START_TEST(test_int_wrap_wide)
{
    int16_t a16[] = { INT16_MAX, -32768, -1 }, b16[] = { 1, -32768, INT16_MIN };
    tt_reduce(a16, b16, 1, TUTTI_INT16, TUTTI_SUM);
    tt_reduce(a16 + 1, b16 + 1, 2, TUTTI_INT16, TUTTI_PROD);
    ck_assert(a16[0] == INT16_MIN && a16[1] == 0 && a16[2] == INT16_MIN);
    uint16_t u16[] = { 65535, 65535, 7 }, v16[] = { 65535, 1, 65535 };
    tt_reduce(u16, v16, 1, TUTTI_UINT16, TUTTI_PROD);
    tt_reduce(u16 + 1, v16 + 1, 1, TUTTI_UINT16, TUTTI_SUM);
    tt_reduce(u16 + 2, v16 + 2, 1, TUTTI_UINT16, TUTTI_MAX);
    ck_assert(u16[0] == 1 && u16[1] == 0 && u16[2] == 65535);
    uint32_t u32[] = { 0x80000000u, 5 }, v32[] = { 1, 0xffffffffu };
    tt_reduce(u32, v32, 2, TUTTI_UINT32, TUTTI_MIN);
    ck_assert(u32[0] == 1 && u32[1] == 5);
    uint64_t u64[] = { UINT64_MAX, 1, UINT64_MAX - 1 }, v64[] = { 2, UINT64_C(1) << 63, 3 };
    tt_reduce(u64, v64, 1, TUTTI_UINT64, TUTTI_SUM);
    tt_reduce(u64 + 1, v64 + 1, 1, TUTTI_UINT64, TUTTI_MAX);
    tt_reduce(u64 + 2, v64 + 2, 1, TUTTI_UINT64, TUTTI_AVG);
    tt_reduce_avg_finish(u64 + 2, 1, TUTTI_UINT64, 2);
    ck_assert(u64[0] == 1 && u64[1] == UINT64_C(1) << 63 && u64[2] == 0);
    uint64_t w64[] = { UINT64_MAX - 1 };
    tt_reduce_avg_finish(w64, 1, TUTTI_UINT64, 2); /* as unsigned: not (-2) / 2 */
    ck_assert(w64[0] == UINT64_MAX / 2);
}
END_TEST

/* a op b through every float dtype; *_nan: the result must be NaN. */
static void check_float_case(tutti_redop_t op, double a, double b, double want)
{
    float fa = (float)a, fb = (float)b;
    float f32 = fa;
    tt_reduce(&f32, &fb, 1, TUTTI_FP32, op);
    double f64 = a;
    tt_reduce(&f64, &b, 1, TUTTI_FP64, op);
    uint16_t h = tt_float_to_half(fa), hb = tt_float_to_half(fb);
    tt_reduce(&h, &hb, 1, TUTTI_FP16, op);
    uint16_t bf = tt_float_to_bf16(fa), bfb = tt_float_to_bf16(fb);
    tt_reduce(&bf, &bfb, 1, TUTTI_BF16, op);
    double got[] = { f32, f64, tt_half_to_float(h), tt_bf16_to_float(bf) };
    static const char *const names[] = { "f32", "f64", "f16", "bf16" };
    for (int i = 0; i < 4; i++) {
        if (isnan(want))
            ck_assert_msg(isnan(got[i]), "%s %s(%g, %g) = %g, want NaN", names[i],
                          tutti_redop_name(op), a, b, got[i]);
        else
            ck_assert_msg(got[i] == want && !signbit(got[i]) == !signbit(want),
                          "%s %s(%g, %g) = %g, want %g", names[i], tutti_redop_name(op), a, b,
                          got[i], want);
    }
}

START_TEST(test_float_specials)
{
    check_float_case(TUTTI_SUM, INFINITY, -INFINITY, NAN);
    check_float_case(TUTTI_SUM, INFINITY, 1.0, INFINITY);
    check_float_case(TUTTI_SUM, -INFINITY, -INFINITY, -INFINITY);
    check_float_case(TUTTI_SUM, NAN, 1.0, NAN);
    check_float_case(TUTTI_SUM, 1.0, NAN, NAN);
    check_float_case(TUTTI_SUM, -0.0, -0.0, -0.0);
    check_float_case(TUTTI_SUM, -0.0, 0.0, 0.0);
    check_float_case(TUTTI_PROD, 0.0, INFINITY, NAN);
    check_float_case(TUTTI_PROD, -2.0, INFINITY, -INFINITY);
    check_float_case(TUTTI_PROD, -1.0, 0.0, -0.0);
    check_float_case(TUTTI_MIN, NAN, 1.0, NAN);
    check_float_case(TUTTI_MIN, 1.0, NAN, NAN);
    check_float_case(TUTTI_MIN, NAN, NAN, NAN);
    check_float_case(TUTTI_MIN, -INFINITY, NAN, NAN);
    check_float_case(TUTTI_MAX, NAN, -1.0, NAN);
    check_float_case(TUTTI_MAX, -1.0, NAN, NAN);
    check_float_case(TUTTI_MAX, INFINITY, NAN, NAN);
    check_float_case(TUTTI_MIN, -INFINITY, 5.0, -INFINITY);
    check_float_case(TUTTI_MIN, 5.0, -INFINITY, -INFINITY);
    check_float_case(TUTTI_MAX, INFINITY, 5.0, INFINITY);
    check_float_case(TUTTI_MAX, -INFINITY, INFINITY, INFINITY);
    check_float_case(TUTTI_MIN, 2.0, -3.0, -3.0);
    check_float_case(TUTTI_MAX, 2.0, -3.0, 2.0);
    /* equal operands: the second one (documented in lib/reduce/reduce.c) */
    check_float_case(TUTTI_MIN, 0.0, -0.0, -0.0);
    check_float_case(TUTTI_MIN, -0.0, 0.0, 0.0);
    check_float_case(TUTTI_MAX, 0.0, -0.0, -0.0);
    check_float_case(TUTTI_MAX, -0.0, 0.0, 0.0);
    /* overflow of fp16 in fp32 arithmetic rounds to inf when stored back */
    uint16_t h = 0x7bff, hb = 0x7bff; /* 65504 + 65504 */
    tt_reduce(&h, &hb, 1, TUTTI_FP16, TUTTI_SUM);
    ck_assert_uint_eq(h, 0x7c00);
}
END_TEST

/* The same NaN/special rules hold inside vector bodies, not only in tails: a long
 * buffer with specials at every position. */
START_TEST(test_float_specials_vector)
{
    static const tutti_dtype_t dts[] = { TUTTI_FP16, TUTTI_BF16,     TUTTI_FP32,
                                         TUTTI_FP64, TUTTI_FP8_E4M3, TUTTI_FP8_E5M2 };
    for (size_t t = 0; t < sizeof(dts) / sizeof(dts[0]); t++)
        for (int op = 0; op <= TUTTI_AVG; op++) { /* the float ops */
            rng_seed(500 + t * 10 + (uint64_t)op);
            for (int alias = -1; alias <= 2; alias++)
                check_one(dts[t], (tutti_redop_t)op, 4097, 1, 2, 5, alias);
        }
}
END_TEST

START_TEST(test_invalid_args)
{
    int32_t a[] = { 1, 2 }, b[] = { 3, 4 };
    tt_reduce(a, b, 2, TUTTI_DTYPE_COUNT, TUTTI_SUM);
    tt_reduce(a, b, 2, (tutti_dtype_t)-1, TUTTI_SUM);
    tt_reduce(a, b, 2, TUTTI_INT32, TUTTI_REDOP_COUNT);
    tt_reduce(a, b, 2, TUTTI_INT32, (tutti_redop_t)-1);
    tt_reduce3(a, a, b, 2, TUTTI_DTYPE_COUNT, TUTTI_SUM);
    tt_reduce3(a, a, b, 2, TUTTI_INT32, TUTTI_REDOP_COUNT);
    ck_assert(a[0] == 1 && a[1] == 2);
    /* a bitwise op has no float kernel: nothing is written (the API refuses it first) */
    float f[] = { 1.5f, -2.0f }, g[] = { 3.0f, 4.0f };
    for (int op = TUTTI_BAND; op <= TUTTI_BXOR; op++) {
        tt_reduce(f, g, 2, TUTTI_FP32, (tutti_redop_t)op);
        tt_reduce(f, f, 2, TUTTI_FP32, (tutti_redop_t)op);
        tt_reduce3(f, f, g, 2, TUTTI_FP32, (tutti_redop_t)op);
        tt_reduce3(f, g, g, 2, TUTTI_FP32, (tutti_redop_t)op);
    }
    ck_assert(f[0] == 1.5f && f[1] == -2.0f);
    tt_reduce(NULL, NULL, 0, TUTTI_FP32, TUTTI_SUM);
    tt_reduce3(NULL, NULL, NULL, 0, TUTTI_FP16, TUTTI_MAX);
}
END_TEST

/* fp8 at its edges: a op b on one element of dtype dt (codes), the code wanted (any NaN
 * code matches a NaN). */
static void check_fp8_case(tutti_dtype_t dt, tutti_redop_t op, uint8_t a, uint8_t b, uint8_t want)
{
    uint8_t d = a, src = b, out = 0;
    tt_reduce(&d, &src, 1, dt, op);
    tt_reduce3(&out, &a, &b, 1, dt, op);
    int nan = isnan(ref_fp8_to_d(dt, want));
    for (int k = 0; k < 2; k++) {
        uint8_t got = k ? out : d;
        ck_assert_msg(nan ? isnan(ref_fp8_to_d(dt, got)) : got == want,
                      "%s %s(%02x, %02x) = %02x, want %02x (%s)", tutti_dtype_name(dt),
                      tutti_redop_name(op), a, b, got, want, k ? "reduce3" : "reduce");
    }
}

START_TEST(test_fp8_specials)
{
    const tutti_dtype_t e4 = TUTTI_FP8_E4M3, e5 = TUTTI_FP8_E5M2;
    /* E4M3: 448 (0x7e) is the largest; 0x7f NaN; sums past it saturate */
    check_fp8_case(e4, TUTTI_SUM, 0x7e, 0x7e, 0x7e);  /* 448 + 448 */
    check_fp8_case(e4, TUTTI_SUM, 0x7e, 0x58, 0x7e);  /* 448 + 16 = 464: tie, to 448 */
    check_fp8_case(e4, TUTTI_SUM, 0xfe, 0xfe, 0xfe);  /* -448 - 448 */
    check_fp8_case(e4, TUTTI_PROD, 0x7e, 0xc0, 0xfe); /* 448 * -2 */
    check_fp8_case(e4, TUTTI_SUM, 0x7f, 0x38, 0x7f);  /* NaN + 1 */
    check_fp8_case(e4, TUTTI_SUM, 0x01, 0x01, 0x02);  /* 2^-9 + 2^-9, subnormal */
    check_fp8_case(e4, TUTTI_PROD, 0x01, 0x30, 0x00); /* 2^-9 * 0.5: tie, to 0 */
    check_fp8_case(e4, TUTTI_PROD, 0x81, 0x30, 0x80); /* to -0 */
    check_fp8_case(e4, TUTTI_SUM, 0x38, 0x18, 0x38);  /* 1 + 0.0625: tie, to 1 */
    check_fp8_case(e4, TUTTI_SUM, 0x38, 0x19, 0x39);  /* 1 + 0.0703125: past it, up */
    check_fp8_case(e4, TUTTI_SUM, 0x38, 0x20, 0x39);  /* 1 + 0.125 = 1.125 */
    check_fp8_case(e4, TUTTI_MAX, 0x7f, 0x38, 0x7f);  /* NaN propagates */
    check_fp8_case(e4, TUTTI_MIN, 0x38, 0xff, 0xff);
    check_fp8_case(e4, TUTTI_MIN, 0x38, 0xb8, 0xb8); /* min(1, -1) */
    check_fp8_case(e4, TUTTI_MAX, 0x00, 0x80, 0x80); /* +0, -0 equal: the second */
    /* E5M2: 57344 (0x7b) the largest, 0x7c inf, 0x7d-0x7f NaN */
    check_fp8_case(e5, TUTTI_SUM, 0x7b, 0x7b, 0x7b); /* 57344 * 2 saturates */
    check_fp8_case(e5, TUTTI_SUM, 0x7c, 0x3c, 0x7b); /* inf + 1: saturated, as NCCL's */
    check_fp8_case(e5, TUTTI_SUM, 0x7c, 0xfc, 0x7e); /* inf - inf: NaN */
    check_fp8_case(e5, TUTTI_MAX, 0x7c, 0x3c, 0x7c); /* max returns the operand: inf */
    check_fp8_case(e5, TUTTI_MIN, 0xfc, 0x3c, 0xfc); /* -inf */
    check_fp8_case(e5, TUTTI_SUM, 0x7b, 0x6c, 0x7b); /* 57344 + 4096 = 61440: to 57344 */
    check_fp8_case(e5, TUTTI_SUM, 0x01, 0x01, 0x02); /* 2^-16 + 2^-16 */
    check_fp8_case(e5, TUTTI_SUM, 0x3c, 0x30, 0x3c); /* 1 + 0.125: tie, to 1 */
    check_fp8_case(e5, TUTTI_SUM, 0x3c, 0x31, 0x3d); /* 1 + 0.15625: past it, up */
    check_fp8_case(e5, TUTTI_SUM, 0x7e, 0x3c, 0x7e); /* NaN + 1 */
    /* AVG's division: 448 / 2 and inf / 2 (saturated first by the sum's store) */
    uint8_t q[] = { 0x7e, 0x39 }; /* 448, 1.125 */
    tt_reduce_avg_finish(q, 2, e4, 2);
    ck_assert_msg(q[0] == 0x76 && q[1] == 0x31, "e4m3 avg: %02x %02x", q[0], q[1]); /* 224,
                                                                         0.5625 */
    uint8_t r[] = { 0x7b, 0x01 };
    tt_reduce_avg_finish(r, 2, e5, 2);
    ck_assert_msg(r[0] == 0x77 && r[1] == 0x00, "e5m2 avg: %02x %02x", r[0], r[1]); /* 28672,
                                                                    2^-17: tie, to 0 */
}
END_TEST

/* Every fp8 code decodes to the value its format defines, and floats (a sweep through
 * every binade, the codes' values and the midpoints between them) round to the nearest
 * code, ties to even, saturating past the largest finite value. */
START_TEST(test_fp8_conversions)
{
    static const tutti_dtype_t dts[] = { TUTTI_FP8_E4M3, TUTTI_FP8_E5M2 };
    for (int t = 0; t < 2; t++) {
        tutti_dtype_t dt = dts[t];
        for (int c = 0; c < 256; c++) {
            double want = ref_fp8_to_d(dt, (uint8_t)c);
            float got = tt_fp8_to_float((uint8_t)c, dt);
            if (isnan(want) ? !isnan(got)
                            : ((double)got != want || !signbit(got) != !signbit(want)))
                ck_abort_msg("%s %02x -> %a, want %a", tutti_dtype_name(dt), c, (double)got, want);
            /* the code's value, and halfway to the next one up, and a hair either side */
            if (isnan(want) || isinf(want))
                continue;
            double next = ref_fp8_to_d(dt, (uint8_t)(c + 1));
            double mids[] = { want, (want + next) / 2, nextafter((want + next) / 2, 0),
                              nextafter((want + next) / 2, INFINITY) };
            for (int m = 0; m < 4; m++) {
                if (!isfinite(mids[m]) || (float)mids[m] != mids[m])
                    continue;
                uint8_t e = tt_float_to_fp8((float)mids[m], dt), w = ref_d_to_fp8(dt, mids[m]);
                if (e != w)
                    ck_abort_msg("%s: %a -> %02x, want %02x", tutti_dtype_name(dt), mids[m], e, w);
            }
        }
        for (uint64_t u = 0; u < (1ull << 32); u += 0x10001) {
            float x = bits_f32((uint32_t)u);
            uint8_t e = tt_float_to_fp8(x, dt), w = ref_d_to_fp8(dt, x);
            if (isnan(x) ? !isnan(ref_fp8_to_d(dt, e)) : e != w)
                ck_abort_msg("%s: float %08x -> %02x, want %02x", tutti_dtype_name(dt), (unsigned)u,
                             e, w);
        }
        ck_assert_uint_eq(tt_float_to_fp8(INFINITY, dt), t ? 0x7b : 0x7e);
        ck_assert_uint_eq(tt_float_to_fp8(-INFINITY, dt), t ? 0xfb : 0xfe);
        ck_assert_uint_eq(tt_float_to_fp8(-0.0f, dt), 0x80);
        ck_assert(isnan(ref_fp8_to_d(dt, tt_float_to_fp8(NAN, dt))));
    }
}
END_TEST

/* ---- fp16 and bf16 conversions ------------------------------------------------- */

START_TEST(test_half_exhaustive)
{
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = tt_half_to_float(h);
        double want = ref_h2d(h);
        if (half_is_nan(h)) {
            /* quiet NaN, sign and payload kept (what F16C's vcvtph2ps does) */
            uint32_t want_bits = (uint32_t)(h & 0x8000) << 16 | 0x7fc00000u |
                                 (uint32_t)(h & 0x3ff) << 13;
            if (f32_bits(f) != want_bits)
                ck_abort_msg("half NaN %04x -> %08x, want %08x", h, f32_bits(f), want_bits);
            uint16_t back = tt_float_to_half(f);
            if (!half_is_nan(back) || (back & 0x8000) != (h & 0x8000))
                ck_abort_msg("half NaN %04x came back as %04x", h, back);
            /* quieted, payload kept (what F16C does) */
            if (back != (h | 0x200))
                ck_abort_msg("half NaN %04x came back as %04x, want %04x", h, back, h | 0x200);
            continue;
        }
        if ((double)f != want || !signbit(f) != !signbit(want))
            ck_abort_msg("half %04x -> %a, want %a", h, (double)f, want);
        uint16_t back = tt_float_to_half(f);
        if (back != h)
            ck_abort_msg("half %04x -> %a -> %04x", h, (double)f, back);
    }
}
END_TEST

START_TEST(test_half_rounding)
{
    static const struct {
        float f;
        uint16_t h;
    } cases[] = {
        { 0.0f, 0x0000 },
        { -0.0f, 0x8000 },
        { 1.0f, 0x3c00 },
        { -2.0f, 0xc000 },
        { 65504.0f, 0x7bff },  /* largest finite */
        { 65519.99f, 0x7bff }, /* just below the overflow tie */
        { 65520.0f, 0x7c00 },  /* tie: 65504 is odd, rounds up to inf */
        { -65520.0f, 0xfc00 },
        { 1e10f, 0x7c00 },
        { 3.4028235e38f, 0x7c00 },
        { INFINITY, 0x7c00 },
        { -INFINITY, 0xfc00 },
        { 1.0f + 0x1p-11f, 0x3c00 },            /* tie between 1 and 1+2^-10: even (1) */
        { 1.0f + 3 * 0x1p-11f, 0x3c02 },        /* tie between 1+2^-10 and 1+2^-9: even (up) */
        { 1.0f + 0x1p-11f + 0x1p-20f, 0x3c01 }, /* just above a tie */
        { 0x1p-14f, 0x0400 },                   /* smallest normal */
        { 0x1p-14f - 0x1p-25f, 0x0400 },        /* tie between largest subnormal and it: even */
        { 0x1p-14f - 0x1p-24f, 0x03ff },        /* largest subnormal */
        { 0x1p-24f, 0x0001 },                   /* smallest subnormal */
        { 0x1p-25f, 0x0000 },                   /* tie between 0 and 2^-24: even (0) */
        { 0x1p-25f * 1.0001f, 0x0001 },         /* above the tie */
        { 3 * 0x1p-25f, 0x0002 },               /* tie between 1 and 2 units: even (2) */
        { 5 * 0x1p-25f, 0x0002 },               /* tie between 2 and 3 units: even (2) */
        { 0x1p-26f, 0x0000 },
        { -0x1p-26f, 0x8000 },
        { 1e-40f, 0x0000 }, /* fp32 subnormal */
        { -0x1p-24f, 0x8001 },
        { 2049.0f, 0x6800 }, /* tie between 2048 and 2050: even (2048) */
        { 2051.0f, 0x6802 }, /* tie between 2050 and 2052: even (2052) */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint16_t h = tt_float_to_half(cases[i].f);
        ck_assert_msg(h == cases[i].h, "float %a -> half %04x, want %04x", (double)cases[i].f, h,
                      cases[i].h);
        ck_assert_msg(ref_d2h(cases[i].f) == cases[i].h, "reference: %a", (double)cases[i].f);
    }
    /* NaN stays NaN, sign and top payload bits kept */
    ck_assert_uint_eq(tt_float_to_half(bits_f32(0x7fc00000)), 0x7e00);
    ck_assert_uint_eq(tt_float_to_half(bits_f32(0xffc00000)), 0xfe00);
    ck_assert_uint_eq(tt_float_to_half(bits_f32(0x7f800001)), 0x7e00); /* sNaN, low payload */
    ck_assert_uint_eq(tt_float_to_half(bits_f32(0x7fa02000)), 0x7f01);
    /* a sweep over float bit patterns against the reference */
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
        float f = bits_f32((uint32_t)u);
        uint16_t h = tt_float_to_half(f);
        uint16_t want = ref_d2h(f);
        if (isnan(f) ? !half_is_nan(h) : h != want)
            ck_abort_msg("float %08x (%a) -> half %04x, want %04x", (unsigned)u, (double)f, h,
                         want);
    }
    /* every midpoint and neighbour of adjacent halves */
    for (uint32_t i = 0; i < 0x7c00; i++) {
        double lo = ref_h2d((uint16_t)i), hi = ref_h2d((uint16_t)(i + 1));
        double mid = (lo + hi) / 2; /* exact in float */
        float probes[] = { (float)mid, nextafterf((float)mid, 0), nextafterf((float)mid, 1e30f) };
        for (int k = 0; k < 3; k++) {
            for (int s = 0; s < 2; s++) {
                float f = s ? -probes[k] : probes[k];
                uint16_t h = tt_float_to_half(f), want = ref_d2h(f);
                if (h != want)
                    ck_abort_msg("float %a -> half %04x, want %04x", (double)f, h, want);
            }
        }
    }
}
END_TEST

START_TEST(test_bf16)
{
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t b = (uint16_t)i;
        float f = tt_bf16_to_float(b);
        if (f32_bits(f) != (uint32_t)b << 16)
            ck_abort_msg("bf16 %04x -> %08x", b, f32_bits(f));
        uint16_t back = tt_float_to_bf16(f);
        if (back != (bf16_is_nan(b) ? (b | 0x40) : b)) /* NaN: quieted, payload kept */
            ck_abort_msg("bf16 %04x -> %a -> %04x", b, (double)f, back);
        if (!bf16_is_nan(b) && ref_bf2d(b) != (double)f && !(isnan(f)))
            ck_abort_msg("bf16 reference disagrees at %04x", b);
    }
    static const struct {
        uint32_t f;
        uint16_t b;
    } cases[] = {
        { 0x3f800000, 0x3f80 }, /* 1.0 */
        { 0x3f808000, 0x3f80 }, /* tie: even (down) */
        { 0x3f818000, 0x3f82 }, /* tie: even (up) */
        { 0x3f808001, 0x3f81 }, /* above a tie */
        { 0x3f807fff, 0x3f80 }, /* below a tie */
        { 0x7f7fffff, 0x7f80 }, /* FLT_MAX rounds to inf */
        { 0x7f7f7fff, 0x7f7f }, /* stays finite */
        { 0xff7fffff, 0xff80 },
        { 0x7f800000, 0x7f80 }, /* inf */
        { 0xff800000, 0xff80 },
        { 0x00008000, 0x0000 }, /* subnormal tie: even */
        { 0x00018000, 0x0002 }, /* subnormal tie: even (up) */
        { 0x007fffff, 0x0080 }, /* largest subnormal rounds to smallest normal */
        { 0x80000000, 0x8000 },
        { 0x7fc00000, 0x7fc0 }, /* qNaN kept */
        { 0xffc00001, 0xffc0 },
        { 0x7fa00000, 0x7fe0 }, /* sNaN: quieted, top payload kept */
        { 0xffa50000, 0xffe5 },
        { 0x7f800001, 0x7fc0 }, /* NaN with only low payload: stays NaN (quieted) */
        { 0x7f80ffff, 0x7fc0 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint16_t b = tt_float_to_bf16(bits_f32(cases[i].f));
        ck_assert_msg(b == cases[i].b, "float %08x -> bf16 %04x, want %04x", cases[i].f, b,
                      cases[i].b);
    }
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
        float f = bits_f32((uint32_t)u);
        uint16_t b = tt_float_to_bf16(f), want = ref_d2bf(f);
        if (isnan(f) ? !bf16_is_nan(b) : b != want)
            ck_abort_msg("float %08x -> bf16 %04x, want %04x", (unsigned)u, b, want);
    }
}
END_TEST

/* The fp16 kernels (F16C where the CPU has it) agree bit for bit with the portable
 * scalar conversions, NaN payloads included: x + 0, x * 1, min(x, x) for all halves. */
START_TEST(test_half_kernel_vs_scalar)
{
    enum { N = 65536 };
    uint16_t *x = malloc(N * 2), *d = malloc(N * 2 + 2), *c = malloc(N * 2);
    ck_assert(x && d && c);
    for (uint32_t i = 0; i < N; i++)
        x[i] = (uint16_t)i;
    static const struct {
        tutti_redop_t op;
        uint16_t c;
        float fc;
    } ops[] = { { TUTTI_SUM, 0x0000, 0.0f },
                { TUTTI_SUM, 0x8000, -0.0f },
                { TUTTI_PROD, 0x3c00, 1.0f },
                { TUTTI_PROD, 0xc000, -2.0f },
                { TUTTI_SUM, 0x3c00, 1.0f } };
    for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
        for (uint32_t i = 0; i < N; i++)
            c[i] = ops[k].c;
        uint16_t *dst = (uint16_t *)((char *)d + 1); /* unaligned on purpose */
        memcpy(dst, x, N * 2);
        tt_reduce(dst, c, N, TUTTI_FP16, ops[k].op);
        for (uint32_t i = 0; i < N; i++) {
            float f = tt_half_to_float(x[i]);
            float r = ops[k].op == TUTTI_SUM ? f + ops[k].fc : f * ops[k].fc;
            uint16_t want = tt_float_to_half(r), got;
            memcpy(&got, (char *)d + 1 + 2 * i, 2);
            if (got != want)
                ck_abort_msg("fp16 %s %04x with %04x: kernel %04x, scalar %04x",
                             tutti_redop_name(ops[k].op), x[i], ops[k].c, got, want);
        }
    }
    /* min/max of a value with itself returns it exactly, NaN payload quieted */
    for (int op = TUTTI_MIN; op <= TUTTI_MAX; op++) {
        tt_reduce3(d, x, x, N, TUTTI_FP16, (tutti_redop_t)op);
        for (uint32_t i = 0; i < N; i++) {
            uint16_t want = half_is_nan(x[i]) ? (uint16_t)(x[i] | 0x200) : x[i];
            if (d[i] != want)
                ck_abort_msg("fp16 %s(%04x, %04x) = %04x", tutti_redop_name(op), x[i], x[i], d[i]);
        }
    }
    free(x);
    free(d);
    free(c);
}
END_TEST

/* ---- kernel selection ---------------------------------------------------------- */

static int cpu_has(const char *isa)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    __builtin_cpu_init();
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_F16C))
        return strcmp(isa, "generic") == 0;
    if (strcmp(isa, "avx2") == 0)
        return __builtin_cpu_supports("avx2");
    if (strcmp(isa, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
    return strcmp(isa, "generic") == 0;
}

/* ---- tt_copy / tp_copy (transports/kit/copy.h) ---- */

/* Which copies take the vector loop: (dst - src) mod 4096 within [-64, 63], 2 KiB to 4 MiB. */
START_TEST(test_copy_band)
{
    static unsigned char page[3 * 4096] __attribute__((aligned(4096)));
    unsigned char *src = page + 4096;
    size_t mid = 64 << 10;
    ck_assert(tp_copy_in_band(src + 4096, src, mid));     /* 0 */
    ck_assert(tp_copy_in_band(src + 63, src, mid));       /* 63 */
    ck_assert(!tp_copy_in_band(src + 64, src, mid));      /* 64 */
    ck_assert(tp_copy_in_band(src - 64, src, mid));       /* -64 */
    ck_assert(!tp_copy_in_band(src - 65, src, mid));      /* -65 */
    ck_assert(tp_copy_in_band(src + 4096 + 8, src, mid)); /* 8 past a page */
    ck_assert(!tp_copy_in_band(src + 2048, src, mid));
    ck_assert(!tp_copy_in_band(src + 8, src, TP_COPY_LOOP_MIN - 1));
    ck_assert(tp_copy_in_band(src + 8, src, TP_COPY_LOOP_MIN));
    ck_assert(tp_copy_in_band(src + 8, src, TP_COPY_LOOP_MAX));
    ck_assert(!tp_copy_in_band(src + 8, src, (size_t)TP_COPY_LOOP_MAX + 1));
}
END_TEST

/* Every way of copying (tt_copy; the loops themselves where the CPU has them) against
 * the source byte by byte, with 64 guard bytes either side of the destination left
 * alone, over sizes across the thresholds, destination alignments and distances. */
START_TEST(test_copy_vs_reference)
{
    int way = _i; /* 0: tt_copy, 1: the SSE2 loop, 2: the AVX2 loop, 3: the streaming loop */
#ifdef TP_COPY_LOOP
    if (way >= 2 && !__builtin_cpu_supports("avx2"))
        return;
#else
    if (way)
        return;
#endif
    static const size_t sizes[] = {
        0,    1,    31,   32,   33,   127,        128,    129,
        2047, 2048, 2049, 4095, 4096, 65536 + 13, 300007, (4u << 20) + 1
    };
    static const int aligns[] = { 0, 1, 15, 16, 17, 31, 32 };
    static const int deltas[] = { -64, -63, -33, -8, -1, 0, 1, 8, 31, 32, 63, 64, 2048 };
    size_t cap = (4u << 20) + 3 * 4096;
    unsigned char *sbase = aligned_alloc(4096, cap), *dbase = aligned_alloc(4096, cap);
    ck_assert(sbase && dbase);
    uint32_t x = 12345;
    for (size_t i = 0; i < cap; i++) {
        x = x * 1103515245u + 12345u;
        sbase[i] = (unsigned char)(x >> 16);
    }
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t n = sizes[si];
        if (way && n < TP_COPY_LOOP_MIN)
            continue; /* the loops' contract */
        for (size_t ai = 0; ai < sizeof(aligns) / sizeof(aligns[0]); ai++) {
            for (size_t di = 0; di < sizeof(deltas) / sizeof(deltas[0]); di++) {
                unsigned char *dst = dbase + 4096 + aligns[ai];
                /* src in the source's second page at (dst - delta) mod 4096 */
                size_t soff = ((uintptr_t)dst - (uintptr_t)(intptr_t)deltas[di]) & 4095u;
                const unsigned char *src = sbase + 4096 + soff;
                /* the copy and its guards */
                memset(dst - 64, 0xEE, n + 128);
                if (way == 0)
                    tt_copy(dst, src, n);
#ifdef TP_COPY_LOOP
                else if (way == 1)
                    tp_copy_sse2(dst, src, n);
                else if (way == 2)
                    tp_copy_avx2(dst, src, n);
                else
                    tp_copy_nt(dst, src, n);
#endif
                /* byte by byte only where they differ (always: 10 s of 20 under ASan) */
                if (n && memcmp(dst, src, n) != 0)
                    for (size_t i = 0; i < n; i++)
                        if (dst[i] != src[i])
                            ck_abort_msg("way %d, %zu bytes, dst %d past 4096, delta %d: byte "
                                         "%zu is %u, the source's %u",
                                         way, n, aligns[ai], deltas[di], i, dst[i], src[i]);
                for (int g = 1; g <= 64; g++)
                    ck_assert_msg(dst[-g] == 0xEE && dst[n - 1 + g] == 0xEE,
                                  "way %d, %zu bytes, dst %d past 4096, delta %d: guard %d "
                                  "written",
                                  way, n, aligns[ai], deltas[di], g);
            }
        }
    }
    free(dbase);
    free(sbase);
}
END_TEST

/* From a quarter of the L3 that sysfs reports (read here on its own: cpu0's cache
 * index3, if it is level 3), 1 MiB at least, tt_copy streams:
 * the threshold, and copies at and around it, at two alignments, against the source. */
START_TEST(test_copy_streams)
{
    size_t l3 = 0;
    char lv[8] = { 0 };
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/level", "r");
    if (f) {
        if (!fgets(lv, sizeof(lv), f))
            lv[0] = 0;
        fclose(f);
    }
    f = lv[0] == '3' ? fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r") : NULL;
    if (f) {
        char txt[64] = { 0 };
        if (fgets(txt, sizeof(txt), f)) {
            char *end;
            unsigned long long v = strtoull(txt, &end, 10);
            l3 = *end == 'K' ? v * 1024 : *end == 'M' ? v * 1024 * 1024 : v;
        }
        fclose(f);
    }
    size_t min = tp_copy_nt_min();
    if (l3)
        ck_assert_uint_eq(min, l3 / 4 > TP_COPY_NT_FLOOR ? l3 / 4 : TP_COPY_NT_FLOOR);
    else
        ck_assert(min == SIZE_MAX || min >= TP_COPY_NT_FLOOR); /* sysconf's figure, or none */
    if (min == SIZE_MAX || min > (64u << 20))
        return;
    const size_t sizes[] = { min - 1, min, min + 33 };
    unsigned char *sbase = malloc(min + 4096), *dbase = malloc(min + 4096 + 128);
    ck_assert(sbase && dbase);
    for (size_t i = 0; i < min + 4096; i++)
        sbase[i] = (unsigned char)(i * 7 + (i >> 12));
    for (int a = 0; a < 2; a++) {
        for (size_t k = 0; k < 3; k++) {
            size_t n = sizes[k];
            unsigned char *dst = dbase + 64 + 17 * a;
            const unsigned char *src = sbase + 5 * a;
            memset(dbase, 0xEE, min + 4096 + 128);
            tt_copy(dst, src, n);
            ck_assert_msg(memcmp(dst, src, n) == 0, "%zu bytes at alignment %d differ", n, a);
            for (int g = 1; g <= 64; g++)
                ck_assert_msg(dst[-g] == 0xEE && dst[n - 1 + g] == 0xEE,
                              "%zu bytes at alignment %d: guard %d written", n, a, g);
        }
    }
    free(dbase);
    free(sbase);
}
END_TEST

static const char *expected_isa; /* NULL: don't know (not forked, or set outside) */

START_TEST(test_isa)
{
    const char *name = tt_reduce_isa_name();
    ck_assert(strcmp(name, "generic") == 0 || strcmp(name, "avx2") == 0 ||
              strcmp(name, "avx512") == 0);
    if (expected_isa)
        ck_assert_str_eq(name, expected_isa);
}
END_TEST

static Suite *reduce_suite(void)
{
    Suite *s = suite_create("reduce");
    TCase *tc = tcase_create("names");
    tcase_add_test(tc, test_dtype_names);
    tcase_add_test(tc, test_redop_names);
    tcase_add_test(tc, test_redop_supported);
    suite_add_tcase(s, tc);

    tc = tcase_create("kernels");
    tcase_add_test(tc, test_isa);
    tcase_add_loop_test(tc, test_reduce_vs_reference, 0, TUTTI_DTYPE_COUNT);
    tcase_add_loop_test(tc, test_reduce3_vs_reference, 0, TUTTI_DTYPE_COUNT);
    tcase_add_loop_test(tc, test_reduce_self, 0, TUTTI_DTYPE_COUNT);
    tcase_add_loop_test(tc, test_avg, 0, TUTTI_DTYPE_COUNT);
    tcase_add_test(tc, test_avg_cases);
    tcase_add_test(tc, test_int_wrap);
    tcase_add_test(tc, test_int_wrap_wide);
    tcase_add_test(tc, test_float_specials);
    tcase_add_test(tc, test_float_specials_vector);
    tcase_add_test(tc, test_fp8_specials);
    tcase_add_test(tc, test_invalid_args);
    tcase_add_test(tc, test_half_kernel_vs_scalar);
    suite_add_tcase(s, tc);

    tc = tcase_create("copy");
    tcase_add_test(tc, test_copy_band);
    tcase_add_loop_test(tc, test_copy_vs_reference, 0, 4);
    tcase_add_test(tc, test_copy_streams);
    suite_add_tcase(s, tc);

    tc = tcase_create("conversions");
    tcase_add_test(tc, test_half_exhaustive);
    tcase_add_test(tc, test_half_rounding);
    tcase_add_test(tc, test_bf16);
    tcase_add_test(tc, test_fp8_conversions);
    suite_add_tcase(s, tc);
    return s;
}

static int run_suite(int nofork)
{
    SRunner *sr = srunner_create(reduce_suite());
    if (nofork)
        srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed;
}

int main(void)
{
    static const char *const isas[] = { "generic", "avx2", "avx512" };
    SRunner *probe = srunner_create(suite_create("probe"));
    int forked = srunner_fork_status(probe) != CK_NOFORK;
    srunner_free(probe);

    /* Kernel selection is fixed per process at the first call, so only forked runs
     * (a fresh process per test) can try each kernel set. */
    if (!forked || getenv("TUTTI_REDUCE_ISA"))
        return run_suite(0) ? 1 : 0;
    int failed = 0;
    for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
        if (!cpu_has(isas[i])) {
            printf("kernels %s: not supported by this CPU, skipped\n", isas[i]);
            continue;
        }
        printf("kernels %s:\n", isas[i]);
        fflush(stdout);
        setenv("TUTTI_REDUCE_ISA", isas[i], 1);
        expected_isa = isas[i];
        if (!th_quick()) {
            failed += run_suite(0);
            continue;
        }
        /* Sanitizer builds (TT_TEST_QUICK): each kernel set's cases in one process of
         * their own, not one each: LeakSanitizer's check at every exit made 30 of the
         * suite's 44 s under ASan. */
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            perror("test_reduce: fork");
            return 1;
        }
        if (pid == 0)
            exit(run_suite(1) ? 1 : 0); /* exit: LeakSanitizer checks at exit, not _exit */
        int st = 0;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("kernels %s: failed (status 0x%x)\n", isas[i], st);
            failed++;
        }
    }
    unsetenv("TUTTI_REDUCE_ISA");
    return failed ? 1 : 0;
}
