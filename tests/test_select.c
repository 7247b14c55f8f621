/* The algorithm table and TUTTI_ALGO for the collectives of issue 3: every collective
 * name parses, every algorithm can be forced, bounds pick by size, bad strings fail
 * with a message that names what was expected, ids are unique, and the defaults are
 * what the model says. */
#include <check.h>
#include <math.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "coll/algo.h"
#include "core/stage.h"
#include "core/state.h"
#include "harness.h"
#include "base/base.h"

static const char *pick(const tt_algo_override_t *ovr, tt_coll_t coll, size_t bytes, int n)
{
    const tt_algo_t *a = tt_algo_select(ovr, NULL, coll, bytes, n, (size_t)1 << 20);
    return a ? a->name : "NULL";
}

START_TEST(names)
{
    static const char *const names[] = { "reduce",  "allgather", "reduce_scatter", "gather",
                                         "scatter", "alltoall",  "scan",           "exscan" };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        tt_coll_t c = tt_coll_parse(names[i]);
        ck_assert_int_ne(c, TT_COLL_NONE);
        ck_assert_str_eq(tt_coll_name(c), names[i]);
    }
    ck_assert_int_eq(tt_coll_parse("reduce-scatter"), TT_COLL_NONE);
    ck_assert_ptr_null(tt_coll_name(TT_COLL_COUNT_));
}
END_TEST

/* tutti_algo_name lists each collective's algorithms in id order: every one the
 * table has (tt_algo_all) and no other, then NULL; NULL for an unknown collective. */
START_TEST(public_algo_list)
{
    size_t n;
    const tt_algo_t *const *all = tt_algo_all(&n);
    size_t seen = 0;
    for (int c = TT_COLL_NONE + 1; c < TT_COLL_COUNT_; c++) {
        const char *coll = tt_coll_name((tt_coll_t)c);
        uint32_t last = 0;
        int i = 0;
        for (const char *name; (name = tutti_algo_name(coll, i)); i++) {
            const tt_algo_t *a = NULL;
            for (size_t k = 0; k < n && !a; k++)
                if (all[k]->coll == (tt_coll_t)c && !strcmp(all[k]->name, name))
                    a = all[k];
            ck_assert_msg(a != NULL, "%s:%s is not in the table", coll, name);
            ck_assert_msg(a->id > last, "%s:%s out of id order", coll, name);
            last = a->id;
        }
        ck_assert_msg(i > 0, "%s has no algorithm", coll);
        seen += (size_t)i;
    }
    ck_assert_uint_eq(seen, n);
    ck_assert_ptr_null(tutti_algo_name("reduce-scatter", 0));
    ck_assert_ptr_null(tutti_algo_name(NULL, 0));
    ck_assert_ptr_null(tutti_algo_name("allreduce", -1));
    ck_assert_str_eq(tutti_algo_name("barrier", 1), "tree");
    ck_assert_str_eq(tutti_algo_name("barrier", 2), "linear");
    ck_assert_ptr_null(tutti_algo_name("barrier", 3));
    ck_assert_str_eq(tutti_algo_name("allreduce", 5), "linear");
    /* tutti_algo_spec_sets: TUTTI_ALGO's parse, asked for one collective */
    char why[256];
    ck_assert_int_eq(tutti_algo_spec_sets("ring", "allreduce", why, sizeof(why)), 1);
    ck_assert_int_eq(tutti_algo_spec_sets("tree", "allreduce", why, sizeof(why)), 0);
    ck_assert_int_eq(tutti_algo_spec_sets("tree", "broadcast", why, sizeof(why)), 1);
    ck_assert_int_eq(tutti_algo_spec_sets("broadcast:tree", "allreduce", why, sizeof(why)), 0);
    ck_assert_int_eq(tutti_algo_spec_sets("allreduce:rd@<1K,ring;broadcast:tree", "allreduce", why,
                                          sizeof(why)),
                     1);
    ck_assert_int_eq(tutti_algo_spec_sets("nosuch", "allreduce", why, sizeof(why)),
                     TUTTI_ERR_CONFIG);
    ck_assert_msg(strstr(why, "unknown algorithm \"nosuch\""), "%s", why);
    ck_assert_int_eq(tutti_algo_spec_sets("broadcast:rd", "broadcast", why, sizeof(why)),
                     TUTTI_ERR_CONFIG);
    ck_assert_msg(strstr(why, "unknown broadcast algorithm \"rd\""), "%s", why);
    ck_assert_int_eq(tutti_algo_spec_sets("ring", "reduce-scatter", why, sizeof(why)),
                     TUTTI_ERR_INVALID_ARG);
    ck_assert_int_eq(tutti_algo_spec_sets(NULL, "allreduce", NULL, 0), TUTTI_ERR_INVALID_ARG);
    ck_assert_ptr_null(tutti_algo_name("allreduce", 6));
    ck_assert_str_eq(tutti_algo_name("allgather", 2), "linear");
    ck_assert_str_eq(tutti_algo_name("reduce_scatter", 2), "linear");
    ck_assert_str_eq(tutti_algo_name("allgather", 3), "hier");
    ck_assert_str_eq(tutti_algo_name("allgather", 4), "pairwise");
    ck_assert_ptr_null(tutti_algo_name("allgather", 5));
    ck_assert_str_eq(tutti_algo_name("reduce_scatter", 3), "hier");
    ck_assert_ptr_null(tutti_algo_name("reduce_scatter", 4));
    ck_assert_str_eq(tutti_algo_name("reduce", 2), "linear");
    ck_assert_ptr_null(tutti_algo_name("reduce", 3));
}
END_TEST

