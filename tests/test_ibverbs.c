/* The ibverbs transport: the no-device path, the memory registration cache (hits,
 * misses, eviction, and a freed-and-remapped buffer never served from a stale
 * registration), a queue pair error surfacing as a peer error naming the rank, and a
 * matrix of every collective on 2, 3 and 4 ranks with sizes up to 3 MiB.
 *
 * Without an RDMA device only the no-device case runs (communicator creation with
 * TUTTI_TRANSPORT=ibverbs must fail with TUTTI_ERR_NO_DEVICE and say "no ibverbs
 * device"), then the program exits 77 (meson's "skipped") saying so. CI runs the rest
 * inside a soft-RoCE VM: tests/rdma/run-in-vm.sh.
 */
#include <check.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include <tutti/store.h>
#include <tutti/transport_v2.h>
#include <tutti/tutti.h>

#include "../transports/ibverbs/ib.h"
#include "fake_host.h"
#include "harness.h"
#include "ref.h"

/* Devices libibverbs lists; *active_p: how many have an active port. */
static int device_count(int *active_p)
{
    int n = 0, active = 0;
    struct ibv_device **l = ibv_get_device_list(&n);
    for (int i = 0; l && i < n; i++) {
        struct ibv_context *ctx = ibv_open_device(l[i]);
        struct ibv_device_attr da;
        if (!ctx)
            continue;
        if (ibv_query_device(ctx, &da) == 0) {
            int up = 0;
            for (int p = 1; p <= da.phys_port_cnt; p++) {
                struct ibv_port_attr pa;
                if (ibv_query_port(ctx, (uint8_t)p, &pa) == 0 && pa.state == IBV_PORT_ACTIVE)
                    up = 1;
            }
            active += up;
        }
        ibv_close_device(ctx);
    }
    if (l)
        ibv_free_device_list(l);
    if (active_p)
        *active_p = active;
    return l ? n : 0;
}

/* Two ranks of fn; both must exit 0. */
static void run_pair(th_rank_fn fn, void *arg, int timeout_ms, int flags,
                     const tutti_comm_opts_t *o)
{
    th_spec_t spec = {
        .nranks = 2, .fn = fn, .arg = arg, .timeout_ms = timeout_ms, .flags = flags, .opts = o
    };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}

/* ---- no device: init fails with TUTTI_ERR_NO_DEVICE and says why ---- */

static int rank_no_device(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const char *want = arg;
    tutti_store_t *store = NULL;
    FAIL_IF(tutti_store_open_file(&store, dir, 10000) != TUTTI_OK, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.transport = "ibverbs";
    o.timeout_ms = 10000;
    /* the reason is logged (a warning) as init fails: catch it */
    FILE *cap = tmpfile();
    FAIL_IF(!cap, "tmpfile");
    fflush(stderr);
    int saved = dup(2);
    dup2(fileno(cap), 2);
    tutti_comm_t *c = NULL;
    double t0 = th_now_ms();
    int st = tutti_comm_init(&c, store, rank, nranks, &o);
    double ms = th_now_ms() - t0;
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char text[4096] = "";
    rewind(cap);
    size_t n = fread(text, 1, sizeof(text) - 1, cap);
    text[n] = '\0';
    fclose(cap);
    FAIL_IF(st != TUTTI_ERR_NO_DEVICE, "init gave %s, not TUTTI_ERR_NO_DEVICE; log: %s",
            tutti_status_name(st), text);
    FAIL_IF(c != NULL, "comm set on failure");
    FAIL_IF(!strstr(text, want), "the log does not say \"%s\": %s", want, text);
    FAIL_IF(ms > 5000, "failing took %.0f ms: it must not wait for the peers", ms);
    tutti_store_close(store);
    return 0;
}

START_TEST(no_device)
{
    char want[128];
    if (device_count(NULL) > 0) {
        /* a host with a device: ask for one that is not there */
        setenv("TUTTI_IB_DEV", "nosuchdev0", 1);
        snprintf(want, sizeof(want), "no ibverbs device named nosuchdev0");
    } else {
        snprintf(want, sizeof(want), "no ibverbs device");
    }
    run_pair(rank_no_device, want, 20000, TH_NO_COMM, NULL);
}
END_TEST

/* ---- the registration cache on its own ---- */

typedef struct dev {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
} dev_t_;

static void dev_open(dev_t_ *d)
{
    int n = 0;
    struct ibv_device **l = ibv_get_device_list(&n);
    ck_assert_msg(l && n > 0, "no device");
    const char *want = getenv("TUTTI_IB_DEV");
    d->ctx = NULL;
    for (int i = 0; i < n && !d->ctx; i++)
        if (!want || !strncmp(want, ibv_get_device_name(l[i]), strcspn(want, ":")))
            d->ctx = ibv_open_device(l[i]);
    ibv_free_device_list(l);
    ck_assert_msg(d->ctx != NULL, "cannot open the device");
    d->pd = ibv_alloc_pd(d->ctx);
    ck_assert_msg(d->pd != NULL, "ibv_alloc_pd");
}

static void dev_close(dev_t_ *d)
{
    ibv_dealloc_pd(d->pd);
    ibv_close_device(d->ctx);
}

START_TEST(mr_cache_hits_misses)
{
    dev_t_ d;
    dev_open(&d);
    ib_mrc_t c;
    char err[256];
    ck_assert_int_eq(ib_mrc_init(&c, d.pd, "trust", 64u << 20, 0, err, sizeof(err)), 0);
    const size_t len = 1u << 20;
    char *a = malloc(len), *b = malloc(len);
    ck_assert(a && b);
    memset(a, 1, len);
    memset(b, 2, len);
    ib_mr_entry_t *e1, *e2, *e3, *e4;
    ck_assert_int_eq(ib_mrc_get(&c, a, len, 0, &e1), 0);
    ck_assert_uint_eq(c.misses, 1);
    ib_mrc_put(&c, e1);
    ck_assert_int_eq(ib_mrc_get(&c, a, len, 1, &e2), 0);         /* same buffer, receive */
    ck_assert_int_eq(ib_mrc_get(&c, a + 4096, 8192, 0, &e3), 0); /* inside it */
    ck_assert_ptr_eq(e2, e1);
    ck_assert_ptr_eq(e3, e1);
    ck_assert_uint_eq(c.hits, 2);
    ck_assert_uint_eq(c.misses, 1);
    ck_assert_int_eq(ib_mrc_get(&c, b, len, 0, &e4), 0); /* another buffer */
    ck_assert_uint_eq(c.misses, 2);
    ck_assert_int_eq(c.entries, 2);
    ib_mrc_put(&c, e2);
    ib_mrc_put(&c, e3);
    ib_mrc_put(&c, e4);
    ib_mrc_destroy(&c);

    /* the byte limit: least recently used idle entries go */
    ck_assert_int_eq(ib_mrc_init(&c, d.pd, "trust", len + len / 2 + 8192, 0, err, sizeof(err)), 0);
    ck_assert_int_eq(ib_mrc_get(&c, a, len, 0, &e1), 0);
    ib_mrc_put(&c, e1);
    ck_assert_int_eq(ib_mrc_get(&c, b, len, 0, &e2), 0);
    ib_mrc_put(&c, e2);
    ck_assert_int_eq(c.entries, 1);
    ck_assert_uint_eq(c.evictions, 1);
    ck_assert_int_eq(ib_mrc_get(&c, b, len, 0, &e2), 0); /* the survivor is b */
    ck_assert_uint_eq(c.hits, 1);
    ib_mrc_put(&c, e2);
    ib_mrc_destroy(&c);

    /* off: every get registers anew, nothing is kept */
    ck_assert_int_eq(ib_mrc_init(&c, d.pd, "off", 64u << 20, 0, err, sizeof(err)), 0);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(ib_mrc_get(&c, a, len, 0, &e1), 0);
        ib_mrc_put(&c, e1);
    }
    ck_assert_uint_eq(c.misses, 3);
    ck_assert_uint_eq(c.hits, 0);
    ck_assert_int_eq(c.entries, 0);
    ib_mrc_destroy(&c);
    free(a);
    free(b);
    dev_close(&d);
}
END_TEST

