#!/usr/bin/env bash
# A Slurm step across two nodes, with no store named: the ranks meet at the step's first
# node, rank 0 serving there, at a port from the job id. The nodes are two network
# namespaces joined by a veth pair (10.213.7.1 and .2), each with a host name of its own
# (tn01, tn02: a UTS namespace) and an /etc/hosts that names both (a mount namespace);
# slurmctld and one slurmd run on tn01, another slurmd on tn02 (auth/none, a config,
# state and spool of the test's own; each slurmd in a pid namespace, so that its step
# daemons go with it). Needs root, iproute2, nsenter/unshare and Slurm's daemons; else 77.
#   1. srun -N 2 -n 4: allreduce, broadcast and allgather of tutti-bench -c (every value
#      checked) across both nodes, the ranks on both; rank 0 says its store is
#      tcp://tn01:<port> from job id slurm-<job>.<step>.
#   2. Task 0 placed on tn02 (-m arbitrary -w tn02,tn01): rank 0 fails at once saying it
#      is not on the step's first node and what to set, and the step ends (bounded).
#   3. srun -N 2 -n 2 tutti-run -np 2 tutti-bench -c: each task a node of one job of 4
#      ranks (as mpirun's daemons; two torchruns would make two jobs of 2), the store
#      served by task 0's tutti-run on tn01.
#   4. tutti-run in a batch script of both nodes (sbatch -N 2 --ntasks-per-node 2, no
#      step): the allocation's nodes are its hosts, as mpirun's: tutti-bench -c on every
#      slot is one job of 4 ranks, -np 3 puts ranks 0-1 on tn01 and rank 2 on tn02
#      (started there through srun), -np 5 is refused naming the slots, and a rank on
#      tn02 exiting 3 ends the launch with 3 at once, nothing left running; the launch
#      stopped (SIGTERM) or killed (SIGKILL) has every rank stopped by a SIGTERM of its
#      own and leaves nothing (processes, temporary directories) on either node. Under salloc
#      (its shell on tn01, the job on tn02), the ranks run on tn02; from a login host on
#      neither node, both nodes' agents start in one srun step.
#   5. srun -N 2 -n 4 python3 of a script whose init_process_group("tutti") names only
#      init_method="tutti://": 4 ranks, an all_reduce right (where torch and tutti.torch
#      are).
#
#   tests/test_slurm_nodes.sh BUILD/bench/tutti-bench BUILD/tools/tutti-run
set -u
bench=$(realpath "$1")
run=$(realpath "$2")
build=$(dirname "$(dirname "$bench")")
cd "$(dirname "$0")/.." || exit 2
for b in slurmctld slurmd srun sinfo nsenter unshare; do
    command -v $b >/dev/null || { echo "test_slurm_nodes: no $b: skipped"; exit 77; }
done
. bench/netns-lib.sh
netns_require test_slurm_nodes
unshare --pid --fork --kill-child --mount-proc true 2>/dev/null &&
    unshare -m -u --propagation private true 2>/dev/null ||
    { echo "test_slurm_nodes: no pid, mount or UTS namespace of its own: skipped"; exit 77; }
