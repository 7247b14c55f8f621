/* One rank: each collective's data moves only within this rank's own buffers (the
 * "local" entries of the descriptor table, lib/coll/coll.c). */
#include <string.h>

#include "coll/algo.h"

/* allreduce, broadcast, reduce: the input is the result */
int tt_local_copy(tt_op_t *op)
{
    const char *s = op->sendbuf;
    char *r = op->recvbuf;
    if (r && s != r)
        memcpy(r, s, op->count * op->elem_size);
    return TUTTI_OK;
}

/* allgather, gather: this rank's block lands at its displacement */
int tt_local_gather(tt_op_t *op)
{
    const size_t es = op->elem_size;
    const char *s = op->sendbuf;
    char *r = op->recvbuf;
    if (r && s != r + op->rdispls[0] * es)
        memmove(r + op->rdispls[0] * es, s, op->recvcounts[0] * es);
    return TUTTI_OK;
}

int tt_local_reduce_scatter(tt_op_t *op)
{
    const size_t es = op->elem_size;
    const char *s = op->sendbuf;
    char *r = op->recvbuf;
    if (s != r)
        memmove(r, s + op->rdispls[0] * es, op->recvcounts[0] * es);
    return TUTTI_OK;
}

int tt_local_scatter(tt_op_t *op)
{
    const size_t es = op->elem_size;
    const char *s = op->sendbuf;
    char *r = op->recvbuf;
    if (r && r != s + op->sdispls[0] * es)
        memmove(r, s + op->sdispls[0] * es, op->sendcounts[0] * es);
    return TUTTI_OK;
}

int tt_local_alltoall(tt_op_t *op)
{
    const size_t es = op->elem_size;
    const char *s = op->sendbuf;
    char *r = op->recvbuf;
    if (s + op->sdispls[0] * es != r + op->rdispls[0] * es)
        memmove(r + op->rdispls[0] * es, s + op->sdispls[0] * es, op->sendcounts[0] * es);
    return TUTTI_OK;
}

/* barrier: nobody to wait for */
int tt_local_none(tt_op_t *op)
{
    (void)op;
    return TUTTI_OK;
}
