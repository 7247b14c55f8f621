/* Fuzz target: the shm transport's receive path as a peer process that writes into the
 * shared memory drives it: record headers (magic, type, flags, length, envelope, stamp;
 * the key is 0, so a record's stamp is its stream position), pull addresses, inline
 * payloads into posted receives, single-copy pulls, the published head (also one that
 * runs ahead of the ring), the broken/revoked flags and the failure report
 * (shm_recv_fuzz_input). The ring is ordinary memory laid out as a pair segment's.
 * Input: byte 0 bits 0-1 receives posted - 1, bit 2 the direction is broken, bit 3 pulls
 * revoked, bit 4 a report, bits 5-7 the step (64 << 2k bytes); byte 1 the start
 * position in lines; byte 2 bits 0-1 heads published - 1, bits 2-7 -status of the
 * report; then 2 bytes (little-endian) per head, its distance from the start, and per
 * receive, its length; the rest is the stream from the start on (the report's text too).
 * A pull address with bit 63 set is an offset into a buffer of this process (the
 * peer's buffer), else taken as it is. This rank is 0 of 2. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_host.h"
#include "shm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { RING = 4096, MAX_HEADS = 4, MAX_REQS = 4 };

/* what the peer pulls are served from: every offset, with any 2-byte length, fits */
static unsigned char peer_mem[RING + 65536];

typedef struct peer {
    shm_dir_t *dir;
    uint64_t heads[MAX_HEADS];
    size_t nheads, next;
    uint64_t max_head;
} peer_t;

/* The peer publishes its next head; 0 once it has none left. */
static int publish(void *ctx)
{
    peer_t *p = ctx;
    if (p->next == p->nheads)
        return 0;
    atomic_store(&p->dir->head, p->heads[p->next++]);
    return 1;
}

/* The ring holds the stream from start on; the pull addresses are made to point into
 * peer_mem. */
static void fill_ring(unsigned char *ring, uint64_t start, const uint8_t *s, size_t n)
{
    memset(ring, 0, RING);
    for (size_t i = 0; i < n && i < RING; i++)
        ring[(start + i) & (RING - 1)] = s[i];
    for (size_t off = 0; off < RING; off += SHM_LINE) {
        shm_hdr_t h;
        uint64_t addr;
        memcpy(&h, ring + off, sizeof(h));
        memcpy(&addr, ring + off + SHM_HDR_BYTES, sizeof(addr));
        if (h.type == SHM_REC_CMA && (addr >> 63)) {
            addr = (uint64_t)(uintptr_t)(peer_mem + (addr & (RING - 1)));
            memcpy(ring + off + SHM_HDR_BYTES, &addr, sizeof(addr));
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    size_t nreqs = 1 + (data[0] & 3), nheads = 1 + (data[2] & 3);
    size_t pre = 3 + 2 * nheads + 2 * nreqs;
    if (size < pre)
        return 0;
    uint64_t start = (uint64_t)data[1] * SHM_LINE;
    static shm_dir_t dir;
    memset(&dir, 0, sizeof(dir));
    atomic_store(&dir.head, start);
    atomic_store(&dir.tail, start);
    atomic_store(&dir.broken, (data[0] >> 2) & 1);
    atomic_store(&dir.revoked, (data[0] >> 3) & 1);
    if ((data[0] >> 4) & 1) {
        dir.err_status = -(int)(data[2] >> 2);
        memcpy(dir.err_msg, data + pre, size - pre < SHM_MAX_ERRMSG ? size - pre : SHM_MAX_ERRMSG);
        atomic_store(&dir.err_set, 1);
    }
    peer_t peer = { .dir = &dir, .nheads = nheads, .max_head = start };
    for (size_t i = 0; i < nheads; i++) {
        peer.heads[i] = start + ((uint64_t)data[3 + 2 * i] | (uint64_t)data[4 + 2 * i] << 8);
        if (peer.heads[i] > peer.max_head)
            peer.max_head = peer.heads[i];
    }
    unsigned char *ring = malloc(RING); /* exactly: ASan sees a read past it */
    if (!ring)
        return 0;
    fill_ring(ring, start, data + pre, size - pre);
    tutti_tp_host_v1_t host = fuzz_host(0, 2);
    tp_req_t reqs[MAX_REQS];
    fuzz_reqs_init(reqs, nreqs, data + 3 + 2 * nheads);
    size_t step = (size_t)SHM_LINE << (2 * (data[0] >> 5));
    int aside = shm_recv_fuzz_input(&host, &dir, ring, RING, step, start, reqs, nreqs, publish,
                                    &peer);
    /* nothing is consumed that was not published (by a head, or by a whole record's
     * stamp, which the stream holds for one ring at most), and the pulls acked are the
     * ones read (into the receives, or aside: kit/chan.h) */
    uint64_t tail = atomic_load(&dir.tail);
    if (tail < start || (tail > peer.max_head && tail - start > RING) ||
        atomic_load(&dir.acked) > nreqs + (size_t)(aside > 0 ? aside : 0))
        abort();
    fuzz_reqs_check_free(reqs, nreqs);
    free(ring);
    return 0;
}
