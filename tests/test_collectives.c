/* Multi-rank correctness of allreduce, broadcast and barrier (the other collectives are
 * in collectives_others.c, the same suite): every algorithm, dtype, op, rank count 1..5,
 * awkward counts, in place and out of place, against a reference computed here in plain
 * C from every rank's input (regenerated locally, independent of the library's
 * kernels) and compared bit for bit. Also: async operations in flight together and
 * mixed with blocking ones, barrier semantics, and 8 ranks on a small machine.
 *
 * Inputs keep every result exact, so the comparison can be bitwise: floats carry small
 * integers for sums (|x| <= 8: exact in bf16 up to 32 ranks), {1, -1, 2, 0.5} for
 * products, quarters for min/max; integers carry arbitrary bits and wrap.
 *
 * TT_TEST_QUICK=1 shrinks the 1 Mi-element case (for sanitizer builds).
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <tutti/tutti.h>

#include "harness.h"

#include "collectives.h"
#include "ref.h"
#include "ref_fp8.h"

/* ---- one rank's matrix ---- */

typedef struct coll_ctx {
    int rank, nranks;
    tutti_comm_t *comm;
    const char *algo; /* what the comm was forced to, for messages */
    unsigned char *send, *recv;
    unsigned char *orig, *ref; /* an allreduce case's input and expected result */
    uint64_t cases;
    int failures;
    int comm_failed; /* a failed call fails the communicator: stop there */
} coll_ctx_t;

/* Most failures print one line; stop reporting after a few per run. */
#define MAX_REPORTS 6

static void report(coll_ctx_t *c, const char *what, tutti_dtype_t dt, const char *op, size_t count,
                   int root, size_t i, const void *got, const void *exp)
{
    c->failures++;
    if (c->failures > MAX_REPORTS)
        return;
    size_t es = tutti_dtype_size(dt);
    char rootstr[24] = "";
    if (root >= 0)
        snprintf(rootstr, sizeof(rootstr), " root %d", root);
    fprintf(stderr,
            "rank %d/%d [%s] %s %s %s count %zu%s: index %zu: got %.17g (0x%llx), "
            "expected %.17g (0x%llx)\n",
            c->rank, c->nranks, c->algo, what, tutti_dtype_name(dt), op, count, rootstr, i,
            elem_as_double(got, dt), (unsigned long long)elem_bits(got, es),
            elem_as_double(exp, dt), (unsigned long long)elem_bits(exp, es));
}

static int guard_intact(const unsigned char *p)
{
    for (size_t i = 0; i < GUARD_BYTES; i++)
        if (p[i] != GUARD_BYTE)
            return 0;
    return 1;
}

TH_DEFINE_STATUS_OK(coll_ctx_t)

/* mode 0: out of place; 1: TUTTI_IN_PLACE; 2: sendbuf == recvbuf */
static const char *const mode_names[] = { "out-of-place", "in-place", "same-buffer" };

/* Index of the first element where a and b differ, or count. */
static size_t first_diff(const unsigned char *a, const unsigned char *b, size_t count, size_t es)
{
    if (memcmp(a, b, count * es) == 0)
        return count;
    size_t i = 0;
    while (i < count && memcmp(a + i * es, b + i * es, es) == 0)
        i++;
    return i;
}

/* This rank's input (c->orig) and the expected result (c->ref) of one allreduce case,
 * shared by the modes run on it. */
static void prepare_allreduce(coll_ctx_t *c, tutti_dtype_t dt, tutti_redop_t op, size_t count,
                              uint64_t seed)
{
    const size_t es = tutti_dtype_size(dt);
    fill_input(c->orig, dt, op, c->rank, count, seed);
    for (size_t i = 0; i < count; i++)
        expected_elem(c->ref + i * es, dt, op, c->nranks, i, seed);
}

static int check_allreduce(coll_ctx_t *c, tutti_dtype_t dt, tutti_redop_t op, size_t count,
                           int mode)
{
    const size_t es = tutti_dtype_size(dt);
    unsigned char *in = mode ? c->recv : c->send;
    char what[64];
    snprintf(what, sizeof(what), "allreduce %s", mode_names[mode]);

    memcpy(in, c->orig, count * es);
    if (!mode)
        memset(c->recv, GARBAGE_BYTE, count * es);
    memset(c->recv + count * es, GUARD_BYTE, GUARD_BYTES);
    const void *sendbuf = mode == 0   ? (const void *)c->send
                          : mode == 1 ? TUTTI_IN_PLACE
                                      : (const void *)c->recv;
    int st = tutti_allreduce(c->comm, sendbuf, c->recv, count, dt, op);
    if (!status_ok(c, st, what))
        return 1;

    size_t i = first_diff(c->recv, c->ref, count, es);
    if (i < count) {
        report(c, what, dt, tutti_redop_name(op), count, -1, i, c->recv + i * es, c->ref + i * es);
        return 1;
    }
    if (!guard_intact(c->recv + count * es)) {
        fprintf(stderr, "rank %d/%d [%s] %s %s %s count %zu wrote past the end of recvbuf\n",
                c->rank, c->nranks, c->algo, what, tutti_dtype_name(dt), tutti_redop_name(op),
                count);
        c->failures++;
        return 1;
    }
    if (mode == 0 && (i = first_diff(c->send, c->orig, count, es)) < count) {
        fprintf(stderr,
                "rank %d/%d [%s] allreduce %s %s count %zu modified sendbuf at index "
                "%zu\n",
                c->rank, c->nranks, c->algo, tutti_dtype_name(dt), tutti_redop_name(op), count, i);
        c->failures++;
        return 1;
    }
    return 0;
}

static int check_broadcast(coll_ctx_t *c, tutti_dtype_t dt, size_t count, int root, int mode)
{
    const size_t es = tutti_dtype_size(dt);
    const uint64_t seed = mix64(++c->cases);
    const int is_root = c->rank == root;
    char what[64];
    snprintf(what, sizeof(what), "broadcast %s", mode_names[mode]);

    /* any bit pattern, NaNs included: a broadcast must move bytes untouched */
    if (is_root) {
        unsigned char *in = mode ? c->recv : c->send;
        for (size_t i = 0; i < count; i++) {
            uint64_t bits = gen_bits(seed, root, i);
            memcpy(in + i * es, &bits, es);
        }
    }
    if (!is_root || !mode)
        memset(c->recv, GARBAGE_BYTE, count * es);
    memset(c->recv + count * es, GUARD_BYTE, GUARD_BYTES);
    /* non-roots pass every kind of ignored sendbuf */
    const void *sendbuf = mode == 0   ? (is_root ? (const void *)c->send : NULL)
                          : mode == 1 ? TUTTI_IN_PLACE
                                      : (const void *)(is_root ? c->recv : c->send);
    int st = tutti_broadcast(c->comm, sendbuf, c->recv, count, dt, root);
    if (!status_ok(c, st, what))
        return 1;

    for (size_t i = 0; i < count; i++) {
        uint64_t exp = gen_bits(seed, root, i);
        if (memcmp(c->recv + i * es, &exp, es) != 0) {
            report(c, what, dt, "", count, root, i, c->recv + i * es, &exp);
            return 1;
        }
        if (is_root && mode == 0 && memcmp(c->send + i * es, &exp, es) != 0) {
            fprintf(stderr, "rank %d/%d [%s] broadcast root modified sendbuf at %zu\n", c->rank,
                    c->nranks, c->algo, i);
            c->failures++;
            return 1;
        }
    }
    if (!guard_intact(c->recv + count * es)) {
        fprintf(stderr, "rank %d/%d [%s] %s %s count %zu root %d wrote past the end\n", c->rank,
                c->nranks, c->algo, what, tutti_dtype_name(dt), count, root);
        c->failures++;
        return 1;
    }
    return 0;
}

/* With inexact float inputs the result depends on the order of the reduction; every
 * rank must still end with the same bits. Rank 0's result is broadcast and compared. */
static int check_identical(coll_ctx_t *c, tutti_dtype_t dt, tutti_redop_t op, size_t count)
{
    const size_t es = tutti_dtype_size(dt);
    const uint64_t seed = mix64(++c->cases);
    for (size_t i = 0; i < count; i++) {
        double u = (double)(gen_bits(seed, c->rank, i) >> 11) * 0x1p-53; /* [0, 1) */
        put_elem(c->recv, dt, i, 0, op == TUTTI_PROD ? 0.5 + 1.5 * u : 2 * u - 1);
    }
    int st = tutti_allreduce(c->comm, TUTTI_IN_PLACE, c->recv, count, dt, op);
    if (!status_ok(c, st, "allreduce (inexact inputs)"))
        return 1;
    memset(c->send, GARBAGE_BYTE, count * es);
    st = tutti_broadcast(c->comm, c->rank == 0 ? c->recv : NULL, c->send, count, dt, 0);
    if (!status_ok(c, st, "broadcast of rank 0's allreduce result"))
        return 1;
    size_t i = first_diff(c->recv, c->send, count, es);
    if (i < count) {
        fprintf(stderr,
                "rank %d/%d [%s] allreduce %s %s count %zu: index %zu differs from "
                "rank 0: %.17g here, %.17g there\n",
                c->rank, c->nranks, c->algo, tutti_dtype_name(dt), tutti_redop_name(op), count, i,
                elem_as_double(c->recv + i * es, dt), elem_as_double(c->send + i * es, dt));
        c->failures++;
        return 1;
    }
    return 0;
}