START_TEST(ids_unique)
{
    size_t n;
    const tt_algo_t *const *all = tt_algo_all(&n);
    ck_assert_uint_eq(n, 38);
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
    static const struct {
        tt_coll_t coll;
        const char *spec, *name;
    } cases[] = {
        { TT_COLL_REDUCE, "reduce:tree", "tree" },
        { TT_COLL_REDUCE, "reduce:ring", "ring" },
        { TT_COLL_ALLGATHER, "allgather:ring", "ring" },
        { TT_COLL_ALLGATHER, "allgather:rd", "rd" },
        { TT_COLL_REDUCE_SCATTER, "reduce_scatter:ring", "ring" },
        { TT_COLL_REDUCE_SCATTER, "reduce_scatter:pairwise", "pairwise" },
        { TT_COLL_GATHER, "gather:linear", "linear" },
        { TT_COLL_GATHER, "gather:tree", "tree" },
        { TT_COLL_SCATTER, "scatter:linear", "linear" },
        { TT_COLL_SCATTER, "scatter:tree", "tree" },
        { TT_COLL_ALLTOALL, "alltoall:pairwise", "pairwise" },
        { TT_COLL_ALLTOALL, "alltoall:ring", "ring" },
        { TT_COLL_ALLTOALL, "alltoall:bruck", "bruck" },
        { TT_COLL_ALLTOALL, "alltoall:linear", "linear" },
        { TT_COLL_ALLREDUCE, "allreduce:hd", "hd" },
        { TT_COLL_ALLREDUCE, "allreduce:dbtree", "dbtree" },
        { TT_COLL_ALLREDUCE, "allreduce:hier", "hier" },
        { TT_COLL_ALLREDUCE, "allreduce:linear", "linear" },
        { TT_COLL_ALLGATHER, "allgather:linear", "linear" },
        { TT_COLL_REDUCE_SCATTER, "reduce_scatter:linear", "linear" },
        { TT_COLL_ALLGATHER, "allgather:hier", "hier" },
        { TT_COLL_ALLGATHER, "allgather:pairwise", "pairwise" },
        { TT_COLL_REDUCE_SCATTER, "reduce_scatter:hier", "hier" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tt_algo_override_t *ovr = NULL;
        char err[256];
        ck_assert_int_eq(tt_algo_override_parse(cases[i].spec, &ovr, err, sizeof(err)), TUTTI_OK);
        ck_assert_str_eq(pick(ovr, cases[i].coll, 1, 8), cases[i].name);
        ck_assert_str_eq(pick(ovr, cases[i].coll, (size_t)1 << 30, 8), cases[i].name);
        ck_assert_ptr_eq(tt_algo_find(cases[i].coll, cases[i].name),
                         tt_algo_select(ovr, NULL, cases[i].coll, 1, 8, (size_t)1 << 20));
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
    ck_assert_str_eq(pick(ovr, TT_COLL_REDUCE_SCATTER, 1 << 30, 64), "linear");
    tt_algo_override_free(ovr);
}
END_TEST

/* One spelling for every spec that means the same (the job record compares a hash of
 * it across ranks): bounds in bytes, a later entry replacing an earlier one, white space,
 * collectives in table order, a bare name spelt out; none for nothing chosen. */
START_TEST(canonical_form)
{
    static const struct {
        const char *spec, *canon;
    } cases[] = {
        { "allreduce:ring@<64K,rd", "allreduce:ring@<65536,rd" },
        { " allreduce : linear ; allreduce:ring@<65536 , rd ;", "allreduce:ring@<65536,rd" },
        { "broadcast:tree;allreduce:rd", "allreduce:rd;broadcast:tree" },
        { "alltoall:pairwise;allgather:pairwise;reduce_scatter:pairwise", NULL }, /* "pairwise" */
        { "", NULL },
        { ";;", NULL },
    };
    char err[256], *bare = NULL;
    tt_algo_override_t *ovr = NULL;
    ck_assert_int_eq(tt_algo_override_parse("pairwise", &ovr, err, sizeof(err)), TUTTI_OK);
    ck_assert_int_eq(tt_algo_override_canon(ovr, &bare), TUTTI_OK);
    tt_algo_override_free(ovr);
    ck_assert_ptr_nonnull(bare);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *canon = (char *)1;
        ck_assert_int_eq(tt_algo_override_parse(cases[i].spec, &ovr, err, sizeof(err)), TUTTI_OK);
        ck_assert_int_eq(tt_algo_override_canon(ovr, &canon), TUTTI_OK);
        tt_algo_override_free(ovr);
        const char *want = i == 3 ? bare : cases[i].canon;
        if (want)
            ck_assert_msg(canon && !strcmp(canon, want), "\"%s\" gives \"%s\", not \"%s\"",
                          cases[i].spec, canon ? canon : "(none)", want);
        else
            ck_assert_msg(!canon, "\"%s\" gives \"%s\"", cases[i].spec, canon);
        free(canon);
    }
    free(bare);
}
END_TEST

START_TEST(bad_strings)
{
    static const struct {
        const char *spec, *needle;
    } cases[] = {
        { "reduce:pairwise", "expected one of: tree, ring, linear" },
        { "gather:rd", "expected one of: linear, tree" },
        { "alltoall:", "expected an algorithm for alltoall" },
        { "reduce_scatter:pairwise,ring", "never chosen" },
        { "scatter:tree@<0", "never applies" },
        { "reducescatter:ring", "reduce_scatter" },
        { "allgather", "expected ':' after \"allgather\"" },
        { "bogus", "pairwise" },
        { "allreduce:tree", "expected one of: ring, rd, hd, dbtree, hier" },
        { "bogus", "dbtree" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tt_algo_override_t *ovr = (tt_algo_override_t *)1;
        char err[512];
        ck_assert_int_eq(tt_algo_override_parse(cases[i].spec, &ovr, err, sizeof(err)),
                         TUTTI_ERR_CONFIG);
        ck_assert_ptr_null(ovr);
        ck_assert_msg(strstr(err, cases[i].needle), "\"%s\": \"%s\" lacks \"%s\"", cases[i].spec,
                      err, cases[i].needle);
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
    ck_assert_str_eq(pick(ovr, TT_COLL_BROADCAST, 1, 4), "linear"); /* default */
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

/* Which algorithms ask for single-copy transfers (algos.def, TT_1COPY): those where each
 * receiving rank also sends in the same step, or a root only sends. Not where one rank
 * receives from many: gather and reduce, streamed, share the copying among the senders
 * (pulled, the root copied alone: 1.11-1.36x the time for a 4-64 MiB gather). A change
 * of this policy must be measured, then made here too. */
START_TEST(single_copy_hints)
{
    /* one algorithm a line */
    /* clang-format off */
    static const struct {
        tt_coll_t coll;
        const char *name;
        int single_copy;
    } want[] = {
        { TT_COLL_ALLREDUCE, "ring", 1 },
        { TT_COLL_ALLREDUCE, "hd", 1 },
        { TT_COLL_ALLREDUCE, "hier", 1 },
        { TT_COLL_ALLREDUCE, "rd", 0 },
        { TT_COLL_ALLREDUCE, "dbtree", 0 },
        { TT_COLL_ALLREDUCE, "linear", 0 },
        { TT_COLL_BROADCAST, "chain", 1 },
        { TT_COLL_BROADCAST, "tree", 1 },
        { TT_COLL_BROADCAST, "linear", 1 },
        { TT_COLL_ALLGATHER, "ring", 1 },
        { TT_COLL_ALLGATHER, "rd", 1 },
        { TT_COLL_ALLGATHER, "linear", 0 },
        { TT_COLL_ALLGATHER, "hier", 1 },
        { TT_COLL_ALLGATHER, "pairwise", 1 },
        { TT_COLL_REDUCE_SCATTER, "ring", 1 },
        { TT_COLL_REDUCE_SCATTER, "pairwise", 1 },
        { TT_COLL_REDUCE_SCATTER, "linear", 0 },
        { TT_COLL_REDUCE_SCATTER, "hier", 1 },
        { TT_COLL_ALLTOALL, "ring", 1 },
        { TT_COLL_ALLTOALL, "pairwise", 1 },
        { TT_COLL_ALLTOALL, "bruck", 1 },
        { TT_COLL_ALLTOALL, "linear", 0 },
        { TT_COLL_SCATTER, "linear", 1 },
        { TT_COLL_SCATTER, "tree", 1 },
        { TT_COLL_GATHER, "linear", 0 },
        { TT_COLL_GATHER, "tree", 0 },
        { TT_COLL_REDUCE, "tree", 0 },
        { TT_COLL_REDUCE, "ring", 0 },
        { TT_COLL_REDUCE, "linear", 0 },
        { TT_COLL_BARRIER, "dissemination", 0 },
        { TT_COLL_BARRIER, "tree", 0 },
        { TT_COLL_BARRIER, "linear", 0 },
        { TT_COLL_SCAN, "linear", 1 },
        { TT_COLL_SCAN, "rd", 0 },
        { TT_COLL_EXSCAN, "linear", 1 },
        { TT_COLL_EXSCAN, "rd", 0 },
        { TT_COLL_NEIGHBOR_ALLGATHER, "direct", 0 },
        { TT_COLL_NEIGHBOR_ALLTOALL, "direct", 0 },
    };
    /* clang-format on */
    size_t n = 0;
    tt_algo_all(&n);
    ck_assert_uint_eq(n, TT_ARRAY_SIZE(want)); /* a new algorithm takes a side here */
    for (size_t i = 0; i < TT_ARRAY_SIZE(want); i++) {
        const tt_algo_t *a = tt_algo_find(want[i].coll, want[i].name);
        ck_assert_msg(a, "%s", want[i].name);
        ck_assert_msg(!!(a->tp_hints & TUTTI_TP_HINT_SINGLE_COPY) == want[i].single_copy,
                      "%s %s: single copy %s", tt_coll_name(want[i].coll), want[i].name,
                      want[i].single_copy ? "not asked for" : "asked for");
    }
}
END_TEST

/* A sender with a single receiver streams where its own host's ranks have a CPU each
 * (tt_stream_to_one, whatever rank 0's host): the single-copy hint comes off below
 * TT_STREAM_ONE_BYTES, and stays with two receivers, from that size, on a crowded host,
 * and where the op had none. */
START_TEST(stream_to_one)
{
    static const struct {
        int receivers, host_ranks, host_cpus, hinted;
        size_t bytes;
        int want;
    } cases[] = {
        { 1, 2, 2, 1, (size_t)32 << 20, 0 },        /* 2 ranks, a CPU each: streams */
        { 1, 2, 0, 1, 4096, 0 },                    /* CPUs not known: not crowded */
        { 1, 2, 2, 1, TT_STREAM_ONE_BYTES - 1, 0 }, /* just under */
        { 1, 2, 2, 1, TT_STREAM_ONE_BYTES, 1 },     /* from the bound: pulled */
        { 2, 3, 4, 1, (size_t)32 << 20, 1 },        /* two receivers: pulled */
        { 3, 4, 4, 1, (size_t)1 << 20, 1 },         /* three */
        { 0, 2, 2, 1, (size_t)1 << 20, 1 },         /* a leaf: nothing to send */
        { 1, 4, 2, 1, (size_t)32 << 20, 1 },        /* crowded: pulled */
        { 1, 2, 2, 0, (size_t)32 << 20, 0 },        /* no hint stays none */
    };
    static tt_comm_t comm; /* zero: only this host's counts are read */
    for (size_t i = 0; i < TT_ARRAY_SIZE(cases); i++) {
        comm.host_ranks = cases[i].host_ranks;
        comm.host_cpus = cases[i].host_cpus;
        /* rank 0's host, in the cost model, says the opposite: not the one read */
        comm.cost.host_ranks = 4;
        comm.cost.host_cpus = cases[i].host_ranks > cases[i].host_cpus ? 8 : 2;
        tt_op_t op;
        memset(&op, 0, sizeof(op));
        op.comm = &comm;
        op.tp_hints = cases[i].hinted ? TUTTI_TP_HINT_SINGLE_COPY : 0;
        tt_stream_to_one(&op, cases[i].receivers, cases[i].bytes);
        ck_assert_msg(!!(op.tp_hints & TUTTI_TP_HINT_SINGLE_COPY) == cases[i].want,
                      "case %zu: %d receivers, %zu bytes, %d ranks on %d CPUs: %s", i,
                      cases[i].receivers, cases[i].bytes, cases[i].host_ranks, cases[i].host_cpus,
                      cases[i].want ? "streamed, where it should be pulled"
                                    : "pulled, where it should stream");
    }
}
END_TEST

/* The default choice is the cost model's: check its crossovers against the formulas
 * worked by hand here (cost.c lists them). */
static const char *pick_c(const tt_cost_t *c, tt_coll_t coll, size_t bytes, int n)
{
    const tt_algo_t *a = tt_algo_select(NULL, c, coll, bytes, n, (size_t)1 << 20);
    return a ? a->name : "NULL";
}

START_TEST(defaults)
{
    tt_cost_t tcp;
    tt_cost_table(&tcp, "tcp");
    /* alpha 10 us, 2 GB/s, reduce 12 GB/s: beta 0.5 ns/B, gamma 1/12 ns/B */
    ck_assert_msg(tcp.alpha_us == 10.0 && tcp.beta_ns == 0.5, "%f %f", tcp.alpha_us, tcp.beta_ns);
    /* 2 ranks, unpipelined ring (one chunk per block below 2 MiB): rd = a + n b + n g,
     * ring = 2a + n b + n g / 2, so rd until n = 2a/g = 240000 bytes */
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLREDUCE, 239000, 2), "rd");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLREDUCE, 241000, 2), "ring");
    /* 4 ranks: hd = 4a + 1.5 n b + .75 n g beats rd = 2(a + n b + n g) once
     * 2a < n (b/2 + 1.25 g), n > 20000 / (0.25 + 0.10417) = 56471; and the ring
     * = 6a + 1.5 n b + .75 n g / k beats hd once its chunks pipeline: at 2 MiB k = 2,
     * .375 n g = 65.5 us > 2a */
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLREDUCE, 56000, 4), "rd");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLREDUCE, 57000, 4), "hd");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLREDUCE, 1 << 20, 4), "hd");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLREDUCE, 2 << 20, 4), "ring");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLREDUCE, 64 << 20, 8), "ring");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLREDUCE, 4, 16), "rd");

    /* a faster link moves the crossovers: alpha 1 us and reduce 1 GB/s (g = 1 ns/B)
     * put the 2-rank one at 2a/g = 2000 bytes */
    tt_cost_t fast = tcp;
    char err[256];
    ck_assert_int_eq(tt_cost_parse("alpha=1,reduce=1", &fast, err, sizeof(err)), TUTTI_OK);
    ck_assert_str_eq(fast.source, "user");
    ck_assert_str_eq(pick_c(&fast, TT_COLL_ALLREDUCE, 1900, 2), "rd");
    ck_assert_str_eq(pick_c(&fast, TT_COLL_ALLREDUCE, 2100, 2), "ring");

    /* broadcast, 8 ranks: tree = 3(a + n b); chain = (7 + c - 1)(a + C b) with 256 KiB
     * chunks from 256 KiB up: at 1 MiB (c = 4) 10(a + 131 us) = 1411 us against
     * 3(a + 524 us) = 1603 us; at 512 KiB 8(10 + 131) = 1128 > 3(10 + 262) = 816 */
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_BROADCAST, 512 << 10, 8), "tree");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_BROADCAST, 1 << 20, 8), "chain");
    /* broadcast, linear (the root to every rank): a + (p - 2) a/4 + (p - 1) n b. 4
     * ranks: 1.5a + 3 n b against the tree's 2a + 2 n b, linear below 0.5a / b = 10000
     * bytes; 8 ranks: 2.5a + 7 n b against 3a + 3 n b, below 0.5a / 4b = 2500; 2 ranks
     * a tie of all three, kept by the first (chain: one message, as the others) */
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_BROADCAST, 9990, 4), "linear");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_BROADCAST, 10010, 4), "tree");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_BROADCAST, 2490, 8), "linear");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_BROADCAST, 2510, 8), "tree");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_BROADCAST, 4, 2), "chain");
    {
        /* crowded, 4 ranks on 2 CPUs. Over sockets the root's two queued sends count
         * again (as the linear barrier's): 3 / 2 a + 0.5a + 3 n b against the tree's 2a +
         * 2 n b, the tree always. Over shared memory every receiver copies the message
         * once, a CPU each at a time, and no broadcast moves its bytes faster: n b (p -
         * 1) / CPUs = 1.5 n b for linear, a floor under the tree's 2 n b and the chain's
         * n b + its chunks; linear a + 3 / 2 a/2 = 1.75a against the tree's 2a and the
         * chain's (3 + c - 1) a. Nothing is pulled there (shm's auto), so the root also
         * copies the message into 3 rings itself, 3 n at b/3 while that fits its cache
         * (256 KiB), else at b: linear to 87381 B (measured 4 B 0.24-0.43 us against
         * the tree's 0.26-4.0 and the chain's 0.26-4.2; 64 KiB tree / linear 1.06-1.08),
         * then the tree (3 n b against 2 n b; measured 0.82-1.05 at 256 KiB, 0.69-0.93
         * from 1 MiB to 64 MiB, session 61). Crowded, the chain's bytes count at ranks /
         * CPUs, 2 here (every rank copies in every step): never ahead of the tree. */
        tt_cost_t bc = tcp;
        bc.host_ranks = 4;
        bc.host_cpus = 2;
        bc.agree_lag = 1; /* the handshake off the call's path: not in the estimates */
        ck_assert(tt_cost_crowded(&bc));
        ck_assert(fabs(tt_cost_estimate(&bc, TT_COLL_BROADCAST, "linear", 0, 4, 0) -
                       2 * tcp.alpha_us) < 1e-9);
        ck_assert_str_eq(pick_c(&bc, TT_COLL_BROADCAST, 4, 4), "tree");
        ck_assert_str_eq(pick_c(&bc, TT_COLL_BROADCAST, 4096, 4), "tree");
        /* and not the chain, whose bytes count twice here (measured over tcp, chain /
         * tree: 1.25-1.47 at 256 KiB-1 MiB, 1.01-1.10 at 4-16 MiB with --window) */
        for (size_t n = (size_t)256 << 10; n <= (size_t)64 << 20; n *= 4)
            ck_assert_str_eq(tt_algo_select(NULL, &bc, TT_COLL_BROADCAST, n, 4, 256 << 10)->name,
                             "tree");
        tt_cost_table(&bc, "shm");
        bc.host_ranks = 4;
        bc.host_cpus = 2;
        bc.agree_lag = 1;
        const double ba = bc.alpha_us, bb = bc.beta_ns * 1e-3;
        ck_assert(fabs(tt_cost_estimate(&bc, TT_COLL_BROADCAST, "linear", 1000, 4, 0) -
                       (1.75 * ba + 1500 * bb)) < 1e-9);
        ck_assert(fabs(tt_cost_estimate(&bc, TT_COLL_BROADCAST, "tree", 1000, 4, 0) -
                       (2 * ba + 2000 * bb)) < 1e-9);
        ck_assert(fabs(tt_cost_estimate(&bc, TT_COLL_BROADCAST, "linear", 1 << 20, 4, 0) -
                       (1.75 * ba + 3 * (1 << 20) * bb)) < 1e-9);
        for (size_t n = 4; n <= (size_t)64 << 10; n *= 4)
            ck_assert_str_eq(pick_c(&bc, TT_COLL_BROADCAST, n, 4), "linear");
        ck_assert_str_eq(pick_c(&bc, TT_COLL_BROADCAST, 87380, 4), "linear");
        ck_assert_str_eq(pick_c(&bc, TT_COLL_BROADCAST, 87384, 4), "tree");
        for (size_t n = (size_t)256 << 10; n <= (size_t)256 << 20; n *= 4)
            ck_assert_str_eq(pick_c(&bc, TT_COLL_BROADCAST, n, 4), "tree");
        /* the chain at 1 MiB in 256 KiB chunks: 6 steps, 6 a + 2 x 6 x 256 Ki b */
        ck_assert(fabs(tt_cost_estimate(&bc, TT_COLL_BROADCAST, "chain", 1 << 20, 4, 256 << 10) -
                       (6 * ba + 2 * 6 * (256 << 10) * bb)) < 1e-9);
        bc.host_cpus = 4; /* 4 ranks on 4 CPUs, or CPUs not known: not crowded */
        ck_assert(!tt_cost_crowded(&bc));
        bc.host_cpus = 0;
        ck_assert(!tt_cost_crowded(&bc));
    }
    /* allgather, 8 ranks: Bruck = 3a + 7/8 n b + n g, ring = 7a + 7/8 n b: the ring
     * once n g > 4a, n > 480000 */
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLGATHER, 470000, 8), "rd");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLGATHER, 490000, 8), "ring");
    /* gather, blocks of n/p: linear = a + (p-2) a/4 + (p-1)/p N b; tree = L a +
     * (p-1)/p N b + (L-1)/2 N g. 4 ranks: 1.5a against 2a + N g / 2: linear always;
     * 16 ranks: 4.5a against 4a + 1.5 N g: tree while N < a / (3 g) = 40000 */
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_GATHER, 1, 4), "linear");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_GATHER, 1 << 20, 4), "linear");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_SCATTER, 2400, 16), "tree");   /* N = 38400 */
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_SCATTER, 2600, 16), "linear"); /* N = 41600 */
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLTOALL, 1 << 20, 16), "pairwise");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_BARRIER, 0, 5), "dissemination");
    /* barrier on a crowded host (more ranks than CPUs): messages over CPUs, p L for
     * dissemination, 2 (p - 1) for the tree; the host's share p_h / p of them */
    tt_cost_t crowd = tcp;
    crowd.host_ranks = 4;
    crowd.host_cpus = 2;
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_BARRIER, 0, 4), "tree"); /* 8 against 6 */
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_BARRIER, 0, 3), "tree"); /* 6 against 4 */
    /* 2 ranks on 1 CPU: 2 messages each, a tie, and the tie keeps dissemination */
    crowd.host_ranks = 2;
    crowd.host_cpus = 1;
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_BARRIER, 0, 2), "dissemination");
    ck_assert(tt_cost_estimate(&crowd, TT_COLL_BARRIER, "tree", 0, 2, 0) ==
              tt_cost_estimate(&crowd, TT_COLL_BARRIER, "dissemination", 0, 2, 0));
    /* 8 ranks on 8 CPUs: not crowded, rounds count: 3a against 6a */
    crowd.host_ranks = crowd.host_cpus = 8;
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_BARRIER, 0, 8), "dissemination");
    ck_assert(tt_cost_estimate(&crowd, TT_COLL_BARRIER, "tree", 0, 8, 0) == 6 * tcp.alpha_us);
    /* 16 ranks, 4 on each host of 2 CPUs: a host's share of 64 and 30 messages */
    crowd.host_ranks = 4;
    crowd.host_cpus = 2;
    ck_assert(tt_cost_estimate(&crowd, TT_COLL_BARRIER, "dissemination", 0, 16, 0) ==
              64.0 * 4 / 16 / 2 * tcp.alpha_us);
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_BARRIER, 0, 16), "tree");
    /* linear over sockets: the tree's messages and rank 0's 2 (p - 2) queued ones at a/4:
     * 4 ranks on 2 CPUs, 3a + a against the tree's 3a */
    ck_assert(tt_cost_estimate(&crowd, TT_COLL_BARRIER, "linear", 0, 4, 0) == 4 * tcp.alpha_us);
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_BARRIER, 0, 4), "tree");
    /* over shared memory the rounds cost a each and the messages over the CPUs a/2:
     * 4 ranks on 2 CPUs, linear 2a + 1.5a, dissemination 2a + 2a, tree 4a + 1.5a; 16
     * ranks, 4 on each host of 2 CPUs: 2a + 1.875a, 4a + 4a, 8a + 1.875a */
    tt_cost_t shm_crowd = crowd;
    tt_cost_table(&shm_crowd, "shm");
    ck_assert_int_eq(shm_crowd.local_only, 1);
    ck_assert_int_eq(crowd.local_only, 0);
    shm_crowd.host_ranks = 4;
    shm_crowd.host_cpus = 2;
    const double sa = shm_crowd.alpha_us;
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_BARRIER, "linear", 0, 4, 0) - 3.5 * sa) <
              1e-9);
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_BARRIER, "dissemination", 0, 4, 0) -
                   4.0 * sa) < 1e-9);
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_BARRIER, 0, 4), "linear");
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_BARRIER, 0, 16), "linear");
    /* shm and tcp parts (ranks on several hosts): sockets */
    tt_cost_table(&shm_crowd, "shm+tcp");
    ck_assert_int_eq(shm_crowd.local_only, 0);
    /* not crowded: linear 2a + 2 (p - 2) a/4 never beats dissemination's L a */
    shm_crowd.host_ranks = shm_crowd.host_cpus = 0;
    for (int p = 2; p <= 64; p++)
        ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_BARRIER, 0, p), "dissemination");

    /* allreduce, linear (every rank to rank 0 and back) against rd. Not crowded, 4 B:
     * linear 2a + 2 (p - 2) a/4 against rd's (log2 P + 2x) a: linear at 3 ranks (2.5a
     * against 3a, rd folding in and out) and 5 (3.5a against 4a), rd at the others */
    for (int p = 2; p <= 64; p++)
        ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLREDUCE, 4, p), p == 3 || p == 5 ? "linear" : "rd");
    /* crowded over shm, 4 ranks on 2 CPUs, rank 0's copies at b/3 (in its cache): linear
     * 2a + 6 / 2 a/2 + 3 n (b/3 + g) = 3.5a + 0.45 ns/B while 3 n fits 256 KiB, else
     * 3.5a + 0.85 ns/B; the others' bytes at ranks / CPUs = 2 (steps_crowd): rd 2a + 8 / 2
     * a/2 + 2 x 2 n (b + g) = 4a + 1.133 ns/B, hd (16 messages) 4a + 16 / 2 a/2 + 2 (1.5
     * n b + 0.75 n g) = 8a + 0.725 ns/B, dbtree 4a + 12 / 2 a/2 + 2 (2 n b + n g) = 7a +
     * 0.967 ns/B: linear to 87381 bytes, then hd (0.125 ns/B less from there: 36 KB
     * pays its 4.5a); until session 68 the others' bytes counted once and hd took over
     * at 51429 bytes */
    tt_cost_table(&shm_crowd, "shm");
    shm_crowd.host_ranks = 4;
    shm_crowd.host_cpus = 2;
    const double sb = shm_crowd.beta_ns, sg = shm_crowd.gamma_ns;
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_ALLREDUCE, "linear", 4, 4, 0) -
                   (3.5 * sa + 12 * (sb / 3 + sg) * 1e-3)) < 1e-9);
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_ALLREDUCE, "rd", 4, 4, 0) -
                   (4.0 * sa + 2 * 8 * (sb + sg) * 1e-3)) < 1e-9);
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_ALLREDUCE, "hd", 0, 4, 0) - 8.0 * sa) <
              1e-9);
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_ALLREDUCE, "hd", 1000, 4, 0) -
                   (8.0 * sa + 2 * (1500 * sb + 750 * sg) * 1e-3)) < 1e-9);
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_ALLREDUCE, 4, 4), "linear");
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_ALLREDUCE, 16384, 4), "linear");
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_ALLREDUCE, 65536, 4), "linear");
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_ALLREDUCE, 87380, 4), "linear");
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_ALLREDUCE, 87384, 4), "hd");
    /* allgather (n: the whole result), the same host: linear 3.5a + (3/4 + 3) n b/3 =
     * 3.5a + 0.25 ns/B; rd (4 ranks: each block a message, 12 in all) 2a + 12 / 2 a/2 +
     * 3/4 n b + n g = 5a + 0.2333 ns/B; ring 3a + 12 / 2 a/2 + 3/4 n b = 6a + 0.15 ns/B;
     * pairwise the shm alltoall's latency and 1.15 times the ring's bytes, 3a + 0.1725
     * ns/B: pairwise (linear's 0.5a more latency and more bytes) below 3a / 0.0225 ns/B =
     * 133333 bytes, then the ring (until session 60 pairwise counted the ring's latency
     * and 0.9 b, and linear was picked below 21739 bytes) */
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_ALLGATHER, "rd", 0, 4, 0) - 5.0 * sa) <
              1e-9);
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_ALLGATHER, "pairwise", 1000, 4, 0) -
                   (3.0 * sa + 1.15 * 750 * sb * 1e-3)) < 1e-9);
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_ALLGATHER, "linear", 1000, 4, 0) -
                   (3.5 * sa + 3750 * sb / 3 * 1e-3)) < 1e-9);
    for (size_t n = 16; n <= 65536; n *= 4)
        ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_ALLGATHER, n, 4), "pairwise");
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_ALLGATHER, 133000, 4), "pairwise");
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_ALLGATHER, 133700, 4), "ring");
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_ALLGATHER, 16 << 20, 4), "ring");
    /* 3 ranks on 2 CPUs: pairwise 2a + 1.15 (2/3) n b, linear 2a + 4 / 2 a/2 + (2/3 + 2)
     * n b/3 */
    shm_crowd.host_ranks = 3;
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_ALLGATHER, 16, 3), "pairwise");
    shm_crowd.host_ranks = 4;
    /* 2 ranks: the ring (pairwise would be its one exchange); over sockets never, nor
     * over shm with a CPU for every rank */
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_ALLGATHER, 1 << 20, 2), "ring");
    tt_cost_t shm_spare = shm_crowd;
    shm_spare.host_cpus = 4;
    ck_assert(!tt_cost_crowded(&shm_spare));
    ck_assert(isinf(tt_cost_estimate(&shm_spare, TT_COLL_ALLGATHER, "pairwise", 1000, 4, 0)));
    ck_assert_str_eq(pick_c(&shm_spare, TT_COLL_ALLGATHER, 1 << 20, 4), "ring");
    /* crowded over sockets (session 61): pairwise waits once for the CPUs where the
     * ring's steps wait p - 1 times, the ring's 12 / 2 a less 2a, and 1.2 times its
     * bytes (session 64; 1.15 over shm); linear's root copies at b/3 while its messages
     * fit a socket's buffer (96 KiB): 3a + 3.75 n b/3. Linear to a / (1.25 b - 0.9 b) =
     * 57143 bytes (measured tcp pairwise / linear 1.23-1.32 at 8-32 KiB, 0.91 at 64 KiB;
     * session 68, 10 runs, medians: 1.15-1.17 at 32-48 KiB, 1.08 at 64 (0.94-1.42), 0.94
     * at 96), pairwise to 2a / (0.2 x
     * 3/4 b) = 266667 bytes (pairwise / ring 0.87 at 128 KiB, 1.01 at 256, 1.10 at 512:
     * ab.sh --fresh --window, 8 pairs) */
    {
        const double xa = crowd.alpha_us, xb = crowd.beta_ns * 1e-3;
        ck_assert(fabs(tt_cost_estimate(&crowd, TT_COLL_ALLGATHER, "pairwise", 1000, 4, 0) -
                       (4 * xa + 1.2 * 750 * xb)) < 1e-9);
        ck_assert(fabs(tt_cost_estimate(&crowd, TT_COLL_ALLGATHER, "ring", 1000, 4, 0) -
                       (6 * xa + 750 * xb)) < 1e-9);
        ck_assert(fabs(tt_cost_estimate(&crowd, TT_COLL_ALLGATHER, "linear", 1000, 4, 0) -
                       (3 * xa + 3750 * xb / 3)) < 1e-9);
        ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLGATHER, 16 << 10, 4), "linear");
        ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLGATHER, 57140, 4), "linear");
        ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLGATHER, 57148, 4), "pairwise");
        ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLGATHER, 64 << 10, 4), "pairwise");
        ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLGATHER, 266660, 4), "pairwise");
        ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLGATHER, 266680, 4), "ring");
        ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLGATHER, 1 << 20, 4), "ring");
    }
    /* not crowded, Bruck's L rounds (the ring's p - 1 up to 3 ranks) win: linear's 2
     * rounds and rank 0's queue never, at 2..64 ranks for 16 B */
    for (int p = 2; p <= 64; p++)
        ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLGATHER, 16, p), p <= 3 ? "ring" : "rd");
    /* crowded over sockets: the messages' share of the CPUs, linear 6 / 2 a, rd 8 / 2 a,
     * hd 16 / 2 a, the ring 24 / 2 a; the bytes of ring, rd and hd at 4 ranks / 2 CPUs,
     * linear's only above the 96 KiB a socket takes in: linear 3a + 3 n (b/3 + g) (the
     * root's copies while every vector fits a socket's buffer; above it 3a + 6 n (b +
     * g)), rd 4a + 4 n (b + g), hd 8a + n (3 b + 1.5 g), ring 12a + n (3 b + 1.5 g / k)
     * (k = 1 to 1 MiB: 256 KiB chunks). Linear to 96 KiB (below it hd would pass it at
     * 5a / (3 (b + g) - 3 b - 1.5 g) = 400000), then hd (rd, 4a + 2.33 ns/B, would have
     * it to 4a / (b + 2.5 g) = 56470) to 1 MiB, the ring beyond (k = 2 saves 0.75 g n).
     * Until session 68 a socket took 40 KiB, and rd had 40-55 KiB: measured since links
     * run reno from their first packet (--algo all --fresh --window, 10 runs, medians of
     * the runs' ratios), hd / linear 1.45-1.72 at 24-64 KiB, 1.26 at 96, 0.94 at 128; rd
     * / linear 1.01-1.23 at 24-96 KiB, 0.85 at 128 */
    const double cb = crowd.beta_ns * 1e-3, cg = crowd.gamma_ns * 1e-3, ca = crowd.alpha_us;
    ck_assert(tt_cost_estimate(&crowd, TT_COLL_ALLREDUCE, "rd", 0, 4, 0) == 4 * ca);
    ck_assert(tt_cost_estimate(&crowd, TT_COLL_ALLREDUCE, "hd", 0, 4, 0) == 8 * ca);
    ck_assert(fabs(tt_cost_estimate(&crowd, TT_COLL_ALLREDUCE, "linear", 98304, 4, 0) -
                   (3 * ca + 3 * 98304 * (cb / 3 + cg))) < 1e-9);
    ck_assert(fabs(tt_cost_estimate(&crowd, TT_COLL_ALLREDUCE, "linear", 98308, 4, 0) -
                   (3 * ca + 6 * 98308 * (cb + cg))) < 1e-9);
    ck_assert(fabs(tt_cost_estimate(&crowd, TT_COLL_ALLREDUCE, "rd", 1000, 4, 0) -
                   (4 * ca + 4000 * (cb + cg))) < 1e-9);
    ck_assert(fabs(tt_cost_estimate(&crowd, TT_COLL_ALLREDUCE, "hd", 1000, 4, 0) -
                   (8 * ca + 1000 * (3 * cb + 1.5 * cg))) < 1e-9);
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLREDUCE, 4, 4), "linear");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLREDUCE, 65536, 4), "linear");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLREDUCE, 98304, 4), "linear");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLREDUCE, 98308, 4), "hd");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLREDUCE, 1 << 20, 4), "hd");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLREDUCE, (1 << 20) + 16, 4), "ring");
    /* scatter (bytes: the block, n = p blocks), crowded over sockets: the root's sends
     * queue on its CPU, as the linear broadcast's: linear 3 / 2 a + 2a/4 + 3/4 n b = 2a +
     * 3/4 n b, the tree 3 / 2 a + 3/4 n b + n/2 g: the tree while n < a / g = 120000,
     * blocks below 30000. Gather's root receives: linear 1.5a against the tree's 2a, as
     * on a host with a CPU a rank, and over shm the same */
    /* (the estimates add the handshake with the root, the same for both: 2a, gather a) */
    const double lin_sc = tt_cost_estimate(&crowd, TT_COLL_SCATTER, "linear", 1000, 4, 0);
    ck_assert(fabs(lin_sc - (4 * ca + 3000 * cb)) < 1e-9);
    ck_assert(fabs(tt_cost_estimate(&crowd, TT_COLL_SCATTER, "tree", 1000, 4, 0) -
                   (lin_sc - 0.5 * ca + 2000 * cg)) < 1e-9);
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_SCATTER, 16, 4), "tree");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_SCATTER, 29990, 4), "tree");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_SCATTER, 30010, 4), "linear");
    ck_assert(tt_cost_estimate(&crowd, TT_COLL_GATHER, "linear", 0, 4, 0) == 2.5 * ca);
    ck_assert(tt_cost_estimate(&crowd, TT_COLL_GATHER, "tree", 0, 4, 0) == 3 * ca);
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_GATHER, 16, 4), "linear");
    ck_assert(tt_cost_estimate(&shm_crowd, TT_COLL_SCATTER, "linear", 0, 4, 0) == 3.5 * sa);
    ck_assert(tt_cost_estimate(&shm_crowd, TT_COLL_SCATTER, "tree", 0, 4, 0) == 4 * sa);
    /* with a local transport of its own beside the sockets ("shm+tcp": the host's peers
     * over shm) none of the three socket rules applies: hd's bytes, the scatter's and the
     * alltoall's as on a host with a CPU a rank */
    tt_cost_t mux_crowd = crowd;
    mux_crowd.local_beta_ns = shm_crowd.beta_ns;
    ck_assert(fabs(tt_cost_estimate(&mux_crowd, TT_COLL_ALLREDUCE, "hd", 1000, 4, 0) -
                   (8 * ca + 1000 * (1.5 * cb + 0.75 * cg))) < 1e-9);
    ck_assert_str_eq(pick_c(&mux_crowd, TT_COLL_SCATTER, 16, 4), "linear");
    ck_assert_str_eq(pick_c(&mux_crowd, TT_COLL_ALLTOALL, 4 << 20, 4), "pairwise");
    /* over shm, the same host: ring, rd and hd count their bytes at ranks / CPUs too
     * (since session 68; the checks above) */
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_ALLREDUCE, "hd", 1000, 4, 0) -
                   (8 * sa + 2 * 1000 * (1.5 * sb + 0.75 * sg) * 1e-3)) < 1e-9);
    /* allgather: linear 3a + 3.75 n b/3 while its messages fit a socket's buffer (96
     * KiB), else 3a + 3.75 n b; pairwise 4a + 1.2 x 0.75 n b; the ring 6a + 0.75 n b
     * (rd as many messages, more bytes): linear to 57143 bytes (above), pairwise to 2a /
     * (0.2 x 0.75 b) = 266667 bytes (355556 at 1.15, sessions 61-63), then the ring
     * (linear below 20000 bytes, then the ring, until session 61; to 40 KiB, a socket's
     * buffer then, sessions 61-67) */
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLGATHER, 40964, 4), "linear");
    tt_cost_t crowd8 = crowd; /* 8 ranks on 2 CPUs: linear to the socket's 96 KiB */
    crowd8.host_ranks = 8;
    ck_assert_str_eq(pick_c(&crowd8, TT_COLL_ALLGATHER, 98304, 8), "linear");
    ck_assert_str_eq(pick_c(&crowd8, TT_COLL_ALLGATHER, 98308, 8), "pairwise");
    /* reduce_scatter (n: the whole input), crowded over shm: linear 3.5a + 3 n (b/3 + g)
     * + 3/4 n b/3 = 3.5a + 0.5 ns/B, pairwise (the steps' latency, over shm the
     * alltoall's) 3a + 3 (0.9 n/4 b + n/4 g) = 3a + 0.1975 ns/B, the ring 3a + 12
     * / 2 a/2 + 0.2125 ns/B = 6a + 0.2125 ns/B: pairwise at every size (linear below 8264
     * bytes until session 60, when pairwise counted the ring's latency) */
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_REDUCE_SCATTER, "pairwise", 0, 4, 0) -
                   3.0 * sa) < 1e-9);
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_REDUCE_SCATTER, "ring", 0, 4, 0) -
                   6.0 * sa) < 1e-9);
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_REDUCE_SCATTER, "linear", 4, 4, 0) -
                   (3.5 * sa + (12 * (sb / 3 + sg) + 3 * sb / 3) * 1e-3)) < 1e-9);
    for (size_t n = 16; n <= (size_t)1 << 24; n *= 4)
        ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_REDUCE_SCATTER, n, 4), "pairwise");
    /* over sockets: linear 6 / 2 a + 3 n (b/3 + g) + 3/4 n b/3 = 3a + 0.875 ns/B (its
     * messages within a socket's buffer), pairwise the ring's 12 / 2 a + 0.4 ns/B (not
     * the allgather's 2a less: a block is reduced as it lands, by its receiver): linear
     * below 3a / 0.475 ns/B = 63158 bytes (measured over tcp, 4 ranks on 2 CPUs, --algo
     * all --fresh --window, session 68, 10 runs, medians of the runs' pairwise / linear:
     * 1.13-1.16 at 24-32 KiB, 1.04 at 48, 0.97-0.99 at 64-96, 0.62-0.65 from 128; with
     * 2a less pairwise was picked from 21053 bytes) */
    ck_assert(tt_cost_estimate(&crowd, TT_COLL_REDUCE_SCATTER, "pairwise", 0, 4, 0) ==
              6 * tcp.alpha_us);
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_REDUCE_SCATTER, 63150, 4), "linear");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_REDUCE_SCATTER, 63170, 4), "pairwise");
    /* not crowded, 16 B: linear's 2a + 2 (p - 2) a/4 against the others' (p - 1) a:
     * level at 4 ranks (pairwise's fewer bytes win), linear from 5 */
    for (int p = 2; p <= 64; p++)
        ck_assert_str_eq(pick_c(&tcp, TT_COLL_REDUCE_SCATTER, 16, p),
                         p <= 4 ? "pairwise" : "linear");
    /* alltoall (bytes: the block, n = p blocks). Bruck: L rounds of n/2, p L messages,
     * (L + 2) n copied at g. Not crowded, 4 ranks: pairwise 3a + 3/4 n b, Bruck 2a + n b
     * + 4 n g: Bruck while n < a / (b/4 + 4g) = 21818 bytes, blocks below 5454; 8 ranks:
     * 7a + 7/8 n b against 3a + 3/2 n b + 5 n g, n < 4a / (5/8 b + 5g) = 54857, blocks
     * below 6857; 2 and 3 ranks never (as many rounds as pairwise, more bytes) */
    const double ta = tcp.alpha_us, tb = tcp.beta_ns * 1e-3, tg = tcp.gamma_ns * 1e-3;
    ck_assert(fabs(tt_cost_estimate(&tcp, TT_COLL_ALLTOALL, "bruck", 1000, 4, 0) -
                   (2 * ta + 4000 * (tb + 4 * tg))) < 1e-9);
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLTOALL, 5400, 4), "bruck");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLTOALL, 5500, 4), "pairwise");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLTOALL, 6800, 8), "bruck");
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLTOALL, 6900, 8), "pairwise");
    for (int p = 2; p <= 3; p++)
        ck_assert_str_eq(pick_c(&tcp, TT_COLL_ALLTOALL, 1, p), "pairwise");
    /* crowded over sockets, 4 ranks on 2 CPUs: pairwise's 12 messages over 2 CPUs less
     * the 2a its one round of posts saves against the ring's steps (session 61), 4a +
     * 3/4 n b, and 0.15 x 3/4 b a byte beyond 4 blocks of 512 KiB (session 64); Bruck's 8,
     * 4a + n (b + 4g), never below pairwise; linear's 6, 3a + 9/4 n (b/3 + g) while its
     * messages (3/4 n) fit a socket's buffer (96 KiB: blocks to 32768), 3a + 9/4 n
     * (b + g) beyond: linear while a > 9/4 n g, to n = 53333, blocks of 13333 (measured
     * tcp pairwise / linear 1.07-1.27 at 4-32 KiB, 0.95 at 64 KiB: 16 KiB blocks), then
     * pairwise; the ring's 6a + 3/4 n b from 2 MiB + 2a / (0.15 x 3/4 b) = 2452708
     * bytes, blocks of 613177 (pairwise / ring 0.63 at 512 KiB, 0.71-0.73 at 1 MiB,
     * 0.83-1.00 at 2, 1.01-1.11 at 4, 1.11 at 8, 1.15 at 16) */
    ck_assert(tt_cost_estimate(&crowd, TT_COLL_ALLTOALL, "pairwise", 0, 4, 0) == 4 * ta);
    ck_assert(tt_cost_estimate(&crowd, TT_COLL_ALLTOALL, "bruck", 0, 4, 0) == 4 * ta);
    ck_assert(fabs(tt_cost_estimate(&crowd, TT_COLL_ALLTOALL, "linear", 1000, 4, 0) -
                   (3 * ta + 9000 * (tb / 3 + tg))) < 1e-9);
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLTOALL, 16, 4), "linear");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLTOALL, 13332, 4), "linear");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLTOALL, 13335, 4), "pairwise");
    ck_assert(fabs(tt_cost_estimate(&crowd, TT_COLL_ALLTOALL, "ring", 1000, 4, 0) -
                   (6 * ta + 3000 * tb)) < 1e-9);
    ck_assert(fabs(tt_cost_estimate(&crowd, TT_COLL_ALLTOALL, "pairwise", 1000, 4, 0) -
                   (4 * ta + 3000 * tb)) < 1e-9);
    ck_assert(fabs(tt_cost_estimate(&crowd, TT_COLL_ALLTOALL, "pairwise", 2 << 20, 4, 0) -
                   (4 * ta + 0.75 * (8 << 20) * tb + 0.15 * 0.75 * (6 << 20) * tb)) < 1e-6);
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLTOALL, 88892, 4), "pairwise");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLTOALL, 613170, 4), "pairwise");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLTOALL, 613180, 4), "ring");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_ALLTOALL, 4 << 20, 4), "ring");
    ck_assert(fabs(tt_cost_estimate(&tcp, TT_COLL_ALLTOALL, "ring", 1000, 4, 0) -
                   (3 * ta + 6000 * tb)) < 1e-9);
    /* crowded over shm, pairwise's one round of sends stays (p - 1) a = 3a; Bruck 2a +
     * 8 / 2 a/2 = 4a and more bytes: pairwise at every size */
    ck_assert(tt_cost_estimate(&shm_crowd, TT_COLL_ALLTOALL, "pairwise", 0, 4, 0) == 3 * sa);
    ck_assert(tt_cost_estimate(&shm_crowd, TT_COLL_ALLTOALL, "bruck", 0, 4, 0) == 4 * sa);
    /* linear: 2 rounds and its 6 messages over 2 CPUs at a/2, 3.5a, and more bytes */
    ck_assert(tt_cost_estimate(&shm_crowd, TT_COLL_ALLTOALL, "linear", 0, 4, 0) == 3.5 * sa);
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_ALLTOALL, 1, 4), "pairwise");
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_ALLTOALL, 1 << 20, 4), "pairwise");
    /* 2 ranks: rd's one round */
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_ALLREDUCE, 4, 2), "rd");
    /* reduce, crowded (4 ranks on 2 CPUs): the ring's reduce-scatter steps at ranks /
     * CPUs, 6a + 1.5 n (b + g) + 0.75 n b, against the tree's 2a + 2 n (b + g) (its
     * rounds have 2 and 1 receivers): the tree from 96 KiB over sockets, where below it
     * linear's 3 messages over 2 CPUs, 1.5a, and its root's copies at b/3 beat the
     * tree's 2a; uncrowded, the ring
     * from 2a / (0.5 b - 0.25 g) bytes. Over shm linear, 1.75a + 3 n (b/3 + g) while its
     * 3 n fit the root's cache (256 KiB), beats the tree to 87381 bytes, and from there
     * its copies count b: the tree to 1 MiB. Above the 1 MiB channel the tree's
     * first-round senders copy beside its receivers (4 ranks at work on 2 CPUs): 2a +
     * n (2b + g) + n (b + g) = 2a + 3 n b + 2 n g, above the ring from 4a / (0.75 b -
     * 0.5 g) bytes (96000 over tcp, 20870 over shm): the ring just above 1 MiB */
    for (size_t bytes = 65536; bytes <= (1u << 20); bytes *= 4) {
        ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_REDUCE, bytes, 4),
                         bytes <= 87381 ? "linear" : "tree");
        ck_assert_str_eq(pick_c(&crowd, TT_COLL_REDUCE, bytes, 4),
                         bytes <= 98304 ? "linear" : "tree");
    }
    for (size_t bytes = 4; bytes <= 87381; bytes *= 4)
        ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_REDUCE, bytes, 4), "linear");
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_REDUCE, 87381, 4), "linear");
    ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_REDUCE, 87382, 4), "tree");
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_REDUCE, "linear", 1000, 4, 0) -
                   (2.75 * sa + 3000 * (shm_crowd.beta_ns / 3 + shm_crowd.gamma_ns) * 1e-3)) <
              1e-9);
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_REDUCE, 4096, 4), "linear");
    /* over sockets linear's root copies at b/3 while each vector fits a socket's buffer
     * (96 KiB; 40 KiB sessions 61-67): linear to 98304 bytes (tcp, linear / tree 0.84
     * with --window, 0.69 with barriers at 16 KiB; 0.79-0.93 at 64 KiB; session 68,
     * --window, 10 runs, medians of tree / linear: 1.03-1.05 at 48-96 KiB, 1.01-1.06 at
     * 128-192, 1.14 at 256) */
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_REDUCE, 16384, 4), "linear");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_REDUCE, 98304, 4), "linear");
    ck_assert_str_eq(pick_c(&crowd, TT_COLL_REDUCE, 98308, 4), "tree");
    for (size_t bytes = (1u << 20) + 4096; bytes <= (64u << 20); bytes *= 8) {
        ck_assert_str_eq(pick_c(&shm_crowd, TT_COLL_REDUCE, bytes, 4), "ring");
        ck_assert_str_eq(pick_c(&crowd, TT_COLL_REDUCE, bytes, 4), "ring");
    }
    /* + a: the root's release (agree_lag 0 in a bare table) */
    ck_assert(fabs(tt_cost_estimate(&shm_crowd, TT_COLL_REDUCE, "tree", 1000, 4, 0) -
                   (3 * sa + 2000 * (shm_crowd.beta_ns + shm_crowd.gamma_ns) * 1e-3)) < 1e-9);
    {
        const double big = 2 << 20;
        ck_assert(fabs(tt_cost_estimate(&crowd, TT_COLL_REDUCE, "tree", (size_t)big, 4, 0) -
                       (3 * ta + big * (3 * tb + 2 * tg))) < 1e-6);
        /* uncrowded, the senders' copies run on CPUs of their own: L (a + n (b + g)) */
        tt_cost_t spare = crowd;
        spare.host_cpus = 4;
        ck_assert(fabs(tt_cost_estimate(&spare, TT_COLL_REDUCE, "tree", (size_t)big, 4, 0) -
                       (3 * ta + 2 * big * (tb + tg))) < 1e-6);
    }
    ck_assert_str_eq(pick_c(&tcp, TT_COLL_REDUCE, 1 << 20, 4), "ring");
    /* over sockets on one host (loopback) with a CPU a rank, the ring's steps count
     * their bytes twice (each rank copies its send and its receive): 2 ranks, 2a + n/2
     * (2b + g) + n/2 b = 2a + 1.5 n b + n g / 2 against the tree's a + n (b + g): the
     * tree at every size. On two hosts, or unknown ones, the ring from 2a / (g/2) =
     * 240000 bytes as before. Crowded (3 ranks on 2 CPUs) the ring's steps take 2 turns
     * (ring_turns), 5a + n (2b + 4/3 g), and the tree's second round is its leaf's,
     * sent at the start, at b/3: 3a + n (4/3 b + 2 g); linear 2a + 2 n (b/3 + g)
     * while a vector fits a socket's buffer (96 KiB), then at b: linear to 98304 bytes,
     * then the tree, never the ring */
    {
        const int one_host[4] = { 0, 0, 0, 0 }, two_hosts[2] = { 0, 1 };
        tt_cost_t lo = tcp, apart = tcp, lo_crowd = tcp, split;
        tt_cost_table(&split, "shm+tcp"); /* the host's peers over shm: no socket */
        ck_assert(split.local_beta_ns > 0);
        tt_cost_set_hosts(&split, one_host, 2);
        split.host_ranks = split.host_cpus = 2;
        tt_cost_set_hosts(&lo, one_host, 2);
        lo.host_ranks = lo.host_cpus = 2;
        tt_cost_set_hosts(&apart, two_hosts, 2);
        apart.host_ranks = apart.host_cpus = 1;
        tt_cost_set_hosts(&lo_crowd, one_host, 3);
        lo_crowd.host_ranks = 3;
        lo_crowd.host_cpus = 2;
        ck_assert(fabs(tt_cost_estimate(&lo, TT_COLL_REDUCE, "ring", 1000, 2, 0) -
                       (2 * tcp.alpha_us + 500 * (2 * tcp.beta_ns + tcp.gamma_ns) * 1e-3 +
                        500 * tcp.beta_ns * 1e-3 + tcp.alpha_us)) < 1e-9);
        for (size_t bytes = 4096; bytes <= (256u << 20); bytes *= 4)
            ck_assert_str_eq(pick_c(&lo, TT_COLL_REDUCE, bytes, 2), "tree");
        ck_assert_str_eq(pick_c(&apart, TT_COLL_REDUCE, 239000, 2), "tree");
        ck_assert_str_eq(pick_c(&apart, TT_COLL_REDUCE, 241000, 2), "ring");
        ck_assert_str_eq(pick_c(&tcp, TT_COLL_REDUCE, 241000, 2), "ring");
        ck_assert(fabs(tt_cost_estimate(&lo_crowd, TT_COLL_REDUCE, "ring", 3000, 3, 0) -
                       (5 * tcp.alpha_us +
                        3000 * (2 * tcp.beta_ns + 4.0 / 3 * tcp.gamma_ns) * 1e-3)) < 1e-9);
        ck_assert(fabs(tt_cost_estimate(&lo_crowd, TT_COLL_REDUCE, "tree", 3000, 3, 0) -
                       (3 * tcp.alpha_us +
                        3000 * (4.0 / 3 * tcp.beta_ns + 2 * tcp.gamma_ns) * 1e-3)) < 1e-9);
        ck_assert_str_eq(pick_c(&lo_crowd, TT_COLL_REDUCE, 98304, 3), "linear");
        for (size_t bytes = 98308; bytes <= (256u << 20); bytes *= 4)
            ck_assert_str_eq(pick_c(&lo_crowd, TT_COLL_REDUCE, bytes, 3), "tree");
        ck_assert_str_eq(pick_c(&split, TT_COLL_REDUCE, 1 << 20, 2), "ring");
        /* crowded, the ring's latency is the barrier's, its 35 messages at 6 ranks over
         * 2 CPUs: over shm 10 rounds a + 17.5 a/2 = 18.75a (+ a, the release), where it
         * was 10a; at 64 KiB then the tree (3 rounds: 3, 1 and 1 receivers), not the
         * ring (measured 2.3-2.7x linear's time there, the tree 1.1x) */
        tt_cost_t six;
        tt_cost_table(&six, "shm");
        six.host_ranks = 6;
        six.host_cpus = 2;
        ck_assert(fabs(tt_cost_estimate(&six, TT_COLL_REDUCE, "ring", 0, 6, 0) -
                       19.75 * six.alpha_us) < 1e-9);
        ck_assert_str_eq(pick_c(&six, TT_COLL_REDUCE, 65536, 6), "tree");
    }

    /* scan and exscan, 4 ranks over tcp: rd 2a + 2 n b + 3 n g; linear (3 + c - 1)(a +
     * min(n, chunk)(b + g)), chunks of 256 KiB below 4 MiB: one chunk, 3a + 3 n (b + g),
     * never beats rd; c chunks of 256 KiB, (c + 2)(a + 152.9 us) against 2a + 327.7 c us:
     * linear from c = 2 (512 KiB: 651.6 against 675.4), rd at 600000 B (c = 3: 814.5
     * against 770) and linear again at 768 KiB (814.5 against 1003) */
    for (int cl = TT_COLL_SCAN; cl <= TT_COLL_EXSCAN; cl++) {
        /* + a: the last rank's release, waited for in the call (agree_lag 0 here) */
        ck_assert(fabs(tt_cost_estimate(&tcp, cl, "rd", 1000, 4, 0) -
                       (3 * ta + 2000 * tb + 3000 * tg)) < 1e-9);
        ck_assert(fabs(tt_cost_estimate(&tcp, cl, "linear", 1000, 4, 0) -
                       (ta + 3 * (ta + 1000 * (tb + tg)))) < 1e-9);
        ck_assert_str_eq(pick_c(&tcp, cl, 4, 4), "rd");
        ck_assert_str_eq(pick_c(&tcp, cl, 256 << 10, 4), "rd");
        ck_assert_str_eq(pick_c(&tcp, cl, 512 << 10, 4), "linear");
        ck_assert_str_eq(pick_c(&tcp, cl, 600000, 4), "rd");
        ck_assert_str_eq(pick_c(&tcp, cl, 768 << 10, 4), "linear");
        ck_assert_str_eq(pick_c(&tcp, cl, 64 << 20, 8), "linear");
        ck_assert_str_eq(pick_c(&tcp, cl, 4, 8), "rd");
        /* crowded, 4 ranks on 2 CPUs: rd's 8 messages over 2 CPUs against the chain's 3,
         * and its bytes at twice the time: the chain at every size, over either */
        for (size_t bytes = 4; bytes <= (64u << 20); bytes *= 8) {
            ck_assert_str_eq(pick_c(&crowd, cl, bytes, 4), "linear");
            ck_assert_str_eq(pick_c(&shm_crowd, cl, bytes, 4), "linear");
        }
    }

    /* NULL cost is the tcp table */
    ck_assert_str_eq(pick(NULL, TT_COLL_ALLREDUCE, 239000, 2), "rd");
    ck_assert_str_eq(pick(NULL, TT_COLL_ALLREDUCE, 241000, 2), "ring");
}
END_TEST

