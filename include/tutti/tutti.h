/* tutti: collective communication for CPU and GPU processes.
 *
 * One public header for the communicator and its collectives; the store API is in
 * <tutti/store.h> and the transport plugin ABI in <tutti/transport.h>.
 *
 * Every function returns a tutti status: 0 (TUTTI_OK) on success, a negative
 * TUTTI_ERR_* code otherwise. tutti_strerror() names a code and
 * tutti_comm_last_error() explains the last failure on a communicator.
 */
#ifndef TUTTI_TUTTI_H
#define TUTTI_TUTTI_H

#include <stddef.h>
#include <stdint.h>

#include <tutti/status.h>
#include <tutti/store.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Everything declared in the public headers is exported from libtutti.so (the library
 * builds with -fvisibility=hidden). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#define TUTTI_VERSION_MAJOR 0
#define TUTTI_VERSION_MINOR 1
#define TUTTI_VERSION_PATCH 0

typedef enum tutti_dtype {
    TUTTI_INT8 = 0,
    TUTTI_UINT8,
    TUTTI_INT32,
    TUTTI_INT64,
    TUTTI_FP16,
    TUTTI_BF16,
    TUTTI_FP32,
    TUTTI_FP64,
    TUTTI_DTYPE_COUNT
} tutti_dtype_t;

/* Reduction ops. fp16 and bf16 reduce in fp32. AVG divides the sum by the rank
 * count at the end (integer division, truncating, for integer types). */
typedef enum tutti_redop {
    TUTTI_SUM = 0,
    TUTTI_PROD,
    TUTTI_MIN,
    TUTTI_MAX,
    TUTTI_AVG,
    TUTTI_REDOP_COUNT
} tutti_redop_t;

/* Size in bytes of one element of dtype, 0 for an invalid dtype. */
size_t tutti_dtype_size(tutti_dtype_t dtype);
/* "f32", "bf16" ...; "?" for an invalid dtype. */
const char *tutti_dtype_name(tutti_dtype_t dtype);
/* "sum", "avg" ...; "?" for an invalid op. */
const char *tutti_redop_name(tutti_redop_t op);
/* Parse names as printed above (also "float", "int", "half", "double" ...). */
int tutti_dtype_parse(const char *name, tutti_dtype_t *dtype_p);
int tutti_redop_parse(const char *name, tutti_redop_t *op_p);

typedef struct tutti_comm tutti_comm_t;
typedef struct tutti_work tutti_work_t;

/* Pass as the send buffer to run a collective in place on the receive buffer
 * (passing the same pointer for both works too). */
#define TUTTI_IN_PLACE ((const void *)1)

/* Communicator options. Every field is also an environment variable, read by
 * tutti_comm_opts_init(); a field set afterwards wins over the environment. A string
 * field left NULL is taken from the environment at tutti_comm_init.
 * docs/configuration.md lists them all. Strings are copied at init. */
typedef struct tutti_comm_opts {
    size_t size;               /* sizeof(tutti_comm_opts_t), set by tutti_comm_opts_init */
    int timeout_ms;            /* TUTTI_TIMEOUT_MS: bound on every wait (default 30000) */
    const char *transport;     /* TUTTI_TRANSPORT: "tcp" (default) or a plugin name */
    const char *plugin_path;   /* TUTTI_PLUGIN_PATH: ':'-separated dirs searched for
                                  libtutti-transport-NAME.so */
    const char *algo;          /* TUTTI_ALGO: algorithm override, e.g.
                                  "allreduce:rd@<64K,ring;broadcast:tree" */
    const char *socket_ifname; /* TUTTI_SOCKET_IFNAME: "eth0,ib" prefixes, "^docker,lo"
                                  exclusions, "=eth0" exact names */
    int socket_family;         /* TUTTI_SOCKET_FAMILY: 0 any, 4 IPv4, 6 IPv6 */
    int socket_buffer_bytes;   /* TUTTI_SOCKET_BUFFER: SO_SNDBUF/SO_RCVBUF, 0 = kernel autotuning */
    int spin_us;               /* TUTTI_SPIN_US: busy-poll this long before blocking (default 50) */
    size_t chunk_bytes;        /* TUTTI_CHUNK_BYTES: pipelining chunk of ring/chain (default 1 MiB) */
    const char *prefix;        /* TUTTI_PREFIX: store key prefix of this communicator
                                  (default: "tutti/comm<N>/", N counting comms on the store) */
    int stall_check_ms;        /* TUTTI_STALL_CHECK_MS: a rank blocked this long in one op
                                  compares its op with the other ranks' through the store,
                                  so ranks deadlocked by mismatched calls fail with
                                  TUTTI_ERR_MISMATCH (default 1000; 0 disables) */
} tutti_comm_opts_t;

