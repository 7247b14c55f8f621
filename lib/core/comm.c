/* The communicator: options, creation through a store, the collective entry points
 * with their argument checks, and error recording. */
#include <errno.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/auth.h"
#include "core/comm.h"
#include "base/base.h"
#include "core/job.h"
#include "reduce/reduce.h"
#include "store/store_impl.h"
#include "plugin/tpmux.h"
#include "plugin/transport.h"

#define TT_DEFAULT_TIMEOUT_MS 30000
#define TT_DEFAULT_SPIN_US 50
#define TT_DEFAULT_CHUNK (1u << 20)

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
    opts->socket_ifname = tt_env("SOCKET_IFNAME");
    opts->socket_family = tt_env_int("SOCKET_FAMILY", 0);
    opts->socket_buffer_bytes = tt_env_int("SOCKET_BUFFER", 0);
    opts->spin_us = tt_env_int("SPIN_US", TT_DEFAULT_SPIN_US);
    opts->chunk_bytes = TT_DEFAULT_CHUNK;
    const char *chunk = tt_env("CHUNK_BYTES");
    if (chunk && tt_parse_size(chunk, &opts->chunk_bytes) < 0) {
        TT_WARN("TUTTI_CHUNK_BYTES=%s is not a size; using %u", chunk, TT_DEFAULT_CHUNK);
        opts->chunk_bytes = TT_DEFAULT_CHUNK;
    }
    opts->prefix = tt_env("PREFIX");
    opts->stall_check_ms = tt_env_int("STALL_CHECK_MS", 1000);
    opts->host_id = tt_env("HOST_ID");
    opts->cost_model = tt_env("COST_MODEL");
    opts->transport_options = tt_env("TRANSPORT_OPTIONS");
    opts->job_id = tt_env("JOB_ID");
    opts->auth_token = tt_env("AUTH_TOKEN");
    opts->auth_token_file = tt_env("AUTH_TOKEN_FILE");
    opts->checksum = tt_env("CHECKSUM");
    opts->job_settle_ms = tt_env_int("JOB_SETTLE_MS", 250);
    return TUTTI_OK;
}

int tt_comm_set_error(tutti_comm_t *comm, int status, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&comm->err_lock);
    int n = snprintf(comm->last_error, sizeof(comm->last_error), "rank %d: ", comm->rank);
    va_start(ap, fmt);
    vsnprintf(comm->last_error + n, sizeof(comm->last_error) - (size_t)n, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&comm->err_lock);
    TT_INFO("%s", comm->last_error);
    return status;
}

const char *tutti_comm_last_error(const tutti_comm_t *comm)
{
    return comm ? comm->last_error : "no communicator";
}

int tutti_comm_rank(const tutti_comm_t *comm) { return comm ? comm->rank : -1; }
int tutti_comm_size(const tutti_comm_t *comm) { return comm ? comm->nranks : -1; }

const char *tutti_comm_transport(const tutti_comm_t *comm)
{
    return comm && comm->tp_name[0] ? comm->tp_name : "none";
}

const char *tutti_comm_cost_model(const tutti_comm_t *comm)
{
    return comm ? comm->cost_desc : "no communicator";
}

const char *tutti_comm_algo_for(const tutti_comm_t *comm, const char *coll, size_t bytes)
{
    if (!comm || !coll)
        return NULL;
    tt_coll_t c = tt_coll_parse(coll);
    if (c == TT_COLL_NONE)
        return NULL;
    const tt_algo_t *a = tt_algo_select(comm->algo_ovr, &comm->cost, c, bytes, comm->nranks,
                                        comm->opts.chunk_bytes);
    return a ? a->name : NULL;
}

int tt_comm_quick_ms(const tutti_comm_t *comm)
{
    int t = comm->opts.timeout_ms / 4;
    return t < 100 ? 100 : t > 1000 ? 1000 : t;
}

size_t tt_comm_pack_below(const tutti_comm_t *comm, int bcast)
{
    const tt_coll_t coll = bcast ? TT_COLL_BROADCAST : TT_COLL_ALLREDUCE;
    const tt_cost_t *c = &comm->cost;
    const tt_algo_t *a = tt_algo_select(comm->algo_ovr, c, coll, 0, comm->nranks,
                                        comm->opts.chunk_bytes);
    if (!a || comm->nranks < 2)
        return 0;
    /* the broadcast's confirm/release round (exec.c) is in the estimate */
    double lat = tt_cost_estimate(c, coll, a->name, 0, comm->nranks, comm->opts.chunk_bytes);
    double copy_us = (bcast ? 1 : 2) * c->gamma_ns * 1e-3; /* per byte: in, and out */
    double below = lat / copy_us;
    return below > (double)((size_t)1 << 40) ? (size_t)1 << 40 : (size_t)below;
}

void *tt_comm_stage_get(tutti_comm_t *comm, size_t bytes, size_t *cap_p)
{
    void *buf = NULL;
    *cap_p = bytes ? bytes : 1;
    pthread_mutex_lock(&comm->stage_lock);
    for (int i = 0; i < 2 && !buf; i++) {
        if (comm->stage[i] && comm->stage_len[i] >= bytes) {
            buf = comm->stage[i];
            *cap_p = comm->stage_len[i];
            comm->stage[i] = NULL;
        }
    }
    pthread_mutex_unlock(&comm->stage_lock);
    return buf ? buf : malloc(*cap_p);
}

