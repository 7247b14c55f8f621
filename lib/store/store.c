/* Public store functions: argument checks, URL parsing, prefixed views, error recording,
 * and the generic wait/multi_get for backends that lack them. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/auth.h"
#include "store/store_gc.h"
#include "store/store_impl.h"

/* Failures of the open functions have no handle to be recorded on; the caller's thread
 * keeps the latest one, returned by tutti_store_last_error(NULL). */
static __thread char open_error[1024];

/* Record "store URL: op 'key': cause" as the handle's last error. */
static int store_fail(tutti_store_t *s, int st, const char *op, const char *key, const char *fmt,
                      ...) __attribute__((format(printf, 5, 6)));
static int store_fail(tutti_store_t *s, int st, const char *op, const char *key, const char *fmt,
                      ...)
{
    char cause[600];
    char kd[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cause, sizeof(cause), fmt, ap);
    va_end(ap);
    if (!s) {
        snprintf(open_error, sizeof(open_error), "store: %s: %s", op, cause);
        return st;
    }
    char msg[sizeof(s->last_error)];
    if (key)
        snprintf(msg, sizeof(msg), "store %s: %s '%s': %s (%s)", s->url, op,
                 tt_store_key_display(key, kd, sizeof(kd)), cause, tutti_status_name(st));
    else
        snprintf(msg, sizeof(msg), "store %s: %s: %s (%s)", s->url, op, cause,
                 tutti_status_name(st));
    pthread_mutex_lock(&s->err_lock);
    memcpy(s->last_error, msg, sizeof(msg));
    pthread_mutex_unlock(&s->err_lock);
    TT_TRACE("%s", msg);
    return st;
}

void tt_store_note(tutti_store_t *s, const char *op, const char *key, int st, const char *fmt, ...)
{
    char cause[600], full[TUTTI_STORE_MAX_KEY + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cause, sizeof(cause), fmt, ap);
    va_end(ap);
    /* the key as the store has it (a view's prefix first), as the store's own errors */
    snprintf(full, sizeof(full), "%s%s", s && s->prefix ? s->prefix : "", key);
    store_fail(s, st, op, full, "%s", cause);
}

static void open_fail(const char *url, int st, const tt_store_err_t *err)
{
    snprintf(open_error, sizeof(open_error), "store %.300s: open: %.600s (%s)", url, err->msg,
             tutti_status_name(st));
    TT_INFO("%s", open_error);
}

/* A size from TUTTI_<name> ("64M"); def when unset, with a warning when unreadable. */
static size_t env_size(const char *name, size_t def)
{
    const char *v = tt_env(name);
    size_t n;
    if (!v)
        return def;
    if (tt_parse_size(v, &n) < 0) {
        if (tt_warn_first(name, v)) /* once a process, as every knob's (configuration.md) */
            TT_WARN("TUTTI_%s=%s is not a size (like 4096, 64K, 1M); using %zu", name, v, def);
        return def;
    }
    return n;
}

int tutti_store_opts_init(tutti_store_opts_t *opts)
{
    if (!opts)
        return TUTTI_ERR_INVALID_ARG;
    memset(opts, 0, sizeof(*opts));
    opts->size = sizeof(*opts);
    opts->timeout_ms = tt_store_open_timeout_ms(0); /* TUTTI_STORE_TIMEOUT_MS, else 30000 */
    opts->is_server = 0;
    /* set but empty is an error (tt_auth_load_secret), never "no secret" */
    opts->auth_token = tt_env_set("AUTH_TOKEN");
    opts->auth_token_file = tt_env_set("AUTH_TOKEN_FILE");
    opts->instance = NULL;
    opts->idle_timeout_ms = tt_env_int("STORE_IDLE_TIMEOUT_MS", TT_STORE_DEFAULT_IDLE_MS);
    opts->max_connections = tt_env_int("STORE_MAX_CONNECTIONS", 0);
    opts->client_quota_bytes = env_size("STORE_CLIENT_QUOTA", TT_STORE_DEFAULT_QUOTA);
    opts->memory_limit_bytes = env_size("STORE_MEMORY_LIMIT", 0);
    opts->password = tt_env("STORE_PASSWORD");
    opts->fsync = tt_env_int("STORE_FSYNC", 0) != 0;
    return TUTTI_OK;
}

/* Whether a caller's opts (of its own size) has field: older callers' structs end sooner. */
#define OPTS_HAS(o, field) ((o)->size >= offsetof(tutti_store_opts_t, field) + sizeof((o)->field))

/* The caller's opts over the defaults, field by field as far as its struct reaches. */
static int opts_merge(tutti_store_opts_t *o, const tutti_store_opts_t *in)
{
    tutti_store_opts_init(o);
    if (!in)
        return TUTTI_OK;
    if (!OPTS_HAS(in, timeout_ms))
        return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open", NULL,
                          "opts->size is %zu: call tutti_store_opts_init first", in->size);
    o->timeout_ms = tt_store_open_timeout_ms(in->timeout_ms);
