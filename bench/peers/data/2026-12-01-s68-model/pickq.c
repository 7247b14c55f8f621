/* pickq TP RANKS CPUS COLL BYTES...: the table model's pick per selection size */
#include "coll/cost.h"
#include "coll/algo.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv)
{
    int P = atoi(argv[2]), C = atoi(argv[3]);
    const char *names[] = { "allreduce", "broadcast",      "reduce",
                            "allgather", "reduce_scatter", "alltoall" };
    tt_coll_t colls[] = { TT_COLL_ALLREDUCE, TT_COLL_BROADCAST,      TT_COLL_REDUCE,
                          TT_COLL_ALLGATHER, TT_COLL_REDUCE_SCATTER, TT_COLL_ALLTOALL };
    tt_coll_t coll = TT_COLL_ALLREDUCE;
    for (int i = 0; i < 6; i++)
        if (!strcmp(argv[4], names[i]))
            coll = colls[i];
    tt_cost_t c;
    tt_cost_table(&c, argv[1]);
    c.host_ranks = P;
    c.host_cpus = C;
    int host_of[64] = { 0 };
    tt_cost_set_hosts(&c, host_of, P);
    for (int i = 5; i < argc; i++) {
        const tt_algo_t *a = tt_algo_select(NULL, &c, coll, (size_t)atoll(argv[i]), P,
                                            (size_t)1 << 20);
        printf("%s %s\n", argv[i], a ? a->name : "-");
    }
    return 0;
}
