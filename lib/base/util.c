/* Time, environment and small string helpers. */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "../../transports/kit/copy.h"
#include "../../transports/kit/util.h" /* tp_parse_size: one size grammar */

void tt_copy(void *dst, const void *src, size_t n)
{
    tp_copy(dst, src, n);
}

uint64_t tt_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t tt_coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t tt_deadline_ns(int timeout_ms)
{
    if (timeout_ms < 0)
        return UINT64_MAX;
    return tt_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

int tt_ms_left(uint64_t deadline_ns)
{
    return tt_ms_left_at(deadline_ns, tt_now_ns());
}

int tt_ms_left_at(uint64_t deadline_ns, uint64_t now)
{
    if (deadline_ns == UINT64_MAX)
        return INT32_MAX / 2;
    if (now >= deadline_ns)
        return 0;
    uint64_t ms = (deadline_ns - now + 999999ull) / 1000000ull;
    return ms > INT32_MAX / 2 ? INT32_MAX / 2 : (int)ms;
}

long tt_env_count(const char *name)
{
    const char *v = name ? getenv(name) : NULL;
    char *end;
    errno = 0;
    long x = v && *v ? strtol(v, &end, 10) : -1;
    /* beyond an int is no count (strtol's ERANGE is LONG_MAX): never two equal ones */
    return v && *v && !*end && !errno && x >= 0 && x <= INT32_MAX ? x : -1;
}

int tt_warn_first(const char *name, const char *value)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t *seen;
    static size_t nseen, cap;
    uint64_t h = 1469598103934665603ull; /* FNV-1a of "name=value" */
    for (const char *p = name; p && *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ '=') * 1099511628211ull;
    for (const char *p = value; p && *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    int first = 1;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nseen && first; i++)
        first = seen[i] != h;
    if (first && nseen == cap) {
        uint64_t *s = realloc(seen, (cap ? 2 * cap : 16) * sizeof(*s));
        if (s) {
            seen = s;
            cap = cap ? 2 * cap : 16;
        }
    }
    if (first && nseen < cap)
        seen[nseen++] = h;
    pthread_mutex_unlock(&lock);
    return first;
}

int tt_env_int(const char *name, int def)
{
    const char *v = tt_env(name);
    if (!v)
        return def;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < INT32_MIN || x > INT32_MAX) {
        if (tt_warn_first(name, v))
            TT_WARN("TUTTI_%s=%s is not an integer; using %d", name, v, def);
        return def;
    }
    return (int)x;
}

int tt_parse_size(const char *s, size_t *size_p)
{
    return tp_parse_size(s, size_p) < 0 ? TUTTI_ERR_INVALID_ARG : TUTTI_OK;
}

char *tt_strdup(const char *s)
{
    return s ? strdup(s) : NULL;
}

const char *tt_kv_lookup(const char *list, const char *name, char *buf, size_t buflen)
{
    size_t nl = strlen(name);
    while (list && *list) {
        const char *end = strchr(list, ',');
        size_t len = end ? (size_t)(end - list) : strlen(list);
        if (len > nl && list[nl] == '=' && !strncmp(list, name, nl)) {
            snprintf(buf, buflen, "%.*s", (int)(len - nl - 1), list + nl + 1);
            return buf;
        }
        list = end ? end + 1 : NULL;
    }
    return NULL;
}
