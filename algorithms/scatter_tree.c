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
#include <stdlib.h>
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

int tt_scatter_tree(tt_op_t *op)
{
    const int n = op->nranks, root = op->root;
    const int vr = (op->rank - root + n) % n;
    const size_t es = op->elem_size;
    const size_t *cnt = op->sendcounts, *dsp = op->sdispls;
    const unsigned char *send = op->sendbuf;

    /* the v form (env_count 0 on every rank): non-roots lack the other ranks' counts */
    if (op->env_count == 0)
        return tt_scatter_linear(op);

    int sub = n, lowbit = 0;
    if (vr) {
        lowbit = vr & -vr;
        sub = TT_MIN(lowbit, n - vr);
    }
    size_t *poff = malloc(((size_t)sub + 1) * sizeof(*poff));
    tt_req_t *reqs = calloc(8 * sizeof(int) + 1, sizeof(*reqs));
    int st = TUTTI_OK;
    if (!poff || !reqs) {
        st = TUTTI_ERR_NOMEM;
        goto out;
    }
    poff[0] = 0;
    for (int i = 0; i < sub; i++)
        poff[i + 1] = poff[i] + (i == 0 ? op->count : cnt[(vr + i + root) % n]);
    unsigned char *pk = tt_op_scratch(op, 0, TT_MAX(poff[sub] * es, (size_t)1));
    if (!pk) {
        st = TUTTI_ERR_NOMEM;
        goto out;
    }

    int top = 0; /* levels below lowbit (all of them at the root) */
    while ((1L << top) < (vr ? lowbit : n))
        top++;
    if (vr) {
        /* a leaf's whole subtree is its own block */
        void *dst = sub > 1 ? (void *)pk : op->recvbuf;
        TT_CHECK_GOTO(tt_p2p_recv(op, (vr - lowbit + root) % n, dst, poff[sub] * es,
                                  (uint32_t)top, &reqs[0]),
                      st, out);
        TT_CHECK_GOTO(tt_p2p_wait(op, &reqs[0]), st, out);
    }

    for (int level = top - 1; level >= 0; level--) {
        const long mask = 1L << level;
        if (vr + mask >= n)
            continue;
        const int c = (int)(vr + mask), csub = (int)TT_MIN(mask, n - c);
        const size_t len = poff[c - vr + csub] - poff[c - vr]; /* 0 goes too */
        const void *src = pk + poff[c - vr] * es;
        if (vr == 0) {
            int contig = 1;
            for (int i = c; i + 1 < c + csub && contig; i++) {
                int a = (i + root) % n, b = (i + 1 + root) % n;
                contig = dsp[b] == dsp[a] + cnt[a];
            }
            if (contig) {
                src = send + dsp[(c + root) % n] * es;
            } else {
                for (int i = c; i < c + csub; i++) {
                    int b = (i + root) % n;
                    if (cnt[b])
                        memcpy(pk + poff[i] * es, send + dsp[b] * es, cnt[b] * es);
                }
            }
        }
        TT_CHECK_GOTO(tt_p2p_send(op, (c + root) % n, src, len * es, (uint32_t)level,
                                  &reqs[level + 1]),
                      st, out);
    }

    /* this rank's own block: at the root from sendbuf (unless in place) */
    if (op->count) {
        const void *own = vr ? (const void *)pk : (const void *)(send + dsp[root] * es);
        if ((vr == 0 || sub > 1) && own != op->recvbuf)
            memcpy(op->recvbuf, own, op->count * es);
    }
    st = tt_p2p_wait_all(op, reqs, 8 * sizeof(int) + 1);
out:
    free(poff);
    free(reqs);
    return st;
}
