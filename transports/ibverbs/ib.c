/* ibverbs (RDMA) transport: the data path.
 * Design notes: docs/internals.md, "The ibverbs data path". */
#include <errno.h>
#include <endian.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ib.h"
#include "ib_wire.h"
#include "../kit/copy.h"
#include "../kit/ctx.h"
#include "../kit/progress.h"
#include "../kit/queue.h"

#define IB_RECV_BIT (1ull << 63)

static ib_tp_t *ib_current; /* for the test hooks */

static uint32_t make_imm(unsigned type, unsigned a, unsigned b)
{
    return (type << 28) | ((a & IB_IMM_FIELD_MAX) << 14) | (b & IB_IMM_FIELD_MAX);
}

static void fail_queue(ib_tp_t *tp, tp_req_t **head, tp_req_t **tail, int status)
{
    tp->completions += tp_fail_queue(head, tail, status);
}

/* Sends waiting for a FIN hold a registration of their buffer in tp_private[1]. */
static void fail_fins(ib_tp_t *tp, ib_link_t *L, int status)
{
    while (L->fin_head) {
        tp_req_t *r = L->fin_head;
        tp_req_pop(&L->fin_head, &L->fin_tail);
        ib_mrc_put(&tp->mrc, r->tp_private[1]);
        r->tp_private[1] = NULL;
        r->status = status;
        tp->completions++;
    }
}

/* Receives being READ: fail them and forget them (their READs still complete, or are
 * flushed, and release the registrations then). */
static void fail_reads(ib_tp_t *tp, ib_link_t *L, int status)
{
    for (unsigned i = 0; i < L->sqe_count; i++) {
        ib_sqe_t *e = &L->sqe[(L->sqe_head + i) % L->sq_depth];
        if (e->kind != IB_WR_READ || !e->req)
            continue;
        if (e->req->status == 1) {
            e->req->status = status;
            tp->completions++;
        }
        e->req = NULL;
    }
    if (L->rd_req) {
        if (L->rd_req->status == 1) {
            L->rd_req->status = status;
            tp->completions++;
        }
        L->rd_req = NULL;
        if (!L->rd_posted_last)
            ib_mrc_put(&tp->mrc, L->rd_mr);
        L->rd_mr = NULL;
    }
    L->reads = 0;
}

/* Requests are about to be handed back to the library: with READs in flight the HCA is
 * still writing into receive buffers, and with RTSs not yet FINed the peer may still READ
 * send buffers (and would complete its receive with whatever the library puts there
 * next). Stop the queue pair: the error state flushes every outstanding WR and answers
 * no more READs, so the peer's READ fails instead of delivering garbage. */
static void link_stop_dma(ib_link_t *L)
{
    if (L->qp && (L->reads || L->rd_req || L->fin_head) && !L->qp_stopped) {
        struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
        ibv_modify_qp(L->qp, &a, IBV_QP_STATE);
        L->qp_stopped = 1;
    }
}

static int link_busy(const ib_link_t *L)
{
    return L->sq_head || L->rq_head || L->fin_head || L->reads || L->rd_req ||
           tp_ux_waiting(&L->ux);
}

static void link_drop(ib_link_t *L)
{
    ib_tp_t *tp = L->tp;
    link_stop_dma(L);
    fail_queue(tp, &L->sq_head, &L->sq_tail, L->fail.status);
    fail_queue(tp, &L->rq_head, &L->rq_tail, L->fail.status);
    tp_ux_fail(&L->ux, L->fail.status);
    fail_fins(tp, L, L->fail.status);
    fail_reads(tp, L, L->fail.status);
    tp->completions++;
}

TT_KIT_LINK_FAIL_FN(ib_link_t, link_busy, link_drop)

static unsigned sq_room(const ib_link_t *L)
{
    return L->sq_depth - L->sqe_count;
}

static void sqe_push(ib_link_t *L, int kind, tp_req_t *req, ib_mr_entry_t *mr, int last)
{
    ib_sqe_t *e = &L->sqe[(L->sqe_head + L->sqe_count) % L->sq_depth];
    e->kind = (uint8_t)kind;
    e->req = req;
    e->mr = mr;
    e->last = (uint8_t)last;
    L->sqe_count++;
}

/* RDMA WRITE WITH IMMEDIATE of len bytes at stage+off to the peer's ring at off. */
static int post_write(ib_tp_t *tp, ib_link_t *L, int kind, uint32_t imm, size_t off, size_t len)
{
    struct ibv_sge sge = { .addr = (uint64_t)(uintptr_t)(L->stage + off),
                           .length = (uint32_t)len,
                           .lkey = L->stage_mr->lkey };
    struct ibv_send_wr wr = {
        .wr_id = (uint64_t)L->peer,
        .sg_list = len ? &sge : NULL,
        .num_sge = len ? 1 : 0,
        .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
        .send_flags = IBV_SEND_SIGNALED | (len && len <= tp->max_inline ? IBV_SEND_INLINE : 0),
        .imm_data = htobe32(imm),
        .wr.rdma = {.remote_addr = L->r_ring + off, .rkey = L->r_rkey},
    }, *bad;
    int e = ibv_post_send(L->qp, &wr, &bad);
    if (e)
        return e;
    sqe_push(L, kind, NULL, NULL, 0);
    return 0;
}

