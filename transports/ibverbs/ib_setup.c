/* ibverbs transport: choosing the device, port and GID; creating the queue pairs and
 * rings; exchanging addresses through the store; teardown.
 *
 * Rank r publishes ib/addr/<r>: its port (LID, GID, MTU) and, for each peer p, the QP
 * number, PSN and receive ring (address, rkey) it set up for p. It reads each peer's
 * record, takes its QP for that peer through RTR to RTS, then publishes ib/ready/<r> and
 * waits for every peer's: a QP must not send before the peer's QP can receive, or the
 * packets would be dropped until the retry count runs out. Lazily (TUTTI_IB_CONNECT=lazy)
 * the record has no per-peer entries and ib_lazy.c makes each link at its first use. */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>

#include "ib.h"

#define HOST tp->host
#define ERRF(st, peer, err, ...) HOST->error(HOST->ctx, (st), (peer), (err), __VA_ARGS__)
#define LOGF(lvl, ...) HOST->log(HOST->ctx, (lvl), __VA_ARGS__)

static uint64_t now_ms(void)
{
    return tp_now_ns() / 1000000u;
}

const char *ib_mtu_str(enum ibv_mtu m)
{
    switch (m) {
    case IBV_MTU_256: return "256";
    case IBV_MTU_512: return "512";
    case IBV_MTU_1024: return "1024";
    case IBV_MTU_2048: return "2048";
    case IBV_MTU_4096: return "4096";
    default: return "?";
    }
}

static void gid_str(const union ibv_gid *g, char *buf, size_t len)
{
    if (!inet_ntop(AF_INET6, g->raw, buf, (socklen_t)len))
        snprintf(buf, len, "?");
}

static int gid_is_zero(const union ibv_gid *g)
{
    static const uint8_t zero[16];
    return !memcmp(g->raw, zero, 16);
}

