// tcpx: 2 processes, loopback TCP, both send N bytes and receive N bytes at a common start,
// calls GAP us apart (spinning), p50 of max over both. usage: tcpx N GAP CC ITERS [busy_recv]
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <sched.h>
static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void *a, const void *b)
{
    double x = *(double *)a, y = *(double *)b;
    return x < y ? -1 : x > y;
}
static int tm = -1;
static void mark(const char *s)
{
    if (tm >= 0)
        write(tm, s, strlen(s));
}
int main(int argc, char **argv)
{
    tm = open("/sys/kernel/tracing/trace_marker", O_WRONLY);
    size_t n = strtoul(argv[1], 0, 0);
    double gap = atof(argv[2]);
    const char *cc = argv[3];
    int iters = atoi(argv[4]);
    int mode = argc > 5 ? atoi(argv[5]) : 0; // 0: poll-wait, 1: busy nonblocking
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (getenv("PRE"))
        setsockopt(ls, IPPROTO_TCP, TCP_CONGESTION, argv[3], strlen(argv[3]));
    bind(ls, (void *)&a, sizeof a);
    listen(ls, 1);
    socklen_t al = sizeof a;
    getsockname(ls, (void *)&a, &al);
    double *res = mmap(0, 2 * iters * sizeof(double) + 64, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    volatile double *t0p = (double *)(res + 2 * iters);
    int rank = fork() == 0;
    int fd;
    if (rank) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (getenv("PRE"))
            setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, strlen(cc));
        connect(fd, (void *)&a, sizeof a);
    } else {
        fd = accept(ls, 0, 0);
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (strcmp(cc, "-") && !getenv("PRE"))
        if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, strlen(cc)))
            perror("cc");
    fcntl(fd, F_SETFL, O_NONBLOCK);
    char *sb = malloc(n), *rb = malloc(n);
    memset(sb, 1, n);
    memset(rb, 0, n);
    char c = 0;
    if (rank) {
        *t0p = now_us() + 50000;
        write(fd, &c, 1);
    } else {
        while (read(fd, &c, 1) != 1)
            ;
    }
    double t0 = *t0p;
    static double ph[1000][3];
    for (int i = -5; i < iters; i++) {
        double st = t0 + (i + 5) * gap;
        if (getenv("YIELD"))
            while (now_us() < st - 5)
                sched_yield();
        if (getenv("GAPSYS")) {
            double ev = atof(getenv("GAPSYS")), nx = now_us() + ev;
            while (now_us() < st - ev) {
                if (now_us() > nx) {
                    nx += ev;
                    if (getenv("GAPSOCK")) {
                        char z[8];
                        recv(fd, z, sizeof z, MSG_DONTWAIT | MSG_PEEK);
                    } else
                        getppid();
                }
            }
        }
        while (now_us() < st)
            ;
        size_t s = 0, r = 0;
        mark(rank ? "R1 start" : "R0 start");
        while (s < n || r < n) {
            if (s < n) {
                ssize_t k = send(fd, sb + s, n - s, MSG_DONTWAIT);
                if (k > 0) {
                    s += k;
                    if (s == n && i >= 0 && i < 1000)
                        ph[i][0] = now_us() - st;
                }
            }
            if (getenv("QA"))
                setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
            if (r < n) {
                ssize_t k = recv(fd, rb + r, n - r, MSG_DONTWAIT);
                if (k > 0) {
                    if (r == 0 && i >= 0 && i < 1000)
                        ph[i][1] = now_us() - st;
                    r += k;
                    if (r == n && i >= 0 && i < 1000)
                        ph[i][2] = now_us() - st;
                    if (r < n && getenv("QP"))
                        setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
                }
            }
            if (mode == 0 && (s < n || r < n)) {
                struct pollfd p = { fd, (short)((r < n ? POLLIN : 0) | (s < n ? POLLOUT : 0)), 0 };
                poll(&p, 1, 100);
            }
        }
        mark(rank ? "R1 end" : "R0 end");
        if (getenv("PH") && i >= 0 && i < 1000)
            fprintf(stderr, "r%d i%d sent %.1f firstrecv %.1f lastrecv %.1f\n", rank, i, ph[i][0],
                    ph[i][1], ph[i][2]);
        if (i >= 0)
            res[rank * iters + i] = now_us() - st;
    }
    if (rank)
        return 0;
    wait(0);
    double m[10000];
    for (int i = 0; i < iters; i++)
        m[i] = res[i] > res[iters + i] ? res[i] : res[iters + i];
    qsort(m, iters, sizeof(double), cmp);
    printf("n %zu gap %.0f cc %s mode %d p50 %.1f p10 %.1f p90 %.1f\n", n, gap, cc, mode,
           m[iters / 2], m[iters / 10], m[iters * 9 / 10]);
    return 0;
}
