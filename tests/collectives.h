/* The collectives suite's second file (collectives_others.c): reduce, allgather(v),
 * reduce_scatter(v), gather(v), scatter(v), alltoall(v) and their async forms. */
#ifndef TH_COLLECTIVES_H
#define TH_COLLECTIVES_H

#include <check.h>
#include <stdio.h>

#include <tutti/tutti.h>

#include "harness.h"

/* Add collectives_others.c's test cases to the collectives suite. */
void collectives_others_add(Suite *s);

/* status_ok(c, st, what) for a rank's context type with rank, nranks, algo, comm,
 * failures and comm_failed: 1 when st is TUTTI_OK; else one line naming the rank, the
 * algorithm, the call and the cause, and the context marked failed. */
#define TH_DEFINE_STATUS_OK(ctx_type)                                                              \
    static int status_ok(ctx_type *c, int st, const char *what)                                    \
    {                                                                                              \
        if (st == TUTTI_OK)                                                                        \
            return 1;                                                                              \
        fprintf(stderr, "rank %d/%d [%s] %s: %s: %s\n", c->rank, c->nranks, c->algo, what,         \
                tutti_status_name(st), tutti_comm_last_error(c->comm));                            \
        c->failures++;                                                                             \
        c->comm_failed = 1;                                                                        \
        return 0;                                                                                  \
    }

/* One matrix run: nranks ranks of fn(arg) under opts, timed; label names it. */
static inline void coll_run_matrix(int nranks, th_rank_fn fn, void *arg,
                                   const tutti_comm_opts_t *opts, const char *label)
{
    th_spec_t spec = { .nranks = nranks, .fn = fn, .arg = arg, .timeout_ms = 100000, .opts = opts };
    double t0 = th_now_ms();
    int rc = th_run_ex(&spec, NULL);
    fprintf(stderr, "matrix %s on %d rank(s): %.0f ms\n", label, nranks, th_now_ms() - t0);
    ck_assert_msg(rc == 0, "%s on %d rank(s) failed (see above)", label, nranks);
}

/* After a rank's matrix: how many failures went unreported past the first max_shown. */
static inline void coll_more_failures(int rank, int nranks, const char *label, int failures,
                                      int max_shown)
{
    if (failures > max_shown)
        fprintf(stderr, "rank %d/%d [%s]: %d more failures not shown\n", rank, nranks, label,
                failures - max_shown);
}

#endif