void tt_comm_stage_put(tutti_comm_t *comm, void *buf, size_t cap)
{
    if (!buf)
        return;
    pthread_mutex_lock(&comm->stage_lock);
    /* keep the two largest */
    int i = !comm->stage[0]                           ? 0
            : !comm->stage[1]                         ? 1
            : comm->stage_len[0] < comm->stage_len[1] ? 0
                                                      : 1;
    if (!comm->stage[i] || comm->stage_len[i] < cap) {
        void *old = comm->stage[i];
        comm->stage[i] = buf;
        comm->stage_len[i] = cap;
        buf = old;
    }
    pthread_mutex_unlock(&comm->stage_lock);
    free(buf);
}

/* ---- fingerprints and their descriptions ---- */

uint64_t tt_fingerprint(tt_coll_t coll, tutti_dtype_t dtype, tutti_redop_t redop, int root)
{
    return ((uint64_t)coll << 56) | ((uint64_t)(dtype & 0xff) << 48) |
           ((uint64_t)(redop & 0xff) << 40) | (uint64_t)(uint32_t)root;
}

static const char *algo_name_by_id(uint32_t id)
{
    size_t n;
    const tt_algo_t *const *all = tt_algo_all(&n);
    for (size_t i = 0; i < n; i++)
        if (all[i]->id == id)
            return all[i]->name;
    return "?";
}

/* What a rank's call was, from an envelope: op, count, dtype, redop and root where they
 * apply, the algorithm, the message. Counts are what the user passed (allgather's and
 * reduce_scatter's per rank, not the envelope's total); the v-forms' envelopes carry
 * none, so only this rank's own count can be told (`mine`: op is the sender's). */
void tt_describe_env(const uint64_t env[4], size_t len, const tt_op_t *op, int mine,
                     char *buf, size_t buflen)
{
    tt_coll_t coll = (tt_coll_t)(env[1] >> 56);
    tutti_dtype_t dtype = (tutti_dtype_t)((env[1] >> 48) & 0xff);
    tutti_redop_t redop = (tutti_redop_t)((env[1] >> 40) & 0xff);
    int root = (int)(uint32_t)env[1];
    int is_v = (env[1] & TT_FP_V) != 0;
    const char *cname = tt_coll_name(coll);
    const char *algo = algo_name_by_id((uint32_t)(env[3] >> 32));
    unsigned tag = (unsigned)(uint32_t)env[3];
    unsigned long long count = env[2], n = op && op->nranks > 0 ? (unsigned)op->nranks : 1;
    char msglen[48] = "";
    if (len != (size_t)-1)
        snprintf(msglen, sizeof(msglen), ", %zu bytes", len);
    if (coll == TT_COLL_P2P) {
        snprintf(buf, buflen, "point-to-point message #%llu (count=%llu, %s, tag %u%s)",
                 (unsigned long long)env[0], count, tutti_dtype_name(dtype), tag, msglen);
        return;
    }
    int has_redop = coll == TT_COLL_ALLREDUCE || coll == TT_COLL_REDUCE ||
                    coll == TT_COLL_REDUCE_SCATTER;
    int has_root = coll == TT_COLL_BROADCAST || coll == TT_COLL_REDUCE ||
                   coll == TT_COLL_GATHER || coll == TT_COLL_SCATTER;
    char args[160] = "";
    size_t k = 0;
#define ARG(...) (k += (size_t)snprintf(args + k, k < sizeof(args) ? sizeof(args) - k : 0, \
                                        __VA_ARGS__))
    /* allgather(v) and reduce_scatter(v) envelopes carry the total, the other v-forms
     * nothing (their layouts differ between ranks) */
    int total = coll == TT_COLL_ALLGATHER || coll == TT_COLL_REDUCE_SCATTER;
    if (coll != TT_COLL_BARRIER) {
        if (!is_v)
            ARG("count=%llu%s, ", total ? count / n : count, total ? " per rank" : "");
        else if (total)
            ARG("count=%llu in all, ", count);
        ARG("%s", tutti_dtype_name(dtype));
        if (has_redop)
            ARG(", %s", tutti_redop_name(redop));
        if (has_root)
            ARG(", root=%d", root);
        if (is_v && mine && op) {
            /* what only this rank knows: its own part of the layout */
            if (coll == TT_COLL_ALLTOALL)
                ARG("; this rank sends %zu in all", op->count);
            else
                ARG("; this rank's count=%zu",
                    total ? (op->recvcounts ? op->recvcounts[op->rank] : 0) : op->count);
        }
    }
#undef ARG
    snprintf(buf, buflen, "%s%s(%s) seq %llu [%s tag %u%s]", cname ? cname : "?",
             is_v ? "v" : "", args, (unsigned long long)env[0], algo, tag, msglen);
}

/* ---- the host interface the transport sees ---- */

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

/* Knobs that the public options struct carries as fields (tutti.h): a transport asks
 * for them by name like for any other knob; which transport reads them is its business. */
