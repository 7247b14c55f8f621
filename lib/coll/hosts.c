/* What the algorithms read from their communicator: the host map and the cost model
 * every rank agreed on (hier), and whether this rank's own host is crowded. A leaf: it
 * calls nothing. */
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

int tt_op_host_crowded(const tt_op_t *op)
{
    return op->comm->host_cpus > 0 && op->comm->host_ranks > op->comm->host_cpus;
}
