/* CUDA's device layer (device.h) through the driver API, which this file loads with
 * dlopen (libcuda.so.1, the driver's own library): the build needs no CUDA, and a
 * process without it pays nothing. What a pointer is comes from cuPointerGetAttributes
 * (which answers for any pointer, CUDA's or not); copies are cuMemcpyDtoH/HtoD in the
 * pointer's own context (its device's primary context where the pointer has none: the
 * stream-ordered allocator's and VMM memory), pushed on the calling thread for the copy
 * (the copy back runs on whichever thread completes the op). The copy in goes on the
 * legacy stream, so it comes after the work queued on the blocking streams (the data must
 * be ready at the call, as with a CUDA-aware MPI); the copy back goes on a stream of the
 * library's own (non-blocking), synchronised before the op completes, so it waits for
 * nothing else. The host side of both is a block of the library's, page-locked
 * (cuMemHostRegister) so that the copies run at the DMA engines' speed. The declarations
 * below are the driver API's own, with the values its cuda.h gives them. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "device/device.h"

typedef int cu_result_t; /* CUresult: 0 is CUDA_SUCCESS */
typedef void *cu_context_t;
typedef unsigned long long cu_deviceptr_t;
enum {
    CU_ERROR_NOT_INITIALIZED = 3,
    CU_ERROR_DEINITIALIZED = 4,
    CU_ERROR_INVALID_HANDLE = 400,
    CU_ERROR_CONTEXT_IS_DESTROYED = 709,
    CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_MEMORYTYPE_DEVICE = 2,
    CU_STREAM_NON_BLOCKING = 1,
    CU_MEMHOSTREGISTER_PORTABLE = 1,
    CU_MEMHOSTREGISTER_DEVICEMAP = 2,
    CU_ERROR_NOT_READY = 600,
    CU_EVENT_DISABLE_TIMING = 2,
    CU_STREAM_WAIT_VALUE_GEQ = 0
};

static struct {
    cu_result_t (*init)(unsigned flags);
    cu_result_t (*pointer_get_attributes)(unsigned n, int *attrs, void **data, cu_deviceptr_t p);
    cu_result_t (*ctx_push)(cu_context_t ctx);
    cu_result_t (*ctx_pop)(cu_context_t *ctx);
    cu_result_t (*memcpy_dtoh)(void *dst, cu_deviceptr_t src, size_t n);
    cu_result_t (*memcpy_htod)(cu_deviceptr_t dst, const void *src, size_t n);
    cu_result_t (*memcpy_htod_async)(cu_deviceptr_t dst, const void *src, size_t n, void *stream);
    cu_result_t (*stream_create)(void **stream, unsigned flags);
    cu_result_t (*stream_synchronize)(void *stream);
    cu_result_t (*get_error_string)(cu_result_t r, const char **s);
    cu_result_t (*device_get)(int *dev, int ordinal);
    cu_result_t (*primary_ctx_retain)(cu_context_t *ctx, int dev);
    cu_result_t (*host_register)(void *p, size_t n, unsigned flags);
    cu_result_t (*host_unregister)(void *p);
    /* stream-ordered calls: loaded where the driver has them all (CUDA 11.7 on) */
    cu_result_t (*stream_get_ctx)(void *stream, cu_context_t *ctx);
    cu_result_t (*memcpy_dtoh_async)(void *dst, cu_deviceptr_t src, size_t n, void *stream);
    cu_result_t (*event_create)(void **ev, unsigned flags);
    cu_result_t (*event_record)(void *ev, void *stream);
    cu_result_t (*event_query)(void *ev);
    cu_result_t (*event_destroy)(void *ev);
    cu_result_t (*host_get_device_pointer)(cu_deviceptr_t *d, void *p, unsigned flags);
    cu_result_t (*stream_wait_value32)(void *stream, cu_deviceptr_t addr, uint32_t value,
                                       unsigned flags);
    cu_result_t (*stream_is_capturing)(void *stream, int *status); /* optional (CUDA 10) */
} cu;
static pthread_mutex_t cu_lock = PTHREAD_MUTEX_INITIALIZER;
static int cu_ready;  /* 1: loaded */
static int cu_inited; /* 1: cuInit called here (TUTTI_CUDA=on) */

