/* Linear alltoall: every rank sends its n - 1 outgoing blocks to rank 0 in one message,
 * and rank 0 sends every rank its n - 1 incoming blocks back in one. Two rounds and
 * 2 (n - 1) messages, whatever the rank count, against pairwise's n (n - 1) messages
 * (all in flight at once) and Bruck's log2(n) dependent rounds: for small blocks where
 * the ranks outnumber the CPUs and each message, and each wait for a rank to be
 * scheduled, costs more than copying the blocks twice more through rank 0's cache, as
 * for the linear barrier, allreduce and allgather. Measured so over sockets; over shared
 * memory it was level with pairwise, which keeps the pick there (docs/architecture.md,
 * "Alltoall: linear").
 *
 * Rows and columns are packed: rank i's row holds its blocks for ranks i + 1, ..,
 * i + n - 1 (mod n) in that order; rank j's column holds the blocks from ranks j + 1, ..,
 * j + n - 1 (mod n). Uniform blocks only (alltoall, not alltoallv): rank 0 must know
 * every block's size; the v form runs pairwise. In place needs nothing more: every rank
 * packs what it sends before anything lands in recvbuf, and rank 0 fills its own
 * recvbuf only after it built every column.
 */
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

enum { LIN_TAG_IN = 1, LIN_TAG_OUT = 2 };

/* this rank's own block, from sendbuf to recvbuf (nothing to do in place) */
static void own_block(tt_op_t *op, size_t blk)
{
    const int r = op->rank;
    const size_t es = op->elem_size;
    const unsigned char *src = (const unsigned char *)op->sendbuf + op->sdispls[r] * es;
    unsigned char *dst = (unsigned char *)op->recvbuf + op->rdispls[r] * es;
    if (src != dst)
        memmove(dst, src, blk);
}

int tt_alltoall_linear(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size;
    if (!op->env_count || n < 3)
        return tt_alltoall_pairwise(op);
    const size_t blk = op->env_count * es;     /* every block, on every rank */
    const size_t line = (size_t)(n - 1) * blk; /* a row or a column */
    const unsigned char *send = op->sendbuf;
    unsigned char *recv = op->recvbuf;

    if (r != 0) {
        unsigned char *row = tt_op_scratch(op, 0, 2 * line);
        if (!row)
            return TUTTI_ERR_NOMEM;
        unsigned char *col = row + line;
        for (int k = 0; k < n - 1; k++)
            tt_copy(row + (size_t)k * blk, send + op->sdispls[(r + 1 + k) % n] * es, blk);
        own_block(op, blk);
        tt_req_t req[2];
        memset(req, 0, sizeof(req));
        TT_CHECK(tt_p2p_send(op, 0, row, line, LIN_TAG_IN, &req[0]));
        TT_CHECK(tt_p2p_recv(op, 0, col, line, LIN_TAG_OUT, &req[1]));
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
        for (int m = 0; m < n - 1; m++)
            tt_copy(recv + op->rdispls[(r + 1 + m) % n] * es, col + (size_t)m * blk, blk);
        return TUTTI_OK;
    }

    /* rank 0: rows 1..n-1 land in rows[(i - 1) line], columns 1..n-1 leave from
     * cols[(j - 1) line] */
    unsigned char *rows = tt_op_scratch(op, 0, 2 * (size_t)(n - 1) * line);
    if (!rows)
        return TUTTI_ERR_NOMEM;
    unsigned char *cols = rows + (size_t)(n - 1) * line;
    tt_reqs_t hold;
    tt_req_t *req = tt_reqs_get(&hold, (size_t)(n - 1));
    if (!req)
        return TUTTI_ERR_NOMEM;
    int rc = TUTTI_OK;
    for (int i = 1; i < n && rc == TUTTI_OK; i++)
        rc = tt_p2p_recv(op, i, rows + (size_t)(i - 1) * line, line, LIN_TAG_IN, &req[i - 1]);
    if (rc == TUTTI_OK)
        rc = tt_p2p_wait_all(op, req, (size_t)(n - 1));
    /* the block from rank i for rank j (i != j): rank 0's own in sendbuf, the others in
     * row i at slot j - i - 1 (mod n) */
    for (int j = 1; j < n && rc == TUTTI_OK; j++) {
        unsigned char *col = cols + (size_t)(j - 1) * line;
        for (int m = 0; m < n - 1; m++) {
            const int i = (j + 1 + m) % n;
            const unsigned char *src = i == 0 ? send + op->sdispls[j] * es
                                              : rows + (size_t)(i - 1) * line +
                                                    (size_t)((j - i - 1 + n) % n) * blk;
            tt_copy(col + (size_t)m * blk, src, blk);
        }
    }
    for (int j = 1; j < n && rc == TUTTI_OK; j++)
        rc = tt_p2p_send(op, j, cols + (size_t)(j - 1) * line, line, LIN_TAG_OUT, &req[j - 1]);
    if (rc == TUTTI_OK) {
        /* every column is built: recvbuf may now overwrite sendbuf (in place) */
        own_block(op, blk);
        for (int i = 1; i < n; i++)
            tt_copy(recv + op->rdispls[i] * es,
                    rows + (size_t)(i - 1) * line + (size_t)(n - i - 1) * blk, blk);
        rc = tt_p2p_wait_all(op, req, (size_t)(n - 1));
    }
    tt_reqs_put(&hold);
    return rc;
}
