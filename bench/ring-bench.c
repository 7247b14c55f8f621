/* A copy into a ring another CPU reads, stored through the cache or streamed past it
 * (tp_copy against tp_copy_nt, transports/kit/copy.h): what TUTTI_SHM_NT_STORES chooses
 * between (docs/internals.md "Stores into the ring").
 *
 *   ring-bench [ROUNDS [BYTES]]      (default 10 rounds of 1 MiB)
 *
 * Two processes, the writer held on the first CPU it may use, the reader on the second,
 * share a ring of BYTES. A transfer: the writer rewrites its source (a value just
 * computed), copies it into the ring and says so; the reader copies the ring out into
 * its own buffer and says so. Each round runs 32 transfers stored through the cache,
 * then 32 streamed, then 32 cached and 32 streamed again, and prints the median time of
 * each side's copy per way, in us; a pause of 200 ms separates the rounds. "write x"
 * is the cached write's median over the streamed one's: where it is 1.5 or more, the
 * shm transport's auto streams. */
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "stats.h"
#include "../transports/kit/copy.h"

#define PER_BLOCK 32
#define BLOCKS 4 /* cached, streamed, cached, streamed */
#define PER_WAY (PER_BLOCK * BLOCKS / 2)

typedef struct {
    _Atomic uint64_t posted; /* transfers the writer finished */
    char pad[56];
    _Atomic uint64_t taken; /* transfers the reader finished */
    char pad2[56];
    double read_us[2][PER_WAY]; /* the reader's copy, per way */
} shared_t;

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Hold this process on the k-th CPU it may use; -1 when there is none. */
static int hold_on(int k)
{
    cpu_set_t all, one;
    if (sched_getaffinity(0, sizeof(all), &all) != 0)
        return -1;
    for (int c = 0, seen = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &all) || seen++ != k)
            continue;
        CPU_ZERO(&one);
        CPU_SET(c, &one);
        return sched_setaffinity(0, sizeof(one), &one) == 0 ? c : -1;
    }
    return -1;
}

static int streamed(int i)
{
    return (i / PER_BLOCK) % 2;
}

static void copy_in(unsigned char *dst, const unsigned char *src, size_t n, int nt)
{
#ifdef TP_COPY_LOOP
    if (nt && __builtin_cpu_supports("avx2")) {
        tp_copy_nt(dst, src, n);
        return;
    }
#endif
    (void)nt;
    tp_copy(dst, src, n);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    long long req = argc > 2 ? atoll(argv[2]) : 1 << 20;
    if (rounds < 1 || req < 4096 || req > (1ll << 30)) {
        fprintf(stderr, "usage: ring-bench [ROUNDS >= 1 [BYTES 4096..1G]]\n");
        return 2;
    }
    size_t n = (size_t)req & ~(size_t)63;
#ifdef TP_COPY_LOOP
    if (!__builtin_cpu_supports("avx2"))
#endif
    {
        printf("# ring-bench: no AVX2 here, so no streamed stores to compare: skipped\n");
        return 0;
    }
    cpu_set_t all;
    if (sched_getaffinity(0, sizeof(all), &all) != 0 || CPU_COUNT(&all) < 2) {
        printf("# ring-bench: fewer than 2 CPUs to run on: skipped\n");
        return 0;
    }
    shared_t *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                        0);
    unsigned char *ring = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    unsigned char *buf = malloc(n);
    if (sh == MAP_FAILED || ring == MAP_FAILED || !buf) {
        fprintf(stderr, "ring-bench: out of memory for %zu bytes\n", n);
        return 1;
    }
    memset(ring, 0, n);
    memset(buf, 1, n);
    pid_t reader = fork();
    if (reader < 0) {
        perror("ring-bench: fork");
        return 1;
    }
    if (reader == 0) {
        hold_on(1);
        for (uint64_t t = 0;; t++) {
            time_t t0 = time(NULL);
            while (atomic_load_explicit(&sh->posted, memory_order_acquire) <= t)
                if (time(NULL) - t0 > 10) /* the writer died */
                    _exit(1);
            int i = (int)(t % (PER_BLOCK * BLOCKS));
            double s = now_us();
            memcpy(buf, ring, n);
            sh->read_us[streamed(i)][i / (2 * PER_BLOCK) * PER_BLOCK + i % PER_BLOCK] = now_us() -
                                                                                        s;
            atomic_store_explicit(&sh->taken, t + 1, memory_order_release);
        }
    }
    int wcpu = hold_on(0);
    printf("# ring-bench: %zu bytes into a ring, writer on CPU %d, reader on the next one; "
           "medians of %d transfers each way, us\n",
           n, wcpu, PER_WAY);
    printf("# round   write cached  read cached   write streamed  read streamed   write x\n");
    double write_us[2][PER_WAY];
    uint64_t t = 0;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < PER_BLOCK * BLOCKS; i++, t++) {
            int nt = streamed(i);
            memset(buf, (int)t, n);
            double s = now_us();
            copy_in(ring, buf, n, nt);
            write_us[nt][i / (2 * PER_BLOCK) * PER_BLOCK + i % PER_BLOCK] = now_us() - s;
            atomic_store_explicit(&sh->posted, t + 1, memory_order_release);
            time_t t0 = time(NULL);
            while (atomic_load_explicit(&sh->taken, memory_order_acquire) <= t)
                if (time(NULL) - t0 > 10) {
                    fprintf(stderr, "ring-bench: the reader took no transfer in 10 s\n");
                    kill(reader, SIGKILL);
                    waitpid(reader, NULL, 0);
                    return 1;
                }
        }
        double wc = median(write_us[0], PER_WAY), ws = median(write_us[1], PER_WAY);
        double rc = median(sh->read_us[0], PER_WAY), rs = median(sh->read_us[1], PER_WAY);
        printf("%7d %14.1f %12.1f %16.1f %14.1f %9.2f\n", r + 1, wc, rc, ws, rs, wc / ws);
        fflush(stdout);
        usleep(200000);
    }
    kill(reader, SIGKILL);
    waitpid(reader, NULL, 0);
    return 0;
}
