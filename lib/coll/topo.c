/* Process topologies: MPI_Dist_graph_create(_adjacent), MPI_Cart_create and _sub,
 * MPI_Dims_create, their queries, and the edges the neighbourhood collectives
 * (algorithms/neighbor.c) read.
 * Making one is collective over the parent: the ranks' arguments are checked against
 * each other first (a graph's two ends of every edge, a grid's one shape), so that a
 * mistake fails every rank with one message instead of leaving a neighbour's receive
 * to time out later; then the parent is duplicated (tutti_comm_dup, or a split for a
 * grid smaller than it) and the new communicator carries the topology. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "coll/topo.h"
#include "core/fault.h"
#include "core/state.h"

/* ---- the structure ---- */

/* n edges' indexes into order, by (peer, tag, index) */
typedef struct {
    const int *peer;
    const uint32_t *tag;
} edge_key_t;

static int edge_cmp(const void *a, const void *b, void *ctx)
{
    const edge_key_t *k = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    if (k->peer[x] != k->peer[y])
        return k->peer[x] < k->peer[y] ? -1 : 1;
    if (k->tag[x] != k->tag[y])
        return k->tag[x] < k->tag[y] ? -1 : 1;
    return (x > y) - (x < y);
}

static void edge_order(const int *peer, const uint32_t *tag, int n, int *order)
{
    edge_key_t k = { peer, tag };
    for (int i = 0; i < n; i++)
        order[i] = i;
    qsort_r(order, (size_t)n, sizeof(int), edge_cmp, &k);
}

/* A graph's tags: the k-th place naming a rank has tag k (then its order by (peer, tag)
 * is by (peer, index)). */
static void graph_tags(const int *peer, uint32_t *tag, int n, int *order)
{
    for (int i = 0; i < n; i++)
        tag[i] = 0;
    edge_order(peer, tag, n, order); /* by (peer, index) */
    for (int k = 1; k < n; k++)
        if (peer[order[k]] == peer[order[k - 1]])
            tag[order[k]] = tag[order[k - 1]] + 1;
}

/* self_send for rank me: the send to itself of each tag for the receive from itself of
 * that tag (both orders list by (peer, tag), and a consistent topology has as many of
 * each), once, for the call's size check (coll.c) and the algorithm's copy */
static void self_pairs(tt_topo_t *t, int me)
{
    for (int j = 0; j < t->indeg; j++)
        t->self_send[j] = -1;
    for (int a = 0, b = 0; a < t->indeg; a++) {
        const int j = t->recv_order[a];
        if (t->sources[j] != me)
            continue;
        while (b < t->outdeg &&
               (t->dests[t->send_order[b]] != me || t->dst_tag[t->send_order[b]] != t->src_tag[j]))
            b++;
        if (b == t->outdeg)
            break;
        t->self_send[j] = t->send_order[b++];
    }
}

/* A maker's start: TUTTI_OK to go on (*out_p cleared where given), else its refusal. */
static int maker_enter(tutti_comm_t *comm, const char *name, tutti_comm_t **out_p)
{
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (tt_comm_foreign_inline(comm))
        return tt_comm_refuse_foreign(comm, name, 0);
    if (out_p)
        *out_p = NULL;
    return TUTTI_OK;
}

/* An exchange with the other ranks failed (st): its error, said as the maker's. */
static int exchange_failed(tutti_comm_t *comm, const char *name, const char *what, int st)
{
    char cause[TT_ERRMSG_LEN];
    snprintf(cause, sizeof(cause), "%s", tutti_comm_last_error(comm));
    return tt_comm_set_error(comm, st,
                             "%s: exchanging the %s with the other ranks (every rank must "
                             "call it): %s",
                             name, what, cause);
}

/* ---- checking the ranks' arguments against each other ---- */

/* One rank's first problem, exchanged so that every rank reports the same one. */
enum {
    P_NONE,
    P_NULL_OUT,
    P_DEGREE,
    P_NULL_LIST,
    P_RANK,
    P_EDGES,
    P_DIMS_N,
    P_DIM,
    P_GRID_SIZE,
    P_NOMEM,
    P_SHAPE
};
typedef struct {
    int32_t kind, a, b, c; /* what they mean: prob_text */
    uint64_t shape;        /* a grid's shape digest */
} prob_t;

