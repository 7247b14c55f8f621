/* The fuser's staging buffers, kept by the communicator between calls, and the size
 * below which a tensor is cheaper packed with others than sent alone. */
#include <pthread.h>
#include <stdlib.h>

#include "coll/algo.h"
#include "core/stage.h"
#include "core/state.h"

size_t tt_comm_pack_below(const tutti_comm_t *comm, int bcast)
{
    const tt_coll_t coll = bcast ? TT_COLL_BROADCAST : TT_COLL_ALLREDUCE;
    const tt_cost_t *c = &comm->cost;
    const tt_algo_t *a = tt_algo_select(comm->algo_ovr, c, coll, 0, comm->nranks,
                                        comm->opts.chunk_bytes);
    if (!a || comm->nranks < 2)
        return 0;
    /* with TUTTI_AGREE_LAG=0, the broadcast's confirm/release round is in the estimate */
    double lat = tt_cost_estimate(c, coll, a->name, 0, comm->nranks, comm->opts.chunk_bytes);
    double copy_us = (bcast ? 1 : 2) * c->gamma_ns * 1e-3; /* per byte: in, and out */
    double below = lat / copy_us;
    if (!(below > 0)) /* NaN (a model with an infinite term): converting it is undefined */
        return 0;
    return below > (double)((size_t)1 << 40) ? (size_t)1 << 40 : (size_t)below;
}

tt_stage_block_t tt_comm_pool_take(tutti_comm_t *comm, tt_stage_block_t pool[2], size_t bytes)
{
    tt_stage_block_t b = { 0 };
    pthread_mutex_lock(&comm->stage_lock);
    for (int i = 0; i < 2 && !b.p; i++) {
        if (pool[i].p && pool[i].len >= bytes) {
            b = pool[i];
            pool[i] = (tt_stage_block_t){ 0 };
        }
    }
    pthread_mutex_unlock(&comm->stage_lock);
    return b;
}

tt_stage_block_t tt_comm_pool_give(tutti_comm_t *comm, tt_stage_block_t pool[2], tt_stage_block_t b)
{
    if (!b.p)
        return b;
    pthread_mutex_lock(&comm->stage_lock);
    /* keep the two largest */
    int i = !pool[0].p ? 0 : !pool[1].p ? 1 : pool[0].len < pool[1].len ? 0 : 1;
    if (!pool[i].p || pool[i].len < b.len) {
        tt_stage_block_t old = pool[i];
        pool[i] = b;
        b = old;
    }
    pthread_mutex_unlock(&comm->stage_lock);
    return b;
}

void *tt_comm_stage_get(tutti_comm_t *comm, size_t bytes, size_t *cap_p)
{
    tt_stage_block_t b = tt_comm_pool_take(comm, comm->stage, bytes);
    *cap_p = b.p ? b.len : bytes ? bytes : 1;
    return b.p ? b.p : malloc(*cap_p);
}

void tt_comm_stage_put(tutti_comm_t *comm, void *buf, size_t cap)
{
    free(tt_comm_pool_give(comm, comm->stage, (tt_stage_block_t){ .p = buf, .len = cap }).p);
}
