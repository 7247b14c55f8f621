/* TLS on the tcp transport's links (TUTTI_TLS_*, transports/tcp/tcp_tls.h), with
 * certificates the suite makes with the openssl command: collectives and messages of
 * every size arrive intact, eagerly and lazily connected; neither the payload nor the
 * hello's job id crosses the wire in the clear (every send and sendmsg of the ranks, and
 * libuv's writes on sockets, are watched: this binary's definitions come before libc's);
 * a peer's report that arrives behind a message ends a send at once; a certificate the
 * CAs do not verify, on
 * either end of a link, fails set-up on every rank naming TLS and the cause; a rank
 * with TLS and one without fail naming both; knobs that do not go together, files that
 * do not load and set-but-empty knobs fail with TUTTI_ERR_CONFIG; Gloo's variable names
 * are read where ours are unset. Skipped (77) where tutti was built without OpenSSL. */
#include <check.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include <tutti/store.h>
#include <tutti/tutti.h>

#ifdef TUTTI_HAVE_TLS

static char g_root[256];

/* ---- the wire, watched ---- */

/* seen by libuv (a shared library) too: exported (the build hides symbols, and the
 * suite links with -rdynamic) */
#define TT_EXPORTED __attribute__((visibility("default")))

/* 16 bytes the watched buffers are made of: a send that carries them went in the clear */
static const char MARK[16] = "tutti-cleartext!";
static int *g_seen; /* shared: per rank, the sends that carried MARK; then (at
                       4 + rank) the set-up's writes that carried the job id */
static int g_rank = -1;
/* the job id of the watched runs, which each connection's hello carries */
#define HELLO_MARK "tls-hello-marker-7f3a"

static void scan(const void *p, size_t n)
{
    if (g_seen && g_rank >= 0 && p && memmem(p, n, MARK, sizeof(MARK)))
        __atomic_add_fetch(&g_seen[g_rank], 1, __ATOMIC_RELAXED);
}

/* libuv's writes of the set-up (the hello), on sockets only (the file store writes the
 * job id into its files) */
static void scan_setup(int fd, const void *p, size_t n)
{
    struct stat sb;
    if (g_seen && g_rank >= 0 && p && fstat(fd, &sb) == 0 && S_ISSOCK(sb.st_mode) &&
        memmem(p, n, HELLO_MARK, sizeof(HELLO_MARK) - 1))
        __atomic_add_fetch(&g_seen[4 + g_rank], 1, __ATOMIC_RELAXED);
}

TT_EXPORTED ssize_t write(int fd, const void *buf, size_t len)
{
    static ssize_t (*real)(int, const void *, size_t);
    if (!real)
        real = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    scan_setup(fd, buf, len);
    return real(fd, buf, len);
}

TT_EXPORTED ssize_t writev(int fd, const struct iovec *iov, int n)
{
    static ssize_t (*real)(int, const struct iovec *, int);
    if (!real)
        real = (ssize_t(*)(int, const struct iovec *, int))dlsym(RTLD_NEXT, "writev");
    for (int i = 0; i < n; i++)
        scan_setup(fd, iov[i].iov_base, iov[i].iov_len);
    return real(fd, iov, n);
}

/* Tampering: this process's g_tamper-th send of a batch of records (16 KiB and more:
 * the data path's, not the set-up's) goes out with one byte flipped, as a relay on the
 * way would (0: never). */
static int g_tamper;

TT_EXPORTED ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    static ssize_t (*real)(int, const void *, size_t, int);
    if (!real)
        real = (ssize_t(*)(int, const void *, size_t, int))dlsym(RTLD_NEXT, "send");
    scan(buf, len);
    if (g_tamper > 0 && len >= 16384 && --g_tamper == 0) {
        unsigned char *copy = malloc(len);
        if (copy) {
            memcpy(copy, buf, len);
            copy[100] ^= 0x20; /* in the first record's ciphertext, past its header */
            ssize_t w = real(fd, copy, len, flags);
            free(copy);
            return w;
        }
    }
    return real(fd, buf, len, flags);
}

TT_EXPORTED ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
    static ssize_t (*real)(int, const struct msghdr *, int);
    if (!real)
        real = (ssize_t(*)(int, const struct msghdr *, int))dlsym(RTLD_NEXT, "sendmsg");
    for (size_t i = 0; i < m->msg_iovlen; i++)
        scan(m->msg_iov[i].iov_base, m->msg_iov[i].iov_len);
    return real(fd, m, flags);
}

