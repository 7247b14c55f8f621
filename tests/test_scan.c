/* scan and exscan (MPI_Scan, MPI_Exscan): each algorithm and the model's pick at 1-5
 * ranks, every dtype with every op it takes, out of place, in place (both forms) and
 * async, in one chunk and in many, against ref.c's plain-C references (rank r's scan is
 * the reduction of ranks 0..r, its exscan that of ranks 0..r-1); an op that does not
 * commute (composed affine maps) in rank order under every algorithm; exscan leaves
 * rank 0's recvbuf as it was; nothing past recvbuf is written; ranks that disagree and
 * bad arguments fail with a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "harness.h"
#include "ref.h"

/* the model's pick, then each algorithm forced */
static const char *const sets[] = { NULL, "scan:linear;exscan:linear", "scan:rd;exscan:rd" };

/* ---- an op that does not commute: x -> a x + b (mod 2^32) maps, composed in rank
 * order (the lower rank's map applied first): (a1, b1) then (a2, b2) is (a2 a1, a2 b1 +
 * b2). An element is {uint32 a, uint32 b}, reduced as one TUTTI_UINT64. ---- */

typedef struct {
    uint32_t a, b;
} aff_t;

static aff_t aff_then(aff_t x, aff_t y)
{
    aff_t r = { y.a * x.a, y.a * x.b + y.b };
    return r;
}

static aff_t aff_in(int r, size_t i)
{
    uint32_t h = (uint32_t)mix64((uint64_t)r << 32 | i);
    aff_t m = { h | 1, h >> 7 };
    return m;
}

static void fn_aff(void *dst, const void *a, const void *b, size_t count, tutti_dtype_t dtype,
                   void *ctx)
{
    (void)dtype, (void)ctx;
    for (size_t i = 0; i < count; i++) {
        aff_t x, y;
        memcpy(&x, (const char *)a + i * 8, 8);
        memcpy(&y, (const char *)b + i * 8, 8);
        x = aff_then(x, y);
        memcpy((char *)dst + i * 8, &x, 8);
    }
}

/* ---- one rank ---- */

enum { MODE_OUT, MODE_IN_PLACE, MODE_SAME_PTR, MODE_ASYNC, MODES };
static const char *const mode_names[MODES] = { "out of place", "TUTTI_IN_PLACE",
                                               "sendbuf == recvbuf", "async" };

typedef struct {
    int rank, nranks;
    tutti_comm_t *comm;
    const char *set;
    unsigned char *send, *recv; /* recv: count elements, then the guard */
} ctx_t;

static int call(ctx_t *c, int ex, int mode, size_t count, tutti_dtype_t dt, tutti_redop_t op)
{
    const void *s = mode == MODE_IN_PLACE   ? TUTTI_IN_PLACE
                    : mode == MODE_SAME_PTR ? (const void *)c->recv
                                            : c->send;
    if (mode != MODE_ASYNC)
        return ex ? tutti_exscan(c->comm, s, c->recv, count, dt, op)
                  : tutti_scan(c->comm, s, c->recv, count, dt, op);
    tutti_work_t *w = NULL;
    int st = ex ? tutti_exscan_async(c->comm, s, c->recv, count, dt, op, &w)
                : tutti_scan_async(c->comm, s, c->recv, count, dt, op, &w);
    if (st == TUTTI_OK) {
        st = tutti_wait(w, 60000);
        tutti_work_free(w);
    }
    return st;
}

/* One call: fill the input (in recv for the in-place modes), the rest of recv with
 * garbage and the guard; run; check every element against the reference of the first
 * k = rank + 1 (scan) or rank (exscan) ranks, and rank 0's exscan recvbuf untouched. */
