/* The communicator's lifecycle: creation through a store (or the environment) or by
 * splitting another, the cost model all ranks agree on, abort and destruction, the
 * accessors (failures are recorded in fault.c). */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "base/auth.h"
#include "base/hostlist.h"
#include "coll/topo.h"
#include "core/comm.h"
#include "core/agree.h"
#include "base/base.h"
#include "core/job.h"
#include "core/pmix.h"
#include "core/setup.h"
#include "core/trace.h"
#include "device/device.h"
#include "reduce/reduce.h"
#include "store/store_gc.h"
#include "store/store_impl.h"
#include "plugin/tpmux.h"
#include "plugin/transport.h"

/* Why this thread's last tutti_comm_init or tutti_comm_init_env failed ("" when it did
 * not): a failed set-up leaves no communicator to ask (ncclGetLastError(NULL) does the
 * same). The thread's error without a communicator (fault.c's, which tutti_mrecv sets too). */
#define init_error (tt_thread_error())

static int init_error_set(int st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int init_error_set(int st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(init_error, TT_ERRMSG_LEN, fmt, ap);
    va_end(ap);
    return st;
}

const char *tutti_comm_last_error(const tutti_comm_t *comm)
{
    return comm ? tt_comm_error_copy(comm) : init_error;
}

int tutti_comm_rank(const tutti_comm_t *comm)
{
    return comm ? comm->rank : -1;
}
int tutti_comm_size(const tutti_comm_t *comm)
{
    return comm ? comm->nranks : -1;
}

const char *tutti_comm_device(const tutti_comm_t *comm)
{
    return comm && comm->dev ? comm->dev->name : NULL;
}

/* comm's options as they are now, for a communicator made from it: a copy under q_lock,
 * which tutti_comm_set_timeout writes the timeout under (a child inherits it). */
static tutti_comm_opts_t opts_now(tutti_comm_t *comm)
{
    pthread_mutex_lock(&comm->q_lock);
    tutti_comm_opts_t o = comm->opts;
    pthread_mutex_unlock(&comm->q_lock);
    return o;
}

int tutti_comm_timeout(const tutti_comm_t *comm)
{
    return comm ? tt_comm_timeout_ms(comm) : TUTTI_ERR_INVALID_ARG;
}

int tutti_comm_set_timeout(tutti_comm_t *comm, int timeout_ms)
{
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (tt_comm_foreign(comm))
        return tt_comm_refuse_foreign(comm, "set_timeout", 0);
    if (timeout_ms <= 0)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "set_timeout: %d ms: a communicator's waits are always bounded "
                                 "(a timeout > 0 ms; its timeout stays %d ms)",
                                 timeout_ms, tt_comm_timeout_ms(comm));
    pthread_mutex_lock(&comm->q_lock);
    /* the calls issued before keep theirs (op->timeout_ms); a lower one lets a later
     * point-to-point deadline come before an earlier one (exec.c's p2p_unordered) */
    __atomic_store_n(&comm->opts.timeout_ms, timeout_ms, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&comm->q_lock);
    TT_INFO("timeout %d ms for the calls issued from here on", timeout_ms);
    return TUTTI_OK;
}

const char *tutti_comm_transport(const tutti_comm_t *comm)
{
    return comm && comm->tp_name[0] ? comm->tp_name : "none";
}

const char *tutti_comm_cost_model(const tutti_comm_t *comm)
{
    return comm ? comm->cost_desc : "no communicator";
}

const char *tutti_algo_name(const char *coll, int i)
{
    tt_coll_t c = tt_coll_parse(coll);
    return c == TT_COLL_NONE ? NULL : tt_algo_nth(c, i);
}

