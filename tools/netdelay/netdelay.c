/* tutti-netdelay: a user-space link with a delay (and optionally a rate) between two
 * network namespaces, for kernels without netem. It opens a TUN device in each namespace
 * and forwards every packet read from one to the other once it has been held for the
 * delay (after its serialisation time at the rate, if one is given), in order.
 *
 *   tutti-netdelay --ns-a NS --dev-a NAME --ns-b NS --dev-b NAME --delay-us US
 *                  [--rate BITS] [--queue-bytes N] [--mtu N] [--spin-us US]
 *
 * NS is a name under /run/netns (ip netns add) or a path to a namespace file. The devices
 * are brought up with the MTU; addresses are the caller's (ip addr add). It prints
 * "ready" on stdout once both are up, runs until SIGINT or SIGTERM, then prints what it
 * forwarded and dropped on stderr and exits 0 (the devices go with it). Exit status 1
 * when setting up fails (the message names the step), 2 on bad usage. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ND_SLOTS 8192
#define ND_MAX_PKT 65536

typedef struct nd_pkt {
    unsigned char *data;
    size_t len;
    int64_t release_ns;
} nd_pkt_t;

/* One direction: a reader thread queues what it reads from `in`, a writer thread writes
 * each packet to `out` at its release time. */
typedef struct nd_dir {
    const char *name; /* "a->b" */
    int in, out;
    int64_t delay_ns, spin_ns;
    double ns_per_byte;   /* 0: no rate limit */
    size_t queue_cap;     /* bytes held at most; beyond it packets are dropped */
    int64_t link_free_ns; /* when the modelled wire is free again (reader only) */
    pthread_mutex_t lock;
    pthread_cond_t nonempty;
    nd_pkt_t ring[ND_SLOTS];
    unsigned head, tail; /* tail - head packets queued */
    size_t queued_bytes;
    atomic_ullong fwd_pkts, fwd_bytes, dropped, write_errors;
} nd_dir_t;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Open a TUN device in the namespace `ns`, with the MTU, up. Returns its fd, or -1 after
 * printing which step failed. The fd stays bound to that namespace. */
