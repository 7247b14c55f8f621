#!/usr/bin/env bash
# tutti-bench --window (bench/stats.h): every rank starts timed call i at T0 + i x gap
# and times it from there. 3 ranks: a broadcast from the last rank with --fresh (each
# call's result checked by the bench against its own reference, exit 1 on a wrong value)
# and --algo all's rounds of an allreduce; the summary must count every timed call
# (rows x halves x iterations), the late ones left out, and the p50s be positive.
#   test_bench_window.sh TUTTI_BENCH
set -u
bench=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
out=$(mktemp /tmp/test-bench-window.XXXXXX)
trap 'rm -f "$out"' EXIT

# 4 B, 64 B, 1 KiB, 16 KiB: 4 rows x 2 halves x 25 calls
timeout 100 "$bench" -np 3 --coll broadcast -r 2 --fresh --window -c -b 4 -e 16K -f 16 -n 25 \
    -w 2 -t 90 >"$out" 2>&1 || fail "broadcast --window: exit $?: $(tail -n 5 "$out")"
grep -q "each started at one instant on every rank (--window)" "$out" ||
    fail "the header does not say --window: $(head -n 5 "$out")"
grep -q "^# Out of bounds values : 0 OK" "$out" || fail "broadcast --window: wrong values"
late=$(sed -n 's/^# Window: \([0-9]*\) of \([0-9]*\) timed calls.*/\1 \2/p' "$out")
[ -n "$late" ] || fail "no '# Window:' line: $(tail -n 4 "$out")"
set -- $late
[ "$2" = 200 ] || fail "broadcast --window timed $2 calls, expected 200"
# late calls depend on the scheduler (3 ranks on 2 CPUs, a sanitizer's build): some
# must have been timed (the bench fails a half whose every call was late)
[ "$1" -lt 200 ] || fail "broadcast --window: all 200 calls late"
late_b=$1
# every data row: size, then p50 (columns 10 and 16) over 0
awk '$1 ~ /^[0-9]+$/ { n++; if (!($10 > 0 && $16 > 0)) bad = bad " " $1 }
     END { exit !(n == 4 && bad == "") }' "$out" ||
    fail "broadcast --window: rows or p50s wrong: $(grep -v '^#' "$out")"

# --algo all: the algorithms take turns in rounds (7 calls in 5 rounds); 1 row
timeout 100 "$bench" -np 3 --coll allreduce --algo all --fresh --window -c -b 4K -e 4K -n 7 \
    -w 1 -t 90 >"$out" 2>&1 || fail "allreduce --algo all --window: exit $?: $(tail -n 5 "$out")"
grep -q "^# Out of bounds values : 0 OK" "$out" || fail "allreduce --algo all --window: wrong values"
late=$(sed -n 's/^# Window: \([0-9]*\) of \([0-9]*\) timed calls.*/\1 \2/p' "$out")
[ -n "$late" ] || fail "--algo all: no '# Window:' line"
set -- $late
# the column titles name the algorithms between "root" and "fastest": 7 calls each
nalgos=$(awk '/^# +size .* root / { for (i = 1; i <= NF; i++) { if ($i == "fastest") { print n; exit }
                                  if (on) n++; if ($i == "root") on = 1 } }' "$out")
[ "${nalgos:-0}" -ge 2 ] || fail "--algo all: no algorithms in the titles: $(grep size "$out")"
[ "$2" = $((7 * nalgos)) ] || fail "--algo all --window timed $2 calls, expected 7 x $nalgos"
# whether ranks sleep between timed calls follows the median warm-up call (bench/stats.h
# BENCH_WINDOW_SLEEP_US, 250 us), not the slowest: a 4-byte allreduce (tens of us in any
# build) does not sleep in either half, a 32 MiB one (ms) does in both
timeout 100 "$bench" -np 2 --coll allreduce --window -c -b 4 -e 4 -n 20 -w 9 -t 90 >"$out" 2>&1 ||
    fail "allreduce 4 B --window: exit $?: $(tail -n 5 "$out")"
grep -q "; 0 of 2 halves slept between calls" "$out" ||
    fail "allreduce 4 B: ranks slept between calls: $(grep '^# Window' "$out")"
timeout 100 "$bench" -np 2 --coll allreduce --window -c -b 32M -e 32M -n 3 -w 2 -t 90 >"$out" 2>&1 ||
    fail "allreduce 32 MiB --window: exit $?: $(tail -n 5 "$out")"
grep -q "; 2 of 2 halves slept between calls" "$out" ||
    fail "allreduce 32 MiB: ranks did not sleep between calls: $(grep '^# Window' "$out")"
# --gap US: calls at least US apart, the ranks asleep between them even where the calls
# are short; --gap-busy: awake (spinning) through the gap, even where they are long
gap_of() { sed -n 's/^# Window: .*widest gap \([0-9]*\) us;.*/\1/p' "$out"; }
timeout 100 "$bench" -np 2 --coll allreduce --gap 3000 -c -b 4 -e 4 -n 10 -w 3 -t 90 >"$out" 2>&1 ||
    fail "allreduce 4 B --gap 3000: exit $?: $(tail -n 5 "$out")"
grep -q "each started at one instant on every rank (--window)" "$out" ||
    fail "--gap does not imply --window: $(head -n 5 "$out")"
grep -q "; 2 of 2 halves slept between calls" "$out" ||
    fail "allreduce 4 B --gap 3000: ranks did not sleep: $(grep '^# Window' "$out")"
g=$(gap_of)
[ "${g:-0}" -ge 3000 ] || fail "allreduce 4 B --gap 3000: widest gap ${g:-none} us"
timeout 100 "$bench" -np 2 --coll allreduce --gap 3000 --gap-busy -c -b 32M -e 32M -n 3 -w 2 \
    -t 90 >"$out" 2>&1 || fail "allreduce 32 MiB --gap-busy: exit $?: $(tail -n 5 "$out")"
grep -q "; 0 of 2 halves slept between calls" "$out" ||
    fail "allreduce 32 MiB --gap-busy: ranks slept: $(grep '^# Window' "$out")"
grep -q "^# Out of bounds values : 0 OK" "$out" || fail "allreduce 32 MiB --gap-busy: wrong values"
# --fill-late: the rewrite just before each start; an in-place allreduce whose input were
# not rewritten would sum the last call's result again (the check compares the last
# timed call's result with the reference from fresh input)
timeout 100 "$bench" -np 2 --coll allreduce --fresh --gap 2000 --fill-late -c -b 64K -e 64K -n 5 \
    -w 2 -t 90 >"$out" 2>&1 || fail "allreduce --fill-late: exit $?: $(tail -n 5 "$out")"
grep -q "input rewritten just before each (--fill-late)" "$out" ||
    fail "the header does not say --fill-late: $(head -n 5 "$out")"
grep -q "^# Out of bounds values : 0 OK" "$out" || fail "allreduce --fill-late: wrong values"
awk '$1 ~ /^[0-9]+$/ { n++; if (!($10 > 0 && $16 > 0)) bad = 1 } END { exit !(n == 1 && !bad) }' \
    "$out" || fail "allreduce --fill-late: rows or p50s wrong: $(grep -v '^#' "$out")"
echo "ok: tutti-bench --window (broadcast: $late_b of 200 late; --algo all: $1 of $2)"
