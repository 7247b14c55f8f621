/* The shared-memory transport: through its ABI directly (dead peers, a subset of peers,
 * cancel at a message boundary, withdrawn pulls, single copy on a hint; the contract every transport keeps,
 * mismatches, error reports and abort among it, is test_conformance's) and through the
 * library with TUTTI_TRANSPORT=shm (messages of every awkward size and alignment both
 * ways, on the single-copy path (TUTTI_SHM_CMA_BYTES) and through the rings, many in
 * flight, a rank killed mid-collective, a rank that destroyed its communicator and lives
 * on, 8 ranks on 2 cores, two ranks left on one CPU parting, no page faults on a first
 * pass through the rings). Every case checks that
 * nothing is left in /dev/shm; the receive path on a ring in this process: a record is
 * found by its stamp alone, a stale stamp is not taken, a wrong one past the head is a
 * protocol error). The correctness matrices (test_coll, test_coll2) also run
 * over shm with TUTTI_TRANSPORT=shm. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <check.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tutti/store.h>
#include <tutti/transport_v2.h>
#include <tutti/tutti.h>

#include "fake_host.h"
#include "harness.h"
#include "ref.h"
#include "shm.h"

#define JR_SKIP_SHM 77 /* a rank that cannot have a pid namespace of its own */

const tutti_transport_ops_v2_t *tt_builtin_transport_shm(void);

/* ---- shared between the test and its ranks ---- */

typedef struct shared {
    time_t since; /* when this case started (leftovers older than that are not its own) */
    int pids[16];
    int arg;
    int flag;        /* set by one rank for the others */
    double stamp_ms; /* th_now_ms() of a rank's step the others time from */
    int stamped;     /* stamp_ms is set */
} shared_t;

static shared_t *shared_area(void)
{
    static shared_t *sh;
    if (!sh)
        sh = th_shared_zeroed(sizeof(*sh));
    memset(sh, 0, sizeof(*sh));
    sh->since = time(NULL) - 1;
    return sh;
}

/* Segments of these processes still in /dev/shm (their names carry the creator's pid;
 * one older than this case was left by another process whose pid a rank reuses). */
static int leftovers(const shared_t *sh, int n)
{
    return th_shm_leftovers(sh->pids, n, sh->since);
}

/* on: messages of 16 KiB or more are pulled with process_vm_readv; off (the default):
 * everything streams through the rings */
static void set_cma(int on)
{
    if (on)
        setenv("TUTTI_SHM_CMA_BYTES", "16K", 1);
    else
        unsetenv("TUTTI_SHM_CMA_BYTES");
}

/* One run of fn on nranks with a fresh shared area (sh->arg = arg) as its arg, single
 * copy set as cma says for the run (-1: left as it is): th_run_ex's result, and in
 * *sh_p the area, for leftovers(). */
static int run_shm(int nranks, th_rank_fn fn, int arg, int cma, const tutti_comm_opts_t *o,
                   int timeout_ms, int flags, int *codes, shared_t **sh_p)
{
    if (cma >= 0)
        set_cma(cma);
    shared_t *sh = shared_area();
    sh->arg = arg;
    th_spec_t spec = {
        .nranks = nranks, .fn = fn, .arg = sh, .timeout_ms = timeout_ms, .flags = flags, .opts = o
    };
    int rc = th_run_ex(&spec, codes);
    if (cma >= 0)
        set_cma(0);
    *sh_p = sh;
    return rc;
}

/* ---- a host for driving the transport through its ABI (fake_host.h) ---- */

/* Open a transport instance for this rank under its own store prefix. */
/* This rank's process in the shared area sh (leftovers() looks for its segments). */
static shared_t *enlist(void *sh, int rank)
{
    ((shared_t *)sh)->pids[rank] = getpid();
    return sh;
}

/* Open a transport instance for this rank, enlisted in sh, under its own store prefix:
 * the instance, or NULL (t->err says why). */
static void *tp_open(th_host_t *t, void *sh, const char *dir, const char *prefix, int rank,
                     int nranks, const unsigned char *peers)
{
    void *tp = NULL;
    enlist(sh, rank);
    if (th_host_open(t, dir, prefix, rank, nranks, 10000) != 0)
        return NULL;
    t->h.peers = peers;
    if (tt_builtin_transport_shm()->create(&t->h, &tp) != 0)
        return NULL;
    return tp;
}

/* Progress until req is no longer pending or ms pass. */
static void drive(void *tp, tutti_tp_req_v2_t *req, int ms)
{
    const tutti_transport_ops_v2_t *ops = tt_builtin_transport_shm();
    double end = th_now_ms() + ms;
    while (req->status == 1 && th_now_ms() < end)
        if (ops->progress(tp, 100) < 0)
            break;
}

/* envelope (e0, 0x1234, len, e3) */
#define req_set(r, peer, buf, len, e0, e3) th_req_set(r, peer, buf, len, e0, 0x1234, e3)

/* a little barrier over the store */
static void store_barrier(th_host_t *t, const char *name, int nranks)
{
    int64_t v = 0;
    char key[64];
    snprintf(key, sizeof(key), "bar/%s", name);
    tutti_store_add(t->store, key, 1, &v);
    while (v < nranks) {
        usleep(2000);
        tutti_store_add(t->store, key, 0, &v);
    }
}

/* ---- through the ABI ---- */

/* A peer process that vanishes (no destroy, no report) fails the requests on it with
 * TUTTI_ERR_PEER naming it, while a blocked progress() is waiting; a subset of peers
 * (host->peers) is respected: rank 2 serves nobody and never meets the others. */
static int rank_tp_dead(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)comm;
    const tutti_transport_ops_v2_t *ops = tt_builtin_transport_shm();
    unsigned char peers[3] = { 0 };
    if (rank < 2)
        peers[1 - rank] = 1;
    th_host_t t;
    void *tp = tp_open(&t, arg, dir, "dd/", rank, nranks, peers);
    FAIL_IF(!tp, "create: %s", t.err);
    if (rank == 2) {
        /* served nobody: nothing to do, nothing addressed */
        FAIL_IF(ops->peer_address(tp, 0) != NULL, "rank 2 has an address for rank 0");
        ops->destroy(tp);
        return 0;
    }
    FAIL_IF(ops->peer_address(tp, 2) != NULL, "an address for unserved rank 2");
    FAIL_IF(!strstr(ops->peer_address(tp, 1 - rank), "shm:pid"), "address %s",
            ops->peer_address(tp, 1 - rank));
    char buf[8];
    tutti_tp_req_v2_t r;
    req_set(&r, 2, buf, 8, 1, 1);
    FAIL_IF(ops->post_recv(tp, &r) != TUTTI_ERR_INVALID_ARG, "posted to unserved rank 2");
    if (rank == 1) {
        /* one message, then vanish */
        req_set(&r, 0, buf, 8, 1, 1);
        FAIL_IF(ops->post_send(tp, &r) != 0, "post_send");
        drive(tp, &r, 5000);
        FAIL_IF(r.status != 0, "send %d", r.status);
        _exit(0);
    }
    req_set(&r, 1, buf, 8, 1, 1);
    FAIL_IF(ops->post_recv(tp, &r) != 0, "post_recv");
    drive(tp, &r, 5000);
    FAIL_IF(r.status != 0, "the message sent before the peer died was lost: %d", r.status);
    req_set(&r, 1, buf, 8, 2, 1);
    FAIL_IF(ops->post_recv(tp, &r) != 0, "post_recv 2");
    double t0 = th_now_ms();
    drive(tp, &r, 10000);
    double dt = th_now_ms() - t0;
    FAIL_IF(r.status != TUTTI_ERR_PEER, "status %d after %.0f ms", r.status, dt);
    FAIL_IF(dt > 2000, "noticed after %.0f ms", dt);
    FAIL_IF(!strstr(t.err, "rank 1") || t.err_peer != 1, "message: %s", t.err);
    ops->destroy(tp);
    th_host_close(&t);
    return 0;
}

START_TEST(abi_dead_peer_and_subset)
{
    shared_t *sh;
    int codes[3];
    ck_assert_int_eq(run_shm(3, rank_tp_dead, 0, -1, NULL, 30000, TH_NO_COMM | TH_NO_KILL_ON_FAIL,
                             codes, &sh),
                     0);
    ck_assert_int_eq(leftovers(sh, 3), 0);
}
END_TEST

/* cancel_all() with a receive posted but nothing of its message read (the previous
 * message complete) fails that receive only: the stream is at a record boundary, so the
 * link stays usable, as in the TCP transport. Round 0 through the ring, round 1 pulled
 * (where process_vm_readv is allowed). */
static int rank_tp_cancel_idle(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)comm;
    const size_t big = 64u << 10;
    unsigned char *buf = malloc(big);
    FAIL_IF(!buf, "malloc");
    const tutti_transport_ops_v2_t *ops = tt_builtin_transport_shm();
    th_host_t t;
    void *tp = tp_open(&t, arg, dir, "ci/", rank, nranks, NULL);
    FAIL_IF(!tp, "create: %s", t.err);
    for (int round = 0; round < 2; round++) {
        size_t len = round ? big : 8;
        char bar[32];
        tutti_tp_req_v2_t r;
        if (rank == 0) {
            memset(buf, 0x40 + round, len);
            req_set(&r, 1, buf, len, 1, (uint64_t)round);
            FAIL_IF(ops->post_send(tp, &r) != 0, "post_send");
            drive(tp, &r, 5000);
            FAIL_IF(r.status != 0, "round %d: send 1: %d", round, r.status);
            snprintf(bar, sizeof(bar), "ci%da", round);
            store_barrier(&t, bar, nranks); /* rank 1 cancelled its second receive */
            memset(buf, 0x50 + round, len);
            req_set(&r, 1, buf, len, 2, (uint64_t)round);
            FAIL_IF(ops->post_send(tp, &r) != 0, "post_send 2");
            drive(tp, &r, 5000);
            FAIL_IF(r.status != 0, "round %d: send 2: %d", round, r.status);
        } else {
            req_set(&r, 0, buf, len, 1, (uint64_t)round);
            FAIL_IF(ops->post_recv(tp, &r) != 0, "post_recv");
            drive(tp, &r, 5000);
            FAIL_IF(r.status != 0, "round %d: receive 1: %d", round, r.status);
            FAIL_IF(buf[len - 1] != 0x40 + round, "round %d: data", round);
            req_set(&r, 0, buf, len, 2, (uint64_t)round);
            FAIL_IF(ops->post_recv(tp, &r) != 0, "post_recv 2");
            FAIL_IF(ops->progress(tp, 20) != 0, "progress");
            ops->cancel_all(tp, TUTTI_ERR_TIMEOUT);
            FAIL_IF(r.status != TUTTI_ERR_TIMEOUT, "round %d: cancelled receive: %d", round,
                    r.status);
            snprintf(bar, sizeof(bar), "ci%da", round);
            store_barrier(&t, bar, nranks);
            req_set(&r, 0, buf, len, 2, (uint64_t)round);
            FAIL_IF(ops->post_recv(tp, &r) != 0,
                    "round %d: the link failed with the cancel: post_recv gave %d", round,
                    r.status);
            drive(tp, &r, 5000);
            FAIL_IF(r.status != 0, "round %d: receive 2: %d", round, r.status);
            FAIL_IF(buf[0] != 0x50 + round || buf[len - 1] != 0x50 + round,
                    "round %d: data of receive 2", round);
        }
    }
    store_barrier(&t, "ci-end", nranks);
    free(buf);
    ops->destroy(tp);
    th_host_close(&t);
    return 0;
}

START_TEST(abi_cancel_at_boundary_keeps_link)
{
    shared_t *sh;
    int rc = run_shm(2, rank_tp_cancel_idle, 0, 1, NULL, 30000, TH_NO_COMM, NULL, &sh);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(leftovers(sh, 2), 0);
}
END_TEST

/* A pulled send withdrawn while the receiver has not pulled it yet, the buffer then
 * reused: the receiver must fail, never deliver the reused bytes as data. sh->arg: 0
 * notify_error() then cancel_all() (the report comes first: it sets tx_broken, which
 * must not stop the revocation); 1 destroy() with the send still pending; 2 the link
 * fails under the send (rank 1 reports a failure, and then still receives). */
static int rank_tp_withdraw(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)comm;
    shared_t *sh = arg;
    int how = sh->arg;
    const tutti_transport_ops_v2_t *ops = tt_builtin_transport_shm();
    th_host_t t;
    void *tp = tp_open(&t, sh, dir, "wd/", rank, nranks, NULL);
    FAIL_IF(!tp, "create: %s", t.err);
    const size_t len = 64u << 10;
    unsigned char *buf = malloc(len);
    FAIL_IF(!buf, "malloc");
    tutti_tp_req_v2_t r;
    if (rank == 0) {
        if (how == 2)
            store_barrier(&t, "wd0", nranks); /* rank 1 reported */
        memset(buf, 0xAB, len);
        req_set(&r, 1, buf, len, 1, 1);
        FAIL_IF(ops->post_send(tp, &r) != 0, "post_send");
        sh->flag = r.status == 1; /* pending: published as a pull (else: in the ring) */
        if (how == 0) {
            ops->notify_error(tp, TUTTI_ERR_TIMEOUT, "rank 0 gave up");
            ops->cancel_all(tp, TUTTI_ERR_TIMEOUT);
            FAIL_IF(r.status != TUTTI_ERR_TIMEOUT && r.status != 0, "send status %d", r.status);
        } else if (how == 1) {
            ops->destroy(tp);
            tp = NULL;
        } else if (sh->flag) {
            drive(tp, &r, 5000); /* finds the report: the link fails under the send */
            FAIL_IF(r.status != TUTTI_ERR_TIMEOUT, "send status %d", r.status);
        }
        memset(buf, 0xCD, len); /* the library reuses the buffer */
        store_barrier(&t, "wd1", nranks);
        store_barrier(&t, "wd2", nranks); /* alive while rank 1 pulls */
    } else {
        if (how == 2) {
            ops->notify_error(tp, TUTTI_ERR_TIMEOUT, "rank 1 gave up");
            store_barrier(&t, "wd0", nranks);
        }
        store_barrier(&t, "wd1", nranks);
        memset(buf, 0, len);
        req_set(&r, 0, buf, len, 1, 1);
        int st = ops->post_recv(tp, &r);
        if (st == 0)
            drive(tp, &r, 5000);
        int pulled = sh->flag;
        if (pulled) {
            FAIL_IF(r.status == 0 || r.status == 1,
                    "%s: the receive gave %d, data 0x%02x (a withdrawn pull taken for data)",
                    how == 2 ? "link failed"
                    : how    ? "destroy"
                             : "notify_error + cancel_all",
                    r.status, buf[0]);
        } else {
            FAIL_IF(r.status != 0 || buf[len - 1] != 0xAB, "ring path: status %d", r.status);
        }
        store_barrier(&t, "wd2", nranks);
    }
    free(buf);
    if (tp)
        ops->destroy(tp);
    th_host_close(&t);
    return 0;
}

