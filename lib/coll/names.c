/* The names of the collectives ("allreduce", what messages and TUTTI_ALGO say) and of
 * the algorithms by id: a leaf that envelopes, failures and selection read (the
 * algorithms' functions are bound in select.c, above them). */
#include <string.h>

#include "coll/names.h"
#include "base/base.h"

/* name and collective by id */
static const struct {
    const char *name;
    tt_coll_t coll;
    uint32_t id;
} tt_algo_names[] = {
#define TT_ALGO_X(name, coll, id, fn, hints) { name, coll, id },
#include "coll/algos.def"
#undef TT_ALGO_X
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
    [TT_COLL_SCAN] = "scan",
    [TT_COLL_EXSCAN] = "exscan",
    [TT_COLL_NEIGHBOR_ALLGATHER] = "neighbor_allgather",
    [TT_COLL_NEIGHBOR_ALLTOALL] = "neighbor_alltoall",
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

const char *tt_algo_name(uint32_t id)
{
    for (size_t i = 0; i < TT_ARRAY_SIZE(tt_algo_names); i++)
        if (tt_algo_names[i].id == id)
            return tt_algo_names[i].name;
    return NULL;
}

const char *tt_algo_nth(tt_coll_t coll, int i)
{
    for (size_t k = 0; k < TT_ARRAY_SIZE(tt_algo_names) && i >= 0; k++)
        if (tt_algo_names[k].coll == coll && i-- == 0)
            return tt_algo_names[k].name;
    return NULL;
}
