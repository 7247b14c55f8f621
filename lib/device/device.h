/* Device memory in user buffers, as a CUDA-aware MPI takes it: a communicator made
 * where a device layer is active asks it, at each call, whether the call's buffers are
 * device memory, and stages those through host memory (the copy in when the op starts,
 * in issue order with the others; the copy back, of the bytes the op writes, before it
 * completes). The host blocks are the communicator's, kept between calls (up to the
 * most bytes its ops have held at once) and page-locked where the layer can (pin).
 * Algorithms and transports see host memory only. The layers: cuda.c (the CUDA driver
 * API, loaded with dlopen: no build dependency) and, in tests, a fake whose device
 * memory the host cannot touch (tests/fakedev.c). */
#ifndef TT_DEVICE_H
#define TT_DEVICE_H

#include <stddef.h>

#include "core/op.h"

typedef struct tt_dev_ops {
    const char *name; /* "cuda"; in messages */
    /* 1 if p is device memory the host cannot read, with *ctx what copies of it need;
     * 2 for memory the host may touch that the device's streams use too (managed), *ctx
     * as for 1 (a stream-ordered call stages it as device memory); 0 for host memory
     * (pinned too); < 0 with err on a failure of the device's own */
    int (*query)(const void *p, void **ctx, char *err, size_t errlen);
    /* n bytes from src to dst, device to host (to_host) or host to device; returns
     * when they are where they go, so a later kernel on any stream sees them */
    int (*copy)(void *ctx, void *dst, const void *src, size_t n, int to_host, char *err,
                size_t errlen);
    /* Host memory [p, p + n) page-locked for copies from any of the device's contexts
     * (ctx: one of them, for the call), so that they run at the DMA engines' speed: 0,
     * or < 0 with err (the block is then used as it is). unpin: its undoing, in the same
     * ctx, before the memory is freed. Both NULL: the layer copies from any memory
     * alike. */
    int (*pin)(void *ctx, void *p, size_t n, char *err, size_t errlen);
    void (*unpin)(void *ctx, void *p);

    /* Stream-ordered calls (tutti_comm_set_stream); all NULL: the layer has none. Each
     * returns 0 or < 0 with err, in ctx (the stream's own, from stream_ctx). */
    int (*stream_ctx)(void *stream, void **ctx, char *err, size_t errlen);
    /* n bytes enqueued on stream, device to host (to_host) or host to device */
    int (*copy_async)(void *stream, void *ctx, void *dst, const void *src, size_t n, int to_host,
                      char *err, size_t errlen);
    /* an event recorded on stream (*ev: a new one, for event_query and event_free) */
    int (*event_record)(void *stream, void *ctx, void **ev, char *err, size_t errlen);
    /* 1: the stream has passed ev; 0: not yet; < 0: the layer failed */
    int (*event_query)(void *ctx, void *ev, char *err, size_t errlen);
    void (*event_free)(void *ctx, void *ev);
    /* stream waits until the 32-bit word at base + off (inside a pinned block) is
     * nonzero, before its later work */
    int (*wait_word)(void *stream, void *ctx, void *base, size_t off, char *err, size_t errlen);
    /* 1: stream is being captured into a graph; 0: not; < 0: failed. NULL: never */
    int (*stream_capturing)(void *stream, void *ctx, char *err, size_t errlen);
} tt_dev_ops_t;

/* The layer a communicator uses (NULL: none), from TUTTI_CUDA: "auto" (or unset): CUDA
 * where this process has loaded libcuda already; "on": load it (an error without it);
 * "off": none. tt_dev_override's layer, where set, wins. */
int tt_dev_resolve(const char *mode, const tt_dev_ops_t **ops_p, char *err, size_t errlen);

/* Tests: the layer every communicator made after this uses (NULL: TUTTI_CUDA's again). */
void tt_dev_override(const tt_dev_ops_t *ops);

/* CUDA's layer (cuda.c); load: dlopen libcuda.so.1 if this process has not. NULL with
 * err where there is no CUDA driver. */
