/* Process topologies and the neighbourhood collectives (MPI_Dist_graph_create_adjacent,
 * MPI_Cart_create and their queries, MPI_Neighbor_allgather(v) and _alltoall(v), blocking,
 * async and persistent): random multigraphs at 1-5 ranks (a rank named twice, itself,
 * TUTTI_PROC_NULL, degree 0), every block checked against a plain-C reference built from
 * the whole graph, which every rank draws from one seed (the k-th place that names a rank
 * meets that rank's k-th place naming this one); grids from tutti_dims_create, periodic
 * and not, including dimensions of 1 and 2 where both neighbours are one rank (what is
 * sent back arrives from the front); the grid's queries against plain arithmetic; a grid
 * smaller than the communicator; and every rank failing, with one message, on a graph
 * whose edges do not meet, grids that differ, and blocks of sizes that differ. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <check.h>

#include "harness.h"
#include "ref.h"

#define SENTINEL 0xdeadbeefu
#define MAXDEG 24

/* ---- a random multigraph, the same on every rank ---- */

typedef struct {
    int n;
    int outdeg[8], dests[8][MAXDEG]; /* rank s's destinations in its order */
    int indeg[8], srcs[8][MAXDEG];   /* rank r's sources in its order */
} graph_t;

static uint64_t rnd(uint64_t *st)
{
    return mix64(++*st);
}

static void graph_make(graph_t *g, int n, uint64_t seed)
{
    uint64_t st = seed * 7919;
    memset(g, 0, sizeof(*g));
    g->n = n;
    for (int s = 0; s < n; s++) {
        g->outdeg[s] = (int)(rnd(&st) % 5); /* 0..4, PROC_NULL among them now and then */
        for (int i = 0; i < g->outdeg[s]; i++)
            g->dests[s][i] = rnd(&st) % 8 == 0 ? TUTTI_PROC_NULL : (int)(rnd(&st) % (uint64_t)n);
    }
    for (int s = 0; s < n; s++) /* every edge at its receiver, then shuffled there */
        for (int i = 0; i < g->outdeg[s]; i++)
            if (g->dests[s][i] != TUTTI_PROC_NULL) {
                int r = g->dests[s][i];
                g->srcs[r][g->indeg[r]++] = s;
            }
    for (int r = 0; r < n; r++) {
        if (rnd(&st) % 3 == 0 && g->indeg[r] < MAXDEG)
            g->srcs[r][g->indeg[r]++] = TUTTI_PROC_NULL;
        for (int j = g->indeg[r] - 1; j > 0; j--) {
            int k = (int)(rnd(&st) % (uint64_t)(j + 1)), x = g->srcs[r][j];
            g->srcs[r][j] = g->srcs[r][k];
            g->srcs[r][k] = x;
        }
    }
}

/* The destination index at s of the message that lands in r's source slot j: the k-th
 * place naming s among r's sources meets the k-th place naming r among s's
 * destinations. -1 for TUTTI_PROC_NULL. */
static int paired_send(const graph_t *g, int r, int j)
{
    int s = g->srcs[r][j], k = 0;
    if (s == TUTTI_PROC_NULL)
        return -1;
    for (int x = 0; x < j; x++)
        k += g->srcs[r][x] == s;
    for (int i = 0; i < g->outdeg[s]; i++)
        if (g->dests[s][i] == r && k-- == 0)
            return i;
    return -2; /* (the graph is made whole: never) */
}

/* what s sends in its block i, element e; the v forms' block sizes */
static uint32_t val(int s, int i, size_t e, int round)
{
    return (uint32_t)s << 24 | (uint32_t)i << 16 | (uint32_t)round << 12 | (uint32_t)e;
}
static size_t a2av_count(int s, int i)
{
    return (size_t)((s + 3 * i) % 5); /* 0 among them */
}
static size_t agv_count(int s)
{
    return (size_t)(s % 3 + 1);
}

enum { K_ALLGATHER, K_ALLGATHERV, K_ALLTOALL, K_ALLTOALLV, KINDS };
enum { M_BLOCKING, M_ASYNC, M_PERSISTENT, MODES };
static const char *const kind_names[KINDS] = { "allgather", "allgatherv", "alltoall", "alltoallv" };
#define EQ 3 /* the equal forms' count */

