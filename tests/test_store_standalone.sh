#!/usr/bin/env bash
# Ranks that meet through a standalone tutti-store (TUTTI_STORE_SERVER=0: no rank hosts
# the server), as a cluster's rendezvous service would run it:
#   1. 3 ranks of tutti-bench from the environment (tutti_comm_init_env), every result
#      checked (-c: exit 1 on a wrong value); then a second job on the same server.
#      Before, every rank refused the server (it has no job label) until its timeout.
#   2. Rank 0 without TUTTI_STORE_SERVER=0 cannot host a server on the port the
#      standalone one holds: init fails at once, and the error says what to set.
#   3. Where localhost names ::1 before 127.0.0.1 (many hosts' /etc/hosts; here a mount
#      namespace's), a server on localhost listens on both: ranks reaching it by either
#      address meet, and it cannot start on a port a server holds at 127.0.0.1. Before,
#      it took ::1 alone, and two servers split one job's clients by spelling (root,
#      unshare and IPv6 loopback; else said and passed over). A lone "::" stays
#      dual-stack: 127.0.0.1 reaches it.
# Every wait is bounded; the server and the ranks go on every exit path.
#
#   tests/test_store_standalone.sh BUILD/tools/tutti-store BUILD/bench/tutti-bench
set -u
store_bin=$(realpath "$1")
bench=$(realpath "$2")
work=$(mktemp -d)
server=
pids=()
cleanup() {
    [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null # timeout passes it on
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "test_store_standalone: FAIL: $*"
    exit 1
}

# start_store NAME COMMAND...: a store server started by COMMAND (which execs it, so that
# $server is its pid), its output in $work/NAME.txt, the URL it says in $url
start_store() {
    local log=$work/$1.txt
    shift
    "$@" >"$log" 2>&1 &
    server=$!
    url=
    for _ in $(seq 100); do
        url=$(grep -o 'tcp://[^ ]*:[0-9]*' "$log" | head -1)
        [ -n "$url" ] && break
        sleep 0.1
    done
    [ -n "$url" ] || { cat "$log"; fail "tutti-store did not say where it listens"; }
}

start_store store "$store_bin" --port 0
export TUTTI_STORE=$url TUTTI_STORE_SERVER=0 TUTTI_SOCKET_IFNAME=lo TUTTI_TIMEOUT_MS=20000 \
    TUTTI_STORE_TIMEOUT_MS=10000
unset TUTTI_RANK TUTTI_WORLD_SIZE TUTTI_JOB_ID

# run_job ID NP: NP ranks of one job; 0 when every rank exits 0 within 60 s
run_job() {
    pids=()
    for r in $(seq 0 $(($2 - 1))); do
        TUTTI_JOB_ID=$1 TUTTI_RANK=$r TUTTI_WORLD_SIZE=$2 timeout -k 5 60 "$bench" -b 4 -e 1M -f 16 \
            -n 3 -w 1 -c >"$work/$1-$r.txt" 2>&1 &
        pids+=($!)
    done
    local rc=0
    for p in "${pids[@]}"; do
        wait "$p" || rc=1
    done
    pids=()
    return $rc
}

for job in first second; do
    t0=$(date +%s%N)
    run_job "$job" 3 || { tail -n 5 "$work/$job"-*.txt; fail "job $job through $url"; }
    rows=$(grep -cE '^ +[0-9]+ ' "$work/$job-0.txt")
    [ "$rows" -ge 4 ] || { cat "$work/$job-0.txt"; fail "job $job: $rows rows"; }
    echo "job $job: 3 ranks through the standalone $url, $rows sizes right, $((($(date +%s%N) - t0) / 1000000)) ms"
done

# 2. rank 0 told to host a server where the standalone one listens
port=${url##*:}
out="$work/hosted.txt"
t0=$(date +%s%N)
TUTTI_STORE_SERVER=1 TUTTI_JOB_ID=third TUTTI_RANK=0 TUTTI_WORLD_SIZE=2 timeout 60 "$bench" \
    -b 4 -e 4 -n 1 -w 0 >"$out" 2>&1
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc != 0 ] || { cat "$out"; fail "rank 0 hosted a server on a port that was taken"; }
grep -q "port $port: Address already in use (another server holds the port; ranks use a standalone tutti-store with TUTTI_STORE_SERVER=0)" "$out" ||
    { cat "$out"; fail "the error does not say what to set"; }
[ "$ms" -lt 10000 ] || fail "rank 0 took $ms ms to fail"
echo "rank 0 hosting on the taken port: exit $rc in $ms ms, the error names TUTTI_STORE_SERVER=0"

# 3. localhost with two addresses
if [ "$(id -u)" != 0 ] || ! unshare -m --propagation private true 2>/dev/null ||
    ! python3 -c "import socket; socket.socket(socket.AF_INET6).bind(('::1', 0))" 2>/dev/null; then
    echo "no mount namespace or no IPv6 loopback here: localhost as ::1 and 127.0.0.1 not checked"
    echo "test_store_standalone: ok"
    exit 0
fi
printf '::1 localhost\n127.0.0.1 localhost\n' >"$work/hosts"
v6() { unshare -m --propagation private sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$work/hosts" "$@"; }
out="$work/held.txt"
t0=$(date +%s%N)
v6 timeout 10 "$store_bin" --host localhost --port "$port" >"$out" 2>&1
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc = 1 ] && grep -q "localhost port $port: Address already in use at 127.0.0.1 (another server" "$out" ||
    { cat "$out"; fail "a server on localhost started on a port held at 127.0.0.1: exit $rc"; }
echo "a second server on localhost:$port (held at 127.0.0.1): exit $rc in $ms ms"
kill "$server" && wait "$server" 2>/dev/null
start_store store6 unshare -m --propagation private sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' \
    "$work/hosts" "$store_bin" --host localhost --port 0
port6=${url##*:}
pids=()
r=0
for u in "tcp://127.0.0.1:$port6" "tcp://[::1]:$port6"; do
    TUTTI_STORE=$u TUTTI_JOB_ID=fourth TUTTI_RANK=$r TUTTI_WORLD_SIZE=2 timeout -k 5 60 "$bench" \
        -b 4 -e 64K -n 2 -w 1 -c >"$work/fourth-$r.txt" 2>&1 &
    pids+=($!)
    r=$((r + 1))
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
pids=()
[ $rc = 0 ] || { tail -n 5 "$work"/fourth-*.txt; fail "ranks through 127.0.0.1 and ::1 of localhost:$port6"; }
echo "two ranks through 127.0.0.1:$port6 and [::1]:$port6 of one server on localhost"
kill "$server" && wait "$server" 2>/dev/null
server=
# a lone :: is dual-stack, as before: 127.0.0.1 reaches it
start_store store7 "$store_bin" --host :: --port 0
python3 -c "import socket, sys
socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=2).close()" "${url##*:}" ||
    fail "a server on :: is not reached at 127.0.0.1"
echo "a server on :: reached at 127.0.0.1:${url##*:}"
echo "test_store_standalone: ok"
