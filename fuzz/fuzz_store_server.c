/* Fuzz target: the TCP store server's frame parser, hello/auth state machine and request
 * handling, fed one client's bytes (tt_store_server_fuzz_input). The first input byte is
 * the set-up: bit 0 makes the server require the job secret; the rest picks how the
 * bytes are cut into reads, so frames split across reads are covered too. */
#include <stdint.h>
#include <stdlib.h>

#include "store/store_impl.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* every refused client is a warning: silence them, the fuzzer prints what matters */
    setenv("TUTTI_DEBUG", "none", 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned b = data[0] >> 1;
    size_t chunk = b < 64 ? 0 : 1 + (b & 63); /* half the inputs: one read each */
    tt_store_server_fuzz_input(data + 1, size - 1, data[0] & 1, chunk);
    return 0;
}
