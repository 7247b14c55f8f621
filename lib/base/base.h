/* Internal helpers shared by every part of libtutti: logging, checks, time, env. */
#ifndef TT_INTERNAL_H
#define TT_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <tutti/status.h>
#include <tutti/transport_v1.h>

#define TT_UNUSED(x) ((void)(x))
#define TT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TT_MAX(a, b) ((a) > (b) ? (a) : (b))
#define TT_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Log levels: TUTTI_LOG_ERROR/WARN/INFO/TRACE (transport_v1.h). TUTTI_DEBUG picks the
 * highest one printed (default: warn; a value that is none of them is warned about once). */
int tt_log_level(void);
/* A TUTTI_DEBUG value, case-insensitive: error (also none, 0), warn, info, trace (also
 * debug); NULL or empty: warn; -1 for anything else. tutti-run reads it the same way. */
int tt_log_level_parse(const char *s);
/* The rank printed in log lines of this process: the rank of an init under way while no
 * communicator is live ('-' before any). */
void tt_log_set_rank(int rank);
/* A communicator (key: anything unique while it lives) of nranks whose rank is rank is
 * live / gone: the prefix shows the rank in the live one with the most ranks, the
 * earliest among equals, so a subgroup made later does not change it. */
void tt_log_comm_live(const void *key, int rank, int nranks);
void tt_log_comm_gone(const void *key);
/* The room for an error message (a communicator's last error, the thread's). */
#define TT_ERRMSG_LEN 1024
/* The thread's error without a communicator (tutti_comm_last_error(NULL): a failed
 * init's, comm.c), which calls that have none set too (tutti_mrecv, the datatype
 * constructors); logged at info; returns status. */
int tt_thread_error_set(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *tt_thread_error(void); /* its buffer, TT_ERRMSG_LEN bytes */

/* One line to stderr: "tutti host:pid:rank LEVEL message", control characters in the
 * message escaped (\n, \xNN), so that a value it quotes cannot start a line of its own. */
void tt_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tt_vlog(int level, const char *fmt, va_list ap);

#define TT_WARN(...)                                                                               \
    do {                                                                                           \
        if (tt_log_level() >= TUTTI_LOG_WARN)                                                      \
            tt_log(TUTTI_LOG_WARN, __VA_ARGS__);                                                   \
    } while (0)
#define TT_INFO(...)                                                                               \
    do {                                                                                           \
        if (tt_log_level() >= TUTTI_LOG_INFO)                                                      \
            tt_log(TUTTI_LOG_INFO, __VA_ARGS__);                                                   \
    } while (0)
#define TT_TRACE(...)                                                                              \
    do {                                                                                           \
        if (tt_log_level() >= TUTTI_LOG_TRACE)                                                     \
            tt_log(TUTTI_LOG_TRACE, __VA_ARGS__);                                                  \
    } while (0)

/* Return early on a negative status, leaving a breadcrumb (file:line -> status) at
 * trace level so that a failure deep down reads as a trail. */
#define TT_CHECK(call)                                                                             \
    do {                                                                                           \
        int tt_check_st_ = (call);                                                                 \
        if (tt_check_st_ < 0) {                                                                    \
            TT_TRACE("%s:%d %s -> %s", __FILE__, __LINE__, #call,                                  \
                     tutti_status_name(tt_check_st_));                                             \
            return tt_check_st_;                                                                   \
        }                                                                                          \
    } while (0)

#define TT_CHECK_GOTO(call, st, label)                                                             \
    do {                                                                                           \
        (st) = (call);                                                                             \
        if ((st) < 0) {                                                                            \
            TT_TRACE("%s:%d %s -> %s", __FILE__, __LINE__, #call, tutti_status_name(st));          \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* memcpy of user data and staging buffers (no overlap), without glibc's slow REP MOVSB
 * case on AMD (transports/kit/copy.h, where the transports get it as tp_copy). */
void tt_copy(void *dst, const void *src, size_t n);

/* Monotonic clock in nanoseconds. */
uint64_t tt_now_ns(void);
/* The same clock at the kernel tick's resolution (1-4 ms; never ahead of tt_now_ns):
 * a quarter of tt_now_ns's price (7 against 28 ns here), for the per-op bookkeeping of
 * deadlines and stopped-process checks, whose thresholds are 100 ms and up. */
uint64_t tt_coarse_ns(void);
/* Deadline timeout_ms from now (timeout_ms < 0: never). */
uint64_t tt_deadline_ns(int timeout_ms);
/* Milliseconds left until deadline, >= 0, capped at INT32_MAX/2. */
int tt_ms_left(uint64_t deadline_ns);
/* The same from a clock reading the caller already has (hot paths read it once). */
int tt_ms_left_at(uint64_t deadline_ns, uint64_t now_ns);

/* Environment: TUTTI_<name>; an empty value is taken for unset. tt_env_int warns about a
 * value that is not an integer (and returns def) once per process, as every warning
 * about the environment is: */
const char *tt_env(const char *name);
/* TUTTI_<name> as it is, empty included (NULL: unset): for a variable whose empty value
 * must fail, not mean unset (the job secret: authentication must not go off). */
const char *tt_env_set(const char *name);
/* TUTTI_<name> as tt_env_set reads it; unset, the variable other (not prefixed; its empty
 * value unset): a peer's name for the knob (Gloo's). */
const char *tt_env_or(const char *name, const char *other);
int tt_env_int(const char *name, int def);
/* 1 the first time this process asks about name (TUTTI_<name>, or a field) with this
 * value, 0 after: tutti_comm_opts_init, then each communicator's reading of the same
 * environment, warn once, not once a reading. */
int tt_warn_first(const char *name, const char *value);
/* A launcher's count or rank (any variable name, as given; NULL: none): the
 * non-negative decimal integer it holds, up to INT32_MAX, else -1 (unset, empty, or not
 * such a number). */
long tt_env_count(const char *name);
/* "4096", "64K", "1M", "2G", "1MB" (binary units; transports/kit/util.h's tp_parse_size,
 * the one grammar of every size); returns TUTTI_ERR_INVALID_ARG otherwise. */
int tt_parse_size(const char *s, size_t *size_p);

/* exec.c: while on (calls nest, per thread), async ops this thread issues are queued
 * without waking the progress thread, for an issuer that waits next: the waiter runs
 * them itself, saving a thread handoff. If nobody has started one within 200 us, the
 * progress thread does at its next tick (every 10 ms): progress without a waiter. */
void tt_exec_defer(int on);

/* strdup that tolerates NULL. */
char *tt_strdup(const char *s);

/* In "NAME=VALUE,NAME=VALUE", the value of name copied to buf, or NULL. */
const char *tt_kv_lookup(const char *list, const char *name, char *buf, size_t buflen);

#endif /* TT_INTERNAL_H */
