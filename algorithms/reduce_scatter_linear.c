/* Linear reduce-scatter: every rank sends its whole input to rank 0, which reduces the
 * vectors in rank order and sends each rank its block of the result. Two rounds whatever
 * the rank count, rank 0 handling n - 1 messages each way and n - 1 reductions of the
 * whole vector: the choice only for small vectors where the ranks outnumber the CPUs and
 * a round (a wait for a rank to be scheduled) costs more than a message, as for the
 * linear barrier, allreduce and allgather.
 *
 * The input is the blocks back to back (reduce_scatterv's layout has no displacements).
 * Rank 0 sends a rank its block only after it has received that rank's input whole, so
 * the result never lands on a send still being read (in place, or recvbuf inside
 * sendbuf as NCCL's in place). Operand order: rank 0's input, then rank 1's, ... :
 * fixed for a given rank count, and every rank's block comes from the same sums.
 */
#include <string.h>

#include "common.h"
#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

enum { LIN_TAG_IN = 1, LIN_TAG_OUT = 2 };

int tt_reduce_scatter_linear(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size, *cnt = op->recvcounts, *dsp = op->rdispls;
    const size_t total = op->count * es; /* the input: every block, back to back */
    /* Nothing to move still exchanges (empty) messages: their envelopes are what tells
     * a rank that passed 0 from ranks that passed more (this collective has no empty
     * barrier, lib/coll/coll.c) */
    unsigned char none;
    const unsigned char *in = total ? op->sendbuf : &none;
    unsigned char *out = cnt[r] ? op->recvbuf : &none;

    if (r != 0) {
        tt_req_t req[2];
        TT_CHECK(tt_p2p_send(op, 0, in, total, LIN_TAG_IN, &req[0]));
        TT_CHECK(tt_p2p_recv(op, 0, out, cnt[r] * es, LIN_TAG_OUT, &req[1]));
        return tt_p2p_wait_all(op, req, 2);
    }

    /* scratch 0: the n - 1 inputs received, then the result (never 0 bytes: the first
     * request of a communicator's scratch would give NULL) */
    unsigned char *tmp = tt_op_scratch(op, 0, TT_MAX((size_t)n * total, (size_t)1));
    if (!tmp)
        return TUTTI_ERR_NOMEM;
    unsigned char *acc = tmp + (size_t)(n - 1) * total;
    tt_reqs_t hold;
    tt_req_t *req = tt_reqs_get(&hold, (size_t)(n - 1));
    if (!req)
        return TUTTI_ERR_NOMEM;
    int rc = tt_linear_reduce_root(op, 0, in, acc, total, LIN_TAG_IN, tmp, req);
    for (int i = 1; i < n && rc == TUTTI_OK; i++)
        rc = tt_p2p_send(op, i, acc + dsp[i] * es, cnt[i] * es, LIN_TAG_OUT, &req[i - 1]);
    /* every input has been read: rank 0's block may overwrite its own input now */
    if (rc == TUTTI_OK && cnt[0])
        tt_copy(out, acc + dsp[0] * es, cnt[0] * es);
    if (rc == TUTTI_OK)
        rc = tt_p2p_wait_all(op, req, (size_t)(n - 1));
    tt_reqs_put(&hold);
    return rc;
}