/* A buffer freed and mapped again at the same address is new memory: the cache must
 * not hand out the old registration (which pins the old pages). */
START_TEST(mr_cache_invalidate_on_free)
{
    dev_t_ d;
    dev_open(&d);
    ib_mrc_t c;
    char err[256];
    if (ib_mrc_init(&c, d.pd, NULL, 64u << 20, 0, err, sizeof(err)) != 0 ||
        c.mode != IB_MRC_PAGEMAP) {
        fprintf(stderr,
                "mr_cache_invalidate_on_free: the cache runs in mode %s here (page "
                "frames need CAP_SYS_ADMIN): nothing to check\n",
                ib_mrc_mode_name(c.mode));
        ib_mrc_destroy(&c);
        dev_close(&d);
        return;
    }
    const size_t len = 4u << 20;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert(p != MAP_FAILED);
    memset(p, 1, len);
    ib_mr_entry_t *e;
    ck_assert_int_eq(ib_mrc_get(&c, p, len, 0, &e), 0);
    ib_mrc_put(&c, e);
    ck_assert_int_eq(ib_mrc_get(&c, p, len, 0, &e), 0);
    ib_mrc_put(&c, e);
    ck_assert_uint_eq(c.hits, 1);
    /* "free" it and get new memory at the same address */
    ck_assert_int_eq(munmap(p, len), 0);
    char *q = mmap(p, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    ck_assert(q == p);
    memset(q, 2, len);
    ck_assert_int_eq(ib_mrc_get(&c, q, len, 0, &e), 0);
    ck_assert_uint_eq(c.invalidations, 1);
    ck_assert_uint_eq(c.misses, 2);
    ck_assert_uint_eq(c.hits, 1);
    ib_mrc_put(&c, e);
    /* a page in the middle replaced (MADV_DONTNEED gives a fresh zero page) */
    ck_assert_int_eq(ib_mrc_get(&c, q, len, 0, &e), 0);
    ib_mrc_put(&c, e);
    ck_assert_uint_eq(c.hits, 2);
    ck_assert_int_eq(munmap(q + len / 2, 4096), 0);
    ck_assert(mmap(q + len / 2, 4096, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == q + len / 2);
    q[len / 2] = 3;
    ck_assert_int_eq(ib_mrc_get(&c, q, len, 0, &e), 0);
    ck_assert_uint_eq(c.invalidations, 2);
    ib_mrc_put(&c, e);
    ib_mrc_destroy(&c);
    munmap(q, len);
    dev_close(&d);
}
END_TEST

/* ---- through a communicator: repeated collectives hit the cache ---- */

static int check_sum(int rank, const float *out, size_t n, int nranks, float scale)
{
    for (size_t i = 0; i < n; i++) {
        float exp = scale * (float)((i % 1000) * nranks + nranks * (nranks - 1) / 2);
        FAIL_IF(out[i] != exp, "index %zu: got %g, expected %g", i, (double)out[i], (double)exp);
    }
    return 0;
}

static int rank_cache_comm(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    FAIL_IF(strcmp(tutti_comm_transport(comm), "ibverbs") != 0, "transport is %s",
            tutti_comm_transport(comm));
    const size_t n = 1u << 20; /* 4 MiB of fp32 */
    const size_t len = n * sizeof(float);
    float *in = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    float *out = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    FAIL_IF(in == MAP_FAILED || out == MAP_FAILED, "mmap");
    for (size_t i = 0; i < n; i++)
        in[i] = (float)(i % 1000 + (size_t)rank);
    tt_ib_stats_t s0, s1, s2, s3;
    FAIL_IF(tt_ib_debug_stats(NULL, &s0) != TUTTI_OK, "no ibverbs transport in this process");
    const char *gi = getenv("RXE_GID_INDEX");
    if (gi && !getenv("TUTTI_IB_GID_INDEX"))
        FAIL_IF(s0.gid_index != atoi(gi), "chose GID index %d, the RoCE v2 IPv4 one is %s",
                s0.gid_index, gi);
    for (int it = 0; it < 3; it++) {
        memset(out, 0, len);
        int st = tutti_allreduce(comm, in, out, n, TUTTI_FP32, TUTTI_SUM);
        FAIL_IF(st != TUTTI_OK, "allreduce %d: %s", it, tutti_comm_last_error(comm));
        if (check_sum(rank, out, n, nranks, 1.0f))
            return 1;
        tt_ib_debug_stats(NULL, it == 0 ? &s1 : &s2);
    }
    fprintf(stderr,
            "rank %d: MR cache %s: after 1 allreduce %lu hits %lu misses; after 3: %lu hits "
            "%lu misses, %d entries %zu bytes; %lu eager, %lu RDMA READ messages\n",
            rank, s2.mr_mode, s1.mr_hits, s1.mr_misses, s2.mr_hits, s2.mr_misses, s2.mr_entries,
            s2.mr_bytes, s2.eager_msgs, s2.rdv_msgs);
    FAIL_IF(s1.rdv_msgs == 0, "4 MiB allreduce used no RDMA READ");
    FAIL_IF(s1.mr_misses == 0, "nothing registered");
    if (strcmp(s2.mr_mode, "off") != 0) {
        /* the library's own scratch buffers may come and go, the user's stay */
        FAIL_IF(s2.mr_hits <= s1.mr_hits, "no cache hits on the same buffers");
        FAIL_IF(s2.mr_misses - s1.mr_misses >= s1.mr_misses,
                "the 2nd and 3rd allreduce registered as much as the 1st (%lu, then %lu)",
                s1.mr_misses, s2.mr_misses - s1.mr_misses);
    }
    /* free both buffers, get new memory at the same addresses with other contents: the
     * result must come from the new pages */
    FAIL_IF(munmap(in, len) || munmap(out, len), "munmap");
    float *in2 = mmap(in, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
                      0);
    float *out2 = mmap(out, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                       -1, 0);
    FAIL_IF(in2 != in || out2 != out, "remap");
    for (size_t i = 0; i < n; i++)
        in2[i] = 2.0f * (float)(i % 1000 + (size_t)rank);
    int st = tutti_allreduce(comm, in2, out2, n, TUTTI_FP32, TUTTI_SUM);
    FAIL_IF(st != TUTTI_OK, "allreduce after remap: %s", tutti_comm_last_error(comm));
    if (check_sum(rank, out2, n, nranks, 2.0f))
        return 1;
    tt_ib_debug_stats(NULL, &s3);
    if (!strcmp(s3.mr_mode, "pagemap"))
        FAIL_IF(s3.mr_invalidations == s2.mr_invalidations,
                "remapped buffers were not noticed (invalidations %lu)", s3.mr_invalidations);
    munmap(in2, len);
    munmap(out2, len);
    return 0;
}

START_TEST(mr_cache_comm)
{
    run_pair(rank_cache_comm, NULL, 120000, 0, NULL);
}
END_TEST

/* ---- a QP error becomes a peer error naming the rank ---- */

static int rank_qp_error(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg, (void)nranks;
    float buf[1024], out[1024];
    for (int i = 0; i < 1024; i++)
        buf[i] = (float)i;
    int st = tutti_allreduce(comm, buf, out, 1024, TUTTI_FP32, TUTTI_SUM);
    FAIL_IF(st != TUTTI_OK, "first allreduce: %s", tutti_comm_last_error(comm));
    st = tutti_barrier(comm);
    FAIL_IF(st != TUTTI_OK, "barrier: %s", tutti_comm_last_error(comm));
    if (rank == 0)
        FAIL_IF(tt_ib_debug_break_qp(NULL, 1) != TUTTI_OK, "cannot break the QP");
    double t0 = th_now_ms();
    st = tutti_allreduce(comm, buf, out, 1024, TUTTI_FP32, TUTTI_SUM);
    double ms = th_now_ms() - t0;
    const char *err = tutti_comm_last_error(comm);
    fprintf(stderr, "rank %d failed after %.0f ms with %s: %s\n", rank, ms, tutti_status_name(st),
            err);
    FAIL_IF(st == TUTTI_OK, "allreduce over a broken QP succeeded");
    if (rank == 0) {
        FAIL_IF(st != TUTTI_ERR_PEER, "got %s, not TUTTI_ERR_PEER", tutti_status_name(st));
        FAIL_IF(!strstr(err, "rank 1") || !strstr(err, "ibverbs"),
                "the error does not name rank 1: %s", err);
    }
    FAIL_IF(ms > 15000, "took %.0f ms to fail", ms);
    return 0;
}

START_TEST(qp_error)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 20000;
    run_pair(rank_qp_error, NULL, 60000, TH_NO_KILL_ON_FAIL, &o);
}
END_TEST

/* ---- through the ABI directly: cancel and failure semantics of the rendezvous ---- */

const tutti_transport_ops_v2_t *tt_builtin_transport_ibverbs(void);
#define IBOPS tt_builtin_transport_ibverbs()

static int tp_open(th_host_t *t, const char *dir, int rank, int nranks, void **tp_p)
{
    if (th_host_open(t, dir, "abi/", rank, nranks, 20000) != 0)
        return -1;
    return IBOPS->create(&t->h, tp_p);
}

static void tp_close(th_host_t *t, void *tp)
{
    IBOPS->destroy(tp);
    th_host_close(t);
}

static void signal_key(th_host_t *t, const char *key)
{
    tutti_store_set(t->store, key, "1", 1);
}

static int wait_key(th_host_t *t, const char *key, int ms)
{
    void *v = NULL;
    size_t n = 0;
    if (tutti_store_get(t->store, key, &v, &n, ms) != 0)
        return -1;
    free(v);
    return 0;
}

/* envelope (e0, 0xfeed, len, 0) */
#define req_init(r, peer, buf, len, e0) th_req_set(r, peer, buf, len, e0, 0xfeed, 0)

/* progress for ms (until *a and *b, when given, are no longer pending) */
static void drive2(void *tp, tutti_tp_req_v2_t *a, tutti_tp_req_v2_t *b, int ms)
{
    double end = th_now_ms() + ms;
    while (th_now_ms() < end) {
        if ((a || b) && (!a || a->status != 1) && (!b || b->status != 1))
            return;
        if (IBOPS->progress(tp, 20) < 0)
            return;
    }
}

enum { RDV_CANCEL = 0, RDV_BREAK = 1 };

/* Rank 0 sends 1 MiB (an RTS: the payload stays in its buffer for rank 1 to READ), then,
 * before rank 1 has posted its receive, cancels it (RDV_CANCEL: the library takes the
 * buffer back and writes something else there) or has its queue pair break (RDV_BREAK).
 * Rank 1's receive must then fail, with the reason recorded: never complete with what
 * the buffer holds after the cancel. */
static int rank_rdv_fail(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    int mode = (int)(intptr_t)arg;
    th_host_t t;
    void *tp = NULL;
    FAIL_IF(tp_open(&t, dir, rank, nranks, &tp) != 0, "create: %s", t.err);
    const size_t len = 1u << 20;
    unsigned char *buf = malloc(len);
    FAIL_IF(!buf, "malloc");
    tutti_tp_req_v2_t r;
    if (rank == 0) {
        memset(buf, 0xa5, len);
        req_init(&r, 1, buf, len, 1);
        FAIL_IF(IBOPS->post_send(tp, &r) != 0, "post_send: %s", t.err);
        tt_ib_stats_t s;
        tt_ib_debug_stats(tp, &s);
        FAIL_IF(s.rdv_msgs != 1, "1 MiB did not go as an RTS (%lu)", s.rdv_msgs);
        drive2(tp, NULL, NULL, 500); /* the RTS reaches rank 1's ring */
        FAIL_IF(r.status != 1, "send finished before rank 1 posted its receive: %d", r.status);
        if (mode == RDV_CANCEL) {
            IBOPS->cancel_all(tp, TUTTI_ERR_TIMEOUT);
            FAIL_IF(r.status != TUTTI_ERR_TIMEOUT, "cancelled send has status %d", r.status);
            memset(buf, 0x5a, len); /* the library reuses the buffer */
        } else {
            FAIL_IF(tt_ib_debug_break_qp(tp, 1) != TUTTI_OK, "break_qp");
        }
        signal_key(&t, "sent");
        FAIL_IF(wait_key(&t, "done", 60000) != 0, "rank 1 never finished");
    } else {
        FAIL_IF(wait_key(&t, "sent", 30000) != 0, "rank 0 never sent");
        memset(buf, 0, len);
        req_init(&r, 0, buf, len, 1);
        FAIL_IF(IBOPS->post_recv(tp, &r) != 0, "post_recv: %s", t.err);
        double t0 = th_now_ms();
        drive2(tp, &r, NULL, 40000);
        fprintf(stderr, "rdv %s: receive ended with %s after %.0f ms; error: %s\n",
                mode == RDV_CANCEL ? "cancel" : "break", tutti_status_name(r.status),
                th_now_ms() - t0, t.nerr ? t.err : "(none recorded)");
        signal_key(&t, "done");
        FAIL_IF(r.status == 0,
                "the receive completed with the sender's cancelled buffer "
                "(first byte 0x%02x)",
                buf[0]);
        FAIL_IF(r.status == 1, "the receive never failed");
        FAIL_IF(t.nerr == 0, "the receive failed with %s, but no reason was recorded",
                tutti_status_name(r.status));
        FAIL_IF(!strstr(t.err, "rank 0"), "the reason does not name rank 0: %s", t.err);
    }
    tp_close(&t, tp);
    free(buf);
    return 0;
}

START_TEST(rdv_cancel)
{
    run_pair(rank_rdv_fail, (void *)(intptr_t)_i, 90000, TH_NO_COMM | TH_NO_KILL_ON_FAIL, NULL);
}
END_TEST

/* cancel_all while rank 1 is READing 32 MiB: it returns promptly, the buffer is the
 * library's again (the HCA writes nothing into it afterwards), the link is failed for
 * good, and rank 0, whose send now never gets its FIN, notices (keep-alive probe of a
 * stopped queue pair) instead of waiting forever. */
static int rank_cancel_reading(int rank, int nranks, tutti_comm_t *unused, const char *dir,
                               void *arg)
{
    (void)unused;
    (void)arg;
    th_host_t t;
    void *tp = NULL;
    FAIL_IF(tp_open(&t, dir, rank, nranks, &tp) != 0, "create: %s", t.err);
    const size_t len = 32u << 20;
    unsigned char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                              0);
    FAIL_IF(buf == MAP_FAILED, "mmap");
    tutti_tp_req_v2_t r;
    if (rank == 0) {
        memset(buf, 0xa5, len);
        req_init(&r, 1, buf, len, 1);
        FAIL_IF(IBOPS->post_send(tp, &r) != 0, "post_send: %s", t.err);
        double t0 = th_now_ms();
        drive2(tp, &r, NULL, 40000);
        fprintf(stderr, "cancel while reading: rank 0's send ended with %s after %.0f ms: %s\n",
                tutti_status_name(r.status), th_now_ms() - t0, t.nerr ? t.err : "");
        FAIL_IF(r.status == 1, "rank 0's send is still pending after 40 s");
        FAIL_IF(r.status == 0, "rank 0's send completed, but rank 1 cancelled its receive");
        signal_key(&t, "done0");
        FAIL_IF(wait_key(&t, "done1", 60000) != 0, "rank 1 never finished");
    } else {
        memset(buf, 0, len);
        req_init(&r, 0, buf, len, 1);
        FAIL_IF(IBOPS->post_recv(tp, &r) != 0, "post_recv: %s", t.err);
        tt_ib_stats_t s0, s1;
        tt_ib_debug_stats(tp, &s0);
        double end = th_now_ms() + 30000;
        do {
            FAIL_IF(IBOPS->progress(tp, 0) < 0, "progress failed");
            tt_ib_debug_stats(tp, &s1);
        } while (s1.mr_hits + s1.mr_misses == s0.mr_hits + s0.mr_misses && r.status == 1 &&
                 th_now_ms() < end);
        FAIL_IF(r.status != 1, "the 32 MiB receive ended (%s) before it could be cancelled",
                tutti_status_name(r.status));
        FAIL_IF(s1.mr_hits + s1.mr_misses == s0.mr_hits + s0.mr_misses,
                "the receive was never matched");
        double t0 = th_now_ms();
        IBOPS->cancel_all(tp, TUTTI_ERR_TIMEOUT);
        double ms = th_now_ms() - t0;
        FAIL_IF(r.status != TUTTI_ERR_TIMEOUT, "cancelled receive has status %d", r.status);
        FAIL_IF(ms > 3000, "cancel_all took %.0f ms", ms);
        memset(buf, 0, len);
        drive2(tp, NULL, NULL, 300);
        usleep(300000);
        for (size_t i = 0; i < len; i++)
            FAIL_IF(buf[i] != 0,
                    "byte %zu of the cancelled receive's buffer was written after "
                    "cancel_all returned",
                    i);
        tutti_tp_req_v2_t r2;
        req_init(&r2, 0, buf, 16, 2);
        FAIL_IF(IBOPS->post_recv(tp, &r2) == 0, "a receive on the cancelled link was taken");
        FAIL_IF(wait_key(&t, "done0", 60000) != 0, "rank 0 never finished");
        signal_key(&t, "done1");
    }
    tp_close(&t, tp);
    munmap(buf, len);
    return 0;
}

