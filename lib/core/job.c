/* Job identity: the job id, the instance record, slot claims, contest and leaving.
 * The design is the comment atop job.h. */
#include <ctype.h>
#include <pthread.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/auth.h"
#include "core/fault.h"
#include "core/opts.h"
#include "core/state.h"
#include "base/base.h"
#include "core/job.h"
#include "core/setup.h"
#include "store/store_gc.h"
#include "plugin/tpmux.h"
#include "../../transports/kit/util.h"

#define JOB_ID_MAX 64
#define JOB_POLL_MS 5
#define JOB_REJECT_MAX 16

/* ---- the job id ---- */

static unsigned long long proc_start(long pid);

int tt_job_hydra_launch(char *out, size_t len)
{
    long fd = tt_env_count("PMI_FD");
    struct ucred cr;
    socklen_t cl = sizeof(cr);
    if (fd < 0 || fd > 1 << 20 || getsockopt((int)fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 ||
        cl != sizeof(cr) || cr.pid <= 0)
        return -1; /* no PMI connection, or not a socket to a process on this host */
    char path[64], comm[32] = "";
    snprintf(path, sizeof(path), "/proc/%ld/comm", (long)cr.pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(comm, 1, sizeof(comm) - 1, f);
    fclose(f);
    comm[n] = 0;
    comm[strcspn(comm, "\n")] = 0;
    /* MPICH's proxy, or Intel MPI's (its hydra's): not whatever else an inherited
     * PMI_FD's number now holds */
    if (strcmp(comm, "hydra_pmi_proxy") && strcmp(comm, "pmi_proxy"))
        return -1;
    unsigned long long start = proc_start((long)cr.pid);
    if (!start)
        return -1;
    snprintf(out, len, "hydra-%ld.%llu", (long)cr.pid, start);
    return 0;
}

void tt_job_id(const char *opt, char *out, size_t len, const char **source_p)
{
    char buf[512] = "";
    const char *src = "none";
    const char *v;
    if (opt && *opt) {
        snprintf(buf, sizeof(buf), "%s", opt);
        src = tt_env("JOB_ID") && !strcmp(tt_env("JOB_ID"), opt) ? "TUTTI_JOB_ID" : "option";
    } else if ((v = tt_env("JOB_ID")) && *v) {
        snprintf(buf, sizeof(buf), "%s", v);
        src = "TUTTI_JOB_ID";
    } else if ((v = getenv("PMIX_NAMESPACE")) && *v) {
        /* an mpirun's before the Slurm job around it: its ranks on mpirun's own node
         * have the batch script's SLURM_* (no step), the others their daemon's step */
        snprintf(buf, sizeof(buf), "pmix-%s", v);
        src = "PMIX_NAMESPACE";
    } else if ((v = getenv("OMPI_MCA_ess_base_jobid")) && *v) {
        snprintf(buf, sizeof(buf), "ompi-%s", v);
        src = "OMPI_MCA_ess_base_jobid";
    } else if ((v = getenv("SLURM_JOB_ID")) && *v) {
        const char *step = getenv("SLURM_STEP_ID");
        snprintf(buf, sizeof(buf), "slurm-%s.%s", v, step && *step ? step : "0");
        src = "SLURM_JOB_ID";
    } else if ((v = getenv("TORCHELASTIC_RUN_ID")) && *v && strcmp(v, "none")) {
        snprintf(buf, sizeof(buf), "torch-%s", v);
        src = "TORCHELASTIC_RUN_ID";
    } else if (tt_env_count("PMI_SIZE") > 0 &&
               tt_env_count("PMI_SIZE") == tt_env_count("MPI_LOCALNRANKS") &&
               tt_env_count("TUTTI_RANK") < 0 && tt_env_count("RANK") < 0 &&
               tt_job_hydra_launch(buf, sizeof(buf)) == 0) {
        /* MPICH's mpiexec names no job; its proxy on this host, serving every rank of
         * the launch when they all run here, does (across hosts each has its own). Not
         * where tutti's or torchrun's variables place the rank: the launch need not be
         * the job's then (one mpiexec a rank) */
        src = "PMI_FD (MPICH's hydra proxy)";
    }
    size_t n = strlen(buf);
    int replaced = 0;
    uint8_t raw_hash[TT_SHA256_LEN];
    tt_sha256_t rc;
    tt_sha256_init(&rc);
    tt_sha256_update(&rc, buf, n);
    tt_sha256_final(&rc, raw_hash);
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)buf[i]) && buf[i] != '.' && buf[i] != '-' && buf[i] != '_') {
            buf[i] = '_';
            replaced = 1;
        }
    if (replaced && n <= JOB_ID_MAX - 9) {
        /* "a/b c" and "a_b_c" must stay two jobs: a hash of the raw id tells them apart */
        snprintf(buf + n, sizeof(buf) - n, "~%02x%02x%02x%02x", raw_hash[0], raw_hash[1],
                 raw_hash[2], raw_hash[3]);
        n += 9;
    } else if (replaced) {
        n = JOB_ID_MAX + 1; /* shortened below, with the raw id's hash */
    }
    if (n > JOB_ID_MAX) {
        /* keep it readable and unique: a head, then a hash of the raw id */
        const uint8_t *h = raw_hash;
        char tail[20];
        for (int i = 0; i < 8; i++)
            snprintf(tail + 2 * i, 3, "%02x", h[i]);
        snprintf(buf + JOB_ID_MAX - 17, sizeof(buf) - (JOB_ID_MAX - 17), "~%s", tail);
    }
    snprintf(out, len, "%s", buf);
    if (source_p)
        *source_p = src;
}

/* ---- this process's live instances ---- */

/* Nonces of this process's communicators between join and leave: a record this process
 * wrote for a communicator it has since destroyed is over from its side, although its
 * pid is alive (destroy + init in a loop). */
typedef struct live_inst {
    char nonce[40];
    struct live_inst *next;
} live_inst_t;
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static live_inst_t *live_head;

static void live_add(const char *nonce)
{
    live_inst_t *l = calloc(1, sizeof(*l));
    if (!l)
        return;
    snprintf(l->nonce, sizeof(l->nonce), "%s", nonce);
    pthread_mutex_lock(&live_lock);
    l->next = live_head;
    live_head = l;
    pthread_mutex_unlock(&live_lock);
}

static void live_remove(const char *nonce)
{
    pthread_mutex_lock(&live_lock);
    for (live_inst_t **pp = &live_head; *pp; pp = &(*pp)->next) {
        if (!strcmp((*pp)->nonce, nonce)) {
            live_inst_t *l = *pp;
            *pp = l->next;
            free(l);
            break;
        }
    }
    pthread_mutex_unlock(&live_lock);
}

static int live_has(const char *nonce)
{
    int found = 0;
    pthread_mutex_lock(&live_lock);
    for (live_inst_t *l = live_head; l && !found; l = l->next)
        found = !strcmp(l->nonce, nonce);
    pthread_mutex_unlock(&live_lock);
    return found;
}

/* ---- the instance record ---- */

/* The record's format. From format 4 on, every record starts "tutti-instance <format>
 * <tutti version>", so that a rank can name what wrote one of a format it cannot read;
 * format 6's fields follow (format 5's lacked the job secret's proof before the host,
 * format 4's, those of format 3, which named no version, the chunk size and the
 * override's hash; format 2 the transports). */
