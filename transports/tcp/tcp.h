/* TCP transport internals. The connection set-up runs on a libuv loop (concurrent
 * connects and accepts under one deadline); the data path moves bytes with
 * non-blocking sendmsg/recv straight into the caller's buffers, spinning briefly and
 * then blocking in the same libuv loop (uv_poll on every busy link, a timer for the
 * deadline, an async handle for abort). Only the ABI header and libuv are used. */
#ifndef TCP_TCP_H
#define TCP_TCP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include <tutti/transport_v1.h>

#define TCP_MAGIC 0x49545554u /* "TUTI" */
#define TCP_HELLO_MAGIC 0x4f4c4c48u
#define TCP_FRAME_DATA 1
#define TCP_FRAME_ERROR 2
#define TCP_MAX_ERRMSG 2048
/* receives up to this size come with their header in one recv() through a staging
 * buffer, instead of two */
#define TCP_STAGE_BYTES 4096

/* On the wire, little-endian hosts assumed (checked at set-up through the hello). */
typedef struct tcp_hdr {
    uint32_t magic;
    uint16_t type;
    uint16_t flags;
    uint64_t len;
    uint64_t env[4];
} tcp_hdr_t;

typedef struct tcp_hello {
    uint32_t magic;
    uint32_t version;
    int32_t rank;
    int32_t nranks;
} tcp_hello_t;

typedef struct tcp_tp tcp_tp_t;

typedef struct tcp_link {
    tcp_tp_t *tp;
    int peer;
    int fd;
    char addr[96];
    int failed;               /* 0 or a TUTTI_ERR_* */
    int report_pending;       /* failed while nothing was posted: tell the library when
                                 a request next uses the link */
    char fail_msg[TCP_MAX_ERRMSG + 256];
    int fail_errno;
    int tx_broken;            /* a send was cut mid-message: no more frames fit */
    /* send side: queue of requests, the head one possibly half sent */
    tutti_tp_req_v1_t *sq_head, *sq_tail;
    tcp_hdr_t shdr;
    size_t shdr_off;
    /* receive side */
    tutti_tp_req_v1_t *rq_head, *rq_tail;
    tcp_hdr_t rhdr;
    size_t rhdr_got;          /* == sizeof(rhdr): a header is parked, waiting */
    int rhdr_seen;            /* the complete header was validated */
    int rhdr_matched;         /* the parked header was matched to rq_head */
    char *stage;              /* header + small payload, read in one go */
    char *errbuf;             /* payload of an incoming error frame */
    size_t errgot;
    /* libuv watcher used when blocking */
    uv_poll_t poll;
    int poll_inited;
    int poll_active;
    int poll_events;
} tcp_link_t;

struct tcp_tp {
    const tutti_tp_host_v1_t *host;
    int rank, nranks;
    tcp_link_t *links;        /* nranks entries, links[rank] unused */
    uv_loop_t loop;
    uv_async_t wake;
    uv_timer_t timer;
    atomic_int aborted;
    unsigned long completions;
    int sockbuf;
};

/* tcp_setup.c */
int tcp_setup_connect(tcp_tp_t *tp);

#endif /* TCP_TCP_H */
