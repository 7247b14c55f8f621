/* The public entry points of the fourteen collectives and of point-to-point: one
 * descriptor table (a row per collective: its arguments, how its op is laid out, its
 * one-rank, post and AVG steps) and one argument checker every collective goes
 * through. Layout arrays (counts and displacements per rank) are copied into one
 * block the executor owns, so that async calls need not keep the caller's alive. */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "coll/coll.h"
#include "coll/packed.h"
#include "coll/topo.h"
#include "core/comm.h"
#include "device/device.h"
#include "reduce/reduce.h"

/* What a public entry point knows; coll_issue turns it into an op. */
struct tt_coll_call {
    const char *name;    /* in messages: "allreduce", "gather_async" */
    const char *wp_name; /* in the message of a NULL work_p, where not `name` */
    tt_coll_t coll;
    const void *sendbuf;
    void *recvbuf;
    size_t count; /* allreduce, broadcast, reduce: elements; gather: sendcount;
                              scatter: recvcount; alltoall: the block */
    const size_t *sendcounts, *sdispls, *recvcounts, *rdispls; /* user's, may be NULL */
    size_t equal; /* allgather, reduce_scatter: the block; 0 for v forms */
    int is_v;
    tutti_dtype_t dtype;
    tt_derived_t *held_type; /* dtype's derived type, a persistent request's (NULL: looked
                                up by value) */
    tutti_redop_t redop;
    int root;
};

static int fail(tutti_comm_t *comm, const char *name, const char *what)
{
    return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: %s", name, what);
}

/* Whether op o (being filled) is of a derived type's elements */
#define DERIVED(o) ((unsigned)(o)->dtype >= TUTTI_DTYPE_COUNT)

/* sbytes at s and rbytes at r share a byte without s being r: buffers that no
 * algorithm can read as in place (the gathers and scatter handle theirs: algorithms/
 * common.h). Never for a derived type (derived: its send is a copy taken at the call,
 * packed.h, and its buffers may interleave: a column sent, the next one received). */
static int overlap_unequal(int derived, const void *s, size_t sbytes, const void *r, size_t rbytes)
{
    const char *a = s, *b = r;
    return !derived && a && b && a != b && a != (const char *)TUTTI_IN_PLACE && sbytes && rbytes &&
           a < b + rbytes && b < a + sbytes;
}

/* The in-place marker (TUTTI_IN_PLACE and TUTTI_IN_PLACE_OUT are one value) where a
 * call takes a buffer: refused, naming the argument (it would be dereferenced). */
static int marker_misplaced(tutti_comm_t *comm, const char *name, const char *arg)
{
    return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                             "%s: %s is the in-place marker (TUTTI_IN_PLACE), which this rank "
                             "of this call does not take: pass a buffer",
                             name, arg);
}
#define TT_MARKER(p) ((const void *)(p) == TUTTI_IN_PLACE)

/* One buffer (or a send and a receive buffer of the same size): allreduce, broadcast
 * and point-to-point (rname: what the receive buffer is called), of count elements es
 * bytes apart (a derived type's extent: derived). */
static int check_bufs(tutti_comm_t *comm, const char *name, const void *sendbuf, void *recvbuf,
                      size_t count, size_t es, int derived, int need_send, const char *rname)
{
    size_t bytes2;
    /* count > SIZE_MAX / es / 2, without the divisions (every call passes here) */
    if (__builtin_mul_overflow(count, 2 * es, &bytes2))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: count %zu is too large", name,
                                 count);
    if (count == 0)
        return TUTTI_OK;
    if (!recvbuf)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: %s is NULL with count %zu", name,
                                 rname, count);
    if (TT_MARKER(recvbuf))
        return marker_misplaced(comm, name, rname);
    if (need_send && !sendbuf)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "%s: sendbuf is NULL (use TUTTI_IN_PLACE for in place)", name);
    if (overlap_unequal(derived, sendbuf, count * es, recvbuf, count * es))
        return fail(comm, name, "sendbuf and recvbuf overlap without being equal");
    return TUTTI_OK;
}

/* The collectives whose counts add up over the ranks: a quarter of the address space.
 * A block per rank of count (gather, scatter, alltoall: blocks) adds up too. */
static int check_count(tutti_comm_t *comm, const tt_coll_call_t *c, size_t es, int blocks)
{
    size_t b; /* count > SIZE_MAX / es / 4 and the like, without the divisions */
    if (__builtin_mul_overflow(c->count, 4 * es * (blocks ? (size_t)comm->nranks : 1), &b) ||
        __builtin_mul_overflow(c->equal, 4 * es * (size_t)comm->nranks, &b))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: count is too large", c->name);
    return TUTTI_OK;
}

static int cmp_block(const void *a, const void *b, void *ctx)
{
    const size_t *d = ctx;
    size_t x = d[*(const int *)a], y = d[*(const int *)b];
    return x < y ? -1 : x > y;
}

/* Receive blocks (counts, displs) that overlap: two ranks' data would land on the same
 * elements (MPI calls it erroneous; the result would depend on arrival order). Empty
 * blocks overlap nothing. */
static int check_overlap(tutti_comm_t *comm, const char *name, const char *what, int n,
                         const size_t *counts, const size_t *displs, const char *whose)
{
    int *ord = malloc((size_t)n * sizeof(int)), m = 0;
    if (!ord)
        return tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "%s: out of memory", name);
    for (int i = 0; i < n; i++)
        if (counts[i])
            ord[m++] = i;
    qsort_r(ord, (size_t)m, sizeof(int), cmp_block, (void *)displs);
    int st = TUTTI_OK;
    for (int k = 1; k < m && st == TUTTI_OK; k++) {
        int a = ord[k - 1], b = ord[k];
        if (displs[a] + counts[a] > displs[b])
            st = tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                   "%s: %s blocks of %s %d and %d overlap (elements [%zu, %zu) "
                                   "and [%zu, %zu)): each block needs its own place",
                                   name, what, whose, a, b, displs[a], displs[a] + counts[a],
                                   displs[b], displs[b] + counts[b]);
    }
    free(ord);
    return st;
}

/* counts[i] (and displs[i], or prefix sums when displs is NULL) into dst_counts and
 * dst_displs; checks that every block fits in SIZE_MAX bytes, and (recv: a receiving
 * layout) that no two blocks overlap. Returns the extent (the elements a buffer must
 * hold) in *extent_p. */
static int copy_layout(tutti_comm_t *comm, const char *name, const char *what, int n, size_t es,
                       const size_t *counts, const size_t *displs, size_t *dst_counts,
                       size_t *dst_displs, size_t *extent_p, int recv)
{
    size_t extent = 0, sum = 0;
    if (!counts) {
        tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: %s is NULL", name, what);
        return TUTTI_ERR_INVALID_ARG;
    }
    const size_t limit = SIZE_MAX / es / 4;
    for (int i = 0; i < n; i++) {
        size_t d = displs ? displs[i] : sum;
        if (counts[i] > limit || d > limit)
            return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                     "%s: %s[%d] = %zu or its displacement %zu is too large", name,
                                     what, i, counts[i], d);
        dst_counts[i] = counts[i];
        dst_displs[i] = d;
        sum += counts[i];
        if (sum > limit)
            return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: %s sum to too much", name,
                                     what);
        extent = TT_MAX(extent, d + counts[i]);
    }
    if (recv && displs && n > 1) /* (recv 2: the blocks are a topology's sources') */
        TT_CHECK(check_overlap(comm, name, what, n, dst_counts, dst_displs,
                               recv == 2 ? "sources" : "ranks"));
    *extent_p = extent;
    return TUTTI_OK;
}

static void fill_equal(int n, size_t block, size_t *counts, size_t *displs)
{
    for (int i = 0; i < n; i++) {
        counts[i] = block;
        displs[i] = (size_t)i * block;
    }
}

/* ---- per collective: the op's buffers and counts from a call ---- */

/* The small collectives' fills inline into their entry points (with coll_issue), so
 * that their calls' descriptors stay in registers. */
#define TT_HOT static inline __attribute__((always_inline))

/* allreduce (and scan and exscan) */
TT_HOT int fill_allreduce(tutti_comm_t *comm, const tt_coll_call_t *c, tt_op_t *o, size_t *layout)
{
    (void)layout;
    TT_CHECK(check_bufs(comm, c->name, c->sendbuf, c->recvbuf, c->count, o->elem_size, DERIVED(o),
                        1, "recvbuf"));
    o->recvbuf = c->recvbuf;
    o->sendbuf = (c->sendbuf == TUTTI_IN_PLACE || !c->sendbuf) ? c->recvbuf : c->sendbuf;
    o->count = o->env_count = c->count;
    return TUTTI_OK;
}

/* scan and exscan: as allreduce's; their root (the handshake's, algorithms/handshake.c)
 * is the last rank, whose result waited on every other rank's messages */
static int fill_scan(tutti_comm_t *comm, const tt_coll_call_t *c, tt_op_t *o, size_t *layout)
{
    o->root = comm->nranks - 1;
    return fill_allreduce(comm, c, o, layout);
}

TT_HOT int fill_broadcast(tutti_comm_t *comm, const tt_coll_call_t *c, tt_op_t *o, size_t *layout)
{
    (void)layout;
    const int is_root = comm->rank == c->root;
    TT_CHECK(check_bufs(comm, c->name, is_root ? c->sendbuf : NULL, c->recvbuf, c->count,
                        o->elem_size, DERIVED(o), is_root, "recvbuf"));
    o->recvbuf = c->recvbuf;
    o->sendbuf = (!is_root || c->sendbuf == TUTTI_IN_PLACE || !c->sendbuf) ? c->recvbuf
                                                                           : c->sendbuf;
    o->count = o->env_count = c->count;
    return TUTTI_OK;
}

TT_HOT int fill_barrier(tutti_comm_t *comm, const tt_coll_call_t *c, tt_op_t *o, size_t *layout)
{
    (void)comm, (void)c, (void)o, (void)layout;
    return TUTTI_OK;
}

