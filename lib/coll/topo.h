/* Process topologies (MPI_Dist_graph_create_adjacent, MPI_Cart_create) and what the
 * neighbourhood collectives read of them (topo.c; algorithms/neighbor.c). */
#ifndef TT_TOPO_H
#define TT_TOPO_H

#include <stdint.h>

#include <tutti/tutti.h>

/* A communicator's topology, made once with it and never changed. An edge's tag tells
 * two messages between one pair of ranks apart: in a graph, the k-th place that names a
 * rank (among the sources, or the destinations) has tag k; in a grid, a message that
 * travels back along dimension i has tag 2i, forward 2i + 1 (so that what a rank sends
 * back is what its neighbour receives from the front, also where both are one rank: a
 * periodic dimension of 1 or 2). Messages of a collective between two ranks are matched
 * in the order posted, so both sides post theirs to one peer by (peer, tag):
 * send_order and recv_order. */
typedef struct tt_topo {
    int kind; /* TUTTI_TOPO_GRAPH or TUTTI_TOPO_CART */
    int indeg, outdeg;
    int *sources, *dests;         /* ranks or TUTTI_PROC_NULL */
    uint32_t *src_tag, *dst_tag;  /* per edge */
    int *recv_order, *send_order; /* edge indexes by (peer, tag) */
    int ndims;                    /* a grid's: */
    int *dims, *periods, *coords;
    void *mem;      /* the arrays' one block, */
    size_t mem_len; /* and its bytes */
} tt_topo_t;

void tt_topo_free(tt_topo_t *t);
/* a copy of t (NULL: out of memory), for tutti_comm_dup */
tt_topo_t *tt_topo_copy(const tt_topo_t *t);

#endif /* TT_TOPO_H */
