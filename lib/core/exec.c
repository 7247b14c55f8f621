/* The executor: operations run one at a time, in issue order. Whoever finds the queue
 * idle runs the next op itself (the caller of a blocking op, or a thread waiting on a
 * work handle), so a blocking collective never pays for a thread handoff; the progress
 * thread runs async ops nobody waits for. A deferred async op is queued without waking
 * the progress thread (a wake-up alone cost 20-30 us on a 2-core VM: the woken thread
 * preempts the issuer): its issuer is about to wait and runs it itself. An op is
 * deferred when its thread says so (tt_exec_defer: the fuser's last bucket) or on a
 * guess: the last async op was waited for within a quarter of the deferral of its issue
 * (a framework's blocking call made of issue + wait, like torch's dist.all_reduce). A
 * guessed deferral that nobody waited for, or that another async op queued behind,
 * turns the guess off (DDP's buckets, which only their futures wait for, are issued
 * undeferred again). So that a deferred op makes progress anyway, a communicator that
 * has deferred once keeps its progress thread ticking (TT_DEFER_TICK_MS) while idle: a
 * deferred op nobody started within opts.defer_us is run then. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "reduce/reduce.h"
#include "coll/coll.h"
#include "coll/packed.h"
#include "core/agree.h"
#include "core/comm.h"
#include "core/opts.h"
#include "core/trace.h"
#include "plugin/tpmux.h"
#include "device/device.h"

/* How often an idle progress thread looks for deferred ops. */
#define TT_DEFER_TICK_MS 10

void tt_exec_comm_unref(tutti_comm_t *comm)
{
    if (atomic_fetch_sub(&comm->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&comm->err_lock);
    pthread_mutex_destroy(&comm->q_lock);
    pthread_cond_destroy(&comm->q_cv);
    pthread_cond_destroy(&comm->done_cv);
    free(comm);
}

static void work_unref(tutti_work_t *w)
{
    if (atomic_fetch_sub(&w->refs, 1) == 1) {
        tutti_comm_t *comm = w->comm;
        free(w->layout);
        free(w);
        tt_exec_comm_unref(comm);
    }
}

/* TUTTI_BIND: while this host's ranks outnumber its CPUs, an op of TT_BIND_MIN_BYTES or
 * more, of a collective whose desc->hold allows it, runs with its thread held on
 * comm->bind_cpu (tpmux.c chose it), so that the ranks stay spread over the CPUs, and
 * the thread's own mask is given back after. On 4 ranks over 2 CPUs (docs/benchmarks.md,
 * "The thirty-first session"), unheld, the scheduler moved the ranks at wake-ups (3 or
 * 4 on one CPU for a while): a tcp allreduce of 256 KiB took 0.61x the time held, an
 * allgather of 1 MiB 0.63x. Small ops are left alone: the two calls and the move cost
 * them 2-4 us of their 5-30. Returns 1 when it held. */
static int bind_enter(tutti_comm_t *comm, size_t bytes, cpu_set_t *saved)
{
    if (comm->bind_cpu < 0 || bytes < TT_BIND_MIN_BYTES ||
        sched_getaffinity(0, sizeof(*saved), saved) != 0 || !CPU_ISSET(comm->bind_cpu, saved) ||
        CPU_COUNT(saved) < 2)
        return 0;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(comm->bind_cpu, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0)
        return 0;
    atomic_fetch_add(&comm->bound_ops, 1);
    return 1;
}

/* Run one op on the calling thread (the caller holds `executing`). */
static int run_op_here(tutti_comm_t *comm, tt_op_t *op, tutti_redop_t user_redop, char *err,
                       size_t errlen)
{
    int st;
    err[0] = '\0';
    if (atomic_load(&comm->aborted)) {
        snprintf(err, errlen, "rank %d: %s seq %llu: communicator aborted", comm->rank,
                 tt_coll_name(op->coll), (unsigned long long)op->seq);
        return TUTTI_ERR_ABORTED;
    }
    st = atomic_load(&comm->failed);
    if (st < 0) {
        tt_fault_tell_revoke(comm); /* a revoke made while nobody ran an op */
        pthread_mutex_lock(&comm->err_lock);
        /* (no seq of the failure: a revoke's is the next one issued, a send's or a
         * receive's counts its pair's messages; the first failure's message names its
         * op and seq) */
        snprintf(err, errlen, "rank %d: %s seq %llu not started: the communicator had failed: %s",
                 comm->rank, tt_coll_name(op->coll), (unsigned long long)op->seq,
                 tt_failed_error_locked(comm));
        pthread_mutex_unlock(&comm->err_lock);
        return st;
    }
    size_t bytes = op->count * op->elem_size;
    const tt_coll_desc_t *desc = op->desc;
    if (comm->nranks == 1)
        return desc->local(op);
    /* Nothing to move is still a call to check: a rank that passed count 0 where the
     * others passed more must fail with them. Its fingerprint goes round in a barrier
     * (under this op's envelope), which a mismatched peer's messages cannot satisfy. */
    const int empty = op->count == 0 && desc->empty_barrier;
    /* Every rank must pick the same algorithm: select on the envelope's count, the same
     * on every rank by construction (0 for barrier and gatherv/scatterv/alltoallv, whose
     * own sizes differ). */
    size_t sel_bytes = (size_t)op->env_count * op->elem_size;
    int cacheable = (int)op->coll > TT_COLL_NONE && op->coll < TT_COLL_COUNT_;
    const tt_algo_t *algo = NULL;
    if (empty)
        algo = tt_algo_find(TT_COLL_BARRIER, "dissemination");
    else if (cacheable && comm->sel_cache[op->coll].bytes == sel_bytes)
        algo = comm->sel_cache[op->coll].algo;
    if (!algo) {
        algo = tt_algo_select(comm->algo_ovr, &comm->cost, op->coll, sel_bytes, comm->nranks,
                              comm->opts.chunk_bytes);
        if (cacheable) {
            comm->sel_cache[op->coll].bytes = sel_bytes;
            comm->sel_cache[op->coll].algo = algo;
        }
    }
    /* an op that does not commute keeps rank order: the linear algorithms reduce x0, x1,
     * ... in turn (allreduce and reduce_scatter through rank 0, reduce at the root),
     * whatever the model or an override picked (scan's algorithms all keep it); coll.c
     * marked it in the fingerprint, which every rank of the call must share, so every
     * rank picks the same */
    if (algo && !empty && (op->fingerprint & TT_FP_ORDERED) && !desc->in_order)
        algo = tt_algo_find(op->coll, "linear");
    if (!algo) {
        snprintf(err, errlen, "rank %d: %s seq %llu: no algorithm for this collective", comm->rank,
                 tt_coll_name(op->coll) ? tt_coll_name(op->coll) : "?",
                 (unsigned long long)op->seq);
        return TUTTI_ERR_UNSUPPORTED;
    }
    op->chunk_bytes = tt_cost_chunk(sel_bytes, comm->nranks, comm->opts.chunk_bytes);
    op->algo_id = algo->id;
    atomic_store_explicit(&comm->trace_algo, algo->id, memory_order_relaxed);
    tt_op_start(op, op->dev ? tt_dev_timeout_ms(op) : op->timeout_ms);
    op->tp_error_gen = atomic_load(&comm->tp_error_gen);
    TT_TRACE("%s seq %llu: %zu bytes, algorithm %s", tt_coll_name(op->coll),
             (unsigned long long)op->seq, bytes, algo->name);
    tt_env_encode(comm->recent[op->seq % TT_RECENT_CALLS], op->seq, op->fingerprint, op->env_count,
                  op->algo_id, 0);
    /* first, the earlier rooted calls' agreement checks that came in (a poll) */
    int algo_nomem = 0;
    st = comm->agree_count ? tt_agree_settle(op, 0) : TUTTI_OK;
    /* then the batch of confirms or releases, unless this op joins it (agree.c) */
    if (st == TUTTI_OK && comm->confirm.n) {
        int kind = 0;
        if (!empty && desc->post == tt_post_confirm_release)
            kind = TT_BATCH_CONFIRM;
        else if (!empty && desc->post == tt_post_release)
            kind = TT_BATCH_RELEASE;
        st = tt_agree_flush(op, kind);
    }
    /* fp16 and fp8 AVG: each rank's input scaled by 2^-k first (2^k >= the rank count), the sum
     * by 2^k / nranks after it (coll.c's AVG step, from op->avg_scale), so that a mean
     * that fits fp16 does not overflow on the way: four ranks' 30000 summed first gave
     * inf (session 97, found by review). NCCL's ncclAvg scales by 1/nranks first; a power
     * of two keeps the partial sums, and so the result, those of the plain sum and
     * division wherever both fit and the scaled inputs stay above the dtype's least
     * normal value (2^-14 fp16, 2^-6 E4M3, 2^-14 E5M2): below it they lose bits to the
     * subnormal range, down to 0 (E4M3 at 8 ranks: inputs below 2^-3; at 1024 ranks 1.0
     * itself), as NCCL's scaled inputs do (session 102, found by review). */
    const void *user_send = op->sendbuf;
    void *scaled = NULL;
    if (st == TUTTI_OK && !empty && user_redop == TUTTI_AVG && tt_dtype_avg_prescaled(op->dtype) &&
        (op->coll == TT_COLL_ALLREDUCE || op->coll == TT_COLL_REDUCE ||
         op->coll == TT_COLL_REDUCE_SCATTER || op->coll == TT_COLL_SCAN ||
         op->coll == TT_COLL_EXSCAN)) {
        /* a copy where the input must stay: out of place, and reduce_scatter always (in
         * place, the other blocks' input is left as it was: NCCL's in place puts recvbuf
         * at this rank's block of sendbuf, which at rank 0 is sendbuf itself), and exscan
         * (rank 0's buffer is not written; scan and exscan overflowed to inf where the
         * mean fits until session 100, found by review) */
        if ((op->sendbuf != op->recvbuf || op->coll == TT_COLL_REDUCE_SCATTER ||
             op->coll == TT_COLL_EXSCAN) &&
            bytes) {
            scaled = malloc(bytes);
            if (!scaled) {
                snprintf(err, errlen, "rank %d: %s seq %llu: out of memory for the scaled input",
                         comm->rank, tt_coll_name(op->coll), (unsigned long long)op->seq);
                tt_fault_fail_op(op, TUTTI_ERR_NOMEM, err);
                tt_op_finish(op);
                return TUTTI_ERR_NOMEM;
            }
            memcpy(scaled, op->sendbuf, bytes);
            op->sendbuf = scaled; /* run as out of place from the copy */
        }
        op->avg_scale = 1.0f;
        while (op->avg_scale < (float)op->nranks)
            op->avg_scale *= 2.0f;
        tt_reduce_scale(scaled ? scaled : op->recvbuf, op->count, op->dtype, 1.0f / op->avg_scale,
                        1.0f);
    }
    const int failed_before = atomic_load(&comm->failed) != 0;
    if (st == TUTTI_OK) {
        op->tp_hints |= algo->tp_hints; /* the algorithm's own requests only */
        cpu_set_t saved;
        const int held = desc->hold && bind_enter(comm, bytes, &saved);
        st = algo->run(op);
        if (held)
            sched_setaffinity(0, sizeof(saved), &saved);
        algo_nomem = st == TUTTI_ERR_NOMEM;
    }
    if (scaled) {
        op->sendbuf = user_send;
        free(scaled);
    }
    if (st == TUTTI_OK && !empty && desc->post)
        st = desc->post(op);
    if (algo_nomem && !failed_before && !atomic_load(&comm->failed)) {
        /* the algorithm's own scratch: nothing recorded it. Fail the communicator as any
         * failure does, so that the peers, which wait on this rank's part, hear of it
         * now (a report, the store's record) rather than at their timeout; a NOMEM the
         * p2p layer or the transport met was recorded, and described, there (below). */
        char why[160];
        snprintf(why, sizeof(why), "out of memory for the algorithm's buffers (%zu bytes)", bytes);
        tt_fault_fail_op(op, TUTTI_ERR_NOMEM, why);
    }
    if (st < 0) {
        /* The p2p layer described the failure in last_error already. */
        pthread_mutex_lock(&comm->err_lock);
        snprintf(err, errlen, "%s", comm->last_error);
        pthread_mutex_unlock(&comm->err_lock);
        return st;
    }
    tt_op_finish(op);
    if (user_redop == TUTTI_AVG && desc->avg)
        desc->avg(op); /* undoes avg_scale too */
    return TUTTI_OK;
}

static void last_error_to(tutti_comm_t *comm, char *err, size_t errlen)
{
    pthread_mutex_lock(&comm->err_lock);
    snprintf(err, errlen, "%s", comm->last_error);
    pthread_mutex_unlock(&comm->err_lock);
}

/* A device buffer's copy in failed as op started: this rank cannot take part, so the op
 * fails as a rank's failure does, told to the peers (which would otherwise wait for its
 * messages, or pair them with its next call's). */
static int dev_in_failed(tutti_comm_t *comm, tt_op_t *op, const char *name, int st, const char *why,
                         char *err, size_t errlen)
{
    if (comm->nranks > 1) { /* both callers refused an aborted or failed communicator */
        tt_op_start(op, op->timeout_ms);
        tt_fault_fail_op(op, st, why);
        tt_op_finish(op);
        last_error_to(comm, err, errlen);
    } else {
        snprintf(err, errlen, "rank %d: %s seq %llu: %s", comm->rank, name,
                 (unsigned long long)op->seq, why);
    }
    return st;
}

/* The op's stagings ended with status st: its device result copied back
 * (lib/device/device.h), a derived type's unpacked (lib/coll/packed.h). */
static int stage_end(tt_op_t *op, int st, char *err, size_t errlen)
{
    if (op->dev)
        st = tt_dev_finish(op, st, err, errlen);
    return op->packed ? tt_packed_finish(op, st) : st;
}

/* run_op_here between the copy in and the copy back of device buffers
 * (lib/device/device.h), and before a derived type's unpacking */
static int run_op(tutti_comm_t *comm, tt_op_t *op, tutti_redop_t user_redop, char *err,
                  size_t errlen)
{
    if (!op->dev) { /* (a derived type's packed copies are host memory: never both) */
        int st = run_op_here(comm, op, user_redop, err, errlen);
        return __builtin_expect(op->packed != NULL, 0) ? tt_packed_finish(op, st) : st;
    }
    char why[TT_ERRMSG_LEN / 2];
    /* an aborted or failed communicator's op fails as such (run_op_here says so) without
     * reading the device */
    const int doomed = atomic_load(&comm->aborted) || atomic_load(&comm->failed) < 0;
    int st = doomed ? TUTTI_OK : tt_dev_copy_in(op, why, sizeof(why));
    if (st < 0)
        st = dev_in_failed(comm, op, tt_coll_name(op->coll), st, why, err, errlen);
    else
        st = run_op_here(comm, op, user_redop, err, errlen);
    return stage_end(op, st, err, errlen);
}

/* Is w a receive without its number yet (any source, still looking; or late)? Read
 * under q_lock: the library writes these fields under it (never the transport, which
 * writes a posted request's kind and status without it: such receives are unposted). */
static int unnumbered(const tutti_work_t *w)
{
    return w->is_p2p && !w->probe && ((w->any_source && w->req.peer < 0) || w->late_seq);
}

static void complete(tutti_comm_t *comm, tutti_work_t *w, int st, const char *err)
{
    char derr[TT_ERRMSG_LEN];
    if (unnumbered(w)) { /* (failed before its number: q_lock held, as at every completion) */
        comm->unnumbered--;
        w->late_seq = 0;
    }
    if (w->op.dev || w->op.packed) { /* a receive's copy back, or an op that never ran */
        snprintf(derr, sizeof(derr), "%s", st < 0 && err ? err : "");
        int dst = stage_end(&w->op, st, derr, sizeof(derr));
        if (dst != st)
            st = dst, err = derr;
    }
    if (w->op.op_held) { /* the defined op it was issued with (coll.c) */
        tt_userop_release(w->op.redop);
        w->op.op_held = 0;
    }
    w->status = st;
    tt_trace_end(comm, &w->op, w->is_p2p ? w->req.peer : -1, st);
    if (st < 0)
        snprintf(w->err, sizeof(w->err), "%s", err);
    /* the callback first: a work seen done (tutti_test, tutti_wait) has had it run, so
     * its owner may free what the callback uses (a binding's callback object: Python's
     * freed one was called, found by review). Not here, under q_lock: a callback that
     * takes a lock its issuing thread holds while it issues (the hand-off tutti.h
     * advises) deadlocked with it (review). It runs once q_lock is let go, still under
     * `executing` (run_callbacks_locked), which marks w done after it; the list's
     * reference keeps w for it. */
    if (atomic_fetch_or(&w->cb_state, 2) & 1) {
        atomic_fetch_add(&w->refs, 1);
        w->cb_next = NULL;
        if (comm->cb_tail)
            comm->cb_tail->cb_next = w;
        else
            comm->cb_head = w;
        comm->cb_tail = w;
        return;
    }
    atomic_store_explicit(&w->done, 1, memory_order_release);
}

/* The communicator whose tutti_work_on_done callback this thread runs (NULL: none):
 * calls into it from the callback are refused (tt_exec_in_callback), not deadlocked.
 * Read only while comm->cb_running says a callback of comm runs somewhere: a thread-local
 * of a shared library costs a __tls_get_addr call, which every op paid (~1-2% of a 4-byte
 * allreduce over shm). A thread inside a callback sees its own increment. */
static _Thread_local const tutti_comm_t *cb_comm;

static inline int in_callback(const tutti_comm_t *comm)
{
    return __builtin_expect(atomic_load_explicit(&comm->cb_running, memory_order_relaxed) != 0,
                            0) &&
           cb_comm == comm;
}

int tt_exec_in_callback(const tutti_comm_t *comm)
{
    return comm && in_callback(comm);
}

static void call_cb(tutti_comm_t *comm, void (*fn)(void *arg, int status), void *arg, int st)
{
    const tutti_comm_t *outer = cb_comm; /* a callback of another communicator's op */
    atomic_fetch_add_explicit(&comm->cb_running, 1, memory_order_relaxed);
    cb_comm = comm;
    fn(arg, st);
    cb_comm = outer;
    atomic_fetch_sub_explicit(&comm->cb_running, 1, memory_order_relaxed);
}

/* Run the callbacks complete() listed, without q_lock, and mark their works done (q_lock
 * and `executing` held: the next op waits for them, so works still end in issue order). */
static void run_callbacks(tutti_comm_t *comm)
{
    tutti_work_t *w = comm->cb_head;
    comm->cb_head = comm->cb_tail = NULL;
    pthread_mutex_unlock(&comm->q_lock);
    while (w) {
        tutti_work_t *next = w->cb_next;
        call_cb(comm, w->cb, w->cb_arg, w->status);
        atomic_store_explicit(&w->done, 1, memory_order_release);
        work_unref(w); /* the list's reference */
        w = next;
    }
    pthread_mutex_lock(&comm->q_lock);
    pthread_cond_broadcast(&comm->done_cv);
}

static inline void run_callbacks_locked(tutti_comm_t *comm)
{
    if (__builtin_expect(comm->cb_head != NULL, 0))
        run_callbacks(comm);
}

/* A call refused on this thread: a callback of comm's own calls into it. */
static int cb_refused(tutti_comm_t *comm, const char *what)
{
    return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                             "%s: called from a tutti_work_on_done callback of this "
                             "communicator (a callback must not call into it)",
                             what);
}

