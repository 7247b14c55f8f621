/* fuse-bench: the fuser against per-tensor and flat allreduce, overlap with a simulated
 * backward, and coalesced broadcast, on local ranks over loopback.
 *
 *   fuse-bench -np 2 [-iters 7] [-set resnet|small|bcast|all] [-overlap-only] [-c]
 *              [-t SEC]
 *
 * -np N forks N local ranks as tutti-bench does (tools/launch.c): a TUTTI_JOB_ID of
 * their own unless set, a file store in a fresh directory in $TMPDIR or /tmp, removed
 * however fuse-bench ends; the ranks die with it, even SIGKILLed, and all stop when one
 * fails or after -t SEC (default 1800). Without -np, with TUTTI_RANK set: one rank of
 * the job the environment describes (TUTTI_RANK, TUTTI_WORLD_SIZE, TUTTI_STORE), e.g.
 * one per network namespace.
 *
 * -c checks every way's result once after its timed iterations, against sums (or the
 * root's values) computed here: each line then ends with the number of wrong elements
 * over all ranks, and fuse-bench exits 1 if any was wrong.
 *
 * Sets: "resnet" = the 161 gradients of ResNet-50 (25.6 M fp32 parameters, shapes
 * generated below), "small" = 1,000 tensors of 1 KiB (256 fp32). For each set:
 *   per-tensor  one blocking allreduce per tensor
 *   fuser       register once; each step marks every tensor (last first) and waits
 *   fuser-views the same with bucket views (no copies)
 *   flat        one allreduce of all the bytes
 * and the ratios fuser/flat, views/flat, per-tensor/fuser and per-tensor/views. The
 * broadcast set alternates one-by-one and coalesced iterations.
 * Each iteration starts after a barrier; its time is the maximum over ranks; the
 * median of -iters iterations is printed.
 *
 * Overlap: a thread "computes" each layer for a set time (nanosleep: the CPU stays free,
 * as with a GPU doing the work), last layer first, marking its gradients ready; the
 * total compute time equals the measured communication time of the fuser with bucket
 * views, which the overlap run uses (the hardest case: compute = comm).
 * Sequential would take their sum; the target is <= 1.2 x max(compute, comm).
 *
 * Only the public API is used.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tutti/fuse.h>
#include <tutti/tutti.h>

#include "../tools/launch.h"

#define MAX_T 2048

typedef struct tset {
    const char *name;
    int n;
    size_t count[MAX_T];
    int layer[MAX_T]; /* tensors of one layer become ready together */
    int nlayers;
    size_t total;
} tset_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void add(tset_t *s, size_t count, int new_layer)
{
    if (new_layer)
        s->nlayers++;
    s->count[s->n] = count;
    s->layer[s->n] = s->nlayers - 1;
    s->n++;
    s->total += count;
}

/* conv weight, then its batch norm's weight and bias: one layer */
static void conv_bn(tset_t *s, size_t cin, size_t cout, size_t k, int with_bn_state, tset_t *state)
{
    add(s, cout * cin * k * k, 1);
    add(s, cout, 0);
    add(s, cout, 0);
    if (with_bn_state) {
        add(state, cout * cin * k * k, 1);
        add(state, cout, 0);
        add(state, cout, 0);
        add(state, cout, 0); /* running mean */
        add(state, cout, 0); /* running var */
        add(state, 2, 0);    /* num_batches_tracked: an int64, as two fp32 */
    }
}

/* ResNet-50: 161 parameter tensors, 25,557,032 parameters; state: + BN statistics */
static void make_resnet(tset_t *s, tset_t *state)
{
    memset(s, 0, sizeof(*s));
    memset(state, 0, sizeof(*state));
    s->name = "resnet50 (161 tensors)";
    state->name = "resnet50 state";
    conv_bn(s, 3, 64, 7, 1, state);
    static const int blocks[4] = { 3, 4, 6, 3 }, widths[4] = { 64, 128, 256, 512 };
    size_t in = 64;
    for (int st = 0; st < 4; st++) {
        size_t w = (size_t)widths[st];
        for (int b = 0; b < blocks[st]; b++) {
            conv_bn(s, in, w, 1, 1, state);
            conv_bn(s, w, w, 3, 1, state);
            conv_bn(s, w, 4 * w, 1, 1, state);
            if (b == 0)
                conv_bn(s, in, 4 * w, 1, 1, state);
            in = 4 * w;
        }
    }
    add(s, 1000 * 2048, 1);
    add(s, 1000, 0);
    add(state, 1000 * 2048, 1);
    add(state, 1000, 0);
}

