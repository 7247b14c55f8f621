/* Shared-memory transport: set-up and liveness.
 *
 * Rank r creates its doorbell segment, its wake-up socket ("...-wake", bound in
 * /dev/shm, for arm()) and one segment per served peer p > r (POSIX shm, names
 * "/tutti-shm-<pid>-<nonce>-bell" and "...-<p>"), then publishes "shm/<r>" =
 * "1 <pid> <nonce> <host id>" in the store. For every served peer it reads that record,
 * checks the host id, maps the peer's doorbell, connects to its wake-up socket and, for
 * p < r, maps the pair segment (which it unlinks at once). It then waits until every
 * served peer has mapped its own segments and unlinks them and its socket: from there
 * on nothing is left in /dev/shm whatever happens to any process. Last, as the
 * receiving side of each pair, it probes whether it may pull from the sender with
 * process_vm_readv (a random value at a published address), and says so in the pair's
 * shared state. A pair's rings are reserved in /dev/shm and mapped only at its first use
 * (shm_link_activate): set-up takes each pair's header and keeps the file's descriptor.
 *
 * Before all that it removes what ranks killed in their set-up left in /dev/shm
 * (sweep_stale), sizes the rings it creates to the room /dev/shm has (ring_fit) and checks
 * that the host's rings at that size fit there (room_check). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "shm.h"

#define LOGF(lvl, ...) tp->host->log(tp->host->ctx, (lvl), __VA_ARGS__)
#define ERRF(st, peer, err, ...) setup_error(tp, (st), (peer), (err), __VA_ARGS__)

/* The host's error(), the message kept in tp->why too: a rank whose set-up fails tells
 * its peers why (setup_failed). */
__attribute__((format(printf, 5, 6))) static int setup_error(shm_tp_t *tp, int st, int peer,
                                                             int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tp->why, sizeof(tp->why), fmt, ap);
    va_end(ap);
    st = tp->host->error(tp->host->ctx, st, peer, err, "%s", tp->why);
    size_t n = strlen(tp->why);
    if (err && n < sizeof(tp->why)) /* the record says what the host's message says */
        snprintf(tp->why + n, sizeof(tp->why) - n, " (errno %d: %s)", err, strerror(err));
    return st;
}

long shm_futex(_Atomic uint32_t *addr, int op, uint32_t val, int timeout_ms)
{
    struct timespec ts, *tsp = NULL;
    if (op == FUTEX_WAIT && timeout_ms >= 0) {
        ts.tv_sec = timeout_ms / 1000;
        ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
        tsp = &ts;
    }
    return syscall(SYS_futex, (uint32_t *)addr, op, val, tsp, NULL, 0);
}

static void sleep_us(long us)
{
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    nanosleep(&ts, NULL);
}

static void host_identity(shm_tp_t *tp, char *out, size_t len)
{
    const tutti_tp_host_v1_t *h = tp->host;
    if (h->size > offsetof(tutti_tp_host_v1_t, host_id) && h->host_id && h->host_id[0]) {
        snprintf(out, len, "%s", h->host_id);
        return;
    }
    tp_host_id_fallback(h->config(h->ctx, "HOST_ID"), out, len);
}

/* bytes as text in buf (at least 24 bytes): "512 bytes", "136.0 KiB", "64.0 MiB" (a
 * small /dev/shm read "0.0 MiB" in MiB alone). */
static const char *size_text(uint64_t bytes, char *buf, size_t len)
{
    if (bytes < 1024)
        snprintf(buf, len, "%llu bytes", (unsigned long long)bytes);
    else if (bytes < 1048576)
        snprintf(buf, len, "%.1f KiB", (double)bytes / 1024.0);
    else
        snprintf(buf, len, "%.1f MiB", (double)bytes / 1048576.0);
    return buf;
}

/* What /dev/shm has free and the way out, for an error where it has too little; "" when
 * it cannot say. */
static void room_text(char *out, size_t len)
{
    struct statvfs sv;
    char avail[32], size[32];
    out[0] = 0;
    if (statvfs("/dev/shm", &sv) == 0)
        snprintf(out, len,
                 ": /dev/shm has %s of %s free; enlarge it (docker run --shm-size) or set "
                 "TUTTI_TRANSPORT=tcp",
                 size_text((uint64_t)sv.f_bavail * sv.f_frsize, avail, sizeof(avail)),
                 size_text((uint64_t)sv.f_blocks * sv.f_frsize, size, sizeof(size)));
}

/* A new segment of `bytes`, mapped, whose first `reserve` bytes (all of them, or a pair's
 * header) are taken from /dev/shm now: a full /dev/shm then fails here, not with SIGBUS
 * later. With fd_p, the descriptor is kept there to reserve the rest later
 * (shm_link_activate). */
static void *seg_create(shm_tp_t *tp, const char *name, size_t bytes, size_t reserve, int *fd_p)
{
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        ERRF(TUTTI_ERR_IO, -1, errno, "shm: cannot create segment %s", name);
        return NULL;
    }
    int st = reserve < bytes && ftruncate(fd, (off_t)bytes) < 0 ? errno : 0;
    while (!st && (st = posix_fallocate(fd, 0, (off_t)reserve)) == EINTR)
        st = 0;
    if (st == EOPNOTSUPP || st == EINVAL)
        st = ftruncate(fd, (off_t)bytes) < 0 ? errno : 0;
    if (st) {
        char room[200] = "";
        if (st == ENOSPC)
            room_text(room, sizeof(room));
        ERRF(TUTTI_ERR_NOMEM, -1, st, "shm: cannot size segment %s to %zu bytes%s", name, bytes,
             room[0] ? room : " (is /dev/shm full?)");
        close(fd);
        shm_unlink(name);
        return NULL;
    }
    /* MAP_POPULATE where all of it is reserved: map every page now, in this process and
     * (seg_open) in the peer's; else the first pass through a ring takes a minor fault
     * per page on each side (a 4 KiB alltoall was 5 us a call for its first 1 MiB). A
     * pair's rings get the same at its first use (shm_link_activate). */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | (reserve >= bytes ? MAP_POPULATE : 0), fd, 0);
    int err = errno;
    if (p == MAP_FAILED) {
        close(fd);
        shm_unlink(name);
        ERRF(TUTTI_ERR_NOMEM, -1, err, "shm: cannot map segment %s (%zu bytes)", name, bytes);
        return NULL;
    }
    if (fd_p)
        *fd_p = fd;
    else
        close(fd);
    return p;
}

