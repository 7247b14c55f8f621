/* Shared-memory transport for ranks on one host.
 * Design notes: docs/internals.md, "The shm transport". */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "shm.h"
#include "../kit/copy.h"
#include "../kit/progress.h"
#include "../kit/queue.h"

/* Ring per direction: 16 MiB over the local peers, within [64 KiB, 1 MiB]; set-up halves it
 * (to 4 KiB at least) until the host's rings fit in half of /dev/shm's free space. */
#define SHM_RING_BUDGET (16u << 20)
#define SHM_RING_MIN (64u << 10)
#define SHM_RING_MAX (1u << 20)
/* Copies into and out of a ring go in steps of this much, each published at once, so
 * that sender and receiver copy at the same time. */
#define SHM_STEP (64u << 10)
#define SHM_DEFAULT_LIVENESS_MS 100
#define SHM_REPORT_GRACE_NS 200000000ull
/* A receiver announces each pull in `pulled` (its bytes) before its one process_vm_readv:
 * a sender that sees it spins on for up to the pull's length at 1 GB/s (capped here), the
 * shm form of tcp's "since bytes last moved", so it does not sleep through a 1-4 MiB pull
 * that outlasts TUTTI_SPIN_US and pay the wake-up (40 us on this VM). Pulls in 1 MiB
 * slices, each announced, cost 5-10 % at 4 MiB (a system call is not free here). */
#define SHM_PULL_SPIN_MAX_NS 100000000ull
#define SHM_PURE_SPIN_NS 3000u    /* then spinning yields the CPU on every round */
#define SHM_HEAD_LOOK_EVERY 64u   /* rec_ready */
#define SHM_EVEN_LOOK_NS 1000000u /* even_out_cpus: at most this often */

/* ---- request queues (tp_private[0] links them) ---- */

static void fail_queue(shm_tp_t *tp, tp_req_t **head, tp_req_t **tail, int status)
{
    tp->completions += tp_fail_queue(head, tail, status);
}

static int link_busy(const shm_link_t *L)
{
    return L->sq_head || L->aq_head || L->rq_head || tp_ux_waiting(&L->ux);
}

static void bell_ring(shm_bell_t *b, int wfd, uint32_t how);

/* Before our sends on L are failed (or dropped), make what the peer might still read
 * unreadable: a half-written record breaks the direction, and pulls not yet acked are
 * revoked (the library may free those buffers as soon as we return; the peer checks
 * `revoked` after every pull). Independent of tx_broken: notify_error() sets that
 * without withdrawing anything. Touches no request (destroy() calls it too). */
static void link_withdraw(shm_link_t *L)
{
    int cut = L->sq_head && L->tx_started;
    if (!L->tx || (!cut && !L->aq_head))
        return;
    L->tx_broken = 1;
    if (L->aq_head)
        atomic_store(&L->tx->revoked, 1);
    atomic_store(&L->tx->broken, 1);
    /* `revoked` must be visible before the library reuses the buffers: pairs with the
     * fence between the pull and the check in link_pull */
    atomic_thread_fence(memory_order_seq_cst);
    if (L->peer_bell)
        bell_ring(L->peer_bell, L->peer_wake_fd, SHM_SLEEP_FUTEX | SHM_SLEEP_FD);
}

/* The link is unusable from now on: record why (once, kit/link.h), fail what is queued
 * on it. */
static int link_fail(shm_link_t *L, int status, int err_no, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int link_fail(shm_link_t *L, int status, int err_no, const char *fmt, ...)
{
    shm_tp_t *tp = L->tp;
    va_list ap;
    va_start(ap, fmt);
    tp_link_fail_v(tp->host, &L->fail, L->peer, link_busy(L), status, err_no, fmt, ap);
    va_end(ap);
    link_withdraw(L); /* the peer may still be alive, and pulling */
    L->tx_started = 0;
    fail_queue(tp, &L->sq_head, &L->sq_tail, L->fail.status);
    fail_queue(tp, &L->aq_head, &L->aq_tail, L->fail.status);
    fail_queue(tp, &L->rq_head, &L->rq_tail, L->fail.status);
    tp_ux_fail(&L->ux, L->fail.status);
    tp->completions++;
    return L->fail.status;
}

/* ---- doorbells ---- */

/* Wake the owner of b where it may sleep (how: SHM_SLEEP_* bits): on the futex, or with
 * a byte to its wake-up socket (wfd: ours, connected to it; -1 for none). */
static void bell_ring(shm_bell_t *b, int wfd, uint32_t how)
{
    atomic_fetch_add(&b->seq, 1);
    if ((how & SHM_SLEEP_FD) && wfd >= 0) {
        char c = 1;
        /* EAGAIN: its queue is full, so it is readable already; ECONNREFUSED: gone */
        ssize_t w = send(wfd, &c, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)w;
    }
    if (how & SHM_SLEEP_FUTEX)
        shm_futex(&b->seq, FUTEX_WAKE, INT_MAX, -1);
}

/* After a seq_cst store the peer may wait on: wake it if it said it sleeps, the way it
 * said. (An owner that changes how it sleeps announces it again, fences and sweeps, so
 * it sees what we published, or we see its new announcement.) */
static inline void peer_wake(shm_link_t *L)
{
    uint32_t how = atomic_load(&L->peer_bell->sleeping);
    if (how)
        bell_ring(L->peer_bell, L->peer_wake_fd, how);
}

/* ---- the peer's report slot ---- */

static void report_write(shm_dir_t *d, int status, const char *msg)
{
    uint32_t s = atomic_load_explicit(&d->err_seq, memory_order_relaxed);
    atomic_store(&d->err_seq, s + 1);
    atomic_thread_fence(memory_order_release); /* the odd count before the data */
    d->err_status = status;
    snprintf(d->err_msg, sizeof(d->err_msg), "%s", msg);
    atomic_store(&d->err_seq, s + 2);
    atomic_store(&d->err_set, 1);
}

static int report_read(const shm_dir_t *d, int *status_p, char *msg, size_t len)
{
    if (!atomic_load_explicit(&d->err_set, memory_order_acquire))
        return 0;
    for (int tries = 0; tries < 1000; tries++) {
        uint32_t s1 = atomic_load(&d->err_seq);
        if (s1 & 1) {
            sched_yield();
            continue;
        }
        int st = d->err_status;
        snprintf(msg, len, "%.*s", SHM_MAX_ERRMSG, d->err_msg);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load(&d->err_seq) != s1)
            continue;
        if (st >= 0 || st <= TUTTI_STATUS_LAST_)
            st = TUTTI_ERR_PEER;
        *status_p = st;
        return 1;
    }
    snprintf(msg, len, "(its report could not be read)");
    *status_p = TUTTI_ERR_PEER;
    return 1;
}

/* The stamp of the line at rx_pos, and the one a record there must carry. */
static inline uint64_t rx_stamp(const shm_link_t *L, uint64_t *want_p)
{
    const shm_hdr_t *h = (const shm_hdr_t *)(L->rxring + (L->rx_pos & L->mask));
    *want_p = L->rx_pos ^ L->rx_key;
    return atomic_load_explicit(&h->stamp, memory_order_acquire);
}

/* Did the sender publish more since link_rx last looked? Checked after seeing its
 * report (or its death, or its close): the report is written after what came before it,
 * but the sweep may have loaded `head` just before both landed. Also with no receive
 * posted (a probe's look, or a prober's watch in the sweep: the next one parks what is
 * there, or reads it aside), but not while a send waits: the peer will never take it,
 * and it fails now with the link. (A probe that found nothing, then saw `closed`, failed
 * the link over a message published in between: an MPI_Probe or a receive from any
 * source lost it.) */
static int link_more_to_read(shm_link_t *L)
{
    if (L->rx_withdrawn || (!L->rq_head && (L->sq_head || L->aq_head)))
        return 0;
    uint64_t want;
    /* an inactive link's ring is looked at only once its head moved (link_rx) */
    if (L->active && !L->rhdr_valid && rx_stamp(L, &want) == want)
        return 1;
    /* ahead, not just other: a head may lag what the stamps published */
    uint64_t hd = atomic_load_explicit(&L->rx->head, memory_order_acquire);
    return (int64_t)(hd - L->rx_head_seen) > 0;
}

/* The link can make no progress: fail it if the peer reported a failure, is gone or
 * closed its end (destroyed its communicator: shm_destroy). A direction the sender broke
 * (cancelled mid-message, or withdrew a pull) without a report yet gets a grace period:
 * the report follows the cancel within microseconds when the sender failed, and names
 * the cause, which "abandoned" would not.
 * final: called where the link cannot go on (a pull failed); else the link is failed
 * only once everything the peer published before its report or death was read. */
