/* Helpers shared by the algorithms, written against core/p2p.h as they are: the linear
 * rooted exchange (gather, scatter), the binomial tree's layout for the tree gather and
 * scatter, recursive doubling among a group, and where a rank's block lies in a buffer.
 */
#ifndef TT_ALGORITHMS_COMMON_H
#define TT_ALGORITHMS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/base.h"
#include "core/p2p.h"

/* requests a binomial tree rank may post: one a level and one for its parent */
#define TT_BTREE_REQS (8 * sizeof(int) + 1)

/* This rank's place in a binomial tree rooted at op->root, in relative ranks (rank -
 * root mod n), and the packed layout of its subtree's blocks. */
typedef struct {
    int vr;            /* relative rank */
    int lowbit;        /* vr's lowest set bit (the parent is vr - lowbit); 0 at the root */
    int sub;           /* ranks in the subtree: relative ranks vr .. vr + sub - 1 */
    size_t *poff;      /* poff[i]: relative rank vr + i's place in pk; poff[sub]: the total */
    unsigned char *pk; /* scratch 0, the subtree's blocks packed in relative rank order */
    tt_req_t *reqs;    /* TT_BTREE_REQS requests */
} tt_btree_t;

/* Fills *t_p for this rank; cnt: every rank's block count (this rank's is op->count).
 * On failure too *t_p is ready for tt_btree_free. */
int tt_btree_init(tt_op_t *op, const size_t *cnt, tt_btree_t *t_p);
void tt_btree_free(tt_btree_t *t);

/* Runs body on this rank's tree (cnt as for tt_btree_init), or linear instead for the v
 * form (env_count 0 on every rank): non-roots there lack the other ranks' counts. */
int tt_btree_run(tt_op_t *op, const size_t *cnt, int (*linear)(tt_op_t *),
                 int (*body)(tt_op_t *, const tt_btree_t *));

/* 1 if the blocks of relative ranks c .. c + csub - 1 lie back to back in the root's
 * buffer (layout cnt, dsp): then they travel straight from or to it */
int tt_btree_contig(const tt_op_t *op, const size_t *cnt, const size_t *dsp, int c, int csub);

/* The linear gather (to_root 1) or scatter (to_root 0) */
int tt_linear_rooted(tt_op_t *op, int to_root);

/* The root of a linear allreduce, reduce-scatter (root 0) or reduce: receives every
 * other rank's vector of op->count elements (bytes long, tag) into tmp, in rank order
 * without the root's (rank i's at (i < root ? i : i - 1) * bytes), waits for them all,
 * and reduces them in rank order into acc: rank 0's, rank 1's, ..., the root's own
 * being in (acc may be in). Before the root's turn the partial result gathers in rank
 * 0's slot, so an in-place root's input is read before anything lands on it. req: n - 1
 * requests. Nothing to reduce (bytes 0) still exchanges the envelopes. */
int tt_linear_reduce_root(tt_op_t *op, int root, const void *in, void *acc, size_t bytes,
                          uint32_t tag, unsigned char *tmp, tt_req_t *req);

/* A linear root's buffers: scratch 0 of n - 1 vectors of bytes (*tmp) and n - 1
 * requests (*req, from hold: tt_reqs_put it). TUTTI_ERR_NOMEM, or 0. */
int tt_linear_root_bufs(tt_op_t *op, size_t bytes, unsigned char **tmp, tt_reqs_t *hold,
                        tt_req_t **req);

/* Recursive doubling allreduce (allreduce_rd.c) of count elements among n ranks: grp[i]
 * is member i's rank (NULL: rank i), this rank is member r; from send (may equal recv)
 * into recv, tmp holding count elements; tags from tag0 up to tag0 + 16 + log2(n). */
int tt_rd_group(tt_op_t *op, const int *grp, int n, int r, const void *send, void *recv,
                size_t count, void *tmp, uint32_t tag0);

/* Where this rank sits among the hosts (the communicator's host map; without one every
 * rank is a host of its own): its host's ranks in rank order (local, nl of them, this
 * rank the li-th), the li-th rank of every host that has one (cross, in host order, nx
 * hosts, this rank's host xi) and S, the fewest ranks on any host (shards). Where every
 * host has nl ranks (even), grid[h * nl + c] is the c-th rank of host h; else grid is
 * NULL. For the hierarchical algorithms (allreduce_hier.c, allgather_hier.c,
 * reduce_scatter_hier.c). On failure too *h is ready for tt_hosts_free. */
typedef struct tt_hosts {
    int *local, nl, li;
    int *cross, nx, xi;
    int shards;
    int *grid;
} tt_hosts_t;
int tt_hosts_map(const tt_op_t *op, tt_hosts_t *h);
void tt_hosts_free(tt_hosts_t *h);

