/* tutti_comm_split: 4 ranks split by parity with reversed keys, ranks that take no
 * color, a split of a split with the parents destroyed first, 20 splits in a row, a rank
 * that does not take part, and a parent that owns its store (tutti_comm_init_env)
 * destroyed before its children. Each new communicator is checked against the members
 * the test expects: its rank and size, an allgather of the parent ranks, an allreduce.
 * tutti_comm_shrink: after a rank died and after one left, twice in a row, bad
 * arguments, and ranks that pass different sets. tutti_comm_revoke: a rank that gave up
 * waiting on a hung one revokes, the others blocked in the allreduce fail with
 * TUTTI_ERR_REVOKED long before their timeout, and the three shrink and go on; a revoke
 * while no op runs. tutti_comm_grow and tutti_comm_join: 2 ranks grow to 4 with three
 * processes joining (the third waits as a spare), then the 4 grow to 5 and it joins.
 * tutti_comm_shrink_live and tutti_comm_agree: the AND of flags and the absent set the
 * same on every caller, on a revoked communicator and after a rank died. */
#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tutti/tutti.h>

#include "harness.h"

/* In a rank body: a failed step (which printed why) fails the rank. */
#define TRY(step)                                                                                  \
    do {                                                                                           \
        int rc_ = (step);                                                                          \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

#define NR 4

/* The parent ranks that form color's communicator, in their new order (by key, then by
 * parent rank); their count. */
static int expected_members(const int *colors, const int *keys, int n, int color, int *out)
{
    int m = 0;
    for (int r = 0; r < n; r++) {
        if (colors[r] != color)
            continue;
        int at = m++;
        while (at > 0 && keys[out[at - 1]] > keys[r]) {
            out[at] = out[at - 1];
            at--;
        }
        out[at] = r;
    }
    return m;
}

/* child (of the rank whose parent rank is prank) must be members[0..n): rank, size, the
 * parent ranks through an allgather, and an allreduce of (prank + 1) * (i + 1). */
static int check_child(int rank, int prank, tutti_comm_t *child, const int *members, int n)
{
    enum { COUNT = 5000 };
    int me = -1;
    for (int i = 0; i < n; i++)
        if (members[i] == prank)
            me = i;
    FAIL_IF(!child, "no communicator for a rank with a color");
    FAIL_IF(tutti_comm_size(child) != n || tutti_comm_rank(child) != me,
            "rank %d of %d, wanted %d of %d", tutti_comm_rank(child), tutti_comm_size(child), me,
            n);
    int32_t mine = prank, got[NR * 2];
    int st = tutti_allgather(child, &mine, got, 1, TUTTI_INT32);
    FAIL_IF(st, "allgather: %s", tutti_comm_last_error(child));
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        FAIL_IF(got[i] != members[i], "new rank %d is parent rank %d, wanted %d", i, got[i],
                members[i]);
        sum += members[i] + 1;
    }
    int64_t *buf = malloc(COUNT * sizeof(*buf));
    for (int i = 0; i < COUNT; i++)
        buf[i] = (int64_t)(prank + 1) * (i + 1);
    st = tutti_allreduce(child, TUTTI_IN_PLACE, buf, COUNT, TUTTI_INT64, TUTTI_SUM);
    int bad = -1;
    for (int i = 0; !st && bad < 0 && i < COUNT; i++)
        if (buf[i] != sum * (i + 1))
            bad = i;
    free(buf);
    FAIL_IF(st, "allreduce: %s", tutti_comm_last_error(child));
    FAIL_IF(bad >= 0, "allreduce: element %d wrong", bad);
    return 0;
}

/* Split comm (where this rank is prank of n) with every rank's color and key, and check
 * this rank's result; the new communicator in *child_p (NULL for no color). */
static int split_checked(int rank, int prank, tutti_comm_t *comm, int n, const int *colors,
                         const int *keys, tutti_comm_t **child_p)
{
    int members[NR];
    int st = tutti_comm_split(comm, colors[prank], keys[prank], child_p);
    FAIL_IF(st, "split: %s", tutti_comm_last_error(comm));
    if (colors[prank] < 0) {
        FAIL_IF(*child_p, "a communicator for no color");
        return 0;
    }
    int m = expected_members(colors, keys, n, colors[prank], members);
    return check_child(rank, prank, *child_p, members, m);
}

static int rank_parity(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    int colors[NR], keys[NR], all[NR] = { 0, 1, 2, 3 };
    for (int r = 0; r < nranks; r++) {
        colors[r] = r % 2;
        keys[r] = -r;
    }
    tutti_comm_t *half;
    TRY(split_checked(rank, rank, comm, nranks, colors, keys, &half));
    /* the parent still works, and so does the child after it */
    int members[NR];
    TRY(check_child(rank, rank, comm, all, nranks));
    TRY(check_child(rank, rank, half, members,
                    expected_members(colors, keys, nranks, rank % 2, members)));
    tutti_comm_destroy(half);
    return 0;
}

/* Ranks 1 and 3 take no color (3 with another negative number); then a second split of
 * everyone, whose key space must not meet the first's. */
static int rank_nocolor(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    int colors[NR] = { 7, TUTTI_SPLIT_NOCOLOR, 7, -5 }, keys[NR] = { 0 };
    int same[NR] = { 0 }, order[NR] = { 3, 2, 1, 0 };
    tutti_comm_t *a, *b;
    TRY(split_checked(rank, rank, comm, nranks, colors, keys, &a));
    TRY(split_checked(rank, rank, comm, nranks, same, order, &b));
    tutti_comm_destroy(a);
    tutti_comm_destroy(b);
    return 0;
}

/* world -> reversed (everyone, keys reversed) -> pairs of the reversed; the reversed
 * destroyed before the pairs are used again. */
static int rank_nested(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    int zero[NR] = { 0 }, rev[NR], pair[NR], key0[NR] = { 0 };
    for (int r = 0; r < nranks; r++) {
        rev[r] = nranks - r;
        pair[r] = r / 2; /* by rank in the reversed communicator */
    }
    tutti_comm_t *r1, *r2;
    TRY(split_checked(rank, rank, comm, nranks, zero, rev, &r1));
    int rrank = tutti_comm_rank(r1);
    TRY(split_checked(rank, rrank, r1, nranks, pair, key0, &r2));
    int members[NR];
    int n = expected_members(pair, key0, nranks, pair[rrank], members);
    tutti_comm_destroy(r1);
    TRY(check_child(rank, rrank, r2, members, n));
    tutti_comm_destroy(r2);
    return 0;
}

/* tutti_comm_dup: the copy has the same ranks in the same order (check_child), and its
 * calls never meet the parent's: each rank issues an allreduce on both at once, the
 * even ranks the copy's first, the odd ones the parent's, with different inputs; each
 * gets its own sums. Then the parent after the copy is destroyed. */
