/* Failure handling: recording a failure (last_error, the first one sticks, the peers and
 * the store are told), what a failed request, a timeout or a transport failure says, the
 * store records other ranks read (failed/<rank>, failed_count, stall/<rank>), the stall
 * check, and time this process was not running.
 * Calls:   envelope <- fault <- p2p <- exec <- comm (each calls only those to its left;
 *          fault reaches the transport through comm->tp_ops, never through p2p.c).
 * Headers: op.h (types) <- envelope.h, fault.h, p2p.h <- comm.h (which includes all);
 *          fault.c reads the communicator through state.h. */
#ifndef TT_FAULT_H
#define TT_FAULT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/base.h" /* tt_thread_error_set */
#include "core/op.h"

/* comm->last_error = "rank <r>: " + the message; returns status. */
int tt_comm_set_error(tutti_comm_t *comm, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* fault.c: the pid of this process, for a communicator it makes (comm_alloc); the
 * first call registers the pthread_atfork child handler that keeps it right. */
pid_t tt_comm_owner_pid(void);
/* fault.c: whether this process is not the one that made comm (a child forked after it
 * was made). The child has a copy of the struct but none of the parent's threads, and
 * shares the parent's sockets, rings and store keys: any use of them steals the
 * parent's messages or corrupts its job, and its locks may be held forever by threads
 * that exist only in the parent. So every public call on comm, or on a work of it,
 * checks this first and then touches nothing but the caller's own memory. */
int tt_comm_foreign(const tutti_comm_t *comm);
/* fault.c: refuse `what` on a foreign comm: TUTTI_ERR_INVALID_ARG, with "communicator
 * made by pid X used in pid Y, a forked child: ..." as what tutti_comm_last_error
 * returns on this thread (not in comm->last_error: err_lock may be held for good).
 * quiet: logged at info level, else a warning. No lock, no store, no transport. */
int tt_comm_refuse_foreign(const tutti_comm_t *comm, const char *what, int quiet);
/* fault.c: tutti_comm_last_error's text for a foreign comm (no lock). */
const char *tt_comm_foreign_error(const tutti_comm_t *comm);

/* A copy of comm->last_error taken under err_lock, in this thread's storage (one of a
 * few, reused in turn): tutti_comm_last_error's answer. */
const char *tt_comm_error_copy(const tutti_comm_t *comm);
/* The failure a call refused on a failed communicator quotes (err_lock held): the first
 * one's message, not last_error, which by then may be an earlier refused call's (each
 * quoted the last: the messages nested, one more "not started" a call). A failure that
 * tt_fault_record did not record first (a revoke, an abort: comm.c sets last_error
 * alone) is pinned from last_error here, by them or by the first call refused. */
const char *tt_failed_error_locked(tutti_comm_t *comm);
/* msg past its leading "rank <rank>: ", if it has one (for a message that names the rank
 * itself). */
const char *tt_after_rank_prefix(const char *msg, long rank);

/* Record the failure of op on its communicator: last_error; the first failure also
 * sticks (later ops fail at once with it) and goes to the peers (the transport) and to
 * the store (failed/<rank>, failed_count). */
void tt_fault_record(tt_op_t *op, int status, const char *msg);
/* Fail op: record and report the failure (tt_fault_record), then cancel every posted
 * request. In that order: a send cut mid-message closes the link, and the peer that
 * sees it close looks for this rank's failed/ record, which must be there first. */
void tt_fault_fail_op(tt_op_t *op, int status, const char *msg);
/* tutti_comm_revoke made comm fail with TUTTI_ERR_REVOKED (last_error says so): the
 * store record tt_fault_record leaves, from the caller's thread (its own view of the
 * store, the failure paths' deadline). */
void tt_fault_record_revoke(tutti_comm_t *comm);
/* Send the revoke to the peers through the transport (TUTTI_ERR_REVOKED, which each of
 * them passes on as its first failure), once; nothing when this rank did not revoke or
 * has told already. The caller holds `executing` (the transport's links are its). */
void tt_fault_tell_revoke(tutti_comm_t *comm);

/* A request of op failed (req->status): describe it (a mismatch names both envelopes; a
 * closed peer, what it left in the store), fail op; returns the status. */
int tt_fault_req(tt_op_t *op, const tutti_tp_req_v2_t *req);
/* The same for a point-to-point work item (exec.c), status st (TUTTI_ERR_TIMEOUT: its
 * deadline passed); err gets last_error. */
void tt_fault_p2p(tt_op_t *op, const tutti_tp_req_v2_t *req, int st, char *err, size_t errlen);
/* op's deadline passed waiting on req: name whom it waited on (the stall records' blame
 * chain), fail op; returns the status. */
int tt_fault_timed_out(tt_op_t *op, tutti_tp_req_v2_t *req);
/* The transport reported a failure since op started (comm->tp_error_gen moved). */
int tt_fault_transport(tt_op_t *op);
/* The transport's progress failed with st (< 0). */
int tt_fault_progress(tt_op_t *op, int st);
/* Blocked for stall_check_ms: publish stall/<rank>, compare with the other ranks' and
 * look for failed ranks. The status op failed with; TT_STALL_NOTHING when it looked and
 * no peer failed or is in another call (then an earlier rooted call's agreement message
 * may have failed on a link op waits on: the caller asks tt_agree_failed); else
 * TUTTI_OK. */
#define TT_STALL_NOTHING 1
/* How many ranks failed: each adds 1 under the communicator's keys at its first failure
 * (tt_fault_record); the stall check reads it, and so does the flight recorder's watch
 * (trace.c), by adding 0 (which makes it exist at 0). */
#define TT_FAILED_COUNT_KEY "failed_count"
int tt_fault_stall_check(tt_op_t *op, const tutti_tp_req_v2_t *req);
/* The stall check of point-to-point work blocked for stall_check_ms (exec.c): look for
 * failed ranks (failed_count, then failed/<rank>: a revoke, a failure whose report this
 * rank's links did not carry) and fail op with the first found. Its status, or TUTTI_OK
 * when none failed. */
int tt_fault_p2p_stall_check(tt_op_t *op, const char *waiting);
/* This process was not running for gap_ns (over comm->quick_ns, the caller checked):
 * the deadline moves by it, and the op's error will say it. */
void tt_fault_stopped(tt_op_t *op, uint64_t gap_ns);

/* The op starts waiting now: deadline, stop detection, stall checks (exec.c). */
void tt_op_start(tt_op_t *op, int timeout_ms);
/* The op ended (exec.c): its stall record, if it published one, goes. */
void tt_op_finish(tt_op_t *op);

/* Store calls made on a failure path or by a stall check: through comm->qstore, each
 * bounded by the quick deadline (comm->quick_ns) and by the op's time left (but at
 * least TT_OP_STORE_FLOOR_MS, so that a timed-out op can still be diagnosed); after one
 * of them failed, none for the rest of the op (the store's host may be the rank that
 * died: every call would wait out its bound). A skipped call returns TUTTI_ERR_STORE. */
#define TT_OP_STORE_FLOOR_MS 100
int tt_op_store_set(tt_op_t *op, const char *key, const void *value, size_t len);
int tt_op_store_add(tt_op_t *op, const char *key, int64_t delta, int64_t *result_p);
int tt_op_store_check(tt_op_t *op, const char *key, int *exists_p);
int tt_op_store_get(tt_op_t *op, const char *key, void **value_p, size_t *len_p);
int tt_op_store_delete(tt_op_t *op, const char *key);

#endif /* TT_FAULT_H */