static int one(ctx_t *c, int ex, int mode, size_t count, tutti_dtype_t dt, tutti_redop_t op,
               uint64_t seed)
{
    const int rank = c->rank, k = rank + !ex;
    const size_t es = tutti_dtype_size(dt);
    const int in_recv = mode == MODE_IN_PLACE || mode == MODE_SAME_PTR;
    memset(c->recv, GARBAGE_BYTE, count * es);
    memset(c->recv + count * es, GUARD_BYTE, GUARD_BYTES);
    fill_input(in_recv ? c->recv : c->send, dt, op, rank, count, seed);
    int st = call(c, ex, mode, count, dt, op);
    FAIL_IF(st != TUTTI_OK, "[%s] %s %s %s count %zu (%s): %s", c->set ? c->set : "model",
            ex ? "exscan" : "scan", tutti_dtype_name(dt), tutti_redop_name(op), count,
            mode_names[mode], tutti_comm_last_error(c->comm));
    for (size_t g = 0; g < GUARD_BYTES; g++)
        FAIL_IF(c->recv[count * es + g] != GUARD_BYTE, "%s wrote past recvbuf",
                ex ? "exscan" : "scan");
    if (k == 0) { /* exscan at rank 0: recvbuf as it was (the input, in place) */
        unsigned char e[8];
        for (size_t i = 0; i < count; i++) {
            if (in_recv)
                gen_elem(e, dt, op, 0, i, seed);
            else
                memset(e, GARBAGE_BYTE, es);
            FAIL_IF(memcmp(c->recv + i * es, e, es),
                    "exscan (%s) wrote rank 0's recvbuf "
                    "(element %zu)",
                    mode_names[mode], i);
        }
        return 0;
    }
    unsigned char exp[8];
    for (size_t i = 0; i < count; i++) {
        expected_elem(exp, dt, op, k, i, seed);
        FAIL_IF(memcmp(c->recv + i * es, exp, es),
                "[%s] %s %s %s count %zu (%s): element %zu is %.17g (0x%llx), expected %.17g "
                "(0x%llx)",
                c->set ? c->set : "model", ex ? "exscan" : "scan", tutti_dtype_name(dt),
                tutti_redop_name(op), count, mode_names[mode], i,
                elem_as_double(c->recv + i * es, dt),
                (unsigned long long)elem_bits(c->recv + i * es, es), elem_as_double(exp, dt),
                (unsigned long long)elem_bits(exp, es));
    }
    return 0;
}

/* The affine op, in rank order, through scan and exscan, out of place and in place. */
static int noncommutative(ctx_t *c, tutti_redop_t aff, size_t count)
{
    const int rank = c->rank;
    for (int ex = 0; ex < 2; ex++) {
        for (int in_place = 0; in_place < 2; in_place++) {
            unsigned char *in = in_place ? c->recv : c->send;
            memset(c->recv, GARBAGE_BYTE, count * 8 + GUARD_BYTES);
            for (size_t i = 0; i < count; i++) {
                aff_t m = aff_in(rank, i);
                memcpy(in + i * 8, &m, 8);
            }
            int st = ex ? tutti_exscan(c->comm, in_place ? TUTTI_IN_PLACE : c->send, c->recv, count,
                                       TUTTI_UINT64, aff)
                        : tutti_scan(c->comm, in_place ? TUTTI_IN_PLACE : c->send, c->recv, count,
                                     TUTTI_UINT64, aff);
            FAIL_IF(st != TUTTI_OK, "[%s] affine %s: %s", c->set ? c->set : "model",
                    ex ? "exscan" : "scan", tutti_comm_last_error(c->comm));
            const int k = rank + !ex;
            for (size_t i = 0; i < count && k > 0; i++) {
                aff_t w = aff_in(0, i), got;
                for (int r = 1; r < k; r++)
                    w = aff_then(w, aff_in(r, i));
                memcpy(&got, c->recv + i * 8, 8);
                FAIL_IF(got.a != w.a || got.b != w.b,
                        "[%s] affine %s%s count %zu: element %zu is (%u, %u), expected (%u, %u)",
                        c->set ? c->set : "model", ex ? "exscan" : "scan",
                        in_place ? " in place" : "", count, i, got.a, got.b, w.a, w.b);
            }
            FAIL_IF(c->recv[count * 8] != GARBAGE_BYTE, "affine %s wrote past recvbuf",
                    ex ? "exscan" : "scan");
        }
    }
    return 0;
}

