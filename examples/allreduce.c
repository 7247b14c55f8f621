/* A first tutti program: every rank sums a vector with the others, then rank 0
 * broadcasts a parameter block asynchronously, and every rank checks what it got.
 *
 *   tutti-run -np 4 ./allreduce          (local ranks; tutti-run sets TUTTI_RANK,
 *                                          TUTTI_WORLD_SIZE and TUTTI_STORE)
 *   torchrun-style: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT work as well.
 *
 * Exit status 0 when every value is right; otherwise the call's error is printed (which
 * op, which rank, which peer, why). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <tutti/tutti.h>

#define N 1000

static int fail(tutti_comm_t *comm, const char *what, int st)
{
    fprintf(stderr, "%s: %s (%s)\n", what, tutti_strerror(st),
            tutti_comm_last_error(comm)); /* comm NULL: why set-up failed */
    return 1;
}

int main(void)
{
    tutti_comm_t *comm;
    int st = tutti_comm_init_env(&comm, NULL); /* NULL: defaults and TUTTI_* variables */
    if (st != TUTTI_OK)
        return fail(NULL, "tutti_comm_init_env", st);
    const int rank = tutti_comm_rank(comm), size = tutti_comm_size(comm);

    /* allreduce in place: element i becomes the sum over ranks r of (r + 1) * i */
    float *grads = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++)
        grads[i] = (float)((rank + 1) * i);
    st = tutti_allreduce(comm, TUTTI_IN_PLACE, grads, N, TUTTI_FP32, TUTTI_SUM);
    if (st != TUTTI_OK)
        return fail(comm, "tutti_allreduce", st);
    int wrong = 0;
    const double factor = (double)size * (size + 1) / 2; /* 1 + 2 + ... + size */
    for (int i = 0; i < N; i++)
        wrong += fabs(grads[i] - factor * i) > 1e-3 * factor * i;

    /* broadcast from rank 0, asynchronously: other work may go on until the wait */
    double params[16];
    for (int i = 0; i < 16; i++)
        params[i] = rank == 0 ? 0.5 * i : -1.0;
    tutti_work_t *w;
    st = tutti_broadcast_async(comm, TUTTI_IN_PLACE, params, 16, TUTTI_FP64, 0, &w);
    if (st != TUTTI_OK)
        return fail(comm, "tutti_broadcast_async", st);
    st = tutti_wait(w, -1);
    if (st != TUTTI_OK) {
        fprintf(stderr, "broadcast: %s\n", tutti_work_error(w));
        return 1;
    }
    tutti_work_free(w);
    for (int i = 0; i < 16; i++)
        wrong += params[i] != 0.5 * i;

    printf("rank %d of %d: %s\n", rank, size, wrong ? "WRONG" : "ok");
    free(grads);
    tutti_comm_destroy(comm);
    return wrong != 0;
}