static int fill_reduce(tutti_comm_t *comm, const tt_coll_call_t *c, tt_op_t *o, size_t *layout)
{
    (void)layout;
    TT_CHECK(check_count(comm, c, o->elem_size, 0));
    const int is_root = comm->rank == c->root, in_place = c->sendbuf == TUTTI_IN_PLACE;
    const char *s = in_place ? NULL : c->sendbuf;
    char *r = c->recvbuf;
    o->count = o->env_count = c->count;
    if (c->count && !is_root && in_place)
        return fail(comm, c->name, "TUTTI_IN_PLACE is for the root only");
    if (c->count && !is_root && !s)
        return fail(comm, c->name, "sendbuf is NULL");
    if (c->count && is_root && !r)
        return fail(comm, c->name, "recvbuf is NULL at the root");
    if (c->count && is_root && TT_MARKER(r))
        return marker_misplaced(comm, c->name, "recvbuf");
    if (c->count && is_root && !s && !in_place)
        return fail(comm, c->name, "sendbuf is NULL (use TUTTI_IN_PLACE for in place)");
    if (is_root &&
        overlap_unequal(DERIVED(o), s, c->count * o->elem_size, r, c->count * o->elem_size))
        return fail(comm, c->name, "sendbuf and recvbuf overlap without being equal");
    o->sendbuf = (is_root && (in_place || !s)) ? r : s;
    o->recvbuf = is_root ? r : NULL;
    return TUTTI_OK;
}

/* allgather(v), reduce_scatter(v): a block per rank in recvcounts (displs: where they
 * land, NULL: back to back), or equal blocks; the extent in *ext_p. */
static int block_layout(tutti_comm_t *comm, const tt_coll_call_t *c, size_t es,
                        const size_t *displs, size_t *rc, size_t *rd, size_t *ext_p)
{
    const int n = comm->nranks;
    TT_CHECK(check_count(comm, c, es, 0));
    if (c->is_v)
        return copy_layout(comm, c->name, "recvcounts", n, es, c->recvcounts, displs, rc, rd, ext_p,
                           1);
    fill_equal(n, c->equal, rc, rd);
    *ext_p = (size_t)n * c->equal;
    return TUTTI_OK;
}

static int fill_allgather(tutti_comm_t *comm, const tt_coll_call_t *c, tt_op_t *o, size_t *layout)
{
    const int n = comm->nranks, me = comm->rank, in_place = c->sendbuf == TUTTI_IN_PLACE;
    const size_t es = o->elem_size;
    size_t *rc = layout + 2 * n, *rd = layout + 3 * n, ext;
    char *r = c->recvbuf;
    TT_CHECK(block_layout(comm, c, es, c->rdispls, rc, rd, &ext));
    for (int i = 0; i < n; i++)
        o->count += rc[i];
    o->env_count = o->count;
    if (ext && !r)
        return fail(comm, c->name, "recvbuf is NULL");
    if (ext && TT_MARKER(r))
        return marker_misplaced(comm, c->name, "recvbuf");
    if (rc[me] && !in_place && !c->sendbuf)
        return fail(comm, c->name, "sendbuf is NULL (use TUTTI_IN_PLACE for in place)");
    o->recvbuf = r;
    o->sendbuf = in_place ? r + rd[me] * es : c->sendbuf;
    return TUTTI_OK;
}

static int fill_reduce_scatter(tutti_comm_t *comm, const tt_coll_call_t *c, tt_op_t *o,
                               size_t *layout)
{
    const int n = comm->nranks, me = comm->rank, in_place = c->sendbuf == TUTTI_IN_PLACE;
    const size_t es = o->elem_size;
    size_t *rc = layout + 2 * n, *rd = layout + 3 * n, ext;
    char *r = c->recvbuf;
    TT_CHECK(block_layout(comm, c, es, NULL, rc, rd, &ext));
    o->count = o->env_count = ext;
    /* in place, recvbuf holds the whole input, even where this rank's block is empty */
    if (ext && !r && (rc[me] || in_place))
        return fail(comm, c->name, "recvbuf is NULL");
    if (ext && TT_MARKER(r))
        return marker_misplaced(comm, c->name, "recvbuf");
    if (ext && !in_place && !c->sendbuf)
        return fail(comm, c->name, "sendbuf is NULL (use TUTTI_IN_PLACE for in place)");
    /* NCCL's in place: recvbuf is this rank's block of sendbuf. Run as out of place:
     * both algorithms read the other blocks' input only for messages and partial
     * results, and write recvbuf only by reducing this rank's input into it element by
     * element (tt_reduce3 with dst == a), so the other blocks are left as they were. */
    const int own_block = !in_place && r && c->sendbuf &&
                          (const char *)c->sendbuf + rd[me] * es == r;
    if (!in_place && !own_block &&
        overlap_unequal(DERIVED(o), c->sendbuf, ext * es, r, rc[me] * es))
        return fail(comm, c->name,
                    "sendbuf and recvbuf overlap without being equal (in place: the same "
                    "pointer or TUTTI_IN_PLACE, the result at its start; or recvbuf at "
                    "this rank's block of sendbuf, as NCCL's)");
    o->recvbuf = r;
    o->sendbuf = in_place ? r : c->sendbuf;
    return TUTTI_OK;
}

/* gather(v) and scatter(v): the root's layout (counts/displs, named `what`) into
 * counts/displs, whose extent goes to *ext_p; the root's own block must be the call's
 * count (named `mine`). Elsewhere the layout holds this rank's own block only. */
static int rooted_layout(tutti_comm_t *comm, const tt_coll_call_t *c, tt_op_t *o, const char *what,
                         const char *mine, const size_t *counts, const size_t *displs,
                         size_t *dst_counts, size_t *dst_displs, size_t *ext_p, int recv)
{
    const int n = comm->nranks, me = comm->rank;
    TT_CHECK(check_count(comm, c, o->elem_size, !c->is_v));
    o->count = c->count;
    *ext_p = 0;
    if (!c->is_v) {
        fill_equal(n, c->count, dst_counts, dst_displs);
        *ext_p = (size_t)n * c->count;
        o->env_count = c->count;
        return TUTTI_OK;
    }
    if (me != c->root) {
        dst_counts[me] = c->count;
        return TUTTI_OK;
    }
    TT_CHECK(copy_layout(comm, c->name, what, n, o->elem_size, counts, displs, dst_counts,
                         dst_displs, ext_p, recv));
    if (dst_counts[me] != c->count)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "%s: the root's %s %zu differs from %s[root] = %zu", c->name, mine,
                                 c->count, what, dst_counts[me]);
    return TUTTI_OK;
}

static int fill_gather(tutti_comm_t *comm, const tt_coll_call_t *c, tt_op_t *o, size_t *layout)
{
    const int n = comm->nranks, me = comm->rank, in_place = c->sendbuf == TUTTI_IN_PLACE;
    const int is_root = me == c->root;
    size_t *rd = layout + 3 * n, ext;
    char *r = c->recvbuf;
    TT_CHECK(rooted_layout(comm, c, o, "recvcounts", "sendcount", c->recvcounts, c->rdispls,
                           layout + 2 * n, rd, &ext, 1));
    if (is_root && ext && !r)
        return fail(comm, c->name, "recvbuf is NULL at the root");
    if (is_root && ext && TT_MARKER(r))
        return marker_misplaced(comm, c->name, "recvbuf");
    if (c->count && !in_place && !c->sendbuf)
        return fail(comm, c->name, "sendbuf is NULL");
    if (in_place && !is_root)
        return fail(comm, c->name, "TUTTI_IN_PLACE is for the root only");
    o->recvbuf = is_root ? r : NULL;
    o->sendbuf = in_place ? r + rd[me] * o->elem_size : c->sendbuf;
    return TUTTI_OK;
}

static int fill_scatter(tutti_comm_t *comm, const tt_coll_call_t *c, tt_op_t *o, size_t *layout)
{
    const int n = comm->nranks, me = comm->rank, is_root = me == c->root;
    size_t *sd = layout + n, sext;
    char *r = c->recvbuf;
    TT_CHECK(rooted_layout(comm, c, o, "sendcounts", "recvcount", c->sendcounts, c->sdispls, layout,
                           sd, &sext, 0));
    if (is_root && sext && !c->sendbuf)
        return fail(comm, c->name, "sendbuf is NULL at the root");
    if (is_root && sext && TT_MARKER(c->sendbuf))
        return marker_misplaced(comm, c->name,
                                "sendbuf (in place at the root: recvbuf "
                                "TUTTI_IN_PLACE_OUT)");
    if (c->count && !r)
        return fail(comm, c->name, "recvbuf is NULL");
    if (c->count && !is_root && TT_MARKER(r))
        return fail(comm, c->name, "TUTTI_IN_PLACE_OUT is for the root only");
    o->sendbuf = is_root ? c->sendbuf : NULL;
    o->recvbuf = (is_root && r == TUTTI_IN_PLACE_OUT) ? (char *)c->sendbuf + sd[me] * o->elem_size
                                                      : r;
    return TUTTI_OK;
}

