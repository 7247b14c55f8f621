/* Point to point: send/recv around a ring (messages larger than the socket buffers),
 * and a send and a receive whose tags do not match failing as a mismatch; completion
 * callbacks on work handles (tutti_work_on_done). */
#include <check.h>
#include <stdatomic.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <tutti/tutti.h>

#include "harness.h"

static int rank_p2p(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    const size_t big = 1u << 20; /* 4 MiB of int32: more than the sockets buffer */
    int32_t *out = malloc(big * 4), *in = malloc(big * 4);
    FAIL_IF(!out || !in, "malloc");
    int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < big; i++)
            out[i] = (int32_t)(rank * 7919 + round * 31 + (int)i);
        memset(in, 0, big * 4);
        /* everybody sends first, then receives: would deadlock if a send held the queue */
        tutti_work_t *ws, *wr;
        FAIL_IF(tutti_send_async(comm, out, big, TUTTI_INT32, right, 7, &ws) != 0, "send");
        FAIL_IF(tutti_recv_async(comm, in, big, TUTTI_INT32, left, 7, &wr) != 0, "recv");
        FAIL_IF(tutti_wait(ws, -1) != 0, "send: %s", tutti_work_error(ws));
        FAIL_IF(tutti_wait(wr, -1) != 0, "recv: %s", tutti_work_error(wr));
        tutti_work_free(ws);
        tutti_work_free(wr);
        for (size_t i = 0; i < big; i++)
            FAIL_IF(in[i] != (int32_t)(left * 7919 + round * 31 + (int)i), "in[%zu]", i);
        /* interleaved with collectives, in the same order everywhere */
        int64_t x = rank, y = 0;
        FAIL_IF(tutti_allreduce(comm, &x, &y, 1, TUTTI_INT64, TUTTI_SUM) != 0, "allreduce: %s",
                tutti_comm_last_error(comm));
        FAIL_IF(y != (int64_t)nranks * (nranks - 1) / 2, "sum %lld", (long long)y);
    }
    /* blocking ping-pong between 0 and 1, small messages */
    if (rank < 2) {
        for (int k = 0; k < 100; k++) {
            double v = k + 0.5, got = 0;
            if (rank == 0) {
                FAIL_IF(tutti_send(comm, &v, 1, TUTTI_FP64, 1, (uint32_t)k) != 0, "send %d", k);
                FAIL_IF(tutti_recv(comm, &got, 1, TUTTI_FP64, 1, (uint32_t)k) != 0, "recv %d", k);
            } else {
                FAIL_IF(tutti_recv(comm, &got, 1, TUTTI_FP64, 0, (uint32_t)k) != 0, "recv %d", k);
                FAIL_IF(tutti_send(comm, &got, 1, TUTTI_FP64, 0, (uint32_t)k) != 0, "send %d", k);
            }
            FAIL_IF(got != v && rank == 0, "pong %d: %g", k, got);
        }
    }
    FAIL_IF(tutti_barrier(comm) != 0, "barrier: %s", tutti_comm_last_error(comm));
    /* bad arguments */
    FAIL_IF(tutti_send(comm, out, 1, TUTTI_INT32, rank, 0) != TUTTI_ERR_INVALID_ARG, "self");
    FAIL_IF(tutti_recv(comm, in, 1, TUTTI_INT32, nranks, 0) != TUTTI_ERR_INVALID_ARG, "range");
    FAIL_IF(!strstr(tutti_comm_last_error(comm), "peer"), "message: %s",
            tutti_comm_last_error(comm));
    free(out);
    free(in);
    return 0;
}

TH_EACH_TEST(point_to_point, 2, 4, rank_p2p, NULL, 60000)

static int rank_p2p_mismatch(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    (void)nranks;
    int32_t v[4] = { 1, 2, 3, 4 };
    int st;
    if (rank == 0)
        st = tutti_send(comm, v, 4, TUTTI_INT32, 1, 5);
    else
        st = tutti_recv(comm, v, 4, TUTTI_INT32, 0, 6);
    /* The receiver fails at once; an eager send may already be done, and its rank
     * learns at its next call, from the receiver's report. */
    if (rank == 0 && st == TUTTI_OK)
        st = tutti_barrier(comm);
    const char *msg = tutti_comm_last_error(comm);
    FAIL_IF(st != TUTTI_ERR_MISMATCH, "got %s: %s", tutti_status_name(st), msg);
    FAIL_IF(!strstr(msg, "tag 5") || !strstr(msg, "tag 6"), "message: %s", msg);
    return 0;
}

