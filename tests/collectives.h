/* The collectives suite's second file (collectives_others.c): reduce, allgather(v),
 * reduce_scatter(v), gather(v), scatter(v), alltoall(v) and their async forms. */
#ifndef TH_COLLECTIVES_H
#define TH_COLLECTIVES_H

#include <check.h>
#include <stdio.h>
#include <string.h>

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

/* One matrix run: nranks ranks of fn(arg) under opts, timed; label names it. Left out
 * (and said) above TT_TEST_MAX_RANKS ranks where that is set. */
static inline void coll_run_matrix(int nranks, th_rank_fn fn, void *arg,
                                   const tutti_comm_opts_t *opts, const char *label)
{
    if (nranks > th_max_ranks()) {
        fprintf(stderr, "matrix %s on %d rank(s): left out (TT_TEST_MAX_RANKS=%d)\n", label, nranks,
                th_max_ranks());
        return;
    }
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

/* Ranks on "hosts" of a map such as "aabb" (rank r on host-<map[r]>, shm within a host,
 * tcp across; "/tcp" after the map: that transport alone): opens the file store in dir
 * and a communicator forced to algo (chunk_bytes 0: the default) whose cost model must
 * have the host map. 0, or 1 after saying why. */
static inline int coll_host_comm(int rank, int nranks, const char *dir, const char *map,
                                 const char *algo, size_t chunk_bytes, tutti_store_t **store_p,
                                 tutti_comm_t **comm_p)
{
    *comm_p = NULL;
    *store_p = NULL;
    FAIL_IF(tutti_store_open_file(store_p, dir, 20000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.algo = algo;
    if (chunk_bytes)
        o.chunk_bytes = chunk_bytes;
    char hid[16];
    snprintf(hid, sizeof(hid), "host-%c", map[rank]);
    o.host_id = hid;
    const char *tp = strchr(map, '/');
    o.transport = tp ? tp + 1 : "auto";
    int st = tutti_comm_init(comm_p, *store_p, rank, nranks, &o);
    FAIL_IF(st != 0, "init: %s", tutti_status_name(st));
    /* every rank has the host map (the model describes it), whatever the transports */
    const char *d = tutti_comm_cost_model(*comm_p);
    FAIL_IF(!strstr(d, "hosts"), "rank %d: cost model %s has no host map", rank, d);
    return 0;
}

/* One run of fn(arg) on as many ranks as map has hosts letters, each making its own
 * communicator (coll_host_comm), timed; label names it. */
static inline void coll_run_hosts(const char *map, th_rank_fn fn, void *arg, const char *label)
{
    th_spec_t spec = { .nranks = (int)strcspn(map, "/"),
                       .fn = fn,
                       .arg = arg,
                       .timeout_ms = 100000,
                       .flags = TH_NO_COMM };
    double t0 = th_now_ms();
    int rc = th_run_ex(&spec, NULL);
    fprintf(stderr, "matrix %s: %.0f ms\n", label, th_now_ms() - t0);
    ck_assert_msg(rc == 0, "%s failed (see above)", label);
}

#endif