static void take_owed(ib_link_t *L, unsigned *credits, unsigned *fins)
{
    *credits = TT_KIT_MIN(L->credits_owed, IB_IMM_FIELD_MAX);
    *fins = TT_KIT_MIN(L->fins_owed, IB_IMM_FIELD_MAX);
    L->credits_owed -= *credits;
    L->fins_owed -= *fins;
}

static void give_back_owed(ib_link_t *L, unsigned credits, unsigned fins)
{
    L->credits_owed += credits;
    L->fins_owed += fins;
}

/* Write queued sends while the peer's ring has room. */
static void link_send(ib_tp_t *tp, ib_link_t *L)
{
    if (!L->peer_ready) /* lazily: not connected yet (ib_lazy.c) */
        return;
    while (L->sq_head && !L->fail.status && L->credits > 0 && sq_room(L) > IB_SQ_RESERVE) {
        tp_req_t *r = L->sq_head;
        size_t off = (size_t)(L->tx_seq % tp->slots) * tp->slot_bytes;
        ib_hdr_t *h = (ib_hdr_t *)(L->stage + off);
        memset(h, 0, sizeof(*h));
        h->magic = IB_MAGIC;
        h->len = r->len;
        memcpy(h->env, r->env, sizeof(h->env));
        size_t nbytes = IB_HDR_BYTES;
        ib_mr_entry_t *mr = NULL;
        if (r->len <= tp->eager_max) {
            h->kind = IB_MSG_EAGER;
            if (r->len)
                tp_copy(L->stage + off + IB_HDR_BYTES, r->buf, r->len);
            nbytes += r->len;
        } else {
            int e = ib_mrc_get(&tp->mrc, r->buf, r->len, 0, &mr);
            if (e) {
                link_fail(L, TUTTI_ERR_IO, e,
                          "ibverbs: cannot register the %zu-byte send buffer at %p for rank "
                          "%d (locked-memory limit? see ulimit -l)",
                          r->len, r->buf, L->peer);
                return;
            }
            h->kind = IB_MSG_RTS;
            h->addr = (uint64_t)(uintptr_t)r->buf;
            h->rkey = mr->mr->rkey;
        }
        unsigned c, f;
        take_owed(L, &c, &f);
        int e = post_write(tp, L, IB_WR_DATA, make_imm(IB_IMM_DATA, c, f), off, nbytes);
        if (e) {
            give_back_owed(L, c, f);
            ib_mrc_put(&tp->mrc, mr);
            link_fail(L, TUTTI_ERR_PEER, e, "ibverbs: posting a write to rank %d (%s) failed",
                      L->peer, L->addr);
            return;
        }
        L->tx_seq++;
        L->credits--;
        tp_req_pop(&L->sq_head, &L->sq_tail);
        if (!mr) {
            r->xfer = r->len;
            r->status = 0;
            tp->completions++;
            tp->eager_msgs++;
        } else {
            r->tp_private[1] = mr;
            tp_req_push(&L->fin_head, &L->fin_tail, r);
            tp->rdv_msgs++;
        }
    }
}

/* Return credits (at half a ring) and FINs (at once) when no data write carried them;
 * lazily, the first write of a link that connected on the peer's answer (hello_owed)
 * tells the peer it may write too. */
static void link_ctrl(ib_tp_t *tp, ib_link_t *L)
{
    unsigned half = tp->slots / 2 ? tp->slots / 2 : 1;
    if (L->fail.status || !L->peer_ready ||
        (L->credits_owed < half && !L->fins_owed && !L->hello_owed) || sq_room(L) <= 2)
        return;
    unsigned c, f;
    take_owed(L, &c, &f);
    int e = post_write(tp, L, IB_WR_CTRL, make_imm(IB_IMM_CTRL, c, f), 0, 0);
    if (e == 0)
        L->hello_owed = 0;
    if (e) {
        give_back_owed(L, c, f);
        link_fail(L, TUTTI_ERR_PEER, e, "ibverbs: posting a write to rank %d (%s) failed", L->peer,
                  L->addr);
    }
}

/* Post the READ chunks of the receive being fetched, as far as the send queue allows. */
static void link_post_reads(ib_tp_t *tp, ib_link_t *L)
{
    while (L->rd_req && !L->fail.status && sq_room(L) > IB_SQ_RESERVE) {
        tp_req_t *q = L->rd_req;
        size_t chunk = TT_KIT_MIN(q->len - L->rd_off, (size_t)tp->max_msg);
        int last = L->rd_off + chunk == q->len;
        struct ibv_sge sge = { .addr = (uint64_t)(uintptr_t)q->buf + L->rd_off,
                               .length = (uint32_t)chunk,
                               .lkey = L->rd_mr->mr->lkey };
        struct ibv_send_wr wr = {
            .wr_id = (uint64_t)L->peer,
            .sg_list = &sge,
            .num_sge = 1,
            .opcode = IBV_WR_RDMA_READ,
            .send_flags = IBV_SEND_SIGNALED,
            .wr.rdma = {.remote_addr = L->rd_raddr + L->rd_off, .rkey = L->rd_rkey},
        }, *bad;
        int e = ibv_post_send(L->qp, &wr, &bad);
        if (e) {
            link_fail(L, TUTTI_ERR_PEER, e, "ibverbs: posting a read from rank %d (%s) failed",
                      L->peer, L->addr);
            return;
        }
        sqe_push(L, IB_WR_READ, q, last ? L->rd_mr : NULL, last);
        L->rd_off += chunk;
        if (last) {
            L->rd_posted_last = 1;
            L->rd_req = NULL;
            L->rd_mr = NULL;
        }
    }
}

