#!/bin/bash
# 2 namespaces, 1 rank each, tcp over their link (the system's congestion control, bbr
# here): this build (new) against main before (old, OLD=path to its tutti-bench) in
# alternating runs: allreduce p50 (out of place, in place) per size.
#   netns-ab.sh PAIRS "gapflags"   env: OLD, RATE, DELAY as netns-lib.sh
cd /work/main
PAIRS=$1; G=$2
. bench/netns-lib.sh
netns_setup netns-ab build-rel bench/tutti-bench
echo "# $(netns_describe), gap flags: $G"
run() { # arm binary round
    local store="$WORK/store-$1-$3"; mkdir -p "$store"; PIDS=()
    for r in 0 1; do
        ip netns exec "${NS[$r]}" timeout 300 env TUTTI_RANK=$r TUTTI_WORLD_SIZE=2 TUTTI_STORE="file://$store" \
            TUTTI_JOB_ID="netns-ab-$TAG-$1-$3" TUTTI_HOST_ID="h$r" TUTTI_SOCKET_IFNAME="${DEV[$r]}" \
            "$2" -b 16K -e 4M -f 4 -n 30 --fresh $G >"$WORK/out-$r-$1-$3.txt" 2>&1 &
        PIDS+=($!)
    done
    netns_wait "$1 run $3" "$WORK"/out-*-"$1"-"$3".txt || return 1
    awk -v r=$3 -v a=$1 'NF>10 && $1!~/#/{print r, a, $1, $10, $16}' "$WORK/out-0-$1-$3.txt"
}
for ((k = 1; k <= PAIRS; k++)); do
    if ((k % 2)); then run new "$BIN" $k; run old "$OLD" $k; else run old "$OLD" $k; run new "$BIN" $k; fi
done