START_TEST(abi_withdrawn_pull_never_delivered)
{
    for (int how = 0; how < 3; how++) {
        shared_t *sh;
        int rc = run_shm(2, rank_tp_withdraw, how, 1, NULL, 30000, TH_NO_COMM, NULL, &sh);
        ck_assert_msg(rc == 0, "%s",
                      how == 2 ? "link failed"
                      : how    ? "destroy"
                               : "notify_error + cancel_all");
        ck_assert_int_eq(leftovers(sh, 2), 0);
    }
}
END_TEST

/* Single copy on a hint (ABI 1.3): a send hinted TUTTI_TP_HINT_SINGLE_COPY of at least
 * TUTTI_SHM_CMA_HINT_BYTES (auto: 16 MiB where the ranks have a CPU each, never where
 * they outnumber the CPUs) is published as a pull, so it is still pending after
 * post_send while nobody receives; unhinted, under the threshold, with the threshold 0,
 * or from a library whose requests have no hints field (req_size 0) it goes into the
 * ring and is done at once: the rings are made larger than the message where that is
 * the difference (a message larger than the ring is pending after post_send either
 * way). Either way the receiver gets every byte. pulled 2: pulled only where the 2
 * ranks have a CPU each (auto's 16 MiB), else streamed (auto's never): such a case runs
 * again with both ranks pinned to one CPU. */
static const struct hint_case {
    const char *what;
    int hinted, req_size, pulled;
    size_t len;
    const char *knobs;
} hint_cases[] = {
    { "hinted 16 MiB", 1, 1, 2, 16u << 20, "SHM_RING_BYTES=32M" },
    { "hinted 16 MiB, auto", 1, 1, 2, 16u << 20, "SHM_CMA_HINT_BYTES=auto,SHM_RING_BYTES=32M" },
    { "hinted 8 MiB, auto", 1, 1, 0, 8u << 20, "SHM_CMA_HINT_BYTES=auto,SHM_RING_BYTES=32M" },
    { "unhinted 128 KiB, threshold 64K", 0, 1, 0, 128u << 10, "SHM_CMA_HINT_BYTES=64K" },
    { "hinted 64 KiB (under the auto size)", 1, 1, 0, 64u << 10, NULL },
    { "hinted 128 KiB, threshold 0", 1, 1, 0, 128u << 10, "SHM_CMA_HINT_BYTES=0" },
    { "hinted 32 KiB, threshold 16K", 1, 1, 1, 32u << 10, "SHM_CMA_HINT_BYTES=16K" },
    { "hinted 128 KiB from a library without hints, threshold 64K", 1, 0, 0, 128u << 10,
      "SHM_CMA_HINT_BYTES=64K" },
};

static int rank_tp_hint(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)comm;
    shared_t *sh = arg;
    const struct hint_case *c = &hint_cases[sh->arg & 0xff];
    const int crowded = sh->arg >> 8; /* both ranks on one CPU (before create reads it) */
    const tutti_transport_ops_v2_t *ops = tt_builtin_transport_shm();
    th_host_t t;
    void *tp = NULL;
    cpu_set_t cpus;
    enlist(sh, rank);
    FAIL_IF(sched_getaffinity(0, sizeof(cpus), &cpus) != 0, "sched_getaffinity");
    if (crowded) {
        cpu_set_t one;
        CPU_ZERO(&one);
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
            if (CPU_ISSET(cpu, &cpus)) {
                CPU_SET(cpu, &one);
                break;
            }
        FAIL_IF(sched_setaffinity(0, sizeof(one), &one) != 0, "pin to one CPU");
    }
    FAIL_IF(th_host_open(&t, dir, "hint/", rank, nranks, 10000) != 0, "host: %s", t.err);
    t.knobs = c->knobs;
    t.h.req_size = c->req_size ? sizeof(tutti_tp_req_v2_t) : 0;
    FAIL_IF(ops->create(&t.h, &tp) != 0, "create: %s", t.err);
    unsigned char *buf = malloc(c->len);
    FAIL_IF(!buf, "malloc");
    tutti_tp_req_v2_t r;
    if (rank == 0) {
        for (size_t i = 0; i < c->len; i++)
            buf[i] = (unsigned char)(i * 7 + 3);
        req_set(&r, 1, buf, c->len, 1, 1);
        r.hints = c->hinted ? TUTTI_TP_HINT_SINGLE_COPY : 0;
        FAIL_IF(ops->post_send(tp, &r) != 0, "%s: post_send", c->what);
        int pending = r.status == 1; /* published as a pull (else: copied into the ring) */
        int want = c->pulled == 2 ? !crowded && CPU_COUNT(&cpus) >= nranks : c->pulled;
        FAIL_IF(pending != want, "%s%s: %s", c->what, crowded ? ", ranks on one CPU" : "",
                pending ? "pulled, where it should stream through the ring"
                        : "streamed through the ring, where it should be pulled");
        store_barrier(&t, "h1", nranks);
        drive(tp, &r, 5000);
        FAIL_IF(r.status != 0, "%s: send status %d", c->what, r.status);
        store_barrier(&t, "h2", nranks); /* alive (and the buffer intact) until it landed */
    } else {
        store_barrier(&t, "h1", nranks);
        memset(buf, 0, c->len);
        req_set(&r, 0, buf, c->len, 1, 1);
        FAIL_IF(ops->post_recv(tp, &r) != 0, "%s: post_recv", c->what);
        drive(tp, &r, 5000);
        FAIL_IF(r.status != 0, "%s: receive status %d", c->what, r.status);
        for (size_t i = 0; i < c->len; i++)
            FAIL_IF(buf[i] != (unsigned char)(i * 7 + 3), "%s: byte %zu is 0x%02x", c->what, i,
                    buf[i]);
        store_barrier(&t, "h2", nranks);
    }
    free(buf);
    ops->destroy(tp);
    th_host_close(&t);
    return 0;
}

START_TEST(abi_single_copy_hint)
{
    for (int k = 0; k < (int)(sizeof(hint_cases) / sizeof(hint_cases[0])); k++)
        for (int crowded = 0; crowded <= (hint_cases[k].pulled == 2); crowded++) {
            shared_t *sh;
            int rc = run_shm(2, rank_tp_hint, k | crowded << 8, 0, NULL, 30000, TH_NO_COMM, NULL,
                             &sh);
            ck_assert_msg(rc == 0, "%s%s", hint_cases[k].what, crowded ? ", one CPU" : "");
            ck_assert_int_eq(leftovers(sh, 2), 0);
        }
}
END_TEST

static unsigned char pattern(int from, int to, size_t i, int k)
{
    return (unsigned char)(from * 31 + to * 7 + k * 13 + (int)(i % 251) + (int)(i / 251));
}

/* How a sender stores ring steps of SHM_NT_MIN or more (TUTTI_SHM_NT_STORES): on streams
 * every one past the cache, off none, auto times both ways and explores the other one
 * every SHM_NT_EXPLORE-th step; a 64 KiB ring, so steps wrap and split. Sizes around
 * SHM_NT_MIN from odd offsets, checked with guards on the receiver; the sender's counts
 * say which way its steps went. A value that is none of the three fails create. */
static const struct nt_case {
    const char *knobs;
    int mode; /* SHM_NT_*, or -1: create must fail */
} nt_cases[] = {
    { "SHM_NT_STORES=on,SHM_RING_BYTES=64K", SHM_NT_ON },
    { "SHM_NT_STORES=off,SHM_RING_BYTES=64K", SHM_NT_OFF },
    { "SHM_NT_STORES=auto,SHM_RING_BYTES=64K", SHM_NT_AUTO },
    { "SHM_NT_STORES=yes,SHM_RING_BYTES=64K", -1 },
};

static int rank_tp_nt(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)comm;
    shared_t *sh = arg;
    const struct nt_case *c = &nt_cases[sh->arg];
    const tutti_transport_ops_v2_t *ops = tt_builtin_transport_shm();
    static const size_t sizes[] = { 16383, 16384, 16385, 65537, (1u << 20) + 3, (4u << 20) + 1 };
    const size_t maxb = (4u << 20) + 16;
    th_host_t t;
    void *tp = NULL;
    enlist(sh, rank);
    FAIL_IF(th_host_open(&t, dir, "nt/", rank, nranks, 10000) != 0, "host: %s", t.err);
    t.knobs = c->knobs;
    int st = ops->create(&t.h, &tp);
    if (c->mode < 0) {
        if (st == 0)
            ops->destroy(tp);
        th_host_close(&t);
        FAIL_IF(st != TUTTI_ERR_CONFIG, "%s: create gave %s", c->knobs, tutti_status_name(st));
        FAIL_IF(!strstr(t.err, "TUTTI_SHM_NT_STORES=\"yes\""), "%s: message: %s", c->knobs, t.err);
        return 0;
    }
    FAIL_IF(st != 0, "%s: create: %s", c->knobs, t.err);
    unsigned char *buf = malloc(maxb);
    FAIL_IF(!buf, "malloc");
    for (size_t k = 0; k < ARRAY_SIZE(sizes); k++) {
        size_t len = sizes[k], off = 1 + k % 7;
        tutti_tp_req_v2_t r;
        if (rank == 0) {
            for (size_t i = 0; i < len; i++)
                buf[off + i] = pattern(0, 1, i, (int)k);
            req_set(&r, 1, buf + off, len, 1 + k, 1);
            FAIL_IF(ops->post_send(tp, &r) != 0, "%s: post_send %zu", c->knobs, len);
        } else {
            memset(buf, 0xEE, maxb);
            req_set(&r, 0, buf + off, len, 1 + k, 1);
            FAIL_IF(ops->post_recv(tp, &r) != 0, "%s: post_recv %zu", c->knobs, len);
        }
        drive(tp, &r, 10000);
        FAIL_IF(r.status != 0, "%s: %zu bytes: status %d", c->knobs, len, r.status);
        if (rank == 1) {
            for (size_t i = 0; i < len; i++)
                FAIL_IF(buf[off + i] != pattern(0, 1, i, (int)k), "%s: %zu bytes: byte %zu is %u",
                        c->knobs, len, i, buf[off + i]);
            for (size_t i = 0; i < maxb; i++)
                FAIL_IF((i < off || i >= off + len) && buf[i] != 0xEE,
                        "%s: %zu bytes: byte %zu outside the message written", c->knobs, len, i);
        }
    }
    store_barrier(&t, "nt", nranks);
    int rc = 0;
    if (rank == 0) {
        const shm_link_t *L = &((shm_tp_t *)tp)->links[1];
        unsigned puts = L->nt_puts, streamed = L->nt_streamed;
        fprintf(stderr, "%s: %u of %u steps streamed\n", c->knobs, streamed, puts);
        /* every message from 16 KiB has a step of 16 KiB or more (x86 with AVX2, as
         * transports/kit/copy.h's TP_COPY_LOOP: elsewhere there is one way) */
#if defined(__x86_64__) && defined(__GNUC__)
        if (__builtin_cpu_supports("avx2")) {
            if (c->mode == SHM_NT_OFF)
                rc = puts != 0 || streamed != 0;
            else if (c->mode == SHM_NT_ON)
                rc = puts < ARRAY_SIZE(sizes) || streamed != puts;
            else
                rc = puts < 64 || streamed < puts / SHM_NT_EXPLORE || streamed > puts;
        }
#endif
        if (rc)
            fprintf(stderr, "%s: %u of %u steps streamed is wrong for the mode\n", c->knobs,
                    streamed, puts);
    }
    free(buf);
    ops->destroy(tp);
    th_host_close(&t);
    return rc;
}

/* auto's choice from the timings alone (shm_nt_learn), against the figures worked out by
 * hand from its rule: cached and streamed steps both at 100 cycles a KiB keep the cache;
 * one preempted cached step (100x) counts for nothing; cached steps at 500 (the slow
 * state) count from the second (the lower of two) and stream from there; streamed steps
 * keep streaming; explored cached steps at 100 turn it back. */
START_TEST(nt_choice_from_timings)
{
    float cost[2] = { 0.0f, 0.0f }, last[2] = { 0.0f, 0.0f };
    ck_assert_int_eq(shm_nt_learn(cost, last, 0, 100.0f), 0);   /* no streamed figure yet */
    ck_assert_int_eq(shm_nt_learn(cost, last, 1, 100.0f), 0);   /* streams under 100 / 1.5 */
    ck_assert_int_eq(shm_nt_learn(cost, last, 0, 10000.0f), 0); /* counts as 100 */
    ck_assert(cost[0] > 99.9f && cost[0] < 100.1f);
    ck_assert_int_eq(shm_nt_learn(cost, last, 0, 100.0f), 0);
    ck_assert_int_eq(shm_nt_learn(cost, last, 0, 500.0f), 0); /* counts as 100 */
    ck_assert_int_eq(shm_nt_learn(cost, last, 0, 500.0f), 1); /* 400 (4x): 175, over 150 */
    ck_assert(cost[0] > 174.9f && cost[0] < 175.1f);
    for (int i = 0; i < 10; i++)
        ck_assert_int_eq(shm_nt_learn(cost, last, 1, 100.0f), 1);
    ck_assert_int_eq(shm_nt_learn(cost, last, 0, 100.0f), 0); /* half way: 137.5 */
    ck_assert(cost[0] > 137.4f && cost[0] < 137.6f && cost[1] > 99.9f && cost[1] < 100.1f);
}
END_TEST

