#!/usr/bin/env bash
# tutti-bench's arguments and its -c check; tutti-store's --host; tutti-run's host slots.
#   1. bad usage exits 2 with a message saying why, before any rank starts: an offset
#      that splits an element, an algorithm --coll does not have, a bitwise op on floats,
#      a root past the ranks (with -np, and from the environment's world), -e of " -1"
#      or near SIZE_MAX, a size range holding no whole element, -c where the bench's
#      inputs would not stay exact (int8 avg at 128 ranks, bf16 avg at 129), -d/-o all,
#      -c 2; nccl-tests' -c 0|1 is taken; a barrier's -c says it checks nothing;
#   2. -c finds results a wrong library would give (tests/bench_shim.c, LD_PRELOAD):
#      reduce_scatter returning another rank's block, an allreduce reversed, an
#      out-of-place allreduce that writes nothing after its first call, each at 3 and 4
#      ranks (exit 1, FAILED), and passes the library's own (0 OK);
#   3. tutti-store --host [::1] listens on ::1, a malformed host exits 2;
#   4. tutti-run refuses a host given more than 2^20 slots over its entries (-H and
#      --hostfile, 2049 entries of 2^20 slots: the total overflowed an int), at once.
#   5. --json that cannot be written whole (a file size limit, as a full disk) leaves an
#      earlier file as it was and no temporary file; one written whole replaces it.
#   test_bench_args.sh TUTTI_BENCH TUTTI_RUN TUTTI_STORE SHIM|none
set -u
bench=$1 run=$2 store=$3 shim=$4
fail() { echo "FAIL: $*" >&2; exit 1; }
work=$(mktemp -d /tmp/test-bench-args.XXXXXX)
trap 'rm -rf "$work"' EXIT
out=$work/out

# usage WANT-IN-STDERR ARGS...: tutti-bench ARGS exits 2 saying WANT
usage() {
    local want=$1
    shift
    timeout 20 "$bench" "$@" >"$out" 2>&1
    local rc=$?
    [ $rc = 2 ] || fail "tutti-bench $*: exit $rc, expected 2: $(tail -n 3 "$out")"
    grep -q -- "$want" "$out" || fail "tutti-bench $*: no '$want' in: $(tail -n 3 "$out")"
    ! grep -q "^# tutti-bench" "$out" || fail "tutti-bench $*: ran before refusing"
}
usage "not a multiple of the 4-byte" -np 2 --offset 3 -n 1
usage 'unknown algorithm "nosuch"' -np 2 --algo nosuch -n 1
usage 'tree sets no algorithm of allreduce (--coll): give one of its algorithms: ring' -np 2 --algo tree -n 1
usage "sets no algorithm of allreduce" -np 2 --algo broadcast:tree -n 1
usage 'unknown broadcast algorithm "bogus"' -np 2 --algo 'allreduce:ring;broadcast:bogus' -n 1
usage "needs an integer dtype" -np 2 -d float -o bxor -n 1
usage "root 2 out of range for 2 ranks" -np 2 -r 2 -n 1
# the world from the environment: refused once the store is open, before any init
TUTTI_RANK=0 TUTTI_WORLD_SIZE=2 TUTTI_STORE="file://$work/store" \
    usage "root 5 out of range for 2 ranks" -r 5 -n 1
usage "bad value for -e" -np 2 -e " -1" -n 1
usage "more than the bench can allocate" -np 2 -e 18446744073709551615 -n 1
usage "more than the bench can allocate" -np 2 -e 18446744073709547520 -n 1
usage "holds a whole element per rank (16 B" -np 4 --coll allgather -b 8 -e 8 -c
usage "holds a whole element (8 B)" -np 2 -b 1 -e 7 -d double -c
usage "avg of i8 over 128 ranks cannot be checked" -np 128 -d int8 -o avg -c
usage "avg of bf16 over 129 ranks cannot be checked" -np 129 -d bf16 -o avg -c
usage "-d all (nccl-tests' sweep" -np 2 -d all
usage "-o all (nccl-tests' sweep" -np 2 -o all
usage "unknown argument 2" -np 2 -c 2
usage "bad value for --check" -np 2 --check=yes

