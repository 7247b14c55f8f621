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
 * memcpy otherwise.
 *
 * Copies of a quarter of the L3 or more stream their stores past the cache (tp_copy_nt):
 * such a destination would not stay cached anyway, and a normal store first reads the
 * line it overwrites. glibc does the same from its non_temporal_threshold, but computes
 * it from CPUID, which in this project's test VM reports the host's 256 MiB L3 rather
 * than the 32 MiB its cores share, so it never streams below 192 MiB. An 8-32 MiB copy
 * ran in 0.61-0.83x memcpy's time (bench/copy-bench), a 2-rank 16 MiB alltoall and
 * allgather (an 8 MiB copy of the rank's own block each) in about 0.9x
 * (docs/benchmarks.md, session 56). */
#ifndef TT_KIT_COPY_H
#define TT_KIT_COPY_H

#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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
/* One unaligned 32-byte store, then stores aligned to 32 bytes, streamed past the cache
 * (nt) or not (n >= 32; the callers give n >= TP_COPY_LOOP_MIN); constant nt folds. */
__attribute__((target("avx2"), always_inline)) static inline void tp_copy_avx2_loop(
    unsigned char *d, const unsigned char *s, size_t n, int nt)
{
    _mm256_storeu_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s));
    size_t i = 32 - ((uintptr_t)d & 31);
    for (; i + 128 <= n; i += 128) {
        __m256i v[4];
        for (int k = 0; k < 4; k++)
            v[k] = _mm256_loadu_si256((const __m256i *)(s + i + 32 * k));
        for (int k = 0; k < 4; k++) {
            if (nt)
                _mm256_stream_si256((__m256i *)(d + i + 32 * k), v[k]);
            else
                _mm256_store_si256((__m256i *)(d + i + 32 * k), v[k]);
        }
    }
    if (nt)
        _mm_sfence();            /* streamed stores are weakly ordered: done before what follows */
    memcpy(d + i, s + i, n - i); /* under 128 bytes: no REP MOVSB */
}

__attribute__((target("avx2"))) static inline void tp_copy_avx2(unsigned char *d,
                                                                const unsigned char *s, size_t n)
{
    tp_copy_avx2_loop(d, s, n, 0);
}

__attribute__((target("avx2"))) static inline void tp_copy_nt(unsigned char *d,
                                                              const unsigned char *s, size_t n)
{
    tp_copy_avx2_loop(d, s, n, 1);
}

/* Copies of 1/TP_COPY_NT_SHARE of the L3, and of TP_COPY_NT_FLOOR, or more bypass the
 * cache. The L3 comes from sysfs (the cache this CPU shares), then sysconf: in VMs CPUID
 * may report the host's whole L3 (256 MiB on this project's test VM, whose cores share
 * 32 MiB), and glibc 2.36 computes its non_temporal_threshold from that (192 MiB here).
 * A quarter: with both buffers just written (cached), an 8 MiB copy ran in 0.83x
 * memcpy's time streamed, a 4 MiB one in 1.04x (bench/copy-bench). The floor keeps
 * smaller copies (every ring record) off the lookup altogether: the first call reads
 * sysfs. */
#define TP_COPY_NT_SHARE 4u
#define TP_COPY_NT_FLOOR ((size_t)1 << 20)

static inline size_t tp_copy_l3_bytes(void)
{
    size_t l3 = 0;
    unsigned level = 0;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/level", "r");
    if (f) {
        if (fscanf(f, "%u", &level) != 1)
            level = 0;
        fclose(f);
    }
    f = level == 3 ? fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r") : NULL;
    if (f) {
        unsigned long long v = 0;
        char unit = 0;
        if (fscanf(f, "%llu%c", &v, &unit) >= 1)
            l3 = (size_t)v << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0);
        fclose(f);
    }
#ifdef _SC_LEVEL3_CACHE_SIZE
    if (!l3) {
        long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
        l3 = v > 0 ? (size_t)v : 0;
    }
#endif
    return l3;
}

/* Bytes from which tp_copy streams its stores past the cache (SIZE_MAX: never);
 * computed on first use. */
static inline size_t tp_copy_nt_min(void)
{
    static _Atomic size_t min; /* 0: not yet known */
    size_t v = atomic_load_explicit(&min, memory_order_relaxed);
    if (!v) {
        size_t l3 = tp_copy_l3_bytes();
        v = l3 ? l3 / TP_COPY_NT_SHARE : SIZE_MAX;
        v = v < TP_COPY_NT_FLOOR ? TP_COPY_NT_FLOOR : v;
        atomic_store_explicit(&min, v, memory_order_relaxed);
    }
    return v;
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
    if (n >= TP_COPY_NT_FLOOR && n >= tp_copy_nt_min() && __builtin_cpu_supports("avx2")) {
        tp_copy_nt((unsigned char *)dst, (const unsigned char *)src, n);
        return;
    }
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