static int tun_open(const char *ns, const char *dev, int mtu)
{
    char path[512];
    snprintf(path, sizeof(path), strchr(ns, '/') ? "%s" : "/run/netns/%s", ns);
    int nsfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) < 0) {
        fprintf(stderr, "tutti-netdelay: entering namespace %s (%s): %s\n", ns, path,
                strerror(errno));
        if (nsfd >= 0)
            close(nsfd);
        return -1;
    }
    close(nsfd);
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", dev);
    const char *step = "opening /dev/net/tun";
    if (fd >= 0) {
        step = "creating the device (TUNSETIFF)";
        if (ioctl(fd, TUNSETIFF, &ifr) == 0) {
            int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
            ifr.ifr_mtu = mtu;
            step = "setting its MTU (SIOCSIFMTU)";
            if (s >= 0 && ioctl(s, SIOCSIFMTU, &ifr) == 0) {
                step = "bringing it up (SIOCSIFFLAGS)";
                ifr.ifr_flags = IFF_UP | IFF_RUNNING;
                if (ioctl(s, SIOCSIFFLAGS, &ifr) == 0)
                    step = NULL;
            }
            if (s >= 0)
                close(s);
        }
    }
    if (step) {
        fprintf(stderr, "tutti-netdelay: %s in namespace %s, device %s: %s\n", step, ns, dev,
                strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* When a packet read at `t` leaves the far end: after the wire has carried it (at the
 * rate, behind what is already on it) and the delay. -1: the queue is full, drop it. */
static int64_t release_time(nd_dir_t *d, int64_t t, size_t len)
{
    if (d->queued_bytes + len > d->queue_cap || d->tail - d->head >= ND_SLOTS)
        return -1;
    if (d->ns_per_byte <= 0)
        return t + d->delay_ns;
    int64_t start = d->link_free_ns > t ? d->link_free_ns : t;
    d->link_free_ns = start + (int64_t)(d->ns_per_byte * (double)len);
    return d->link_free_ns + d->delay_ns;
}

static void *reader_main(void *arg)
{
    nd_dir_t *d = arg;
    unsigned char buf[ND_MAX_PKT];
    for (;;) {
        ssize_t n = read(d->in, buf, sizeof(buf));
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            fprintf(stderr, "tutti-netdelay: %s: reading: %s\n", d->name, strerror(errno));
            exit(1);
        }
        int64_t t = now_ns();
        unsigned char *copy = malloc((size_t)n ? (size_t)n : 1);
        pthread_mutex_lock(&d->lock);
        int64_t rel = copy ? release_time(d, t, (size_t)n) : -1;
        if (rel < 0) {
            pthread_mutex_unlock(&d->lock);
            free(copy);
            atomic_fetch_add(&d->dropped, 1);
            continue;
        }
        memcpy(copy, buf, (size_t)n);
        d->ring[d->tail % ND_SLOTS] = (nd_pkt_t){ copy, (size_t)n, rel };
        d->tail++;
        d->queued_bytes += (size_t)n;
        pthread_cond_signal(&d->nonempty);
        pthread_mutex_unlock(&d->lock);
    }
    return NULL;
}

/* Sleep until `t` (CLOCK_MONOTONIC): the timer to within spin_ns of it, then spin. */
static void sleep_until(int64_t t, int64_t spin_ns)
{
    int64_t wake = t - spin_ns;
    struct timespec ts = { (time_t)(wake / 1000000000), (long)(wake % 1000000000) };
    while (now_ns() < wake && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
    while (spin_ns > 0 && now_ns() < t)
        ;
}

static void *writer_main(void *arg)
{
    nd_dir_t *d = arg;
    for (;;) {
        pthread_mutex_lock(&d->lock);
        while (d->head == d->tail)
            pthread_cond_wait(&d->nonempty, &d->lock);
        nd_pkt_t p = d->ring[d->head % ND_SLOTS]; /* only this thread takes packets off */
        pthread_mutex_unlock(&d->lock);
        sleep_until(p.release_ns, d->spin_ns);
        /* a full far end (its queue discipline) drops, as a real link would */
        if (write(d->out, p.data, p.len) < 0)
            atomic_fetch_add(&d->write_errors, 1);
        else
            atomic_fetch_add(&d->fwd_pkts, 1), atomic_fetch_add(&d->fwd_bytes, p.len);
        free(p.data);
        pthread_mutex_lock(&d->lock);
        d->head++;
        d->queued_bytes -= p.len;
        pthread_mutex_unlock(&d->lock);
    }
    return NULL;
}

typedef struct nd_cfg {
    const char *ns[2], *dev[2];
    long long delay_us, spin_us, queue_bytes;
    double rate_bps;
    int mtu;
} nd_cfg_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: tutti-netdelay --ns-a NS --dev-a NAME --ns-b NS --dev-b NAME --delay-us US\n"
               "                      [--rate BITS_PER_S] [--queue-bytes N] [--mtu N] "
               "[--spin-us US]\n"
               "Forwards packets between a TUN device in each namespace, each held US "
               "microseconds\n(after its time on the wire at the rate, if given). Defaults: no "
               "rate, queue 16 MiB\na direction, MTU 65000, spin 0.\n");
}

