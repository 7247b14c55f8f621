/* Failure handling: recording a failure on the communicator and reporting it, the
 * messages of failed requests and timeouts, the store records other ranks read (with
 * the bounded store calls that read and write them), the stall check and the blame
 * chain, and time this process was not running. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "coll/names.h"
#include "core/envelope.h"
#include "core/fault.h"
#include "core/state.h"

/* ---- the store keys other ranks read ---- */

/* failed/<rank>: "<status> <message>", left by a failing rank (tt_fault_record) */
static void failed_key(char *key, size_t len, int rank)
{
    snprintf(key, len, "failed/%d", rank);
}
/* failed_count: how many ranks left one (the stall check reads failed/ only past 0) */
#define FAILED_COUNT_KEY TT_FAILED_COUNT_KEY /* fault.h: the flight recorder reads it too */
/* stall/<rank>: a stall record (stall_rec_t), what a rank blocked in an op waits on */
static void stall_key(char *key, size_t len, int rank)
{
    snprintf(key, len, "stall/%d", rank);
}

/* ---- the store on failure paths ---- */

/* After a failure path's store call failed, the store is left alone this long: the
 * stall checks of every later op that waited over a second each paid the quick deadline
 * (up to 1 s) before, the transport not progressed meanwhile (review: a store host cut
 * off, 1.2 s waits took 2.0 s each). */
#define TT_STORE_RETRY_NS (10ull * 1000000000ull)

