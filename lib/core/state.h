/* The communicator and its work items: the structs only (struct tutti_comm, struct
 * tutti_work), so that the files below the communicator (p2p, fault, job, tpmux) can
 * read its fields without including comm.h's functions. */
#ifndef TT_STATE_H
#define TT_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include <tutti/transport_v2.h>
#include <tutti/tutti.h>

#include "base/base.h" /* TT_ERRMSG_LEN */
#include "coll/cost.h"
#include "core/agree_types.h"
#include "core/op.h"
#include "core/stage_types.h"

struct tt_algo;
struct tt_algo_override;

struct tutti_work {
    tutti_comm_t *comm;
    atomic_int refs; /* the user's handle + the queue */
    atomic_int done;
    int status;
    tt_op_t op;
    tutti_redop_t user_redop; /* AVG stays AVG here (op.redop is SUM then) */
    size_t *layout;           /* owned copy of the op's layout arrays, or NULL */
    /* tutti_send/recv: posted when its turn comes, then in flight until the transport
     * completes it (it never holds the queue, so isend/irecv pairs cannot deadlock) */
    int is_p2p;
    int p2p_kind; /* TUTTI_TP_SEND or _RECV as issued (req.kind the transport writes too) */
    tutti_tp_req_v2_t req; /* the transport's own: posted directly, not through p2p.c */
    int any_source;        /* a receive from TUTTI_ANY_SOURCE: in flight with req.peer
                              < 0 until the executor finds its message (exec.c) */
    int any_tag;           /* a receive or probe of TUTTI_ANY_TAG: looked for as an
                              any-source receive is (any_source set; seek_p1 its rank where
                              named), its env[3] the message's once found (exec.c) */
    int late_seq;          /* a receive from a named rank issued while an earlier one of
                              its tag could still take the same message (an any-source
                              receive that still looks, or another such): it takes its
                              sequence number, and is posted, after those (exec.c) */
    int probe;             /* tutti_probe (1) or tutti_iprobe (2: one look): a receive of its
                              peer and tag that is never numbered nor posted; it looks for the
                              message a receive would take, and reports it (exec.c) */
    int probe_found, probe_source, probe_dtype;
    uint32_t probe_tag;
    size_t probe_count;        /* what it found: the sender, its count and dtype as sent */
    struct tutti_message *msg; /* tutti_mprobe's: the probe, once it found its message,
                                  becomes a receive of it into this (exec.c) */
    int matched;               /* tutti_mprobe (1), tutti_improbe (2): the probe takes what it
                               finds */
    int upto;                  /* tutti_recv_upto: a receive of a message of up to upto_cap
                                  bytes (op.dtype's; a receive of u8 takes any dtype), looked
                                  for as an any-source receive is (any_source set, req.peer
                                  TUTTI_ANY_SOURCE until found) and posted as it came */
    int seek_p1;               /* such a receive from a named rank: that rank + 1 (0: any) */
    size_t upto_cap;
    uint64_t p2p_posted_ns; /* posted (in flight) then: its stall checks count from it */
    uint64_t p2p_deadline_ns;
    uint64_t defer_until_ns; /* issued deferred: the progress thread leaves it to a
                                 waiter until then (0: not deferred) */
    uint64_t issued_ns;      /* async: when it was issued (exec.c's deferral guess) */
    int guessed;             /* deferred on the guess, not by tt_exec_defer */
    /* tutti_work_on_done: bit 0 a callback is set, bit 1 the op completed; whichever side
     * sets its bit second calls the callback (exactly once, without a lock) */
    atomic_int cb_state;
    void (*cb)(void *arg, int status);
    void *cb_arg;
    struct tutti_work *cb_next; /* on comm->cb_head's list: its callback is due (exec.c) */
    struct tutti_work *inflight_next;
    struct tutti_work *next;
    char err[TT_ERRMSG_LEN];
};

/* tutti_mprobe's message, received: what tutti_mrecv copies out (exec.c) */
struct tutti_message {
    int rank, source; /* the receiving rank (for messages), and who sent it */
    uint32_t tag;
    size_t count;
    tutti_dtype_t dtype;
    size_t len;
    unsigned char data[]; /* len bytes */
};