START_TEST(cancel_reading)
{
    run_pair(rank_cancel_reading, NULL, 110000, TH_NO_COMM | TH_NO_KILL_ON_FAIL, NULL);
}
END_TEST

/* An RTS being READ, then a message whose envelope does not match: the mismatch is
 * reported on its receive (with got_env/got_len), and the earlier receive, whose buffer
 * the transport still owns, completes with its data instead of failing with a bare
 * peer error. */
static int rank_mismatch_after_rts(int rank, int nranks, tutti_comm_t *unused, const char *dir,
                                   void *arg)
{
    (void)unused;
    (void)arg;
    th_host_t t;
    void *tp = NULL;
    FAIL_IF(tp_open(&t, dir, rank, nranks, &tp) != 0, "create: %s", t.err);
    const size_t len = 32u << 20; /* 8 READs: still in flight when the mismatch is seen */
    unsigned char *big = malloc(len), small[16];
    FAIL_IF(!big, "malloc");
    tutti_tp_req_v2_t a, b;
    if (rank == 0) {
        for (size_t i = 0; i < len; i++)
            big[i] = (unsigned char)(i * 7 + 1);
        memset(small, 0x33, sizeof(small));
        req_init(&a, 1, big, len, 1);
        req_init(&b, 1, small, sizeof(small), 2);
        FAIL_IF(IBOPS->post_send(tp, &a) != 0 || IBOPS->post_send(tp, &b) != 0, "post: %s", t.err);
        drive2(tp, NULL, NULL, 500); /* both reach rank 1's ring */
        signal_key(&t, "sent");
        FAIL_IF(wait_key(&t, "done", 60000) != 0, "rank 1 never finished");
    } else {
        FAIL_IF(wait_key(&t, "sent", 30000) != 0, "rank 0 never sent");
        usleep(200000);
        memset(big, 0, len);
        req_init(&a, 0, big, len, 1);
        req_init(&b, 0, small, sizeof(small), 3); /* rank 0 sent 2 */
        FAIL_IF(IBOPS->post_recv(tp, &a) != 0 || IBOPS->post_recv(tp, &b) != 0, "post: %s", t.err);
        drive2(tp, &a, &b, 30000);
        signal_key(&t, "done");
        FAIL_IF(b.status != TUTTI_ERR_MISMATCH, "second receive: %s, not a mismatch",
                tutti_status_name(b.status));
        FAIL_IF(b.got_env[0] != 2 || b.got_len != sizeof(small), "got_env[0] %llu got_len %zu",
                (unsigned long long)b.got_env[0], b.got_len);
        FAIL_IF(a.status != 0, "the receive before the mismatch ended with %s (%s)",
                tutti_status_name(a.status), t.nerr ? t.err : "no reason recorded");
        for (size_t i = 0; i < len; i++)
            FAIL_IF(big[i] != (unsigned char)(i * 7 + 1), "byte %zu: 0x%02x", i, big[i]);
        FAIL_IF(a.xfer != len || a.got_len != len, "xfer %zu got_len %zu", a.xfer, a.got_len);
    }
    tp_close(&t, tp);
    free(big);
    return 0;
}