static int fill_alltoall(tutti_comm_t *comm, const tt_coll_call_t *c, tt_op_t *o, size_t *layout)
{
    const int n = comm->nranks, in_place = c->sendbuf == TUTTI_IN_PLACE;
    const size_t es = o->elem_size;
    size_t *sc = layout, *sd = layout + n, *rc = layout + 2 * n, *rd = layout + 3 * n;
    size_t ext, sext;
    char *r = c->recvbuf;
    TT_CHECK(check_count(comm, c, es, !c->is_v));
    if (c->is_v) {
        TT_CHECK(copy_layout(comm, c->name, "recvcounts", n, es, c->recvcounts, c->rdispls, rc, rd,
                             &ext, 1));
        if (!in_place) {
            TT_CHECK(copy_layout(comm, c->name, "sendcounts", n, es, c->sendcounts, c->sdispls, sc,
                                 sd, &sext, 0));
        } else {
            memcpy(sc, rc, (size_t)n * sizeof(size_t));
            memcpy(sd, rd, (size_t)n * sizeof(size_t));
            sext = ext;
        }
    } else {
        fill_equal(n, c->count, rc, rd);
        fill_equal(n, c->count, sc, sd);
        ext = sext = (size_t)n * c->count;
        o->env_count = c->count;
    }
    for (int i = 0; i < n; i++)
        o->count += sc[i];
    if (ext && !r)
        return fail(comm, c->name, "recvbuf is NULL");
    if (ext && TT_MARKER(r))
        return marker_misplaced(comm, c->name, "recvbuf");
    if (sext && !in_place && !c->sendbuf)
        return fail(comm, c->name, "sendbuf is NULL (use TUTTI_IN_PLACE for in place)");
    if (!in_place && overlap_unequal(DERIVED(o), c->sendbuf, sext * es, r, ext * es))
        return fail(comm, c->name, "sendbuf and recvbuf overlap without being equal");
    /* one buffer for both is in place, which needs one layout */
    if (!in_place && c->sendbuf == r && r && c->is_v &&
        (memcmp(sc, rc, (size_t)n * sizeof(size_t)) || memcmp(sd, rd, (size_t)n * sizeof(size_t))))
        return fail(comm, c->name,
                    "sendbuf == recvbuf (in place) with send and receive layouts that differ");
    o->recvbuf = r;
    o->sendbuf = in_place ? r : c->sendbuf;
    return TUTTI_OK;
}

/* neighbor_allgather(v) and neighbor_alltoall(v): layouts per edge, from the topology
 * (sends by destination, receives by source). Not in place (MPI: neither). */
static int fill_neighbor(tutti_comm_t *comm, const tt_coll_call_t *c, tt_op_t *o, size_t *layout)
{
    const tt_topo_t *t = comm->topo;
    if (!t)
        return fail(comm, c->name,
                    "the communicator has no topology (make one with "
                    "tutti_dist_graph_create_adjacent or tutti_cart_create)");
    const int in = t->indeg, out = t->outdeg, gather = c->coll == TT_COLL_NEIGHBOR_ALLGATHER;
    const size_t es = o->elem_size, L = (size_t)(o->sdispls - o->sendcounts);
    size_t *sc = layout, *sd = layout + L, *rc = layout + 2 * L, *rd = layout + 3 * L;
    size_t ext = 0, sext = 0, b;
    if (__builtin_mul_overflow(c->count, 4 * es * (size_t)(TT_MAX(in, out) + 1), &b))
        return fail(comm, c->name, "count is too large");
    if (c->sendbuf == TUTTI_IN_PLACE || c->recvbuf == TUTTI_IN_PLACE)
        return fail(comm, c->name, "TUTTI_IN_PLACE is not taken (MPI's neither)");
    /* (a v form's arrays may be NULL where the degree is 0, as MPI's) */
    if (gather) { /* one block, to every destination */
        for (int i = 0; i < out; i++)
            sc[i] = c->count, sd[i] = 0;
        sext = out ? c->count : 0;
    } else if (!c->is_v) {
        fill_equal(out, c->count, sc, sd);
        sext = (size_t)out * c->count;
    } else if (out) {
        TT_CHECK(copy_layout(comm, c->name, "sendcounts", out, es, c->sendcounts, c->sdispls, sc,
                             sd, &sext, 0));
    }
    if (!c->is_v) {
        fill_equal(in, c->count, rc, rd);
        ext = (size_t)in * c->count;
        o->env_count = c->count;
    } else if (in) {
        TT_CHECK(copy_layout(comm, c->name, "recvcounts", in, es, c->recvcounts, c->rdispls, rc, rd,
                             &ext, 2));
    }
    /* what goes nowhere sends nothing: TUTTI_PROC_NULL's blocks out of the extents */
    for (int i = 0; i < out; i++)
        if (t->dests[i] != TUTTI_PROC_NULL)
            o->count += sc[i];
    /* to itself: each send's size is its receive's (no peer to find the mismatch) */
    for (int j = 0; j < in; j++) {
        const int i = t->self_send[j];
        if (i >= 0 && sc[i] != rc[j])
            return tt_comm_set_error(comm, TUTTI_ERR_MISMATCH,
                                     "%s: the block to itself (destination %d) is %zu x %s, the "
                                     "block from itself (source %d) %zu: they must be equal",
                                     c->name, i, sc[i], tutti_dtype_name(c->dtype), j, rc[j]);
    }
    if (ext && !c->recvbuf)
        return fail(comm, c->name, "recvbuf is NULL");
    if (sext && !c->sendbuf)
        return fail(comm, c->name, "sendbuf is NULL");
    if (overlap_unequal(DERIVED(o), c->sendbuf, sext * es, c->recvbuf, ext * es) ||
        (c->sendbuf && c->sendbuf == c->recvbuf && sext && ext))
        return fail(comm, c->name, "sendbuf and recvbuf overlap (not in place: MPI's neither)");
    o->sendbuf = c->sendbuf;
    o->recvbuf = c->recvbuf;
    return TUTTI_OK;
}

/* ---- TUTTI_AVG: the sum divided by the rank count where it landed ---- */

/* count elements of buf divided by nranks, the input's scaling undone with it */
static void avg_divide(const tt_op_t *op, void *buf, size_t count)
{
    if (op->avg_scale)
        tt_reduce_scale(buf, count, op->dtype, op->avg_scale, (float)op->nranks);
    else
        tt_reduce_avg_finish(buf, count, op->dtype, op->nranks);
}

static void avg_all(tt_op_t *op)
{
    avg_divide(op, op->recvbuf, op->count);
}

static void avg_root(tt_op_t *op)
{
    if (op->rank == op->root)
        avg_all(op);
}

static void avg_own_block(tt_op_t *op)
{
    avg_divide(op, op->recvbuf, op->recvcounts[op->rank]);
}

/* scan: the mean of ranks 0..rank; exscan: of ranks 0..rank-1 (rank 0: none, its
 * recvbuf is not written) */
static void avg_prefix(tt_op_t *op)
{
    const int k = op->rank + (op->coll == TT_COLL_SCAN);
    if (op->avg_scale && k >= 1) /* fp16, fp8: every input was scaled by 1 / avg_scale */
        tt_reduce_scale(op->recvbuf, op->count, op->dtype, op->avg_scale, (float)k);
    else if (k > 1)
        tt_reduce_avg_finish(op->recvbuf, op->count, op->dtype, k);
}

/* ---- the table ---- */

const tt_coll_desc_t tt_coll_table[TT_COLL_COUNT_] = {
    [TT_COLL_ALLREDUCE] = { TT_ARG_REDOP, fill_allreduce, 1, tt_local_copy, NULL, avg_all, 1, 0 },
    [TT_COLL_BROADCAST] = { TT_ARG_ROOT, fill_broadcast, 1, tt_local_copy, tt_post_confirm_release,
                            NULL, 0, 0 },
    [TT_COLL_BARRIER] = { 0, fill_barrier, 0, tt_local_none, NULL, NULL, 0, 0 },
    [TT_COLL_REDUCE] = { TT_ARG_REDOP | TT_ARG_ROOT, fill_reduce, 1, tt_local_copy, tt_post_release,
                         avg_root, 0, 0 },
    [TT_COLL_ALLGATHER] = { TT_ARG_LAYOUT, fill_allgather, 0, tt_local_gather, NULL, NULL, 1, 0 },
    [TT_COLL_REDUCE_SCATTER] = { TT_ARG_REDOP | TT_ARG_LAYOUT, fill_reduce_scatter, 0,
                                 tt_local_reduce_scatter, NULL, avg_own_block, 1, 0 },
    [TT_COLL_GATHER] = { TT_ARG_ROOT | TT_ARG_LAYOUT, fill_gather, 0, tt_local_gather,
                         tt_post_release, NULL, 0, 0 },
    [TT_COLL_SCATTER] = { TT_ARG_ROOT | TT_ARG_LAYOUT, fill_scatter, 0, tt_local_scatter,
                          tt_post_confirm_release, NULL, 0, 0 },
    [TT_COLL_ALLTOALL] = { TT_ARG_LAYOUT, fill_alltoall, 0, tt_local_alltoall, NULL, NULL, 0, 0 },
    [TT_COLL_SCAN] = { TT_ARG_REDOP, fill_scan, 1, tt_local_copy, tt_post_release, avg_prefix, 0,
                       1 },
    [TT_COLL_EXSCAN] = { TT_ARG_REDOP, fill_scan, 1, tt_local_none, tt_post_release, avg_prefix, 0,
                         1 },
    /* (one rank: the algorithm itself, which copies to itself and skips TUTTI_PROC_NULL) */
    [TT_COLL_NEIGHBOR_ALLGATHER] = { TT_ARG_LAYOUT | TT_ARG_EDGES, fill_neighbor, 0,
                                     tt_neighbor_direct, NULL, NULL, 0, 0 },
    [TT_COLL_NEIGHBOR_ALLTOALL] = { TT_ARG_LAYOUT | TT_ARG_EDGES, fill_neighbor, 0,
                                    tt_neighbor_direct, NULL, NULL, 0, 0 },
};

/* ---- the one checker ---- */

/* A blocking call on device buffers with a stream set (tutti_comm_set_stream): enqueued
 * on the stream, issued as an async op whose work handle nobody waits for (the stream
 * does, lib/device/device.c), so it returns at once; where the stream could not be made
 * to wait for it, the call waits. Its layout moves to the heap: the
 * op outlives this stack. */
