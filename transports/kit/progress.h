/* Transport kit: the loop of progress(). One sweep; when nothing completed and the
 * caller may wait, spin (sweeping) for up to the host's spin_us, then wait in the
 * transport's own way until a request completes, the timeout passes or abort() is
 * called (then every request fails with TUTTI_ERR_ABORTED). Static inline over a
 * constant ops table, so the calls below compile to direct ones. */
#ifndef TT_KIT_PROGRESS_H
#define TT_KIT_PROGRESS_H

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#include "abi.h"
#include "util.h"

typedef struct tp_progress_ops {
    /* move what can be moved without waiting */
    void (*sweep)(void *tp);
    /* wait for something to do (and do it), returning by deadline (tp_now_ns's clock) at
     * the latest; c0: the completion count the loop waits to see move */
    void (*wait)(void *tp, unsigned long c0, uint64_t now, uint64_t deadline);
    /* fail every request with TUTTI_ERR_ABORTED */
    void (*abort_all)(void *tp);
    /* optional: the transport's own spin from t0 until spin_us pass or the deadline
     * (NULL: sweep and yield); 1 when something completed */
    int (*spin)(void *tp, unsigned long c0, uint64_t t0, uint64_t deadline);
} tp_progress_ops_t;

/* progress(): completions counts finished requests; aborted is set by abort(); moved
 * (NULL: not kept) counts what the transport moved short of a completion (bytes of a
 * message still under way). Spinning lasts spin_us since the last completion or move,
 * not since the call: a large message over a socket completes only after hundreds of
 * microseconds of steady movement, and sleeping in the middle of it (then a wake-up,
 * 20-50 us in a VM, every time the socket buffer runs dry) halved loopback tcp's
 * bandwidth at 1 MiB. A wait that moved something goes back to spinning. */
static inline int tp_progress_moved(void *tp, const tp_progress_ops_t *o, atomic_int *aborted,
                                    const unsigned long *completions, const unsigned long *moved,
                                    int spin_us, int timeout_ms)
{
    if (atomic_load(aborted)) {
        o->abort_all(tp);
        return TUTTI_ERR_ABORTED;
    }
    unsigned long c0 = *completions;
    o->sweep(tp);
    if (*completions != c0 || timeout_ms <= 0)
        return TUTTI_OK;
    uint64_t t0 = tp_now_ns();
    uint64_t deadline = t0 + (uint64_t)timeout_ms * 1000000u;
    if (spin_us > 0 && o->spin && o->spin(tp, c0, t0, deadline))
        return TUTTI_OK;
    const uint64_t spin_ns = (uint64_t)spin_us * 1000u;
    int spin = spin_us > 0 && !o->spin;
    unsigned long m0 = moved ? *moved : 0;
    for (;;) {
        if (spin) {
            uint64_t now = tp_now_ns(), end = TT_KIT_MIN(now + spin_ns, deadline);
            while (now < end) {
                o->sweep(tp);
                if (*completions != c0)
                    return TUTTI_OK;
                if (atomic_load(aborted))
                    break;
                now = tp_now_ns();
                if (moved && *moved != m0) {
                    m0 = *moved;
                    end = TT_KIT_MIN(now + spin_ns, deadline);
                }
                /* With more ranks than cores, the peer we wait for may share our core:
                 * spinning without yielding would keep it off the CPU for the whole spin. */
                sched_yield();
            }
        }
        if (atomic_load(aborted)) {
            o->abort_all(tp);
            return TUTTI_ERR_ABORTED;
        }
        uint64_t now = tp_now_ns();
        if (now >= deadline)
            break;
        o->wait(tp, c0, now, deadline);
        if (*completions != c0)
            break;
        if (moved && *moved != m0) {
            m0 = *moved;
            spin = spin_us > 0 && !o->spin;
        } else {
            spin = 0;
        }
    }
    return TUTTI_OK;
}

static inline int tp_progress(void *tp, const tp_progress_ops_t *o, atomic_int *aborted,
                              const unsigned long *completions, int spin_us, int timeout_ms)
{
    return tp_progress_moved(tp, o, aborted, completions, NULL, spin_us, timeout_ms);
}

/* Defines pfx##_progress, the progress() of a transport whose context (tp_type) has host,
 * aborted and completions, and which waits in its own way: sweep(tp) and abort_all(tp) as
 * in tp_progress_ops_t; wait_ms(tp, ms): wait up to ms milliseconds (the deadline rounded
 * up) for something to do, and do it; moved: an expression of tp, the address of its
 * count of moves short of a completion (tp_progress_moved), or NULL. */
#define TT_KIT_PROGRESS_FN(pfx, tp_type, sweep, wait_ms, abort_all, moved)                         \
    static void pfx##_kit_sweep(void *tp)                                                          \
    {                                                                                              \
        sweep((tp_type *)tp);                                                                      \
    }                                                                                              \
    static void pfx##_kit_abort_all(void *tp)                                                      \
    {                                                                                              \
        abort_all((tp_type *)tp);                                                                  \
    }                                                                                              \
    static void pfx##_kit_wait(void *tp, unsigned long c0, uint64_t now, uint64_t deadline)        \
    {                                                                                              \
        (void)c0;                                                                                  \
        wait_ms((tp_type *)tp, (int)((deadline - now + 999999u) / 1000000u));                      \
    }                                                                                              \
    static const tp_progress_ops_t pfx##_progress_ops = { .sweep = pfx##_kit_sweep,                \
                                                          .wait = pfx##_kit_wait,                  \
                                                          .abort_all = pfx##_kit_abort_all };      \
    static int pfx##_progress(void *vtp, int timeout_ms)                                           \
    {                                                                                              \
        tp_type *tp = vtp;                                                                         \
        return tp_progress_moved(tp, &pfx##_progress_ops, &tp->aborted, &tp->completions, (moved), \
                                 tp->host->spin_us, timeout_ms);                                   \
    }

#endif
