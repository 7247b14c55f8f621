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

#include <tutti/export.h>

TUTTI_BEGIN_DECLS

#define TUTTI_VERSION_MAJOR 0
#define TUTTI_VERSION_MINOR 1
#define TUTTI_VERSION_PATCH 0
/* One number for comparisons, as NCCL_VERSION_CODE: 0.1.0 is 100, 1.2.3 is 10203. */
#define TUTTI_VERSION_CODE                                                                         \
    (TUTTI_VERSION_MAJOR * 10000 + TUTTI_VERSION_MINOR * 100 + TUTTI_VERSION_PATCH)

/* The version of the library loaded at run time (TUTTI_VERSION_CODE of the headers it
 * was built with; ncclGetVersion's), to tell it from the headers a program was compiled
 * against, and the same as "MAJOR.MINOR.PATCH". */
int tutti_version(void);
const char *tutti_version_string(void);

typedef enum tutti_dtype {
    TUTTI_INT8 = 0,
    TUTTI_UINT8,
    TUTTI_INT32,
    TUTTI_INT64,
    TUTTI_FP16,
    TUTTI_BF16,
    TUTTI_FP32,
    TUTTI_FP64,
    TUTTI_INT16, /* added after the first eight: their values stay */
    TUTTI_UINT16,
    TUTTI_UINT32,
    TUTTI_UINT64,
    TUTTI_COMPLEX64,  /* C's float _Complex (numpy's complex64, MPI_C_FLOAT_COMPLEX): real, */
    TUTTI_COMPLEX128, /* imaginary (two fp32, or fp64 for double _Complex) */
    TUTTI_FP8_E4M3,   /* OCP 8-bit floats (NCCL's ncclFloat8e4m3/e5m2, torch's float8_e4m3fn */
    TUTTI_FP8_E5M2,   /* and float8_e5m2): E4M3 has no infinity (max 448), E5M2 has one */
    /* MPI's value-index pairs for TUTTI_MINLOC and TUTTI_MAXLOC, laid out as this C
     * compiler lays out the structs (padding included; the sizes on x86-64 and aarch64):
     * { float; int } (MPI_FLOAT_INT, 8 bytes), { double; int } (MPI_DOUBLE_INT, 16),
     * { int64_t; int } (MPI_LONG_INT on LP64, 16), { int; int } (MPI_2INT, 8),
     * { int16_t; int } (MPI_SHORT_INT, 8); int is int32_t */
    TUTTI_FLOAT_INT,
    TUTTI_DOUBLE_INT,
    TUTTI_LONG_INT,
    TUTTI_2INT,
    TUTTI_SHORT_INT,
    TUTTI_DTYPE_COUNT,
    /* derived types (tutti_type_vector ... below) take values from here to
     * TUTTI_DTYPE_USER_LAST */
    TUTTI_DTYPE_USER_FIRST = 256,
    TUTTI_DTYPE_USER_LAST = 256 + 4095
} tutti_dtype_t;

/* Reduction ops. fp16 and bf16 reduce in fp32 a step at a time: each combination of two
 * vectors computes in fp32 and rounds back, so a sum over more than two ranks depends on
 * the algorithm's grouping (as NCCL's; every rank still gets the same bits). AVG divides
 * the sum by the rank count at the end (integer division, truncating, for integer types,
 * of the sum as it wrapped: an 8- or 16-bit mean whose sum overflows the type comes out
 * wrong, as with NCCL's ncclAvg: reduce a wider type); fp16's AVG scales
 * each input by 2^-k first (2^k the least power of two >= the rank count) and the sum by
 * 2^k / ranks at the end (allreduce, reduce, reduce_scatter, scan, exscan: there the ranks
 * the prefix holds), so that a mean that fits
 * fp16 does not overflow where the sum would (NCCL's ncclAvg scales by 1/ranks first);
 * inputs below 2^-14 * 2^k lose bits to fp16's subnormal range on the way. Every rank
 * gets the same bits from allreduce, floats included, except the sign and payload of a
 * NaN that SUM or PROD made of two NaNs (the elements that are NaN agree). Integer SUM and
 * PROD wrap (two's complement); unsigned types compare (MIN/MAX) and divide (AVG) as
 * unsigned. Float MIN/MAX propagate NaN: a NaN on any rank gives
 * NaN in that element (as torch.max and numpy.maximum do, unlike C's fmax); infinities
 * order as usual (MIN of -inf and x is -inf); +0 and -0 compare equal, so which of them
 * a MIN/MAX of both returns depends on the algorithm's order of operands.
 * BAND, BOR and BXOR (MPI_BAND/BOR/BXOR, torch's ReduceOp.BAND/BOR/BXOR) combine the
 * bits of integer dtypes; LAND, LOR and LXOR (MPI_LAND/LOR/LXOR) their truth (nonzero):
 * 1 or 0 in the dtype where two or more values met (a lone one, as one rank's allreduce
 * or rank 0's scan, comes back as it was, as MPI's); with a float dtype a call of any of the six fails with
 * TUTTI_ERR_INVALID_ARG naming the op and the dtype (tutti_redop_supported says
 * beforehand).
 * The fp8 dtypes reduce as NCCL's do (CUDA's satfinite conversions): each step in fp32,
 * rounded to nearest even, a result beyond the largest finite value (+-448 for E4M3,
 * +-57344 for E5M2; an E5M2 infinity too) saturating to it, NaN staying NaN (torch's own
 * casts give NaN or inf there instead); MIN/MAX return an operand as it is (an E5M2
 * infinity stays one) and propagate NaN as the other float dtypes (NCCL's fp8 MIN/MAX
 * return the other operand and round an infinity to 57344); AVG scales the inputs
 * first as fp16's does (above), and fp8's range is narrower: inputs below 2^-6 * 2^k
 * (E4M3) or 2^-14 * 2^k (E5M2) lose bits on the way, down to 0 (E4M3 at 8 ranks: below
 * 0.125; NCCL's 1/ranks scaling loses them too); AVG a wider dtype where small means
 * matter.
 * The complex dtypes reduce with SUM, PROD and AVG (MPI's rule: MIN, MAX and the bitwise
 * ops fail as above); SUM and AVG are their parts' fp32/fp64 sums (and quotients), PROD the
 * textbook (ar*br - ai*bi) + (ar*bi + ai*br)i in the parts' precision, without C99 Annex
 * G's recovery of infinities from NaN results (as numpy's and Open MPI's products).
 * MINLOC and MAXLOC (MPI's) reduce the value-index pair dtypes, and those dtypes reduce
 * with nothing else: the pair with the least (greatest) value wins, and of pairs with
 * equal values, the least index (values and indexes as MPI's; the same pair on every
 * rank whatever the algorithm's order). A float NaN value wins both (as MIN/MAX
 * propagate NaN), the least index among NaNs; +0 and -0 compare equal (the index
 * decides, then either zero may come back). Typical use: each rank puts (its value,
 * its rank) in, and every rank learns the extreme value and which rank held it. */
typedef enum tutti_redop {
    TUTTI_SUM = 0,
    TUTTI_PROD,
    TUTTI_MIN,
    TUTTI_MAX,
    TUTTI_AVG,
    TUTTI_BAND,
    TUTTI_BOR,
    TUTTI_BXOR,
    TUTTI_MINLOC, /* MPI_MINLOC, MPI_MAXLOC: of the value-index pair dtypes only */
    TUTTI_MAXLOC,
    TUTTI_LAND, /* MPI_LAND, MPI_LOR, MPI_LXOR: of the integer dtypes */
    TUTTI_LOR,
    TUTTI_LXOR,
    TUTTI_REDOP_COUNT,
    /* ops the caller defines (tutti_redop_create) take values from here to
     * TUTTI_REDOP_USER_LAST */
    TUTTI_REDOP_USER_FIRST = 128,
    TUTTI_REDOP_USER_LAST = 255
} tutti_redop_t;

/* Size in bytes of one element of dtype, 0 for an invalid dtype; a derived type's
 * (tutti_type_vector ...) is its values' bytes, packed (MPI_Type_size; its extent:
 * tutti_type_extent). */
size_t tutti_dtype_size(tutti_dtype_t dtype);
/* "f32", "bf16" ...; "?" for an invalid dtype. */
const char *tutti_dtype_name(tutti_dtype_t dtype);
/* "sum", "avg" ...; a defined op's name ("user128" unless given one), "user<N>" for a
 * value of the defined ops' range not defined now; "?" for any other value. */
const char *tutti_redop_name(tutti_redop_t op);
/* Parse names as printed above (also "float", "int", "half", "double" ...). */
int tutti_dtype_parse(const char *name, tutti_dtype_t *dtype_p);
int tutti_redop_parse(const char *name, tutti_redop_t *op_p);
/* 1 if collectives reduce dtype with op (a derived type: as the one predefined dtype it is
 * made of, 0 for a mixed one; every op but MINLOC and MAXLOC reduces the
 * integer dtypes; BAND, BOR, BXOR, LAND, LOR and LXOR no float dtype; MINLOC and MAXLOC the value-index
 * pairs only, which nothing else reduces; a defined op, below, every dtype), 0 if not or
 * either is out of range (or op is not defined). */
int tutti_redop_supported(tutti_redop_t op, tutti_dtype_t dtype);
/* MPI_Reduce_local: inoutbuf[i] = inbuf[i] op inoutbuf[i] for i < count, on this rank
 * alone, with the kernels (and a defined op, in that argument order) the collectives use.
 * Not AVG (a mean of two is not what a mean of all ranks needs). Errors are the thread's,
 * read with tutti_comm_last_error(NULL) (it has no communicator). Host memory. A derived
 * type of one predefined dtype reduces through packed copies of both operands, its result
 * unpacked into inoutbuf's map. */
int tutti_reduce_local(const void *inbuf, void *inoutbuf, size_t count, tutti_dtype_t dtype,
                       tutti_redop_t op);

/* A reduction the caller defines (MPI_Op_create, Gloo's custom reduce function):
 * dst[i] = a[i] op b[i] for i < count, elements of dtype, where a holds the lower ranks'
 * part (for an op that does not commute). dst may be a or b; a and b never overlap
 * otherwise. Buffers may be unaligned (memcpy the elements in and out, or reduce a
 * dtype of 1 byte). The function runs on whichever thread drives the collective (the
 * caller's, or the communicator's executor for async calls), for any slice of the
 * vector (a whole number of elements), and must not call tutti. It must be
 * associative: the algorithms group the operands as they go. A structure of 2, 4 or 8
 * bytes reduces as one element of an integer dtype of that size (a value and its index,
 * for an argmax); a wider one cannot be reduced (slices may cut it). */
typedef void (*tutti_redop_fn)(void *dst, const void *a, const void *b, size_t count,
                               tutti_dtype_t dtype, void *ctx);
