/* Linear allgather: every rank sends its block to rank 0, which sends all of them back
 * to every rank in one message. Two rounds whatever the rank count, rank 0 handling
 * n - 1 messages each way: for small blocks where the ranks outnumber the CPUs and a
 * round (a wait for a rank to be scheduled) costs more than a message, as for the
 * linear barrier and allreduce.
 *
 * Any layout (allgatherv, displacements that differ between ranks): the blocks travel
 * back packed in rank order, straight from and into recvbuf where a rank's blocks lie
 * back to back there, else through a scratch buffer. A rank receives its own block
 * back too; rank 0 sends only after it has received every block whole, so that never
 * lands on a send still being read (in place).
 */
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

#include "common.h"

enum { LIN_TAG_IN = 1, LIN_TAG_OUT = 2 };

int tt_allgather_linear(tt_op_t *op)
{
    const int n = op->nranks, r = op->rank;
    const size_t es = op->elem_size, *cnt = op->recvcounts, *dsp = op->rdispls;
    unsigned char *recv = op->recvbuf;

    size_t total = 0;
    int contig = 1;
    for (int j = 0; j < n; j++) {
        total += cnt[j] * es;
        if (j + 1 < n && dsp[j + 1] != dsp[j] + cnt[j])
            contig = 0;
    }
    unsigned char none;
    unsigned char *whole = !total   ? &none
                           : contig ? recv + dsp[0] * es
                                    : tt_op_scratch(op, 0, total);
    if (!whole)
        return TUTTI_ERR_NOMEM;
    int copy_own;
    const unsigned char *own_src = tt_own_block_src(op, &copy_own);

    if (r != 0) {
        tt_req_t req[2];
        TT_CHECK(tt_p2p_send(op, 0, own_src, cnt[r] * es, LIN_TAG_IN, &req[0]));
        TT_CHECK(tt_p2p_recv(op, 0, whole, total, LIN_TAG_OUT, &req[1]));
        TT_CHECK(tt_p2p_wait_all(op, req, 2));
        for (size_t off = 0, j = 0; !contig && j < (size_t)n; off += cnt[j++] * es)
            tt_copy(recv + dsp[j] * es, whole + off, cnt[j] * es);
        return TUTTI_OK;
    }

    tt_reqs_t hold;
    tt_req_t *req = tt_reqs_get(&hold, (size_t)(n - 1));
    if (!req)
        return TUTTI_ERR_NOMEM;
    int rc = TUTTI_OK;
    for (int i = 1; i < n && rc == TUTTI_OK; i++)
        rc = tt_p2p_recv(op, i, recv + dsp[i] * es, cnt[i] * es, LIN_TAG_IN, &req[i - 1]);
    if (rc == TUTTI_OK && copy_own)
        tt_copy(recv + dsp[0] * es, op->sendbuf, cnt[0] * es);
    if (rc == TUTTI_OK)
        rc = tt_p2p_wait_all(op, req, (size_t)(n - 1));
    for (size_t off = 0, j = 0; rc == TUTTI_OK && !contig && j < (size_t)n; off += cnt[j++] * es)
        tt_copy(whole + off, recv + dsp[j] * es, cnt[j] * es);
    for (int i = 1; i < n && rc == TUTTI_OK; i++)
        rc = tt_p2p_send(op, i, whole, total, LIN_TAG_OUT, &req[i - 1]);
    if (rc == TUTTI_OK)
        rc = tt_p2p_wait_all(op, req, (size_t)(n - 1));
    tt_reqs_put(&hold);
    return rc;
}