static int rank_dup(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    int all[NR] = { 0, 1, 2, 3 };
    tutti_comm_t *copy;
    FAIL_IF(tutti_comm_dup(comm, &copy) != 0, "dup: %s", tutti_comm_last_error(comm));
    TRY(check_child(rank, rank, copy, all, nranks));
    enum { N = 70000 };
    int32_t *a = malloc(N * sizeof(*a)), *b = malloc(N * sizeof(*b));
    FAIL_IF(!a || !b, "malloc");
    for (int i = 0; i < N; i++) {
        a[i] = rank + i;          /* on the parent */
        b[i] = 1000 * (rank + 1); /* on the copy */
    }
    tutti_work_t *wa, *wb;
    int sa, sb;
    if (rank % 2) {
        sa = tutti_allreduce_async(comm, TUTTI_IN_PLACE, a, N, TUTTI_INT32, TUTTI_SUM, &wa);
        sb = tutti_allreduce_async(copy, TUTTI_IN_PLACE, b, N, TUTTI_INT32, TUTTI_SUM, &wb);
    } else {
        sb = tutti_allreduce_async(copy, TUTTI_IN_PLACE, b, N, TUTTI_INT32, TUTTI_SUM, &wb);
        sa = tutti_allreduce_async(comm, TUTTI_IN_PLACE, a, N, TUTTI_INT32, TUTTI_SUM, &wa);
    }
    FAIL_IF(sa || sb, "issue: %s / %s", tutti_comm_last_error(comm), tutti_comm_last_error(copy));
    FAIL_IF(tutti_wait(wa, -1) != 0 || tutti_wait(wb, -1) != 0, "wait: %s / %s",
            tutti_work_error(wa), tutti_work_error(wb));
    tutti_work_free(wa);
    tutti_work_free(wb);
    const int32_t rsum = nranks * (nranks - 1) / 2, csum = 1000 * nranks * (nranks + 1) / 2;
    for (int i = 0; i < N; i++)
        FAIL_IF(a[i] != rsum + nranks * i || b[i] != csum, "[%d]: parent %d, copy %d", i, a[i],
                b[i]);
    free(a);
    free(b);
    tutti_comm_destroy(copy);
    TRY(check_child(rank, rank, comm, all, nranks));
    FAIL_IF(tutti_comm_dup(NULL, &copy) != TUTTI_ERR_INVALID_ARG ||
                tutti_comm_dup(comm, NULL) != TUTTI_ERR_INVALID_ARG,
            "dup's bad arguments");
    return 0;
}

/* 20 splits in a row, each with other colors (three of them: groups of 1 and 2 ranks)
 * and keys, each checked and destroyed. */
static int rank_twenty(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    double t0 = th_now_ms();
    for (int i = 0; i < 20; i++) {
        int colors[NR], keys[NR];
        for (int r = 0; r < nranks; r++) {
            colors[r] = (r + i) % 3;
            keys[r] = i % 2 ? r : -r;
        }
        tutti_comm_t *c;
        TRY(split_checked(rank, rank, comm, nranks, colors, keys, &c));
        tutti_comm_destroy(c);
    }
    if (rank == 0)
        printf("20 splits (checked and destroyed) in %.0f ms\n", th_now_ms() - t0);
    return 0;
}

/* Rank 3 calls a barrier instead (arg NULL), or nothing while the others wait (it sleeps
 * past their timeout): the others' split fails within the timeout, saying what failed. */
static int rank_missing(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)nranks, (void)dir;
    double t0 = th_now_ms();
    tutti_comm_t *c = (tutti_comm_t *)1;
    if (rank == 3 && arg) {
        th_sleep_ms(2000 + 3000);
        return 0;
    }
    int st = rank == 3 ? tutti_barrier(comm) : tutti_comm_split(comm, 0, 0, &c);
    double took = th_now_ms() - t0;
    FAIL_IF(st != TUTTI_ERR_MISMATCH && st != TUTTI_ERR_TIMEOUT, "%s: %s", tutti_status_name(st),
            tutti_comm_last_error(comm));
    FAIL_IF(took > 2000 + 2500, "took %.0f ms with a timeout of 2000", took);
    if (rank != 3) {
        const char *e = tutti_comm_last_error(comm);
        FAIL_IF(c, "a communicator after a failed split");
        FAIL_IF(!strstr(e, "split 0: exchanging colors and keys") ||
                    !strstr(e, "every rank must call tutti_comm_split"),
                "unclear error: %s", e);
    }
    return 0;
}

START_TEST(rank_that_does_not_take_part)
{
    int codes[NR];
    th_run_comm_timeout(NR, rank_missing, _i ? "silent" : NULL, 30000, 2000, TH_NO_KILL_ON_FAIL,
                        codes);
    for (int r = 0; r < NR; r++)
        ck_assert_msg(codes[r] == 0, "rank %d exited %d (%s)", r, codes[r],
                      _i ? "rank 3 silent" : "rank 3 in a barrier");
}
END_TEST

/* A parent from tutti_comm_init_env (rank 0 hosts the tcp store server) destroyed
 * before its halves: they keep the store, and its server, until they go. */
static int rank_env(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused, (void)dir;
    th_set_rank_env(arg, rank, nranks);
    tutti_comm_t *world, *half;
    int st = tutti_comm_init_env(&world, NULL);
    FAIL_IF(st, "init_env: %s", tutti_status_name(st));
    int colors[NR], keys[NR], members[NR];
    for (int r = 0; r < nranks; r++) {
        colors[r] = r / 2;
        keys[r] = 0;
    }
    TRY(split_checked(rank, rank, world, nranks, colors, keys, &half));
    tutti_comm_destroy(world);
    tutti_comm_t *quarter;
    int one[NR] = { 0 };
    st = tutti_comm_split(half, tutti_comm_rank(half), 0, &quarter); /* through the store */
    FAIL_IF(st, "split after the parent went: %s", tutti_comm_last_error(half));
    TRY(check_child(rank, 0, quarter, one, 1));
    tutti_comm_destroy(quarter);
    TRY(check_child(rank, rank, half, members,
                    expected_members(colors, keys, nranks, rank / 2, members)));
    tutti_comm_destroy(half);
    return 0;
}

START_TEST(parent_that_owns_its_store_goes_first)
{
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", th_free_port());
    ck_assert_int_eq(th_run_nocomm(NR, rank_env, url, 60000), 0);
}
END_TEST

/* A job secret from a file (TUTTI_AUTH_TOKEN_FILE), the file removed after init: a split
 * keeps the parent's secret, it does not read the file again (it would fail, or take a
 * secret the other ranks never had). */
