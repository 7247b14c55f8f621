/* The transport ABI contract (include/tutti/transport_v1.h, transport_v2.h), checked
 * through the ops table alone, for every transport: tcp, shm and ibverbs as built in
 * (ibverbs only where a device exists), the tcp and shm plugins built from the tree, and
 * the tcp sources built as an ABI v1 plugin (through the loader's shim). Two ranks, each
 * a process with a fake host (fake_host.h) over a file store. Checked: per-peer message
 * order with envelopes, zero-length messages, bad requests, envelope and length
 * mismatches, cancel_all, notify_error, abort, progress timeouts, a killed peer, and
 * probe (the optional slot: messages that arrived before their receive, consuming
 * nothing), arm (the optional slot: a descriptor to sleep on outside progress()); after
 * every shm run, that /dev/shm holds none of its segments. */
#include <check.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tutti/transport_v2.h>
#include <tutti/tutti.h>

#include "fake_host.h"
#include "harness.h"
#include "plugin/transport.h"

typedef struct conf_tp {
    const char *label;
    const char *name; /* a built-in, or NULL: load `file` */
    const char *file;
} conf_tp_t;

static const conf_tp_t tps[] = {
    { "tcp", "tcp", NULL },
    { "shm", "shm", NULL },
    { "ibverbs", "ibverbs", NULL },
    { "tcp plugin", NULL, TT_BUILD_DIR "/lib/libtutti-transport-tcp.so" },
    { "shm plugin", NULL, TT_BUILD_DIR "/lib/libtutti-transport-shm.so" },
    { "tcp ABI v1 plugin", NULL, TT_BUILD_DIR "/tests/libtutti-transport-tcpv1.so" },
};
#define NTPS ((int)(sizeof(tps) / sizeof(tps[0])))

#define SKIP_CODE 77 /* a rank's exit code: no device for this transport here */

/* One rank's view: the table, the instance, its host. */
typedef struct conf {
    const tutti_transport_ops_v2_t *ops;
    void *handle;
    void *tp;
    th_host_t host;
    const char *label;
} conf_t;

static int conf_load(const conf_tp_t *c, const tutti_transport_ops_v2_t **ops_p, void **handle_p)
{
    char err[1024];
    int st = c->name ? tt_transport_load(c->name, "/nonexistent", ops_p, handle_p, err, sizeof(err))
                     : tt_transport_load_file(c->file, ops_p, handle_p, err, sizeof(err));
    if (st < 0)
        fprintf(stderr, "%s: %s\n", c->label, err);
    return st;
}

/* Load and connect; SKIP_CODE when the transport has no device here. */
static int conf_open(conf_t *cf, const conf_tp_t *c, const char *dir, int rank, int nranks,
                     const char *knobs)
{
    memset(cf, 0, sizeof(*cf));
    cf->label = c->label;
    if (conf_load(c, &cf->ops, &cf->handle) < 0)
        return 1;
    if (th_host_open(&cf->host, dir, "conf/", rank, nranks, 10000) != 0)
        return 1;
    cf->host.knobs = knobs;
    int st = cf->ops->create(&cf->host.h, &cf->tp);
    if (st == TUTTI_ERR_NO_DEVICE)
        return SKIP_CODE;
    if (st < 0) {
        fprintf(stderr, "rank %d: %s: create: %s: %s\n", rank, c->label, tutti_status_name(st),
                cf->host.err);
        return 1;
    }
    return 0;
}

static void conf_close(conf_t *cf)
{
    if (cf->tp)
        cf->ops->destroy(cf->tp);
    th_host_close(&cf->host);
    tt_transport_unload(cf->handle);
}

/* envelope (seq, 0xc0ffee, len, tag) */
#define req_set(r, peer, buf, len, seq, tag) th_req_set(r, peer, buf, len, seq, 0xc0ffee, tag)

/* Progress until every request of reqs[n] is done or failed, or ms pass. */
static void drive(conf_t *cf, tutti_tp_req_v2_t *reqs, int n, int ms)
{
    double end = th_now_ms() + ms;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < n; i++)
            pending += reqs[i].status == 1;
        if (!pending || th_now_ms() >= end)
            return;
        if (cf->ops->progress(cf->tp, 50) < 0)
            return;
    }
}

/* Both ranks reach this point (through the store, not the transport). */
static void barrier(conf_t *cf, const char *name)
{
    int64_t v = 0;
    char key[64];
    snprintf(key, sizeof(key), "bar/%s", name);
    tutti_store_add(cf->host.store, key, 1, &v);
    while (v < cf->host.h.nranks) {
        th_sleep_ms(2);
        tutti_store_add(cf->host.store, key, 0, &v);
    }
}

typedef int (*conf_body_fn)(conf_t *cf, int rank);

typedef struct conf_arg {
    const conf_tp_t *tp;
    conf_body_fn body;
    int *pids; /* shared with the ranks: their processes, for th_shm_leftovers */
    const char *knobs;
} conf_arg_t;

static int conf_rank(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *varg)
{
    (void)comm;
    conf_arg_t *a = varg;
    a->pids[rank] = getpid();
    conf_t cf;
    int rc = conf_open(&cf, a->tp, dir, rank, nranks, a->knobs);
    if (rc == 0)
        rc = a->body(&cf, rank);
    conf_close(&cf);
    return rc;
}