#define TUTTI_REDOP_COMMUTATIVE 1 /* flags: the op commutes (a op b == b op a) */
/* Defines an op: *op_p takes a value in [TUTTI_REDOP_USER_FIRST, TUTTI_REDOP_USER_LAST]
 * (the lowest free), good for every collective that reduces (allreduce, reduce,
 * reduce_scatter(v), scan, exscan, their async forms, tutti_allreduce_coalesced) with
 * any dtype.
 * Every rank of a call must pass the same value (define ops in the same order
 * everywhere, as with MPI); ranks that disagree fail the call as for any other op.
 * Without TUTTI_REDOP_COMMUTATIVE, the result is x0 op x1 op ... op x(n-1) in rank
 * order: the call then runs an algorithm that keeps that order (linear, through rank 0
 * or the root, which holds n - 1 vectors of scratch; scan and exscan keep it in every
 * algorithm) whatever the model or TUTTI_ALGO would pick (tutti_comm_algo_for does not know the op and names the model's pick);
 * with it, any algorithm.
 * name (may be NULL; up to 31 bytes kept) is what messages call the op. Thread-safe.
 * TUTTI_ERR_INVALID_ARG for a NULL op_p or fn or unknown flags, TUTTI_ERR_NOMEM when
 * every value is taken (by ops defined now, or freed ones that calls in flight hold). */
int tutti_redop_create(tutti_redop_t *op_p, tutti_redop_fn fn, void *ctx, unsigned flags,
                       const char *name);
/* Frees a defined op: later calls with it fail with TUTTI_ERR_INVALID_ARG; calls
 * already issued with it (async ones still queued) still run it, and its value is made
 * again by tutti_redop_create only once they completed. TUTTI_ERR_INVALID_ARG if op is
 * not a defined op. */
int tutti_redop_free(tutti_redop_t op);
/* MPI_Op_commutative: *commute_p 1 for the built-in ops and the defined ones made with
 * TUTTI_REDOP_COMMUTATIVE, else 0; TUTTI_ERR_INVALID_ARG for no op (a freed one). */
int tutti_redop_commutative(tutti_redop_t op, int *commute_p);

/* Derived datatypes, MPI's (MPI_Type_contiguous, _vector, _create_hvector, _indexed,
 * _create_hindexed, _create_indexed_block, _create_struct, _create_subarray,
 * _create_resized, _dup, _free, _get_extent, _get_true_extent; MPI_Pack, MPI_Unpack):
 * a type is a map of where an element's values lie relative to its address, built from
 * older types (predefined or derived), and *newtype_p a value in [TUTTI_DTYPE_USER_FIRST,
 * TUTTI_DTYPE_USER_LAST] that every call taking a dtype accepts in its place: sends and
 * receives (also sendrecv, recv_upto, mrecv, persistent requests), and every collective
 * (their v forms, async and persistent ones included), with counts and displacements in
 * elements of the type (element i at buf + i * extent). No commit step: a type is ready
 * when made. A call packs what it sends into a contiguous copy when it is issued and
 * unpacks what it received when it completes, writing only the bytes the type's map
 * covers (the columns of a matrix beside a column received are left as they were).
 * On the wire a derived type is its values: n elements of a type made of one
 * predefined dtype (a vector of f64, a struct of f32 fields) go as n * k elements of that
 * dtype (k: per element), so that a rank receiving them as that many plain elements,
 * or as another type of the same values, matches (MPI's type signatures); a type of
 * mixed dtypes goes as bytes (its size each), matched by byte count. Reductions take a
 * derived type of one predefined dtype, reduced element by element of that dtype (a
 * defined op sees that dtype, and counts of it); a mixed one fails with
 * TUTTI_ERR_INVALID_ARG. Host memory only (device buffers: TUTTI_ERR_UNSUPPORTED); not
 * the fuser's calls. tutti_dtype_size gives a type's size (MPI_Type_size: the bytes of
 * its values, packed), tutti_dtype_name "type 257 (vector of f64)" (text that changes
 * once the type is freed and its value made again). A receive's count
 * (tutti_work_count, tutti_recv_upto's) is in whole elements of the type: the values of
 * a last partial element that came are unpacked but not counted (MPI_Get_count would
 * say MPI_UNDEFINED). Types are the
 * process's, as MPI's: make them in the same order on every rank only where their values
 * must agree (they need not: values are not compared, signatures are). Thread-safe.
 * Errors are the thread's (tutti_comm_last_error(NULL)): TUTTI_ERR_INVALID_ARG for an
 * old type that is none, NULL arrays with a count, displacements that overflow, a map of
 * more than 16 Mi separate runs, an extent of 0 with data; TUTTI_ERR_NOMEM when all 4096
 * values are taken. A displacement may be negative (an element's values before its
 * address). */
/* count elements of oldtype back to back */
int tutti_type_contiguous(size_t count, tutti_dtype_t oldtype, tutti_dtype_t *newtype_p);
/* count blocks of blocklen elements, block i at i * stride elements of oldtype's extent
 * (a matrix column: count rows, blocklen 1, stride the row length) */
int tutti_type_vector(size_t count, size_t blocklen, ptrdiff_t stride, tutti_dtype_t oldtype,
                      tutti_dtype_t *newtype_p);
/* the same, the stride in bytes */
int tutti_type_hvector(size_t count, size_t blocklen, ptrdiff_t stride_bytes, tutti_dtype_t oldtype,
                       tutti_dtype_t *newtype_p);
/* block i of blocklens[i] elements at displs[i] elements of oldtype's extent */
int tutti_type_indexed(size_t count, const size_t *blocklens, const ptrdiff_t *displs,
                       tutti_dtype_t oldtype, tutti_dtype_t *newtype_p);
/* the same, displacements in bytes */
int tutti_type_hindexed(size_t count, const size_t *blocklens, const ptrdiff_t *displs_bytes,
                        tutti_dtype_t oldtype, tutti_dtype_t *newtype_p);
/* blocks of blocklen elements each at displs[i] elements */
int tutti_type_indexed_block(size_t count, size_t blocklen, const ptrdiff_t *displs,
                             tutti_dtype_t oldtype, tutti_dtype_t *newtype_p);
/* block i of blocklens[i] elements of types[i] at displs_bytes[i] (a C struct's fields:
 * offsetof); its extent is padded up to its fields' largest alignment, as C pads the
 * struct; where a field's type was resized (or is a subarray), its bounds are the
 * struct's instead (MPI's sticky bounds: how a struct's extent is set) */
int tutti_type_struct(size_t count, const size_t *blocklens, const ptrdiff_t *displs_bytes,
                      const tutti_dtype_t *types, tutti_dtype_t *newtype_p);
#define TUTTI_ORDER_C 0       /* the last index varies fastest (MPI_ORDER_C) */
#define TUTTI_ORDER_FORTRAN 1 /* the first does (MPI_ORDER_FORTRAN) */
/* the block [starts, starts + subsizes) of an ndims-dimensional array of sizes (1 to 32
 * dimensions): its extent is the whole array's, its lower bound 0 */
int tutti_type_subarray(int ndims, const size_t *sizes, const size_t *subsizes,
                        const size_t *starts, int order, tutti_dtype_t oldtype,
                        tutti_dtype_t *newtype_p);
/* oldtype's map with lower bound lb and extent (element i then at buf + i * extent) */
int tutti_type_resized(tutti_dtype_t oldtype, ptrdiff_t lb, size_t extent,
                       tutti_dtype_t *newtype_p);
int tutti_type_dup(tutti_dtype_t oldtype, tutti_dtype_t *newtype_p);
/* The value is free for tutti_type_* again at once; calls issued with it (async ones
 * still running) and types made from it are not affected. TUTTI_ERR_INVALID_ARG if type
 * is not a defined type. */
int tutti_type_free(tutti_dtype_t type);
/* MPI_Type_get_extent (lower bound and extent: element i at i * extent) and
 * MPI_Type_get_true_extent (the bytes an element's values span); a predefined dtype's
 * are 0 and its size. Either pointer may be NULL. */
int tutti_type_extent(tutti_dtype_t type, ptrdiff_t *lb_p, size_t *extent_p);
int tutti_type_true_extent(tutti_dtype_t type, ptrdiff_t *lb_p, size_t *extent_p);
/* MPI_Pack / MPI_Unpack: incount elements of type at inbuf packed into outbuf at
 * *position_p (which moves on by tutti_dtype_size(type) * incount); and back. A buffer too
 * small is TUTTI_ERR_INVALID_ARG (nothing written). MPI_Pack_size is count *
 * tutti_dtype_size(type). */
int tutti_pack(const void *inbuf, size_t incount, tutti_dtype_t type, void *outbuf, size_t outsize,
               size_t *position_p);
int tutti_unpack(const void *inbuf, size_t insize, size_t *position_p, void *outbuf,
                 size_t outcount, tutti_dtype_t type);

typedef struct tutti_comm tutti_comm_t;
typedef struct tutti_work tutti_work_t;

/* Pass as the send buffer to run a collective in place on the receive buffer. For
 * allreduce, broadcast, reduce, reduce_scatter and alltoall, passing the same pointer
 * for both means the same. Not for allgather and gather: there TUTTI_IN_PLACE says
 * "this rank's block is already at its place in recvbuf", while a sendbuf that overlaps
 * recvbuf anywhere (points into it, recvbuf itself included, or runs into it from below)
 * is read as an ordinary send buffer (its block is copied out, as memmove would, before
 * any other block lands on it); likewise a scatter
 * root's recvbuf inside sendbuf is written after every block has left. Buffers that
 * overlap in other ways are refused (TUTTI_ERR_INVALID_ARG), as is alltoallv with one
 * pointer for both and two layouts. reduce_scatter(v) also takes NCCL's in-place form,
 * recvbuf at this rank's block of sendbuf (sendbuf + rank * recvcount): the result lands
 * there and the other blocks are left as they were. Each rank chooses for itself: some
 * ranks of one call may run in place and the others not. The marker where a call takes
 * a buffer (a receive buffer, a send's buffer, a non-root's in-place reduce or scatter)
 * is refused, naming the argument. Receive layouts (allgatherv, gatherv's root,
 * alltoallv) whose non-empty blocks overlap are refused too (MPI calls them erroneous:
 * the result would depend on arrival order); send layouts may read a block twice. */
#define TUTTI_IN_PLACE ((const void *)1)
/* Pass as the root's receive buffer of a scatter to leave its own block in sendbuf. */
#define TUTTI_IN_PLACE_OUT ((void *)1)

/* Communicator options. Every field is also an environment variable, read by
 * tutti_comm_opts_init(); a field set afterwards wins over the environment. A string
 * field left NULL is taken from the environment at tutti_comm_init.
 * docs/configuration.md lists them all. Strings are copied at init. */
