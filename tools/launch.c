/* tools/launch.c: see launch.h for what is shared and why. */
#include "launch.h"
#include "bind.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* how long the cleaner waits for the ranks' groups to go, and keeps retrying removal */
#define CLEANER_WAIT_MS 1000

/* launcher -> cleaner, 8 bytes each (< PIPE_BUF: never interleaved or split) */
enum { MSG_RANK = 1, MSG_DISARM, MSG_DONE, MSG_FORGET, MSG_SOFT };
typedef struct cleaner_msg {
    int32_t type;
    int32_t pid; /* MSG_RANK */
} cleaner_msg_t;

static volatile sig_atomic_t got_signal;
static void on_signal(int sig)
{
    got_signal = sig;
}
int tt_launch_signal_received(void)
{
    return got_signal;
}

static const int caught[4] = { SIGINT, SIGTERM, SIGHUP, SIGPIPE };

/* Passed on to the ranks, the launch going on (as mpirun does): a batch system's warning
 * before the end of a job (Slurm's --signal=USR1@T, checkpoint-and-requeue schemes).
 * Until session 96 they took the launcher down, and its death the ranks, before any could
 * save (found by review). */
static const int forwarded[2] = { SIGUSR1, SIGUSR2 };
static volatile sig_atomic_t fwd_pending[2];
static void on_forward(int sig)
{
    fwd_pending[sig == SIGUSR2] = 1;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- removing a directory tree --------------------------------------------------- */

static int remove_errno;

/* goes on past failures (one file that will not go must not keep the rest) */
static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    if (remove(path) < 0 && errno != ENOENT && !remove_errno)
        remove_errno = errno;
    return 0;
}

/* Removes dir and everything under it, never following links or crossing mounts.
 * Returns 0 when dir is gone, else -1 with errno the first failure's. */
static int remove_tree(const char *dir)
{
    remove_errno = 0;
    /* FTW_DEPTH: contents before their directory */
    if (nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) < 0 && errno != ENOENT &&
        !remove_errno)
        remove_errno = errno;
    struct stat st;
    if (lstat(dir, &st) < 0 && errno == ENOENT)
        return 0;
    errno = remove_errno ? remove_errno : ENOTEMPTY;
    return -1;
}

/* ---- the cleaner ----------------------------------------------------------------- */

static int cmp_pid(const void *a, const void *b)
{
    pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;
    return (x > y) - (x < y);
}

/* ---- what dead ranks left in /dev/shm --------------------------------------------- */

/* Is the process /proc/<pid_s> running (there, not a zombie)? Its process group in
 * *pgrp_p. */
static int proc_running(const char *pid_s, int *pgrp_p)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%s/stat", pid_s);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t r = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (r <= 0)
        return 0;
    buf[r] = '\0';
    /* "pid (comm) state ppid pgrp ...": comm may hold anything, ')' included */
    char *p = strrchr(buf, ')'), state;
    int ppid;
    return p && sscanf(p + 1, " %c %d %d", &state, &ppid, pgrp_p) == 3 && state != 'Z' &&
           state != 'X';
}

/* Removes the names the shm transport made in /dev/shm ("tutti-shm-<pid>-...",
 * transports/shm/shm_setup.c) for any of the n pids, sorted, that is not running: a rank
 * killed in its set-up (a job that failed to start, stopped by us) had no chance to. A
 * pid reaped and reused by a running process keeps its names. */
static void sweep_shm(const pid_t *sorted, int n)
{
    DIR *d = n > 0 ? opendir("/dev/shm") : NULL;
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid = 0, off = 0;
        if (sscanf(e->d_name, "tutti-shm-%d-%n", &pid, &off) != 1 || !off)
            continue;
        pid_t key = (pid_t)pid;
        char pid_s[16];
        int pgrp;
        snprintf(pid_s, sizeof(pid_s), "%d", pid);
        if (bsearch(&key, sorted, (size_t)n, sizeof(pid_t), cmp_pid) && !proc_running(pid_s, &pgrp))
            unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
}

/* Is a process (not a zombie: who inherited it may never reap it) left whose process
 * group (own_groups) or pid is one of pids (sorted)? 0 when /proc cannot tell. */
