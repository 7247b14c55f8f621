/* tutti-run: start N ranks of a program on this host (mpirun/torchrun's job for tutti).
 *
 *   tutti-run -np N [--store URL] [--node-rank K --nnodes M | --nnodes MIN:MAX]
 *             [--job-id ID] [--timeout S] [--max-restarts R] [--tag] [--] PROGRAM [ARGS...]
 *
 * Each rank runs PROGRAM with TUTTI_RANK, TUTTI_WORLD_SIZE, TUTTI_LOCAL_RANK,
 * TUTTI_LOCAL_SIZE and TUTTI_STORE set, so tutti_comm_init_env() finds its place (and
 * RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT, as torchrun sets them, for torch's
 * env://), and TUTTI_JOB_ID unless the user set it (see tt_launch_job_id). Without --store
 * the ranks meet in a file store in a fresh directory in $TMPDIR, removed on every exit path (a cleaner process removes it if
 * tutti-run is SIGKILLed). With several nodes, start one tutti-run per node with the same
 * tcp:// store (node 0's rank 0 hosts it) and, outside a batch scheduler, the same
 * --job-id. The launching itself (process groups, death with tutti-run, the cleaner) is
 * tools/launch.c, shared with tutti-bench -np.
 *
 * The first rank to fail (non-zero exit or a signal) brings the others down: SIGTERM,
 * then SIGKILL after a grace period; so does --timeout and a SIGINT/SIGTERM to tutti-run.
 * Without a terminal on fds 0-2 (batch jobs, CI, pipes), each rank runs in its own process
 * group and the signals go to the group, so what a rank started stops with it, even after
 * the rank itself exited. With a terminal, the ranks stay in tutti-run's process group:
 * a background group would be stopped by SIGTTIN/SIGTTOU when it used the terminal (pdb,
 * breakpoint()), and Ctrl-C reaches every rank directly; the signals then go to each rank
 * alone. A rank, and its group, also get SIGKILL if tutti-run dies.
 * --nnodes MIN:MAX: elastic, as torchrun's agent; the rendezvous is tools/rdzv.h.
 * Exit status: 0 when every rank exited 0; else the first failing rank's exit status
 * (128 + signal for a signal, 124 for --timeout); 2 on bad usage. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tutti/tutti.h>

#include "base/base.h" /* the library's log (lib/base/log.c, built in here too) */
#include "cli.h"
#include "launch.h"
#include "errfile.h"
#include "hosts.h"
#include "rdzv.h"

/* --tag: once every rank has exited, how long processes they left behind may keep
 * writing to (and holding open) their output pipes */
#define DRAIN_MS 500

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s -np N [options] [--] PROGRAM [ARGS...]\n"
            "\n"
            "Start N ranks of PROGRAM on this host with the TUTTI_* variables that\n"
            "tutti_comm_init_env() reads.\n"
            "\n"
            "  -n, -np, --np N     ranks on this host (torchrun's default of 1 for -m MODULE,\n"
            "                      SCRIPT.py and --standalone; required otherwise)\n"
            "  -s, --store URL     rendezvous store: file:///DIR, tcp://HOST:PORT or\n"
            "                      redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] (default: a file\n"
            "                      store in a fresh directory in $TMPDIR or /tmp, removed\n"
            "                      however tutti-run ends)\n"
            "      --nnodes M      nodes in the job (default 1); ranks are numbered\n"
            "      --node-rank K   node K's ranks are K*N .. K*N+N-1 (default 0)\n"
            "      --nnodes MIN:MAX\n"
            "                      elastic (torchrun's): the tutti-runs that share --store\n"
            "                      meet in rounds of MIN..MAX nodes, numbered in the order\n"
            "                      they came; a failure restarts the round (counted by\n"
            "                      --max-restarts), a node that comes to a running round\n"
            "                      below MAX restarts it without counting; ranks of round R\n"
            "                      get TUTTI_JOB_ID <job id>-rR and TUTTI_ROUND. A tcp://\n"
            "                      store is served by the first tutti-run on its host\n"
            "      --rdzv-last-call MS\n"
            "                      with MIN or more nodes, wait this long for more (1000)\n"
            "      --rdzv-timeout S\n"
            "                      how long a node waits for a round to take it (600)\n"
            "      torchrun's spellings: --nproc-per-node N|cpu|auto (-np), --node_rank,\n"
            "                      --max_restarts, --rdzv-id (--job-id), --rdzv-endpoint\n"
            "                      HOST[:PORT] (--store tcp://HOST:PORT, port 29400),\n"
            "                      --rdzv-backend c10d (--nnodes N is N:N) or static,\n"
            "                      --standalone (one node), -m MODULE and SCRIPT.py (run by\n"
            "                      python3 from PATH), --no-python, --master-addr A\n"
            "                      --master-port P (the ranks' MASTER_ADDR/PORT; with\n"
            "                      --nnodes M and no --store, the store tcp://A:P+1)\n"
            "                      --rdzv-conf K=V,... (join_timeout, last_call_timeout,\n"
            "                      keep_alive_interval, keep_alive_max_attempt: a node\n"
            "                      whose heartbeat stops that long is gone, read_timeout,\n"
            "                      is_host), --monitor-interval S, --local-addr A (this\n"
            "                      node's MASTER_ADDR), --role NAME, --start-method M,\n"
            "                      --log-dir DIR, --redirects N, --tee N (N: 1 stdout,\n"
            "                      2 stderr, 3 both, or LOCAL_RANK:N,...: to the log\n"
            "                      files DIR/<job>_*/attempt_<n>/<local rank>/, --tee to\n"
            "                      the console too, with the rank's prefix)\n"
            "      --job-id ID     TUTTI_JOB_ID of the ranks (default: the environment's, else\n"
            "                      one unique to this launch; with several nodes, the job id\n"
            "                      of what started them (Slurm, mpirun, torchrun...), else one\n"
            "                      from the store's port: when jobs share a standalone store,\n"
            "                      give each job's nodes one --job-id of its own)\n"
            "  -t, --timeout S     kill every rank after S seconds (exit status 124);\n"
            "                      elastic, this node's: it leaves, the others go on\n"
            "      --max-restarts R\n"
            "                      when a rank fails, stop the others and start all N\n"
            "                      again, up to R times (torchrun's --max-restarts; default\n"
            "                      0); the ranks see TUTTI_RESTART_COUNT and\n"
            "                      TORCHELASTIC_RESTART_COUNT (0 at first), the same store\n"
            "                      and job id; with --nnodes, give every node the same R\n"
            "      --tag           prefix each line of the ranks' output with [rank]\n"
            "      --bind          hold each rank on one CPU: the i-th of N on the (i*C/N)-th\n"
            "                      of the C CPUs tutti-run may use (neighbours together, as\n"
            "                      mpirun's --bind-to core; with more ranks than CPUs it keeps\n"
            "                      small collectives out of the scheduler's slow placements)\n"
            "  -H, --hosts [U@]H[:S],...\n"
            "                      the job on several hosts from here (mpirun's and\n"
            "                      horovodrun's -H; --hostfile FILE: HOST, HOST:S or HOST\n"
            "                      slots=S a line; U@: the remote user, as ssh takes it):\n"
            "                      -np N ranks (default every slot) fill\n"
            "                      them in order; other hosts through --rsh CMD (ssh -o\n"
            "                      BatchMode=yes; TUTTI_RSH), with tutti-run at this path\n"
            "                      (--launch-agent PATH); -x VAR[=V] passes a variable on.\n"
            "                      The store is served here, with a fresh secret.\n"
            "                      In a Slurm batch script of several nodes, or under\n"
            "                      salloc: the job's nodes and tasks a node, started\n"
            "                      through srun\n"
            "  -h, --help          show this help\n"
            "\n"
            "The first rank that fails brings the others down (SIGTERM, then SIGKILL after\n"
            "%d ms; with TUTTI_TRACE_DIR set, the SIGTERM %d ms after the failure, for the\n"
            "others' flight records). Exit status: 0 when every rank exited 0, else the\n"
            "first failing rank's status (of the last attempt; 128+signal for a signal,\n"
            "124 for --timeout, which counts over every attempt); 2 on bad usage.\n"
            "SIGUSR1 and SIGUSR2 are passed on to the ranks (the launch goes on).\n"
            "The temporary store is made in $TMPDIR (default /tmp).\n",
            argv0, TT_LAUNCH_GRACE_MS, TT_LAUNCH_RECORD_MS);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void setenv_int(const char *name, int v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%d", v);
    setenv(name, buf, 1);
}

/* --tag: copy lines from fd (-1 once closed) to out with "[rank] " in front. */
typedef struct tagger {
    int fd, rank;
    int copy;  /* --tee: the log file the bytes also go to (-1: none) */
    FILE *out; /* NULL once it failed while the copy goes on */
    char buf[8192];
    size_t len;
} tagger_t;

/* "[rank] " and a line (nl: add its newline) to t->out in one write, so that a line of
 * another rank's (written straight to the same console, or through another tagger)
 * never lands between the prefix and its line (two writes did: test_launcher's --tee
 * case, seen once beside other suites). -1 when out failed. */
