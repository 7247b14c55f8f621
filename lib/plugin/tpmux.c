/* Per-peer transport choice and the multiplexer (see tpmux.h).
 *
 * Choice: every rank publishes its host id (hostname + boot id, or TUTTI_HOST_ID) under
 * "hostid/<rank>" in the communicator's store and reads everyone's. A peer with the
 * same host id is local. TUTTI_TRANSPORT then says what serves whom:
 *   auto (default)          local peers: the built-in local-only transport (shm; tcp where
 *                           shm cannot connect them: mux_connect), others: tcp
 *   local=NAME,remote=NAME  either half may be left out (it stays as in auto)
 *   NAME or a path          every peer
 * Transports whose properties say local-only (shm) refuse remote peers: a config error.
 *
 * With one transport in use the library talks to it directly. With several, the
 * multiplexer below stands in: it routes each request by peer, remembers which
 * transport has requests pending, and drives them: the only one with pending work
 * blocks natively (futex, epoll, completion channel); when several have work, they are
 * polled for the spin, then each is armed (the ABI's arm(): a descriptor that turns
 * readable when it has something to do) and one poll() sleeps on them all. A transport
 * without arm() makes them take turns instead, blocking in each for up to 1 ms. */
#include <ctype.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tutti/store.h>

#include "core/setup.h"
#include "core/opts.h"
#include "core/state.h"
#include "base/base.h"
#include "plugin/tpmux.h"
#include "plugin/transport.h"
#include "../../transports/kit/queue.h"
#include "../../transports/kit/util.h"

#define MUX_MAX 4
#define MUX_PURE_SPIN_NS 3000u /* the spin's first part, without yielding */
/* A wait on one transport lets the others run (progress(0)) this often: they may have a
 * peer to answer with nothing posted on them (tcp's calls at a link's first use under
 * TUTTI_TCP_CONNECT=lazy, reports), and nothing else runs them while it waits. */
#define MUX_SERVICE_MS 10

/* ---- host identity ---- */

void tt_host_id(const char *override, char *out, size_t len)
{
    tp_host_id_fallback(override, out, len); /* the transports' kit does it for shm too */
}

/* ---- the multiplexer ---- */

typedef struct mux_sub {
    const tutti_transport_ops_v2_t *ops;
    void *tp;
    void *handle;            /* dlopen handle, or NULL */
    tutti_tp_host_v2_t host; /* the library's, with `peers` narrowed and store keys
                                    under "<local|remote>/" (two instances of one
                                    transport must not share keys); ctx is this sub */
    const tutti_tp_host_v2_t *parent;
    const char *kprefix;
    unsigned char *peers;
    tutti_tp_req_v2_t **pend; /* posted, possibly not complete */
    size_t npend, cap;
    int can_arm; /* has arm(), and it has not said TUTTI_ERR_UNSUPPORTED */
} mux_sub_t;

typedef struct mux {
    int nranks;
    int spin_us;
    uint64_t serviced_ns; /* when a wait on one transport last let the others run */
    int nsub;
    mux_sub_t sub[MUX_MAX];
    int *peer_sub; /* nranks entries: index into sub[], -1 for self */
} mux_t;

/* The sub-transports' host callbacks: forward to the library's. */
static int sub_store_set(void *ctx, const char *key, const void *value, size_t len)
{
    mux_sub_t *s = ctx;
    char k[512];
    snprintf(k, sizeof(k), "%s/%s", s->kprefix, key);
    return s->parent->store_set(s->parent->ctx, k, value, len);
}

static int sub_store_get(void *ctx, const char *key, void **value_p, size_t *len_p, int timeout_ms)
{
    mux_sub_t *s = ctx;
    char k[512];
    snprintf(k, sizeof(k), "%s/%s", s->kprefix, key);
    return s->parent->store_get(s->parent->ctx, k, value_p, len_p, timeout_ms);
}

static const char *sub_config(void *ctx, const char *name)
{
    mux_sub_t *s = ctx;
    return s->parent->config(s->parent->ctx, name);
}

/* char msg[2048], formatted from fmt and the variadic arguments that follow it */
#define SUB_FORMAT(msg, fmt)                                                                       \
    char msg[2048];                                                                                \
    do {                                                                                           \
        va_list ap_;                                                                               \
        va_start(ap_, fmt);                                                                        \
        vsnprintf(msg, sizeof(msg), fmt, ap_);                                                     \
        va_end(ap_);                                                                               \
    } while (0)

__attribute__((format(printf, 3, 4))) static void sub_log(void *ctx, int level, const char *fmt,
                                                          ...)
{
    mux_sub_t *s = ctx;
    SUB_FORMAT(msg, fmt);
    s->parent->log(s->parent->ctx, level, "%s", msg);
}

/* The secret lives with the communicator: answer through the parent (ctx is ours). */
static int sub_auth_answer(void *ctx, const char *context, const uint8_t challenge[32],
                           uint8_t answer[32])
{
    mux_sub_t *s = ctx;
    if (!tutti_tp_host_has(s->parent, auth_answer) || !s->parent->auth_answer)
        return TUTTI_ERR_UNSUPPORTED;
    return s->parent->auth_answer(s->parent->ctx, context, challenge, answer);
}

static int sub_setup_check(void *ctx)
{
    mux_sub_t *s = ctx;
    if (!tutti_tp_host_has(s->parent, setup_check) || !s->parent->setup_check)
        return 0;
    return s->parent->setup_check(s->parent->ctx);
}

__attribute__((format(printf, 5, 6))) static int sub_error(void *ctx, int status, int peer,
                                                           int err_no, const char *fmt, ...)
{
    mux_sub_t *s = ctx;
    SUB_FORMAT(msg, fmt);
    return s->parent->error(s->parent->ctx, status, peer, err_no, "%s", msg);
}