static int any_left(const pid_t *pids, int n, int own_groups)
{
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) {
        int pgrp;
        if (e->d_name[0] < '0' || e->d_name[0] > '9' || !proc_running(e->d_name, &pgrp))
            continue;
        pid_t key = own_groups ? (pid_t)pgrp : (pid_t)atoi(e->d_name);
        found = bsearch(&key, pids, (size_t)n, sizeof(pid_t), cmp_pid) != NULL;
    }
    closedir(d);
    return found;
}

/* The cleaner's life: collect rank pids until EOF; then, unless the launcher said it
 * finished, kill what is left and remove the directory. Never returns. */
static void cleaner_main(tt_launch_t *l, int fd)
{
    /* its own session: no terminal's Ctrl-C or hangup, no kill of the launcher's group
     * (timeout(1), a shell's job control) reaches it, and writes never stop it */
    setsid();
    static const int ignored[] = { SIGINT, SIGHUP, SIGPIPE, SIGQUIT, SIGTTIN, SIGTTOU, SIGTSTP };
    for (size_t k = 0; k < sizeof(ignored) / sizeof(ignored[0]); k++)
        signal(ignored[k], SIG_IGN);
    signal(SIGTERM, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* hold nothing the launcher's caller may wait on (a shell reading its stdout); keep
     * stderr for a failure to report */
    int nul = open("/dev/null", O_RDWR);
    if (nul >= 0) {
        dup2(nul, 0);
        dup2(nul, 1);
        if (nul > 2)
            close(nul);
    }
    /* what the launcher had open is not ours to hold (0-2 were open: fd > 2) */
    if ((fd > 3 && close_range(3, (unsigned)fd - 1, 0) < 0) ||
        close_range((unsigned)fd + 1, ~0u, 0) < 0)
        for (int k = 3; k < 1024; k++)
            if (k != fd)
                close(k);

    pid_t *pids = l->pids; /* our copy of the launcher's array: no allocation here */
    int n = 0, armed = 1, done = 0, soft = 0;
    union {
        cleaner_msg_t m[64];
        char b[64 * sizeof(cleaner_msg_t)];
    } in;
    size_t have = 0;
    for (;;) {
        /* cannot happen (less than one message is kept); says so to gcc 13's fortify */
        if (have >= sizeof(in.b))
            break;
        ssize_t r = read(fd, in.b + have, sizeof(in.b) - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        have += (size_t)r;
        size_t whole = have / sizeof(cleaner_msg_t);
        for (size_t k = 0; k < whole; k++) {
            if (in.m[k].type == MSG_RANK && n < l->np && in.m[k].pid > 0)
                pids[n++] = in.m[k].pid;
            else if (in.m[k].type == MSG_DISARM)
                armed = 0;
            else if (in.m[k].type == MSG_DONE)
                done = 1;
            else if (in.m[k].type == MSG_FORGET) /* a restart: those ranks are reaped */
                n = 0;
            else if (in.m[k].type == MSG_SOFT)
                soft = 1;
        }
        memmove(in.b, in.b + whole * sizeof(cleaner_msg_t), have - whole * sizeof(cleaner_msg_t));
        have -= whole * sizeof(cleaner_msg_t);
    }
    double end = now_ms() + CLEANER_WAIT_MS;
    if (armed && n > 0 && soft) {
        /* launchers (srun): their stdin ended with the launcher, which stops them; their
         * time to go, then SIGTERM and more time (SIGKILL below where they have not) */
        qsort(pids, (size_t)n, sizeof(pid_t), cmp_pid);
        for (int round = 0; round < 2; round++) {
            double soft_end = now_ms() + TT_LAUNCH_GRACE_MS;
            while (any_left(pids, n, l->own_groups) && now_ms() < soft_end)
                usleep(10000);
            for (int k = 0; k < n && round == 0; k++)
                kill(l->own_groups ? -pids[k] : pids[k], SIGTERM);
        }
        end = now_ms() + CLEANER_WAIT_MS;
    }
    if (armed && n > 0) {
        /* the ranks themselves got SIGKILL from PR_SET_PDEATHSIG; their groups hold what
         * they started. Sent again while waiting: a fork that raced the first one. */
        qsort(pids, (size_t)n, sizeof(pid_t), cmp_pid);
        for (;;) {
            for (int k = 0; k < n; k++)
                kill(l->own_groups ? -pids[k] : pids[k], SIGKILL);
            if (!any_left(pids, n, l->own_groups) || now_ms() > end)
                break;
            usleep(10000);
        }
        /* the ranks are gone and init may have reaped them: sweep_shm leaves any pid
         * that is alive again (reused) */
        sweep_shm(pids, n);
    }
    if (!done && l->dir[0]) {
        end = now_ms() + CLEANER_WAIT_MS;
        while (remove_tree(l->dir) < 0 && now_ms() < end)
            usleep(20000);
        if (remove_tree(l->dir) < 0)
            fprintf(stderr, "%s: could not remove %s: %s\n", l->tool, l->dir, strerror(errno));
    }
    _exit(0);
}

static void cleaner_tell(tt_launch_t *l, int type, pid_t pid)
{
    cleaner_msg_t m = { .type = type, .pid = (int32_t)pid };
    if (l->cleaner_fd < 0)
        return;
    /* a cleaner that died (someone killed it) costs its service, not the launch */
    while (write(l->cleaner_fd, &m, sizeof(m)) < 0 && errno == EINTR)
        ;
}

void tt_launch_soft_death(tt_launch_t *l)
{
    l->soft_death = 1;
    cleaner_tell(l, MSG_SOFT, 0);
}

static int cleaner_start(tt_launch_t *l)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
        fprintf(stderr, "%s: pipe: %s\n", l->tool, strerror(errno));
        return -1;
    }
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old); /* until the cleaner has its own dispositions */
    pid_t pid = fork();
    if (pid == 0) {
        close(p[1]);
        cleaner_main(l, p[0]);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(p[0]);
    if (pid < 0) {
        fprintf(stderr, "%s: fork: %s\n", l->tool, strerror(errno));
        close(p[1]);
        return -1;
    }
    l->cleaner = pid;
    l->cleaner_fd = p[1];
    return 0;
}