typedef struct tutti_comm_opts {
    size_t size;               /* sizeof(tutti_comm_opts_t), set by tutti_comm_opts_init */
    int timeout_ms;            /* TUTTI_TIMEOUT_MS: bound on every wait (default 30000) */
    const char *transport;     /* TUTTI_TRANSPORT: "auto" (default: shm for ranks on this
                                  host, tcp for the others), a transport name or plugin
                                  path for every peer, or "local=NAME,remote=NAME" */
    const char *plugin_path;   /* TUTTI_PLUGIN_PATH: ':'-separated dirs searched for
                                  libtutti-transport-NAME.so */
    const char *algo;          /* TUTTI_ALGO: algorithm override, e.g.
                                  "allreduce:rd@<64K,ring;broadcast:tree" */
    const char *socket_ifname; /* TUTTI_SOCKET_IFNAME: "eth0,ib" prefixes, "^docker,lo"
                                  exclusions, "=eth0" exact names */
    int socket_family;         /* TUTTI_SOCKET_FAMILY: 0 any, 4 IPv4, 6 IPv6 */
    int socket_buffer_bytes;   /* TUTTI_SOCKET_BUFFER: SO_SNDBUF/SO_RCVBUF, 0 = kernel autotuning */
    int spin_us;               /* TUTTI_SPIN_US: busy-poll this long before blocking; < 0
                                  (default, TUTTI_SPIN_US unset or "auto"): 200 where this
                                  host's ranks have a CPU each, else 50 */
    size_t chunk_bytes;     /* TUTTI_CHUNK_BYTES: pipelining chunk of ring/chain (default 1 MiB) */
    const char *prefix;     /* TUTTI_PREFIX: store key prefix of this communicator
                                  (default: "tutti/comm<N>/", N counting comms on the store) */
    int stall_check_ms;     /* TUTTI_STALL_CHECK_MS: a rank blocked this long in one op
                                  compares its op with the other ranks' through the store,
                                  so ranks deadlocked by mismatched calls fail with
                                  TUTTI_ERR_MISMATCH (default 1000; 0 disables) */
    const char *host_id;    /* TUTTI_HOST_ID: ranks with the same id share a host (and
                                  shm); default hostname + kernel boot id */
    const char *cost_model; /* TUTTI_COST_MODEL: parameters of the model that picks
                                  algorithms: "table" (default: per transport), "probe"
                                  (measured at init, averaged over the ranks), or
                                  "alpha=<us>,bw=<GB/s>,reduce=<GB/s>" (any subset) */
    const char *transport_options; /* TUTTI_TRANSPORT_OPTIONS: the transports' own knobs
                                      as "NAME=VALUE,..." with NAME the variable without
                                      TUTTI_ ("SHM_RING_BYTES=1M,IB_DEV=mlx5_0"); a knob
                                      not listed comes from its TUTTI_ variable */
    /* ---- appended in 0.2 (older callers' smaller structs keep working) ---- */
    const char *job_id;          /* TUTTI_JOB_ID: the job this rank belongs to (default: a
                                  launcher's id: tutti-run, Slurm, torchrun, Open MPI,
                                  PMIx; else none). Ranks of different jobs never meet,
                                  even on one store */
    const char *auth_token;      /* TUTTI_AUTH_TOKEN: the job secret; the store server and
                                  every connection set-up check that peers know it
                                  (challenge-response: it never travels) */
    const char *auth_token_file; /* TUTTI_AUTH_TOKEN_FILE: a file holding the secret */
    const char *checksum;        /* TUTTI_CHECKSUM: "crc32c" checks every payload on
                                  links that can corrupt (tcp); "none" (default) */
    int job_settle_ms;           /* TUTTI_JOB_SETTLE_MS: without a job id, set-up waits
                                  until its job instance is this old (default 250), so
                                  that another id-less job starting on the same store
                                  at about the same time is caught, not mixed in */
    int defer_us;                /* TUTTI_DEFER_US: while the caller waits for its async
                                  ops as soon as it issues them, they run on its own
                                  thread when it waits (no hand-off to the progress
                                  thread); the progress thread runs one nobody waited
                                  for after this long (default 200; 0: never defer) */
    int agree_lag;               /* TUTTI_AGREE_LAG: rooted collectives (broadcast,
                                  reduce, gather, scatter) check that every rank agreed
                                  on the call with messages that up to this many later
                                  calls may overtake (default 64): a disagreement a
                                  rank's own data did not reveal fails its next call,
                                  naming the earlier one. 0: each call waits for its
                                  check, so every rank of a mismatched call fails in it
                                  (a round trip more per call) */
    const char *bind;            /* TUTTI_BIND: "auto" (default): while this host's ranks
                                  outnumber the CPUs they may run on (and each may run
                                  on all of them), an allreduce, allgather or
                                  reduce-scatter of 128 KiB or more runs
                                  with its thread held on one CPU, the ranks spread over
                                  the CPUs in host order, and the thread's own mask
                                  back when it returns; "none": never */
    /* ---- the flight recorder (tutti_comm_trace_dump) ---- */
    int trace_entries;     /* TUTTI_TRACE_ENTRIES: how many of the communicator's last
                              operations it keeps, with their state (default 1024; 0:
                              none) */
    const char *trace_dir; /* TUTTI_TRACE_DIR: where each rank writes that record when
                              its communicator first fails (a timeout, a dead peer,
                              mismatched calls): <dir>/<comm>.rank<r>.json, which
                              tutti-trace reads (default: not written) */
    /* ---- device buffers ---- */
    const char *cuda;      /* TUTTI_CUDA: "auto" (default): where this process has loaded the
                         CUDA driver (libcuda.so.1) by the time the communicator is made,
                         every call takes device pointers (cudaMalloc'ed) as well as host
                         ones, staged through host memory as a CUDA-aware MPI does; "on":
                         load the driver (the init fails without one); "off": every
                         pointer is host memory */
    int stream_timeout_ms; /* TUTTI_STREAM_TIMEOUT_MS: how long a stream-ordered call
                              (tutti_comm_set_stream) waits for its stream to reach it,
                              through the work queued there before it, before it fails
                              with TUTTI_ERR_TIMEOUT on every rank (default 600000, 10
                              min, as PyTorch's NCCL watchdog; < 0: no bound, as NCCL) */
    /* ---- TLS on the tcp transport's links (Gloo's tcp_tls): set all of cert, key and a
     * CA source, or none; each connection then runs a TLS handshake (1.2 or later) in
     * which both ends present a certificate the other verifies against its CAs (the
     * chain, not the peer's name or address: ranks are told apart by the hello and, with
     * a job secret, its proof), and every byte after it travels encrypted. Every rank
     * must agree: one with TLS and one without fail set-up naming both. Built without
     * OpenSSL, setting them fails with TUTTI_ERR_UNSUPPORTED. ---- */
    const char *tls_cert;    /* TUTTI_TLS_CERT (or GLOO_DEVICE_TRANSPORT_TCP_TLS_CERT):
                                this rank's certificate (chain), PEM */
    const char *tls_key;     /* TUTTI_TLS_KEY (or ..._TLS_PKEY): its private key, PEM */
    const char *tls_ca_file; /* TUTTI_TLS_CA_FILE (or ..._TLS_CA_FILE): the CAs that
                                verify the peers' certificates, PEM */
    const char *tls_ca_path; /* TUTTI_TLS_CA_PATH (or ..._TLS_CA_PATH): a directory of
                                them (c_rehash'ed), instead of or beside the file */
} tutti_comm_opts_t;

/* Fill opts with defaults, then with the TUTTI_* environment variables. */
int tutti_comm_opts_init(tutti_comm_opts_t *opts);

/* Create a communicator of `size` ranks through `store` (which must outlive the
 * communicator). Collective: every rank calls it; returns when all ranks are
 * connected or the timeout passes. opts may be NULL (defaults + environment).
 * Communicators made through one store handle are numbered in the order of these calls
 * (their key spaces on the store), so every rank must create them in the same order, as
 * MPI's communicator constructors require: threads that create communicators at the
 * same time on one handle give each a distinct opts.prefix (TUTTI_PREFIX) instead. */
int tutti_comm_init(tutti_comm_t **comm_p, tutti_store_t *store, int rank, int size,
                    const tutti_comm_opts_t *opts);

/* Create a communicator from the environment (tutti_store_open_env): the communicator
 * owns the store it opened. */
int tutti_comm_init_env(tutti_comm_t **comm_p, const tutti_comm_opts_t *opts);

/* NCCL's bootstrap (ncclGetUniqueId, ncclCommInitRank): one process makes an id, the
 * program hands its bytes to every rank by its own means (MPI_Bcast, a file, an
 * argument), and each rank calls tutti_comm_init_rank with it. The id holds a tcp store
 * that its maker serves (an embedded server on an address of this host chosen as the
 * tcp transport's: TUTTI_SOCKET_IFNAME, TUTTI_SOCKET_FAMILY), a random job secret that
 * guards that store and every link (only holders of the id get in) and a random job id
 * (two ids' ranks never mix). The maker serves it until tutti_unique_id_release (or its
 * exit), and while a communicator it made from the id lives; the communicators of every
 * rank use it for their lifetime (splits, shrinks, failure reports), so keep the maker's
 * process up until they are destroyed, as rank 0's embedded store server of
 * tutti_comm_init_env. Errors (no interface, bad id, a store not reachable within the
 * timeout) are the thread's, read with tutti_comm_last_error(NULL). */
#define TUTTI_UNIQUE_ID_BYTES 128
typedef struct tutti_unique_id {
    char internal[TUTTI_UNIQUE_ID_BYTES];
} tutti_unique_id_t;
int tutti_get_unique_id(tutti_unique_id_t *id);
/* Rank `rank` of nranks joins the id's job: tutti_comm_init through the id's store, with
 * the id's job id and secret (opts' own where it names them; opts may be NULL). The
 * communicator owns its store handle (as tutti_comm_init_env's). */
int tutti_comm_init_rank(tutti_comm_t **comm_p, int nranks, const tutti_unique_id_t *id, int rank,
                         const tutti_comm_opts_t *opts);
/* ncclCommInitAll: every rank of a job of n in this process (a thread or a device each):
 * comms[r] is rank r's communicator, all made at once through a unique id this call makes
 * (and releases: each communicator holds its store up). Drive them from a thread each,
 * or with the _async calls and tutti_wait_all: a blocking call on one waits for the
 * others' matching calls. On a failure none is left (those made are destroyed), and
 * the thread's error names the rank that failed and why. */
int tutti_comm_init_all(tutti_comm_t **comms, int n, const tutti_comm_opts_t *opts);
/* The maker stops serving the id's store once its own communicators made from it are
 * destroyed (TUTTI_ERR_INVALID_ARG for an id this process did not make, or released). */
int tutti_unique_id_release(const tutti_unique_id_t *id);

/* The job the environment describes: this process's rank and the rank count, and the
 * store opened (the caller closes it). The rank and size come as a pair from the first
 * launcher that sets both: TUTTI_RANK/TUTTI_WORLD_SIZE, torchrun's RANK/WORLD_SIZE (these
 * two mix, variable by variable), Open MPI's OMPI_COMM_WORLD_RANK/_SIZE, PMI_RANK/PMI_SIZE
 * (mpiexec of MPICH and Intel MPI), and in a Slurm job step (SLURM_STEP_ID set)
 * SLURM_PROCID/SLURM_STEP_NUM_TASKS. The store: TUTTI_STORE (file:///dir or
 * tcp://host:port), else torchrun's MASTER_ADDR and MASTER_PORT, rank 0 hosting a tcp
 * store's server unless TUTTI_STORE_SERVER=0; else, for ranks an MPI launcher or srun
 * placed whose launcher says every rank is on this host (OMPI_COMM_WORLD_LOCAL_SIZE,
 * MPI_LOCALNRANKS, a step on one node) and whose job has an id (TUTTI_JOB_ID, mpirun's,
 * Slurm's job and step, or MPICH's hydra proxy at the other end of PMI_FD), a tcp store
 * on 127.0.0.1 hosted by rank 0, at a port taken from the job id and the launch's own
 * (PMIx namespace, Slurm step, hydra proxy); across hosts, a Slurm step's first node
 * or (Open MPI's mpirun) rank 0's host as the launcher's PMIx server names it, hosted
 * there by rank 0 at that port. opts (may be NULL) gives
 * the job id and the auth token, and the store's deadline where TUTTI_STORE_TIMEOUT_MS is
 * unset: opts->timeout_ms (with opts NULL, 30000, whatever TUTTI_TIMEOUT_MS says). Fails with TUTTI_ERR_CONFIG naming what is
 * missing (tutti_comm_last_error(NULL)). */