/* Per context, the copy back's stream; per device, its primary context (retained for
 * the process's life). A fork's child starts with none (its parent's are not its). */
enum { CU_MAX = 64 };
static struct {
    cu_context_t ctx;
    void *stream;
} cu_streams[CU_MAX];
static int cu_nstreams;
static cu_context_t cu_primary[CU_MAX];

static void cu_forked(void)
{
    cu_nstreams = 0;
    memset(cu_primary, 0, sizeof(cu_primary));
    pthread_mutex_init(&cu_lock, NULL);
}

static const char *cu_error(cu_result_t r)
{
    const char *s = NULL;
    if (!cu.get_error_string || cu.get_error_string(r, &s) != 0 || !s)
        return "unknown CUDA error";
    return s;
}

/* ordinal's primary context, retained once */
static int cu_primary_ctx(int ordinal, cu_context_t *ctx, char *err, size_t errlen)
{
    if (ordinal < 0 || ordinal >= CU_MAX) {
        snprintf(err, errlen, "device ordinal %d", ordinal);
        return TUTTI_ERR_DEVICE;
    }
    pthread_mutex_lock(&cu_lock);
    cu_result_t r = 0;
    int dev;
    if (!cu_primary[ordinal] && (r = cu.device_get(&dev, ordinal)) == 0)
        r = cu.primary_ctx_retain(&cu_primary[ordinal], dev);
    *ctx = cu_primary[ordinal];
    pthread_mutex_unlock(&cu_lock);
    if (r != 0) {
        snprintf(err, errlen, "the primary context of device %d: %s (%d)", ordinal, cu_error(r), r);
        return TUTTI_ERR_DEVICE;
    }
    return TUTTI_OK;
}

static int cu_query(const void *p, void **ctx, char *err, size_t errlen)
{
    int attrs[4] = { CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                     CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL };
    cu_context_t c = NULL;
    unsigned type = 0, managed = 0;
    int ordinal = -1;
    void *data[4] = { &c, &type, &managed, &ordinal };
    cu_result_t r = cu.pointer_get_attributes(4, attrs, data, (cu_deviceptr_t)(uintptr_t)p);
    if (r == CU_ERROR_NOT_INITIALIZED || r == CU_ERROR_DEINITIALIZED)
        return 0; /* no CUDA in use now: no device memory either */
    if (r != 0) {
        snprintf(err, errlen, "cuPointerGetAttributes: %s (%d)", cu_error(r), r);
        return TUTTI_ERR_DEVICE;
    }
    if (type != CU_MEMORYTYPE_DEVICE)
        return 0;
    /* cudaMallocAsync's pools and VMM mappings belong to no context (managed memory
     * without one is host memory, as all managed memory was before streams) */
    if (!c && cu_primary_ctx(ordinal, &c, err, errlen) < 0)
        return managed ? 0 : TUTTI_ERR_DEVICE;
    *ctx = c;
    return managed ? 2 : 1; /* managed: the host's to touch, but streams' too */
}

/* ctx's stream forgotten (the context was reset: the stream went with it) */
static void cu_stream_drop(cu_context_t ctx)
{
    pthread_mutex_lock(&cu_lock);
    for (int i = 0; i < cu_nstreams; i++)
        if (cu_streams[i].ctx == ctx)
            cu_streams[i] = cu_streams[--cu_nstreams];
    pthread_mutex_unlock(&cu_lock);
}

/* the copy back's stream in ctx (pushed), made at its first use; NULL: the legacy one */
static void *cu_stream(cu_context_t ctx)
{
    void *s = NULL;
    pthread_mutex_lock(&cu_lock);
    for (int i = 0; i < cu_nstreams && !s; i++)
        if (cu_streams[i].ctx == ctx)
            s = cu_streams[i].stream;
    if (!s && cu_nstreams < CU_MAX && cu.stream_create(&s, CU_STREAM_NON_BLOCKING) == 0) {
        cu_streams[cu_nstreams].ctx = ctx;
        cu_streams[cu_nstreams++].stream = s;
    }
    pthread_mutex_unlock(&cu_lock);
    return s;
}

