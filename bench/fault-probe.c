/* What a page fault costs on this host: maps 64 MiB of anonymous memory, writes one
 * byte in each 4 KiB page (each write a fault: the kernel finds and zeroes a page and
 * maps it), unmaps it, 5 times; prints the median microseconds per page. run-peers.sh
 * records it before and after a plan: a collective that allocates its scratch per call
 * pays it per page, so it decides how such a peer fares at large sizes, and it differs
 * by a factor of ten between the VMs these benchmarks ran on (about 1 us a page on the
 * host of session 65, 13 us on that of session 70).
 *   fault-probe [MiB] [repeats]      (default 64 5)
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    long mib = argc > 1 ? atol(argv[1]) : 64, reps = argc > 2 ? atol(argv[2]) : 5;
    if (mib < 1 || mib > 4096 || reps < 1 || reps > 100) {
        fprintf(stderr, "usage: fault-probe [MiB 1..4096] [repeats 1..100]\n");
        return 2;
    }
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = (size_t)mib << 20;
    const size_t pages = bytes / page;
    double *us = malloc((size_t)reps * sizeof *us);
    if (!us) {
        fprintf(stderr, "fault-probe: out of memory\n");
        return 1;
    }
    for (long r = 0; r < reps; r++) {
        volatile unsigned char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("fault-probe: mmap");
            free(us);
            return 1;
        }
        double t0 = now_s();
        for (size_t i = 0; i < bytes; i += page)
            p[i] = 1;
        us[r] = (now_s() - t0) * 1e6 / (double)pages;
        munmap((void *)p, bytes);
    }
    qsort(us, (size_t)reps, sizeof *us, cmp_double);
    printf("%.2f\n", reps % 2 ? us[reps / 2] : (us[reps / 2 - 1] + us[reps / 2]) / 2);
    free(us);
    return 0;
}
