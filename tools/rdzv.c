/* tools/rdzv.c: the elastic rendezvous of tutti-run (rdzv.h). */
#include "rdzv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
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

int tt_master_pick(const char *store, char *addr, size_t addrlen, int *port)
{
    char host[256];
    int sport = 0;
    struct sockaddr_storage me;
    socklen_t melen = sizeof(me);
    memset(&me, 0, sizeof(me));
    struct sockaddr_in *v4 = (struct sockaddr_in *)&me;
    v4->sin_family = AF_INET;
    v4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    melen = sizeof(*v4);
    if (store && tt_store_url_host(store, host, sizeof(host), &sport) == 0) {
        /* the address of this host's route to the store (no packet is sent) */
        struct addrinfo hints = { .ai_socktype = SOCK_DGRAM }, *ai = NULL;
        char ps[16];
        snprintf(ps, sizeof(ps), "%d", sport);
        if (getaddrinfo(host, ps, &hints, &ai) == 0 && ai) {
            int u = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
            socklen_t len = sizeof(me);
            if (u >= 0 && connect(u, ai->ai_addr, ai->ai_addrlen) == 0 &&
                getsockname(u, (struct sockaddr *)&me, &len) == 0)
                melen = len;
            if (u >= 0)
                close(u);
            freeaddrinfo(ai);
        }
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
        close(s);
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

int tt_rdzv_open(tt_rdzv_t *z, const char *tool, const char *url, const char *job_id)
{
    g_tool = tool;
    z->base = z->store = NULL;
    z->url = url;
    tutti_store_opts_t o;
    tutti_store_opts_init(&o);
    o.timeout_ms = z->timeout_ms;
    z->hosting = 0;
    if (!strncmp(url, "tcp://", 6)) {
        /* The first agent on the store's host serves it (torchrun's c10d rendezvous);
         * the others, whose bind fails (taken, or another host's address), connect. */
        tutti_store_opts_t so = o;
        so.is_server = 1;
        if (tutti_store_open(&z->base, url, &so) == 0)
            z->hosting = 1;
    }
    if (!z->base && tutti_store_open(&z->base, url, &o) < 0) {
        fprintf(stderr, "%s: elastic rendezvous: cannot open the store %s: %s\n", tool, url,
                tutti_store_last_error(NULL));
        return -1;
    }
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

/* In round z->round as agent z->idx: wait until the round closes. The agents it took,
 * or -1. Offers to close it at MAX, or at MIN or more once the count has not grown for
 * the last call. */
static int wait_closed(tt_rdzv_t *z, double deadline, char *why, size_t whylen)
{
    char key[64];
    int64_t seen = -1;
    double grew = now_ms(), nap = 1;
    for (;;) {
        int err = 0;
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
        }
        if (n >= z->max_nodes || (n >= z->min_nodes && now_ms() - grew >= z->last_call_ms)) {
            char v[32];
            snprintf(v, sizeof(v), "%d", (int)(n < z->max_nodes ? n : z->max_nodes));
            c = first_offer(z, rkey(key, sizeof(key), z->round, "closed"), v);
            if (!c)
                return -1;
            int took = atoi(c);
            free(c);
            return took;
        }
        if (now_ms() > deadline) {
            snprintf(why, whylen,
                     "round %" PRId64 ": %" PRId64 " of at least %d node(s) came within %d ms",
                     z->round, n, z->min_nodes, z->timeout_ms);
            return -1;
        }
        usleep((useconds_t)(nap * 1000));
        nap = nap < 50 ? nap * 2 : 50;
    }
}

/* The round's MASTER_ADDR and MASTER_PORT: its first agent picks them on its host (its
 * ranks are the first, torch's rank 0 among them) and publishes them. 0 or -1 (said). */
static int round_master(tt_rdzv_t *z)
{
    char key[64], v[128];
    rkey(key, sizeof(key), z->round, "master");
    if (z->idx == 0) {
        if (tt_master_pick(z->url, z->master_addr, sizeof(z->master_addr), &z->master_port) < 0) {
            fprintf(stderr, "%s: elastic: no free port for MASTER_PORT: %s\n", g_tool,
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
    void *got = NULL;
    size_t len = 0;
    if (tutti_store_get(z->store, key, &got, &len, z->timeout_ms) < 0) {
        store_err(z, key);
        return -1;
    }
    snprintf(v, sizeof(v), "%.*s", (int)(len < sizeof(v) - 1 ? len : sizeof(v) - 1), (char *)got);
    free(got);
    if (sscanf(v, "%63s %d", z->master_addr, &z->master_port) != 2) {
        fprintf(stderr, "%s: elastic: round %" PRId64 ": bad master address \"%s\"\n", g_tool,
                z->round, v);
        return -1;
    }
    return 0;
}

int tt_rdzv_join(tt_rdzv_t *z, char *why, size_t whylen)
{
    double deadline = now_ms() + z->timeout_ms;
    char key[64];
    why[0] = '\0';
    for (;;) {
        int over = job_over(z, why, whylen);
        if (over)
            return over < 0 ? -1 : TT_RDZV_FINISHED;
        z->round = counter(z, "round", 0);
        if (z->round < 0)
            return -1;
        int64_t n = counter(z, rkey(key, sizeof(key), z->round, "joined"), 1);
        if (n < 0)
            return -1;
        z->idx = (int)(n - 1);
        char np[32];
        snprintf(np, sizeof(np), "%d", z->np);
        snprintf(key, sizeof(key), "r%" PRId64 "/np/%d", z->round, z->idx);
        if (tutti_store_set(z->store, key, np, strlen(np)) < 0) {
            store_err(z, key);
            return -1;
        }
        int took = wait_closed(z, deadline, why, whylen);
        if (took < 0)
            return -1;
        if (z->idx < took) {
            z->nodes = took;
            z->rank0 = z->world = 0;
            for (int i = 0; i < took; i++) {
                void *v = NULL;
                size_t len = 0;
                snprintf(key, sizeof(key), "r%" PRId64 "/np/%d", z->round, i);
                if (tutti_store_get(z->store, key, &v, &len, z->timeout_ms) < 0) {
                    store_err(z, key);
                    return -1;
                }
                char s[32];
                snprintf(s, sizeof(s), "%.*s", (int)(len < 31 ? len : 31), (char *)v);
                free(v);
                int k = atoi(s);
                if (i < z->idx)
                    z->rank0 += k;
                z->world += k;
            }
            z->rounds++;
            return round_master(z);
        }
        /* late: the round runs without this agent; its agents start the next one */
        if (counter(z, rkey(key, sizeof(key), z->round, "waiting"), 1) < 0)
            return -1;
        fprintf(stderr,
                "%s: elastic: round %" PRId64 " took %d node(s) before this one; waiting for "
                "the next\n",
                g_tool, z->round, took);
        for (double nap = 10;; nap = nap < 200 ? nap * 2 : 200) {
            int64_t r = counter(z, "round", 0);
            if (r < 0)
                return -1;
            if (r > z->round)
                break;
            over = job_over(z, why, whylen);
            if (over)
                return over < 0 ? -1 : TT_RDZV_FINISHED;
            if (now_ms() > deadline) {
                snprintf(why, whylen,
                         "round %" PRId64 " (full or closed) did not end within %d ms to take "
                         "this node",
                         z->round, z->timeout_ms);
                return -1;
            }
            usleep((useconds_t)(nap * 1000));
        }
    }
}

static int step_round(tt_rdzv_t *z);

int tt_rdzv_poll(tt_rdzv_t *z, char *why, size_t whylen)
{
    char key[64];
    int err = 0;
    char *r = peek(z, rkey(key, sizeof(key), z->round, "restart"), &err);
    if (err)
        return -1;
    if (r) {
        snprintf(why, whylen, "%s", r);
        free(r);
        return step_round(z) < 0 ? -1 : 1; /* the ender may have died before stepping */
    }
    if (z->nodes >= z->max_nodes)
        return 0;
    int64_t w = counter(z, rkey(key, sizeof(key), z->round, "waiting"), 0);
    if (w < 0)
        return -1;
    if (w == 0)
        return 0;
    char reason[128];
    snprintf(reason, sizeof(reason), "scale: %" PRId64 " node(s) waiting to join %d", w, z->nodes);
    return tt_rdzv_end_round(z, reason, why, whylen) < 0 ? -1 : 1;
}

int tt_rdzv_end_round(tt_rdzv_t *z, const char *reason, char *why, size_t whylen)
{
    char key[64];
    char *r = first_offer(z, rkey(key, sizeof(key), z->round, "restart"), reason);
    if (!r)
        return -1;
    snprintf(why, whylen, "%s", r);
    free(r);
    return step_round(z);
}

/* The next round opens: every agent of an ended round offers the same step, one takes
 * it. 0 or -1 (said). */
static int step_round(tt_rdzv_t *z)
{
    char cur[32], next[32];
    snprintf(cur, sizeof(cur), "%" PRId64, z->round);
    snprintf(next, sizeof(next), "%" PRId64, z->round + 1);
    void *v = NULL;
    size_t len = 0;
    if (tutti_store_compare_set(z->store, "round", cur, strlen(cur), next, strlen(next), &v, &len) <
        0) {
        store_err(z, "round");
        return -1;
    }
    free(v);
    return 0;
}

void tt_rdzv_done(tt_rdzv_t *z)
{
    char key[64], v[64];
    int64_t done = counter(z, rkey(key, sizeof(key), z->round, "done"), 1);
    snprintf(v, sizeof(v), "round %" PRId64 ", %d node(s), %d rank(s)", z->round, z->nodes,
             z->world);
    tutti_store_set(z->store, "finished", v, strlen(v));
    if (!z->hosting || done < 0)
        return;
    /* the others still use this store: stay until they are through */
    double deadline = now_ms() + z->timeout_ms;
    while (done < z->nodes && now_ms() < deadline) {
        usleep(50000);
        int err = 0;
        char *r = peek(z, rkey(key, sizeof(key), z->round, "restart"), &err);
        int ended = r != NULL;
        free(r);
        if (ended || err)
            return; /* a later failure: the others learn that the job ran through */
        done = counter(z, rkey(key, sizeof(key), z->round, "done"), 0);
        if (done < 0)
            return;
    }
}

void tt_rdzv_give_up(tt_rdzv_t *z, const char *why)
{
    tutti_store_set(z->store, "given-up", why, strlen(why));
}

void tt_rdzv_close(tt_rdzv_t *z)
{
    if (z->store)
        tutti_store_close(z->store);
    if (z->base)
        tutti_store_close(z->base);
    z->store = z->base = NULL;
}
