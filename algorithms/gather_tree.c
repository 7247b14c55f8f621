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
#include <stdlib.h>
#include <string.h>

#include "coll/algo.h"
#include "core/p2p.h"
#include "base/base.h"

int tt_gather_tree(tt_op_t *op)
{
    const int n = op->nranks, root = op->root;
    const int vr = (op->rank - root + n) % n;
    const size_t es = op->elem_size;
    const size_t *cnt = op->recvcounts, *dsp = op->rdispls;

    /* the v form (env_count 0 on every rank): non-roots lack the other ranks' counts */
    if (op->env_count == 0)
        return tt_gather_linear(op);

    int sub = n, lowbit = 0; /* the root's bound: no parent */
    if (vr) {
        lowbit = vr & -vr;
        sub = TT_MIN(lowbit, n - vr);
    }
    /* poff[i]: relative rank vr + i's place in the packed buffer */
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
    if (vr && sub > 1 && op->count)
        memcpy(pk, op->sendbuf, op->count * es);

    /* children: vr + 2^j for 2^j below lowbit (every 2^j < n at the root) */
    unsigned char *recv = op->recvbuf;
    int direct[8 * sizeof(int)] = {0};
    int level = 0;
    for (long mask = 1; mask < n && (vr == 0 || mask < lowbit); mask <<= 1, level++) {
        if (vr + mask >= n)
            break;
        const int c = (int)(vr + mask), csub = (int)TT_MIN(mask, n - c);
        const size_t len = poff[c - vr + csub] - poff[c - vr]; /* 0 goes too */
        void *dst = pk + poff[c - vr] * es;
        if (vr == 0) {
            /* straight into recvbuf if the child's blocks are back to back there */
            int contig = 1;
            for (int i = c; i + 1 < c + csub && contig; i++) {
                int a = (i + root) % n, b = (i + 1 + root) % n;
                contig = dsp[b] == dsp[a] + cnt[a];
            }
            if (contig) {
                dst = recv + dsp[(c + root) % n] * es;
                direct[level] = 1;
            }
        }
        TT_CHECK_GOTO(tt_p2p_recv(op, (c + root) % n, dst, len * es, (uint32_t)level,
                                  &reqs[level]),
                      st, out);
    }
    TT_CHECK_GOTO(tt_p2p_wait_all(op, reqs, 8 * sizeof(int) + 1), st, out);

    if (vr) {
        const void *src = sub > 1 ? (const void *)pk : op->sendbuf; /* a leaf: its input */
        int plevel = 0;
        while ((1 << plevel) != lowbit)
            plevel++;
        TT_CHECK_GOTO(tt_p2p_send(op, (vr - lowbit + root) % n, src, poff[sub] * es,
                                  (uint32_t)plevel, &reqs[0]),
                      st, out);
        TT_CHECK_GOTO(tt_p2p_wait(op, &reqs[0]), st, out);
        goto out;
    }

    /* the root: its own block (unless in place), then what landed in scratch */
    if (op->count && op->sendbuf != recv + dsp[root] * es)
        memcpy(recv + dsp[root] * es, op->sendbuf, op->count * es);
    level = 0;
    for (long mask = 1; mask < n; mask <<= 1, level++) {
        const int c = (int)mask, csub = (int)TT_MIN(mask, n - c);
        if (direct[level])
            continue;
        for (int i = c; i < c + csub; i++) {
            int b = (i + root) % n;
            if (cnt[b])
                memcpy(recv + dsp[b] * es, pk + poff[i] * es, cnt[b] * es);
        }
    }
out:
    free(poff);
    free(reqs);
    return st;
}
