/* The types of the rooted calls' agreement records (agree.c posts them, agree_ring.c
 * reads them, the communicator holds them: state.h), apart from either's functions so
 * that no header circle joins them. */
#ifndef TT_AGREE_TYPES_H
#define TT_AGREE_TYPES_H

#include "core/op.h"

/* A call, as its agreement check names it. */
typedef struct tt_agree_call {
    tt_coll_t coll;
    uint64_t seq, fingerprint, env_count;
    uint32_t algo_id;
    size_t count;
    tutti_dtype_t dtype;
    int root;
} tt_agree_call_t;

/* One record in the communicator's ring: a call's messages, or a batch of confirms or
 * of releases. */
typedef struct tt_agree_rec {
    tt_req_t *reqs; /* cap of them allocated, nreq in use */
    uint64_t *got;  /* the digests received: a confirm batch's root, one from each
                       non-root (cap of them); a release batch's non-root, the root's */
    int nreq, cap;
    tt_agree_call_t call; /* the call (a batch's last), to name it if its check fails */
    int ncalls;           /* calls it checks: 1, or a batch's (from seq0) */
    int batch;            /* a batch: TT_BATCH_CONFIRM (digests checked at its checker) or
                             TT_BATCH_RELEASE (checked at every other rank); 0: one call */
    uint64_t seq0, want;  /* a batch: its first call; its digest (sent, or expected) */
    int checker;          /* a batch: the rank that holds the confirms or sends the
                             releases, its first call's root */
} tt_agree_rec_t;

/* The kinds of batch: a broadcast's or scatter's confirms (non-roots to the root), a
 * reduce's, gather's or scan's releases (the root to the non-roots). */
#define TT_BATCH_CONFIRM 1
#define TT_BATCH_RELEASE 2

/* The calls whose agreement messages are not sent yet (comm->confirm): calls back to
 * back of one kind share one message, whose payload is a digest of every call's
 * envelope; the first call's root is the batch's checker, whatever the later calls'
 * roots. */
typedef struct tt_confirm_batch {
    int n;      /* calls in it (0: none) */
    int kind;   /* TT_BATCH_* */
    int passed; /* ops of no batch that went by since it opened */
    int root;   /* the checker: the first call's root */
    uint64_t seq0, digest;
    tt_agree_call_t last;
} tt_confirm_batch_t;

#endif /* TT_AGREE_TYPES_H */