# ok ARGS...: tutti-bench ARGS exits 0
ok() {
    timeout 60 "$bench" "$@" -t 50 >"$out" 2>&1 || fail "tutti-bench $*: exit $?: $(tail -n 3 "$out")"
}
small=(-b 48 -e 3K -f 4 -n 2 -w 1)
ok -np 2 -c 1 "${small[@]}"
grep -q "^# Out of bounds values : 0 OK" "$out" || fail "-c 1: not checked"
ok -np 2 -c 0 "${small[@]}"
! grep -q "Out of bounds" "$out" || fail "-c 0: checked"
ok -np 2 --algo allreduce:rd@\<1K,ring -c "${small[@]}"
grep -q "^# Out of bounds values : 0 OK" "$out" || fail "--algo allreduce:rd@<1K,ring: wrong"
ok -np 3 --algo ring -c -d int8 -o avg "${small[@]}"
grep -q "^# Out of bounds values : 0 OK" "$out" || fail "int8 avg: wrong"
ok -np 3 --coll barrier -c -n 2 -w 0
grep -q "^# Out of bounds values : N/A (a barrier moves no data" "$out" ||
    fail "barrier -c: $(grep 'Out of' "$out")"

# -c against a broken library (and the same runs on the library itself)
if [ "$shim" = none ]; then
    echo "skipped: -c against tests/bench_shim.c (a sanitizer's build: no LD_PRELOAD)"
else
    for np in 3 4; do
        for m in wrongblock:reduce_scatter reverse:allreduce stale:allreduce; do
            MODE=${m%%:*} LD_PRELOAD=$shim timeout 60 "$bench" -np $np --coll ${m#*:} -c \
                "${small[@]}" -t 50 >"$out" 2>&1
            rc=$?
            [ $rc = 1 ] && grep -q "^# Out of bounds values : [1-9][0-9]* FAILED" "$out" ||
                fail "MODE=${m%%:*} ${m#*:} at $np ranks: exit $rc, not caught: $(grep -v '^ ' "$out" | tail -n 3)"
        done
        for coll in reduce_scatter allreduce; do
            ok -np $np --coll $coll -c "${small[@]}"
            grep -q "^# Out of bounds values : 0 OK" "$out" || fail "$coll at $np ranks: wrong"
        done
    done
fi

# tutti-store --host: an IPv6 address in brackets; bad usage exits 2
timeout 20 "$store" --host "" --port 0 >"$out" 2>&1
[ $? = 2 ] && grep -q "bad host" "$out" || fail "tutti-store --host '': $(cat "$out")"
timeout 20 "$store" --port 0 --client-quota 2M --memory-limit 1M >"$out" 2>&1
[ $? = 2 ] || fail "tutti-store quota over the memory limit: not bad usage: $(cat "$out")"
if [ -e /proc/net/if_inet6 ] && ip -6 addr show dev lo 2>/dev/null | grep -q '::1'; then
    timeout 2 "$store" --host "[::1]" --port 0 >"$out" 2>&1
    grep -q "listening on tcp://\[::1\]:" "$out" || fail "tutti-store --host [::1]: $(cat "$out")"
else
    echo "skipped: tutti-store --host [::1] (no IPv6 loopback)"
fi

# tutti-run: the slots of one host over all its entries at most 2^20
timeout 20 "$run" -H localhost:1048576,localhost:1 -np 1 -- true >"$out" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "at most 1048576 on a host" "$out" || fail "-H 2^20 + 1 slots: exit $rc: $(cat "$out")"
for i in $(seq 2049); do echo "localhost:1048576"; done >"$work/hostfile"
timeout 20 "$run" --hostfile "$work/hostfile" -np 1 -- true >"$out" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "at most 1048576 on a host" "$out" ||
    fail "--hostfile of 2049 x 2^20 slots: exit $rc: $(tail -n 3 "$out")"

# --json: written to a temporary file and renamed; a write that fails (a 1 KiB file size
# limit, SIGXFSZ ignored: as a full disk, EFBIG for ENOSPC) leaves the earlier file
json=$work/out.json
head -c 3000 /dev/zero | tr '\0' x >"$json"
(
    trap '' XFSZ
    ulimit -f 1
    exec timeout 60 "$bench" -np 2 -b 4 -e 4K -f 2 -n 2 -w 1 --json "$json"
) 2>&1 </dev/null | cat >"$out" # the limit is the subshell's, not cat's
grep -q "tutti-bench: $json: File too large" "$out" || fail "--json over the limit: $(tail -n 3 "$out")"
[ "$(tr -d x <"$json" | wc -c)" = 0 ] && [ "$(wc -c <"$json")" = 3000 ] ||
    fail "--json that failed to write changed the earlier file ($(wc -c <"$json") bytes)"
! ls "$work" | grep -q "out.json.tmp" || fail "--json left $(ls "$work" | grep out.json.tmp)"
timeout 60 "$bench" -np 2 -b 4 -e 4K -f 2 -n 2 -w 1 --json "$json" >"$out" 2>&1 ||
    fail "--json: $(tail -n 3 "$out")"
[ "$(head -c 1 "$json")" = "[" ] && [ "$(grep -c '"coll"' "$json")" = 11 ] ||
    fail "--json did not replace the earlier file: $(head -c 200 "$json")"
echo "ok"
