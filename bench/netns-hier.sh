#!/bin/bash
# Flat ring against hier on two "hosts": two network namespaces joined by a link whose
# both ends are rate-limited (tbf; a veth pair, or with DELAY a delay line), 2 ranks in
# each (shm within a namespace, tcp across it), one 64 MiB size of one collective
# (allreduce unless COLL says), in alternating runs; prints each run's busbw and the
# median hier/flat ratio with its spread. Needs root, ip and tc (iproute2).
#
#   bench/netns-hier.sh [BUILD_DIR] [PAIRS]       (defaults: build, 5)
#   env: RATE (1gbit), BURST (256kb), DELAY (none; e.g. 1ms: the link is then
#        tutti-netdelay's, see netns-lib.sh), SIZE (64M), ITERS (5), PLACE (blocked: ranks
#        0,1 | 2,3; interleaved: ranks 0,2 | 1,3), COLL (allreduce; allgather and
#        reduce_scatter have hier too), FLAT (the flat algorithm it runs against: ring)
#
# Everything it makes (two namespaces, the link between them, a store directory) goes
# on every exit path; traffic stays on that link (and on the namespaces' loopbacks):
# they have no other interface and no route out.
set -euo pipefail

BUILD=${1:-build}
PAIRS=${2:-5}
RATE=${RATE-1gbit}
SIZE=${SIZE:-64M}
ITERS=${ITERS:-5}
PLACE=${PLACE:-blocked}
COLL=${COLL:-allreduce}
FLAT=${FLAT:-ring}
# shellcheck source=bench/netns-lib.sh
. "$(dirname "$0")/netns-lib.sh"
netns_setup netns-hier "$BUILD" bench/tutti-bench

# host of rank r (0 or 1)
host_of() {
    if [ "$PLACE" = interleaved ]; then echo $(($1 % 2)); else echo $(($1 / 2)); fi
}

# One job of 4 ranks with algorithm $1, run name $2: its busbw (GB/s, out of place, from
# the mean time) in BW
run_job() {
    local algo=$1 run=$2 store="$WORK/store-$2"
    mkdir -p "$store"
    PIDS=()
    for r in 0 1 2 3; do
        local h
        h=$(host_of $r)
        ip netns exec "${NS[$h]}" env TUTTI_RANK=$r TUTTI_WORLD_SIZE=4 \
            TUTTI_STORE="file://$store" TUTTI_JOB_ID="netns-hier-$TAG-$run" \
            TUTTI_HOST_ID="netns-host-$h" TUTTI_SOCKET_IFNAME="${DEV[$h]}" \
            "$BIN" -b "$SIZE" -e "$SIZE" -n "$ITERS" -w 1 -c --coll "$COLL" --algo "$algo" \
            --json "$WORK/r$r-$run.json" >"$WORK/out-$r-$run.txt" 2>&1 &
        PIDS+=($!)
    done
    netns_wait "$algo run $run" "$WORK"/out-*-"$run".txt
    BW=$(python3 - "$WORK/r0-$run.json" "$algo" <<'EOF'
import json, sys
row = json.load(open(sys.argv[1]))[-1]
for mode in ("out_of_place", "in_place"):
    if row[mode]["wrong"]:
        sys.exit("netns-hier: %s: %d wrong elements (%s)" % (sys.argv[2], row[mode]["wrong"], mode))
if row["algo"] != sys.argv[2]:
    sys.exit("netns-hier: asked for %s, ran %s" % (sys.argv[2], row["algo"]))
print("%.4f" % row["out_of_place"]["busbw_gbps"])
EOF
    )
}

echo "# netns-hier: 2 namespaces x 2 ranks, $(netns_describe), $SIZE $COLL, hier against $FLAT,"
echo "# $PAIRS pairs of runs ($ITERS iterations each), placement $PLACE, $(uname -r)"
ratios=()
for ((k = 0; k < PAIRS; k++)); do
    # alternate which goes first, so drift does not favour one
    if ((k % 2)); then order=(hier "$FLAT"); else order=("$FLAT" hier); fi
    declare -A bw=()
    for a in "${order[@]}"; do
        run_job "$a" "$k-$a"
        bw[$a]=$BW
    done
    ratio=$(python3 -c "print('%.3f' % (${bw[hier]} / ${bw[$FLAT]}))")
    ratios+=("$ratio")
    printf 'pair %d: %s %s GB/s, hier %s GB/s, ratio %s\n' "$k" "$FLAT" "${bw[$FLAT]}" \
        "${bw[hier]}" "$ratio"
    unset bw
done
python3 - "$FLAT" "${ratios[@]}" <<'EOF'
import statistics, sys
r = sorted(float(x) for x in sys.argv[2:])
print("hier/%s busbw: median %.3f, min %.3f, max %.3f over %d pairs"
      % (sys.argv[1], statistics.median(r), r[0], r[-1], len(r)))
EOF