START_TEST(cost_tables_and_strings)
{
    tt_cost_t c, t;
    tt_cost_table(&c, "shm");
    tt_cost_table(&t, "tcp");
    ck_assert(c.alpha_us < t.alpha_us && c.beta_ns < t.beta_ns);
    tt_cost_table(&c, "shm+tcp"); /* the slower link sets the pace */
    ck_assert(c.alpha_us == t.alpha_us && c.beta_ns == t.beta_ns);
    ck_assert_str_eq(c.source, "table tcp");
    tt_cost_table(&c, "nosuch");
    ck_assert(c.alpha_us == t.alpha_us);
    /* every part counts and an unknown part (a plugin) counts as tcp: before, "shm+fab"
     * got shm's numbers while a lone rank's "fab" got tcp's */
    tt_cost_table(&c, "shm+fab");
    ck_assert(c.alpha_us == t.alpha_us && c.beta_ns == t.beta_ns);
    tt_cost_t ib;
    tt_cost_table(&ib, "ibverbs");
    ck_assert(ib.alpha_us < t.alpha_us && ib.beta_ns < t.beta_ns);
    tt_cost_table(&c, "tcp+ibverbs");
    ck_assert_str_eq(c.source, "table tcp");
    tt_cost_table(&c, "shm+ibverbs");
    ck_assert_str_eq(c.source, "table ibverbs");
    char err[256];
    ck_assert_int_eq(tt_cost_parse("alpha=2.5,bw=10,reduce=4", &c, err, sizeof(err)), TUTTI_OK);
    ck_assert(c.alpha_us == 2.5 && c.beta_ns == 0.1 && c.gamma_ns == 0.25);
    /* bw=1e-320: finite, but its inverse is not (beta infinite, every estimate NaN) */
    const char *bad[] = { "alpha",     "alpha=",        "alpha=-1",         "alpha=x",
                          "bw=0",      "latency=3",     "alpha=1,",         "reduce=nan",
                          "bw=1e-320", "reduce=4e-324", "alpha=1,bw=1e-310" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int st = tt_cost_parse(bad[i], &c, err, sizeof(err));
        ck_assert_msg(st == TUTTI_ERR_CONFIG, "%s accepted", bad[i]);
        ck_assert_msg(strstr(err, "expected"), "%s: %s", bad[i], err);
    }
    ck_assert_int_eq(tt_cost_parse("bw=1e-300,reduce=1e300", &c, err, sizeof(err)), TUTTI_OK);
    ck_assert(isfinite(c.beta_ns) && c.gamma_ns > 0);
}
END_TEST

