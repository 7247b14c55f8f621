/* What mpi-bench and gloo-bench share, so that they measure and check as tutti-bench
 * does (float sum): the collectives, the size and busbw conventions, the inputs and
 * expected results, the preparation of each half's buffers, the common flags and the
 * printing of a row. Header-only and valid C and C++: mpi-bench builds with mpicc
 * outside meson, gloo-bench with meson's C++ compiler. */
#ifndef TT_BENCH_PEER_H
#define TT_BENCH_PEER_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../stats.h"

enum peer_coll {
    PEER_ALLREDUCE,
    PEER_BROADCAST,
    PEER_BARRIER,
    PEER_ALLGATHER,
    PEER_REDUCE_SCATTER,
    PEER_ALLTOALL,
    PEER_SCAN,              /* MPI only (Gloo has none) */
    PEER_EXSCAN,            /* MPI only */
    PEER_NEIGHBOR_ALLTOALL, /* MPI only: on a periodic ring (MPI_Cart_create), 2 blocks */
    PEER_NCOLLS
};

static const char *const peer_coll_names[PEER_NCOLLS] = {
    "allreduce", "broadcast", "barrier", "allgather",         "reduce_scatter",
    "alltoall",  "scan",      "exscan",  "neighbor_alltoall",
};

/* timed out of place only: a barrier (no data), neighbor_alltoall (no in-place form) */
static inline int peer_one_half(int coll)
{
    return coll == PEER_BARRIER || coll == PEER_NEIGHBOR_ALLTOALL;
}

typedef struct peer_cfg {
    int coll; /* enum peer_coll */
    size_t min_bytes, max_bytes, factor;
    int iters, warmup, check, sync, fresh, root;
    int window; /* --window: every rank starts each timed call at one instant (stats.h) */
} peer_cfg_t;

/* One half (out-of-place or in-place) of a row; wrong -1: not checked. */
typedef struct peer_half {
    double mean, p50, p99;
    long long wrong;
} peer_half_t;

static inline peer_cfg_t peer_default_cfg(void)
{
    peer_cfg_t c;
    memset(&c, 0, sizeof(c));
    c.coll = PEER_ALLREDUCE;
    c.min_bytes = 8;
    c.max_bytes = (size_t)64 << 20;
    c.factor = 2;
    c.iters = 20;
    c.warmup = 5;
    return c;
}

/* tutti-bench's conventions: the blocked collectives' count is the per-rank block and
 * their size is nranks x count x 4; busbw = algbw x nccl-tests' factor. */
static inline int peer_blocked(int coll)
{
    return coll == PEER_ALLGATHER || coll == PEER_REDUCE_SCATTER || coll == PEER_ALLTOALL;
}

static inline double peer_busbw_factor(int coll, int n)
{
    if (coll == PEER_ALLREDUCE)
        return 2.0 * (n - 1) / n;
    return peer_blocked(coll) ? (double)(n - 1) / n : 1.0;
}

/* Elements of the send and of the receive buffer for a count of c. */
static inline size_t peer_send_count(int coll, int n, size_t c)
{
    if (coll == PEER_NEIGHBOR_ALLTOALL)
        return 2 * c;
    return coll == PEER_REDUCE_SCATTER || coll == PEER_ALLTOALL ? (size_t)n * c : c;
}

static inline size_t peer_recv_count(int coll, int n, size_t c)
{
    if (coll == PEER_NEIGHBOR_ALLTOALL)
        return 2 * c;
    return coll == PEER_ALLGATHER || coll == PEER_ALLTOALL ? (size_t)n * c : c;
}

/* The inputs are tutti-bench's for float sum (small integers: every partial sum is exact
 * in any order): reductions, the broadcast root's data, and the blocks the data-moving
 * collectives place (key: the source rank; source x n + destination for alltoall). */
static inline float peer_red_value(int r, size_t i)
{
    return (float)(((size_t)r + i) % 3) - 1.0f;
}

static inline float peer_bcast_value(int r, size_t i)
{
    return (float)((size_t)(r * 5) + i % 11) - 5.0f;
}

static inline float peer_move_value(size_t key, size_t i)
{
    return (float)((key * 37 + i * 3 + 1) % 101) - 50.0f;
}

#define PEER_SENTINEL (-99.0f)

