/* TCP transport: the data path. See tcp.h for the shape. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "tcp.h"
#include "../kit/copy.h"
#include "../kit/ctx.h"
#include "../kit/progress.h"
#include "../kit/queue.h"

static void fail_queue(tcp_tp_t *tp, tp_req_t **head, tp_req_t **tail, int status)
{
    tp->completions += tp_fail_queue(head, tail, status);
}

static int link_busy(const tcp_link_t *L)
{
    return L->sq_head || L->rq_head || tp_ux_waiting(&L->ux);
}

static void link_drop(tcp_link_t *L)
{
    fail_queue(L->tp, &L->sq_head, &L->sq_tail, L->fail.status);
    fail_queue(L->tp, &L->rq_head, &L->rq_tail, L->fail.status);
    tp_ux_fail(&L->ux, L->fail.status);
    L->tp->completions++;
}

TT_KIT_LINK_FAIL_FN(tcp_link_t, link_busy, link_drop)

/* recv() and sendmsg() of a link, through its TLS session where it has one. */
static inline ssize_t io_recv(tcp_link_t *L, void *buf, size_t len)
{
    if (__builtin_expect(L->tls != NULL, 0))
        return tcp_tlsio_recv(L->tls, buf, len);
    return recv(L->fd, buf, len, MSG_DONTWAIT);
}

static inline ssize_t io_sendv(tcp_link_t *L, struct iovec *iov, int n)
{
    if (__builtin_expect(L->tls != NULL, 0))
        return tcp_tlsio_sendv(L->tls, iov, n);
    struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)n };
    return sendmsg(L->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* A link whose TLS session failed: why (errno EPROTO from io_recv or io_sendv). */
static int link_fail_tls(tcp_link_t *L, const char *when)
{
    return link_fail(L, TUTTI_ERR_PROTOCOL, 0, "the TLS session with rank %d (%s) failed %s: %s",
                     L->peer, L->addr, when, tcp_tlsio_reason(L->tls));
}

/* The CRC a header carries: over everything before its hcrc field. */
static uint32_t hdr_crc(const tcp_hdr_t *h)
{
    return tcp_crc32c(0, h, offsetof(tcp_hdr_t, hcrc));
}

static void hdr_for(const tcp_tp_t *tp, tcp_hdr_t *h, const tp_req_t *r)
{
    memset(h, 0, sizeof(*h));
    h->magic = TCP_MAGIC;
    h->type = TCP_FRAME_DATA;
    h->len = r->len;
    memcpy(h->env, r->env, sizeof(h->env));
    if (tp->csum)
        h->hcrc = hdr_crc(h);
}

/* Checksum mode: the header arrived with a CRC that does not match it. */
static void link_fail_hdr_crc(tcp_link_t *L)
{
    tcp_tp_t *tp = L->tp;
    link_fail(L, TUTTI_ERR_PROTOCOL, 0,
              "data corrupted on the link from rank %d (%s) to rank %d: a frame header "
              "fails its crc32c check (0x%08x computed, 0x%08x carried; the header claims "
              "type %u, %llu bytes, seq %llu): the stream can no longer be trusted",
              L->peer, L->addr, tp->rank, hdr_crc(&L->rhdr), L->rhdr.hcrc, L->rhdr.type,
              (unsigned long long)L->rhdr.len, (unsigned long long)L->rhdr.env[0]);
}

/* A send broke: the peer may have reported why before it went away, and that report
 * may be waiting, unread, in our receive buffer (nothing was posted to read it). Read
 * what is there, discarding data frames, looking for it. Returns 1 if the link failed
 * with the peer's report. */
static int link_salvage_report(tcp_link_t *L)
{
    const tcp_tp_t *tp = L->tp;
    if (L->rhdr_matched || (L->rhdr_seen && L->rhdr.type != TCP_FRAME_DATA))
        return 0; /* mid-payload of a posted receive or of a report: the stream is not
                     ours to skip */
    char sink[16384];
    size_t budget = 64u << 20;
    for (;;) {
        if (L->rhdr_got < sizeof(L->rhdr)) {
            ssize_t r = io_recv(L, (char *)&L->rhdr + L->rhdr_got, sizeof(L->rhdr) - L->rhdr_got);
            if (r <= 0)
                return 0;
            L->rhdr_got += (size_t)r;
            continue;
        }
        if (L->rhdr.magic != TCP_MAGIC || (tp->csum && L->rhdr.hcrc != hdr_crc(&L->rhdr)))
            return 0;
        const size_t tlen = tp->csum ? TCP_TRAILER_BYTES : 0;
        if (L->rhdr.type == TCP_FRAME_ERROR && L->rhdr.len <= TCP_MAX_ERRMSG) {
            char msg[TCP_MAX_ERRMSG + TCP_TRAILER_BYTES + 1];
            size_t got = 0;
            while (got < L->rhdr.len + tlen) {
                ssize_t r = io_recv(L, msg + got, L->rhdr.len + tlen - got);
                if (r <= 0)
                    return 0;
                got += (size_t)r;
            }
            if (tlen) {
                uint32_t trail;
                memcpy(&trail, msg + L->rhdr.len, sizeof(trail));
                if (trail != tcp_crc32c(0, msg, L->rhdr.len))
                    return 0; /* a corrupted report: the generic cause is safer */
            }
            msg[L->rhdr.len] = '\0';
            int st = (int)(int64_t)L->rhdr.env[0];
            if (st >= 0 || st <= TUTTI_STATUS_LAST_)
                st = TUTTI_ERR_PEER;
            link_fail(L, st, 0, "rank %d (%s) failed and reported: %s", L->peer, L->addr, msg);
            return 1;
        }
        /* a data frame nobody will read now: skip its payload (and trailer) */
        size_t left = L->rhdr.len + tlen;
        while (left) {
            if (budget == 0)
                return 0;
            ssize_t r = io_recv(L, sink, TT_KIT_MIN(left, sizeof(sink)));
            if (r <= 0)
                return 0;
            left -= (size_t)r;
            budget -= TT_KIT_MIN(budget, (size_t)r);
        }
        L->rhdr_got = 0;
    }
}

/* Push queued sends until the socket would block. In checksum mode a payload is
 * followed by its CRC, computed a step ahead of what is sent (the bytes are then in
 * cache when the kernel copies them), so the trailer always leaves in the same sendmsg
 * as the last payload bytes: computed after them, it would trail in a segment of its
 * own and cost the receiver a wake-up per message. */
static void link_send(tcp_tp_t *tp, tcp_link_t *L)
{
    const size_t tlen = tp->csum ? TCP_TRAILER_BYTES : 0;
    while (L->sq_head && !L->fail.status) {
        tp_req_t *r = L->sq_head;
        if (r->tp_private[1] != (void *)L) {
            /* first bytes of this request: its header goes in front */
            hdr_for(tp, &L->shdr, r);
            L->shdr_off = 0;
            L->scrc = 0;
            L->scrc_upto = 0;
            L->strail_off = 0;
            r->tp_private[1] = L;
        }
        size_t upto = r->len; /* payload bytes that may go now */
        if (tlen) {
            if (L->scrc_upto == r->xfer && r->xfer < r->len) {
                size_t n = TT_KIT_MIN(r->len - r->xfer, TCP_CSUM_STEP_BYTES);
                if (r->len - r->xfer - n <= TCP_CSUM_EAGER_BYTES)
                    n = r->len - r->xfer; /* no small step left behind */
                L->scrc = tcp_crc32c(L->scrc, (const char *)r->buf + r->xfer, n);
                L->scrc_upto = r->xfer + n;
            }
            upto = L->scrc_upto;
        }
        struct iovec iov[3];
        int n = 0;
        if (L->shdr_off < sizeof(L->shdr))
            iov[n++] = (struct iovec){ (char *)&L->shdr + L->shdr_off,
                                       sizeof(L->shdr) - L->shdr_off };
        if (upto > r->xfer + TCP_SEND_SLICE_BYTES)
            upto = r->xfer + TCP_SEND_SLICE_BYTES; /* the trailer waits for the last slice */
        if (r->xfer < upto)
            iov[n++] = (struct iovec){ (char *)r->buf + r->xfer, upto - r->xfer };
        if (tlen && upto == r->len) {
            L->strail = L->scrc;
            iov[n++] = (struct iovec){ (char *)&L->strail + L->strail_off, tlen - L->strail_off };
        }
        ssize_t w = io_sendv(L, iov, n);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            if (errno == EINTR)
                continue;
            int err = errno;
            if (L->tls && err == EPROTO)
                link_fail_tls(L, "while sending");
            else if (!link_salvage_report(L))
                link_fail(L, TUTTI_ERR_PEER, err, "connection to rank %d (%s) broke while sending",
                          L->peer, L->addr);
            return;
        }
        tp->moved++;
        size_t left = (size_t)w;
        size_t take = TT_KIT_MIN(left, sizeof(L->shdr) - L->shdr_off);
        L->shdr_off += take;
        left -= take;
        take = TT_KIT_MIN(left, upto - r->xfer);
        r->xfer += take;
        left -= take;
        L->strail_off += left;
        if (L->shdr_off == sizeof(L->shdr) && r->xfer == r->len && L->strail_off == tlen) {
            tp_req_pop(&L->sq_head, &L->sq_tail);
            r->tp_private[1] = NULL;
            r->status = 0;
            tp->completions++;
        }
    }
}

