#!/bin/bash
# Coalesced broadcast against one broadcast per tensor, ResNet-50's state (320 tensors,
# 102 MB; fuse-bench -set bcast), 2 ranks: one in each of two network namespaces joined
# by a delayed link (tutti-netdelay, see netns-lib.sh), then both on this host's
# loopback. Each run alternates the two ways ITERS times and gives each one's median;
# the script prints every run, then the medians over runs and the ratio's median, min
# and max. Needs root, ip and tc (iproute2).
#
#   bench/netns-coalesce.sh [BUILD_DIR] [RUNS]      (defaults: build, 5)
#   env: DELAY (1ms, one way), RATE (none; e.g. 1gbit), BURST (256kb), ITERS (5),
#        LOOPBACK (1: also run on loopback; 0: not), LO_TRANSPORT (tcp; empty: the
#        library's choice for local ranks). TUTTI_* variables reach the ranks (e.g.
#        TUTTI_COST_MODEL=probe).
#
# Everything it makes (two namespaces, the link between them, store directories) goes
# on every exit path; traffic stays on that link and on loopbacks.
set -euo pipefail

BUILD=${1:-build}
RUNS=${2:-5}
DELAY=${DELAY-1ms}
RATE=${RATE:-}
ITERS=${ITERS:-5}
LOOPBACK=${LOOPBACK:-1}
LO_TRANSPORT=${LO_TRANSPORT-tcp}
# shellcheck source=bench/netns-lib.sh
. "$(dirname "$0")/netns-lib.sh"
netns_setup netns-coalesce "$BUILD" bench/fuse-bench

# One fuse-bench line from run $1's output: "one coalesced" (ms) in MS; the run's
# results must have been checked (-c) and right
parse_run() {
    MS=$(python3 - "$1" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"broadcast one by one\s+([0-9.]+) ms\s+coalesced\s+([0-9.]+) ms\s+"
              r"speed-up\s+[0-9.]+\s+wrong 0\b", t)
if not m:
    sys.exit("netns-coalesce: no result in %s:\n%s" % (sys.argv[1], t))
print(m.group(1), m.group(2))
EOF
    )
}

# Run $1 across the link: rank r in namespace r
run_link() {
    local run=$1
    mkdir -p "$WORK/store-$run"
    PIDS=()
    for r in 0 1; do
        ip netns exec "${NS[$r]}" env TUTTI_RANK=$r TUTTI_WORLD_SIZE=2 \
            TUTTI_STORE="file://$WORK/store-$run" TUTTI_JOB_ID="netns-coalesce-$TAG-$run" \
            TUTTI_HOST_ID="netns-host-$r" TUTTI_SOCKET_IFNAME="${DEV[$r]}" \
            "$BIN" -set bcast -c -iters "$ITERS" >"$WORK/out-$r-$run.txt" 2>&1 &
        PIDS+=($!)
    done
    netns_wait "run $run" "$WORK"/out-*-"$run".txt
    parse_run "$WORK/out-0-$run.txt"
}

# Run $1 on loopback: fuse-bench starts both ranks
run_lo() {
    local run=$1
    if ! env ${LO_TRANSPORT:+TUTTI_TRANSPORT=$LO_TRANSPORT} TUTTI_JOB_ID="netns-coalesce-$TAG-$run" \
        "$BIN" -np 2 -set bcast -c -iters "$ITERS" >"$WORK/out-$run.txt" 2>&1; then
        echo "netns-coalesce: loopback run $run failed:" >&2
        cat "$WORK/out-$run.txt" >&2
        return 1
    fi
    parse_run "$WORK/out-$run.txt"
}

# RUNS runs of $1 (run_link or run_lo) labelled $2, then their summary
series() {
    local res=()
    for ((k = 0; k < RUNS; k++)); do
        "$1" "$2-$k"
        printf '%s run %d: one by one %s ms, coalesced %s ms\n' "$2" "$k" ${MS}
        res+=("$MS")
    done
    python3 - "$2" "${res[@]}" <<'EOF'
import statistics as st, sys
runs = [tuple(map(float, x.split())) for x in sys.argv[2:]]
one, co = [r[0] for r in runs], [r[1] for r in runs]
ratio = sorted(o / c for o, c in runs)
print("%s: one by one median %.1f ms (%.1f..%.1f), coalesced median %.1f ms (%.1f..%.1f), "
      "one/coalesced median %.2f (min %.2f, max %.2f) over %d runs"
      % (sys.argv[1], st.median(one), min(one), max(one), st.median(co), min(co), max(co),
         st.median(ratio), ratio[0], ratio[-1], len(runs)))
EOF
}

echo "# netns-coalesce: fuse-bench -set bcast, 2 ranks, $RUNS runs of $ITERS alternating"
echo "# iterations each, $(uname -r)"
echo "# link: 1 rank per namespace, $(netns_describe)"
series run_link link
if [ "$LOOPBACK" = 1 ]; then
    echo "# loopback: 2 local ranks, transport ${LO_TRANSPORT:-auto (the default)}"
    series run_lo loopback
fi