/* ---- certificates ---- */

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    ck_assert_msg(system(cmd) == 0, "failed: %s", cmd);
}

static void path(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", g_root, name);
}

/* ca.pem (the CAs every rank trusts), node.pem/node.key (a certificate it signed),
 * rogue.pem/rogue.key (self-signed: no CA of the job's; its key does not fit node.pem),
 * capath/ (ca.pem under its hash) and locked.key (node.key behind a passphrase). Made
 * once. */
static void make_certs(void)
{
    char probe[300];
    path(probe, sizeof(probe), "node.pem");
    if (access(probe, R_OK) == 0)
        return;
    const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    sh("cd %s && openssl req -x509 %s -keyout ca.key -out ca.pem -days 2 -subj /CN=tutti-ca "
       ">/dev/null 2>&1",
       g_root, ec);
    sh("cd %s && openssl req %s -keyout node.key -out node.csr -subj /CN=node >/dev/null 2>&1 && "
       "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem "
       "-days 2 >/dev/null 2>&1",
       g_root, ec);
    sh("cd %s && openssl req -x509 %s -keyout rogue.key -out rogue.pem -days 2 -subj /CN=rogue "
       ">/dev/null 2>&1",
       g_root, ec);
    sh("cd %s && mkdir -p capath && cp ca.pem capath/$(openssl x509 -hash -noout -in ca.pem).0",
       g_root);
    sh("cd %s && openssl pkey -in node.key -aes256 -passout pass:secret -out locked.key", g_root);
}

/* ---- ranks ---- */

typedef struct plan {
    const char *cert[4], *key[4]; /* per rank: file names under g_root, NULL: no TLS */
    const char *ca;               /* the CA file or (capath) directory; NULL: ca.pem, capath/ */
    int capath;                   /* TUTTI_TLS_CA_PATH=capath/ instead */
    int lazy;
    const char *transport; /* NULL: tcp */
    int timeout_ms;        /* 0: 15000 */
    int gloo_env;          /* the knobs through Gloo's variables */
    const char *job_id;
    const char *algo;
    int two_hosts;               /* ranks 0-1 and 2-3 as two hosts (TUTTI_HOST_ID) */
    const char *env, *env_value; /* a variable each rank sets before its options are read */
    int expect;                  /* the init's status every rank must see (0: success) */
    const char *msg[2];          /* what every failing rank's error must say */
} plan_t;

static int rank_init(int rank, int nranks, const char *dir, const plan_t *p, tutti_comm_t **comm_p,
                     tutti_store_t **store_p, char *err, size_t errlen)
{
    char cert[300] = "", key[300] = "", ca[300] = "";
    if (p->cert[rank])
        path(cert, sizeof(cert), p->cert[rank]);
    if (p->key[rank])
        path(key, sizeof(key), p->key[rank]);
    path(ca, sizeof(ca), p->ca ? p->ca : p->capath ? "capath" : "ca.pem");
    unsetenv("TUTTI_TLS_CERT");
    unsetenv("TUTTI_TLS_KEY");
    unsetenv("TUTTI_TLS_CA_FILE");
    unsetenv("TUTTI_TLS_CA_PATH");
    int tls = p->cert[rank] || p->key[rank];
    if (p->gloo_env && tls) {
        setenv("GLOO_DEVICE_TRANSPORT_TCP_TLS_CERT", cert, 1);
        setenv("GLOO_DEVICE_TRANSPORT_TCP_TLS_PKEY", key, 1);
        setenv(p->capath ? "GLOO_DEVICE_TRANSPORT_TCP_TLS_CA_PATH"
                         : "GLOO_DEVICE_TRANSPORT_TCP_TLS_CA_FILE",
               ca, 1);
    }
    if (p->env)
        setenv(p->env, p->env_value, 1);
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.transport = p->transport ? p->transport : "tcp";
    o.timeout_ms = p->timeout_ms ? p->timeout_ms : 15000;
    o.stall_check_ms = 0; /* a failure must come from the link, not the stall check */
    if (p->job_id)
        o.job_id = p->job_id;
    if (p->algo)
        o.algo = p->algo;
    if (p->two_hosts)
        o.host_id = rank < nranks / 2 ? "tls-host-a" : "tls-host-b";
    o.transport_options = p->lazy ? "TCP_CONNECT=lazy" : NULL;
    if (p->gloo_env && tls) {
        FAIL_IF(!o.tls_cert || strcmp(o.tls_cert, cert) || !o.tls_key || strcmp(o.tls_key, key),
                "Gloo's variables not read: cert %s key %s", o.tls_cert ? o.tls_cert : "(null)",
                o.tls_key ? o.tls_key : "(null)");
    } else if (tls) {
        o.tls_cert = p->cert[rank] ? cert : NULL;
        o.tls_key = p->key[rank] ? key : NULL;
        if (p->capath)
            o.tls_ca_path = ca;
        else
            o.tls_ca_file = ca;
    }
    FAIL_IF(tutti_store_open_file(store_p, dir, 10000) != 0, "store");
    int st = tutti_comm_init(comm_p, *store_p, rank, nranks, &o);
    snprintf(err, errlen, "%s", st ? tutti_comm_last_error(NULL) : "");
    return st;
}

