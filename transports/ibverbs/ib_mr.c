/* ibverbs transport: the memory registration cache.
 * Design notes: docs/internals.md, "The ibverbs registration cache". */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "ib.h"

#define IB_MRC_MAX_ENTRIES 4096
#define PFN_MASK ((1ull << 55) - 1)
#define PFN_PRESENT (1ull << 63)

const char *ib_mrc_mode_name(int mode)
{
    switch (mode) {
    case IB_MRC_PAGEMAP: return "pagemap";
    case IB_MRC_ODP: return "odp";
    case IB_MRC_TRUST: return "trust";
    default: return "off";
    }
}

/* /proc/self/pagemap of this process (a forked child must not read its parent's). */
static int pagemap_fd(ib_mrc_t *c)
{
    pid_t me = getpid();
    if (c->pagemap_fd >= 0 && c->pagemap_pid == me)
        return c->pagemap_fd;
    if (c->pagemap_fd >= 0)
        close(c->pagemap_fd);
    c->pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    c->pagemap_pid = me;
    return c->pagemap_fd;
}

/* Page frames of n pages from start; 0 for a page not present. Returns 0 or -1. */
static int read_pfns(ib_mrc_t *c, uintptr_t start, size_t n, uint64_t *out)
{
    int fd = pagemap_fd(c);
    if (fd < 0)
        return -1;
    size_t want = n * sizeof(uint64_t), got = 0;
    off_t off = (off_t)(start / c->page * sizeof(uint64_t));
    while (got < want) {
        ssize_t r = pread(fd, (char *)out + got, want - got, off + (off_t)got);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        got += (size_t)r;
    }
    for (size_t i = 0; i < n; i++)
        out[i] = (out[i] & PFN_PRESENT) ? (out[i] & PFN_MASK) : 0;
    return 0;
}

static int pagemap_usable(ib_mrc_t *c)
{
    volatile char probe[64];
    probe[0] = 1;
    uint64_t pfn = 0;
    uintptr_t a = (uintptr_t)probe & ~(uintptr_t)(c->page - 1);
    return read_pfns(c, a, 1, &pfn) == 0 && pfn != 0 && probe[0] == 1;
}

int ib_mrc_init(ib_mrc_t *c, struct ibv_pd *pd, const char *mode, size_t limit_bytes, int odp_ok,
                char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    c->pd = pd;
    c->limit_bytes = limit_bytes;
    c->page = (size_t)sysconf(_SC_PAGESIZE);
    c->pagemap_fd = -1;
    if (!mode || !*mode || !strcasecmp(mode, "auto")) {
        c->mode = odp_ok ? IB_MRC_ODP : pagemap_usable(c) ? IB_MRC_PAGEMAP : IB_MRC_OFF;
    } else if (!strcasecmp(mode, "off") || !strcmp(mode, "0")) {
        c->mode = IB_MRC_OFF;
    } else if (!strcasecmp(mode, "odp")) {
        if (!odp_ok) {
            snprintf(err, errlen,
                     "TUTTI_IB_MR_CACHE=odp, but the device has no on-demand "
                     "paging for RC READ");
            return -1;
        }
        c->mode = IB_MRC_ODP;
    } else if (!strcasecmp(mode, "pagemap")) {
        if (!pagemap_usable(c)) {
            snprintf(err, errlen,
                     "TUTTI_IB_MR_CACHE=pagemap, but /proc/self/pagemap shows "
                     "no page frames (they need CAP_SYS_ADMIN)");
            return -1;
        }
        c->mode = IB_MRC_PAGEMAP;
    } else if (!strcasecmp(mode, "trust")) {
        c->mode = IB_MRC_TRUST;
    } else {
        snprintf(err, errlen, "TUTTI_IB_MR_CACHE=%s: expected auto, off, pagemap, odp or trust",
                 mode);
        return -1;
    }
    if (c->limit_bytes == 0)
        c->mode = IB_MRC_OFF;
    return 0;
}