/* One call of kind k in mode m (a persistent request started twice, round 0 and 1). */
static int graph_call(tutti_comm_t *comm, const graph_t *g, int rank, int k, int m, int round)
{
    const int in = g->indeg[rank], out = g->outdeg[rank];
    uint32_t send[MAXDEG * 8], recv[MAXDEG * 16 + 8];
    size_t sc[MAXDEG], sd[MAXDEG], rc[MAXDEG], rd[MAXDEG], stot = 0, rtot = 0;
    for (int i = 0; i < out; i++) { /* send blocks back to back, by destination */
        sc[i] = k == K_ALLTOALLV ? a2av_count(rank, i) : k == K_ALLTOALL ? EQ : 0;
        sd[i] = stot;
        stot += sc[i];
    }
    for (int j = 0; j < in; j++) /* the v forms' receive blocks in reverse, a gap between */
        rc[j] = k == K_ALLGATHERV
                    ? (g->srcs[rank][j] == TUTTI_PROC_NULL ? 2 : agv_count(g->srcs[rank][j]))
                : k == K_ALLTOALLV ? (g->srcs[rank][j] == TUTTI_PROC_NULL
                                          ? 1
                                          : a2av_count(g->srcs[rank][j], paired_send(g, rank, j)))
                                   : 0;
    for (int j = in - 1; j >= 0; j--) {
        rd[j] = rtot;
        rtot += rc[j] + 1;
    }
    const int round_n = m == M_PERSISTENT ? 2 : 1;
    tutti_request_t *req = NULL;
    for (int rr = 0; rr < round_n; rr++) {
        const int rnd_id = round * 2 + rr;
        for (size_t e = 0; e < sizeof(send) / 4; e++)
            send[e] = 0;
        if (k == K_ALLGATHER || k == K_ALLGATHERV) {
            size_t c = k == K_ALLGATHER ? EQ : agv_count(rank);
            for (size_t e = 0; e < c; e++)
                send[e] = val(rank, 0, e, rnd_id);
        } else {
            for (int i = 0; i < out; i++)
                for (size_t e = 0; e < sc[i]; e++)
                    send[sd[i] + e] = val(rank, i, e, rnd_id);
        }
        for (size_t e = 0; e < sizeof(recv) / 4; e++)
            recv[e] = SENTINEL;
        int st = TUTTI_OK;
        tutti_work_t *w = NULL;
        const size_t agc = k == K_ALLGATHER ? EQ : agv_count(rank);
        if (m == M_BLOCKING) {
            st = k == K_ALLGATHER ? tutti_neighbor_allgather(comm, send, recv, EQ, TUTTI_UINT32)
                 : k == K_ALLGATHERV
                     ? tutti_neighbor_allgatherv(comm, send, agc, recv, rc, rd, TUTTI_UINT32)
                 : k == K_ALLTOALL
                     ? tutti_neighbor_alltoall(comm, send, recv, EQ, TUTTI_UINT32)
                     : tutti_neighbor_alltoallv(comm, send, sc, sd, recv, rc, rd, TUTTI_UINT32);
        } else if (m == M_ASYNC) {
            st = k == K_ALLGATHER
                     ? tutti_neighbor_allgather_async(comm, send, recv, EQ, TUTTI_UINT32, &w)
                 : k == K_ALLGATHERV ? tutti_neighbor_allgatherv_async(comm, send, agc, recv, rc,
                                                                       rd, TUTTI_UINT32, &w)
                 : k == K_ALLTOALL
                     ? tutti_neighbor_alltoall_async(comm, send, recv, EQ, TUTTI_UINT32, &w)
                     : tutti_neighbor_alltoallv_async(comm, send, sc, sd, recv, rc, rd,
                                                      TUTTI_UINT32, &w);
        } else {
            if (!req)
                st = k == K_ALLGATHER
                         ? tutti_neighbor_allgather_init(comm, send, recv, EQ, TUTTI_UINT32, &req)
                     : k == K_ALLGATHERV ? tutti_neighbor_allgatherv_init(comm, send, agc, recv, rc,
                                                                          rd, TUTTI_UINT32, &req)
                     : k == K_ALLTOALL
                         ? tutti_neighbor_alltoall_init(comm, send, recv, EQ, TUTTI_UINT32, &req)
                         : tutti_neighbor_alltoallv_init(comm, send, sc, sd, recv, rc, rd,
                                                         TUTTI_UINT32, &req);
            if (st == TUTTI_OK)
                st = tutti_start(req);
            w = req ? tutti_request_work(req) : NULL;
        }
        if (st == TUTTI_OK && w)
            st = tutti_wait(w, 60000);
        if (w && m == M_ASYNC)
            tutti_work_free(w);
        FAIL_IF(st != TUTTI_OK, "neighbor_%s (mode %d): %s", kind_names[k], m,
                tutti_comm_last_error(comm));
        /* every source's block, and nothing else written */
        uint32_t want[MAXDEG * 16 + 8];
        for (size_t e = 0; e < sizeof(want) / 4; e++)
            want[e] = SENTINEL;
        for (int j = 0; j < in; j++) {
            const int s = g->srcs[rank][j];
            if (s == TUTTI_PROC_NULL)
                continue;
            const int i = paired_send(g, rank, j);
            const size_t base = k == K_ALLGATHER || k == K_ALLTOALL ? (size_t)j * EQ : rd[j];
            const size_t c = k == K_ALLGATHER || k == K_ALLTOALL ? EQ
                             : k == K_ALLGATHERV                 ? agv_count(s)
                                                                 : a2av_count(s, i);
            for (size_t e = 0; e < c; e++)
                want[base + e] = k == K_ALLGATHER || k == K_ALLGATHERV ? val(s, 0, e, rnd_id)
                                                                       : val(s, i, e, rnd_id);
        }
        for (size_t e = 0; e < sizeof(want) / 4; e++)
            FAIL_IF(recv[e] != want[e],
                    "neighbor_%s (mode %d, round %d, %d ranks, indegree %d): element %zu is %08x, "
                    "want %08x",
                    kind_names[k], m, rnd_id, g->n, in, e, recv[e], want[e]);
    }
    tutti_request_free(req);
    return 0;
}

