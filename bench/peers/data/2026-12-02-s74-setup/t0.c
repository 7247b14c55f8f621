#include <stdio.h>
#include <tutti/tutti.h>
int main(void)
{
    tutti_comm_t *c;
    if (tutti_comm_init_env(&c, NULL))
        return 2;
    float x = 1;
    tutti_allreduce(c, TUTTI_IN_PLACE, &x, 1, TUTTI_FP32, TUTTI_SUM);
    if (!tutti_comm_rank(c))
        printf("sum %g\n", x);
    tutti_comm_destroy(c);
    return 0;
}
