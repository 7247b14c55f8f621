/* Linear scatter: the root posts all n-1 sends at once, each straight from its block in
 * sendbuf; every other rank receives its block into recvbuf. The mirror of
 * gather_linear: for few ranks or large blocks, and the only one for scatterv.
 */
#include "common.h"
#include "coll/algo.h"

int tt_scatter_linear(tt_op_t *op)
{
    return tt_linear_rooted(op, 0);
}
