/* The silent transport host the tcp fuzz targets hand the transport: no store, no log,
 * errors only returned. */
#ifndef FUZZ_HOST_H
#define FUZZ_HOST_H

#include "tcp.h"

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

#endif /* FUZZ_HOST_H */
