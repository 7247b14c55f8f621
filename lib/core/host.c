/* The host interface the core gives a transport (tutti_tp_host_v1_t): the store, the
 * configuration knobs, logging, error reports and the job secret's answers. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/auth.h"
#include "base/base.h"
#include "core/comm.h"

static int host_store_set(void *ctx, const char *key, const void *value, size_t len)
{
    tutti_comm_t *comm = ctx;
    return tutti_store_set(comm->store, key, value, len);
}

static int host_store_get(void *ctx, const char *key, void **value_p, size_t *len_p,
                          int timeout_ms)
{
    tutti_comm_t *comm = ctx;
    return tutti_store_get(comm->store, key, value_p, len_p, timeout_ms);
}

static void host_free_value(void *value) { free(value); }

static const char *host_config(void *ctx, const char *name)
{
    tutti_comm_t *comm = ctx;
    static __thread char num[32];
    if (!strcmp(name, "SOCKET_IFNAME"))
        return comm->opts.socket_ifname;
    if (!strcmp(name, "SOCKET_FAMILY")) {
        snprintf(num, sizeof(num), "%d", comm->opts.socket_family);
        return num;
    }
    if (!strcmp(name, "CHECKSUM"))
        return comm->opts.checksum;
    if (!strcmp(name, "SOCKET_BUFFER")) {
        snprintf(num, sizeof(num), "%d", comm->opts.socket_buffer_bytes);
        return num;
    }
    /* opts.transport_options "NAME=VALUE,..." first, then TUTTI_NAME */
    static __thread char val[256];
    const char *v = tt_kv_lookup(comm->opts.transport_options, name, val, sizeof(val));
    return v ? v : tt_env(name);
}

static void host_log(void *ctx, int level, const char *fmt, ...)
{
    (void)ctx;
    if (tt_log_level() < level)
        return;
    va_list ap;
    va_start(ap, fmt);
    tt_vlog(level, fmt, ap);
    va_end(ap);
}

static int host_error(void *ctx, int status, int peer, int err_no, const char *fmt, ...)
{
    tutti_comm_t *comm = ctx;
    va_list ap;
    pthread_mutex_lock(&comm->err_lock);
    va_start(ap, fmt);
    int n = vsnprintf(comm->tp_error, sizeof(comm->tp_error), fmt, ap);
    va_end(ap);
    if (err_no && n > 0 && (size_t)n < sizeof(comm->tp_error))
        snprintf(comm->tp_error + n, sizeof(comm->tp_error) - (size_t)n, " (errno %d: %s)",
                 err_no, strerror(err_no));
    comm->tp_error_peer = peer;
    comm->tp_error_status = status;
    atomic_fetch_add(&comm->tp_error_gen, 1);
    pthread_mutex_unlock(&comm->err_lock);
    TT_INFO("transport: %s", comm->tp_error);
    return status;
}

static int host_auth_answer(void *ctx, const char *context, const uint8_t challenge[32],
                            uint8_t answer[32])
{
    tutti_comm_t *comm = ctx;
    if (!comm->secret)
        return TUTTI_ERR_UNSUPPORTED;
    tt_auth_answer(comm->secret, comm->secret_len, context, challenge, answer);
    return TUTTI_OK;
}

void tt_comm_host_init(tutti_comm_t *comm)
{
    comm->host = (tutti_tp_host_v1_t){
        .size = sizeof(tutti_tp_host_v1_t),
        .abi_version = TUTTI_TRANSPORT_ABI_V1,
        .rank = comm->rank,
        .nranks = comm->nranks,
        .timeout_ms = comm->opts.timeout_ms,
        .spin_us = comm->opts.spin_us,
        .ctx = comm,
        .store_set = host_store_set,
        .store_get = host_store_get,
        .free_value = host_free_value,
        .config = host_config,
        .log = host_log,
        .error = host_error,
        .instance = comm->instance,
        .auth_answer = host_auth_answer,
    };
}