static int stream_issue(tutti_comm_t *comm, tt_op_t *o, tutti_redop_t redop, size_t *layout,
                        int heap)
{
    int st = tt_dev_stream_check(comm, tt_coll_name(o->coll));
    if (st < 0) {
        char err[64] = "";
        if (o->op_held)
            tt_userop_release(o->redop);
        if (heap)
            free(layout);
        tt_dev_finish(o, st, err, sizeof(err));
        return st;
    }
    /* an aborted or failed communicator: the call fails at once, as without a stream
     * (enqueued, it returned TUTTI_OK and its failure was dropped, the stream error
     * being the first one's; found by review) */
    if (atomic_load(&comm->aborted) || atomic_load(&comm->failed) < 0)
        return tt_exec_issue(comm, o, redop, layout, heap, NULL);
    if (layout && !heap) {
        const size_t n = (size_t)(o->sdispls - o->sendcounts); /* (nranks, or per edge) */
        size_t *h = malloc(4 * n * sizeof(size_t));
        if (!h) { /* no heap copy: as without a stream, once the stream's work is done */
            tt_dev_drain(comm, o);
            return tt_exec_issue(comm, o, redop, layout, heap, NULL);
        }
        memcpy(h, layout, 4 * n * sizeof(size_t));
        o->sendcounts = h;
        o->sdispls = h + n;
        o->recvcounts = h + 2 * n;
        o->rdispls = h + 3 * n;
        layout = h;
    }
    tutti_work_t *w = NULL;
    /* a stream that will not wait for the op: the call does, and returns its error */
    const int held = tt_dev_enqueue(comm, o);
    st = tt_exec_issue(comm, o, redop, layout, 1, held ? &w : NULL);
    if (st == TUTTI_OK && w)
        tutti_work_free(w);
    return st;
}

/* A call's derived type, let go at every return (the cleanup attribute) */
static inline void derived_let_go(tt_derived_t **dt)
{
    if (__builtin_expect(*dt != NULL, 0))
        tt_derived_release(*dt);
}

/* Inlined into each entry point: its collective is then a constant, so the row's
 * reads fold away and the call descriptor never reaches memory (the 4-byte allreduce
 * is ~0.5 us over shm: a few ns count; a call that took its address, as an earlier
 * derived-type path did, had gcc zero it with `rep stosq`: tests/test_hot_path.sh). */
TT_HOT int coll_issue(tutti_comm_t *comm, const tt_coll_call_t *c, tutti_work_t **work_p, int async)
{
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    /* the row first: an opaque call before the descriptor's first read makes gcc build the
     * descriptor in memory (tests/test_hot_path.sh) */
    const tt_coll_desc_t *t = &tt_coll_table[c->coll];
    /* before anything takes a lock (tt_userop_hold's, err_lock) */
    if (tt_comm_foreign_inline(comm))
        return tt_comm_refuse_foreign(comm, c->wp_name ? c->wp_name : c->name, 0);
    if (async && !work_p)
        return fail(comm, c->wp_name ? c->wp_name : c->name, "work_p is NULL");
    const int n = comm->nranks, has_redop = t->args & TT_ARG_REDOP;
    const int has_root = t->args & TT_ARG_ROOT;
    /* a derived type (packed.h): held for the call; its buffers are read in its extents,
     * their overlap left to the packed copies */
    tt_derived_t *dt __attribute__((cleanup(derived_let_go))) = NULL;
    if (__builtin_expect((unsigned)c->dtype >= TUTTI_DTYPE_COUNT, 0) &&
        !(dt = c->held_type ? tt_derived_ref(c->held_type) : tt_derived_hold(c->dtype)))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: invalid dtype %d%s", c->name,
                                 (int)c->dtype, tt_dtype_invalid_hint(c->dtype));
    if (has_redop && !tt_redop_valid(c->redop))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: invalid op %d%s", c->name,
                                 (int)c->redop, tt_redop_invalid_hint(c->redop));
    if (has_redop && dt && dt->base == TUTTI_DTYPE_COUNT)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "%s: %s is made of more than one dtype: a reduction takes a "
                                 "derived type of one predefined dtype",
                                 c->name, dt->name);
    if (has_redop && !tutti_redop_supported(c->redop, dt ? dt->base : c->dtype)) {
        char why[128];
        tt_redop_unsupported(why, sizeof(why), c->redop, dt ? dt->base : c->dtype);
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: %s%s%s", c->name, why,
                                 dt ? ", the dtype of " : "", dt ? dt->name : "");
    }
    if (has_root && (c->root < 0 || c->root >= n))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: root %d is not in [0, %d)",
                                 c->name, c->root, n);
    /* a copy of a zero op, not a memset: gcc makes a constant-size memset of a struct
     * `rep stosq`, ~20 ns a call on this VM's EPYC; the copy is vector moves */
    static const tt_op_t op_zero;
    tt_op_t o = op_zero;
    o.comm = comm;
    o.rank = comm->rank;
    o.nranks = n;
    o.coll = c->coll;
    o.desc = t;
    o.dtype = c->dtype;
    o.elem_size = dt ? dt->extent : tutti_dtype_size(c->dtype);
    o.redop = has_redop && c->redop == TUTTI_AVG ? TUTTI_SUM : c->redop;
    o.root = has_root ? c->root : 0;
    o.chunk_bytes = comm->opts.chunk_bytes;
    /* A blocking call's layout lives on this stack while it runs (no malloc per call) */
    enum { FEW_RANKS = 16 };
    size_t few[4 * FEW_RANKS];
    size_t *layout = NULL;
    /* a layout's arrays: one entry per rank, or per edge (the neighbourhood collectives) */
    const size_t L = (t->args & TT_ARG_EDGES) && comm->topo
                         ? (size_t)TT_MAX(n, TT_MAX(comm->topo->indeg, comm->topo->outdeg))
                         : (size_t)n;
    const int heap = async || L > FEW_RANKS;
    if (t->args & TT_ARG_LAYOUT) {
        if (!heap)
            layout = memset(few, 0, 4 * L * sizeof(size_t));
        else if (!(layout = calloc(4 * L, sizeof(size_t))))
            return TUTTI_ERR_NOMEM;
        o.sendcounts = layout;
        o.sdispls = layout + L;
        o.recvcounts = layout + 2 * L;
        o.rdispls = layout + 3 * L;
    }
    int st = t->fill(comm, c, &o, layout);
    if (st < 0) {
        if (heap)
            free(layout);
        return st;
    }
    /* a defined op stays callable for this call even if freed before it runs */
    if (has_redop && (o.op_held = tt_userop_hold(c->redop)) < 0) {
        if (heap)
            free(layout);
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: invalid op %d%s", c->name,
                                 (int)c->redop, tt_redop_invalid_hint(c->redop));
    }
    if (async == 2) { /* a persistent request's checks (tutti_*_init): nothing issued; the
                         defined op's hold (1) goes to the request */
        if (heap)
            free(layout);
        return o.op_held;
    }
    /* a derived type: its packed form from here on (counts in its predefined dtype, which
     * the fingerprint carries: a rank passing plain elements of it pairs with this one) */
    if (dt && (st = tt_packed_stage_op(comm, &o, dt, c->name)) < 0) {
        if (heap)
            free(layout);
        if (o.op_held)
            tt_userop_release(c->redop);
        return st;
    }
    int layout_fp = c->is_v && (c->coll == TT_COLL_ALLGATHER || c->coll == TT_COLL_REDUCE_SCATTER);
    o.fingerprint = tt_fingerprint(c->coll, o.dtype, has_redop ? c->redop : 0,
                                   layout_fp ? (int)tt_fp_layout(o.recvcounts, comm->nranks)
                                             : o.root) |
                    (c->is_v ? TT_FP_V : 0) |
                    (has_redop && !tt_redop_commutes(c->redop) ? TT_FP_ORDERED : 0);
    /* device buffers: host copies from here on (the copy back at the op's end, exec.c) */
    if (__builtin_expect(comm->dev != NULL, 0)) {
        if ((st = tt_dev_stage_op(comm, &o, !async, c->name)) < 0) {
            if (heap)
                free(layout);
            if (o.op_held)
                tt_userop_release(c->redop);
            return tt_packed_finish(&o, st);
        }
        if (!async && tt_dev_streamed(comm, &o))
            return stream_issue(comm, &o, has_redop ? c->redop : TUTTI_SUM, layout, heap);
    }
    return tt_exec_issue(comm, &o, has_redop ? c->redop : TUTTI_SUM, layout, heap,
                         async ? work_p : NULL);
}

/* ---- the entry points: a call each, then the checker ---- */

/* clang-format cannot read a macro as a function body (it indents all that follows) */
/* clang-format off */
#define SYNC(...)                                                                       \
    {                                                                                   \
        tt_coll_call_t c_ = {__VA_ARGS__};                                              \
        return coll_issue(comm, &c_, NULL, 0);                                          \
    }
#define ASYNC(...)                                                                      \
    {                                                                                   \
        tt_coll_call_t c_ = {__VA_ARGS__};                                              \
        return coll_issue(comm, &c_, work_p, 1);                                        \
    }

#define ALLREDUCE_ARGS(nm)                                                              \
    .name = "allreduce", .wp_name = nm, .coll = TT_COLL_ALLREDUCE, .sendbuf = sendbuf,  \
    .recvbuf = recvbuf, .count = count, .dtype = dtype, .redop = op

int tutti_allreduce(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                    tutti_dtype_t dtype, tutti_redop_t op)
SYNC(ALLREDUCE_ARGS(NULL))

int tutti_allreduce_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                          size_t count, tutti_dtype_t dtype, tutti_redop_t op,
                          tutti_work_t **work_p)
ASYNC(ALLREDUCE_ARGS("allreduce_async"))

#define BROADCAST_ARGS(nm)                                                              \
    .name = "broadcast", .wp_name = nm, .coll = TT_COLL_BROADCAST, .sendbuf = sendbuf,  \
    .recvbuf = recvbuf, .count = count, .dtype = dtype, .root = root

int tutti_broadcast(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                    tutti_dtype_t dtype, int root)
SYNC(BROADCAST_ARGS(NULL))

