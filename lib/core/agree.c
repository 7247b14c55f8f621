/* The rooted collectives' agreement messages when they are checked later
 * (TUTTI_AGREE_LAG > 0; algorithms/handshake.c says what they are and why): a call
 * posts them and returns, and they stay in a ring of records until a later op reaps
 * them. Each op polls the ring before its algorithm runs; a record that failed fails
 * that op (its message names the earlier call); with the ring full the op waits for
 * the oldest record. Messages between two ranks match in posting order, and a call's
 * agreement messages are posted before anything issued after the call, on both sides,
 * so they never take another op's message.
 *
 * Confirms (a broadcast's or scatter's non-roots to the root) go in batches: calls back
 * to back share one message, sent when TT_CONFIRM_BATCH calls are in it, at the start of
 * the next rooted call of the other kind (below), or at the start of the
 * TT_CONFIRM_BATCH-th op of no kind (a barrier, an allreduce) since it opened; both
 * counts at most agree_lag. It goes before that op's own messages, on every rank alike:
 * which op sends it depends only on the calls, which the ranks agree on or fail. Until
 * session 49 the next op of no kind sent it, and a
 * broadcast and a barrier in turn sent a confirm a pair: 2 ranks, 16 B, 1.27-1.39 us a
 * pair over shm against 1.07-1.17 with the batch waiting, 27-29 us against 20-21 over
 * tcp (Open MPI's vader: 1.06-1.11). It
 * carries a digest of every call's envelope (root included), checked by the batch's
 * checker, the first call's root; its own envelope is the last call's, checked by the
 * transport. A loop of small broadcasts then sends one message per call instead of
 * two (0.29 -> 0.20 us over shm at 2 ranks), from one root or from roots in turn
 * (before session 47 a new root closed the batch: broadcasts from ranks 0 and 1 in
 * turn sent two messages a call). Releases (a reduce's, gather's or scan's root to the
 * non-roots) go in batches the same way, the checker's digest checked by every other
 * rank: a release a call had a 4-rank reduce of 4 B over tcp at 20 us, one a batch at 6
 * (session 44). A rank whose messages matched learns of a mismatched call up to
 * TT_CONFIRM_BATCH rooted calls, and TT_CONFIRM_BATCH ops of no kind, later than without
 * batches (a rank that receives a mismatched message fails at once, as ever). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "core/agree.h"
#include "core/agree_ring.h"
#include "core/fault.h"
#include "core/p2p.h"
#include "core/state.h"

/* Calls per confirm or release message at most (and at most agree_lag). */
#define TT_CONFIRM_BATCH 16

static void call_of(tt_agree_call_t *c, const tt_op_t *op)
{
    *c = (tt_agree_call_t){ .coll = op->coll,
                            .seq = op->seq,
                            .fingerprint = op->fingerprint,
                            .env_count = op->env_count,
                            .algo_id = op->algo_id,
                            .count = op->count,
                            .dtype = op->dtype,
                            .root = op->root };
}

/* A completed batch where its digests arrived (a confirm batch's root, a release
 * batch's non-roots): every digest received must be this rank's own. The first that
 * differs, described into msg (its index), or -1. */
static int rec_digest_differs(const tt_agree_rec_t *rec, int rank, char *msg, size_t len)
{
    if (!rec->batch || (rank == rec->checker) != (rec->batch == TT_BATCH_CONFIRM))
        return -1;
    for (int i = 0; i < rec->nreq; i++) {
        if (rec->got[i] == rec->want)
            continue;
        snprintf(msg, len,
                 "rank %d's record of the %d rooted calls seq %llu..%llu (checked at rank "
                 "%d, their %s sent as one) differs from rank %d's: the ranks disagreed "
                 "about one of them before seq %llu (its collective, count, dtype or root)",
                 rec->reqs[i].tp.peer, rec->ncalls, (unsigned long long)rec->seq0,
                 (unsigned long long)rec->call.seq, rec->checker,
                 rec->batch == TT_BATCH_CONFIRM ? "confirms" : "releases", rank,
                 (unsigned long long)rec->call.seq);
        return i;
    }
    return -1;
}

static int rec_digests(tt_op_t *op, tt_agree_rec_t *rec)
{
    char msg[TT_ERRMSG_LEN];
    if (rec_digest_differs(rec, op->rank, msg, sizeof(msg)) < 0)
        return TUTTI_OK;
    tt_op_t old = tt_agree_as_call(op, &rec->call);
    tt_fault_fail_op(&old, TUTTI_ERR_MISMATCH, msg);
    return TUTTI_ERR_MISMATCH;
}