START_TEST(abi_streamed_ring_stores)
{
    for (int k = 0; k < (int)ARRAY_SIZE(nt_cases); k++) {
        shared_t *sh;
        int rc = run_shm(2, rank_tp_nt, k, 0, NULL, 60000, TH_NO_COMM, NULL, &sh);
        ck_assert_msg(rc == 0, "%s", nt_cases[k].knobs);
        ck_assert_int_eq(leftovers(sh, 2), 0);
    }
}
END_TEST

/* ---- through the library ---- */

/* In one rank: mapping another process's shm segment fails with ENOMEM (as in an
 * address space at its limit); its own segments map as ever. */
static volatile int fail_peer_maps;

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (fail_peer_maps && fd >= 0 && (flags & MAP_SHARED)) {
        char link[64], path[256];
        snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, path, sizeof(path) - 1);
        long pid;
        path[n > 0 ? n : 0] = 0;
        const char *t = strstr(path, "tutti-shm-");
        if (t && sscanf(t, "tutti-shm-%ld-", &pid) == 1 && pid != (long)getpid()) {
            errno = ENOMEM;
            return MAP_FAILED;
        }
    }
    return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

static tutti_comm_opts_t shm_opts(int timeout_ms)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.transport = "shm";
    o.timeout_ms = timeout_ms;
    return o;
}

/* Rank 0 cannot map rank 1's segments (mmap: ENOMEM): it fails with its own status,
 * TUTTI_ERR_NOMEM naming mmap (it said TUTTI_ERR_PEER), and rank 1 fails quoting rank
 * 0's reason (it said "rank 0 could not set up shared memory (its log says why)", or
 * "cannot open rank 0's segment ... ENOENT" where rank 0 had already removed it). */
static int rank_cannot_map(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 10000) != 0, "store");
    tutti_comm_opts_t o = shm_opts(10000);
    fail_peer_maps = rank == 0;
    tutti_comm_t *comm = NULL;
    double t0 = th_now_ms();
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    const char *e = tutti_comm_last_error(NULL);
    fail_peer_maps = 0;
    FAIL_IF(st == 0, "init passed");
    FAIL_IF(rank == 0 && st != TUTTI_ERR_NOMEM, "rank 0: %s, wanted TUTTI_ERR_NOMEM: %s",
            tutti_status_name(st), e);
    FAIL_IF(rank == 1 && st != TUTTI_ERR_PEER, "rank 1: %s, wanted TUTTI_ERR_PEER: %s",
            tutti_status_name(st), e);
    FAIL_IF(!strstr(e, "cannot map rank 1's segment") || !strstr(e, "(mmap)") ||
                !strstr(e, strerror(ENOMEM)),
            "the error does not give rank 0's own failure: %s", e);
    FAIL_IF(rank == 1 && !strstr(e, "rank 0 could not set up shared memory: shm: cannot map"),
            "rank 1 does not quote rank 0's reason: %s", e);
    FAIL_IF(th_now_ms() - t0 > 5000, "init took %.0f ms to fail", th_now_ms() - t0);
    tutti_store_close(store);
    return 0;
}

START_TEST(peer_segment_unmappable)
{
    th_spec_t spec = { .nranks = 2,
                       .fn = rank_cannot_map,
                       .timeout_ms = 30000,
                       .flags = TH_NO_COMM | TH_NO_KILL_ON_FAIL };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* Every awkward size, from odd offsets, both ways at once, between every pair. */
static int rank_sizes(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    enlist(arg, rank);
    static const size_t sizes[] = { 0,
                                    1,
                                    7,
                                    8,
                                    9,
                                    31,
                                    32,
                                    33,
                                    40,
                                    41,
                                    56,
                                    57,
                                    4095,
                                    16383,
                                    16384,
                                    16385,
                                    65537,
                                    (1u << 20) + 3,
                                    (4u << 20) + 1 };
    const size_t n = ARRAY_SIZE(sizes);
    size_t maxb = (4u << 20) + 1 + 8;
    for (int peer = 0; peer < nranks; peer++) {
        if (peer == rank)
            continue;
        for (size_t k = 0; k < n; k++) {
            size_t len = sizes[k];
            unsigned char *out = malloc(maxb), *in = malloc(maxb);
            FAIL_IF(!out || !in, "malloc");
            size_t so = 1 + k % 5, ro = 3 + k % 3; /* unaligned both ends */
            for (size_t i = 0; i < len; i++)
                out[so + i] = pattern(rank, peer, i, (int)k);
            memset(in, 0xEE, maxb);
            tutti_work_t *ws, *wr;
            FAIL_IF(tutti_send_async(comm, out + so, len, TUTTI_UINT8, peer, (uint32_t)k, &ws),
                    "send %zu", len);
            FAIL_IF(tutti_recv_async(comm, in + ro, len, TUTTI_UINT8, peer, (uint32_t)k, &wr),
                    "recv %zu", len);
            FAIL_IF(tutti_wait(ws, -1) != 0, "send %zu to %d: %s", len, peer, tutti_work_error(ws));
            FAIL_IF(tutti_wait(wr, -1) != 0, "recv %zu from %d: %s", len, peer,
                    tutti_work_error(wr));
            tutti_work_free(ws);
            tutti_work_free(wr);
            for (size_t i = 0; i < len; i++)
                FAIL_IF(in[ro + i] != pattern(peer, rank, i, (int)k),
                        "%zu bytes from %d: byte %zu is %u", len, peer, i, in[ro + i]);
            for (size_t i = 0; i < ro; i++)
                FAIL_IF(in[i] != 0xEE, "%zu bytes: guard before the buffer", len);
            for (size_t i = ro + len; i < maxb; i++)
                FAIL_IF(in[i] != 0xEE, "%zu bytes: written past the end at %zu", len, i);
            free(out);
            free(in);
        }
    }
    FAIL_IF(tutti_barrier(comm) != 0, "barrier: %s", tutti_comm_last_error(comm));
    return 0;
}

static void run_sizes(int cma, int nranks)
{
    shared_t *sh;
    tutti_comm_opts_t o = shm_opts(30000);
    ck_assert_int_eq(run_shm(nranks, rank_sizes, 0, cma, &o, 60000, 0, NULL, &sh), 0);
    ck_assert_int_eq(leftovers(sh, nranks), 0);
}

/* Many large messages in flight both ways, posted sends first: the transport must
 * receive while its sends wait. */
static int rank_inflight(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)nranks;
    enlist(arg, rank);
    enum { M = 6 };
    const size_t len = 4u << 20;
    int peer = 1 - rank;
    unsigned char *out[M], *in[M];
    tutti_work_t *ws[M], *wr[M];
    for (int k = 0; k < M; k++) {
        out[k] = malloc(len);
        in[k] = malloc(len);
        FAIL_IF(!out[k] || !in[k], "malloc");
        for (size_t i = 0; i < len; i += 4096)
            out[k][i] = pattern(rank, peer, i, k);
        out[k][len - 1] = (unsigned char)k;
    }
    for (int k = 0; k < M; k++)
        FAIL_IF(tutti_send_async(comm, out[k], len, TUTTI_UINT8, peer, 9, &ws[k]), "send");
    for (int k = 0; k < M; k++)
        FAIL_IF(tutti_recv_async(comm, in[k], len, TUTTI_UINT8, peer, 9, &wr[k]), "recv");
    for (int k = M - 1; k >= 0; k--) {
        FAIL_IF(tutti_wait(wr[k], -1) != 0, "recv %d: %s", k, tutti_work_error(wr[k]));
        FAIL_IF(tutti_wait(ws[k], -1) != 0, "send %d: %s", k, tutti_work_error(ws[k]));
        tutti_work_free(ws[k]);
        tutti_work_free(wr[k]);
    }
    for (int k = 0; k < M; k++) {
        for (size_t i = 0; i < len; i += 4096)
            FAIL_IF(in[k][i] != pattern(peer, rank, i, k), "message %d byte %zu", k, i);
        FAIL_IF(in[k][len - 1] != (unsigned char)k, "message %d out of order", k);
        free(out[k]);
        free(in[k]);
    }
    return 0;
}

static void run_inflight(int cma)
{
    shared_t *sh;
    tutti_comm_opts_t o = shm_opts(20000);
    double t0 = th_now_ms();
    ck_assert_int_eq(run_shm(2, rank_inflight, 0, cma, &o, 30000, 0, NULL, &sh), 0);
    ck_assert_msg(th_now_ms() - t0 < 15000, "took %.0f ms", th_now_ms() - t0);
    ck_assert_int_eq(leftovers(sh, 2), 0);
}

/* Allreduce around the eager/single-copy threshold and on big buffers, 2..5 ranks. */
static int rank_allreduce(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    enlist(arg, rank);
    static const size_t counts[] = { 1, 3, 4095, 4096, 4097, 65536 + 5, (1u << 20) + 7 };
    for (size_t k = 0; k < ARRAY_SIZE(counts); k++) {
        size_t c = counts[k];
        int32_t *buf = malloc(c * sizeof(int32_t));
        FAIL_IF(!buf, "malloc");
        for (size_t i = 0; i < c; i++)
            buf[i] = (int32_t)(rank * 1000 + (int)(i % 977));
        FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, buf, c, TUTTI_INT32, TUTTI_SUM) != 0,
                "allreduce %zu: %s", c, tutti_comm_last_error(comm));
        int32_t base = (int32_t)(1000 * nranks * (nranks - 1) / 2);
        for (size_t i = 0; i < c; i++)
            FAIL_IF(buf[i] != base + nranks * (int32_t)(i % 977), "count %zu: [%zu] = %d", c, i,
                    buf[i]);
        free(buf);
    }
    return 0;
}

START_TEST(allreduce_ranks)
{
    for (int cma = 1; cma >= 0; cma--) {
        for (int n = 2; n <= 5; n++) {
            shared_t *sh;
            tutti_comm_opts_t o = shm_opts(30000);
            int rc = run_shm(n, rank_allreduce, 0, cma, &o, 60000, 0, NULL, &sh);
            ck_assert_msg(rc == 0, "%d ranks, single copy %d", n, cma);
            ck_assert_int_eq(leftovers(sh, n), 0);
        }
    }
}
END_TEST

/* Mismatched collectives fail with TUTTI_ERR_MISMATCH on every rank, at once. */
static int rank_mismatch(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)nranks;
    shared_t *sh = enlist(arg, rank);
    size_t big = sh->arg ? (1u << 20) : 16;
    float *buf = calloc(big + 64, sizeof(float));
    FAIL_IF(!buf, "calloc");
    FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, buf, 64, TUTTI_FP32, TUTTI_SUM) != 0,
            "warm-up: %s", tutti_comm_last_error(comm));
    double t0 = th_now_ms();
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, buf, rank == 1 ? big + 1 : big, TUTTI_FP32,
                             TUTTI_SUM);
    double dt = th_now_ms() - t0;
    const char *msg = tutti_comm_last_error(comm);
    FAIL_IF(st != TUTTI_ERR_MISMATCH, "got %s: %s", tutti_status_name(st), msg);
    FAIL_IF(dt > 5000, "took %.0f ms", dt);
    FAIL_IF(tutti_barrier(comm) != TUTTI_ERR_MISMATCH, "barrier after the failure");
    free(buf);
    return 0;
}

START_TEST(mismatch_fails_everywhere)
{
    for (int big = 0; big <= 1; big++) {
        shared_t *sh;
        tutti_comm_opts_t o = shm_opts(20000);
        ck_assert_int_eq(run_shm(3, rank_mismatch, big, -1, &o, 30000, 0, NULL, &sh), 0);
        ck_assert_int_eq(leftovers(sh, 3), 0);
    }
}
END_TEST

/* A rank SIGKILLed in the middle of an allreduce: the survivors fail with
 * TUTTI_ERR_PEER naming it, long before the timeout, and nothing stays in /dev/shm. */
static int rank_killed(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    enlist(arg, rank);
    int victim = nranks - 1;
    const size_t count = 4u << 20;
    float *buf = malloc(count * sizeof(float));
    FAIL_IF(!buf, "malloc");
    for (size_t i = 0; i < count; i++)
        buf[i] = 1.0f;
    if (rank == victim)
        th_kill_self_after(300);
    int st = TUTTI_OK;
    for (int it = 0; it < 100000 && st == TUTTI_OK; it++)
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, buf, count, TUTTI_FP32, TUTTI_MAX);
    int failed = th_check_peer_died(rank, victim, st, tutti_comm_last_error(comm));
    free(buf);
    return failed;
}

static void run_killed(int cma)
{
    for (int n = 2; n <= 4; n++) {
        shared_t *sh;
        tutti_comm_opts_t o = shm_opts(60000); /* survivors must not need it */
        o.algo = "allreduce:ring";
        int codes[8];
        double t0 = th_now_ms();
        run_shm(n, rank_killed, 0, cma, &o, 20000, TH_NO_KILL_ON_FAIL, codes, &sh);
        double dt = th_now_ms() - t0;
        for (int r = 0; r < n - 1; r++)
            ck_assert_msg(codes[r] == 0, "%d ranks: survivor %d exited %d", n, r, codes[r]);
        ck_assert_int_eq(codes[n - 1], 128 + SIGKILL);
        ck_assert_msg(dt < 5000, "%d ranks took %.0f ms", n, dt);
        ck_assert_int_eq(leftovers(sh, n), 0);
    }
}

/* A rank in a pid namespace of its own (a container sharing the host's /dev/shm): its
 * pid means nothing here, so its peers watch it through the lock it holds on its
 * doorbell. SIGKILLed in the middle of an allreduce, it is seen gone at once (before,
 * only at the timeout: 60 s here). */
