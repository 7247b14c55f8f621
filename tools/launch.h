/* tools/launch.h: starting ranks on this host, shared by tutti-run and tutti-bench -np
 * (an internal static library; one copy of the hard parts, which are:)
 *
 * - Ranks die with their launcher: PR_SET_PDEATHSIG(SIGKILL), set in the child and then
 *   checked against getppid() (the launcher may have died between fork and prctl). The
 *   signal fires when the *thread* that forked exits, so call tt_launch_spawn from the
 *   thread that outlives the ranks (the main thread of both tools).
 * - Each rank leads its own process group when no terminal is on fds 0-2, so stopping it
 *   stops what it started too; with a terminal the ranks stay in the launcher's group (a
 *   background group would be stopped by SIGTTIN/SIGTTOU: pdb, breakpoint()).
 * - SIGINT/SIGTERM/SIGHUP are caught (tt_launch_signal_received), SIGPIPE ignored; they
 *   are blocked around fork, so a signal meant for a rank before it has its dispositions
 *   back is not lost in the launcher's handler. Ranks get the original dispositions.
 * - A temporary store directory in $TMPDIR (else /tmp), removed at the end.
 * - A cleaner: a small child in its own session that holds the read end of a pipe from
 *   the launcher and learns each rank's pid through it. When the pipe reaches EOF
 *   without the launcher having said it finished (the launcher was SIGKILLed), it
 *   SIGKILLs what is left of the ranks' groups, waits (bounded) for them to go, removes
 *   the directory, and exits. Exited ranks stay zombies (waitid WNOWAIT) until
 *   tt_launch_finish, so their pids, and so their group ids, are not reused meanwhile.
 *
 * Typical use: tt_launch_job_id; tt_launch_start; tt_launch_spawn per rank; a loop of
 * tt_launch_reap / tt_launch_stop / tt_launch_tick while l.running > 0;
 * tt_launch_finish. */
#ifndef TT_LAUNCH_H
#define TT_LAUNCH_H

#include <limits.h>
#include <signal.h>
#include <sys/types.h>

/* after SIGTERM, how long the ranks get before SIGKILL */
#define TT_LAUNCH_GRACE_MS 3000
/* most ranks one launcher starts */
#define TT_LAUNCH_MAX_RANKS 4096

typedef struct tt_launch {
    const char *tool; /* prefixes messages and names the temp directory */
    int np;
    int own_groups; /* each rank leads its own process group */
    int bind;       /* set before spawning: each rank held on one CPU (tt_launch_spawn) */
    int soft_death; /* tt_launch_soft_death: ranks stop when their stdin ends */
    double term_at; /* soft_death, stopping: when SIGTERM follows; 0 when sent or none */
    int running;    /* ranks started and not yet exited */
    pid_t self;
    pid_t *pids; /* 0: not started */
    char *exited;
    /* each running rank's pidfd (-1: none), in the epoll set exit_fd, which is readable
     * from a rank's exit until it is reaped; -1 where the kernel has no pidfds (then
     * tt_launch_nap sleeps) */
    int *pidfds;
    int exit_fd;
    char dir[PATH_MAX];     /* the temporary store directory (absolute), "" when none */
    char url[PATH_MAX + 8]; /* file://dir */
    int cleaner_fd;         /* write end of the cleaner's pipe, -1 when none */
    pid_t cleaner;
    double kill_at; /* stopping: when SIGKILL follows; 0 when not stopping */
    int killed;     /* SIGKILL went out */
    struct sigaction orig[4];
    struct sigaction orig_fwd[2]; /* SIGUSR1, SIGUSR2: forwarded to the ranks */
    sigset_t stop_sigs;
} tt_launch_t;

/* Sets up np ranks' launch: fds 0-2 open, signal handlers, with_dir: a fresh temporary
 * directory (l->dir, l->url; with_dir 2, one the launch can go without: where it cannot
 * be made, said, and l->dir ""), and the cleaner. Returns 0, or -1 having said why. */
int tt_launch_start(tt_launch_t *l, const char *tool, int np, int with_dir);

/* Sets TUTTI_JOB_ID for the ranks unless the user did (then it is kept; a different
 * given one is an error). given: --job-id or NULL. One node: "<host>-<pid>-<random hex>",
 * unique per launch. Several nodes must agree without talking: the job id of what
 * started them (Slurm, PMIx, Open MPI, torchrun, PBS, LSF, Flux), else one derived from
 * the store's port and the job's shape (a note says when that is not enough). Returns 0,
 * or -1 having said why. */