/* A read that moved nothing: 0 when the socket would block, else the link fails (the
 * peer closed it, or an error) and -1. */
static ssize_t read_ended(tcp_link_t *L, ssize_t r, const char *what)
{
    if (r == 0) {
        link_fail(L, TUTTI_ERR_PEER, 0,
                  "rank %d (%s) closed the connection%s%s (did it exit, crash or get killed?)",
                  L->peer, L->addr, what ? " " : "", what ? what : "");
        return -1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return 0;
    if (L->tls && errno == EPROTO)
        link_fail_tls(L, "while receiving");
    else
        link_fail(L, TUTTI_ERR_PEER, errno, "connection to rank %d (%s) broke while receiving",
                  L->peer, L->addr);
    return -1;
}

/* Bytes the stage read past a short frame (rx_surplus), given before the socket's. */
static size_t pb_take(tcp_link_t *L, void *buf, size_t len)
{
    size_t n = TT_KIT_MIN(len, L->pb_len);
    memcpy(buf, L->pb + L->pb_off, n);
    L->pb_off += n;
    L->pb_len -= n;
    return n;
}

/* recv() with the error handling every read shares: > 0 bytes, 0 would block, < 0 the
 * link failed. */
static ssize_t link_read(tcp_link_t *L, void *buf, size_t len, const char *what)
{
    if (__builtin_expect(L->pb_len != 0, 0))
        return pb_take(L, buf, len);
    for (;;) {
        ssize_t r = io_recv(L, buf, len);
        if (r > 0) {
            L->tp->moved++;
            return r;
        }
        if (r == 0 || errno != EINTR)
            return read_ended(L, r, what);
    }
}

/* Checksum mode: a payload (or a report) arrived with a CRC that does not match it.
 * The request at the head of the receive queue fails with the link. */
static void link_fail_payload_crc(tcp_link_t *L, uint32_t computed)
{
    tcp_tp_t *tp = L->tp;
    const tcp_hdr_t *h = &L->rhdr;
    link_fail(L, TUTTI_ERR_PROTOCOL, 0,
              "data corrupted on the link from rank %d (%s) to rank %d: the %s of %llu bytes "
              "(seq %llu, fingerprint 0x%016llx, count %llu, algorithm %llu tag %llu) fails "
              "its crc32c check (0x%08x computed, 0x%08x sent): the stream can no longer be "
              "trusted",
              L->peer, L->addr, tp->rank, h->type == TCP_FRAME_ERROR ? "error report" : "message",
              (unsigned long long)h->len, (unsigned long long)h->env[0],
              (unsigned long long)h->env[1], (unsigned long long)h->env[2],
              (unsigned long long)((h->env[3] >> 32) & 0x7fffffffu),
              (unsigned long long)(h->env[3] & 0xffffffffu), computed, L->rtrail);
}

/* Checksum mode: read the rest of the trailer. 1: complete; 0: not yet, and the socket
 * has no more for now (or the link failed). */
static int link_read_trailer(tcp_link_t *L, const char *what)
{
    if (L->rtrail_got < TCP_TRAILER_BYTES) {
        ssize_t r = link_read(L, (char *)&L->rtrail + L->rtrail_got,
                              TCP_TRAILER_BYTES - L->rtrail_got, what);
        if (r <= 0)
            return 0;
        L->rtrail_got += (size_t)r;
    }
    return L->rtrail_got == TCP_TRAILER_BYTES;
}

/* link_read over several buffers. */
static ssize_t link_readv(tcp_link_t *L, struct iovec *iov, int n, const char *what)
{
    if (__builtin_expect(L->pb_len != 0, 0)) {
        size_t got = 0;
        for (int i = 0; i < n && L->pb_len; i++)
            got += pb_take(L, (char *)iov[i].iov_base, iov[i].iov_len);
        return (ssize_t)got;
    }
    if (L->tls) { /* piece by piece, up to the first short one */
        ssize_t got = 0;
        for (int i = 0; i < n; i++) {
            ssize_t r = link_read(L, iov[i].iov_base, iov[i].iov_len, what);
            if (r <= 0)
                return got ? got : r;
            got += r;
            if ((size_t)r < iov[i].iov_len)
                break;
        }
        return got;
    }
    for (;;) {
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)n };
        ssize_t r = recvmsg(L->fd, &mh, MSG_DONTWAIT);
        if (r > 0) {
            L->tp->moved++;
            return r;
        }
        if (r == 0 || errno != EINTR)
            return read_ended(L, r, what);
    }
}

