/* The algorithm table and TUTTI_ALGO for the collectives of issue 3: every collective
 * name parses, every algorithm can be forced, bounds pick by size, bad strings fail
 * with a message that names what was expected, ids are unique, and the defaults are
 * what the model says. */
#include <check.h>
#include <string.h>

#include "algo.h"
#include "internal.h"

static const char *pick(const tt_algo_override_t *ovr, tt_coll_t coll, size_t bytes, int n)
{
    const tt_algo_t *a = tt_algo_select(ovr, coll, bytes, n);
    return a ? a->name : "NULL";
}

START_TEST(names)
{
    static const char *const names[] = {"reduce", "allgather", "reduce_scatter",
                                        "gather", "scatter",   "alltoall"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        tt_coll_t c = tt_coll_parse(names[i]);
        ck_assert_int_ne(c, TT_COLL_NONE);
        ck_assert_str_eq(tt_coll_name(c), names[i]);
    }
    ck_assert_int_eq(tt_coll_parse("reduce-scatter"), TT_COLL_NONE);
    ck_assert_ptr_null(tt_coll_name(TT_COLL_COUNT_));
}
END_TEST

START_TEST(ids_unique)
{
    size_t n;
    const tt_algo_t *const *all = tt_algo_all(&n);
    ck_assert_uint_eq(n, 19);
    for (size_t i = 0; i < n; i++) {
        ck_assert_uint_ne(all[i]->id, 0);
        ck_assert_ptr_nonnull(all[i]->run);
        for (size_t j = 0; j < i; j++) {
            ck_assert_uint_ne(all[i]->id, all[j]->id);
            ck_assert_msg(all[i]->coll != all[j]->coll || strcmp(all[i]->name, all[j]->name),
                          "%s twice", all[i]->name);
        }
    }
}
END_TEST

