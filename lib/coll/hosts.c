/* What hier (algorithms/allreduce_hier.c) reads from its communicator: the host map and
 * the cost model every rank agreed on. A leaf: it calls nothing. */
#include "coll/algo.h"
#include "core/state.h"

const int *tt_op_host_map(const tt_op_t *op)
{
    return op->comm->host_of;
}

const tt_cost_t *tt_op_cost(const tt_op_t *op)
{
    return &op->comm->cost;
}