netns_setup test-slurm-nodes "$build" bench/tutti-bench
chmod 755 "$WORK"
fail() {
    echo "test_slurm_nodes: FAIL: $*"
    for f in "$WORK"/slurmctld.log "$WORK"/slurmd-*.log; do
        [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }
    done
    exit 1
}
. tests/slurm-lib.sh
slurm_clean_env
unset TUTTI_SOCKET_IFNAME
export TUTTI_TIMEOUT_MS=20000 TUTTI_STORE_TIMEOUT_MS=10000
names=(tn01 tn02)
printf '127.0.0.1 localhost\n%s %s\n%s %s\n' "${ADDR[0]}" tn01 "${ADDR[1]}" tn02 >"$WORK/hosts"
# on I CMD...: CMD on node I (its network, host name and /etc/hosts); I "login": a host
# of no node's name (a login host) on tn01's network
on() {
    local i=$1 name=login
    if [ "$i" = login ]; then i=0; else name=${names[$i]}; fi
    shift
    nsenter --net="/run/netns/${NS[$i]}" unshare -m -u --propagation private \
        sh -c 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"' \
        "$WORK/hosts" "$name" "$@"
}
{
    cat <<EOF
ClusterName=tuttinodes
SlurmctldHost=tn01(${ADDR[0]})
SlurmctldPort=6817
SlurmdPort=6818
EOF
    slurm_conf_common "$WORK"
    cat <<EOF
NodeName=tn01 NodeAddr=${ADDR[0]} CPUs=4 State=UNKNOWN
NodeName=tn02 NodeAddr=${ADDR[1]} CPUs=4 State=UNKNOWN
PartitionName=tutti Nodes=tn01,tn02 Default=YES MaxTime=10 State=UP OverSubscribe=YES
EOF
} >"$WORK/slurm.conf"
export SLURM_CONF=$WORK/slurm.conf
on 0 slurmctld -D -i >"$WORK/ctld.out" 2>&1 &
PIDS+=("$!")
for i in 0 1; do
    on "$i" unshare --pid --fork --kill-child --mount-proc slurmd -D >"$WORK/d$i.out" 2>&1 &
    PIDS+=("$!")
done
up=
for _ in $(seq 100); do
    on 0 timeout 2 sinfo -h -o "%t %D" 2>/dev/null | grep -qx "idle 2" && up=1 && break
    sleep .2
done
[ -n "$up" ] || { cat "$WORK/ctld.out" "$WORK"/d?.out; fail "the two nodes did not come up in 20 s"; }

# 1. four ranks on two nodes
for c in allreduce broadcast allgather; do
    on 0 env TUTTI_DEBUG=info timeout -k 5 60 srun -N 2 -n 4 -t 2 "$bench" --coll "$c" \
        -b 4 -e 1M -f 32 -n 3 -w 1 -c >"$WORK/$c.txt" 2>&1 ||
        { tail -n 20 "$WORK/$c.txt"; fail "srun -N 2 -n 4 $c"; }
    grep -q "store tcp://tn01:[0-9]*: the first of the step's 2 nodes (Slurm (srun)), the port from job id slurm-[0-9]*\.[0-9]*" \
        "$WORK/$c.txt" || { cat "$WORK/$c.txt"; fail "$c: no line of the store on tn01"; }
done
hosts=$(on 0 timeout -k 5 30 srun -N 2 -n 4 -t 1 hostname | sort -u | tr '\n' ' ')
[ "$hosts" = "tn01 tn02 " ] || fail "srun -N 2 -n 4 ran on: $hosts"
echo "test_slurm_nodes: srun -N 2 -n 4 (on $hosts): allreduce, broadcast, allgather right, the store on tn01"

# 2. task 0 on the second node
t0=$(date +%s)
on 0 env TUTTI_STORE_TIMEOUT_MS=3000 timeout -k 5 60 srun -N 2 -n 2 -m arbitrary -w tn02,tn01 -t 1 \
    "$bench" -b 4 -e 4 -n 1 -w 0 >"$WORK/off.txt" 2>&1
rc=$?
took=$(($(date +%s) - t0))
[ "$rc" != 0 ] && grep -q "rank 0 runs on node tn02, not on the step's first node tn01" "$WORK/off.txt" &&
    grep -q "MASTER_ADDR" "$WORK/off.txt" ||
    { cat "$WORK/off.txt"; fail "task 0 on tn02: exit $rc"; }
[ "$took" -lt 30 ] || fail "task 0 on tn02: the step took $took s"
echo "test_slurm_nodes: task 0 on tn02: refused, naming the first node and MASTER_ADDR ($took s)"

