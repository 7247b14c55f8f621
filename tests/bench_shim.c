/* An LD_PRELOAD stand-in that breaks fp32 results as a buggy library would, for
 * tests/test_bench_args.sh: tutti-bench -c must find every one of these (exit 1).
 *   MODE=stale       out-of-place fp32 allreduce does nothing after its first call of
 *                    each count (the receive buffer keeps what that call left)
 *   MODE=reverse     the fp32 allreduce's result reversed
 *   MODE=wrongblock  reduce_scatter returns the block of rank (me + 1) mod n
 * Anything else (or no MODE): the library's calls unchanged. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT */
#endif
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include <tutti/tutti.h>

#define SHIM_EXPORT __attribute__((visibility("default")))

typedef int (*coll_fn)(tutti_comm_t *, const void *, void *, size_t, tutti_dtype_t, tutti_redop_t);

static int mode_is(const char *m)
{
    const char *mode = getenv("MODE");
    return mode && !strcmp(mode, m);
}

SHIM_EXPORT int tutti_allreduce(tutti_comm_t *c, const void *s, void *r, size_t n, tutti_dtype_t dt,
                                tutti_redop_t op)
{
    static coll_fn real;
    static size_t last;
    if (!real)
        real = (coll_fn)dlsym(RTLD_NEXT, "tutti_allreduce");
    if (dt == TUTTI_FP32 && s != TUTTI_IN_PLACE && mode_is("stale")) {
        if (n == last)
            return TUTTI_OK;
        last = n;
    }
    int st = real(c, s, r, n, dt, op);
    if (dt == TUTTI_FP32 && mode_is("reverse")) {
        float *f = r;
        for (size_t i = 0; i < n / 2; i++) {
            float t = f[i];
            f[i] = f[n - 1 - i];
            f[n - 1 - i] = t;
        }
    }
    return st;
}

SHIM_EXPORT int tutti_reduce_scatter(tutti_comm_t *c, const void *s, void *r, size_t n,
                                     tutti_dtype_t dt, tutti_redop_t op)
{
    static coll_fn real;
    if (!real)
        real = (coll_fn)dlsym(RTLD_NEXT, "tutti_reduce_scatter");
    if (!mode_is("wrongblock"))
        return real(c, s, r, n, dt, op);
    int me = tutti_comm_rank(c), np = tutti_comm_size(c);
    size_t es = tutti_dtype_size(dt);
    char *tmp = malloc(n * (size_t)np * es);
    if (!tmp)
        return TUTTI_ERR_NOMEM;
    memcpy(tmp, s == TUTTI_IN_PLACE ? r : s, n * (size_t)np * es);
    int st = tutti_allreduce(c, TUTTI_IN_PLACE, tmp, n * (size_t)np, dt, op);
    memcpy(r, tmp + (size_t)((me + 1) % np) * n * es, n * es);
    free(tmp);
    return st;
}