/* What one step of link_recv asks of its loop: stop (the socket would block, a header
 * waits for its receive, or the link failed), go around again, or go on to the next
 * step. The steps are forced inline: link_recv is the data path. */
enum { RX_STOP, RX_AGAIN, RX_NEXT };
#define TCP_RX_STEP static inline __attribute__((always_inline)) int

/* The buffer for an error report's text, allocated on the first report. 0: no memory
 * (the link failed). */
static inline int link_errbuf(tcp_link_t *L)
{
    if (!L->errbuf && !(L->errbuf = malloc(TCP_MAX_ERRMSG + 1))) {
        link_fail(L, TUTTI_ERR_NOMEM, 0, "out of memory");
        return 0;
    }
    return 1;
}

/* Read (the rest of) a frame header. When none is started and a small receive is
 * posted, the payload (and trailer) come in the same read through the stage;
 * *staged_p is how many bytes beyond the header it brought. */
TCP_RX_STEP rx_header(tcp_link_t *L, size_t tlen, size_t *staged_p)
{
    if (L->rhdr_got == 0 && L->rq_head && L->rq_head->len <= TCP_STAGE_BYTES) {
        /* Exactly header + expected payload (+ trailer): a shorter frame (an error
         * report, a mismatch) leaves its tail to the normal path, nothing beyond is
         * read. */
        if (!L->stage &&
            !(L->stage = malloc(sizeof(L->rhdr) + TCP_STAGE_BYTES + TCP_TRAILER_BYTES))) {
            link_fail(L, TUTTI_ERR_NOMEM, 0, "out of memory");
            return RX_STOP;
        }
        ssize_t r = link_read(L, L->stage, sizeof(L->rhdr) + L->rq_head->len + tlen, NULL);
        if (r <= 0)
            return RX_STOP;
        size_t h = TT_KIT_MIN((size_t)r, sizeof(L->rhdr));
        memcpy(&L->rhdr, L->stage, h);
        L->rhdr_got = h;
        *staged_p = (size_t)r - h;
        if (L->rhdr_got < sizeof(L->rhdr))
            return RX_AGAIN;
    } else if (L->rhdr_got < sizeof(L->rhdr)) {
        ssize_t r = link_read(L, (char *)&L->rhdr + L->rhdr_got, sizeof(L->rhdr) - L->rhdr_got,
                              NULL);
        if (r <= 0)
            return RX_STOP;
        L->rhdr_got += (size_t)r;
        if (L->rhdr_got < sizeof(L->rhdr))
            return RX_AGAIN;
    }
    return RX_NEXT;
}

/* A header just completed: check it, and move a staged error report's text (and
 * trailer) to where the error path reads them (*staged_p then 0). */
TCP_RX_STEP rx_open_frame(tcp_tp_t *tp, tcp_link_t *L, size_t tlen, size_t *staged_p)
{
    L->rhdr_seen = 1;
    L->rhdr_matched = 0;
    L->errgot = 0;
    L->rcrc = 0;
    L->rtrail_got = 0;
    if (tp->csum && L->rhdr.hcrc != hdr_crc(&L->rhdr)) {
        link_fail_hdr_crc(L);
        return RX_STOP;
    }
    if (L->rhdr.magic != TCP_MAGIC ||
        (L->rhdr.type != TCP_FRAME_DATA && L->rhdr.type != TCP_FRAME_ERROR) ||
        (L->rhdr.type == TCP_FRAME_ERROR && L->rhdr.len > TCP_MAX_ERRMSG)) {
        link_fail(L, TUTTI_ERR_PROTOCOL, 0,
                  "garbage from rank %d (%s): frame magic 0x%08x type %u length %llu", L->peer,
                  L->addr, L->rhdr.magic, L->rhdr.type, (unsigned long long)L->rhdr.len);
        return RX_STOP;
    }
    size_t staged = *staged_p;
    if (staged && L->rhdr.type == TCP_FRAME_ERROR) {
        if (!link_errbuf(L))
            return RX_STOP;
        L->errgot = TT_KIT_MIN(staged, L->rhdr.len);
        memcpy(L->errbuf, L->stage + sizeof(L->rhdr), L->errgot);
        L->rtrail_got = TT_KIT_MIN(staged - L->errgot, tlen);
        memcpy(&L->rtrail, L->stage + sizeof(L->rhdr) + L->errgot, L->rtrail_got);
        *staged_p = 0;
    }
    return RX_NEXT;
}

/* An error frame: read the peer's report (and check it in checksum mode), then fail
 * the link with it. Never RX_NEXT. */
TCP_RX_STEP rx_error_frame(tcp_link_t *L, size_t tlen)
{
    if (!link_errbuf(L))
        return RX_STOP;
    if (L->errgot < L->rhdr.len) {
        ssize_t r = link_read(L, L->errbuf + L->errgot, L->rhdr.len - L->errgot,
                              "while reporting an error");
        if (r <= 0)
            return RX_STOP;
        L->errgot += (size_t)r;
        return RX_AGAIN;
    }
    if (tlen) {
        if (!link_read_trailer(L, "while reporting an error"))
            return RX_STOP; /* would block, or the link failed */
        uint32_t c = tcp_crc32c(0, L->errbuf, L->errgot);
        if (c != L->rtrail) {
            link_fail_payload_crc(L, c);
            return RX_STOP;
        }
    }
    L->errbuf[L->errgot] = '\0';
    int st = (int)(int64_t)L->rhdr.env[0];
    if (st >= 0 || st <= TUTTI_STATUS_LAST_)
        st = TUTTI_ERR_PEER;
    link_fail(L, st, 0, "rank %d (%s) failed and reported: %s", L->peer, L->addr, L->errbuf);
    return RX_STOP;
}

/* Match the header against the receive at the head of the queue, and hand it what the
 * stage already holds of its payload (and trailer). */