/* The fuser's packing bound from a model whose estimates are NaN (an infinite beta: 0
 * bytes of it; a NaN alpha) is 0, not a NaN converted to size_t (undefined; 2^63 on
 * x86-64) */
START_TEST(pack_below_of_nan)
{
    tutti_comm_t *comm = calloc(1, sizeof(*comm));
    ck_assert_ptr_nonnull(comm);
    comm->nranks = 4;
    comm->opts.chunk_bytes = (size_t)1 << 20;
    tt_cost_table(&comm->cost, "tcp");
    size_t b = tt_comm_pack_below(comm, 1);
    ck_assert_msg(b > 0 && b < (size_t)1 << 40, "%zu", b);
    comm->cost.beta_ns = INFINITY;
    ck_assert(isnan(tt_cost_estimate(&comm->cost, TT_COLL_ALLREDUCE, "rd", 0, 4, 1 << 20)));
    ck_assert_uint_eq(tt_comm_pack_below(comm, 0), 0);
    tt_cost_table(&comm->cost, "tcp");
    comm->cost.alpha_us = NAN;
    ck_assert_uint_eq(tt_comm_pack_below(comm, 0), 0);
    ck_assert_uint_eq(tt_comm_pack_below(comm, 1), 0);
    free(comm);
}
END_TEST