/* Drop completed requests from the pending list; returns how many completed. */
static size_t prune(mux_sub_t *s)
{
    size_t k = 0, done = 0;
    for (size_t i = 0; i < s->npend; i++) {
        if (s->pend[i]->status == 1)
            s->pend[k++] = s->pend[i];
        else
            done++;
    }
    s->npend = k;
    return done;
}

static int mux_post(void *vmux, tutti_tp_req_v2_t *req, int kind)
{
    mux_t *m = vmux;
    if (!req || req->peer < 0 || req->peer >= m->nranks || m->peer_sub[req->peer] < 0) {
        if (req)
            req->status = TUTTI_ERR_INVALID_ARG;
        return TUTTI_ERR_INVALID_ARG;
    }
    mux_sub_t *s = &m->sub[m->peer_sub[req->peer]];
    if (m->nsub == 1) /* one transport (auto on one host): nothing to track */
        return kind == TUTTI_TP_SEND ? s->ops->post_send(s->tp, req)
                                     : s->ops->post_recv(s->tp, req);
    if (s->npend == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        tutti_tp_req_v2_t **p = realloc(s->pend, cap * sizeof(*p));
        if (!p) {
            req->status = TUTTI_ERR_NOMEM;
            return TUTTI_ERR_NOMEM;
        }
        s->pend = p;
        s->cap = cap;
    }
    int st = kind == TUTTI_TP_SEND ? s->ops->post_send(s->tp, req) : s->ops->post_recv(s->tp, req);
    if (st == TUTTI_OK && req->status == 1)
        s->pend[s->npend++] = req;
    return st;
}

TT_KIT_SEND_RECV_FNS(mux)

/* Sleep until one of the active transports has something to do, or deadline: each is
 * armed and one poll() waits on their descriptors. 1 when it slept, or found work
 * without sleeping; 0 when one of them cannot be armed (the caller takes turns); < 0 a
 * failure. Either way the caller's progress() calls that follow disarm them. */
static int mux_sleep(mux_t *m, const int *active, int na, uint64_t deadline)
{
    struct pollfd pf[MUX_MAX];
    uint64_t now = tt_now_ns();
    int ms = now < deadline ? (int)((deadline - now + 999999u) / 1000000u) : 0;
    for (int k = 0; k < na; k++) {
        mux_sub_t *s = &m->sub[active[k]];
        int fd = -1, t = -1;
        int st = s->can_arm ? s->ops->arm(s->tp, &fd, &t) : TUTTI_ERR_UNSUPPORTED;
        if (st == TUTTI_ERR_UNSUPPORTED) {
            s->can_arm = 0;
            return 0;
        }
        if (st != 0)
            return st < 0 ? st : 1;
        pf[k] = (struct pollfd){ .fd = fd, .events = POLLIN };
        if (t >= 0 && t < ms)
            ms = t;
    }
    poll(pf, (nfds_t)na, ms);
    return 1;
}

static int mux_progress(void *vmux, int timeout_ms)
{
    mux_t *m = vmux;
    int active[MUX_MAX], na = 0;
    for (int i = 0; i < m->nsub; i++)
        if (m->sub[i].npend)
            active[na++] = i;
    if (na == 0) /* nothing posted: still listen to every transport (peer reports) */
        for (int i = 0; i < m->nsub; i++)
            active[na++] = i;
    if (na == 1) {
        /* in slices of at most MUX_SERVICE_MS, the others run every MUX_SERVICE_MS */
        mux_sub_t *s = &m->sub[active[0]];
        uint64_t end = tt_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
        for (;;) {
            uint64_t now = tt_now_ns();
            int left = now < end ? (int)((end - now + 999999u) / 1000000u) : 0;
            int slice = m->nsub > 1 && left > MUX_SERVICE_MS ? MUX_SERVICE_MS : left;
            int st = s->ops->progress(s->tp, slice);
            size_t done = prune(s);
            now = tt_now_ns();
            if (m->nsub > 1 && now - m->serviced_ns >= MUX_SERVICE_MS * 1000000ull) {
                m->serviced_ns = now;
                for (int i = 0; i < m->nsub && st >= 0; i++) {
                    if (i == active[0])
                        continue;
                    int so = m->sub[i].ops->progress(m->sub[i].tp, 0);
                    prune(&m->sub[i]);
                    st = so < 0 ? so : st;
                }
            }
            if (st < 0 || done || left <= slice)
                return st;
        }
    }
    uint64_t t0 = tt_now_ns();
    uint64_t deadline = t0 + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
    uint64_t spin_end = t0 + (uint64_t)m->spin_us * 1000ull;
    for (;;) {
        size_t done = 0;
        uint64_t now = tt_now_ns();
        /* after the spin budget, sleep on all at once, or (one cannot be armed) let each
         * block up to 1 ms in turn */
        int slice = 0, slept = 0;
        /* Past a brief pure spin, yield on every round: a peer on this host may need the
         * CPU (as the transports' own spins do; with nobody waiting a yield is cheap). */
        if (timeout_ms > 0 && now >= t0 + MUX_PURE_SPIN_NS && now < spin_end)
            sched_yield();
        if (timeout_ms > 0 && now >= spin_end) {
            slept = mux_sleep(m, active, na, deadline);
            if (slept < 0)
                return slept;
            if (!slept) {
                uint64_t left_ms = now < deadline ? (deadline - now + 999999u) / 1000000u : 0;
                slice = left_ms > 1 ? 1 : (int)left_ms;
            }
        }
        for (int k = 0; k < na; k++) {
            mux_sub_t *s = &m->sub[active[k]];
            int st = s->ops->progress(s->tp, slice);
            done += prune(s);
            if (st < 0)
                return st;
            if (done && !slept) /* after a sleep, every armed one must be disarmed */
                break;
        }
        if (done || timeout_ms <= 0 || tt_now_ns() >= deadline)
            return TUTTI_OK;
    }
}

