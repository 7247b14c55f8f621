/* Pipelined chain broadcast: root -> root+1 -> ... -> root-1, in chunks of chunk_bytes.
 * Each rank posts the receives of every chunk up front (each lands in its own place in
 * recvbuf) and forwards chunk k as soon as it arrives, while chunk k+1 is on its way.
 * For large messages the time approaches one transfer of the message plus (n-2) chunks,
 * whatever the rank count.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

int tt_broadcast_chain(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size, count = op->count;
    /* no divisions where a comparison does: a small call is ~0.1 us, a division a few ns */
    const int vr = r >= op->root ? r - op->root : r - op->root + n;
    unsigned char *recv = op->recvbuf;

    if (count == 0)
        return TUTTI_OK;

    size_t chunk = SIZE_MAX, nck = 1;
    if (op->chunk_bytes && count * es > op->chunk_bytes) {
        chunk = TT_MAX(op->chunk_bytes / es, (size_t)1);
        nck = count / chunk + (count % chunk != 0);
    }
    const int next = r + 1 == n ? 0 : r + 1, prev = r == 0 ? n - 1 : r - 1;

    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, 2 * nck);
    if (!reqs)
        return TUTTI_ERR_NOMEM;
    tt_req_t *rreq = reqs, *sreq = reqs + nck;
    int st = TUTTI_OK;

    if (vr == 0) {
        const unsigned char *src = op->sendbuf;
        tt_stream_to_one(op, 1, TT_MIN(chunk, count) * es);
        for (size_t k = 0; k < nck; k++) {
            size_t c0 = k * chunk, clen = TT_MIN(chunk, count - c0);
            TT_CHECK_GOTO(tt_p2p_send(op, next, src + c0 * es, clen * es, (uint32_t)k, &sreq[k]),
                          st, out);
        }
        /* The copy overlaps whatever the transport does with the sends meanwhile. */
        if (src != recv)
            tt_copy(recv, src, count * es);
        TT_CHECK_GOTO(tt_p2p_wait_all(op, sreq, nck), st, out);
        goto out;
    }

    for (size_t k = 0; k < nck; k++) {
        size_t c0 = k * chunk, clen = TT_MIN(chunk, count - c0);
        TT_CHECK_GOTO(tt_p2p_recv(op, prev, recv + c0 * es, clen * es, (uint32_t)k, &rreq[k]), st,
                      out);
    }
    const int last = vr == n - 1;
    for (size_t k = 0; k < nck; k++) {
        size_t c0 = k * chunk, clen = TT_MIN(chunk, count - c0);
        TT_CHECK_GOTO(tt_p2p_wait(op, &rreq[k]), st, out);
        if (!last)
            TT_CHECK_GOTO(tt_p2p_send(op, next, recv + c0 * es, clen * es, (uint32_t)k, &sreq[k]),
                          st, out);
    }
    if (!last)
        TT_CHECK_GOTO(tt_p2p_wait_all(op, sreq, nck), st, out);

out:
    tt_reqs_put(&hold);
    return st;
}
