/* Set-up waits that end when another rank's set-up failed: see setup.h. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "core/fault.h"
#include "core/setup.h"
#include "core/state.h"
#include "store/store_impl.h"

int tt_store_get_now(tutti_store_t *js, const char *key, void **v_p, size_t *len_p)
{
    const char *k = key;
    int exists = 0;
    int st = tutti_store_check(js, &k, 1, &exists);
    if (st < 0)
        return st;
    if (!exists)
        return TUTTI_ERR_NOT_FOUND;
    return tutti_store_get(js, key, v_p, len_p, 1000);
}

/* A set-up wait looks for a peer's failed set-up after 200 ms, then after slices twice as
 * long, up to 3.2 s: a store that reconnects when a timed wait ends (tcp) pays a few
 * connections a wait, not five a second. */
#define INIT_SLICE_MS 200
#define INIT_SLICE_MAX_MS 3200

int tt_setup_peer_failed(tutti_comm_t *comm)
{
    if (comm->setup_peer_status)
        return comm->setup_peer_status;
    if (!atomic_load(&comm->in_setup) || !comm->qstore)
        return 0;
    void *v = NULL;
    size_t len = 0;
    /* one existence check (and a read once it exists), through the instance's view with
     * the quick deadline: a stalled store must not stretch the wait it is asked between.
     * The key is the job store's "<nonce>/init_failed_first" (tt_job_init_failed). */
    if (tt_store_get_now(comm->qstore, "init_failed_first", &v, &len) < 0)
        return 0;
    char *end = NULL;
    long r = strtol(v, &end, 10), fst = end && *end == ' ' ? strtol(end + 1, &end, 10) : 0;
    if (fst >= 0 || fst <= TUTTI_STATUS_LAST_ || !end || *end != ' ')
        fst = TUTTI_ERR_PEER;
    if (r == comm->rank && fst != TUTTI_ERR_IN_USE) {
        /* this rank's own, from an earlier call (this process, or the one it restarted in
         * place of): not a peer's. A contest is: a second process claimed this rank
         * (job.c, slot_taken), and the instance cannot go on */
        free(v);
        return 0;
    }
    /* its last error, "rank R: init: <why>": R said once */
    const char *why = tt_after_rank_prefix(end && *end ? end + 1 : "", r);
    snprintf(comm->setup_peer_why, sizeof(comm->setup_peer_why), "rank %ld failed its set-up: %.*s",
             r, (int)TT_MIN(strlen(why), sizeof(comm->setup_peer_why) - 64), why);
    free(v);
    comm->setup_peer_status = (int)fst;
    TT_INFO("init: %s", comm->setup_peer_why);
    return (int)fst;
}

typedef struct init_get {
    tutti_store_t *store;
    const char *const *keys;
    size_t n;
    int many; /* multi_get (else get of keys[0]) */
    void **values_p;
    size_t *lens_p;
    const char *owner; /* keys[i] is <owner> i's ("rank"), or NULL */
} init_get_t;

static int init_get(const init_get_t *g, int ms)
{
    return g->many ? tutti_store_multi_get(g->store, g->keys, g->n, g->values_p, g->lens_p, ms)
                   : tutti_store_get(g->store, g->keys[0], g->values_p, g->lens_p, ms);
}

/* How many missing keys a timed-out multi_get names, and how long it looks for them. */
#define MISSING_NAMED 8
#define MISSING_LOOK_MS 1000

/* A multi_get of set-up timed out: which keys are missing? One existence check each
 * (bounded: MISSING_LOOK_MS in all, none after the store fails), so that the error names
 * the ranks that never came (a rank that died during a shrink or a grow, say) rather
 * than the first key, which may well be this rank's own. Every key there by now: one
 * more get, which answers at once. */
