/* The names of the collectives ("allreduce", what messages and TUTTI_ALGO say) and the
 * algorithm table: a leaf that envelopes, failures and selection read. */
#include <string.h>

#include "coll/algo.h"
#include "base/base.h"

/* Ids travel in envelopes: never renumber, never reuse. */
static const tt_algo_t tt_algo_ring = {"ring", TT_COLL_ALLREDUCE, 1, tt_allreduce_ring};
static const tt_algo_t tt_algo_rd = {"rd", TT_COLL_ALLREDUCE, 2, tt_allreduce_rd};
static const tt_algo_t tt_algo_chain = {"chain", TT_COLL_BROADCAST, 3, tt_broadcast_chain};
static const tt_algo_t tt_algo_tree = {"tree", TT_COLL_BROADCAST, 4, tt_broadcast_tree};
static const tt_algo_t tt_algo_dissemination = {"dissemination", TT_COLL_BARRIER, 5,
                                                tt_barrier_dissemination};
static const tt_algo_t tt_algo_reduce_tree = {"tree", TT_COLL_REDUCE, 6, tt_reduce_tree};
static const tt_algo_t tt_algo_reduce_ring = {"ring", TT_COLL_REDUCE, 7, tt_reduce_ring};
static const tt_algo_t tt_algo_allgather_ring = {"ring", TT_COLL_ALLGATHER, 8,
                                                 tt_allgather_ring};
static const tt_algo_t tt_algo_allgather_rd = {"rd", TT_COLL_ALLGATHER, 9, tt_allgather_rd};
static const tt_algo_t tt_algo_reduce_scatter_ring = {"ring", TT_COLL_REDUCE_SCATTER, 10,
                                                      tt_reduce_scatter_ring};
static const tt_algo_t tt_algo_reduce_scatter_pairwise = {"pairwise", TT_COLL_REDUCE_SCATTER,
                                                          11, tt_reduce_scatter_pairwise};
static const tt_algo_t tt_algo_gather_linear = {"linear", TT_COLL_GATHER, 12,
                                                tt_gather_linear};
static const tt_algo_t tt_algo_gather_tree = {"tree", TT_COLL_GATHER, 13, tt_gather_tree};
static const tt_algo_t tt_algo_scatter_linear = {"linear", TT_COLL_SCATTER, 14,
                                                 tt_scatter_linear};
static const tt_algo_t tt_algo_scatter_tree = {"tree", TT_COLL_SCATTER, 15, tt_scatter_tree};
static const tt_algo_t tt_algo_alltoall_pairwise = {"pairwise", TT_COLL_ALLTOALL, 16,
                                                    tt_alltoall_pairwise};
static const tt_algo_t tt_algo_alltoall_ring = {"ring", TT_COLL_ALLTOALL, 17,
                                                tt_alltoall_ring};
static const tt_algo_t tt_algo_hd = {"hd", TT_COLL_ALLREDUCE, 18, tt_allreduce_hd};
static const tt_algo_t tt_algo_dbtree = {"dbtree", TT_COLL_ALLREDUCE, 19, tt_allreduce_dbtree};

static const tt_algo_t *const tt_algos[] = {
    &tt_algo_ring,
    &tt_algo_rd,
    &tt_algo_chain,
    &tt_algo_tree,
    &tt_algo_dissemination,
    &tt_algo_reduce_tree,
    &tt_algo_reduce_ring,
    &tt_algo_allgather_ring,
    &tt_algo_allgather_rd,
    &tt_algo_reduce_scatter_ring,
    &tt_algo_reduce_scatter_pairwise,
    &tt_algo_gather_linear,
    &tt_algo_gather_tree,
    &tt_algo_scatter_linear,
    &tt_algo_scatter_tree,
    &tt_algo_alltoall_pairwise,
    &tt_algo_alltoall_ring,
    &tt_algo_hd,
    &tt_algo_dbtree,
};

static const char *const tt_coll_names[TT_COLL_COUNT_] = {
    [TT_COLL_ALLREDUCE] = "allreduce",
    [TT_COLL_BROADCAST] = "broadcast",
    [TT_COLL_BARRIER] = "barrier",
    [TT_COLL_REDUCE] = "reduce",
    [TT_COLL_ALLGATHER] = "allgather",
    [TT_COLL_REDUCE_SCATTER] = "reduce_scatter",
    [TT_COLL_GATHER] = "gather",
    [TT_COLL_SCATTER] = "scatter",
    [TT_COLL_ALLTOALL] = "alltoall",
};

const char *tt_coll_name(tt_coll_t coll)
{
    if ((int)coll <= TT_COLL_NONE || coll >= TT_COLL_COUNT_)
        return NULL;
    return tt_coll_names[coll];
}

tt_coll_t tt_coll_parse(const char *name)
{
    if (!name)
        return TT_COLL_NONE;
    for (int c = TT_COLL_NONE + 1; c < TT_COLL_COUNT_; c++)
        if (strcmp(name, tt_coll_names[c]) == 0)
            return (tt_coll_t)c;
    return TT_COLL_NONE;
}

const tt_algo_t *const *tt_algo_all(size_t *n_p)
{
    if (n_p)
        *n_p = TT_ARRAY_SIZE(tt_algos);
    return tt_algos;
}

const tt_algo_t *tt_algo_find(tt_coll_t coll, const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < TT_ARRAY_SIZE(tt_algos); i++)
        if (tt_algos[i]->coll == coll && strcmp(tt_algos[i]->name, name) == 0)
            return tt_algos[i];
    return NULL;
}