TCP_RX_STEP rx_match(tcp_tp_t *tp, tcp_link_t *L, tp_req_t *q, size_t tlen, size_t staged)
{
    if (L->rhdr.len != q->len || memcmp(L->rhdr.env, q->env, sizeof(q->env))) {
        memcpy(q->got_env, L->rhdr.env, sizeof(q->got_env));
        q->got_len = L->rhdr.len;
        tp_req_pop(&L->rq_head, &L->rq_tail);
        q->status = TUTTI_ERR_MISMATCH;
        /* The payload stays unread: the stream position is lost for good. */
        tp_link_fail_later(&L->fail, TUTTI_ERR_MISMATCH,
                           "tcp: the link to rank %d is out of step since a message that did "
                           "not match its receive",
                           L->peer);
        tp->completions++;
        return RX_STOP;
    }
    memcpy(q->got_env, L->rhdr.env, sizeof(q->got_env));
    q->got_len = L->rhdr.len;
    L->rhdr_matched = 1;
    if (staged) {
        size_t p = TT_KIT_MIN(staged, q->len);
        if (p) /* a zero-length receive may have no buffer (NULL) */
            tp_copy(q->buf, L->stage + sizeof(L->rhdr), p);
        q->xfer = p;
        if (tlen) {
            L->rcrc = p ? tcp_crc32c(0, q->buf, p) : 0;
            L->rtrail_got = staged - p; /* <= tlen: the read stopped there */
            memcpy(&L->rtrail, L->stage + sizeof(L->rhdr) + p, L->rtrail_got);
        }
    }
    return RX_NEXT;
}

/* Read the rest of the matched payload straight into the receive's buffer, and in
 * checksum mode the trailer behind it, folding each piece into the CRC. */
TCP_RX_STEP rx_payload(tcp_link_t *L, tp_req_t *q, size_t tlen)
{
    if (!tlen && q->xfer < q->len) {
        ssize_t r = link_read(L, (char *)q->buf + q->xfer, q->len - q->xfer,
                              "in the middle of a message");
        if (r <= 0)
            return RX_STOP;
        q->xfer += (size_t)r;
        if (q->xfer < q->len)
            return RX_AGAIN;
    }
    if (tlen && (q->xfer < q->len || L->rtrail_got < tlen)) {
        /* the rest of the payload and the trailer behind it, in one call */
        struct iovec iov[2];
        int n = 0;
        if (q->xfer < q->len)
            iov[n++] = (struct iovec){ (char *)q->buf + q->xfer, q->len - q->xfer };
        iov[n++] = (struct iovec){ (char *)&L->rtrail + L->rtrail_got, tlen - L->rtrail_got };
        ssize_t r = link_readv(L, iov, n, "in the middle of a message");
        if (r <= 0)
            return RX_STOP;
        size_t p = TT_KIT_MIN((size_t)r, q->len - q->xfer);
        if (p)
            L->rcrc = tcp_crc32c(L->rcrc, (const char *)q->buf + q->xfer, p);
        q->xfer += p;
        L->rtrail_got += (size_t)r - p;
        if (q->xfer < q->len || L->rtrail_got < tlen)
            return RX_AGAIN;
    }
    if (tlen && L->rcrc != L->rtrail) {
        link_fail_payload_crc(L, L->rcrc);
        return RX_STOP;
    }
    return RX_NEXT;
}

/* The stage read a frame shorter than the receive it was read for (one of the other
 * channel): what it read past the frame (and its trailer) is the next frame's, kept for
 * the next reads. 0: out of memory (the link failed). */
static int rx_surplus(tcp_link_t *L, size_t tlen, size_t *staged_p)
{
    size_t keep = (size_t)L->rhdr.len + tlen, extra = *staged_p - keep;
    if (!L->pb && !(L->pb = malloc(sizeof(L->rhdr) + TCP_STAGE_BYTES + TCP_TRAILER_BYTES))) {
        link_fail(L, TUTTI_ERR_NOMEM, 0, "out of memory");
        return 0;
    }
    /* ahead of what pb still holds (the stage's read then came from pb alone, so both
     * fit where pb's bytes were) */
    memmove(L->pb + extra, L->pb + L->pb_off, L->pb_len);
    memcpy(L->pb, L->stage + sizeof(L->rhdr) + keep, extra);
    L->pb_off = 0;
    L->pb_len += extra;
    *staged_p = keep;
    return 1;
}

TT_KIT_TAKE_OTHER_FN(tcp_tp_t, tcp_link_t, "tcp")

/* Read headers and payloads for posted receives until the socket would block. In
 * checksum mode the payload's CRC is computed over each piece just received into the
 * caller's buffer (no extra copy), and checked against the trailer before the receive
 * completes. */
static void link_recv(tcp_tp_t *tp, tcp_link_t *L)
{
    const size_t tlen = tp->csum ? TCP_TRAILER_BYTES : 0;
    while (!L->fail.status) {
        size_t staged = 0; /* payload (and trailer) bytes that came with the header */
        int s = rx_header(L, tlen, &staged);
        if (s == RX_STOP)
            return;
        if (s == RX_AGAIN)
            continue;
        if (L->rhdr_got == sizeof(L->rhdr) && !L->rhdr_seen &&
            rx_open_frame(tp, L, tlen, &staged) == RX_STOP)
            return;
        if (L->rhdr.type == TCP_FRAME_ERROR) {
            if (rx_error_frame(L, tlen) == RX_STOP)
                return;
            continue;
        }
        tp_req_t *q = L->rq_head;
        if (!q) {
            /* header parked until a receive is posted; news for a prober */
            tp->completions += L->probe_watch;
            L->probe_watch = 0;
            return;
        }
        if (!L->rhdr_matched) {
            if (staged > L->rhdr.len + tlen && !rx_surplus(L, tlen, &staged))
                return;
            if (tp_key(L->rhdr.env) != tp_key(q->env) &&
                !(q = rx_take_other(tp, L, L->rhdr.env, L->rhdr.len)))
                return;
            if (rx_match(tp, L, q, tlen, staged) == RX_STOP)
                return;
        }
        s = rx_payload(L, q, tlen);
        if (s == RX_STOP)
            return;
        if (s == RX_AGAIN)
            continue;
        tp_req_pop(&L->rq_head, &L->rq_tail);
        q->status = 0;
        tp->completions++;
        L->rhdr_got = 0;
        L->rhdr_seen = 0;
        L->rhdr_matched = 0;
        if (__builtin_expect(q->kind == TP_KIND_UX, 0))
            tp_ux_arrived(q); /* (frees q where a receive waited on it) */
        if (!L->rq_head)
            return; /* no read-ahead: it would cost a syscall that finds nothing */
    }
}

/* A spin's round: a recv() on each link that waits for bytes. Gating a link whose last
 * read found nothing behind poll(fd, POLLIN, 0) (lock-free, no wait-queue entry) did not
 * pay: a message that has come then costs two calls (docs/benchmarks.md, session 72). */