/* rank_init that must succeed: 0, or 1 with why said */
static int rank_up(int rank, int nranks, const char *dir, const plan_t *p, tutti_comm_t **comm_p,
                   tutti_store_t **store_p)
{
    char err[1024];
    int st = rank_init(rank, nranks, dir, p, comm_p, store_p, err, sizeof(err));
    FAIL_IF(st, "init: %s: %s", tutti_status_name(st), err);
    return 0;
}

static int rank_down(tutti_comm_t *comm, tutti_store_t *store)
{
    tutti_comm_destroy(comm);
    tutti_store_close(store);
    return 0;
}

/* Every rank of an int32 allreduce of count elements against the sum computed here. */
static int check_allreduce(int rank, int nranks, tutti_comm_t *comm, size_t count)
{
    int32_t *x = malloc(count * sizeof(*x));
    FAIL_IF(!x, "malloc");
    for (size_t i = 0; i < count; i++)
        x[i] = (int32_t)((i * 7 + 3) % 1000003) * (rank + 1);
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, x, count, TUTTI_INT32, TUTTI_SUM);
    FAIL_IF(st, "allreduce of %zu: %s", count, tutti_comm_last_error(comm));
    int32_t f = (int32_t)(nranks * (nranks + 1) / 2);
    for (size_t i = 0; i < count; i++)
        FAIL_IF(x[i] != (int32_t)((i * 7 + 3) % 1000003) * f, "allreduce of %zu: [%zu] = %d", count,
                i, x[i]);
    free(x);
    return 0;
}

static int rank_ok(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    tutti_comm_t *comm;
    tutti_store_t *store;
    if (rank_up(rank, nranks, dir, arg, &comm, &store))
        return 1;
    static const size_t counts[] = { 1, 1000, 4096, 70000, 1 << 20 };
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
        if (check_allreduce(rank, nranks, comm, counts[i]))
            return 1;
    /* a burst of small messages to the next rank, read from the previous one only after
     * they all came: several frames then wait in one session's buffer, decrypted, with
     * the socket empty behind them */
    enum { BURST = 64, BYTES = 100 };
    int to = (rank + 1) % nranks, from = (rank + nranks - 1) % nranks;
    static unsigned char out[BURST][BYTES], in[BYTES];
    tutti_work_t *w[BURST];
    for (int k = 0; k < BURST; k++) {
        for (int b = 0; b < BYTES; b++)
            out[k][b] = (unsigned char)(rank * 31 + k * 7 + b);
        FAIL_IF(tutti_send_async(comm, out[k], BYTES, TUTTI_UINT8, to, 5, &w[k]), "send %d", k);
    }
    for (int k = 0; k < BURST; k++)
        FAIL_IF(tutti_wait(w[k], -1), "send %d: %s", k, tutti_comm_last_error(comm));
    FAIL_IF(tutti_barrier(comm), "barrier: %s", tutti_comm_last_error(comm));
    for (int k = 0; k < BURST; k++) {
        int src = -1;
        size_t n = 0;
        if (k == BURST / 2) {
            FAIL_IF(tutti_probe(comm, from, 5, &src, &n, NULL), "probe: %s",
                    tutti_comm_last_error(comm));
            FAIL_IF(src != from || n != BYTES, "probe: %d, %zu", src, n);
        }
        FAIL_IF(tutti_recv(comm, in, BYTES, TUTTI_UINT8, from, 5), "recv %d: %s", k,
                tutti_comm_last_error(comm));
        for (int b = 0; b < BYTES; b++)
            FAIL_IF(in[b] != (unsigned char)(from * 31 + k * 7 + b), "message %d byte %d", k, b);
    }
    if (check_allreduce(rank, nranks, comm, 3))
        return 1;
    return rank_down(comm, store);
}