/* The hierarchical allgather and reduce-scatter send blocks of more than
 * TT_HIER_BLOCK_SEG_BYTES in segments (at most TT_HIER_BLOCK_SEGS): how many for blocks
 * of at most max_bytes (the same on every rank: recvcounts are), where segment k of K of
 * a block of c elements starts, and how long it is (the first c % K one longer). */
#define TT_HIER_BLOCK_SEG_BYTES ((size_t)1 << 20)
#define TT_HIER_BLOCK_SEGS 16
static inline int tt_hier_block_segs(size_t max_bytes)
{
    size_t k = (max_bytes + TT_HIER_BLOCK_SEG_BYTES - 1) / TT_HIER_BLOCK_SEG_BYTES;
    return k < 1 ? 1 : k > TT_HIER_BLOCK_SEGS ? TT_HIER_BLOCK_SEGS : (int)k;
}

static inline size_t tt_seg_off(size_t c, int K, int k)
{
    size_t base = c / (size_t)K, rem = c % (size_t)K;
    return base * (size_t)k + ((size_t)k < rem ? (size_t)k : rem);
}

static inline size_t tt_seg_len(size_t c, int K, int k)
{
    return c / (size_t)K + ((size_t)k < c % (size_t)K);
}

/* Scratch slots of a ring step that reduces what it receives (allreduce_ring.c,
 * allreduce_hier.c's local rings): its receives are posted this many chunks ahead of the
 * reduction, each into the slot a reduced chunk freed. A shm receiver pulls
 * (process_vm_readv) every record it has a receive for in one sweep, so with a whole
 * block posted the first wait pulled the block (8 MiB of a 2-rank 16 MiB allreduce) into
 * a block-sized scratch and the reduction read it back from memory; two slots keep the
 * chunk just pulled in cache for its reduction and one receive in flight while it runs
 * (docs/benchmarks.md, session 56). */
#define TT_RING_WINDOW 2

/* x mod m in 0 .. m - 1, for x of either sign */
/* tt_copy where the ranges may overlap (a send buffer anywhere inside the receive
 * buffer): tt_copy's forward vector and non-temporal loops would read bytes they had
 * already overwritten. */
static inline void tt_copy_overlapping(void *dst, const void *src, size_t n)
{
    const unsigned char *d = dst, *s = src;
    if (d + n <= s || s + n <= d)
        tt_copy(dst, src, n);
    else
        memmove(dst, src, n);
}

static inline int tt_mod(int x, int m)
{
    return ((x % m) + m) % m;
}

/* Blocks that travel in pieces (the reduce-scatters): elements per piece, from the op's
 * chunk_bytes (0: one piece per block); how many pieces a block of count elements
 * makes (an empty block still sends one, empty); and a piece's tag, which carries its
 * step s (0 <= s < n), its index k and whether it is the last of nk. Ranks that disagree
 * about a block's size then fail on a tag or a length instead of waiting for a piece
 * that will not come. */
static inline size_t tt_piece_elems(const tt_op_t *op)
{
    size_t p = op->chunk_bytes ? op->chunk_bytes / op->elem_size : SIZE_MAX;
    return p ? p : 1;
}

static inline size_t tt_pieces(size_t count, size_t piece)
{
    return count ? count / piece + (count % piece != 0) : 1;
}

/* Elements in piece k of a block of count elements (0 for the one piece of an empty
 * block); the piece starts at element k * piece. */
static inline size_t tt_piece_len(size_t count, size_t piece, size_t k)
{
    return count ? (piece < count - k * piece ? piece : count - k * piece) : 0;
}

static inline uint32_t tt_piece_tag(int n, int s, size_t k, size_t nk)
{
    uint64_t kl = (uint64_t)k * 2 + (k + 1 == nk);
    return (uint32_t)(kl * (uint64_t)n + (uint64_t)s); /* wraps alike on both ends */
}

/* rank j's block in buf, laid out by dsp */
static inline unsigned char *tt_blk(void *buf, const size_t *dsp, int j, size_t es)
{
    return (unsigned char *)buf + dsp[j] * es;
}

static inline const unsigned char *tt_cblk(const void *buf, const size_t *dsp, int j, size_t es)
{
    return (const unsigned char *)buf + dsp[j] * es;
}

/* Allgather out of place, and a gather's root: where this rank's block is read from.
 * From sendbuf, with the copy into its place in recvbuf left for *copy_later (done while
 * the first messages move), unless sendbuf lies among recvbuf's blocks (a caller passing
 * one buffer for both, not at its own block): then the copy comes first, before anything
 * lands there. Needs recvcounts, rdispls and recvbuf (at a gather, the root's). */
const unsigned char *tt_own_block_src(const tt_op_t *op, int *copy_later);

/* A scatter's root whose recvbuf lies among sendbuf's blocks, not at its own (a caller
 * passing one buffer for both): 1 when its own block must be written only after every
 * send is done (with memmove), since it lands on blocks still being sent. */
int tt_scatter_own_late(const tt_op_t *op);

#endif
