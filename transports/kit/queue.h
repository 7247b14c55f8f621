/* Transport kit: FIFO lists of posted requests linked through tp_private[0] (each
 * transport keeps one per direction per peer). */
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

#endif