static void sweep(tcp_tp_t *tp)
{
    int busy = 0, calling = 0;
    for (int i = 0; i < tp->nranks; i++) {
        tcp_link_t *L = &tp->links[i];
        if (L->fd < 0 && tp->setup && !L->fail.status && (L->sq_head || L->rq_head)) {
            tcp_setup_need(tp, i);
            calling = 1;
        }
        if (L->fd < 0 || L->fail.status)
            continue;
        busy |= L->sq_head || L->rq_head;
        if (L->sq_head)
            link_send(tp, L);
        if (L->rq_head || L->probe_watch)
            link_recv(tp, L);
    }
    /* Lazily, connections move on the loop: while a link with requests waits for its
     * connection, or a peer's call is in its hello, each sweep runs it; with nothing
     * posted (another transport's wait lets this one run now and then), too; else every
     * 64th, for a peer calling this rank while it spins on other links (every block runs
     * it) */
    if (tp->setup && (calling || !busy || tcp_setup_answering(tp) || (++tp->lazy_tick & 63) == 0))
        uv_run(&tp->loop, UV_RUN_NOWAIT);
}

static void abort_all(tcp_tp_t *tp)
{
    for (int i = 0; i < tp->nranks; i++) {
        tcp_link_t *L = &tp->links[i];
        fail_queue(tp, &L->sq_head, &L->sq_tail, TUTTI_ERR_ABORTED);
        fail_queue(tp, &L->rq_head, &L->rq_tail, TUTTI_ERR_ABORTED);
        tp_ux_fail(&L->ux, TUTTI_ERR_ABORTED);
    }
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    tcp_link_t *L = h->data;
    tcp_tp_t *tp = L->tp;
    if (status < 0) {
        /* libuv says EBADF for any socket error; the socket knows the real one */
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(L->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || !err)
            err = -status;
        link_fail(L, TUTTI_ERR_PEER, err, "connection to rank %d (%s) failed", L->peer, L->addr);
        return;
    }
    if (events & UV_WRITABLE)
        link_send(tp, L);
    if (events & UV_READABLE)
        link_recv(tp, L);
}

/* The wait's timer: it ends uv_run. Without uv_stop, a timer that came due before
 * uv_run polled (its first step runs due timers, then computes the poll's timeout from
 * the timers left) left epoll waiting with no timeout at all: a thread preempted for
 * the 1 ms of a short wait between arming it and polling slept until a socket woke it,
 * past every deadline (seen in CI under load: test_p2p any_source_timeout, epoll_wait
 * with timeout -1 in block(ms = 1)). */
static void on_timer(uv_timer_t *t)
{
    uv_stop(t->loop);
}
static void on_wake(uv_async_t *a)
{
    (void)a;
}

/* Whether a wait should wake when the link's socket turns readable: while it receives,
 * and while it only sends too (a failing peer reports why, or dies), but not behind a
 * parked header, which would wake it for nothing. */
static int link_wants_read(const tcp_link_t *L)
{
    int parked = L->rhdr_got == sizeof(L->rhdr) && !L->rq_head && L->rhdr.type == TCP_FRAME_DATA;
    return (L->rq_head || L->sq_head || L->probe_watch) && !parked;
}

/* Register with the loop what each link waits for: readable while it receives (or
 * sends: a failing peer speaks up), writable while it has something to send. */
static void watch(tcp_tp_t *tp)
{
    for (int i = 0; i < tp->nranks; i++) {
        tcp_link_t *L = &tp->links[i];
        if (L->fd < 0)
            continue;
        int ev = 0;
        if (!L->fail.status) {
            if (link_wants_read(L))
                ev |= UV_READABLE;
            if (L->sq_head && !L->tx_broken)
                ev |= UV_WRITABLE;
        }
        if (ev && (!L->poll_active || ev != L->poll_events)) {
            uv_poll_start(&L->poll, ev, on_poll);
            L->poll_active = 1;
            L->poll_events = ev;
        } else if (!ev && L->poll_active) {
            uv_poll_stop(&L->poll);
            L->poll_active = 0;
        }
    }
}

/* TLS: a session may hold bytes it read ahead of what a read took (a peer's report
 * behind a frame, say), and the socket may then have nothing more: a wait on it would
 * sleep past them. Reads them where the link wants to read (as watch() would wake it
 * for); 1 if that moved bytes or failed the link, and the caller must not wait. */
static int tls_drain(tcp_tp_t *tp)
{
    if (__builtin_expect(!tp->tls_ctx, 1))
        return 0;
    unsigned long m0 = tp->moved, c0 = tp->completions;
    for (int i = 0; i < tp->nranks; i++) {
        tcp_link_t *L = &tp->links[i];
        if (L->tls && L->fd >= 0 && !L->fail.status && link_wants_read(L) &&
            tcp_tlsio_pending(L->tls))
            link_recv(tp, L);
    }
    return tp->moved != m0 || tp->completions != c0;
}

/* Block in the libuv loop until something completes or ms pass. */
static void block(tcp_tp_t *tp, int ms)
{
    if (tls_drain(tp))
        return;
    watch(tp);
    /* The loop's clock only advances while it runs; between our calls it goes stale,
     * and a timer armed from a stale clock is already due (it would fire at once; see
     * on_timer for what then keeps epoll from waiting for ever). */
    uv_update_time(&tp->loop);
    uv_timer_start(&tp->timer, on_timer, (uint64_t)ms, 0);
    uv_run(&tp->loop, UV_RUN_ONCE);
    uv_timer_stop(&tp->timer);
}

/* The CPU pid last ran on (field 39 of /proc/<pid>/stat), or -1. */
static int proc_cpu(long pid)
{
    char buf[1024], *end;
    const char *f = tp_stat_field(tp_proc_stat(pid, buf, sizeof(buf)), 39);
    long cpu = f ? strtol(f, &end, 10) : -1;
    return f && end != f && cpu >= 0 && cpu < CPU_SETSIZE ? (int)cpu : -1;
}

/* tp_hop_t's shares(): does a lower rank on this host run on CPU mine? Only the higher
 * rank of two moves, so that they do not chase each other. One /proc read per call, the
 * lower local ranks in turn (a rank with dozens of them must not read dozens of files
 * every check); the others' CPUs as last read. */
