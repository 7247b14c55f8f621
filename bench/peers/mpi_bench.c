/* mpi-bench: tutti-bench's measurement of MPI_Allreduce, MPI_Bcast, MPI_Allgather,
 * MPI_Reduce_scatter_block, MPI_Alltoall, MPI_Scan, MPI_Exscan and MPI_Barrier, for any MPI (built by
 * run-peers.sh with mpicc.openmpi and with mpicc.mpich; not part of the meson build).
 *
 *   mpirun -np N mpi-bench [--coll NAME] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS]
 *                          [-w WARMUP] [-c] [--sync] [--fresh] [-r ROOT]
 *
 * Float sum, tutti-bench's columns, sizes, inputs and iteration structure (peer.h): per
 * size, an out-of-place and an in-place half, each WARMUP untimed calls then ITERS timed
 * ones with no barrier between them, the per-iteration times reduced with MPI_MAX after
 * the loop. MPI_Bcast has no out-of-place form: that half times the root's copy of send
 * into recv plus MPI_Bcast of recv. In place is MPI_IN_PLACE.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "peer.h"

static int rank_, size_;
static MPI_Comm ring_ = MPI_COMM_NULL; /* neighbor_alltoall's periodic ring */

static void run_once(const peer_cfg_t *cfg, float *send, float *recv, size_t c, int in_place)
{
    const void *src = in_place ? MPI_IN_PLACE : send;
    int ic = (int)c;
    switch (cfg->coll) {
    case PEER_ALLREDUCE: MPI_Allreduce(src, recv, ic, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case PEER_BROADCAST:
        if (!in_place && rank_ == cfg->root)
            memcpy(recv, send, c * sizeof(float));
        MPI_Bcast(recv, ic, MPI_FLOAT, cfg->root, MPI_COMM_WORLD);
        break;
    case PEER_ALLGATHER:
        MPI_Allgather(src, in_place ? 0 : ic, MPI_FLOAT, recv, ic, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case PEER_REDUCE_SCATTER:
        MPI_Reduce_scatter_block(src, recv, ic, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case PEER_ALLTOALL:
        MPI_Alltoall(src, in_place ? 0 : ic, MPI_FLOAT, recv, ic, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case PEER_SCAN: MPI_Scan(src, recv, ic, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case PEER_EXSCAN: MPI_Exscan(src, recv, ic, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case PEER_NEIGHBOR_ALLTOALL:
        MPI_Neighbor_alltoall(send, ic, MPI_FLOAT, recv, ic, MPI_FLOAT, ring_);
        break;
    default: MPI_Barrier(MPI_COMM_WORLD); break;
    }
}

/* --window's ops (bench/stats.h) on one half */
typedef struct window_arg {
    const peer_cfg_t *cfg;
    float *send, *recv;
    size_t c;
    int in_place;
} window_arg_t;

static int window_prepare(void *p)
{
    window_arg_t *a = p;
    peer_prepare(a->cfg, rank_, size_, a->c, a->in_place, a->send, a->recv);
    return 0;
}

static int window_call(void *p)
{
    window_arg_t *a = p;
    run_once(a->cfg, a->send, a->recv, a->c, a->in_place);
    return 0;
}

static int window_max(void *p, double *v, int n)
{
    (void)p;
    return MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
}

static int window_bcast(void *p, double *v, int n)
{
    (void)p;
    return MPI_Bcast(v, n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
}

/* Time one half of a row, as tutti-bench's run_half does. */
static void run_half(const peer_cfg_t *cfg, float *send, float *recv, size_t c, int in_place,
                     double *times, peer_half_t *h)
{
    peer_prepare(cfg, rank_, size_, c, in_place, send, recv);
    if (cfg->window) {
        window_arg_t wa = { cfg, send, recv, c, in_place };
        bench_window_ops_t o = { &wa, cfg->fresh ? window_prepare : NULL, window_call, window_max,
                                 window_bcast };
        int late = 0, err = 0;
        double gap = 0.0;
        int timed = bench_window_times(&o, rank_, cfg->warmup, cfg->iters, times, &late, &gap,
                                       &err);
        if (timed <= 0) { /* MPI's default handler aborted on an error already */
            fprintf(stderr, "mpi-bench: rank %d: %s of %zu B: every timed call late (--window)\n",
                    rank_, peer_coll_names[cfg->coll], c * sizeof(float));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        bench_window_tally(late, cfg->iters, gap);
    }
    for (int i = 0; i < cfg->warmup && !cfg->window; i++)
        run_once(cfg, send, recv, c, in_place);
    for (int i = 0; i < cfg->iters && !cfg->window; i++) {
        if (cfg->fresh)
            peer_prepare(cfg, rank_, size_, c, in_place, send, recv);
        if (cfg->sync)
            MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now_us();
        run_once(cfg, send, recv, c, in_place);
        times[i] = now_us() - t0;
    }
    long long wrong = -1;
    if (cfg->check && cfg->coll != PEER_BARRIER) {
        /* Out of place the last timed call left the result; in place the buffer was
         * reduced (or exchanged) over and over, so run once more on fresh input
         * (--fresh: the last timed call had it). */
        if (!cfg->fresh && (in_place || cfg->coll == PEER_BROADCAST)) {
            peer_prepare(cfg, rank_, size_, c, in_place, send, recv);
            run_once(cfg, send, recv, c, in_place);
        }
        wrong = peer_count_wrong(cfg, rank_, size_, c, recv);
        MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    }
    if (!cfg->window) /* --window's loop has the max */
        MPI_Allreduce(MPI_IN_PLACE, times, cfg->iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    h->wrong = wrong;
    peer_stats(times, bench_window_keep(times, cfg->iters), h);
}

/* Returns -1 when the command line asks for a run, else the exit status (0 for --help,
 * 2 for bad usage); rank 0 says why. */
static int parse_args(int argc, char **argv, peer_cfg_t *cfg_p)
{
    *cfg_p = peer_default_cfg();
    for (int i = 1; i < argc; i++) {
        int takes = 0, ok = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            if (rank_ == 0)
                printf("usage: mpirun -np N mpi-bench [flags]\n" PEER_FLAGS_USAGE);
            return 0;
        }
        ok = peer_parse_flag(cfg_p, argv[i], i + 1 < argc ? argv[i + 1] : NULL, &takes);
        if (ok <= 0 || cfg_p->root >= size_) {
            if (rank_ == 0)
                fprintf(stderr, "mpi-bench: bad argument %s\nflags:\n" PEER_FLAGS_USAGE, argv[i]);
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

/* Time and print every size; returns the number of wrong values. */
static long long bench_sizes(const peer_cfg_t *cfg, double *times, float *send, float *recv)
{
    const int barrier = cfg->coll == PEER_BARRIER;
    long long total_wrong = 0;
    for (size_t size = barrier ? 0 : cfg->min_bytes; barrier || size <= cfg->max_bytes;
         size *= cfg->factor) {
        size_t c = peer_row_count(cfg, size_, size);
        if (!barrier && c == 0)
            continue;
        peer_half_t h[2];
        for (int ip = 0; ip < (peer_one_half(cfg->coll) ? 1 : 2); ip++) {
            run_half(cfg, send, recv, c, ip, times, &h[ip]);
            total_wrong += h[ip].wrong > 0 ? h[ip].wrong : 0;
        }
        if (rank_ == 0)
            peer_print_row(cfg, size_, c, h);
        if (barrier)
            break;
    }
    if (rank_ == 0)
        peer_print_summary(total_wrong);
    return total_wrong;
}

int main(int argc, char **argv)
{
    peer_cfg_t cfg;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    int st = parse_args(argc, argv, &cfg);
    if (st >= 0) {
        MPI_Finalize();
        return st;
    }
    if (rank_ == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(lib, &len);
        lib[strcspn(lib, ",\n")] = '\0'; /* "Open MPI v4.1.4", "MPICH Version: 4.0.2" */
        peer_print_header(&cfg, "mpi-bench", size_, lib);
    }
    /* tutti-bench's buffers: page-aligned, zeroed (touched) before the first row */
    size_t alloc = (cfg.max_bytes + sizeof(float) + 4095) & ~(size_t)4095;
    double *times = malloc(sizeof(double) * (size_t)cfg.iters);
    float *send = aligned_alloc(4096, alloc), *recv = aligned_alloc(4096, alloc);
    if (!times || !send || !recv) {
        fprintf(stderr, "mpi-bench: rank %d: out of memory (2 x %zu B)\n", rank_, alloc);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(send, 0, alloc);
    memset(recv, 0, alloc);
    if (cfg.coll == PEER_NEIGHBOR_ALLTOALL) { /* tutti-bench's ring: one periodic dimension */
        int dims[1] = { size_ }, periods[1] = { 1 };
        MPI_Cart_create(MPI_COMM_WORLD, 1, dims, periods, 0, &ring_);
    }
    long long total_wrong = bench_sizes(&cfg, times, send, recv);
    free(times);
    free(send);
    free(recv);
    if (ring_ != MPI_COMM_NULL)
        MPI_Comm_free(&ring_);
    MPI_Finalize();
    return total_wrong ? 1 : 0;
}