#define OPTS_TAKE(field)                                                                           \
    if (OPTS_HAS(in, field))                                                                       \
    o->field = in->field
    OPTS_TAKE(is_server);
    OPTS_TAKE(auth_token);
    OPTS_TAKE(auth_token_file);
    OPTS_TAKE(instance);
    OPTS_TAKE(idle_timeout_ms);
    OPTS_TAKE(max_connections);
    OPTS_TAKE(client_quota_bytes);
    OPTS_TAKE(memory_limit_bytes);
    OPTS_TAKE(password);
    OPTS_TAKE(fsync);
#undef OPTS_TAKE
    return TUTTI_OK;
}

/* The tcp settings from merged opts; defaults for zeros, and what makes no sense refused
 * with the field named. */
static int opts_to_cfg(const tutti_store_opts_t *o, tt_store_tcp_cfg_t *cfg)
{
    const char *bad = NULL;
    if (o->idle_timeout_ms < 0)
        bad = "idle_timeout_ms (TUTTI_STORE_IDLE_TIMEOUT_MS) is negative";
    else if (o->max_connections < 0)
        bad = "max_connections (TUTTI_STORE_MAX_CONNECTIONS) is negative";
    else if (o->client_quota_bytes && o->client_quota_bytes < TT_STORE_MIN_QUOTA)
        bad = "client_quota_bytes (TUTTI_STORE_CLIENT_QUOTA) is below 64K";
    else if (o->instance && strlen(o->instance) > TT_STORE_MAX_INSTANCE)
        bad = "instance is longer than 255 bytes";
    if (bad)
        return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open", NULL, "%s", bad);
    *cfg = (tt_store_tcp_cfg_t){
        .timeout_ms = o->timeout_ms,
        .instance = o->instance,
        .idle_timeout_ms = o->idle_timeout_ms,
        .max_connections = o->max_connections,
        .client_quota = o->client_quota_bytes ? o->client_quota_bytes : TT_STORE_DEFAULT_QUOTA,
        /* stopping waits this long for clients to leave; less than the timeout they use */
        .drain_ms = o->timeout_ms >= 0 && o->timeout_ms < 2000 ? o->timeout_ms : 2000,
    };
    cfg->memory_limit = o->memory_limit_bytes ? o->memory_limit_bytes : 2 * cfg->client_quota;
    if (cfg->memory_limit < cfg->client_quota)
        return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open", NULL,
                          "memory_limit_bytes (%zu, TUTTI_STORE_MEMORY_LIMIT) is below "
                          "client_quota_bytes (%zu)",
                          cfg->memory_limit, cfg->client_quota);
    return TUTTI_OK;
}

/* A file store; do_fsync: opts.fsync (TUTTI_STORE_FSYNC). */
static int open_file(tutti_store_t **store_p, const char *dir, int timeout_ms, int do_fsync)
{
    tt_store_err_t err = { { 0 } };
    if (!store_p || !dir || !*dir)
        return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open file store", NULL,
                          "%s is NULL or empty", !store_p ? "store_p" : "dir");
    int st = tt_store_file_open(store_p, dir, tt_store_open_timeout_ms(timeout_ms), do_fsync, &err);
    if (st < 0) {
        char url[PATH_MAX + 16];
        snprintf(url, sizeof(url), "file://%s", dir);
        open_fail(url, st, &err);
    }
    return st;
}

int tutti_store_open_file(tutti_store_t **store_p, const char *dir, int timeout_ms)
{
    return open_file(store_p, dir, timeout_ms, tt_env_int("STORE_FSYNC", 0) != 0);
}

/* Open a tcp store with merged opts: the job secret loaded, the settings checked. */
static int open_tcp(tutti_store_t **store_p, const char *host, int port,
                    const tutti_store_opts_t *o)
{
    tt_store_err_t err = { { 0 } };
    tt_store_tcp_cfg_t cfg;
    char *secret = NULL;
    size_t secret_len = 0;
    char url[300];
    snprintf(url, sizeof(url), strchr(host, ':') ? "tcp://[%s]:%d" : "tcp://%s:%d", host, port);
    if (!store_p || !*host)
        return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open tcp store", NULL,
                          "%s is NULL or empty", !store_p ? "store_p" : "host");
    if (port < 0 || port > 65535 || (port == 0 && !o->is_server))
        return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open tcp store", NULL,
                          "%.280s: bad port (1..65535; 0 only for a server)", url);
    if (strlen(host) > 255)
        return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open tcp store", NULL,
                          "host name longer than 255 bytes");
    TT_CHECK(opts_to_cfg(o, &cfg));
    int st = tt_auth_load_secret(o->auth_token, o->auth_token_file, &secret, &secret_len, err.msg,
                                 sizeof(err.msg));
    if (st < 0) {
        open_fail(url, st, &err);
        return st;
    }
    cfg.secret = secret;
    cfg.secret_len = secret_len;
    st = tt_store_tcp_open(store_p, host, port, o->is_server, &cfg, &err);
    if (secret) {
        memset(secret, 0, secret_len);
        free(secret);
    }
    if (st < 0)
        open_fail(url, st, &err);
    return st;
}

