/* Job identity: which job, and which run of it, a communicator belongs to (internal).
 *
 * A store can be shared: two jobs pointed at one directory, a rerun on the directory of
 * a finished or crashed run, a process that destroys and creates communicators in a
 * loop. Ranks must never meet ranks of another job or of another run. So:
 *   - the job id (TUTTI_JOB_ID, else a launcher's: tutti-run, Slurm, PMIx, Open MPI,
 *     torchrun) is part of the communicator's key prefix: jobs with different ids never
 *     see each other's keys;
 *   - within that prefix, rank 0 creates a job *instance* by compare-and-set of the
 *     record "instance" (a random nonce, the rank count, its pid, host and start), and
 *     every other rank claims its slot in that instance by compare-and-set too; all
 *     further keys live under "<nonce>/", and the nonce travels in every transport
 *     hello. A second rank 0, or a second claimant of a slot, while an instance is
 *     starting, means two jobs share the prefix: both fail with TUTTI_ERR_IN_USE.
 *   - a finished instance (every rank left), a running one (every rank finished set-up:
 *     its membership is settled), or a dead one (its rank 0 is gone, or its start is
 *     older than its timeout) may be replaced: reruns work in place, and a second job
 *     that starts after the first one is up lands in a namespace of its own;
 *   - what cannot be told apart without a job id: ranks of two id-less jobs that start
 *     so far apart that one job's rank 0 and the other's rank r finish set-up together
 *     before the rest arrive. Launchers (tutti-run, tutti-bench, Slurm, ...) give ids;
 *   - the last rank to leave removes the instance's keys and its record.
 */
#ifndef TT_JOB_H
#define TT_JOB_H

#include <stddef.h>

#include <tutti/store.h>

typedef struct tutti_comm tutti_comm_t;

/* The job id: opt, else TUTTI_JOB_ID, else a launcher's variable, else where every rank
 * is on this host, MPICH's hydra proxy (tt_job_hydra_launch); "" if none. Bytes
 * outside [A-Za-z0-9._-] become '_' (it is part of store keys); at most 64 bytes, a
 * longer id is shortened with a hash of the whole. *source_p names where it came from. */
void tt_job_id(const char *opt, char *out, size_t len, const char **source_p);

/* The launch of MPICH's (or Intel MPI's) mpiexec, which sets no id: "hydra-PID.START" of
 * the hydra proxy at the other end of this process's PMI connection (PMI_FD; one proxy
 * per host and launch, its start time telling a later one of the same pid apart), for
 * the job id where all the ranks are on this host and for the port of their loopback
 * store. 0, or -1 where there is none (no PMI_FD, not a socket to a hydra proxy). */
int tt_job_hydra_launch(char *out, size_t len);

/* This process's start time (field 22 of /proc/self/stat, clock ticks since boot), read
 * once per process: 0, or -errno where it could not be read (EMFILE, ENOMEM, ...). */
int tt_job_self_start(unsigned long long *start);

/* Is process pid, which started at start (as tt_job_self_start reads it), gone? 1: no
 * such process, or another of the same pid; 0: it runs; -errno: its /proc/<pid>/stat
 * could not be read (this process near its fd limit, short of memory): unknown, which a
 * caller must not take for gone. */
int tt_job_proc_gone(long pid, unsigned long long start);

/* Join (rank 0: create) a job instance under base (a store key prefix ending in '/').
 * Sets comm->instance, comm->job_store (view of base), comm->store and comm->qstore
 * (views of base + nonce + '/'). Bounded by comm->opts.timeout_ms. */
int tt_job_join(tutti_comm_t *comm, tutti_store_t *store, const char *base, char *err,
                size_t errlen);

/* After set-up: count this rank as ready (an instance whose ranks are all ready may be
 * replaced by a later job, which then lands in its own namespace); TUTTI_ERR_IN_USE
 * (message in err) if another job's rank 0 or a second claimant of a slot showed up
 * while this instance was starting. */
int tt_job_check_contested(tutti_comm_t *comm, char *err, size_t errlen);

/* Set-up failed on this rank after it joined an instance: leave the status and
 * comm->last_error under "<nonce>/init_failed/<rank>", so that a rank that arrives to
 * find rank 0 already gone reports why instead of waiting for a new instance. */
void tt_job_init_failed(tutti_comm_t *comm, int status);

/* At destroy: count this rank out; the last one removes the instance's keys and record.
 * Best effort, bounded by the quick store deadline. */
void tt_job_leave(tutti_comm_t *comm);

#endif /* TT_JOB_H */