int tutti_store_open_env(tutti_store_t **store_p, int *rank_p, int *size_p,
                         const tutti_comm_opts_t *opts);

/* Pass as color to tutti_comm_split to take part without joining a new communicator
 * (any negative color does the same). */
#define TUTTI_SPLIT_NOCOLOR (-1)

/* Split comm (MPI_Comm_split, ncclCommSplit): collective over comm, every rank calls it
 * (in the same order as its other collectives on comm). The ranks that pass the same
 * color form a new communicator, *newcomm_p, ranked by key (ties: by rank in comm); a
 * rank passing TUTTI_SPLIT_NOCOLOR gets NULL. The new communicator has comm's options
 * (timeout, transport, algorithms, job id and secret, checksum...) and its own
 * connections, and meets through comm's store in a key space of its own: beside comm's
 * job instance, named by that instance, the count of splits of comm before this one
 * and the color, so colors and repeated splits never meet (its keys go when its last
 * rank destroys it, as a communicator's do). Communicators may be destroyed in any
 * order: the new one holds a reference to comm's store, which closes (for
 * tutti_comm_init_env, which owns it) when the last of them is destroyed, or (for a
 * caller's store) at the last of the caller's tutti_store_close and those destroys.
 * Bounded by comm's timeout; a rank that does not call it makes the others fail with
 * TUTTI_ERR_TIMEOUT or TUTTI_ERR_MISMATCH. */
int tutti_comm_split(tutti_comm_t *comm, int color, int key, tutti_comm_t **newcomm_p);
/* tutti_comm_split with the new communicator's own options (ncclCommSplit's config):
 * opts as tutti_comm_init's (NULL: the parent's, as tutti_comm_split), but the job id
 * and secret stay the parent's (the new one lives in its key space and trust). The
 * ranks of a color must pass options that agree as an init's must (its set-up checks
 * them). */
int tutti_comm_split_opts(tutti_comm_t *comm, int color, int key, const tutti_comm_opts_t *opts,
                          tutti_comm_t **newcomm_p);

/* tutti_comm_split_type's type: the ranks of one host (MPI_COMM_TYPE_SHARED: those
 * that share memory), as the host map knows them (TUTTI_HOST_ID overrides a host's
 * identity). */
#define TUTTI_SPLIT_TYPE_HOST 1
/* MPI_Comm_split_type: split comm by what the ranks share, type TUTTI_SPLIT_TYPE_HOST:
 * a communicator of this rank's host's ranks, ranked by key (ties: by rank in comm), as
 * tutti_comm_split's (whose rules it follows: collective over comm, bounded by its
 * timeout). TUTTI_SPLIT_NOCOLOR (any negative type) takes part and gets NULL. Every rank
 * sees every rank's type: one of another value fails the call on every rank
 * (TUTTI_ERR_INVALID_ARG naming that rank and its type). */
int tutti_comm_split_type(tutti_comm_t *comm, int type, int key, tutti_comm_t **newcomm_p);

/* Duplicate comm (MPI_Comm_dup): a new communicator of the same ranks in the same order,
 * with comm's options and connections of its own, whose calls never meet comm's (a
 * library's traffic kept apart from its caller's). tutti_comm_split with one color and
 * each rank's own rank as key: collective over comm, bounded by its timeout. */
int tutti_comm_dup(tutti_comm_t *comm, tutti_comm_t **newcomm_p);

/* Shrink comm (ncclCommShrink, MPI_Comm_shrink with the failed ranks named): a new
 * communicator, *newcomm_p, of comm's ranks but the nexclude ones in exclude, keeping
 * their order (new rank = rank among those left). Made through comm's store only, never
 * through comm's connections, so it works on a communicator that failed or was aborted:
 * after a rank died, the others name it (tutti_comm_last_error says which rank failed)
 * and go on without it. Collective over the ranks left, which must pass the same set
 * (in any order): each checks that through the store first, and a rank whose set
 * differs makes every rank that sees it fail at once with TUTTI_ERR_MISMATCH naming
 * both sets. The excluded ranks do not call it (one that does gets
 * TUTTI_ERR_INVALID_ARG). Options, store reference and key space as for
 * tutti_comm_split (its own: "<instance>-shrink<count>/"); bounded by comm's timeout.
 * comm stays as it was: destroy it as usual. */
int tutti_comm_shrink(tutti_comm_t *comm, const int *exclude, int nexclude,
                      tutti_comm_t **newcomm_p);

/* A process forked after a communicator was made (a DataLoader worker, a fork() without
 * exec) shares its parent's sockets, rings and store keys but none of its threads: the
 * communicator is the parent's. Every call on it in the child (collectives, send/recv,
 * tutti_wait, tutti_test and tutti_work_on_done on its works, split, shrink, grow,
 * agree, revoke, abort, set_stream, trace_dump, the fuser's and coalesced calls) fails
 * with TUTTI_ERR_INVALID_ARG and "communicator made by pid X used in pid Y, a forked
 * child: ..." (tutti_comm_last_error, on that thread), touching nothing shared: no lock,
 * store key, socket or ring. In the child tutti_comm_destroy does nothing and returns
 * TUTTI_ERR_INVALID_ARG (logged at info level: a C++ global destructor or an interpreter's
 * finalization may call it there), and tutti_work_free leaves the work: the copies stay
 * in the child's memory. A child makes its own communicator. The child's copies of the tcp
 * transport's sockets are closed at the fork (a pthread_atfork handler), so that a
 * parent's death shows at once to its peers while the child lives. */

/* Wait for queued operations (each bounded by its deadline), then for the agreement
 * messages of earlier rooted calls still due to or from peers: a broadcast's root
 * returns once its sends are out, and may get here while the other ranks still work
 * through its calls and confirm them to it. That wait lasts until they do, at most the
 * communicator's timeout (then a warning is logged, and the peers are not told);
 * tutti_comm_abort ends it, and a communicator that failed or was aborted does not wait.
 * Then everything is freed. Errors are reported through the work handles and the log,
 * not here. May be called from another thread than one blocked in a call on comm (a
 * watchdog: tutti_comm_abort, then tutti_comm_destroy): it waits until every thread
 * running an operation of comm, or inside tutti_wait on one of its works, has
 * returned (after an abort, at once). An operation on comm that another thread begins
 * while the destroy runs fails with TUTTI_ERR_INVALID_ARG, so such a thread must stop
 * calling on its first error (tutti_comm_last_error included): once this returns, comm
 * is freed, and any call on it is undefined (work handles stay valid, see
 * tutti_work_free). Not from a tutti_work_on_done callback of comm
 * (TUTTI_ERR_INVALID_ARG). */
int tutti_comm_destroy(tutti_comm_t *comm);

/* Fail every pending and future operation with TUTTI_ERR_ABORTED and return
 * promptly; thread-safe (any thread, the usual watchdog: abort, let the blocked call
 * return, destroy). The communicator must still be destroyed. Not async-signal-safe (it
 * takes the communicator's locks and logs, as tutti_comm_revoke does): a signal that
 * lands while this thread holds them in a call of its own deadlocks if its handler calls
 * it. From a signal (SIGTERM, SIGALRM) call it on a thread that waits for the signal
 * (sigwait, signalfd) or that the handler wakes through a pipe. Local, as ncclCommAbort
 * is (not MPI_Abort): the other ranks are not told, and those waiting on this one fail
 * at their timeout; tutti_comm_revoke tells them at once. */
int tutti_comm_abort(tutti_comm_t *comm);

/* MPIX_Comm_shrink: a shrink without naming the ranks to leave out: the ranks that call
 * it agree, through the store, on which of them are here, and the others (dead, hung,
 * or later than wait_ms after this rank came; -1: a quarter of the timeout) are left out
 * as tutti_comm_shrink would. Every caller gets the same set; one that came after the
 * others agreed without it fails with TUTTI_ERR_TIMEOUT saying so. */
int tutti_comm_shrink_live(tutti_comm_t *comm, int wait_ms, tutti_comm_t **newcomm_p);

/* MPIX_Comm_agree: the ranks that call it agree, through the store alone (so it works on
 * a communicator that failed, was revoked or aborted), on the bitwise AND of their
 * *flag_p and on which ranks were absent: dead, hung, or later than wait_ms after this
 * rank came (-1: a quarter of the timeout). Every caller gets the same *flag_p (the AND
 * over the ranks counted; a rank left out counts for nothing) and the same absent ranks,
 * ascending, in absent[0..*nabsent_p) (absent: room for the communicator's size, or NULL;
 * nabsent_p may be NULL). TUTTI_OK when every rank took part; TUTTI_ERR_PEER, with
 * *flag_p and the absent ranks set all the same, when some did not (as MPIX_Comm_agree
 * returns MPIX_ERR_PROC_FAILED): the ranks that called it can then take the same path,
 * e.g. tutti_comm_shrink(comm, absent, nabsent, ...). A rank that came after the others
 * agreed without it gets TUTTI_ERR_TIMEOUT saying so, and nothing set. The ranks call it
 * the same number of times on comm (the calls pair up in order), one at a time (not from
 * two threads at once); a call's store keys go at the next call every rank came to, or
 * with the communicator's. */
int tutti_comm_agree(tutti_comm_t *comm, int wait_ms, uint32_t *flag_p, int *absent,
                     int *nabsent_p);

/* Grow the communicator (ncclCommGrow): every rank of comm calls it with the new size;
 * processes not in comm call tutti_comm_join to fill the places size - nranks. The ranks
 * of comm keep their numbers, the new ones get nranks.. size-1 in the order they come.
 * comm stays as it was. Rank 0 publishes a ticket under the job's key space ("tutti/job/
 * <id>/grow", TUTTI_PREFIX in place of "tutti"), so the new processes need the same job
 * id (TUTTI_JOB_ID or a launcher's), store and options; they may come before or after the
 * grow began, within the timeout. Communicators of one job (one prefix and job id) that
 * grow at once share that ticket and take turns: each grow waits, within its timeout,
 * for the places of the one before it to fill. */
int tutti_comm_grow(tutti_comm_t *comm, int size, tutti_comm_t **newcomm_p);
/* A new process's side of tutti_comm_grow: wait (opts->timeout_ms) for the job's ticket,
 * take the next free rank, and make the grown communicator through store (the store the
 * job's communicators use). A process that finds every place taken waits, as a spare,
 * for the next grow (TUTTI_ERR_TIMEOUT when none begins in time); tutti_comm_last_error
 * (NULL) says why it failed. */
int tutti_comm_join(tutti_comm_t **comm_p, tutti_store_t *store, const tutti_comm_opts_t *opts);