static int tcp_shares(void *vtp, int mine, cpu_set_t *busy)
{
    tcp_tp_t *tp = vtp;
    for (int n = 0; n < tp->rank; n++) {
        int i = tp->hop_look;
        tp->hop_look = (i + 1) % tp->rank;
        tcp_link_t *L = &tp->links[i];
        if (L->pid > 0 && L->fd >= 0) {
            L->cpu = proc_cpu(L->pid);
            break;
        }
    }
    int shared = 0;
    for (int i = 0; i < tp->rank; i++) {
        const tcp_link_t *L = &tp->links[i];
        if (L->pid <= 0 || L->fd < 0 || L->cpu < 0)
            continue;
        CPU_SET(L->cpu, busy);
        shared |= L->cpu == mine;
    }
    return shared;
}

TT_KIT_PROGRESS_FN(tcp, tcp_tp_t, sweep, block, abort_all, &tp->moved, &tp->hop)

static int link_served(const tcp_tp_t *tp, int peer)
{
    return tutti_tp_host_serves(tp->host, peer);
}

/* A send posted on an idle link starts at once; lazily, on a link not yet connected, the
 * call to its peer does (sweeps do it for receives). */
static void link_start(tcp_tp_t *tp, tcp_link_t *L)
{
    if (L->fd >= 0)
        link_send(tp, L);
    else if (tp->setup)
        tcp_setup_need(tp, L->peer);
}

TT_KIT_CHECK_FN(tcp_tp_t, "tcp", link_served)
TT_KIT_POST_FNS(tcp, tcp_tp_t, tcp_link_t, check_req, link_start)

#ifndef TT_KIT_ABI_V1
/* The next frame's header, read and parked if it has come (link_recv with no receive
 * posted reads a header and stops there). */
static int tcp_probe(void *vtp, int peer, tutti_tp_probe_t *found_p)
{
    tcp_tp_t *tp = vtp;
    if (peer < 0 || peer >= tp->nranks || peer == tp->rank || !link_served(tp, peer))
        return TUTTI_ERR_INVALID_ARG;
    tcp_link_t *L = &tp->links[peer];
    if (!L->fail.status && !L->rq_head && L->fd >= 0 &&
        (L->rhdr_got < sizeof(L->rhdr) || L->rhdr.type != TCP_FRAME_DATA))
        link_recv(tp, L); /* a report's text, too */
    if (L->fail.status)
        return tp_probe_ux_done(&L->ux, tp_probe_want(tp->host, found_p), found_p)
                   ? 1
                   : tp_link_failed_probe(tp->host, &L->fail, peer);
    int buffer,
        st = tp_probe_chan(L->rhdr_seen && L->rhdr.type == TCP_FRAME_DATA, L->rq_head, &L->ux,
                           L->rhdr.env, L->rhdr.len, tp_probe_want(tp->host, found_p),
                           &L->probe_watch, &buffer, found_p);
    /* another key's message in front: read it aside */
    if (buffer && rx_take_other(tp, L, L->rhdr.env, L->rhdr.len))
        link_recv(tp, L);
    return st;
}

/* A receive no header has matched yet leaves its link's queue (the head whose header
 * matched it is being read into). */
static int tcp_cancel(void *vtp, tp_req_t *r)
{
    tcp_tp_t *tp = vtp;
    if (r->kind != TUTTI_TP_RECV || r->peer < 0 || r->peer >= tp->nranks)
        return TUTTI_ERR_INVALID_ARG;
    tcp_link_t *L = &tp->links[r->peer];
    return tp_rq_cancel(&L->rq_head, &L->rq_tail, &L->ux, r, L->rhdr_matched);
}

/* Armed, the loop's epoll set holds what each link waits for (libuv adds a watcher to
 * it on the loop's next turn, so a turn that does not wait flushes them, and runs what
 * is ready): its descriptor turns readable when a link can move, or abort() sends the
 * loop's wake-up. Nothing to disarm. */
static int tcp_arm(void *vtp, int *fd_p, int *timeout_ms_p)
{
    tcp_tp_t *tp = vtp;
    unsigned long c0 = tp->completions, m0 = tp->moved;
    if (atomic_load(&tp->aborted) || tls_drain(tp))
        return 1;
    watch(tp);
    uv_run(&tp->loop, UV_RUN_NOWAIT);
    if (tp->completions != c0 || tp->moved != m0 || atomic_load(&tp->aborted))
        return 1;
    *fd_p = uv_backend_fd(&tp->loop);
    /* a lazy call's retry timer (20 ms: an address not yet published, a refused
     * connect) must end the sleep too, not only the descriptor */
    *timeout_ms_p = uv_backend_timeout(&tp->loop);
    return *fd_p >= 0 ? 0 : TUTTI_ERR_UNSUPPORTED;
}
#endif

/* The head send has begun leaving: another frame now would land inside its payload. */
static int link_mid_send(const tcp_link_t *L)
{
    return (L->sq_head && L->sq_head->tp_private[1] == (void *)L &&
            (L->shdr_off > 0 || L->sq_head->xfer > 0)) ||
           (L->tls && tcp_tlsio_unsent(L->tls)); /* records encrypted, not all sent */
}

static void tcp_cancel_all(void *vtp, int status)
{
    tcp_tp_t *tp = vtp;
    for (int i = 0; i < tp->nranks; i++) {
        tcp_link_t *L = &tp->links[i];
        if (link_mid_send(L)) {
            /* Cut mid-message: the peer must not take what follows for payload, so no
             * frame goes on this link again; closing our side tells the peer. */
            L->tx_broken = 1;
            shutdown(L->fd, SHUT_WR);
        }
        fail_queue(tp, &L->sq_head, &L->sq_tail, status);
        if (L->rq_head && L->rhdr_matched) /* mid-payload: position lost */
            tp_link_fail_later(&L->fail, status,
                               "tcp: the link to rank %d lost its place in a message cancelled "
                               "mid-way (status %d)",
                               L->peer, status);
        fail_queue(tp, &L->rq_head, &L->rq_tail, status);
        tp_ux_fail(&L->ux, status);
    }
}

