/* The point-to-point layer between algorithms and the transport: requests stamped with
 * their envelope, posted, and driven to completion within the op's deadline. Failures go
 * to fault.c, which describes and records them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/agree_ring.h"
#include "core/envelope.h"
#include "core/fault.h"
#include "core/p2p.h"
#include "core/state.h"
#include "base/base.h"

static void req_init(tt_op_t *op, int kind, int peer, const void *buf, size_t len, uint32_t tag,
                     tt_req_t *ireq)
{
    tutti_tp_req_v2_t *req = &ireq->tp;
    /* also mem = TUTTI_MEM_HOST, no handle, no stream; a copy, not a memset (coll.c) */
    static const tutti_tp_req_v2_t req_zero;
    *req = req_zero;
    req->kind = kind;
    req->peer = peer;
    req->buf = (void *)buf;
    req->len = len;
    req->hints = op->tp_hints;
    tt_env_encode(req->env, op->seq, op->fingerprint, op->env_count, op->algo_id, tag);
    req->status = 1;
}

int tt_p2p_fail(tt_op_t *op, int status)
{
    tutti_comm_t *comm = op->comm;
    comm->tp_ops->cancel_all(comm->tp, status);
    return status;
}

/* Time this process was not running (fault.c accounts for it): the threshold test stays
 * here, inline, as it runs on every progress step. */
static inline void not_running(tt_op_t *op, uint64_t gap_ns)
{
    if (gap_ns > op->comm->quick_ns)
        tt_fault_stopped(op, gap_ns);
}

/* The time since this rank last came back from a wait, accounted for as
 * tt_p2p_progress does: before a failure found without a clock reading (at a look), so
 * that it says this rank was not running (a SIGSTOP during which its peers timed out on
 * it). */
static uint64_t awake_now(tt_op_t *op)
{
    uint64_t now = tt_coarse_ns();
    if (op->awake_ns && now > op->awake_ns)
        not_running(op, now - op->awake_ns);
    op->awake_ns = now;
    return now;
}

static int req_failed(tt_op_t *op, tt_req_t *req)
{
    awake_now(op);
    return tt_fault_req(op, &req->tp);
}

static int post(tt_op_t *op, int kind, int peer, const void *buf, size_t len, uint32_t tag,
                tt_req_t *req)
{
    tutti_comm_t *comm = op->comm;
    if (peer < 0 || peer >= op->nranks || peer == op->rank) {
        char msg[128];
        snprintf(msg, sizeof(msg), "algorithm bug: %s peer %d", kind ? "recv from" : "send to",
                 peer);
        tt_fault_fail_op(op, TUTTI_ERR_INTERNAL, msg);
        return TUTTI_ERR_INTERNAL;
    }
    static char none;
    if (!buf && !len)
        buf = &none; /* empty messages still go, and transports get a valid pointer */
    req_init(op, kind, peer, buf, len, tag, req);
    int st = kind == TUTTI_TP_SEND ? comm->tp_ops->post_send(comm->tp, &req->tp)
                                   : comm->tp_ops->post_recv(comm->tp, &req->tp);
    if (st < 0) {
        if (req->tp.status >= 0)
            req->tp.status = st;
        return req_failed(op, req);
    }
    return TUTTI_OK;
}

int tt_p2p_send(tt_op_t *op, int peer, const void *buf, size_t len, uint32_t tag, tt_req_t *req)
{
    return post(op, TUTTI_TP_SEND, peer, buf, len, tag, req);
}

int tt_p2p_recv(tt_op_t *op, int peer, void *buf, size_t len, uint32_t tag, tt_req_t *req)
{
    return post(op, TUTTI_TP_RECV, peer, buf, len, tag, req);
}

