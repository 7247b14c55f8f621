/* tools/rdzv.c: the elastic rendezvous of tutti-run (rdzv.h). */
#include "rdzv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *g_tool = "tutti-run";

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void store_err(tt_rdzv_t *z, const char *what)
{
    fprintf(stderr, "%s: elastic rendezvous: %s: %s\n", g_tool, what,
            tutti_store_last_error(z->store ? z->store : z->base));
}

/* key = "r<round>/<rest>" */
static const char *rkey(char *buf, size_t len, int64_t round, const char *rest)
{
    snprintf(buf, len, "r%" PRId64 "/%s", round, rest);
    return buf;
}

/* A counter's value after adding delta, or -1 (said). */
static int64_t counter(tt_rdzv_t *z, const char *key, int64_t delta)
{
    int64_t v;
    if (tutti_store_add(z->store, key, delta, &v) < 0) {
        store_err(z, key);
        return -1;
    }
    return v;
}

/* A store value (malloc'ed, len bytes) as a string; NULL (v freed) when out of memory. */
static char *as_string(void *v, size_t len)
{
    char *s = realloc(v, len + 1);
    if (!s) {
        free(v);
        return NULL;
    }
    s[len] = '\0';
    return s;
}

/* key's value now (a string, malloc'ed), NULL when it is not set; *err_p on a store
 * failure (said). */
static char *peek(tt_rdzv_t *z, const char *key, int *err_p)
{
    int exists = 0;
    const char *k = key;
    if (tutti_store_check(z->store, &k, 1, &exists) < 0) {
        store_err(z, key);
        *err_p = 1;
        return NULL;
    }
    if (!exists)
        return NULL;
    void *v = NULL;
    size_t len = 0;
    if (tutti_store_get(z->store, key, &v, &len, 0) < 0) {
        store_err(z, key);
        *err_p = 1;
        return NULL;
    }
    char *s = as_string(v, len);
    if (!s)
        *err_p = 1;
    return s;
}

/* Sets key to value unless it is set; the value that stands (malloc'ed), NULL (said) on
 * a store failure. */
static char *first_offer(tt_rdzv_t *z, const char *key, const char *value)
{
    void *cur = NULL;
    size_t len = 0;
    if (tutti_store_compare_set(z->store, key, "", 0, value, strlen(value), &cur, &len) < 0) {
        store_err(z, key);
        return NULL;
    }
    return as_string(cur, len);
}

int tt_store_url_host(const char *url, char *host, size_t hostlen, int *port)
{
    const char *p;
    int redis = 0;
    if (!strncmp(url, "tcp://", 6)) {
        p = url + 6;
    } else if (!strncmp(url, "redis://", 8)) {
        p = url + 8;
        redis = 1;
        const char *at = strrchr(p, '@'), *slash = strchr(p, '/');
        if (at && (!slash || at < slash))
            p = at + 1;
    } else {
        return -1;
    }
    const char *end; /* of the host */
    if (*p == '[') {
        end = strchr(p, ']');
        if (!end)
            return -1;
        p++;
    } else {
        end = p + strcspn(p, ":/");
    }
    if (end == p || (size_t)(end - p) >= hostlen)
        return -1;
    int hlen = (int)(end - p);
    long v = 6379;
    if (*end == ']')
        end++;
    if (*end == ':') {
        char *e;
        v = strtol(end + 1, &e, 10);
        if (e == end + 1 || v < 1 || v > 65535 || (*e && *e != '/'))
            return -1;
    } else if (!redis || (*end && *end != '/')) {
        return -1;
    }
    snprintf(host, hostlen, "%.*s", hlen, p); /* only on success */
    *port = (int)v;
    return 0;
}

