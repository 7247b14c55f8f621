#!/bin/bash
cd "$(git rev-parse --show-toplevel)" || exit 1
: "${MPI_BENCH:?mpi_bench.c built with mpicc.openmpi}"
out="${OUT:-/tmp/a2a-pull-ab}"; mkdir -p "$out"
for r in 1 2 3 4 5; do
  for v in auto 65536 vader; do
    f="$out/$v.r$r.txt"
    case $v in
      vader) timeout 120 mpirun.openmpi --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl vader,self --bind-to none -np 2 "$MPI_BENCH" --coll alltoall -b 256K -e 4M -f 4 -n 20 -w 3 -c --fresh --window > "$f" 2>&1 ;;
      *) TUTTI_TRANSPORT=shm TUTTI_SHM_CMA_HINT_BYTES="$v" timeout 120 build-rel/bench/tutti-bench -np 2 --coll alltoall -b 256K -e 4M -f 4 -n 20 -w 3 -c --fresh --window > "$f" 2>&1 ;;
    esac
  done
done