static int body_arm(conf_t *cf, int rank);

/* Run body on two ranks over transport i; the killed-peer case lets rank 1 die. */
static void conf_run(int i, conf_body_fn body, int peer_dies)
{
    const tutti_transport_ops_v2_t *ops;
    void *h = NULL;
    if ((tps[i].file && access(tps[i].file, R_OK) != 0) || conf_load(&tps[i], &ops, &h) < 0) {
        fprintf(stderr, "SKIP %s: not built here\n", tps[i].label);
        return;
    }
    tt_transport_unload(h);
    static int *pids;
    if (!pids)
        pids = th_shared_zeroed(2 * sizeof(*pids));
    pids[0] = pids[1] = 0;
    time_t since = time(NULL) - 1;
    /* arm's sleeps must end by a wake-up, not by shm's liveness checks (every 100 ms) or
     * ibverbs' keepalive probes (every second) */
    conf_arg_t a = { .tp = &tps[i],
                     .body = body,
                     .pids = pids,
                     .knobs = body == body_arm
                                  ? "SOCKET_IFNAME=lo,SHM_LIVENESS_MS=60000,IB_KEEPALIVE_MS=60000"
                                  : "SOCKET_IFNAME=lo" };
    th_spec_t spec = { .nranks = 2,
                       .fn = conf_rank,
                       .arg = &a,
                       .timeout_ms = 60000,
                       .flags = TH_NO_COMM | (peer_dies ? TH_NO_KILL_ON_FAIL : 0) };
    int codes[2];
    th_run_ex(&spec, codes);
    if (codes[0] == SKIP_CODE || codes[1] == SKIP_CODE) { /* the other may be killed */
        fprintf(stderr, "SKIP %s: no device here\n", tps[i].label);
        return;
    }
    ck_assert_msg(codes[0] == 0, "%s: rank 0 exited %d", tps[i].label, codes[0]);
    if (peer_dies)
        ck_assert_msg(codes[1] == 128 + SIGKILL, "%s: rank 1 exited %d", tps[i].label, codes[1]);
    else
        ck_assert_msg(codes[1] == 0, "%s: rank 1 exited %d", tps[i].label, codes[1]);
    /* the shm transports unlink their segments once both ranks mapped them: nothing stays
     * in /dev/shm, even after a rank was killed */
    if (strstr(tps[i].label, "shm"))
        ck_assert_msg(th_shm_leftovers(pids, 2, since) == 0, "%s: segments left in /dev/shm",
                      tps[i].label);
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__);                         \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " (last error: %s)\n", cf->host.err);                                  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* ---- message order per peer, with envelopes and lengths; zero-length messages ---- */

#define ORDER_N 40

static size_t order_len(int k)
{
    static const size_t lens[] = { 0, 1, 7, 0, 4096, 65536, 3, 1 << 20, 0, 100 };
    return lens[k % 10];
}

static int body_order(conf_t *cf, int rank)
{
    int peer = 1 - rank;
    static tutti_tp_req_v2_t s[ORDER_N], r[ORDER_N];
    static unsigned char *sbuf[ORDER_N], *rbuf[ORDER_N];
    for (int k = 0; k < ORDER_N; k++) {
        size_t len = order_len(k);
        sbuf[k] = malloc(len + 1);
        rbuf[k] = calloc(1, len + 1);
        for (size_t j = 0; j < len; j++)
            sbuf[k][j] = (unsigned char)(j * 31 + (size_t)k + (size_t)rank);
        /* zero-length: a NULL buffer is allowed too */
        req_set(&s[k], peer, len || k % 20 ? sbuf[k] : NULL, len, (uint64_t)k, 500 + k);
        req_set(&r[k], peer, rbuf[k], len, (uint64_t)k, 500 + k);
    }
    /* both directions at once; half the receives before the sends, half after */
    for (int k = 0; k < ORDER_N / 2; k++)
        CHECK(cf->ops->post_recv(cf->tp, &r[k]) == 0, "post_recv %d", k);
    for (int k = 0; k < ORDER_N; k++)
        CHECK(cf->ops->post_send(cf->tp, &s[k]) == 0, "post_send %d", k);
    for (int k = ORDER_N / 2; k < ORDER_N; k++)
        CHECK(cf->ops->post_recv(cf->tp, &r[k]) == 0, "post_recv %d", k);
    drive(cf, s, ORDER_N, 20000);
    drive(cf, r, ORDER_N, 20000);
    for (int k = 0; k < ORDER_N; k++) {
        size_t len = order_len(k);
        CHECK(s[k].status == 0, "send %d: status %d", k, s[k].status);
        CHECK(r[k].status == 0, "receive %d: status %d", k, r[k].status);
        CHECK(r[k].got_len == len && r[k].got_env[0] == (uint64_t)k &&
                  r[k].got_env[3] == 500u + (unsigned)k,
              "receive %d: got len %zu seq %llu tag %llu", k, r[k].got_len,
              (unsigned long long)r[k].got_env[0], (unsigned long long)r[k].got_env[3]);
        for (size_t j = 0; j < len; j++)
            CHECK(rbuf[k][j] == (unsigned char)(j * 31 + (size_t)k + (size_t)peer),
                  "receive %d: byte %zu", k, j);
        free(sbuf[k]);
        free(rbuf[k]);
    }
    barrier(cf, "order");
    return 0;
}

