/* Binomial tree gather: in relative ranks (rank - root mod n), rank v collects the
 * blocks of its subtree (relative ranks v .. v + min(lowbit(v), n - v) - 1) in a packed
 * scratch buffer, in relative rank order, and sends them to v minus its lowest set bit
 * as one message. ceil(log2 n) rounds instead of the root taking n-1 messages: for
 * small blocks on many ranks.
 *
 * Non-roots must know the sizes of their subtree's blocks, so this runs the equal-block
 * gather only (recvcounts valid on every rank); for gatherv (env_count 0 on every
 * rank) it runs the linear algorithm instead.
 * Children's receives are all posted at once, each into its own part of the buffer. The
 * root receives a child's blocks straight into recvbuf when they are back to back there
 * (no rotation, no gaps), else into scratch and copies them out.
 */
#include <string.h>

#include "common.h"
#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

static int gather_up(tt_op_t *op, const tt_btree_t *t)
{
    const int n = op->nranks, root = op->root;
    const size_t es = op->elem_size;
    const size_t *cnt = op->recvcounts, *dsp = op->rdispls;
    const int vr = t->vr, sub = t->sub, lowbit = t->lowbit;
    if (vr && sub > 1 && op->count)
        tt_copy(t->pk, op->sendbuf, op->count * es);

    /* the root's own block: copied now if sendbuf lies where a child's block will land */
    int copy_own = 0;
    if (vr == 0)
        tt_own_block_src(op, &copy_own);

    /* children: vr + 2^j for 2^j below lowbit (every 2^j < n at the root) */
    unsigned char *recv = op->recvbuf;
    int direct[8 * sizeof(int)] = { 0 };
    int level = 0;
    for (long mask = 1; mask < n && (vr == 0 || mask < lowbit); mask <<= 1, level++) {
        if (vr + mask >= n)
            break;
        const int c = (int)(vr + mask), csub = (int)TT_MIN(mask, n - c);
        const size_t len = t->poff[c - vr + csub] - t->poff[c - vr]; /* 0 goes too */
        void *dst = t->pk + t->poff[c - vr] * es;
        if (vr == 0) {
            /* straight into recvbuf if the child's blocks are back to back there */
            if (tt_btree_contig(op, cnt, dsp, c, csub)) {
                dst = recv + dsp[(c + root) % n] * es;
                direct[level] = 1;
            }
        }
        TT_CHECK(tt_p2p_recv(op, (c + root) % n, dst, len * es, (uint32_t)level, &t->reqs[level]));
    }
    TT_CHECK(tt_p2p_wait_all(op, t->reqs, TT_BTREE_REQS));

    if (vr) {
        const void *src = sub > 1 ? (const void *)t->pk : op->sendbuf; /* a leaf: its input */
        int plevel = 0;
        while ((1 << plevel) != lowbit)
            plevel++;
        TT_CHECK(tt_p2p_send(op, (vr - lowbit + root) % n, src, t->poff[sub] * es, (uint32_t)plevel,
                             &t->reqs[0]));
        TT_CHECK(tt_p2p_wait(op, &t->reqs[0]));
        return TUTTI_OK;
    }

    /* the root: its own block (unless in place), then what landed in scratch */
    if (copy_own)
        tt_copy(recv + dsp[root] * es, op->sendbuf, op->count * es);
    level = 0;
    for (long mask = 1; mask < n; mask <<= 1, level++) {
        const int c = (int)mask, csub = (int)TT_MIN(mask, n - c);
        if (direct[level])
            continue;
        for (int i = c; i < c + csub; i++) {
            int b = (i + root) % n;
            if (cnt[b])
                tt_copy(recv + dsp[b] * es, t->pk + t->poff[i] * es, cnt[b] * es);
        }
    }
    return TUTTI_OK;
}

int tt_gather_tree(tt_op_t *op)
{
    return tt_btree_run(op, op->recvcounts, tt_gather_linear, gather_up);
}
