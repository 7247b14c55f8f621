/* Transport kit: FIFO lists of posted requests linked through tp_private[0] (each
 * transport keeps one per direction per peer), and the post_send/post_recv that fill them. */
#ifndef TT_KIT_QUEUE_H
#define TT_KIT_QUEUE_H

#include "abi.h"

static inline void tp_req_pop(tp_req_t **head, tp_req_t **tail)
{
    tp_req_t *r = *head;
    *head = r->tp_private[0];
    if (!*head)
        *tail = NULL;
    r->tp_private[0] = NULL;
}

static inline void tp_req_push(tp_req_t **head, tp_req_t **tail, tp_req_t *r)
{
    r->tp_private[0] = NULL;
    if (*tail)
        (*tail)->tp_private[0] = r;
    else
        *head = r;
    *tail = r;
}

/* Fail every queued request with status; returns how many. */
static inline unsigned tp_fail_queue(tp_req_t **head, tp_req_t **tail, int status)
{
    unsigned n = 0;
    while (*head) {
        tp_req_t *r = *head;
        tp_req_pop(head, tail);
        r->status = status;
        n++;
    }
    return n;
}

/* Defines pfx##_post_send and pfx##_post_recv, the ops table's entries, over
 * pfx##_post(tp, r, kind). */
#define TT_KIT_SEND_RECV_FNS(pfx)                                                                  \
    static int pfx##_post_send(void *vtp, tp_req_t *r)                                             \
    {                                                                                              \
        return pfx##_post(vtp, r, TUTTI_TP_SEND);                                                  \
    }                                                                                              \
    static int pfx##_post_recv(void *vtp, tp_req_t *r)                                             \
    {                                                                                              \
        return pfx##_post(vtp, r, TUTTI_TP_RECV);                                                  \
    }

/* Defines pfx##_post_send and pfx##_post_recv for a transport (tp_type) whose links
 * (tp->links[peer], link_type) keep sq_head/sq_tail, rq_head/rq_tail and ux (kit/chan.h:
 * a receive first takes a buffered message of its channel).
 * check(tp, r, kind): the transport's checks (tp_check_req and its own), setting r->kind
 * when r may be queued. start(tp, L): a send that finds its queue empty leaves at once
 * (eager: small messages leave right away). A receive is only queued, and matched in
 * progress(): a mismatch found at post time would fail the link before the op's other
 * posts (say, its eager send) went out, and be reported under the library's next post. */
#define TT_KIT_POST_FNS(pfx, tp_type, link_type, check, start)                                     \
    static inline int pfx##_post(tp_type *tp, tp_req_t *r, int kind)                               \
    {                                                                                              \
        /* a message read aside (kit/chan.h) is its receive's, also after the link failed  \
         * (its sender sent it, then left) */       \
        if (kind == TUTTI_TP_RECV && tp_req_peer_ok(r, tp->nranks) &&                              \
            __builtin_expect(tp->links[r->peer].ux.head != NULL, 0) && (r->buf || !r->len) &&      \
            TT_KIT_REQ_SUPPORTED(r)) {                                                             \
            r->kind = kind;                                                                        \
            r->status = 1;                                                                         \
            r->xfer = 0;                                                                           \
            r->tp_private[0] = r->tp_private[1] = NULL;                                            \
            if (tp_ux_post(&tp->links[r->peer].ux, r))                                             \
                return TUTTI_OK;                                                                   \
        }                                                                                          \
        int st = check(tp, r, kind);                                                               \
        if (st < 0)                                                                                \
            return st;                                                                             \
        link_type *L = &tp->links[r->peer];                                                        \
        if (kind == TUTTI_TP_RECV) {                                                               \
            tp_req_push(&L->rq_head, &L->rq_tail, r);                                              \
            return TUTTI_OK;                                                                       \
        }                                                                                          \
        tp_req_push(&L->sq_head, &L->sq_tail, r);                                                  \
        if (L->sq_head == r)                                                                       \
            start(tp, L);                                                                          \
        return TUTTI_OK;                                                                           \
    }                                                                                              \
    TT_KIT_SEND_RECV_FNS(pfx)

#endif
