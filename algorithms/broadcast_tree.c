/* Binomial tree broadcast: in relative ranks (rank - root mod n), rank v receives the
 * whole message from v minus its lowest set bit and sends it on to v + 2^j for every
 * 2^j below that bit. ceil(log2 n) rounds, the biggest subtree served first; the choice
 * for small messages, where latency dominates.
 */
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

int tt_broadcast_tree(tt_op_t *op)
{
    const int n = op->nranks;
    const size_t bytes = op->count * op->elem_size;
    /* relative ranks and back without divisions (a small call is ~0.1 us) */
    const int vr = op->rank >= op->root ? op->rank - op->root : op->rank - op->root + n;
    void *recv = op->recvbuf;
    const void *src = recv;

    if (bytes == 0)
        return TUTTI_OK;

    /* 2^level is the edge length: the tag tells the levels apart */
    long mask = 1;
    int level = 0;
    tt_req_t req[8 * sizeof(int)];
    if (vr == 0) {
        src = op->sendbuf;
        while (mask < n) {
            mask <<= 1;
            level++;
        }
    } else {
        while (!(vr & mask)) {
            mask <<= 1;
            level++;
        }
        int parent = (int)(vr - mask + op->root);
        parent -= parent >= n ? n : 0;
        TT_CHECK(tt_p2p_recv(op, parent, recv, bytes, (uint32_t)level, &req[0]));
        TT_CHECK(tt_p2p_wait(op, &req[0]));
    }

    /* children: the set bits below mask that stay inside the communicator */
    int children = 0;
    for (long m = mask >> 1; m >= 1; m >>= 1)
        children += vr + m < n;
    tt_stream_to_one(op, children, bytes);
    size_t nsend = 0;
    while (mask > 1) {
        mask >>= 1;
        level--;
        if (vr + mask < n) {
            int child = (int)(vr + mask + op->root);
            child -= child >= n ? n : 0;
            TT_CHECK(tt_p2p_send(op, child, src, bytes, (uint32_t)level, &req[nsend++]));
        }
    }
    if (vr == 0 && src != recv)
        tt_copy(recv, src, bytes);
    return tt_p2p_wait_all(op, req, nsend);
}