static int rank_graph(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    const int seed = (int)(intptr_t)arg;
    graph_t g;
    graph_make(&g, nranks, (uint64_t)seed * 31 + (uint64_t)nranks);
    tutti_comm_t *gc = NULL;
    int st = tutti_dist_graph_create_adjacent(comm, g.indeg[rank], g.srcs[rank], g.outdeg[rank],
                                              g.dests[rank], &gc);
    FAIL_IF(st != TUTTI_OK || !gc, "dist_graph_create_adjacent: %s", tutti_comm_last_error(comm));
    int kind = -1, in = -1, out = -1, srcs[MAXDEG], dsts[MAXDEG];
    FAIL_IF(tutti_topo_test(gc, &kind) || kind != TUTTI_TOPO_GRAPH, "topo_test: %d", kind);
    FAIL_IF(tutti_topo_test(comm, &kind) || kind != TUTTI_TOPO_NONE, "parent's topo_test: %d",
            kind);
    FAIL_IF(tutti_topo_neighbors_count(gc, &in, &out) || in != g.indeg[rank] ||
                out != g.outdeg[rank],
            "neighbors_count: %d %d", in, out);
    FAIL_IF(tutti_topo_neighbors(gc, MAXDEG, srcs, MAXDEG, dsts) ||
                memcmp(srcs, g.srcs[rank], (size_t)in * sizeof(int)) ||
                memcmp(dsts, g.dests[rank], (size_t)out * sizeof(int)),
            "neighbors differ");
    /* a dup keeps the topology (MPI_Comm_dup's) */
    tutti_comm_t *dup = NULL;
    FAIL_IF(tutti_comm_dup(gc, &dup) || tutti_topo_test(dup, &kind) || kind != TUTTI_TOPO_GRAPH,
            "dup: %s", tutti_comm_last_error(gc));
    for (int k = 0; k < KINDS; k++)
        for (int m = 0; m < MODES; m++) {
            int rc = graph_call(k % 2 ? dup : gc, &g, rank, k, m, m);
            if (rc)
                return rc;
        }
    /* the grid's calls refuse a graph */
    FAIL_IF(tutti_cart_shift(gc, 0, 1, &in, &out) != TUTTI_ERR_INVALID_ARG ||
                !strstr(tutti_comm_last_error(gc), "no grid"),
            "cart_shift on a graph: %s", tutti_comm_last_error(gc));
    tutti_comm_destroy(dup);
    tutti_comm_destroy(gc);
    return 0;
}

/* MPI_Dist_graph_create: the same random graph's edges (PROC_NULL left out), each named
 * by rank (s + i) mod n, one entry of degree 1 each, at the ranks in their order; each
 * rank's lists are every edge at it by the naming rank and its order, and the k-th
 * message from a rank lands in the k-th place naming it. */
static int rank_graph_general(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    graph_t g;
    graph_make(&g, nranks, (uint64_t)(intptr_t)arg * 31 + (uint64_t)nranks);
    int src[8 * MAXDEG], deg[8 * MAXDEG], dst[8 * MAXDEG], n = 0;
    int want_in[8 * MAXDEG], want_out[8 * MAXDEG], nin = 0, nout = 0;
    for (int q = 0; q < nranks; q++)
        for (int s = 0; s < nranks; s++)
            for (int i = 0; i < g.outdeg[s]; i++) {
                const int d = g.dests[s][i];
                if (d == TUTTI_PROC_NULL || (s + i) % nranks != q)
                    continue;
                if (q == rank)
                    src[n] = s, deg[n] = 1, dst[n++] = d;
                if (d == rank)
                    want_in[nin++] = s;
                if (s == rank)
                    want_out[nout++] = d;
            }
    tutti_comm_t *gc = NULL;
    int st = tutti_dist_graph_create(comm, n, src, deg, dst, &gc);
    FAIL_IF(st != TUTTI_OK, "dist_graph_create: %s", tutti_comm_last_error(comm));
    int in = -1, out = -1, s2[8 * MAXDEG], d2[8 * MAXDEG];
    FAIL_IF(tutti_topo_neighbors_count(gc, &in, &out) || in != nin || out != nout,
            "neighbors_count %d %d, want %d %d", in, out, nin, nout);
    FAIL_IF(tutti_topo_neighbors(gc, in, s2, out, d2) ||
                memcmp(s2, want_in, (size_t)in * sizeof(int)) ||
                memcmp(d2, want_out, (size_t)out * sizeof(int)),
            "neighbors differ from the naming order");
    /* to destination i: (this rank, how many earlier places name that rank) */
    uint32_t sb[8 * MAXDEG], rb[8 * MAXDEG];
    for (int i = 0; i < out; i++) {
        uint32_t k = 0;
        for (int x = 0; x < i; x++)
            k += d2[x] == d2[i];
        sb[i] = (uint32_t)rank << 16 | k;
    }
    st = tutti_neighbor_alltoall(gc, sb, rb, 1, TUTTI_UINT32);
    FAIL_IF(st != TUTTI_OK, "neighbor_alltoall: %s", tutti_comm_last_error(gc));
    for (int j = 0; j < in; j++) {
        uint32_t k = 0;
        for (int x = 0; x < j; x++)
            k += s2[x] == s2[j];
        FAIL_IF(rb[j] != ((uint32_t)s2[j] << 16 | k), "slot %d: %08x, want %08x", j, rb[j],
                (uint32_t)s2[j] << 16 | k);
    }
    tutti_comm_destroy(gc);
    /* a destination out of range, named by rank 1: every rank fails naming it */
    int one = 1, bad = nranks + 3, zero = 0;
    st = tutti_dist_graph_create(comm, rank == 1 ? 1 : 0, &zero, &one, &bad, &gc);
    FAIL_IF(nranks > 1 && (st != TUTTI_ERR_INVALID_ARG ||
                           !strstr(tutti_comm_last_error(comm), "rank 1's destinations[0] is")),
            "bad destination: %d %s", st, tutti_comm_last_error(comm));
    if (st == TUTTI_OK)
        tutti_comm_destroy(gc);
    return 0;
}

