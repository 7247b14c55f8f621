/* tutti-run: start N ranks of a program on this host (mpirun/torchrun's job for tutti).
 *
 *   tutti-run -np N [--store URL] [--node-rank K --nnodes M] [--job-id ID] [--timeout S]
 *             [--tag] [--] PROGRAM [ARGS...]
 *
 * Each rank runs PROGRAM with TUTTI_RANK, TUTTI_WORLD_SIZE, TUTTI_LOCAL_RANK,
 * TUTTI_LOCAL_SIZE and TUTTI_STORE set, so tutti_comm_init_env() finds its place (and
 * RANK/WORLD_SIZE/LOCAL_RANK, as torchrun sets them), and TUTTI_JOB_ID unless the user
 * set it (see tt_launch_job_id). Without --store the ranks meet in a file store in a fresh
 * directory in $TMPDIR, removed on every exit path (a cleaner process removes it if
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
 * Exit status: 0 when every rank exited 0; else the first failing rank's exit status
 * (128 + signal for a signal, 124 for --timeout); 2 on bad usage. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "launch.h"

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
            "  -n, -np, --np N     ranks on this host\n"
            "  -s, --store URL     rendezvous store: file:///DIR, tcp://HOST:PORT or\n"
            "                      redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] (default: a file\n"
            "                      store in a fresh directory in $TMPDIR or /tmp, removed\n"
            "                      however tutti-run ends)\n"
            "      --nnodes M      nodes in the job (default 1); ranks are numbered\n"
            "      --node-rank K   node K's ranks are K*N .. K*N+N-1 (default 0)\n"
            "      --job-id ID     TUTTI_JOB_ID of the ranks (default: the environment's, else\n"
            "                      one unique to this launch; with several nodes, the job id\n"
            "                      of what started them (Slurm, mpirun, torchrun...), else one\n"
            "                      from the store's port: when jobs share a standalone store,\n"
            "                      give each job's nodes one --job-id of its own)\n"
            "  -t, --timeout S     kill every rank after S seconds (exit status 124)\n"
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
            "  -h, --help          show this help\n"
            "\n"
            "The first rank that fails brings the others down (SIGTERM, then SIGKILL after\n"
            "%d ms). Exit status: 0 when every rank exited 0, else the first failing\n"
            "rank's status (of the last attempt; 128+signal for a signal, 124 for\n"
            "--timeout, which counts over every attempt); 2 on bad usage.\n"
            "The temporary store is made in $TMPDIR (default /tmp).\n",
            argv0, TT_LAUNCH_GRACE_MS);
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
    FILE *out;
    char buf[8192];
    size_t len;
} tagger_t;

/* Returns 0 at EOF, and when out fails: its reader went away, and closing our end makes
 * the rank's next write fail as it would have without --tag (SIGPIPE). */
static int tag_pump(tagger_t *t)
{
    ssize_t r = read(t->fd, t->buf + t->len, sizeof(t->buf) - t->len);
    if (r < 0 && errno == EINTR)
        return 1;
    if (r <= 0)
        return 0;
    t->len += (size_t)r;
    size_t start = 0;
    for (size_t i = 0; i < t->len; i++) {
        if (t->buf[i] == '\n') {
            fprintf(t->out, "[%d] %.*s\n", t->rank, (int)(i - start), t->buf + start);
            start = i + 1;
        }
    }
    if (start == 0 && t->len == sizeof(t->buf)) { /* a very long line: flush a piece */
        fprintf(t->out, "[%d] %.*s\n", t->rank, (int)t->len, t->buf);
        start = t->len;
    }
    memmove(t->buf, t->buf + start, t->len - start);
    t->len -= start;
    fflush(t->out);
    return !ferror(t->out);
}

static void tag_close(tagger_t *t)
{
    if (t->len) /* a last line without its newline */
        fprintf(t->out, "[%d] %.*s\n", t->rank, (int)t->len, t->buf);
    fflush(t->out);
    close(t->fd);
    t->fd = -1;
    t->len = 0;
}