# 3. tutti-run as the step's tasks
on 0 env TUTTI_DEBUG=info timeout -k 5 60 srun -N 2 -n 2 -t 1 "$run" -np 2 "$bench" -b 4 -e 1M \
    -f 32 -n 3 -w 1 -c >"$WORK/run.txt" 2>&1 || { tail -n 30 "$WORK/run.txt"; fail "srun tutti-run"; }
grep -q "^# tutti-bench: allreduce, 4 ranks" "$WORK/run.txt" &&
    ! grep -q "^# tutti-bench: allreduce, 2 ranks" "$WORK/run.txt" &&
    grep -q "Slurm task 0 of 2: node 0 of the job, store tcp://tn01:[0-9]* (served here)" "$WORK/run.txt" ||
    { cat "$WORK/run.txt"; fail "srun -N 2 -n 2 tutti-run -np 2: not one job of 4 ranks"; }
echo "test_slurm_nodes: srun -N 2 -n 2 tutti-run -np 2: one job of 4 ranks, the store on tn01, right"
# two tasks on one node would each number their ranks from LOCAL_RANK 0: refused
on 0 timeout -k 5 60 srun -N 1 -n 2 -t 1 "$run" -np 1 "$bench" -b 4 -e 4 -n 1 -w 0 \
    >"$WORK/two.txt" 2>&1 && fail "srun -N 1 -n 2 tutti-run: not refused"
grep -q "give it one task a node" "$WORK/two.txt" || { cat "$WORK/two.txt"; fail "srun -N 1 -n 2 tutti-run"; }
echo "test_slurm_nodes: srun -N 1 -n 2 tutti-run: refused (one task a node)"
# 4. tutti-run in a batch script of both nodes (no step): the allocation's nodes are the
# job's hosts, as mpirun takes them, the ranks filling their slots (SLURM_TASKS_PER_NODE)
# in order, tn02's agent started through srun
cat >"$WORK/batch.sh" <<'EOF'
#!/bin/sh
"$RUN" "$BENCH" -b 4 -e 1M -f 32 -n 3 -w 1 -c
echo "bench exit $?"
"$RUN" -np 3 sh -c 'echo "rank $TUTTI_RANK of $TUTTI_WORLD_SIZE local $LOCAL_RANK on $(hostname)"'
echo "placed exit $?"
"$RUN" -np 5 true
echo "over exit $?"
t0=$(date +%s)
"$RUN" -np 3 sh -c '[ "$TUTTI_RANK" = 2 ] && exit 3; exec sleep 37.5'
echo "fail exit $? in $(($(date +%s) - t0)) s"
# the launch stopped (TERM) or killed (KILL): every rank stopped by a SIGTERM of its own
# (srun would SIGKILL its step), and what is left of the job on each node, temporary
# directories too (TMPDIR of this launch's own; srun passes it on)
on2() { srun -N 1 -n 1 -w tn02 --overlap -t 1 sh -c "$*; true"; }
for sig in TERM KILL; do
    mkdir "$OUT/tmp.$sig"
    TMPDIR=$OUT/tmp.$sig "$RUN" -np 3 sh -c 'trap "kill \$!; echo term \$TUTTI_RANK; exit 0" TERM
        echo "up $TUTTI_RANK"; sleep 37.5 & wait' >"$OUT/$sig.txt" 2>&1 &
    pid=$!
    for _ in $(seq 150); do [ "$(grep -c '^up' "$OUT/$sig.txt")" = 3 ] && break; sleep .1; done
    kill -$sig $pid
    wait $pid
    t0=$(date +%s%N)
    for _ in $(seq 75); do
        here=$(pgrep -cfx "sleep 37.5") there=$(on2 pgrep -cfx "'sleep 37.5'")
        dirs=$(find "$OUT/tmp.$sig" -mindepth 1 -maxdepth 1 | wc -l)
        [ "$here$there$dirs" = 000 ] && break
        sleep .2
    done
    echo "$sig: $(grep -c '^up' "$OUT/$sig.txt") up, $(grep -c '^term' "$OUT/$sig.txt") stopped by SIGTERM, left $here on tn01, $there on tn02 and $dirs directories after $((($(date +%s%N) - t0) / 1000000)) ms"