static int multi_timed_out(const init_get_t *g, int timeout_ms)
{
    uint64_t until = tt_now_ns() + (uint64_t)MISSING_LOOK_MS * 1000000u;
    size_t looked = 0, nmissing = 0, first = 0;
    char named[512];
    int n = 0;
    named[0] = '\0';
    for (; looked < g->n && tt_now_ns() < until; looked++) {
        int exists = 0;
        if (tutti_store_check(g->store, &g->keys[looked], 1, &exists) < 0)
            break;
        if (exists)
            continue;
        if (!nmissing++)
            first = looked;
        if (nmissing > MISSING_NAMED || n < 0 || (size_t)n >= sizeof(named))
            continue;
        if (g->owner)
            n += snprintf(named + n, sizeof(named) - (size_t)n, "%s%s %zu", n ? ", " : "", g->owner,
                          looked);
        else
            n += snprintf(named + n, sizeof(named) - (size_t)n, "%s'%s'", n ? ", " : "",
                          g->keys[looked]);
    }
    if (looked == g->n && nmissing == 0) {
        int st = init_get(g, 1);
        if (st != TUTTI_ERR_TIMEOUT)
            return st;
    }
    const char *op = "multi_get";
    if (nmissing == 0) /* the store failed, or the keys came as it looked */
        tt_store_note(g->store, op, g->keys[0], TUTTI_ERR_TIMEOUT,
                      "not all of %zu keys (the first named) set after %d ms", g->n, timeout_ms);
    else
        tt_store_note(g->store, op, g->keys[first], TUTTI_ERR_TIMEOUT,
                      "%zu of %zu keys not set after %d ms%s: %s%s%s", nmissing, g->n, timeout_ms,
                      looked < g->n ? " (of those looked at)" : "",
                      g->owner ? "missing those of " : "missing ", named,
                      nmissing > MISSING_NAMED ? " and more" : "");
    return TUTTI_ERR_TIMEOUT;
}

/* One wait of set-up, in slices: until it ends other than by its slice's timeout, a
 * peer's set-up failed, or timeout_ms (< 0: none) passed. */
static int init_wait(tutti_comm_t *comm, const init_get_t *g, int timeout_ms)
{
    if (timeout_ms < 0) /* the store's own default, as tutti_store_get takes it */
        timeout_ms = tutti_store_timeout(g->store);
    if (!atomic_load(&comm->in_setup) || timeout_ms < 0 || timeout_ms <= INIT_SLICE_MS)
        return init_get(g, timeout_ms);
    uint64_t deadline = tt_now_ns() + (uint64_t)timeout_ms * 1000000u;
    const char *op = g->many ? "multi_get" : "get";
    for (int slice = INIT_SLICE_MS;; slice = TT_MIN(2 * slice, INIT_SLICE_MAX_MS)) {
        int left = tt_ms_left(deadline);
        int st = init_get(g, TT_MAX(TT_MIN(slice, left), 1));
        if (st != TUTTI_ERR_TIMEOUT)
            return st;
        int peer = tt_setup_peer_failed(comm);
        if (peer) {
            tt_store_note(g->store, op, g->keys[0], peer,
                          "stopped waiting: another rank failed its set-up");
            return peer;
        }
        if (tt_ms_left(deadline) <= 0) {
            /* the last slice's message would give the slice's length */
            if (g->n > 1)
                return multi_timed_out(g, timeout_ms);
            tt_store_note(g->store, op, g->keys[0], TUTTI_ERR_TIMEOUT, "not set after %d ms",
                          timeout_ms);
            return TUTTI_ERR_TIMEOUT;
        }
    }
}

int tt_init_store_get(tutti_comm_t *comm, tutti_store_t *store, const char *key, void **value_p,
                      size_t *len_p, int timeout_ms)
{
    init_get_t g = { store, &key, 1, 0, value_p, len_p, NULL };
    return init_wait(comm, &g, timeout_ms);
}

int tt_init_store_multi_get(tutti_comm_t *comm, tutti_store_t *store, const char *const *keys,
                            size_t n, void **values_p, size_t *lens_p, int timeout_ms,
                            const char *owner)
{
    init_get_t g = { store, keys, n, 1, values_p, lens_p, owner };
    return init_wait(comm, &g, timeout_ms);
}