static int op_store_ms(tt_op_t *op)
{
    if (!op->store_down && tt_now_ns() < atomic_load(&op->comm->store_retry_ns))
        op->store_down = 1;
    if (op->store_down)
        return 0;
    int ms = (int)(op->comm->quick_ns / 1000000ull);
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
        atomic_store(&op->comm->store_retry_ns, tt_now_ns() + TT_STORE_RETRY_NS);
        TT_INFO("store unreachable on a failure path (%s): no store calls on failure paths for "
                "10 s",
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
    const char *keys[1] = { key };
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

/* ---- a forked child (tt_comm_foreign) ---- */

/* This process's pid, set when the first communicator is made and again in every child
 * forked after (a pthread_atfork child handler): a load per call, not a getpid(). */
atomic_int tt_self_pid;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_child(void)
{
    atomic_store_explicit(&tt_self_pid, (int)getpid(), memory_order_relaxed);
}

static void fork_watch(void)
{
    fork_child();
    pthread_atfork(NULL, NULL, fork_child);
}

pid_t tt_comm_owner_pid(void)
{
    pthread_once(&fork_once, fork_watch);
    return (pid_t)atomic_load_explicit(&tt_self_pid, memory_order_relaxed);
}

int tt_comm_foreign(const tutti_comm_t *comm)
{
    return tt_comm_foreign_inline(comm);
}

/* The last refusal on this thread, and its communicator. */
static __thread const tutti_comm_t *foreign_comm;
static __thread char foreign_msg[TT_ERRMSG_LEN];

static void foreign_text(const tutti_comm_t *comm, const char *what, char *buf, size_t len)
{
    snprintf(buf, len,
             "rank %d: %s%scommunicator made by pid %d used in pid %d, a forked child: a child "
             "makes its own communicator (this one is the parent's: refused, untouched)",
             comm->rank, what ? what : "", what ? ": " : "", (int)comm->owner_pid, (int)getpid());
}

int tt_comm_refuse_foreign(const tutti_comm_t *comm, const char *what, int quiet)
{
    foreign_text(comm, what, foreign_msg, sizeof(foreign_msg));
    foreign_comm = comm;
    if (quiet)
        TT_INFO("%s", foreign_msg);
    else
        TT_WARN("%s", foreign_msg);
    return TUTTI_ERR_INVALID_ARG;
}

const char *tt_comm_foreign_error(const tutti_comm_t *comm)
{
    static __thread char generic[TT_ERRMSG_LEN];
    if (foreign_comm == comm)
        return foreign_msg;
    foreign_text(comm, NULL, generic, sizeof(generic));
    return generic;
}

/* ---- recording a failure ---- */

int tt_comm_set_error(tutti_comm_t *comm, int status, const char *fmt, ...)
{
    va_list ap;
    char msg[TT_ERRMSG_LEN];
    int n = snprintf(msg, sizeof(msg), "rank %d: ", comm->rank);
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
    va_end(ap);
    if (tt_comm_foreign(comm)) { /* (the entry points refuse before: never, but no lock) */
        TT_INFO("%s", msg);
        return status;
    }
    pthread_mutex_lock(&comm->err_lock);
    memcpy(comm->last_error, msg, sizeof(msg));
    pthread_mutex_unlock(&comm->err_lock);
    TT_INFO("%s", msg);
    return status;
}

/* A thread's copies of last_error handed out by tutti_comm_last_error: tutti_comm_abort
 * and tutti_comm_revoke, which any thread may call, rewrite last_error (under err_lock),
 * and a caller reading the communicator's own buffer then raced with them (TSan: a rank
 * printing its failure while its other thread aborted). Several, so that a caller may
 * hold a few at once (two communicators' in one printf). */
#define TT_ERROR_COPIES 4

const char *tt_comm_error_copy(const tutti_comm_t *comm)
{
    static __thread char copies[TT_ERROR_COPIES][TT_ERRMSG_LEN];
    static __thread unsigned next;
    if (tt_comm_foreign(comm)) /* (err_lock may be held by a thread of the parent's) */
        return tt_comm_foreign_error(comm);
    char *c = copies[next++ % TT_ERROR_COPIES];
    tutti_comm_t *m = (tutti_comm_t *)comm; /* the lock, not the message, changes */
    pthread_mutex_lock(&m->err_lock);
    memcpy(c, comm->last_error, TT_ERRMSG_LEN);
    pthread_mutex_unlock(&m->err_lock);
    return c;
}

const char *tt_failed_error_locked(tutti_comm_t *comm)
{
    if (!comm->failed_error[0])
        memcpy(comm->failed_error, comm->last_error, sizeof(comm->failed_error));
    return comm->failed_error;
}

int tutti_comm_get_async_error(const tutti_comm_t *comm, char *msg, size_t len)
{
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (msg && len)
        msg[0] = '\0';
    if (tt_comm_foreign(comm)) { /* a forked child's copy: the parent's to ask */
        if (msg && len)
            snprintf(msg, len, "%s", tt_comm_foreign_error(comm));
        return TUTTI_ERR_INVALID_ARG;
    }
    int st = atomic_load(&((tutti_comm_t *)comm)->aborted) ? TUTTI_ERR_ABORTED
                                                           : atomic_load(&comm->failed);
    if (st < 0 && msg && len) {
        tutti_comm_t *m = (tutti_comm_t *)comm; /* the lock, not the message, changes */
        pthread_mutex_lock(&m->err_lock);
        snprintf(msg, len, "%s", tt_failed_error_locked(m)); /* (pinned from here on) */
        pthread_mutex_unlock(&m->err_lock);
    }
    return st < 0 ? st : TUTTI_OK;
}

const char *tt_after_rank_prefix(const char *msg, long rank)
{
    char own[32];
    int n = snprintf(own, sizeof(own), "rank %ld: ", rank);
    return msg + (strncmp(msg, own, (size_t)n) ? 0 : n);
}

/* A rank that was stopped (SIGSTOP, a debugger) is likely the one its peers timed out
 * on: say so, whatever failure it then found. A stop that ended a while before this op
 * (the ops in between completed: peers had sent everything before giving up) counts
 * while its peers could still be timing out on it; time spent outside the library only
 * where a peer's timeout is the failure. */
static void describe_stopped(const tt_op_t *op, const char *msg, char *out, size_t outlen)
{
    tutti_comm_t *comm = op->comm;
    char me[3][48];
    uint64_t now = tt_now_ns(), since = now - comm->stop_end_ns;
    int recent = comm->stop_end_ns && since < 2 * (uint64_t)tt_comm_timeout_ms(comm) * 1000000ull;
    /* a peer's timeout on this very rank (tt_fault_timed_out's words) */
    snprintf(me[0], sizeof(me[0]), "receiving from rank %d (", comm->rank);
    snprintf(me[1], sizeof(me[1]), "sending to rank %d (", comm->rank);
    snprintf(me[2], sizeof(me[2]), "rank %d shows no sign", comm->rank);
    int blamed = strstr(msg, "not done within") &&
                 (strstr(msg, me[0]) || strstr(msg, me[1]) || strstr(msg, me[2]));
    out[0] = '\0';
    if (op->stopped_ns)
        snprintf(out, outlen,
                 "this rank was not running for at least %llu ms during this op (stopped or "
                 "starved: its peers may have timed out waiting for it), then: ",
                 (unsigned long long)(op->stopped_ns / 1000000ull));
    else if (recent && (!comm->stop_between_ops || blamed))
        snprintf(out, outlen,
                 "this rank was not running%s for at least %llu ms until %llu ms before this "
                 "failure (its peers may have timed out waiting for it), then: ",
                 comm->stop_between_ops ? ", or busy outside the library," : "",
                 (unsigned long long)(comm->stop_ns / 1000000ull),
                 (unsigned long long)(since / 1000000ull));
}

void tt_fault_record(tt_op_t *op, int status, const char *msg)
{
    tutti_comm_t *comm = op->comm;
    const char *algo = tt_algo_name(op->algo_id);
    char stopped[224];
    describe_stopped(op, msg, stopped, sizeof(stopped));
    if (op->coll == TT_COLL_P2P && op->p2p_probe) /* no number, no data: its peer and tag
                                                      are in msg */
        tt_comm_set_error(comm, status, "%s: %s: %s%s", op->p2p_name, tutti_strerror(status),
                          stopped, msg);
    else if (op->coll == TT_COLL_P2P) /* seq: its peer and tag's message number */
        tt_comm_set_error(comm, status, "%s seq %llu (%zu x %s): %s: %s%s",
                          op->p2p_name ? op->p2p_name : "point-to-point",
                          (unsigned long long)op->seq, op->count, tutti_dtype_name(op->dtype),
                          tutti_strerror(status), stopped, msg);
    else
        tt_comm_set_error(comm, status, "%s%s seq %llu (%s, %zu x %s): %s: %s%s",
                          tt_coll_name(op->coll) ? tt_coll_name(op->coll) : "?",
                          op->fingerprint & TT_FP_V ? "v" : "", (unsigned long long)op->seq,
                          algo ? algo : "-", op->count, tutti_dtype_name(op->dtype),
                          tutti_strerror(status), stopped, msg);
    char now[TT_ERRMSG_LEN]; /* last_error as set here (another thread may set it too) */
    pthread_mutex_lock(&comm->err_lock);
    memcpy(now, comm->last_error, sizeof(now));
    pthread_mutex_unlock(&comm->err_lock);
    TT_WARN("%s", now);
    int expected = 0;
    if (atomic_compare_exchange_strong(&comm->failed, &expected, status)) {
        pthread_mutex_lock(&comm->err_lock);
        memcpy(comm->failed_error, now, sizeof(now));
        pthread_mutex_unlock(&comm->err_lock);
        /* Tell the peers, so that ranks waiting on us fail now instead of at the
         * timeout. Each rank reports only its first failure, so a report travels on
         * (a rank that fails because of it reports in turn) and then stops. Not after
         * this rank's own abort (its transport is closed; the store says it), but a
         * failure caused by a peer's abort goes on like any other. */
        if (comm->tp && !atomic_load(&comm->aborted))
            comm->tp_ops->notify_error(comm->tp, status, now);
        /* Also in the store: a rank that exits right after this may cut a message in
         * half, and its peers then see only its socket close; they look here to name
         * the first cause instead of this rank (best effort, and bounded: the store's
         * host may be the rank that died). */
        char key[64], val[TT_ERRMSG_LEN + 16];
        failed_key(key, sizeof(key), comm->rank);
        int len = snprintf(val, sizeof(val), "%d %s", status, now); /* peer_failure */
        int64_t nfailed;
        if (tt_op_store_set(op, key, val, (size_t)TT_MIN(len, (int)sizeof(val) - 1) + 1) == 0)
            tt_op_store_add(op, FAILED_COUNT_KEY, 1, &nfailed);
    }
    /* this rank revoked the communicator: the op that the revoke stopped tells the peers */
    tt_fault_tell_revoke(comm);
}

/* failed/<rank> = "<status> <last_error>" and failed_count + 1 through s (peer_failure
 * reads them) */
static int record_to_store(tutti_comm_t *comm, tutti_store_t *s, int status)
{
    char key[64], val[TT_ERRMSG_LEN + 16];
    failed_key(key, sizeof(key), comm->rank);
    pthread_mutex_lock(&comm->err_lock);
    int len = snprintf(val, sizeof(val), "%d %s", status, comm->last_error);
    pthread_mutex_unlock(&comm->err_lock);
    int64_t nfailed;
    int st = tutti_store_set(s, key, val, (size_t)TT_MIN(len, (int)sizeof(val) - 1) + 1);
    return st < 0 ? st : tutti_store_add(s, FAILED_COUNT_KEY, 1, &nfailed);
}

void tt_fault_record_revoke(tutti_comm_t *comm)
{
    tutti_store_t *s = NULL;
    int st = tutti_store_open_prefixed(&s, comm->store, "");
    if (st == TUTTI_OK) {
        tutti_store_set_timeout(s, (int)(comm->quick_ns / 1000000ull));
        st = record_to_store(comm, s, TUTTI_ERR_REVOKED);
    }
    if (st < 0)
        TT_WARN("rank %d: revoke: the store did not take the record (%s): the peers learn of "
                "it only from this rank's closed links",
                comm->rank, s ? tutti_store_last_error(s) : tutti_strerror(st));
    if (s)
        tutti_store_close(s);
}

void tt_fault_tell_revoke(tutti_comm_t *comm)
{
    if (!atomic_load(&comm->revoke_untold) || !atomic_exchange(&comm->revoke_untold, 0) ||
        !comm->tp)
        return;
    char msg[TT_ERRMSG_LEN];
    pthread_mutex_lock(&comm->err_lock);
    memcpy(msg, comm->last_error, sizeof(msg));
    pthread_mutex_unlock(&comm->err_lock);
    /* the transport is aborted (its blocked calls end), which notify_error does not mind */
    comm->tp_ops->notify_error(comm->tp, TUTTI_ERR_REVOKED, msg);
}

void tt_fault_fail_op(tt_op_t *op, int status, const char *msg)
{
    tt_fault_record(op, status, msg);
    if (op->comm->tp) /* (a communicator of one rank has none: its sends to itself) */
        op->comm->tp_ops->cancel_all(op->comm->tp, status);
}

/* ---- what other ranks left: failed/<rank> ---- */

/* "<status> <message>" under key, as failed/<rank> and init_failed/<rank> hold: 1 and
 * the message (malloc'ed) and status where it is there, else 0. */
static int read_status_key(tt_op_t *op, const char *key, char **msg_p, int *status_p)
{
    int exists = 0;
    if (tt_op_store_check(op, key, &exists) < 0 || !exists)
        return 0;
    void *v = NULL;
    size_t vlen = 0;
    if (tt_op_store_get(op, key, &v, &vlen) < 0)
        return 0;
    char *end;
    long st = strtol((const char *)v, &end, 10);
    if (!vlen || ((char *)v)[vlen - 1] != '\0' || end == (char *)v || *end != ' ' || st >= 0 ||
        st < -1000) {
        free(v);
        return 0;
    }
    memmove(v, end + 1, strlen(end + 1) + 1);
    *msg_p = v;
    *status_p = (int)st;
    return 1;
}

/* A rank that failed left "<status> <message>" under failed/<rank> (tt_fault_record). 1
 * and the message (malloc'ed) and status if rank `peer` did, else 0. */
static int peer_failure(tt_op_t *op, int peer, char **msg_p, int *status_p)
{
    char key[64];
    failed_key(key, sizeof(key), peer);
    return peer >= 0 && read_status_key(op, key, msg_p, status_p);
}

/* A rank whose set-up failed after it connected (its progress thread, a split's
 * communicator) closes its connections at once; it left "<status> <message>" under
 * init_failed/<rank> first (tt_job_init_failed; "<status> ^<message>" where it failed
 * because another rank had). 1 and that reason (malloc'ed), else 0. */
static int peer_init_failure(tt_op_t *op, int peer, char **msg_p)
{
    char key[64];
    int st;
    snprintf(key, sizeof(key), "init_failed/%d", peer);
    if (peer < 0 || !read_status_key(op, key, msg_p, &st))
        return 0;
    char *m = *msg_p;
    const char *why = m[0] == '^' ? m + 1 : tt_after_rank_prefix(m, peer);
    memmove(m, why, strlen(why) + 1);
    return 1;
}

/* A peer that closed on us may have failed first and said why in the store. Not asked
 * when the peer's own report is the failure (the built-in transports say "failed and
 * reported"): the report carries the cause, and a store whose host died would cost
 * every rank on the report's way a store deadline. The status to fail with: the peer's
 * own where it failed first (as its report would have said: a peer gone before this
 * rank first called it, under TUTTI_TCP_CONNECT=lazy, sends none; TUTTI_ERR_REVOKED
 * where it revoked the communicator), else status. A peer's abort is its own business:
 * here a failed peer, TUTTI_ERR_PEER, as the stall check reads it (callers take
 * TUTTI_ERR_ABORTED for "this rank asked for it", and a rank failed with it would not
 * pass the failure on to its peers). A peer whose set-up failed after this rank's
 * ended (init_failed/<peer>) is named with its reason; the status stays status, since
 * this rank's communicator never had that peer. */
static int add_peer_report(tt_op_t *op, int peer, char *msg, size_t len, int status)
{
    char *why;
    int st;
    if (strstr(msg, "failed and reported"))
        return status;
    size_t n = strlen(msg);
    if (peer_failure(op, peer, &why, &st)) {
        snprintf(msg + n, len - n, "; rank %d had failed first: %s", peer, why);
        free(why);
        status = st == TUTTI_ERR_ABORTED ? TUTTI_ERR_PEER : st;
    } else if (!op->store_down && peer_init_failure(op, peer, &why)) {
        snprintf(msg + n, len - n, "; rank %d had failed its set-up: %s", peer, why);
        free(why);
    } else if (op->store_down) {
        snprintf(msg + n, len - n,
                 "; whether rank %d failed first is unknown: the store is "
                 "unreachable too (%s)",
                 peer, tutti_store_last_error(op->comm->qstore));
    }
    return status;
}

/* ---- failed requests ---- */

static const char *peer_addr(tutti_comm_t *comm, int peer)
{
    if (peer == comm->rank) /* a message to itself (exec.c's self_match) */
        return "itself";
    const char *a = comm->tp_ops->peer_address ? comm->tp_ops->peer_address(comm->tp, peer) : NULL;
    return a ? a : "?";
}

static const char *req_what(const tutti_tp_req_v2_t *req)
{
    return req->kind == TUTTI_TP_SEND ? "sending to" : "receiving from";
}

/* A mismatch names both envelopes; anything else, the transport's explanation. */
static void describe_req(tt_op_t *op, const tutti_tp_req_v2_t *req, int st, char *msg, size_t len)
{
    tutti_comm_t *comm = op->comm;
    if (st == TUTTI_ERR_MISMATCH && req->got_env[1] != 0) {
        char mine[256], theirs[256];
        tt_describe_env(req->env, req->len, op, 1, mine, sizeof(mine));
        tt_describe_env(req->got_env, req->got_len, op, 0, theirs, sizeof(theirs));
        int k = snprintf(msg, len, "rank %d expected %s from rank %d (%s), but rank %d sent %s",
                         op->rank, mine, req->peer, peer_addr(comm, req->peer), req->peer, theirs);
        /* a message of an earlier call (a root this rank did not take, a batch of
         * confirms still waiting): what this rank called at that seq */
        const uint64_t s = req->got_env[0], *was = comm->recent[s % TT_RECENT_CALLS];
        /* (point-to-point messages count their own seq, per pair) */
        if (s != req->env[0] && was[0] == s && was[1] && k > 0 && (size_t)k < len &&
            tt_fp_coll(req->got_env[1]) != TT_COLL_P2P && tt_fp_coll(req->env[1]) != TT_COLL_P2P) {
            char then[256];
            tt_describe_env(was, (size_t)-1, op, 0, then, sizeof(then));
            char *cut = strstr(then, " seq "); /* the call, not one of its messages */
            if (cut)
                *cut = '\0';
            snprintf(msg + k, len - (size_t)k, ", where this rank's seq %llu was %s",
                     (unsigned long long)s, then);
        }
        return;
    }
    pthread_mutex_lock(&comm->err_lock);
    snprintf(msg, len, "%s rank %d (%s): %s", req_what(req), req->peer, peer_addr(comm, req->peer),
             comm->tp_error[0] ? comm->tp_error : tutti_strerror(st));
    pthread_mutex_unlock(&comm->err_lock);
}

int tt_fault_req(tt_op_t *op, const tutti_tp_req_v2_t *req)
{
    int st = req->status;
    char msg[TT_ERRMSG_LEN];
    describe_req(op, req, st, msg, sizeof(msg));
    if (st == TUTTI_ERR_PEER)
        st = add_peer_report(op, req->peer, msg, sizeof(msg), st);
    tt_fault_fail_op(op, st, msg);
    return st;
}

/* A point-to-point request failed on its own (a dead peer, a mismatch, its deadline):
 * the streams with peers are in an unknown state, so the communicator fails like after
 * a failed collective. */
void tt_fault_p2p(tt_op_t *op, const tutti_tp_req_v2_t *req, int st, char *err, size_t errlen)
{
    tutti_comm_t *comm = op->comm;
    char msg[TT_ERRMSG_LEN];
    if (st == TUTTI_ERR_TIMEOUT)
        snprintf(msg, sizeof(msg),
                 "not done within %d ms %s rank %d (%s), tag %u: %zu of %zu bytes", op->timeout_ms,
                 req_what(req), req->peer, peer_addr(comm, req->peer), tt_env_tag(req->env),
                 req->xfer, req->len);
    else
        describe_req(op, req, st, msg, sizeof(msg));
    tt_fault_fail_op(op, st, msg);
    pthread_mutex_lock(&comm->err_lock);
    snprintf(err, errlen, "%s", comm->last_error);
    pthread_mutex_unlock(&comm->err_lock);
}

/* A failure the transport reported since the op started (a link to a peer failed, or a
 * peer reported its failure): fail the op with it. */
int tt_fault_transport(tt_op_t *op)
{
    tutti_comm_t *comm = op->comm;
    char msg[TT_ERRMSG_LEN];
    int st = comm->tp_error_status;
    pthread_mutex_lock(&comm->err_lock);
    snprintf(msg, sizeof(msg), "%s", comm->tp_error);
    int peer = comm->tp_error_peer;
    pthread_mutex_unlock(&comm->err_lock);
    if (st == TUTTI_ERR_PEER)
        st = add_peer_report(op, peer, msg, sizeof(msg), st);
    tt_fault_fail_op(op, st, msg);
    return st;
}

int tt_fault_progress(tt_op_t *op, int st)
{
    tutti_comm_t *comm = op->comm;
    char msg[TT_ERRMSG_LEN];
    /* a revoke closes the transport as an abort does */
    if (st == TUTTI_ERR_ABORTED && atomic_load(&comm->revoked) && !atomic_load(&comm->aborted))
        st = TUTTI_ERR_REVOKED;
    pthread_mutex_lock(&comm->err_lock);
    snprintf(msg, sizeof(msg), "%s",
             st == TUTTI_ERR_ABORTED   ? "aborted while waiting"
             : st == TUTTI_ERR_REVOKED ? "this rank revoked the communicator while waiting"
                                       : comm->tp_error);
    pthread_mutex_unlock(&comm->err_lock);
    tt_fault_fail_op(op, st, msg);
    return st;
}

/* ---- stall records: stall/<rank> ---- */

/* A stall record: "<seq> <fingerprint> <env count> <peer> <kind> <algorithm id>", what a
 * rank blocked in an op waits on (stall_publish writes it, tt_op_finish removes it). */
typedef struct stall_rec {
    unsigned long long seq, fp, count;
    int next, kind;
    unsigned algo;
} stall_rec_t;

static int stall_read(tt_op_t *op, int rank, stall_rec_t *rec)
{
    char key[64];
    stall_key(key, sizeof(key), rank);
    int exists = 0;
    void *v = NULL;
    size_t len = 0;
    if (tt_op_store_check(op, key, &exists) < 0 || !exists ||
        tt_op_store_get(op, key, &v, &len) < 0)
        return 0;
    int ok = sscanf((const char *)v, "%llu %llx %llu %d %d %u", &rec->seq, &rec->fp, &rec->count,
                    &rec->next, &rec->kind, &rec->algo) == 6 &&
             rec->next >= 0 && rec->next < op->nranks;
    free(v);
    return ok;
}

/* 0, or the store failed (the timeout still bounds the wait). Again when the request
 * waited on changed: timed-out ranks follow these. */
static int stall_publish(tt_op_t *op, const tutti_tp_req_v2_t *req)
{
    char key[64], val[160];
    if (op->stall_published && op->stall_peer == req->peer && op->stall_kind == req->kind)
        return 0;
    stall_key(key, sizeof(key), op->rank);
    snprintf(val, sizeof(val), "%llu %llx %llu %d %d %u", (unsigned long long)op->seq,
             (unsigned long long)op->fingerprint, (unsigned long long)op->env_count, req->peer,
             req->kind, op->algo_id);
    if (tt_op_store_set(op, key, val, strlen(val) + 1) < 0)
        return -1;
    op->stall_published = 1;
    op->stall_peer = req->peer;
    op->stall_kind = req->kind;
    return 0;
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
            BLAME("%swhether rank %d waits on another is unknown: the store is unreachable", sep,
                  cur);
            break;
        }
        if (have && rec.seq > seq && rec.next != cur) {
            /* it finished the op awaited without what it was awaited for: its call was
             * another (a broadcast whose ranks named different roots, checked later:
             * found by review), or that message is still on its way */
            BLAME("%srank %d is past %s seq %llu, in %s seq %llu: it finished it without what "
                  "is awaited from it (a mismatched call, such as another root, or a message "
                  "still on its way)",
                  sep, cur, tt_fp_coll_name(fp), seq, tt_fp_coll_name(rec.fp), rec.seq);
            break;
        }
        if (!have || rec.seq > seq || rec.next == cur) {
            if (seq == op->seq)
                BLAME("%srank %d shows no sign of being in this collective (hung, dead, not "
                      "calling it, or cut off from the store)",
                      sep, cur);
            else
                BLAME("%srank %d shows no sign of being in %s seq %llu (hung, dead, not "
                      "calling it, or cut off from the store)",
                      sep, cur, tt_fp_coll_name(fp), seq);
            break;
        }
        const char *what = rec.kind ? "to receive from" : "to send to";
        if (rec.next == op->rank) {
            if (rec.seq != op->seq)
                BLAME("%srank %d, still in %s seq %llu, waits %s this rank", sep, cur,
                      tt_fp_coll_name(rec.fp), rec.seq, what);
            else if (op->stopped_ns)
                BLAME("%srank %d waits %s this rank, which was not running for %llu ms", sep, cur,
                      what, (unsigned long long)(op->stopped_ns / 1000000ull));
            else
                /* both in this op, each on the other: their link is stalled or slow (a
                 * blocked pair's record holds its first pending request: never a
                 * deadlock within one collective; found by review, a 10 mbit link) */
                BLAME("%srank %d waits %s this rank: the link between them is slow or "
                      "stalled",
                      sep, cur, what);
            break;
        }
        if (rec.seq == seq)
            BLAME("%srank %d itself waits %s rank %d", sep, cur, what, rec.next);
        else
            BLAME("%srank %d is still in %s seq %llu, waiting %s rank %d", sep, cur,
                  tt_fp_coll_name(rec.fp), rec.seq, what, rec.next);
        seq = rec.seq;
        fp = rec.fp;
        cur = rec.next;
    }
#undef BLAME
}

