/* Which bytes of a call's buffers its op reads and writes, from the op's layout: what the
 * device staging copies in and back (lib/device/device.c) and what a derived type's
 * packing packs and unpacks (lib/coll/packed.c). The fill (coll.c) made sendbuf an
 * address (never TUTTI_IN_PLACE) and the layouts whole where they matter; sizes are in
 * bytes of op->elem_size elements. */
#ifndef TT_EXTENT_H
#define TT_EXTENT_H

#include <stddef.h>

#include "core/op.h"

/* The bytes op reads from sendbuf (*sl) and the span of recvbuf it writes in (*rl). */
void tt_op_extents(const tt_op_t *op, size_t *sl, size_t *rl);

/* The runs of recvbuf the op writes (user addresses), as the algorithms write them: a
 * block per rank for the gathers and alltoall (not this rank's own block where it is in
 * place already), nothing at a broadcast's root that broadcasts in place, at a reduce's
 * or gather's other ranks, at exscan's rank 0, at a scatter's root whose block stays in
 * sendbuf. add(ctx, p, len) for each (len > 0), at most tt_op_runs_max of them; returns
 * how many. */
typedef void (*tt_run_fn)(void *ctx, char *p, size_t len);
int tt_op_written(const tt_op_t *op, tt_run_fn add, void *ctx);
int tt_op_runs_max(const tt_op_t *op);

#endif /* TT_EXTENT_H */
