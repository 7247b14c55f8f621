/* Bruck's alltoall (Bruck et al. 1997; Thakur, Rabenseifner & Gropp 2005), for small
 * blocks: ceil(log2 n) messages a rank instead of pairwise's n - 1, each carrying about
 * half the blocks, at the price of copies through a packed scratch: each block about
 * log2(n)/2 + 2 times. MPICH and Open MPI use it for short messages.
 *
 * A scratch holds n blocks; slot i starts as this rank's block for rank r + i (mod n).
 * In round k (distance d = 2^k) the slots whose index has bit k set go, packed in
 * index order, to rank r + d, and the same slots come back from rank r - d. A block
 * thus moves by the bits of its slot index, stays in its slot, and ends at its
 * destination in slot i = dest - source: recvbuf's block from rank r - i is slot i.
 *
 * Uniform blocks only (alltoall, not alltoallv): a rank packs blocks whose size it
 * could not otherwise know. The v form, where counts legitimately differ between pairs,
 * runs pairwise instead. In place needs nothing more: the scratch holds the send side.
 */
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

int tt_alltoall_bruck(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    if (!op->env_count || n < 3)
        return tt_alltoall_pairwise(op);
    const size_t blk = op->env_count * es; /* every block, on every rank */

    const int half = (n + 1) / 2; /* the most slots a round moves */
    unsigned char *slots = tt_op_scratch(op, 0, TT_MAX((size_t)n * blk, (size_t)1));
    unsigned char *pack = tt_op_scratch(op, 1, TT_MAX(2 * (size_t)half * blk, (size_t)1));
    if (!slots || !pack)
        return TUTTI_ERR_NOMEM;
    unsigned char *out = pack, *in = pack + (size_t)half * blk;
    const unsigned char *send = op->sendbuf;
    unsigned char *recv = op->recvbuf;

    /* slot 0, this rank's own block, goes straight across (in place it is there) */
    if (recv + op->rdispls[r] * es != send + op->sdispls[r] * es)
        tt_copy(recv + op->rdispls[r] * es, send + op->sdispls[r] * es, blk);
    for (int i = 1; i < n; i++)
        tt_copy(slots + (size_t)i * blk, send + op->sdispls[(r + i) % n] * es, blk);

    tt_req_t req[2];
    uint32_t round = 0;
    for (int d = 1; d < n; d <<= 1, round++) {
        size_t m = 0;
        for (int i = d; i < n; i++)
            if (i & d)
                tt_copy(out + m++ * blk, slots + (size_t)i * blk, blk);
        memset(req, 0, sizeof(req));
        TT_CHECK(tt_p2p_recv(op, (r - d + n) % n, in, m * blk, round, &req[0]));
        TT_CHECK(tt_p2p_send(op, (r + d) % n, out, m * blk, round, &req[1]));
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
        m = 0;
        for (int i = d; i < n; i++)
            if (i & d)
                tt_copy(slots + (size_t)i * blk, in + m++ * blk, blk);
    }
    for (int i = 1; i < n; i++)
        tt_copy(recv + op->rdispls[(r - i + n) % n] * es, slots + (size_t)i * blk, blk);
    return TUTTI_OK;
}
