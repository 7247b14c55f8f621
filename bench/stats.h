/* Timing and percentiles, shared by tutti-bench and the Open MPI peer (bench/peers/
 * mpi_bench.c), so that both measure by one method. Header-only: mpi_bench builds with
 * mpicc outside meson. */
#ifndef TT_BENCH_STATS_H
#define TT_BENCH_STATS_H

#include <math.h>
#include <stdio.h>
#include <time.h>

static inline double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of n sorted values. */
static inline double percentile(const double *sorted, int n, double p)
{
    int k = (int)ceil(p / 100.0 * n);
    k = k < 1 ? 1 : k > n ? n : k;
    return sorted[k - 1];
}

/* The two column-title lines of nccl-tests' table: size, count, type, redop, root, then
 * time, algbw, busbw, #wrong, p50 and p99 for out-of-place and for in-place. */
static inline void print_column_titles(void)
{
    printf("#%11s %12s %6s %6s %5s", "size", "count", "type", "redop", "root");
    for (int h = 0; h < 2; h++)
        printf("  %9s %8s %8s %7s %9s %9s", "time", "algbw", "busbw", "#wrong", "p50", "p99");
    printf("\n#%11s %12s %6s %6s %5s", "(B)", "(elements)", "", "", "");
    for (int h = 0; h < 2; h++)
        printf("  %9s %8s %8s %7s %9s %9s", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)");
    printf("\n");
}

#endif /* TT_BENCH_STATS_H */