static int tag_line(tagger_t *t, const char *s, size_t n, int nl)
{
    char line[sizeof(t->buf) + 32];
    int k = snprintf(line, sizeof(line), "[%d] ", t->rank);
    memcpy(line + k, s, n);
    size_t len = (size_t)k + n;
    if (nl)
        line[len++] = '\n';
    if (fflush(t->out) != 0) /* (anything of ours still buffered goes first) */
        return -1;
    for (size_t off = 0; off < len;) {
        ssize_t w = write(fileno(t->out), line + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        off += (size_t)w;
    }
    return 0;
}

/* Returns 0 at EOF, and when out fails with no log copy to go on with: its reader went
 * away, and closing our end makes the rank's next write fail as it would have without
 * --tag (SIGPIPE). With a copy (--tee), the log goes on alone, as torchrun's. */
static int tag_pump(tagger_t *t)
{
    ssize_t r = read(t->fd, t->buf + t->len, sizeof(t->buf) - t->len);
    if (r < 0 && errno == EINTR)
        return 1;
    if (r <= 0)
        return 0;
    if (t->copy >= 0 && write(t->copy, t->buf + t->len, (size_t)r) != r) {
        fprintf(stderr, "tutti-run: rank %d: writing its log: %s\n", t->rank, strerror(errno));
        close(t->copy);
        t->copy = -1;
    }
    if (!t->out) /* the console failed earlier: the log only */
        return t->copy >= 0;
    t->len += (size_t)r;
    size_t start = 0;
    int bad = 0;
    for (size_t i = 0; i < t->len && !bad; i++) {
        if (t->buf[i] == '\n') { /* written as it came, NUL bytes too */
            bad = tag_line(t, t->buf + start, i - start + 1, 0) < 0;
            start = i + 1;
        }
    }
    if (!bad && start == 0 && t->len == sizeof(t->buf)) { /* a very long line: a piece */
        bad = tag_line(t, t->buf, t->len, 1) < 0;
        start = t->len;
    }
    memmove(t->buf, t->buf + start, t->len - start);
    t->len -= start;
    if (!bad)
        return 1;
    t->out = NULL;
    t->len = 0;
    return t->copy >= 0;
}

static void tag_close(tagger_t *t)
{
    if (t->out && t->len) /* a last line without its newline */
        (void)tag_line(t, t->buf, t->len, 1);
    close(t->fd);
    if (t->copy >= 0)
        close(t->copy);
    t->fd = t->copy = -1;
    t->len = 0;
}

/* Forwards the ranks' output for up to ms; returns how many of their streams are open. */
/* pf: n + 1 entries, the last for exit_fd (a rank's exit ends the wait; -1: none). */
static int tag_poll(tagger_t *tags, struct pollfd *pf, int n, int ms, int exit_fd)
{
    int nopen = 0;
    for (int k = 0; k < n; k++) { /* poll skips the closed ones (fd -1) */
        pf[k] = (struct pollfd){ .fd = tags[k].fd, .events = POLLIN };
        nopen += tags[k].fd >= 0;
    }
    pf[n] = (struct pollfd){ .fd = exit_fd, .events = POLLIN };
    if (!nopen || poll(pf, (nfds_t)n + 1, ms) <= 0)
        return nopen;
    for (int k = 0; k < n; k++) {
        if (pf[k].revents && !tag_pump(&tags[k])) {
            tag_close(&tags[k]);
            nopen--;
        }
    }
    return nopen;
}

/* What a rank runs: its variables, its output (pipes for --tag/--tee, files for
 * --redirects), then the program. */
typedef struct run_rank {
    int rank0, np, world, restart, max_restarts;
    int node, nodes;    /* GROUP_RANK, GROUP_WORLD_SIZE (static; elastic: the round's) */
    const tt_rdzv_t *z; /* elastic: the round, else NULL */
    const char *job_id, *role;
    char master_addr[256]; /* for torch's env:// ("" where the user set them) */
    int master_port;
    int out, err;              /* write ends of this rank's pipes, or its log files; -1: ours */
    char error_file[PATH_MAX]; /* torch's TORCHELASTIC_ERROR_FILE (errfile.h) */
    const char *store;
    char **prog;
} run_rank_t;

static void run_rank(void *arg, int i)
{
    const run_rank_t *r = arg;
    int rank = r->rank0 + i;
    setenv_int("TUTTI_RANK", rank);
    setenv_int("TUTTI_WORLD_SIZE", r->world);
    setenv_int("TUTTI_LOCAL_RANK", i);
    setenv_int("TUTTI_LOCAL_SIZE", r->np);
    setenv_int("RANK", rank);
    setenv_int("WORLD_SIZE", r->world);
    setenv_int("LOCAL_RANK", i);
    setenv_int("TUTTI_RESTART_COUNT", r->restart);
    setenv_int("TORCHELASTIC_RESTART_COUNT", r->restart);
    setenv_int("TORCHELASTIC_MAX_RESTARTS", r->max_restarts);
    /* torchrun's one role: its ranks are the job's */
    setenv("ROLE_NAME", r->role ? r->role : "default", 1);
    setenv_int("ROLE_RANK", rank);
    setenv_int("ROLE_WORLD_SIZE", r->world);
    /* torchrun: more than one rank per node, each gets one OpenMP thread unless told */
    if (r->np > 1 && !getenv("OMP_NUM_THREADS"))
        setenv("OMP_NUM_THREADS", "1", 1);
    setenv("TUTTI_STORE", r->store, 1);
    setenv_int("LOCAL_WORLD_SIZE", r->np);
    /* the user's are kept, except elastic: rank 0 moves between nodes and rounds (torchrun
     * sets the round's too) */
    if (r->master_addr[0] && (r->z || !getenv("MASTER_ADDR")))
        setenv("MASTER_ADDR", r->master_addr, 1);
    if (r->master_port && (r->z || !getenv("MASTER_PORT")))
        setenv_int("MASTER_PORT", r->master_port);
    setenv_int("GROUP_RANK", r->z ? r->z->idx : r->node);
    setenv_int("GROUP_WORLD_SIZE", r->z ? r->z->nodes : r->nodes);
    if (r->z) {
        char id[320];
        snprintf(id, sizeof(id), "%s-r%lld", r->job_id, (long long)r->z->round);
        setenv("TUTTI_JOB_ID", id, 1);
        setenv("TORCHELASTIC_RUN_ID", r->job_id, 1);
        setenv_int("TUTTI_ROUND", (int)r->z->round);
        setenv("TUTTI_STORE_SERVER", "0", 1); /* the store outlives the rounds */
        /* torch 2's ranks would take MASTER_ADDR:PORT for torchrun's agent store and
         * not serve it: here the round's rank 0 does (an outer torchrun's value would
         * leave nobody serving) */
        setenv("TORCHELASTIC_USE_AGENT_STORE", "False", 1);
    }
    if (r->error_file[0])
        setenv("TORCHELASTIC_ERROR_FILE", r->error_file, 1);
    else /* not tutti-run's own: one file for every rank would mix them */
        unsetenv("TORCHELASTIC_ERROR_FILE");
    if ((r->out >= 0 && dup2(r->out, 1) < 0) || (r->err >= 0 && dup2(r->err, 2) < 0))
        _exit(127);
    execvp(r->prog[0], r->prog);
    fprintf(stderr, "tutti-run: rank %d: cannot run %s: %s\n", rank, r->prog[0], strerror(errno));
    _exit(127);
}

/* The command line. */
typedef struct run_opts {
    int np, nnodes, node_rank, timeout_s, tag, bind, max_restarts;
    int piped; /* the ranks' output comes through pipes: --tag, or --tee somewhere */
    /* torchrun's --log-dir, --redirects and --tee (per local rank: 1 stdout, 2 stderr,
     * 3 both); run_dir: the job's own directory in log_dir, made at the start */
    const char *log_dir, *redirects, *tee;
    char run_dir[PATH_MAX];
    int min_nodes; /* elastic (--nnodes MIN:MAX): MIN, nnodes being MAX; else 0 */
    int standalone, module, no_python; /* torchrun's options */
    char **prog_owned;                 /* prog, when made here (python3 ...) */
    int last_call_ms, rdzv_timeout_s;
    /* elastic, torchrun's --rdzv-conf and --monitor-interval (0: rdzv.h's defaults) */
    int keep_alive_ms, keep_alive_max, read_timeout_ms, monitor_ms, host_ok;
    const char *store, *job_id, *local_addr, *role;
    char **prog;
    /* -H / --hostfile: the job's hosts, each started through rsh (hosts.h); an agent
     * (--agent, on one of them) gets its ranks' numbers and its secret from that launch */
    tt_host_t *hosts;
    int nhosts, agent, rank_offset, world;
    int nodes_named; /* --nnodes or --node-rank given (not the default one node) */
    int slurm;       /* hosts: a Slurm batch allocation's nodes, started through srun */
    int placed;      /* an agent: this node found among --place's */
    const char *rsh, *launch_agent;
    const char *fwd[64]; /* -x VAR[=VALUE] */
    int nfwd;
} run_opts_t;

/* Seconds as "S" or "S.F" (torchrun's floats), in ms, at least min_ms. 0 or -1. */
static int seconds_ms(const char *v, int min_ms, int *ms_p)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (end == v || *end || errno || !(d * 1000 >= min_ms) || d > INT_MAX / 1000)
        return -1;
    *ms_p = (int)(d * 1000 + 0.5);
    return 0;
}

/* torchrun's --rdzv-conf K=V[,K=V...]: the keys its c10d rendezvous reads. 0, or -1
 * (said). */
static int rdzv_conf(const char *conf, run_opts_t *o)
{
    char buf[1024];
    if (strlen(conf) >= sizeof(buf)) {
        fprintf(stderr, "tutti-run: --rdzv-conf: too long\n");
        return -1;
    }
    snprintf(buf, sizeof(buf), "%s", conf);
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            fprintf(stderr, "tutti-run: --rdzv-conf: \"%s\": expected KEY=VALUE\n", kv);
            return -1;
        }
        *eq = '\0';
        const char *k = kv, *v = eq + 1;
        int ms = 0, bad = 0;
        if (!strcmp(k, "join_timeout") || !strcmp(k, "timeout")) {
            bad = seconds_ms(v, 1000, &ms);
            o->rdzv_timeout_s = (int)(((long long)ms + 999) / 1000);
        } else if (!strcmp(k, "last_call_timeout")) {
            bad = seconds_ms(v, 0, &o->last_call_ms);
        } else if (!strcmp(k, "keep_alive_interval")) {
            bad = seconds_ms(v, 10, &o->keep_alive_ms);
        } else if (!strcmp(k, "keep_alive_max_attempt")) {
            bad = tt_cli_int(v, 1, 1 << 20, &o->keep_alive_max);
        } else if (!strcmp(k, "read_timeout")) {
            bad = seconds_ms(v, 100, &o->read_timeout_ms);
        } else if (!strcmp(k, "is_host")) {
            /* whether this node may serve a tcp:// store (torchrun's c10d default:
             * the node whose address the endpoint names) */
            if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"))
                o->host_ok = 1;
            else if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no"))
                o->host_ok = 0;
            else
                bad = -1;
        } else if (!strcmp(k, "close_timeout") || !strcmp(k, "store_type") ||
                   !strcmp(k, "use_libuv")) {
            /* torch's, with no meaning here: a closed round is never reopened, and the
             * store is --store's */
        } else {
            fprintf(stderr,
                    "tutti-run: --rdzv-conf: unknown key \"%s\" (known: join_timeout, "
                    "last_call_timeout, keep_alive_interval, keep_alive_max_attempt, "
                    "read_timeout, is_host, close_timeout)\n",
                    k);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "tutti-run: --rdzv-conf: %s=%s: bad value\n", k, v);
            return -1;
        }
    }
    return 0;
}

static int stream_spec(const char *spec, int i);

/* Returns -1 when the command line asks for a run, else the exit status (0 for --help,
 * 2 for bad usage). */
/* torchrun runs Python: -m MODULE, or a script named *.py, unless --no-python */
static int runs_python(const run_opts_t *o, const char *prog)
{
    size_t len = strlen(prog);
    return o->module || (!o->no_python && len > 3 && !strcmp(prog + len - 3, ".py"));
}

