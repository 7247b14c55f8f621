#!/usr/bin/env bash
# Open MPI's mpirun across two hosts, no store named: the ranks (tutti_comm_init_env,
# nothing of tutti's set) ask the launcher's PMIx server for rank 0's host and meet
# there, rank 0 serving the store at a port from the job id (as a Slurm step's ranks
# meet on its first node). The hosts are two network namespaces joined by a veth pair
# (10.213.7.1 and .2), each with a host name of its own (tm01, tm02: a UTS namespace)
# and an /etc/hosts that names both (a mount namespace); mpirun runs on tm01 and starts
# its daemon on tm02 through an rsh agent of the test's that enters tm02's namespaces
# (as ssh would log in). Needs root, iproute2, nsenter/unshare and Open MPI; else 77.
#   1. mpirun -H tm01:2,tm02:2 -np 4: allreduce, broadcast and allgather of tutti-bench
#      -c (every value checked) across both hosts; rank 0 says its store is
#      tcp://tm01:<port>, rank 0's host from PMIx.
#   2. tm01's /etc/hosts mapping its own name to 127.0.1.1 (as Debian's installer does):
#      rank 0 serves on every interface instead of 127.0.1.1 alone, saying why, and the
#      ranks on tm02 (where tm01 is its network address) reach it: results right.
# MPICH's mpiexec across hosts still needs a store named (its PMI-1 has no host names).
#
#   tests/test_mpirun_nodes.sh BUILD/bench/tutti-bench
set -u
bench=$(realpath "$1")
build=$(dirname "$(dirname "$bench")")
cd "$(dirname "$0")/.." || exit 2
for b in mpirun.openmpi nsenter unshare; do
    command -v $b >/dev/null || { echo "test_mpirun_nodes: no $b: skipped"; exit 77; }
done
[ -e /usr/lib/x86_64-linux-gnu/libpmix.so.2 ] || ldconfig -p | grep -q 'libpmix\.so\.2 ' ||
    { echo "test_mpirun_nodes: no libpmix.so.2: skipped"; exit 77; }
. bench/netns-lib.sh
netns_require test_mpirun_nodes
unshare -m -u --propagation private true 2>/dev/null ||
    { echo "test_mpirun_nodes: no mount or UTS namespace of its own: skipped"; exit 77; }
netns_setup test-mpirun-nodes "$build" bench/tutti-bench
chmod 755 "$WORK"
fail() {
    echo "test_mpirun_nodes: FAIL: $*"
    exit 1
}
# nothing of the caller's job: the launcher's variables alone place the ranks
unset TUTTI_RANK TUTTI_WORLD_SIZE TUTTI_LOCAL_SIZE TUTTI_STORE TUTTI_JOB_ID RANK WORLD_SIZE \
    LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID MPI_LOCALNRANKS TUTTI_SOCKET_IFNAME
while read -r v; do unset "$v"; done < <(env | grep -o '^\(SLURM\|OMPI\|PMIX\|PMI\)_[A-Z_]*')
export TUTTI_TIMEOUT_MS=20000 TUTTI_STORE_TIMEOUT_MS=10000
# Open MPI refuses root without these (CI runs as root); its own traffic stays on the link
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_btl_tcp_if_include=10.213.7.0/24 OMPI_MCA_oob_tcp_if_include=10.213.7.0/24 \
    OMPI_MCA_rmaps_base_oversubscribe=1
