/* tools/bind.h: --bind's placement, shared by the launcher (tools/launch.c) and the
 * peers' harness gloo-bench (bench/peers/gloo_bench.cc), so that both place ranks alike:
 * rank i of np on the (i * C / np)-th of the C CPUs the calling process may use,
 * neighbours together (4 ranks on 2 CPUs: the first two on the first). Header-only:
 * gloo-bench is also built by hand, without the launcher. */
#ifndef TT_BIND_H
#define TT_BIND_H

#include <errno.h>
#include <sched.h>

/* Holds the calling process on rank i's CPU (*cpu_p). 0, or an errno value. */
static inline int tt_bind_rank(int i, int np, int *cpu_p)
{
    cpu_set_t allowed, one;
    *cpu_p = -1;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        return errno;
    int k = (int)((long long)i * CPU_COUNT(&allowed) / np), cpu = 0;
    for (; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &allowed) && k-- == 0)
            break;
    *cpu_p = cpu;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return sched_setaffinity(0, sizeof(one), &one) != 0 ? errno : 0;
}

#endif /* TT_BIND_H */
