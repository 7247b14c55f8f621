/* Device buffers (lib/device/device.h): every collective and point-to-point call with
 * its buffers in device memory, staged through host memory by the library.
 *
 * This machine has no GPU, so most cases run on a fake device: memory mapped twice from
 * one memfd, the "device" view with no access at all (PROT_NONE) and a second view only
 * the fake's copies use. A library that touched a device pointer itself would die of
 * SIGSEGV here, so the cases check the staging covers every path, not only the results.
 * Results are checked against references computed here in plain C, with sentinels
 * where a call must leave bytes alone (allgatherv's gaps, exscan's rank 0).
 *
 * The fake also fails copies on request (the errors' text and status). The cuda cases
 * run lib/device/cuda.c: against tests/fake_libcuda.c (a stand-in for the driver's
 * library that holds it to the driver's rules: contexts, streams, memory with no
 * context) everywhere, and against the real driver where this machine has a GPU
 * (tools/dev/device-check.sh runs it on the device machine; elsewhere it says it
 * skipped). */
#include <check.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <tutti/fuse.h>
#include <tutti/tutti.h>

#include "device/device.h"
#include "harness.h"

/* ---- the fake device ---- */

static struct {
    char *dev;  /* the device view: PROT_NONE */
    char *back; /* the fake's own view of the same pages */
    size_t size, used;
    int fail_to_host, fail_to_dev; /* fail every such copy */
    int fail_query;                /* fail every question */
    void (*after_in)(void);        /* called after each copy to the host: a write to
                                      device memory while an op runs */
    long copies_in, copies_back;
    /* host ranges pinned (page-locked) for copies, as cuMemHostRegister's; the copies
     * whose host side is none of them; calls that broke the rules (pin twice, unpin
     * what was not pinned, another context) */
    struct {
        char *p;
        size_t n;
    } pins[16];
    int npins, fail_pin;
    long pin_calls, unpin_calls, pin_errors, copies_unpinned;
} fake;

/* the pin table: pinned at the call, looked up by the copies on the progress thread */
static pthread_mutex_t pin_lock = PTHREAD_MUTEX_INITIALIZER;

static int pinned_locked(const char *p, size_t n)
{
    for (int i = 0; i < fake.npins; i++)
        if (p >= fake.pins[i].p && n <= fake.pins[i].n &&
            p - fake.pins[i].p <= (ptrdiff_t)(fake.pins[i].n - n))
            return 1;
    return 0;
}

static int pinned(const char *p, size_t n)
{
    pthread_mutex_lock(&pin_lock);
    int k = pinned_locked(p, n);
    pthread_mutex_unlock(&pin_lock);
    return k;
}

static int fake_pin_locked(void *ctx, void *p, size_t n, char *err, size_t errlen)
{
    fake.pin_calls++;
    if (fake.fail_pin) {
        snprintf(err, errlen, "fakeHostRegister: injected failure");
        return TUTTI_ERR_DEVICE;
    }
    for (int i = 0; i < fake.npins; i++)
        if ((char *)p < fake.pins[i].p + fake.pins[i].n && fake.pins[i].p < (char *)p + n)
            ctx = NULL; /* registered twice */
    if (ctx != &fake || fake.npins == 16) {
        fake.pin_errors++;
        snprintf(err, errlen, "fakeHostRegister: refused");
        return TUTTI_ERR_DEVICE;
    }
    fake.pins[fake.npins].p = p;
    fake.pins[fake.npins++].n = n;
    return TUTTI_OK;
}

static int fake_pin(void *ctx, void *p, size_t n, char *err, size_t errlen)
{
    pthread_mutex_lock(&pin_lock);
    int st = fake_pin_locked(ctx, p, n, err, errlen);
    pthread_mutex_unlock(&pin_lock);
    return st;
}

static void fake_unpin_locked(void *ctx, void *p)
{
    fake.unpin_calls++;
    for (int i = 0; i < fake.npins; i++) {
        if (fake.pins[i].p == p && ctx == &fake) {
            fake.pins[i] = fake.pins[--fake.npins];
            return;
        }
    }
    fake.pin_errors++;
}

static void fake_unpin(void *ctx, void *p)
{
    pthread_mutex_lock(&pin_lock);
    fake_unpin_locked(ctx, p);
    pthread_mutex_unlock(&pin_lock);
}

static int fake_query(const void *p, void **ctx, char *err, size_t errlen)
{
    if (fake.fail_query) {
        snprintf(err, errlen, "fakePointerGetAttributes: injected failure");
        return TUTTI_ERR_DEVICE;
    }
    const char *c = p;
    *ctx = &fake;
    return fake.dev && c >= fake.dev && c < fake.dev + fake.size;
}

/* the fake's view of device bytes [p, p + n), or NULL when they are not all device */
static char *fake_back(const void *p, size_t n)
{
    const char *c = p;
    if (!fake.dev || c < fake.dev || n > fake.size || c - fake.dev > (ptrdiff_t)(fake.size - n))
        return NULL;
    return fake.back + (c - fake.dev);
}

static int fake_copy(void *ctx, void *dst, const void *src, size_t n, int to_host, char *err,
                     size_t errlen)
{
    char *b = fake_back(to_host ? src : dst, n);
    if (ctx != &fake || !b) {
        snprintf(err, errlen, "fake: %zu bytes at %p are not device memory", n,
                 to_host ? src : dst);
        return TUTTI_ERR_DEVICE;
    }
    if (to_host ? fake.fail_to_host : fake.fail_to_dev) {
        snprintf(err, errlen, "fakeMemcpy%s: injected failure", to_host ? "DtoH" : "HtoD");
        return TUTTI_ERR_DEVICE;
    }
    fake.copies_unpinned += !pinned(to_host ? dst : src, n);
    if (to_host) {
        memcpy(dst, b, n);
        fake.copies_in++;
        if (fake.after_in)
            fake.after_in();
    } else {
        memcpy(b, src, n);
        fake.copies_back++;
    }
    return TUTTI_OK;
}

static const tt_dev_ops_t fake_ops = {
    .name = "fake", .query = fake_query, .copy = fake_copy, .pin = fake_pin, .unpin = fake_unpin
};

/* This rank's device: size bytes, none of it readable through the device view. */
static int fake_init(size_t size)
{
    int fd = memfd_create("tutti-fake-device", 0);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0)
        return -1;
    fake.dev = mmap(NULL, size, PROT_NONE, MAP_SHARED, fd, 0);
    fake.back = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (fake.dev == MAP_FAILED || fake.back == MAP_FAILED)
        return -1;
    fake.size = size;
    fake.used = 0;
    return 0;
}

/* n bytes of device memory (64-byte aligned), filled with byte b */
static void *dev_alloc(size_t n, int b)
{
    size_t at = (fake.used + 63) & ~(size_t)63;
    if (at + n > fake.size)
        return NULL;
    fake.used = at + n;
    memset(fake.back + at, b, n);
    return fake.dev + at;
}

static void dev_write(void *d, const void *src, size_t n)
{
    memcpy(fake_back(d, n), src, n);
}

static void dev_read(void *dst, const void *d, size_t n)
{
    memcpy(dst, fake_back(d, n), n);
}

/* device int32s from host values */
static int32_t *dev_ints(const int32_t *h, size_t n)
{
    int32_t *d = dev_alloc(n * 4, 0);
    if (d)
        dev_write(d, h, n * 4);
    return d;
}

/* ---- every collective on device buffers, against references ---- */

#define SENT ((int32_t)0x5a5a5a5a) /* what a call must leave alone */

/* rank r's input element i */
static int32_t in_val(int r, size_t i)
{
    return (int32_t)(r * 1000 + (int)(i % 100000));
}

/* device result d (n int32s) against host reference want */
static int check_dev(int rank, const char *what, const int32_t *d, const int32_t *want, size_t n)
{
    int32_t *got = malloc(n * 4 + 1);
    dev_read(got, d, n * 4);
    for (size_t i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            fprintf(stderr, "rank %d: %s: [%zu] = %d, expected %d\n", rank, what, i, got[i],
                    want[i]);
            free(got);
            return 1;
        }
    }
    free(got);
    return 0;
}

#define CHECK_DEV(what, d, want, n)                                                                \
    do {                                                                                           \
        if (check_dev(rank, what, d, want, n))                                                     \
            return 1;                                                                              \
    } while (0)
#define OKC(call)                                                                                  \
    do {                                                                                           \
        int st_ = (call);                                                                          \
        FAIL_IF(st_ != 0, "%s: %s: %s", #call, tutti_status_name(st_),                             \
                tutti_comm_last_error(comm));                                                      \
    } while (0)

