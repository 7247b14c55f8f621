/* A transport plugin that claims an ABI version this library does not speak: the
 * loader must refuse it with a clear message instead of calling into it. */
#include <stddef.h>

#include <tutti/transport_v1.h>

static int never_called(const tutti_tp_host_v1_t *host, void **tp_p)
{
    (void)host;
    (void)tp_p;
    return TUTTI_ERR_INTERNAL;
}

static const tutti_transport_ops_v1_t badabi_ops = {
    .size = sizeof(tutti_transport_ops_v1_t),
    .abi_version = 99,
    .name = "badabi",
    .create = never_called,
};

TUTTI_TRANSPORT_REGISTER_V1(badabi, badabi_ops)
