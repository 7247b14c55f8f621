/* Transport kit: a link's failure, and the checks every post makes. A link fails once;
 * the first reason is kept. A link that fails while nothing is posted on it (a peer
 * that finished and closed, or reported a failure after this rank got all it needed)
 * is not the current op's failure: the report waits until a request uses the link. */
#ifndef TT_KIT_LINK_H
#define TT_KIT_LINK_H

#include <stdarg.h>
#include <stdio.h>

#include "abi.h"

#define TT_KIT_ERRMSG 2304

typedef struct tp_link_fail {
    int status;         /* 0, or the TUTTI_ERR_* the link failed with */
    int report_pending; /* failed while nothing was posted: report at the next use */
    int err_no;
    char msg[TT_KIT_ERRMSG];
} tp_link_fail_t;

/* Record the link's failure (only the first counts); busy: requests are posted on the
 * link, so the library hears of it now. Returns the link's status. */
static inline int tp_link_fail_v(const tp_host_t *h, tp_link_fail_t *f, int peer, int busy,
                                 int status, int err_no, const char *fmt, va_list ap)
{
    if (f->status)
        return f->status;
    vsnprintf(f->msg, sizeof(f->msg), fmt, ap);
    f->status = status;
    f->err_no = err_no;
    if (busy)
        h->error(h->ctx, status, peer, err_no, "%s", f->msg);
    else
        f->report_pending = 1;
    return status;
}

/* Close a link whose requests were failed one by one already (a message that did not
 * match its receive, a cancel mid-payload: the stream position is lost): its status and
 * why, told to the host by the next post or probe on it (report_pending). A link failed
 * before keeps its first failure. */
static inline void tp_link_fail_later(tp_link_fail_t *f, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void tp_link_fail_later(tp_link_fail_t *f, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tp_link_fail_v(NULL, f, -1, 0, status, 0, fmt, ap); /* not busy: h unused */
    va_end(ap);
}

/* A failed link's status for a probe (a receive from any source asking whether the peer
 * sent): the failure's explanation goes to the host now if nothing was posted on the link
 * to hear it then (report_pending), so that the library names the peer and the cause. */
static inline int tp_link_failed_probe(const tp_host_t *h, tp_link_fail_t *f, int peer)
{
    if (f->status && f->report_pending) {
        f->report_pending = 0;
        h->error(h->ctx, f->status, peer, f->err_no, "%s", f->msg);
    }
    return f->status;
}

/* Does r name a peer in [0, nranks)? (Only then may the caller look at its link.) */
static inline int tp_req_peer_ok(const tp_req_t *r, int nranks)
{
    return r && r->peer >= 0 && r->peer < nranks;
}

/* The checks of post_send/post_recv: a valid request (served: r names a peer this
 * transport serves, as it judges) whose link (f: that peer's failure record) has not
 * failed; then r is pending. An error is recorded with the host and left in r->status.
 * name: the transport, for messages. */
static inline int tp_check_req(const tp_host_t *h, const char *name, int served, tp_link_fail_t *f,
                               tp_req_t *r)
{
    if (!r || !served || (!r->buf && r->len)) {
        if (r)
            r->status = TUTTI_ERR_INVALID_ARG;
        return h->error(h->ctx, TUTTI_ERR_INVALID_ARG, r ? r->peer : -1, 0,
                        "%s: bad request (peer %d)", name, r ? r->peer : -1);
    }
    if (!TT_KIT_REQ_SUPPORTED(r)) {
        r->status = TUTTI_ERR_UNSUPPORTED;
        return h->error(h->ctx, TUTTI_ERR_UNSUPPORTED, r->peer, 0,
                        "%s: request to rank %d is not in host memory, or names a stream", name,
                        r->peer);
    }
    if (f->status) {
        r->status = f->status;
        if (f->report_pending) {
            f->report_pending = 0;
            h->error(h->ctx, f->status, r->peer, f->err_no, "%s", f->msg);
        }
        return f->status;
    }
    r->status = 1;
    r->xfer = 0;
    r->tp_private[0] = r->tp_private[1] = NULL;
    return TUTTI_OK;
}

/* Defines check_req(tp, r, kind), the check of TT_KIT_POST_FNS, for a transport named
 * name whose context (tp_type) has host, nranks and links[peer].fail: tp_check_req, with
 * served(tp, peer) asked only of a peer in range; then r->kind = kind. */
#define TT_KIT_CHECK_FN(tp_type, name, served)                                                     \
    static int check_req(tp_type *tp, tp_req_t *r, int kind)                                       \
    {                                                                                              \
        int ok = tp_req_peer_ok(r, tp->nranks);                                                    \
        int st = tp_check_req(tp->host, name, ok && served(tp, r->peer),                           \
                              ok ? &tp->links[r->peer].fail : NULL, r);                            \
        if (st < 0)                                                                                \
            return st;                                                                             \
        r->kind = kind;                                                                            \
        return TUTTI_OK;                                                                           \
    }

/* Defines link_fail(L, status, err_no, fmt, ...): the link is unusable from now on. Its
 * failure is recorded (once: tp_link_fail_v; busy(L): requests are posted on it, so the
 * library hears of it now), then drop(L) fails what is queued on it, each time. For links
 * (link_type) with tp (its context, with host), peer and fail. Returns the link's status. */
#define TT_KIT_LINK_FAIL_FN(link_type, busy, drop)                                                 \
    static int link_fail(link_type *L, int status, int err_no, const char *fmt, ...)               \
        __attribute__((format(printf, 4, 5)));                                                     \
    static int link_fail(link_type *L, int status, int err_no, const char *fmt, ...)               \
    {                                                                                              \
        va_list ap;                                                                                \
        va_start(ap, fmt);                                                                         \
        tp_link_fail_v(L->tp->host, &L->fail, L->peer, busy(L), status, err_no, fmt, ap);          \
        va_end(ap);                                                                                \
        drop(L);                                                                                   \
        return L->fail.status;                                                                     \
    }

#endif
