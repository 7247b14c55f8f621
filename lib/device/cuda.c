/* CUDA's device layer (device.h) through the driver API, which this file loads with
 * dlopen (libcuda.so.1, the driver's own library): the build needs no CUDA, and a
 * process without it pays nothing. What a pointer is comes from cuPointerGetAttributes
 * (which answers for any pointer, CUDA's or not); copies are cuMemcpyDtoH/HtoD in the
 * pointer's own context, pushed on the calling thread for the copy (the copy back runs
 * on whichever thread completes the op). The declarations below are the driver API's
 * own, with the values its cuda.h gives them. */
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
    CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    CU_MEMORYTYPE_DEVICE = 2
};

static struct {
    cu_result_t (*init)(unsigned flags);
    cu_result_t (*pointer_get_attributes)(unsigned n, int *attrs, void **data, cu_deviceptr_t p);
    cu_result_t (*ctx_push)(cu_context_t ctx);
    cu_result_t (*ctx_pop)(cu_context_t *ctx);
    cu_result_t (*memcpy_dtoh)(void *dst, cu_deviceptr_t src, size_t n);
    cu_result_t (*memcpy_htod)(cu_deviceptr_t dst, const void *src, size_t n);
    cu_result_t (*stream_synchronize)(void *stream);
    cu_result_t (*get_error_string)(cu_result_t r, const char **s);
} cu;
static pthread_mutex_t cu_lock = PTHREAD_MUTEX_INITIALIZER;
static int cu_ready; /* 1: loaded and initialised */

static const char *cu_error(cu_result_t r)
{
    const char *s = NULL;
    if (!cu.get_error_string || cu.get_error_string(r, &s) != 0 || !s)
        return "unknown CUDA error";
    return s;
}

static int cu_query(const void *p, void **ctx, char *err, size_t errlen)
{
    int attrs[3] = { CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                     CU_POINTER_ATTRIBUTE_IS_MANAGED };
    cu_context_t c = NULL;
    unsigned type = 0, managed = 0;
    void *data[3] = { &c, &type, &managed };
    cu_result_t r = cu.pointer_get_attributes(3, attrs, data, (cu_deviceptr_t)(uintptr_t)p);
    if (r == CU_ERROR_NOT_INITIALIZED || r == CU_ERROR_DEINITIALIZED)
        return 0; /* no CUDA in use now: no device memory either */
    if (r != 0) {
        snprintf(err, errlen, "cuPointerGetAttributes: %s (%d)", cu_error(r), r);
        return TUTTI_ERR_DEVICE;
    }
    *ctx = c;
    return type == CU_MEMORYTYPE_DEVICE && !managed;
}

static int cu_copy(void *ctx, void *dst, const void *src, size_t n, int to_host, char *err,
                   size_t errlen)
{
    cu_result_t r = cu.ctx_push(ctx);
    if (r != 0) {
        snprintf(err, errlen, "cuCtxPushCurrent: %s (%d)", cu_error(r), r);
        return TUTTI_ERR_DEVICE;
    }
    const char *what = to_host ? "cuMemcpyDtoH" : "cuMemcpyHtoD";
    r = to_host ? cu.memcpy_dtoh(dst, (cu_deviceptr_t)(uintptr_t)src, n)
                : cu.memcpy_htod((cu_deviceptr_t)(uintptr_t)dst, src, n);
    /* from pageable memory the copy may return before its DMA ends: the legacy stream
     * (which the copy went on) finishes it, so the op completes with the bytes there */
    if (r == 0 && !to_host) {
        what = "cuStreamSynchronize";
        r = cu.stream_synchronize(NULL);
    }
    cu_context_t popped;
    cu.ctx_pop(&popped);
    if (r != 0) {
        snprintf(err, errlen, "%s: %s (%d)", what, cu_error(r), r);
        return TUTTI_ERR_DEVICE;
    }
    return TUTTI_OK;
}

static const tt_dev_ops_t cuda_ops = { "CUDA", cu_query, cu_copy };

const tt_dev_ops_t *tt_dev_cuda(int load, char *err, size_t errlen)
{
    pthread_mutex_lock(&cu_lock);
    if (cu_ready) {
        pthread_mutex_unlock(&cu_lock);
        return &cuda_ops;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | (load ? 0 : RTLD_NOLOAD));
    if (!h) {
        const char *e = dlerror();
        snprintf(err, errlen, "%s",
                 load ? (e ? e : "cannot load libcuda.so.1")
                      : "this process has not loaded libcuda.so.1");
        pthread_mutex_unlock(&cu_lock);
        return NULL;
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
        CU_SYM(stream_synchronize, "cuStreamSynchronize"),
        CU_SYM(get_error_string, "cuGetErrorString"),
#undef CU_SYM
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        void *f = dlsym(h, syms[i].name);
        if (!f) {
            snprintf(err, errlen, "libcuda.so.1 has no %s (a driver older than CUDA 7?)",
                     syms[i].name);
            memset(&cu, 0, sizeof(cu));
            dlclose(h);
            pthread_mutex_unlock(&cu_lock);
            return NULL;
        }
        memcpy((char *)&cu + syms[i].off, &f, sizeof(f));
    }
    cu_result_t r = cu.init(0);
    if (r != 0) {
        snprintf(err, errlen, "cuInit: %s (%d)", cu_error(r), r);
        memset(&cu, 0, sizeof(cu));
        dlclose(h);
        pthread_mutex_unlock(&cu_lock);
        return NULL;
    }
    cu_ready = 1; /* the handle stays open: the pointers above are into it */
    pthread_mutex_unlock(&cu_lock);
    TT_INFO("CUDA: device buffers are staged through host memory (libcuda.so.1 %s)",
            load ? "loaded" : "already loaded");
    return &cuda_ops;
}
