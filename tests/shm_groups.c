/* Megatron-style process groups on one host, for test_shm_room.sh: the world, then four
 * splits (rank/2: pairs, rank%2, rank/4, rank%4), then a 1-element allreduce on each,
 * its sum checked (every rank adds 1: the group's size). Exit 0 when every call gave the
 * right sum; each group's transport is printed. Run by tutti-run -np N. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <tutti/tutti.h>

int main(void)
{
    tutti_comm_t *w, *g[4];
    if (tutti_comm_init_env(&w, NULL)) {
        fprintf(stderr, "init: %s\n", tutti_comm_last_error(NULL));
        return 1;
    }
    int rank = tutti_comm_rank(w), n = tutti_comm_size(w), bad = 0;
    int colors[4] = { rank / 2, rank % 2, rank / 4, rank % 4 };
    for (int i = 0; i < 4; i++)
        if (tutti_comm_split(w, colors[i], rank, &g[i])) {
            fprintf(stderr, "rank %d: split %d: %s\n", rank, i, tutti_comm_last_error(w));
            return 1;
        }
    int64_t one = 1, sum = 0;
    if (tutti_allreduce(w, &one, &sum, 1, TUTTI_INT64, TUTTI_SUM) || sum != n) {
        fprintf(stderr, "rank %d: world allreduce: %s\n", rank, tutti_comm_last_error(w));
        bad++;
    }
    for (int i = 0; i < 4; i++) {
        sum = 0;
        int st = tutti_allreduce(g[i], &one, &sum, 1, TUTTI_INT64, TUTTI_SUM);
        if (st || sum != tutti_comm_size(g[i])) {
            fprintf(stderr, "rank %d: group %d (%d ranks, %s): first allreduce: %s (sum %lld)\n",
                    rank, i, tutti_comm_size(g[i]), tutti_comm_transport(g[i]),
                    tutti_comm_last_error(g[i]), (long long)sum);
            bad++;
        }
    }
    printf("rank %d: %s: world %s, groups %s %s %s %s\n", rank, bad ? "FAILED" : "ok",
           tutti_comm_transport(w), tutti_comm_transport(g[0]), tutti_comm_transport(g[1]),
           tutti_comm_transport(g[2]), tutti_comm_transport(g[3]));
    for (int i = 0; i < 4; i++)
        tutti_comm_destroy(g[i]);
    tutti_comm_destroy(w);
    return bad != 0;
}