/* Revoke the communicator on every rank (MPIX_Comm_revoke): this rank's pending and
 * future operations fail with TUTTI_ERR_REVOKED at once, and every other rank's pending
 * operation, or its next one that waits on a peer, fails with TUTTI_ERR_REVOKED too,
 * naming this rank: the revocation goes to this rank's peers over its links as a failure
 * report, and each rank it fails passes it on to its own peers; it is also in the store,
 * where a blocked rank's stall check (stall_check_ms; a collective's, or that of a send or
 * receive in flight while no collective runs) finds it should a report not reach it: a
 * rank reads a link only while a request of its own uses it, so a rank blocked in a
 * receive from a hung rank alone hears no report. With stall checks off (stall_check_ms
 * 0) only the reports carry the revocation: such a rank fails at its own timeout (with
 * TUTTI_ERR_TIMEOUT), not with TUTTI_ERR_REVOKED. For a rank that finds a peer dead or hung, so that the others stop waiting on it;
 * then tutti_comm_shrink makes a communicator without it. Thread-safe (any thread, any
 * number of times), returns promptly (one bounded store write and a bounded send), but
 * not concurrent with tutti_comm_destroy, nor from a signal handler (as for
 * tutti_comm_abort); the communicator must still be destroyed.
 * TUTTI_OK, also when it had failed already (its failure is what the peers then see). */
int tutti_comm_revoke(tutti_comm_t *comm);

/* The flight recorder: write the communicator's last opts.trace_entries operations
 * (collectives, sends, receives: sequence number, arguments, algorithm, state issued /
 * started / completed / failed, times) and its failure if any, as one JSON document, to
 * fd. Any thread, any time (also after a failure, before destroy). tutti-trace reads
 * the records of several ranks and says where they part: the first call not every rank
 * made, calls that differ, sends nobody received. TUTTI_ERR_IO when writing fails. */
int tutti_comm_trace_dump(tutti_comm_t *comm, int fd);

int tutti_comm_rank(const tutti_comm_t *comm);
int tutti_comm_size(const tutti_comm_t *comm);

/* The device memory the communicator's calls take besides host memory: "CUDA" (opts.cuda,
 * TUTTI_CUDA), or NULL where every pointer must be host memory (as MPIX_Query_cuda_support
 * tells an MPI program). */
const char *tutti_comm_device(const tutti_comm_t *comm);

/* ncclCommGetAsyncError (torch's Backend::getError): whether the communicator has failed,
 * without a call that fails: TUTTI_OK while it is usable, else the status of its first
 * failure (a timeout, a dead or hung peer, mismatched calls, a revoke;
 * TUTTI_ERR_ABORTED after tutti_comm_abort), which every later call fails with, and in
 * msg (len bytes; may be NULL) that failure's explanation. Sticky. A failure is found
 * by this rank's own calls: a rank that issues nothing learns of a peer's death at its
 * next call. TUTTI_ERR_INVALID_ARG for a NULL comm or a forked child's copy. */
int tutti_comm_get_async_error(const tutti_comm_t *comm, char *msg, size_t len);

/* The communicator's timeout (opts.timeout_ms, as init resolved it), or as
 * tutti_comm_set_timeout last set it; TUTTI_ERR_INVALID_ARG for a NULL comm. */
int tutti_comm_timeout(const tutti_comm_t *comm);

/* The bound on the waits of the calls issued on comm from here on (collectives,
 * send/recv, and what comm-level calls such as tutti_comm_split and tutti_comm_shrink
 * wait for), as gloo's Context::setTimeout and torch's _set_pg_timeout; calls issued
 * before keep the timeout they were issued with, so one call can have its own: set,
 * issue, set back (gloo's per-call option), from the issuing thread. Each rank sets its
 * own: where ranks differ, each call fails at the earliest of its ranks' bounds (the
 * others then hear why), as with different TUTTI_TIMEOUT_MS. Communicators split from
 * comm later inherit it; the store's own bound and the transports' own set-up bounds (a
 * lazy link's connect, set at init) stay. timeout_ms > 0, else TUTTI_ERR_INVALID_ARG
 * (waits are always bounded). Thread-safe. */
int tutti_comm_set_timeout(tutti_comm_t *comm, int timeout_ms);

/* Stream-ordered calls, as NCCL's (and MPICH's MPIX_*_enqueue, cuBLAS's handle stream):
 * with a stream set (a CUstream / cudaStream_t of the device's, or CU_STREAM_LEGACY,
 * (void *)1), a blocking collective whose buffers include device memory (managed memory,
 * cudaMallocManaged's, counts as device memory here, as in NCCL; elsewhere, without a
 * stream or in an _async call, it is host memory, read in place) returns once it
 * is enqueued on that stream: it reads its input when the stream's earlier work is done,
 * and the stream's later work sees its result. Synchronise the stream (or record an
 * event) before reading the result on the host. The call's own errors (arguments) are
 * returned at the call as before; an error while the op runs is kept for
 * tutti_comm_stream_error (the stream goes on; the result is then undefined), and where
 * it failed the communicator, later calls fail as they would without a stream.
 * Host-buffer calls (and calls mixing host and device memory: the stream's work so far
 * is waited for first), the _async calls and send/recv run as without a stream. A
 * stream being captured into a CUDA graph is refused (TUTTI_ERR_UNSUPPORTED). A call
 * that its stream has not reached within opts.stream_timeout_ms (stream-ordered, or
 * waiting for the stream first) fails with TUTTI_ERR_TIMEOUT (on every rank; the stream
 * goes on past it). Such a call, once its own stream has reached it, waits for its peers
 * up to opts.timeout_ms + opts.stream_timeout_ms (no bound where the latter is < 0),
 * since a peer's stream may reach the call that much later; a peer whose call of it is
 * not stream-ordered (host buffers only, no stream set, an _async call) waits
 * opts.timeout_ms, as for any call, so make the call alike on every rank. NULL
 * unsets. TUTTI_ERR_NO_DEVICE without a device layer (tutti_comm_device() NULL);
 * TUTTI_ERR_DEVICE where the stream cannot be used (another device's, or a driver that
 * cannot make a stream wait on host memory). Set it from the thread that makes the
 * calls, between calls. */
int tutti_comm_set_stream(tutti_comm_t *comm, void *stream);

/* The first failure of a stream-ordered call since the stream was set (its message in
 * tutti_comm_last_error), or TUTTI_OK. Does not wait for the stream. */
int tutti_comm_stream_error(tutti_comm_t *comm);

/* What went wrong last: op, sequence number, peer rank, address, errno. Never NULL;
 * "" when nothing failed. A copy in this thread's own storage, valid until this thread's
 * fourth tutti_comm_last_error after it: tutti_comm_abort and tutti_comm_revoke, which
 * any thread may call, replace the communicator's message (so may a failing call on
 * another thread), never a copy already handed out; ask on the thread whose call failed,
 * right after it, for that call's message. With comm NULL: why this
 * thread's last tutti_comm_init or tutti_comm_init_env failed (a failed set-up leaves no
 * communicator to ask; "" if it succeeded), valid until this thread's next one. */
const char *tutti_comm_last_error(const tutti_comm_t *comm);

/* Transport(s) the communicator uses: "tcp", "shm", or "shm+tcp" when local and
 * remote peers use different ones. */
const char *tutti_comm_transport(const tutti_comm_t *comm);

/* The cost model's parameters, one line: "probe: alpha 9.80 us, bw 2.10 GB/s, reduce
 * 6.20 GB/s". */
const char *tutti_comm_cost_model(const tutti_comm_t *comm);

/* Name of the algorithm the communicator would pick for a collective ("allreduce",
 * "broadcast", "barrier", "reduce", "allgather", "reduce_scatter", "gather", "scatter",
 * "alltoall", "scan", "exscan") of `bytes` bytes (for the v-forms the library selects
 * with 0). */
const char *tutti_comm_algo_for(const tutti_comm_t *comm, const char *coll, size_t bytes);

/* The i-th algorithm (from 0, in the order they were added) this library has for a
 * collective named as above: what TUTTI_ALGO=coll:name accepts. NULL past the last one
 * and for a collective it does not know. */
const char *tutti_algo_name(const char *coll, int i);

/* Does spec, in TUTTI_ALGO's syntax ("ring", "allreduce:rd@<64K,ring;broadcast:tree"),
 * choose an algorithm for the collective coll (named as above)? 1 if it does, 0 if it
 * parses but chooses none for coll (a bare name coll has no algorithm of), or
 * TUTTI_ERR_CONFIG with why in err when it does not parse (TUTTI_ERR_INVALID_ARG for a
 * NULL spec or an unknown coll). What tutti_comm_init would say, asked beforehand. */
int tutti_algo_spec_sets(const char *spec, const char *coll, char *err, size_t errlen);

/* Collectives. sendbuf may be TUTTI_IN_PLACE or equal to recvbuf. Blocking calls
 * return when this rank's part is done; the _async variants queue the operation
 * (several may be in flight; they run and complete in issue order) and return a
 * work handle. The calls of a communicator pair up across ranks by their issue order:
 * every rank must issue its collectives on a communicator in the same order. Threads
 * that share one may call it at once (it is thread-safe), but then each rank's order is
 * whichever thread took the queue first, which differs between ranks: calls of the same
 * shape then silently combine different threads' data (wrong results, different on each
 * rank). So threads that share a communicator must serialize their issuing (a lock, or
 * one issuing thread), as MPI requires; or use a communicator per thread
 * (tutti_comm_split). TUTTI_ERR_MISMATCH catches only calls that differ in shape
 * (collective, count, dtype, op, root), not a swap of two alike. */
int tutti_allreduce(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                    tutti_dtype_t dtype, tutti_redop_t op);
int tutti_allreduce_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                          tutti_dtype_t dtype, tutti_redop_t op, tutti_work_t **work_p);

/* Root's sendbuf (or recvbuf, in place) reaches every rank's recvbuf. Non-roots
 * may pass sendbuf NULL. */
int tutti_broadcast(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                    tutti_dtype_t dtype, int root);
int tutti_broadcast_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                          tutti_dtype_t dtype, int root, tutti_work_t **work_p);

int tutti_barrier(tutti_comm_t *comm);
int tutti_barrier_async(tutti_comm_t *comm, tutti_work_t **work_p);

/* ---- The other collectives (MPI and NCCL semantics; counts in elements). Layout
 * arrays (counts, displacements) have one entry per rank and are copied at the call,
 * so they need not outlive it. Each has an _async form like allreduce's. ---- */

/* Reduce every rank's sendbuf into the root's recvbuf (count elements). In place at
 * the root: sendbuf TUTTI_IN_PLACE (or == recvbuf). recvbuf is ignored elsewhere. */
int tutti_reduce(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                 tutti_dtype_t dtype, tutti_redop_t op, int root);
int tutti_reduce_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                       tutti_dtype_t dtype, tutti_redop_t op, int root, tutti_work_t **work_p);

/* Every rank's sendcount elements, in rank order, into every rank's recvbuf
 * (nranks * sendcount). In place: sendbuf TUTTI_IN_PLACE, this rank's block already at
 * recvbuf + rank * sendcount. */
int tutti_allgather(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                    tutti_dtype_t dtype);
int tutti_allgather_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                          tutti_dtype_t dtype, tutti_work_t **work_p);
/* Rank i contributes recvcounts[i] elements, landing at recvbuf + displs[i] (displs NULL:
 * back to back). In place: this rank's block already at its place in recvbuf. */
int tutti_allgatherv(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                     const size_t *recvcounts, const size_t *displs, tutti_dtype_t dtype);
int tutti_allgatherv_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                           const size_t *recvcounts, const size_t *displs, tutti_dtype_t dtype,
                           tutti_work_t **work_p);

