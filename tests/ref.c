/* Reference values for the multi-rank correctness tests (see ref.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ref.h"
#include "ref_fp8.h"

/* ---- fp16 / bf16, written here so that the reference does not share the library's
 * conversions ---- */

float ref_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float f;
    if (exp == 0) {
        f = ldexpf((float)mant, -24);
        return sign ? -f : f;
    }
    uint32_t bits = exp == 31 ? sign | 0x7f800000u | (mant << 13)
                              : sign | ((exp - 15 + 127) << 23) | (mant << 13);
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t ref_float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return sign | 0x7e00;
    if (ax >= 0x47800000u) /* >= 65536, and infinity */
        return sign | 0x7c00;
    if (ax < 0x38800000u) { /* below 2^-14: subnormal, units of 2^-24 */
        float a;
        memcpy(&a, &ax, 4);
        return sign | (uint16_t)lrintf(ldexpf(a, 24)); /* exact scaling, RNE */
    }
    uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | ((ax >> 13) & 0x3ff));
    uint32_t rest = ax & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++; /* may carry into the exponent, up to infinity: still right */
    return sign | (uint16_t)h;
}

float ref_bf16_to_float(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t ref_float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* ---- fp8 (ref_fp8.h) ---- */

/* An 8-bit float format (sign in bit 7): exponent and mantissa widths; fn: finite, as
 * OCP E4M3, whose only NaNs are S.1111.111 and which has no infinity. */
typedef struct fmt8 {
    int ebits, mbits, fn;
} fmt8_t;

static fmt8_t fmt8_of(tutti_dtype_t dt)
{
    return dt == TUTTI_FP8_E4M3 ? (fmt8_t){ 4, 3, 1 } : (fmt8_t){ 5, 2, 0 };
}

double ref_fp8_to_d(tutti_dtype_t dtype, uint8_t v)
{
    fmt8_t f = fmt8_of(dtype);
    int emax = (1 << f.ebits) - 1, mmax = (1 << f.mbits) - 1;
    int e = (v >> f.mbits) & emax, m = v & mmax, bias = (1 << (f.ebits - 1)) - 1;
    double r;
    if (f.fn && e == emax && m == mmax)
        r = NAN;
    else if (!f.fn && e == emax)
        r = m ? NAN : INFINITY;
    else if (e == 0)
        r = ldexp(m, 1 - bias - f.mbits);
    else
        r = ldexp((1 << f.mbits) + m, e - bias - f.mbits);
    return (v & 0x80) ? -r : r;
}

uint8_t ref_d_to_fp8(tutti_dtype_t dtype, double x)
{
    if (isnan(x))
        return fmt8_of(dtype).fn ? 0x7f : 0x7e;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double ax = fabs(x);
    int best = 0, largest = 0;
    double bd = INFINITY;
    for (int c = 0; c < 0x80; c++) {
        double v = ref_fp8_to_d(dtype, (uint8_t)c);
        if (!isfinite(v))
            continue;
        largest = c;
        double d = fabs(v - ax);
        if (d < bd || (d == bd && !(c & 1))) {
            best = c;
            bd = d;
        }
    }
    /* (far past it every distance rounds to the same double: no search there) */
    return sign | (uint8_t)(ax >= ref_fp8_to_d(dtype, (uint8_t)largest) ? largest : best);
}

/* ---- inputs and reference ---- */

const tutti_dtype_t all_dtypes[8] = { TUTTI_INT8, TUTTI_UINT8, TUTTI_INT32, TUTTI_INT64,
                                      TUTTI_FP16, TUTTI_BF16,  TUTTI_FP32,  TUTTI_FP64 };
/* the later integer dtypes: every op, on fewer counts (their kernels are test_reduce's) */
const tutti_dtype_t more_dtypes[4] = { TUTTI_INT16, TUTTI_UINT16, TUTTI_UINT32, TUTTI_UINT64 };
const tutti_redop_t all_ops[5] = { TUTTI_SUM, TUTTI_PROD, TUTTI_MIN, TUTTI_MAX, TUTTI_AVG };
const tutti_redop_t bit_ops[6] = { TUTTI_BAND, TUTTI_BOR, TUTTI_BXOR,
                                   TUTTI_LAND, TUTTI_LOR, TUTTI_LXOR };
const tutti_redop_t int_ops[11] = { TUTTI_SUM,  TUTTI_PROD, TUTTI_MIN, TUTTI_MAX,
                                    TUTTI_AVG,  TUTTI_BAND, TUTTI_BOR, TUTTI_BXOR,
                                    TUTTI_LAND, TUTTI_LOR,  TUTTI_LXOR };

int is_unsigned(tutti_dtype_t dt)
{
    return dt == TUTTI_UINT8 || dt == TUTTI_UINT16 || dt == TUTTI_UINT32 || dt == TUTTI_UINT64;
}

int is_float(tutti_dtype_t dt)
{
    return dt == TUTTI_FP16 || dt == TUTTI_BF16 || dt == TUTTI_FP32 || dt == TUTTI_FP64;
}

uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t gen_bits(uint64_t seed, int rank, size_t i)
{
    return mix64(seed + 0x9e3779b97f4a7c15ull * ((uint64_t)i + 1) +
                 0xd1b54a32d192ed03ull * (uint64_t)(rank + 1));
}

double gen_float(tutti_redop_t op, uint64_t bits)
{
    static const double prod_vals[4] = { 1, -1, 2, 0.5 };
    switch (op) {
    case TUTTI_PROD: return prod_vals[bits & 3];
    case TUTTI_MIN:
    case TUTTI_MAX: return (double)((int)(bits & 63) - 32) / 4.0;
    default: return (double)((int)(bits & 15) - 8);
    }
}

/* odd factors keep integer products from collapsing to 0; BAND's inputs have 3 bits
 * of 4 set and BOR's 1 of 4, so that neither result is all zeros or all ones at 2-4 ranks;
 * the logical ops' are 0 or a value nonzero in every width (LAND's 0 a quarter of the
 * time, LOR's three quarters, LXOR's half: each result both ways at 2-4 ranks) */
uint64_t gen_int(tutti_redop_t op, uint64_t bits)
{
    uint64_t some = (bits >> 8 & 0x3f) | 1;
    switch (op) {
    case TUTTI_PROD: return bits | 1;
    case TUTTI_BAND: return bits | mix64(bits);
    case TUTTI_BOR: return bits & mix64(bits);
    case TUTTI_LAND: return bits % 4 == 0 ? 0 : some;
    case TUTTI_LOR: return bits % 4 != 0 ? 0 : some;
    case TUTTI_LXOR: return bits % 2 ? 0 : some;
    default: return bits;
    }
}

/* Store element i of a dtype from integer bits (integer types) or a double (floats). */
void put_elem(void *buf, tutti_dtype_t dt, size_t i, uint64_t u, double d)
{
    unsigned char *p = (unsigned char *)buf + i * tutti_dtype_size(dt);
    switch (dt) {
    case TUTTI_INT8:
    case TUTTI_UINT8: *p = (uint8_t)u; break;
    case TUTTI_INT16:
    case TUTTI_UINT16: {
        uint16_t v = (uint16_t)u;
        memcpy(p, &v, 2);
        break;
    }
    case TUTTI_UINT32:
    case TUTTI_INT32: {
        uint32_t v = (uint32_t)u;
        memcpy(p, &v, 4);
        break;
    }
    case TUTTI_UINT64:
    case TUTTI_INT64: memcpy(p, &u, 8); break;
    case TUTTI_FP16: {
        uint16_t v = ref_float_to_half((float)d);
        memcpy(p, &v, 2);
        break;
    }
    case TUTTI_BF16: {
        uint16_t v = ref_float_to_bf16((float)d);
        memcpy(p, &v, 2);
        break;
    }
    case TUTTI_FP32: {
        float v = (float)d;
        memcpy(p, &v, 4);
        break;
    }
    case TUTTI_FP64: memcpy(p, &d, 8); break;
    default: break;
    }
}

/* Rank `rank`'s input element i into out[0]. */
void gen_elem(void *out, tutti_dtype_t dt, tutti_redop_t op, int rank, size_t i, uint64_t seed)
{
    uint64_t bits = gen_bits(seed, rank, i);
    if (is_float(dt))
        put_elem(out, dt, 0, 0, gen_float(op, bits));
    else
        put_elem(out, dt, 0, gen_int(op, bits), 0);
}

void fill_input(void *buf, tutti_dtype_t dt, tutti_redop_t op, int rank, size_t count,
                uint64_t seed)
{
    size_t es = tutti_dtype_size(dt);
    for (size_t i = 0; i < count; i++)
        gen_elem((unsigned char *)buf + i * es, dt, op, rank, i, seed);
}

/* integer bits as the type's value, widened (uint64: its bits; compare those unsigned) */
int64_t int_value(tutti_dtype_t dt, uint64_t u)
{
    switch (dt) {
    case TUTTI_INT8: return (int8_t)(uint8_t)u;
    case TUTTI_UINT8: return (uint8_t)u;
    case TUTTI_INT16: return (int16_t)(uint16_t)u;
    case TUTTI_UINT16: return (uint16_t)u;
    case TUTTI_INT32: return (int32_t)(uint32_t)u;
    case TUTTI_UINT32: return (uint32_t)u;
    default: return (int64_t)u;
    }
}

/* x < y as the dtype's values */
static int int_less(tutti_dtype_t dt, uint64_t x, uint64_t y)
{
    if (dt == TUTTI_UINT64)
        return x < y;
    return int_value(dt, x) < int_value(dt, y);
}

/* The reduction of every rank's element i into out[0]. */
void expected_elem(void *out, tutti_dtype_t dt, tutti_redop_t op, int nranks, size_t i,
                   uint64_t seed)
{
    if (is_float(dt)) {
        double acc = gen_float(op, gen_bits(seed, 0, i));
        for (int r = 1; r < nranks; r++) {
            double v = gen_float(op, gen_bits(seed, r, i));
            switch (op) {
            case TUTTI_PROD: acc *= v; break;
            case TUTTI_MIN: acc = v < acc ? v : acc; break;
            case TUTTI_MAX: acc = v > acc ? v : acc; break;
            default: acc += v; break;
            }
        }
        if (op == TUTTI_AVG) {
            if (dt == TUTTI_FP64) {
                acc = acc / nranks;
            } else {
                float q = (float)acc / (float)nranks;
                acc = dt == TUTTI_FP16   ? ref_half_to_float(ref_float_to_half(q))
                      : dt == TUTTI_BF16 ? ref_bf16_to_float(ref_float_to_bf16(q))
                                         : q;
            }
        }
        put_elem(out, dt, 0, 0, acc);
        return;
    }
    /* integers: wrap in unsigned; compare and divide as the type */
    uint64_t acc = gen_int(op, gen_bits(seed, 0, i));
    for (int r = 1; r < nranks; r++) {
        uint64_t v = gen_int(op, gen_bits(seed, r, i));
        switch (op) {
        case TUTTI_PROD: acc *= v; break;
        case TUTTI_MIN:
            if (int_less(dt, v, acc))
                acc = v;
            break;
        case TUTTI_MAX:
            if (int_less(dt, acc, v))
                acc = v;
            break;
        case TUTTI_BAND: acc &= v; break;
        case TUTTI_BOR: acc |= v; break;
        case TUTTI_BXOR: acc ^= v; break;
        case TUTTI_LAND: acc = acc && v; break;
        case TUTTI_LOR: acc = acc || v; break;
        case TUTTI_LXOR: acc = !acc != !v; break;
        default: acc += v; break;
        }
    }
    if (op == TUTTI_AVG)
        acc = dt == TUTTI_UINT64 ? acc / (uint64_t)nranks : (uint64_t)(int_value(dt, acc) / nranks);
    put_elem(out, dt, 0, acc, 0);
}

double elem_as_double(const void *p, tutti_dtype_t dt)
{
    union {
        int8_t i8;
        uint8_t u8;
        int32_t i32;
        int64_t i64;
        uint16_t u16;
        float f;
        double d;
    } v;
    memcpy(&v, p, tutti_dtype_size(dt));
    switch (dt) {
    case TUTTI_INT8:
    case TUTTI_UINT8:
    case TUTTI_INT16:
    case TUTTI_UINT16:
    case TUTTI_INT32:
    case TUTTI_UINT32: return (double)int_value(dt, elem_bits(p, tutti_dtype_size(dt)));
    case TUTTI_INT64: return (double)v.i64;
    case TUTTI_UINT64: return (double)(uint64_t)v.i64;
    case TUTTI_FP16: return ref_half_to_float(v.u16);
    case TUTTI_BF16: return ref_bf16_to_float(v.u16);
    case TUTTI_FP32: return v.f;
    case TUTTI_FP64: return v.d;
    default: return 0;
    }
}

uint64_t elem_bits(const void *p, size_t es)
{
    uint64_t u = 0;
    memcpy(&u, p, es);
    return u;
}
