#!/usr/bin/env bash
# Ranks that Slurm's srun starts, joining through tutti_comm_init_env with no tutti variable
# set, on a single-host Slurm the test runs itself (slurmctld and slurmd in the foreground,
# auth/none, a config, state and spool of its own, ports it picked on 127.0.0.1; slurmd in
# a pid namespace of its own, so that its step daemons go with it). Needs root, unshare and
# Slurm's daemons (run.sh installs slurmctld, slurmd and slurm-client); else 77.
#   1. srun -n 3: rank and size from SLURM_PROCID / SLURM_STEP_NUM_TASKS, the store on
#      loopback at a port from the job id (slurm-<job>.<step>); allreduce, broadcast and
#      allgather checked (tutti-bench -c exits 1 on a wrong value).
#   2. Two steps of one job at once (srun ... & srun ... & in a batch script) with one
#      TUTTI_JOB_ID: two step ids, two ports, both right. And srun --mpi=pmi2, whose
#      tasks have PMI_RANK/PMI_SIZE but no MPI_LOCALNRANKS.
#   3. tutti-bench run in the batch script itself, which has SLURM_PROCID=0 but is no
#      rank: it fails at once, saying to start the ranks with srun.
# Every wait is bounded; the daemons and their jobs go on every exit path.
#
#   tests/test_slurm.sh BUILD/bench/tutti-bench
set -u
bench=$(realpath "$1")
[ "$(id -u)" = 0 ] || { echo "test_slurm: needs root (slurmd): skipped"; exit 77; }
for b in slurmctld slurmd srun sbatch sinfo; do
    command -v $b >/dev/null || { echo "test_slurm: no $b: skipped"; exit 77; }
done
command -v python3 >/dev/null || { echo "test_slurm: no python3: skipped"; exit 77; }
unshare --pid --fork --kill-child --mount-proc true 2>/dev/null ||
    { echo "test_slurm: no pid namespace of its own for slurmd (unshare): skipped"; exit 77; }
work=$(mktemp -d)
chmod 755 "$work"
ctld=
slurmd_pid=
cleanup() {
    # slurmd runs in a pid namespace of its own (unshare --kill-child): the step daemons it
    # double-forks, and their tasks, die with it
    [ -n "$slurmd_pid" ] && kill -KILL "$slurmd_pid" 2>/dev/null
    [ -n "$ctld" ] && kill -KILL "$ctld" 2>/dev/null
    [ -n "$slurmd_pid" ] && wait "$slurmd_pid" 2>/dev/null
    [ -n "$ctld" ] && wait "$ctld" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "test_slurm: FAIL: $*"
    for f in "$work"/slurmctld.log "$work"/slurmd-*.log; do
        [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }
    done
    exit 1
}
. "$(dirname "$0")/slurm-lib.sh"
slurm_clean_env
export TUTTI_SOCKET_IFNAME=lo TUTTI_TIMEOUT_MS=20000 TUTTI_STORE_TIMEOUT_MS=10000