int tutti_work_on_done(tutti_work_t *work, void (*fn)(void *arg, int status), void *arg)
{
    if (!work || !fn || (atomic_load(&work->cb_state) & 1))
        return TUTTI_ERR_INVALID_ARG;
    if (tt_comm_foreign(work->comm))
        return tt_comm_refuse_foreign(work->comm, "work_on_done", 0);
    work->cb = fn;
    work->cb_arg = arg;
    if (atomic_fetch_or(&work->cb_state, 1) & 2) /* done already: call it here */
        call_cb(work->comm, fn, arg, work->status);
    return TUTTI_OK;
}

/* ---- point to point: posted in queue order, then in flight ---- */

/* "tag 7", or "any tag" for a TUTTI_ANY_TAG receive or probe that found nothing yet */
static const char *tag_text(const tutti_work_t *w, char buf[24])
{
    if (w->any_tag && tt_env_tag(w->req.env) == TUTTI_ANY_TAG)
        return "any tag";
    snprintf(buf, 24, "tag %u", tt_env_tag(w->req.env));
    return buf;
}

/* "send to rank 3", "recv from rank 1", "recv from any source (tag 7)" */
static const char *p2p_what(const tutti_work_t *w, char *buf, size_t len)
{
    static const char *const probes[2][2] = { { "probe", "iprobe" }, { "mprobe", "improbe" } };
    char tgb[24];
    const char *tg = tag_text(w, tgb);
    if (w->probe && w->req.peer < 0)
        snprintf(buf, len, "%s from any source (%s)", probes[w->matched != 0][w->probe == 2], tg);
    else if (w->probe)
        snprintf(buf, len, "%s from rank %d (%s)", probes[w->matched != 0][w->probe == 2],
                 w->req.peer, tg);
    else if (w->upto && w->req.peer < 0 && w->seek_p1)
        snprintf(buf, len, "recv of up to %zu x %s from rank %d (%s)",
                 w->upto_cap / w->op.elem_size, tutti_dtype_name(w->op.dtype), w->seek_p1 - 1, tg);
    else if (w->upto && w->req.peer < 0)
        snprintf(buf, len, "recv of up to %zu x %s from any source (%s)",
                 w->upto_cap / w->op.elem_size, tutti_dtype_name(w->op.dtype), tg);
    else if (w->any_source && w->req.peer < 0 && w->seek_p1)
        snprintf(buf, len, "recv from rank %d (%s)", w->seek_p1 - 1, tg);
    else if (w->any_source && w->req.peer < 0)
        snprintf(buf, len, "recv from any source (%s)", tg);
    else if (w->matched) /* an mprobe's, taking the message it found */
        snprintf(buf, len, "%s's recv from rank %d", w->matched == 2 ? "improbe" : "mprobe",
                 w->req.peer);
    else
        snprintf(buf, len, "%s rank %d", w->req.kind == TUTTI_TP_SEND ? "send to" : "recv from",
                 w->req.peer);
    return buf;
}

/* Hand w's request to the transport (the caller holds `executing`). 0: in flight. */
static int p2p_post_req(tutti_comm_t *comm, tutti_work_t *w, char *err, size_t errlen)
{
    char what[112];
    int st = w->req.kind == TUTTI_TP_SEND ? comm->tp_ops->post_send(comm->tp, &w->req)
                                          : comm->tp_ops->post_recv(comm->tp, &w->req);
    if (st < 0) {
        pthread_mutex_lock(&comm->err_lock);
        snprintf(err, errlen, "rank %d: %s: %s", comm->rank, p2p_what(w, what, sizeof(what)),
                 comm->tp_error[0] ? comm->tp_error : tutti_strerror(st));
        pthread_mutex_unlock(&comm->err_lock);
    }
    return st;
}

/* w cannot start: the communicator was aborted or failed (TUTTI_OK if neither). */
static int p2p_refused(tutti_comm_t *comm, const tutti_work_t *w, const char *how, char *err,
                       size_t errlen)
{
    char what[112];
    int st;
    if (atomic_load(&comm->aborted)) {
        snprintf(err, errlen, "rank %d: %s: communicator aborted", comm->rank,
                 p2p_what(w, what, sizeof(what)));
        return TUTTI_ERR_ABORTED;
    }
    if ((st = atomic_load(&comm->failed)) < 0) {
        pthread_mutex_lock(&comm->err_lock);
        snprintf(err, errlen, "rank %d: %s %s: the communicator had failed: %s", comm->rank,
                 p2p_what(w, what, sizeof(what)), how, tt_failed_error_locked(comm));
        pthread_mutex_unlock(&comm->err_lock);
        return st;
    }
    return TUTTI_OK;
}

/* Can comm's transport look for arrived messages (TUTTI_ANY_SOURCE, tutti_probe)? (A
 * communicator of one loads its transport too, and asks the same.) */
static int can_probe(const tutti_comm_t *comm)
{
    return tutti_tp_ops_has(comm->tp_ops, probe) && comm->tp_ops->probe;
}

/* ...and for a message of any tag (TUTTI_ANY_TAG): every transport in use says its probe
 * takes no key (transport_v2.h TUTTI_TP_PROBE_ANY). */
static int can_probe_for(const tutti_comm_t *comm, const tutti_work_t *w)
{
    if (!can_probe(comm))
        return 0;
    if (!w->any_tag)
        return 1;
    const tutti_tp_props_v2_t *props[16];
    int n = tt_transports_props(comm, props, 16);
    for (int i = 0; i < n; i++)
        if (!(props[i]->flags & TUTTI_TP_PROBE_ANY))
            return 0;
    return n > 0;
}

static int any_unsupported(tutti_comm_t *comm, const tutti_work_t *w, char *err, size_t errlen)
{
    char what[112];
    snprintf(err, errlen, "rank %d: %s: transport %s cannot look for arrived messages%s; %s",
             comm->rank, p2p_what(w, what, sizeof(what)), comm->tp_name,
             can_probe(comm) ? " of any tag (TUTTI_TP_PROBE_ANY)" : " (it has no probe)",
             w->any_tag ? "receive with a named tag"
             : w->upto  ? "receive with the message's own count (tutti_recv)"
                        : "receive from a named rank");
    return TUTTI_ERR_UNSUPPORTED;
}

/* ---- sequence numbers per (peer, tag) ----
 * Receives match by tag (a transport's channel keys: kit/chan.h), so each tag of a
 * pair counts its own messages: the n-th send of tag t to a peer meets the peer's n-th
 * receive of tag t from this rank, whatever other tags came between (the envelope's
 * check, and the flight record's pairing: tools/tutti-trace). Every (peer, tag) used
 * keeps its 24 bytes (48 with the table's slack) until the destroy: a program whose tags
 * count steps grows it (~27 MB at 400,000 tags, measured by review). */
typedef struct tt_p2p_seq {
    uint64_t key; /* peer << 32 | tag, plus 1 (0: a free slot) */
    uint64_t sent, received;
} tt_p2p_seq_t;

/* key's slot in table t of cap (a power of two) entries: its own, or the free one it
 * would take (linear probing). */
static tt_p2p_seq_t *p2p_slot(tt_p2p_seq_t *t, size_t cap, uint64_t key)
{
    size_t i = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & (cap - 1);
    while (t[i].key && t[i].key != key)
        i = (i + 1) & (cap - 1);
    return &t[i];
}

/* (peer, tag)'s numbers; NULL when out of memory, or (add 0) when none were taken yet.
 * Under q_lock. */