#define JOB_REC_FORMAT 6

typedef struct job_rec {
    int format;       /* JOB_REC_FORMAT, or another's (rec_parse's 1) */
    char version[64]; /* the tutti version of its writer ("": format 3 or older) */
    char nonce[40];
    int nranks;
    long pid;
    unsigned long long start; /* the process's start (clock ticks since boot) */
    unsigned long long pidns; /* its pid namespace (inode of /proc/self/ns/pid) */
    long long created_ms;     /* CLOCK_REALTIME of its host */
    int timeout_ms;
    char transport[160]; /* what its TUTTI_TRANSPORT means (tt_transport_canon) */
    size_t chunk_bytes;  /* TUTTI_CHUNK_BYTES: the algorithms' choice and their messages */
    char algo[20];       /* TUTTI_ALGO's fingerprint (comm->algo_fp) */
    char auth[40];       /* rec_auth: its rank 0's job secret proved, "-" for none */
    char host[256];
} job_rec_t;

/* The proof of comm's job secret for the instance nonce: the hex of the first 16 bytes
 * of HMAC-SHA256(secret, "job-record" || nonce), "-" without a secret. Every rank checks
 * rank 0's against its own (check_record), so ranks with different secrets (or one
 * without) never form one job, whatever the transport and the store: the tcp hello and
 * the tcp store check the secret themselves, shm and a file store do not (review,
 * session 100). The secret never leaves the process; a proof is good for one nonce. */
static void rec_auth(const tutti_comm_t *comm, const char *nonce, char *out, size_t len)
{
    if (!comm->secret) {
        snprintf(out, len, "-");
        return;
    }
    uint8_t mac[TT_SHA256_LEN];
    tt_hmac_sha256(comm->secret, comm->secret_len, "job-record", 11, nonce, strlen(nonce), mac);
    for (size_t i = 0; i < 16 && 2 * i + 2 < len; i++)
        snprintf(out + 2 * i, len - 2 * i, "%02x", mac[i]);
}

/* Clocks of two hosts may differ; an instance whose creation lies further in the future
 * than this is taken for garbage (never waited for). */
#define JOB_MAX_SKEW_MS 60000LL

static long long realtime_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Field 22 of /proc/<pid>/stat, when the process started (clock ticks since boot), in
 * *start: 1; 0: no such process (ENOENT, ESRCH); -errno: it could not be read (EMFILE
 * near the fd limit, ENOMEM, ...), which says nothing about the process. */
static int proc_start_read(long pid, unsigned long long *start)
{
    char path[64], buf[1024];
    *start = 0;
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT || errno == ESRCH ? 0 : errno ? -errno : -EIO;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    int rerr = ferror(f) ? errno : 0;
    fclose(f);
    if (rerr)
        return rerr == ESRCH ? 0 : -rerr; /* ESRCH: it exited after the open */
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    /* after ')': state (field 3) ... starttime (field 22) */
    if (!p || sscanf(p + 1,
                     " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
                     "%*d %*d %llu",
                     start) != 1)
        return -EPROTO;
    return 1;
}

/* Its start, or 0 where there is no such process or it could not be read. */
static unsigned long long proc_start(long pid)
{
    unsigned long long start;
    return proc_start_read(pid, &start) == 1 ? start : 0;
}

int tt_job_self_start(unsigned long long *start)
{
    /* read once per process (a forked child has a pid, and a start, of its own) */
    static atomic_llong cached_pid;
    static atomic_ullong cached_start;
    long pid = (long)getpid();
    if (atomic_load(&cached_pid) == pid) {
        *start = atomic_load(&cached_start);
        return 0;
    }
    int k = proc_start_read(pid, start);
    if (k != 1)
        return k < 0 ? k : -ESRCH;
    atomic_store(&cached_start, *start);
    atomic_store(&cached_pid, pid);
    return 0;
}

int tt_job_proc_gone(long pid, unsigned long long start)
{
    unsigned long long now;
    int k = proc_start_read(pid, &now);
    if (k < 0)
        return k; /* unknown: never taken for gone */
    return k == 0 || now != start;
}

static int rec_format(const job_rec_t *r, char *buf, size_t len)
{
    return snprintf(buf, len, "tutti-instance %d %s %s %d %ld %llu %llu %lld %d %s %zu %s %s %s",
                    JOB_REC_FORMAT, tutti_version_string(), r->nonce, r->nranks, r->pid, r->start,
                    r->pidns, r->created_ms, r->timeout_ms, r->transport, r->chunk_bytes, r->algo,
                    r->auth, r->host);
}

/* 0: a record of this format; 1: of another (another tutti version's): r->format and
 * r->version, and its instance where its fields read as format 2's to 5's (else
 * r->nranks is 0); -1: not a record. */
static int rec_parse(const char *s, job_rec_t *r)
{
    int off = 0, body = 0;
    memset(r, 0, sizeof(*r));
    if (sscanf(s, "tutti-instance %d %n", &r->format, &off) < 1 || off == 0 || r->format < 1)
        return -1;
    if (r->format >= 4) {
        int voff = 0;
        if (sscanf(s + off, "%63s %n", r->version, &voff) < 1 || voff == 0)
            return -1;
        off += voff;
    }
    s += off;
    off = 0;
    if (r->format >= 6)
        body = sscanf(s, "%39s %d %ld %llu %llu %lld %d %159s %zu %19s %39s %n", r->nonce,
                      &r->nranks, &r->pid, &r->start, &r->pidns, &r->created_ms, &r->timeout_ms,
                      r->transport, &r->chunk_bytes, r->algo, r->auth, &off) >= 11;
    else if (r->format >= 5)
        body = sscanf(s, "%39s %d %ld %llu %llu %lld %d %159s %zu %19s %n", r->nonce, &r->nranks,
                      &r->pid, &r->start, &r->pidns, &r->created_ms, &r->timeout_ms, r->transport,
                      &r->chunk_bytes, r->algo, &off) >= 10;
    else if (r->format >= 3)
        body = sscanf(s, "%39s %d %ld %llu %llu %lld %d %159s %n", r->nonce, &r->nranks, &r->pid,
                      &r->start, &r->pidns, &r->created_ms, &r->timeout_ms, r->transport,
                      &off) >= 8;
    else if (r->format == 2)
        body = sscanf(s, "%39s %d %ld %llu %llu %lld %d %n", r->nonce, &r->nranks, &r->pid,
                      &r->start, &r->pidns, &r->created_ms, &r->timeout_ms, &off) >= 7;
    body = body && off > 0 && r->nranks > 0 && r->timeout_ms > 0 && r->pid > 0;
    if (body)
        snprintf(r->host, sizeof(r->host), "%s", s + off);
    if (r->format == JOB_REC_FORMAT)
        return body ? 0 : -1;
    if (!body)
        r->nranks = 0;
    return 1;
}

/* Can this process see r's rank 0 in /proc (same host and pid namespace)? */
static int rec_local(const job_rec_t *r, const char *my_host)
{
    return !strcmp(r->host, my_host) && r->pidns && r->pidns == tp_pidns();
}

static void rec_describe(const job_rec_t *r, char *buf, size_t len)
{
    time_t t = (time_t)(r->created_ms / 1000);
    struct tm tm;
    char when[32] = "?";
    if (localtime_r(&t, &tm))
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(buf, len, "job instance %s (%d ranks; its rank 0 is pid %ld on host %s, started %s)",
             r->nonce, r->nranks, r->pid, r->host, when);
}

