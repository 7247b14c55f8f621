/* The handshake rooted collectives end with (the "post" steps of the descriptor table,
 * lib/coll/coll.c). */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "coll/algo.h"
#include "core/p2p.h"
#include "core/comm.h"
#include "core/agree.h"
#include "core/fault.h"

/* Rooted collectives (and scan and exscan, whose root is their last rank: its result
 * waited on every other rank's messages, in either algorithm, while rank 0 of the chain
 * only sends) end with a handshake with the root, so that every rank of a
 * mismatched call fails, not only those whose messages revealed it: non-roots of a
 * reduce or gather only send (eagerly: done before anyone looked), and a scatter's or
 * broadcast's root only sends. The root's release (an empty message to every non-root,
 * sent once its own part checked out) tells non-roots that the root agreed with all of
 * them; where the root only sends (broadcast, scatter), each non-root first confirms
 * its part to the root with an empty message. A rank that disagrees about the root,
 * count or dtype sends or expects something else in these places, so the disagreement
 * surfaces on every rank as a mismatch (or through the root's report), never as one
 * rank keeping wrong data.
 *
 * Waited for in the call (TUTTI_AGREE_LAG=0), this costs one latency on reduce and
 * gather, two on broadcast and scatter (a small broadcast took three times the one-way
 * latency MPI's does). By default the messages are checked later (lib/core/agree.c),
 * in batches of calls of one kind whatever their roots, each checked at its first
 * call's root, the checker: a broadcast's or scatter's non-roots confirm without
 * waiting (one message from each rank but the checker, for a batch of calls) and the
 * checker compares the confirms at later calls; a reduce's, gather's or scan's root
 * releases without waiting (one message from the checker to each other rank for a
 * batch) and the others compare it later. A release a call (4 ranks over tcp) had a
 * 4-byte scan at 2-3x the time of one without, and 3x Open MPI's (session 44). No
 * release follows a confirm then: a non-root whose own data matched has the root's
 * data. What is given up: a rank whose own messages matched returns from a mismatched
 * call, and fails at a later one (within agree_lag calls and up to a batch more),
 * naming this one, through the checker's digest or the failed rank's report; in a
 * batch with several roots, a call's root that is not the checker is not itself told
 * by the digests (since session 47), and learns of a disagreement that only they would
 * show from the checker's report; and two ranks that both take themselves for a
 * broadcast's root both return, the one that is not keeping its own buffer. Nothing in
 * bandwidth either way. */
static int root_handshake(tt_op_t *op, int confirm)
{
    char none = 0;
    if (op->rank != op->root) {
        tt_req_t req;
        if (confirm) {
            TT_CHECK(tt_p2p_send(op, op->root, &none, 0, TT_CONFIRM_TAG, &req));
            TT_CHECK(tt_p2p_wait(op, &req));
        }
        TT_CHECK(tt_p2p_recv(op, op->root, &none, 0, TT_RELEASE_TAG, &req));
        return tt_p2p_wait(op, &req);
    }
    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, (size_t)op->nranks);
    if (!reqs) {
        tt_fault_record(op, TUTTI_ERR_NOMEM, "out of memory");
        return TUTTI_ERR_NOMEM;
    }
    int st = TUTTI_OK;
    if (confirm) {
        for (int r = 0; r < op->nranks; r++)
            if (r != op->root)
                TT_CHECK_GOTO(tt_p2p_recv(op, r, &none, 0, TT_CONFIRM_TAG, &reqs[r]), st, out);
        TT_CHECK_GOTO(tt_p2p_wait_all(op, reqs, (size_t)op->nranks), st, out);
        memset(reqs, 0, (size_t)op->nranks * sizeof(*reqs));
    }
    for (int r = 0; r < op->nranks; r++)
        if (r != op->root)
            TT_CHECK_GOTO(tt_p2p_send(op, r, &none, 0, TT_RELEASE_TAG, &reqs[r]), st, out);
    st = tt_p2p_wait_all(op, reqs, (size_t)op->nranks);
out:
    tt_reqs_put(&hold);
    return st;
}

/* broadcast, scatter: the root only sends */
int tt_post_confirm_release(tt_op_t *op)
{
    if (op->comm->opts.agree_lag > 0)
        return tt_agree_confirm_later(op);
    return root_handshake(op, 1);
}

/* reduce, gather: the non-roots only send */
int tt_post_release(tt_op_t *op)
{
    if (op->comm->opts.agree_lag > 0)
        return tt_agree_release_later(op);
    return root_handshake(op, 0);
}
