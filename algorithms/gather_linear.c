/* Linear gather: every rank sends its block to the root, which posts all n-1 receives
 * at once, each straight into its place in recvbuf. One message per rank and no
 * forwarding: the root's link is the bottleneck either way, so this is the choice for
 * few ranks or large blocks, and the only one for gatherv (non-roots need not know the
 * other ranks' counts).
 */
#include "common.h"
#include "coll/algo.h"

int tt_gather_linear(tt_op_t *op)
{
    return tt_linear_rooted(op, 1);
}
