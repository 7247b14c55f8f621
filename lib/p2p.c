/* The point-to-point layer between algorithms and the transport: envelopes, deadlines
 * and error descriptions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "internal.h"

static void req_init(tt_op_t *op, int kind, int peer, const void *buf, size_t len,
                     uint32_t tag, tt_req_t *req)
{
    memset(req, 0, sizeof(*req));
    req->kind = kind;
    req->peer = peer;
    req->buf = (void *)buf;
    req->len = len;
    req->env[0] = op->seq;
    req->env[1] = op->fingerprint;
    req->env[2] = op->count;
    req->env[3] = ((uint64_t)op->algo_id << 32) | tag;
    req->status = 1;
}

static const char *peer_addr(tutti_comm_t *comm, int peer)
{
    const char *a = comm->tp_ops->peer_address ? comm->tp_ops->peer_address(comm->tp, peer)
                                               : NULL;
    return a ? a : "?";
}

int tt_p2p_fail(tt_op_t *op, int status)
{
    tutti_comm_t *comm = op->comm;
    comm->tp_ops->cancel_all(comm->tp, status);
    return status;
}

/* Describe a failed request, record it on the communicator, cancel the rest. */
static int req_failed(tt_op_t *op, tt_req_t *req)
{
    tutti_comm_t *comm = op->comm;
    int st = req->status;
    char msg[TT_ERRMSG_LEN];
    if (st == TUTTI_ERR_MISMATCH) {
        char mine[256], theirs[256];
        tt_describe_env(req->env, req->len, mine, sizeof(mine));
        tt_describe_env(req->got_env, req->got_len, theirs, sizeof(theirs));
        snprintf(msg, sizeof(msg),
                 "rank %d expected %s from rank %d (%s), but rank %d sent %s", op->rank, mine,
                 req->peer, peer_addr(comm, req->peer), req->peer, theirs);
    } else {
        pthread_mutex_lock(&comm->err_lock);
        snprintf(msg, sizeof(msg), "%s rank %d (%s): %s",
                 req->kind == TUTTI_TP_SEND ? "sending to" : "receiving from", req->peer, peer_addr(comm, req->peer),
                 comm->tp_error[0] ? comm->tp_error : tutti_strerror(st));
        pthread_mutex_unlock(&comm->err_lock);
    }
    tt_p2p_fail(op, st);
    tt_comm_record_failure(comm, op, st, msg);
    return st;
}

static int post(tt_op_t *op, int kind, int peer, const void *buf, size_t len, uint32_t tag,
                tt_req_t *req)
{
    tutti_comm_t *comm = op->comm;
    if (peer < 0 || peer >= op->nranks || peer == op->rank) {
        char msg[128];
        snprintf(msg, sizeof(msg), "algorithm bug: %s peer %d", kind ? "recv from" : "send to",
                 peer);
        tt_p2p_fail(op, TUTTI_ERR_INTERNAL);
        tt_comm_record_failure(comm, op, TUTTI_ERR_INTERNAL, msg);
        return TUTTI_ERR_INTERNAL;
    }
    req_init(op, kind, peer, buf, len, tag, req);
    int st = kind == TUTTI_TP_SEND ? comm->tp_ops->post_send(comm->tp, req)
                                   : comm->tp_ops->post_recv(comm->tp, req);
    if (st < 0) {
        if (req->status >= 0)
            req->status = st;
        return req_failed(op, req);
    }
    return TUTTI_OK;
}

int tt_p2p_send(tt_op_t *op, int peer, const void *buf, size_t len, uint32_t tag,
                tt_req_t *req)
{
    return post(op, TUTTI_TP_SEND, peer, buf, len, tag, req);
}

int tt_p2p_recv(tt_op_t *op, int peer, void *buf, size_t len, uint32_t tag, tt_req_t *req)
{
    return post(op, TUTTI_TP_RECV, peer, buf, len, tag, req);
}

static int timed_out(tt_op_t *op, tt_req_t *req)
{
    tutti_comm_t *comm = op->comm;
    char msg[TT_ERRMSG_LEN];
    snprintf(msg, sizeof(msg),
             "no progress within %d ms %s rank %d (%s): %zu of %zu bytes moved (peer hung, "
             "slow, or not calling this collective)",
             comm->opts.timeout_ms, req->kind == TUTTI_TP_SEND ? "sending to" : "receiving from",
             req->peer, peer_addr(comm, req->peer), req->xfer, req->len);
    tt_p2p_fail(op, TUTTI_ERR_TIMEOUT);
    tt_comm_record_failure(comm, op, TUTTI_ERR_TIMEOUT, msg);
    return TUTTI_ERR_TIMEOUT;
}

static int progress_once(tt_op_t *op, tt_req_t *req)
{
    tutti_comm_t *comm = op->comm;
    int ms = tt_ms_left(op->deadline_ns);
    if (ms == 0)
        return timed_out(op, req);
    int st = comm->tp_ops->progress(comm->tp, ms);
    if (st >= 0 && atomic_load(&comm->tp_error_gen) != op->tp_error_gen) {
        /* A link failed (a peer died or reported a failure), maybe not the one this
         * request waits on: fail now rather than wait for the cascade or the timeout. */
        st = comm->tp_error_status;
    }
    if (st < 0) {
        char msg[TT_ERRMSG_LEN];
        pthread_mutex_lock(&comm->err_lock);
        snprintf(msg, sizeof(msg), "%s", st == TUTTI_ERR_ABORTED ? "aborted while waiting"
                                         : comm->tp_error);
        pthread_mutex_unlock(&comm->err_lock);
        tt_p2p_fail(op, st);
        tt_comm_record_failure(comm, op, st, msg);
        return st;
    }
    return TUTTI_OK;
}

int tt_p2p_wait(tt_op_t *op, tt_req_t *req)
{
    while (req->status == 1)
        TT_CHECK(progress_once(op, req));
    if (req->status < 0)
        return req_failed(op, req);
    return TUTTI_OK;
}

int tt_p2p_wait_all(tt_op_t *op, tt_req_t *reqs, size_t n)
{
    size_t first = 0;
    for (;;) {
        tt_req_t *pending = NULL;
        for (size_t i = first; i < n; i++) {
            if (reqs[i].status < 0)
                return req_failed(op, &reqs[i]);
            if (reqs[i].status == 1 && !pending)
                pending = &reqs[i];
            if (reqs[i].status == 0 && i == first)
                first++;
        }
        if (!pending)
            return TUTTI_OK;
        TT_CHECK(progress_once(op, pending));
    }
}

void *tt_op_scratch(tt_op_t *op, int index, size_t bytes)
{
    tutti_comm_t *comm = op->comm;
    if (index < 0 || index > 1)
        return NULL;
    if (comm->scratch_len[index] < bytes) {
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
