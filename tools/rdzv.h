/* tools/rdzv.h: the elastic rendezvous of tutti-run --nnodes MIN:MAX (torchrun's
 * elastic agent, over a tutti store).
 *
 * Each tutti-run is an agent for the ranks of its node. The agents of a job meet in
 * rounds under tutti/elastic/<job id>/ in the store:
 *
 *   round             the round now gathering (a counter, 0 first)
 *   r<R>/joined       how many agents came to round R (each takes the next number)
 *   r<R>/np/<i>       agent i's rank count
 *   r<R>/closed       how many of them the round took ("<n>"; the first offer stands,
 *                     compare-and-set): at MAX, or at MIN or more once no agent has
 *                     come for the last-call time. Agents numbered past it are late.
 *   r<R>/waiting      late agents: running agents below MAX start a new round for them
 *   r<R>/restart      why the round ended ("failure: ..." or "scale: ..."), the first
 *                     reason standing (compare-and-set)
 *   r<R>/done         agents whose ranks all exited 0
 *   finished          the job ran through: a late agent has nothing to join
 *   given-up          restarts used up: a late agent stops too
 *
 * An agent in a round runs its ranks with ranks numbered by the agents' order (rank of
 * its first = the rank counts of the agents before it) and the job id "<job>-r<R>", so
 * that rounds never meet. A failure ends the round for every agent (each polls it), and
 * counts against --max-restarts (each agent counts the failures of the rounds it ran
 * in, so an agent that joined later counts fewer: not yet one count in the store); a late
 * agent ends it without counting. */
#ifndef TT_RDZV_H
#define TT_RDZV_H

#include <stddef.h>
#include <stdint.h>

#include <tutti/store.h>

typedef struct tt_rdzv {
    tutti_store_t *base, *store; /* store: the view tutti/elastic/<job>/ */
    const char *url;             /* the store's */
    int min_nodes, max_nodes, np;
    int last_call_ms; /* at MIN or more, how long the round waits for more agents */
    int timeout_ms;   /* how long an agent waits for a round to take it */
    int hosting;      /* this agent hosts the tcp store's server */
    /* the round joined (tt_rdzv_join) */
    int64_t round;
    int idx;              /* this agent's number: its node rank */
    int nodes;            /* agents in the round */
    int rank0;            /* the rank of this agent's first rank */
    int world;            /* ranks in the round */
    int rounds;           /* rounds this agent ran in */
    char master_addr[64]; /* the round's MASTER_ADDR/MASTER_PORT (torch's env://) */
    int master_port;
} tt_rdzv_t;

/* The host and port of a tcp:// or redis:// store URL (a redis one without a port:
 * 6379). 0, or -1 for another scheme or a malformed URL. */
int tt_store_url_host(const char *url, char *host, size_t hostlen, int *port);

/* A MASTER_ADDR and MASTER_PORT for torch's env:// rendezvous, on this host: the address
 * this host reaches the store's host from (127.0.0.1 for a file store, or when it is
 * on this host over loopback) and a port free there now. 0, or -1 (errno). */
int tt_master_pick(const char *store, char *addr, size_t addrlen, int *port);

/* Opens the store (a tcp:// one is hosted here when its port is free on this host, else
 * joined) and the job's view. 0, or -1 having said why. */
int tt_rdzv_open(tt_rdzv_t *z, const char *tool, const char *url, const char *job_id);

#define TT_RDZV_FINISHED                                                                           \
    1 /* tt_rdzv_join: the job ran through, or gave up (*why); with
                            * z->rounds 0, before this agent came (a new job reusing a
                            * finished one's id on a store that kept its keys) */

/* Waits for a round that takes this agent (late agents wait for the next). 0: z's round
 * fields are set (the round's first agent picks its master address and port); TT_RDZV_FINISHED; -1 on a timeout or a store failure. why: what
 * happened, for a message. */
int tt_rdzv_join(tt_rdzv_t *z, char *why, size_t whylen);

/* While the ranks run: 1 when the round has ended (its reason in why: another agent's
 * failure, or a late agent to take in), else 0; -1 when the store failed. */
int tt_rdzv_poll(tt_rdzv_t *z, char *why, size_t whylen);

/* Ends the round for a reason ("failure: ..." or "scale: ..."); the reason that stands
 * (maybe another agent's) comes back in why. Then the next round opens. 0 or -1. */
int tt_rdzv_end_round(tt_rdzv_t *z, const char *reason, char *why, size_t whylen);

/* This agent's ranks all exited 0: the job ran through. A hosting agent then waits
 * (bounded by the timeout) for the round's other agents, which need its store. */
void tt_rdzv_done(tt_rdzv_t *z);
/* Restarts used up: late agents stop too. */
void tt_rdzv_give_up(tt_rdzv_t *z, const char *why);

void tt_rdzv_close(tt_rdzv_t *z);

#endif