static int rank_collectives(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    const size_t N = *(const size_t *)arg; /* elements a rank contributes */
    FAIL_IF(fake_init(64u << 20) != 0, "fake device");
    const char *devname = tutti_comm_device(comm);
    FAIL_IF(!devname || strcmp(devname, "fake"), "tutti_comm_device: %s",
            devname ? devname : "NULL");
    int32_t *h = malloc(N * n * 4 * 2 + 64), *want = malloc(N * n * 4 * 2 + 64);
    FAIL_IF(!h || !want, "malloc");
    for (size_t i = 0; i < N; i++)
        h[i] = in_val(rank, i);
    int32_t *x = dev_ints(h, N), *y = dev_alloc(N * 4, 0x11);

    /* allreduce, out of place and in place */
    OKC(tutti_allreduce(comm, x, y, N, TUTTI_INT32, TUTTI_SUM));
    for (size_t i = 0; i < N; i++) {
        want[i] = 0;
        for (int r = 0; r < n; r++)
            want[i] += in_val(r, i);
    }
    CHECK_DEV("allreduce", y, want, N);
    CHECK_DEV("allreduce's sendbuf", x, h, N);
    int32_t *z = dev_ints(h, N);
    OKC(tutti_allreduce(comm, TUTTI_IN_PLACE, z, N, TUTTI_INT32, TUTTI_SUM));
    CHECK_DEV("allreduce in place", z, want, N);

    /* mixed: host in, device out; device in, host out */
    int32_t *hy = malloc(N * 4);
    OKC(tutti_allreduce(comm, h, y, N, TUTTI_INT32, TUTTI_MAX));
    for (size_t i = 0; i < N; i++)
        want[i] = in_val(n - 1, i);
    CHECK_DEV("allreduce host to device", y, want, N);
    OKC(tutti_allreduce(comm, x, hy, N, TUTTI_INT32, TUTTI_MIN));
    for (size_t i = 0; i < N; i++)
        FAIL_IF(hy[i] != in_val(0, i), "allreduce device to host [%zu] = %d", i, hy[i]);
    free(hy);

    /* AVG on floats */
    float *hf = malloc(N * 4);
    for (size_t i = 0; i < N; i++)
        hf[i] = (float)(rank + 1) * 0.5f + (float)(i % 7);
    float *f = dev_alloc(N * 4, 0);
    dev_write(f, hf, N * 4);
    OKC(tutti_allreduce(comm, TUTTI_IN_PLACE, f, N, TUTTI_FP32, TUTTI_AVG));
    dev_read(hf, f, N * 4);
    for (size_t i = 0; i < N; i++) {
        float w = (float)(n + 1) * 0.25f + (float)(i % 7); /* mean of (r + 1) / 2 */
        FAIL_IF(hf[i] < w - 1e-4f || hf[i] > w + 1e-4f, "avg [%zu] = %g, expected %g", i,
                (double)hf[i], (double)w);
    }
    free(hf);

    /* broadcast from rank 1: the others' device buffer takes the root's */
    int32_t *b = dev_alloc(N * 4, 0x22);
    if (rank == 1)
        dev_write(b, h, N * 4);
    OKC(tutti_broadcast(comm, TUTTI_IN_PLACE, b, N, TUTTI_INT32, 1));
    for (size_t i = 0; i < N; i++)
        want[i] = in_val(1, i);
    CHECK_DEV("broadcast", b, want, N);

    /* reduce at the last rank (its recvbuf only) */
    int32_t *rr = dev_alloc(N * 4, 0x33);
    OKC(tutti_reduce(comm, x, rr, N, TUTTI_INT32, TUTTI_SUM, n - 1));
    if (rank == n - 1) {
        for (size_t i = 0; i < N; i++) {
            want[i] = 0;
            for (int r = 0; r < n; r++)
                want[i] += in_val(r, i);
        }
        CHECK_DEV("reduce", rr, want, N);
    }

    /* allgather, out of place and in place */
    int32_t *g = dev_alloc(N * n * 4, 0x44);
    OKC(tutti_allgather(comm, x, g, N, TUTTI_INT32));
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < N; i++)
            want[(size_t)r * N + i] = in_val(r, i);
    CHECK_DEV("allgather", g, want, N * n);
    int32_t *g2 = dev_alloc(N * n * 4, 0x44);
    dev_write(g2 + (size_t)rank * N, h, N * 4);
    OKC(tutti_allgather(comm, TUTTI_IN_PLACE, g2, N, TUTTI_INT32));
    CHECK_DEV("allgather in place", g2, want, N * n);

    /* allgatherv with gaps between the blocks: the gaps keep their bytes */
    size_t *cnt = calloc(n, sizeof(size_t)), *dsp = calloc(n, sizeof(size_t)), ext = 0;
    for (int r = 0; r < n; r++) {
        cnt[r] = N - (size_t)r;
        dsp[r] = (size_t)r * (N + 5);
        ext = dsp[r] + cnt[r];
    }
    int32_t *gv = dev_alloc(ext * 4, 0x5a);
    OKC(tutti_allgatherv(comm, x, gv, cnt, dsp, TUTTI_INT32));
    for (size_t i = 0; i < ext; i++)
        want[i] = SENT;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < cnt[r]; i++)
            want[dsp[r] + i] = in_val(r, i);
    CHECK_DEV("allgatherv", gv, want, ext);

    /* reduce_scatter: N elements each, from n * N of input */
    int32_t *hin = malloc(N * n * 4);
    for (size_t j = 0; j < N * n; j++)
        hin[j] = in_val(rank, j);
    int32_t *rsin = dev_ints(hin, N * n), *rs = dev_alloc(N * 4, 0x66);
    OKC(tutti_reduce_scatter(comm, rsin, rs, N, TUTTI_INT32, TUTTI_SUM));
    for (size_t i = 0; i < N; i++) {
        want[i] = 0;
        for (int r = 0; r < n; r++)
            want[i] += in_val(r, (size_t)rank * N + i);
    }
    CHECK_DEV("reduce_scatter", rs, want, N);
    /* in place: the result at the start of the input */
    OKC(tutti_reduce_scatter(comm, TUTTI_IN_PLACE, rsin, N, TUTTI_INT32, TUTTI_SUM));
    CHECK_DEV("reduce_scatter in place", rsin, want, N);

    /* gather at rank 0, scatter from rank 1 */
    int32_t *ga = dev_alloc(N * n * 4, 0x77);
    OKC(tutti_gather(comm, x, ga, N, TUTTI_INT32, 0));
    if (rank == 0) {
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < N; i++)
                want[(size_t)r * N + i] = in_val(r, i);
        CHECK_DEV("gather", ga, want, N * n);
    }
    int32_t *sc_in = rank == 1 ? dev_ints(hin, N * n) : NULL, *sc = dev_alloc(N * 4, 0x78);
    OKC(tutti_scatter(comm, sc_in, sc, N, TUTTI_INT32, 1));
    for (size_t i = 0; i < N; i++)
        want[i] = in_val(1, (size_t)rank * N + i);
    CHECK_DEV("scatter", sc, want, N);

    /* alltoall: block j of rank r goes to rank j */
    int32_t *a2 = dev_alloc(N * n * 4, 0x79);
    int32_t *a2in = dev_ints(hin, N * n);
    OKC(tutti_alltoall(comm, a2in, a2, N, TUTTI_INT32));
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < N; i++)
            want[(size_t)r * N + i] = in_val(r, (size_t)rank * N + i);
    CHECK_DEV("alltoall", a2, want, N * n);
    OKC(tutti_alltoall(comm, TUTTI_IN_PLACE, a2in, N, TUTTI_INT32));
    CHECK_DEV("alltoall in place", a2in, want, N * n);

    /* scan and exscan; exscan leaves rank 0's recvbuf as it was */
    int32_t *sn = dev_alloc(N * 4, 0x5a), *ex = dev_alloc(N * 4, 0x5a);
    OKC(tutti_scan(comm, x, sn, N, TUTTI_INT32, TUTTI_SUM));
    OKC(tutti_exscan(comm, x, ex, N, TUTTI_INT32, TUTTI_SUM));
    for (size_t i = 0; i < N; i++) {
        want[i] = 0;
        for (int r = 0; r <= rank; r++)
            want[i] += in_val(r, i);
    }
    CHECK_DEV("scan", sn, want, N);
    for (size_t i = 0; i < N; i++)
        want[i] = rank == 0 ? SENT : want[i] - in_val(rank, i);
    CHECK_DEV("exscan", ex, want, N);

    /* async: three at once, waited for in reverse */
    int32_t *as[3];
    tutti_work_t *w[3];
    for (int k = 0; k < 3; k++) {
        as[k] = dev_alloc(N * 4, 0);
        OKC(tutti_allreduce_async(comm, x, as[k], N, TUTTI_INT32,
                                  k == 0   ? TUTTI_SUM
                                  : k == 1 ? TUTTI_MAX
                                           : TUTTI_MIN,
                                  &w[k]));
    }
    for (int k = 2; k >= 0; k--) {
        FAIL_IF(tutti_wait(w[k], -1) != 0, "async %d: %s", k, tutti_work_error(w[k]));
        tutti_work_free(w[k]);
    }
    for (size_t i = 0; i < N; i++) {
        want[i] = 0;
        for (int r = 0; r < n; r++)
            want[i] += in_val(r, i);
    }
    CHECK_DEV("allreduce_async sum", as[0], want, N);
    for (size_t i = 0; i < N; i++)
        want[i] = in_val(n - 1, i);
    CHECK_DEV("allreduce_async max", as[1], want, N);
    for (size_t i = 0; i < N; i++)
        want[i] = in_val(0, i);
    CHECK_DEV("allreduce_async min", as[2], want, N);

    /* point to point around the ring, async, and a receive from any source */
    int right = (rank + 1) % n, left = (rank + n - 1) % n;
    int32_t *pr = dev_alloc(N * 4, 0);
    tutti_work_t *ws, *wr;
    OKC(tutti_recv_async(comm, pr, N, TUTTI_INT32, left, 3, &wr));
    OKC(tutti_send_async(comm, x, N, TUTTI_INT32, right, 3, &ws));
    FAIL_IF(tutti_wait(ws, -1) != 0, "send: %s", tutti_work_error(ws));
    FAIL_IF(tutti_wait(wr, -1) != 0, "recv: %s", tutti_work_error(wr));
    tutti_work_free(ws);
    tutti_work_free(wr);
    for (size_t i = 0; i < N; i++)
        want[i] = in_val(left, i);
    CHECK_DEV("recv", pr, want, N);
    if (rank == 0) {
        int32_t *any = dev_alloc(N * 4, 0);
        for (int k = 1; k < n; k++) {
            tutti_work_t *wa;
            OKC(tutti_recv_async(comm, any, N, TUTTI_INT32, TUTTI_ANY_SOURCE, 4, &wa));
            FAIL_IF(tutti_wait(wa, -1) != 0, "any: %s", tutti_work_error(wa));
            int src = tutti_work_source(wa);
            tutti_work_free(wa);
            FAIL_IF(src < 1 || src >= n, "any source: %d", src);
            for (size_t i = 0; i < N; i++)
                want[i] = in_val(src, i);
            CHECK_DEV("recv from any source", any, want, N);
        }
    } else {
        OKC(tutti_send(comm, x, N, TUTTI_INT32, 0, 4));
    }
    OKC(tutti_barrier(comm));
    FAIL_IF(fake.copies_in == 0 || fake.copies_back == 0, "no copies: %ld in, %ld back",
            fake.copies_in, fake.copies_back);
    /* every copy from a pinned block, no pin broke a rule, and few blocks kept: the pool
     * keeps no more bytes than the ops held at once (here three async allreduces in
     * flight together, or one gather's receive buffer) */
    FAIL_IF(fake.copies_unpinned || fake.pin_errors || fake.npins < 1 || fake.npins > 6,
            "pinning: %ld copies unpinned, %ld errors, %d blocks pinned", fake.copies_unpinned,
            fake.pin_errors, fake.npins);
    free(cnt);
    free(dsp);
    free(hin);
    free(h);
    free(want);
    return 0;
}

static size_t small_n = 1000, big_n = 300000; /* 4 KB and 1.2 MB a rank */

