/* Derived datatypes in calls (lib/reduce/derived.h): an op on a derived type runs on a
 * packed copy. At the call, what the op reads is packed into a host block and the op is
 * made over into one of the type's predefined dtype (or bytes, for a mixed type), its
 * counts and displacements scaled to that dtype's elements, its buffers the block's;
 * when it completes, the runs it wrote are unpacked into the caller's buffer (only the
 * bytes the type's map covers) and the block freed. Algorithms, transports and the
 * envelope never see a derived type. Send and receive regions are always separate
 * copies (the send's taken at the call), so an overlap of the caller's buffers that the
 * packed form does not have is harmless: an in-place call reads its input from the
 * copy, as MPI's memmove rule reads it. */
#ifndef TT_PACKED_H
#define TT_PACKED_H

#include <stddef.h>

#include "core/op.h"
#include "reduce/derived.h"

/* The predefined dtype t moves as (bytes, TUTTI_UINT8, for a mixed type), *k_p of it
 * per element of t. */
tutti_dtype_t tt_packed_dtype(const tt_derived_t *t, size_t *k_p);

/* op (its fill done with elem_size the type's extent, buffers the caller's) made over
 * into its packed form, op->packed set (NULL where the type has no bytes: nothing
 * moves). Errors are comm's (name: the call): device memory in the buffers
 * (TUTTI_ERR_UNSUPPORTED), sizes that overflow, no memory. */
int tt_packed_stage_op(tt_comm_t *comm, tt_op_t *op, tt_derived_t *t, const char *name);

/* A send (is_send: packed now) or receive of count elements of *dtype at *buf (held:
 * its type, held by the caller; NULL: looked up), made over: *buf, *count and *dtype those of the packed form; op->packed its staging. */
int tt_packed_stage_p2p(tt_comm_t *comm, tt_op_t *op, void **buf, size_t *count,
                        tutti_dtype_t *dtype, tt_derived_t *held, int is_send, const char *name);

/* The op's end: where st >= 0, what it wrote unpacked (a receive: the bytes that came,
 * op->count of the packed dtype; its count and dtype then said in the caller's type, as
 * tutti_work_count and tutti_work_info report them); the block freed and the type let
 * go. Returns st. No-op without op->packed. */
int tt_packed_finish(tt_op_t *op, int st);

#endif /* TT_PACKED_H */
