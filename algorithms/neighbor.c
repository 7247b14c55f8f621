/* The neighbourhood collectives (neighbor_allgather(v), neighbor_alltoall(v)): every
 * receive from the sources posted, then every send to the destinations, then the wait;
 * a message a step, all at once, as MPI implementations run them (Open MPI's basic
 * neighbour module, MPICH's default). The layouts are per edge (lib/core/op.h): block i
 * of sendbuf to destination i, the block from source j into recvbuf at rdispls[j]. To
 * one peer both sides post by (peer, tag) (lib/coll/topo.h: a collective's messages
 * between two ranks are matched in order), so a rank named twice gets its two blocks
 * in the places that name it. A neighbour that is this rank is a copy between the
 * buffers (sizes checked by coll.c's fill), TUTTI_PROC_NULL nothing. */
#include <string.h>

#include "coll/algo.h"
#include "coll/topo.h"
#include "core/p2p.h"
#include "core/state.h"
#include "base/base.h"

int tt_neighbor_direct(tt_op_t *op)
{
    const tt_topo_t *t = op->comm->topo;
    const int me = op->rank;
    const size_t es = op->elem_size;
    const unsigned char *send = op->sendbuf;
    unsigned char *recv = op->recvbuf;
    tt_reqs_t hold;
    tt_req_t *req = tt_reqs_get(&hold, (size_t)t->indeg + (size_t)t->outdeg);
    if (!req)
        return TUTTI_ERR_NOMEM;
    size_t nreq = 0;
    int rc = TUTTI_OK;
    for (int k = 0; k < t->indeg && rc == TUTTI_OK; k++) {
        const int j = t->recv_order[k], p = t->sources[j];
        if (p != TUTTI_PROC_NULL && p != me)
            rc = tt_p2p_recv(op, p, recv + op->rdispls[j] * es, op->recvcounts[j] * es,
                             t->src_tag[j], &req[nreq++]);
    }
    for (int k = 0; k < t->outdeg && rc == TUTTI_OK; k++) {
        const int i = t->send_order[k], p = t->dests[i];
        if (p != TUTTI_PROC_NULL && p != me)
            rc = tt_p2p_send(op, p, send + op->sdispls[i] * es, op->sendcounts[i] * es,
                             t->dst_tag[i], &req[nreq++]);
    }
    /* to itself: the send of each tag into the receive of that tag (the orders list
     * both by (peer, tag), and the topology has as many of each) */
    for (int a = 0, b = 0; rc == TUTTI_OK && a < t->indeg; a++) {
        const int j = t->recv_order[a];
        if (t->sources[j] != me)
            continue;
        while (b < t->outdeg &&
               (t->dests[t->send_order[b]] != me || t->dst_tag[t->send_order[b]] != t->src_tag[j]))
            b++;
        if (b == t->outdeg)
            break;
        const int i = t->send_order[b++];
        tt_copy(recv + op->rdispls[j] * es, send + op->sdispls[i] * es, op->recvcounts[j] * es);
    }
    if (rc == TUTTI_OK)
        rc = tt_p2p_wait_all(op, req, nreq);
    tt_reqs_put(&hold);
    return rc;
}