static inline float peer_send_value(const peer_cfg_t *cfg, int me, int n, size_t c, size_t i)
{
    switch (cfg->coll) {
    case PEER_BROADCAST: return peer_bcast_value(me, i);
    case PEER_ALLGATHER: return peer_move_value((size_t)me, i);
    case PEER_ALLTOALL: return peer_move_value((size_t)me * (size_t)n + i / c, i % c);
    /* block 0 to the rank back, 1 to the one forward */
    case PEER_NEIGHBOR_ALLTOALL: return peer_move_value((size_t)me * 2 + i / c, i % c);
    default: return peer_red_value(me, i);
    }
}

/* Computed here from the inputs, independently of the library under test. */
static inline float peer_expected(const peer_cfg_t *cfg, int me, int n, size_t c, size_t i)
{
    size_t at = cfg->coll == PEER_REDUCE_SCATTER ? (size_t)me * c + i : i;
    float sum = 0.0f;
    switch (cfg->coll) {
    case PEER_BROADCAST: return peer_bcast_value(cfg->root, i);
    case PEER_ALLGATHER: return peer_move_value(i / c, i % c);
    case PEER_ALLTOALL: return peer_move_value((i / c) * (size_t)n + (size_t)me, i % c);
    case PEER_NEIGHBOR_ALLTOALL: /* slot 0 from the rank back (its block 1), 1 from the front */
        return i / c == 0 ? peer_move_value((size_t)((me + n - 1) % n) * 2 + 1, i % c)
                          : peer_move_value((size_t)((me + 1) % n) * 2, i % c);
    default: /* scan: ranks 0..me; exscan: 0..me-1 */
        for (int r = 0; r < (cfg->coll == PEER_SCAN     ? me + 1
                             : cfg->coll == PEER_EXSCAN ? me
                                                        : n);
             r++)
            sum += peer_red_value(r, at);
        return sum;
    }
}

/* Elements [0, count) of buf from its first period, copied in doubling steps: as
 * tutti-bench fills (its fill_repeat), so that --fresh's rewrite runs at memory speed in
 * every harness (how long ago the data was written changes how fast it moves). */
static inline void peer_fill_repeat(float *buf, size_t count, size_t period)
{
    for (size_t done = period < count ? period : count; done < count;) {
        size_t k = done < count - done ? done : count - done;
        memcpy(buf + done, buf, k * sizeof(float));
        done += k;
    }
}

static inline void peer_fill_input(const peer_cfg_t *cfg, int me, int n, size_t c, float *buf)
{
    size_t count = peer_send_count(cfg->coll, n, c);
    /* the period of peer_send_value in i (within a block of c for alltoall) */
    size_t period = cfg->coll == PEER_BROADCAST                                         ? 11
                    : cfg->coll == PEER_ALLGATHER                                       ? 101
                    : cfg->coll == PEER_ALLTOALL || cfg->coll == PEER_NEIGHBOR_ALLTOALL ? 101
                                                                                        : 3;
    size_t block = cfg->coll == PEER_ALLTOALL || cfg->coll == PEER_NEIGHBOR_ALLTOALL ? c : count;
    for (size_t b0 = 0; b0 < count; b0 += block) {
        size_t len = block < count - b0 ? block : count - b0;
        for (size_t i = 0; i < period && i < len; i++)
            buf[b0 + i] = peer_send_value(cfg, me, n, c, b0 + i);
        peer_fill_repeat(buf + b0, len, period);
    }
}

static inline void peer_fill_sentinel(float *buf, size_t count)
{
    if (count == 0)
        return;
    buf[0] = PEER_SENTINEL;
    peer_fill_repeat(buf, count, 1);
}

/* tutti-bench's prepare(): out of place, the input in send and the sentinel in recv; in
 * place, everything in recv (allgather: the sentinel with this rank's block in place;
 * broadcast: the input at the root only). */
static inline void peer_prepare(const peer_cfg_t *cfg, int me, int n, size_t c, int in_place,
                                float *send, float *recv)
{
    size_t rc = peer_recv_count(cfg->coll, n, c);
    if (cfg->coll == PEER_BARRIER)
        return;
    if (!in_place) {
        peer_fill_input(cfg, me, n, c, send);
        peer_fill_sentinel(recv, rc);
    } else if (cfg->coll == PEER_ALLGATHER) {
        peer_fill_sentinel(recv, rc);
        peer_fill_input(cfg, me, n, c, recv + (size_t)me * c);
    } else if (cfg->coll == PEER_BROADCAST && me != cfg->root) {
        peer_fill_sentinel(recv, rc);
    } else {
        peer_fill_input(cfg, me, n, c, recv);
    }
}