int tt_master_pick(const char *store, const char *local_addr, char *addr, size_t addrlen, int *port)
{
    char host[256];
    int sport = 0;
    struct sockaddr_storage me;
    socklen_t melen;
    memset(&me, 0, sizeof(me));
    struct sockaddr_in *v4 = (struct sockaddr_in *)&me;
    v4->sin_family = AF_INET;
    v4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    melen = sizeof(*v4);
    if (local_addr && *local_addr) { /* torchrun's --local-addr: this host's, given */
        struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST },
                        *ai = NULL;
        int e = getaddrinfo(local_addr, NULL, &hints, &ai);
        if (e) {
            hints.ai_flags = 0;
            e = getaddrinfo(local_addr, NULL, &hints, &ai);
        }
        if (e || !ai || ai->ai_addrlen > sizeof(me)) {
            if (ai)
                freeaddrinfo(ai);
            errno = EADDRNOTAVAIL;
            return -1;
        }
        memcpy(&me, ai->ai_addr, ai->ai_addrlen);
        melen = ai->ai_addrlen;
        freeaddrinfo(ai);
    } else if (store && tt_store_url_host(store, host, sizeof(host), &sport) == 0) {
        /* the address of this host's route to the store (no packet is sent); a store
         * host that does not resolve or route is an error, not a silent loopback */
        struct addrinfo hints = { .ai_socktype = SOCK_DGRAM }, *ai = NULL;
        char ps[16];
        snprintf(ps, sizeof(ps), "%d", sport);
        if (getaddrinfo(host, ps, &hints, &ai) != 0 || !ai) {
            errno = EHOSTUNREACH;
            return -1;
        }
        int u = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        socklen_t len = sizeof(me);
        int ok = u >= 0 && connect(u, ai->ai_addr, ai->ai_addrlen) == 0 &&
                 getsockname(u, (struct sockaddr *)&me, &len) == 0;
        int e = errno;
        if (u >= 0)
            close(u);
        freeaddrinfo(ai);
        if (!ok) {
            errno = e;
            return -1;
        }
        melen = len;
    }
    int s = socket(me.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    if (me.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&me)->sin6_port = 0;
    else
        v4->sin_port = 0;
    socklen_t len = melen;
    if (bind(s, (struct sockaddr *)&me, melen) < 0 ||
        getsockname(s, (struct sockaddr *)&me, &len) < 0) {
        int e = errno;
        close(s);
        errno = e;
        return -1;
    }
    close(s);
    const void *a = me.ss_family == AF_INET6
                        ? (const void *)&((struct sockaddr_in6 *)&me)->sin6_addr
                        : (const void *)&v4->sin_addr;
    if (!inet_ntop(me.ss_family, a, addr, (socklen_t)addrlen))
        return -1;
    *port = ntohs(me.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&me)->sin6_port
                                           : v4->sin_port);
    return 0;
}

/* Whether z->stop says stop (its status kept in z->stop_status). */
static int stopping(tt_rdzv_t *z)
{
    int s = z->stop ? z->stop(z->stop_ctx) : 0;
    if (s)
        z->stop_status = s;
    return s != 0;
}

int tt_rdzv_open(tt_rdzv_t *z, const char *tool, const char *url, const char *job_id, int host_ok)
{
    g_tool = tool;
    z->base = z->store = NULL;
    z->url = url;
    z->ran_round = -1;
    if (!z->keep_alive_ms)
        z->keep_alive_ms = TT_RDZV_KEEP_ALIVE_MS;
    if (!z->keep_alive_max)
        z->keep_alive_max = TT_RDZV_KEEP_ALIVE_MAX;
    if (!z->read_timeout_ms)
        z->read_timeout_ms = TT_RDZV_READ_TIMEOUT_MS;
    if (!z->monitor_ms)
        z->monitor_ms = TT_RDZV_MONITOR_MS;
    tutti_store_opts_t o;
    tutti_store_opts_init(&o);
    o.timeout_ms = z->read_timeout_ms;
    z->hosting = 0;
    int tcp = !strncmp(url, "tcp://", 6);
    if (tcp && host_ok) {
        /* The first agent on the store's host serves it (torchrun's c10d rendezvous);
         * the others, whose bind fails (taken, or another host's address), connect. */
        tutti_store_opts_t so = o;
        so.is_server = 1;
        if (tutti_store_open(&z->base, url, &so) == 0) {
            z->hosting = 1;
            z->url = tutti_store_url(z->base); /* a port 0 made real */
        }
    }
    /* a tcp server may come later (its agent starts after this one): try again in
     * short attempts until the rendezvous timeout, heeding a stop between them */
    double deadline = now_ms() + z->timeout_ms;
    while (!z->base) {
        if (tcp)
            o.timeout_ms = 1000;
        int rc = tutti_store_open(&z->base, url, &o);
        if (rc == 0)
            break;
        if (!tcp || rc != TUTTI_ERR_TIMEOUT || now_ms() >= deadline) {
            fprintf(stderr, "%s: elastic rendezvous: cannot open the store %s: %s\n", tool, url,
                    tutti_store_last_error(NULL));
            return -1;
        }
        if (stopping(z))
            return TT_RDZV_STOPPED;
    }
    tutti_store_set_timeout(z->base, z->read_timeout_ms);
    char prefix[256];
    snprintf(prefix, sizeof(prefix), "tutti/elastic/%s/", job_id);
    if (tutti_store_open_prefixed(&z->store, z->base, prefix) < 0) {
        fprintf(stderr, "%s: elastic rendezvous: %s\n", tool, tutti_store_last_error(z->base));
        tutti_store_close(z->base);
        z->base = NULL;
        return -1;
    }
    return 0;
}

