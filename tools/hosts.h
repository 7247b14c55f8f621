/* tools/hosts.h: the hosts of tutti-run -H / --hostfile (mpirun's and horovodrun's way of
 * starting one job on several hosts from one command), and what starting a command on
 * one of them through a remote shell (ssh) needs. */
#ifndef TT_HOSTS_H
#define TT_HOSTS_H

#include <stddef.h>

typedef struct tt_host {
    char name[256]; /* as the remote shell is given it: HOST or USER@HOST */
    int at;         /* where HOST starts in name (after "USER@"; 0 without a user) */
    int slots;      /* ranks it may take (1 unless said) */
    int nranks;     /* ranks it got */
    int first;      /* its first rank */
    int local;      /* tt_host_is_local(name), asked once when it was added */
} tt_host_t;

/* The host itself: its name or address, without a user. */
static inline const char *tt_host_addr(const tt_host_t *h)
{
    return h->name + h->at;
}

/* Appends the hosts of list "H1[:SLOTS],H2[:SLOTS],..." (mpirun's -H, horovodrun's -H) to
 * *hosts (n of them, realloc'd). A host may be USER@HOST (Open MPI's host files take it
 * too), which the remote shell gets as it is. A host named twice adds its slots, as do
 * two names of this host (tt_host_is_local: one node, under the first name). 0, or -1
 * having said why (tool prefixes it). */
int tt_hosts_parse(const char *tool, const char *list, tt_host_t **hosts, int *n);

/* The same from a host file: a host a line, as "HOST", "HOST:SLOTS" or "HOST slots=N"
 * (Open MPI's), '#' to the end of a line a comment. */
int tt_hosts_read(const char *tool, const char *path, tt_host_t **hosts, int *n);

/* The nodes of the Slurm job this runs in (a batch script's allocation): the hosts of
 * SLURM_JOB_NODELIST, each with its SLURM_TASKS_PER_NODE slots ("2(x3),1"), as Open
 * MPI's mpirun takes them; the node SLURMD_NODENAME names is this host. 0, or -1
 * having said why. */
int tt_hosts_slurm(const char *tool, tt_host_t **hosts, int *n);

/* Gives np ranks to the hosts in order, each up to its slots (np 0: every slot). 0, or
 * -1 having said why (more ranks than slots). *np_p is set where it was 0. */
int tt_hosts_place(const char *tool, tt_host_t *hosts, int n, int *np_p);

/* Whether name is this host: localhost, a loopback address, this host's name, or an
 * address of one of its interfaces. */
int tt_host_is_local(const char *name);

/* argv as one command line for a POSIX shell (a remote shell runs what ssh sends it):
 * each argument single-quoted where it needs it. malloc'd, or NULL. */
char *tt_shell_join(char *const *argv);

#endif