static int rank_killed_pidns(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    int victim = nranks - 1;
    if (rank == victim) {
        if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) {
            fprintf(stderr, "rank %d: unshare: %s: skipping\n", rank, strerror(errno));
            return JR_SKIP_SHM;
        }
        FAIL_IF(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0, "mount private");
        pid_t pid = fork();
        FAIL_IF(pid < 0, "fork");
        if (pid != 0) {
            int status = 0;
            waitpid(pid, &status, 0);
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        /* pid 1 of the new namespace, with its own /proc; the rank is its child (init
         * of a namespace takes no SIGKILL from inside it) */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (mount("proc", "/proc", "proc", 0, NULL) != 0)
            _exit(JR_SKIP_SHM);
        pid = fork();
        if (pid < 0)
            _exit(1);
        if (pid != 0) {
            int status = 0;
            waitpid(pid, &status, 0);
            /* 0: killed, as it should be */
            _exit(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL ? 0
                  : WIFEXITED(status) && WEXITSTATUS(status)         ? WEXITSTATUS(status)
                                                                     : 1);
        }
        prctl(PR_SET_PDEATHSIG, SIGKILL);
    }
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 10000) != 0, "store");
    tutti_comm_opts_t o = shm_opts(60000); /* survivors must not need it */
    o.algo = "allreduce:ring";
    tutti_comm_t *comm;
    FAIL_IF(tutti_comm_init(&comm, store, rank, nranks, &o) != 0, "init: %s",
            tutti_comm_last_error(NULL));
    const size_t count = 1u << 20;
    float *buf = malloc(count * sizeof(float));
    FAIL_IF(!buf, "malloc");
    for (size_t i = 0; i < count; i++)
        buf[i] = 1.0f;
    if (rank == victim)
        th_kill_self_after(300);
    int st = TUTTI_OK;
    for (int it = 0; it < 100000 && st == TUTTI_OK; it++)
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, buf, count, TUTTI_FP32, TUTTI_MAX);
    int failed = th_check_peer_died(rank, victim, st, tutti_comm_last_error(comm));
    free(buf);
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return failed;
}

START_TEST(rank_killed_in_other_pid_namespace)
{
    if (geteuid() != 0) {
        fprintf(stderr, "rank_killed_in_other_pid_namespace: skipped (needs root)\n");
        return;
    }
    /* open-file-description locks, which the watch is made of */
    FILE *tf = tmpfile();
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1 };
    int ofd = tf && fcntl(fileno(tf), F_OFD_SETLK, &fl) == 0;
    if (tf)
        fclose(tf);
    if (!ofd) {
        fprintf(stderr, "rank_killed_in_other_pid_namespace: skipped (no F_OFD_SETLK here)\n");
        return;
    }
    for (int n = 2; n <= 3; n++) {
        int codes[4];
        double t0 = th_now_ms();
        th_run_apart(n, rank_killed_pidns, NULL, 30000, codes);
        double dt = th_now_ms() - t0;
        if (codes[n - 1] == JR_SKIP_SHM) {
            fprintf(stderr, "rank_killed_in_other_pid_namespace: skipped (no pid namespaces)\n");
            return;
        }
        for (int r = 0; r < n - 1; r++)
            ck_assert_msg(codes[r] == 0, "%d ranks: survivor %d exited %d", n, r, codes[r]);
        ck_assert_msg(codes[n - 1] == 0, "%d ranks: the victim exited %d, not killed", n,
                      codes[n - 1]);
        ck_assert_msg(dt < 10000, "%d ranks took %.0f ms (the timeout is 60 s)", n, dt);
    }
}
END_TEST

START_TEST(sizes_single_copy)
{
    run_sizes(1, 3);
    /* 2 ranks on 2 or more CPUs: not oversubscribed, so a sender spins through the
     * pull its peer announced (3 on 2 CPUs keep the plain spin, then sleep) */
    run_sizes(1, 2);
}
END_TEST
START_TEST(sizes_ring)
{
    run_sizes(0, 3);
}
END_TEST
START_TEST(inflight_both_ways_single_copy)
{
    run_inflight(1);
}
END_TEST
START_TEST(inflight_both_ways_ring)
{
    run_inflight(0);
}
END_TEST
START_TEST(rank_killed_mid_allreduce)
{
    run_killed(0);
}
END_TEST
START_TEST(rank_killed_mid_allreduce_single_copy)
{
    run_killed(1);
}
END_TEST

/* 8 ranks on 2 CPUs: spinning must give way, so many small collectives and a few
 * large ones finish promptly. */
static int rank_eight(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    enlist(arg, rank);
    cpu_set_t all, two;
    CPU_ZERO(&two);
    if (sched_getaffinity(0, sizeof(all), &all) == 0) {
        int got = 0;
        for (int c = 0; c < CPU_SETSIZE && got < 2; c++)
            if (CPU_ISSET(c, &all)) {
                CPU_SET(c, &two);
                got++;
            }
        sched_setaffinity(0, sizeof(two), &two);
    }
    double t0 = th_now_ms();
    for (int it = 0; it < 300; it++) {
        int64_t x = rank + it, y = 0;
        FAIL_IF(tutti_allreduce(comm, &x, &y, 1, TUTTI_INT64, TUTTI_SUM) != 0, "allreduce %d: %s",
                it, tutti_comm_last_error(comm));
        FAIL_IF(y != (int64_t)nranks * (nranks - 1) / 2 + (int64_t)nranks * it, "sum %lld",
                (long long)y);
    }
    double t_small = th_now_ms() - t0;
    size_t c = 1u << 18;
    float *buf = malloc(c * sizeof(float));
    FAIL_IF(!buf, "malloc");
    for (int it = 0; it < 10; it++) {
        for (size_t i = 0; i < c; i++)
            buf[i] = 1.0f;
        FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, buf, c, TUTTI_FP32, TUTTI_SUM) != 0,
                "big allreduce: %s", tutti_comm_last_error(comm));
        FAIL_IF(buf[c - 1] != (float)nranks, "big sum %g", (double)buf[c - 1]);
    }
    FAIL_IF(tutti_barrier(comm) != 0, "barrier");
    if (rank == 0)
        fprintf(stderr, "8 ranks on 2 CPUs: 300 x 8-byte allreduce %.0f ms, 10 x 1 MiB %.0f ms\n",
                t_small, th_now_ms() - t0 - t_small);
    free(buf);
    return 0;
}

START_TEST(eight_ranks_two_cpus)
{
    shared_t *sh;
    tutti_comm_opts_t o = shm_opts(20000);
    double t0 = th_now_ms();
    ck_assert_int_eq(run_shm(8, rank_eight, 0, -1, &o, 30000, 0, NULL, &sh), 0);
    double dt = th_now_ms() - t0;
    ck_assert_msg(dt < 10000, "8 ranks took %.0f ms", dt);
    ck_assert_int_eq(leftovers(sh, 8), 0);
}
END_TEST

/* Two ranks made to share one CPU (pinned there after set-up, then given their whole
 * affinity back: the kernel leaves two cache-hot runnable tasks where they are, for 6 to
 * 28 ms here) must part: the higher rank, waiting for the other on its own CPU, moves
 * itself (within a millisecond here) and says so in its log (TUTTI_DEBUG=info, its
 * stderr sent to a file for the loop). Values checked on every call; every call carries
 * each rank's CPU, and the loop ends when they differ. */
/* Pin the calling thread to the k-th CPU it may run on (the mask it had goes to *all):
 * that CPU, or -1. */
static int pin_to_cpu(int k, cpu_set_t *all)
{
    cpu_set_t one;
    if (sched_getaffinity(0, sizeof(*all), all) != 0)
        return -1;
    for (int c = 0, n = 0; c < CPU_SETSIZE; c++) {
        if (CPU_ISSET(c, all) && n++ == k) {
            CPU_ZERO(&one);
            CPU_SET(c, &one);
            return sched_setaffinity(0, sizeof(one), &one) == 0 ? c : -1;
        }
    }
    return -1;
}

/* Placement tests need two CPUs: 1 (said on stderr) where there are fewer. */
static int fewer_than_two_cpus(const char *test)
{
    cpu_set_t all;
    if (sched_getaffinity(0, sizeof(all), &all) == 0 && CPU_COUNT(&all) >= 2)
        return 0;
    fprintf(stderr, "%s: fewer than 2 CPUs, skipped\n", test);
    return 1;
}

/* stderr into a file (TUTTI_DEBUG=info lines) until log_end(), which reads it back into
 * text (len bytes). 0, or -1 (said in msg). */
typedef struct log_capture {
    char path[512];
    int saved;
} log_capture_t;

