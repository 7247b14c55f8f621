/* Decoding what an ibverbs peer wrote into this rank's memory, before any of it is
 * trusted: the immediate of every RDMA WRITE WITH IMMEDIATE, the header of a ring slot
 * and the error box, with the bounds the data path relies on. Pure (no verbs calls), so
 * that fuzz/fuzz_ib_wire.c runs the same code over arbitrary bytes. */
#ifndef IB_IB_WIRE_H
#define IB_IB_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ib.h"

typedef struct ib_imm {
    unsigned type;    /* IB_IMM_* */
    unsigned credits; /* slots of the peer's ring it freed for us */
    unsigned fins;    /* our ready-to-send messages it finished reading */
    int status;       /* IB_IMM_ERROR: its failure, always a TUTTI_ERR_* */
} ib_imm_t;

/* What the link knows, that an immediate must agree with. */
typedef struct ib_window {
    unsigned slots;   /* per ring, the same on both sides (checked at set-up) */
    unsigned credits; /* free slots of the peer's ring we hold */
    uint64_t unread;  /* slots of our ring the peer wrote and we have not taken */
} ib_window_t;

/* imm: a completion's immediate, in host order; with_imm: the completion is a write
 * with immediate that carried one. NULL with *m_p filled, or why it is garbage. A peer
 * cannot return more credits than we spent, nor write a slot without one. */
static inline const char *ib_imm_decode(uint32_t imm, int with_imm, const ib_window_t *w,
                                        ib_imm_t *m_p)
{
    ib_imm_t m = { imm >> 28, (imm >> 14) & IB_IMM_FIELD_MAX, imm & IB_IMM_FIELD_MAX, 0 };
    if (!with_imm)
        return "not a write with immediate";
    switch (m.type) {
    case IB_IMM_ERROR:
        m.status = -(int)m.fins; /* the low field holds -status */
        if (m.status >= 0 || m.status <= TUTTI_STATUS_LAST_)
            m.status = TUTTI_ERR_PEER;
        m.credits = m.fins = 0;
        break;
    case IB_IMM_DATA:
        if (w->unread >= w->slots)
            return "a slot written while the ring was full";
        /* fall through */
    case IB_IMM_CTRL:
    case IB_IMM_NOP:
        if (m.credits > w->slots - w->credits)
            return "more credits returned than were spent";
        break;
    default: return "unknown immediate type";
    }
    *m_p = m;
    return NULL;
}

/* Copies the header of a ring slot into *h_p and checks the copy (the peer may write the
 * slot again at any time, so only the copy may be used): 0, or -1 for garbage. An eager
 * payload fits its slot: IB_HDR_BYTES + len <= slot bytes when len <= eager_max. */
static inline int ib_slot_decode(const void *slot, size_t eager_max, ib_hdr_t *h_p)
{
    memcpy(h_p, slot, sizeof(*h_p));
    if (h_p->magic != IB_MAGIC || (h_p->kind != IB_MSG_EAGER && h_p->kind != IB_MSG_RTS))
        return -1;
    return h_p->kind == IB_MSG_EAGER && h_p->len > eager_max ? -1 : 0;
}

/* The peer's report from the error box (IB_ERRBOX_BYTES) as a string; byte_len: the
 * length its write said. */
static inline void ib_errbox_read(const char *box, uint32_t byte_len, char msg[IB_MAX_ERRMSG + 1])
{
    size_t n = byte_len < IB_MAX_ERRMSG ? byte_len : IB_MAX_ERRMSG;
    memcpy(msg, box, n);
    msg[n] = '\0';
}

/* A connection datagram of len bytes (after the GRH) for rank `rank` of nranks, job
 * instance hash inst, copied into *m_p and checked (the MAC is the caller's): NULL, or
 * why it is refused. The sender's port record names the sender and the job's size, and
 * its device name ends within the record. */
static inline const char *ib_ud_decode(const void *buf, size_t len, int rank, int nranks,
                                       uint64_t inst, ib_ud_msg_t *m_p)
{
    if (len < sizeof(*m_p))
        return "too short";
    memcpy(m_p, buf, sizeof(*m_p));
    const ib_ud_msg_t *m = m_p;
    if (m->magic != IB_UD_MAGIC ||
        (m->kind != IB_UD_REQ && m->kind != IB_UD_REP && m->kind != IB_UD_REJ))
        return "not a connection datagram";
    if (m->instance != inst)
        return "from another job instance";
    if (m->to != rank)
        return "addressed to another rank";
    if (m->from < 0 || m->from >= nranks || m->from == rank)
        return "from a rank out of range";
    if (m->port.magic != IB_LAZY_MAGIC || m->port.version != IB_VERSION ||
        m->port.rank != m->from || m->port.nranks != nranks)
        return "its port record is malformed or from another job size";
    if (!memchr(m->port.dev, '\0', sizeof(m->port.dev)))
        return "its device name is unterminated";
    if (m->auth > 1 || (m->kind == IB_UD_REJ && m->auth))
        return "unknown authentication flag";
    if (m->kind == IB_UD_REJ &&
        (m->qp.reserved < IB_REJ_PROOF || m->qp.reserved > IB_REJ_UNWANTED_PROOF))
        return "a refusal for an unknown reason";
    return NULL;
}

#endif /* IB_IB_WIRE_H */
