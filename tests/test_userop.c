/* Ops the caller defines (tutti_redop_create): the API's own checks, a commutative op
 * (MAXLOC over {value, index} pairs) through every algorithm that reduces, and an op
 * that does not commute (2x2 matrix products) in rank order whatever algorithm was
 * asked for, against references computed here in plain C. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include <tutti/fuse.h>

#include "harness.h"

/* ---- the ops ---- */

/* MAXLOC (MPI_MAXLOC's rule): the larger value wins, a tie goes to the lower index. An
 * element is 8 bytes, {int32 value, int32 index}, reduced as one TUTTI_UINT64. */
typedef struct {
    int32_t value, index;
} loc_t;

static loc_t loc_pick(loc_t x, loc_t y)
{
    if (x.value != y.value)
        return x.value > y.value ? x : y;
    return x.index < y.index ? x : y;
}

/* A 2x2 matrix of 16-bit entries, products mod 2^16: associative, not commutative. */
typedef struct {
    uint16_t a, b, c, d;
} mat_t;

static mat_t mat_mul(mat_t x, mat_t y)
{
    mat_t m = { (uint16_t)((uint32_t)x.a * y.a + (uint32_t)x.b * y.c),
                (uint16_t)((uint32_t)x.a * y.b + (uint32_t)x.b * y.d),
                (uint16_t)((uint32_t)x.c * y.a + (uint32_t)x.d * y.c),
                (uint16_t)((uint32_t)x.c * y.b + (uint32_t)x.d * y.d) };
    return m;
}

static int ctx_tag;                 /* what every op's ctx must point at */
static _Atomic long calls, bad_ctx; /* this process's calls, and calls with another ctx */

/* Both ops as 8-byte words (a union reads the struct's bits) */
typedef union {
    uint64_t w;
    loc_t loc;
    mat_t mat;
} word_t;

static uint64_t word_maxloc(uint64_t x, uint64_t y)
{
    word_t a = { .w = x }, b = { .w = y }, r = { .loc = loc_pick(a.loc, b.loc) };
    return r.w;
}

static uint64_t word_matmul(uint64_t x, uint64_t y)
{
    word_t a = { .w = x }, b = { .w = y }, r = { .mat = mat_mul(a.mat, b.mat) };
    return r.w;
}

/* The functions the library calls: count, check ctx and dtype, and apply word to each
 * element, through memcpy (buffers may be unaligned). */
static void apply(void *dst, const void *a, const void *b, size_t count, tutti_dtype_t dtype,
                  void *ctx, uint64_t (*word)(uint64_t, uint64_t))
{
    atomic_fetch_add(&calls, 1);
    if (ctx != &ctx_tag || dtype != TUTTI_UINT64)
        atomic_fetch_add(&bad_ctx, 1);
    for (size_t i = 0; i < count; i++) {
        uint64_t x, y;
        memcpy(&x, (const char *)a + i * 8, 8);
        memcpy(&y, (const char *)b + i * 8, 8);
        x = word(x, y);
        memcpy((char *)dst + i * 8, &x, 8);
    }
}

static void fn_maxloc(void *dst, const void *a, const void *b, size_t count, tutti_dtype_t dtype,
                      void *ctx)
{
    apply(dst, a, b, count, dtype, ctx, word_maxloc);
}

static void fn_matmul(void *dst, const void *a, const void *b, size_t count, tutti_dtype_t dtype,
                      void *ctx)
{
    apply(dst, a, b, count, dtype, ctx, word_matmul);
}

/* Rank r's element i: values in a small range (ties are common), indices unique. */
static loc_t loc_in(int r, size_t i)
{
    loc_t l = { (int32_t)((r * 7919u + i * 104729u) % 13u), (int32_t)(r * 100000 + (int)i) };
    return l;
}

static mat_t mat_in(int r, size_t i)
{
    uint32_t h = (uint32_t)(r + 1) * 2654435761u ^ (uint32_t)i * 40503u;
    mat_t m = { (uint16_t)(h & 0xff), (uint16_t)(h >> 8 & 0xff), (uint16_t)(h >> 16 & 0xff),
                (uint16_t)(h >> 24 | 1) };
    return m;
}