static void mux_cancel_all(void *vmux, int status)
{
    mux_t *m = vmux;
    for (int i = 0; i < m->nsub; i++) {
        m->sub[i].ops->cancel_all(m->sub[i].tp, status);
        m->sub[i].npend = 0;
    }
}

static void mux_notify_error(void *vmux, int status, const char *msg)
{
    mux_t *m = vmux;
    for (int i = 0; i < m->nsub; i++)
        m->sub[i].ops->notify_error(m->sub[i].tp, status, msg);
}

static void mux_abort(void *vmux)
{
    mux_t *m = vmux;
    for (int i = 0; i < m->nsub; i++)
        m->sub[i].ops->abort(m->sub[i].tp);
}

static const char *mux_peer_address(void *vmux, int peer)
{
    mux_t *m = vmux;
    if (peer < 0 || peer >= m->nranks || m->peer_sub[peer] < 0)
        return NULL;
    mux_sub_t *s = &m->sub[m->peer_sub[peer]];
    return s->ops->peer_address ? s->ops->peer_address(s->tp, peer) : NULL;
}

/* By peer, to the transport that serves it; one without the slot cannot probe. */
static int mux_probe(void *vmux, int peer, tutti_tp_probe_t *found_p)
{
    mux_t *m = vmux;
    if (peer < 0 || peer >= m->nranks || m->peer_sub[peer] < 0)
        return TUTTI_ERR_INVALID_ARG;
    mux_sub_t *s = &m->sub[m->peer_sub[peer]];
    if (!tutti_tp_ops_has(s->ops, probe) || !s->ops->probe)
        return TUTTI_ERR_UNSUPPORTED;
    return s->ops->probe(s->tp, peer, found_p);
}

/* By the request's peer, to the transport that serves it (one without the slot cannot). */
static int mux_cancel(void *vmux, tutti_tp_req_v2_t *req)
{
    mux_t *m = vmux;
    if (req->peer < 0 || req->peer >= m->nranks || m->peer_sub[req->peer] < 0)
        return TUTTI_ERR_INVALID_ARG;
    mux_sub_t *s = &m->sub[m->peer_sub[req->peer]];
    if (!tutti_tp_ops_has(s->ops, cancel) || !s->ops->cancel)
        return TUTTI_ERR_UNSUPPORTED; /* (a v1 plugin's: it cannot take one back) */
    int st = s->ops->cancel(s->tp, req);
    for (size_t i = 0; st == 0 && i < s->npend; i++)
        if (s->pend[i] == req) { /* the library's again: not to be looked at */
            s->pend[i] = s->pend[--s->npend];
            break;
        }
    return st;
}

static void mux_free(mux_t *m)
{
    for (int i = 0; i < m->nsub; i++) {
        mux_sub_t *s = &m->sub[i];
        if (s->tp)
            s->ops->destroy(s->tp);
        tt_transport_unload(s->handle);
        free(s->peers);
        free(s->pend);
    }
    free(m->peer_sub);
    free(m);
}

static void mux_destroy(void *vmux)
{
    mux_free(vmux);
}

static int mux_create_unused(const tutti_tp_host_v2_t *host, void **tp_p)
{
    (void)host;
    (void)tp_p;
    return TUTTI_ERR_INTERNAL; /* the multiplexer is built by tt_transports_create */
}

static const tutti_transport_ops_v2_t mux_ops = {
    .size = sizeof(tutti_transport_ops_v2_t),
    .abi_version = TUTTI_TRANSPORT_ABI_V2,
    .name = "mux",
    .props = { .mem_kinds = TUTTI_MEM_BIT(TUTTI_MEM_HOST) }, /* its parts' are in
                                                             tt_transports_props */
    .create = mux_create_unused,
    .destroy = mux_destroy,
    .post_send = mux_post_send,
    .post_recv = mux_post_recv,
    .progress = mux_progress,
    .cancel_all = mux_cancel_all,
    .notify_error = mux_notify_error,
    .abort = mux_abort,
    .peer_address = mux_peer_address,
    .probe = mux_probe,
    .cancel = mux_cancel,
};

/* ---- choosing ---- */

/* Does transport `name` reach only this host (its properties say)? Loaded to ask; a
 * transport that does not load is not local-only here (loading it for use says why). */
static int local_only(const tutti_comm_t *comm, const char *name)
{
    const tutti_transport_ops_v2_t *ops;
    void *h = NULL;
    char err[64];
    if (tt_transport_load(name, comm->opts.plugin_path, &ops, &h, err, sizeof(err)) < 0)
        return 0;
    int only = (ops->props.flags & TUTTI_TP_LOCAL_ONLY) != 0;
    tt_transport_unload(h);
    return only;
}

/* auto's choice for local peers: the first built-in transport that is local-only (it
 * exists to be faster than the network), else tcp. */
static const char *auto_local(void)
{
    for (const tt_builtin_transport_t *b = tt_builtin_transports; b->name; b++)
        if (b->get()->props.flags & TUTTI_TP_LOCAL_ONLY)
            return b->name;
    return "tcp";
}

/* The names for local and remote peers in a spec; NULL, or the token it cannot read
 * (in buf, of bufsize bytes). */
static const char *spec_names(const char *spec, char *local, char *remote, size_t len, char *buf,
                              size_t bufsize)
{
    snprintf(local, len, "%s", auto_local());
    snprintf(remote, len, "tcp");
    if (!spec || !*spec || !strcmp(spec, "auto"))
        return NULL;
    if (!strstr(spec, "local=") && !strstr(spec, "remote=")) {
        snprintf(local, len, "%s", spec);
        snprintf(remote, len, "%s", spec);
        return NULL;
    }
    snprintf(buf, bufsize, "%s", spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (eq && eq[1] && !strncmp(tok, "local=", 6))
            snprintf(local, len, "%s", eq + 1);
        else if (eq && eq[1] && !strncmp(tok, "remote=", 7))
            snprintf(remote, len, "%s", eq + 1);
        else
            return tok;
    }
    return NULL;
}