START_TEST(every_collective)
{
    tt_dev_override(&fake_ops);
    ck_assert_int_eq(th_run(3, rank_collectives, &small_n, 60000), 0);
    ck_assert_int_eq(th_run(2, rank_collectives, &big_n, 120000), 0);
    tt_dev_override(NULL);
}
END_TEST

/* ---- the forms the first case does not run, and order ---- */

static int32_t geti(const int32_t *d, size_t i)
{
    int32_t v;
    dev_read(&v, d + i, 4);
    return v;
}

/* 3 ranks: gatherv, scatterv, alltoallv and reduce_scatterv with gaps and a first block
 * that does not start at 0; gather in place at the root, scatter leaving the root's block
 * in sendbuf, reduce into a NULL recvbuf at the other ranks and in place at the root,
 * count 0 */
static int rank_forms(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    FAIL_IF(fake_init(4u << 20) != 0, "fake device");
    enum { B = 5 };
    size_t cnt[3], dsp[3], ext = 0, tot = 0;
    for (int r = 0; r < n; r++) {
        cnt[r] = B + (size_t)r;
        dsp[r] = (size_t)r * (B + 10) + 3;
        ext = dsp[r] + cnt[r];
        tot += cnt[r];
    }
    int32_t h[64];
    for (int i = 0; i < 64; i++)
        h[i] = rank * 100 + i;
    int32_t *x = dev_ints(h, 64);
    /* gatherv at rank 1: the blocks where displs say, the gaps untouched */
    int32_t *gv = dev_alloc(ext * 4, 0x5a);
    OKC(tutti_gatherv(comm, x, cnt[rank], rank == 1 ? gv : NULL, cnt, dsp, TUTTI_INT32, 1));
    for (size_t i = 0; rank == 1 && i < ext; i++) {
        int32_t w = SENT;
        for (int r = 0; r < n; r++)
            if (i >= dsp[r] && i < dsp[r] + cnt[r])
                w = r * 100 + (int32_t)(i - dsp[r]);
        FAIL_IF(geti(gv, i) != w, "gatherv [%zu] = %d, expected %d", i, geti(gv, i), w);
    }
    /* gather in place at rank 0 */
    int32_t *g = dev_alloc((size_t)n * B * 4, 0);
    if (rank == 0)
        dev_write(g, h, B * 4);
    OKC(tutti_gather(comm, rank == 0 ? TUTTI_IN_PLACE : (const void *)x, rank == 0 ? g : NULL, B,
                     TUTTI_INT32, 0));
    for (int r = 0; rank == 0 && r < n; r++)
        for (int i = 0; i < B; i++)
            FAIL_IF(geti(g, (size_t)r * B + i) != r * 100 + i, "gather in place [%d][%d] = %d", r,
                    i, geti(g, (size_t)r * B + i));
    /* scatterv from rank 0: this rank's block, nothing past it */
    int32_t t[256];
    for (int i = 0; i < 256; i++)
        t[i] = i;
    int32_t *sv = rank == 0 ? dev_ints(t, ext) : NULL, *so = dev_alloc(64 * 4, 0x5a);
    OKC(tutti_scatterv(comm, sv, cnt, dsp, so, cnt[rank], TUTTI_INT32, 0));
    for (size_t i = 0; i <= cnt[rank]; i++) {
        int32_t w = i < cnt[rank] ? (int32_t)(dsp[rank] + i) : SENT;
        FAIL_IF(geti(so, i) != w, "scatterv [%zu] = %d, expected %d", i, geti(so, i), w);
    }
    /* scatter whose root keeps its block in sendbuf (TUTTI_IN_PLACE_OUT) */
    int32_t *ss = dev_ints(t, (size_t)n * B), *sr = dev_alloc(B * 4, 0);
    OKC(tutti_scatter(comm, rank == 0 ? ss : NULL, rank == 0 ? TUTTI_IN_PLACE_OUT : (void *)sr, B,
                      TUTTI_INT32, 0));
    for (int i = 0; i < B; i++)
        FAIL_IF(geti(rank == 0 ? ss : sr, (size_t)i) != rank * B + i, "scatter [%d] = %d", i,
                geti(rank == 0 ? ss : sr, (size_t)i));
    /* alltoallv with gaps on both sides */
    size_t sc[3], sd[3], rc[3], rd[3], sext = 0, rext = 0;
    for (int r = 0; r < n; r++) {
        sc[r] = 2 + (size_t)rank;
        sd[r] = (size_t)r * 9 + 1;
        rc[r] = 2 + (size_t)r;
        rd[r] = (size_t)r * 11 + 2;
        sext = sd[r] + sc[r];
        rext = rd[r] + rc[r];
    }
    int32_t *ai = dev_ints(h, sext), *ao = dev_alloc(rext * 4, 0x5a);
    OKC(tutti_alltoallv(comm, ai, sc, sd, ao, rc, rd, TUTTI_INT32));
    for (size_t i = 0; i < rext; i++) {
        int32_t w = SENT;
        for (int r = 0; r < n; r++)
            if (i >= rd[r] && i < rd[r] + rc[r])
                w = r * 100 + (int32_t)((size_t)rank * 9 + 1 + i - rd[r]);
        FAIL_IF(geti(ao, i) != w, "alltoallv [%zu] = %d, expected %d", i, geti(ao, i), w);
    }
    /* reduce_scatterv */
    int32_t *ri = dev_ints(h, tot), *ro = dev_alloc(64 * 4, 0x5a);
    OKC(tutti_reduce_scatterv(comm, ri, ro, cnt, TUTTI_INT32, TUTTI_SUM));
    size_t off = 0;
    for (int r = 0; r < rank; r++)
        off += cnt[r];
    for (size_t i = 0; i <= cnt[rank]; i++) {
        int32_t w = SENT;
        if (i < cnt[rank])
            for (int r = w = 0; r < n; r++)
                w += r * 100 + (int32_t)(off + i);
        FAIL_IF(geti(ro, i) != w, "reduce_scatterv [%zu] = %d, expected %d", i, geti(ro, i), w);
    }
    /* reduce at rank 2: NULL recvbuf elsewhere, in place there */
    int32_t *rr = dev_ints(h, 8);
    OKC(tutti_reduce(comm, rank == 2 ? TUTTI_IN_PLACE : (const void *)rr, rank == 2 ? rr : NULL, 8,
                     TUTTI_INT32, TUTTI_SUM, 2));
    for (int i = 0; i < 8; i++) {
        int32_t w = rank * 100 + i;
        for (int r = 0; rank == 2 && r < n; r++)
            w += r == rank ? 0 : r * 100 + i;
        FAIL_IF(geti(rr, (size_t)i) != w, "reduce [%d] = %d, expected %d", i, geti(rr, (size_t)i),
                w);
    }
    OKC(tutti_allreduce(comm, x, x + 1, 0, TUTTI_INT32, TUTTI_SUM));
    return 0;
}

/* A write to device memory while an op runs (after_in: as the op starts) to bytes the op
 * does not write: an allgatherv's gap, the other blocks of an in-place reduce_scatter.
 * The copy back must leave them alone. */
static int32_t *poke_at, poke_val;

static void poke(void)
{
    if (poke_at)
        dev_write(poke_at, &poke_val, 4);
}

/* 2 ranks: async ops on one buffer run in issue order (each copies in when it starts);
 * the copy back writes only what the op writes */
static int rank_order(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    FAIL_IF(fake_init(1u << 20) != 0, "fake device");
    int32_t one[16];
    for (int i = 0; i < 16; i++)
        one[i] = 1;
    int32_t *d = dev_ints(one, 16);
    tutti_work_t *a, *b;
    OKC(tutti_allreduce_async(comm, TUTTI_IN_PLACE, d, 16, TUTTI_INT32, TUTTI_SUM, &a));
    OKC(tutti_allreduce_async(comm, TUTTI_IN_PLACE, d, 16, TUTTI_INT32, TUTTI_SUM, &b));
    FAIL_IF(tutti_wait(a, -1) != 0 || tutti_wait(b, -1) != 0, "waits");
    tutti_work_free(a);
    tutti_work_free(b);
    FAIL_IF(geti(d, 7) != n * n, "two in-place allreduces in a row: %d, expected %d", geti(d, 7),
            n * n);
    /* allgatherv with a gap, poked as the op starts */
    size_t cnt[2] = { 4, 4 }, dsp[2] = { 0, 8 };
    int32_t *x = dev_ints(one, 4), *g = dev_alloc(12 * 4, 0x11);
    poke_at = g + 5, poke_val = 777;
    fake.after_in = poke;
    OKC(tutti_allgatherv(comm, x, g, cnt, dsp, TUTTI_INT32));
    FAIL_IF(geti(g, 5) != 777, "allgatherv wrote its gap back: %#x", (unsigned)geti(g, 5));
    FAIL_IF(geti(g, 9) != 1 || geti(g, 3) != 1, "allgatherv");
    /* reduce_scatter in place as NCCL's: recvbuf is this rank's block of sendbuf */
    int32_t *s = dev_ints(one, 8);
    poke_at = s + (rank == 0 ? 4 : 0), poke_val = 999;
    OKC(tutti_reduce_scatter(comm, s, s + rank * 4, 4, TUTTI_INT32, TUTTI_SUM));
    fake.after_in = NULL;
    FAIL_IF(geti(s, rank == 0 ? 4 : 0) != 999, "reduce_scatter wrote another block back: %d",
            geti(s, rank == 0 ? 4 : 0));
    FAIL_IF(geti(s, (size_t)rank * 4 + 1) != n, "reduce_scatter: %d",
            geti(s, (size_t)rank * 4 + 1));
    return 0;
}

