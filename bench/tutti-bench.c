/* tutti-bench: collective bandwidth and latency, in the manner of nccl-tests.
 *
 *   tutti-bench -np 4 -b 8 -e 64M -f 2 -c            fork 4 local ranks
 *   tutti-bench -np 3 --coll allgather -c            any of the nine collectives
 *   tutti-bench -np 4 --algo all                     every algorithm, side by side
 *   mpirun -np 4 tutti-bench --coll broadcast        ranks Open MPI started on one host
 *   srun -n 4 tutti-bench                            ranks of a Slurm step on one node
 *   TUTTI_STORE=tcp://host:29500 mpirun -x TUTTI_STORE -np 8 tutti-bench   across hosts
 *
 * For each message size every rank runs WARMUP untimed calls and then ITERS timed ones,
 * out of place and then in place, timing each call. After each timed loop the
 * per-iteration times are allreduced with TUTTI_MAX (fp64), so an iteration costs what
 * its slowest rank saw; time is the mean of those maxima, p50/p99 their percentiles.
 * --sync puts a barrier before each timed call; --window instead starts call i on every
 * rank at one instant of the host's clock and times it from there (bench/stats.h).
 *
 * Sizes and bandwidths follow nccl-tests (its doc/PERFORMANCE.md): size is the bytes of
 * the largest per-rank buffer, count the count argument of the call. allreduce, reduce
 * and broadcast: size = count x elem. allgather, reduce_scatter, gather, scatter,
 * alltoall: count is the per-rank block (sendcount, recvcount, per-peer count) and
 * size = nranks x count x elem (the gathered / to-be-scattered / exchanged buffer).
 * algbw = size / time; busbw = algbw x 2(n-1)/n for allreduce, x (n-1)/n for allgather,
 * reduce_scatter, gather, scatter and alltoall, x 1 for broadcast and reduce.
 *
 * With -c, every rank's input is a deterministic function of (rank, index) with small
 * integer values, so the exact result is computed here in plain C and #wrong counts the
 * elements (summed over ranks) that differ from it. The values carry a term of period
 * 10403 in the index (long_term), so a result moved to another block, shifted or
 * reversed differs from the reference; the check runs on one more call after the timed
 * ones, on input and a sentinel written afresh, so a call that writes nothing fails.
 *
 * --algo all times every algorithm the library has for the collective (one communicator
 * per algorithm, forced through opts.algo) and reports, per size, the winner and what
 * the default selection model (tutti_comm_algo_for without an override) would pick.
 *
 * Only the public API is used.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setenv, strsignal; meson passes it too */
#endif
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <tutti/tutti.h>

#include "cli.h"
#include "launch.h" /* tools/: starting and stopping -np's ranks, shared with tutti-run */
#include "stats.h"

enum bench_coll {
    COLL_ALLREDUCE,
    COLL_BROADCAST,
    COLL_BARRIER,
    COLL_REDUCE,
    COLL_ALLGATHER,
    COLL_REDUCE_SCATTER,
    COLL_GATHER,
    COLL_SCATTER,
    COLL_ALLTOALL,
    COLL_SCAN,
    COLL_EXSCAN,
    COLL_NEIGHBOR_ALLTOALL, /* on a periodic ring (a 1-d grid): the halo exchange */
    COLL_COUNT
};

/* The names tutti_comm_algo_for and TUTTI_ALGO use. */
static const char *const coll_names[COLL_COUNT] = {
    "allreduce", "broadcast", "barrier",  "reduce", "allgather", "reduce_scatter",
    "gather",    "scatter",   "alltoall", "scan",   "exscan",    "neighbor_alltoall",
};

/* neighbor_alltoall's neighbours: the ring's rank back and the one forward (tutti_cart_
 * create of one periodic dimension; with 2 ranks both are the other, with 1 itself) */
#define RING_DEGREE 2

/* Collectives timed once a size, out of place: a barrier (no data), and neighbor_alltoall,
 * which has no in-place form (MPI's neither). */
static int coll_one_half(enum bench_coll c)
{
    return c == COLL_BARRIER || c == COLL_NEIGHBOR_ALLTOALL;
}

/* --algo all: every algorithm the library has for the collective (tutti_algo_name), at
 * most this many; one tutti_comm_init rejects (opts.algo) is noted and skipped. */
#define MAX_ALGOS 16

/* Collectives that take a reduction op / a root. */
static int coll_has_op(enum bench_coll c)
{
    return c == COLL_ALLREDUCE || c == COLL_REDUCE || c == COLL_REDUCE_SCATTER || c == COLL_SCAN ||
           c == COLL_EXSCAN;
}

static int coll_has_root(enum bench_coll c)
{
    return c == COLL_BROADCAST || c == COLL_REDUCE || c == COLL_GATHER || c == COLL_SCATTER;
}

/* Collectives whose count is a per-rank block: size = nranks x count x elem. */
static int coll_blocked(enum bench_coll c)
{
    return c == COLL_ALLGATHER || c == COLL_REDUCE_SCATTER || c == COLL_GATHER ||
           c == COLL_SCATTER || c == COLL_ALLTOALL;
}