/* Whether the spec leaves the local peers' transport to auto (which falls back to tcp
 * where it cannot connect them: mux_connect). */
static int spec_local_auto(const char *spec)
{
    return !spec || !*spec || !strcmp(spec, "auto") ||
           (strstr(spec, "remote=") && !strstr(spec, "local="));
}

void tt_transport_canon(const char *spec, char *out, size_t len)
{
    char local[128], remote[128], buf[512];
    if (spec_names(spec, local, remote, sizeof(local), buf, sizeof(buf)))
        snprintf(out, len, "%s", spec);
    else
        snprintf(out, len, "%s%s,%s", spec_local_auto(spec) ? "auto:" : "", local, remote);
    for (char *c = out; *c; c++)
        if (isspace((unsigned char)*c))
            *c = '?';
}

/* Parse opts.transport into the names for local and remote peers. */
static int parse_spec(const tutti_comm_t *comm, const char *spec, char *local, char *remote,
                      size_t len, char *err, size_t errlen)
{
    char buf[512];
    const char *bad = spec_names(spec, local, remote, len, buf, sizeof(buf));
    if (bad) {
        snprintf(err, errlen,
                 "TUTTI_TRANSPORT=\"%s\": cannot read \"%s\"; expected auto, a transport "
                 "name or path, or local=NAME,remote=NAME",
                 spec, bad);
        return TUTTI_ERR_CONFIG;
    }
    const tutti_comm_opts_t *o = &comm->opts;
    if ((o->tls_cert || o->tls_key || o->tls_ca_file || o->tls_ca_path) && strcmp(remote, "tcp") &&
        !local_only(comm, remote)) {
        /* TLS is tcp's: another transport would carry remote peers in the clear */
        snprintf(err, errlen,
                 "TLS is asked for (TUTTI_TLS_*), which only the tcp transport has, but "
                 "TUTTI_TRANSPORT=\"%s\" puts the ranks on other hosts on %s: use tcp for them "
                 "(remote=tcp), or unset the TLS knobs",
                 spec ? spec : "", remote);
        return TUTTI_ERR_UNSUPPORTED;
    }
    if (!spec || !*spec || !strcmp(spec, "auto") ||
        (!strstr(spec, "local=") && !strstr(spec, "remote=")))
        return TUTTI_OK;
    if (local_only(comm, remote)) {
        snprintf(err, errlen,
                 "TUTTI_TRANSPORT=\"%s\": %s reaches only ranks on this host; "
                 "it cannot serve remote peers",
                 spec, remote);
        return TUTTI_ERR_CONFIG;
    }
    return TUTTI_OK;
}

/* The CPUs this thread may run on, as hex digits, CPUs 0-3 in the first (at most 256
 * digits: CPU_SETSIZE); "" when the mask cannot be read. */
static void affinity_hex(char *out, size_t len)
{
    cpu_set_t set;
    out[0] = 0;
    if (sched_getaffinity(0, sizeof(set), &set) != 0)
        return;
    size_t n = 0;
    for (int c = 0; c < CPU_SETSIZE && n + 1 < len; c += 4) {
        int d = 0;
        for (int b = 0; b < 4; b++)
            d |= CPU_ISSET(c + b, &set) ? 1 << b : 0;
        out[n++] = "0123456789abcdef"[d];
    }
    while (n > 0 && out[n - 1] == '0')
        n--;
    out[n] = 0;
}

/* OR the CPUs of a mask affinity_hex wrote (a peer's: a character that is not a hex digit
 * counts as no CPU) into set. */
static void affinity_merge(cpu_set_t *set, const char *hex, size_t len)
{
    for (size_t i = 0; i < len && hex[i] && (int)(4 * i) < CPU_SETSIZE; i++) {
        const char *p = strchr("0123456789abcdef", hex[i]);
        int d = p ? (int)(p - "0123456789abcdef") : 0;
        for (int b = 0; b < 4; b++)
            if (d & 1 << b)
                CPU_SET((int)(4 * i) + b, set);
    }
}

/* The CPUs this rank may run on, for the spin's "auto" when no host ids are exchanged. */
static int own_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0)
        return 1;
    int n = CPU_COUNT(&set);
    return n > 0 ? n : 1;
}

/* TUTTI_BIND=auto: the CPU this rank's large collectives run on (exec.c), or -1. Only
 * while the host's nlocal ranks outnumber the CPUs between them (cpus) and this rank may
 * run on every one of them (ranks a launcher placed stay where it put them). The ranks
 * fill the CPUs in host order, neighbours together: 4 ranks on 2 CPUs put this host's
 * first two on the first CPU. idx: this rank's place among them. */
static int bind_choice(const tutti_comm_t *comm, const cpu_set_t *cpus, int idx, int nlocal)
{
    const char *b = comm->opts.bind;
    const int ncpu = CPU_COUNT(cpus);
    cpu_set_t own;
    if ((b && !strcmp(b, "none")) || ncpu < 2 || nlocal <= ncpu ||
        sched_getaffinity(0, sizeof(own), &own) != 0 || !CPU_EQUAL(&own, cpus))
        return -1;
    int k = (int)((long)idx * ncpu / nlocal);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, cpus) && k-- == 0)
            return c;
    return -1;
}

/* Publish this rank's host id and read everyone's; local[r] = 1 for ranks on this host,
 * *mates_p of them.
 * Each record also carries the rank's CPU affinity after the id's NUL: *cpus_p is the
 * number of CPUs the ranks on this host may run on between them (ranks pinned each to a
 * CPU of its own are not oversubscribed). */