static int rank_secret(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused, (void)arg;
    char path[512];
    snprintf(path, sizeof(path), "%s/secret-%d", dir, rank);
    FILE *f = fopen(path, "w");
    FAIL_IF(!f || fputs("split-secret\n", f) < 0 || fclose(f), "writing %s", path);
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 20000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.auth_token_file = path;
    tutti_comm_t *world, *half;
    int st = tutti_comm_init(&world, store, rank, nranks, &o);
    FAIL_IF(st, "init: %s", tutti_comm_last_error(NULL));
    FAIL_IF(unlink(path), "unlink %s", path);
    int colors[NR], keys[NR];
    for (int r = 0; r < nranks; r++) {
        colors[r] = r % 2;
        keys[r] = -r;
    }
    TRY(split_checked(rank, rank, world, nranks, colors, keys, &half)); /* checks its values */
    tutti_comm_destroy(half);
    tutti_comm_destroy(world);
    tutti_store_close(store);
    return 0;
}

START_TEST(secret_file_gone_after_init)
{
    ck_assert_int_eq(th_run_nocomm(NR, rank_secret, NULL, 60000), 0);
}
END_TEST

/* The cases that run on the harness's communicators (of NR ranks), one per loop index. */
static const struct {
    const char *name;
    th_rank_fn fn;
} on_world[] = {
    { "parity with reversed keys", rank_parity },
    { "ranks without color", rank_nocolor },
    { "split of a split", rank_nested },
    { "twenty splits in a row", rank_twenty },
    { "dup", rank_dup },
};

/* ---- tutti_comm_shrink ---- */

/* Rank 2 dies after one allreduce (arg "die") or just leaves without calling shrink; the
 * others see the failure (when it died), shrink with {2} excluded, and check the new
 * communicator: parent ranks 0, 1, 3 as new ranks 0, 1, 2, an allgather and an
 * allreduce. Bad arguments first, on rank 0. */
static int rank_shrink(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    int die = arg != NULL;
    int64_t x = rank;
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_INT64, TUTTI_SUM);
    FAIL_IF(st || x != nranks * (nranks - 1) / 2, "first allreduce: %s", tutti_status_name(st));
    if (rank == 2) {
        if (die)
            _exit(0); /* no destroy: the others see the connection close */
        return 0;     /* the harness destroys comm */
    }
    if (die) {
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_INT64, TUTTI_SUM);
        FAIL_IF(st == 0, "allreduce with rank 2 dead succeeded");
        FAIL_IF(!strstr(tutti_comm_last_error(comm), "rank 2"), "failure does not name rank 2: %s",
                tutti_comm_last_error(comm));
    }
    tutti_comm_t *small = (tutti_comm_t *)1;
    if (rank == 0) {
        int self[] = { 0 }, range[] = { 4 }, twice[] = { 2, 2 }, all[] = { 0, 1, 2, 3 };
        FAIL_IF(tutti_comm_shrink(comm, self, 1, &small) != TUTTI_ERR_INVALID_ARG ||
                    !strstr(tutti_comm_last_error(comm), "excludes itself"),
                "excluding itself: %s", tutti_comm_last_error(comm));
        FAIL_IF(small, "a communicator from a refused shrink");
        FAIL_IF(tutti_comm_shrink(comm, range, 1, &small) != TUTTI_ERR_INVALID_ARG ||
                    !strstr(tutti_comm_last_error(comm), "rank 4 is out of range"),
                "rank 4: %s", tutti_comm_last_error(comm));
        FAIL_IF(tutti_comm_shrink(comm, twice, 2, &small) != TUTTI_ERR_INVALID_ARG,
                "rank 2 twice: %s", tutti_comm_last_error(comm));
        FAIL_IF(tutti_comm_shrink(comm, all, 4, &small) != TUTTI_ERR_INVALID_ARG, "everyone: %s",
                tutti_comm_last_error(comm));
        FAIL_IF(tutti_comm_shrink(comm, NULL, 1, &small) != TUTTI_ERR_INVALID_ARG, "NULL set");
        FAIL_IF(tutti_comm_shrink(NULL, twice, 1, &small) != TUTTI_ERR_INVALID_ARG, "NULL comm");
    }
    int out[] = { 2 }, members[] = { 0, 1, 3 };
    st = tutti_comm_shrink(comm, out, 1, &small);
    FAIL_IF(st, "shrink: %s", tutti_comm_last_error(comm));
    TRY(check_child(rank, rank, small, members, 3));
    /* and again, from the shrunk one: rank 3 (new rank 2) left out too */
    tutti_comm_t *smaller;
    int out2[] = { 2 }, members2[] = { 0, 1 };
    if (rank != 3) {
        st = tutti_comm_shrink(small, out2, 1, &smaller);
        FAIL_IF(st, "second shrink: %s", tutti_comm_last_error(small));
        TRY(check_child(rank, tutti_comm_rank(small), smaller, members2, 2));
        tutti_comm_destroy(smaller);
    }
    tutti_comm_destroy(small);
    return 0;
}

/* A rank dies while the shrink makes the new communicator: rank 3 is gone, ranks 0-2
 * shrink without it, and rank 2 dies having set its excluded set (as its shrink would,
 * set by hand so that it dies before its host id, every time). Ranks 0 and 1 fail within
 * the timeout naming rank 2, the rank that never published its host id (before, over
 * shm, the error named key 0, the caller's own or rank 0's, and rank 2 nowhere), with
 * their own rank said once; then they shrink without 2 and 3. */
static int rank_shrink_dies(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)nranks, (void)arg;
    int64_t x = rank;
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_INT64, TUTTI_SUM);
    FAIL_IF(st || x != 6, "first allreduce: %s", tutti_status_name(st));
    if (rank == 3)
        _exit(0);
    if (rank == 2) {
        char url[600], key[512];
        snprintf(url, sizeof(url), "file://%s", dir);
        tutti_store_t *store;
        FAIL_IF(tutti_store_open(&store, url, NULL), "store: %s", tutti_store_last_error(NULL));
        FAIL_IF(th_comm_key(store, NULL, "shrink0/excluded/2", key, sizeof(key), 5000),
                "no instance key");
        FAIL_IF(tutti_store_set(store, key, "3", 1), "set: %s", tutti_store_last_error(store));
        _exit(42);
    }
    int out[] = { 3 };
    tutti_comm_t *small = NULL;
    double t0 = th_now_ms();
    st = tutti_comm_shrink(comm, out, 1, &small);
    double took = th_now_ms() - t0;
    const char *e = tutti_comm_last_error(comm);
    FAIL_IF(st != TUTTI_ERR_TIMEOUT || small, "shrink with rank 2 dead: %s: %s",
            tutti_status_name(st), e);
    FAIL_IF(took > 5000, "took %.0f ms", took);
    /* over shm (split-shm) the host ids come first: their wait names it; tcp alone
     * connects first, and its connect names it */
    FAIL_IF(!strstr(e, "missing those of rank 2") && !strstr(e, "still missing rank(s) 2"),
            "the error does not name rank 2: %s", e);
    char me[16];
    snprintf(me, sizeof(me), "rank %d: ", rank);
    FAIL_IF(strstr(e + strlen(me), me), "\"%s\" twice: %s", me, e);
    printf("rank %d: shrink failed after %.0f ms: %s\n", rank, took, e);
    int out2[] = { 2, 3 }, members[] = { 0, 1 };
    st = tutti_comm_shrink(comm, out2, 2, &small);
    FAIL_IF(st, "shrink without 2 and 3: %s", tutti_comm_last_error(comm));
    TRY(check_child(rank, rank, small, members, 2));
    tutti_comm_destroy(small);
    return 0;
}

