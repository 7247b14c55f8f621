/* The flight recorder (trace.h): the ring of the last operations, and its JSON dump,
 * on request (tutti_comm_trace_dump) or into opts.trace_dir when the communicator first
 * fails. The format is docs/architecture.md's "The flight recorder"; tools/tutti-trace
 * reads the dumps of every rank and says where they part. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/auth.h"
#include "base/base.h"
#include "coll/names.h"
#include "core/envelope.h"
#include "core/fault.h"
#include "core/state.h"
#include "core/trace.h"

/* The ring's size limits (TUTTI_TRACE_ENTRIES): a slot is 72 bytes. */
#define TT_TRACE_MAX (1 << 20)

int tt_trace_init(tutti_comm_t *comm)
{
    /* the communicator's life, from here to tt_trace_free, is also the log's: its rank
     * may be the one the log prefix shows (base.h, tt_log_comm_live) */
    tt_log_comm_live(comm, comm->rank, comm->nranks);
    int n = comm->opts.trace_entries;
    if (n <= 0)
        return TUTTI_OK;
    if (n > TT_TRACE_MAX)
        n = TT_TRACE_MAX;
    tt_trace_t *t = calloc(1, sizeof(*t) + (size_t)n * sizeof(tt_trace_ent_t));
    if (!t)
        return TUTTI_ERR_NOMEM;
    t->n = (uint32_t)n;
    comm->trace = t;
    return TUTTI_OK;
}

void tt_trace_free(tutti_comm_t *comm)
{
    tt_log_comm_gone(comm);
    free(comm->trace);
    comm->trace = NULL;
    if (comm->watch_store)
        tutti_store_close(comm->watch_store);
    comm->watch_store = NULL;
}

/* The slot of record id (1-based), if the ring still holds it. */
static tt_trace_ent_t *slot_of(tt_trace_t *t, uint64_t id)
{
    if (!t || !id)
        return NULL;
    tt_trace_ent_t *e = &t->ent[(id - 1) % t->n];
    return e->id == id ? e : NULL;
}

void tt_trace_issue(tutti_comm_t *comm, tt_op_t *op, tutti_redop_t user_redop, int flags, int peer,
                    uint32_t tag, uint64_t now, int started)
{
    tt_trace_t *t = comm->trace;
    if (!t) {
        op->trace_id = 0;
        return;
    }
    uint64_t id = ++t->next;
    tt_trace_ent_t *e = &t->ent[(id - 1) % t->n];
    *e = (tt_trace_ent_t){ .id = id,
                           .seq = op->seq,
                           .count = op->count,
                           .t_issue = now,
                           .root = op->coll == TT_COLL_P2P ? peer : op->root,
                           .redop = (int32_t)user_redop,
                           .tag = tag,
                           .coll = (uint8_t)op->coll,
                           .dtype = (uint8_t)op->dtype,
                           .t_start = started ? now : 0,
                           .state = started ? TT_TRACE_STARTED : TT_TRACE_ISSUED,
                           .flags = (uint8_t)(flags |
                                              (op->fingerprint & TT_FP_V ? TT_TRACE_F_V : 0)) };
    op->trace_id = id;
    op->trace_t0 = now;
    op->trace_flags = e->flags;
}

void tt_trace_matched(tutti_comm_t *comm, const tt_op_t *op, int peer, uint32_t tag)
{
    tt_trace_ent_t *e = slot_of(comm->trace, op->trace_id);
    if (!e)
        return;
    e->root = peer;
    e->tag = tag; /* (a TUTTI_ANY_TAG receive's: the message's) */
    e->seq = op->seq;
    e->count = op->count; /* (a tutti_recv_upto's: the message's, as it takes it) */
    e->dtype = (uint8_t)op->dtype;
    e->flags &= (uint8_t)~TT_TRACE_F_LATE;
}