static void prob_text(const prob_t *p, int rank, int n, char *buf, size_t len)
{
    /* (2, 3: dist_graph_create's arguments) */
    static const char *const list[8] = { "sources",      "destinations", "sources or degrees",
                                         "destinations", "sources",      "remain_dims" };
    static const char *const deg[8] = { "indegree", "outdegree", "n", "a degree" };
    switch (p->kind) {
    case P_NULL_OUT: snprintf(buf, len, "rank %d passed a NULL output", rank); break;
    case P_NOMEM:
        snprintf(buf, len, "rank %d had no memory for the topology (%d edges)", rank, p->a);
        break;
    case P_DEGREE:
        if (p->a == 4)
            snprintf(buf, len, "rank %d named more than %d edges", rank, INT32_MAX / 2);
        else
            snprintf(buf, len, "rank %d passed %s %d (at least 0)", rank, deg[p->a & 3], p->b);
        break;
    case P_NULL_LIST:
        snprintf(buf, len, "rank %d passed %s NULL with %s %d", rank, list[p->a & 7],
                 p->a == 3   ? "edges"
                 : p->a == 5 ? "ndims"
                             : deg[p->a & 3],
                 p->b);
        break;
    case P_RANK:
        if (p->a == 5) {
            snprintf(buf, len,
                     "rank %d's remain_dims[%d] is %d (0 or 1; from Python: a list "
                     "of another length than the grid's dimensions)",
                     rank, p->b, p->c);
            break;
        }
        snprintf(buf, len, "rank %d's %s[%d] is %d: not a rank of the communicator's %d%s", rank,
                 list[p->a & 7], p->b, p->c, n,
                 p->a < 2 ? " (nor TUTTI_PROC_NULL)" : " (TUTTI_PROC_NULL names no edge here)");
        break;
    case P_EDGES:
        snprintf(buf, len,
                 "rank %d lists rank %d %d time%s among its sources, but rank %d lists rank %d %d "
                 "time%s among its destinations: every edge needs both its ends",
                 rank, p->a, p->b, p->b == 1 ? "" : "s", p->a, rank, p->c, p->c == 1 ? "" : "s");
        break;
    case P_DIMS_N:
        snprintf(buf, len, "rank %d passed ndims %d (at least 0, at most %d)", rank, p->a,
                 TT_TOPO_MAX_DIMS);
        break;
    case P_DIM:
        if (p->b == INT32_MIN)
            snprintf(buf, len, "rank %d passed dims NULL with ndims %d", rank, p->a);
        else
            snprintf(buf, len, "rank %d passed dims[%d] = %d (each at least 1)", rank, p->a, p->b);
        break;
    case P_GRID_SIZE:
        snprintf(buf, len,
                 "rank %d passed a grid of %s%d ranks, more than the communicator's %d "
                 "(ranks past the grid's size get NULL; none can be made up)",
                 rank, p->a < 0 ? "over " : "", p->a < 0 ? INT32_MAX : p->a, n);
        break;
    case P_SHAPE:
        snprintf(buf, len,
                 "rank %d passed another grid (ndims, dims or periods; cart_sub: remain_dims) "
                 "than rank 0: every rank must pass the same",
                 rank);
        break;
    default: snprintf(buf, len, "rank %d: ?", rank); break;
    }
}

/* Every rank's problem gathered (into all, nranks of them: the caller's, allocated
 * before anything else, so that a rank that has the memory for nothing but fails alone;
 * every later problem, a NULL output or no memory for the topology, takes part here and
 * fails every rank); the first rank's (of the lowest kind, so that an argument's beats
 * the edges it makes wrong) fails the call everywhere. */
static int probs_settle(tutti_comm_t *comm, const char *name, prob_t *mine, prob_t *all)
{
    const int n = comm->nranks;
    int st = tutti_allgather(comm, mine, all, sizeof(*mine), TUTTI_UINT8);
    if (st < 0)
        return exchange_failed(comm, name, "arguments", st);
    int worst = -1;
    for (int r = 0; r < n; r++) {
        if (all[r].kind == P_NONE && all[r].shape != all[0].shape)
            all[r].kind = P_SHAPE;
        if (all[r].kind != P_NONE && (worst < 0 || all[r].kind < all[worst].kind))
            worst = r;
    }
    if (worst >= 0) {
        char why[TT_ERRMSG_LEN / 2];
        prob_text(&all[worst], worst, n, why, sizeof(why));
        st = tt_comm_set_error(comm,
                               all[worst].kind == P_NOMEM ? TUTTI_ERR_NOMEM : TUTTI_ERR_INVALID_ARG,
                               "%s: %s", name, why);
    }
    return st;
}

