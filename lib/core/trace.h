/* The flight recorder: a ring of the communicator's last opts.trace_entries operations
 * (collectives, sends and receives) with their state, for finding where a job hung or
 * failed. Written by the executor under q_lock (exec.c); read by tutti_comm_trace_dump,
 * which takes q_lock to copy it; written to opts.trace_dir when the communicator
 * first fails (tt_trace_flush). docs/architecture.md, "The flight recorder". */
#ifndef TT_TRACE_H
#define TT_TRACE_H

#include <stdint.h>

#include "core/op.h"

/* With a trace_dir, an idle rank's progress thread looks this often at the count of
 * failed ranks (TT_FAILED_COUNT_KEY, fault.h; tt_trace_watch), so that a rank outside
 * the library when its peers failed writes its record too. */
#define TT_TRACE_WATCH_MS 1000

/* the states of a recorded op */
enum { TT_TRACE_ISSUED = 0, TT_TRACE_STARTED, TT_TRACE_DONE, TT_TRACE_FAILED };
/* tt_trace_ent_t.flags */
enum {
    TT_TRACE_F_SEND = 1,     /* point to point: a send (else a receive) */
    TT_TRACE_F_ASYNC = 2,    /* issued by an _async call */
    TT_TRACE_F_V = 4,        /* the v form of its collective (allgatherv ...) */
    TT_TRACE_F_ANY = 8,      /* a receive from any source */
    TT_TRACE_F_REDOP = 16,   /* a collective with a reduction (its args, coll.h) */
    TT_TRACE_F_ROOT = 32,    /* a collective with a root */
    TT_TRACE_F_EVICTED = 64, /* (dumps) still open, its slot taken by later ops */
    TT_TRACE_F_LATE = 128    /* a receive from a named rank without its number yet (it waits
                                behind an earlier any-source receive of its tag: exec.c) */
};

typedef struct tt_trace_ent {
    uint64_t id;    /* record number + 1 (0: an empty slot) */
    uint64_t seq;   /* the collective's sequence number, or the pair's p2p number */
    uint64_t count; /* elements */
    uint64_t t_issue, t_start, t_end; /* tt_coarse_ns; 0: not yet */
    int32_t status;
    int32_t root;  /* rooted collectives: the root; point to point: the peer (-1: any
                       source not yet matched) */
    int32_t redop; /* the caller's (AVG stays AVG) */
    uint32_t tag;
    uint32_t algo_id;
    uint8_t coll; /* tt_coll_t */
    uint8_t dtype;
    uint8_t state;
    uint8_t flags;
} tt_trace_ent_t;

typedef struct tt_trace {
    uint32_t n;    /* slots */
    uint64_t next; /* records made so far */
    tt_trace_ent_t ent[];
} tt_trace_t;

/* Allocate comm->trace for opts.trace_entries slots (none when 0). The two also bracket
 * the communicator's life for the log prefix (tt_log_comm_live, tt_log_comm_gone). */
int tt_trace_init(tutti_comm_t *comm);
void tt_trace_free(tutti_comm_t *comm);

/* With q_lock held. Record op as issued, or as started too (the executor's fast path
 * runs it at once); its trace_id set (0 when recording is off). */
void tt_trace_issue(tutti_comm_t *comm, tt_op_t *op, tutti_redop_t user_redop, int flags, int peer,
                    uint32_t tag, uint64_t now, int started);
/* With q_lock held. The op began running (or, point to point, was posted). */
void tt_trace_start(tutti_comm_t *comm, const tt_op_t *op, uint64_t now);
/* With q_lock held. A receive from any source found its sender (op->seq is the pair's
 * number now). */
void tt_trace_matched(tutti_comm_t *comm, const tt_op_t *op, int peer, uint32_t tag);
/* With q_lock held. The op ended with status (peer: a receive's sender, or -1); a failed
 * op of a failed or aborted communicator makes its record due (tt_trace_due). */
void tt_trace_end(tutti_comm_t *comm, const tt_op_t *op, int peer, int status);

/* The communicator failed: its record is to be written to opts.trace_dir at the next
 * tt_trace_flush. Any thread. */
void tt_trace_due(tutti_comm_t *comm);
/* Without q_lock held: write the record due, if any (once per communicator). */
void tt_trace_flush(tutti_comm_t *comm);

/* The progress thread, idle, with q_lock held: 1 when it is time to look whether a
 * peer failed (then tt_trace_watch without q_lock); else 0 and *wait_ns (when watching:
 * how long until the next look, else left as it is). */
int tt_trace_watch_due(tutti_comm_t *comm, uint64_t *wait_ns);
/* Without q_lock held: look, and write this rank's record if a peer failed. */
void tt_trace_watch(tutti_comm_t *comm);

#endif /* TT_TRACE_H */