static int log_begin(log_capture_t *c, const char *dir, const char *what, int rank)
{
    snprintf(c->path, sizeof(c->path), "%s/%s-log.%d", dir, what, rank);
    fflush(stderr);
    c->saved = dup(2);
    int fd = open(c->path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    if (c->saved < 0 || fd < 0 || dup2(fd, 2) < 0)
        return -1;
    close(fd);
    return 0;
}

/* What went to the captured stderr so far, into text (len bytes): 0, or -1. */
static int log_read(log_capture_t *c, char *text, size_t len)
{
    fflush(stderr);
    FILE *f = fopen(c->path, "r");
    if (!f)
        return -1;
    size_t got = fread(text, 1, len - 1, f);
    text[got] = 0;
    fclose(f);
    return 0;
}

static int log_end(log_capture_t *c, char *text, size_t len)
{
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    return log_read(c, text, len);
}

/* The rings are mapped in full at the pair's first use (MADV_POPULATE_WRITE and a touch,
 * on both sides): a later pass through them takes no page fault (it took one per page on
 * each side, 4 to 5 us in a VM). 2 ranks get rings of 1 MiB; after a first call, 600
 * calls of 2 KiB each way go past the end of both. */
static int rank_no_faults(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    enlist(arg, rank);
    enum { COUNT = 512, CALLS = 600 }; /* int32 per peer: 2 KiB each way */
    int32_t *in = malloc((size_t)nranks * COUNT * 4), *out = malloc((size_t)nranks * COUNT * 4);
    FAIL_IF(!in || !out, "malloc");
    for (int p = 0; p < nranks; p++)
        for (int i = 0; i < COUNT; i++)
            in[p * COUNT + i] = rank * 1000000 + p * 1000 + i;
    memset(out, 0, (size_t)nranks * COUNT * 4);
    FAIL_IF(tutti_alltoall(comm, in, out, COUNT, TUTTI_INT32) != 0, "alltoall: %s",
            tutti_comm_last_error(comm));
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    for (int it = 0; it < CALLS; it++)
        FAIL_IF(tutti_alltoall(comm, in, out, COUNT, TUTTI_INT32) != 0, "alltoall %d: %s", it,
                tutti_comm_last_error(comm));
    getrusage(RUSAGE_SELF, &r1);
    for (int p = 0; p < nranks; p++)
        for (int i = 0; i < COUNT; i++)
            FAIL_IF(out[p * COUNT + i] != p * 1000000 + rank * 1000 + i, "from %d [%d] = %d", p, i,
                    out[p * COUNT + i]);
    long faults = r1.ru_minflt - r0.ru_minflt;
    fprintf(stderr, "rank %d: %d alltoalls of 2 KiB each way, %ld minor faults\n", rank, CALLS,
            faults);
    /* Under ASan its allocator and shadow memory fault on their own (~260 in these calls,
     * against 511 for lazily mapped rings): the count says nothing there. */
    FAIL_IF(!TH_ASAN && faults > 32,
            "%ld page faults in %d calls (the rings are not mapped up front?)", faults, CALLS);
    free(in);
    free(out);
    return 0;
}

START_TEST(rings_mapped_up_front)
{
    shared_t *sh;
    tutti_comm_opts_t o = shm_opts(20000);
    ck_assert_int_eq(run_shm(2, rank_no_faults, 0, 0, &o, 60000, 0, NULL, &sh), 0);
    ck_assert_int_eq(leftovers(sh, 2), 0);
}
END_TEST

#define CALLS_TO_PART 100000
static int rank_part(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    shared_t *sh = enlist(arg, rank);
    cpu_set_t all;
    int first = pin_to_cpu(0, &all);
    FAIL_IF(first < 0, "pin to the first CPU");
    int64_t want = (int64_t)nranks * (nranks - 1) / 2;
    for (int it = 0; it < 200; it++) { /* both on `first`, taking turns */
        int64_t x = rank, y = 0;
        FAIL_IF(tutti_allreduce(comm, &x, &y, 1, TUTTI_INT64, TUTTI_SUM) != 0, "allreduce: %s",
                tutti_comm_last_error(comm));
        FAIL_IF(y != want, "pinned: sum %lld, want %lld", (long long)y, (long long)want);
    }
    log_capture_t cap;
    FAIL_IF(log_begin(&cap, dir, "part", rank) != 0, "stderr to a file");
    FAIL_IF(sched_setaffinity(0, sizeof(all), &all) != 0, "unpin");
    /* Each call carries the CPU each rank is on; the first call that finds them apart
     * ends the loop on both (they see the same sums). */
    int parted = -1;
    double t0 = th_now_ms();
    for (int it = 0; it < CALLS_TO_PART && parted < 0; it++) {
        int64_t x[3] = { rank + it, 0, 0 }, y[3];
        x[1 + rank] = sched_getcpu() + 1;
        FAIL_IF(tutti_allreduce(comm, x, y, 3, TUTTI_INT64, TUTTI_SUM) != 0, "allreduce: %s",
                tutti_comm_last_error(comm));
        FAIL_IF(y[0] != want + (int64_t)nranks * it, "sum %lld at %d", (long long)y[0], it);
        if (y[1] != y[2])
            parted = it;
    }
    double dt = th_now_ms() - t0;
    char text[8192];
    FAIL_IF(log_end(&cap, text, sizeof(text)) != 0, "read back %s", cap.path);
    if (rank == 1)
        sh->flag = strstr(text, "rank 1 waited for rank 0 on the same CPU") ? 1 : 0;
    if (rank == 0) {
        fprintf(stderr, "two ranks on CPU %d%s: apart after %d calls (%.1f ms)\n", first,
                sh->arg ? ", TUTTI_BIND=none" : "", parted, dt);
        /* under TUTTI_BIND=none only the kernel may part them */
        FAIL_IF(parted < 0 && !sh->arg, "still on one CPU after %d calls", CALLS_TO_PART);
    }
    return 0;
}

START_TEST(ranks_sharing_a_cpu_part)
{
    if (fewer_than_two_cpus("ranks_sharing_a_cpu_part"))
        return;
    shared_t *sh;
    tutti_comm_opts_t o = shm_opts(20000);
    setenv("TUTTI_DEBUG", "info", 1);
    int rc = run_shm(2, rank_part, 0, -1, &o, 60000, 0, NULL, &sh);
    unsetenv("TUTTI_DEBUG");
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(sh->flag == 1, "rank 1 did not say it left the CPU it shared with rank 0");
    ck_assert_int_eq(leftovers(sh, 2), 0);
}
END_TEST

/* The same with TUTTI_BIND=none: the transport moves no thread (it did: none held only
 * the collectives' own binding back, and shm still moved a waiting rank off the CPU). */
START_TEST(ranks_sharing_a_cpu_bind_none)
{
    if (fewer_than_two_cpus("ranks_sharing_a_cpu_bind_none"))
        return;
    shared_t *sh;
    tutti_comm_opts_t o = shm_opts(20000);
    o.bind = "none";
    setenv("TUTTI_DEBUG", "info", 1);
    int rc = run_shm(2, rank_part, 1, -1, &o, 60000, 0, NULL, &sh);
    unsetenv("TUTTI_DEBUG");
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(sh->flag == 0, "TUTTI_BIND=none: rank 1 moved itself off the CPU of rank 0");
    ck_assert_int_eq(leftovers(sh, 2), 0);
}
END_TEST

/* Four ranks on two CPUs, three of them made to share the first and the fourth alone on
 * the second (moved there, then given both back: the kernel leaves cache-hot tasks where
 * they are for tens of ms, and here the three took a switch each per call), must even
 * out to two and two: a rank on the fuller CPU moves itself to the emptier one and says
 * so in its log (TUTTI_DEBUG=info). Each rank makes its communicator after narrowing
 * itself to the two CPUs, so that the ranks outnumber their CPUs on any machine. Values
 * checked on every call; every call counts the ranks on each CPU, and the loop ends when
 * it is two and two. */
#define CALLS_TO_EVEN 100000
/* FAIL_IF with stderr given back first (captured, the reason would go to the log file) */
#define EFAIL_IF(cond, ...)                                                                        \
    do {                                                                                           \
        if (cond) {                                                                                \
            char lost_[16384];                                                                     \
            if (log_end(&cap, lost_, sizeof(lost_)) == 0)                                          \
                fputs(lost_, stderr);                                                              \
            FAIL_IF(1, __VA_ARGS__);                                                               \
        }                                                                                          \
    } while (0)
static int rank_even(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    shared_t *sh = enlist(arg, rank);
    cpu_set_t all, two, one;
    FAIL_IF(sched_getaffinity(0, sizeof(all), &all) != 0, "sched_getaffinity");
    int cpu[2], got = 0;
    CPU_ZERO(&two);
    for (int c = 0; c < CPU_SETSIZE && got < 2; c++)
        if (CPU_ISSET(c, &all)) {
            CPU_SET(c, &two);
            cpu[got++] = c;
        }
    FAIL_IF(got < 2, "two CPUs");
    CPU_ZERO(&one);
    CPU_SET(cpu[rank == 0], &one); /* ranks 1-3 on the first, rank 0 on the second */
    FAIL_IF(sched_setaffinity(0, sizeof(two), &two) != 0, "narrow to two CPUs");
    log_capture_t cap;
    FAIL_IF(log_begin(&cap, dir, "even", rank) != 0, "stderr to a file");
    tutti_store_t *store = NULL;
    tutti_comm_t *comm = NULL;
    tutti_comm_opts_t o = shm_opts(20000);
    EFAIL_IF(tutti_store_open_file(&store, dir, 20000) != TUTTI_OK, "store");
    EFAIL_IF(tutti_comm_init(&comm, store, rank, nranks, &o) != TUTTI_OK, "init");
    int64_t want = (int64_t)nranks * (nranks - 1) / 2;
    int evened = -1, moved = 0, round;
    double dt = 0;
    /* The kernel's balancer may win a round (it did in 2 of 8 runs without the library's
     * move here): up to 5 rounds until a rank says it moved. */
    for (round = 0; round < 5 && !moved; round++) {
        /* Moved there and given both CPUs back at once (a task held on one CPU for a
         * while is moved by the kernel's balancer as soon as it may be: its tries
         * failed), until a call finds three and one. */
        int placed = 0;
        for (int tries = 0; tries < 100 && !placed; tries++) {
            EFAIL_IF(sched_setaffinity(0, sizeof(one), &one) != 0, "move");
            EFAIL_IF(sched_setaffinity(0, sizeof(two), &two) != 0, "unpin");
            int c = sched_getcpu();
            int64_t x[3] = { rank, c == cpu[0], c == cpu[1] }, y[3];
            EFAIL_IF(tutti_allreduce(comm, x, y, 3, TUTTI_INT64, TUTTI_SUM) != 0, "allreduce: %s",
                     tutti_comm_last_error(comm));
            EFAIL_IF(y[0] != want, "placing: sum %lld, want %lld", (long long)y[0],
                     (long long)want);
            placed = y[1] == 3 && y[2] == 1;
        }
        EFAIL_IF(!placed, "could not place three ranks on CPU %d and one on %d", cpu[0], cpu[1]);
        evened = -1;
        double t0 = th_now_ms();
        for (int it = 0; it < CALLS_TO_EVEN && evened < 0; it++) {
            int c = sched_getcpu();
            int64_t x[3] = { rank + it, c == cpu[0], c == cpu[1] }, y[3];
            EFAIL_IF(tutti_allreduce(comm, x, y, 3, TUTTI_INT64, TUTTI_SUM) != 0, "allreduce: %s",
                     tutti_comm_last_error(comm));
            EFAIL_IF(y[0] != want + (int64_t)nranks * it, "sum %lld at %d", (long long)y[0], it);
            if (y[1] == 2 && y[2] == 2)
                evened = it;
        }
        dt = th_now_ms() - t0;
        EFAIL_IF(evened < 0, "round %d: not two and two after %d calls", round, CALLS_TO_EVEN);
        char text[16384];
        int64_t said = log_read(&cap, text, sizeof(text)) == 0, n = 0;
        said = said && strstr(text, "local ranks on CPU");
        EFAIL_IF(tutti_allreduce(comm, &said, &n, 1, TUTTI_INT64, TUTTI_SUM) != 0, "allreduce: %s",
                 tutti_comm_last_error(comm));
        moved = n > 0;
    }
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    char text[16384];
    FAIL_IF(log_end(&cap, text, sizeof(text)) != 0, "read back %s", cap.path);
    if (rank == 0) {
        sh->flag = moved; /* some rank's log said it moved (the sum of the last round) */
        fprintf(stderr,
                "three ranks on CPU %d, one on %d: two and two after %d calls (%.1f ms) "
                "in round %d of at most 5\n",
                cpu[0], cpu[1], evened, dt, round);
    }
    return 0;
}

START_TEST(crowded_ranks_even_out)
{
    if (fewer_than_two_cpus("crowded_ranks_even_out"))
        return;
    shared_t *sh = shared_area();
    setenv("TUTTI_DEBUG", "info", 1);
    th_spec_t spec = {
        .nranks = 4, .fn = rank_even, .arg = sh, .timeout_ms = 60000, .flags = TH_NO_COMM
    };
    int rc = th_run_ex(&spec, NULL);
    unsetenv("TUTTI_DEBUG");
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(sh->flag != 0, "no rank said it moved to the emptier CPU");
    ck_assert_int_eq(leftovers(sh, 4), 0);
}
END_TEST

/* Ranks pinned each to a CPU of its own (as mpirun --bind-to core does) are not more
 * ranks than CPUs: they spin on the CPU before they yield, and the default ("auto")
 * spin is the long one. Ranks pinned to one CPU are more ranks than CPUs: the short
 * spin. Each rank pins itself, then makes its communicator with TUTTI_DEBUG=info and
 * reads the shm transport's line and the spin's. */
static int pinned_one_cpu; /* 1: every rank on the first CPU (set before the fork) */
static int rank_pinned(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    shared_t *sh = enlist(arg, rank);
    cpu_set_t all;
    int cpu = pin_to_cpu(pinned_one_cpu ? 0 : rank, &all);
    FAIL_IF(cpu < 0, "pin to CPU number %d", pinned_one_cpu ? 0 : rank);
    log_capture_t cap;
    FAIL_IF(log_begin(&cap, dir, "pinned", rank) != 0, "stderr to a file");
    tutti_store_t *store = NULL;
    tutti_comm_t *comm = NULL;
    tutti_comm_opts_t o = shm_opts(20000);
    int st = tutti_store_open_file(&store, dir, 20000);
    if (st == TUTTI_OK)
        st = tutti_comm_init(&comm, store, rank, nranks, &o);
    int64_t x = rank + 1, y = 0;
    int ar = st == TUTTI_OK ? tutti_allreduce(comm, &x, &y, 1, TUTTI_INT64, TUTTI_SUM) : st;
    if (comm)
        tutti_comm_destroy(comm);
    if (store)
        tutti_store_close(store);
    char text[16384];
    FAIL_IF(log_end(&cap, text, sizeof(text)) != 0, "read back %s", cap.path);
    FAIL_IF(st != TUTTI_OK, "init on CPU %d: %s", cpu, tutti_status_name(st));
    FAIL_IF(ar != TUTTI_OK || y != (int64_t)nranks * (nranks + 1) / 2, "allreduce: %d, sum %lld",
            ar, (long long)y);
    const char *line = strstr(text, "shm: 1 local peers");
    FAIL_IF(!line, "no shm line in the log:\n%s", text);
    const char *eol = strchr(line, '\n');
    int over = strstr(line, "more ranks than CPUs") &&
               (!eol || strstr(line, "more ranks than CPUs") < eol);
    if (rank == 0)
        fprintf(stderr, "rank 0 pinned to CPU %d: %.*s\n", cpu,
                (int)(eol ? eol - line : (long)strlen(line)), line);
    if (over)
        sh->flag = 1;
    char want[96];
    snprintf(want, sizeof(want), "spin: %d us before blocking (2 ranks on this host, %d CPU",
             pinned_one_cpu ? 50 : 200, pinned_one_cpu ? 1 : 2);
    FAIL_IF(!strstr(text, want), "no \"%s\" in the log:\n%s", want, text);
    return 0;
}

START_TEST(pinned_ranks_spin)
{
    if (fewer_than_two_cpus("pinned_ranks_spin"))
        return;
    shared_t *sh = shared_area();
    setenv("TUTTI_DEBUG", "info", 1);
    th_spec_t spec = {
        .nranks = 2, .fn = rank_pinned, .arg = sh, .timeout_ms = 30000, .flags = TH_NO_COMM
    };
    int rc = th_run_ex(&spec, NULL);
    unsetenv("TUTTI_DEBUG");
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(sh->flag == 0,
                  "two ranks pinned to two CPUs were taken for more ranks than CPUs");
    ck_assert_int_eq(leftovers(sh, 2), 0);
}
END_TEST

START_TEST(pinned_to_one_cpu_spin_short)
{
    shared_t *sh = shared_area();
    setenv("TUTTI_DEBUG", "info", 1);
    pinned_one_cpu = 1;
    th_spec_t spec = {
        .nranks = 2, .fn = rank_pinned, .arg = sh, .timeout_ms = 30000, .flags = TH_NO_COMM
    };
    int rc = th_run_ex(&spec, NULL);
    pinned_one_cpu = 0;
    unsetenv("TUTTI_DEBUG");
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(sh->flag == 1, "two ranks pinned to one CPU were not taken for more ranks "
                                 "than CPUs");
    ck_assert_int_eq(leftovers(sh, 2), 0);
}
END_TEST

/* ---- a rank that destroys its communicator and lives on ---- */

/* This rank's communicator over shm on the harness's file store (TH_NO_COMM: the rank
 * destroys it itself), its timeout timeout_ms: NULL when it could not (said on stderr). */
static tutti_comm_t *own_comm(int rank, int nranks, const char *dir, int timeout_ms,
                              tutti_store_t **store_p)
{
    tutti_comm_opts_t o = shm_opts(timeout_ms);
    tutti_comm_t *comm = NULL;
    if (tutti_store_open_file(store_p, dir, 10000) != 0) {
        fprintf(stderr, "rank %d: store\n", rank);
        return NULL;
    }
    if (tutti_comm_init(&comm, *store_p, rank, nranks, &o) != 0) {
        fprintf(stderr, "rank %d: init: %s\n", rank, tutti_comm_last_error(NULL));
        tutti_store_close(*store_p);
        return NULL;
    }
    return comm;
}

/* Wait up to ms for *flag to be set by another rank: 1 if it was. */
static int wait_flag(const int *flag, int ms)
{
    for (double t0 = th_now_ms(); th_now_ms() - t0 < ms; th_sleep_ms(2))
        if (__atomic_load_n(flag, __ATOMIC_ACQUIRE))
            return 1;
    return 0;
}

/* Rank 0 destroys its communicator (after tutti_comm_abort where sh->arg says so) while
 * its process lives on; rank 1 waits for it in an allreduce with a 10 s timeout. Rank 1
 * fails within a second of the destroy, with TUTTI_ERR_PEER naming rank 0 and the close
 * (before, it waited out its timeout: "rank 0 shows no sign of being in this collective"
 * over shm, where tcp saw the connection close at once). */
static int rank_destroys_idle(int rank, int nranks, tutti_comm_t *unused, const char *dir,
                              void *arg)
{
    (void)unused;
    shared_t *sh = enlist(arg, rank);
    tutti_store_t *store;
    tutti_comm_t *comm = own_comm(rank, nranks, dir, 10000, &store);
    FAIL_IF(!comm, "no communicator");
    float v[4] = { 1, 2, 3, 4 };
    FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, v, 4, TUTTI_FP32, TUTTI_SUM) != 0, "warm-up: %s",
            tutti_comm_last_error(comm));
    if (rank == 0) {
        th_sleep_ms(300); /* rank 1 is asleep in its allreduce by now */
        if (sh->arg)
            tutti_comm_abort(comm);
        sh->stamp_ms = th_now_ms();
        __atomic_store_n(&sh->stamped, 1, __ATOMIC_RELEASE);
        tutti_comm_destroy(comm);
        /* alive, not gone: only the close can tell rank 1 */
        FAIL_IF(!wait_flag(&sh->flag, 20000), "rank 1 never finished");
    } else {
        int st = tutti_allreduce(comm, TUTTI_IN_PLACE, v, 4, TUTTI_FP32, TUTTI_SUM);
        double dt = __atomic_load_n(&sh->stamped, __ATOMIC_ACQUIRE) ? th_now_ms() - sh->stamp_ms
                                                                    : -1;
        const char *msg = tutti_comm_last_error(comm);
        __atomic_store_n(&sh->flag, 1, __ATOMIC_RELEASE);
        FAIL_IF(st != TUTTI_ERR_PEER, "got %s: %s", tutti_status_name(st), msg);
        FAIL_IF(!strstr(msg, "rank 0 ") || !strstr(msg, "destroyed its communicator"),
                "the failure does not name rank 0's close: %s", msg);
        FAIL_IF(dt < 0 || dt > 1000, "failed %.0f ms after rank 0's destroy (timeout 10 s): %s", dt,
                msg);
        tutti_comm_destroy(comm);
    }
    tutti_store_close(store);
    return 0;
}