START_TEST(shrink_rank_dies_in_it)
{
    int codes[NR];
    th_run_comm_timeout(NR, rank_shrink_dies, NULL, 60000, 2000, TH_NO_KILL_ON_FAIL, codes);
    ck_assert_msg(codes[0] == 0 && codes[1] == 0 && codes[2] == 42 && codes[3] == 0,
                  "exit codes %d %d %d %d (rank 2 should die with 42)", codes[0], codes[1],
                  codes[2], codes[3]);
}
END_TEST

START_TEST(shrink)
{
    int codes[NR];
    th_run_comm_timeout(NR, rank_shrink, _i ? "die" : NULL, 60000, 3000, TH_NO_KILL_ON_FAIL, codes);
    for (int r = 0; r < NR; r++)
        ck_assert_msg(codes[r] == 0, "rank %d exited %d (%s)", r, codes[r],
                      _i ? "rank 2 died" : "rank 2 left");
}
END_TEST

/* Ranks 0 and 1 exclude {3}, rank 2 excludes {1, 3}; rank 3 leaves. Every caller fails
 * at once with TUTTI_ERR_MISMATCH naming both sets (not at its timeout). */
static int rank_shrink_differ(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)nranks, (void)dir, (void)arg;
    if (rank == 3)
        return 0;
    int a[] = { 3 }, b[] = { 3, 1 };
    tutti_comm_t *c = (tutti_comm_t *)1;
    double t0 = th_now_ms();
    int st = rank == 2 ? tutti_comm_shrink(comm, b, 2, &c) : tutti_comm_shrink(comm, a, 1, &c);
    double took = th_now_ms() - t0;
    const char *e = tutti_comm_last_error(comm);
    FAIL_IF(st != TUTTI_ERR_MISMATCH || c, "%s: %s", tutti_status_name(st), e);
    FAIL_IF(!strstr(e, "excludes {3}") || !strstr(e, "excludes {1,3}") || !strstr(e, "same set"),
            "unclear error: %s", e);
    FAIL_IF(took > 2000, "took %.0f ms (timeout 5000): not at once", took);
    return 0;
}

START_TEST(shrink_sets_differ)
{
    int codes[NR];
    th_run_comm_timeout(NR, rank_shrink_differ, NULL, 30000, 5000, TH_NO_KILL_ON_FAIL, codes);
    for (int r = 0; r < NR; r++)
        ck_assert_msg(codes[r] == 0, "rank %d exited %d", r, codes[r]);
}
END_TEST

/* ---- tutti_comm_shrink_live ---- */

/* "die": rank 2 dies after an allreduce and rank 3 comes 2.5 s late: ranks 0 and 1 agree
 * on {2,3} absent within their 1 s wait and go on as 2; rank 3 is told it came too late.
 * "all": every rank comes, and the new communicator has all 4, at once. */
static int rank_shrink_live(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    int die = !strcmp(arg, "die");
    int64_t x = rank;
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_INT64, TUTTI_SUM);
    FAIL_IF(st || x != nranks * (nranks - 1) / 2, "first allreduce: %s", tutti_status_name(st));
    if (die && rank == 2)
        _exit(0);
    if (die && rank == 3)
        usleep(2500000);
    tutti_comm_t *small = (tutti_comm_t *)1;
    double t0 = th_now_ms();
    st = tutti_comm_shrink_live(comm, 1000, &small);
    double took = th_now_ms() - t0;
    const char *e = tutti_comm_last_error(comm);
    if (die && rank == 3) {
        FAIL_IF(st != TUTTI_ERR_TIMEOUT || small || !strstr(e, "without this rank") ||
                    !strstr(e, "{2,3}"),
                "late rank: %s: %s", tutti_status_name(st), e);
        return 0;
    }
    FAIL_IF(st, "shrink_live: %s", e);
    FAIL_IF(!die && took > 900, "everyone here, yet it took %.0f ms", took);
    int all[] = { 0, 1, 2, 3 }, two[] = { 0, 1 };
    TRY(check_child(rank, rank, small, die ? two : all, die ? 2 : 4));
    tutti_comm_destroy(small);
    return 0;
}

START_TEST(shrink_live)
{
    int codes[NR];
    const char *mode = _i ? "all" : "die";
    th_run_comm_timeout(NR, rank_shrink_live, (void *)mode, 60000, 10000, TH_NO_KILL_ON_FAIL,
                        codes);
    for (int r = 0; r < NR; r++)
        ck_assert_msg(codes[r] == 0, "rank %d exited %d (%s)", r, codes[r], mode);
}
END_TEST

/* ---- tutti_comm_revoke ---- */

#define REVOKE_TIMEOUT_MS 20000 /* the communicators': a revoke must be felt long before */

/* "busy": rank 3 hangs (never calls the second allreduce; it waits for rank 0's file,
 * then leaves); rank 0 gives up on its allreduce after 300 ms and revokes; ranks 1 and 2,
 * blocked in theirs, fail with TUTTI_ERR_REVOKED within a few seconds naming the
 * revocation; ranks 0-2 shrink without rank 3 and check the new communicator. "idle":
 * rank 0 revokes between calls; the other three's next allreduce fails the same way. */
