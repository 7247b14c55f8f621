#!/usr/bin/env bash
# Ranks started by the MPI launchers, joining through tutti_comm_init_env with no tutti
# variable set (run.sh installs openmpi-bin and mpich; a launcher that is missing is
# skipped, both missing: exit 77):
#   1. Open MPI's mpirun, 3 ranks on this host: rank and size from OMPI_COMM_WORLD_*, the
#      store on loopback at a port from mpirun's job id; allreduce, broadcast and
#      allgather checked (tutti-bench -c exits 1 on a wrong value). Two jobs at once with
#      one TUTTI_JOB_ID: two ports (each mpirun's PMIx namespace), both right.
#   2. MPICH's mpiexec, 3 ranks: PMI_RANK/PMI_SIZE; it sets no job id, so the ranks take
#      their hydra proxy's (the peer of PMI_FD): with nothing set the job runs on a
#      loopback store and its results are right; so with TUTTI_JOB_ID, and two jobs at
#      once with one TUTTI_JOB_ID meet on two ports; with TUTTI_STORE too. Without PMI_FD
#      (a launch whose proxy cannot be found) and nothing set, every rank fails at once
#      saying what to set. With its port held by another process, rank 0 fails at once
#      naming it, the others at their store timeout, saying the port gave no answer.
# Every wait is bounded (timeout -k), and each launcher takes its ranks down with it.
#
#   tests/test_mpirun.sh BUILD/bench/tutti-bench
set -u
bench=$(realpath "$1")
work=$(mktemp -d)
bg=()
cleanup() {
    # jobs still running when a check failed: each launcher takes its ranks down
    [ ${#bg[@]} -gt 0 ] && kill "${bg[@]}" 2>/dev/null && wait "${bg[@]}" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "test_mpirun: FAIL: $*"
    exit 1
}
# nothing of the caller's job: the launchers' variables alone place the ranks
unset TUTTI_RANK TUTTI_WORLD_SIZE TUTTI_LOCAL_SIZE TUTTI_STORE TUTTI_JOB_ID RANK WORLD_SIZE \
    LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID MPI_LOCALNRANKS
# nor of a launcher around this test (CI in a Slurm job, under another mpirun)
while read -r v; do unset "$v"; done < <(env | grep -o '^\(SLURM\|OMPI\|PMIX\|PMI\)_[A-Z_]*')
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
# TAG LABEL LAUNCHER ARGS...: two jobs at once with one TUTTI_JOB_ID (as two launches in
# one Slurm job, or with one TUTTI_JOB_ID exported, have), 3 ranks each: the port mixes
# in each launch's own id, so they meet on two loopback stores (LABEL: the launcher as
# the library names it), and both are right. Each has a TMPDIR of its own: two mpiruns
# started at once race to make the same session directory (/tmp/ompi.<host>.<uid>;
# "orte_session_dir failed ... File exists", seen once in an ASan build's run).
two_at_once() {
    local tag=$1 label=$2 j i
    shift 2
    for j in a b; do
        mkdir -p "$work/tmp-$tag-$j"
        TMPDIR="$work/tmp-$tag-$j" TUTTI_DEBUG=info TUTTI_JOB_ID=shared-$$ timeout -k 5 60 "$@" \
            "$bench" -b 4 -e 4M -f 8 -n 10 -w 1 -c >"$work/$tag-$j.txt" 2>&1 &
        bg+=($!)
    done
    for i in 0 1; do
        wait "${bg[$i]}" || { tail -n 20 "$work/$tag"-[ab].txt; fail "$label, two jobs at once"; }
    done
    bg=()
    local want="store tcp://127.0.0.1:[0-9]*: all 3 ranks on this host ($label), the port from job id shared-$$"
    local pa pb
    pa=$(grep -o "$want" "$work/$tag-a.txt")
    pb=$(grep -o "$want" "$work/$tag-b.txt")
    { [ -n "$pa" ] && [ -n "$pb" ]; } || { cat "$work/$tag"-[ab].txt; fail "$label: no loopback store lines"; }
    [ "$pa" != "$pb" ] || fail "$label: two launches with one job id met on one port: $pa"
}
ran=0

ompi=$(command -v mpirun.openmpi || true)
if [ -n "$ompi" ]; then
    ran=1
    run_checked "$work/ompi.txt" "$ompi" -np 3 || { tail -n 20 "$work/ompi.txt"; fail "Open MPI"; }
    # two jobs at once with one job id: two PMIx namespaces, two ports
    two_at_once ompi "Open MPI" "$ompi" -x TUTTI_JOB_ID -np 3
    echo "test_mpirun: Open MPI: $colls right; two jobs of one job id at once on two ports, right"
else
    echo "test_mpirun: no mpirun.openmpi (openmpi-bin): Open MPI not tried"
fi

mpich=$(command -v mpiexec.mpich || true)
if [ -n "$mpich" ]; then
    ran=1
    # nothing set: the job id and the port from the ranks' hydra proxy
    TUTTI_DEBUG=info run_checked "$work/mpich.txt" "$mpich" -n 3 ||
        { tail -n 20 "$work/mpich.txt"; fail "MPICH with nothing set"; }
    grep -q "store tcp://127.0.0.1:[0-9]*: all 3 ranks on this host (PMI (MPICH, Intel MPI)), the port from job id hydra-[0-9]*\.[0-9]*$" \
        "$work/mpich.txt" || { cat "$work/mpich.txt"; fail "MPICH: no loopback store line"; }
    # two jobs at once with one TUTTI_JOB_ID: two hydra proxies, two ports
    two_at_once mpich "PMI (MPICH, Intel MPI)" "$mpich" -n 3
    # no PMI_FD (as a launch that connects its ranks to PMI by a port): no job id, and
    # every rank says at once what to set
    t0=$(date +%s%N)
    timeout -k 5 60 "$mpich" -n 3 env -u PMI_FD "$bench" -b 4 -e 4 -n 1 -w 0 \
        >"$work/mpich-none.txt" 2>&1
    rc=$?
    dt=$((($(date +%s%N) - t0) / 1000000))
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
        cat "$work/mpich-none.txt"
        fail "MPICH without PMI_FD: rc $rc"
    fi
    [ $dt -lt 10000 ] || fail "MPICH without PMI_FD took $dt ms to fail"
    for r in 0 1 2; do
        grep -q "rank $r of 3 (PMI_RANK): no store: set TUTTI_STORE.*no job id (TUTTI_JOB_ID)" \
            "$work/mpich-none.txt" || { cat "$work/mpich-none.txt"; fail "MPICH rank $r's error"; }
    done
    run_checked "$work/mpich-job.txt" "$mpich" -n 3 -genv TUTTI_JOB_ID "mpich-$$" ||
        { tail -n 20 "$work/mpich-job.txt"; fail "MPICH with TUTTI_JOB_ID"; }
    run_checked "$work/mpich-store.txt" "$mpich" -n 3 -genv TUTTI_STORE "file://$work/store" ||
        { tail -n 20 "$work/mpich-store.txt"; fail "MPICH with TUTTI_STORE"; }
    # The job's port held by something else: rank 0 fails at once naming the port and the
    # way out; the others, which met a server that says nothing, at their store timeout
    # (3 s here: mpiexec lets them run on), saying so. A PMI_JOBID given (as other PMIs
    # set it) names the launch instead of the proxy, so two launches share the port.
    TUTTI_DEBUG=info timeout -k 5 60 "$mpich" -n 2 -genv TUTTI_JOB_ID "held-$$" \
        -genv PMI_JOBID "held-$$" "$bench" -b 4 -e 4 -n 1 -w 0 >"$work/mpich-info.txt" 2>&1 ||
        { cat "$work/mpich-info.txt"; fail "MPICH, info"; }
    port=$(grep -o "store tcp://127.0.0.1:[0-9]*: all 2 ranks" "$work/mpich-info.txt" | head -1 |
        sed 's/.*:\([0-9]*\): all.*/\1/')
    [ -n "$port" ] || { cat "$work/mpich-info.txt"; fail "no loopback store line"; }
    python3 -c "import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $port)); s.listen(); print('held', flush=True); time.sleep(60)" \
        >"$work/holder.txt" 2>&1 &
    bg+=($!)
    for _ in $(seq 50); do
        grep -q held "$work/holder.txt" && break
        sleep 0.1
    done
    grep -q held "$work/holder.txt" || { cat "$work/holder.txt"; fail "no holder"; }
    t0=$(date +%s%N)
    TUTTI_STORE_TIMEOUT_MS=3000 timeout -k 5 60 "$mpich" -n 3 -genv TUTTI_JOB_ID "held-$$" \
        -genv PMI_JOBID "held-$$" "$bench" -b 4 -e 4 -n 1 -w 0 >"$work/mpich-held.txt" 2>&1
    rc=$?
    dt2=$((($(date +%s%N) - t0) / 1000000))
    kill "${bg[@]}"
    wait "${bg[@]}" 2>/dev/null
    bg=()
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
        cat "$work/mpich-held.txt"
        fail "MPICH with its port held: rc $rc"
    fi
    want="rank 0 cannot open store tcp://127.0.0.1:$port, the port of job id held-$$ (set"
    want="$want TUTTI_STORE, or another TUTTI_JOB_ID): .*Address already in use"
    grep -q "$want" "$work/mpich-held.txt" || { cat "$work/mpich-held.txt"; fail "rank 0's error"; }
    for r in 1 2; do
        want="rank $r cannot open store tcp://127.0.0.1:$port, the port of job id held-$$"
        want="$want.*no answer to the hello from 127.0.0.1:$port"
        grep -q "$want" "$work/mpich-held.txt" || { cat "$work/mpich-held.txt"; fail "rank $r's error"; }
    done
    [ $dt2 -lt 8000 ] || { cat "$work/mpich-held.txt"; fail "MPICH with its port held took $dt2 ms to end"; }
    echo "test_mpirun: MPICH: with nothing set, a job id or a store, $colls right; two jobs" \
        "of one job id at once on two ports, right; without PMI_FD it fails in $dt ms naming" \
        "TUTTI_STORE; its port held, every rank names it and the job ends in $dt2 ms"
else
    echo "test_mpirun: no mpiexec.mpich (mpich): MPICH not tried"
fi
[ $ran = 1 ] || exit 77
echo "test_mpirun: OK"