/* Whether the job is over: finished or given up (why says which). -1 on a store
 * failure. */
static int job_over(tt_rdzv_t *z, char *why, size_t whylen)
{
    int err = 0;
    char *v = peek(z, "finished", &err);
    if (!v && !err) {
        v = peek(z, "given-up", &err);
        if (v)
            snprintf(why, whylen, "the job gave up: %s", v);
    } else if (v) {
        snprintf(why, whylen, "the job ran through (%s)", v);
    }
    int over = v != NULL;
    free(v);
    return err ? -1 : over;
}

/* ---- heartbeats ---- */

/* This agent's beat, when one is due (or now, with force). 0 or -1 (said). */
static int beat(tt_rdzv_t *z, int force)
{
    if (!force && now_ms() - z->beat_at < z->keep_alive_ms)
        return 0;
    char key[64];
    snprintf(key, sizeof(key), "r%" PRId64 "/beat/%d", z->round, z->idx);
    z->beat_at = now_ms();
    return counter(z, key, 1) < 0 ? -1 : 0;
}

/* Starts watching n agents' beats of this round afresh. 0 or -1 (out of memory). */
static int watch(tt_rdzv_t *z, int n)
{
    if (n > z->nseen) {
        int64_t *s = realloc(z->seen, (size_t)n * sizeof(*s));
        if (s)
            z->seen = s;
        double *a = s ? realloc(z->seen_at, (size_t)n * sizeof(*a)) : NULL;
        if (!a) {
            fprintf(stderr, "%s: elastic rendezvous: out of memory\n", g_tool);
            return -1;
        }
        z->seen_at = a;
    }
    z->nseen = n;
    for (int i = 0; i < n; i++)
        z->seen[i] = -1, z->seen_at[i] = now_ms();
    z->check_at = now_ms();
    return 0;
}

/* Looks at the watched agents' beats (at most every keep-alive interval): the first
 * gone (its beat unmoved for keep_alive_max intervals), else -1; -2 on a store failure.
 * from..to-1: the agents to look at (this one skipped). */
static int first_gone(tt_rdzv_t *z, int from, int to)
{
    double now = now_ms();
    if (now - z->check_at < z->keep_alive_ms)
        return -1;
    z->check_at = now;
    if (to > z->nseen)
        to = z->nseen;
    for (int i = from; i < to; i++) {
        if (i == z->idx)
            continue;
        char key[64];
        snprintf(key, sizeof(key), "r%" PRId64 "/beat/%d", z->round, i);
        int64_t v = counter(z, key, 0);
        if (v < 0)
            return -2;
        if (v != z->seen[i])
            z->seen[i] = v, z->seen_at[i] = now;
        else if (now - z->seen_at[i] > (double)z->keep_alive_ms * z->keep_alive_max)
            return i;
    }
    return -1;
}

static int step_round(tt_rdzv_t *z, const char *reason);

/* The round's end if one stands (the round counter stepped): 1 (why set), 0 when not
 * ended, -1 (said). */