int tt_p2p_progress(tt_op_t *op, tt_req_t *req)
{
    tutti_comm_t *comm = op->comm;
    /* one reading serves the checks below (a hot path), of the cheap clock: the
     * thresholds here are the timeout and quick_ns (100 ms and up) */
    uint64_t now = awake_now(op);
    int ms = tt_ms_left_at(op->deadline_ns, now);
    if (ms == 0)
        return tt_fault_timed_out(op, &req->tp);
    /* before the timeout, so that a timed-out rank can read who waits on whom */
    int stall_ms = TT_MIN(comm->opts.stall_check_ms, op->timeout_ms / 2);
    if (stall_ms > 0) {
        if (!op->stall_next_ns)
            op->stall_next_ns = now + (uint64_t)stall_ms * 1000000ull;
        if (now >= op->stall_next_ns) {
            int sst = tt_fault_stall_check(op, &req->tp);
            if (sst == TT_STALL_NOTHING && comm->agree_count)
                sst = tt_agree_failed(op);
            TT_CHECK(sst);
            now = tt_coarse_ns();
            op->stall_next_ns = now + (uint64_t)stall_ms * 500000ull;
            ms = tt_ms_left_at(op->deadline_ns, now);
            if (ms == 0)
                return tt_fault_timed_out(op, &req->tp);
        }
        ms = TT_MIN(ms, (int)((op->stall_next_ns - now) / 1000000ull) + 1);
    }
    uint64_t t0 = now;
    int st = comm->tp_ops->progress(comm->tp, ms);
    uint64_t t1 = tt_coarse_ns();
    if (t1 - t0 > (uint64_t)ms * 1000000ull)
        not_running(op, t1 - t0 - (uint64_t)ms * 1000000ull);
    op->awake_ns = t1;
    op->waited = 1;
    if (st >= 0 && atomic_load(&comm->tp_error_gen) != op->tp_error_gen) {
        /* A link failed (a peer died or reported a failure), maybe not the one this
         * request waits on: fail now rather than wait for the cascade or the timeout. */
        return tt_fault_transport(op);
    }
    if (st < 0)
        return tt_fault_progress(op, st);
    return TUTTI_OK;
}

/* One look at the transport before a timed wait: a request whose message is already
 * there (a receive behind a sender that runs ahead, an eager send) completes here.
 * Without a clock reading until the op has waited once: small calls back to back (~0.2
 * us over shm) then read none; after a timed wait, the time since it counts as in
 * tt_p2p_progress, so that a large op's computing between looks does not pile up into
 * "not running". A link that failed meanwhile fails the op now, as a wait would. */
static inline int look_once(tt_op_t *op)
{
    tutti_comm_t *comm = op->comm;
    if (op->waited)
        awake_now(op);
    int st = comm->tp_ops->progress(comm->tp, 0);
    if (st < 0) {
        awake_now(op);
        return tt_fault_progress(op, st);
    }
    if (atomic_load_explicit(&comm->tp_error_gen, memory_order_relaxed) != op->tp_error_gen) {
        awake_now(op);
        return tt_fault_transport(op);
    }
    return TUTTI_OK;
}

int tt_p2p_wait(tt_op_t *op, tt_req_t *req)
{
    if (req->tp.status == 1)
        TT_CHECK(look_once(op));
    while (req->tp.status == 1)
        TT_CHECK(tt_p2p_progress(op, req));
    if (req->tp.status < 0)
        return req_failed(op, req);
    return TUTTI_OK;
}

int tt_p2p_wait_all(tt_op_t *op, tt_req_t *reqs, size_t n)
{
    size_t first = 0;
    int looked = 0;
    for (;;) {
        tt_req_t *pending = NULL;
        for (size_t i = first; i < n; i++) {
            if (reqs[i].tp.status < 0)
                return req_failed(op, &reqs[i]);
            if (reqs[i].tp.status == 1 && !pending)
                pending = &reqs[i];
            if (reqs[i].tp.status == 0 && i == first)
                first++;
        }
        if (!pending)
            return TUTTI_OK;
        if (!looked) {
            looked = 1;
            TT_CHECK(look_once(op));
            continue;
        }
        TT_CHECK(tt_p2p_progress(op, pending));
    }
}

tt_req_t *tt_reqs_get(tt_reqs_t *r, size_t n)
{
    r->heap = NULL;
    if (n <= TT_REQS_FEW) {
        /* posting sets every field (req_init): only the status of one never posted,
         * which waits pass over as complete, is read before that */
        for (size_t i = 0; i < n; i++)
            r->few[i].tp.status = 0;
        return r->few;
    }
    return r->heap = calloc(n, sizeof(*r->heap));
}

void *tt_op_scratch(tt_op_t *op, int index, size_t bytes)
{
    tutti_comm_t *comm = op->comm;
    if (index < 0 || index > 1)
        return NULL;
    if (comm->scratch_len[index] < bytes || !comm->scratch[index]) {
        void *p = NULL;
        size_t want = bytes < 4096 ? 4096 : bytes;
        if (posix_memalign(&p, 64, want) != 0)
            return NULL;
        free(comm->scratch[index]);
        comm->scratch[index] = p;
        comm->scratch_len[index] = want;
    }
    return comm->scratch[index];
}
