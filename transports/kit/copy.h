/* Transport kit: tp_copy, memcpy without its one bad case.
 *
 * glibc's memcpy copies with REP MOVSB from rep_movsb_threshold (2112 bytes here) up to
 * rep_movsb_stop_threshold (the L2 size, 512 KiB here; `ld.so --list-diagnostics`), and
 * on AMD Zen CPUs REP MOVSB runs about 10x slower when the destination lies 1-31 bytes
 * past the source modulo 4096 (glibc bug 30994, where some Zen parts are slow at 0 too):
 * 2-3 GB/s where the same copy otherwise runs at 25-35 GB/s on this project's test VM
 * (bench/copy-bench). The distance is fixed by where the two buffers sit, so an
 * unlucky pair stays slow on every call: a ring's payload follows a record header, and
 * a user's buffer can sit at any offset. A loop of unaligned 32-byte loads and aligned
 * stores has no such case (17-31 GB/s there) and is as fast as memcpy elsewhere, so
 * tp_copy takes it when (dst - src) mod 4096 is within 64 bytes of a page boundary
 * either way (0 included), from 2 KiB to 4 MiB (past any L2 size glibc stops at), and
 * memcpy otherwise. */
#ifndef TT_KIT_COPY_H
#define TT_KIT_COPY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TP_COPY_LOOP 1
#endif

/* The sizes where glibc may copy with REP MOVSB, and the band of (dst - src) mod 4096,
 * either side of 0, where tp_copy loops instead. */
#define TP_COPY_LOOP_MIN 2048u
#define TP_COPY_LOOP_MAX (4u << 20)
#define TP_COPY_BAND 64u

/* Does tp_copy(dst, src, n) take the loop? */
static inline int tp_copy_in_band(const void *dst, const void *src, size_t n)
{
    size_t d = ((uintptr_t)dst - (uintptr_t)src + TP_COPY_BAND) & 4095u;
    return n >= TP_COPY_LOOP_MIN && n <= TP_COPY_LOOP_MAX && d < 2 * TP_COPY_BAND;
}

#ifdef TP_COPY_LOOP
__attribute__((target("avx2"))) static inline void tp_copy_avx2(unsigned char *d,
                                                                const unsigned char *s, size_t n)
{
    /* one unaligned store, then stores aligned to 32 bytes (n >= TP_COPY_LOOP_MIN) */
    _mm256_storeu_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s));
    size_t i = 32 - ((uintptr_t)d & 31);
    for (; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_store_si256((__m256i *)(d + i), a);
        _mm256_store_si256((__m256i *)(d + i + 32), b);
        _mm256_store_si256((__m256i *)(d + i + 64), c);
        _mm256_store_si256((__m256i *)(d + i + 96), e);
    }
    memcpy(d + i, s + i, n - i); /* under 128 bytes: no REP MOVSB */
}

static inline void tp_copy_sse2(unsigned char *d, const unsigned char *s, size_t n)
{
    _mm_storeu_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
    size_t i = 16 - ((uintptr_t)d & 15);
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_store_si128((__m128i *)(d + i), a);
        _mm_store_si128((__m128i *)(d + i + 16), b);
        _mm_store_si128((__m128i *)(d + i + 32), c);
        _mm_store_si128((__m128i *)(d + i + 48), e);
    }
    memcpy(d + i, s + i, n - i);
}
#endif

/* memcpy(dst, src, n): the two must not overlap. */
static inline void tp_copy(void *dst, const void *src, size_t n)
{
#ifdef TP_COPY_LOOP
    if (tp_copy_in_band(dst, src, n)) {
        if (__builtin_cpu_supports("avx2"))
            tp_copy_avx2((unsigned char *)dst, (const unsigned char *)src, n);
        else
            tp_copy_sse2((unsigned char *)dst, (const unsigned char *)src, n);
        return;
    }
#endif
    memcpy(dst, src, n);
}

#endif