/* Rank p failed its set-up and its record says why ("0 <reason>", setup_failed): the
 * error that quotes it (TUTTI_ERR_PEER), else 0. Quick: the record is there or not. */
static int peer_failed_why(shm_tp_t *tp, int p)
{
    const tutti_tp_host_v1_t *h = tp->host;
    char key[64], text[400];
    snprintf(key, sizeof(key), "shm/%d", p);
    void *v = NULL;
    size_t vlen = 0;
    if (h->store_get(h->ctx, key, &v, &vlen, 200) < 0)
        return 0;
    snprintf(text, sizeof(text), "%.*s", (int)(vlen < sizeof(text) ? vlen : sizeof(text) - 1),
             (const char *)v);
    h->free_value(v);
    if (strncmp(text, "0 ", 2))
        return 0;
    return ERRF(TUTTI_ERR_PEER, p, 0, "shm: rank %d could not set up shared memory: %s", p,
                text + 2);
}

/* A peer's segment, mapped (with populate: every page now, else none), the descriptor
 * kept in *fd_p where fd_p is not NULL; NULL with the error's status in *st_p: this
 * rank's own where the mapping failed, TUTTI_ERR_PEER where the name is gone (with the
 * peer's reason where its set-up failed and removed it). */
static void *seg_open(shm_tp_t *tp, const char *name, int peer, size_t min_bytes, size_t *bytes_p,
                      int populate, int *fd_p, int *st_p)
{
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        if (err != ENOENT || !(*st_p = peer_failed_why(tp, peer)))
            *st_p = ERRF(err == ENOENT ? TUTTI_ERR_PEER : TUTTI_ERR_IO, peer, err,
                         "shm: cannot open rank %d's segment %s (is it on this host, and alive?)",
                         peer, name);
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) < 0 || (size_t)sb.st_size < min_bytes) {
        close(fd);
        *st_p = ERRF(TUTTI_ERR_PROTOCOL, peer, 0, "shm: rank %d's segment %s is too small", peer,
                     name);
        return NULL;
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
    int err = errno;
    if (p == MAP_FAILED) {
        close(fd);
        /* this rank's own failure (its address space, its memory), not the peer's */
        *st_p = ERRF(err == ENOMEM ? TUTTI_ERR_NOMEM : TUTTI_ERR_IO, -1, err,
                     "shm: cannot map rank %d's segment %s (mmap)", peer, name);
        return NULL;
    }
    if (fd_p)
        *fd_p = fd;
    else
        close(fd);
    *bytes_p = (size_t)sb.st_size;
    return p;
}

static size_t pair_header_bytes(void)
{
    size_t pg = 4096;
    return (sizeof(shm_pair_t) + pg - 1) / pg * pg;
}

/* This process's pid namespace: its inode number (unique on the host, and under 2^32:
 * the kernel numbers namespaces from 0xf0000000), or 0 when /proc cannot say. */
static uint32_t pidns_id(void)
{
    unsigned long long ns = tp_pidns();
    return ns <= UINT32_MAX ? (uint32_t)ns : 0;
}

/* Bytes of /dev/shm that nlocal ranks' segments take with rings of `ring` bytes: one
 * segment a pair, one doorbell a rank. */
static uint64_t host_need(int nlocal, size_t ring)
{
    uint64_t pairs = (uint64_t)nlocal * (uint64_t)(nlocal - 1) / 2;
    return pairs * (pair_header_bytes() + 2 * (uint64_t)ring) + (uint64_t)nlocal * 4096u;
}

/* TUTTI_SHM_RING_BYTES unset or auto: halve the rings this rank creates (to SHM_RING_FLOOR
 * at least) until all the local ranks' segments, at that size, fit in half of what
 * /dev/shm has free now. A container's /dev/shm is often 64 MiB, where 16 ranks' 1 MiB
 * rings would need 240. The creator of a pair writes its rings' size in the segment's
 * header, so ranks that look at different moments (a later one sees less free) need not
 * agree, and what they make never exceeds the first look's budget. */
/* Rings that this process's live shm transports set up and may still reserve (their
 * hosts' whole need, room_check): /dev/shm does not count them yet, so each set-up takes
 * them off what it finds free, as the rings reserved in set-up once were. Other
 * processes' jobs are not known here. */
static _Atomic uint64_t g_promised;

/* What /dev/shm has free, less what this process promised (0 when it cannot say); its
 * whole size in *total_p (may be NULL). */
static int shm_free(uint64_t *avail_p, uint64_t *total_p)
{
    struct statvfs sv;
    if (statvfs("/dev/shm", &sv) < 0 || sv.f_blocks == 0)
        return -1;
    uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize, promised = atomic_load(&g_promised);
    *avail_p = avail > promised ? avail - promised : 0;
    if (total_p)
        *total_p = (uint64_t)sv.f_blocks * sv.f_frsize;
    return 0;
}

static void ring_fit(shm_tp_t *tp, int nserved)
{
    uint64_t avail;
    if (!tp->ring_auto || nserved < 1 || shm_free(&avail, NULL) < 0)
        return;
    size_t want = tp->ring_bytes, ring = want;
    while (ring > SHM_RING_FLOOR && host_need(nserved + 1, ring) > avail / 2)
        ring >>= 1;
    if (ring == want)
        return;
    tp->ring_bytes = ring;
    int lowest = 1; /* the host's first rank says it as a warning, the others quietly */
    for (int p = 0; p < tp->rank; p++)
        lowest &= !tp->links[p].served;
    char free_text[32];
    LOGF(lowest ? TUTTI_LOG_WARN : TUTTI_LOG_INFO,
         "shm: rings of %zu KiB instead of %zu KiB, for the %d ranks on this host to fit in "
         "half of the %s free in /dev/shm (larger messages take more steps; docker run "
         "--shm-size gives it more)",
         ring >> 10, want >> 10, nserved + 1, size_text(avail, free_text, sizeof(free_text)));
}

/* Whether MADV_POPULATE_WRITE works here (Linux 5.14 on): tried on a page of our own. */
static int madvise_populates(void)
{
#ifdef MADV_POPULATE_WRITE
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 0;
    int ok = madvise(p, 4096, MADV_POPULATE_WRITE) == 0;
    munmap(p, 4096);
    return ok;
#else
    return 0;
#endif
}