START_TEST(graph)
{
    /* 1-5 ranks, a graph each seed */
    th_run_each(1, th_max_ranks() < 5 ? th_max_ranks() : 5, rank_graph, (void *)(intptr_t)_i,
                120000);
    th_run_each(1, th_max_ranks() < 5 ? th_max_ranks() : 5, rank_graph_general,
                (void *)(intptr_t)_i, 120000);
}
END_TEST

/* ---- grids ---- */

typedef struct {
    int ndims, dims[3], periods[3];
} grid_t;

/* plain row-major arithmetic for the reference */
static int ref_rank(const grid_t *g, const int *c)
{
    int r = 0;
    for (int i = 0; i < g->ndims; i++)
        r = r * g->dims[i] + c[i];
    return r;
}
static void ref_coords(const grid_t *g, int r, int *c)
{
    for (int i = g->ndims - 1; i >= 0; i--) {
        c[i] = r % g->dims[i];
        r /= g->dims[i];
    }
}
static int ref_step(const grid_t *g, int r, int dim, int disp)
{
    int c[3];
    ref_coords(g, r, c);
    int x = c[dim] + disp;
    if (g->periods[dim])
        x = ((x % g->dims[dim]) + g->dims[dim]) % g->dims[dim];
    else if (x < 0 || x >= g->dims[dim])
        return TUTTI_PROC_NULL;
    c[dim] = x;
    return ref_rank(g, c);
}

static int grid_check(tutti_comm_t *comm, int rank, int nranks, const grid_t *g)
{
    int size = 1;
    for (int i = 0; i < g->ndims; i++)
        size *= g->dims[i];
    tutti_comm_t *cc = NULL;
    int st = tutti_cart_create(comm, g->ndims, g->dims, g->periods, &cc);
    FAIL_IF(st != TUTTI_OK, "cart_create: %s", tutti_comm_last_error(comm));
    FAIL_IF((rank < size) != (cc != NULL), "rank %d of a grid of %d got %p", rank, size,
            (void *)cc);
    if (!cc)
        return 0;
    int nd = -1, dims[3], per[3], co[3], c2[3], r2 = -1;
    FAIL_IF(tutti_cartdim_get(cc, &nd) || nd != g->ndims, "cartdim_get: %d", nd);
    FAIL_IF(tutti_cart_get(cc, 3, dims, per, co), "cart_get: %s", tutti_comm_last_error(cc));
    ref_coords(g, rank, c2);
    for (int i = 0; i < g->ndims; i++)
        FAIL_IF(dims[i] != g->dims[i] || per[i] != (g->periods[i] != 0) || co[i] != c2[i],
                "cart_get dimension %d: %d %d %d", i, dims[i], per[i], co[i]);
    for (int r = 0; r < size; r++) {
        FAIL_IF(tutti_cart_coords(cc, r, 3, co), "cart_coords(%d)", r);
        FAIL_IF(tutti_cart_rank(cc, co, &r2) || r2 != r, "cart_rank of rank %d's coords: %d", r,
                r2);
    }
    for (int i = 0; i < g->ndims; i++) { /* wrapped coordinates, periodic or refused */
        ref_coords(g, rank, co);
        co[i] += g->dims[i];
        st = tutti_cart_rank(cc, co, &r2);
        FAIL_IF(g->periods[i] ? st != TUTTI_OK || r2 != rank : st != TUTTI_ERR_INVALID_ARG,
                "cart_rank one lap along %d: %d %d", i, st, r2);
        for (int d = -3; d <= 3; d++) {
            int s = -9, t = -9;
            FAIL_IF(tutti_cart_shift(cc, i, d, &s, &t), "cart_shift");
            FAIL_IF(s != ref_step(g, rank, i, -d) || t != ref_step(g, rank, i, d),
                    "cart_shift(%d, %d): %d %d", i, d, s, t);
        }
    }
    /* neighbor_alltoall: block 2i goes back along i, 2i + 1 forward, each tagged with the
     * sender and the block; slot 2i is what the one back sent forward (its 2i + 1), slot
     * 2i + 1 what the one in front sent back (its 2i); a missing neighbour's slot stays */
    const int deg = 2 * g->ndims;
    uint32_t send[12], recv[12];
    for (int b = 0; b < deg; b++) {
        send[b] = (uint32_t)rank << 8 | (uint32_t)b;
        recv[b] = SENTINEL;
    }
    st = tutti_neighbor_alltoall(cc, send, recv, 1, TUTTI_UINT32);
    FAIL_IF(st != TUTTI_OK, "neighbor_alltoall: %s", tutti_comm_last_error(cc));
    for (int i = 0; i < g->ndims; i++) {
        int back = ref_step(g, rank, i, -1), fwd = ref_step(g, rank, i, 1);
        uint32_t w0 = back == TUTTI_PROC_NULL ? SENTINEL
                                              : (uint32_t)back << 8 | (uint32_t)(2 * i + 1);
        uint32_t w1 = fwd == TUTTI_PROC_NULL ? SENTINEL : (uint32_t)fwd << 8 | (uint32_t)(2 * i);
        FAIL_IF(recv[2 * i] != w0 || recv[2 * i + 1] != w1,
                "grid %dx%dx%d periods %d%d%d, dimension %d: got %08x %08x, want %08x %08x",
                g->dims[0], g->ndims > 1 ? g->dims[1] : 1, g->ndims > 2 ? g->dims[2] : 1,
                g->periods[0], g->periods[1], g->periods[2], i, recv[2 * i], recv[2 * i + 1], w0,
                w1);
    }
    /* neighbor_allgather: every neighbour's rank */
    uint32_t me = (uint32_t)rank + 100;
    for (int b = 0; b < deg; b++)
        recv[b] = SENTINEL;
    st = tutti_neighbor_allgather(cc, &me, recv, 1, TUTTI_UINT32);
    FAIL_IF(st != TUTTI_OK, "neighbor_allgather: %s", tutti_comm_last_error(cc));
    for (int i = 0; i < g->ndims; i++)
        for (int d = 0; d < 2; d++) {
            int p = ref_step(g, rank, i, d ? 1 : -1);
            uint32_t w = p == TUTTI_PROC_NULL ? SENTINEL : (uint32_t)p + 100;
            FAIL_IF(recv[2 * i + d] != w, "allgather slot %d: %08x, want %08x", 2 * i + d,
                    recv[2 * i + d], w);
        }
    (void)nranks;
    tutti_comm_destroy(cc);
    return 0;
}