int tutti_algo_spec_sets(const char *spec, const char *coll, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    tt_coll_t c = tt_coll_parse(coll);
    if (!spec || c == TT_COLL_NONE) {
        if (err && errlen)
            snprintf(err, errlen, "no spec, or an unknown collective");
        return TUTTI_ERR_INVALID_ARG;
    }
    tt_algo_override_t *ovr;
    int st = tt_algo_override_parse(spec, &ovr, err, errlen);
    if (st < 0)
        return st;
    st = tt_algo_override_sets(ovr, c);
    tt_algo_override_free(ovr);
    return st;
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

/* ---- creation and destruction ---- */

static void comm_free(tutti_comm_t *comm)
{
    if (comm->tp && comm->tp_ops)
        comm->tp_ops->destroy(comm->tp);
    if (comm->tp_handle)
        tt_transport_unload(comm->tp_handle);
    tt_algo_override_free(comm->algo_ovr);
    free(comm->tune_spec);
    free(comm->host_of);
    if (comm->qstore)
        tutti_store_close(comm->qstore);
    if (comm->job_store)
        tutti_store_close(comm->job_store);
    if (comm->store)
        tutti_store_close(comm->store);
    if (comm->owned_store)
        tutti_store_close(comm->owned_store);
    if (comm->split_store)
        tutti_store_close(comm->split_store);
    if (comm->uid_store)
        tutti_store_close(comm->uid_store);
    if (comm->uid_server)
        tutti_store_close(comm->uid_server);
    tt_agree_free(comm); /* after the transport: nothing of it is posted now */
    tt_trace_free(comm);
    free(comm->scratch[0]);
    free(comm->scratch[1]);
    free(comm->stage[0].p);
    free(comm->stage[1].p);
    tt_dev_free_blocks(comm);
    pthread_mutex_destroy(&comm->stage_lock);
    pthread_mutex_destroy(&comm->trace_lock);
    free(comm->p2p_seq);
    tt_topo_free(comm->topo);
    tt_exec_self_free(comm);
    if (comm->secret)
        memset(comm->secret, 0, comm->secret_len);
    free(comm->secret);
    tt_comm_opts_free(&comm->opts);
    /* work handles may outlive it (a wait after the destroy reads only the work) */
    atomic_store(&comm->gone, 1);
    tt_exec_comm_unref(comm);
}

/* Every rank must pick the same algorithms, so every rank takes rank 0's cost
 * parameters, and its choice to probe (a collective): ranks can see different transport
 * names (a rank alone on its host has no local part: "tcp+ibverbs" on some, "ibverbs" on
 * others) or different TUTTI_COST_MODEL values. Exact: hex floats through the store.
 * Rank 0's TUTTI_AGREE_LAG comes with them: whether rooted calls wait for their
 * agreement messages is part of their protocol (algorithms/handshake.c). */
static int cost_agree(tutti_comm_t *comm, int *probe_p, char *err, size_t errlen)
{
    tt_cost_t *c = &comm->cost;
    if (comm->rank == 0) {
        c->agree_lag = comm->opts.agree_lag;
        /* and the line of its tuning file, if any, after a newline */
        char *pub = NULL;
        int n = asprintf(&pub, "%a %a %a %a %d %d %d %d %d %s\n%s", c->alpha_us, c->beta_ns,
                         c->gamma_ns, c->local_beta_ns, *probe_p, comm->opts.agree_lag,
                         c->host_ranks, c->host_cpus, c->local_only, c->source,
                         comm->tune_spec ? comm->tune_spec : "");
        if (n < 0) {
            snprintf(err, errlen, "out of memory (publishing the cost model)");
            return TUTTI_ERR_NOMEM;
        }
        int st = tutti_store_set(comm->store, "cost_model", pub, (size_t)n + 1);
        free(pub);
        if (st < 0)
            snprintf(err, errlen, "publishing the cost model: %s", tutti_strerror(st));
        return st;
    }
    void *v = NULL;
    size_t len;
    int st = tt_init_store_get(comm, comm->store, "cost_model", &v, &len, tt_comm_timeout_ms(comm));
    if (st < 0) {
        snprintf(err, errlen, "rank 0's cost model: %s", tutti_strerror(st));
        return st;
    }
    if (len >= 2 && ((char *)v)[0] == '!' && memchr(v, '\0', len)) {
        snprintf(err, errlen, "rank 0 failed its cost model: %s", (char *)v + 1);
        free(v);
        return TUTTI_ERR_CONFIG;
    }
    tt_cost_t r0 = *c;
    char *s = v, *end;
    r0.alpha_us = strtod(s, &end);
    r0.beta_ns = strtod(end, &end);
    r0.gamma_ns = strtod(end, &end);
    r0.local_beta_ns = strtod(end, &end); /* 0 where rank 0 has no host-mates */
    long probe = strtol(end, &end, 10);
    long lag = strtol(end, &end, 10);
    long hranks = strtol(end, &end, 10), hcpus = strtol(end, &end, 10); /* rank 0's host */
    long local_only = strtol(end, &end, 10);
    int ok = end != s && *end == ' ' && r0.alpha_us > 0 && r0.beta_ns > 0 && r0.gamma_ns > 0 &&
             r0.local_beta_ns >= 0 && (probe == 0 || probe == 1) && lag >= 0 && lag <= INT32_MAX &&
             hranks >= 0 && hranks <= INT32_MAX && hcpus >= 0 && hcpus <= INT32_MAX &&
             (local_only == 0 || local_only == 1);
    char *nl = ok ? strchr(end + 1, '\n') : NULL;
    ok = ok && nl && memchr(v, '\0', len);
    if (ok) {
        *nl = '\0';
        snprintf(r0.source, sizeof(r0.source), "%s", end + 1);
        free(comm->tune_spec);
        comm->tune_spec = nl[1] ? tt_strdup(nl + 1) : NULL;
        if (probe != *probe_p)
            TT_INFO("cost model: %s, as rank 0 does", probe ? "probing" : "not probing");
        *probe_p = (int)probe;
        if (lag != comm->opts.agree_lag)
            TT_INFO("agreement lag %ld, as rank 0's (TUTTI_AGREE_LAG)", lag);
        comm->opts.agree_lag = r0.agree_lag = (int)lag;
        r0.host_ranks = (int)hranks;
        r0.host_cpus = (int)hcpus;
        r0.local_only = (int)local_only;
    }
    free(v);
    if (!ok) {
        snprintf(err, errlen, "rank 0's cost model is garbled");
        return TUTTI_ERR_PROTOCOL;
    }
    if (r0.alpha_us != c->alpha_us || r0.beta_ns != c->beta_ns || r0.gamma_ns != c->gamma_ns ||
        r0.local_beta_ns != c->local_beta_ns)
        TT_INFO("cost model: rank 0's (%s) instead of this rank's (%s)", r0.source, c->source);
    *c = r0;
    return TUTTI_OK;
}

/* Log and record an init failure: "init: <what>" (returns st). */
static int init_fail(tutti_comm_t *comm, int st, const char *what)
{
    if (comm->setup_peer_status &&
        (st == comm->setup_peer_status || st == TUTTI_ERR_TIMEOUT || st == TUTTI_ERR_PEER)) {
        /* a peer's failed set-up ended this rank's wait (a cause of this rank's own,
         * say a config mismatch it found while giving up, is the better one) */
        st = comm->setup_peer_status;
        tt_comm_set_error(comm, st, "init: %s (this rank stopped waiting in: %s)",
                          comm->setup_peer_why, what);
        TT_WARN("%s", comm->last_error);
        return st;
    }
    /* a step that failed without a reason (an allocation, say) is named by its status */
    tt_comm_set_error(comm, st, "init: %s", what && *what ? what : tutti_strerror(st));
    TT_WARN("%s", comm->last_error);
    return st;
}

/* The communicator's memory and locks, before anything can fail halfway. */
static tutti_comm_t *comm_alloc(int rank, int size)
{
    tutti_comm_t *comm = calloc(1, sizeof(*comm));
    if (!comm)
        return NULL;
    comm->owner_pid = tt_comm_owner_pid();
    comm->rank = rank;
    comm->nranks = size;
    comm->bind_cpu = -1;
    atomic_init(&comm->refs, 1);
    pthread_mutex_init(&comm->err_lock, NULL);
    pthread_mutex_init(&comm->q_lock, NULL);
    pthread_mutex_init(&comm->stage_lock, NULL);
    pthread_mutex_init(&comm->trace_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&comm->q_cv, &ca);
    pthread_cond_init(&comm->done_cv, &ca);
    pthread_condattr_destroy(&ca);
    return comm;
}

/* A configuration error of this rank's own, held until it joined (comm_join): the first. */
static void config_hold(tutti_comm_t *comm, int st, const char *why)
{
    if (comm->config_status < 0)
        return;
    comm->config_status = st;
    snprintf(comm->config_error, sizeof(comm->config_error), "%s", why);
}

/* TUTTI_ALGO (comm->algo_ovr) and its fingerprint for the job record, which every rank
 * compares with rank 0's (job.c); TUTTI_COST_MODEL checked: rank 0's wins, but a value
 * that does not parse is a mistake whichever rank makes it. Their errors are held. */
static void algo_and_model(tutti_comm_t *comm)
{
    char err[512] = "", *canon = NULL;
    int st = tt_algo_override_parse(comm->opts.algo, &comm->algo_ovr, err, sizeof(err));
    if (st == 0)
        st = tt_algo_override_canon(comm->algo_ovr, &canon);
    if (st < 0) {
        config_hold(comm, st, err[0] ? err : "out of memory for TUTTI_ALGO");
        snprintf(comm->algo_fp, sizeof(comm->algo_fp), "!");
    } else if (!canon) {
        snprintf(comm->algo_fp, sizeof(comm->algo_fp), "-");
    } else {
        uint8_t h[TT_SHA256_LEN];
        tt_sha256_t sc;
        tt_sha256_init(&sc);
        tt_sha256_update(&sc, canon, strlen(canon));
        tt_sha256_final(&sc, h);
        for (int i = 0; i < 8; i++)
            snprintf(comm->algo_fp + 2 * i, 3, "%02x", h[i]);
        free(canon);
    }
    const char *cm = comm->opts.cost_model;
    if (cm && *cm && strcmp(cm, "probe") && strcmp(cm, "table")) {
        tt_cost_t scratch;
        memset(&scratch, 0, sizeof(scratch));
        if ((st = tt_cost_parse(cm, &scratch, err, sizeof(err))) < 0)
            config_hold(comm, st, err);
    }
}

/* Options, the algorithm override, the checksum and the job secret: what this rank
 * decides alone. */
static int comm_configure(tutti_comm_t *comm, const tutti_comm_opts_t *opts,
                          const tutti_comm_t *parent)
{
    char err[512] = "";
    TT_CHECK(tt_comm_opts_resolve(&comm->opts, opts));
    if (tt_trace_init(comm) < 0)
        return init_fail(comm, TUTTI_ERR_NOMEM, "out of memory for the flight recorder");
    comm->quick_ns = (uint64_t)tt_comm_quick_ms(comm) * 1000000ull;
    algo_and_model(comm);
    int st;
    /* each of these errors is held until this rank has joined (config_hold), as
     * algo_and_model's are, so that its peers learn it at once */
    const char *ck = comm->opts.checksum;
    if (ck && *ck && strcmp(ck, "none") && strcmp(ck, "crc32c")) {
        /* checked here too: a job on shm alone never asks its transport */
        snprintf(err, sizeof(err), "TUTTI_CHECKSUM=%s: expected none or crc32c", ck);
        config_hold(comm, TUTTI_ERR_CONFIG, err);
    }
    const char *bind = comm->opts.bind;
    if (bind && *bind && strcmp(bind, "auto") && strcmp(bind, "none")) {
        snprintf(err, sizeof(err), "TUTTI_BIND=%s: expected auto or none", bind);
        config_hold(comm, TUTTI_ERR_CONFIG, err);
    }
    if ((st = tt_dev_resolve(comm->opts.cuda, &comm->dev, err, sizeof(err))) < 0) {
        if (st == TUTTI_ERR_NOMEM)
            return init_fail(comm, st, err);
        config_hold(comm, st, err);
    }
    if (parent) { /* a split keeps its parent's secret: the file may have changed since */
        if (parent->secret && !(comm->secret = malloc(parent->secret_len)))
            return init_fail(comm, TUTTI_ERR_NOMEM, "out of memory for the job secret");
        if (parent->secret)
            memcpy(comm->secret, parent->secret, parent->secret_len);
        comm->secret_len = parent->secret_len;
        return TUTTI_OK;
    }
    st = tt_auth_load_secret(comm->opts.auth_token, comm->opts.auth_token_file, &comm->secret,
                             &comm->secret_len, err, sizeof(err));
    if (st == TUTTI_ERR_CONFIG) /* a secret it cannot read: held too */
        config_hold(comm, st, err);
    return st < 0 && st != TUTTI_ERR_CONFIG ? init_fail(comm, st, err) : TUTTI_OK;
}

/* Each job gets its own key space on a store, each communicator its own within it,
 * and each run of it (instance) its own within that (job.c). split_base: a split's key
 * space (NULL: the default or TUTTI_PREFIX). */
static int comm_join(tutti_comm_t *comm, tutti_store_t *store, const char *split_base)
{
    char err[512] = "", base[512];
    const char *job_src;
    tt_job_id(comm->opts.job_id, comm->job_id, sizeof(comm->job_id), &job_src);
    comm->job_src = job_src;
    if (split_base)
        snprintf(base, sizeof(base), "%s", split_base);
    else if (comm->opts.prefix)
        snprintf(base, sizeof(base), "%s/%s%s%s", comm->opts.prefix, comm->job_id[0] ? "job/" : "",
                 comm->job_id, comm->job_id[0] ? "/" : "");
    else
        snprintf(base, sizeof(base), "tutti/%s%s%scomm%u/", comm->job_id[0] ? "job/" : "",
                 comm->job_id, comm->job_id[0] ? "/" : "", tt_store_next_comm_id(store));
    snprintf(comm->store_url, sizeof(comm->store_url), "%s", tutti_store_url(store));
    int st = tt_job_join(comm, store, base, err, sizeof(err));
    if (st < 0 && comm->config_status < 0) /* its own mistake is the better cause */
        return init_fail(comm, comm->config_status, comm->config_error);
    if (st < 0)
        return init_fail(comm, st, err);
    TT_INFO("job id %s (from %s)", comm->job_id[0] ? comm->job_id : "none", job_src);
    /* failed only now, as a member of the instance: the others, waiting for this rank in
     * their set-up, read its reason at once (tt_job_init_failed) instead of waiting out
     * their timeout for a rank that will not come */
    if (comm->config_status < 0)
        return init_fail(comm, comm->config_status, comm->config_error);
    return TUTTI_OK;
}

/* Rank 0's cost model (its tuning file; a TUTTI_COST_MODEL that does not parse fails
 * sooner, algo_and_model) failed: the others would wait for it until the store's
 * timeout, so rank 0 publishes the failure in its place ("!" and the reason) and they
 * fail at once, naming it. */
static int cost_fail(tutti_comm_t *comm, int st, const char *why)
{
    if (comm->rank == 0 && comm->nranks > 1) {
        char pub[600];
        int n = snprintf(pub, sizeof(pub), "!%s", why);
        (void)tutti_store_set(comm->store, "cost_model", pub, (size_t)n + 1);
    }
    return init_fail(comm, st, why);
}

/* The transports, and the cost model every rank agrees on; *probe_p: measure it. */
static int comm_connect(tutti_comm_t *comm, int *probe_p)
{
    char err[512] = "";
    tt_comm_host_init(comm);
    int st = tt_transports_create(comm, err, sizeof(err));
    if (st < 0)
        return init_fail(comm, st, err);
    const char *cm = comm->opts.cost_model;
    *probe_p = cm && !strcmp(cm, "probe");
    const tutti_tp_props_v2_t *props[4];
    int nprops = tt_transports_props(comm, props, 4);
    tt_cost_from_props(&comm->cost, comm->tp_name, props, nprops);
    tt_cost_set_hosts(&comm->cost, comm->host_of, comm->nranks);
    comm->cost.host_ranks = comm->host_ranks;
    comm->cost.host_cpus = comm->host_cpus;
    if (cm && *cm && !*probe_p && strcmp(cm, "table")) {
        st = tt_cost_parse(cm, &comm->cost, err, sizeof(err));
        if (st < 0)
            return cost_fail(comm, st, err);
    }
    if (comm->rank == 0 && comm->cost.tune[0]) {
        st = tt_algo_tune_load(comm->cost.tune, comm->tp_name, comm->nranks, &comm->tune_spec, err,
                               sizeof(err));
        if (st < 0)
            return cost_fail(comm, st, err);
        if (!comm->tune_spec)
            TT_INFO("tuning file %s has no line for %s on %d ranks: the model alone decides",
                    comm->cost.tune, comm->tp_name, comm->nranks);
    }
    if (comm->nranks > 1 && (st = cost_agree(comm, probe_p, err, sizeof(err))) < 0)
        return init_fail(comm, st, err);
    /* rank 0's measured choices, under this rank's own TUTTI_ALGO */
    if (comm->tune_spec &&
        (st = tt_algo_override_merge(&comm->algo_ovr, comm->tune_spec, err, sizeof(err))) < 0)
        return init_fail(comm, st, err);
    return TUTTI_OK;
}

/* The progress thread, the cost probe and the job's last check. On failure the
 * communicator is gone (the progress thread ran: the full teardown), its last error in
 * errout. */
static int comm_start(tutti_comm_t *comm, int probe, char *errout, size_t errlen)
{
    char err[TT_ERRMSG_LEN];
    int st;
    if (probe && comm->nranks > 1) {
        st = tt_cost_probe(comm, &comm->cost);
        if (st < 0) {
            snprintf(err, sizeof(err), "%s", comm->last_error);
            tt_comm_set_error(comm, st, "init: the cost probe failed: %s", err);
            TT_WARN("%s", comm->last_error);
            tt_job_init_failed(comm, st);
            snprintf(errout, errlen, "%s", comm->last_error);
            tutti_comm_destroy(comm);
            return st;
        }
    }
    st = tt_job_check_contested(comm, err, sizeof(err));
    if (st < 0) {
        init_fail(comm, st, err);
        snprintf(errout, errlen, "%s", comm->last_error);
        tutti_comm_destroy(comm);
        return st;
    }
    tt_cost_describe(&comm->cost, comm->cost_desc, sizeof(comm->cost_desc));
    if (comm->tune_spec) {
        size_t n = strlen(comm->cost_desc);
        snprintf(comm->cost_desc + n, sizeof(comm->cost_desc) - n, "; tuned: %s", comm->tune_spec);
    }
    TT_INFO("cost model %s", comm->cost_desc);
    TT_INFO("communicator ready: rank %d of %d, transport %s, store %s, job instance %s under %s",
            comm->rank, comm->nranks, comm->tp_name, comm->store_url, comm->instance,
            comm->job_base);
    return TUTTI_OK;
}

/* A communicator of rank of size through store, its key space split_base (NULL: the
 * default); parent: the communicator a split comes from (its job secret is kept), NULL
 * for tutti_comm_init. On failure, err (errlen bytes) gets its last error. */
static int comm_create(tutti_comm_t **comm_p, tutti_store_t *store, const tutti_comm_t *parent,
                       const char *split_base, int rank, int size, const tutti_comm_opts_t *opts,
                       char *err, size_t errlen)
{
    int st, probe = 0;
    tutti_comm_t *comm = comm_alloc(rank, size);
    if (!comm) {
        snprintf(err, errlen, "out of memory for a communicator of %d ranks", size);
        return TUTTI_ERR_NOMEM;
    }
    atomic_store(&comm->in_setup, 1);
    TT_CHECK_GOTO(comm_configure(comm, opts, parent), st, err_free);
    TT_CHECK_GOTO(comm_join(comm, store, split_base), st, err_free);
    TT_CHECK_GOTO(comm_connect(comm, &probe), st, err_free);
    int pe = pthread_create(&comm->worker, NULL, tt_exec_worker_main, comm);
    if (pe != 0) {
        st = tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "init: cannot start progress thread: %s",
                               strerror(pe));
        goto err_free;
    }
    comm->worker_started = 1;
    st = comm_start(comm, probe, err, errlen);
    if (st < 0)
        return st;
    atomic_store(&comm->in_setup, 0);
    *comm_p = comm;
    return TUTTI_OK;

err_free:
    /* a split's, shrink's or grow's caller names the rank (and the new one) itself */
    snprintf(err, errlen, "%s",
             parent ? tt_after_rank_prefix(comm->last_error, comm->rank) : comm->last_error);
    tt_job_init_failed(comm, st);
    comm_free(comm);
    return st;
}

