#!/bin/bash
# ab3.sh NP TRANSPORT ROUNDS MIN MAX FACTOR "gapflags" [coll]: arms new (this build), old (main before), ompi (OMPI=0: none)
cd /work/main
NP=$1; T=$2; R=$3; B=$4; E=$5; F=$6; G=$7; C=${8:-allreduce}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for r in $(seq $R); do
  timeout 600 build-rel/bench/tutti-bench -np $NP --transport $T --coll $C -b $B -e $E -f $F -n 30 --fresh $G 2>&1 | awk -v r=$r 'NF>10 && $1!~/#/{print r, "new", $1, $10, $16}'
  timeout 600 /tmp/s67/old/build-rel/bench/tutti-bench -np $NP --transport $T --coll $C -b $B -e $E -f $F -n 30 --fresh $G 2>&1 | awk -v r=$r 'NF>10 && $1!~/#/{print r, "old", $1, $10, $16}'
  [ "$T" = tcp ] && [ "${OMPI:-1}" != 0 ] && timeout 600 mpirun.openmpi --oversubscribe --mca pml ob1 --mca oob_tcp_if_include lo --bind-to none -np $NP --mca btl tcp,self --mca btl_tcp_if_include lo /tmp/mpib --coll $C -b $B -e $E -f $F -n 30 --fresh $G 2>&1 | awk -v r=$r 'NF>10 && $1!~/#/{print r, "ompi", $1, $10, $16}'
done
