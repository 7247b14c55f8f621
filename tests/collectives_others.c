/* The collectives suite's second half (test_collectives.c has allreduce, broadcast and
 * barrier). Multi-rank correctness of reduce, allgather(v), reduce_scatter(v), gather(v),
 * scatter(v) and alltoall(v), blocking and async: every algorithm of each, rank counts 1..5, every dtype and
 * op for the reductions (a few dtypes of each element size for the data movement),
 * counts {0, 1, 7, 4097} and one larger one, in place and out of place, v forms with
 * uneven and empty blocks and displacements with gaps and out of rank order, against a
 * reference computed here in plain C, bit for bit. Bytes the call must not touch (gaps,
 * past the end, the input out of place) are checked too.
 *
 * The input generation and the reduction reference are ref.c's (floats carry
 * small integers, so every result is exact whatever the order of the reduction).
 * TT_TEST_QUICK=1 shrinks the larger count (for sanitizer builds).
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

/* ---- one rank's matrix ---- */

typedef struct ctx {
    int rank, nranks;
    tutti_comm_t *comm;
    const char *algo;
    unsigned char *send, *recv, *ref;
    size_t cap; /* bytes in each buffer, guard included */
    uint64_t cases;
    int failures;
    int comm_failed;
} ctx_t;

#define MAX_REPORTS 6

TH_DEFINE_STATUS_OK(ctx_t)

/* got vs exp over bytes (es-sized elements); one line naming the first difference */
static int compare(ctx_t *c, const char *what, tutti_dtype_t dt, const unsigned char *got,
                   const unsigned char *exp, size_t bytes)
{
    if (memcmp(got, exp, bytes) == 0)
        return 0;
    const size_t es = tutti_dtype_size(dt);
    size_t i = 0;
    while (i + es <= bytes && memcmp(got + i, exp + i, es) == 0)
        i += es;
    c->failures++;
    if (c->failures <= MAX_REPORTS)
        fprintf(stderr,
                "rank %d/%d [%s] %s %s: element %zu: got %.17g (0x%llx), expected %.17g "
                "(0x%llx)\n",
                c->rank, c->nranks, c->algo, what, tutti_dtype_name(dt), i / es,
                elem_as_double(got + i, dt), (unsigned long long)elem_bits(got + i, es),
                elem_as_double(exp + i, dt), (unsigned long long)elem_bits(exp + i, es));
    return 1;
}

/* The value that rank src contributes as element `key` (data movement: any bits). */
static void gen_val(void *out, tutti_dtype_t dt, int src, size_t key, uint64_t seed)
{
    gen_elem(out, dt, TUTTI_SUM, src, key, seed);
}

/* The key of element j of the block that rank src sends to rank dst (alltoall). */
static size_t a2a_key(int dst, size_t j)
{
    return ((size_t)dst << 24) | j;
}

/* Uneven per-rank counts, some empty: the k-th pattern. */
static size_t vcount(int i, int k)
{
    static const size_t pick[] = { 0, 3, 17, 1000, 1, 4097 };
    return pick[((size_t)i * 5 + (size_t)k) % ARRAY_SIZE(pick)];
}

/* Displacements in reverse rank order with a gap of 2 elements before each block. */
static size_t gappy_displs(int n, const size_t *counts, size_t *displs)
{
    size_t off = 0;
    for (int i = n - 1; i >= 0; i--) {
        off += 2;
        displs[i] = off;
        off += counts[i];
    }
    return off;
}

static size_t packed_displs(int n, const size_t *counts, size_t *displs)
{
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        displs[i] = off;
        off += counts[i];
    }
    return off;
}

/* The v forms' gappy displacements, or packed ones; returns the extent. */
static size_t block_displs(int n, const size_t *counts, int vform, size_t *displs)
{
    return vform ? gappy_displs(n, counts, displs) : packed_displs(n, counts, displs);
}

/* Garbage over bytes, guard bytes after them. */
static void garbage_guarded(unsigned char *buf, size_t bytes)
{
    memset(buf, GARBAGE_BYTE, bytes);
    memset(buf + bytes, GUARD_BYTE, GUARD_BYTES);
}

/* "aliased" (allgather; gather and scatter at the root): sendbuf is the next rank's
 * block in recvbuf (scatter: recvbuf is the next rank's block in sendbuf), so this
 * rank's block must be read before that one lands (scatter: written after it left);
 * reduce_scatter: recvbuf is this rank's block of sendbuf (NCCL's in place) */
static const char *const mode_names[] = { "out-of-place", "in-place", "same-buffer", "aliased" };

/* The layout of a blocks collective (allgather, gather, scatter): the element size, the
 * case's seed, every rank's displacement and the extent. */