START_TEST(peer_destroyed_fails_waiter_at_once)
{
    for (int abort = 0; abort <= 1; abort++) {
        shared_t *sh;
        int codes[2];
        int rc = run_shm(2, rank_destroys_idle, abort, -1, NULL, 30000,
                         TH_NO_COMM | TH_NO_KILL_ON_FAIL, codes, &sh);
        ck_assert_msg(rc == 0, "abort %d: ranks exited %d, %d", abort, codes[0], codes[1]);
        ck_assert_int_eq(leftovers(sh, 2), 0);
    }
}
END_TEST

/* The messages of destroy_after_sends: rank 0's k-th, byte i */
#define DS_BIG ((size_t)(4u << 20) + 3)
#define DS_BCAST 1000 /* int32: 4000 bytes, in the ring also with single copy at 16 KiB */
static const size_t ds_len[] = { DS_BIG, 24, 1, 9000 };

/* Rank 0 sends (a message larger than the ring, short ones, a broadcast as its root) and
 * destroys at once; rank 1 reads all but the first only after that destroy, and gets
 * every byte (checked against pattern()): what was in the ring is delivered before the
 * close is believed, as tcp delivers its buffered bytes before the end of the stream.
 * sh->arg 0: then both end, and neither logs a warning (a job that ends normally);
 * 1: rank 1's next receive from rank 0 then fails at once, naming the close. */
static int destroy_after_sends(int rank, int nranks, const char *dir, shared_t *sh)
{
    const size_t n = ARRAY_SIZE(ds_len);
    tutti_store_t *store;
    tutti_comm_t *comm = own_comm(rank, nranks, dir, 10000, &store);
    FAIL_IF(!comm, "no communicator");
    unsigned char *buf = malloc(DS_BIG);
    int32_t bc[DS_BCAST];
    FAIL_IF(!buf, "malloc");
    if (rank == 0) {
        for (size_t k = 0; k < n; k++) {
            for (size_t i = 0; i < ds_len[k]; i++)
                buf[i] = pattern(0, 1, i, (int)k);
            FAIL_IF(tutti_send(comm, buf, ds_len[k], TUTTI_UINT8, 1, (uint32_t)k) != 0,
                    "send %zu: %s", ds_len[k], tutti_comm_last_error(comm));
        }
        for (int i = 0; i < DS_BCAST; i++)
            bc[i] = i * 7 - 3;
        FAIL_IF(tutti_broadcast(comm, TUTTI_IN_PLACE, bc, DS_BCAST, TUTTI_INT32, 0) != 0,
                "broadcast: %s", tutti_comm_last_error(comm));
        FAIL_IF(tutti_comm_destroy(comm) != 0, "destroy");
        sh->stamp_ms = th_now_ms();
        __atomic_store_n(&sh->stamped, 1, __ATOMIC_RELEASE);
        FAIL_IF(!wait_flag(&sh->flag, 20000), "rank 1 never finished");
    } else {
        for (size_t k = 0; k < n; k++) {
            if (k == 1) /* the rest is read after the close */
                FAIL_IF(!wait_flag(&sh->stamped, 10000), "rank 0 did not destroy its communicator");
            memset(buf, 0xEE, ds_len[k]);
            int st = tutti_recv(comm, buf, ds_len[k], TUTTI_UINT8, 0, (uint32_t)k);
            FAIL_IF(st != 0, "recv %zu: %s", ds_len[k], tutti_comm_last_error(comm));
            for (size_t i = 0; i < ds_len[k]; i++)
                FAIL_IF(buf[i] != pattern(0, 1, i, (int)k), "%zu bytes: byte %zu is %u", ds_len[k],
                        i, buf[i]);
        }
        memset(bc, 0, sizeof(bc));
        FAIL_IF(tutti_broadcast(comm, TUTTI_IN_PLACE, bc, DS_BCAST, TUTTI_INT32, 0) != 0,
                "broadcast: %s", tutti_comm_last_error(comm));
        for (int i = 0; i < DS_BCAST; i++)
            FAIL_IF(bc[i] != i * 7 - 3, "broadcast [%d] = %d", i, bc[i]);
        if (sh->arg) {
            double t0 = th_now_ms();
            int st = tutti_recv(comm, buf, 8, TUTTI_UINT8, 0, 99);
            double dt = th_now_ms() - t0;
            const char *msg = tutti_comm_last_error(comm);
            FAIL_IF(st != TUTTI_ERR_PEER || !strstr(msg, "destroyed its communicator"),
                    "a receive after the data: %s: %s", tutti_status_name(st), msg);
            FAIL_IF(dt > 1000, "a receive after the data failed after %.0f ms", dt);
        }
        tutti_comm_destroy(comm);
        __atomic_store_n(&sh->flag, 1, __ATOMIC_RELEASE);
    }
    free(buf);
    tutti_store_close(store);
    return 0;
}

static int rank_destroy_after_sends(int rank, int nranks, tutti_comm_t *unused, const char *dir,
                                    void *arg)
{
    (void)unused;
    shared_t *sh = enlist(arg, rank);
    log_capture_t cap;
    char text[8192];
    FAIL_IF(log_begin(&cap, dir, "destroy", rank) != 0, "stderr to a file");
    int rc = destroy_after_sends(rank, nranks, dir, sh);
    FAIL_IF(log_end(&cap, text, sizeof(text)) != 0, "read back %s", cap.path);
    if (rc || sh->arg)
        fputs(text, stderr);
    FAIL_IF(rc == 0 && !sh->arg && (strstr(text, "WARN") || strstr(text, "ERROR")),
            "a job that ended normally logged the above");
    return rc;
}

START_TEST(peer_destroyed_after_sends_delivers_first)
{
    for (int cma = 0; cma <= 1; cma++)
        for (int then_recv = 0; then_recv <= 1; then_recv++) {
            shared_t *sh;
            int codes[2];
            int rc = run_shm(2, rank_destroy_after_sends, then_recv, cma, NULL, 30000,
                             TH_NO_COMM | TH_NO_KILL_ON_FAIL, codes, &sh);
            ck_assert_msg(rc == 0, "single copy %d, receive after %d: ranks exited %d, %d", cma,
                          then_recv, codes[0], codes[1]);
            ck_assert_int_eq(leftovers(sh, 2), 0);
        }
}
END_TEST

/* A probe finds a message its peer sent just before destroying its transport (an
 * MPI_Probe, or a receive from any source, that polls while the peer sends and leaves).
 * Both ranks run on one CPU, so that rank 0's send and destroy run while rank 1 is
 * preempted at some point of its probe loop: a probe that read the ring (nothing yet)
 * and then the peer's `closed` flag failed the link, the message unread
 * (link_more_to_read took "no receive posted" for "nothing to read"): 10 runs of 10
 * failed so, 8 of them in their first round. Rank 1 then receives the message; one more
 * receive fails at once, naming the close. Each round on transports of its own
 * (sh->arg rounds). */
static int rank_tp_probe_close(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)comm;
    shared_t *sh = arg;
    const tutti_transport_ops_v2_t *ops = tt_builtin_transport_shm();
    cpu_set_t all, one;
    FAIL_IF(sched_getaffinity(0, sizeof(all), &all) != 0, "sched_getaffinity");
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all)) {
            CPU_SET(c, &one); /* the first CPU this process may use, the same for both */
            break;
        }
    setenv("TUTTI_BIND", "none", 1); /* the transport leaves the thread where it is */
    for (int round = 0; round < sh->arg; round++) {
        char prefix[32], bar[32];
        snprintf(prefix, sizeof(prefix), "pc%d/", round);
        th_host_t t;
        void *tp = tp_open(&t, arg, dir, prefix, rank, nranks, NULL);
        FAIL_IF(!tp, "round %d: create: %s", round, t.err);
        snprintf(bar, sizeof(bar), "pc%d", round);
        store_barrier(&t, bar, nranks);
        FAIL_IF(sched_setaffinity(0, sizeof(one), &one) != 0, "sched_setaffinity");
        uint64_t v = 0x5eed0000u + (uint64_t)round, got = 0;
        tutti_tp_req_v2_t r;
        const uint64_t tag = (1ull << 63) | 7; /* channel 1: what a probe looks for */
        if (rank == 0) {
            /* once rank 1 polls: wakes up at some point of its loop, on its CPU */
            while (!__atomic_load_n(&sh->flag, __ATOMIC_ACQUIRE))
                usleep(200);
            req_set(&r, 1, &v, sizeof(v), 1, tag);
            FAIL_IF(ops->post_send(tp, &r) != 0, "round %d: post_send", round);
            drive(tp, &r, 5000);
            FAIL_IF(r.status != 0, "round %d: send: %d", round, r.status);
            ops->destroy(tp); /* at once: rank 1 may be inside a probe */
            snprintf(bar, sizeof(bar), "pc%d-end", round);
            FAIL_IF(sched_setaffinity(0, sizeof(all), &all) != 0, "sched_setaffinity");
            store_barrier(&t, bar, nranks);
        } else {
            tutti_tp_probe_t m;
            int st;
            double end = th_now_ms() + 10000;
            do {
                memset(&m, 0, sizeof(m));
                st = ops->probe(tp, 0, &m);
                __atomic_store_n(&sh->flag, 1, __ATOMIC_RELEASE);
            } while (st == 0 && th_now_ms() < end);
            FAIL_IF(st != 1 || m.len != sizeof(v),
                    "round %d: a probe for the message rank 0 sent before its destroy: %d, "
                    "%zu bytes: %s",
                    round, st, m.len, t.err);
            req_set(&r, 0, &got, sizeof(got), 1, tag);
            FAIL_IF(ops->post_recv(tp, &r) != 0, "round %d: post_recv: %s", round, t.err);
            drive(tp, &r, 5000);
            FAIL_IF(r.status != 0 || got != v, "round %d: receive: %d, 0x%llx", round, r.status,
                    (unsigned long long)got);
            req_set(&r, 0, &got, sizeof(got), 2, tag);
            if (ops->post_recv(tp, &r) == 0)
                drive(tp, &r, 5000);
            FAIL_IF(r.status != TUTTI_ERR_PEER || !strstr(t.err, "destroyed its communicator"),
                    "round %d: a receive after the message: %d: %s", round, r.status, t.err);
            __atomic_store_n(&sh->flag, 0, __ATOMIC_RELEASE);
            FAIL_IF(sched_setaffinity(0, sizeof(all), &all) != 0, "sched_setaffinity");
            snprintf(bar, sizeof(bar), "pc%d-end", round);
            store_barrier(&t, bar, nranks);
            ops->destroy(tp);
        }
        th_host_close(&t);
    }
    return 0;
}

START_TEST(abi_probe_finds_message_sent_before_close)
{
    shared_t *sh;
    int codes[2];
    int rc = run_shm(2, rank_tp_probe_close, 40, -1, NULL, 60000, TH_NO_COMM, codes, &sh);
    ck_assert_msg(rc == 0, "ranks exited %d, %d", codes[0], codes[1]);
    ck_assert_int_eq(leftovers(sh, 2), 0);
}
END_TEST

/* A long TUTTI_SPIN_US does not stretch a wait past its timeout: rank 0 waits for a
 * message rank 1 never sends, spinning up to 8 s per progress call with a timeout of 1
 * s. (The spin once ignored the caller's deadline: about 8 s.) */
