/* Logging: TUTTI_DEBUG=error|warn|info|trace, one line each, "tutti host:pid:rank LEVEL msg".
 * Also tt_env, which the log level reads, so that logging depends on nothing. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
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

const char *tt_env_or(const char *name, const char *other)
{
    const char *v = tt_env_set(name);
    if (v)
        return v;
    v = getenv(other);
    return v && *v ? v : NULL;
}

static atomic_int log_level = -1;
static atomic_int log_rank = -1;

int tt_log_level_parse(const char *s)
{
    static const struct {
        const char *name;
        int level;
    } names[] = {
        { "error", TUTTI_LOG_ERROR }, { "warn", TUTTI_LOG_WARN },  { "info", TUTTI_LOG_INFO },
        { "trace", TUTTI_LOG_TRACE }, { "none", TUTTI_LOG_ERROR }, { "0", TUTTI_LOG_ERROR },
        { "debug", TUTTI_LOG_TRACE },
    };
    if (!s || !*s)
        return TUTTI_LOG_WARN;
    for (size_t i = 0; i < TT_ARRAY_SIZE(names); i++)
        if (!strcasecmp(s, names[i].name))
            return names[i].level;
    return -1;
}

int tt_log_level(void)
{
    int lvl = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (lvl >= 0)
        return lvl;
    const char *s = tt_env("DEBUG");
    int parsed = tt_log_level_parse(s);
    lvl = parsed < 0 ? TUTTI_LOG_WARN : parsed;
    int unset = -1;
    /* the first thread to get here says so, once */
    if (atomic_compare_exchange_strong(&log_level, &unset, lvl) && parsed < 0)
        tt_log(TUTTI_LOG_WARN,
               "TUTTI_DEBUG=%s is none of error, warn, info, trace (or none, 0: error; debug: "
               "trace); using warn",
               s);
    return atomic_load(&log_level);
}

/* The rank in the prefix: this process's rank in the live communicator with the most
 * ranks, the one made first among equals, so that a subgroup, a split or a communicator
 * of one made later does not change it (a torch process group is a communicator). When
 * that one is destroyed, the next by the same rule; with none live, the rank of the last
 * one (or of the init under way, tt_log_set_rank); before any, '-'. */
typedef struct {
    const void *key;
    int rank, nranks;
} log_comm_t;

static pthread_mutex_t comms_lock = PTHREAD_MUTEX_INITIALIZER;
static log_comm_t *comms;
static size_t ncomms, comms_cap;

/* Under comms_lock. */
static void log_rank_update(void)
{
    const log_comm_t *best = NULL;
    for (size_t i = 0; i < ncomms; i++)
        if (!best || comms[i].nranks > best->nranks)
            best = &comms[i];
    if (best)
        atomic_store(&log_rank, best->rank);
}

void tt_log_set_rank(int rank)
{
    pthread_mutex_lock(&comms_lock);
    if (!ncomms) /* an init under way with none live: its rank until it is made */
        atomic_store(&log_rank, rank);
    pthread_mutex_unlock(&comms_lock);
}

void tt_log_comm_live(const void *key, int rank, int nranks)
{
    pthread_mutex_lock(&comms_lock);
    if (ncomms == comms_cap) {
        size_t cap = comms_cap ? 2 * comms_cap : 8;
        log_comm_t *c = realloc(comms, cap * sizeof(*c));
        if (!c) { /* the prefix keeps what it had */
            pthread_mutex_unlock(&comms_lock);
            return;
        }
        comms = c;
        comms_cap = cap;
    }
    comms[ncomms++] = (log_comm_t){ key, rank, nranks };
    log_rank_update();
    pthread_mutex_unlock(&comms_lock);
}

void tt_log_comm_gone(const void *key)
{
    pthread_mutex_lock(&comms_lock);
    for (size_t i = 0; i < ncomms; i++) {
        if (comms[i].key != key)
            continue;
        memmove(&comms[i], &comms[i + 1], (ncomms - i - 1) * sizeof(*comms));
        ncomms--;
        break;
    }
    log_rank_update(); /* none left: the last one's rank stays */
    pthread_mutex_unlock(&comms_lock);
}

/* s (n bytes) into out (room bytes, room > 0) with control characters escaped (\n, \r,
 * \t, \xNN), so that each entry is one line whatever a value it quotes holds; the
 * length written, cut short where out is full. */
static size_t log_escape(char *out, size_t room, const char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[5];
        size_t k;
        if (c >= 0x20 && c != 0x7f) {
            esc[0] = (char)c;
            k = 1;
        } else if (c == '\n' || c == '\r' || c == '\t') {
            esc[0] = '\\';
            esc[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
            k = 2;
        } else {
            snprintf(esc, sizeof(esc), "\\x%02x", c);
            k = 4;
        }
        if (o + k > room)
            break;
        memcpy(out + o, esc, k);
        o += k;
    }
    return o;
}