int tutti_comm_init(tutti_comm_t **comm_p, tutti_store_t *store, int rank, int size,
                    const tutti_comm_opts_t *opts)
{
    char err[TT_ERRMSG_LEN];
    if (!comm_p || !store) {
        TT_WARN("tutti_comm_init: %s is NULL", comm_p ? "store" : "comm_p");
        return init_error_set(TUTTI_ERR_INVALID_ARG, "tutti_comm_init: %s is NULL",
                              comm_p ? "store" : "comm_p");
    }
    if (size < 1 || rank < 0 || rank >= size) {
        TT_WARN("tutti_comm_init: rank %d is not in [0, %d)", rank, size);
        return init_error_set(TUTTI_ERR_INVALID_ARG, "tutti_comm_init: rank %d is not in [0, %d)",
                              rank, size);
    }
    tt_log_set_rank(rank);
    init_error[0] = '\0';
    int st = comm_create(comm_p, store, NULL, NULL, rank, size, opts, err, sizeof(err));
    if (st < 0)
        init_error_set(st, "%s", err);
    return st;
}

/* This rank's place among the ranks of its color (colors and keys: (color, key) pairs
 * of every rank): rank by (key, parent rank), and the count. */
static void split_place(const int32_t *ck, int nranks, int me, int *rank_p, int *size_p)
{
    int rank = 0, size = 0;
    for (int j = 0; j < nranks; j++) {
        if (ck[2 * j] != ck[2 * me])
            continue;
        size++;
        if (ck[2 * j + 1] < ck[2 * me + 1] || (ck[2 * j + 1] == ck[2 * me + 1] && j < me))
            rank++;
    }
    *rank_p = rank;
    *size_p = size;
}

/* The child of split number seq, color: the parent's options, or own's (as init's; the
 * job id and secret stay the parent's: the child lives in its key space and trust), no
 * settle wait (its key space, beside the parent instance's, belongs to that instance
 * alone), through the parent's store, holding a reference to it. */
static int split_create(tutti_comm_t *comm, unsigned seq, int color, int rank, int size,
                        const tutti_comm_opts_t *own, tutti_comm_t **newcomm_p)
{
    char base[TUTTI_STORE_MAX_KEY + 1], err[TT_ERRMSG_LEN] = "";
    tutti_store_t *js = comm->job_store;
    snprintf(base, sizeof(base), "%s%s-split%u-%d/", js->prefix, comm->nonce, seq, color);
    tutti_comm_opts_t o = opts_now(comm);
    if (own) {
        const tutti_comm_opts_t parent = o;
        tutti_comm_opts_init(&o);
        memcpy(&o, own, own->size && own->size < sizeof(o) ? own->size : sizeof(o));
        o.size = sizeof(o);
        o.job_id = parent.job_id;
        o.auth_token = parent.auth_token;
        o.auth_token_file = parent.auth_token_file;
    }
    o.job_settle_ms = 0;
    int st = comm_create(newcomm_p, js->base, comm, base, rank, size, &o, err, sizeof(err));
    if (st < 0)
        return tt_comm_set_error(comm, st, "split %u (color %d, new rank %d of %d): %s", seq, color,
                                 rank, size, err);
    (*newcomm_p)->split_store = tt_store_retain(js);
    TT_INFO("split %u: color %d, rank %d of %d under %s", seq, color, rank, size, base);
    return TUTTI_OK;
}

/* Sleep *backoff_ns, or less where deadline_ns comes first, then double it up to cap_ns:
 * the store polls of shrink_live, agree, grow and join. */
static void backoff_sleep(uint64_t *backoff_ns, uint64_t deadline_ns, uint64_t cap_ns)
{
    uint64_t now = tt_now_ns(), ns = now < deadline_ns ? TT_MIN(*backoff_ns, deadline_ns - now) : 0;
    struct timespec ts = { (time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull) };
    if (ns)
        nanosleep(&ts, NULL);
    *backoff_ns = TT_MIN(*backoff_ns * 2, cap_ns);
}

/* A forked child's call that would make a communicator from its parent's: refused, nothing
 * touched (1), or 0 where comm is no forked copy. */
static int refused_in_child(tutti_comm_t *comm, tutti_comm_t **newcomm_p, const char *what,
                            int *st_p)
{
    if (!comm || !tt_comm_foreign(comm))
        return 0;
    if (newcomm_p)
        *newcomm_p = NULL;
    *st_p = tt_comm_refuse_foreign(comm, what, 0);
    return 1;
}

int tutti_comm_dup(tutti_comm_t *comm, tutti_comm_t **newcomm_p)
{
    int refused;
    if (refused_in_child(comm, newcomm_p, "dup", &refused))
        return refused;
    if (!comm || !newcomm_p)
        return TUTTI_ERR_INVALID_ARG;
    int st = tutti_comm_split(comm, 0, comm->rank, newcomm_p);
    /* the topology goes with it (MPI_Comm_dup's) */
    if (st == TUTTI_OK && comm->topo && !((*newcomm_p)->topo = tt_topo_copy(comm->topo))) {
        tutti_comm_destroy(*newcomm_p);
        *newcomm_p = NULL;
        return tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "dup: out of memory for the topology");
    }
    return st;
}

static int split_with(tutti_comm_t *comm, int color, int key, const tutti_comm_opts_t *own,
                      tutti_comm_t **newcomm_p)
{
    int refused;
    if (refused_in_child(comm, newcomm_p, "split", &refused))
        return refused;
    if (!comm || !newcomm_p)
        return TUTTI_ERR_INVALID_ARG;
    *newcomm_p = NULL;
    if (color < 0)
        color = TUTTI_SPLIT_NOCOLOR;
    unsigned seq = comm->split_seq++;
    int32_t mine[2] = { color, key };
    int32_t *all = malloc(2 * (size_t)comm->nranks * sizeof(*all));
    if (!all)
        return tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "split %u: out of memory", seq);
    int st = tutti_allgather(comm, mine, all, 2, TUTTI_INT32);
    if (st < 0) {
        char cause[TT_ERRMSG_LEN];
        snprintf(cause, sizeof(cause), "%s", comm->last_error);
        tt_comm_set_error(comm, st,
                          "split %u: exchanging colors and keys with the other ranks (every "
                          "rank must call tutti_comm_split): %s",
                          seq, cause);
    } else if (color != TUTTI_SPLIT_NOCOLOR) {
        int rank, size;
        split_place(all, comm->nranks, comm->rank, &rank, &size);
        st = split_create(comm, seq, color, rank, size, own, newcomm_p);
    }
    free(all);
    return st;
}

int tutti_comm_split(tutti_comm_t *comm, int color, int key, tutti_comm_t **newcomm_p)
{
    return split_with(comm, color, key, NULL, newcomm_p);
}

int tutti_comm_split_opts(tutti_comm_t *comm, int color, int key, const tutti_comm_opts_t *opts,
                          tutti_comm_t **newcomm_p)
{
    return split_with(comm, color, key, opts, newcomm_p);
}