static int parse_args(int argc, char **argv, run_opts_t *o_p)
{
    *o_p = (run_opts_t){
        .nnodes = 1, .last_call_ms = 1000, .rdzv_timeout_s = 600, .host_ok = 1, .rank_offset = -1
    };
    enum {
        O_CONF = 1000,
        O_MONITOR,
        O_ROLE,
        O_LOCAL_ADDR,
        O_START_METHOD,
        O_LOG_DIR,
        O_REDIR,
        O_TEE,
        O_HOSTFILE,
        O_RSH,
        O_LAUNCH_AGENT,
        O_AGENT,
        O_RANK_OFFSET,
        O_WORLD,
        O_PLACE
    };
    static const struct option longopts[] = {
        { "np", required_argument, NULL, 'n' },
        { "store", required_argument, NULL, 's' },
        { "nnodes", required_argument, NULL, 'N' },
        { "node-rank", required_argument, NULL, 'K' },
        { "timeout", required_argument, NULL, 't' },
        { "tag", no_argument, NULL, 'T' },
        { "bind", no_argument, NULL, 'B' },
        { "job-id", required_argument, NULL, 'J' },
        { "max-restarts", required_argument, NULL, 'R' },
        { "rdzv-last-call", required_argument, NULL, 'L' },
        { "rdzv-timeout", required_argument, NULL, 'D' },
        { "help", no_argument, NULL, 'h' },
        /* torchrun's spellings, so that its command lines run unchanged */
        { "nproc-per-node", required_argument, NULL, 'P' },
        { "nproc_per_node", required_argument, NULL, 'P' },
        { "node_rank", required_argument, NULL, 'K' },
        { "max_restarts", required_argument, NULL, 'R' },
        { "rdzv-id", required_argument, NULL, 'J' },
        { "rdzv_id", required_argument, NULL, 'J' },
        { "rdzv-endpoint", required_argument, NULL, 'E' },
        { "rdzv_endpoint", required_argument, NULL, 'E' },
        { "rdzv-backend", required_argument, NULL, 'b' },
        { "rdzv_backend", required_argument, NULL, 'b' },
        { "standalone", no_argument, NULL, 'S' },
        { "module", no_argument, NULL, 'm' },
        { "no-python", no_argument, NULL, 'X' },
        { "no_python", no_argument, NULL, 'X' },
        { "master-addr", required_argument, NULL, 'A' },
        { "master_addr", required_argument, NULL, 'A' },
        { "master-port", required_argument, NULL, 'O' },
        { "master_port", required_argument, NULL, 'O' },
        { "rdzv-conf", required_argument, NULL, O_CONF },
        { "rdzv_conf", required_argument, NULL, O_CONF },
        { "monitor-interval", required_argument, NULL, O_MONITOR },
        { "monitor_interval", required_argument, NULL, O_MONITOR },
        { "role", required_argument, NULL, O_ROLE },
        { "local-addr", required_argument, NULL, O_LOCAL_ADDR },
        { "local_addr", required_argument, NULL, O_LOCAL_ADDR },
        { "start-method", required_argument, NULL, O_START_METHOD },
        { "start_method", required_argument, NULL, O_START_METHOD },
        { "hosts", required_argument, NULL, 'H' },
        { "host", required_argument, NULL, 'H' },
        { "hostfile", required_argument, NULL, O_HOSTFILE },
        { "machinefile", required_argument, NULL, O_HOSTFILE },
        { "rsh", required_argument, NULL, O_RSH },
        { "launch-agent", required_argument, NULL, O_LAUNCH_AGENT },
        /* an agent started by -H's launch (not for users: its stdin is the launch's) */
        { "agent", no_argument, NULL, O_AGENT },
        { "rank-offset", required_argument, NULL, O_RANK_OFFSET },
        { "world-size", required_argument, NULL, O_WORLD },
        /* an agent of a launch through one srun: "NODE NODE_RANK FIRST N STORE" */
        { "place", required_argument, NULL, O_PLACE },
        { "log-dir", required_argument, NULL, O_LOG_DIR },
        { "log_dir", required_argument, NULL, O_LOG_DIR },
        { "redirects", required_argument, NULL, O_REDIR },
        { "tee", required_argument, NULL, O_TEE },
        { NULL, 0, NULL, 0 },
    };
    static char endpoint[300];
    int c10d = 0, master_port = 0;
    const char *master_addr = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "+n:s:t:hmH:x:", longopts, NULL)) != -1) {
        switch (c) {
        case 'H':
            if (tt_hosts_parse("tutti-run", optarg, &o_p->hosts, &o_p->nhosts) < 0)
                return 2;
            break;
        case O_HOSTFILE:
            if (tt_hosts_read("tutti-run", optarg, &o_p->hosts, &o_p->nhosts) < 0)
                return 2;
            break;
        case O_RSH: o_p->rsh = optarg; break;
        case O_LAUNCH_AGENT: o_p->launch_agent = optarg; break;
        case 'x':
            if (o_p->nfwd == (int)(sizeof(o_p->fwd) / sizeof(o_p->fwd[0]))) {
                fprintf(stderr, "tutti-run: -x: at most %zu variables\n",
                        sizeof(o_p->fwd) / sizeof(o_p->fwd[0]));
                return 2;
            }
            o_p->fwd[o_p->nfwd++] = optarg;
            break;
        case O_AGENT: o_p->agent = 1; break;
        case O_PLACE: {
            /* this node's (SLURMD_NODENAME) is its ranks' numbers and store */
            static char store[600];
            char node[256];
            int k, first, n;
            const char *me = getenv("SLURMD_NODENAME");
            if (sscanf(optarg, "%255s %d %d %d %599s", node, &k, &first, &n, store) != 5) {
                fprintf(stderr, "tutti-run: --place %s: expected NODE K FIRST N STORE\n", optarg);
                return 2;
            }
            if (me && !strcmp(me, node)) {
                o_p->node_rank = k;
                o_p->rank_offset = first;
                o_p->np = n;
                o_p->store = store;
                o_p->placed = 1;
            }
            break;
        }
        case O_RANK_OFFSET:
            if (tt_cli_int(optarg, 0, INT_MAX, &o_p->rank_offset) < 0) {
                fprintf(stderr, "tutti-run: --rank-offset %s: expected 0 or more\n", optarg);
                return 2;
            }
            break;
        case O_WORLD:
            if (tt_cli_int(optarg, 1, INT_MAX, &o_p->world) < 0) {
                fprintf(stderr, "tutti-run: --world-size %s: expected 1 or more\n", optarg);
                return 2;
            }
            break;
        case 'n':
            /* the mpirun spelling -np N arrives as -n with the argument "p" (left to
             * getopt, so that the program's own arguments are never taken for ours) */
            if (!strcmp(optarg, "p") && !strcmp(argv[optind - 1], "-np")) {
                if (optind >= argc) {
                    fprintf(stderr, "tutti-run: -np needs a rank count\n");
                    return 2;
                }
                optarg = argv[optind++];
            }
            if (tt_cli_int(optarg, 1, TT_LAUNCH_MAX_RANKS, &o_p->np) < 0) {
                fprintf(stderr, "tutti-run: -np %s: expected a rank count 1..%d\n", optarg,
                        TT_LAUNCH_MAX_RANKS);
                return 2;
            }
            break;
        case 'P': /* torchrun's --nproc-per-node N|cpu|auto (no GPUs yet: the CPUs) */
            if (!strcmp(optarg, "cpu") || !strcmp(optarg, "auto")) {
                long n = sysconf(_SC_NPROCESSORS_ONLN);
                o_p->np = n < 1 ? 1 : n > TT_LAUNCH_MAX_RANKS ? TT_LAUNCH_MAX_RANKS : (int)n;
            } else if (tt_cli_int(optarg, 1, TT_LAUNCH_MAX_RANKS, &o_p->np) < 0) {
                fprintf(stderr, "tutti-run: --nproc-per-node %s: expected 1..%d, cpu or auto\n",
                        optarg, TT_LAUNCH_MAX_RANKS);
                return 2;
            }
            break;
        case 'E': { /* torchrun's --rdzv-endpoint HOST[:PORT] (its default port 29400) */
            const char *host_end = strrchr(optarg, ']'); /* [v6]:port */
            if (strstr(optarg, "://"))
                snprintf(endpoint, sizeof(endpoint), "%s", optarg);
            else if (strchr(host_end ? host_end : optarg, ':'))
                snprintf(endpoint, sizeof(endpoint), "tcp://%s", optarg);
            else
                snprintf(endpoint, sizeof(endpoint), "tcp://%s:29400", optarg);
            o_p->store = endpoint;
            break;
        }
        case 'b': /* torchrun's --rdzv-backend: c10d rendezvous (ours), static ranks */
            if (!strcmp(optarg, "c10d") || !strcmp(optarg, "tutti")) {
                c10d = 1;
            } else if (strcmp(optarg, "static")) {
                fprintf(stderr,
                        "tutti-run: --rdzv-backend %s: expected c10d (the elastic "
                        "rendezvous over --store) or static\n",
                        optarg);
                return 2;
            }
            break;
        case 'S': /* torchrun's --standalone: one node, a store of its own (our default) */
            o_p->standalone = 1;
            break;
        case 'A': master_addr = optarg; break;
        case 'O':
            if (tt_cli_int(optarg, 1, 65534, &master_port) < 0) {
                fprintf(stderr, "tutti-run: --master-port %s: expected 1..65534\n", optarg);
                return 2;
            }
            break;
        case O_CONF:
            if (rdzv_conf(optarg, o_p) < 0)
                return 2;
            break;
        case O_MONITOR:
            if (seconds_ms(optarg, 1, &o_p->monitor_ms) < 0) {
                fprintf(stderr, "tutti-run: --monitor-interval %s: expected seconds > 0\n", optarg);
                return 2;
            }
            break;
        case O_ROLE: o_p->role = optarg; break;
        case O_LOG_DIR: o_p->log_dir = optarg; break;
        case O_REDIR: o_p->redirects = optarg; break;
        case O_TEE: o_p->tee = optarg; break;
        case O_LOCAL_ADDR: o_p->local_addr = optarg; break;
        case O_START_METHOD: /* ranks are always exec'ed: each a process of its own */
            if (strcmp(optarg, "spawn") && strcmp(optarg, "fork") && strcmp(optarg, "forkserver")) {
                fprintf(stderr,
                        "tutti-run: --start-method %s: expected spawn, fork or forkserver\n",
                        optarg);
                return 2;
            }
            break;
        case 'm': o_p->module = 1; break;
        case 'X': o_p->no_python = 1; break;
        case 's': o_p->store = optarg; break;
        case 'N':
            o_p->nodes_named = 1;
            if (strchr(optarg, ':')) { /* MIN:MAX */
                char lo[32];
                const char *colon = strchr(optarg, ':');
                snprintf(lo, sizeof(lo), "%.*s", (int)(colon - optarg), optarg);
                if (tt_cli_int(lo, 1, 1 << 20, &o_p->min_nodes) < 0 ||
                    tt_cli_int(colon + 1, 1, 1 << 20, &o_p->nnodes) < 0 ||
                    o_p->min_nodes > o_p->nnodes) {
                    fprintf(stderr, "tutti-run: --nnodes %s: expected MIN:MAX, 1 <= MIN <= MAX\n",
                            optarg);
                    return 2;
                }
                break;
            }
            if (tt_cli_int(optarg, 1, 1 << 20, &o_p->nnodes) < 0) {
                fprintf(stderr, "tutti-run: --nnodes %s: expected a positive count\n", optarg);
                return 2;
            }
            break;
        case 'K':
            o_p->nodes_named = 1;
            if (tt_cli_int(optarg, 0, 1 << 20, &o_p->node_rank) < 0) {
                fprintf(stderr, "tutti-run: --node-rank %s: expected 0 or more\n", optarg);
                return 2;
            }
            break;
        case 't':
            if (tt_cli_int(optarg, 1, 1 << 24, &o_p->timeout_s) < 0) {
                fprintf(stderr, "tutti-run: --timeout %s: expected seconds > 0\n", optarg);
                return 2;
            }
            break;
        case 'R':
            if (tt_cli_int(optarg, 0, 1 << 20, &o_p->max_restarts) < 0) {
                fprintf(stderr, "tutti-run: --max-restarts %s: expected 0 or more\n", optarg);
                return 2;
            }
            break;
        case 'L':
            if (tt_cli_int(optarg, 0, 1 << 24, &o_p->last_call_ms) < 0) {
                fprintf(stderr, "tutti-run: --rdzv-last-call %s: expected milliseconds\n", optarg);
                return 2;
            }
            break;
        case 'D':
            if (tt_cli_int(optarg, 1, 1 << 20, &o_p->rdzv_timeout_s) < 0) {
                fprintf(stderr, "tutti-run: --rdzv-timeout %s: expected seconds > 0\n", optarg);
                return 2;
            }
            break;
        case 'T': o_p->tag = 1; break;
        case 'B': o_p->bind = 1; break;
        case 'J': o_p->job_id = optarg; break;
        case 'h': usage(stdout, argv[0]); return 0;
        default: usage(stderr, argv[0]); return 2;
        }
    }
    /* a Slurm job's allocation, outside a step: a batch script of several nodes, or
     * salloc's shell (on no node of the job: no SLURMD_NODENAME): its nodes are the
     * hosts, started through srun, as mpirun's; not where anything names other nodes,
     * a store, this node alone (--standalone) or an outer launcher's rank */
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    const char *nn = getenv("SLURM_JOB_NUM_NODES");
    int salloc = !getenv("SLURMD_NODENAME");
    if (job && *job && (!step || !*step) && nn && (atoi(nn) > 1 || (atoi(nn) == 1 && salloc)) &&
        !o_p->nhosts && !o_p->nodes_named && !o_p->store && !o_p->agent && !o_p->world &&
        !o_p->standalone && !getenv("TUTTI_RANK") && !getenv("RANK")) {
        if (tt_hosts_slurm("tutti-run", &o_p->hosts, &o_p->nhosts) < 0)
            return 2;
        o_p->slurm = 1;
        if (o_p->min_nodes || o_p->max_restarts || o_p->log_dir || o_p->redirects || o_p->tee) {
            fprintf(stderr,
                    "tutti-run: in %s of Slurm job %s, of %d node(s), the ranks start on "
                    "every node from here (through srun, as -H does): that does not go with "
                    "--max-restarts or the log options (srun --ntasks-per-node 1 tutti-run "
                    "... runs a tutti-run on each node%s)\n",
                    salloc ? "salloc's shell" : "the batch script", job, atoi(nn),
                    salloc ? "" : "; -H localhost keeps the ranks on this one");
            return 2;
        }
    }
    if (o_p->agent && o_p->world && !o_p->placed && o_p->np <= 0) {
        fprintf(stderr, "tutti-run --agent: node %s is not among the --place nodes\n",
                getenv("SLURMD_NODENAME") ? getenv("SLURMD_NODENAME") : "(no SLURMD_NODENAME)");
        return 2;
    }
    if (o_p->np <= 0 && !o_p->nhosts && optind < argc && !o_p->agent) {
        /* a torchrun command line (-m MODULE, a *.py script, --standalone): torchrun's
         * default of one process a node, so that it runs unchanged (README) */
        if (o_p->standalone || runs_python(o_p, argv[optind]))
            o_p->np = 1;
    }
    if ((o_p->np <= 0 && !o_p->nhosts) || optind >= argc) {
        fprintf(stderr, "tutti-run: %s\n",
                optind >= argc ? "no program given" : "-np N is required");
        usage(stderr, argv[0]);
        return 2;
    }
    if (o_p->nhosts && (o_p->min_nodes || o_p->nnodes > 1 || o_p->node_rank || o_p->agent ||
                        o_p->max_restarts || o_p->log_dir || o_p->redirects || o_p->tee)) {
        fprintf(stderr, "tutti-run: -H/--hostfile starts the job on every host from here: it "
                        "does not go with --nnodes, --node-rank, --max-restarts or the log "
                        "options\n");
        return 2;
    }
    if ((o_p->rank_offset >= 0) != (o_p->world > 0) ||
        (o_p->world && (long long)o_p->rank_offset + o_p->np > o_p->world)) {
        fprintf(stderr, "tutti-run: --rank-offset R and --world-size W go together, with R + "
                        "-np <= W\n");
        return 2;
    }
    for (int i = 0; i < o_p->np; i++) {
        int t = stream_spec(o_p->tee, i);
        if (stream_spec(o_p->redirects, i) < 0 || t < 0) {
            fprintf(stderr,
                    "tutti-run: --%s %s: expected 0..3 (1 stdout, 2 stderr, 3 both), or "
                    "LOCAL_RANK:N,... \n",
                    t < 0 ? "tee" : "redirects", t < 0 ? o_p->tee : o_p->redirects);
            return 2;
        }
        o_p->piped |= t != 0;
    }
    o_p->piped |= o_p->tag;
    if (master_addr || master_port) {
        /* torchrun's static rendezvous: torch's store there (the ranks' MASTER_ADDR and
         * MASTER_PORT), and ours, where none is named, on the port after it */
        const char *a = master_addr ? master_addr : "127.0.0.1";
        int port = master_port ? master_port : 29500;
        setenv("MASTER_ADDR", a, 1);
        setenv_int("MASTER_PORT", port);
        if (!o_p->store && o_p->nnodes > 1) {
            snprintf(endpoint, sizeof(endpoint), strchr(a, ':') ? "tcp://[%s]:%d" : "tcp://%s:%d",
                     a, port + 1);
            o_p->store = endpoint;
        }
    }
    if (o_p->standalone && c10d && o_p->nnodes == 1 && !o_p->min_nodes) {
        /* torchrun's --standalone is a c10d rendezvous on localhost:0 of its own: our
         * one-node default, which needs neither */
        c10d = 0;
        if (o_p->store == endpoint)
            o_p->store = NULL;
    }
    if (c10d && !o_p->min_nodes) /* torchrun: --nnodes N with c10d is N:N */
        o_p->min_nodes = o_p->nnodes;
    if (o_p->standalone && (o_p->nnodes > 1 || o_p->store)) {
        fprintf(stderr, "tutti-run: --standalone is one node with a store of its own: it does "
                        "not go with --nnodes > 1 or a store\n");
        return 2;
    }
    o_p->prog = argv + optind;
    /* ... under python3 (from PATH) */
    if (runs_python(o_p, argv[optind])) {
        int n = argc - optind, k = 0;
        char **p = calloc((size_t)n + 3, sizeof(*p));
        if (!p)
            return 1;
        p[k++] = "python3";
        if (o_p->module)
            p[k++] = "-m";
        for (int i = 0; i < n; i++)
            p[k++] = argv[optind + i];
        o_p->prog = o_p->prog_owned = p;
    }
    return -1;
}

