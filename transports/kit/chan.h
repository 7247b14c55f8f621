/* Transport kit: channels (ABI 1.6, TUTTI_TP_CHANNELS; transport_v2.h). A message's
 * channel is bit 63 of its envelope's env[3]: the library sends its point-to-point
 * messages on channel 1 and its collectives on channel 0, over the one ordered stream a
 * pair of ranks has. A posted receive takes the next message of its own key: channel
 * 0 is one key (the collectives' order is the stream's), and on channel 1 each env[3]
 * (the tag) is its own, so a point-to-point message that comes while a collective's
 * receive waits (a send left outstanding over a collective the peer entered first) no
 * longer lands in it, and receives match their tags, not the next message (MPI's
 * rule: messages of one tag from one peer in order, other tags left to theirs).
 *
 * A link keeps one queue of posted receives, in posting order. The message at the head
 * of the stream goes to the first receive of its channel in that queue (moved to the
 * queue's head, where the transport's receive path takes its requests from). When the
 * queue holds receives of the other channel only, the message is read into a buffer of
 * the link's own (an "unexpected" message, as MPI's eager path keeps them): the receive
 * waiting behind it could not go on otherwise, a stream being read in order. The next
 * receive posted for its channel takes it from there (a copy), or waits on it while it
 * still comes in. With no receive posted at all the message stays in the stream, as it
 * always did. The buffering receive is an ordinary request of the link's (kind
 * TP_KIND_UX) that the transport fills by its usual path; a transport calls
 * tp_ux_arrived where such a request completes. */
#ifndef TT_KIT_CHAN_H
#define TT_KIT_CHAN_H

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi.h"
#include "queue.h"

#define TP_KIND_UX 0x5558 /* a link's own receive buffering an unexpected message */

/* The largest message read aside: half this host's memory (a length past it is garbage
 * or cannot be held; the fuzz build sets a small bound, its allocator's limit being 2
 * GiB). */
static inline uint64_t tp_ux_max(void)
{
#ifdef TP_UX_MAX_BYTES
    return TP_UX_MAX_BYTES;
#else
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 2 : 1ull << 34;
#endif
}

static inline unsigned tp_chan(const uint64_t env[4])
{
    return (unsigned)(env[3] >> 63);
}

/* What a receive matches a message by: 0 for channel 0, env[3] on channel 1. */
static inline uint64_t tp_key(const uint64_t env[4])
{
    return (env[3] >> 63) ? env[3] : 0;
}

typedef struct tp_ux {
    tp_req_t req; /* first: the request is the entry; kind TP_KIND_UX, buf its own */
    struct tp_ux *next;
    tp_req_t *waiter;           /* a receive posted for it while it still came in */
    unsigned long *completions; /* the transport's count, for the waiter */
    struct tp_uxq *owner;
} tp_ux_t;

typedef struct tp_uxq {
    tp_ux_t *head, *tail; /* arrival order */
    tp_ux_t *dead;        /* failed ones handed out: freed by tp_ux_clear only (a DMA may
                             still be under way into them: ibverbs' flushed READs) */
    unsigned long made;   /* messages read aside so far (tests) */
} tp_uxq_t;

static inline void tp_ux_unlink(tp_uxq_t *q, tp_ux_t *e)
{
    tp_ux_t **pp = &q->head, *prev = NULL;
    while (*pp && *pp != e) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return;
    *pp = e->next;
    if (q->tail == e)
        q->tail = prev;
    e->next = NULL;
}

static inline void tp_ux_free(tp_ux_t *e)
{
    free(e->req.buf);
    free(e);
}

/* Hand e's message to r (a receive of its channel) and free e: the copy, or r's
 * mismatch (another length or envelope: the stream stays in step, the buffer was read
 * whole), or e's own failure. */
static inline void tp_ux_deliver(tp_ux_t *e, tp_req_t *r)
{
    memcpy(r->got_env, e->req.env, sizeof(r->got_env));
    r->got_len = e->req.len;
    if (e->req.status < 0) {
        r->status = e->req.status;
    } else if (r->len != e->req.len || memcmp(r->env, e->req.env, sizeof(r->env))) {
        r->status = TUTTI_ERR_MISMATCH;
    } else {
        if (r->len)
            memcpy(r->buf, e->req.buf, r->len);
        r->xfer = r->len;
        r->status = 0;
    }
    (*e->completions)++;
    tp_ux_unlink(e->owner, e);
    if (e->req.status < 0) { /* its transfer may not have ended: kept until the destroy */
        e->next = e->owner->dead;
        e->owner->dead = e;
        return;
    }
    tp_ux_free(e);
}

/* A buffering request completed (the transport's receive path, where its kind is
 * TP_KIND_UX): a receive waiting on it gets it now. */
static inline void tp_ux_arrived(tp_req_t *q)
{
    tp_ux_t *e = (tp_ux_t *)q;
    if (e->waiter)
        tp_ux_deliver(e, e->waiter);
}

