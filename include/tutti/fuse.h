/* tutti fuser: bucketing and coalescing of many small tensors.
 *
 * A fuser packs registered tensors into buckets (one dtype each, at most a cap in
 * bytes) and launches one async allreduce per bucket as soon as its last tensor is
 * marked ready, so communication overlaps the computation that produces the rest.
 *
 *   tutti_fuse_create(&f, comm, &opts);
 *   for each tensor: tutti_fuse_register(f, data, count, dtype, &idx);
 *   each step: tutti_fuse_mark_ready(f, idx) for every tensor, any order, any thread;
 *              tutti_fuse_wait(f);            results are in the tensors
 *
 * Buckets are issued strictly in bucket order on every rank, whatever order tensors
 * become ready in, so ranks never call collectives in different orders. Unless the
 * layout is static, the first step records the order in which tensors became ready
 * (rank 0's order, broadcast at the end of that step) and rebuilds the buckets in that
 * order for later steps.
 *
 * Every rank must register the same tensors (count and dtype) in the same order, with
 * the same options. The first step checks: after its last bucket each rank issues one
 * small allreduce of a fingerprint of its list and options, and the first wait returns
 * TUTTI_ERR_MISMATCH on every rank when they differ, naming the first tensor that
 * differs and both ranks' entries in tutti_fuse_last_error; nothing is unpacked into
 * registered tensors then (bucket views already hold the mixed sums), and every later
 * mark and wait fails the same way, without communicating.
 *
 * fp16/bf16 compression casts an fp32/fp64 bucket down, allreduces it and casts it
 * back. Error: each input is rounded once (relative 2^-11 for fp16, 2^-8 for bf16) and
 * each of the up to nranks-1 partial sums is rounded again, so
 * |result - exact| <= nranks * u * sum_r |x_r| (u = 2^-11 fp16, 2^-8 bf16), plus
 * underflow below 6e-8 (fp16) and overflow above 65504 (fp16, inf). With TUTTI_AVG the
 * inputs are divided by the rank count before the cast (as DDP's hook does), which
 * keeps sums within range; the bound then holds for the average.
 */
#ifndef TUTTI_FUSE_H
#define TUTTI_FUSE_H

#include <stddef.h>

#include <tutti/tutti.h>

#include <tutti/export.h>

TUTTI_BEGIN_DECLS

typedef struct tutti_fuse tutti_fuse_t;

typedef enum tutti_fuse_compress {
    TUTTI_FUSE_COMPRESS_NONE = 0,
    TUTTI_FUSE_COMPRESS_FP16, /* fp32/fp64 buckets travel as fp16 */
    TUTTI_FUSE_COMPRESS_BF16, /* fp32/fp64 buckets travel as bf16 */
} tutti_fuse_compress_t;

/* One bucket, as a hook sees it: `count` elements of `dtype` at `data`, to be reduced
 * in place with `op` (TUTTI_SUM or TUTTI_AVG) over `nranks` ranks. */
typedef struct tutti_fuse_bucket {
    int index;
    void *data;
    size_t count;
    tutti_dtype_t dtype;
    tutti_redop_t op;
    int nranks;
} tutti_fuse_bucket_t;

/* A per-bucket communication hook (DDP's comm hook as a C API). `issue` runs when the
 * bucket is complete, on the thread that completed it (in bucket order, under the
 * fuser's lock, so it must not call this fuser's functions: they return
 * TUTTI_ERR_INVALID_ARG there instead of deadlocking; other fusers and comm are fine):
 * it queues async collectives on comm and returns in *work_p the handle
 * of the last one (ops complete in issue order), which leaves the reduced bucket in
 * bucket->data. `finish`, optional, runs in tutti_fuse_wait once that work is done,
 * before the bucket is unpacked. Both return a tutti status; an error reaches
 * tutti_fuse_wait. Every rank must issue the same collectives. If `issue` fails on
 * some ranks only, those ranks issue nothing for the bucket: the others' next
 * collectives then meet envelopes of a different sequence number or size and fail with
 * TUTTI_ERR_MISMATCH (or, if nothing follows, the stall check or the timeout names the
 * rank): every rank's wait returns an error, none hangs, but the step is lost. */
typedef struct tutti_fuse_hook {
    int (*issue)(void *arg, tutti_comm_t *comm, const tutti_fuse_bucket_t *bucket,
                 tutti_work_t **work_p);
    int (*finish)(void *arg, const tutti_fuse_bucket_t *bucket);
    void *arg;
} tutti_fuse_hook_t;

typedef struct tutti_fuse_opts {
    size_t size;                   /* sizeof(tutti_fuse_opts_t), set by tutti_fuse_opts_init */
    size_t bucket_cap_bytes;       /* bucket cap (default 25 MiB) */
    size_t first_bucket_cap_bytes; /* cap of the first bucket (default 1 MiB) */
    tutti_redop_t op;              /* TUTTI_SUM (default) or TUTTI_AVG */
    int compress;                  /* tutti_fuse_compress_t (default none); with a hook,
                                      create refuses it (compress inside the hook) */
    int static_layout;             /* 1: keep the registration-order layout for good */
    int bucket_views;              /* 1: tensors live inside the bucket buffers (register
                                      with data NULL, get it with tutti_fuse_tensor_data) */
    int find_unused;               /* 1: tensors may be declared unused; ranks compare
                                      their unused sets at every wait (one small allreduce) */
    const tutti_fuse_hook_t *hook; /* per-bucket hook (copied); NULL: allreduce */
    size_t last_bucket_cap_bytes;  /* cap of the bucket(s) of the tensors ready last
                                      (default 1 MiB; 0: no special last bucket). Its
                                      allreduce starts only when backward has ended, so
                                      it is the part that cannot overlap: keep it small */
    int min_buckets;               /* lower the bucket cap to 1/min_buckets of the
                                      registered bytes (not below 1 MiB), default 32:
                                      the step ends about one bucket after backward,
                                      so no bucket should be a large share. 0: off */
} tutti_fuse_opts_t;

