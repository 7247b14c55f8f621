/* One rank: each collective's data moves only within this rank's own buffers (the
 * "local" entries of the descriptor table, lib/coll/coll.c). */
#include <string.h>

#include "coll/algo.h"

/* Buffers may overlap (in place forms); dst NULL: nothing to receive. */
static void move(void *dst, const void *src, size_t bytes)
{
    if (dst && dst != src)
        memmove(dst, src, bytes);
}

/* allreduce, broadcast, reduce: the input is the result */
int tt_local_copy(tt_op_t *op)
{
    move(op->recvbuf, op->sendbuf, op->count * op->elem_size);
    return TUTTI_OK;
}

/* allgather, gather: this rank's block lands at its displacement */
int tt_local_gather(tt_op_t *op)
{
    const size_t es = op->elem_size;
    char *r = op->recvbuf;
    move(r ? r + op->rdispls[0] * es : NULL, op->sendbuf, op->recvcounts[0] * es);
    return TUTTI_OK;
}

int tt_local_reduce_scatter(tt_op_t *op)
{
    const size_t es = op->elem_size;
    move(op->recvbuf, (const char *)op->sendbuf + op->rdispls[0] * es, op->recvcounts[0] * es);
    return TUTTI_OK;
}

int tt_local_scatter(tt_op_t *op)
{
    const size_t es = op->elem_size;
    move(op->recvbuf, (const char *)op->sendbuf + op->sdispls[0] * es, op->sendcounts[0] * es);
    return TUTTI_OK;
}

int tt_local_alltoall(tt_op_t *op)
{
    const size_t es = op->elem_size;
    char *r = op->recvbuf;
    move(r ? r + op->rdispls[0] * es : NULL, (const char *)op->sendbuf + op->sdispls[0] * es,
         op->sendcounts[0] * es);
    return TUTTI_OK;
}

/* barrier: nobody to wait for */
int tt_local_none(tt_op_t *op)
{
    (void)op;
    return TUTTI_OK;
}