/* Elements of this rank's result (recv_count of them at res) that differ. */
static inline long long peer_count_wrong(const peer_cfg_t *cfg, int me, int n, size_t c,
                                         const float *res)
{
    size_t count = peer_recv_count(cfg->coll, n, c);
    long long wrong = 0;
    if (cfg->coll == PEER_EXSCAN && me == 0) /* its result is undefined */
        return 0;
    for (size_t i = 0; i < count; i++)
        wrong += res[i] != peer_expected(cfg, me, n, c, i);
    return wrong;
}

/* The per-iteration maxima over ranks (times, sorted here) -> mean, p50, p99. */
static inline void peer_stats(double *times, int iters, peer_half_t *h)
{
    h->mean = 0.0;
    for (int i = 0; i < iters; i++)
        h->mean += times[i];
    h->mean /= iters;
    qsort(times, (size_t)iters, sizeof(double), cmp_double);
    h->p50 = percentile(times, iters, 50);
    h->p99 = percentile(times, iters, 99);
}

/* The count of a row of SIZE bytes; 0: less than one element per rank, no row. */
static inline size_t peer_row_count(const peer_cfg_t *cfg, int n, size_t size)
{
    size_t unit = peer_blocked(cfg->coll)               ? (size_t)n * sizeof(float)
                  : cfg->coll == PEER_NEIGHBOR_ALLTOALL ? 2 * sizeof(float)
                                                        : sizeof(float);
    return size / unit;
}

static inline int peer_parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10), mul = 1;
    if (errno || end == s)
        return -1;
    if (*end == 'k' || *end == 'K')
        mul = 1ull << 10, end++;
    else if (*end == 'm' || *end == 'M')
        mul = 1ull << 20, end++;
    else if (*end == 'g' || *end == 'G')
        mul = 1ull << 30, end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end)
        return -1;
    *out = (size_t)(v * mul);
    return 0;
}

static inline int peer_parse_int(const char *s, int *out, int min)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > (1l << 30))
        return -1;
    *out = (int)v;
    return 0;
}

static inline int peer_parse_coll(const char *s, int *coll_p)
{
    for (int c = 0; c < PEER_NCOLLS; c++)
        if (!strcmp(s, peer_coll_names[c])) {
            *coll_p = c;
            return 0;
        }
    return -1;
}

/* One of the flags every harness takes (value v, NULL at the end of argv): 1 if it was
 * one (*takes_p: whether it used v), 0 if not, -1 if its value is bad. */
static inline int peer_parse_flag(peer_cfg_t *cfg, const char *a, const char *v, int *takes_p)
{
    int bad = 0;
    *takes_p = 0;
    if (!strcmp(a, "-c") || !strcmp(a, "--check")) {
        cfg->check = 1;
        return 1;
    }
    if (!strcmp(a, "--sync")) {
        cfg->sync = 1;
        return 1;
    }
    if (!strcmp(a, "--fresh")) { /* the fill, then the barrier: --sync too */
        cfg->fresh = cfg->sync = 1;
        return 1;
    }
    if (!strcmp(a, "--window")) {
        cfg->window = 1;
        return 1;
    }
    if (!strcmp(a, "--gap-busy")) {
        bench_window_gap_busy = 1;
        return 1;
    }
    if (!strcmp(a, "--fill-late")) { /* implies --fresh --window */
        bench_window_fill_late = 1;
        cfg->fresh = cfg->sync = cfg->window = 1;
        return 1;
    }
    if (!strcmp(a, "--coll"))
        bad = !v || peer_parse_coll(v, &cfg->coll);
    else if (!strcmp(a, "-b"))
        bad = !v || peer_parse_size(v, &cfg->min_bytes);
    else if (!strcmp(a, "-e"))
        bad = !v || peer_parse_size(v, &cfg->max_bytes);
    else if (!strcmp(a, "-f"))
        bad = !v || peer_parse_size(v, &cfg->factor) || cfg->factor < 2;
    else if (!strcmp(a, "-n"))
        bad = !v || peer_parse_int(v, &cfg->iters, 1);
    else if (!strcmp(a, "-w"))
        bad = !v || peer_parse_int(v, &cfg->warmup, 0);
    else if (!strcmp(a, "-r") || !strcmp(a, "--root"))
        bad = !v || peer_parse_int(v, &cfg->root, 0);
    else if (!strcmp(a, "--gap")) { /* implies --window */
        int us = 0;
        bad = !v || peer_parse_int(v, &us, 1);
        bench_window_min_gap_us = us;
        cfg->window = 1;
    } else
        return 0;
    *takes_p = 1;
    return bad ? -1 : 1;
}