static void link_check_peer(shm_link_t *L, int final)
{
    int st;
    char msg[SHM_MAX_ERRMSG + 1];
    if (report_read(L->rx, &st, msg, sizeof(msg))) {
        if (!final && link_more_to_read(L))
            return; /* the next sweep reads it */
        link_fail(L, st, 0, "rank %d (%s) failed and reported: %s", L->peer, L->addr, msg);
        return;
    }
    if (L->peer_dead) {
        if (!final && link_more_to_read(L))
            return;
        link_fail(L, TUTTI_ERR_PEER, 0,
                  "rank %d (%s) is gone: its process exited while this rank %s it (did it "
                  "crash or get killed?)",
                  L->peer, L->addr,
                  L->sq_head || L->aq_head ? "was sending to" : "waited for data from");
        return;
    }
    /* Its process lives on, but it will neither write nor read again: what it published
     * before (seq_cst stores before `closed`) is read first, as tcp reads the bytes
     * before the end of the stream. */
    if (atomic_load_explicit(&L->rx->closed, memory_order_acquire)) {
        if (!final && link_more_to_read(L))
            return;
        link_fail(L, TUTTI_ERR_PEER, 0,
                  "rank %d (%s) closed its end of the link: it destroyed its communicator while "
                  "this rank %s it",
                  L->peer, L->addr,
                  L->sq_head || L->aq_head ? "was sending to" : "waited for data from");
        return;
    }
    if (L->rx_withdrawn || atomic_load_explicit(&L->rx->broken, memory_order_relaxed)) {
        uint64_t now = tp_now_ns();
        if (!L->broken_seen_ns)
            L->broken_seen_ns = now;
        else if (now - L->broken_seen_ns > SHM_REPORT_GRACE_NS)
            link_fail(L, TUTTI_ERR_PEER, 0,
                      "rank %d (%s) abandoned a message it was sending to this rank (it "
                      "failed or was aborted, and reported no reason)",
                      L->peer, L->addr);
    }
}

/* ---- rings ---- */

static inline uint64_t rec_span(uint64_t inline_len)
{
    return (SHM_HDR_BYTES + inline_len + SHM_LINE - 1) & ~(uint64_t)(SHM_LINE - 1);
}

/* A step into the ring, stored through the cache or streamed past it (TUTTI_SHM_NT_STORES).
 * Stores through the cache must first take each line from the receiver's cache, where
 * its last read left it: this VM's two CPUs do that fast for a while, then 2-5x slower
 * for the next while (bench/ring-bench, 1 MiB into a ring the other CPU reads: 38-53 us,
 * or 107-250), the same pages on the same CPUs (docs/internals.md "Stores into the
 * ring"). Streamed stores take no line (45-49 us either way), but the receiver then reads
 * from memory, not from our cache (59-76 us against 36-43). auto times both ways on each
 * link (one step in SHM_NT_EXPLORE takes the way not in use) and streams while that costs
 * under 1/SHM_NT_MARGIN of the cached way. */
static inline void ring_copy_in(shm_link_t *L, unsigned char *dst, const void *src, size_t n)
{
#ifdef TP_COPY_LOOP
    int mode = L->tp->nt_stores;
    if (n >= SHM_NT_MIN && mode != SHM_NT_OFF && __builtin_cpu_supports("avx2")) {
        L->nt_puts++;
        if (mode == SHM_NT_ON) {
            tp_copy_nt(dst, src, n);
            L->nt_streamed++;
            return;
        }
        int nt = L->nt_on ^ (L->nt_puts % SHM_NT_EXPLORE == 0);
        uint64_t t0 = __rdtsc();
        if (nt)
            tp_copy_nt(dst, src, n);
        else
            tp_copy(dst, src, n);
        L->nt_streamed += (unsigned)nt;
        L->nt_on = shm_nt_learn(L->put_cost, L->put_last, nt,
                                (float)(__rdtsc() - t0) * 1024.0f / (float)n);
        return;
    }
#endif
    tp_copy(dst, src, n);
}

static inline void ring_put(shm_link_t *L, uint64_t pos, const void *src, size_t n)
{
    size_t off = (size_t)(pos & L->mask);
    size_t first = (size_t)L->cap - off;
    if (first >= n) {
        ring_copy_in(L, L->txring + off, src, n);
    } else {
        ring_copy_in(L, L->txring + off, src, first);
        ring_copy_in(L, L->txring, (const char *)src + first, n - first);
    }
}

static inline void ring_get(const shm_link_t *L, uint64_t pos, void *dst, size_t n)
{
    size_t off = (size_t)(pos & L->mask);
    size_t first = (size_t)L->cap - off;
    if (first >= n) {
        tp_copy(dst, L->rxring + off, n);
    } else {
        tp_copy(dst, L->rxring + off, first);
        tp_copy((char *)dst + first, L->rxring, n - first);
    }
}

/* The peer moved its end of a ring (head or tail) to pos, more than a ring away from
 * ours: copying by it would run past the ring. */
static void ring_garbage(shm_link_t *L, const char *end, uint64_t pos, uint64_t ours)
{
    link_fail(L, TUTTI_ERR_PROTOCOL, 0,
              "garbage from rank %d (%s): ring %s at byte %llu, this rank's end at %llu, in a "
              "%llu-byte ring",
              L->peer, L->addr, end, (unsigned long long)pos, (unsigned long long)ours,
              (unsigned long long)L->cap);
}

/* Does the receiver pull large messages? (It says so once, at set-up.) */
static inline int link_pulls(shm_link_t *L)
{
    if (L->cma < 0) {
        uint32_t v = atomic_load_explicit(&L->tx->cma_ok, memory_order_acquire);
        if (v)
            L->cma = v == 1;
    }
    return L->cma == 1;
}

/* ---- sending ---- */

/* Should r go single-copy (pulled by the receiver), where the receiver can pull? */
static inline int want_pull(const shm_tp_t *tp, const tp_req_t *r)
{
    if (tp->cma_min && r->len >= tp->cma_min)
        return 1;
#ifndef TT_KIT_ABI_V1
    if (tp->cma_hint_min && r->len >= tp->cma_hint_min && (r->hints & TUTTI_TP_HINT_SINGLE_COPY))
        return 1;
#endif
    return 0;
}

/* Is r sent as a short record (shm_short_t)? */
static inline int short_rec(size_t len)
{
    return len > SHM_INLINE_ONE_LINE && len <= SHM_SHORT_MAX;
}

/* Write r as a short record at tx_pos, whole: the envelope into the second line, then
 * the first line (length, digest, payload) and its stamp. */
static void short_put(shm_link_t *L, const tp_req_t *r)
{
    uint64_t pos = L->tx_pos;
    memcpy(L->txring + ((pos + SHM_LINE) & L->mask), r->env, sizeof(r->env));
    shm_short_t *h = (shm_short_t *)(L->txring + (pos & L->mask));
    size_t lo = TT_KIT_MIN(r->len, (size_t)SHM_SHORT_LO);
    h->magic = SHM_REC_MAGIC;
    h->type = SHM_REC_SHORT;
    h->len = (uint32_t)r->len;
    h->digest = shm_env_digest(r->env);
    memcpy(h->lo, r->buf, lo);
    if (r->len > lo)
        memcpy(h->hi, (const char *)r->buf + lo, r->len - lo);
    atomic_store_explicit(&h->stamp, pos ^ L->tx_key, memory_order_release);
}

/* After a record of 18 to 33 lines (1-2 KiB of payload) that leaves the send queue empty,
 * prefetch for writing the ring's lines where the next record of that size would go (free
 * lines only, and not the line at tx_pos, which the receiver polls for the next stamp). A
 * ring of up to 1 MiB per direction does not stay in cache, so a record's lines were last
 * touched a lap ago and the sender's stores took them from L3 or memory on the way: a
 * 2-rank allgather of 2 KiB a rank over shm (`--fresh --window`) took 0.49-0.56 us in the
 * VM's fast state against 0.29-0.31 with a 64 KiB ring. Fetched here, after the record is
 * published, they come while the rank does other work. Not for smaller records: a waiting
 * receive prefetches their lines itself (rec_prefetch), and the two fought (a 1 KiB
 * broadcast took 1.12-1.25x the time). Not for larger ones: 4 KiB records and up
 * (allreduce 4-256 KiB at 2 ranks) took 1.12-1.17x in the VM's slow state, the
 * prefetches competing with the rank's own copies. Lines prefetched before (tx_pf) are
 * not issued again. */
