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
 * The fake also fails copies on request (the errors' text and status), and the last
 * case runs the real thing, CUDA through the driver API, where this machine has one
 * (tools/dev/device-check.sh runs it on the device machine); elsewhere it says it
 * skipped. */
#include <check.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <tutti/tutti.h>

#include "device/device.h"
#include "harness.h"

/* ---- the fake device ---- */

static struct {
    char *dev;  /* the device view: PROT_NONE */
    char *back; /* the fake's own view of the same pages */
    size_t size, used;
    int fail_to_host, fail_to_dev; /* fail every such copy */
    long copies_in, copies_back;
} fake;

static int fake_query(const void *p, void **ctx, char *err, size_t errlen)
{
    (void)err, (void)errlen;
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
    if (to_host) {
        memcpy(dst, b, n);
        fake.copies_in++;
    } else {
        memcpy(b, src, n);
        fake.copies_back++;
    }
    return TUTTI_OK;
}

static const tt_dev_ops_t fake_ops = { "fake", fake_query, fake_copy };

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

/* ---- copies that fail: the status, the message, and a communicator that goes on ---- */

static int rank_failures(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg, (void)n;
    FAIL_IF(fake_init(1u << 20) != 0, "fake device");
    int32_t hx[256];
    for (int i = 0; i < 256; i++)
        hx[i] = rank + i;
    int32_t *x = dev_ints(hx, 256), *y = dev_alloc(1024, 0);
    /* the copy in fails at the call, on every rank: nothing was sent */
    fake.fail_to_host = 1;
    int st = tutti_allreduce(comm, x, y, 256, TUTTI_INT32, TUTTI_SUM);
    const char *e = tutti_comm_last_error(comm);
    FAIL_IF(st != TUTTI_ERR_DEVICE, "copy in: %s", tutti_status_name(st));
    FAIL_IF(!strstr(e, "allreduce") || !strstr(e, "sendbuf") || !strstr(e, "injected") ||
                !strstr(e, "rank"),
            "copy in: %s", e);
    fake.fail_to_host = 0;
    /* the copy back fails after the call, blocking and async */
    fake.fail_to_dev = 1;
    st = tutti_allreduce(comm, x, y, 256, TUTTI_INT32, TUTTI_SUM);
    e = tutti_comm_last_error(comm);
    FAIL_IF(st != TUTTI_ERR_DEVICE, "copy back: %s", tutti_status_name(st));
    FAIL_IF(!strstr(e, "allreduce seq") || !strstr(e, "back to fake device memory") ||
                !strstr(e, "recvbuf"),
            "copy back: %s", e);
    tutti_work_t *w;
    OKC(tutti_allgather_async(comm, x, y, 1, TUTTI_INT32, &w));
    st = tutti_wait(w, -1);
    FAIL_IF(st != TUTTI_ERR_DEVICE || !strstr(tutti_work_error(w), "allgather"),
            "async copy back: %s: %s", tutti_status_name(st), tutti_work_error(w));
    tutti_work_free(w);
    fake.fail_to_dev = 0;
    /* a failed copy is this rank's alone: the communicator still works */
    OKC(tutti_allreduce(comm, x, y, 256, TUTTI_INT32, TUTTI_SUM));
    int32_t got[256];
    dev_read(got, y, sizeof(got));
    for (int i = 0; i < 256; i++)
        FAIL_IF(got[i] != n * i + n * (n - 1) / 2, "after: [%d] = %d", i, got[i]);
    return 0;
}

START_TEST(failed_copies)
{
    tt_dev_override(&fake_ops);
    ck_assert_int_eq(th_run(2, rank_failures, NULL, 60000), 0);
    tt_dev_override(NULL);
}
END_TEST

/* ---- TUTTI_CUDA ---- */

/* a communicator of one rank made with opts.cuda = cuda: its status (err: why it failed;
 * *dev_p: what tutti_comm_device said) */
static int init_one(const char *cuda, char *err, size_t errlen, const char **dev_p)
{
    char dir[] = "/tmp/tutti-test-device-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    tutti_store_t *store;
    ck_assert_int_eq(tutti_store_open_file(&store, dir, 5000), 0);
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.cuda = cuda;
    tutti_comm_t *comm = NULL;
    int st = tutti_comm_init(&comm, store, 0, 1, &o);
    snprintf(err, errlen, "%s", st < 0 ? tutti_comm_last_error(NULL) : "");
    if (dev_p)
        *dev_p = comm ? tutti_comm_device(comm) : NULL;
    if (comm)
        tutti_comm_destroy(comm);
    tutti_store_close(store);
    th_rmtree(dir);
    return st;
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
} cu;

static int cu_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h)
        return -1;
    const char *names[] = { "cuInit",          "cuDeviceGetCount",
                            "cuDeviceGet",     "cuDevicePrimaryCtxRetain",
                            "cuCtxSetCurrent", "cuMemAlloc_v2",
                            "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2" };
    void **slots = (void **)&cu;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!(slots[i] = dlsym(h, names[i])))
            return -1;
    return 0;
}

static int rank_cuda(int rank, int n, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir, (void)arg;
    int count = 0, dev;
    void *ctx;
    FAIL_IF(cu_load() != 0, "libcuda.so.1 went away");
    FAIL_IF(cu.init(0) != 0 || cu.device_get_count(&count) != 0 || count < 1, "no device");
    FAIL_IF(cu.device_get(&dev, rank % count) != 0 || cu.primary_retain(&ctx, dev) != 0 ||
                cu.ctx_set_current(ctx) != 0,
            "context");
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
    fprintf(stderr, "rank %d: CUDA device %d: allreduce and allgather of device memory\n", rank,
            dev);
    return 0;
}

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
}
END_TEST

int main(void)
{
    Suite *s = suite_create("device");
    th_add_tests(s, "collectives", 240, (const TTest *const[]){ every_collective, NULL });
    th_add_tests(s, "failures", 60, (const TTest *const[]){ failed_copies, NULL });
    th_add_tests(s, "option", 60, (const TTest *const[]){ cuda_option, NULL });
    th_add_tests(s, "cuda", 180, (const TTest *const[]){ real_cuda, NULL });
    return th_main(s);
}