/* The store as every node names it alike, whatever its URL's spelling: a tcp:// or
 * redis:// store by its host's first address, port (and what follows: a redis database),
 * a file store by its directory's real path; else the URL. */
static void store_identity(const char *url, char *out, size_t outlen)
{
    char host[256];
    int port = 0;
    snprintf(out, outlen, "%s", url);
    if (!strncmp(url, "file://", 7)) {
        /* the directory may not exist yet (the first node makes it): its parent's */
        char dir[1024], *real = NULL;
        snprintf(dir, sizeof(dir), "%s", url + 7);
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/')
            dir[--n] = '\0';
        char *slash = strrchr(dir, '/');
        if ((real = realpath(dir, NULL)) != NULL) {
            snprintf(out, outlen, "file://%s", real);
        } else if (slash && slash > dir) {
            *slash = '\0';
            if ((real = realpath(dir, NULL)) != NULL)
                snprintf(out, outlen, "file://%s/%s", real, slash + 1);
        }
        free(real);
        return;
    }
    if (tt_store_url_host(url, host, sizeof(host), &port) < 0)
        return;
    const char *scheme_end = strstr(url, "://") + 3;
    const char *rest = strchr(scheme_end, '/'); /* redis: /DB */
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
    char addr[INET6_ADDRSTRLEN] = "";
    if (getaddrinfo(host, NULL, &hints, &ai) == 0 && ai) {
        const struct addrinfo *p = ai; /* an IPv4 one where there is (localhost: ::1 too) */
        while (p->ai_next && p->ai_family != AF_INET)
            p = p->ai_next;
        if (p->ai_family != AF_INET)
            p = ai;
        const void *a = p->ai_family == AF_INET6
                            ? (const void *)&((struct sockaddr_in6 *)p->ai_addr)->sin6_addr
                            : (const void *)&((struct sockaddr_in *)p->ai_addr)->sin_addr;
        inet_ntop(p->ai_family, a, addr, sizeof(addr));
        freeaddrinfo(ai);
    }
    snprintf(out, outlen, "%.*s%s:%d%s", (int)(scheme_end - url), url, addr[0] ? addr : host, port,
             rest && strcmp(rest, "/") && strcmp(rest, "/0") ? rest : "");
}

/* The options that only make sense together; sets TUTTI_JOB_ID. 0, or -1: bad usage. */
static int check_args(const run_opts_t *o)
{
    if ((long long)o->np * o->nnodes > INT_MAX) { /* elastic: nnodes is MAX */
        fprintf(stderr, "tutti-run: -np %d times --nnodes %d is too many ranks\n", o->np,
                o->nnodes);
        return -1;
    }
    if (o->min_nodes) {
        if (!o->store) {
            fprintf(stderr, "tutti-run: --nnodes MIN:MAX needs a --store that every node "
                            "reaches (tcp://HOST:PORT, redis://HOST or file:///DIR on one "
                            "host)\n");
            return -1;
        }
        if (o->node_rank) {
            fprintf(stderr, "tutti-run: --node-rank does not go with --nnodes MIN:MAX (the "
                            "rendezvous numbers the nodes)\n");
            return -1;
        }
        /* the nodes share only their command lines: an id from what started them, else
         * from the store (jobs sharing a store need their own --job-id) */
        char id[64];
        const char *given = o->job_id;
        if (!given && !getenv("TUTTI_JOB_ID") && !tt_launch_outer_job_id(id, sizeof(id))) {
            char where[1200];
            store_identity(o->store, where, sizeof(where));
            uint64_t h = 14695981039346656037ull; /* FNV-1a */
            for (const char *c = where; *c; c++)
                h = (h ^ (unsigned char)*c) * 1099511628211ull;
            snprintf(id, sizeof(id), "tutti-run-elastic-%016llx", (unsigned long long)h);
            given = id;
        }
        return tt_launch_job_id("tutti-run", o->np, given, o->nnodes, o->store);
    }
    if (o->node_rank >= o->nnodes) {
        fprintf(stderr, "tutti-run: --node-rank %d with --nnodes %d: expected 0..%d\n",
                o->node_rank, o->nnodes, o->nnodes - 1);
        return -1;
    }
    if (o->nnodes > 1 && (!o->store || strncmp(o->store, "tcp://", 6))) {
        fprintf(stderr, "tutti-run: several nodes need a tcp:// store that all of them reach "
                        "(--store tcp://HOST:PORT)\n");
        return -1;
    }
    if (tt_launch_job_id("tutti-run", o->np, o->job_id, o->nnodes, o->store) < 0)
        return -1;
    return 0;
}

/* torchrun's --redirects/--tee value for local rank i: "N" for every rank, or
 * "I:N,J:M..." per local rank (the others 0); N: 0 none, 1 stdout, 2 stderr, 3 both.
 * The streams, or -1 when spec is malformed. */
static int stream_spec(const char *spec, int i)
{
    if (!spec)
        return 0;
    if (!strchr(spec, ':')) {
        int v;
        return tt_cli_int(spec, 0, 3, &v) < 0 ? -1 : v;
    }
    int found = 0;
    for (const char *p = spec; *p;) {
        char *e;
        long r = strtol(p, &e, 10);
        if (e == p || *e != ':' || r < 0)
            return -1;
        p = e + 1;
        long v = strtol(p, &e, 10);
        if (e == p || v < 0 || v > 3 || (*e && *e != ','))
            return -1;
        if (r == i)
            found = (int)v;
        p = *e ? e + 1 : e;
    }
    return found;
}

/* Local rank i's output streams (k 0: stdout, 1: stderr), in ends[k]: the fd the rank
 * gets as its own (-1: tutti-run's), the read end of its pipe (-1: none) and the log file
 * that pipe's bytes are copied to (-1: none). --redirects sends a stream to its log
 * file only, --tee to the file and, through the pipe, to ours with the rank's prefix,
 * --tag through the pipe. 0, or -1 (said; nothing left open). */
static int rank_streams(const run_opts_t *o, int i, const char *dir, int ends[2][3])
{
    int redir = stream_spec(o->redirects, i), tee = stream_spec(o->tee, i);
    for (int k = 0; k < 2; k++)
        ends[k][0] = ends[k][1] = ends[k][2] = -1;
    for (int k = 0; k < 2; k++) {
        int bit = 1 << k, file = -1;
        if ((redir | tee) & bit) {
            char path[PATH_MAX + 16];
            snprintf(path, sizeof(path), "%s/%s.log", dir, k ? "stderr" : "stdout");
            file = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (file < 0) {
                fprintf(stderr, "tutti-run: %s: %s\n", path, strerror(errno));
                goto fail;
            }
        }
        if ((redir & bit) && !(tee & bit)) {
            ends[k][0] = file;
            continue;
        }
        if ((tee & bit) || o->tag) {
            /* O_CLOEXEC: later ranks must not hold earlier ranks' pipes open */
            int pp[2];
            if (pipe2(pp, O_CLOEXEC) < 0) {
                fprintf(stderr, "tutti-run: pipe: %s\n", strerror(errno));
                if (file >= 0)
                    close(file);
                goto fail;
            }
            ends[k][0] = pp[1];
            ends[k][1] = pp[0];
            ends[k][2] = file;
        }
    }
    return 0;
fail:
    for (int k = 0; k < 2; k++)
        for (int e = 0; e < 3; e++)
            if (ends[k][e] >= 0)
                close(ends[k][e]);
    return -1;
}

/* Local rank i's directory of an attempt (a round, or a restart): <base>/attempt_<n>/<i>,
 * base the run's log directory, else the launch's temporary one. make: create it. 0, or
 * -1 having said why. */
