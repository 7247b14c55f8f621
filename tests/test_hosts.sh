#!/usr/bin/env bash
# tutti-run -H: one command starts a job on several hosts (mpirun's and horovodrun's -H),
# here two network namespaces joined by a veth pair, A (10.213.7.1) and B (10.213.7.2).
# The launch runs in A; B is reached through --rsh, a stand-in for ssh that runs the
# command line it is given in B's namespace under a fresh environment (env -i), as a
# remote shell would. Checks:
#   1. 3 ranks, 2 on A (started directly) and 1 on B (through rsh), of tutti-bench -c: an
#      allreduce whose every value is checked; the store is the launch's, with a secret
#      that no command line carries (the agents' /proc/PID/cmdline is read while they run);
#      again with TUTTI_TLS_* set: they reach the rank on B, and every rank runs TLS.
#   2. -H A:1,B:2 with -np 3 and a rank on B that exits 3: the launch exits 3 at once and
#      nothing of the job is left on either host.
#   3. The launch killed (SIGKILL): the agent on B (in a session of its own, as sshd
#      starts it, so no process group of the launch's reaches it) sees its stdin end, as
#      after ssh's connection goes, and stops its ranks; nothing is left on B.
#   4. A host file with Open MPI's spellings gives each rank its RANK, WORLD_SIZE,
#      LOCAL_RANK, GROUP_RANK and GROUP_WORLD_SIZE; bad host lists (more ranks than
#      slots, a bad SLOTS) exit 2. A Slurm batch script's variables (no srun here:
#      TUTTI_RSH) make the allocation the hosts: 2+1 ranks; bad ones exit 2.
#
#   tests/test_hosts.sh BUILD/tools/tutti-run BUILD/bench/tutti-bench   (root and iproute2;
#                                                                       77 without them)
set -u
run=$(realpath "$1")
bench=$(realpath "$2")
build=$(dirname "$(dirname "$run")")
cd "$(dirname "$0")/.." || exit 2
. bench/netns-lib.sh
netns_require test_hosts
netns_setup test-hosts "$build" bench/tutti-bench
fail() {
    echo "test_hosts: FAIL: $*"
    exit 1
}
A=${ADDR[0]} B=${ADDR[1]} A6=fd7e:7::1 B6=fd7e:7::2
for i in 0 1; do ip -n "${NS[$i]}" addr add "fd7e:7::$((i + 1))/64" dev "${DEV[$i]}" nodad; done
# ssh HOST 'COMMAND LINE', with the hosts of this test as namespaces: in a session of its
# own, as sshd starts it (so the launch's process groups do not reach it: only its
# stdin's end, as after ssh's connection goes)
cat >"$WORK/rsh" <<EOF
#!/bin/sh
host=\${1#*@} # USER@HOST: this stand-in runs every user's command as this test's
shift
case \$host in
$A | $A6) ns=${NS[0]} ;;
$B | $B6) ns=${NS[1]} ;;
*) echo "rsh: no host \$host" >&2; exit 255 ;;
esac
exec setsid -w ip netns exec "\$ns" env -i PATH="\$PATH" HOME=/ sh -c "\$*"
EOF
chmod +x "$WORK/rsh"
inA() { ip netns exec "${NS[0]}" "$@"; }
. tests/hosts-lib.sh
export LD_LIBRARY_PATH=$build/lib