int tutti_store_open_tcp(tutti_store_t **store_p, const char *host, int port, int is_server,
                         int timeout_ms)
{
    tutti_store_opts_t o;
    tutti_store_opts_init(&o);
    o.timeout_ms = tt_store_open_timeout_ms(timeout_ms);
    o.is_server = is_server;
    if (!host)
        return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open tcp store", NULL,
                          "host is NULL or empty");
    return open_tcp(store_p, host, port, &o);
}

/* "tcp://host:port" or "tcp://[v6]:port" into host (size hostlen) and port. */
static int parse_tcp_url(const char *rest, char *host, size_t hostlen, int *port_p)
{
    const char *h = rest, *hend, *colon;
    if (*h == '[') {
        h++;
        hend = strchr(h, ']');
        if (!hend || hend[1] != ':')
            return TUTTI_ERR_INVALID_ARG;
        colon = hend + 1;
    } else {
        colon = strrchr(h, ':');
        if (!colon || memchr(h, ':', (size_t)(colon - h)))
            return TUTTI_ERR_INVALID_ARG; /* bare IPv6 literals need brackets */
        hend = colon;
    }
    size_t n = (size_t)(hend - h);
    if (n == 0 || n >= hostlen || memchr(h, '/', n))
        return TUTTI_ERR_INVALID_ARG;
    const char *p = colon + 1;
    if (!*p || strlen(p) > 5)
        return TUTTI_ERR_INVALID_ARG;
    int port = 0;
    for (; *p; p++) {
        if (!isdigit((unsigned char)*p))
            return TUTTI_ERR_INVALID_ARG;
        port = port * 10 + (*p - '0');
    }
    if (port > 65535)
        return TUTTI_ERR_INVALID_ARG;
    memcpy(host, h, n);
    host[n] = '\0';
    *port_p = port;
    return TUTTI_OK;
}

const char *tt_store_url_redact(const char *url, char *dst, size_t dstlen)
{
    const char *sep = url ? strstr(url, "://") : NULL;
    /* without a scheme (a malformed URL) the user info is whatever comes before a '@' */
    const char *ui = sep ? sep + 3 : url;
    const char *at = url && strncmp(url, "file://", 7) ? strrchr(ui, '@') : NULL;
    if (!at) {
        snprintf(dst, dstlen, "%s", url ? url : "(null)");
        return dst;
    }
    const char *colon = memchr(ui, ':', (size_t)(at - ui));
    /* the user stays when it is clearly one (before a ':'); the rest before '@' goes */
    int ulen = colon && !memchr(ui, '/', (size_t)(colon - ui)) ? (int)(colon - ui) : 0;
    snprintf(dst, dstlen, "%.*s%.*s%s***%s", (int)(ui - url), url, ulen, ui, ulen ? ":" : "", at);
    return dst;
}

/* Percent-decode n bytes of src into a new string; NULL when malformed or out of memory. */
static char *url_decode(const char *src, size_t n)
{
    char *d = malloc(n + 1);
    size_t o = 0;
    if (!d)
        return NULL;
    for (size_t k = 0; k < n; k++) {
        if (src[k] != '%') {
            d[o++] = src[k];
            continue;
        }
        if (k + 2 >= n || !isxdigit((unsigned char)src[k + 1]) ||
            !isxdigit((unsigned char)src[k + 2])) {
            free(d);
            return NULL;
        }
        char hex[3] = { src[k + 1], src[k + 2], 0 };
        d[o++] = (char)strtol(hex, NULL, 16);
        k += 2;
    }
    d[o] = '\0';
    if (strlen(d) != o) { /* %00 */
        free(d);
        return NULL;
    }
    return d;
}

/* redis://[[user]:password@]host[:port][/db]: the user and password percent-decoded, the
 * port 6379 and the db 0 when left out. The password in the URL wins over the options'; a
 * lone field before '@' is always the password (redis-cli's reading: it is never shown, so
 * a secret there cannot leak as a user name); "user:@host" names a user whose password
 * comes from the options. */