static int rank_long_spin(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    (void)arg;
    tutti_store_t *store;
    FAIL_IF(tutti_store_open_file(&store, dir, 10000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.transport = "shm";
    o.timeout_ms = 1000;
    o.spin_us = 8000000;
    tutti_comm_t *comm = NULL;
    FAIL_IF(tutti_comm_init(&comm, store, rank, nranks, &o) != 0, "init");
    int rc = 0;
    if (rank == 0) {
        int32_t v = 0;
        double t0 = th_now_ms();
        int st = tutti_recv(comm, &v, 1, TUTTI_INT32, 1, 7);
        double took = th_now_ms() - t0;
        if (st != TUTTI_ERR_TIMEOUT) {
            fprintf(stderr, "recv: %s, wanted TUTTI_ERR_TIMEOUT\n", tutti_status_name(st));
            rc = 1;
        } else if (took > 1000 + 1500) {
            fprintf(stderr, "recv gave up after %.0f ms with a timeout of 1000\n", took);
            rc = 1;
        }
    } else {
        th_sleep_ms(5000); /* alive, silent, until rank 0 has given up */
    }
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return rc;
}

START_TEST(long_spin_keeps_the_timeout)
{
    ck_assert_int_eq(th_run_nocomm(2, rank_long_spin, NULL, 30000), 0);
}
END_TEST

/* ---- the receive path on a ring in this process (shm_recv_fuzz_input) ---- */

static char ring_err[512];

static void ring_log(void *ctx, int level, const char *fmt, ...)
{
    (void)ctx;
    (void)level;
    (void)fmt;
}

static int ring_error(void *ctx, int status, int peer, int err_no, const char *fmt, ...)
{
    (void)ctx;
    (void)peer;
    (void)err_no;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ring_err, sizeof(ring_err), fmt, ap);
    va_end(ap);
    return status;
}

typedef struct ring_peer {
    shm_dir_t *dir;
    uint64_t head; /* published once, then done; 0: never */
} ring_peer_t;

static int ring_publish(void *ctx)
{
    ring_peer_t *p = ctx;
    if (!p->head)
        return 0;
    atomic_store(&p->dir->head, p->head);
    p->head = 0;
    return 1;
}

enum { RING_CAP = 4096 };
#define RING_KEY 0x5a17c0ffee123457ull

/* The ring the ring tests hand to shm_recv_fuzz_input, and its direction. */
static _Alignas(64) unsigned char ring_mem[RING_CAP];
static shm_dir_t ring_dir;

/* An empty ring at stream position pos: stale bytes (not zeros), head and tail at pos. */
static unsigned char *ring_reset(uint64_t pos)
{
    memset(ring_mem, 0xa5, sizeof(ring_mem));
    memset(&ring_dir, 0, sizeof(ring_dir));
    ring_dir.key = RING_KEY;
    atomic_store(&ring_dir.head, pos);
    atomic_store(&ring_dir.tail, pos);
    return ring_mem;
}

/* Receive r (from rank 1, expecting envelope {1, 2, 3, 4}) from the ring read from pos on,
 * the head published at `head` (0: never); r's status. */
static int ring_sweep(uint64_t pos, uint64_t head, tp_req_t *r)
{
    tutti_tp_host_v1_t host = { .size = sizeof(host),
                                .abi_version = TUTTI_TRANSPORT_ABI_V1,
                                .rank = 0,
                                .nranks = 2,
                                .timeout_ms = 1000,
                                .log = ring_log,
                                .error = ring_error };
    r->peer = 1;
    for (int k = 0; k < 4; k++)
        r->env[k] = (uint64_t)k + 1;
    ring_err[0] = '\0';
    ring_peer_t peer = { .dir = &ring_dir, .head = head };
    ck_assert_int_eq(shm_recv_fuzz_input(&host, &ring_dir, ring_mem, RING_CAP, 65536, pos, r, 1,
                                         ring_publish, &peer),
                     0);
    return r->status;
}

/* One 5-byte record at stream position pos, stamped `stamp`, flagged whole; a receive
 * for it is posted and the ring swept (the head published at `head`, 0: never). The
 * receive's status, its buffer in got. */
static int ring_receive(uint64_t pos, uint64_t stamp, uint64_t head, char got[6])
{
    unsigned char *ring = ring_reset(pos);
    shm_hdr_t h;
    memset(&h, 0, sizeof(h));
    h.magic = SHM_REC_MAGIC;
    h.type = SHM_REC_INLINE;
    h.flags = SHM_HDR_WHOLE;
    h.len = 5;
    for (int k = 0; k < 4; k++)
        h.env[k] = (uint64_t)k + 1;
    atomic_store(&h.stamp, stamp);
    unsigned char *rec = ring + (pos & (RING_CAP - 1));
    memcpy(rec, &h, sizeof(h));
    memcpy(rec + SHM_HDR_BYTES, "hello", 5);
    tp_req_t r;
    memset(&r, 0, sizeof(r));
    memset(got, 0, 6);
    r.len = 5;
    r.buf = got;
    return ring_sweep(pos, head, &r);
}

START_TEST(ring_record_found_by_its_stamp)
{
    char got[6];
    /* no head published: the stamp alone delivers a whole record (at a later lap too) */
    for (uint64_t pos = 0; pos <= 3 * RING_CAP; pos += RING_CAP + 192) {
        ck_assert_int_eq(ring_receive(pos, pos ^ RING_KEY, 0, got), 0);
        ck_assert_str_eq(got, "hello");
    }
    /* a stamp from the lap before: not this record, nothing is taken (the receive is
     * cancelled when the sweeps end), and no error */
    uint64_t pos = 2 * RING_CAP + 128;
    ck_assert_int_eq(ring_receive(pos, (pos - RING_CAP) ^ RING_KEY, 0, got), TUTTI_ERR_ABORTED);
    ck_assert_str_eq(got, "");
    ck_assert_str_eq(ring_err, "");
    /* a stamp without the key (the position alone) is not one either */
    ck_assert_int_eq(ring_receive(pos, pos, 0, got), TUTTI_ERR_ABORTED);
    /* the same stale stamp with the head past it: garbage, named */
    ck_assert_int_eq(ring_receive(pos, (pos - RING_CAP) ^ RING_KEY, pos + 64, got),
                     TUTTI_ERR_PROTOCOL);
    ck_assert_str_eq(got, "");
    ck_assert_msg(strstr(ring_err, "carries stamp") && strstr(ring_err, "rank 1"), "error: %s",
                  ring_err);
}
END_TEST

/* A short record (shm_short_t) of len bytes at stream position pos, carrying envelope
 * renv in its second line and `digest` in its first, payload bytes 100 + i; a receive of
 * rlen bytes expecting envelope {1, 2, 3, 4} is posted into got (filled with 0xEE) and
 * the ring swept. Returns the receive's status; *r is the receive. */
static int ring_receive_short(uint64_t pos, uint32_t len, const uint64_t renv[4], uint64_t digest,
                              size_t rlen, unsigned char got[64], tp_req_t *r)
{
    unsigned char *ring = ring_reset(pos);
    shm_short_t h;
    memset(&h, 0, sizeof(h));
    h.magic = SHM_REC_MAGIC;
    h.type = SHM_REC_SHORT;
    h.len = len;
    h.digest = digest;
    unsigned char pay[SHM_SHORT_MAX + 8];
    for (size_t i = 0; i < sizeof(pay); i++)
        pay[i] = (unsigned char)(100 + i);
    memcpy(h.lo, pay, SHM_SHORT_LO);
    memcpy(h.hi, pay + SHM_SHORT_LO, sizeof(h.hi));
    atomic_store(&h.stamp, pos ^ RING_KEY);
    memcpy(ring + (pos & (RING_CAP - 1)), &h, sizeof(h));
    memcpy(ring + ((pos + SHM_LINE) & (RING_CAP - 1)), renv, 4 * sizeof(uint64_t));
    memset(r, 0, sizeof(*r));
    memset(got, 0xEE, 64);
    r->len = rlen;
    r->buf = got + 1;
    return ring_sweep(pos, 0, r);
}

START_TEST(ring_short_record)
{
    const uint64_t env[4] = { 1, 2, 3, 4 };
    unsigned char got[64];
    tp_req_t r;
    /* every length a short record takes, at a position whose second line wraps to the
     * ring's start too: delivered from the first line, nothing written past it */
    for (uint32_t len = SHM_INLINE_ONE_LINE + 1; len <= SHM_SHORT_MAX; len++) {
        for (uint64_t pos = 128; pos <= 2 * RING_CAP; pos += 2 * RING_CAP - 64 - 128) {
            ck_assert_int_eq(ring_receive_short(pos, len, env, shm_env_digest(env), len, got, &r),
                             0);
            ck_assert_str_eq(ring_err, "");
            ck_assert_uint_eq(r.xfer, len);
            ck_assert_int_eq(got[0], 0xEE);
            for (uint32_t i = 0; i < len; i++)
                ck_assert_int_eq(got[1 + i], (unsigned char)(100 + i));
            for (size_t i = 1 + len; i < sizeof(got); i++)
                ck_assert_int_eq(got[i], 0xEE);
            ck_assert(memcmp(r.got_env, env, sizeof(env)) == 0);
        }
    }
    /* another call's envelope (its own digest): a mismatch, which names the envelope the
     * second line carries */
    const uint64_t other[4] = { 1, 2, 9, 4 };
    ck_assert_int_eq(ring_receive_short(256, 16, other, shm_env_digest(other), 16, got, &r),
                     TUTTI_ERR_MISMATCH);
    ck_assert(memcmp(r.got_env, other, sizeof(other)) == 0);
    ck_assert_uint_eq(r.got_len, 16);
    ck_assert_int_eq(got[1], 0xEE);
    /* the right envelope but another length: a mismatch too */
    ck_assert_int_eq(ring_receive_short(256, 16, env, shm_env_digest(env), 24, got, &r),
                     TUTTI_ERR_MISMATCH);
    ck_assert_uint_eq(r.got_len, 16);
    /* a digest that is not its envelope's: garbage, named */
    ck_assert_int_eq(ring_receive_short(256, 16, env, shm_env_digest(other), 16, got, &r),
                     TUTTI_ERR_PROTOCOL);
    ck_assert_msg(strstr(ring_err, "digest") && strstr(ring_err, "rank 1"), "error: %s", ring_err);
    ck_assert_int_eq(got[1], 0xEE);
    /* lengths a short record never has (one line holds them, or they do not fit) */
    const uint32_t bad[] = { 0, SHM_INLINE_ONE_LINE, SHM_SHORT_MAX + 1, 1u << 31 };
    for (size_t k = 0; k < ARRAY_SIZE(bad); k++) {
        ck_assert_int_eq(ring_receive_short(256, bad[k], env, shm_env_digest(env), 16, got, &r),
                         TUTTI_ERR_PROTOCOL);
        ck_assert_msg(strstr(ring_err, "garbage"), "error: %s", ring_err);
        ck_assert_int_eq(got[1], 0xEE);
    }
}
END_TEST

/* The digest: envelopes that differ in any one word differ in it (each word goes
 * through a bijection), and in a sample of neighbours in two words. */
START_TEST(short_digest_tells_envelopes_apart)
{
    uint64_t base[4] = { 7, 0x0300000100000000ull, 16, (3ull << 32) | 1 };
    uint64_t d0 = shm_env_digest(base);
    for (int w = 0; w < 4; w++)
        for (int bit = 0; bit < 64; bit++) {
            uint64_t e[4] = { base[0], base[1], base[2], base[3] };
            e[w] ^= 1ull << bit;
            ck_assert_msg(shm_env_digest(e) != d0, "word %d bit %d", w, bit);
            for (int w2 = w + 1; w2 < 4; w2++) {
                e[w2] += 1;
                ck_assert_msg(shm_env_digest(e) != d0, "words %d, %d", w, w2);
                e[w2] -= 1;
            }
        }
}
END_TEST

/* ---- rings reserved at a pair's first use ---- */

/* KiB in use in /dev/shm (a tmpfs of the case's own, in_own_shm) */
static long shm_used_kib(void)
{
    struct statvfs sv;
    return statvfs("/dev/shm", &sv) == 0 ? (long)((sv.f_blocks - sv.f_bfree) * sv.f_frsize / 1024)
                                         : -1;
}

/* Rings of 64 KiB (a pair's two: 128 KiB), reserved the way sh->arg says: 1 madvise, 2
 * fallocate. */
static const char *reserve_knobs(const void *sh)
{
    /* at first use: a tmpfs this small (under 1 GiB) would have them reserved in set-up */
    return ((const shared_t *)sh)->arg == 1
               ? "SHM_RING_BYTES=64K,SHM_RESERVE=madvise,SHM_RESERVE_AT=first-use"
               : "SHM_RING_BYTES=64K,SHM_RESERVE=fallocate,SHM_RESERVE_AT=first-use";
}

static void *tp_open_knobs(th_host_t *t, void *sh, const char *dir, int rank, int nranks)
{
    void *tp = NULL;
    enlist(sh, rank);
    if (th_host_open(t, dir, "rs/", rank, nranks, 10000) != 0)
        return NULL;
    t->knobs = reserve_knobs(sh);
    if (tt_builtin_transport_shm()->create(&t->h, &tp) != 0)
        return NULL;
    return tp;
}

/* Send 64 bytes (pattern k) to peer, or receive them from it and check them. */
static int move64(const tutti_transport_ops_v2_t *ops, void *tp, int send, int peer, uint64_t seq,
                  int k)
{
    unsigned char buf[64];
    for (int i = 0; i < 64; i++)
        buf[i] = send ? (unsigned char)(i * 7 + k) : 0;
    tutti_tp_req_v2_t r;
    req_set(&r, peer, buf, 64, seq, 1 | 1ull << 63); /* channel 1: what probe reports */
    int st = send ? ops->post_send(tp, &r) : ops->post_recv(tp, &r);
    if (st < 0)
        return st;
    drive(tp, &r, 5000);
    if (r.status)
        return r.status;
    for (int i = 0; !send && i < 64; i++)
        if (buf[i] != (unsigned char)(i * 7 + k))
            return 99;
    return 0;
}

/* A pair's rings are reserved in /dev/shm at its first use, not at set-up (a job uses
 * few of its n(n-1)/2 pairs unless it exchanges with every rank: 64 ranks took 2 GiB and
 * 5.3 s to set up here, 1.2 s now). TUTTI_SHM_RESERVE=yes fails create. After set-up /dev/shm holds less than one pair's
 * rings; a message from 0 to 1 reserves their pair's (128 KiB) and nothing else; rank
 * 2's probe for a message from rank 0 finds none and reserves nothing, then finds it once
 * rank 0 sent it, and the receive gets it right. Rank 0 measures between barriers. */
static int rank_tp_lazy(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)comm;
    const tutti_transport_ops_v2_t *ops = tt_builtin_transport_shm();
    th_host_t t;
    void *bad = NULL; /* a value that names no way fails create, naming it */
    FAIL_IF(th_host_open(&t, dir, "bad/", rank, nranks, 10000) != 0, "host: %s", t.err);
    t.knobs = "SHM_RESERVE=yes";
    FAIL_IF(ops->create(&t.h, &bad) != TUTTI_ERR_CONFIG ||
                !strstr(t.err, "TUTTI_SHM_RESERVE=\"yes\" is none of auto, madvise, fallocate"),
            "SHM_RESERVE=yes: %s", t.err);
    th_host_close(&t);
    shm_tp_t *tp = tp_open_knobs(&t, arg, dir, rank, nranks);
    FAIL_IF(!tp, "create: %s", t.err);
    for (int p = 0; p < nranks; p++)
        FAIL_IF(p != rank && tp->links[p].active, "rank %d: link to %d active at set-up", rank, p);
    store_barrier(&t, "up", nranks);
    long u0 = shm_used_kib();
    FAIL_IF(rank == 0 && (u0 < 0 || u0 >= 128), "%ld KiB in use after set-up", u0);
    store_barrier(&t, "measured", nranks);
    if (rank < 2)
        FAIL_IF(move64(ops, tp, rank == 0, 1 - rank, 1, 1), "0 -> 1: %s", t.err);
    store_barrier(&t, "sent", nranks);
    long u1 = shm_used_kib();
    FAIL_IF(rank == 0 && (u1 - u0 < 128 || u1 - u0 >= 256), "0 -> 1 took %ld KiB (%ld -> %ld)",
            u1 - u0, u0, u1);
    FAIL_IF(rank < 2 && (!tp->links[1 - rank].active || tp->links[2].active),
            "rank %d: links to %d and 2 active %d %d", rank, 1 - rank, tp->links[1 - rank].active,
            tp->links[2].active);
    tutti_tp_probe_t m;
    if (rank == 2) {
        FAIL_IF(tp->links[0].active || tp->links[1].active, "rank 2: a link active");
        FAIL_IF(ops->probe(tp, 0, &m) != 0, "a message from rank 0 before it sent one");
        FAIL_IF(ops->progress(tp, 0) < 0, "progress: %s", t.err);
        FAIL_IF(tp->links[0].active, "rank 2: the probe made the link to 0 active");
    }
    store_barrier(&t, "probed", nranks);
    long u2 = shm_used_kib();
    FAIL_IF(rank == 0 && u2 != u1, "the probe took %ld KiB", u2 - u1);
    store_barrier(&t, "measured2", nranks);
    if (rank == 0)
        FAIL_IF(move64(ops, tp, 1, 2, 1, 2), "0 -> 2: %s", t.err);
    if (rank == 2) {
        int st = 0;
        for (double end = th_now_ms() + 5000;
             (st = ops->probe(tp, 0, &m)) == 0 && th_now_ms() < end;)
            ops->progress(tp, 10);
        FAIL_IF(st != 1 || m.len != 64, "probe for rank 0's message: %d, %zu bytes", st, m.len);
        FAIL_IF(!tp->links[0].active, "rank 2: found a message on an inactive link");
        FAIL_IF(move64(ops, tp, 0, 0, 1, 2), "0 -> 2: %s", t.err);
        FAIL_IF(tp->links[1].active, "rank 2: the link to 1 active");
    }
    store_barrier(&t, "sent2", nranks);
    long u3 = shm_used_kib();
    if (rank == 0)
        fprintf(stderr, "in use: %ld, %ld, %ld, %ld KiB\n", u0, u1, u2, u3);
    FAIL_IF(rank == 0 && (u3 - u2 < 128 || u3 - u2 >= 256), "0 -> 2 took %ld KiB", u3 - u2);
    store_barrier(&t, "done", nranks); /* none goes (and unmaps) before rank 0 measured */
    ops->destroy(tp);
    th_host_close(&t);
    return 0;
}

