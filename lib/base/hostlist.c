/* Slurm's host lists (hostlist.h). */
#include "hostlist.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HOST_MAX 256

typedef struct walk {
    int (*each)(void *ctx, const char *host); /* NULL: only check */
    void *ctx;
    int count, stop;
    char host[HOST_MAX];
} walk_t;

/* One range of a bracket, s..end (exclusive): "7", "07-12". Its bounds and the width of
 * its numbers. 0 or -1. */
static int parse_range(const char *s, const char *end, unsigned long *lo, unsigned long *hi,
                       int *width)
{
    const char *dash = memchr(s, '-', (size_t)(end - s));
    const char *lo_end = dash ? dash : end;
    if (lo_end == s || lo_end - s > 18 || (dash && (end - dash - 1 < 1 || end - dash - 1 > 18)))
        return -1;
    for (const char *c = s; c < end; c++)
        if (c != dash && !isdigit((unsigned char)*c))
            return -1;
    *lo = strtoul(s, NULL, 10);
    *hi = dash ? strtoul(dash + 1, NULL, 10) : *lo;
    *width = (int)(lo_end - s);
    return *hi < *lo ? -1 : 0;
}

/* The hosts of item s..end (no top-level comma) after the len bytes already in w->host.
 * 0 or -1 (does not parse, or too long). */
static int expand(walk_t *w, const char *s, const char *end, size_t len)
{
    const char *open = memchr(s, '[', (size_t)(end - s));
    const char *lit_end = open ? open : end;
    for (const char *c = s; c < lit_end; c++)
        if (*c == ']' || isspace((unsigned char)*c))
            return -1;
    size_t lit = (size_t)(lit_end - s);
    if (len + lit >= HOST_MAX)
        return -1;
    memcpy(w->host + len, s, lit);
    len += lit;
    if (!open) {
        if (len == 0)
            return -1;
        w->host[len] = '\0';
        w->count++;
        if (w->each && !w->stop)
            w->stop = w->each(w->ctx, w->host);
        return 0;
    }
    const char *close = memchr(open, ']', (size_t)(end - open));
    if (!close || memchr(open + 1, '[', (size_t)(close - open - 1)))
        return -1;
    /* checking (no each): every range parses, and the rest follows once, after the
     * bracket's longest number (a product of brackets is not walked: "[1-2]" 100 times
     * is 2^100 hosts) */
    size_t longest = 0;
    for (const char *r = open + 1; r <= close && !(w->each && w->stop);) {
        const char *re = memchr(r, ',', (size_t)(close - r));
        if (!re)
            re = close;
        unsigned long lo, hi;
        int width;
        if (parse_range(r, re, &lo, &hi, &width) < 0)
            return -1;
        for (unsigned long v = w->each ? lo : hi;; v++) {
            int n = snprintf(w->host + len, HOST_MAX - len, "%0*lu", width, v);
            if (n < 0 || len + (size_t)n >= HOST_MAX)
                return -1;
            if (!w->each) {
                longest = (size_t)n > longest ? (size_t)n : longest;
                break;
            }
            if (expand(w, close + 1, end, len + (size_t)n) < 0)
                return -1;
            if (v >= hi || w->stop)
                break;
        }
        r = re + 1;
    }
    if (!w->each)
        return expand(w, close + 1, end, len + longest);
    return 0;
}

/* Every item of list, top-level commas apart. 0 or -1. */
static int walk(walk_t *w, const char *list)
{
    const char *s = list;
    while (1) {
        const char *e = s;
        int depth = 0;
        while (*e && (*e != ',' || depth)) {
            depth += *e == '[' ? 1 : *e == ']' ? -1 : 0;
            if (depth < 0 || depth > 1)
                return -1;
            e++;
        }
        if (depth || e == s || expand(w, s, e, 0) < 0)
            return -1;
        if (!*e || (w->each && w->stop))
            return 0;
        s = e + 1;
    }
}

int tt_hostlist_each(const char *list, int (*each)(void *ctx, const char *host), void *ctx)
{
    walk_t check = { 0 }, w = { .each = each, .ctx = ctx };
    if (!list || walk(&check, list) < 0 || walk(&w, list) < 0)
        return -1;
    return w.count;
}

typedef struct first {
    char *out;
    size_t len;
    int fits;
} first_t;

static int take_first(void *ctx, const char *host)
{
    first_t *f = ctx;
    f->fits = strlen(host) < f->len;
    if (f->fits)
        memcpy(f->out, host, strlen(host) + 1);
    return 1;
}

int tt_hostlist_first(const char *list, char *out, size_t len)
{
    first_t f = { out, len, 0 };
    return tt_hostlist_each(list, take_first, &f) < 1 || !f.fits ? -1 : 0;
}
