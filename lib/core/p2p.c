/* The point-to-point layer between algorithms and the transport: envelopes, deadlines
 * and error descriptions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "base/base.h"

/* ---- the store on failure paths ---- */

static int op_store_ms(tt_op_t *op)
{
    if (op->store_down)
        return 0;
    int ms = tt_comm_quick_ms(op->comm);
    if (op->deadline_ns)
        ms = TT_MIN(ms, TT_MAX(tt_ms_left(op->deadline_ns), TT_OP_STORE_FLOOR_MS));
    /* the calls without a timeout argument take the handle's default; only the thread
     * running the op makes them */
    tutti_store_set_timeout(op->comm->qstore, ms);
    return ms;
}

static int op_store_done(tt_op_t *op, int st)
{
    if (st < 0) {
        op->store_down = 1;
        TT_INFO("store unreachable on a failure path (%s): no more store calls in this op",
                tutti_store_last_error(op->comm->qstore));
    }
    return st;
}

int tt_op_store_set(tt_op_t *op, const char *key, const void *value, size_t len)
{
    if (!op_store_ms(op))
        return TUTTI_ERR_STORE;
    return op_store_done(op, tutti_store_set(op->comm->qstore, key, value, len));
}

int tt_op_store_add(tt_op_t *op, const char *key, int64_t delta, int64_t *result_p)
{
    if (!op_store_ms(op))
        return TUTTI_ERR_STORE;
    return op_store_done(op, tutti_store_add(op->comm->qstore, key, delta, result_p));
}

int tt_op_store_check(tt_op_t *op, const char *key, int *exists_p)
{
    const char *keys[1] = {key};
    *exists_p = 0;
    if (!op_store_ms(op))
        return TUTTI_ERR_STORE;
    return op_store_done(op, tutti_store_check(op->comm->qstore, keys, 1, exists_p));
}

/* only for a key that exists: a timeout here is the store's failure */
int tt_op_store_get(tt_op_t *op, const char *key, void **value_p, size_t *len_p)
{
    int ms = op_store_ms(op);
    if (!ms)
        return TUTTI_ERR_STORE;
    return op_store_done(op, tutti_store_get(op->comm->qstore, key, value_p, len_p, ms));
}

int tt_op_store_delete(tt_op_t *op, const char *key)
{
    if (!op_store_ms(op))
        return TUTTI_ERR_STORE;
    return op_store_done(op, tutti_store_delete(op->comm->qstore, key, NULL));
}