/* a list's own checks (which = 0: sources, 1: destinations) */
static void check_list(prob_t *p, int which, int deg, const int *list, int n)
{
    if (p->kind)
        return;
    if (deg < 0)
        *p = (prob_t){ .kind = P_DEGREE, .a = which, .b = deg };
    else if (deg > 0 && !list)
        *p = (prob_t){ .kind = P_NULL_LIST, .a = which, .b = deg };
    for (int i = 0; !p->kind && i < deg; i++)
        if (list[i] != TUTTI_PROC_NULL && (list[i] < 0 || list[i] >= n))
            *p = (prob_t){ .kind = P_RANK, .a = which, .b = i, .c = list[i] };
}

/* ---- a distributed graph ---- */

int tutti_dist_graph_create_adjacent(tutti_comm_t *comm, int indegree, const int *sources,
                                     int outdegree, const int *destinations, tutti_comm_t **graph_p)
{
    static const char name[] = "dist_graph_create_adjacent";
    TT_CHECK(maker_enter(comm, name, graph_p));
    const int n = comm->nranks;
    prob_t mine = { 0 };
    if (!graph_p)
        mine.kind = P_NULL_OUT;
    check_list(&mine, 0, indegree, sources, n);
    check_list(&mine, 1, outdegree, destinations, n);
    /* the edges to each rank, counted at both ends: rank r's destinations that are p
     * against p's sources that are r (an alltoall of the counts); then the problems */
    prob_t *all = malloc((size_t)n * sizeof(*all));
    int32_t *out = calloc(2 * (size_t)n, sizeof(int32_t)), *got = out + n;
    if (!out || !all) {
        free(out);
        free(all);
        return tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "%s: out of memory", name);
    }
    for (int i = 0; !mine.kind && i < outdegree; i++)
        if (destinations[i] != TUTTI_PROC_NULL)
            out[destinations[i]]++;
    int st = tutti_alltoall(comm, out, got, 1, TUTTI_INT32);
    if (st < 0) {
        free(out);
        free(all);
        return exchange_failed(comm, name, "edges", st);
    }
    memset(out, 0, (size_t)n * sizeof(int32_t)); /* now: this rank's sources by rank */
    for (int j = 0; !mine.kind && j < indegree; j++)
        if (sources[j] != TUTTI_PROC_NULL)
            out[sources[j]]++;
    for (int p = 0; !mine.kind && p < n; p++)
        if (out[p] != got[p])
            mine = (prob_t){ .kind = P_EDGES, .a = p, .b = out[p], .c = got[p] };
    free(out);
    /* the topology before the settle, so that no memory for it fails every rank */
    tt_topo_t *t = mine.kind ? NULL : tt_topo_alloc(TUTTI_TOPO_GRAPH, indegree, outdegree, 0);
    if (!mine.kind && !t)
        mine = (prob_t){ .kind = P_NOMEM, .a = indegree + outdegree };
    st = probs_settle(comm, name, &mine, all);
    free(all);
    if (st < 0) {
        tt_topo_free(t);
        return st;
    }
    if (indegree)
        memcpy(t->sources, sources, (size_t)indegree * sizeof(int));
    if (outdegree)
        memcpy(t->dests, destinations, (size_t)outdegree * sizeof(int));
    graph_tags(t->sources, t->src_tag, indegree, t->recv_order);
    graph_tags(t->dests, t->dst_tag, outdegree, t->send_order);
    self_pairs(t, comm->rank); /* (the dup keeps the ranks) */
    tutti_comm_t *g = NULL;
    if ((st = tutti_comm_dup(comm, &g)) < 0) {
        tt_topo_free(t);
        return st;
    }
    g->topo = t;
    *graph_p = g;
    return TUTTI_OK;
}

/* MPI_Dist_graph_create: any rank may name any edge. Each names its edges to both their
 * ends (an alltoall of the counts, an alltoallv of the entries: rank << 1 | 1 for "you
 * send to rank", << 1 for "you receive from rank"), which lists them by the naming rank
 * and, within its list, in its order, so that the k-th place naming a rank at either end
 * is the same edge; then as tutti_dist_graph_create_adjacent. */
