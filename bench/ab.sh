#!/usr/bin/env bash
# ab.sh: two tutti-bench builds (A, say main before a change, and B after it) in
# alternating runs, A B B A A B ..., for each rank count and transport; per size, the median of
# each side's p50 times and the median B/A ratio with its spread (min..max over the pairs).
# Only ratios from the same run mean anything on a shared machine.
#
#   bench/ab.sh A/tutti-bench B/tutti-bench [-p PAIRS] [--ranks "2 4"]
#               [--transports "tcp shm"] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS]
#               [--coll NAME] [--in-place] [--fresh] [--window] [-o FILE]
# The statistic is the out-of-place half's p50, or with --in-place the in-place half's
# (what run-peers compares for allreduce, broadcast and reduce_scatter). --fresh passes
# tutti-bench's --fresh (each rank rewrites its input, then a barrier, before every call);
# --window its --window (every rank starts each timed call at one instant, no barrier).
set -u
a=$1 b=$2
shift 2
pairs=5 ranks="2 4" transports="tcp shm" min=8 max=16M factor=16 iters=100 coll=allreduce
out=/dev/stdout col=10 fresh= window=
while [ $# -gt 0 ]; do
    case "$1" in
    -p) pairs=$2; shift ;;
    --ranks) ranks=$2; shift ;;
    --transports) transports=$2; shift ;;
    -b) min=$2; shift ;;
    -e) max=$2; shift ;;
    -f) factor=$2; shift ;;
    -n) iters=$2; shift ;;
    --coll) coll=$2; shift ;;
    --in-place) col=16 ;;
    --fresh) fresh=--fresh ;;
    --window) window=--window ;;
    -o) out=$2; shift ;;
    *) echo "ab.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
if [ "$col" = 16 ] && [ "$coll" = neighbor_alltoall ]; then
    echo "ab.sh: neighbor_alltoall has no in-place half (tutti-bench prints its one)" >&2
    exit 2
fi
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
for p in $(seq 1 "$pairs"); do
    for n in $ranks; do
        for t in $transports; do
            # A B in odd pairs, B A in even ones: neither side always runs first
            order="A B"
            [ $((p % 2)) = 0 ] && order="B A"
            for side in $order; do
                bin=$a
                [ $side = B ] && bin=$b
                # p50 of the out-of-place half (column 10) or the in-place one (16)
                timeout 600 "$bin" -np "$n" --transport "$t" --coll "$coll" -b "$min" -e "$max" \
                    -f "$factor" -n "$iters" -w 10 $fresh $window 2>/dev/null |
                    awk -v c="$col" '!/^#/ && NF >= c {print $1, $c}' >"$raw/$n.$t.$side.$p"
            done
        done
    done
done
python3 - "$raw" "$pairs" "$ranks" "$transports" >"$out" <<'EOF'
import statistics as st, sys
raw, pairs, ranks, tps = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
def load(path):
    try:
        return {int(l.split()[0]): float(l.split()[1]) for l in open(path) if l.strip()}
    except (OSError, ValueError):
        return {}
print("| ranks | transport | size (B) | A p50 (us) | B p50 (us) | B/A median | B/A min..max | pairs |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for n in ranks:
    for t in tps:
        runs = [(load(f"{raw}/{n}.{t}.A.{p}"), load(f"{raw}/{n}.{t}.B.{p}")) for p in range(1, pairs + 1)]
        sizes = sorted(set().union(*[set(x) & set(y) for x, y in runs]))
        for s in sizes:
            ok = [(x[s], y[s]) for x, y in runs if s in x and s in y and x[s] > 0]
            if not ok:
                continue
            r = [y / x for x, y in ok]
            print(f"| {n} | {t} | {s} | {st.median([x for x, _ in ok]):.2f} | "
                  f"{st.median([y for _, y in ok]):.2f} | {st.median(r):.2f} | "
                  f"{min(r):.2f}..{max(r):.2f} | {len(ok)} |")
EOF
