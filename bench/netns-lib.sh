# Two "hosts" for the bench/netns-*.sh scripts (sourced, not run): two network namespaces
# joined by a link, optionally rate-limited (tbf on both ends) and delayed.
#
#   netns_setup NAME BUILD PROG checks BUILD/PROG (BIN: its full path), makes NS[0..1]
#                               (namespaces), DEV[0..1] (their link's ends), ADDR[0..1],
#                               WORK (a directory), TAG (unique to this run), and the EXIT
#                               trap that removes them all
#   netns_wait WHAT FILES...    waits for the ranks (PIDS, which the trap kills first); if
#                               one failed, prints WHAT and the FILES (their outputs), and
#                               returns 1
#   env: RATE (tbf rate each way, e.g. 1gbit; empty or 0: none), BURST (256kb: tbf needs
#        about rate / HZ, or it runs far below rate), DELAY (e.g. 1ms or 500us, one way:
#        the link is then build/tools/tutti-netdelay's TUN devices instead of a veth pair,
#        as this kernel has no netem), SPIN_US (netdelay's busy wait before each release,
#        0 by default: it would take CPU from the ranks)
#
# Traffic stays on the link between the two namespaces (and on their loopbacks): they
# have no other interface and no route out.

NETNS_NAME=netns
PIDS=()
ND_PID=

netns_cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    # the ranks: every process in our namespaces is one of ours
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    if [ -n "$ND_PID" ]; then kill "$ND_PID" 2>/dev/null || true; fi
    for ns in "${NS[@]}"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
    done
    wait 2>/dev/null || true
    # what is not our child (a daemon a test started through nsenter: slurmctld) may still
    # be writing into WORK: up to 5 s for the namespaces to empty, then SIGKILL
    local left _
    for _ in $(seq 50); do
        left=$(for ns in "${NS[@]}"; do ip netns pids "$ns" 2>/dev/null; done)
        [ -z "$left" ] && break
        sleep .1
    done
    for p in $left; do kill -KILL "$p" 2>/dev/null || true; done
    for ns in "${NS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$WORK"
    exit "$rc"
}

# DELAY in microseconds (1ms, 250us, 0.5ms, or a plain number of microseconds)
netns_delay_us() {
    python3 - "$1" <<'EOF'
import re, sys
m = re.fullmatch(r"([0-9.]+)(us|ms|s)?", sys.argv[1])
if not m:
    sys.exit("DELAY=%s: expected e.g. 1ms, 500us or 0" % sys.argv[1])
print(round(float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2) or "us"]))
EOF
}

# The delay line between the namespaces: TUN devices DEV[0..1] that tutti-netdelay holds
netns_delay_link() {
    local nd us
    nd=$(realpath "$1/tools/tutti-netdelay")
    [ -x "$nd" ] || { echo "$NETNS_NAME: no $nd (build first)" >&2; exit 2; }
    us=$(netns_delay_us "$DELAY")
    "$nd" --ns-a "${NS[0]}" --dev-a "${DEV[0]}" --ns-b "${NS[1]}" --dev-b "${DEV[1]}" \
        --delay-us "$us" --spin-us "${SPIN_US:-0}" >"$WORK/netdelay.out" 2>"$WORK/netdelay.err" &
    ND_PID=$!
    for _ in $(seq 100); do
        grep -q ready "$WORK/netdelay.out" 2>/dev/null && return 0
        kill -0 "$ND_PID" 2>/dev/null || break
        sleep 0.05
    done
    echo "$NETNS_NAME: tutti-netdelay did not start:" >&2
    cat "$WORK/netdelay.err" >&2
    exit 1
}

# A test's guard: root, iproute2 and a network namespace of its own, else it is skipped
# (exit 77) saying why.
netns_require() {
    if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
        echo "$1: needs root and iproute2: skipped"
        exit 77
    fi
    if ! ip netns add "tth-probe-$$" 2>/dev/null; then
        echo "$1: cannot make a network namespace here: skipped"
        exit 77
    fi
    ip netns del "tth-probe-$$"
}

netns_setup() {
    NETNS_NAME=$1
    BIN=$(realpath "$2/$3")
    [ -x "$BIN" ] || { echo "$NETNS_NAME: no $BIN (build first)" >&2; exit 2; }
    if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
        echo "$NETNS_NAME: needs ip and tc (iproute2)" >&2
        exit 2
    fi
    [ "$(id -u)" = 0 ] || { echo "$NETNS_NAME: needs root (network namespaces)" >&2; exit 2; }
    TAG=$$
    NS=(tth-a-$TAG tth-b-$TAG)
    DEV=(tthva$TAG tthvb$TAG)
    ADDR=(10.213.7.1 10.213.7.2)
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/$NETNS_NAME.XXXXXX")
    trap netns_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap 'exit 129' HUP

    for i in 0 1; do ip netns add "${NS[$i]}"; done
    if [ -n "${DELAY:-}" ]; then
        netns_delay_link "$2"
    else
        ip link add "${DEV[0]}" type veth peer name "${DEV[1]}"
        for i in 0 1; do ip link set "${DEV[$i]}" netns "${NS[$i]}"; done
    fi
    for i in 0 1; do
        ip -n "${NS[$i]}" link set lo up
        ip -n "${NS[$i]}" addr add "${ADDR[$i]}/24" dev "${DEV[$i]}"
        ip -n "${NS[$i]}" link set "${DEV[$i]}" up
        # both directions: each end shapes what it sends
        if [ -n "${RATE:-}" ] && [ "$RATE" != 0 ]; then
            ip netns exec "${NS[$i]}" tc qdisc add dev "${DEV[$i]}" root tbf rate "$RATE" \
                burst "${BURST:-256kb}" latency 100ms
        fi
    done
}

netns_wait() {
    local what=$1 rc=0
    shift
    for p in "${PIDS[@]}"; do wait "$p" || rc=$?; done
    PIDS=()
    if [ "$rc" != 0 ]; then
        echo "$NETNS_NAME: $what failed (exit $rc):" >&2
        cat "$@" >&2
        return 1
    fi
}

# What the link is, for the scripts' headers
netns_describe() {
    local what="veth"
    [ -n "${DELAY:-}" ] && what="tutti-netdelay link, $DELAY each way"
    if [ -n "${RATE:-}" ] && [ "$RATE" != 0 ]; then
        what="$what, tbf $RATE each way"
    fi
    echo "$what"
}