int tutti_dist_graph_create(tutti_comm_t *comm, int n, const int *sources, const int *degrees,
                            const int *destinations, tutti_comm_t **graph_p)
{
    static const char name[] = "dist_graph_create";
    TT_CHECK(maker_enter(comm, name, graph_p));
    const int np = comm->nranks;
    prob_t mine = { 0 };
    long long edges = 0;
    if (!graph_p)
        mine.kind = P_NULL_OUT;
    else if (n < 0)
        mine = (prob_t){ .kind = P_DEGREE, .a = 2, .b = n };
    else if (n > 0 && (!sources || !degrees))
        mine = (prob_t){ .kind = P_NULL_LIST, .a = 2, .b = n };
    for (int i = 0; !mine.kind && i < n; i++) {
        if (sources[i] < 0 || sources[i] >= np)
            mine = (prob_t){ .kind = P_RANK, .a = 4, .b = i, .c = sources[i] };
        else if (degrees[i] < 0)
            mine = (prob_t){ .kind = P_DEGREE, .a = 3, .b = degrees[i] };
        else if ((edges += degrees[i]) > INT32_MAX / 2)
            mine = (prob_t){ .kind = P_DEGREE, .a = 4 };
    }
    if (!mine.kind && edges && !destinations)
        mine = (prob_t){ .kind = P_NULL_LIST, .a = 3, .b = (int32_t)edges };
    for (long long e = 0; !mine.kind && e < edges; e++)
        if (destinations[e] < 0 || destinations[e] >= np)
            mine = (prob_t){ .kind = P_RANK, .a = 3, .b = (int32_t)e, .c = destinations[e] };
    /* the counts' and the problems' room (O(ranks): without it this rank alone fails);
     * everything sized by edges joins the problems (no memory fails every rank) */
    size_t *lay = calloc(4 * (size_t)np, sizeof(size_t));
    prob_t *all = malloc((size_t)np * sizeof(*all));
    int64_t *out = NULL, *in = NULL;
    int *srcs = NULL, *dsts = NULL, st = TUTTI_OK;
    if (!lay || !all) {
        st = tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "%s: out of memory", name);
        goto out;
    }
    if (!mine.kind && !(out = malloc((2 * (size_t)edges + 1) * sizeof(int64_t))))
        mine = (prob_t){ .kind = P_NOMEM, .a = (int32_t)edges };
    size_t *sc = lay, *sd = lay + np, *rc = lay + 2 * (size_t)np, *rd = lay + 3 * (size_t)np;
    for (int i = 0, e = 0; !mine.kind && i < n; i++)
        for (int k = 0; k < degrees[i]; k++, e++)
            sc[sources[i]]++, sc[destinations[e]]++;
    for (int p = 1; p < np; p++)
        sd[p] = sd[p - 1] + sc[p - 1];
    size_t *fill = rc; /* (rc is free until the counts' exchange) */
    for (int i = 0, e = 0; !mine.kind && i < n; i++)
        for (int k = 0; k < degrees[i]; k++, e++) {
            const int s = sources[i], d = destinations[e];
            out[sd[s] + fill[s]++] = (int64_t)d << 1 | 1; /* s sends to d */
            out[sd[d] + fill[d]++] = (int64_t)s << 1;     /* d receives from s */
        }
    memset(rc, 0, (size_t)np * sizeof(size_t));
    /* the counts, then the problems (the room for what comes in among them), then the
     * entries: a failed call sends none */
    size_t total = 0, nin = 0, nout = 0;
    if ((st = tutti_alltoall(comm, sc, rc, 1, TUTTI_UINT64)) == TUTTI_OK) {
        for (int p = 0; p < np; p++)
            rd[p] = total, total += rc[p];
        if (!mine.kind && (total > INT32_MAX || !(in = malloc((total + 1) * sizeof(int64_t))) ||
                           !(srcs = malloc((total + 1) * sizeof(int))) ||
                           !(dsts = malloc((total + 1) * sizeof(int)))))
            mine = (prob_t){ .kind = P_NOMEM, .a = (int32_t)TT_MIN(total, INT32_MAX) };
    }
    if (st < 0) {
        st = exchange_failed(comm, name, "edges", st);
        goto out;
    }
    if ((st = probs_settle(comm, name, &mine, all)) < 0)
        goto out;
    if ((st = tutti_alltoallv(comm, out, sc, sd, in, rc, rd, TUTTI_INT64)) < 0)
        goto out;
    /* this rank's lists, by the naming rank and its order */
    for (size_t e = 0; e < total; e++) {
        if (in[e] & 1)
            dsts[nout++] = (int)(in[e] >> 1);
        else
            srcs[nin++] = (int)(in[e] >> 1);
    }
    st = tutti_dist_graph_create_adjacent(comm, (int)nin, srcs, (int)nout, dsts, graph_p);