/* ---- the launch ------------------------------------------------------------------ */

/* --bind, in rank i's process: hold it on the (i * ncpus / np)-th of the CPUs it
 * inherited (launch.h). Unbound, the scheduler left 4 ranks on 2 CPUs in a placement
 * that made a 64-byte shm alltoall take 22-33 us in most runs, 13-15 in the rest; bound,
 * 13.2-13.9 in every run (docs/benchmarks.md, "The forty-second session"). A failure
 * is said and the rank runs unbound. */
static void bind_rank(const tt_launch_t *l, int i)
{
    int cpu, e = tt_bind_rank(i, l->np, &cpu);
    if (e)
        fprintf(stderr, "%s: rank %d: --bind: CPU %d: %s (left unbound)\n", l->tool, i, cpu,
                strerror(e));
}

/* The temporary directory; with_dir 2: said and gone on without where it cannot be. */
static int make_dir(tt_launch_t *l, int with_dir)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp)
        tmp = "/tmp";
    size_t len = strlen(tmp);
    while (len > 0 && tmp[len - 1] == '/')
        len--;
    const char *what = with_dir == 2 ? "a directory for the ranks' error files"
                                     : "a store directory";
    const char *then = with_dir == 2 ? "; going on without" : "";
    int bad = with_dir == 2 ? 0 : -1;
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%.*s/%s-XXXXXX", (int)len, tmp, l->tool) >=
        (int)sizeof(path)) {
        fprintf(stderr, "%s: TMPDIR is too long a path for %s%s\n", l->tool, what, then);
        return bad;
    }
    if (!mkdtemp(path)) {
        fprintf(stderr, "%s: cannot create %s in %s (TMPDIR): %s%s\n", l->tool, what, tmp,
                strerror(errno), then);
        return bad;
    }
    /* absolute: the ranks' file:// URL, and the cleaner, which may run elsewhere */
    if (!realpath(path, l->dir)) {
        fprintf(stderr, "%s: %s: %s%s\n", l->tool, path, strerror(errno), then);
        rmdir(path);
        l->dir[0] = '\0';
        return bad;
    }
    snprintf(l->url, sizeof(l->url), "file://%s", l->dir);
    return 0;
}