#define SHM_TX_PREFETCH_MIN (17u * SHM_LINE) /* rec_prefetch's largest record */
#define SHM_TX_PREFETCH_MAX (2048u + SHM_LINE)
static inline void tx_prefetch(shm_link_t *L, uint64_t span)
{
    uint64_t lo = TT_KIT_MAX(L->tx_pf, L->tx_pos + SHM_LINE);
    uint64_t hi = TT_KIT_MIN(L->tx_pos + span, L->tx_tail_seen + L->cap);
    for (uint64_t p = lo; p < hi; p += SHM_LINE) {
        const char *line = (const char *)L->txring + (p & L->mask);
#if defined(__x86_64__)
        if (L->tp->prefetchw) { /* for ownership, whatever -march the build had */
            __asm__ volatile("prefetchw %0" ::"m"(*line));
            continue;
        }
#endif
        __builtin_prefetch(line, 1, 3);
    }
    if (hi > L->tx_pf)
        L->tx_pf = hi;
}

static void link_tx(shm_tp_t *tp, shm_link_t *L)
{
    int published = 0;
    uint64_t last = 0; /* the span of the last record written whole here */
    while (L->sq_head && !L->fail.status && !L->tx_broken) {
        tp_req_t *r = L->sq_head;
        uint64_t want, need;
        int cma = 0, shrt = 0;
        if (!L->tx_started) {
            cma = want_pull(tp, r) && link_pulls(L);
            shrt = !cma && short_rec(r->len);
            want = cma ? SHM_LINE : shrt ? 2 * SHM_LINE : rec_span(r->len);
            need = shrt ? want : SHM_LINE;
        } else {
            want = L->tx_span - L->tx_sent;
            need = 1;
        }
        uint64_t freeb = L->cap - (L->tx_pos - L->tx_tail_seen);
        if (freeb < want) {
            L->tx_tail_seen = atomic_load_explicit(&L->tx->tail, memory_order_acquire);
            if (L->tx_pos - L->tx_tail_seen > L->cap) { /* read past what we wrote */
                ring_garbage(L, "tail", L->tx_tail_seen, L->tx_pos);
                break;
            }
            freeb = L->cap - (L->tx_pos - L->tx_tail_seen);
        }
        if (freeb < need)
            break;
        if (shrt) {
            short_put(L, r);
            L->tx_pos += want;
            last = want;
            tp->steps_moved++;
            atomic_store(&L->tx->head, L->tx_pos); /* seq_cst, as below */
            published = 1;
            tp_req_pop(&L->sq_head, &L->sq_tail);
            r->xfer = r->len;
            r->status = 0;
            tp->completions++;
            continue;
        }
        if (!L->tx_started) {
            L->tx_rec = L->tx_pos;
            L->tx_span = want;
            L->tx_sent = 0;
            L->tx_cur_cma = cma;
            L->tx_started = 1;
        }
        uint64_t n = TT_KIT_MIN(TT_KIT_MIN(freeb, L->tx_span - L->tx_sent), tp->step);
        /* The record's first line (header, stamp) is written last, in one go: the
         * receiver polls it, and a store to it before the payload's other lines took the
         * line from the poller only to lose it again to the poll before the stamp (a
         * 2-rank 256-byte alltoall paid ~100 cycles for that, against a one-line
         * record). So: the payload past the first line, then the first line. */
        uint64_t a = 0, b = 0, mid = 0;
        if (!L->tx_cur_cma) {
            a = TT_KIT_MAX(L->tx_sent, SHM_HDR_BYTES);
            b = TT_KIT_MIN(L->tx_sent + n, SHM_HDR_BYTES + r->len);
            mid = L->tx_sent == 0 ? TT_KIT_MIN(TT_KIT_MAX(b, a), SHM_LINE) : a;
            if (b > mid)
                ring_put(L, L->tx_rec + mid, (const char *)r->buf + (mid - SHM_HDR_BYTES),
                         (size_t)(b - mid));
            if (b > a)
                r->xfer = (size_t)(b - SHM_HDR_BYTES);
        }
        if (L->tx_sent == 0) {
            shm_hdr_t *h = (shm_hdr_t *)(L->txring + (L->tx_rec & L->mask));
            h->magic = SHM_REC_MAGIC;
            h->type = L->tx_cur_cma ? SHM_REC_CMA : SHM_REC_INLINE;
            h->flags = n == L->tx_span ? SHM_HDR_WHOLE : 0;
            h->len = r->len;
            memcpy(h->env, r->env, sizeof(h->env));
            if (L->tx_cur_cma) {
                uint64_t addr = (uint64_t)(uintptr_t)r->buf;
                memcpy((unsigned char *)h + SHM_HDR_BYTES, &addr, sizeof(addr));
            } else if (mid > a) {
                ring_put(L, L->tx_rec + a, (const char *)r->buf + (a - SHM_HDR_BYTES),
                         (size_t)(mid - a));
            }
            /* the header and the first step are written: stamp the record */
            atomic_store_explicit(&h->stamp, L->tx_rec ^ L->tx_key, memory_order_release);
        }
        L->tx_sent += n;
        L->tx_pos += n;
        tp->steps_moved++;
        /* seq_cst: pairs with peer_wake, for the stamp above too (it comes first) */
        atomic_store(&L->tx->head, L->tx_pos);
        published = 1;
        if (L->tx_sent < L->tx_span) {
            peer_wake(L);
            continue; /* the next step, if the ring has room */
        }
        tp_req_pop(&L->sq_head, &L->sq_tail);
        L->tx_started = 0;
        last = L->tx_sent == n ? L->tx_span : 0; /* written in one go */
        if (L->tx_cur_cma) {
            r->tp_private[1] = (void *)(uintptr_t)++L->cma_sent;
            tp_req_push(&L->aq_head, &L->aq_tail, r);
        } else {
            r->status = 0;
            tp->completions++;
        }
    }
    if (published) {
        L->progressed = 1;
        peer_wake(L);
        if (!L->sq_head && last > SHM_TX_PREFETCH_MIN && last <= SHM_TX_PREFETCH_MAX)
            tx_prefetch(L, last);
    }
    if (L->aq_head && !L->fail.status) {
        uint64_t pulled = atomic_load_explicit(&L->tx->pulled, memory_order_relaxed);
        if (pulled != L->pulled_seen) {
            tp->pull_bytes = pulled - L->pulled_seen;
            L->pulled_seen = pulled;
            tp->pulls_moved++;
        }
        uint64_t acked = atomic_load_explicit(&L->tx->acked, memory_order_acquire);
        while (L->aq_head && (uint64_t)(uintptr_t)L->aq_head->tp_private[1] <= acked) {
            tp_req_t *r = L->aq_head;
            tp_req_pop(&L->aq_head, &L->aq_tail);
            r->tp_private[1] = NULL;
            r->xfer = r->len;
            r->status = 0;
            tp->completions++;
            L->progressed = 1;
        }
    }
}

/* ---- receiving ---- */

/* Pull a matched single-copy message into q->buf. 1: done; 0: the link failed. */
static int link_pull(shm_link_t *L, tp_req_t *q)
{
    /* the sender may spin through it (with more local ranks than CPUs, no longer) */
    L->rx_pulled += q->len;
    atomic_store_explicit(&L->rx->pulled, L->rx_pulled, memory_order_relaxed);
    size_t done = 0;
    while (done < q->len) {
        struct iovec lo = { (char *)q->buf + done, q->len - done };
        struct iovec re = { (void *)(uintptr_t)(L->raddr + done), q->len - done };
        ssize_t n = process_vm_readv(L->pid, &lo, 1, &re, 1, 0);
        if (n > 0) {
            done += (size_t)n;
            q->xfer = done;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        int err = n < 0 ? errno : EIO;
        if (err == ESRCH || shm_peer_gone(L)) {
            /* its report, if it left one, says more than its death */
            L->peer_dead = 1;
            link_check_peer(L, 1);
        } else if (atomic_load(&L->rx->revoked)) {
            L->rx_withdrawn = 1; /* wait for the sender's report (link_check_peer) */
        } else {
            link_fail(L, TUTTI_ERR_IO, err,
                      "cannot read a %zu-byte message from rank %d (%s) with "
                      "process_vm_readv",
                      q->len, L->peer, L->addr);
        }
        return 0;
    }
    /* The sender withdraws (and may free) its buffer only after setting `revoked`: a
     * copy that raced with that is detected here. The fence keeps the copy's reads
     * before the check (pairs with the one in link_withdraw). */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&L->rx->revoked)) {
        L->rx_withdrawn = 1;
        return 0;
    }
    return 1;
}

/* The sender's head read at rx_pos, more than a ring away from it (either way: a head
 * may lag the records already read by their stamps, by less than a ring): garbage. */
