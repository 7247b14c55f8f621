/* The communicator's options (opts.c). */
#ifndef TT_OPTS_H
#define TT_OPTS_H

#include <tutti/tutti.h>

/* The communicator's options: src's fields (NULL: all defaults) over the
 * defaults and the environment (read once), strings copied, limits applied. */
int tt_comm_opts_resolve(tutti_comm_opts_t *dst, const tutti_comm_opts_t *src);
void tt_comm_opts_free(tutti_comm_opts_t *opts);
/* The spin of an "auto" spin_us (a negative one, the default) for local_ranks ranks on
 * this host (this one among them) that may run on cpus CPUs between them. */
int tt_spin_auto_us(int local_ranks, int cpus);
/* TUTTI_BIND=auto holds the thread of a collective of this many bytes or more (its
 * whole buffer) on one CPU while this host is crowded (exec.c, bind_enter) */
#define TT_BIND_MIN_BYTES (128u << 10)
/* The default deadline of comm->qstore: a quarter of the timeout, within
 * 100..1000 ms. */
int tt_comm_quick_ms(const tutti_comm_t *comm);

#endif /* TT_OPTS_H */