/* Shared between the ranks of one run (MAP_SHARED before the fork). */
typedef struct shared {
    unsigned long arrivals;
} shared_t;

static shared_t *shared_area(void)
{
    static shared_t *sh;
    if (!sh)
        sh = th_shared_zeroed(sizeof(*sh));
    memset(sh, 0, sizeof(*sh)); /* each run starts from zero */
    return sh;
}

static void sleep_us(long us)
{
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    nanosleep(&ts, NULL);
}

/* Round k: arrive (count up), barrier, then every rank must have arrived k+1 times and
 * none can have arrived a (k+3)rd time. Ranks arrive late by turns, so a barrier that
 * does not wait shows up as a short count. */
static int barrier_rounds(int rank, int nranks, tutti_comm_t *comm, shared_t *sh, int rounds)
{
    for (int k = 0; k < rounds; k++) {
        if ((k + rank) % nranks == 0)
            sleep_us(3000);
        __atomic_fetch_add(&sh->arrivals, 1, __ATOMIC_SEQ_CST);
        int st = tutti_barrier(comm);
        FAIL_IF(st != TUTTI_OK, "barrier %d: %s: %s", k, tutti_status_name(st),
                tutti_comm_last_error(comm));
        unsigned long seen = __atomic_load_n(&sh->arrivals, __ATOMIC_SEQ_CST);
        FAIL_IF(seen < (unsigned long)(k + 1) * (unsigned long)nranks ||
                    seen > (unsigned long)(k + 2) * (unsigned long)nranks,
                "after barrier %d of %d ranks, %lu arrivals", k, nranks, seen);
    }
    return 0;
}

typedef struct matrix_arg {
    const char *allreduce, *broadcast, *barrier; /* the algorithms the comm is forced to */
    const char *label;
    int allreduce_only; /* the broadcast cases ran under another configuration */
    int small_chunks;   /* forced to 4099-byte chunks */
    shared_t *sh;
} matrix_arg_t;

/* The big count: 1 Mi + 3 elements (8 MiB of f64: past the default 1 MiB chunk and the
 * shm ring's 1 MiB); under 4099-byte chunks a quarter of that, still 512 chunks of f64
 * (2048 made those configurations most of the suite's time, nothing new after the first
 * few hundred); quick: 64 Ki + 3 elements. */
static size_t big_count(int small_chunks)
{
    return th_quick() ? (64u << 10) + 3 : small_chunks ? (256u << 10) + 3 : (1u << 20) + 3;
}

static int rank_matrix(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    const matrix_arg_t *a = arg;
    const size_t big = big_count(a->small_chunks);
    const size_t small_counts[] = { 0, 1, 7, 4097 };

    /* the override must reach the selection, or this tests some other algorithm */
    static const size_t probe_bytes[] = { 1, 4096, 64 << 20 };
    for (size_t i = 0; i < ARRAY_SIZE(probe_bytes); i++) {
        const char *ar = tutti_comm_algo_for(comm, "allreduce", probe_bytes[i]);
        const char *bc = tutti_comm_algo_for(comm, "broadcast", probe_bytes[i]);
        FAIL_IF(!ar || strcmp(ar, a->allreduce) != 0, "allreduce of %zu bytes picks %s, not %s",
                probe_bytes[i], ar ? ar : "NULL", a->allreduce);
        FAIL_IF(!bc || strcmp(bc, a->broadcast) != 0, "broadcast of %zu bytes picks %s, not %s",
                probe_bytes[i], bc ? bc : "NULL", a->broadcast);
    }
    const char *br = nranks > 1 ? tutti_comm_algo_for(comm, "barrier", 0) : a->barrier;
    FAIL_IF(!br || strcmp(br, a->barrier) != 0, "barrier picks %s, not %s", br ? br : "NULL",
            a->barrier);

    coll_ctx_t c = { .rank = rank, .nranks = nranks, .comm = comm, .algo = a->label };
    c.send = malloc(big * 8 + GUARD_BYTES);
    c.recv = malloc(big * 8 + GUARD_BYTES);
    c.orig = malloc(big * 8);
    c.ref = malloc(big * 8);
    FAIL_IF(!c.send || !c.recv || !c.orig || !c.ref, "out of memory");

    const tutti_redop_t big_ops[] = { TUTTI_SUM, TUTTI_AVG };
    for (size_t d = 0; d < ARRAY_SIZE(all_dtypes) && !c.comm_failed; d++) {
        tutti_dtype_t dt = all_dtypes[d];
        for (size_t o = 0; o < ARRAY_SIZE(all_ops); o++)
            for (size_t k = 0; k < ARRAY_SIZE(small_counts); k++) {
                prepare_allreduce(&c, dt, all_ops[o], small_counts[k], mix64(++c.cases));
                for (int mode = 0; mode < 3 && !c.comm_failed; mode++)
                    check_allreduce(&c, dt, all_ops[o], small_counts[k], mode);
            }
        /* the bitwise ops, integer dtypes only; one mode each, taking turns (quick: at
         * 4097 elements only; their kernels are test_reduce's, the paths every op's) */
        for (size_t o = 0; o < ARRAY_SIZE(bit_ops) && !is_float(dt) && !c.comm_failed; o++)
            for (size_t k = th_quick() ? 3 : 1; k < ARRAY_SIZE(small_counts) && !c.comm_failed;
                 k++) {
                prepare_allreduce(&c, dt, bit_ops[o], small_counts[k], mix64(++c.cases));
                check_allreduce(&c, dt, bit_ops[o], small_counts[k], (int)((o + k + d) % 3));
            }
        /* the big count: every dtype, but only two ops (sum, and avg's final division) */
        for (int o = 0; o < 2 && !c.comm_failed; o++) {
            prepare_allreduce(&c, dt, big_ops[o], big, mix64(++c.cases));
            for (int mode = 0; mode < 2 && !c.comm_failed; mode++)
                check_allreduce(&c, dt, big_ops[o], big, mode);
        }

        if (is_float(dt)) {
            const tutti_redop_t inexact_ops[] = { TUTTI_SUM, TUTTI_PROD, TUTTI_AVG };
            for (int o = 0; o < 3 && !c.comm_failed; o++)
                for (size_t k = 2; k < ARRAY_SIZE(small_counts) && !c.comm_failed; k++)
                    check_identical(&c, dt, inexact_ops[o], small_counts[k]);
        }

        for (int root = 0; root < nranks && !c.comm_failed && !a->allreduce_only; root++) {
            for (size_t k = 0; k < ARRAY_SIZE(small_counts); k++)
                for (int mode = 0; mode < 3 && !c.comm_failed; mode++)
                    check_broadcast(&c, dt, small_counts[k], root, mode);
            if (!c.comm_failed)
                check_broadcast(&c, dt, big, root, (int)(d + (size_t)root) % 3);
        }
    }
    /* the later integer dtypes: every op, at 7 and 4097 elements, one mode each in turn
     * (quick: half the ops of each, at 4097) */
    for (size_t d = 0; d < ARRAY_SIZE(more_dtypes) && !c.comm_failed; d++)
        for (size_t o = 0; o < ARRAY_SIZE(int_ops) && !c.comm_failed; o++)
            for (size_t k = th_quick() ? 3 : 2;
                 k < ARRAY_SIZE(small_counts) && !c.comm_failed && !(th_quick() && (o + d) % 2);
                 k++) {
                const tutti_dtype_t dt = more_dtypes[d];
                const tutti_redop_t op = int_ops[o];
                prepare_allreduce(&c, dt, op, small_counts[k], mix64(++c.cases));
                check_allreduce(&c, dt, op, small_counts[k], (int)((d + o + k) % 3));
            }
    free(c.send);
    free(c.recv);
    free(c.orig);
    free(c.ref);
    coll_more_failures(rank, nranks, a->label, c.failures, MAX_REPORTS);
    if (c.failures)
        return 1;
    return barrier_rounds(rank, nranks, comm, a->sh, 12);
}

/* The configurations the matrix runs under, each on 1..5 ranks. hd and dbtree run the
 * allreduce cases only (their broadcasts are the ones above). */