START_TEST(force_each)
{
    static const struct { tt_coll_t coll; const char *spec, *name; } cases[] = {
        {TT_COLL_REDUCE, "reduce:tree", "tree"},
        {TT_COLL_REDUCE, "reduce:ring", "ring"},
        {TT_COLL_ALLGATHER, "allgather:ring", "ring"},
        {TT_COLL_ALLGATHER, "allgather:rd", "rd"},
        {TT_COLL_REDUCE_SCATTER, "reduce_scatter:ring", "ring"},
        {TT_COLL_REDUCE_SCATTER, "reduce_scatter:pairwise", "pairwise"},
        {TT_COLL_GATHER, "gather:linear", "linear"},
        {TT_COLL_GATHER, "gather:tree", "tree"},
        {TT_COLL_SCATTER, "scatter:linear", "linear"},
        {TT_COLL_SCATTER, "scatter:tree", "tree"},
        {TT_COLL_ALLTOALL, "alltoall:pairwise", "pairwise"},
        {TT_COLL_ALLTOALL, "alltoall:ring", "ring"},
        {TT_COLL_ALLREDUCE, "allreduce:hd", "hd"},
        {TT_COLL_ALLREDUCE, "allreduce:dbtree", "dbtree"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tt_algo_override_t *ovr = NULL;
        char err[256];
        ck_assert_int_eq(tt_algo_override_parse(cases[i].spec, &ovr, err, sizeof(err)),
                         TUTTI_OK);
        ck_assert_str_eq(pick(ovr, cases[i].coll, 1, 8), cases[i].name);
        ck_assert_str_eq(pick(ovr, cases[i].coll, (size_t)1 << 30, 8), cases[i].name);
        ck_assert_ptr_eq(tt_algo_find(cases[i].coll, cases[i].name),
                         tt_algo_select(ovr, cases[i].coll, 1, 8));
        tt_algo_override_free(ovr);
    }
}
END_TEST

START_TEST(bounds_and_bare)
{
    tt_algo_override_t *ovr = NULL;
    char err[256];
    ck_assert_int_eq(tt_algo_override_parse("reduce:ring@<4K,tree; alltoall : ring ;"
                                            "gather:tree@<64K",
                                            &ovr, err, sizeof(err)),
                     TUTTI_OK);
    ck_assert_str_eq(pick(ovr, TT_COLL_REDUCE, 100, 2), "ring");
    ck_assert_str_eq(pick(ovr, TT_COLL_REDUCE, 4096, 2), "tree");
    ck_assert_str_eq(pick(ovr, TT_COLL_ALLTOALL, 1 << 20, 2), "ring");
    ck_assert_str_eq(pick(ovr, TT_COLL_GATHER, 100, 2), "tree");
    /* past the bound: the default model (linear on few ranks) */
    ck_assert_str_eq(pick(ovr, TT_COLL_GATHER, 1 << 20, 2), "linear");
    tt_algo_override_free(ovr);

    /* a bare name: every collective that has it */
    ck_assert_int_eq(tt_algo_override_parse("pairwise", &ovr, err, sizeof(err)), TUTTI_OK);
    ck_assert_str_eq(pick(ovr, TT_COLL_REDUCE_SCATTER, 1, 4), "pairwise");
    ck_assert_str_eq(pick(ovr, TT_COLL_ALLTOALL, 1, 4), "pairwise");
    ck_assert_str_eq(pick(ovr, TT_COLL_ALLREDUCE, 1, 4), "rd"); /* untouched: default */
    tt_algo_override_free(ovr);
    ck_assert_int_eq(tt_algo_override_parse("linear", &ovr, err, sizeof(err)), TUTTI_OK);
    ck_assert_str_eq(pick(ovr, TT_COLL_GATHER, 1, 64), "linear");
    ck_assert_str_eq(pick(ovr, TT_COLL_SCATTER, 1, 64), "linear");
    tt_algo_override_free(ovr);
}
END_TEST

START_TEST(bad_strings)
{
    static const struct { const char *spec, *needle; } cases[] = {
        {"reduce:linear", "expected one of: tree, ring"},
        {"gather:rd", "expected one of: linear, tree"},
        {"alltoall:", "expected an algorithm for alltoall"},
        {"reduce_scatter:pairwise,ring", "never chosen"},
        {"scatter:tree@<0", "never applies"},
        {"reducescatter:ring", "reduce_scatter"},
        {"allgather", "expected ':' after \"allgather\""},
        {"bogus", "pairwise"},
        {"allreduce:tree", "expected one of: ring, rd, hd, dbtree"},
        {"bogus", "dbtree"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tt_algo_override_t *ovr = (tt_algo_override_t *)1;
        char err[512];
        ck_assert_int_eq(tt_algo_override_parse(cases[i].spec, &ovr, err, sizeof(err)),
                         TUTTI_ERR_CONFIG);
        ck_assert_ptr_null(ovr);
        ck_assert_msg(strstr(err, cases[i].needle), "\"%s\": \"%s\" lacks \"%s\"",
                      cases[i].spec, err, cases[i].needle);
    }
}
END_TEST

/* hd and dbtree: fixed ids (they travel in envelopes), forced by bare name or with
 * size bounds like the others */
START_TEST(allreduce_hd_dbtree)
{
    const tt_algo_t *hd = tt_algo_find(TT_COLL_ALLREDUCE, "hd");
    const tt_algo_t *dbt = tt_algo_find(TT_COLL_ALLREDUCE, "dbtree");
    ck_assert_ptr_nonnull(hd);
    ck_assert_ptr_nonnull(dbt);
    ck_assert_uint_eq(hd->id, 18);
    ck_assert_uint_eq(dbt->id, 19);
    ck_assert_ptr_null(tt_algo_find(TT_COLL_BROADCAST, "dbtree"));

    tt_algo_override_t *ovr = NULL;
    char err[256];
    ck_assert_int_eq(tt_algo_override_parse("dbtree", &ovr, err, sizeof(err)), TUTTI_OK);
    ck_assert_str_eq(pick(ovr, TT_COLL_ALLREDUCE, 1, 3), "dbtree");
    ck_assert_str_eq(pick(ovr, TT_COLL_ALLREDUCE, (size_t)1 << 30, 3), "dbtree");
    ck_assert_str_eq(pick(ovr, TT_COLL_BROADCAST, 1, 3), "tree"); /* default */
    tt_algo_override_free(ovr);

    ck_assert_int_eq(tt_algo_override_parse("allreduce:rd@<4K,hd@<1M,dbtree", &ovr, err,
                                            sizeof(err)),
                     TUTTI_OK);
    ck_assert_str_eq(pick(ovr, TT_COLL_ALLREDUCE, 100, 8), "rd");
    ck_assert_str_eq(pick(ovr, TT_COLL_ALLREDUCE, 4096, 8), "hd");
    ck_assert_str_eq(pick(ovr, TT_COLL_ALLREDUCE, 1 << 20, 8), "dbtree");
    tt_algo_override_free(ovr);
}
END_TEST

START_TEST(defaults)
{
    /* allreduce: rd for small messages, hd for mid-sized ones on power-of-two rank counts
     * above 2, the ring otherwise */
    ck_assert_str_eq(pick(NULL, TT_COLL_ALLREDUCE, 64 << 10, 4), "rd");
    ck_assert_str_eq(pick(NULL, TT_COLL_ALLREDUCE, (64 << 10) + 1, 4), "hd");
    ck_assert_str_eq(pick(NULL, TT_COLL_ALLREDUCE, 1 << 20, 4), "hd");
    ck_assert_str_eq(pick(NULL, TT_COLL_ALLREDUCE, (1 << 20) + 1, 4), "ring");
    ck_assert_str_eq(pick(NULL, TT_COLL_ALLREDUCE, 1 << 20, 16), "hd");
    ck_assert_str_eq(pick(NULL, TT_COLL_ALLREDUCE, 1 << 20, 2), "ring");
    ck_assert_str_eq(pick(NULL, TT_COLL_ALLREDUCE, 1 << 20, 3), "ring");
    ck_assert_str_eq(pick(NULL, TT_COLL_ALLREDUCE, 1 << 20, 6), "ring");
    ck_assert_str_eq(pick(NULL, TT_COLL_ALLREDUCE, 16 << 10, 16), "rd");
    ck_assert_str_eq(pick(NULL, TT_COLL_REDUCE, 64 << 10, 8), "tree");
    ck_assert_str_eq(pick(NULL, TT_COLL_REDUCE, (64 << 10) + 1, 8), "ring");
    ck_assert_str_eq(pick(NULL, TT_COLL_ALLGATHER, 64 << 10, 8), "rd");
    ck_assert_str_eq(pick(NULL, TT_COLL_ALLGATHER, (64 << 10) + 1, 8), "ring");
    ck_assert_str_eq(pick(NULL, TT_COLL_REDUCE_SCATTER, 1, 8), "ring");
    ck_assert_str_eq(pick(NULL, TT_COLL_GATHER, 1, 4), "linear");
    ck_assert_str_eq(pick(NULL, TT_COLL_GATHER, 1, 5), "tree");
    ck_assert_str_eq(pick(NULL, TT_COLL_GATHER, (1 << 20) + 1, 5), "linear");
    ck_assert_str_eq(pick(NULL, TT_COLL_SCATTER, 1, 4), "linear");
    ck_assert_str_eq(pick(NULL, TT_COLL_SCATTER, 1, 16), "tree");
    ck_assert_str_eq(pick(NULL, TT_COLL_ALLTOALL, 1 << 30, 16), "pairwise");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("select");
    TCase *tc = tcase_create("select");
    tcase_add_test(tc, names);
    tcase_add_test(tc, ids_unique);
    tcase_add_test(tc, force_each);
    tcase_add_test(tc, bounds_and_bare);
    tcase_add_test(tc, bad_strings);
    tcase_add_test(tc, allreduce_hd_dbtree);
    tcase_add_test(tc, defaults);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