# libpmix keeps a few bytes past PMIx_Finalize (pmix_rte_init's): not the ranks' leak
printf 'leak:libpmix.so\n' >"$WORK/lsan.supp"
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$WORK/lsan.supp"
names=(tm01 tm02)
printf '127.0.0.1 localhost\n%s %s\n%s %s\n' "${ADDR[0]}" tm01 "${ADDR[1]}" tm02 >"$WORK/hosts"
# Debian's own-name line on tm01 (case 2)
printf '127.0.0.1 localhost\n127.0.1.1 tm01\n%s %s\n' "${ADDR[1]}" tm02 >"$WORK/hosts-loop"
# on I HOSTS CMD...: CMD on host I (its network, host name and that /etc/hosts)
on() {
    local i=$1 hosts=$2
    shift 2
    nsenter --net="/run/netns/${NS[$i]}" unshare -m -u --propagation private \
        sh -c 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"' \
        "$hosts" "${names[$i]}" "$@"
}
# mpirun's rsh agent: "tm02 orted ARGS" (one shell line, as ssh takes it) run on tm02
cat >"$WORK/rsh" <<EOF
#!/bin/sh
[ "\$1" = tm02 ] || { echo "rsh: no host \$1" >&2; exit 255; }
shift
exec nsenter --net=/run/netns/${NS[1]} unshare -m -u --propagation private \\
    sh -c 'mount --bind "\$0" /etc/hosts && hostname tm02 && exec sh -c "\$1"' "$WORK/hosts" "\$*"
EOF
chmod 755 "$WORK/rsh"
mpirun_on_tm01() { # HOSTS ARGS...: mpirun on tm01, ranks 0-1 there and 2-3 on tm02
    local hosts=$1
    shift
    on 0 "$hosts" timeout -k 5 60 mpirun.openmpi --mca plm_rsh_agent "$WORK/rsh" \
        -H tm01:2,tm02:2 -np 4 -x TUTTI_DEBUG -x TUTTI_TIMEOUT_MS -x TUTTI_STORE_TIMEOUT_MS \
        -x PATH -x LSAN_OPTIONS "$@"
}

# 1. four ranks on two hosts
for c in allreduce broadcast allgather; do
    TUTTI_DEBUG=info mpirun_on_tm01 "$WORK/hosts" "$bench" --coll "$c" -b 4 -e 1M -f 32 -n 3 \
        -w 1 -c >"$WORK/$c.txt" 2>&1 || { tail -n 30 "$WORK/$c.txt"; fail "mpirun -np 4 $c"; }
    grep -q "store tcp://tm01:[0-9]*: rank 0's host (from PMIx) (Open MPI), the port from job id" \
        "$WORK/$c.txt" || { cat "$WORK/$c.txt"; fail "$c: no line of the store on tm01"; }
    grep -q "^# tutti-bench: $c, 4 ranks" "$WORK/$c.txt" || { cat "$WORK/$c.txt"; fail "$c: not 4 ranks"; }
done
hosts=$(mpirun_on_tm01 "$WORK/hosts" hostname 2>"$WORK/hostname.err" | sort | uniq -c | awk '{print $2 "x" $1}' |
    tr '\n' ' ')
[ "$hosts" = "tm01x2 tm02x2 " ] || fail "mpirun -H tm01:2,tm02:2 -np 4 ran on: $hosts"
echo "test_mpirun_nodes: mpirun -np 4 (on $hosts): allreduce, broadcast, allgather right, the store on tm01"

# 2. rank 0's host name resolving to loopback on its host
TUTTI_DEBUG=info mpirun_on_tm01 "$WORK/hosts-loop" "$bench" -b 4 -e 1M -f 32 -n 3 -w 1 -c \
    >"$WORK/loop.txt" 2>&1 || { tail -n 30 "$WORK/loop.txt"; fail "tm01 as 127.0.1.1 on tm01"; }
grep -q "tm01 resolves to 127.0.1.1 here, a loopback address: serving on every interface (tcp://0.0.0.0:[0-9]*)" \
    "$WORK/loop.txt" && grep -q "^# tutti-bench: allreduce, 4 ranks" "$WORK/loop.txt" ||
    { cat "$WORK/loop.txt"; fail "tm01 as 127.0.1.1: no line of the store on every interface"; }
echo "test_mpirun_nodes: rank 0's name on loopback at its host: served on every interface, results right"
[ -n "${KEEP_LOGS:-}" ] && cat "$WORK/allreduce.txt" "$WORK/loop.txt"
echo "test_mpirun_nodes: ok"