static tt_p2p_seq_t *p2p_seq(tutti_comm_t *comm, int peer, uint32_t tag, int add)
{
    uint64_t key = (((uint64_t)(uint32_t)peer << 32) | tag) + 1;
    tt_p2p_seq_t *e = comm->p2p_seq_cap ? p2p_slot(comm->p2p_seq, comm->p2p_seq_cap, key) : NULL;
    if ((e && e->key) || !add)
        return e && e->key ? e : NULL;
    if ((comm->p2p_seq_n + 1) * 2 > comm->p2p_seq_cap) { /* half full at most */
        size_t cap = comm->p2p_seq_cap ? comm->p2p_seq_cap * 2 : 64;
        tt_p2p_seq_t *t = calloc(cap, sizeof(*t));
        if (!t)
            return NULL;
        for (size_t i = 0; i < comm->p2p_seq_cap; i++)
            if (comm->p2p_seq[i].key)
                *p2p_slot(t, cap, comm->p2p_seq[i].key) = comm->p2p_seq[i];
        free(comm->p2p_seq);
        comm->p2p_seq = t;
        comm->p2p_seq_cap = cap;
        e = p2p_slot(t, cap, key);
    }
    e->key = key;
    comm->p2p_seq_n++;
    return e;
}

/* The receives from peer of tag issued so far (the next one's number). */
static uint64_t p2p_received(tutti_comm_t *comm, int peer, uint32_t tag)
{
    const tt_p2p_seq_t *e = p2p_seq(comm, peer, tag, 0);
    return e ? e->received : 0;
}

/* ---- messages to this rank: copied at the send's turn, matched in the library ----
 * NCCL and MPI take a send to oneself (a torch batch_isend_irecv all-to-all posts one);
 * no transport serves it. A send completes at its turn with its data copied (as
 * MPI_Bsend: a blocking send before its receive does not wait for it); receives take
 * the copies in order, checked as a peer's message is (count, dtype, tag: a mismatch
 * fails the communicator, naming both). Under `executing`. */
typedef struct tt_self_msg {
    struct tt_self_msg *next;
    uint64_t env[4];
    size_t len;
    unsigned char data[];
} tt_self_msg_t;

void tt_exec_self_free(tutti_comm_t *comm)
{
    while (comm->self_q) {
        tt_self_msg_t *m = comm->self_q;
        comm->self_q = m->next;
        free(m);
    }
    comm->self_q_tail = NULL;
}

static int self_send(tutti_comm_t *comm, tutti_work_t *w, char *err, size_t errlen)
{
    tt_self_msg_t *m = malloc(sizeof(*m) + w->req.len);
    if (!m) {
        snprintf(err, errlen,
                 "rank %d: send to rank %d (itself): out of memory for a copy of %zu bytes",
                 comm->rank, comm->rank, w->req.len);
        return TUTTI_ERR_NOMEM;
    }
    m->next = NULL;
    memcpy(m->env, w->req.env, sizeof(m->env));
    m->len = w->req.len;
    if (m->len)
        memcpy(m->data, w->req.buf, m->len);
    if (comm->self_q_tail)
        comm->self_q_tail->next = m;
    else
        comm->self_q = m;
    comm->self_q_tail = m;
    w->req.xfer = w->req.len;
    w->req.status = 0;
    return TUTTI_OK;
}

static int is_self_recv(const tutti_comm_t *comm, const tutti_work_t *w)
{
    return w->req.kind == TUTTI_TP_RECV && w->req.peer == comm->rank && !w->probe;
}

/* The first copy whose env[3] (tag) is key; *prev_p its predecessor (NULL: the head). */
static tt_self_msg_t *self_find(const tutti_comm_t *comm, uint64_t key, tt_self_msg_t **prev_p)
{
    tt_self_msg_t *m = comm->self_q, *prev = NULL;
    while (m && m->env[3] != key) {
        prev = m;
        m = m->next;
    }
    *prev_p = prev;
    return m;
}

/* Give the copies to the receives from this rank that wait, in posting order, each
 * the first copy of its tag. */
static void self_match(tutti_comm_t *comm)
{
    for (tutti_work_t *w = comm->inflight; w && comm->self_q; w = w->inflight_next) {
        if (!is_self_recv(comm, w) || w->req.status != 1 || w->late_seq)
            continue;
        tt_self_msg_t *prev, *m = self_find(comm, w->req.env[3], &prev);
        if (!m)
            continue;
        if (prev)
            prev->next = m->next;
        else
            comm->self_q = m->next;
        if (comm->self_q_tail == m)
            comm->self_q_tail = prev;
        memcpy(w->req.got_env, m->env, sizeof(m->env));
        w->req.got_len = m->len;
        if (m->len != w->req.len || memcmp(m->env, w->req.env, sizeof(m->env))) {
            w->req.status = TUTTI_ERR_MISMATCH;
        } else {
            if (m->len)
                memcpy(w->req.buf, m->data, m->len);
            w->req.xfer = m->len;
            w->req.status = 0;
        }
        free(m);
    }
}

/* Post w's request (the caller holds `executing`). 0: in flight; else an error. A
 * receive from any source is in flight unposted: any_step looks for its message. */
static int p2p_post(tutti_comm_t *comm, tutti_work_t *w, char *err, size_t errlen)
{
    int st = p2p_refused(comm, w, "not started", err, errlen);
    if (st < 0)
        return st;
    if (w->op.dev) { /* a send's device buffer: its copy in, now that its turn came */
        char why[TT_ERRMSG_LEN / 2];
        if ((st = tt_dev_copy_in(&w->op, why, sizeof(why))) < 0)
            return dev_in_failed(comm, &w->op, w->req.kind == TUTTI_TP_SEND ? "send" : "recv", st,
                                 why, err, errlen);
    }
    w->req.status = 1;
    w->p2p_posted_ns = tt_now_ns();
    w->p2p_deadline_ns = tt_deadline_ns(w->op.timeout_ms);
    /* what bounds the store calls of its failure paths and stall checks (fault.c) */
    w->op.deadline_ns = w->p2p_deadline_ns;
    if (w->probe) { /* in flight unposted: probe_step looks */
        if (!can_probe_for(comm, w))
            return any_unsupported(comm, w, err, errlen);
        /* an iprobe looks once, right after this: a slice of progress first, so that one
         * polled in a loop, with nothing else in flight, moves the links along (a header
         * behind a message being read aside, a lazy link to accept: found by review) */
        if (w->probe == 2 && comm->tp) {
            int pst = comm->tp_ops->progress(comm->tp, 0);
            if (pst < 0)
                comm->tp_ops->cancel_all(comm->tp, pst);
        }
        return TUTTI_OK;
    }
    if (w->any_source)
        return can_probe_for(comm, w) ? TUTTI_OK : any_unsupported(comm, w, err, errlen);
    if (w->late_seq) /* in flight unposted: late_step numbers and posts it */
        return TUTTI_OK;
    if (w->req.peer == comm->rank) /* a receive waits in flight for self_match */
        return w->req.kind == TUTTI_TP_SEND ? self_send(comm, w, err, errlen) : TUTTI_OK;
    return p2p_post_req(comm, w, err, errlen);
}

/* ---- receives from any source or of any tag: which receive a message goes to ----
 * A message goes to the earliest receive issued that can take it. A receive from a named
 * rank of a named tag takes its number at issue unless an earlier receive that could take
 * the same message has none yet (then it is late: late_step); receives from any source,
 * of any tag (TUTTI_ANY_TAG) or of up to a count look (any_step) and take their number
 * with the message they find. A look passes over a message that an earlier receive
 * without its number could take (claimed_earlier): that one comes first, and takes it in
 * its own step. */

/* Where receive e, without its number, looks: its rank (-1: any). */
static int e_peer(const tutti_work_t *e)
{
    return e->any_source ? e->seek_p1 - 1 : e->req.peer;
}

/* Could receive e, which has no number yet, take peer's next message of tag (peer < 0:
 * any rank's)? */
static int unnumbered_for(const tutti_work_t *e, int peer, uint32_t tag)
{
    int epeer = e_peer(e);
    return unnumbered(e) && (epeer < 0 || peer < 0 || epeer == peer) &&
           (e->any_tag || tt_env_tag(e->req.env) == tag);
}

/* Is the message of tag from peer one that a receive issued before w (in flight, so ahead
 * of it there), still without its number, could take? */
static int claimed_earlier(const tutti_comm_t *comm, const tutti_work_t *w, int peer, uint32_t tag)
{
    if (comm->unnumbered < (unnumbered(w) ? 2 : 1))
        return 0;
    for (const tutti_work_t *e = comm->inflight; e && e != w; e = e->inflight_next)
        if (unnumbered_for(e, peer, tag))
            return 1;
    return 0;
}

/* Might w take the message m that arrived from peer? It must be point to point, carry
 * w's tag (any, for TUTTI_ANY_TAG), and stand where no receive issued for peer stands
 * (those took their sequence numbers at issue): else it belongs to another receive,
 * posted or to come; nor may an earlier receive without its number want it. Its count
 * and dtype are the receive's own check: a message with w's tag and another size is w's
 * mismatch, as with a named sender. */
static int any_matches(const tutti_comm_t *comm, const tutti_work_t *w, int peer,
                       const tutti_tp_probe_t *m)
{
    uint32_t tag = tt_env_tag(m->env);
    return tt_fp_coll(m->env[1]) == TT_COLL_P2P && tt_env_algo(m->env) == 0 &&
           (w->any_tag || tag == tt_env_tag(w->req.env)) &&
           m->env[0] == p2p_received((tutti_comm_t *)comm, peer, tag) &&
           !claimed_earlier(comm, w, peer, tag);
}

/* Has w's tag's next message from peer arrived (not taken)? The transport's probe, or for
 * this rank the first copy of a send to itself with the tag: 1 with *m filled, 0 no, < 0
 * the link to peer failed (or TUTTI_ERR_UNSUPPORTED: no probe). Of any tag: the first
 * message that no posted receive takes (key 0: transport_v2.h TUTTI_TP_PROBE_ANY), or the
 * first copy that no earlier receive could take. */
static int look_at(tutti_comm_t *comm, const tutti_work_t *w, int peer, tutti_tp_probe_t *m)
{
    /* the key looked for */
    *m = (tutti_tp_probe_t){ .env = { 0, 0, 0, w->any_tag ? 0 : w->req.env[3] } };
    if (peer != comm->rank)
        return comm->tp_ops->probe(comm->tp, peer, m);
    tt_self_msg_t *prev, *s = NULL;
    if (!w->any_tag)
        s = self_find(comm, w->req.env[3], &prev);
    else
        for (s = comm->self_q; s && claimed_earlier(comm, w, peer, tt_env_tag(s->env));)
            s = s->next;
    if (!s)
        return 0;
    memcpy(m->env, s->env, sizeof(m->env));
    m->len = s->len;
    return 1;
}

/* Look for w's next message (any_matches) at its peer, or (any) at every rank from
 * any_next on: 1 with *peer_p and *m filled; 0 none came, *dead_p of the links looked at
 * failed (the last one's status in *dead_st_p); TUTTI_ERR_UNSUPPORTED: no probe. */
static int find_message(tutti_comm_t *comm, const tutti_work_t *w, int any, int *peer_p,
                        tutti_tp_probe_t *m, int *dead_p, int *dead_st_p)
{
    int n = comm->nranks, looks = any ? n : 1;
    *dead_p = *dead_st_p = 0;
    for (int k = 0; k < looks; k++) {
        int peer = any ? (comm->any_next + k) % n : w->req.peer >= 0 ? w->req.peer : w->seek_p1 - 1;
        int st = look_at(comm, w, peer, m);
        if (st == TUTTI_ERR_UNSUPPORTED)
            return st;
        if (st < 0) {
            (*dead_p)++;
            *dead_st_p = st;
        }
        if (st > 0 && any_matches(comm, w, peer, m)) {
            *peer_p = peer;
            return 1;
        }
    }
    return 0;
}

/* Look for w's message at every peer, starting after the last peer that had one (round
 * robin, so that a busy rank cannot starve the others), and post w's receive to the
 * first that has it. 1: w is posted (or still looking); < 0: it failed (err says why).
 * A peer whose link failed (it exited, say) is passed over while others are left. */
static int upto_fit(tutti_comm_t *comm, tutti_work_t *w, int peer, const tutti_tp_probe_t *m,
                    char *err, size_t errlen)
{
    tutti_dtype_t md = (tutti_dtype_t)((m->env[1] >> 48) & 0xff);
    if ((w->op.dtype == TUTTI_UINT8 || md == w->op.dtype) && m->len <= w->upto_cap) {
        /* its envelope and length, so that the transport takes it; the count as the
         * receive counts it (bytes for u8) */
        w->req.env[1] = m->env[1];
        w->req.env[2] = m->env[2];
        w->req.len = m->len;
        w->op.count = w->op.env_count = m->len / w->op.elem_size;
        w->op.fingerprint = m->env[1];
        return 1;
    }
    char what[96];
    snprintf(err, errlen,
             "rank %d: %s: rank %d's message is %llu x %s (%zu bytes): %s; nothing taken (the "
             "communicator goes on)",
             comm->rank, p2p_what(w, what, sizeof(what)), peer, (unsigned long long)m->env[2],
             tutti_dtype_name(md), m->len,
             md != w->op.dtype && w->op.dtype != TUTTI_UINT8
                 ? "another dtype (a receive of u8 takes any)"
                 : "more than the receive has room for");
    return TUTTI_ERR_MISMATCH;
}