int tt_fault_timed_out(tt_op_t *op, tutti_tp_req_v2_t *req)
{
    tutti_comm_t *comm = op->comm;
    char msg[TT_ERRMSG_LEN];
    /* Ranks waiting on each other time out at about the same moment; a short grace lets
     * the report of the rank that waits on the real culprit arrive, so that every rank
     * names the hung one rather than its neighbour. */
    int grace_ms = TT_MIN(200, op->timeout_ms / 10);
    uint64_t grace_end = tt_deadline_ns(grace_ms);
    while (tt_now_ns() < grace_end && req->status == 1) {
        comm->tp_ops->progress(comm->tp, TT_MAX(1, tt_ms_left(grace_end)));
        if (atomic_load(&comm->tp_error_gen) != op->tp_error_gen)
            return tt_fault_transport(op);
    }
    char chain[512] = "", moved[64] = "";
    if (comm->opts.stall_check_ms > 0)
        blame_chain(op, req->peer, chain, sizeof(chain));
    if (req->xfer < req->len)
        snprintf(moved, sizeof(moved), ": %zu of %zu bytes moved", req->xfer, req->len);
    /* the op's deadline is its start plus the timeout, whatever moved meanwhile (as Gloo's
     * and torch's timeouts are): "not done within", and the bytes moved, say so */
    snprintf(msg, sizeof(msg), "not done within %d ms %s rank %d (%s)%s%s%s%s", op->timeout_ms,
             req_what(req), req->peer, peer_addr(comm, req->peer), moved,
             chain[0] ? " (" : " (peer hung, slow, or not calling this collective", chain, ")");
    tt_fault_fail_op(op, TUTTI_ERR_TIMEOUT, msg);
    return TUTTI_ERR_TIMEOUT;
}