int tt_launch_start(tt_launch_t *l, const char *tool, int np, int with_dir)
{
    *l = (tt_launch_t){ .tool = tool, .np = np, .cleaner_fd = -1, .exit_fd = -1, .self = getpid() };
    /* a closed 0, 1 or 2 would be handed out again to a pipe, which a rank would then
     * lose (dup2 onto itself keeps O_CLOEXEC) */
    int fd;
    while ((fd = open("/dev/null", O_RDWR)) >= 0 && fd <= 2)
        ;
    if (fd > 2)
        close(fd);
    if (np < 1 || np > TT_LAUNCH_MAX_RANKS) {
        fprintf(stderr, "%s: %d ranks: expected 1..%d\n", tool, np, TT_LAUNCH_MAX_RANKS);
        return -1;
    }
    l->pids = calloc((size_t)np, sizeof(pid_t));
    l->exited = calloc((size_t)np, 1);
    l->pidfds = malloc((size_t)np * sizeof(int));
    if (!l->pids || !l->exited || !l->pidfds) {
        fprintf(stderr, "%s: out of memory\n", tool);
        goto err_free;
    }
    /* a rank in a background group of our terminal would stop on its first use of it */
    l->own_groups = !isatty(0) && !isatty(1) && !isatty(2);

    /* SIGPIPE ignored: a reader of our output that goes away must not take us down before
     * we stop the ranks and remove the store. The ranks get back the dispositions we
     * started with (an ignored signal stays ignored through exec, ours would not); one
     * that was ignored (nohup, a background job) stays ignored here too. */
    sigemptyset(&l->stop_sigs);
    for (int k = 0; k < 4; k++) {
        struct sigaction sa = { .sa_handler = caught[k] == SIGPIPE ? SIG_IGN : on_signal };
        sigemptyset(&sa.sa_mask);
        sigaction(caught[k], NULL, &l->orig[k]);
        if (l->orig[k].sa_handler != SIG_IGN)
            sigaction(caught[k], &sa, NULL);
        if (caught[k] != SIGPIPE)
            sigaddset(&l->stop_sigs, caught[k]);
    }
    for (int k = 0; k < 2; k++) {
        struct sigaction sa = { .sa_handler = on_forward };
        sigemptyset(&sa.sa_mask);
        sigaction(forwarded[k], NULL, &l->orig_fwd[k]);
        if (l->orig_fwd[k].sa_handler != SIG_IGN)
            sigaction(forwarded[k], &sa, NULL);
    }
    if (with_dir && make_dir(l, with_dir) < 0)
        goto err_free;
    if (cleaner_start(l) < 0)
        goto err_remove_dir;
    for (int i = 0; i < np; i++)
        l->pidfds[i] = -1;
    /* after the cleaner: it has no use for it */
    l->exit_fd = epoll_create1(EPOLL_CLOEXEC);
    return 0;

err_remove_dir:
    remove_tree(l->dir);
    l->dir[0] = '\0';
err_free:
    free(l->pids);
    free(l->exited);
    free(l->pidfds);
    l->pids = NULL;
    l->exited = NULL;
    l->pidfds = NULL;
    return -1;
}

/* a job id we pass on: what the library keeps as it is (others it changes to '_', so two
 * ids could become one) and short enough to read in its logs */
static int job_id_ok(const char *id)
{
    size_t n = strlen(id);
    if (n == 0 || n > 64)
        return 0;
    for (size_t k = 0; k < n; k++)
        if (!isalnum((unsigned char)id[k]) && id[k] != '.' && id[k] != '-' && id[k] != '_')
            return 0;
    return 1;
}

/* The job id of what started every node's launcher (a batch scheduler, mpirun, torchrun),
 * spelled as the library spells it when it finds these itself (lib/core/job.c). */
