/* mpi-bench: the tutti-bench measurement against MPI_Allreduce/MPI_Bcast/MPI_Barrier.
 *
 *   mpirun -np N mpi-bench [--coll allreduce|broadcast|barrier] [-b MIN] [-e MAX]
 *                          [-f FACTOR] [-n ITERS] [-w WARMUP] [-c] [-r ROOT]
 *
 * float sum, the same columns as tutti-bench: an out-of-place and an in-place half, each
 * time/algbw/busbw/#wrong/p50/p99. Each rank times every call; after the timed loop the
 * per-iteration times are reduced with MPI_MAX, and time (mean), p50 and p99 come from
 * those maxima. MPI_Bcast has no out-of-place form: its out-of-place half times the
 * root's copy of sendbuf into recvbuf plus MPI_Bcast of recvbuf.
 * Built by run-peers.sh with mpicc; not part of the meson build.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "../stats.h"

enum coll { COLL_ALLREDUCE, COLL_BROADCAST, COLL_BARRIER };

struct config {
    enum coll coll;
    size_t min_bytes, max_bytes, factor;
    int iters, warmup, check, root;
};

static int rank_, size_;

static void usage(FILE *f)
{
    fprintf(f, "usage: mpi-bench [--coll allreduce|broadcast|barrier] [-b MIN] [-e MAX]\n"
               "                 [-f FACTOR] [-n ITERS] [-w WARMUP] [-c] [-r ROOT]\n"
               "  sizes in bytes with K/M/G suffixes (default 8 .. 64M, factor 2),\n"
               "  -n timed iterations (20), -w warmup iterations (5), -c verify results\n");
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    unsigned long long mul = 1;
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

static int parse_int(const char *s, int *out, int min)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > (1l << 30))
        return -1;
    *out = (int)v;
    return 0;
}

/* Small integers, so float sums are exact and the reference is too. */
static float input_value(int rank, size_t i)
{
    return (float)((rank * 7 + (int)(i % 13)) % 17);
}

static void fill(const struct config *cfg, float *buf, size_t count, int as_input)
{
    for (size_t i = 0; i < count; i++)
        buf[i] = (as_input && (cfg->coll == COLL_ALLREDUCE || rank_ == cfg->root))
                     ? input_value(rank_, i)
                     : -1.0f;
}

static long count_wrong(const struct config *cfg, const float *buf, size_t count)
{
    long wrong = 0;
    for (size_t i = 0; i < count; i++) {
        float expect = 0.0f;
        if (cfg->coll == COLL_BROADCAST)
            expect = input_value(cfg->root, i);
        else
            for (int r = 0; r < size_; r++)
                expect += input_value(r, i);
        if (buf[i] != expect)
            wrong++;
    }
    return wrong;
}

