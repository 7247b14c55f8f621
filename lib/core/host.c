/* The host interface the core gives a transport (tutti_tp_host_v2_t): the store, the
 * configuration knobs, logging, error reports and the job secret's answers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/auth.h"
#include "base/base.h"
#include "core/comm.h"
#include "core/setup.h"
#include "plugin/tpmux.h"

static int host_store_set(void *ctx, const char *key, const void *value, size_t len)
{
    tutti_comm_t *comm = ctx;
    return tutti_store_set(comm->store, key, value, len);
}

static int host_store_get(void *ctx, const char *key, void **value_p, size_t *len_p, int timeout_ms)
{
    tutti_comm_t *comm = ctx;
    return tt_init_store_get(comm, comm->store, key, value_p, len_p, timeout_ms);
}

/* ABI 1.5: a peer's failed set-up ends this one's waits (the store read at most every
 * 100 ms; its reason goes into the init's error, comm.c's init_fail). */
static int host_setup_check(void *ctx)
{
    tutti_comm_t *comm = ctx;
    if (!atomic_load(&comm->in_setup))
        return 0;
    uint64_t now = tt_now_ns();
    if (!comm->setup_peer_status && now - comm->setup_checked_ns < 100000000u)
        return 0;
    comm->setup_checked_ns = now;
    return tt_setup_peer_failed(comm);
}

static void host_free_value(void *value)
{
    free(value);
}

/* Knobs that the public options struct carries as fields (tutti.h): a transport asks
 * for them by name like for any other knob; which transport reads them is its business. */
static const struct {
    const char *name;
    size_t off;
    int is_int;
} opts_knobs[] = {
    { "SOCKET_IFNAME", offsetof(tutti_comm_opts_t, socket_ifname), 0 },
    { "SOCKET_FAMILY", offsetof(tutti_comm_opts_t, socket_family), 1 },
    { "SOCKET_BUFFER", offsetof(tutti_comm_opts_t, socket_buffer_bytes), 1 },
    { "CHECKSUM", offsetof(tutti_comm_opts_t, checksum), 0 },
    { "BIND", offsetof(tutti_comm_opts_t, bind), 0 },
    { "TLS_CERT", offsetof(tutti_comm_opts_t, tls_cert), 0 },
    { "TLS_KEY", offsetof(tutti_comm_opts_t, tls_key), 0 },
    { "TLS_CA_FILE", offsetof(tutti_comm_opts_t, tls_ca_file), 0 },
    { "TLS_CA_PATH", offsetof(tutti_comm_opts_t, tls_ca_path), 0 },
};

static const char *host_config(void *ctx, const char *name)
{
    tutti_comm_t *comm = ctx;
    static __thread char num[32];
    tt_transports_knob_asked(name);
    for (size_t i = 0; i < TT_ARRAY_SIZE(opts_knobs); i++) {
        if (strcmp(name, opts_knobs[i].name))
            continue;
        const char *field = (const char *)&comm->opts + opts_knobs[i].off;
        if (!opts_knobs[i].is_int)
            return *(const char *const *)field;
        snprintf(num, sizeof(num), "%d", *(const int *)field);
        return num;
    }
    /* opts.transport_options "NAME=VALUE,..." first, then TUTTI_NAME */
    static __thread char val[256];
    const char *v = tt_kv_lookup(comm->opts.transport_options, name, val, sizeof(val));
    return v ? v : tt_env(name);
}

/* A transport names a knob it read as "TUTTI_NAME=value"; where the value came from
 * opts.transport_options (TUTTI_TRANSPORT_OPTIONS) and not from TUTTI_NAME, msg (of cap
 * bytes) is made to say so: "TUTTI_TRANSPORT_OPTIONS's NAME=value". */
static void name_knob_source(const tutti_comm_t *comm, char *msg, size_t cap)
{
    static const char from[] = "TUTTI_TRANSPORT_OPTIONS's ";
    if (!comm->opts.transport_options)
        return;
    for (char *p = strstr(msg, "TUTTI_"); p; p = strstr(p + 1, "TUTTI_")) {
        char name[64], val[8];
        size_t n = strspn(p + 6, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
        if (!n || n >= sizeof(name) || p[6 + n] != '=')
            continue;
        memcpy(name, p + 6, n);
        name[n] = '\0';
        size_t len = strlen(msg), add = sizeof(from) - 1 - 6; /* "TUTTI_" is replaced */
        if (!tt_kv_lookup(comm->opts.transport_options, name, val, sizeof(val)) || len + add >= cap)
            continue;
        memmove(p + add, p, len - (size_t)(p - msg) + 1);
        memcpy(p, from, sizeof(from) - 1);
        p += sizeof(from) - 1;
    }
}

static void host_log(void *ctx, int level, const char *fmt, ...)
{
    tutti_comm_t *comm = ctx;
    if (tt_log_level() < level)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    name_knob_source(comm, msg, sizeof(msg));
    tt_log(level, "%s", msg);
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
        snprintf(comm->tp_error + n, sizeof(comm->tp_error) - (size_t)n, " (errno %d: %s)", err_no,
                 strerror(err_no));
    name_knob_source(comm, comm->tp_error, sizeof(comm->tp_error));
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
    comm->host = (tutti_tp_host_v2_t){
        .size = sizeof(tutti_tp_host_v2_t),
        .abi_version = TUTTI_TRANSPORT_ABI_V1,
        .rank = comm->rank,
        .nranks = comm->nranks,
        .timeout_ms = tt_comm_timeout_ms(comm),
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
        .req_size = sizeof(tutti_tp_req_v2_t),
        .setup_check = host_setup_check,
        .features = TUTTI_TP_HOST_PROBE_KEY,
    };
}