int tt_launch_outer_job_id(char *id, size_t n)
{
    const char *v, *step;
    if ((v = getenv("PMIX_NAMESPACE")) && *v) { /* an mpirun's, inside Slurm too */
        snprintf(id, n, "pmix-%s", v);
    } else if ((v = getenv("OMPI_MCA_ess_base_jobid")) && *v) {
        snprintf(id, n, "ompi-%s", v);
    } else if ((v = getenv("SLURM_JOB_ID")) && *v) {
        step = getenv("SLURM_STEP_ID");
        snprintf(id, n, "slurm-%s.%s", v, step && *step ? step : "0");
    } else if ((v = getenv("TORCHELASTIC_RUN_ID")) && *v && strcmp(v, "none")) {
        snprintf(id, n, "torch-%s", v);
    } else if ((v = getenv("PBS_JOBID")) && *v) {
        snprintf(id, n, "pbs-%s", v);
    } else if ((v = getenv("LSB_JOBID")) && *v) {
        step = getenv("LSB_JOBINDEX");
        snprintf(id, n, "lsf-%s.%s", v, step && *step ? step : "0");
    } else if ((v = getenv("FLUX_JOB_ID")) && *v) {
        snprintf(id, n, "flux-%s", v);
    } else {
        return 0;
    }
    for (char *c = id; *c; c++) /* as the library would */
        if (!isalnum((unsigned char)*c) && *c != '.' && *c != '-' && *c != '_')
            *c = '_';
    return 1;
}

int tt_launch_job_id(const char *tool, int np, const char *given, int nnodes, const char *store)
{
    const char *user = getenv("TUTTI_JOB_ID");
    if (given && !job_id_ok(given)) {
        fprintf(stderr,
                "%s: --job-id \"%s\": expected 1..64 letters, digits, '.', '-' "
                "or '_'\n",
                tool, given);
        return -1;
    }
    if (user && *user) { /* the user's: never replaced */
        if (given && strcmp(given, user)) {
            fprintf(stderr,
                    "%s: --job-id %s differs from TUTTI_JOB_ID=%s in the "
                    "environment: give one of them\n",
                    tool, given, user);
            return -1;
        }
        return 0;
    }
    char id[256];
    if (given) {
        snprintf(id, sizeof(id), "%s", given);
    } else if (nnodes <= 1) {
        char host[65] = "host";
        if (gethostname(host, sizeof(host) - 1) < 0 || !host[0])
            strcpy(host, "host");
        for (char *c = host; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '.' || *c == '-' || *c == '_'))
                *c = '_';
        uint64_t r;
        if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            r = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec ^
                ((uint64_t)getpid() << 32);
        }
        snprintf(id, sizeof(id), "%s-%d-%016llx", host, (int)getpid(), (unsigned long long)r);
    } else if (!tt_launch_outer_job_id(id, sizeof(id))) {
        /* The nodes share only their command lines. Different stores never mix, so the
         * id must only tell apart jobs on one store: with rank 0 hosting it (the default)
         * no two jobs can share it at once. The store's port, not its host (nodes may
         * spell that differently), and the job's shape. */
        const char *colon = store ? strrchr(store, ':') : NULL;
        char port[16] = "";
        for (size_t k = 0; colon && colon[k + 1] && k < sizeof(port) - 1; k++)
            port[k] = (colon[k + 1] >= '0' && colon[k + 1] <= '9') ? colon[k + 1] : '_';
        snprintf(id, sizeof(id), "%s-tcp%s-%dx%d", tool, port, nnodes, np);
        const char *srv = getenv("TUTTI_STORE_SERVER");
        if (srv && !strcmp(srv, "0"))
            fprintf(stderr,
                    "%s: note: job id %s comes from the store's port: jobs that "
                    "share this standalone store at once need distinct --job-id "
                    "(the same on every node)\n",
                    tool, id);
    }
    if (setenv("TUTTI_JOB_ID", id, 1) < 0) {
        fprintf(stderr, "%s: setenv: %s\n", tool, strerror(errno));
        return -1;
    }
    return 0;
}