const tt_dev_ops_t *tt_dev_cuda(int load, char *err, size_t errlen);

/* Whether p is device memory on comm's layer: 1 (*what: the layer's name), 0, or < 0
 * (the layer failed to say). For the calls that take host memory only (the fuser). */
int tt_dev_is_device(tt_comm_t *comm, const void *p, const char **what);

/* Stage op's device buffers (its collective's send and receive extents, from its
 * layout) into one host block and point the op at it (op->dev, NULL where no buffer is
 * device memory). streamed: a blocking call, which comm's stream (if set) orders, and
 * managed memory in it is staged as device memory. name: the call, for messages.
 * Nothing is copied yet. */
int tt_dev_stage_op(tt_comm_t *comm, tt_op_t *op, int streamed, const char *name);

/* Whether op (staged) is one a blocking call enqueues on comm's stream: device memory
 * in its buffers, a stream set. */
int tt_dev_streamed(const tt_comm_t *comm, const tt_op_t *op);

/* The bound on op's waits for its peers once it has started (tt_op_start): the op
 * timeout; for an op of a blocking call with a stream set (stream-ordered, or waiting
 * for the stream at the call), TUTTI_STREAM_TIMEOUT_MS more (no bound where that is
 * < 0): a peer's op of the same call may start that much later, when its own stream
 * gets there, and the ranks that were there first wait for it, as NCCL's do. */
int tt_dev_timeout_ms(const tt_op_t *op);

/* Enqueue op's staging on comm's stream (tutti_comm_set_stream): the copy in, an event
 * the op waits for when it starts, a wait for its end, the copy back, an event after
 * it. A failure is kept in the staging (the op fails when it starts, on every rank).
 * Returns 1 where the stream waits for the op, 0 where it does not: a failure before
 * the wait was enqueued, or an op that cannot be stream-ordered (its host block not
 * pinned, or host memory in its buffers: the stream's work so far is waited for); the
 * caller then waits for the op, and returns its error. */
int tt_dev_enqueue(tt_comm_t *comm, tt_op_t *op);

/* The calls a stream-ordered op cannot take: 0, or the error (set on comm) for a stream
 * being captured into a CUDA graph. */
int tt_dev_stream_check(tt_comm_t *comm, const char *name);

/* Wait for comm's stream's work so far (an op that runs as without a stream after all),
 * as a stream-ordered op waits for its copy in: until the communicator is aborted or
 * fails, or TUTTI_STREAM_TIMEOUT_MS passes; a failure (the timeout, the layer's) is op's,
 * which then fails when it starts, on every rank. */
void tt_dev_drain(tt_comm_t *comm, tt_op_t *op);

/* The same for a send (is_send: copied in) or a receive of len bytes at *buf. */
int tt_dev_stage_p2p(tt_comm_t *comm, tt_op_t *op, void **buf, size_t len, int is_send,
                     const char *name);

/* The op starts: its input copied from device memory (the bytes the op reads), or for a
 * stream-ordered op, the stream's copy of it waited for (until the communicator is
 * aborted or fails). < 0 with err (no rank or op in it: the caller's failure path adds
 * them) when the copy failed. */
int tt_dev_copy_in(tt_op_t *op, char *err, size_t errlen);

/* The communicator's staging blocks freed (unpinned first), at its destroy, after
 * those its streams still hold have been passed (a bounded wait). */
void tt_dev_free_blocks(tt_comm_t *comm);

/* The op's end: its device result copied back where st >= 0, the host block released;
 * for a stream-ordered op, its stream let go on (the copy back is the stream's), the
 * block kept until the stream has passed it, and a failure kept for
 * tutti_comm_stream_error.
 * Returns st, or TUTTI_ERR_DEVICE (err filled, naming the rank and the op) when the
 * copy back failed. No-op without op->dev. */
int tt_dev_finish(tt_op_t *op, int st, char *err, size_t errlen);

#endif /* TT_DEVICE_H */
