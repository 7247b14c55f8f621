/* Helpers the store's dispatcher (store.c) and its backends (store_file.c, store_tcp.c,
 * store_server.c) share: error text, key display, counter parsing, handle allocation. */
#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_impl.h"

void tt_store_err_set(tt_store_err_t *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
}

const char *tt_store_key_display(const char *key, char *dst, size_t dstlen)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (dstlen == 0)
        return dst;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
        /* room for one escaped byte, "..." and the NUL */
        if (o + 4 + 4 >= dstlen) {
            memcpy(dst + o, "...", 3);
            o += 3;
            break;
        }
        if (isprint(*p) && *p != '\\') {
            dst[o++] = (char)*p;
        } else {
            dst[o++] = '\\';
            dst[o++] = 'x';
            dst[o++] = hex[*p >> 4];
            dst[o++] = hex[*p & 15];
        }
    }
    dst[o] = '\0';
    return dst;
}

int tt_store_parse_i64(const void *value, size_t len, int64_t *out_p)
{
    const char *p = value, *end = p + len;
    int neg = 0;
    if (p < end && *p == '-')
        neg = *p++ == '-';
    /* the canonical form only, as Redis's INCRBY takes it (string2ll): no '+', no leading
     * zero, no "-0"; until session 101 the file and tcp stores also took "+12" and "007" */
    if (p == end || end - p > 19 || (*p == '0' && (end - p > 1 || neg)))
        return TUTTI_ERR_INVALID_ARG;
    uint64_t v = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9')
            return TUTTI_ERR_INVALID_ARG;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (v > (uint64_t)INT64_MAX + (uint64_t)neg)
        return TUTTI_ERR_INVALID_ARG;
    *out_p = neg ? (int64_t)(0 - v) : (int64_t)v;
    return TUTTI_OK;
}

int tt_store_open_timeout_ms(int timeout_ms)
{
    if (timeout_ms != 0)
        return timeout_ms;
    /* the variable's own 0 is the default too; negative: no deadline, as documented (the
     * open calls' 0 with it negative gave 30000 while the options gave none) */
    int env = tt_env_int("STORE_TIMEOUT_MS", 0);
    return env != 0 ? env : TT_STORE_DEFAULT_TIMEOUT_MS;
}

struct tt_comm_ids {
    struct tt_comm_ids *next;
    unsigned count;
    char prefix[]; /* a view's whole prefix */
};

unsigned tt_store_next_comm_id(tutti_store_t *store)
{
    tutti_store_t *b = store->base;
    const char *p = store->prefix ? store->prefix : "";
    unsigned id = 0;
    pthread_mutex_lock(&b->comm_ids_lock);
    struct tt_comm_ids *c = b->comm_ids;
    while (c && strcmp(c->prefix, p))
        c = c->next;
    if (!c && (c = malloc(sizeof(*c) + strlen(p) + 1))) {
        strcpy(c->prefix, p);
        c->count = 0;
        c->next = b->comm_ids;
        b->comm_ids = c;
    }
    if (c) /* (out of memory: 0, a collision the job's checks name at worst) */
        id = c->count++;
    pthread_mutex_unlock(&b->comm_ids_lock);
    return id;
}

void tt_store_comm_ids_free(tutti_store_t *base)
{
    while (base->comm_ids) {
        struct tt_comm_ids *c = base->comm_ids;
        base->comm_ids = c->next;
        free(c);
    }
}

tutti_store_t *tt_store_alloc(const tt_store_ops_t *ops, const char *url, int port, int timeout_ms)
{
    tutti_store_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->url = strdup(url);
    if (!s->url) {
        free(s);
        return NULL;
    }
    s->ops = ops;
    s->base = s;
    s->port = port;
    atomic_init(&s->timeout_ms, timeout_ms);
    pthread_mutex_init(&s->comm_ids_lock, NULL);
    atomic_init(&s->refs, 1);
    pthread_mutex_init(&s->err_lock, NULL);
    return s;
}

void tt_store_free(tutti_store_t *s)
{
    if (!s)
        return;
    pthread_mutex_destroy(&s->err_lock);
    if (s->base == s) {
        tt_store_comm_ids_free(s);
        pthread_mutex_destroy(&s->comm_ids_lock);
    }
    free(s->prefix);
    free(s->url);
    free(s);
}