#define TT_RECENT_CALLS 32

struct tutti_comm {
    int rank, nranks;
    /* the process that made it (tt_comm_foreign): a forked child shares its memory, not
     * its threads, and its sockets and rings only with the parent's use of them */
    pid_t owner_pid;
    tutti_comm_opts_t opts;          /* strings owned (strdup'ed) */
    tutti_store_t *store;            /* this communicator's prefixed view */
    tutti_store_t *owned_store;      /* opened by tutti_comm_init_env */
    tutti_store_t *split_store;      /* a split's reference to its parent's base store */
    tutti_store_t *uid_store;        /* tutti_comm_init_rank's own client of the id's store */
    tutti_store_t *uid_server;       /* and, in the id's maker, a reference to its server */
    unsigned split_seq;              /* tutti_comm_split calls on this communicator so far */
    unsigned shrink_seq;             /* tutti_comm_shrink calls on this communicator so far */
    unsigned agree_seq;              /* tutti_comm_agree calls on this communicator so far */
    unsigned grow_seq;               /* tutti_comm_grow calls on this communicator so far */
    tutti_store_t *qstore;           /* the same keys with a short default deadline: for store
                                 calls on failure paths and stall checks, which must not
                                 outlast the communicator's timeout (a dead store server
                                 is retried only this long) */
    uint64_t quick_ns;               /* tt_comm_quick_ms in ns, computed once (read per wait) */
    _Atomic uint64_t store_retry_ns; /* a failure path's store call failed: none before this
                                        (tt_now_ns), so ops do not each pay its deadline */
    char instance[128];              /* "<job id>/<nonce>": this job instance (host.instance) */
    /* job identity (job.c): the prefix of this job's communicator, a view of it for the
     * instance record, the job id, this instance's nonce and record */
    tutti_store_t *job_store;
    char job_base[512];
    char job_id[80];
    const char *job_src; /* where the job id came from ("TUTTI_JOB_ID", ...) */
    char nonce[40];
    char record[768];
    /* what the record says of TUTTI_ALGO, which every rank must share (job.c): "-" none,
     * "!" it did not parse (config_status), else 16 hex digits of the SHA-256 of its
     * canonical form (tt_algo_override_canon) */
    char algo_fp[20];
    /* a configuration error this rank found alone before it joined (TUTTI_ALGO,
     * TUTTI_COST_MODEL), held until then so that it fails as a joined rank: its reason
     * then ends the others' set-up waits (tt_job_init_failed) */
    int config_status;
    char config_error[TT_ERRMSG_LEN];
    /* set-up: 1 while tutti_comm_init runs (its long store waits watch for a peer's
     * failed set-up: setup.c, tt_init_store_get); a peer's failure found so, its status and
     * "rank R failed its set-up: ..." */
    atomic_int in_setup;
    uint64_t setup_checked_ns; /* the transports' last setup_check that read the store */
    int setup_peer_status;
    char setup_peer_why[TT_ERRMSG_LEN];
    char *secret; /* the job secret (NULL: authentication off) */
    size_t secret_len;
    char store_url[256];

    const tutti_transport_ops_v2_t *tp_ops;
    void *tp;
    void *tp_handle; /* dlopen handle of a plugin */
    tutti_tp_host_v2_t host;
    char *tune_spec;   /* rank 0's tuning-file line for this comm (TUTTI_COST_MODEL tune=) */
    char tp_name[64];  /* "tcp", or "shm+tcp" when several serve different peers */
    char host_id[256]; /* this host's identity (tpmux.c) */
    int *host_of;      /* rank -> host index (NULL: not exchanged, one transport for
                          every peer), nhosts of them (tpmux.c) */
    int nhosts;
    int host_ranks, host_cpus; /* ranks on this host and the CPUs they may run on between
                                  them, as the spin's "auto" counts them (tpmux.c) */
    int bind_cpu;              /* TUTTI_BIND: the CPU large collectives run on while this
                                  host is crowded, or -1 (tpmux.c, exec.c) */
    atomic_ulong bound_ops;    /* collectives that ran so (for the tests) */