static int exchange_host_ids(tutti_comm_t *comm, const char *me, unsigned char *local,
                             char *first_remote, size_t frlen, int *first_remote_rank, int *mates_p,
                             int *cpus_p, char *err, size_t errlen)
{
    int n = comm->nranks;
    char key[64];
    snprintf(key, sizeof(key), "hostid/%d", comm->rank);
    char rec[600], mask[CPU_SETSIZE / 4 + 1];
    affinity_hex(mask, sizeof(mask));
    size_t idlen = strnlen(me, 255);
    memcpy(rec, me, idlen);
    rec[idlen] = 0;
    size_t masklen = strlen(mask);
    memcpy(rec + idlen + 1, mask, masklen + 1);
    int st = tutti_store_set(comm->store, key, rec, idlen + masklen + 2);
    if (st < 0) {
        snprintf(err, errlen, "cannot publish this rank's host id: %s",
                 tutti_store_last_error(comm->store));
        return st;
    }
    char **keys = calloc((size_t)n, sizeof(char *));
    void **vals = calloc((size_t)n, sizeof(void *));
    size_t *lens = calloc((size_t)n, sizeof(size_t));
    char(*kbuf)[32] = calloc((size_t)n, 32);
    if (!keys || !vals || !lens || !kbuf) {
        snprintf(err, errlen, "out of memory (reading %d ranks' host ids)", n);
        st = TUTTI_ERR_NOMEM;
        goto out;
    }
    for (int r = 0; r < n; r++) {
        snprintf(kbuf[r], 32, "hostid/%d", r);
        keys[r] = kbuf[r];
    }
    st = tt_init_store_multi_get(comm, comm->store, (const char *const *)keys, (size_t)n, vals,
                                 lens, tt_comm_timeout_ms(comm), "rank");
    if (st < 0) {
        snprintf(err, errlen, "waiting for every rank's host id: %s",
                 tutti_store_last_error(comm->store));
        goto out;
    }
    *first_remote_rank = -1;
    /* the host map (hosts numbered as they first appear), for hier and its cost */
    free(comm->host_of);
    if (!(comm->host_of = calloc((size_t)n, sizeof(int)))) {
        snprintf(err, errlen, "out of memory (the host map of %d ranks)", n);
        st = TUTTI_ERR_NOMEM;
    }
    for (int r = 0; r < n && comm->host_of; r++)
        for (int q = 0; q <= r; q++)
            if (!strcmp((const char *)vals[q], (const char *)vals[r])) {
                comm->host_of[r] = q == r ? comm->nhosts++ : comm->host_of[q];
                break;
            }
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    *mates_p = 0;
    int idx = 0; /* this rank's place among the host's ranks */
    for (int r = 0; r < n; r++) {
        local[r] = r != comm->rank && !strcmp((const char *)vals[r], me);
        *mates_p += local[r];
        idx += local[r] && r < comm->rank;
        size_t id = strnlen((const char *)vals[r], lens[r]);
        if ((local[r] || r == comm->rank) && id + 1 < lens[r])
            affinity_merge(&cpus, (const char *)vals[r] + id + 1, lens[r] - id - 1);
        if (r != comm->rank && !local[r] && *first_remote_rank < 0) {
            *first_remote_rank = r;
            snprintf(first_remote, frlen, "%s", (const char *)vals[r]);
        }
        free(vals[r]);
    }
    *cpus_p = CPU_COUNT(&cpus) > 0 ? CPU_COUNT(&cpus) : own_cpus();
    comm->bind_cpu = bind_choice(comm, &cpus, idx, *mates_p + 1);
    if (comm->bind_cpu >= 0)
        TT_INFO("bind: allreduce, allgather and reduce-scatter of %u KiB and more run on CPU %d "
                "(%d ranks on this host, %d CPUs between them)",
                TT_BIND_MIN_BYTES >> 10, comm->bind_cpu, *mates_p + 1, *cpus_p);
out:
    free(keys);
    free(vals);
    free(lens);
    free(kbuf);
    return st;
}

/* Which peers are local (local[r] = 1), *nlocal_p of them, and *mates_p the peers on
 * this host, from the host ids (for the spin and the cost model's crowded host); a config
 * error when the one transport named reaches only this host and some peer is not on it.
 * With one transport that reaches every host (*single_p) that transport serves every
 * peer and nothing is exchanged here: tt_transports_create exchanges the host ids once it
 * is connected (a rank then publishes its address without waiting for every peer). */
static int classify_peers(tutti_comm_t *comm, const char *local_name, const char *remote_name,
                          unsigned char *local, int *nlocal_p, int *mates_p, int *cpus_p,
                          int *single_p, char *err, size_t errlen)
{
    int n = comm->nranks;
    char remote_host[256] = "";
    int remote_rank = -1;
    /* With two names, ranks must agree on who serves whom: through the multiplexer,
     * whose sub-transports keep their store keys under "local/" and "remote/" (a rank
     * with no local peers still uses "remote/" keys, like its peers do). */
    int split = strcmp(local_name, remote_name) != 0;
    *single_p = !split && !local_only(comm, local_name);
    if (*single_p) {
        for (int r = 0; r < n; r++)
            local[r] = r != comm->rank;
        *mates_p = n - 1; /* until the host ids say */
        *cpus_p = own_cpus();
    } else {
        int st = exchange_host_ids(comm, comm->host_id, local, remote_host, sizeof(remote_host),
                                   &remote_rank, mates_p, cpus_p, err, errlen);
        if (st < 0)
            return st;
    }
    int nlocal = 0;
    for (int r = 0; r < n; r++)
        nlocal += local[r];
    *nlocal_p = nlocal;
    int nremote = n - 1 - nlocal;
    if (nremote > 0 && local_only(comm, local_name) && !strcmp(local_name, remote_name)) {
        snprintf(err, errlen,
                 "TUTTI_TRANSPORT=%s reaches only ranks on this host, but rank %d is on host "
                 "\"%s\" (this rank: \"%s\")",
                 local_name, remote_rank, remote_host, comm->host_id);
        return TUTTI_ERR_CONFIG;
    }
    return TUTTI_OK;
}

