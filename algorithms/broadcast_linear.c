/* Linear broadcast: the root posts n-1 sends of the whole message at once, starting
 * with root+1; every other rank receives from the root alone. One round, so no rank
 * waits for another to forward: on a crowded host (more ranks than CPUs) a tree's inner
 * rank may be off its CPU when its children wait for it, and each such wait is a
 * context switch (docs/architecture.md, "Broadcast on a crowded host"). Gloo's
 * broadcast is this one.
 * With a single-copy transport each receiver pulls from the root's buffer itself, but
 * on a crowded host a pull waits for its receiver to get a CPU while the root waits for
 * every pull: there messages below TT_BCAST_STREAM_BYTES go through the rings (shm's
 * hold 1 MiB a pair up to 16 local ranks), and the root is done once it has written
 * them. 4 ranks on 2 CPUs, p50 us, streamed against pulled (4-5 alternating pairs):
 * 64 KiB 9.2 against 25.1, 256 KiB 31.5 against 80.2, 512 KiB 60 against 163, 1 MiB 184
 * against 319, 2 MiB 487 against 519; from 4 MiB pulled is faster (4 MiB 1938 against
 * 2408, 64 MiB 33.6 ms against 40.3). Since session 60 shm's `auto` pulls nothing on a
 * crowded host (streaming won at most sizes there), so this matters only where
 * TUTTI_SHM_CMA_HINT_BYTES is set.
 */
#include <string.h>

#include <tutti/transport_v2.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

#define TT_BCAST_STREAM_BYTES ((size_t)2 << 20)

int tt_broadcast_linear(tt_op_t *op)
{
    const int n = op->nranks, root = op->root;
    const size_t bytes = op->count * op->elem_size;
    tt_req_t req;

    if (bytes == 0)
        return TUTTI_OK;
    /* the same on every rank: rank 0's host as the cost model counts it */
    if (bytes < TT_BCAST_STREAM_BYTES && tt_cost_crowded(tt_op_cost(op)))
        op->tp_hints &= ~TUTTI_TP_HINT_SINGLE_COPY;
    tt_stream_to_one(op, n - 1, bytes);
    if (op->rank != root) {
        TT_CHECK(tt_p2p_recv(op, root, op->recvbuf, bytes, 0, &req));
        return tt_p2p_wait(op, &req);
    }

    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, (size_t)n);
    if (!reqs)
        return TUTTI_ERR_NOMEM;
    int st = TUTTI_OK;
    size_t nsend = 0;
    for (int j = root + 1 == n ? 0 : root + 1; j != root; j = j + 1 == n ? 0 : j + 1)
        TT_CHECK_GOTO(tt_p2p_send(op, j, op->sendbuf, bytes, 0, &reqs[nsend++]), st, out);
    if (op->recvbuf != op->sendbuf)
        tt_copy(op->recvbuf, op->sendbuf, bytes);
    st = tt_p2p_wait_all(op, reqs, nsend);
out:
    tt_reqs_put(&hold);
    return st;
}