out:
    free(srcs);
    free(dsts);
    free(in);
    free(out);
    free(all);
    free(lay);
    return st;
}

/* ---- a cartesian grid ---- */

static const tt_topo_t *grid_of(tutti_comm_t *comm, const char *name, int *st_p);

/* the rank at coords (each within its dimension) */
static int grid_rank(const tt_topo_t *t, const int *coords)
{
    int r = 0;
    for (int i = 0; i < t->ndims; i++)
        r = r * t->dims[i] + coords[i];
    return r;
}

static void grid_coords(const tt_topo_t *t, int rank, int *coords)
{
    for (int i = t->ndims - 1; i >= 0; i--) {
        coords[i] = rank % t->dims[i];
        rank /= t->dims[i];
    }
}

/* the rank disp steps along dimension dir from this rank (TUTTI_PROC_NULL: past an edge):
 * its own rank with coordinate dir changed, by that dimension's stride */
static int grid_step(const tt_topo_t *t, int dir, long long disp)
{
    long long d = t->dims[dir], x = t->coords[dir] + disp, stride = 1;
    if (!t->periods[dir] && (x < 0 || x >= d))
        return TUTTI_PROC_NULL;
    x = ((x % d) + d) % d;
    for (int i = t->ndims - 1; i > dir; i--)
        stride *= t->dims[i];
    return (int)(grid_rank(t, t->coords) + (x - t->coords[dir]) * stride);
}

/* the grid's shape, as a digest every rank must share */
static uint64_t shape_digest(int ndims, const int *dims, const int *periods)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const uint64_t v0 = (uint64_t)(uint32_t)ndims;
    h = (h ^ v0) * 0x100000001b3ull;
    for (int i = 0; i < ndims; i++) {
        h = (h ^ (uint64_t)(uint32_t)dims[i]) * 0x100000001b3ull;
        h = (h ^ (uint64_t)(periods && periods[i] ? 1 : 0)) * 0x100000001b3ull;
    }
    return h;
}

/* A grid's topology at rank me of it (NULL: out of memory). */
static tt_topo_t *grid_make(int ndims, const int *dims, const int *periods, int me)
{
    tt_topo_t *t = tt_topo_alloc(TUTTI_TOPO_CART, 2 * ndims, 2 * ndims, ndims);
    if (!t)
        return NULL;
    for (int i = 0; i < ndims; i++) {
        t->dims[i] = dims[i];
        t->periods[i] = periods && periods[i] ? 1 : 0;
    }
    grid_coords(t, me, t->coords);
    /* for dimension i: the rank one step back, then one forward; a message to the one
     * back travels back (tag 2i) and arrives at its receive from the front */
    for (int i = 0; i < ndims; i++) {
        const int back = grid_step(t, i, -1), fwd = grid_step(t, i, 1);
        t->sources[2 * i] = t->dests[2 * i] = back;
        t->sources[2 * i + 1] = t->dests[2 * i + 1] = fwd;
        t->dst_tag[2 * i] = 2 * (uint32_t)i;
        t->dst_tag[2 * i + 1] = 2 * (uint32_t)i + 1;
        t->src_tag[2 * i] = 2 * (uint32_t)i + 1;
        t->src_tag[2 * i + 1] = 2 * (uint32_t)i;
    }
    edge_order(t->sources, t->src_tag, t->indeg, t->recv_order);
    edge_order(t->dests, t->dst_tag, t->outdeg, t->send_order);
    self_pairs(t, me);
    return t;
}