typedef struct blocks {
    size_t es, extent, displs[16];
    uint64_t seed;
    char what[128]; /* the case, for messages */
} blocks_t;

/* root -1: a rootless collective (its case names the extent instead) */
/* 1 when this rank is the root (root < 0: none). */
static int blocks_init(ctx_t *c, blocks_t *b, const char *name, tutti_dtype_t dt,
                       const size_t *counts, int vform, int mode, int root)
{
    b->es = tutti_dtype_size(dt);
    b->seed = mix64(++c->cases);
    b->extent = block_displs(c->nranks, counts, vform, b->displs);
    int len = snprintf(b->what, sizeof(b->what), "%s%s %s block %zu", name, vform ? "v" : "",
                       mode_names[mode], counts[c->rank]);
    if (root < 0)
        snprintf(b->what + len, sizeof(b->what) - (size_t)len, " (extent %zu)", b->extent);
    else
        snprintf(b->what + len, sizeof(b->what) - (size_t)len, " root %d", root);
    return root >= 0 && c->rank == root;
}

/* c->ref: every rank's block at its displacement, garbage in the gaps, guard bytes past
 * the extent. */
static void blocks_ref(ctx_t *c, tutti_dtype_t dt, const size_t *counts, const blocks_t *b)
{
    garbage_guarded(c->ref, b->extent * b->es);
    for (int i = 0; i < c->nranks; i++)
        for (size_t j = 0; j < counts[i]; j++)
            gen_val(c->ref + (b->displs[i] + j) * b->es, dt, i, j, b->seed);
}

/* This rank's block for allgather and gather: generated in c->send, or in place (inp) at
 * its displacement in c->recv. Returns the sendbuf (mode 1: TUTTI_IN_PLACE). */
static const void *own_block(ctx_t *c, tutti_dtype_t dt, const size_t *counts, const blocks_t *b,
                             int inp, int mode)
{
    const int me = c->rank;
    unsigned char *in = inp ? c->recv + b->displs[me] * b->es : c->send;
    for (size_t j = 0; j < counts[me]; j++)
        gen_val(in + j * b->es, dt, me, j, b->seed);
    return !inp ? (const void *)c->send : mode == 1 ? TUTTI_IN_PLACE : (const void *)in;
}

/* ---- reduce ---- */

static void t_reduce(ctx_t *c, tutti_dtype_t dt, tutti_redop_t op, size_t count, int root, int mode)
{
    const size_t es = tutti_dtype_size(dt), bytes = count * es;
    const uint64_t seed = mix64(++c->cases);
    const int is_root = c->rank == root;
    char what[96];
    snprintf(what, sizeof(what), "reduce %s %s count %zu root %d", mode_names[mode],
             tutti_redop_name(op), count, root);

    unsigned char *in = is_root && mode ? c->recv : c->send;
    fill_input(in, dt, op, c->rank, count, seed);
    if (is_root && !mode)
        memset(c->recv, GARBAGE_BYTE, bytes);
    memset(c->recv + bytes, GUARD_BYTE, GUARD_BYTES);
    const void *sendbuf = !is_root || mode == 0 ? (const void *)c->send
                          : mode == 1           ? TUTTI_IN_PLACE
                                                : (const void *)c->recv;
    /* non-roots: recvbuf is ignored, NULL out of place */
    void *recvbuf = is_root || mode ? (void *)c->recv : NULL;
    if (!status_ok(c, tutti_reduce(c->comm, sendbuf, recvbuf, count, dt, op, root), what))
        return;
    if (is_root) {
        for (size_t i = 0; i < count; i++)
            expected_elem(c->ref + i * es, dt, op, c->nranks, i, seed);
        if (compare(c, what, dt, c->recv, c->ref, bytes))
            return;
    }
    if (!is_root || !mode) {
        fill_input(c->ref, dt, op, c->rank, count, seed);
        if (compare(c, what, dt, c->send, c->ref, bytes))
            return;
    }
    memset(c->ref, GUARD_BYTE, GUARD_BYTES);
    compare(c, what, dt, c->recv + bytes, c->ref, GUARD_BYTES);
}

/* ---- reduce_scatter(v) ---- */

/* mode 3 ("aliased"): NCCL's in place, recvbuf at this rank's block of sendbuf; the
 * result lands there and the other blocks' input is left as it was. */
