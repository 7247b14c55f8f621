/* Communicator options: the defaults, the TUTTI_* environment over them, and the
 * communicator's own copy (tutti_comm_opts_init, tt_comm_opts_resolve); the quick store
 * deadline derived from them (tt_comm_quick_ms). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "core/opts.h"
#include "core/state.h"
#include "../../transports/kit/util.h"

#define TT_DEFAULT_TIMEOUT_MS 30000
/* TUTTI_SPIN_US unset (or "auto", or a negative spin_us): spin this long where the ranks
 * on this host have a CPU each, and the short spin where they outnumber the CPUs (each
 * spinning rank then holds a CPU another rank needs); resolved per host in lib/plugin/tpmux.c
 * (spin_resolve). docs/internals.md, "How long to spin". */
#define TT_SPIN_AUTO (-1)
#define TT_SPIN_AUTO_FREE_US 200
#define TT_SPIN_AUTO_SHARED_US 50
#define TT_DEFAULT_CHUNK (1u << 20)
#define TT_DEFAULT_DEFER_US 200
#define TT_DEFAULT_AGREE_LAG 64
#define TT_DEFAULT_TRACE_ENTRIES 1024
#define TT_DEFAULT_STREAM_TIMEOUT_MS 600000

/* TUTTI_<name> as a size (tt_parse_size) that fits an int: 0 when unset or (with a
 * warning, once) not such a size. */
static int env_size_int(const char *name)
{
    const char *v = tt_env(name);
    size_t n = 0;
    if (v && (tt_parse_size(v, &n) < 0 || n > INT32_MAX)) {
        if (tt_warn_first(name, v))
            TT_WARN("TUTTI_%s=%s is not a size (digits, then K, M or G) below 2G; using 0", name,
                    v);
        n = 0;
    }
    return (int)n;
}

int tutti_comm_opts_init(tutti_comm_opts_t *opts)
{
    if (!opts)
        return TUTTI_ERR_INVALID_ARG;
    memset(opts, 0, sizeof(*opts));
    opts->size = sizeof(*opts);
    opts->timeout_ms = tt_env_int("TIMEOUT_MS", TT_DEFAULT_TIMEOUT_MS);
    opts->transport = tt_env("TRANSPORT");
    opts->plugin_path = tt_env("PLUGIN_PATH");
    opts->algo = tt_env("ALGO");
    opts->socket_ifname = tp_socket_ifname_env(NULL); /* (NCCL's, gloo's where ours is unset) */
    /* not a number: -1, which tcp refuses naming the variable (0 would mean either);
     * read here without tt_env_int's warning, which said "using -1" before the refusal */
    const char *fam = tt_env("SOCKET_FAMILY");
    char *fend = NULL;
    long fx = fam ? strtol(fam, &fend, 10) : 0;
    opts->socket_family = !fam ? 0 : *fam && !*fend && fx >= 0 && fx <= 6 ? (int)fx : -1;
    opts->socket_buffer_bytes = env_size_int("SOCKET_BUFFER");
    const char *spin = tt_env("SPIN_US");
    char *end = NULL;
    long us = spin ? strtol(spin, &end, 10) : TT_SPIN_AUTO;
    if (spin && strcmp(spin, "auto") && (*end || us < INT32_MIN || us > INT32_MAX)) {
        if (tt_warn_first("SPIN_US", spin))
            TT_WARN("TUTTI_SPIN_US=%s is neither auto nor an integer; using auto", spin);
        us = TT_SPIN_AUTO;
    }
    opts->spin_us = spin && !strcmp(spin, "auto") ? TT_SPIN_AUTO : (int)us;
    opts->chunk_bytes = TT_DEFAULT_CHUNK;
    const char *chunk = tt_env("CHUNK_BYTES");
    if (chunk && tt_parse_size(chunk, &opts->chunk_bytes) < 0) {
        if (tt_warn_first("CHUNK_BYTES", chunk))
            TT_WARN("TUTTI_CHUNK_BYTES=%s is not a size; using %u", chunk, TT_DEFAULT_CHUNK);
        opts->chunk_bytes = TT_DEFAULT_CHUNK;
    }
    opts->prefix = tt_env("PREFIX");
    opts->stall_check_ms = tt_env_int("STALL_CHECK_MS", 1000);
    opts->host_id = tt_env("HOST_ID");
    opts->cost_model = tt_env("COST_MODEL");
    opts->transport_options = tt_env("TRANSPORT_OPTIONS");
    opts->job_id = tt_env("JOB_ID");
    /* set but empty is an error (tt_auth_load_secret), never "no secret" */
    opts->auth_token = tt_env_set("AUTH_TOKEN");
    opts->auth_token_file = tt_env_set("AUTH_TOKEN_FILE");
    opts->checksum = tt_env("CHECKSUM");
    opts->job_settle_ms = tt_env_int("JOB_SETTLE_MS", 250);
    opts->defer_us = tt_env_int("DEFER_US", TT_DEFAULT_DEFER_US);
    opts->agree_lag = tt_env_int("AGREE_LAG", TT_DEFAULT_AGREE_LAG);
    opts->bind = tt_env("BIND");
    opts->trace_entries = tt_env_int("TRACE_ENTRIES", TT_DEFAULT_TRACE_ENTRIES);
    opts->trace_dir = tt_env("TRACE_DIR");
    opts->cuda = tt_env("CUDA");
    opts->stream_timeout_ms = tt_env_int("STREAM_TIMEOUT_MS", TT_DEFAULT_STREAM_TIMEOUT_MS);
    /* Gloo's (PyTorch's GLOO_DEVICE_TRANSPORT=TCP_TLS) where ours are unset */
    opts->tls_cert = tt_env_or("TLS_CERT", "GLOO_DEVICE_TRANSPORT_TCP_TLS_CERT");
    opts->tls_key = tt_env_or("TLS_KEY", "GLOO_DEVICE_TRANSPORT_TCP_TLS_PKEY");
    opts->tls_ca_file = tt_env_or("TLS_CA_FILE", "GLOO_DEVICE_TRANSPORT_TCP_TLS_CA_FILE");
    opts->tls_ca_path = tt_env_or("TLS_CA_PATH", "GLOO_DEVICE_TRANSPORT_TCP_TLS_CA_PATH");
    return TUTTI_OK;
}