/* Rank p left failed/<p> (tt_fault_record): fail op with its status, as its report would
 * have carried (a mismatch stays one; its abort is its own business: here, a failed
 * peer), saying what op waited on (`waiting`). The status, or TUTTI_OK when p left none. */
static int fail_if_peer_failed(tt_op_t *op, int p, const char *waiting)
{
    char *why;
    int fst;
    if (!peer_failure(op, p, &why, &fst))
        return TUTTI_OK;
    if (fst == TUTTI_ERR_ABORTED)
        fst = TUTTI_ERR_PEER;
    char msg[TT_ERRMSG_LEN];
    snprintf(msg, sizeof(msg), "%s, but rank %d had failed (found by the stall check): %s", waiting,
             p, why);
    free(why);
    tt_fault_fail_op(op, fst, msg);
    return fst;
}

/* Stall inspection: a rank blocked in one op for stall_check_ms publishes its op
 * (sequence number, fingerprint, count, whom it waits on) under stall/<rank> and
 * compares it with what the other ranks published. Two ranks at the same sequence
 * number in different ops is a mismatch that exchanged no message to reveal it (say,
 * both waiting to receive from each other). Costs nothing while ops make progress; all
 * best effort, through the failure paths' bounded store calls. */
int tt_fault_stall_check(tt_op_t *op, const tutti_tp_req_v2_t *req)
{
    tutti_comm_t *comm = op->comm;
    if (stall_publish(op, req) < 0)
        return TUTTI_OK;
    /* A rank that failed left its reason under failed/<rank> and counted itself in
     * failed_count (tt_fault_record). Its report reaches only the peers it was talking
     * to (transports read idle links only when a request uses them), and the
     * communicator is lost anyway: a rank blocked on a third, hung rank fails now with
     * the first cause, not at its own timeout. One counter read unless some rank failed. */
    int64_t nfailed = 0;
    if (tt_op_store_add(op, FAILED_COUNT_KEY, 0, &nfailed) < 0)
        return TUTTI_OK;
    char waiting[32];
    snprintf(waiting, sizeof(waiting), "waiting on rank %d", req->peer);
    for (int p = 0; p < op->nranks && !op->store_down; p++) {
        if (p == op->rank)
            continue;
        int fst = nfailed > 0 ? fail_if_peer_failed(op, p, waiting) : TUTTI_OK;
        if (fst < 0)
            return fst;
        stall_rec_t rec;
        if (!stall_read(op, p, &rec) || rec.seq != op->seq ||
            (rec.fp == op->fingerprint && rec.count == op->env_count))
            continue;
        uint64_t mine[4], theirs[4];
        tt_env_encode(mine, op->seq, op->fingerprint, op->env_count, op->algo_id, 0);
        tt_env_encode(theirs, rec.seq, rec.fp, rec.count, rec.algo, 0);
        char a[256], b[256], msg[TT_ERRMSG_LEN];
        tt_describe_env(mine, (size_t)-1, op, 1, a, sizeof(a));
        tt_describe_env(theirs, (size_t)-1, op, 0, b, sizeof(b));
        snprintf(msg, sizeof(msg),
                 "rank %d is in %s, but rank %d is in %s (found by the stall check: both "
                 "were blocked for over %d ms)",
                 op->rank, a, p, b, comm->opts.stall_check_ms);
        tt_fault_fail_op(op, TUTTI_ERR_MISMATCH, msg);
        return TUTTI_ERR_MISMATCH;
    }
    /* No peer failed and none is in another call: an earlier rooted call's agreement
     * message may have failed on a link this op waits on (a scatter whose ranks
     * disagreed about the root, then a barrier whose first receive from that peer is
     * queued behind the failed one): that call's mismatch, now rather than at the
     * timeout (agree.c; seen with the tree barrier, whose receives are posted before it
     * reads any link) */
    return TT_STALL_NOTHING; /* the caller looks at them: tt_agree_failed (agree_ring.c) */
}