static void run_once(const struct config *cfg, float *send, float *recv, size_t count, int in_place)
{
    switch (cfg->coll) {
    case COLL_ALLREDUCE:
        MPI_Allreduce(in_place ? MPI_IN_PLACE : send, recv, (int)count, MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
        break;
    case COLL_BROADCAST:
        if (!in_place && rank_ == cfg->root)
            memcpy(recv, send, count * sizeof(float));
        MPI_Bcast(recv, (int)count, MPI_FLOAT, cfg->root, MPI_COMM_WORLD);
        break;
    case COLL_BARRIER: MPI_Barrier(MPI_COMM_WORLD); break;
    }
}

struct half {
    double mean, p50, p99;
    long wrong; /* -1: not checked */
};

/* Time one half (out-of-place or in-place) of a row. */
static void run_half(const struct config *cfg, float *send, float *recv, size_t count, int in_place,
                     double *times, struct half *h)
{
    fill(cfg, send, count, 1);
    fill(cfg, recv, count, in_place);
    for (int i = 0; i < cfg->warmup; i++)
        run_once(cfg, send, recv, count, in_place);
    for (int i = 0; i < cfg->iters; i++) {
        double t0 = now_us();
        run_once(cfg, send, recv, count, in_place);
        times[i] = now_us() - t0;
    }
    h->wrong = -1;
    if (cfg->check && cfg->coll != COLL_BARRIER) {
        fill(cfg, send, count, 1);
        fill(cfg, recv, count, in_place);
        run_once(cfg, send, recv, count, in_place);
        h->wrong = count_wrong(cfg, recv, count);
    }
    /* Max over ranks, per iteration, after the timed loop; #wrong rides along. */
    times[cfg->iters] = (double)h->wrong;
    MPI_Allreduce(MPI_IN_PLACE, times, cfg->iters + 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    h->wrong = (long)times[cfg->iters];
    h->mean = 0.0;
    for (int i = 0; i < cfg->iters; i++)
        h->mean += times[i];
    h->mean /= cfg->iters;
    qsort(times, (size_t)cfg->iters, sizeof(double), cmp_double);
    h->p50 = percentile(times, cfg->iters, 50);
    h->p99 = percentile(times, cfg->iters, 99);
}

static void print_half(const struct half *h, size_t bytes, double factor, int barrier)
{
    char wrong[32];
    if (h->wrong < 0)
        snprintf(wrong, sizeof(wrong), "N/A");
    else
        snprintf(wrong, sizeof(wrong), "%ld", h->wrong);
    if (barrier) {
        printf("  %9.2f %8s %8s %7s %9.2f %9.2f", h->mean, "-", "-", wrong, h->p50, h->p99);
    } else {
        double algbw = (double)bytes / 1e3 / h->mean; /* bytes/us / 1e3 = GB/s */
        printf("  %9.2f %8.3f %8.3f %7s %9.2f %9.2f", h->mean, algbw, algbw * factor, wrong, h->p50,
               h->p99);
    }
}

/* Returns -1 when the command line asks for a run, else the exit status (0 for --help,
 * 2 for bad usage); rank 0 says why. */
static int parse_args(int argc, char **argv, struct config *cfg_p)
{
    *cfg_p = (struct config){ COLL_ALLREDUCE, 8, 64u << 20, 2, 20, 5, 0, 0 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0, takes = 1;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (rank_ == 0)
                usage(stdout);
            return 0;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--check")) {
            cfg_p->check = 1, takes = 0;
        } else if (!v) {
            bad = 1;
        } else if (!strcmp(a, "--coll")) {
            if (!strcmp(v, "allreduce"))
                cfg_p->coll = COLL_ALLREDUCE;
            else if (!strcmp(v, "broadcast"))
                cfg_p->coll = COLL_BROADCAST;
            else if (!strcmp(v, "barrier"))
                cfg_p->coll = COLL_BARRIER;
            else
                bad = 1;
        } else if (!strcmp(a, "-b")) {
            bad = parse_size(v, &cfg_p->min_bytes);
        } else if (!strcmp(a, "-e")) {
            bad = parse_size(v, &cfg_p->max_bytes);
        } else if (!strcmp(a, "-f")) {
            bad = parse_size(v, &cfg_p->factor) || cfg_p->factor < 2;
        } else if (!strcmp(a, "-n")) {
            bad = parse_int(v, &cfg_p->iters, 1);
        } else if (!strcmp(a, "-w")) {
            bad = parse_int(v, &cfg_p->warmup, 0);
        } else if (!strcmp(a, "-r") || !strcmp(a, "--root")) {
            bad = parse_int(v, &cfg_p->root, 0) || cfg_p->root >= size_;
        } else {
            bad = 1;
        }
        if (bad) {
            if (rank_ == 0) {
                fprintf(stderr, "mpi-bench: bad argument %s\n", a);
                usage(stderr);
            }
            return 2;
        }
        i += takes;
    }
    if (cfg_p->min_bytes == 0 || cfg_p->min_bytes > cfg_p->max_bytes) {
        if (rank_ == 0)
            fprintf(stderr, "mpi-bench: need 0 < MIN <= MAX\n");
        return 2;
    }
    return -1;
}

static void print_header(const struct config *cfg)
{
    static const char *const names[] = { "allreduce", "broadcast", "barrier" };
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len;
    MPI_Get_library_version(lib, &len);
    lib[strcspn(lib, ",\n")] = '\0'; /* "Open MPI v4.1.4" */
    printf("# mpi-bench: %s, %d ranks, %s, dtype float, op sum\n", names[cfg->coll], size_, lib);
    printf("# iters %d, warmup %d, time = mean over iterations of the max over ranks\n", cfg->iters,
           cfg->warmup);
    printf("#%41s %-60s %s\n", "", "out-of-place", "in-place");
    print_column_titles();
    fflush(stdout);
}

/* Time and print every size, then the summary; returns the number of wrong values. */
static long bench_sizes(const struct config *cfg, double *times, float *send, float *recv)
{
    const int barrier = cfg->coll == COLL_BARRIER;
    const double factor = cfg->coll == COLL_ALLREDUCE ? 2.0 * (size_ - 1) / size_ : 1.0;
    double bw_sum = 0.0;
    int rows = 0;
    long total_wrong = 0;
    for (size_t size = barrier ? 0 : cfg->min_bytes; barrier || size <= cfg->max_bytes;
         size *= cfg->factor) {
        size_t count = size / sizeof(float);
        if (!barrier && count == 0)
            continue;
        size_t bytes = count * sizeof(float);
        struct half h[2];
        run_half(cfg, send, recv, count, 0, times, &h[0]);
        run_half(cfg, send, recv, count, 1, times, &h[1]);
        for (int k = 0; k < 2; k++) {
            total_wrong += h[k].wrong > 0 ? h[k].wrong : 0;
            bw_sum += barrier ? 0.0 : (double)bytes / 1e3 / h[k].mean * factor;
        }
        rows += 2;
        if (rank_ == 0) {
            printf(" %11zu %12zu %6s %6s %5d", bytes, count, barrier ? "none" : "float",
                   cfg->coll == COLL_ALLREDUCE ? "sum" : "none",
                   cfg->coll == COLL_BROADCAST ? cfg->root : -1);
            print_half(&h[0], bytes, factor, barrier);
            print_half(&h[1], bytes, factor, barrier);
            printf("\n");
            fflush(stdout);
        }
        if (barrier)
            break;
    }
    if (rank_ == 0) {
        printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g\n", rows ? bw_sum / rows : 0.0);
        fflush(stdout);
    }
    return total_wrong;
}

int main(int argc, char **argv)
{
    struct config cfg;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    int st = parse_args(argc, argv, &cfg);
    if (st >= 0) {
        MPI_Finalize();
        return st;
    }
    if (rank_ == 0)
        print_header(&cfg);

    double *times = malloc(sizeof(double) * (size_t)(cfg.iters + 1));
    float *send = malloc(cfg.max_bytes + sizeof(float));
    float *recv = malloc(cfg.max_bytes + sizeof(float));
    if (!times || !send || !recv) {
        fprintf(stderr, "mpi-bench: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    long total_wrong = bench_sizes(&cfg, times, send, recv);
    free(times);
    free(send);
    free(recv);
    MPI_Finalize();
    return total_wrong ? 1 : 0;
}
