/* The ABI v1 shim: presents a plugin that exports only tutti_transport_v1() as a v2
 * table. A v2 request begins with v1's fields in v1's order, so requests pass through
 * as they are; the shim refuses what v1 cannot carry (memory other than host, a
 * stream) and gives v1 plugins default properties (remote-capable, no cost hints). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"
#include "plugin/transport.h"
#include "../../transports/kit/queue.h"

_Static_assert(offsetof(tutti_tp_req_v2_t, tp_private) == offsetof(tutti_tp_req_v1_t, tp_private),
               "a v2 request must begin with v1's fields");
_Static_assert(offsetof(tutti_tp_req_v2_t, mem) >= sizeof(tutti_tp_req_v1_t),
               "v2 fields follow v1's");

/* One shim instance: the v1 table and the v1 transport it created. */
typedef struct shim_tp {
    const tutti_transport_ops_v1_t *v1;
    void *tp;
} shim_tp_t;

/* create() receives no table, so each loaded v1 table gets a slot with its own create
 * trampoline; a few slots are plenty (v1 plugins are legacy). */
#define SHIM_SLOTS 4
typedef struct shim_slot {
    const tutti_transport_ops_v1_t *v1;
    void *handle;
    int refs;
    tutti_transport_ops_v2_t ops;
} shim_slot_t;

static shim_slot_t slots[SHIM_SLOTS];
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;

static int shim_create(int slot, const tutti_tp_host_v2_t *host, void **tp_p)
{
    shim_tp_t *s = calloc(1, sizeof(*s));
    if (!s)
        return TUTTI_ERR_NOMEM;
    s->v1 = slots[slot].v1;
    int st = s->v1->create(host, &s->tp);
    if (st < 0) {
        free(s);
        return st;
    }
    *tp_p = s;
    return TUTTI_OK;
}

#define SHIM_CREATE(i)                                                                             \
    static int shim_create_##i(const tutti_tp_host_v2_t *host, void **tp_p)                        \
    {                                                                                              \
        return shim_create(i, host, tp_p);                                                         \
    }
SHIM_CREATE(0)
SHIM_CREATE(1)
SHIM_CREATE(2)
SHIM_CREATE(3)
static int (*const shim_creates[SHIM_SLOTS])(const tutti_tp_host_v2_t *,
                                             void **) = { shim_create_0, shim_create_1,
                                                          shim_create_2, shim_create_3 };

static void shim_destroy(void *tp)
{
    shim_tp_t *s = tp;
    s->v1->destroy(s->tp);
    free(s);
}

static int shim_post(void *tp, tutti_tp_req_v2_t *req, int kind)
{
    shim_tp_t *s = tp;
    if (req && (req->mem != TUTTI_MEM_HOST || req->stream || req->mem_handle)) {
        req->status = TUTTI_ERR_UNSUPPORTED;
        return TUTTI_ERR_UNSUPPORTED;
    }
    tutti_tp_req_v1_t *r = (tutti_tp_req_v1_t *)req;
    return kind == TUTTI_TP_SEND ? s->v1->post_send(s->tp, r) : s->v1->post_recv(s->tp, r);
}

TT_KIT_SEND_RECV_FNS(shim)

static int shim_progress(void *tp, int timeout_ms)
{
    shim_tp_t *s = tp;
    return s->v1->progress(s->tp, timeout_ms);
}

static void shim_cancel_all(void *tp, int status)
{
    shim_tp_t *s = tp;
    s->v1->cancel_all(s->tp, status);
}

static void shim_notify_error(void *tp, int status, const char *msg)
{
    shim_tp_t *s = tp;
    s->v1->notify_error(s->tp, status, msg);
}

static void shim_abort(void *tp)
{
    shim_tp_t *s = tp;
    s->v1->abort(s->tp);
}

static const char *shim_peer_address(void *tp, int peer)
{
    shim_tp_t *s = tp;
    return s->v1->peer_address ? s->v1->peer_address(s->tp, peer) : NULL;
}

const tutti_transport_ops_v2_t *tt_transport_v1_wrap(const tutti_transport_ops_v1_t *v1,
                                                     void *handle, char *err, size_t errlen)
{
    const tutti_transport_ops_v2_t *ops = NULL;
    pthread_mutex_lock(&slots_lock);
    int free_slot = -1;
    for (int i = 0; i < SHIM_SLOTS && !ops; i++) {
        if (slots[i].refs && slots[i].v1 == v1) { /* the same plugin, loaded again */
            slots[i].refs++;
            ops = &slots[i].ops;
        } else if (!slots[i].refs && free_slot < 0) {
            free_slot = i;
        }
    }
    if (!ops && free_slot >= 0) {
        shim_slot_t *sl = &slots[free_slot];
        sl->v1 = v1;
        sl->handle = handle;
        sl->refs = 1;
        sl->ops = (tutti_transport_ops_v2_t){
            .size = sizeof(tutti_transport_ops_v2_t),
            .abi_version = TUTTI_TRANSPORT_ABI_V2,
            .name = v1->name,
            .props = { .flags = 0, .mem_kinds = TUTTI_MEM_BIT(TUTTI_MEM_HOST) },
            .create = shim_creates[free_slot],
            .destroy = shim_destroy,
            .post_send = shim_post_send,
            .post_recv = shim_post_recv,
            .progress = shim_progress,
            .cancel_all = shim_cancel_all,
            .notify_error = shim_notify_error,
            .abort = shim_abort,
            .peer_address = shim_peer_address,
            .probe = NULL, /* v1 cannot: TUTTI_ANY_SOURCE is refused over it */
        };
        ops = &sl->ops;
    }
    pthread_mutex_unlock(&slots_lock);
    if (!ops)
        snprintf(err, errlen,
                 "transport %s: ABI v1 plugin, but %d v1 plugins are loaded "
                 "already (the most this library runs at once)",
                 v1->name, SHIM_SLOTS);
    return ops;
}

void tt_transport_v1_release(void *handle)
{
    pthread_mutex_lock(&slots_lock);
    for (int i = 0; i < SHIM_SLOTS; i++)
        if (slots[i].refs && slots[i].handle == handle) {
            slots[i].refs--;
            break;
        }
    pthread_mutex_unlock(&slots_lock);
}
