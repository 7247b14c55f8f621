/* Reduction kernel micro-benchmark: tt_reduce(dst, src) for every dtype x op on one
 * large buffer, beside memcpy of the same size and a naive fp32 sum loop, all measured
 * in the same run.
 *
 *   reduce-bench [MiB [reps]]        (default: 64 MiB, median of 5)
 *
 * Columns: "in GB/s" is bytes of one buffer per second (the rate at which the input
 * stream is reduced); "traffic GB/s" counts every byte moved: 3x for a reduction (read
 * dst, read src, write dst), 2x for memcpy (read src, write dst). GB = 1e9 bytes.
 * TUTTI_REDUCE_ISA=generic|avx2|avx512 caps the kernel set. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tutti/tutti.h>

#include "reduce/reduce.h"

/* Defined in lib/reduce/reduce.c (not yet declared in reduce.h). */
const char *tt_reduce_isa_name(void);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The plain loop a user would write, with the vectoriser off: the scalar baseline. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((noinline, optimize("no-tree-vectorize")))
#else
__attribute__((noinline))
#endif
static void
naive_sum_scalar(float *dst, const float *src, size_t n)
{
#if defined(__clang__)
#pragma clang loop vectorize(disable) interleave(disable)
#endif
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

/* The same loop as the compiler builds it at the benchmark's own flags (GCC 12 at -O2
 * does not vectorise it: it would need a runtime alias check). */
__attribute__((noinline)) static void naive_sum_default(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

typedef enum { RUN_REDUCE, RUN_REDUCE3, RUN_MEMCPY, RUN_NAIVE, RUN_NAIVE_DEFAULT } run_kind_t;

static char *dst_buf, *src_buf, *src2_buf;
static size_t buf_bytes;
static int reps = 5;

/* Median seconds of one pass. */
static double time_run(run_kind_t kind, tutti_dtype_t dt, tutti_redop_t op)
{
    double t[64];
    size_t count = dt < TUTTI_DTYPE_COUNT ? buf_bytes / tutti_dtype_size(dt) : 0;
    for (int r = -1; r < reps; r++) { /* one warm-up pass */
        double t0 = now_s();
        switch (kind) {
        case RUN_REDUCE: tt_reduce(dst_buf, src_buf, count, dt, op); break;
        case RUN_REDUCE3: tt_reduce3(dst_buf, src_buf, src2_buf, count, dt, op); break;
        case RUN_MEMCPY: memcpy(dst_buf, src_buf, buf_bytes); break;
        case RUN_NAIVE:
            naive_sum_scalar((float *)dst_buf, (const float *)src_buf, buf_bytes / 4);
            break;
        case RUN_NAIVE_DEFAULT:
            naive_sum_default((float *)dst_buf, (const float *)src_buf, buf_bytes / 4);
            break;
        }
        double dt_s = now_s() - t0;
        if (r >= 0)
            t[r] = dt_s;
    }
    qsort(t, (size_t)reps, sizeof(t[0]), cmp_double);
    return t[reps / 2];
}

/* Values that keep every op finite and away from subnormals however often it runs:
 * 1.0 (products stay 1), small integers. */
static void fill(void *buf, tutti_dtype_t dt)
{
    size_t n = buf_bytes / tutti_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        switch (dt) {
        case TUTTI_INT8:
        case TUTTI_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(i & 1); break;
        case TUTTI_INT16:
        case TUTTI_UINT16: ((uint16_t *)buf)[i] = (uint16_t)(i & 1); break;
        case TUTTI_INT32:
        case TUTTI_UINT32: ((uint32_t *)buf)[i] = (uint32_t)(i & 1); break;
        case TUTTI_INT64:
        case TUTTI_UINT64: ((uint64_t *)buf)[i] = (uint64_t)(i & 1); break;
        case TUTTI_FP16: ((uint16_t *)buf)[i] = tt_float_to_half(1.0f); break;
        case TUTTI_BF16: ((uint16_t *)buf)[i] = tt_float_to_bf16(1.0f); break;
        case TUTTI_FP32: ((float *)buf)[i] = 1.0f; break;
        case TUTTI_FP64: ((double *)buf)[i] = 1.0; break;
        case TUTTI_COMPLEX64: /* 1 + 0i */
            ((float *)buf)[2 * i] = 1.0f, ((float *)buf)[2 * i + 1] = 0.0f;
            break;
        case TUTTI_COMPLEX128:
            ((double *)buf)[2 * i] = 1.0, ((double *)buf)[2 * i + 1] = 0.0;
            break;
        case TUTTI_FP8_E4M3:
        case TUTTI_FP8_E5M2: ((uint8_t *)buf)[i] = tt_float_to_fp8(1.0f, dt); break;
        default: break;
        }
    }
    if (tt_dtype_is_pair(dt)) { /* values of alternating order, the element's index */
        memset(buf, 0, n * tutti_dtype_size(dt));
        for (size_t i = 0; i < n; i++) {
            unsigned char *p = (unsigned char *)buf + i * tutti_dtype_size(dt);
            int32_t idx = (int32_t)i, v = (int32_t)(i % 3);
            float f = (float)v;
            double d = v;
            int64_t l = v;
            int16_t h = (int16_t)v;
            switch (dt) {
            case TUTTI_FLOAT_INT:
                memcpy(p, &f, 4), memcpy(p + offsetof(tt_pair_float_int_t, i), &idx, 4);
                break;
            case TUTTI_DOUBLE_INT:
                memcpy(p, &d, 8), memcpy(p + offsetof(tt_pair_double_int_t, i), &idx, 4);
                break;
            case TUTTI_LONG_INT:
                memcpy(p, &l, 8), memcpy(p + offsetof(tt_pair_long_int_t, i), &idx, 4);
                break;
            case TUTTI_2INT:
                memcpy(p, &v, 4), memcpy(p + offsetof(tt_pair_2int_t, i), &idx, 4);
                break;
            default: memcpy(p, &h, 2), memcpy(p + offsetof(tt_pair_short_int_t, i), &idx, 4); break;
            }
        }
    }
}

static void row(const char *label, double sec, double traffic_factor, double ref_traffic)
{
    double in = (double)buf_bytes / sec / 1e9, traffic = in * traffic_factor;
    printf("%-22s %9.3f %9.2f %12.2f", label, sec * 1e3, in, traffic);
    if (ref_traffic > 0)
        printf(" %10.2f", traffic / ref_traffic);
    printf("\n");
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 64;
    if (argc > 2)
        reps = atoi(argv[2]);
    if (mib == 0 || reps < 1 || reps > 64) {
        fprintf(stderr, "usage: %s [MiB [reps (1..64)]]\n", argv[0]);
        return 2;
    }
    buf_bytes = mib << 20;
    dst_buf = aligned_alloc(64, buf_bytes);
    src_buf = aligned_alloc(64, buf_bytes);
    src2_buf = aligned_alloc(64, buf_bytes);
    if (!dst_buf || !src_buf || !src2_buf) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    memset(dst_buf, 0, buf_bytes); /* fault the pages in before timing */
    memset(src_buf, 0, buf_bytes);
    memset(src2_buf, 0, buf_bytes);

    printf("kernels: %s, buffer %zu MiB, median of %d\n", tt_reduce_isa_name(), mib, reps);
    printf("in GB/s: buffer bytes / time; traffic GB/s: bytes moved / time (reduce 3x: "
           "read dst, read src, write dst; memcpy 2x)\n\n");
    printf("%-22s %9s %9s %12s %10s\n", "kernel", "ms", "in GB/s", "traffic GB/s", "vs memcpy");

    double t_memcpy = time_run(RUN_MEMCPY, TUTTI_DTYPE_COUNT, TUTTI_SUM);
    double memcpy_traffic = 2.0 * (double)buf_bytes / t_memcpy / 1e9;
    row("memcpy", t_memcpy, 2.0, 0);

    fill(dst_buf, TUTTI_FP32);
    fill(src_buf, TUTTI_FP32);
    row("f32 sum naive scalar", time_run(RUN_NAIVE, TUTTI_FP32, TUTTI_SUM), 3.0, memcpy_traffic);
    row("f32 sum naive default", time_run(RUN_NAIVE_DEFAULT, TUTTI_FP32, TUTTI_SUM), 3.0,
        memcpy_traffic);
    fill(src2_buf, TUTTI_FP32);
    row("f32 sum tt_reduce3", time_run(RUN_REDUCE3, TUTTI_FP32, TUTTI_SUM), 3.0, memcpy_traffic);

    for (int dt = 0; dt < TUTTI_DTYPE_COUNT; dt++) {
        fill(dst_buf, (tutti_dtype_t)dt);
        fill(src_buf, (tutti_dtype_t)dt);
        for (int op = TUTTI_SUM; op < TUTTI_REDOP_COUNT; op++) {
            char label[32];
            /* AVG reduces as SUM; the bitwise ops take integer dtypes only */
            if (op == TUTTI_AVG || !tutti_redop_supported((tutti_redop_t)op, (tutti_dtype_t)dt))
                continue;
            snprintf(label, sizeof(label), "%s %s", tutti_dtype_name((tutti_dtype_t)dt),
                     tutti_redop_name((tutti_redop_t)op));
            row(label, time_run(RUN_REDUCE, (tutti_dtype_t)dt, (tutti_redop_t)op), 3.0,
                memcpy_traffic);
        }
    }
    free(dst_buf);
    free(src_buf);
    free(src2_buf);
    return 0;
}