    struct tt_algo_override *algo_ovr;
    tt_cost_t cost; /* the cost model's parameters (the same on every rank) */
    struct {        /* the last choice per collective (used by the thread
                                 running ops only): small messages skip the model */
        size_t bytes;
        const struct tt_algo *algo;
    } sel_cache[TT_COLL_COUNT_];
    char cost_desc[512];

    /* the struct's own life: 1 for the communicator until tutti_comm_destroy, 1 for each
     * work handle not yet freed, which may be waited for after the destroy; the last
     * one releases the locks and the memory (tt_exec_comm_unref). gone: destroyed, so a
     * work's wait reads only the work. */
    atomic_int refs;
    atomic_int gone;

    /* errors: the first failure sticks (the stream position with peers is unknown
     * after it); later operations fail at once with its status */
    pthread_mutex_t err_lock;
    char last_error[TT_ERRMSG_LEN];
    char tp_error[TT_ERRMSG_LEN]; /* the transport's latest explanation */
    int tp_error_peer;
    int tp_error_status;
    atomic_int tp_error_gen; /* counts transport failures */
    atomic_int failed;       /* 0, or the status of the failure */
    /* the first failure's message (under err_lock), which the calls refused after it
     * quote (exec.c): last_error is theirs by then */
    char failed_error[TT_ERRMSG_LEN];
    /* this process found not running (p2p.c): its peers may time out on it meanwhile */
    uint64_t op_end_ns;   /* when the last op ended */
    uint64_t stop_end_ns; /* when the last stop seen ended (0: none), */
    uint64_t stop_ns;     /* how long it was at least, */
    int stop_between_ops; /* and whether it was outside the library (maybe busy) */
    atomic_int aborted;
    atomic_int revoked;       /* 1: this rank called tutti_comm_revoke */
    atomic_int revoke_untold; /* 1: the revoke was the first failure, not yet sent to the
                                 peers (tt_fault_tell_revoke) */

    /* the op queue: ops run one at a time, in issue order, by whichever thread holds
     * `executing`: the caller of a blocking op, a waiter, or the progress thread */
    pthread_mutex_t q_lock;
    pthread_cond_t q_cv;    /* the progress thread waits for work */
    pthread_cond_t done_cv; /* waiters wait for completions */
    int done_waiters;       /* how many wait on done_cv (under q_lock) */
    tutti_work_t *q_head, *q_tail;
    int executing;
    int stopping; /* tutti_comm_destroy began: new calls are refused */
    int inside;   /* threads inside a call on it (an op's issue, a wait): the destroy
                     frees nothing until none is left (exec.c, tt_exec_drain) */
    /* works completed with a callback due: run by the thread holding `executing` once it
     * has let go of q_lock, and marked done after (exec.c, run_callbacks_locked) */
    tutti_work_t *cb_head, *cb_tail;
    atomic_int cb_running; /* callbacks of its works running now (exec.c's call_cb) */
    int defer_seen;        /* an op was issued deferred: the progress thread ticks */
    int defer_guess;       /* async ops are being waited for as soon as issued: defer the next */
    uint64_t next_seq;
    pthread_t worker;
    int worker_started;

    void *scratch[2];
    size_t scratch_len[2];

    /* the device layer that stages device buffers (lib/device/device.h; NULL: none,
     * every buffer is host memory) */
    const struct tt_dev_ops *dev;
    /* stream-ordered calls (tutti_comm_set_stream): the stream and its context (set by
     * the calling thread), the first failure since (status, message), and the staging
     * records whose blocks a stream still uses, under stage_lock */
    void *stream, *stream_ctx;
    atomic_int stream_st;
    char stream_err[TT_ERRMSG_LEN];
    struct tt_dev_stage *dev_pending;

    /* staging buffers of the coalesced collectives (stage, tt_comm_stage_*) and of
     * device buffers (dev_pool: lib/device/device.c's, pinned where the layer can), kept
     * between calls */
    pthread_mutex_t stage_lock;
    tt_stage_block_t stage[2];
    struct tt_dev_pool *dev_pool;