/* Every rank ends with the same cost model (or they would pick different algorithms),
 * compared through the store, and the communicator works. 0 or 1 (printed why). */
static int same_model_everywhere(int rank, int nranks, tutti_comm_t *comm, tutti_store_t *store)
{
    const char *d = tutti_comm_cost_model(comm);
    char key[32];
    snprintf(key, sizeof(key), "model/%d", rank);
    FAIL_IF(tutti_store_set(store, key, d, strlen(d) + 1) != 0, "store set");
    for (int r = 0; r < nranks; r++) {
        void *v = NULL;
        size_t len = 0;
        snprintf(key, sizeof(key), "model/%d", r);
        FAIL_IF(tutti_store_get(store, key, &v, &len, 20000) != 0, "store get");
        int differ = strcmp((const char *)v, d) != 0;
        if (differ)
            fprintf(stderr, "rank %d: rank %d has %s, this rank %s\n", rank, r, (char *)v, d);
        free(v);
        if (differ)
            return 1;
    }
    int64_t x = rank + 1, y = 0;
    FAIL_IF(tutti_allreduce(comm, &x, &y, 1, TUTTI_INT64, TUTTI_SUM) != 0, "allreduce");
    FAIL_IF(y != (int64_t)nranks * (nranks + 1) / 2, "sum %lld", (long long)y);
    return 0;
}

