/* The agreement records as failure paths read them (agree.h): which record failed,
 * and an op failed with it, named as the earlier call. Apart from agree.c, which posts
 * the messages through p2p.c, so that the stall check's look at them (p2p.c, when
 * tt_fault_stall_check found nothing else) calls down only: p2p -> agree_ring -> fault,
 * with no way back (tools/dev/cycles.py). */
#include "base/base.h"
#include "core/agree_ring.h"
#include "core/fault.h"
#include "core/state.h"

/* The ring (allocated on first use): its k-th record from the oldest. */
tt_agree_rec_t *tt_agree_at(tutti_comm_t *comm, int k)
{
    return &comm->agree[(comm->agree_head + k) % comm->opts.agree_lag];
}

/* op, described as the call c (an earlier one) */
tt_op_t tt_agree_as_call(const tt_op_t *op, const tt_agree_call_t *c)
{
    tt_op_t o = *op;
    o.coll = c->coll;
    o.seq = c->seq;
    o.fingerprint = c->fingerprint;
    o.env_count = c->env_count;
    o.algo_id = c->algo_id;
    o.count = c->count;
    o.dtype = c->dtype;
    o.root = c->root;
    o.sendcounts = o.sdispls = o.recvcounts = o.rdispls = NULL;
    o.dev = NULL; /* op's staging stays op's */
    return o;
}

/* A record's requests: 1 when all completed, 0 when some are still posted,
 * < 0 (the failed one in *bad_p) when one failed. */
int tt_agree_rec_state(tt_agree_rec_t *rec, tt_req_t **bad_p)
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
int tt_agree_rec_fail(tt_op_t *op, tt_agree_rec_t *rec, tt_req_t *bad)
{
    tt_op_t old = tt_agree_as_call(op, &rec->call);
    return tt_fault_req(&old, &bad->tp);
}

int tt_agree_failed(tt_op_t *op)
{
    tutti_comm_t *comm = op->comm;
    for (int k = 0; k < comm->agree_count; k++) {
        tt_agree_rec_t *rec = tt_agree_at(comm, k);
        tt_req_t *bad = NULL;
        if (tt_agree_rec_state(rec, &bad) < 0)
            return tt_agree_rec_fail(op, rec, bad);
    }
    return TUTTI_OK;
}