/* The slot of the next arrived message and a checked copy of its header; NULL when its
 * header is garbage (the link failed). */
static const char *link_next_slot(ib_tp_t *tp, ib_link_t *L, ib_hdr_t *h)
{
    const char *slot = L->ring + (size_t)(L->rx_next % tp->slots) * tp->slot_bytes;
    /* bounded by the slot, not by this rank's eager limit: a peer's may differ within
     * the slot size the set-up compared (TUTTI_IB_EAGER_BYTES rounds up to 64 bytes) */
    if (ib_slot_decode(slot, tp->slot_bytes - IB_HDR_BYTES, h) == 0)
        return slot;
    link_fail(L, TUTTI_ERR_PROTOCOL, 0,
              "ibverbs: garbage from rank %d (%s): slot magic 0x%08x kind %u length %llu", L->peer,
              L->addr, h->magic, h->kind, (unsigned long long)h->len);
    return NULL;
}

TT_KIT_TAKE_OTHER_FN(ib_tp_t, ib_link_t, "ibverbs")

/* Match arrived slots to posted receives, in order. */
static void link_recv(ib_tp_t *tp, ib_link_t *L)
{
    while (L->rq_head && L->rx_next < L->rx_arrived && !L->fail.status && !L->rd_req) {
        ib_hdr_t hdr;
        const ib_hdr_t *h = &hdr;
        const char *slot = link_next_slot(tp, L, &hdr);
        if (!slot)
            return;
        tp_req_t *q = L->rq_head;
        if (tp_key(h->env) != tp_key(q->env) && !(q = rx_take_other(tp, L, h->env, h->len)))
            return;
        memcpy(q->got_env, h->env, sizeof(q->got_env));
        q->got_len = h->len;
        if (h->len != q->len || memcmp(h->env, q->env, sizeof(q->env))) {
            tp_req_pop(&L->rq_head, &L->rq_tail);
            q->status = TUTTI_ERR_MISMATCH;
            /* The slot stays unconsumed: the stream position is lost for good. Earlier
             * receives still being READ are left to finish (their buffers stay ours until
             * they complete or cancel_all stops the queue pair): failing them here would
             * report a bare peer error in place of the mismatch. */
            L->fail.status = TUTTI_ERR_MISMATCH;
            tp->completions++;
            return;
        }
        if (h->kind == IB_MSG_EAGER) {
            if (h->len)
                tp_copy(q->buf, slot + IB_HDR_BYTES, h->len);
            tp_req_pop(&L->rq_head, &L->rq_tail);
            q->xfer = q->len;
            q->status = 0;
            tp->completions++;
            if (__builtin_expect(q->kind == TP_KIND_UX, 0))
                tp_ux_arrived(q); /* (frees q where a receive waited on it) */
        } else {
            ib_mr_entry_t *mr = NULL;
            int e = q->kind == TP_KIND_UX ? ib_mrc_get_once(&tp->mrc, q->buf, q->len, &mr)
                                          : ib_mrc_get(&tp->mrc, q->buf, q->len, 1, &mr);
            if (e) {
                link_fail(L, TUTTI_ERR_IO, e,
                          "ibverbs: cannot register the %zu-byte receive buffer at %p for "
                          "rank %d (locked-memory limit? see ulimit -l)",
                          q->len, q->buf, L->peer);
                return;
            }
            tp_req_pop(&L->rq_head, &L->rq_tail);
            L->rd_req = q;
            L->rd_mr = mr;
            L->rd_off = 0;
            L->rd_raddr = h->addr;
            L->rd_rkey = h->rkey;
            L->rd_posted_last = 0;
            L->reads++;
        }
        /* the descriptor is copied: the slot is free either way */
        L->rx_next++;
        L->credits_owed++;
        link_post_reads(tp, L);
    }
}

static const char *wc_hint(enum ibv_wc_status s)
{
    switch (s) {
    case IBV_WC_RETRY_EXC_ERR:
        return " (the peer stopped answering: did it exit, crash or get killed?)";
    case IBV_WC_RNR_RETRY_EXC_ERR: return " (the peer stopped taking messages)";
    case IBV_WC_WR_FLUSH_ERR: return " (the queue pair is in the error state)";
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_LOC_PROT_ERR: return " (a buffer was deregistered or unmapped while in use)";
    default: return "";
    }
}

/* A work request failed: fail the link with the completion's status, and release what
 * the popped send entry e held. */