START_TEST(point_to_point_mismatch)
{
    double t0 = th_now_ms();
    ck_assert_int_eq(th_run_comm_timeout(2, rank_p2p_mismatch, NULL, 30000, 20000, 0, NULL), 0);
    ck_assert_msg(th_now_ms() - t0 < 10000, "took %.0f ms", th_now_ms() - t0);
}
END_TEST

struct cb_seen {
    atomic_int calls;
    int status;
    int64_t value_seen; /* the result as the callback found it in the buffer */
    const int64_t *buf;
};

static void on_done(void *arg, int status)
{
    struct cb_seen *c = arg;
    c->status = status;
    c->value_seen = c->buf ? *c->buf : 0;
    atomic_fetch_add(&c->calls, 1);
}

static int rank_callbacks(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    int64_t x = rank + 1, y = 0, want = (int64_t)nranks * (nranks + 1) / 2;
    struct cb_seen a = { .buf = &y }, b = { .buf = &y }, c = { 0 };
    tutti_work_t *w;
    /* set before completion (the peer holds it back), called once with the result */
    if (rank == 0)
        usleep(100000);
    FAIL_IF(tutti_allreduce_async(comm, &x, &y, 1, TUTTI_INT64, TUTTI_SUM, &w) != 0, "issue");
    FAIL_IF(tutti_work_on_done(w, on_done, &a) != 0, "on_done");
    FAIL_IF(tutti_work_on_done(w, on_done, &b) != TUTTI_ERR_INVALID_ARG, "second callback");
    FAIL_IF(tutti_wait(w, -1) != 0, "wait: %s", tutti_work_error(w));
    FAIL_IF(atomic_load(&a.calls) != 1 || a.status != 0, "calls %d status %d",
            atomic_load(&a.calls), a.status);
    FAIL_IF(a.value_seen != want, "callback saw %lld, want %lld", (long long)a.value_seen,
            (long long)want);
    /* set after completion: called at once, in this thread */
    FAIL_IF(tutti_work_on_done(w, on_done, &b) != TUTTI_ERR_INVALID_ARG, "after a callback");
    tutti_work_free(w);
    FAIL_IF(tutti_barrier_async(comm, &w) != 0 || tutti_wait(w, -1) != 0, "barrier");
    FAIL_IF(tutti_work_on_done(w, on_done, &c) != 0 || atomic_load(&c.calls) != 1, "late");
    tutti_work_free(w);
    /* a failed op reports its status: tags that do not match */
    struct cb_seen f = { 0 };
    int32_t v[2] = { 1, 2 };
    if (rank == 1) {
        FAIL_IF(tutti_recv_async(comm, v, 2, TUTTI_INT32, 0, 6, &w) != 0, "recv");
        FAIL_IF(tutti_work_on_done(w, on_done, &f) != 0, "on_done recv");
        FAIL_IF(tutti_wait(w, -1) != TUTTI_ERR_MISMATCH, "recv: %s", tutti_work_error(w));
        FAIL_IF(atomic_load(&f.calls) != 1 || f.status != TUTTI_ERR_MISMATCH, "failed op: %d %d",
                atomic_load(&f.calls), f.status);
        tutti_work_free(w);
    } else if (rank == 0) {
        tutti_send(comm, v, 2, TUTTI_INT32, 1, 5);
    }
    return 0;
}

START_TEST(work_callbacks)
{
    ck_assert_int_eq(th_run_comm_timeout(2, rank_callbacks, NULL, 30000, 20000, 0, NULL), 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("p2p");
    th_add_tests(s, "p2p", 90,
                 (const TTest *const[]){ point_to_point, point_to_point_mismatch, work_callbacks,
                                         NULL });
    return s;
}

int main(void)
{
    return th_main(suite());
}
