/* A stand-in for the CUDA driver's library (soname libcuda.so.1) on a machine with no
 * GPU: the driver API calls lib/device/cuda.c makes, and those tests/test_device.c's
 * cuda cases make, with the driver's rules that the library must keep. Device memory is
 * a memfd mapped twice, the device view with no access at all (so a host access to it
 * faults) and a view only these copies use. The rules it holds the library to:
 *   - nothing works before cuInit (CUDA_ERROR_NOT_INITIALIZED, 3);
 *   - a copy needs a current context on the calling thread (CUDA_ERROR_INVALID_CONTEXT,
 *     201), and an async copy a stream of that context (CUDA_ERROR_INVALID_HANDLE, 400);
 *   - memory from every second cuMemAlloc reports no context, as the stream-ordered
 *     allocator's does: its copies need the device's primary context;
 *   - host memory is registered (page-locked) once, and unregistered only if it was;
 *   - a stream's work runs later, in order, on a thread of the stream's (copies, events,
 *     waits on a word of registered, device-mapped host memory); a handle of another
 *     context's stream is refused (CUDA_ERROR_INVALID_HANDLE); an async copy from
 *     pageable memory takes its source at the call, one into pageable memory returns
 *     when done (it waits for the stream), as a real driver's do;
 *   - devices 0-3 (a pointer's DEVICE_ORDINAL is its context's); cuMemAllocManaged's
 *     memory is host memory the attributes call DEVICE and IS_MANAGED.
 * The fake_cuda_* helpers fail a copy, registrations or event creations on demand, make
 * event queries fail, and count registrations and live events; FAKE_CUDA_INIT_FAIL in
 * the environment fails cuInit (the review's extensions).
 * The real check runs on the device machine (tools/dev/device-check.sh). */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

enum {
    OK = 0,
    INVALID_VALUE = 1,
    NOT_INITIALIZED = 3,
    INVALID_CONTEXT = 201,
    INVALID_HANDLE = 400,
    HOST_MEMORY_ALREADY_REGISTERED = 712,
    HOST_MEMORY_NOT_REGISTERED = 713,
    NOT_READY = 600,
    OUT_OF_MEMORY = 2,
    NO_DEVICE = 100,
    COPY_FAILED = 999 /* fake_cuda_fail_copy_at's */
};

