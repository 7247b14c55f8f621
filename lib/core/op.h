/* The types an operation is made of (no functions): the running collective (tt_op_t)
 * as algorithms, the executor and failure handling see it, its collective (tt_coll_t)
 * and a posted request (tt_req_t). A leaf: every header that names an op includes it. */
#ifndef TT_OP_H
#define TT_OP_H

#include <stddef.h>
#include <stdint.h>

#include <tutti/transport_v2.h>
#include <tutti/tutti.h>

/* A posted send or receive, as algorithms hold it (opaque to them: they only pass it
 * to tt_p2p_*). It embeds the transport ABI's request, which post hands to the
 * transport by address (no copy), so ABI changes stay in p2p.c. */
typedef struct tt_req {
    tutti_tp_req_v2_t tp;
} tt_req_t;
typedef struct tutti_comm tt_comm_t;

typedef enum tt_coll {
    TT_COLL_NONE = 0,
    TT_COLL_ALLREDUCE,
    TT_COLL_BROADCAST,
    TT_COLL_BARRIER,
    TT_COLL_REDUCE,
    TT_COLL_ALLGATHER,      /* also allgatherv: counts/displs set */
    TT_COLL_REDUCE_SCATTER, /* also reduce_scatterv */
    TT_COLL_GATHER,         /* also gatherv */
    TT_COLL_SCATTER,        /* also scatterv */
    TT_COLL_ALLTOALL,       /* also alltoallv */
    TT_COLL_SCAN,           /* inclusive prefix reduction (MPI_Scan) */
    TT_COLL_EXSCAN,         /* exclusive prefix reduction (MPI_Exscan) */
    /* along a topology's edges (lib/coll/topo.h): also the v forms */
    TT_COLL_NEIGHBOR_ALLGATHER,
    TT_COLL_NEIGHBOR_ALLTOALL,
    TT_COLL_COUNT_,
    /* tutti_send/tutti_recv: no algorithms, so outside the table's range (exec.c) */
    TT_COLL_P2P = 64
} tt_coll_t;

/* One running collective, as an algorithm sees it. */
typedef struct tt_op {
    tt_comm_t *comm;
    int rank, nranks;
    tt_coll_t coll;
    /* TT_COLL_P2P: whether it is a probe (not numbered, no data), and the call, as its
     * errors name it ("send", "recv", "probe", "iprobe", "mprobe", "improbe": a literal).
     * (Fields ordered to leave no holes: a larger op made gcc zero it with `rep stosq`,
     * tests/test_hot_path.sh) */
    int p2p_probe;
    const char *p2p_name;
    const void *sendbuf; /* never TUTTI_IN_PLACE: equals recvbuf when in place (for
                              allgather: recvbuf + rdispls[rank]; for reduce_scatter
                              in place the input is recvbuf... see the layouts below);
                              for broadcast, the root's data (may equal recvbuf) */
    void *recvbuf;
    size_t count; /* elements */
    size_t elem_size;
    tutti_dtype_t dtype;
    tutti_redop_t redop; /* the reduction to apply (AVG arrives here as SUM) */
    int op_held;         /* 1: a defined redop held for this call (tt_userop_hold);
                            exec.c releases it when the call completes */
    float avg_scale;     /* fp16/fp8 AVG: the 2^k the input was scaled down by before the
                            algorithm (exec.c), which the AVG step undoes; 0: none */
    int root;
    /* Per-rank layouts, in elements, nranks entries each (never NULL for the
     * collectives below; the library fills them for the equal-block forms):
     *   allgather(v):      recvcounts/rdispls: where rank i's block lands in recvbuf;
     *                      this rank's input is sendbuf with recvcounts[rank] elements
     *                      (sendbuf == recvbuf + rdispls[rank] in place)
     *   reduce_scatter(v): recvcounts: block i of sendbuf (blocks back to back, in rank
     *                      order, rdispls = prefix sums) is reduced into rank i's
     *                      recvbuf, recvcounts[rank] elements
     *   gather(v):         recvcounts/rdispls at the root; count = this rank's input
     *   scatter(v):        sendcounts/sdispls at the root; count = this rank's output
     *   alltoall(v):       sendcounts/sdispls, recvcounts/rdispls
     *   neighbor_*:        sendcounts/sdispls by destination, recvcounts/rdispls by
     *                      source (the topology's degrees long, not nranks: the layout
     *                      block is 4 x max(nranks, degrees)); count = sum of sendcounts
     * `count` is: reduce, scan, exscan: elements; allgather/reduce_scatter: the total (sum of
     * recvcounts); gather/scatter: this rank's own block; alltoall: sum of sendcounts.
     * Layout arrays may differ between ranks only where MPI allows it (gatherv's
     * recvcounts matter at the root only, and so on). */
    const size_t *sendcounts, *sdispls;
    const size_t *recvcounts, *rdispls;
    size_t chunk_bytes; /* pipelining chunk (TUTTI_CHUNK_BYTES) */
    /* the collective's row of the descriptor table (coll.h), set where the call is
     * checked, so that the executor below it needs no reference to the table */
    const struct tt_coll_desc *desc;
    /* filled by the library for the envelope: */
    uint64_t seq;
    uint64_t fingerprint;
    uint64_t env_count; /* the count in envelopes: the same on every rank (0 where
                              per-rank layouts legitimately differ) */
    uint32_t algo_id;
    /* TUTTI_TP_HINT_* for every request the op posts (an algorithm sets it at its
     * start, e.g. single copy for exchanges where both sides wait anyway) */
    uint32_t tp_hints;
    int timeout_ms; /* the bound on its waits from its start: its communicator's timeout
                       when it was issued (tutti_comm_set_timeout changes later calls') */
    uint64_t deadline_ns;
    int tp_error_gen;       /* transport failures seen before this op started */
    int waited;             /* it went through tt_p2p_progress (a timed wait) */
    uint64_t stall_next_ns; /* when to run the next stall check (0: not yet set) */
    int stall_published;    /* stall/<rank> holds this op (waiting on stall_peer) */
    int stall_peer, stall_kind;
    int store_down;       /* a store call on a failure path failed: no more this op */
    uint64_t awake_ns;    /* when this rank last came back from a wait (0: not yet) */
    uint64_t trace_id;    /* its flight-recorder record (trace.h; 0: none), */
    uint64_t trace_t0;    /* when it was issued, */
    uint32_t trace_flags; /* and its TT_TRACE_F_* (kept here: a slot an open op had may be
                              taken by a later op, and the dump lists it from here) */
    uint64_t stopped_ns;  /* time this process was not running during the op (a
                              SIGSTOP, a debugger, starvation): not counted against
                              the deadline, and said in its error */

    /* its device buffers' host copies (lib/device/device.h; NULL: none) */
    struct tt_dev_stage *dev;
    /* a derived type's packed copies (lib/coll/packed.h; NULL: none) */
    struct tt_packed *packed;
} tt_op_t;

#endif /* TT_OP_H */
