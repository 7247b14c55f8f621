#!/usr/bin/env bash
# The address choice without TUTTI_SOCKET_IFNAME, and NCCL's and gloo's variables for it:
# in a network namespace of the test's own with two links, "docker7" (a container
# bridge's name, made first so that it comes first in the list) and "ethq9", the unique
# id's store (tests/uid_print) and the tcp transport (tutti-bench's log) must take ethq9:
# a real interface before a virtual one (they took the first listed, docker7). Then
# NCCL_SOCKET_IFNAME (prefixes, as ours) and GLOO_SOCKET_IFNAME (exact names, as gloo's)
# choose where TUTTI_SOCKET_IFNAME is unset,
# TUTTI_SOCKET_IFNAME wins over them, and a choice that matches nothing names the
# variable it came from.
#
#   tests/test_ifname.sh BUILD/tests/uid_print BUILD/bench/tutti-bench   (root and
#                                                      iproute2; 77, skipped, without them)
set -u
uid=$(realpath "$1")
bench=$(realpath "$2")
cd "$(dirname "$0")/.."
. bench/netns-lib.sh
netns_require test_ifname
TAG=$$
NS=(tth-if-$TAG)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/test_ifname.XXXXXX")
trap netns_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
ns=${NS[0]}
setup() { "$@" || { echo "test_ifname: set-up failed: $*"; exit 1; }; }
setup ip netns add "$ns"
setup ip -n "$ns" link set lo up
setup ip -n "$ns" link add docker7 type veth peer name dkx7
setup ip -n "$ns" link add ethq9 type veth peer name eqx9
setup ip -n "$ns" addr add 10.77.0.1/24 dev docker7
setup ip -n "$ns" addr add 10.99.0.1/24 dev ethq9
for d in docker7 dkx7 ethq9 eqx9; do setup ip -n "$ns" link set "$d" up; done
# nothing of the caller's choices (nor a log file: the checks read stderr and its log)
unset TUTTI_SOCKET_IFNAME NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME TUTTI_DEBUG_FILE

fails=0
run() { # run ENV... : uid_print in the namespace with only these interface variables
    ip netns exec "$ns" env -u TUTTI_SOCKET_IFNAME -u NCCL_SOCKET_IFNAME -u GLOO_SOCKET_IFNAME \
        "$@" timeout 20 "$uid" 2>&1
}
expect() { # expect WANT ENV...
    local want=$1 got
    shift
    got=$(run "$@")
    if ! grep -qF -- "$want" <<<"$got"; then
        echo "test_ifname: with ${*:-no variable}: expected \"$want\", got: $got"
        fails=$((fails + 1))
    fi
}
expect "tcp://10.99.0.1:"
expect "tcp://10.77.0.1:" NCCL_SOCKET_IFNAME=docker
expect "tcp://10.77.0.1:" GLOO_SOCKET_IFNAME=docker7
expect "no interface matches GLOO_SOCKET_IFNAME=docker " GLOO_SOCKET_IFNAME=docker
expect "tcp://10.99.0.1:" TUTTI_SOCKET_IFNAME=ethq NCCL_SOCKET_IFNAME=docker
expect "tcp://127.0.0.1:" GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=
expect "no interface matches NCCL_SOCKET_IFNAME=nonesuch" NCCL_SOCKET_IFNAME=nonesuch

# the tcp transport's own choice: each rank's log names its address
tcp_expect() { # tcp_expect WANT ENV...
    local want=$1 store job
    shift
    store=$(mktemp -d "$WORK/store.XXXX")
    job="ifname-$TAG-$RANDOM"
    for r in 0 1; do
        ip netns exec "$ns" env -u TUTTI_SOCKET_IFNAME -u NCCL_SOCKET_IFNAME \
            -u GLOO_SOCKET_IFNAME "$@" TUTTI_DEBUG=info TUTTI_TRANSPORT=tcp TUTTI_RANK=$r \
            TUTTI_WORLD_SIZE=2 TUTTI_STORE="file://$store" TUTTI_JOB_ID="$job" \
            TUTTI_TIMEOUT_MS=20000 timeout 60 "$bench" -b 4 -e 4K -n 2 -w 1 -c \
            >"$store/out-$r.txt" 2>&1 &
        PIDS+=($!)
    done
    if ! netns_wait "tutti-bench with ${*:-no variable}" "$store"/out-*.txt; then
        fails=$((fails + 1))
    elif ! grep -q "listens on $want" "$store/out-0.txt"; then
        echo "test_ifname: tcp with ${*:-no variable}: expected \"listens on $want\":"
        grep "listens on" "$store/out-0.txt"
        fails=$((fails + 1))
    fi
}
NETNS_NAME=test_ifname
tcp_expect "10.99.0.1:"
tcp_expect "10.77.0.1:" GLOO_SOCKET_IFNAME=docker7

[ "$fails" = 0 ] && echo "test_ifname: every choice as expected"
exit $((fails ? 1 : 0))