/* How this rank reserves a pair's rings at its first use (TUTTI_SHM_RESERVE): madvise
 * where the kernel has it, else fallocate on a descriptor kept for each pair. */
static int reserve_mode(shm_tp_t *tp)
{
    int can = madvise_populates();
    if (tp->reserve == SHM_RESERVE_MADVISE && !can)
        return ERRF(TUTTI_ERR_CONFIG, -1, 0,
                    "shm: TUTTI_SHM_RESERVE=madvise, but this kernel has no "
                    "MADV_POPULATE_WRITE (Linux 5.14 or later): use auto or fallocate");
    if (tp->reserve == SHM_RESERVE_AUTO)
        tp->reserve = can ? SHM_RESERVE_MADVISE : SHM_RESERVE_FALLOCATE;
    return TUTTI_OK;
}

/* The rings are reserved at each pair's first use (shm_link_activate), so set-up alone
 * would pass where they can never all fit, and an exchange with every rank fail later:
 * here the host's need at this ring size (ring_fit shrank it to half of the room where it
 * could) against what /dev/shm has free, less what this process promised. Where that is
 * tight (the need over a quarter of it: a container's small /dev/shm), every pair's rings
 * are reserved in set-up instead (setup_finish), as before session 93, so that a full
 * /dev/shm fails init (and auto goes over tcp) rather than a first message; else the need
 * is promised until the transport goes. The promise is this process's alone: the other
 * ranks' processes set up their communicators (a split's disjoint groups, at once) each
 * seeing the room free, and on a small /dev/shm their first uses then took it all and a
 * later group's first message failed (8 ranks, world and 4 split groups, in 64 MiB:
 * found by review). So rings are also reserved in set-up wherever the whole /dev/shm is
 * under SHM_SMALL_ROOM (a container's): that is where the race bites, and set-up then
 * fails (auto: tcp) rather than a first message. A host's large /dev/shm keeps the
 * reservation at first use (64 ranks set up in 1.2 s instead of 5.3, session 93).
 * TUTTI_SHM_RESERVE_AT=setup or first-use decides it instead (room permitting). */
#define SHM_SMALL_ROOM (1ull << 30)
static int room_check(shm_tp_t *tp, int nserved)
{
    uint64_t avail, total;
    if (nserved < 1 || shm_free(&avail, &total) < 0)
        return TUTTI_OK;
    uint64_t need = host_need(nserved + 1, tp->ring_bytes);
    if (need <= avail) {
        tp->eager = tp->reserve_at == SHM_AT_SETUP ||
                    (tp->reserve_at == SHM_AT_AUTO && (need > avail / 4 || total < SHM_SMALL_ROOM));
        if (!tp->eager) {
            tp->promised = need;
            atomic_fetch_add(&g_promised, need);
        }
        return TUTTI_OK;
    }
    char room[200], other[96] = "", need_text[32], promised_text[32];
    room_text(room, sizeof(room));
    uint64_t promised = atomic_load(&g_promised);
    if (promised)
        snprintf(other, sizeof(other), " (%s of it this process's other communicators may take)",
                 size_text(promised, promised_text, sizeof(promised_text)));
    return ERRF(TUTTI_ERR_NOMEM, -1, ENOSPC,
                "shm: the %d ranks on this host need %s for rings of %zu KiB%s%s", nserved + 1,
                size_text(need, need_text, sizeof(need_text)), tp->ring_bytes >> 10, room, other);
}

/* Names whose creator died in its set-up (SIGKILLed before it could unlink them: a
 * launcher stopping a job that failed to start) stay in /dev/shm until removed, and a
 * container's small /dev/shm fills up with them. Those of this user whose creator's pid
 * is gone are removed: at once when the name says it was made in this pid namespace
 * (its nonce's high half), else once older than SHM_STALE_S (or twice this rank's
 * timeout). A creator alive in another pid namespace that shares /dev/shm looks gone
 * from here; its names live only through its set-up, which no timeout lets last that
 * long. */
static void sweep_stale(shm_tp_t *tp)
{
    uint32_t ns = pidns_id();
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    time_t now = time(NULL), age = SHM_STALE_S;
    if (tp->host->timeout_ms / 500 > age)
        age = tp->host->timeout_ms / 500;
    uid_t me = geteuid();
    int last = 0, last_gone = 0, n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid = 0, off = 0;
        unsigned long long nonce = 0;
        if (sscanf(e->d_name, "tutti-shm-%d-%16llx-%n", &pid, &nonce, &off) != 2 || !off ||
            pid <= 0 || pid == (int)tp->pid)
            continue;
        /* made in this pid namespace: a pid gone is a creator gone, whatever the age */
        int here = ns && (uint32_t)(nonce >> 32) == ns;
        if (pid != last) { /* one process's names come together: one look at it */
            last = pid;
            last_gone = kill(pid, 0) < 0 && errno == ESRCH;
        }
        struct stat sb;
        if (!last_gone || fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
            sb.st_uid != me || (!here && now - sb.st_ctime < age))
            continue;
        n += unlinkat(dirfd(d), e->d_name, 0) == 0;
    }
    closedir(d);
    if (n)
        LOGF(TUTTI_LOG_INFO,
             "shm: removed %d names from /dev/shm that ranks which died in their set-up left", n);
}

static void bell_name(char *out, size_t len, pid_t pid, uint64_t nonce)
{
    snprintf(out, len, "/tutti-shm-%d-%016llx-bell", (int)pid, (unsigned long long)nonce);
}

/* The wake-up socket's path: where shm_open keeps the segments (/dev/shm on Linux). */
static void wake_path(char *out, size_t len, pid_t pid, uint64_t nonce)
{
    snprintf(out, len, "/dev/shm/tutti-shm-%d-%016llx-wake", (int)pid, (unsigned long long)nonce);
}

/* A datagram socket connected to the wake-up socket at path, or -1 (errno set). A
 * socket, not a FIFO: a send to a peer that is gone fails (ECONNREFUSED), where a write
 * to a FIFO without a reader raises SIGPIPE in the writer. */