/* MPI_Cart_sub of a 3-d grid, every mask of kept dimensions: the sub-grid's ranks (their
 * parent ranks gathered) are those that share the dropped coordinates, ordered by the
 * kept ones; its shape, periods and this rank's coordinates are the kept ones. */
static int sub_check(tutti_comm_t *comm, int rank, const grid_t *g)
{
    tutti_comm_t *cc = NULL;
    int st = tutti_cart_create(comm, g->ndims, g->dims, g->periods, &cc);
    FAIL_IF(st != TUTTI_OK || !cc, "cart_create: %s", tutti_comm_last_error(comm));
    int size = 1, c[3];
    for (int i = 0; i < g->ndims; i++)
        size *= g->dims[i];
    ref_coords(g, rank, c);
    for (int mask = 0; mask < (1 << g->ndims); mask++) {
        int keep[3], want_n = 0, want[64];
        for (int i = 0; i < g->ndims; i++)
            keep[i] = mask >> i & 1;
        tutti_comm_t *sub = NULL;
        st = tutti_cart_sub(cc, keep, &sub);
        FAIL_IF(st != TUTTI_OK || !sub, "cart_sub(mask %d): %s", mask, tutti_comm_last_error(cc));
        for (int q = 0; q < size; q++) { /* in row-major order: the kept coordinates' order */
            int d[3], same = 1;
            ref_coords(g, q, d);
            for (int i = 0; i < g->ndims; i++)
                same &= keep[i] || d[i] == c[i];
            if (same)
                want[want_n++] = q;
        }
        int got[64], me = rank;
        FAIL_IF(tutti_comm_size(sub) != want_n, "cart_sub(mask %d): %d ranks, want %d", mask,
                tutti_comm_size(sub), want_n);
        FAIL_IF(tutti_allgather(sub, &me, got, 1, TUTTI_INT32), "allgather: %s",
                tutti_comm_last_error(sub));
        FAIL_IF(memcmp(got, want, (size_t)want_n * sizeof(int)), "cart_sub(mask %d): other ranks",
                mask);
        int nd = -1, dims[3], per[3], co[3], k = 0;
        FAIL_IF(tutti_cartdim_get(sub, &nd) || tutti_cart_get(sub, 3, dims, per, co), "cart_get");
        for (int i = 0; i < g->ndims; i++)
            if (keep[i]) {
                FAIL_IF(dims[k] != g->dims[i] || per[k] != g->periods[i] || co[k] != c[i],
                        "cart_sub(mask %d) dimension %d", mask, k);
                k++;
            }
        FAIL_IF(nd != k, "cart_sub(mask %d): %d dimensions, want %d", mask, nd, k);
        /* along each kept dimension: the neighbours' parent ranks */
        uint32_t mine = (uint32_t)rank, nb[6];
        FAIL_IF(tutti_neighbor_allgather(sub, &mine, nb, 1, TUTTI_UINT32), "sub allgather: %s",
                tutti_comm_last_error(sub));
        for (int i = 0, j = 0; i < g->ndims; i++)
            if (keep[i]) {
                for (int d = 0; d < 2; d++) {
                    int p = ref_step(g, rank, i, d ? 1 : -1);
                    FAIL_IF(p != TUTTI_PROC_NULL && nb[2 * j + d] != (uint32_t)p,
                            "cart_sub(mask %d): neighbour %d is %u, want %d", mask, 2 * j + d,
                            nb[2 * j + d], p);
                }
                j++;
            }
        tutti_comm_destroy(sub);
    }
    if (size > 1) { /* ranks that keep other dimensions: every rank fails, naming one */
        int keep_d[3] = { rank == 1, 0, 0 };
        tutti_comm_t *bad = NULL;
        st = tutti_cart_sub(cc, keep_d, &bad);
        FAIL_IF(st != TUTTI_ERR_INVALID_ARG || bad ||
                    !strstr(tutti_comm_last_error(cc), "rank 1 passed another"),
                "cart_sub, ranks that disagree: %d %s", st, tutti_comm_last_error(cc));
    }
    tutti_comm_destroy(cc);
    return 0;
}