static void tcp_notify_error(void *vtp, int status, const char *msg)
{
    tcp_tp_t *tp = vtp;
    tcp_setup_failed(tp, status, msg); /* lazily: links not yet connected hear it when they call */
    size_t len = strlen(msg);
    if (len > TCP_MAX_ERRMSG)
        len = TCP_MAX_ERRMSG;
    tcp_hdr_t h = { .magic = TCP_MAGIC, .type = TCP_FRAME_ERROR, .len = len };
    h.env[0] = (uint64_t)(int64_t)status;
    char frame[sizeof(h) + TCP_MAX_ERRMSG + TCP_TRAILER_BYTES];
    size_t total = sizeof(h) + len;
    if (tp->csum) {
        h.hcrc = hdr_crc(&h);
        uint32_t trail = tcp_crc32c(0, msg, len);
        memcpy(frame + total, &trail, sizeof(trail));
        total += sizeof(trail);
    }
    memcpy(frame, &h, sizeof(h));
    memcpy(frame + sizeof(h), msg, len);
    uint64_t deadline = tp_now_ns() + 200000000ull; /* best effort, bounded */
    for (int i = 0; i < tp->nranks; i++) {
        tcp_link_t *L = &tp->links[i];
        if (L->fd < 0 || L->tx_broken || link_mid_send(L))
            continue; /* a cut send: cancel_all() closes the link, the peer reads failed/ */
        size_t off = 0;
        while (off < total) {
            struct iovec iov = { frame + off, total - off };
            ssize_t w = io_sendv(L, &iov, 1);
            if (w > 0) {
                off += (size_t)w;
                continue;
            }
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                uint64_t now = tp_now_ns();
                if (now >= deadline)
                    break;
                struct pollfd p = { .fd = L->fd, .events = POLLOUT };
                poll(&p, 1, (int)((deadline - now) / 1000000u) + 1);
                continue;
            }
            break;
        }
        if (off > 0 && off < total) {
            L->tx_broken = 1;
            shutdown(L->fd, SHUT_WR);
        }
    }
}

static void tcp_link_up(tcp_tp_t *tp, int peer)
{
    tcp_link_t *L = &tp->links[peer];
    uv_poll_init_socket(&tp->loop, &L->poll, L->fd);
    L->poll.data = L;
    L->poll_inited = 1;
    tp->moved++;
    if (L->sq_head)
        link_send(tp, L);
    if (L->rq_head || L->probe_watch)
        link_recv(tp, L);
}

static void tcp_link_setup_failed(tcp_tp_t *tp, int peer, int status, const char *msg)
{
    link_fail(&tp->links[peer], status, 0, "%s", msg);
}

static void tcp_abort(void *vtp)
{
    tcp_tp_t *tp = vtp;
    atomic_store(&tp->aborted, 1);
    uv_async_send(&tp->wake);
}

static const char *tcp_peer_address(void *vtp, int peer)
{
    tcp_tp_t *tp = vtp;
    if (!tp || peer < 0 || peer >= tp->nranks)
        return NULL;
    if (!tp->links[peer].addr[0] && tp->setup)
        return "not connected yet";
    return tp->links[peer].addr;
}

static void on_close_noop(uv_handle_t *h)
{
    (void)h;
}

/* ---- a forked child ----
 *
 * A child forked (not exec'd) after the set-up inherits every link's socket. While it
 * lives the connection does not close when the parent dies, so the peers saw nothing
 * for their whole timeout (shm watches its peers' pids and was not fooled). The child
 * must not use the parent's links either (the library refuses its calls on the parent's
 * communicator). So a pthread_atfork child handler closes, in the child, the sockets of
 * every live context: the links' (marked -1, never used or closed again there) and the
 * lazy set-up's listener and connections. libuv's own descriptors (the epoll, the
 * eventfd) stay: they hold no connection open. The list of live contexts is under
 * live_lock, which the prepare handler takes and the parent and child handlers release,
 * so that the child finds the list whole. A link a lazy connection brings up in the
 * parent while it forks may be missed (its number is set by the progress thread). */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static tcp_tp_t *live_head;
static pthread_once_t live_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void)
{
    pthread_mutex_lock(&live_lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&live_lock);
}

static void fork_child(void)
{
    for (tcp_tp_t *tp = live_head; tp; tp = tp->live_next) {
        for (int i = 0; i < tp->nranks; i++) {
            tcp_link_t *L = &tp->links[i];
            if (L->fd >= 0) {
                close(L->fd);
                L->fd = -1;
            }
        }
        tcp_setup_fork_child(tp);
    }
    pthread_mutex_unlock(&live_lock);
}

