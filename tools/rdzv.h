/* tools/rdzv.h: the elastic rendezvous of tutti-run --nnodes MIN:MAX (torchrun's
 * elastic agent, over a tutti store).
 *
 * Each tutti-run is an agent for the ranks of its node. The agents of a job meet in
 * rounds under tutti/elastic/<job id>/ in the store:
 *
 *   round             the round now gathering (a counter, 0 first)
 *   r<R>/failures     failed rounds before round R (absent for round 0): written by every
 *                     agent that steps the counter to R, alike, before it steps it
 *   r<R>/expect       how many agents of round R-1 should come back (its agents but one
 *                     that left or is gone): the last call waits up to the stop grace
 *                     longer for them, so a node slow to stop its ranks is not late
 *   r<R>/joined       how many agents came to round R (each takes the next number)
 *   r<R>/np/<i>       agent i's rank count
 *   r<R>/beat/<i>     agent i's heartbeat: a counter it adds to every keep-alive interval
 *                     from the moment it joined; an agent whose beat has not moved for
 *                     keep_alive_max intervals (seen by another's clock) is gone
 *   r<R>/closed       how many of them the round took ("<n>"; the first offer stands,
 *                     compare-and-set): at MAX, or at MIN or more once no agent has
 *                     come for the last-call time. Agents numbered past it are late.
 *   r<R>/master       "ADDR PORT": MASTER_ADDR/MASTER_PORT, picked by agent 0
 *   r<R>/waiting      late agents: running agents below MAX start a new round for them
 *   r<R>/restart      why the round ended ("failure: ..." or "scale: ..."), the first
 *                     reason standing (compare-and-set)
 *   r<R>/done         agents whose ranks all exited 0; the round ran through when every
 *                     agent's did (they wait for each other: torchrun's exit barrier)
 *   r<R>/left         agents that saw it: the agent serving a tcp:// store waits for them
 *   finished          the job ran through: a late agent has nothing to join
 *   given-up          restarts used up: a late agent stops too
 *
 * An agent in a round runs its ranks with ranks numbered by the agents' order (rank of
 * its first = the rank counts of the agents before it) and the job id "<job>-r<R>", so
 * that rounds never meet. A failure ends the round for every agent (each polls it) and
 * counts against --max-restarts, one count for the job (r<R>/failures). A late agent, a
 * leaving one (a signal, --timeout) and a gone one end it without counting. */
#ifndef TT_RDZV_H
#define TT_RDZV_H

#include <stddef.h>
#include <stdint.h>

#include <tutti/store.h>

typedef struct tt_rdzv {
    tutti_store_t *base, *store; /* store: the view tutti/elastic/<job>/ */
    const char *url;             /* the store's */
    int min_nodes, max_nodes, np;
    int last_call_ms;    /* at MIN or more, how long the round waits for more agents */
    int timeout_ms;      /* how long an agent waits for a round to take it */
    int keep_alive_ms;   /* heartbeat interval (torchrun's keep_alive_interval) */
    int keep_alive_max;  /* missed beats before an agent counts as gone */
    int read_timeout_ms; /* one store operation (torchrun's read_timeout) */
    int monitor_ms;      /* how often a running agent looks at the round */
    int stop_grace_ms;   /* how long an agent may take to stop its ranks: a round after
                          * one that ended waits that much longer for its agents */
    int max_restarts;    /* failed rounds the job may restart after */
    int (*stop)(void *); /* non-zero: the exit status to stop with (a signal, a deadline) */
    void *stop_ctx;
    int stop_status; /* what stop said, after TT_RDZV_STOPPED */
    int hosting;     /* this agent hosts the tcp store's server */
    int waited;      /* this agent waited for a round as a late one */
    /* the round joined (tt_rdzv_join) */
    int64_t round;
    int idx;              /* this agent's number: its node rank */
    int nodes;            /* agents in the round */
    int rank0;            /* the rank of this agent's first rank */
    int world;            /* ranks in the round */
    int rounds;           /* rounds this agent ran in */
    int64_t failures;     /* failed rounds before this one (the job's count) */
    int64_t ran_round;    /* the last round this agent ran its ranks in (-1: none) */
    char master_addr[64]; /* the round's MASTER_ADDR/MASTER_PORT (torch's env://) */
    int master_port;
    /* heartbeats: this agent's last, and the others' as last seen (per round) */
    double beat_at, check_at;
    int64_t *seen;
    double *seen_at;
    int nseen;
} tt_rdzv_t;

