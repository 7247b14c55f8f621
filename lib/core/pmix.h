/* What a PMIx launcher (Open MPI's mpirun, prterun) knows of the job's ranks, asked of
 * the local PMIx server through the system's libpmix, loaded at run time (internal).
 *
 * Used where no store is named and the ranks span hosts: rank 0's host, where it serves
 * the job's store (as a Slurm step's first node does; tutti_store_open_env). */
#ifndef TT_PMIX_H
#define TT_PMIX_H

#include <stddef.h>

/* The host name of rank 0 of this process's PMIx namespace (PMIX_NAMESPACE, as the
 * launcher set it), as the launcher knows it (PMIX_HOSTNAME): 0 with the name in out,
 * or -1 with why not in why (no PMIx launch, libpmix.so.2 not found, the server did not
 * answer within timeout_ms, no host name given). */
int tt_pmix_rank0_host(char *out, size_t len, int timeout_ms, char *why, size_t whylen);

#endif