int tutti_broadcast_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                          size_t count, tutti_dtype_t dtype, int root, tutti_work_t **work_p)
ASYNC(BROADCAST_ARGS("broadcast_async"))

int tutti_barrier(tutti_comm_t *comm)
SYNC(.name = "barrier", .coll = TT_COLL_BARRIER, .dtype = TUTTI_UINT8)

int tutti_barrier_async(tutti_comm_t *comm, tutti_work_t **work_p)
ASYNC(.name = "barrier", .wp_name = "barrier_async", .coll = TT_COLL_BARRIER,
      .dtype = TUTTI_UINT8)

#define REDUCE_ARGS(nm)                                                                 \
    .name = nm, .coll = TT_COLL_REDUCE, .sendbuf = sendbuf, .recvbuf = recvbuf,         \
    .count = count, .dtype = dtype, .redop = op, .root = root

int tutti_reduce(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                 tutti_dtype_t dtype, tutti_redop_t op, int root)
SYNC(REDUCE_ARGS("reduce"))

int tutti_reduce_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                       tutti_dtype_t dtype, tutti_redop_t op, int root, tutti_work_t **work_p)
ASYNC(REDUCE_ARGS("reduce_async"))

#define ALLGATHER_ARGS(nm)                                                              \
    .name = nm, .coll = TT_COLL_ALLGATHER, .sendbuf = sendbuf, .recvbuf = recvbuf,      \
    .dtype = dtype

int tutti_allgather(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                    tutti_dtype_t dtype)
SYNC(ALLGATHER_ARGS("allgather"), .equal = sendcount)

int tutti_allgather_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                          size_t sendcount, tutti_dtype_t dtype, tutti_work_t **work_p)
ASYNC(ALLGATHER_ARGS("allgather_async"), .equal = sendcount)

int tutti_allgatherv(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                     const size_t *recvcounts, const size_t *displs, tutti_dtype_t dtype)
SYNC(ALLGATHER_ARGS("allgatherv"), .is_v = 1, .recvcounts = recvcounts, .rdispls = displs)

int tutti_allgatherv_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                           const size_t *recvcounts, const size_t *displs, tutti_dtype_t dtype,
                           tutti_work_t **work_p)
ASYNC(ALLGATHER_ARGS("allgatherv_async"), .is_v = 1, .recvcounts = recvcounts,
      .rdispls = displs)

#define RS_ARGS(nm)                                                                     \
    .name = nm, .coll = TT_COLL_REDUCE_SCATTER, .sendbuf = sendbuf, .recvbuf = recvbuf, \
    .dtype = dtype, .redop = op

int tutti_reduce_scatter(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                         size_t recvcount, tutti_dtype_t dtype, tutti_redop_t op)
SYNC(RS_ARGS("reduce_scatter"), .equal = recvcount)

int tutti_reduce_scatter_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                               size_t recvcount, tutti_dtype_t dtype, tutti_redop_t op,
                               tutti_work_t **work_p)
ASYNC(RS_ARGS("reduce_scatter_async"), .equal = recvcount)

int tutti_reduce_scatterv(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                          const size_t *recvcounts, tutti_dtype_t dtype, tutti_redop_t op)
SYNC(RS_ARGS("reduce_scatterv"), .is_v = 1, .recvcounts = recvcounts)

int tutti_reduce_scatterv_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                                const size_t *recvcounts, tutti_dtype_t dtype,
                                tutti_redop_t op, tutti_work_t **work_p)
ASYNC(RS_ARGS("reduce_scatterv_async"), .is_v = 1, .recvcounts = recvcounts)

#define GATHER_ARGS(nm)                                                                 \
    .name = nm, .coll = TT_COLL_GATHER, .sendbuf = sendbuf, .recvbuf = recvbuf,         \
    .count = sendcount, .dtype = dtype, .root = root

int tutti_gather(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                 tutti_dtype_t dtype, int root)
SYNC(GATHER_ARGS("gather"))

int tutti_gather_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                       size_t sendcount, tutti_dtype_t dtype, int root, tutti_work_t **work_p)
ASYNC(GATHER_ARGS("gather_async"))

int tutti_gatherv(tutti_comm_t *comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                  const size_t *recvcounts, const size_t *displs, tutti_dtype_t dtype, int root)
SYNC(GATHER_ARGS("gatherv"), .is_v = 1, .recvcounts = recvcounts, .rdispls = displs)

int tutti_gatherv_async(tutti_comm_t *comm, const void *sendbuf, size_t sendcount,
                        void *recvbuf, const size_t *recvcounts, const size_t *displs,
                        tutti_dtype_t dtype, int root, tutti_work_t **work_p)
ASYNC(GATHER_ARGS("gatherv_async"), .is_v = 1, .recvcounts = recvcounts, .rdispls = displs)

#define SCATTER_ARGS(nm)                                                                \
    .name = nm, .coll = TT_COLL_SCATTER, .sendbuf = sendbuf, .recvbuf = recvbuf,        \
    .count = recvcount, .dtype = dtype, .root = root

int tutti_scatter(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                  tutti_dtype_t dtype, int root)
SYNC(SCATTER_ARGS("scatter"))

int tutti_scatter_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                        size_t recvcount, tutti_dtype_t dtype, int root, tutti_work_t **work_p)
ASYNC(SCATTER_ARGS("scatter_async"))

int tutti_scatterv(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                   const size_t *displs, void *recvbuf, size_t recvcount, tutti_dtype_t dtype,
                   int root)
SYNC(SCATTER_ARGS("scatterv"), .is_v = 1, .sendcounts = sendcounts, .sdispls = displs)

int tutti_scatterv_async(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                         const size_t *displs, void *recvbuf, size_t recvcount,
                         tutti_dtype_t dtype, int root, tutti_work_t **work_p)
ASYNC(SCATTER_ARGS("scatterv_async"), .is_v = 1, .sendcounts = sendcounts, .sdispls = displs)

#define A2A_ARGS(nm)                                                                    \
    .name = nm, .coll = TT_COLL_ALLTOALL, .sendbuf = sendbuf, .recvbuf = recvbuf,       \
    .dtype = dtype

int tutti_alltoall(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                   tutti_dtype_t dtype)
SYNC(A2A_ARGS("alltoall"), .count = count)

int tutti_alltoall_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                         tutti_dtype_t dtype, tutti_work_t **work_p)
ASYNC(A2A_ARGS("alltoall_async"), .count = count)

#define A2AV_ARGS(nm)                                                                   \
    A2A_ARGS(nm), .is_v = 1, .sendcounts = sendcounts, .sdispls = sdispls,              \
        .recvcounts = recvcounts, .rdispls = rdispls

int tutti_alltoallv(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                    const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                    const size_t *rdispls, tutti_dtype_t dtype)
SYNC(A2AV_ARGS("alltoallv"))

int tutti_alltoallv_async(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                          const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                          const size_t *rdispls, tutti_dtype_t dtype, tutti_work_t **work_p)
ASYNC(A2AV_ARGS("alltoallv_async"))

#define SCAN_ARGS(nm, cl)                                                               \
    .name = nm, .coll = cl, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,     \
    .dtype = dtype, .redop = op

int tutti_scan(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
               tutti_dtype_t dtype, tutti_redop_t op)
SYNC(SCAN_ARGS("scan", TT_COLL_SCAN))

int tutti_scan_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                     tutti_dtype_t dtype, tutti_redop_t op, tutti_work_t **work_p)
ASYNC(SCAN_ARGS("scan_async", TT_COLL_SCAN))

int tutti_exscan(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                 tutti_dtype_t dtype, tutti_redop_t op)
SYNC(SCAN_ARGS("exscan", TT_COLL_EXSCAN))

int tutti_exscan_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                       tutti_dtype_t dtype, tutti_redop_t op, tutti_work_t **work_p)
ASYNC(SCAN_ARGS("exscan_async", TT_COLL_EXSCAN))

/* ---- point to point ---- */

/* A point-to-point call's dtype: *es_p its elements' distance (a predefined dtype's
 * size, a derived type's extent), *derived_p whether it is derived; an error naming the
 * call for a value that is no dtype. */
static int p2p_dtype(tutti_comm_t *comm, const char *name, tutti_dtype_t dtype,
                     tt_derived_t *held, size_t *es_p, int *derived_p)
{
    *derived_p = (unsigned)dtype >= TUTTI_DTYPE_COUNT;
    if (!*derived_p) {
        *es_p = tutti_dtype_size(dtype);
        return TUTTI_OK;
    }
    tt_derived_t *t = held ? tt_derived_ref(held) : tt_derived_hold(dtype);
    if (!t)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: invalid dtype %d%s", name,
                                 (int)dtype, tt_dtype_invalid_hint(dtype));
    *es_p = t->extent;
    tt_derived_release(t);
    return TUTTI_OK;
}

/* held: dtype's derived type, a persistent request's (NULL: looked up by value) */
static int p2p_issue_held(tutti_comm_t *comm, int kind, const void *buf, size_t count,
                          tutti_dtype_t dtype, int peer, uint32_t tag, tutti_work_t **work_p,
                          int async, int upto, tt_derived_t *held)
{
    const char *name = kind == TUTTI_TP_SEND ? "send" : upto ? "recv_upto" : "recv";
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (tt_comm_foreign_inline(comm)) /* before anything takes a lock */
        return tt_comm_refuse_foreign(comm, name, 0);
    if (async && !work_p)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s_async: work_p is NULL", name);
    int any = peer == TUTTI_ANY_SOURCE && kind == TUTTI_TP_RECV;
    if (!any && peer != TUTTI_PROC_NULL && (peer < 0 || peer >= comm->nranks))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "%s: peer %d is not a rank of [0, %d) nor TUTTI_PROC_NULL%s", name,
                                 peer, comm->nranks,
                                 peer == TUTTI_ANY_SOURCE ? " (any source is for receives)" : "");
    if (kind == TUTTI_TP_SEND && tag == TUTTI_ANY_TAG)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "send: tag TUTTI_ANY_TAG (%u) is for receives and probes; a "
                                 "message's tag is below it",
                                 TUTTI_ANY_TAG);
    size_t es;
    int derived;
    TT_CHECK(p2p_dtype(comm, name, dtype, held, &es, &derived));
    TT_CHECK(check_bufs(comm, name, buf, (void *)buf, count, es, derived, 0, "buf"));
    const char *kind_name; /* its room is filled only as far as the message goes: a device
                              buffer's host copy would be copied back whole */
    if (upto && count && tt_dev_is_device(comm, buf, &kind_name) != 0)
        return tt_comm_set_error(comm, TUTTI_ERR_UNSUPPORTED,
                                 "recv_upto: buf is %s device memory (or its layer cannot tell); "
                                 "it takes host memory only",
                                 kind_name);
    if (async == 2) /* a persistent request's checks (tutti_send_init): nothing issued */
        return TUTTI_OK;
    return tt_exec_issue_p2p(comm, kind, (void *)buf, count, dtype, peer, tag, upto,
                             async ? work_p : NULL, held);
}

