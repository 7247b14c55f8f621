/* A staging block of the communicator's pools (stage.h), apart so that the
 * communicator's state (state.h) can hold them without stage.h's functions. */
#ifndef TT_STAGE_TYPES_H
#define TT_STAGE_TYPES_H

#include <stddef.h>

/* p: the memory, len bytes; pin: the context it is pinned in, NULL where it is not */
typedef struct tt_stage_block {
    void *p;
    size_t len;
    void *pin;
    int pin_retried; /* pinning failed at its reuse too: not tried again (device.c) */
} tt_stage_block_t;

#endif /* TT_STAGE_TYPES_H */