/* What wrote r, a record of another format (rec_parse's 1). */
static void rec_writer(const job_rec_t *r, char *buf, size_t len)
{
    if (r->version[0])
        snprintf(buf, len, "tutti %s (record format %d)", r->version, r->format);
    else
        snprintf(buf, len, "an earlier tutti (record format %d, which names no version)",
                 r->format);
}

/* A record of another format (rec_parse's 1), another tutti version's: the error that
 * names it, its rank 0 (or the record itself) and what this rank runs. */
static int rec_other_format(const tutti_comm_t *comm, const job_rec_t *r, const char *cur,
                            const char *hint, char *err, size_t errlen)
{
    char desc[512], writer[96];
    if (r->nranks)
        rec_describe(r, desc, sizeof(desc));
    else
        snprintf(desc, sizeof(desc), "the job record \"%.200s\"", cur);
    rec_writer(r, writer, sizeof(writer));
    snprintf(err, errlen,
             "store %s, prefix %s: %s was written by %s, this rank runs tutti %s (record format "
             "%d): every rank of a job must run the same tutti version%s",
             comm->store_url, comm->job_base, desc, writer, tutti_version_string(), JOB_REC_FORMAT,
             hint);
    return TUTTI_ERR_CONFIG;
}

/* Dead: its rank 0 is gone (seen where its pid is visible: same host and pid
 * namespace); else (another host) its creation is older than its own timeout plus the
 * clock difference hosts may have (every rank's set-up has ended by then, one way or
 * the other), or lies implausibly far in the future. */
static int rec_stale(const job_rec_t *r, const char *my_host)
{
    if (rec_local(r, my_host)) {
        int gone = tt_job_proc_gone(r->pid, r->start);
        if (gone >= 0)
            return gone;
        /* /proc/<pid>/stat could not be read (this process near its fd limit, short of
         * memory): that says nothing of rank 0; judge the record by its age, as another
         * host's, so that a live rank 0 is never taken for dead (said once: the
         * waits poll) */
        static atomic_int said;
        if (!atomic_exchange(&said, 1))
            TT_INFO("job: cannot read /proc/%ld/stat (%s): judging instance %s by its age", r->pid,
                    strerror(-gone), r->nonce);
    }
    long long now = realtime_ms();
    if (r->created_ms > now + JOB_MAX_SKEW_MS)
        return 1;
    /* another host's clock: allow it to differ from ours by up to JOB_MAX_SKEW_MS */
    return now - r->created_ms > (long long)r->timeout_ms + JOB_MAX_SKEW_MS;
}

/* When this process started, in CLOCK_REALTIME milliseconds. */
static long long my_start_ms(void)
{
    double up = 0;
    FILE *f = fopen("/proc/uptime", "r");
    if (f) {
        if (fscanf(f, "%lf", &up) != 1)
            up = 0;
        fclose(f);
    }
    long hz = sysconf(_SC_CLK_TCK);
    unsigned long long st = 0;
    if (tt_job_self_start(&st) < 0)
        st = 0;
    if (up <= 0 || hz <= 0 || !st)
        return realtime_ms();
    return realtime_ms() - (long long)(up * 1000) + (long long)(st * 1000 / (unsigned long long)hz);
}

/* Offer rank's failed set-up as instance nonce's first (root-cause) failure: the one key
 * the others' set-up waits look at (setup.c, tt_setup_peer_failed). A compare-and-set:
 * a later failure (often second hand) leaves the first one's reason. */
static void offer_first_failure(tutti_store_t *js, const char *nonce, int rank, int status,
                                const char *why)
{
    char key[96], first[TT_ERRMSG_LEN + 32];
    int m = snprintf(first, sizeof(first), "%d %d %s", rank, status, why);
    snprintf(key, sizeof(key), "%s/init_failed_first", nonce);
    void *cur = NULL;
    size_t curlen = 0;
    tutti_store_compare_set(js, key, "", 0, first, (size_t)TT_MIN(m, (int)sizeof(first) - 1) + 1,
                            &cur, &curlen);
    free(cur);
}

void tt_job_init_failed(tutti_comm_t *comm, int status)
{
    if (!comm->job_store || !comm->nonce[0] || !comm->record[0])
        return;
    live_remove(comm->nonce);
    char key[96], val[TT_ERRMSG_LEN + 16];
    snprintf(key, sizeof(key), "%s/init_failed/%d", comm->nonce, comm->rank);
    /* a failure that only followed a peer's ("^": second hand) gives that peer's reason,
     * so that ranks still waiting name the root cause, not a chain of ranks */
    int n = comm->setup_peer_status
                ? snprintf(val, sizeof(val), "%d ^%s", status, comm->setup_peer_why)
                : snprintf(val, sizeof(val), "%d %s", status, comm->last_error);
    size_t vlen = (size_t)TT_MIN(n, (int)sizeof(val) - 1) + 1;
    tutti_store_set_timeout(comm->job_store, tt_comm_quick_ms(comm));
    /* a store that did not take this will not take the next either: a second quick
     * deadline made a split with the store's host cut off last 2 s past its timeout */
    if (tutti_store_set(comm->job_store, key, val, vlen) < 0)
        return;
    /* the one key the others' set-up waits look at (setup.c, tt_setup_peer_failed): the first
     * failure's, which is the root cause (a second-hand one follows from reading it) */
    if (!comm->setup_peer_status)
        offer_first_failure(comm->job_store, comm->nonce, comm->rank, status, comm->last_error);
}

/* Rank 0 of r failed its set-up and left its reason: if r is this run's (created after
 * this process started, give or take a second; an older one is a previous run's, whose
 * rerun rank 0 is still to come), return its status with the reason in err. */
static int rec_failed_setup(tutti_store_t *js, const job_rec_t *r, const char *desc, char *err,
                            size_t errlen)
{
    if (r->created_ms < my_start_ms() - 1000)
        return 0;
    char key[96];
    snprintf(key, sizeof(key), "%s/init_failed/0", r->nonce);
    void *v = NULL;
    size_t len = 0;
    if (tt_store_get_now(js, key, &v, &len) < 0)
        return 0;
    char *end;
    long st = strtol(v, &end, 10);
    if (st >= 0 || st <= TUTTI_STATUS_LAST_ || *end != ' ')
        st = TUTTI_ERR_PEER;
    if (end[0] && end[1] == '^') {
        /* rank 0 failed only because another rank did: with set-up failures found in
         * a slice, such a record is often a previous attempt's, which a launcher's quick
         * restart (within the second above) meets; wait for rank 0's next instance */
        free(v);
        return 0;
    }
    snprintf(err, errlen, "rank 0 of %s failed its set-up: %s", desc, *end ? end + 1 : "");
    free(v);
    return (int)st;
}

/* A slot's claim names its process, so that a claim of a dead process (a rank restarted
 * in place) can be taken over and this process's own earlier claim is not a contest. */
typedef struct job_claim {
    long pid;
    unsigned long long start, pidns;
    char nonce[40];
    char host[256];
} job_claim_t;

static int claim_format(char *buf, size_t len, const char *host, const char *nonce)
{
    unsigned long long start = 0;
    tt_job_self_start(&start); /* read, and checked, at tt_job_join's start */
    return snprintf(buf, len, "claim 1 %ld %llu %llu %s %s", (long)getpid(), start, tp_pidns(),
                    nonce, host);
}

