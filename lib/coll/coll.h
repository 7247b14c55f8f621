/* The collectives' descriptor table (coll.c): per collective, the arguments
 * its calls have, and the steps the executor runs in place of or around the chosen
 * algorithm (exec.c reads an op's row through op->desc, and knows no collective by
 * name). */
#ifndef TT_COLL_H
#define TT_COLL_H

#include "coll/algo.h"

/* One call as its public entry point saw it (coll.c). */
typedef struct tt_coll_call tt_coll_call_t;

/* Which arguments a collective's calls have. */
#define TT_ARG_REDOP 1u /* a reduction: TUTTI_AVG sums, then divides (avg) */
#define TT_ARG_ROOT 2u  /* a root rank */
#define TT_ARG_LAYOUT                                                                              \
    4u                  /* per-rank counts and displacements: the op points into an
                            owned copy (tt_exec_issue's layout) */
#define TT_ARG_EDGES 8u /* the layout is per edge of the communicator's topology (topo.h) */

typedef struct tt_coll_desc {
    unsigned args; /* TT_ARG_* */
    /* the call's buffers and counts into the op, with their checks; layout: 4 x nranks
     * (sendcounts, sdispls, recvcounts, rdispls) where args has TT_ARG_LAYOUT */
    int (*fill)(tutti_comm_t *comm, const tt_coll_call_t *c, tt_op_t *o, size_t *layout);
    /* count 0 still checks the call against the peers' (a barrier under its
     * envelope), where a count-0 call must fail with mismatched peers */
    int empty_barrier;
    tt_algo_fn local;         /* one rank: the data moves within this rank's buffers */
    tt_algo_fn post;          /* after the algorithm on every rank (NULL: nothing) */
    void (*avg)(tt_op_t *op); /* TUTTI_AVG: divide the sum where it landed */
    /* TUTTI_BIND may hold the thread on one CPU of a crowded host (exec.c): only where
     * that measured no slower. Broadcast's chain runs neighbours in a pipeline, which
     * neighbours on one CPU cannot overlap (4 ranks over tcp: 2-4x slower held at
     * 256 KiB-1 MiB); alltoall was mixed (shm 4 MiB 1.16x slower, tcp 4 MiB 0.73x). */
    int hold;
    /* every algorithm reduces in rank order (scan, exscan): an op that does not commute
     * runs whichever was picked; elsewhere exec.c runs the linear one for it */
    int in_order;
} tt_coll_desc_t;

/* Indexed by tt_coll_t; the entry of TT_COLL_NONE is empty. */
extern const tt_coll_desc_t tt_coll_table[TT_COLL_COUNT_];

#endif /* TT_COLL_H */
