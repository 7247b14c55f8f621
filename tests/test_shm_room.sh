#!/usr/bin/env bash
# The shm transport in a small /dev/shm, as a container has (Docker's default is 64 MiB),
# here a tmpfs mounted over /dev/shm in a mount namespace of the test's own:
#   1. 16 ranks in 64 MiB: their default rings (1 MiB a direction, 240 MiB in all) do
#      not fit; set-up shrinks them (a warning says so) and allreduce and alltoall give
#      right results (tutti-bench -c checks every element, exit 1 on a wrong one).
#   2. 16 ranks in 1 MiB: not even the smallest rings fit. With --transport shm, init
#      fails with an error that says how much /dev/shm has and what to do, and nothing is
#      left in /dev/shm, though the launcher SIGKILLed ranks in the middle of their
#      set-up. With the transport left to auto, every rank's shm set-up fails, they go
#      over tcp instead (one warning says so) and the results are right.
#      In a 16 KiB /dev/shm that error gives its sizes in KiB (not "0.0 MiB").
#   3. Names a rank SIGKILLed in its set-up would leave (made here, named as the
#      transport names them): the next job's set-up removes those whose creator is gone
#      and was in this pid namespace, and keeps those of a live process or (recent ones)
#      of another pid namespace.
#
#   4. 8 ranks in 64 MiB: the world and four split groups (pairs, halves, quads, strided:
#      tests/shm_groups.c), set up by disjoint groups at once: every group's first
#      allreduce gives the right sum (each group's rings are reserved in its set-up on a
#      small /dev/shm, so one that finds no room fails set-up and goes over tcp; before,
#      set-up passed and the pairs' first allreduce failed on every rank, out of room).
#
#   tests/test_shm_room.sh BUILD/bench/tutti-bench BUILD/tools/tutti-run BUILD/tests/shm_groups
#                                  (root and unshare; 77, skipped, without them)
set -u
bench=$(realpath "$1")
run=$(realpath "$2")
groups=$(realpath "$3")
if [ -z "${TTH_SHM_ROOM_NS:-}" ]; then
    if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null ||
        ! unshare -m --propagation private true 2>/dev/null; then
        echo "test_shm_room: needs root and a mount namespace: skipped"
        exit 77
    fi
    TTH_SHM_ROOM_NS=1 exec unshare -m --propagation private "$0" "$@"