/* A rank's part of split_type's exchange: its type and its host's identity. */
typedef struct {
    int32_t type;
    char host[sizeof(((tutti_comm_t *)0)->host_id)]; /* NUL-padded */
} split_type_rec_t;

int tutti_comm_split_type(tutti_comm_t *comm, int type, int key, tutti_comm_t **newcomm_p)
{
    int refused;
    if (refused_in_child(comm, newcomm_p, "split_type", &refused))
        return refused;
    if (!comm || !newcomm_p)
        return TUTTI_ERR_INVALID_ARG;
    *newcomm_p = NULL;
    if (type < 0)
        type = TUTTI_SPLIT_NOCOLOR;
    int n = comm->nranks;
    split_type_rec_t mine = { .type = type, .host = { 0 } },
                     *all = malloc((size_t)n * sizeof(*all));
    if (!all)
        return tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "split_type: out of memory");
    memcpy(mine.host, comm->host_id, strnlen(comm->host_id, sizeof(mine.host) - 1));
    int st = tutti_allgather(comm, &mine, all, sizeof(mine), TUTTI_UINT8);
    if (st < 0) {
        char cause[TT_ERRMSG_LEN];
        snprintf(cause, sizeof(cause), "%s", comm->last_error);
        tt_comm_set_error(comm, st,
                          "split_type: exchanging types and hosts with the other ranks (every "
                          "rank must call tutti_comm_split_type): %s",
                          cause);
        goto out;
    }
    /* every rank sees every type: one not known fails the call everywhere, naming it */
    for (int r = 0; r < n; r++)
        if (all[r].type != TUTTI_SPLIT_NOCOLOR && all[r].type != TUTTI_SPLIT_TYPE_HOST) {
            st = tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                   "split_type: rank %d passed type %d: not TUTTI_SPLIT_TYPE_HOST "
                                   "(%d) nor TUTTI_SPLIT_NOCOLOR",
                                   r, (int)all[r].type, TUTTI_SPLIT_TYPE_HOST);
            goto out;
        }
    /* the color: the first rank on this host (its index: distinct hosts, distinct colors) */
    int color = TUTTI_SPLIT_NOCOLOR;
    for (int r = 0; r < n && type != TUTTI_SPLIT_NOCOLOR && color < 0; r++)
        if (memcmp(all[r].host, mine.host, sizeof(mine.host)) == 0)
            color = r;
    st = tutti_comm_split(comm, color, key, newcomm_p);
out:
    free(all);
    return st;
}

/* The excluded set as text, ranks ascending ("1,3"), into buf; 0, or -1 when a rank is
 * out of range or named twice (*bad_p that rank). */
static int shrink_set_text(const int *exclude, int n, int nranks, char *buf, size_t buflen,
                           int *bad_p)
{
    uint8_t *in = calloc((size_t)nranks, 1);
    size_t o = 0;
    int st = 0;
    buf[0] = '\0';
    if (!in)
        return -1;
    for (int i = 0; i < n && st == 0; i++) {
        if (exclude[i] < 0 || exclude[i] >= nranks || in[exclude[i]]) {
            *bad_p = exclude[i];
            st = -1;
        } else {
            in[exclude[i]] = 1;
        }
    }
    for (int r = 0; r < nranks && st == 0; r++) {
        if (!in[r])
            continue;
        int w = snprintf(buf + o, buflen - o, "%s%d", o ? "," : "", r);
        if (w < 0 || (size_t)w >= buflen - o) {
            snprintf(buf + (buflen > 4 ? buflen - 4 : 0), 4, "...");
            break;
        }
        o += (size_t)w;
    }
    free(in);
    return st;
}

int tutti_comm_shrink(tutti_comm_t *comm, const int *exclude, int nexclude,
                      tutti_comm_t **newcomm_p)
{
    int refused;
    if (refused_in_child(comm, newcomm_p, "shrink", &refused))
        return refused;
    if (!comm || !newcomm_p || nexclude < 0 || (nexclude > 0 && !exclude))
        return comm ? tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                        "shrink: %s is NULL or nexclude (%d) negative",
                                        !newcomm_p ? "newcomm_p" : "exclude", nexclude)
                    : TUTTI_ERR_INVALID_ARG;
    *newcomm_p = NULL;
    int n = comm->nranks, bad = -1;
    size_t setlen = 12 * (size_t)n + 16;
    char *set = malloc(setlen), *other = NULL;
    if (!set)
        return tt_comm_set_error(comm, TUTTI_ERR_NOMEM, "shrink: out of memory");
    int st = TUTTI_OK;
    if (shrink_set_text(exclude, nexclude, n, set, setlen, &bad) < 0) {
        st = tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                               "shrink: excluded rank %d is out of range (0..%d) or named twice",
                               bad, n - 1);
        goto out;
    }
    int rank = 0, size = 0, me_out = 0;
    for (int r = 0; r < n; r++) {
        int out = 0;
        for (int i = 0; i < nexclude; i++)
            out |= exclude[i] == r;
        me_out |= out && r == comm->rank;
        if (!out && r < comm->rank)
            rank++;
        size += !out;
    }
    if (me_out || size == 0) {
        st = tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "shrink: %s (excluded: %s)",
                               me_out ? "this rank excludes itself: only the ranks left call it"
                                      : "every rank is excluded",
                               set);
        goto out;
    }
    unsigned seq = comm->shrink_seq++;
    char base[TUTTI_STORE_MAX_KEY + 1], key[TUTTI_STORE_MAX_KEY + 1], err[TT_ERRMSG_LEN] = "";
    tutti_store_t *js = comm->job_store;
    snprintf(base, sizeof(base), "%s%s-shrink%u/", js->prefix, comm->nonce, seq);
    /* every rank left says which set it excludes, and checks the others' before anything
     * waits on a rank that another rank left out */
    /* under comm's instance: what is left there goes with comm's keys */
    char mine[TUTTI_STORE_MAX_KEY + 1];
    snprintf(mine, sizeof(mine), "%s%s/shrink%u/excluded/%d", js->prefix, comm->nonce, seq,
             comm->rank);
    st = tutti_store_set(js->base, mine, set, strlen(set));
    for (int r = 0; r < n && st == TUTTI_OK; r++) {
        int out = 0;
        for (int i = 0; i < nexclude; i++)
            out |= exclude[i] == r;
        if (out || r == comm->rank)
            continue;
        snprintf(key, sizeof(key), "%s%s/shrink%u/excluded/%d", js->prefix, comm->nonce, seq, r);
        size_t olen;
        st = tutti_store_get(js->base, key, (void **)&other, &olen, tt_comm_timeout_ms(comm));
        if (st < 0) {
            snprintf(err, sizeof(err), "waiting for rank %d's excluded set: %s", r,
                     tutti_store_last_error(js->base));
            break;
        }
        if (strcmp(other, set)) {
            snprintf(err, sizeof(err),
                     "rank %d excludes {%.200s}, this rank excludes {%.200s}: every rank left "
                     "must pass the same set",
                     r, other, set);
            st = TUTTI_ERR_MISMATCH;
        }
        free(other);
        other = NULL;
    }
    if (st == TUTTI_OK) {
        tutti_comm_opts_t o = opts_now(comm);
        o.job_settle_ms = 0;
        st = comm_create(newcomm_p, js->base, comm, base, rank, size, &o, err, sizeof(err));
    } else if (!err[0]) {
        snprintf(err, sizeof(err), "%s", tutti_store_last_error(js->base));
    }
    if (st < 0) {
        tt_comm_set_error(comm, st, "shrink %u (excluded {%.200s}, new rank %d of %d): %s", seq,
                          set, rank, size, err);
        goto out;
    }
    (*newcomm_p)->split_store = tt_store_retain(js);
    /* every rank left has read it: it joined the new communicator after reading */
    tutti_store_delete(js->base, mine, NULL);
    TT_INFO("shrink %u: excluded {%s}, rank %d of %d under %s", seq, set, rank, size, base);
out:
    free(set);
    return st;
}

/* The ranks that call tutti_comm_shrink_live or tutti_comm_agree agree, through the store
 * alone, on who is here and on the AND of their flags: each sets dir/here/<rank> to its
 * flag (8 hex digits), waits until every rank's key is there, wait_ms passed, or another
 * rank decided, and offers "x:<AND of the flags it saw, hex>:<ranks absent>"; the first
 * offer stored (compare-and-set on dir/set) is everyone's. *flag_p gets the agreed AND,
 * absent[0..*nabsent_p) the ranks left out (room for nranks). TUTTI_ERR_TIMEOUT, with
 * nothing set, for a rank the agreed set leaves out (it came after the others decided);
 * err says why on any failure. */
