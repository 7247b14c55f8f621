/* Timing and percentiles, shared by tutti-bench and the Open MPI peer (bench/peers/
 * mpi_bench.c), so that both measure by one method. Header-only: mpi_bench builds with
 * mpicc outside meson. */
#ifndef TT_BENCH_STATS_H
#define TT_BENCH_STATS_H

#include <math.h>
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

#endif /* TT_BENCH_STATS_H */