static void wc_failed(ib_tp_t *tp, ib_link_t *L, int peer, int recv, const ib_sqe_t *e,
                      const struct ibv_wc *wc)
{
    static const char *const what[] = { "",
                                        "a write to",
                                        "a control write to",
                                        "a read from",
                                        "an error report to",
                                        "a keep-alive probe of" };
    const char *w = recv ? "a receive from" : what[e->kind < 6 ? e->kind : 0];
    /* link_fail first: the receive being READ still counts in L->reads, so the
     * failure is reported now (with the work completion's status) rather than left
     * pending on an idle-looking link; e was popped, so fail_reads cannot see it */
    link_fail(L, TUTTI_ERR_PEER, 0,
              "ibverbs: %s rank %d (%s) failed: %s (status %d, vendor error 0x%x)%s", w, peer,
              L->addr, ibv_wc_status_str(wc->status), (int)wc->status, wc->vendor_err,
              wc_hint(wc->status));
    if (e->kind == IB_WR_READ && e->req && e->req->status == 1) {
        e->req->status = TUTTI_ERR_PEER;
        tp->completions++;
    }
    if (e->kind == IB_WR_READ)
        ib_mrc_put(&tp->mrc, e->mr);
    if (e->kind == IB_WR_ERROR)
        tp->errors_inflight--;
}

/* A send-queue work request completed: the last READ of a receive completes it. */
static inline void wc_send_done(ib_tp_t *tp, ib_link_t *L, const ib_sqe_t *e)
{
    switch (e->kind) {
    case IB_WR_READ:
        if (e->last) {
            if (e->req && e->req->status == 1) {
                e->req->xfer = e->req->len;
                e->req->status = 0;
                tp->completions++;
                L->fins_owed++;
                if (L->reads)
                    L->reads--;
                if (__builtin_expect(e->req->kind == TP_KIND_UX, 0))
                    tp_ux_arrived(e->req); /* (frees it where a receive waited on it) */
            }
            ib_mrc_put(&tp->mrc, e->mr);
        }
        break;
    case IB_WR_NOP: L->nop_inflight = 0; break;
    case IB_WR_ERROR: tp->errors_inflight--; break;
    default: break;
    }
}

/* The peer finished reading nfins of our sends: they complete, in order. */
static inline void complete_fins(ib_tp_t *tp, ib_link_t *L, int peer, unsigned nfins)
{
    for (unsigned i = 0; i < nfins; i++) {
        if (!L->fin_head) {
            link_fail(L, TUTTI_ERR_PROTOCOL, 0,
                      "ibverbs: rank %d (%s) finished reading a message that was never sent", peer,
                      L->addr);
            return;
        }
        tp_req_t *r = L->fin_head;
        tp_req_pop(&L->fin_head, &L->fin_tail);
        ib_mrc_put(&tp->mrc, r->tp_private[1]);
        r->tp_private[1] = NULL;
        r->xfer = r->len;
        r->status = 0;
        tp->completions++;
    }
}

/* A write with immediate arrived: repost the receive it used, then act on the
 * immediate (type, credits returned, sends finished). */
static inline void wc_recv(ib_tp_t *tp, ib_link_t *L, int peer, const struct ibv_wc *wc)
{
    if (!L->qp_stopped) {
        struct ibv_recv_wr wr = { .wr_id = IB_RECV_BIT | (uint64_t)peer }, *bad;
        ibv_post_recv(L->qp, &wr, &bad);
    }
    uint32_t imm = be32toh(wc->imm_data);
    ib_window_t w = { tp->slots, L->credits, L->rx_arrived - L->rx_next };
    ib_imm_t m;
    const char *why = ib_imm_decode(
        imm, wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM && (wc->wc_flags & IBV_WC_WITH_IMM), &w, &m);
    if (why) {
        link_fail(L, TUTTI_ERR_PROTOCOL, 0,
                  "ibverbs: garbage from rank %d (%s): %s (opcode %d, immediate 0x%08x)", peer,
                  L->addr, why, (int)wc->opcode, imm);
        return;
    }
    L->peer_ready = 1; /* lazily, the peer's first write says its QP can receive */
    if (m.type == IB_IMM_DATA)
        L->rx_arrived++;
    if (m.type == IB_IMM_ERROR) {
        char msg[IB_MAX_ERRMSG + 1];
        ib_errbox_read(L->ring + (size_t)tp->slots * tp->slot_bytes, wc->byte_len, msg);
        link_fail(L, m.status, 0, "rank %d (%s) failed and reported: %s", peer, L->addr, msg);
        return;
    }
    if (L->fail.status)
        return;
    L->credits += m.credits;
    complete_fins(tp, L, peer, m.fins);
}

static void handle_wc(ib_tp_t *tp, const struct ibv_wc *wc)
{
    if ((wc->wr_id & IB_UD_BIT) && !(wc->wr_id & IB_RECV_BIT)) {
        ib_lazy_wc(tp, wc); /* the connection QP's */
        return;
    }
    int recv = (wc->wr_id & IB_RECV_BIT) != 0;
    int peer = (int)(wc->wr_id & 0xffffffffu);
    if (peer < 0 || peer >= tp->nranks)
        return;
    ib_link_t *L = &tp->links[peer];
    ib_sqe_t e = { 0 };
    if (!recv && L->sqe_count) {
        e = L->sqe[L->sqe_head];
        L->sqe_head = (L->sqe_head + 1) % L->sq_depth;
        L->sqe_count--;
    }
    if (wc->status != IBV_WC_SUCCESS) {
        wc_failed(tp, L, peer, recv, &e, wc);
        return;
    }
    L->last_heard_ns = tp_now_ns();
    if (!recv)
        wc_send_done(tp, L, &e);
    else
        wc_recv(tp, L, peer, wc);
}

