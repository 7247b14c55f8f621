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

/* Equal blocks to one peer (a rank named twice: both neighbours of a periodic ring of 2,
 * a grid's dimension of 2, a repeated edge) go as one message of at most this many bytes,
 * packed in tag order at both ends: a message costs more than copying a few KiB (2 ranks
 * over shm, a ring's two 512-byte blocks in two messages took 0.75 us against one 512-byte
 * exchange's 0.51: session 108). Equal blocks only (the envelope's count), so that
 * blocks of other sizes at the two ends always differ in length or tag (a mismatch),
 * never silently within one total. */
#define TT_NB_PACK_BYTES 8192
#define TT_NB_PACK_TAG 0xfffffff0u /* (no edge's: edges' tags are below 2 x degree) */

/* The end of the run of order[k..n) to or from one peer. */
static int run_end(const int *order, const int *peer, int n, int k)
{
    int e = k + 1;
    while (e < n && peer[order[e]] == peer[order[k]])
        e++;
    return e;
}

/* A run k..e of one peer's edges that goes packed: blk (equal blocks' bytes) x its length. */
static size_t packed_bytes(int k, int e, int peer, int me, size_t blk)
{
    size_t b = (size_t)(e - k) * blk;
    return e - k >= 2 && blk && peer != me && peer != TUTTI_PROC_NULL && b <= TT_NB_PACK_BYTES ? b
                                                                                               : 0;
}

int tt_neighbor_direct(tt_op_t *op)
{
    const tt_topo_t *t = op->comm->topo;
    const int me = op->rank;
    const size_t es = op->elem_size, blk = op->env_count * es; /* 0: the v forms */
    const unsigned char *send = op->sendbuf;
    unsigned char *recv = op->recvbuf;
    size_t rpack = 0, spack = 0;
    for (int k = 0, e; k < t->indeg; k = e) {
        e = run_end(t->recv_order, t->sources, t->indeg, k);
        rpack += packed_bytes(k, e, t->sources[t->recv_order[k]], me, blk);
    }
    for (int k = 0, e; k < t->outdeg; k = e) {
        e = run_end(t->send_order, t->dests, t->outdeg, k);
        spack += packed_bytes(k, e, t->dests[t->send_order[k]], me, blk);
    }
    unsigned char *rbuf = rpack ? tt_op_scratch(op, 1, rpack) : NULL;
    unsigned char *sbuf = spack ? tt_op_scratch(op, 0, spack) : NULL;
    if ((rpack && !rbuf) || (spack && !sbuf))
        return TUTTI_ERR_NOMEM;
    tt_reqs_t hold;
    tt_req_t *req = tt_reqs_get(&hold, (size_t)t->indeg + (size_t)t->outdeg);
    if (!req)
        return TUTTI_ERR_NOMEM;
    size_t nreq = 0, off = 0;
    int rc = TUTTI_OK;
    for (int k = 0, e; k < t->indeg && rc == TUTTI_OK; k = e) {
        e = run_end(t->recv_order, t->sources, t->indeg, k);
        const int p = t->sources[t->recv_order[k]];
        const size_t pb = packed_bytes(k, e, p, me, blk);
        if (pb) {
            rc = tt_p2p_recv(op, p, rbuf + off, pb, TT_NB_PACK_TAG, &req[nreq++]);
            off += pb;
            continue;
        }
        for (int a = k; a < e && rc == TUTTI_OK && p != TUTTI_PROC_NULL && p != me; a++) {
            const int j = t->recv_order[a];
            rc = tt_p2p_recv(op, p, recv + op->rdispls[j] * es, op->recvcounts[j] * es,
                             t->src_tag[j], &req[nreq++]);
        }
    }
    off = 0;
    for (int k = 0, e; k < t->outdeg && rc == TUTTI_OK; k = e) {
        e = run_end(t->send_order, t->dests, t->outdeg, k);
        const int p = t->dests[t->send_order[k]];
        const size_t pb = packed_bytes(k, e, p, me, blk);
        if (pb) {
            for (int a = k; a < e; a++)
                memcpy(sbuf + off + (size_t)(a - k) * blk,
                       send + op->sdispls[t->send_order[a]] * es, blk);
            rc = tt_p2p_send(op, p, sbuf + off, pb, TT_NB_PACK_TAG, &req[nreq++]);
            off += pb;
            continue;
        }
        for (int a = k; a < e && rc == TUTTI_OK && p != TUTTI_PROC_NULL && p != me; a++) {
            const int i = t->send_order[a];
            rc = tt_p2p_send(op, p, send + op->sdispls[i] * es, op->sendcounts[i] * es,
                             t->dst_tag[i], &req[nreq++]);
        }
    }
    /* to itself: the send of each tag into the receive of that tag (topo.c's self_send) */
    for (int j = 0; rc == TUTTI_OK && j < t->indeg; j++) {
        const int i = t->self_send[j];
        if (i >= 0)
            tt_copy(recv + op->rdispls[j] * es, send + op->sdispls[i] * es, op->recvcounts[j] * es);
    }
    if (rc == TUTTI_OK)
        rc = tt_p2p_wait_all(op, req, nreq);
    /* the packed runs into their places, in tag order as packed */
    off = 0;
    for (int k = 0, e; k < t->indeg && rc == TUTTI_OK && rpack; k = e) {
        e = run_end(t->recv_order, t->sources, t->indeg, k);
        const size_t pb = packed_bytes(k, e, t->sources[t->recv_order[k]], me, blk);
        for (int a = k; pb && a < e; a++)
            memcpy(recv + op->rdispls[t->recv_order[a]] * es, rbuf + off + (size_t)(a - k) * blk,
                   blk);
        off += pb;
    }
    tt_reqs_put(&hold);
    return rc;
}