static int any_search(tutti_comm_t *comm, tutti_work_t *w, char *err, size_t errlen)
{
    int n = comm->nranks, dead, dead_st, peer;
    tutti_tp_probe_t m;
    int st = find_message(comm, w, !w->seek_p1, &peer, &m, &dead, &dead_st);
    if (st == TUTTI_ERR_UNSUPPORTED)
        return any_unsupported(comm, w, err, errlen);
    if (st == 1 && w->upto && (st = upto_fit(comm, w, peer, &m, err, errlen)) < 0)
        return st; /* took nothing: the receive fails alone */
    if (st == 1) {
        tt_p2p_seq_t *sq = p2p_seq(comm, peer, tt_env_tag(m.env), 1);
        if (!sq) {
            snprintf(err, errlen, "rank %d: recv from any source: out of memory", comm->rank);
            return TUTTI_ERR_NOMEM;
        }
        if (!w->seek_p1)
            comm->any_next = (peer + 1) % n;
        w->req.peer = peer;
        comm->unnumbered--;
        w->op.seq = sq->received++;
        w->req.env[0] = w->op.seq;
        w->req.env[3] = m.env[3]; /* (its own tag, or the message's for TUTTI_ANY_TAG) */
        tt_trace_matched(comm, &w->op, peer, tt_env_tag(m.env));
        if (peer == comm->rank) {
            self_match(comm);
            return w->req.status; /* done now (0, or a mismatch), not at the next reap */
        }
        st = p2p_post_req(comm, w, err, errlen);
        /* done in its post (the message was all there: shm's ring, a message read
         * aside): completed in this reap, not after another slice of progress */
        return st < 0 ? st : w->req.status;
    }
    if (dead < (w->seek_p1 ? 1 : n - 1) || n == 1)
        return 1;
    char what[112], msg[TT_ERRMSG_LEN];
    pthread_mutex_lock(&comm->err_lock);
    if (w->seek_p1)
        snprintf(msg, sizeof(msg), "%s: the link to rank %d failed (%s)",
                 p2p_what(w, what, sizeof(what)), w->seek_p1 - 1,
                 comm->tp_error[0] ? comm->tp_error : tutti_strerror(dead_st));
    else
        snprintf(msg, sizeof(msg),
                 "%s: no sender left: the links to all %d other ranks failed (%s)",
                 p2p_what(w, what, sizeof(what)), n - 1,
                 comm->tp_error[0] ? comm->tp_error : tutti_strerror(dead_st));
    pthread_mutex_unlock(&comm->err_lock);
    tt_fault_fail_op(&w->op, dead_st, msg);
    last_error_to(comm, err, errlen);
    return dead_st;
}

/* One step of an open any-source receive w (q_lock and `executing` held): fail it with
 * its communicator, look for its message, or time it out (failing the communicator, as
 * an ordinary receive's timeout does). 1: still in flight; < 0: failed, err says why. */
static int any_step(tutti_comm_t *comm, tutti_work_t *w, uint64_t now, int may_search, char *err,
                    size_t errlen)
{
    int st = p2p_refused(comm, w, "not completed", err, errlen);
    if (st < 0)
        return st;
    st = may_search ? any_search(comm, w, err, errlen) : 1;
    if (st < 0 || w->req.peer >= 0 || now <= w->p2p_deadline_ns)
        return st;
    char what[112], tgb[24], msg[TT_ERRMSG_LEN];
    const char *tg = tag_text(w, tgb);
    if (w->seek_p1)
        snprintf(msg, sizeof(msg), "%s: rank %d sent nothing of %s within %d ms",
                 p2p_what(w, what, sizeof(what)), w->seek_p1 - 1, tg, w->op.timeout_ms);
    else
        snprintf(msg, sizeof(msg), "%s: no rank sent %s within %d ms",
                 p2p_what(w, what, sizeof(what)), w->any_tag ? "a message" : tg, w->op.timeout_ms);
    tt_fault_fail_op(&w->op, TUTTI_ERR_TIMEOUT, msg);
    last_error_to(comm, err, errlen);
    return TUTTI_ERR_TIMEOUT;
}

/* ---- named receives behind open any-source ones (MPI's order) ----
 * A message goes to the earliest receive issued that can take it. A receive from rank r
 * takes its sequence number at issue, which gives it r's next message of its tag; but
 * an any-source (or any-tag) receive that could take it, issued before it and still
 * looking, comes first. Such a named receive waits unnumbered and unposted (late_seq)
 * until no earlier receive that could take r's next message of its tag looks any more or
 * waits so, then takes its number. */

/* At issue (q_lock held): must a receive from peer of tag wait for its number? Every
 * receive issued before it is queued, being posted (exec_p2p) or in flight. (An
 * unnumbered receive in flight is unposted, so in flight until a reap under q_lock takes
 * it off the list: its req.status, which a transport may write meanwhile without the
 * lock for posted ones, is not read here.) */
static int late_at_issue(const tutti_comm_t *comm, int peer, uint32_t tag)
{
    if (!comm->unnumbered) /* no receive without its number: none can come first */
        return 0;
    for (const tutti_work_t *e = comm->inflight; e; e = e->inflight_next)
        if (unnumbered_for(e, peer, tag))
            return 1;
    if (comm->exec_p2p && unnumbered_for(comm->exec_p2p, peer, tag))
        return 1;
    for (const tutti_work_t *e = comm->q_head; e; e = e->next)
        if (unnumbered_for(e, peer, tag))
            return 1;
    return 0;
}

/* Must unnumbered receive w (any source or tag, or late; or a probe) wait: is a receive
 * issued before it (in flight, so ahead of it there) still unnumbered that could take
 * every message w could? For a late w, one that would come first for its rank's next
 * message of its tag. For a looking w, one whose ranks and tags hold all of w's: it takes
 * whatever w would first. Where the earlier one could take some of w's messages only (an
 * any-source receive of tag 5 before one from rank 2 of any tag; a recv_upto from rank 2
 * before an any-source one) w looks on and passes over those (claimed_earlier): a
 * message the earlier one cannot take is w's, as MPI's. */
static const tutti_work_t *blocker_of(const tutti_comm_t *comm, const tutti_work_t *w)
{
    if (!comm->unnumbered)
        return NULL;
    int peer = w->req.peer >= 0 ? w->req.peer : w->seek_p1 - 1; /* -1: any */
    uint32_t tag = tt_env_tag(w->req.env);
    for (const tutti_work_t *e = comm->inflight; e && e != w; e = e->inflight_next) {
        if (!unnumbered(e))
            continue;
        int epeer = e_peer(e);
        if ((epeer < 0 || (peer >= 0 && epeer == peer)) &&
            (e->any_tag || (!w->any_tag && tt_env_tag(e->req.env) == tag)))
            return e;
    }
    return NULL;
}

static int blocked_by_earlier(const tutti_comm_t *comm, const tutti_work_t *w)
{
    return blocker_of(comm, w) != NULL;
}

/* w's turn came (blocked_by_earlier no more): its number, then its post (q_lock and
 * `executing` held). 1: in flight; else done or failed (err says why). */
static int late_step(tutti_comm_t *comm, tutti_work_t *w, char *err, size_t errlen)
{
    int st = p2p_refused(comm, w, "not started", err, errlen);
    if (st < 0)
        return st;
    tt_p2p_seq_t *sq = p2p_seq(comm, w->req.peer, tt_env_tag(w->req.env), 1);
    if (!sq) {
        snprintf(err, errlen, "rank %d: recv from rank %d: out of memory", comm->rank, w->req.peer);
        return TUTTI_ERR_NOMEM;
    }
    w->late_seq = 0;
    comm->unnumbered--;
    w->op.seq = sq->received++;
    w->req.env[0] = w->op.seq;
    tt_trace_matched(comm, &w->op, w->req.peer, tt_env_tag(w->req.env));
    if (w->req.peer == comm->rank) {
        self_match(comm);
        return w->req.status;
    }
    st = p2p_post_req(comm, w, err, errlen);
    return st < 0 ? st : 1;
}

/* tutti_mprobe's probe w found message m at peer: it becomes the receive of m (its
 * number taken now, so that no other receive can take m) into a buffer of its own. 1: in
 * flight; 0: done (from this rank itself); < 0: failed before it took anything (err
 * says why: the communicator goes on) or after (posting failed). */
static int probe_take(tutti_comm_t *comm, tutti_work_t *w, int peer, const tutti_tp_probe_t *m,
                      char *err, size_t errlen)
{
    char what[112];
    uint32_t tag = tt_env_tag(m->env); /* (w's own, or the message's for TUTTI_ANY_TAG) */
    tt_p2p_seq_t *sq = p2p_seq(comm, peer, tag, 1);
    /* the message and its data in one block: once taken, nothing can fail but the
     * transfer (the caller's tutti_message_t is this) */
    tutti_message_t *msg = m->len <= SIZE_MAX - sizeof(*msg) ? malloc(sizeof(*msg) + m->len) : NULL;
    if (!sq || !msg) {
        free(msg);
        snprintf(err, errlen, "rank %d: %s: out of memory for the %zu bytes from rank %d",
                 comm->rank, p2p_what(w, what, sizeof(what)), m->len, peer);
        return TUTTI_ERR_NOMEM;
    }
    *msg = (tutti_message_t){ .rank = comm->rank,
                              .source = peer,
                              .tag = tag,
                              .count = (size_t)m->env[2],
                              .dtype = (tutti_dtype_t)w->probe_dtype,
                              .len = m->len };
    if (w->any_source) /* (the next search starts after it, as any_search's) */
        comm->any_next = (peer + 1) % comm->nranks;
    w->probe = 0;
    w->op.p2p_probe = 0; /* a receive now, numbered: its failures say its number */
    w->msg = msg;
    w->req.peer = peer;
    w->req.buf = msg->data;
    w->req.len = m->len;
    memcpy(w->req.env, m->env, sizeof(m->env)); /* any_matches: its number is sq's next */
    w->op.seq = sq->received++;
    w->op.count = w->op.env_count = msg->count;
    w->op.dtype = msg->dtype;
    w->op.elem_size = tutti_dtype_size(w->op.dtype);
    w->op.fingerprint = m->env[1];
    /* a receive from now: its own deadline (the probe's, which may be all but past, would
     * fail the communicator over a message that came in time); later than those of the
     * works posted after the probe, as a rule: then the list is out of deadline order
     * (the next work's is enough to look at: the list was in order, or marked already) */
    w->p2p_posted_ns = tt_now_ns();
    w->p2p_deadline_ns = w->op.deadline_ns = tt_deadline_ns(w->op.timeout_ms);
    if (w->inflight_next && w->inflight_next->p2p_deadline_ns < w->p2p_deadline_ns)
        comm->p2p_unordered = 1;
    if (comm->trace) /* (in the flight record from its take: it is a receive now) */
        tt_trace_issue(comm, &w->op, TUTTI_SUM, 0, peer, tag, tt_coarse_ns(), 1);
    if (peer == comm->rank) {
        self_match(comm);
        return w->req.status;
    }
    int st = p2p_post_req(comm, w, err, errlen);
    return st < 0 ? st : 1;
}

/* One step of probe w (q_lock and `executing` held): unless an earlier receive without
 * its number would take whatever it finds (blocked_by_earlier), look for the message a
 * receive issued now would take (the next of its tag by number: any_matches) at its
 * peer or, from any source, at every rank. 0: done (probe_found says whether it saw one;
 * an iprobe's one look is done either way); 1: still looking; < 0: failed, err says why.
 * Its timeout fails the probe alone: it took nothing, so the communicator goes on. */
static int probe_step(tutti_comm_t *comm, tutti_work_t *w, uint64_t now, char *err, size_t errlen)
{
    int st = p2p_refused(comm, w, "not completed", err, errlen);
    if (st < 0)
        return st;
    char what[112];
    if (!blocked_by_earlier(comm, w)) {
        int any = w->req.peer < 0, dead, dead_st, peer;
        tutti_tp_probe_t m;
        st = find_message(comm, w, any, &peer, &m, &dead, &dead_st);
        if (st == TUTTI_ERR_UNSUPPORTED)
            return any_unsupported(comm, w, err, errlen);
        if (st == 1) {
            w->probe_found = 1;
            w->probe_source = peer;
            w->probe_count = (size_t)m.env[2];
            w->probe_dtype = (int)((m.env[1] >> 48) & 0xff);
            w->probe_tag = tt_env_tag(m.env);
            return w->matched ? probe_take(comm, w, peer, &m, err, errlen) : 0;
        }
        if (dead && dead == (any ? comm->nranks - 1 : 1)) {
            pthread_mutex_lock(&comm->err_lock);
            snprintf(err, errlen, "rank %d: %s: %s failed (%s)", comm->rank,
                     p2p_what(w, what, sizeof(what)),
                     any ? "the links to all other ranks" : "the link to its rank",
                     comm->tp_error[0] ? comm->tp_error : tutti_strerror(dead_st));
            pthread_mutex_unlock(&comm->err_lock);
            return dead_st;
        }
    }
    if (w->probe == 2)
        return 0; /* (probe_found 0) */
    if (now <= w->p2p_deadline_ns)
        return 1;
    snprintf(err, errlen,
             "rank %d: %s: no such message came within %d ms (the probe took nothing: the "
             "communicator goes on)",
             comm->rank, p2p_what(w, what, sizeof(what)), w->op.timeout_ms);
    return TUTTI_ERR_TIMEOUT;
}

/* w, still waiting behind an earlier receive of its tag, reached its deadline: that
 * receive's own timeout (from the same timeout or a longer one, tutti_comm_set_timeout)
 * has not failed it first. */
