/* What a derived datatype costs a call: tutti_pack and tutti_unpack (the copy a call on a
 * derived type makes when it is issued, and the one back when it completes) against
 * memcpy of the same bytes, for a few types at a few sizes.
 *
 *   pack-bench [ROUNDS]          (default 7)
 *
 * Each round times memcpy, pack and unpack alternately, best of 3 passes each, of a
 * buffer whose packed form is the size given (its extent larger by the type's gaps); the
 * table has each one's median over the rounds in GB/s of packed bytes (1e9 a second),
 * and pack's and unpack's time over memcpy's in the same round, median (min-max). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tutti/tutti.h>

#include "stats.h"

#define PASSES 3

typedef struct {
    int32_t a;
    double b;
} rec_t;

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* seconds, best of PASSES: kind 0 memcpy, 1 pack, 2 unpack */
static double best(int kind, tutti_dtype_t t, size_t count, char *user, char *packed, size_t bytes)
{
    double b = 1e30;
    for (int p = 0; p < PASSES; p++) {
        size_t pos = 0;
        double t0 = now_us();
        if (kind == 0)
            memcpy(packed, user, bytes);
        else if (kind == 1)
            tutti_pack(user, count, t, packed, bytes, &pos);
        else
            tutti_unpack(packed, bytes, &pos, user, count, t);
        double dt = (now_us() - t0) / 1e6;
        b = dt < b ? dt : b;
    }
    return b;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    if (rounds < 1 || rounds > 1000) {
        fprintf(stderr, "usage: pack-bench [ROUNDS (1-1000)]\n");
        return 2;
    }
    tutti_dtype_t types[4];
    const char *names[4] = { "contiguous f64", "every other f64", "8 of 16 f64",
                             "struct {i32, f64}" };
    if (tutti_type_contiguous(1, TUTTI_FP64, &types[0]) < 0 ||
        tutti_type_resized(TUTTI_FP64, 0, 16, &types[1]) < 0 ||
        tutti_type_vector(1, 8, 16, TUTTI_FP64, &types[2]) < 0 ||
        tutti_type_struct(2, (size_t[]){ 1, 1 },
                          (ptrdiff_t[]){ offsetof(rec_t, a), offsetof(rec_t, b) },
                          (tutti_dtype_t[]){ TUTTI_INT32, TUTTI_FP64 }, &types[3]) < 0) {
        fprintf(stderr, "pack-bench: %s\n", tutti_comm_last_error(NULL));
        return 1;
    }
    /* vector(1, 8, ...) has the extent of its 8 values: resize it to 16 */
    tutti_dtype_t half;
    if (tutti_type_resized(types[2], 0, 16 * sizeof(double), &half) < 0)
        return 1;
    tutti_type_free(types[2]);
    types[2] = half;
    printf("# pack-bench: GB/s of packed bytes, median of %d rounds (best of %d each); "
           "pack and unpack time / memcpy's\n",
           rounds, PASSES);
    printf("%-18s %10s %8s %8s %8s %22s %22s\n", "type", "bytes", "memcpy", "pack", "unpack",
           "pack/memcpy", "unpack/memcpy");
    const size_t sizes[3] = { 64 << 10, 1 << 20, 16 << 20 };
    for (int k = 0; k < 4; k++)
        for (int s = 0; s < 3; s++) {
            size_t size = tutti_dtype_size(types[k]), ext;
            tutti_type_extent(types[k], NULL, &ext);
            size_t count = sizes[s] / size, bytes = count * size;
            char *user = malloc(count * ext), *packed = malloc(bytes);
            if (!user || !packed)
                return 1;
            memset(user, 1, count * ext);
            memset(packed, 2, bytes);
            double g[3][1000], rp[1000], ru[1000];
            for (int r = 0; r < rounds; r++) {
                double t[3];
                for (int kind = 0; kind < 3; kind++)
                    t[kind] = best(kind, types[k], count, user, packed, bytes);
                for (int kind = 0; kind < 3; kind++)
                    g[kind][r] = (double)bytes / t[kind] / 1e9;
                rp[r] = t[1] / t[0];
                ru[r] = t[2] / t[0];
            }
            double mp = median(rp, rounds), mu = median(ru, rounds);
            char a[32], b[32];
            snprintf(a, sizeof(a), "%.2f (%.2f-%.2f)", mp, rp[0], rp[rounds - 1]);
            snprintf(b, sizeof(b), "%.2f (%.2f-%.2f)", mu, ru[0], ru[rounds - 1]);
            printf("%-18s %10zu %8.2f %8.2f %8.2f %22s %22s\n", names[k], bytes,
                   median(g[0], rounds), median(g[1], rounds), median(g[2], rounds), a, b);
            free(user);
            free(packed);
        }
    for (int k = 0; k < 4; k++)
        tutti_type_free(types[k]);
    return 0;
}