static int round_ended(tt_rdzv_t *z, char *why, size_t whylen)
{
    char key[64];
    int err = 0;
    char *r = peek(z, rkey(key, sizeof(key), z->round, "restart"), &err);
    if (err)
        return -1;
    if (!r || !strncmp(r, "done:", 5)) { /* "done:": the round ran through */
        free(r);
        return 0;
    }
    snprintf(why, whylen, "%s", r);
    int st = step_round(z, r); /* the ender may have died before stepping */
    free(r);
    return st < 0 ? -1 : 1;
}

/* Ends the round because agent i is gone. 1 (why set), or -1. */
static int end_gone(tt_rdzv_t *z, int i, const char *when, char *why, size_t whylen)
{
    char reason[160];
    snprintf(reason, sizeof(reason),
             "scale: node %d stopped answering%s (no heartbeat for %lld ms)", i, when,
             (long long)z->keep_alive_ms * z->keep_alive_max);
    return tt_rdzv_end_round(z, reason, why, whylen) < 0 ? -1 : 1;
}

/* wait_step's: the job is over (ran through or gave up; why says which) */
#define WAIT_OVER 3

/* Ends the round because this agent was told to stop. TT_RDZV_STOPPED (or -1). */
static int end_stopped(tt_rdzv_t *z, char *why, size_t whylen)
{
    char reason[160];
    snprintf(reason, sizeof(reason), "scale: node %d left (%s)", z->idx,
             z->stop_status == 124 ? "--timeout" : strsignal(z->stop_status - 128));
    if (tt_rdzv_end_round(z, reason, why, whylen) < 0)
        return -1;
    snprintf(why, whylen, "%s", reason);
    return TT_RDZV_STOPPED;
}

/* The look every wait and poll takes at the round, agents from..to-1 watched: ended by
 * another (1, why set, stepped), this agent's beat, an agent gone (the round ended for it:
 * 1). 0 when none of it; -1 on a store failure. */
static int look(tt_rdzv_t *z, int from, int to, const char *when, char *why, size_t whylen)
{
    int e = round_ended(z, why, whylen);
    if (e)
        return e;
    if (beat(z, 0) < 0)
        return -1;
    int g = first_gone(z, from, to);
    if (g == -2)
        return -1;
    return g >= 0 ? end_gone(z, g, when, why, whylen) : 0;
}

/* One wait step (a nap growing to 50 ms) in round z->round as agent z->idx, the agents
 * from..to-1 watched: 0 to go on waiting; else what the wait returns: 1 ended (why),
 * TT_RDZV_STOPPED, WAIT_OVER, -1 (a store failure, or the deadline: said in why). */
static int wait_step(tt_rdzv_t *z, double *nap, double deadline, int from, int to,
                     const char *waiting_for, char *why, size_t whylen)
{
    if (stopping(z))
        return end_stopped(z, why, whylen);
    /* the previous round gave up just as this agent stepped into the next (rare): looked
     * at with the heartbeats, every keep-alive interval, not every nap */
    int e = now_ms() - z->check_at >= z->keep_alive_ms ? job_over(z, why, whylen) : 0;
    if (e)
        return e < 0 ? -1 : WAIT_OVER;
    e = look(z, from, to, " before the round started", why, whylen);
    if (e)
        return e;
    if (deadline && now_ms() > deadline) {
        snprintf(why, whylen, "round %" PRId64 ": %s within %d ms", z->round, waiting_for,
                 z->timeout_ms);
        return -1;
    }
    usleep((useconds_t)(*nap * 1000));
    *nap = *nap < 50 ? *nap * 2 : 50;
    return 0;
}

/* In round z->round as agent z->idx: wait until the round closes. The agents it took;
 * or below 0: -1 (failed, or timed out), else -(1 + wait_step's code). Offers to
 * close it at MAX, or at MIN or more once the count has not grown for the last call. */
