/* Timing and percentiles, shared by tutti-bench and the Open MPI peer (bench/peers/
 * mpi_bench.c), so that both measure by one method. Header-only: mpi_bench builds with
 * mpicc outside meson. */
#ifndef TT_BENCH_STATS_H
#define TT_BENCH_STATS_H

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
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
 * time, algbw, busbw, #wrong, p50 and p99 for out-of-place and (halves 2) for in-place. */
static inline void print_column_titles_n(int halves)
{
    printf("#%11s %12s %6s %6s %5s", "size", "count", "type", "redop", "root");
    for (int h = 0; h < halves; h++)
        printf("  %9s %8s %8s %7s %9s %9s", "time", "algbw", "busbw", "#wrong", "p50", "p99");
    printf("\n#%11s %12s %6s %6s %5s", "(B)", "(elements)", "", "", "");
    for (int h = 0; h < halves; h++)
        printf("  %9s %8s %8s %7s %9s %9s", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)");
    printf("\n");
}

static inline void print_column_titles(void)
{
    print_column_titles_n(2);
}

/* ---- --window: every rank starts timed call i at one instant ---------------------------
 * After a barrier each rank times a call from its own exit, and barriers let ranks go in
 * different orders (MPICH's shm barrier frees rank 0 first, a 2-rank dissemination
 * barrier frees the rank that came last): a rooted call's time then measures that order
 * as much as the call (docs/benchmarks.md, session 47). With --window every rank instead
 * starts timed call i at T0 + i x gap on the host's monotonic clock and times it from
 * there, as ReproMPI does (Hunold and Carpen-Amarie, "Reproducible MPI benchmarking is
 * still not as easy as you think", 2016): the per-iteration max over ranks is then the
 * time from a common start to the last rank's return. One clock: the ranks must share a
 * host (network namespaces do). A call a rank reached after its start (descheduled, or
 * the gap too short) is late and left out; when more than a tenth are late, the loop
 * runs again with the gap doubled, up to BENCH_WINDOW_TRIES times in all. */
#define BENCH_WINDOW_TRIES 8
#define BENCH_WINDOW_SEEN 256       /* warm-up calls kept for their median */
#define BENCH_WINDOW_LEAD_US 2000.0 /* from rank 0's reading of T0 to T0 */

/* What a harness gives the window loop; each returns 0 or its library's error. */
typedef struct bench_window_ops {
    void *ctx;
    int (*prepare)(void *ctx);                 /* --fresh's rewrite, or NULL */
    int (*call)(void *ctx);                    /* the call timed */
    int (*max)(void *ctx, double *v, int n);   /* in place, max over ranks */
    int (*bcast)(void *ctx, double *v, int n); /* rank 0's values to every rank */
} bench_window_ops_t;

/* A half sleeps between its timed calls only if its median warm-up call (over ranks,
 * the largest; with the --fresh refill) took this long: a wake-up costs every system
 * alike some 20-30 us here, and which side of the line a half falls must not hang on
 * one slow warm-up call (bench_window_times). */
#define BENCH_WINDOW_SLEEP_US 250.0

/* --gap US (every harness): timed calls start at least US apart, as an application's own
 * work between its collectives would space them (0: the window's own gap alone,
 * bench_window_times); the ranks sleep through it, a CPU idle between calls, unless
 * --gap-busy has them spin (a CPU busy). A 4-rank 1 MiB allreduce after 20 ms either way
 * took 1.6-2.2x its time back to back here, Open MPI's 1.0-1.5x (docs/benchmarks.md,
 * session 65); over tcp most of tutti's extra was the kernel's pacing of loopback
 * segments, left on by BBR on a link switched to reno once connected (session 67,
 * transports/tcp/tcp_setup.c cc_initial; session 66 had blamed delayed acknowledgements). */
static double bench_window_min_gap_us;
static int bench_window_gap_busy;
/* --fill-late (implies --fresh and --window): the rewrite just before each start, after
 * the wait, as an application writes its gradient just before the collective, rather
 * than before the wait, from where the input may leave the caches across a long --gap
 * (session 66: that changed a 4-rank 1 MiB allreduce after 20 ms little). */
static int bench_window_fill_late;

/* The header's words for --fresh: when the input is rewritten. */
static inline const char *bench_fresh_words(int fresh)
{
    return !fresh                   ? ""
           : bench_window_fill_late ? ", input rewritten just before each (--fill-late)"
                                    : ", input rewritten before each";
}

/* Waits for instant t (now_us's clock): if may_sleep, sleeps to 200 us before it (when
 * over 300 us remain); yields to 5 us before, then spins. 1 if it was already past t
 * (late), else 0. */
static inline int bench_window_wait(double t, int may_sleep)
{
    double now = now_us();
    if (now > t)
        return 1;
    if (may_sleep && t - now > 300.0) {
        double until = t - 200.0;
        struct timespec ts;
        ts.tv_sec = (time_t)(until / 1e6);
        ts.tv_nsec = (long)((until - (double)ts.tv_sec * 1e6) * 1e3);
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
    }
    while (now_us() < t - 5.0)
        sched_yield();
    while (now_us() < t)
        ;
    return 0;
}