static int claim_parse(const char *s, size_t len, job_claim_t *c)
{
    int off = 0;
    memset(c, 0, sizeof(*c));
    if (!len || s[len - 1] != '\0' ||
        sscanf(s, "claim 1 %ld %llu %llu %39s %n", &c->pid, &c->start, &c->pidns, c->nonce, &off) <
            4 ||
        off == 0)
        return -1;
    snprintf(c->host, sizeof(c->host), "%s", s + off);
    return 0;
}

static int slot_key(char *buf, size_t len, const char *nonce, int rank)
{
    return snprintf(buf, len, "%s/claim/%d", nonce, rank);
}

/* Every rank finished set-up: its membership is settled. */
/* Does the record still hold value (len bytes)? A judgement of an instance (not ready,
 * slot taken) holds only while the record still names it: its keys go after it. */
static int record_still(tutti_store_t *js, const void *value, size_t len)
{
    void *v = NULL;
    size_t vlen = 0;
    int same = tt_store_get_now(js, "instance", &v, &vlen) == 0 && vlen == len &&
               !memcmp(v, value, len);
    free(v);
    return same;
}

/* A counter of r's, 0 if missing; read without creating it (adding 0 would leave a key
 * behind in a namespace that is being removed). */
static int64_t rec_counter(tutti_store_t *js, const job_rec_t *r, const char *name)
{
    char key[96];
    snprintf(key, sizeof(key), "%s/%s", r->nonce, name);
    void *v = NULL;
    size_t len = 0;
    if (tt_store_get_now(js, key, &v, &len) < 0)
        return 0;
    long long n = strtoll(v, NULL, 10);
    free(v);
    return n;
}

/* Every rank finished set-up: its membership is settled. */
static int rec_ready(tutti_store_t *js, const job_rec_t *r)
{
    return rec_counter(js, r, "ready") >= r->nranks;
}

/* Every rank left (destroyed its communicator). */
static int rec_finished(tutti_store_t *js, const job_rec_t *r)
{
    return rec_counter(js, r, "left") >= r->nranks;
}

/* Its rank 0 failed set-up (and said so). */
static int rec_setup_failed(tutti_store_t *js, const job_rec_t *r)
{
    char key[96];
    snprintf(key, sizeof(key), "%s/init_failed/0", r->nonce);
    const char *k = key;
    int exists = 0;
    return tutti_store_check(js, &k, 1, &exists) == 0 && exists;
}

static int rec_contested(tutti_store_t *js, const job_rec_t *r)
{
    char key[96];
    snprintf(key, sizeof(key), "%s/contested", r->nonce);
    const char *k = key;
    int exists = 0;
    return tutti_store_check(js, &k, 1, &exists) < 0 || exists;
}

static void contest(tutti_store_t *js, const job_rec_t *r, const char *why)
{
    char key[96];
    snprintf(key, sizeof(key), "%s/contested", r->nonce);
    tutti_store_set(js, key, why, strlen(why) + 1);
}

static void sleep_ms(int ms)
{
    /* tv_nsec must stay below 1e9: nanosleep refuses 1000 ms or more put there */
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* Remove a dead or finished instance's keys (best effort). */
static void gc_instance(tutti_store_t *js, const char *nonce)
{
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "%s/", nonce);
    int st = tt_store_delete_prefix(js, prefix);
    if (st == TUTTI_ERR_UNSUPPORTED)
        TT_INFO("store %s cannot delete keys by prefix (a caller's store without "
                "delete_prefix): the keys of job instance %s stay under its %s",
                tutti_store_url(js), nonce, prefix);
    else if (st < 0)
        TT_INFO("removing the keys of old job instance %s: %s", nonce, tutti_strerror(st));
}

static int open_views(tutti_comm_t *comm, tutti_store_t *store, const char *base, char *err,
                      size_t errlen)
{
    char prefix[512];
    snprintf(prefix, sizeof(prefix), "%s%s/", base, comm->nonce);
    int st = tutti_store_open_prefixed(&comm->store, store, prefix);
    if (st == 0)
        st = tutti_store_open_prefixed(&comm->qstore, store, prefix);
    if (st < 0) {
        snprintf(err, errlen, "cannot open store view %s on %s: %s", prefix, comm->store_url,
                 tutti_strerror(st));
        return st;
    }
    tutti_store_set_timeout(comm->store, tt_comm_timeout_ms(comm));
    tutti_store_set_timeout(comm->qstore, tt_comm_quick_ms(comm));
    snprintf(comm->instance, sizeof(comm->instance), "%s/%s", comm->job_id[0] ? comm->job_id : "-",
             comm->nonce);
    return TUTTI_OK;
}