static int head_read(shm_link_t *L, uint64_t *head_p, int64_t *ahead_p)
{
    uint64_t hd = atomic_load_explicit(&L->rx->head, memory_order_acquire);
    int64_t d = (int64_t)(hd - L->rx_pos);
    if (d > (int64_t)L->cap || d < -(int64_t)L->cap) {
        ring_garbage(L, "head", hd, L->rx_pos);
        return 0;
    }
    if ((int64_t)(hd - L->rx_head_seen) > 0)
        L->rx_head_seen = hd;
    *head_p = hd;
    *ahead_p = d;
    return 1;
}

/* Is a record's header at rx_pos? 1: yes (its stamp is there); 0: not yet; < 0: the
 * link failed (garbage). Only the record's own line is read while its stamp is there:
 * the head is read only to tell a line not yet written from garbage, and only at every
 * SHM_HEAD_LOOK_EVERY-th look without a stamp. A poller that read the head at every
 * look held the sender's head line shared, and the sender's next store to it waited for
 * the line to come back: a 2-rank 4-byte allreduce over shm took 0.61 us that way and
 * 0.45 without (docs/benchmarks.md, "The forty-sixth session"). Garbage is found a few
 * microseconds later, or by the look before a sleep (look_head). */
static int rec_ready(shm_link_t *L)
{
    uint64_t want, stamp = rx_stamp(L, &want);
    if (stamp == want)
        return 1;
    if (++L->rx_misses % SHM_HEAD_LOOK_EVERY != 0 && !L->tp->look_head)
        return 0;
    uint64_t hd;
    int64_t ahead;
    if (!head_read(L, &hd, &ahead))
        return L->fail.status;
    /* A record starts with at least a line published: less is not one yet. */
    if (ahead < SHM_LINE)
        return 0;
    /* The head is published after the stamp: the stamp must be there now. */
    if ((stamp = rx_stamp(L, &want)) == want)
        return 1;
    return link_fail(L, TUTTI_ERR_PROTOCOL, 0,
                     "garbage from rank %d (%s): the record at byte %llu carries stamp "
                     "0x%016llx, not 0x%016llx, and the head says %llu bytes are written",
                     L->peer, L->addr, (unsigned long long)L->rx_pos, (unsigned long long)stamp,
                     (unsigned long long)want, (unsigned long long)hd);
}

/* While a receive waits for a record of 2 to 17 lines (41 to SHM_PREFETCH_MAX bytes),
 * prefetch the lines past its first at every look that finds no stamp: the sender writes
 * them before the stamp's line, so they come over while the poll waits for that one,
 * and the copy after the stamp finds them here instead of taking a transfer of its own.
 * 2-rank broadcast over shm, `--window`, alternating pairs, session 59: 64 and 128 B
 * 0.56 -> 0.45 and 0.58 -> 0.47 us (6 pairs); up to 17 lines against 3, 256 B, 512 B and
 * 1 KiB 0.83, 0.88 and 0.84 of the time (8 pairs; docs/internals.md "Short records").
 * Up to 65 lines gained nothing more: past 1 KiB the poll's prefetches take lines the
 * sender is still writing (each such line costs it one more transfer), and the copy's
 * own loads go out together anyway. */
#define SHM_PREFETCH_MAX (17 * SHM_LINE - SHM_HDR_BYTES)
_Static_assert(SHM_PREFETCH_MAX + SHM_HDR_BYTES == SHM_TX_PREFETCH_MIN, "tx_prefetch's least");
static inline void rec_prefetch(const shm_link_t *L)
{
    const tp_req_t *q = L->rq_head;
    if (!q || q->len <= SHM_SHORT_MAX || q->len > SHM_PREFETCH_MAX)
        return;
    uint64_t span = rec_span(q->len);
    for (uint64_t off = SHM_LINE; off < span; off += SHM_LINE)
        __builtin_prefetch(L->rxring + ((L->rx_pos + off) & L->mask));
}

/* The parked record's envelope: a short record's from its second line (published with
 * the first), checked against the digest the first carries. 0: garbage (link failed). */
static int rec_env(shm_link_t *L)
{
    if (!L->renv_later)
        return 1;
    memcpy(L->rhdr.env, L->rxring + ((L->rx_pos + SHM_LINE) & L->mask), sizeof(L->rhdr.env));
    L->renv_later = 0;
    if (shm_env_digest(L->rhdr.env) == L->rdigest)
        return 1;
    link_fail(L, TUTTI_ERR_PROTOCOL, 0,
              "garbage from rank %d (%s): the short record at byte %llu carries digest "
              "0x%016llx, not its envelope's 0x%016llx",
              L->peer, L->addr, (unsigned long long)L->rx_pos, (unsigned long long)L->rdigest,
              (unsigned long long)shm_env_digest(L->rhdr.env));
    return 0;
}

/* A record taken whole at once (pulled, or short): past it, and its receive done. */
static void rec_done(shm_tp_t *tp, shm_link_t *L, tp_req_t *q)
{
    L->rx_pos += L->rx_span;
    tp_req_pop(&L->rq_head, &L->rq_tail);
    q->status = 0;
    tp->completions++;
    L->rhdr_valid = 0;
    L->rhdr_matched = 0;
    if (__builtin_expect(q->kind == TP_KIND_UX, 0))
        tp_ux_arrived(q); /* (frees q where a receive waited on it) */
}

TT_KIT_TAKE_OTHER_FN(shm_tp_t, shm_link_t, "shm")

