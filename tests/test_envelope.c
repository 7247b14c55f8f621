/* The envelope (lib/core/envelope.h): where the encoder puts each field (the transports
 * compare and print these words), the fingerprint's fields and its v-form bit, and the
 * descriptions error messages are made of (tests of the failures grep their words). */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include "coll/algo.h"
#include "core/envelope.h"
#include "harness.h"

static uint32_t algo_id(tt_coll_t coll, const char *name)
{
    const tt_algo_t *a = tt_algo_find(coll, name);
    ck_assert_ptr_nonnull(a);
    return a->id;
}

START_TEST(encode_layout)
{
    uint64_t env[4];
    uint64_t fp = tt_fingerprint(TT_COLL_REDUCE, TUTTI_FP32, TUTTI_MAX, 3);
    tt_env_encode(env, 7, fp, 1000, 0x1234, 0xfffffffeu);
    ck_assert_uint_eq(env[0], 7);
    ck_assert_uint_eq(env[1], fp);
    ck_assert_uint_eq(env[2], 1000);
    ck_assert_uint_eq(env[3], (0x1234ull << 32) | 0xfffffffeu);
    ck_assert_uint_eq(tt_env_algo(env), 0x1234);
    ck_assert_uint_eq(tt_env_tag(env), 0xfffffffeu);
}
END_TEST

START_TEST(fingerprint_fields)
{
    /* the largest root does not reach the v-form bit, nor the bit the redop */
    uint64_t fp = tt_fingerprint(TT_COLL_GATHER, TUTTI_BF16, TUTTI_AVG, INT32_MAX);
    ck_assert_int_eq(tt_fp_coll(fp), TT_COLL_GATHER);
    ck_assert_uint_eq(fp & TT_FP_V, 0);
    ck_assert_uint_eq((uint32_t)fp, (uint32_t)INT32_MAX);
    ck_assert_uint_eq((fp >> 48) & 0xff, TUTTI_BF16);
    ck_assert_uint_eq((fp >> 40) & 0xff, TUTTI_AVG);
    ck_assert_uint_ne(fp | TT_FP_V, fp);
    /* every field takes part: calls that differ in one differ in the fingerprint */
    ck_assert_uint_ne(fp, tt_fingerprint(TT_COLL_SCATTER, TUTTI_BF16, TUTTI_AVG, INT32_MAX));
    ck_assert_uint_ne(fp, tt_fingerprint(TT_COLL_GATHER, TUTTI_FP16, TUTTI_AVG, INT32_MAX));
    ck_assert_uint_ne(fp, tt_fingerprint(TT_COLL_GATHER, TUTTI_BF16, TUTTI_SUM, INT32_MAX));
    ck_assert_uint_ne(fp, tt_fingerprint(TT_COLL_GATHER, TUTTI_BF16, TUTTI_AVG, 0));
    ck_assert_str_eq(tt_fp_coll_name(fp), "gather");
    ck_assert_str_eq(tt_fp_coll_name(tt_fingerprint(TT_COLL_P2P, TUTTI_INT8, 0, 0)),
                     "point-to-point");
    ck_assert_str_eq(tt_fp_coll_name(tt_fingerprint(TT_COLL_COUNT_, TUTTI_INT8, 0, 0)), "?");
}
END_TEST

START_TEST(describe_collectives)
{
    tt_op_t op = { .rank = 1, .nranks = 4 };
    uint64_t env[4];
    char buf[256];
    tt_env_encode(env, 4, tt_fingerprint(TT_COLL_REDUCE, TUTTI_FP32, TUTTI_SUM, 0), 10,
                  algo_id(TT_COLL_REDUCE, "tree"), 1);
    tt_describe_env(env, 40, &op, 1, buf, sizeof(buf));
    ck_assert_str_eq(buf, "reduce(count=10, f32, sum, root=0) seq 4 [tree tag 1, 40 bytes]");
    /* allgather's envelope carries the total: said per rank; no message length */
    tt_env_encode(env, 9, tt_fingerprint(TT_COLL_ALLGATHER, TUTTI_INT32, 0, 0), 40,
                  algo_id(TT_COLL_ALLGATHER, "ring"), 0);
    tt_describe_env(env, (size_t)-1, &op, 0, buf, sizeof(buf));
    ck_assert_str_eq(buf, "allgather(count=10 per rank, i32) seq 9 [ring tag 0]");
    tt_env_encode(env, 2, tt_fingerprint(TT_COLL_BARRIER, TUTTI_UINT8, 0, 0), 0, 0xdead, 3);
    tt_describe_env(env, 0, &op, 0, buf, sizeof(buf));
    ck_assert_str_eq(buf, "barrier() seq 2 [? tag 3, 0 bytes]");
}
END_TEST