/* busbw = algbw x this (nccl-tests' factors). */
static double busbw_factor(enum bench_coll c, int n)
{
    switch (c) {
    case COLL_ALLREDUCE: return 2.0 * (n - 1) / n;
    case COLL_ALLGATHER:
    case COLL_REDUCE_SCATTER:
    case COLL_GATHER:
    case COLL_SCATTER:
    case COLL_ALLTOALL: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

/* The bytes the library selects its algorithm on for a call of this count (the count in
 * its envelopes: the whole vector for allreduce, broadcast, reduce, allgather and
 * reduce_scatter; one block for gather, scatter and alltoall). */
static size_t select_bytes(enum bench_coll c, size_t count, size_t esize, int n)
{
    switch (c) {
    case COLL_BARRIER: return 0;
    case COLL_ALLGATHER:
    case COLL_REDUCE_SCATTER: return (size_t)n * count * esize;
    default: return count * esize;
    }
}

typedef struct bench_cfg {
    enum bench_coll coll;
    size_t min_bytes, max_bytes, factor;
    int iters, warmup, check;
    int sync;   /* --sync: a barrier before each timed iteration */
    int fresh;  /* --fresh: the input rewritten before each (then sync's barrier) */
    int window; /* --window: every rank starts each timed call at one instant, no barrier */
    int bind;   /* --bind: -np's ranks each held on one CPU (tools/launch.h) */
    tutti_dtype_t dtype;
    tutti_redop_t op;
    int root;
    int offset; /* --offset: the buffers start this many bytes past a page boundary */
    const char *algo, *transport, *json;
    int algo_all;  /* --algo all */
    int np;        /* > 0: fork this many local ranks */
    int timeout_s; /* -np: kill the ranks after this long */
    int cuda;      /* --device cuda: the buffers in GPU memory (cuMemAlloc) */
    int stream;    /* --stream: the calls stream-ordered, each followed by a stream sync */
} bench_cfg_t;

/* One half (out-of-place or in-place) of a row. */
typedef struct bench_half {
    double mean_us, p50_us, p99_us, algbw, busbw;
    long long wrong; /* -1: not checked */
} bench_half_t;

typedef struct bench_row {
    size_t bytes, count;
    const char *algo;
    bench_half_t half[2]; /* out-of-place, in-place; barrier uses half[0] */
    /* --algo all: out-of-place per algorithm (index into the bench's algorithm list) */
    bench_half_t per_algo[MAX_ALGOS];
    int best;  /* index of the fastest */
    int model; /* index of the model's choice, -1 when it is not among those timed */
} bench_row_t;

/* ---- command line ------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: tutti-bench [-np N] [--coll NAME] [-b MIN] [-e MAX]\n"
        "                   [-f FACTOR] [-n ITERS] [-w WARMUP] [-c [0|1]] [--sync] [--fresh]\n"
        "                   [--bind]\n"
        "                   [-d DTYPE] [-o OP] [-r ROOT] [--offset B] [--algo NAME|all]\n"
        "                   [--transport NAME] [--json FILE]\n"
        "\n"
        "  -np N               fork N (1..%d) local ranks that meet through a file store in\n"
        "                      a fresh directory in $TMPDIR or /tmp, removed however\n"
        "                      tutti-bench ends (TUTTI_SOCKET_IFNAME=lo and a TUTTI_JOB_ID\n"
        "                      of their own unless set; they die with tutti-bench, even\n"
        "                      SIGKILLed); without -np, join the\n"
        "                      job the environment describes (TUTTI_RANK/TUTTI_WORLD_SIZE/\n"
        "                      TUTTI_STORE, torchrun's RANK/WORLD_SIZE/MASTER_ADDR/\n"
        "                      MASTER_PORT, or the ranks of mpirun (Open MPI's, MPICH's)\n"
        "                      or srun; with ranks on several hosts, or MPICH's without\n"
        "                      a TUTTI_JOB_ID, set TUTTI_STORE too)\n"
        "  --coll NAME         allreduce (default), broadcast, barrier, reduce, allgather,\n"
        "                      reduce_scatter, gather, scatter, alltoall, scan, exscan or\n"
        "                      neighbor_alltoall (a halo exchange on a periodic ring of the\n"
        "                      ranks, tutti_cart_create: out of place only)\n"
        "  -b, --minbytes SIZE smallest size, bytes with K/M/G suffixes (default 8); size\n"
        "                      and count as nccl-tests prints them (see below)\n"
        "  -e, --maxbytes SIZE largest message (default 64M)\n"
        "  -f, --stepfactor F  size multiplier between rows (default 2)\n"
        "  -n, --iters N       timed iterations per size (default 20)\n"
        "  -w, --warmup N      untimed iterations per size (default 5)\n"
        "  -c, --check [0|1]   verify results (nccl-tests' -c 1; -c 0: not), each against\n"
        "                      a reference computed in the bench per element from inputs\n"
        "                      that change from element to element over 10403-element\n"
        "                      periods and from rank to rank, on one more call after the\n"
        "                      timed ones, its input and the result's sentinel written\n"
        "                      afresh; #wrong prints N/A without it. Refused where the\n"
        "                      results would not be exact in the dtype (avg of int8\n"
        "                      above 127 ranks, of uint8 above 125, of bf16 above 128,\n"
        "                      of half above\n"
        "                      1024; sum of uint8 above 247, of bf16 above 765); a\n"
        "                      barrier moves no data: nothing checked\n"
        "  --sync              barrier (untimed) before each timed iteration: without it\n"
        "                      iterations of rooted collectives (reduce, gather, scatter,\n"
        "                      broadcast) overlap across ranks, as in nccl-tests\n"
        "  --fresh             rewrite every rank's input (and the result's sentinel)\n"
        "                      before each timed iteration, untimed, then --sync's\n"
        "                      barrier: the data moved was just written by its own rank\n"
        "                      (a gradient just computed), not left clean in the peers'\n"
        "                      caches by the previous call (bench/peers' harnesses too)\n"
        "  --window            every rank starts timed call i at one instant of the host's\n"
        "                      clock (T0 + i x gap) and times it from there, instead of\n"
        "                      from its exit from --sync's barrier (whose exit order a\n"
        "                      rooted call would measure); ranks on one host only\n"
        "  --gap US            (--window) timed calls start at least US microseconds\n"
        "                      apart, the ranks asleep in between, as an application's\n"
        "                      own work between collectives would space them\n"
        "  --gap-busy          the ranks spin through --gap instead of sleeping\n"
        "  --fill-late         --fresh --window, the rewrite just before each start,\n"
        "                      not before the wait (across a long --gap)\n"
        "  -d, --dtype NAME    float (default), double, half, bf16, int8, uint8, int16,\n"
        "                      uint16, int32, uint32, int64, uint64, complex64,\n"
        "                      complex128, float8_e4m3fn, float8_e5m2 ... (not\n"
        "                      nccl-tests' all: one run per dtype; -c puts the complex\n"
        "                      values in the real parts, checks fp8 sum and avg only)\n"
        "  -o, --op NAME       sum (default), prod, min, max, avg, band, bor,\n"
        "                      bxor (the last three: integer dtypes; not all)\n"
        "  -r, --root R        root of broadcast, reduce, gather and scatter (default 0)\n"
        "  --offset B          start every rank's send and receive buffers B bytes past a\n"
        "                      page boundary (0..4095, a multiple of the dtype's size;\n"
        "                      default 0), as a tensor inside a larger storage\n"
        "  --device NAME       host (default) or cuda: every rank's buffers in GPU memory\n"
        "                      (rank r on GPU r mod the GPU count; the communicator made\n"
        "                      with TUTTI_CUDA=on), the inputs written and the results\n"
        "                      read through host copies, untimed\n"
        "  --stream            with --device cuda (implied): the calls stream-ordered on a\n"
        "                      stream of each rank's (tutti_comm_set_stream), each timed\n"
        "                      call followed by cuStreamSynchronize\n"
        "  --algo NAME         algorithm override: a bare name (\"ring\") or a TUTTI_ALGO\n"
        "                      string (\"allreduce:rd@<64K,ring\"); it must set one of\n"
        "                      --coll's algorithms (tutti_algo_name), every name in it its\n"
        "                      collective's, else bad usage listing them\n"
        "  --algo all          time every algorithm the library has for the collective\n"
        "                      (out of place, one communicator each) and print per size\n"
        "                      each one's p50 time, the winner, the default model's choice\n"
        "                      (tutti_comm_algo_for, no override) and how much slower than\n"
        "                      the winner that choice was (also in --json)\n"
        "  --transport NAME    transport (default auto, or TUTTI_TRANSPORT)\n"
        "  --json FILE         also write every row as a JSON array to FILE\n"
        "  -t, --timeout SEC   -np: kill the ranks after SEC seconds (default 1800)\n"
        "  --bind              -np: hold each rank on one CPU, the i-th of N on the\n"
        "                      (i*C/N)-th of C (tutti-run's --bind; bench/peers binds every\n"
        "                      system or none)\n"
        "  -h, --help          this text\n"
        "\n"
        "Sizes and bandwidth (nccl-tests' conventions):\n"
        "  allreduce, broadcast, reduce, scan, exscan: size = count x elem\n"
        "  allgather, reduce_scatter, gather, scatter, alltoall: count = the per-rank block\n"
        "    (sendcount / recvcount / per-peer count), size = nranks x count x elem\n"
        "  neighbor_alltoall: count = the block to each of the 2 neighbours, size =\n"
        "    2 x count x elem\n"
        "  algbw = size / time; busbw = algbw x\n"
        "    2(n-1)/n  allreduce\n"
        "    (n-1)/n   allgather, reduce_scatter, gather, scatter, alltoall\n"
        "    1         broadcast, reduce, scan, exscan, neighbor_alltoall\n"
        "  exit status: 0 ok, 1 wrong results (-c), 2 bad usage (also: a root, a size range\n"
        "  or a -c that the job's rank count rules out), 3 a call failed;\n"
        "  -np stopped by signal N (SIGINT, SIGTERM, SIGHUP): 128+N\n"
        "\n"
        "Environment (read by the library; a flag above wins):\n"
        "  TUTTI_TIMEOUT_MS        bound on every wait, ms (default 30000)\n"
        "  TUTTI_TRANSPORT         auto (default: shm on this host, tcp across), a name\n"
        "                          (tcp, shm, ibverbs, a plugin) or local=NAME,remote=NAME\n"
        "  TUTTI_HOST_ID           ranks with the same id share a host (default hostname/boot id)\n"
        "  TUTTI_COST_MODEL        algorithm cost model: table (default), probe, or\n"
        "                          alpha=<us>,bw=<GB/s>,reduce=<GB/s>\n"
        "  TUTTI_PLUGIN_PATH       ':'-separated dirs searched for libtutti-transport-NAME.so\n"
        "  TUTTI_ALGO              algorithm override, e.g. "
        "\"allreduce:rd@<64K,ring;broadcast:tree\"\n"
        "  TUTTI_SOCKET_IFNAME     interfaces: \"eth0,ib\" prefixes, \"^docker,lo\" exclusions,\n"
        "                          \"=eth0\" exact names\n"
        "  TUTTI_SOCKET_FAMILY     address family: 0 any, 4 IPv4, 6 IPv6\n"
        "  TUTTI_SOCKET_BUFFER     SO_SNDBUF/SO_RCVBUF bytes, 0 = kernel autotuning\n"
        "  TUTTI_TCP_CONGESTION    auto (default: reno on links within this host, the\n"
        "                          system's across), system, or a name for every link\n"
        "  TUTTI_SPIN_US           busy-poll this long before blocking, us (default auto:\n"
        "                          200 with a CPU per local rank, else 50)\n"
        "  TUTTI_CHUNK_BYTES       largest pipelining chunk of ring/chain (default 1 MiB)\n"
        "  TUTTI_PREFIX            store key prefix of the communicator\n"
        "  TUTTI_DEBUG             log level: warn (default), info, trace\n"
        "  TUTTI_STORE             rendezvous store: file:///dir or tcp://host:port\n"
        "  TUTTI_STORE_TIMEOUT_MS  deadline of store calls and of connecting, ms (default 30000)\n"
        "  TUTTI_STORE_SERVER      tcp store: 0 = rank 0 does not host the server\n"
        "  TUTTI_RANK              this process's rank (else RANK; else, as pairs with\n"
        "                          the sizes, OMPI_COMM_WORLD_RANK, PMI_RANK, in an\n"
        "                          srun step SLURM_PROCID)\n"
        "  TUTTI_WORLD_SIZE        number of ranks (else WORLD_SIZE, OMPI_COMM_WORLD_SIZE,\n"
        "                          PMI_SIZE, SLURM_STEP_NUM_TASKS)\n"
        "  TUTTI_STALL_CHECK_MS    blocked this long, compare ops with the other ranks through\n"
        "                          the store: mismatched calls fail fast (default 1000, 0 off)\n"
        "  TUTTI_STORE_FSYNC       1: the file store fsyncs values before they are visible\n"
        "  TUTTI_REDUCE_ISA        cap the reduce kernels: generic, avx2, avx512\n"
        "  TUTTI_JOB_ID            the job the ranks belong to: ranks of different jobs never\n"
        "                          meet (-np sets one per run)\n"
        "(all listed in docs/configuration.md)\n",
        TT_LAUNCH_MAX_RANKS);
}

static int parse_int(const char *s, int min, int *v_p)
{
    return tt_cli_int(s, min, 1 << 30, v_p);
}

/* --name=value: the value, with *a_p the name (copied into name); else NULL with *a_p
 * the argument itself. */
static const char *split_value(const char *arg, char *name, size_t len, const char **a_p)
{
    *a_p = arg;
    const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
    if (!eq || (size_t)(eq - arg) >= len)
        return NULL;
    memcpy(name, arg, (size_t)(eq - arg));
    name[eq - arg] = '\0';
    *a_p = name;
    return eq + 1;
}

/* --coll NAME, with the other spellings of broadcast and reduce_scatter; nonzero when
 * NAME is none of them. */
static int parse_coll(const char *v, enum bench_coll *coll_p)
{
    int bad = 1;
    for (int c = 0; c < COLL_COUNT; c++)
        if (!strcmp(v, coll_names[c])) {
            *coll_p = (enum bench_coll)c;
            bad = 0;
        }
    if (!strcmp(v, "bcast"))
        *coll_p = COLL_BROADCAST, bad = 0;
    else if (!strcmp(v, "reducescatter") || !strcmp(v, "reduce-scatter"))
        *coll_p = COLL_REDUCE_SCATTER, bad = 0;
    return bad;
}

static int check_world(const bench_cfg_t *cfg, int n, int loud);
static int dtype_is_float(tutti_dtype_t dt);

/* coll's algorithms, ", "-separated, into buf. */
static const char *algo_list(const char *coll, char *buf, size_t len)
{
    const char *a;
    buf[0] = '\0';
    for (int i = 0; (a = tutti_algo_name(coll, i)); i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "%s%s", i ? ", " : "", a);
    }
    return buf;
}

/* --algo SPEC (not all): 0 when the library parses it (tutti_algo_spec_sets, TUTTI_ALGO's
 * syntax) and it sets an algorithm of the collective run; else -1, said with the
 * algorithms the collective has. */
static int check_algo(const bench_cfg_t *cfg)
{
    const char *coll = coll_names[cfg->coll];
    char why[512], names[512];
    int st = tutti_algo_spec_sets(cfg->algo, coll, why, sizeof(why));
    if (st < 0)
        fprintf(stderr, "tutti-bench: --algo %s: %s\n", cfg->algo, why);
    else if (st == 0)
        fprintf(stderr,
                "tutti-bench: --algo %s sets no algorithm of %s (--coll): give one of its "
                "algorithms: %s\n",
                cfg->algo, coll, algo_list(coll, names, sizeof(names)));
    return st > 0 ? 0 : -1;
}

/* The largest -e: the two buffers, a page more each (--offset) and rounded up to pages,
 * stay far from size_t's end. */
#define BENCH_MAX_BYTES (SIZE_MAX / 4)

/* The settings that are checked once all are read: 0, or -1 (bad usage). */
static int check_cfg(const char *dtype, const char *op, bench_cfg_t *cfg_p)
{
    if (!strcmp(dtype, "all") || !strcmp(op, "all")) {
        fprintf(stderr,
                "tutti-bench: %s all (nccl-tests' sweep over every %s) is not supported: run "
                "tutti-bench once per %s\n",
                !strcmp(dtype, "all") ? "-d" : "-o", !strcmp(dtype, "all") ? "dtype" : "op",
                !strcmp(dtype, "all") ? "dtype" : "op");
        return -1;
    }
    if (tutti_dtype_parse(dtype, &cfg_p->dtype) != TUTTI_OK) {
        fprintf(stderr, "tutti-bench: unknown dtype %s\n", dtype);
        return -1;
    }
    if (tutti_redop_parse(op, &cfg_p->op) != TUTTI_OK) {
        fprintf(stderr, "tutti-bench: unknown op %s\n", op);
        return -1;
    }
    if (coll_has_op(cfg_p->coll) && dtype_is_float(cfg_p->dtype) &&
        (cfg_p->op == TUTTI_BAND || cfg_p->op == TUTTI_BOR || cfg_p->op == TUTTI_BXOR ||
         cfg_p->op == TUTTI_LAND || cfg_p->op == TUTTI_LOR || cfg_p->op == TUTTI_LXOR)) {
        fprintf(stderr, "tutti-bench: -o %s needs an integer dtype, not %s\n",
                tutti_redop_name(cfg_p->op), tutti_dtype_name(cfg_p->dtype));
        return -1;
    }
    if (coll_has_op(cfg_p->coll) && !tutti_redop_supported(cfg_p->op, cfg_p->dtype)) {
        fprintf(stderr,
                "tutti-bench: -o %s does not reduce %s (complex: sum, prod, avg; the value-index "
                "pairs: minloc, maxloc, and those ops nothing else)\n",
                tutti_redop_name(cfg_p->op), tutti_dtype_name(cfg_p->dtype));
        return -1;
    }
    if (cfg_p->coll == COLL_NEIGHBOR_ALLTOALL && (cfg_p->algo_all || cfg_p->stream)) {
        fprintf(stderr, "tutti-bench: --coll neighbor_alltoall has one algorithm and runs on "
                        "a communicator of its own: without --algo all and --stream\n");
        return -1;
    }
    if (cfg_p->min_bytes == 0 || cfg_p->min_bytes > cfg_p->max_bytes) {
        fprintf(stderr, "tutti-bench: need 0 < MIN <= MAX\n");
        return -1;
    }
    if (cfg_p->max_bytes > BENCH_MAX_BYTES) {
        fprintf(stderr, "tutti-bench: -e %zu: more than the bench can allocate (at most %zu B)\n",
                cfg_p->max_bytes, (size_t)BENCH_MAX_BYTES);
        return -1;
    }
    size_t esize = tutti_dtype_size(cfg_p->dtype);
    if ((size_t)cfg_p->offset % esize) {
        fprintf(stderr, "tutti-bench: --offset %d is not a multiple of the %zu-byte %s\n",
                cfg_p->offset, esize, tutti_dtype_name(cfg_p->dtype));
        return -1;
    }
    if (cfg_p->algo && check_algo(cfg_p) < 0)
        return -1;
    if (cfg_p->np > 0 && check_world(cfg_p, cfg_p->np, 1) < 0)
        return -1;
    return 0;
}

/* Returns 0 to run, 1 to exit 0 (help), -1 to exit 2 (bad usage). */
static int parse_args(int argc, char **argv, bench_cfg_t *cfg)
{
    const char *dtype = "float", *op = "sum";
    for (int i = 1; i < argc; i++) {
        const char *a;
        char name[64];
        const char *v = split_value(argv[i], name, sizeof(name), &a);
#define FLAG(s, l) (!strcmp(a, s) || !strcmp(a, l))
#define VALUE()                                                                                    \
    do {                                                                                           \
        if (!v) {                                                                                  \
            if (i + 1 >= argc) {                                                                   \
                fprintf(stderr, "tutti-bench: %s needs a value\n", a);                             \
                return -1;                                                                         \
            }                                                                                      \
            v = argv[++i];                                                                         \
        }                                                                                          \
    } while (0)
        int bad = 0;
        if (FLAG("-h", "--help")) {
            usage(stdout);
            return 1;
        } else if (FLAG("-c", "--check")) {
            /* nccl-tests' -c 0|1 too */
            if (!v && i + 1 < argc && (!strcmp(argv[i + 1], "0") || !strcmp(argv[i + 1], "1")))
                v = argv[++i];
            bad = v && strcmp(v, "0") && strcmp(v, "1");
            cfg->check = !v || !strcmp(v, "1");
        } else if (FLAG("--sync", "--sync")) {
            cfg->sync = 1;
        } else if (FLAG("--fresh", "--fresh")) {
            cfg->fresh = cfg->sync = 1;
        } else if (FLAG("--window", "--window")) {
            cfg->window = 1;
        } else if (FLAG("--gap", "--gap")) { /* implies --window */
            int us = 0;
            VALUE();
            bad = parse_int(v, 1, &us);
            bench_window_min_gap_us = us;
            cfg->window = 1;
        } else if (FLAG("--gap-busy", "--gap-busy")) {
            bench_window_gap_busy = 1;
        } else if (FLAG("--fill-late", "--fill-late")) { /* implies --fresh --window */
            bench_window_fill_late = 1;
            cfg->fresh = cfg->sync = cfg->window = 1;
        } else if (FLAG("--device", "--device")) {
            VALUE();
            bad = strcmp(v, "host") && strcmp(v, "cuda");
            cfg->cuda = !strcmp(v, "cuda");
        } else if (FLAG("--stream", "--stream")) {
            cfg->stream = cfg->cuda = 1;
        } else if (FLAG("--bind", "--bind")) {
            cfg->bind = 1;
        } else if (FLAG("-np", "--np")) {
            VALUE();
            bad = parse_int(v, 1, &cfg->np) || cfg->np > TT_LAUNCH_MAX_RANKS;
        } else if (FLAG("-b", "--minbytes")) {
            VALUE();
            bad = tt_cli_size(v, &cfg->min_bytes);
        } else if (FLAG("-e", "--maxbytes")) {
            VALUE();
            bad = tt_cli_size(v, &cfg->max_bytes);
        } else if (FLAG("-f", "--stepfactor")) {
            VALUE();
            bad = tt_cli_size(v, &cfg->factor) || cfg->factor < 2;
        } else if (FLAG("-n", "--iters")) {
            VALUE();
            bad = parse_int(v, 1, &cfg->iters);
        } else if (FLAG("-w", "--warmup")) {
            VALUE();
            bad = parse_int(v, 0, &cfg->warmup);
        } else if (FLAG("-d", "--dtype")) {
            VALUE();
            dtype = v;
        } else if (FLAG("-o", "--op")) {
            VALUE();
            op = v;
        } else if (FLAG("--offset", "--offset")) {
            VALUE();
            bad = parse_int(v, 0, &cfg->offset) || cfg->offset > 4095;
        } else if (FLAG("-r", "--root")) {
            VALUE();
            bad = parse_int(v, 0, &cfg->root);
        } else if (FLAG("-t", "--timeout")) {
            VALUE();
            bad = parse_int(v, 1, &cfg->timeout_s);
        } else if (FLAG("--coll", "--collective")) {
            VALUE();
            bad = parse_coll(v, &cfg->coll);
        } else if (FLAG("--algo", "--algorithm")) {
            VALUE();
            cfg->algo_all = !strcmp(v, "all");
            cfg->algo = cfg->algo_all ? NULL : v;
        } else if (FLAG("--transport", "--transport")) {
            VALUE();
            cfg->transport = v;
        } else if (FLAG("--json", "--json")) {
            VALUE();
            cfg->json = v;
        } else {
            fprintf(stderr, "tutti-bench: unknown argument %s (try --help)\n", argv[i]);
            return -1;
        }
#undef VALUE
#undef FLAG
        if (bad) {
            fprintf(stderr, "tutti-bench: bad value for %s: %s\n", a, v);
            return -1;
        }
    }
    return check_cfg(dtype, op, cfg);
}

/* ---- elements ------------------------------------------------------------------ */

static float half_to_float(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float v;
    if (exp == 0)
        v = ldexpf((float)man, -24);
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexpf((float)(man | 0x400), exp - 25);
    return sign ? -v : v;
}

/* Exact for the small integers the bench uses; rounds to nearest otherwise. */
static uint16_t float_to_half(float f)
{
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    f = fabsf(f);
    if (isnan(f))
        return sign | 0x7e00;
    if (f >= 65520.0f)
        return sign | 0x7c00;
    if (f < ldexpf(1.0f, -14)) /* subnormal */
        return sign | (uint16_t)lrintf(ldexpf(f, 24));
    int e;
    float m = frexpf(f, &e);          /* f = m * 2^e, m in [0.5, 1) */
    long man = lrintf(ldexpf(m, 11)); /* 11 significant bits */
    if (man == 2048) {
        man = 1024;
        e++;
    }
    if (e + 14 >= 31)
        return sign | 0x7c00;
    return sign | (uint16_t)((e + 14) << 10) | (uint16_t)(man & 0x3ff);
}

static float bf16_to_float(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint16_t float_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if (isnan(f))
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

/* fp8 (OCP E4M3 "fn", E5M2): the value of a code, and the nearest code to a value (ties
 * to even, saturating past the largest finite value, as the library's kernels). */
static double fp8_to_double(uint8_t v, int e5)
{
    const int mbits = e5 ? 2 : 3, bias = e5 ? 15 : 7, ebits = e5 ? 5 : 4;
    const int e = (v >> mbits) & ((1 << ebits) - 1), m = v & ((1 << mbits) - 1);
    double r;
    if (e5 ? e == 31 : (v & 0x7f) == 0x7f)
        r = e5 && m == 0 ? INFINITY : NAN;
    else
        r = e ? ldexp((1 << mbits) + m, e - bias - mbits) : ldexp(m, 1 - bias - mbits);
    return (v & 0x80) ? -r : r;
}

static uint8_t double_to_fp8(double v, int e5)
{
    const int mbits = e5 ? 2 : 3, bias = e5 ? 15 : 7;
    const uint8_t top = e5 ? 0x7b : 0x7e;
    if (isnan(v))
        return e5 ? 0x7e : 0x7f;
    const uint8_t sign = signbit(v) ? 0x80 : 0;
    v = fabs(v);
    if (v >= fp8_to_double(top, e5))
        return sign | top;
    if (v == 0)
        return sign;
    int e;
    frexp(v, &e);         /* v = m 2^e, m in [0.5, 1) */
    int E = e - 1 + bias; /* the exponent field; <= 0: subnormal, in steps of the least */
    double step = ldexp(1.0, (E > 0 ? e - 1 : 1 - bias) - mbits);
    long q = lrint(v / step); /* exact quotient (a power of two), rounded to even */
    long code = E > 0 ? ((long)E << mbits) + q - (1L << mbits) : q; /* a carry moves on */
    return sign | (uint8_t)(code > top ? top : code);
}

static double elem_get(tutti_dtype_t dt, const void *buf, size_t i)
{
    switch (dt) {
    case TUTTI_INT8: return ((const int8_t *)buf)[i];
    case TUTTI_UINT8: return ((const uint8_t *)buf)[i];
    case TUTTI_INT32: return ((const int32_t *)buf)[i];
    case TUTTI_INT64: return (double)((const int64_t *)buf)[i];
    case TUTTI_INT16: return ((const int16_t *)buf)[i];
    case TUTTI_UINT16: return ((const uint16_t *)buf)[i];
    case TUTTI_UINT32: return ((const uint32_t *)buf)[i];
    case TUTTI_UINT64: return (double)((const uint64_t *)buf)[i];
    case TUTTI_FP16: return half_to_float(((const uint16_t *)buf)[i]);
    case TUTTI_BF16: return bf16_to_float(((const uint16_t *)buf)[i]);
    case TUTTI_FP32: return ((const float *)buf)[i];
    case TUTTI_FP64: return ((const double *)buf)[i];
    case TUTTI_FP8_E4M3:
    case TUTTI_FP8_E5M2: return fp8_to_double(((const uint8_t *)buf)[i], dt == TUTTI_FP8_E5M2);
    /* complex: the value in the real part; an imaginary part not 0 is no value (-c fails) */
    case TUTTI_COMPLEX64: {
        const float *p = (const float *)buf + 2 * i;
        return p[1] == 0.0f ? p[0] : NAN;
    }
    case TUTTI_COMPLEX128: {
        const double *p = (const double *)buf + 2 * i;
        return p[1] == 0.0 ? p[0] : NAN;
    }
    default: return NAN;
    }
}

static void elem_set(tutti_dtype_t dt, void *buf, size_t i, double v)
{
    switch (dt) {
    case TUTTI_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case TUTTI_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case TUTTI_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case TUTTI_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case TUTTI_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
    case TUTTI_UINT16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
    case TUTTI_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case TUTTI_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case TUTTI_FP16: ((uint16_t *)buf)[i] = float_to_half((float)v); break;
    case TUTTI_BF16: ((uint16_t *)buf)[i] = float_to_bf16((float)v); break;
    case TUTTI_FP32: ((float *)buf)[i] = (float)v; break;
    case TUTTI_FP64: ((double *)buf)[i] = v; break;
    case TUTTI_FP8_E4M3:
    case TUTTI_FP8_E5M2: ((uint8_t *)buf)[i] = double_to_fp8(v, dt == TUTTI_FP8_E5M2); break;
    case TUTTI_COMPLEX64:
        ((float *)buf)[2 * i] = (float)v;
        ((float *)buf)[2 * i + 1] = 0.0f;
        break;
    case TUTTI_COMPLEX128:
        ((double *)buf)[2 * i] = v;
        ((double *)buf)[2 * i + 1] = 0.0;
        break;
    default: break;
    }
}

/* No negative values: every value below is in [0, 250] for these (251: the sentinel). */
static int dtype_is_unsigned(tutti_dtype_t dt)
{
    return dt == TUTTI_UINT8 || dt == TUTTI_UINT16 || dt == TUTTI_UINT32 || dt == TUTTI_UINT64;
}

static int dtype_is_float(tutti_dtype_t dt)
{
    return dt == TUTTI_FP16 || dt == TUTTI_BF16 || dt == TUTTI_FP32 || dt == TUTTI_FP64 ||
           dt == TUTTI_COMPLEX64 || dt == TUTTI_COMPLEX128 || dt == TUTTI_FP8_E4M3 ||
           dt == TUTTI_FP8_E5M2;
}

static int dtype_is_fp8(tutti_dtype_t dt)
{
    return dt == TUTTI_FP8_E4M3 || dt == TUTTI_FP8_E5M2;
}

/* The integers a dtype holds exactly (and in range) up to this magnitude: the bound on
 * every input, partial and final result of -c's reductions (uint8: below the sentinel,
 * 251; fp32 and the wider ones: more than the bench's values ever need). */
static long dtype_exact(tutti_dtype_t dt)
{
    switch (dt) {
    case TUTTI_INT8: return 127;
    case TUTTI_UINT8: return 250;
    case TUTTI_INT16: return 32767;
    case TUTTI_UINT16: return 65535;
    case TUTTI_FP16: return 2048;
    case TUTTI_BF16: return 256;
    case TUTTI_FP8_E4M3: return 16;
    case TUTTI_FP8_E5M2: return 8;
    default: return 1L << 24;
    }
}

/* The per-element term of every input: in [0, 100], of period LONG_PERIOD (101 x 103, a
 * cubic in i mod 101 plus i mod 103). Two runs of it more than 3 elements long agree only
 * where they start a multiple of LONG_PERIOD apart, and a run reversed agrees with itself
 * in at most about 1 element in 20: a block landing in another block's place, a shifted
 * or reversed vector, all differ from the reference. */
#define LONG_PERIOD ((size_t)101 * 103)

static size_t long_term(size_t i)
{
    size_t a = i % 101;
    return (a * a * a + a + i % 103) % 101;
}

/* The amplitude A of the long term in a reduction's inputs over n ranks (<= 50): signed,
 * the term is in [-A, A], unsigned in [0, 2A] (avg: [1, A + 1]); below 1 where the
 * dtype cannot hold the reduction's values exactly (-c refuses: check_exact). Integer
 * sums wrap harmlessly on the way (the result modulo 2^k is still right), so for them
 * only the inputs and the result bound A; float partial sums, in any order, must stay
 * exact. */
static long red_amp_of(const bench_cfg_t *cfg, int n)
{
    const long L = dtype_exact(cfg->dtype);
    const int sgn = !dtype_is_unsigned(cfg->dtype), flt = dtype_is_float(cfg->dtype);
    long a = 50;
    switch (cfg->op) {
    case TUTTI_SUM: /* the small terms: at most ceil(n/3) ranks give +1 (or -1) */
        if (!sgn)   /* the result <= 2A + n + 1 */
            a = (L - n - 1) / 2;
        else if (flt) /* partial sums <= A + ceil(n/3) */
            a = L - (n + 2) / 3;
        break;
    case TUTTI_AVG: /* the sum is n x the base; rank 0's input base + n - 1 */
        if (!sgn)
            a = L / n - 1 < L - n ? L / n - 1 : L - n;
        else if (flt) /* partial sums <= n x A + n - 1 */
            a = (L - n + 1) / n;
        else
            a = L / n < L - n + 1 ? L / n : L - n + 1;
        break;
    default: break; /* prod, min, max and the bitwise ops do not grow with n */
    }
    return a < 50 ? a : 50;
}

/* red_amp_of, computed once for a run's (op, dtype, n): -c asks for it at every element
 * of every rank's input (one thread) */
static long red_amp(const bench_cfg_t *cfg, int n)
{
    static tutti_redop_t op;
    static tutti_dtype_t dtype;
    static int last_n = -1;
    static long a;
    if (n != last_n || cfg->op != op || cfg->dtype != dtype) {
        a = red_amp_of(cfg, n);
        op = cfg->op;
        dtype = cfg->dtype;
        last_n = n;
    }
    return a;
}

/* The long term at i with amplitude a (signed: [-a, a], else [0, 2a]). */
static double long_value(size_t i, long a, int sgn)
{
    if (a < 1)
        a = 1; /* not checked (-c refuses): any input times as well */
    return (double)(long_term(i) % (size_t)(2 * a + 1)) - (sgn ? (double)a : 0.0);
}

/* The input of rank r at index i of a reduction: small integers chosen per op so that
 * every partial and final result, in any reduction order, is exact and in range in the
 * dtype (red_amp; check_exact refuses -c where they cannot be). Every op's result
 * carries the long term, so it differs from element to element over long periods, and
 * every rank's input differs from the others' at most elements:
 *   sum:  ((r + i) mod 3) - 1 ([0, 2] unsigned), rank 0 adding the long term
 *   prod: 1, or 2 (-2 at some i) at ranks below 6 where (r + i) mod 4 is 0 (|result| <= 4),
 *         rank 0's times 1 + (long term mod 31): |result| <= 124
 *   min, max: the long term plus ((7r + 3i) mod 17) - 8 ([0, 16] unsigned)
 *   avg:  base + (n-1) s on rank 0, base - s on the others (s = i mod 2): the sum is
 *         n x base, base the long term
 *   band, bor, bxor: bits 3-6 rank 0's (the long term mod 16), bits 0-2 every rank's
 *         (one cleared, one set, 3 bits of its own) */
static double red_value(const bench_cfg_t *cfg, int r, int n, size_t i)
{
    const int sgn = !dtype_is_unsigned(cfg->dtype); /* negative values allowed */
    const size_t hi = (long_term(i) % 16) << 3;     /* the bitwise ops' rank-0 bits */
    switch (cfg->op) {
    case TUTTI_SUM: {
        double s = (double)(((size_t)r + i) % 3) - (sgn ? 1 : 0);
        return r == 0 ? s + long_value(i, red_amp(cfg, n), sgn) : s;
    }
    case TUTTI_PROD: { /* at most two of the first six ranks give 2 (or -2) */
        double v = 1.0;
        if (r < 6 && ((size_t)r + i) % 4 == 0)
            v = sgn && i % 3 == 1 ? -2.0 : 2.0;
        return r == 0 ? v * (double)(1 + long_term(i) % 31) : v;
    }
    case TUTTI_MIN:
    case TUTTI_MAX:
        return long_value(i, red_amp(cfg, n), sgn) + (double)(((size_t)r * 7 + i * 3) % 17) -
               (sgn ? 8 : 0);
    case TUTTI_AVG: {
        long a = red_amp(cfg, n);
        a = a < 1 ? 1 : a;
        double base = sgn ? long_value(i, a, 1) : (double)(1 + long_term(i) % (size_t)(a + 1));
        double s = (double)(i % 2);
        return base + (r == 0 ? (double)(n - 1) * s : -s);
    }
    /* integers in [0, 127] */
    case TUTTI_BAND: return (double)((r == 0 ? hi : 120) | (7 ^ (1u << (((size_t)r + i) % 3))));
    case TUTTI_BOR: return (double)((r == 0 ? hi : 0) | (1u << (((size_t)r + i) % 3)));
    case TUTTI_BXOR: return (double)((r == 0 ? hi : 0) | (((size_t)r * 3 + i) % 8));
    /* 0 or not, in [0, 3]: LAND's mostly not, LOR's mostly 0, LXOR's half each */
    case TUTTI_LAND: return ((size_t)r + i) % 7 ? (double)(1 + i % 3) : 0.0;
    case TUTTI_LOR: return ((size_t)r * 5 + i) % 7 == 0 ? (double)(1 + i % 3) : 0.0;
    case TUTTI_LXOR: return ((size_t)r * 3 + i) % 7 < 3 ? (double)(1 + i % 3) : 0.0;
    default: return 0.0;
    }
}

/* -c: 0 where red_value's inputs stay exact over n ranks; else -1 with why said. */
static int check_exact(const bench_cfg_t *cfg, int n, char *why, size_t len)
{
    /* a value-index pair is no number the bench's values fit (MINLOC/MAXLOC and the
     * pairs are checked by tests/test_collectives.c's minloc case) */
    if (cfg->dtype >= TUTTI_FLOAT_INT && cfg->dtype <= TUTTI_SHORT_INT) {
        snprintf(why, len,
                 "-c: %s is a value-index pair, which the bench does not check (time it "
                 "without -c)",
                 tutti_dtype_name(cfg->dtype));
        return -1;
    }
    /* prod, min and max's values reach 124: fp8 holds integers exactly to 16 or 8 (the
     * library's fp8 reductions are checked by tests/test_collectives.c's fp8 case) */
    if (coll_has_op(cfg->coll) && dtype_is_fp8(cfg->dtype) && cfg->op != TUTTI_SUM &&
        cfg->op != TUTTI_AVG) {
        snprintf(why, len,
                 "-c: the %s of %s cannot be checked: its inputs reach 124, and %s holds the "
                 "integers exactly to %ld only (sum and avg can be checked)",
                 tutti_redop_name(cfg->op), tutti_dtype_name(cfg->dtype),
                 tutti_dtype_name(cfg->dtype), dtype_exact(cfg->dtype));
        return -1;
    }
    if (!coll_has_op(cfg->coll) || red_amp(cfg, n) >= 1)
        return 0;
    int most = n - 1;
    while (most > 1 && red_amp(cfg, most) < 1)
        most--;
    snprintf(why, len,
             "-c: the %s of %s over %d ranks cannot be checked: the sums of the bench's "
             "inputs would leave the integers %s holds exactly (%ld); at most %d ranks "
             "(or a wider dtype)",
             tutti_redop_name(cfg->op), tutti_dtype_name(cfg->dtype), n,
             tutti_dtype_name(cfg->dtype), dtype_exact(cfg->dtype), most);
    return -1;
}

/* The broadcast root's input: the long term, shifted by the root. */
static double bcast_value(const bench_cfg_t *cfg, int r, size_t i)
{
    const int sgn = !dtype_is_unsigned(cfg->dtype);
    return (double)long_term(i + (size_t)r * 7919) - (sgn ? 50 : 0);
}

/* Data-movement collectives (allgather, gather, scatter, alltoall): element i of block
 * `key` (the source rank; source x nranks + destination for alltoall): the long term,
 * shifted 7919 elements a key, in [-50, 50] ([0, 100] unsigned): exact in every dtype,
 * and a block landing in the wrong place, or shifted within its place, differs from the
 * right one. */
static double move_value(const bench_cfg_t *cfg, size_t key, size_t i)
{
    const int sgn = !dtype_is_unsigned(cfg->dtype);
    return (double)long_term(i + key * 7919) - (sgn ? 50 : 0);
}

/* Sentinel for receive buffers, different from every expected result. */
static double sentinel(const bench_cfg_t *cfg)
{
    return dtype_is_unsigned(cfg->dtype) ? 251.0 : -99.0;
}

/* The reduction of index i over ranks 0..k-1 of n (k = n but for scan and exscan). */
static double red_expected(const bench_cfg_t *cfg, int n, int k, size_t i)
{
    double acc = red_value(cfg, 0, n, i);
    for (int r = 1; r < k; r++) {
        double v = red_value(cfg, r, n, i);
        switch (cfg->op) {
        case TUTTI_SUM:
        case TUTTI_AVG: acc += v; break;
        case TUTTI_PROD: acc *= v; break;
        case TUTTI_MIN: acc = v < acc ? v : acc; break;
        case TUTTI_MAX: acc = v > acc ? v : acc; break;
        case TUTTI_BAND: acc = (double)((long)acc & (long)v); break;
        case TUTTI_BOR: acc = (double)((long)acc | (long)v); break;
        case TUTTI_BXOR: acc = (double)((long)acc ^ (long)v); break;
        case TUTTI_LAND: acc = acc != 0 && v != 0; break;
        case TUTTI_LOR: acc = acc != 0 || v != 0; break;
        case TUTTI_LXOR: acc = (acc != 0) != (v != 0); break;
        default: break;
        }
    }
    if (cfg->op == TUTTI_AVG)
        acc = dtype_is_float(cfg->dtype) ? acc / k : trunc(acc / k);
    return acc;
}

/* Elements in the send buffer / the result buffer of a call of count c (the count
 * argument: a per-rank block for the blocked collectives). */
static size_t send_count(enum bench_coll coll, int n, size_t c)
{
    switch (coll) {
    case COLL_BARRIER: return 0;
    case COLL_REDUCE_SCATTER:
    case COLL_SCATTER:
    case COLL_ALLTOALL: return (size_t)n * c;
    case COLL_NEIGHBOR_ALLTOALL: return RING_DEGREE * c;
    default: return c;
    }
}

static size_t recv_count(enum bench_coll coll, int n, size_t c)
{
    switch (coll) {
    case COLL_BARRIER: return 0;
    case COLL_ALLGATHER:
    case COLL_GATHER:
    case COLL_ALLTOALL: return (size_t)n * c;
    case COLL_NEIGHBOR_ALLTOALL: return RING_DEGREE * c;
    default: return c;
    }
}

/* Element i of rank me's send buffer. */
static double send_value(const bench_cfg_t *cfg, int me, int n, size_t c, size_t i)
{
    switch (cfg->coll) {
    case COLL_BROADCAST: return bcast_value(cfg, me, i);
    case COLL_ALLGATHER:
    case COLL_GATHER: return move_value(cfg, (size_t)me, i);
    case COLL_SCATTER: return move_value(cfg, i / c, i % c);
    case COLL_ALLTOALL: return move_value(cfg, (size_t)me * (size_t)n + i / c, i % c);
    /* block 0 to the rank back, block 1 to the one forward */
    case COLL_NEIGHBOR_ALLTOALL: return move_value(cfg, (size_t)me * 2 + i / c, i % c);
    default: return red_value(cfg, me, n, i); /* allreduce, reduce, reduce_scatter */
    }
}

/* Element i of the result rank me checks (its recv_count elements). */
static double expected_value(const bench_cfg_t *cfg, int me, int n, size_t c, size_t i)
{
    switch (cfg->coll) {
    case COLL_BROADCAST: return bcast_value(cfg, cfg->root, i);
    case COLL_ALLGATHER:
    case COLL_GATHER: return move_value(cfg, i / c, i % c);
    case COLL_SCATTER: return move_value(cfg, (size_t)me, i);
    case COLL_ALLTOALL: return move_value(cfg, (i / c) * (size_t)n + (size_t)me, i % c);
    case COLL_NEIGHBOR_ALLTOALL: /* slot 0 from the rank back (its block 1, sent forward),
                                    slot 1 from the one forward (its block 0) */
        return i / c == 0 ? move_value(cfg, (size_t)((me + n - 1) % n) * 2 + 1, i % c)
                          : move_value(cfg, (size_t)((me + 1) % n) * 2, i % c);
    case COLL_REDUCE_SCATTER: return red_expected(cfg, n, n, (size_t)me * c + i);
    case COLL_SCAN: return red_expected(cfg, n, me + 1, i);
    case COLL_EXSCAN: return red_expected(cfg, n, me, i);
    default: return red_expected(cfg, n, n, i); /* allreduce, reduce */
    }
}

/* The period in i of send_value (within a block of c for scatter and alltoall): the
 * long term's times the period of the small per-rank terms (coprime with it). */
static size_t input_period(const bench_cfg_t *cfg)
{
    switch (cfg->coll) {
    case COLL_BROADCAST:
    case COLL_ALLGATHER:
    case COLL_GATHER:
    case COLL_SCATTER:
    case COLL_ALLTOALL:
    case COLL_NEIGHBOR_ALLTOALL: return LONG_PERIOD;
    default: break;
    }
    switch (cfg->op) {
    case TUTTI_SUM: return 3 * LONG_PERIOD;
    case TUTTI_PROD: return 12 * LONG_PERIOD;
    case TUTTI_MIN:
    case TUTTI_MAX: return 17 * LONG_PERIOD;
    case TUTTI_AVG: return 2 * LONG_PERIOD;
    case TUTTI_BAND:
    case TUTTI_BOR: return 3 * LONG_PERIOD;
    case TUTTI_BXOR: return 8 * LONG_PERIOD;
    case TUTTI_LAND:
    case TUTTI_LOR:
    case TUTTI_LXOR: return 21 * LONG_PERIOD;
    default: return LONG_PERIOD;
    }
}

static size_t size_min(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* Elements [0, count) of buf: the first period of them are written as they are, the
 * rest copied from there in doubling steps (bench/peers/peer.h fills the same way): the
 * rewrite before each call of --fresh runs at memory speed in every harness, since how
 * long ago the data was written changes how fast it moves (a 2-rank 16 MiB broadcast
 * with the fill compiled -O0 took 1.4-1.7x as long in mpi-bench). */
static void fill_repeat(void *buf, size_t es, size_t count, size_t period)
{
    char *p = buf;
    for (size_t done = size_min(period, count); done < count;) {
        size_t k = size_min(done, count - done);
        memcpy(p + done * es, p, k * es);
        done += k;
    }
}

/* The computed part of the last fill_input (the first period of each block, for one
 * count and rank): --fresh rewrites the input before every call, and a period now runs
 * to 10403 x 17 elements, so the later fills of a row copy it instead of computing it. */
static struct {
    char *heads;
    size_t c, bytes;
    int me, n;
} fill_memo;

static void fill_input(const bench_cfg_t *cfg, int me, int n, size_t c, void *buf)
{
    size_t count = send_count(cfg->coll, n, c), es = tutti_dtype_size(cfg->dtype);
    size_t period = input_period(cfg);
    /* scatter and alltoall send a block per rank, each its own pattern */
    size_t block = cfg->coll == COLL_SCATTER || cfg->coll == COLL_ALLTOALL ||
                           cfg->coll == COLL_NEIGHBOR_ALLTOALL
                       ? c
                       : count;
    if (count == 0)
        return;
    size_t head = size_min(period, block), nblocks = (count + block - 1) / block;
    size_t bytes = nblocks * head * es;
    if (!fill_memo.heads || fill_memo.c != c || fill_memo.bytes != bytes || fill_memo.me != me ||
        fill_memo.n != n) {
        free(fill_memo.heads);
        fill_memo.heads = malloc(bytes);
        fill_memo.c = c;
        fill_memo.bytes = bytes;
        fill_memo.me = me;
        fill_memo.n = n;
        for (size_t b = 0; fill_memo.heads && b < nblocks; b++) {
            size_t len = size_min(block, count - b * block);
            for (size_t i = 0; i < size_min(head, len); i++)
                elem_set(cfg->dtype, fill_memo.heads + b * head * es, i,
                         send_value(cfg, me, n, c, b * block + i));
        }
    }
    for (size_t b = 0; b < nblocks; b++) {
        size_t len = size_min(block, count - b * block), h = size_min(head, len);
        char *at = (char *)buf + b * block * es;
        if (fill_memo.heads)
            memcpy(at, fill_memo.heads + b * head * es, h * es);
        else /* out of memory: computed in place */
            for (size_t i = 0; i < h; i++)
                elem_set(cfg->dtype, at, i, send_value(cfg, me, n, c, b * block + i));
        fill_repeat(at, es, len, period);
    }
}

static void fill_sentinel(const bench_cfg_t *cfg, void *buf, size_t count)
{
    if (count == 0)
        return;
    elem_set(cfg->dtype, buf, 0, sentinel(cfg));
    fill_repeat(buf, tutti_dtype_size(cfg->dtype), count, 1);
}

static long long count_wrong(const bench_cfg_t *cfg, int me, int n, size_t c, const void *buf)
{
    /* The avg of floats divides in the library's own way; allow its rounding. */
    double tol = 0.0;
    if (cfg->op == TUTTI_AVG && coll_has_op(cfg->coll)) {
        if (cfg->dtype == TUTTI_FP16)
            tol = 1e-3;
        else if (cfg->dtype == TUTTI_BF16)
            tol = 8e-3;
        else if (cfg->dtype == TUTTI_FP32)
            tol = 1e-6;
        else if (cfg->dtype == TUTTI_FP64)
            tol = 1e-12;
    }
    /* reduce and gather: only the root has a result; exscan: rank 0 none */
    if ((cfg->coll == COLL_REDUCE || cfg->coll == COLL_GATHER) && me != cfg->root)
        return 0;
    if (cfg->coll == COLL_EXSCAN && me == 0)
        return 0;
    size_t count = recv_count(cfg->coll, n, c);
    long long wrong = 0;
    for (size_t i = 0; i < count; i++) {
        double want = expected_value(cfg, me, n, c, i), got = elem_get(cfg->dtype, buf, i);
        if (dtype_is_fp8(cfg->dtype)) /* the data-movement values, [-50, 50], as stored */
            want = fp8_to_double(double_to_fp8(want, cfg->dtype == TUTTI_FP8_E5M2),
                                 cfg->dtype == TUTTI_FP8_E5M2);
        if (!(fabs(got - want) <= tol * fabs(want)))
            wrong++;
    }
    return wrong;
}

/* ---- timing ---------------------------------------------------------------------- */

/* ---- one rank ---------------------------------------------------------------------- */

enum { ALGO_ROUNDS = 5 }; /* --algo all: the algorithms alternate this many times a size */

/* --algo all's rounds at this iteration count (one where there are too few to split) */
static int algo_rounds(const bench_cfg_t *cfg)
{
    return cfg->iters < ALGO_ROUNDS ? 1 : ALGO_ROUNDS;
}

typedef struct bench_ctx {
    const bench_cfg_t *cfg;
    tutti_comm_t *comm;
    int rank, size;
    void *send, *recv; /* what prepare fills and the check reads */
    double *times;
    void *dsend, *drecv; /* --device cuda: what the calls get (send and recv's copies) */
} bench_ctx_t;

/* ---- --device cuda: the CUDA driver API, loaded with dlopen (no build dependency) ---- */

static struct {
    int (*init)(unsigned);
    int (*device_get_count)(int *);
    int (*device_get)(int *, int);
    int (*primary_ctx_retain)(void **, int);
    int (*ctx_set_current)(void *);
    int (*mem_alloc)(unsigned long long *, size_t);
    int (*memcpy_htod)(unsigned long long, const void *, size_t);
    int (*memcpy_dtoh)(void *, unsigned long long, size_t);
    int (*stream_create)(void **, unsigned);
    int (*stream_synchronize)(void *);
} cu;
static void *cu_stream; /* --stream */

/* Load the driver, make GPU rank % count this thread's, and allocate n bytes twice. */
static int cuda_setup(int rank, size_t n, void **a, void **b)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    const char *names[] = { "cuInit",          "cuDeviceGetCount",
                            "cuDeviceGet",     "cuDevicePrimaryCtxRetain",
                            "cuCtxSetCurrent", "cuMemAlloc_v2",
                            "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2",
                            "cuStreamCreate",  "cuStreamSynchronize" };
    void *syms[10];
    for (int i = 0; h && i < 10; i++)
        if (!(syms[i] = dlsym(h, names[i]))) {
            fprintf(stderr, "tutti-bench: rank %d: libcuda.so.1 has no %s\n", rank, names[i]);
            return -1;
        }
    if (!h) {
        fprintf(stderr, "tutti-bench: rank %d: --device cuda: %s\n", rank, dlerror());
        return -1;
    }
    memcpy(&cu, syms, sizeof(cu));
    int count = 0, dev, r;
    void *ctx;
    unsigned long long pa = 0, pb = 0;
    if ((r = cu.init(0)) || (r = cu.device_get_count(&count)) || count < 1 ||
        (r = cu.device_get(&dev, rank % count)) || (r = cu.primary_ctx_retain(&ctx, dev)) ||
        (r = cu.ctx_set_current(ctx)) || (r = cu.mem_alloc(&pa, n)) || (r = cu.mem_alloc(&pb, n))) {
        fprintf(stderr, "tutti-bench: rank %d: --device cuda: CUDA error %d (%d devices)\n", rank,
                r, count);
        return -1;
    }
    *a = (void *)(uintptr_t)pa;
    *b = (void *)(uintptr_t)pb;
    return 0;
}

/* n bytes from the host copy to the device buffer (up) or back */
static void cuda_move(void *dev, void *host, size_t n, int up)
{
    int r = up ? cu.memcpy_htod((unsigned long long)(uintptr_t)dev, host, n)
               : cu.memcpy_dtoh(host, (unsigned long long)(uintptr_t)dev, n);
    if (r) {
        fprintf(stderr, "tutti-bench: cuMemcpy%s: CUDA error %d\n", up ? "HtoD" : "DtoH", r);
        exit(3);
    }
}

static int report_failure(const bench_ctx_t *b, const char *what, size_t bytes, int in_place,
                          int st)
{
    fprintf(stderr, "tutti-bench: rank %d: %s failed (%zu B, %s): %s (%s): %s\n", b->rank, what,
            bytes, in_place ? "in-place" : "out-of-place", tutti_strerror(st),
            tutti_status_name(st), tutti_comm_last_error(b->comm));
    return st;
}

/* Where rank me's block sits in an in-place buffer of blocks (allgather, gather,
 * scatter). */
static char *block_at(const bench_ctx_t *b, size_t count, int rank)
{
    return (char *)b->recv + (size_t)rank * count * tutti_dtype_size(b->cfg->dtype);
}

/* One call. Out of place: the input in send, the result in recv. In place (as nccl-tests
 * does it, everything in recv): allreduce, broadcast, reduce_scatter, alltoall pass
 * TUTTI_IN_PLACE; reduce passes recv as sendbuf (in place at the root); allgather and
 * gather have this rank's block at its place in recv (TUTTI_IN_PLACE, or that block as
 * sendbuf at a gather's non-roots); scatter's root scatters from recv keeping its block
 * there (TUTTI_IN_PLACE_OUT) and the others receive into their block of recv. */
static int run_call(const bench_ctx_t *b, size_t count, int in_place)
{
    bench_ctx_t dev;
    if (b->dsend) { /* --device cuda: the calls get the device buffers */
        dev = *b;
        dev.send = b->dsend;
        dev.recv = b->drecv;
        b = &dev;
    }
    const bench_cfg_t *cfg = b->cfg;
    const void *src = in_place ? TUTTI_IN_PLACE : b->send;
    int root = cfg->root, is_root = b->rank == root;
    switch (cfg->coll) {
    case COLL_ALLREDUCE: return tutti_allreduce(b->comm, src, b->recv, count, cfg->dtype, cfg->op);
    case COLL_BROADCAST: return tutti_broadcast(b->comm, src, b->recv, count, cfg->dtype, root);
    case COLL_BARRIER: return tutti_barrier(b->comm);
    case COLL_REDUCE:
        return tutti_reduce(b->comm, in_place ? b->recv : b->send, b->recv, count, cfg->dtype,
                            cfg->op, root);
    case COLL_ALLGATHER: return tutti_allgather(b->comm, src, b->recv, count, cfg->dtype);
    case COLL_REDUCE_SCATTER:
        return tutti_reduce_scatter(b->comm, src, b->recv, count, cfg->dtype, cfg->op);
    case COLL_GATHER:
        if (in_place && !is_root)
            src = block_at(b, count, b->rank);
        return tutti_gather(b->comm, src, b->recv, count, cfg->dtype, root);
    case COLL_SCATTER:
        if (!in_place)
            return tutti_scatter(b->comm, b->send, b->recv, count, cfg->dtype, root);
        return tutti_scatter(b->comm, b->recv,
                             is_root ? TUTTI_IN_PLACE_OUT : block_at(b, count, b->rank), count,
                             cfg->dtype, root);
    case COLL_ALLTOALL: return tutti_alltoall(b->comm, src, b->recv, count, cfg->dtype);
    case COLL_SCAN: return tutti_scan(b->comm, src, b->recv, count, cfg->dtype, cfg->op);
    case COLL_EXSCAN: return tutti_exscan(b->comm, src, b->recv, count, cfg->dtype, cfg->op);
    case COLL_NEIGHBOR_ALLTOALL:
        return tutti_neighbor_alltoall(b->comm, b->send, b->recv, count, cfg->dtype);
    default: break;
    }
    return TUTTI_ERR_INVALID_ARG;
}

/* run_call; with --stream, until its stream has run it (and its failure, if any, as a
 * stream-ordered call reports it) */
static int run_once(const bench_ctx_t *b, size_t count, int in_place)
{
    int st = run_call(b, count, in_place);
    if (st < 0 || !cu_stream)
        return st;
    int r = cu.stream_synchronize(cu_stream);
    if (r) {
        fprintf(stderr, "tutti-bench: rank %d: cuStreamSynchronize: CUDA error %d\n", b->rank, r);
        return TUTTI_ERR_DEVICE;
    }
    return tutti_comm_stream_error(b->comm);
}

/* Prepare the buffers of one half: out of place, the send buffer holds the input and
 * the receive buffer a sentinel; in place, the receive buffer holds what run_once
 * expects there (the input, or the sentinel with this rank's input block in place). */
static void prepare(const bench_ctx_t *b, size_t count, int in_place)
{
    const bench_cfg_t *cfg = b->cfg;
    int n = b->size, me = b->rank, is_root = me == cfg->root;
    if (cfg->coll == COLL_BARRIER)
        return;
    size_t sc = send_count(cfg->coll, n, count), rc = recv_count(cfg->coll, n, count);
    size_t all = sc > rc ? sc : rc, es = tutti_dtype_size(cfg->dtype);
    if (!in_place) {
        fill_input(cfg, me, n, count, b->send);
        fill_sentinel(cfg, b->recv, rc);
        if (b->dsend) {
            cuda_move(b->dsend, b->send, sc * es, 1);
            cuda_move(b->drecv, b->recv, rc * es, 1);
        }
        return;
    }
    switch (cfg->coll) {
    case COLL_BROADCAST: /* only the root's matters */
        if (is_root)
            fill_input(cfg, me, n, count, b->recv);
        else
            fill_sentinel(cfg, b->recv, rc);
        break;
    case COLL_ALLGATHER:
    case COLL_GATHER:
        fill_sentinel(cfg, b->recv, all);
        fill_input(cfg, me, n, count, block_at(b, count, me));
        break;
    case COLL_SCATTER:
        if (is_root) {
            fill_input(cfg, me, n, count, b->recv);
        } else {
            fill_sentinel(cfg, b->recv, all);
        }
        break;
    default: /* allreduce, reduce, reduce_scatter, alltoall */
        fill_input(cfg, me, n, count, b->recv);
        break;
    }
    if (b->drecv)
        cuda_move(b->drecv, b->recv, all * es, 1);
}

/* Where the result of one half is. */
static const void *result_at(const bench_ctx_t *b, size_t count, int in_place)
{
    if (in_place && b->cfg->coll == COLL_SCATTER)
        return block_at(b, count, b->rank);
    return b->recv;
}

typedef struct window_arg {
    const bench_ctx_t *b;
    size_t count;
    int in_place;
} window_arg_t;

static int window_prepare(void *p)
{
    const window_arg_t *a = p;
    prepare(a->b, a->count, a->in_place);
    return 0;
}

static int window_call(void *p)
{
    const window_arg_t *a = p;
    return run_once(a->b, a->count, a->in_place);
}

static int window_max(void *p, double *v, int n)
{
    return tutti_allreduce(((const window_arg_t *)p)->b->comm, TUTTI_IN_PLACE, v, (size_t)n,
                           TUTTI_FP64, TUTTI_MAX);
}

static int window_bcast(void *p, double *v, int n)
{
    return tutti_broadcast(((const window_arg_t *)p)->b->comm, TUTTI_IN_PLACE, v, (size_t)n,
                           TUTTI_FP64, 0);
}

/* warmup untimed calls, then iters timed ones: each one's max over ranks into times
 * (--window: INFINITY where a rank was late). With check, the result is checked after
 * (*wrong_p: wrong elements over every rank; -1 unchecked). */
static int time_calls(const bench_ctx_t *b, size_t count, size_t bytes, int in_place, int warmup,
                      int iters, double *times, int check, long long *wrong_p)
{
    const bench_cfg_t *cfg = b->cfg;
    const char *what = coll_names[cfg->coll];
    int st;
    *wrong_p = -1;
    prepare(b, count, in_place);
    if (cfg->window) {
        window_arg_t wa = { b, count, in_place };
        bench_window_ops_t o = { &wa, cfg->fresh ? window_prepare : NULL, window_call, window_max,
                                 window_bcast };
        int late = 0, err = 0;
        double gap = 0.0;
        int valid = bench_window_times(&o, b->rank, warmup, iters, times, &late, &gap, &err);
        if (valid < 0)
            return report_failure(b, what, bytes, in_place, err);
        if (valid == 0) {
            fprintf(stderr,
                    "tutti-bench: rank %d: %s (%zu B): some rank was late for every one of %d "
                    "timed calls, even %.0f us apart (--window)\n",
                    b->rank, what, bytes, iters, gap);
            return TUTTI_ERR_TIMEOUT;
        }
        bench_window_tally(late, iters, gap);
    } else {
        for (int i = 0; i < warmup; i++)
            if ((st = run_once(b, count, in_place)) != TUTTI_OK)
                return report_failure(b, what, bytes, in_place, st);
        for (int i = 0; i < iters; i++) {
            if (cfg->fresh)
                prepare(b, count, in_place);
            if (cfg->sync && (st = tutti_barrier(b->comm)) != TUTTI_OK)
                return report_failure(b, "barrier (--sync)", bytes, in_place, st);
            double t0 = now_us();
            st = run_once(b, count, in_place);
            times[i] = now_us() - t0;
            if (st != TUTTI_OK)
                return report_failure(b, what, bytes, in_place, st);
        }
    }
    long long wrong = -1;
    if (check && cfg->coll != COLL_BARRIER) {
        /* One more call on fresh input and a fresh sentinel (--fresh: the last timed call
         * had them): in place the buffer was reduced (or exchanged) over and over, and
         * out of place the receive buffer holds what some earlier call left, so a call
         * that wrote nothing would pass. */
        if (!cfg->fresh) {
            prepare(b, count, in_place);
            if ((st = run_once(b, count, in_place)) != TUTTI_OK)
                return report_failure(b, what, bytes, in_place, st);
        }
        if (b->drecv) { /* the result, into the host copy the check reads */
            size_t rc = recv_count(cfg->coll, b->size, count);
            size_t sc = send_count(cfg->coll, b->size, count);
            cuda_move(b->drecv, b->recv,
                      (in_place && sc > rc ? sc : rc) * tutti_dtype_size(cfg->dtype), 0);
        }
        wrong = count_wrong(cfg, b->rank, b->size, count, result_at(b, count, in_place));
    }

    /* After the timed loop: per-iteration max over ranks (--window's loop has it), and
     * #wrong summed. */
    if (!cfg->window && (st = tutti_allreduce(b->comm, TUTTI_IN_PLACE, times, (size_t)iters,
                                              TUTTI_FP64, TUTTI_MAX)) != TUTTI_OK)
        return report_failure(b, "allreduce of the times", bytes, in_place, st);
    if (wrong >= 0) {
        int64_t w = wrong;
        st = tutti_allreduce(b->comm, TUTTI_IN_PLACE, &w, 1, TUTTI_INT64, TUTTI_SUM);
        if (st != TUTTI_OK)
            return report_failure(b, "allreduce of #wrong", bytes, in_place, st);
        wrong = w;
    }
    *wrong_p = wrong;
    return TUTTI_OK;
}

/* Mean, p50, p99 and bandwidths of iters per-iteration times (sorted here; --window's
 * late ones, INFINITY, left out). */
static void half_stats(const bench_ctx_t *b, size_t bytes, double *times, int iters,
                       long long wrong, bench_half_t *h)
{
    h->wrong = wrong;
    iters = bench_window_keep(times, iters);
    h->mean_us = 0.0;
    for (int i = 0; i < iters; i++)
        h->mean_us += times[i];
    h->mean_us /= iters;
    qsort(times, (size_t)iters, sizeof(double), cmp_double);
    h->p50_us = percentile(times, iters, 50);
    h->p99_us = percentile(times, iters, 99);
    double factor = busbw_factor(b->cfg->coll, b->size);
    h->algbw = b->cfg->coll == COLL_BARRIER ? 0.0 : (double)bytes / 1e3 / h->mean_us; /* GB/s */
    h->busbw = h->algbw * factor;
}

static int run_half(const bench_ctx_t *b, size_t count, size_t bytes, int in_place, bench_half_t *h)
{
    const bench_cfg_t *cfg = b->cfg;
    long long wrong;
    int st = time_calls(b, count, bytes, in_place, cfg->warmup, cfg->iters, b->times, cfg->check,
                        &wrong);
    if (st != TUTTI_OK)
        return st;
    half_stats(b, bytes, b->times, cfg->iters, wrong, h);
    return TUTTI_OK;
}

/* ---- output ---------------------------------------------------------------------- */

/* The communicators of a run: one, or (--algo all) one per algorithm plus the model's. */
typedef struct bench_set {
    tutti_comm_t *main; /* the normal mode's; with --algo all the model's (no override) */
    int nalgos;         /* --algo all: how many algorithms the library has */
    const char *names[MAX_ALGOS];
    tutti_comm_t *comms[MAX_ALGOS];
    char absent[256]; /* --algo all: the library's algorithms tutti_comm_init rejected */
} bench_set_t;

static const char *redop_col(const bench_cfg_t *cfg)
{
    return coll_has_op(cfg->coll) ? tutti_redop_name(cfg->op) : "none";
}

static int root_col(const bench_cfg_t *cfg)
{
    return coll_has_root(cfg->coll) ? cfg->root : -1;
}

static const char *dtype_col(const bench_cfg_t *cfg)
{
    return cfg->coll == COLL_BARRIER ? "none" : tutti_dtype_name(cfg->dtype);
}

static void print_header(const bench_ctx_t *b, const bench_set_t *set)
{
    const bench_cfg_t *cfg = b->cfg;
    printf("# tutti-bench: %s, %d ranks, transport %s, dtype %s, op %s\n", coll_names[cfg->coll],
           b->size, tutti_comm_transport(set->main), dtype_col(cfg), redop_col(cfg));
    const char *job = getenv("TUTTI_JOB_ID");
    if (job && *job)
        printf("# job %s\n", job);
    printf("# cost model %s\n", tutti_comm_cost_model(set->main));
    if (cfg->cuda)
        printf("# buffers in %s device memory (--device cuda), staged through host memory by "
               "the library; inputs written and results read untimed%s\n",
               tutti_comm_device(set->main) ? tutti_comm_device(set->main) : "(none!)",
               cfg->stream ? "; calls stream-ordered (--stream), each timed with its "
                             "cuStreamSynchronize"
                           : "");
    printf("# iters %d, warmup %d, time = %s over iterations of the max over ranks%s%s%s%s\n",
           cfg->iters, cfg->warmup, cfg->algo_all ? "p50" : "mean", bench_fresh_words(cfg->fresh),
           cfg->window ? ", each started at one instant on every rank (--window)"
           : cfg->sync ? ", barrier before each"
                       : "",
           cfg->algo ? ", algo " : "", cfg->algo ? cfg->algo : "");
    if (cfg->coll != COLL_BARRIER)
        printf("# busbw = algbw x %s%s\n",
               cfg->coll == COLL_ALLREDUCE         ? "2(n-1)/n"
               : busbw_factor(cfg->coll, 2) == 1.0 ? "1"
                                                   : "(n-1)/n",
               coll_blocked(cfg->coll) ? "; count = per-rank block, size = nranks x count x "
                                         "elem"
               : cfg->coll == COLL_NEIGHBOR_ALLTOALL
                   ? "; a periodic ring (tutti_cart_create): count = the block to each of "
                     "the 2 neighbours, size = 2 x count x elem"
                   : "");
    if (cfg->algo_all) {
        printf("# --algo all: out of place, one communicator per algorithm, the algorithms "
               "taking turns (%d rounds of iters/%d calls each); per algorithm "
               "the p50 (us) of the per-iteration max over ranks (the median: one stalled "
               "iteration on a busy host moves the mean), the fastest by it and its busbw, "
               "the default model's choice (tutti_comm_algo_for, no override) and its p50 "
               "against the fastest's\n",
               algo_rounds(cfg), algo_rounds(cfg));
        if (set->absent[0])
            printf("# rejected by tutti_comm_init: %s\n", set->absent);
        printf("#%11s %12s %6s %6s %5s ", "size", "count", "type", "redop", "root");
        for (int a = 0; a < set->nalgos; a++)
            printf(" %10s", set->names[a]);
        printf("  %-13s %8s  %-13s %8s %7s\n", "fastest", "busbw", "model", "vs best", "#wrong");
        printf("#%11s %12s %6s %6s %5s ", "(B)", "(elements)", "", "", "");
        for (int a = 0; a < set->nalgos; a++)
            printf(" %10s", "(us)");
        printf("  %-13s %8s  %-13s %8s %7s\n", "", "(GB/s)", "", "", "");
        return;
    }
    if (cfg->coll == COLL_BARRIER) {
        printf("#%11s %12s %6s %6s %5s  %9s %8s %8s %7s %9s %9s\n", "size", "count", "type",
               "redop", "root", "time", "algbw", "busbw", "#wrong", "p50", "p99");
        printf("#%11s %12s %6s %6s %5s  %9s %8s %8s %7s %9s %9s\n", "(B)", "(elements)", "", "", "",
               "(us)", "", "", "", "(us)", "(us)");
        return;
    }
    printf("#%43s%-61s%s\n", "", "out-of-place",
           coll_one_half(cfg->coll) ? "(no in-place form)" : "in-place");
    print_column_titles_n(coll_one_half(cfg->coll) ? 1 : 2);
}

static void print_half(const bench_half_t *h, int barrier)
{
    char wrong[32];
    if (h->wrong < 0)
        snprintf(wrong, sizeof(wrong), "N/A");
    else
        snprintf(wrong, sizeof(wrong), "%lld", h->wrong);
    if (barrier)
        printf("  %9.2f %8s %8s %7s %9.2f %9.2f", h->mean_us, "-", "-", wrong, h->p50_us,
               h->p99_us);
    else
        printf("  %9.2f %8.3f %8.3f %7s %9.2f %9.2f", h->mean_us, h->algbw, h->busbw, wrong,
               h->p50_us, h->p99_us);
}

/* --algo all: busbw of an algorithm at its p50. */
static double algo_busbw(const bench_ctx_t *b, const bench_row_t *row, int a)
{
    const bench_half_t *h = &row->per_algo[a];
    return h->p50_us > 0
               ? (double)row->bytes / 1e3 / h->p50_us * busbw_factor(b->cfg->coll, b->size)
               : 0.0;
}

/* --algo all: the model's time against the fastest's, "best" when it is the fastest. */
static void vs_best(const bench_row_t *row, char *buf, size_t len)
{
    if (row->model < 0)
        snprintf(buf, len, "n/a");
    else if (row->model == row->best)
        snprintf(buf, len, "best");
    else
        snprintf(buf, len, "+%.1f%%",
                 100.0 *
                     (row->per_algo[row->model].p50_us / row->per_algo[row->best].p50_us - 1.0));
}

static long long algo_wrong(const bench_set_t *set, const bench_row_t *row)
{
    long long w = -1;
    for (int a = 0; a < set->nalgos; a++)
        if (row->per_algo[a].wrong >= 0)
            w = (w < 0 ? 0 : w) + row->per_algo[a].wrong;
    return w;
}

static void print_row(const bench_ctx_t *b, const bench_set_t *set, const bench_row_t *row)
{
    const bench_cfg_t *cfg = b->cfg;
    int barrier = cfg->coll == COLL_BARRIER;
    printf(" %11zu %12zu %6s %6s %5d", row->bytes, row->count, dtype_col(cfg), redop_col(cfg),
           root_col(cfg));
    if (cfg->algo_all) {
        char vs[32], wrong[32];
        long long w = algo_wrong(set, row);
        printf(" ");
        for (int a = 0; a < set->nalgos; a++)
            printf(" %10.2f", row->per_algo[a].p50_us);
        vs_best(row, vs, sizeof(vs));
        if (w < 0)
            snprintf(wrong, sizeof(wrong), "N/A");
        else
            snprintf(wrong, sizeof(wrong), "%lld", w);
        char busbw[32];
        if (barrier)
            snprintf(busbw, sizeof(busbw), "-");
        else
            snprintf(busbw, sizeof(busbw), "%.3f", algo_busbw(b, row, row->best));
        printf("  %-13s %8s  %-13s %8s %7s\n", set->names[row->best], busbw,
               row->algo ? row->algo : "?", vs, wrong);
        fflush(stdout);
        return;
    }
    print_half(&row->half[0], barrier);
    if (!coll_one_half(cfg->coll))
        print_half(&row->half[1], 0);
    printf("\n");
    fflush(stdout);
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void json_half_body(FILE *f, const bench_half_t *h, int barrier)
{
    fprintf(f, "{\"time_us\": %.3f, \"p50_us\": %.3f, \"p99_us\": %.3f", h->mean_us, h->p50_us,
            h->p99_us);
    if (!barrier)
        fprintf(f, ", \"algbw_gbps\": %.6f, \"busbw_gbps\": %.6f", h->algbw, h->busbw);
    if (h->wrong >= 0)
        fprintf(f, ", \"wrong\": %lld}", h->wrong);
    else
        fprintf(f, ", \"wrong\": null}");
}

static void json_half(FILE *f, const char *name, const bench_half_t *h, int barrier)
{
    fprintf(f, ", \"%s\": ", name);
    json_half_body(f, h, barrier);
}

static void write_json_rows(FILE *f, const bench_ctx_t *b, const bench_set_t *set,
                            const bench_row_t *rows, size_t n)
{
    const bench_cfg_t *cfg = b->cfg;
    int barrier = cfg->coll == COLL_BARRIER;
    fprintf(f, "[");
    for (size_t i = 0; i < n; i++) {
        const bench_row_t *r = &rows[i];
        fprintf(f, "%s\n  {\"coll\": \"%s\", \"ranks\": %d, \"transport\": ", i ? "," : "",
                coll_names[cfg->coll], b->size);
        json_string(f, tutti_comm_transport(set->main));
        fprintf(f, ", \"algo\": ");
        json_string(f, r->algo);
        fprintf(f,
                ", \"size\": %zu, \"count\": %zu, \"dtype\": \"%s\", \"redop\": \"%s\", "
                "\"root\": %d, \"iters\": %d, \"warmup\": %d, \"busbw_factor\": %.6f",
                r->bytes, r->count, dtype_col(cfg), redop_col(cfg), root_col(cfg), cfg->iters,
                cfg->warmup, barrier ? 0.0 : busbw_factor(cfg->coll, b->size));
        if (cfg->algo_all) {
            /* "algo" is the model's choice; every algorithm timed out of place */
            fprintf(f, ", \"mode\": \"algo_all\", \"algos\": {");
            for (int a = 0; a < set->nalgos; a++) {
                fprintf(f, "%s", a ? ", " : "");
                json_string(f, set->names[a]);
                fprintf(f, ": ");
                json_half_body(f, &r->per_algo[a], barrier);
            }
            fprintf(f, "}, \"compared_on\": \"p50_us\", \"fastest\": ");
            json_string(f, set->names[r->best]);
            fprintf(f, ", \"model\": ");
            json_string(f, r->algo);
            if (r->model >= 0)
                fprintf(f, ", \"model_is_fastest\": %s, \"model_vs_fastest\": %.6f",
                        r->model == r->best ? "true" : "false",
                        r->per_algo[r->model].p50_us / r->per_algo[r->best].p50_us);
            else
                fprintf(f, ", \"model_is_fastest\": null, \"model_vs_fastest\": null");
        } else if (barrier) {
            json_half(f, "barrier", &r->half[0], 1);
        } else {
            json_half(f, "out_of_place", &r->half[0], 0);
            if (!coll_one_half(cfg->coll))
                json_half(f, "in_place", &r->half[1], 0);
        }
        fprintf(f, "}");
    }
    fprintf(f, "\n]\n");
}

/* The JSON goes to a temporary file beside cfg->json, renamed over it once complete: a
 * full disk or a write error leaves no empty or cut file, and an earlier one stays. */
static int write_json(const bench_ctx_t *b, const bench_set_t *set, const bench_row_t *rows,
                      size_t n)
{
    const bench_cfg_t *cfg = b->cfg;
    size_t plen = strlen(cfg->json) + 16;
    char *tmp = malloc(plen);
    if (!tmp) {
        fprintf(stderr, "tutti-bench: %s: out of memory\n", cfg->json);
        return -1;
    }
    snprintf(tmp, plen, "%s.tmp.XXXXXX", cfg->json);
    int fd = mkstemp(tmp);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
    if (!f) {
        fprintf(stderr, "tutti-bench: %s: %s\n", fd < 0 ? cfg->json : tmp, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        free(tmp);
        return -1;
    }
    /* the permissions fopen would have given (mkstemp makes it 0600) */
    mode_t um = umask(0);
    umask(um);
    (void)fchmod(fd, 0666 & ~um);
    write_json_rows(f, b, set, rows, n);
    int bad = fflush(f) != 0 || ferror(f);
    int err = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        err = errno;
    }
    if (!bad && rename(tmp, cfg->json) != 0) {
        bad = 1;
        err = errno;
    }
    if (bad) {
        fprintf(stderr, "tutti-bench: %s: %s (left as it was)\n", cfg->json, strerror(err));
        unlink(tmp);
    }
    free(tmp);
    return bad ? -1 : 0;
}

/* The rows of a run, one per size from MIN to MAX by FACTOR (barrier: one); unit is the
 * bytes of one count; rows_p NULL: only counted. Returns 0, or -1 out of memory. */
static int make_rows(const bench_cfg_t *cfg, size_t unit, bench_row_t **rows_p, size_t *nsizes_p)
{
    int barrier = cfg->coll == COLL_BARRIER;
    size_t nsizes = 0, cap = 0;
    bench_row_t *rows = NULL;
    for (size_t s = barrier ? 0 : cfg->min_bytes;; s *= cfg->factor) {
        if (!barrier && (s > cfg->max_bytes || s / unit == 0)) {
            if (s > cfg->max_bytes)
                break;
            continue; /* smaller than one element (per rank) */
        }
        if (rows_p && nsizes == cap) {
            cap = cap ? 2 * cap : 32;
            bench_row_t *nr = realloc(rows, cap * sizeof(*rows));
            if (!nr) {
                free(rows);
                return -1;
            }
            rows = nr;
        }
        if (rows_p) {
            memset(&rows[nsizes], 0, sizeof(rows[nsizes]));
            rows[nsizes].count = s / unit;
            rows[nsizes].bytes = rows[nsizes].count * unit;
        }
        nsizes++;
        if (barrier || s > SIZE_MAX / cfg->factor)
            break;
    }
    if (rows_p)
        *rows_p = rows;
    *nsizes_p = nsizes;
    return 0;
}

/* The checks that need the rank count n (-np's when the arguments are read, the
 * environment's once its store says it): 0, or -1 (bad usage; said when loud). */
static int check_world(const bench_cfg_t *cfg, int n, int loud)
{
    char why[512];
    if (cfg->root >= n) { /* (every collective's -r: the runs script passes one to all) */
        if (loud)
            fprintf(stderr, "tutti-bench: root %d out of range for %d ranks\n", cfg->root, n);
        return -1;
    }
    if (cfg->check && check_exact(cfg, n, why, sizeof(why)) < 0) {
        if (loud)
            fprintf(stderr, "tutti-bench: %s\n", why);
        return -1;
    }
    size_t esize = tutti_dtype_size(cfg->dtype), nsizes;
    size_t unit = coll_blocked(cfg->coll) ? (size_t)n * esize : esize;
    make_rows(cfg, unit, NULL, &nsizes); /* counted only: cannot fail */
    if (nsizes == 0) {
        if (loud)
            fprintf(stderr,
                    "tutti-bench: no size from -b %zu to -e %zu (by -f %zu) holds a whole %s "
                    "(%zu B%s): nothing to run\n",
                    cfg->min_bytes, cfg->max_bytes, cfg->factor,
                    coll_blocked(cfg->coll) ? "element per rank" : "element", unit,
                    coll_blocked(cfg->coll) ? ", nranks x elem" : "");
        return -1;
    }
    return 0;
}

/* What the summary adds up over the sizes. */
typedef struct bench_tally {
    double bw_sum;
    int bw_n, model_hits, model_rows;
    double worst_miss; /* --algo all: the model's worst time over the fastest's */
    size_t worst_bytes;
    long long total_wrong;
} bench_tally_t;

/* --algo all: time one size out of place on each algorithm's communicator. */
static int run_row_algos(bench_ctx_t *b, const bench_set_t *set, bench_row_t *row,
                         bench_tally_t *tally_p)
{
    const bench_cfg_t *cfg = b->cfg;
    row->best = 0;
    row->model = -1;
    /* The algorithms take turns, ALGO_ROUNDS rounds of iters/ALGO_ROUNDS calls each (the
     * warm-up before the first round, two untimed calls before each later one), so a
     * host that drifts between a fast and a slow state within the row slows them all
     * alike rather than whichever ran then. Two, not one: under --window the gap comes
     * from the untimed calls after the first (bench_window_times), and the first call of
     * a communicator that sat idle while the others ran may pay one-off costs, as a
     * run's first call does. Over tcp hd still pays for the turns themselves, untimed
     * calls or not (two communicators both running hd, taking turns, 1.2-1.5x hd alone:
     * docs/benchmarks.md, session 64), so the sweep under-rates it there. */
    const int rounds = algo_rounds(cfg);
    double *times = malloc(sizeof(double) * (size_t)cfg->iters * (size_t)set->nalgos);
    long long *wrong = calloc((size_t)set->nalgos, sizeof(*wrong));
    if (!times || !wrong) {
        free(times);
        free(wrong);
        fprintf(stderr, "tutti-bench: rank %d: out of memory\n", b->rank);
        return -1;
    }
    for (int r = 0, done = 0; r < rounds; r++) {
        int part = (cfg->iters - done) / (rounds - r), last = r + 1 == rounds;
        for (int a = 0; a < set->nalgos; a++) {
            b->comm = set->comms[a];
            long long w;
            if (time_calls(b, row->count, row->bytes, 0, r ? 2 : cfg->warmup, part,
                           times + (size_t)a * (size_t)cfg->iters + done, cfg->check && last,
                           &w) != TUTTI_OK) {
                free(times);
                free(wrong);
                return -1;
            }
            wrong[a] = w;
        }
        done += part;
    }
    for (int a = 0; a < set->nalgos; a++)
        half_stats(b, row->bytes, times + (size_t)a * (size_t)cfg->iters, cfg->iters, wrong[a],
                   &row->per_algo[a]);
    free(times);
    free(wrong);
    for (int a = 0; a < set->nalgos; a++) {
        if (row->per_algo[a].wrong > 0)
            tally_p->total_wrong += row->per_algo[a].wrong;
        if (row->per_algo[a].p50_us < row->per_algo[row->best].p50_us)
            row->best = a;
        if (row->algo && !strcmp(row->algo, set->names[a]))
            row->model = a;
    }
    b->comm = set->main;
    if (b->cfg->coll != COLL_BARRIER) {
        tally_p->bw_sum += algo_busbw(b, row, row->best);
        tally_p->bw_n++;
    }
    if (row->model >= 0) {
        double r = row->per_algo[row->model].p50_us / row->per_algo[row->best].p50_us;
        tally_p->model_rows++;
        tally_p->model_hits += row->model == row->best;
        if (r > tally_p->worst_miss) {
            tally_p->worst_miss = r;
            tally_p->worst_bytes = row->bytes;
        }
    }
    return 0;
}

/* Time one size out of place and in place (barrier: once). */
static int run_row_halves(const bench_ctx_t *b, bench_row_t *row, bench_tally_t *tally_p)
{
    int barrier = b->cfg->coll == COLL_BARRIER;
    for (int ip = 0; ip < (coll_one_half(b->cfg->coll) ? 1 : 2); ip++) {
        if (run_half(b, row->count, row->bytes, ip, &row->half[ip]) != TUTTI_OK)
            return -1;
        if (row->half[ip].wrong > 0)
            tally_p->total_wrong += row->half[ip].wrong;
        if (!barrier) {
            tally_p->bw_sum += row->half[ip].busbw;
            tally_p->bw_n++;
        }
    }
    return 0;
}

static void print_summary(const bench_cfg_t *cfg, const bench_tally_t *t)
{
    if (cfg->check && cfg->coll == COLL_BARRIER)
        printf("# Out of bounds values : N/A (a barrier moves no data: -c checks nothing)\n");
    else if (cfg->check)
        printf("# Out of bounds values : %lld %s\n", t->total_wrong,
               t->total_wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g%s\n", t->bw_n ? t->bw_sum / t->bw_n : 0.0,
           cfg->algo_all ? " (the fastest algorithm of each size)" : "");
    bench_window_print();
    if (cfg->algo_all) {
        printf("# Model picked the fastest at %d of %d sizes", t->model_hits, t->model_rows);
        if (t->worst_bytes)
            printf("; worst miss +%.1f%% at %zu B", 100.0 * (t->worst_miss - 1.0), t->worst_bytes);
        printf("\n");
    }
    printf("#\n");
    fflush(stdout);
}

/* Run every size on initialized communicators. Returns 0, 1 when results were wrong,
 * or 3 when a call failed. */
static int bench_comm(const bench_cfg_t *cfg, const bench_set_t *set)
{
    tutti_comm_t *comm = set->main;
    bench_ctx_t b = { cfg,  comm, tutti_comm_rank(comm), tutti_comm_size(comm), NULL, NULL, NULL,
                      NULL, NULL };
    int barrier = cfg->coll == COLL_BARRIER;
    size_t esize = tutti_dtype_size(cfg->dtype);
    /* check_world passed already: at the arguments (-np) or in run_env */
    /* blocked collectives: size = nranks x count x elem; neighbor_alltoall's 2 blocks */
    size_t unit = coll_blocked(cfg->coll)               ? (size_t)b.size * esize
                  : cfg->coll == COLL_NEIGHBOR_ALLTOALL ? RING_DEGREE * esize
                                                        : esize;
    tutti_comm_t *ring = NULL;
    if (cfg->coll == COLL_NEIGHBOR_ALLTOALL) { /* the ring's communicator runs the calls */
        int dims[1] = { b.size }, periods[1] = { 1 };
        int st = tutti_cart_create(comm, 1, dims, periods, &ring);
        if (st != TUTTI_OK) {
            fprintf(stderr, "tutti-bench: rank %d: cart_create: %s\n", b.rank,
                    tutti_comm_last_error(comm));
            return 3;
        }
        b.comm = comm = ring;
    }
    size_t nsizes;
    bench_row_t *rows;
    if (make_rows(cfg, unit, &rows, &nsizes) < 0) {
        if (ring)
            tutti_comm_destroy(ring);
        return 3;
    }

    size_t alloc = barrier ? 64 : (cfg->max_bytes / esize) * esize;
    alloc = (alloc + 4095) & ~(size_t)4095;
    /* --offset: one more page each, the buffers that far into it */
    char *send_page = aligned_alloc(4096, alloc + (cfg->offset ? 4096 : 0));
    char *recv_page = aligned_alloc(4096, alloc + (cfg->offset ? 4096 : 0));
    b.send = send_page ? send_page + cfg->offset : NULL;
    b.recv = recv_page ? recv_page + cfg->offset : NULL;
    b.times = malloc(sizeof(double) * (size_t)cfg->iters);
    int rc = 0;
    if (!b.send || !b.recv || !b.times) {
        fprintf(stderr, "tutti-bench: rank %d: out of memory (2 x %zu B)\n", b.rank, alloc);
        rc = 3;
        goto out_free;
    }
    memset(b.send, 0, alloc);
    memset(b.recv, 0, alloc);
    if (cfg->cuda) {
        char *ds, *dr;
        if (cuda_setup(b.rank, alloc + (size_t)cfg->offset, (void **)&ds, (void **)&dr) < 0) {
            rc = 3;
            goto out_free;
        }
        b.dsend = ds + cfg->offset;
        b.drecv = dr + cfg->offset;
        /* a blocking stream: the untimed writes and reads of the buffers (cuMemcpy on the
         * legacy stream) are ordered with it. With a non-blocking one, a write from
         * pageable memory that returned before its DMA ended raced the next call's copy
         * in: wrong in-place results up to 16 KB on the H200 of session 86 */
        int r = cfg->stream ? cu.stream_create(&cu_stream, 0) : 0;
        for (int a = -1; cfg->stream && !r && a < set->nalgos; a++) {
            tutti_comm_t *c = a < 0 ? set->main : set->comms[a];
            if (c && (r = tutti_comm_set_stream(c, cu_stream)) < 0)
                fprintf(stderr, "tutti-bench: rank %d: --stream: %s\n", b.rank,
                        tutti_comm_last_error(c));
        }
        if (r) {
            fprintf(stderr, "tutti-bench: rank %d: --stream: error %d\n", b.rank, r);
            rc = 3;
            goto out_free;
        }
    }

    if (b.rank == 0) {
        print_header(&b, set);
        fflush(stdout);
    }
    bench_tally_t tally = { .worst_miss = 1.0 };
    for (size_t k = 0; k < nsizes; k++) {
        bench_row_t *row = &rows[k];
        size_t sel = select_bytes(cfg->coll, row->count, esize, b.size);
        row->algo = tutti_comm_algo_for(comm, coll_names[cfg->coll], sel);
        if ((cfg->algo_all ? run_row_algos(&b, set, row, &tally)
                           : run_row_halves(&b, row, &tally)) < 0) {
            rc = 3;
            goto out_free;
        }
        if (b.rank == 0)
            print_row(&b, set, row);
    }
    if (b.rank == 0) {
        print_summary(cfg, &tally);
        if (cfg->json && write_json(&b, set, rows, nsizes) != 0)
            rc = 3;
    }
    if (tally.total_wrong && !rc)
        rc = 1;
out_free:
    free(b.times);
    free(recv_page);
    free(send_page);
    free(rows);
    if (ring && tutti_comm_destroy(ring) != TUTTI_OK && !rc)
        rc = 3;
    return rc;
}

static int comm_opts(const bench_cfg_t *cfg, tutti_comm_opts_t *opts)
{
    int st = tutti_comm_opts_init(opts);
    if (st != TUTTI_OK) {
        fprintf(stderr, "tutti-bench: options: %s\n", tutti_strerror(st));
        return st;
    }
    if (cfg->algo)
        opts->algo = cfg->algo;
    if (cfg->transport)
        opts->transport = cfg->transport;
    if (cfg->cuda)
        opts->cuda = "on";
    return TUTTI_OK;
}

static int finish(tutti_comm_t *comm, int rc)
{
    int st = tutti_comm_destroy(comm);
    if (st != TUTTI_OK && rc == 0) {
        fprintf(stderr, "tutti-bench: destroy: %s\n", tutti_strerror(st));
        rc = 3;
    }
    return rc;
}

/* Run the benchmark on one communicator. */
static int bench_one(const bench_cfg_t *cfg, tutti_comm_t *comm)
{
    bench_set_t set;
    memset(&set, 0, sizeof(set));
    set.main = comm;
    return finish(comm, bench_comm(cfg, &set));
}

static void append_name(char *buf, size_t len, const char *name)
{
    size_t used = strlen(buf);
    if (used < len)
        snprintf(buf + used, len - used, "%s%s", used ? ", " : "", name);
}

/* tutti_comm_init with this process's stderr held back: shown if the init fails with
 * anything but TUTTI_ERR_CONFIG (an algorithm name the library does not have, which
 * --algo all expects and reports itself). */
static int init_probe(tutti_comm_t **comm_p, tutti_store_t *store, int rank, int size,
                      const tutti_comm_opts_t *opts)
{
    FILE *tmp = tmpfile();
    int saved = -1;
    fflush(stderr);
    if (tmp && (saved = dup(STDERR_FILENO)) >= 0)
        dup2(fileno(tmp), STDERR_FILENO);
    int st = tutti_comm_init(comm_p, store, rank, size, opts);
    fflush(stderr);
    if (saved >= 0) {
        dup2(saved, STDERR_FILENO);
        close(saved);
    }
    if (tmp) {
        if (st != TUTTI_OK && st != TUTTI_ERR_CONFIG) {
            char buf[4096];
            size_t got;
            rewind(tmp);
            while ((got = fread(buf, 1, sizeof(buf), tmp)) > 0)
                fwrite(buf, 1, got, stderr);
        }
        fclose(tmp);
    }
    return st;
}

/* --algo all on a store: the model's communicator (no override, whatever TUTTI_ALGO
 * says) and one per algorithm the library accepts for the collective, each created
 * once; run every size on them; destroy them. */
static int bench_all(const bench_cfg_t *cfg, tutti_store_t *store, int rank, int size)
{
    bench_set_t set;
    memset(&set, 0, sizeof(set));
    tutti_comm_opts_t opts;
    if (comm_opts(cfg, &opts) != TUTTI_OK)
        return 3;
    opts.algo = "";
    int st = tutti_comm_init(&set.main, store, rank, size, &opts);
    if (st != TUTTI_OK) {
        fprintf(stderr, "tutti-bench: rank %d: tutti_comm_init: %s (%s): %s\n", rank,
                tutti_strerror(st), tutti_status_name(st), tutti_comm_last_error(NULL));
        return 3;
    }
    int rc = 0;
    const char *name;
    for (int i = 0; (name = tutti_algo_name(coll_names[cfg->coll], i)) && i < MAX_ALGOS; i++) {
        char spec[128];
        snprintf(spec, sizeof(spec), "%s:%s", coll_names[cfg->coll], name);
        opts.algo = spec;
        tutti_comm_t *c;
        st = init_probe(&c, store, rank, size, &opts);
        if (st == TUTTI_ERR_CONFIG) { /* not for this job */
            append_name(set.absent, sizeof(set.absent), name);
            continue;
        }
        if (st != TUTTI_OK) {
            fprintf(stderr, "tutti-bench: rank %d: tutti_comm_init (%s): %s (%s): %s\n", rank, spec,
                    tutti_strerror(st), tutti_status_name(st), tutti_comm_last_error(NULL));
            rc = 3;
            goto out;
        }
        set.names[set.nalgos] = name;
        set.comms[set.nalgos++] = c;
    }
    if (set.nalgos == 0) {
        if (rank == 0)
            fprintf(stderr, "tutti-bench: tutti_comm_init rejected every %s algorithm: %s\n",
                    coll_names[cfg->coll], set.absent);
        rc = 3;
        goto out;
    }
    rc = bench_comm(cfg, &set);
out:
    for (int a = set.nalgos - 1; a >= 0; a--)
        rc = finish(set.comms[a], rc);
    return finish(set.main, rc);
}

/* ---- -np: local ranks ------------------------------------------------------------ */

static int run_local_rank(const bench_cfg_t *cfg, const char *dir, int rank)
{
    setenv("TUTTI_SOCKET_IFNAME", "lo", 0); /* local ranks talk over loopback */
    tutti_store_opts_t sopts;
    tutti_store_opts_init(&sopts);
    tutti_store_t *store;
    int st = tutti_store_open_file(&store, dir, sopts.timeout_ms);
    if (st != TUTTI_OK) {
        fprintf(stderr, "tutti-bench: rank %d: file store %s: %s\n", rank, dir, tutti_strerror(st));
        return 3;
    }
    tutti_comm_opts_t opts;
    tutti_comm_t *comm;
    int rc = 3;
    if (cfg->algo_all) {
        rc = bench_all(cfg, store, rank, cfg->np);
        goto out_store;
    }
    if (comm_opts(cfg, &opts) != TUTTI_OK)
        goto out_store;
    st = tutti_comm_init(&comm, store, rank, cfg->np, &opts);
    if (st != TUTTI_OK) {
        fprintf(stderr, "tutti-bench: rank %d: tutti_comm_init: %s (%s): %s\n", rank,
                tutti_strerror(st), tutti_status_name(st), tutti_comm_last_error(NULL));
        goto out_store;
    }
    rc = bench_one(cfg, comm);
out_store:
    tutti_store_close(store);
    return rc;
}

/* A forked rank: runs its part and exits with its status. */
typedef struct local_rank {
    const bench_cfg_t *cfg;
    const char *dir;
} local_rank_t;

static void local_rank(void *arg, int rank)
{
    const local_rank_t *a = arg;
    int rc = run_local_rank(a->cfg, a->dir, rank);
    fflush(stdout);
    fflush(stderr);
    _exit(rc);
}

/* -np: the ranks are forks of this process, started and stopped as tutti-run starts and
 * stops its ranks (tools/launch.c): they die with it, even SIGKILLed, and the store
 * directory goes on every exit path. */
static int run_local(const bench_cfg_t *cfg)
{
    if (tt_launch_job_id("tutti-bench", cfg->np, NULL, 1, NULL) < 0)
        return 3;
    tt_launch_t l;
    if (tt_launch_start(&l, "tutti-bench", cfg->np, 1) < 0)
        return 3;
    l.bind = cfg->bind;
    local_rank_t arg = { .cfg = cfg, .dir = l.dir };
    int rc = 0;
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < cfg->np; r++) {
        if (tt_launch_spawn(&l, r, local_rank, &arg) < 0) {
            rc = 3;
            tt_launch_stop(&l);
            break;
        }
    }

    /* A rank that fails (status 3 or a signal) stops the others; one that only saw
     * wrong results (status 1) lets the others finish. */
    int w = tt_launch_wait_all(&l, cfg->timeout_s, 1);
    if (rc == 0)
        rc = w;
    if (tt_launch_finish(&l) < 0 && rc == 0)
        rc = 3;
    return rc;
}

/* ---- environment: a job started by someone else ---------------------------------- */

/* A job started by someone else (tutti-run, torchrun, mpirun, srun): the store and the
 * place as tutti_comm_init_env finds them (tutti_store_open_env); with --algo all, one
 * communicator an algorithm, all on that store. */
static int run_env(const bench_cfg_t *cfg)
{
    tutti_comm_opts_t opts;
    if (comm_opts(cfg, &opts) != TUTTI_OK)
        return 3;
    tutti_store_t *store;
    int rank, size;
    int st = tutti_store_open_env(&store, &rank, &size, &opts);
    if (st != TUTTI_OK) {
        fprintf(stderr, "tutti-bench: %s (%s)\n%s", tutti_comm_last_error(NULL),
                tutti_status_name(st),
                st == TUTTI_ERR_CONFIG ? "tutti-bench: or start local ranks with -np N\n" : "");
        return st == TUTTI_ERR_CONFIG ? 2 : 3;
    }
    int rc;
    if (check_world(cfg, size, rank == 0) < 0) {
        rc = 2;
    } else if (cfg->algo_all) {
        rc = bench_all(cfg, store, rank, size);
    } else {
        tutti_comm_t *comm;
        st = tutti_comm_init(&comm, store, rank, size, &opts);
        if (st != TUTTI_OK) {
            fprintf(stderr, "tutti-bench: rank %d: tutti_comm_init: %s (%s): %s\n", rank,
                    tutti_strerror(st), tutti_status_name(st), tutti_comm_last_error(NULL));
            rc = 3;
        } else {
            rc = bench_one(cfg, comm);
        }
    }
    tutti_store_close(store);
    return rc;
}

int main(int argc, char **argv)
{
    bench_cfg_t cfg = {
        .coll = COLL_ALLREDUCE,
        .min_bytes = 8,
        .max_bytes = 64u << 20,
        .factor = 2,
        .iters = 20,
        .warmup = 5,
        .dtype = TUTTI_FP32,
        .op = TUTTI_SUM,
        .timeout_s = 1800,
    };
    int p = parse_args(argc, argv, &cfg);
    if (p != 0)
        return p > 0 ? 0 : 2;
    return cfg.np > 0 ? run_local(&cfg) : run_env(&cfg);
}
