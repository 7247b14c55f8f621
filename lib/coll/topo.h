/* Process topologies (MPI_Dist_graph_create_adjacent, MPI_Cart_create) and what the
 * neighbourhood collectives read of them (topo.c; algorithms/neighbor.c). */
#ifndef TT_TOPO_H
#define TT_TOPO_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tutti/tutti.h>

/* A communicator's topology, made once with it and never changed. An edge's tag tells
 * two messages between one pair of ranks apart: in a graph, the k-th place that names a
 * rank (among the sources, or the destinations) has tag k; in a grid, a message that
 * travels back along dimension i has tag 2i, forward 2i + 1 (so that what a rank sends
 * back is what its neighbour receives from the front, also where both are one rank: a
 * periodic dimension of 1 or 2). Messages of a collective between two ranks are matched
 * in the order posted, so both sides post theirs to one peer by (peer, tag):
 * send_order and recv_order. */
/* a grid's dimensions at most (so that its 2 x ndims edges and their arrays fit an int) */
#define TT_TOPO_MAX_DIMS (1 << 20)

typedef struct tt_topo {
    int kind; /* TUTTI_TOPO_GRAPH or TUTTI_TOPO_CART */
    int indeg, outdeg;
    int *sources, *dests;         /* ranks or TUTTI_PROC_NULL */
    uint32_t *src_tag, *dst_tag;  /* per edge */
    int *recv_order, *send_order; /* edge indexes by (peer, tag) */
    int *self_send; /* per source: for an edge from this rank, the destination edge whose
                       block it takes (the same tag); else -1 */
    int ndims;      /* a grid's: */
    int *dims, *periods, *coords;
    void *mem;      /* the arrays' one block, */
    size_t mem_len; /* and its bytes */
} tt_topo_t;

/* Inline, so that the communicator (core/comm.c: its dup and destroy) calls nothing of
 * topo.c, which calls the communicator's (tools/dev/cycles.py keeps the layers' calls
 * one way). */
static inline void tt_topo_point(tt_topo_t *t)
{
    int *p = (int *)t->mem;
    t->sources = p;
    p += t->indeg;
    t->dests = p;
    p += t->outdeg;
    t->recv_order = p;
    p += t->indeg;
    t->send_order = p;
    p += t->outdeg;
    t->self_send = p;
    p += t->indeg;
    t->dims = p;
    p += t->ndims;
    t->periods = p;
    p += t->ndims;
    t->coords = p;
    p += t->ndims;
    t->src_tag = (uint32_t *)p;
    t->dst_tag = t->src_tag + t->indeg;
}

/* A topology of these degrees and dimensions, its arrays zeroed (NULL: no memory). */
static inline tt_topo_t *tt_topo_alloc(int kind, int in, int out, int nd)
{
    tt_topo_t *t = (tt_topo_t *)calloc(1, sizeof(*t));
    size_t len = (3 * (size_t)in + 2 * (size_t)out + 3 * (size_t)nd) * sizeof(int) +
                 ((size_t)in + (size_t)out) * sizeof(uint32_t);
    if (!t || !(t->mem = calloc(1, len ? len : 1))) {
        free(t);
        return NULL;
    }
    t->mem_len = len;
    t->kind = kind;
    t->indeg = in;
    t->outdeg = out;
    t->ndims = nd;
    tt_topo_point(t);
    return t;
}

static inline void tt_topo_free(tt_topo_t *t)
{
    if (t)
        free(t->mem);
    free(t);
}

/* a copy of t (NULL: out of memory), for tutti_comm_dup */
static inline tt_topo_t *tt_topo_copy(const tt_topo_t *t)
{
    tt_topo_t *c = tt_topo_alloc(t->kind, t->indeg, t->outdeg, t->ndims);
    if (c)
        memcpy(c->mem, t->mem, t->mem_len);
    return c;
}

#endif /* TT_TOPO_H */