/* 1 rank: the local paths */
static int rank_one(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg, (void)n;
    FAIL_IF(fake_init(1u << 20) != 0, "fake device");
    int32_t h[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    int32_t *x = dev_ints(h, 8), *y = dev_alloc(64, 0x5a);
    size_t c[1] = { 3 }, d[1] = { 2 };
    OKC(tutti_allgatherv(comm, x, y, c, d, TUTTI_INT32));
    FAIL_IF(geti(y, 1) != SENT || geti(y, 2) != 1 || geti(y, 4) != 3 || geti(y, 5) != SENT,
            "allgatherv");
    OKC(tutti_exscan(comm, x, y, 8, TUTTI_INT32, TUTTI_SUM));
    FAIL_IF(geti(y, 0) != SENT, "exscan wrote rank 0's recvbuf");
    float hf[4] = { 2, 4, 6, 8 }, got[4];
    float *f = dev_alloc(16, 0);
    dev_write(f, hf, 16);
    OKC(tutti_allreduce(comm, TUTTI_IN_PLACE, f, 4, TUTTI_FP32, TUTTI_AVG));
    dev_read(got, f, 16);
    FAIL_IF(memcmp(got, hf, 16), "avg of one rank");
    return 0;
}

START_TEST(forms_and_order)
{
    tt_dev_override(&fake_ops);
    ck_assert_int_eq(th_run(3, rank_forms, NULL, 60000), 0);
    ck_assert_int_eq(th_run(2, rank_order, NULL, 60000), 0);
    ck_assert_int_eq(th_run(1, rank_one, NULL, 60000), 0);
    tt_dev_override(NULL);
}
END_TEST

/* ---- the host blocks: pinned, kept, unpinned ---- */

/* allreduces of growing sizes on one rank: each block a size outgrows is let go
 * (unpinned, freed), the two largest kept */
static void one_rank_sizes(tutti_comm_t *comm, void *arg)
{
    (void)arg;
    const size_t sizes[] = { 1000, 300000, 10, 600000, 900000, 1000 };
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        const size_t n = sizes[k];
        int32_t *h = malloc(n * 4), *x, *y;
        ck_assert_ptr_nonnull(h);
        for (size_t i = 0; i < n; i++)
            h[i] = in_val(0, i) + (int32_t)k;
        ck_assert_ptr_nonnull(x = dev_ints(h, n));
        ck_assert_ptr_nonnull(y = dev_alloc(n * 4, 0x11));
        ck_assert_int_eq(tutti_allreduce(comm, x, y, n, TUTTI_INT32, TUTTI_SUM), 0);
        ck_assert_int_eq(tutti_allreduce(comm, TUTTI_IN_PLACE, x, n, TUTTI_INT32, TUTTI_MAX), 0);
        ck_assert_int_eq(check_dev(0, "1-rank allreduce", y, h, n), 0);
        ck_assert_int_eq(check_dev(0, "1-rank allreduce in place", x, h, n), 0);
        ck_assert_int_le(fake.npins, 2);
        free(h);
    }
}

/* A failed pin leaves the block pageable: the copies still run, and still right. */
static int rank_pin_fails(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    FAIL_IF(fake_init(16u << 20) != 0, "fake device");
    fake.fail_pin = 1;
    enum { N = 50000 };
    int32_t h[N], want[N];
    for (size_t i = 0; i < N; i++) {
        h[i] = in_val(rank, i);
        want[i] = 0;
        for (int r = 0; r < n; r++)
            want[i] += in_val(r, i);
    }
    int32_t *x = dev_ints(h, N);
    OKC(tutti_allreduce(comm, TUTTI_IN_PLACE, x, N, TUTTI_INT32, TUTTI_SUM));
    CHECK_DEV("allreduce from an unpinned block", x, want, N);
    FAIL_IF(fake.npins || !fake.pin_calls || !fake.copies_unpinned,
            "%d pinned, %ld pin calls, %ld unpinned copies", fake.npins, fake.pin_calls,
            fake.copies_unpinned);
    return 0;
}

START_TEST(host_blocks)
{
    tt_dev_override(&fake_ops);
    ck_assert_int_eq(fake_init(64u << 20), 0);
    char err[256];
    ck_assert_int_eq(th_init_one(NULL, err, sizeof(err), one_rank_sizes, NULL), 0);
    /* the communicator's destroy unpinned what it kept, each block once */
    ck_assert_int_eq(fake.npins, 0);
    ck_assert_int_eq(fake.pin_errors, 0);
    ck_assert_int_eq(fake.copies_unpinned, 0);
    ck_assert_int_eq(fake.pin_calls, fake.unpin_calls);
    ck_assert_int_ge(fake.pin_calls, 4); /* 4 KB, 1.2 MB, 2.4 MB, 3.6 MB */
    ck_assert_int_eq(th_run(2, rank_pin_fails, NULL, 60000), 0);
    tt_dev_override(NULL);
}
END_TEST

/* ---- copies that fail ---- */

/* The copy back fails after the call, on every rank: this rank's failure alone, the
 * communicator goes on. */
static int rank_failures(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    FAIL_IF(fake_init(1u << 20) != 0, "fake device");
    int32_t hx[256];
    for (int i = 0; i < 256; i++)
        hx[i] = rank + i;
    int32_t *x = dev_ints(hx, 256), *y = dev_alloc(1024, 0);
    fake.fail_to_dev = 1;
    int st = tutti_allreduce(comm, x, y, 256, TUTTI_INT32, TUTTI_SUM);
    const char *e = tutti_comm_last_error(comm);
    FAIL_IF(st != TUTTI_ERR_DEVICE, "copy back: %s", tutti_status_name(st));
    FAIL_IF(!strstr(e, "rank") || !strstr(e, "allreduce seq") ||
                !strstr(e, "back to fake device memory") || !strstr(e, "recvbuf") ||
                !strstr(e, "injected"),
            "copy back: %s", e);
    tutti_work_t *w;
    OKC(tutti_allgather_async(comm, x, y, 1, TUTTI_INT32, &w));
    st = tutti_wait(w, -1);
    FAIL_IF(st != TUTTI_ERR_DEVICE || !strstr(tutti_work_error(w), "allgather"),
            "async copy back: %s: %s", tutti_status_name(st), tutti_work_error(w));
    tutti_work_free(w);
    fake.fail_to_dev = 0;
    /* the fuser packs with memcpy: it refuses device memory, before anything is sent */
    void *bufs[2] = { hx, x };
    size_t counts[2] = { 4, 4 };
    tutti_dtype_t dts[2] = { TUTTI_INT32, TUTTI_INT32 };
    st = tutti_allreduce_coalesced(comm, bufs, counts, dts, 2, TUTTI_SUM, 0);
    e = tutti_comm_last_error(comm);
    FAIL_IF(st != TUTTI_ERR_UNSUPPORTED || !strstr(e, "tensor 1 is fake device memory"),
            "coalesced: %s: %s", tutti_status_name(st), e);
    tutti_fuse_t *fu;
    OKC(tutti_fuse_create(&fu, comm, NULL));
    int idx;
    st = tutti_fuse_register(fu, x, 4, TUTTI_INT32, &idx);
    FAIL_IF(st != TUTTI_ERR_UNSUPPORTED, "fuse_register: %s", tutti_status_name(st));
    tutti_fuse_destroy(fu);
    OKC(tutti_allreduce(comm, x, y, 256, TUTTI_INT32, TUTTI_SUM));
    int32_t got[256];
    dev_read(got, y, sizeof(got));
    for (int i = 0; i < 256; i++)
        FAIL_IF(got[i] != n * i + n * (n - 1) / 2, "after: [%d] = %d", i, got[i]);
    return 0;
}

/* The copy in fails on rank 1 alone: rank 1 cannot take part, so the op fails on every
 * rank, at once (told as a rank's failure is), never pairing rank 0's call with rank 1's
 * next one. */
static int rank_copy_in_fails(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg, (void)n;
    FAIL_IF(fake_init(1u << 20) != 0, "fake device");
    int32_t ha[4] = { 1, 1, 1, 1 }, hb[4] = { 100, 100, 100, 100 };
    int32_t *a = dev_ints(ha, 4), *b = dev_ints(hb, 4), *y = dev_alloc(16, 0);
    fake.fail_to_host = rank == 1;
    double t0 = th_now_ms();
    int st = tutti_allreduce(comm, a, y, 4, TUTTI_INT32, TUTTI_SUM);
    double took = th_now_ms() - t0;
    char e[1024];
    snprintf(e, sizeof(e), "%s", tutti_comm_last_error(comm));
    fake.fail_to_host = 0;
    int st2 = tutti_allreduce(comm, b, y, 4, TUTTI_INT32, TUTTI_SUM);
    if (rank == 1) {
        FAIL_IF(st != TUTTI_ERR_DEVICE, "copy in: %s", tutti_status_name(st));
        FAIL_IF(!strstr(e, "rank 1") || !strstr(e, "allreduce seq 0") || !strstr(e, "sendbuf") ||
                    !strstr(e, "injected"),
                "copy in: %s", e);
    } else {
        FAIL_IF(st == 0, "rank 0's allreduce succeeded without rank 1's data (y[0] = %d)",
                geti(y, 0));
        FAIL_IF(!strstr(e, "rank 1") || !strstr(e, "injected"), "rank 0 was told: %s", e);
        FAIL_IF(took > 10000, "rank 0 learnt it after %.0f ms", took);
    }
    FAIL_IF(st2 == 0, "the next allreduce succeeded after a failed one");
    return 0;
}

/* A receive's copy back fails: that receive alone. */
static int rank_recv_back_fails(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg, (void)n;
    FAIL_IF(fake_init(1u << 20) != 0, "fake device");
    int32_t h[64];
    for (int i = 0; i < 64; i++)
        h[i] = i;
    int32_t *d = dev_alloc(sizeof(h), 0);
    if (rank == 0) {
        OKC(tutti_send(comm, h, 64, TUTTI_INT32, 1, 5));
    } else {
        fake.fail_to_dev = 1;
        int st = tutti_recv(comm, d, 64, TUTTI_INT32, 0, 5);
        const char *e = tutti_comm_last_error(comm);
        FAIL_IF(st != TUTTI_ERR_DEVICE || !strstr(e, "recv") ||
                    !strstr(e, "back to fake device memory") || !strstr(e, "buf"),
                "recv's copy back: %s: %s", tutti_status_name(st), e);
        fake.fail_to_dev = 0;
    }
    OKC(tutti_allreduce(comm, h, d, 64, TUTTI_INT32, TUTTI_SUM));
    FAIL_IF(geti(d, 5) != 10, "after: %d", geti(d, 5));
    return 0;
}

/* What fails rank 1's op before it can run, and must fail rank 0's at once: a send's copy
 * in (arg 0), the layer failing to say what a pointer is at the call (arg 1). */