enum { MATRIX_CONFIGS = 5 };

static void run_matrix(int nranks, int config)
{
    tutti_comm_opts_t opts;
    ck_assert_int_eq(tutti_comm_opts_init(&opts), TUTTI_OK);
    /* ring and dbtree get a chunk size that is not a multiple of any element size above 1
     * (each rounds it down its own way), and small enough that the 4097 count of the
     * wider types spans several chunks per block (for dbtree: so that chunks go up and
     * down the trees at the same time) */
    static const struct {
        const char *algo, *allreduce, *broadcast, *barrier, *label;
        size_t chunk_bytes;
        int allreduce_only;
    } configs[] = {
        { "allreduce:rd;broadcast:tree;barrier:tree", "rd", "tree", "tree", "rd/tree", 0, 0 },
        { "allreduce:ring;broadcast:chain;barrier:dissemination", "ring", "chain", "dissemination",
          "ring/chain", 4099, 0 },
        { "allreduce:hd;broadcast:tree;barrier:linear", "hd", "tree", "linear", "hd", 0, 1 },
        { "allreduce:dbtree;broadcast:chain;barrier:tree", "dbtree", "chain", "tree", "dbtree",
          4099, 1 },
        { "allreduce:linear;broadcast:linear;barrier:linear", "linear", "linear", "linear",
          "linear", 0, 0 },
    };
    _Static_assert(sizeof(configs) / sizeof(configs[0]) == MATRIX_CONFIGS, "configs");
    const int k = config;
    opts.algo = configs[k].algo;
    if (configs[k].chunk_bytes)
        opts.chunk_bytes = configs[k].chunk_bytes;
    matrix_arg_t arg = { .allreduce = configs[k].allreduce,
                         .broadcast = configs[k].broadcast,
                         .barrier = configs[k].barrier,
                         .label = configs[k].label,
                         .allreduce_only = configs[k].allreduce_only,
                         .small_chunks = configs[k].chunk_bytes != 0,
                         .sh = shared_area() };
    coll_run_matrix(nranks, rank_matrix, &arg, &opts, arg.label);
}

START_TEST(matrix)
{
    /* _i: rank counts 1..5, each under every configuration */
    run_matrix(_i / MATRIX_CONFIGS + 1, _i % MATRIX_CONFIGS);
}
END_TEST

/* ---- hier: ranks on hosts of their own (TUTTI_HOST_ID per rank: shm within a host,
 * tcp across), even and uneven ---- */

static const char *const hier_maps[] = {
    "aabb",      /* 2 hosts of 2 */
    "abab",      /* the same, hosts interleaved in rank order */
    "aaabbb",    /* 2 hosts of 3 */
    "aabbcc",    /* 3 hosts of 2 */
    "aaabbc",    /* uneven: 3, 2 and 1 (one shard) */
    "aaabb",     /* uneven: 3 and 2 (two shards, one rank without) */
    "aabbb/tcp", /* tcp alone, within hosts too: the host map all the same */
};

/* Rank r's element i in the pipeline check: small enough that the sum over 6 ranks
 * cannot overflow */
static int32_t hier_elem(size_t i, int r)
{
    return (int32_t)((mix64(i * 8 + (uint64_t)r) & 0xffff) - 0x8000);
}

/* hier pipelines vectors of two 4 MiB segments and more (TT_HIER_SEG_BYTES): 20 MiB and
 * 20 bytes of int32 make five segments, the last one shorter, with up to 2 (hosts - 1) + 1
 * of them on their way across hosts at once; out of place, then in place, against the
 * sum worked here */
static int check_hier_pipeline(int rank, int nranks, tutti_comm_t *comm)
{
    const size_t count = (5u << 20) + 5;
    int32_t *send = malloc(count * sizeof(int32_t)), *recv = malloc(count * sizeof(int32_t));
    int bad = 0;
    if (!send || !recv) {
        fprintf(stderr, "rank %d: hier pipeline: out of memory\n", rank);
        bad = 1;
    }
    for (size_t i = 0; !bad && i < count; i++)
        send[i] = hier_elem(i, rank);
    for (int mode = 0; mode < 2 && !bad; mode++) {
        memset(recv, 0x5a, count * sizeof(int32_t));
        if (mode)
            memcpy(recv, send, count * sizeof(int32_t));
        int st = tutti_allreduce(comm, mode ? TUTTI_IN_PLACE : send, recv, count, TUTTI_INT32,
                                 TUTTI_SUM);
        if (st != 0) {
            fprintf(stderr, "rank %d: hier pipeline (%s): %s\n", rank,
                    mode ? "in place" : "out of place", tutti_status_name(st));
            bad = 1;
            break;
        }
        size_t wrong = 0, first = 0;
        for (size_t i = 0; i < count; i++) {
            int32_t want = 0;
            for (int r = 0; r < nranks; r++)
                want += hier_elem(i, r);
            if (recv[i] != want && wrong++ == 0)
                first = i;
        }
        if (wrong) {
            fprintf(stderr, "rank %d: hier pipeline (%s): %zu of %zu elements wrong, first %zu\n",
                    rank, mode ? "in place" : "out of place", wrong, count, first);
            bad = 1;
        }
    }
    free(send);
    free(recv);
    return bad;
}

static int rank_hier(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const char *map = ((const matrix_arg_t *)arg)->label + strlen("hier ");
    tutti_store_t *store;
    tutti_comm_t *comm;
    /* the tree over shm and tcp; several chunks per block, an odd size */
    int rc = coll_host_comm(rank, nranks, dir, map, "allreduce:hier;broadcast:tree;barrier:tree",
                            4099, &store, &comm);
    if (rc == 0)
        rc = rank_matrix(rank, nranks, comm, dir, arg);
    if (rc == 0)
        rc = check_hier_pipeline(rank, nranks, comm);
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return rc;
}

START_TEST(hier_hosts)
{
    char label[32];
    snprintf(label, sizeof(label), "hier %s", hier_maps[_i]);
    matrix_arg_t arg = { .allreduce = "hier",
                         .broadcast = "tree",
                         .barrier = "tree",
                         .label = label,
                         .allreduce_only = 1,
                         .small_chunks = 1, /* rank_hier's 4099 */
                         .sh = shared_area() };
    coll_run_hosts(hier_maps[_i], rank_hier, &arg, label);
}
END_TEST

/* ---- async ---- */

enum { N_ASYNC = 8 };

typedef struct async_case {
    tutti_dtype_t dt;
    tutti_redop_t op;
    size_t count;
    int mode;
    uint64_t seed;
    unsigned char *send, *recv;
    tutti_work_t *w;
} async_case_t;

static int async_setup(int rank, async_case_t *ac)
{
    size_t es = tutti_dtype_size(ac->dt);
    ac->send = malloc(ac->count * es + 1);
    ac->recv = malloc(ac->count * es + 1);
    FAIL_IF(!ac->send || !ac->recv, "out of memory");
    fill_input(ac->mode ? ac->recv : ac->send, ac->dt, ac->op, rank, ac->count, ac->seed);
    if (!ac->mode)
        memset(ac->recv, GARBAGE_BYTE, ac->count * es);
    return 0;
}

static const void *async_sendbuf(const async_case_t *ac)
{
    return ac->mode ? TUTTI_IN_PLACE : ac->send;
}

static int async_verify(int rank, int nranks, async_case_t *ac, const char *what)
{
    size_t es = tutti_dtype_size(ac->dt);
    for (size_t i = 0; i < ac->count; i++) {
        uint64_t exp;
        expected_elem(&exp, ac->dt, ac->op, nranks, i, ac->seed);
        FAIL_IF(memcmp(ac->recv + i * es, &exp, es) != 0,
                "%s: %s %s count %zu: index %zu: got %.17g, expected %.17g", what,
                tutti_dtype_name(ac->dt), tutti_redop_name(ac->op), ac->count, i,
                elem_as_double(ac->recv + i * es, ac->dt), elem_as_double(&exp, ac->dt));
    }
    free(ac->send);
    free(ac->recv);
    ac->send = ac->recv = NULL;
    return 0;
}