/* ---- bad requests are refused at post, with the status in the request ---- */

static int body_bad_requests(conf_t *cf, int rank)
{
    char buf[8];
    tutti_tp_req_v2_t r;
    req_set(&r, rank, buf, 8, 0, 0); /* this rank itself */
    CHECK(cf->ops->post_recv(cf->tp, &r) == TUTTI_ERR_INVALID_ARG, "to self");
    CHECK(r.status == TUTTI_ERR_INVALID_ARG, "status %d", r.status);
    req_set(&r, 5, buf, 8, 0, 0);
    CHECK(cf->ops->post_send(cf->tp, &r) == TUTTI_ERR_INVALID_ARG, "out of range");
    req_set(&r, 1 - rank, NULL, 8, 0, 0);
    CHECK(cf->ops->post_send(cf->tp, &r) == TUTTI_ERR_INVALID_ARG, "NULL buffer");
    /* v2: memory kinds the transport does not take, and streams, are refused */
    req_set(&r, 1 - rank, buf, 8, 0, 0);
    r.mem = TUTTI_MEM_CUDA;
    CHECK(!(cf->ops->props.mem_kinds & TUTTI_MEM_BIT(TUTTI_MEM_CUDA)), "takes CUDA memory?");
    CHECK(cf->ops->post_send(cf->tp, &r) == TUTTI_ERR_UNSUPPORTED, "CUDA memory");
    CHECK(r.status == TUTTI_ERR_UNSUPPORTED, "status %d", r.status);
    req_set(&r, 1 - rank, buf, 8, 0, 0);
    r.stream = &r;
    CHECK(cf->ops->post_recv(cf->tp, &r) == TUTTI_ERR_UNSUPPORTED, "a stream");
    /* none of it touched the link: a message still goes */
    req_set(&r, 1 - rank, buf, 8, 1, 1);
    CHECK((rank ? cf->ops->post_recv : cf->ops->post_send)(cf->tp, &r) == 0, "post");
    drive(cf, &r, 1, 10000);
    CHECK(r.status == 0, "status %d", r.status);
    barrier(cf, "bad");
    return 0;
}

/* ---- envelope and length mismatches: TUTTI_ERR_MISMATCH, what arrived, no payload ---- */

/* rank 0 sends 16 bytes (seq 7, tag 100); rank 1 expects tag `tag` and rlen bytes */
static int mismatch(conf_t *cf, int rank, uint64_t tag, size_t rlen)
{
    char data[64] = "hello", got[64] = { 0 };
    tutti_tp_req_v2_t r;
    if (rank == 0) {
        req_set(&r, 1, data, 16, 7, 100);
        CHECK(cf->ops->post_send(cf->tp, &r) == 0, "post_send");
        drive(cf, &r, 1, 10000);
    } else {
        req_set(&r, 0, got, rlen, 7, tag);
        r.env[2] = 16; /* the envelope's count agrees */
        CHECK(cf->ops->post_recv(cf->tp, &r) == 0, "post_recv");
        drive(cf, &r, 1, 10000);
        CHECK(r.status == TUTTI_ERR_MISMATCH, "status %d", r.status);
        CHECK(r.got_len == 16 && r.got_env[0] == 7 && r.got_env[1] == 0xc0ffee &&
                  r.got_env[3] == 100,
              "got len %zu env %llu %llx %llu", r.got_len, (unsigned long long)r.got_env[0],
              (unsigned long long)r.got_env[1], (unsigned long long)r.got_env[3]);
        CHECK(got[0] == 0, "payload written on a mismatch");
    }
    barrier(cf, "mismatch");
    return 0;
}

static int body_mismatch(conf_t *cf, int rank)
{
    return mismatch(cf, rank, 101, 16);
}
static int body_len_mismatch(conf_t *cf, int rank)
{
    return mismatch(cf, rank, 100, 24);
}

/* ---- cancel_all: posted requests fail with its status; a link at a message boundary
 * stays usable ---- */

static int body_cancel(conf_t *cf, int rank)
{
    char buf[32] = "x", got[32];
    tutti_tp_req_v2_t r[3];
    if (rank == 1) {
        req_set(&r[0], 0, got, 32, 1, 1); /* nothing is sent for these */
        req_set(&r[1], 0, got, 32, 2, 1);
        CHECK(cf->ops->post_recv(cf->tp, &r[0]) == 0 && cf->ops->post_recv(cf->tp, &r[1]) == 0,
              "post_recv");
        cf->ops->progress(cf->tp, 20);
        cf->ops->cancel_all(cf->tp, TUTTI_ERR_ABORTED);
        CHECK(r[0].status == TUTTI_ERR_ABORTED && r[1].status == TUTTI_ERR_ABORTED,
              "statuses %d %d", r[0].status, r[1].status);
    }
    barrier(cf, "cancelled");
    req_set(&r[2], 1 - rank, rank ? got : buf, 32, 9, 9);
    CHECK((rank ? cf->ops->post_recv : cf->ops->post_send)(cf->tp, &r[2]) == 0, "post");
    drive(cf, &r[2], 1, 10000);
    CHECK(r[2].status == 0, "after cancel_all: status %d", r[2].status);
    if (rank)
        CHECK(!strcmp(got, "x"), "payload");
    barrier(cf, "cancel");
    return 0;
}