static int rank_one_sided(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)n;
    const int how = *(const int *)arg;
    FAIL_IF(fake_init(1u << 20) != 0, "fake device");
    int32_t h[16] = { 1 };
    int32_t *d = dev_ints(h, 16);
    double t0 = th_now_ms();
    int st;
    if (how == 0) {
        fake.fail_to_host = rank == 1;
        st = rank == 1 ? tutti_send(comm, d, 16, TUTTI_INT32, 0, 6)
                       : tutti_recv(comm, d, 16, TUTTI_INT32, 1, 6);
    } else {
        fake.fail_query = rank == 1;
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, d, 16, TUTTI_INT32, TUTTI_SUM);
    }
    double took = th_now_ms() - t0;
    fake.fail_to_host = fake.fail_query = 0;
    const char *e = tutti_comm_last_error(comm);
    FAIL_IF(st == 0, "%s succeeded", how ? "allreduce" : "send/recv");
    FAIL_IF(!strstr(e, "rank 1") || !strstr(e, "injected"), "%s", e);
    FAIL_IF(rank == 1 && (st != TUTTI_ERR_DEVICE ||
                          !strstr(e, how ? "asking fake what sendbuf" : "copying sendbuf")),
            "rank 1: %s: %s", tutti_status_name(st), e);
    FAIL_IF(took > 10000, "learnt it after %.0f ms", took);
    return 0;
}

START_TEST(failed_copies)
{
    tt_dev_override(&fake_ops);
    ck_assert_int_eq(th_run(2, rank_failures, NULL, 60000), 0);
    ck_assert_int_eq(th_run(2, rank_recv_back_fails, NULL, 60000), 0);
    th_spec_t spec = {
        .nranks = 2, .fn = rank_copy_in_fails, .timeout_ms = 60000, .flags = TH_NO_KILL_ON_FAIL
    };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    for (int how = 0; how < 2; how++) {
        spec.fn = rank_one_sided;
        spec.arg = &how;
        ck_assert_msg(th_run_ex(&spec, NULL) == 0, "%s",
                      how ? "a failed query at the call" : "a send's copy in");
    }
    tt_dev_override(NULL);
}
END_TEST

/* ---- TUTTI_CUDA ---- */

static void device_of(tutti_comm_t *comm, void *arg)
{
    *(const char **)arg = tutti_comm_device(comm);
}

/* a communicator of one rank made with opts.cuda = cuda: its status (err: why it failed;
 * *dev_p: what tutti_comm_device said) */
static int init_one(const char *cuda, char *err, size_t errlen, const char **dev_p)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.cuda = cuda;
    if (dev_p)
        *dev_p = NULL;
    return th_init_one(&o, err, errlen, dev_p ? device_of : NULL, dev_p);
}

START_TEST(cuda_option)
{
    char err[1024];
    int st = init_one("bogus", err, sizeof(err), NULL);
    ck_assert_int_eq(st, TUTTI_ERR_CONFIG);
    ck_assert_msg(strstr(err, "TUTTI_CUDA=bogus") && strstr(err, "auto, on or off"), "%s", err);
    const char *dev = "x";
    ck_assert_int_eq(init_one("off", err, sizeof(err), &dev), 0);
    ck_assert_ptr_null(dev);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    int have = h != NULL || access("/dev/nvidiactl", F_OK) == 0;
    if (h)
        dlclose(h);
    ck_assert_int_eq(init_one("auto", err, sizeof(err), &dev), 0);
    ck_assert_msg(have || !dev, "auto without CUDA: %s", dev);
    st = init_one("on", err, sizeof(err), &dev);
    if (!have && st != 0) { /* no driver here: the init says so */
        ck_assert_int_eq(st, TUTTI_ERR_NO_DEVICE);
        ck_assert_msg(strstr(err, "TUTTI_CUDA=on") && strstr(err, "libcuda"), "%s", err);
    } else {
        ck_assert_msg(st == 0, "TUTTI_CUDA=on with a driver: %s", err);
        ck_assert_msg(dev && !strcmp(dev, "CUDA"), "tutti_comm_device: %s", dev);
    }
}
END_TEST

/* ---- the real thing: CUDA's driver API, where there is a GPU ---- */

static struct {
    int (*init)(unsigned);
    int (*device_get_count)(int *);
    int (*device_get)(int *, int);
    int (*primary_retain)(void **, int);
    int (*ctx_set_current)(void *);
    int (*mem_alloc)(unsigned long long *, size_t);
    int (*memcpy_htod)(unsigned long long, const void *, size_t);
    int (*memcpy_dtoh)(void *, unsigned long long, size_t);
    int (*stream_create)(void **, unsigned);
    int (*memcpy_htod_async)(unsigned long long, const void *, size_t, void *);
    int (*memcpy_dtoh_async)(void *, unsigned long long, size_t, void *);
    int (*stream_synchronize)(void *);
    int (*host_register)(void *, size_t, unsigned);
    int (*host_get_device_pointer)(unsigned long long *, void *, unsigned);
    int (*stream_wait_value32)(void *, unsigned long long, uint32_t, unsigned);
} cu;

static int cu_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h)
        return -1;
    const char *names[] = { "cuInit",
                            "cuDeviceGetCount",
                            "cuDeviceGet",
                            "cuDevicePrimaryCtxRetain",
                            "cuCtxSetCurrent",
                            "cuMemAlloc_v2",
                            "cuMemcpyHtoD_v2",
                            "cuMemcpyDtoH_v2",
                            "cuStreamCreate",
                            "cuMemcpyHtoDAsync_v2",
                            "cuMemcpyDtoHAsync_v2",
                            "cuStreamSynchronize",
                            "cuMemHostRegister_v2",
                            "cuMemHostGetDevicePointer_v2",
                            "cuStreamWaitValue32_v2" };
    void **slots = (void **)&cu;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!(slots[i] = dlsym(h, names[i])))
            return -1;
    return 0;
}

/* Rank rank's device (rank mod the count), its primary context current, and (s_p) a
 * non-blocking stream on it: 0, or 1 having said what failed (FAIL_IF). */
static int cu_rank_setup(int rank, int *dev_p, void **s_p)
{
    int count = 0;
    void *ctx;
    FAIL_IF(cu_load() != 0, "libcuda.so.1 went away");
    FAIL_IF(cu.init(0) != 0 || cu.device_get_count(&count) != 0 || count < 1, "no device");
    FAIL_IF(cu.device_get(dev_p, rank % count) != 0 || cu.primary_retain(&ctx, *dev_p) != 0 ||
                cu.ctx_set_current(ctx) != 0,
            "context");
    FAIL_IF(s_p && cu.stream_create(s_p, 1) != 0, "stream");
    return 0;
}

static int rank_cuda(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    int dev;
    if (cu_rank_setup(rank, &dev, NULL) != 0)
        return 1;
    enum { N = 1 << 20 }; /* 4 MiB a rank */
    unsigned long long x, y, g;
    FAIL_IF(cu.mem_alloc(&x, N * 4) || cu.mem_alloc(&y, N * 4) ||
                cu.mem_alloc(&g, (size_t)N * 4 * n),
            "cuMemAlloc");
    int32_t *h = malloc((size_t)N * 4 * n);
    for (int i = 0; i < N; i++)
        h[i] = in_val(rank, (size_t)i);
    FAIL_IF(cu.memcpy_htod(x, h, N * 4) != 0, "HtoD");
    OKC(tutti_allreduce(comm, (void *)(uintptr_t)x, (void *)(uintptr_t)y, N, TUTTI_INT32,
                        TUTTI_SUM));
    FAIL_IF(cu.memcpy_dtoh(h, y, N * 4) != 0, "DtoH");
    for (int i = 0; i < N; i++) {
        int32_t w = 0;
        for (int r = 0; r < n; r++)
            w += in_val(r, (size_t)i);
        FAIL_IF(h[i] != w, "allreduce [%d] = %d, expected %d", i, h[i], w);
    }
    tutti_work_t *wk;
    OKC(tutti_allgather_async(comm, (void *)(uintptr_t)x, (void *)(uintptr_t)g, N, TUTTI_INT32,
                              &wk));
    FAIL_IF(tutti_wait(wk, -1) != 0, "allgather_async: %s", tutti_work_error(wk));
    tutti_work_free(wk);
    FAIL_IF(cu.memcpy_dtoh(h, g, (size_t)N * 4 * n) != 0, "DtoH");
    for (int r = 0; r < n; r++)
        for (int i = 0; i < N; i++)
            FAIL_IF(h[(size_t)r * N + i] != in_val(r, (size_t)i), "allgather [%d][%d] = %d", r, i,
                    h[(size_t)r * N + i]);
    free(h);
    /* the stand-in driver: the host blocks were registered, by its rules */
    int (*pinned_now)(int *) = (int (*)(int *))dlsym(RTLD_DEFAULT, "fake_cuda_pinned");
    int errors = 0, npinned = pinned_now ? pinned_now(&errors) : -1;
    FAIL_IF(pinned_now && (npinned < 1 || errors), "%d host blocks registered, %d errors", npinned,
            errors);
    fprintf(stderr, "rank %d: CUDA device %d: allreduce and allgather of device memory\n", rank,
            dev);
    return 0;
}

/* Stream-ordered calls (tutti_comm_set_stream): the call returns once enqueued, reads
 * its input when the stream gets there, and the stream's later work sees its result.
 * The stream is first held (as by a long kernel; here a wait on a word of host memory
 * that the test sets): the call must return, and leave the result alone, while it is. */