/* Forwards the ranks' output for up to ms; returns how many of their streams are open. */
static int tag_poll(tagger_t *tags, struct pollfd *pf, int n, int ms)
{
    int nopen = 0;
    for (int k = 0; k < n; k++) { /* poll skips the closed ones (fd -1) */
        pf[k] = (struct pollfd){ .fd = tags[k].fd, .events = POLLIN };
        nopen += tags[k].fd >= 0;
    }
    if (!nopen || poll(pf, (nfds_t)n, ms) <= 0)
        return nopen;
    for (int k = 0; k < n; k++) {
        if (pf[k].revents && !tag_pump(&tags[k])) {
            tag_close(&tags[k]);
            nopen--;
        }
    }
    return nopen;
}

/* What a rank runs: its variables, its output pipes (--tag), then the program. */
typedef struct run_rank {
    int node_rank, np, world, tag, restart;
    int out, err; /* --tag: write ends of this rank's pipes */
    const char *store;
    char **prog;
} run_rank_t;

static void run_rank(void *arg, int i)
{
    const run_rank_t *r = arg;
    int rank = r->node_rank * r->np + i;
    setenv_int("TUTTI_RANK", rank);
    setenv_int("TUTTI_WORLD_SIZE", r->world);
    setenv_int("TUTTI_LOCAL_RANK", i);
    setenv_int("TUTTI_LOCAL_SIZE", r->np);
    setenv_int("RANK", rank);
    setenv_int("WORLD_SIZE", r->world);
    setenv_int("LOCAL_RANK", i);
    setenv_int("TUTTI_RESTART_COUNT", r->restart);
    setenv_int("TORCHELASTIC_RESTART_COUNT", r->restart);
    setenv("TUTTI_STORE", r->store, 1);
    if (r->tag && (dup2(r->out, 1) < 0 || dup2(r->err, 2) < 0))
        _exit(127);
    execvp(r->prog[0], r->prog);
    fprintf(stderr, "tutti-run: rank %d: cannot run %s: %s\n", rank, r->prog[0], strerror(errno));
    _exit(127);
}

/* The command line. */
typedef struct run_opts {
    int np, nnodes, node_rank, timeout_s, tag, bind, max_restarts;
    const char *store, *job_id;
    char **prog;
} run_opts_t;

/* Returns -1 when the command line asks for a run, else the exit status (0 for --help,
 * 2 for bad usage). */
static int parse_args(int argc, char **argv, run_opts_t *o_p)
{
    *o_p = (run_opts_t){ .nnodes = 1 };
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
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c;
    while ((c = getopt_long(argc, argv, "+n:s:t:h", longopts, NULL)) != -1) {
        switch (c) {
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
        case 's': o_p->store = optarg; break;
        case 'N':
            if (tt_cli_int(optarg, 1, 1 << 20, &o_p->nnodes) < 0) {
                fprintf(stderr, "tutti-run: --nnodes %s: expected a positive count\n", optarg);
                return 2;
            }
            break;
        case 'K':
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
        case 'T': o_p->tag = 1; break;
        case 'B': o_p->bind = 1; break;
        case 'J': o_p->job_id = optarg; break;
        case 'h': usage(stdout, argv[0]); return 0;
        default: usage(stderr, argv[0]); return 2;
        }
    }
    if (o_p->np <= 0 || optind >= argc) {
        fprintf(stderr, "tutti-run: %s\n", o_p->np <= 0 ? "-np N is required" : "no program given");
        usage(stderr, argv[0]);
        return 2;
    }
    o_p->prog = argv + optind;
    return -1;
}

