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
 *   - host memory is registered (page-locked) once, and unregistered only if it was.
 * The real check runs on the device machine (tools/dev/device-check.sh). */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
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
    HOST_MEMORY_NOT_REGISTERED = 713
};

static int inited;
static __thread void *current;
static char primary_ctx[4]; /* device d's primary context: &primary_ctx[d] */
enum { MAX_ALLOCS = 256 };
static struct {
    char *dev, *back;
    size_t len;
    void *ctx; /* NULL: as the stream-ordered allocator's memory */
} allocs[MAX_ALLOCS];
static int nallocs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
    void *ctx;
} fake_stream_t;

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
    if (ordinal != 0)
        return INVALID_VALUE;
    *dev = ordinal;
    return OK;
}

EXPORT int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    if (!inited)
        return NOT_INITIALIZED;
    if (dev != 0)
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
        allocs[i].ctx = i % 2 ? NULL : current;
    pthread_mutex_unlock(&lock);
    if (i < 0 || dev == MAP_FAILED || back == MAP_FAILED)
        return INVALID_VALUE;
    *p = (uintptr_t)dev;
    return OK;
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
        case 8: /* IS_MANAGED */ *(unsigned *)data[k] = 0; break;
        case 9: /* DEVICE_ORDINAL */ *(int *)data[k] = i >= 0 ? 0 : -2; break;
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

EXPORT int cuStreamCreate(void **stream, unsigned flags)
{
    (void)flags;
    if (!inited)
        return NOT_INITIALIZED;
    if (!current)
        return INVALID_CONTEXT;
    static fake_stream_t streams[64];
    static int nstreams;
    pthread_mutex_lock(&lock);
    int i = nstreams < 64 ? nstreams++ : -1;
    pthread_mutex_unlock(&lock);
    if (i < 0)
        return INVALID_VALUE;
    streams[i].ctx = current;
    *stream = &streams[i];
    return OK;
}

EXPORT int cuMemcpyHtoDAsync_v2(uintptr_t dst, const void *src, size_t n, void *stream)
{
    if (stream && ((fake_stream_t *)stream)->ctx != current)
        return INVALID_HANDLE;
    return copy((void *)dst, src, n, 0);
}

EXPORT int cuStreamSynchronize(void *stream)
{
    if (!inited)
        return NOT_INITIALIZED;
    if (stream && ((fake_stream_t *)stream)->ctx != current)
        return INVALID_HANDLE;
    return OK;
}

/* page-locked host ranges: cuMemHostRegister's rules (a current context, no range
 * registered twice, only a registered range unregistered); fake_cuda_pinned() says how
 * many are registered now and how many calls broke a rule, for the tests */
enum { MAX_PINS = 64 };
static struct {
    char *p;
    size_t n;
} pins[MAX_PINS];
static int npins, pin_errors;

EXPORT int cuMemHostRegister_v2(void *p, size_t n, unsigned flags)
{
    if (!inited)
        return NOT_INITIALIZED;
    int r = !current ? INVALID_CONTEXT : !p || !n || flags > 7 ? INVALID_VALUE : OK;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < npins && r == OK; i++)
        if ((char *)p < pins[i].p + pins[i].n && pins[i].p < (char *)p + n)
            r = HOST_MEMORY_ALREADY_REGISTERED;
    if (r == OK && npins == MAX_PINS)
        r = INVALID_VALUE;
    if (r == OK)
        pins[npins].p = p, pins[npins++].n = n;
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
    *s = r == NOT_INITIALIZED   ? "initialization error (fake)"
         : r == INVALID_CONTEXT ? "invalid device context (fake)"
         : r == INVALID_HANDLE  ? "invalid resource handle (fake)"
                                : "invalid argument (fake)";
    return OK;
}