/* A 3-rank case of cost models: rank r starts from TUTTI_COST_MODEL models[r] (through
 * its own store handle), then check runs on its communicator. */
typedef struct model_case model_case_t;
struct model_case {
    const char *models[4];
    int (*check)(int rank, int nranks, tutti_comm_t *comm, tutti_store_t *store,
                 const model_case_t *mc);
    const char *hosts; /* rank r on "host-<hosts[r]>" (NULL: 3 ranks on this host) */
    const char *algo;  /* TUTTI_ALGO of every rank (NULL: none) */
    const char *pin;   /* every rank runs on one CPU (the same one) over this transport */
    int crowd;         /* the ranks on rank 0's crowded host check_crowded expects (0: none) */
};

static int rank_model(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const model_case_t *mc = arg;
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 20000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.cost_model = mc->models[rank];
    o.algo = mc->algo;
    char hid[16];
    if (mc->hosts) {
        snprintf(hid, sizeof(hid), "host-%c", mc->hosts[rank]);
        o.host_id = hid;
        o.transport = "auto"; /* shm within a host, tcp across, whatever the suite runs over */
    }
    if (mc->pin) {
        /* one transport for every peer: host-mates are counted from the host ids all
         * the same (tcp alone once took every peer for one) */
        o.transport = mc->pin;
        cpu_set_t set;
        FAIL_IF(sched_getaffinity(0, sizeof(set), &set) != 0, "sched_getaffinity");
        int first = 0;
        while (first < CPU_SETSIZE && !CPU_ISSET(first, &set))
            first++;
        CPU_ZERO(&set);
        CPU_SET(first, &set);
        FAIL_IF(sched_setaffinity(0, sizeof(set), &set) != 0, "sched_setaffinity");
    }
    tutti_comm_t *comm = NULL;
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    FAIL_IF(st != 0, "init: %s", tutti_status_name(st));
    if (mc->check(rank, nranks, comm, store, mc))
        return 1;
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

static void run_models(const model_case_t *mc)
{
    int n = mc->hosts ? (int)strlen(mc->hosts) : 3;
    ck_assert_int_eq(th_run_nocomm(n, rank_model, (void *)mc, 60000), 0);
}

/* TUTTI_COST_MODEL=probe: every rank ends with the same measured parameters (or the
 * ranks would pick different algorithms), and they are plausible. */
static int check_probe(int rank, int nranks, tutti_comm_t *comm, tutti_store_t *store,
                       const model_case_t *mc)
{
    (void)mc;
    const char *d = tutti_comm_cost_model(comm);
    FAIL_IF(strncmp(d, "probe: alpha ", 13), "cost model %s", d);
    double a = 0, bw = 0, red = 0;
    FAIL_IF(sscanf(d, "probe: alpha %lf us, bw %lf GB/s, reduce %lf GB/s", &a, &bw, &red) != 3,
            "cannot read %s", d);
    FAIL_IF(!(a > 0 && a < 100000 && bw > 0 && red > 0), "implausible: %s", d);
    FAIL_IF(same_model_everywhere(rank, nranks, comm, store) != 0, "see above");
    return 0;
}

START_TEST(probe_agrees)
{
    static const model_case_t mc = { { "probe", "probe", "probe" }, check_probe, NULL, NULL, 0, 0 };
    run_models(&mc);
}
END_TEST

/* Ranks that start from different cost models (here different TUTTI_COST_MODEL strings;
 * in the field, transport names that differ between a rank with host-mates and one
 * alone) all take rank 0's, so they pick the same algorithm at every size: an allreduce
 * at a size where their own models disagree gives the right sum. */
static int check_disagree(int rank, int nranks, tutti_comm_t *comm, tutti_store_t *store,
                          const model_case_t *mc)
{
    (void)store;
    (void)mc;
    const char *d = tutti_comm_cost_model(comm);
    FAIL_IF(!strstr(d, "alpha 0.50 us"), "rank %d kept its own model: %s", rank, d);
    enum { N = 3 };
    static const size_t sizes[N] = { 4096, 262144, 4 << 20 };
    for (int k = 0; k < N; k++) {
        size_t n = sizes[k] / 4;
        int32_t *x = malloc(n * sizeof(int32_t));
        for (size_t e = 0; e < n; e++)
            x[e] = (int32_t)(e % 1000) + rank;
        int st = tutti_allreduce(comm, TUTTI_IN_PLACE, x, n, TUTTI_INT32, TUTTI_SUM);
        FAIL_IF(st != 0, "allreduce of %zu bytes: %s", sizes[k], tutti_comm_last_error(comm));
        for (size_t e = 0; e < n; e++)
            FAIL_IF(x[e] != (int32_t)(nranks * (e % 1000) + nranks * (nranks - 1) / 2),
                    "%zu bytes: element %zu is %d", sizes[k], e, x[e]);
        free(x);
    }
    return 0;
}

START_TEST(models_agree)
{
    static const model_case_t mc = { { "alpha=0.5,bw=100,reduce=100",
                                       "alpha=5000,bw=0.01,reduce=0.01",
                                       "alpha=50,bw=1,reduce=50" },
                                     check_disagree,
                                     NULL,
                                     NULL,
                                     0,
                                     0 };
    run_models(&mc);
}
END_TEST

/* A crowded host is rank 0's view, like the rest of the model, counted from the host
 * ids even where one transport (tcp) serves every peer; every rank pinned to one CPU.
 * With mc->crowd ranks on rank 0's host every rank describes that host and picks the
 * tree barrier (a rank alone on its host too); with none crowded, dissemination. Either
 * way the barrier holds (a rank that counts arrivals too early fails). */
static int check_crowded(int rank, int nranks, tutti_comm_t *comm, tutti_store_t *store,
                         const model_case_t *mc)
{
    const char *d = tutti_comm_cost_model(comm);
    char want[64];
    snprintf(want, sizeof(want), "; crowded: %d ranks on 1 CPU", mc->crowd);
    if (mc->crowd)
        FAIL_IF(!strstr(d, want) || strstr(d, "CPUs"), "rank %d: cost model %s, want \"%s\"", rank,
                d, want);
    else
        FAIL_IF(strstr(d, "crowded") != NULL, "rank %d: cost model %s, not crowded", rank, d);
    const char *b = tutti_comm_algo_for(comm, "barrier", 0);
    /* over shared memory the fewest rounds: every rank to rank 0 and back */
    const char *wb = !mc->crowd ? "dissemination" : !strcmp(mc->pin, "shm") ? "linear" : "tree";
    FAIL_IF(!b || strcmp(b, wb), "rank %d: barrier picks %s, not %s", rank, b ? b : "NULL", wb);
    /* a 4 B allreduce at 3 ranks: linear's 2 rounds against rd's 3 (fold, exchange,
     * unfold) where a rank has a CPU or over shared memory; over crowded sockets rd,
     * linear and hd all come to 4 a (4 messages on one CPU, or hd's 4 rounds), a tie
     * the bytes decide (measured on 2 CPUs: 12.0-12.9 us each), but never the ring's
     * 12 messages */
    const char *ar = tutti_comm_algo_for(comm, "allreduce", 4);
    const char *war = mc->crowd && strcmp(mc->pin, "shm") ? NULL : "linear";
    FAIL_IF(!ar || (war && strcmp(ar, war)) || !strcmp(ar, "ring"),
            "rank %d: a 4 B allreduce picks %s, not %s", rank, ar ? ar : "NULL",
            war ? war : "one of 4 messages");
    FAIL_IF(same_model_everywhere(rank, nranks, comm, store) != 0, "see above");
    /* the barrier under its envelope: each round a different rank arrives late */
    char key[32];
    for (int k = 0; k < 6; k++) {
        if (k % nranks == rank) {
            struct timespec ts = { 0, 20 * 1000 * 1000 };
            nanosleep(&ts, NULL);
            snprintf(key, sizeof(key), "late/%d", k);
            FAIL_IF(tutti_store_set(store, key, "x", 1) != 0, "store set");
        }
        FAIL_IF(tutti_barrier(comm) != 0, "barrier %d: %s", k, tutti_comm_last_error(comm));
        /* the late rank set its key before it entered: every rank sees it now */
        snprintf(key, sizeof(key), "late/%d", k);
        const char *keys[1] = { key };
        int there = 0;
        FAIL_IF(tutti_store_check(store, keys, 1, &there) != 0, "store check");
        FAIL_IF(!there, "rank %d left barrier %d before rank %d entered it", rank, k, k % nranks);
    }
    return 0;
}

/* Over tcp, _i 0: three ranks on this host; 1: ranks 0 and 1 on host-a, rank 2 alone on
 * host-b (rank 0's host is crowded, rank 2 takes rank 0's view); 2: each rank on a host
 * of its own (none crowded, though all share one CPU of this machine). 3: three ranks on
 * this host over shm. */
START_TEST(crowded_host)
{
    static const char *hosts[4] = { NULL, "aab", "abc", NULL };
    static const char *tp[4] = { "tcp", "tcp", "tcp", "shm" };
    static const int crowd[4] = { 3, 2, 0, 3 };
    model_case_t mc = { { NULL, NULL, NULL }, check_crowded, hosts[_i], NULL, tp[_i], crowd[_i] };
    run_models(&mc);
}
END_TEST

/* The probe is a collective: ranks whose TUTTI_COST_MODEL disagree about probing follow
 * rank 0 (_i 0: rank 0 probes, the others not; 1: rank 0 does not, the others do), and
 * end with one model. */
static int check_probe_some(int rank, int nranks, tutti_comm_t *comm, tutti_store_t *store,
                            const model_case_t *mc)
{
    const int r0_probes = strcmp(mc->models[0], "probe") == 0;
    const char *d = tutti_comm_cost_model(comm);
    FAIL_IF((strncmp(d, "probe", 5) == 0) != r0_probes, "rank 0 %s, this rank has %s",
            r0_probes ? "probes" : "does not probe", d);
    FAIL_IF(same_model_everywhere(rank, nranks, comm, store) != 0, "see above");
    return 0;
}

START_TEST(probe_on_some_ranks)
{
    static const model_case_t mcs[2] = {
        { { "probe", "table", "table" }, check_probe_some, NULL, NULL, 0, 0 },
        { { "table", "probe", "probe" }, check_probe_some, NULL, NULL, 0, 0 }
    };
    run_models(&mcs[_i]);
}
END_TEST

/* hier from the host map: the formulas of cost.c worked by hand for the shm+tcp table
 * (a 10 us, b 0.5 ns/B across, bl 0.2 ns/B within a host, g 1/12 ns/B), 2 hosts of 2
 * ranks, 1 MiB chunks */
START_TEST(hier_model)
{
    tt_cost_t c;
    tt_cost_table(&c, "shm+tcp");
    ck_assert(c.beta_ns == 0.5 && c.local_beta_ns == 0.2);
    ck_assert_int_eq(c.nhosts, 0);
    const int aabb[] = { 0, 0, 1, 1 }, abcd[] = { 0, 1, 2, 3 }, aaab[] = { 0, 0, 0, 1 };
    /* no map: never hier */
    ck_assert_str_eq(pick_c(&c, TT_COLL_ALLREDUCE, 64 << 20, 4), "ring");
    tt_cost_set_hosts(&c, aabb, 4);
    ck_assert(c.nhosts == 2 && c.lmin == 2 && c.lmax == 2);
    /* 64 MiB, m = n/2: within hosts 2(a + m bl) + m g = 16238 us; across, b doubled (two
     * ranks share the link), in 16 segments of 4 MiB: the ring, 16 x 2205 = 35273 (rd is
     * more); pipelined, max(16238, 35273) + (16238 + 35273) / 16 = 38492 against the
     * flat ring's 6a + 1.5 n b + .75 n g / 4 = 51440 */
    ck_assert_int_eq(tt_cost_hier_segments(&c, 64 << 20, 2, 2, 1 << 20), 16);
    ck_assert_int_eq(tt_cost_hier_segments(&c, (8 << 20) - 1, 2, 2, 1 << 20), 1);
    ck_assert_int_eq(tt_cost_hier_segments(&c, 8 << 20, 2, 2, 1 << 20), 2);
    ck_assert_int_eq(tt_cost_hier_segments(&c, 1 << 30, 2, 2, 1 << 20), 16);
    ck_assert_int_eq(tt_cost_hier_segments(&c, 64 << 20, 1, 2, 1 << 20), 1);
    ck_assert_str_eq(pick_c(&c, TT_COLL_ALLREDUCE, 64 << 20, 4), "hier");
    /* 64 KiB: 35.8 + rd across 45.5 = 81.3 against hd's 93.3 and rd's 96.5 */
    ck_assert_str_eq(pick_c(&c, TT_COLL_ALLREDUCE, 64 << 10, 4), "hier");
    /* 4 KiB: three latencies against rd's two */
    ck_assert_str_eq(pick_c(&c, TT_COLL_ALLREDUCE, 4 << 10, 4), "rd");
    ck_assert(tt_cost_hier_cross_rd(&c, 32 << 10, 2, 2, 1 << 20));
    ck_assert(!tt_cost_hier_cross_rd(&c, 32 << 20, 2, 2, 1 << 20));
    /* local links no faster than the remote ones (rank 0 alone on its host): 2(a + m b)
     * + m g within hosts = 36370 us, but the pipeline runs it beside the 35273 across:
     * 36370 + 71643 / 16 = 40848, still under the ring's 51440; local links four times
     * slower than the remote ones (2 ns/B): 137034 within hosts, more than the ring */
    tt_cost_t slow = c;
    slow.local_beta_ns = 0;
    ck_assert_str_eq(pick_c(&slow, TT_COLL_ALLREDUCE, 64 << 20, 4), "hier");
    slow.local_beta_ns = 2.0;
    ck_assert_str_eq(pick_c(&slow, TT_COLL_ALLREDUCE, 64 << 20, 4), "ring");
    /* allgather of 64 MiB in all, blocks of 16 MiB: across, x = a + 2 blk b = 16787.2 us
     * (the two ranks of a host share its link); within, l = a + blk bl = 3365.4; x + l =
     * 20152.7 against the ring's 3 a + .75 n b = 25195.8 and rd's 30778.3 */
    ck_assert(
        fabs(tt_cost_estimate(&c, TT_COLL_ALLGATHER, "hier", 64 << 20, 4, 1 << 20) - 20152.6) < 1);
    ck_assert_str_eq(pick_c(&c, TT_COLL_ALLGATHER, 64 << 20, 4), "hier");
    /* reduce_scatter: blk g = 1398.1 more in x and l: 18185.3 + 4763.5 = 22948.9 against
     * pairwise's 3 a + 3 (.9 blk b + blk g / 4) = 23727.6 */
    ck_assert(fabs(tt_cost_estimate(&c, TT_COLL_REDUCE_SCATTER, "hier", 64 << 20, 4, 1 << 20) -
                   22948.9) < 1);
    ck_assert_str_eq(pick_c(&c, TT_COLL_REDUCE_SCATTER, 64 << 20, 4), "hier");
    /* one rank per host: hier would be the flat algorithm */
    tt_cost_set_hosts(&c, abcd, 4);
    ck_assert(c.nhosts == 4 && c.lmax == 1);
    ck_assert_str_eq(pick_c(&c, TT_COLL_ALLREDUCE, 64 << 20, 4), "ring");
    ck_assert_str_eq(pick_c(&c, TT_COLL_ALLGATHER, 64 << 20, 4), "ring");
    /* uneven 3 + 1: one shard, the whole vector through each host's chain */
    tt_cost_set_hosts(&c, aaab, 4);
    ck_assert(c.nhosts == 2 && c.lmin == 1 && c.lmax == 3);
    ck_assert_str_eq(pick_c(&c, TT_COLL_ALLREDUCE, 64 << 20, 4), "ring");
    /* hosts of different sizes: never the hierarchical allgather and reduce_scatter */
    ck_assert(isinf(tt_cost_estimate(&c, TT_COLL_ALLGATHER, "hier", 64 << 20, 4, 1 << 20)));
    ck_assert(isinf(tt_cost_estimate(&c, TT_COLL_REDUCE_SCATTER, "hier", 64 << 20, 4, 1 << 20)));
    ck_assert_str_eq(pick_c(&c, TT_COLL_ALLGATHER, 64 << 20, 4), "ring");
    ck_assert_str_eq(pick_c(&c, TT_COLL_REDUCE_SCATTER, 64 << 20, 4), "pairwise");
    tt_cost_set_hosts(&c, NULL, 4);
    ck_assert_int_eq(c.nhosts, 0);
}
END_TEST

/* The communicator learns the host map from TUTTI_HOST_ID (shm within a host, tcp
 * across): every rank has the same model, which says so and picks hier for large
 * vectors on 2 hosts of 2 (_i 0), never with rank 0 alone on its host (_i 1: its local
 * beta is unknown, and one shard), and the allreduce it picks is right. */
static int check_hosts(int rank, int nranks, tutti_comm_t *comm, tutti_store_t *store,
                       const model_case_t *mc)
{
    const char *map = mc->hosts;
    const char *d = tutti_comm_cost_model(comm);
    FAIL_IF(!strstr(d, "; 2 hosts of "), "cost model %s", d);
    const char *big = tutti_comm_algo_for(comm, "allreduce", 64 << 20);
    const int even = map[0] == map[1];
    FAIL_IF(strcmp(big, even ? "hier" : "ring"), "%s: 64 MiB picks %s", map, big);
    FAIL_IF(strcmp(tutti_comm_algo_for(comm, "allreduce", 4), "rd"), "4 bytes");
    FAIL_IF(same_model_everywhere(rank, nranks, comm, store) != 0, "see above");
    enum { N = 1 << 18 };
    int32_t *x = malloc(N * sizeof(int32_t));
    FAIL_IF(!x, "malloc");
    for (int e = 0; e < N; e++)
        x[e] = (e % 1000) * (rank + 1);
    const char *mid = tutti_comm_algo_for(comm, "allreduce", N * sizeof(int32_t));
    FAIL_IF(strcmp(mid, even ? "hier" : "hd"), "%s: 1 MiB picks %s", map, mid);
    FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, x, N, TUTTI_INT32, TUTTI_SUM) != 0, "%s",
            tutti_comm_last_error(comm));
    for (int e = 0; e < N; e++)
        FAIL_IF(x[e] != (e % 1000) * nranks * (nranks + 1) / 2, "element %d is %d", e, x[e]);
    free(x);
    return 0;
}

