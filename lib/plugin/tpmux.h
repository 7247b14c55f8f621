/* Per-peer transport choice, and a multiplexer that presents several transports (shm
 * for the ranks on this host, tcp or ibverbs for the others) as one, through the same
 * ABI table, so the executor and the algorithms never know which one a peer uses. */
#ifndef TT_TPMUX_H
#define TT_TPMUX_H

#include <stddef.h>

#include <tutti/transport_v2.h>

typedef struct tutti_comm tutti_comm_t;

/* Learn which ranks share this host (through the store), pick a transport for each
 * peer from comm->opts.transport, load and create them. Sets comm->tp_ops, comm->tp
 * (NULL for a single rank), comm->tp_handle and comm->host. Errors go to err. */
int tt_transports_create(tutti_comm_t *comm, char *err, size_t errlen);

/* The host's config callback was asked for knob name (TUTTI_<name>) by a transport:
 * a plugin's knobs, once asked, may be in TUTTI_TRANSPORT_OPTIONS without a warning
 * (tt_transports_create checks its entries after set-up). */
void tt_transports_knob_asked(const char *name);

/* The properties of the transports comm uses, in the order tp_name names them ("shm+tcp":
 * shm's, then tcp's); returns how many (at most max). */
int tt_transports_props(const tutti_comm_t *comm, const tutti_tp_props_v2_t **props, int max);

/* What a transport spec (opts.transport, TUTTI_TRANSPORT) means, as "LOCAL,REMOTE" (the
 * transports for peers on this host and on others, LOCAL prefixed "auto:" where auto
 * chose it and may fall back to tcp: "auto" and "remote=tcp" are "auto:shm,tcp",
 * "local=shm" is "shm,tcp", "tcp" is "tcp,tcp"), without spaces; the spec itself when it cannot be read (set-up
 * then says why). Every rank of a job must mean the same: the job's instance record
 * carries rank 0's (lib/core/job.c). */
void tt_transport_canon(const char *spec, char *out, size_t len);

/* This process's host identity: TUTTI_HOST_ID / opts.host_id, else hostname and boot
 * id. */
void tt_host_id(const char *override, char *out, size_t len);

#endif