static int open_redis(tutti_store_t **store_p, const char *url, const tutti_store_opts_t *o)
{
    const char *rest = url + 8, *at = NULL;
    const char *end = rest + strcspn(rest, "/?#");
    char *user = NULL, *password = NULL;
    char hostport[300];
    tt_store_redis_cfg_t cfg = { .port = 6379, .timeout_ms = o->timeout_ms };
    const char *bad = NULL;
    int st = TUTTI_ERR_INVALID_ARG;

    for (const char *p = rest; p < end; p++)
        if (*p == '@')
            at = p;
    if (at) {
        const char *colon = memchr(rest, ':', (size_t)(at - rest));
        size_t ulen = colon ? (size_t)(colon - rest) : (size_t)(at - rest);
        if (ulen)
            user = url_decode(rest, ulen);
        if (colon)
            password = url_decode(colon + 1, (size_t)(at - colon - 1));
        if ((ulen && !user) || (colon && !password)) {
            bad = "a malformed %-escape in the user or password";
            goto out;
        }
        if (!colon) { /* redis://secret@host: the one field is the password */
            password = user;
            user = NULL;
        }
        if (password && !password[0]) { /* redis://user:@host: the password from the options */
            free(password);
            password = NULL;
        }
        if (user && !password && !o->password) {
            bad = "the URL names a user but no password (give it after the user, as "
                  "user:password, or as user:@host with TUTTI_STORE_PASSWORD)";
            goto out;
        }
        rest = at + 1;
    }
    size_t hl = (size_t)(end - rest);
    if (hl == 0 || hl >= sizeof(hostport) - 8) {
        bad = "no host, or a host longer than 255 bytes";
        goto out;
    }
    memcpy(hostport, rest, hl);
    hostport[hl] = '\0';
    /* no port: parse "host:6379" the tcp way */
    int has_port = hostport[0] == '[' ? strstr(hostport, "]:") != NULL
                                      : strchr(hostport, ':') != NULL;
    if (!has_port)
        strcat(hostport, ":6379");
    char host[256];
    if (parse_tcp_url(hostport, host, sizeof(host), &cfg.port) < 0 || cfg.port == 0) {
        bad = "expected host, host:port or [v6addr]:port after the user and password";
        goto out;
    }
    cfg.host = host;
    if (strpbrk(end, "?#")) { /* redis-py's ?db=N&ssl=... and the like */
        bad = "query strings and fragments are not understood (the database goes after "
              "'/', the password before '@' or in TUTTI_STORE_PASSWORD)";
        goto out;
    }
    if (*end == '/' && end[1]) {
        const char *d = end + 1;
        if (strlen(d) > 5 || strspn(d, "0123456789") != strlen(d)) {
            bad = "the database after '/' must be a number";
            goto out;
        }
        cfg.db = atoi(d);
    }
    cfg.user = user;
    cfg.password = password ? password : o->password;
    tt_store_err_t err = { { 0 } };
    st = tt_store_redis_open(store_p, &cfg, &err);
    if (st < 0) {
        char shown[400];
        snprintf(shown, sizeof(shown), "redis://%s%s%s/%d", user ? user : "", user ? "@" : "",
                 hostport, cfg.db);
        open_fail(shown, st, &err);
    }
out:
    if (bad)
        store_fail(NULL, st, "open", NULL,
                   "bad store URL 'redis://...': %s (expected "
                   "redis://[[user]:password@]host[:port][/db])",
                   bad);
    free(user);
    if (password) {
        memset(password, 0, strlen(password));
        free(password);
    }
    return st;
}

int tutti_store_open(tutti_store_t **store_p, const char *url, const tutti_store_opts_t *opts)
{
    tutti_store_opts_t o;
    if (!store_p || !url)
        return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open", NULL, "%s is NULL",
                          !store_p ? "store_p" : "url");
    TT_CHECK(opts_merge(&o, opts));
    if (!strncmp(url, "file://", 7)) {
        const char *dir = url + 7;
        if (dir[0] != '/')
            return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open", NULL,
                              "bad store URL '%s': expected file:///absolute/dir", url);
        return open_file(store_p, dir, o.timeout_ms, o.fsync);
    }
    char shown[512]; /* a malformed URL in a message, with no password in it */
    if (!strncmp(url, "tcp://", 6)) {
        char host[256];
        int port;
        if (parse_tcp_url(url + 6, host, sizeof(host), &port) < 0)
            return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open", NULL,
                              "bad store URL '%s': expected tcp://host:port or "
                              "tcp://[v6addr]:port",
                              tt_store_url_redact(url, shown, sizeof(shown)));
        return open_tcp(store_p, host, port, &o);
    }
    if (!strncmp(url, "redis://", 8))
        return open_redis(store_p, url, &o);
    if (!strncmp(url, "rediss://", 9))
        return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open", NULL,
                          "bad store URL '%s': TLS (rediss://) is not supported: tutti's redis "
                          "client speaks plain TCP (redis://host:port; through a TLS tunnel "
                          "such as stunnel where the server wants TLS)",
                          tt_store_url_redact(url, shown, sizeof(shown)));
    return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open", NULL,
                      "bad store URL '%s': scheme must be file://, tcp:// or redis://",
                      tt_store_url_redact(url, shown, sizeof(shown)));
}

int tutti_store_open_ops(tutti_store_t **store_p, const tutti_store_ops_t *ops, void *ctx,
                         const char *label)
{
    tt_store_err_t err = { { 0 } };
    char url[256];
    if (!label)
        label = "store";
    snprintf(url, sizeof(url), "ops://%.200s", label);
    if (!store_p || !ops)
        return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open", NULL, "%s: %s is NULL", url,
                          !store_p ? "store_p" : "ops");
    if (strlen(label) > 200)
        return store_fail(NULL, TUTTI_ERR_INVALID_ARG, "open", NULL,
                          "%s...: label longer than 200 bytes", url);
    int st = tt_store_ops_open(store_p, ops, ctx, url, &err);
    if (st < 0)
        open_fail(url, st, &err);
    return st;
}