void tt_trace_start(tutti_comm_t *comm, const tt_op_t *op, uint64_t now)
{
    tt_trace_ent_t *e = slot_of(comm->trace, op->trace_id);
    if (!e)
        return;
    e->t_start = now;
    e->state = TT_TRACE_STARTED;
}

void tt_trace_end(tutti_comm_t *comm, const tt_op_t *op, int peer, int status)
{
    /* the communicator failed (or was aborted) and this op has ended: its record is due
     * (a flush before the failing op ended would catch it still running) */
    if (status < 0 && (atomic_load(&comm->failed) < 0 || atomic_load(&comm->aborted)))
        tt_trace_due(comm);
    tt_trace_ent_t *e = slot_of(comm->trace, op->trace_id);
    if (!e)
        return;
    /* A collective that completed went through tt_op_finish, which read the clock as it
     * ended (op_end_ns): at or after its start, that reading is its end (a local op, one
     * rank, ends within the tick of its start). Saves a clock read per call (7 ns of the
     * 0.5 us of 2 ranks' 4 B allreduce over shm). */
    uint64_t now = status == TUTTI_OK && op->coll != TT_COLL_P2P && e->t_start &&
                           comm->op_end_ns >= e->t_start
                       ? comm->op_end_ns
                       : tt_coarse_ns();
    if (!e->t_start)
        e->t_start = now;
    e->t_end = now;
    e->status = status;
    e->state = status < 0 ? TT_TRACE_FAILED : TT_TRACE_DONE;
    e->algo_id = op->algo_id;
    e->seq = op->seq;
    if (peer >= 0)
        e->root = peer;
}

void tt_trace_due(tutti_comm_t *comm)
{
    if (comm->trace && comm->opts.trace_dir && comm->opts.trace_dir[0])
        atomic_store(&comm->trace_due, 1);
}

/* ---- the dump ---- */

typedef struct jbuf {
    char *p;
    size_t len, cap;
    int nomem;
} jbuf_t;