static int wake_connect(const char *path)
{
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* Our wake-up socket, for arm(): peers send a byte to it where they would wake our
 * futex, and abort() through wake_self. Without one this rank never sleeps armed;
 * nothing else depends on it. */
static void wake_create(shm_tp_t *tp)
{
    wake_path(tp->wake_path, sizeof(tp->wake_path), tp->pid, tp->nonce);
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", tp->wake_path);
    tp->wake_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (tp->wake_fd < 0 || bind(tp->wake_fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
        (tp->wake_self = wake_connect(tp->wake_path)) < 0) {
        LOGF(TUTTI_LOG_INFO, "shm: cannot make the wake-up socket %s: %s", tp->wake_path,
             strerror(errno));
        if (tp->wake_fd >= 0)
            close(tp->wake_fd);
        tp->wake_fd = -1;
        unlink(tp->wake_path);
        tp->wake_path[0] = 0;
        return;
    }
    atomic_store(&tp->bell->wake_ok, 1);
}

static void pair_name(char *out, size_t len, pid_t pid, uint64_t nonce, int hi)
{
    snprintf(out, len, "/tutti-shm-%d-%016llx-%d", (int)pid, (unsigned long long)nonce, hi);
}

/* Touch every page of a link's two rings once, at its first use. MAP_POPULATE (or
 * MADV_POPULATE_WRITE) maps them in this process's page tables, yet a VM may still stop
 * on each page's first access
 * (this one does, 4-5 us a page per process, read or write, which ru_minflt does not
 * count): a 2-rank 2 KiB allreduce took 6 us a call for its first 1 MiB through a ring,
 * 0.3 after. The tx ring (only this rank writes it) gets an atomic add of 0, the rx ring
 * an atomic load: no byte changes, and a peer already using the pair sees none move. */
static void rings_touch(const shm_link_t *L)
{
    const size_t pg = 4096;
    for (size_t off = 0; off < L->cap; off += pg) {
        __atomic_fetch_add(L->txring + off, 0, __ATOMIC_RELAXED);
        (void)__atomic_load_n(L->rxring + off, __ATOMIC_RELAXED);
    }
}

/* Local view of a pair: which direction and ring is ours. ring_bytes and rings_off as
 * checked (the segment's own fields are the creator's to write: not read again). */
static void link_bind(shm_tp_t *tp, shm_link_t *L, shm_pair_t *seg, size_t bytes,
                      uint64_t ring_bytes, uint64_t rings_off)
{
    L->seg = seg;
    L->seg_bytes = bytes;
    L->cap = ring_bytes;
    L->mask = ring_bytes - 1;
    unsigned char *rings = (unsigned char *)seg + rings_off;
    int lo = tp->rank < L->peer;
    L->tx = &seg->dir[lo ? 0 : 1];
    L->rx = &seg->dir[lo ? 1 : 0];
    L->txring = rings + (lo ? 0 : ring_bytes);
    L->rxring = rings + (lo ? ring_bytes : 0);
    L->tx->probe_val = tp->nonce ^ ((uint64_t)L->peer << 48) ^ 0x9e3779b97f4a7c15ull;
    L->tx->probe_addr = (uint64_t)(uintptr_t)&L->tx->probe_val;
    L->tx_key = L->tx->key;
    L->rx_key = L->rx->key;
}

int shm_link_activate(shm_tp_t *tp, shm_link_t *L)
{
    if (L->active)
        return TUTTI_OK;
    unsigned char *rings = L->txring < L->rxring ? L->txring : L->rxring;
    size_t len = 2 * (size_t)L->cap;
    /* Both ends reserve the same pages of the one file: the first does, the other finds
     * them there. A peer that writes a record has reserved them: a receiver looks at the
     * ring only after its own reservation, or after the sender's. */
    int st = 0, reserved = 0;
    if (L->seg_fd >= 0) {
        do /* an older tmpfs gives up on any signal */
            st = posix_fallocate(L->seg_fd, (off_t)(rings - (unsigned char *)L->seg), (off_t)len);
        while (st == EINTR);
        reserved = !st;
        if (st == EOPNOTSUPP || st == EINVAL)
            st = 0; /* not here: madvise below, or the touch, as set-up once did */
        if (!st) {
            close(L->seg_fd);
            L->seg_fd = -1;
        }
    }
#ifdef MADV_POPULATE_WRITE
    /* maps them, and reserves them where nothing did (a page /dev/shm has no room for
     * fails it with EFAULT, where a touch would raise SIGBUS) */
    int r = 0;
    while (!st && (r = madvise(rings, len, MADV_POPULATE_WRITE)) < 0 && errno == EINTR)
        ;
    if (!st && r < 0 && !reserved && errno != EINVAL)
        st = errno == EFAULT ? ENOSPC : errno;
#endif
    if (st) {
        char room[200] = "";
        if (st == ENOSPC)
            room_text(room, sizeof(room));
        return tp->host->error(tp->host->ctx, TUTTI_ERR_NOMEM, L->peer, st,
                               "shm: cannot reserve the %zu KiB of the rings shared with rank %d "
                               "at their first use%s",
                               len >> 10, L->peer, room[0] ? room : " (is /dev/shm full?)");
    }
    rings_touch(L);
    L->active = 1;
    return TUTTI_OK;
}

/* splitmix64's finalizer: a bijection, so a key is as random as the nonce it mixes */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int proc_start_time(pid_t pid, unsigned long long *st_p, char *state_p)
{
    char buf[1024], *end;
    const char *state = tp_proc_stat(pid, buf, sizeof(buf));
    const char *f22 = tp_stat_field(state, 22); /* starttime */
    unsigned long long v = f22 ? strtoull(f22, &end, 10) : 0;
    if (!f22 || end == f22)
        return -1;
    *st_p = v;
    if (state_p)
        *state_p = *state;
    return 0;
}

/* Byte 0 of a doorbell: its owner holds a write lock on it through an open file
 * description of its own (F_OFD_SETLK) for its life; the kernel drops the lock when the
 * last descriptor of that description closes, at the owner's exit or death whatever its
 * pid namespace. A peer that can see neither a pidfd nor /proc of the owner tests the
 * lock (F_OFD_GETLK through its own descriptor: the owner's conflicts while it lives).
 * A child the owner forked (without exec: the descriptor is close-on-exec) holds the
 * description too, and keeps the owner looking alive while it lives. */
static struct flock bell_lock(short type)
{
    return (struct flock){ .l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1 };
}

int shm_peer_gone(shm_link_t *L)
{
    if (L->pidfd >= 0) {
        struct pollfd p = { .fd = L->pidfd, .events = POLLIN };
        return poll(&p, 1, 0) > 0;
    }
    if (L->bell_fd >= 0) {
        struct flock fl = bell_lock(F_WRLCK);
        return fcntl(L->bell_fd, F_OFD_GETLK, &fl) == 0 && fl.l_type == F_UNLCK;
    }
    if (L->pid <= 0 || L->unwatched)
        return 0; /* cannot tell */
    unsigned long long st = 0;
    char state = 0;
    if (proc_start_time(L->pid, &st, &state) < 0)
        return 1;
    return state == 'Z' || state == 'X' || (L->start_time && st != L->start_time);
}

void shm_check_liveness(shm_tp_t *tp, int all)
{
    (void)all;
    if (tp->npfds > 0) {
        int n = poll(tp->pfds, (nfds_t)tp->npfds, 0);
        for (int i = 0; n > 0 && i < tp->npfds; i++)
            if (tp->pfds[i].revents)
                tp->links[tp->pfd_peer[i]].peer_dead = 1;
    }
    for (int i = 0; i < tp->nranks; i++) {
        shm_link_t *L = &tp->links[i];
        if (L->served && L->pidfd < 0 && !L->peer_dead && shm_peer_gone(L))
            L->peer_dead = 1;
    }
}

static void probe_pull(shm_tp_t *tp, shm_link_t *L)
{
    uint32_t verdict = 2;
    if (tp->cma_min || tp->cma_hint_min) {
        uint64_t v = 0;
        struct iovec lo = { &v, sizeof(v) };
        struct iovec re = { (void *)(uintptr_t)L->rx->probe_addr, sizeof(v) };
        ssize_t n = process_vm_readv(L->pid, &lo, 1, &re, 1, 0);
        if (n == (ssize_t)sizeof(v) && v == L->rx->probe_val)
            verdict = 1;
        else
            LOGF(TUTTI_LOG_INFO,
                 "shm: cannot pull from rank %d (pid %d) with process_vm_readv (%s): large "
                 "messages from it go through the ring in chunks",
                 L->peer, (int)L->pid, n < 0 ? strerror(errno) : "wrong value read");
    }
    atomic_store(&L->rx->cma_ok, verdict);
}

/* The CPUs this process may run on, a bit per CPU, into the doorbell for the peers. */
static void publish_cpus(shm_tp_t *tp)
{
    cpu_set_t set;
    memset(tp->bell->cpus, 0, sizeof(tp->bell->cpus));
    if (sched_getaffinity(0, sizeof(set), &set) != 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        CPU_ZERO(&set);
        for (long c = 0; c < (n > 0 ? n : 1) && c < CPU_SETSIZE; c++)
            CPU_SET((int)c, &set);
    }
    for (int c = 0; c < CPU_SETSIZE && c < SHM_CPU_WORDS * 64; c++)
        if (CPU_ISSET(c, &set))
            tp->bell->cpus[c / 64] |= 1ull << (c % 64);
}

/* The CPUs this rank and its local peers may run on between them: ranks each pinned to a
 * CPU of its own are not oversubscribed, though each may use one CPU only. */
static int cpus_available(shm_tp_t *tp)
{
    uint64_t all[SHM_CPU_WORDS];
    memcpy(all, tp->bell->cpus, sizeof(all));
    for (int p = 0; p < tp->nranks; p++)
        if (tp->links[p].served && tp->links[p].peer_bell)
            for (int w = 0; w < SHM_CPU_WORDS; w++)
                all[w] |= tp->links[p].peer_bell->cpus[w];
    int n = 0;
    for (int w = 0; w < SHM_CPU_WORDS; w++)
        n += __builtin_popcountll(all[w]);
    return n > 0 ? n : 1;
}

/* Our doorbell and the pairs we own (with the higher ranks), then our record in the
 * store for the peers to find them. */
static int setup_publish(shm_tp_t *tp, const char *myhost)
{
    const tutti_tp_host_v1_t *h = tp->host;
    tp->bell_bytes = 4096;
    bell_name(tp->bell_name, sizeof(tp->bell_name), tp->pid, tp->nonce);
    tp->bell = seg_create(tp, tp->bell_name, tp->bell_bytes, tp->bell_bytes, &tp->bell_fd);
    if (!tp->bell) {
        tp->bell_name[0] = 0;
        return TUTTI_ERR_IO;
    }
    tp->bell->magic = SHM_SEG_MAGIC;
    tp->bell->owner = tp->rank;
    struct flock fl = bell_lock(F_WRLCK);
    if (fcntl(tp->bell_fd, F_OFD_SETLK, &fl) == 0)
        atomic_store(&tp->bell->locked, 1);
    else
        LOGF(TUTTI_LOG_INFO,
             "shm: cannot lock this rank's doorbell %s (%s): peers in other "
             "pid namespaces see a crash of it only as a timeout",
             tp->bell_name, strerror(errno));
    atomic_store(&tp->bell->cpu, -1);
    tp->cpu = -1;
    wake_create(tp);
    publish_cpus(tp);
    size_t hdr = pair_header_bytes();
    size_t pair_bytes = hdr + 2 * tp->ring_bytes;
    for (int p = tp->rank + 1; p < tp->nranks; p++) {
        shm_link_t *L = &tp->links[p];
        if (!L->served)
            continue;
        char name[64];
        pair_name(name, sizeof(name), tp->pid, tp->nonce, p);
        /* the header now, the rings at the pair's first use (shm_link_activate) */
        shm_pair_t *seg = seg_create(tp, name, pair_bytes, hdr,
                                     tp->reserve == SHM_RESERVE_FALLOCATE ? &L->seg_fd : NULL);
        if (!seg)
            return TUTTI_ERR_IO;
        tp->pair_names[p] = strdup(name);
        if (!tp->pair_names[p]) {
            /* teardown unlinks only the names it knows */
            shm_unlink(name);
            munmap(seg, pair_bytes);
            return ERRF(TUTTI_ERR_NOMEM, -1, 0, "shm: out of memory");
        }
        seg->magic = SHM_SEG_MAGIC;
        seg->version = SHM_VERSION;
        seg->lo = tp->rank;
        seg->hi = p;
        seg->ring_bytes = tp->ring_bytes;
        seg->rings_off = hdr;
        /* the stamp keys of both directions, before hi can map the segment */
        seg->dir[0].key = mix64(tp->nonce ^ ((uint64_t)p << 33));
        seg->dir[1].key = mix64(tp->nonce ^ ((uint64_t)p << 33) ^ 1);
        link_bind(tp, L, seg, pair_bytes, seg->ring_bytes, seg->rings_off);
    }
    char key[64], val[700];
    snprintf(key, sizeof(key), "shm/%d", tp->rank);
    snprintf(val, sizeof(val), "1 %d %016llx %s", (int)tp->pid, (unsigned long long)tp->nonce,
             myhost);
    int st = h->store_set(h->ctx, key, val, strlen(val) + 1);
    if (st < 0)
        return ERRF(st, -1, 0, "shm: cannot publish %s in the store", key);
    tp->published = 1;
    return TUTTI_OK;
}

/* Rank p's record from the store: its pid and nonce (*pid_p, *nonce_p), checked to be
 * on this host. */
static int setup_peer_record(shm_tp_t *tp, int p, const char *myhost, uint64_t deadline, int *pid_p,
                             unsigned long long *nonce_p)
{
    const tutti_tp_host_v1_t *h = tp->host;
    char key[64];
    snprintf(key, sizeof(key), "shm/%d", p);
    void *v = NULL;
    size_t vlen = 0;
    uint64_t now = tp_now_ns();
    int ms = now < deadline ? (int)((deadline - now) / 1000000u) + 1 : 1;
    int st = h->store_get(h->ctx, key, &v, &vlen, ms);
    if (st < 0)
        return ERRF(st, p, 0,
                    "shm: rank %d did not publish its shared-memory address "
                    "within %d ms",
                    p, h->timeout_ms);
    char text[700];
    snprintf(text, sizeof(text), "%.*s", (int)(vlen < sizeof(text) ? vlen : sizeof(text) - 1),
             (const char *)v);
    h->free_value(v);
    int ver = 0, off = 0;
    if (!strncmp(text, "0 ", 2))
        return ERRF(TUTTI_ERR_PEER, p, 0, "shm: rank %d could not set up shared memory: %s", p,
                    text + 2);
    if (sscanf(text, "%d %d %llx %n", &ver, pid_p, nonce_p, &off) != 3 || ver != 1 || *pid_p <= 0)
        return ERRF(TUTTI_ERR_PROTOCOL, p, 0, "shm: rank %d published \"%s\"", p, text);
    if (strcmp(text + off, myhost))
        return ERRF(TUTTI_ERR_CONFIG, p, 0,
                    "shm: rank %d is on another host (%s, this is %s): shared memory cannot "
                    "reach it (use TUTTI_TRANSPORT=auto or tcp)",
                    p, text + off, myhost);
    return TUTTI_OK;
}

/* Map the pair a lower rank p owns with us, check it, and drop its name. */
static int setup_open_pair(shm_tp_t *tp, shm_link_t *L, int p, int pid, unsigned long long nonce)
{
    char name[64];
    pair_name(name, sizeof(name), pid, nonce, tp->rank);
    size_t sb = 0;
    int st = TUTTI_ERR_PEER;
    shm_pair_t *seg = seg_open(tp, name, p, sizeof(shm_pair_t), &sb, 0,
                               tp->reserve == SHM_RESERVE_FALLOCATE ? &L->seg_fd : NULL, &st);
    if (!seg)
        return st;
    shm_unlink(name); /* both ends have it mapped: the name has done its job */
    /* the creator's numbers, read once: the rings must lie after the header and within
     * the mapping (compared without a sum that could wrap) */
    const uint64_t rb = *(volatile uint64_t *)&seg->ring_bytes,
                   ro = *(volatile uint64_t *)&seg->rings_off;
    if (seg->magic != SHM_SEG_MAGIC || seg->version != SHM_VERSION || seg->lo != p ||
        seg->hi != tp->rank || rb < SHM_RING_FLOOR || (rb & (rb - 1)) || rb > sb / 2 ||
        ro < sizeof(shm_pair_t) || ro > sb - 2 * rb) {
        munmap(seg, sb);
        close(L->seg_fd);
        L->seg_fd = -1;
        return ERRF(TUTTI_ERR_PROTOCOL, p, 0,
                    "shm: segment %s from rank %d is not "
                    "one this version understands",
                    name, p);
    }
    link_bind(tp, L, seg, sb, rb, ro);
    atomic_store(&seg->attached, 1);
    probe_pull(tp, L);
    return TUTTI_OK;
}

/* Rank p: its record, its doorbell, the pair it owns with us (if lower), and a watch on
 * its process. */
static int setup_attach_peer(shm_tp_t *tp, int p, const char *myhost, uint64_t deadline)
{
    shm_link_t *L = &tp->links[p];
    int pid = 0;
    unsigned long long nonce = 0;
    int st = setup_peer_record(tp, p, myhost, deadline, &pid, &nonce);
    if (st < 0)
        return st;
    L->pid = pid;
    snprintf(L->addr, sizeof(L->addr), "shm:pid %d", pid);
    char name[64];
    bell_name(name, sizeof(name), pid, nonce);
    size_t bb = 0;
    st = TUTTI_ERR_PEER;
    L->peer_bell = seg_open(tp, name, p, sizeof(shm_bell_t), &bb, 1, &L->bell_fd, &st);
    if (!L->peer_bell)
        return st;
    L->peer_bell_bytes = bb;
    if (L->peer_bell->magic != SHM_SEG_MAGIC || L->peer_bell->owner != p)
        return ERRF(TUTTI_ERR_PROTOCOL, p, 0, "shm: %s is not rank %d's doorbell", name, p);
    if (atomic_load(&L->peer_bell->wake_ok)) {
        char path[96];
        wake_path(path, sizeof(path), pid, nonce);
        L->peer_wake_fd = wake_connect(path);
        if (L->peer_wake_fd < 0) { /* then rank p must not sleep where we cannot wake it */
            LOGF(TUTTI_LOG_INFO, "shm: cannot reach rank %d's wake-up socket %s: %s", p, path,
                 strerror(errno));
            atomic_fetch_add(&L->peer_bell->wake_missing, 1);
        }
    }
    atomic_fetch_add(&L->peer_bell->attached, 1);
    if (p < tp->rank && (st = setup_open_pair(tp, L, p, pid, nonce)) < 0)
        return st;
    /* the peer's pid is its own pid namespace's (the nonce's high half names that one):
     * from another, the same number is some other process, which must not be watched */
    uint32_t peer_ns = (uint32_t)(nonce >> 32), my_ns = pidns_id();
    const char *why = NULL;
    if (peer_ns && my_ns && peer_ns != my_ns) {
        why = "in another pid namespace";
    } else {
        L->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
        if (L->pidfd < 0) {
            L->pidfd = -1;
            if (proc_start_time(pid, &L->start_time, NULL) < 0)
                why = strerror(errno); /* not visible from here (hidepid) */
        }
    }
    if (!why) { /* watched through its pid */
        close(L->bell_fd);
        L->bell_fd = -1;
        return TUTTI_OK;
    }
    if (atomic_load(&L->peer_bell->locked)) { /* through its doorbell's lock */
        LOGF(TUTTI_LOG_INFO, "shm: watching rank %d (pid %d: %s) through its doorbell's lock", p,
             pid, why);
        return TUTTI_OK;
    }
    /* as said below, not "gone" at the first stall */
    close(L->bell_fd);
    L->bell_fd = -1;
    L->unwatched = 1;
    LOGF(TUTTI_LOG_WARN,
         "shm: cannot watch rank %d (pid %d: %s, and it holds no lock on its doorbell); a "
         "crash of it shows only as a timeout",
         p, pid, why);
    return TUTTI_OK;
}

/* A served peer whose doorbell says its set-up failed: an error naming it, else 0. */
static int peer_failed(shm_tp_t *tp)
{
    for (int p = 0; p < tp->nranks; p++) {
        const shm_link_t *L = &tp->links[p];
        if (L->served && L->peer_bell && atomic_load(&L->peer_bell->state) == SHM_SETUP_FAILED) {
            int st = peer_failed_why(tp, p); /* its record, rewritten before its doorbell */
            return st ? st
                      : ERRF(TUTTI_ERR_PEER, p, 0,
                             "shm: rank %d could not set up shared memory (its log says why)", p);
        }
    }
    return 0;
}

/* Wait for the peers to map ours, then unlink the names. */
static int setup_wait_mapped(shm_tp_t *tp, int nserved, uint64_t deadline)
{
    const tutti_tp_host_v1_t *h = tp->host;
    for (;;) {
        int st = peer_failed(tp);
        if (st < 0)
            return st;
        int missing = -1;
        if ((int)atomic_load(&tp->bell->attached) < nserved)
            missing = -2;
        for (int p = tp->rank + 1; p < tp->nranks && missing == -1; p++)
            if (tp->links[p].served && !atomic_load(&tp->links[p].seg->attached))
                missing = p;
        if (missing == -1)
            break;
        if (tp_now_ns() >= deadline) {
            if (missing >= 0)
                return ERRF(TUTTI_ERR_TIMEOUT, missing, 0,
                            "shm: rank %d did not map its "
                            "shared-memory segment within %d ms",
                            missing, h->timeout_ms);
            return ERRF(TUTTI_ERR_TIMEOUT, -1, 0,
                        "shm: only %u of %d peers mapped this rank's "
                        "doorbell within %d ms",
                        atomic_load(&tp->bell->attached), nserved, h->timeout_ms);
        }
        sleep_us(200);
    }
    shm_unlink(tp->bell_name);
    tp->bell_name[0] = 0;
    if (tp->wake_path[0]) {
        unlink(tp->wake_path);
        tp->wake_path[0] = 0;
    }
    if (tp->wake_fd >= 0 && atomic_load(&tp->bell->wake_missing)) {
        close(tp->wake_fd); /* some peer cannot reach it */
        close(tp->wake_self);
        tp->wake_fd = tp->wake_self = -1;
    }
    for (int p = tp->rank + 1; p < tp->nranks; p++) {
        if (!tp->pair_names[p])
            continue;
        shm_unlink(tp->pair_names[p]);
        free(tp->pair_names[p]);
        tp->pair_names[p] = NULL;
        probe_pull(tp, &tp->links[p]);
    }
    return TUTTI_OK;
}

/* The liveness watch list, and a line on how messages will travel. */
static int setup_finish(shm_tp_t *tp, int nserved)
{
    tp->pfds = calloc((size_t)tp->nranks, sizeof(*tp->pfds));
    tp->pfd_peer = calloc((size_t)tp->nranks, sizeof(int));
    if (!tp->pfds || !tp->pfd_peer)
        return ERRF(TUTTI_ERR_NOMEM, -1, 0, "shm: out of memory");
    for (int p = 0; p < tp->nranks && tp->eager; p++) {
        int st = tp->links[p].served ? shm_link_activate(tp, &tp->links[p]) : 0;
        if (st < 0)
            return st;
    }
    for (int p = 0; p < tp->nranks; p++) {
        if (tp->links[p].served && tp->links[p].pidfd >= 0) {
            tp->pfds[tp->npfds] = (struct pollfd){ .fd = tp->links[p].pidfd, .events = POLLIN };
            tp->pfd_peer[tp->npfds++] = p;
        }
    }
    tp->oversubscribed = nserved + 1 > cpus_available(tp);
    if (tp->cma_hint_min == SHM_CMA_HINT_AUTO)
        tp->cma_hint_min = tp->oversubscribed ? SHM_CMA_HINT_CROWDED : SHM_CMA_HINT_SPARE;
    int pulls = 0;
    for (int p = 0; p < tp->nranks; p++)
        pulls += tp->links[p].served && atomic_load(&tp->links[p].rx->cma_ok) == 1;
    char pulled[160] = "";
    if (tp->cma_min || tp->cma_hint_min) {
        char all[48] = "", hinted[64] = "";
        if (tp->cma_min)
            snprintf(all, sizeof(all), "messages of %zu bytes or more", tp->cma_min);
        if (tp->cma_hint_min)
            snprintf(hinted, sizeof(hinted), "%sexchange messages of %zu bytes or more",
                     tp->cma_min ? " and " : "", tp->cma_hint_min);
        snprintf(pulled, sizeof(pulled), "; %s%s are pulled with process_vm_readv from %d of them",
                 all, hinted, pulls);
    }
    LOGF(TUTTI_LOG_INFO, "shm: %d local peers, rings of %zu bytes%s%s", nserved, tp->ring_bytes,
         pulled[0] ? pulled : ", every message streams through the ring",
         tp->oversubscribed ? "; more ranks than CPUs: spinning yields" : "");
    return TUTTI_OK;
}

/* Every local rank set up, or none: say READY, and wait until every served peer has. A
 * rank returns from set-up only past this point, so one whose peer failed anywhere in its
 * set-up fails too (and the multiplexer can then move them all to another transport). */
static int setup_ready(shm_tp_t *tp, uint64_t deadline)
{
    atomic_store(&tp->bell->state, SHM_SETUP_READY);
    for (;;) {
        int st = peer_failed(tp), waiting = -1;
        if (st < 0)
            return st;
        for (int p = 0; p < tp->nranks && waiting < 0; p++)
            if (tp->links[p].served &&
                atomic_load(&tp->links[p].peer_bell->state) != SHM_SETUP_READY)
                waiting = p;
        if (waiting < 0)
            return TUTTI_OK;
        if (tp_now_ns() >= deadline)
            return ERRF(TUTTI_ERR_TIMEOUT, waiting, 0,
                        "shm: rank %d did not finish its shared-memory set-up within %d ms",
                        waiting, tp->host->timeout_ms);
        sleep_us(100);
    }
}

/* This rank's set-up failed: its peers must learn it rather than wait for it, and why.
 * Its record in the store says why ("0 <reason>", replacing its address where it was
 * published: a peer that reads it later, or finds this rank's names gone, quotes it);
 * then, once published, its doorbell (which they map) says so too, after the record,
 * so that a peer that sees the doorbell finds the reason. */
static void setup_failed(shm_tp_t *tp)
{
    const tutti_tp_host_v1_t *h = tp->host;
    char key[64], val[400];
    snprintf(key, sizeof(key), "shm/%d", tp->rank);
    snprintf(val, sizeof(val), "0 %s", tp->why[0] ? tp->why : "(no reason given)");
    int was = tp->published;
    if (h->store_set(h->ctx, key, val, strlen(val) + 1) == 0)
        tp->published = 1;
    if (was && tp->bell)
        atomic_store(&tp->bell->state, SHM_SETUP_FAILED);
}

static int setup_steps(shm_tp_t *tp, int nserved, const char *myhost, uint64_t deadline)
{
    int st = setup_publish(tp, myhost);
    if (st < 0)
        return st;
    for (int p = 0; p < tp->nranks; p++)
        if (tp->links[p].served && (st = setup_attach_peer(tp, p, myhost, deadline)) < 0)
            return st;
    if ((st = setup_wait_mapped(tp, nserved, deadline)) < 0)
        return st;
    if ((st = setup_finish(tp, nserved)) < 0)
        return st;
    return setup_ready(tp, deadline);
}

int shm_setup(shm_tp_t *tp)
{
    const tutti_tp_host_v1_t *h = tp->host;
    uint64_t deadline = tp_now_ns() +
                        (uint64_t)(h->timeout_ms > 0 ? h->timeout_ms : 30000) * 1000000ull;
    tp->pid = getpid();
    uint32_t rnd;
    if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd))
        rnd = (uint32_t)(tp_now_ns() ^ ((uint64_t)tp->pid << 16) ^ (uint64_t)(uintptr_t)tp);
    /* the names' nonce: this pid namespace's id above 32 random bits (sweep_stale) */
    tp->nonce = ((uint64_t)pidns_id() << 32) | rnd;
    char myhost[512];
    host_identity(tp, myhost, sizeof(myhost));
    int nserved = 0, lowest = 1;
    for (int p = 0; p < tp->nranks; p++) {
        nserved += tp->links[p].served;
        lowest &= !(p < tp->rank && tp->links[p].served);
    }
    /* the host's first rank alone: every rank's readdir of a /dev/shm that holds the
     * other ranks' n^2 names made set-up O(n^3) on the host (160 ranks: 2.5 CPU-s) */
    if (lowest)
        sweep_stale(tp);
    ring_fit(tp, nserved);
    int st = reserve_mode(tp);
    if (st == 0)
        st = room_check(tp, nserved);
    char fds[320];
    /* a peer's pidfd and wake-up socket, and its segment until the pair's first use */
    const int k = 2 + (tp->reserve == SHM_RESERVE_FALLOCATE), per_peer[2] = { k, k };
    /* its own: the wake-up socket and a descriptor to it, a segment open for a moment */
    if (st == 0 && tp_fd_room(h, "shm", nserved, per_peer, 4, fds, sizeof(fds)) < 0)
        st = ERRF(TUTTI_ERR_IO, -1, EMFILE, "%s", fds);
    if (st == 0)
        st = setup_steps(tp, nserved, myhost, deadline);
    if (st < 0)
        setup_failed(tp);
    return st;
}