static int rank_scan(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    ctx_t c = { .rank = rank, .nranks = nranks, .set = arg };
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 20000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.algo = c.set;
    o.chunk_bytes = 4096; /* linear's chain in many chunks from 4 KiB */
    FAIL_IF(tutti_comm_init(&c.comm, store, rank, nranks, &o) != 0, "init");
    enum { BIG = 20000 };
    c.send = malloc(BIG * 8);
    c.recv = malloc(BIG * 8 + GUARD_BYTES);
    FAIL_IF(!c.send || !c.recv, "out of memory");

    /* every dtype with every op it takes, each call in the next mode */
    static const size_t counts[] = { 1, 7, 1001 };
    int n_call = 0;
    for (int d = 0; d < 12; d++) {
        tutti_dtype_t dt = d < 8 ? all_dtypes[d] : more_dtypes[d - 8];
        const int nops = is_float(dt) ? (int)ARRAY_SIZE(all_ops) : (int)ARRAY_SIZE(int_ops);
        for (int k = 0; k < nops; k++) {
            tutti_redop_t op = is_float(dt) ? all_ops[k] : int_ops[k];
            for (int ex = 0; ex < 2; ex++)
                for (size_t ci = 0; ci < ARRAY_SIZE(counts); ci++, n_call++)
                    if (one(&c, ex, n_call % MODES, counts[ci], dt, op,
                            (uint64_t)(d * 16 + k) << 8 | (uint64_t)ci))
                        return 1;
        }
    }
    /* many chunks, every mode */
    for (int mode = 0; mode < MODES; mode++)
        for (int ex = 0; ex < 2; ex++)
            if (one(&c, ex, mode, BIG, TUTTI_FP32, TUTTI_SUM, 77) ||
                one(&c, ex, mode, BIG / 2 + 3, TUTTI_INT64, TUTTI_MAX, 78))
                return 1;
    /* nothing to reduce: still a call every rank makes, nothing written */
    for (int ex = 0; ex < 2; ex++)
        if (one(&c, ex, MODE_OUT, 0, TUTTI_FP32, TUTTI_SUM, 1))
            return 1;

    tutti_redop_t aff;
    FAIL_IF(tutti_redop_create(&aff, fn_aff, NULL, 0, "affine") != 0, "create");
    if (noncommutative(&c, aff, 3) || noncommutative(&c, aff, BIG / 2 + 1))
        return 1;
    tutti_redop_free(aff);

    /* the communicator is still good: one allreduce after all that */
    int x = rank + 1;
    FAIL_IF(tutti_allreduce(c.comm, TUTTI_IN_PLACE, &x, 1, TUTTI_INT32, TUTTI_SUM) != 0 ||
                x != nranks * (nranks + 1) / 2,
            "allreduce after the scans: %d", x);
    free(c.send);
    free(c.recv);
    tutti_comm_destroy(c.comm);
    tutti_store_close(store);
    return 0;
}

START_TEST(algorithms)
{
    const int to = th_quick() ? 4 : 5;
    for (int n = 1; n <= to; n++) {
        th_spec_t spec = { .nranks = n,
                           .fn = rank_scan,
                           .arg = (void *)sets[_i],
                           .timeout_ms = 90000,
                           .flags = TH_NO_COMM };
        ck_assert_msg(th_run_ex(&spec, NULL) == 0, "%s on %d ranks failed",
                      sets[_i] ? sets[_i] : "the model's pick", n);
    }
}
END_TEST

/* Rank 0 calls scan, the others exscan (mode 0), or rank 0 passes another count (mode
 * 1): with TUTTI_AGREE_LAG=0 every rank fails in the call, well before the timeout, the
 * message naming both calls. By default (mode 2, as mode 0) a rank whose own messages
 * matched may return from the call (rank 0 of the chain only sends), and fails at the
 * next one instead, naming the scan (the last rank's release, algorithms/handshake.c). */