/* /dev/shm filled up after set-up (room_check passed: 3 ranks' rings of 64 KiB, 0.4 MiB,
 * in a 4 MiB tmpfs, not a quarter of it: reserved at first use): the first message on a pair fails on both ends with
 * TUTTI_ERR_NOMEM naming the peer and /dev/shm's room, no SIGBUS; with room again the
 * same link carries it. */
static int rank_tp_full(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)comm;
    const tutti_transport_ops_v2_t *ops = tt_builtin_transport_shm();
    th_host_t t;
    void *tp = tp_open_knobs(&t, arg, dir, rank, nranks);
    FAIL_IF(!tp, "create: %s", t.err);
    store_barrier(&t, "up", nranks);
    const char *filler = "/dev/shm/tt-test-filler";
    if (rank == 0) {
        int fd = open(filler, O_CREAT | O_WRONLY | O_TRUNC, 0600);
        FAIL_IF(fd < 0, "%s: %s", filler, strerror(errno));
        static char chunk[4096];
        while (write(fd, chunk, sizeof(chunk)) == (ssize_t)sizeof(chunk))
            ;
        close(fd);
    }
    store_barrier(&t, "full", nranks);
    if (rank < 2) {
        int st = move64(ops, tp, rank == 0, 1 - rank, 1, 3);
        fprintf(stderr, "rank %d, /dev/shm full (%s): %d: %s\n", rank, reserve_knobs(arg), st,
                t.err);
        FAIL_IF(st != TUTTI_ERR_NOMEM || t.err_peer != 1 - rank, "full: %d, peer %d: %s", st,
                t.err_peer, t.err);
        char want[64];
        snprintf(want, sizeof(want), "rings shared with rank %d", 1 - rank);
        /* next to nothing free, in bytes or KiB (not "0.0 MiB") */
        FAIL_IF(!strstr(t.err, want) ||
                    (!strstr(t.err, " bytes of 4.0 MiB free") &&
                     !strstr(t.err, " KiB of 4.0 MiB free")) ||
                    !strstr(t.err, "enlarge it"),
                "full: %s", t.err);
    }
    store_barrier(&t, "failed", nranks);
    if (rank == 0)
        unlink(filler);
    store_barrier(&t, "room", nranks);
    if (rank < 2)
        FAIL_IF(move64(ops, tp, rank == 0, 1 - rank, 1, 3), "with room: %s", t.err);
    store_barrier(&t, "done", nranks);
    ops->destroy(tp);
    th_host_close(&t);
    return 0;
}

/* fn on 3 ranks reserving as `mode` says (1 madvise, 2 fallocate), in a tmpfs of `size`
 * over /dev/shm in a mount namespace of a child (root only; skipped with a message
 * where not permitted, or where this kernel has no MADV_POPULATE_WRITE for mode 1). */
static void in_own_shm(const char *size, th_rank_fn fn, int mode)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        alarm(60);
        char opts[32];
        snprintf(opts, sizeof(opts), "size=%s", size);
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
            mount("tmpfs", "/dev/shm", "tmpfs", 0, opts) < 0) {
            fprintf(stderr, "skipped: cannot mount a tmpfs (%s)\n", strerror(errno));
            _exit(77);
        }
        shared_t *sh;
        int codes[3];
        int rc = run_shm(3, fn, mode, -1, NULL, 30000, TH_NO_COMM | TH_NO_KILL_ON_FAIL, codes, &sh);
        _exit(rc ? 1 : leftovers(sh, 3) ? 2 : 0);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 77),
                  "mode %d: child: status 0x%x", mode, status);
}

/* A second transport in the same processes counts the rings the first promised (set up,
 * not reserved; /dev/shm does not show them): rings of 128 KiB, 3 ranks, 0.8 MiB of
 * rings a transport, in 3.5 MiB free. The first finds its need under a quarter of the
 * room and reserves nothing yet; the second finds it over a quarter of what is left once
 * the first's promise is taken off, and reserves every pair's rings in set-up (as before
 * session 93, so that a /dev/shm without room fails init, not a first message). The
 * tmpfs is 1 GiB and a bit, a filler taking all but 3.5 MiB of it: under 1 GiB in all,
 * `auto` reserves in set-up whatever the need (room_check). */
static int rank_tp_second(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)comm;
    const tutti_transport_ops_v2_t *ops = tt_builtin_transport_shm();
    th_host_t t1, t2;
    void *tp1 = NULL, *tp2 = NULL;
    const char *filler = "/dev/shm/tt-test-filler";
    if (rank == 0) {
        struct statvfs sv;
        FAIL_IF(statvfs("/dev/shm", &sv) < 0, "statvfs");
        off_t len = (off_t)(sv.f_bavail * sv.f_frsize) - (3584 << 10);
        int fd = open(filler, O_CREAT | O_WRONLY | O_TRUNC, 0600);
        FAIL_IF(fd < 0 || len <= 0 || posix_fallocate(fd, 0, len) != 0, "%s: %s", filler,
                strerror(errno));
        close(fd);
    }
    enlist(arg, rank);
    const char *knobs = ((shared_t *)arg)->arg == 1 ? "SHM_RING_BYTES=128K,SHM_RESERVE=madvise"
                                                    : "SHM_RING_BYTES=128K,SHM_RESERVE=fallocate";
    FAIL_IF(th_host_open(&t1, dir, "s1/", rank, nranks, 10000) != 0, "host: %s", t1.err);
    t1.knobs = knobs;
    FAIL_IF(ops->create(&t1.h, &tp1) != 0, "create 1: %s", t1.err);
    store_barrier(&t1, "one", nranks);
    struct stat fs;
    FAIL_IF(stat(filler, &fs) < 0, "%s", filler);
    long u0 = shm_used_kib() - (long)(fs.st_blocks / 2); /* besides the filler */
    FAIL_IF(((shm_tp_t *)tp1)->eager || u0 >= 256, "first: eager %d, %ld KiB in use",
            ((shm_tp_t *)tp1)->eager, u0);
    store_barrier(&t1, "measured", nranks);
    FAIL_IF(th_host_open(&t2, dir, "s2/", rank, nranks, 10000) != 0, "host: %s", t2.err);
    t2.knobs = knobs;
    FAIL_IF(ops->create(&t2.h, &tp2) != 0, "create 2: %s", t2.err);
    store_barrier(&t1, "two", nranks);
    long u1 = shm_used_kib() - (long)(fs.st_blocks / 2);
    const shm_tp_t *s2 = tp2;
    FAIL_IF(!s2->eager || u1 - u0 < 3 * 256, "second: eager %d, %ld KiB more in use", s2->eager,
            u1 - u0);
    for (int p = 0; p < nranks; p++)
        FAIL_IF(p != rank && (!s2->links[p].active || ((shm_tp_t *)tp1)->links[p].active),
                "rank %d: link to %d: first active %d, second %d", rank, p,
                ((shm_tp_t *)tp1)->links[p].active, s2->links[p].active);
    store_barrier(&t1, "done", nranks);
    ops->destroy(tp2);
    ops->destroy(tp1);
    th_host_close(&t2);
    th_host_close(&t1);
    if (rank == 0)
        unlink(filler);
    return 0;
}

/* Bad TUTTI_SHM_* values act as unset, and the warning says what is used: a ring size
 * that is not one is auto (it was 1 MiB, and ring_fit's shrinking to /dev/shm's room
 * was off), a hint size auto (the warning said 18446744073709551615), a liveness period
 * of 0 the default 100 ms (it silently became 1 ms). */
static int rank_tp_bad_knobs(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)comm;
    (void)arg;
    const tutti_transport_ops_v2_t *ops = tt_builtin_transport_shm();
    th_host_t t;
    void *tp = NULL;
    FAIL_IF(th_host_open(&t, dir, "knobs/", rank, nranks, 10000) != 0, "host: %s", t.err);
    t.knobs = "SHM_RING_BYTES=garbage,SHM_CMA_HINT_BYTES=lots,SHM_LIVENESS_MS=0";
    t.h.req_size = sizeof(tutti_tp_req_v2_t); /* a library that posts hints */
    log_capture_t cap;
    FAIL_IF(log_begin(&cap, dir, "knobs", rank) != 0, "stderr to a file");
    int st = ops->create(&t.h, &tp);
    char text[4096];
    FAIL_IF(log_end(&cap, text, sizeof(text)) != 0, "read back %s", cap.path);
    fputs(text, stderr);
    FAIL_IF(st != 0, "create: %s", t.err);
    const shm_tp_t *s = tp;
    FAIL_IF(!s->ring_auto, "SHM_RING_BYTES=garbage: not auto (rings of %zu)", s->ring_bytes);
    FAIL_IF(s->ring_bytes > (1u << 20), "SHM_RING_BYTES=garbage: rings of %zu", s->ring_bytes);
    FAIL_IF(!strstr(text, "TUTTI_SHM_RING_BYTES=garbage is not a size") ||
                !strstr(text, "TUTTI_SHM_CMA_HINT_BYTES=lots is not a size (digits, then K, M or "
                              "G; at most 1T); using auto"),
            "warnings: %s", text);
    FAIL_IF(s->liveness_ms != 100 || !strstr(text, "TUTTI_SHM_LIVENESS_MS=0: the peers' liveness "
                                                   "is always checked; using 100"),
            "SHM_LIVENESS_MS=0: every %d ms", s->liveness_ms);
    store_barrier(&t, "made", nranks);
    ops->destroy(tp);
    th_host_close(&t);
    return 0;
}

START_TEST(abi_bad_knobs_are_unset)
{
    shared_t *sh;
    int rc = run_shm(2, rank_tp_bad_knobs, 0, 0, NULL, 30000, TH_NO_COMM, NULL, &sh);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(leftovers(sh, 2), 0);
}
END_TEST

START_TEST(abi_rings_second_transport_counts_the_first)
{
    in_own_shm("1025m", rank_tp_second, 1);
    in_own_shm("1025m", rank_tp_second, 2);
}
END_TEST

START_TEST(abi_rings_reserved_at_first_use)
{
    in_own_shm("64m", rank_tp_lazy, 1);
    in_own_shm("64m", rank_tp_lazy, 2);
}
END_TEST

START_TEST(abi_rings_reserved_when_full)
{
    in_own_shm("4m", rank_tp_full, 1);
    in_own_shm("4m", rank_tp_full, 2);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("shm");
    const TTest *const abi[] = { abi_dead_peer_and_subset,
                                 abi_cancel_at_boundary_keeps_link,
                                 abi_withdrawn_pull_never_delivered,
                                 abi_single_copy_hint,
                                 abi_bad_knobs_are_unset,
                                 abi_streamed_ring_stores,
                                 nt_choice_from_timings,
                                 abi_rings_reserved_at_first_use,
                                 abi_rings_reserved_when_full,
                                 abi_rings_second_transport_counts_the_first,
                                 NULL };
    const TTest *const library[] = { sizes_single_copy,
                                     sizes_ring,
                                     inflight_both_ways_single_copy,
                                     inflight_both_ways_ring,
                                     allreduce_ranks,
                                     mismatch_fails_everywhere,
                                     rank_killed_mid_allreduce,
                                     rank_killed_mid_allreduce_single_copy,
                                     rank_killed_in_other_pid_namespace,
                                     eight_ranks_two_cpus,
                                     ranks_sharing_a_cpu_part,
                                     ranks_sharing_a_cpu_bind_none,
                                     rings_mapped_up_front,
                                     pinned_ranks_spin,
                                     pinned_to_one_cpu_spin_short,
                                     NULL };
    const TTest *const timeouts[] = { long_spin_keeps_the_timeout, NULL };
    const TTest *const ring[] = { ring_record_found_by_its_stamp, ring_short_record,
                                  short_digest_tells_envelopes_apart, NULL };
    const TTest *const crowded[] = { crowded_ranks_even_out, NULL };
    const TTest *const closed[] = { peer_destroyed_fails_waiter_at_once,
                                    peer_destroyed_after_sends_delivers_first,
                                    abi_probe_finds_message_sent_before_close, NULL };
    th_add_tests(s, "abi", 60, abi);
    th_add_tests(s, "library", 120, library);
    th_add_tests(s, "timeouts", 30, timeouts);
    th_add_tests(s, "ring", 30, ring);
    th_add_tests(s, "crowded", 90, crowded);
    th_add_tests(s, "closed", 90, closed);
    const TTest *const setup[] = { peer_segment_unmappable, NULL };
    th_add_tests(s, "setup", 30, setup);
    return s;
}

int main(void)
{
    return th_main(suite());
}
