/* The tests' transport host (see fake_host.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tutti/tutti.h>

#include "base/auth.h"
#include "fake_host.h"

static const char *fh_key(const th_host_t *t, const char *key, char *buf, size_t len)
{
    if (!t->prefix)
        return key;
    snprintf(buf, len, "%s%s", t->prefix, key);
    return buf;
}

static int fh_set(void *ctx, const char *key, const void *value, size_t len)
{
    th_host_t *t = ctx;
    char k[512];
    return tutti_store_set(t->store, fh_key(t, key, k, sizeof(k)), value, len);
}

static int fh_get(void *ctx, const char *key, void **value_p, size_t *len_p, int timeout_ms)
{
    th_host_t *t = ctx;
    char k[512];
    return tutti_store_get(t->store, fh_key(t, key, k, sizeof(k)), value_p, len_p, timeout_ms);
}

static void fh_free(void *v)
{
    free(v);
}

static const char *fh_config(void *ctx, const char *name)
{
    th_host_t *t = ctx;
    size_t nl = strlen(name);
    const char *e = t->knobs;
    for (int i = 0; e && *e && i < 8; i++) {
        size_t len = strcspn(e, ",");
        if (len > nl && e[nl] == '=' && !strncmp(e, name, nl)) {
            snprintf(t->knob_val[i], sizeof(t->knob_val[i]), "%.*s", (int)(len - nl - 1),
                     e + nl + 1);
            return t->knob_val[i];
        }
        e += len + (e[len] == ',');
    }
    char full[128];
    snprintf(full, sizeof(full), "TUTTI_%s", name);
    return getenv(full);
}

__attribute__((format(printf, 3, 4))) static void fh_log(void *ctx, int level, const char *fmt, ...)
{
    th_host_t *t = ctx;
    if (level > TUTTI_LOG_WARN && !getenv("TT_TEST_VERBOSE"))
        return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "[rank %d log] %s\n", t->h.rank, line);
}

__attribute__((format(printf, 5, 6))) static int fh_error(void *ctx, int status, int peer,
                                                          int err_no, const char *fmt, ...)
{
    th_host_t *t = ctx;
    (void)err_no;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->err, sizeof(t->err), fmt, ap);
    va_end(ap);
    t->nerr++;
    t->err_status = status;
    t->err_peer = peer;
    if (getenv("TT_TEST_VERBOSE"))
        fprintf(stderr, "[rank %d error] %s: %s\n", t->h.rank, tutti_status_name(status), t->err);
    return status;
}

/* What the library does with its secret (lib/base/auth.c); the transport never sees it. */
static int fh_auth(void *ctx, const char *context, const uint8_t challenge[32], uint8_t answer[32])
{
    const char *secret = ((th_host_t *)ctx)->secret;
    if (secret)
        tt_auth_answer(secret, strlen(secret), context, challenge, answer);
    return secret ? TUTTI_OK : TUTTI_ERR_UNSUPPORTED;
}

void th_host_init(th_host_t *t, tutti_store_t *store, int rank, int nranks, int timeout_ms,
                  const unsigned char *peers)
{
    memset(t, 0, sizeof(*t));
    t->store = store;
    t->err_peer = -2;
    t->h = (tutti_tp_host_v2_t){
        .size = sizeof(tutti_tp_host_v2_t),
        .abi_version = TUTTI_TRANSPORT_ABI_V1, /* the host struct's layout version */
        .rank = rank,
        .nranks = nranks,
        .timeout_ms = timeout_ms,
        .spin_us = 50,
        .ctx = t,
        .store_set = fh_set,
        .store_get = fh_get,
        .free_value = fh_free,
        .config = fh_config,
        .log = fh_log,
        .error = fh_error,
        .peers = peers,
        .auth_answer = fh_auth,
    };
}

int th_host_open(th_host_t *t, const char *dir, const char *prefix, int rank, int nranks,
                 int timeout_ms)
{
    tutti_store_t *base = NULL, *store = NULL;
    if (tutti_store_open_file(&base, dir, timeout_ms) != 0)
        return -1;
    if (tutti_store_open_prefixed(&store, base, prefix) != 0) {
        tutti_store_close(base);
        return -1;
    }
    th_host_init(t, store, rank, nranks, timeout_ms, NULL);
    t->base = base;
    return 0;
}

void th_host_close(th_host_t *t)
{
    if (t->base) {
        tutti_store_close(t->store);
        tutti_store_close(t->base);
        t->base = t->store = NULL;
    }
}

void th_req_set(tutti_tp_req_v2_t *r, int peer, void *buf, size_t len, uint64_t seq, uint64_t fp,
                uint64_t tag)
{
    memset(r, 0, sizeof(*r));
    r->peer = peer;
    r->buf = buf;
    r->len = len;
    r->env[0] = seq;
    r->env[1] = fp;
    r->env[2] = len;
    r->env[3] = tag;
}