static int rank_revoke(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    int busy = !strcmp(arg, "busy");
    char done[512];
    snprintf(done, sizeof(done), "%s/revoke-done", dir);
    int64_t x = rank + 1;
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_INT64, TUTTI_SUM);
    FAIL_IF(st || x != nranks * (nranks + 1) / 2, "first allreduce: %s", tutti_status_name(st));
    if (rank == 3 && busy) { /* hung: until the others are through */
        for (double t0 = th_now_ms(); access(done, F_OK) != 0; usleep(10000))
            FAIL_IF(th_now_ms() - t0 > 30000, "the others never finished");
        return 0;
    }
    double took;
    if (rank == 0) {
        tutti_work_t *w = NULL;
        if (busy) {
            FAIL_IF(tutti_allreduce_async(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_INT64, TUTTI_SUM, &w),
                    "async allreduce: %s", tutti_comm_last_error(comm));
            st = tutti_wait(w, 300);
            FAIL_IF(st != TUTTI_ERR_TIMEOUT, "allreduce with rank 3 hung: %s",
                    tutti_status_name(st));
        }
        double t0 = th_now_ms();
        FAIL_IF(tutti_comm_revoke(comm) != TUTTI_OK, "revoke");
        FAIL_IF(th_now_ms() - t0 > 1000, "revoke took %.0f ms", th_now_ms() - t0);
        FAIL_IF(tutti_comm_revoke(comm) != TUTTI_OK, "second revoke");
        if (w) {
            st = tutti_wait(w, -1);
            took = th_now_ms() - t0;
            FAIL_IF(st != TUTTI_ERR_REVOKED || took > 1000, "pending allreduce: %s after %.0f ms",
                    tutti_status_name(st), took);
            tutti_work_free(w);
        }
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_INT64, TUTTI_SUM);
        FAIL_IF(st != TUTTI_ERR_REVOKED, "allreduce after revoke: %s", tutti_status_name(st));
        FAIL_IF(!strstr(tutti_comm_last_error(comm), "revoked"), "error: %s",
                tutti_comm_last_error(comm));
        /* each later call quotes the revoke (or the call it ended), not the refusal before
         * it (they nested, one more "not started" a call), and claims no seq of the
         * failure (a revoke's was the next seq to be issued: "seq 3 not started: the
         * communicator failed at seq 4") */
        for (int i = 0; i < 2; i++)
            st = tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_INT64, TUTTI_SUM);
        const char *e = tutti_comm_last_error(comm), *ns = strstr(e, " not started: ");
        FAIL_IF(st != TUTTI_ERR_REVOKED || !ns || strstr(ns + 1, " not started: ") ||
                    !strstr(e, "the communicator had failed: rank 0: ") || !strstr(e, "revoked") ||
                    strstr(e, "failed at seq"),
                "third allreduce after revoke: %s: %s", tutti_status_name(st), e);
    } else {
        double t0 = th_now_ms();
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_INT64, TUTTI_SUM);
        took = th_now_ms() - t0;
        const char *e = tutti_comm_last_error(comm);
        FAIL_IF(st != TUTTI_ERR_REVOKED, "allreduce: %s (%s)", tutti_status_name(st), e);
        FAIL_IF(!strstr(e, "revoked"), "error does not say revoked: %s", e);
        /* busy: 300 ms, then at most a stall check (1 s) or two of the revoke */
        FAIL_IF(took > 5000, "revoke felt after %.0f ms (timeout %d ms)", took, REVOKE_TIMEOUT_MS);
        printf("rank %d: allreduce failed %.0f ms after its start: %s\n", rank, took, e);
    }
    if (!busy) { /* rank 0 stays until the others failed: they learn it from the revoke */
        char mark[600];
        snprintf(mark, sizeof(mark), "%s/revoke-felt-%d", dir, rank);
        if (rank != 0) {
            FILE *f = fopen(mark, "w");
            FAIL_IF(!f, "cannot write %s", mark);
            fclose(f);
            return 0;
        }
        for (int r = 1; r < nranks; r++) {
            snprintf(mark, sizeof(mark), "%s/revoke-felt-%d", dir, r);
            for (double t0 = th_now_ms(); access(mark, F_OK) != 0; usleep(10000))
                FAIL_IF(th_now_ms() - t0 > 30000, "rank %d never failed", r);
        }
        return 0;
    }
    tutti_comm_t *small = NULL;
    int out[] = { 3 }, members[] = { 0, 1, 2 };
    st = tutti_comm_shrink(comm, out, 1, &small);
    FAIL_IF(st, "shrink: %s", tutti_comm_last_error(comm));
    TRY(check_child(rank, rank, small, members, 3));
    tutti_comm_destroy(small);
    if (rank == 0) {
        FILE *f = fopen(done, "w");
        FAIL_IF(!f, "cannot write %s", done);
        fclose(f);
    }
    return 0;
}

START_TEST(revoke_then_shrink)
{
    int codes[NR];
    const char *mode = _i % 2 ? "idle" : "busy";
    /* 2, 3: no stall checks, so the revoke must travel on the transport's links */
    if (_i >= 2)
        setenv("TUTTI_STALL_CHECK_MS", "0", 1);
    th_run_comm_timeout(NR, rank_revoke, (void *)mode, 60000, REVOKE_TIMEOUT_MS, TH_NO_KILL_ON_FAIL,
                        codes);
    unsetenv("TUTTI_STALL_CHECK_MS");
    for (int r = 0; r < NR; r++)
        ck_assert_msg(codes[r] == 0, "rank %d exited %d (%s, stall checks %s)", r, codes[r], mode,
                      _i >= 2 ? "off" : "on");
}
END_TEST

/* ULFM's case: rank 1 waits in a receive from rank 2 alone (tag 7; from any source with
 * arg "any"), which hangs (it waits for rank 0's file, then leaves); rank 0 revokes 300 ms
 * in. Rank 1 has nothing posted to rank 0, so its transport never reads the revoke that
 * rank 0 sent it: the point-to-point work's stall check (1 s) must find it in the store.
 * Then ranks 0 and 1 shrink without rank 2 and check the new communicator. */
static int rank_revoke_p2p(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)nranks;
    char done[512];
    snprintf(done, sizeof(done), "%s/revoke-done", dir);
    int64_t x = rank + 1;
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_INT64, TUTTI_SUM);
    FAIL_IF(st || x != 6, "first allreduce: %s", tutti_status_name(st));
    if (rank == 2) { /* hung: until the others are through */
        for (double t0 = th_now_ms(); access(done, F_OK) != 0; usleep(10000))
            FAIL_IF(th_now_ms() - t0 > 30000, "the others never finished");
        return 0;
    }
    if (rank == 0) {
        usleep(300000);
        FAIL_IF(tutti_comm_revoke(comm) != TUTTI_OK, "revoke");
    } else {
        int32_t v = 0;
        double t0 = th_now_ms();
        st = tutti_recv(comm, &v, 1, TUTTI_INT32, !strcmp(arg, "any") ? TUTTI_ANY_SOURCE : 2, 7);
        double took = th_now_ms() - t0;
        const char *e = tutti_comm_last_error(comm);
        FAIL_IF(st != TUTTI_ERR_REVOKED, "recv from the hung rank 2: %s after %.0f ms (%s)",
                tutti_status_name(st), took, e);
        FAIL_IF(!strstr(e, "rank 0 had failed") || !strstr(e, "revoked"),
                "error does not name rank 0's revoke: %s", e);
        /* 300 ms, then a stall check (1 s) or two */
        FAIL_IF(took > 5000, "revoke felt after %.0f ms (timeout %d ms)", took, REVOKE_TIMEOUT_MS);
        printf("rank 1: recv failed %.0f ms after its start: %s\n", took, e);
    }
    tutti_comm_t *small = NULL;
    int out[] = { 2 }, members[] = { 0, 1 };
    st = tutti_comm_shrink(comm, out, 1, &small);
    FAIL_IF(st, "shrink: %s", tutti_comm_last_error(comm));
    TRY(check_child(rank, rank, small, members, 2));
    tutti_comm_destroy(small);
    if (rank == 0) {
        FILE *f = fopen(done, "w");
        FAIL_IF(!f, "cannot write %s", done);
        fclose(f);
    }
    return 0;
}