static int live_agree(tutti_comm_t *comm, const char *dir, int wait_ms, uint32_t *flag_p,
                      int *absent, int *nabsent_p, char *err, size_t errlen)
{
    int n = comm->nranks;
    tutti_store_t *b = comm->job_store->base;
    char key[TUTTI_STORE_MAX_KEY + 1], setkey[TUTTI_STORE_MAX_KEY + 1], mine[16];
    size_t setlen = 12 * (size_t)n + 16;
    char *offer = malloc(setlen + 16), **keys = calloc((size_t)n, sizeof(char *)), *agreed = NULL;
    const char **got = calloc((size_t)n, sizeof(char *));
    void **vals = calloc((size_t)n, sizeof(void *));
    size_t *lens = calloc((size_t)n, sizeof(size_t)), alen = 0;
    int *missing = malloc((size_t)n * sizeof(int)), nseen = 0, nout = 0, bad;
    int st = !offer || !keys || !got || !vals || !lens || !missing ? TUTTI_ERR_NOMEM : TUTTI_OK;
    for (int r = 0; r < n && st == TUTTI_OK; r++) {
        snprintf(key, sizeof(key), "%shere/%d", dir, r);
        if (!(keys[r] = tt_strdup(key)))
            st = TUTTI_ERR_NOMEM;
    }
    if (st < 0) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    snprintf(mine, sizeof(mine), "%08" PRIx32, *flag_p);
    snprintf(setkey, sizeof(setkey), "%sset", dir);
    if ((st = tutti_store_set(b, keys[comm->rank], mine, 8)) < 0)
        goto store_err;
    int all = 0;
    uint64_t deadline = tt_deadline_ns(wait_ms), backoff = 1000000ull;
    for (;;) {
        int decided = 0;
        const char *k1[1] = { setkey };
        if ((st = tutti_store_check(b, (const char *const *)keys, (size_t)n, &all)) < 0 ||
            (st = tutti_store_check(b, k1, 1, &decided)) < 0)
            goto store_err;
        if (all || decided || tt_now_ns() >= deadline)
            break;
        backoff_sleep(&backoff, deadline, 50000000ull);
    }
    /* this rank's offer: the flags of the ranks whose keys it sees, and the others */
    for (int r = 0; r < n; r++) {
        int here = all;
        const char *k1[1] = { keys[r] };
        if (!all && (st = tutti_store_check(b, k1, 1, &here)) < 0)
            goto store_err;
        if (here)
            got[nseen++] = keys[r];
        else
            missing[nout++] = r;
    }
    if ((st = tutti_store_multi_get(b, got, (size_t)nseen, vals, lens, tt_comm_timeout_ms(comm))) <
        0)
        goto store_err;
    uint32_t and = 0xffffffffu;
    for (int i = 0; i < nseen; i++) {
        char *end;
        unsigned long v = strtoul(vals[i], &end, 16);
        if (lens[i] != 8 || end != (char *)vals[i] + 8) {
            st = TUTTI_ERR_PROTOCOL;
            snprintf(err, errlen, "%s holds \"%.20s\", not a flag", got[i], (char *)vals[i]);
            goto out;
        }
        and &= (uint32_t)v;
    }
    int w = snprintf(offer, setlen + 16, "x:%08" PRIx32 ":", and);
    shrink_set_text(missing, nout, n, offer + w, setlen, &bad);
    void *cur = NULL;
    if ((st = tutti_store_compare_set(b, setkey, "", 0, offer, strlen(offer), &cur, &alen)) < 0)
        goto store_err;
    agreed = malloc(alen + 1); /* as text */
    if (agreed) {
        memcpy(agreed, cur, alen);
        agreed[alen] = '\0';
    }
    free(cur);
    char *p = agreed ? agreed + 2 : NULL, *end = NULL;
    unsigned long flag = p ? strtoul(p, &end, 16) : 0;
    if (!agreed || alen < 11 || memcmp(agreed, "x:", 2) || end != p + 8 || *end != ':') {
        st = agreed ? TUTTI_ERR_PROTOCOL : TUTTI_ERR_NOMEM;
        snprintf(err, errlen, "the agreement at %s is not one: \"%.60s\"", setkey,
                 agreed ? agreed : "");
        goto out;
    }
    /* the agreed set, as ranks: this rank must be in none of it */
    int nabsent = 0, me_out = 0;
    for (p = end + 1; *p;) {
        long r = strtol(p, &end, 10);
        if (end == p || r < 0 || r >= n || nabsent >= n) {
            st = TUTTI_ERR_PROTOCOL;
            snprintf(err, errlen, "the agreed set \"%.100s\" is not one", agreed);
            goto out;
        }
        me_out |= r == comm->rank;
        absent[nabsent++] = (int)r;
        p = *end == ',' ? end + 1 : end;
    }
    if (me_out) {
        st = TUTTI_ERR_TIMEOUT;
        snprintf(err, errlen,
                 "the other ranks agreed without this rank (it came after their %d ms wait; "
                 "absent: {%s})",
                 wait_ms, agreed + 11);
        goto out;
    }
    TT_INFO("agreement %s: flag %08lx, absent {%s} (this rank offered %s)", dir, flag, agreed + 11,
            offer);
    *flag_p = (uint32_t)flag;
    *nabsent_p = nabsent;
    goto out;
store_err:
    snprintf(err, errlen, "%s", tutti_store_last_error(b));
out:
    for (int r = 0; keys && r < n; r++)
        free(keys[r]);
    for (int i = 0; vals && i < nseen; i++)
        free(vals[i]);
    free(keys), free(got), free(vals), free(lens), free(missing), free(offer), free(agreed);
    return st;
}

/* MPIX_Comm_shrink: agree on who is here (live_agree), then a shrink without the rest. */
int tutti_comm_shrink_live(tutti_comm_t *comm, int wait_ms, tutti_comm_t **newcomm_p)
{
    int refused;
    if (refused_in_child(comm, newcomm_p, "shrink_live", &refused))
        return refused;
    if (!comm || !newcomm_p)
        return comm ? tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                        "shrink_live: newcomm_p is NULL")
                    : TUTTI_ERR_INVALID_ARG;
    *newcomm_p = NULL;
    if (wait_ms < 0)
        wait_ms = TT_MAX(tt_comm_timeout_ms(comm) / 4, 1);
    int n = comm->nranks, nabsent = 0;
    int *absent = malloc((size_t)n * sizeof(int));
    uint32_t flag = 0xffffffffu;
    char dir[TUTTI_STORE_MAX_KEY + 1], err[TT_ERRMSG_LEN] = "out of memory";
    /* the shrink this leads to has this seq: unique per call, the same on every rank */
    snprintf(dir, sizeof(dir), "%s%s/live%u/", comm->job_store->prefix, comm->nonce,
             comm->shrink_seq);
    int st = absent ? live_agree(comm, dir, wait_ms, &flag, absent, &nabsent, err, sizeof(err))
                    : TUTTI_ERR_NOMEM;
    if (st < 0)
        tt_comm_set_error(comm, st, "shrink_live (waiting %d ms for the others): %s", wait_ms, err);
    else
        st = tutti_comm_shrink(comm, absent, nabsent, newcomm_p); /* its own error text */
    free(absent);
    return st;
}

/* MPIX_Comm_agree: live_agree under <instance>/agree<seq>/. Once every rank was here, each
 * has returned from the call before (it came to this one after), so the keys of that one
 * go: a communicator that agrees every step keeps two calls' keys, not all of them. */
int tutti_comm_agree(tutti_comm_t *comm, int wait_ms, uint32_t *flag_p, int *absent, int *nabsent_p)
{
    if (comm && tt_comm_foreign(comm)) /* a forked child: the parent's (nothing touched) */
        return tt_comm_refuse_foreign(comm, "agree", 0);
    if (!comm || !flag_p)
        return comm ? tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "agree: flag_p is NULL")
                    : TUTTI_ERR_INVALID_ARG;
    if (wait_ms < 0)
        wait_ms = TT_MAX(tt_comm_timeout_ms(comm) / 4, 1);
    int n = comm->nranks, nabsent = 0;
    int *out = malloc((size_t)n * sizeof(int));
    uint32_t flag = *flag_p;
    unsigned seq = comm->agree_seq++;
    const char *prefix = comm->job_store->prefix;
    char dir[TUTTI_STORE_MAX_KEY + 1], err[TT_ERRMSG_LEN] = "out of memory";
    snprintf(dir, sizeof(dir), "%s%s/agree%u/", prefix, comm->nonce, seq);
    int st = out ? live_agree(comm, dir, wait_ms, &flag, out, &nabsent, err, sizeof(err))
                 : TUTTI_ERR_NOMEM;
    if (st < 0) {
        tt_comm_set_error(comm, st, "agree %u (waiting %d ms for the others): %s", seq, wait_ms,
                          err);
        free(out);
        return st;
    }
    if (nabsent == 0 && seq > 0) {
        tutti_store_t *b = comm->job_store->base;
        snprintf(dir, sizeof(dir), "%s%s/agree%u/here/%d", prefix, comm->nonce, seq - 1,
                 comm->rank);
        tutti_store_delete(b, dir, NULL); /* a key left is only left: no error */
        if (comm->rank == 0) {
            snprintf(dir, sizeof(dir), "%s%s/agree%u/set", prefix, comm->nonce, seq - 1);
            tutti_store_delete(b, dir, NULL);
        }
    }
    *flag_p = flag;
    if (absent)
        memcpy(absent, out, (size_t)nabsent * sizeof(int));
    if (nabsent_p)
        *nabsent_p = nabsent;
    if (nabsent) {
        char set[256];
        int bad;
        shrink_set_text(out, nabsent, n, set, sizeof(set), &bad);
        st = tt_comm_set_error(comm, TUTTI_ERR_PEER,
                               "agree %u: ranks {%s} were absent (%d ms wait); the flag, "
                               "%08" PRIx32 ", is the others' AND",
                               seq, set, wait_ms, flag);
    }
    free(out);
    return st;
}

/* ---- growing: tutti_comm_grow (the ranks there) and tutti_comm_join (the new ones) ---- */

/* Where a growing communicator's rank 0 puts its ticket: the job's key space before any
 * communicator's ("tutti/job/<id>/grow"), which a new process finds from the job id
 * alone. The ticket: "<ranks there> <ranks after> <the new communicator's key space>
 * <the key whose count hands out the new ranks>". */
static void grow_ticket_key(const char *prefix, const char *job_id, char *key, size_t len)
{
    snprintf(key, len, "%s/%s%s%sgrow", prefix ? prefix : "tutti", job_id[0] ? "job/" : "", job_id,
             job_id[0] ? "/" : "");
}

/* Rank 0's ticket goes up only where no other grow of the job holds the key (one key a
 * job: its joiners need not know which communicator grows): communicators of one job
 * that grow at once take turns, each waiting (within its timeout) for the other's places
 * to fill. A ticket whose places are all taken is done and is replaced, as is one that
 * is not a ticket or that did not fill within the timeout (a grow whose ranks all died:
 * warned about). Before, the second grow's ticket overwrote the first's, and both
 * joiners took the second's places (found by review). */
