/* The cost model's probe (TUTTI_COST_MODEL=probe): alpha, beta and gamma measured with
 * the communicator's own collectives, so it sits above the executor (cost.c, the model,
 * stays below it). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tutti/tutti.h>

#include "coll/cost.h"
#include "core/comm.h"
#include "reduce/reduce.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Every rank sends len bytes to the next rank and receives from the previous one, at
 * once: one step of a ring, with the contention every rank sending at once brings. */
static int shift(tutti_comm_t *comm, void *out, void *in, size_t len)
{
    int r = comm->rank, p = comm->nranks;
    tutti_work_t *ws = NULL, *wr = NULL;
    int st = tutti_recv_async(comm, in, len, TUTTI_UINT8, (r + p - 1) % p, 0x7c057, &wr);
    if (st == TUTTI_OK)
        st = tutti_send_async(comm, out, len, TUTTI_UINT8, (r + 1) % p, 0x7c057, &ws);
    int st2 = wr ? tutti_wait(wr, -1) : TUTTI_OK;
    int st3 = ws ? tutti_wait(ws, -1) : TUTTI_OK;
    tutti_work_free(wr);
    tutti_work_free(ws);
    return st < 0 ? st : st2 < 0 ? st2 : st3;
}

int tt_cost_probe(tutti_comm_t *comm, tt_cost_t *c)
{
    const size_t big = (size_t)1 << 20;
    const int small_reps = 20, big_reps = 3;
    char *a = malloc(big), *b = malloc(big), *d = malloc(big);
    if (!a || !b || !d) {
        free(a);
        free(b);
        free(d);
        return TUTTI_ERR_NOMEM;
    }
    memset(a, 1, big);
    memset(b, 2, big);
    memset(d, 0, big);
    int st = TUTTI_OK;
    double v[3] = { 0, 0, 0 };
    /* alpha: the dissemination barrier is ceil(log2 p) rounds of empty messages, on the
     * collectives' own path (point-to-point calls add a queue hop) */
    int p = comm->nranks, rounds = 0;
    while ((1 << rounds) < p)
        rounds++;
    for (int i = 0; i < 3 && st == TUTTI_OK; i++) /* warm up */
        st = tutti_barrier(comm);
    double t0 = now_us();
    for (int i = 0; i < small_reps && st == TUTTI_OK; i++)
        st = tutti_barrier(comm);
    double alpha = (now_us() - t0) / small_reps / rounds;
    if (st == TUTTI_OK)
        st = shift(comm, a, b, big);
    t0 = now_us();
    for (int i = 0; i < big_reps && st == TUTTI_OK; i++)
        st = shift(comm, a, b, big);
    double tbig = (now_us() - t0) / big_reps;
    /* gamma: fp32 sum of two vectors into a third, best of a few */
    double tred = HUGE_VAL;
    for (int i = 0; i < 4; i++) {
        double t = now_us();
        tt_reduce3(d, a, b, big / 4, TUTTI_FP32, TUTTI_SUM);
        t = now_us() - t;
        tred = t < tred ? t : tred;
    }
    if (st == TUTTI_OK) {
        /* everyone must pick the same algorithms: average the measurements */
        v[0] = alpha;
        v[1] = (tbig - alpha) * 1e3 / (double)big;
        v[2] = tred * 1e3 / (double)big;
        st = tutti_allreduce(comm, TUTTI_IN_PLACE, v, 3, TUTTI_FP64, TUTTI_AVG);
    }
    if (st == TUTTI_OK) {
        c->alpha_us = v[0] > 0.05 ? v[0] : 0.05;
        c->beta_ns = v[1] > 1e-3 ? v[1] : 1e-3;
        c->gamma_ns = v[2] > 1e-3 ? v[2] : 1e-3;
        snprintf(c->source, sizeof(c->source), "probe");
    }
    free(a);
    free(b);
    free(d);
    return st;
}
