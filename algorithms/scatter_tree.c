/* Binomial tree scatter, the mirror of gather_tree: in relative ranks (rank - root mod
 * n), rank v receives the blocks of its subtree (relative ranks v .. v +
 * min(lowbit(v), n - v) - 1) packed in relative rank order from v minus its lowest set
 * bit, keeps the first and sends each child v + 2^j its part, the biggest first.
 * ceil(log2 n) rounds instead of the root sending n-1 messages: for small blocks on
 * many ranks.
 *
 * Every rank must know the sizes of its subtree's blocks, so this runs the equal-block
 * scatter only (sendcounts valid on every rank); for scatterv (env_count 0 on every
 * rank) it runs the linear algorithm instead.
 * The root sends a child's blocks straight from sendbuf when they are back to back
 * there, else packs them into scratch first. A leaf receives straight into recvbuf.
 */
#include <string.h>

#include "common.h"
#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

static int scatter_down(tt_op_t *op, const tt_btree_t *t)
{
    const int n = op->nranks, root = op->root;
    const size_t es = op->elem_size;
    const size_t *cnt = op->sendcounts, *dsp = op->sdispls;
    const unsigned char *send = op->sendbuf;
    const int vr = t->vr, sub = t->sub, lowbit = t->lowbit;
    int top = 0; /* levels below lowbit (all of them at the root) */
    while ((1L << top) < (vr ? lowbit : n))
        top++;
    if (vr) {
        /* a leaf's whole subtree is its own block */
        void *dst = sub > 1 ? (void *)t->pk : op->recvbuf;
        TT_CHECK(tt_p2p_recv(op, (vr - lowbit + root) % n, dst, t->poff[sub] * es, (uint32_t)top,
                             &t->reqs[0]));
        TT_CHECK(tt_p2p_wait(op, &t->reqs[0]));
    }

    for (int level = top - 1; level >= 0; level--) {
        const long mask = 1L << level;
        if (vr + mask >= n)
            continue;
        const int c = (int)(vr + mask), csub = (int)TT_MIN(mask, n - c);
        const size_t len = t->poff[c - vr + csub] - t->poff[c - vr]; /* 0 goes too */
        const void *src = t->pk + t->poff[c - vr] * es;
        if (vr == 0) {
            if (tt_btree_contig(op, cnt, dsp, c, csub)) {
                src = send + dsp[(c + root) % n] * es;
            } else {
                for (int i = c; i < c + csub; i++) {
                    int b = (i + root) % n;
                    if (cnt[b])
                        tt_copy(t->pk + t->poff[i] * es, send + dsp[b] * es, cnt[b] * es);
                }
            }
        }
        TT_CHECK(
            tt_p2p_send(op, (c + root) % n, src, len * es, (uint32_t)level, &t->reqs[level + 1]));
    }

    /* this rank's own block: at the root from sendbuf (unless in place; after the sends
     * where recvbuf lies on blocks being sent) */
    const int late = vr == 0 && tt_scatter_own_late(op);
    const void *own = vr ? (const void *)t->pk : (const void *)(send + dsp[root] * es);
    if (op->count && !late && (vr == 0 || sub > 1) && own != op->recvbuf)
        tt_copy(op->recvbuf, own, op->count * es);
    TT_CHECK(tt_p2p_wait_all(op, t->reqs, TT_BTREE_REQS));
    if (late)
        memmove(op->recvbuf, own, op->count * es);
    return TUTTI_OK;
}

int tt_scatter_tree(tt_op_t *op)
{
    return tt_btree_run(op, op->sendcounts, tt_scatter_linear, scatter_down);
}