static void t_reduce_scatter(ctx_t *c, tutti_dtype_t dt, tutti_redop_t op, const size_t *counts,
                             int vform, int mode)
{
    const int n = c->nranks, me = c->rank;
    const size_t es = tutti_dtype_size(dt);
    const uint64_t seed = mix64(++c->cases);
    size_t displs[16];
    const size_t total = packed_displs(n, counts, displs);
    char what[128];
    snprintf(what, sizeof(what), "reduce_scatter%s %s %s block %zu (total %zu)", vform ? "v" : "",
             mode_names[mode], tutti_redop_name(op), counts[me], total);

    unsigned char *in = mode ? c->recv : c->send;
    fill_input(in, dt, op, me, total, seed);
    const size_t out_bytes = mode ? total * es : counts[me] * es;
    if (!mode)
        memset(c->recv, GARBAGE_BYTE, out_bytes);
    memset(c->recv + out_bytes, GUARD_BYTE, GUARD_BYTES);
    const void *sendbuf = mode == 0   ? (const void *)c->send
                          : mode == 1 ? TUTTI_IN_PLACE
                                      : (const void *)c->recv;
    unsigned char *out = mode == 3 ? c->recv + displs[me] * es : c->recv;
    int st = vform ? tutti_reduce_scatterv(c->comm, sendbuf, out, counts, dt, op)
                   : tutti_reduce_scatter(c->comm, sendbuf, out, counts[0], dt, op);
    if (!status_ok(c, st, what))
        return;
    for (size_t j = 0; j < counts[me]; j++)
        expected_elem(c->ref + j * es, dt, op, n, displs[me] + j, seed);
    if (compare(c, what, dt, out, c->ref, counts[me] * es))
        return;
    if (mode == 0 || mode == 3) {
        /* the input (mode 3: but for the result's block) as it was */
        fill_input(c->ref, dt, op, me, total, seed);
        if (mode == 3)
            memcpy(c->ref + displs[me] * es, out, counts[me] * es);
        if (compare(c, what, dt, in, c->ref, total * es))
            return;
    }
    memset(c->ref, GUARD_BYTE, GUARD_BYTES);
    compare(c, what, dt, c->recv + out_bytes, c->ref, GUARD_BYTES);
}

/* ---- allgather(v) ---- */

static void t_allgather(ctx_t *c, tutti_dtype_t dt, const size_t *counts, int vform, int mode)
{
    blocks_t b;
    blocks_init(c, &b, "allgather", dt, counts, vform, mode, -1);

    garbage_guarded(c->recv, b.extent * b.es);
    const void *sendbuf;
    if (mode == 3) { /* equal blocks only: this rank's fits in the next one's place */
        unsigned char *in = c->recv + b.displs[(c->rank + 1) % c->nranks] * b.es;
        for (size_t j = 0; j < counts[c->rank]; j++)
            gen_val(in + j * b.es, dt, c->rank, j, b.seed);
        sendbuf = in;
    } else {
        sendbuf = own_block(c, dt, counts, &b, mode != 0, mode);
    }
    int st = vform ? tutti_allgatherv(c->comm, sendbuf, c->recv, counts, b.displs, dt)
                   : tutti_allgather(c->comm, sendbuf, c->recv, counts[0], dt);
    if (!status_ok(c, st, b.what))
        return;
    blocks_ref(c, dt, counts, &b);
    compare(c, b.what, dt, c->recv, c->ref, b.extent * b.es + GUARD_BYTES);
}

/* ---- gather(v) ---- */

static void t_gather(ctx_t *c, tutti_dtype_t dt, const size_t *counts, int vform, int root,
                     int mode)
{
    const int me = c->rank;
    blocks_t b;
    const int is_root = blocks_init(c, &b, "gather", dt, counts, vform, mode, root);

    if (is_root)
        garbage_guarded(c->recv, b.extent * b.es);
    /* in place is for the root only */
    const int inp = is_root && mode;
    const void *sendbuf;
    if (mode == 3 && is_root) { /* equal blocks only: the root's fits in the next one's place */
        unsigned char *in = c->recv + b.displs[(me + 1) % c->nranks] * b.es;
        for (size_t j = 0; j < counts[me]; j++)
            gen_val(in + j * b.es, dt, me, j, b.seed);
        sendbuf = in;
    } else {
        sendbuf = own_block(c, dt, counts, &b, inp && mode < 3, mode);
    }
    void *recvbuf = is_root ? (void *)c->recv : NULL;
    int st = vform ? tutti_gatherv(c->comm, sendbuf, counts[me], recvbuf, is_root ? counts : NULL,
                                   is_root ? b.displs : NULL, dt, root)
                   : tutti_gather(c->comm, sendbuf, recvbuf, counts[me], dt, root);
    if (!status_ok(c, st, b.what) || !is_root)
        return;
    blocks_ref(c, dt, counts, &b);
    compare(c, b.what, dt, c->recv, c->ref, b.extent * b.es + GUARD_BYTES);
}

/* ---- scatter(v) ---- */

