/* Dissemination barrier: in round k every rank signals rank + 2^k and waits for
 * rank - 2^k (mod n). After ceil(log2 n) rounds each rank has heard, directly or
 * through others, from every rank, for any n, with no root to become a hot spot.
 */
#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

int tt_barrier_dissemination(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    /* the messages are empty, but the transports get a valid pointer all the same */
    char none = 0;
    tt_req_t req[2];

    uint32_t round = 0;
    for (long dist = 1; dist < n; dist <<= 1, round++) {
        int to = (int)((r + dist) % n);
        int from = (int)((r - dist + n) % n);
        TT_CHECK(tt_p2p_send(op, to, &none, 0, round, &req[1]));
        TT_CHECK(tt_p2p_recv(op, from, &none, 0, round, &req[0]));
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
    }
    return TUTTI_OK;
}
