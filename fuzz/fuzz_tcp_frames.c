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
#include "tcp.h"

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
    fuzz_reqs_init(reqs, nreqs, data + 1);
    tcp_recv_fuzz_input(&host, data[0] & 1 ? TCP_CSUM_CRC32C : TCP_CSUM_NONE, data + 1 + 2 * nreqs,
                        size - 1 - 2 * nreqs, reqs, nreqs);
    fuzz_reqs_check_free(reqs, nreqs);
    return 0;
}
