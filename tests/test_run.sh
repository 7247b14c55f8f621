#!/usr/bin/env bash
# tutti-run: ranks get their variables and meet; a failing rank, a timeout and a bad
# command line each give the right exit status promptly; the temporary store goes away;
# no rank or grandchild outlives tutti-run's stopping them.
#   test_run.sh TUTTI_RUN LAUNCH_CHILD
set -u
run=$1 child=$2
tmp=$(mktemp -d /tmp/test-run.XXXXXX)
# a check that fails may leave its sleepers behind: they wrote their pids to $tmp/*.pid
cleanup() {
    for f in "$tmp"/*.pid; do [ -s "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
ms() { echo $(($(date +%s%N) / 1000000)); }
# a zombie counts as gone: whoever inherited it may be slow to reap it
alive() { [ -r "/proc/$1/stat" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null; }
gone_within_1s() {
    for _ in $(seq 20); do alive "$1" || return 0; sleep .05; done
    return 1
}

out=$(timeout 30 "$run" -np 3 "$child") || fail "3 ranks: exit $?"
[ "$(echo "$out" | grep -c ' of 3 ok')" = 3 ] || fail "3 ranks: output: $out"

out=$(timeout 30 "$run" -np 2 --tag -- "$child") || fail "--tag: exit $?"
echo "$out" | grep -q '^\[1\] rank 1 of 2 ok$' || fail "--tag: output: $out"

t0=$(date +%s)
timeout 30 "$run" -np 3 "$child" fail=1 2>$tmp/err; rc=$?
t1=$(date +%s)
[ "$rc" = 3 ] || fail "fail=1: exit $rc, expected 3 ($(cat $tmp/err))"
grep -q 'rank 1 exited with status 3' $tmp/err || fail "fail=1: no rank named: $(cat $tmp/err)"
[ $((t1 - t0)) -lt 20 ] || fail "fail=1 took $((t1 - t0)) s"

t0=$(date +%s)
timeout 30 "$run" -np 2 --timeout 2 "$child" hang 2>/dev/null; rc=$?
t1=$(date +%s)
[ "$rc" = 124 ] || fail "--timeout: exit $rc, expected 124"
[ $((t1 - t0)) -lt 15 ] || fail "--timeout took $((t1 - t0)) s"

timeout 30 "$run" -np 0 "$child" 2>/dev/null; [ $? = 2 ] || fail "-np 0 accepted"
timeout 30 "$run" -np 2 2>/dev/null; [ $? = 2 ] || fail "no program accepted"
timeout 30 "$run" -np 2 --nnodes 2 --node-rank 0 "$child" 2>/dev/null; [ $? = 2 ] || fail "2 nodes without a tcp store accepted"
timeout 30 "$run" -np 1 /nonexistent/program 2>/dev/null; [ $? = 127 ] || fail "missing program: not 127"
timeout 30 "$run" -np 2048 --nnodes 1048576 --node-rank 0 --store tcp://127.0.0.1:1 true 2>/dev/null
[ $? = 2 ] || fail "2^31 ranks accepted"
timeout 30 "$run" -np 2>/dev/null; [ $? = 2 ] || fail "-np without a count accepted"
# no file descriptors for rank 1's pipes: exit 1 (not 143), rank 0 stopped
(ulimit -n 7; exec timeout 30 "$run" -np 2 --tag sleep 21 2>/dev/null); rc=$?
[ "$rc" = 1 ] || fail "out of file descriptors: exit $rc, expected 1"

# the temporary store: file://DIR while the ranks run, gone afterwards (also after a failure)
for how in ok fail; do
    url=$(timeout 30 "$run" -np 1 sh -c 'echo "$TUTTI_STORE"; [ '"$how"' = ok ]' 2>/dev/null)
    dir=${url#file://}
    case $url in file:///tmp/tutti-run-*) ;; *) fail "store URL \"$url\"" ;; esac
    [ ! -e "$dir" ] || fail "$how: temporary store $dir left behind"
done

# -np is ours only before the program: its own arguments pass through untouched
out=$(timeout 10 "$run" -np 1 printf '%s\n' -np x) || fail "-np in the program's arguments: exit $?"
[ "$out" = "$(printf -- '-np\nx')" ] || fail "-np in the program's arguments: output: $out"

# --tag with stdin closed: a pipe may get fd 0 and must still be read
out=$(timeout 10 "$run" -np 1 --tag printf 'a\n' <&-) || fail "--tag, stdin closed: exit $?"
[ "$out" = "[0] a" ] || fail "--tag, stdin closed: output: \"$out\""

# --tag: a grandchild that keeps the output pipe open does not keep tutti-run waiting
t0=$(ms)
out=$(timeout 10 "$run" -np 1 --tag sh -c 'sleep 5 & echo $! >'"$tmp"'/bg.pid; echo hi')
rc=$? t1=$(ms)
[ "$rc" = 0 ] && [ "$out" = "[0] hi" ] || fail "--tag, grandchild holding the pipe: exit $rc, output: $out"
[ $((t1 - t0)) -lt 2500 ] || fail "--tag, grandchild holding the pipe: took $((t1 - t0)) ms"

# stopping a rank stops its children too (rank 1 fails once rank 0's sleep has started);
# no terminal on 0-2, which would keep the ranks in tutti-run's process group
timeout 10 "$run" -np 2 sh -c 'd='"$tmp"'
    if [ "$TUTTI_RANK" = 1 ]; then while [ ! -s $d/orphan.pid ]; do sleep .02; done; exit 3; fi
    sleep 21 & echo $! >$d/orphan.pid; wait' </dev/null >/dev/null 2>&1; rc=$?
[ "$rc" = 3 ] || fail "grandchild: exit $rc, expected 3"
gone_within_1s "$(cat "$tmp/orphan.pid")" || fail "a rank's child outlived tutti-run"

# ... also the children of a rank that already exited 0 (rank 1 fails once rank 0 is a
# zombie or reaped, that is once only its child is left)
timeout 10 "$run" -np 2 sh -c 'd='"$tmp"'
    if [ "$TUTTI_RANK" = 0 ]; then echo $$ >$d/exited.rank; sleep 21 & echo $! >$d/left.pid; exit 0; fi
    until [ -s $d/left.pid ]; do sleep .02; done
    while grep -q "^[0-9]* ([^)]*) [^Z]" /proc/$(cat $d/exited.rank)/stat 2>/dev/null
    do sleep .02; done; exit 3' </dev/null >/dev/null 2>&1; rc=$?
[ "$rc" = 3 ] || fail "an exited rank's child: exit $rc, expected 3"
gone_within_1s "$(cat "$tmp/left.pid")" || fail "an exited rank's child outlived tutti-run"

# with a terminal the ranks stay in its foreground group: one that reads it (pdb,
# breakpoint()) or writes it under tostop is not stopped by SIGTTIN/SIGTTOU
if command -v script >/dev/null; then
    out=$( (sleep .2; echo hello) | timeout 5 script -qec "stty tostop; '$run' -np 1 sh -c 'read x; echo got:\$x'" /dev/null 2>&1)
    case $out in *got:hello*) ;; *) fail "a rank reading the terminal: output: $out" ;; esac
else
    echo "test_run: no script(1) to give tutti-run a terminal: that check skipped"
fi

# ranks die with tutti-run even when it is SIGKILLed (here by the rank itself)
(timeout 10 "$run" -np 1 --store "file://$tmp" sh -c 'echo $$ >'"$tmp"'/rank.pid
    kill -KILL $PPID; exec sleep 21'; :) 2>/dev/null # (bash's "Killed" notice)
[ -s "$tmp/rank.pid" ] || fail "SIGKILL: the rank did not start"
gone_within_1s "$(cat "$tmp/rank.pid")" || fail "a rank outlived a SIGKILLed tutti-run"

# --tag into a reader that goes away: tutti-run still stops the ranks and removes its store
timeout 10 "$run" -np 2 --tag sh -c 'echo "$TUTTI_STORE" >'"$tmp"'/store.$TUTTI_RANK
    for i in 1 2 3 4 5; do echo $i; sleep .2; done' 2>/dev/null | head -1 >/dev/null
dir=$(cat "$tmp/store.0"); dir=${dir#file://}
case $dir in /tmp/tutti-run-*) ;; *) fail "closed stdout: store \"$dir\"" ;; esac
[ ! -e "$dir" ] || { rm -rf "$dir"; fail "closed stdout: temporary store $dir left behind"; }

# a SIGTERM that reaches the ranks before they exec still stops them at once: a PATH of
# 120000 empty entries keeps each rank in execvp for ~0.1 s, when tutti-run is signalled
longpath=$(head -c 120000 /dev/zero | tr '\0' :)
timeout 10 env "PATH=$longpath:$PATH" "$run" -np 2 sleep 21 2>/dev/null &
tpid=$!
for _ in $(seq 200); do # until tutti-run (timeout's child) has forked both ranks
    trpid=$(pgrep -P $tpid) && [ "$(pgrep -c -P "$trpid")" = 2 ] && break
    sleep .005
done
t0=$(ms) # from the signal: start-up and the wait above are no part of the 2000 ms
kill -TERM $tpid # timeout passes it on to tutti-run
wait $tpid; rc=$? t1=$(ms)
[ "$rc" = 143 ] || fail "SIGTERM before exec: exit $rc, expected 143"
[ $((t1 - t0)) -lt 2000 ] || fail "SIGTERM before exec: took $((t1 - t0)) ms (a rank missed it)"

echo "test_run: all checks passed"
