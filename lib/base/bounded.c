/* Calls bounded by a deadline on a helper thread: see bounded.h. */
#include <errno.h>
#include <signal.h>
#include <time.h>

#include "base/base.h"
#include "base/bounded.h"

void tt_bounded_put(tt_bounded_t *job)
{
    pthread_mutex_lock(&job->lock);
    int last = --job->refs == 0;
    pthread_mutex_unlock(&job->lock);
    if (!last)
        return;
    pthread_cond_destroy(&job->cv);
    pthread_mutex_destroy(&job->lock);
    job->release(job);
}

static void *bounded_thread(void *arg)
{
    tt_bounded_t *job = arg;
    job->run(job);
    pthread_mutex_lock(&job->lock);
    job->done = 1;
    pthread_cond_signal(&job->cv);
    pthread_mutex_unlock(&job->lock);
    tt_bounded_put(job);
    return NULL;
}

int tt_bounded_run(tt_bounded_t *job, void (*run)(tt_bounded_t *), void (*release)(tt_bounded_t *),
                   uint64_t deadline_ns)
{
    job->run = run;
    job->release = release;
    job->done = 0;
    job->refs = 2;
    pthread_mutex_init(&job->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&job->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_attr_t ta;
    pthread_attr_init(&ta);
    pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    int e = pthread_create(&t, &ta, bounded_thread, job);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&ta);
    if (e != 0) {
        job->refs = 1;
        return -e;
    }
    pthread_mutex_lock(&job->lock);
    while (!job->done) {
        if (deadline_ns == UINT64_MAX) {
            pthread_cond_wait(&job->cv, &job->lock);
            continue;
        }
        if (tt_now_ns() >= deadline_ns)
            break;
        struct timespec ts = { (time_t)(deadline_ns / 1000000000ull),
                               (long)(deadline_ns % 1000000000ull) };
        pthread_cond_timedwait(&job->cv, &job->lock, &ts);
    }
    int done = job->done;
    pthread_mutex_unlock(&job->lock);
    return done;
}
