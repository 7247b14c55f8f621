/* Tree barriers: a k-nomial fan-in to rank 0, then the same tree back out. In base k,
 * rank v's parent clears v's lowest nonzero digit; its children add a digit 1..k-1
 * below it. Rank v waits for its children, tells its parent, waits for the parent's
 * release and releases its children. `tree` is binomial (k = 2): 2 ceil(log2 n) rounds
 * against dissemination's ceil(log2 n). `linear` is flat (k = n): every rank tells rank
 * 0 and waits for its release, 2 rounds, rank 0 handling n - 1 messages each way; where
 * a message is a store into shared memory and the ranks outnumber the CPUs, the rounds
 * are what costs (each waits for a forwarding rank to be scheduled), and the linear one
 * has the fewest. Both let rank 0 out first, right after it has sent the releases: a
 * rooted call from rank 0 that follows (barrier, then broadcast) starts while the
 * other ranks are still being released.
 */

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

static int barrier_knomial(tt_op_t *op, long k)
{
    const int n = op->nranks, r = op->rank;
    char none = 0;

    /* the place value of r's lowest nonzero digit (for rank 0: the first power >= n) */
    long low = 1;
    uint32_t level = 0;
    while (low < n && (r / low) % k == 0) {
        low *= k;
        level++;
    }
    size_t nchild = 0;
    for (long m = 1; m < low; m *= k)
        for (long d = 1; d < k && r + d * m < n; d++)
            nchild++;
    tt_reqs_t hold;
    tt_req_t *req = tt_reqs_get(&hold, nchild > 2 ? nchild : 2);
    if (!req)
        return TUTTI_ERR_NOMEM;
    int rc = TUTTI_OK;
    /* fan-in: children r + d k^j, j < level */
    size_t nreq = 0;
    uint32_t l = 0;
    for (long m = 1; m < low && rc == TUTTI_OK; m *= k, l++)
        for (long d = 1; d < k && r + d * m < n && rc == TUTTI_OK; d++)
            rc = tt_p2p_recv(op, (int)(r + d * m), &none, 0, l, &req[nreq++]);
    if (rc == TUTTI_OK)
        rc = tt_p2p_wait_all(op, req, nreq);
    if (rc == TUTTI_OK && r != 0) {
        int parent = (int)(r - ((r / low) % k) * low);
        rc = tt_p2p_send(op, parent, &none, 0, level, &req[0]);
        if (rc == TUTTI_OK)
            rc = tt_p2p_recv(op, parent, &none, 0, 32 + level, &req[1]);
        if (rc == TUTTI_OK)
            rc = tt_p2p_wait_all(op, req, 2);
    }
    /* fan-out: the biggest subtrees first */
    nreq = 0;
    l = level;
    for (long m = low / k; m >= 1 && rc == TUTTI_OK; m /= k) {
        l--;
        for (long d = 1; d < k && r + d * m < n && rc == TUTTI_OK; d++)
            rc = tt_p2p_send(op, (int)(r + d * m), &none, 0, 32 + l, &req[nreq++]);
    }
    if (rc == TUTTI_OK)
        rc = tt_p2p_wait_all(op, req, nreq);
    tt_reqs_put(&hold);
    return rc;
}

int tt_barrier_tree(tt_op_t *op)
{
    return barrier_knomial(op, 2);
}

int tt_barrier_linear(tt_op_t *op)
{
    return barrier_knomial(op, op->nranks > 2 ? op->nranks : 2);
}
