/* Fuzz target: the redis store client's RESP reply parser (tt_store_redis_fuzz_input),
 * replies read one after another until one is refused. The first two input bytes say how
 * many of the rest are buffered before the parser starts; the others arrive by recv, so
 * replies split between the buffer and the socket are covered too. */
#include <stdint.h>
#include <stdlib.h>

#include "store/store_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 65536 + 2)
        return 0;
    size_t split = (size_t)data[0] << 8 | data[1];
    tt_store_redis_fuzz_input(data + 2, size - 2, split);
    return 0;
}
