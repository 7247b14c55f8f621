#!/usr/bin/env bash
# bench/peers/run-peers.sh --from: the ratio table and its summary from a results file
# whose figures are chosen here, so every ratio is worked by hand below: per repeat,
# tutti's p50 over the best peer's (the peer with the lowest median over repeats), the
# median of those ratios and their range; a case is above in every repeat when the lowest
# ratio is over 1, and above by the median only when the median is over 1 and some
# repeat is not.
#   test_peers_report.sh RUN_PEERS
set -u
run_peers=$1
tmp=$(mktemp -d /tmp/test-peers-report.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

raw=$tmp/raw
mkdir "$raw"
cat >"$raw/meta" <<'EOF'
repeats=3
ranks_list=2
colls=allreduce
transports=tcp
bands=4:64:10:1
mode=small
check=-c
fresh=--fresh
window=--window
bind=0
root_of=0
peers=tutti\ ompi\ mpich
started=2026-11-30\ 00:00\ UTC
elapsed=60
EOF
: >"$raw/notes"
# system ranks coll family size p50 mean p99 wrong repeat
row() { printf '%s 2 allreduce tcp %s %s %s %s 0 %s\n' "$1" "$2" "$3" "$3" "$3" "$4"; }
{
    # 4 B: tutti / Open MPI 10/12, 10/11, 10/20 = 0.833, 0.909, 0.5: median 0.833, at or below
    row tutti_tcp 4 10 1; row tutti_tcp 4 10 2; row tutti_tcp 4 10 3
    row ompi_tcp 4 12 1; row ompi_tcp 4 11 2; row ompi_tcp 4 20 3
    # 16 B: 12/10, 12/11, 12/8 = 1.2, 1.09, 1.5: above in every repeat
    row tutti_tcp 16 12 1; row tutti_tcp 16 12 2; row tutti_tcp 16 12 3
    row ompi_tcp 16 10 1; row ompi_tcp 16 11 2; row ompi_tcp 16 8 3
    # 64 B: 10/12, 10/9, 10/8 = 0.833, 1.11, 1.25: above by the median only
    row tutti_tcp 64 10 1; row tutti_tcp 64 10 2; row tutti_tcp 64 10 3
    row ompi_tcp 64 12 1; row ompi_tcp 64 9 2; row ompi_tcp 64 8 3
    # 256 B: 10/10, 10/9, 10/11 = 1, 1.11, 0.909: median 1, at (not above) the best peer
    row tutti_tcp 256 10 1; row tutti_tcp 256 10 2; row tutti_tcp 256 10 3
    row ompi_tcp 256 10 1; row ompi_tcp 256 9 2; row ompi_tcp 256 11 3
    # MPICH slower everywhere by its median (not the best peer), though its third
    # repeat at 16 B (5) is below every other figure there
    for s in 4 16 64 256; do row mpich_tcp $s 100 1; row mpich_tcp $s 100 2; row mpich_tcp $s 5 3; done
    # a failed check (wrong 3) does not count: counted, it would stand for repeat 3 at 4 B
    # (10 / 20 becoming 1000 / 20) and move the median to 0.909
    printf 'tutti_tcp 2 allreduce tcp 4 1000 1000 1000 3 3\n'
} >"$raw/results"
# --window's late calls per run (system, left out, timed): summed per system, sorted
printf 'tutti_tcp 2 200\nompi_tcp 0 200\ntutti_tcp 1 200\nmpich_tcp 7 200\n' >"$raw/window"

out=$tmp/out/tables.md
"$run_peers" --from "$raw" -o "$out" >"$tmp/stdout" 2>"$tmp/stderr" ||
    fail "run-peers.sh --from exited $?: $(cat "$tmp/stderr")"
[ -s "$out" ] || fail "no $out"

expect() { grep -qxF -- "$1" "$out" || fail "expected the line '$1' in $out; it has:
$(sed -n '/^## Ratios/,/^## allreduce/p' "$out")"; }
expect "| 4 B | 0.833 (0.5-0.909) ompi tcp |"
expect "| 16 B | 1.2 (1.09-1.5) ompi tcp |"
expect "| 64 B | 1.11 (0.833-1.25) ompi tcp |"
expect "| 256 B | 1 (0.909-1.11) ompi tcp |"
expect "At or below the best peer: **2 of 4** cases."
expect "- above it in every repeat (the lowest paired ratio over 1): 1: allreduce np2 16 B 1.2 (1.09-1.5) ompi tcp"
expect "- above by the median only, repeats either way: 1: allreduce np2 64 B 1.11 (0.833-1.25) ompi tcp"
expect "mpich_tcp 7 of 200; ompi_tcp 0 of 200; tutti_tcp 3 of 400."
grep -q "then waited for the call's start, one instant on every rank (--window)" "$out" ||
    fail "the header does not say --window: $(head -n 12 "$out")"
echo "ok: ratio table and summary"

# Two runs of one method, one report (--from twice): the 2-rank broadcast was measured in
# both, and the later run's rows are the ones taken (5/10 = 0.5 there, not run 1's 2/1).
raw2=$tmp/raw2
mkdir "$raw2"
sed 's/^started=.*/started=2026-11-30\\ 01:00\\ UTC/' "$raw/meta" >"$raw2/meta"
: >"$raw2/notes"
brow() { printf '%s 2 broadcast tcp 4 %s %s %s 0 %s\n' "$1" "$2" "$2" "$2" "$3"; }
for r in 1 2 3; do brow tutti_tcp 2 "$r"; brow ompi_tcp 1 "$r"; done >>"$raw/results"
for r in 1 2 3; do brow tutti_tcp 5 "$r"; brow ompi_tcp 10 "$r"; done >"$raw2/results"
# late calls that name their case: run 1's broadcast ones go with its rows (not taken);
# its allreduce ones and run 2's count (rows that name no case, as before, all count)
printf 'tutti_tcp 40 100 - - 2 broadcast tcp
ompi_tcp 30 100 3 6 2 broadcast tcp
' >>"$raw/window"
printf 'tutti_tcp 5 100 - - 2 allreduce tcp
' >>"$raw/window"
printf 'tutti_tcp 1 100 2 6 2 broadcast tcp
ompi_tcp 0 100 - - 2 broadcast tcp
' >"$raw2/window"
"$run_peers" --from "$raw" --from "$raw2" -o "$out" >"$tmp/stdout" 2>"$tmp/stderr" ||
    fail "run-peers.sh --from --from exited $?: $(cat "$tmp/stderr")"
expect "mpich_tcp 7 of 200; ompi_tcp 0 of 300; tutti_tcp 9 of 600."
expect "tutti_tcp 2 of 6."
expect "| size | allreduce np2 | broadcast np2 |"
expect "| 4 B | 0.833 (0.5-0.909) ompi tcp | 0.5 (0.5-0.5) ompi tcp |"
expect "At or below the best peer: **3 of 5** cases."
expect "- run 1 also measured broadcast np=2 tcp: taken from run 2"
grep -q "^Generated by .* from 2 runs of one method (started 2026-11-30 00:00 UTC; 2026-11-30 01:00 UTC;" \
    "$out" || fail "the header does not name both runs: $(head -n 3 "$out")"
[ ! -e "$raw2/cells" ] || fail "--from twice wrote into a run's own dir"
# Another method (3 repeats against 5): refused, nothing written.
sed 's/^repeats=3/repeats=5/' "$raw2/meta" >"$raw2/meta.new" && mv "$raw2/meta.new" "$raw2/meta"
rm -f "$out"
if "$run_peers" --from "$raw" --from "$raw2" -o "$out" >"$tmp/stdout" 2>"$tmp/stderr"; then
    fail "runs of two methods were merged"
fi
grep -q "ran another method than .* (repeats: '5' against '3'): not merged" "$tmp/stderr" ||
    fail "no reason given: $(cat "$tmp/stderr")"
[ ! -e "$out" ] || fail "a report was written for runs of two methods"
echo "ok: two runs, one report"