int tt_launch_spawn(tt_launch_t *l, int i, tt_launch_rank_fn fn, void *arg)
{
    sigset_t mask;
    /* blocked until the child has its own dispositions back: a SIGTERM meant for it
     * would otherwise run our handler there, and be lost */
    sigprocmask(SIG_BLOCK, &l->stop_sigs, &mask);
    pid_t pid = fork();
    if (pid == 0) {
        /* its own process group, so that stopping it stops what it started too */
        if (l->own_groups)
            setpgid(0, 0);
        /* dies with us, even SIGKILLed; if we died before this call, ppid shows it */
        prctl(PR_SET_PDEATHSIG, l->soft_death ? 0 : SIGKILL);
        if (getppid() != l->self)
            _exit(127);
        for (int k = 0; k < 4; k++)
            sigaction(caught[k], &l->orig[k], NULL);
        for (int k = 0; k < 2; k++)
            sigaction(forwarded[k], &l->orig_fwd[k], NULL);
        if (l->cleaner_fd >= 0) /* only we may hold it: its EOF is our death */
            close(l->cleaner_fd);
        if (l->exit_fd >= 0) /* ranks that do not exec (tutti-bench) */
            close(l->exit_fd);
        for (int k = 0; k < l->np; k++)
            if (l->pidfds[k] >= 0)
                close(l->pidfds[k]);
        sigprocmask(SIG_SETMASK, &mask, NULL);
        if (l->bind)
            bind_rank(l, i);
        fn(arg, i);
        _exit(127);
    }
    sigprocmask(SIG_SETMASK, &mask, NULL);
    if (pid < 0) {
        fprintf(stderr, "%s: fork: %s\n", l->tool, strerror(errno));
        return -1;
    }
    /* here too, so that the group exists before we may signal it */
    if (l->own_groups)
        setpgid(pid, pid);
    l->pids[i] = pid;
    l->running++;
    cleaner_tell(l, MSG_RANK, pid);
    /* its exit wakes tt_launch_nap at once (without, a nap ends on its timeout) */
    int fd = l->exit_fd >= 0 ? (int)syscall(SYS_pidfd_open, pid, 0) : -1;
    struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)i };
    if (fd >= 0 && epoll_ctl(l->exit_fd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        close(fd);
        fd = -1;
    }
    l->pidfds[i] = fd;
    return 0;
}

/* A rank reaped (or forgotten): its pidfd leaves the epoll set, which would otherwise
 * stay readable. Deleted before the close: a child that did not exec may share it. */
static void drop_pidfd(tt_launch_t *l, int i)
{
    if (l->pidfds[i] < 0)
        return;
    epoll_ctl(l->exit_fd, EPOLL_CTL_DEL, l->pidfds[i], NULL);
    close(l->pidfds[i]);
    l->pidfds[i] = -1;
}

int tt_launch_exit_fd(const tt_launch_t *l)
{
    return l->exit_fd;
}

void tt_launch_nap(tt_launch_t *l, int ms)
{
    /* a rank's exit ends it: two ranks failing a few ms apart are then reaped in that
     * order, and the first is the one blamed (session 97; a fixed 20 ms sleep took
     * them in rank order, blaming the wrong one in 8 of 10 runs of a review's test) */
    struct pollfd pf = { .fd = l->exit_fd, .events = POLLIN };
    if (l->exit_fd < 0)
        usleep((useconds_t)ms * 1000);
    else
        poll(&pf, 1, ms); /* a signal ends it too: the caller looks at once */
}

int tt_launch_reap(tt_launch_t *l, int *code_p, int *sig_p)
{
    /* The first rank to exit first, even when the launcher looks late (a loaded host):
     * epoll hands out ready pidfds in the order they became ready, and each reaped one
     * leaves the set. Ranks without a pidfd are found by the scan below, in rank order. */
    struct epoll_event ev;
    int first = -1;
    if (l->exit_fd >= 0 && epoll_wait(l->exit_fd, &ev, 1, 0) == 1 && ev.data.u32 < (uint32_t)l->np)
        first = (int)ev.data.u32;
    /* WNOWAIT: an exited rank stays a zombie until the end, so its pid, and with it its
     * process group id, cannot be reused while we (or the cleaner) may signal that group */
    for (int k = first < 0 ? 0 : -1; k < l->np; k++) {
        int i = k < 0 ? first : k;
        siginfo_t si = { 0 };
        if (l->pids[i] <= 0 || l->exited[i] ||
            waitid(P_PID, (id_t)l->pids[i], &si, WEXITED | WNOHANG | WNOWAIT) < 0 ||
            si.si_pid != l->pids[i])
            continue;
        l->exited[i] = 1;
        l->running--;
        drop_pidfd(l, i);
        int sig = si.si_code == CLD_EXITED ? 0 : si.si_status;
        *sig_p = sig;
        *code_p = sig ? 128 + sig : si.si_status;
        return i;
    }
    return -1;
}