static int rank_cuda_stream(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    int dev;
    void *s;
    if (cu_rank_setup(rank, &dev, &s) != 0)
        return 1;
    enum { N = 1 << 18 }; /* 1 MiB a rank */
    unsigned long long x, y;
    /* pinned: a real driver's async copy to or from pageable memory may wait for the
     * stream (it does to pageable memory), which the test holds */
    int32_t *h = aligned_alloc(4096, N * 4), *out = aligned_alloc(4096, N * 4);
    FAIL_IF(!h || !out || cu.mem_alloc(&x, N * 4) || cu.mem_alloc(&y, N * 4), "alloc");
    FAIL_IF(cu.host_register(h, N * 4, 1) || cu.host_register(out, N * 4, 1), "pinning");
    for (int i = 0; i < N; i++)
        h[i] = SENT;
    FAIL_IF(cu.memcpy_htod(y, h, N * 4) != 0, "HtoD");
    for (int i = 0; i < N; i++)
        h[i] = in_val(rank, (size_t)i);
    OKC(tutti_comm_set_stream(comm, s));
    uint32_t *gate = aligned_alloc(4096, 4096);
    unsigned long long gate_d = 0;
    FAIL_IF(!gate, "alloc");
    *gate = 0;
    FAIL_IF(cu.host_register(gate, 4096, 3 /* portable, device-mapped */) != 0 ||
                cu.host_get_device_pointer(&gate_d, gate, 0) != 0 ||
                cu.stream_wait_value32(s, gate_d, 1, 0 /* >= */) != 0,
            "holding the stream");
    FAIL_IF(cu.memcpy_htod_async(x, h, N * 4, s) != 0, "HtoDAsync");
    OKC(tutti_allreduce(comm, (void *)(uintptr_t)x, (void *)(uintptr_t)y, N, TUTTI_INT32,
                        TUTTI_SUM));
    /* returned with the stream held: nothing of it has run (this copy is on the legacy
     * stream, which the non-blocking s does not hold up) */
    FAIL_IF(cu.memcpy_dtoh(out, y, 16) != 0, "DtoH");
    FAIL_IF(out[0] != SENT || out[3] != SENT, "recvbuf written before its stream got there");
    /* in place, after the first: it reads the first's result */
    OKC(tutti_allreduce(comm, (void *)(uintptr_t)y, (void *)(uintptr_t)y, N, TUTTI_INT32,
                        TUTTI_SUM));
    __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    FAIL_IF(cu.memcpy_dtoh_async(out, y, N * 4, s) != 0, "DtoHAsync");
    FAIL_IF(cu.stream_synchronize(s) != 0, "cuStreamSynchronize");
    for (int i = 0; i < N; i++) {
        int32_t w = 0;
        for (int r = 0; r < n; r++)
            w += in_val(r, (size_t)i);
        FAIL_IF(out[i] != w * n, "stream-ordered allreduces [%d] = %d, expected %d", i, out[i],
                w * n);
    }
    FAIL_IF(tutti_comm_stream_error(comm) != 0, "stream error: %s", tutti_comm_last_error(comm));
    /* host memory in a call (a device input, a host result): not stream-ordered, the
     * result is there when the call returns */
    int32_t *hr = malloc(N * 4);
    FAIL_IF(!hr, "malloc");
    memset(hr, 0, N * 4);
    OKC(tutti_allreduce(comm, (void *)(uintptr_t)x, hr, N, TUTTI_INT32, TUTTI_MIN));
    for (int i = 0; i < N; i++)
        FAIL_IF(hr[i] != in_val(0, (size_t)i), "device-to-host allreduce [%d] = %d", i, hr[i]);
    free(hr);
    void (*capture)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "fake_cuda_capturing");
    if (capture) { /* a stream under graph capture: refused at the call, on every rank */
        capture(1);
        int cst = tutti_allreduce(comm, (void *)(uintptr_t)x, (void *)(uintptr_t)y, N, TUTTI_INT32,
                                  TUTTI_SUM);
        capture(0);
        FAIL_IF(cst != TUTTI_ERR_UNSUPPORTED || !strstr(tutti_comm_last_error(comm), "graph"),
                "under capture: %s: %s", tutti_status_name(cst), tutti_comm_last_error(comm));
    }
    /* unset: a blocking call completes at the call again */
    OKC(tutti_comm_set_stream(comm, NULL));
    OKC(tutti_allreduce(comm, (void *)(uintptr_t)x, (void *)(uintptr_t)y, N, TUTTI_INT32,
                        TUTTI_MAX));
    FAIL_IF(cu.memcpy_dtoh(out, y, N * 4) != 0, "DtoH");
    for (int i = 0; i < N; i++)
        FAIL_IF(out[i] != in_val(n - 1, (size_t)i), "max [%d] = %d", i, out[i]);
    void (*fail_waits)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "fake_cuda_fail_waits");
    if (fail_waits) {
        /* rank 1 cannot enqueue its wait: its call waits for the op and returns its
         * error; the op fails on every rank when it starts, rank 0's (returned at once)
         * naming rank 1; rank 0's stream goes on; both failures are
         * tutti_comm_stream_error's */
        OKC(tutti_comm_set_stream(comm, s));
        fail_waits(rank == 1);
        int cst = tutti_allreduce(comm, (void *)(uintptr_t)x, (void *)(uintptr_t)y, N, TUTTI_INT32,
                                  TUTTI_SUM);
        fail_waits(0);
        FAIL_IF(rank == 1 ? cst != TUTTI_ERR_DEVICE : cst != 0, "the call returned %s: %s",
                tutti_status_name(cst), tutti_comm_last_error(comm));
        FAIL_IF(cu.stream_synchronize(s) != 0, "cuStreamSynchronize");
        int st = tutti_comm_stream_error(comm);
        const char *e = tutti_comm_last_error(comm);
        FAIL_IF(st >= 0, "no stream error after a failed op");
        FAIL_IF(!strstr(e, "stream-ordered") || !strstr(e, "allreduce") ||
                    !strstr(e, rank == 1 ? "enqueuing a wait" : "rank 1"),
                "stream error: %s: %s", tutti_status_name(st), e);
    }
    free(h);
    free(out);
    fprintf(stderr, "rank %d: CUDA device %d: stream-ordered allreduces\n", rank, dev);
    return 0;
}

/* A stream that never reaches the call (rank 0's, held by a wait on a host word that is
 * never set): the op fails when TUTTI_STREAM_TIMEOUT_MS (1.5 s; the op timeout is 5 s)
 * passes, rank 0's stream error saying why, rank 1's naming rank 0; rank
 * 1's stream goes on past the call; rank 0's destroy, with its stream still held,
 * returns (the harness bounds it). */
static int rank_cuda_stream_stuck(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg, (void)n;
    int dev;
    void *s;
    if (cu_rank_setup(rank, &dev, &s) != 0)
        return 1;
    unsigned long long x;
    FAIL_IF(cu.mem_alloc(&x, 4096) != 0, "alloc");
    OKC(tutti_comm_set_stream(comm, s));
    static uint32_t gate[1024] __attribute__((aligned(4096)));
    unsigned long long gate_d = 0;
    FAIL_IF(cu.host_register(gate, 4096, 3) != 0 ||
                cu.host_get_device_pointer(&gate_d, gate, 0) != 0,
            "mapping the gate");
    if (rank == 0)
        FAIL_IF(cu.stream_wait_value32(s, gate_d, 1, 0) != 0, "holding the stream");
    const double t0 = th_now_ms();
    OKC(tutti_allreduce(comm, (void *)(uintptr_t)x, (void *)(uintptr_t)x, 1024, TUTTI_INT32,
                        TUTTI_SUM));
    int st = 0;
    while ((st = tutti_comm_stream_error(comm)) == 0 && th_now_ms() - t0 < 20000)
        usleep(10000);
    const char *e = tutti_comm_last_error(comm);
    FAIL_IF(st >= 0, "no stream error %.0f ms after a call its stream never reached",
            th_now_ms() - t0);
    /* rank 1's op fails as rank 0 reports it, not on a timeout of its own */
    FAIL_IF(st != TUTTI_ERR_TIMEOUT || !strstr(e, "did not reach the call within 1500 ms") ||
                (rank == 1 && !strstr(e, "rank 0")),
            "stream error: %s: %s", tutti_status_name(st), e);
    if (rank == 1)
        FAIL_IF(cu.stream_synchronize(s) != 0, "cuStreamSynchronize past a failed call");
    fprintf(stderr, "rank %d: stream error after %.0f ms: %s\n", rank, th_now_ms() - t0, e);
    return 0;
}

/* ---- stream-ordered calls' edges, on the stand-in driver ---- */

/* A stream held, as by a long kernel: a wait on a mapped host word, until release_stream
 * (or a thread of release_later's) sets it */
static uint32_t *gate_word;
static int hold_stream(int rank, void *s)
{
    static unsigned long long gate_d;
    if (!gate_word) {
        FAIL_IF(!(gate_word = aligned_alloc(4096, 4096)), "alloc");
        FAIL_IF(cu.host_register(gate_word, 4096, 3) != 0 ||
                    cu.host_get_device_pointer(&gate_d, gate_word, 0) != 0,
                "mapping the gate");
    }
    __atomic_store_n(gate_word, 0, __ATOMIC_RELEASE);
    FAIL_IF(cu.stream_wait_value32(s, gate_d, 1, 0) != 0, "holding the stream");
    return 0;
}

static void release_stream(void)
{
    __atomic_store_n(gate_word, 1, __ATOMIC_RELEASE);
}

static void *release_after(void *ms)
{
    usleep((useconds_t)(intptr_t)ms * 1000);
    release_stream();
    return NULL;
}

/* A call that is not stream-ordered (a host recvbuf) waits at the call for its stream's
 * work so far: within TUTTI_STREAM_TIMEOUT_MS (1.5 s), as a stream-ordered op does, then
 * the op fails on every rank (rank 0's stream held 4 s; the wait had no bound, and
 * returned TUTTI_OK after the 4 s) */
static int rank_cuda_drain_stuck(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg, (void)n;
    int dev;
    void *s;
    if (cu_rank_setup(rank, &dev, &s) != 0)
        return 1;
    unsigned long long x;
    int32_t h[1024];
    FAIL_IF(cu.mem_alloc(&x, 4096) != 0, "alloc");
    OKC(tutti_comm_set_stream(comm, s));
    pthread_t th;
    if (rank == 0) {
        if (hold_stream(rank, s) != 0)
            return 1;
        FAIL_IF(pthread_create(&th, NULL, release_after, (void *)(intptr_t)4000) != 0, "thread");
    }
    const double t0 = th_now_ms();
    int st = tutti_allreduce(comm, (void *)(uintptr_t)x, h, 1024, TUTTI_INT32, TUTTI_SUM);
    const double dt = th_now_ms() - t0;
    const char *e = tutti_comm_last_error(comm);
    fprintf(stderr, "rank %d: a call behind a held stream: %s after %.0f ms: %s\n", rank,
            tutti_status_name(st), dt, e);
    if (rank == 0)
        pthread_join(th, NULL);
    FAIL_IF(st >= 0 || dt > 3000, "a call behind a stream held 4 s returned %s after %.0f ms",
            tutti_status_name(st), dt);
    FAIL_IF(rank == 0
                ? st != TUTTI_ERR_TIMEOUT || !strstr(e, "did not reach the call within 1500 ms")
                : !strstr(e, "rank 0"),
            "%s: %s", tutti_status_name(st), e);
    return 0;
}

/* A stream-ordered call whose stream is behind on one rank (rank 0's held 3 s; op
 * timeout 1 s, stream timeout 20 s): the other rank's op, there first, waits for it as
 * NCCL's peers do (it failed at the op timeout, 'no progress within 1000 ms receiving
 * from rank 0'), and both give the sum */