int tutti_cart_create(tutti_comm_t *comm, int ndims, const int *dims, const int *periods,
                      tutti_comm_t **cart_p)
{
    static const char name[] = "cart_create";
    TT_CHECK(maker_enter(comm, name, cart_p));
    const int n = comm->nranks;
    prob_t mine = { 0 }, *all = malloc((size_t)n * sizeof(*all));
    if (!all)
        return tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "%s: out of memory", name);
    long long size = 1;
    if (!cart_p)
        mine.kind = P_NULL_OUT;
    else if (ndims < 0 || ndims > TT_TOPO_MAX_DIMS)
        mine = (prob_t){ .kind = P_DIMS_N, .a = ndims };
    else if (ndims > 0 && !dims)
        mine = (prob_t){ .kind = P_DIM, .a = ndims, .b = INT32_MIN };
    for (int i = 0; !mine.kind && i < ndims; i++) {
        if (dims[i] < 1)
            mine = (prob_t){ .kind = P_DIM, .a = i, .b = dims[i] };
        else if ((size *= dims[i]) > n)
            mine = (prob_t){ .kind = P_GRID_SIZE, .a = size > INT32_MAX ? -1 : (int32_t)size };
    }
    const int me = comm->rank, inside = me < size;
    tt_topo_t *t = NULL;
    if (!mine.kind) {
        mine.shape = shape_digest(ndims, dims, periods);
        if (inside && !(t = grid_make(ndims, dims, periods, me)))
            mine = (prob_t){ .kind = P_NOMEM, .a = 4 * ndims, .shape = mine.shape };
    }
    int st = probs_settle(comm, name, &mine, all);
    free(all);
    if (st < 0) {
        tt_topo_free(t);
        return st;
    }
    /* the grid's ranks keep their order (no reordering), the others leave */
    tutti_comm_t *c = NULL;
    st = tutti_comm_split(comm, inside ? 0 : TUTTI_SPLIT_NOCOLOR, me, &c);
    if (st < 0 || !c) {
        tt_topo_free(t);
        return st;
    }
    c->topo = t;
    *cart_p = c;
    return TUTTI_OK;
}

int tutti_cart_sub(tutti_comm_t *comm, const int *remain_dims, tutti_comm_t **sub_p)
{
    static const char name[] = "cart_sub";
    TT_CHECK(maker_enter(comm, name, sub_p));
    int st;
    const tt_topo_t *g = grid_of(comm, name, &st);
    if (!g)
        return st;
    prob_t mine = { 0 }, *all = malloc((size_t)comm->nranks * sizeof(*all));
    int *dims = malloc(2 * ((size_t)g->ndims + 1) * sizeof(int)), *per = dims + g->ndims + 1;
    if (!all || !dims) {
        free(all);
        free(dims);
        return tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "%s: out of memory", name);
    }
    /* every rank must keep the same dimensions (a digest of which, as a grid's shape) */
    if (!sub_p)
        mine.kind = P_NULL_OUT;
    else if (g->ndims && !remain_dims)
        mine = (prob_t){ .kind = P_NULL_LIST, .a = 5, .b = g->ndims };
    for (int i = 0; !mine.kind && i < g->ndims; i++) /* (0 or 1 as MPI's logical; Python's
                                                        wrong lengths pass -1 to fail all) */
        if (remain_dims[i] < 0)
            mine = (prob_t){ .kind = P_RANK, .a = 5, .b = i, .c = remain_dims[i] };
    /* the kept dimensions' grid; the dropped ones' coordinates say which sub-grid */
    int nd = 0, color = 0, key = 0;
    for (int i = 0; !mine.kind && i < g->ndims; i++)
        if (remain_dims[i]) {
            dims[nd] = g->dims[i];
            per[nd++] = g->periods[i];
            key = key * g->dims[i] + g->coords[i];
        } else {
            color = color * g->dims[i] + g->coords[i];
        }
    tt_topo_t *t = NULL;
    if (!mine.kind) {
        mine.shape = shape_digest(g->ndims, g->dims, remain_dims);
        if (!(t = grid_make(nd, dims, per, key)))
            mine = (prob_t){ .kind = P_NOMEM, .a = 4 * nd, .shape = mine.shape };
    }
    free(dims);
    st = probs_settle(comm, name, &mine, all);
    free(all);
    if (st < 0) {
        tt_topo_free(t);
        return st;
    }
    tutti_comm_t *c = NULL;
    if ((st = tutti_comm_split(comm, color, key, &c)) < 0) {
        tt_topo_free(t);
        return st;
    }
    c->topo = t;
    *sub_p = c;
    return TUTTI_OK;
}

/* ---- MPI_Dims_create ---- */

static int int_cmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* f^k < m */
static int below(long long f, int k, long long m)
{
    long long p = 1;
    for (int i = 0; i < k && p < m; i++)
        p *= f;
    return p < m;
}

/* Can m be k factors, each at most cap, from the divisors dv (ascending)? The largest
 * first: it usually fits at once. */