/* Over a run: late calls left out, calls timed, the widest gap (us); one process's. */
static long long bench_window_late_n, bench_window_timed_n;
static double bench_window_gap_max;
/* halves timed, and those whose ranks slept between calls (BENCH_WINDOW_SLEEP_US) */
static long long bench_window_halves_n, bench_window_slept_n;

static inline void bench_window_tally(int late, int iters, double gap)
{
    bench_window_late_n += late;
    bench_window_timed_n += iters;
    bench_window_gap_max = gap > bench_window_gap_max ? gap : bench_window_gap_max;
}

/* The run's "# Window:" line (run-peers.sh reads it), if any call was timed so. */
static inline void bench_window_print(void)
{
    if (bench_window_timed_n)
        printf("# Window: %lld of %lld timed calls left out (a rank late for its start); widest "
               "gap %.0f us; %lld of %lld halves slept between calls\n",
               bench_window_late_n, bench_window_timed_n, bench_window_gap_max,
               bench_window_slept_n, bench_window_halves_n);
}

/* Moves the finite values of v[0..n) to its front, in order; returns their count. */
static inline int bench_window_keep(double *v, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i]))
            v[k++] = v[i];
    return k;
}

/* warmup untimed calls (at least one: their slowest, over ranks, sets the gap; with two
 * or more, the slowest after the first, whose one-off costs (a buffer's first touch, a
 * connection's first large message: 0.35-6.8 ms here, where the calls after it took 5-300
 * us) would put every rank to sleep between the timed calls of the first size of a run,
 * the others not: 13 us against 6 for a 4-rank shm allreduce of 4 B, Open MPI's as
 * tutti's); their median (over ranks, the largest) decides whether a rank may sleep
 * while it waits (BENCH_WINDOW_SLEEP_US: the slowest decided it, through the gap, until
 * session 64, and one slow warm-up call of 19 put a 4-rank tcp alltoall of 64 KiB to
 * sleep between calls in one run and not the next: 75-90 us against 56, Open MPI's as
 * tutti's); then iters timed ones on the window schedule: times[i] the per-iteration
 * max over ranks, INFINITY where a rank was late; returns how many are not. *late_p:
 * the late iterations of the last try; *gap_p: its gap, us. -1: an op failed, its
 * nonzero return in *err_p (a library's codes may be negative, as tutti's, or positive,
 * as MPI's). */
static inline int bench_window_times(const bench_window_ops_t *o, int rank, int warmup, int iters,
                                     double *times, int *late_p, double *gap_p, int *err_p)
{
    int st;
    double w = 0.0, t, prep = 0.0;
    if (o->prepare) { /* the rewrite before each timed call: in the gap too */
        t = now_us();
        if ((st = o->prepare(o->ctx)) != 0)
            return *err_p = st, -1;
        prep = now_us() - t;
    }
    double seen[BENCH_WINDOW_SEEN];
    int nseen = 0;
    for (int i = 0; i < (warmup > 0 ? warmup : 1); i++) {
        t = now_us();
        if ((st = o->call(o->ctx)) != 0)
            return *err_p = st, -1;
        t = now_us() - t;
        if (i > 0 || warmup < 2) { /* the first call's one-off costs set no gap */
            w = t > w ? t : w;
            if (nseen < BENCH_WINDOW_SEEN)
                seen[nseen++] = t;
        }
    }
    qsort(seen, (size_t)nseen, sizeof seen[0], cmp_double);
    double wv[2] = { w + prep, seen[(nseen - 1) / 2] + prep }; /* slowest, median */
    if ((st = o->max(o->ctx, wv, 2)) != 0)
        return *err_p = st, -1;
    w = wv[0];
    const int may_sleep = !bench_window_gap_busy &&
                          (wv[1] >= BENCH_WINDOW_SLEEP_US || bench_window_min_gap_us > 0.0);
    bench_window_halves_n++;
    bench_window_slept_n += may_sleep;
    double gap = 2.0 * w + 50.0;
    gap = gap < bench_window_min_gap_us ? bench_window_min_gap_us : gap;
    int valid = 0;
    for (int try_ = 0; try_ < BENCH_WINDOW_TRIES; try_++, gap *= 2.0) {
        double t0 = rank == 0 ? now_us() + BENCH_WINDOW_LEAD_US + gap : 0.0;
        if ((st = o->bcast(o->ctx, &t0, 1)) != 0)
            return *err_p = st, -1;
        for (int i = 0; i < iters; i++) {
            double start = t0 + (double)i * gap;
            if (o->prepare && bench_window_fill_late) /* crowded CPUs fill in turns */
                (void)bench_window_wait(start - 4.0 * prep - 200.0, may_sleep);
            if (o->prepare && (st = o->prepare(o->ctx)) != 0)
                return *err_p = st, -1;
            int late = bench_window_wait(start, may_sleep);
            if ((st = o->call(o->ctx)) != 0)
                return *err_p = st, -1;
            times[i] = late ? INFINITY : now_us() - start;
        }
        if ((st = o->max(o->ctx, times, iters)) != 0)
            return *err_p = st, -1;
        valid = 0;
        for (int i = 0; i < iters; i++)
            valid += isfinite(times[i]) != 0;
        *late_p = iters - valid;
        *gap_p = gap;
        if (10 * (iters - valid) <= iters)
            break;
    }
    return valid;
}

#endif /* TT_BENCH_STATS_H */
