/* Ring allreduce: reduce-scatter then allgather around the ring. Bandwidth optimal:
 * every rank sends and receives 2 (n-1)/n of the vector and reduces (n-1)/n of it.
 *
 * The vector is cut into n blocks (count/n elements, the remainder spread over the
 * first blocks), each block into chunks of chunk_bytes. Step t (of 2 (n-1)) sends
 * block (rank - t) to the next rank and receives block (rank - t - 1) from the
 * previous one; the first n-1 steps reduce what they receive, the last n-1 only store
 * it. The block received at step t is the one sent at step t+1, so each chunk is
 * forwarded as soon as it is reduced (or stored): the pipeline runs across steps, not
 * only within one.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"
#include "reduce/reduce.h"

#include "common.h"

typedef struct ring {
    tt_op_t *op;
    size_t base, rem;  /* block b: base + (b < rem) elements */
    size_t chunk;      /* elements per chunk */
    size_t max_chunks; /* chunks of the largest block (block 0) */
    size_t window;     /* scratch slots: reducing receives posted ahead */
} ring_t;

static size_t ring_block_len(const ring_t *rg, int b)
{
    return rg->base + ((size_t)b < rg->rem);
}

static size_t ring_block_off(const ring_t *rg, int b)
{
    return (size_t)b * rg->base + TT_MIN((size_t)b, rg->rem);
}

/* Empty blocks have no chunks: both sides compute this from the same count, so an
 * empty block is skipped on both ends. */
static size_t ring_nchunks(const ring_t *rg, size_t len)
{
    return len / rg->chunk + (len % rg->chunk != 0);
}

static int ring_mod(const ring_t *rg, int x)
{
    int n = rg->op->nranks;
    return ((x % n) + n) % n;
}

/* Unique per (step, chunk) within the op; wraps only past 2^32 messages, and then
 * still agrees on both sides. */
static uint32_t ring_tag(const ring_t *rg, int step, size_t k)
{
    return (uint32_t)((uint64_t)step * rg->max_chunks + k);
}

static size_t ring_chunk_elems(const tt_op_t *op)
{
    if (op->chunk_bytes == 0)
        return SIZE_MAX; /* no pipelining */
    size_t c = op->chunk_bytes / op->elem_size;
    return c ? c : 1;
}

/* Where chunk k of a reducing step lands in the scratch */
static unsigned char *ring_slot(const ring_t *rg, unsigned char *scratch, size_t k)
{
    return scratch + (k % rg->window) * rg->chunk * rg->op->elem_size;
}

/* Receives of step t, chunks k0 .. k1-1: into the scratch while reducing (the first
 * n-1 steps; chunk k in slot k % window), straight into recvbuf in the allgather. With
 * n == 2 in place, an allgather receive lands in the block that the previous step's
 * still pending send reads; it cannot arrive before the peer got that send's bytes,
 * since the data it carries is computed from them. */
static int ring_post_recvs(const ring_t *rg, int t, size_t k0, size_t k1, tt_req_t *rreq,
                           unsigned char *scratch)
{
    tt_op_t *op = rg->op;
    const int n = op->nranks;
    const size_t es = op->elem_size;
    const int rb = ring_mod(rg, op->rank - t - 1);
    const size_t off = ring_block_off(rg, rb), len = ring_block_len(rg, rb);
    k1 = TT_MIN(k1, ring_nchunks(rg, len));
    for (size_t k = k0; k < k1; k++) {
        size_t c0 = k * rg->chunk, clen = TT_MIN(rg->chunk, len - c0);
        void *dst = t < n - 1 ? (void *)ring_slot(rg, scratch, k)
                              : (void *)((unsigned char *)op->recvbuf + (off + c0) * es);
        TT_CHECK(
            tt_p2p_recv(op, (op->rank + n - 1) % n, dst, clen * es, ring_tag(rg, t, k), &rreq[k]));
    }
    return TUTTI_OK;
}

/* Receives posted ahead of a step: all of an allgather step's, the window's of a
 * reducing one. */
static size_t ring_ahead(const ring_t *rg, int t)
{
    return t < rg->op->nranks - 1 ? rg->window : SIZE_MAX;
}