static int rank_dir(const tt_launch_t *l, const run_opts_t *o, long long attempt, int i, char *dir,
                    size_t len, int make)
{
    const char *base = o->run_dir[0] ? o->run_dir : l->dir;
    if (!base[0]) { /* no directory (tt_launch_start said so): no error files */
        dir[0] = '\0';
        return 0;
    }
    if (snprintf(dir, len, "%s/attempt_%lld", base, attempt) >= (int)len - 16) {
        fprintf(stderr, "tutti-run: %s: too long a path\n", base);
        return -1;
    }
    if (make)
        mkdir(dir, 0755);
    size_t n = strlen(dir);
    snprintf(dir + n, len - n, "/%d", i);
    if (make && mkdir(dir, 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, "tutti-run: %s: %s\n", dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* Start the ranks (with --tag, each with its output pipes in tags). -1 if one failed to
 * start: the ones started are left running for the caller to stop. */
static int spawn_ranks(tt_launch_t *l, const run_opts_t *o, tagger_t *tags, int restart,
                       const tt_rdzv_t *z)
{
    int np = o->np;
    run_rank_t rr = { .rank0 = z          ? z->rank0
                               : o->world ? o->rank_offset
                                          : o->node_rank * np,
                      .np = np,
                      .world = z          ? z->world
                               : o->world ? o->world
                                          : np * o->nnodes,
                      .node = o->node_rank,
                      .nodes = o->nnodes,
                      .restart = restart,
                      .max_restarts = o->max_restarts,
                      .z = z,
                      .job_id = getenv("TUTTI_JOB_ID"),
                      .role = o->role,
                      .store = z ? z->url : o->store,
                      .prog = o->prog };
    /* torch's env:// rendezvous (torchrun sets these): on one node a port free on
     * loopback now; across nodes the store's host and the port after the store's, which
     * every node derives alike; elastic, what the round's first node picked */
    if (z) {
        snprintf(rr.master_addr, sizeof(rr.master_addr), "%s", z->master_addr);
        rr.master_port = z->master_port;
    } else if (o->nnodes > 1) {
        if (tt_store_url_host(o->store, rr.master_addr, sizeof(rr.master_addr), &rr.master_port) ==
            0)
            rr.master_port += rr.master_port < 65535 ? 1 : -1;
    } else if (tt_master_pick(NULL, o->local_addr, rr.master_addr, sizeof(rr.master_addr),
                              &rr.master_port) < 0) {
        fprintf(stderr, "tutti-run: no address and free port for MASTER_ADDR/MASTER_PORT%s%s: %s\n",
                o->local_addr ? " on --local-addr " : "", o->local_addr ? o->local_addr : "",
                strerror(errno));
        return -1;
    }
    for (int i = 0; i < np; i++) {
        int rank = rr.rank0 + i, ends[2][3]; /* per stream: the rank's, ours, the copy's */
        char dir[PATH_MAX];
        /* torchrun's layout: <run dir>/attempt_<n>/<local rank>/{stdout,stderr}.log and
         * error.json; without --log-dir, in the launch's temporary directory */
        if (rank_dir(l, o, z ? z->round : restart, i, dir, sizeof(dir), 1) < 0)
            return -1;
        rr.error_file[0] = '\0';
        if (dir[0])
            snprintf(rr.error_file, sizeof(rr.error_file), "%s/error.json", dir);
        if (rank_streams(o, i, dir, ends) < 0)
            return -1;
        rr.out = ends[0][0];
        rr.err = ends[1][0];
        int spawned = tt_launch_spawn(l, i, run_rank, &rr);
        for (int k = 0; k < 2; k++) {
            if (ends[k][0] >= 0)
                close(ends[k][0]);
            if (spawned < 0) {
                if (ends[k][1] >= 0)
                    close(ends[k][1]);
                if (ends[k][2] >= 0)
                    close(ends[k][2]);
            } else if (o->piped) {
                tags[2 * i + k] = (tagger_t){
                    .fd = ends[k][1], .copy = ends[k][2], .rank = rank, .out = k ? stderr : stdout
                };
            }
        }
        if (spawned < 0)
            return -1;
    }
    return 0;
}

/* The ranks of this node that failed in an attempt, as torchrun reports them: those
 * found failed before the others were stopped, in the order they were reaped. */
typedef struct run_failure {
    int rank, local;
    int exitcode; /* torch's: the exit status, or minus the signal */
    pid_t pid;
    long long at; /* when it was reaped, seconds since the epoch */
} run_failure_t;

typedef struct run_failures {
    run_failure_t *f; /* np of them */
    int n;
    long long attempt; /* the round, or the restart */
} run_failures_t;

/* The entry point's name for the summary's title, as torchrun's: for a Python rank the
 * first argument that is not an option (the script, or -m's module), else the program,
 * as given. */
static const char *entry_name(char **prog)
{
    const char *b = strrchr(prog[0], '/') ? strrchr(prog[0], '/') + 1 : prog[0];
    if (strncmp(b, "python", 6) != 0)
        return prog[0];
    for (int k = 1; prog[k]; k++)
        if (prog[k][0] != '-')
            return prog[k];
    return "";
}

/* torchrun's summary of this node's failed ranks (ChildFailedError's), on stderr: each
 * with its error file's traceback where the rank left one (errfile.h), the first by
 * timestamp as the root cause; and the root cause passed on to tutti-run's own
 * TORCHELASTIC_ERROR_FILE where it has one. */
static void report_failures(const tt_launch_t *l, const run_opts_t *o, const run_failures_t *fs,
                            int status)
{
    if (fs->n == 0)
        return;
    char host[256] = "?";
    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    char **text = calloc((size_t)fs->n, sizeof(*text)), *plain = NULL;
    char(*files)[PATH_MAX + 16] = calloc((size_t)fs->n, sizeof(*files));
    long long *stamp = calloc((size_t)fs->n, sizeof(*stamp));
    if (!text || !files || !stamp) {
        fprintf(stderr, "tutti-run: out of memory for the failure summary\n");
        goto out;
    }
    int root = 0, root_has_file;
    plain = calloc((size_t)fs->n, 1); /* text[k] is shown as it is */
    if (!plain) {
        fprintf(stderr, "tutti-run: out of memory for the failure summary\n");
        goto out;
    }
    for (int k = 0; k < fs->n; k++) {
        const run_failure_t *f = &fs->f[k];
        char dir[PATH_MAX], why[128];
        tt_errfile_t ef;
        stamp[k] = f->at;
        snprintf(files[k], sizeof(files[k]), "<N/A>");
        if (rank_dir(l, o, fs->attempt, f->local, dir, sizeof(dir), 0) == 0 && dir[0]) {
            char path[PATH_MAX + 16];
            snprintf(path, sizeof(path), "%s/error.json", dir);
            int r = tt_errfile_read(path, &ef, why, sizeof(why));
            if (r > 0) {
                text[k] = ef.message;
                plain[k] = (char)ef.plain;
                if (ef.timestamp)
                    stamp[k] = ef.timestamp;
                snprintf(files[k], sizeof(files[k]), "%s", path);
                if (ef.plain && !ef.message[0]) { /* torch's: an empty one says nothing */
                    free(text[k]);
                    text[k] = NULL;
                }
            } else if (r < 0) {
                size_t m = strlen(path) + strlen(why) + 64;
                if ((text[k] = malloc(m)) != NULL)
                    snprintf(text[k], m, "(%s is not torch's error file: %s)", path, why);
                plain[k] = 1;
            }
        }
        if (!text[k]) {
            plain[k] = 1;
            size_t m = 160;
            if ((text[k] = malloc(m)) == NULL)
                continue;
            if (f->exitcode < 0)
                snprintf(text[k], m, "Signal %d (SIG%s) received by PID %d", -f->exitcode,
                         sigabbrev_np(-f->exitcode) ? sigabbrev_np(-f->exitcode) : "?",
                         (int)f->pid);
            else
                snprintf(text[k], m,
                         "To enable traceback see: "
                         "https://pytorch.org/docs/stable/elastic/errors.html");
        }
        if (stamp[k] < stamp[root])
            root = k;
    }
    /* torchrun's block: each failure formatted, a traceback's lines indented under its
     * first; the rules as wide as the longest line, at most 60 */
    char title[300];
    snprintf(title, sizeof(title), "%s FAILED", entry_name(o->prog));
    size_t width = strlen(title);
    const char *temp = o->run_dir[0] ? "" : " (removed at exit; --log-dir DIR keeps it)";
    for (int k = 0; k < fs->n; k++) {
        const run_failure_t *f = &fs->f[k];
        time_t t = (time_t)stamp[k];
        struct tm tm;
        char when[64] = "?";
        if (localtime_r(&t, &tm))
            strftime(when, sizeof(when), "%Y-%m-%d_%H:%M:%S", &tm);
        char *buf = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&buf, &len);
        if (!m)
            continue;
        fprintf(m,
                "[%d]:\n  time      : %s\n  host      : %s\n  rank      : %d (local_rank: "
                "%d)\n  exitcode  : %d (pid: %d)\n  error_file: %s%s\n  traceback : ",
                k, when, host, f->rank, f->local, f->exitcode, (int)f->pid, files[k],
                strcmp(files[k], "<N/A>") ? temp : "");
        /* a traceback's lines indented as torch's (its last "\n" too), a string as it is */
        for (const char *c = text[k] ? text[k] : "<N/A>"; *c; c++) {
            fputc(*c, m);
            if (*c == '\n' && !plain[k])
                fputs("  ", m);
        }
        fclose(m);
        for (const char *line = buf; line && *line;) {
            const char *nl = strchr(line, '\n');
            size_t n = nl ? (size_t)(nl - line) : strlen(line);
            width = n > width ? n : width;
            line = nl ? nl + 1 : line + n;
        }
        free(text[k]);
        text[k] = buf; /* the formatted failure from here on */
    }
    width = width > 60 ? 60 : width;
    char border[61], section[61];
    memset(border, '=', width);
    memset(section, '-', width);
    border[width] = section[width] = '\0';
    fprintf(stderr, "\n%s\n%s\n%s\nFailures:\n", border, title, section);
    if (fs->n == 1)
        fprintf(stderr, "  <NO_OTHER_FAILURES>\n");
    for (int k = 0; k < fs->n; k++)
        if (k != root)
            fprintf(stderr, "%s\n", text[k] ? text[k] : "?");
    fprintf(stderr, "%s\nRoot Cause (first observed failure):\n%s\n%s\n", section,
            text[root] ? text[root] : "?", border);
    root_has_file = strcmp(files[root], "<N/A>") != 0;
    /* torchrun's @record on its main: the root cause for whatever started tutti-run */
    const char *mine = getenv("TORCHELASTIC_ERROR_FILE");
    if (mine && *mine) {
        int code = fs->f[root].exitcode ? fs->f[root].exitcode : status;
        int r = root_has_file ? tt_errfile_pass_on(files[root], code, mine) : -1;
        if (r < 0) {
            size_t m = strlen(title) + (text[root] ? strlen(text[root]) : 0) + 64;
            char *msg = malloc(m);
            if (msg) {
                snprintf(msg, m, "ChildFailedError: %s\nRoot Cause (first observed failure):\n%s",
                         title, text[root] ? text[root] : "?");
                r = tt_errfile_write(mine, msg, code);
                free(msg);
            }
        }
        if (r < 0)
            fprintf(stderr, "tutti-run: TORCHELASTIC_ERROR_FILE %s: %s\n", mine, strerror(errno));
    }
out:
    for (int k = 0; text && k < fs->n; k++)
        free(text[k]);
    free(text);
    free(plain);
    free(files);
    free(stamp);
}

static int g_agent_in = -1; /* an agent's stdin from the launch (non-blocking), or -1 */

/* An agent: whether its stdin has ended (then it takes it as SIGHUP). No thread watches
 * it: the ranks are forked from here, and a thread's locks would go with them. */
static void agent_look(void)
{
    char buf[256];
    ssize_t r;
    if (g_agent_in < 0)
        return;
    while ((r = read(g_agent_in, buf, sizeof(buf))) > 0)
        ;
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        close(g_agent_in);
        g_agent_in = -1;
        kill(getpid(), SIGHUP);
    }
}

/* Wait for every rank, forwarding --tag output; the first failure, a signal to us or
 * the deadline (0: none) stops the rest. Returns the exit status (status so far in);
 * *rank_failed_p: a rank's failure stopped them (not a signal or the deadline). */
static int supervise(tt_launch_t *l, const run_opts_t *o, tagger_t *tags, struct pollfd *pf,
                     double deadline, int status, int *rank_failed_p, tt_rdzv_t *z, int *ended_p,
                     char *why, size_t whylen, run_failures_t *fails)
{
    fails->n = 0;
    int first_failed = -1, rank0 = z ? z->rank0 : o->world ? o->rank_offset : o->node_rank * o->np;
    int store_failed = 0; /* elastic: the poll failed; acted on after one more reap */
    double next_poll = 0;
    *rank_failed_p = 0;
    if (ended_p)
        *ended_p = 0;
    while (l->running > 0) {
        if (!o->piped || !tag_poll(tags, pf, 2 * o->np, 50, tt_launch_exit_fd(l)))
            tt_launch_nap(l, 20);
        agent_look();
        int e = 0;
        if (z && tt_launch_stopping(l) && tt_rdzv_beat(z) < 0)
            e = -1; /* still alive while the ranks stop (up to the grace period) */
        int i, code, sig;
        while ((i = tt_launch_reap(l, &code, &sig)) >= 0) {
            /* a rank that died as tutti-run was told to stop (Ctrl-C reaches the
             * terminal's whole group) did not fail */
            if (code == 0 || tt_launch_signal_received())
                continue;
            /* the failures torchrun would list, which it finds at its poll (every 5 s by
             * default): here also those that, after a rank's failure, end on their own
             * while they are being stopped, not by the SIGTERM or SIGKILL sent (nor a
             * shell's status for them) */
            int own = sig ? sig != SIGTERM && sig != SIGKILL
                          : code != 128 + SIGTERM && code != 128 + SIGKILL;
            if (!tt_launch_stopping(l) || (first_failed >= 0 && own))
                fails->f[fails->n++] = (run_failure_t){ .rank = rank0 + i,
                                                        .local = i,
                                                        .exitcode = sig ? -sig : code,
                                                        .pid = l->pids[i],
                                                        .at = (long long)time(NULL) };
            if (first_failed >= 0 || tt_launch_stopping(l))
                continue;
            first_failed = rank0 + i;
            status = code;
            *rank_failed_p = 1;
            if (!sig)
                fprintf(stderr,
                        "tutti-run: rank %d exited with status %d; stopping the "
                        "other %d rank(s)\n",
                        first_failed, code, l->running);
            else
                fprintf(stderr,
                        "tutti-run: rank %d was killed by signal %d (%s); "
                        "stopping the other %d rank(s)\n",
                        first_failed, sig, strsignal(sig), l->running);
            if (z && !e && !store_failed) {
                /* elastic: the failure ends the round now, before the ranks stop (up to
                 * the grace period), so that no other reason (this node seen gone, a
                 * spare waiting) stands in its place and escapes the count; the ranks
                 * are reaped before the round is looked at for the same reason */
                char reason[160];
                snprintf(reason, sizeof(reason), "failure: node %d: a rank exited with status %d",
                         z->idx, code);
                /* unless another node ended it first: one leaving takes its ranks
                 * (and so this rank's peers) down before it can say so */
                e = tt_rdzv_failure_grace(z, why, whylen);
                if (!e)
                    e = tt_rdzv_end_round(z, reason, why, whylen) < 0 ? -1 : 1;
            }
        }
        /* elastic: another node failed, left or is gone, or one waits to join. A failed
         * look is acted on one turn later, so that a rank that failed while the store
         * was slow to answer still counts as this node's failure, with its status */
        if (!e && z && store_failed && !tt_launch_stopping(l)) {
            e = -1;
        } else if (!e && z && !tt_launch_stopping(l) && first_failed < 0 && now_ms() >= next_poll) {
            /* at least every keep-alive interval: the poll beats */
            next_poll = now_ms() +
                        (z->monitor_ms < z->keep_alive_ms ? z->monitor_ms : z->keep_alive_ms);
            e = tt_rdzv_poll(z, why, whylen);
            if (e < 0)
                store_failed = 1, e = 0;
        }
        if (e) {
            *ended_p = e;
            if (e < 0 && !status)
                status = 1;
            if (e > 0 && first_failed >= 0)
                *rank_failed_p = 1;
            if (!tt_launch_stopping(l)) {
                fprintf(stderr, "tutti-run: elastic round %lld ended (%s): stopping %d rank(s)\n",
                        (long long)z->round, e < 0 ? "the store failed" : why, l->running);
                tt_launch_stop(l);
            }
        }
        int got = tt_launch_signal_received();
        if (!tt_launch_stopping(l) &&
            (first_failed >= 0 || got || (deadline && now_ms() > deadline))) {
            if (first_failed < 0 && got) {
                status = 128 + got;
                fprintf(stderr, "tutti-run: %s: stopping %d rank(s)\n", strsignal(got), l->running);
            } else if (first_failed < 0) {
                status = 124;
                fprintf(stderr, "tutti-run: --timeout %d s passed: stopping %d rank(s)\n",
                        o->timeout_s, l->running);
            }
            if (z && first_failed < 0 && (!ended_p || !*ended_p)) {
                /* elastic: say this node leaves before its ranks stop, so that the
                 * others' ranks, which fail with them, do not count as a failure */
                char reason[128];
                snprintf(reason, sizeof(reason), "scale: node %d left (%s)", z->idx,
                         got ? strsignal(got) : "--timeout");
                if (tt_rdzv_end_round(z, reason, why, whylen) < 0)
                    status = status ? status : 1;
            }
            if (first_failed >= 0 && !got) /* (the others' flight records first) */
                tt_launch_stop_failed(l);
            else
                tt_launch_stop(l);
        }
        tt_launch_tick(l);
    }
    return status;
}

/* --tag: forward what the ranks' leftover processes still write, for up to DRAIN_MS. */
static void tag_drain(tagger_t *tags, struct pollfd *pf, int n)
{
    double left, drain_end = now_ms() + DRAIN_MS;
    while ((left = drain_end - now_ms()) > 0 && tag_poll(tags, pf, n, (int)left + 1, -1))
        ;
    for (int k = 0; k < n; k++)
        if (tags[k].fd >= 0)
            tag_close(&tags[k]);
}

/* The elastic agent's stop (rdzv.h): a signal to tutti-run, or --timeout passed. */
static int agent_stop(void *ctx)
{
    double deadline = *(const double *)ctx;
    int got = tt_launch_signal_received();
    if (got)
        return 128 + got;
    return deadline && now_ms() > deadline ? 124 : 0;
}

/* --nnodes MIN:MAX: rounds of the rendezvous (rdzv.h) until one runs through, the
 * restarts are used up, or the job is over. Returns the exit status. */
static int run_elastic(tt_launch_t *l, const run_opts_t *o, tagger_t *tags, struct pollfd *pf,
                       double deadline, run_failures_t *fails)
{
    tt_rdzv_t z = { .min_nodes = o->min_nodes,
                    .max_nodes = o->nnodes,
                    .np = o->np,
                    .last_call_ms = o->last_call_ms,
                    .timeout_ms = o->rdzv_timeout_s * 1000,
                    .keep_alive_ms = o->keep_alive_ms,
                    .keep_alive_max = o->keep_alive_max,
                    .read_timeout_ms = o->read_timeout_ms,
                    .monitor_ms = o->monitor_ms,
                    /* SIGTERM to SIGKILL, and a second to reap and come back */
                    .stop_grace_ms = TT_LAUNCH_GRACE_MS + 1000,
                    .max_restarts = o->max_restarts,
                    .stop = agent_stop,
                    .stop_ctx = &deadline };
    const char *job = getenv("TUTTI_JOB_ID");
    int st = tt_rdzv_open(&z, "tutti-run", o->store, job, o->host_ok);
    if (st) {
        if (st == TT_RDZV_STOPPED)
            fprintf(stderr, "tutti-run: elastic: stopped while opening the store\n");
        return st == TT_RDZV_STOPPED ? z.stop_status : 1;
    }
    int status = 0;
    char why[512];
    for (;;) {
        int j = tt_rdzv_join(&z, o->local_addr, why, sizeof(why));
        if (j == TT_RDZV_STOPPED) {
            fprintf(stderr, "tutti-run: elastic: %s\n", why);
            status = z.stop_status;
            break;
        }
        if (j == TT_RDZV_FINISHED) {
            int gave = !strncmp(why, "the job gave up", 15);
            if (!z.rounds && !z.waited) {
                /* a store keeps a job's keys (file, redis, a tutti-store server): a node
                 * that comes after the end is a new job under the old one's id */
                fprintf(stderr,
                        "tutti-run: elastic: job %s: %s before this node came; a new job on "
                        "this store needs its own --job-id\n",
                        job, why);
                status = 1;
            } else {
                fprintf(stderr, "tutti-run: elastic: %s%s\n", why,
                        z.rounds ? "" : " while this node waited to join: nothing to run");
                status = gave;
            }
            break;
        }
        if (j < 0) {
            fprintf(stderr, "tutti-run: elastic rendezvous failed%s%s\n", why[0] ? ": " : "", why);
            status = status ? status : 1;
            break;
        }
        fprintf(stderr,
                "tutti-run: elastic round %lld: node %d of %d, ranks %d..%d of %d (restarts "
                "%lld of %d)\n",
                (long long)z.round, z.idx, z.nodes, z.rank0, z.rank0 + o->np - 1, z.world,
                (long long)z.failures, o->max_restarts);
        int rank_failed = 0, ended = 0;
        status = 0;
        if (spawn_ranks(l, o, tags, (int)z.failures, &z) < 0) {
            status = 1;
            tt_launch_stop(l);
        }
        fails->attempt = z.round;
        status = supervise(l, o, tags, pf, deadline, status, &rank_failed, &z, &ended, why,
                           sizeof(why), fails);
        if (o->piped)
            tag_drain(tags, pf, 2 * o->np);
        int got = tt_launch_signal_received();
        if (ended < 0)
            break;
        if (!rank_failed && !ended && !status) {
            int d = tt_rdzv_done(&z, why, sizeof(why));
            if (d == 0)
                break; /* every node's ranks passed */
            if (d == TT_RDZV_STOPPED) {
                fprintf(stderr, "tutti-run: elastic: %s\n", why);
                status = z.stop_status;
                break;
            }
            if (d < 0) {
                status = 1;
                break;
            }
            ended = 1;
            fprintf(stderr,
                    "tutti-run: elastic round %lld ended (%s) after this node's ranks passed: "
                    "joining the next\n",
                    (long long)z.round, why);
        }
        if (!ended) { /* this node's failure, a signal or the deadline */
            char reason[256];
            if (!rank_failed && (got || status == 124)) /* supervise said this node leaves */
                break;
            if (rank_failed)
                snprintf(reason, sizeof(reason), "failure: node %d: a rank exited with status %d",
                         z.idx, status);
            else
                snprintf(reason, sizeof(reason), "failure: node %d could not start its ranks",
                         z.idx);
            if (tt_rdzv_end_round(&z, reason, why, sizeof(why)) < 0 || !rank_failed || got)
                break;
            fprintf(stderr, "tutti-run: elastic round %lld ended (%s)\n", (long long)z.round, why);
        }
        if (status == 0)
            status = 1; /* stopped because of another node */
        if (got)        /* told to stop while its ranks stopped for the round's end */
            status = 128 + got;
        /* one count for the job: every agent of the round reads the same (the round's
         * end marked the job given up then) */
        if (!strncmp(why, "failure", 7) && z.failures + 1 > o->max_restarts) {
            fprintf(stderr, "tutti-run: elastic: round %lld: %s; --max-restarts %d used up\n",
                    (long long)z.round, why, o->max_restarts);
            if (rank_failed)
                report_failures(l, o, fails, status);
            break;
        }
        if (got || tt_launch_signal_received()) {
            if (!got)
                status = 128 + tt_launch_signal_received();
            fprintf(stderr, "tutti-run: elastic: %s: leaving\n", strsignal(status - 128));
            break;
        }
        if (tt_launch_restart(l) < 0)
            break;
        for (int k = 0; k < 2 * o->np && o->piped; k++)
            tags[k] = (tagger_t){ .fd = -1, .copy = -1 };
    }
    tt_rdzv_close(&z);
    return status;
}

/* ---- -H / --hostfile: the job on several hosts from here ---- */

/* What a host runs: an agent (tutti-run --agent) for its ranks; through rsh unless the
 * host is this one. */
typedef struct host_cmd {
    char **argv; /* the agent's command line (env VAR=VALUE ... AGENT ...) */
    const char *host;
    int local;
    char **rsh; /* the remote shell's words */
    int direct; /* srun: rsh, then argv as it is (its first words srun's own), no shell */
    int group;  /* direct: the agents of this many nodes, one task each (host: them all) */
    int in;     /* the read end of the pipe that is its stdin */
    int first, nranks;
    char **exec, *line; /* what its child execs (host_exec) */
} host_cmd_t;

/* In the child: nothing but dup2 and exec (this process has the store's thread: no
 * malloc between fork and exec). */
static void run_host(void *arg, int i)
{
    host_cmd_t *h = &((host_cmd_t *)arg)[i];
    if (dup2(h->in, 0) < 0)
        _exit(127);
    execvp(h->exec[0], h->exec);
    fprintf(stderr, "tutti-run: %s: cannot run %s: %s\n", h->host, h->exec[0], strerror(errno));
    _exit(127);
}

/* What the child execs: the agent's command line here, or through the remote shell
 * (ssh HOST 'COMMAND': the remote shell parses the one line, as mpirun's rsh agent), or
 * through srun (srun ... --nodelist=NODES COMMAND...: its words as they are, the nodes'
 * among them). 0 or -1 (out of memory). */
static int host_exec(host_cmd_t *h)
{
    if (h->local) {
        h->exec = h->argv;
        return 0;
    }
    int n = 0, na = 0;
    while (h->rsh[n])
        n++;
    while (h->argv[na])
        na++;
    h->line = h->direct ? NULL : tt_shell_join(h->argv);
    h->exec = calloc((size_t)n + (size_t)na + 3, sizeof(*h->exec));
    if ((!h->direct && !h->line) || !h->exec)
        return -1;
    memcpy(h->exec, h->rsh, (size_t)n * sizeof(*h->exec));
    if (h->direct) { /* srun's words name the nodes (argv's first) */
        memcpy(h->exec + n, h->argv, (size_t)na * sizeof(*h->exec));
        return 0;
    }
    h->exec[n] = (char *)h->host;
    h->exec[n + 1] = h->line;
    return 0;
}

/* Splits s at spaces into a NULL-terminated array (strings in s, changed). */
static char **split_words(char *s)
{
    size_t n = 0, cap = 8;
    char **w = malloc(cap * sizeof(*w));
    for (char *tok = strtok(s, " \t"); w && tok; tok = strtok(NULL, " \t")) {
        if (n + 2 > cap) {
            char **nw = realloc(w, (cap *= 2) * sizeof(*w));
            if (!nw) {
                free(w);
                return NULL;
            }
            w = nw;
        }
        w[n++] = tok;
    }
    if (w)
        w[n] = NULL;
    return w;
}

/* env[*n] = "NAME=VALUE" (value NULL: name as it is), malloc'd. 0 or -1. */
static int env_add(char **env, int *n, const char *name, const char *value)
{
    size_t len = strlen(name) + (value ? strlen(value) + 1 : 0) + 1;
    char *e = malloc(len);
    if (!e)
        return -1;
    snprintf(e, len, value ? "%s=%s" : "%s", name, value);
    env[(*n)++] = e;
    return 0;
}

/* This host's address on its route to host (no packet is sent), into addr. 0 or -1. */
static int route_addr(const char *host, char *addr, size_t len)
{
    char probe[300];
    int port;
    snprintf(probe, sizeof(probe), strchr(host, ':') ? "tcp://[%s]:1" : "tcp://%s:1", host);
    return tt_master_pick(probe, NULL, addr, len, &port);
}

/* The start of an agent's command line, from argv[a]: its environment (env VAR=VALUE
 * ...), the agent and what every agent gets alike (nodes, world: the counts, as words).
 * Returns the count of words. */
static int agent_head(char **argv, int a, char **env, int nenv, const char *agent, char *nodes,
                      char *world)
{
    argv[a++] = "env";
    for (int e = 0; e < nenv; e++)
        argv[a++] = env[e];
    argv[a++] = (char *)agent;
    argv[a++] = "--agent";
    argv[a++] = "--nnodes";
    argv[a++] = nodes;
    argv[a++] = "--world-size";
    argv[a++] = world;
    return a;
}

/* The end of an agent's command line, from argv[a]: the options every agent gets as
 * this launch got them (num: room for a number), then -- and the program. Returns the
 * count of words. */
static int agent_tail(const run_opts_t *o, char **argv, int a, char num[512])
{
    if (o->tag)
        argv[a++] = "--tag";
    if (o->role) {
        argv[a++] = "--role";
        argv[a++] = (char *)o->role;
    }
    if (o->bind)
        argv[a++] = "--bind";
    if (o->timeout_s) {
        argv[a++] = "--timeout";
        snprintf(num, 512, "%d", o->timeout_s);
        argv[a++] = num;
    }
    argv[a++] = "--";
    for (int p = 0; o->prog[p]; p++)
        argv[a++] = o->prog[p];
    return a;
}

/* The job's ranks on o->hosts: a store here (tcp, every interface, with a fresh job
 * secret) unless --store names one; on each host an agent for its ranks, started through
 * rsh (ssh) unless the host is this one, with its share of the ranks, the store and the
 * job id on its command line and the secret on its stdin, which stays open while this
 * launch lives (an agent stops its ranks when it closes: ssh's connection gone). The
 * first agent that fails stops the others. Returns the exit status. */
static int run_hosts(run_opts_t *o)
{
    int np = o->np, nodes = 0, status = 0;
    if (tt_hosts_place("tutti-run", o->hosts, o->nhosts, &np) < 0) {
        if (o->slurm)
            fprintf(stderr,
                    "tutti-run: (the Slurm job's nodes and slots: SLURM_JOB_NODELIST=%.200s, "
                    "SLURM_TASKS_PER_NODE=%.200s; sbatch or salloc -n or --ntasks-per-node gives "
                    "more)\n",
                    getenv("SLURM_JOB_NODELIST") ? getenv("SLURM_JOB_NODELIST")
                    : getenv("SLURM_NODELIST")   ? getenv("SLURM_NODELIST")
                                                 : "",
                    getenv("SLURM_TASKS_PER_NODE"));
        return 2;
    }
    for (int i = 0; i < o->nhosts; i++)
        nodes += o->hosts[i].nranks > 0;
    if (tt_launch_job_id("tutti-run", np, o->job_id, 1, NULL) < 0)
        return 2;
    const char *job = getenv("TUTTI_JOB_ID");
    /* the job secret (the library takes up to 4096 bytes) */
    static char token[4097];
    char me[PATH_MAX] = "";
    token[0] = '\0';
    tutti_store_t *server = NULL;
    int port = 0;
    if (!o->store) {
        unsigned char rnd[24];
        int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        ssize_t got = fd >= 0 ? read(fd, rnd, sizeof(rnd)) : -1;
        if (fd >= 0)
            close(fd);
        if (got != (ssize_t)sizeof(rnd)) {
            fprintf(stderr, "tutti-run: no random bytes for the job secret\n");
            return 1;
        }
        for (size_t k = 0; k < sizeof(rnd); k++)
            snprintf(token + 2 * k, 3, "%02x", rnd[k]);
        tutti_store_opts_t so;
        tutti_store_opts_init(&so);
        so.is_server = 1;
        so.auth_token = token;
        /* "::" is dual-stack (store_server.c): hosts reached by IPv6 or IPv4 both reach
         * it; 0.0.0.0 where this host has no IPv6 */
        if (tutti_store_open(&server, "tcp://[::]:0", &so) < 0 &&
            tutti_store_open(&server, "tcp://0.0.0.0:0", &so) < 0) {
            fprintf(stderr, "tutti-run: cannot serve the job's store: %s\n",
                    tutti_store_last_error(NULL));
            return 1;
        }
        port = tutti_store_port(server);
    } else if (getenv("TUTTI_AUTH_TOKEN")) {
        if (!*getenv("TUTTI_AUTH_TOKEN")) {
            /* the agents would take it for none: the other hosts' ranks unauthenticated */
            fprintf(stderr, "tutti-run: TUTTI_AUTH_TOKEN is set but empty: give the job "
                            "secret, or unset it for none\n");
            return 2;
        }
        if (strlen(getenv("TUTTI_AUTH_TOKEN")) >= sizeof(token)) {
            fprintf(stderr, "tutti-run: TUTTI_AUTH_TOKEN is longer than %zu bytes\n",
                    sizeof(token) - 1);
            return 2;
        }
        snprintf(token, sizeof(token), "%s", getenv("TUTTI_AUTH_TOKEN"));
    }
    const char *agent = o->launch_agent;
    if (!agent) {
        ssize_t n = readlink("/proc/self/exe", me, sizeof(me) - 1);
        me[n > 0 ? n : 0] = '\0';
        agent = n > 0 ? me : "tutti-run";
    }
    char rsh_buf[1024];
    /* a Slurm allocation's nodes: one step of a task on each, as Open MPI's daemons (no
     * binding: the agent's ranks take the node's CPUs; --overlap: beside a step already
     * there, a monitor's, which would otherwise hold it back without a word; no PMI:
     * they are not MPI's; the launch's environment), unless --rsh or TUTTI_RSH says how */
    const char *rsh_cmd = o->rsh                ? o->rsh
                          : getenv("TUTTI_RSH") ? getenv("TUTTI_RSH")
                          : o->slurm ? "srun --ntasks-per-node=1 --overlap --cpu-bind=none "
                                       "--mpi=none --kill-on-bad-exit=1 --export=ALL --quiet"
                                     : "ssh -o BatchMode=yes";
    int direct = o->slurm && !o->rsh && !getenv("TUTTI_RSH");
    snprintf(rsh_buf, sizeof(rsh_buf), "%s", rsh_cmd);
    char **rsh = split_words(rsh_buf);
    host_cmd_t *cmds = calloc((size_t)nodes, sizeof(*cmds));
    int *wfd = calloc((size_t)nodes, sizeof(*wfd));
    char(*strs)[512] = calloc((size_t)nodes * 8, sizeof(*strs)); /* an agent's numbers */
    /* through srun: one step of every other node's agent, each finding its numbers and
     * store among the --place words by its SLURMD_NODENAME (Open MPI's daemons' one
     * srun); places: those words, nodelist: srun's --nodelist=... */
    char(*places)[1024] = direct ? calloc((size_t)nodes, sizeof(*places)) : NULL;
    size_t listlen = 32;
    for (int i = 0; direct && i < o->nhosts; i++)
        listlen += strlen(o->hosts[i].name) + 1;
    char *nodelist = direct ? calloc(listlen, 1) : NULL;
    int ncmd = 0, ngroup = 0;
    int nprog = 0;
    while (o->prog[nprog])
        nprog++;
    tt_launch_t l;
    int started = 0, nenv = 0;
    /* what every agent's env gets: VAR=VALUE, -x's included */
    char **env = calloc((size_t)o->nfwd + 16, sizeof(*env)); /* (10 of ours at most) */
    for (int k = 0; wfd && k < nodes; k++)
        wfd[k] = -1;
    if (!rsh || !rsh[0] || !cmds || !wfd || !strs || !env || (direct && (!places || !nodelist))) {
        fprintf(stderr, "tutti-run: out of memory, or --rsh is empty\n");
        status = 1;
        goto out;
    }
    /* the ranks' MASTER_ADDR (torch's env://): the first host, as the others reach it;
     * where that is this host, its address toward the first other one */
    char master[256] = "127.0.0.1", addr[256];
    for (int i = 0, first = -1; i < o->nhosts; i++) {
        if (!o->hosts[i].nranks)
            continue;
        int local = o->hosts[i].local;
        if (first < 0 && !local) {
            snprintf(master, sizeof(master), "%s", tt_host_addr(&o->hosts[i]));
            break;
        }
        if (first >= 0 && !local) {
            if (route_addr(tt_host_addr(&o->hosts[i]), addr, sizeof(addr)) == 0)
                snprintf(master, sizeof(master), "%s", addr);
            break;
        }
        first = i;
    }
    if (env_add(env, &nenv, "TUTTI_JOB_ID", job) < 0 ||
        env_add(env, &nenv, "MASTER_ADDR", getenv("MASTER_ADDR") ? getenv("MASTER_ADDR") : master) <
            0 ||
        env_add(env, &nenv, "MASTER_PORT",
                getenv("MASTER_PORT") ? getenv("MASTER_PORT") : "29500") < 0 ||
        (server && env_add(env, &nenv, "TUTTI_STORE_SERVER", "0") < 0)) /* served here */
        goto oom;
    /* --store's: what the user set for it reaches every host alike */
    static const char *const pass[] = { "TUTTI_STORE_SERVER", "TUTTI_AUTH_TOKEN_FILE" };
    for (size_t v = 0; !server && v < sizeof(pass) / sizeof(pass[0]); v++)
        if (getenv(pass[v]) && env_add(env, &nenv, pass[v], getenv(pass[v])) < 0)
            goto oom;
    /* TLS on the links: every host's ranks as this one's (the files at the same paths
     * there, as with TUTTI_AUTH_TOKEN_FILE); a host without would fail the job naming
     * both ranks */
    static const char *const tls[] = { "TUTTI_TLS_CERT", "TUTTI_TLS_KEY", "TUTTI_TLS_CA_FILE",
                                       "TUTTI_TLS_CA_PATH" };
    for (size_t v = 0; v < sizeof(tls) / sizeof(tls[0]); v++)
        if (getenv(tls[v]) && env_add(env, &nenv, tls[v], getenv(tls[v])) < 0)
            goto oom;
    for (int f = 0; f < o->nfwd; f++) { /* -x VAR=VALUE as given, -x VAR from here if set */
        const char *v = strchr(o->fwd[f], '=') ? NULL : getenv(o->fwd[f]);
        if ((v || strchr(o->fwd[f], '=')) && env_add(env, &nenv, o->fwd[f], v) < 0)
            goto oom;
    }
    char nodes_s[16], world_s[16]; /* every agent's --nnodes and --world-size */
    snprintf(nodes_s, sizeof(nodes_s), "%d", nodes);
    snprintf(world_s, sizeof(world_s), "%d", np);
    int k = 0, group_ranks = 0;
    for (int i = 0; i < o->nhosts; i++) {
        tt_host_t *h = &o->hosts[i];
        if (!h->nranks)
            continue;
        /* the store as this host reaches it: this host's address on its route there */
        char url[600];
        if (server) {
            if (h->local)
                snprintf(addr, sizeof(addr), "127.0.0.1");
            else if (route_addr(tt_host_addr(h), addr, sizeof(addr)) < 0) {
                fprintf(stderr, "tutti-run: no route from here to host %s: %s\n", h->name,
                        strerror(errno));
                status = 1;
                goto out;
            }
            snprintf(url, sizeof(url), strchr(addr, ':') ? "tcp://[%s]:%d" : "tcp://%s:%d", addr,
                     port);
        } else {
            snprintf(url, sizeof(url), "%s", o->store);
        }
        if (direct && !h->local) { /* srun's step, below */
            snprintf(places[ngroup++], sizeof(places[0]), "%s %d %d %d %s", h->name, k, h->first,
                     h->nranks, url);
            snprintf(nodelist + strlen(nodelist), listlen - strlen(nodelist), "%s%s",
                     ngroup > 1 ? "," : "--nodelist=", h->name);
            group_ranks += h->nranks;
            k++;
            continue;
        }
        host_cmd_t *c = &cmds[ncmd];
        *c = (host_cmd_t){ .host = h->name,
                           .local = h->local,
                           .rsh = rsh,
                           .direct = direct,
                           .in = -1,
                           .first = h->first,
                           .nranks = h->nranks };
        char(*str)[512] = &strs[ncmd * 8];
        char **argv = calloc((size_t)(nenv + nprog + 32), sizeof(*argv));
        if (!argv)
            goto oom;
        int s = 0, a = agent_head(argv, 0, env, nenv, agent, nodes_s, world_s);
        argv[a++] = "--node-rank";
        snprintf(str[s], sizeof(str[s]), "%d", k);
        argv[a++] = str[s++];
        argv[a++] = "-np";
        snprintf(str[s], sizeof(str[s]), "%d", h->nranks);
        argv[a++] = str[s++];
        argv[a++] = "--rank-offset";
        snprintf(str[s], sizeof(str[s]), "%d", h->first);
        argv[a++] = str[s++];
        argv[a++] = "--store";
        snprintf(str[s], sizeof(str[s]), "%s", url);
        argv[a++] = str[s++];
        a = agent_tail(o, argv, a, str[s++]);
        c->argv = argv;
        if (host_exec(c) < 0)
            goto oom;
        k++;
        ncmd++;
    }
    if (ngroup) { /* srun --nodes=G --ntasks=G --nodelist=... env ... AGENT --place ... */
        host_cmd_t *c = &cmds[ncmd];
        char(*str)[512] = &strs[ncmd * 8];
        *c = (host_cmd_t){ .host = nodelist + strlen("--nodelist="),
                           .rsh = rsh,
                           .direct = 1,
                           .group = ngroup,
                           .in = -1,
                           .nranks = group_ranks };
        char **argv = calloc((size_t)(nenv + nprog + 2 * ngroup + 32), sizeof(*argv));
        if (!argv)
            goto oom;
        int a = 0, s = 0;
        snprintf(str[s], sizeof(str[s]), "--nodes=%d", ngroup);
        argv[a++] = str[s++];
        snprintf(str[s], sizeof(str[s]), "--ntasks=%d", ngroup);
        argv[a++] = str[s++];
        argv[a++] = nodelist;
        a = agent_head(argv, a, env, nenv, agent, nodes_s, world_s);
        for (int g = 0; g < ngroup; g++) {
            argv[a++] = "--place";
            argv[a++] = places[g];
        }
        a = agent_tail(o, argv, a, str[s++]);
        c->argv = argv;
        if (host_exec(c) < 0)
            goto oom;
        ncmd++;
    }
    if (tt_launch_start(&l, "tutti-run", ncmd, 0) < 0) {
        status = 1;
        goto out;
    }
    started = 1;
    /* srun SIGKILLs its step on SIGTERM (the ranks get no SIGTERM of their own), and a
     * SIGKILLed srun leaves its step running until Slurm finds it gone (a SIGKILLed
     * launch left a rank 12 s in tests/test_slurm_nodes.sh): the agents are stopped by
     * the end of their stdin (below, and this launch's death), which they pass on as
     * SIGTERM to their ranks; srun gets signals only where they are still there later */
    if (direct)
        tt_launch_soft_death(&l);
    for (k = 0; k < ncmd; k++) {
        int pp[2];
        if (pipe2(pp, O_CLOEXEC) < 0) {
            fprintf(stderr, "tutti-run: pipe: %s\n", strerror(errno));
            status = 1;
            tt_launch_stop(&l);
            break;
        }
        cmds[k].in = pp[0];
        wfd[k] = pp[1];
        int sp = tt_launch_spawn(&l, k, run_host, cmds);
        close(pp[0]);
        if (sp < 0) {
            status = 1;
            tt_launch_stop(&l);
            break;
        }
        /* the secret: never on a command line (ps on the host would show it) */
        static char line[sizeof(token) + 32];
        int n = snprintf(line, sizeof(line), "tutti-run-agent %s\n", token[0] ? token : "-");
        if (write(wfd[k], line, (size_t)n) != n) {
            /* it died at once: its status says why */
        }
        memset(line, 0, sizeof(line));
    }
    double deadline = o->timeout_s ? now_ms() + o->timeout_s * 1000.0 + 2 * TT_LAUNCH_GRACE_MS : 0;
    while (l.running > 0) {
        tt_launch_nap(&l, 20);
        int i, code, sig;
        while ((i = tt_launch_reap(&l, &code, &sig)) >= 0) {
            if (code == 0 || tt_launch_stopping(&l) || tt_launch_signal_received())
                continue;
            status = code;
            if (cmds[i].group)
                fprintf(stderr,
                        "tutti-run: srun of node(s) %s (%d ranks) exited with status %d; "
                        "stopping the other %d host(s)\n",
                        cmds[i].host, cmds[i].nranks, code, l.running);
            else
                fprintf(stderr,
                        "tutti-run: host %s (ranks %d..%d) exited with status %d%s; stopping "
                        "the other %d host(s)\n",
                        cmds[i].host, cmds[i].first, cmds[i].first + cmds[i].nranks - 1, code,
                        code == 255 && !cmds[i].local && !direct
                            ? " (ssh's when it cannot reach the host)"
                            : "",
                        l.running);
            tt_launch_stop(&l);
        }
        int got = tt_launch_signal_received();
        if (!tt_launch_stopping(&l) && (got || (deadline && now_ms() > deadline))) {
            status = got ? 128 + got : 124;
            tt_launch_stop(&l);
        }
        for (k = 0; direct && tt_launch_stopping(&l) && k < ncmd; k++)
            if (wfd[k] >= 0) { /* the agents' stop (tt_launch_soft_death) */
                close(wfd[k]);
                wfd[k] = -1;
            }
        tt_launch_tick(&l);
    }
    goto out;
oom:
    fprintf(stderr, "tutti-run: out of memory\n");
    status = 1;
out:
    for (k = 0; k < nodes && wfd; k++)
        if (wfd[k] >= 0)
            close(wfd[k]);
    if (started)
        tt_launch_finish(&l);
    if (server)
        tutti_store_close(server);
    for (k = 0; k < nodes && cmds; k++) {
        if (cmds[k].exec != cmds[k].argv)
            free(cmds[k].exec);
        free(cmds[k].line);
        free(cmds[k].argv);
    }
    free(cmds);
    free(wfd);
    free(strs);
    free(places);
    free(nodelist);
    free(rsh);
    for (k = 0; k < nenv; k++)
        free(env[k]);
    free(env);
    return status;
}

/* An agent started by -H's launch: the first line of its stdin is "tutti-run-agent
 * SECRET" ("-": none), which its ranks get as TUTTI_AUTH_TOKEN; then supervise looks at
 * stdin (agent_look), and its end (the launch gone, ssh's connection with it) is taken as
 * SIGHUP. The ranks get /dev/null as stdin. 0, or -1 having said why. */
static int agent_start(void)
{
    /* its stdin's end must stop it: not SIGHUP ignored as it came (nohup) */
    signal(SIGHUP, SIG_DFL);
    static char line[4200];
    size_t n = 0;
    while (n < sizeof(line) - 1) {
        ssize_t r = read(0, line + n, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || line[n] == '\n')
            break;
        n++;
    }
    line[n] = '\0';
    if (strncmp(line, "tutti-run-agent ", 16) != 0) {
        fprintf(stderr, "tutti-run: --agent: stdin did not start with the launch's line (it "
                        "is for tutti-run -H)\n");
        return -1;
    }
    if (strcmp(line + 16, "-") != 0)
        setenv("TUTTI_AUTH_TOKEN", line + 16, 1);
    memset(line, 0, sizeof(line));
    int fd = fcntl(0, F_DUPFD_CLOEXEC, 3), null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || null < 0 || dup2(null, 0) < 0 || fcntl(fd, F_SETFL, O_NONBLOCK) < 0) {
        fprintf(stderr, "tutti-run: --agent: %s\n", strerror(errno));
        return -1;
    }
    close(null);
    g_agent_in = fd;
    return 0;
}