/* ---- notify_error reaches a peer's pending receive with the status and message, after
 * what was sent before it; later posts on that link fail at once ---- */

static int body_notify(conf_t *cf, int rank)
{
    char buf[8] = "m";
    tutti_tp_req_v2_t r;
    req_set(&r, 1 - rank, buf, 8, 1, 1); /* one good message first */
    CHECK((rank ? cf->ops->post_recv : cf->ops->post_send)(cf->tp, &r) == 0, "post");
    drive(cf, &r, 1, 10000);
    CHECK(r.status == 0, "the message before the report: status %d", r.status);
    if (rank == 0) {
        th_sleep_ms(200); /* rank 1 waits in its second receive by now */
        cf->ops->notify_error(cf->tp, TUTTI_ERR_MISMATCH, "rank 0 saw something odd: boom");
    } else {
        req_set(&r, 0, buf, 8, 2, 1);
        CHECK(cf->ops->post_recv(cf->tp, &r) == 0, "post_recv");
        double t0 = th_now_ms();
        drive(cf, &r, 1, 10000);
        double dt = th_now_ms() - t0;
        CHECK(r.status == TUTTI_ERR_MISMATCH, "status %d after %.0f ms", r.status, dt);
        CHECK(dt < 5000, "took %.0f ms", dt);
        CHECK(strstr(cf->host.err, "boom") && cf->host.err_peer == 0, "error: peer %d: %s",
              cf->host.err_peer, cf->host.err);
        req_set(&r, 0, buf, 8, 3, 1);
        CHECK(cf->ops->post_recv(cf->tp, &r) < 0 && r.status < 0,
              "a post after the report succeeded");
    }
    barrier(cf, "notify");
    return 0;
}

/* ---- progress() timeouts; abort() from another thread wakes a blocked progress() ---- */

typedef struct aborter {
    conf_t *cf;
    int delay_ms;
} aborter_t;

static void *abort_later(void *arg)
{
    aborter_t *a = arg;
    th_sleep_ms(a->delay_ms);
    a->cf->ops->abort(a->cf->tp);
    return NULL;
}

static int body_timeouts(conf_t *cf, int rank)
{
    char buf[8];
    tutti_tp_req_v2_t r;
    req_set(&r, 1 - rank, buf, 8, 1, 1); /* never sent */
    CHECK(cf->ops->post_recv(cf->tp, &r) == 0, "post_recv");
    double t0 = th_now_ms();
    CHECK(cf->ops->progress(cf->tp, 0) == 0, "progress(0)");
    CHECK(th_now_ms() - t0 < 100, "progress(0) took %.0f ms", th_now_ms() - t0);
    t0 = th_now_ms();
    CHECK(cf->ops->progress(cf->tp, 150) == 0, "progress(150)");
    double dt = th_now_ms() - t0;
    CHECK(dt < 1500, "progress(150) took %.0f ms", dt);
    CHECK(r.status == 1, "status %d with nothing sent", r.status);
    barrier(cf, "timeouts");
    aborter_t a = { cf, 300 };
    pthread_t th;
    CHECK(pthread_create(&th, NULL, abort_later, &a) == 0, "pthread_create");
    t0 = th_now_ms();
    int st = cf->ops->progress(cf->tp, 20000);
    dt = th_now_ms() - t0;
    pthread_join(th, NULL);
    CHECK(st == TUTTI_ERR_ABORTED, "progress gave %d after %.0f ms", st, dt);
    CHECK(dt >= 250 && dt < 2000, "progress returned after %.0f ms (abort at 300)", dt);
    CHECK(r.status == TUTTI_ERR_ABORTED, "request status %d", r.status);
    CHECK(cf->ops->progress(cf->tp, 1000) == TUTTI_ERR_ABORTED, "not aborted for good");
    barrier(cf, "aborted");
    return 0;
}

/* ---- a killed peer: the pending receive fails with TUTTI_ERR_PEER, in bounded time ---- */

static int body_peer_killed(conf_t *cf, int rank)
{
    char buf[8] = "m";
    tutti_tp_req_v2_t r;
    req_set(&r, 1 - rank, buf, 8, 1, 1);
    CHECK((rank ? cf->ops->post_send : cf->ops->post_recv)(cf->tp, &r) == 0, "post");
    drive(cf, &r, 1, 10000);
    CHECK(r.status == 0, "the message before the kill: status %d", r.status);
    if (rank == 1) {
        barrier(cf, "sent");
        raise(SIGKILL);
    }
    req_set(&r, 1, buf, 8, 2, 1);
    CHECK(cf->ops->post_recv(cf->tp, &r) == 0, "post_recv");
    barrier(cf, "sent");
    double t0 = th_now_ms();
    drive(cf, &r, 1, 20000);
    double dt = th_now_ms() - t0;
    CHECK(r.status == TUTTI_ERR_PEER, "status %d after %.0f ms", r.status, dt);
    CHECK(dt < 10000, "noticed after %.0f ms", dt);
    CHECK(cf->host.err_peer == 1 && strstr(cf->host.err, "rank 1"), "error: peer %d: %s",
          cf->host.err_peer, cf->host.err);
    return 0;
}