/* sendbuf holds nranks blocks of recvcount elements; rank i gets the reduction of every
 * rank's block i. In place: sendbuf TUTTI_IN_PLACE, the input is recvbuf (all blocks) and
 * the result goes to its start. */
int tutti_reduce_scatter(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                         tutti_dtype_t dtype, tutti_redop_t op);
int tutti_reduce_scatter_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                               size_t recvcount, tutti_dtype_t dtype, tutti_redop_t op,
                               tutti_work_t **work_p);
/* Blocks of recvcounts[i] elements, back to back in rank order. */
int tutti_reduce_scatterv(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                          const size_t *recvcounts, tutti_dtype_t dtype, tutti_redop_t op);
int tutti_reduce_scatterv_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                                const size_t *recvcounts, tutti_dtype_t dtype, tutti_redop_t op,
                                tutti_work_t **work_p);

/* Prefix reductions (MPI_Scan, MPI_Exscan): rank i's recvbuf gets the reduction of
 * ranks 0..i's sendbufs (scan) or of ranks 0..i-1's (exscan; rank 0's recvbuf is not
 * written), count elements, always in rank order (x0 op x1 op ...: an op that does not
 * commute needs no other algorithm). In place: sendbuf TUTTI_IN_PLACE (or == recvbuf).
 * TUTTI_AVG divides by the number of ranks reduced (i + 1, or i). */
int tutti_scan(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
               tutti_dtype_t dtype, tutti_redop_t op);
int tutti_scan_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                     tutti_dtype_t dtype, tutti_redop_t op, tutti_work_t **work_p);
int tutti_exscan(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                 tutti_dtype_t dtype, tutti_redop_t op);
int tutti_exscan_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                       tutti_dtype_t dtype, tutti_redop_t op, tutti_work_t **work_p);

/* Every rank's sendcount elements into the root's recvbuf, in rank order. In place at
 * the root: sendbuf TUTTI_IN_PLACE, its block already in recvbuf. */
int tutti_gather(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                 tutti_dtype_t dtype, int root);
int tutti_gather_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                       tutti_dtype_t dtype, int root, tutti_work_t **work_p);
/* Rank i sends sendcount elements, landing at the root's recvbuf + displs[i] (displs
 * NULL: back to back); recvcounts and displs matter at the root only. */
int tutti_gatherv(tutti_comm_t *comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                  const size_t *recvcounts, const size_t *displs, tutti_dtype_t dtype, int root);
int tutti_gatherv_async(tutti_comm_t *comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                        const size_t *recvcounts, const size_t *displs, tutti_dtype_t dtype,
                        int root, tutti_work_t **work_p);

/* The root's sendbuf, nranks blocks of recvcount elements: block i to rank i's recvbuf.
 * In place at the root: recvbuf TUTTI_IN_PLACE_OUT (its block stays in sendbuf). */
int tutti_scatter(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                  tutti_dtype_t dtype, int root);
int tutti_scatter_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                        tutti_dtype_t dtype, int root, tutti_work_t **work_p);
/* Block i: sendcounts[i] elements at sendbuf + displs[i] (the root's arrays only). */
int tutti_scatterv(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                   const size_t *displs, void *recvbuf, size_t recvcount, tutti_dtype_t dtype,
                   int root);
int tutti_scatterv_async(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                         const size_t *displs, void *recvbuf, size_t recvcount, tutti_dtype_t dtype,
                         int root, tutti_work_t **work_p);

/* Block j of sendbuf (count elements) to rank j; block from rank i to recvbuf block i.
 * In place: sendbuf TUTTI_IN_PLACE, blocks exchanged within recvbuf. */
int tutti_alltoall(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                   tutti_dtype_t dtype);
int tutti_alltoall_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                         tutti_dtype_t dtype, tutti_work_t **work_p);
/* sendcounts[j] elements at sendbuf + sdispls[j] to rank j; recvcounts[i] elements from
 * rank i to recvbuf + rdispls[i] (displacements NULL: back to back). */
int tutti_alltoallv(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                    const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                    const size_t *rdispls, tutti_dtype_t dtype);
int tutti_alltoallv_async(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                          const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                          const size_t *rdispls, tutti_dtype_t dtype, tutti_work_t **work_p);

/* Point to point. Receives match by peer and tag, as MPI's and Gloo's: a receive takes
 * the first message from its peer with its tag that no earlier receive took (messages
 * of one tag from one rank in the order sent; other tags are left to their receives,
 * whatever order those are posted in). It must name the same count and dtype as that
 * message, or it fails with TUTTI_ERR_MISMATCH naming both; the sender's rank, whose
 * send may already be done, gets the mismatch at its next call. A receive of a tag
 * never sent ends with TUTTI_ERR_TIMEOUT naming the peer and tag. Sends and receives
 * never hold up the communicator's queue: post them async in any order (send then
 * receive on both sides is fine) and wait. Apart from the collectives: a point-to-point
 * message is taken only by a point-to-point receive, so a send may stay outstanding over
 * collectives its peer enters first, and a receive may be posted before collectives
 * whose messages come first. A message that comes while only receives of other tags (or
 * a collective's) wait is read aside into a buffer of the transport's and copied out
 * when its receive comes, as MPI keeps unexpected messages: bounded by memory only
 * (the transports' channels, transport_v2.h TUTTI_TP_CHANNELS; session 101). A plugin
 * transport without channels carries everything in one order: there a message must be
 * received at the same place among the collectives, and in the same tag order, as it
 * was sent, else TUTTI_ERR_MISMATCH naming both calls. peer may be this rank
 * itself, as in NCCL and MPI (a torch batch_isend_irecv all-to-all sends to itself): the
 * send is copied at its turn and done (a blocking send before its receive does not wait,
 * as MPI_Bsend), and receives from itself take the copies by tag, checked as any (also
 * on a communicator of one rank; an any-source receive takes them too). */
int tutti_send(tutti_comm_t *comm, const void *buf, size_t count, tutti_dtype_t dtype, int peer,
               uint32_t tag);
int tutti_send_async(tutti_comm_t *comm, const void *buf, size_t count, tutti_dtype_t dtype,
                     int peer, uint32_t tag, tutti_work_t **work_p);
/* peer may be TUTTI_ANY_SOURCE: the receive takes the first message, from whichever
 * rank, that carries its tag (as MPI_ANY_SOURCE with a tag), and tutti_work_source says
 * who sent it. A message with its tag but another count or dtype is
 * TUTTI_ERR_MISMATCH; messages with other tags are left to the receives they belong
 * to (read aside to look past them); a rank's messages of the tag are taken in the
 * order it sent them. A message goes to the earliest receive issued that can take it,
 * as MPI's: a receive from a named rank issued while an any-source receive of its tag
 * still looks waits for it (it takes that rank's next message after the any-source
 * one's). Bounded by the communicator's
 * timeout (TUTTI_ERR_TIMEOUT: no rank sent that tag); a rank whose link failed (say,
 * it exited) does not fail it while others are left, but a failed communicator does.
 * Needs a transport that can probe (tcp, shm, ibverbs; else TUTTI_ERR_UNSUPPORTED). */
#define TUTTI_ANY_SOURCE (-2)
/* MPI_PROC_NULL, as any call's peer (send, receive, sendrecv, probe): done at once,
 * moving nothing, as the edge ranks of a halo exchange need. A receive from it leaves
 * its buffer as it was: tutti_work_source says TUTTI_PROC_NULL, tutti_work_count 0; a
 * probe finds a message of 0 x TUTTI_UINT8 from TUTTI_PROC_NULL (*flag_p 1), and
 * tutti_mrecv of mprobe's takes it with any count and dtype. */
#define TUTTI_PROC_NULL (-3)
/* MPI_ANY_TAG, as the tag of a receive (tutti_recv, tutti_recv_upto, tutti_sendrecv's
 * recvtag) or a probe: it takes the first message from its peer (or from any rank, with
 * TUTTI_ANY_SOURCE) that no receive issued before it takes, whatever its tag, in the
 * order that rank sent them; tutti_work_info, tutti_probe_info and
 * tutti_message_info say which tag it had. As MPI's: a message goes to the earliest
 * receive issued that can take it (a receive of tag 5 issued first takes the tag-5
 * message, the any-tag one the next), and a receive from a named rank of a named tag
 * issued after an any-tag one from that rank waits for it to find its message first. The
 * message's count and dtype must be the receive's (else TUTTI_ERR_MISMATCH, as a named
 * tag's), but for tutti_recv_upto's bound. A tag sends cannot use; needs a transport
 * that can probe for any key (tcp, shm, ibverbs: TUTTI_TP_PROBE_ANY; else
 * TUTTI_ERR_UNSUPPORTED). */
#define TUTTI_ANY_TAG UINT32_MAX
int tutti_recv(tutti_comm_t *comm, void *buf, size_t count, tutti_dtype_t dtype, int peer,
               uint32_t tag);
int tutti_recv_async(tutti_comm_t *comm, void *buf, size_t count, tutti_dtype_t dtype, int peer,
                     uint32_t tag, tutti_work_t **work_p);
/* MPI_Recv's count as a bound, with MPI_Get_count: the next message from peer (or
 * TUTTI_ANY_SOURCE) with tag, of at most max_count elements of dtype, into buf (the rest
 * of it untouched); *count_p (may be NULL) is the count it had, as tutti_work_count
 * says for the async form. Its dtype must be dtype, but for a receive of TUTTI_UINT8,
 * which takes a message of any dtype by its bytes (as MPI_BYTE does in practice, and
 * Gloo's byte buffers): then the count is in bytes. A message that does not fit (more
 * elements, another dtype) is TUTTI_ERR_MISMATCH naming both, and is not taken: the
 * communicator goes on, and a receive with room takes it. In the receives' order as an
 * any-source receive is: a later receive of its peer and tag waits for it. It looks for
 * its message before it posts its receive (as tutti_mprobe does, then straight into buf,
 * no copy): a transport that can probe (tcp, shm, ibverbs), host memory only. */
int tutti_recv_upto(tutti_comm_t *comm, void *buf, size_t max_count, tutti_dtype_t dtype, int peer,
                    uint32_t tag, size_t *count_p);
int tutti_recv_upto_async(tutti_comm_t *comm, void *buf, size_t max_count, tutti_dtype_t dtype,
                          int peer, uint32_t tag, tutti_work_t **work_p);
/* MPI_Sendrecv: a send to dest and a receive from source (or TUTTI_ANY_SOURCE; *source_p,
 * which may be NULL, says who sent) at once, so that ranks exchanging with each other
 * (a ring shift, a halo) cannot block on their sends, whatever the size. Returns when
 * both are done: the receive's failure first, then the send's. The buffers must not
 * overlap (tutti_sendrecv_replace is the one-buffer form: it sends buf's contents and
 * receives into it, through a copy of count elements). */
int tutti_sendrecv(tutti_comm_t *comm, const void *sendbuf, size_t sendcount,
                   tutti_dtype_t sendtype, int dest, uint32_t sendtag, void *recvbuf,
                   size_t recvcount, tutti_dtype_t recvtype, int source, uint32_t recvtag,
                   int *source_p);
int tutti_sendrecv_replace(tutti_comm_t *comm, void *buf, size_t count, tutti_dtype_t dtype,
                           int dest, uint32_t sendtag, int source, uint32_t recvtag, int *source_p);