static int join_as_root(tutti_comm_t *comm, const char *my_host, uint64_t deadline, char *err,
                        size_t errlen)
{
    tutti_store_t *js = comm->job_store;
    job_rec_t me = { .nranks = comm->nranks,
                     .pid = (long)getpid(),
                     .pidns = tp_pidns(),
                     .created_ms = realtime_ms(),
                     .timeout_ms = tt_comm_timeout_ms(comm),
                     .chunk_bytes = comm->opts.chunk_bytes };
    tt_job_self_start(&me.start); /* read, and checked, at tt_job_join's start */
    tt_transport_canon(comm->opts.transport, me.transport, sizeof(me.transport));
    snprintf(me.algo, sizeof(me.algo), "%s", comm->algo_fp);
    snprintf(me.nonce, sizeof(me.nonce), "%s", comm->nonce);
    rec_auth(comm, me.nonce, me.auth, sizeof(me.auth));
    snprintf(me.host, sizeof(me.host), "%s", my_host);
    rec_format(&me, comm->record, sizeof(comm->record));
    const char *mine = comm->record;
    size_t mlen = strlen(mine) + 1;
    void *cur = NULL;
    size_t clen = 0;
    int st = tutti_store_compare_set(js, "instance", "", 0, mine, mlen, &cur, &clen);
    while (st == 0 && !(clen == mlen && !memcmp(cur, mine, mlen))) {
        job_rec_t r;
        char desc[512];
        int pr = clen > 1 ? rec_parse(cur, &r) : -1;
        int parsed = pr == 0 || (pr == 1 && r.nranks); /* an instance to judge */
        int free_rec = clen <= 1; /* "" or a lone NUL: released by its last rank */
        int replace = free_rec || pr < 0;
        if (pr == 1 && !parsed) {
            /* another version's, whose instance this one cannot judge: never taken over */
            rec_other_format(comm, &r, cur, "", err, errlen);
            free(cur);
            return TUTTI_ERR_CONFIG;
        }
        if (parsed) {
            rec_describe(&r, desc, sizeof(desc));
            int fin = rec_finished(js, &r), stale = !fin && rec_stale(&r, my_host);
            int failed = !fin && !stale && rec_setup_failed(js, &r);
            int mine_over = pr == 0 && rec_local(&r, my_host) && r.pid == (long)getpid() &&
                            !live_has(r.nonce);
            if (mine_over && !fin && !stale && !failed) {
                /* this process's own earlier communicator, destroyed: its other ranks
                 * may still be finishing; the last of them removes its keys */
                TT_INFO("job: %s was this process's earlier communicator; replacing it", desc);
                replace = 1;
            } else if (fin || stale || failed) {
                TT_INFO("job: replacing %s %s", fin ? "finished" : stale ? "dead" : "failed", desc);
                replace = 2; /* its keys go once the record no longer names it */
            } else if (rec_ready(js, &r) && !rec_contested(js, &r)) {
                /* running: its ranks are all set up, none can join us by mistake */
                char writer[96];
                if (pr == 1) {
                    rec_writer(&r, writer, sizeof(writer));
                    TT_WARN("job: %s, written by %s, is running; this job (tutti %s) takes the "
                            "record over",
                            desc, writer, tutti_version_string());
                } else
                    TT_INFO("job: %s is running; this job takes the record over", desc);
                replace = 1;
            } else if (!record_still(js, cur, clen)) {
                /* replaced or released meanwhile: judge what is there now (until the
                 * deadline: a record that keeps changing, or a store that answers the
                 * swap but not the read, must not hold this rank here for ever) */
                free(cur);
                cur = NULL;
                if (tt_now_ns() > deadline) {
                    snprintf(err, errlen,
                             "store %s, prefix %s: could not take the job record over: it "
                             "changed under every attempt until the timeout (%s when last read)",
                             comm->store_url, comm->job_base, desc);
                    return TUTTI_ERR_TIMEOUT;
                }
                st = tutti_store_compare_set(js, "instance", "", 0, mine, mlen, &cur, &clen);
                continue;
            } else {
                char twice[600], why[1024];
                snprintf(twice, sizeof(twice),
                         "rank 0 claimed twice (pid %ld on host %s, pid %ld on host %s)", r.pid,
                         r.host, (long)getpid(), my_host);
                snprintf(why, sizeof(why),
                         "%s: a second rank 0 started on the same store prefix while this job "
                         "instance was starting: two processes were given rank 0, or ranks of "
                         "two jobs met; give each job its own TUTTI_JOB_ID",
                         twice);
                contest(js, &r, why);
                /* its ranks wait in their set-up, its rank 0 too: end their waits */
                offer_first_failure(js, r.nonce, 0, TUTTI_ERR_IN_USE, why);
                if (pr == 1) {
                    /* another version's, still starting: not taken over */
                    rec_other_format(comm, &r, cur,
                                     " (were it another job's: give each job its own "
                                     "TUTTI_JOB_ID)",
                                     err, errlen);
                    free(cur);
                    return TUTTI_ERR_CONFIG;
                }
                snprintf(err, errlen,
                         "store %s, prefix %s: %s: already used by %s, which is still starting: "
                         "two processes were given rank 0, or another job uses this store "
                         "prefix; give each job its own TUTTI_JOB_ID (or TUTTI_PREFIX, or store)",
                         comm->store_url, comm->job_base, twice, desc);
                free(cur);
                return TUTTI_ERR_IN_USE;
            }
        } else if (!free_rec) {
            TT_WARN("job: the record %sinstance is garbled; replacing it", comm->job_base);
        }
        if (tt_now_ns() > deadline) {
            snprintf(err, errlen, "store %s, prefix %s: could not take the job record over",
                     comm->store_url, comm->job_base);
            free(cur);
            return TUTTI_ERR_TIMEOUT;
        }
        if (!replace)
            break;
        void *expected = cur;
        size_t elen = clen;
        cur = NULL;
        st = tutti_store_compare_set(js, "instance", expected, elen, mine, mlen, &cur, &clen);
        if (st == 0 && replace == 2 && clen == mlen && !memcmp(cur, mine, mlen))
            gc_instance(js, r.nonce);
        free(expected);
    }
    free(cur);
    if (st < 0) {
        snprintf(err, errlen, "creating the job instance at %sinstance: %s", comm->job_base,
                 tutti_store_last_error(js));
        return st;
    }
    return TUTTI_OK;
}

/* What a joining rank has learnt while it waits for its job's instance. */
typedef struct {
    char rejected[JOB_REJECT_MAX][40];
    int nrej, dead_only;
    char why[768];
    char claim[384];
    size_t claim_len;
    char store_said[600]; /* the store's explanation of the wait that timed out */
} member_wait_t;

static void reject_nonce(member_wait_t *w, const char *nonce)
{
    snprintf(w->rejected[w->nrej % JOB_REJECT_MAX], 40, "%s", nonce);
    w->nrej++;
}

static int nonce_rejected(const member_wait_t *w, const char *nonce)
{
    int known = 0;
    for (int i = 0; i < TT_MIN(w->nrej, JOB_REJECT_MAX); i++)
        known |= !strcmp(w->rejected[i], nonce);
    return known;
}

/* The key under which rank 0 of instance nonce leaves its TUTTI_ALGO as written, for
 * the error of a rank whose override means something else (the record has a hash). */
static void algo_key(char *buf, size_t len, const char *nonce)
{
    snprintf(buf, len, "%s/algo", nonce);
}

/* r's TUTTI_ALGO means something else than this rank's: say so, naming both as written. */
static void algo_mismatch(tutti_comm_t *comm, const job_rec_t *r, const char *desc, char *err,
                          size_t errlen)
{
    char key[96], theirs[300];
    void *v = NULL;
    size_t len = 0;
    snprintf(theirs, sizeof(theirs), "none");
    if (r->algo[0] != '-') {
        /* rank 0 sets it just after the record: a short wait at most */
        algo_key(key, sizeof(key), r->nonce);
        if (tutti_store_get(comm->job_store, key, &v, &len, tt_comm_quick_ms(comm)) == 0 && len &&
            memchr(v, '\0', len))
            snprintf(theirs, sizeof(theirs), "\"%.256s\"", (char *)v);
        else
            snprintf(theirs, sizeof(theirs), "one of fingerprint %s (its text unreadable: %s)",
                     r->algo, tutti_store_last_error(comm->job_store));
        free(v);
    }
    const char *ours = comm->opts.algo && comm->opts.algo[0] ? comm->opts.algo : NULL;
    snprintf(err, errlen,
             "store %s, prefix %s: %s runs with TUTTI_ALGO=%s, rank %d with %s%.256s%s: every "
             "rank must set the same TUTTI_ALGO (or one that means the same), or ranks pick "
             "different algorithms",
             comm->store_url, comm->job_base, desc, theirs, comm->rank, ours ? "\"" : "none",
             ours ? ours : "", ours ? "\"" : "");
}