/* post_recv's first look: is a buffered message (or one coming in) of r's key there
 * that no receive took yet? Then r takes it: done now, or waiting on it (1). 0: post r
 * as usual. */
static inline int tp_ux_post(tp_uxq_t *q, tp_req_t *r)
{
    uint64_t k = tp_key(r->env);
    for (tp_ux_t *e = q->head; e; e = e->next) {
        if (tp_key(e->req.env) != k || e->waiter)
            continue;
        if (e->req.status == 1)
            e->waiter = r;
        else
            tp_ux_deliver(e, r);
        return 1;
    }
    return 0;
}

/* The receive that takes the message at the head of the stream (envelope env, len
 * bytes) when the receive at the queue's head has another key: the first of its own
 * key, moved to the head; else a buffering request of the link's own, pushed at the
 * head (its env the message's, so that it matches). NULL: out of memory, or past
 * tp_ux_max. */
static inline tp_req_t *tp_chan_take(tp_req_t **head, tp_req_t **tail, tp_uxq_t *q,
                                     unsigned long *completions, const uint64_t env[4],
                                     uint64_t len)
{
    uint64_t k = tp_key(env);
    tp_req_t *prev = NULL;
    for (tp_req_t *r = *head; r; prev = r, r = r->tp_private[0]) {
        if (r->kind == TP_KIND_UX || tp_key(r->env) != k)
            continue;
        if (prev) { /* to the head */
            prev->tp_private[0] = r->tp_private[0];
            if (*tail == r)
                *tail = prev;
            r->tp_private[0] = *head;
            *head = r;
        }
        return r;
    }
    if (len > tp_ux_max())
        return NULL;
    tp_ux_t *e = calloc(1, sizeof(*e));
    void *buf = e ? malloc(len ? (size_t)len : 1) : NULL;
    if (!buf) {
        free(e);
        return NULL;
    }
    e->req.kind = TP_KIND_UX;
    e->req.peer = -1;
    e->req.buf = buf;
    e->req.len = (size_t)len;
    memcpy(e->req.env, env, sizeof(e->req.env));
    e->req.status = 1;
    e->completions = completions;
    e->owner = q;
    q->made++;
    if (q->tail)
        q->tail->next = e;
    else
        q->head = e;
    q->tail = e;
    e->req.tp_private[0] = *head;
    *head = &e->req;
    if (!*tail)
        *tail = &e->req;
    return &e->req;
}

/* Defines rx_take_other(tp, L, env, len): tp_chan_take on link L (link_type, with
 * rq_head/rq_tail, ux, peer, addr) of tp (tp_type, with completions), failing the link
 * (its link_fail) when it cannot read the message aside. name: the transport, for the
 * message. */
#define TT_KIT_TAKE_OTHER_FN(tp_type, link_type, name)                                             \
    static tp_req_t *rx_take_other(tp_type *tp, link_type *L, const uint64_t env[4], uint64_t len) \
    {                                                                                              \
        tp_req_t *q = tp_chan_take(&L->rq_head, &L->rq_tail, &L->ux, &tp->completions, env, len);  \
        if (!q)                                                                                    \
            link_fail(L, TUTTI_ERR_NOMEM, 0,                                                       \
                      name ": cannot read aside a %llu-byte message from rank %d (%s) that "       \
                           "came while only receives of other tags or kinds waited (out of "       \
                           "memory, or more than half this host's memory)",                        \
                      (unsigned long long)len, L->peer, L->addr);                                  \
        return q;                                                                                  \
    }

/* Is env a message a probe for want looks for? want with bit 63 set: that key; else any
 * message of channel 1 (tp_probe_want). */
static inline int tp_wanted(const uint64_t env[4], uint64_t want)
{
    return (want >> 63) ? tp_key(env) == want : tp_chan(env) == 1;
}

/* A transport's cancel() on a link: take receive r back from its queue (head, tail) if no
 * message has matched it: 0 done; 1 when one has (it waits on a message read aside, it is
 * the head and head_busy says the head's message is coming in, or it is off the queue:
 * being read into by other means, or done). */
static inline int tp_rq_cancel(tp_req_t **head, tp_req_t **tail, const tp_uxq_t *q, tp_req_t *r,
                               int head_busy)
{
    for (const tp_ux_t *e = q->head; e; e = e->next)
        if (e->waiter == r)
            return 1;
    tp_req_t *prev = NULL;
    for (tp_req_t *x = *head; x; prev = x, x = x->tp_private[0]) {
        if (x != r)
            continue;
        if (!prev && head_busy)
            return 1;
        if (prev)
            prev->tp_private[0] = r->tp_private[0];
        else
            *head = r->tp_private[0];
        if (*tail == r)
            *tail = prev;
        r->tp_private[0] = NULL;
        return 0;
    }
    return 1;
}

/* Is a receive posted on the link (queued, or waiting on a buffered message) that takes
 * a message a probe for want looks for? */