static int late_timed_out(tutti_comm_t *comm, tutti_work_t *w, char *err, size_t errlen)
{
    int st = p2p_refused(comm, w, "not started", err, errlen);
    if (st < 0)
        return st;
    char what[112], ewhat[112] = "", etag[24], msg[TT_ERRMSG_LEN];
    const tutti_work_t *e = blocker_of(comm, w); /* (its tag is w's where not any) */
    if (e)
        snprintf(ewhat, sizeof(ewhat), " (%s)", p2p_what(e, what, sizeof(what)));
    snprintf(msg, sizeof(msg),
             "%s (tag %u): timed out after %d ms waiting behind an earlier receive of %s still "
             "looking for its message%s, which no message reached (MPI's order: it takes the "
             "first)",
             p2p_what(w, what, sizeof(what)), tt_env_tag(w->req.env), w->op.timeout_ms,
             tag_text(e ? e : w, etag), ewhat);
    tt_fault_fail_op(&w->op, TUTTI_ERR_TIMEOUT, msg);
    last_error_to(comm, err, errlen);
    return TUTTI_ERR_TIMEOUT;
}

/* Complete the in-flight requests the transport finished (q_lock and `executing` held);
 * open any-source receives take a step. */
static void reap_inflight_locked(tutti_comm_t *comm)
{
    int any = 0;
    uint64_t now = comm->inflight ? tt_now_ns() : 0;
    if (comm->self_q)
        self_match(comm);
    for (tutti_work_t *w = comm->inflight; w; w = w->inflight_next) {
        /* deadlines follow posting order unless a request with an earlier deadline than
         * the one before it was posted (a timeout lowered by tutti_comm_set_timeout
         * between their issues): none past from here on (a look at every request each
         * reap made posting n of them cost n^2) */
        if (now <= w->p2p_deadline_ns) {
            if (!comm->p2p_unordered)
                break;
            continue;
        }
        /* (not a late receive: its timeout comes in the loop below, after the earlier
         * receives it waits behind have had theirs, which then name what they waited for) */
        if (w->req.status == 1 && w->req.peer >= 0 && !w->late_seq && !w->probe) {
            char err[TT_ERRMSG_LEN];
            tt_fault_p2p(&w->op, &w->req, TUTTI_ERR_TIMEOUT, err, sizeof(err));
            break; /* cancel_all failed every request: the loop below reaps them */
        }
    }
    /* receives from this rank wait outside the transport: a failed communicator (the
     * timeout above, an abort, another op's failure) fails them here */
    int down = atomic_load(&comm->aborted) ? TUTTI_ERR_ABORTED : atomic_load(&comm->failed);
    for (tutti_work_t *w = comm->inflight; w && down < 0; w = w->inflight_next)
        if ((is_self_recv(comm, w) || w->late_seq) && w->req.status == 1)
            w->req.status = down;
    tutti_work_t **pp = &comm->inflight;
    while (*pp) {
        tutti_work_t *w = *pp;
        char err[TT_ERRMSG_LEN];
        err[0] = '\0';
        int st = w->req.status;
        if (st == 1 && w->probe)
            st = probe_step(comm, w, now, err, sizeof(err));
        else if (st == 1 && w->req.peer < 0)
            st = any_step(comm, w, now, !blocked_by_earlier(comm, w), err, sizeof(err));
        else if (st == 1 && w->late_seq && !blocked_by_earlier(comm, w))
            st = late_step(comm, w, err, sizeof(err));
        else if (st == 1 && w->late_seq && now > w->p2p_deadline_ns)
            st = late_timed_out(comm, w, err, sizeof(err));
        if (st == 1) {
            pp = &w->inflight_next;
            continue;
        }
        *pp = w->inflight_next;
        if (comm->inflight_tail == w) /* its predecessor, or none */
            comm->inflight_tail = pp == &comm->inflight
                                      ? NULL
                                      : (tutti_work_t *)((char *)pp -
                                                         offsetof(tutti_work_t, inflight_next));
        if (st < 0 && !err[0]) {
            if (atomic_load(&comm->failed) == 0)
                tt_fault_p2p(&w->op, &w->req, st, err, sizeof(err));
            else
                last_error_to(comm, err, sizeof(err));
        }
        if (w->op.dev || w->op.packed) {
            /* a receive's copy back to device memory (or unpacking), outside the queue
             * lock (the in-flight list's reference keeps w; the list may change
             * meanwhile) */
            pthread_mutex_unlock(&comm->q_lock);
            st = stage_end(&w->op, st, err, sizeof(err));
            pthread_mutex_lock(&comm->q_lock);
            pp = &comm->inflight;
        }
        w->req.status = st;
        complete(comm, w, st, err);
        work_unref(w); /* the in-flight list's reference */
        any = 1;
    }
    if (!comm->inflight) /* nothing out of order left */
        comm->p2p_unordered = 0;
    if (any)
        pthread_cond_broadcast(&comm->done_cv);
}

/* Is a stall check of the point-to-point work in flight due (q_lock and `executing`
 * held)? Then the work to check: the first one blocked for stall_check_ms (capped at half
 * the timeout, as a collective's). Transports read a link only while a request uses it:
 * a rank whose receive waits on a hung peer would never read the revoke (or a failure
 * report) that another rank sent it, and without this look it failed at its own
 * timeout instead of with the revoke. Again every half period, as a collective's. */
static tutti_work_t *inflight_stall_due(tutti_comm_t *comm)
{
    if (comm->opts.stall_check_ms <= 0 || atomic_load(&comm->failed) || atomic_load(&comm->aborted))
        return NULL;
    uint64_t now = tt_now_ns();
    if (now < comm->p2p_stall_next_ns)
        return NULL;
    for (tutti_work_t *w = comm->inflight; w; w = w->inflight_next) {
        /* (each work's own timeout: tutti_comm_set_timeout may have changed it between) */
        int stall_ms = TT_MIN(comm->opts.stall_check_ms, w->op.timeout_ms / 2);
        uint64_t period = (uint64_t)stall_ms * 1000000ull;
        if (stall_ms > 0 && w->req.status == 1 && !w->op.store_down &&
            now - w->p2p_posted_ns >= period) {
            comm->p2p_stall_next_ns = now + period / 2;
            return w;
        }
    }
    return NULL;
}

/* Move in-flight requests along for up to max_ms (q_lock held, nobody executing). */
static void drive_inflight_locked(tutti_comm_t *comm, int max_ms)
{
    comm->executing = 1;
    /* the in-flight list changes only under `executing`: due stays on it meanwhile */
    tutti_work_t *due = inflight_stall_due(comm);
    char waiting[160]; /* what it waits for, read under q_lock */
    if (due && due->req.peer >= 0)
        snprintf(waiting, sizeof(waiting), "%s rank %d (tag %u)",
                 due->req.kind == TUTTI_TP_SEND ? "sending to" : "receiving from", due->req.peer,
                 tt_env_tag(due->req.env));
    else if (due) /* still looking: any source or tag, a recv_upto */
        p2p_what(due, waiting, sizeof(waiting));
    pthread_mutex_unlock(&comm->q_lock);
    int st = 0;
    if (comm->tp)
        st = comm->tp_ops->progress(comm->tp, max_ms);
    else /* one rank: its receives from itself wait for its own sends, queued meanwhile */
        nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
    /* a failed rank found fails the communicator and cancels every request: the reap
     * below completes them with its message */
    if (st >= 0 && due && due->req.status == 1)
        tt_fault_p2p_stall_check(&due->op, waiting);
    pthread_mutex_lock(&comm->q_lock);
    if (st < 0)
        comm->tp_ops->cancel_all(comm->tp, st);
    reap_inflight_locked(comm);
    run_callbacks_locked(comm);
    comm->executing = 0;
    pthread_cond_broadcast(&comm->done_cv);
    if (comm->q_head || comm->stopping)
        pthread_cond_signal(&comm->q_cv);
}

/* Pop and run the queue's head; called and returns with q_lock held. */
static void run_head_locked(tutti_comm_t *comm)
{
    tutti_work_t *w = comm->q_head;
    comm->q_head = w->next;
    if (!comm->q_head)
        comm->q_tail = NULL;
    comm->executing = 1;
    if (w->is_p2p) /* (late_at_issue looks at it meanwhile) */
        comm->exec_p2p = w;
    if (comm->trace)
        tt_trace_start(comm, &w->op, tt_coarse_ns());
    pthread_mutex_unlock(&comm->q_lock);

    char err[TT_ERRMSG_LEN];
    int st;
    if (w->is_p2p) {
        st = p2p_post(comm, w, err, sizeof(err));
        pthread_mutex_lock(&comm->q_lock);
        comm->exec_p2p = NULL;
        if (st == TUTTI_OK) {
            /* the queue's reference moves to the in-flight list, at its end (its deadline
             * before its predecessor's: the reap's timeout look goes through them all) */
            w->inflight_next = NULL;
            if (comm->inflight_tail && w->p2p_deadline_ns < comm->inflight_tail->p2p_deadline_ns)
                comm->p2p_unordered = 1;
            if (comm->inflight_tail)
                comm->inflight_tail->inflight_next = w;
            else
                comm->inflight = w;
            comm->inflight_tail = w;
            /* a reap looks at every request in flight: only where this post may have
             * done something for it to finish (done at once: a send to itself, a receive
             * of a message read aside; one to number or match); the others' completions
             * are reaped after the next progress slice, as ever */
            if (w->req.status != 1 || unnumbered(w) || w->probe || is_self_recv(comm, w) ||
                comm->self_q)
                reap_inflight_locked(comm);
            run_callbacks_locked(comm);
            comm->executing = 0;
            pthread_cond_broadcast(&comm->done_cv);
            pthread_cond_signal(&comm->q_cv);
            return;
        }
    } else {
        st = run_op(comm, &w->op, w->user_redop, err, sizeof(err));
        pthread_mutex_lock(&comm->q_lock);
    }
    complete(comm, w, st, err);
    reap_inflight_locked(comm);
    run_callbacks_locked(comm);
    comm->executing = 0;
    pthread_cond_broadcast(&comm->done_cv);
    if (comm->q_head || comm->stopping)
        pthread_cond_signal(&comm->q_cv);
    pthread_mutex_unlock(&comm->q_lock);
    work_unref(w); /* the queue's reference */
    tt_trace_flush(comm);
    pthread_mutex_lock(&comm->q_lock);
}

void *tt_exec_worker_main(void *arg)
{
    tutti_comm_t *comm = arg;
    pthread_mutex_lock(&comm->q_lock);
    for (;;) {
        /* a failure's record (trace.c), once the failed op has ended: its thread set it
         * due while the op still ran */
        if (!comm->executing && atomic_load_explicit(&comm->trace_due, memory_order_relaxed)) {
            pthread_mutex_unlock(&comm->q_lock);
            tt_trace_flush(comm);
            pthread_mutex_lock(&comm->q_lock);
        }
        /* idle: has a peer failed? (trace.c; with a trace_dir) A look due while ops run
         * waits for them to end (they do not wake this thread: it looks again soon). */
        uint64_t watch_ns = 0;
        if (!comm->stopping && tt_trace_watch_due(comm, &watch_ns)) {
            if (!comm->q_head && !comm->executing && !comm->inflight) {
                pthread_mutex_unlock(&comm->q_lock);
                tt_trace_watch(comm);
                pthread_mutex_lock(&comm->q_lock);
                continue;
            }
            watch_ns = TT_TRACE_WATCH_MS * 100000ull; /* a tenth of the period */
        }
        if (comm->q_head && !comm->executing && !comm->exec_wanted) {
            uint64_t until = comm->q_head->defer_until_ns;
            if (until && !comm->stopping && tt_now_ns() < until) {
                /* deferred: its issuer should be waiting for it soon and run it */
                struct timespec ts = { .tv_sec = (time_t)(until / 1000000000ull),
                                       .tv_nsec = (long)(until % 1000000000ull) };
                pthread_cond_timedwait(&comm->q_cv, &comm->q_lock, &ts);
                continue;
            }
            if (until && comm->q_head->guessed)
                comm->defer_guess = 0; /* nobody waited for it: a wrong guess */
            run_head_locked(comm);
            continue;
        }
        if (comm->inflight && !comm->executing && !comm->exec_wanted) {
            /* short slices: an op queued meanwhile waits for the slice to end */
            drive_inflight_locked(comm, 1);
            continue;
        }
        /* (not while another thread runs an op: it may still put requests in flight;
         * it signals as it ends) */
        if (comm->stopping && !comm->q_head && !comm->inflight && !comm->executing)
            break;
        if (comm->inflight || comm->defer_seen) {
            /* someone else is executing, or deferred ops arrive without a wake-up: look
             * again soon */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += comm->inflight ? 5000000 : TT_DEFER_TICK_MS * 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&comm->q_cv, &comm->q_lock, &ts);
        } else if (watch_ns) {
            uint64_t until = tt_now_ns() + watch_ns;
            struct timespec ts = { .tv_sec = (time_t)(until / 1000000000ull),
                                   .tv_nsec = (long)(until % 1000000000ull) };
            pthread_cond_timedwait(&comm->q_cv, &comm->q_lock, &ts);
        } else {
            pthread_cond_wait(&comm->q_cv, &comm->q_lock);
        }
    }
    pthread_mutex_unlock(&comm->q_lock);
    return NULL;
}

/* Calls nest; per thread, so other threads' async ops are not deferred. */
static _Thread_local int defer_depth;

void tt_exec_defer(int on)
{
    defer_depth += on ? 1 : -1;
}