/* Can this rank join the instance r? 0 yes, 1 no (rejected: wait on), < 0 error. */
static int check_record(tutti_comm_t *comm, const char *my_host, const job_rec_t *r,
                        const char *desc, member_wait_t *w, char *err, size_t errlen)
{
    tutti_store_t *js = comm->job_store;
    char mine[sizeof(r->transport)];
    tt_transport_canon(comm->opts.transport, mine, sizeof(mine));
    int sizes = r->nranks != comm->nranks, tps = strcmp(r->transport, mine) != 0;
    int chunks = r->chunk_bytes != comm->opts.chunk_bytes;
    /* "!": that rank's TUTTI_ALGO did not parse, which fails it once joined, saying so */
    int algos = strcmp(r->algo, comm->algo_fp) && r->algo[0] != '!' && comm->algo_fp[0] != '!';
    char proof[sizeof(r->auth)];
    rec_auth(comm, r->nonce, proof, sizeof(proof));
    int auths = strlen(proof) != strlen(r->auth) || !tt_auth_equal(proof, r->auth, strlen(proof));
    if (sizes || tps || chunks || algos || auths) {
        if (rec_stale(r, my_host) || rec_finished(js, r)) {
            reject_nonce(w, r->nonce); /* a previous run's */
            return 1;
        }
        if (sizes)
            snprintf(err, errlen,
                     "store %s, prefix %s: %s, but this rank was told the job has %d: the "
                     "ranks disagree on the world size (or another job uses this store)",
                     comm->store_url, comm->job_base, desc, comm->nranks);
        else if (tps)
            snprintf(err, errlen,
                     "store %s, prefix %s: %s names the transports \"%s\" (for peers on "
                     "its host, for the others), this rank \"%s\": every rank must set the "
                     "same TUTTI_TRANSPORT (or transport option)",
                     comm->store_url, comm->job_base, desc, r->transport, mine);
        else if (chunks)
            snprintf(err, errlen,
                     "store %s, prefix %s: %s runs with TUTTI_CHUNK_BYTES=%zu, rank %d with %zu: "
                     "every rank must set the same TUTTI_CHUNK_BYTES (chunk_bytes; the "
                     "algorithms' choice and their messages follow from it)",
                     comm->store_url, comm->job_base, desc, r->chunk_bytes, comm->rank,
                     comm->opts.chunk_bytes);
        else if (auths)
            snprintf(err, errlen,
                     "store %s, prefix %s: %s %s: every rank of a job must have the same "
                     "secret (TUTTI_AUTH_TOKEN or TUTTI_AUTH_TOKEN_FILE), or none",
                     comm->store_url, comm->job_base, desc,
                     r->auth[0] == '-' ? "has no job secret, this rank has one"
                     : !comm->secret   ? "has a job secret, this rank none"
                                       : "has another job secret than this rank's");
        else
            algo_mismatch(comm, r, desc, err, errlen);
        int st = sizes                      ? TUTTI_ERR_MISMATCH
                 : auths && !tps && !chunks ? TUTTI_ERR_AUTH
                                            : TUTTI_ERR_CONFIG;
        /* The ranks that joined r wait in their set-up for this one: while r is still
         * starting, leave this rank's reason as r's first failure so that they fail
         * within a slice of their wait, not at their timeout. (Were r another job's
         * sharing the prefix, that job fails too, as when two jobs' ranks meet on a slot
         * while starting; a running job (every rank ready) is left alone.) */
        if (!rec_ready(js, r)) {
            char why[TT_ERRMSG_LEN];
            snprintf(why, sizeof(why), "pid %ld on host %s did not join: %s", (long)getpid(),
                     my_host, err);
            offer_first_failure(js, r->nonce, comm->rank, st, why);
        }
        return st;
    }
    if (rec_stale(r, my_host) || rec_setup_failed(js, r)) {
        int fst = rec_failed_setup(js, r, desc, err, errlen);
        if (fst < 0)
            return fst;
        snprintf(w->why, sizeof(w->why), "%s is gone", desc);
        TT_INFO("job: not joining: %s; waiting for this job's rank 0", w->why);
        reject_nonce(w, r->nonce);
        return 1;
    }
    return 0;
}

/* Can this rank join r, a record of another format (rec_parse's 1)? Never: 1 (wait on)
 * where r is a previous run's (gone, finished, or set up without this rank), else this
 * rank fails at once and, as check_record does, leaves its reason as r's first failure
 * for the ranks waiting in r's set-up (those of versions that read it). */
static int check_other_format(tutti_comm_t *comm, const char *my_host, const job_rec_t *r,
                              const char *cur, member_wait_t *w, char *err, size_t errlen)
{
    tutti_store_t *js = comm->job_store;
    if (r->nranks) {
        int stale = rec_stale(r, my_host), fin = !stale && rec_finished(js, r);
        if (stale || fin || rec_ready(js, r)) {
            char desc[512], writer[96];
            rec_describe(r, desc, sizeof(desc));
            rec_writer(r, writer, sizeof(writer));
            snprintf(w->why, sizeof(w->why), "%s, written by %s, is %s", desc, writer,
                     stale ? "gone"
                     : fin ? "finished"
                           : "set up without this rank");
            TT_INFO("job: not joining: %s; waiting for this job's rank 0", w->why);
            reject_nonce(w, r->nonce);
            return 1;
        }
    }
    int st = rec_other_format(comm, r, cur, "", err, errlen);
    if (r->nranks) {
        char why[TT_ERRMSG_LEN];
        snprintf(why, sizeof(why), "pid %ld on host %s did not join: %s", (long)getpid(), my_host,
                 err);
        offer_first_failure(js, r->nonce, comm->rank, st, why);
    }
    return st;
}

/* Claim slot key for this rank, taking it over from a holder on this host that died
 * while r was starting (this rank restarted in place). The store's answer: the holder
 * now; or 1 (w->why says so) when the holder died after every rank of r was set up: r
 * is a previous run's, whose ranks are gone or going, and its record may be read before
 * this run's rank 0 replaces it (a rank of another host than rank 0's, whose pid it
 * cannot look up, restarted first): r's rank 0, dead too, will never accept this rank. */
static int take_slot(tutti_comm_t *comm, const char *my_host, const job_rec_t *r, const char *desc,
                     const char *key, member_wait_t *w, void **holder_p, size_t *hlen_p)
{
    tutti_store_t *js = comm->job_store;
    int st = tutti_store_compare_set(js, key, "", 0, w->claim, w->claim_len, holder_p, hlen_p);
    job_claim_t h;
    if (st == 0 && !(*hlen_p == w->claim_len && !memcmp(*holder_p, w->claim, w->claim_len)) &&
        claim_parse(*holder_p, *hlen_p, &h) == 0 && !strcmp(h.host, my_host) &&
        h.pidns == tp_pidns() && h.pid != (long)getpid()) {
        /* < 0: its /proc/<pid>/stat could not be read, which says nothing of it */
        int gone = tt_job_proc_gone(h.pid, h.start) == 1;
        if (gone && rec_ready(js, r)) {
            snprintf(w->why, sizeof(w->why),
                     "%s is gone: its rank %d (pid %ld on this host) died after every rank "
                     "was set up",
                     desc, comm->rank, h.pid);
            return 1;
        }
        if (gone) {
            /* its holder died: this rank was restarted in place; take the slot */
            TT_INFO("job: rank %d of %s was held by pid %ld, which is gone; taking it", comm->rank,
                    desc, h.pid);
            void *expected = *holder_p;
            size_t elen = *hlen_p;
            *holder_p = NULL;
            st = tutti_store_compare_set(js, key, expected, elen, w->claim, w->claim_len, holder_p,
                                         hlen_p);
            free(expected);
        }
    }
    return st;
}