START_TEST(hier_from_hosts)
{
    static const model_case_t mcs[2] = { { { NULL }, check_hosts, "aabb", NULL, 0, 0 },
                                         { { NULL }, check_hosts, "abbb", NULL, 0, 0 } };
    run_models(&mcs[_i]);
}
END_TEST

/* ---- tuning files (TUTTI_COST_MODEL tune=FILE, bench/tune.py) ---- */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_ge(fputs(text, f), 0);
    ck_assert_int_eq(fclose(f), 0);
}

/* The line for (transport, ranks), or none; a bad spec or a missing file is a
 * configuration error naming the file. */
START_TEST(tune_file_lines)
{
    char path[64], err[512], *spec;
    snprintf(path, sizeof(path), "/tmp/tutti-tune-%d.txt", (int)getpid());
    write_text(path, "# transport ranks spec\n"
                     "shm 3 allreduce:rd@<1K,ring   # trailing comment\n"
                     "  tcp 3   allreduce:hd ; broadcast:chain\n"
                     "shm 4 allreduce:ring\n");
    ck_assert_int_eq(tt_algo_tune_load(path, "shm", 3, &spec, err, sizeof(err)), TUTTI_OK);
    ck_assert_str_eq(spec, "allreduce:rd@<1K,ring");
    free(spec);
    ck_assert_int_eq(tt_algo_tune_load(path, "tcp", 3, &spec, err, sizeof(err)), TUTTI_OK);
    ck_assert_str_eq(spec, "allreduce:hd ; broadcast:chain");
    free(spec);
    ck_assert_int_eq(tt_algo_tune_load(path, "shm", 2, &spec, err, sizeof(err)), TUTTI_OK);
    ck_assert_ptr_null(spec);
    write_text(path, "shm 3 allreduce:bogus\n");
    ck_assert_int_eq(tt_algo_tune_load(path, "shm", 3, &spec, err, sizeof(err)), TUTTI_ERR_CONFIG);
    ck_assert_ptr_null(spec);
    ck_assert_msg(strstr(err, path) && strstr(err, "bogus"), "%s", err);
    /* a garbled line anywhere is an error naming it, even after the line that matches */
    static const char *const garbled[] = { "shm 3 ring\nrubbish here\n", "shm three ring\n",
                                           "tcp 3\n", "shm 0 allreduce:ring\n" };
    static const int at_line[] = { 2, 1, 1, 1 };
    for (size_t i = 0; i < sizeof(garbled) / sizeof(*garbled); i++) {
        write_text(path, garbled[i]);
        ck_assert_int_eq(tt_algo_tune_load(path, "shm", 3, &spec, err, sizeof(err)),
                         TUTTI_ERR_CONFIG);
        ck_assert_ptr_null(spec);
        char want[96];
        snprintf(want, sizeof(want), "line %d: expected", at_line[i]);
        ck_assert_msg(strstr(err, path) && strstr(err, want), "%s: %s", garbled[i], err);
    }
    /* a line past the buffer is refused, not split into two */
    char longl[5000];
    memset(longl, 'x', sizeof(longl) - 2);
    memcpy(longl, "shm 3 ", 6);
    longl[sizeof(longl) - 2] = '\n';
    longl[sizeof(longl) - 1] = '\0';
    write_text(path, longl);
    ck_assert_int_eq(tt_algo_tune_load(path, "shm", 3, &spec, err, sizeof(err)), TUTTI_ERR_CONFIG);
    ck_assert_msg(strstr(err, "line 1: longer than"), "%s", err);
    unlink(path);
    ck_assert_int_eq(tt_algo_tune_load(path, "shm", 3, &spec, err, sizeof(err)), TUTTI_ERR_CONFIG);
    ck_assert_msg(strstr(err, path) && strstr(err, "No such file"), "%s", err);
    /* a directory opens, then fails its reads: an error naming it, as a missing file
     * (before, its reads' failure looked like an empty file: ignored without a word) */
    ck_assert_int_eq(tt_algo_tune_load("/tmp", "shm", 3, &spec, err, sizeof(err)),
                     TUTTI_ERR_CONFIG);
    ck_assert_ptr_null(spec);
    ck_assert_msg(strstr(err, "tuning file /tmp: Is a directory"), "%s", err);
}
END_TEST

