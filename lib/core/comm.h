/* The communicator's internal functions (the structs are in state.h): everything a
 * file above the executor needs, in one include. */
#ifndef TT_COMM_H
#define TT_COMM_H

#include <tutti/tutti.h>

#include "coll/algo.h"
#include "core/envelope.h"
#include "core/fault.h"
#include "core/opts.h"
#include "core/p2p.h"
#include "core/state.h"

/* host.c: comm->host, the callbacks a transport gets (before the transports open). */
void tt_comm_host_init(tutti_comm_t *comm);

/* exec.c: issue an op (blocking or async) */
/* layout: the block the op's layout arrays point into (or NULL). layout_heap: it was
 * malloc'ed, and the executor owns it from here on, also when this fails; else it is
 * the blocking caller's (on its stack), valid until this returns. op: the caller's,
 * which a blocking call runs in place (its seq and algorithm's fields filled in). The
 * caller refused a forked child's call already (coll_issue: tt_comm_foreign_inline). */
int tt_exec_issue(tutti_comm_t *comm, tt_op_t *op, tutti_redop_t user_redop, size_t *layout,
                  int layout_heap, tutti_work_t **work_p);
void *tt_exec_worker_main(void *arg);
/* exec.c: tutti_comm_destroy's wait, once it set `stopping` and joined the progress
 * thread: until no thread runs an op of comm or is inside a call on it. */
void tt_exec_drain(tutti_comm_t *comm);
/* exec.c: is this thread running a tutti_work_on_done callback of comm? (Then calls into
 * comm are refused.) */
int tt_exec_in_callback(const tutti_comm_t *comm);
/* exec.c: drop a reference to comm's struct (refs in state.h); the last frees the locks
 * and the memory (everything else is comm.c's to free before). */
void tt_exec_comm_unref(tutti_comm_t *comm);
struct tt_derived; /* lib/reduce/derived.h */
/* exec.c: queue a send (kind TUTTI_TP_SEND) or receive; arguments checked already, a
 * forked child's call refused (p2p_issue). held: dtype's derived type, where the caller
 * holds it (a persistent request; else it is looked up by value). upto: tutti_recv_upto's receive (count the
 * most it takes; 2: the blocking call's, waited for at once, not traced as async). */
int tt_exec_issue_p2p(tutti_comm_t *comm, int kind, void *buf, size_t count, tutti_dtype_t dtype,
                      int peer, uint32_t tag, int upto, tutti_work_t **work_p,
                      struct tt_derived *held);
/* exec.c: wait for an op issued async by a blocking call of the library's (until it
 * ends); its failure's explanation becomes the communicator's last error, as a blocking
 * call's. */
int tt_exec_wait_blocking(tutti_work_t *work);
/* exec.c: tutti_probe (once 0) and tutti_iprobe (once 1), arguments checked already: the
 * blocking look, through the queue as a receive of peer (or TUTTI_ANY_SOURCE) and tag
 * that is never posted; with msg_p (tutti_mprobe, tutti_improbe) the message found is
 * received into *msg_p. name: the call's, for its messages. */
int tt_exec_probe(tutti_comm_t *comm, const char *name, int peer, uint32_t tag, int once,
                  int *found_p, int *source_p, uint32_t *tag_p, size_t *count_p,
                  tutti_dtype_t *dtype_p, tutti_message_t **msg_p);
/* exec.c: free the sends to this rank that no receive took (comm.c's destroy). */
void tt_exec_self_free(tutti_comm_t *comm);

#endif /* TT_COMM_H */