# two free ports on 127.0.0.1 (released before the daemons bind them: a race another test
# would have to lose twice)
read -r p1 p2 < <(python3 -c "import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(('127.0.0.1', 0))
print(*[x.getsockname()[1] for x in s])")
host=$(hostname -s)
{
    cat <<EOF
ClusterName=tuttitest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$p1
SlurmdPort=$p2
EOF
    slurm_conf_common "$work"
    cat <<EOF
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=tutti Nodes=$host Default=YES MaxTime=10 State=UP OverSubscribe=YES
EOF
} >"$work/slurm.conf"
export SLURM_CONF=$work/slurm.conf
slurmctld -D -i >"$work/ctld.out" 2>&1 &
ctld=$!
unshare --pid --fork --kill-child --mount-proc slurmd -D >"$work/d.out" 2>&1 &
slurmd_pid=$!
up=0
end=$((SECONDS + 20))
while [ $SECONDS -lt $end ]; do
    if timeout 2 sinfo -h -o %t 2>/dev/null | grep -q '^idle'; then
        up=1
        break
    fi
    sleep 0.2
done
[ $up = 1 ] || { cat "$work/ctld.out" "$work/d.out"; fail "the node did not come up in 20 s"; }

colls="allreduce broadcast allgather"
checked() { # LOG: 0 when every collective's srun exits 0 in 60 s
    local log=$1
    for c in $colls; do
        timeout -k 5 60 srun -n 3 -t 2 "$bench" --coll "$c" -b 4 -e 1M -f 32 -n 3 -w 1 -c \
            >>"$log" 2>&1 || return 1
    done
}

# 1. one step of three ranks
checked "$work/one.txt" || { tail -n 20 "$work/one.txt"; fail "srun -n 3"; }
TUTTI_DEBUG=info timeout -k 5 60 srun -n 2 -t 2 "$bench" -b 4 -e 4 -n 1 -w 0 \
    >"$work/info.txt" 2>&1 || { tail -n 20 "$work/info.txt"; fail "srun -n 2, info"; }
grep -q "store tcp://127.0.0.1:[0-9]*: all 2 ranks on this host (Slurm (srun)), the port from job id slurm-[0-9]*.0" \
    "$work/info.txt" || { cat "$work/info.txt"; fail "no loopback store line"; }
# srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE but not MPI_LOCALNRANKS: the step says where
timeout -k 5 60 srun -n 3 -t 2 --mpi=pmi2 "$bench" -b 4 -e 1M -f 32 -n 3 -w 1 -c \
    >"$work/pmi2.txt" 2>&1 || { tail -n 20 "$work/pmi2.txt"; fail "srun --mpi=pmi2 -n 3"; }
echo "test_slurm: srun -n 3: $colls right; with --mpi=pmi2 too"

# 2. two steps of one job at once, and 3. the batch script itself as a rank
cat >"$work/job.sh" <<EOF
#!/bin/sh
"$bench" -b 4 -e 4 -n 1 -w 0 >"$work/batch-self.txt" 2>&1
echo "batch rc \$?" >>"$work/batch-self.txt"
export TUTTI_JOB_ID=shared TUTTI_DEBUG=info
srun -n 3 --exact "$bench" -b 4 -e 1M -f 32 -n 3 -w 1 -c >"$work/step-a.txt" 2>&1 &
a=\$!
srun -n 3 --exact "$bench" --coll allgather -b 4 -e 1M -f 32 -n 3 -w 1 -c >"$work/step-b.txt" 2>&1 &
b=\$!
wait \$a; ra=\$?
wait \$b; rb=\$?
echo "steps \$ra \$rb" >"$work/steps.txt"
EOF
chmod +x "$work/job.sh"
jid=$(timeout 30 sbatch --parsable -n 6 -t 2 -o "$work/job.out" "$work/job.sh") || fail "sbatch"
end=$((SECONDS + 60))
while [ $SECONDS -lt $end ] && ! [ -f "$work/steps.txt" ]; do
    sleep 0.2
done
[ -f "$work/steps.txt" ] || { cat "$work/job.out" "$work"/step-*.txt 2>/dev/null; fail "job $jid did not end in 60 s"; }
read -r _ ra rb <"$work/steps.txt"
if [ "$ra" != 0 ] || [ "$rb" != 0 ]; then
    tail -n 20 "$work"/step-*.txt
    fail "two steps at once: exit $ra and $rb"
fi
want="missing the rank (in a Slurm job but outside its steps, no rank: start the ranks with srun)"
if ! grep -q "batch rc 2" "$work/batch-self.txt" || ! grep -qF "$want" "$work/batch-self.txt"; then
    cat "$work/batch-self.txt"
    fail "the batch script as a rank"
fi
# one TUTTI_JOB_ID, two steps: the port mixes in the step, so they met apart
line="store tcp://127.0.0.1:[0-9]*: all 3 ranks on this host (Slurm (srun)), the port from job id shared"
pa=$(grep -o "$line" "$work/step-a.txt")
pb=$(grep -o "$line" "$work/step-b.txt")
{ [ -n "$pa" ] && [ -n "$pb" ]; } || { cat "$work"/step-[ab].txt; fail "no loopback store lines"; }
[ "$pa" != "$pb" ] || fail "two steps of one job id met on one port: $pa"
# the job is over before the daemons go
end=$((SECONDS + 20))
while [ $SECONDS -lt $end ] && [ -n "$(timeout 2 squeue -h -j "$jid" 2>/dev/null)" ]; do
    sleep 0.2
done
echo "test_slurm: two steps of job $jid at once, one job id, two ports, right; the batch" \
    "script itself refused, naming srun"
echo "test_slurm: OK"
