/* The envelope: the 32-byte header every message carries (sequence number, the
 * collective's fingerprint, the envelope count, algorithm id and tag), its encoding,
 * the fingerprint inside it, and its description in error messages. */
#ifndef TT_ENVELOPE_H
#define TT_ENVELOPE_H

#include <stdint.h>

#include "core/op.h"

/* Fingerprint bit set by the v-forms (gatherv, allgatherv ...), whose envelope count is
 * 0: tells them from an equal-block call with count 0 in messages. */
#define TT_FP_V (1ull << 32)
/* Fingerprint bit of a call with a defined op that does not commute (it runs in rank
 * order): ranks that defined one value with and without TUTTI_REDOP_COMMUTATIVE differ
 * here, and messages say which. */
#define TT_FP_ORDERED (1ull << 33)

/* coll | dtype | redop | (TT_FP_V) | root: what every rank of one call must agree on.
 * Inline: computed on every issue. allgatherv and reduce_scatterv, which have no root,
 * carry a digest of their recvcounts there (tt_fp_layout): every rank must pass the
 * same, and a disagreement that keeps the total and every message's size the same is
 * otherwise seen by no one (the linear algorithms: the root's layout cuts the blocks). */
static inline uint64_t tt_fingerprint(tt_coll_t coll, tutti_dtype_t dtype, tutti_redop_t redop,
                                      int root)
{
    return ((uint64_t)coll << 56) | ((uint64_t)(dtype & 0xff) << 48) |
           ((uint64_t)(redop & 0xff) << 40) | (uint64_t)(uint32_t)root;
}

/* The root bits of allgatherv's and reduce_scatterv's fingerprint: recvcounts (n),
 * FNV-1a, folded to 32 bits */
static inline uint32_t tt_fp_layout(const size_t *counts, int n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 64; b += 8)
            h = (h ^ (((uint64_t)counts[i] >> b) & 0xff)) * 0x100000001b3ull;
    return (uint32_t)(h ^ h >> 32);
}

static inline tt_coll_t tt_fp_coll(uint64_t fp)
{
    return (tt_coll_t)(fp >> 56);
}

/* env[0] seq, env[1] fingerprint, env[2] count, env[3] algorithm id << 32 | tag. Inline:
 * every posted message is stamped with it. */
static inline void tt_env_encode(uint64_t env[4], uint64_t seq, uint64_t fp, uint64_t count,
                                 uint32_t algo_id, uint32_t tag)
{
    env[0] = seq;
    env[1] = fp;
    env[2] = count;
    env[3] = ((uint64_t)algo_id << 32) | tag;
}

/* env[3]'s top bit: the message's channel (transport_v2.h, TUTTI_TP_CHANNELS), set on
 * point-to-point messages: a transport with channels gives each to a receive of its own
 * channel, so they never land in a collective's receive. Out of the algorithm id. */
#define TT_ENV_P2P (1ull << 63)

static inline uint32_t tt_env_algo(const uint64_t env[4])
{
    return (uint32_t)(env[3] >> 32) & 0x7fffffffu;
}
static inline uint32_t tt_env_tag(const uint64_t env[4])
{
    return (uint32_t)env[3];
}

/* "allreduce", ..., "point-to-point" for a fingerprint's collective ("?" if none). */
const char *tt_fp_coll_name(uint64_t fp);

/* "reduce(count=10, f32, sum, root=0) seq 4 [tree tag 1, 40 bytes]" from an envelope;
 * op gives the rank count, and with `mine` (op sent it) the v-forms' own count; len
 * (size_t)-1: no message. */
void tt_describe_env(const uint64_t env[4], size_t len, const tt_op_t *op, int mine, char *buf,
                     size_t buflen);

#endif /* TT_ENVELOPE_H */