#define PEER_FLAGS_USAGE                                                                           \
    "  --coll NAME   allreduce (default), broadcast, allgather, reduce_scatter, alltoall,\n"       \
    "                barrier, scan, exscan, neighbor_alltoall (MPI only; a periodic\n"             \
    "                ring, size = 2 x the block to each neighbour) (float sum)\n"                  \
    "  -b, -e SIZE   smallest/largest size, bytes with K/M/G suffixes (default 8 .. 64M);\n"       \
    "                allgather, reduce_scatter, alltoall: size = nranks x per-rank block\n"        \
    "  -f FACTOR     size multiplier between rows (default 2)\n"                                   \
    "  -n ITERS      timed iterations per size (default 20)\n"                                     \
    "  -w WARMUP     untimed iterations per size (default 5)\n"                                    \
    "  -c, --check   verify results against a reference computed here (#wrong)\n"                  \
    "  --sync        barrier (untimed) before each timed iteration\n"                              \
    "  --fresh       rewrite the input before each timed iteration (untimed; then --sync's\n"      \
    "                barrier): the data moved was just written by its rank, not left clean\n"      \
    "                in the peers' caches by the previous call\n"                                  \
    "  --window      every rank starts timed call i at one instant of the host's clock\n"          \
    "                and times it from there, instead of from its exit from --sync's\n"            \
    "                barrier (ranks on one host only; bench/stats.h)\n"                            \
    "  --gap US      (--window) timed calls start at least US microseconds apart, the\n"           \
    "                ranks asleep in between (an application's other work)\n"                      \
    "  --gap-busy    the ranks spin through the gap instead of sleeping\n"                         \
    "  --fill-late   --fresh --window, the rewrite just before each start, not before the wait\n"  \
    "  -r ROOT       broadcast root (default 0)\n"

static inline void peer_print_header(const peer_cfg_t *cfg, const char *who, int n,
                                     const char *what)
{
    printf("# %s: %s, %d ranks, %s, dtype float, op sum\n", who, peer_coll_names[cfg->coll], n,
           what);
    printf("# iters %d, warmup %d, time = mean over iterations of the max over ranks%s%s\n",
           cfg->iters, cfg->warmup, bench_fresh_words(cfg->fresh),
           cfg->window ? ", each started at one instant on every rank (--window)"
           : cfg->sync ? ", barrier before each"
                       : "");
    printf("#%43s%-61s%s\n", "", "out-of-place", "in-place");
    print_column_titles();
}

static inline void peer_print_half(const peer_half_t *h, size_t bytes, double factor, int barrier)
{
    char wrong[32];
    if (h->wrong < 0)
        snprintf(wrong, sizeof(wrong), "N/A");
    else
        snprintf(wrong, sizeof(wrong), "%lld", h->wrong);
    double algbw = barrier ? 0.0 : (double)bytes / 1e3 / h->mean; /* GB/s */
    printf("  %9.2f %8.3f %8.3f %7s %9.2f %9.2f", h->mean, algbw, algbw * factor, wrong, h->p50,
           h->p99);
}

/* A row: both halves (barrier: the first twice, so every row has the same columns). */
static inline void peer_print_row(const peer_cfg_t *cfg, int n, size_t count,
                                  const peer_half_t h[2])
{
    int barrier = cfg->coll == PEER_BARRIER;
    size_t bytes = peer_blocked(cfg->coll)               ? (size_t)n * count * sizeof(float)
                   : cfg->coll == PEER_NEIGHBOR_ALLTOALL ? 2 * count * sizeof(float)
                                                         : count * sizeof(float);
    double factor = peer_busbw_factor(cfg->coll, n);
    printf(" %11zu %12zu %6s %6s %5d", bytes, count, barrier ? "none" : "float",
           cfg->coll == PEER_ALLREDUCE || cfg->coll == PEER_REDUCE_SCATTER ? "sum" : "none",
           cfg->coll == PEER_BROADCAST ? cfg->root : -1);
    peer_print_half(&h[0], bytes, factor, barrier);
    /* (once-timed collectives print their one half twice, as the columns expect) */
    peer_print_half(&h[peer_one_half(cfg->coll) ? 0 : 1], bytes, factor, barrier);
    printf("\n");
    fflush(stdout);
}

static inline void peer_print_summary(long long wrong)
{
    printf("# Out of bounds values : %lld %s\n", wrong, wrong ? "FAILED" : "OK");
    bench_window_print();
    fflush(stdout);
}

#endif /* TT_BENCH_PEER_H */
