/* Request queues shared by the transports: FIFO lists of posted requests linked
 * through tp_private[0] (each transport keeps one per direction per peer). Header-only,
 * so a transport built as a plugin needs nothing from libtutti. */
#ifndef TUTTI_TP_QUEUE_H
#define TUTTI_TP_QUEUE_H

#include <tutti/transport_v1.h>

static inline void tp_req_pop(tutti_tp_req_v1_t **head, tutti_tp_req_v1_t **tail)
{
    tutti_tp_req_v1_t *r = *head;
    *head = r->tp_private[0];
    if (!*head)
        *tail = NULL;
    r->tp_private[0] = NULL;
}

static inline void tp_req_push(tutti_tp_req_v1_t **head, tutti_tp_req_v1_t **tail,
                               tutti_tp_req_v1_t *r)
{
    r->tp_private[0] = NULL;
    if (*tail)
        (*tail)->tp_private[0] = r;
    else
        *head = r;
    *tail = r;
}

/* Fail every queued request with status; returns how many. */
static inline unsigned tp_fail_queue(tutti_tp_req_v1_t **head, tutti_tp_req_v1_t **tail,
                                     int status)
{
    unsigned n = 0;
    while (*head) {
        tutti_tp_req_v1_t *r = *head;
        tp_req_pop(head, tail);
        r->status = status;
        n++;
    }
    return n;
}

#endif
