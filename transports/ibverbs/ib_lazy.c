/* ibverbs: queue pairs connected at their first use (TUTTI_IB_CONNECT=lazy), as NCCL's
 * runtime connect. Design notes: docs/architecture.md, "The ibverbs transport".
 *
 * Set-up makes one unreliable-datagram (UD) queue pair, the connection QP, and publishes
 * ib/addr/<rank>: the port record and that QP's number and Q_Key. No RC queue pair, ring
 * or peer's record is made or read then. The first send or receive posted on a link
 * reads the peer's record, makes the link's RC QP (INIT, receives posted) and rings, and
 * sends REQ datagrams (its QP, PSN and ring) to the peer's connection QP until it hears
 * back, or the communicator's timeout passes. A rank that gets a REQ makes its QP for the
 * sender if it has none, takes it to RTS towards the sender's, and answers REP with its
 * own: a REP means "my QP can receive from yours", so the asking side connects and may
 * write at once, and tells the other with a first control write (hello_owed), before
 * which the answering side does not write (its writes would reach a QP not yet ready to
 * receive and wait for the retry timer). Each side has one QP per peer, so both asking at
 * once needs no rule: each connects to the other's one QP and answers; a REQ or REP for
 * a link already up is answered again (a lost datagram is resent) or dropped.
 *
 * A link waits (wanted, resending its REQ) until the peer's QP is known to receive: a
 * REP or a first write from it; so both asking at once with both REPs lost, or a REP not
 * sent for want of a send slot, ends in a REQ answered later, not a wait on each other.
 *
 * Datagrams carry the job instance (its hash is also the Q_Key: another job's are dropped
 * by the device) and, where the job has a secret, an HMAC of it over every field and the
 * link's nonce; one that fails is dropped and counted, and a REQ so refused is answered
 * REJ. A REJ cannot be authenticated (it may answer a rank with another secret): it
 * counts only if it echoes the nonce of this rank's own REQs on that link, so a REQ
 * forged in this rank's name does not fail its link. The REQ carries the sender's port
 * record, checked against the one the sender published (read once a link from the
 * store, also for the address handle of the answer), so without a secret a REQ still
 * cannot point a link at another port than the rank's own. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ib.h"
#include "ib_wire.h"
#include "../kit/util.h"

#define HOST tp->host
#define ERRF(st, peer, err, ...) HOST->error(HOST->ctx, (st), (peer), (err), __VA_ARGS__)
#define LOGF(lvl, ...) HOST->log(HOST->ctx, (lvl), __VA_ARGS__)

#define LAZY_ADDR_POLL_NS 20000000ull /* a peer's record not yet in the store: look again */
#define LAZY_RESEND_NS 20000000ull    /* the first REQ unanswered: resend, doubling */
#define LAZY_RESEND_MAX_NS 320000000ull

_Static_assert(sizeof(ib_ud_msg_t) + IB_UD_GRH <= IB_UD_SLOT, "a datagram fits its slot");
_Static_assert(sizeof(ib_ud_msg_t) <= 256, "a datagram fits the smallest path MTU");

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static char *ud_slot(const ib_tp_t *tp, unsigned i)
{
    return tp->ud_buf + (size_t)i * IB_UD_SLOT;
}

static int ud_post_recv(ib_tp_t *tp, unsigned i)
{
    struct ibv_sge sge = { .addr = (uint64_t)(uintptr_t)ud_slot(tp, i),
                           .length = IB_UD_SLOT,
                           .lkey = tp->ud_mr->lkey };
    struct ibv_recv_wr wr = { .wr_id = IB_UD_BIT | i, .sg_list = &sge, .num_sge = 1 }, *bad;
    return ibv_post_recv(tp->ud_qp, &wr, &bad);
}

/* What a datagram's MAC covers, as text (the instance and direction included, so a MAC
 * cannot be replayed for another pair or job). */
