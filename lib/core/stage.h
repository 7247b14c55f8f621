/* The fuser's staging buffers and packing bound, kept by the communicator (stage.c). */
#ifndef TT_STAGE_H
#define TT_STAGE_H

#include <stddef.h>

#include "core/stage_types.h"

/* Below this many bytes a tensor is cheaper packed with others into one
 * broadcast (bcast) or allreduce than sent alone: the copies into and out of the pack
 * cost less than the collective's latency. From the cost model, so the same on every
 * rank. */
struct tutti_comm;
size_t tt_comm_pack_below(const struct tutti_comm *comm, int bcast);

/* A staging buffer of at least `bytes` (its capacity in *cap_p) for the
 * coalesced collectives, and its return with that capacity. The communicator keeps the
 * two largest returned (their pages stay mapped: a fresh megabyte from malloc is fresh
 * pages, and faulting them in on every call cost more than a broadcast of them over
 * tcp). get is malloc's NULL without memory. */
void *tt_comm_stage_get(struct tutti_comm *comm, size_t bytes, size_t *cap_p);
void tt_comm_stage_put(struct tutti_comm *comm, void *buf, size_t cap);

/* The same keeping for another pool of the communicator's (the device layer's pinned
 * blocks, lib/device/device.c), whose blocks carry what their owner needs to free them
 * (pin: the context they are pinned in, NULL where they are not). take: a block of at
 * least `bytes` from the pool, or a zero one (p NULL) where none is that large; give: b
 * back to the pool, returning the block the pool let go of (b itself, or a smaller one
 * it kept; p NULL: none) for the caller to free. */
tt_stage_block_t tt_comm_pool_take(struct tutti_comm *comm, tt_stage_block_t pool[2], size_t bytes);
tt_stage_block_t tt_comm_pool_give(struct tutti_comm *comm, tt_stage_block_t pool[2],
                                   tt_stage_block_t b);

#endif /* TT_STAGE_H */