/* ---- probe: the next arrived message of a peer whose receive is not posted, its
 * envelope and length, nothing consumed; nothing for a posted receive or no message ---- */

/* Progress and probe peer until it finds a message (1), fails, or 5 s pass (0). */
static int probe_wait(conf_t *cf, int peer, tutti_tp_probe_t *m)
{
    double end = th_now_ms() + 5000;
    int st;
    while ((st = cf->ops->probe(cf->tp, peer, m)) == 0 && th_now_ms() < end)
        cf->ops->progress(cf->tp, 10);
    return st;
}

static int body_probe(conf_t *cf, int rank)
{
    int has = tutti_tp_ops_has(cf->ops, probe) && cf->ops->probe;
    /* every v2 transport of the tree probes; a v1 plugin cannot (the shim leaves it NULL) */
    CHECK(has == !strstr(cf->label, "ABI v1"), "%s: probe slot %s", cf->label,
          has ? "set" : "missing");
    if (!has) {
        barrier(cf, "probe");
        return 0;
    }
    /* with channels (TUTTI_TP_CHANNELS) probe reports channel 1's messages only */
    const uint64_t ch = (cf->ops->props.flags & TUTTI_TP_CHANNELS) ? 1ull << 63 : 0;
    char a[24] = "first message", b[8] = "second", got[24] = { 0 };
    char c0[40] = "a collective's, in front", c1[16] = "behind it", got2[40] = { 0 };
    tutti_tp_req_v2_t r[2];
    tutti_tp_probe_t m;
    if (rank == 0) {
        barrier(cf, "probe empty");
        req_set(&r[0], 1, a, sizeof(a), 1, 77 | ch);
        req_set(&r[1], 1, b, sizeof(b), 2, 78 | ch);
        CHECK(cf->ops->post_send(cf->tp, &r[0]) == 0 && cf->ops->post_send(cf->tp, &r[1]) == 0,
              "post_send");
        drive(cf, r, 2, 10000);
        CHECK(r[0].status == 0 && r[1].status == 0, "sends: %d %d", r[0].status, r[1].status);
        barrier(cf, "probe");
        if (ch) {
            req_set(&r[0], 1, c0, sizeof(c0), 3, 79);
            req_set(&r[1], 1, c1, sizeof(c1), 4, 80 | ch);
            CHECK(cf->ops->post_send(cf->tp, &r[0]) == 0 && cf->ops->post_send(cf->tp, &r[1]) == 0,
                  "post_send");
            drive(cf, r, 2, 10000);
            CHECK(r[0].status == 0 && r[1].status == 0, "sends: %d %d", r[0].status, r[1].status);
            barrier(cf, "channels");
        }
        if (cf->ops->props.flags & TUTTI_TP_PROBE_ANY) { /* key 82, then (later) 81 */
            barrier(cf, "any posted");
            req_set(&r[0], 1, c1, sizeof(c1), 5, 82 | ch);
            CHECK(cf->ops->post_send(cf->tp, &r[0]) == 0, "post_send");
            drive(cf, r, 1, 10000);
            barrier(cf, "any found");
            req_set(&r[1], 1, b, sizeof(b), 6, 81 | ch);
            CHECK(cf->ops->post_send(cf->tp, &r[1]) == 0, "post_send");
            drive(cf, &r[1], 1, 10000);
            CHECK(r[0].status == 0 && r[1].status == 0, "sends: %d %d", r[0].status, r[1].status);
            barrier(cf, "any");
        }
        return 0;
    }
    cf->ops->progress(cf->tp, 50);
    CHECK(cf->ops->probe(cf->tp, 0, &m) == 0, "a message before any was sent");
    CHECK(cf->ops->probe(cf->tp, 1, &m) == TUTTI_ERR_INVALID_ARG, "probe of this rank");
    CHECK(cf->ops->probe(cf->tp, 5, &m) == TUTTI_ERR_INVALID_ARG, "probe out of range");
    barrier(cf, "probe empty");
    for (int k = 0; k < 2; k++) { /* twice: the first probe consumed nothing */
        memset(&m, 0, sizeof(m));
        CHECK(probe_wait(cf, 0, &m) == 1, "probe %d found nothing", k);
        CHECK(m.len == sizeof(a) && m.env[0] == 1 && m.env[1] == 0xc0ffee &&
                  m.env[2] == sizeof(a) && m.env[3] == (77 | ch),
              "probe %d: len %zu env %llu %llx %llu %llu", k, m.len, (unsigned long long)m.env[0],
              (unsigned long long)m.env[1], (unsigned long long)m.env[2],
              (unsigned long long)m.env[3]);
    }
    req_set(&r[0], 0, got, sizeof(a), 1, 77 | ch);
    CHECK(cf->ops->post_recv(cf->tp, &r[0]) == 0, "post_recv");
    CHECK(cf->ops->probe(cf->tp, 0, &m) == 0, "a message for a posted receive");
    drive(cf, r, 1, 10000);
    CHECK(r[0].status == 0 && !memcmp(got, a, sizeof(a)), "first: status %d", r[0].status);
    CHECK(probe_wait(cf, 0, &m) == 1 && m.len == sizeof(b) && m.env[0] == 2 &&
              m.env[3] == (78 | ch),
          "second: len %zu seq %llu", m.len, (unsigned long long)m.env[0]);
    req_set(&r[1], 0, got, sizeof(b), 2, 78 | ch);
    CHECK(cf->ops->post_recv(cf->tp, &r[1]) == 0, "post_recv");
    drive(cf, &r[1], 1, 10000);
    CHECK(r[1].status == 0 && !memcmp(got, b, sizeof(b)), "second: status %d", r[1].status);
    cf->ops->progress(cf->tp, 20);
    CHECK(cf->ops->probe(cf->tp, 0, &m) == 0, "a third message?");
    barrier(cf, "probe");
    if (!ch)
        return 0;
    /* a channel-0 message in front, no receive posted: the probe reads it aside and
     * reports the channel-1 message behind it; each receive then gets its own, the
     * channel-1 one first */
    CHECK(probe_wait(cf, 0, &m) == 1 && m.len == sizeof(c1) && m.env[0] == 4 &&
              m.env[3] == (80 | ch),
          "behind a channel-0 message: len %zu seq %llu", m.len, (unsigned long long)m.env[0]);
    memset(got, 0, sizeof(got));
    req_set(&r[0], 0, got, sizeof(c1), 4, 80 | ch);
    CHECK(cf->ops->post_recv(cf->tp, &r[0]) == 0, "post_recv");
    drive(cf, r, 1, 10000);
    CHECK(r[0].status == 0 && !memcmp(got, c1, sizeof(c1)), "channel 1: status %d", r[0].status);
    req_set(&r[1], 0, got2, sizeof(c0), 3, 79);
    CHECK(cf->ops->post_recv(cf->tp, &r[1]) == 0, "post_recv");
    drive(cf, &r[1], 1, 10000);
    CHECK(r[1].status == 0 && !memcmp(got2, c0, sizeof(c0)), "channel 0: status %d", r[1].status);
    barrier(cf, "channels");
    if (!(cf->ops->props.flags & TUTTI_TP_PROBE_ANY))
        return 0;
    /* any key (TUTTI_TP_PROBE_ANY: env[3] 0 on input): a receive of key 81 posted, the
     * probe reports the key-82 message that came meanwhile (not nothing, as for a posted
     * receive of its own key); its receive takes it, then 81's comes */
    memset(got, 0, sizeof(got));
    memset(got2, 0, sizeof(got2));
    req_set(&r[0], 0, got2, sizeof(b), 6, 81 | ch);
    CHECK(cf->ops->post_recv(cf->tp, &r[0]) == 0, "post_recv 81");
    barrier(cf, "any posted");
    memset(&m, 0, sizeof(m));
    CHECK(probe_wait(cf, 0, &m) == 1 && m.len == sizeof(c1) && m.env[0] == 5 &&
              m.env[3] == (82 | ch),
          "any key beside a posted receive: len %zu seq %llu", m.len, (unsigned long long)m.env[0]);
    req_set(&r[1], 0, got, sizeof(c1), 5, 82 | ch);
    CHECK(cf->ops->post_recv(cf->tp, &r[1]) == 0, "post_recv 82");
    drive(cf, &r[1], 1, 10000);
    CHECK(r[1].status == 0 && !memcmp(got, c1, sizeof(c1)), "key 82: status %d", r[1].status);
    CHECK(r[0].status == 1, "key 81's receive ended early: %d", r[0].status);
    barrier(cf, "any found");
    drive(cf, r, 1, 10000);
    CHECK(r[0].status == 0 && !memcmp(got2, b, sizeof(b)), "key 81: status %d", r[0].status);
    barrier(cf, "any");
    return 0;
}