static const struct {
    const char *name;
    size_t off;
    int is_int;
} opts_knobs[] = {
    {"SOCKET_IFNAME", offsetof(tutti_comm_opts_t, socket_ifname), 0},
    {"SOCKET_FAMILY", offsetof(tutti_comm_opts_t, socket_family), 1},
    {"SOCKET_BUFFER", offsetof(tutti_comm_opts_t, socket_buffer_bytes), 1},
    {"CHECKSUM", offsetof(tutti_comm_opts_t, checksum), 0},
};

static const char *host_config(void *ctx, const char *name)
{
    tutti_comm_t *comm = ctx;
    static __thread char num[32];
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

/* ---- creation and destruction ---- */

static void opts_free(tutti_comm_opts_t *o)
{
    free((char *)o->transport);
    free((char *)o->plugin_path);
    free((char *)o->algo);
    free((char *)o->socket_ifname);
    free((char *)o->prefix);
    free((char *)o->host_id);
    free((char *)o->cost_model);
    free((char *)o->transport_options);
    free((char *)o->job_id);
    free((char *)o->auth_token);
    free((char *)o->auth_token_file);
    free((char *)o->checksum);
}

static int opts_copy(tutti_comm_opts_t *dst, const tutti_comm_opts_t *src)
{
    tutti_comm_opts_t d;
    tutti_comm_opts_init(&d);
    /* Fields the caller's (possibly older, smaller) struct has win over defaults. */
    size_t n = src->size && src->size < sizeof(d) ? src->size : sizeof(d);
    memcpy(&d, src, n);
    d.size = sizeof(d);
    /* A NULL string means "not set here": the environment (then the default) fills it,
     * so options made before the environment was set still honour it. */
    d.transport = tt_strdup(d.transport ? d.transport : tt_env("TRANSPORT") ? tt_env("TRANSPORT") : "auto");
    d.plugin_path = tt_strdup(d.plugin_path ? d.plugin_path : tt_env("PLUGIN_PATH"));
    d.algo = tt_strdup(d.algo ? d.algo : tt_env("ALGO"));
    d.socket_ifname = tt_strdup(d.socket_ifname ? d.socket_ifname : tt_env("SOCKET_IFNAME"));
    d.prefix = tt_strdup(d.prefix ? d.prefix : tt_env("PREFIX"));
    d.host_id = tt_strdup(d.host_id ? d.host_id : tt_env("HOST_ID"));
    d.cost_model = tt_strdup(d.cost_model ? d.cost_model : tt_env("COST_MODEL"));
    d.transport_options = tt_strdup(d.transport_options ? d.transport_options
                                                        : tt_env("TRANSPORT_OPTIONS"));
    d.job_id = tt_strdup(d.job_id ? d.job_id : tt_env("JOB_ID"));
    d.auth_token = tt_strdup(d.auth_token ? d.auth_token : tt_env("AUTH_TOKEN"));
    d.auth_token_file = tt_strdup(d.auth_token_file ? d.auth_token_file
                                                    : tt_env("AUTH_TOKEN_FILE"));
    d.checksum = tt_strdup(d.checksum ? d.checksum : tt_env("CHECKSUM"));
    if (!d.transport) {
        opts_free(&d);
        return TUTTI_ERR_NOMEM;
    }
    *dst = d;
    return TUTTI_OK;
}

static void comm_free(tutti_comm_t *comm)
{
    if (comm->tp && comm->tp_ops)
        comm->tp_ops->destroy(comm->tp);
    if (comm->tp_handle)
        tt_transport_unload(comm->tp_handle);
    tt_algo_override_free(comm->algo_ovr);
    if (comm->qstore)
        tutti_store_close(comm->qstore);
    if (comm->job_store)
        tutti_store_close(comm->job_store);
    if (comm->store)
        tutti_store_close(comm->store);
    if (comm->owned_store)
        tutti_store_close(comm->owned_store);
    free(comm->scratch[0]);
    free(comm->scratch[1]);
    free(comm->stage[0]);
    free(comm->stage[1]);
    pthread_mutex_destroy(&comm->stage_lock);
    free(comm->p2p_send_seq);
    free(comm->p2p_recv_seq);
    if (comm->secret)
        memset(comm->secret, 0, comm->secret_len);
    free(comm->secret);
    opts_free(&comm->opts);
    pthread_mutex_destroy(&comm->err_lock);
    pthread_mutex_destroy(&comm->q_lock);
    pthread_cond_destroy(&comm->q_cv);
    pthread_cond_destroy(&comm->done_cv);
    free(comm);
}

/* Every rank must pick the same algorithms, so every rank takes rank 0's cost
 * parameters, and its choice to probe (a collective): ranks can see different transport
 * names (a rank alone on its host has no local part: "tcp+ibverbs" on some, "ibverbs" on
 * others) or different TUTTI_COST_MODEL values. Exact: hex floats through the store. */
static int cost_agree(tutti_comm_t *comm, int *probe_p, char *err, size_t errlen)
{
    tt_cost_t *c = &comm->cost;
    char buf[256];
    if (comm->rank == 0) {
        int n = snprintf(buf, sizeof(buf), "%a %a %a %d %s", c->alpha_us, c->beta_ns,
                         c->gamma_ns, *probe_p, c->source);
        int st = tutti_store_set(comm->store, "cost_model", buf, (size_t)n + 1);
        if (st < 0)
            snprintf(err, errlen, "publishing the cost model: %s", tutti_strerror(st));
        return st;
    }
    void *v = NULL;
    size_t len;
    int st = tutti_store_get(comm->store, "cost_model", &v, &len, comm->opts.timeout_ms);
    if (st < 0) {
        snprintf(err, errlen, "rank %d: rank 0's cost model: %s", comm->rank,
                 tutti_strerror(st));
        return st;
    }
    tt_cost_t r0 = *c;
    char *s = v, *end;
    r0.alpha_us = strtod(s, &end);
    r0.beta_ns = strtod(end, &end);
    r0.gamma_ns = strtod(end, &end);
    long probe = strtol(end, &end, 10);
    int ok = end != s && *end == ' ' && r0.alpha_us > 0 && r0.beta_ns > 0 &&
             r0.gamma_ns > 0 && (probe == 0 || probe == 1);
    if (ok) {
        snprintf(r0.source, sizeof(r0.source), "%s", end + 1);
        if (probe != *probe_p)
            TT_INFO("cost model: %s, as rank 0 does", probe ? "probing" : "not probing");
        *probe_p = (int)probe;
    }
    free(v);
    if (!ok) {
        snprintf(err, errlen, "rank %d: rank 0's cost model is garbled", comm->rank);
        return TUTTI_ERR_PROTOCOL;
    }
    if (r0.alpha_us != c->alpha_us || r0.beta_ns != c->beta_ns || r0.gamma_ns != c->gamma_ns)
        TT_INFO("cost model: rank 0's (%s) instead of this rank's (%s)", r0.source, c->source);
    *c = r0;
    return TUTTI_OK;
}

int tutti_comm_init(tutti_comm_t **comm_p, tutti_store_t *store, int rank, int size,
                    const tutti_comm_opts_t *opts)
{
    char err[512] = "";
    int st;
    if (!comm_p || !store) {
        TT_WARN("tutti_comm_init: %s is NULL", comm_p ? "store" : "comm_p");
        return TUTTI_ERR_INVALID_ARG;
    }
    if (size < 1 || rank < 0 || rank >= size) {
        TT_WARN("tutti_comm_init: rank %d is not in [0, %d)", rank, size);
        return TUTTI_ERR_INVALID_ARG;
    }
    tutti_comm_t *comm = calloc(1, sizeof(*comm));
    if (!comm)
        return TUTTI_ERR_NOMEM;
    comm->rank = rank;
    comm->nranks = size;
    pthread_mutex_init(&comm->err_lock, NULL);
    pthread_mutex_init(&comm->q_lock, NULL);
    pthread_mutex_init(&comm->stage_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&comm->q_cv, &ca);
    pthread_cond_init(&comm->done_cv, &ca);
    pthread_condattr_destroy(&ca);
    tt_log_set_rank(rank);
    comm->p2p_send_seq = calloc((size_t)size, sizeof(uint64_t));
    comm->p2p_recv_seq = calloc((size_t)size, sizeof(uint64_t));
    if (!comm->p2p_send_seq || !comm->p2p_recv_seq) {
        free(comm->p2p_send_seq);
        free(comm->p2p_recv_seq);
        free(comm);
        return TUTTI_ERR_NOMEM;
    }

    tutti_comm_opts_t defaults;
    tutti_comm_opts_init(&defaults);
    TT_CHECK_GOTO(opts_copy(&comm->opts, opts ? opts : &defaults), st, err_free);
    if (comm->opts.timeout_ms <= 0)
        comm->opts.timeout_ms = TT_DEFAULT_TIMEOUT_MS;
    if (comm->opts.chunk_bytes < 4096)
        comm->opts.chunk_bytes = 4096;
    if (comm->opts.spin_us < 0)
        comm->opts.spin_us = 0;
    comm->quick_ns = (uint64_t)tt_comm_quick_ms(comm) * 1000000ull;

    st = tt_algo_override_parse(comm->opts.algo, &comm->algo_ovr, err, sizeof(err));
    if (st < 0) {
        tt_comm_set_error(comm, st, "%s", err);
        TT_WARN("%s", comm->last_error);
        goto err_free;
    }

    /* Each job gets its own key space on a store, each communicator its own within it,
     * and each run of it (instance) its own within that (job.c). */
    const char *job_src;
    tt_job_id(comm->opts.job_id, comm->job_id, sizeof(comm->job_id), &job_src);
    comm->job_src = job_src;
    char base[512];
    if (comm->opts.prefix)
        snprintf(base, sizeof(base), "%s/%s%s%s", comm->opts.prefix,
                 comm->job_id[0] ? "job/" : "", comm->job_id, comm->job_id[0] ? "/" : "");
    else
        snprintf(base, sizeof(base), "tutti/%s%s%scomm%u/", comm->job_id[0] ? "job/" : "",
                 comm->job_id, comm->job_id[0] ? "/" : "", tt_store_next_comm_id(store));
    snprintf(comm->store_url, sizeof(comm->store_url), "%s", tutti_store_url(store));
    const char *ck = comm->opts.checksum;
    if (ck && *ck && strcmp(ck, "none") && strcmp(ck, "crc32c")) {
        /* checked here too: a job on shm alone never asks its transport */
        st = tt_comm_set_error(comm, TUTTI_ERR_CONFIG,
                               "init: TUTTI_CHECKSUM=%s: expected none or crc32c", ck);
        TT_WARN("%s", comm->last_error);
        goto err_free;
    }
    st = tt_auth_load_secret(comm->opts.auth_token, comm->opts.auth_token_file,
                             &comm->secret, &comm->secret_len, err, sizeof(err));
    if (st < 0) {
        tt_comm_set_error(comm, st, "init: %s", err);
        TT_WARN("%s", comm->last_error);
        goto err_free;
    }
    st = tt_job_join(comm, store, base, err, sizeof(err));
    if (st < 0) {
        tt_comm_set_error(comm, st, "init: %s", err);
        TT_WARN("%s", comm->last_error);
        goto err_free;
    }
    TT_INFO("job id %s (from %s)", comm->job_id[0] ? comm->job_id : "none", job_src);

    comm->host = (tutti_tp_host_v2_t){
        .size = sizeof(tutti_tp_host_v2_t),
        .abi_version = TUTTI_TRANSPORT_ABI_V1,
        .rank = rank,
        .nranks = size,
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
    st = tt_transports_create(comm, err, sizeof(err));
    if (st < 0) {
        tt_comm_set_error(comm, st, "init: %s", err);
        TT_WARN("%s", comm->last_error);
        goto err_free;
    }
    const char *cm = comm->opts.cost_model;
    int probe = cm && !strcmp(cm, "probe");
    const tutti_tp_props_v2_t *props[4];
    int nprops = tt_transports_props(comm, props, 4);
    tt_cost_from_props(&comm->cost, comm->tp_name, props, nprops);
    if (cm && *cm && !probe && strcmp(cm, "table")) {
        st = tt_cost_parse(cm, &comm->cost, err, sizeof(err));
        if (st < 0) {
            tt_comm_set_error(comm, st, "init: %s", err);
            TT_WARN("%s", comm->last_error);
            goto err_free;
        }
    }

    if (size > 1 && (st = cost_agree(comm, &probe, err, sizeof(err))) < 0) {
        tt_comm_set_error(comm, st, "init: %s", err);
        TT_WARN("%s", comm->last_error);
        goto err_free;
    }

    if (pthread_create(&comm->worker, NULL, tt_exec_worker_main, comm) != 0) {
        st = tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "init: cannot start progress thread");
        goto err_free;
    }
    comm->worker_started = 1;
    if (probe && size > 1) {
        st = tt_cost_probe(comm, &comm->cost);
        if (st < 0) {
            snprintf(err, sizeof(err), "%s", comm->last_error);
            tt_comm_set_error(comm, st, "init: the cost probe failed: %s", err);
            TT_WARN("%s", comm->last_error);
            tt_job_init_failed(comm, st);
            tutti_comm_destroy(comm); /* the progress thread runs: the full teardown */
            return st;
        }
    }
    st = tt_job_check_contested(comm, err, sizeof(err));
    if (st < 0) {
        tt_comm_set_error(comm, st, "init: %s", err);
        TT_WARN("%s", comm->last_error);
        tutti_comm_destroy(comm);
        return st;
    }
    tt_cost_describe(&comm->cost, comm->cost_desc, sizeof(comm->cost_desc));
    TT_INFO("cost model %s", comm->cost_desc);
    TT_INFO("communicator ready: rank %d of %d, transport %s, store %s, job instance %s under %s",
            rank, size, comm->tp_name, comm->store_url, comm->instance, comm->job_base);
    *comm_p = comm;
    return TUTTI_OK;

err_free:
    tt_job_init_failed(comm, st);
    comm_free(comm);
    return st;
}

/* communicators of tutti_comm_init_env destroyed so far (the store servers' label) */
static atomic_uint env_comms_done;

/* torchrun / TUTTI_* conventions -> store URL, rank and size */
int tutti_comm_init_env(tutti_comm_t **comm_p, const tutti_comm_opts_t *opts)
{
    const char *rank_s = tt_env("RANK");
    const char *size_s = tt_env("WORLD_SIZE");
    const char *url = tt_env("STORE");
    char urlbuf[512];
    if (!rank_s)
        rank_s = getenv("RANK");
    if (!size_s)
        size_s = getenv("WORLD_SIZE");
    if (!url && getenv("MASTER_ADDR") && getenv("MASTER_PORT")) {
        const char *addr = getenv("MASTER_ADDR");
        snprintf(urlbuf, sizeof(urlbuf), strchr(addr, ':') ? "tcp://[%s]:%s" : "tcp://%s:%s",
                 addr, getenv("MASTER_PORT"));
        url = urlbuf;
    }
    if (!comm_p || !rank_s || !size_s || !url) {
        TT_WARN("tutti_comm_init_env: need TUTTI_RANK (or RANK), TUTTI_WORLD_SIZE (or "
                "WORLD_SIZE) and TUTTI_STORE (or MASTER_ADDR and MASTER_PORT); missing %s",
                !rank_s ? "the rank" : !size_s ? "the world size" : "the store");
        return TUTTI_ERR_CONFIG;
    }
    char *end;
    long rank = strtol(rank_s, &end, 10);
    if (*end || rank < 0)
        return TUTTI_ERR_CONFIG;
    long size = strtol(size_s, &end, 10);
    if (*end || size < 1 || rank >= size) {
        TT_WARN("tutti_comm_init_env: rank %ld, world size %s: bad values", rank, size_s);
        return TUTTI_ERR_CONFIG;
    }
    tutti_store_opts_t so;
    tutti_store_opts_init(&so);
    if (opts && opts->timeout_ms > 0 && !tt_env("STORE_TIMEOUT_MS"))
        so.timeout_ms = opts->timeout_ms;
    so.is_server = (rank == 0 && !strncmp(url, "tcp://", 6) && tt_env_int("STORE_SERVER", 1));
    /* The job secret guards the store too. */
    if (opts && opts->size >= offsetof(tutti_comm_opts_t, auth_token_file) + sizeof(char *)) {
        if (opts->auth_token)
            so.auth_token = opts->auth_token;
        if (opts->auth_token_file)
            so.auth_token_file = opts->auth_token_file;
    }
    /* A rank that destroyed a communicator and creates the next one can reach rank 0's
     * previous store server before it stopped: label each server with the job and the
     * count of such communicators this process destroyed (the same on every rank), so
     * clients keep away from the previous one. */
    char label[160], jid[80];
    tt_job_id(opts && opts->size >= offsetof(tutti_comm_opts_t, job_id) + sizeof(char *)
                  ? opts->job_id
                  : NULL,
              jid, sizeof(jid), NULL);
    snprintf(label, sizeof(label), "%s#%u", jid[0] ? jid : "-", atomic_load(&env_comms_done));
    so.instance = label;
    tutti_store_t *store;
    int st = tutti_store_open(&store, url, &so);
    if (st < 0) {
        TT_WARN("tutti_comm_init_env: rank %ld cannot open store %s: %s: %s", rank, url,
                tutti_strerror(st), tutti_store_last_error(NULL));
        return st;
    }
    st = tutti_comm_init(comm_p, store, (int)rank, (int)size, opts);
    if (st < 0) {
        tutti_store_close(store);
        return st;
    }
    (*comm_p)->owned_store = store;
    return TUTTI_OK;
}

int tutti_comm_abort(tutti_comm_t *comm)
{
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (atomic_exchange(&comm->aborted, 1))
        return TUTTI_OK;
    tt_comm_set_error(comm, TUTTI_ERR_ABORTED, "communicator aborted by the user");
    if (comm->tp)
        comm->tp_ops->abort(comm->tp);
    pthread_mutex_lock(&comm->q_lock);
    pthread_cond_broadcast(&comm->q_cv);
    pthread_cond_broadcast(&comm->done_cv);
    pthread_mutex_unlock(&comm->q_lock);
    return TUTTI_OK;
}

int tutti_comm_destroy(tutti_comm_t *comm)
{
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    pthread_mutex_lock(&comm->q_lock);
    comm->stopping = 1;
    pthread_cond_broadcast(&comm->q_cv);
    pthread_mutex_unlock(&comm->q_lock);
    if (comm->worker_started)
        pthread_join(comm->worker, NULL);
    /* the transport first: peers that still read from us see a clean close */
    if (comm->tp && comm->tp_ops)
        comm->tp_ops->destroy(comm->tp);
    comm->tp = NULL;
    tt_job_leave(comm);
    if (comm->owned_store)
        atomic_fetch_add(&env_comms_done, 1);
    comm_free(comm);
    return TUTTI_OK;
}

/* ---- collectives: argument checks, then the executor ---- */

static int check_common(tutti_comm_t *comm, const char *name, const void *sendbuf,
                        void *recvbuf, size_t count, tutti_dtype_t dtype, int need_send)
{
    if ((unsigned)dtype >= TUTTI_DTYPE_COUNT)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: invalid dtype %d", name,
                                 (int)dtype);
    size_t es = tutti_dtype_size(dtype);
    if (count > SIZE_MAX / es / 2)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s: count %zu is too large",
                                 name, count);
    if (count == 0)
        return TUTTI_OK;
    if (!recvbuf)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "%s: recvbuf is NULL with count %zu", name, count);
    if (need_send && !sendbuf)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "%s: sendbuf is NULL (use TUTTI_IN_PLACE for in place)",
                                 name);
    if (sendbuf && sendbuf != TUTTI_IN_PLACE && sendbuf != recvbuf) {
        const char *s = sendbuf, *r = recvbuf;
        size_t bytes = count * es;
        if (s < r + bytes && r < s + bytes)
            return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                     "%s: sendbuf and recvbuf overlap without being equal",
                                     name);
    }
    return TUTTI_OK;
}