static int p2p_issue(tutti_comm_t *comm, int kind, const void *buf, size_t count,
                     tutti_dtype_t dtype, int peer, uint32_t tag, tutti_work_t **work_p,
                     int async, int upto)
{
    return p2p_issue_held(comm, kind, buf, count, dtype, peer, tag, work_p, async, upto, NULL);
}

int tutti_send(tutti_comm_t *comm, const void *buf, size_t count, tutti_dtype_t dtype, int peer,
               uint32_t tag)
{
    return p2p_issue(comm, TUTTI_TP_SEND, buf, count, dtype, peer, tag, NULL, 0, 0);
}

int tutti_send_async(tutti_comm_t *comm, const void *buf, size_t count, tutti_dtype_t dtype,
                     int peer, uint32_t tag, tutti_work_t **work_p)
{
    return p2p_issue(comm, TUTTI_TP_SEND, buf, count, dtype, peer, tag, work_p, 1, 0);
}

int tutti_recv(tutti_comm_t *comm, void *buf, size_t count, tutti_dtype_t dtype, int peer,
               uint32_t tag)
{
    return p2p_issue(comm, TUTTI_TP_RECV, buf, count, dtype, peer, tag, NULL, 0, 0);
}

int tutti_recv_async(tutti_comm_t *comm, void *buf, size_t count, tutti_dtype_t dtype, int peer,
                     uint32_t tag, tutti_work_t **work_p)
{
    return p2p_issue(comm, TUTTI_TP_RECV, buf, count, dtype, peer, tag, work_p, 1, 0);
}

int tutti_recv_upto_async(tutti_comm_t *comm, void *buf, size_t max_count, tutti_dtype_t dtype,
                          int peer, uint32_t tag, tutti_work_t **work_p)
{
    return p2p_issue(comm, TUTTI_TP_RECV, buf, max_count, dtype, peer, tag, work_p, 1, 1);
}

int tutti_recv_upto(tutti_comm_t *comm, void *buf, size_t max_count, tutti_dtype_t dtype, int peer,
                    uint32_t tag, size_t *count_p)
{
    tutti_work_t *w;
    int st = p2p_issue(comm, TUTTI_TP_RECV, buf, max_count, dtype, peer, tag, &w, 1, 2);
    if (st < 0)
        return st;
    st = tt_exec_wait_blocking(w);
    if (st == TUTTI_OK && count_p)
        *count_p = tutti_work_count(w);
    tutti_work_free(w);
    return st;
}

/* tutti_reduce_local of a derived type: both operands packed, reduced as its dtype,
 * the result unpacked into inoutbuf's map */
static int reduce_local_derived(const void *inbuf, void *inoutbuf, size_t count,
                                tutti_dtype_t dtype, tutti_redop_t op)
{
    tt_derived_t *t = tt_derived_hold(dtype);
    if (!t)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "reduce_local: invalid dtype %d%s",
                                   (int)dtype, tt_dtype_invalid_hint(dtype));
    size_t k, bytes = 0;
    const tutti_dtype_t base = tt_packed_dtype(t, &k);
    char *a = NULL, *b = NULL;
    int st = TUTTI_OK;
    if (t->base == TUTTI_DTYPE_COUNT)
        st = tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                 "reduce_local: %s is made of more than one dtype: a reduction "
                                 "takes a derived type of one predefined dtype",
                                 t->name);
    else if (__builtin_mul_overflow(count, t->size, &bytes))
        st = tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "reduce_local: count %zu is too large",
                                 count);
    else if (bytes && (!inbuf || !inoutbuf || TT_MARKER(inbuf) || TT_MARKER(inoutbuf)))
        st = tutti_reduce_local(inbuf, inoutbuf, count, base, op); /* (its message) */
    else if (bytes && (!(a = malloc(bytes)) || !(b = malloc(bytes))))
        st = tt_thread_error_set(TUTTI_ERR_NOMEM, "reduce_local: out of memory for packed "
                                 "copies of %zu bytes", bytes);
    if (st == TUTTI_OK && bytes) {
        tt_derived_pack(t, inbuf, count, a);
        tt_derived_pack(t, inoutbuf, count, b);
    }
    if (st == TUTTI_OK)
        st = tutti_reduce_local(a, b, count * k, base, op);
    if (st == TUTTI_OK && bytes)
        tt_derived_unpack(t, b, bytes, inoutbuf, count);
    free(a);
    free(b);
    tt_derived_release(t);
    return st;
}

int tutti_reduce_local(const void *inbuf, void *inoutbuf, size_t count, tutti_dtype_t dtype,
                       tutti_redop_t op)
{
    if ((unsigned)dtype >= TUTTI_DTYPE_COUNT)
        return reduce_local_derived(inbuf, inoutbuf, count, dtype, op);
    if (op == TUTTI_AVG)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                   "reduce_local: op avg is a mean over the ranks, not of two "
                                   "vectors (reduce with sum, then divide)");
    if (!tt_redop_valid(op))
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "reduce_local: invalid op %d%s",
                                   (int)op, tt_redop_invalid_hint(op));
    if (!tutti_redop_supported(op, dtype)) {
        char why[128];
        tt_redop_unsupported(why, sizeof(why), op, dtype);
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "reduce_local: %s", why);
    }
    size_t es = tutti_dtype_size(dtype), bytes;
    if (__builtin_mul_overflow(count, es, &bytes))
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "reduce_local: count %zu is too large",
                                   count);
    if (count && (!inbuf || !inoutbuf || TT_MARKER(inbuf) || TT_MARKER(inoutbuf)))
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "reduce_local: %s is %s",
                                   !inbuf || TT_MARKER(inbuf) ? "inbuf" : "inoutbuf",
                                   !inbuf || !inoutbuf ? "NULL" : "the in-place marker");
    int held = tt_userop_hold(op); /* a defined op stays callable while it runs */
    if (held < 0)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "reduce_local: invalid op %d%s",
                                   (int)op, tt_redop_invalid_hint(op));
    if (count)
        tt_reduce3(inoutbuf, inbuf, inoutbuf, count, dtype, op);
    if (held)
        tt_userop_release(op);
    return TUTTI_OK;
}

/* tutti_sendrecv with MPI_Sendrecv's status: the receive's source, tag, count, dtype */
static int sendrecv_with(tutti_comm_t *comm, const void *sendbuf, size_t sendcount,
                         tutti_dtype_t sendtype, int dest, uint32_t sendtag, void *recvbuf,
                         size_t recvcount, tutti_dtype_t recvtype, int source, uint32_t recvtag,
                         int *source_p, tutti_msg_info_t *info)
{
    tutti_work_t *ws, *wr;
    int st = p2p_issue(comm, TUTTI_TP_SEND, sendbuf, sendcount, sendtype, dest, sendtag, &ws, 1, 0);
    if (st < 0)
        return st;
    st = p2p_issue(comm, TUTTI_TP_RECV, recvbuf, recvcount, recvtype, source, recvtag, &wr, 1, 0);
    if (st < 0) { /* (said in last_error) the send goes on: wait for it, its failure unsaid */
        tutti_wait(ws, -1);
        tutti_work_free(ws);
        return st;
    }
    /* the receive first: its failure is the one to tell (a failed exchange fails both,
     * the send's then only repeating it) */
    int rst = tt_exec_wait_blocking(wr);
    if (rst == TUTTI_OK && source_p)
        *source_p = tutti_work_source(wr);
    if (rst == TUTTI_OK && info)
        rst = tutti_work_info(wr, info);
    int sst = rst < 0 ? tutti_wait(ws, -1) : tt_exec_wait_blocking(ws);
    tutti_work_free(wr);
    tutti_work_free(ws);
    return rst < 0 ? rst : sst;
}

int tutti_sendrecv(tutti_comm_t *comm, const void *sendbuf, size_t sendcount,
                   tutti_dtype_t sendtype, int dest, uint32_t sendtag, void *recvbuf,
                   size_t recvcount, tutti_dtype_t recvtype, int source, uint32_t recvtag,
                   int *source_p)
{
    return sendrecv_with(comm, sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount,
                         recvtype, source, recvtag, source_p, NULL);
}

int tutti_sendrecv_info(tutti_comm_t *comm, const void *sendbuf, size_t sendcount,
                        tutti_dtype_t sendtype, int dest, uint32_t sendtag, void *recvbuf,
                        size_t recvcount, tutti_dtype_t recvtype, int source, uint32_t recvtag,
                        tutti_msg_info_t *info)
{
    return sendrecv_with(comm, sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount,
                         recvtype, source, recvtag, NULL, info);
}