static int rank_disagree(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)nranks;
    const int mode = (int)(intptr_t)arg;
    int32_t v[64] = { 0 }, out[64];
    double t0 = th_now_ms();
    int st;
    if (mode == 1)
        st = tutti_scan(comm, v, out, rank == 0 ? 64 : 63, TUTTI_INT32, TUTTI_SUM);
    else if (rank == 0)
        st = tutti_scan(comm, v, out, 64, TUTTI_INT32, TUTTI_SUM);
    else
        st = tutti_exscan(comm, v, out, 64, TUTTI_INT32, TUTTI_SUM);
    if (mode == 2 && st == TUTTI_OK) {
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, v, 1, TUTTI_INT32, TUTTI_SUM);
        FAIL_IF(st == TUTTI_OK, "the call after a mismatched scan succeeded");
        FAIL_IF(!strstr(tutti_comm_last_error(comm), "scan"),
                "the later failure does not name "
                "the scan: %s",
                tutti_comm_last_error(comm));
        return 0;
    }
    FAIL_IF(st == TUTTI_OK, "ranks that disagree succeeded");
    const char *m = tutti_comm_last_error(comm);
    FAIL_IF(th_now_ms() - t0 > 10000, "took %.0f ms", th_now_ms() - t0);
    if (mode == 1)
        FAIL_IF(!strstr(m, "count=64") || !strstr(m, "count=63"),
                "message does not name both counts: %s", m);
    else
        FAIL_IF(!strstr(m, "exscan(") || !strstr(m, " scan("),
                "message does not name both calls: %s", m);
    return 0;
}

START_TEST(ranks_disagree)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 30000;
    if (_i < 2)
        o.agree_lag = 0;
    th_spec_t spec = { .nranks = 3,
                       .fn = rank_disagree,
                       .arg = (void *)(intptr_t)_i,
                       .timeout_ms = 60000,
                       .flags = TH_NO_KILL_ON_FAIL,
                       .opts = &o };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* Refused at the call, on one rank, with the reason; the communicator stays good. */
static int rank_args(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    float f[4] = { 1, 2, 3, 4 };
    int st = tutti_scan(comm, f, NULL, 4, TUTTI_FP32, TUTTI_SUM);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || !strstr(tutti_comm_last_error(comm), "scan: recvbuf"),
            "NULL recvbuf: %d %s", st, tutti_comm_last_error(comm));
    st = tutti_exscan(comm, f, f + 1, 2, TUTTI_FP32, TUTTI_SUM);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || !strstr(tutti_comm_last_error(comm), "overlap"),
            "overlapping buffers: %d %s", st, tutti_comm_last_error(comm));
    st = tutti_scan(comm, f, f, 4, TUTTI_FP32, TUTTI_BXOR);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || !strstr(tutti_comm_last_error(comm), "integer"),
            "bxor of floats: %d %s", st, tutti_comm_last_error(comm));
    st = tutti_exscan(comm, f, f, 4, (tutti_dtype_t)99, TUTTI_SUM);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || !strstr(tutti_comm_last_error(comm), "dtype 99"),
            "bad dtype: %d %s", st, tutti_comm_last_error(comm));
    st = tutti_scan_async(comm, f, f, 4, TUTTI_FP32, TUTTI_SUM, NULL);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || !strstr(tutti_comm_last_error(comm), "work_p"),
            "NULL work_p: %d %s", st, tutti_comm_last_error(comm));
    st = tutti_scan(comm, TUTTI_IN_PLACE, f, 4, TUTTI_FP32, (tutti_redop_t)200);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || !strstr(tutti_comm_last_error(comm), "not defined"),
            "undefined op: %d %s", st, tutti_comm_last_error(comm));
    /* TUTTI_AVG: the mean of the ranks reduced */
    double d = rank + 1.0, e;
    st = tutti_exscan(comm, &d, &e, 1, TUTTI_FP64, TUTTI_AVG);
    FAIL_IF(st != 0, "exscan avg: %s", tutti_comm_last_error(comm));
    FAIL_IF(rank > 0 && e != (rank + 1) / 2.0, "exscan avg at rank %d: %g", rank, e);
    st = tutti_scan(comm, TUTTI_IN_PLACE, &d, 1, TUTTI_FP64, TUTTI_AVG);
    FAIL_IF(st != 0 || d != (rank + 2) / 2.0, "scan avg: %g %s", d, tutti_comm_last_error(comm));
    (void)nranks;
    return 0;
}

TH_RUN_TEST(bad_args, th_run(3, rank_args, NULL, 60000))

static Suite *suite(void)
{
    Suite *s = suite_create("scan");
    th_add_case(s, "algorithms", algorithms, (int)ARRAY_SIZE(sets), 240);
    th_add_case(s, "disagree", ranks_disagree, 3, 90);
    th_add_tests(s, "args", 60, (const TTest *const[]){ bad_args, NULL });
    return s;
}

int main(void)
{
    return th_main(suite());
}
