/* Logging: TUTTI_DEBUG=warn|info|trace, one line each, "tutti host:pid:rank LEVEL msg".
 * Also tt_env, which the log level reads, so that logging depends on nothing. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/base.h"

const char *tt_env(const char *name)
{
    char full[128];
    snprintf(full, sizeof(full), "TUTTI_%s", name);
    const char *v = getenv(full);
    return (v && *v) ? v : NULL;
}

const char *tt_env_set(const char *name)
{
    char full[128];
    snprintf(full, sizeof(full), "TUTTI_%s", name);
    return getenv(full);
}

static atomic_int log_level = -1;
static atomic_int log_rank = -1;

int tt_log_level(void)
{
    int lvl = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (lvl >= 0)
        return lvl;
    const char *s = tt_env("DEBUG");
    lvl = TUTTI_LOG_WARN;
    if (s) {
        if (!strcasecmp(s, "error") || !strcasecmp(s, "none") || !strcmp(s, "0"))
            lvl = TUTTI_LOG_ERROR;
        else if (!strcasecmp(s, "info"))
            lvl = TUTTI_LOG_INFO;
        else if (!strcasecmp(s, "trace") || !strcasecmp(s, "debug"))
            lvl = TUTTI_LOG_TRACE;
    }
    atomic_store(&log_level, lvl);
    return lvl;
}

void tt_log_set_rank(int rank)
{
    atomic_store(&log_rank, rank);
}

void tt_vlog(int level, const char *fmt, va_list ap)
{
    static const char *names[] = { "ERROR", "WARN", "INFO", "TRACE" };
    char host[64] = "?";
    char line[2048];
    gethostname(host, sizeof(host) - 1);
    int n = snprintf(line, sizeof(line), "tutti %s:%d:%d %s ", host, (int)getpid(),
                     atomic_load(&log_rank),
                     names[level < 0   ? 0
                           : level > 3 ? 3
                                       : level]);
    if (n < 0 || (size_t)n >= sizeof(line))
        n = 0;
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2;
    line[len++] = '\n';
    /* one write() per line so lines of several processes do not interleave */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

void tt_log(int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tt_vlog(level, fmt, ap);
    va_end(ap);
}