static int inited;
static __thread void *current;
static char primary_ctx[4]; /* device d's primary context: &primary_ctx[d] */
enum { MAX_ALLOCS = 256 };
static struct {
    char *dev, *back;
    size_t len;
    void *ctx; /* NULL: as the stream-ordered allocator's memory */
    int ord, managed;
} allocs[MAX_ALLOCS];
/* test helpers (fake_cuda_*): failures on demand, and counts the tests check */
static int fail_copy_at = -1, ncopies; /* the Nth copy from now fails (999) */
static int fail_register, fail_event_create, sticky_error;
static int nevents_live, nevents_created, nregisters;
EXPORT void fake_cuda_fail_copy_at(int n)
{
    __atomic_store_n(&ncopies, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&fail_copy_at, n, __ATOMIC_SEQ_CST);
}
EXPORT int fake_cuda_ncopies(void)
{
    return __atomic_load_n(&ncopies, __ATOMIC_SEQ_CST);
}
/* every cuMemHostRegister fails (OUT_OF_MEMORY), or none does */
EXPORT void fake_cuda_fail_register(int on)
{
    __atomic_store_n(&fail_register, on, __ATOMIC_SEQ_CST);
}
/* every cuEventCreate fails (OUT_OF_MEMORY), or none does */
EXPORT void fake_cuda_fail_event_create(int on)
{
    __atomic_store_n(&fail_event_create, on, __ATOMIC_SEQ_CST);
}
/* every cuEventQuery returns e (0: as it should) */
EXPORT void fake_cuda_sticky(int e)
{
    __atomic_store_n(&sticky_error, e, __ATOMIC_SEQ_CST);
}
/* events alive now (and *created: ever made) */
EXPORT int fake_cuda_events(int *created)
{
    *created = __atomic_load_n(&nevents_created, __ATOMIC_SEQ_CST);
    return __atomic_load_n(&nevents_live, __ATOMIC_SEQ_CST);
}
/* successful cuMemHostRegister calls so far */
EXPORT int fake_cuda_registers(void)
{
    return __atomic_load_n(&nregisters, __ATOMIC_SEQ_CST);
}
static int copy_fails(void)
{
    return __atomic_add_fetch(&ncopies, 1, __ATOMIC_SEQ_CST) ==
           __atomic_load_n(&fail_copy_at, __ATOMIC_SEQ_CST);
}
static int ctx_ord(void *c);
static int nallocs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* A stream: its work runs in order on a thread of its own, as a GPU's would, so that
 * what the library enqueues really happens later (the stream-ordered calls' tests). */
typedef struct item {
    enum { IT_COPY, IT_EVENT, IT_WAIT } kind;
    char *dst;
    const char *src;
    size_t n;
    volatile uint32_t *word; /* IT_WAIT: until (int32_t)(*word - value) >= 0 */
    uint32_t value;
    struct fake_event *ev;
    char *owned; /* a pageable source copied at the call (freed after the copy) */
    struct item *next;
} item_t;
typedef struct fake_event {
    int pending; /* recorded, not passed yet */
    int doomed;  /* destroyed while pending: freed when passed */
} fake_event_t;
typedef struct {
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    item_t *head, *tail;
    int busy, started;
    pthread_t th;
} fake_stream_t;
static fake_stream_t legacy = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

/* the allocation holding [p, p + n), or -1 */
static int find(uintptr_t p, size_t n)
{
    pthread_mutex_lock(&lock);
    int found = -1;
    for (int i = 0; i < nallocs && found < 0; i++) {
        uintptr_t lo = (uintptr_t)allocs[i].dev;
        if (p >= lo && p - lo <= allocs[i].len && n <= allocs[i].len - (p - lo))
            found = i;
    }
    pthread_mutex_unlock(&lock);
    return found;
}

EXPORT int cuInit(unsigned flags)
{
    if (getenv("FAKE_CUDA_INIT_FAIL"))
        return NO_DEVICE;
    inited = flags == 0;
    return inited ? OK : INVALID_VALUE;
}

EXPORT int cuDeviceGetCount(int *n)
{
    if (!inited)
        return NOT_INITIALIZED;
    *n = 1;
    return OK;
}

EXPORT int cuDeviceGet(int *dev, int ordinal)
{
    if (!inited)
        return NOT_INITIALIZED;
    if (ordinal < 0 || ordinal > 3)
        return INVALID_VALUE;
    *dev = ordinal;
    return OK;
}

EXPORT int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    if (!inited)
        return NOT_INITIALIZED;
    if (dev < 0 || dev > 3)
        return INVALID_VALUE;
    *ctx = &primary_ctx[dev];
    return OK;
}

EXPORT int cuCtxSetCurrent(void *ctx)
{
    current = ctx;
    return inited ? OK : NOT_INITIALIZED;
}

/* the context stack: current is its top */
static __thread void *stack[8];
static __thread int depth;

EXPORT int cuCtxPushCurrent_v2(void *ctx)
{
    if (!inited)
        return NOT_INITIALIZED;
    if (!ctx || depth == 8)
        return INVALID_CONTEXT;
    stack[depth++] = current;
    current = ctx;
    return OK;
}

EXPORT int cuCtxPopCurrent_v2(void **ctx)
{
    if (!depth)
        return INVALID_CONTEXT;
    if (ctx)
        *ctx = current;
    current = stack[--depth];
    return OK;
}