static void t_scatter(ctx_t *c, tutti_dtype_t dt, const size_t *counts, int vform, int root,
                      int mode)
{
    blocks_t b;
    const int me = c->rank, is_root = blocks_init(c, &b, "scatter", dt, counts, vform, mode, root);

    /* the root's image: blocks, gaps of garbage */
    blocks_ref(c, dt, counts, &b); /* the guard is rewritten below */
    if (is_root)
        memcpy(c->send, c->ref, b.extent * b.es);
    garbage_guarded(c->recv, counts[me] * b.es);
    const int inp = is_root && mode;
    /* aliased: the root's block goes over the next rank's, which is being sent */
    unsigned char *alias = c->send + b.displs[(me + 1) % c->nranks] * b.es;
    void *recvbuf = !inp        ? (void *)c->recv
                    : mode == 1 ? TUTTI_IN_PLACE_OUT
                    : mode == 3 ? (void *)alias
                                : (void *)(c->send + b.displs[me] * b.es);
    const void *sendbuf = is_root ? (const void *)c->send : NULL;
    int st = vform ? tutti_scatterv(c->comm, sendbuf, is_root ? counts : NULL,
                                    is_root ? b.displs : NULL, recvbuf, counts[me], dt, root)
                   : tutti_scatter(c->comm, sendbuf, recvbuf, counts[me], dt, root);
    if (!status_ok(c, st, b.what))
        return;
    if (is_root && mode == 3) {
        compare(c, b.what, dt, alias, c->ref + b.displs[me] * b.es, counts[me] * b.es);
        return;
    }
    if (is_root && compare(c, b.what, dt, c->send, c->ref, b.extent * b.es))
        return; /* the root's sendbuf (its own block, in place) is untouched */
    if (inp)
        return;
    memcpy(c->ref + b.extent * b.es, c->ref + b.displs[me] * b.es, counts[me] * b.es);
    memset(c->ref + (b.extent + counts[me]) * b.es, GUARD_BYTE, GUARD_BYTES);
    compare(c, b.what, dt, c->recv, c->ref + b.extent * b.es, counts[me] * b.es + GUARD_BYTES);
}

/* ---- alltoall(v) ---- */

/* Elements that rank a sends to rank b in pattern k; symmetric when sym. */
static size_t a2a_count(int a, int b, int k, int sym)
{
    return sym ? vcount(a + b, k) : vcount(a * 3 + b, k);
}

/* mode 0-2 as mode_names says; 4: in place on the even ranks, out of place on the odd
 * ones, in one call (a layout of mode 1's shape on every rank) */
static void t_alltoall(ctx_t *c, tutti_dtype_t dt, size_t count, int vk, int mode)
{
    const int n = c->nranks, me = c->rank;
    const size_t es = tutti_dtype_size(dt);
    const uint64_t seed = mix64(++c->cases);
    const int vform = vk >= 0, mixed = mode == 4;
    if (mixed)
        mode = me % 2 ? 0 : 1;
    const int sym = mixed || mode != 0;
    size_t scnt[16], sdsp[16], rcnt[16], rdsp[16];
    for (int j = 0; j < n; j++) {
        scnt[j] = vform ? a2a_count(me, j, vk, sym) : count;
        rcnt[j] = vform ? a2a_count(j, me, vk, sym) : count;
    }
    size_t sext, rext;
    if (vform) {
        sext = gappy_displs(n, scnt, sdsp);
        rext = mode ? gappy_displs(n, rcnt, rdsp) : packed_displs(n, rcnt, rdsp);
    } else {
        sext = packed_displs(n, scnt, sdsp);
        rext = packed_displs(n, rcnt, rdsp);
    }
    char what[128];
    snprintf(what, sizeof(what), "alltoall%s %s%s %s (extent %zu)", vform ? "v" : "",
             mode_names[mode], mixed ? " (in place on even ranks only)" : "",
             vform ? "uneven" : "equal", rext);
    if (!vform)
        snprintf(what + strlen(what), sizeof(what) - strlen(what), " block %zu", count);

    /* in place: the blocks to send sit where the received ones go (one layout) */
    unsigned char *in = mode ? c->recv : c->send;
    const size_t *ind = mode ? rdsp : sdsp;
    size_t iext = mode ? rext : sext;
    memset(in, GARBAGE_BYTE, iext * es);
    if (!mode)
        memset(c->recv, GARBAGE_BYTE, rext * es);
    memset(c->recv + rext * es, GUARD_BYTE, GUARD_BYTES);
    for (int j = 0; j < n; j++)
        for (size_t e = 0; e < scnt[j]; e++)
            gen_val(in + (ind[j] + e) * es, dt, me, a2a_key(j, e), seed);
    const void *sendbuf = mode == 0   ? (const void *)c->send
                          : mode == 1 ? TUTTI_IN_PLACE
                                      : (const void *)c->recv;
    int st;
    if (vform)
        st = tutti_alltoallv(c->comm, sendbuf, mode == 1 ? NULL : scnt,
                             mode == 1 ? NULL : (mode ? rdsp : sdsp), c->recv, rcnt, rdsp, dt);
    else
        st = tutti_alltoall(c->comm, sendbuf, c->recv, count, dt);
    if (!status_ok(c, st, what))
        return;
    memset(c->ref, GARBAGE_BYTE, rext * es);
    memset(c->ref + rext * es, GUARD_BYTE, GUARD_BYTES);
    for (int i = 0; i < n; i++)
        for (size_t e = 0; e < rcnt[i]; e++)
            gen_val(c->ref + (rdsp[i] + e) * es, dt, i, a2a_key(me, e), seed);
    compare(c, what, dt, c->recv, c->ref, rext * es + GUARD_BYTES);
}