int tutti_sendrecv_replace(tutti_comm_t *comm, void *buf, size_t count, tutti_dtype_t dtype,
                           int dest, uint32_t sendtag, int source, uint32_t recvtag,
                           int *source_p)
{
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (tt_comm_foreign_inline(comm))
        return tt_comm_refuse_foreign(comm, "sendrecv_replace", 0);
    size_t es;
    int derived;
    TT_CHECK(p2p_dtype(comm, "sendrecv_replace", dtype, NULL, &es, &derived));
    TT_CHECK(check_bufs(comm, "sendrecv_replace", buf, buf, count, es, derived, 0, "buf"));
    const char *kind; /* its copy is a host one */
    if (count && tt_dev_is_device(comm, buf, &kind) != 0)
        return tt_comm_set_error(comm, TUTTI_ERR_UNSUPPORTED,
                                 "sendrecv_replace: buf is %s device memory (or its layer cannot "
                                 "tell); it takes host memory only (tutti_sendrecv takes both)",
                                 kind);
    /* a derived type's send is its packed copy, taken when the send is issued (packed.h),
     * before the receive is: that is the copy */
    if (derived)
        return tutti_sendrecv(comm, buf, count, dtype, dest, sendtag, buf, count, dtype, source,
                              recvtag, source_p);
    size_t bytes = count * es;
    void *copy = bytes ? malloc(bytes) : NULL;
    if (bytes && !copy)
        return tt_comm_set_error(comm, TUTTI_ERR_NOMEM,
                                 "sendrecv_replace: out of memory for a copy of %zu bytes", bytes);
    if (bytes)
        memcpy(copy, buf, bytes);
    int st = tutti_sendrecv(comm, copy, count, dtype, dest, sendtag, buf, count, dtype, source,
                            recvtag, source_p);
    free(copy);
    return st;
}

static int probe_issue(tutti_comm_t *comm, int once, int peer, uint32_t tag, int *flag_p,
                       int *source_p, size_t *count_p, tutti_dtype_t *dtype_p, int matched,
                       tutti_message_t **msg_p, uint32_t *tag_p)
{
    const char *name = matched ? (once ? "improbe" : "mprobe") : once ? "iprobe" : "probe";
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (tt_comm_foreign_inline(comm))
        return tt_comm_refuse_foreign(comm, name, 0);
    if (once && !flag_p)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: flag_p is NULL", name);
    if (matched && !msg_p)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: msg_p is NULL", name);
    if (peer == TUTTI_PROC_NULL) { /* MPI's: found at once, a message of nothing */
        if (matched) {
            tutti_message_t *m = calloc(1, sizeof(*m));
            if (!m)
                return tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "%s: out of memory", name);
            *m = (tutti_message_t){ .rank = comm->rank, .source = TUTTI_PROC_NULL, .tag = tag,
                                    .dtype = TUTTI_UINT8 };
            *msg_p = m;
        }
        if (flag_p)
            *flag_p = 1;
        if (source_p)
            *source_p = TUTTI_PROC_NULL;
        if (tag_p)
            *tag_p = TUTTI_ANY_TAG;
        if (count_p)
            *count_p = 0;
        if (dtype_p)
            *dtype_p = TUTTI_UINT8;
        return TUTTI_OK;
    }
    if (peer != TUTTI_ANY_SOURCE && (peer < 0 || peer >= comm->nranks))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "%s: peer %d is not a rank of [0, %d), TUTTI_ANY_SOURCE nor "
                                 "TUTTI_PROC_NULL",
                                 name, peer, comm->nranks);
    return tt_exec_probe(comm, name, peer, tag, once, flag_p, source_p, tag_p, count_p, dtype_p,
                         msg_p);
}

int tutti_probe_info(tutti_comm_t *comm, int peer, uint32_t tag, int *flag_p,
                       tutti_msg_info_t *info)
{
    if (flag_p)
        *flag_p = 0;
    tutti_msg_info_t got = { .source = -1, .tag = TUTTI_ANY_TAG, .dtype = TUTTI_UINT8 };
    int found = 0;
    int st = probe_issue(comm, flag_p != NULL, peer, tag, &found, &got.source, &got.count,
                         &got.dtype, 0, NULL, &got.tag);
    if (st == TUTTI_OK && flag_p)
        *flag_p = found;
    if (st == TUTTI_OK && found && info)
        *info = got;
    return st;
}

int tutti_probe(tutti_comm_t *comm, int peer, uint32_t tag, int *source_p, size_t *count_p,
                tutti_dtype_t *dtype_p)
{
    return probe_issue(comm, 0, peer, tag, NULL, source_p, count_p, dtype_p, 0, NULL, NULL);
}

int tutti_iprobe(tutti_comm_t *comm, int peer, uint32_t tag, int *flag_p, int *source_p,
                 size_t *count_p, tutti_dtype_t *dtype_p)
{
    if (flag_p)
        *flag_p = 0;
    return probe_issue(comm, 1, peer, tag, flag_p, source_p, count_p, dtype_p, 0, NULL, NULL);
}

int tutti_mprobe(tutti_comm_t *comm, int peer, uint32_t tag, tutti_message_t **msg_p,
                 int *source_p, size_t *count_p, tutti_dtype_t *dtype_p)
{
    if (msg_p)
        *msg_p = NULL;
    return probe_issue(comm, 0, peer, tag, NULL, source_p, count_p, dtype_p, 1, msg_p, NULL);
}

int tutti_improbe(tutti_comm_t *comm, int peer, uint32_t tag, int *flag_p,
                  tutti_message_t **msg_p, int *source_p, size_t *count_p,
                  tutti_dtype_t *dtype_p)
{
    if (flag_p)
        *flag_p = 0;
    if (msg_p)
        *msg_p = NULL;
    return probe_issue(comm, 1, peer, tag, flag_p, source_p, count_p, dtype_p, 1, msg_p, NULL);
}
/* clang-format on */

/* ---- persistent requests (MPI_Send_init, MPI_Recv_init, MPI-4's MPI_Allreduce_init...):
 * a call's arguments checked once and kept; each tutti_start issues it as its _async form
 * would, the round's work the request's own ---- */

struct tutti_request {
    tutti_comm_t *comm; /* a reference: the communicator outlives the request */
    int kind;           /* TUTTI_TP_SEND or TUTTI_TP_RECV; -1: a collective (call) */
    tt_coll_call_t call;
    void *buf;
    size_t count;
    tutti_dtype_t dtype;
    int peer;
    uint32_t tag;
    tutti_work_t *work; /* the round started last (NULL: never started) */
    int op_held;        /* a defined op held from init to free: its number is not handed
                           out again while the request may start it (a freed op's start
                           is refused, not run as another op made later: review) */
    tt_derived_t *type; /* its derived type, held from init to free (MPI lets the caller
                           free the type once the request is made; its value may then be
                           made again, and the request goes on with the type it was
                           made with, which its works report under the caller's value) */
};

/* A request's hold on its derived type (none for a predefined dtype). */
static int request_hold_type(tutti_comm_t *comm, tutti_request_t *r)
{
    tutti_dtype_t d = r->kind < 0 ? r->call.dtype : r->dtype;
    if ((unsigned)d < TUTTI_DTYPE_COUNT)
        return TUTTI_OK;
    if (!(r->type = tt_derived_hold(d))) /* (freed since its checks, by another thread) */
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s_init: invalid dtype %d",
                                 r->kind < 0                ? r->call.name
                                 : r->kind == TUTTI_TP_SEND ? "send"
                                                            : "recv",
                                 (int)d);
    r->call.held_type = r->type;
    return TUTTI_OK;
}

static int request_new(tutti_comm_t *comm, const tt_coll_call_t *c, int kind, void *buf,
                       size_t count, tutti_dtype_t dtype, int peer, uint32_t tag,
                       tutti_request_t **req_p)
{
    tutti_request_t *r = calloc(1, sizeof(*r));
    if (!r)
        return tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "%s_init: out of memory",
                                 c                       ? c->name
                                 : kind == TUTTI_TP_SEND ? "send"
                                                         : "recv");
    *r = (tutti_request_t){ .comm = comm,
                            .kind = kind,
                            .buf = buf,
                            .count = count,
                            .dtype = dtype,
                            .peer = peer,
                            .tag = tag };
    if (c)
        r->call = *c;
    int st = request_hold_type(comm, r);
    if (st < 0) {
        free(r);
        return st;
    }
    atomic_fetch_add(&comm->refs, 1); /* (tt_exec_comm_unref at the request's free) */
    *req_p = r;
    return TUTTI_OK;
}

static int coll_persist(tutti_comm_t *comm, const tt_coll_call_t *c, tutti_request_t **req_p)
{
    if (req_p)
        *req_p = NULL;
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (!req_p)
        return fail(comm, c->wp_name ? c->wp_name : c->name, "req_p is NULL");
    tutti_work_t *unused = NULL;
    int held = coll_issue(comm, c, &unused, 2); /* its checks; 1: a defined op, held */
    if (held < 0)
        return held;
    int st = request_new(comm, c, -1, NULL, 0, c->dtype, 0, 0, req_p);
    if (st < 0 && held)
        tt_userop_release(c->redop);
    else if (st == TUTTI_OK)
        (*req_p)->op_held = held;
    return st;
}

static int p2p_persist(tutti_comm_t *comm, int kind, const void *buf, size_t count,
                       tutti_dtype_t dtype, int peer, uint32_t tag, tutti_request_t **req_p)
{
    if (req_p)
        *req_p = NULL;
    if (comm && !req_p)
        return fail(comm, kind == TUTTI_TP_SEND ? "send_init" : "recv_init", "req_p is NULL");
    tutti_work_t *unused = NULL;
    int st = p2p_issue(comm, kind, buf, count, dtype, peer, tag, &unused, 2, 0); /* its checks */
    return st < 0 ? st : request_new(comm, NULL, kind, (void *)buf, count, dtype, peer, tag, req_p);
}