START_TEST(revoke_reaches_p2p)
{
    int codes[3];
    const char *mode = _i ? "any" : "named";
    th_run_comm_timeout(3, rank_revoke_p2p, (void *)mode, 60000, REVOKE_TIMEOUT_MS,
                        TH_NO_KILL_ON_FAIL, codes);
    for (int r = 0; r < 3; r++)
        ck_assert_msg(codes[r] == 0, "rank %d exited %d (receive from %s)", r, codes[r], mode);
}
END_TEST

/* ---- tutti_comm_grow, tutti_comm_join ---- */

/* comm must be rank `rank` of `size`: an allreduce of rank + 1 and an allgather of the
 * ranks */
static int check_grown(tutti_comm_t *comm, int rank, int size)
{
    FAIL_IF(!comm || tutti_comm_rank(comm) != rank || tutti_comm_size(comm) != size,
            "rank %d of %d, wanted %d of %d", comm ? tutti_comm_rank(comm) : -1,
            comm ? tutti_comm_size(comm) : -1, rank, size);
    int64_t x = rank + 1;
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_INT64, TUTTI_SUM);
    FAIL_IF(st || x != (int64_t)size * (size + 1) / 2, "allreduce: %s, %lld",
            tutti_comm_last_error(comm), (long long)x);
    int32_t me = rank, all[8];
    st = tutti_allgather(comm, &me, all, 1, TUTTI_INT32);
    FAIL_IF(st, "allgather: %s", tutti_comm_last_error(comm));
    for (int r = 0; r < size; r++)
        FAIL_IF(all[r] != r, "allgather: [%d] = %d", r, all[r]);
    return 0;
}

/* Processes 0 and 1 make a communicator of 2 and grow it to 4; processes 2, 3 and 4 join:
 * two of them take ranks 2 and 3, the third finds the places taken and waits for the
 * next grow, to 5, which the 4 then make, and takes rank 4. */
static int rank_grow(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused, (void)arg, (void)nranks;
    char url[600];
    snprintf(url, sizeof(url), "file://%s", dir);
    tutti_store_t *store;
    FAIL_IF(tutti_store_open(&store, url, NULL), "store: %s", tutti_store_last_error(NULL));
    tutti_comm_t *two = NULL, *four = NULL, *five = NULL;
    int me;
    if (rank == 0) { /* a job nobody grows: a bounded wait, and why */
        tutti_comm_opts_t o;
        tutti_comm_opts_init(&o);
        o.timeout_ms = 200;
        o.job_id = "nobody-grows";
        tutti_comm_t *c = (tutti_comm_t *)1;
        double t0 = th_now_ms();
        int st = tutti_comm_join(&c, store, &o);
        double took = th_now_ms() - t0;
        const char *e = tutti_comm_last_error(NULL);
        FAIL_IF(st != TUTTI_ERR_TIMEOUT || c || took > 1500 || !strstr(e, "is growing") ||
                    !strstr(e, "nobody-grows"),
                "join with no grow: %s after %.0f ms: %s", tutti_status_name(st), took, e);
    }
    if (rank < 2) {
        FAIL_IF(tutti_comm_init(&two, store, rank, 2, NULL), "init: %s",
                tutti_comm_last_error(NULL));
        TRY(check_grown(two, rank, 2));
        if (rank == 0) {
            usleep(300000); /* the joiners wait for the ticket */
            tutti_comm_t *c = (tutti_comm_t *)1;
            FAIL_IF(tutti_comm_grow(two, 2, &c) != TUTTI_ERR_INVALID_ARG || c,
                    "grow to the same size");
        }
        FAIL_IF(tutti_comm_grow(two, 4, &four), "grow: %s", tutti_comm_last_error(two));
        me = rank;
    } else {
        double t0 = th_now_ms();
        int st = tutti_comm_join(&four, store, NULL);
        FAIL_IF(st, "join: %s", tutti_comm_last_error(NULL));
        me = tutti_comm_rank(four);
        printf("process %d joined as rank %d of %d after %.0f ms\n", rank, me,
               tutti_comm_size(four), th_now_ms() - t0);
        if (tutti_comm_size(four) == 5) { /* the spare: grown into the second grow */
            TRY(check_grown(four, 4, 5));
            tutti_comm_destroy(four);
            tutti_store_close(store);
            return 0;
        }
    }
    TRY(check_grown(four, me, 4));
    FAIL_IF(tutti_comm_grow(four, 5, &five), "second grow: %s", tutti_comm_last_error(four));
    TRY(check_grown(five, me, 5));
    if (two) /* the first communicator still works, beside the grown ones */
        TRY(check_grown(two, me, 2));
    tutti_comm_destroy(five);
    tutti_comm_destroy(four);
    if (two)
        tutti_comm_destroy(two);
    tutti_store_close(store);
    return 0;
}

TH_RUN_TEST(grow_and_join, th_run_nocomm(5, rank_grow, NULL, 60000))

/* Two communicators of one job (one prefix and job id: comm0 and comm1) grow from 2 to 3
 * ranks at once, from a thread each, and two processes join: the grows take turns on the
 * job's one ticket, so each joiner lands in one of them and both grown communicators
 * work (before, the second ticket overwrote the first, both joiners took its places,
 * and both grows failed at their timeout; found by review). */
static tutti_comm_t *two_of_one_job[2];

static void *grow_one(void *arg)
{
    long i = (long)arg;
    tutti_comm_t *g = NULL;
    int st = tutti_comm_grow(two_of_one_job[i], 3, &g);
    if (st) {
        fprintf(stderr, "grow %ld: %s\n", i, tutti_comm_last_error(two_of_one_job[i]));
        return (void *)1;
    }
    int r = check_grown(g, tutti_comm_rank(two_of_one_job[i]), 3);
    tutti_comm_destroy(g);
    return (void *)(long)r;
}

static int rank_grow_twice(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused, (void)arg, (void)nranks;
    char url[600];
    snprintf(url, sizeof(url), "file://%s", dir);
    tutti_store_t *store;
    FAIL_IF(tutti_store_open(&store, url, NULL), "store: %s", tutti_store_last_error(NULL));
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 8000;
    if (rank >= 2) {
        tutti_comm_t *g = NULL;
        usleep(800000); /* both grows have begun: both tickets would be up, one on the other */
        FAIL_IF(tutti_comm_join(&g, store, &o), "join: %s", tutti_comm_last_error(NULL));
        TRY(check_grown(g, 2, 3));
        tutti_comm_destroy(g);
        tutti_store_close(store);
        return 0;
    }
    for (int i = 0; i < 2; i++)
        FAIL_IF(tutti_comm_init(&two_of_one_job[i], store, rank, 2, &o), "init %d: %s", i,
                tutti_comm_last_error(NULL));
    pthread_t t[2];
    void *rc[2];
    for (long i = 0; i < 2; i++)
        FAIL_IF(pthread_create(&t[i], NULL, grow_one, (void *)i), "thread");
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], &rc[i]);
    FAIL_IF(rc[0] || rc[1], "grows: %ld %ld", (long)rc[0], (long)rc[1]);
    for (int i = 0; i < 2; i++)
        tutti_comm_destroy(two_of_one_job[i]);
    tutti_store_close(store);
    return 0;
}