static int cu_copy(void *ctx, void *dst, const void *src, size_t n, int to_host, char *err,
                   size_t errlen)
{
    cu_result_t r = cu.ctx_push(ctx);
    if (r != 0) {
        snprintf(err, errlen, "cuCtxPushCurrent: %s (%d)", cu_error(r), r);
        return TUTTI_ERR_DEVICE;
    }
    const char *what = "cuMemcpyDtoH";
    void *s = NULL;
    if (to_host) {
        r = cu.memcpy_dtoh(dst, (cu_deviceptr_t)(uintptr_t)src, n);
    } else {
        /* from pageable memory the copy may return before its DMA ends: its stream is
         * synchronised, so that the op completes with the bytes there */
        for (int retry = 1; retry >= 0; retry--) {
            s = cu_stream(ctx);
            what = s ? "cuMemcpyHtoDAsync" : "cuMemcpyHtoD";
            r = s ? cu.memcpy_htod_async((cu_deviceptr_t)(uintptr_t)dst, src, n, s)
                  : cu.memcpy_htod((cu_deviceptr_t)(uintptr_t)dst, src, n);
            if (!s || (r != CU_ERROR_INVALID_HANDLE && r != CU_ERROR_CONTEXT_IS_DESTROYED))
                break;
            cu_stream_drop(ctx); /* a stream of a context since reset: a new one, once */
        }
        if (r == 0) {
            what = "cuStreamSynchronize";
            r = cu.stream_synchronize(s);
        }
    }
    cu_context_t popped;
    cu.ctx_pop(&popped);
    if (r != 0) {
        snprintf(err, errlen, "%s: %s (%d)", what, cu_error(r), r);
        return TUTTI_ERR_DEVICE;
    }
    return TUTTI_OK;
}

/* call's result, made with ctx current (pushed for it; a failed push's result instead) */
#define CTX_CALL(ctx, call)                                                                        \
    __extension__({                                                                                \
        cu_result_t r_ = cu.ctx_push(ctx);                                                         \
        if (r_ == 0) {                                                                             \
            r_ = (call);                                                                           \
            cu_context_t popped_;                                                                  \
            cu.ctx_pop(&popped_);                                                                  \
        }                                                                                          \
        r_;                                                                                        \
    })

/* the same, a failure err's (named what) and TUTTI_ERR_DEVICE returned */
#define IN_CTX(ctx, what, call)                                                                    \
    do {                                                                                           \
        cu_result_t rc_ = CTX_CALL(ctx, call);                                                     \
        if (rc_ != 0) {                                                                            \
            snprintf(err, errlen, "%s: %s (%d)", what, cu_error(rc_), rc_);                        \
            return TUTTI_ERR_DEVICE;                                                               \
        }                                                                                          \
    } while (0)

/* The host blocks are the library's own (malloc'ed), registered rather than allocated
 * with cuMemHostAlloc: a context reset (cudaDeviceReset) unregisters them, and they stay
 * host memory, copied from as pageable memory, where an allocation would be gone. */