static int wait_closed(tt_rdzv_t *z, double deadline, char *why, size_t whylen)
{
    char key[64];
    int64_t seen = -1;
    double grew = now_ms(), nap = 1;
    int err = 0;
    char *x = peek(z, rkey(key, sizeof(key), z->round, "expect"), &err);
    int expect = x ? atoi(x) : 0;
    free(x);
    if (err)
        return -1;
    for (;;) {
        char *c = peek(z, rkey(key, sizeof(key), z->round, "closed"), &err);
        if (err)
            return -1;
        if (c) {
            int n = atoi(c);
            free(c);
            return n;
        }
        int64_t n = counter(z, rkey(key, sizeof(key), z->round, "joined"), 0);
        if (n < 0)
            return -1;
        if (n != seen) {
            seen = n;
            grew = now_ms();
            if (watch(z, (int)(n < z->max_nodes ? n : z->max_nodes)) < 0)
                return -1;
        }
        /* the last call, longer while the previous round's agents are still stopping */
        double quiet = z->last_call_ms + (n < expect ? z->stop_grace_ms : 0);
        if (n >= z->max_nodes || (n >= z->min_nodes && now_ms() - grew >= quiet)) {
            char v[32];
            snprintf(v, sizeof(v), "%d", (int)(n < z->max_nodes ? n : z->max_nodes));
            c = first_offer(z, rkey(key, sizeof(key), z->round, "closed"), v);
            if (!c)
                return -1;
            int took = atoi(c);
            free(c);
            return took;
        }
        char what[96];
        snprintf(what, sizeof(what), "%" PRId64 " of at least %d node(s) came", n, z->min_nodes);
        int w = wait_step(z, &nap, deadline, 0, (int)n, what, why, whylen);
        if (w)
            return w < 0 ? -1 : -(1 + w);
    }
}

/* Waits for key, written by agent owner of this round. Its value (malloc'ed); NULL on
 * a wait that ended otherwise: *st_p as wait_step's. */
static char *wait_key(tt_rdzv_t *z, const char *key, int owner, double deadline, int *st_p,
                      char *why, size_t whylen)
{
    double nap = 1;
    char what[128];
    snprintf(what, sizeof(what), "node %d did not write %s", owner, key);
    for (;;) {
        int err = 0;
        char *v = peek(z, key, &err);
        if (v || err) {
            *st_p = err ? -1 : 0;
            return v;
        }
        int w = wait_step(z, &nap, deadline, owner, owner + 1, what, why, whylen);
        if (w) {
            *st_p = w;
            return NULL;
        }
    }
}

/* The round's MASTER_ADDR and MASTER_PORT: its first agent picks them on its host (its
 * ranks are the first, torch's rank 0 among them) and publishes them. 0, or as
 * wait_step. */
static int round_master(tt_rdzv_t *z, const char *local_addr, double deadline, char *why,
                        size_t whylen)
{
    char key[64], v[128];
    rkey(key, sizeof(key), z->round, "master");
    if (z->idx == 0) {
        if (tt_master_pick(z->url, local_addr, z->master_addr, sizeof(z->master_addr),
                           &z->master_port) < 0) {
            snprintf(why, whylen, "no address and free port for MASTER_ADDR/MASTER_PORT%s%s: %s",
                     local_addr ? " on --local-addr " : "", local_addr ? local_addr : "",
                     strerror(errno));
            return -1;
        }
        snprintf(v, sizeof(v), "%s %d", z->master_addr, z->master_port);
        if (tutti_store_set(z->store, key, v, strlen(v)) < 0) {
            store_err(z, key);
            return -1;
        }
        return 0;
    }
    int st = 0;
    char *got = wait_key(z, key, 0, deadline, &st, why, whylen);
    if (!got)
        return st ? st : -1;
    snprintf(v, sizeof(v), "%s", got);
    free(got);
    if (sscanf(v, "%63s %d", z->master_addr, &z->master_port) != 2) {
        snprintf(why, whylen, "round %" PRId64 ": bad master address \"%s\"", z->round, v);
        return -1;
    }
    return 0;
}

/* The round's agents and ranks (the agents took), this one's first rank. 0, or as
 * wait_step. */
static int round_ranks(tt_rdzv_t *z, int took, double deadline, char *why, size_t whylen)
{
    char key[64];
    z->nodes = took;
    z->rank0 = z->world = 0;
    for (int i = 0; i < took; i++) {
        snprintf(key, sizeof(key), "r%" PRId64 "/np/%d", z->round, i);
        int st = 0;
        char *v = wait_key(z, key, i, deadline, &st, why, whylen);
        if (!v)
            return st ? st : -1;
        int k = atoi(v);
        free(v);
        if (k < 1 || (int64_t)z->world + k > INT32_MAX) {
            snprintf(why, whylen, "round %" PRId64 ": node %d's rank count %d is out of range",
                     z->round, i, k);
            return -1;
        }
        if (i < z->idx)
            z->rank0 += k;
        z->world += k;
    }
    return 0;
}