/* The oldest record is done with: off the ring. */
static void rec_reap(tutti_comm_t *comm, tt_agree_rec_t *rec)
{
    rec->nreq = 0;
    comm->agree_head = (comm->agree_head + 1) % comm->opts.agree_lag;
    comm->agree_count--;
    comm->agree_calls -= rec->ncalls;
}

int tt_agree_settle(tt_op_t *op, int room)
{
    tutti_comm_t *comm = op->comm;
    while (comm->agree_count > 0) {
        tt_agree_rec_t *rec = tt_agree_at(comm, 0);
        tt_req_t *bad = NULL;
        int st = tt_agree_rec_state(rec, &bad);
        if (st < 0)
            return tt_agree_rec_fail(op, rec, bad);
        if (st == 0) {
            if (comm->agree_calls + room <= comm->opts.agree_lag)
                return TUTTI_OK;
            /* full: wait for the oldest (within this op's deadline) */
            for (int i = 0; i < rec->nreq; i++) {
                while (rec->reqs[i].tp.status == 1)
                    TT_CHECK(tt_p2p_progress(op, &rec->reqs[i]));
                if (rec->reqs[i].tp.status < 0)
                    return tt_agree_rec_fail(op, rec, &rec->reqs[i]);
            }
        }
        TT_CHECK(rec_digests(op, rec));
        rec_reap(comm, rec);
    }
    return TUTTI_OK;
}

/* A new record for op's nreq requests checking ncalls calls, the last op (see
 * tt_agree_begin). */
static int rec_new(tt_op_t *op, int nreq, int ncalls, tt_agree_rec_t **rec_p)
{
    tutti_comm_t *comm = op->comm;
    if (!comm->agree) {
        comm->agree = calloc((size_t)comm->opts.agree_lag, sizeof(*comm->agree));
        if (!comm->agree)
            goto nomem;
    }
    int st = tt_agree_settle(op, ncalls);
    if (st < 0)
        return st;
    tt_agree_rec_t *rec = tt_agree_at(comm, comm->agree_count);
    if (rec->cap < nreq) {
        /* idle: none of its old requests is posted */
        tt_req_t *r = realloc(rec->reqs, (size_t)nreq * sizeof(*r));
        if (r)
            rec->reqs = r;
        uint64_t *g = realloc(rec->got, (size_t)nreq * sizeof(*g));
        if (g)
            rec->got = g;
        if (!r || !g)
            goto nomem;
        rec->cap = nreq;
    }
    memset(rec->reqs, 0, (size_t)nreq * sizeof(*rec->reqs));
    memset(rec->got, 0, (size_t)nreq * sizeof(*rec->got));
    rec->nreq = nreq;
    call_of(&rec->call, op);
    rec->ncalls = ncalls;
    rec->batch = 0;
    rec->checker = op->root;
    comm->agree_count++;
    comm->agree_calls += ncalls;
    *rec_p = rec;
    return TUTTI_OK;
nomem:
    tt_fault_fail_op(op, TUTTI_ERR_NOMEM, "out of memory for the agreement check");
    return TUTTI_ERR_NOMEM;
}

int tt_agree_begin(tt_op_t *op, int nreq, tt_req_t **reqs_p)
{
    tt_agree_rec_t *rec;
    TT_CHECK(rec_new(op, nreq, 1, &rec));
    *reqs_p = rec->reqs;
    return TUTTI_OK;
}