static int grow_publish(tutti_comm_t *comm, tutti_store_t *b, const char *tkey, const char *ticket,
                        size_t tlen, char *err, size_t errlen)
{
    uint64_t deadline = tt_deadline_ns(tt_comm_timeout_ms(comm)), backoff = 1000000ull;
    void *cur = NULL, *expect = NULL;
    size_t clen = 0, elen = 0;
    char fmt[64], obase[TUTTI_STORE_MAX_KEY + 1], ocount[TUTTI_STORE_MAX_KEY + 1];
    snprintf(fmt, sizeof(fmt), "%%d %%d %%%ds %%%ds", TUTTI_STORE_MAX_KEY, TUTTI_STORE_MAX_KEY);
    int waited = 0;
    for (;;) {
        int st = tutti_store_compare_set(b, tkey, expect ? expect : "", elen, ticket, tlen, &cur,
                                         &clen);
        free(expect);
        expect = NULL, elen = 0;
        if (st < 0) {
            snprintf(err, errlen, "publishing the ticket at %s: %s", tkey,
                     tutti_store_last_error(b));
            return st;
        }
        if (clen == tlen && !memcmp(cur, ticket, tlen)) {
            free(cur);
            return TUTTI_OK;
        }
        /* another grow's: are its places taken? */
        int old = 0, size = 0, full = 1;
        if (sscanf(cur, fmt, &old, &size, obase, ocount) == 4 && old >= 1 && size > old) {
            const char *k1[1] = { ocount };
            int there = 0;
            int64_t joined = 0;
            void *v = NULL;
            size_t vlen = 0;
            if (tutti_store_check(b, k1, 1, &there) == 0 && there &&
                tutti_store_get(b, ocount, &v, &vlen, tt_comm_timeout_ms(comm)) == 0)
                tt_store_parse_i64(v, vlen, &joined);
            free(v);
            full = joined >= size - old;
        }
        uint64_t now = tt_now_ns();
        if (full || now >= deadline) {
            if (!full)
                TT_WARN("grow: the ticket at %s (\"%.120s\") did not fill within %d ms: taken "
                        "over",
                        tkey, (char *)cur, tt_comm_timeout_ms(comm));
            expect = cur, elen = clen, cur = NULL; /* replace it */
            continue;
        }
        if (!waited++)
            TT_INFO("grow: another communicator of this job is growing (ticket at %s: \"%.120s\"): "
                    "waiting for its places to fill",
                    tkey, (char *)cur);
        free(cur);
        cur = NULL;
        backoff_sleep(&backoff, deadline, 100000000ull);
    }
}

int tutti_comm_grow(tutti_comm_t *comm, int size, tutti_comm_t **newcomm_p)
{
    int refused;
    if (refused_in_child(comm, newcomm_p, "grow", &refused))
        return refused;
    if (!comm || !newcomm_p)
        return comm ? tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG, "grow: newcomm_p is NULL")
                    : TUTTI_ERR_INVALID_ARG;
    *newcomm_p = NULL;
    if (size <= comm->nranks)
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "grow: %d ranks is not more than the %d there are", size,
                                 comm->nranks);
    unsigned seq = comm->grow_seq++;
    tutti_store_t *js = comm->job_store;
    char base[TUTTI_STORE_MAX_KEY + 1], count[TUTTI_STORE_MAX_KEY + 1], tkey[512];
    char ticket[3 * TUTTI_STORE_MAX_KEY], err[TT_ERRMSG_LEN] = "";
    snprintf(base, sizeof(base), "%s%s-grow%u/", js->prefix, comm->nonce, seq);
    /* under comm's instance: what is left there goes with comm's keys */
    snprintf(count, sizeof(count), "%s%s/grow%u/joined", js->prefix, comm->nonce, seq);
    grow_ticket_key(comm->opts.prefix, comm->job_id, tkey, sizeof(tkey));
    int tlen = snprintf(ticket, sizeof(ticket), "%d %d %s %s", comm->nranks, size, base, count);
    int st = TUTTI_OK;
    if (comm->rank == 0)
        st = grow_publish(comm, js->base, tkey, ticket, (size_t)tlen, err, sizeof(err));
    if (st == TUTTI_OK) {
        tutti_comm_opts_t o = opts_now(comm);
        o.job_settle_ms = 0;
        st = comm_create(newcomm_p, js->base, comm, base, comm->rank, size, &o, err, sizeof(err));
    }
    /* every new rank read the ticket before it joined; a later one finds none (unless
     * a newer grow's, which this leaves alone). A grow that failed takes it away from
     * every rank that is left: rank 0 may be the one that died after publishing it,
     * and a joiner that finds it would wait for ranks that never come */
    if (comm->rank == 0 || st < 0)
        (void)tt_store_compare_delete(js->base, tkey, ticket, (size_t)tlen);
    if (st < 0)
        return tt_comm_set_error(comm, st, "grow %u to %d ranks (under %s): %s", seq, size, base,
                                 err);
    (*newcomm_p)->split_store = tt_store_retain(js);
    TT_INFO("grow %u: %d ranks to %d under %s", seq, comm->nranks, size, base);
    return TUTTI_OK;
}

int tutti_comm_join(tutti_comm_t **comm_p, tutti_store_t *store, const tutti_comm_opts_t *opts)
{
    char err[TT_ERRMSG_LEN] = "", jid[80], tkey[512];
    if (!comm_p || !store)
        return init_error_set(TUTTI_ERR_INVALID_ARG, "tutti_comm_join: %s is NULL",
                              comm_p ? "store" : "comm_p");
    *comm_p = NULL;
    init_error[0] = '\0';
    tutti_comm_opts_t o;
    int st = tt_comm_opts_resolve(&o, opts);
    if (st < 0)
        return init_error_set(st, "tutti_comm_join: bad options");
    o.job_settle_ms = 0; /* the key space is named by the growing instance's nonce */
    tt_job_id(o.job_id, jid, sizeof(jid), NULL);
    grow_ticket_key(o.prefix, jid, tkey, sizeof(tkey));
    void *v = NULL, *full = NULL; /* the ticket read, and the last one found full */
    size_t len = 0, flen = 0;
    int old = 0, size = 0, rank = -1, polls = 0;
    char base[TUTTI_STORE_MAX_KEY + 1], count[TUTTI_STORE_MAX_KEY + 1], fmt[64];
    snprintf(fmt, sizeof(fmt), "%%d %%d %%%ds %%%ds", TUTTI_STORE_MAX_KEY, TUTTI_STORE_MAX_KEY);
    uint64_t deadline = tt_deadline_ns(o.timeout_ms), backoff = 10000000ull;
    for (;;) {
        st = tutti_store_get(store, tkey, &v, &len, tt_ms_left(deadline));
        if (st < 0) {
            snprintf(err, sizeof(err),
                     "%s (no new ticket at %s within %d ms: its ranks call tutti_comm_grow): %s",
                     full ? "every place of the last grow was taken, and no other began"
                          : "no communicator of this job is growing",
                     tkey, o.timeout_ms, tutti_store_last_error(store));
            goto out;
        }
        if (full && len == flen && !memcmp(v, full, len)) { /* still the full one */
            free(v);
            v = NULL;
            if (tt_now_ns() >= deadline) {
                st = TUTTI_ERR_TIMEOUT;
                snprintf(err, sizeof(err),
                         "every place of the grow from %d to %d ranks was taken, and no other "
                         "grow began within %d ms",
                         old, size, o.timeout_ms);
                goto out;
            }
            backoff_sleep(&backoff, deadline, 200000000ull);
            continue;
        }
        if (sscanf(v, fmt, &old, &size, base, count) != 4 || old < 1 || size <= old) {
            st = TUTTI_ERR_PROTOCOL;
            snprintf(err, sizeof(err), "the ticket at %s is not one (\"%.100s\")", tkey, (char *)v);
            goto out;
        }
        int64_t n = 0;
        if ((st = tutti_store_add(store, count, 1, &n)) < 0) {
            snprintf(err, sizeof(err), "taking a place: %s", tutti_store_last_error(store));
            goto out;
        }
        rank = old + (int)n - 1;
        if (n >= 1 && rank < size)
            break;
        /* a spare: it waits for the next grow */
        if (!polls++)
            TT_INFO("tutti_comm_join: the %d places of the grow to %d ranks are taken: waiting "
                    "for the next grow",
                    size - old, size);
        free(full);
        full = v, flen = len, v = NULL, rank = -1;
    }
    tt_log_set_rank(rank);
    st = comm_create(comm_p, store, NULL, base, rank, size, &o, err, sizeof(err));
out:
    free(v);
    free(full);
    tt_comm_opts_free(&o);
    if (st < 0) {
        init_error_set(st, "tutti_comm_join (rank %d of %d, job %s): %s", rank, size,
                       jid[0] ? jid : "(no id)", err);
        TT_WARN("%s", init_error);
    }
    return st;
}

/* communicators of tutti_comm_init_env destroyed so far (the store servers' label) */
static atomic_uint env_comms_done;

/* The launchers whose variables place a process: tutti-run's (and tutti-bench -np's),
 * torchrun's, Open MPI's mpirun, the PMI of MPICH's and Intel MPI's mpiexec, and Slurm's
 * srun, in that order. The first whose rank and size are both set places this process
 * (TUTTI_* and torchrun's, as before them, variable by variable between the two): a
 * stale RANK alone does not hide mpirun's pair, and torchrun inside srun wins over the
 * step's SLURM_PROCID, as mpirun inside a Slurm job does. Slurm's count only in a job
 * step (SLURM_STEP_ID, which srun sets): a batch script has SLURM_PROCID=0 and
 * SLURM_NTASKS too, but is no rank. The launchers with a local_size or a node count say
 * whether every rank is on this host (derive: with no store named, they may meet on
 * loopback); launch_id names what tells two of their launches apart. */
typedef struct env_launcher {
    const char *name, *rank, *size;
    const char *only_with;               /* counts only where this variable is set */
    const char *local_size;              /* ranks on this host */
    const char *nodes;                   /* or the job's node count */
    const char *launch_id[2];            /* this launch's own id, as the launcher names it */
    int (*launch_found)(char *, size_t); /* or as it is found, where it names none */
    const char *nodelist; /* across nodes: the nodes (a hostlist), task 0 on the first */
    const char *nodename; /* and the name of this one in that list */
    int pmix;             /* or across hosts: rank 0's host from PMIx (tt_pmix_rank0_host) */
} env_launcher_t;
static const env_launcher_t env_launchers[] = {
    { "TUTTI_*",
      "TUTTI_RANK",
      "TUTTI_WORLD_SIZE",
      NULL,
      NULL,
      NULL,
      { NULL, NULL },
      NULL,
      NULL,
      NULL,
      0 },
    { "torchrun", "RANK", "WORLD_SIZE", NULL, NULL, NULL, { NULL, NULL }, NULL, NULL, NULL, 0 },
    { "Open MPI",
      "OMPI_COMM_WORLD_RANK",
      "OMPI_COMM_WORLD_SIZE",
      NULL,
      "OMPI_COMM_WORLD_LOCAL_SIZE",
      NULL,
      { "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid" },
      NULL,
      NULL,
      NULL,
      1 },
    { "PMI (MPICH, Intel MPI)",
      "PMI_RANK",
      "PMI_SIZE",
      NULL,
      "MPI_LOCALNRANKS",
      NULL,
      { "PMI_JOBID", NULL },
      tt_job_hydra_launch, /* MPICH's hydra sets no PMI_JOBID */
      NULL,
      NULL,
      0 },
    { "Slurm (srun)",
      "SLURM_PROCID",
      "SLURM_STEP_NUM_TASKS",
      "SLURM_STEP_ID",
      NULL,
      "SLURM_STEP_NUM_NODES",
      { "SLURM_JOB_ID", "SLURM_STEP_ID" },
      NULL,
      "SLURM_STEP_NODELIST",
      "SLURMD_NODENAME",
      0 },
};
#define ENV_LAUNCHERS ((int)(sizeof(env_launchers) / sizeof(env_launchers[0])))