static int can_split(const int *dv, int ndv, int m, int k, int cap)
{
    if (m == 1)
        return 1;
    for (int x = ndv - 1; k > 0 && x >= 0; x--) {
        int f = dv[x];
        if (f == 1 || below(f, k, m))
            break;
        if (f <= cap && f <= m && m % f == 0 && can_split(dv, ndv, m / f, k - 1, f))
            return 1;
    }
    return 0;
}

int tutti_dims_create(int nnodes, int ndims, int *dims)
{
    if (nnodes < 1 || ndims < 0 || (ndims > 0 && !dims))
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                   "dims_create: nnodes %d (at least 1), ndims %d (at least 0), "
                                   "dims %s",
                                   nnodes, ndims, dims ? "given" : "NULL");
    long long fixed = 1;
    int free_n = 0;
    for (int i = 0; i < ndims; i++) {
        if (dims[i] < 0)
            return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                       "dims_create: dims[%d] = %d (0: to fill, or at least 1)", i,
                                       dims[i]);
        if (dims[i] == 0)
            free_n++;
        else if ((fixed *= dims[i]) > nnodes)
            break;
    }
    if (fixed > nnodes || nnodes % fixed || (!free_n && fixed != nnodes))
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                   "dims_create: %d ranks cannot be a grid with the dimensions "
                                   "given (their product%s %lld)",
                                   nnodes, fixed > nnodes ? " exceeds it:" : ":", fixed);
    if (!free_n)
        return TUTTI_OK;
    /* the rest, m, as free_n factors whose largest is least, then the rest's likewise
     * (the closest to each other, non-increasing), over m's divisors */
    int m = (int)(nnodes / fixed), ndv = 0;
    int *dv = malloc(2048 * sizeof(int)), *fr = malloc((size_t)free_n * sizeof(int));
    if (!dv || !fr) {
        free(dv);
        free(fr);
        return tt_thread_error_set(TUTTI_ERR_NOMEM, "dims_create: out of memory");
    }
    for (long long d = 1; d * d <= m; d++) /* (an int has at most 1536 divisors) */
        if (m % d == 0) {
            dv[ndv++] = (int)d;
            if (d * d != m)
                dv[ndv++] = (int)(m / d);
        }
    qsort(dv, (size_t)ndv, sizeof(int), int_cmp);
    int left = m;
    for (int k = 0; k < free_n; k++) {
        fr[k] = left;
        for (int x = 0; x < ndv; x++) {
            int f = dv[x];
            if (f > left || left % f || below(f, free_n - k, left) || (k && f > fr[k - 1]) ||
                !can_split(dv, ndv, left / f, free_n - k - 1, f))
                continue;
            fr[k] = f;
            break;
        }
        left /= fr[k];
    }
    free(dv);
    for (int i = 0, k = 0; i < ndims; i++)
        if (dims[i] == 0)
            dims[i] = fr[k++];
    free(fr);
    return TUTTI_OK;
}

/* ---- queries ---- */

static const tt_topo_t *grid_of(tutti_comm_t *comm, const char *name, int *st_p)
{
    *st_p = TUTTI_OK;
    if (!comm) {
        *st_p = TUTTI_ERR_INVALID_ARG;
        return NULL;
    }
    if (!comm->topo || comm->topo->kind != TUTTI_TOPO_CART) {
        *st_p = tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                  "%s: the communicator is no grid (make one with "
                                  "tutti_cart_create)",
                                  name);
        return NULL;
    }
    return comm->topo;
}

int tutti_topo_test(tutti_comm_t *comm, int *kind_p)
{
    if (!comm || !kind_p)
        return TUTTI_ERR_INVALID_ARG;
    *kind_p = comm->topo ? comm->topo->kind : TUTTI_TOPO_NONE;
    return TUTTI_OK;
}

int tutti_cartdim_get(tutti_comm_t *comm, int *ndims_p)
{
    int st;
    const tt_topo_t *t = grid_of(comm, "cartdim_get", &st);
    if (!t)
        return st;
    if (!ndims_p)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "cartdim_get: ndims_p is NULL");
    *ndims_p = t->ndims;
    return TUTTI_OK;
}