/* FNV-1a style, a word at a time: the batch's digest of its calls' envelopes */
static uint64_t mix(uint64_t h, uint64_t x)
{
    h = (h ^ x) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static int batch_send(tt_op_t *op)
{
    tutti_comm_t *comm = op->comm;
    tt_confirm_batch_t *b = &comm->confirm;
    tt_op_t last = tt_agree_as_call(op, &b->last);
    const int checker = b->root, is_root = op->rank == checker;
    const int confirm = b->kind == TT_BATCH_CONFIRM;
    const uint32_t tag = confirm ? TT_CONFIRM_TAG : TT_RELEASE_TAG;
    tt_agree_rec_t *rec;
    TT_CHECK(rec_new(&last, is_root ? op->nranks - 1 : 1, b->n, &rec));
    rec->batch = b->kind;
    rec->seq0 = b->seq0;
    rec->want = b->digest;
    rec->checker = checker;
    b->n = 0;
    /* a confirm: every other rank's digest to the checker; a release: the checker's to
     * every other rank */
    if (!is_root)
        return confirm
                   ? tt_p2p_send(&last, checker, &rec->want, sizeof(rec->want), tag, &rec->reqs[0])
                   : tt_p2p_recv(&last, checker, &rec->got[0], sizeof(rec->got[0]), tag,
                                 &rec->reqs[0]);
    for (int r = 0, k = 0; r < op->nranks; r++)
        if (r != checker) {
            TT_CHECK(
                confirm
                    ? tt_p2p_recv(&last, r, &rec->got[k], sizeof(rec->got[k]), tag, &rec->reqs[k])
                    : tt_p2p_send(&last, r, &rec->want, sizeof(rec->want), tag, &rec->reqs[k]));
            k++;
        }
    return TUTTI_OK;
}

int tt_agree_flush(tt_op_t *op, int kind)
{
    tt_confirm_batch_t *b = &op->comm->confirm;
    if (!b->n || kind == b->kind)
        return TUTTI_OK;
    if (!kind && ++b->passed < TT_MIN(TT_CONFIRM_BATCH, op->comm->opts.agree_lag))
        return TUTTI_OK; /* it may wait for more calls of its kind */
    return batch_send(op);
}

static int batch_add(tt_op_t *op, int kind)
{
    tt_confirm_batch_t *b = &op->comm->confirm;
    if (!b->n) {
        b->seq0 = op->seq;
        b->digest = 0xcbf29ce484222325ull;
        b->kind = kind;
        b->root = op->root;
        b->passed = 0;
    }
    b->n++;
    b->digest = mix(mix(mix(mix(b->digest, op->seq), op->fingerprint), op->env_count), op->algo_id);
    call_of(&b->last, op);
    if (b->n >= TT_MIN(TT_CONFIRM_BATCH, op->comm->opts.agree_lag))
        return batch_send(op);
    return TUTTI_OK;
}

int tt_agree_confirm_later(tt_op_t *op)
{
    return batch_add(op, TT_BATCH_CONFIRM);
}

int tt_agree_release_later(tt_op_t *op)
{
    return batch_add(op, TT_BATCH_RELEASE);
}

void tt_agree_drain(tutti_comm_t *comm)
{
    if (!comm->agree_count || atomic_load(&comm->failed) < 0 || atomic_load(&comm->aborted))
        return;
    const uint64_t deadline = tt_now_ns() + (uint64_t)tt_comm_timeout_ms(comm) * 1000000ull;
    while (comm->agree_count > 0) {
        tt_agree_rec_t *rec = tt_agree_at(comm, 0);
        tt_req_t *bad = NULL;
        int st = tt_agree_rec_state(rec, &bad);
        if (st == 0) {
            int ms = tt_ms_left(deadline);
            if (atomic_load(&comm->aborted))
                st = TUTTI_ERR_ABORTED;
            else if (ms == 0)
                st = TUTTI_ERR_TIMEOUT;
            else if ((st = comm->tp_ops->progress(comm->tp, TT_MIN(ms, 100))) >= 0)
                continue;
        }
        if (st < 0) {
            /* Quietly: the peers are not told (a rank still behind fails only if it
             * goes on to need this one), the store gets no record. */
            const tt_req_t *q = bad;
            for (int i = 0; !q && i < rec->nreq; i++)
                if (rec->reqs[i].tp.status == 1)
                    q = &rec->reqs[i];
            TT_WARN("rank %d: tutti_comm_destroy: the agreement message %s rank %d for the "
                    "rooted calls seq %llu..%llu (%s, checked at rank %d) did not complete "
                    "(%s%s); left unchecked",
                    comm->rank, q && q->tp.kind == TUTTI_TP_SEND ? "to" : "from",
                    q ? q->tp.peer : -1,
                    (unsigned long long)(rec->batch ? rec->seq0 : rec->call.seq),
                    (unsigned long long)rec->call.seq,
                    rec->batch == TT_BATCH_CONFIRM   ? "confirms"
                    : rec->batch == TT_BATCH_RELEASE ? "releases"
                                                     : "handshake",
                    rec->checker, tutti_strerror(st),
                    st == TUTTI_ERR_TIMEOUT   ? ": the peer did not get to them within the timeout"
                    : st == TUTTI_ERR_ABORTED ? ": the communicator was aborted"
                                              : "");
            return;
        }
        char msg[TT_ERRMSG_LEN];
        if (rec_digest_differs(rec, comm->rank, msg, sizeof(msg)) >= 0)
            TT_WARN("rank %d: tutti_comm_destroy: %s", comm->rank, msg);
        rec_reap(comm, rec);
    }
}

void tt_agree_free(tutti_comm_t *comm)
{
    comm->confirm.n = 0;
    if (!comm->agree)
        return;
    for (int i = 0; i < comm->opts.agree_lag; i++) {
        free(comm->agree[i].reqs);
        free(comm->agree[i].got);
    }
    free(comm->agree);
    comm->agree = NULL;
    comm->agree_count = comm->agree_calls = 0;
}