static void link_rx(shm_tp_t *tp, shm_link_t *L)
{
    int consumed = 0;
    /* A probe's watch on a link not used yet: its ring is looked at once the sender has
     * published something (and so reserved the rings; the stamp comes before the head) */
    if (!L->active) {
        if (!atomic_load_explicit(&L->rx->head, memory_order_acquire))
            return;
        int st = shm_link_activate(tp, L);
        if (st < 0) { /* once: the link is failed from here */
            link_fail(L, st, 0, "shm: cannot map the rings rank %d writes to", L->peer);
            return;
        }
    }
    while (!L->fail.status && !L->rx_withdrawn) {
        if (!L->rhdr_valid) {
            if (rec_ready(L) <= 0) {
                rec_prefetch(L);
                break;
            }
            const unsigned char *line = L->rxring + (L->rx_pos & L->mask);
            memcpy(&L->rhdr, line, sizeof(L->rhdr));
            const int shrt = L->rhdr.type == SHM_REC_SHORT;
            if (shrt) { /* its envelope is read only where needed (rec_env) */
                const shm_short_t *h = (const shm_short_t *)line;
                L->rhdr.flags = SHM_HDR_WHOLE;
                L->rhdr.len = h->len;
                L->rdigest = h->digest;
            }
            L->renv_later = shrt;
            uint64_t span = L->rhdr.type == SHM_REC_CMA ? SHM_LINE
                            : shrt                      ? 2 * SHM_LINE
                                                        : rec_span(L->rhdr.len);
            int whole = L->rhdr.type == SHM_REC_CMA || (L->rhdr.flags & SHM_HDR_WHOLE);
            if (L->rhdr.magic != SHM_REC_MAGIC ||
                (L->rhdr.type != SHM_REC_INLINE && L->rhdr.type != SHM_REC_CMA && !shrt) ||
                (shrt && !short_rec(L->rhdr.len)) || L->rhdr.len > (1ull << 56) ||
                (whole && span > L->cap)) {
                link_fail(L, TUTTI_ERR_PROTOCOL, 0,
                          "garbage from rank %d (%s): record magic 0x%04x type %u flags 0x%x "
                          "length %llu",
                          L->peer, L->addr, L->rhdr.magic, L->rhdr.type, L->rhdr.flags,
                          (unsigned long long)L->rhdr.len);
                break;
            }
            if (L->rhdr.type == SHM_REC_CMA)
                memcpy(&L->raddr, line + SHM_HDR_BYTES, sizeof(L->raddr));
            /* a whole record is all there: no need to read the head for it */
            if (whole && (int64_t)(L->rx_head_seen - (L->rx_pos + span)) < 0)
                L->rx_head_seen = L->rx_pos + span;
            L->rhdr_valid = 1;
            L->rhdr_matched = 0;
            L->rx_got = 0;
            L->rx_span = span;
        }
        tp_req_t *q = L->rq_head;
        if (!q) {
            /* parked until a receive is posted; news for a prober */
            tp->completions += L->probe_watch;
            L->probe_watch = 0;
            break;
        }
        if (!L->rhdr_matched) {
            if (L->renv_later && L->rhdr.len == q->len && L->rdigest == shm_env_digest(q->env)) {
                /* a short record whose digest is the receive's: its envelope (a 2^-64
                 * chance of another) without reading the second line */
                memcpy(L->rhdr.env, q->env, sizeof(L->rhdr.env));
                L->renv_later = 0;
            } else if (!rec_env(L)) {
                break;
            }
            if (tp_key(L->rhdr.env) != tp_key(q->env) &&
                !(q = rx_take_other(tp, L, L->rhdr.env, L->rhdr.len)))
                break;
            memcpy(q->got_env, L->rhdr.env, sizeof(q->got_env));
            q->got_len = (size_t)L->rhdr.len;
            if (L->rhdr.len != q->len || memcmp(L->rhdr.env, q->env, sizeof(q->env))) {
                tp_req_pop(&L->rq_head, &L->rq_tail);
                q->status = TUTTI_ERR_MISMATCH;
                /* The record stays unread: the stream position is lost for good. The
                 * receive's own failure says what differed (got_env); a later post here
                 * is told why the link is closed. */
                tp_link_fail_later(&L->fail, TUTTI_ERR_MISMATCH,
                                   "shm: the link to rank %d is out of step since a message "
                                   "that did not match its receive",
                                   L->peer);
                tp->completions++;
                break;
            }
            L->rhdr_matched = 1;
            if (L->rhdr.type == SHM_REC_CMA) {
                if (!link_pull(L, q))
                    break;
                atomic_store(&L->rx->acked, ++L->rx_acked);
                rec_done(tp, L, q); /* the whole record was published at once */
                consumed = 1;
                continue;
            }
            if (L->rhdr.type == SHM_REC_SHORT) { /* all in its first line */
                const shm_short_t *h = (const shm_short_t *)(L->rxring + (L->rx_pos & L->mask));
                size_t lo = TT_KIT_MIN(q->len, (size_t)SHM_SHORT_LO);
                memcpy(q->buf, h->lo, lo);
                if (q->len > lo)
                    memcpy((char *)q->buf + lo, h->hi, q->len - lo);
                q->xfer = q->len;
                rec_done(tp, L, q);
                consumed = 1;
                if (!L->rq_head)
                    break;
                continue;
            }
        }
        /* rx_head_seen >= rx_pos: published by the head or by a whole record's stamp */
        uint64_t avail = L->rx_head_seen - L->rx_pos;
        if (avail == 0) {
            uint64_t hd;
            int64_t ahead;
            if (!head_read(L, &hd, &ahead))
                break;
            avail = ahead > 0 ? (uint64_t)ahead : 0;
        }
        uint64_t n = TT_KIT_MIN(TT_KIT_MIN(avail, L->rx_span - L->rx_got), tp->step);
        if (n == 0)
            break;
        uint64_t rec = L->rx_pos - L->rx_got;
        uint64_t a = TT_KIT_MAX(L->rx_got, SHM_HDR_BYTES);
        uint64_t b = TT_KIT_MIN(L->rx_got + n, SHM_HDR_BYTES + q->len);
        if (b > a) {
            ring_get(L, rec + a, (char *)q->buf + (a - SHM_HDR_BYTES), (size_t)(b - a));
            q->xfer = (size_t)(b - SHM_HDR_BYTES);
        }
        L->rx_got += n;
        L->rx_pos += n;
        tp->steps_moved++;
        consumed = 1;
        if (L->rx_got == L->rx_span) {
            tp_req_pop(&L->rq_head, &L->rq_tail);
            q->status = 0;
            tp->completions++;
            L->rhdr_valid = 0;
            L->rhdr_matched = 0; /* at a record boundary again */
            if (__builtin_expect(q->kind == TP_KIND_UX, 0))
                tp_ux_arrived(q); /* (frees q where a receive waited on it) */
            if (!L->rq_head)
                break;
        } else {
            /* free the space now: the sender may be waiting for it */
            atomic_store(&L->rx->tail, L->rx_pos);
            peer_wake(L);
        }
    }
    if (consumed) {
        atomic_store(&L->rx->tail, L->rx_pos); /* seq_cst: pairs with peer_wake */
        L->progressed = 1;
        peer_wake(L);
    }
}

static void sweep(shm_tp_t *tp)
{
    for (int i = 0; i < tp->nranks; i++) {
        shm_link_t *L = &tp->links[i];
        if (L->fail.status || !(link_busy(L) || L->probe_watch))
            continue;
        L->progressed = 0;
        if (L->sq_head || L->aq_head)
            link_tx(tp, L);
        if ((L->rq_head || L->probe_watch) && !L->fail.status)
            link_rx(tp, L);
        if (!L->progressed && !L->fail.status && (link_busy(L) || L->probe_watch))
            link_check_peer(L, 0);
    }
}

/* ---- withdrawing what was posted ---- */

/* Fail everything queued on L with status. What the peer might still read is made
 * unreadable first: a half-written record breaks the direction, and pulls not yet
 * acked are revoked (the library may free those buffers as soon as we return). */
static void link_drop_all(shm_tp_t *tp, shm_link_t *L, int status)
{
    link_withdraw(L);
    fail_queue(tp, &L->sq_head, &L->sq_tail, status);
    fail_queue(tp, &L->aq_head, &L->aq_tail, status);
    if (L->rq_head && L->rhdr_valid && L->rhdr_matched) /* mid-payload: position lost */
        tp_link_fail_later(&L->fail, status,
                           "shm: the link to rank %d lost its place in a message cancelled "
                           "mid-way (status %d)",
                           L->peer, status);
    fail_queue(tp, &L->rq_head, &L->rq_tail, status);
    tp_ux_fail(&L->ux, status);
    L->tx_started = 0;
}

static void abort_all(shm_tp_t *tp)
{
    for (int i = 0; i < tp->nranks; i++)
        if (tp->links[i].served)
            link_drop_all(tp, &tp->links[i], TUTTI_ERR_ABORTED);
}

/* ---- the ops ---- */

/* No move before a pause that doubles from 1 ms to 128 ms while moves keep coming
 * (someone may keep moving us back). */
static void move_pause(shm_tp_t *tp, uint64_t now)
{
    if (now > tp->next_move_ns + 1000000000ull)
        tp->moves = 0; /* quiet for a second: start over */
    tp->next_move_ns = now + (1000000ull << TT_KIT_MIN(tp->moves, 7u));
}

/* Move this thread to CPU `to` and give it back its affinity `allowed`: the kernel's
 * placement holds from there. 1 when moved. */
static int move_to_cpu(shm_tp_t *tp, int to, const cpu_set_t *allowed)
{
    cpu_set_t target;
    CPU_ZERO(&target);
    CPU_SET(to, &target);
    if (sched_setaffinity(0, sizeof(target), &target) != 0)
        return 0;
    if (sched_setaffinity(0, sizeof(*allowed), allowed) != 0)
        tp->host->log(tp->host->ctx, TUTTI_LOG_WARN,
                      "shm: could not give back this thread's CPU affinity: %s", strerror(errno));
    tp->moves++;
    return 1;
}

/* Two local ranks that wait for each other on one CPU while another CPU idles take turns
 * through sched_yield (7 us a switch here, against 0.5 us for a message between two
 * CPUs), and the kernel leaves them so: both stay runnable and cache-hot, which its load
 * balancer does not move. A rank that finds a peer it has traffic pending with on its own
 * CPU, with fewer local ranks than CPUs, moves itself (the higher rank of the two) to a
 * CPU no local peer was seen on. */
static void leave_shared_cpu(shm_tp_t *tp, uint64_t now)
{
    if (now < tp->next_move_ns)
        return;
    move_pause(tp, now);
    int mine = tp->cpu, shared_with = -1;
    cpu_set_t allowed;
    if (mine < 0 || sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || mine >= CPU_SETSIZE)
        return;
    cpu_set_t taken = allowed;
    CPU_CLR(mine, &taken);
    for (int p = 0; p < tp->nranks; p++) {
        shm_link_t *L = &tp->links[p];
        if (!L->served || !L->peer_bell)
            continue;
        int c = atomic_load_explicit(&L->peer_bell->cpu, memory_order_relaxed);
        if (c == mine && link_busy(L) && p < tp->rank)
            shared_with = p;
        if (c >= 0 && c < CPU_SETSIZE)
            CPU_CLR(c, &taken);
    }
    if (shared_with < 0 || CPU_COUNT(&taken) == 0)
        return;
    int to = -1;
    for (int c = 0; c < CPU_SETSIZE && to < 0; c++)
        if (CPU_ISSET(c, &taken))
            to = c;
    if (!move_to_cpu(tp, to, &allowed))
        return;
    tp->spin_misses = 0;
    tp->cpu = -1; /* published again at the next wait */
    tp->host->log(tp->host->ctx, TUTTI_LOG_INFO,
                  "shm: rank %d waited for rank %d on the same CPU %d: moved to CPU %d", tp->rank,
                  shared_with, mine, to);
}

