#!/usr/bin/env bash
# Ranks started by the MPI launchers, joining through tutti_comm_init_env with no tutti
# variable set (run.sh installs openmpi-bin and mpich; a launcher that is missing is
# skipped, both missing: exit 77):
#   1. Open MPI's mpirun, 3 ranks on this host: rank and size from OMPI_COMM_WORLD_*, the
#      store on loopback at a port from mpirun's job id; allreduce, broadcast and
#      allgather checked (tutti-bench -c exits 1 on a wrong value). Twice at once: two
#      jobs, two ports, neither sees the other.
#   2. MPICH's mpiexec, 3 ranks: PMI_RANK/PMI_SIZE; it gives no job id, so without
#      TUTTI_STORE every rank fails at once saying what to set; with TUTTI_JOB_ID, or
#      with TUTTI_STORE, the job runs and its results are right.
# Every wait is bounded (timeout -k), and each launcher takes its ranks down with it.
#
#   tests/test_mpirun.sh BUILD/bench/tutti-bench
set -u
bench=$(realpath "$1")
work=$(mktemp -d)
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
fail() {
    echo "test_mpirun: FAIL: $*"
    exit 1
}
# nothing of the caller's job: the launchers' variables alone place the ranks
unset TUTTI_RANK TUTTI_WORLD_SIZE TUTTI_LOCAL_SIZE TUTTI_STORE TUTTI_JOB_ID RANK WORLD_SIZE \
    MASTER_ADDR MASTER_PORT SLURM_JOB_ID TORCHELASTIC_RUN_ID
export TUTTI_SOCKET_IFNAME=lo TUTTI_TIMEOUT_MS=20000 TUTTI_STORE_TIMEOUT_MS=10000
# Open MPI refuses root without these (CI runs as root); its own transports stay on
# loopback, and it may start more ranks than this host has CPUs
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo \
    OMPI_MCA_rmaps_base_oversubscribe=1
# what each job runs: three collectives, every value checked
colls="allreduce broadcast allgather"
run_checked() { # LOG LAUNCHER ARGS...: 0 when every collective's run exits 0 in 60 s
    local log=$1
    shift
    for c in $colls; do
        timeout -k 5 60 "$@" "$bench" --coll "$c" -b 4 -e 1M -f 32 -n 3 -w 1 -c \
            >>"$log" 2>&1 || return 1
    done
}
ran=0

ompi=$(command -v mpirun.openmpi || true)
if [ -n "$ompi" ]; then
    ran=1
    # two jobs at once: each its own job id, so its own port and store
    run_checked "$work/ompi-a.txt" "$ompi" -np 3 &
    a=$!
    run_checked "$work/ompi-b.txt" "$ompi" -np 3 &
    b=$!
    wait $a || { tail -n 20 "$work/ompi-a.txt"; fail "Open MPI job a"; }
    wait $b || { tail -n 20 "$work/ompi-b.txt"; fail "Open MPI job b"; }
    # both said where they met: two loopback ports
    TUTTI_DEBUG=info timeout -k 5 60 "$ompi" -np 2 "$bench" -b 4 -e 4 -n 1 -w 0 \
        >"$work/ompi-info.txt" 2>&1 || { tail -n 20 "$work/ompi-info.txt"; fail "Open MPI, info"; }
    grep -q "store tcp://127.0.0.1:[0-9]*: all 2 ranks on this host (Open MPI)" \
        "$work/ompi-info.txt" || { cat "$work/ompi-info.txt"; fail "no loopback store line"; }
    # the job's port held by something else: rank 0 fails at once naming the port and the
    # way out, and mpirun stops the others
    port=$(grep -o "store tcp://127.0.0.1:[0-9]*" "$work/ompi-info.txt" | head -1 | sed 's/.*://')
    id=$(grep -o "the port from job id [^ ]*" "$work/ompi-info.txt" | head -1 | sed 's/.* //')
    { [ -n "$port" ] && [ -n "$id" ]; } || fail "no port or job id in the info run"
    python3 -c "import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $port)); s.listen(); print('held', flush=True); time.sleep(60)" \
        >"$work/holder.txt" 2>&1 &
    holder=$!
    for _ in $(seq 50); do
        grep -q held "$work/holder.txt" && break
        sleep 0.1
    done
    grep -q held "$work/holder.txt" || { kill $holder; cat "$work/holder.txt"; fail "no holder"; }
    t0=$(date +%s%N)
    TUTTI_JOB_ID=$id timeout -k 5 60 "$ompi" -x TUTTI_JOB_ID -np 3 "$bench" -b 4 -e 4 -n 1 -w 0 \
        >"$work/ompi-held.txt" 2>&1
    rc=$?
    dt=$((($(date +%s%N) - t0) / 1000000))
    kill $holder
    wait $holder 2>/dev/null
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
        cat "$work/ompi-held.txt"
        fail "Open MPI with its port held: rc $rc"
    fi
    want="rank 0 cannot open store tcp://127.0.0.1:$port: .*Address already in use"
    want="$want.*(the port of job id $id: set TUTTI_STORE, or another TUTTI_JOB_ID)"
    grep -q "$want" "$work/ompi-held.txt" || { cat "$work/ompi-held.txt"; fail "the held port's error"; }
    [ $dt -lt 15000 ] || fail "Open MPI with its port held took $dt ms to fail"
    echo "test_mpirun: Open MPI: 2 jobs of 3 ranks at once, $colls right; the port held:" \
        "rank 0 fails naming it, the job ends in $dt ms"
else
    echo "test_mpirun: no mpirun.openmpi (openmpi-bin): Open MPI not tried"
fi

mpich=$(command -v mpiexec.mpich || true)
if [ -n "$mpich" ]; then
    ran=1
    t0=$(date +%s%N)
    timeout -k 5 60 "$mpich" -n 3 "$bench" -b 4 -e 4 -n 1 -w 0 >"$work/mpich-none.txt" 2>&1
    rc=$?
    dt=$((($(date +%s%N) - t0) / 1000000))
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
        cat "$work/mpich-none.txt"
        fail "MPICH without a store: rc $rc"
    fi
    [ $dt -lt 10000 ] || fail "MPICH without a store took $dt ms to fail"
    for r in 0 1 2; do
        grep -q "rank $r of 3 (PMI_RANK): no store: set TUTTI_STORE.*no job id (TUTTI_JOB_ID)" \
            "$work/mpich-none.txt" || { cat "$work/mpich-none.txt"; fail "MPICH rank $r's error"; }
    done
    run_checked "$work/mpich-job.txt" "$mpich" -n 3 -genv TUTTI_JOB_ID "mpich-$$" ||
        { tail -n 20 "$work/mpich-job.txt"; fail "MPICH with TUTTI_JOB_ID"; }
    run_checked "$work/mpich-store.txt" "$mpich" -n 3 -genv TUTTI_STORE "file://$work/store" ||
        { tail -n 20 "$work/mpich-store.txt"; fail "MPICH with TUTTI_STORE"; }
    echo "test_mpirun: MPICH: no store fails in $dt ms naming TUTTI_STORE; with a job id" \
        "or a store, $colls right"
else
    echo "test_mpirun: no mpiexec.mpich (mpich): MPICH not tried"
fi
[ $ran = 1 ] || exit 77
echo "test_mpirun: OK"