/* Rank 0 broadcasts 256 KiB made of MARK and sends 64 bytes of it to each rank; g_seen
 * counts the sends that carried it. */
static int rank_wire(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    g_rank = rank;
    tutti_comm_t *comm;
    tutti_store_t *store;
    if (rank_up(rank, nranks, dir, arg, &comm, &store))
        return 1;
    enum { BIG = 256 << 10 };
    static char buf[BIG], small[64];
    if (rank == 0) {
        for (size_t i = 0; i < BIG; i += sizeof(MARK))
            memcpy(buf + i, MARK, sizeof(MARK));
        for (size_t i = 0; i < sizeof(small); i += sizeof(MARK))
            memcpy(small + i, MARK, sizeof(MARK));
    }
    FAIL_IF(tutti_broadcast(comm, TUTTI_IN_PLACE, buf, BIG, TUTTI_UINT8, 0), "broadcast: %s",
            tutti_comm_last_error(comm));
    for (size_t i = 0; i < BIG; i += sizeof(MARK))
        FAIL_IF(memcmp(buf + i, MARK, sizeof(MARK)), "broadcast's byte %zu", i);
    if (rank == 0) {
        for (int r = 1; r < nranks; r++)
            FAIL_IF(tutti_send(comm, small, sizeof(small), TUTTI_UINT8, r, 9), "send: %s",
                    tutti_comm_last_error(comm));
    } else {
        FAIL_IF(tutti_recv(comm, small, sizeof(small), TUTTI_UINT8, 0, 9), "recv: %s",
                tutti_comm_last_error(comm));
        FAIL_IF(memcmp(small, MARK, sizeof(MARK)), "the message");
    }
    return rank_down(comm, store);
}

/* Rank 1 sends rank 0 a message, then revokes the communicator (its links carry the
 * report) and stays; rank 0 reads the message after both have come, then sends 64 MiB
 * rank 1 never reads: the send must end with the report, not at the timeout (8 s).
 * Over TLS the report came in the same read as the message (read-ahead) and sat in the
 * session while rank 0 waited on the socket (found by review: 8 s, 3 runs of 3). */
static int rank_report(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    tutti_comm_t *comm;
    tutti_store_t *store;
    if (rank_up(rank, nranks, dir, arg, &comm, &store))
        return 1;
    char m[100] = "hello";
    if (rank == 1) {
        FAIL_IF(tutti_send(comm, m, sizeof(m), TUTTI_UINT8, 0, 1), "send: %s",
                tutti_comm_last_error(comm));
        tutti_comm_revoke(comm);
        th_sleep_ms(6000);
    } else {
        th_sleep_ms(500);
        FAIL_IF(tutti_recv(comm, m, sizeof(m), TUTTI_UINT8, 1, 1), "recv: %s",
                tutti_comm_last_error(comm));
        size_t n = 64u << 20;
        char *big = calloc(1, n);
        FAIL_IF(!big, "calloc");
        double t0 = th_now_ms();
        int st = tutti_send(comm, big, n, TUTTI_UINT8, 1, 2);
        double ms = th_now_ms() - t0;
        free(big);
        FAIL_IF(st != TUTTI_ERR_REVOKED || ms > 4000, "the send: %s after %.0f ms: %s",
                tutti_status_name(st), ms, tutti_comm_last_error(comm));
    }
    return rank_down(comm, store);
}

/* Rank 0's third batch of records to a peer leaves with a byte flipped: the receiver's
 * session refuses it, and every rank's allreduce fails naming the TLS session with rank
 * 0 and OpenSSL's cause, never a wrong sum. */
