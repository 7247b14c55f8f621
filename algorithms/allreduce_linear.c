/* Linear allreduce: every rank sends its vector to rank 0, which reduces them in rank
 * order and sends the result back to every rank. Two rounds whatever the rank count,
 * rank 0 handling n - 1 messages each way and n - 1 reductions: the choice only for
 * small vectors where the ranks outnumber the CPUs and a round (a wait for a rank to
 * be scheduled) costs more than a message, as for the linear barrier (barrier_tree.c).
 *
 * Every rank ends with rank 0's bits. The reduction order is fixed (rank 0's vector,
 * then rank 1's, ...), so a given rank count gives the same bits every time.
 */
#include "common.h"
#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

enum { LIN_TAG_IN = 1, LIN_TAG_OUT = 2 };

int tt_allreduce_linear(tt_op_t *op)
{
    const int n = op->nranks;
    const size_t bytes = op->count * op->elem_size;
    if (bytes == 0)
        return TUTTI_OK;

    if (op->rank != 0) {
        tt_req_t req[2];
        /* Rank 0 sends the result only after it has received this rank's vector whole,
         * so the result never lands on a send still being read (in place). */
        TT_CHECK(tt_p2p_send(op, 0, op->sendbuf, bytes, LIN_TAG_IN, &req[0]));
        TT_CHECK(tt_p2p_recv(op, 0, op->recvbuf, bytes, LIN_TAG_OUT, &req[1]));
        return tt_p2p_wait_all(op, req, 2);
    }

    unsigned char *tmp;
    tt_reqs_t hold;
    tt_req_t *req;
    TT_CHECK(tt_linear_root_bufs(op, bytes, &tmp, &hold, &req));
    int rc = tt_linear_reduce_root(op, 0, op->sendbuf, op->recvbuf, bytes, LIN_TAG_IN, tmp, req);
    for (int i = 1; i < n && rc == TUTTI_OK; i++)
        rc = tt_p2p_send(op, i, op->recvbuf, bytes, LIN_TAG_OUT, &req[i - 1]);
    if (rc == TUTTI_OK)
        rc = tt_p2p_wait_all(op, req, (size_t)(n - 1));
    tt_reqs_put(&hold);
    return rc;
}