static void list_unlink(ib_mrc_t *c, ib_mr_entry_t *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void list_push_front(ib_mrc_t *c, ib_mr_entry_t *e)
{
    e->prev = NULL;
    e->next = c->head;
    if (c->head)
        c->head->prev = e;
    c->head = e;
    if (!c->tail)
        c->tail = e;
}

static void entry_free(ib_mr_entry_t *e)
{
    if (e->mr)
        ibv_dereg_mr(e->mr);
    free(e->pfn);
    free(e);
}

/* Take e out of the cache; it dies now, or with its last reference. */
static void entry_drop(ib_mrc_t *c, ib_mr_entry_t *e)
{
    if (e->cached) {
        list_unlink(c, e);
        e->cached = 0;
        c->bytes -= e->end - e->start;
        c->entries--;
    }
    if (e->refs == 0)
        entry_free(e);
}

/* Deregister unreferenced entries from the cold end until under the limits. */
static void evict(ib_mrc_t *c, size_t limit, int max_entries)
{
    ib_mr_entry_t *e = c->tail;
    while (e && (c->bytes > limit || c->entries > max_entries)) {
        ib_mr_entry_t *prev = e->prev;
        if (e->refs == 0) {
            entry_drop(c, e);
            c->evictions++;
        }
        e = prev;
    }
}

/* Is e still backed by the pages it pinned, over [s, end)? */
static int entry_valid(ib_mrc_t *c, ib_mr_entry_t *e, uintptr_t s, uintptr_t end)
{
    if (c->mode != IB_MRC_PAGEMAP)
        return 1;
    size_t first = (s - e->start) / c->page, n = (end - s) / c->page;
    uint64_t buf[512];
    for (size_t done = 0; done < n;) {
        size_t k = n - done < 512 ? n - done : 512;
        if (read_pfns(c, s + done * c->page, k, buf) < 0 ||
            memcmp(buf, e->pfn + first + done, k * sizeof(uint64_t)) != 0)
            return 0;
        done += k;
    }
    return 1;
}

int ib_mrc_get(ib_mrc_t *c, const void *addr, size_t len, int local_write, ib_mr_entry_t **e_p)
{
    uintptr_t s = (uintptr_t)addr & ~(uintptr_t)(c->page - 1);
    uintptr_t end = ((uintptr_t)addr + (len ? len : 1) + c->page - 1) & ~(uintptr_t)(c->page - 1);
    int need = local_write ? IBV_ACCESS_LOCAL_WRITE : IBV_ACCESS_REMOTE_READ;
    if (c->mode != IB_MRC_OFF) {
        for (ib_mr_entry_t *e = c->head; e; e = e->next) {
            if (e->start > s || e->end < end || (e->access & need) != need)
                continue;
            if (!entry_valid(c, e, s, end)) {
                /* the range was unmapped and mapped again since: a freed buffer */
                c->invalidations++;
                entry_drop(c, e);
                break;
            }
            c->hits++;
            e->refs++;
            if (c->head != e) {
                list_unlink(c, e);
                list_push_front(c, e);
            }
            *e_p = e;
            return 0;
        }
    }
    c->misses++;
    ib_mr_entry_t *e = calloc(1, sizeof(*e));
    if (!e)
        return ENOMEM;
    e->start = s;
    e->end = end;
    int odp = c->mode == IB_MRC_ODP ? IBV_ACCESS_ON_DEMAND : 0;
    /* Both directions where the memory allows, so one entry serves sends and receives
     * of the same buffer; a read-only send buffer cannot take LOCAL_WRITE. */
    int tries[2] = { IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_READ };
    int err = 0;
    for (int t = 0; t < (local_write ? 1 : 2) && !e->mr; t++) {
        for (int attempt = 0; attempt < 2 && !e->mr; attempt++) {
            e->mr = ibv_reg_mr(c->pd, (void *)s, end - s, tries[t] | odp);
            if (e->mr) {
                e->access = tries[t];
                break;
            }
            err = errno ? errno : EIO;
            if ((err == ENOMEM || err == EAGAIN) && attempt == 0 && c->head)
                evict(c, 0, 0); /* out of lockable memory: give back what is idle */
            else
                break;
        }
    }
    if (!e->mr) {
        free(e);
        return err;
    }
    if (c->mode == IB_MRC_PAGEMAP) {
        size_t n = (end - s) / c->page;
        e->pfn = malloc(n * sizeof(uint64_t));
        if (!e->pfn || read_pfns(c, s, n, e->pfn) < 0) {
            /* cannot check it later: use it once, uncached */
            free(e->pfn);
            e->pfn = NULL;
            e->refs = 1;
            *e_p = e;
            return 0;
        }
    }
    e->refs = 1;
    if (c->mode != IB_MRC_OFF && end - s <= c->limit_bytes) {
        e->cached = 1;
        list_push_front(c, e);
        c->bytes += end - s;
        c->entries++;
        evict(c, c->limit_bytes, IB_MRC_MAX_ENTRIES);
    }
    *e_p = e;
    return 0;
}

int ib_mrc_get_once(ib_mrc_t *c, const void *addr, size_t len, ib_mr_entry_t **e_p)
{
    int mode = c->mode;
    c->mode = IB_MRC_OFF; /* registered per message: refs 1, never cached */
    int e = ib_mrc_get(c, addr, len, 1, e_p);
    c->mode = mode;
    return e;
}

void ib_mrc_put(ib_mrc_t *c, ib_mr_entry_t *e)
{
    (void)c;
    if (!e)
        return;
    if (--e->refs == 0 && !e->cached)
        entry_free(e);
}

void ib_mrc_destroy(ib_mrc_t *c)
{
    while (c->head) {
        ib_mr_entry_t *e = c->head;
        list_unlink(c, e);
        e->cached = 0;
        /* a still-referenced entry belongs to a request the transport dropped: the
         * protection domain goes away now, so it goes too */
        entry_free(e);
    }
    c->bytes = 0;
    c->entries = 0;
    if (c->pagemap_fd >= 0)
        close(c->pagemap_fd);
    c->pagemap_fd = -1;
}