static int poll_cq(ib_tp_t *tp)
{
    struct ibv_wc wc[32];
    int total = 0;
    for (;;) {
        int n = ibv_poll_cq(tp->cq, 32, wc);
        if (n <= 0)
            return n < 0 ? n : total;
        for (int i = 0; i < n; i++)
            handle_wc(tp, &wc[i]);
        total += n;
        if (n < 32)
            return total;
    }
}

static void sweep(ib_tp_t *tp)
{
    if (poll_cq(tp) < 0) {
        for (int i = 0; i < tp->nranks; i++)
            if (tp->links[i].served)
                link_fail(&tp->links[i], TUTTI_ERR_IO, 0,
                          "ibverbs: polling the completion queue of %s failed", tp->dev_name);
        return;
    }
    if (tp->lazy_waiting)
        ib_lazy_tick(tp);
    for (int i = 0; i < tp->nranks; i++) {
        ib_link_t *L = &tp->links[i];
        if (!L->served || L->fail.status)
            continue;
        if (L->rd_req)
            link_post_reads(tp, L);
        if (L->rq_head)
            link_recv(tp, L);
        if (L->sq_head)
            link_send(tp, L);
        link_ctrl(tp, L);
    }
}

/* Does the stopped link still have READs the HCA has not given back? */
static int link_reads_outstanding(const ib_link_t *L)
{
    for (unsigned k = 0; k < L->sqe_count; k++)
        if (L->sqe[(L->sqe_head + k) % L->sq_depth].kind == IB_WR_READ)
            return 1;
    return 0;
}

/* Fail every request (cancel_all, abort). Links with READs in flight, or RTSs the peer may
 * still READ, are stopped and marked failed (the stream position is lost); then wait,
 * bounded, for the stopped links' READs to be flushed: until their completions come back
 * the HCA may still be writing into buffers the library takes back when this returns. */
static void cancel_everything(ib_tp_t *tp, int status)
{
    int stopped = 0;
    for (int i = 0; i < tp->nranks; i++) {
        ib_link_t *L = &tp->links[i];
        if (L->reads || L->rd_req || L->fin_head) {
            link_stop_dma(L);
            if (!L->fail.status)
                L->fail.status = status;
        }
        fail_queue(tp, &L->sq_head, &L->sq_tail, status);
        fail_queue(tp, &L->rq_head, &L->rq_tail, status);
        tp_ux_fail(&L->ux, status);
        fail_fins(tp, L, status);
        fail_reads(tp, L, status);
        stopped |= L->qp_stopped && link_reads_outstanding(L);
    }
    if (!stopped)
        return;
    uint64_t deadline = tp_now_ns() + 2000000000ull;
    for (;;) {
        int busy = 0;
        for (int i = 0; i < tp->nranks && !busy; i++)
            busy = tp->links[i].qp_stopped && link_reads_outstanding(&tp->links[i]);
        if (!busy || poll_cq(tp) < 0 || tp_now_ns() >= deadline)
            return;
        sched_yield();
    }
}

static void abort_all(ib_tp_t *tp)
{
    cancel_everything(tp, TUTTI_ERR_ABORTED);
}

/* Probe peers we wait on and have not heard from for a while: a dead peer's QP is gone,
 * and the probe's retries running out is how we learn it. */
static void keepalive(ib_tp_t *tp)
{
    if (tp->keepalive_ms <= 0)
        return;
    uint64_t now = tp_now_ns(), quiet = (uint64_t)tp->keepalive_ms * 1000000ull;
    for (int i = 0; i < tp->nranks; i++) {
        ib_link_t *L = &tp->links[i];
        if (!L->served || L->fail.status || L->nop_inflight || !L->peer_ready || sq_room(L) <= 2)
            continue;
        if (!(L->rq_head || L->fin_head || L->reads || L->sq_head))
            continue;
        if (now - L->last_heard_ns < quiet)
            continue;
        if (post_write(tp, L, IB_WR_NOP, make_imm(IB_IMM_NOP, 0, 0), 0, 0) == 0)
            L->nop_inflight = 1;
        L->last_heard_ns = now;
    }
}

/* Take what the completion channel says (the sweep takes the completions). */
static void take_events(ib_tp_t *tp)
{
    struct ibv_cq *cq;
    void *cctx;
    while (ibv_get_cq_event(tp->chan, &cq, &cctx) == 0)
        tp->cq_unacked++;
    if (tp->cq_unacked >= 64) {
        ibv_ack_cq_events(tp->cq, tp->cq_unacked);
        tp->cq_unacked = 0;
    }
}