static const char *env_var(const char *name)
{
    const char *v = name ? getenv(name) : NULL;
    return v && *v ? v : NULL;
}

/* This process's rank and size variables and the launchers they came from (-1: none);
 * the first launcher with both, else what was found of the first two's. */
static void env_place(const char **rank_p, int *rfrom, const char **size_p, int *sfrom)
{
    *rfrom = env_var("TUTTI_RANK") ? 0 : env_var("RANK") ? 1 : -1;
    *sfrom = env_var("TUTTI_WORLD_SIZE") ? 0 : env_var("WORLD_SIZE") ? 1 : -1;
    /* tutti's own variables are never stale: half of them set is an error, not a reason
     * to take a launcher's pair instead */
    int own = env_var("TUTTI_RANK") || env_var("TUTTI_WORLD_SIZE");
    for (int i = 2; i < ENV_LAUNCHERS && !own && (*rfrom < 0 || *sfrom < 0); i++) {
        const env_launcher_t *l = &env_launchers[i];
        if (env_var(l->rank) && env_var(l->size) && (!l->only_with || env_var(l->only_with)))
            *rfrom = *sfrom = i;
    }
    *rank_p = *rfrom >= 0 ? env_var(env_launchers[*rfrom].rank) : NULL;
    *size_p = *sfrom >= 0 ? env_var(env_launchers[*sfrom].size) : NULL;
}

/* The port of a job's store on loopback: a hash of its id and of the launch's own id
 * (two mpiruns inside one Slurm job share the job id, not their PMIx namespace; two
 * mpiexecs of MPICH with one TUTTI_JOB_ID, not their hydra proxy), in
 * 10000..32767, below Linux's default ephemeral ports (ip_local_port_range 32768-60999,
 * where connect() takes its local ports). Another job's server on it carries another
 * label and is passed over. */
static int env_loopback_port(const char *jid, const env_launcher_t *l)
{
    uint8_t h[TT_SHA256_LEN];
    tt_sha256_t c;
    tt_sha256_init(&c);
    tt_sha256_update(&c, "tutti-store-port:", 17);
    tt_sha256_update(&c, jid, strlen(jid) + 1);
    int named = 0;
    for (int i = 0; i < 2; i++) {
        const char *v = env_var(l->launch_id[i]);
        if (v)
            tt_sha256_update(&c, v, strlen(v) + 1);
        named |= v != NULL;
    }
    char found[96];
    if (!named && l->launch_found && l->launch_found(found, sizeof(found)) == 0)
        tt_sha256_update(&c, found, strlen(found) + 1);
    tt_sha256_final(&c, h);
    uint32_t x = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
    return 10000 + (int)(x % 22768u);
}

/* The store's timeout for an open: the caller's, else TUTTI_STORE_TIMEOUT_MS's default. */
static int env_store_timeout_ms(const tutti_comm_opts_t *opts)
{
    tutti_store_opts_t so;
    tutti_store_opts_init(&so);
    return opts && opts->timeout_ms > 0 && !tt_env("STORE_TIMEOUT_MS") ? opts->timeout_ms
                                                                       : so.timeout_ms;
}

/* Does host (where rank 0 serves a store that ranks on other hosts reach) resolve to
 * loopback here? 4 or 6 (the address family), with the address in addr; 0 if not (a
 * name that does not resolve is left to the store's own error). */
static int env_host_loopback(const char *host, char *addr, size_t addrlen)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
        return 0;
    int loop = 1, fam = 0;
    addr[0] = '\0';
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            const struct sockaddr_in *in = (const void *)a->ai_addr;
            loop &= (ntohl(in->sin_addr.s_addr) >> 24) == 127;
            if (!fam && inet_ntop(AF_INET, &in->sin_addr, addr, (socklen_t)addrlen))
                fam = 4;
        } else if (a->ai_family == AF_INET6) {
            const struct sockaddr_in6 *in6 = (const void *)a->ai_addr;
            loop &= IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
            if (!fam && inet_ntop(AF_INET6, &in6->sin6_addr, addr, (socklen_t)addrlen))
                fam = 6;
        }
    }
    freeaddrinfo(res);
    return loop ? fam : 0;
}

int tutti_store_open_env(tutti_store_t **store_p, int *rank_p, int *size_p,
                         const tutti_comm_opts_t *opts)
{
    if (store_p)
        *store_p = NULL;
    int rfrom, sfrom;
    const char *rank_s, *size_s;
    env_place(&rank_s, &rfrom, &size_s, &sfrom);
    const char *url = tt_env("STORE");
    char urlbuf[512];
    if (!url && getenv("MASTER_ADDR") && getenv("MASTER_PORT")) {
        const char *addr = getenv("MASTER_ADDR");
        snprintf(urlbuf, sizeof(urlbuf), strchr(addr, ':') ? "tcp://[%s]:%s" : "tcp://%s:%s", addr,
                 getenv("MASTER_PORT"));
        url = urlbuf;
    }
    init_error[0] = '\0';
    if (!store_p || !rank_p || !size_p || !rank_s || !size_s) {
        init_error_set(0,
                       "tutti_store_open_env: need this process's rank and the world size: "
                       "TUTTI_RANK and TUTTI_WORLD_SIZE, torchrun's RANK and WORLD_SIZE, "
                       "Open MPI's OMPI_COMM_WORLD_RANK and _SIZE, PMI_RANK and PMI_SIZE "
                       "(mpiexec of MPICH) or, in a job step, srun's SLURM_PROCID and "
                       "SLURM_STEP_NUM_TASKS; missing %s%s",
                       !store_p  ? "store_p"
                       : !rank_p ? "rank_p"
                       : !size_p ? "size_p"
                       : !rank_s ? "the rank"
                                 : "the world size",
                       !rank_s && getenv("SLURM_JOB_ID") && !getenv("SLURM_STEP_ID")
                           ? " (in a Slurm job but outside its steps, no rank: start the "
                             "ranks with srun)"
                           : "");
        TT_WARN("%s", init_error);
        return TUTTI_ERR_CONFIG;
    }
    char *end;
    long rank = strtol(rank_s, &end, 10);
    long size = rank_s[0] && !*end ? strtol(size_s, &end, 10) : -1;
    /* a size beyond an int (strtol's ERANGE too: LONG_MAX) is refused, not truncated */
    if (!rank_s[0] || !size_s[0] || *end || rank < 0 || size < 1 || size > INT32_MAX ||
        rank >= size) {
        init_error_set(0,
                       "tutti_store_open_env: rank \"%s\" (%s), world size \"%s\" (%s): not a "
                       "rank in [0, size) with a size of at most %d",
                       rank_s, env_launchers[rfrom].rank, size_s, env_launchers[sfrom].size,
                       INT32_MAX);
        TT_WARN("%s", init_error);
        return TUTTI_ERR_CONFIG;
    }
    char jid[80];
    int derived = 0; /* the store is the job's on loopback, at a port from its id */
    tt_job_id(opts && opts->size >= offsetof(tutti_comm_opts_t, job_id) + sizeof(char *)
                  ? opts->job_id
                  : NULL,
              jid, sizeof(jid), NULL);
    const env_launcher_t *l = &env_launchers[rfrom];
    if (rfrom == sfrom && rfrom >= 2 && tt_env_count(l->local_size) < 0 &&
        tt_env_count(l->nodes) < 0) {
        /* a launcher that does not say where its ranks are (Slurm's PMI-2 sets PMI_RANK
         * and PMI_SIZE in srun's tasks, not MPI_LOCALNRANKS): a later one that places
         * this process the same and says it (the step's) */
        for (int i = rfrom + 1; i < ENV_LAUNCHERS; i++) {
            const env_launcher_t *o = &env_launchers[i];
            if ((!o->only_with || env_var(o->only_with)) && tt_env_count(o->rank) == rank &&
                tt_env_count(o->size) == size &&
                (tt_env_count(o->local_size) >= 0 || tt_env_count(o->nodes) >= 0)) {
                l = o;
                break;
            }
        }
    }
    if (!url) {
        /* No store named, ranks an MPI launcher or srun started: a job whose launcher
         * says all its ranks are on this host, and which has an id, meets on loopback,
         * rank 0 hosting the server. Else the error says why not. */
        char why[512] = "", first[256], where[64], pwhy[256] = "";
        const char *host = NULL; /* where rank 0 serves the job's store */
        long nlocal = tt_env_count(l->local_size), nodes = tt_env_count(l->nodes);
        if (nodes == 1)
            nlocal = size; /* every rank of the step on its one node */
        if (!l->local_size && !l->nodes) {
            /* TUTTI_* and torchrun's name their store: no why */
        } else if (nlocal == size && jid[0]) {
            host = "127.0.0.1";
            snprintf(where, sizeof(where), "all %ld ranks on this host", size);
        } else if (nlocal == size)
            snprintf(why, sizeof(why), "there is no job id (TUTTI_JOB_ID)");
        else if (nodes > 1 && l->nodelist && env_var(l->nodelist) && jid[0]) {
            /* across the step's nodes: rank 0 (task 0, on the first node in a block or
             * cyclic layout) serves on that node's address, at the job's port */
            const char *me = env_var(l->nodename);
            if (tt_hostlist_first(env_var(l->nodelist), first, sizeof(first)) < 0) {
                snprintf(why, sizeof(why),
                         "%s=%.120s does not parse as a host list (or its first host is "
                         "longer than 255 bytes)",
                         l->nodelist, env_var(l->nodelist));
            } else if (rank == 0 && me && strcmp(me, first) != 0) {
                snprintf(why, sizeof(why),
                         "rank 0 runs on node %.100s, not on the step's first node %.100s, where "
                         "the others look for its store (a task layout that does not start "
                         "there: set MASTER_ADDR to rank 0's host)",
                         me, first);
            } else {
                host = first;
                snprintf(where, sizeof(where), "the first of the step's %ld nodes", nodes);
            }
        } else if (nodes > 1)
            snprintf(why, sizeof(why),
                     "the step spans %ld nodes (e.g. MASTER_ADDR=$(scontrol show hostnames "
                     "\"$SLURM_STEP_NODELIST\" | head -n 1) and a MASTER_PORT)",
                     nodes);
        else if (l->pmix && jid[0] &&
                 tt_pmix_rank0_host(first, sizeof(first), env_store_timeout_ms(opts), pwhy,
                                    sizeof(pwhy)) == 0) {
            /* across hosts under a PMIx launcher: rank 0 serves on its host (the name
             * the launcher knows it by), at the job's port */
            host = first;
            snprintf(where, sizeof(where), "rank 0's host (from PMIx)");
        } else if (nlocal > 0)
            snprintf(why, sizeof(why), "%ld of the %ld ranks are on this host%s%s", nlocal, size,
                     pwhy[0] ? ", and rank 0's host is not known: " : "", pwhy);
        else
            snprintf(why, sizeof(why), "%s does not say how many ranks share this host", l->name);
        if (host) {
            snprintf(urlbuf, sizeof(urlbuf), strchr(host, ':') ? "tcp://[%s]:%d" : "tcp://%s:%d",
                     host, env_loopback_port(jid, l));
            url = urlbuf;
            derived = 1;
            if (rank == 0)
                TT_INFO("tutti_store_open_env: store %s: %s (%s), the port from job id %s", url,
                        where, l->name, jid);
            /* across hosts, rank 0's own name resolving to loopback here (Debian's
             * 127.0.1.1 for a host without a fixed address) would serve where only this
             * host connects: serve on every interface instead; the other hosts reach it
             * at the address the name has there */
            char lo[INET6_ADDRSTRLEN];
            int fam = rank == 0 && nlocal != size ? env_host_loopback(host, lo, sizeof(lo)) : 0;
            if (fam) {
                snprintf(urlbuf, sizeof(urlbuf), fam == 6 ? "tcp://[::]:%d" : "tcp://0.0.0.0:%d",
                         env_loopback_port(jid, l));
                TT_INFO("tutti_store_open_env: %s resolves to %s here, a loopback address: "
                        "serving on every interface (%s) for the ranks on other hosts",
                        host, lo, url);
            }
        }
        if (!url) {
            init_error_set(
                0,
                "tutti_store_open_env: rank %ld of %ld (%s): no store: set "
                "TUTTI_STORE (file:///dir, tcp://host:port or redis://host) or MASTER_ADDR and "
                "MASTER_PORT%s%s",
                rank, size, l->rank,
                why[0] ? "; a job with a job id meets without them where its ranks are all "
                         "on one host (on loopback), are a Slurm step's (on its first node) "
                         "or a PMIx launcher's such as Open MPI's mpirun (on rank 0's "
                         "host), but "
                       : "",
                why);
            TT_WARN("%s", init_error);
            return TUTTI_ERR_CONFIG;
        }
    }
    tutti_store_opts_t so;
    tutti_store_opts_init(&so);
    so.timeout_ms = env_store_timeout_ms(opts);
    /* a tcp store's server: rank 0's, or a standalone one (TUTTI_STORE_SERVER=0); the
     * job's on loopback is always rank 0's */
    int hosted = !strncmp(url, "tcp://", 6) && (derived || tt_env_int("STORE_SERVER", 1));
    so.is_server = rank == 0 && hosted;
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
     * clients keep away from the previous one. A standalone server (tutti-store) has no
     * label and outlives jobs: its clients take it as it is (they waited for a label it
     * never has until their timeout). */
    char label[160];
    snprintf(label, sizeof(label), "%s#%u", jid[0] ? jid : "-", atomic_load(&env_comms_done));
    so.instance = hosted ? label : NULL;
    int st = tutti_store_open(store_p, url, &so);
    if (st < 0) {
        char shown[512];
        url = tt_store_url_redact(url, shown, sizeof(shown)); /* no password in messages */
        *store_p = NULL;
        if (derived)
            init_error_set(st,
                           "tutti_store_open_env: rank %ld cannot open store %s, the port of "
                           "job id %s (set TUTTI_STORE, or another TUTTI_JOB_ID): %s: %s",
                           rank, url, jid, tutti_strerror(st), tutti_store_last_error(NULL));
        else
            init_error_set(st, "tutti_store_open_env: rank %ld cannot open store %s: %s: %s", rank,
                           url, tutti_strerror(st), tutti_store_last_error(NULL));
        TT_WARN("%s", init_error);
        return st;
    }
    *rank_p = (int)rank;
    *size_p = (int)size;
    return TUTTI_OK;
}