static void make_small(tset_t *s)
{
    memset(s, 0, sizeof(*s));
    s->name = "1000 x 1 KiB";
    for (int i = 0; i < 1000; i++)
        add(s, 256, i % 10 == 0); /* 100 layers of 10 */
}

typedef struct cfg {
    int np, iters, overlap_only, check, timeout_s;
    const char *set;
} cfg_t;

/* -c: what a rank puts in element e of tensor i before a checked call (small integers,
 * so every sum over ranks is exact in fp32), and what the sum over np ranks must be */
static float fill_value(int rank, int i, size_t e)
{
    return (float)((rank + 1) * (int)((size_t)i % 7 + e % 13 + 1));
}

static float sum_value(int np, int i, size_t e)
{
    return (float)(np * (np + 1) / 2 * (int)((size_t)i % 7 + e % 13 + 1));
}

static void fill_set(float *const *bufs, const tset_t *s, int rank)
{
    for (int i = 0; i < s->n; i++)
        for (size_t e = 0; e < s->count[i]; e++)
            bufs[i][e] = fill_value(rank, i, e);
}

/* elements of the set that are not the sum over np ranks */
static long long wrong_sums(float *const *bufs, const tset_t *s, int np)
{
    long long w = 0;
    for (int i = 0; i < s->n; i++)
        for (size_t e = 0; e < s->count[i]; e++)
            w += bufs[i][e] != sum_value(np, i, e);
    return w;
}

static long long wrong_seen; /* over every checked line, on every rank: the exit status */

/* one count over all ranks (-1 when not checked) */
static long long wrong_total(tutti_comm_t *comm, const cfg_t *cfg, long long w)
{
    if (!cfg->check)
        return -1;
    int64_t v = w;
    tutti_allreduce(comm, TUTTI_IN_PLACE, &v, 1, TUTTI_INT64, TUTTI_SUM);
    wrong_seen += v;
    return v;
}