static void op_fill(tutti_comm_t *comm, tt_op_t *op, tt_coll_t coll)
{
    memset(op, 0, sizeof(*op));
    op->comm = comm;
    op->rank = comm->rank;
    op->nranks = comm->nranks;
    op->coll = coll;
    op->chunk_bytes = comm->opts.chunk_bytes;
}

static int allreduce_issue(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                           size_t count, tutti_dtype_t dtype, tutti_redop_t op,
                           tutti_work_t **work_p)
{
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    TT_CHECK(check_common(comm, "allreduce", sendbuf, recvbuf, count, dtype, 1));
    if ((unsigned)op >= TUTTI_REDOP_COUNT)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "allreduce: invalid op %d",
                                 (int)op);
    tt_op_t o;
    op_fill(comm, &o, TT_COLL_ALLREDUCE);
    o.recvbuf = recvbuf;
    o.sendbuf = (sendbuf == TUTTI_IN_PLACE || !sendbuf) ? recvbuf : sendbuf;
    o.count = count;
    o.dtype = dtype;
    o.elem_size = tutti_dtype_size(dtype);
    o.redop = op == TUTTI_AVG ? TUTTI_SUM : op;
    o.fingerprint = tt_fingerprint(TT_COLL_ALLREDUCE, dtype, op, 0);
    o.env_count = count;
    return tt_exec_issue(comm, &o, op, NULL, work_p);
}

