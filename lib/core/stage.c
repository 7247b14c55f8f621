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
    return below > (double)((size_t)1 << 40) ? (size_t)1 << 40 : (size_t)below;
}

void *tt_comm_stage_get(tutti_comm_t *comm, size_t bytes, size_t *cap_p)
{
    void *buf = NULL;
    *cap_p = bytes ? bytes : 1;
    pthread_mutex_lock(&comm->stage_lock);
    for (int i = 0; i < 2 && !buf; i++) {
        if (comm->stage[i] && comm->stage_len[i] >= bytes) {
            buf = comm->stage[i];
            *cap_p = comm->stage_len[i];
            comm->stage[i] = NULL;
        }
    }
    pthread_mutex_unlock(&comm->stage_lock);
    return buf ? buf : malloc(*cap_p);
}

void tt_comm_stage_put(tutti_comm_t *comm, void *buf, size_t cap)
{
    if (!buf)
        return;
    pthread_mutex_lock(&comm->stage_lock);
    /* keep the two largest */
    int i = !comm->stage[0]                           ? 0
            : !comm->stage[1]                         ? 1
            : comm->stage_len[0] < comm->stage_len[1] ? 0
                                                      : 1;
    if (!comm->stage[i] || comm->stage_len[i] < cap) {
        void *old = comm->stage[i];
        comm->stage[i] = buf;
        comm->stage_len[i] = cap;
        buf = old;
    }
    pthread_mutex_unlock(&comm->stage_lock);
    free(buf);
}