/* MPI_Probe: wait until a message of tag from peer (or TUTTI_ANY_SOURCE) has come that
 * a receive issued now would take, and take nothing: its sender, and its count and
 * dtype as sent, go to *source_p, *count_p and *dtype_p (each may be NULL), so that a
 * receive of the right size follows (tutti_recv from *source_p with that tag: it takes
 * this message, as MPI's, where no other thread receives meanwhile). In the receives'
 * order: a probe behind an any-source receive of its tag still looking waits for it, and
 * one behind receives still open from its peer sees the message after the ones they
 * take. Bounded by the communicator's timeout: TUTTI_ERR_TIMEOUT, and the communicator
 * goes on (the probe took nothing). Needs a transport that can probe (as
 * TUTTI_ANY_SOURCE). */
int tutti_probe(tutti_comm_t *comm, int peer, uint32_t tag, int *source_p, size_t *count_p,
                tutti_dtype_t *dtype_p);
/* MPI_Iprobe: one look, as tutti_probe's: *flag_p 1 and the rest filled where such a
 * message has come, else 0 (then the rest untouched). Each look moves the links along
 * (a slice of progress), so one polled in a loop sees the message once it came. Not
 * quite local as MPI's: like every call on comm it runs in issue order, after the
 * calls queued before it (an _async collective still waiting for its peers, say). */
int tutti_iprobe(tutti_comm_t *comm, int peer, uint32_t tag, int *flag_p, int *source_p,
                 size_t *count_p, tutti_dtype_t *dtype_p);

/* MPI_Mprobe / MPI_Mrecv: a probe that takes the message it found, so that no other
 * receive can (a thread receiving the same peer and tag meanwhile takes the next one):
 * as tutti_probe, then the message is received into a buffer of the library's, and
 * *msg_p holds it, with its sender, count and dtype as tutti_probe reports them (each
 * pointer but msg_p may be NULL). tutti_mrecv copies it out to host memory (count and
 * dtype must be the message's, else TUTTI_ERR_MISMATCH naming both, and msg stays for
 * another try) and frees it; its errors are the thread's, read with
 * tutti_comm_last_error(NULL) (it has no communicator); tutti_message_free drops one
 * unread. A message
 * outlives its communicator. The probe's timeout takes nothing (the communicator goes
 * on); once found, the message's transfer is a receive issued then, bounded as a
 * receive's is (its timeout fails the communicator). */
typedef struct tutti_message tutti_message_t;
int tutti_mprobe(tutti_comm_t *comm, int peer, uint32_t tag, tutti_message_t **msg_p, int *source_p,
                 size_t *count_p, tutti_dtype_t *dtype_p);
/* MPI_Improbe: one look, as tutti_iprobe's; where a message came, *flag_p 1 and it is
 * taken as tutti_mprobe's (the call returns once it is all here), else *flag_p 0 and
 * *msg_p NULL. */
int tutti_improbe(tutti_comm_t *comm, int peer, uint32_t tag, int *flag_p, tutti_message_t **msg_p,
                  int *source_p, size_t *count_p, tutti_dtype_t *dtype_p);
int tutti_mrecv(tutti_message_t *msg, void *buf, size_t count, tutti_dtype_t dtype);
void tutti_message_free(tutti_message_t *msg);

/* MPI_Status's fields: what a receive took, or a probe found. */
typedef struct tutti_msg_info {
    int source;          /* the sender (TUTTI_PROC_NULL: the message of nothing) */
    uint32_t tag;        /* its tag (TUTTI_ANY_TAG for TUTTI_PROC_NULL's, as MPI's) */
    size_t count;        /* a receive's: the count it took in its dtype (bytes for a
                            tutti_recv_upto of TUTTI_UINT8); a probe's or message's: the
                            count as sent */
    tutti_dtype_t dtype; /* the receive's dtype; a probe's or message's: the dtype as sent */
} tutti_msg_info_t;
/* MPI_Probe (flag_p NULL) or MPI_Iprobe (flag_p: one look, *flag_p 1 where a message
 * came), as tutti_probe and tutti_iprobe, with the message's tag too (for a probe of
 * TUTTI_ANY_TAG): *info filled where one was found (info may be NULL). */
int tutti_probe_info(tutti_comm_t *comm, int peer, uint32_t tag, int *flag_p,
                     tutti_msg_info_t *info);
/* What tutti_mprobe's or tutti_improbe's message is (before tutti_mrecv frees it). */
int tutti_message_info(const tutti_message_t *msg, tutti_msg_info_t *info);
/* What a receive that finished well took (MPI_Wait's status): TUTTI_OK and *info filled;
 * TUTTI_ERR_INVALID_ARG for a work that is no receive or still runs, the receive's own
 * failure status if it failed (tutti_comm_last_error(NULL) then says so). */
int tutti_work_info(const tutti_work_t *work, tutti_msg_info_t *info);
/* MPI_Sendrecv with its status: tutti_sendrecv, the receive's source, tag (for a
 * recvtag of TUTTI_ANY_TAG), count and dtype into *info (info may be NULL). */
int tutti_sendrecv_info(tutti_comm_t *comm, const void *sendbuf, size_t sendcount,
                        tutti_dtype_t sendtype, int dest, uint32_t sendtag, void *recvbuf,
                        size_t recvcount, tutti_dtype_t recvtype, int source, uint32_t recvtag,
                        tutti_msg_info_t *info);

/* The rank a finished receive got its message from (its peer, or for TUTTI_ANY_SOURCE
 * the rank that sent it); -1 while it runs, if it failed before a sender was known, or
 * for anything but a receive. */
int tutti_work_source(const tutti_work_t *work);
/* The count a finished receive took, in its dtype's elements (bytes for a
 * tutti_recv_upto of TUTTI_UINT8): a tutti_recv_upto's message's, any other receive's
 * own count; (size_t)-1 while it runs, if it failed, or for anything but a receive. */
size_t tutti_work_count(const tutti_work_t *work);

/* Non-blocking check: *done_p = 1 and the operation's status once it finished,
 * *done_p = 0 and TUTTI_OK while it runs. */
int tutti_test(tutti_work_t *work, int *done_p);

/* Wait until the operation finishes or timeout_ms passes (-1: the communicator's
 * timeout). Returns the operation's status, or TUTTI_ERR_TIMEOUT if it still runs (the
 * operation goes on, and tutti_comm_last_error is left as it was). */
int tutti_wait(tutti_work_t *work, int timeout_ms);

/* MPI_Waitany: wait until one of works[0..n) finishes or timeout_ms passes (-1: until
 * one does, which each op's own deadline bounds; 0: one look, MPI_Testany). NULL
 * entries are skipped (MPI_REQUEST_NULL): set one NULL once handled to wait for the
 * rest. *index_p: the lowest index of a finished work and the call returns its status;
 * -1 with TUTTI_ERR_TIMEOUT when the bound passed (the ops go on), -1 with TUTTI_OK when
 * every entry is NULL. Works may belong to several communicators (then each is looked
 * at within a millisecond of its op's end). */
int tutti_wait_any(size_t n, tutti_work_t *const *works, int timeout_ms, int *index_p);
/* MPI_Waitall: wait until every work of works[0..n) (NULLs skipped) finished, or
 * timeout_ms passed (as tutti_wait_any's; the one bound for them all): TUTTI_OK if all
 * succeeded, else the status of the first, by index, that failed (each one's with
 * tutti_test and tutti_work_error); TUTTI_ERR_TIMEOUT if one still runs at the bound. */
int tutti_wait_all(size_t n, tutti_work_t *const *works, int timeout_ms);
/* MPI_Waitsome: wait as tutti_wait_any, then report every finished work: *count_p of
 * them, their indices ascending in indices[] (room for n). TUTTI_OK if those all
 * succeeded, else the first failure's status; TUTTI_ERR_TIMEOUT (*count_p 0) at the
 * bound; TUTTI_OK with *count_p 0 when every entry is NULL. timeout_ms 0: MPI_Testsome. */
int tutti_wait_some(size_t n, tutti_work_t *const *works, int timeout_ms, size_t *count_p,
                    int *indices);

/* MPI_Cancel for a receive: take it back if no message has matched it, *cancelled_p
 * (may be NULL) 1: it is done now with TUTTI_ERR_CANCELLED, its buffer untouched, and
 * the message it would have taken goes to the next receive that can take it (as
 * MPI_Test_cancelled's true). *cancelled_p 0, TUTTI_OK: it had finished, or it cannot be
 * taken back and completes as it would: its message has come or is coming in, or a later
 * receive from its rank of its tag holds the next number (cancel the later one first:
 * the receives of a (rank, tag) come back last first), or the transport has no cancel
 * slot (tcp, shm and ibverbs have). A receive from any source or of any tag still
 * looking, a recv_upto's, and a receive waiting behind one of those can always be
 * cancelled (the usual listener of MPI programs, cancelled at shutdown). Waits for the
 * communicator's op in progress, if any (its progress runs under the same lock). A send,
 * a collective: TUTTI_ERR_INVALID_ARG (MPI deprecates cancelling sends). */
int tutti_cancel(tutti_work_t *work, int *cancelled_p);

/* Persistent requests (MPI_Send_init, MPI_Recv_init, MPI_Start, MPI_Startall and MPI-4's
 * persistent collectives, MPI_Allreduce_init...; UCC's init/post): a call's arguments,
 * checked once (as its blocking form checks them; a bad one fails here) and kept, buffers
 * included (they must stay valid until the request is freed, and hold each round's
 * data). tutti_start issues it as its _async form would (in issue order with the other
 * calls on comm: every rank starts its collectives in the same order), a round at a
 * time: tutti_request_work is that round's work (owned by the request: wait for it with
 * tutti_wait, tutti_wait_any or tutti_wait_all, never free it), replaced at the next
 * start; starting again while it runs is TUTTI_ERR_INVALID_ARG (MPI's active request).
 * tutti_start_all starts each in index order (NULLs skipped), stopping at the first
 * failure. tutti_request_free (MPI_Request_free) may come while a round runs (it ends on
 * its own); the communicator stays allocated while a request holds it, but a start
 * after its destroy is refused (tutti_comm_last_error(NULL)). */
typedef struct tutti_request tutti_request_t;
int tutti_send_init(tutti_comm_t *comm, const void *buf, size_t count, tutti_dtype_t dtype,
                    int peer, uint32_t tag, tutti_request_t **req_p);
int tutti_recv_init(tutti_comm_t *comm, void *buf, size_t count, tutti_dtype_t dtype, int peer,
                    uint32_t tag, tutti_request_t **req_p);
int tutti_allreduce_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                         tutti_dtype_t dtype, tutti_redop_t op, tutti_request_t **req_p);
int tutti_broadcast_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                         tutti_dtype_t dtype, int root, tutti_request_t **req_p);
int tutti_reduce_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                      tutti_dtype_t dtype, tutti_redop_t op, int root, tutti_request_t **req_p);
int tutti_allgather_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                         tutti_dtype_t dtype, tutti_request_t **req_p);
int tutti_reduce_scatter_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                              size_t recvcount, tutti_dtype_t dtype, tutti_redop_t op,
                              tutti_request_t **req_p);
