/* Fuzz target: what the ibverbs transport decodes from a peer's writes before trusting
 * it (transports/ibverbs/ib_wire.h): immediates against the link's credit window, ring
 * slot headers and the error box. There is no device here: the target keeps the
 * counters ib.c keeps, and moves them as ib.c does on what the decoders accept.
 * Input: byte 0 the slots per ring - 2 (low 6 bits), byte 1 the eager bytes / 16; then
 * events: an opcode byte, then for 0-2: an immediate (4 bytes, big-endian as on the
 * wire; opcode 1 without the immediate flag, 2 also the error box's length, 2 bytes);
 * 3: this rank writes a slot (spends a credit); 4: the next slot, its header and payload
 * from the input; 5: the error box from the input; 6: a connection datagram (lazy
 * connect) to rank 1 of 4, a length byte then that many bytes, in a buffer of exactly
 * that size. */
#include <endian.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ib_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fuzz_link {
    ib_window_t w;
    uint64_t rx_arrived, rx_next;
    size_t eager_max, slot_bytes;
    char box[IB_ERRBOX_BYTES]; /* exactly: ASan sees a read past it */
} fuzz_link_t;

static size_t take(const uint8_t **p, const uint8_t *end, void *out, size_t n)
{
    size_t k = (size_t)(end - *p) < n ? (size_t)(end - *p) : n;
    memset(out, 0, n);
    memcpy(out, *p, k);
    *p += k;
    return k;
}

/* An immediate arrived: the bounds hold for whatever was accepted. */
static void on_imm(fuzz_link_t *L, uint32_t imm, int with_imm, uint16_t byte_len)
{
    ib_imm_t m;
    L->w.unread = L->rx_arrived - L->rx_next;
    if (ib_imm_decode(imm, with_imm, &L->w, &m))
        return;
    if (m.type == IB_IMM_ERROR) {
        char msg[IB_MAX_ERRMSG + 1];
        ib_errbox_read(L->box, byte_len, msg);
        if (m.status >= 0 || m.status <= TUTTI_STATUS_LAST_ || strlen(msg) > IB_MAX_ERRMSG)
            abort();
        return;
    }
    if (m.type == IB_IMM_DATA)
        L->rx_arrived++;
    L->w.credits += m.credits;
    if (L->w.credits > L->w.slots || L->rx_arrived - L->rx_next > L->w.slots ||
        m.fins > IB_IMM_FIELD_MAX)
        abort();
}

/* The next slot is taken: an eager payload is copied out of a slot of exactly slot_bytes
 * into a buffer of exactly its length, as link_recv does. */
static void on_slot(fuzz_link_t *L, const uint8_t **p, const uint8_t *end)
{
    if (L->rx_next == L->rx_arrived)
        return;
    char *slot = malloc(L->slot_bytes);
    if (!slot)
        return;
    memset(slot, 0, L->slot_bytes);
    take(p, end, slot, L->slot_bytes < 128 ? L->slot_bytes : 128);
    ib_hdr_t h;
    if (ib_slot_decode(slot, L->eager_max, &h) == 0) {
        if (h.kind == IB_MSG_EAGER) {
            char *buf = malloc(h.len ? h.len : 1);
            if (buf)
                memcpy(buf, slot + IB_HDR_BYTES, h.len);
            free(buf);
        }
        L->rx_next++;
    }
    free(slot);
}

#define FUZZ_INSTANCE 0x1122334455667788ull

/* A datagram as it lands after the GRH: what ib_ud_decode accepts is one the lazy
 * connect code may act on (rank 1 of 4, instance FUZZ_INSTANCE). */
static void on_datagram(const uint8_t **p, const uint8_t *end)
{
    uint8_t n = 0;
    take(p, end, &n, 1);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return;
    take(p, end, buf, n);
    ib_ud_msg_t m;
    if (!ib_ud_decode(buf, n, 1, 4, FUZZ_INSTANCE, &m)) {
        int rej = m.kind == IB_UD_REJ;
        if (n < sizeof(m) || m.to != 1 || m.from < 0 || m.from >= 4 || m.from == 1 ||
            m.instance != FUZZ_INSTANCE || m.port.rank != m.from || m.port.nranks != 4 ||
            !memchr(m.port.dev, '\0', sizeof(m.port.dev)) || m.auth > 1 || (rej && m.auth) ||
            (rej && (m.qp.reserved < IB_REJ_PROOF || m.qp.reserved > IB_REJ_UNWANTED_PROOF)) ||
            (!rej && m.kind != IB_UD_REQ && m.kind != IB_UD_REP))
            abort();
    }
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    static fuzz_link_t L;
    memset(&L, 0, sizeof(L));
    L.w.slots = 2 + (data[0] & 63);
    L.w.credits = L.w.slots;
    L.eager_max = (size_t)data[1] * 16;
    L.slot_bytes = (IB_HDR_BYTES + L.eager_max + 63) & ~(size_t)63; /* as ib_create */
    const uint8_t *p = data + 2, *end = data + size;
    while (p < end) {
        uint8_t op = *p++ % 7;
        uint32_t imm;
        uint16_t byte_len;
        if (op <= 2) {
            take(&p, end, &imm, 4);
            byte_len = 0;
            if (op == 2)
                take(&p, end, &byte_len, 2);
            on_imm(&L, be32toh(imm), op != 1, byte_len);
        } else if (op == 3) {
            L.w.credits -= L.w.credits > 0;
        } else if (op == 4) {
            on_slot(&L, &p, end);
        } else if (op == 5) {
            take(&p, end, L.box, 64);
        } else {
            on_datagram(&p, end);
        }
    }
    return 0;
}