START_TEST(mismatch_after_rts)
{
    run_pair(rank_mismatch_after_rts, NULL, 90000, TH_NO_COMM | TH_NO_KILL_ON_FAIL, NULL);
}
END_TEST

/* ---- every collective on 2, 3, 4 ranks, 0 bytes to 3 MiB ---- */

static uint32_t val(int rank, size_t i)
{
    return (uint32_t)rank * 2654435761u + (uint32_t)i * 40503u + 7u;
}

static uint32_t sum_at(int n, size_t i)
{
    uint32_t s = 0;
    for (int r = 0; r < n; r++)
        s += val(r, i);
    return s;
}

#define CHECK_BLOCK(what, cond_idx, exp_expr)                                                      \
    for (size_t i = 0; i < (cond_idx); i++) {                                                      \
        uint32_t exp = (exp_expr);                                                                 \
        FAIL_IF(out[i] != exp, "%s count %zu: index %zu: got 0x%x, expected 0x%x", what, count, i, \
                out[i], exp);                                                                      \
    }

static int rank_matrix(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    FAIL_IF(strcmp(tutti_comm_transport(comm), "ibverbs") != 0, "transport is %s",
            tutti_comm_transport(comm));
    static const size_t counts[] = { 0, 1, 7, 2047, 4097, 65539, 786435 }; /* up to 3 MiB */
    const size_t cap = 786435 * 4 + 64;
    uint32_t *in = malloc(cap * sizeof(uint32_t)), *out = malloc(cap * sizeof(uint32_t));
    FAIL_IF(!in || !out, "out of memory");
    double t0 = th_now_ms();
    for (size_t k = 0; k < ARRAY_SIZE(counts); k++) {
        const size_t count = counts[k];
        const int root = (int)(k % (size_t)n);
        const size_t b = count / (size_t)n; /* per-rank block of the gathers/scatters */
        int st;
        /* allreduce */
        for (size_t i = 0; i < count; i++)
            in[i] = val(rank, i);
        memset(out, 0xee, count * 4);
        st = tutti_allreduce(comm, in, out, count, TUTTI_INT32, TUTTI_SUM);
        FAIL_IF(st, "allreduce %zu: %s", count, tutti_comm_last_error(comm));
        CHECK_BLOCK("allreduce", count, sum_at(n, i));
        /* broadcast */
        for (size_t i = 0; i < count; i++)
            out[i] = rank == root ? val(root, i) : 0xdeadbeef;
        st = tutti_broadcast(comm, TUTTI_IN_PLACE, out, count, TUTTI_INT32, root);
        FAIL_IF(st, "broadcast %zu: %s", count, tutti_comm_last_error(comm));
        CHECK_BLOCK("broadcast", count, val(root, i));
        /* reduce */
        memset(out, 0xee, count * 4);
        st = tutti_reduce(comm, in, out, count, TUTTI_INT32, TUTTI_SUM, root);
        FAIL_IF(st, "reduce %zu: %s", count, tutti_comm_last_error(comm));
        if (rank == root)
            CHECK_BLOCK("reduce", count, sum_at(n, i));
        /* allgather: block r holds rank r's b elements */
        for (size_t i = 0; i < b; i++)
            in[i] = val(rank, i);
        memset(out, 0xee, (size_t)n * b * 4);
        st = tutti_allgather(comm, in, out, b, TUTTI_INT32);
        FAIL_IF(st, "allgather %zu: %s", b, tutti_comm_last_error(comm));
        CHECK_BLOCK("allgather", (size_t)n * b, val((int)(i / (b ? b : 1)), i % (b ? b : 1)));
        /* reduce_scatter: rank r gets the sum of everyone's block r */
        for (size_t i = 0; i < (size_t)n * b; i++)
            in[i] = val(rank, i);
        memset(out, 0xee, b * 4);
        st = tutti_reduce_scatter(comm, in, out, b, TUTTI_INT32, TUTTI_SUM);
        FAIL_IF(st, "reduce_scatter %zu: %s", b, tutti_comm_last_error(comm));
        CHECK_BLOCK("reduce_scatter", b, sum_at(n, (size_t)rank * b + i));
        /* gather to root */
        for (size_t i = 0; i < b; i++)
            in[i] = val(rank, i);
        memset(out, 0xee, (size_t)n * b * 4);
        st = tutti_gather(comm, in, out, b, TUTTI_INT32, root);
        FAIL_IF(st, "gather %zu: %s", b, tutti_comm_last_error(comm));
        if (rank == root)
            CHECK_BLOCK("gather", (size_t)n * b, val((int)(i / (b ? b : 1)), i % (b ? b : 1)));
        /* scatter from root: block r of root's buffer to rank r */
        for (size_t i = 0; i < (size_t)n * b; i++)
            in[i] = val(root, i);
        memset(out, 0xee, b * 4);
        st = tutti_scatter(comm, in, out, b, TUTTI_INT32, root);
        FAIL_IF(st, "scatter %zu: %s", b, tutti_comm_last_error(comm));
        CHECK_BLOCK("scatter", b, val(root, (size_t)rank * b + i));
        /* alltoall: block j of rank r's input goes to rank j */
        const size_t a = b / (size_t)n ? b / (size_t)n : b;
        for (size_t i = 0; i < (size_t)n * a; i++)
            in[i] = val(rank, i);
        memset(out, 0xee, (size_t)n * a * 4);
        st = tutti_alltoall(comm, in, out, a, TUTTI_INT32);
        FAIL_IF(st, "alltoall %zu: %s", a, tutti_comm_last_error(comm));
        CHECK_BLOCK("alltoall", (size_t)n * a,
                    val((int)(i / (a ? a : 1)), (size_t)rank * a + i % (a ? a : 1)));
        /* point to point around the ring */
        for (size_t i = 0; i < count; i++)
            in[i] = val(rank, i);
        memset(out, 0xee, count * 4);
        tutti_work_t *ws, *wr;
        st = tutti_send_async(comm, in, count, TUTTI_INT32, (rank + 1) % n, 5, &ws);
        FAIL_IF(st, "send %zu: %s", count, tutti_comm_last_error(comm));
        st = tutti_recv_async(comm, out, count, TUTTI_INT32, (rank + n - 1) % n, 5, &wr);
        FAIL_IF(st, "recv %zu: %s", count, tutti_comm_last_error(comm));
        FAIL_IF(tutti_wait(ws, -1) || tutti_wait(wr, -1), "p2p %zu: %s", count,
                tutti_comm_last_error(comm));
        tutti_work_free(ws);
        tutti_work_free(wr);
        CHECK_BLOCK("send/recv", count, val((rank + n - 1) % n, i));
        st = tutti_barrier(comm);
        FAIL_IF(st, "barrier: %s", tutti_comm_last_error(comm));
    }
    tt_ib_stats_t s;
    tt_ib_debug_stats(NULL, &s);
    if (rank == 0)
        fprintf(stderr,
                "matrix on %d ranks: %.0f ms; %lu eager and %lu RDMA READ messages; MR cache "
                "%s: %lu hits, %lu misses\n",
                n, th_now_ms() - t0, s.eager_msgs, s.rdv_msgs, s.mr_mode, s.mr_hits, s.mr_misses);
    FAIL_IF(s.eager_msgs == 0 || s.rdv_msgs == 0, "eager %lu, rdv %lu: a path went unused",
            s.eager_msgs, s.rdv_msgs);
    free(in);
    free(out);
    return 0;
}