static void live_init(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static void live_add(tcp_tp_t *tp)
{
    pthread_once(&live_once, live_init);
    pthread_mutex_lock(&live_lock);
    tp->live_prev = NULL;
    tp->live_next = live_head;
    if (live_head)
        live_head->live_prev = tp;
    live_head = tp;
    tp->live = 1;
    pthread_mutex_unlock(&live_lock);
}

static void live_remove(tcp_tp_t *tp)
{
    pthread_mutex_lock(&live_lock);
    if (tp->live) {
        if (tp->live_prev)
            tp->live_prev->live_next = tp->live_next;
        else
            live_head = tp->live_next;
        if (tp->live_next)
            tp->live_next->live_prev = tp->live_prev;
        tp->live = 0;
    }
    pthread_mutex_unlock(&live_lock);
}

static void tcp_destroy(void *vtp)
{
    tcp_tp_t *tp = vtp;
    if (!tp)
        return;
    live_remove(tp);
    for (int i = 0; i < tp->nranks; i++) {
        tcp_link_t *L = &tp->links[i];
        if (L->poll_inited)
            uv_close((uv_handle_t *)&L->poll, on_close_noop);
        if (L->fd >= 0) {
            /* Closing with unread bytes makes the kernel reset the connection, and a
             * reset destroys what we sent but the peer has not read yet, such as our
             * error report. So drain what is there (bounded), then close. */
            char sink[16384];
            size_t drained = 0;
            ssize_t r;
            while (drained < (64u << 20) && (r = recv(L->fd, sink, sizeof(sink), MSG_DONTWAIT)) > 0)
                drained += (size_t)r;
            close(L->fd);
        }
        tcp_tlsio_free(L->tls);
        free(L->errbuf);
        free(L->stage);
        free(L->pb);
        tp_ux_clear(&L->ux);
    }
    tcp_setup_close_lazy(tp);
    uv_close((uv_handle_t *)&tp->timer, on_close_noop);
    uv_close((uv_handle_t *)&tp->wake, on_close_noop);
    uv_run(&tp->loop, UV_RUN_DEFAULT);
    uv_loop_close(&tp->loop);
    tcp_setup_free_lazy(tp);
    tcp_tls_ctx_free(tp->tls_ctx);
    TT_KIT_CTX_FREE(tp);
}

/* The context, its links (none connected yet) and its libuv loop: where tcp_create and
 * tcp_recv_fuzz_input start. */
static int tcp_ctx_new(const tutti_tp_host_v1_t *host, tcp_tp_t **tp_p)
{
    tcp_tp_t *tp;
    int st = TT_KIT_CTX_NEW(tp, host);
    if (st < 0)
        return st;
    for (int i = 0; i < host->nranks; i++) {
        tp->links[i].fd = -1;
        tp->links[i].cpu = -1;
    }
    st = uv_loop_init(&tp->loop);
    if (st < 0) {
        TT_KIT_CTX_FREE(tp);
        return host->error(host->ctx, TUTTI_ERR_INTERNAL, -1, -st, "tcp: uv_loop_init failed");
    }
    uv_timer_init(&tp->loop, &tp->timer);
    uv_async_init(&tp->loop, &tp->wake, on_wake);
    tp->link_up = tcp_link_up;
    tp->link_failed = tcp_link_setup_failed;
    *tp_p = tp;
    return TUTTI_OK;
}

/* TUTTI_CHECKSUM, TLS (TUTTI_TLS_*), the job instance, and whether the library holds a
 * job secret. */
static int tcp_identity(tcp_tp_t *tp)
{
    const tutti_tp_host_v1_t *host = tp->host;
    const char *cs = host->config(host->ctx, "CHECKSUM");
    if (!cs || !*cs || !strcmp(cs, "none"))
        tp->csum = TCP_CSUM_NONE;
    else if (!strcmp(cs, "crc32c"))
        tp->csum = TCP_CSUM_CRC32C;
    else
        return host->error(host->ctx, TUTTI_ERR_CONFIG, -1, 0,
                           "tcp: TUTTI_CHECKSUM=\"%.64s\" is not a checksum this transport "
                           "has (none, crc32c)",
                           cs);
    if (tp->csum)
        host->log(host->ctx, TUTTI_LOG_INFO, "tcp: payload checksums crc32c (%s)",
                  tcp_crc32c_impl());
    int st = tcp_tls_ctx_new(host, &tp->tls_ctx);
    if (st < 0)
        return st;
    tp->instance = "";
    if (tutti_tp_host_has(host, instance) && host->instance)
        tp->instance = host->instance;
    if (strlen(tp->instance) > TCP_MAX_INSTANCE)
        return host->error(host->ctx, TUTTI_ERR_CONFIG, -1, 0,
                           "tcp: the job instance \"%.64s...\" is longer than %d bytes",
                           tp->instance, TCP_MAX_INSTANCE);
    tp->auth = 0;
    if (tutti_tp_host_has(host, auth_answer) && host->auth_answer) {
        /* A throwaway answer says whether there is a secret (it never leaves here). */
        uint8_t challenge[TCP_CHALLENGE_LEN] = { 0 }, answer[32];
        st = host->auth_answer(host->ctx, "tcp-probe", challenge, answer);
        if (st == TUTTI_OK)
            tp->auth = 1;
        else if (st != TUTTI_ERR_UNSUPPORTED)
            return host->error(host->ctx, st, -1, 0,
                               "tcp: the library cannot answer challenges (status %d)", st);
    }
    host->log(host->ctx, TUTTI_LOG_INFO, "tcp: job instance \"%s\"; %s", tp->instance,
              tp->auth ? "hellos prove the job secret" : "no job secret");
    return TUTTI_OK;
}

static int tcp_create(const tutti_tp_host_v1_t *host, void **tp_p)
{
    tcp_tp_t *tp = NULL;
    char why[320] = "";
    int published = 0;
    int st = tcp_setup_fd_room(host, why, sizeof(why));
    if (st == 0)
        st = tcp_ctx_new(host, &tp);
    if (st == 0 && ((st = tcp_identity(tp)) < 0 ||
                    (st = tcp_setup_connect(tp, &published, why, sizeof(why))) < 0))
        tcp_destroy(tp);
    if (st < 0) {
        if (!published)
            tcp_setup_refuse(host, st, why);
        return st;
    }
    /* leaving a CPU shared with a lower local rank (while there are CPUs for every rank:
     * with fewer, sharing is unavoidable and moving only churns; never under
     * TUTTI_BIND=none) */
    int local_lower = 0;
    for (int i = 0; i < tp->rank; i++)
        local_lower += tp->links[i].pid > 0;
    tp->hop.shares = tcp_shares;
    tp->hop.min_cpus = host->nranks;
    tp->hop.enabled = local_lower > 0 && host->spin_us > 0 && !tp_bind_none(host);
    for (int i = 0; i < host->nranks; i++) {
        tcp_link_t *L = &tp->links[i];
        if (L->fd < 0)
            continue;
        uv_poll_init_socket(&tp->loop, &L->poll, L->fd);
        L->poll.data = L;
        L->poll_inited = 1;
    }
    live_add(tp);
    *tp_p = tp;
    return TUTTI_OK;
}

/* Fuzzing and tests only (see tcp.h). Built like tcp_create, with a socketpair for the
 * link to rank 1 in place of the set-up. */
int tcp_recv_fuzz_input(const tutti_tp_host_v1_t *host, int csum, const uint8_t *data, size_t len,
                        tp_req_t *reqs, size_t nreqs)
{
    int sv[2];
    tcp_tp_t *tp;
    if (tcp_ctx_new(host, &tp) < 0)
        return -1;
    tp->csum = csum;
    tp->instance = "";
    if (host->nranks < 2 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0) {
        tcp_destroy(tp);
        return -1;
    }
    /* the peer's bytes wait in the socket, then its end closes (the reader sees EOF) */
    size_t off = 0;
    ssize_t w;
    while (off < len && (w = write(sv[1], data + off, len - off)) > 0)
        off += (size_t)w;
    close(sv[1]);
    tcp_link_t *L = &tp->links[1];
    L->fd = sv[0];
    snprintf(L->addr, sizeof(L->addr), "fuzz");
    uv_poll_init_socket(&tp->loop, &L->poll, L->fd);
    L->poll.data = L;
    L->poll_inited = 1;
    for (size_t i = 0; i < nreqs; i++)
        tcp_post_recv(tp, &reqs[i]);
    /* sweep until every request is done, or a sweep moves nothing */
    for (int i = 0; i < 1000; i++) {
        unsigned long c0 = tp->completions;
        tcp_progress(tp, 0);
        if (!L->rq_head || tp->completions == c0)
            break;
    }
    tcp_cancel_all(tp, TUTTI_ERR_ABORTED);
    tcp_destroy(tp);
    return 0;
}

/* cost hints: a 4-byte exchange and one direction of a large one on loopback */
static const tp_ops_t tcp_ops = {
    TT_KIT_OPS_HEAD("tcp", .flags = TUTTI_TP_CHANNELS | TUTTI_TP_PROBE_ANY,
                    .mem_kinds = TUTTI_MEM_BIT(TUTTI_MEM_HOST), .alpha_us = 10.0, .bw_gbs = 2.0),
    TT_KIT_OPS_FNS(tcp) TT_KIT_PROBE(tcp_probe) TT_KIT_ARM(tcp_arm) TT_KIT_CANCEL(tcp_cancel),
};

TT_KIT_REGISTER(tcp, tcp_ops)