/* Rank 0's tuning file is bad: every rank's init fails at once (not after the store's
 * 20 s timeout), and tutti_comm_last_error(NULL) says why, naming the file. */
static int rank_bad_tune(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 20000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.cost_model = rank == 0 ? arg : "table";
    tutti_comm_t *comm = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    FAIL_IF(st != TUTTI_ERR_CONFIG, "rank %d: init gave %s", rank, tutti_status_name(st));
    const char *why = tutti_comm_last_error(NULL);
    FAIL_IF(!strstr(why, (const char *)arg + 5) || !strstr(why, "line 2"), "rank %d: %s", rank,
            why);
    FAIL_IF(rank && !strstr(why, "rank 0 failed its cost model"), "rank %d: %s", rank, why);
    FAIL_IF(s > 10, "rank %d waited %.1f s", rank, s);
    tutti_store_close(store);
    return 0;
}

START_TEST(tune_bad_on_rank0)
{
    static char path[64], model[80];
    snprintf(path, sizeof(path), "/tmp/tutti-tune-bad-%d.txt", (int)getpid());
    write_text(path, "shm 3 allreduce:ring\nnot a tuning line\n");
    snprintf(model, sizeof(model), "tune=%s", path);
    ck_assert_int_eq(th_run_nocomm(3, rank_bad_tune, model, 60000), 0);
    unlink(path);
}
END_TEST

/* Every rank takes rank 0's tuned choices (rank 1's file says otherwise, rank 2 has
 * none), under the user's TUTTI_ALGO where it names the collective; the allreduce at a
 * size the tuning decides sums right. */
static int check_tune(int rank, int nranks, tutti_comm_t *comm, tutti_store_t *store,
                      const model_case_t *mc)
{
    (void)store;
    (void)mc;
    const char *d = tutti_comm_cost_model(comm);
    FAIL_IF(!strstr(d, "tuned: allreduce:hd@<1K,ring"), "rank %d: cost model %s", rank, d);
    FAIL_IF(strcmp(tutti_comm_algo_for(comm, "allreduce", 512), "hd"), "512 B");
    FAIL_IF(strcmp(tutti_comm_algo_for(comm, "allreduce", 4096), "ring"), "4 KiB");
    FAIL_IF(strcmp(tutti_comm_algo_for(comm, "broadcast", 4096), "tree"),
            "the user's broadcast:tree lost to the tuning file's chain");
    enum { N = 1024 };
    int32_t x[N];
    for (int e = 0; e < N; e++)
        x[e] = e * (rank + 1);
    FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, x, N, TUTTI_INT32, TUTTI_SUM) != 0, "%s",
            tutti_comm_last_error(comm));
    for (int e = 0; e < N; e++)
        FAIL_IF(x[e] != e * nranks * (nranks + 1) / 2, "element %d is %d", e, x[e]);
    return 0;
}

START_TEST(tune_agrees)
{
    static char p0[64], p1[64], m0[80], m1[80];
    snprintf(p0, sizeof(p0), "/tmp/tutti-tune0-%d.txt", (int)getpid());
    snprintf(p1, sizeof(p1), "/tmp/tutti-tune1-%d.txt", (int)getpid());
    write_text(p0, "tcp 3 allreduce:hd@<1K,ring;broadcast:chain\n"
                   "shm 3 allreduce:hd@<1K,ring;broadcast:chain\n");
    write_text(p1, "tcp 3 allreduce:rd\nshm 3 allreduce:rd\n");
    snprintf(m0, sizeof(m0), "tune=%s", p0);
    snprintf(m1, sizeof(m1), "table,tune=%s", p1);
    model_case_t mc = { { m0, m1, "table" }, check_tune, NULL, "broadcast:tree", 0, 0 };
    run_models(&mc);
    unlink(p0);
    unlink(p1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("select");
    th_add_tests(s, "select", 60,
                 (const TTest *const[]){ names, public_algo_list, ids_unique, force_each,
                                         bounds_and_bare, canonical_form, bad_strings,
                                         allreduce_hd_dbtree, single_copy_hints, stream_to_one,
                                         defaults, cost_tables_and_strings, pack_below_of_nan,
                                         probe_agrees, models_agree, NULL });
    th_add_case(s, "crowded_host", crowded_host, 4, 60);
    th_add_case(s, "probe_on_some_ranks", probe_on_some_ranks, 2, 60);
    th_add_tests(s, "hier_model", 60, (const TTest *const[]){ hier_model, NULL });
    th_add_case(s, "hier_from_hosts", hier_from_hosts, 2, 60);
    th_add_tests(s, "tune", 60,
                 (const TTest *const[]){ tune_file_lines, tune_agrees, tune_bad_on_rank0, NULL });
    return th_main(s);
}