int tutti_allreduce(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                    tutti_dtype_t dtype, tutti_redop_t op)
{
    return allreduce_issue(comm, sendbuf, recvbuf, count, dtype, op, NULL);
}

int tutti_allreduce_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                          size_t count, tutti_dtype_t dtype, tutti_redop_t op,
                          tutti_work_t **work_p)
{
    if (!work_p)
        return comm ? tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                        "allreduce_async: work_p is NULL")
                    : TUTTI_ERR_INVALID_ARG;
    return allreduce_issue(comm, sendbuf, recvbuf, count, dtype, op, work_p);
}

static int broadcast_issue(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                           size_t count, tutti_dtype_t dtype, int root, tutti_work_t **work_p)
{
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (root < 0 || root >= comm->nranks)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "broadcast: root %d is not in [0, %d)", root, comm->nranks);
    TT_CHECK(check_common(comm, "broadcast", comm->rank == root ? sendbuf : NULL, recvbuf,
                          count, dtype, comm->rank == root));
    tt_op_t o;
    op_fill(comm, &o, TT_COLL_BROADCAST);
    o.recvbuf = recvbuf;
    o.sendbuf = (comm->rank != root || sendbuf == TUTTI_IN_PLACE || !sendbuf) ? recvbuf
                                                                              : sendbuf;
    o.count = count;
    o.dtype = dtype;
    o.elem_size = tutti_dtype_size(dtype);
    o.root = root;
    o.fingerprint = tt_fingerprint(TT_COLL_BROADCAST, dtype, 0, root);
    o.env_count = count;
    return tt_exec_issue(comm, &o, TUTTI_SUM, NULL, work_p);
}