TH_RUN_TEST(two_grows_of_one_job, th_run_nocomm(4, rank_grow_twice, NULL, 90000))

/* Rank 0 of a growing communicator dies right after it published the ticket (a thread
 * that sees the ticket _exits the process): rank 1's grow fails within its timeout and
 * takes the ticket away, so a process that joins after that waits for a grow that may
 * come, and says so, rather than taking a place in the dead one. */
static const char *dead_ticket = "tutti/job/dead-grower/grow";

static void *die_at_ticket(void *arg)
{
    tutti_store_t *store = arg;
    for (int i = 0; i < 20000; i++) {
        int there = 0;
        const char *k = dead_ticket;
        if (tutti_store_check(store, &k, 1, &there) == 0 && there)
            _exit(42);
        usleep(500);
    }
    _exit(43);
}

static int rank_grow_dies(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused, (void)arg, (void)nranks;
    char url[600];
    snprintf(url, sizeof(url), "file://%s", dir);
    tutti_store_t *store;
    FAIL_IF(tutti_store_open(&store, url, NULL), "store: %s", tutti_store_last_error(NULL));
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.job_id = "dead-grower";
    o.timeout_ms = 1500;
    const char *failed = "test/grow-failed";
    if (rank == 2) { /* joins once rank 1's grow failed */
        FAIL_IF(tutti_store_wait(store, &failed, 1, 20000), "rank 1 never said");
        tutti_comm_t *c = (tutti_comm_t *)1;
        int st = tutti_comm_join(&c, store, &o);
        const char *e = tutti_comm_last_error(NULL);
        FAIL_IF(st != TUTTI_ERR_TIMEOUT || c ||
                    !strstr(e, "no communicator of this job is growing"),
                "join after a failed grow: %s: %s", tutti_status_name(st), e);
        return 0;
    }
    tutti_comm_t *two = NULL, *three = NULL;
    FAIL_IF(tutti_comm_init(&two, store, rank, 2, &o), "init: %s", tutti_comm_last_error(NULL));
    TRY(check_grown(two, rank, 2));
    pthread_t t;
    if (rank == 0)
        FAIL_IF(pthread_create(&t, NULL, die_at_ticket, store) != 0, "thread");
    int st = tutti_comm_grow(two, 3, &three);
    FAIL_IF(rank == 0, "rank 0 lived through its grow (%s)", tutti_status_name(st));
    FAIL_IF(st >= 0 || three, "grow with rank 0 dead: %s", tutti_status_name(st));
    int there = 1;
    FAIL_IF(tutti_store_check(store, &dead_ticket, 1, &there) || there,
            "the dead grow's ticket is still at %s", dead_ticket);
    FAIL_IF(tutti_store_set(store, failed, "1", 1), "set");
    return 0;
}

START_TEST(grow_rank0_dies)
{
    int codes[3];
    th_run_apart(3, rank_grow_dies, NULL, 60000, codes);
    ck_assert_msg(codes[0] == 42 && codes[1] == 0 && codes[2] == 0,
                  "exit codes %d %d %d (rank 0 should die with 42 at its ticket)", codes[0],
                  codes[1], codes[2]);
}
END_TEST

START_TEST(on_the_world)
{
    ck_assert_msg(th_run(NR, on_world[_i].fn, NULL, 120000) == 0, "%s failed", on_world[_i].name);
}
END_TEST

/* ---- tutti_comm_agree ---- */

/* Store keys of agreement number seq left in the file store at dir (the file store
 * escapes '/' as %2F in its file names). */
static int agree_keys_left(const char *dir, unsigned seq)
{
    char pat[32];
    snprintf(pat, sizeof(pat), "%%2Fagree%u%%2F", seq);
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strstr(e->d_name, pat) != NULL;
    if (d)
        closedir(d);
    return n;
}

/* The flag rank r offers in round k: every bit but one of its own, and bit 31 only on
 * rank 1 in round 1 (so that the AND differs between rounds). */
static uint32_t agree_flag(int r, int k)
{
    return ~(1u << (r + 4 * k)) & ~(k == 1 && r == 1 ? 0x80000000u : 0);
}

/* "all": a rank revokes after an allreduce, the others' next allreduce fails with
 * TUTTI_ERR_REVOKED, yet three agreements in a row on the revoked communicator each give
 * every rank the AND of the four flags (computed here), nobody absent, at once; the first
 * agreement's keys are gone after the third. "die": rank 2 dies and rank 3 comes 2.5 s
 * late: ranks 0 and 1 get TUTTI_ERR_PEER with the AND of their two flags and {2,3}
 * absent, shrink without them and go on; rank 3 is told it came too late. */
static int rank_agree(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    int die = !strcmp(arg, "die");
    int64_t x = rank;
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_INT64, TUTTI_SUM);
    FAIL_IF(st || x != nranks * (nranks - 1) / 2, "first allreduce: %s", tutti_status_name(st));
    if (die && rank == 2)
        _exit(0);
    if (die && rank == 3)
        usleep(2500000);
    if (!die) {
        if (rank == 0)
            FAIL_IF(tutti_comm_revoke(comm), "revoke");
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_INT64, TUTTI_SUM);
        FAIL_IF(st != TUTTI_ERR_REVOKED, "allreduce after the revoke: %s", tutti_status_name(st));
    }
    for (int k = 0; k < (die ? 1 : 3); k++) {
        uint32_t flag = agree_flag(rank, k), want = 0xffffffffu;
        int absent[NR] = { -1, -1, -1, -1 }, nabsent = -1;
        for (int r = 0; r < nranks; r++)
            if (!die || r < 2)
                want &= agree_flag(r, k);
        double t0 = th_now_ms();
        st = tutti_comm_agree(comm, 1000, &flag, absent, &nabsent);
        double took = th_now_ms() - t0;
        const char *e = tutti_comm_last_error(comm);
        if (die && rank == 3) {
            FAIL_IF(st != TUTTI_ERR_TIMEOUT || nabsent != -1 || !strstr(e, "without this rank") ||
                        !strstr(e, "{2,3}"),
                    "late rank: %s: %s", tutti_status_name(st), e);
            return 0;
        }
        FAIL_IF(flag != want, "round %d: flag %08x, want %08x (%s: %s)", k, flag, want,
                tutti_status_name(st), e);
        if (die) {
            FAIL_IF(st != TUTTI_ERR_PEER || nabsent != 2 || absent[0] != 2 || absent[1] != 3 ||
                        !strstr(e, "{2,3}"),
                    "agree: %s (%d absent: %d %d): %s", tutti_status_name(st), nabsent, absent[0],
                    absent[1], e);
            tutti_comm_t *small = NULL;
            FAIL_IF(tutti_comm_shrink(comm, absent, nabsent, &small), "shrink: %s",
                    tutti_comm_last_error(comm));
            int two[] = { 0, 1 };
            TRY(check_child(rank, rank, small, two, 2));
            tutti_comm_destroy(small);
        } else {
            FAIL_IF(st || nabsent != 0, "agree %d: %s (%d absent): %s", k, tutti_status_name(st),
                    nabsent, e);
            FAIL_IF(took > 900, "everyone here, yet agreement %d took %.0f ms", k, took);
        }
    }
    if (!die) {
        /* every rank is past the third agreement, so past the second's cleanup */
        FAIL_IF(tutti_barrier(comm) != TUTTI_ERR_REVOKED, "barrier after revoke");
        usleep(200000);
        FAIL_IF(agree_keys_left(dir, 0) != 0 || agree_keys_left(dir, 2) == 0,
                "keys left: agreement 0: %d, agreement 2: %d", agree_keys_left(dir, 0),
                agree_keys_left(dir, 2));
    }
    return 0;
}