int tutti_store_open_prefixed(tutti_store_t **store_p, tutti_store_t *base, const char *prefix)
{
    if (!store_p || !base || !prefix)
        return store_fail(base, TUTTI_ERR_INVALID_ARG, "open prefixed view", NULL, "%s is NULL",
                          !store_p ? "store_p"
                          : !base  ? "base"
                                   : "prefix");
    size_t plen = strlen(prefix);
    if (base->prefix_len + plen > TUTTI_STORE_MAX_KEY)
        return store_fail(base, TUTTI_ERR_INVALID_ARG, "open prefixed view", prefix,
                          "prefix longer than %d bytes", TUTTI_STORE_MAX_KEY);
    tutti_store_t *v = calloc(1, sizeof(*v));
    if (!v)
        goto err_nomem;
    v->prefix = malloc(base->prefix_len + plen + 1);
    if (!v->prefix)
        goto err_free_view;
    v->url = strdup(base->url);
    if (!v->url)
        goto err_free_prefix;
    if (base->prefix_len)
        memcpy(v->prefix, base->prefix, base->prefix_len);
    memcpy(v->prefix + base->prefix_len, prefix, plen + 1);
    v->prefix_len = base->prefix_len + plen;
    v->ops = base->base->ops;
    v->base = base->base;
    v->port = base->port;
    atomic_init(&v->timeout_ms, atomic_load(&base->timeout_ms));
    pthread_mutex_init(&v->err_lock, NULL);
    *store_p = v;
    return TUTTI_OK;

err_free_prefix:
    free(v->prefix);
err_free_view:
    free(v);
err_nomem:
    return store_fail(base, TUTTI_ERR_NOMEM, "open prefixed view", prefix, "out of memory");
}

tutti_store_t *tt_store_retain(tutti_store_t *store)
{
    atomic_fetch_add(&store->base->refs, 1);
    return store->base;
}

void tutti_store_close(tutti_store_t *store)
{
    if (!store)
        return;
    if (store->base == store && atomic_fetch_sub(&store->refs, 1) > 1)
        return;
    if (store->base == store && store->ops && store->ops->close)
        store->ops->close(store);
    tt_store_free(store);
}

const char *tutti_store_url(const tutti_store_t *store)
{
    return store ? store->url : "";
}

int tutti_store_port(const tutti_store_t *store)
{
    return store ? store->port : -1;
}

const char *tutti_store_last_error(const tutti_store_t *store)
{
    return store ? store->last_error : open_error;
}

void tutti_store_set_timeout(tutti_store_t *store, int timeout_ms)
{
    if (store)
        atomic_store(&store->timeout_ms, timeout_ms);
}

int tutti_store_timeout(const tutti_store_t *store)
{
    /* atomic_load wants a non-const object on some compilers */
    return store ? atomic_load(&((tutti_store_t *)store)->timeout_ms) : -1;
}

static uint64_t op_deadline(tutti_store_t *s, int timeout_ms)
{
    if (timeout_ms < 0)
        timeout_ms = atomic_load(&s->timeout_ms);
    return tt_deadline_ns(timeout_ms);
}

/* A key with the view's prefix: in buf (TUTTI_STORE_MAX_KEY + 1 bytes). */
static int full_key(tutti_store_t *s, const char *op, const char *key, char *buf)
{
    if (!s)
        return TUTTI_ERR_INVALID_ARG;
    if (!key)
        return store_fail(s, TUTTI_ERR_INVALID_ARG, op, NULL, "key is NULL");
    size_t klen = strnlen(key, TUTTI_STORE_MAX_KEY + 1);
    if (s->prefix_len + klen > TUTTI_STORE_MAX_KEY) {
        char shortkey[64];
        snprintf(shortkey, sizeof(shortkey), "%.48s", key);
        return store_fail(s, TUTTI_ERR_INVALID_ARG, op, shortkey,
                          "key (with prefix %zu bytes) longer than %d bytes", s->prefix_len,
                          TUTTI_STORE_MAX_KEY);
    }
    if (s->prefix_len)
        memcpy(buf, s->prefix, s->prefix_len);
    memcpy(buf + s->prefix_len, key, klen + 1);
    return TUTTI_OK;
}

/* Prefixed copies of n keys (a single allocation; free() the array). */
static int full_keys(tutti_store_t *s, const char *op, const char *const *keys, size_t n,
                     char ***out_p)
{
    if (!keys)
        return store_fail(s, TUTTI_ERR_INVALID_ARG, op, NULL, "keys is NULL");
    size_t total = n * sizeof(char *);
    for (size_t i = 0; i < n; i++) {
        if (!keys[i])
            return store_fail(s, TUTTI_ERR_INVALID_ARG, op, NULL, "keys[%zu] is NULL", i);
        size_t klen = strnlen(keys[i], TUTTI_STORE_MAX_KEY + 1);
        if (s->prefix_len + klen > TUTTI_STORE_MAX_KEY)
            return store_fail(s, TUTTI_ERR_INVALID_ARG, op, NULL,
                              "keys[%zu] (with prefix) longer than %d bytes", i,
                              TUTTI_STORE_MAX_KEY);
        total += s->prefix_len + klen + 1;
    }
    char **out = malloc(total ? total : 1);
    if (!out)
        return store_fail(s, TUTTI_ERR_NOMEM, op, NULL, "out of memory for %zu keys", n);
    char *p = (char *)(out + n);
    for (size_t i = 0; i < n; i++) {
        size_t klen = strlen(keys[i]);
        out[i] = p;
        if (s->prefix_len)
            memcpy(p, s->prefix, s->prefix_len);
        memcpy(p + s->prefix_len, keys[i], klen + 1);
        p += s->prefix_len + klen + 1;
    }
    *out_p = out;
    return TUTTI_OK;
}