int tutti_broadcast(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                    tutti_dtype_t dtype, int root)
{
    return broadcast_issue(comm, sendbuf, recvbuf, count, dtype, root, NULL);
}

int tutti_broadcast_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                          size_t count, tutti_dtype_t dtype, int root, tutti_work_t **work_p)
{
    if (!work_p)
        return comm ? tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                        "broadcast_async: work_p is NULL")
                    : TUTTI_ERR_INVALID_ARG;
    return broadcast_issue(comm, sendbuf, recvbuf, count, dtype, root, work_p);
}

static int barrier_issue(tutti_comm_t *comm, tutti_work_t **work_p)
{
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    tt_op_t o;
    op_fill(comm, &o, TT_COLL_BARRIER);
    o.dtype = TUTTI_UINT8;
    o.elem_size = 1;
    o.fingerprint = tt_fingerprint(TT_COLL_BARRIER, TUTTI_UINT8, 0, 0);
    return tt_exec_issue(comm, &o, TUTTI_SUM, NULL, work_p);
}

int tutti_barrier(tutti_comm_t *comm) { return barrier_issue(comm, NULL); }

int tutti_barrier_async(tutti_comm_t *comm, tutti_work_t **work_p)
{
    if (!work_p)
        return comm ? tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                        "barrier_async: work_p is NULL")
                    : TUTTI_ERR_INVALID_ARG;
    return barrier_issue(comm, work_p);
}