int tt_allreduce_ring(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    const unsigned char *send = op->sendbuf;
    unsigned char *recv = op->recvbuf;

    if (op->count == 0)
        return TUTTI_OK;

    ring_t rg = {
        .op = op,
        .base = op->count / (size_t)n,
        .rem = op->count % (size_t)n,
        .chunk = ring_chunk_elems(op),
    };
    rg.max_chunks = ring_nchunks(&rg, ring_block_len(&rg, 0));
    rg.window = TT_MIN(rg.max_chunks, (size_t)TT_RING_WINDOW);
    const int next = (r + 1) % n;
    const int steps = 2 * (n - 1);

    unsigned char *scratch = tt_op_scratch(op, 0,
                                           TT_MIN(ring_block_len(&rg, 0), rg.window * rg.chunk) *
                                               es);
    if (!scratch)
        return TUTTI_ERR_NOMEM;
    /* receives of one step; sends of this step and of the next, posted while this
     * step's chunks arrive */
    tt_reqs_t hold;
    tt_req_t *reqs = tt_reqs_get(&hold, 3 * rg.max_chunks);
    if (!reqs)
        return TUTTI_ERR_NOMEM;
    tt_req_t *rreq = reqs;
    tt_req_t *sreq[2] = { reqs + rg.max_chunks, reqs + 2 * rg.max_chunks };
    int st = TUTTI_OK;

    /* Step 0 sends this rank's own block unreduced, straight from sendbuf; later
     * steps send from recvbuf. Out of place, recvbuf then never needs a copy of
     * sendbuf: every block but one is written by a reduction during the
     * reduce-scatter, and the remaining one (this rank's own) arrives in the
     * allgather. */
    {
        int b = ring_mod(&rg, r);
        size_t off = ring_block_off(&rg, b), len = ring_block_len(&rg, b);
        for (size_t k = 0, nck = ring_nchunks(&rg, len); k < nck; k++) {
            size_t c0 = k * rg.chunk, clen = TT_MIN(rg.chunk, len - c0);
            TT_CHECK_GOTO(tt_p2p_send(op, next, send + (off + c0) * es, clen * es,
                                      ring_tag(&rg, 0, k), &sreq[0][k]),
                          st, out);
        }
    }

    TT_CHECK_GOTO(ring_post_recvs(&rg, 0, 0, ring_ahead(&rg, 0), rreq, scratch), st, out);
    for (int t = 0; t < steps; t++) {
        const int rb = ring_mod(&rg, r - t - 1);
        const size_t off = ring_block_off(&rg, rb), len = ring_block_len(&rg, rb);
        for (size_t k = 0, nck = ring_nchunks(&rg, len); k < nck; k++) {
            size_t c0 = k * rg.chunk, clen = TT_MIN(rg.chunk, len - c0);
            unsigned char *dst = recv + (off + c0) * es;
            TT_CHECK_GOTO(tt_p2p_wait(op, &rreq[k]), st, out);
            if (t < n - 1) {
                tt_reduce3(dst, send + (off + c0) * es, ring_slot(&rg, scratch, k), clen, op->dtype,
                           op->redop);
                /* the slot is free: the receive a window ahead takes it */
                if (k + rg.window < nck)
                    TT_CHECK_GOTO(ring_post_recvs(&rg, t, k + rg.window, k + rg.window + 1, rreq,
                                                  scratch),
                                  st, out);
            }
            if (t + 1 < steps)
                TT_CHECK_GOTO(tt_p2p_send(op, next, dst, clen * es, ring_tag(&rg, t + 1, k),
                                          &sreq[(t + 1) & 1][k]),
                              st, out);
        }
        /* The next step's receives go out before this step's sends are waited for, so
         * that the previous rank never waits on us. The scratch is free again: every
         * chunk of this step has been reduced. */
        if (t + 1 < steps)
            TT_CHECK_GOTO(ring_post_recvs(&rg, t + 1, 0, ring_ahead(&rg, t + 1), rreq, scratch), st,
                          out);
        int sb = ring_mod(&rg, r - t);
        TT_CHECK_GOTO(tt_p2p_wait_all(op, sreq[t & 1], ring_nchunks(&rg, ring_block_len(&rg, sb))),
                      st, out);
    }

out:
    tt_reqs_put(&hold);
    return st;
}