# 1. a job on A and B, the agent on B
hosts_check_job "$WORK/rsh" hosts-1
hosts_check_agent "$WORK/rsh"
# ... over tcp with TLS: the launch's TUTTI_TLS_* reach the rank on B (whose rsh starts
# it with a fresh environment; tcp and the log level go by -x); each rank's tcp
# transport says TLS is on
if command -v openssl >/dev/null && ldd "$build/lib/libtutti.so" | grep -q libssl; then
    mkdir -p "$WORK/tls" && (cd "$WORK/tls" &&
        ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes" &&
        openssl req -x509 $ec -keyout ca.key -out ca.pem -days 2 -subj /CN=ca &&
        openssl req $ec -keyout node.key -out node.csr -subj /CN=node &&
        openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
            -out node.pem -days 2) >/dev/null 2>&1 || fail "openssl: certificates"
    TUTTI_TLS_CERT=$WORK/tls/node.pem TUTTI_TLS_KEY=$WORK/tls/node.key \
        TUTTI_TLS_CA_FILE=$WORK/tls/ca.pem TUTTI_DEBUG=info hosts_check_job "$WORK/rsh" hosts-tls \
        "-x TUTTI_TRANSPORT=tcp -x TUTTI_DEBUG"
    n=$(grep -c 'tcp: TLS on every link' "$WORK/hosts-tls.txt")
    [ "$n" = 3 ] || { cat "$WORK/hosts-tls.txt"; fail "TLS on $n ranks' links, not 3"; }
    echo "TLS: the launch's TUTTI_TLS_* on every host's ranks"
fi
# the same with the hosts named by IPv6 addresses: the launch's store serves both families
out=$(inA timeout 30 "$run" -H "[$A6]:1,[$B6]:1" --rsh "$WORK/rsh" -x LD_LIBRARY_PATH \
    "$bench" -b 4 -e 4K -n 1 -w 0 -c 2>&1)
rc=$?
[ "$rc" = 0 ] || fail "2 ranks on [$A6] and [$B6]: exit $rc: $out"
echo "2 ranks on [$A6] and [$B6]: exit 0"

# 2. a rank on B fails
hosts_check_fail "$WORK/rsh" hosts-2

# 3. the launch killed
ip netns exec "${NS[0]}" "$run" -H "$A:1,$B:1" --rsh "$WORK/rsh" -x LD_LIBRARY_PATH --job-id hosts-3 \
    sh -c 'exec sleep 30' >"$WORK/three.txt" 2>&1 & # $!: tutti-run (ip execs it)
launch=$!
PIDS+=("$launch")
for _ in $(seq 100); do [ -n "$(hosts_job_procs 1 hosts-3)" ] && break; sleep .05; done
[ -n "$(hosts_job_procs 1 hosts-3)" ] || { cat "$WORK/three.txt"; fail "nothing of the job on B"; }
kill -KILL "$launch"
wait "$launch" 2>/dev/null
PIDS=()
t0=$(date +%s%N)
for _ in $(seq 100); do [ -z "$(hosts_job_procs 1 hosts-3)" ] && break; sleep .1; done
ms=$((($(date +%s%N) - t0) / 1000000))
[ -z "$(hosts_job_procs 1 hosts-3)" ] || fail "left on B 10 s after the launch was killed: $(hosts_job_procs 1 hosts-3)"
echo "the launch killed: the job gone from $B in $ms ms"

# 4. a host file (Open MPI's spellings, a comment), and bad host lists
printf '# the hosts\n%s slots=1\nroot@%s  # B, with a user (Open MPI takes it)\n' "$A" "$B" >"$WORK/hostfile"
out=$(inA timeout 30 "$run" --hostfile "$WORK/hostfile" --rsh "$WORK/rsh" -x LD_LIBRARY_PATH \
    sh -c 'echo "$RANK/$WORLD_SIZE $LOCAL_RANK $GROUP_RANK/$GROUP_WORLD_SIZE"' 2>&1)
rc=$?
[ "$rc" = 0 ] && [ "$(echo "$out" | sort | tr '\n' ';')" = "0/2 0 0/2;1/2 0 1/2;" ] ||
    fail "--hostfile: exit $rc: $out"
echo "--hostfile: 2 hosts, rank and group variables right"
# two names of host A (its address and localhost): one node of 2 ranks, not two of 1
out=$(inA timeout 30 "$run" -H "$A:1,localhost:1,$B:1" --rsh "$WORK/rsh" -x LD_LIBRARY_PATH \
    sh -c 'echo "$RANK/$WORLD_SIZE $LOCAL_RANK/$LOCAL_WORLD_SIZE $GROUP_RANK/$GROUP_WORLD_SIZE"' 2>&1)
