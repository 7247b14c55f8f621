/* What the transport fuzz targets share: the silent transport host they hand a transport
 * (no store, no log, errors only returned), and the receives they post on rank 1, with
 * the checks every receive must pass once the transport let go of it. */
#ifndef FUZZ_HOST_H
#define FUZZ_HOST_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kit/abi.h"

static void fuzz_host_log(void *ctx, int level, const char *fmt, ...)
{
    (void)ctx;
    (void)level;
    (void)fmt;
}

static int fuzz_host_error(void *ctx, int status, int peer, int err_no, const char *fmt, ...)
{
    (void)ctx;
    (void)peer;
    (void)err_no;
    (void)fmt;
    return status;
}

static inline tutti_tp_host_v1_t fuzz_host(int rank, int nranks)
{
    return (tutti_tp_host_v1_t){
        .size = sizeof(tutti_tp_host_v1_t),
        .abi_version = TUTTI_TRANSPORT_ABI_V1,
        .rank = rank,
        .nranks = nranks,
        .timeout_ms = 1000,
        .log = fuzz_host_log,
        .error = fuzz_host_error,
    };
}

/* nreqs receives from rank 1 with the envelope {1, 2, 3, 4}; lens holds their lengths,
 * 2 bytes each (little-endian). Each buffer is exactly its length, so that ASan sees a
 * byte written past it. */
static inline void fuzz_reqs_init(tp_req_t *reqs, size_t nreqs, const uint8_t *lens)
{
    memset(reqs, 0, nreqs * sizeof(*reqs));
    for (size_t i = 0; i < nreqs; i++) {
        reqs[i].peer = 1;
        reqs[i].len = (size_t)lens[2 * i] | (size_t)lens[2 * i + 1] << 8;
        reqs[i].buf = reqs[i].len ? malloc(reqs[i].len) : NULL;
        for (int k = 0; k < 4; k++)
            reqs[i].env[k] = (uint64_t)k + 1;
    }
}

/* Every receive ended (the transport cancels what is left), never moved more than its
 * length, and one that succeeded got all of it under the envelope it asked for; then
 * the buffers are freed. */
static inline void fuzz_reqs_check_free(tp_req_t *reqs, size_t nreqs)
{
    for (size_t i = 0; i < nreqs; i++) {
        tp_req_t *r = &reqs[i];
        if (r->status > 0 || r->xfer > r->len)
            abort();
        if (r->status == 0 && (r->xfer != r->len || r->got_len != r->len ||
                               memcmp(r->got_env, r->env, sizeof(r->env))))
            abort();
        free(r->buf);
    }
}

#endif /* FUZZ_HOST_H */