/* ---- arm: a descriptor that turns readable when progress() has something to do ---- */

/* Arm until it says armed (0: *fd_p set) or fails; progress(0) while it says busy. */
static int arm_wait(conf_t *cf, int *fd_p, int *tmo_p)
{
    for (int i = 0; i < 1000; i++) {
        int st = cf->ops->arm(cf->tp, fd_p, tmo_p);
        if (st != 1)
            return st;
        cf->ops->progress(cf->tp, 0);
    }
    return 1;
}

/* Drive reqs[n] only by arm, poll and progress(0), as the multiplexer does with several
 * transports. A sleep that lasts 3 s while the peer is sending to us or waiting for our
 * data is a lost wake-up: -1. 0 when all are done. */
static int drive_armed(conf_t *cf, tutti_tp_req_v2_t *reqs, int n)
{
    double end = th_now_ms() + 20000;
    while (th_now_ms() < end) {
        int pending = 0;
        for (int i = 0; i < n; i++)
            pending += reqs[i].status == 1;
        if (!pending)
            return 0;
        int fd = -1, tmo = -1;
        int st = cf->ops->arm(cf->tp, &fd, &tmo);
        if (st < 0)
            return st;
        if (st == 0) {
            struct pollfd p = { .fd = fd, .events = POLLIN };
            int ms = tmo >= 0 && tmo < 3000 ? tmo : 3000;
            double t0 = th_now_ms();
            int r = poll(&p, 1, ms);
            if (r == 0 && ms == 3000 && th_now_ms() - t0 >= 2900)
                return -1;
        }
        if (cf->ops->progress(cf->tp, 0) < 0)
            return -2;
    }
    return -3;
}

