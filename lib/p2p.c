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
    req->env[2] = op->env_count;
    req->env[3] = ((uint64_t)op->algo_id << 32) | tag;
    req->status = 1;
}

static void add_peer_report(tutti_comm_t *comm, int peer, char *msg, size_t len);

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
    if (st == TUTTI_ERR_MISMATCH && req->got_env[1] != 0) {
        char mine[256], theirs[256];
        tt_describe_env(req->env, req->len, mine, sizeof(mine));
        tt_describe_env(req->got_env, req->got_len, theirs, sizeof(theirs));
        snprintf(msg, sizeof(msg),
                 "rank %d expected %s from rank %d (%s), but rank %d sent %s", op->rank, mine,
                 req->peer, peer_addr(comm, req->peer), req->peer, theirs);
    } else {
        pthread_mutex_lock(&comm->err_lock);
        snprintf(msg, sizeof(msg), "%s rank %d (%s): %s",
                 req->kind == TUTTI_TP_SEND ? "sending to" : "receiving from", req->peer,
                 peer_addr(comm, req->peer),
                 comm->tp_error[0] ? comm->tp_error : tutti_strerror(st));
        pthread_mutex_unlock(&comm->err_lock);
        if (st == TUTTI_ERR_PEER)
            add_peer_report(comm, req->peer, msg, sizeof(msg));
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

/* A rank that failed left "<status> <message>" under failed/<rank> (comm.c). 1 and the
 * message (malloc'ed) and status if rank `peer` did, else 0. */
static int peer_failure(tutti_comm_t *comm, int peer, int timeout_ms, char **msg_p, int *status_p)
{
    char key[64];
    snprintf(key, sizeof(key), "failed/%d", peer);
    const char *keys[1] = {key};
    int exists = 0;
    if (peer < 0 || tutti_store_check(comm->store, keys, 1, &exists) < 0 || !exists)
        return 0;
    void *v = NULL;
    size_t vlen = 0;
    if (tutti_store_get(comm->store, key, &v, &vlen, timeout_ms) < 0)
        return 0;
    char *end;
    long st = strtol((const char *)v, &end, 10);
    if (end == (char *)v || *end != ' ' || st >= 0 || st < -1000) {
        free(v);
        return 0;
    }
    memmove(v, end + 1, strlen(end + 1) + 1);
    *msg_p = v;
    *status_p = (int)st;
    return 1;
}

/* A peer that closed on us may have failed first and said why in the store. */
static void add_peer_report(tutti_comm_t *comm, int peer, char *msg, size_t len)
{
    char *why;
    int st;
    if (!peer_failure(comm, peer, 200, &why, &st))
        return;
    size_t n = strlen(msg);
    snprintf(msg + n, len - n, "; rank %d had failed first: %s", peer, why);
    free(why);
}

/* A failure the transport reported since the op started (a link to a peer failed, or a
 * peer reported its failure): fail the op with it. */
static int transport_failed(tt_op_t *op)
{
    tutti_comm_t *comm = op->comm;
    char msg[TT_ERRMSG_LEN];
    int st = comm->tp_error_status;
    pthread_mutex_lock(&comm->err_lock);
    snprintf(msg, sizeof(msg), "%s", comm->tp_error);
    int peer = comm->tp_error_peer;
    pthread_mutex_unlock(&comm->err_lock);
    if (st == TUTTI_ERR_PEER)
        add_peer_report(comm, peer, msg, sizeof(msg));
    tt_p2p_fail(op, st);
    tt_comm_record_failure(comm, op, st, msg);
    return st;
}

/* Who is the hung rank? Follow the stall records: the peer this rank waits on may
 * itself wait on another one; the chain ends at a rank with no record for this op. */
static void blame_chain(tt_op_t *op, int first, char *out, size_t outlen)
{
    tutti_comm_t *comm = op->comm;
    int cur = first;
    size_t n = 0;
    out[0] = '\0';
    for (int hops = 0; hops < op->nranks; hops++) {
        char key[64];
        snprintf(key, sizeof(key), "stall/%d", cur);
        const char *keys[1] = {key};
        int exists = 0;
        void *v = NULL;
        size_t len = 0;
        unsigned long long seq = 0, fp = 0, count = 0;
        int next = -1, kind = 0;
        if (tutti_store_check(comm->store, keys, 1, &exists) == 0 && exists &&
            tutti_store_get(comm->store, key, &v, &len, 500) == 0) {
            if (sscanf((const char *)v, "%llu %llx %llu %d %d", &seq, &fp, &count, &next,
                       &kind) != 5 || seq != op->seq)
                next = -1;
            free(v);
        }
        if (next < 0 || next == cur) {
            n += (size_t)snprintf(out + n, outlen - n,
                                  "%srank %d shows no sign of being in this collective "
                                  "(hung, dead, or not calling it)", hops ? "; " : "", cur);
            return;
        }
        if (next == op->rank) {
            n += (size_t)snprintf(out + n, outlen - n,
                                  "%srank %d waits on this rank: a deadlock", hops ? "; " : "",
                                  cur);
            return;
        }
        n += (size_t)snprintf(out + n, outlen - n, "%srank %d itself waits %s rank %d",
                              hops ? "; " : "", cur, kind ? "to receive from" : "to send to",
                              next);
        if (n >= outlen)
            return;
        cur = next;
    }
}

static int timed_out(tt_op_t *op, tt_req_t *req)
{
    tutti_comm_t *comm = op->comm;
    char msg[TT_ERRMSG_LEN];
    /* Ranks waiting on each other time out at about the same moment; a short grace lets
     * the report of the rank that waits on the real culprit arrive, so that every rank
     * names the hung one rather than its neighbour. */
    int grace_ms = TT_MIN(200, comm->opts.timeout_ms / 10);
    uint64_t grace_end = tt_deadline_ns(grace_ms);
    while (tt_now_ns() < grace_end && req->status == 1) {
        comm->tp_ops->progress(comm->tp, TT_MAX(1, tt_ms_left(grace_end)));
        if (atomic_load(&comm->tp_error_gen) != op->tp_error_gen)
            return transport_failed(op);
    }
    char chain[512] = "";
    if (comm->opts.stall_check_ms > 0)
        blame_chain(op, req->peer, chain, sizeof(chain));
    snprintf(msg, sizeof(msg),
             "no progress within %d ms %s rank %d (%s): %zu of %zu bytes moved%s%s%s",
             comm->opts.timeout_ms, req->kind == TUTTI_TP_SEND ? "sending to" : "receiving from",
             req->peer, peer_addr(comm, req->peer), req->xfer, req->len,
             chain[0] ? " (" : " (peer hung, slow, or not calling this collective",
             chain, ")");
    tt_p2p_fail(op, TUTTI_ERR_TIMEOUT);
    tt_comm_record_failure(comm, op, TUTTI_ERR_TIMEOUT, msg);
    return TUTTI_ERR_TIMEOUT;
}

/* Stall inspection: a rank blocked in one op for stall_check_ms publishes its op
 * (sequence number, fingerprint, count) under stall/<rank> and compares it with what the
 * other ranks published. Two ranks at the same sequence number in different ops is a
 * mismatch that exchanged no message to reveal it (say, both waiting to receive from
 * each other). Costs nothing while ops make progress. */
static int stall_check(tt_op_t *op, const tt_req_t *req)
{
    tutti_comm_t *comm = op->comm;
    char key[64], val[128];
    if (!op->stall_published) {
        snprintf(key, sizeof(key), "stall/%d", op->rank);
        snprintf(val, sizeof(val), "%llu %llx %llu %d %d", (unsigned long long)op->seq,
                 (unsigned long long)op->fingerprint, (unsigned long long)op->env_count,
                 req->peer, req->kind);
        if (tutti_store_set(comm->store, key, val, strlen(val) + 1) < 0)
            return TUTTI_OK; /* best effort: the timeout still bounds the wait */
        op->stall_published = 1;
    }
    /* A rank that failed left its reason under failed/<rank> and counted itself in
     * failed_count (comm.c). Its report reaches only the peers it was talking to
     * (transports read idle links only when a request uses them), and the communicator
     * is lost anyway: a rank blocked on a third, hung rank fails now with the first
     * cause, not at its own timeout. One counter read unless some rank failed. */
    int64_t nfailed = 0;
    if (tutti_store_add(comm->store, "failed_count", 0, &nfailed) < 0)
        nfailed = 0;
    for (int p = 0; p < op->nranks; p++) {
        if (p == op->rank)
            continue;
        char *why;
        int fst;
        if (nfailed > 0 && peer_failure(comm, p, 1000, &why, &fst)) {
            /* its own status, as its report would have carried (a mismatch stays one);
             * its abort is its own business: here, a failed peer */
            if (fst == TUTTI_ERR_ABORTED)
                fst = TUTTI_ERR_PEER;
            char msg[TT_ERRMSG_LEN];
            snprintf(msg, sizeof(msg),
                     "waiting on rank %d, but rank %d had failed (found by the stall check): %s",
                     req->peer, p, why);
            free(why);
            tt_p2p_fail(op, fst);
            tt_comm_record_failure(comm, op, fst, msg);
            return fst;
        }
        snprintf(key, sizeof(key), "stall/%d", p);
        const char *keys[1] = {key};
        int exists = 0;
        if (tutti_store_check(comm->store, keys, 1, &exists) < 0 || !exists)
            continue;
        void *v = NULL;
        size_t len = 0;
        if (tutti_store_get(comm->store, key, &v, &len, 1000) < 0)
            continue;
        unsigned long long seq = 0, fp = 0, count = 0;
        int ok = sscanf((const char *)v, "%llu %llx %llu", &seq, &fp, &count) == 3;
        free(v);
            if (!ok || seq != op->seq || (fp == op->fingerprint && count == op->env_count))
            continue;
        uint64_t mine[4] = {op->seq, op->fingerprint, op->env_count,
                            (uint64_t)op->algo_id << 32};
        uint64_t theirs[4] = {seq, fp, count, 0};
        char a[256], b[256], msg[TT_ERRMSG_LEN];
        tt_describe_env(mine, op->count * op->elem_size, a, sizeof(a));
        tt_describe_env(theirs, 0, b, sizeof(b));
        snprintf(msg, sizeof(msg),
                 "rank %d is in %s, but rank %d is in %s (found by the stall check: both "
                 "were blocked for over %d ms)",
                 op->rank, a, p, b, comm->opts.stall_check_ms);
        tt_p2p_fail(op, TUTTI_ERR_MISMATCH);
        tt_comm_record_failure(comm, op, TUTTI_ERR_MISMATCH, msg);
        return TUTTI_ERR_MISMATCH;
    }
    return TUTTI_OK;
}

static int progress_once(tt_op_t *op, tt_req_t *req)
{
    tutti_comm_t *comm = op->comm;
    int ms = tt_ms_left(op->deadline_ns);
    if (ms == 0)
        return timed_out(op, req);
    /* before the timeout, so that a timed-out rank can read who waits on whom */
    int stall_ms = TT_MIN(comm->opts.stall_check_ms, comm->opts.timeout_ms / 2);
    if (stall_ms > 0) {
        uint64_t now = tt_now_ns();
        if (!op->stall_next_ns)
            op->stall_next_ns = now + (uint64_t)stall_ms * 1000000ull;
        if (now >= op->stall_next_ns) {
            TT_CHECK(stall_check(op, req));
            op->stall_next_ns = now + (uint64_t)stall_ms * 500000ull;
        }
        ms = TT_MIN(ms, (int)((op->stall_next_ns - now) / 1000000ull) + 1);
    }
    int st = comm->tp_ops->progress(comm->tp, ms);
    if (st >= 0 && atomic_load(&comm->tp_error_gen) != op->tp_error_gen) {
        /* A link failed (a peer died or reported a failure), maybe not the one this
         * request waits on: fail now rather than wait for the cascade or the timeout. */
        return transport_failed(op);
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