int tutti_cart_get(tutti_comm_t *comm, int maxdims, int *dims, int *periods, int *coords)
{
    int st;
    const tt_topo_t *t = grid_of(comm, "cart_get", &st);
    if (!t)
        return st;
    if (maxdims < 0)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "cart_get: maxdims %d", maxdims);
    size_t k = (size_t)TT_MIN(maxdims, t->ndims) * sizeof(int);
    if (dims && k)
        memcpy(dims, t->dims, k);
    if (periods && k)
        memcpy(periods, t->periods, k);
    if (coords && k)
        memcpy(coords, t->coords, k);
    return TUTTI_OK;
}

int tutti_cart_rank(tutti_comm_t *comm, const int *coords, int *rank_p)
{
    int st;
    const tt_topo_t *t = grid_of(comm, "cart_rank", &st);
    if (!t)
        return st;
    if ((t->ndims && !coords) || !rank_p)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "cart_rank: %s is NULL",
                                 rank_p ? "coords" : "rank_p");
    long long r = 0;
    for (int i = 0; i < t->ndims; i++) {
        long long d = t->dims[i], x = coords[i];
        if (t->periods[i])
            x = ((x % d) + d) % d;
        else if (x < 0 || x >= d)
            return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                     "cart_rank: coords[%d] = %d is outside [0, %d) along a "
                                     "dimension that is not periodic",
                                     i, coords[i], t->dims[i]);
        r = r * d + x;
    }
    *rank_p = (int)r;
    return TUTTI_OK;
}

int tutti_cart_coords(tutti_comm_t *comm, int rank, int maxdims, int *coords)
{
    int st;
    const tt_topo_t *t = grid_of(comm, "cart_coords", &st);
    if (!t)
        return st;
    if (rank < 0 || rank >= comm->nranks)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "cart_coords: rank %d is not in [0, %d)", rank, comm->nranks);
    if (maxdims < t->ndims || (t->ndims && !coords))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "cart_coords: room for %d coordinates%s, the grid has %d", maxdims,
                                 coords ? "" : " (NULL)", t->ndims);
    grid_coords(t, rank, coords);
    return TUTTI_OK;
}

int tutti_cart_shift(tutti_comm_t *comm, int direction, int disp, int *source_p, int *dest_p)
{
    int st;
    const tt_topo_t *t = grid_of(comm, "cart_shift", &st);
    if (!t)
        return st;
    if (direction < 0 || direction >= t->ndims || !source_p || !dest_p)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "cart_shift: direction %d is not in [0, %d)%s", direction,
                                 t->ndims, !source_p || !dest_p ? ", or an output is NULL" : "");
    *source_p = grid_step(t, direction, -(long long)disp);
    *dest_p = grid_step(t, direction, disp);
    return TUTTI_OK;
}

static const tt_topo_t *topo_of(tutti_comm_t *comm, const char *name, int *st_p)
{
    *st_p = TUTTI_OK;
    if (!comm) {
        *st_p = TUTTI_ERR_INVALID_ARG;
        return NULL;
    }
    if (!comm->topo)
        *st_p = tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                  "%s: the communicator has no topology (make one with "
                                  "tutti_dist_graph_create_adjacent or tutti_cart_create)",
                                  name);
    return comm->topo;
}

int tutti_topo_neighbors_count(tutti_comm_t *comm, int *indegree_p, int *outdegree_p)
{
    int st;
    const tt_topo_t *t = topo_of(comm, "topo_neighbors_count", &st);
    if (!t)
        return st;
    if (!indegree_p || !outdegree_p)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "topo_neighbors_count: an output is NULL");
    *indegree_p = t->indeg;
    *outdegree_p = t->outdeg;
    return TUTTI_OK;
}

int tutti_topo_neighbors(tutti_comm_t *comm, int maxindegree, int *sources, int maxoutdegree,
                         int *destinations)
{
    int st;
    const tt_topo_t *t = topo_of(comm, "topo_neighbors", &st);
    if (!t)
        return st;
    if (maxindegree < 0 || maxoutdegree < 0 || (maxindegree && !sources) ||
        (maxoutdegree && !destinations))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "topo_neighbors: maxindegree %d with sources %s, maxoutdegree %d "
                                 "with destinations %s",
                                 maxindegree, sources ? "given" : "NULL", maxoutdegree,
                                 destinations ? "given" : "NULL");
    int in = TT_MIN(maxindegree, t->indeg), out = TT_MIN(maxoutdegree, t->outdeg);
    if (in)
        memcpy(sources, t->sources, (size_t)in * sizeof(int));
    if (out)
        memcpy(destinations, t->dests, (size_t)out * sizeof(int));
    return TUTTI_OK;
}