/* The options that only make sense together; sets TUTTI_JOB_ID. 0, or -1: bad usage. */
static int check_args(const run_opts_t *o)
{
    if (o->node_rank >= o->nnodes) {
        fprintf(stderr, "tutti-run: --node-rank %d with --nnodes %d: expected 0..%d\n",
                o->node_rank, o->nnodes, o->nnodes - 1);
        return -1;
    }
    if ((long long)o->np * o->nnodes > INT_MAX) {
        fprintf(stderr, "tutti-run: -np %d times --nnodes %d is too many ranks\n", o->np,
                o->nnodes);
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

/* Start the ranks (with --tag, each with its output pipes in tags). -1 if one failed to
 * start: the ones started are left running for the caller to stop. */
static int spawn_ranks(tt_launch_t *l, const run_opts_t *o, tagger_t *tags, int restart)
{
    int np = o->np, tag = o->tag;
    run_rank_t rr = { .node_rank = o->node_rank,
                      .np = np,
                      .world = np * o->nnodes,
                      .tag = tag,
                      .restart = restart,
                      .store = o->store,
                      .prog = o->prog };
    for (int i = 0; i < np; i++) {
        /* O_CLOEXEC: later ranks must not hold earlier ranks' pipes open */
        int out[2] = { -1, -1 }, err[2] = { -1, -1 };
        if (tag && (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0)) {
            fprintf(stderr, "tutti-run: pipe: %s\n", strerror(errno));
            if (out[0] >= 0) {
                close(out[0]);
                close(out[1]);
            }
            return -1;
        }
        rr.out = out[1];
        rr.err = err[1];
        if (tt_launch_spawn(l, i, run_rank, &rr) < 0) {
            if (tag) {
                close(out[0]), close(out[1]);
                close(err[0]), close(err[1]);
            }
            return -1;
        }
        if (tag) {
            int rank = o->node_rank * np + i;
            close(out[1]);
            close(err[1]);
            tags[2 * i] = (tagger_t){ .fd = out[0], .rank = rank, .out = stdout };
            tags[2 * i + 1] = (tagger_t){ .fd = err[0], .rank = rank, .out = stderr };
        }
    }
    return 0;
}

/* Wait for every rank, forwarding --tag output; the first failure, a signal to us or
 * the deadline (0: none) stops the rest. Returns the exit status (status so far in);
 * *rank_failed_p: a rank's failure stopped them (not a signal or the deadline). */
static int supervise(tt_launch_t *l, const run_opts_t *o, tagger_t *tags, struct pollfd *pf,
                     double deadline, int status, int *rank_failed_p)
{
    int first_failed = -1;
    *rank_failed_p = 0;
    while (l->running > 0) {
        if (!o->tag || !tag_poll(tags, pf, 2 * o->np, 50))
            usleep(20000);
        int i, code, sig;
        while ((i = tt_launch_reap(l, &code, &sig)) >= 0) {
            if (code == 0 || first_failed >= 0 || tt_launch_stopping(l))
                continue;
            first_failed = o->node_rank * o->np + i;
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
    while ((left = drain_end - now_ms()) > 0 && tag_poll(tags, pf, n, (int)left + 1))
        ;
    for (int k = 0; k < n; k++)
        if (tags[k].fd >= 0)
            tag_close(&tags[k]);
}

int main(int argc, char **argv)
{
    run_opts_t o;
    int st = parse_args(argc, argv, &o);
    if (st >= 0)
        return st;
    if (check_args(&o) < 0)
        return 2;

    tt_launch_t l;
    if (tt_launch_start(&l, "tutti-run", o.np, !o.store) < 0)
        return 1;
    if (!o.store)
        o.store = l.url;
    l.bind = o.bind;
    int np = o.np, tag = o.tag;
    tagger_t *tags = tag ? calloc((size_t)np * 2, sizeof(tagger_t)) : NULL;
    struct pollfd *pf = tag ? calloc((size_t)np * 2, sizeof(struct pollfd)) : NULL;
    int status = 0;
    if (tag && (!tags || !pf)) {
        fprintf(stderr, "tutti-run: out of memory\n");
        status = 1;
        goto out;
    }
    for (int k = 0; k < 2 * np && tag; k++)
        tags[k].fd = -1;

    double deadline = o.timeout_s ? now_ms() + o.timeout_s * 1000.0 : 0;
    for (int restart = 0;; restart++) {
        int rank_failed = 0;
        status = 0;
        if (spawn_ranks(&l, &o, tags, restart) < 0) {
            status = 1;
            tt_launch_stop(&l);
        }
        status = supervise(&l, &o, tags, pf, deadline, status, &rank_failed);
        if (tag)
            tag_drain(tags, pf, 2 * np);
        if (!rank_failed || restart >= o.max_restarts || tt_launch_signal_received())
            break;
        fprintf(stderr, "tutti-run: starting the %d rank(s) again (restart %d of %d)\n", np,
                restart + 1, o.max_restarts);
        if (tt_launch_restart(&l) < 0)
            break;
        for (int k = 0; k < 2 * np && tag; k++)
            tags[k] = (tagger_t){ .fd = -1 };
    }
out:
    tt_launch_finish(&l);
    free(tags);
    free(pf);
    return status;
}