/* a line's tail: its wrong count under -c, nothing otherwise */
static const char *wrong_text(char *buf, size_t len, long long w)
{
    if (w < 0)
        return "";
    snprintf(buf, len, "  wrong %lld", w);
    return buf;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* max over ranks of each iteration, then the median */
static double median_max(tutti_comm_t *comm, double *t, int n)
{
    tutti_allreduce(comm, TUTTI_IN_PLACE, t, (size_t)n, TUTTI_FP64, TUTTI_MAX);
    qsort(t, (size_t)n, sizeof(double), cmp_d);
    return t[n / 2];
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int st_ = (call);                                                                          \
        if (st_ != TUTTI_OK) {                                                                     \
            fprintf(stderr, "fuse-bench: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,              \
                    tutti_strerror(st_));                                                          \
            exit(3);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct backward {
    tutti_fuse_t *f;
    const tset_t *s;
    double layer_s[MAX_T]; /* compute time per layer */
    int mark;
} backward_t;

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    nanosleep(&ts, NULL);
}

static void *backward_main(void *arg)
{
    backward_t *b = arg;
    const tset_t *s = b->s;
    int i = s->n - 1;
    for (int l = s->nlayers - 1; l >= 0; l--) {
        sleep_s(b->layer_s[l]);
        for (; i >= 0 && s->layer[i] == l; i--)
            if (b->mark)
                CHECK(tutti_fuse_mark_ready(b->f, i));
    }
    return NULL;
}

static tutti_fuse_t *make_fuser(tutti_comm_t *comm, const tset_t *s, float **bufs, int views)
{
    tutti_fuse_opts_t o;
    tutti_fuse_opts_init(&o);
    o.bucket_views = views;
    tutti_fuse_t *f;
    CHECK(tutti_fuse_create(&f, comm, &o));
    for (int i = 0; i < s->n; i++) {
        int idx;
        CHECK(tutti_fuse_register(f, views ? NULL : bufs[i], s->count[i], TUTTI_FP32, &idx));
    }
    return f;
}

/* the tensors' memory as the fuser holds it (with views: in its buckets) */
static void fuser_data(tutti_fuse_t *f, const tset_t *s, float **data)
{
    for (int i = 0; i < s->n; i++) {
        void *p;
        CHECK(tutti_fuse_tensor_data(f, i, &p));
        data[i] = p;
    }
}

static double fuser_step(tutti_comm_t *comm, tutti_fuse_t *f, const tset_t *s)
{
    tutti_barrier(comm);
    double t0 = now_s();
    for (int i = s->n - 1; i >= 0; i--)
        CHECK(tutti_fuse_mark_ready(f, i));
    CHECK(tutti_fuse_wait(f));
    return now_s() - t0;
}

static void bench_set(tutti_comm_t *comm, const cfg_t *cfg, const tset_t *s)
{
    int rank = tutti_comm_rank(comm), np = tutti_comm_size(comm), it = cfg->iters;
    long long w_per = 0, w_flat = 0, w_fz = 0, w_fzv = 0, w_ov = 0;
    float **bufs = calloc((size_t)s->n, sizeof(float *));
    float **data = calloc((size_t)s->n, sizeof(float *));
    float *flat = calloc(s->total, sizeof(float));
    double *t = calloc((size_t)it, sizeof(double));
    for (int i = 0; i < s->n; i++) {
        bufs[i] = malloc(s->count[i] * sizeof(float));
        for (size_t e = 0; e < s->count[i]; e++)
            bufs[i][e] = 1.0f;
    }
    double per = 0, fz = 0, fzv = 0, fl = 0;
    if (!cfg->overlap_only) {
        for (int k = 0; k < it; k++) {
            tutti_barrier(comm);
            double t0 = now_s();
            for (int i = s->n - 1; i >= 0; i--)
                CHECK(tutti_allreduce(comm, TUTTI_IN_PLACE, bufs[i], s->count[i], TUTTI_FP32,
                                      TUTTI_SUM));
            t[k] = now_s() - t0;
        }
        per = median_max(comm, t, it);
        if (cfg->check) {
            fill_set(bufs, s, rank);
            for (int i = s->n - 1; i >= 0; i--)
                CHECK(tutti_allreduce(comm, TUTTI_IN_PLACE, bufs[i], s->count[i], TUTTI_FP32,
                                      TUTTI_SUM));
            w_per = wrong_sums(bufs, s, np);
        }
        for (int k = 0; k < it; k++) {
            tutti_barrier(comm);
            double t0 = now_s();
            CHECK(tutti_allreduce(comm, TUTTI_IN_PLACE, flat, s->total, TUTTI_FP32, TUTTI_SUM));
            t[k] = now_s() - t0;
        }
        fl = median_max(comm, t, it);
        if (cfg->check) {
            const tset_t one = { .n = 1, .count = { s->total } };
            fill_set(&flat, &one, rank);
            CHECK(tutti_allreduce(comm, TUTTI_IN_PLACE, flat, s->total, TUTTI_FP32, TUTTI_SUM));
            w_flat = wrong_sums(&flat, &one, np);
        }
    }
    tutti_fuse_t *f = make_fuser(comm, s, bufs, 0);
    fuser_step(comm, f, s); /* step 1 records the order and rebuilds */
    for (int k = 0; k < it; k++)
        t[k] = fuser_step(comm, f, s);
    fz = median_max(comm, t, it);
    if (cfg->check) {
        fill_set(bufs, s, rank);
        fuser_step(comm, f, s);
        w_fz = wrong_sums(bufs, s, np);
    }
    tutti_fuse_destroy(f);
    /* with views from here on, as DDP with gradient_as_bucket_view */
    f = make_fuser(comm, s, bufs, 1);
    fuser_step(comm, f, s);
    for (int k = 0; k < it; k++)
        t[k] = fuser_step(comm, f, s);
    fzv = median_max(comm, t, it);
    if (cfg->check) {
        fuser_data(f, s, data);
        fill_set(data, s, rank);
        fuser_step(comm, f, s);
        w_fzv = wrong_sums(data, s, np);
    }
    if (!cfg->overlap_only) {
        long long w = wrong_total(comm, cfg, w_per + w_flat + w_fz + w_fzv);
        char wb[40];
        if (rank == 0) {
            printf("%-24s %2d ranks %8.2f MB  per-tensor %9.3f ms  fuser %8.3f ms  "
                   "fuser-views %8.3f ms  flat %8.3f ms  fuser/flat %.2f  views/flat %.2f  "
                   "per-tensor/fuser %.1f  per-tensor/views %.1f%s\n",
                   s->name, tutti_comm_size(comm), (double)s->total * 4 / 1e6, per * 1e3, fz * 1e3,
                   fzv * 1e3, fl * 1e3, fz / fl, fzv / fl, per / fz, per / fzv,
                   wrong_text(wb, sizeof(wb), w));
            fflush(stdout);
        }
    }

    /* overlap: compute time = fuser communication time, spread over layers by size */
    backward_t *bw = calloc(1, sizeof(*bw));
    bw->f = f;
    bw->s = s;
    double comm_s = fzv;
    for (int i = 0; i < s->n; i++)
        bw->layer_s[s->layer[i]] += comm_s * (double)s->count[i] / (double)s->total;
    double comp = 0;
    for (int k = 0; k < it; k++) { /* compute alone */
        tutti_barrier(comm);
        double t0 = now_s();
        bw->mark = 0;
        backward_main(bw);
        t[k] = now_s() - t0;
    }
    comp = median_max(comm, t, it);
    bw->mark = 1;
    for (int k = 0; k < it; k++) {
        tutti_barrier(comm);
        double t0 = now_s();
        pthread_t th;
        pthread_create(&th, NULL, backward_main, bw);
        pthread_join(th, NULL);
        CHECK(tutti_fuse_wait(f));
        t[k] = now_s() - t0;
    }
    double ov = median_max(comm, t, it);
    if (cfg->check) {
        fuser_data(f, s, data);
        fill_set(data, s, rank);
        tutti_barrier(comm);
        pthread_t th;
        pthread_create(&th, NULL, backward_main, bw);
        pthread_join(th, NULL);
        CHECK(tutti_fuse_wait(f));
        w_ov = wrong_sums(data, s, np);
    }
    long long w = wrong_total(comm, cfg, w_ov);
    char wb[40];
    double mx = comp > comm_s ? comp : comm_s;
    if (rank == 0) {
        printf("%-24s %2d ranks overlap: compute %.2f ms, comm %.2f ms, step %.2f ms = "
               "%.2f x max (sum would be %.2f x)%s\n",
               s->name, tutti_comm_size(comm), comp * 1e3, comm_s * 1e3, ov * 1e3, ov / mx,
               (comp + comm_s) / mx, wrong_text(wb, sizeof(wb), w));
        fflush(stdout);
    }
    free(bw);
    tutti_fuse_destroy(f);
    for (int i = 0; i < s->n; i++)
        free(bufs[i]);
    free(bufs);
    free(data);
    free(flat);
    free(t);
}

static void bench_bcast(tutti_comm_t *comm, const cfg_t *cfg, const tset_t *s)
{
    int it = cfg->iters, n = s->n, rank = tutti_comm_rank(comm);
    void **bufs = calloc((size_t)n, sizeof(void *));
    tutti_dtype_t *dts = calloc((size_t)n, sizeof(*dts));
    double *t = calloc((size_t)(2 * it), sizeof(double));
    for (int i = 0; i < n; i++) {
        bufs[i] = calloc(s->count[i], sizeof(float));
        dts[i] = TUTTI_FP32;
    }
    /* alternating, the first of each pair by turns, so that drift favours neither */
    for (int k = 0; k < 2 * it; k++) {
        int coal = (k ^ (k >> 1)) & 1;
        tutti_barrier(comm);
        double t0 = now_s();
        if (coal)
            CHECK(tutti_broadcast_coalesced(comm, bufs, s->count, dts, n, 0, 0));
        else
            for (int i = 0; i < n; i++)
                CHECK(tutti_broadcast(comm, TUTTI_IN_PLACE, bufs[i], s->count[i], TUTTI_FP32, 0));
        t[coal * it + k / 2] = now_s() - t0;
    }
    double one = median_max(comm, t, it), co = median_max(comm, t + it, it);
    long long w = 0;
    for (int coal = 0; cfg->check && coal < 2; coal++) {
        /* the root's values (those of rank 0 in fill_value) everywhere after the call */
        for (int i = 0; i < n; i++)
            for (size_t e = 0; e < s->count[i]; e++)
                ((float *)bufs[i])[e] = rank == 0 ? fill_value(0, i, e) : -1.0f;
        if (coal)
            CHECK(tutti_broadcast_coalesced(comm, bufs, s->count, dts, n, 0, 0));
        else
            for (int i = 0; i < n; i++)
                CHECK(tutti_broadcast(comm, TUTTI_IN_PLACE, bufs[i], s->count[i], TUTTI_FP32, 0));
        for (int i = 0; i < n; i++)
            for (size_t e = 0; e < s->count[i]; e++)
                w += ((float *)bufs[i])[e] != fill_value(0, i, e);
    }
    w = wrong_total(comm, cfg, w);
    char wb[40];
    if (rank == 0) {
        printf("%-24s %2d ranks %3d tensors %8.2f MB  broadcast one by one %8.2f ms  "
               "coalesced %8.2f ms  speed-up %.2f%s\n",
               s->name, tutti_comm_size(comm), n, (double)s->total * 4 / 1e6, one * 1e3, co * 1e3,
               one / co, wrong_text(wb, sizeof(wb), w));
        fflush(stdout);
    }
    for (int i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(dts);
    free(t);
}

static int run_sets(tutti_comm_t *comm, const cfg_t *cfg)
{
    static tset_t resnet, state, small;
    make_resnet(&resnet, &state);
    make_small(&small);
    int all = !strcmp(cfg->set, "all");
    if (all || !strcmp(cfg->set, "small"))
        bench_set(comm, cfg, &small);
    if (all || !strcmp(cfg->set, "resnet"))
        bench_set(comm, cfg, &resnet);
    if ((all || !strcmp(cfg->set, "bcast")) && !cfg->overlap_only)
        bench_bcast(comm, cfg, &state);
    return wrong_seen ? 1 : 0;
}

/* A forked rank (-np): runs the sets and exits with their status. */
typedef struct local_rank {
    const cfg_t *cfg;
    const char *dir;
} local_rank_t;

static void local_rank(void *arg, int rank)
{
    const local_rank_t *a = arg;
    setenv("TUTTI_SOCKET_IFNAME", "lo", 0); /* local ranks talk over loopback */
    tutti_store_t *store;
    CHECK(tutti_store_open_file(&store, a->dir, 30000));
    tutti_comm_t *comm;
    CHECK(tutti_comm_init(&comm, store, rank, a->cfg->np, NULL));
    int rc = run_sets(comm, a->cfg);
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    fflush(stdout);
    fflush(stderr);
    _exit(rc);
}

static int usage(void)
{
    fprintf(stderr, "usage: fuse-bench [-np N] [-iters K] [-set resnet|small|bcast|all] "
                    "[-overlap-only] [-c] [-t SEC]\n");
    return 2;
}

int main(int argc, char **argv)
{
    cfg_t cfg = { .iters = 7, .set = "all", .timeout_s = 1800 };
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-np") && i + 1 < argc)
            cfg.np = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-iters") && i + 1 < argc)
            cfg.iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-set") && i + 1 < argc)
            cfg.set = argv[++i];
        else if (!strcmp(argv[i], "-t") && i + 1 < argc)
            cfg.timeout_s = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-overlap-only"))
            cfg.overlap_only = 1;
        else if (!strcmp(argv[i], "-c"))
            cfg.check = 1;
        else
            return usage();
    }
    if (strcmp(cfg.set, "all") && strcmp(cfg.set, "resnet") && strcmp(cfg.set, "small") &&
        strcmp(cfg.set, "bcast"))
        return usage();
    int from_env = !cfg.np && getenv("TUTTI_RANK");
    cfg.np = cfg.np ? cfg.np : 2;
    if (cfg.np < 1 || cfg.np > TT_LAUNCH_MAX_RANKS || cfg.iters < 1 || cfg.timeout_s < 1)
        return usage();
    if (from_env) { /* one rank of a job the environment describes */
        tutti_comm_t *comm;
        CHECK(tutti_comm_init_env(&comm, NULL));
        int rc = run_sets(comm, &cfg);
        tutti_comm_destroy(comm);
        return rc;
    }
    if (tt_launch_job_id("fuse-bench", cfg.np, NULL, 1, NULL) < 0)
        return 3;
    tt_launch_t l;
    if (tt_launch_start(&l, "fuse-bench", cfg.np, 1) < 0)
        return 3;
    local_rank_t arg = { .cfg = &cfg, .dir = l.dir };
    int rc = 0;
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < cfg.np; r++) {
        if (tt_launch_spawn(&l, r, local_rank, &arg) < 0) {
            rc = 3;
            tt_launch_stop(&l);
            break;
        }
    }
    int w = tt_launch_wait_all(&l, cfg.timeout_s, 1);
    if (rc == 0)
        rc = w;
    if (tt_launch_finish(&l) < 0 && rc == 0)
        rc = 3;
    return rc;
}