/* More local ranks than CPUs: the ranks on one CPU take turns through sched_yield, so a
 * small call costs about a switch for each rank on the fullest CPU. The kernel may leave
 * three ranks of four on one CPU and the fourth alone on the other, spinning, for tens of
 * ms: its balancer does not move tasks that ran within the last half millisecond, and
 * these always did (`perf sched` of a 4-rank 64-byte alltoall on 2 CPUs: 25-33 us a
 * call in that placement, 12-16 in two and two). So every SHM_EVEN_LOOK_NS a waiting rank
 * (which publishes its CPU at every wait, spin()) reads the CPUs its local peers last
 * waited on; once every one is known, if its own holds two ranks more than the emptiest
 * CPU it may run on, it moves there. Ranks on one CPU run one at a time and the mover
 * publishes its new CPU at once, so the next one to look counts it where it went. */
static void even_out_cpus(shm_tp_t *tp, uint64_t now)
{
    tp->next_look_ns = now + SHM_EVEN_LOOK_NS;
    int mine = tp->cpu; /* spin() published it */
    if (mine < 0 || mine >= SHM_CPU_WORDS * 64 || now < tp->next_move_ns)
        return;
    uint16_t count[SHM_CPU_WORDS * 64] = { 0 }; /* local ranks a CPU (2 KiB, once a ms) */
    count[mine] = 1;
    for (int p = 0; p < tp->nranks; p++) {
        shm_link_t *L = &tp->links[p];
        if (!L->served || !L->peer_bell)
            continue;
        int c = atomic_load_explicit(&L->peer_bell->cpu, memory_order_relaxed);
        if (c < 0 || c >= SHM_CPU_WORDS * 64)
            return; /* not known yet: no move on half a count */
        count[c]++;
    }
    /* the emptiest CPU this rank may run on (as at set-up), the lowest of a tie */
    int to = -1;
    const unsigned here = count[mine];
    unsigned least = here;
    for (int w = 0; w < SHM_CPU_WORDS && least > 0; w++)
        for (uint64_t bits = tp->bell->cpus[w]; bits && least > 0; bits &= bits - 1) {
            int c = w * 64 + __builtin_ctzll(bits);
            if (count[c] < least) {
                least = count[c];
                to = c;
            }
        }
    cpu_set_t allowed;
    if (to < 0 || here < least + 2 || sched_getaffinity(0, sizeof(allowed), &allowed) != 0 ||
        !CPU_ISSET(to, &allowed))
        return;
    move_pause(tp, now);
    if (!move_to_cpu(tp, to, &allowed))
        return;
    tp->cpu = to;
    atomic_store_explicit(&tp->bell->cpu, to, memory_order_relaxed);
    tp->host->log(tp->host->ctx, TUTTI_LOG_INFO,
                  "shm: rank %d: %u local ranks on CPU %d, %u on CPU %d: moved there", tp->rank,
                  here, mine, least, to);
}

/* The spin of progress(), from t0 for up to spin_us (and not past the caller's
 * deadline); from a peer's announcement that it pulls from us, at least as long as that
 * pull takes at 1 GB/s. 1 when something completed. */
static int spin(void *vtp, unsigned long c0, uint64_t t0, uint64_t deadline)
{
    shm_tp_t *tp = vtp;
    const uint64_t spin_ns = (uint64_t)tp->host->spin_us * 1000u;
    /* with more local ranks than CPUs, the puller may need this one: no longer */
    const int pull_spin = !tp->oversubscribed;
    uint64_t end = TT_KIT_MIN(t0 + spin_ns, deadline);
    int c = sched_getcpu(); /* published at every wait, where it changed */
    if (c != tp->cpu) {
        tp->cpu = c;
        atomic_store_explicit(&tp->bell->cpu, c, memory_order_relaxed);
    }
    if (tp->keep_cpu) {
        /* TUTTI_BIND=none: the thread stays where the kernel or the caller puts it */
    } else if (!tp->oversubscribed) {
        if (tp->spin_misses >= 4)
            leave_shared_cpu(tp, t0);
    } else if (t0 >= tp->next_look_ns) {
        even_out_cpus(tp, t0);
    }
    /* Spin on the CPU only briefly, then yield on every round: the peer we wait for
     * may need this CPU (more local ranks than CPUs, or the scheduler put both on
     * one while other work runs); without peers in need, a yield is cheap. When the
     * brief spin keeps failing (we share a CPU with the peer), skip it, trying it
     * again every 64th wait. The brief spin sweeps back to back, without a pause
     * instruction: a pause is 65 cycles on this VM's EPYC (140 on recent Intel), and
     * the four per round it had made a round ~370 cycles, which a message waited half
     * of on average (a 2-rank 16-byte alltoall: 0.37 us, 0.28 without; Open MPI's
     * vader, which polls without pauses too, 0.26-0.28; docs/benchmarks.md). */
    int pure = !tp->oversubscribed && (tp->spin_misses < 4 || (++tp->spin_probe & 63) == 0);
    uint64_t pure_end = pure ? t0 + SHM_PURE_SPIN_NS : t0;
    uint64_t now = t0;
    unsigned rounds = 0;
    unsigned long moved = tp->pulls_moved, steps = tp->steps_moved;
    for (;;) {
        if (now >= pure_end)
            sched_yield();
        sweep(tp);
        if (tp->completions != c0) {
            if (pure)
                tp->spin_misses = now < pure_end ? 0 : tp->spin_misses + 1;
            return 1;
        }
        /* the clock is not free (a VM's may trap): read it every few rounds */
        if (++rounds & (now < pure_end ? 7 : 3))
            continue;
        now = tp_now_ns();
        if (tp->steps_moved != steps) { /* bytes moved through a ring: spin on */
            steps = tp->steps_moved;
            end = TT_KIT_MAX(end, TT_KIT_MIN(now + spin_ns, deadline));
        }
        if (tp->pulls_moved != moved) { /* a peer started to pull from us */
            moved = tp->pulls_moved;
            uint64_t pull_ns = pull_spin ? TT_KIT_MIN(tp->pull_bytes, SHM_PULL_SPIN_MAX_NS) : 0;
            end = TT_KIT_MIN(now + TT_KIT_MAX(spin_ns, pull_ns), deadline);
        }
        if (atomic_load_explicit(&tp->aborted, memory_order_relaxed) || now >= end)
            return 0;
    }
}

/* The sweep before a sleep, or the last one: every look at a ring also reads its head,
 * so garbage at rest is found now, not SHM_HEAD_LOOK_EVERY wake-ups later (rec_ready). */
static void look_sweep(shm_tp_t *tp)
{
    tp->look_head = 1;
    sweep(tp);
    tp->look_head = 0;
}

/* Before a sleep: when the peers' liveness check is due (every liveness_ms), run it and
 * sweep, and return 1 (no sleep this time). */
static int liveness_due(shm_tp_t *tp, uint64_t now)
{
    if (now < tp->next_liveness_ns)
        return 0;
    shm_check_liveness(tp, 0);
    tp->next_liveness_ns = now + (uint64_t)tp->liveness_ms * 1000000u;
    sweep(tp);
    return 1;
}

/* Sleep on this rank's doorbell until a peer rings it or deadline passes; check the
 * peers' liveness every liveness_ms. */
static void wait_bell(void *vtp, unsigned long c0, uint64_t now, uint64_t deadline)
{
    shm_tp_t *tp = vtp;
    shm_bell_t *bell = tp->bell;
    if (liveness_due(tp, now))
        return;
    uint32_t seq = atomic_load(&bell->seq);
    atomic_store(&bell->sleeping, SHM_SLEEP_FUTEX);
    /* Dekker with peer_wake(): the sweep's loads of head/tail/acked are acquire, not
     * seq_cst, so only a full fence keeps them after the store above */
    atomic_thread_fence(memory_order_seq_cst);
    look_sweep(tp); /* whatever was published before `sleeping` became visible */
    if (tp->completions != c0 || atomic_load(&tp->aborted)) {
        atomic_store(&bell->sleeping, 0);
        return;
    }
    uint64_t until = TT_KIT_MIN(deadline, tp->next_liveness_ns);
    int ms = (int)((until - now + 999999u) / 1000000u);
    shm_futex(&bell->seq, FUTEX_WAIT, seq, ms > 0 ? ms : 1);
    atomic_store(&bell->sleeping, 0);
    sweep(tp);
}

