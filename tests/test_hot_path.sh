#!/usr/bin/env bash
# The code gcc makes for the small calls' entry points (no timing: what the instructions
# are). coll_issue is inlined into each entry point so that the call descriptor stays in
# registers and the collective's fill is inlined; session 99 put an opaque call before the
# descriptor's first read and gcc then built the descriptor with `rep stosq` and called
# the fill through tt_coll_table (+7-9% on a 4-byte allreduce over shm, unnoticed for a
# session: docs/benchmarks.md, "The hundredth session"). Checked here, in the entry points
# of the blocking and async calls a training loop makes:
#   - no `rep stos` (a constant-size memset of a struct; ~20 ns on this VM's EPYC),
#   - no indirect call through tt_coll_table (the fill, the collective known).
#
#   tests/test_hot_path.sh BUILD/lib/libtutti.so
# Skipped (77) without objdump.
set -u
lib=$1
command -v objdump >/dev/null || { echo "test_hot_path: no objdump: skipped"; exit 77; }
dis=$(mktemp)
trap 'rm -f "$dis"' EXIT
objdump -d --no-show-raw-insn "$lib" >"$dis" || { echo "test_hot_path: FAIL: objdump $lib"; exit 1; }
bad=0
for fn in tutti_allreduce tutti_allreduce_async tutti_broadcast tutti_broadcast_async \
    tutti_barrier tutti_barrier_async; do
    body=$(awk -v f="<$fn>:" '$2 == f {on = 1; next} on && /^[0-9a-f]+ <.*>:$/ {exit} on' "$dis")
    if [ -z "$body" ]; then
        echo "test_hot_path: FAIL: $fn not found in $lib"
        bad=1
        continue
    fi
    if grep -q "rep stos" <<<"$body"; then
        echo "test_hot_path: FAIL: $fn zeroes memory with rep stos:"
        grep -B3 "rep stos" <<<"$body" | head -8
        bad=1
    fi
    if grep -E "call +\*.*<tt_coll_table" <<<"$body" | grep -q .; then
        echo "test_hot_path: FAIL: $fn calls through tt_coll_table (the fill not inlined):"
        grep -E "call +\*.*<tt_coll_table" <<<"$body" | head -3
        bad=1
    fi
    # the entry point has a body worth checking (a jump to a shared copy would pass)
    n=$(wc -l <<<"$body")
    [ "$n" -ge 20 ] || { echo "test_hot_path: FAIL: $fn has $n instructions (not inlined?)"; bad=1; }
done
[ $bad = 0 ] && echo "test_hot_path: OK"
exit $bad