static void signal_all(tt_launch_t *l, int sig)
{
    /* the groups of exited ranks too: what they left behind stops with the run */
    for (int i = 0; i < l->np; i++)
        if (l->pids[i] > 0 && (l->own_groups || !l->exited[i]))
            kill(l->own_groups ? -l->pids[i] : l->pids[i], sig);
}

void tt_launch_stop(tt_launch_t *l)
{
    /* once at least, even when the last rank just exited: its group, and those of the
     * ranks before it, may still hold what they started */
    if (l->kill_at)
        return;
    if (l->soft_death) { /* the caller ended their stdin: SIGTERM from tt_launch_tick */
        l->term_at = now_ms() + TT_LAUNCH_GRACE_MS;
        l->kill_at = l->term_at + TT_LAUNCH_GRACE_MS;
        return;
    }
    signal_all(l, SIGTERM);
    l->kill_at = now_ms() + TT_LAUNCH_GRACE_MS;
}

void tt_launch_stop_failed(tt_launch_t *l)
{
    const char *dir = getenv("TUTTI_TRACE_DIR");
    if (l->kill_at || l->soft_death || !dir || !dir[0]) {
        tt_launch_stop(l);
        return;
    }
    l->term_at = now_ms() + TT_LAUNCH_RECORD_MS;
    l->kill_at = l->term_at + TT_LAUNCH_GRACE_MS;
}

void tt_launch_tick(tt_launch_t *l)
{
    for (int k = 0; k < 2; k++) {
        if (!fwd_pending[k])
            continue;
        fwd_pending[k] = 0;
        for (int i = 0; i < l->np; i++)
            if (l->pids[i] > 0 && !l->exited[i])
                kill(l->pids[i], forwarded[k]);
    }
    if (l->term_at && l->running > 0 && now_ms() > l->term_at) {
        signal_all(l, SIGTERM);
        l->term_at = 0;
    }
    if (l->kill_at && !l->killed && l->running > 0 && now_ms() > l->kill_at) {
        signal_all(l, SIGKILL);
        l->killed = 1;
    }
}

int tt_launch_stopping(const tt_launch_t *l)
{
    return l->kill_at != 0;
}

/* Reap every rank started (all have exited), sweeping their shm leftovers first. */
static void reap_all(tt_launch_t *l)
{
    pid_t *sorted = malloc((size_t)l->np * sizeof(pid_t));
    int n = 0;
    for (int i = 0; i < l->np; i++) {
        if (l->pids[i] <= 0)
            continue;
        siginfo_t si;
        /* exited, not yet reaped: the pid is still the rank's */
        while (!l->exited[i] && waitid(P_PID, (id_t)l->pids[i], &si, WEXITED | WNOWAIT) < 0 &&
               errno == EINTR)
            ;
        if (sorted)
            sorted[n++] = l->pids[i];
    }
    if (sorted) {
        qsort(sorted, (size_t)n, sizeof(pid_t), cmp_pid);
        sweep_shm(sorted, n);
        free(sorted);
    }
    for (int i = 0; i < l->np; i++)
        if (l->pids[i] > 0)
            while (waitpid(l->pids[i], NULL, 0) < 0 && errno == EINTR)
                ;
}

/* A stop was under way when the last rank exited: what its group still holds (a child
 * that ignored the SIGTERM) gets SIGKILL at the stop's deadline, as it would have had a
 * rank still run. Before this (session 96, found by review), the SIGKILL went out only
 * while a rank ran: such children outlived the launch, one more each restart. The rank
 * zombies keep their group ids from being reused meanwhile. */