/* Load the transport for the local peers (ops[0], handle[0]) and the one for the remote
 * peers (ops[1], handle[1]), each only if it has peers; the same one is loaded once. */
static int load_transports(tutti_comm_t *comm, const char *local_name, const char *remote_name,
                           const int npeers[2], const tutti_transport_ops_v2_t *ops[2],
                           void *handle[2], char *err, size_t errlen)
{
    /* (auto without shm built in chose tcp for both halves in parse_spec) */
    if (npeers[0] > 0) {
        int st = tt_transport_load(local_name, comm->opts.plugin_path, &ops[0], &handle[0], err,
                                   errlen);
        if (st < 0)
            return st;
    }
    if (npeers[1] > 0 && (npeers[0] == 0 || strcmp(local_name, remote_name))) {
        int st = tt_transport_load(remote_name, comm->opts.plugin_path, &ops[1], &handle[1], err,
                                   errlen);
        if (st < 0) {
            tt_transport_unload(handle[0]);
            return st;
        }
    } else if (npeers[1] > 0) {
        ops[1] = ops[0]; /* the same transport for everyone */
    }
    return TUTTI_OK;
}

/* What a transport said of its failed create: its reason, or (one that failed without
 * saying why, e.g. out of memory) its status's. */
static const char *create_why(const tutti_comm_t *comm, int st)
{
    return comm->tp_error[0] ? comm->tp_error : tutti_strerror(st);
}

/* One transport for every peer: no multiplexer. */
static int create_single(tutti_comm_t *comm, const tutti_transport_ops_v2_t *ops, void *handle,
                         char *err, size_t errlen)
{
    comm->tp_ops = ops;
    comm->tp_handle = handle;
    snprintf(comm->tp_name, sizeof(comm->tp_name), "%s", comm->tp_ops->name);
    int st = comm->tp_ops->create(&comm->host, &comm->tp);
    if (st < 0) {
        comm->tp = NULL;
        snprintf(err, errlen, "transport %s failed to connect %d ranks: %s", comm->tp_ops->name,
                 comm->nranks, create_why(comm, st));
    }
    return st;
}

/* The multiplexer's sub-transports (the ones with peers, local first) and which serves
 * each peer; role_sub[role] the sub of role 0 (local) or 1 (remote), -1 if none. NULL
 * when out of memory (the transports are then unloaded). */
static mux_t *mux_new(const tutti_comm_t *comm, const unsigned char *local, const int npeers[2],
                      const tutti_transport_ops_v2_t *ops[2], void *handle[2], int role_sub[2])
{
    int n = comm->nranks;
    mux_t *m = calloc(1, sizeof(*m));
    int *peer_sub = calloc((size_t)n, sizeof(int));
    if (!m || !peer_sub) {
        free(m);
        free(peer_sub);
        tt_transport_unload(handle[0]);
        tt_transport_unload(handle[1]);
        return NULL;
    }
    m->nranks = n;
    m->spin_us = comm->opts.spin_us;
    m->peer_sub = peer_sub;
    for (int role = 0; role < 2; role++) {
        if (npeers[role] == 0)
            continue;
        mux_sub_t *s = &m->sub[m->nsub];
        role_sub[role] = m->nsub++;
        s->ops = ops[role];
        s->can_arm = tutti_tp_ops_has(s->ops, arm) && s->ops->arm;
        s->handle = handle[role];
        s->peers = calloc((size_t)n, 1);
        if (!s->peers) {
            mux_free(m);
            return NULL;
        }
    }
    for (int r = 0; r < n; r++) {
        peer_sub[r] = r == comm->rank ? -1 : role_sub[local[r] ? 0 : 1];
        if (peer_sub[r] >= 0)
            m->sub[peer_sub[r]].peers[r] = 1;
    }
    return m;
}

/* Create each sub-transport on a host of its own, which keeps its store keys apart and
 * names only its peers. */
static int mux_connect(tutti_comm_t *comm, mux_t *m, const int role_sub[2], const int npeers[2],
                       int local_auto, char *err, size_t errlen)
{
    /* Every rank creates its local transport first, then the remote one, so the
     * connection set-ups (each among the ranks it serves) cannot wait on each other. */
    int st = TUTTI_OK;
    for (int i = 0; i < m->nsub; i++) {
        mux_sub_t *s = &m->sub[i];
        int role = i == role_sub[0] ? 0 : 1;
        s->host = comm->host;
        s->host.peers = s->peers;
        s->host.ctx = s;
        s->host.store_set = sub_store_set;
        s->host.store_get = sub_store_get;
        s->host.config = sub_config;
        s->host.log = sub_log;
        s->host.error = sub_error;
        s->host.auth_answer = sub_auth_answer;
        s->host.setup_check = sub_setup_check;
        s->parent = &comm->host;
        s->kprefix = role == 0 ? "local" : "remote";
        uint64_t t0 = tt_now_ns();
        st = s->ops->create(&s->host, &s->tp);
        int spent_ms = (int)((tt_now_ns() - t0) / 1000000u),
            left_ms = s->host.timeout_ms - spent_ms;
        if (st < 0 && st != TUTTI_ERR_TIMEOUT && st != TUTTI_ERR_CONFIG && st != TUTTI_ERR_PLUGIN &&
            !comm->setup_peer_status && /* another rank failed: no second try over tcp */
            role == 0 && local_auto && strcmp(s->ops->name, "tcp") &&
            (s->host.timeout_ms <= 0 || left_ms > 0)) {
            /* auto's local transport failed (shm in a /dev/shm without room, say): its
             * set-up fails on every local rank or none (shm_setup.c, setup_ready), so
             * they all come here and meet again over tcp, under keys of their own, in
             * what is left of the timeout (a peer that never came is a timeout: no
             * second try) */
            int lowest = 1; /* the host's first rank warns, the others say it quietly */
            for (int r = 0; r < comm->rank; r++)
                lowest &= !s->peers[r];
            if (lowest)
                TT_WARN("transports: %s could not connect the %d local peers (%s); they go "
                        "over tcp instead",
                        s->ops->name, npeers[0], create_why(comm, st));
            else
                TT_INFO("transports: %s could not connect the %d local peers (%s); they go "
                        "over tcp instead",
                        s->ops->name, npeers[0], create_why(comm, st));
            const tutti_transport_ops_v2_t *tcp = NULL;
            void *th = NULL;
            if (tt_transport_load("tcp", comm->opts.plugin_path, &tcp, &th, err, errlen) == 0) {
                s->tp = NULL;
                tt_transport_unload(s->handle);
                s->ops = tcp;
                s->handle = th;
                s->can_arm = tutti_tp_ops_has(s->ops, arm) && s->ops->arm;
                s->kprefix = "local-tcp";
                if (s->host.timeout_ms > 0)
                    s->host.timeout_ms = left_ms;
                st = s->ops->create(&s->host, &s->tp);
                s->host.timeout_ms = comm->host.timeout_ms; /* for its waits from now on */
            }
        }
        if (st < 0) {
            s->tp = NULL;
            snprintf(err, errlen, "transport %s failed to connect its %d %s peers: %s",
                     s->ops->name, npeers[role], role == 0 ? "local" : "remote",
                     create_why(comm, st));
            return st;
        }
    }
    return st;
}

