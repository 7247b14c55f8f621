/* Algorithms: one file each in algorithms/, registered in one table (lib/coll/select.c),
 * chosen per (collective, bytes, ranks) or by the TUTTI_ALGO override. */
#ifndef TT_ALGO_H
#define TT_ALGO_H

#include <stddef.h>

#include "coll/cost.h"
#include "coll/names.h"
#include "core/op.h"

typedef int (*tt_algo_fn)(tt_op_t *op);

typedef struct tt_algo {
    const char *name; /* "ring", "rd", "chain", "tree", "dissemination" */
    tt_coll_t coll;
    uint32_t id; /* unique, nonzero; travels in envelopes */
    tt_algo_fn run;
    uint32_t tp_hints; /* TUTTI_TP_HINT_*: set on every request of its ops (algos.def) */
} tt_algo_t;

/* Every algorithm, and those of one collective. */
const tt_algo_t *const *tt_algo_all(size_t *n_p);
const tt_algo_t *tt_algo_find(tt_coll_t coll, const char *name);

/* A parsed TUTTI_ALGO string:
 *   spec    := entry (';' entry)*
 *   entry   := coll ':' choice (',' choice)*   |  name (applies to every collective
 *                                                  that has an algorithm of that name)
 *   choice  := name ['@<' size]                 (size: 4096, 64K, 1M ...)
 * For a collective, the first choice whose bound exceeds the byte count (or that has no
 * bound) wins. */
typedef struct tt_algo_override tt_algo_override_t;
/* spec NULL or "" gives NULL (no override) and TUTTI_OK. On error, err says what was
 * expected and where. */
int tt_algo_override_parse(const char *spec, tt_algo_override_t **ovr_p, char *err, size_t errlen);
void tt_algo_override_free(tt_algo_override_t *ovr);
/* Does ovr choose an algorithm for coll? (NULL: no) */
int tt_algo_override_sets(const tt_algo_override_t *ovr, tt_coll_t coll);
/* Add spec's choices (TUTTI_ALGO syntax) to *ovr_p for the collectives it leaves to the
 * model (*ovr_p may be NULL: then spec's alone). */
int tt_algo_override_merge(tt_algo_override_t **ovr_p, const char *spec, char *err, size_t errlen);
/* ovr's choices in one spelling, whatever the spec's ("coll:name@<bytes,name;..." in the
 * collectives' order; a bare name, 64K and an entry that replaces an earlier one resolved),
 * so that two specs that mean the same give the same text: into *canon_p (malloc'ed; NULL
 * for no override, or one that chooses nothing). TUTTI_ERR_NOMEM without memory. */
int tt_algo_override_canon(const tt_algo_override_t *ovr, char **canon_p);
/* From tuning file `path` (lines "<transport> <ranks> <TUTTI_ALGO spec>", written by
 * bench/tune.py), the spec for this transport and rank count into *spec_p (malloc'ed;
 * NULL: the file has none). An unreadable file or a bad spec is TUTTI_ERR_CONFIG. */
int tt_algo_tune_load(const char *path, const char *transport, int nranks, char **spec_p, char *err,
                      size_t errlen);

/* The algorithm to run: the override's choice if it names one, else the cost model's
 * (cost NULL: the tcp table) for this size, rank count and largest pipelining chunk.
 * Never NULL for a valid coll. */
const tt_algo_t *tt_algo_select(const tt_algo_override_t *ovr, const tt_cost_t *cost,
                                tt_coll_t coll, size_t bytes, int nranks, size_t chunk_max);