/* Fill opts with defaults, then with the TUTTI_* environment variables. */
int tutti_comm_opts_init(tutti_comm_opts_t *opts);

/* Create a communicator of `size` ranks through `store` (which must outlive the
 * communicator). Collective: every rank calls it; returns when all ranks are
 * connected or the timeout passes. opts may be NULL (defaults + environment). */
int tutti_comm_init(tutti_comm_t **comm_p, tutti_store_t *store, int rank, int size,
                    const tutti_comm_opts_t *opts);

/* Create a communicator from the environment: TUTTI_RANK, TUTTI_WORLD_SIZE and
 * TUTTI_STORE (file:///dir or tcp://host:port), or torchrun's RANK, WORLD_SIZE,
 * MASTER_ADDR and MASTER_PORT. With a tcp store, rank 0 hosts the store server unless
 * TUTTI_STORE_SERVER=0. The communicator owns the store it opened. */
int tutti_comm_init_env(tutti_comm_t **comm_p, const tutti_comm_opts_t *opts);

/* Wait for queued operations (each bounded by its deadline), then free everything.
 * Their errors are reported through their work handles, not here. */
int tutti_comm_destroy(tutti_comm_t *comm);

/* Fail every pending and future operation with TUTTI_ERR_ABORTED and return
 * promptly; thread-safe. The communicator must still be destroyed. */
int tutti_comm_abort(tutti_comm_t *comm);

int tutti_comm_rank(const tutti_comm_t *comm);
int tutti_comm_size(const tutti_comm_t *comm);

/* What went wrong last: op, sequence number, peer rank, address, errno. Never NULL;
 * "" when nothing failed. Valid until the next call on comm. */
const char *tutti_comm_last_error(const tutti_comm_t *comm);

/* Name of the transport the communicator uses ("tcp"). */
const char *tutti_comm_transport(const tutti_comm_t *comm);

/* Name of the algorithm the communicator would pick for a collective ("allreduce",
 * "broadcast", "barrier") of `bytes` bytes. */
const char *tutti_comm_algo_for(const tutti_comm_t *comm, const char *coll, size_t bytes);

/* Collectives. sendbuf may be TUTTI_IN_PLACE or equal to recvbuf. Blocking calls
 * return when this rank's part is done; the _async variants queue the operation
 * (several may be in flight; they run and complete in issue order) and return a
 * work handle. */
int tutti_allreduce(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                    tutti_dtype_t dtype, tutti_redop_t op);
int tutti_allreduce_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                          size_t count, tutti_dtype_t dtype, tutti_redop_t op,
                          tutti_work_t **work_p);

/* Root's sendbuf (or recvbuf, in place) reaches every rank's recvbuf. Non-roots
 * may pass sendbuf NULL. */
int tutti_broadcast(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                    tutti_dtype_t dtype, int root);
int tutti_broadcast_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                          size_t count, tutti_dtype_t dtype, int root, tutti_work_t **work_p);

int tutti_barrier(tutti_comm_t *comm);
int tutti_barrier_async(tutti_comm_t *comm, tutti_work_t **work_p);

/* Non-blocking check: *done_p = 1 and the operation's status once it finished,
 * *done_p = 0 and TUTTI_OK while it runs. */
int tutti_test(tutti_work_t *work, int *done_p);

/* Wait until the operation finishes or timeout_ms passes (-1: the communicator's
 * timeout). Returns the operation's status, or TUTTI_ERR_TIMEOUT if it still runs. */
int tutti_wait(tutti_work_t *work, int timeout_ms);

/* Release a work handle; safe while the operation is still running. */
void tutti_work_free(tutti_work_t *work);

/* The explanation of a finished operation's failure ("" if it succeeded). */
const char *tutti_work_error(const tutti_work_t *work);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* TUTTI_TUTTI_H */