/* An "auto" spin (is_auto: opts.spin_us was negative) becomes this host's
 * (tt_spin_auto_us), before any transport reads it; with one transport for every peer
 * once more when the host ids are in (the transports read it as they wait). */
static void spin_resolve(tutti_comm_t *comm, int local_ranks, int cpus, int is_auto)
{
    comm->host_ranks = local_ranks; /* and for the cost model (a crowded host) */
    comm->host_cpus = cpus;
    if (!is_auto)
        return;
    comm->opts.spin_us = tt_spin_auto_us(local_ranks, cpus);
    comm->host.spin_us = comm->opts.spin_us;
    TT_INFO("spin: %d us before blocking (%d ranks on this host, %d CPUs between them)",
            comm->opts.spin_us, local_ranks, cpus);
}

/* The knobs of the built-in transports (docs/configuration.md, "(transport option)"):
 * names TUTTI_TRANSPORT_OPTIONS may hold whether or not their transport runs here. */
static const char *const builtin_knobs[] = {
    "TCP_CONGESTION",  "TCP_CONNECT", "SHM_RING_BYTES",    "SHM_STEP_BYTES",
    "SHM_NT_STORES",   "SHM_RESERVE", "SHM_CMA_BYTES",     "SHM_CMA_HINT_BYTES",
    "SHM_LIVENESS_MS", "IB_DEV",      "IB_GID_INDEX",      "IB_SLOTS",
    "IB_EAGER_BYTES",  "IB_MR_CACHE", "IB_MR_CACHE_BYTES", "IB_TIMEOUT",
    "IB_KEEPALIVE_MS", "IB_CONNECT",  "IB_MAX_RD_ATOMIC",  "SHM_RESERVE_AT",
};

/* Every other name a transport of this process asked for (a plugin's knobs), so that
 * TUTTI_TRANSPORT_OPTIONS may name them too. */
static pthread_mutex_t asked_lock = PTHREAD_MUTEX_INITIALIZER;
static char asked[64][48];
static int nasked;

static int is_builtin_knob(const char *name, size_t len)
{
    for (size_t i = 0; i < TT_ARRAY_SIZE(builtin_knobs); i++)
        if (strlen(builtin_knobs[i]) == len && !strncmp(builtin_knobs[i], name, len))
            return 1;
    return 0;
}

void tt_transports_knob_asked(const char *name)
{
    size_t len = strlen(name);
    if (is_builtin_knob(name, len) || len >= sizeof(asked[0]))
        return;
    pthread_mutex_lock(&asked_lock);
    int i = 0;
    while (i < nasked && strcmp(asked[i], name))
        i++;
    if (i == nasked && nasked < (int)TT_ARRAY_SIZE(asked))
        snprintf(asked[nasked++], sizeof(asked[0]), "%s", name);
    pthread_mutex_unlock(&asked_lock);
}

static int was_asked(const char *name, size_t len)
{
    int found = 0;
    pthread_mutex_lock(&asked_lock);
    for (int i = 0; i < nasked && !found; i++)
        found = strlen(asked[i]) == len && !strncmp(asked[i], name, len);
    pthread_mutex_unlock(&asked_lock);
    return found;
}

/* Edits (insert, delete, replace) from a (n bytes) to b, up to 3 (then 3). */
static int edits(const char *a, size_t n, const char *b)
{
    size_t m = strlen(b);
    if (n > 47 || m > 47 || (n > m ? n - m : m - n) > 2)
        return 3;
    int row[48];
    for (size_t j = 0; j <= m; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            best = TT_MIN(best, up + 1);
            row[j] = TT_MIN(best, row[j - 1] + 1);
            diag = up;
        }
    }
    return TT_MIN(row[m], 3);
}

/* After the transports' set-up: a warning (once per process) for each entry of
 * opts.transport_options that is not NAME=VALUE, names an option with a field of its own
 * (SOCKET_*, CHECKSUM, BIND, HOST_ID: the host answers those from the options, never from
 * there), or names no knob of the built-in transports nor any a transport of this process
 * asked for (a typo: the nearest knob is suggested). */