TH_RUN_TEST(matrix, th_run(_i, rank_matrix, NULL, 240000))

/* ---- TUTTI_IB_CONNECT=lazy: queue pairs at their first use ---- */

/* A communicator over ibverbs with this connect mode and secret (NULL: none), on the
 * run's file store (*store_p, kept open for barriers). 0, or the init's status. */
static int lazy_join(int rank, int nranks, const char *dir, const char *mode, const char *token,
                     int timeout_ms, tutti_store_t **store_p, tutti_comm_t **comm_p)
{
    *comm_p = NULL;
    if (tutti_store_open_file(store_p, dir, timeout_ms + 10000) != TUTTI_OK)
        return TUTTI_ERR_STORE;
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.transport = "ibverbs";
    o.timeout_ms = timeout_ms;
    o.transport_options = mode;
    o.auth_token = token;
    return tutti_comm_init(comm_p, *store_p, rank, nranks, &o);
}

static int qps_now(void)
{
    tt_ib_stats_t s;
    return tt_ib_debug_stats(NULL, &s) == TUTTI_OK ? s.qps : -1;
}

/* Four ranks, lazily, with a job secret (every datagram carries its proof): no queue
 * pair after init; a ring of sends and receives (both ends of each pair asking at once;
 * an eager and an RDMA READ message each way) makes each rank exactly two; rank 0's
 * receives from any source take a message from rank 2, which it never asked (rank 2
 * did); every pair at once then makes n-1 on every rank. Payloads and an allreduce are
 * checked against plain C. */