/* The algorithms, one file each in algorithms/. */
int tt_allreduce_ring(tt_op_t *op);
int tt_allreduce_rd(tt_op_t *op);
int tt_broadcast_chain(tt_op_t *op);
int tt_broadcast_tree(tt_op_t *op);
int tt_broadcast_linear(tt_op_t *op); /* the root to every rank */
int tt_barrier_dissemination(tt_op_t *op);
int tt_barrier_tree(tt_op_t *op);   /* binomial fan-in to rank 0 and back out */
int tt_barrier_linear(tt_op_t *op); /* every rank to rank 0 and back */
/* issue 3: the other collectives */
int tt_reduce_tree(tt_op_t *op);         /* binomial tree to the root */
int tt_reduce_ring(tt_op_t *op);         /* ring reduce-scatter, then gather to root */
int tt_reduce_linear(tt_op_t *op);       /* every rank to the root; rank order */
int tt_allgather_ring(tt_op_t *op);      /* any layout (allgatherv too) */
int tt_allgather_rd(tt_op_t *op);        /* recursive doubling; any rank count */
int tt_allgather_pairwise(tt_op_t *op);  /* every block to every rank at once; any layout */
int tt_reduce_scatter_ring(tt_op_t *op); /* any layout */
int tt_reduce_scatter_pairwise(tt_op_t *op);
int tt_gather_linear(tt_op_t *op);
int tt_gather_tree(tt_op_t *op); /* binomial */
int tt_scatter_linear(tt_op_t *op);
int tt_scatter_tree(tt_op_t *op); /* binomial */
int tt_alltoall_pairwise(tt_op_t *op);
int tt_alltoall_ring(tt_op_t *op);
int tt_alltoall_bruck(tt_op_t *op);
int tt_alltoall_linear(tt_op_t *op);
int tt_allreduce_hd(tt_op_t *op);          /* halving-doubling (Rabenseifner) */
int tt_allreduce_dbtree(tt_op_t *op);      /* NCCL's double binary tree, pipelined */
int tt_allreduce_hier(tt_op_t *op);        /* within hosts, then across them (NCCL's split) */
int tt_allreduce_linear(tt_op_t *op);      /* every rank to rank 0 and back */
int tt_allgather_hier(tt_op_t *op);        /* across hosts by column, then within */
int tt_reduce_scatter_hier(tt_op_t *op);   /* within hosts, then across by column */
int tt_allgather_linear(tt_op_t *op);      /* every block to rank 0, all of them back */
int tt_reduce_scatter_linear(tt_op_t *op); /* every input to rank 0, a block back to each */
/* scan and exscan (op->coll says which) */
int tt_scan_linear(tt_op_t *op); /* a pipelined chain 0 -> 1 -> ... in rank order */
int tt_scan_rd(tt_op_t *op);     /* recursive doubling: ceil(log2 p) exchanges */
/* neighbor_allgather(v) and neighbor_alltoall(v): along the topology's edges */
int tt_neighbor_direct(tt_op_t *op);

/* For hier (lib/coll/hosts.c): the communicator's host map, rank -> host index (NULL:
 * not known), and its cost model. */
const int *tt_op_host_map(const tt_op_t *op);
const tt_cost_t *tt_op_cost(const tt_op_t *op);
/* 1 where this rank's host has more of the communicator's ranks than CPUs they may run
 * on (this host's count, as the shm transport's; tt_cost_crowded is rank 0's host's) */
int tt_op_host_crowded(const tt_op_t *op);

/* A sender of one message to a single receiver (a broadcast tree's rank with one child,
 * the chain's root, a linear root of 2 ranks) streams it below TT_STREAM_ONE_BYTES where
 * the host's ranks have a CPU each: clears the single-copy hint on this rank's requests
 * (the sender decides; the receiver follows its record; this rank's host counts, not
 * rank 0's). Its CPU is otherwise idle, so two copies through the cache-hot ring, at
 * once on two CPUs, beat the receiver's lone pull, with the same traffic to memory: 2
 * ranks, broadcast 16-64 MiB, 0.72-0.78x the pull's time; level at 128 MiB, the pull
 * 0.9x at 256 MiB (docs/benchmarks.md, the forty-ninth session). Not with two receivers
 * or more (the sender would copy once for each, the pulls not at all), nor on a crowded
 * host (the ring's hand-offs wait for CPUs). algorithms/common.c. */
#define TT_STREAM_ONE_BYTES ((size_t)128 << 20)
void tt_stream_to_one(tt_op_t *op, int receivers, size_t bytes);

/* The descriptor table's steps (lib/coll/coll.h), never selected: one rank's copies
 * (algorithms/local.c), and the rooted collectives' closing handshake
 * (algorithms/handshake.c). */
int tt_local_copy(tt_op_t *op);   /* allreduce, broadcast, reduce, scan */
int tt_local_gather(tt_op_t *op); /* allgather, gather */
int tt_local_reduce_scatter(tt_op_t *op);
int tt_local_scatter(tt_op_t *op);
int tt_local_alltoall(tt_op_t *op);
int tt_local_none(tt_op_t *op);           /* barrier, exscan */
int tt_post_confirm_release(tt_op_t *op); /* broadcast, scatter */
int tt_post_release(tt_op_t *op);         /* reduce, gather, scan, exscan */

#endif /* TT_ALGO_H */