static int rank_tamper(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    tutti_comm_t *comm;
    tutti_store_t *store;
    if (rank_up(rank, nranks, dir, arg, &comm, &store))
        return 1;
    enum { COUNT = 1 << 20 };
    int32_t *x = malloc(COUNT * sizeof(*x));
    FAIL_IF(!x, "malloc");
    for (size_t i = 0; i < COUNT; i++)
        x[i] = (int32_t)(i % 1000) + rank;
    if (rank == 0)
        g_tamper = 3;
    int st = tutti_allreduce(comm, TUTTI_IN_PLACE, x, COUNT, TUTTI_INT32, TUTTI_SUM);
    const char *e = tutti_comm_last_error(comm);
    size_t wrong = 0;
    for (size_t i = 0; i < COUNT && st == 0; i++)
        wrong += x[i] != (int32_t)(i % 1000) * nranks + nranks * (nranks - 1) / 2;
    FAIL_IF(st == 0, "the allreduce succeeded over a tampered link (%zu elements wrong)", wrong);
    FAIL_IF(!strstr(e, "TLS session with rank 0") || !strstr(e, "bad record mac"), "%s: %s",
            tutti_status_name(st), e);
    fprintf(stderr, "rank %d failed as it should: %s: %.300s\n", rank, tutti_status_name(st), e);
    free(x);
    return rank_down(comm, store);
}

/* The init fails with p->expect, its message saying each of p->msg. */
static int rank_fails(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const plan_t *p = arg;
    tutti_comm_t *comm = NULL;
    tutti_store_t *store;
    char err[1024];
    double t0 = th_now_ms();
    int st = rank_init(rank, nranks, dir, p, &comm, &store, err, sizeof(err));
    double ms = th_now_ms() - t0;
    if (st == 0)
        tutti_comm_destroy(comm);
    tutti_store_close(store);
    FAIL_IF(st != p->expect, "init: %s, expected %s: %s", tutti_status_name(st),
            tutti_status_name(p->expect), err);
    for (int i = 0; i < 2; i++)
        FAIL_IF(p->msg[i] && !strstr(err, p->msg[i]), "the error does not say \"%s\": %s",
                p->msg[i], err);
    /* a verdict, not the timeout (15 s) */
    FAIL_IF(ms > 8000, "it took %.0f ms to fail: %s", ms, err);
    fprintf(stderr, "rank %d failed as it should, in %.0f ms: %s\n", rank, ms, err);
    return 0;
}

static void run(int nranks, th_rank_fn fn, const plan_t *p, int kill_on_fail)
{
    make_certs();
    th_spec_t spec = { .nranks = nranks,
                       .fn = fn,
                       .arg = (void *)p,
                       .timeout_ms = 60000,
                       .flags = TH_NO_COMM | (kill_on_fail ? 0 : TH_NO_KILL_ON_FAIL) };
    int codes[4];
    int rc = th_run_ex(&spec, codes);
    for (int r = 0; r < nranks; r++)
        ck_assert_msg(codes[r] == 0, "rank %d exited %d", r, codes[r]);
    ck_assert_int_eq(rc, 0);
}

#define ALL(x)                                                                                     \
    {                                                                                              \
        x, x, x, x                                                                                 \
    }

START_TEST(tls_collectives_and_messages)
{
    plan_t p = { .cert = ALL("node.pem"), .key = ALL("node.key") };
    run(3, rank_ok, &p, 1);
}
END_TEST

/* auto over two pretend hosts: shm within each, tcp with TLS between them, under the
 * multiplexer (whose waits arm tcp's loop beside shm's) */
START_TEST(tls_between_hosts_shm_within)
{
    plan_t p = {
        .cert = ALL("node.pem"), .key = ALL("node.key"), .transport = "auto", .two_hosts = 1
    };
    run(4, rank_ok, &p, 1);
}
END_TEST

START_TEST(tls_lazy_and_ca_path)
{
    plan_t p = { .cert = ALL("node.pem"), .key = ALL("node.key"), .capath = 1, .lazy = 1 };
    run(3, rank_ok, &p, 1);
}
END_TEST

/* The marker must cross in the clear without TLS (the watch sees it: the check can
 * fail), and never with it. */