/* The string fields, which the communicator owns and the environment fills where the
 * caller's options leave them NULL. */
/* clang-format off */
#define TT_OPTS_STRINGS(X) \
    X(plugin_path) X(algo) X(socket_ifname) X(prefix) X(host_id) X(cost_model) \
    X(transport_options) X(job_id) X(auth_token) X(auth_token_file) X(checksum) X(bind) \
    X(trace_dir) X(cuda) X(tls_cert) X(tls_key) X(tls_ca_file) X(tls_ca_path)
/* clang-format on */

void tt_comm_opts_free(tutti_comm_opts_t *o)
{
    free((char *)o->transport);
#define TT_OPTS_FREE(f) free((char *)o->f);
    TT_OPTS_STRINGS(TT_OPTS_FREE)
#undef TT_OPTS_FREE
}

int tt_comm_opts_resolve(tutti_comm_opts_t *dst, const tutti_comm_opts_t *src)
{
    tutti_comm_opts_t env, d;
    /* the one reading of the environment (a second one where the caller's options came
     * from tutti_comm_opts_init: its warnings are not repeated, tt_warn_first) */
    tutti_comm_opts_init(&env);
    d = env;
    if (src) {
        /* Fields the caller's (possibly older, smaller) struct has win over defaults. */
        size_t n = src->size && src->size < sizeof(d) ? src->size : sizeof(d);
        memcpy(&d, src, n);
        d.size = sizeof(d);
    }
    /* A NULL string means "not set here": the environment (then the default) fills it,
     * so options made before the environment was set still honour it. */
    d.transport = tt_strdup(d.transport ? d.transport : env.transport ? env.transport : "auto");
#define TT_OPTS_DUP(f) d.f = tt_strdup(d.f ? d.f : env.f);
    TT_OPTS_STRINGS(TT_OPTS_DUP)
#undef TT_OPTS_DUP
    if (!d.transport) {
        tt_comm_opts_free(&d);
        return TUTTI_ERR_NOMEM;
    }
    if (d.timeout_ms < 0) { /* 0 is the default; a negative one is no bound elsewhere */
        char v[16];
        snprintf(v, sizeof(v), "%d", d.timeout_ms);
        if (tt_warn_first("TIMEOUT_MS", v))
            TT_WARN("timeout_ms (TUTTI_TIMEOUT_MS) %s: a communicator's waits are always "
                    "bounded; using %d",
                    v, TT_DEFAULT_TIMEOUT_MS);
    }
    if (d.timeout_ms <= 0)
        d.timeout_ms = TT_DEFAULT_TIMEOUT_MS;
    if (d.chunk_bytes < 4096)
        d.chunk_bytes = 4096;
    if (d.spin_us < 0)
        d.spin_us = TT_SPIN_AUTO;
    if (d.defer_us < 0)
        d.defer_us = 0;
    if (d.agree_lag < 0)
        d.agree_lag = 0;
    if (d.trace_entries < 0)
        d.trace_entries = 0;
    if (d.stream_timeout_ms == 0)
        d.stream_timeout_ms = TT_DEFAULT_STREAM_TIMEOUT_MS;
    *dst = d;
    return TUTTI_OK;
}

int tt_spin_auto_us(int local_ranks, int cpus)
{
    return local_ranks <= cpus ? TT_SPIN_AUTO_FREE_US : TT_SPIN_AUTO_SHARED_US;
}

int tt_comm_quick_ms(const tutti_comm_t *comm)
{
    int t = comm->opts.timeout_ms / 4;
    return t < 100 ? 100 : t > 1000 ? 1000 : t;
}
