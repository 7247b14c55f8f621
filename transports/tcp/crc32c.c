/* CRC-32C: slicing-by-8 tables, and the CPU's crc32c instruction run as three
 * interleaved streams whose CRCs are then combined (the instruction's latency is three
 * times its throughput, so one stream would leave two thirds of the unit idle). The
 * combination shifts a CRC over a block of zeros with precomputed tables, as in Mark
 * Adler's crc32c.c (zlib licence). See crc32c.h. */
#include <pthread.h>
#include <string.h>

#include "crc32c.h"

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define TCP_CRC_X86 1
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
/* aarch64 built for a CPU with the CRC extension (-march=armv8-a+crc or later). */
#include <arm_acle.h>
#define TCP_CRC_ARM 1
#endif

#define POLY 0x82f63b78u
/* block lengths of the interleaved streams (powers of two for the shift tables) */
#define LONG_BLOCK 8192
#define SHORT_BLOCK 256

static uint32_t table[8][256];       /* slicing-by-8 */
static uint32_t shift_long[4][256];  /* apply LONG_BLOCK zero bytes to a CRC register */
static uint32_t shift_short[4][256]; /* apply SHORT_BLOCK zero bytes */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static inline uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v)); /* unaligned loads are fine; memcpy keeps it defined */
    return v;
}

/* ---- GF(2) operators that append zero bytes to a CRC register ---- */

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1)
            sum ^= *mat;
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++)
        square[n] = gf2_times(mat, mat[n]);
}

/* The operator for len zero bytes (len a power of two). */
static void zeros_op(uint32_t *even, size_t len)
{
    uint32_t odd[32];
    odd[0] = POLY; /* one zero bit */
    for (int n = 1; n < 32; n++)
        odd[n] = 1u << (n - 1);
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four */
    for (;;) {
        gf2_square(even, odd); /* one byte, then 4, 16 ... bytes */
        len >>= 1;
        if (!len)
            return;
        gf2_square(odd, even); /* two bytes, then 8, 32 ... */
        len >>= 1;
        if (!len)
            break;
    }
    memcpy(even, odd, sizeof(odd));
}

static void zeros_table(uint32_t zeros[4][256], size_t len)
{
    uint32_t op[32];
    zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = gf2_times(op, n);
        zeros[1][n] = gf2_times(op, n << 8);
        zeros[2][n] = gf2_times(op, n << 16);
        zeros[3][n] = gf2_times(op, n << 24);
    }
}

static inline uint32_t shift(const uint32_t zeros[4][256], uint32_t crc)
{
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

static void tables_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 1; k < 8; k++)
            table[k][n] = (table[k - 1][n] >> 8) ^ table[0][table[k - 1][n] & 0xff];
    zeros_table(shift_long, LONG_BLOCK);
    zeros_table(shift_short, SHORT_BLOCK);
}

/* ---- software: slicing-by-8 ---- */

uint32_t tcp_crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&tables_once, tables_init);
    const unsigned char *p = buf;
    uint64_t c = crc ^ 0xffffffffu;
    while (len && ((uintptr_t)p & 7)) {
        c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
        len--;
    }
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t w = load64(p) ^ c;
        c = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
            table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
            table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
    }
#endif
    while (len--)
        c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return (uint32_t)c ^ 0xffffffffu;
}

/* ---- hardware: three interleaved streams over LONG_BLOCK, then SHORT_BLOCK, blocks,
 * then one stream for the rest ---- */

#if defined(TCP_CRC_X86)
#define HW_ATTR __attribute__((target("sse4.2")))
#define HW_U64(c, p) _mm_crc32_u64((c), load64(p))
#define HW_U8(c, p) _mm_crc32_u8((uint32_t)(c), *(p))
#elif defined(TCP_CRC_ARM)
#define HW_ATTR
#define HW_U64(c, p) __crc32cd((uint32_t)(c), load64(p))
#define HW_U8(c, p) __crc32cb((uint32_t)(c), *(p))
#endif

#ifdef HW_ATTR
HW_ATTR static uint32_t crc32c_hw_impl(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *next = buf;
    uint64_t crc0 = crc ^ 0xffffffffu, crc1, crc2;
    while (len && ((uintptr_t)next & 7)) {
        crc0 = HW_U8(crc0, next);
        next++;
        len--;
    }
    while (len >= 3 * LONG_BLOCK) {
        crc1 = crc2 = 0;
        const unsigned char *end = next + LONG_BLOCK;
        do {
            crc0 = HW_U64(crc0, next);
            crc1 = HW_U64(crc1, next + LONG_BLOCK);
            crc2 = HW_U64(crc2, next + 2 * LONG_BLOCK);
            next += 8;
        } while (next < end);
        crc0 = shift(shift_long, (uint32_t)crc0) ^ crc1;
        crc0 = shift(shift_long, (uint32_t)crc0) ^ crc2;
        next += 2 * LONG_BLOCK;
        len -= 3 * LONG_BLOCK;
    }
    while (len >= 3 * SHORT_BLOCK) {
        crc1 = crc2 = 0;
        const unsigned char *end = next + SHORT_BLOCK;
        do {
            crc0 = HW_U64(crc0, next);
            crc1 = HW_U64(crc1, next + SHORT_BLOCK);
            crc2 = HW_U64(crc2, next + 2 * SHORT_BLOCK);
            next += 8;
        } while (next < end);
        crc0 = shift(shift_short, (uint32_t)crc0) ^ crc1;
        crc0 = shift(shift_short, (uint32_t)crc0) ^ crc2;
        next += 2 * SHORT_BLOCK;
        len -= 3 * SHORT_BLOCK;
    }
    for (; len >= 8; next += 8, len -= 8)
        crc0 = HW_U64(crc0, next);
    for (; len; next++, len--)
        crc0 = HW_U8(crc0, next);
    return (uint32_t)crc0 ^ 0xffffffffu;
}
#endif

int tcp_crc32c_hw_available(void)
{
#if defined(TCP_CRC_X86)
    return __builtin_cpu_supports("sse4.2");
#elif defined(TCP_CRC_ARM)
    return 1;
#else
    return 0;
#endif
}

uint32_t tcp_crc32c_hw(uint32_t crc, const void *buf, size_t len)
{
#ifdef HW_ATTR
    if (tcp_crc32c_hw_available()) {
        pthread_once(&tables_once, tables_init);
        return crc32c_hw_impl(crc, buf, len);
    }
#endif
    return tcp_crc32c_sw(crc, buf, len);
}

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);
static crc_fn best;
static const char *best_name = "table";
static pthread_once_t best_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
    pthread_once(&tables_once, tables_init);
    best = tcp_crc32c_sw;
#ifdef HW_ATTR
    if (tcp_crc32c_hw_available()) {
        best = crc32c_hw_impl;
#if defined(TCP_CRC_X86)
        best_name = "sse4.2";
#else
        best_name = "armv8-crc";
#endif
    }
#endif
}

uint32_t tcp_crc32c(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&best_once, choose);
    return best(crc, buf, len);
}

const char *tcp_crc32c_impl(void)
{
    pthread_once(&best_once, choose);
    return best_name;
}