EXPORT int cuMemAlloc_v2(uintptr_t *p, size_t n)
{
    if (!inited)
        return NOT_INITIALIZED;
    if (!current)
        return INVALID_CONTEXT;
    int fd = memfd_create("fake-cuda", 0);
    if (fd < 0 || ftruncate(fd, (off_t)n) != 0)
        return INVALID_VALUE;
    char *dev = mmap(NULL, n, PROT_NONE, MAP_SHARED, fd, 0);
    char *back = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    pthread_mutex_lock(&lock);
    int i = nallocs < MAX_ALLOCS ? nallocs++ : -1;
    if (i >= 0)
        allocs[i].dev = dev, allocs[i].back = back, allocs[i].len = n,
        allocs[i].ctx = i % 2 ? NULL : current, allocs[i].ord = ctx_ord(current),
        allocs[i].managed = 0;
    pthread_mutex_unlock(&lock);
    if (i < 0 || dev == MAP_FAILED || back == MAP_FAILED)
        return INVALID_VALUE;
    *p = (uintptr_t)dev;
    return OK;
}

static int ctx_ord(void *c)
{
    char *p = c;
    return p >= primary_ctx && p < primary_ctx + 4 ? (int)(p - primary_ctx) : 0;
}

/* managed memory: the host reads and writes it where it is, and cuPointerGetAttributes
 * says DEVICE and IS_MANAGED, as the real driver does */
EXPORT int cuMemAllocManaged(uintptr_t *p, size_t n, unsigned flags)
{
    (void)flags;
    if (!inited)
        return NOT_INITIALIZED;
    if (!current)
        return INVALID_CONTEXT;
    char *m = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
    if (!m)
        return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int i = nallocs < MAX_ALLOCS ? nallocs++ : -1;
    if (i >= 0)
        allocs[i].dev = m, allocs[i].back = m, allocs[i].len = n, allocs[i].ctx = current,
        allocs[i].ord = ctx_ord(current), allocs[i].managed = 1;
    pthread_mutex_unlock(&lock);
    *p = (uintptr_t)m;
    return i < 0 ? INVALID_VALUE : OK;
}

EXPORT int cuPointerGetAttributes(unsigned n, const int *attrs, void **data, uintptr_t p)
{
    if (!inited)
        return NOT_INITIALIZED;
    int i = find(p, 1);
    for (unsigned k = 0; k < n; k++) {
        switch (attrs[k]) {
        case 1: /* CONTEXT */ *(void **)data[k] = i >= 0 ? allocs[i].ctx : NULL; break;
        case 2: /* MEMORY_TYPE: DEVICE, or 0 for memory CUDA does not know */
            *(unsigned *)data[k] = i >= 0 ? 2 : 0;
            break;
        case 8: /* IS_MANAGED */ *(unsigned *)data[k] = i >= 0 && allocs[i].managed; break;
        case 9: /* DEVICE_ORDINAL */ *(int *)data[k] = i >= 0 ? allocs[i].ord : -2; break;
        default: return INVALID_VALUE;
        }
    }
    return OK;
}

static int copy(void *dst, const void *src, size_t n, int to_host)
{
    if (!inited)
        return NOT_INITIALIZED;
    if (!current)
        return INVALID_CONTEXT;
    if (copy_fails())
        return COPY_FAILED;
    int i = find(to_host ? (uintptr_t)src : (uintptr_t)dst, n);
    if (i < 0)
        return INVALID_VALUE;
    size_t off = (to_host ? (uintptr_t)src : (uintptr_t)dst) - (uintptr_t)allocs[i].dev;
    if (to_host)
        memcpy(dst, allocs[i].back + off, n);
    else
        memcpy(allocs[i].back + off, src, n);
    return OK;
}

EXPORT int cuMemcpyDtoH_v2(void *dst, uintptr_t src, size_t n)
{
    return copy(dst, (const void *)src, n, 1);
}

EXPORT int cuMemcpyHtoD_v2(uintptr_t dst, const void *src, size_t n)
{
    return copy((void *)dst, src, n, 0);
}