static int op_result(tutti_store_t *s, int st, const char *op, const char *key,
                     const tt_store_err_t *err)
{
    if (st >= 0)
        return st;
    return store_fail(s, st, op, key, "%s", err->msg[0] ? err->msg : tutti_strerror(st));
}

int tutti_store_set(tutti_store_t *store, const char *key, const void *value, size_t len)
{
    char k[TUTTI_STORE_MAX_KEY + 1];
    tt_store_err_t err = { { 0 } };
    TT_CHECK(full_key(store, "set", key, k));
    if (!value && len)
        return store_fail(store, TUTTI_ERR_INVALID_ARG, "set", k, "value is NULL");
    if (len > TUTTI_STORE_MAX_VALUE)
        return store_fail(store, TUTTI_ERR_INVALID_ARG, "set", k,
                          "value of %zu bytes is over the limit of %u", len, TUTTI_STORE_MAX_VALUE);
    tutti_store_t *b = store->base;
    int st = b->ops->set(b, k, value ? value : "", len, op_deadline(store, -1), &err);
    return op_result(store, st, "set", k, &err);
}

/* The deadline of a call that waits for keys. A timeout of 0 asks for what is there now,
 * which a round trip to a server cannot promise within 0 ms: the keys are checked first
 * (within the store's timeout) and, when all are there, fetched within the store's timeout;
 * a key missing times out at once. */
static int keys_deadline(tutti_store_t *store, const char *const *keys, size_t n, int timeout_ms,
                         uint64_t *deadline_p, tt_store_err_t *err)
{
    *deadline_p = op_deadline(store, timeout_ms);
    if (timeout_ms != 0)
        return TUTTI_OK;
    tutti_store_t *b = store->base;
    int all = 0;
    TT_CHECK(b->ops->check(b, keys, n, &all, op_deadline(store, -1), err));
    if (!all) {
        tt_store_err_set(err, "%s (a timeout of 0 does not wait)",
                         n > 1 ? "not every key is set" : "key not set");
        return TUTTI_ERR_TIMEOUT;
    }
    *deadline_p = op_deadline(store, -1);
    return TUTTI_OK;
}

int tutti_store_get(tutti_store_t *store, const char *key, void **value_p, size_t *len_p,
                    int timeout_ms)
{
    char k[TUTTI_STORE_MAX_KEY + 1];
    tt_store_err_t err = { { 0 } };
    TT_CHECK(full_key(store, "get", key, k));
    if (!value_p)
        return store_fail(store, TUTTI_ERR_INVALID_ARG, "get", k, "value_p is NULL");
    tutti_store_t *b = store->base;
    void *v = NULL;
    size_t len = 0;
    const char *ck = k;
    uint64_t deadline;
    int st = keys_deadline(store, &ck, 1, timeout_ms, &deadline, &err);
    if (st >= 0)
        st = b->ops->get(b, k, &v, &len, deadline, &err);
    if (st < 0)
        return op_result(store, st, "get", k, &err);
    *value_p = v;
    if (len_p)
        *len_p = len;
    return TUTTI_OK;
}

int tutti_store_add(tutti_store_t *store, const char *key, int64_t delta, int64_t *result_p)
{
    char k[TUTTI_STORE_MAX_KEY + 1];
    tt_store_err_t err = { { 0 } };
    TT_CHECK(full_key(store, "add", key, k));
    tutti_store_t *b = store->base;
    int64_t r = 0;
    int st = b->ops->add(b, k, delta, &r, op_deadline(store, -1), &err);
    if (st < 0)
        return op_result(store, st, "add", k, &err);
    if (result_p)
        *result_p = r;
    return TUTTI_OK;
}

int tutti_store_compare_set(tutti_store_t *store, const char *key, const void *expected,
                            size_t elen, const void *desired, size_t dlen, void **current_p,
                            size_t *curlen_p)
{
    char k[TUTTI_STORE_MAX_KEY + 1];
    tt_store_err_t err = { { 0 } };
    TT_CHECK(full_key(store, "compare_set", key, k));
    if ((!expected && elen) || (!desired && dlen))
        return store_fail(store, TUTTI_ERR_INVALID_ARG, "compare_set", k, "%s is NULL",
                          (!expected && elen) ? "expected" : "desired");
    if (elen > TUTTI_STORE_MAX_VALUE || dlen > TUTTI_STORE_MAX_VALUE)
        return store_fail(store, TUTTI_ERR_INVALID_ARG, "compare_set", k,
                          "value over the limit of %u bytes", TUTTI_STORE_MAX_VALUE);
    tutti_store_t *b = store->base;
    void *cur = NULL;
    size_t curlen = 0;
    int st = b->ops->compare_set(b, k, expected ? expected : "", elen, desired ? desired : "", dlen,
                                 &cur, &curlen, op_deadline(store, -1), &err);
    if (st < 0)
        return op_result(store, st, "compare_set", k, &err);
    if (current_p)
        *current_p = cur;
    else
        free(cur);
    if (curlen_p)
        *curlen_p = curlen;
    return TUTTI_OK;
}