/* A late agent: wait until round z->round ends (its agents start the next one for this
 * agent, unless at MAX), ending it if they are gone. 0 to join again; as wait_step
 * else (TT_RDZV_FINISHED when the job is over). */
static int wait_late(tt_rdzv_t *z, int took, double deadline, char *why, size_t whylen)
{
    char key[64];
    if (counter(z, rkey(key, sizeof(key), z->round, "waiting"), 1) < 0)
        return -1;
    z->waited = 1;
    fprintf(stderr,
            "%s: elastic: round %" PRId64 " took %d node(s) before this one; waiting for "
            "the next\n",
            g_tool, z->round, took);
    if (watch(z, took) < 0)
        return -1;
    int idx = z->idx;
    z->idx = -1; /* a late agent beats nowhere and watches every taken agent */
    int st = 0;
    for (double nap = 10;; nap = nap < 200 ? nap * 2 : 200) {
        int64_t r = counter(z, "round", 0);
        if (r < 0) {
            st = -1;
            break;
        }
        if (r > z->round)
            break;
        int over = job_over(z, why, whylen);
        if (over) {
            st = over < 0 ? -1 : TT_RDZV_FINISHED;
            break;
        }
        if (stopping(z)) {
            counter(z, rkey(key, sizeof(key), z->round, "waiting"), -1);
            snprintf(why, whylen, "left while waiting");
            st = TT_RDZV_STOPPED;
            break;
        }
        int g = first_gone(z, 0, took);
        if (g == -2) {
            st = -1;
            break;
        }
        if (g >= 0) { /* e.g. every agent of the round was killed: a rerun takes over */
            z->idx = idx;
            if (end_gone(z, g, "", why, whylen) < 0)
                st = -1;
            fprintf(stderr, "%s: elastic: round %" PRId64 " ended (%s)\n", g_tool, z->round, why);
            break;
        }
        /* an agent serving the store waits on: its leaving would end the running round */
        if (now_ms() > deadline && !z->hosting) {
            snprintf(why, whylen,
                     "round %" PRId64 " (full or closed) did not end within %d ms to take "
                     "this node",
                     z->round, z->timeout_ms);
            st = -1;
            break;
        }
        usleep((useconds_t)(nap * 1000));
    }
    if (st == -1) /* a spare that gave up is no longer waiting */
        counter(z, rkey(key, sizeof(key), z->round, "waiting"), -1);
    z->idx = idx;
    return st;
}

int tt_rdzv_join(tt_rdzv_t *z, const char *local_addr, char *why, size_t whylen)
{
    double deadline = now_ms() + z->timeout_ms;
    char key[64];
    why[0] = '\0';
    for (;;) {
        int over = job_over(z, why, whylen);
        if (over)
            return over < 0 ? -1 : TT_RDZV_FINISHED;
        if (stopping(z)) {
            snprintf(why, whylen, "left before joining a round");
            return TT_RDZV_STOPPED;
        }
        z->round = counter(z, "round", 0);
        if (z->round < 0)
            return -1;
        z->nodes = 0; /* until this round is taken */
        int err = 0;
        char *f = peek(z, rkey(key, sizeof(key), z->round, "failures"), &err);
        if (err)
            return -1;
        z->failures = f ? strtoll(f, NULL, 10) : 0;
        free(f);
        int64_t n = counter(z, rkey(key, sizeof(key), z->round, "joined"), 1);
        if (n < 0)
            return -1;
        z->idx = (int)(n - 1);
        if (z->idx < z->max_nodes && beat(z, 1) < 0)
            return -1;
        char np[32];
        snprintf(np, sizeof(np), "%d", z->np);
        snprintf(key, sizeof(key), "r%" PRId64 "/np/%d", z->round, z->idx);
        if (tutti_store_set(z->store, key, np, strlen(np)) < 0) {
            store_err(z, key);
            return -1;
        }
        int took = wait_closed(z, deadline, why, whylen);
        if (took == -(1 + 1))
            continue; /* the round ended before it started: the next one */
        if (took == -(1 + TT_RDZV_STOPPED))
            return TT_RDZV_STOPPED;
        if (took == -(1 + WAIT_OVER))
            return TT_RDZV_FINISHED;
        if (took < 0)
            return -1;
        if (z->idx < took) {
            if (watch(z, took) < 0)
                return -1;
            int st = round_ranks(z, took, deadline, why, whylen);
            if (!st)
                st = round_master(z, local_addr, deadline, why, whylen);
            if (st == 1)
                continue;
            if (st)
                return st == WAIT_OVER ? TT_RDZV_FINISHED : st;
            z->rounds++;
            z->ran_round = z->round;
            return 0;
        }
        int st = wait_late(z, took, deadline, why, whylen);
        if (st)
            return st;
    }
}