/* srun -N M ... tutti-run -np N PROG: the tasks of the step are the nodes of one job, as
 * mpirun's daemons are (torchrun's would each run a job of its own): node SLURM_PROCID
 * of SLURM_STEP_NUM_TASKS, at the store the library derives for the step
 * (tutti_store_open_env: on its first node, or on loopback where the step has one node;
 * task 0 serves it, from here, for the whole run). Not where the command line names
 * nodes, a store or hosts, or where an outer launcher placed this tutti-run (TUTTI_RANK,
 * RANK). 0 (*server set, or left NULL where this is no such task), -1 having said why. */
static int slurm_nodes(run_opts_t *o, tutti_store_t **server)
{
    static char url[600];
    const char *step = getenv("SLURM_STEP_ID"), *tasks = getenv("SLURM_STEP_NUM_TASKS");
    *server = NULL;
    if (!step || !*step || !tasks || atoi(tasks) < 2 || o->nodes_named || o->store || o->nhosts ||
        o->agent || o->world || getenv("TUTTI_RANK") || getenv("RANK"))
        return 0;
    /* one task a node: two on one node would each number their ranks from LOCAL_RANK 0
     * (SLURM_STEP_TASKS_PER_NODE: "1(x4)", or "1,1" ...) */
    const char *per = getenv("SLURM_STEP_TASKS_PER_NODE");
    for (const char *c = per; c && *c; c = strchr(c, ',') ? strchr(c, ',') + 1 : "") {
        if (c[0] != '1' || (c[1] && c[1] != ',' && c[1] != '(')) {
            fprintf(stderr,
                    "tutti-run: a Slurm step of %s tasks, %s a node: each tutti-run task is a "
                    "node of the job, so give it one task a node (srun --ntasks-per-node 1; "
                    "-np sets the ranks each starts)\n",
                    tasks, per);
            return -1;
        }
    }
    /* torch's MASTER_ADDR/MASTER_PORT, which the ranks get as they are, are torch's
     * store's: tutti's is the step's own (tutti_store_open_env would take them) */
    char *ma = getenv("MASTER_ADDR") ? strdup(getenv("MASTER_ADDR")) : NULL;
    char *mp = getenv("MASTER_PORT") ? strdup(getenv("MASTER_PORT")) : NULL;
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    int node, nodes;
    int st = tutti_store_open_env(server, &node, &nodes, NULL);
    if (ma)
        setenv("MASTER_ADDR", ma, 1);
    if (mp)
        setenv("MASTER_PORT", mp, 1);
    free(ma);
    free(mp);
    if (st < 0) {
        fprintf(stderr,
                "tutti-run: one of %s tasks of a Slurm step, each a node of the job: no store "
                "for them: %s (or name the nodes: --nnodes, --node-rank, --store)\n",
                tasks, tutti_comm_last_error(NULL));
        *server = NULL;
        return -1;
    }
    snprintf(url, sizeof(url), "%s", tutti_store_url(*server));
    o->store = url;
    o->nnodes = nodes;
    o->node_rank = node;
    setenv("TUTTI_STORE_SERVER", "0", 1); /* the ranks: task 0 serves it, here; every
                                             task keeps its handle for the exit barrier */
    TT_INFO("tutti-run: Slurm task %d of %d: node %d of the job, store %s%s", node, nodes, node,
            url, node ? "" : " (served here)");
    return 0;
}