static void *stream_main(void *arg)
{
    fake_stream_t *st = arg;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (!st->head)
            pthread_cond_wait(&st->cv, &st->mu);
        item_t *it = st->head;
        st->busy = 1;
        pthread_mutex_unlock(&st->mu);
        switch (it->kind) {
        case IT_COPY:
            memcpy(it->dst, it->src, it->n);
            free(it->owned);
            break;
        case IT_EVENT:
            pthread_mutex_lock(&lock);
            it->ev->pending = 0;
            if (it->ev->doomed)
                free(it->ev);
            pthread_mutex_unlock(&lock);
            break;
        case IT_WAIT:
            while ((int32_t)(__atomic_load_n(it->word, __ATOMIC_ACQUIRE) - it->value) < 0)
                usleep(20);
            break;
        }
        pthread_mutex_lock(&st->mu);
        st->head = it->next;
        if (!st->head)
            st->tail = NULL;
        st->busy = 0;
        free(it);
        pthread_cond_broadcast(&st->cv);
    }
    return NULL;
}

/* the stream a handle names (NULL, CU_STREAM_LEGACY 1, CU_STREAM_PER_THREAD 2: the
 * legacy one), or NULL where it is another context's */
static fake_stream_t *stream_of(void *stream)
{
    fake_stream_t *st = (uintptr_t)stream <= 2 ? &legacy : stream;
    return st == &legacy || st->ctx == current ? st : NULL;
}

static int enqueue(fake_stream_t *st, item_t it)
{
    item_t *n = malloc(sizeof(*n));
    if (!n)
        return INVALID_VALUE;
    *n = it;
    n->next = NULL;
    pthread_mutex_lock(&st->mu);
    if (!st->started) {
        pthread_create(&st->th, NULL, stream_main, st);
        st->started = 1;
    }
    if (st->tail)
        st->tail->next = n;
    else
        st->head = n;
    st->tail = n;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    return OK;
}

static void forked(void)
{
    legacy.started = 0, legacy.busy = 0; /* the parent's thread is not the child's */
    legacy.head = legacy.tail = NULL;
    pthread_mutex_init(&legacy.mu, NULL);
    pthread_cond_init(&legacy.cv, NULL);
}

__attribute__((constructor)) static void fake_init(void)
{
    pthread_atfork(NULL, NULL, forked);
}

EXPORT int cuStreamCreate(void **stream, unsigned flags)
{
    (void)flags;
    if (!inited)
        return NOT_INITIALIZED;
    if (!current)
        return INVALID_CONTEXT;
    fake_stream_t *st = calloc(1, sizeof(*st));
    if (!st)
        return INVALID_VALUE;
    st->ctx = current;
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    *stream = st;
    return OK;
}

EXPORT int cuStreamGetCtx(void *stream, void **ctx)
{
    if (!inited)
        return NOT_INITIALIZED;
    *ctx = (uintptr_t)stream <= 2 ? current : ((fake_stream_t *)stream)->ctx;
    return *ctx ? OK : INVALID_CONTEXT;
}

static int registered(const char *p, size_t n, unsigned flags);
EXPORT int cuStreamSynchronize(void *stream);

/* an async copy: checked now, done when the stream gets there. As a real driver does
 * with pageable host memory: a source is copied at the call, and a copy into it returns
 * only once done (so it waits for the stream's earlier work) */
static int copy_async(void *dst, const void *src, size_t n, int to_host, void *stream)
{
    if (!inited)
        return NOT_INITIALIZED;
    if (!current)
        return INVALID_CONTEXT;
    fake_stream_t *st = stream_of(stream);
    if (!st)
        return INVALID_HANDLE;
    if (copy_fails())
        return COPY_FAILED;
    int i = find(to_host ? (uintptr_t)src : (uintptr_t)dst, n);
    if (i < 0)
        return INVALID_VALUE;
    size_t off = (to_host ? (uintptr_t)src : (uintptr_t)dst) - (uintptr_t)allocs[i].dev;
    item_t it = { .kind = IT_COPY, .n = n };
    it.dst = to_host ? dst : allocs[i].back + off;
    it.src = to_host ? allocs[i].back + off : src;
    const int pageable = !registered(to_host ? dst : src, n, 0);
    if (pageable && !to_host) {
        if (!(it.owned = malloc(n ? n : 1)))
            return INVALID_VALUE;
        memcpy(it.owned, src, n);
        it.src = it.owned;
    }
    int r = enqueue(st, it);
    return r == OK && pageable && to_host ? cuStreamSynchronize(stream) : r;
}