fi
work=$(mktemp -d)
cleanup() {
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
    grep -q "WARN shm: rings of [0-9]* KiB instead of 1024 KiB" "$out" ||
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
grep -q "/dev/shm has [0-9.]* [KM]iB of 1.0 MiB free; enlarge it (docker run --shm-size) or set TUTTI_TRANSPORT=tcp" "$out" ||
    { cat "$out"; fail "no error that names /dev/shm's room and the way out"; }
[ "$(left)" = 0 ] || { ls /dev/shm; fail "the launcher's job left $(left) names in /dev/shm"; }
echo "16 ranks in 1 MiB over shm: exit $rc, $(grep -c 'enlarge it' "$out") ranks said why, /dev/shm empty after"
# a tiny /dev/shm (16 KiB): its sizes in KiB, not "need 0.1 MiB ... has 0.0 of 0.0 MiB"
room 16k
out="$work/tiny.txt"
timeout 60 "$bench" -np 2 --transport shm -b 4 -e 4 -n 1 -w 0 -t 50 >"$out" 2>&1
rc=$?
[ $rc != 0 ] || { cat "$out"; fail "2 ranks in 16 KiB ran"; }
grep -q "shm: the 2 ranks on this host need [0-9.]* KiB for rings of [0-9]* KiB: /dev/shm has [0-9.]* KiB of 16.0 KiB free" "$out" ||
    { cat "$out"; fail "the sizes of a 16 KiB /dev/shm are not given in KiB"; }
echo "2 ranks in 16 KiB over shm: $(grep -o 'need [0-9.]* KiB' "$out" | head -1), sizes in KiB"
room 1m
# the same with the transport left to auto: shm fails on every local rank, and they all
# meet again over tcp (one warning, from the host's first rank)
out="$work/fallback.txt"
timeout 120 "$bench" -np 16 -b 4 -e 64K -f 16 -n 3 -w 1 -c -t 100 >"$out" 2>&1
rc=$?
[ $rc = 0 ] || { cat "$out"; fail "16 ranks in 1 MiB, auto: exit $rc"; }
grep -q "WARN transports: shm could not connect the 15 local peers (.*); they go over tcp instead" "$out" ||
    { cat "$out"; fail "auto: no warning that the local peers went over tcp"; }
[ "$(grep -c 'they go over tcp' "$out")" = 1 ] || { cat "$out"; fail "auto: more than one rank warned"; }
grep -q "^# cost model table tcp" "$out" || { cat "$out"; fail "auto: the job did not run over tcp"; }
[ "$(left)" = 0 ] || { ls /dev/shm; fail "auto: names left in /dev/shm"; }
echo "16 ranks in 1 MiB, auto: $(grep -cE '^ +[0-9]+ ' "$out") sizes right over tcp; one warning"

# 3. names that ranks SIGKILLed in their set-up left (made here the way the transport names
# them: "tutti-shm-<pid>-<nonce>-...", the nonce's high half the creator's pid namespace)
room 64m
ns=$(stat -Lc %i /proc/self/ns/pid)
here=$(printf %08x "$ns")
other=$(printf %08x $((ns ^ 1)))
sleep 0 &
dead=$!
wait $dead
gone=()
for sfx in bell wake 1 2; do # a rank of this pid namespace whose process is gone: removed
    gone+=("/dev/shm/tutti-shm-$dead-${here}0badf00d-$sfx")
done
kept=("/dev/shm/tutti-shm-$dead-${other}0badf00d-bell" # another pid namespace, just made
    "/dev/shm/tutti-shm-$$-${here}0badf00d-bell")      # a process alive (this script)
for f in "${gone[@]}" "${kept[@]}"; do
    head -c 8192 /dev/zero >"$f" || fail "cannot make $f"
done
out="$work/next.txt"
TUTTI_DEBUG=info timeout 60 "$bench" -np 2 --transport shm -b 4 -e 64K -f 16 -n 3 -w 1 -c -t 50 \
    >"$out" 2>&1
rc=$?
[ $rc = 0 ] || { cat "$out"; fail "the next job: exit $rc"; }
for f in "${gone[@]}"; do
    [ ! -e "$f" ] || { cat "$out"; fail "$f (its creator gone) is still there"; }
done
for f in "${kept[@]}"; do
    [ -e "$f" ] || { cat "$out"; fail "$f was removed"; }
    rm -f "$f"
done
removed=$(grep -o "shm: removed [0-9]* names" "$out" | awk '{s += $3} END {print s + 0}')
[ "$removed" = ${#gone[@]} ] || { cat "$out"; fail "the job's ranks said they removed $removed names"; }
[ "$(left)" = 0 ] || { ls /dev/shm; fail "$(left) names in /dev/shm after the next job"; }
echo "the next job ran right and removed the ${#gone[@]} names of a gone creator, not those of another pid namespace or of a live one"

# 4. the world and four split groups of 8 ranks in 64 MiB
room 64m
out="$work/groups.txt"
TUTTI_TIMEOUT_MS=60000 timeout 120 "$run" -np 8 "$groups" >"$out" 2>&1
rc=$?
[ $rc = 0 ] || { cat "$out"; fail "8 ranks' split groups in 64 MiB: exit $rc"; }
[ "$(grep -c ': ok: world' "$out")" = 8 ] || { cat "$out"; fail "split groups: not 8 ranks ok"; }
[ "$(left)" = 0 ] || { ls /dev/shm; fail "split groups: names left in /dev/shm"; }
echo "8 ranks' world and 4 split groups in 64 MiB: every first allreduce right ($(grep -m1 'rank 0:' "$out"))"
echo "test_shm_room: ok"