static int rank_cuda_late_stream(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    int dev;
    void *s;
    if (cu_rank_setup(rank, &dev, &s) != 0)
        return 1;
    enum { N = 1024 };
    unsigned long long x;
    int32_t h[N];
    for (int i = 0; i < N; i++)
        h[i] = rank + 1 + i;
    FAIL_IF(cu.mem_alloc(&x, N * 4) != 0 || cu.memcpy_htod(x, h, N * 4) != 0, "alloc");
    OKC(tutti_comm_set_stream(comm, s));
    if (rank == 0 && hold_stream(rank, s) != 0)
        return 1;
    const double t0 = th_now_ms();
    OKC(tutti_allreduce(comm, (void *)(uintptr_t)x, (void *)(uintptr_t)x, N, TUTTI_INT32,
                        TUTTI_SUM));
    if (rank == 0) {
        usleep(3000000);
        release_stream();
    }
    FAIL_IF(cu.stream_synchronize(s) != 0, "cuStreamSynchronize");
    FAIL_IF(tutti_comm_stream_error(comm) != 0, "stream error after %.0f ms: %s", th_now_ms() - t0,
            tutti_comm_last_error(comm));
    FAIL_IF(cu.memcpy_dtoh(h, x, N * 4) != 0, "DtoH");
    for (int i = 0; i < N; i++)
        FAIL_IF(h[i] != n * (n + 1) / 2 + n * i, "[%d] = %d", i, h[i]);
    /* and the next call, on time */
    OKC(tutti_allreduce(comm, (void *)(uintptr_t)x, (void *)(uintptr_t)x, N, TUTTI_INT32,
                        TUTTI_MAX));
    FAIL_IF(cu.stream_synchronize(s) != 0, "cuStreamSynchronize");
    FAIL_IF(tutti_comm_stream_error(comm) != 0, "stream error: %s", tutti_comm_last_error(comm));
    return 0;
}

/* A stream-ordered call on a communicator that failed (rank 1's copy in could not be
 * enqueued: the op failed on every rank, and the communicator with it) fails at the
 * call, as without a stream (it returned TUTTI_OK, and its failure was dropped: only the
 * first is tutti_comm_stream_error's) */
static int rank_cuda_failed_comm(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg, (void)n;
    int dev;
    void *s;
    if (cu_rank_setup(rank, &dev, &s) != 0)
        return 1;
    void (*fail_copy_at)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "fake_cuda_fail_copy_at");
    FAIL_IF(!fail_copy_at, "fake_cuda_fail_copy_at");
    unsigned long long x;
    FAIL_IF(cu.mem_alloc(&x, 4096) != 0, "alloc");
    OKC(tutti_comm_set_stream(comm, s));
    fail_copy_at(rank == 1 ? 1 : -1);
    int st = tutti_allreduce(comm, (void *)(uintptr_t)x, (void *)(uintptr_t)x, 1024, TUTTI_INT32,
                             TUTTI_SUM);
    fail_copy_at(-1);
    FAIL_IF(rank == 1 ? st != TUTTI_ERR_DEVICE : st != 0, "the failing call: %s: %s",
            tutti_status_name(st), tutti_comm_last_error(comm));
    FAIL_IF(cu.stream_synchronize(s) != 0, "cuStreamSynchronize");
    FAIL_IF(tutti_comm_stream_error(comm) != TUTTI_ERR_DEVICE, "stream error: %s",
            tutti_comm_last_error(comm));
    st = tutti_allreduce(comm, (void *)(uintptr_t)x, (void *)(uintptr_t)x, 1024, TUTTI_INT32,
                         TUTTI_SUM);
    const char *e = tutti_comm_last_error(comm);
    FAIL_IF(st != TUTTI_ERR_DEVICE || !strstr(e, "seq 1 not started: the communicator had failed"),
            "a stream-ordered call on the failed communicator: %s: %s", tutti_status_name(st),
            st ? e : "");
    FAIL_IF(cu.stream_synchronize(s) != 0, "cuStreamSynchronize");
    return 0;
}

/* Stream-ordered calls' records (their events and blocks) are let go at the next call of
 * any kind once the stream has passed them: a burst of 10 behind a held stream, then a
 * host-buffer call (they stayed until the next stream-ordered call or the destroy) */
static int rank_cuda_reap(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    int dev;
    void *s;
    if (cu_rank_setup(rank, &dev, &s) != 0)
        return 1;
    int (*events)(int *) = (int (*)(int *))dlsym(RTLD_DEFAULT, "fake_cuda_events");
    FAIL_IF(!events, "fake_cuda_events");
    unsigned long long x;
    FAIL_IF(cu.mem_alloc(&x, 1 << 20) != 0, "alloc");
    OKC(tutti_comm_set_stream(comm, s));
    if (hold_stream(rank, s) != 0)
        return 1;
    for (int k = 0; k < 10; k++)
        OKC(tutti_allreduce(comm, (void *)(uintptr_t)x, (void *)(uintptr_t)x, 1 << 18, TUTTI_INT32,
                            TUTTI_MAX));
    release_stream();
    FAIL_IF(cu.stream_synchronize(s) != 0, "cuStreamSynchronize");
    int created, before = events(&created);
    int32_t h[4] = { rank, rank, rank, rank };
    OKC(tutti_allreduce(comm, h, h, 4, TUTTI_INT32, TUTTI_SUM));
    int after = events(&created);
    FAIL_IF(before < 20 || after != 0 || h[0] != n * (n - 1) / 2,
            "events alive after the burst %d, after a host call %d (of %d made); sum %d", before,
            after, created, h[0]);
    FAIL_IF(tutti_comm_stream_error(comm) != 0, "stream error: %s", tutti_comm_last_error(comm));
    return 0;
}

/* A steady workload pins nothing per call: steps of 8 stream-ordered calls of a few
 * sizes behind a held stream (a training step's buckets), the stream then let go and
 * synchronised; after the first two steps no cuMemHostRegister at all (the pool kept the
 * two largest blocks: the other calls in flight pinned one each, every step) */
static int rank_cuda_pool(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg, (void)n;
    int dev;
    void *s;
    if (cu_rank_setup(rank, &dev, &s) != 0)
        return 1;
    int (*registers)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fake_cuda_registers");
    FAIL_IF(!registers, "fake_cuda_registers");
    enum { K = 8 };
    const size_t counts[K] = { 1000, 5000, 5000, 20000, 20000, 20000, 100000, 3000 };
    unsigned long long x[K];
    for (int k = 0; k < K; k++)
        FAIL_IF(cu.mem_alloc(&x[k], counts[k] * 4) != 0, "alloc");
    OKC(tutti_comm_set_stream(comm, s));
    int reg0 = 0;
    for (int step = 0; step < 8; step++) {
        if (step == 2)
            reg0 = registers();
        if (hold_stream(rank, s) != 0)
            return 1;
        for (int k = 0; k < K; k++)
            OKC(tutti_allreduce(comm, (void *)(uintptr_t)x[k], (void *)(uintptr_t)x[k], counts[k],
                                TUTTI_FP32, TUTTI_SUM));
        release_stream();
        FAIL_IF(cu.stream_synchronize(s) != 0, "cuStreamSynchronize");
    }
    FAIL_IF(registers() != reg0, "%d host blocks pinned in 6 steady steps of %d calls",
            registers() - reg0, K);
    /* a change: one call larger than all of a step, then steps of K small ones; from the
     * second, nothing pinned (the pool, over its bytes, let the small blocks go, the
     * smallest first, and kept the large one nobody used any more) */
    unsigned long long big;
    FAIL_IF(cu.mem_alloc(&big, 8u << 20) != 0, "alloc");
    OKC(tutti_allreduce(comm, (void *)(uintptr_t)big, (void *)(uintptr_t)big, 2u << 20, TUTTI_FP32,
                        TUTTI_SUM));
    FAIL_IF(cu.stream_synchronize(s) != 0, "cuStreamSynchronize");
    for (int step = 0; step < 4; step++) {
        if (step == 1)
            reg0 = registers();
        if (hold_stream(rank, s) != 0)
            return 1;
        for (int k = 0; k < K; k++)
            OKC(tutti_allreduce(comm, (void *)(uintptr_t)x[1], (void *)(uintptr_t)x[1], 5000,
                                TUTTI_FP32, TUTTI_SUM));
        release_stream();
        FAIL_IF(cu.stream_synchronize(s) != 0, "cuStreamSynchronize");
    }
    FAIL_IF(registers() != reg0,
            "%d host blocks pinned in 3 steps of %d small calls after a "
            "large one",
            registers() - reg0, K);
    FAIL_IF(tutti_comm_stream_error(comm) != 0, "stream error: %s", tutti_comm_last_error(comm));
    return 0;
}

/* Host memory that could not be pinned a while (cuMemHostRegister failing: set_stream
 * refused, a call staged through a pageable block) is pinned once it can be: a
 * stream-ordered call later returns at once behind a held stream (the pooled pageable
 * block was taken again as it was, and the call waited for the stream: 5 s, then
 * TUTTI_ERR_TIMEOUT) */
static int rank_cuda_pin_again(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    int dev;
    void *s;
    if (cu_rank_setup(rank, &dev, &s) != 0)
        return 1;
    void (*fail_register)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "fake_cuda_fail_register");
    FAIL_IF(!fail_register, "fake_cuda_fail_register");
    unsigned long long x;
    int32_t h[1024];
    for (int i = 0; i < 1024; i++)
        h[i] = 1;
    FAIL_IF(cu.mem_alloc(&x, 4096) != 0 || cu.memcpy_htod(x, h, 4096) != 0, "alloc");
    fail_register(1);
    int st = tutti_comm_set_stream(comm, s);
    FAIL_IF(st != TUTTI_ERR_DEVICE, "set_stream with no pinning: %s", tutti_status_name(st));
    OKC(tutti_allreduce(comm, (void *)(uintptr_t)x, (void *)(uintptr_t)x, 1024, TUTTI_INT32,
                        TUTTI_SUM));
    fail_register(0);
    OKC(tutti_comm_set_stream(comm, s));
    if (hold_stream(rank, s) != 0)
        return 1;
    const double t0 = th_now_ms();
    st = tutti_allreduce(comm, (void *)(uintptr_t)x, (void *)(uintptr_t)x, 1024, TUTTI_INT32,
                         TUTTI_SUM);
    const double dt = th_now_ms() - t0;
    release_stream();
    FAIL_IF(cu.stream_synchronize(s) != 0, "cuStreamSynchronize");
    FAIL_IF(st != 0 || dt > 1000, "a call behind a held stream: %s after %.0f ms: %s",
            tutti_status_name(st), dt, st ? tutti_comm_last_error(comm) : "");
    FAIL_IF(tutti_comm_stream_error(comm) != 0, "stream error: %s", tutti_comm_last_error(comm));
    FAIL_IF(cu.memcpy_dtoh(h, x, 4096) != 0 || h[0] != n * n || h[1023] != n * n, "sum %d", h[0]);
    return 0;
}

