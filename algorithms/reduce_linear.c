/* Linear reduce: every rank sends its vector to the root, which reduces them in rank
 * order (rank 0's vector, then rank 1's, ...) whatever the root. One round, the root
 * taking in n - 1 messages and making n - 1 reductions: for small vectors where a
 * round costs more than a message (the ranks outnumber the CPUs, as for the linear
 * allreduce), and the algorithm for an op that does not commute (lib/core/exec.c):
 * the tree reduces in relative rank order (rank - root mod n), which is rank order for
 * root 0 only.
 *
 * Before the root's own turn the partial result gathers in rank 0's slot, so that an
 * in-place root's input (its recvbuf) is read before anything lands on it.
 */
#include "common.h"
#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

enum { LIN_TAG_IN = 1 };

int tt_reduce_linear(tt_op_t *op)
{
    const int n = op->nranks, root = op->root;
    const size_t bytes = op->count * op->elem_size;
    if (bytes == 0)
        return TUTTI_OK;

    if (op->rank != root) {
        tt_req_t req;
        TT_CHECK(tt_p2p_send(op, root, op->sendbuf, bytes, LIN_TAG_IN, &req));
        return tt_p2p_wait(op, &req);
    }

    /* the other ranks' vectors, in rank order without the root's */
    unsigned char *tmp = tt_op_scratch(op, 0, (size_t)(n - 1) * bytes);
    if (!tmp)
        return TUTTI_ERR_NOMEM;
    tt_reqs_t hold;
    tt_req_t *req = tt_reqs_get(&hold, (size_t)(n - 1));
    if (!req)
        return TUTTI_ERR_NOMEM;
#define LIN_SLOT(i) (tmp + (size_t)((i) < root ? (i) : (i)-1) * bytes)
    int rc = TUTTI_OK;
    for (int i = 0, k = 0; i < n && rc == TUTTI_OK; i++)
        if (i != root)
            rc = tt_p2p_recv(op, i, LIN_SLOT(i), bytes, LIN_TAG_IN, &req[k++]);
    if (rc == TUTTI_OK)
        rc = tt_p2p_wait_all(op, req, (size_t)(n - 1));
    if (rc == TUTTI_OK) {
        const void *cur = root == 0 ? op->sendbuf : LIN_SLOT(0);
        for (int i = 1; i < n; i++) {
            void *dst = i < root ? LIN_SLOT(0) : op->recvbuf;
            tt_reduce3(dst, cur, i == root ? op->sendbuf : LIN_SLOT(i), op->count, op->dtype,
                       op->redop);
            cur = dst;
        }
    }
#undef LIN_SLOT
    tt_reqs_put(&hold);
    return rc;
}
