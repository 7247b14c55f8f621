/* Fuzz target: the tcp transport's connection set-up as a peer's bytes drive it: the
 * hello (version 1 prefix, fixed part, job instance) and the verdicts, on an incoming
 * or an outgoing connection (tcp_setup_fuzz_input). The first input byte is the set-up:
 * bit 0 outgoing, bit 1 the job has a secret, bit 2 checksums on, bits 3-7 the largest
 * read (0: whole parts). This rank is 1 of 4, instance "job-1"; an outgoing connection
 * called rank 0. */
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_host.h"
#include "tcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Not an HMAC: the harness only needs answers that are deterministic and differ by
 * context and challenge (a peer that computes the same function passes). */
static int host_auth_answer(void *ctx, const char *context, const uint8_t challenge[32],
                            uint8_t answer[32])
{
    (void)ctx;
    size_t n = strlen(context);
    for (size_t i = 0; i < 32; i++)
        answer[i] = (uint8_t)(challenge[i] ^ (uint8_t)context[i % n] ^ (uint8_t)i);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    enum { NRANKS = 4 };
    tutti_tp_host_v1_t host = fuzz_host(1, NRANKS);
    host.instance = "job-1";
    host.auth_answer = host_auth_answer;
    tcp_link_t links[NRANKS];
    memset(links, 0, sizeof(links));
    for (int i = 0; i < NRANKS; i++)
        links[i].fd = -1;
    tcp_tp_t tp = {
        .host = &host,
        .rank = 1,
        .nranks = NRANKS,
        .links = links,
        .csum = (data[0] >> 2) & 1 ? TCP_CSUM_CRC32C : TCP_CSUM_NONE,
        .auth = (data[0] >> 1) & 1,
        .instance = "job-1",
    };
    tcp_setup_fuzz_input(&tp, data[0] & 1, 0, data + 1, size - 1, data[0] >> 3);
    return 0;
}
