/* A call that may block past its caller's deadline (a name lookup, a launcher's PMIx
 * server), run on a helper thread the caller waits for until its deadline. */
#ifndef TT_BASE_BOUNDED_H
#define TT_BASE_BOUNDED_H

#include <pthread.h>
#include <stdint.h>

/* The first member of the caller's job struct, which holds the call's inputs and
 * results. The caller and the helper thread each hold a reference; the last of the two
 * to let go calls release, so a caller that gave up at its deadline leaves nothing the
 * helper could touch after the caller's memory is gone. */
typedef struct tt_bounded tt_bounded_t;
struct tt_bounded {
    pthread_mutex_t lock;
    pthread_cond_t cv; /* CLOCK_MONOTONIC, tt_now_ns's clock */
    int refs, done;
    void (*run)(tt_bounded_t *job);     /* on the helper thread: the blocking call */
    void (*release)(tt_bounded_t *job); /* frees the job and whatever results it holds */
};

/* Runs job->run on a detached thread that takes no signals (they stay the
 * application's threads' business) and waits for it until deadline_ns (tt_now_ns's
 * clock; UINT64_MAX: no deadline). 1: run returned, its results in the job for the
 * caller to read (or take, leaving release nothing to free); 0: the deadline came
 * first; -errno: no thread could be made (run never ran). Either way the caller then
 * lets go with tt_bounded_put. */
int tt_bounded_run(tt_bounded_t *job, void (*run)(tt_bounded_t *), void (*release)(tt_bounded_t *),
                   uint64_t deadline_ns);
void tt_bounded_put(tt_bounded_t *job);

#endif
