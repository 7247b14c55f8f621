/* The rooted collectives' agreement messages when they are checked later
 * (TUTTI_AGREE_LAG > 0; algorithms/handshake.c says what they are and why): a call
 * posts them and returns, and they stay in a ring of records, one per call, until a
 * later op reaps them. Each op polls the ring before its algorithm runs; a record that
 * failed fails that op (its message names the earlier call); with the ring full the op
 * waits for the oldest record. Messages between two ranks match in posting order, and
 * a call's agreement messages are posted before anything issued after the call, on
 * both sides, so they never take another op's message. */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "core/agree.h"
#include "core/fault.h"
#include "core/p2p.h"
#include "core/state.h"

/* The ring (allocated on first use), its oldest record and count. */
static tt_agree_rec_t *ring_at(tutti_comm_t *comm, int k)
{
    return &comm->agree[(comm->agree_head + k) % comm->opts.agree_lag];
}

/* A record's requests: 1 when all completed, 0 when some are still posted,
 * < 0 (the failed one in *bad_p) when one failed. */
static int rec_state(tt_agree_rec_t *rec, tt_req_t **bad_p)
{
    int done = 1;
    for (int i = 0; i < rec->nreq; i++) {
        if (rec->reqs[i].tp.status < 0) {
            *bad_p = &rec->reqs[i];
            return rec->reqs[i].tp.status;
        }
        if (rec->reqs[i].tp.status == 1)
            done = 0;
    }
    return done;
}

/* Fail op with the oldest record's failure, described as the earlier call's. */
static int rec_fail(tt_op_t *op, tt_agree_rec_t *rec, tt_req_t *bad)
{
    tt_op_t old = *op;
    old.coll = rec->coll;
    old.seq = rec->seq;
    old.fingerprint = rec->fingerprint;
    old.env_count = rec->env_count;
    old.algo_id = rec->algo_id;
    old.count = rec->count;
    old.dtype = rec->dtype;
    old.root = rec->root;
    old.sendcounts = old.sdispls = old.recvcounts = old.rdispls = NULL;
    return tt_fault_req(&old, &bad->tp);
}

int tt_agree_settle(tt_op_t *op, int room)
{
    tutti_comm_t *comm = op->comm;
    while (comm->agree_count > 0) {
        tt_agree_rec_t *rec = ring_at(comm, 0);
        tt_req_t *bad = NULL;
        int st = rec_state(rec, &bad);
        if (st < 0)
            return rec_fail(op, rec, bad);
        if (st == 0) {
            if (comm->agree_count + room <= comm->opts.agree_lag)
                return TUTTI_OK;
            /* full: wait for the oldest (within this op's deadline) */
            for (int i = 0; i < rec->nreq; i++) {
                while (rec->reqs[i].tp.status == 1)
                    TT_CHECK(tt_p2p_progress(op, &rec->reqs[i]));
                if (rec->reqs[i].tp.status < 0)
                    return rec_fail(op, rec, &rec->reqs[i]);
            }
        }
        rec->nreq = 0;
        comm->agree_head = (comm->agree_head + 1) % comm->opts.agree_lag;
        comm->agree_count--;
    }
    return TUTTI_OK;
}

int tt_agree_begin(tt_op_t *op, int nreq, tt_req_t **reqs_p)
{
    tutti_comm_t *comm = op->comm;
    if (!comm->agree) {
        comm->agree = calloc((size_t)comm->opts.agree_lag, sizeof(*comm->agree));
        if (!comm->agree)
            goto nomem;
    }
    int st = tt_agree_settle(op, 1);
    if (st < 0)
        return st;
    tt_agree_rec_t *rec = ring_at(comm, comm->agree_count);
    if (rec->cap < nreq) {
        /* idle: none of its old requests is posted */
        tt_req_t *r = realloc(rec->reqs, (size_t)nreq * sizeof(*r));
        if (!r)
            goto nomem;
        rec->reqs = r;
        rec->cap = nreq;
    }
    memset(rec->reqs, 0, (size_t)nreq * sizeof(*rec->reqs));
    rec->nreq = nreq;
    rec->coll = op->coll;
    rec->seq = op->seq;
    rec->fingerprint = op->fingerprint;
    rec->env_count = op->env_count;
    rec->algo_id = op->algo_id;
    rec->count = op->count;
    rec->dtype = op->dtype;
    rec->root = op->root;
    comm->agree_count++;
    *reqs_p = rec->reqs;
    return TUTTI_OK;
nomem:
    tt_fault_fail_op(op, TUTTI_ERR_NOMEM, "out of memory for the agreement check");
    return TUTTI_ERR_NOMEM;
}

void tt_agree_free(tutti_comm_t *comm)
{
    if (!comm->agree)
        return;
    for (int i = 0; i < comm->opts.agree_lag; i++)
        free(comm->agree[i].reqs);
    free(comm->agree);
    comm->agree = NULL;
    comm->agree_count = 0;
}