static int rank_grids(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    /* dims_create's balanced grids, every mix of periods, and then 1 x n, n x 1 x 1 */
    for (int nd = 1; nd <= 3; nd++)
        for (int pm = 0; pm < (1 << nd); pm++) {
            grid_t g = { .ndims = nd };
            FAIL_IF(tutti_dims_create(nranks, nd, g.dims), "dims_create(%d, %d)", nranks, nd);
            for (int i = 0; i < nd; i++)
                g.periods[i] = pm >> i & 1;
            int rc = grid_check(comm, rank, nranks, &g);
            if (rc)
                return rc;
        }
    grid_t g1 = { 2, { 1, nranks }, { 1, 1 } }, g2 = { 3, { nranks, 1, 1 }, { 1, 0, 1 } };
    int rc = grid_check(comm, rank, nranks, &g1);
    grid_t g4 = { .ndims = 3, .periods = { 0, 1, 0 } };
    FAIL_IF(tutti_dims_create(nranks, 3, g4.dims), "dims_create");
    if (!rc)
        rc = sub_check(comm, rank, &g4);
    if (!rc)
        rc = grid_check(comm, rank, nranks, &g2);
    /* smaller than the communicator: the last rank is left out */
    grid_t g3 = { 1, { nranks - 1 }, { 1 } };
    if (!rc && nranks > 1)
        rc = grid_check(comm, rank, nranks, &g3);
    return rc;
}

START_TEST(grids)
{
    th_run_each(1, th_max_ranks() < 5 ? th_max_ranks() : 5, rank_grids, NULL, 180000);
}
END_TEST

/* MPI_Dims_create against a plain search: the product, the fixed entries kept, the free
 * ones non-increasing and as balanced (least largest entry) as any split. */
static int best_max(int m, int k, int cap)
{ /* the least largest factor of m into k factors, each <= cap */
    if (k == 1)
        return m <= cap ? m : 1 << 30;
    int best = 1 << 30;
    for (int f = 1; f <= m && f <= cap; f++)
        if (m % f == 0) {
            int rest = best_max(m / f, k - 1, f);
            if (rest < (1 << 30))
                best = best < (f > rest ? f : rest) ? best : (f > rest ? f : rest);
        }
    return best;
}

START_TEST(dims)
{
    for (int n = 1; n <= 72; n++)
        for (int nd = 1; nd <= 4; nd++) {
            int d[4] = { 0, 0, 0, 0 };
            ck_assert_int_eq(tutti_dims_create(n, nd, d), TUTTI_OK);
            int p = 1;
            for (int i = 0; i < nd; i++) {
                p *= d[i];
                if (i)
                    ck_assert_msg(d[i] <= d[i - 1], "dims_create(%d, %d): not non-increasing", n,
                                  nd);
            }
            ck_assert_int_eq(p, n);
            ck_assert_msg(d[0] == best_max(n, nd, n), "dims_create(%d, %d): largest %d, best %d", n,
                          nd, d[0], best_max(n, nd, n));
        }
    int d[3] = { 0, 3, 0 };
    ck_assert_int_eq(tutti_dims_create(24, 3, d), TUTTI_OK);
    ck_assert(d[1] == 3 && d[0] * d[2] == 8 && d[0] >= d[2]);
    int e[2] = { 5, 0 };
    ck_assert_int_eq(tutti_dims_create(24, 2, e), TUTTI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tutti_comm_last_error(NULL), "24 ranks"));
    int f[2] = { 2, 3 };
    ck_assert_int_eq(tutti_dims_create(7, 2, f), TUTTI_ERR_INVALID_ARG);
    int h[2] = { -1, 0 };
    ck_assert_int_eq(tutti_dims_create(4, 2, h), TUTTI_ERR_INVALID_ARG);
}
END_TEST

/* ---- ranks that disagree, bad arguments ---- */