__attribute__((format(printf, 2, 3))) static void jb_printf(jbuf_t *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = b->p ? vsnprintf(b->p + b->len, room, fmt, ap) : -1;
        va_end(ap);
        if (n >= 0 && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 65536;
        while (n >= 0 && cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *p = b->nomem ? NULL : realloc(b->p, cap);
        if (!p) {
            b->nomem = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* s as a JSON string (quotes included) */
static void jb_str(jbuf_t *b, const char *s)
{
    jb_printf(b, "\"");
    for (const unsigned char *c = (const unsigned char *)(s ? s : ""); *c; c++) {
        if (*c == '"' || *c == '\\')
            jb_printf(b, "\\%c", *c);
        else if (*c < 0x20 || *c == 0x7f)
            jb_printf(b, "\\u%04x", *c);
        else
            jb_printf(b, "%c", *c);
    }
    jb_printf(b, "\"");
}

static const char *state_name(int s)
{
    static const char *const names[] = { "issued", "started", "completed", "failed" };
    return s >= 0 && s < 4 ? names[s] : "?";
}

static const char *op_name(const tt_trace_ent_t *e)
{
    if (e->coll == TT_COLL_P2P)
        return e->flags & TT_TRACE_F_SEND ? "send" : "recv";
    const char *n = tt_coll_name((tt_coll_t)e->coll);
    return n ? n : "?";
}

/* wall-clock microseconds of a tt_coarse_ns reading (0 stays 0) */
static long long wall_us(uint64_t t, int64_t off_ns)
{
    return t ? (long long)(((int64_t)t + off_ns) / 1000) : 0;
}

static void dump_entry(jbuf_t *b, const tt_trace_ent_t *e, uint32_t running_algo, int64_t off)
{
    int p2p = e->coll == TT_COLL_P2P;
    uint32_t algo = e->state == TT_TRACE_STARTED && !p2p ? running_algo : e->algo_id;
    jb_printf(b, "{\"id\": %llu, \"seq\": %llu, \"op\": \"%s%s\", \"state\": \"%s\"",
              (unsigned long long)e->id, (unsigned long long)e->seq, op_name(e),
              e->flags & TT_TRACE_F_V ? "v" : "", state_name(e->state));
    if (e->state == TT_TRACE_FAILED)
        jb_printf(b, ", \"status\": \"%s\"", tutti_status_name(e->status));
    const char *an = !p2p && algo ? tt_algo_name(algo) : NULL;
    if (an)
        jb_printf(b, ", \"algo\": \"%s\"", an);
    jb_printf(b, ", \"dtype\": \"%s\", \"count\": %llu, \"bytes\": %llu",
              tutti_dtype_name((tutti_dtype_t)e->dtype), (unsigned long long)e->count,
              (unsigned long long)(e->count * tutti_dtype_size((tutti_dtype_t)e->dtype)));
    if (p2p) {
        if (e->tag == TUTTI_ANY_TAG) /* a receive of any tag that found nothing yet */
            jb_printf(b, ", \"peer\": %d, \"tag\": \"any\"", e->root);
        else
            jb_printf(b, ", \"peer\": %d, \"tag\": %u", e->root, e->tag);
    } else {
        if (e->flags & TT_TRACE_F_REDOP) {
            jb_printf(b, ", \"redop\": ");
            jb_str(b, tutti_redop_name((tutti_redop_t)e->redop));
        }
        if (e->flags & TT_TRACE_F_ROOT)
            jb_printf(b, ", \"root\": %d", e->root);
    }
    if (e->flags & TT_TRACE_F_ANY)
        jb_printf(b, ", \"any_source\": true");
    if (e->flags & TT_TRACE_F_LATE)
        jb_printf(b, ", \"unnumbered\": true");
    if (e->flags & TT_TRACE_F_EVICTED)
        jb_printf(b, ", \"evicted\": true");
    jb_printf(b, ", \"async\": %s, \"issued_us\": %lld, \"started_us\": %lld, \"ended_us\": %lld}",
              e->flags & TT_TRACE_F_ASYNC ? "true" : "false", wall_us(e->t_issue, off),
              wall_us(e->t_start, off), wall_us(e->t_end, off));
}

static int64_t clock_off_ns(void)
{
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    uint64_t mono = tt_now_ns();
    return (int64_t)rt.tv_sec * 1000000000ll + rt.tv_nsec - (int64_t)mono;
}

/* An open op whose slot later ops took, as a slot (q_lock held). */
static tt_trace_ent_t evicted_ent(const tutti_work_t *w, int posted)
{
    const tt_op_t *op = &w->op;
    int p2p = op->coll == TT_COLL_P2P;
    return (tt_trace_ent_t){
        .id = op->trace_id,
        .seq = op->seq,
        .count = op->count,
        .t_issue = op->trace_t0,
        .root = p2p ? (w->req.peer >= 0 ? w->req.peer : w->seek_p1 - 1) : op->root,
        .redop = (int32_t)w->user_redop,
        .tag = p2p ? tt_env_tag(w->req.env) : 0,
        .coll = (uint8_t)op->coll,
        .dtype = (uint8_t)op->dtype,
        .state = posted ? TT_TRACE_STARTED : TT_TRACE_ISSUED,
        .flags = (uint8_t)((op->trace_flags & ~TT_TRACE_F_LATE) | TT_TRACE_F_EVICTED |
                           (w->late_seq || (w->seek_p1 && w->req.peer < 0) ? TT_TRACE_F_LATE : 0))
    };
}

/* The open ops (queued, or posted and in flight) that the ring no longer holds, into
 * out (up to max; q_lock held): with more open ops than slots, the oldest, often the
 * one that hangs (a receive nobody sends to), would be missing from the record. */
static int open_evicted(tutti_comm_t *comm, tt_trace_ent_t *out, int max)
{
    int k = 0;
    for (const tutti_work_t *w = comm->inflight; w && k < max; w = w->inflight_next)
        if (w->op.trace_id && !slot_of(comm->trace, w->op.trace_id))
            out[k++] = evicted_ent(w, 1);
    for (const tutti_work_t *w = comm->q_head; w && k < max; w = w->next)
        if (w->op.trace_id && !slot_of(comm->trace, w->op.trace_id))
            out[k++] = evicted_ent(w, 0);
    return k;
}

#define TT_TRACE_EVICTED_MAX 1024

/* The communicator's record as JSON into b (q_lock not held). */
static void dump_json(tutti_comm_t *comm, const char *reason, jbuf_t *b)
{
    tt_trace_t *t = comm->trace;
    uint32_t n = t ? t->n : 0;
    tt_trace_ent_t *copy = n ? malloc(((size_t)n + TT_TRACE_EVICTED_MAX) * sizeof(*copy)) : NULL;
    uint64_t next = 0, first = 0, colls = 0;
    uint32_t running_algo = 0;
    int nevicted = 0;
    pthread_mutex_lock(&comm->q_lock);
    colls = comm->next_seq;
    if (copy) {
        next = t->next;
        first = next > n ? next - n : 0;
        for (uint64_t id = first + 1; id <= next; id++)
            copy[id - first - 1] = t->ent[(id - 1) % n];
        running_algo = atomic_load_explicit(&comm->trace_algo, memory_order_relaxed);
        if (next > n)
            nevicted = open_evicted(comm, copy + (next - first), TT_TRACE_EVICTED_MAX);
    }
    pthread_mutex_unlock(&comm->q_lock);
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    int64_t off = clock_off_ns();
    int failed = atomic_load(&comm->failed);
    jb_printf(b, "{\"tutti_trace\": 1, \"version\": \"%s\", \"reason\": ", tutti_version_string());
    jb_str(b, reason);
    jb_printf(b, ", \"rank\": %d, \"size\": %d, \"host\": ", comm->rank, comm->nranks);
    jb_str(b, host);
    jb_printf(b, ", \"pid\": %ld, \"job_id\": ", (long)getpid());
    jb_str(b, comm->job_id);
    jb_printf(b, ", \"comm\": ");
    jb_str(b, comm->job_base);
    jb_printf(b, ", \"instance\": ");
    jb_str(b, comm->instance);
    jb_printf(b, ", \"transport\": ");
    jb_str(b, comm->tp_name);
    jb_printf(b, ", \"time_us\": %lld, \"entries\": %u, \"recorded\": %llu, \"collectives\": %llu",
              wall_us(tt_now_ns(), off), n, (unsigned long long)next, (unsigned long long)colls);
    if (failed < 0 || atomic_load(&comm->aborted)) {
        char err[TT_ERRMSG_LEN];
        pthread_mutex_lock(&comm->err_lock);
        snprintf(err, sizeof(err), "%s", comm->last_error);
        pthread_mutex_unlock(&comm->err_lock);
        jb_printf(b, ", \"failed\": \"%s\", \"error\": ",
                  tutti_status_name(failed < 0 ? failed : TUTTI_ERR_ABORTED));
        jb_str(b, err);
    }
    jb_printf(b, ",\n\"ops\": [");
    for (uint64_t i = 0; copy && i < next - first + (uint64_t)nevicted; i++) {
        jb_printf(b, "%s\n", i ? "," : "");
        dump_entry(b, &copy[i], running_algo, off);
    }
    jb_printf(b, "\n]}\n");
    free(copy);
}

static int write_all(int fd, const char *p, size_t len)
{
    errno = 0;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

static int dump_to(tutti_comm_t *comm, int fd, const char *reason, char *err, size_t errlen)
{
    jbuf_t b = { 0 };
    dump_json(comm, reason, &b);
    int st = TUTTI_OK;
    if (b.nomem) {
        snprintf(err, errlen, "out of memory for the flight record");
        st = TUTTI_ERR_NOMEM;
    } else if (write_all(fd, b.p, b.len) < 0) {
        snprintf(err, errlen, "writing the flight record: %s",
                 errno ? strerror(errno) : "the file took no more bytes");
        st = TUTTI_ERR_IO;
    }
    free(b.p);
    return st;
}

int tutti_comm_trace_dump(tutti_comm_t *comm, int fd)
{
    if (!comm || fd < 0)
        return TUTTI_ERR_INVALID_ARG;
    if (tt_comm_foreign(comm)) /* (its records are under q_lock) */
        return tt_comm_refuse_foreign(comm, "trace_dump", 0);
    char err[256];
    int st = dump_to(comm, fd, "request", err, sizeof(err));
    if (st < 0)
        TT_WARN("tutti_comm_trace_dump: %s", err);
    return st;
}

/* <dir>/<comm's key space, '/' and other odd characters as '_'><instance>.rank<r>.json;
 * a key space too long for the name keeps its head and a hash of the whole (a split's
 * suffix is at its end), and the instance always: a split and its parent, or two runs,
 * never share a file (before, the name was cut at 159 bytes, instance and all) */
static int trace_path(const tutti_comm_t *comm, char *path, size_t len)
{
    char ident[160];
    const char *inst = strrchr(comm->instance, '/');
    inst = inst ? inst + 1 : "";
    size_t blen = strlen(comm->job_base), ilen = strlen(inst);
    if (blen + ilen < sizeof(ident)) {
        snprintf(ident, sizeof(ident), "%s%s", comm->job_base, inst);
    } else {
        uint8_t h[TT_SHA256_LEN];
        tt_sha256_t sc;
        tt_sha256_init(&sc);
        tt_sha256_update(&sc, comm->job_base, blen);
        tt_sha256_update(&sc, inst, ilen); /* an instance cut at 64 bytes stays apart */
        tt_sha256_final(&sc, h);
        char hex[17];
        for (int i = 0; i < 8; i++)
            snprintf(hex + 2 * i, 3, "%02x", h[i]);
        int head = (int)sizeof(ident) - 1 - 18 - (int)TT_MIN(ilen, 64);
        snprintf(ident, sizeof(ident), "%.*s~%s_%.64s", head, comm->job_base, hex, inst);
    }
    for (char *c = ident; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '-' || *c == '.'))
            *c = '_';
    int n = snprintf(path, len, "%s/%s.rank%d.json", comm->opts.trace_dir, ident, comm->rank);
    return n > 0 && (size_t)n < len ? 0 : -1;
}

static void write_record_locked(tutti_comm_t *comm, const char *why);

/* The trace directory and its parents, as `mkdir -p` (best effort: open says why not). */
static void mkdir_p(const char *dir)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s", dir);
    for (char *c = p + 1; *c; c++) {
        if (*c != '/')
            continue;
        *c = '\0';
        (void)mkdir(p, 0755);
        *c = '/';
    }
    (void)mkdir(p, 0755);
}

/* Write the record into opts.trace_dir (why: "failure", "a peer failed"), unless one of
 * this level or higher is there (trace_dumped's levels). */
static void write_record(tutti_comm_t *comm, const char *why, int level)
{
    pthread_mutex_lock(&comm->trace_lock);
    if (comm->trace_written < level)
        write_record_locked(comm, why);
    comm->trace_written = TT_MAX(comm->trace_written, level);
    pthread_mutex_unlock(&comm->trace_lock);
}

static void write_record_locked(tutti_comm_t *comm, const char *why)
{
    char path[1024], tmp[1100], err[256] = "";
    if (trace_path(comm, path, sizeof(path)) < 0) {
        TT_WARN("flight record not written: the path under TUTTI_TRACE_DIR=%s is too long",
                comm->opts.trace_dir);
        return;
    }
    snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid());
    mkdir_p(comm->opts.trace_dir);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int st = fd < 0 ? TUTTI_ERR_IO : dump_to(comm, fd, why, err, sizeof(err));
    if (fd < 0)
        snprintf(err, sizeof(err), "%s", strerror(errno));
    if (fd >= 0 && close(fd) < 0 && st == TUTTI_OK) {
        snprintf(err, sizeof(err), "closing it: %s", strerror(errno));
        st = TUTTI_ERR_IO;
    }
    if (st == TUTTI_OK && rename(tmp, path) < 0) {
        snprintf(err, sizeof(err), "renaming it: %s", strerror(errno));
        st = TUTTI_ERR_IO;
    }
    if (st < 0) {
        unlink(tmp);
        TT_WARN("flight record not written to %s: %s", path, err);
        return;
    }
    TT_WARN("flight record written to %s (%s; tutti-trace %s reads every rank's)", path, why,
            comm->opts.trace_dir);
}

void tt_trace_flush(tutti_comm_t *comm)
{
    if (!atomic_load_explicit(&comm->trace_due, memory_order_relaxed) ||
        !atomic_exchange(&comm->trace_due, 0) || atomic_exchange(&comm->trace_dumped, 2) >= 2)
        return;
    /* over one written because a peer failed: this says more */
    write_record(comm, "failure", 2);
}

/* The time to the idle thread's next look: TT_TRACE_WATCH_MS, give or take a quarter,
 * spread by rank and look, so that the ranks of a big job do not reach the store in step. */
static uint64_t watch_period_ns(tutti_comm_t *comm)
{
    uint32_t h = (uint32_t)comm->rank * 2654435761u ^ (++comm->watch_looks * 40503u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    uint64_t ms = TT_TRACE_WATCH_MS * 3 / 4 + h % (TT_TRACE_WATCH_MS / 2 + 1);
    return ms * 1000000ull;
}

int tt_trace_watch_due(tutti_comm_t *comm, uint64_t *wait_ns)
{
    if (comm->watch_off)
        return 0;
    if (!comm->trace || !comm->opts.trace_dir || !comm->opts.trace_dir[0] || comm->nranks < 2 ||
        atomic_load(&comm->trace_dumped) || atomic_load(&comm->failed) < 0 ||
        atomic_load(&comm->aborted)) {
        comm->watch_off = 1;
        return 0;
    }
    uint64_t now = tt_coarse_ns();
    if (!comm->watch_next_ns)
        comm->watch_next_ns = now + watch_period_ns(comm);
    if (now >= comm->watch_next_ns)
        return 1;
    *wait_ns = comm->watch_next_ns - now;
    return 0;
}

void tt_trace_watch(tutti_comm_t *comm)
{
    comm->watch_next_ns = tt_coarse_ns() + watch_period_ns(comm);
    int64_t nfailed = 0; /* read by adding 0, as the stall check does (it may not exist) */
    int st = TUTTI_OK;
    if (!comm->watch_store) {
        st = tutti_store_open_prefixed(&comm->watch_store, comm->store, "");
        if (st == TUTTI_OK) /* an idle thread's look: never long */
            tutti_store_set_timeout(comm->watch_store, 250);
    }
    if (st == TUTTI_OK)
        st = tutti_store_add(comm->watch_store, TT_FAILED_COUNT_KEY, 0, &nfailed);
    if (st < 0) {
        comm->watch_off = 1;
        TT_INFO("flight recorder: no more looks for failed peers (store: %s)",
                comm->watch_store ? tutti_store_last_error(comm->watch_store) : tutti_strerror(st));
        return;
    }
    int none = 0;
    if (nfailed <= 0 || atomic_load(&comm->failed) < 0 ||
        !atomic_compare_exchange_strong(&comm->trace_dumped, &none, 1))
        return;
    comm->watch_off = 1;
    write_record(comm, "a peer failed", 1);
}