/* wait built from get, for backends without their own. */
static int generic_wait(tutti_store_t *b, const char *const *keys, size_t n, uint64_t deadline,
                        tt_store_err_t *err)
{
    for (size_t i = 0; i < n; i++) {
        void *v;
        size_t len;
        TT_CHECK(b->ops->get(b, keys[i], &v, &len, deadline, err));
        free(v);
    }
    return TUTTI_OK;
}

/* After a wait of n keys timed out: the first of them still missing, found by halving with
 * check (log2(n) round trips, all within WAIT_NAME_NS), or n when that does not tell. */
#define WAIT_NAME_NS 100000000ull
static size_t first_missing(tutti_store_t *b, const char *const *keys, size_t n)
{
    tt_store_err_t err = { { 0 } };
    uint64_t deadline = tt_now_ns() + WAIT_NAME_NS;
    size_t lo = 0, hi = n; /* [lo, hi) lacks a key; all before lo are set */
    while (hi - lo > 1 && tt_now_ns() < deadline) {
        size_t mid = lo + (hi - lo) / 2;
        int all;
        if (b->ops->check(b, &keys[lo], mid - lo, &all, deadline, &err) < 0)
            return n;
        if (all)
            lo = mid;
        else
            hi = mid;
    }
    return hi - lo == 1 ? lo : n;
}

/* op_result for a call on n keys: a timeout names a key still missing (multi_get named the
 * first, which may have been set, until session 100), else the first key. */
static int keys_result(tutti_store_t *store, int st, const char *op, const char *const *k, size_t n,
                       tt_store_err_t *err)
{
    size_t m = st == TUTTI_ERR_TIMEOUT && n > 1 ? first_missing(store->base, k, n) : n;
    char what[48];
    snprintf(what, sizeof(what), "%s%s", op,
             m < n   ? " (a key missing)"
             : n > 1 ? " (first key)"
                     : "");
    return op_result(store, st, what, k[m < n ? m : 0], err);
}

static int generic_multi_get(tutti_store_t *b, const char *const *keys, size_t n, void **values_p,
                             size_t *lens_p, uint64_t deadline, tt_store_err_t *err)
{
    int st = TUTTI_OK;
    size_t i;
    for (i = 0; i < n; i++) {
        TT_CHECK_GOTO(b->ops->get(b, keys[i], &values_p[i], &lens_p[i], deadline, err), st,
                      err_free_values);
    }
    return TUTTI_OK;

err_free_values:
    while (i-- > 0) {
        free(values_p[i]);
        values_p[i] = NULL;
    }
    return st;
}

/* The opening of a call over n keys, in the order its errors win: no store; no keys
 * (done at once: TUTTI_OK with *k_p NULL); bad, the caller's other argument error (NULL:
 * none); then the keys themselves, whose full names land in *k_p. */
static int keys_open(tutti_store_t *store, const char *op, const char *bad, const char *const *keys,
                     size_t n, char ***k_p)
{
    *k_p = NULL;
    if (!store)
        return TUTTI_ERR_INVALID_ARG;
    if (n == 0)
        return TUTTI_OK;
    if (bad)
        return store_fail(store, TUTTI_ERR_INVALID_ARG, op, NULL, "%s", bad);
    return full_keys(store, op, keys, n, k_p);
}

int tutti_store_wait(tutti_store_t *store, const char *const *keys, size_t n, int timeout_ms)
{
    tt_store_err_t err = { { 0 } };
    char **k;
    TT_CHECK(keys_open(store, "wait", NULL, keys, n, &k));
    if (!k)
        return TUTTI_OK;
    tutti_store_t *b = store->base;
    uint64_t deadline;
    const char *const *ck = (const char *const *)k;
    int st = keys_deadline(store, ck, n, timeout_ms, &deadline, &err);
    if (st >= 0)
        st = b->ops->wait ? b->ops->wait(b, ck, n, deadline, &err)
                          : generic_wait(b, ck, n, deadline, &err);
    st = keys_result(store, st, "wait", ck, n, &err);
    free(k);
    return st;
}

int tutti_store_check(tutti_store_t *store, const char *const *keys, size_t n, int *exists_p)
{
    tt_store_err_t err = { { 0 } };
    char **k;
    if (!store)
        return TUTTI_ERR_INVALID_ARG;
    if (!exists_p)
        return store_fail(store, TUTTI_ERR_INVALID_ARG, "check", NULL, "exists_p is NULL");
    if (n == 0) {
        *exists_p = 1;
        return TUTTI_OK;
    }
    TT_CHECK(full_keys(store, "check", keys, n, &k));
    tutti_store_t *b = store->base;
    int exists = 0;
    int st = b->ops->check(b, (const char *const *)k, n, &exists, op_deadline(store, -1), &err);
    st = op_result(store, st, n > 1 ? "check (first key)" : "check", k[0], &err);
    free(k);
    if (st >= 0)
        *exists_p = exists;
    return st;
}

