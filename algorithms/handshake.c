/* The handshake rooted collectives end with (the "post" steps of the descriptor table,
 * lib/coll/coll.c). */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "coll/algo.h"
#include "core/p2p.h"
#include "core/comm.h"
#include "core/fault.h"

/* Rooted collectives end with a handshake with the root, so that every rank of a
 * mismatched call fails, not only those whose messages revealed it: non-roots of a
 * reduce or gather only send (eagerly: done before anyone looked), and a scatter's or
 * broadcast's root only sends. The root's release (an empty message to every non-root,
 * sent once its own part checked out) tells non-roots that the root agreed with all of
 * them; where the root only sends (broadcast, scatter), each non-root first confirms
 * its part to the root with an empty message. A rank that disagrees about the root,
 * count or dtype sends or expects something else in these places, so the disagreement
 * surfaces on every rank as a mismatch (or through the root's report), never as one
 * rank keeping wrong data. Costs one latency on reduce and gather (the root's sends
 * are posted at once, the non-roots wait for them), two on broadcast and scatter;
 * nothing in bandwidth. */
static int root_handshake(tt_op_t *op, int confirm)
{
    enum { CONFIRM_TAG = 0x7fff0001, RELEASE_TAG = 0x7fff0002 };
    char none = 0;
    if (op->rank != op->root) {
        tt_req_t req;
        if (confirm) {
            TT_CHECK(tt_p2p_send(op, op->root, &none, 0, CONFIRM_TAG, &req));
            TT_CHECK(tt_p2p_wait(op, &req));
        }
        TT_CHECK(tt_p2p_recv(op, op->root, &none, 0, RELEASE_TAG, &req));
        return tt_p2p_wait(op, &req);
    }
    tt_req_t few[16];
    tt_req_t *reqs = op->nranks <= 16 ? few : malloc((size_t)op->nranks * sizeof(*reqs));
    if (!reqs) {
        tt_fault_record(op, TUTTI_ERR_NOMEM, "out of memory");
        return TUTTI_ERR_NOMEM;
    }
    memset(reqs, 0, (size_t)op->nranks * sizeof(*reqs));
    int st = TUTTI_OK;
    if (confirm) {
        for (int r = 0; r < op->nranks; r++)
            if (r != op->root)
                TT_CHECK_GOTO(tt_p2p_recv(op, r, &none, 0, CONFIRM_TAG, &reqs[r]), st, out);
        TT_CHECK_GOTO(tt_p2p_wait_all(op, reqs, (size_t)op->nranks), st, out);
        memset(reqs, 0, (size_t)op->nranks * sizeof(*reqs));
    }
    for (int r = 0; r < op->nranks; r++)
        if (r != op->root)
            TT_CHECK_GOTO(tt_p2p_send(op, r, &none, 0, RELEASE_TAG, &reqs[r]), st, out);
    st = tt_p2p_wait_all(op, reqs, (size_t)op->nranks);
out:
    if (reqs != few)
        free(reqs);
    return st;
}

/* broadcast, scatter: the root only sends */
int tt_post_confirm_release(tt_op_t *op)
{
    return root_handshake(op, 1);
}

/* reduce, gather: the non-roots only send */
int tt_post_release(tt_op_t *op)
{
    return root_handshake(op, 0);
}