/* The references: the ranks' elements folded in rank order, in plain C. */
static loc_t loc_want(int n, size_t i)
{
    loc_t w = loc_in(0, i);
    for (int r = 1; r < n; r++)
        w = loc_pick(w, loc_in(r, i));
    return w;
}

static mat_t mat_want(int n, size_t i)
{
    mat_t w = mat_in(0, i);
    for (int r = 1; r < n; r++)
        w = mat_mul(w, mat_in(r, i));
    return w;
}

/* ---- the API ---- */

START_TEST(create_and_free)
{
    tutti_redop_t op, op2;
    ck_assert_int_eq(tutti_redop_create(NULL, fn_maxloc, NULL, 0, NULL), TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(tutti_redop_create(&op, NULL, NULL, 0, NULL), TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(tutti_redop_create(&op, fn_maxloc, NULL, 2, NULL), TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(tutti_redop_create(&op, fn_maxloc, NULL, TUTTI_REDOP_COMMUTATIVE, "maxloc"),
                     TUTTI_OK);
    ck_assert_int_eq(op, TUTTI_REDOP_USER_FIRST);
    ck_assert_str_eq(tutti_redop_name(op), "maxloc");
    ck_assert_int_eq(tutti_redop_create(&op2, fn_matmul, NULL, 0, NULL), TUTTI_OK);
    ck_assert_int_eq(op2, TUTTI_REDOP_USER_FIRST + 1);
    ck_assert_str_eq(tutti_redop_name(op2), "user129");
    /* a name cut at 31 bytes loses the whole of a character it would split */
    tutti_redop_t op3;
    ck_assert_int_eq(tutti_redop_create(&op3, fn_matmul, NULL, 0,
                                        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\xc3\xa9z"),
                     TUTTI_OK);
    ck_assert_str_eq(tutti_redop_name(op3), "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    ck_assert_int_eq(tutti_redop_free(op3), TUTTI_OK);
    /* MPI_Op_commutative: as made; the built-in ones commute; a freed one is no op */
    int cm = -1;
    ck_assert_int_eq(tutti_redop_commutative(op, &cm), TUTTI_OK);
    ck_assert_int_eq(cm, 1);
    ck_assert_int_eq(tutti_redop_commutative(op2, &cm), TUTTI_OK);
    ck_assert_int_eq(cm, 0);
    cm = -1;
    ck_assert_int_eq(tutti_redop_commutative(TUTTI_MAX, &cm), TUTTI_OK);
    ck_assert_int_eq(cm, 1);
    ck_assert_int_eq(tutti_redop_commutative(op3, &cm), TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(tutti_redop_commutative((tutti_redop_t)100, &cm), TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(tutti_redop_commutative(op, NULL), TUTTI_ERR_INVALID_ARG);
    /* any dtype, none out of range */
    ck_assert_int_eq(tutti_redop_supported(op, TUTTI_FP32), 1);
    ck_assert_int_eq(tutti_redop_supported(op, TUTTI_UINT64), 1);
    ck_assert_int_eq(tutti_redop_supported(op, TUTTI_DTYPE_COUNT), 0);
    /* freed: gone, and its value is the next one made */
    ck_assert_int_eq(tutti_redop_free(op), TUTTI_OK);
    ck_assert_int_eq(tutti_redop_free(op), TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(tutti_redop_supported(op, TUTTI_FP32), 0);
    ck_assert_str_eq(tutti_redop_name(op), "user128"); /* its value, in messages */
    ck_assert_str_eq(tutti_redop_name((tutti_redop_t)200), "user200");
    ck_assert_str_eq(tutti_redop_name((tutti_redop_t)100), "?");
    ck_assert_int_eq(tutti_redop_free(TUTTI_SUM), TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(tutti_redop_free((tutti_redop_t)TUTTI_REDOP_USER_LAST), TUTTI_ERR_INVALID_ARG);
    tutti_redop_t again;
    ck_assert_int_eq(tutti_redop_create(&again, fn_maxloc, NULL, 0, NULL), TUTTI_OK);
    ck_assert_int_eq(again, op);
    /* every value taken */
    int made = 2;
    tutti_redop_t last = again;
    while (tutti_redop_create(&last, fn_maxloc, NULL, 0, NULL) == TUTTI_OK)
        made++;
    ck_assert_int_eq(made, TUTTI_REDOP_USER_LAST - TUTTI_REDOP_USER_FIRST + 1);
    ck_assert_int_eq(tutti_redop_create(&last, fn_maxloc, NULL, 0, NULL), TUTTI_ERR_NOMEM);
    for (int v = TUTTI_REDOP_USER_FIRST; v <= TUTTI_REDOP_USER_LAST; v++)
        ck_assert_int_eq(tutti_redop_free((tutti_redop_t)v), TUTTI_OK);
}
END_TEST

/* tutti_reduce_local (MPI_Reduce_local): inout = in op inout, element by element, with a
 * built-in op's kernel and a defined op's function (in that argument order: matmul does
 * not commute), against products and sums computed here; AVG, a bitwise op of floats,
 * NULL and an invalid dtype refused, saying why in the thread's error. */
START_TEST(reduce_local)
{
    enum { N = 37 };
    float fa[N], fb[N];
    int32_t ia[N], ib[N];
    uint64_t ma[N], mb[N], want[N];
    for (int i = 0; i < N; i++) {
        fa[i] = 0.5f * (float)i, fb[i] = 3.0f - (float)i;
        ia[i] = (i * 37) % 11 - 5, ib[i] = (i * 13) % 7 - 3;
        mat_t x = { (uint16_t)(i + 1), 2, 3, (uint16_t)(i * 5) };
        mat_t y = { 7, (uint16_t)i, (uint16_t)(2 * i), 1 };
        memcpy(&ma[i], &x, 8);
        memcpy(&mb[i], &y, 8);
        want[i] = word_matmul(ma[i], mb[i]);
    }
    ck_assert_int_eq(tutti_reduce_local(fa, fb, N, TUTTI_FP32, TUTTI_SUM), TUTTI_OK);
    ck_assert_int_eq(tutti_reduce_local(ia, ib, N, TUTTI_INT32, TUTTI_MAX), TUTTI_OK);
    for (int i = 0; i < N; i++) {
        ck_assert_float_eq(fb[i], 0.5f * (float)i + (3.0f - (float)i));
        int32_t a = (i * 37) % 11 - 5, b = (i * 13) % 7 - 3;
        ck_assert_int_eq(ib[i], a > b ? a : b);
    }
    tutti_redop_t mm;
    ck_assert_int_eq(tutti_redop_create(&mm, fn_matmul, &ctx_tag, 0, "matmul"), TUTTI_OK);
    ck_assert_int_eq(tutti_reduce_local(ma, mb, N, TUTTI_UINT64, mm), TUTTI_OK);
    for (int i = 0; i < N; i++)
        ck_assert_msg(mb[i] == want[i], "element %d: %016llx, expected in x inout %016llx", i,
                      (unsigned long long)mb[i], (unsigned long long)want[i]);
    ck_assert_int_eq(tutti_redop_free(mm), TUTTI_OK);
    ck_assert_int_eq(tutti_reduce_local(fa, fb, N, TUTTI_FP32, TUTTI_AVG), TUTTI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tutti_comm_last_error(NULL), "reduce_local: op avg is a mean"));
    ck_assert_int_eq(tutti_reduce_local(fa, fb, N, TUTTI_FP32, TUTTI_BAND), TUTTI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tutti_comm_last_error(NULL), "reduce_local: "));
    ck_assert_ptr_nonnull(strstr(tutti_comm_last_error(NULL), "f32"));
    ck_assert_int_eq(tutti_reduce_local(NULL, fb, N, TUTTI_FP32, TUTTI_SUM), TUTTI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tutti_comm_last_error(NULL), "reduce_local: inbuf is NULL"));
    ck_assert_int_eq(tutti_reduce_local(fa, fb, N, (tutti_dtype_t)99, TUTTI_SUM),
                     TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(tutti_reduce_local(fa, fb, N, TUTTI_FP32, mm), TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(tutti_reduce_local(NULL, NULL, 0, TUTTI_FP32, TUTTI_SUM), TUTTI_OK);
}
END_TEST

/* ---- through the collectives ---- */

/* The algorithm sets, one communicator each: every algorithm that reduces, a commutative
 * op free to use it. An op that does not commute must come out in rank order under
 * every one of them (the library takes the linear ones). */
static const char *const sets[] = {
    "allreduce:ring;reduce:tree;reduce_scatter:ring",
    "allreduce:rd;reduce:ring;reduce_scatter:pairwise",
    "allreduce:hd;reduce:linear;reduce_scatter:linear",
    "allreduce:dbtree;reduce:tree;reduce_scatter:pairwise",
    "allreduce:hier;reduce:ring;reduce_scatter:hier",
    "allreduce:linear;reduce:linear;reduce_scatter:ring",
};

/* Checks buf's n elements from element `first` against the reference of op (0: maxloc,
 * 1: matmul); 0, or 1 after saying where. */
static int check_elems(int rank, int nranks, int which, const char *what, const void *buf,
                       size_t first, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t got, want;
        memcpy(&got, (const char *)buf + i * 8, 8);
        if (which) {
            mat_t w = mat_want(nranks, first + i);
            memcpy(&want, &w, 8);
        } else {
            loc_t w = loc_want(nranks, first + i);
            memcpy(&want, &w, 8);
        }
        FAIL_IF(got != want, "%s: element %zu is %016llx, expected %016llx", what, first + i,
                (unsigned long long)got, (unsigned long long)want);
    }
    return 0;
}

static void fill(int which, int rank, void *buf, size_t first, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (which) {
            mat_t m = mat_in(rank, first + i);
            memcpy((char *)buf + i * 8, &m, 8);
        } else {
            loc_t l = loc_in(rank, first + i);
            memcpy((char *)buf + i * 8, &l, 8);
        }
    }
}

/* One op through allreduce (a buffer and in place, blocking and async), reduce at every
 * root, reduce_scatter and reduce_scatterv (uneven blocks) and allreduce_coalesced. */
static int run_op(int rank, int nranks, tutti_comm_t *comm, tutti_redop_t op, int which,
                  const char *set)
{
    /* 1 byte off alignment: the functions must not assume any */
    const size_t n = 3001;
    char *raw_in = malloc(n * 8 + 1), *raw_out = malloc(n * 8 * (size_t)nranks + 1);
    FAIL_IF(!raw_in || !raw_out, "out of memory");
    char *in = raw_in + 1, *out = raw_out + 1;
    char what[192];
    int st;

    snprintf(what, sizeof(what), "%s allreduce (%s)", tutti_redop_name(op), set);
    fill(which, rank, in, 0, n);
    st = tutti_allreduce(comm, in, out, n, TUTTI_UINT64, op);
    FAIL_IF(st != 0, "%s: %s", what, tutti_comm_last_error(comm));
    if (check_elems(rank, nranks, which, what, out, 0, n))
        return 1;

    snprintf(what, sizeof(what), "%s allreduce in place, async (%s)", tutti_redop_name(op), set);
    tutti_work_t *w = NULL;
    st = tutti_allreduce_async(comm, TUTTI_IN_PLACE, in, n, TUTTI_UINT64, op, &w);
    FAIL_IF(st != 0, "%s: %s", what, tutti_comm_last_error(comm));
    st = tutti_wait(w, 30000);
    FAIL_IF(st != 0, "%s: wait: %s", what, tutti_strerror(st));
    if (check_elems(rank, nranks, which, what, in, 0, n))
        return 1;

    for (int k = 0; k < 2 * nranks; k++) {
        const int root = k / 2, inplace = k % 2;
        snprintf(what, sizeof(what), "%s reduce to %d%s (%s)", tutti_redop_name(op), root,
                 inplace ? " in place" : "", set);
        fill(which, rank, in, 0, n);
        st = tutti_reduce(comm, inplace && rank == root ? TUTTI_IN_PLACE : in,
                          inplace && rank == root ? in : out, n, TUTTI_UINT64, op, root);
        FAIL_IF(st != 0, "%s: %s", what, tutti_comm_last_error(comm));
        if (rank == root && check_elems(rank, nranks, which, what, inplace ? in : out, 0, n))
            return 1;
    }
    /* nothing to reduce: no call of the function, no failure */
    st = tutti_allreduce(comm, in, out, 0, TUTTI_UINT64, op);
    FAIL_IF(st != 0, "%s allreduce of 0 elements: %s", tutti_redop_name(op),
            tutti_comm_last_error(comm));
    st = tutti_reduce(comm, in, out, 0, TUTTI_UINT64, op, nranks - 1);
    FAIL_IF(st != 0, "%s reduce of 0 elements: %s", tutti_redop_name(op),
            tutti_comm_last_error(comm));

    /* reduce_scatter: blocks of 257; reduce_scatterv: rank r's block r * 97 + 5 long */
    snprintf(what, sizeof(what), "%s reduce_scatter (%s)", tutti_redop_name(op), set);
    const size_t blk = 257;
    char *rs_in = malloc(blk * 8 * (size_t)nranks);
    FAIL_IF(!rs_in, "out of memory");
    fill(which, rank, rs_in, 0, blk * (size_t)nranks);
    st = tutti_reduce_scatter(comm, rs_in, out, blk, TUTTI_UINT64, op);
    FAIL_IF(st != 0, "%s: %s", what, tutti_comm_last_error(comm));
    if (check_elems(rank, nranks, which, what, out, blk * (size_t)rank, blk))
        return 1;
    free(rs_in);

    snprintf(what, sizeof(what), "%s reduce_scatterv (%s)", tutti_redop_name(op), set);
    size_t counts[8], total = 0, mine = 0;
    for (int r = 0; r < nranks; r++) {
        counts[r] = (size_t)r * 97 + 5;
        if (r < rank)
            mine += counts[r];
        total += counts[r];
    }
    char *rv_in = malloc(total * 8);
    FAIL_IF(!rv_in, "out of memory");
    fill(which, rank, rv_in, 0, total);
    st = tutti_reduce_scatterv(comm, rv_in, out, counts, TUTTI_UINT64, op);
    FAIL_IF(st != 0, "%s: %s", what, tutti_comm_last_error(comm));
    if (check_elems(rank, nranks, which, what, out, mine, counts[rank]))
        return 1;
    free(rv_in);

    /* two tensors in one call: the second starts at element n of the reference */
    snprintf(what, sizeof(what), "%s allreduce_coalesced (%s)", tutti_redop_name(op), set);
    fill(which, rank, in, 0, n);
    fill(which, rank, out, n, 100);
    void *bufs[2] = { in, out };
    size_t cnts[2] = { n, 100 };
    tutti_dtype_t dts[2] = { TUTTI_UINT64, TUTTI_UINT64 };
    st = tutti_allreduce_coalesced(comm, bufs, cnts, dts, 2, op, 0);
    FAIL_IF(st != 0, "%s: %s", what, tutti_comm_last_error(comm));
    if (check_elems(rank, nranks, which, what, in, 0, n) ||
        check_elems(rank, nranks, which, what, out, n, 100))
        return 1;

    free(raw_in);
    free(raw_out);
    return 0;
}

static int rank_ops(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const char *set = arg;
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 20000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.algo = set;
    o.chunk_bytes = 4096; /* several chunks (and calls of the function) a vector */
    tutti_comm_t *comm = NULL;
    FAIL_IF(tutti_comm_init(&comm, store, rank, nranks, &o) != 0, "init");
    /* made in the same order on every rank: the same values */
    tutti_redop_t maxloc, matmul;
    FAIL_IF(tutti_redop_create(&maxloc, fn_maxloc, &ctx_tag, TUTTI_REDOP_COMMUTATIVE, "maxloc") !=
                0,
            "create");
    FAIL_IF(tutti_redop_create(&matmul, fn_matmul, &ctx_tag, 0, "matmul") != 0, "create");
    if (run_op(rank, nranks, comm, maxloc, 0, set) || run_op(rank, nranks, comm, matmul, 1, set))
        return 1;
    /* freed while an async call that uses it is queued or running: the call still runs
     * it, in rank order (a call holds its op until it completes) */
    tutti_redop_t late;
    FAIL_IF(tutti_redop_create(&late, fn_matmul, &ctx_tag, 0, "late") != 0, "create");
    enum { LATE_N = 50000 };
    uint64_t *late_in = malloc(LATE_N * 8), *late_out = malloc(LATE_N * 8);
    FAIL_IF(!late_in || !late_out, "out of memory");
    fill(1, rank, late_in, 0, LATE_N);
    tutti_work_t *lw = NULL;
    int st = tutti_allreduce_async(comm, late_in, late_out, LATE_N, TUTTI_UINT64, late, &lw);
    FAIL_IF(st != 0, "async allreduce: %s", tutti_comm_last_error(comm));
    FAIL_IF(tutti_redop_free(late) != 0, "free while in flight");
    FAIL_IF(tutti_redop_supported(late, TUTTI_UINT64), "a freed op is still supported");
    st = tutti_wait(lw, 30000);
    FAIL_IF(st != 0, "async allreduce with an op freed under it: %s", tutti_work_error(lw));
    tutti_work_free(lw);
    if (check_elems(rank, nranks, 1, "allreduce with its op freed under it", late_out, 0, LATE_N))
        return 1;
    free(late_in);
    free(late_out);
    FAIL_IF(nranks > 1 && atomic_load(&calls) == 0 && rank == 0, "no call of the functions");
    FAIL_IF(atomic_load(&bad_ctx) != 0, "%ld calls with another ctx or dtype",
            atomic_load(&bad_ctx));
    /* freed: refused at the call, on every rank */
    FAIL_IF(tutti_redop_free(matmul) != 0, "free");
    uint64_t x = 1;
    st = tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_UINT64, matmul);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG, "allreduce with a freed op: %s", tutti_strerror(st));
    FAIL_IF(!strstr(tutti_comm_last_error(comm), "not defined"), "message: %s",
            tutti_comm_last_error(comm));
    /* the communicator is still good */
    st = tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_UINT64, maxloc);
    FAIL_IF(st != 0, "after the refusal: %s", tutti_comm_last_error(comm));
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

START_TEST(algorithms)
{
    const int from = 1, to = th_quick() ? 4 : 5;
    for (int n = from; n <= to; n++) {
        th_spec_t spec = { .nranks = n,
                           .fn = rank_ops,
                           .arg = (void *)sets[_i],
                           .timeout_ms = 60000,
                           .flags = TH_NO_COMM };
        ck_assert_msg(th_run_ex(&spec, NULL) == 0, "%s on %d ranks failed", sets[_i], n);
    }
}
END_TEST

/* Ranks that pass different defined ops (rank 0 its second, the others their first)
 * fail the call with a message naming both ops, on every rank, well before the timeout. */
static int rank_disagree(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    (void)nranks;
    tutti_redop_t a, b;
    FAIL_IF(tutti_redop_create(&a, fn_maxloc, &ctx_tag, TUTTI_REDOP_COMMUTATIVE, "maxloc") ||
                tutti_redop_create(&b, fn_matmul, &ctx_tag, 0, "matmul"),
            "create");
    uint64_t v[16] = { 0 };
    double t0 = th_now_ms();
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, v, 16, TUTTI_UINT64, rank == 0 ? b : a);
    FAIL_IF(st == TUTTI_OK, "ranks with different ops succeeded");
    const char *m = tutti_comm_last_error(comm);
    FAIL_IF(th_now_ms() - t0 > 10000, "took %.0f ms", th_now_ms() - t0);
    FAIL_IF(!strstr(m, "maxloc") || !strstr(m, "matmul"), "message does not name both ops: %s", m);
    return 0;
}

/* One value, defined commutative on rank 0 and not on the others: the call fails on every
 * rank, the message saying which one runs in rank order. */
static int rank_disagree_order(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    (void)nranks;
    tutti_redop_t op;
    FAIL_IF(tutti_redop_create(&op, fn_matmul, &ctx_tag, rank == 0 ? TUTTI_REDOP_COMMUTATIVE : 0,
                               "matmul"),
            "create");
    uint64_t v[16] = { 0 };
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, v, 16, TUTTI_UINT64, op);
    FAIL_IF(st == TUTTI_OK, "ranks with the op commutative on one rank only succeeded");
    const char *m = tutti_comm_last_error(comm);
    FAIL_IF(!strstr(m, "matmul (in rank order)"), "message does not say which: %s", m);
    return 0;
}

START_TEST(ranks_disagree)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 30000;
    th_spec_t spec = { .nranks = 3,
                       .fn = rank_disagree,
                       .timeout_ms = 60000,
                       .flags = TH_NO_KILL_ON_FAIL,
                       .opts = &o };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    spec.fn = rank_disagree_order;
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("userop");
    th_add_tests(s, "api", 30, (const TTest *const[]){ create_and_free, reduce_local, NULL });
    th_add_case(s, "algorithms", algorithms, (int)(sizeof(sets) / sizeof(sets[0])), 180);
    th_add_tests(s, "disagree", 90, (const TTest *const[]){ ranks_disagree, NULL });
    return s;
}

int main(void)
{
    return th_main(suite());
}