static int rank_async_inflight(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    /* sizes on both sides of the rd/ring switch, so both run interleaved */
    static const size_t counts[N_ASYNC] = { 1, 33, 4097, 70000, 250000, 3, 1000, 20000 };
    async_case_t ac[N_ASYNC];
    for (int i = 0; i < N_ASYNC; i++) {
        ac[i] = (async_case_t){
            .dt = all_dtypes[i % 8],
            .op = all_ops[i % 5],
            .count = counts[i],
            .mode = i % 2,
            .seed = mix64(1000 + (uint64_t)i),
        };
        if (async_setup(rank, &ac[i]))
            return 1;
    }
    for (int i = 0; i < N_ASYNC; i++) {
        int st = tutti_allreduce_async(comm, async_sendbuf(&ac[i]), ac[i].recv, ac[i].count,
                                       ac[i].dt, ac[i].op, &ac[i].w);
        FAIL_IF(st != TUTTI_OK, "allreduce_async %d: %s", i, tutti_comm_last_error(comm));
    }

    /* completion in issue order: no handle may report done before an earlier one */
    int done_seen[N_ASYNC] = { 0 }, ndone = 0;
    double deadline = th_now_ms() + 30000;
    while (ndone < N_ASYNC) {
        for (int j = N_ASYNC - 1; j >= 0; j--) {
            if (done_seen[j])
                continue;
            int done = -1;
            int st = tutti_test(ac[j].w, &done);
            if (!done) {
                FAIL_IF(st != TUTTI_OK, "tutti_test(%d) not done but returned %d", j, st);
                continue;
            }
            FAIL_IF(done != 1, "tutti_test(%d) set done to %d", j, done);
            FAIL_IF(st != TUTTI_OK, "async %d failed: %s", j, tutti_work_error(ac[j].w));
            for (int i = 0; i < j; i++) {
                int di = 0;
                tutti_test(ac[i].w, &di);
                FAIL_IF(!di, "async %d reports done before async %d", j, i);
            }
            done_seen[j] = 1;
            ndone++;
        }
        FAIL_IF(th_now_ms() > deadline, "only %d of %d async allreduces done after 30 s", ndone,
                N_ASYNC);
    }
    for (int i = 0; i < N_ASYNC; i++) {
        int st = tutti_wait(ac[i].w, -1);
        FAIL_IF(st != TUTTI_OK, "wait %d: %s", i, tutti_work_error(ac[i].w));
        FAIL_IF(tutti_work_error(ac[i].w)[0], "async %d succeeded with error text \"%s\"", i,
                tutti_work_error(ac[i].w));
        tutti_work_free(ac[i].w);
        char what[32];
        snprintf(what, sizeof(what), "async %d", i);
        if (async_verify(rank, nranks, &ac[i], what))
            return 1;
    }
    return 0;
}

TH_RUN_TEST(async_inflight, th_run(_i, rank_async_inflight, NULL, 60000))

static int rank_async_mixed(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    async_case_t a = { TUTTI_FP32, TUTTI_SUM, 100000, 0, mix64(77), NULL, NULL, NULL };
    async_case_t d = { TUTTI_INT64, TUTTI_MAX, 77, 1, mix64(78), NULL, NULL, NULL };
    async_case_t e = { TUTTI_BF16, TUTTI_AVG, 4097, 0, mix64(79), NULL, NULL, NULL };
    if (async_setup(rank, &a) || async_setup(rank, &d) || async_setup(rank, &e))
        return 1;
    const int root = nranks - 1;
    const size_t bcount = 5000;
    int32_t *b = malloc(bcount * sizeof(*b));
    FAIL_IF(!b, "out of memory");
    for (size_t i = 0; i < bcount; i++)
        b[i] = rank == root ? (int32_t)(i * 7 + 3) : -1;
    tutti_work_t *barrier_w = NULL;
    int st;

    st = tutti_allreduce_async(comm, async_sendbuf(&a), a.recv, a.count, a.dt, a.op, &a.w);
    FAIL_IF(st != TUTTI_OK, "allreduce_async A: %s", tutti_comm_last_error(comm));
    st = tutti_broadcast(comm, TUTTI_IN_PLACE, b, bcount, TUTTI_INT32, root);
    FAIL_IF(st != TUTTI_OK, "broadcast B: %s", tutti_comm_last_error(comm));
    st = tutti_barrier_async(comm, &barrier_w);
    FAIL_IF(st != TUTTI_OK, "barrier_async C: %s", tutti_comm_last_error(comm));
    st = tutti_allreduce_async(comm, async_sendbuf(&d), d.recv, d.count, d.dt, d.op, &d.w);
    FAIL_IF(st != TUTTI_OK, "allreduce_async D: %s", tutti_comm_last_error(comm));
    st = tutti_allreduce(comm, async_sendbuf(&e), e.recv, e.count, e.dt, e.op);
    FAIL_IF(st != TUTTI_OK, "allreduce E: %s", tutti_comm_last_error(comm));

    /* E ran after A, C and D: they are done by now */
    tutti_work_t *earlier[3] = { a.w, barrier_w, d.w };
    for (int i = 0; i < 3; i++) {
        int done = 0;
        st = tutti_test(earlier[i], &done);
        FAIL_IF(!done, "async op %d of A, C, D not done after the blocking E returned", i);
        FAIL_IF(st != TUTTI_OK, "async op %d of A, C, D failed: %s", i,
                tutti_work_error(earlier[i]));
    }
    for (size_t i = 0; i < bcount; i++)
        FAIL_IF(b[i] != (int32_t)(i * 7 + 3), "broadcast B: index %zu: %d", i, (int)b[i]);
    FAIL_IF(tutti_wait(a.w, -1) != TUTTI_OK, "wait A");
    FAIL_IF(tutti_wait(barrier_w, 0) != TUTTI_OK, "wait C");
    FAIL_IF(tutti_wait(d.w, 1000) != TUTTI_OK, "wait D");
    tutti_work_free(a.w);
    tutti_work_free(barrier_w);
    tutti_work_free(d.w);
    free(b);
    if (async_verify(rank, nranks, &a, "A") || async_verify(rank, nranks, &d, "D") ||
        async_verify(rank, nranks, &e, "E"))
        return 1;

    /* a handle freed while its op still runs must not disturb the next ones */
    async_case_t f = { TUTTI_INT8, TUTTI_PROD, 300000, 1, mix64(80), NULL, NULL, NULL };
    if (async_setup(rank, &f))
        return 1;
    st = tutti_allreduce_async(comm, async_sendbuf(&f), f.recv, f.count, f.dt, f.op, &f.w);
    FAIL_IF(st != TUTTI_OK, "allreduce_async F: %s", tutti_comm_last_error(comm));
    tutti_work_free(f.w);
    st = tutti_barrier(comm);
    FAIL_IF(st != TUTTI_OK, "barrier after F: %s", tutti_comm_last_error(comm));
    return async_verify(rank, nranks, &f, "F (handle freed early)");
}

TH_RUN_TEST(async_mixed, th_run(3, rank_async_mixed, NULL, 60000))

/* ---- 8 ranks on a small machine ---- */

static int rank_eight(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    shared_t *sh = arg;
    int32_t buf[16];
    for (int it = 0; it < 30; it++) {
        for (int i = 0; i < 16; i++)
            buf[i] = rank * 100 + i + it;
        int st = tutti_allreduce(comm, TUTTI_IN_PLACE, buf, 16, TUTTI_INT32, TUTTI_SUM);
        FAIL_IF(st != TUTTI_OK, "allreduce %d: %s", it, tutti_comm_last_error(comm));
        for (int i = 0; i < 16; i++) {
            int32_t exp = 100 * nranks * (nranks - 1) / 2 + nranks * (i + it);
            FAIL_IF(buf[i] != exp, "iteration %d index %d: got %d, expected %d", it, i, (int)buf[i],
                    (int)exp);
        }
        st = tutti_barrier(comm);
        FAIL_IF(st != TUTTI_OK, "barrier %d: %s", it, tutti_comm_last_error(comm));
    }
    return barrier_rounds(rank, nranks, comm, sh, 8);
}

START_TEST(eight_ranks)
{
    double t0 = th_now_ms();
    /* the timeout is the check: 8 ranks must not starve each other on 2 cores */
    ck_assert_int_eq(th_run(8, rank_eight, shared_area(), 30000), 0);
    fprintf(stderr, "8 ranks: %.0f ms\n", th_now_ms() - t0);
}
END_TEST

/* ---- NaN and infinities through MIN/MAX, every allreduce algorithm ---- */

static const char *const nan_algos[] = { "ring", "rd", "hd", "dbtree", "hier", "linear" };

/* A communicator over the file store in dir running algo, in chunks of 4 KiB (several
 * even for small vectors); 0, or -1 having said why. */
static int algo_comm(int rank, int nranks, const char *dir, const char *algo, tutti_store_t **store,
                     tutti_comm_t **comm)
{
    if (tutti_store_open_file(store, dir, 20000) != 0) {
        fprintf(stderr, "rank %d: store: %s\n", rank, tutti_store_last_error(NULL));
        return -1;
    }
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.algo = algo;
    o.chunk_bytes = 4096;
    *comm = NULL;
    if (tutti_comm_init(comm, *store, rank, nranks, &o) != 0) {
        fprintf(stderr, "rank %d: init: %s\n", rank, tutti_comm_last_error(NULL));
        tutti_store_close(*store);
        return -1;
    }
    return 0;
}

