/* Tree barrier: a binomial fan-in to rank 0, then the same tree back out. Rank v waits
 * for its children v + 2^j (every 2^j below v's lowest set bit), tells its parent
 * v - lowbit(v), waits for the parent's release and releases its children. 2 ceil(log2 n)
 * rounds against dissemination's ceil(log2 n), but rank 0 leaves first, right after
 * it has sent the releases: a rooted call from rank 0 that follows (barrier, then
 * broadcast) starts while the other ranks are still being released.
 */
#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

int tt_barrier_tree(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    char none = 0;
    tt_req_t req[8 * sizeof(int)];
    size_t nreq = 0;

    /* the lowest set bit of r (for rank 0: the first power of two >= n) */
    long low = 1;
    uint32_t level = 0;
    while (low < n && !(r & low)) {
        low <<= 1;
        level++;
    }
    /* fan-in: children r + 2^j, j < level */
    uint32_t l = 0;
    for (long m = 1; m < low; m <<= 1, l++)
        if (r + m < n)
            TT_CHECK(tt_p2p_recv(op, (int)(r + m), &none, 0, l, &req[nreq++]));
    TT_CHECK(tt_p2p_wait_all(op, req, nreq));
    nreq = 0;
    if (r != 0) {
        TT_CHECK(tt_p2p_send(op, (int)(r - low), &none, 0, level, &req[0]));
        TT_CHECK(tt_p2p_recv(op, (int)(r - low), &none, 0, 32 + level, &req[1]));
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
    }
    /* fan-out: the biggest subtree first */
    l = level;
    for (long m = low >> 1; m >= 1; m >>= 1) {
        l--;
        if (r + m < n)
            TT_CHECK(tt_p2p_send(op, (int)(r + m), &none, 0, 32 + l, &req[nreq++]));
    }
    return tt_p2p_wait_all(op, req, nreq);
}