int tutti_start(tutti_request_t *req)
{
    if (!req)
        return TUTTI_ERR_INVALID_ARG;
    tutti_comm_t *comm = req->comm;
    const char *name = req->kind < 0                ? req->call.name
                       : req->kind == TUTTI_TP_SEND ? "send"
                                                    : "recv";
    if (atomic_load(&comm->gone))
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                   "start: the persistent %s's communicator was destroyed", name);
    if (req->work) {
        int done = 0;
        if (tutti_test(req->work, &done) == TUTTI_OK && !done)
            return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                     "start: the persistent %s is still active: its last round "
                                     "has not finished (MPI_Start of an active request)",
                                     name);
        tutti_work_free(req->work);
        req->work = NULL;
    }
    if (req->kind >= 0)
        return p2p_issue_held(comm, req->kind, req->buf, req->count, req->dtype, req->peer,
                              req->tag, &req->work, 1, 0, req->type);
    return coll_issue(comm, &req->call, &req->work, 1);
}

int tutti_start_all(size_t n, tutti_request_t *const *reqs)
{
    if (n && !reqs)
        return TUTTI_ERR_INVALID_ARG;
    for (size_t i = 0; i < n; i++) {
        int st = reqs[i] ? tutti_start(reqs[i]) : TUTTI_OK;
        if (st < 0)
            return st;
    }
    return TUTTI_OK;
}

tutti_work_t *tutti_request_work(const tutti_request_t *req)
{
    return req ? req->work : NULL;
}

void tutti_request_free(tutti_request_t *req)
{
    if (!req)
        return;
    if (req->work) /* (safe while it runs: the round completes on its own) */
        tutti_work_free(req->work);
    if (req->op_held) /* (the round holds its own while it runs) */
        tt_userop_release(req->call.redop);
    tt_derived_release(req->type); /* (a round holds its own while it runs) */
    tt_exec_comm_unref(req->comm);
    free(req);
}

/* clang-format off */
#define INIT(...)                                                                       \
    {                                                                                   \
        tt_coll_call_t c_ = {__VA_ARGS__};                                              \
        return coll_persist(comm, &c_, req_p);                                          \
    }

int tutti_send_init(tutti_comm_t *comm, const void *buf, size_t count, tutti_dtype_t dtype,
                    int peer, uint32_t tag, tutti_request_t **req_p)
{
    return p2p_persist(comm, TUTTI_TP_SEND, buf, count, dtype, peer, tag, req_p);
}

int tutti_recv_init(tutti_comm_t *comm, void *buf, size_t count, tutti_dtype_t dtype, int peer,
                    uint32_t tag, tutti_request_t **req_p)
{
    return p2p_persist(comm, TUTTI_TP_RECV, buf, count, dtype, peer, tag, req_p);
}

int tutti_allreduce_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                         tutti_dtype_t dtype, tutti_redop_t op, tutti_request_t **req_p)
INIT(ALLREDUCE_ARGS("allreduce_init"))

int tutti_broadcast_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                         tutti_dtype_t dtype, int root, tutti_request_t **req_p)
INIT(BROADCAST_ARGS("broadcast_init"))

int tutti_reduce_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                      tutti_dtype_t dtype, tutti_redop_t op, int root, tutti_request_t **req_p)
INIT(REDUCE_ARGS("reduce"))

int tutti_allgather_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                         size_t sendcount, tutti_dtype_t dtype, tutti_request_t **req_p)
INIT(ALLGATHER_ARGS("allgather"), .equal = sendcount)

int tutti_reduce_scatter_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                              size_t recvcount, tutti_dtype_t dtype, tutti_redop_t op,
                              tutti_request_t **req_p)
INIT(RS_ARGS("reduce_scatter"), .equal = recvcount)

int tutti_alltoall_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                        tutti_dtype_t dtype, tutti_request_t **req_p)
INIT(A2A_ARGS("alltoall"), .count = count)

int tutti_gather_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                      tutti_dtype_t dtype, int root, tutti_request_t **req_p)
INIT(GATHER_ARGS("gather"))

int tutti_scatter_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                       tutti_dtype_t dtype, int root, tutti_request_t **req_p)
INIT(SCATTER_ARGS("scatter"))

int tutti_allgatherv_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                          const size_t *recvcounts, const size_t *displs, tutti_dtype_t dtype,
                          tutti_request_t **req_p)
INIT(ALLGATHER_ARGS("allgatherv"), .is_v = 1, .recvcounts = recvcounts, .rdispls = displs)

int tutti_reduce_scatterv_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                               const size_t *recvcounts, tutti_dtype_t dtype, tutti_redop_t op,
                               tutti_request_t **req_p)
INIT(RS_ARGS("reduce_scatterv"), .is_v = 1, .recvcounts = recvcounts)

int tutti_gatherv_init(tutti_comm_t *comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                       const size_t *recvcounts, const size_t *displs, tutti_dtype_t dtype,
                       int root, tutti_request_t **req_p)
INIT(GATHER_ARGS("gatherv"), .is_v = 1, .recvcounts = recvcounts, .rdispls = displs)

int tutti_scatterv_init(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                        const size_t *displs, void *recvbuf, size_t recvcount, tutti_dtype_t dtype,
                        int root, tutti_request_t **req_p)
INIT(SCATTER_ARGS("scatterv"), .is_v = 1, .sendcounts = sendcounts, .sdispls = displs)

int tutti_alltoallv_init(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                         const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                         const size_t *rdispls, tutti_dtype_t dtype, tutti_request_t **req_p)
INIT(A2AV_ARGS("alltoallv"))

int tutti_scan_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                    tutti_dtype_t dtype, tutti_redop_t op, tutti_request_t **req_p)
INIT(SCAN_ARGS("scan", TT_COLL_SCAN))

int tutti_exscan_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                      tutti_dtype_t dtype, tutti_redop_t op, tutti_request_t **req_p)
INIT(SCAN_ARGS("exscan", TT_COLL_EXSCAN))

int tutti_barrier_init(tutti_comm_t *comm, tutti_request_t **req_p)
INIT(.name = "barrier", .wp_name = "barrier_init", .coll = TT_COLL_BARRIER, .dtype = TUTTI_UINT8)

/* the neighbourhood collectives (topo.h) */
#define NAG_ARGS(nm)                                                                    \
    .name = nm, .coll = TT_COLL_NEIGHBOR_ALLGATHER, .sendbuf = sendbuf,                 \
    .recvbuf = recvbuf, .dtype = dtype
#define NAGV_ARGS(nm)                                                                   \
    NAG_ARGS(nm), .count = sendcount, .is_v = 1, .recvcounts = recvcounts, .rdispls = displs
#define NA2A_ARGS(nm)                                                                   \
    .name = nm, .coll = TT_COLL_NEIGHBOR_ALLTOALL, .sendbuf = sendbuf, .recvbuf = recvbuf, \
    .dtype = dtype
#define NA2AV_ARGS(nm)                                                                  \
    NA2A_ARGS(nm), .is_v = 1, .sendcounts = sendcounts, .sdispls = sdispls,             \
        .recvcounts = recvcounts, .rdispls = rdispls

int tutti_neighbor_allgather(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                             tutti_dtype_t dtype)
SYNC(NAG_ARGS("neighbor_allgather"), .count = count)

int tutti_neighbor_allgather_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, tutti_dtype_t dtype, tutti_work_t **work_p)
ASYNC(NAG_ARGS("neighbor_allgather_async"), .count = count)

int tutti_neighbor_allgather_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                                  size_t count, tutti_dtype_t dtype, tutti_request_t **req_p)
INIT(NAG_ARGS("neighbor_allgather"), .count = count)

int tutti_neighbor_allgatherv(tutti_comm_t *comm, const void *sendbuf, size_t sendcount,
                              void *recvbuf, const size_t *recvcounts, const size_t *displs,
                              tutti_dtype_t dtype)
SYNC(NAGV_ARGS("neighbor_allgatherv"))

int tutti_neighbor_allgatherv_async(tutti_comm_t *comm, const void *sendbuf, size_t sendcount,
                                    void *recvbuf, const size_t *recvcounts,
                                    const size_t *displs, tutti_dtype_t dtype,
                                    tutti_work_t **work_p)
ASYNC(NAGV_ARGS("neighbor_allgatherv_async"))

int tutti_neighbor_allgatherv_init(tutti_comm_t *comm, const void *sendbuf, size_t sendcount,
                                   void *recvbuf, const size_t *recvcounts, const size_t *displs,
                                   tutti_dtype_t dtype, tutti_request_t **req_p)
INIT(NAGV_ARGS("neighbor_allgatherv"))

int tutti_neighbor_alltoall(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                            tutti_dtype_t dtype)
SYNC(NA2A_ARGS("neighbor_alltoall"), .count = count)

int tutti_neighbor_alltoall_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                                  size_t count, tutti_dtype_t dtype, tutti_work_t **work_p)
ASYNC(NA2A_ARGS("neighbor_alltoall_async"), .count = count)

int tutti_neighbor_alltoall_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                                 size_t count, tutti_dtype_t dtype, tutti_request_t **req_p)
INIT(NA2A_ARGS("neighbor_alltoall"), .count = count)

int tutti_neighbor_alltoallv(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                             const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                             const size_t *rdispls, tutti_dtype_t dtype)
SYNC(NA2AV_ARGS("neighbor_alltoallv"))

int tutti_neighbor_alltoallv_async(tutti_comm_t *comm, const void *sendbuf,
                                   const size_t *sendcounts, const size_t *sdispls,
                                   void *recvbuf, const size_t *recvcounts,
                                   const size_t *rdispls, tutti_dtype_t dtype,
                                   tutti_work_t **work_p)
ASYNC(NA2AV_ARGS("neighbor_alltoallv_async"))

int tutti_neighbor_alltoallv_init(tutti_comm_t *comm, const void *sendbuf,
                                  const size_t *sendcounts, const size_t *sdispls, void *recvbuf,
                                  const size_t *recvcounts, const size_t *rdispls,
                                  tutti_dtype_t dtype, tutti_request_t **req_p)
INIT(NA2AV_ARGS("neighbor_alltoallv"))
    /* clang-format on */