int tt_rdzv_poll(tt_rdzv_t *z, char *why, size_t whylen)
{
    char key[64];
    int e = look(z, 0, z->nodes, "", why, whylen);
    if (e)
        return e;
    if (z->nodes >= z->max_nodes)
        return 0;
    int64_t w = counter(z, rkey(key, sizeof(key), z->round, "waiting"), 0);
    if (w <= 0)
        return w < 0 ? -1 : 0;
    /* a round some of whose nodes are through is let finish */
    int64_t d = counter(z, rkey(key, sizeof(key), z->round, "done"), 0);
    if (d != 0)
        return d < 0 ? -1 : 0;
    char reason[128];
    snprintf(reason, sizeof(reason), "scale: %" PRId64 " node(s) waiting to join %d", w, z->nodes);
    return tt_rdzv_end_round(z, reason, why, whylen) < 0 ? -1 : 1;
}

int tt_rdzv_failure_grace(tt_rdzv_t *z, char *why, size_t whylen)
{
    if (z->nodes < 2)
        return 0;
    /* only the round's end is looked at: a spare waiting or a node gone does not end it
     * meanwhile, where it would stand in place of this failure and escape the count */
    for (double end = now_ms() + TT_RDZV_FAILURE_GRACE_MS;;) {
        int e = round_ended(z, why, whylen);
        if (e || now_ms() >= end)
            return e;
        if (beat(z, 0) < 0)
            return -1;
        usleep(100000); /* every agent of a job that fails at once looks: not too often */
    }
}

int tt_rdzv_end_round(tt_rdzv_t *z, const char *reason, char *why, size_t whylen)
{
    char key[64];
    char *r = first_offer(z, rkey(key, sizeof(key), z->round, "restart"), reason);
    if (!r)
        return -1;
    snprintf(why, whylen, "%s", r);
    int st;
    if (strncmp(r, "done:", 5)) {
        st = step_round(z, r);
    } else { /* ran through: no next round; finished, in case its agents died first */
        st = tutti_store_set(z->store, "finished", r + 6, strlen(r + 6));
        if (st < 0)
            store_err(z, "finished");
    }
    free(r);
    return st;
}

/* The next round opens: every agent of an ended round offers the same step (its failure
 * count first, alike from each), one takes it. reason: the round's, that stood. 0 or -1
 * (said). */
static int step_round(tt_rdzv_t *z, const char *reason)
{
    char cur[32], next[32], key[64];
    snprintf(cur, sizeof(cur), "%" PRId64, z->round);
    snprintf(next, sizeof(next), "%" PRId64, z->round + 1);
    char f[32];
    int failed = !strncmp(reason, "failure", 7);
    snprintf(f, sizeof(f), "%" PRId64, z->failures + failed);
    char *v = first_offer(z, rkey(key, sizeof(key), z->round + 1, "failures"), f);
    if (!v)
        return -1;
    free(v);
    if (failed && z->failures + 1 > z->max_restarts) {
        /* restarts used up: said before the step, so that no agent joins the next
         * round to wait there for nodes that stop */
        char gave[600];
        snprintf(gave, sizeof(gave), "round %" PRId64 ": %s; --max-restarts %d used up", z->round,
                 reason, z->max_restarts);
        v = first_offer(z, "given-up", gave);
        if (!v)
            return -1;
        free(v);
    }
    if (z->nodes > 0) { /* a round that ran: its agents come back, but one that left */
        int lost = strstr(reason, " left (") || strstr(reason, "stopped answering");
        snprintf(f, sizeof(f), "%d", z->nodes - (lost ? 1 : 0));
        v = first_offer(z, rkey(key, sizeof(key), z->round + 1, "expect"), f);
        if (!v)
            return -1;
        free(v);
    }
    v = NULL;
    size_t len = 0;
    if (tutti_store_compare_set(z->store, "round", cur, strlen(cur), next, strlen(next),
                                (void **)&v, &len) < 0) {
        store_err(z, "round");
        return -1;
    }
    free(v);
    return 0;
}

