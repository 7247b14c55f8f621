/* The cost model that picks algorithms: latency alpha (per message), beta (per byte on
 * the wire) and gamma (per byte reduced or copied locally), per transport from a table,
 * from a probe at init, or given by the user (TUTTI_COST_MODEL). Each algorithm has a
 * cost formula in those terms; the cheapest one for (collective, bytes, ranks) runs.
 * Every rank must pick the same algorithm, so the parameters are the same on every rank
 * (a table, the user's string, or probe results averaged by an allreduce). */
#ifndef TT_COST_H
#define TT_COST_H

#include <stddef.h>

#include <tutti/transport_v2.h>

#include "core/op.h"

typedef struct tt_cost {
    double alpha_us; /* per message: latency plus software overhead */
    double beta_ns;  /* per byte sent over the transport (1 / bandwidth) */
    double gamma_ns; /* per byte of vector reduced (or copied) in memory */
    char source[48]; /* "table tcp", "probe", "user" */
    /* For hier (tt_cost_set_hosts): the local transport's beta (shm's hint; 0: as
     * beta_ns), and the host map's shape: hosts (0: not known, one transport served
     * every peer), the fewest and the most ranks on one host. */
    double local_beta_ns;
    int nhosts, lmin, lmax;
    /* Rank 0's host as the spin counts it: its ranks and the CPUs they may run on (0:
     * not known). More ranks than CPUs is a crowded host: a message wakes a process that
     * must wait for a CPU, and the barrier's cost is its messages over the CPUs. */
    int host_ranks, host_cpus;
    /* Every part of the transport reaches only host-mates (TUTTI_TP_LOCAL_ONLY: shm): a
     * message is a store into memory its receiver polls, not a system call. */
    int local_only;
    char tune[256]; /* TUTTI_COST_MODEL's tune=FILE: measured choices over the model's */
    int agree_lag;  /* TUTTI_AGREE_LAG: 0 when rooted calls wait for their handshake */
} tt_cost_t;

/* The parameters from the transports' cost hints (ABI v2 properties): props[i] belongs
 * to the i-th part of transport's name ("shm+tcp"), the slowest part counts, and a part
 * without hints (or beyond n) counts as a socket transport (tcp's numbers). */
void tt_cost_from_props(tt_cost_t *c, const char *transport,
                        const tutti_tp_props_v2_t *const *props, int n);
/* The same for built-in transports by name ("tcp", "shm+tcp"; a part not built in
 * counts as tcp). */
void tt_cost_table(tt_cost_t *c, const char *transport);

/* The host map's shape from host_of[r] (rank r's host, 0 .. hosts - 1; NULL: not
 * known) into c. */
void tt_cost_set_hosts(tt_cost_t *c, const int *host_of, int nranks);

/* hier's step across hosts: 1 when recursive doubling beats the ring for an allreduce
 * of shard_bytes among nhosts ranks, `sharers` of which share each host's link. */
int tt_cost_hier_cross_rd(const tt_cost_t *c, size_t shard_bytes, int nhosts, int sharers,
                          size_t chunk);

/* hier's segments: a vector of `bytes` goes in this many pieces of at least
 * TT_HIER_SEG_BYTES (at most TT_HIER_MAX_SEGS), pipelined so that one piece crosses
 * hosts while the next is reduced and an earlier one spread within the host; 1 (no
 * pipeline) below two pieces' worth, with one host or more than TT_HIER_MAX_HOSTS,
 * or where recursive doubling takes the step across hosts. Every rank computes the
 * same from the same arguments. */
#define TT_HIER_SEG_BYTES ((size_t)4 << 20)
#define TT_HIER_MAX_SEGS 16
#define TT_HIER_MAX_HOSTS 64
int tt_cost_hier_segments(const tt_cost_t *c, size_t bytes, int nhosts, int sharers, size_t chunk);

/* Parse TUTTI_COST_MODEL's explicit form "alpha=10,bw=2,reduce=6" (µs, GB/s, GB/s; any
 * subset, the rest from c), with "table" (the rest) and "tune=FILE" (c->tune) as items.
 * A lone "probe" is handled by the caller. */
int tt_cost_parse(const char *spec, tt_cost_t *c, char *err, size_t errlen);

/* 1 when rank 0's host runs more ranks than it has CPUs (host_ranks, host_cpus) */
int tt_cost_crowded(const tt_cost_t *c);

/* Estimated microseconds of one algorithm (by name) of a collective. bytes is what
 * selection sees (the envelope's count times the element size): the vector for
 * allreduce/broadcast/reduce, the total for allgather and reduce_scatter, one rank's
 * block for gather/scatter/alltoall, 0 for the v-forms. chunk is the pipelining chunk
 * the executor would use. */
double tt_cost_estimate(const tt_cost_t *c, tt_coll_t coll, const char *algo, size_t bytes,
                        int nranks, size_t chunk);

/* The executor's pipelining chunk for a collective of `bytes` (exec.c uses it too). */
size_t tt_cost_chunk(size_t bytes, int nranks, size_t chunk_max);

/* Measure alpha, beta and gamma on this communicator (collective: every rank calls it):
 * barriers, ring shifts of 1 MiB, and the fp32 sum kernel; averaged over the ranks so
 * that all get the same parameters. */
int tt_cost_probe(tutti_comm_t *comm, tt_cost_t *c);

/* One line describing c ("tcp table: alpha 10 us, bw 2.00 GB/s, reduce 6.67 GB/s"). */
void tt_cost_describe(const tt_cost_t *c, char *buf, size_t len);

#endif