static int body_arm(conf_t *cf, int rank)
{
    int has = tutti_tp_ops_has(cf->ops, arm) && cf->ops->arm;
    /* every v2 transport of the tree arms; a v1 plugin cannot */
    int want = !strstr(cf->label, "ABI v1");
    CHECK(has == want, "%s: arm slot %s", cf->label, has ? "set" : "missing");
    if (!has) {
        barrier(cf, "armed");
        barrier(cf, "exchanged");
        return 0;
    }
    int fd = -1, tmo = -1;
    char small[16] = "wake up", got[16] = { 0 };
    tutti_tp_req_v2_t r;
    if (rank == 1) {
        /* armed with a receive pending and nothing sent: not readable; the message
         * makes it readable */
        req_set(&r, 0, got, sizeof(got), 1, 5);
        CHECK(cf->ops->post_recv(cf->tp, &r) == 0, "post_recv");
        CHECK(arm_wait(cf, &fd, &tmo) == 0, "arm with a receive pending");
        CHECK(fd >= 0 && tmo >= -1, "arm gave fd %d, timeout %d", fd, tmo);
        struct pollfd p = { .fd = fd, .events = POLLIN };
        CHECK(poll(&p, 1, 0) == 0, "readable with nothing sent");
        barrier(cf, "armed");
        double t0 = th_now_ms();
        int pr = poll(&p, 1, tmo >= 0 && tmo < 5000 ? tmo : 5000);
        CHECK(pr == 1 || (tmo >= 0 && tmo < 5000), "not readable %.0f ms after the send",
              th_now_ms() - t0);
        cf->ops->progress(cf->tp, 0);
        drive(cf, &r, 1, 10000);
        CHECK(r.status == 0 && !strcmp(got, small), "receive: status %d", r.status);
    } else {
        barrier(cf, "armed");
        req_set(&r, 1, small, sizeof(small), 1, 5);
        CHECK(cf->ops->post_send(cf->tp, &r) == 0, "post_send");
        drive(cf, &r, 1, 10000);
        CHECK(r.status == 0, "send: status %d", r.status);
    }
    /* both ways at once, large and small, driven only by arm, poll and progress(0) */
    enum { XN = 6 };
    static const size_t xlen[XN] = { 1 << 20, 3, 0, 4 << 20, 100, 65536 };
    char *out[XN], *in[XN];
    tutti_tp_req_v2_t xr[2 * XN];
    for (int k = 0; k < XN; k++) {
        out[k] = malloc(xlen[k] + 1);
        in[k] = malloc(xlen[k] + 1);
        CHECK(out[k] && in[k], "malloc");
        for (size_t j = 0; j < xlen[k]; j++)
            out[k][j] = (char)(j * 7 + (size_t)k + (size_t)rank);
        req_set(&xr[k], 1 - rank, in[k], xlen[k], 10 + k, 6);
        req_set(&xr[XN + k], 1 - rank, out[k], xlen[k], 10 + k, 6);
        CHECK(cf->ops->post_recv(cf->tp, &xr[k]) == 0, "post_recv %d", k);
    }
    for (int k = 0; k < XN; k++)
        CHECK(cf->ops->post_send(cf->tp, &xr[XN + k]) == 0, "post_send %d", k);
    int dst = drive_armed(cf, xr, 2 * XN);
    CHECK(dst == 0, "driven by arm: %s",
          dst == -1 ? "a sleep of 3 s with messages under way (a lost wake-up)" : "failed");
    for (int k = 0; k < XN; k++) {
        CHECK(xr[k].status == 0 && xr[XN + k].status == 0, "message %d: %d %d", k, xr[k].status,
              xr[XN + k].status);
        for (size_t j = 0; j < xlen[k]; j++)
            CHECK(in[k][j] == (char)(j * 7 + (size_t)k + (size_t)(1 - rank)), "message %d byte %zu",
                  k, j);
        free(out[k]);
        free(in[k]);
    }
    barrier(cf, "exchanged");
    /* abort() from another thread makes an armed descriptor readable */
    req_set(&r, 1 - rank, got, sizeof(got), 99, 7); /* never sent */
    CHECK(cf->ops->post_recv(cf->tp, &r) == 0, "post_recv");
    CHECK(arm_wait(cf, &fd, &tmo) == 0, "arm before abort");
    aborter_t a = { cf, 200 };
    pthread_t th;
    CHECK(pthread_create(&th, NULL, abort_later, &a) == 0, "pthread_create");
    struct pollfd p = { .fd = fd, .events = POLLIN };
    double t0 = th_now_ms();
    int pr = 0;
    /* a timeout the transport asked for (its liveness checks) ends a sleep early: again */
    while (pr == 0 && th_now_ms() - t0 < 5000) {
        pr = poll(&p, 1, tmo >= 0 && tmo < 5000 ? tmo : 5000);
        if (pr == 0 && cf->ops->progress(cf->tp, 0) == 0 && arm_wait(cf, &fd, &tmo) != 0)
            break;
        p.fd = fd;
    }
    double dt = th_now_ms() - t0;
    pthread_join(th, NULL);
    CHECK(dt < 2000, "abort at 200 ms: the descriptor was readable after %.0f ms", dt);
    CHECK(cf->ops->progress(cf->tp, 0) == TUTTI_ERR_ABORTED, "progress after abort");
    return 0;
}