int tt_rdzv_done(tt_rdzv_t *z, char *why, size_t whylen)
{
    char key[64], v[128];
    int64_t done = counter(z, rkey(key, sizeof(key), z->round, "done"), 1);
    if (done < 0)
        return -1;
    /* torchrun's exit barrier, bounded by the others' heartbeats rather than a time:
     * their ranks may run long after these finished */
    for (double nap = 1; done < z->nodes;) {
        if (stopping(z))
            return end_stopped(z, why, whylen);
        int e = look(z, 0, z->nodes, "", why, whylen);
        if (e)
            return e;
        usleep((useconds_t)(nap * 1000));
        double cap = z->monitor_ms < z->keep_alive_ms ? z->monitor_ms : z->keep_alive_ms;
        nap = nap * 2 < cap ? nap * 2 : cap;
        done = counter(z, rkey(key, sizeof(key), z->round, "done"), 0);
        if (done < 0)
            return -1;
    }
    /* Every agent's ranks passed, unless the round was ended meanwhile (an agent gone, or
     * one that left): the round's end is one compare-and-set, so the job's end and a
     * restart never both stand; "done:" standing sets `finished` */
    snprintf(v, sizeof(v), "done: round %" PRId64 ", %d node(s), %d rank(s)", z->round, z->nodes,
             z->world);
    if (tt_rdzv_end_round(z, v, why, whylen) < 0)
        return -1;
    return strncmp(why, "done:", 5) ? 1 : 0;
}

/* Before an agent serving a tcp:// store closes it: the other agents of the job's last
 * round still need it to see how the round ended. That round is the one `finished` or
 * `given-up` names (this agent may have waited on it as a spare, or have seen the end
 * from the next round), else this agent's own. Waits until its agents (but this one)
 * said they saw the end (r<R>/left), bounded by the stop grace and the heartbeat window. */
static void linger(tt_rdzv_t *z)
{
    char key[64];
    int64_t round = z->nodes > 0 ? z->round : -1;
    int others = z->nodes - 1;
    int err = 0;
    char *v = peek(z, "finished", &err);
    if (!v && !err)
        v = peek(z, "given-up", &err);
    long long r;
    if (v && sscanf(v, "round %lld", &r) == 1 && r >= 0) {
        char *c = peek(z, rkey(key, sizeof(key), r, "closed"), &err);
        if (c) {
            round = r;
            others = atoi(c) - (r == z->ran_round);
        }
        free(c);
    }
    free(v);
    if (round < 0 || others <= 0)
        return;
    double deadline = now_ms() + z->stop_grace_ms + (double)z->keep_alive_ms * z->keep_alive_max;
    for (;;) {
        int64_t left = counter(z, rkey(key, sizeof(key), round, "left"), 0);
        if (left < 0 || left >= others || now_ms() > deadline || stopping(z))
            return;
        usleep(10000);
    }
}

int tt_rdzv_beat(tt_rdzv_t *z)
{
    return beat(z, 0);
}

void tt_rdzv_close(tt_rdzv_t *z)
{
    if (z->store && z->hosting) {
        linger(z);
    } else if (z->store && z->ran_round >= 0) {
        char key[64]; /* the round this agent ran in last: the host waits for it */
        counter(z, rkey(key, sizeof(key), z->ran_round, "left"), 1);
    }
    if (z->store)
        tutti_store_close(z->store);
    if (z->base)
        tutti_store_close(z->base);
    z->store = z->base = NULL;
    free(z->seen);
    free(z->seen_at);
    z->seen = NULL;
    z->seen_at = NULL;
    z->nseen = 0;
}