/* Managed memory (cuMemAllocManaged) in a stream-ordered call is ordered on the stream,
 * as device memory is (NCCL's): its input written by an async copy on the held stream,
 * the call reads it when the stream gets there (it read the stale zeros at once: each
 * rank got its own input back). Without a stream, and in an _async call, it stays host
 * memory, read in place (no copies). */
static int rank_cuda_managed(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    int dev;
    void *s;
    if (cu_rank_setup(rank, &dev, &s) != 0)
        return 1;
    int (*alloc_managed)(unsigned long long *, size_t,
                         unsigned) = (int (*)(unsigned long long *, size_t,
                                              unsigned))dlsym(RTLD_DEFAULT, "cuMemAllocManaged");
    int (*ncopies)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fake_cuda_ncopies");
    FAIL_IF(!alloc_managed || !ncopies, "cuMemAllocManaged, fake_cuda_ncopies");
    enum { N = 1024 };
    unsigned long long m;
    FAIL_IF(alloc_managed(&m, N * 4, 1 /* GLOBAL */) != 0, "cuMemAllocManaged");
    int32_t *mp = (int32_t *)(uintptr_t)m;
    int32_t *src = aligned_alloc(4096, N * 4);
    FAIL_IF(!src || cu.host_register(src, N * 4, 1) != 0, "pinned source");
    for (int i = 0; i < N; i++)
        mp[i] = 0, src[i] = rank + 1 + i;
    /* no stream: host memory */
    int c0 = ncopies();
    OKC(tutti_allreduce(comm, mp, mp, N, TUTTI_INT32, TUTTI_SUM));
    FAIL_IF(ncopies() != c0, "managed memory staged without a stream (%d copies)", ncopies() - c0);
    OKC(tutti_comm_set_stream(comm, s));
    if (hold_stream(rank, s) != 0)
        return 1;
    FAIL_IF(cu.memcpy_htod_async(m, src, N * 4, s) != 0, "HtoDAsync");
    OKC(tutti_allreduce(comm, mp, mp, N, TUTTI_INT32, TUTTI_SUM));
    release_stream();
    FAIL_IF(cu.stream_synchronize(s) != 0, "cuStreamSynchronize");
    FAIL_IF(tutti_comm_stream_error(comm) != 0, "stream error: %s", tutti_comm_last_error(comm));
    for (int i = 0; i < N; i++)
        FAIL_IF(mp[i] != n * (n + 1) / 2 + n * i, "stream-ordered managed [%d] = %d, want %d", i,
                mp[i], n * (n + 1) / 2 + n * i);
    /* an _async call with the stream set: host memory still */
    tutti_work_t *w;
    c0 = ncopies();
    OKC(tutti_allreduce_async(comm, mp, mp, N, TUTTI_INT32, TUTTI_MAX, &w));
    FAIL_IF(tutti_wait(w, -1) != 0, "wait: %s", tutti_work_error(w));
    tutti_work_free(w);
    FAIL_IF(ncopies() != c0, "managed memory staged in an _async call (%d copies)", ncopies() - c0);
    free(src);
    return 0;
}

/* rank_cuda on a communicator of one, in this process: its destroy unregisters the host
 * blocks it kept */
static void cuda_one(tutti_comm_t *comm, void *arg)
{
    (void)arg;
    ck_assert_int_eq(rank_cuda(0, 1, comm, NULL, NULL), 0);
}

static void cuda_one_rank(void)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.cuda = "on";
    char err[256];
    ck_assert_msg(th_init_one(&o, err, sizeof(err), cuda_one, NULL) == 0, "%s", err);
    int (*pinned_now)(int *) = (int (*)(int *))dlsym(RTLD_DEFAULT, "fake_cuda_pinned");
    int errors = 0;
    if (pinned_now)
        ck_assert_msg(pinned_now(&errors) == 0 && errors == 0, "%d still registered, %d errors",
                      pinned_now(&errors), errors);
}

/* cuda.c against the stand-in driver: loaded here (the forked ranks inherit it), found
 * by its soname when the communicator asks for libcuda.so.1; "on" initialises the
 * driver at init, "auto" finds it loaded and leaves the initialising to the program */
START_TEST(cuda_driver_fake)
{
    void *h = dlopen(TT_BUILD_DIR "/tests/libfakecuda.so", RTLD_NOW | RTLD_GLOBAL);
    ck_assert_msg(h != NULL, "%s", dlerror());
    const char *modes[] = { "on", "auto" };
    for (int i = 0; i < 2; i++) {
        tutti_comm_opts_t o;
        tutti_comm_opts_init(&o);
        o.cuda = modes[i];
        th_spec_t spec = { .nranks = 2, .fn = rank_cuda, .timeout_ms = 60000, .opts = &o };
        ck_assert_msg(th_run_ex(&spec, NULL) == 0, "TUTTI_CUDA=%s", modes[i]);
    }
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.cuda = "on";
    th_spec_t spec = { .nranks = 2, .fn = rank_cuda_stream, .timeout_ms = 60000, .opts = &o };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    o.stream_timeout_ms = 1500;
    o.timeout_ms = 5000; /* the op's, and the destroy's wait for the held stream */
    spec.fn = rank_cuda_stream_stuck;
    spec.timeout_ms = 30000;
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    spec.fn = rank_cuda_drain_stuck;
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    o.timeout_ms = 1000;
    o.stream_timeout_ms = 20000;
    spec.fn = rank_cuda_late_stream;
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    o.timeout_ms = 5000;
    o.stream_timeout_ms = 5000;
    spec.fn = rank_cuda_failed_comm;
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    spec.fn = rank_cuda_reap;
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    spec.fn = rank_cuda_pool;
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    spec.fn = rank_cuda_pin_again;
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    spec.fn = rank_cuda_managed;
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    cuda_one_rank();
}
END_TEST

START_TEST(real_cuda)
{
    /* only the library is loaded here, never initialised: the ranks are forked */
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h || access("/dev/nvidiactl", F_OK) != 0) {
        fprintf(stderr, "real_cuda: skipped: no CUDA driver or device on this machine\n");
        if (h)
            dlclose(h);
        return;
    }
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.cuda = "on";
    th_spec_t spec = { .nranks = 2, .fn = rank_cuda, .timeout_ms = 120000, .opts = &o };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    spec.fn = rank_cuda_stream;
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
    cuda_one_rank(); /* CUDA initialised here only now: nothing forks after */
}
END_TEST

/* The neighbourhood collectives on device buffers (written by review, session 108): a
 * non-periodic line (TUTTI_PROC_NULL's blocks stay as they were), and a graph whose
 * indegree (21) passes the rank count (device.c's runs_max). */
static int rank_nb(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    FAIL_IF(fake_init(4u << 20) != 0, "fake device");
    /* a non-periodic line of n: PROC_NULL at both ends */
    int dims[1] = { n }, per[1] = { 0 };
    tutti_comm_t *c = NULL;
    OKC(tutti_cart_create(comm, 1, dims, per, &c));
    int32_t h[4] = { rank * 10, rank * 10 + 1, rank * 10 + 2, rank * 10 + 3 };
    int32_t *x = dev_ints(h, 4), *y = dev_alloc(4 * 4, 0x5a);
    int st = tutti_neighbor_alltoall(c, x, y, 2, TUTTI_INT32);
    FAIL_IF(st, "cart a2a: %s", tutti_comm_last_error(c));
    int32_t want[4];
    for (int s = 0; s < 2; s++) {
        int q = s == 0 ? rank - 1 : rank + 1;
        for (int e = 0; e < 2; e++)
            want[2 * s + e] = (q < 0 || q >= n) ? SENT : q * 10 + (s == 0 ? 2 : 0) + e;
    }
    CHECK_DEV("cart neighbor_alltoall", y, want, 4);
    tutti_comm_destroy(c);
    /* a graph: 12 edges to the other rank and 9 to itself (indegree 21 > nranks) */
    enum { K = 21 };
    int nb[K], sr[K];
    for (int i = 0; i < K; i++) {
        nb[i] = i % 7 == 3 || i >= 12 ? rank : (rank + 1) % n;
        sr[i] = i % 7 == 3 || i >= 12 ? rank : (rank + n - 1) % n;
    }
    tutti_comm_t *g = NULL;
    OKC(tutti_dist_graph_create_adjacent(comm, K, sr, K, nb, &g));
    int32_t hs[K];
    for (int i = 0; i < K; i++)
        hs[i] = rank * 100 + i;
    int32_t *xs = dev_ints(hs, K), *ys = dev_alloc(2 * K * 4, 0x5a);
    size_t rc[K], rd[K];
    for (int j = 0; j < K; j++)
        rc[j] = 1, rd[j] = 2 * (size_t)j;
    st = tutti_neighbor_allgatherv(g, xs, 1, ys, rc, rd, TUTTI_INT32);
    FAIL_IF(st, "graph agv: %s", tutti_comm_last_error(g));
    int32_t w2[2 * K];
    for (int j = 0; j < K; j++) {
        w2[2 * j] = sr[j] * 100 + 0;
        w2[2 * j + 1] = SENT;
    }
    CHECK_DEV("graph neighbor_allgatherv", ys, w2, 2 * K);
    tutti_comm_destroy(g);
    return 0;
}

START_TEST(neighbors_dev)
{
    tt_dev_override(&fake_ops);
    ck_assert_int_eq(th_run(2, rank_nb, NULL, 60000), 0);
    ck_assert_int_eq(th_run(3, rank_nb, NULL, 60000), 0);
    tt_dev_override(NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("device");
    th_add_tests(s, "collectives", 240, (const TTest *const[]){ every_collective, NULL });
    th_add_tests(s, "forms", 120, (const TTest *const[]){ forms_and_order, NULL });
    th_add_tests(s, "blocks", 60, (const TTest *const[]){ host_blocks, NULL });
    th_add_tests(s, "failures", 60, (const TTest *const[]){ failed_copies, NULL });
    th_add_tests(s, "nbdev", 120, (const TTest *const[]){ neighbors_dev, NULL });
    th_add_tests(s, "option", 60, (const TTest *const[]){ cuda_option, NULL });
    th_add_tests(s, "cuda", 180, (const TTest *const[]){ cuda_driver_fake, real_cuda, NULL });
    return th_main(s);
}