static int rank_nan_minmax(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const char *algo = arg;
    tutti_store_t *store;
    tutti_comm_t *comm;
    FAIL_IF(algo_comm(rank, nranks, dir, algo, &store, &comm) != 0, "init");
    /* element 0: NaN on the last rank only; 1: +inf on rank 0, finite elsewhere;
     * 2: -inf on rank 1; 3: NaN on rank 0 and +inf on rank 1; the rest finite */
    const size_t n = 5000;
    for (int opi = 0; opi < 2; opi++) {
        tutti_redop_t op = opi ? TUTTI_MAX : TUTTI_MIN;
        for (int dt = 0; dt < 2; dt++) {
            float f[5000];
            double d[5000];
            for (size_t i = 0; i < n; i++) {
                double v = (double)((rank * 7919 + (int)i * 104729) % 1000) - 500;
                if (i == 0 && rank == nranks - 1)
                    v = NAN;
                if (i == 1 && rank == 0)
                    v = INFINITY;
                if (i == 2 && rank == 1)
                    v = -INFINITY;
                if (i == 3)
                    v = rank == 0 ? NAN : rank == 1 ? INFINITY : 1.0;
                f[i] = (float)v;
                d[i] = v;
            }
            int st = dt ? tutti_allreduce(comm, TUTTI_IN_PLACE, d, n, TUTTI_FP64, op)
                        : tutti_allreduce(comm, TUTTI_IN_PLACE, f, n, TUTTI_FP32, op);
            FAIL_IF(st != 0, "%s: %s", algo, tutti_comm_last_error(comm));
            for (size_t i = 0; i < n; i++) {
                double got = dt ? d[i] : (double)f[i];
                double want;
                if (i == 0 || i == 3) {
                    want = NAN;
                } else if (i == 1 && op == TUTTI_MAX) {
                    want = INFINITY;
                } else if (i == 2 && op == TUTTI_MIN) {
                    want = -INFINITY;
                } else { /* the plain-C extreme over the ranks' finite values */
                    want = op == TUTTI_MAX ? -INFINITY : INFINITY;
                    for (int r = 0; r < nranks; r++) {
                        double v = (double)((r * 7919 + (int)i * 104729) % 1000) - 500;
                        if ((i == 1 && r == 0) || (i == 2 && r == 1))
                            continue;
                        want = op == TUTTI_MAX ? (v > want ? v : want) : (v < want ? v : want);
                    }
                }
                int ok = isnan(want) ? isnan(got) : got == want;
                FAIL_IF(!ok, "%s %s %s [%zu]: got %g, expected %g", algo, dt ? "f64" : "f32",
                        opi ? "max" : "min", i, got, want);
            }
        }
    }
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

/* fn at 4 ranks, then at 3, its arg the algorithm (fn opens its communicator with
 * algo_comm) */
static int run_algo_4_3(th_rank_fn fn, const char *algo)
{
    th_spec_t spec = {
        .nranks = 4, .fn = fn, .arg = (void *)algo, .timeout_ms = 60000, .flags = TH_NO_COMM
    };
    int rc = th_run_ex(&spec, NULL);
    spec.nranks = 3;
    return rc ? rc : th_run_ex(&spec, NULL);
}

TH_RUN_TEST(nan_minmax, run_algo_4_3(rank_nan_minmax, nan_algos[_i]))

/* fp16 AVG whose sum overflows fp16 but whose mean fits: every rank's 30016..30208 gave
 * inf (session 97) as the sum went first. Inputs multiples of 64, so the scaled partial
 * sums are exact in any order; the reference is the plain-C mean rounded as the library
 * rounds it (the exact sum / nranks in fp32, then to fp16). allreduce in and out of place,
 * reduce at rank 1, reduce_scatter. */
static int rank_avg_f16(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const char *algo = arg;
    tutti_store_t *store;
    tutti_comm_t *comm;
    FAIL_IF(algo_comm(rank, nranks, dir, algo, &store, &comm) != 0, "init");
    enum { N = 3000 };
    static uint16_t in[N], out[N], want[N];
    for (size_t i = 0; i < N; i++) {
        in[i] = ref_float_to_half((float)(30016 + 64 * (int)((rank * 3 + i) % 4)));
        double sum = 0;
        for (int r = 0; r < nranks; r++)
            sum += 30016 + 64 * (int)((r * 3 + i) % 4);
        want[i] = ref_float_to_half((float)sum / (float)nranks);
    }
    for (int how = 0; how < 4; how++) {
        static const char *const name[] = { "allreduce in place", "allreduce", "reduce",
                                            "reduce_scatter" };
        size_t n = how == 3 ? N / (size_t)nranks * (size_t)nranks : N, first = 0, len = n;
        memcpy(out, in, sizeof(out));
        int st;
        if (how == 0)
            st = tutti_allreduce(comm, TUTTI_IN_PLACE, out, n, TUTTI_FP16, TUTTI_AVG);
        else if (how == 1)
            st = tutti_allreduce(comm, in, out, n, TUTTI_FP16, TUTTI_AVG);
        else if (how == 2)
            st = tutti_reduce(comm, in, rank == 1 ? out : NULL, n, TUTTI_FP16, TUTTI_AVG, 1);
        else
            st = tutti_reduce_scatter(comm, in, out, n / (size_t)nranks, TUTTI_FP16, TUTTI_AVG);
        FAIL_IF(st != 0, "%s %s: %s", algo, name[how], tutti_comm_last_error(comm));
        if (how == 2 && rank != 1)
            continue;
        if (how == 3) {
            len = n / (size_t)nranks;
            first = (size_t)rank * len;
        }
        for (size_t i = 0; i < len; i++)
            FAIL_IF(out[i] != want[first + i], "%s %s, %d ranks [%zu]: got %g, expected %g", algo,
                    name[how], nranks, first + i, (double)ref_half_to_float(out[i]),
                    (double)ref_half_to_float(want[first + i]));
    }
    /* scan and exscan: the mean of the prefix (exscan in place: rank 0's buffer as it
     * was); overflowed to inf on the last ranks until session 100 */
    for (int ex = 0; ex < 2; ex++) {
        for (int inplace = 0; inplace < 2; inplace++) {
            memcpy(out, in, sizeof(out));
            int st = ex ? tutti_exscan(comm, inplace ? TUTTI_IN_PLACE : in, out, N, TUTTI_FP16,
                                       TUTTI_AVG)
                        : tutti_scan(comm, inplace ? TUTTI_IN_PLACE : out, out, N, TUTTI_FP16,
                                     TUTTI_AVG);
            FAIL_IF(st != 0, "%s %s%s: %s", algo, ex ? "exscan" : "scan",
                    inplace ? " in place" : "", tutti_comm_last_error(comm));
            int k = rank + !ex; /* ranks in the prefix */
            for (size_t i = 0; i < N; i++) {
                double sum = 0;
                for (int r = 0; r < k; r++)
                    sum += 30016 + 64 * (int)((r * 3 + i) % 4);
                uint16_t w = k ? ref_float_to_half((float)sum / (float)k) : in[i];
                FAIL_IF(out[i] != w, "%s %s%s, %d ranks, rank %d [%zu]: got %g, expected %g", algo,
                        ex ? "exscan" : "scan", inplace ? " in place" : "", nranks, rank, i,
                        (double)ref_half_to_float(out[i]), (double)ref_half_to_float(w));
            }
        }
    }
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

TH_RUN_TEST(avg_f16_range, run_algo_4_3(rank_avg_f16, nan_algos[_i]))

/* fp8 (E4M3, E5M2) through every allreduce algorithm at 4 and 3 ranks, against the
 * formats' definitions (ref_fp8.h):
 * - SUM of small integers (exact in any grouping: sums up to 12 in E4M3, 8 in E5M2), of
 *   the largest value on every rank (saturates at each step: the largest), of a NaN on
 *   one rank (NaN), of an E5M2 infinity and ones (the largest: saturated, as NCCL's);
 * - MAX and MIN of any codes but -0 (NaN on any rank: NaN; an E5M2 infinity stays one);
 * - AVG whose sum is far past the largest value but whose mean fits: a = 256 or 2^15 on
 *   every rank, b = 1.5 a on none or two (the inputs scaled by 1/4 first sum exactly in
 *   any grouping), in and out of place, reduce at rank 1, reduce_scatter, scan and
 *   exscan; the exact mean rounded once; and the small values AVG's scaling loses. */
static uint8_t fp8_code(tutti_dtype_t dt, double x)
{
    return ref_d_to_fp8(dt, x);
}

static int fp8_same(tutti_dtype_t dt, uint8_t got, uint8_t want)
{
    return isnan(ref_fp8_to_d(dt, want)) ? isnan(ref_fp8_to_d(dt, got)) : got == want;
}

static int rank_fp8(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const char *algo = arg;
    tutti_store_t *store;
    tutti_comm_t *comm;
    FAIL_IF(algo_comm(rank, nranks, dir, algo, &store, &comm) != 0, "init");
    enum { N = 5000 }; /* several 4 KiB chunks */
    static uint8_t in[N], out[N], want[N];
    for (int e5 = 0; e5 < 2; e5++) {
        const tutti_dtype_t dt = e5 ? TUTTI_FP8_E5M2 : TUTTI_FP8_E4M3;
        const uint8_t top = e5 ? 0x7b : 0x7e, nan = e5 ? 0x7e : 0x7f;
        /* SUM */
        for (size_t i = 0; i < N; i++) {
            double v = (double)((rank + i) % (e5 ? 3 : 4)), sum = 0;
            for (int r = 0; r < nranks; r++)
                sum += (double)((r + i) % (e5 ? 3 : 4));
            in[i] = fp8_code(dt, v);
            want[i] = fp8_code(dt, sum);
            if (i % 7 == 3) { /* the largest everywhere */
                in[i] = top;
                want[i] = top;
            } else if (i % 7 == 5) { /* NaN on one rank */
                if (rank == (int)(i % (size_t)nranks))
                    in[i] = nan;
                want[i] = nan;
            } else if (e5 && i % 7 == 6) { /* inf on one rank, 1 elsewhere */
                in[i] = rank == (int)(i % (size_t)nranks) ? 0x7c : 0x3c;
                want[i] = top;
            }
        }
        for (int inplace = 0; inplace < 2; inplace++) {
            memcpy(out, in, N);
            int st = tutti_allreduce(comm, inplace ? TUTTI_IN_PLACE : in, out, N, dt, TUTTI_SUM);
            FAIL_IF(st != 0, "%s %s sum: %s", algo, tutti_dtype_name(dt),
                    tutti_comm_last_error(comm));
            for (size_t i = 0; i < N; i++)
                FAIL_IF(!fp8_same(dt, out[i], want[i]),
                        "%s %s sum, %d ranks [%zu]: %02x, want %02x", algo, tutti_dtype_name(dt),
                        nranks, i, out[i], want[i]);
        }
        /* MAX, MIN */
        for (int mx = 0; mx < 2; mx++) {
            for (size_t i = 0; i < N; i++) {
                int any_nan = 0;
                double best = 0;
                for (int r = 0; r < nranks; r++) {
                    uint8_t c = (uint8_t)gen_bits(77 + (uint64_t)e5, r, i);
                    c = c == 0x80 ? 0x00 : c; /* no -0 beside +0: their order is the algorithm's */
                    double v = ref_fp8_to_d(dt, c);
                    any_nan |= isnan(v);
                    if (r == rank)
                        in[i] = c;
                    if (r == 0 || (mx ? v > best : v < best)) {
                        best = v;
                        want[i] = c;
                    }
                }
                if (any_nan)
                    want[i] = nan;
            }
            int st = tutti_allreduce(comm, in, out, N, dt, mx ? TUTTI_MAX : TUTTI_MIN);
            FAIL_IF(st != 0, "%s %s %s: %s", algo, tutti_dtype_name(dt), mx ? "max" : "min",
                    tutti_comm_last_error(comm));
            for (size_t i = 0; i < N; i++)
                FAIL_IF(!fp8_same(dt, out[i], want[i]), "%s %s %s, %d ranks [%zu]: %02x, want %02x",
                        algo, tutti_dtype_name(dt), mx ? "max" : "min", nranks, i, out[i], want[i]);
        }
        /* AVG past the range */
        const double a = e5 ? 32768.0 : 256.0, b = 1.5 * a;
        for (size_t i = 0; i < N; i++) {
            /* b at ranks i and i+1 (mod nranks) for odd i: never three b in a partial sum */
            int nb = (i % 2) ? 2 : 0;
            int mine = nb && (rank == (int)(i % (size_t)nranks) ||
                              rank == (int)((i + 1) % (size_t)nranks));
            in[i] = fp8_code(dt, mine ? b : a);
            want[i] = fp8_code(dt, ((nranks - nb) * a + nb * b) / nranks);
        }
        for (int how = 0; how < 3; how++) {
            static const char *const name[] = { "avg in place", "avg", "avg reduce at 1" };
            memcpy(out, in, N);
            int st = how == 0 ? tutti_allreduce(comm, TUTTI_IN_PLACE, out, N, dt, TUTTI_AVG)
                     : how == 1
                         ? tutti_allreduce(comm, in, out, N, dt, TUTTI_AVG)
                         : tutti_reduce(comm, in, rank == 1 ? out : NULL, N, dt, TUTTI_AVG, 1);
            FAIL_IF(st != 0, "%s %s %s: %s", algo, tutti_dtype_name(dt), name[how],
                    tutti_comm_last_error(comm));
            if (how == 2 && rank != 1)
                continue;
            for (size_t i = 0; i < N; i++)
                FAIL_IF(out[i] != want[i], "%s %s %s, %d ranks [%zu]: %02x (%g), want %02x (%g)",
                        algo, tutti_dtype_name(dt), name[how], nranks, i, out[i],
                        ref_fp8_to_d(dt, out[i]), want[i], ref_fp8_to_d(dt, want[i]));
        }
        /* the same through reduce_scatter (this rank's block) and scan and exscan (the
         * mean of the prefix; exscan's rank 0 gets nothing) */
        const size_t blk = N / (size_t)nranks;
        int st = tutti_reduce_scatter(comm, in, out, blk, dt, TUTTI_AVG);
        FAIL_IF(st != 0, "%s %s avg reduce_scatter: %s", algo, tutti_dtype_name(dt),
                tutti_comm_last_error(comm));
        for (size_t j = 0; j < blk; j++)
            FAIL_IF(out[j] != want[(size_t)rank * blk + j],
                    "%s %s avg reduce_scatter, %d ranks [%zu]: %02x, want %02x", algo,
                    tutti_dtype_name(dt), nranks, (size_t)rank * blk + j, out[j],
                    want[(size_t)rank * blk + j]);
        for (int ex = 0; ex < 2; ex++) {
            memset(out, 0xee, N);
            st = ex ? tutti_exscan(comm, in, out, N, dt, TUTTI_AVG)
                    : tutti_scan(comm, in, out, N, dt, TUTTI_AVG);
            FAIL_IF(st != 0, "%s %s avg %s: %s", algo, tutti_dtype_name(dt), ex ? "exscan" : "scan",
                    tutti_comm_last_error(comm));
            const int k = rank + !ex; /* ranks in the prefix */
            for (size_t i = 0; i < N && k > 0; i++) {
                double sum = 0;
                for (int r = 0; r < k; r++) {
                    int rb = (i % 2) && (r == (int)(i % (size_t)nranks) ||
                                         r == (int)((i + 1) % (size_t)nranks));
                    sum += rb ? b : a;
                }
                uint8_t w = fp8_code(dt, sum / k);
                FAIL_IF(out[i] != w, "%s %s avg %s, %d ranks, rank %d [%zu]: %02x, want %02x", algo,
                        tutti_dtype_name(dt), ex ? "exscan" : "scan", nranks, rank, i, out[i], w);
            }
        }
    }
    /* AVG's price (tutti.h): E4M3's 0.017578125 (2^-6 x 1.125) on every rank, scaled by
     * 1/4 first, falls below 2^-6 and loses its last bit: the mean comes out 0.015625
     * (NCCL's 1/ranks scaling loses it too); the sum, divided after, would keep it */
    memset(in, 0x09, N);
    int st = tutti_allreduce(comm, in, out, N, TUTTI_FP8_E4M3, TUTTI_AVG);
    FAIL_IF(st != 0 || out[0] != 0x08 || out[N - 1] != 0x08, "small e4m3 avg: %d, %02x %02x", st,
            out[0], out[N - 1]);
    /* the bitwise ops are refused, naming the dtype */
    st = tutti_allreduce(comm, in, out, N, TUTTI_FP8_E4M3, TUTTI_BXOR);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || !strstr(tutti_comm_last_error(comm), "f8e4m3"),
            "bxor on fp8: %d, %s", st, tutti_comm_last_error(comm));
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

TH_RUN_TEST(fp8_dtypes, run_algo_4_3(rank_fp8, nan_algos[_i]))

/* Complex dtypes (c64, c128): allreduce SUM, PROD and AVG in and out of place, reduce PROD
 * at rank 1, reduce_scatter SUM and scan PROD, at 4 and 3 ranks by every allreduce
 * algorithm; MAX refused naming why. Elements are Gaussian integers with parts in -1..3,
 * so every sum and product is exact in any grouping; the reference is plain C on the
 * parts (the textbook product), AVG the exact sum's parts divided in the parts' type. */
static void cplx_in(int r, size_t i, double *re, double *im)
{
    *re = (double)((r + (int)i) % 3 + 1);
    *im = (double)((2 * r + (int)i) % 3 - 1);
}

/* the reference over ranks lo..hi (inclusive) of element i */
static void cplx_ref(tutti_redop_t op, int lo, int hi, size_t i, double *re, double *im)
{
    cplx_in(lo, i, re, im);
    for (int r = lo + 1; r <= hi; r++) {
        double br, bi, ar = *re, ai = *im;
        cplx_in(r, i, &br, &bi);
        if (op == TUTTI_PROD)
            *re = ar * br - ai * bi, *im = ar * bi + ai * br;
        else
            *re = ar + br, *im = ai + bi;
    }
}

static int rank_complex(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const char *algo = arg;
    tutti_store_t *store;
    tutti_comm_t *comm;
    FAIL_IF(algo_comm(rank, nranks, dir, algo, &store, &comm) != 0, "init");
    enum { N = 3001 }; /* 24-48 KiB: several 4 KiB chunks */
    for (int c128 = 0; c128 < 2; c128++) {
        const tutti_dtype_t dt = c128 ? TUTTI_COMPLEX128 : TUTTI_COMPLEX64;
        const size_t es = c128 ? 16 : 8;
        unsigned char *in = malloc(N * es), *out = malloc(N * es);
        FAIL_IF(!in || !out, "malloc");
        for (size_t i = 0; i < N; i++) {
            double re, im;
            cplx_in(rank, i, &re, &im);
            if (c128) {
                ((double *)in)[2 * i] = re, ((double *)in)[2 * i + 1] = im;
            } else {
                ((float *)in)[2 * i] = (float)re, ((float *)in)[2 * i + 1] = (float)im;
            }
        }
        static const char *const name[] = { "allreduce sum in place", "allreduce prod",
                                            "allreduce avg",          "reduce prod at 1",
                                            "reduce_scatter sum",     "scan prod" };
        for (int how = 0; how < 6; how++) {
            const size_t rs = N / (size_t)nranks; /* reduce_scatter's block */
            tutti_redop_t op = how == 0 || how == 4 ? TUTTI_SUM : how == 2 ? TUTTI_AVG : TUTTI_PROD;
            memcpy(out, in, N * es);
            int st;
            if (how == 0)
                st = tutti_allreduce(comm, TUTTI_IN_PLACE, out, N, dt, op);
            else if (how <= 2)
                st = tutti_allreduce(comm, in, out, N, dt, op);
            else if (how == 3)
                st = tutti_reduce(comm, in, rank == 1 ? out : NULL, N, dt, op, 1);
            else if (how == 4)
                st = tutti_reduce_scatter(comm, in, out, rs, dt, op);
            else
                st = tutti_scan(comm, in, out, N, dt, op);
            FAIL_IF(st != TUTTI_OK, "%s %s %s: %s", algo, tutti_dtype_name(dt), name[how],
                    tutti_comm_last_error(comm));
            if (how == 3 && rank != 1)
                continue;
            size_t first = how == 4 ? (size_t)rank * rs : 0, len = how == 4 ? rs : N;
            for (size_t k = 0; k < len; k++) {
                size_t i = first + k;
                double re, im;
                cplx_ref(op, 0, how == 5 ? rank : nranks - 1, i, &re, &im);
                double gre, gim;
                if (c128) {
                    gre = ((double *)out)[2 * k], gim = ((double *)out)[2 * k + 1];
                    if (op == TUTTI_AVG)
                        re /= nranks, im /= nranks;
                } else {
                    gre = ((float *)out)[2 * k], gim = ((float *)out)[2 * k + 1];
                    if (op == TUTTI_AVG)
                        re = (float)re / (float)nranks, im = (float)im / (float)nranks;
                }
                FAIL_IF(gre != re || gim != im,
                        "%s %s %s, %d ranks [%zu]: got %g%+gi, expected %g%+gi", algo,
                        tutti_dtype_name(dt), name[how], nranks, i, gre, gim, re, im);
            }
        }
        /* no order on complex numbers: refused, saying so */
        FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, out, N, dt, TUTTI_MAX) !=
                    TUTTI_ERR_INVALID_ARG,
                "max on %s not refused", tutti_dtype_name(dt));
        FAIL_IF(!strstr(tutti_comm_last_error(comm), "does not reduce complex numbers"), "%s",
                tutti_comm_last_error(comm));
        free(in);
        free(out);
    }
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

TH_RUN_TEST(complex_dtypes, run_algo_4_3(rank_complex, nan_algos[_i]))

/* MINLOC and MAXLOC (MPI's) on the five value-index pairs: allreduce MAXLOC in place and
 * MINLOC, reduce MINLOC at rank 1, scan MAXLOC, at 4 and 3 ranks by every allreduce
 * algorithm, against a plain C fold over the ranks' inputs: values from five (ties across
 * ranks), NaN in some float elements, indexes the rank or a few shared ones (ties of
 * value and index). Any other op on a pair, and MINLOC on f32, refused naming why. */
static const tutti_dtype_t loc_dtypes[] = { TUTTI_FLOAT_INT, TUTTI_DOUBLE_INT, TUTTI_LONG_INT,
                                            TUTTI_2INT, TUTTI_SHORT_INT };

/* rank r's element i of dt at p (the struct's padding zeroed); the value in *v, NaN as
 * *nan, the index returned */
static int32_t loc_in(tutti_dtype_t dt, int r, size_t i, void *p, long double *v, int *nan)
{
    int k = (int)(((size_t)(r >> (i % 2)) + i) % 3) - 1; /* odd i: ranks 0, 1 tie, 2, 3 too */
    int32_t idx = i % 2 ? r : (int32_t)((r * 3 + i) % 4) - 1;
    int isfloat = dt == TUTTI_FLOAT_INT || dt == TUTTI_DOUBLE_INT;
    *nan = isfloat && i % 11 == (size_t)(r % 2); /* two ranks' NaNs at once */
    *v = k;
    switch (dt) {
    case TUTTI_FLOAT_INT: {
        struct {
            float v;
            int32_t i;
        } e = { *nan ? NAN : (float)k * 0.25f, idx };
        memcpy(p, &e, sizeof(e));
        break;
    }
    case TUTTI_DOUBLE_INT: {
        struct {
            double v;
            int32_t i;
        } e;
        memset(&e, 0, sizeof(e));
        e.v = *nan ? NAN : k * 0.25, e.i = idx;
        memcpy(p, &e, sizeof(e));
        break;
    }
    case TUTTI_LONG_INT: {
        struct {
            int64_t v;
            int32_t i;
        } e;
        memset(&e, 0, sizeof(e));
        e.v = (int64_t)k * (1ll << 50) + 1, e.i = idx; /* beyond a double's exact range */
        memcpy(p, &e, sizeof(e));
        *v = (long double)e.v;
        break;
    }
    case TUTTI_2INT: {
        int32_t e[2] = { k * 1000, idx };
        memcpy(p, e, 8);
        break;
    }
    default: {
        struct {
            int16_t v;
            int32_t i;
        } e;
        memset(&e, 0, sizeof(e));
        e.v = (int16_t)(k * 100), e.i = idx;
        memcpy(p, &e, sizeof(e));
    }
    }
    return idx;
}

static int rank_loc(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const char *algo = arg;
    tutti_store_t *store;
    tutti_comm_t *comm;
    FAIL_IF(algo_comm(rank, nranks, dir, algo, &store, &comm) != 0, "init");
    enum { N = 1501 }; /* 12-24 KiB: several 4 KiB chunks */
    for (size_t d = 0; d < sizeof(loc_dtypes) / sizeof(loc_dtypes[0]); d++) {
        const tutti_dtype_t dt = loc_dtypes[d];
        const size_t es = tutti_dtype_size(dt);
        unsigned char *in = malloc(N * es), *out = malloc(N * es), *want = malloc(es);
        FAIL_IF(!in || !out || !want, "malloc");
        for (size_t i = 0; i < N; i++) {
            long double v;
            int nan;
            loc_in(dt, rank, i, in + i * es, &v, &nan);
        }
        static const char *const name[] = { "allreduce maxloc in place", "allreduce minloc",
                                            "reduce minloc at 1",        "scan maxloc",
                                            "reduce_scatter minloc",     "exscan maxloc" };
        const size_t rs = N / (size_t)nranks; /* reduce_scatter's block */
        for (int how = 0; how < 6; how++) {
            tutti_redop_t op = how == 0 || how == 3 || how == 5 ? TUTTI_MAXLOC : TUTTI_MINLOC;
            memcpy(out, in, N * es);
            int st = how == 0   ? tutti_allreduce(comm, TUTTI_IN_PLACE, out, N, dt, op)
                     : how == 1 ? tutti_allreduce(comm, in, out, N, dt, op)
                     : how == 2 ? tutti_reduce(comm, in, rank == 1 ? out : NULL, N, dt, op, 1)
                     : how == 3 ? tutti_scan(comm, in, out, N, dt, op)
                     : how == 4 ? tutti_reduce_scatter(comm, in, out, rs, dt, op)
                                : tutti_exscan(comm, in, out, N, dt, op);
            FAIL_IF(st != TUTTI_OK, "%s %s %s: %s", algo, tutti_dtype_name(dt), name[how],
                    tutti_comm_last_error(comm));
            if ((how == 2 && rank != 1) || (how == 5 && rank == 0)) /* (exscan: 0's undefined) */
                continue;
            const int last = how == 3 ? rank : how == 5 ? rank - 1 : nranks - 1;
            const size_t first = how == 4 ? (size_t)rank * rs : 0, len = how == 4 ? rs : N;
            for (size_t k = 0; k < len; k++) {
                const size_t i = first + k;
                /* the fold: the extreme value, NaN first; on ties the least index */
                long double bv = 0;
                int32_t bi = 0;
                int bnan = 0;
                for (int r = 0; r <= last; r++) {
                    long double v;
                    int nan;
                    int32_t idx = loc_in(dt, r, i, want, &v, &nan);
                    int take = r == 0               ? 1
                               : nan || bnan        ? (nan && !bnan) || (nan && bnan && idx < bi)
                               : v == bv            ? idx < bi
                               : op == TUTTI_MAXLOC ? v > bv
                                                    : v < bv;
                    if (take)
                        bv = v, bi = idx, bnan = nan;
                }
                long double gv;
                int gnan;
                int32_t gi;
                /* the result's value and index, read through the same layout */
                {
                    const unsigned char *q = out + k * es;
                    size_t ioff = es == 16 ? 8 : 4;
                    memcpy(&gi, q + ioff, 4);
                    if (dt == TUTTI_FLOAT_INT) {
                        float f;
                        memcpy(&f, q, 4);
                        gnan = isnan(f), gv = (long double)f / 0.25L;
                    } else if (dt == TUTTI_DOUBLE_INT) {
                        double f;
                        memcpy(&f, q, 8);
                        gnan = isnan(f), gv = (long double)f / 0.25L;
                    } else if (dt == TUTTI_LONG_INT) {
                        int64_t x;
                        memcpy(&x, q, 8);
                        gnan = 0, gv = (long double)x;
                    } else if (dt == TUTTI_2INT) {
                        int32_t x;
                        memcpy(&x, q, 4);
                        gnan = 0, gv = x / 1000;
                    } else {
                        int16_t x;
                        memcpy(&x, q, 2);
                        gnan = 0, gv = x / 100;
                    }
                }
                FAIL_IF(gi != bi || gnan != bnan || (!bnan && gv != bv),
                        "%s %s %s, %d ranks [%zu]: got (%Lg%s, %d), want (%Lg%s, %d)", algo,
                        tutti_dtype_name(dt), name[how], nranks, i, gv, gnan ? " NaN" : "", gi, bv,
                        bnan ? " NaN" : "", bi);
            }
        }
        FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, out, N, dt, TUTTI_SUM) !=
                        TUTTI_ERR_INVALID_ARG ||
                    !strstr(tutti_comm_last_error(comm), "a value-index pair"),
                "sum on %s: %s", tutti_dtype_name(dt), tutti_comm_last_error(comm));
        free(in);
        free(out);
        free(want);
    }
    float f[4] = { 0 };
    FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, f, 4, TUTTI_FP32, TUTTI_MINLOC) !=
                    TUTTI_ERR_INVALID_ARG ||
                !strstr(tutti_comm_last_error(comm), "reduces value-index pairs only"),
            "minloc on f32: %s", tutti_comm_last_error(comm));
    /* the communicator goes on after refused calls */
    FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, f, 4, TUTTI_FP32, TUTTI_SUM) != TUTTI_OK,
            "sum after: %s", tutti_comm_last_error(comm));
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