static int cu_pin(void *ctx, void *p, size_t n, char *err, size_t errlen)
{
    /* mapped too: a stream-ordered call's stream waits on a word of the block */
    IN_CTX(ctx, "cuMemHostRegister",
           cu.host_register(p, n, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
    return TUTTI_OK;
}

static void cu_unpin(void *ctx, void *p)
{
    (void)CTX_CALL(ctx, cu.host_unregister(p)); /* a context gone took it along */
}

static int cu_stream_ctx(void *stream, void **ctx, char *err, size_t errlen)
{
    cu_result_t r = cu.stream_get_ctx(stream, (cu_context_t *)ctx);
    if (r != 0 || !*ctx) {
        snprintf(err, errlen, "cuStreamGetCtx: %s (%d)", r ? cu_error(r) : "no context", r);
        return TUTTI_ERR_DEVICE;
    }
    return TUTTI_OK;
}

static int cu_copy_async(void *stream, void *ctx, void *dst, const void *src, size_t n, int to_host,
                         char *err, size_t errlen)
{
    if (to_host)
        IN_CTX(ctx, "cuMemcpyDtoHAsync",
               cu.memcpy_dtoh_async(dst, (cu_deviceptr_t)(uintptr_t)src, n, stream));
    else
        IN_CTX(ctx, "cuMemcpyHtoDAsync",
               cu.memcpy_htod_async((cu_deviceptr_t)(uintptr_t)dst, src, n, stream));
    return TUTTI_OK;
}

/* *ev NULL unless recorded: a query of an event never recorded says it has passed */
static int cu_event_record(void *stream, void *ctx, void **ev, char *err, size_t errlen)
{
    void *e = NULL;
    *ev = NULL;
    IN_CTX(ctx, "cuEventCreate", cu.event_create(&e, CU_EVENT_DISABLE_TIMING));
    cu_result_t r = CTX_CALL(ctx, cu.event_record(e, stream));
    if (r != 0) {
        snprintf(err, errlen, "cuEventRecord: %s (%d)", cu_error(r), r);
        (void)CTX_CALL(ctx, cu.event_destroy(e));
        return TUTTI_ERR_DEVICE;
    }
    *ev = e;
    return TUTTI_OK;
}

static int cu_stream_capturing(void *stream, void *ctx, char *err, size_t errlen)
{
    int status = 0; /* CU_STREAM_CAPTURE_STATUS_NONE */
    IN_CTX(ctx, "cuStreamIsCapturing", cu.stream_is_capturing(stream, &status));
    return status != 0;
}

static int cu_event_query(void *ctx, void *ev, char *err, size_t errlen)
{
    cu_result_t r = CTX_CALL(ctx, cu.event_query(ev));
    if (r == 0 || r == CU_ERROR_NOT_READY) /* NOT_READY: an answer, not a failure */
        return r == 0;
    snprintf(err, errlen, "cuEventQuery: %s (%d)", cu_error(r), r);
    return TUTTI_ERR_DEVICE;
}

static void cu_event_free(void *ctx, void *ev)
{
    (void)CTX_CALL(ctx, cu.event_destroy(ev));
}

static int cu_wait_word(void *stream, void *ctx, void *base, size_t off, char *err, size_t errlen)
{
    cu_deviceptr_t d = 0;
    IN_CTX(ctx, "cuMemHostGetDevicePointer", cu.host_get_device_pointer(&d, base, 0));
    IN_CTX(ctx, "cuStreamWaitValue32",
           cu.stream_wait_value32(stream, d + off, 1, CU_STREAM_WAIT_VALUE_GEQ));
    return TUTTI_OK;
}

/* the stream functions set at load where the driver has them */
static tt_dev_ops_t cuda_ops = {
    .name = "CUDA", .query = cu_query, .copy = cu_copy, .pin = cu_pin, .unpin = cu_unpin
};

/* Load the driver's library (the caller holds cu_lock). */
static int cu_load(int load, char *err, size_t errlen)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | (load ? 0 : RTLD_NOLOAD));
    if (!h) {
        const char *e = dlerror();
        snprintf(err, errlen, "%s",
                 load ? (e ? e : "cannot load libcuda.so.1")
                      : "this process has not loaded libcuda.so.1");
        return TUTTI_ERR_NO_DEVICE;
    }
    static const struct {
        const char *name;
        size_t off;
    } syms[] = {
#define CU_SYM(field, name) { name, offsetof(__typeof__(cu), field) }
        CU_SYM(init, "cuInit"),
        CU_SYM(pointer_get_attributes, "cuPointerGetAttributes"),
        CU_SYM(ctx_push, "cuCtxPushCurrent_v2"),
        CU_SYM(ctx_pop, "cuCtxPopCurrent_v2"),
        CU_SYM(memcpy_dtoh, "cuMemcpyDtoH_v2"),
        CU_SYM(memcpy_htod, "cuMemcpyHtoD_v2"),
        CU_SYM(memcpy_htod_async, "cuMemcpyHtoDAsync_v2"),
        CU_SYM(stream_create, "cuStreamCreate"),
        CU_SYM(stream_synchronize, "cuStreamSynchronize"),
        CU_SYM(get_error_string, "cuGetErrorString"),
        CU_SYM(device_get, "cuDeviceGet"),
        CU_SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain"),
        CU_SYM(host_register, "cuMemHostRegister_v2"),
        CU_SYM(host_unregister, "cuMemHostUnregister"),
#undef CU_SYM
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        void *f = dlsym(h, syms[i].name);
        if (!f) {
            snprintf(err, errlen, "libcuda.so.1 has no %s (a driver older than CUDA 7?)",
                     syms[i].name);
            memset(&cu, 0, sizeof(cu));
            dlclose(h);
            return TUTTI_ERR_NO_DEVICE;
        }
        memcpy((char *)&cu + syms[i].off, &f, sizeof(f));
    }
    static const struct {
        const char *name, *old_name;
        size_t off;
    } stream_syms[] = {
#define CU_SYM(field, name, old_name) { name, old_name, offsetof(__typeof__(cu), field) }
        CU_SYM(stream_get_ctx, "cuStreamGetCtx", NULL),
        CU_SYM(memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2", NULL),
        CU_SYM(event_create, "cuEventCreate", NULL),
        CU_SYM(event_record, "cuEventRecord", NULL),
        CU_SYM(event_query, "cuEventQuery", NULL),
        CU_SYM(event_destroy, "cuEventDestroy_v2", NULL),
        CU_SYM(host_get_device_pointer, "cuMemHostGetDevicePointer_v2", NULL),
        CU_SYM(stream_wait_value32, "cuStreamWaitValue32_v2", "cuStreamWaitValue32"),
#undef CU_SYM
    };
    int streams = 1;
    for (size_t i = 0; i < sizeof(stream_syms) / sizeof(stream_syms[0]); i++) {
        void *f = dlsym(h, stream_syms[i].name);
        if (!f && stream_syms[i].old_name)
            f = dlsym(h, stream_syms[i].old_name);
        streams &= f != NULL;
        memcpy((char *)&cu + stream_syms[i].off, &f, sizeof(f));
    }
    void *capturing = dlsym(h, "cuStreamIsCapturing");
    memcpy(&cu.stream_is_capturing, &capturing, sizeof(capturing));
    if (streams) {
        cuda_ops.stream_capturing = capturing ? cu_stream_capturing : NULL;
        cuda_ops.stream_ctx = cu_stream_ctx;
        cuda_ops.copy_async = cu_copy_async;
        cuda_ops.event_record = cu_event_record;
        cuda_ops.event_query = cu_event_query;
        cuda_ops.event_free = cu_event_free;
        cuda_ops.wait_word = cu_wait_word;
    }
    cu_ready = 1; /* the handle stays open: the pointers above are into it */
    pthread_atfork(NULL, NULL, cu_forked);
    return TUTTI_OK;
}

const tt_dev_ops_t *tt_dev_cuda(int load, char *err, size_t errlen)
{
    pthread_mutex_lock(&cu_lock);
    int st = cu_ready ? TUTTI_OK : cu_load(load, err, errlen);
    /* "on" initialises the driver; "auto" leaves that to the program (initialised here,
     * it would stop a child the program forks later from using CUDA): until it has, no
     * pointer is device memory */
    if (st == TUTTI_OK && load && !cu_inited) {
        cu_result_t r = cu.init(0);
        if (r != 0) {
            snprintf(err, errlen, "cuInit: %s (%d)", cu_error(r), r);
            st = TUTTI_ERR_NO_DEVICE;
        }
        cu_inited = r == 0;
    }
    pthread_mutex_unlock(&cu_lock);
    if (st < 0)
        return NULL;
    TT_INFO("CUDA: device buffers are staged through host memory (libcuda.so.1 %s)",
            load ? "loaded" : "already loaded");
    return &cuda_ops;
}
