/* Envelopes described for error messages: what a rank's call was, from the envelope of
 * one of its messages (encoding and the fingerprint are inline in envelope.h). */
#include <stdio.h>

#include "coll/names.h"
#include "core/envelope.h"

static const char *algo_name_by_id(uint32_t id)
{
    const char *name = tt_algo_name(id);
    return name ? name : "?";
}

const char *tt_fp_coll_name(uint64_t fp)
{
    tt_coll_t c = tt_fp_coll(fp);
    const char *name = tt_coll_name(c);
    return c == TT_COLL_P2P ? "point-to-point" : name ? name : "?";
}

/* What a rank's call was, from an envelope: op, count, dtype, redop and root where they
 * apply, the algorithm, the message. Counts are what the user passed (allgather's and
 * reduce_scatter's per rank, not the envelope's total); the v-forms' envelopes carry
 * none, so only this rank's own count can be told (`mine`: op is the sender's). */
void tt_describe_env(const uint64_t env[4], size_t len, const tt_op_t *op, int mine, char *buf,
                     size_t buflen)
{
    tt_coll_t coll = tt_fp_coll(env[1]);
    tutti_dtype_t dtype = (tutti_dtype_t)((env[1] >> 48) & 0xff);
    tutti_redop_t redop = (tutti_redop_t)((env[1] >> 40) & 0xff);
    int root = (int)(uint32_t)env[1];
    int is_v = (env[1] & TT_FP_V) != 0;
    const char *cname = tt_coll_name(coll);
    const char *algo = algo_name_by_id(tt_env_algo(env));
    unsigned tag = (unsigned)tt_env_tag(env);
    unsigned long long count = env[2], n = op && op->nranks > 0 ? (unsigned)op->nranks : 1;
    char msglen[48] = "";
    if (len != (size_t)-1)
        snprintf(msglen, sizeof(msglen), ", %zu bytes", len);
    if (coll == TT_COLL_P2P) {
        snprintf(buf, buflen, "point-to-point message #%llu (count=%llu, %s, tag %u%s)",
                 (unsigned long long)env[0], count, tutti_dtype_name(dtype), tag, msglen);
        return;
    }
    int has_redop = coll == TT_COLL_ALLREDUCE || coll == TT_COLL_REDUCE ||
                    coll == TT_COLL_REDUCE_SCATTER || coll == TT_COLL_SCAN ||
                    coll == TT_COLL_EXSCAN;
    int has_root = coll == TT_COLL_BROADCAST || coll == TT_COLL_REDUCE || coll == TT_COLL_GATHER ||
                   coll == TT_COLL_SCATTER;
    char args[160] = "";
    size_t k = 0;
#define ARG(...)                                                                                   \
    (k += (size_t)snprintf(args + k, k < sizeof(args) ? sizeof(args) - k : 0, __VA_ARGS__))
    /* allgather(v) and reduce_scatter(v) envelopes carry the total, the other v-forms
     * nothing (their layouts differ between ranks) */
    int total = coll == TT_COLL_ALLGATHER || coll == TT_COLL_REDUCE_SCATTER;
    if (coll != TT_COLL_BARRIER) {
        if (!is_v)
            ARG("count=%llu%s, ", total ? count / n : count, total ? " per rank" : "");
        else if (total) /* and the digest of recvcounts, which every rank must share */
            ARG("count=%llu in all, recvcounts digest %08x, ", count, (unsigned)root);
        ARG("%s", tutti_dtype_name(dtype));
        if (has_redop)
            ARG(", %s%s", tutti_redop_name(redop),
                env[1] & TT_FP_ORDERED ? " (in rank order)" : "");
        if (has_root)
            ARG(", root=%d", root);
        if (is_v && mine && op) {
            /* what only this rank knows: its own part of the layout */
            if (coll == TT_COLL_ALLTOALL || coll == TT_COLL_NEIGHBOR_ALLGATHER ||
                coll == TT_COLL_NEIGHBOR_ALLTOALL)
                ARG("; this rank sends %zu in all", op->count);
            else
                ARG("; this rank's count=%zu",
                    total ? (op->recvcounts ? op->recvcounts[op->rank] : 0) : op->count);
        }
    }
#undef ARG
    snprintf(buf, buflen, "%s%s(%s) seq %llu [%s tag %u%s]", cname ? cname : "?", is_v ? "v" : "",
             args, (unsigned long long)env[0], algo, tag, msglen);
}