static int gid_is_v4mapped(const union ibv_gid *g)
{
    static const uint8_t pfx[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
    return !memcmp(g->raw, pfx, 12);
}

/* GID by TUTTI_IB_GID_INDEX, or the best of the table: a RoCE v2 IPv4-mapped GID (routable
 * over UDP/IPv4, what rxe and most RoCE fabrics want), then any RoCE v2 one that is not
 * link-local, then any RoCE v2, then the first non-zero (InfiniBand: index 0). */
static int choose_gid(ib_tp_t *tp, const struct ibv_port_attr *pa)
{
    const char *spec = HOST->config(HOST->ctx, "IB_GID_INDEX");
    if (spec && *spec) {
        char *end;
        long idx = strtol(spec, &end, 10);
        if (*end || idx < 0 || idx >= pa->gid_tbl_len)
            return ERRF(TUTTI_ERR_CONFIG, -1, 0,
                        "ibverbs: TUTTI_IB_GID_INDEX=%s is not an index of %s port %d's GID "
                        "table (0..%d)",
                        spec, tp->dev_name, tp->port, pa->gid_tbl_len - 1);
        if (ibv_query_gid(tp->ctx, (uint8_t)tp->port, (int)idx, &tp->gid) || gid_is_zero(&tp->gid))
            return ERRF(TUTTI_ERR_CONFIG, -1, 0,
                        "ibverbs: TUTTI_IB_GID_INDEX=%s: %s port %d has no GID at that index", spec,
                        tp->dev_name, tp->port);
        tp->gid_index = (int)idx;
        return TUTTI_OK;
    }
    int best = -1, best_score = -1;
    for (int i = 0; i < pa->gid_tbl_len && i < 256; i++) {
        struct ibv_gid_entry ge;
        union ibv_gid g;
        int v2 = 0;
        if (ibv_query_gid_ex(tp->ctx, (uint32_t)tp->port, (uint32_t)i, &ge, 0) == 0) {
            memcpy(g.raw, ge.gid.raw, 16);
            v2 = ge.gid_type == IBV_GID_TYPE_ROCE_V2;
        } else if (ibv_query_gid(tp->ctx, (uint8_t)tp->port, i, &g) != 0) {
            continue;
        }
        if (gid_is_zero(&g))
            continue;
        int link_local = g.raw[0] == 0xfe && (g.raw[1] & 0xc0) == 0x80;
        int score = 1;
        if (v2)
            score = gid_is_v4mapped(&g) ? 4 : link_local ? 2 : 3;
        if (pa->link_layer != IBV_LINK_LAYER_ETHERNET)
            score = i == 0 ? 4 : 0; /* InfiniBand: the port GID */
        if (score > best_score) {
            best = i;
            best_score = score;
            tp->gid = g;
        }
    }
    if (best < 0) {
        if (pa->link_layer == IBV_LINK_LAYER_ETHERNET)
            return ERRF(TUTTI_ERR_NO_DEVICE, -1, 0,
                        "ibverbs: %s port %d has no GID (RoCE needs an IP address on its "
                        "network interface)",
                        tp->dev_name, tp->port);
        memset(&tp->gid, 0, sizeof(tp->gid));
        best = 0;
    }
    tp->gid_index = best;
    return TUTTI_OK;
}

static const char *port_state_str(enum ibv_port_state s)
{
    return ibv_port_state_str(s);
}

/* Open dev and take its first active port (want_port if not 0) into tp;
 * otherwise close it and say why in why. */
static void try_device(ib_tp_t *tp, struct ibv_device *dev, int want_port, char *why, size_t whylen)
{
    const char *name = ibv_get_device_name(dev);
    struct ibv_context *ctx = ibv_open_device(dev);
    if (!ctx) {
        snprintf(why, whylen, "cannot open %s: %s", name, strerror(errno));
        return;
    }
    struct ibv_device_attr da;
    if (ibv_query_device(ctx, &da)) {
        snprintf(why, whylen, "cannot query %s: %s", name, strerror(errno));
        ibv_close_device(ctx);
        return;
    }
    for (int p = 1; p <= da.phys_port_cnt; p++) {
        if (want_port && p != want_port)
            continue;
        struct ibv_port_attr pa;
        if (ibv_query_port(ctx, (uint8_t)p, &pa))
            continue;
        if (pa.state != IBV_PORT_ACTIVE) {
            snprintf(why, whylen, "%s port %d is %s", name, p, port_state_str(pa.state));
            continue;
        }
        tp->ctx = ctx;
        tp->port = p;
        break;
    }
    if (want_port && want_port > da.phys_port_cnt)
        snprintf(why, whylen, "%s has %d port(s), not %d", name, da.phys_port_cnt, want_port);
    if (!tp->ctx)
        ibv_close_device(ctx);
    else
        snprintf(tp->dev_name, sizeof(tp->dev_name), "%s", name);
}

/* Open the device and port to use: TUTTI_IB_DEV=name[:port], or the first active. */
static int open_port(ib_tp_t *tp)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n == 0) {
        int err = list ? 0 : errno;
        if (list)
            ibv_free_device_list(list);
        return ERRF(TUTTI_ERR_NO_DEVICE, -1, err,
                    "ibverbs: no ibverbs device on this host (libibverbs lists no RDMA "
                    "device: load a driver such as mlx5_ib or rdma_rxe, or pick another "
                    "transport)");
    }
    /* TUTTI_IB_DEV=name[:port] */
    const char *spec = HOST->config(HOST->ctx, "IB_DEV");
    char want[64] = "";
    int want_port = 0;
    if (spec && *spec) {
        snprintf(want, sizeof(want), "%s", spec);
        char *colon = strchr(want, ':');
        if (colon) {
            *colon = '\0';
            want_port = atoi(colon + 1);
            if (want_port <= 0) {
                ibv_free_device_list(list);
                return ERRF(TUTTI_ERR_CONFIG, -1, 0,
                            "ibverbs: TUTTI_IB_DEV=%s: the port after ':' must be a number "
                            "from 1",
                            spec);
            }
        }
    }
    char seen[256] = "", why[256] = "";
    for (int d = 0; d < n && !tp->ctx; d++) {
        const char *name = ibv_get_device_name(list[d]);
        size_t sl = strlen(seen);
        snprintf(seen + sl, sizeof(seen) - sl, "%s%s", sl ? ", " : "", name);
        if (want[0] && strcmp(want, name))
            continue;
        try_device(tp, list[d], want_port, why, sizeof(why));
    }
    ibv_free_device_list(list);
    if (!tp->ctx) {
        if (want[0] && !why[0])
            return ERRF(TUTTI_ERR_NO_DEVICE, -1, 0,
                        "ibverbs: no ibverbs device named %s (TUTTI_IB_DEV=%s; devices: %s)", want,
                        spec, seen);
        return ERRF(TUTTI_ERR_NO_DEVICE, -1, 0,
                    "ibverbs: no active ibverbs port%s%s (devices: %s; %s)", want[0] ? " on " : "",
                    want, seen, why[0] ? why : "none active");
    }
    return TUTTI_OK;
}