/* ---- point to point ---- */

static int p2p_issue(tutti_comm_t *comm, int kind, const void *buf, size_t count,
                     tutti_dtype_t dtype, int peer, uint32_t tag, tutti_work_t **work_p,
                     int async)
{
    const char *name = kind == TUTTI_TP_SEND ? "send" : "recv";
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (async && !work_p)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "%s_async: work_p is NULL", name);
    if (peer < 0 || peer >= comm->nranks || peer == comm->rank)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "%s: peer %d is not another rank of [0, %d)", name, peer,
                                 comm->nranks);
    TT_CHECK(check_common(comm, name, buf, (void *)buf, count, dtype, 0));
    return tt_exec_issue_p2p(comm, kind, (void *)buf, count, dtype, peer, tag,
                             async ? work_p : NULL);
}

int tutti_send(tutti_comm_t *comm, const void *buf, size_t count, tutti_dtype_t dtype, int peer,
               uint32_t tag)
{
    return p2p_issue(comm, TUTTI_TP_SEND, buf, count, dtype, peer, tag, NULL, 0);
}

int tutti_send_async(tutti_comm_t *comm, const void *buf, size_t count, tutti_dtype_t dtype,
                     int peer, uint32_t tag, tutti_work_t **work_p)
{
    return p2p_issue(comm, TUTTI_TP_SEND, buf, count, dtype, peer, tag, work_p, 1);
}