/* The slot is someone else's: wait on (1), or fail if two jobs met (< 0). */
static int slot_taken(tutti_comm_t *comm, const char *my_host, const job_rec_t *r, const char *desc,
                      const void *cur, size_t clen, const void *holder, size_t hlen,
                      member_wait_t *w, char *err, size_t errlen)
{
    tutti_store_t *js = comm->job_store;
    job_claim_t h;
    int own = claim_parse(holder, hlen, &h) == 0 && h.pid == (long)getpid() &&
              !strcmp(h.host, my_host) && h.pidns == tp_pidns();
    snprintf(w->why, sizeof(w->why), "rank %d of %s is already taken (%.*s)", comm->rank, desc,
             (int)TT_MIN(hlen, 300), holder ? (const char *)holder : "");
    w->dead_only = 0;
    if (!own && !rec_ready(js, r) && record_still(js, cur, clen)) {
        /* two ranks r while it starts: two processes were given one rank, or two jobs
         * share the prefix; all fail */
        char twice[700], c[1024];
        if (h.pid > 0)
            snprintf(twice, sizeof(twice),
                     "rank %d claimed twice (pid %ld on host %s, pid %ld on host %s)", comm->rank,
                     h.pid, h.host, (long)getpid(), my_host);
        else
            snprintf(twice, sizeof(twice), "rank %d claimed twice (%.*s, pid %ld on host %s)",
                     comm->rank, (int)TT_MIN(hlen, 300), holder ? (const char *)holder : "",
                     (long)getpid(), my_host);
        snprintf(c, sizeof(c),
                 "%s while this job instance was starting: two processes were given rank %d, "
                 "or ranks of two jobs met; give each job its own TUTTI_JOB_ID",
                 twice, comm->rank);
        contest(js, r, c);
        snprintf(err, errlen,
                 "store %s, prefix %s: %s in %s, which is still starting: two processes were "
                 "given rank %d, or another job uses this store prefix; give each job its own "
                 "TUTTI_JOB_ID (or TUTTI_PREFIX, or store)",
                 comm->store_url, comm->job_base, twice, desc, comm->rank);
        /* the instance's ranks wait in their set-up, the slot's first claimant too: end
         * their waits (tt_setup_peer_failed reads a contest even under its own rank) */
        offer_first_failure(js, r->nonce, comm->rank, TUTTI_ERR_IN_USE, c);
        return TUTTI_ERR_IN_USE;
    }
    /* a running job's slot, or this process's previous communicator: wait for ours */
    TT_INFO("job: not joining: %s; waiting for this job's rank 0", w->why);
    reject_nonce(w, r->nonce);
    return 1;
}

/* Claim this rank's slot of the instance r (record cur): 0 joined, 1 wait on, < 0 error. */
static int claim_slot(tutti_comm_t *comm, const char *my_host, const job_rec_t *r, const char *desc,
                      const void *cur, size_t clen, member_wait_t *w, char *err, size_t errlen)
{
    tutti_store_t *js = comm->job_store;
    char key[96];
    slot_key(key, sizeof(key), r->nonce, comm->rank);
    void *holder = NULL;
    size_t hlen = 0;
    int st = take_slot(comm, my_host, r, desc, key, w, &holder, &hlen);
    if (st < 0) {
        snprintf(err, errlen, "claiming rank %d of %s: %s", comm->rank, desc,
                 tutti_store_last_error(js));
        return st;
    }
    if (st == 1) {
        /* a previous run's, as check_record rejects a dead one */
        free(holder);
        TT_INFO("job: not joining: %s; waiting for this job's rank 0", w->why);
        reject_nonce(w, r->nonce);
        return 1;
    }
    if (hlen == w->claim_len && !memcmp(holder, w->claim, w->claim_len)) {
        free(holder);
        /* Still the record? A last leaver or a new rank 0 replaces the record before
         * removing an instance's keys (claims included): a claim made in between is
         * in a dead namespace. */
        if (!record_still(js, cur, clen)) {
            tt_store_compare_delete(js, key, w->claim, w->claim_len);
            reject_nonce(w, r->nonce);
            return 1;
        }
        snprintf(comm->record, sizeof(comm->record), "%s", (const char *)cur);
        snprintf(comm->nonce, sizeof(comm->nonce), "%s", r->nonce);
        return TUTTI_OK;
    }
    st = slot_taken(comm, my_host, r, desc, cur, clen, holder, hlen, w, err, errlen);
    free(holder);
    return st;
}

/* No instance of this job appeared in time: say what was seen instead. */
static int member_give_up(tutti_comm_t *comm, const member_wait_t *w, char *err, size_t errlen)
{
    char self[160];
    snprintf(self, sizeof(self), "this rank's job id: %s (from %s)",
             comm->job_id[0] ? comm->job_id : "none", comm->job_src ? comm->job_src : "?");
    if (w->nrej && w->dead_only)
        snprintf(err, errlen,
                 "store %s, prefix %s: %s, and no newer instance of this job appeared within "
                 "%d ms (did this job's rank 0 fail or not start?); %s",
                 comm->store_url, comm->job_base, w->why, tt_comm_timeout_ms(comm), self);
    else if (w->nrej)
        snprintf(err, errlen,
                 "store %s, prefix %s: already used by another job, and no instance of this "
                 "job appeared within %d ms (%s); give each job its own TUTTI_JOB_ID (or "
                 "TUTTI_PREFIX, or store); %s",
                 comm->store_url, comm->job_base, tt_comm_timeout_ms(comm), w->why, self);
    else
        snprintf(err, errlen,
                 "store %s: rank 0 did not create a job instance at %sinstance within %d ms "
                 "(%s; rank 0 must have the same)%s%s",
                 comm->store_url, comm->job_base, tt_comm_timeout_ms(comm), self,
                 w->store_said[0] ? "; the store: " : "", w->store_said);
    return w->nrej && !w->dead_only ? TUTTI_ERR_IN_USE : TUTTI_ERR_TIMEOUT;
}

static int join_as_member(tutti_comm_t *comm, const char *my_host, uint64_t deadline, char *err,
                          size_t errlen)
{
    tutti_store_t *js = comm->job_store;
    member_wait_t w = { .dead_only = 1 };
    int poll_ms = JOB_POLL_MS;
    w.claim_len = (size_t)claim_format(w.claim, sizeof(w.claim), my_host, comm->nonce) + 1;
    for (;;) {
        int left = tt_ms_left(deadline);
        if (left <= 0)
            break;
        void *cur = NULL;
        size_t clen = 0;
        int st = tutti_store_get(js, "instance", &cur, &clen, left);
        if (st == TUTTI_ERR_TIMEOUT) {
            snprintf(w.store_said, sizeof(w.store_said), "%s", tutti_store_last_error(js));
            break;
        }
        if (st < 0) {
            snprintf(err, errlen, "reading the job instance %sinstance: %s", comm->job_base,
                     tutti_store_last_error(js));
            return st;
        }
        job_rec_t r;
        int pr = clen > 1 ? rec_parse(cur, &r) : -1;
        if (pr < 0 || (r.nranks && nonce_rejected(&w, r.nonce))) {
            /* nothing (new) to join yet: back off, a late rank 0 may be minutes away */
            free(cur);
            sleep_ms(TT_MIN(poll_ms, tt_ms_left(deadline)));
            poll_ms = TT_MIN(poll_ms * 2, 100);
            continue;
        }
        poll_ms = JOB_POLL_MS;
        char desc[512];
        rec_describe(&r, desc, sizeof(desc));
        st = pr == 1 ? check_other_format(comm, my_host, &r, cur, &w, err, errlen)
                     : check_record(comm, my_host, &r, desc, &w, err, errlen);
        if (st == 0)
            st = claim_slot(comm, my_host, &r, desc, cur, clen, &w, err, errlen);
        free(cur);
        if (st <= 0)
            return st;
    }
    return member_give_up(comm, &w, err, errlen);
}