/* A call on comm begins (q_lock held): counted in `inside`, which tutti_comm_destroy
 * waits to see empty before it frees anything (tt_exec_drain). Refused (err says why)
 * once the destroy began, but counted all the same: leave_locked ends it. what: the
 * call's name, or NULL for collective coll's (looked up only for the refusal). */
static int enter_locked(tutti_comm_t *comm, const char *what, int coll, char *err, size_t errlen)
{
    comm->inside++;
    if (__builtin_expect(!comm->stopping, 1))
        return TUTTI_OK;
    snprintf(err, errlen, "rank %d: %s: the communicator is being destroyed (tutti_comm_destroy)",
             comm->rank, what ? what : tt_coll_name(coll));
    return TUTTI_ERR_INVALID_ARG;
}

/* The call ends (q_lock held, released here): its last touch of comm, so first a
 * failure's record still due (trace.c). */
static inline void leave_locked(tutti_comm_t *comm)
{
    if (atomic_load_explicit(&comm->trace_due, memory_order_relaxed)) {
        pthread_mutex_unlock(&comm->q_lock);
        tt_trace_flush(comm);
        pthread_mutex_lock(&comm->q_lock);
    }
    if (--comm->inside == 0 && comm->stopping)
        pthread_cond_broadcast(&comm->done_cv); /* tt_exec_drain */
    pthread_mutex_unlock(&comm->q_lock);
}

static void leave(tutti_comm_t *comm)
{
    pthread_mutex_lock(&comm->q_lock);
    leave_locked(comm);
}

void tt_exec_drain(tutti_comm_t *comm)
{
    pthread_mutex_lock(&comm->q_lock);
    while (comm->inside || comm->executing) {
        comm->done_waiters++;
        pthread_cond_wait(&comm->done_cv, &comm->q_lock);
        comm->done_waiters--;
    }
    pthread_mutex_unlock(&comm->q_lock);
}

/* The head op (q_lock held), deferred for a waiter that runs it, goes to the progress
 * thread now: a bounded waiter or a tester runs no op. A guessed deferral that nobody
 * ran turns the guess off, as the progress thread's does at the deferral's end. */
static void end_deferral_locked(tutti_comm_t *comm)
{
    tutti_work_t *head = comm->q_head;
    if (head->defer_until_ns && head->guessed)
        comm->defer_guess = 0;
    head->defer_until_ns = 0;
}

/* Has any of ws[0..n) (NULLs skipped) finished? Its index, or -1. */
static int first_done(tutti_work_t *const *ws, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ws[i] && atomic_load_explicit(&ws[i]->done, memory_order_acquire))
            return (int)i;
    return -1;
}

/* Wait until one of ws[0..n) (all on comm; NULLs skipped) finishes or deadline_ns
 * passes: *index_p its index and its status, or TUTTI_ERR_TIMEOUT (*index_p -1).
 * tutti_wait's loop, and tutti_wait_any's where its works share a communicator. */
static int wait_set(tutti_comm_t *comm, tutti_work_t *const *ws, size_t n, uint64_t deadline_ns,
                    int *index_p)
{
    *index_p = -1;
    /* after the communicator's destroy (which waited for every op): the works alone */
    if (atomic_load(&comm->gone)) {
        for (size_t i = 0; i < n; i++)
            if (ws[i]) {
                *index_p = (int)i;
                return atomic_load_explicit(&ws[i]->done, memory_order_acquire) ? ws[i]->status
                                                                                : TUTTI_ERR_ABORTED;
            }
        return TUTTI_ERR_INVALID_ARG;
    }
    int p2p = 0;
    for (size_t i = 0; i < n; i++)
        p2p |= ws[i] && ws[i]->is_p2p;
    pthread_mutex_lock(&comm->q_lock);
    comm->inside++; /* (not refused at a destroy: the progress thread ends its op) */
    int st = TUTTI_OK, at;
    /* waited for at once, by a waiter that runs ops (done or not: the progress thread
     * may have been quicker this time): defer the next async op */
    if (deadline_ns == UINT64_MAX && n == 1 && ws[0]->issued_ns &&
        tt_now_ns() - ws[0]->issued_ns < (uint64_t)comm->opts.defer_us * 250)
        comm->defer_guess = 1;
    while ((at = first_done(ws, n)) < 0) {
        /* Only an unbounded waiter runs ops itself: one with a deadline must be free to
         * return on time, so it leaves the running to the progress thread. */
        if (deadline_ns == UINT64_MAX && comm->q_head && !comm->executing && !comm->exec_wanted) {
            run_head_locked(comm);
            continue;
        }
        if (p2p && !comm->q_head && comm->inflight && !comm->executing && !comm->exec_wanted) {
            int ms = deadline_ns == UINT64_MAX ? 2 : TT_MIN(2, tt_ms_left(deadline_ns));
            if (ms == 0) {
                st = TUTTI_ERR_TIMEOUT;
                break;
            }
            drive_inflight_locked(comm, ms);
            continue;
        }
        if (deadline_ns == UINT64_MAX) {
            comm->done_waiters++;
            pthread_cond_wait(&comm->done_cv, &comm->q_lock);
            comm->done_waiters--;
        } else {
            /* a deferred op waits for a waiter that runs it; this one runs none: the
             * progress thread must, now (signalled alone, it went back to sleep until
             * the deferral's end: a bounded wait sat out TUTTI_DEFER_US, found by
             * review) */
            if (comm->q_head && !comm->executing && comm->q_head->defer_until_ns) {
                end_deferral_locked(comm);
                pthread_cond_signal(&comm->q_cv);
            }
            if (tt_now_ns() >= deadline_ns) {
                st = TUTTI_ERR_TIMEOUT;
                break;
            }
            struct timespec ts = { .tv_sec = (time_t)(deadline_ns / 1000000000ull),
                                   .tv_nsec = (long)(deadline_ns % 1000000000ull) };
            comm->done_waiters++;
            pthread_cond_timedwait(&comm->done_cv, &comm->q_lock, &ts);
            comm->done_waiters--;
        }
    }
    if (at >= 0) {
        *index_p = at;
        st = ws[at]->status;
    }
    leave_locked(comm); /* (a failure's record first) */
    return st;
}

static int wait_work(tutti_work_t *w, uint64_t deadline_ns)
{
    int at;
    return wait_set(w->comm, &w, 1, deadline_ns, &at);
}

static void set_last_error(tutti_comm_t *comm, const char *err)
{
    pthread_mutex_lock(&comm->err_lock);
    snprintf(comm->last_error, sizeof(comm->last_error), "%s", err);
    pthread_mutex_unlock(&comm->err_lock);
}

/* Append w (refs: the caller's and the queue's) with q_lock held, and release it; the
 * call ends (leave_locked). Async: hand w out. Blocking: wait for its turn and its end,
 * like a waiter would. */
static int enqueue_locked(tutti_comm_t *comm, tutti_work_t *w, tutti_work_t **work_p)
{
    if (comm->q_tail)
        comm->q_tail->next = w;
    else
        comm->q_head = w;
    comm->q_tail = w;
    int defer = 0;
    if (work_p && comm->opts.defer_us > 0) {
        w->issued_ns = tt_now_ns();
        tutti_work_t *head = comm->q_head;
        if (head != w && head->guessed && head->defer_until_ns) {
            /* an op queued behind a guessed deferral: its issuer is not waiting yet */
            head->defer_until_ns = 0;
            comm->defer_guess = 0;
        }
        w->guessed = !defer_depth && comm->defer_guess && head == w;
        defer = defer_depth || w->guessed;
        if (defer)
            w->defer_until_ns = w->issued_ns + (uint64_t)comm->opts.defer_us * 1000;
    }
    /* a deferred op wakes nobody, but the communicator's first: that starts the ticks */
    if (!defer || !comm->defer_seen)
        pthread_cond_signal(&comm->q_cv);
    comm->defer_seen |= defer;
    if (work_p) {
        *work_p = w;
        leave_locked(comm);
        return TUTTI_OK;
    }
    pthread_mutex_unlock(&comm->q_lock);
    int st = wait_work(w, UINT64_MAX);
    if (st < 0)
        set_last_error(comm, w->err);
    work_unref(w);
    leave(comm);
    return st;
}

/* What the flight recorder notes of a collective's arguments (trace.h). */
static int trace_flags(const tt_op_t *op)
{
    unsigned args = op->desc ? op->desc->args : 0;
    return (args & TT_ARG_REDOP ? TT_TRACE_F_REDOP : 0) |
           (args & TT_ARG_ROOT ? TT_TRACE_F_ROOT : 0);
}

/* A call that issues nothing: what it holds goes back, and its device staging ends with
 * status st (err: why, or empty). */
static int issue_undone(tt_op_t *op, size_t *layout, int layout_heap, int st, char *err,
                        size_t errlen)
{
    if (op->op_held)
        tt_userop_release(op->redop);
    if (layout_heap)
        free(layout);
    return stage_end(op, st, err, errlen);
}

int tt_exec_issue(tutti_comm_t *comm, tt_op_t *op, tutti_redop_t user_redop, size_t *layout,
                  int layout_heap, tutti_work_t **work_p)
{
    char err[TT_ERRMSG_LEN]; /* (not "" in the declaration: that zeroes 1 KiB a call) */
    err[0] = '\0';
    if (!layout_heap && work_p) /* an async op outlives its caller's stack */
        return issue_undone(op, layout, 0, TUTTI_ERR_INTERNAL, err, sizeof(err));
    /* (a forked child's call was refused by coll_issue, before any lock) */
    if (__builtin_expect(in_callback(comm), 0))
        return issue_undone(op, layout, layout_heap, cb_refused(comm, tt_coll_name(op->coll)), err,
                            sizeof(err));
    pthread_mutex_lock(&comm->q_lock);
    int st = enter_locked(comm, NULL, op->coll, err, sizeof(err));
    if (__builtin_expect(st < 0, 0)) { /* (still counted in: comm stays till it leaves) */
        pthread_mutex_unlock(&comm->q_lock);
        st = issue_undone(op, layout, layout_heap, st, err, sizeof(err));
        set_last_error(comm, err);
        leave(comm);
        return st;
    }
    uint64_t seq = comm->next_seq++;
    op->timeout_ms = comm->opts.timeout_ms; /* (tutti_comm_set_timeout writes it under q_lock) */
    uint64_t now = comm->trace ? tt_coarse_ns() : 0;
    if (!work_p && !comm->q_head && !comm->executing && !comm->exec_wanted) {
        /* Fast path: nothing queued, run on this thread, on the caller's op (no copy:
         * ~0.2 us calls, docs/benchmarks.md "The fiftieth session"). */
        comm->executing = 1;
        op->seq = seq;
        if (comm->trace)
            tt_trace_issue(comm, op, user_redop, trace_flags(op), -1, 0, now, 1);
        pthread_mutex_unlock(&comm->q_lock);
        st = run_op(comm, op, user_redop, err, sizeof(err));
        if (op->op_held)
            tt_userop_release(op->redop);
        if (layout_heap)
            free(layout);
        pthread_mutex_lock(&comm->q_lock);
        tt_trace_end(comm, op, -1, st);
        reap_inflight_locked(comm);
        run_callbacks_locked(comm);
        comm->executing = 0;
        if (comm->q_head || comm->stopping)
            pthread_cond_signal(&comm->q_cv);
        if (comm->done_waiters) /* a waiter for `executing` to clear (wait_work) */
            pthread_cond_broadcast(&comm->done_cv);
        if (st < 0 && err[0])
            set_last_error(comm, err); /* (err_lock under q_lock, as in the reap) */
        leave_locked(comm);            /* a failure's record, this op's or a reaped request's */
        return st;
    }
    tutti_work_t *w = calloc(1, sizeof(*w));
    if (!w) {
        /* nothing went out: the seq goes back (q_lock held since it was taken), so that
         * the caller may try the call again and still pair with the other ranks' */
        comm->next_seq--;
        pthread_mutex_unlock(&comm->q_lock);
        snprintf(err, sizeof(err),
                 "rank %d: %s: out of memory for the op's work record (nothing was sent: the "
                 "call may be made again)",
                 comm->rank, tt_coll_name(op->coll));
        set_last_error(comm, err);
        st = issue_undone(op, layout, layout_heap, TUTTI_ERR_NOMEM, err, sizeof(err));
        leave(comm);
        return st;
    }
    w->layout = layout_heap ? layout : NULL; /* else the blocking caller's, who waits */
    w->comm = comm;
    w->op = *op;
    w->op.seq = seq;
    w->user_redop = user_redop;
    tt_trace_issue(comm, &w->op, user_redop, trace_flags(op) | (work_p ? TT_TRACE_F_ASYNC : 0), -1,
                   0, now, 0);
    atomic_init(&w->refs, 2);
    atomic_fetch_add(&comm->refs, 1);
    return enqueue_locked(comm, w, work_p);
}

/* A send to or receive from TUTTI_PROC_NULL (MPI_PROC_NULL): done as issued, having
 * moved nothing (a receive's source TUTTI_PROC_NULL, its count 0); a work for _async. */