void shm_teardown(shm_tp_t *tp)
{
    if (tp->promised)
        atomic_fetch_sub(&g_promised, tp->promised);
    tp->promised = 0;
    if (tp->bell_name[0])
        shm_unlink(tp->bell_name);
    if (tp->wake_path[0])
        unlink(tp->wake_path);
    if (tp->wake_fd >= 0) {
        close(tp->wake_fd);
        close(tp->wake_self);
    }
    for (int p = 0; p < tp->nranks; p++) {
        shm_link_t *L = &tp->links[p];
        if (tp->pair_names && tp->pair_names[p]) {
            shm_unlink(tp->pair_names[p]);
            free(tp->pair_names[p]);
        }
        if (L->seg)
            munmap(L->seg, L->seg_bytes);
        if (L->seg_fd >= 0)
            close(L->seg_fd);
        if (L->peer_bell)
            munmap(L->peer_bell, L->peer_bell_bytes);
        if (L->pidfd >= 0)
            close(L->pidfd);
        if (L->bell_fd >= 0)
            close(L->bell_fd);
        if (L->peer_wake_fd >= 0)
            close(L->peer_wake_fd);
    }
    if (tp->bell)
        munmap(tp->bell, tp->bell_bytes);
    if (tp->bell_fd >= 0)
        close(tp->bell_fd);
    free(tp->pfds);
    free(tp->pfd_peer);
}