/* The first progress() after arm(): sleep no more, and empty the socket. */
static void disarm(shm_tp_t *tp)
{
    atomic_store(&tp->bell->sleeping, 0);
    tp->armed = 0;
    char buf[64];
    while (recv(tp->wake_fd, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
    }
}

#ifndef TT_KIT_ABI_V1
/* wait_bell's announcement, fence and sweep, with the wake-up socket for the futex: the
 * caller sleeps in poll() until the liveness check is due at the latest. */
static int shm_arm(void *vtp, int *fd_p, int *timeout_ms_p)
{
    shm_tp_t *tp = vtp;
    if (tp->wake_fd < 0)
        return TUTTI_ERR_UNSUPPORTED;
    if (tp->armed)
        disarm(tp);
    unsigned long c0 = tp->completions;
    uint64_t now = tp_now_ns();
    if (liveness_due(tp, now))
        return 1;
    atomic_store(&tp->bell->sleeping, SHM_SLEEP_FD);
    atomic_thread_fence(memory_order_seq_cst); /* as in wait_bell */
    tp->armed = 1;
    look_sweep(tp);
    if (tp->completions != c0 || atomic_load(&tp->aborted)) {
        disarm(tp);
        return 1;
    }
    *fd_p = tp->wake_fd;
    *timeout_ms_p = (int)((tp->next_liveness_ns - now + 999999u) / 1000000u);
    return 0;
}
#endif

static void kit_sweep(void *tp)
{
    sweep(tp);
}
static void kit_abort_all(void *tp)
{
    abort_all(tp);
}

static const tp_progress_ops_t shm_progress_ops = {
    .sweep = kit_sweep, .wait = wait_bell, .abort_all = kit_abort_all, .spin = spin
};

static int shm_progress(void *vtp, int timeout_ms)
{
    shm_tp_t *tp = vtp;
    if (tp->armed)
        disarm(tp);
    return tp_progress_hop(tp, &shm_progress_ops, &tp->aborted, &tp->completions, &tp->steps_moved,
                           NULL, tp->host->spin_us, timeout_ms);
}

static int check_req(shm_tp_t *tp, tp_req_t *r, int kind)
{
    int ok = tp_req_peer_ok(r, tp->nranks) && r->peer != tp->rank;
    int st = tp_check_req(tp->host, "shm", ok && tp->links[r->peer].served,
                          ok ? &tp->links[r->peer].fail : NULL, r);
    if (st < 0)
        return st;
    shm_link_t *L = &tp->links[r->peer];
    if (kind == TUTTI_TP_SEND && L->tx_broken) {
        r->status = TUTTI_ERR_FAILED;
        return tp->host->error(tp->host->ctx, TUTTI_ERR_FAILED, L->peer, 0,
                               "shm: the link to rank %d was cut by an earlier failure", L->peer);
    }
    if (!L->active && (st = shm_link_activate(tp, L)) < 0) {
        r->status = st;
        return st;
    }
    r->kind = kind;
    return TUTTI_OK;
}

TT_KIT_POST_FNS(shm, shm_tp_t, shm_link_t, check_req, link_tx)

#ifndef TT_KIT_ABI_V1
/* The next record's header, if it is published (link_rx with no receive posted checks
 * a header and parks it). */
static int shm_probe(void *vtp, int peer, tutti_tp_probe_t *found_p)
{
    shm_tp_t *tp = vtp;
    if (peer < 0 || peer >= tp->nranks || peer == tp->rank || !tp->links[peer].served)
        return TUTTI_ERR_INVALID_ARG;
    shm_link_t *L = &tp->links[peer];
    if (!L->fail.status && !L->rq_head && !L->rhdr_valid)
        link_rx(tp, L);
    if (!L->fail.status && !L->rhdr_valid && !L->rq_head) {
        /* nothing from it: a receive from any source must learn that it died or
         * reported a failure (the library's search then names it, or ends with no
         * sender left), as a posted receive's sleep would (liveness_due) */
        uint64_t now = tp_now_ns();
        if (now >= tp->next_liveness_ns) {
            shm_check_liveness(tp, 0);
            tp->next_liveness_ns = now + (uint64_t)tp->liveness_ms * 1000000u;
        }
        link_check_peer(L, 0);
    }
    if (!L->fail.status && L->rhdr_valid)
        rec_env(L);
    if (L->fail.status)
        return tp_probe_ux_done(&L->ux, tp_probe_want(tp->host, found_p), found_p)
                   ? 1
                   : tp_link_failed_probe(tp->host, &L->fail, peer);
    int buffer,
        st = tp_probe_chan(L->rhdr_valid, L->rq_head, &L->ux, L->rhdr.env, L->rhdr.len,
                           tp_probe_want(tp->host, found_p), &L->probe_watch, &buffer, found_p);
    /* another key's message in front: read it aside */
    if (buffer && rx_take_other(tp, L, L->rhdr.env, L->rhdr.len))
        link_rx(tp, L);
    return st;
}

/* A receive no record has matched yet leaves its link's queue (the head whose record
 * matched it is being read into). */
static int shm_cancel(void *vtp, tp_req_t *r)
{
    shm_tp_t *tp = vtp;
    if (r->kind != TUTTI_TP_RECV || r->peer < 0 || r->peer >= tp->nranks)
        return TUTTI_ERR_INVALID_ARG;
    shm_link_t *L = &tp->links[r->peer];
    return tp_rq_cancel(&L->rq_head, &L->rq_tail, &L->ux, r, L->rhdr_valid && L->rhdr_matched);
}
#endif

static void shm_cancel_all(void *vtp, int status)
{
    shm_tp_t *tp = vtp;
    for (int i = 0; i < tp->nranks; i++)
        if (tp->links[i].served)
            link_drop_all(tp, &tp->links[i], status);
}

static void shm_notify_error(void *vtp, int status, const char *msg)
{
    shm_tp_t *tp = vtp;
    for (int i = 0; i < tp->nranks; i++) {
        shm_link_t *L = &tp->links[i];
        if (!L->served || !L->tx)
            continue;
        report_write(L->tx, status, msg);
        /* nothing sent after a report could be told apart from what came before it */
        L->tx_broken = 1;
        bell_ring(L->peer_bell, L->peer_wake_fd, SHM_SLEEP_FUTEX | SHM_SLEEP_FD);
    }
}

static void shm_abort(void *vtp)
{
    shm_tp_t *tp = vtp;
    atomic_store(&tp->aborted, 1);
    if (tp->bell)
        bell_ring(tp->bell, tp->wake_self, SHM_SLEEP_FUTEX | SHM_SLEEP_FD);
}

static const char *shm_peer_address(void *vtp, int peer)
{
    shm_tp_t *tp = vtp;
    if (!tp || peer < 0 || peer >= tp->nranks || !tp->links[peer].served)
        return NULL;
    return tp->links[peer].addr;
}

static void shm_destroy(void *vtp)
{
    shm_tp_t *tp = vtp;
    if (!tp)
        return;
    /* Pending requests are dropped, and their buffers may be freed right after: the
     * peers must not take a withdrawn pull (or the rest of a cut record) for data. */
    for (int i = 0; i < tp->nranks; i++)
        if (tp->links && tp->links[i].served)
            link_withdraw(&tp->links[i]);
    /* ... and told that nothing more comes, nor is read: a peer that waits on this rank
     * fails at once (link_check_peer, once it read what the ring still holds), not at its
     * timeout, as a tcp peer sees the connection close. The seq_cst store comes after
     * every head and stamp published here; peer_wake() wakes it if it sleeps. */
    for (int i = 0; tp->links && i < tp->nranks; i++) {
        shm_link_t *L = &tp->links[i];
        if (!L->served || !L->tx)
            continue;
        atomic_store(&L->tx->closed, 1);
        if (L->peer_bell)
            peer_wake(L);
    }
    for (int i = 0; tp->links && i < tp->nranks; i++) {
        const shm_link_t *L = &tp->links[i];
        if (L->nt_puts)
            tp->host->log(
                tp->host->ctx, TUTTI_LOG_INFO,
                "shm: rank %d to %d: %u of %u ring steps of %zu KiB or more streamed past "
                "the cache; cycles a KiB, cached %.0f, streamed %.0f",
                tp->rank, L->peer, L->nt_streamed, L->nt_puts, SHM_NT_MIN >> 10,
                (double)L->put_cost[0], (double)L->put_cost[1]);
    }
    shm_teardown(tp);
    for (int i = 0; tp->links && i < tp->nranks; i++)
        tp_ux_clear(&tp->links[i].ux);
    free(tp->pair_names);
    free(tp->links);
    free(tp);
}

static int knob_int(shm_tp_t *tp, const char *name, int def)
{
    long x;
    const char *v;
    if (tp_knob_long(tp->host, name, def, INT_MIN, INT_MAX, &x, &v) < 0)
        tp->host->log(tp->host->ctx, TUTTI_LOG_WARN, "TUTTI_%s=%s is not an integer; using %d",
                      name, v, def);
    return (int)x;
}

/* Knob TUTTI_<name>: the index of its value among words (NULL-terminated; unset or
 * empty is the first), or TUTTI_ERR_CONFIG, reported naming the words. */
static int knob_word(shm_tp_t *tp, const char *name, const char *const *words)
{
    const char *v = tp->host->config(tp->host->ctx, name);
    if (!v || !*v)
        return 0;
    char list[128] = "";
    for (int i = 0; words[i]; i++) {
        if (!strcmp(v, words[i]))
            return i;
        size_t n = strlen(list);
        snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "", words[i]);
    }
    return tp->host->error(tp->host->ctx, TUTTI_ERR_CONFIG, -1, 0,
                           "shm: TUTTI_%s=\"%.64s\" is none of %s", name, v, list);
}