static int issue_proc_null(tutti_comm_t *comm, int kind, tutti_work_t **work_p)
{
    char err[TT_ERRMSG_LEN];
    pthread_mutex_lock(&comm->q_lock);
    int st = enter_locked(comm, kind == TUTTI_TP_SEND ? "send" : "recv", 0, err, sizeof(err));
    if (st < 0) {
        pthread_mutex_unlock(&comm->q_lock);
        set_last_error(comm, err);
        leave(comm);
        return st;
    }
    if (work_p) {
        tutti_work_t *w = calloc(1, sizeof(*w));
        if (!w) {
            leave_locked(comm);
            return tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "%s: out of memory",
                                     kind == TUTTI_TP_SEND ? "send" : "recv");
        }
        w->comm = comm;
        w->is_p2p = 1;
        w->user_redop = TUTTI_SUM;
        w->op = (tt_op_t){ .comm = comm,
                           .rank = comm->rank,
                           .nranks = comm->nranks,
                           .coll = TT_COLL_P2P,
                           .dtype = TUTTI_UINT8,
                           .elem_size = 1 };
        w->req.kind = w->p2p_kind = kind;
        w->req.peer = TUTTI_PROC_NULL;
        atomic_init(&w->refs, 1);
        atomic_init(&w->cb_state, 2);
        atomic_store_explicit(&w->done, 1, memory_order_release);
        atomic_fetch_add(&comm->refs, 1);
        *work_p = w;
    }
    leave_locked(comm);
    return TUTTI_OK;
}

int tt_exec_issue_p2p(tutti_comm_t *comm, int kind, void *buf, size_t count, tutti_dtype_t dtype,
                      int peer, uint32_t tag, int upto, tutti_work_t **work_p,
                      struct tt_derived *held)
{
    if (in_callback(comm)) /* (a forked child's call was refused by p2p_issue) */
        return cb_refused(comm, kind == TUTTI_TP_SEND ? "send" : "recv");
    if (peer == TUTTI_PROC_NULL)
        return issue_proc_null(comm, kind, work_p);
    tutti_work_t *w = calloc(1, sizeof(*w));
    if (!w)
        return TUTTI_ERR_NOMEM;
    /* a derived type: its packed form (packed now for a send; unpacked when a receive
     * completes) */
    tt_op_t dv = { .comm = comm, .rank = comm->rank, .nranks = comm->nranks, .coll = TT_COLL_P2P };
    if (__builtin_expect((unsigned)dtype >= TUTTI_DTYPE_COUNT, 0)) {
        int st = tt_packed_stage_p2p(comm, &dv, &buf, &count, &dtype, held, kind == TUTTI_TP_SEND,
                                     kind == TUTTI_TP_SEND ? "send" : "recv");
        if (st < 0) {
            free(w);
            return st;
        }
    }
    size_t es = tutti_dtype_size(dtype);
    /* a device buffer: a host copy, sent from (copied in when the send is posted) or
     * received into (copied back when the receive completes) */
    if (__builtin_expect(comm->dev != NULL, 0)) {
        int st = tt_dev_stage_p2p(comm, &dv, &buf, count * es, kind == TUTTI_TP_SEND,
                                  kind == TUTTI_TP_SEND ? "send" : "recv");
        if (st < 0) {
            free(w);
            return tt_packed_finish(&dv, st);
        }
    }
    w->comm = comm;
    w->is_p2p = 1;
    w->user_redop = TUTTI_SUM;
    atomic_init(&w->refs, 2);
    pthread_mutex_lock(&comm->q_lock);
    char err[TT_ERRMSG_LEN];
    int st = enter_locked(comm, kind == TUTTI_TP_SEND ? "send" : "recv", 0, err, sizeof(err));
    if (__builtin_expect(st < 0, 0)) {
        pthread_mutex_unlock(&comm->q_lock);
        free(w);
        st = stage_end(&dv, st, err, sizeof(err));
        set_last_error(comm, err);
        leave(comm);
        return st;
    }
    /* an any-source receive takes its number when its sender is found (exec.c's any_step),
     * and so do tutti_recv_upto's and a TUTTI_ANY_TAG one's, from a named rank too
     * (seek_p1) */
    w->any_tag = kind == TUTTI_TP_RECV && tag == TUTTI_ANY_TAG;
    w->any_source = peer == TUTTI_ANY_SOURCE || upto || w->any_tag;
    w->upto = upto != 0;
    w->seek_p1 = (upto || w->any_tag) && peer != TUTTI_ANY_SOURCE ? peer + 1 : 0;
    w->upto_cap = count * es;
    tt_p2p_seq_t *sq = w->any_source ? NULL : p2p_seq(comm, peer, tag, 1);
    if (__builtin_expect(!w->any_source && !sq, 0)) {
        pthread_mutex_unlock(&comm->q_lock);
        free(w);
        snprintf(err, sizeof(err), "rank %d: %s: out of memory (its sequence numbers)", comm->rank,
                 kind == TUTTI_TP_SEND ? "send" : "recv");
        st = stage_end(&dv, TUTTI_ERR_NOMEM, err, sizeof(err));
        set_last_error(comm, err);
        leave(comm);
        return st;
    }
    atomic_fetch_add(&comm->refs, 1);
    /* a receive behind an any-source one of its tag takes its number later (late_step) */
    w->late_seq = kind == TUTTI_TP_RECV && !w->any_source && late_at_issue(comm, peer, tag);
    comm->unnumbered += w->any_source || w->late_seq;
    uint64_t seq = w->any_source || w->late_seq ? 0
                   : kind == TUTTI_TP_SEND      ? sq->sent++
                                                : sq->received++;
    w->op = (tt_op_t){ .comm = comm,
                       .rank = comm->rank,
                       .nranks = comm->nranks,
                       .coll = TT_COLL_P2P,
                       .p2p_name = kind == TUTTI_TP_SEND ? "send"
                                   : upto                ? "recv_upto"
                                                         : "recv",
                       .count = count,
                       .elem_size = es,
                       .dtype = dtype,
                       .seq = seq,
                       .timeout_ms = comm->opts.timeout_ms,
                       .env_count = count,
                       .fingerprint = tt_fingerprint(TT_COLL_P2P, dtype, 0, 0),
                       .dev = dv.dev,
                       .packed = dv.packed };
    w->req.kind = w->p2p_kind = kind;
    w->req.peer = w->any_source ? TUTTI_ANY_SOURCE : peer;
    w->req.buf = buf;
    w->req.len = count * es;
    tt_env_encode(w->req.env, seq, w->op.fingerprint, count, 0, tag);
    w->req.env[3] |= TT_ENV_P2P;
    if (comm->trace)
        tt_trace_issue(comm, &w->op, TUTTI_SUM,
                       (kind == TUTTI_TP_SEND ? TT_TRACE_F_SEND : 0) |
                           (work_p && upto != 2 ? TT_TRACE_F_ASYNC : 0) |
                           (peer == TUTTI_ANY_SOURCE ? TT_TRACE_F_ANY : 0) |
                           (w->late_seq || w->seek_p1 ? TT_TRACE_F_LATE : 0),
                       peer == TUTTI_ANY_SOURCE ? -1 : peer, tag, tt_coarse_ns(), 0);
    return enqueue_locked(comm, w, work_p);
}

int tt_exec_probe(tutti_comm_t *comm, const char *name, int peer, uint32_t tag, int once,
                  int *found_p, int *source_p, uint32_t *tag_p, size_t *count_p,
                  tutti_dtype_t *dtype_p, tutti_message_t **msg_p)
{
    if (in_callback(comm))
        return cb_refused(comm, name);
    tutti_work_t *w = calloc(1, sizeof(*w));
    if (!w)
        return tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "%s: out of memory", name);
    w->comm = comm;
    w->is_p2p = 1;
    w->probe = once ? 2 : 1;
    w->matched = !msg_p ? 0 : once ? 2 : 1;
    w->user_redop = TUTTI_SUM;
    atomic_init(&w->refs, 3); /* the queue's (then in flight), the blocking wait's, ours */
    pthread_mutex_lock(&comm->q_lock);
    char err[TT_ERRMSG_LEN];
    int st = enter_locked(comm, name, 0, err, sizeof(err));
    if (__builtin_expect(st < 0, 0)) {
        pthread_mutex_unlock(&comm->q_lock);
        free(w);
        set_last_error(comm, err);
        leave(comm);
        return st;
    }
    atomic_fetch_add(&comm->refs, 1);
    w->any_source = peer == TUTTI_ANY_SOURCE;
    w->any_tag = tag == TUTTI_ANY_TAG;
    /* not numbered, not traced: it takes nothing (a fingerprint and dtype of its own) */
    w->op = (tt_op_t){ .comm = comm,
                       .rank = comm->rank,
                       .nranks = comm->nranks,
                       .coll = TT_COLL_P2P,
                       .p2p_name = name,
                       .p2p_probe = 1,
                       .timeout_ms = comm->opts.timeout_ms,
                       .elem_size = 1,
                       .dtype = TUTTI_UINT8,
                       .fingerprint = tt_fingerprint(TT_COLL_P2P, TUTTI_UINT8, 0, 0) };
    w->req.kind = TUTTI_TP_RECV;
    w->req.peer = peer;
    tt_env_encode(w->req.env, 0, w->op.fingerprint, 0, 0, tag);
    w->req.env[3] |= TT_ENV_P2P;
    st = enqueue_locked(comm, w, NULL); /* waits (and drops the wait's reference) */
    if (st == TUTTI_OK && w->msg)       /* an mprobe's: the message, received */
        *msg_p = w->msg;
    else
        free(w->msg); /* (a failed one's: the transport is done with it) */
    if (st == TUTTI_OK) {
        if (found_p)
            *found_p = w->probe_found;
        if (w->probe_found && source_p)
            *source_p = w->probe_source;
        if (w->probe_found && tag_p)
            *tag_p = w->probe_tag;
        if (w->probe_found && count_p)
            *count_p = w->probe_count;
        if (w->probe_found && dtype_p)
            *dtype_p = (tutti_dtype_t)w->probe_dtype;
    }
    work_unref(w);
    return st;
}

/* ---- cancelling a receive (MPI_Cancel) ---- */

static int queue_has(const tutti_comm_t *comm, const tutti_work_t *w)
{
    for (const tutti_work_t *e = comm->q_head; e; e = e->next)
        if (e == w)
            return 1;
    return 0;
}

static void queue_unlink(tutti_comm_t *comm, tutti_work_t *w)
{
    tutti_work_t *prev = NULL;
    for (tutti_work_t *e = comm->q_head; e; prev = e, e = e->next) {
        if (e != w)
            continue;
        if (prev)
            prev->next = w->next;
        else
            comm->q_head = w->next;
        if (comm->q_tail == w)
            comm->q_tail = prev;
        w->next = NULL;
        return;
    }
}

static void inflight_unlink(tutti_comm_t *comm, tutti_work_t *w)
{
    tutti_work_t *prev = NULL;
    for (tutti_work_t *e = comm->inflight; e; prev = e, e = e->inflight_next) {
        if (e != w)
            continue;
        if (prev)
            prev->inflight_next = w->inflight_next;
        else
            comm->inflight = w->inflight_next;
        if (comm->inflight_tail == w)
            comm->inflight_tail = prev;
        w->inflight_next = NULL;
        return;
    }
}

/* Can receive w (not done; q_lock and `executing` held) be taken back, and is it? One
 * without its number yet (any source or tag, a recv_upto, a late one) has matched
 * nothing. A numbered one gives its number back, so only the last taken of its (peer,
 * tag) can (a later receive of the pair holds the next, and MPI's order would give it
 * the message w would have taken: that would renumber it), and only where it has not
 * met its message: still queued, waiting for a copy of its own rank's, or taken back by
 * the transport (its cancel slot: transport_v2.h). 1: taken (off its list, its number
 * given back); 0: it completes as it would. */
static int cancel_take(tutti_comm_t *comm, tutti_work_t *w, const char **why)
{
    const int queued = queue_has(comm, w);
    if (!queued && w->req.status != 1) { /* done in the transport, not reaped yet */
        *why = "its message came";
        return 0;
    }
    tt_p2p_seq_t *sq = NULL;
    if (!unnumbered(w)) {
        sq = p2p_seq(comm, w->req.peer, tt_env_tag(w->req.env), 0);
        if (!sq || sq->received != w->op.seq + 1) {
            *why = "a later receive of its rank and tag holds the next number";
            return 0;
        }
        if (!queued && !is_self_recv(comm, w)) {
            int st = tutti_tp_ops_has(comm->tp_ops, cancel) && comm->tp_ops->cancel
                         ? comm->tp_ops->cancel(comm->tp, &w->req)
                         : TUTTI_ERR_UNSUPPORTED;
            if (st != 0) {
                *why = st == 1 ? "its message has come, or is coming in"
                               : "the transport cannot take a posted receive back";
                return 0;
            }
        }
        sq->received--;
    }
    if (queued)
        queue_unlink(comm, w);
    else
        inflight_unlink(comm, w);
    return 1;
}