int tutti_comm_init_env(tutti_comm_t **comm_p, const tutti_comm_opts_t *opts)
{
    if (!comm_p) {
        init_error_set(0, "tutti_comm_init_env: comm_p is NULL");
        return TUTTI_ERR_INVALID_ARG;
    }
    tutti_store_t *store;
    int rank, size;
    int st = tutti_store_open_env(&store, &rank, &size, opts);
    if (st < 0)
        return st;
    st = tutti_comm_init(comm_p, store, rank, size, opts);
    if (st < 0) {
        tutti_store_close(store);
        return st;
    }
    (*comm_p)->owned_store = store;
    return TUTTI_OK;
}

/* Abort the transport (a blocked call ends) and wake whoever waits on the queue. */
static void stop_and_wake(tutti_comm_t *comm)
{
    if (comm->tp)
        comm->tp_ops->abort(comm->tp);
    pthread_mutex_lock(&comm->q_lock);
    pthread_cond_broadcast(&comm->q_cv);
    pthread_cond_broadcast(&comm->done_cv);
    pthread_mutex_unlock(&comm->q_lock);
}

int tutti_comm_abort(tutti_comm_t *comm)
{
    if (comm && tt_comm_foreign(comm)) /* a forked child: the parent's (nothing touched) */
        return tt_comm_refuse_foreign(comm, "abort", 0);
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (atomic_exchange(&comm->aborted, 1))
        return TUTTI_OK;
    tt_comm_set_error(comm, TUTTI_ERR_ABORTED, "communicator aborted by the user");
    pthread_mutex_lock(&comm->err_lock); /* (its message stays the failure's) */
    tt_failed_error_locked(comm);
    pthread_mutex_unlock(&comm->err_lock);
    stop_and_wake(comm);
    return TUTTI_OK;
}

int tutti_comm_revoke(tutti_comm_t *comm)
{
    if (comm && tt_comm_foreign(comm)) /* a forked child: the parent's (nothing touched) */
        return tt_comm_refuse_foreign(comm, "revoke", 0);
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    pthread_mutex_lock(&comm->q_lock);
    uint64_t seq = comm->next_seq;
    pthread_mutex_unlock(&comm->q_lock);
    /* under err_lock with the failure's text, which a thread that sees the
     * communicator failed reads under it (exec.c); failed before revoked, so that a
     * second revoker, which returns at once, finds its communicator failed already */
    int expected = 0;
    pthread_mutex_lock(&comm->err_lock);
    int first = atomic_compare_exchange_strong(&comm->failed, &expected, TUTTI_ERR_REVOKED);
    if (first) {
        snprintf(comm->last_error, sizeof(comm->last_error),
                 "rank %d: revoked the communicator (tutti_comm_revoke)", comm->rank);
        /* the first failure's message, which refused calls (and the async error) quote */
        tt_failed_error_locked(comm);
    }
    pthread_mutex_unlock(&comm->err_lock);
    if (atomic_exchange(&comm->revoked, 1))
        return TUTTI_OK;
    if (first) {
        TT_WARN("rank %d: revoked the communicator before its seq %llu", comm->rank,
                (unsigned long long)seq);
        atomic_store(&comm->revoke_untold, 1);
        tt_fault_record_revoke(comm);
    }
    /* A blocked op ends (the transport aborted) and tells the peers as it fails
     * (tt_fault_record); an idle communicator is told from here, holding `executing`.
     * Should an op hold it and still finish well, the next op tells, or else the
     * peers' stall checks find the record written above. */
    stop_and_wake(comm);
    pthread_mutex_lock(&comm->q_lock);
    if (!comm->executing && !comm->stopping) {
        comm->executing = 1;
        pthread_mutex_unlock(&comm->q_lock);
        tt_fault_tell_revoke(comm);
        pthread_mutex_lock(&comm->q_lock);
        comm->executing = 0;
        pthread_cond_broadcast(&comm->done_cv);
        if (comm->q_head)
            pthread_cond_signal(&comm->q_cv);
    }
    pthread_mutex_unlock(&comm->q_lock);
    return TUTTI_OK;
}

int tutti_comm_destroy(tutti_comm_t *comm)
{
    /* a forked child's copy (a C++ global destructor at exit, an interpreter's
     * finalization): its locks, threads, sockets, rings and store keys are the
     * parent's, in use. Nothing is touched, and the copy is left (the child's memory). */
    if (comm && tt_comm_foreign(comm))
        return tt_comm_refuse_foreign(comm, "destroy", 1);
    if (!comm)
        return TUTTI_ERR_INVALID_ARG;
    if (tt_exec_in_callback(comm))
        return tt_comm_set_error(comm, TUTTI_ERR_INVALID_ARG,
                                 "destroy: called from a tutti_work_on_done callback of this "
                                 "communicator (a callback must not call into it)");
    pthread_mutex_lock(&comm->q_lock);
    comm->stopping = 1; /* calls from now on are refused (exec.c) */
    pthread_cond_broadcast(&comm->q_cv);
    pthread_mutex_unlock(&comm->q_lock);
    if (comm->worker_started)
        pthread_join(comm->worker, NULL);
    /* An op that another thread runs (a blocking call's, inline; one a waiter took from
     * the queue) or a call on its way out: freed under it, the transport crashed it
     * (review: a watchdog's abort then destroy while the main thread was in an
     * allreduce). After an abort its op ends at once. */
    tt_exec_drain(comm);
    /* the agreement messages still due, then the transport: peers that still read
     * from us see a clean close */
    if (comm->tp && comm->tp_ops) {
        tt_agree_drain(comm);
        comm->tp_ops->destroy(comm->tp);
    }
    comm->tp = NULL;
    /* a failure's or an abort's record not written yet (an abort while no op ran) */
    if (atomic_load(&comm->failed) < 0 || atomic_load(&comm->aborted))
        tt_trace_due(comm);
    tt_trace_flush(comm);
    tt_job_leave(comm);
    if (comm->owned_store)
        atomic_fetch_add(&env_comms_done, 1);
    comm_free(comm);
    return TUTTI_OK;
}