/* A Slurm step's node is through (its ranks exited): said in the store; task 0, which
 * serves it, waits (up to TUTTI_TIMEOUT_MS, default 30 s) for every node to say so,
 * since the others' ranks may still read it (a peer's failure report, their destroy). */
static void slurm_exit(const run_opts_t *o, tutti_store_t *store)
{
    int64_t n = 0;
    if (tutti_store_add(store, "tutti-run/through", 1, &n) < 0 || o->node_rank != 0)
        return;
    const char *t = getenv("TUTTI_TIMEOUT_MS");
    double end = now_ms() + (t && atoi(t) > 0 ? atoi(t) : 30000);
    while (n < o->nnodes && now_ms() < end) {
        usleep(20000);
        if (tutti_store_add(store, "tutti-run/through", 0, &n) < 0)
            return;
    }
    if (n < o->nnodes)
        fprintf(stderr, "tutti-run: %lld of %d nodes through when the store went\n", (long long)n,
                o->nnodes);
}

int main(int argc, char **argv)
{
    run_opts_t o;
    int st = parse_args(argc, argv, &o);
    if (st >= 0) {
        free(o.prog_owned);
        free(o.hosts);
        return st;
    }
    if (o.nhosts) {
        st = run_hosts(&o);
        free(o.prog_owned);
        free(o.hosts);
        return st;
    }
    if (o.agent && agent_start() < 0) {
        free(o.prog_owned);
        return 1;
    }
    tutti_store_t *slurm_server = NULL; /* a task of a Slurm step of several: the step's
                                           store (task 0 serves it) */
    if (slurm_nodes(&o, &slurm_server) < 0) {
        free(o.prog_owned);
        return 1;
    }
    if (check_args(&o) < 0) {
        free(o.prog_owned);
        if (slurm_server)
            tutti_store_close(slurm_server);
        return 2;
    }
    if (o.log_dir || o.redirects || o.tee) {
        /* torchrun's: a directory of this run's own in --log-dir (else in /tmp), kept */
        const char *base = o.log_dir ? o.log_dir : "/tmp";
        if (o.log_dir && mkdir(base, 0755) < 0 && errno != EEXIST) {
            fprintf(stderr, "tutti-run: --log-dir %s: %s\n", base, strerror(errno));
            free(o.prog_owned);
            return 1;
        }
        snprintf(o.run_dir, sizeof(o.run_dir), "%s/%s_XXXXXX", base,
                 o.log_dir ? getenv("TUTTI_JOB_ID") : "torchelastic");
        if (!mkdtemp(o.run_dir)) {
            fprintf(stderr, "tutti-run: %s: %s\n", o.run_dir, strerror(errno));
            free(o.prog_owned);
            return 1;
        }
        fprintf(stderr, "tutti-run: the ranks' logs go to %s\n", o.run_dir);
    }

    tt_launch_t l;
    /* the directory: the ranks' store where none is given, and their error files where
     * no --log-dir holds them (then a launch can go without it) */
    if (tt_launch_start(&l, "tutti-run", o.np, !o.store ? 1 : !o.run_dir[0] ? 2 : 0) < 0) {
        free(o.prog_owned);
        return 1;
    }
    if (!o.store)
        o.store = l.url;
    l.bind = o.bind;
    int np = o.np, tag = o.piped;
    tagger_t *tags = tag ? calloc((size_t)np * 2, sizeof(tagger_t)) : NULL;
    struct pollfd *pf = tag ? calloc((size_t)np * 2 + 1, sizeof(struct pollfd)) : NULL;
    run_failures_t fails = { .f = calloc((size_t)np, sizeof(run_failure_t)) };
    int status = 0;
    if ((tag && (!tags || !pf)) || !fails.f) {
        fprintf(stderr, "tutti-run: out of memory\n");
        status = 1;
        goto out;
    }
    for (int k = 0; k < 2 * np && tag; k++)
        tags[k].fd = tags[k].copy = -1;

    double deadline = o.timeout_s ? now_ms() + o.timeout_s * 1000.0 : 0;
    if (o.min_nodes) {
        status = run_elastic(&l, &o, tags, pf, deadline, &fails);
        goto out;
    }
    for (int restart = 0;; restart++) {
        int rank_failed = 0;
        status = 0;
        if (spawn_ranks(&l, &o, tags, restart, NULL) < 0) {
            status = 1;
            tt_launch_stop(&l);
        }
        fails.attempt = restart;
        status = supervise(&l, &o, tags, pf, deadline, status, &rank_failed, NULL, NULL, NULL, 0,
                           &fails);
        if (tag)
            tag_drain(tags, pf, 2 * np);
        if (!rank_failed || tt_launch_signal_received())
            break;
        if (restart >= o.max_restarts) {
            report_failures(&l, &o, &fails, status);
            break;
        }
        fprintf(stderr, "tutti-run: starting the %d rank(s) again (restart %d of %d)\n", np,
                restart + 1, o.max_restarts);
        if (tt_launch_restart(&l) < 0)
            break;
        for (int k = 0; k < 2 * np && tag; k++)
            tags[k] = (tagger_t){ .fd = -1, .copy = -1 };
    }
out:
    tt_launch_finish(&l);
    if (slurm_server) { /* the exit barrier: task 0 serves until every node is through;
                           the others say they are */
        slurm_exit(&o, slurm_server);
        tutti_store_close(slurm_server);
    }
    free(tags);
    free(pf);
    free(fails.f);
    free(o.prog_owned);
    return status;
}
