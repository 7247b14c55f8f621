#!/usr/bin/env bash
# bench/peers/run-peers.sh's handling of a run that does not end: one that printed its
# last line ("# Window: ...") and then hangs in its teardown is stopped after the grace,
# its rows kept and no hang counted; one that hangs before it is killed at the band's
# limit, noted, counted, and after two such hangs not run again at that rank count.
# The system under the harness is a stand-in for tutti-bench (--build DIR/bench), so
# that each way of ending is chosen here.
#   test_peers_hang.sh RUN_PEERS
set -u
run_peers=$1
tmp=$(mktemp -d /tmp/test-peers-hang.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir -p "$tmp/build/bench"
# Prints one data row of tutti-bench's layout (size count type redop root, then the
# out-of-place and in-place halves: time algbw busbw #wrong p50 p99), then as $FAKE says:
# ok (the window line, exit), teardown (the window line, hang), hang (hang before it).
cat >"$tmp/build/bench/tutti-bench" <<'EOF'
#!/bin/sh
echo "# stand-in for tutti-bench"
echo "           4            1    f32    sum    -1       2.00    0.002    0.002       0       2.00       3.00       1.50    0.003    0.003       0       1.50       2.50"
[ -n "${PIDS:-}" ] && echo $$ >>"$PIDS" # the same pid after the exec below
[ "$FAKE" = hang ] && exec sleep 60
echo "# Window: 0 of 10 timed calls left out (a rank late for its start); widest gap 60 us; 0 of 2 halves slept between calls"
[ "$FAKE" = teardown ] && exec sleep 60
exit 0
EOF
chmod +x "$tmp/build/bench/tutti-bench"

run() { # NAME MODE REPEATS BAND TIMEOUT: run-peers with the stand-in, raw outputs in $tmp/raw-NAME
    local t0=$SECONDS
    FAKE=$2 RUN_PEERS_EXIT_GRACE=1 "$run_peers" --build "$tmp/build" --peers tutti --ranks 2 --colls allreduce \
        --transports tcp --bands "$4" -R "$3" --run-timeout "$5" --keep \
        -o "$tmp/$1.md" >"$tmp/$1.out" 2>"$tmp/$1.err" || fail "$1: run-peers.sh exited $?"
    took=$((SECONDS - t0))
    raw=$(sed -n 's/^raw outputs kept in //p' "$tmp/$1.err")
    [ -d "$raw" ] || fail "$1: no raw dir in $(cat "$tmp/$1.err")"
    mv "$raw" "$tmp/raw-$1"
}

# A run that exits: its row, no note, no wait beyond the run itself.
run ok ok 2 4:4:10:1 4
[ "$(wc -l <"$tmp/raw-ok/results")" = 2 ] || fail "ok: rows $(cat "$tmp/raw-ok/results")"
! grep -v gnuplot "$tmp/raw-ok/notes" | grep -q . || fail "ok: notes $(cat "$tmp/raw-ok/notes")"
[ "$took" -lt 10 ] || fail "ok: took $took s for two runs that exit at once"
# the page fault's cost before and after (bench/fault-probe.c, built by hand here: the
# stand-in build has none), in us
for v in fault_us_start fault_us_end; do
    grep -Eq "^$v=[0-9]+[.][0-9]+\$" "$tmp/raw-ok/meta" ||
        fail "ok: no $v in meta: $(cat "$tmp/raw-ok/meta")"
done
grep -q '^A page fault took [0-9.]* us before the run and [0-9.]* after it' "$tmp/ok.md" ||
    fail "ok: the report does not give the page fault's cost: $(head -n 5 "$tmp/ok.md")"

# Teardown hangs: each stopped about a second after its last line, long before the 4 s
# limit; both rows kept (in-place p50 1.50, mean 1.50, p99 2.50), two notes, no hang.
run teardown teardown 3 4:4:10:1 4
awk '$1 == "tutti_tcp" && $5 == 4 && $6 == "1.50" && $7 == "1.50" && $8 == "2.50"' \
    "$tmp/raw-teardown/results" | wc -l | grep -qx 3 ||
    fail "teardown: rows $(cat "$tmp/raw-teardown/results")"
[ "$(grep -c 'printed its last line but had not exited 1 s later: stopped, its rows kept' \
    "$tmp/raw-teardown/notes")" = 3 ] || fail "teardown: notes $(cat "$tmp/raw-teardown/notes")"
! grep -q 'failed\|hung' "$tmp/raw-teardown/notes" ||
    fail "teardown counted as a failure: $(cat "$tmp/raw-teardown/notes")"
[ "$took" -lt 30 ] || fail "teardown: took $took s (each run should stop 1-2 s after its last line)"

# Hangs before the last line: killed at 2 s twice (rows printed before it still kept),
# then the system is not run again at 2 ranks: the third repeat costs nothing.
run hang hang 3 4:4:10:1 2
[ "$(grep -c 'tutti_tcp allreduce np=2 4..4 repeat [12] failed (rc 124)' \
    "$tmp/raw-hang/notes")" = 2 ] || fail "hang: notes $(cat "$tmp/raw-hang/notes")"
grep -q 'tutti_tcp np=2 hung twice (killed at 2 s): not run again at 2 ranks' \
    "$tmp/raw-hang/notes" || fail "hang: no drop note: $(cat "$tmp/raw-hang/notes")"
[ ! -e "$tmp/raw-hang/tutti_tcp.allreduce.np2.tcp.b4.r3.txt" ] || fail "hang: repeat 3 ran"
[ "$(wc -l <"$tmp/raw-hang/results")" = 2 ] || fail "hang: rows $(cat "$tmp/raw-hang/results")"
if [ "$took" -lt 4 ] || [ "$took" -ge 30 ]; then fail "hang: took $took s (two 2 s limits)"; fi

# A band above 64 MiB: the limit is the timeout times its largest size over 64 MiB,
# 4 x 2 s at 256 MiB (without the rule: 2 s and the script's own second or two).
run big hang 1 256M:256M:3:1 2
grep -q 'tutti_tcp allreduce np=2 256M..256M repeat 1 failed (rc 124)' "$tmp/raw-big/notes" ||
    fail "big: notes $(cat "$tmp/raw-big/notes")"
if [ "$took" -lt 8 ] || [ "$took" -ge 40 ]; then fail "big: took $took s (an 8 s limit)"; fi
# Interrupted (INT as from Ctrl-C, TERM as from a job's limit) while a band's run hangs
# with 60 s left: the script stops it (not left running in the background), exits
# 128 + the signal within seconds, and keeps the raw outputs with the row printed.
# perl starts it with SIGINT at its default: a background job of this non-interactive
# shell would inherit it ignored, and a shell cannot trap what it was started ignoring.
interrupt() { # SIGNAL NUMBER
    local t0=$SECONDS pid rc=0 raw
    : >"$tmp/pids-$1"
    PIDS="$tmp/pids-$1" FAKE=hang perl -e '$SIG{INT} = "DEFAULT"; exec @ARGV or die' \
        "$run_peers" --build "$tmp/build" --peers tutti --ranks 2 --colls allreduce \
        --transports tcp --bands 4:4:10:1 -R 1 --run-timeout 60 \
        -o "$tmp/int-$1.md" >"$tmp/int-$1.out" 2>"$tmp/int-$1.err" &
    pid=$!
    for _ in $(seq 100); do [ -s "$tmp/pids-$1" ] && break; sleep 0.1; done
    [ -s "$tmp/pids-$1" ] || { kill -KILL "$pid"; fail "$1: the stand-in never started"; }
    sleep 0.5
    kill -"$1" "$pid"
    wait "$pid" || rc=$?
    [ "$rc" = "$2" ] || fail "$1: run-peers.sh exited $rc, not $2: $(cat "$tmp/int-$1.err")"
    [ $((SECONDS - t0)) -lt 20 ] || fail "$1: took $((SECONDS - t0)) s to stop"
    sleep 0.5
    if kill -0 "$(cat "$tmp/pids-$1")" 2>/dev/null; then
        kill -KILL "$(cat "$tmp/pids-$1")"
        fail "$1: the band's run was left running after run-peers.sh exited"
    fi
    raw=$(sed -n "s/^run-peers: interrupted (SIG$1); to report what was measured: .* --from //p" \
        "$tmp/int-$1.err")
    [ -d "$raw" ] || fail "$1: raw outputs not kept: $(cat "$tmp/int-$1.err")"
    mv "$raw" "$tmp/raw-int-$1"
    grep -q '^ *4 ' "$tmp/raw-int-$1/tutti_tcp.allreduce.np2.tcp.b4.r1.txt" ||
        fail "$1: the run's row is not in its kept log"
}
interrupt INT 130
interrupt TERM 143
echo "OK: exit at once, teardown hangs stopped with rows kept, hangs killed and dropped, interrupts stop the run"