START_TEST(tls_nothing_in_the_clear)
{
    g_seen = th_shared_zeroed(8 * sizeof(int));
    plan_t plain = { .cert = { NULL }, .job_id = HELLO_MARK };
    run(3, rank_wire, &plain, 1);
    ck_assert_msg(g_seen[0] > 0, "without TLS the watch saw no marker (%d sends)", g_seen[0]);
    /* the connecting ranks' hellos carry the job id (libuv writes them) */
    ck_assert_msg(g_seen[4 + 1] > 0 && g_seen[4 + 2] > 0,
                  "without TLS the watch saw no hello with the job id (%d, %d)", g_seen[5],
                  g_seen[6]);
    memset(g_seen, 0, 8 * sizeof(int));
    plan_t tls = { .cert = ALL("node.pem"), .key = ALL("node.key"), .job_id = HELLO_MARK };
    run(3, rank_wire, &tls, 1);
    for (int r = 0; r < 3; r++)
        ck_assert_msg(g_seen[r] == 0 && g_seen[4 + r] == 0,
                      "with TLS rank %d sent the marker in the clear %d times, the job id %d", r,
                      g_seen[r], g_seen[4 + r]);
    /* and so through Gloo's variables, lazily */
    plan_t gloo = { .cert = ALL("node.pem"),
                    .key = ALL("node.key"),
                    .gloo_env = 1,
                    .lazy = 1,
                    .job_id = HELLO_MARK };
    run(3, rank_wire, &gloo, 1);
    for (int r = 0; r < 3; r++)
        ck_assert_msg(g_seen[r] == 0 && g_seen[4 + r] == 0,
                      "Gloo's knobs: rank %d sent the marker in the clear", r);
}
END_TEST

START_TEST(tls_tampered_record_fails_every_rank)
{
    plan_t p = { .cert = ALL("node.pem"), .key = ALL("node.key"), .algo = "allreduce:ring" };
    run(3, rank_tamper, &p, 0);
}
END_TEST

START_TEST(tls_report_behind_a_message)
{
    plan_t p = { .cert = ALL("node.pem"), .key = ALL("node.key"), .timeout_ms = 8000 };
    run(2, rank_report, &p, 1);
}
END_TEST

/* A certificate no CA of the job signed: on the connecting end (rank 1 calls rank 0),
 * then on the listening end. */
START_TEST(tls_untrusted_certificate)
{
    plan_t p = { .cert = { "node.pem", "rogue.pem" },
                 .key = { "node.key", "rogue.key" },
                 .expect = TUTTI_ERR_AUTH,
                 .msg = { "TLS", "rank 0" } };
    run(2, rank_fails, &p, 0);
    plan_t q = { .cert = { "rogue.pem", "node.pem" },
                 .key = { "rogue.key", "node.key" },
                 .expect = TUTTI_ERR_AUTH,
                 .msg = { "certificate", "rank 0" } };
    run(2, rank_fails, &q, 0);
}
END_TEST

START_TEST(tls_on_one_rank_only)
{
    plan_t p = { .cert = { "node.pem" },
                 .key = { "node.key" },
                 .expect = TUTTI_ERR_CONFIG,
                 .msg = { "rank 0 runs its links with TLS and rank 1 without", NULL } };
    run(2, rank_fails, &p, 0);
    plan_t q = { .cert = { NULL, "node.pem" },
                 .key = { NULL, "node.key" },
                 .expect = TUTTI_ERR_CONFIG,
                 .msg = { "rank 1 runs its links with TLS and rank 0 without", NULL } };
    run(2, rank_fails, &q, 0);
}
END_TEST