static void drain_groups(tt_launch_t *l)
{
    if (!l->own_groups || !l->kill_at || l->killed)
        return;
    if (l->term_at) { /* the ranks exited before a delayed SIGTERM: their groups get it */
        signal_all(l, SIGTERM);
        l->term_at = 0;
    }
    pid_t *sorted = malloc((size_t)l->np * sizeof(pid_t));
    int n = 0;
    if (!sorted)
        return;
    for (int i = 0; i < l->np; i++)
        if (l->pids[i] > 0)
            sorted[n++] = l->pids[i];
    qsort(sorted, (size_t)n, sizeof(pid_t), cmp_pid);
    while (any_left(sorted, n, 1) && now_ms() < l->kill_at)
        usleep(10000);
    double end = now_ms() + CLEANER_WAIT_MS;
    while (any_left(sorted, n, 1) && now_ms() < end) {
        signal_all(l, SIGKILL);
        usleep(10000);
    }
    l->killed = 1;
    free(sorted);
}

int tt_launch_restart(tt_launch_t *l)
{
    if (l->running > 0)
        return -1;
    drain_groups(l);
    cleaner_tell(l, MSG_FORGET, 0); /* before reaping: pids may be reused after */
    reap_all(l);                    /* their pidfds went as tt_launch_reap took them */
    memset(l->pids, 0, (size_t)l->np * sizeof(pid_t));
    memset(l->exited, 0, (size_t)l->np);
    l->kill_at = 0;
    l->term_at = 0;
    l->killed = 0;
    return 0;
}

int tt_launch_finish(tt_launch_t *l)
{
    int rc = 0;
    if (l->running == 0)
        drain_groups(l);
    cleaner_tell(l, MSG_DISARM, 0); /* before reaping: pids may be reused after */
    reap_all(l);
    if (l->dir[0]) {
        if (remove_tree(l->dir) == 0) {
            cleaner_tell(l, MSG_DONE, 0);
        } else {
            fprintf(stderr, "%s: could not remove %s: %s\n", l->tool, l->dir, strerror(errno));
            rc = -1; /* the cleaner tries again for a while */
        }
    }
    if (l->cleaner_fd >= 0)
        close(l->cleaner_fd);
    l->cleaner_fd = -1;
    if (l->cleaner > 0)
        while (waitpid(l->cleaner, NULL, 0) < 0 && errno == EINTR)
            ;
    l->cleaner = 0;
    for (int i = 0; i < l->np; i++)
        drop_pidfd(l, i);
    if (l->exit_fd >= 0)
        close(l->exit_fd);
    l->exit_fd = -1;
    free(l->pids);
    free(l->exited);
    free(l->pidfds);
    l->pids = NULL;
    l->exited = NULL;
    l->pidfds = NULL;
    return rc;
}

int tt_launch_wait_all(tt_launch_t *l, int timeout_s, int soft_code)
{
    int rc = 0;
    const double deadline = now_ms() + timeout_s * 1000.0;
    while (l->running > 0) {
        tt_launch_nap(l, 5);
        int r, code, sig;
        while ((r = tt_launch_reap(l, &code, &sig)) >= 0) {
            if (sig && !tt_launch_stopping(l))
                fprintf(stderr, "%s: rank %d died of signal %d (%s)\n", l->tool, r, sig,
                        strsignal(sig));
            if (sig)
                code = 3;
            if (code > rc)
                rc = code;
            if (code != 0 && code != soft_code)
                tt_launch_stop_failed(l);
        }
        int got = tt_launch_signal_received();
        if (!tt_launch_stopping(l) && got) {
            fprintf(stderr, "%s: %s: stopping %d rank(s)\n", l->tool, strsignal(got), l->running);
            rc = 128 + got;
            tt_launch_stop(l);
        } else if (!tt_launch_stopping(l) && now_ms() > deadline) {
            fprintf(stderr, "%s: ranks still running after %d s; stopping them\n", l->tool,
                    timeout_s);
            rc = 3;
            tt_launch_stop(l);
        }
        tt_launch_tick(l);
    }
    return rc;
}