int tt_launch_job_id(const char *tool, int np, const char *given, int nnodes, const char *store);

/* The job id of what started this process (Slurm, PMIx, Open MPI, torchrun, PBS, LSF,
 * Flux) in id: 1, or 0 when there is none. */
int tt_launch_outer_job_id(char *id, size_t n);

/* What a rank runs in the child, after the launch set it up: must not return (exec or
 * _exit); if it does, the rank exits 127. */
typedef void (*tt_launch_rank_fn)(void *arg, int i);
/* With l->bind, rank i runs held on one CPU of those the launcher may use, the
 * (i * ncpus / np)-th: ranks fill the CPUs in order, neighbours together (mpirun's
 * --bind-to core; 4 ranks on 2 CPUs: the first two on the first). */

/* For ranks that are launchers themselves, which stop what they started when their stdin
 * ends and which SIGTERM would not let do it gracefully (srun SIGKILLs its step on
 * SIGTERM; a SIGKILLed srun leaves its step running): no PR_SET_PDEATHSIG; where the
 * launcher dies (their stdin ends with it), the cleaner gives them TT_LAUNCH_GRACE_MS,
 * then SIGTERM and as long again, then SIGKILL; tt_launch_stop, whose caller ends their
 * stdin, likewise (SIGTERM from tt_launch_tick). Before the first tt_launch_spawn. */
void tt_launch_soft_death(tt_launch_t *l);

/* Forks rank i (0 <= i < np). Returns 0, or -1 having said why (nothing started). */
int tt_launch_spawn(tt_launch_t *l, int i, tt_launch_rank_fn fn, void *arg);

/* A rank that exited since the last call: returns its index and sets *code_p (its exit
 * status, or 128 + signal) and *sig_p (the signal, or 0); -1 when there is none. */
int tt_launch_reap(tt_launch_t *l, int *code_p, int *sig_p);

/* Sleeps up to ms, waking early when a rank exits (tt_launch_exit_fd), so that the
 * ranks' exits are seen in the order they happened, not in rank order within one nap. */
void tt_launch_nap(tt_launch_t *l, int ms);
/* The fd a poll may add to its set for the same purpose (POLLIN), or -1. */
int tt_launch_exit_fd(const tt_launch_t *l);

/* Begins stopping every rank: SIGTERM now (to the groups of exited ranks too, where
 * they have their own), SIGKILL from tt_launch_tick after TT_LAUNCH_GRACE_MS. */
void tt_launch_stop(tt_launch_t *l);
/* tt_launch_stop for a rank's failure: with TUTTI_TRACE_DIR set in the environment the
 * ranks inherit, the SIGTERM waits TT_LAUNCH_RECORD_MS first (from tt_launch_tick), so
 * that a rank outside the library, which looks for a failed peer once a second
 * (TT_TRACE_WATCH_MS, spread by a quarter either way), writes its flight record before it
 * is stopped: it holds the record that matters most (docs/architecture.md). A rank that
 * exits meanwhile is not waited for. */
#define TT_LAUNCH_RECORD_MS 1750
void tt_launch_stop_failed(tt_launch_t *l);
void tt_launch_tick(tt_launch_t *l);
int tt_launch_stopping(const tt_launch_t *l);

/* SIGINT, SIGTERM or SIGHUP received by the launcher, or 0. */
int tt_launch_signal_received(void);

/* For a tool whose ranks only run and exit (tutti-bench, fuse-bench): waits for every
 * rank, stopping them all when one exits with a status other than 0 and soft_code (a
 * soft failure, such as wrong results, lets the others finish) or dies of a signal, when
 * the launcher gets SIGINT, SIGTERM or SIGHUP, or when timeout_s pass (saying which).
 * Returns the worst exit status: 0, soft_code, 3 for a rank that failed or a timeout,
 * or 128 + the launcher's signal. tt_launch_finish follows. */
int tt_launch_wait_all(tt_launch_t *l, int timeout_s, int soft_code);

/* Once every rank has exited, for starting them all again (tutti-run --max-restarts):
 * reaps them (the cleaner forgets them first) and clears their state; the directory and
 * the cleaner stay. 0, or -1 while ranks still run. */
int tt_launch_restart(tt_launch_t *l);

/* Once every rank has exited: reaps them, removes the directory, lets the cleaner go.
 * Returns 0, or -1 if the directory could not be removed (said why). */
int tt_launch_finish(tt_launch_t *l);

#endif