TH_RUN_TEST(loc_dtypes_test, run_algo_4_3(rank_loc, nan_algos[_i]))

/* allgather and gather with each rank's send buffer inside the receive buffer, starting
 * 4096 bytes below its own block (rank 0: at it): the own block is copied out before
 * anything lands, as tutti.h promises. Blocks of 8 KiB and 64 KiB, where the copy's
 * forward vector loop ran over its own source (session 98: half of each such block
 * came out wrong, on every rank, for every algorithm). */
static const char *const overlap_algos[] = { "ring", "pairwise", "linear", "rd", "hier", "tree" };

/* byte i of rank j's block: no period (a copy that reread what it wrote 4096 bytes back
 * must not find the same values there) */
static unsigned char inside_byte(size_t i, int j, size_t bi)
{
    return (unsigned char)(((uint32_t)i * 2654435761u >> 24) + (unsigned)j * 7u + bi);
}

static int rank_send_inside(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const char *algo = arg;
    tutti_store_t *store;
    tutti_comm_t *comm;
    FAIL_IF(algo_comm(rank, nranks, dir, algo, &store, &comm) != 0, "init");
    static const size_t blocks[] = { 8192, 65536 };
    for (size_t bi = 0; bi < 2; bi++) {
        const size_t B = blocks[bi], shift = rank ? 4096 : 0;
        unsigned char *rb = malloc(B * (size_t)nranks);
        FAIL_IF(!rb, "malloc");
        for (int call = 0; call < 2; call++) { /* allgather, then gather at the last rank */
            int root = nranks - 1;
            memset(rb, 0xee, B * (size_t)nranks);
            unsigned char *sb = rb + (size_t)rank * B - shift;
            for (size_t i = 0; i < B; i++)
                sb[i] = inside_byte(i, rank, bi);
            int st = call == 0 ? tutti_allgather(comm, sb, rb, B, TUTTI_UINT8)
                               : tutti_gather(comm, sb, rb, B, TUTTI_UINT8, root);
            FAIL_IF(st != TUTTI_OK, "%s %s: %s", algo, call ? "gather" : "allgather",
                    tutti_comm_last_error(comm));
            if (call == 1 && rank != root)
                continue;
            for (int j = 0; j < nranks; j++)
                for (size_t i = 0; i < B; i++)
                    FAIL_IF(rb[(size_t)j * B + i] != inside_byte(i, j, bi),
                            "%s %s, blocks of %zu: rank %d's block, byte %zu is %u", algo,
                            call ? "gather" : "allgather", B, j, i, rb[(size_t)j * B + i]);
        }
        free(rb);
    }
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

TH_RUN_TEST(send_inside_recv, run_algo_4_3(rank_send_inside, overlap_algos[_i]))

static Suite *suite(void)
{
    Suite *s = suite_create("collectives");
    th_add_case(s, "matrix", matrix, 5 * MATRIX_CONFIGS, 120);
    /* tagged "hosts": these pick their transports (shm within a host, tcp across) whatever
     * TUTTI_TRANSPORT says, so a run over another transport leaves them out
     * (CK_EXCLUDE_TAGS=hosts, tests/rdma/guest-suite.sh) */
    tcase_set_tags(th_add_case(s, "hier", hier_hosts,
                               (int)(sizeof(hier_maps) / sizeof(hier_maps[0])), 120),
                   "hosts");
    TCase *tc = tcase_create("async");
    tcase_set_timeout(tc, 90);
    tcase_add_loop_test(tc, async_inflight, 2, 5);
    tcase_add_test(tc, async_mixed);
    suite_add_tcase(s, tc);
    th_add_tests(s, "scale", 60, (const TTest *const[]){ eight_ranks, NULL });
    th_add_case(s, "nan", nan_minmax, (int)(sizeof(nan_algos) / sizeof(nan_algos[0])), 60);
    th_add_case(s, "avg_f16", avg_f16_range, (int)(sizeof(nan_algos) / sizeof(nan_algos[0])), 60);
    th_add_case(s, "fp8", fp8_dtypes, (int)(sizeof(nan_algos) / sizeof(nan_algos[0])), 90);
    th_add_case(s, "complex", complex_dtypes, (int)(sizeof(nan_algos) / sizeof(nan_algos[0])), 90);
    th_add_case(s, "minloc", loc_dtypes_test, (int)(sizeof(nan_algos) / sizeof(nan_algos[0])), 90);
    th_add_case(s, "send_inside", send_inside_recv,
                (int)(sizeof(overlap_algos) / sizeof(overlap_algos[0])), 60);
    collectives_others_add(s);
    return s;
}

int main(void)
{
    return th_main(suite());
}