/* Sleep on the completion channel until a completion, abort() or ms pass. */
static void block(ib_tp_t *tp, int ms)
{
    keepalive(tp);
    if (ibv_req_notify_cq(tp->cq, 0) != 0) {
        struct timespec ts = { 0, 200000 };
        nanosleep(&ts, NULL);
        return;
    }
    /* a completion that came before the arming raises no event: look once more */
    unsigned long c0 = tp->completions;
    sweep(tp);
    if (tp->completions != c0)
        return;
    struct pollfd p[2] = { { .fd = tp->chan->fd, .events = POLLIN },
                           { .fd = tp->wake_fd, .events = POLLIN } };
    if (tp->keepalive_ms > 0 && ms > tp->keepalive_ms)
        ms = tp->keepalive_ms;
    int lazy_ms = ib_lazy_sleep_ms(tp);
    if (lazy_ms >= 0 && (ms < 0 || ms > lazy_ms))
        ms = lazy_ms;
    if (poll(p, 2, ms) <= 0)
        return;
    if (p[0].revents & POLLIN)
        take_events(tp);
    if (p[1].revents & POLLIN) {
        uint64_t v;
        ssize_t r = read(tp->wake_fd, &v, sizeof(v));
        (void)r;
    }
}

/* block() only waits: what woke it is taken in by the sweep */
static void block_and_sweep(ib_tp_t *tp, int ms)
{
    block(tp, ms);
    sweep(tp);
}

TT_KIT_PROGRESS_FN(ib, ib_tp_t, sweep, block_and_sweep, abort_all, NULL, NULL)

#ifndef TT_KIT_ABI_V1
/* block()'s arming, with arm_fd for its two descriptors. The events of an earlier arm
 * are taken here, not by progress() (a stale one would only end one sleep early). */
static int ib_arm(void *vtp, int *fd_p, int *timeout_ms_p)
{
    ib_tp_t *tp = vtp;
    if (tp->arm_fd < 0)
        return TUTTI_ERR_UNSUPPORTED;
    take_events(tp);
    keepalive(tp);
    if (ibv_req_notify_cq(tp->cq, 0) != 0)
        return 1;
    unsigned long c0 = tp->completions;
    sweep(tp);
    if (tp->completions != c0 || atomic_load(&tp->aborted))
        return 1;
    *fd_p = tp->arm_fd;
    *timeout_ms_p = tp->keepalive_ms > 0 ? tp->keepalive_ms : -1;
    int lazy_ms = ib_lazy_sleep_ms(tp);
    if (lazy_ms >= 0 && (*timeout_ms_p < 0 || *timeout_ms_p > lazy_ms))
        *timeout_ms_p = lazy_ms;
    return 0;
}
#endif

static int link_served(const ib_tp_t *tp, int peer)
{
    return tp->links[peer].served;
}

TT_KIT_CHECK_FN(ib_tp_t, "ibverbs", link_served)

/* check_req, and lazily the link's connection started by its first request */
static int check_and_connect(ib_tp_t *tp, tp_req_t *r, int kind)
{
    int st = check_req(tp, r, kind);
    if (st == TUTTI_OK && tp->lazy) {
        ib_link_t *L = &tp->links[r->peer];
        ib_lazy_need(tp, L);
        if (L->fail.status) /* at once (a bad record, no memory): fail r with it */
            return check_req(tp, r, kind);
    }
    return st;
}

TT_KIT_POST_FNS(ib, ib_tp_t, ib_link_t, check_and_connect, link_send)

#ifndef TT_KIT_ABI_V1
/* The header of the next arrived slot (progress polls the completion queue, which counts
 * them in rx_arrived); the slot stays unconsumed. */
static int ib_probe(void *vtp, int peer, tutti_tp_probe_t *found_p)
{
    ib_tp_t *tp = vtp;
    if (peer < 0 || peer >= tp->nranks || !link_served(tp, peer))
        return TUTTI_ERR_INVALID_ARG;
    ib_link_t *L = &tp->links[peer];
    ib_hdr_t h = { 0 };
    if (L->fail.status)
        return tp_probe_ux_done(&L->ux, tp_probe_want(tp->host, found_p), found_p)
                   ? 1
                   : tp_link_failed_probe(tp->host, &L->fail, peer);
    int parked = !L->rq_head && L->rx_next < L->rx_arrived;
    if (parked && !link_next_slot(tp, L, &h))
        return tp_probe_ux_done(&L->ux, tp_probe_want(tp->host, found_p), found_p)
                   ? 1
                   : tp_link_failed_probe(tp->host, &L->fail, peer);
    int watch, buffer,
        st = tp_probe_chan(parked, L->rq_head, &L->ux, h.env, h.len,
                           tp_probe_want(tp->host, found_p), &watch, &buffer, found_p);
    /* another key's message in front: read it aside */
    if (buffer && rx_take_other(tp, L, h.env, h.len))
        link_recv(tp, L);
    return st;
}

/* A receive still queued has no message yet (a matched one leaves the queue: done, or
 * the READ's rd_req). */
