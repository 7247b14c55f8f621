/* Fuzz target: the tcp transport's data path as a peer's bytes drive it: frame headers
 * (magic, type, length, envelope, header CRC), payloads into posted receives, payload
 * trailers, error frames, and a peer that closes mid-frame (tcp_recv_fuzz_input).
 * Input: byte 0 bit 0 checksums on, bits 1-2 receives posted - 1; then 2 bytes
 * (little-endian) per receive, its length; the rest is what the peer sent. Every
 * receive expects the envelope {1, 2, 3, 4}. This rank is 0 of 2. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_host.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    enum { MAX_REQS = 4 };
    if (size < 1)
        return 0;
    size_t nreqs = 1 + ((data[0] >> 1) & 3);
    if (size < 1 + 2 * nreqs)
        return 0;
    tutti_tp_host_v1_t host = fuzz_host(0, 2);
    tp_req_t reqs[MAX_REQS];
    memset(reqs, 0, sizeof(reqs));
    for (size_t i = 0; i < nreqs; i++) {
        reqs[i].peer = 1;
        reqs[i].len = (size_t)data[1 + 2 * i] | (size_t)data[2 + 2 * i] << 8;
        reqs[i].buf = reqs[i].len ? malloc(reqs[i].len) : NULL;
        for (int k = 0; k < 4; k++)
            reqs[i].env[k] = (uint64_t)k + 1;
    }
    tcp_recv_fuzz_input(&host, data[0] & 1 ? TCP_CSUM_CRC32C : TCP_CSUM_NONE, data + 1 + 2 * nreqs,
                        size - 1 - 2 * nreqs, reqs, nreqs);
    for (size_t i = 0; i < nreqs; i++)
        free(reqs[i].buf);
    return 0;
}
