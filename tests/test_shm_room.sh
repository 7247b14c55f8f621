#!/usr/bin/env bash
# The shm transport in a small /dev/shm, as a container has (Docker's default is 64 MiB),
# here a tmpfs mounted over /dev/shm in a mount namespace of the test's own:
#   1. 16 ranks in 64 MiB: their default rings (1 MiB a direction, 240 MiB in all) do
#      not fit; set-up shrinks them (a warning says so) and allreduce and alltoall give
#      right results (tutti-bench -c checks every element, exit 1 on a wrong one).
#   2. 16 ranks in 1 MiB: not even the smallest rings fit. init fails with an error that
#      says how much /dev/shm has and what to do, and nothing is left in /dev/shm,
#      though the launcher SIGKILLed ranks in the middle of their set-up.
#   3. The same job started rank by rank from this script and SIGKILLed when the first
#      rank fails (as torchrun stops a job): its names stay in /dev/shm, and the next
#      job's set-up removes them.
#
#   tests/test_shm_room.sh BUILD/bench/tutti-bench   (root and unshare; 77, skipped,
#                                                     without them)
set -u
bench=$(realpath "$1")
if [ -z "${TTH_SHM_ROOM_NS:-}" ]; then
    if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null ||
        ! unshare -m --propagation private true 2>/dev/null; then
        echo "test_shm_room: needs root and a mount namespace: skipped"
        exit 77
    fi
    TTH_SHM_ROOM_NS=1 exec unshare -m --propagation private "$0" "$@"
fi
work=$(mktemp -d)
pids=()
cleanup() {
    [ ${#pids[@]} -gt 0 ] && kill -9 "${pids[@]}" 2>/dev/null
    umount /dev/shm 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "test_shm_room: FAIL: $*"
    exit 1
}
room() { # a fresh tmpfs of $1 over /dev/shm (the one before, if any, goes first)
    umount /dev/shm 2>/dev/null
    mount -t tmpfs -o "size=$1" tmpfs /dev/shm || fail "cannot mount a tmpfs on /dev/shm"
}
left() { find /dev/shm -mindepth 1 | wc -l; }
export TUTTI_SOCKET_IFNAME=lo

# 1. 16 ranks in 64 MiB
room 64m
for coll in allreduce alltoall; do
    out="$work/fit-$coll.txt"
    timeout 120 "$bench" -np 16 --transport shm --coll "$coll" -b 4 -e 1M -f 16 -n 3 -w 1 -c \
        -t 100 >"$out" 2>&1
    rc=$?
    [ $rc = 0 ] || { cat "$out"; fail "16 ranks in 64 MiB, $coll: exit $rc"; }
    rows=$(grep -cE '^ +[0-9]+ ' "$out")
    [ "$rows" -ge 3 ] || { cat "$out"; fail "$coll: $rows rows"; }
    grep -q "WARN shm: rings of [0-9]* KiB instead of 1024" "$out" ||
        { cat "$out"; fail "$coll: no warning that the rings shrank"; }
    [ "$(left)" = 0 ] || { ls /dev/shm; fail "$coll: names left in /dev/shm"; }
    echo "16 ranks in 64 MiB, $coll: $rows sizes right; $(grep -o 'rings of [0-9]* KiB' "$out" | head -1)"
done

# 2. 16 ranks in 1 MiB, through the launcher
room 1m
out="$work/nofit.txt"
timeout 120 "$bench" -np 16 --transport shm -b 4 -e 4 -n 1 -w 0 -t 100 >"$out" 2>&1
rc=$?
[ $rc != 0 ] || { cat "$out"; fail "16 ranks in 1 MiB ran"; }
grep -q "/dev/shm has [0-9.]* of 1.0 MiB free; enlarge it (docker run --shm-size) or set TUTTI_TRANSPORT=tcp" "$out" ||
    { cat "$out"; fail "no error that names /dev/shm's room and the way out"; }
[ "$(left)" = 0 ] || { ls /dev/shm; fail "the launcher's job left $(left) names in /dev/shm"; }
echo "16 ranks in 1 MiB: exit $rc, $(grep -c 'enlarge it' "$out") ranks said why, /dev/shm empty after"

# 3. the same job, rank by rank, SIGKILLed at the first failure
mkdir -p "$work/store"
for r in $(seq 0 15); do
    TUTTI_RANK=$r TUTTI_WORLD_SIZE=16 TUTTI_STORE="file://$work/store" \
        TUTTI_JOB_ID="test-shm-room-$$" TUTTI_TRANSPORT=shm TUTTI_TIMEOUT_MS=20000 \
        "$bench" -b 4 -e 4 -n 1 -w 0 >"$work/rank-$r.txt" 2>&1 &
    pids+=($!)
done
# the first to end (a failure: there is no room) stops the rest, within 60 s in all
( sleep 60; kill -9 "${pids[@]}" ) >/dev/null 2>&1 &
watchdog=$!
wait -n "${pids[@]}"
kill -9 "${pids[@]}" 2>/dev/null
wait "${pids[@]}" 2>/dev/null
pkill -P "$watchdog" 2>/dev/null
kill "$watchdog" 2>/dev/null
pids=()
stale=$(left)
echo "the job stopped rank by rank left $stale names in /dev/shm"
[ "$stale" -gt 0 ] || { echo "test_shm_room: the killed job left nothing to sweep (its ranks all ended on their own?)"; tail -n 3 "$work"/rank-*.txt; fail "no names to sweep"; }
# the next job, in the room they leave: its set-up removes them (same pid namespace: at once)
out="$work/next.txt"
TUTTI_DEBUG=info timeout 60 "$bench" -np 2 --transport shm -b 4 -e 64K -f 16 -n 3 -w 1 -c -t 50 \
    >"$out" 2>&1
rc=$?
[ $rc = 0 ] || { cat "$out"; fail "the next job: exit $rc"; }
grep -q "shm: removed [0-9]* names from /dev/shm" "$out" || { cat "$out"; fail "the next job removed nothing"; }
[ "$(left)" = 0 ] || { ls /dev/shm; fail "$(left) names still in /dev/shm after the next job"; }
echo "the next job (2 ranks) ran right and $(grep -o 'removed [0-9]* names' "$out" | paste -sd, -); /dev/shm empty after"
echo "test_shm_room: ok"