static int ib_cancel(void *vtp, tp_req_t *r)
{
    ib_tp_t *tp = vtp;
    if (r->kind != TUTTI_TP_RECV || r->peer < 0 || r->peer >= tp->nranks)
        return TUTTI_ERR_INVALID_ARG;
    ib_link_t *L = &tp->links[r->peer];
    return tp_rq_cancel(&L->rq_head, &L->rq_tail, &L->ux, r, 0);
}
#endif

static void ib_cancel_all(void *vtp, int status)
{
    cancel_everything(vtp, status);
}

static void ib_notify_error(void *vtp, int status, const char *msg)
{
    ib_tp_t *tp = vtp;
    size_t len = TT_KIT_MIN(strlen(msg), (size_t)IB_MAX_ERRMSG);
    size_t off = (size_t)tp->slots * tp->slot_bytes;
    unsigned code = status < 0 && status > TUTTI_STATUS_LAST_ ? (unsigned)-status
                                                              : (unsigned)-TUTTI_ERR_PEER;
    for (int i = 0; i < tp->nranks; i++) {
        ib_link_t *L = &tp->links[i];
        if (!L->served || !L->qp || !L->peer_ready || L->qp_stopped || L->error_sent ||
            sq_room(L) == 0)
            continue;
        memcpy(L->stage + off, msg, len);
        if (post_write(tp, L, IB_WR_ERROR, make_imm(IB_IMM_ERROR, 0, code), off, len) == 0) {
            L->error_sent = 1;
            tp->errors_inflight++;
        }
    }
    /* best effort, bounded: let the reports leave before the caller tears down */
    uint64_t deadline = tp_now_ns() + 200000000ull;
    while (tp->errors_inflight > 0 && tp_now_ns() < deadline) {
        if (poll_cq(tp) < 0)
            break;
        sched_yield();
    }
}

static void ib_abort(void *vtp)
{
    ib_tp_t *tp = vtp;
    atomic_store(&tp->aborted, 1);
    uint64_t one = 1;
    ssize_t w = write(tp->wake_fd, &one, sizeof(one));
    (void)w;
}

static const char *ib_peer_address(void *vtp, int peer)
{
    ib_tp_t *tp = vtp;
    if (!tp || peer < 0 || peer >= tp->nranks || !tp->links[peer].served)
        return NULL;
    return tp->links[peer].addr;
}

static void ib_destroy(void *vtp)
{
    ib_tp_t *tp = vtp;
    if (!tp)
        return;
    if (ib_current == tp)
        ib_current = NULL;
    /* give back the registrations still held by requests being dropped */
    for (int i = 0; tp->links && i < tp->nranks; i++) {
        ib_link_t *L = &tp->links[i];
        while (L->fin_head) {
            tp_req_t *r = L->fin_head;
            tp_req_pop(&L->fin_head, &L->fin_tail);
            ib_mrc_put(&tp->mrc, r->tp_private[1]);
            r->tp_private[1] = NULL;
        }
        if (L->rd_req && !L->rd_posted_last)
            ib_mrc_put(&tp->mrc, L->rd_mr);
        for (unsigned k = 0; L->sqe && k < L->sqe_count; k++) {
            ib_sqe_t *e = &L->sqe[(L->sqe_head + k) % L->sq_depth];
            if (e->kind == IB_WR_READ && e->mr)
                ib_mrc_put(&tp->mrc, e->mr);
        }
        L->sqe_count = 0;
        tp_ux_clear(&L->ux); /* (their registrations ended above) */
    }
    ib_lazy_teardown(tp);
    ib_teardown(tp);
    TT_KIT_CTX_FREE(tp);
}

/* A TUTTI_IB_* integer knob within [lo, hi]; another value is a config error. */
static int knob(ib_tp_t *tp, const char *name, long def, long lo, long hi, long *out)
{
    const char *v;
    if (tp_knob_long(tp->host, name, def, lo, hi, out, &v) < 0)
        return tp->host->error(tp->host->ctx, TUTTI_ERR_CONFIG, -1, 0,
                               "ibverbs: TUTTI_%s=%s: expected an integer from %ld to %ld", name, v,
                               lo, hi);
    return TUTTI_OK;
}

/* The link failed while it connected (ib_lazy.c). */
static void lazy_link_failed(ib_link_t *L, int status, const char *msg)
{
    link_fail(L, status, 0, "%s", msg);
}

/* TUTTI_IB_CONNECT: eager (unset) or lazy. */
static int connect_mode(ib_tp_t *tp)
{
    const char *v = tp->host->config(tp->host->ctx, "IB_CONNECT");
    if (!v || !*v || !strcmp(v, "eager"))
        return TUTTI_OK;
    if (!strcmp(v, "lazy")) {
        tp->lazy = 1;
        return TUTTI_OK;
    }
    return tp->host->error(tp->host->ctx, TUTTI_ERR_CONFIG, -1, 0,
                           "ibverbs: TUTTI_IB_CONNECT=\"%.64s\" is neither eager nor lazy", v);
}