/* The device's and the port's attributes (*dax, *pa), and the limits and GID taken
 * from them. */
static int query_port(ib_tp_t *tp, struct ibv_device_attr_ex *dax, struct ibv_port_attr *pa)
{
    memset(dax, 0, sizeof(*dax));
    if (ibv_query_device_ex(tp->ctx, NULL, dax)) {
        memset(dax, 0, sizeof(*dax));
        if (ibv_query_device(tp->ctx, &dax->orig_attr))
            return ERRF(TUTTI_ERR_NO_DEVICE, -1, errno, "ibverbs: cannot query %s", tp->dev_name);
    }
    if (ibv_query_port(tp->ctx, (uint8_t)tp->port, pa))
        return ERRF(TUTTI_ERR_NO_DEVICE, -1, errno, "ibverbs: cannot query %s port %d",
                    tp->dev_name, tp->port);
    tp->lid = pa->lid;
    tp->mtu = pa->active_mtu;
    tp->link_layer = pa->link_layer;
    tp->max_msg = pa->max_msg_sz ? pa->max_msg_sz : (1u << 30);
    if (tp->max_msg > (4u << 20))
        tp->max_msg = 4u << 20; /* READ chunks: several in flight pipeline better */
    /* each within the device's and TUTTI_IB_MAX_RD_ATOMIC (in rd_init before this); a
     * queue pair's initiator depth is also within its peer's responder resources, which
     * the address record carries (ib_link_connect) */
    int cap = tp->rd_init;
    tp->rd_init = TT_KIT_MAX(1, TT_KIT_MIN(cap, dax->orig_attr.max_qp_init_rd_atom));
    tp->rd_resp = TT_KIT_MAX(1, TT_KIT_MIN(cap, dax->orig_attr.max_qp_rd_atom));
    return choose_gid(tp, pa);
}

/* The protection domain and the MR cache (TUTTI_IB_MR_CACHE, TUTTI_IB_MR_CACHE_BYTES,
 * on-demand paging where the device has it for RC). */
static int setup_mr_cache(ib_tp_t *tp, const struct ibv_device_attr_ex *dax)
{
    const char *mrc_mode = HOST->config(HOST->ctx, "IB_MR_CACHE");
    /* a size as every other (kit/util.h); not one: a warning, and the default */
    size_t limit = tp_knob_size(HOST, "IB_MR_CACHE_BYTES", (size_t)1 << 30);
    uint32_t rc_odp = IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SEND;
    int odp_ok = (dax->odp_caps.general_caps & IBV_ODP_SUPPORT) &&
                 (dax->odp_caps.per_transport_caps.rc_odp_caps & rc_odp) == rc_odp;

    if (!(tp->pd = ibv_alloc_pd(tp->ctx)))
        return ERRF(TUTTI_ERR_NO_DEVICE, -1, errno, "ibverbs: ibv_alloc_pd on %s failed",
                    tp->dev_name);
    char err[256];
    if (ib_mrc_init(&tp->mrc, tp->pd, mrc_mode, limit, odp_ok, err, sizeof(err)) < 0)
        return ERRF(TUTTI_ERR_CONFIG, -1, 0, "ibverbs: %s", err);
    return TUTTI_OK;
}

