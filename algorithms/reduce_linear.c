/* Linear reduce: every rank sends its vector to the root, which reduces them in rank
 * order (rank 0's vector, then rank 1's, ...) whatever the root (tt_linear_reduce_root,
 * common.c, shared with the linear allreduce and reduce-scatter). One round, the root
 * taking in n - 1 messages and making n - 1 reductions: for small vectors where a
 * round costs more than a message (the ranks outnumber the CPUs, as for the linear
 * allreduce), and the algorithm for an op that does not commute (lib/core/exec.c):
 * the tree reduces in relative rank order (rank - root mod n), which is rank order for
 * root 0 only.
 */
#include "common.h"
#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

enum { LIN_TAG_IN = 1 };

int tt_reduce_linear(tt_op_t *op)
{
    const int root = op->root;
    const size_t bytes = op->count * op->elem_size;
    if (bytes == 0)
        return TUTTI_OK;

    if (op->rank != root) {
        tt_req_t req;
        TT_CHECK(tt_p2p_send(op, root, op->sendbuf, bytes, LIN_TAG_IN, &req));
        return tt_p2p_wait(op, &req);
    }

    unsigned char *tmp;
    tt_reqs_t hold;
    tt_req_t *req;
    TT_CHECK(tt_linear_root_bufs(op, bytes, &tmp, &hold, &req));
    int rc = tt_linear_reduce_root(op, root, op->sendbuf, op->recvbuf, bytes, LIN_TAG_IN, tmp, req);
    tt_reqs_put(&hold);
    return rc;
}
