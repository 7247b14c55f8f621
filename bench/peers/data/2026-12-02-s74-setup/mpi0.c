#include <mpi.h>
#include <stdio.h>
int main(int c, char **v)
{
    MPI_Init(&c, &v);
    float x = 1, y;
    MPI_Allreduce(&x, &y, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    int r;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    if (!r)
        printf("sum %g\n", y);
    MPI_Finalize();
    return 0;
}