/* The completion channel, the one CQ and the queue depths of every link. */
static int setup_cq(ib_tp_t *tp, const struct ibv_device_attr_ex *dax)
{
    if (!(tp->chan = ibv_create_comp_channel(tp->ctx)))
        return ERRF(TUTTI_ERR_NO_DEVICE, -1, errno, "ibverbs: ibv_create_comp_channel on %s failed",
                    tp->dev_name);
    /* non-blocking, or draining its events would block with no timeout */
    int fl = fcntl(tp->chan->fd, F_GETFL);
    if (fl < 0 || fcntl(tp->chan->fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return ERRF(TUTTI_ERR_INTERNAL, -1, errno,
                    "ibverbs: cannot make the completion channel of %s non-blocking", tp->dev_name);

    /* one CQ for every QP: sized so it can hold every WR that can be outstanding */
    int served = 0;
    for (int i = 0; i < tp->nranks; i++)
        served += tutti_tp_host_serves(HOST, i);
    unsigned sq = 4 * tp->slots + 16, rq = 2 * tp->slots + 8;
    if (sq > (unsigned)dax->orig_attr.max_qp_wr)
        sq = (unsigned)dax->orig_attr.max_qp_wr;
    if (rq > (unsigned)dax->orig_attr.max_qp_wr)
        return ERRF(TUTTI_ERR_CONFIG, -1, 0,
                    "ibverbs: TUTTI_IB_SLOTS=%u needs %u receive WRs per QP; %s allows %d",
                    tp->slots, rq, tp->dev_name, dax->orig_attr.max_qp_wr);
    long cqe = (long)served * (long)(sq + rq) + 16;
    if (tp->lazy) /* and the connection QP's (ib_lazy.c) */
        cqe += IB_UD_RQ + IB_UD_SQ;
    if (cqe > dax->orig_attr.max_cqe)
        return ERRF(TUTTI_ERR_CONFIG, -1, 0,
                    "ibverbs: %d peers x %u work requests need a CQ of %ld entries; %s allows "
                    "%d (lower TUTTI_IB_SLOTS)",
                    served, sq + rq, cqe, tp->dev_name, dax->orig_attr.max_cqe);
    if (!(tp->cq = ibv_create_cq(tp->ctx, (int)cqe, NULL, tp->chan, 0)))
        return ERRF(TUTTI_ERR_NO_DEVICE, -1, errno,
                    "ibverbs: ibv_create_cq of %ld entries on %s failed", cqe, tp->dev_name);
    tp->cq_size = (int)cqe;
    for (int i = 0; i < tp->nranks; i++) {
        tp->links[i].sq_depth = sq;
        tp->links[i].rq_depth = rq;
    }
    return TUTTI_OK;
}

int ib_setup_device(ib_tp_t *tp)
{
    struct ibv_device_attr_ex dax;
    struct ibv_port_attr pa;
    int st = open_port(tp);
    if (st < 0 || (st = query_port(tp, &dax, &pa)) < 0 || (st = setup_mr_cache(tp, &dax)) < 0 ||
        (st = setup_cq(tp, &dax)) < 0)
        return st;
    tp->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (tp->wake_fd < 0)
        return ERRF(TUTTI_ERR_INTERNAL, -1, errno, "ibverbs: eventfd failed");
    /* arm()'s one descriptor for the two block() polls (without it arm() says
     * unsupported, and nothing else changes) */
    tp->arm_fd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = { .events = EPOLLIN };
    if (tp->arm_fd >= 0 && (epoll_ctl(tp->arm_fd, EPOLL_CTL_ADD, tp->chan->fd, &ev) < 0 ||
                            epoll_ctl(tp->arm_fd, EPOLL_CTL_ADD, tp->wake_fd, &ev) < 0)) {
        close(tp->arm_fd);
        tp->arm_fd = -1;
    }
    char gs[64];
    gid_str(&tp->gid, gs, sizeof(gs));
    LOGF(TUTTI_LOG_INFO,
         "ibverbs: %s port %d (%s, MTU %s), GID index %d %s, MR cache %s, %u slots of %zu "
         "bytes per peer",
         tp->dev_name, tp->port, pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB",
         ib_mtu_str(tp->mtu), tp->gid_index, gs, ib_mrc_mode_name(tp->mrc.mode), tp->slots,
         tp->slot_bytes);
    return TUTTI_OK;
}

static void *page_alloc(size_t len)
{
    void *p = NULL;
    if (posix_memalign(&p, (size_t)sysconf(_SC_PAGESIZE), len))
        return NULL;
    memset(p, 0, len);
    return p;
}

/* A reason into why (whylen bytes), errno's text after it; returns st. */
static int why_set(char *why, size_t whylen, int st, int err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int why_set(char *why, size_t whylen, int st, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
    if (err && n >= 0 && (size_t)n < whylen)
        snprintf(why + n, whylen - (size_t)n, " (errno %d: %s)", err, strerror(err));
    return st;
}
#define WHYF(st, err, ...) why_set(why, whylen, (st), (err), __VA_ARGS__)

int ib_link_create(ib_tp_t *tp, ib_link_t *L, char *why, size_t whylen)
{
    size_t ring_len = (size_t)tp->slots * tp->slot_bytes + IB_ERRBOX_BYTES;
    L->sqe = calloc(L->sq_depth, sizeof(ib_sqe_t));
    L->ring = page_alloc(ring_len);
    L->stage = page_alloc(ring_len);
    if (!L->sqe || !L->ring || !L->stage)
        return WHYF(TUTTI_ERR_NOMEM, 0, "ibverbs: out of memory for rank %d's rings", L->peer);
    L->ring_mr = ibv_reg_mr(tp->pd, L->ring, ring_len,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    L->stage_mr = L->ring_mr ? ibv_reg_mr(tp->pd, L->stage, ring_len, IBV_ACCESS_LOCAL_WRITE)
                             : NULL;
    if (!L->ring_mr || !L->stage_mr)
        return WHYF(TUTTI_ERR_NOMEM, errno,
                    "ibverbs: cannot register %zu-byte rings for rank %d (locked-memory "
                    "limit? see ulimit -l)",
                    ring_len, L->peer);
    struct ibv_qp_init_attr ia = {
        .send_cq = tp->cq,
        .recv_cq = tp->cq,
        .cap = { .max_send_wr = L->sq_depth,
                 .max_recv_wr = L->rq_depth,
                 .max_send_sge = 1,
                 .max_recv_sge = 1,
                 .max_inline_data = tp->max_inline },
        .qp_type = IBV_QPT_RC,
    };
    L->qp = ibv_create_qp(tp->pd, &ia);
    if (!L->qp && tp->max_inline) {
        tp->max_inline = 0;
        ia.cap.max_inline_data = 0;
        L->qp = ibv_create_qp(tp->pd, &ia);
    }
    if (!L->qp)
        return WHYF(TUTTI_ERR_NO_DEVICE, errno,
                    "ibverbs: cannot create a queue pair for rank %d on %s", L->peer, tp->dev_name);
    tp->max_inline = ia.cap.max_inline_data < tp->max_inline ? ia.cap.max_inline_data
                                                             : tp->max_inline;
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = (uint8_t)tp->port,
        .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                           IBV_ACCESS_LOCAL_WRITE,
    };
    if (ibv_modify_qp(L->qp, &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return WHYF(TUTTI_ERR_NO_DEVICE, errno,
                    "ibverbs: queue pair for rank %d: RESET -> INIT failed", L->peer);
    for (unsigned i = 0; i < L->rq_depth; i++) {
        struct ibv_recv_wr wr = { .wr_id = (1ull << 63) | (uint64_t)L->peer }, *bad;
        if (ibv_post_recv(L->qp, &wr, &bad))
            return WHYF(TUTTI_ERR_NO_DEVICE, errno, "ibverbs: posting receives for rank %d failed",
                        L->peer);
    }
    uint32_t r = 0;
    if (getentropy(&r, sizeof(r)) != 0)
        r = (uint32_t)getpid() * 2654435761u ^ (uint32_t)L->peer;
    L->psn = r & 0xffffff;
    L->credits = tp->slots;
    return TUTTI_OK;
}

void ib_ah_attr(const ib_tp_t *tp, const ib_addr_rec_t *rec, struct ibv_ah_attr *a)
{
    *a = (struct ibv_ah_attr){ .dlid = rec->lid, .sl = 0, .port_num = (uint8_t)tp->port };
    union ibv_gid g;
    memcpy(g.raw, rec->gid, 16);
    if (tp->link_layer == IBV_LINK_LAYER_ETHERNET || !gid_is_zero(&g)) {
        a->is_global = 1;
        a->grh.dgid = g;
        a->grh.sgid_index = (uint8_t)tp->gid_index;
        a->grh.hop_limit = 64;
    }
}

int ib_link_connect(ib_tp_t *tp, ib_link_t *L, const ib_addr_rec_t *rec, const ib_peer_rec_t *pr,
                    char *why, size_t whylen)
{
    L->r_ring = pr->ring_addr;
    L->r_rkey = pr->ring_rkey;
    union ibv_gid g;
    memcpy(g.raw, rec->gid, 16);
    char gs[64];
    gid_str(&g, gs, sizeof(gs));
    snprintf(L->addr, sizeof(L->addr), "%.31s gid %s qpn 0x%x", rec->dev, gs, pr->qpn);
    enum ibv_mtu mtu = tp->mtu < (enum ibv_mtu)rec->mtu ? tp->mtu : (enum ibv_mtu)rec->mtu;
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = mtu,
        .dest_qp_num = pr->qpn,
        .rq_psn = pr->psn,
        .max_dest_rd_atomic = (uint8_t)tp->rd_resp,
        .min_rnr_timer = 12,
    };
    ib_ah_attr(tp, rec, &a.ah_attr);
    if (ibv_modify_qp(L->qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return WHYF(TUTTI_ERR_NO_DEVICE, errno,
                    "ibverbs: queue pair to rank %d (%s): INIT -> RTR failed (GID index %d; "
                    "set TUTTI_IB_GID_INDEX?)",
                    L->peer, L->addr, tp->gid_index);
    struct ibv_qp_attr b = {
        .qp_state = IBV_QPS_RTS,
        .timeout = (uint8_t)tp->qp_timeout,
        /* 6, not 7: rdma_rxe takes retry_cnt 7 as "retry forever" (the spec's meaning
         * only for rnr_retry), and a dead peer would then never be noticed */
        .retry_cnt = 6,
        .rnr_retry = 7, /* infinite: a receiver that is slow to repost is not an error */
        .sq_psn = L->psn,
        .max_rd_atomic = (uint8_t)TT_KIT_MAX(1, TT_KIT_MIN(tp->rd_init, rec->rd_atom)),
    };
    if (ibv_modify_qp(L->qp, &b,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        return WHYF(TUTTI_ERR_NO_DEVICE, errno,
                    "ibverbs: queue pair to rank %d (%s): RTR -> RTS failed", L->peer, L->addr);
    L->r_qpn = pr->qpn;
    L->conn = IB_CONN_UP;
    L->last_heard_ns = tp_now_ns(); /* keep-alive counts from here */
    return TUTTI_OK;
}

int ib_check_peer_rec(ib_tp_t *tp, int i, const ib_addr_rec_t *pr, size_t vlen, size_t rec_len,
                      char *why, size_t whylen)
{
    uint32_t want = tp->lazy ? IB_LAZY_MAGIC : IB_ADDR_MAGIC;
    if (vlen >= sizeof(uint32_t) && pr->magic != want &&
        (pr->magic == IB_ADDR_MAGIC || pr->magic == IB_LAZY_MAGIC))
        return WHYF(TUTTI_ERR_CONFIG, 0,
                    "ibverbs: rank %d connects its queue pairs %s and rank %d %s: set "
                    "TUTTI_IB_CONNECT alike on every rank",
                    i, tp->lazy ? "at init (eager)" : "at their first use (lazy)", tp->rank,
                    tp->lazy ? "at their first use (lazy)" : "at init (eager)");
    if (vlen != rec_len || pr->magic != want || pr->version != IB_VERSION || pr->rank != i ||
        pr->nranks != tp->nranks)
        return WHYF(TUTTI_ERR_PROTOCOL, 0,
                    "ibverbs: rank %d published a malformed or incompatible address record "
                    "(%zu bytes)",
                    i, vlen);
    if (pr->slots != tp->slots || pr->slot_bytes != tp->slot_bytes)
        return WHYF(TUTTI_ERR_CONFIG, 0,
                    "ibverbs: rank %d uses %u ring slots of %u bytes, this rank %u of %zu: "
                    "TUTTI_IB_SLOTS and TUTTI_IB_EAGER_BYTES must agree on every rank",
                    i, pr->slots, pr->slot_bytes, tp->slots, tp->slot_bytes);
    if (pr->link_layer != tp->link_layer)
        return WHYF(TUTTI_ERR_CONFIG, 0,
                    "ibverbs: rank %d is on %s, this rank on %s: the link layers differ", i,
                    pr->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
                    tp->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand");
    return TUTTI_OK;
}

void ib_port_rec(const ib_tp_t *tp, ib_addr_rec_t *rec)
{
    *rec = (ib_addr_rec_t){ .magic = tp->lazy ? IB_LAZY_MAGIC : IB_ADDR_MAGIC,
                            .version = IB_VERSION,
                            .rank = tp->rank,
                            .nranks = tp->nranks,
                            .slots = tp->slots,
                            .slot_bytes = (uint32_t)tp->slot_bytes,
                            .lid = tp->lid,
                            .mtu = (uint8_t)tp->mtu,
                            .link_layer = tp->link_layer,
                            .gid_index = (uint32_t)tp->gid_index,
                            .rd_atom = (uint8_t)tp->rd_resp };
    memcpy(rec->gid, tp->gid.raw, 16);
    snprintf(rec->dev, sizeof(rec->dev), "%s", tp->dev_name);
}

int ib_setup_links(ib_tp_t *tp)
{
    const int n = tp->nranks;
    uint64_t deadline = now_ms() + (uint64_t)(HOST->timeout_ms > 0 ? HOST->timeout_ms : 30000);
    size_t rec_len = sizeof(ib_addr_rec_t) + (size_t)n * sizeof(ib_peer_rec_t);
    char *mine = calloc(1, rec_len);
    if (!mine)
        return ERRF(TUTTI_ERR_NOMEM, -1, 0, "ibverbs: out of memory");
    ib_addr_rec_t *rec = (ib_addr_rec_t *)mine;
    ib_peer_rec_t *prs = (ib_peer_rec_t *)(mine + sizeof(*rec));
    ib_port_rec(tp, rec);
    int st = TUTTI_OK;
    char why[512];
    for (int i = 0; i < n && st == TUTTI_OK; i++) {
        ib_link_t *L = &tp->links[i];
        if (!L->served)
            continue;
        st = ib_link_create(tp, L, why, sizeof(why));
        if (st < 0)
            ERRF(st, i, 0, "%s", why);
        if (st == TUTTI_OK)
            prs[i] = (ib_peer_rec_t){ .qpn = L->qp->qp_num,
                                      .psn = L->psn,
                                      .ring_addr = (uint64_t)(uintptr_t)L->ring,
                                      .ring_rkey = L->ring_mr->rkey };
    }
    char key[64];
    if (st == TUTTI_OK) {
        snprintf(key, sizeof(key), "ib/addr/%d", tp->rank);
        if (HOST->store_set(HOST->ctx, key, mine, rec_len) < 0)
            st = ERRF(TUTTI_ERR_STORE, -1, 0, "ibverbs: cannot publish this rank's address");
    }
    free(mine);
    for (int i = 0; i < n && st == TUTTI_OK; i++) {
        ib_link_t *L = &tp->links[i];
        if (!L->served)
            continue;
        snprintf(key, sizeof(key), "ib/addr/%d", i);
        void *v = NULL;
        size_t vlen = 0;
        uint64_t now = now_ms();
        int left = now < deadline ? (int)(deadline - now) : 1;
        if (HOST->store_get(HOST->ctx, key, &v, &vlen, left) < 0) {
            st = ERRF(TUTTI_ERR_TIMEOUT, i, 0,
                      "ibverbs: rank %d did not publish its address within %d ms (did it "
                      "start, with TUTTI_TRANSPORT=ibverbs?)",
                      i, HOST->timeout_ms);
            break;
        }
        const ib_addr_rec_t *pr = v;
        st = ib_check_peer_rec(tp, i, pr, vlen, rec_len, why, sizeof(why));
        if (st == TUTTI_OK) {
            const ib_peer_rec_t *mine_at_peer = (const ib_peer_rec_t *)((const char *)v +
                                                                        sizeof(ib_addr_rec_t)) +
                                                tp->rank;
            st = ib_link_connect(tp, L, pr, mine_at_peer, why, sizeof(why));
        }
        if (st < 0)
            ERRF(st, i, 0, "%s", why);
        HOST->free_value(v);
    }
    if (st == TUTTI_OK) {
        snprintf(key, sizeof(key), "ib/ready/%d", tp->rank);
        if (HOST->store_set(HOST->ctx, key, "1", 1) < 0)
            st = ERRF(TUTTI_ERR_STORE, -1, 0, "ibverbs: cannot publish readiness");
    }
    for (int i = 0; i < n && st == TUTTI_OK; i++) {
        if (!tp->links[i].served)
            continue;
        snprintf(key, sizeof(key), "ib/ready/%d", i);
        void *v = NULL;
        size_t vlen = 0;
        uint64_t now = now_ms();
        int left = now < deadline ? (int)(deadline - now) : 1;
        if (HOST->store_get(HOST->ctx, key, &v, &vlen, left) < 0)
            st = ERRF(TUTTI_ERR_TIMEOUT, i, 0,
                      "ibverbs: rank %d did not connect its queue pair within %d ms", i,
                      HOST->timeout_ms);
        else
            HOST->free_value(v);
    }
    for (int i = 0; i < n && st == TUTTI_OK; i++)
        tp->links[i].peer_ready = 1; /* every peer's QP can receive: it said so */
    return st;
}

void ib_teardown(ib_tp_t *tp)
{
    for (int i = 0; tp->links && i < tp->nranks; i++) {
        ib_link_t *L = &tp->links[i];
        if (L->qp)
            ibv_destroy_qp(L->qp);
        if (L->ring_mr)
            ibv_dereg_mr(L->ring_mr);
        if (L->stage_mr)
            ibv_dereg_mr(L->stage_mr);
        free(L->ring);
        free(L->stage);
        free(L->sqe);
    }
    ib_mrc_destroy(&tp->mrc); /* before the PD its registrations belong to */
    if (tp->cq) {
        if (tp->cq_unacked)
            ibv_ack_cq_events(tp->cq, tp->cq_unacked);
        ibv_destroy_cq(tp->cq);
    }
    if (tp->chan)
        ibv_destroy_comp_channel(tp->chan);
    if (tp->pd)
        ibv_dealloc_pd(tp->pd);
    if (tp->ctx)
        ibv_close_device(tp->ctx);
    if (tp->wake_fd >= 0)
        close(tp->wake_fd);
    if (tp->arm_fd >= 0)
        close(tp->arm_fd);
}