static inline int tp_key_posted(const tp_req_t *head, const tp_uxq_t *q, uint64_t want)
{
    for (const tp_req_t *r = head; r; r = r->tp_private[0])
        if (r->kind != TP_KIND_UX && tp_wanted(r->env, want))
            return 1;
    for (const tp_ux_t *e = q->head; e; e = e->next)
        if (e->waiter && tp_wanted(e->req.env, want))
            return 1;
    return 0;
}

/* Does a receive wait on a buffered message? (The link is busy: a failure is news.) */
static inline int tp_ux_waiting(const tp_uxq_t *q)
{
    for (const tp_ux_t *e = q->head; e; e = e->next)
        if (e->waiter)
            return 1;
    return 0;
}

/* The link failed or its requests were cancelled: receives waiting on buffered messages
 * fail with status (the buffers stay until tp_ux_clear: the transport may still write
 * one). */
static inline void tp_ux_fail(tp_uxq_t *q, int status)
{
    for (tp_ux_t *e = q->head; e; e = e->next) {
        if (e->waiter) {
            e->waiter->status = status;
            (*e->completions)++;
            e->waiter = NULL;
        }
        if (e->req.status == 1)
            e->req.status = status;
    }
}

/* Free every buffered message (the transport's destroy). */
static inline void tp_ux_clear(tp_uxq_t *q)
{
    while (q->head) {
        tp_ux_t *e = q->head;
        q->head = e->next;
        tp_ux_free(e);
    }
    q->tail = NULL;
    while (q->dead) {
        tp_ux_t *e = q->dead;
        q->dead = e->next;
        tp_ux_free(e);
    }
}

#ifndef TT_KIT_ABI_V1
/* The key a probe looks for: found_p->env[3] on input where the host says it sets it
 * (TUTTI_TP_HOST_PROBE_KEY), else 0 (any message of channel 1). */
static inline uint64_t tp_probe_want(const tp_host_t *h, const tutti_tp_probe_t *found_p)
{
    return tutti_tp_host_has(h, features) && (h->features & TUTTI_TP_HOST_PROBE_KEY)
               ? found_p->env[3]
               : 0;
}

/* A message read aside that no receive waits on, of key want (tp_probe_want; 0: any of
 * channel 1), arrived whole: probe()'s answer on a link that failed after it came (its
 * sender sent it, then left). 1 with *found_p filled, else 0. */
static inline int tp_probe_ux_done(const tp_uxq_t *q, uint64_t want, tutti_tp_probe_t *found_p)
{
    for (const tp_ux_t *e = q->head; e; e = e->next) {
        if (e->waiter || e->req.status != 0 || !tp_wanted(e->req.env, want))
            continue;
        memcpy(found_p->env, e->req.env, sizeof(found_p->env));
        found_p->len = e->req.len;
        return 1;
    }
    return 0;
}

/* probe()'s answer on a link with channels. want: the env[3] looked for (tp_probe_want;
 * transport_v2.h): with bit 63 set, the next message of that key; else any
 * message of channel 1. It reports such a message that no posted receive will take: a
 * buffered one first, else the parked header (parked, env, len). 1 with *found_p
 * filled; 0 otherwise, and then *watch_p says whether progress() should return when a
 * header comes (nothing posted, nothing parked). *buffer_p = 1: a parked header of
 * another key stands in front with no receive for it: the caller buffers it
 * (tp_chan_take) so that the message behind it can be seen. */
static inline int tp_probe_chan(int parked, const tp_req_t *rq_head, const tp_uxq_t *q,
                                const uint64_t env[4], uint64_t len, uint64_t want, int *watch_p,
                                int *buffer_p, tutti_tp_probe_t *found_p)
{
    *watch_p = 0;
    *buffer_p = 0;
    /* a key: a receive of it posted takes its next message. Any (want 0, the library's
     * TUTTI_ANY_TAG): the first message that no posted receive takes, in arrival order,
     * passing over those of keys with receives posted */
    const int any = !(want >> 63);
    if (!any && tp_key_posted(rq_head, q, want))
        return 0;
    for (const tp_ux_t *e = q->head; e; e = e->next) {
        if (!tp_wanted(e->req.env, want) ||
            (any && (e->waiter || tp_key_posted(rq_head, q, tp_key(e->req.env)))))
            continue;
        memcpy(found_p->env, e->req.env, sizeof(found_p->env));
        found_p->len = e->req.len;
        return 1;
    }
    if (!parked) {
        *watch_p = !rq_head;
        return 0;
    }
    if (!tp_wanted(env, want)) {
        *buffer_p = !rq_head;
        return 0;
    }
    if (any && tp_key_posted(rq_head, q, tp_key(env)))
        return 0; /* its receive takes it as the link moves on */
    memcpy(found_p->env, env, sizeof(found_p->env));
    found_p->len = (size_t)len;
    return 1;
}
#endif

#endif