EXPORT int cuMemcpyHtoDAsync_v2(uintptr_t dst, const void *src, size_t n, void *stream)
{
    return copy_async((void *)dst, src, n, 0, stream);
}

EXPORT int cuMemcpyDtoHAsync_v2(void *dst, uintptr_t src, size_t n, void *stream)
{
    return copy_async(dst, (const void *)src, n, 1, stream);
}

EXPORT int cuStreamSynchronize(void *stream)
{
    if (!inited)
        return NOT_INITIALIZED;
    fake_stream_t *st = stream_of(stream);
    if (!st)
        return INVALID_HANDLE;
    pthread_mutex_lock(&st->mu);
    while (st->head)
        pthread_cond_wait(&st->cv, &st->mu);
    pthread_mutex_unlock(&st->mu);
    return OK;
}

EXPORT int cuEventCreate(void **ev, unsigned flags)
{
    if (!inited)
        return NOT_INITIALIZED;
    if (!current)
        return INVALID_CONTEXT;
    (void)flags;
    if (__atomic_load_n(&fail_event_create, __ATOMIC_SEQ_CST))
        return OUT_OF_MEMORY;
    __atomic_add_fetch(&nevents_live, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&nevents_created, 1, __ATOMIC_SEQ_CST);
    return (*ev = calloc(1, sizeof(fake_event_t))) ? OK : INVALID_VALUE;
}

EXPORT int cuEventRecord(void *ev, void *stream)
{
    if (!inited)
        return NOT_INITIALIZED;
    fake_stream_t *st = stream_of(stream);
    if (!st || !ev)
        return INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    ((fake_event_t *)ev)->pending = 1;
    pthread_mutex_unlock(&lock);
    return enqueue(st, (item_t){ .kind = IT_EVENT, .ev = ev });
}

EXPORT int cuEventQuery(void *ev)
{
    int sticky = __atomic_load_n(&sticky_error, __ATOMIC_SEQ_CST);
    if (sticky)
        return sticky;
    pthread_mutex_lock(&lock);
    int pending = ((fake_event_t *)ev)->pending;
    pthread_mutex_unlock(&lock);
    return pending ? NOT_READY : OK;
}

EXPORT int cuEventDestroy_v2(void *ev)
{
    pthread_mutex_lock(&lock);
    fake_event_t *e = ev;
    int pending = e->pending;
    e->doomed = 1;
    pthread_mutex_unlock(&lock);
    __atomic_sub_fetch(&nevents_live, 1, __ATOMIC_SEQ_CST);
    if (!pending)
        free(e);
    return OK;
}

/* page-locked host ranges: cuMemHostRegister's rules (a current context, no range
 * registered twice, only a registered range unregistered); fake_cuda_pinned() says how
 * many are registered now and how many calls broke a rule, for the tests */
enum { MAX_PINS = 4096 };
static struct {
    char *p;
    size_t n;
    unsigned flags; /* 2: DEVICEMAP, mapped for the device (streams may wait on it) */
} pins[MAX_PINS];
static int npins, pin_errors;