static int parse_args(int argc, char **argv, nd_cfg_t *c)
{
    static const struct option opts[] = { { "ns-a", 1, 0, 'a' },
                                          { "ns-b", 1, 0, 'b' },
                                          { "dev-a", 1, 0, 'A' },
                                          { "dev-b", 1, 0, 'B' },
                                          { "delay-us", 1, 0, 'd' },
                                          { "rate", 1, 0, 'r' },
                                          { "queue-bytes", 1, 0, 'q' },
                                          { "mtu", 1, 0, 'm' },
                                          { "spin-us", 1, 0, 's' },
                                          { "help", 0, 0, 'h' },
                                          { 0, 0, 0, 0 } };
    *c = (nd_cfg_t){ .delay_us = -1, .queue_bytes = 16 << 20, .mtu = 65000 };
    for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        char *end = NULL;
        switch (o) {
        case 'a': c->ns[0] = optarg; break;
        case 'b': c->ns[1] = optarg; break;
        case 'A': c->dev[0] = optarg; break;
        case 'B': c->dev[1] = optarg; break;
        case 'd': c->delay_us = strtoll(optarg, &end, 10); break;
        case 'r': c->rate_bps = strtod(optarg, &end); break;
        case 'q': c->queue_bytes = strtoll(optarg, &end, 10); break;
        case 'm': c->mtu = (int)strtol(optarg, &end, 10); break;
        case 's': c->spin_us = strtoll(optarg, &end, 10); break;
        case 'h': usage(stdout); exit(0);
        default: return -1;
        }
        if (end && *end) {
            fprintf(stderr, "tutti-netdelay: cannot read \"%s\" as a number\n", optarg);
            return -1;
        }
    }
    if (optind != argc || !c->ns[0] || !c->ns[1] || !c->dev[0] || !c->dev[1] || c->delay_us < 0 ||
        c->rate_bps < 0 || c->queue_bytes < ND_MAX_PKT || c->mtu < 68 || c->mtu > ND_MAX_PKT - 1 ||
        c->spin_us < 0) {
        fprintf(stderr, "tutti-netdelay: missing or out-of-range arguments\n");
        return -1;
    }
    return 0;
}

static void dir_init(nd_dir_t *d, const char *name, int in, int out, const nd_cfg_t *c)
{
    memset(d, 0, sizeof(*d));
    d->name = name;
    d->in = in;
    d->out = out;
    d->delay_ns = c->delay_us * 1000;
    d->spin_ns = c->spin_us * 1000;
    d->ns_per_byte = c->rate_bps > 0 ? 8e9 / c->rate_bps : 0;
    d->queue_cap = (size_t)c->queue_bytes;
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->nonempty, NULL);
}

int main(int argc, char **argv)
{
    nd_cfg_t cfg;
    if (parse_args(argc, argv, &cfg) < 0) {
        usage(stderr);
        return 2;
    }
    /* the kernel's default 50 us of timer slack would be most of a short delay's error */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    int fd[2];
    for (int i = 0; i < 2; i++)
        if ((fd[i] = tun_open(cfg.ns[i], cfg.dev[i], cfg.mtu)) < 0)
            return 1;
    static nd_dir_t dir[2];
    dir_init(&dir[0], "a->b", fd[0], fd[1], &cfg);
    dir_init(&dir[1], "b->a", fd[1], fd[0], &cfg);
    /* the threads inherit the mask: only sigwait below takes the signals */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    for (int i = 0; i < 4; i++) {
        pthread_t th;
        int err = pthread_create(&th, NULL, i < 2 ? reader_main : writer_main, &dir[i % 2]);
        if (err) {
            fprintf(stderr, "tutti-netdelay: starting a thread: %s\n", strerror(err));
            return 1;
        }
        pthread_detach(th);
    }
    printf("ready\n");
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    for (int i = 0; i < 2; i++)
        fprintf(stderr,
                "tutti-netdelay: %s: %llu packets (%llu bytes) forwarded, %llu dropped "
                "(queue full), %llu not taken by the far end\n",
                dir[i].name, (unsigned long long)dir[i].fwd_pkts,
                (unsigned long long)dir[i].fwd_bytes, (unsigned long long)dir[i].dropped,
                (unsigned long long)dir[i].write_errors);
    return 0; /* closing the fds removes the devices */
}