static int ib_create(const tutti_tp_host_v1_t *host, void **tp_p)
{
    ib_tp_t *tp;
    int st = TT_KIT_CTX_NEW(tp, host);
    if (st < 0)
        return st;
    tp->wake_fd = tp->arm_fd = -1;
    tp->mrc.pagemap_fd = -1;
    for (int i = 0; i < host->nranks; i++) {
        tp->links[i].served = tutti_tp_host_serves(host, i);
        snprintf(tp->links[i].addr, sizeof(tp->links[i].addr), "?");
    }
    long slots, timeout, keep, rd;
    size_t eager;
    const char *eager_v;
    if ((st = knob(tp, "IB_SLOTS", 32, 2, 4096, &slots)) < 0 ||
        (tp_knob_bytes(host, "IB_EAGER_BYTES", 8192, 0, 1 << 20, &eager, &eager_v) < 0 &&
         (st = host->error(host->ctx, TUTTI_ERR_CONFIG, -1, 0,
                           "ibverbs: TUTTI_IB_EAGER_BYTES=%s: expected a size from 0 to 1M",
                           eager_v)) < 0) ||
        (st = knob(tp, "IB_TIMEOUT", 16, 1, 31, &timeout)) < 0 ||
        (st = knob(tp, "IB_KEEPALIVE_MS", 1000, 0, 3600000, &keep)) < 0 ||
        (st = knob(tp, "IB_MAX_RD_ATOMIC", 16, 1, 255, &rd)) < 0 || (st = connect_mode(tp)) < 0)
        goto err_destroy;
    tp->link_failed = lazy_link_failed;
    tp->slots = (unsigned)slots;
    tp->eager_max = eager;
    tp->slot_bytes = (IB_HDR_BYTES + tp->eager_max + 63) & ~(size_t)63;
    tp->qp_timeout = (int)timeout;
    tp->keepalive_ms = (int)keep;
    tp->rd_init = (int)rd; /* the cap, until ib_setup_device takes the device's in */
    tp->max_inline = IB_HDR_BYTES + 64;
    if ((st = ib_setup_device(tp)) < 0 ||
        (st = tp->lazy ? ib_lazy_setup(tp) : ib_setup_links(tp)) < 0)
        goto err_destroy;
    uint64_t now = tp_now_ns();
    for (int i = 0; i < tp->nranks; i++)
        tp->links[i].last_heard_ns = now;
    ib_current = tp;
    *tp_p = tp;
    return TUTTI_OK;

err_destroy:
    ib_destroy(tp);
    return st;
}

/* ---- test hooks ---- */

void *tt_ib_debug_current(void)
{
    return ib_current;
}

int tt_ib_debug_stats(void *vtp, tt_ib_stats_t *out)
{
    ib_tp_t *tp = vtp ? vtp : ib_current;
    if (!tp || !out)
        return TUTTI_ERR_INVALID_ARG;
    *out = (tt_ib_stats_t){
        .mr_hits = tp->mrc.hits,
        .mr_misses = tp->mrc.misses,
        .mr_invalidations = tp->mrc.invalidations,
        .mr_evictions = tp->mrc.evictions,
        .mr_bytes = tp->mrc.bytes,
        .mr_entries = tp->mrc.entries,
        .mr_mode = ib_mrc_mode_name(tp->mrc.mode),
        .eager_msgs = tp->eager_msgs,
        .rdv_msgs = tp->rdv_msgs,
        .gid_index = tp->gid_index,
        .lazy = tp->lazy,
        .ud_dropped = tp->ud_dropped,
    };
    for (int i = 0; i < tp->nranks; i++)
        out->qps += tp->links[i].qp != NULL;
    return TUTTI_OK;
}

int tt_ib_debug_break_qp(void *vtp, int peer)
{
    ib_tp_t *tp = vtp ? vtp : ib_current;
    if (!tp || peer < 0 || peer >= tp->nranks || !tp->links[peer].qp)
        return TUTTI_ERR_INVALID_ARG;
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
    return ibv_modify_qp(tp->links[peer].qp, &a, IBV_QP_STATE) ? TUTTI_ERR_IO : TUTTI_OK;
}

int tt_ib_debug_qp_rd_atomic(void *vtp, int peer, int *init_p, int *resp_p)
{
    ib_tp_t *tp = vtp ? vtp : ib_current;
    if (!tp || peer < 0 || peer >= tp->nranks || !tp->links[peer].qp)
        return TUTTI_ERR_INVALID_ARG;
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    if (ibv_query_qp(tp->links[peer].qp, &a, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC,
                     &ia))
        return TUTTI_ERR_IO;
    *init_p = a.max_rd_atomic;
    *resp_p = a.max_dest_rd_atomic;
    return TUTTI_OK;
}

/* cost hints: a 4-byte exchange and one direction of a large one (soft RoCE on a VM) */
static const tp_ops_t ib_ops = {
    TT_KIT_OPS_HEAD("ibverbs", .flags = TUTTI_TP_CHANNELS | TUTTI_TP_PROBE_ANY,
                    .mem_kinds = TUTTI_MEM_BIT(TUTTI_MEM_HOST), .alpha_us = 3.0, .bw_gbs = 10.0),
    TT_KIT_OPS_FNS(ib) TT_KIT_PROBE(ib_probe) TT_KIT_ARM(ib_arm) TT_KIT_CANCEL(ib_cancel),
};

TT_KIT_REGISTER(ibverbs, ib_ops)