/* TUTTI_DEBUG_FILE (NCCL_DEBUG_FILE's): the log goes to this file instead of stderr, its
 * name with %h the host's name and %p the pid (%% a %), opened for appending at the
 * first line; a forked child opens its own where the name has %p (its copy of the
 * parent's descriptor is left open: it may have been closed and its number reused by
 * then; O_CLOEXEC). A name that cannot be opened: stderr, said there once (per
 * process). The variable is read once, at the first line (getenv beside another
 * thread's setenv is not safe), as TUTTI_DEBUG is. No lock (a child forked while another
 * thread logged must not block): the fd and its pid in one atomic word; two threads
 * that open at once keep the first's. */
static _Atomic uint64_t log_file; /* fd + 1 << 32 | pid; 0: none yet */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "the log's fd word must be lock-free");
static char *_Atomic log_pattern; /* TUTTI_DEBUG_FILE as read at the first line ("": unset) */

static const char *log_pattern_get(void)
{
    char *p = atomic_load(&log_pattern);
    if (p)
        return p;
    const char *v = tt_env("DEBUG_FILE");
    char *mine = strdup(v ? v : ""), *none = NULL;
    if (!mine)
        return "";
    if (!atomic_compare_exchange_strong(&log_pattern, &none, mine))
        free(mine); /* another thread's is in place */
    return atomic_load(&log_pattern);
}

/* Does the pattern name the pid (a %p that is no %%'s)? */
static int log_by_pid(const char *pat)
{
    for (const char *p = pat; *p; p++)
        if (p[0] == '%' && (p[1] == 'p' || p[1] == '%'))
            if (*++p == 'p')
                return 1;
    return 0;
}

/* The log file's name from pattern. */
static void log_path(const char *pat, const char *host, uint32_t pid, char *path, size_t len)
{
    size_t o = 0;
    for (const char *p = pat; *p && o + 1 < len; p++) {
        int w = 0;
        if (p[0] == '%' && p[1] == 'h')
            w = snprintf(path + o, len - o, "%s", host), p++;
        else if (p[0] == '%' && p[1] == 'p')
            w = snprintf(path + o, len - o, "%u", (unsigned)pid), p++;
        else if (p[0] == '%' && p[1] == '%')
            path[o] = '%', w = 1, p++;
        else
            path[o] = *p, w = 1;
        o += w < 0 ? 0 : (size_t)w;
    }
    path[o < len ? o : len - 1] = '\0';
}

static int log_fd(const char *host)
{
    const char *pat = log_pattern_get();
    if (!*pat)
        return STDERR_FILENO;
    uint32_t pid = (uint32_t)getpid();
    uint64_t was = atomic_load(&log_file);
    if (was && ((uint32_t)was == pid || !log_by_pid(pat)))
        return (int)(was >> 32) - 1; /* (the name is made only to open it) */
    char path[4096];
    log_path(pat, host, pid, path, sizeof(path));
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        char msg[4400];
        int n = snprintf(msg, sizeof(msg),
                         "tutti %s:%u:- WARN TUTTI_DEBUG_FILE=%s: cannot open %s (%s): logging "
                         "to stderr\n",
                         host, (unsigned)pid, pat, path, strerror(errno));
        fd = STDERR_FILENO;
        if (atomic_compare_exchange_strong(&log_file, &was, (uint64_t)(fd + 1) << 32 | pid) &&
            n > 0)
            (void)!write(STDERR_FILENO, msg, (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
        return (int)(atomic_load(&log_file) >> 32) - 1;
    }
    if (!atomic_compare_exchange_strong(&log_file, &was, (uint64_t)(fd + 1) << 32 | pid)) {
        close(fd); /* another thread's is in place */
        return (int)(atomic_load(&log_file) >> 32) - 1;
    }
    return fd;
}

void tt_vlog(int level, const char *fmt, va_list ap)
{
    static const char *names[] = { "ERROR", "WARN", "INFO", "TRACE" };
    char host[64] = "?";
    char rank[16] = "-";
    char msg[2048], line[2048];
    gethostname(host, sizeof(host) - 1);
    int r = atomic_load(&log_rank);
    if (r >= 0)
        snprintf(rank, sizeof(rank), "%d", r);
    int n = snprintf(line, sizeof(line), "tutti %s:%d:%s %s ", host, (int)getpid(), rank,
                     names[level < 0   ? 0
                           : level > 3 ? 3
                                       : level]);
    if (n < 0 || (size_t)n >= sizeof(line))
        n = 0;
    int m = vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t mlen = m < 0 ? 0 : (size_t)m >= sizeof(msg) ? sizeof(msg) - 1 : (size_t)m;
    if (mlen && msg[mlen - 1] == '\n') /* a message's own end of line is the entry's */
        mlen--;
    size_t len = (size_t)n + log_escape(line + n, sizeof(line) - (size_t)n - 1, msg, mlen);
    line[len++] = '\n';
    /* one write() per line so lines of several processes do not interleave */
    ssize_t w = write(log_fd(host), line, len);
    (void)w;
}

void tt_log(int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tt_vlog(level, fmt, ap);
    va_end(ap);
}

/* ---- the thread's error without a communicator ---- */

static __thread char thread_error[TT_ERRMSG_LEN];

char *tt_thread_error(void)
{
    return thread_error;
}

int tt_thread_error_set(int st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(thread_error, sizeof(thread_error), fmt, ap);
    va_end(ap);
    TT_INFO("%s", thread_error);
    return st;
}