done
EOF
chmod 755 "$WORK/batch.sh"
on 0 env RUN="$run" BENCH="$bench" OUT="$WORK" timeout -k 5 120 sbatch --wait -N 2 --ntasks-per-node 2 -t 2 \
    -o "$WORK/batch.out" "$WORK/batch.sh" >/dev/null 2>&1
b() { cat "$WORK/batch.out"; fail "tutti-run in a batch script of 2 nodes: $*"; }
grep -q "^# tutti-bench: allreduce, 4 ranks" "$WORK/batch.out" && grep -qx "bench exit 0" "$WORK/batch.out" ||
    b "every slot: not one job of 4 ranks, right"
for want in "rank 0 of 3 local 0 on tn01" "rank 1 of 3 local 1 on tn01" "rank 2 of 3 local 0 on tn02" \
    "placed exit 0"; do
    grep -qx "$want" "$WORK/batch.out" || b "-np 3: no line '$want'"
done
grep -q "the hosts have 4 slot(s) in all" "$WORK/batch.out" && grep -q "SLURM_TASKS_PER_NODE=2(x2)" "$WORK/batch.out" &&
    grep -qx "over exit 2" "$WORK/batch.out" || b "-np 5 of 4 slots: not refused"
took=$(sed -n 's/^fail exit 3 in \([0-9]*\) s$/\1/p' "$WORK/batch.out")
[ -n "$took" ] && [ "$took" -lt 15 ] || b "rank 2 on tn02 exiting 3: not the launch's exit 3 within 15 s"
pgrep -fx "sleep 37.5" >/dev/null && b "rank 2's failure left ranks running"
for sig in TERM KILL; do
    ms=$(sed -n "s/^$sig: 3 up, 3 stopped by SIGTERM, left 0 on tn01, 0 on tn02 and 0 directories after \([0-9]*\) ms$/\1/p" "$WORK/batch.out")
    [ -n "$ms" ] && [ "$ms" -lt 3000 ] ||
        b "the launch's SIG$sig: not every rank up and stopped by SIGTERM, or something left 3 s later"
done
grep "^TERM: \|^KILL: " "$WORK/batch.out"
echo "test_slurm_nodes: tutti-run in a 2-node batch script: 4 ranks on 2x2 slots right, -np 3 as 2+1, -np 5 refused, a failure on tn02 ends it in $took s, TERM and KILL leave nothing"
# salloc's shell runs on no node of the job (here tn01's namespace, the job on tn02 alone):
# the ranks go to the job's node, as mpirun's would
out=$(on 0 timeout -k 5 60 salloc -N 1 -n 2 -w tn02 -t 1 "$run" -np 2 \
    sh -c 'echo "rank $TUTTI_RANK local $LOCAL_RANK on $(hostname)"' 2>&1)
[ "$(echo "$out" | grep '^rank' | sort | tr '\n' ';')" = "rank 0 local 0 on tn02;rank 1 local 1 on tn02;" ] ||
    { echo "$out"; fail "salloc -N 1 -n 2 -w tn02 tutti-run -np 2: not both ranks on tn02"; }
echo "test_slurm_nodes: salloc -N 1 -n 2 -w tn02 tutti-run -np 2 from tn01: both ranks on tn02"
# from a login host, on neither node: both nodes' agents in one srun step, as Open MPI's
# daemons (every rank sees the same step)
out=$(on login timeout -k 5 60 salloc -N 2 -n 3 -t 1 "$run" \
    sh -c 'echo "rank $TUTTI_RANK of $TUTTI_WORLD_SIZE local $LOCAL_RANK on $(hostname) step $SLURM_STEP_ID"' 2>&1)
