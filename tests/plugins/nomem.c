/* A transport plugin whose create fails with TUTTI_ERR_NOMEM without a word through
 * host->error, as a transport's allocation failure may: the library must still say
 * why set-up failed (its status) instead of an empty cause. */
#include <stddef.h>

#include <tutti/transport_v2.h>

static int create_nomem(const tutti_tp_host_v2_t *host, void **tp_p)
{
    (void)host;
    *tp_p = NULL;
    return TUTTI_ERR_NOMEM;
}
static void destroy(void *tp)
{
    (void)tp;
}
static int post(void *tp, tutti_tp_req_v2_t *req)
{
    (void)tp;
    (void)req;
    return TUTTI_ERR_INTERNAL;
}
static int progress(void *tp, int timeout_ms)
{
    (void)tp;
    (void)timeout_ms;
    return TUTTI_ERR_INTERNAL;
}
static void cancel_all(void *tp, int status)
{
    (void)tp;
    (void)status;
}
static void notify_error(void *tp, int status, const char *msg)
{
    (void)tp;
    (void)status;
    (void)msg;
}

static const tutti_transport_ops_v2_t nomem_ops = {
    .size = sizeof(tutti_transport_ops_v2_t),
    .abi_version = TUTTI_TRANSPORT_ABI_V2,
    .name = "nomem",
    .props = { .mem_kinds = TUTTI_MEM_BIT(TUTTI_MEM_HOST) },
    .create = create_nomem,
    .destroy = destroy,
    .post_send = post,
    .post_recv = post,
    .progress = progress,
    .cancel_all = cancel_all,
    .notify_error = notify_error,
    .abort = destroy,
};

TUTTI_TRANSPORT_REGISTER_V2(nomem, nomem_ops)