/* The defaults of the knobs above (tt_rdzv_open keeps values already set). */
#define TT_RDZV_KEEP_ALIVE_MS 5000
#define TT_RDZV_KEEP_ALIVE_MAX 3
#define TT_RDZV_READ_TIMEOUT_MS 60000
#define TT_RDZV_MONITOR_MS 100

/* The host and port of a tcp:// or redis:// store URL (a redis one without a port:
 * 6379). 0, or -1 for another scheme or a malformed URL. */
int tt_store_url_host(const char *url, char *host, size_t hostlen, int *port);

/* A MASTER_ADDR and MASTER_PORT for torch's env:// rendezvous, on this host: local_addr
 * when given (torchrun's --local-addr), else the address this host reaches the store's
 * host from (127.0.0.1 for a file store or none, or when it is on this host over
 * loopback), and a port free there now. 0, or -1 (errno: a store host that does not
 * resolve or route is EHOSTUNREACH or the route's error, not a silent loopback). */
int tt_master_pick(const char *store, const char *local_addr, char *addr, size_t addrlen,
                   int *port);

/* Opens the store (a tcp:// one is hosted here when its port is free on this host and
 * host_ok, else joined, retried until the rendezvous timeout or a stop) and the job's
 * view. z->url is then the store's real URL (a port 0 resolved). 0, TT_RDZV_STOPPED, or
 * -1 having said why. */
int tt_rdzv_open(tt_rdzv_t *z, const char *tool, const char *url, const char *job_id, int host_ok);

/* tt_rdzv_join: the job ran through or gave up (*why says which); with z->rounds
 * 0, before this agent came (a new job reusing a finished one's id on a store that kept
 * its keys) unless z->waited */
#define TT_RDZV_FINISHED 1
/* z->stop said stop (its status in z->stop_status); the round, if any, was told that
 * this agent left */
#define TT_RDZV_STOPPED 2

/* Waits for a round that takes this agent (late agents wait for the next; a round whose
 * agents are gone is ended). 0: z's round fields are set (the round's first agent picks
 * its master address and port); TT_RDZV_FINISHED; TT_RDZV_STOPPED; -1 on a timeout or a
 * store failure. why: what happened, for a message. */
int tt_rdzv_join(tt_rdzv_t *z, const char *local_addr, char *why, size_t whylen);

/* While the ranks run (call it every z->monitor_ms): beats, and 1 when the round has
 * ended (its reason in why: another agent's failure or leaving, an agent gone, or a late
 * agent to take in), else 0; -1 when the store failed. */
int tt_rdzv_poll(tt_rdzv_t *z, char *why, size_t whylen);

/* A rank of this agent failed, in a round of several nodes: that may be a peer's rank
 * gone first with a node that leaves (Ctrl-C on a terminal reaches a node's ranks as
 * soon as its agent, which says it leaves only after). Looks for up to
 * TT_RDZV_FAILURE_GRACE_MS for the round ended by another (1, why set, stepped), else 0
 * (then the failure is this node's to say); -1 on a store failure. */
#define TT_RDZV_FAILURE_GRACE_MS 1000
int tt_rdzv_failure_grace(tt_rdzv_t *z, char *why, size_t whylen);

/* Ends the round for a reason ("failure: ..." or "scale: ..."); the reason that stands
 * (maybe another agent's) comes back in why. Then the next round opens. 0 or -1. */
int tt_rdzv_end_round(tt_rdzv_t *z, const char *reason, char *why, size_t whylen);

/* This agent's ranks all exited 0: waits for the round's other agents (torchrun's exit
 * barrier, with no deadline but the others' heartbeats). 0: every agent's ranks passed,
 * the job ran through (an agent serving the store waits for the others to see it);
 * 1: the round ended first (why: another's failure, leaving or end), to be joined again;
 * TT_RDZV_STOPPED; -1 on a store failure. */
int tt_rdzv_done(tt_rdzv_t *z, char *why, size_t whylen);
/* Beats (when one is due) while the ranks stop: 0 or -1. */
int tt_rdzv_beat(tt_rdzv_t *z);

void tt_rdzv_close(tt_rdzv_t *z);

#endif