    tutti_work_t *inflight;      /* posted sends/recvs, in posting order */
    tutti_work_t *inflight_tail; /* its last (exec.c appends there, reap_inflight_locked
                                    keeps it) */
    uint64_t p2p_stall_next_ns;  /* their next stall check, not before (exec.c; the thread
                                   holding `executing`) */
    /* rooted calls' agreement messages not yet checked (agree.c): a ring of
     * opts.agree_lag records, the oldest at agree_head */
    struct tt_agree_rec *agree;
    int agree_head, agree_count, agree_calls; /* records, the calls they check */
    tt_confirm_batch_t confirm;               /* confirms not sent yet (agree.c) */
    /* the envelopes (tag 0) of this rank's last TT_RECENT_CALLS collectives, at seq %
     * TT_RECENT_CALLS: a mismatch that meets an earlier call's message says what this
     * rank did at that seq (fault.c). The thread running ops only. */
    uint64_t recent[TT_RECENT_CALLS][4];
    /* the flight recorder (trace.h): written under q_lock; trace_algo is the running
     * collective's algorithm, trace_due a failure's record to write (tt_trace_flush) */
    struct tt_trace *trace;
    atomic_uint trace_algo;
    atomic_int trace_due;
    atomic_int trace_dumped;    /* 1: written because a peer failed; 2: for its own failure */
    pthread_mutex_t trace_lock; /* one writer of the file at a time, */
    int trace_written;          /* and the level it holds (under trace_lock) */
    tutti_store_t *watch_store; /* tt_trace_watch's view (a short deadline), */
    uint64_t watch_next_ns;     /* when it looks next, */
    uint32_t watch_looks;       /* (looks so far: they spread the period) */
    int watch_off;              /* or 1: it does not (no trace_dir, a store error) */
    /* per (peer, tag): the sequence numbers of point-to-point messages, separate from
     * the collectives' (exec.c's p2p_seq: an open-addressing table, under q_lock) */
    struct tt_p2p_seq *p2p_seq;
    size_t p2p_seq_cap, p2p_seq_n;
    /* its topology (lib/coll/topo.c; NULL: none), set once when made, read-only after */
    struct tt_topo *topo;
    int any_next;                /* the peer the next any-source search probes first */
    int p2p_unordered;           /* a request went in flight with an earlier deadline than
                                    the one before it (tutti_comm_set_timeout lowered the
                                    timeout between their issues): the list's deadlines no
                                    longer follow its order until it is empty again (exec.c,
                                    `executing`) */
    int exec_wanted;             /* threads waiting to take `executing` for a short job
                                    (tutti_cancel): the drivers that take it in turns leave
                                    it to them (exec.c) */
    int unnumbered;              /* receives issued that have no number yet: any-source
                                    ones looking, late_seq ones (0: late_at_issue need not
                                    look; q_lock) */
    struct tutti_work *exec_p2p; /* the point-to-point work being posted (out of the queue,
                                    not yet in flight) */
    /* sends to this rank, copied at their turn, that no receive took yet (exec.c's
     * self_match; under `executing`) */
    struct tt_self_msg *self_q, *self_q_tail;
};

/* fault.c's copy of this process's pid (tt_comm_owner_pid, kept right in forked
 * children). tt_comm_foreign's test, inline for the entry points of the collectives and
 * send/recv: a load, not a call (coll_issue reads its table row before it: an opaque call
 * ahead of that read made gcc build the call descriptor with `rep stosq`, +20-30 ns a
 * 4-byte allreduce over shm; docs/benchmarks.md "The hundredth session",
 * tests/test_hot_path.sh). */
extern atomic_int tt_self_pid;

static inline int tt_comm_foreign_inline(const struct tutti_comm *comm)
{
    return __builtin_expect(comm->owner_pid !=
                                atomic_load_explicit(&tt_self_pid, memory_order_relaxed),
                            0);
}

/* The communicator's timeout as it is now (opts.timeout_ms): tutti_comm_set_timeout
 * writes it under q_lock, which its readers outside that lock may not hold. An op's own
 * bound is op->timeout_ms, read under q_lock when it was issued. */
static inline int tt_comm_timeout_ms(const struct tutti_comm *comm)
{
    return __atomic_load_n(&comm->opts.timeout_ms, __ATOMIC_RELAXED);
}

#endif /* TT_STATE_H */