/* ---- channels (TUTTI_TP_CHANNELS): a receive takes the next message of its own
 * channel; one of the other channel that comes while only such receives wait is read
 * aside and taken, copied, by the next receive of its channel. Small and large (past
 * each transport's eager size: its pull, its read) messages, both channels. ---- */
static int body_channels(conf_t *cf, int rank)
{
    if (!(cf->ops->props.flags & TUTTI_TP_CHANNELS)) {
        barrier(cf, "channels");
        return 0;
    }
    const uint64_t ch = 1ull << 63;
    enum { CN = 4 };
    static const size_t len[CN] = { 64, 1 << 20, 1 << 20, 3 };
    /* message k: channel 1 for k odd; all sent in order 0..3 */
    char *buf[CN];
    tutti_tp_req_v2_t r[CN];
    for (int k = 0; k < CN; k++) {
        CHECK((buf[k] = malloc(len[k])) != NULL, "malloc");
        for (size_t j = 0; j < len[k]; j++)
            buf[k][j] = rank == 0 ? (char)(j * 13 + (size_t)k) : 0;
        req_set(&r[k], 1 - rank, buf[k], len[k], 20 + (uint64_t)k, 5 | ((k & 1) ? ch : 0));
    }
    if (rank == 0) {
        for (int k = 0; k < CN; k++)
            CHECK(cf->ops->post_send(cf->tp, &r[k]) == 0, "post_send %d", k);
        drive(cf, r, CN, 20000);
        for (int k = 0; k < CN; k++)
            CHECK(r[k].status == 0, "send %d: status %d", k, r[k].status);
    } else {
        /* the channel-1 receives first, one at a time: 0 and 2 come while each waits */
        for (int k = 1; k < CN; k += 2) {
            CHECK(cf->ops->post_recv(cf->tp, &r[k]) == 0, "post_recv %d", k);
            drive(cf, &r[k], 1, 20000);
            CHECK(r[k].status == 0, "channel-1 receive %d: status %d", k, r[k].status);
        }
        /* then channel 0's, from what was read aside (posted together: the second
         * waits on nothing the transport still has to read) */
        CHECK(cf->ops->post_recv(cf->tp, &r[0]) == 0 && cf->ops->post_recv(cf->tp, &r[2]) == 0,
              "post_recv 0, 2");
        drive(cf, r, CN, 20000);
        for (int k = 0; k < CN; k++) {
            CHECK(r[k].status == 0, "receive %d: status %d", k, r[k].status);
            for (size_t j = 0; j < len[k]; j++)
                CHECK(buf[k][j] == (char)(j * 13 + (size_t)k), "message %d byte %zu", k, j);
        }
    }
    for (int k = 0; k < CN; k++)
        free(buf[k]);
    barrier(cf, "channels");
    return 0;
}

/* One test per contract point, looped over the transports. */
#define CONF_CASE(name, body, peer_dies)                                                           \
    START_TEST(name)                                                                               \
    {                                                                                              \
        conf_run(_i, body, peer_dies);                                                             \
    }                                                                                              \
    END_TEST
CONF_CASE(order_and_zero_length, body_order, 0)
CONF_CASE(bad_requests, body_bad_requests, 0)
CONF_CASE(envelope_mismatch, body_mismatch, 0)
CONF_CASE(length_mismatch, body_len_mismatch, 0)
CONF_CASE(cancel_all, body_cancel, 0)
CONF_CASE(notify_error, body_notify, 0)
CONF_CASE(timeouts_and_abort, body_timeouts, 0)
CONF_CASE(peer_killed, body_peer_killed, 1)
CONF_CASE(probe, body_probe, 0)
CONF_CASE(arm, body_arm, 0)
CONF_CASE(channels, body_channels, 0)

int main(void)
{
    Suite *s = suite_create("conformance");
    const struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        { "order_and_zero_length", order_and_zero_length },
        { "bad_requests", bad_requests },
        { "envelope_mismatch", envelope_mismatch },
        { "length_mismatch", length_mismatch },
        { "cancel_all", cancel_all },
        { "notify_error", notify_error },
        { "timeouts_and_abort", timeouts_and_abort },
        { "peer_killed", peer_killed },
        { "probe", probe },
        { "arm", arm },
        { "channels", channels },
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++)
        th_add_case(s, cases[k].name, cases[k].test, NTPS, 120);
    setenv("TUTTI_SOCKET_IFNAME", "lo", 0); /* tests stay on loopback */
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nfailed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nfailed != 0;
}