/* The point-to-point side of the stall check (exec.c, for work in flight while no
 * collective runs): only the look for failed ranks. No stall record: a send's or a
 * receive's seq counts its pair's messages, not the collectives', so comparing it with
 * other ranks' records would find mismatches that are none. */
int tt_fault_p2p_stall_check(tt_op_t *op, const char *waiting)
{
    int64_t nfailed = 0;
    if (tt_op_store_add(op, FAILED_COUNT_KEY, 0, &nfailed) < 0 || nfailed <= 0)
        return TUTTI_OK;
    for (int p = 0; p < op->nranks && !op->store_down; p++) {
        if (p == op->rank)
            continue;
        int fst = fail_if_peer_failed(op, p, waiting);
        if (fst < 0)
            return fst;
    }
    return TUTTI_OK;
}

/* ---- time not running ---- */

/* A wait that ended far later than it asked, or a long gap between waits: this process
 * was not running (SIGSTOP, a debugger, a starved machine). Its peers are not to blame
 * for that time: the deadline moves by it, so a resumed rank hears what its peers did
 * meanwhile (their reports, or their failures in the store) instead of timing out at
 * once, and a whole job stopped and resumed carries on. The op's error says it. */
void tt_fault_stopped(tt_op_t *op, uint64_t gap_ns)
{
    op->stopped_ns += gap_ns;
    op->deadline_ns += gap_ns;
    op->comm->stop_end_ns = tt_now_ns();
    op->comm->stop_ns = gap_ns;
    op->comm->stop_between_ops = 0;
    TT_INFO("%s seq %llu: this process was not running for %llu ms",
            tt_fp_coll_name(op->fingerprint), (unsigned long long)op->seq,
            (unsigned long long)(gap_ns / 1000000ull));
}