/* ---- the matrix ---- */

typedef struct set {
    const char *label;
    const char *algo;     /* TUTTI_ALGO */
    const char *names[6]; /* reduce, allgather, reduce_scatter, gather, scatter, alltoall */
    size_t chunk_bytes;   /* 0: the default */
} set_t;

static const char *const coll_names[6] = { "reduce", "allgather", "reduce_scatter",
                                           "gather", "scatter",   "alltoall" };

static const set_t sets[4] = {
    { "tree/rd/pairwise/tree/tree/ring",
      "reduce:tree;allgather:rd;reduce_scatter:pairwise;gather:tree;scatter:tree;"
      "alltoall:ring",
      { "tree", "rd", "pairwise", "tree", "tree", "ring" },
      4099 },
    { "ring/ring/ring/linear/linear/pairwise",
      "reduce:ring;allgather:ring;reduce_scatter:ring;gather:linear;scatter:linear;"
      "alltoall:pairwise",
      { "ring", "ring", "ring", "linear", "linear", "pairwise" },
      4099 },
    { "linear/linear/linear/tree/linear/bruck",
      "reduce:linear;allgather:linear;reduce_scatter:linear;gather:tree;scatter:linear;"
      "alltoall:bruck",
      { "linear", "linear", "linear", "tree", "linear", "bruck" },
      0 },
    { "ring/pairwise/ring/linear/tree/linear",
      "reduce:ring;allgather:pairwise;reduce_scatter:ring;gather:linear;scatter:tree;"
      "alltoall:linear",
      { "ring", "pairwise", "ring", "linear", "tree", "linear" },
      0 },
};

static const tutti_dtype_t move_dtypes[] = { TUTTI_INT8, TUTTI_BF16, TUTTI_INT32, TUTTI_FP64 };
static const size_t small_counts[] = { 0, 1, 7, 4097 };

static size_t big_count(void)
{
    return th_quick() ? (16u << 10) + 3 : (256u << 10) + 3;
}

