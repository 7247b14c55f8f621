#!/bin/bash
# Flat ring against hier on two "hosts": two network namespaces joined by a veth pair
# whose both ends are rate-limited (tbf), 2 ranks in each (shm within a namespace, tcp
# across it), one 64 MiB allreduce size, in alternating runs; prints each run's busbw and
# the median hier/ring ratio with its spread. Needs root, ip and tc (iproute2).
#
#   bench/netns-hier.sh [BUILD_DIR] [PAIRS]       (defaults: build, 5)
#   env: RATE (1gbit), BURST (256kb: tbf needs about rate / HZ, or it runs far below
#        rate), SIZE (64M), ITERS (5), PLACE (blocked: ranks 0,1 | 2,3; interleaved:
#        ranks 0,2 | 1,3)
#
# Everything it makes (two namespaces, the veth pair inside them, a store directory)
# goes on every exit path; traffic stays on the veth between the two namespaces (and
# on their loopbacks): they have no other interface and no route out. netem is absent
# from this kernel, so no delay is added: the link is rate-limited only.
set -euo pipefail

BUILD=${1:-build}
PAIRS=${2:-5}
RATE=${RATE:-1gbit}
BURST=${BURST:-256kb}
SIZE=${SIZE:-64M}
ITERS=${ITERS:-5}
PLACE=${PLACE:-blocked}
BENCH=$(realpath "$BUILD/bench/tutti-bench")
[ -x "$BENCH" ] || { echo "netns-hier: no $BENCH (build first)" >&2; exit 2; }
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    echo "netns-hier: needs ip and tc (iproute2)" >&2
    exit 2
fi
[ "$(id -u)" = 0 ] || { echo "netns-hier: needs root (network namespaces)" >&2; exit 2; }

tag=$$
NS=(tth-a-$tag tth-b-$tag)
DEV=(tthva$tag tthvb$tag)
ADDR=(10.213.7.1 10.213.7.2)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/netns-hier.XXXXXX")
PIDS=()

cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    # the ranks: every process in our namespaces is one of ours
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for ns in "${NS[@]}"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
    done
    wait 2>/dev/null || true
    for ns in "${NS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

for i in 0 1; do ip netns add "${NS[$i]}"; done
ip link add "${DEV[0]}" type veth peer name "${DEV[1]}"
for i in 0 1; do ip link set "${DEV[$i]}" netns "${NS[$i]}"; done
for i in 0 1; do
    ip -n "${NS[$i]}" link set lo up
    ip -n "${NS[$i]}" addr add "${ADDR[$i]}/24" dev "${DEV[$i]}"
    ip -n "${NS[$i]}" link set "${DEV[$i]}" up
    # both directions: each end shapes what it sends
    ip netns exec "${NS[$i]}" tc qdisc add dev "${DEV[$i]}" root tbf rate "$RATE" \
        burst "$BURST" latency 100ms
done

# host of rank r (0 or 1)
host_of() {
    if [ "$PLACE" = interleaved ]; then echo $(($1 % 2)); else echo $(($1 / 2)); fi
}

# One job of 4 ranks with algorithm $1, run name $2: its busbw (GB/s, out of place, from
# the mean time) in BW
run_job() {
    local algo=$1 run=$2 store="$WORK/store-$2" rc=0
    mkdir -p "$store"
    PIDS=()
    for r in 0 1 2 3; do
        local h
        h=$(host_of $r)
        ip netns exec "${NS[$h]}" env TUTTI_RANK=$r TUTTI_WORLD_SIZE=4 \
            TUTTI_STORE="file://$store" TUTTI_JOB_ID="netns-hier-$tag-$run" \
            TUTTI_HOST_ID="netns-host-$h" TUTTI_SOCKET_IFNAME="${DEV[$h]}" \
            "$BENCH" -b "$SIZE" -e "$SIZE" -n "$ITERS" -w 1 -c --algo "$algo" \
            --json "$WORK/r$r-$run.json" >"$WORK/out-$r-$run.txt" 2>&1 &
        PIDS+=($!)
    done
    for p in "${PIDS[@]}"; do wait "$p" || rc=$?; done
    PIDS=()
    if [ "$rc" != 0 ]; then
        echo "netns-hier: $algo run $run failed (exit $rc):" >&2
        cat "$WORK"/out-*-"$run".txt >&2
        return 1
    fi
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

echo "# netns-hier: 2 namespaces x 2 ranks, veth with tbf $RATE each way, $SIZE allreduce,"
echo "# $PAIRS pairs of runs ($ITERS iterations each), placement $PLACE, $(uname -r)"
ratios=()
for ((k = 0; k < PAIRS; k++)); do
    # alternate which goes first, so drift does not favour one
    if ((k % 2)); then order=(hier ring); else order=(ring hier); fi
    declare -A bw=()
    for a in "${order[@]}"; do
        run_job "$a" "$k-$a"
        bw[$a]=$BW
    done
    ratio=$(python3 -c "print('%.3f' % (${bw[hier]} / ${bw[ring]}))")
    ratios+=("$ratio")
    printf 'pair %d: ring %s GB/s, hier %s GB/s, ratio %s\n' "$k" "${bw[ring]}" \
        "${bw[hier]}" "$ratio"
    unset bw
done
python3 - "${ratios[@]}" <<'EOF'
import statistics, sys
r = sorted(float(x) for x in sys.argv[1:])
print("hier/ring busbw: median %.3f, min %.3f, max %.3f over %d pairs"
      % (statistics.median(r), r[0], r[-1], len(r)))
EOF
