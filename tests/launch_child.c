/* A rank for tests/test_launcher.sh: joins through tutti_comm_init_env (the variables
 * tutti-run sets), checks an allreduce against plain C, prints "rank R of W ok".
 *   launch_child [fail=K | fail-first=K | hang | until=FILE]
 * fail=K: rank K exits with status 3 after the first allreduce, while the others wait
 * in a second one (the launcher must stop them). fail-first=K: the same in the first
 * attempt only (TUTTI_RESTART_COUNT 0), then as without arguments. hang: every rank
 * sleeps. until=FILE: allreduces every 20 ms until a rank sees that FILE exists. The "ok" line names the
 * attempt: "rank R of W ok (restart N)" after one; under tutti-run --nnodes MIN:MAX,
 * "rank R of W ok (round N, restart M)". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tutti/tutti.h>

int main(int argc, char **argv)
{
    tutti_comm_t *comm = NULL;
    int st = tutti_comm_init_env(&comm, NULL);
    if (st != TUTTI_OK) {
        fprintf(stderr, "launch_child: init: %s\n", tutti_status_name(st));
        return 1;
    }
    int rank = tutti_comm_rank(comm), size = tutti_comm_size(comm);
    const char *lr = getenv("TUTTI_LOCAL_RANK");
    const char *lws = getenv("LOCAL_WORLD_SIZE"); /* elastic: ranks numbered by node */
    if (!lr || (lws ? rank % atoi(lws) : rank) != atoi(lr)) {
        fprintf(stderr, "rank %d: TUTTI_LOCAL_RANK %s\n", rank, lr ? lr : "unset");
        return 1;
    }
    int64_t x = rank + 1, y = 0;
    st = tutti_allreduce(comm, &x, &y, 1, TUTTI_INT64, TUTTI_SUM);
    if (st != TUTTI_OK || y != (int64_t)size * (size + 1) / 2) {
        fprintf(stderr, "rank %d: allreduce %s, sum %lld\n", rank, tutti_status_name(st),
                (long long)y);
        return 1;
    }
    const char *rc = getenv("TUTTI_RESTART_COUNT");
    int restart = rc ? atoi(rc) : 0;
    int fail_first = argc > 1 && !strncmp(argv[1], "fail-first=", 11) && restart == 0;
    if (argc > 1 && (!strncmp(argv[1], "fail=", 5) || fail_first)) {
        if (rank == atoi(strchr(argv[1], '=') + 1))
            _exit(3);
        tutti_allreduce(comm, &x, &y, 1, TUTTI_INT64, TUTTI_SUM);
        sleep(60); /* must be killed by the launcher well before */
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "hang"))
        sleep(60);
    /* until=FILE: the ranks stop together, once any of them saw FILE (the allreduce
     * carries, above 2^32, how many did) */
    const int64_t seen = (int64_t)1 << 32;
    for (int go = argc > 1 && !strncmp(argv[1], "until=", 6); go;) {
        usleep(20000);
        x = rank + 1 + (access(argv[1] + 6, F_OK) == 0 ? seen : 0);
        st = tutti_allreduce(comm, &x, &y, 1, TUTTI_INT64, TUTTI_SUM);
        if (st != TUTTI_OK || y % seen != (int64_t)size * (size + 1) / 2) {
            fprintf(stderr, "rank %d: allreduce %s: %s\n", rank, tutti_status_name(st),
                    tutti_comm_last_error(comm));
            return 1;
        }
        go = y < seen;
    }
    const char *round = getenv("TUTTI_ROUND");
    if (round)
        printf("rank %d of %d ok (round %s, restart %d)\n", rank, size, round, restart);
    else if (restart)
        printf("rank %d of %d ok (restart %d)\n", rank, size, restart);
    else
        printf("rank %d of %d ok\n", rank, size);
    tutti_comm_destroy(comm);
    return 0;
}