int tutti_cancel(tutti_work_t *work, int *cancelled_p)
{
    if (cancelled_p)
        *cancelled_p = 0;
    if (!work)
        return TUTTI_ERR_INVALID_ARG;
    tutti_comm_t *comm = work->comm;
    if (tt_comm_foreign(comm))
        return tt_comm_refuse_foreign(comm, "cancel", 0);
    if (in_callback(comm))
        return cb_refused(comm, "cancel");
    /* (p2p_kind: the library's own copy; the transport writes req.kind as it posts) */
    if (!work->is_p2p || work->p2p_kind != TUTTI_TP_RECV || work->probe)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "cancel: only a receive can be cancelled (this work is %s)",
                                 !work->is_p2p                     ? "a collective"
                                 : work->p2p_kind == TUTTI_TP_SEND ? "a send (MPI deprecates "
                                                                     "cancelling sends)"
                                                                   : "a probe");
    pthread_mutex_lock(&comm->q_lock);
    /* the queue and the in-flight list change under `executing`: wait for the op being
     * run or the slice of progress under way (exec_wanted: the threads that take it in
     * turns, a waiter's drive and the progress thread's, leave it to this one) */
    comm->exec_wanted++;
    while (comm->executing && !atomic_load_explicit(&work->done, memory_order_acquire)) {
        comm->done_waiters++; /* (the issue fast path broadcasts to counted waiters only:
                                 uncounted, this one slept on forever, found by review) */
        pthread_cond_wait(&comm->done_cv, &comm->q_lock);
        comm->done_waiters--;
    }
    comm->exec_wanted--;
    if (atomic_load_explicit(&work->done, memory_order_acquire)) {
        pthread_mutex_unlock(&comm->q_lock);
        return TUTTI_OK; /* done before it: not cancelled */
    }
    comm->executing = 1;
    const char *why = "";
    char what[112], err[TT_ERRMSG_LEN];
    int taken = cancel_take(comm, work, &why);
    if (taken) {
        snprintf(err, sizeof(err), "rank %d: %s: cancelled (tutti_cancel)", comm->rank,
                 p2p_what(work, what, sizeof(what)));
        work->req.status = TUTTI_ERR_CANCELLED;
        complete(comm, work, TUTTI_ERR_CANCELLED, err);
        work_unref(work);           /* its list's reference */
        reap_inflight_locked(comm); /* receives that waited behind it go on */
    } else {
        TT_INFO("rank %d: %s: not cancelled: %s", comm->rank, p2p_what(work, what, sizeof(what)),
                why);
    }
    run_callbacks_locked(comm);
    comm->executing = 0;
    pthread_cond_broadcast(&comm->done_cv);
    pthread_cond_signal(&comm->q_cv);
    pthread_mutex_unlock(&comm->q_lock);
    if (cancelled_p)
        *cancelled_p = taken;
    return TUTTI_OK;
}

int tutti_test(tutti_work_t *work, int *done_p)
{
    if (!work || !done_p)
        return TUTTI_ERR_INVALID_ARG;
    tutti_comm_t *comm = work->comm;
    if (tt_comm_foreign(comm))
        return tt_comm_refuse_foreign(comm, "test", 0);
    if (!atomic_load_explicit(&work->done, memory_order_acquire) && atomic_load(&comm->gone)) {
        *done_p = 1; /* the destroy waited for every op: never, but never pending */
        return TUTTI_ERR_ABORTED;
    }
    if (!atomic_load_explicit(&work->done, memory_order_acquire)) {
        /* Help along: if nothing runs, run what is queued up to this op; a deferred op
         * (waiting for its issuer to wait and run it) goes to the progress thread now:
         * a caller that tests runs nothing (an MPI_Test loop saw it start only at the
         * deferral's end) */
        pthread_mutex_lock(&comm->q_lock);
        if (comm->q_head && !comm->executing) {
            end_deferral_locked(comm);
            pthread_cond_signal(&comm->q_cv);
        }
        pthread_mutex_unlock(&comm->q_lock);
        *done_p = 0;
        return TUTTI_OK;
    }
    *done_p = 1;
    return work->status;
}

int tutti_wait(tutti_work_t *work, int timeout_ms)
{
    if (!work)
        return TUTTI_ERR_INVALID_ARG;
    if (tt_comm_foreign(work->comm))
        return tt_comm_refuse_foreign(work->comm, "wait", 0);
    if (in_callback(work->comm)) /* (its own op waits for the callback: never) */
        return cb_refused(work->comm, "wait");
    /* -1: until the op ends, which its own deadline bounds. A bound that passes is not a
     * failure, so last_error is left alone: it is the communicator's, and the library
     * builds a failing op's message from it (session 97: another thread's 100 ms wait
     * turned a dead peer's message into "wait: allreduce seq 1 still running") */
    return wait_work(work, timeout_ms < 0 ? UINT64_MAX : tt_deadline_ns(timeout_ms));
}

/* Refuse what tutti_wait refuses, for each work of a set: a forked child's, or one
 * whose communicator runs this thread's callback. */
static int set_refused(size_t n, tutti_work_t *const *works, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (!works[i])
            continue;
        if (tt_comm_foreign(works[i]->comm))
            return tt_comm_refuse_foreign(works[i]->comm, what, 0);
        if (in_callback(works[i]->comm))
            return cb_refused(works[i]->comm, what);
    }
    return TUTTI_OK;
}

/* Works of several communicators: each waits in turn, a slice at a time, on its own
 * communicator's completions (the progress threads run the ops meanwhile). */
#define TT_WAIT_ANY_SLICE_NS 1000000ull

static int wait_any_named(size_t n, tutti_work_t *const *works, int timeout_ms, int *index_p,
                          const char *what)
{
    if (!index_p || (n && !works))
        return TUTTI_ERR_INVALID_ARG;
    *index_p = -1;
    int st = set_refused(n, works, what);
    if (st < 0)
        return st;
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : tt_deadline_ns(timeout_ms);
    tutti_comm_t *one = NULL;
    int mixed = 0;
    for (size_t i = 0; i < n; i++)
        if (works[i] && !one)
            one = works[i]->comm;
        else if (works[i] && works[i]->comm != one)
            mixed = 1;
    if (!one)
        return TUTTI_OK; /* nothing to wait for (MPI_Waitany's MPI_UNDEFINED) */
    if (!mixed)
        return wait_set(one, works, n, deadline, index_p);
    tutti_work_t **sub = calloc(n, sizeof(*sub));
    if (!sub)
        return TUTTI_ERR_NOMEM;
    size_t turn = 0;
    for (;;) {
        for (size_t i = 0; i < n; i++) {
            if (!works[i])
                continue;
            int done = 0, s = tutti_test(works[i], &done); /* (gone: done, ABORTED) */
            if (done) {
                free(sub);
                *index_p = (int)i;
                return s;
            }
        }
        uint64_t now = tt_now_ns();
        if (now >= deadline) {
            free(sub);
            return TUTTI_ERR_TIMEOUT;
        }
        /* the next communicator in turn: its works alone, for a slice */
        tutti_comm_t *c = NULL;
        for (size_t j = 0; j < n && !c; j++) {
            size_t i = (turn + j) % n;
            if (works[i])
                c = works[i]->comm, turn = i + 1;
        }
        for (size_t i = 0; i < n; i++)
            sub[i] = works[i] && works[i]->comm == c ? works[i] : NULL;
        uint64_t until = TT_MIN(deadline, now + TT_WAIT_ANY_SLICE_NS);
        int at;
        st = wait_set(c, sub, n, until, &at);
        if (at >= 0) {
            free(sub);
            *index_p = at;
            return st;
        }
    }
}

int tutti_wait_any(size_t n, tutti_work_t *const *works, int timeout_ms, int *index_p)
{
    return wait_any_named(n, works, timeout_ms, index_p, "wait_any");
}

int tutti_wait_all(size_t n, tutti_work_t *const *works, int timeout_ms)
{
    if (n && !works)
        return TUTTI_ERR_INVALID_ARG;
    int st = set_refused(n, works, "wait_all");
    if (st < 0)
        return st;
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : tt_deadline_ns(timeout_ms);
    int first = TUTTI_OK;
    for (size_t i = 0; i < n; i++) {
        if (!works[i])
            continue;
        int at, s = wait_set(works[i]->comm, &works[i], 1, deadline, &at);
        if (at < 0)
            return TUTTI_ERR_TIMEOUT; /* the bound passed: the rest go on */
        if (s < 0 && first == TUTTI_OK)
            first = s;
    }
    return first;
}

int tutti_wait_some(size_t n, tutti_work_t *const *works, int timeout_ms, size_t *count_p,
                    int *indices)
{
    if (!count_p || (n && (!works || !indices)))
        return TUTTI_ERR_INVALID_ARG;
    *count_p = 0;
    int at, st = wait_any_named(n, works, timeout_ms, &at, "wait_some");
    if (at < 0)
        return st; /* none to wait for (OK), the bound, or a refusal */
    int first = TUTTI_OK;
    for (size_t i = 0; i < n; i++) {
        int done = 0, s = works[i] ? tutti_test(works[i], &done) : TUTTI_OK;
        if (!done)
            continue;
        indices[(*count_p)++] = (int)i;
        if (s < 0 && first == TUTTI_OK)
            first = s;
    }
    return first;
}

void tutti_work_free(tutti_work_t *work)
{
    /* in a forked child, the copy stays: its last reference would destroy the parent's
     * locks and conds, whose waiters are the parent's threads (cond_destroy waits) */
    if (work && !tt_comm_foreign(work->comm))
        work_unref(work);
}

/* The op's status and explanation are written: from the completion on, also inside its
 * callback (and on the thread the callback hands the news to), before the work reads as
 * done. */
static int work_ended(const tutti_work_t *work)
{
    return (atomic_load(&((tutti_work_t *)work)->cb_state) & 2) ||
           atomic_load(&((tutti_work_t *)work)->done);
}

int tutti_mrecv(tutti_message_t *msg, void *buf, size_t count, tutti_dtype_t dtype)
{
    /* (no communicator: the errors are the thread's, as a failed init's) */
    if (!msg)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "mrecv: msg is NULL");
    /* a derived type: the message holds its packed form (count * k of its dtype) */
    tt_derived_t *t = (unsigned)dtype >= TUTTI_DTYPE_COUNT ? tt_derived_hold(dtype) : NULL;
    if ((unsigned)dtype >= TUTTI_DTYPE_COUNT && !t)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "rank %d: mrecv: invalid dtype %d",
                                   msg->rank, (int)dtype);
    size_t k = 1;
    const tutti_dtype_t packed = t ? tt_packed_dtype(t, &k) : dtype;
    int st = TUTTI_OK;
    if (msg->source == TUTTI_PROC_NULL) { /* (MPI_MESSAGE_NO_PROC: nothing to take) */
        tutti_message_free(msg);
    } else if ((!buf || buf == TUTTI_IN_PLACE) && count) {
        st = tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "rank %d: mrecv: buf is %s", msg->rank,
                                 buf ? "the in-place marker (a receive has no input)" : "NULL");
    } else if (count * k != msg->count || packed != msg->dtype) {
        char as[64] = ""; /* a derived type's packed form */
        if (t)
            snprintf(as, sizeof(as), " (%zu x %s)", count * k, tutti_dtype_name(packed));
        st = tt_thread_error_set(TUTTI_ERR_MISMATCH,
                                 "rank %d: mrecv of the message from rank %d (tag %u): it holds "
                                 "%zu x %s, the receive names %zu x %s%s",
                                 msg->rank, msg->source, msg->tag, msg->count,
                                 tutti_dtype_name(msg->dtype), count, tutti_dtype_name(dtype), as);
    } else {
        if (msg->len && t)
            tt_derived_unpack(t, msg->data, msg->len, buf, count);
        else if (msg->len)
            memcpy(buf, msg->data, msg->len);
        tutti_message_free(msg);
    }
    tt_derived_release(t);
    return st;
}

void tutti_message_free(tutti_message_t *msg)
{
    free(msg);
}

int tt_exec_wait_blocking(tutti_work_t *work)
{
    int st = tutti_wait(work, -1);
    if (st < 0 && work_ended(work))
        set_last_error(work->comm, work->err);
    return st;
}

size_t tutti_work_count(const tutti_work_t *work)
{
    if (!work || !work->is_p2p || work->req.kind != TUTTI_TP_RECV || work->probe ||
        !work_ended(work) || work->status != TUTTI_OK)
        return (size_t)-1;
    return work->op.count;
}

int tutti_work_info(const tutti_work_t *work, tutti_msg_info_t *info)
{
    if (!work || !info)
        return TUTTI_ERR_INVALID_ARG;
    if (!work->is_p2p || work->req.kind != TUTTI_TP_RECV || work->probe)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "work_info: not a receive");
    if (!work_ended(work))
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "work_info: the receive still runs");
    if (work->status != TUTTI_OK)
        return tt_thread_error_set(work->status, "work_info: the receive failed: %s", work->err);
    if (work->req.peer == TUTTI_PROC_NULL) {
        *info = (tutti_msg_info_t){
            .source = TUTTI_PROC_NULL, .tag = TUTTI_ANY_TAG, .count = 0, .dtype = TUTTI_UINT8
        };
        return TUTTI_OK;
    }
    /* env[3]: its own tag, or a TUTTI_ANY_TAG receive's message's, as it took it; the
     * count in the receive's dtype (tutti_work_count's) */
    *info = (tutti_msg_info_t){ .source = work->req.peer,
                                .tag = tt_env_tag(work->req.env),
                                .count = work->op.count,
                                .dtype = work->op.dtype };
    return TUTTI_OK;
}

int tutti_message_info(const tutti_message_t *msg, tutti_msg_info_t *info)
{
    if (!msg || !info)
        return TUTTI_ERR_INVALID_ARG;
    *info = (tutti_msg_info_t){ .source = msg->source,
                                .tag = msg->source == TUTTI_PROC_NULL ? TUTTI_ANY_TAG : msg->tag,
                                .count = msg->count,
                                .dtype = msg->dtype };
    return TUTTI_OK;
}

int tutti_work_source(const tutti_work_t *work)
{
    if (!work || !work->is_p2p || work->req.kind != TUTTI_TP_RECV || !work_ended(work))
        return -1;
    return work->req.peer >= 0 || work->req.peer == TUTTI_PROC_NULL ? work->req.peer : -1;
}

const char *tutti_work_error(const tutti_work_t *work)
{
    if (!work)
        return "no work";
    return work_ended(work) ? work->err : "";
}