int tutti_alltoall_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                        tutti_dtype_t dtype, tutti_request_t **req_p);
int tutti_gather_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                      tutti_dtype_t dtype, int root, tutti_request_t **req_p);
int tutti_scatter_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                       tutti_dtype_t dtype, int root, tutti_request_t **req_p);
int tutti_allgatherv_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                          const size_t *recvcounts, const size_t *displs, tutti_dtype_t dtype,
                          tutti_request_t **req_p);
int tutti_reduce_scatterv_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                               const size_t *recvcounts, tutti_dtype_t dtype, tutti_redop_t op,
                               tutti_request_t **req_p);
int tutti_gatherv_init(tutti_comm_t *comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                       const size_t *recvcounts, const size_t *displs, tutti_dtype_t dtype,
                       int root, tutti_request_t **req_p);
int tutti_scatterv_init(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                        const size_t *displs, void *recvbuf, size_t recvcount, tutti_dtype_t dtype,
                        int root, tutti_request_t **req_p);
/* (the v forms' counts and displacements are read at each start: their arrays must
 * stay valid as the buffers do) */
int tutti_alltoallv_init(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                         const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                         const size_t *rdispls, tutti_dtype_t dtype, tutti_request_t **req_p);
int tutti_scan_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                    tutti_dtype_t dtype, tutti_redop_t op, tutti_request_t **req_p);
int tutti_exscan_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                      tutti_dtype_t dtype, tutti_redop_t op, tutti_request_t **req_p);
int tutti_barrier_init(tutti_comm_t *comm, tutti_request_t **req_p);
int tutti_start(tutti_request_t *req);
int tutti_start_all(size_t n, tutti_request_t *const *reqs);
tutti_work_t *tutti_request_work(const tutti_request_t *req);
void tutti_request_free(tutti_request_t *req);

/* ---- Process topologies and neighbourhood collectives (MPI-3) ----
 * A communicator may carry a topology: a distributed graph (MPI_Dist_graph_create_
 * adjacent: each rank names the ranks it receives from, its sources, and those it sends
 * to, its destinations) or a cartesian grid (MPI_Cart_create). The neighbourhood
 * collectives exchange data along its edges only: every rank of the communicator calls
 * them, in the same order as its other collectives, and each sends to its destinations
 * and receives from its sources, nothing else. Edges may repeat (a rank twice among the
 * sources: two blocks from it), and the k-th message from a rank meets the k-th place
 * that names it; TUTTI_PROC_NULL as a neighbour (a grid's edge) moves nothing and leaves
 * its receive block as it was. A neighbour that is the rank itself is a local copy. */
#define TUTTI_TOPO_NONE 0  /* MPI_UNDEFINED */
#define TUTTI_TOPO_GRAPH 1 /* MPI_DIST_GRAPH */
#define TUTTI_TOPO_CART 2  /* MPI_CART */
/* MPI_Dist_graph_create_adjacent (without weights or reordering): a new communicator
 * over comm's ranks, in comm's order, with this graph. Collective over comm; every rank
 * passes its own lists (sources: the ranks it receives from, indegree of them;
 * destinations: those it sends to), which the call checks against each other: a rank
 * that lists r as a destination k times must be listed by r as a source k times, else
 * every rank fails (TUTTI_ERR_INVALID_ARG, naming the two ranks and the counts). Ranks
 * in [0, size) or TUTTI_PROC_NULL. */
int tutti_dist_graph_create_adjacent(tutti_comm_t *comm, int indegree, const int *sources,
                                     int outdegree, const int *destinations,
                                     tutti_comm_t **graph_p);
/* MPI_Dist_graph_create (without weights or reordering): every rank names any edges,
 * n source ranks (sources[i]) each with degrees[i] destinations, read in order from
 * destinations (sum of degrees of them); each rank gets the edges that start or end at
 * it, wherever named, ordered by the rank that named them and that rank's order (an edge
 * named twice is two). Collective over comm; a bad rank or degree fails every rank. */
int tutti_dist_graph_create(tutti_comm_t *comm, int n, const int *sources, const int *degrees,
                            const int *destinations, tutti_comm_t **graph_p);
/* MPI_Cart_create (without reordering): a grid of ndims dimensions, dims[i] ranks along
 * dimension i (each >= 1), periodic along i where periods[i] != 0 (periods NULL: none),
 * over comm's first dims[0] x ... x dims[ndims-1] ranks in row-major order (the last
 * dimension changes fastest). Collective over comm; every rank must pass the same
 * (checked: else every rank fails, naming one that differs). A rank past the grid's
 * size gets *cart_p NULL (MPI_COMM_NULL); a grid larger than comm is refused. */
int tutti_cart_create(tutti_comm_t *comm, int ndims, const int *dims, const int *periods,
                      tutti_comm_t **cart_p);
/* MPI_Cart_sub: the grids of the dimensions kept (remain_dims[i] != 0), one for each
 * place along the others, with their periods; this rank's into *sub_p, ranked by its
 * coordinates along the kept dimensions. Collective over comm, a grid; every rank must
 * keep the same (checked). None kept: a grid of no dimensions and one rank. */
int tutti_cart_sub(tutti_comm_t *comm, const int *remain_dims, tutti_comm_t **sub_p);
/* MPI_Dims_create: fill the zero entries of dims (ndims of them) so that the product of
 * all is nnodes, as balanced as can be, in non-increasing order; the non-zero entries
 * stay. TUTTI_ERR_INVALID_ARG where nnodes is not a multiple of their product. */
int tutti_dims_create(int nnodes, int ndims, int *dims);
/* MPI_Topo_test: TUTTI_TOPO_NONE, _GRAPH or _CART into *kind_p. */
int tutti_topo_test(tutti_comm_t *comm, int *kind_p);
/* MPI_Cartdim_get and MPI_Cart_get (arrays of maxdims; any may be NULL). */
int tutti_cartdim_get(tutti_comm_t *comm, int *ndims_p);
int tutti_cart_get(tutti_comm_t *comm, int maxdims, int *dims, int *periods, int *coords);
/* MPI_Cart_rank: the rank at coords (wrapped along periodic dimensions; out of range
 * along another: TUTTI_ERR_INVALID_ARG). MPI_Cart_coords: rank's coordinates. */
int tutti_cart_rank(tutti_comm_t *comm, const int *coords, int *rank_p);
int tutti_cart_coords(tutti_comm_t *comm, int rank, int maxdims, int *coords);
/* MPI_Cart_shift: the ranks disp steps back (*source_p) and forward (*dest_p) along
 * dimension direction; TUTTI_PROC_NULL past a non-periodic edge. */
int tutti_cart_shift(tutti_comm_t *comm, int direction, int disp, int *source_p, int *dest_p);
/* MPI_Dist_graph_neighbors_count and _neighbors; on a grid too (as the neighbourhood
 * collectives see it: 2 x ndims each way, for dimension i the rank one step back then
 * the one forward, TUTTI_PROC_NULL past an edge). */
int tutti_topo_neighbors_count(tutti_comm_t *comm, int *indegree_p, int *outdegree_p);
int tutti_topo_neighbors(tutti_comm_t *comm, int maxindegree, int *sources, int maxoutdegree,
                         int *destinations);
/* MPI_Neighbor_allgather: sendbuf (count elements) to every destination; the block from
 * source j lands at recvbuf + j x count elements. MPI_Neighbor_allgatherv: the block from
 * source j is recvcounts[j] elements at displs[j]. MPI_Neighbor_alltoall: block i of
 * sendbuf (count elements at i x count) to destination i, the block from source j at
 * recvbuf + j x count. MPI_Neighbor_alltoallv: sendcounts/sdispls by destination,
 * recvcounts/rdispls by source. Counts and displacements in elements, arrays of the
 * degrees' length. Not in place (MPI: neither), and the receive blocks may not overlap.
 * A block's count must equal its sender's (else TUTTI_ERR_MISMATCH, naming both). On a
 * communicator without a topology: TUTTI_ERR_INVALID_ARG. */
int tutti_neighbor_allgather(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                             tutti_dtype_t dtype);
int tutti_neighbor_allgather_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, tutti_dtype_t dtype, tutti_work_t **work_p);
int tutti_neighbor_allgather_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                                  size_t count, tutti_dtype_t dtype, tutti_request_t **req_p);
int tutti_neighbor_allgatherv(tutti_comm_t *comm, const void *sendbuf, size_t sendcount,
                              void *recvbuf, const size_t *recvcounts, const size_t *displs,
                              tutti_dtype_t dtype);
int tutti_neighbor_allgatherv_async(tutti_comm_t *comm, const void *sendbuf, size_t sendcount,
                                    void *recvbuf, const size_t *recvcounts, const size_t *displs,
                                    tutti_dtype_t dtype, tutti_work_t **work_p);
int tutti_neighbor_allgatherv_init(tutti_comm_t *comm, const void *sendbuf, size_t sendcount,
                                   void *recvbuf, const size_t *recvcounts, const size_t *displs,
                                   tutti_dtype_t dtype, tutti_request_t **req_p);
int tutti_neighbor_alltoall(tutti_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                            tutti_dtype_t dtype);
int tutti_neighbor_alltoall_async(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                                  size_t count, tutti_dtype_t dtype, tutti_work_t **work_p);
int tutti_neighbor_alltoall_init(tutti_comm_t *comm, const void *sendbuf, void *recvbuf,
                                 size_t count, tutti_dtype_t dtype, tutti_request_t **req_p);
int tutti_neighbor_alltoallv(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                             const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                             const size_t *rdispls, tutti_dtype_t dtype);
int tutti_neighbor_alltoallv_async(tutti_comm_t *comm, const void *sendbuf,
                                   const size_t *sendcounts, const size_t *sdispls, void *recvbuf,
                                   const size_t *recvcounts, const size_t *rdispls,
                                   tutti_dtype_t dtype, tutti_work_t **work_p);
int tutti_neighbor_alltoallv_init(tutti_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                                  const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                  const size_t *rdispls, tutti_dtype_t dtype,
                                  tutti_request_t **req_p);

/* Release a work handle; safe while the operation is still running, and after the
 * communicator's destroy (tutti_wait, tutti_test and tutti_work_error then give the
 * finished operation's status and explanation). */
void tutti_work_free(tutti_work_t *work);

/* The explanation of a finished operation's failure ("" if it succeeded). */
const char *tutti_work_error(const tutti_work_t *work);

/* Call fn(arg, status) once the operation finishes: from the thread that completes it
 * (the communicator's progress thread, or a thread waiting on it or issuing an op), or
 * at once in this call if it finished already. At most one callback per work. fn runs
 * without the communicator's locks held, so it may take a lock that the issuing thread
 * holds while it issues (hand the news to another thread: futures, condition variables,
 * a mutex briefly); but the communicator's next operation waits for it, so fn must not
 * block for long, and it must not call into this communicator: an operation (blocking
 * or _async, a send or receive), tutti_wait or tutti_comm_destroy on it from fn fails
 * with TUTTI_ERR_INVALID_ARG. The work handle stays valid for fn even if freed before.
 * The operation counts as finished (tutti_test, tutti_wait) only once a callback
 * registered before its end has returned, so what fn uses may be freed once the work is
 * seen done. */
int tutti_work_on_done(tutti_work_t *work, void (*fn)(void *arg, int status), void *arg);

TUTTI_END_DECLS
#endif /* TUTTI_TUTTI_H */