START_TEST(agree)
{
    int codes[NR];
    const char *mode = _i ? "all" : "die";
    th_run_comm_timeout(NR, rank_agree, (void *)mode, 60000, 10000, TH_NO_KILL_ON_FAIL, codes);
    for (int r = 0; r < NR; r++)
        ck_assert_msg(codes[r] == 0, "rank %d exited %d (%s)", r, codes[r], mode);
}
END_TEST

/* tutti_comm_split_opts (ncclCommSplit's config): the children by parity take options
 * of their own (a timeout, and for color 0 the tcp transport whatever the parent's),
 * checked, and work (check_child); the parent keeps its own. */
static int rank_split_opts(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    int colors[NR], keys[NR], members[NR];
    for (int r = 0; r < nranks; r++)
        colors[r] = r % 2, keys[r] = r;
    const int parent_timeout = tutti_comm_timeout(comm);
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 12345;
    if (rank % 2 == 0)
        o.transport = "tcp";
    tutti_comm_t *child = NULL;
    FAIL_IF(tutti_comm_split_opts(comm, rank % 2, rank, &o, &child) != 0, "split_opts: %s",
            tutti_comm_last_error(comm));
    FAIL_IF(tutti_comm_timeout(child) != 12345, "the child's timeout: %d",
            tutti_comm_timeout(child));
    FAIL_IF(tutti_comm_timeout(comm) != parent_timeout, "the parent's timeout changed: %d",
            tutti_comm_timeout(comm));
    FAIL_IF(rank % 2 == 0 && !strstr(tutti_comm_transport(child), "tcp"), "color 0's transport: %s",
            tutti_comm_transport(child));
    int m = expected_members(colors, keys, nranks, rank % 2, members);
    TRY(check_child(rank, rank, child, members, m));
    tutti_comm_destroy(child);
    return 0;
}

TH_RUN_TEST(split_with_options, th_run(NR, rank_split_opts, NULL, 60000))

/* tutti_comm_split_type by host: 4 ranks told (TUTTI_HOST_ID) that they sit on hosts
 * "abaa", keys reversed: host a's communicator holds ranks 3, 2, 0 in that order, host b's
 * rank 1 alone; then rank 3 takes no part (NULL, host a's of 2, 0); then rank 1 passes a
 * type that is none: every rank fails naming it, and the communicator goes on. */
static int rank_split_host(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused, (void)arg;
    static const char map[] = "abaa";
    tutti_store_t *store = NULL;
    tutti_comm_t *comm = NULL, *child = NULL;
    FAIL_IF(tutti_store_open_file(&store, dir, 20000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 20000;
    char hid[16];
    snprintf(hid, sizeof(hid), "host-%c", map[rank]);
    o.host_id = hid;
    o.transport = "auto"; /* shm within a host, tcp across, whatever the suite runs over */
    FAIL_IF(tutti_comm_init(&comm, store, rank, nranks, &o) != 0, "init: %s",
            tutti_comm_last_error(NULL));
    int colors[NR], keys[NR], members[NR];
    for (int pass = 0; pass < 2; pass++) {
        for (int r = 0; r < nranks; r++) {
            colors[r] = pass == 1 && r == 3 ? TUTTI_SPLIT_NOCOLOR : map[r] - 'a';
            keys[r] = -r;
        }
        int type = colors[rank] < 0 ? TUTTI_SPLIT_NOCOLOR : TUTTI_SPLIT_TYPE_HOST;
        FAIL_IF(tutti_comm_split_type(comm, type, keys[rank], &child) != 0, "pass %d: %s", pass,
                tutti_comm_last_error(comm));
        if (colors[rank] < 0) {
            FAIL_IF(child, "pass %d: a communicator for no type", pass);
            continue;
        }
        int m = expected_members(colors, keys, nranks, colors[rank], members);
        TRY(check_child(rank, rank, child, members, m));
        tutti_comm_destroy(child);
        child = NULL;
    }
    int st = tutti_comm_split_type(comm, rank == 1 ? 7 : TUTTI_SPLIT_TYPE_HOST, 0, &child);
    FAIL_IF(st != TUTTI_ERR_INVALID_ARG || child ||
                !strstr(tutti_comm_last_error(comm), "rank 1 passed type 7"),
            "a bad type: %d, %s", st, tutti_comm_last_error(comm));
    FAIL_IF(tutti_barrier(comm) != 0, "barrier after: %s", tutti_comm_last_error(comm));
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

TH_RUN_TEST(split_by_host, th_run_nocomm(NR, rank_split_host, NULL, 60000))

TH_CASES_MAIN("split", 150, TH_CASE(on_the_world, 5), TH_CASE(split_by_host, 1),
              TH_CASE(split_with_options, 1), TH_CASE(rank_that_does_not_take_part, 2),
              TH_CASE(parent_that_owns_its_store_goes_first, 1),
              TH_CASE(secret_file_gone_after_init, 1), TH_CASE(shrink, 2),
              TH_CASE(shrink_sets_differ, 1), TH_CASE(shrink_rank_dies_in_it, 1),
              TH_CASE(revoke_then_shrink, 4), TH_CASE(revoke_reaches_p2p, 2),
              TH_CASE(grow_and_join, 1), TH_CASE(two_grows_of_one_job, 1),
              TH_CASE(grow_rank0_dies, 1), TH_CASE(shrink_live, 2), TH_CASE(agree, 2))
