/* Binomial tree reduce: in relative ranks (rank - root mod n), rank v receives the
 * partial result of v + 2^j for every 2^j below its lowest set bit (the smallest
 * subtree first) and sends its own partial result to v minus that bit. ceil(log2 n)
 * rounds of the whole vector: the choice for small messages, where latency dominates.
 *
 * Reproducible: a partial result always covers a contiguous run of relative ranks, and
 * each reduction takes the lower run as the first operand, so for a given rank count
 * and root the floats come out the same bits every time.
 */
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

int tt_reduce_tree(tt_op_t *op)
{
    const int n = op->nranks;
    const int vr = (op->rank - op->root + n) % n;
    const size_t bytes = op->count * op->elem_size;

    if (bytes == 0)
        return TUTTI_OK;

    /* the partial result: the root's recvbuf (which may be sendbuf: reduce3 allows
     * dst == a), a scratch buffer elsewhere; children's results land in tmp */
    void *acc = vr == 0 ? op->recvbuf : tt_op_scratch(op, 0, bytes);
    void *tmp = tt_op_scratch(op, 1, bytes);
    if (!acc || !tmp)
        return TUTTI_ERR_NOMEM;

    const void *cur = op->sendbuf; /* until the first reduction: a leaf sends its input */
    tt_req_t req;
    int level = 0;
    for (long mask = 1; mask < n; mask <<= 1, level++) {
        if (vr & mask) {
            int parent = (int)((vr - mask + op->root) % n);
            TT_CHECK(tt_p2p_send(op, parent, cur, bytes, (uint32_t)level, &req));
            return tt_p2p_wait(op, &req);
        }
        if (vr + mask < n) {
            int child = (int)((vr + mask + op->root) % n);
            TT_CHECK(tt_p2p_recv(op, child, tmp, bytes, (uint32_t)level, &req));
            TT_CHECK(tt_p2p_wait(op, &req));
            tt_reduce3(acc, cur, tmp, op->count, op->dtype, op->redop);
            cur = acc;
        }
    }
    /* only the root gets here; with n > 1 it has reduced at least once */
    return TUTTI_OK;
}