static int rank_matrix(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    const set_t *set = arg;
    const int n = nranks;
    const size_t big = big_count();

    /* the override must reach the selection, or this tests some other algorithm */
    static const size_t probe_bytes[] = { 1, 4096, 64 << 20 };
    for (int k = 0; k < 6; k++)
        for (size_t i = 0; i < ARRAY_SIZE(probe_bytes); i++) {
            const char *got = tutti_comm_algo_for(comm, coll_names[k], probe_bytes[i]);
            FAIL_IF(!got || strcmp(got, set->names[k]) != 0, "%s of %zu bytes picks %s, not %s",
                    coll_names[k], probe_bytes[i], got ? got : "NULL", set->names[k]);
        }

    ctx_t c = { .rank = rank, .nranks = n, .comm = comm, .algo = set->label };
    /* the largest extent: n blocks of up to 4097 elements with gaps, or about big; the
     * scatter reference holds an extent and a block */
    c.cap = 2 * ((size_t)n * 4100 + big + 64) * 8 + 2 * GUARD_BYTES;
    c.send = malloc(c.cap);
    c.recv = malloc(c.cap);
    c.ref = malloc(c.cap);
    FAIL_IF(!c.send || !c.recv || !c.ref, "out of memory");
    size_t counts[16];

    for (size_t d = 0; d < ARRAY_SIZE(all_dtypes) && !c.comm_failed; d++) {
        const tutti_dtype_t dt = all_dtypes[d];
        for (size_t o = 0; o < ARRAY_SIZE(all_ops) && !c.comm_failed; o++)
            for (size_t k = 0; k < ARRAY_SIZE(small_counts) && !c.comm_failed; k++) {
                const int mode = (int)((o + k + d) % 3), rs_mode = (int)((o + k + d) % 4);
                t_reduce(&c, dt, all_ops[o], small_counts[k], (int)((d + o + k) % (size_t)n), mode);
                for (int i = 0; i < n; i++)
                    counts[i] = small_counts[k];
                if (!c.comm_failed)
                    t_reduce_scatter(&c, dt, all_ops[o], counts, 0, rs_mode);
                for (int i = 0; i < n; i++)
                    counts[i] = vcount(i, (int)(o + k));
                if (!c.comm_failed)
                    t_reduce_scatter(&c, dt, all_ops[o], counts, 1, (rs_mode + 1) % 4);
            }
        /* the bitwise ops, integer dtypes only (quick: at 4097 elements only) */
        for (size_t o = 0; o < ARRAY_SIZE(bit_ops) && !is_float(dt) && !c.comm_failed; o++)
            for (size_t k = th_quick() ? 3 : 1; k < ARRAY_SIZE(small_counts) && !c.comm_failed;
                 k++) {
                const int mode = (int)((o + k + d) % 3), rs_mode = (int)((o + k + d) % 4);
                t_reduce(&c, dt, bit_ops[o], small_counts[k], (int)((d + o + k) % (size_t)n), mode);
                for (int i = 0; i < n; i++)
                    counts[i] = vcount(i, (int)(o + k));
                if (!c.comm_failed)
                    t_reduce_scatter(&c, dt, bit_ops[o], counts, 1, rs_mode);
            }
        /* larger: sum and avg (the final division) */
        for (int m = 0; m < 2 && !c.comm_failed; m++) {
            tutti_redop_t op = m ? TUTTI_AVG : TUTTI_SUM;
            t_reduce(&c, dt, op, big, (int)(d % (size_t)n), m);
            for (int i = 0; i < n; i++)
                counts[i] = big / (size_t)n + (size_t)i;
            if (!c.comm_failed)
                t_reduce_scatter(&c, dt, op, counts, 1, m);
            for (int i = 0; i < n; i++)
                counts[i] = big / (size_t)n;
            if (!c.comm_failed) /* NCCL's in place, pieces and single copy included */
                t_reduce_scatter(&c, dt, op, counts, (int)(d % 2), 3);
        }
    }
    /* the later integer dtypes: every op, reduce and reduce_scatterv at 7 and 4097
     * (quick: half the ops of each, at 4097) */
    for (size_t d = 0; d < ARRAY_SIZE(more_dtypes) && !c.comm_failed; d++)
        for (size_t o = 0; o < ARRAY_SIZE(int_ops) && !c.comm_failed; o++)
            for (size_t k = th_quick() ? 3 : 2;
                 k < ARRAY_SIZE(small_counts) && !c.comm_failed && !(th_quick() && (o + d) % 2);
                 k++) {
                const tutti_dtype_t dt = more_dtypes[d];
                const tutti_redop_t op = int_ops[o];
                t_reduce(&c, dt, op, small_counts[k], (int)((d + o + k) % (size_t)n),
                         (int)((o + k) % 3));
                for (int i = 0; i < n; i++)
                    counts[i] = vcount(i, (int)(o + k));
                if (!c.comm_failed)
                    t_reduce_scatter(&c, dt, op, counts, 1, (int)((d + o + k) % 4));
            }

    for (size_t d = 0; d < ARRAY_SIZE(move_dtypes) && !c.comm_failed; d++) {
        const tutti_dtype_t dt = move_dtypes[d];
        for (size_t k = 0; k < ARRAY_SIZE(small_counts) && !c.comm_failed; k++) {
            const size_t cnt = small_counts[k];
            for (int i = 0; i < n; i++)
                counts[i] = cnt;
            if (!c.comm_failed)
                t_allgather(&c, dt, counts, 0, 3);
            for (int root = 0; root < n && !c.comm_failed; root++) {
                t_gather(&c, dt, counts, 0, root, 3);
                if (!c.comm_failed)
                    t_scatter(&c, dt, counts, 0, root, 3);
            }
            for (int mode = 0; mode < 3 && !c.comm_failed; mode++) {
                t_allgather(&c, dt, counts, 0, mode);
                if (!c.comm_failed)
                    t_alltoall(&c, dt, cnt, -1, mode);
                if (!c.comm_failed && mode == 2) /* in place on some ranks only */
                    t_alltoall(&c, dt, cnt, -1, 4);
                for (int root = 0; root < n && !c.comm_failed; root++) {
                    /* every root, the modes by turns */
                    if ((root + (int)k) % 3 != mode)
                        continue;
                    t_gather(&c, dt, counts, 0, root, mode);
                    if (!c.comm_failed)
                        t_scatter(&c, dt, counts, 0, root, mode);
                }
            }
        }
        /* v forms: uneven and empty blocks, displacements with gaps in reverse order */
        for (int vk = 0; vk < 3 && !c.comm_failed; vk++) {
            for (int i = 0; i < n; i++)
                counts[i] = vcount(i, vk + (int)d);
            for (int mode = 0; mode < 3 && !c.comm_failed; mode++) {
                const int root = (vk + mode + (int)d) % n;
                t_allgather(&c, dt, counts, 1, mode);
                if (!c.comm_failed)
                    t_gather(&c, dt, counts, 1, root, mode);
                if (!c.comm_failed)
                    t_scatter(&c, dt, counts, 1, root, mode);
                if (!c.comm_failed)
                    t_alltoall(&c, dt, 0, vk + (int)d, mode);
                if (!c.comm_failed && mode == 2)
                    t_alltoall(&c, dt, 0, vk + (int)d, 4);
            }
        }
        /* larger */
        if (!c.comm_failed) {
            for (int i = 0; i < n; i++)
                counts[i] = big / (size_t)n;
            t_allgather(&c, dt, counts, 0, (int)(d % 2));
            if (!c.comm_failed)
                t_allgather(&c, dt, counts, 0, 3);
            if (!c.comm_failed)
                t_gather(&c, dt, counts, 0, (int)(d % (size_t)n), 0);
            if (!c.comm_failed)
                t_gather(&c, dt, counts, 0, (int)((d + 1) % (size_t)n), 3);
            if (!c.comm_failed)
                t_scatter(&c, dt, counts, 0, (int)(d % (size_t)n), 3);
            if (!c.comm_failed)
                t_scatter(&c, dt, counts, 0, (int)((d + 1) % (size_t)n), 0);
            if (!c.comm_failed)
                t_alltoall(&c, dt, big / (size_t)n / (size_t)n, -1, d % 3 == 2 ? 4 : (int)(d % 2));
        }
    }

    free(c.send);
    free(c.recv);
    free(c.ref);
    coll_more_failures(rank, nranks, set->label, c.failures, MAX_REPORTS);
    FAIL_IF(c.failures, "%d failure(s), %llu cases", c.failures, (unsigned long long)c.cases);
    return 0;
}