EXPORT int cuMemHostRegister_v2(void *p, size_t n, unsigned flags)
{
    if (!inited)
        return NOT_INITIALIZED;
    int r = !current ? INVALID_CONTEXT : !p || !n || flags > 7 ? INVALID_VALUE : OK;
    if (r == OK && __atomic_load_n(&fail_register, __ATOMIC_SEQ_CST))
        return OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < npins && r == OK; i++)
        if ((char *)p < pins[i].p + pins[i].n && pins[i].p < (char *)p + n)
            r = HOST_MEMORY_ALREADY_REGISTERED;
    if (r == OK && npins == MAX_PINS)
        r = INVALID_VALUE;
    if (r == OK)
        __atomic_add_fetch(&nregisters, 1, __ATOMIC_SEQ_CST);
    if (r == OK)
        pins[npins].p = p, pins[npins].flags = flags, pins[npins++].n = n;
    else
        pin_errors++;
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT int cuMemHostUnregister(void *p)
{
    if (!inited)
        return NOT_INITIALIZED;
    int r = current ? HOST_MEMORY_NOT_REGISTERED : INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < npins && r == HOST_MEMORY_NOT_REGISTERED; i++)
        if (pins[i].p == p)
            pins[i] = pins[--npins], r = OK;
    if (r != OK)
        pin_errors++;
    pthread_mutex_unlock(&lock);
    return r;
}

/* whether [p, p + n) is registered (page-locked), with every flag of flags (2:
 * DEVICEMAP, mapped for the device) */
static int registered(const char *p, size_t n, unsigned flags)
{
    pthread_mutex_lock(&lock);
    int ok = 0;
    for (int i = 0; i < npins && !ok; i++)
        ok = (pins[i].flags & flags) == flags && p >= pins[i].p && p + n <= pins[i].p + pins[i].n;
    pthread_mutex_unlock(&lock);
    return ok;
}

EXPORT int cuMemHostGetDevicePointer_v2(uintptr_t *d, void *p, unsigned flags)
{
    if (!inited)
        return NOT_INITIALIZED;
    if (!current)
        return INVALID_CONTEXT;
    if (flags || !registered(p, 1, 2))
        return INVALID_VALUE;
    *d = (uintptr_t)p; /* this fake's device sees host memory where the host does */
    return OK;
}

static int capturing;

/* test helper: every stream is being captured into a graph (on), or none is */
EXPORT void fake_cuda_capturing(int on)
{
    capturing = on;
}

EXPORT int cuStreamIsCapturing(void *stream, int *status)
{
    if (!inited)
        return NOT_INITIALIZED;
    if (!stream_of(stream))
        return INVALID_HANDLE;
    *status = capturing; /* 1: CU_STREAM_CAPTURE_STATUS_ACTIVE */
    return OK;
}

static int fail_waits;

/* test helper: every later cuStreamWaitValue32 fails (on), or none does */
EXPORT void fake_cuda_fail_waits(int on)
{
    fail_waits = on;
}

EXPORT int cuStreamWaitValue32_v2(void *stream, uintptr_t addr, uint32_t value, unsigned flags)
{
    if (!inited)
        return NOT_INITIALIZED;
    if (fail_waits)
        return INVALID_VALUE;
    if (!current)
        return INVALID_CONTEXT;
    fake_stream_t *st = stream_of(stream);
    if (!st)
        return INVALID_HANDLE;
    if (flags != 0 /* GEQ */ || (addr & 3) || !registered((const char *)addr, 4, 2))
        return INVALID_VALUE;
    return enqueue(st,
                   (item_t){ .kind = IT_WAIT, .word = (volatile uint32_t *)addr, .value = value });
}

EXPORT int fake_cuda_pinned(int *errors)
{
    pthread_mutex_lock(&lock);
    int n = npins;
    *errors = pin_errors;
    pthread_mutex_unlock(&lock);
    return n;
}

EXPORT int cuGetErrorString(int r, const char **s)
{
    *s = r == COPY_FAILED       ? "injected copy failure (fake)"
         : r == OUT_OF_MEMORY   ? "out of memory (fake)"
         : r == NOT_INITIALIZED ? "initialization error (fake)"
         : r == INVALID_CONTEXT ? "invalid device context (fake)"
         : r == INVALID_HANDLE  ? "invalid resource handle (fake)"
                                : "invalid argument (fake)";
    return OK;
}