int tutti_recv(tutti_comm_t *comm, void *buf, size_t count, tutti_dtype_t dtype, int peer,
               uint32_t tag)
{
    return p2p_issue(comm, TUTTI_TP_RECV, buf, count, dtype, peer, tag, NULL, 0);
}

int tutti_recv_async(tutti_comm_t *comm, void *buf, size_t count, tutti_dtype_t dtype, int peer,
                     uint32_t tag, tutti_work_t **work_p)
{
    return p2p_issue(comm, TUTTI_TP_RECV, buf, count, dtype, peer, tag, work_p, 1);
}

/* ---- failure bookkeeping ---- */

void tt_comm_record_failure(tutti_comm_t *comm, tt_op_t *op, int status, const char *msg)
{
    const tt_algo_t *a = NULL;
    size_t n;
    const tt_algo_t *const *all = tt_algo_all(&n);
    for (size_t i = 0; i < n; i++)
        if (all[i]->id == op->algo_id)
            a = all[i];
    /* A rank that was stopped (SIGSTOP, a debugger) is likely the one its peers timed
     * out on: say so, whatever failure it then found. A stop that ended a while before
     * this op (the ops in between completed: peers had sent everything before giving
     * up) counts while its peers could still be timing out on it; time spent outside
     * the library only where a peer's timeout is the failure. */
    char stopped[224] = "", me[3][48];
    uint64_t now = tt_now_ns(), since = now - comm->stop_end_ns;
    int recent = comm->stop_end_ns && since < 2 * (uint64_t)comm->opts.timeout_ms * 1000000ull;
    /* a peer's timeout on this very rank (p2p.c's words) */
    snprintf(me[0], sizeof(me[0]), "receiving from rank %d (", comm->rank);
    snprintf(me[1], sizeof(me[1]), "sending to rank %d (", comm->rank);
    snprintf(me[2], sizeof(me[2]), "rank %d shows no sign", comm->rank);
    int blamed = strstr(msg, "no progress within") &&
                 (strstr(msg, me[0]) || strstr(msg, me[1]) || strstr(msg, me[2]));
    if (op->stopped_ns)
        snprintf(stopped, sizeof(stopped),
                 "this rank was not running for at least %llu ms during this op (stopped or "
                 "starved: its peers may have timed out waiting for it), then: ",
                 (unsigned long long)(op->stopped_ns / 1000000ull));
    else if (recent && (!comm->stop_between_ops || blamed))
        snprintf(stopped, sizeof(stopped),
                 "this rank was not running%s for at least %llu ms until %llu ms before this "
                 "failure (its peers may have timed out waiting for it), then: ",
                 comm->stop_between_ops ? ", or busy outside the library," : "",
                 (unsigned long long)(comm->stop_ns / 1000000ull),
                 (unsigned long long)(since / 1000000ull));
    tt_comm_set_error(comm, status, "%s%s seq %llu (%s, %zu x %s): %s: %s%s",
                      op->coll == TT_COLL_P2P ? "point-to-point"
                      : tt_coll_name(op->coll) ? tt_coll_name(op->coll) : "?",
                      op->fingerprint & TT_FP_V ? "v" : "",
                      (unsigned long long)op->seq, a ? a->name : "-", op->count,
                      tutti_dtype_name(op->dtype), tutti_strerror(status), stopped, msg);
    TT_WARN("%s", comm->last_error);
    int expected = 0;
    if (atomic_compare_exchange_strong(&comm->failed, &expected, status)) {
        comm->failed_seq = op->seq;
        /* Tell the peers, so that ranks waiting on us fail now instead of at the
         * timeout. Each rank reports only its first failure, so a report travels on
         * (a rank that fails because of it reports in turn) and then stops. */
        if (comm->tp && status != TUTTI_ERR_ABORTED)
            comm->tp_ops->notify_error(comm->tp, status, comm->last_error);
        /* Also in the store: a rank that exits right after this may cut a message in
         * half, and its peers then see only its socket close; they look here to name
         * the first cause instead of this rank (best effort, and bounded: the store's
         * host may be the rank that died). */
        char key[64], val[TT_ERRMSG_LEN + 16];
        snprintf(key, sizeof(key), "failed/%d", comm->rank);
        int n = snprintf(val, sizeof(val), "%d %s", status, comm->last_error); /* p2p.c */
        size_t len = (size_t)TT_MIN(n, (int)sizeof(val) - 1) + 1;
        int64_t nfailed;
        if (tt_op_store_set(op, key, val, len) == 0)
            tt_op_store_add(op, "failed_count", 1, &nfailed);
    }
}

void tt_comm_fail_op(tutti_comm_t *comm, tt_op_t *op, int status, const char *msg)
{
    tt_comm_record_failure(comm, op, status, msg);
    comm->tp_ops->cancel_all(comm->tp, status);
}