static void check_transport_options(const tutti_comm_t *comm)
{
    for (const char *e = comm->opts.transport_options; e && *e;) {
        const char *end = strchr(e, ',');
        size_t len = end ? (size_t)(end - e) : strlen(e);
        const char *eq = memchr(e, '=', len);
        size_t nlen = eq ? (size_t)(eq - e) : len;
        char entry[128];
        snprintf(entry, sizeof(entry), "%.*s", (int)TT_MIN(len, sizeof(entry) - 1), e);
        const char *why = NULL;
        char hint[96] = "";
        if (!len) {
            /* an empty entry (",," or a trailing ','): nothing */
        } else if (!eq || !nlen) {
            why = "is not NAME=VALUE";
        } else if (strncmp(e, "SOCKET_", 7) == 0 || (nlen == 8 && !strncmp(e, "CHECKSUM", 8)) ||
                   (nlen == 4 && !strncmp(e, "BIND", 4)) ||
                   (nlen == 7 && !strncmp(e, "HOST_ID", 7))) {
            why = "is an option of its own (its TUTTI_ variable, or its field): ignored here";
        } else if (!is_builtin_knob(e, nlen) && !was_asked(e, nlen)) {
            why = "names no knob of the transports: ignored";
            for (size_t i = 0; i < TT_ARRAY_SIZE(builtin_knobs) && !hint[0]; i++)
                if (edits(e, nlen, builtin_knobs[i]) <= 2)
                    snprintf(hint, sizeof(hint), " (%s?)", builtin_knobs[i]);
        }
        if (why && tt_warn_first("TRANSPORT_OPTIONS", entry))
            TT_WARN("TUTTI_TRANSPORT_OPTIONS: \"%s\" %s%s", entry, why, hint);
        e = end ? end + 1 : NULL;
    }
}

int tt_transports_create(tutti_comm_t *comm, char *err, size_t errlen)
{
    int n = comm->nranks;
    char local_name[128], remote_name[128];
    int st = parse_spec(comm, comm->opts.transport, local_name, remote_name, sizeof(local_name),
                        err, errlen);
    if (st < 0)
        return st;
    tt_host_id(comm->opts.host_id, comm->host_id, sizeof(comm->host_id));
    comm->host.host_id = comm->host_id;
    comm->host.peers = NULL;

    if (n == 1) { /* no peers: load the transport, connect nothing */
        spin_resolve(comm, 1, own_cpus(), comm->opts.spin_us < 0);
        st = tt_transport_load(local_name, comm->opts.plugin_path, &comm->tp_ops, &comm->tp_handle,
                               err, errlen);
        if (st == TUTTI_OK)
            snprintf(comm->tp_name, sizeof(comm->tp_name), "%s", comm->tp_ops->name);
        return st;
    }

    unsigned char *local = calloc((size_t)n, 1);
    if (!local) {
        snprintf(err, errlen, "out of memory (the map of %d ranks' hosts)", n);
        return TUTTI_ERR_NOMEM;
    }
    int npeers[2] = { 0, 0 }; /* local, remote */
    const tutti_transport_ops_v2_t *ops[2] = { NULL, NULL };
    void *handle[2] = { NULL, NULL };
    int role_sub[2] = { -1, -1 };
    mux_t *m = NULL;
    int cpus = 1, mates = 0, single = 0, spin_auto = comm->opts.spin_us < 0;
    st = classify_peers(comm, local_name, remote_name, local, &npeers[0], &mates, &cpus, &single,
                        err, errlen);
    if (st < 0)
        goto out;
    npeers[1] = n - 1 - npeers[0];
    spin_resolve(comm, mates + 1, cpus, spin_auto);
    st = load_transports(comm, local_name, remote_name, npeers, ops, handle, err, errlen);
    if (st < 0)
        goto out;
    if (!strcmp(local_name, remote_name)) {
        st = create_single(comm, ops[0] ? ops[0] : ops[1], ops[0] ? handle[0] : handle[1], err,
                           errlen);
        if (st == TUTTI_OK && single) {
            /* the host map and this host's ranks and CPUs, now that every rank is
             * connected (the transport reads the spin as it waits) */
            char remote_host[256];
            int remote_rank = -1;
            st = exchange_host_ids(comm, comm->host_id, local, remote_host, sizeof(remote_host),
                                   &remote_rank, &mates, &cpus, err, errlen);
            if (st == TUTTI_OK)
                spin_resolve(comm, mates + 1, cpus, spin_auto);
        }
        goto out;
    }
    if (!(m = mux_new(comm, local, npeers, ops, handle, role_sub))) {
        snprintf(err, errlen, "out of memory (the transports' multiplexer)");
        st = TUTTI_ERR_NOMEM;
        goto out;
    }
    /* auto chose the local peers' transport: if it cannot connect them, tcp does */
    st = mux_connect(comm, m, role_sub, npeers, spec_local_auto(comm->opts.transport), err, errlen);
    if (st < 0) {
        mux_free(m);
        goto out;
    }
    const char *lname = role_sub[0] >= 0 ? m->sub[role_sub[0]].ops->name : "-",
               *rname = role_sub[1] >= 0 ? m->sub[role_sub[1]].ops->name : "-";
    if (m->nsub == 2)
        snprintf(comm->tp_name, sizeof(comm->tp_name), "%s+%s", lname, rname);
    else
        snprintf(comm->tp_name, sizeof(comm->tp_name), "%s", m->sub[0].ops->name);
    TT_INFO("transports: %s for %d local peers, %s for %d remote peers", lname, npeers[0], rname,
            npeers[1]);
    comm->tp_ops = &mux_ops;
    comm->tp = m;
    comm->tp_handle = NULL;
out:
    free(local);
    if (st == TUTTI_OK) /* every transport has asked for its knobs by now */
        check_transport_options(comm);
    return st;
}

int tt_transports_props(const tutti_comm_t *comm, const tutti_tp_props_v2_t **props, int max)
{
    if (!comm->tp_ops || max < 1)
        return 0;
    if (comm->tp_ops != &mux_ops) {
        props[0] = &comm->tp_ops->props;
        return 1;
    }
    const mux_t *m = comm->tp;
    int n = 0;
    for (int i = 0; i < m->nsub && n < max; i++)
        props[n++] = &m->sub[i].ops->props;
    return n;
}