static void req_init(tt_op_t *op, int kind, int peer, const void *buf, size_t len,
                     uint32_t tag, tt_req_t *ireq)
{
    tutti_tp_req_v2_t *req = &ireq->tp;
    memset(req, 0, sizeof(*req)); /* also mem = TUTTI_MEM_HOST, no handle, no stream */
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

static void add_peer_report(tt_op_t *op, int peer, char *msg, size_t len);

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
static int req_failed(tt_op_t *op, tt_req_t *ireq)
{
    const tutti_tp_req_v2_t *req = &ireq->tp;
    tutti_comm_t *comm = op->comm;
    int st = req->status;
    char msg[TT_ERRMSG_LEN];
    if (st == TUTTI_ERR_MISMATCH && req->got_env[1] != 0) {
        char mine[256], theirs[256];
        tt_describe_env(req->env, req->len, op, 1, mine, sizeof(mine));
        tt_describe_env(req->got_env, req->got_len, op, 0, theirs, sizeof(theirs));
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
            add_peer_report(op, req->peer, msg, sizeof(msg));
    }
    tt_comm_fail_op(comm, op, st, msg);
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
        tt_comm_fail_op(comm, op, TUTTI_ERR_INTERNAL, msg);
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
static int peer_failure(tt_op_t *op, int peer, char **msg_p, int *status_p)
{
    char key[64];
    snprintf(key, sizeof(key), "failed/%d", peer);
    int exists = 0;
    if (peer < 0 || tt_op_store_check(op, key, &exists) < 0 || !exists)
        return 0;
    void *v = NULL;
    size_t vlen = 0;
    if (tt_op_store_get(op, key, &v, &vlen) < 0)
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

/* A peer that closed on us may have failed first and said why in the store. Not asked
 * when the peer's own report is the failure (the built-in transports say "failed and
 * reported"): the report carries the cause, and a store whose host died would cost
 * every rank on the report's way a store deadline. */
static void add_peer_report(tt_op_t *op, int peer, char *msg, size_t len)
{
    char *why;
    int st;
    if (strstr(msg, "failed and reported"))
        return;
    size_t n = strlen(msg);
    if (peer_failure(op, peer, &why, &st)) {
        snprintf(msg + n, len - n, "; rank %d had failed first: %s", peer, why);
        free(why);
    } else if (op->store_down) {
        snprintf(msg + n, len - n, "; whether rank %d failed first is unknown: the store is "
                 "unreachable too (%s)", peer, tutti_store_last_error(op->comm->qstore));
    }
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
        add_peer_report(op, peer, msg, sizeof(msg));
    tt_comm_fail_op(comm, op, st, msg);
    return st;
}

/* A stall record: "<seq> <fingerprint> <env count> <peer> <kind> <algorithm id>", what a
 * rank blocked in an op waits on (stall_check publishes it, tt_op_finish removes it). */
typedef struct stall_rec {
    unsigned long long seq, fp, count;
    int next, kind;
    unsigned algo;
} stall_rec_t;

static int stall_read(tt_op_t *op, int rank, stall_rec_t *rec)
{
    char key[64];
    snprintf(key, sizeof(key), "stall/%d", rank);
    int exists = 0;
    void *v = NULL;
    size_t len = 0;
    if (tt_op_store_check(op, key, &exists) < 0 || !exists ||
        tt_op_store_get(op, key, &v, &len) < 0)
        return 0;
    int ok = sscanf((const char *)v, "%llu %llx %llu %d %d %u", &rec->seq, &rec->fp,
                    &rec->count, &rec->next, &rec->kind, &rec->algo) == 6 &&
             rec->next >= 0 && rec->next < op->nranks;
    free(v);
    return ok;
}

static const char *fp_coll_name(uint64_t fp)
{
    tt_coll_t c = (tt_coll_t)(fp >> 56);
    const char *name = tt_coll_name(c);
    return c == TT_COLL_P2P ? "point-to-point" : name ? name : "?";
}

/* Who is the hung rank? Follow the stall records: the peer this rank waits on may
 * itself wait on another one, in this collective or, when it is behind, in an earlier
 * one (a 4-byte loop: rank 1 still waits on a stopped rank 3 in seq N while rank 0
 * waits on rank 1 in seq N+1); the chain ends at a rank with no record for the op it
 * is awaited in: the hung one. Records of later ops end it too (that rank is past the
 * op, whatever it waits on now). */
static void blame_chain(tt_op_t *op, int first, char *out, size_t outlen)
{
    int cur = first;
    unsigned long long seq = op->seq, fp = op->fingerprint;
    size_t n = 0;
    out[0] = '\0';
#define BLAME(...) (n += (size_t)snprintf(out + n, n < outlen ? outlen - n : 0, __VA_ARGS__))
    for (int hops = 0; hops < op->nranks && n < outlen; hops++) {
        const char *sep = hops ? "; " : "";
        stall_rec_t rec;
        int have = stall_read(op, cur, &rec);
        if (!have && op->store_down) {
            BLAME("%swhether rank %d waits on another is unknown: the store is unreachable",
                  sep, cur);
            break;
        }
        if (!have || rec.seq > seq || rec.next == cur) {
            if (seq == op->seq)
                BLAME("%srank %d shows no sign of being in this collective (hung, dead, or "
                      "not calling it)", sep, cur);
            else
                BLAME("%srank %d shows no sign of being in %s seq %llu (hung, dead, or not "
                      "calling it)", sep, cur, fp_coll_name(fp), seq);
            break;
        }
        const char *what = rec.kind ? "to receive from" : "to send to";
        if (rec.next == op->rank) {
            if (rec.seq != op->seq)
                BLAME("%srank %d, still in %s seq %llu, waits %s this rank", sep, cur,
                      fp_coll_name(rec.fp), rec.seq, what);
            else if (op->stopped_ns)
                BLAME("%srank %d waits %s this rank, which was not running for %llu ms", sep,
                      cur, what, (unsigned long long)(op->stopped_ns / 1000000ull));
            else
                BLAME("%srank %d waits %s this rank: a deadlock", sep, cur, what);
            break;
        }
        if (rec.seq == seq)
            BLAME("%srank %d itself waits %s rank %d", sep, cur, what, rec.next);
        else
            BLAME("%srank %d is still in %s seq %llu, waiting %s rank %d", sep, cur,
                  fp_coll_name(rec.fp), rec.seq, what, rec.next);
        seq = rec.seq;
        fp = rec.fp;
        cur = rec.next;
    }
#undef BLAME
}

static int timed_out(tt_op_t *op, tt_req_t *ireq)
{
    const tutti_tp_req_v2_t *req = &ireq->tp;
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
    char chain[512] = "", moved[64] = "";
    if (comm->opts.stall_check_ms > 0)
        blame_chain(op, req->peer, chain, sizeof(chain));
    if (req->xfer < req->len)
        snprintf(moved, sizeof(moved), ": %zu of %zu bytes moved", req->xfer, req->len);
    snprintf(msg, sizeof(msg), "no progress within %d ms %s rank %d (%s)%s%s%s%s",
             comm->opts.timeout_ms, req->kind == TUTTI_TP_SEND ? "sending to" : "receiving from",
             req->peer, peer_addr(comm, req->peer), moved,
             chain[0] ? " (" : " (peer hung, slow, or not calling this collective",
             chain, ")");
    tt_comm_fail_op(comm, op, TUTTI_ERR_TIMEOUT, msg);
    return TUTTI_ERR_TIMEOUT;
}

/* Stall inspection: a rank blocked in one op for stall_check_ms publishes its op
 * (sequence number, fingerprint, count, whom it waits on) under stall/<rank> and
 * compares it with what the other ranks published. Two ranks at the same sequence
 * number in different ops is a mismatch that exchanged no message to reveal it (say,
 * both waiting to receive from each other). Costs nothing while ops make progress; all
 * best effort, through the failure paths' bounded store calls. */
static int stall_check(tt_op_t *op, const tutti_tp_req_v2_t *req)
{
    tutti_comm_t *comm = op->comm;
    char key[64], val[160];
    if (!op->stall_published || op->stall_peer != req->peer || op->stall_kind != req->kind) {
        /* again when the request waited on changed: timed-out ranks follow these */
        snprintf(key, sizeof(key), "stall/%d", op->rank);
        snprintf(val, sizeof(val), "%llu %llx %llu %d %d %u", (unsigned long long)op->seq,
                 (unsigned long long)op->fingerprint, (unsigned long long)op->env_count,
                 req->peer, req->kind, op->algo_id);
        if (tt_op_store_set(op, key, val, strlen(val) + 1) < 0)
            return TUTTI_OK; /* the timeout still bounds the wait */
        op->stall_published = 1;
        op->stall_peer = req->peer;
        op->stall_kind = req->kind;
    }
    /* A rank that failed left its reason under failed/<rank> and counted itself in
     * failed_count (comm.c). Its report reaches only the peers it was talking to
     * (transports read idle links only when a request uses them), and the communicator
     * is lost anyway: a rank blocked on a third, hung rank fails now with the first
     * cause, not at its own timeout. One counter read unless some rank failed. */
    int64_t nfailed = 0;
    if (tt_op_store_add(op, "failed_count", 0, &nfailed) < 0)
        return TUTTI_OK;
    for (int p = 0; p < op->nranks && !op->store_down; p++) {
        if (p == op->rank)
            continue;
        char *why;
        int fst;
        if (nfailed > 0 && peer_failure(op, p, &why, &fst)) {
            /* its own status, as its report would have carried (a mismatch stays one);
             * its abort is its own business: here, a failed peer */
            if (fst == TUTTI_ERR_ABORTED)
                fst = TUTTI_ERR_PEER;
            char msg[TT_ERRMSG_LEN];
            snprintf(msg, sizeof(msg),
                     "waiting on rank %d, but rank %d had failed (found by the stall check): %s",
                     req->peer, p, why);
            free(why);
            tt_comm_fail_op(comm, op, fst, msg);
            return fst;
        }
        stall_rec_t rec;
        if (!stall_read(op, p, &rec) || rec.seq != op->seq ||
            (rec.fp == op->fingerprint && rec.count == op->env_count))
            continue;
        uint64_t mine[4] = {op->seq, op->fingerprint, op->env_count,
                            (uint64_t)op->algo_id << 32};
        uint64_t theirs[4] = {rec.seq, rec.fp, rec.count, (uint64_t)rec.algo << 32};
        char a[256], b[256], msg[TT_ERRMSG_LEN];
        tt_describe_env(mine, (size_t)-1, op, 1, a, sizeof(a));
        tt_describe_env(theirs, (size_t)-1, op, 0, b, sizeof(b));
        snprintf(msg, sizeof(msg),
                 "rank %d is in %s, but rank %d is in %s (found by the stall check: both "
                 "were blocked for over %d ms)",
                 op->rank, a, p, b, comm->opts.stall_check_ms);
        tt_comm_fail_op(comm, op, TUTTI_ERR_MISMATCH, msg);
        return TUTTI_ERR_MISMATCH;
    }
    return TUTTI_OK;
}

/* A wait that ended far later than it asked, or a long gap between waits: this process
 * was not running (SIGSTOP, a debugger, a starved machine). Its peers are not to blame
 * for that time: the deadline moves by it, so a resumed rank hears what its peers did
 * meanwhile (their reports, or their failures in the store) instead of timing out at
 * once, and a whole job stopped and resumed carries on. The op's error says it. */
static void op_not_running(tt_op_t *op, uint64_t gap_ns)
{
    if (gap_ns <= op->comm->quick_ns)
        return;
    op->stopped_ns += gap_ns;
    op->deadline_ns += gap_ns;
    op->comm->stop_end_ns = tt_now_ns();
    op->comm->stop_ns = gap_ns;
    op->comm->stop_between_ops = 0;
    TT_INFO("%s seq %llu: this process was not running for %llu ms", fp_coll_name(op->fingerprint),
            (unsigned long long)op->seq, (unsigned long long)(gap_ns / 1000000ull));
}

void tt_op_start(tt_op_t *op, int timeout_ms)
{
    tutti_comm_t *comm = op->comm;
    uint64_t now = tt_now_ns();
    op->deadline_ns = now + (uint64_t)timeout_ms * 1000000ull;
    op->awake_ns = now;
    /* Back in the library long after the last op: stopped, or busy elsewhere. Peers
     * waiting on this rank meanwhile may have timed out: said if one reports that. */
    if (comm->op_end_ns && now > comm->op_end_ns &&
        now - comm->op_end_ns > comm->quick_ns) {
        comm->stop_end_ns = now;
        comm->stop_ns = now - comm->op_end_ns;
        comm->stop_between_ops = 1;
    }
}

void tt_op_finish(tt_op_t *op)
{
    tutti_comm_t *comm = op->comm;
    uint64_t now = tt_now_ns();
    /* stopped after its last wait: the rest completed without one */
    if (op->awake_ns && now > op->awake_ns)
        op_not_running(op, now - op->awake_ns);
    comm->op_end_ns = now;
    if (!op->stall_published)
        return;
    char key[64];
    snprintf(key, sizeof(key), "stall/%d", op->rank);
    tt_op_store_delete(op, key); /* best effort: a chain may otherwise follow it */
    op->stall_published = 0;
}

static int progress_once(tt_op_t *op, tt_req_t *req)
{
    tutti_comm_t *comm = op->comm;
    uint64_t now = tt_now_ns(); /* one reading serves the checks below (a hot path) */
    if (op->awake_ns && now > op->awake_ns)
        op_not_running(op, now - op->awake_ns);
    int ms = tt_ms_left_at(op->deadline_ns, now);
    if (ms == 0)
        return timed_out(op, req);
    /* before the timeout, so that a timed-out rank can read who waits on whom */
    int stall_ms = TT_MIN(comm->opts.stall_check_ms, comm->opts.timeout_ms / 2);
    if (stall_ms > 0) {
        if (!op->stall_next_ns)
            op->stall_next_ns = now + (uint64_t)stall_ms * 1000000ull;
        if (now >= op->stall_next_ns) {
            TT_CHECK(stall_check(op, &req->tp));
            now = tt_now_ns();
            op->stall_next_ns = now + (uint64_t)stall_ms * 500000ull;
            ms = tt_ms_left_at(op->deadline_ns, now);
            if (ms == 0)
                return timed_out(op, req);
        }
        ms = TT_MIN(ms, (int)((op->stall_next_ns - now) / 1000000ull) + 1);
    }
    uint64_t t0 = now;
    int st = comm->tp_ops->progress(comm->tp, ms);
    uint64_t t1 = tt_now_ns();
    if (t1 - t0 > (uint64_t)ms * 1000000ull)
        op_not_running(op, t1 - t0 - (uint64_t)ms * 1000000ull);
    op->awake_ns = t1;
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
        tt_comm_fail_op(comm, op, st, msg);
        return st;
    }
    return TUTTI_OK;
}

int tt_p2p_wait(tt_op_t *op, tt_req_t *req)
{
    while (req->tp.status == 1)
        TT_CHECK(progress_once(op, req));
    if (req->tp.status < 0)
        return req_failed(op, req);
    return TUTTI_OK;
}

int tt_p2p_wait_all(tt_op_t *op, tt_req_t *reqs, size_t n)
{
    size_t first = 0;
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