void tt_op_start(tt_op_t *op, int timeout_ms)
{
    tutti_comm_t *comm = op->comm;
    uint64_t now = tt_coarse_ns(); /* every op reads it: the cheap clock (base.h) */
    op->deadline_ns = now + (uint64_t)timeout_ms * 1000000ull;
    op->awake_ns = now;
    op->waited = 0;
    /* Back in the library long after the last op: stopped, or busy elsewhere. Peers
     * waiting on this rank meanwhile may have timed out: said if one reports that. */
    if (comm->op_end_ns && now > comm->op_end_ns && now - comm->op_end_ns > comm->quick_ns) {
        comm->stop_end_ns = now;
        comm->stop_ns = now - comm->op_end_ns;
        comm->stop_between_ops = 1;
    }
}

void tt_op_finish(tt_op_t *op)
{
    tutti_comm_t *comm = op->comm;
    /* read at every op, also one whose waits all ended at their first look (p2p.c):
     * a stop in it is this op's */
    uint64_t now = tt_coarse_ns();
    /* stopped after its last wait: the rest completed without one */
    if (op->awake_ns && now > op->awake_ns && now - op->awake_ns > comm->quick_ns)
        tt_fault_stopped(op, now - op->awake_ns);
    comm->op_end_ns = now;
    if (!op->stall_published)
        return;
    char key[64];
    stall_key(key, sizeof(key), op->rank);
    tt_op_store_delete(op, key); /* best effort: a chain may otherwise follow it */
    op->stall_published = 0;
}