ranks=$(echo "$out" | grep '^rank' | sort | tr '\n' ';')
[[ $ranks =~ ^"rank 0 of 3 local 0 on tn01 step "([0-9]+)";rank 1 of 3 local 1 on tn01 step "([0-9]+)";rank 2 of 3 local 0 on tn02 step "([0-9]+)";"$ ]] &&
    [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ] && [ "${BASH_REMATCH[2]}" = "${BASH_REMATCH[3]}" ] ||
    { echo "$out"; fail "salloc -N 2 -n 3 tutti-run from a login host: not 2+1 ranks in one srun step"; }
echo "test_slurm_nodes: salloc -N 2 -n 3 tutti-run from a login host: ranks 0-1 on tn01, 2 on tn02, one srun step"

# 5. torch: init_process_group("tutti", init_method="tutti://") under srun, nothing set
# (the extension built, and a library Python can load: not a sanitizer build's)
if compgen -G "$build/python/tutti/torch/_C*.so" >/dev/null &&
    ! ldd "$build/lib/libtutti.so" 2>/dev/null | grep -q 'lib[at]san' &&
    /usr/bin/python3 -c "import torch" 2>/dev/null; then
    cat >"$WORK/t.py" <<'EOF'
import os, torch, torch.distributed as dist, tutti.torch
dist.init_process_group("tutti", init_method="tutti://")
r, n = dist.get_rank(), dist.get_world_size()
t = torch.arange(4, dtype=torch.float64) * (r + 1)
dist.all_reduce(t)
# one write: under tutti-run the ranks share the pipe (print writes the newline apart)
os.write(1, f"rank {r} of {n} sum {' '.join(str(int(x)) for x in t.tolist())}\n".encode())
dist.destroy_process_group()
EOF
    on 0 env PYTHONPATH="$build/python" timeout -k 5 120 srun -N 2 -n 4 -t 2 /usr/bin/python3 \
        "$WORK/t.py" >"$WORK/torch.txt" 2>&1 || { tail -n 30 "$WORK/torch.txt"; fail "srun python3 (torch)"; }
    [ "$(grep -c '^rank [0-3] of 4 sum 0 10 20 30$' "$WORK/torch.txt")" = 4 ] ||
        { cat "$WORK/torch.txt"; fail "torch's tutti:// under srun: not 4 ranks with the right sums"; }
    echo "test_slurm_nodes: torch, init_method tutti:// under srun -N 2 -n 4: 4 ranks, sums right"
    # torch's env:// under srun tutti-run, MASTER_ADDR and MASTER_PORT set as Slurm
    # scripts do: torch's store takes that port, tutti's is elsewhere
    sed 's|init_method="tutti://"|init_method="env://"|' "$WORK/t.py" >"$WORK/t_env.py"
    on 0 env PYTHONPATH="$build/python" MASTER_ADDR=tn01 MASTER_PORT=29877 timeout -k 5 120 \
        srun -N 2 -n 2 -t 2 "$run" -np 2 /usr/bin/python3 "$WORK/t_env.py" >"$WORK/torch_env.txt" 2>&1 ||
        { tail -n 30 "$WORK/torch_env.txt"; fail "srun tutti-run python3 (torch env://, MASTER_PORT set)"; }
    [ "$(grep -c '^rank [0-3] of 4 sum 0 10 20 30$' "$WORK/torch_env.txt")" = 4 ] ||
        { cat "$WORK/torch_env.txt"; fail "torch env:// under srun tutti-run: not 4 ranks with the right sums"; }
    echo "test_slurm_nodes: torch env:// under srun -N 2 -n 2 tutti-run -np 2, MASTER_PORT set: 4 ranks, right"
else
    echo "test_slurm_nodes: no tutti.torch, torch, or a library Python can load: the torch checks are not run"
fi
echo "test_slurm_nodes: OK"