static int ud_context(const ib_tp_t *tp, const ib_ud_msg_t *m, char *buf, size_t len)
{
    char gid[33];
    for (int i = 0; i < 16; i++)
        snprintf(gid + 2 * i, 3, "%02x", m->port.gid[i]);
    int n = snprintf(buf, len,
                     "ib-%s %d->%d %s qpn %u psn %u ring %llx rkey %u lid %u gid %s mtu %u gidx %u "
                     "slots %u/%u ll %u dev %.31s rd %u",
                     m->kind == IB_UD_REQ   ? "req"
                     : m->kind == IB_UD_REP ? "rep"
                                            : "rej",
                     m->from, m->to, tp->instance, m->qp.qpn, m->qp.psn,
                     (unsigned long long)m->qp.ring_addr, m->qp.ring_rkey, m->port.lid, gid,
                     m->port.mtu, m->port.gid_index, m->port.slots, m->port.slot_bytes,
                     m->port.link_layer, m->port.dev, m->port.rd_atom);
    return n > 0 && (size_t)n < len ? 0 : -1; /* cut short: a field would go unproven */
}

int ib_lazy_setup(ib_tp_t *tp)
{
    tp->instance = "";
    if (tutti_tp_host_has(HOST, instance) && HOST->instance)
        tp->instance = HOST->instance;
    tp->inst_hash = fnv1a(tp->instance);
    /* a Q_Key of this job instance's (bit 31 clear: set, it is a privileged key) */
    tp->qkey = (uint32_t)(tp->inst_hash ^ (tp->inst_hash >> 32)) & 0x7fffffffu;
    tp->auth = 0;
    if (tutti_tp_host_has(HOST, auth_answer) && HOST->auth_answer) {
        uint8_t challenge[32] = { 0 }, answer[32];
        tp->auth = HOST->auth_answer(HOST->ctx, "ib-probe", challenge, answer) == TUTTI_OK;
    }
    size_t len = (size_t)(IB_UD_RQ + IB_UD_SQ) * IB_UD_SLOT;
    if (posix_memalign((void **)&tp->ud_buf, (size_t)sysconf(_SC_PAGESIZE), len))
        return ERRF(TUTTI_ERR_NOMEM, -1, 0, "ibverbs: out of memory for the connection QP");
    memset(tp->ud_buf, 0, len);
    if (!(tp->ud_mr = ibv_reg_mr(tp->pd, tp->ud_buf, len, IBV_ACCESS_LOCAL_WRITE)))
        return ERRF(TUTTI_ERR_NOMEM, -1, errno,
                    "ibverbs: cannot register the connection QP's %zu bytes (locked-memory "
                    "limit? see ulimit -l)",
                    len);
    struct ibv_qp_init_attr ia = {
        .send_cq = tp->cq,
        .recv_cq = tp->cq,
        .cap = { .max_send_wr = IB_UD_SQ,
                 .max_recv_wr = IB_UD_RQ,
                 .max_send_sge = 1,
                 .max_recv_sge = 1 },
        .qp_type = IBV_QPT_UD,
    };
    if (!(tp->ud_qp = ibv_create_qp(tp->pd, &ia)))
        return ERRF(TUTTI_ERR_NO_DEVICE, -1, errno,
                    "ibverbs: cannot create the connection (UD) queue pair on %s", tp->dev_name);
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = (uint8_t)tp->port, .qkey = tp->qkey
    };
    struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTR };
    struct ibv_qp_attr s = { .qp_state = IBV_QPS_RTS, .sq_psn = 0 };
    if (ibv_modify_qp(tp->ud_qp, &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) ||
        ibv_modify_qp(tp->ud_qp, &r, IBV_QP_STATE) ||
        ibv_modify_qp(tp->ud_qp, &s, IBV_QP_STATE | IBV_QP_SQ_PSN))
        return ERRF(TUTTI_ERR_NO_DEVICE, -1, errno,
                    "ibverbs: cannot bring the connection (UD) queue pair on %s to RTS",
                    tp->dev_name);
    for (unsigned i = 0; i < IB_UD_RQ; i++)
        if (ud_post_recv(tp, i))
            return ERRF(TUTTI_ERR_NO_DEVICE, -1, errno,
                        "ibverbs: posting the connection QP's receives failed");
    for (int i = 0; i < tp->nranks; i++)
        snprintf(tp->links[i].addr, sizeof(tp->links[i].addr), "not connected yet");

    struct {
        ib_addr_rec_t port;
        ib_ud_rec_t ud;
    } rec;
    memset(&rec, 0, sizeof(rec));
    ib_port_rec(tp, &rec.port);
    rec.ud = (ib_ud_rec_t){ .qpn = tp->ud_qp->qp_num, .qkey = tp->qkey };
    char key[64];
    snprintf(key, sizeof(key), "ib/addr/%d", tp->rank);
    if (HOST->store_set(HOST->ctx, key, &rec, sizeof(rec)) < 0)
        return ERRF(TUTTI_ERR_STORE, -1, 0, "ibverbs: cannot publish this rank's address");
    LOGF(TUTTI_LOG_INFO,
         "ibverbs: rank %d connects each queue pair at its first use (TUTTI_IB_CONNECT=lazy; "
         "connection QP 0x%x)",
         tp->rank, tp->ud_qp->qp_num);
    return TUTTI_OK;
}

