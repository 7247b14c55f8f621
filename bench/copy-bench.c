/* memcpy against tt_copy (transports/kit/copy.h) by where the destination lies past the
 * source modulo 4096, the case where glibc's REP MOVSB is slow on AMD Zen.
 *
 *   copy-bench [ROUNDS]          (default 7)
 *
 * For each copy size and each distance (dst - src) mod 4096, one round copies a 4 MiB
 * source into a 1 MiB ring in steps of the size (the shm transport's copy into its
 * ring), memcpy and tt_copy alternately, best of 3 passes each; the table has each one's
 * median over the rounds in GB/s (1e9 bytes per second) and tt_copy's median time over
 * memcpy's in the same round, with its range. "loop" says whether tt_copy takes its
 * vector loop there.
 *
 * Then large copies, 2-32 MiB, where tt_copy streams its stores past the cache from a
 * quarter of the L3 ("streams"): before each copy both buffers are rewritten (a source
 * just computed, a destination the program touched), then one copy is timed, memcpy
 * and tt_copy alternately; same statistics. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "stats.h"
#include "../transports/kit/copy.h"

#define SRC_BYTES (4u << 20)
#define RING_BYTES (1u << 20)
#define PASSES 3

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Seconds for the best of PASSES passes of SRC_BYTES copied in steps of `step` bytes
 * into the ring at `delta` past the source's page offset. */
static double pass(int use_tt, unsigned char *ring, const unsigned char *src, size_t step,
                   size_t delta)
{
    double best = 1e30;
    for (int p = 0; p < PASSES; p++) {
        double t0 = now_us();
        for (size_t at = 0; at + step <= SRC_BYTES; at += step) {
            unsigned char *dst = ring + delta + (at % RING_BYTES);
            if (use_tt)
                tt_copy(dst, src + at, step);
            else
                memcpy(dst, src + at, step);
        }
        double t = (now_us() - t0) * 1e-6;
        if (t < best)
            best = t;
    }
    return best;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    if (rounds < 1 || rounds > 1000) {
        fprintf(stderr, "usage: copy-bench [ROUNDS (1..1000)]\n");
        return 2;
    }
    static const size_t steps[] = { 4096, 65536, 262144, 1u << 20 };
    static const size_t deltas[] = { 0, 8, 16, 24, 32, 56, 64, 128, 2048, 4040, 4064, 4088 };
    unsigned char *src = aligned_alloc(4096, SRC_BYTES);
    unsigned char *ring = aligned_alloc(4096, RING_BYTES + 2 * 4096);
    double *tm = malloc(sizeof(double) * (size_t)rounds),
           *tt = malloc(sizeof(double) * (size_t)rounds);
    double *r = malloc(sizeof(double) * (size_t)rounds);
    if (!src || !ring || !tm || !tt || !r) {
        fprintf(stderr, "copy-bench: out of memory\n");
        return 1;
    }
    memset(src, 1, SRC_BYTES);
    memset(ring, 2, RING_BYTES + 2 * 4096);
    printf("# copy-bench: %u MiB in steps into a %u MiB ring, best of %d passes, median of "
           "%d rounds; GB/s\n",
           SRC_BYTES >> 20, RING_BYTES >> 20, PASSES, rounds);
    printf("# %8s %6s %5s %9s %9s %8s %s\n", "step", "delta", "loop", "memcpy", "tt_copy", "tt/mem",
           "(range)");
    for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]); s++) {
        for (size_t d = 0; d < sizeof(deltas) / sizeof(deltas[0]); d++) {
            for (int k = 0; k < rounds; k++) {
                tm[k] = pass(0, ring, src, steps[s], deltas[d]);
                tt[k] = pass(1, ring, src, steps[s], deltas[d]);
                r[k] = tt[k] / tm[k];
            }
            double lo = r[0], hi = r[0];
            for (int k = 1; k < rounds; k++) {
                lo = r[k] < lo ? r[k] : lo;
                hi = r[k] > hi ? r[k] : hi;
            }
            int loop = tp_copy_in_band(ring + deltas[d], src, steps[s]);
            double gm = SRC_BYTES / median(tm, rounds) / 1e9;
            double gt = SRC_BYTES / median(tt, rounds) / 1e9;
            printf("  %8zu %6zu %5s %9.1f %9.1f %8.2f (%.2f-%.2f)\n", steps[s], deltas[d],
                   loop ? "yes" : "no", gm, gt, median(r, rounds), lo, hi);
        }
    }

    static const size_t bigs[] = { 2u << 20, 4u << 20, 8u << 20, 16u << 20, 32u << 20 };
    size_t nt_min = tp_copy_nt_min();
    unsigned char *bs = aligned_alloc(4096, 32u << 20), *bd = aligned_alloc(4096, 32u << 20);
    if (!bs || !bd) {
        fprintf(stderr, "copy-bench: out of memory\n");
        return 1;
    }
    printf("# large copies, both buffers rewritten before each; tt_copy streams from %zu "
           "bytes (a quarter of the L3; %s)\n",
           nt_min, nt_min == SIZE_MAX ? "never: L3 unknown" : "sysfs, else sysconf");
    printf("# %8s %7s %9s %9s %8s %s\n", "bytes", "streams", "memcpy", "tt_copy", "tt/mem",
           "(range)");
    for (size_t b = 0; b < sizeof(bigs) / sizeof(bigs[0]); b++) {
        size_t n = bigs[b];
        for (int k = 0; k < rounds; k++) {
            for (int w = 0; w < 2; w++) {
                memset(bs, k + w, n);
                memset(bd, k + w + 1, n);
                double t0 = now_us();
                if (w)
                    tt_copy(bd, bs, n);
                else
                    memcpy(bd, bs, n);
                double t = (now_us() - t0) * 1e-6;
                *(w ? &tt[k] : &tm[k]) = t;
            }
            r[k] = tt[k] / tm[k];
        }
        double lo = r[0], hi = r[0];
        for (int k = 1; k < rounds; k++) {
            lo = r[k] < lo ? r[k] : lo;
            hi = r[k] > hi ? r[k] : hi;
        }
        double gm = n / median(tm, rounds) / 1e9, gt = n / median(tt, rounds) / 1e9;
        printf("  %8zu %7s %9.1f %9.1f %8.2f (%.2f-%.2f)\n", n, n >= nt_min ? "yes" : "no", gm, gt,
               median(r, rounds), lo, hi);
    }
    free(bd);
    free(bs);
    free(r);
    free(tt);
    free(tm);
    free(ring);
    free(src);
    return 0;
}
