#!/usr/bin/env bash
# Two hosts as network namespaces joined by a veth pair; ranks 0 and 1 on host A, rank 2
# on host B, over tcp with TUTTI_TCP_CONGESTION unset (auto). The link between ranks 0
# and 1 never leaves host A: it must run reno from its first packet (set on the sockets
# before connecting, so that the system's algorithm never started it). The links to rank
# 2 leave the host: they must end on the system's (the namespaces', net.ipv4.
# tcp_congestion_control; where that is reno, cubic is set there first, and where that is
# refused the test cannot tell the two apart and skips).
# tutti-bench -c checks the allreduce's results (exit 1 on a wrong value). Each rank's
# TUTTI_DEBUG=trace log says what the transport set on each link, once the kernel took it.
#
#   tests/test_netns_tcp.sh BUILD/bench/tutti-bench   (root and iproute2; 77, skipped,
#                                                      without them)
set -u
build=$(dirname "$(dirname "$(realpath "$1")")")
cd "$(dirname "$0")/.."
. bench/netns-lib.sh
netns_require test_netns_tcp
netns_setup test-netns-tcp "$build" bench/tutti-bench
sys=$(ip netns exec "${NS[0]}" cat /proc/sys/net/ipv4/tcp_congestion_control)
if [ "$sys" = reno ]; then
    for i in 0 1; do
        ip netns exec "${NS[$i]}" sysctl -qw net.ipv4.tcp_congestion_control=cubic || {
            echo "test_netns_tcp: the system's congestion control is reno, and cubic cannot be set: skipped"
            exit 77
        }
    done
    sys=cubic
fi
store="$WORK/store"
mkdir -p "$store"
host=(0 0 1)
for r in 0 1 2; do
    h=${host[$r]}
    ip netns exec "${NS[$h]}" timeout 60 env TUTTI_DEBUG=trace TUTTI_TRANSPORT=tcp \
        TUTTI_RANK=$r TUTTI_WORLD_SIZE=3 TUTTI_STORE="file://$store" TUTTI_JOB_ID="netns-tcp-$TAG" \
        TUTTI_HOST_ID="host$h" TUTTI_SOCKET_IFNAME="${DEV[$h]}" TUTTI_TIMEOUT_MS=20000 \
        "$BIN" -b 4 -e 4M -f 16 -n 5 -w 1 -c >"$WORK/out-$r.txt" 2>&1 &
    PIDS+=($!)
done
netns_wait "the 3 ranks" "$WORK"/out-*.txt || exit 1

fail=0
expect() { # rank peer line-tail
    local want="tcp: rank $1: congestion control $3"
    want=${want/@/ on the link to rank $2}
    if ! grep -qF "$want" "$WORK/out-$1.txt"; then
        echo "test_netns_tcp: rank $1's link to rank $2: no \"$want\" in its log:"
        grep "congestion" "$WORK/out-$1.txt" || echo "  (no congestion control line)"
        fail=1
    fi
}
for r in 0 1; do
    expect $r $((1 - r)) "reno@ (it stays on this host), from its first packet"
    expect $r 2 "$sys@ (the system's: it leaves this host)"
    expect 2 $r "$sys@ (the system's: it leaves this host)"
done
[ "$fail" = 0 ] && echo "test_netns_tcp: ok ($sys between the hosts)"
exit "$fail"