START_TEST(tls_bad_knobs)
{
    /* a certificate without its key; a key that does not fit; a file that is not there */
    plan_t nokey = { .cert = ALL("node.pem"),
                     .expect = TUTTI_ERR_CONFIG,
                     .msg = { "TUTTI_TLS_KEY", "is not" } };
    run(2, rank_fails, &nokey, 0);
    plan_t misfit = { .cert = ALL("node.pem"),
                      .key = ALL("rogue.key"),
                      .expect = TUTTI_ERR_CONFIG,
                      .msg = { "TUTTI_TLS_KEY", "rogue.key" } };
    run(2, rank_fails, &misfit, 0);
    plan_t missing = { .cert = ALL("nothing.pem"),
                       .key = ALL("node.key"),
                       .expect = TUTTI_ERR_CONFIG,
                       .msg = { "TUTTI_TLS_CERT", "nothing.pem" } };
    run(2, rank_fails, &missing, 0);
    plan_t noca = { .cert = ALL("node.pem"),
                    .key = ALL("node.key"),
                    .ca = "nothing.pem",
                    .expect = TUTTI_ERR_CONFIG,
                    .msg = { "TUTTI_TLS_CA_FILE", "nothing.pem" } };
    run(2, rank_fails, &noca, 0);
    plan_t nodir = { .cert = ALL("node.pem"),
                     .key = ALL("node.key"),
                     .capath = 1,
                     .ca = "nothing",
                     .expect = TUTTI_ERR_CONFIG,
                     .msg = { "TUTTI_TLS_CA_PATH", "nothing" } };
    run(2, rank_fails, &nodir, 0);
    /* a key behind a passphrase: refused, not a prompt on the terminal */
    plan_t locked = { .cert = ALL("node.pem"),
                      .key = ALL("locked.key"),
                      .expect = TUTTI_ERR_CONFIG,
                      .msg = { "TUTTI_TLS_KEY", "locked.key" } };
    run(2, rank_fails, &locked, 0);
    /* a transport that does not encrypt for the ranks on other hosts, asked for TLS */
    plan_t ib = { .cert = ALL("node.pem"),
                  .key = ALL("node.key"),
                  .transport = "ibverbs",
                  .expect = TUTTI_ERR_UNSUPPORTED,
                  .msg = { "on ibverbs", "only the tcp" } };
    run(2, rank_fails, &ib, 0);
    plan_t rem = { .cert = ALL("node.pem"),
                   .key = ALL("node.key"),
                   .transport = "local=shm,remote=ibverbs",
                   .expect = TUTTI_ERR_UNSUPPORTED,
                   .msg = { "on ibverbs", "remote=tcp" } };
    run(2, rank_fails, &rem, 0);
    /* shm alone never leaves the host: TLS asks nothing of it */
    plan_t shm = { .cert = ALL("node.pem"), .key = ALL("node.key"), .transport = "shm" };
    run(2, rank_ok, &shm, 1);
}
END_TEST

/* Set but empty: read as set, and an error on every rank, not plain tcp. */
START_TEST(tls_empty_knob_fails_the_pair)
{
    setenv("TUTTI_TLS_CERT", "", 1);
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    unsetenv("TUTTI_TLS_CERT");
    ck_assert_msg(o.tls_cert && !*o.tls_cert, "TUTTI_TLS_CERT=\"\" read as unset");
    plan_t p = { .env = "TUTTI_TLS_CERT",
                 .env_value = "",
                 .expect = TUTTI_ERR_CONFIG,
                 .msg = { "TUTTI_TLS_CERT is set but empty", NULL } };
    run(2, rank_fails, &p, 0);
}
END_TEST

/* A Gloo user's GLOO_DEVICE_TRANSPORT=TCP_TLS without certificates: an error, not plain
 * tcp. */
START_TEST(tls_gloo_transport_without_certificates)
{
    plan_t p = { .env = "GLOO_DEVICE_TRANSPORT",
                 .env_value = "TCP_TLS",
                 .expect = TUTTI_ERR_CONFIG,
                 .msg = { "GLOO_DEVICE_TRANSPORT=TCP_TLS asks for TLS", NULL } };
    run(2, rank_fails, &p, 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("tls");
    TCase *tc = tcase_create("tls");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, tls_collectives_and_messages);
    tcase_add_test(tc, tls_lazy_and_ca_path);
    tcase_add_test(tc, tls_between_hosts_shm_within);
    tcase_add_test(tc, tls_nothing_in_the_clear);
    tcase_add_test(tc, tls_report_behind_a_message);
    tcase_add_test(tc, tls_tampered_record_fails_every_rank);
    tcase_add_test(tc, tls_untrusted_certificate);
    tcase_add_test(tc, tls_on_one_rank_only);
    tcase_add_test(tc, tls_bad_knobs);
    tcase_add_test(tc, tls_empty_knob_fails_the_pair);
    tcase_add_test(tc, tls_gloo_transport_without_certificates);
    suite_add_tcase(s, tc);
    return s;
}

#endif /* TUTTI_HAVE_TLS */

int main(void)
{
#ifndef TUTTI_HAVE_TLS
    fprintf(stderr, "tutti was built without OpenSSL: no TLS to test\n");
    return 77;
#else
    if (system("openssl version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "no openssl command to make certificates with\n");
        return 77;
    }
    return th_main_in_tmpdir(suite(), g_root, sizeof(g_root), "/tmp/tutti-test-tls-XXXXXX", 0);
#endif
}