int tutti_store_delete(tutti_store_t *store, const char *key, int *deleted_p)
{
    char k[TUTTI_STORE_MAX_KEY + 1];
    tt_store_err_t err = { { 0 } };
    TT_CHECK(full_key(store, "delete", key, k));
    tutti_store_t *b = store->base;
    int deleted = 0;
    int st = b->ops->del(b, k, &deleted, op_deadline(store, -1), &err);
    if (st < 0)
        return op_result(store, st, "delete", k, &err);
    if (deleted_p)
        *deleted_p = deleted;
    return TUTTI_OK;
}

int tutti_store_count(tutti_store_t *store, const char *prefix, size_t *count_p)
{
    char k[TUTTI_STORE_MAX_KEY + 1];
    tt_store_err_t err = { { 0 } };
    TT_CHECK(full_key(store, "count", prefix ? prefix : "", k));
    if (!count_p)
        return store_fail(store, TUTTI_ERR_INVALID_ARG, "count", k, "count_p is NULL");
    tutti_store_t *b = store->base;
    if (!b->ops->count_prefix)
        return store_fail(store, TUTTI_ERR_UNSUPPORTED, "count", k,
                          "this store cannot count its keys (an ops store without "
                          "count_prefix)");
    size_t n = 0;
    int st = b->ops->count_prefix(b, k, &n, op_deadline(store, -1), &err);
    if (st < 0)
        return op_result(store, st, "count", k, &err);
    *count_p = n;
    return TUTTI_OK;
}

int tutti_store_multi_get(tutti_store_t *store, const char *const *keys, size_t n, void **values_p,
                          size_t *lens_p, int timeout_ms)
{
    tt_store_err_t err = { { 0 } };
    char **k;
    TT_CHECK(keys_open(store, "multi_get", values_p ? NULL : "values_p is NULL", keys, n, &k));
    if (!k)
        return TUTTI_OK;
    int st = TUTTI_ERR_NOMEM;
    void **vals = calloc(n, sizeof(*vals));
    size_t *lens = calloc(n, sizeof(*lens));
    if (!vals || !lens) {
        st = store_fail(store, TUTTI_ERR_NOMEM, "multi_get", k[0], "out of memory");
        goto out_free;
    }
    tutti_store_t *b = store->base;
    uint64_t deadline;
    const char *const *ck = (const char *const *)k;
    st = keys_deadline(store, ck, n, timeout_ms, &deadline, &err);
    if (st >= 0)
        st = b->ops->multi_get ? b->ops->multi_get(b, ck, n, vals, lens, deadline, &err)
                               : generic_multi_get(b, ck, n, vals, lens, deadline, &err);
    st = keys_result(store, st, "multi_get", ck, n, &err);
    if (st >= 0) {
        memcpy(values_p, vals, n * sizeof(*vals));
        if (lens_p)
            memcpy(lens_p, lens, n * sizeof(*lens));
    }
out_free:
    free(lens);
    free(vals);
    free(k);
    return st;
}

/* ---- garbage collection (store_gc.h) ---- */

int tt_store_delete_prefix(tutti_store_t *store, const char *prefix)
{
    char k[TUTTI_STORE_MAX_KEY + 1];
    tt_store_err_t err = { { 0 } };
    if (!store || !prefix)
        return TUTTI_ERR_INVALID_ARG;
    TT_CHECK(full_key(store, "delete_prefix", prefix, k));
    tutti_store_t *b = store->base;
    if (!k[0]) /* never the whole store */
        return TUTTI_ERR_INVALID_ARG;
    if (!b->ops->del_prefix)
        return TUTTI_ERR_UNSUPPORTED;
    size_t n = 0;
    int st = b->ops->del_prefix(b, k, &n, op_deadline(store, -1), &err);
    if (st < 0)
        return op_result(store, st, "delete_prefix", k, &err);
    TT_TRACE("store %s: deleted %zu keys under %s", b->url, n, k);
    return TUTTI_OK;
}

int tt_store_compare_delete(tutti_store_t *store, const char *key, const void *expected,
                            size_t elen)
{
    char k[TUTTI_STORE_MAX_KEY + 1];
    tt_store_err_t err = { { 0 } };
    if (!store || (!expected && elen))
        return TUTTI_ERR_INVALID_ARG;
    TT_CHECK(full_key(store, "compare_delete", key, k));
    tutti_store_t *b = store->base;
    if (!b->ops->compare_del)
        return TUTTI_ERR_UNSUPPORTED;
    int deleted = 0;
    int st = b->ops->compare_del(b, k, expected, elen, &deleted, op_deadline(store, -1), &err);
    if (st < 0)
        return op_result(store, st, "compare_delete", k, &err);
    return TUTTI_OK;
}
