/* Transport kit: which ABI a transport's sources are built against. The built-in
 * transports and their plugins are ABI v2; defining TT_KIT_ABI_V1 builds the same
 * sources as a v1 plugin (the tests load one to check the loader's v1 shim). Every kit
 * header is header-only, so a plugin needs nothing from libtutti. */
#ifndef TT_KIT_ABI_H
#define TT_KIT_ABI_H

#ifdef TT_KIT_ABI_V1
#include <tutti/transport_v1.h>
typedef tutti_tp_req_v1_t tp_req_t;
typedef tutti_transport_ops_v1_t tp_ops_t;
#define TT_KIT_ABI TUTTI_TRANSPORT_ABI_V1
#define TT_KIT_PROPS(...) /* v1 tables have no properties */
#define TT_KIT_REGISTER TUTTI_TRANSPORT_REGISTER_V1
#define TT_KIT_REQ_SUPPORTED(r) 1
#define TT_KIT_PROBE(fn)  /* v1 tables have no probe: define fn only without TT_KIT_ABI_V1 */
#define TT_KIT_ARM(fn)    /* nor arm */
#define TT_KIT_CANCEL(fn) /* nor cancel */
#else
#include <tutti/transport_v2.h>
typedef tutti_tp_req_v2_t tp_req_t;
typedef tutti_transport_ops_v2_t tp_ops_t;
#define TT_KIT_ABI TUTTI_TRANSPORT_ABI_V2
#define TT_KIT_PROPS(...) , .props = { __VA_ARGS__ }
#define TT_KIT_REGISTER TUTTI_TRANSPORT_REGISTER_V2
/* the kit's transports move host memory only, and order nothing after a stream */
#define TT_KIT_REQ_SUPPORTED(r) ((r)->mem == TUTTI_MEM_HOST && !(r)->stream)
/* the optional probe slot, after TT_KIT_OPS_FNS */
#define TT_KIT_PROBE(fn) , .probe = (fn)
/* the optional arm slot, after TT_KIT_PROBE */
#define TT_KIT_ARM(fn) , .arm = (fn)
/* the optional cancel slot, after TT_KIT_ARM */
#define TT_KIT_CANCEL(fn) , .cancel = (fn)
#endif
typedef tutti_tp_host_v1_t tp_host_t;

/* The start of an ops table: size, ABI version, name, and (v2) properties, e.g.
 * TT_KIT_OPS_HEAD("tcp", .mem_kinds = TUTTI_MEM_BIT(TUTTI_MEM_HOST), .alpha_us = 10). */
#define TT_KIT_OPS_HEAD(nm, ...)                                                                   \
    .size = sizeof(tp_ops_t), .abi_version = TT_KIT_ABI, .name = (nm)TT_KIT_PROPS(__VA_ARGS__)

/* The rest of a tp_ops_t whose entry points are named pfx##_create, pfx##_destroy, ... */
#define TT_KIT_OPS_FNS(pfx)                                                                        \
    .create = pfx##_create, .destroy = pfx##_destroy, .post_send = pfx##_post_send,                \
    .post_recv = pfx##_post_recv, .progress = pfx##_progress, .cancel_all = pfx##_cancel_all,      \
    .notify_error = pfx##_notify_error, .abort = pfx##_abort, .peer_address = pfx##_peer_address

#endif