rc=$?
[ "$rc" = 0 ] && [ "$(echo "$out" | sort | tr '\n' ';')" = "0/3 0/2 0/2;1/3 1/2 0/2;2/3 0/1 1/2;" ] ||
    fail "-H $A:1,localhost:1,$B:1: exit $rc: $out"
echo "two names of one host: one node (LOCAL_RANK 0 and 1)"
# a Slurm batch script's allocation as the hosts (the variables sbatch sets there; the
# nodes reached through TUTTI_RSH here, where there is no srun): a host list of the two
# addresses with 2 and 1 tasks, every slot by default; a node named by SLURMD_NODENAME
# is this one, whatever its host name; lists that do not parse or match exit 2
# (Slurm's name for A, tt-node-a, is neither its host name nor an address: only
# SLURMD_NODENAME says it is this node, else the stand-in ssh would fail on it)
slurm=(env SLURM_JOB_ID=5 SLURM_JOB_NUM_NODES=2 SLURM_JOB_NODELIST="tt-node-a,${B%.*}.[${B##*.}]"
    SLURM_TASKS_PER_NODE="2,1" SLURMD_NODENAME=tt-node-a TUTTI_RSH="$WORK/rsh")
out=$(inA timeout 30 "${slurm[@]}" "$run" -x LD_LIBRARY_PATH \
    sh -c 'echo "$RANK/$WORLD_SIZE $LOCAL_RANK $GROUP_RANK/$GROUP_WORLD_SIZE"' 2>&1)
rc=$?
[ "$rc" = 0 ] && [ "$(echo "$out" | sort | tr '\n' ';')" = "0/3 0 0/2;1/3 1 0/2;2/3 0 1/2;" ] ||
    fail "a Slurm allocation tt-node-a,${B%.*}.[${B##*.}], 2,1 tasks: exit $rc: $out"
echo "a Slurm batch allocation: its nodes and slots (2,1) as the hosts"
for bad in "SLURM_TASKS_PER_NODE=2" "SLURM_TASKS_PER_NODE=1(x3)" "SLURM_TASKS_PER_NODE=1,x" \
    "SLURM_JOB_NODELIST=n[1-" "SLURM_TASKS_PER_NODE=1(x2"; do
    out=$(inA timeout 10 "${slurm[@]}" "$bad" "$run" true 2>&1)
    rc=$?
    [ "$rc" = 2 ] && echo "$out" | grep -q "do not parse, or do not match" ||
        fail "a Slurm allocation with $bad: exit $rc, expected 2 ($out)"
done
out=$(inA timeout 10 "${slurm[@]}" "$run" -np 4 true 2>&1)
[ $? = 2 ] && echo "$out" | grep -q "SLURM_TASKS_PER_NODE=2,1; sbatch or salloc -n" ||
    fail "a Slurm allocation of 3 slots, -np 4: not refused naming them ($out)"
out=$(inA timeout 10 "${slurm[@]}" "$run" --max-restarts 1 true 2>&1)
[ $? = 2 ] && echo "$out" | grep -q "does not go with --max-restarts" ||
    fail "a Slurm allocation with --max-restarts: not refused ($out)"
echo "a Slurm allocation that does not parse, has too few slots, or with --max-restarts: exit 2"
long=$(printf 'h%.0s' $(seq 256)) # a host name of 256 bytes (255 is the most)
for bad in "-H $A:1 -np 2" "-H $A:0" "-H $A:x" "-H @$A" "-H a@b@$A" "-H $B,root@$B" "-H $long"; do
    # shellcheck disable=SC2086
    out=$(inA timeout 10 "$run" $bad true 2>&1)
    rc=$?
    [ "$rc" = 2 ] || fail "tutti-run $bad: exit $rc, expected 2 ($out)"
done
echo "bad host lists: exit 2"
echo "test_hosts: ok"