START_TEST(describe_v_and_p2p)
{
    size_t counts[3] = { 5, 6, 7 };
    tt_op_t op = { .rank = 1, .nranks = 3, .count = 6, .recvcounts = counts };
    uint64_t env[4];
    char buf[256];
    uint64_t fp = tt_fingerprint(TT_COLL_GATHER, TUTTI_FP64, 0, 2) | TT_FP_V;
    tt_env_encode(env, 5, fp, 0, algo_id(TT_COLL_GATHER, "linear"), 0);
    /* only the sender's own count can be told, and only from its own op */
    tt_describe_env(env, 48, &op, 1, buf, sizeof(buf));
    ck_assert_str_eq(buf,
                     "gatherv(f64, root=2; this rank's count=6) seq 5 [linear tag 0, 48 bytes]");
    tt_describe_env(env, 48, &op, 0, buf, sizeof(buf));
    ck_assert_str_eq(buf, "gatherv(f64, root=2) seq 5 [linear tag 0, 48 bytes]");
    /* reduce_scatterv (and allgatherv): the digest of recvcounts in the root's bits */
    fp = tt_fingerprint(TT_COLL_REDUCE_SCATTER, TUTTI_FP32, TUTTI_MIN,
                        (int)tt_fp_layout(counts, 3)) |
         TT_FP_V;
    tt_env_encode(env, 6, fp, 18, algo_id(TT_COLL_REDUCE_SCATTER, "ring"), 0);
    tt_describe_env(env, (size_t)-1, &op, 1, buf, sizeof(buf));
    char want[160];
    snprintf(want, sizeof(want),
             "reduce_scatterv(count=18 in all, recvcounts digest %08x, f32, min; this rank's "
             "count=6) seq 6 [ring tag 0]",
             (unsigned)tt_fp_layout(counts, 3));
    ck_assert_str_eq(buf, want);
    /* the digest tells layouts of one total apart, each count's place included */
    size_t moved[3] = { 6, 5, 7 }, same[3] = { 5, 6, 7 };
    ck_assert_uint_ne(tt_fp_layout(counts, 3), tt_fp_layout(moved, 3));
    ck_assert_uint_eq(tt_fp_layout(counts, 3), tt_fp_layout(same, 3));
    /* tutti_send/recv: no algorithm; the sequence number is the pair's message number */
    tt_env_encode(env, 12, tt_fingerprint(TT_COLL_P2P, TUTTI_INT8, 0, 0), 3, 0, 77);
    tt_describe_env(env, 3, &op, 0, buf, sizeof(buf));
    ck_assert_str_eq(buf, "point-to-point message #12 (count=3, i8, tag 77, 3 bytes)");
    /* a short buffer is cut, never overrun */
    memset(buf, 'x', sizeof(buf));
    tt_describe_env(env, 3, &op, 0, buf, 10);
    ck_assert_str_eq(buf, "point-to-");
    ck_assert_int_eq(buf[10], 'x');
}
END_TEST

int main(void)
{
    Suite *s = suite_create("envelope");
    th_add_tests(s, "encode", 30,
                 (const TTest *const[]){ encode_layout, fingerprint_fields, NULL });
    th_add_tests(s, "describe", 30,
                 (const TTest *const[]){ describe_collectives, describe_v_and_p2p, NULL });
    return th_main(s);
}