static int rank_bad(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg, (void)nranks;
    tutti_comm_t *gc = (tutti_comm_t *)1;
    uint32_t b[8] = { 0 }, r[8];
    /* no topology */
    int st = tutti_neighbor_alltoall(comm, b, r, 1, TUTTI_UINT32);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || !strstr(tutti_comm_last_error(comm), "no topology"),
            "neighbor_alltoall without a topology: %d %s", st, tutti_comm_last_error(comm));
    /* rank 0 sends to 1, which does not receive from it: every rank fails, naming both */
    int to1 = 1, none = 0;
    st = tutti_dist_graph_create_adjacent(comm, 0, &none, rank == 0 ? 1 : 0, &to1, &gc);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || gc ||
                !strstr(tutti_comm_last_error(comm),
                        "rank 1 lists rank 0 0 times among its sources, but rank 0 lists rank 1 "
                        "1 time among its destinations"),
            "half an edge: %d %s", st, tutti_comm_last_error(comm));
    /* a rank out of range: named, beating the edges it leaves out */
    int bad = rank == 2 ? 7 : TUTTI_PROC_NULL;
    st = tutti_dist_graph_create_adjacent(comm, 1, &bad, 0, NULL, &gc);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG ||
                !strstr(tutti_comm_last_error(comm), "rank 2's sources[0] is 7"),
            "bad source: %d %s", st, tutti_comm_last_error(comm));
    st = tutti_dist_graph_create_adjacent(comm, rank == 1 ? -1 : 0, NULL, 0, NULL, &gc);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG ||
                !strstr(tutti_comm_last_error(comm), "rank 1 passed indegree -1"),
            "negative degree: %d %s", st, tutti_comm_last_error(comm));
    /* a NULL output at one rank: every rank fails (none waits for it) */
    st = tutti_dist_graph_create_adjacent(comm, 0, NULL, 0, NULL, rank == 1 ? NULL : &gc);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG ||
                !strstr(tutti_comm_last_error(comm), "rank 1 passed a NULL output"),
            "NULL graph_p at rank 1: %d %s", st, tutti_comm_last_error(comm));
    int one_dim[1] = { 1 };
    st = tutti_cart_create(comm, 1, one_dim, NULL, rank == 2 ? NULL : &gc);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG ||
                !strstr(tutti_comm_last_error(comm), "rank 2 passed a NULL output"),
            "NULL cart_p at rank 2: %d %s", st, tutti_comm_last_error(comm));
    /* a chain 0 -> 1 -> 2: the ends' empty sides pass NULL arrays (MPI allows it) */
    int up = rank - 1, down = rank + 1;
    st = tutti_dist_graph_create_adjacent(comm, rank > 0, rank > 0 ? &up : NULL, rank < nranks - 1,
                                          rank < nranks - 1 ? &down : NULL, &gc);
    FAIL_IF(st != TUTTI_OK, "chain: %s", tutti_comm_last_error(comm));
    uint32_t cs[2] = { 70u + (uint32_t)rank, 80u + (uint32_t)rank }, cr[2] = { 0, 0 };
    size_t c2 = 2, z = 0;
    st = tutti_neighbor_alltoallv(gc, cs, rank < nranks - 1 ? &c2 : NULL,
                                  rank < nranks - 1 ? &z : NULL, cr, rank > 0 ? &c2 : NULL,
                                  rank > 0 ? &z : NULL, TUTTI_UINT32);
    FAIL_IF(st != TUTTI_OK, "chain alltoallv with NULL arrays: %s", tutti_comm_last_error(gc));
    FAIL_IF(rank > 0 && (cr[0] != 70u + (uint32_t)up || cr[1] != 80u + (uint32_t)up),
            "chain alltoallv: %u %u", cr[0], cr[1]);
    st = tutti_neighbor_allgatherv(gc, cs, 1, cr, rank > 0 ? &c2 : NULL, NULL, TUTTI_UINT32);
    FAIL_IF(rank == 0 ? st != TUTTI_OK : st == TUTTI_OK,
            "chain allgatherv, 1 sent, 2 wanted: %d %s", st, tutti_comm_last_error(gc));
    tutti_comm_destroy(gc);
    /* grids that differ, one too large */
    int dims[2] = { nranks, 1 }, per[2] = { rank == 1, 0 };
    st = tutti_cart_create(comm, 2, dims, per, &gc);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG ||
                !strstr(tutti_comm_last_error(comm), "rank 1 passed another grid"),
            "grids that differ: %d %s", st, tutti_comm_last_error(comm));
    int big[1] = { nranks + 1 };
    st = tutti_cart_create(comm, 1, big, NULL, &gc);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || !strstr(tutti_comm_last_error(comm), "more than"),
            "grid too large: %d %s", st, tutti_comm_last_error(comm));
    /* a ring (each to the next, from the one before): the communicator still works */
    int nxt = (rank + 1) % nranks, prv = (rank + nranks - 1) % nranks;
    st = tutti_dist_graph_create_adjacent(comm, 1, &prv, 1, &nxt, &gc);
    FAIL_IF(st != TUTTI_OK, "ring: %s", tutti_comm_last_error(comm));
    /* refused at the call: in place, overlapping receive blocks */
    st = tutti_neighbor_alltoall(gc, TUTTI_IN_PLACE, r, 1, TUTTI_UINT32);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || !strstr(tutti_comm_last_error(gc), "TUTTI_IN_PLACE"),
            "in place: %d %s", st, tutti_comm_last_error(gc));
    st = tutti_neighbor_alltoall(gc, b, b, 1, TUTTI_UINT32);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || !strstr(tutti_comm_last_error(gc), "overlap"),
            "sendbuf == recvbuf: %d %s", st, tutti_comm_last_error(gc));
    st = tutti_neighbor_allgather(gc, b, NULL, 1, TUTTI_UINT32);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || !strstr(tutti_comm_last_error(gc), "recvbuf is NULL"),
            "NULL recvbuf: %d %s", st, tutti_comm_last_error(gc));
    /* the next rank expects 2 where this one sends 1 (rank 0 to 1 only): both fail */
    size_t one = 1, two = rank == 1 ? 2 : 1, zero = 0;
    st = tutti_neighbor_alltoallv(gc, b, &one, &zero, r, &two, &zero, TUTTI_UINT32);
    FAIL_IF(rank == 1 && (st != TUTTI_ERR_MISMATCH ||
                          !strstr(tutti_comm_last_error(gc), "neighbor_alltoall")),
            "a block of another size: %d %s", st, tutti_comm_last_error(gc));
    tutti_comm_destroy(gc);
    /* to itself twice, sizes that differ: refused at the call */
    int self[2] = { rank, rank };
    st = tutti_dist_graph_create_adjacent(comm, 2, self, 2, self, &gc);
    FAIL_IF(st != TUTTI_OK, "self loops: %s", tutti_comm_last_error(comm));
    size_t sc[2] = { 1, 2 }, sd[2] = { 0, 1 }, rc[2] = { 2, 1 }, rd[2] = { 0, 2 };
    st = tutti_neighbor_alltoallv(gc, b, sc, sd, r, rc, rd, TUTTI_UINT32);
    FAIL_IF(st != TUTTI_ERR_MISMATCH || !strstr(tutti_comm_last_error(gc), "block to itself"),
            "self sizes: %d %s", st, tutti_comm_last_error(gc));
    size_t rd2[2] = { 0, 0 }, rc2[2] = { 1, 2 };
    st = tutti_neighbor_alltoallv(gc, b, sc, sd, r, rc2, rd2, TUTTI_UINT32);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || !strstr(tutti_comm_last_error(gc), "blocks of sources"),
            "overlapping receive blocks: %d %s", st, tutti_comm_last_error(gc));
    for (int i = 0; i < 3; i++)
        b[i] = 10 + (uint32_t)i;
    size_t rd3[2] = { 3, 0 };
    st = tutti_neighbor_alltoallv(gc, b, sc, sd, r, rc2, rd3, TUTTI_UINT32);
    FAIL_IF(st != TUTTI_OK || r[3] != 10 || r[0] != 11 || r[1] != 12, "self loops: %d %u %u %u", st,
            r[3], r[0], r[1]);
    tutti_comm_destroy(gc);
    return 0;
}