static void run_matrix(int nranks, const set_t *set)
{
    tutti_comm_opts_t opts;
    ck_assert_int_eq(tutti_comm_opts_init(&opts), TUTTI_OK);
    opts.algo = set->algo;
    /* a chunk size no element size divides, small enough that blocks of the wider types
     * go in several pieces (reduce_scatter) or chunks (reduce ring) */
    if (set->chunk_bytes)
        opts.chunk_bytes = set->chunk_bytes;
    coll_run_matrix(nranks, rank_matrix, (void *)set, &opts, set->label);
}

START_TEST(matrix)
{
    /* _i: 0..19 -> rank counts 1..5, each with every algorithm set */
    run_matrix(_i / (int)ARRAY_SIZE(sets) + 1, &sets[_i % (int)ARRAY_SIZE(sets)]);
}
END_TEST

/* The async forms run in issue order, waited on out of order, with the right results. */
/* ---- hier: allgather and reduce_scatter across hosts (a host id per rank: shm within a
 * host, tcp across), even hosts, interleaved in rank order, and uneven (the ring then) ---- */

static const char *const hier_maps[] = {
    "aabb",     /* 2 hosts of 2 */
    "abab",     /* the same, hosts interleaved in rank order */
    "aabbcc",   /* 3 hosts of 2 */
    "aaabbb",   /* 2 hosts of 3 */
    "aaabb",    /* uneven: the flat ring */
    "abba/tcp", /* tcp alone, within hosts too */
};

typedef struct hier_arg {
    set_t set;
    const char *map;
} hier_arg_t;

/* Blocks of more than 1 MiB go across hosts in segments (reduce_scatter_hier.c), the
 * next one's first step on its way while the last one's ends: blocks of 1.6-2.4 MB
 * (2-3 segments, uneven ones in the v form), every mode, and allgathers of them */
static int hier_segments(int rank, int nranks, tutti_comm_t *comm, const char *label)
{
    const size_t base = th_quick() ? 300000 : 400000;
    ctx_t c = { .rank = rank, .nranks = nranks, .comm = comm, .algo = label };
    c.cap = (size_t)nranks * (base * 3 / 2 + 64) * 4 + GUARD_BYTES;
    c.send = malloc(c.cap);
    c.recv = malloc(c.cap);
    c.ref = malloc(c.cap);
    FAIL_IF(!c.send || !c.recv || !c.ref, "out of memory");
    size_t counts[16];
    for (int mode = 0; mode < 4 && !c.comm_failed; mode++) {
        for (int i = 0; i < nranks; i++)
            counts[i] = base + 13 * (size_t)i;
        t_reduce_scatter(&c, TUTTI_FP32, mode == 2 ? TUTTI_AVG : TUTTI_SUM, counts, 1, mode);
        for (int i = 0; i < nranks && !c.comm_failed; i++)
            counts[i] = base * 3 / 2;
        if (!c.comm_failed)
            t_reduce_scatter(&c, TUTTI_INT32, TUTTI_SUM, counts, 0, mode);
        if (!c.comm_failed)
            t_allgather(&c, TUTTI_INT32, counts, 0, mode);
    }
    free(c.send);
    free(c.recv);
    free(c.ref);
    coll_more_failures(rank, nranks, label, c.failures, MAX_REPORTS);
    FAIL_IF(c.failures, "%d failure(s) in the segmented cases", c.failures);
    return 0;
}

