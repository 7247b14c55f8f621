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

/* Leaving a CPU shared with a peer, for a transport that can tell where its peers run
 * (shares()). The scheduler may put two ranks that wait for each other on one CPU while
 * another is idle (a waker pulls its wakee to its own CPU), and a short run ends before
 * the load balancer splits them. They then take turns by preemption, not in the spin (a
 * wait finds its data already there): a 2-rank tcp allreduce of 4 bytes took 25 us a
 * call so, against 8-10 on two CPUs. So a wait that ends in the spin asks shares() every
 * TP_HOP_CHECK_NS, while this thread may use min_cpus CPUs (with more ranks than CPUs
 * sharing is unavoidable); when a peer is on this CPU, the thread is narrowed to an
 * allowed CPU no known peer is on and given its mask back (the kernel keeps it there).
 * Checks space out (up to 64 times) while moves keep coming. */
typedef struct tp_hop {
    int enabled;
    int min_cpus; /* moves only while this thread may use this many CPUs (the ranks') */
    /* 1 when a peer this rank should not share a CPU with last ran on CPU mine; the CPUs
     * of the peers it can see go into *busy */
    int (*shares)(void *tp, int mine, cpu_set_t *busy);
    unsigned moves;
    uint64_t next_ns;
} tp_hop_t;

#define TP_HOP_CHECK_NS 2000000u /* how often a wait asks shares() */

static inline void tp_hop_wait_ended(void *tp, tp_hop_t *h, uint64_t now)
{
    if (!h->enabled || now < h->next_ns)
        return;
    if (now > h->next_ns + 1000000000ull)
        h->moves = 0; /* quiet for a second: start over */
    h->next_ns = now + TP_HOP_CHECK_NS;
    cpu_set_t busy, allowed, target;
    CPU_ZERO(&busy);
    int mine = sched_getcpu();
    if (mine < 0 || mine >= CPU_SETSIZE || sched_getaffinity(0, sizeof(allowed), &allowed) != 0 ||
        CPU_COUNT(&allowed) < h->min_cpus || !h->shares(tp, mine, &busy))
        return;
    int to = -1;
    for (int c = 0; c < CPU_SETSIZE && to < 0; c++)
        if (c != mine && CPU_ISSET(c, &allowed) && !CPU_ISSET(c, &busy))
            to = c;
    if (to < 0)
        return;
    CPU_ZERO(&target);
    CPU_SET(to, &target);
    if (sched_setaffinity(0, sizeof(target), &target) != 0)
        return;
    sched_setaffinity(0, sizeof(allowed), &allowed); /* given back: the kernel keeps us there */
    h->next_ns = now + ((uint64_t)TP_HOP_CHECK_NS << TT_KIT_MIN(h->moves, 6u));
    h->moves++;
}

/* progress(): completions counts finished requests; aborted is set by abort(); moved
 * (NULL: not kept) counts what the transport moved short of a completion (bytes of a
 * message still under way). Spinning lasts spin_us since the last completion or move,
 * not since the call: a large message over a socket completes only after hundreds of
 * microseconds of steady movement, and sleeping in the middle of it (then a wake-up,
 * 20-50 us in a VM, every time the socket buffer runs dry) halved loopback tcp's
 * bandwidth at 1 MiB. A wait that moved something goes back to spinning (the
 * transport's own spin too, which must itself spin on while things move: shm's ring
 * steps; without it a rank that once slept in a 16 MiB exchange then slept after every
 * 64 KiB step, hundreds of 40-us wake-ups a run). hop (NULL: never): leaving a CPU
 * shared with a peer, above. */
static inline int tp_progress_hop(void *tp, const tp_progress_ops_t *o, atomic_int *aborted,
                                  const unsigned long *completions, const unsigned long *moved,
                                  tp_hop_t *hop, int spin_us, int timeout_ms)
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
                if (*completions != c0) {
                    if (hop)
                        tp_hop_wait_ended(tp, hop, now);
                    return TUTTI_OK;
                }
                if (atomic_load(aborted))
                    break;
                now = tp_now_ns();
                if (moved && *moved != m0) {
                    m0 = *moved;
                    end = TT_KIT_MIN(now + spin_ns, deadline);
                }
                /* With more ranks than cores, the peer we wait for may share our core:
                 * spinning without yielding would keep it off the CPU for the whole spin.
                 * Not yielding in the first 20 us (as shm's spin skips it in its first 3)
                 * was level at 2 ranks and took 1.6-1.8x the time of a 4-rank tcp
                 * allreduce on 2 CPUs (docs/benchmarks.md, session 72). */
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
        spin = 0;
        if (moved && *moved != m0) {
            /* the transport's own spin, again (it spins on while things move), or ours */
            if (o->spin && spin_us > 0 && o->spin(tp, c0, tp_now_ns(), deadline))
                break;
            spin = spin_us > 0 && !o->spin;
            m0 = *moved;
        }
    }
    return TUTTI_OK;
}

static inline int tp_progress(void *tp, const tp_progress_ops_t *o, atomic_int *aborted,
                              const unsigned long *completions, int spin_us, int timeout_ms)
{
    return tp_progress_hop(tp, o, aborted, completions, NULL, NULL, spin_us, timeout_ms);
}

/* Defines pfx##_progress, the progress() of a transport whose context (tp_type) has host,
 * aborted and completions, and which waits in its own way: sweep(tp) and abort_all(tp) as
 * in tp_progress_ops_t; wait_ms(tp, ms): wait up to ms milliseconds (the deadline rounded
 * up) for something to do, and do it; moved: an expression of tp, the address of its
 * count of moves short of a completion (tp_progress_hop), or NULL; hop: the address of
 * its tp_hop_t, or NULL. */
#define TT_KIT_PROGRESS_FN(pfx, tp_type, sweep, wait_ms, abort_all, moved, hop)                    \
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
        return tp_progress_hop(tp, &pfx##_progress_ops, &tp->aborted, &tp->completions, (moved),   \
                               (hop), tp->host->spin_us, timeout_ms);                              \
    }

#endif