TH_RUN_TEST(bad_args, th_run(3, rank_bad, NULL, 90000))

/* No memory for the edges at one rank (20M named under a lowered RLIMIT_AS):
 * dist_graph_create fails every rank at once, naming it, instead of leaving the others
 * in its exchange until the timeout (found by review). */
static int rank_nomem(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg, (void)nranks;
    int n = 0, s = 0, deg = 0, *dst = NULL;
    if (rank == 1) {
        deg = 20000000, n = 1;
        dst = calloc((size_t)deg, sizeof(int)); /* every edge to rank 0 */
        FAIL_IF(!dst, "calloc");
        FILE *f = fopen("/proc/self/status", "r");
        char line[256];
        long kb = -1;
        while (f && fgets(line, sizeof(line), f))
            if (sscanf(line, "VmSize: %ld kB", &kb) == 1)
                break;
        if (f)
            fclose(f);
        FAIL_IF(kb <= 0, "VmSize");
        struct rlimit rl = { .rlim_cur = ((rlim_t)kb << 10) + (32u << 20),
                             .rlim_max = RLIM_INFINITY };
        FAIL_IF(setrlimit(RLIMIT_AS, &rl), "setrlimit");
    }
    tutti_comm_t *gc = NULL;
    double t0 = th_now_ms();
    int st = tutti_dist_graph_create(comm, n, &s, &deg, dst, &gc);
    double took = th_now_ms() - t0;
    FAIL_IF(st != TUTTI_ERR_NOMEM || gc ||
                !strstr(tutti_comm_last_error(comm), "rank 1 had no memory for the topology"),
            "%s: %s", tutti_status_name(st), tutti_comm_last_error(comm));
    FAIL_IF(took > 10000, "failed after %.0f ms (the communicator's timeout is 30 s)", took);
    free(dst);
    return 0;
}

START_TEST(nomem)
{
    if (TH_ASAN || TH_TSAN) /* (their shadow memory needs the address space) */
        return;
    ck_assert_int_eq(th_run_comm_timeout(3, rank_nomem, NULL, 90000, 30000, 0, NULL), 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("topo");
    th_add_case(s, "graph", graph, th_quick() ? 2 : 6, 300);
    th_add_case(s, "grids", grids, 1, 300);
    th_add_tests(s, "dims", 30, (const TTest *const[]){ dims, NULL });
    th_add_tests(s, "bad_args", 120, (const TTest *const[]){ bad_args, nomem, NULL });
    return s;
}

int main(void)
{
    return th_main(suite());
}