static int rank_hier(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const hier_arg_t *h = arg;
    tutti_store_t *store;
    tutti_comm_t *comm;
    int rc = coll_host_comm(rank, nranks, dir, h->map, h->set.algo, h->set.chunk_bytes, &store,
                            &comm);
    if (rc == 0)
        rc = rank_matrix(rank, nranks, comm, dir, (void *)&h->set);
    if (rc == 0)
        rc = hier_segments(rank, nranks, comm, h->set.label);
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return rc;
}

START_TEST(hier_hosts)
{
    char label[32];
    snprintf(label, sizeof(label), "hier %s", hier_maps[_i]);
    hier_arg_t arg = { .set = { label,
                                "reduce:tree;allgather:hier;reduce_scatter:hier;gather:linear;"
                                "scatter:tree;alltoall:pairwise",
                                { "tree", "hier", "hier", "linear", "tree", "pairwise" },
                                4099 },
                       .map = hier_maps[_i] };
    coll_run_hosts(hier_maps[_i], rank_hier, &arg, label);
}
END_TEST

static int rank_new_async(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    enum { C = 1000 };
    int64_t *ag_in = malloc(C * sizeof(int64_t)), *ag_out = malloc((size_t)nranks * C * 8);
    int64_t *rs_in = malloc((size_t)nranks * C * 8), rs_out[C];
    int64_t a2a_in[8 * 16], a2a_out[8 * 16];
    FAIL_IF(!ag_in || !ag_out || !rs_in, "malloc");
    for (int i = 0; i < C; i++)
        ag_in[i] = rank * 1000003LL + i;
    for (int b = 0; b < nranks; b++)
        for (int i = 0; i < C; i++)
            rs_in[b * C + i] = (rank + 1) * (b * C + i);
    for (int j = 0; j < nranks; j++)
        for (int i = 0; i < 16; i++)
            a2a_in[j * 16 + i] = rank * 1000 + j * 16 + i;
    tutti_work_t *w[3];
    FAIL_IF(tutti_allgather_async(comm, ag_in, ag_out, C, TUTTI_INT64, &w[0]) != 0, "ag");
    FAIL_IF(tutti_reduce_scatter_async(comm, rs_in, rs_out, C, TUTTI_INT64, TUTTI_SUM, &w[1]),
            "rs");
    FAIL_IF(tutti_alltoall_async(comm, a2a_in, a2a_out, 16, TUTTI_INT64, &w[2]) != 0, "a2a");
    for (int k = 2; k >= 0; k--) { /* waiting out of order is fine */
        int st = tutti_wait(w[k], -1);
        FAIL_IF(st != 0, "work %d: %s", k, tutti_work_error(w[k]));
        tutti_work_free(w[k]);
    }
    for (int r = 0; r < nranks; r++)
        for (int i = 0; i < C; i++)
            FAIL_IF(ag_out[r * C + i] != r * 1000003LL + i, "allgather [%d][%d]", r, i);
    int64_t tri = (int64_t)nranks * (nranks + 1) / 2;
    for (int i = 0; i < C; i++)
        FAIL_IF(rs_out[i] != tri * (rank * C + i), "reduce_scatter [%d] = %lld", i,
                (long long)rs_out[i]);
    for (int j = 0; j < nranks; j++)
        for (int i = 0; i < 16; i++)
            FAIL_IF(a2a_out[j * 16 + i] != j * 1000 + rank * 16 + i, "alltoall [%d][%d]", j, i);
    free(ag_in);
    free(ag_out);
    free(rs_in);
    return 0;
}

TH_EACH_TEST(async_other_collectives, 2, 4, rank_new_async, NULL, 30000)

void collectives_others_add(Suite *s)
{
    th_add_case(s, "others_matrix", matrix, 5 * (int)ARRAY_SIZE(sets), 120);
    /* tagged "hosts" as test_collectives.c's hier case (their own transports) */
    tcase_set_tags(th_add_case(s, "others_hier", hier_hosts, (int)ARRAY_SIZE(hier_maps), 120),
                   "hosts");
    th_add_tests(s, "others_async", 90, (const TTest *const[]){ async_other_collectives, NULL });
}