int tt_job_join(tutti_comm_t *comm, tutti_store_t *store, const char *base, char *err,
                size_t errlen)
{
    snprintf(comm->job_base, sizeof(comm->job_base), "%s", base);
    int st = tutti_store_open_prefixed(&comm->job_store, store, base);
    if (st < 0) {
        snprintf(err, errlen, "cannot open store view %s on %s: %s", base, comm->store_url,
                 tutti_strerror(st));
        return st;
    }
    tutti_store_set_timeout(comm->job_store, tt_comm_timeout_ms(comm));
    /* The record and the claim name this process's start, by which the other ranks tell
     * it alive from a dead one of the same pid: without it (0) they would take it for
     * dead, so set-up fails here, saying why, instead of waiting for its timeout */
    unsigned long long my_start;
    if ((st = tt_job_self_start(&my_start)) < 0) {
        snprintf(err, errlen,
                 "cannot read this process's start time from /proc/self/stat (%s): the job "
                 "record names it, so that the other ranks can tell this process alive",
                 strerror(-st));
        return st == -ENOMEM ? TUTTI_ERR_NOMEM : TUTTI_ERR_IO;
    }
    uint8_t rnd[8];
    if ((st = tt_auth_random(rnd, sizeof(rnd))) < 0) {
        snprintf(err, errlen, "no random bytes for the job instance nonce");
        return st;
    }
    for (int i = 0; i < 8; i++)
        snprintf(comm->nonce + 2 * i, 3, "%02x", rnd[i]);
    char host[256];
    tt_host_id(comm->opts.host_id, host, sizeof(host));
    uint64_t deadline = tt_deadline_ns(tt_comm_timeout_ms(comm));
    st = comm->rank == 0 ? join_as_root(comm, host, deadline, err, errlen)
                         : join_as_member(comm, host, deadline, err, errlen);
    if (st < 0)
        return st;
    if (comm->rank == 0 && comm->algo_fp[0] != '-' && comm->algo_fp[0] != '!') {
        /* its TUTTI_ALGO as written, for the error of a rank whose override differs */
        char key[96];
        algo_key(key, sizeof(key), comm->nonce);
        if ((st = tutti_store_set(comm->job_store, key, comm->opts.algo,
                                  strlen(comm->opts.algo) + 1)) < 0) {
            snprintf(err, errlen, "publishing TUTTI_ALGO: %s",
                     tutti_store_last_error(comm->job_store));
            return st;
        }
    }
    if (comm->rank == 0) {
        char key[96];
        slot_key(key, sizeof(key), comm->nonce, 0);
        char claim[384];
        int n = claim_format(claim, sizeof(claim), host, comm->nonce);
        if ((st = tutti_store_set(comm->job_store, key, claim, (size_t)n + 1)) < 0) {
            snprintf(err, errlen, "claiming rank 0: %s", tutti_store_last_error(comm->job_store));
            return st;
        }
    }
    live_add(comm->nonce);
    TT_INFO("job %s: instance %s under %s", comm->job_id[0] ? comm->job_id : "(no id)", comm->nonce,
            base);
    /* Two id-less jobs whose starts overlap by more than the settle time cannot be told
     * apart by anything in their processes (docs/architecture.md, job identity): say so
     * once, where the user can act on it. */
    static atomic_int warned;
    if (!comm->job_id[0] && comm->nranks > 1 && comm->rank == 0 && !atomic_exchange(&warned, 1))
        TT_WARN("job: no job id (TUTTI_JOB_ID or a launcher's): another id-less job started on "
                "store %s more than %d ms apart from this one could not be told from it; give "
                "each run its own TUTTI_JOB_ID",
                comm->store_url, comm->opts.job_settle_ms);
    return open_views(comm, store, base, err, errlen);
}

/* Contested? 0 no, 1 yes (message in err), < 0 the store failed (message in err). */
static int read_contest(tutti_comm_t *comm, char *err, size_t errlen)
{
    char key[96];
    snprintf(key, sizeof(key), "%s/contested", comm->nonce);
    void *v = NULL;
    size_t len = 0;
    int st = tt_store_get_now(comm->job_store, key, &v, &len);
    if (st == TUTTI_ERR_NOT_FOUND)
        return 0;
    if (st < 0) {
        snprintf(err, errlen, "store %s: checking that no other job contested this instance: %s",
                 comm->store_url, tutti_store_last_error(comm->job_store));
        return st;
    }
    snprintf(err, errlen, "store %s, prefix %s: %s", comm->store_url, comm->job_base, (char *)v);
    free(v);
    return 1;
}

int tt_job_check_contested(tutti_comm_t *comm, char *err, size_t errlen)
{
    /* Without a job id, nothing tells two jobs' ranks apart but their timing: keep the
     * instance open to contest for a while after its creation, so that the other job's
     * rank 0 or a second claimant of a slot that arrives meanwhile is seen. (A single
     * rank meets nobody.) */
    if (!comm->job_id[0] && comm->opts.job_settle_ms > 0 && comm->nranks > 1) {
        job_rec_t r;
        if (rec_parse(comm->record, &r) == 0) {
            long long wait = r.created_ms + comm->opts.job_settle_ms - realtime_ms();
            if (wait > comm->opts.job_settle_ms)
                wait = comm->opts.job_settle_ms;
            if (wait > 0)
                sleep_ms((int)wait);
        }
    }
    /* The whole timeout, as every set-up wait has: on the way to success, not a failure
     * path's quick look (a store that stalled 1-2 s here failed init, on some ranks and
     * not others; found by review). The job store's deadline is the timeout already. */
    /* Fail closed: a contest that cannot be read may be one. Check, count this rank
     * ready (from then on a later job may take the record over rather than contest),
     * and check again for a contest that raced the count. */
    int st = read_contest(comm, err, errlen);
    if (st == 0) {
        char key[96];
        snprintf(key, sizeof(key), "%s/ready", comm->nonce);
        int64_t ready = 0;
        st = tutti_store_add(comm->job_store, key, 1, &ready);
        if (st < 0)
            snprintf(err, errlen, "store %s: counting this rank ready: %s", comm->store_url,
                     tutti_store_last_error(comm->job_store));
        else
            st = read_contest(comm, err, errlen);
    }
    return st == 1 ? TUTTI_ERR_IN_USE : st < 0 ? st : TUTTI_OK;
}

void tt_job_leave(tutti_comm_t *comm)
{
    tutti_store_t *js = comm->job_store;
    if (!js || !comm->nonce[0] || !comm->record[0])
        return;
    live_remove(comm->nonce);
    tutti_store_set_timeout(js, tt_comm_quick_ms(comm));
    char key[96];
    snprintf(key, sizeof(key), "%s/left", comm->nonce);
    int64_t left = 0;
    if (tutti_store_add(js, key, 1, &left) < 0 || left < comm->nranks)
        return;
    /* The last one out: release the record if it is still ours (so nobody joins or
     * judges this instance any more), then remove the instance's keys, then the empty
     * record (only if nobody took it meanwhile). */
    void *cur = NULL;
    size_t clen = 0;
    int released = tutti_store_compare_set(js, "instance", comm->record, strlen(comm->record) + 1,
                                           "", 0, &cur, &clen) == 0 &&
                   clen == 0;
    free(cur);
    gc_instance(js, comm->nonce);
    if (released)
        tt_store_compare_delete(js, "instance", "", 0);
}