/* tutti_fuse_opts_init reads TUTTI_FUSE_BUCKET_CAP, TUTTI_FUSE_FIRST_BUCKET_CAP,
 * TUTTI_FUSE_LAST_BUCKET_CAP (sizes: 25M, 512K, ...) and TUTTI_FUSE_MIN_BUCKETS over
 * the defaults. */

/* Fill opts with the defaults. */
int tutti_fuse_opts_init(tutti_fuse_opts_t *opts);

/* Create a fuser on comm (which must outlive it); opts may be NULL for defaults.
 * Local: no communication. */
int tutti_fuse_create(tutti_fuse_t **fuse_p, tutti_comm_t *comm, const tutti_fuse_opts_t *opts);

/* Free the fuser and its buffers; call it with no step in flight. NULL is ignored. */
int tutti_fuse_destroy(tutti_fuse_t *fuse);

/* Register a tensor of count elements of dtype at data (NULL with bucket views) and
 * return its index in *index_p. Every rank registers the same tensors in the same
 * order, all before the first step (checked at the first wait). A tensor of count 0
 * (data any pointer) has no bytes and no bucket: marking it does nothing, it is never
 * forgotten, tutti_fuse_tensor_data gives NULL and tutti_fuse_tensor_bucket -1. */
int tutti_fuse_register(tutti_fuse_t *fuse, void *data, size_t count, tutti_dtype_t dtype,
                        int *index_p);

/* The tensor's storage: the registered pointer, or with bucket views its place in its
 * bucket. A view moves once, when the first step's wait rebuilds the layout (its
 * contents move with it), also when that wait fails: read the pointer again after that
 * wait, whatever it returned (the old place is freed). */
int tutti_fuse_tensor_data(tutti_fuse_t *fuse, int index, void **data_p);

/* The tensor's values are final for this step: copy them into its bucket (nothing to
 * copy with views) and issue every bucket that is now complete, in bucket order.
 * Thread-safe and lock-free until a bucket completes; each tensor is marked once per
 * step (a second mark is TUTTI_ERR_INVALID_ARG; if two threads mark the same tensor at
 * the same moment, one call fails and that tensor's result for the step is undefined).
 * Marks belong between waits, never beside one. The buckets that the step's last
 * mark completes are left for tutti_fuse_wait, which runs them on its own thread
 * without a thread handoff; if wait has not started them within 200 us, the progress
 * thread does (within about 10 ms), so they complete even if this rank waits on
 * something else first. */
int tutti_fuse_mark_ready(tutti_fuse_t *fuse, int index);

/* Declare that the tensor will not be marked this step (needs find_unused): it counts
 * as zeros and keeps its own contents (a view reads zero). Every rank must declare the
 * same tensors; tutti_fuse_wait reports a difference as TUTTI_ERR_MISMATCH. */
int tutti_fuse_mark_unused(tutti_fuse_t *fuse, int index);

/* End the step: wait until every bucket is reduced and unpacked into its tensors.
 * Tensors neither marked nor declared unused go out as zeros (ranks stay in step) and
 * the wait returns TUTTI_ERR_INVALID_ARG. Returns the first error of any bucket. The
 * wait is itself collective at the end of the first step unless the layout is static
 * (it broadcasts the recorded order; where the registration check finds a difference,
 * a few small collectives name it) and with find_unused (one allreduce). */
int tutti_fuse_wait(tutti_fuse_t *fuse);

/* Number of buckets of the current layout. */
int tutti_fuse_num_buckets(tutti_fuse_t *fuse, int *n_p);

/* The bucket holding tensor `index` in the current layout. */
int tutti_fuse_tensor_bucket(tutti_fuse_t *fuse, int index, int *bucket_p);

/* What went wrong in this fuser ("" if nothing): the first error of the step in
 * progress, or of the last one until the next step fails (what follows from a first
 * error, such as a peer's mismatch, does not replace it); outside steps (register,
 * tensor_data ...), the last error. */
const char *tutti_fuse_last_error(const tutti_fuse_t *fuse);

/* Coalesced collectives: the n tensors bufs[i] (counts[i] elements of dtypes[i]) go out
 * packed into buffers of at most cap_bytes (0: 25 MiB), one collective per buffer, two
 * in flight. A tensor goes alone, in place, when it is at least the size below which
 * packing pays (tt_comm_pack_below, from the cost model: about 36 KB over shm and 360 KB
 * over tcp) or at least min(cap, 1 MiB). Collective: every rank passes the same n,
 * counts and dtypes. Unlike the fuser's, that is not checked (it would cost a
 * collective per call): lists that differ but pack into buffers of equal sizes (every
 * broadcast buffer is bytes) reduce or copy mismatched data silently. Broadcast copies
 * root's tensors into every rank's. */
int tutti_broadcast_coalesced(tutti_comm_t *comm, void *const *bufs, const size_t *counts,
                              const tutti_dtype_t *dtypes, int n, int root, size_t cap_bytes);

/* Allreduce of every tensor in place, tensors of one dtype packed together; op is any
 * op allreduce takes, defined ones included (tutti_redop_create). */
int tutti_allreduce_coalesced(tutti_comm_t *comm, void *const *bufs, const size_t *counts,
                              const tutti_dtype_t *dtypes, int n, tutti_redop_t op,
                              size_t cap_bytes);

TUTTI_END_DECLS
#endif /* TUTTI_FUSE_H */