static int rank_lazy(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused, (void)arg;
    tutti_store_t *store;
    tutti_comm_t *comm;
    int st = lazy_join(rank, nranks, dir, "IB_CONNECT=lazy", "the-token", 60000, &store, &comm);
    FAIL_IF(st != TUTTI_OK, "init: %s", tutti_status_name(st));
    tt_ib_stats_t s;
    FAIL_IF(tt_ib_debug_stats(NULL, &s) != TUTTI_OK || !s.lazy, "not lazy");
    FAIL_IF(s.qps != 0, "%d queue pairs after init, want none", s.qps);
    FAIL_IF(th_store_barrier(store, "iblazy", rank, nranks, "init", 60000), "barrier");
    int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
    enum { SMALL = 64, BIG = 48 * 1024 }; /* 256 B eager, 192 KiB read */
    int32_t *out = malloc(BIG * 4), *in = malloc(BIG * 4);
    FAIL_IF(!out || !in, "malloc");
    for (int i = 0; i < BIG; i++)
        out[i] = rank * 1000003 + i;
    for (int k = 0; k < 2; k++) {
        size_t n = k ? BIG : SMALL;
        memset(in, 0xee, n * 4);
        tutti_work_t *ws, *wr;
        FAIL_IF(tutti_send_async(comm, out, n, TUTTI_INT32, right, 5, &ws) != 0 ||
                    tutti_recv_async(comm, in, n, TUTTI_INT32, left, 5, &wr) != 0 ||
                    tutti_wait(ws, -1) != 0 || tutti_wait(wr, -1) != 0,
                "ring of %zu: %s", n, tutti_comm_last_error(comm));
        tutti_work_free(ws);
        tutti_work_free(wr);
        for (size_t i = 0; i < n; i++)
            FAIL_IF(in[i] != left * 1000003 + (int32_t)i, "ring of %zu: in[%zu] = %d", n, i, in[i]);
    }
    FAIL_IF(qps_now() != 2, "after the ring: %d queue pairs, want 2", qps_now());
    FAIL_IF(th_store_barrier(store, "iblazy", rank, nranks, "ring", 60000), "barrier");
    if (rank == 0) {
        int32_t v[2] = { -1, -1 };
        tutti_work_t *w;
        FAIL_IF(tutti_recv_async(comm, v, 2, TUTTI_INT32, TUTTI_ANY_SOURCE, 9, &w) != 0 ||
                    tutti_wait(w, -1) != 0,
                "any source: %s", tutti_comm_last_error(comm));
        int src = tutti_work_source(w);
        tutti_work_free(w);
        FAIL_IF(src != 2 || v[0] != 2 || v[1] != 14, "any source: %d %d from %d", v[0], v[1], src);
        FAIL_IF(qps_now() != 3, "rank 0 after any source: %d queue pairs, want 3", qps_now());
    } else if (rank == 2) {
        int32_t v[2] = { 2, 14 };
        FAIL_IF(tutti_send(comm, v, 2, TUTTI_INT32, 0, 9) != 0, "to 0: %s",
                tutti_comm_last_error(comm));
    }
    FAIL_IF(th_store_barrier(store, "iblazy", rank, nranks, "any", 60000), "barrier");
    FAIL_IF(th_all_pairs(comm, rank, nranks, 11), "all pairs");
    FAIL_IF(qps_now() != nranks - 1, "after all pairs: %d queue pairs, want %d", qps_now(),
            nranks - 1);
    /* an allreduce over the links now up, against the sum computed here */
    for (int i = 0; i < BIG; i++)
        out[i] = (rank + 1) * (i % 1000);
    FAIL_IF(tutti_allreduce(comm, out, in, BIG, TUTTI_INT32, TUTTI_SUM) != 0, "allreduce: %s",
            tutti_comm_last_error(comm));
    for (int i = 0; i < BIG; i++)
        FAIL_IF(in[i] != nranks * (nranks + 1) / 2 * (i % 1000), "allreduce: [%d] = %d", i, in[i]);
    FAIL_IF(tt_ib_debug_stats(NULL, &s) != TUTTI_OK || s.ud_dropped, "%lu datagrams refused",
            s.ud_dropped);
    free(out);
    free(in);
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

START_TEST(lazy_qps_at_first_use)
{
    th_spec_t spec = { .nranks = 4, .fn = rank_lazy, .timeout_ms = 200000, .flags = TH_NO_COMM };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* Lazily, a rank that answered a request (it had posted nothing to the asker) writes to
 * the asker only once it knows the asker's QP receives: from the asker's first write,
 * here the hello alone (rank 0 only receives), or else from a REP to a REQ of its own
 * that it sends when the hello is late. Rank 1 waits in a receive from rank 2 while rank
 * 0 asks it, then sends to rank 0 once rank 2's message comes. With neither, rank 1's
 * send would wait until the timeout. */
static int rank_lazy_hello(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused, (void)arg;
    tutti_store_t *store;
    tutti_comm_t *comm;
    /* no keep-alive probe: it would tell rank 1 as well */
    int st = lazy_join(rank, nranks, dir, "IB_CONNECT=lazy,IB_KEEPALIVE_MS=0", NULL, 20000, &store,
                       &comm);
    FAIL_IF(st != TUTTI_OK, "init: %s", tutti_status_name(st));
    int32_t v = -1;
    double t0 = th_now_ms();
    if (rank == 0) {
        FAIL_IF(th_store_barrier(store, "iblazyhello", rank, nranks, "in", 20000), "barrier");
        FAIL_IF(tutti_recv(comm, &v, 1, TUTTI_INT32, 1, 4) != 0, "recv: %s",
                tutti_comm_last_error(comm));
        FAIL_IF(v != 41, "got %d from rank 1", v);
    } else if (rank == 1) {
        tutti_work_t *w;
        FAIL_IF(tutti_recv_async(comm, &v, 1, TUTTI_INT32, 2, 4, &w) != 0, "post: %s",
                tutti_comm_last_error(comm));
        FAIL_IF(th_store_barrier(store, "iblazyhello", rank, nranks, "in", 20000), "barrier");
        FAIL_IF(tutti_wait(w, -1) != 0 || v != 40, "recv from 2: %d: %s", v,
                tutti_comm_last_error(comm));
        tutti_work_free(w);
        int32_t x = 41;
        FAIL_IF(tutti_send(comm, &x, 1, TUTTI_INT32, 0, 4) != 0, "send to 0: %s",
                tutti_comm_last_error(comm));
    } else {
        FAIL_IF(th_store_barrier(store, "iblazyhello", rank, nranks, "in", 20000), "barrier");
        usleep(500000); /* rank 0 asks rank 1 meanwhile; rank 1 answers from its wait */
        int32_t x = 40;
        FAIL_IF(tutti_send(comm, &x, 1, TUTTI_INT32, 1, 4) != 0, "send to 1: %s",
                tutti_comm_last_error(comm));
    }
    FAIL_IF(th_now_ms() - t0 > 10000, "rank %d took %.0f ms", rank, th_now_ms() - t0);
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

START_TEST(lazy_answering_rank_writes_after_the_hello)
{
    th_spec_t spec = {
        .nranks = 3, .fn = rank_lazy_hello, .timeout_ms = 90000, .flags = TH_NO_COMM
    };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* Lazily, rank 1 has another secret: init is refused on both ranks (TUTTI_ERR_AUTH,
 * naming the secret) well within the timeout. Since session 100 the job record's proof
 * of rank 0's secret refuses it before any queue pair or datagram (every transport and
 * store alike); the datagrams' own proofs stay as a second line. */
static int rank_lazy_secret(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused, (void)arg;
    tutti_store_t *store = NULL;
    tutti_comm_t *comm = NULL;
    double t0 = th_now_ms();
    int st = lazy_join(rank, nranks, dir, "IB_CONNECT=lazy", rank ? "not-the-token" : "the-token",
                       30000, &store, &comm);
    double ms = th_now_ms() - t0;
    const char *msg = tutti_comm_last_error(NULL);
    fprintf(stderr, "rank %d: %s after %.0f ms: %s\n", rank, tutti_status_name(st), ms, msg);
    FAIL_IF(st != TUTTI_ERR_AUTH, "got %s, want TUTTI_ERR_AUTH: %s", tutti_status_name(st), msg);
    FAIL_IF(!strstr(msg, "has another job secret than this rank's") ||
                !strstr(msg, "TUTTI_AUTH_TOKEN"),
            "message: %s", msg);
    FAIL_IF(ms > 15000, "took %.0f ms (timeout 30000)", ms);
    if (comm)
        tutti_comm_destroy(comm);
    if (store)
        tutti_store_close(store);
    return 0;
}

START_TEST(lazy_other_secret_refused)
{
    th_spec_t spec = {
        .nranks = 2, .fn = rank_lazy_secret, .timeout_ms = 90000, .flags = TH_NO_COMM
    };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* One rank lazy, one eager, through the transport ABI (through the library, the lazy
 * rank's init ends on the eager rank's failed set-up, which says why): the eager rank's
 * create fails at once naming the lazy rank and TUTTI_IB_CONNECT, and the lazy rank's
 * first send to it fails so too. */
static int rank_lazy_mixed(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused, (void)arg;
    th_host_t t;
    void *tp = NULL;
    FAIL_IF(th_host_open(&t, dir, "abi/", rank, nranks, 30000) != 0, "store");
    t.knobs = rank ? "IB_CONNECT=eager" : "IB_CONNECT=lazy";
    double t0 = th_now_ms();
    int st = IBOPS->create(&t.h, &tp);
    if (rank == 1) {
        FAIL_IF(st != TUTTI_ERR_CONFIG, "eager rank: create %s: %s", tutti_status_name(st), t.err);
    } else {
        FAIL_IF(st != TUTTI_OK, "lazy rank: create %s: %s", tutti_status_name(st), t.err);
        int32_t v = 1;
        tutti_tp_req_v2_t r;
        req_init(&r, 1, &v, sizeof(v), 1);
        /* fails at the post where rank 1's record is in the store by then */
        if (IBOPS->post_send(tp, &r) == 0)
            drive2(tp, &r, NULL, 20000);
        FAIL_IF(r.status != TUTTI_ERR_CONFIG, "lazy rank: send %s: %s", tutti_status_name(r.status),
                t.err);
        IBOPS->destroy(tp);
    }
    fprintf(stderr, "rank %d: %s\n", rank, t.err);
    FAIL_IF(!strstr(t.err, "TUTTI_IB_CONNECT") || !strstr(t.err, rank ? "rank 0" : "rank 1"),
            "message: %s", t.err);
    FAIL_IF(th_now_ms() - t0 > 15000, "took %.0f ms (timeout 30000)", th_now_ms() - t0);
    th_host_close(&t);
    return 0;
}

START_TEST(lazy_and_eager_refuse_each_other)
{
    run_pair(rank_lazy_mixed, NULL, 90000, TH_NO_COMM | TH_NO_KILL_ON_FAIL, NULL);
}
END_TEST

/* Lazily, a rank gone before anyone asked it: a call to it fails with the timeout,
 * naming it (no datagram says "gone": UD has no refusal), not later. */
static int rank_lazy_gone(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused, (void)arg;
    tutti_store_t *store;
    tutti_comm_t *comm;
    int st = lazy_join(rank, nranks, dir, "IB_CONNECT=lazy", NULL, 4000, &store, &comm);
    FAIL_IF(st != TUTTI_OK, "init: %s", tutti_status_name(st));
    if (rank == 1) {
        tutti_comm_destroy(comm);
        tutti_store_set(store, "iblazygone", "1", 1);
        tutti_store_close(store);
        return 0;
    }
    void *v = NULL;
    size_t vlen = 0;
    FAIL_IF(tutti_store_get(store, "iblazygone", &v, &vlen, 60000) != 0, "rank 1 never left");
    free(v);
    int32_t x = 1;
    double t0 = th_now_ms();
    st = tutti_send(comm, &x, 1, TUTTI_INT32, 1, 3);
    double ms = th_now_ms() - t0;
    const char *msg = tutti_comm_last_error(comm);
    fprintf(stderr, "rank 0: %s after %.0f ms: %s\n", tutti_status_name(st), ms, msg);
    FAIL_IF(st == TUTTI_OK, "a send to a gone rank succeeded");
    FAIL_IF(!strstr(msg, "rank 1"), "message: %s", msg);
    FAIL_IF(ms > 4000 + 3000, "took %.0f ms (timeout 4000)", ms);
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

START_TEST(lazy_call_to_a_gone_rank_times_out)
{
    th_spec_t spec = {
        .nranks = 2, .fn = rank_lazy_gone, .timeout_ms = 90000, .flags = TH_NO_COMM
    };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* TUTTI_IB_EAGER_BYTES of 8250 on rank 0 and 8200 on rank 1: the same 64-byte rounded
 * slots, so set-up agrees; a message of 8240 bytes goes eager from rank 0, and rank 1
 * takes it (before, rank 1 judged it by its own 8200 and failed the communicator with
 * "garbage from rank 0"); a receiver bounds an eager message by its slot. */
static int rank_eager_bucket(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused, (void)arg;
    tutti_store_t *store;
    tutti_comm_t *comm;
    int st = lazy_join(rank, nranks, dir, rank ? "IB_EAGER_BYTES=8200" : "IB_EAGER_BYTES=8250",
                       NULL, 20000, &store, &comm);
    FAIL_IF(st != TUTTI_OK, "init: %s: %s", tutti_status_name(st), tutti_comm_last_error(NULL));
    enum { N = 8240 };
    unsigned char buf[N];
    for (int round = 0; round < 2; round++) {
        int sender = round; /* both ways: 8240 goes eager one way, by READ the other */
        if (rank == sender) {
            for (int i = 0; i < N; i++)
                buf[i] = (unsigned char)(i * 7 + round);
            st = tutti_send(comm, buf, N, TUTTI_UINT8, 1 - rank, 5);
        } else {
            memset(buf, 0, sizeof(buf));
            st = tutti_recv(comm, buf, N, TUTTI_UINT8, 1 - rank, 5);
        }
        FAIL_IF(st != TUTTI_OK, "round %d: %s: %s", round, tutti_status_name(st),
                tutti_comm_last_error(comm));
        if (rank != sender)
            for (int i = 0; i < N; i++)
                FAIL_IF(buf[i] != (unsigned char)(i * 7 + round), "round %d: byte %d is %u", round,
                        i, buf[i]);
    }
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

START_TEST(eager_limits_in_one_slot_size)
{
    th_spec_t spec = {
        .nranks = 2, .fn = rank_eager_bucket, .timeout_ms = 90000, .flags = TH_NO_COMM
    };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* TUTTI_IB_MAX_RD_ATOMIC=1 on rank 0 only, eager and lazy: rank 0's queue pair issues and
 * takes one RDMA READ in flight, and rank 1's, which may issue more, issues one toward
 * rank 0 (its peer's responder resources, from the address record: before, each side
 * used its own device's numbers, and a peer's device with fewer got more reads in flight
 * than it had resources for); rank 1 still takes its own device's count. 2 MiB each way
 * (several READs at once) checked byte for byte. */
static int rank_rd_atomic(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    char opts[64];
    snprintf(opts, sizeof(opts), "%sIB_CONNECT=%s", rank ? "" : "IB_MAX_RD_ATOMIC=1,",
             (const char *)arg);
    tutti_store_t *store;
    tutti_comm_t *comm;
    int st = lazy_join(rank, nranks, dir, opts, NULL, 20000, &store, &comm);
    FAIL_IF(st != TUTTI_OK, "init (%s): %s: %s", opts, tutti_status_name(st),
            tutti_comm_last_error(NULL));
    enum { N = 2 << 20 };
    unsigned char *buf = malloc(N);
    FAIL_IF(!buf, "malloc");
    for (int round = 0; round < 2; round++) {
        int sender = round;
        if (rank == sender) {
            for (int i = 0; i < N; i++)
                buf[i] = (unsigned char)(i * 13 + i / 4099 + round);
            st = tutti_send(comm, buf, N, TUTTI_UINT8, 1 - rank, 6);
        } else {
            memset(buf, 0, N);
            st = tutti_recv(comm, buf, N, TUTTI_UINT8, 1 - rank, 6);
        }
        FAIL_IF(st != TUTTI_OK, "round %d: %s: %s", round, tutti_status_name(st),
                tutti_comm_last_error(comm));
        if (rank != sender)
            for (int i = 0; i < N; i++)
                FAIL_IF(buf[i] != (unsigned char)(i * 13 + i / 4099 + round),
                        "round %d: byte %d is %u", round, i, buf[i]);
    }
    int init = -1, resp = -1;
    FAIL_IF(tt_ib_debug_qp_rd_atomic(NULL, 1 - rank, &init, &resp) != TUTTI_OK, "query_qp");
    if (rank == 0)
        FAIL_IF(init != 1 || resp != 1, "rank 0 (capped at 1): issues %d, takes %d", init, resp);
    else
        FAIL_IF(init != 1 || resp < 2, "rank 1: issues %d (rank 0 takes 1), takes %d", init, resp);
    free(buf);
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

START_TEST(rd_atomic_within_the_peers)
{
    th_spec_t spec = { .nranks = 2,
                       .fn = rank_rd_atomic,
                       .arg = _i ? "lazy" : "eager",
                       .timeout_ms = 90000,
                       .flags = TH_NO_COMM };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

int main(void)
{
    int nactive = 0;
    int ndev = device_count(&nactive);
    /* these tests are about ibverbs whatever the environment says */
    setenv("TUTTI_TRANSPORT", "ibverbs", 1);
    Suite *s = suite_create("ibverbs");
    TCase *tc = tcase_create("no_device");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, no_device);
    suite_add_tcase(s, tc);
    if (nactive > 0) {
        tc = tcase_create("mr_cache");
        tcase_set_timeout(tc, 240);
        tcase_add_test(tc, mr_cache_hits_misses);
        tcase_add_test(tc, mr_cache_invalidate_on_free);
        tcase_add_test(tc, mr_cache_comm);
        suite_add_tcase(s, tc);
        tc = tcase_create("errors");
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, qp_error);
        tcase_add_loop_test(tc, rdv_cancel, RDV_CANCEL, RDV_BREAK + 1);
        tcase_add_test(tc, mismatch_after_rts);
        tcase_add_test(tc, cancel_reading);
        tcase_add_test(tc, eager_limits_in_one_slot_size);
        tcase_add_loop_test(tc, rd_atomic_within_the_peers, 0, 2);
        suite_add_tcase(s, tc);
        tc = tcase_create("lazy");
        tcase_set_timeout(tc, 240);
        tcase_add_test(tc, lazy_qps_at_first_use);
        tcase_add_test(tc, lazy_answering_rank_writes_after_the_hello);
        tcase_add_test(tc, lazy_other_secret_refused);
        tcase_add_test(tc, lazy_and_eager_refuse_each_other);
        tcase_add_test(tc, lazy_call_to_a_gone_rank_times_out);
        suite_add_tcase(s, tc);
        tc = tcase_create("matrix");
        tcase_set_timeout(tc, 300);
        tcase_add_loop_test(tc, matrix, 2, 5);
        suite_add_tcase(s, tc);
    }
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (failed)
        return 1;
    if (nactive == 0) {
        printf("SKIP: no ibverbs device on this host (%s): TUTTI_TRANSPORT=ibverbs fails "
               "with TUTTI_ERR_NO_DEVICE as it should; the cache, QP-error and matrix tests "
               "need a device (tests/rdma/ci.sh runs them on soft-RoCE in a VM)\n",
               ndev ? "none with an active port" : "libibverbs lists none");
        return 77;
    }
    return 0;
}