/* A transport with its links, nothing shared yet; NULL when out of memory. */
static shm_tp_t *tp_new(const tutti_tp_host_v1_t *host)
{
    shm_tp_t *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return NULL;
    tp->host = host;
    tp->rank = host->rank;
    tp->nranks = host->nranks;
    tp->wake_fd = tp->wake_self = -1;
    tp->bell_fd = -1;
    tp->links = calloc((size_t)host->nranks, sizeof(shm_link_t));
    tp->pair_names = calloc((size_t)host->nranks, sizeof(char *));
    if (!tp->links || !tp->pair_names) {
        free(tp->links);
        free(tp->pair_names);
        free(tp);
        return NULL;
    }
    for (int i = 0; i < host->nranks; i++) {
        shm_link_t *L = &tp->links[i];
        L->tp = tp;
        L->peer = i;
        L->pidfd = -1;
        L->bell_fd = -1;
        L->peer_wake_fd = -1;
        L->seg_fd = -1;
        L->cma = -1;
        L->served = tutti_tp_host_serves(host, i);
        snprintf(L->addr, sizeof(L->addr), "shm:rank %d", i);
    }
    return tp;
}

static int shm_create(const tutti_tp_host_v1_t *host, void **tp_p)
{
    if (!host || host->size < offsetof(tutti_tp_host_v1_t, peers) ||
        host->abi_version != TUTTI_TRANSPORT_ABI_V1)
        return TUTTI_ERR_PLUGIN;
    shm_tp_t *tp = tp_new(host);
    if (!tp)
        return TUTTI_ERR_NOMEM;
    int nserved = 0;
    for (int i = 0; i < host->nranks; i++)
        nserved += tp->links[i].served;
    size_t def_ring = SHM_RING_BUDGET / (size_t)(nserved > 0 ? nserved : 1);
    def_ring = def_ring < SHM_RING_MIN   ? SHM_RING_MIN
               : def_ring > SHM_RING_MAX ? SHM_RING_MAX
                                         : def_ring;
    /* unset, auto, or (with a warning) not a size: auto, which ring_fit may shrink */
    const char *rv = host->config(host->ctx, "SHM_RING_BYTES");
    tp->ring_auto = !rv || !*rv || !strcmp(rv, "auto");
    size_t ring = def_ring;
    if (!tp->ring_auto) {
        ring = tp_knob_size_named(tp->host, "SHM_RING_BYTES", SIZE_MAX, "auto");
        tp->ring_auto = ring == SIZE_MAX;
        ring = tp->ring_auto ? def_ring : ring;
    }
    size_t r2 = 4096;
    while (r2 < ring && r2 < ((size_t)1 << 30))
        r2 <<= 1;
    tp->ring_bytes = r2;
    tp->cma_min = tp_knob_size(tp->host, "SHM_CMA_BYTES", 0);
    /* hints are read only from a library that posts them (else the field is not there) */
#ifndef TT_KIT_ABI_V1
    if (tutti_tp_req_has(host, hints)) {
        /* hinted single-copy requests this large are pulled (docs/internals.md); by
         * default (auto) a size set-up picks, see SHM_CMA_HINT_AUTO */
        const char *v = host->config(host->ctx, "SHM_CMA_HINT_BYTES");
        tp->cma_hint_min = v && strcmp(v, "auto")
                               ? tp_knob_size_named(tp->host, "SHM_CMA_HINT_BYTES",
                                                    SHM_CMA_HINT_AUTO, "auto")
                               : SHM_CMA_HINT_AUTO;
    }
#endif
    static const char *const reserves[] = { "auto", "madvise", "fallocate", NULL };
    static const char *const nts[] = { "auto", "on", "off", NULL };
    static const int nt_modes[] = { SHM_NT_AUTO, SHM_NT_ON, SHM_NT_OFF };
    static const char *const ats[] = { "auto", "setup", "first-use", NULL };
    int st = knob_word(tp, "SHM_RESERVE", reserves); /* SHM_RESERVE_* in that order */
    tp->reserve = st;
    if (st >= 0 && (st = knob_word(tp, "SHM_RESERVE_AT", ats)) >= 0)
        tp->reserve_at = st; /* SHM_AT_* in that order */
    if (st >= 0 && (st = knob_word(tp, "SHM_NT_STORES", nts)) >= 0)
        tp->nt_stores = nt_modes[st];
    if (st < 0) {
        shm_destroy(tp);
        return st;
    }
#if defined(__x86_64__)
    unsigned int eax, ebx, ecx, edx;
    tp->prefetchw = __get_cpuid(0x80000001u, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 8));
#endif
    tp->keep_cpu = tp_bind_none(host);
    tp->step = tp_knob_size(tp->host, "SHM_STEP_BYTES", SHM_STEP);
    if (tp->step < SHM_LINE)
        tp->step = SHM_LINE;
    tp->liveness_ms = knob_int(tp, "SHM_LIVENESS_MS", SHM_DEFAULT_LIVENESS_MS);
    if (tp->liveness_ms < 1) { /* the check cannot be switched off: a dead peer hangs */
        tp->host->log(tp->host->ctx, TUTTI_LOG_WARN,
                      "TUTTI_SHM_LIVENESS_MS=%d: the peers' liveness is always checked; using %d",
                      tp->liveness_ms, SHM_DEFAULT_LIVENESS_MS);
        tp->liveness_ms = SHM_DEFAULT_LIVENESS_MS;
    }
    st = shm_setup(tp);
    if (st < 0) {
        shm_destroy(tp);
        return st;
    }
    *tp_p = tp;
    return TUTTI_OK;
}

/* Fuzzing and tests only (see shm.h). Built like shm_create, with the caller's memory
 * in place of the shared segment and a doorbell for the peer that nobody waits on. */
int shm_recv_fuzz_input(const tutti_tp_host_v1_t *host, shm_dir_t *rx, unsigned char *ring,
                        uint64_t cap, size_t step, uint64_t start, tp_req_t *reqs, size_t nreqs,
                        int (*publish)(void *ctx), void *ctx)
{
    shm_bell_t peer_bell;
    memset(&peer_bell, 0, sizeof(peer_bell));
    shm_tp_t *tp = host->nranks < 2 ? NULL : tp_new(host);
    if (!tp)
        return -1;
    tp->step = step;
    shm_link_t *L = &tp->links[1];
    L->served = 1;
    L->pid = getpid();
    L->unwatched = 1;
    L->rx = rx;
    L->rxring = ring;
    L->cap = cap;
    L->mask = cap - 1;
    L->peer_bell = &peer_bell;
    L->rx_pos = L->rx_head_seen = start;
    L->rx_key = rx->key;
    L->active = 1;
    for (size_t i = 0; i < nreqs; i++)
        shm_post_recv(tp, &reqs[i]);
    /* sweep until every receive is done, or a sweep moves nothing and the peer is done;
     * that last sweep as before a sleep (look_sweep) */
    for (int i = 0, idle = 0; i < 1000 && L->rq_head; i++) {
        unsigned long c0 = tp->completions;
        L->progressed = 0;
        if (idle)
            look_sweep(tp);
        else
            sweep(tp);
        int more = publish(ctx) || L->progressed || tp->completions != c0;
        if (!more && idle)
            break;
        idle = !more;
    }
    shm_cancel_all(tp, TUTTI_ERR_ABORTED);
    int aside = (int)L->ux.made;
    tp_ux_clear(&L->ux);
    free(tp->pair_names);
    free(tp->links);
    free(tp);
    return aside;
}

/* cost hints: a 4-byte exchange and one direction of a large one between processes */
static const tp_ops_t shm_ops = {
    TT_KIT_OPS_HEAD("shm", .flags = TUTTI_TP_LOCAL_ONLY | TUTTI_TP_CHANNELS | TUTTI_TP_PROBE_ANY,
                    .mem_kinds = TUTTI_MEM_BIT(TUTTI_MEM_HOST), .alpha_us = 1.0, .bw_gbs = 5.0),
    TT_KIT_OPS_FNS(shm) TT_KIT_PROBE(shm_probe) TT_KIT_ARM(shm_arm) TT_KIT_CANCEL(shm_cancel),
};

TT_KIT_REGISTER(shm, shm_ops)