/* The link failed, or is up and may write: nothing more to wait for. */
static void link_settled(ib_tp_t *tp, ib_link_t *L)
{
    if (L->wanted && (L->fail.status || (L->conn == IB_CONN_UP && L->peer_ready))) {
        L->wanted = 0;
        tp->lazy_waiting--;
    }
}

static void link_failed(ib_tp_t *tp, ib_link_t *L, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void link_failed(ib_tp_t *tp, ib_link_t *L, int status, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    tp->link_failed(L, status, msg);
    link_settled(tp, L);
}

/* Send a REQ, REP or REJ (reason: IB_REJ_*) to L's peer, with nonce (a REQ's and REP's
 * the link's own, a REJ's the refused REQ's); -1 when no send slot is free now (the
 * caller tries again: a REQ on its timer, a REP or REJ at the peer's next REQ). */
static int ud_send(ib_tp_t *tp, ib_link_t *L, int kind, unsigned reason, const uint8_t nonce[32])
{
    if (tp->ud_sq_busy >= IB_UD_SQ || !L->ah)
        return -1;
    unsigned slot = IB_UD_RQ + tp->ud_sent % IB_UD_SQ;
    ib_ud_msg_t *m = (ib_ud_msg_t *)ud_slot(tp, slot);
    memset(m, 0, sizeof(*m));
    *m = (ib_ud_msg_t){ .magic = IB_UD_MAGIC,
                        .kind = (uint16_t)kind,
                        .from = tp->rank,
                        .to = L->peer,
                        .instance = tp->inst_hash };
    memcpy(m->nonce, nonce, sizeof(m->nonce));
    if (kind == IB_UD_REJ)
        m->qp.reserved = reason;
    else
        m->qp = (ib_peer_rec_t){ .qpn = L->qp->qp_num,
                                 .psn = L->psn,
                                 .ring_addr = (uint64_t)(uintptr_t)L->ring,
                                 .ring_rkey = L->ring_mr->rkey };
    ib_port_rec(tp, &m->port);
    if (tp->auth && kind != IB_UD_REJ) {
        char ctx[1024];
        if (ud_context(tp, m, ctx, sizeof(ctx)) < 0 ||
            HOST->auth_answer(HOST->ctx, ctx, m->nonce, m->mac) != TUTTI_OK)
            return -1;
        m->auth = 1;
    }
    struct ibv_sge sge = { .addr = (uint64_t)(uintptr_t)m,
                           .length = (uint32_t)sizeof(*m),
                           .lkey = tp->ud_mr->lkey };
    struct ibv_send_wr wr = {
        .wr_id = IB_UD_BIT | slot,
        .sg_list = &sge,
        .num_sge = 1,
        .opcode = IBV_WR_SEND,
        .send_flags = IBV_SEND_SIGNALED,
        .wr.ud = { .ah = L->ah, .remote_qpn = L->ud.qpn, .remote_qkey = L->ud.qkey },
    }, *bad;
    if (ibv_post_send(tp->ud_qp, &wr, &bad))
        return -1;
    tp->ud_sent++;
    tp->ud_sq_busy++;
    return 0;
}

/* The address handle to L's peer's connection QP, from its port record. */
static int make_ah(ib_tp_t *tp, ib_link_t *L)
{
    if (L->ah)
        return TUTTI_OK;
    struct ibv_ah_attr a;
    ib_ah_attr(tp, &L->prec, &a);
    if (!(L->ah = ibv_create_ah(tp->pd, &a)))
        return errno ? errno : EINVAL;
    return TUTTI_OK;
}

/* Read the peer's record: 1 when L has it, 0 when it is not in the store yet, -1 when
 * the link failed. */
static int read_rec(ib_tp_t *tp, ib_link_t *L)
{
    if (L->have_rec)
        return 1;
    char key[64], why[512];
    snprintf(key, sizeof(key), "ib/addr/%d", L->peer);
    void *v = NULL;
    size_t vlen = 0;
    int st = HOST->store_get(HOST->ctx, key, &v, &vlen, 1);
    if (st < 0) {
        L->rec_status = st;
        return 0;
    }
    size_t want = sizeof(ib_addr_rec_t) + sizeof(ib_ud_rec_t);
    st = ib_check_peer_rec(tp, L->peer, v, vlen, want, why, sizeof(why));
    if (st == TUTTI_OK) {
        memcpy(&L->prec, v, sizeof(L->prec));
        memcpy(&L->ud, (const char *)v + sizeof(L->prec), sizeof(L->ud));
        L->prec.dev[sizeof(L->prec.dev) - 1] = '\0';
    }
    HOST->free_value(v);
    if (st < 0) {
        link_failed(tp, L, st, "%s", why);
        return -1;
    }
    int e = make_ah(tp, L);
    if (e) {
        link_failed(tp, L, TUTTI_ERR_NO_DEVICE,
                    "ibverbs: cannot make an address handle to rank %d's connection QP 0x%x on "
                    "%s (errno %d: %s)",
                    L->peer, L->ud.qpn, tp->dev_name, e, strerror(e));
        return -1;
    }
    L->have_rec = 1;
    return 1;
}

/* Make L's QP and rings (in INIT) and its nonce: 0, or -1 with the link failed. */
static int create(ib_tp_t *tp, ib_link_t *L)
{
    char why[512];
    int st = getentropy(L->nonce, sizeof(L->nonce)) == 0 ? TUTTI_OK : TUTTI_ERR_INTERNAL;
    if (st < 0)
        snprintf(why, sizeof(why), "ibverbs: no random bytes for a nonce (errno %d)", errno);
    else
        st = ib_link_create(tp, L, why, sizeof(why));
    if (st < 0) {
        link_failed(tp, L, st, "%s", why);
        return -1;
    }
    return 0;
}

/* One step of a link that waits: its record, its QP, its REQ (again), its deadline. */
static void step(ib_tp_t *tp, ib_link_t *L, uint64_t now)
{
    link_settled(tp, L);
    if (!L->wanted || now < L->next_try_ns)
        return;
    int got = read_rec(tp, L);
    if (got < 0)
        return;
    if (got == 0) {
        if (now >= L->deadline_ns)
            link_failed(tp, L, TUTTI_ERR_TIMEOUT,
                        "ibverbs: rank %d did not publish its address within %d ms (did it "
                        "start, with TUTTI_TRANSPORT=ibverbs? the last store read: %d)",
                        L->peer, HOST->timeout_ms, L->rec_status);
        else
            L->next_try_ns = now + LAZY_ADDR_POLL_NS;
        return;
    }
    if (L->conn == IB_CONN_NONE) {
        if (create(tp, L) < 0)
            return;
        L->conn = IB_CONN_ASKING;
        LOGF(TUTTI_LOG_TRACE, "ibverbs: asking rank %d to connect (QP 0x%x)", L->peer,
             L->qp->qp_num);
    }
    if (now >= L->deadline_ns) {
        link_failed(tp, L, TUTTI_ERR_TIMEOUT,
                    "ibverbs: rank %d did not answer %u connection requests within %d ms (to "
                    "its connection QP 0x%x on %s: did it exit, or is it stuck outside the "
                    "library?)",
                    L->peer, L->tries, HOST->timeout_ms, L->ud.qpn, L->prec.dev);
        return;
    }
    /* asking, or up and not yet told that the peer's QP receives: (again) */
    if (ud_send(tp, L, IB_UD_REQ, 0, L->nonce) == 0)
        L->tries++;
    uint64_t gap = LAZY_RESEND_NS << (L->tries < 5 ? L->tries : 5);
    L->next_try_ns = now + (gap < LAZY_RESEND_MAX_NS ? gap : LAZY_RESEND_MAX_NS);
    if (L->next_try_ns > L->deadline_ns)
        L->next_try_ns = L->deadline_ns;
}

void ib_lazy_need(ib_tp_t *tp, ib_link_t *L)
{
    if (!tp->lazy || (L->conn == IB_CONN_UP && L->peer_ready) || L->wanted || L->fail.status)
        return;
    uint64_t now = tp_now_ns();
    L->wanted = 1;
    tp->lazy_waiting++;
    L->deadline_ns = now + (uint64_t)(HOST->timeout_ms > 0 ? HOST->timeout_ms : 30000) * 1000000ull;
    /* up as the answering side: the asker's first write is due; ask only if it is late */
    L->next_try_ns = L->conn == IB_CONN_UP ? now + LAZY_RESEND_NS : 0;
    step(tp, L, now);
    if (L->wanted && L->next_try_ns < tp->lazy_next_ns)
        tp->lazy_next_ns = L->next_try_ns;
}

void ib_lazy_tick(ib_tp_t *tp)
{
    if (!tp->lazy_waiting)
        return;
    uint64_t now = tp_now_ns();
    if (now < tp->lazy_next_ns)
        return;
    uint64_t next = UINT64_MAX;
    for (int i = 0; i < tp->nranks && tp->lazy_waiting; i++) {
        ib_link_t *L = &tp->links[i];
        if (!L->wanted)
            continue;
        step(tp, L, now);
        if (L->wanted && L->next_try_ns < next)
            next = L->next_try_ns;
    }
    tp->lazy_next_ns = next;
}

int ib_lazy_sleep_ms(const ib_tp_t *tp)
{
    if (!tp->lazy_waiting)
        return -1;
    uint64_t now = tp_now_ns();
    if (tp->lazy_next_ns <= now)
        return 0;
    uint64_t ms = (tp->lazy_next_ns - now + 999999) / 1000000;
    return ms > 1000 ? 1000 : (int)ms;
}

/* Drop a datagram, saying why (the first few at warn, the rest at trace). */
static void drop(ib_tp_t *tp, int from, const char *why)
{
    tp->ud_dropped++;
    LOGF(tp->ud_dropped <= 8 ? TUTTI_LOG_WARN : TUTTI_LOG_TRACE,
         "ibverbs: a connection datagram (claiming rank %d) refused: %s", from, why);
}

/* Answer L's peer (its record, for the address handle, is read by then). */
static void answer(ib_tp_t *tp, ib_link_t *L)
{
    ud_send(tp, L, IB_UD_REP, 0, L->nonce);
}

/* Why a datagram from m->from is refused before anything is done with it, or NULL;
 * *reject_p: the IB_REJ_* to answer a REQ with (0: none). */
static const char *refuse(ib_tp_t *tp, const ib_ud_msg_t *m, unsigned *reject_p)
{
    *reject_p = 0;
    if (!tp->links[m->from].served)
        return "this rank reaches that one over another transport";
    if (m->kind == IB_UD_REJ)
        return NULL;
    if (m->auth != (uint16_t)tp->auth) {
        *reject_p = tp->auth ? IB_REJ_NO_PROOF : IB_REJ_UNWANTED_PROOF;
        return tp->auth ? "it carries no proof of the job secret, and this job has one"
                        : "it carries a proof of a job secret, and this rank has none";
    }
    if (tp->auth) {
        *reject_p = IB_REJ_PROOF;
        char ctx[1024];
        uint8_t want[32];
        if (ud_context(tp, m, ctx, sizeof(ctx)) < 0 ||
            HOST->auth_answer(HOST->ctx, ctx, m->nonce, want) != TUTTI_OK)
            return "cannot compute the job secret's proof";
        unsigned diff = 0;
        for (int i = 0; i < 32; i++)
            diff |= (unsigned)(want[i] ^ m->mac[i]);
        if (diff)
            return "a wrong proof of the job secret (another job's?)";
        *reject_p = 0;
    }
    return NULL;
}

/* A REJ from L's peer: fail the link if this rank asked and the REJ echoes its nonce. */
static void on_reject(ib_tp_t *tp, ib_link_t *L, const ib_ud_msg_t *m)
{
    unsigned reason = m->qp.reserved;
    if (!L->wanted || L->fail.status || L->conn == IB_CONN_NONE)
        return;
    if (memcmp(m->nonce, L->nonce, sizeof(L->nonce))) {
        drop(tp, L->peer, "a refusal of a request this rank did not send");
        return;
    }
    static const char *const why[] = {
        "",
        "it could not verify this rank's proof of the job secret (another secret?)",
        "this rank sent no proof of the job secret, and that rank has one",
        "this rank sent a proof of a job secret, and that rank has none",
    };
    link_failed(tp, L, TUTTI_ERR_AUTH,
                "ibverbs: rank %d (connection QP 0x%x on %s) refused this rank's connection "
                "request: %s; give every rank the same TUTTI_AUTH_TOKEN",
                L->peer, L->ud.qpn, L->prec.dev, why[reason <= 3 ? reason : 0]);
}

/* A REQ or REP from m->from, decoded. */
static void on_datagram(ib_tp_t *tp, const ib_ud_msg_t *m)
{
    ib_link_t *L = &tp->links[m->from];
    unsigned reject;
    const char *no = refuse(tp, m, &reject);
    if (no) {
        drop(tp, m->from, no);
        if (reject && m->kind == IB_UD_REQ && (L->have_rec || read_rec(tp, L) > 0))
            ud_send(tp, L, IB_UD_REJ, reject, m->nonce);
        return;
    }
    if (m->kind == IB_UD_REJ) {
        on_reject(tp, L, m);
        return;
    }
    if (L->fail.status)
        return;
    /* the port the sender published: the REQ must come from it, and the REP goes to it */
    if (read_rec(tp, L) <= 0)
        return; /* not there yet (the sender published it first) or the link failed */
    if (memcmp(m->port.gid, L->prec.gid, sizeof(L->prec.gid)) || m->port.lid != L->prec.lid ||
        strncmp(m->port.dev, L->prec.dev, sizeof(L->prec.dev))) {
        drop(tp, m->from, "its port is not the one that rank published");
        return;
    }
    if (L->conn == IB_CONN_UP) {
        if (m->qp.qpn != L->r_qpn) {
            drop(tp, m->from, "its queue pair is not the one this rank is connected to");
            return;
        }
        if (m->kind == IB_UD_REQ) {
            answer(tp, L); /* our REP was lost: again */
        } else if (!L->peer_ready) {
            L->peer_ready = 1; /* crossed REQs: it connected to ours too */
            L->hello_owed = 1;
        }
        link_settled(tp, L);
        return;
    }
    if (m->kind == IB_UD_REP && L->conn != IB_CONN_ASKING) {
        drop(tp, m->from, "an answer to a request this rank did not send");
        return;
    }
    char why[512];
    size_t rec_len = sizeof(ib_addr_rec_t) + sizeof(ib_ud_rec_t);
    int st = ib_check_peer_rec(tp, m->from, &m->port, rec_len, rec_len, why, sizeof(why));
    if (st < 0) {
        drop(tp, m->from, why);
        return;
    }
    if (L->conn == IB_CONN_NONE && create(tp, L) < 0)
        return;
    st = ib_link_connect(tp, L, &m->port, &m->qp, why, sizeof(why));
    if (st < 0) {
        link_failed(tp, L, st, "%s", why);
        return;
    }
    if (m->kind == IB_UD_REP) {
        L->peer_ready = 1; /* it can receive: write, and say we can */
        L->hello_owed = 1;
    }
    LOGF(TUTTI_LOG_INFO, "ibverbs: queue pair to rank %d (%s) connected at its first use (%s)",
         L->peer, L->addr, m->kind == IB_UD_REQ ? "it asked" : "it answered");
    if (m->kind == IB_UD_REQ)
        answer(tp, L);
    link_settled(tp, L);
}

void ib_lazy_wc(ib_tp_t *tp, const struct ibv_wc *wc)
{
    unsigned slot = (unsigned)(wc->wr_id & 0xffffu);
    if (slot >= IB_UD_RQ) { /* a send completed: its slot is free */
        if (tp->ud_sq_busy)
            tp->ud_sq_busy--;
        if (wc->status != IBV_WC_SUCCESS)
            LOGF(TUTTI_LOG_WARN, "ibverbs: a connection datagram was not sent: %s",
                 ibv_wc_status_str(wc->status));
        return;
    }
    if (wc->status == IBV_WC_SUCCESS && wc->byte_len > IB_UD_GRH) {
        ib_ud_msg_t m;
        const char *why = ib_ud_decode(ud_slot(tp, slot) + IB_UD_GRH, wc->byte_len - IB_UD_GRH,
                                       tp->rank, tp->nranks, tp->inst_hash, &m);
        if (why)
            drop(tp, -1, why);
        else
            on_datagram(tp, &m);
    } else if (wc->status != IBV_WC_WR_FLUSH_ERR || !tp->ud_flushed++) {
        LOGF(TUTTI_LOG_WARN,
             "ibverbs: a connection datagram's receive failed: %s (flushed: the connection QP "
             "is in the error state, and links not yet connected will time out)",
             ibv_wc_status_str(wc->status));
    }
    if (wc->status != IBV_WC_WR_FLUSH_ERR && ud_post_recv(tp, slot))
        LOGF(TUTTI_LOG_WARN, "ibverbs: reposting a connection QP receive failed (errno %d)", errno);
}

void ib_lazy_teardown(ib_tp_t *tp)
{
    if (tp->ud_qp) /* before the address handles its sends may name */
        ibv_destroy_qp(tp->ud_qp);
    for (int i = 0; tp->links && i < tp->nranks; i++)
        if (tp->links[i].ah) {
            ibv_destroy_ah(tp->links[i].ah);
            tp->links[i].ah = NULL;
        }
    if (tp->ud_mr)
        ibv_dereg_mr(tp->ud_mr);
    free(tp->ud_buf);
    tp->ud_qp = NULL;
    tp->ud_mr = NULL;
    tp->ud_buf = NULL;
}
