#!/usr/bin/env bash
# tutti-run and tutti-bench -np (one launching code, tools/launch.c): ranks get their
# variables and meet; a failing rank, a timeout and a bad command line each give the
# right exit status promptly; the temporary store (in $TMPDIR) goes away on every exit
# path, SIGKILL of the launcher included; no rank or grandchild outlives the launcher's
# stopping them, or the launcher; ranks get a TUTTI_JOB_ID unique per launch.
#   test_launcher.sh TUTTI_RUN LAUNCH_CHILD TUTTI_BENCH
set -u
run=$(readlink -f "$1") child=$(readlink -f "$2") bench=${3:+$(readlink -f "$3")}
[ -x "$bench" ] || { echo "FAIL: usage: test_launcher.sh TUTTI_RUN LAUNCH_CHILD TUTTI_BENCH" >&2; exit 1; }
unset MASTER_ADDR MASTER_PORT TUTTI_JOB_ID SLURM_JOB_ID SLURM_STEP_ID PMIX_NAMESPACE OMPI_MCA_ess_base_jobid \
    TORCHELASTIC_RUN_ID PBS_JOBID LSB_JOBID LSB_JOBINDEX FLUX_JOB_ID
tmp=$(mktemp -d /tmp/test-run.XXXXXX)
export TMPDIR=$tmp/tmpdir # the launchers' temporary stores go here: checked empty
mkdir "$TMPDIR"
marks=""
# a check that fails may leave its sleepers behind: they wrote their pids to $tmp/*.pid,
# or carry TEST_MARK=<mark> in their environment
cleanup() {
    for f in "$tmp"/*.pid; do [ -s "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
    for m in $marks; do for p in $(marked "$m"); do kill -KILL "$p" 2>/dev/null; done; done
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
ms() { echo $(($(date +%s%N) / 1000000)); }
# a zombie counts as gone: whoever inherited it may be slow to reap it (or never reap it)
alive() { [ -r "/proc/$1/stat" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null; }
gone_within_1s() {
    for _ in $(seq 20); do alive "$1" || return 0; sleep .05; done
    return 1
}
# the live processes started with TEST_MARK=$1 in their environment (a launcher passes it
# on to its ranks, their children and its cleaner)
marked() {
    local f p
    for f in $(grep -lxzs "TEST_MARK=$1" /proc/[0-9]*/environ); do
        p=${f#/proc/}; p=${p%/environ}
        alive "$p" && echo "$p"
    done
}
# within 3 s no process with mark $1 is left and $TMPDIR is empty; else says what is left
all_gone() {
    local left
    for _ in $(seq 60); do
        left=$(marked "$1")
        [ -z "$left" ] && [ -z "$(ls -A "$TMPDIR")" ] && return 0
        sleep .05
    done
    echo "processes left: $(for p in $left; do cut -d' ' -f1-5 /proc/$p/stat; done | tr '\n' ';') in \$TMPDIR: $(ls -A "$TMPDIR")"
    return 1
}
# waits at most 10 s for background job $1, then SIGKILLs it; its exit status
wait_bounded() {
    for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || break; sleep .1; done
    kill -KILL "$1" 2>/dev/null
    wait "$1"
}
# the pids whose parent is $1 (from /proc: the fields after the command's name)
children_of() {
    local f st
    for f in /proc/[0-9]*/stat; do
        st=$(cat "$f" 2>/dev/null) || continue
        st=${st##*) }
        [ "$(echo "$st" | cut -d' ' -f2)" = "$1" ] && { f=${f#/proc/}; echo "${f%/stat}"; }
    done
}
tmpdir_empty() { [ -z "$(ls -A "$TMPDIR")" ] || fail "$1: left in \$TMPDIR: $(ls -A "$TMPDIR")"; rm -rf "${TMPDIR:?}"/*; }

out=$(timeout 30 "$run" -np 3 "$child") || fail "3 ranks: exit $?"
[ "$(echo "$out" | grep -c ' of 3 ok')" = 3 ] || fail "3 ranks: output: $out"

out=$(timeout 30 "$run" -np 2 --tag -- "$child") || fail "--tag: exit $?"
echo "$out" | grep -q '^\[1\] rank 1 of 2 ok$' || fail "--tag: output: $out"
# a line with a NUL byte comes out whole (it stopped at the NUL)
got=$(timeout 10 "$run" -np 1 --tag printf 'before\0after\n' | od -An -c -w64 | tr -s ' ')
[ "$got" = " [ 0 ] b e f o r e \0 a f t e r \n" ] || fail "--tag, a NUL in a line: $got"

t0=$(date +%s)
timeout 30 "$run" -np 3 "$child" fail=1 2>$tmp/err; rc=$?
t1=$(date +%s)
[ "$rc" = 3 ] || fail "fail=1: exit $rc, expected 3 ($(cat $tmp/err))"
grep -q 'rank 1 exited with status 3' $tmp/err || fail "fail=1: no rank named: $(cat $tmp/err)"
[ $((t1 - t0)) -lt 20 ] || fail "fail=1 took $((t1 - t0)) s"
# two ranks failing one after the other, rank 1 first (rank 0 exits once it sees rank 1
# a zombie): rank 1 is blamed and its status comes out. The launcher takes exits in the
# order they happened (epoll's order of the ranks' pidfds) and wakes at each; before
# (session 97), a 20 ms nap then a scan in rank order blamed rank 0 in most runs
cat >$tmp/two-fail.py <<'EOS'
import os, sys, time
d = sys.argv[1]
if os.environ["RANK"] == "1":
    open(d + "/p.tmp", "w").write(str(os.getpid()))
    os.rename(d + "/p.tmp", d + "/p")
    os._exit(7)
end = time.time() + 5
while not os.path.exists(d + "/p") and time.time() < end:
    time.sleep(0.0005)
stat = "/proc/%s/stat" % open(d + "/p").read()
while time.time() < end:
    try:
        if open(stat).read().rsplit(")", 1)[1].split()[0] == "Z":
            break
    except OSError:
        break
    time.sleep(0.0005)
os._exit(5)
EOS
# (where the kernel has no pidfds to poll, the launcher naps as before: not checked)
if python3 -c 'import os, select; select.epoll().register(os.pidfd_open(os.getpid()), select.EPOLLIN)' 2>/dev/null; then
    for k in 1 2 3 4 5; do
        rm -f $tmp/p
        timeout 30 "$run" -np 2 python3 $tmp/two-fail.py $tmp 2>$tmp/err; rc=$?
        [ $rc = 7 ] && grep -q 'rank 1 exited with status 7' $tmp/err ||
            fail "rank 1 failed before rank 0, run $k: exit $rc ($(cat $tmp/err))"
    done
else
    echo "no pidfds here: the order of two ranks' failures not checked" >&2
fi
rm -f $tmp/p $tmp/two-fail.py

# --max-restarts: a rank that fails in the first attempt brings all down, all start
# again on the same store and job id (restart in place), and the second attempt runs
# through; restarts used up, the failure's status comes out
t0=$(date +%s)
out=$(timeout 60 "$run" -np 3 --max-restarts 2 "$child" fail-first=1 2>$tmp/err); rc=$?
t1=$(date +%s)
[ "$rc" = 0 ] || fail "--max-restarts 2, fail-first=1: exit $rc ($(cat $tmp/err))"
[ "$(echo "$out" | grep -c ' of 3 ok (restart 1)$')" = 3 ] || fail "--max-restarts: output: $out"
[ "$(grep -c 'starting the 3 rank(s) again (restart 1 of 2)' $tmp/err)" = 1 ] ||
    fail "--max-restarts: $(cat $tmp/err)"
[ $((t1 - t0)) -lt 30 ] || fail "--max-restarts took $((t1 - t0)) s"
timeout 60 "$run" -np 2 --max-restarts 1 "$child" fail=0 2>$tmp/err; rc=$?
[ "$rc" = 3 ] || fail "--max-restarts 1, fail=0: exit $rc, expected 3 ($(cat $tmp/err))"
[ "$(grep -c 'rank 0 exited with status 3' $tmp/err)" = 2 ] || fail "--max-restarts 1: $(cat $tmp/err)"
timeout 30 "$run" -np 2 --max-restarts x "$child" 2>/dev/null; [ $? = 2 ] || fail "--max-restarts x accepted"
# a set-up that fails (rank 1's unknown TUTTI_TCP_CONNECT in the first attempt) ends the
# others' at once, and a quick restart must not take the first attempt's failures for
# its own: rank 0 left only a second-hand one (it failed because rank 1 did); with that
# read as this run's rank 0 failing, 10 of 12 restarts failed (session 95)
cat >$tmp/setup-fails.sh <<EOS
#!/bin/bash
[ "\$RANK" = 1 ] && [ "\${TUTTI_RESTART_COUNT:-0}" = 0 ] && export TUTTI_TCP_CONNECT=sometimes
"$child"; rc=\$?
[ \$rc != 0 ] && [ "\${TUTTI_RESTART_COUNT:-0}" = 0 ] && [ "\$RANK" != 0 ] && sleep 0.6
exit \$rc
EOS
chmod +x $tmp/setup-fails.sh
for i in 1 2 3 4; do
    out=$(TUTTI_TRANSPORT=tcp timeout 60 "$run" -np 3 --max-restarts 1 $tmp/setup-fails.sh 2>$tmp/err)
    rc=$?
    [ "$rc" = 0 ] || fail "a restart after a failed set-up (try $i): exit $rc ($(cat $tmp/err))"
    [ "$(echo "$out" | grep -c ' of 3 ok (restart 1)$')" = 3 ] || fail "after a failed set-up: $out"
done
# (rank 0 hears it from rank 1, or first from rank 2, which names rank 1 in turn: which
# comes first is the scheduler's choice, and beside other suites rank 2's came first)
grep -qE 'rank 1 (failed its set-up|could not set up)' $tmp/err ||
    fail "no rank named the failed set-up: $(cat $tmp/err)"
tmpdir_empty "--max-restarts"

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
# no file descriptors for rank 1's pipes: exit 1 (not 143), rank 0 stopped (8: 0-2, the
# cleaner's pipe and rank 0's two pipes)
(ulimit -n 8; exec timeout 30 "$run" -np 2 --tag sleep 21 2>/dev/null); rc=$?
[ "$rc" = 1 ] || fail "out of file descriptors: exit $rc, expected 1"

# the temporary store: file://$TMPDIR/... while the ranks run, gone afterwards with what
# the ranks put in it (also after a failure)
for how in ok fail; do
    url=$(timeout 30 "$run" -np 2 sh -c 'echo "$TUTTI_STORE"; d=${TUTTI_STORE#file://}/r$TUTTI_RANK
        mkdir -p $d/a/b && touch $d/a/b/f $d/g; [ '"$how"' = ok ]' 2>/dev/null | sort -u)
    case $url in "file://$TMPDIR/tutti-run-"*) ;; *) fail "store URL \"$url\" (TMPDIR=$TMPDIR)" ;; esac
    tmpdir_empty "tutti-run, $how"
done
# tutti-bench -np too: a normal run, a failing one (no such transport), an unusable TMPDIR
timeout 60 "$bench" -np 2 -b 8 -e 8 -n 2 -w 0 >/dev/null 2>&1; rc=$?
[ "$rc" = 0 ] || fail "tutti-bench -np 2: exit $rc"
tmpdir_empty "tutti-bench, ok"
TUTTI_TRANSPORT=nosuch timeout 60 "$bench" -np 2 -b 8 -e 8 -n 2 -w 0 >/dev/null 2>&1; rc=$?
[ "$rc" = 3 ] || fail "tutti-bench -np 2, no such transport: exit $rc, expected 3"
tmpdir_empty "tutti-bench, failure"
err=$(TMPDIR=$tmp/nosuch timeout 60 "$bench" -np 1 -b 8 -e 8 -n 1 -w 0 2>&1 >/dev/null); rc=$?
[ "$rc" = 3 ] && case $err in *"$tmp/nosuch"*) true ;; *) false ;; esac ||
    fail "tutti-bench with TMPDIR=$tmp/nosuch: exit $rc, $err"

# --bind: each rank held on one CPU, rank i of N on the (i*C/N)-th of the C CPUs the
# launcher may use (tools/launch.c); without it, the launcher's whole set
cpus=() # the CPUs this script may use, expanded from /proc's list ("0-3,6")
IFS=, read -ra parts <<<"$(sed -n 's/^Cpus_allowed_list:\t*//p' /proc/self/status)"
for p in "${parts[@]}"; do
    if [[ $p == *-* ]]; then cpus+=($(seq "${p%-*}" "${p#*-}")); else cpus+=("$p"); fi
done
mine=$(sed -n 's/^Cpus_allowed_list:\t*//p' /proc/self/status)
for n in 1 3 5; do
    out=$(timeout 30 "$run" -np $n --bind sh -c 'echo "$TUTTI_RANK $(sed -n "s/^Cpus_allowed_list:\t*//p" /proc/self/status)"' |
        sort -n) || fail "--bind -np $n: exit $?"
    want=$(for ((i = 0; i < n; i++)); do echo "$i ${cpus[i * ${#cpus[@]} / n]}"; done)
    [ "$out" = "$want" ] || fail "--bind -np $n: ranks on \"$out\", expected \"$want\""
done
out=$(timeout 30 "$run" -np 2 sh -c 'sed -n "s/^Cpus_allowed_list:\t*//p" /proc/self/status' | sort -u)
[ "$out" = "$mine" ] || fail "without --bind: ranks on \"$out\", expected \"$mine\""
timeout 60 "$bench" -np 3 --bind -b 8 -e 8 -n 2 -w 0 -c >/dev/null 2>&1 || fail "tutti-bench -np 3 --bind: exit $?"
tmpdir_empty "--bind"

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
case $dir in "$TMPDIR"/tutti-run-*) ;; *) fail "closed stdout: store \"$dir\"" ;; esac
tmpdir_empty "closed stdout"

# a SIGTERM that reaches the ranks before they exec still stops them at once: a PATH of
# 120000 empty entries keeps each rank in execvp for ~0.1 s, when tutti-run is signalled
longpath=$(head -c 120000 /dev/zero | tr '\0' :)
timeout 10 env "PATH=$longpath:$PATH" "$run" -np 2 sleep 21 2>/dev/null &
tpid=$!
for _ in $(seq 200); do # until tutti-run (timeout's child) has forked both ranks (and its cleaner)
    trpid=$(pgrep -P $tpid) && [ "$(pgrep -c -P "$trpid")" = 3 ] && break
    sleep .005
done
t0=$(ms) # from the signal: start-up and the wait above are no part of the 2000 ms
kill -TERM $tpid # timeout passes it on to tutti-run
wait $tpid; rc=$? t1=$(ms)
[ "$rc" = 143 ] || fail "SIGTERM before exec: exit $rc, expected 143"
[ $((t1 - t0)) -lt 2000 ] || fail "SIGTERM before exec: took $((t1 - t0)) ms (a rank missed it)"

tmpdir_empty "SIGTERM before exec"

# SIGKILL of tutti-run: its ranks (SIGKILLed by PR_SET_PDEATHSIG), what they started (the
# cleaner kills their groups) and its temporary store, subdirectories included, are gone
m=run-kill-$$; marks="$marks $m"
TEST_MARK=$m "$run" -np 2 sh -c 'd=${TUTTI_STORE#file://}/r$TUTTI_RANK; mkdir -p $d/a/b
    touch $d/a/b/f; sleep 21 & echo x >'"$tmp"'/k.$TUTTI_RANK; wait' </dev/null >/dev/null 2>&1 &
lpid=$!
for _ in $(seq 200); do [ -s $tmp/k.0 ] && [ -s $tmp/k.1 ] && break; sleep .05; done
[ -s $tmp/k.0 ] && [ -s $tmp/k.1 ] || fail "tutti-run SIGKILL: the ranks did not start"
kill -KILL $lpid; wait $lpid 2>/dev/null
why=$(all_gone $m) || fail "SIGKILL of tutti-run: $why"

# SIGKILL of tutti-bench -np 3 in a long benchmark: its ranks and its store are gone
m=bench-kill-$$; marks="$marks $m"
TEST_MARK=$m "$bench" -np 3 --coll barrier -n 1 -w 1000000000 -t 60 >/dev/null 2>&1 &
lpid=$!
for _ in $(seq 200); do
    [ "$(pgrep -c -P $lpid)" -ge 3 ] && [ -n "$(ls -A "$TMPDIR")" ] && break; sleep .05
done
[ "$(pgrep -c -P $lpid)" -ge 3 ] || fail "tutti-bench SIGKILL: the ranks did not start"
case $(ls -A "$TMPDIR") in tutti-bench-*) ;; *) fail "tutti-bench: no store in \$TMPDIR" ;; esac
sleep .3 # in the benchmark loop
kill -KILL $lpid; wait $lpid 2>/dev/null
why=$(all_gone $m) || fail "SIGKILL of tutti-bench -np 3: $why"

# SIGTERM of tutti-bench -np 3: it stops its ranks, removes its store, exits 143
m=bench-term-$$; marks="$marks $m"
TEST_MARK=$m "$bench" -np 3 --coll barrier -n 1 -w 1000000000 -t 60 >/dev/null 2>&1 &
lpid=$!
for _ in $(seq 200); do [ "$(pgrep -c -P $lpid)" -ge 3 ] && break; sleep .05; done
sleep .3
kill -TERM $lpid; wait_bounded $lpid; rc=$?
[ "$rc" = 143 ] || fail "SIGTERM of tutti-bench: exit $rc, expected 143"
why=$(all_gone $m) || fail "SIGTERM of tutti-bench -np 3: $why"

# SIGHUP of tutti-run (a background job ignores SIGINT): the same. Where this script
# started with SIGHUP ignored (under nohup), tutti-run keeps it ignored, as it should, and
# a shell cannot undo that: the case has nothing to test there.
if (( 0x$(awk '/^SigIgn:/ {print $2}' /proc/$$/status) & 1 )); then
    echo "SIGHUP is ignored in this environment (nohup?): its case skipped"
else
    m=run-hup-$$; marks="$marks $m"
    TEST_MARK=$m "$run" -np 2 sh -c 'sleep 21 & echo x >'"$tmp"'/h.$TUTTI_RANK; wait' </dev/null >/dev/null 2>&1 &
    lpid=$!
    for _ in $(seq 200); do [ -s $tmp/h.0 ] && [ -s $tmp/h.1 ] && break; sleep .05; done
    kill -HUP $lpid; wait_bounded $lpid; rc=$?
    [ "$rc" = 129 ] || fail "SIGHUP of tutti-run: exit $rc, expected 129"
    why=$(all_gone $m) || fail "SIGHUP of tutti-run: $why"
fi

# TUTTI_JOB_ID: the same on every rank of a launch, another on the next launch; the
# user's kept; --job-id; nodes of one job agree without talking
ids() { timeout 10 "$@" sh -c 'echo "$TUTTI_JOB_ID"' 2>&1 | sort -u | tr '\n' ' '; }
a=$(ids "$run" -np 2) b=$(ids "$run" -np 2)
case $a in *" "?*|" "|"") fail "tutti-run job ids: \"$a\" (one per launch, non-empty)" ;; esac
[ "$a" != "$b" ] || fail "tutti-run: two launches got the same job id $a"
[ "$(TUTTI_JOB_ID=mine ids "$run" -np 2)" = "mine " ] || fail "tutti-run replaced the user's TUTTI_JOB_ID"
[ "$(ids "$run" -np 2 --job-id j7)" = "j7 " ] || fail "tutti-run --job-id j7: $(ids "$run" -np 2 --job-id j7)"
TUTTI_JOB_ID=other timeout 10 "$run" -np 1 --job-id j7 true 2>/dev/null; rc=$?
[ "$rc" = 2 ] || fail "--job-id j7 with TUTTI_JOB_ID=other: exit $rc, expected 2"
timeout 10 "$run" -np 1 --job-id "a b" true 2>/dev/null; rc=$?
[ "$rc" = 2 ] || fail "--job-id 'a b': exit $rc, expected 2"
n0=$(ids "$run" -np 2 --nnodes 2 --node-rank 0 --store tcp://127.0.0.1:1)
n1=$(ids "$run" -np 2 --nnodes 2 --node-rank 1 --store tcp://[::1]:1)
[ "$n0" = "$n1" ] && [ "${n0% }" ] && [ "$n0" = "${n0%% *} " ] || fail "two nodes of one job: job ids \"$n0\" and \"$n1\""
n0=$(SLURM_JOB_ID=77 SLURM_STEP_ID=3 ids "$run" -np 1 --nnodes 2 --node-rank 0 --store tcp://h:1)
[ "$n0" = "slurm-77.3 " ] || fail "two nodes under Slurm: job id \"$n0\""
# an mpirun inside a Slurm job: its PMIx namespace first (its ranks on its own node have the
# batch script's variables, the others their daemon's step)
n0=$(PMIX_NAMESPACE=ns SLURM_JOB_ID=77 SLURM_STEP_ID=3 ids "$run" -np 1 --nnodes 2 --node-rank 0 --store tcp://h:1)
[ "$n0" = "pmix-ns " ] || fail "two nodes under mpirun in Slurm: job id \"$n0\""
# torch's env:// (MASTER_ADDR, MASTER_PORT, as torchrun sets them): one node, a free port on
# loopback, the same for every rank; several, the store's host and the port after its;
# the user's kept
mp() { timeout 10 "$@" sh -c 'echo "$MASTER_ADDR:$MASTER_PORT $GROUP_RANK/$GROUP_WORLD_SIZE $LOCAL_WORLD_SIZE"' 2>&1 | sort -u | tr '\n' ' '; }
a=$(mp "$run" -np 2)
case $a in "127.0.0.1:"[1-9]*" 0/1 2 ") ;; *) fail "tutti-run MASTER_ADDR:PORT: \"$a\"" ;; esac
a=$(mp "$run" -np 2 --nnodes 3 --node-rank 2 --store tcp://127.0.0.1:1)
[ "$a" = "127.0.0.1:2 2/3 2 " ] || fail "tutti-run --nnodes 3 MASTER_ADDR:PORT: \"$a\""
a=$(mp "$run" -np 1 --nnodes 2 --node-rank 1 --store tcp://h)
[ "$a" = ": 1/2 1 " ] || fail "tutti-run MASTER_ADDR:PORT from a store without a port: \"$a\""
a=$(MASTER_ADDR=h MASTER_PORT=9 mp "$run" -np 2 --nnodes 1:1 --rdzv-last-call 0 --job-id mp1 \
    --store "file://$tmp/mp1")
case $a in "127.0.0.1:"[1-9]*" 0/1 2 "*) ;; *) fail "elastic tutti-run kept the user's MASTER_ADDR:PORT: \"$a\"" ;; esac
a=$(MASTER_ADDR=h MASTER_PORT=9 mp "$run" -np 2)
[ "$a" = "h:9 0/1 2 " ] || fail "tutti-run replaced the user's MASTER_ADDR:PORT: \"$a\""
bench_id() { timeout 60 "$bench" -np 2 -b 8 -e 8 -n 1 -w 0 2>&1 | sed -n 's/^# job //p'; }
a=$(bench_id) b=$(bench_id)
[ -n "$a" ] && [ "$a" != "$b" ] || fail "tutti-bench -np job ids: \"$a\" then \"$b\""
a=$(TUTTI_JOB_ID=mine bench_id)
[ "$a" = mine ] || fail "tutti-bench -np replaced the user's TUTTI_JOB_ID: \"$a\""
tmpdir_empty "job ids"

# --nnodes MIN:MAX (elastic, torchrun's): tutti-runs sharing a store meet in rounds
el=$tmp/elastic
mkdir -p "$el"
# two_nodes ARGS...: two tutti-runs with ARGS ("%k" in them: the node's index), their
# outputs in $el/out0,1 and err0,1; waits for both, their exit statuses in $rc ("00": both 0)
two_nodes() {
    local k p=()
    rm -f "$el"/out? "$el"/err?
    for k in 0 1; do
        timeout 60 "$run" "${@//%k/$k}" >"$el/out$k" 2>"$el/err$k" &
        p[k]=$!
    done
    wait "${p[0]}"; rc=$?; wait "${p[1]}"; rc=$rc$?
}
# two nodes of 2:3 meet (round 0 closes at 2 after the last call), ranks numbered by node
two_nodes -np 2 --nnodes 2:3 --rdzv-last-call 300 --store "file://$el/s1" "$child"
[ "$rc" = 00 ] || fail "elastic 2:3, two nodes: exit $rc ($(cat "$el"/err*))"
[ "$(cat "$el"/out0 "$el"/out1 | grep -c ' of 4 ok (round 0, restart 0)$')" = 4 ] ||
    fail "elastic 2:3, two nodes: output: $(cat "$el"/out*)"
# scale-up over a tcp store that the first node serves: a third node comes to the running
# round, which restarts with 6 ranks (not counted as a restart)
read -r port < <(python3 -c "import socket
s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
up() {
    TEST_MARK=$m timeout 60 "$run" -np 2 --nnodes 2:3 --rdzv-last-call 300 \
        --store "tcp://127.0.0.1:$port" "$child" "until=$el/stop" >"$el/out$1" 2>"$el/err$1" &
    eval "p$1=\$!"
}
m=elastic-$$ marks="$marks $m"
rm -f "$el"/out* "$el"/err*
up 0; up 1
for _ in $(seq 200); do grep -qs 'elastic round 0:' "$el/err0" && grep -qs 'elastic round 0:' "$el/err1" && break; sleep .05; done
up 2
for _ in $(seq 300); do [ "$(cat "$el"/err? | grep -c 'elastic round 1:')" = 3 ] && break; sleep .05; done
touch "$el/stop"
wait "$p0"; r0=$?; wait "$p1"; r1=$?; wait "$p2"; r2=$?
[ "$r0$r1$r2" = 000 ] || fail "elastic scale-up: exit $r0 $r1 $r2 ($(cat "$el"/err*))"
[ "$(cat "$el"/out? | grep -c ' of 6 ok (round 1, restart 0)$')" = 6 ] ||
    fail "elastic scale-up: output: $(cat "$el"/out*) $(cat "$el"/err*)"
[ "$(cat "$el"/err? | grep -c 'round 0 ended (scale: 1 node(s) waiting to join 2)')" = 2 ] ||
    fail "elastic scale-up: $(cat "$el"/err?)"
why=$(all_gone $m) || fail "elastic scale-up: $why"
# over a Redis store (a real redis-server of this test's own, where installed)
if command -v redis-server >/dev/null; then
    read -r rport < <(python3 -c "import socket
s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$el" >"$el/redis.log" 2>&1 &
    echo $! >"$tmp/redis.pid"
    for _ in $(seq 100); do grep -q 'Ready to accept' "$el/redis.log" && break; sleep .05; done
    two_nodes -np 2 --nnodes 2:3 --rdzv-last-call 300 --job-id el-redis \
        --store "redis://127.0.0.1:$rport" "$child"
    [ "$rc" = 00 ] || fail "elastic over redis: exit $rc ($(cat "$el"/err*))"
    [ "$(cat "$el"/out0 "$el"/out1 | grep -c ' of 4 ok (round 0, restart 0)$')" = 4 ] ||
        fail "elastic over redis: output: $(cat "$el"/out*)"
    # a store that hangs (SIGSTOP) while the ranks run: every agent's look at the round
    # fails after --rdzv-conf read_timeout (not the rendezvous timeout) and stops its ranks
    rm -f "$el/stop"
    for k in 0 1; do
        timeout 60 "$run" -np 1 --nnodes 2:2 --rdzv-conf read_timeout=1 --job-id el-hang \
            --store "redis://127.0.0.1:$rport" "$child" "until=$el/stop" >"$el/out$k" 2>"$el/err$k" &
        eval "p$k=\$!"
    done
    # (up to 30 s: under a loaded machine's 10 s, one node was still in the rendezvous)
    for _ in $(seq 600); do [ "$(cat "$el"/err? | grep -c 'elastic round 0:')" = 2 ] && break; sleep .05; done
    kill -STOP "$(cat "$tmp/redis.pid")"
    t0=$(ms); wait "$p0"; r0=$?; wait "$p1"; r1=$?; t1=$(ms)
    kill -CONT "$(cat "$tmp/redis.pid")"
    [ "$r0$r1" = 11 ] && [ $((t1 - t0)) -lt 8000 ] && [ "$(cat "$el"/err? | grep -c 'ended (the store failed)')" = 2 ] ||
        fail "elastic, hung store: exit $r0 $r1 after $((t1 - t0)) ms ($(cat "$el"/err?))"
    kill "$(cat "$tmp/redis.pid")"
fi
# scale-down: a node told to stop (SIGTERM) leaves; the others go on in a new round of 2,
# uncounted (with --max-restarts 0 a counted one would end the job)
rm -f "$el"/out* "$el"/err* "$el/stop"
for k in 0 1 2; do
    timeout 60 "$run" -np 1 --nnodes 2:3 --rdzv-last-call 300 --store "file://$el/s2" \
        "$child" "until=$el/stop" >"$el/out$k" 2>"$el/err$k" &
    eval "p$k=\$!"
done
for _ in $(seq 200); do [ "$(cat "$el"/err? | grep -c 'elastic round 0:')" = 3 ] && break; sleep .05; done
kill -TERM "$p2"
for _ in $(seq 300); do [ "$(cat "$el"/err? | grep -c 'elastic round 1:')" = 2 ] && break; sleep .05; done
touch "$el/stop"
wait "$p0"; r0=$?; wait "$p1"; r1=$?; wait "$p2"; r2=$?
[ "$r0$r1$r2" = 00143 ] || fail "elastic scale-down: exit $r0 $r1 $r2 ($(cat "$el"/err*))"
[ "$(cat "$el"/out? | grep -c ' of 2 ok (round 1, restart 0)$')" = 2 ] ||
    fail "elastic scale-down: output: $(cat "$el"/out*) $(cat "$el"/err*)"
# a rank's failure restarts every node's ranks (counted), the next round runs through
two_nodes -np 2 --nnodes 2:2 --max-restarts 1 --store "file://$el/s3" "$child" fail-first=1
[ "$rc" = 00 ] || fail "elastic failure then restart: exit $rc ($(cat "$el"/err*))"
[ "$(cat "$el"/out? | grep -c ' of 4 ok (round 1, restart 1)$')" = 4 ] ||
    fail "elastic failure then restart: output: $(cat "$el"/out*) $(cat "$el"/err*)"
[ "$(cat "$el"/err? | grep -c 'round 0 ended (failure: node [01]: a rank exited with status 3)')" = 2 ] ||
    fail "elastic failure then restart: $(cat "$el"/err?)"
# restarts used up: both nodes fail, the failing one with its rank's status
two_nodes -np 2 --nnodes 2:2 --store "file://$el/s4" "$child" fail=1
case "$rc" in 31|13) ;; *) fail "elastic, restarts used up: exit $rc, expected 3 and 1 ($(cat "$el"/err*))" ;; esac
[ "$(cat "$el"/err? | grep -c -- '--max-restarts 0 used up')" = 2 ] || fail "elastic, restarts used up: $(cat "$el"/err?)"
# the same job id on the same store again: the job is over, said, not run
timeout 30 "$run" -np 1 --nnodes 1:2 --store "file://$el/s4" "$child" 2>"$el/err"; rc=$?
[ "$rc" = 1 ] && grep -q 'needs its own --job-id' "$el/err" || fail "elastic rerun on a used store: exit $rc ($(cat "$el/err"))"
timeout 30 "$run" -np 1 --nnodes 3:2 --store "file://$el/s5" "$child" 2>/dev/null; rc=$?
[ "$rc" = 2 ] || fail "--nnodes 3:2: exit $rc, expected 2"
timeout 30 "$run" -np 1 --nnodes 1:2 "$child" 2>/dev/null; rc=$?
[ "$rc" = 2 ] || fail "--nnodes 1:2 without --store: exit $rc, expected 2"
timeout 30 "$run" -np 1 --nnodes 1:2 --node-rank 1 --store "file://$el/s5" "$child" 2>/dev/null; rc=$?
[ "$rc" = 2 ] || fail "--nnodes 1:2 --node-rank 1: exit $rc, expected 2"
# torchrun's command lines: its option spellings, c10d rendezvous over --rdzv-endpoint
# (--nnodes 2 being 2:2), a SCRIPT.py and -m MODULE run by python3
read -r port < <(python3 -c "import socket
s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
two_nodes --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d --rdzv-last-call 300 \
    --rdzv_endpoint="127.0.0.1:$port" --rdzv_id=torchrun-style --max_restarts=0 "$child"
[ "$rc" = 00 ] || fail "torchrun's spellings, c10d: exit $rc ($(cat "$el"/err*))"
[ "$(cat "$el"/out0 "$el"/out1 | grep -c ' of 4 ok (round 0, restart 0)$')" = 4 ] ||
    fail "torchrun's spellings, c10d: output: $(cat "$el"/out*)"
# torchrun's static rendezvous: --master_addr/--master_port for torch, our store on the
# port after it (two free ports in a row: another test may hold the one after a free one)
read -r port < <(python3 -c "import random, socket
for p in random.sample(range(20000, 60000), 200):
    try:
        s = [socket.socket(), socket.socket()]
        s[0].bind(('127.0.0.1', p)); s[1].bind(('127.0.0.1', p + 1))
        print(p); break
    except OSError:
        pass")
two_nodes --nnodes=2 --node_rank=%k --nproc_per_node=2 --master_addr=127.0.0.1 \
    --master_port="$port" "$child"
[ "$rc" = 00 ] || fail "torchrun's static spellings: exit $rc ($(cat "$el"/err*))"
[ "$(cat "$el"/out0 "$el"/out1 | grep -c ' of 4 ok$')" = 4 ] ||
    fail "torchrun's static spellings: output: $(cat "$el"/out*)"
a=$(mp "$run" --nproc_per_node 1 --nnodes 2 --node_rank 1 --master_addr h --master_port 7)
[ "$a" = "h:7 1/2 1 " ] || fail "tutti-run --master_addr h --master_port 7: \"$a\""
printf 'import os, sys\nos.write(1, f"script {os.environ[\x27RANK\x27]} {sys.argv[1:]}\\n".encode())\n' >"$el/s.py"
out=$(cd "$el" && timeout 30 "$run" --nproc-per-node 2 --standalone s.py a 2>&1 | sort | tr '\n' ';')
[ "$out" = "script 0 ['a'];script 1 ['a'];" ] || fail "tutti-run SCRIPT.py: $out"
# torchrun's default of one process: a torchrun command line without --nproc-per-node
out=$(cd "$el" && timeout 30 "$run" s.py b 2>&1 | tr '\n' ';')
[ "$out" = "script 0 ['b'];" ] || fail "tutti-run SCRIPT.py without -np: $out"
timeout 30 "$run" true 2>/dev/null; rc=$?
[ "$rc" = 2 ] || fail "tutti-run PROGRAM without -np: exit $rc, expected 2"
mv "$el/s.py" "$el/tt_mod.py"
out=$(cd "$el" && timeout 30 "$run" --nproc-per-node 2 -m tt_mod b 2>&1 | sort | tr '\n' ';')
[ "$out" = "script 0 ['b'];script 1 ['b'];" ] || fail "tutti-run -m MODULE: $out"
timeout 30 "$run" --nproc-per-node 1 --standalone --nnodes 2 true 2>/dev/null; rc=$?
[ "$rc" = 2 ] || fail "--standalone --nnodes 2: exit $rc, expected 2"
timeout 30 "$run" --nproc-per-node 1 --rdzv-backend etcd --rdzv-endpoint h:1 true 2>/dev/null; rc=$?
[ "$rc" = 2 ] || fail "--rdzv-backend etcd: exit $rc, expected 2"
# a signal or --timeout while a node waits in the rendezvous: it stops at once, with
# 128+signal or 124 (not after the rendezvous timeout)
timeout 30 "$run" -np 1 --nnodes 2:2 --store "file://$el/s6" "$child" 2>"$el/err" &
p0=$!
sleep .5
t0=$(ms); kill -INT "$p0"; wait_bounded "$p0"; rc=$?; t1=$(ms)
[ "$rc" = 130 ] && [ $((t1 - t0)) -lt 3000 ] ||
    fail "SIGINT in the rendezvous: exit $rc after $((t1 - t0)) ms ($(cat "$el/err"))"
t0=$(ms)
timeout 30 "$run" -np 1 --nnodes 2:2 --timeout 1 --store "file://$el/s6" --job-id t1 "$child" 2>"$el/err"; rc=$?
t1=$(ms)
[ "$rc" = 124 ] && [ $((t1 - t0)) -lt 4000 ] ||
    fail "--timeout 1 in the rendezvous: exit $rc after $((t1 - t0)) ms ($(cat "$el/err"))"
# torchrun's exit barrier: node 0's ranks pass at once, node 1's rank fails a second
# later; the job has not run through, so both restart (one count) and the next round passes
printf '%s\n' '[ "$RANK" = 1 ] && [ "$TUTTI_RESTART_COUNT" = 0 ] && { sleep 1; exit 3; }' \
    'echo "ok $RANK round $TUTTI_ROUND restart $TUTTI_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS"' >"$el/bar.sh"
two_nodes -np 1 --nnodes 2:2 --max-restarts 1 --store "file://$el/s7" sh "$el/bar.sh"
[ "$rc" = 00 ] || fail "elastic exit barrier: exit $rc ($(cat "$el"/err*))"
[ "$(cat "$el"/out? | grep -c '^ok [01] round 1 restart 1 of 1$')" = 2 ] ||
    fail "elastic exit barrier: output: $(cat "$el"/out*) $(cat "$el"/err*)"
# one restart count for the job: a node that joins after a failed round sees the same
# TORCHELASTIC_RESTART_COUNT as those that lived through it
printf '%s\n' '[ "$RANK" = 0 ] && [ "$TUTTI_RESTART_COUNT" = 0 ] && exit 3' \
    'exec "$@"' >"$el/f0.sh"
rm -f "$el"/out? "$el"/err? "$el/stop"
for k in 0 1; do
    timeout 60 "$run" -np 1 --nnodes 2:3 --max-restarts 1 --rdzv-last-call 300 --store "file://$el/s8" \
        sh "$el/f0.sh" "$child" "until=$el/stop" >"$el/out$k" 2>"$el/err$k" &
    eval "p$k=\$!"
done
for _ in $(seq 300); do [ "$(cat "$el"/err? | grep -c 'elastic round 1:')" = 2 ] && break; sleep .05; done
timeout 60 "$run" -np 1 --nnodes 2:3 --max-restarts 1 --rdzv-last-call 300 --store "file://$el/s8" \
    "$child" "until=$el/stop" >"$el/out2" 2>"$el/err2" &
p2=$!
for _ in $(seq 300); do [ "$(cat "$el"/err? | grep -c 'elastic round 2:')" = 3 ] && break; sleep .05; done
touch "$el/stop"
wait "$p0"; r0=$?; wait "$p1"; r1=$?; wait "$p2"; r2=$?
[ "$r0$r1$r2" = 000 ] || fail "elastic restart count: exit $r0 $r1 $r2 ($(cat "$el"/err*))"
[ "$(cat "$el"/out? | grep -c ' of 3 ok (round 2, restart 1)$')" = 3 ] ||
    fail "elastic restart count: output: $(cat "$el"/out*) $(cat "$el"/err*)"
# after a failure, a node whose ranks are slow to stop (they ignore SIGTERM: killed after
# the grace period) is waited for: the next round has all three nodes, not two and then
# a scale-up restart for the third (its ranks stop ~3 s after the failure, past the 2 s
# last call)
printf '%s\n' '[ -n "${TEST_SLOW:-}" ] && trap "" TERM' \
    '[ "$RANK" = 0 ] && [ "$TUTTI_RESTART_COUNT" = 0 ] && { sleep 1; exit 3; }' 'exec "$@"' >"$el/slow.sh"
rm -f "$el"/out? "$el"/err? "$el/stop"
for k in 0 1 2; do
    [ $k = 2 ] && export TEST_SLOW=1
    timeout 60 "$run" -np 1 --nnodes 2:3 --max-restarts 1 --rdzv-last-call 2000 --store "file://$el/s12" \
        sh "$el/slow.sh" "$child" "until=$el/stop" >"$el/out$k" 2>"$el/err$k" &
    eval "p$k=\$!"
    unset TEST_SLOW
done
for _ in $(seq 300); do [ "$(cat "$el"/err? | grep -c 'elastic round 1:')" = 3 ] && break; sleep .05; done
touch "$el/stop"
wait "$p0"; r0=$?; wait "$p1"; r1=$?; wait "$p2"; r2=$?
[ "$r0$r1$r2" = 000 ] && [ "$(cat "$el"/out? | grep -c ' of 3 ok (round 1, restart 1)$')" = 3 ] &&
    ! grep -q 'waiting to join' "$el"/err? ||
    fail "elastic, a node slow to stop: exit $r0 $r1 $r2 ($(cat "$el"/out? "$el"/err?))"
# every agent SIGKILLed mid-round (tutti-run itself, no timeout in between; their ranks
# die with them): a rerun in place on the same store finds the round's heartbeats
# stopped, ends it and runs (not a wait for the rendezvous timeout)
kc="--rdzv-conf=keep_alive_interval=0.5,keep_alive_max_attempt=4,join_timeout=60" # gone after 2 s
m=killed-$$ marks="$marks $m"
rm -f "$el"/out? "$el"/err? "$el/stop"
for k in 0 1; do
    TEST_MARK=$m "$run" -np 1 --nnodes 2:2 "$kc" --store "file://$el/s9" \
        "$child" "until=$el/stop" >"$el/out$k" 2>"$el/err$k" &
    eval "p$k=\$!"
done
for _ in $(seq 300); do [ "$(cat "$el"/err? | grep -c 'elastic round 0:')" = 2 ] && break; sleep .05; done
kill -KILL "$p0" "$p1"; wait "$p0" "$p1" 2>/dev/null
why=$(all_gone $m) || fail "elastic agents SIGKILLed: $why"
touch "$el/stop"
t0=$(ms)
two_nodes -np 1 --nnodes 2:2 "$kc" --store "file://$el/s9" "$child" "until=$el/stop"
t1=$(ms)
[ "$rc" = 00 ] && [ $((t1 - t0)) -lt 20000 ] ||
    fail "elastic rerun after SIGKILL: exit $rc after $((t1 - t0)) ms ($(cat "$el"/err*))"
[ "$(cat "$el"/out? | grep -c ' of 2 ok (round 1, restart 0)$')" = 2 ] &&
    cat "$el"/err? | grep -q 'round 0 ended (scale: node [01] stopped answering' ||
    fail "elastic rerun after SIGKILL: $(cat "$el"/out*) $(cat "$el"/err*)"
# a failure counts even when the failing node's ranks take the grace period to stop
# (they ignore SIGTERM) and heartbeats are fast: it ends the round at once, so "node 0
# stopped answering" never stands in its place; with --max-restarts 0 both give up
printf '%s\n' 'trap "" TERM' '[ "$RANK" = 0 ] && { sleep .5; exit 3; }' 'sleep 8' >"$el/slowfail.sh"
two_nodes -np 2 --nnodes 2:2 --max-restarts 0 "$kc" --store "file://$el/s13" sh "$el/slowfail.sh"
case "$rc" in 31|13) ;; *) fail "elastic, a failure while ranks stop slowly: exit $rc ($(cat "$el"/err?))" ;; esac
[ "$(cat "$el"/err? | grep -c -- '--max-restarts 0 used up')" = 2 ] && ! grep -q 'stopped answering' "$el"/err? ||
    fail "elastic, a failure while ranks stop slowly: $(cat "$el"/err?)"
# a monitor interval longer than the heartbeat window (2 s): the agents still beat in time
rm -f "$el/stop"
for k in 0 1; do
    timeout 60 "$run" -np 1 --nnodes 2:2 --monitor-interval 3 "$kc" --store "file://$el/s14" \
        "$child" "until=$el/stop" >"$el/out$k" 2>"$el/err$k" &
    eval "p$k=\$!"
done
for _ in $(seq 200); do [ "$(cat "$el"/err? | grep -c 'elastic round 0:')" = 2 ] && break; sleep .05; done
sleep 4; touch "$el/stop"
wait "$p0"; r0=$?; wait "$p1"; r1=$?
[ "$r0$r1" = 00 ] && [ "$(cat "$el"/out? | grep -c ' of 2 ok (round 0, restart 0)$')" = 2 ] ||
    fail "elastic, --monitor-interval 3 with 2 s heartbeats: exit $r0 $r1 ($(cat "$el"/out? "$el"/err?))"
# the agent serving the tcp:// store is late for a round (its ranks were slow to stop
# after node 1's failure, and the round filled at MAX with the spare): it waits past its
# --rdzv-timeout without leaving, since its store's end would end the running round
printf '%s\n' '[ -n "${TEST_SLOW:-}" ] && trap "" TERM' \
    '[ -n "${TEST_FAIL:-}" ] && [ "$TUTTI_ROUND" = 0 ] && { sleep 1; exit 3; }' 'exec "$@"' >"$el/host.sh"
read -r port < <(python3 -c "import socket
s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
rm -f "$el"/out? "$el"/err? "$el/stop"
for k in 0 1 2; do
    [ $k = 0 ] && export TEST_SLOW=1
    [ $k = 1 ] && export TEST_FAIL=1
    timeout 60 "$run" -np 1 --nnodes 2:2 --max-restarts 1 --rdzv-timeout 4 --store "tcp://127.0.0.1:$port" \
        sh "$el/host.sh" "$child" "until=$el/stop" >"$el/out$k" 2>"$el/err$k" &
    eval "p$k=\$!"
    unset TEST_SLOW TEST_FAIL
    # node 0 first: it serves the store
    [ $k = 0 ] && for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep .05; done
    [ $k = 1 ] && for _ in $(seq 200); do [ "$(cat "$el"/err? | grep -c 'elastic round 0:')" = 2 ] && break; sleep .05; done
done
for _ in $(seq 300); do grep -qs 'round 1 took 2 node(s) before this one' "$el/err0" && break; sleep .05; done
sleep 5; touch "$el/stop"
wait "$p0"; r0=$?; wait "$p1"; r1=$?; wait "$p2"; r2=$?
[ "$r0$r1$r2" = 000 ] && [ "$(cat "$el"/out1 "$el"/out2 | grep -c ' of 2 ok (round 1, restart 1)$')" = 2 ] &&
    grep -q 'round 1 took 2 node(s) before this one' "$el/err0" ||
    fail "elastic, the store's host late: exit $r0 $r1 $r2 ($(cat "$el"/out? "$el"/err?))"
# the same, but the round runs through before the host even comes back: it sees the job
# over and leaves within seconds (it waited ~19 s for agents of its own old round, who
# had said they saw the end in the new one)
printf '%s\n' '[ -n "${TEST_SLOW:-}" ] && trap "" TERM' \
    'if [ "$TUTTI_ROUND" = 0 ]; then [ -n "${TEST_FAIL:-}" ] && { sleep 1; exit 3; }; sleep 100; fi' 'sleep .5' >"$el/host2.sh"
read -r port < <(python3 -c "import socket
s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
rm -f "$el"/out? "$el"/err?
t0=$(ms)
for k in 0 1 2; do
    [ $k = 0 ] && export TEST_SLOW=1
    [ $k = 1 ] && export TEST_FAIL=1
    timeout 60 "$run" -np 1 --nnodes 2:2 --max-restarts 1 --store "tcp://127.0.0.1:$port" \
        sh "$el/host2.sh" >"$el/out$k" 2>"$el/err$k" &
    eval "p$k=\$!"
    unset TEST_SLOW TEST_FAIL
    [ $k = 0 ] && for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep .05; done
    [ $k = 1 ] && for _ in $(seq 200); do [ "$(cat "$el"/err? | grep -c 'elastic round 0:')" = 2 ] && break; sleep .05; done
done
wait "$p0"; r0=$?; t1=$(ms); wait "$p1"; r1=$?; wait "$p2"; r2=$?
[ "$r0$r1$r2" = 000 ] && [ $((t1 - t0)) -lt 12000 ] ||
    fail "elastic, the store's host back after the end: exit $r0 $r1 $r2 after $((t1 - t0)) ms ($(cat "$el"/err?))"
# Ctrl-C on a node's terminal (script(1) gives it one: SIGINT reaches tutti-run and its
# ranks, one foreground group): the node leaves, its dead ranks are no failure, and the
# other node goes on alone (with --max-restarts 0 a counted failure would end it). The
# race this path closed (a rank reaped as failed before tutti-run saw its own SIGINT)
# is not forced here: the check holds the whole path, exit statuses included.
# bg_node STORE K: in the background ($!), a node of 1 rank of a 1..2-node job on
# file://$el/STORE, its output in outK and errK
bg_node() {
    timeout 60 "$run" -np 1 --nnodes 1:2 --rdzv-last-call 500 --store "file://$el/$1" \
        "$child" "until=$el/stop" >"$el/out$2" 2>"$el/err$2" &
}
# WHAT R0: the other node (exit R0, 130) left on SIGINT and node $p1 went on alone
left_alone() {
    for _ in $(seq 200); do grep -qs 'elastic round 1: node 0 of 1' "$el/err1" && break; sleep .05; done
    touch "$el/stop"
    wait "$p1"; r1=$?
    [ "$2$r1" = 1300 ] && grep -q 'ended (scale: node [01] left (Interrupt))' "$el/err1" &&
        grep -q 'elastic round 1: node 0 of 1' "$el/err1" ||
        fail "elastic, $1: exit $2 $r1 ($(cat "$el/out0" "$el/err0" "$el/err1" 2>/dev/null))"
}
if command -v script >/dev/null; then
    rm -f "$el/stop" "$el/err0"
    bg_node s15 1
    p1=$!
    sleep .3
    (sleep 2; printf '\003'; sleep 3) | timeout 30 script -qec "'$run' -np 1 --nnodes 1:2 --rdzv-last-call 500 \
        --store 'file://$el/s15' '$child' 'until=$el/stop'" /dev/null >"$el/out0" 2>&1
    left_alone "Ctrl-C on a node" $?
fi
# the same race forced: the leaving node's rank gone 400 ms before its agent can say it
# leaves (the agent stopped, its SIGINT pending, as a loaded machine may delay it while
# the terminal's SIGINT has already taken its rank). The other node's rank fails with
# its peer; its agent gives the round a grace (tt_rdzv_failure_grace) in which the
# leave arrives, so this is no failure either (with none, exit 1: --max-restarts 0)
rm -f "$el/stop"
bg_node s16 1
p1=$!
sleep .3
bg_node s16 0
p0=$!
for _ in $(seq 200); do [ "$(cat "$el"/err? | grep -c 'elastic round 0:')" = 2 ] && break; sleep .05; done
a0=$(pgrep -P "$p0" -x tutti-run)
r=$(pgrep -P "$a0" -x launch_child)
[ -n "$a0" ] && [ -n "$r" ] || fail "elastic, a leaving node's rank first: no agent ($a0) or rank ($r)"
sleep .5
kill -STOP "$a0"
kill -INT "$r" "$a0"
sleep .4
kill -CONT "$a0"
wait "$p0"
left_alone "a leaving node's rank gone before it says so" $?
# and the race was run: node 1's rank failed with its peer (else the grace was not needed)
grep -q 'rank 0 exited with status 1' "$el/err1" ||
    fail "elastic, a leaving node's rank gone first: node 1's rank did not fail ($(cat "$el/err1"))"
# a spare that waited on a full job (MAX 1) sees it run through: that is no failure
rm -f "$el/stop"
timeout 60 "$run" -np 1 --nnodes 1:1 --store "file://$el/s10" "$child" "until=$el/stop" >"$el/out0" 2>"$el/err0" &
p0=$!
for _ in $(seq 200); do grep -qs 'elastic round 0:' "$el/err0" && break; sleep .05; done
timeout 60 "$run" -np 1 --nnodes 1:1 --store "file://$el/s10" "$child" >"$el/out1" 2>"$el/err1" &
p1=$!
for _ in $(seq 200); do grep -qs 'waiting for the next' "$el/err1" && break; sleep .05; done
touch "$el/stop"
wait "$p0"; r0=$?; wait "$p1"; r1=$?
[ "$r0$r1" = 00 ] && grep -q 'ran through .* while this node waited to join' "$el/err1" ||
    fail "elastic spare: exit $r0 $r1 ($(cat "$el"/err?))"
# two spellings of one store meet under the default job id: as this host names localhost,
# and (a mount namespace's /etc/hosts, where root may make one) as hosts do that name ::1
# first, where the agent on localhost once hosted a second store on ::1
printf '::1 localhost\n127.0.0.1 localhost\n' >"$tmp/hosts6"
v6() { unshare -m --propagation private sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$tmp/hosts6" "$@"; }
plain() { "$@"; }
ways=plain
if [ "$(id -u)" = 0 ] && unshare -m --propagation private true 2>/dev/null &&
    python3 -c "import socket; socket.socket(socket.AF_INET6).bind(('::1', 0))" 2>/dev/null; then
    ways="plain v6"
else
    echo "no mount namespace or IPv6 loopback: localhost as ::1 first not checked"
fi
for way in $ways; do
    read -r port < <(python3 -c "import socket
s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    rm -f "$el"/out? "$el"/err?
    $way timeout 60 "$run" -np 1 --nnodes 2:2 --store "tcp://127.0.0.1:$port" "$child" >"$el/out0" 2>"$el/err0" &
    p0=$!
    $way timeout 60 "$run" -np 1 --nnodes 2:2 --store "tcp://localhost:$port" "$child" >"$el/out1" 2>"$el/err1" &
    p1=$!
    wait "$p0"; r0=$?; wait "$p1"; r1=$?
    [ "$r0$r1" = 00 ] && [ "$(cat "$el"/out? | grep -c ' of 2 ok (round 0, restart 0)$')" = 2 ] ||
        fail "elastic, one store spelt twice ($way): exit $r0 $r1 ($(cat "$el"/out* "$el"/err*))"
done
# torchrun's --standalone with --rdzv-backend c10d (and endpoint localhost:0); a c10d
# endpoint on port 0 gives the ranks the port the store got
out=$(timeout 30 "$run" --nproc-per-node 2 --standalone --rdzv-backend c10d \
    --rdzv-endpoint localhost:0 "$child" 2>&1) || fail "--standalone --rdzv-backend c10d: $out"
out=$(timeout 30 "$run" --nproc-per-node 2 --nnodes 1 --rdzv-backend c10d \
    --rdzv-endpoint 127.0.0.1:0 "$child" 2>&1) || fail "--rdzv-endpoint 127.0.0.1:0: $out"
[ "$(echo "$out" | grep -c ' of 2 ok (round 0, restart 0)$')" = 2 ] || fail "--rdzv-endpoint 127.0.0.1:0: $out"
# torchrun's variables: its role, max restarts, one OpenMP thread per rank
a=$(timeout 10 "$run" -np 2 --role trainer --max-restarts 2 sh -c \
    'echo "$ROLE_NAME $ROLE_RANK/$ROLE_WORLD_SIZE $TORCHELASTIC_MAX_RESTARTS $OMP_NUM_THREADS"' 2>&1 | sort | tr '\n' ';')
[ "$a" = "trainer 0/2 2 1;trainer 1/2 2 1;" ] || fail "torchrun's variables: \"$a\""
a=$(OMP_NUM_THREADS=4 timeout 10 "$run" -np 2 sh -c 'echo "$ROLE_NAME $OMP_NUM_THREADS"' 2>&1 | sort -u)
[ "$a" = "default 4" ] || fail "the user's OMP_NUM_THREADS: \"$a\""
timeout 30 "$run" -np 1 --nnodes 1:2 --rdzv-conf bogus=1 --store "file://$el/s11" true 2>/dev/null; rc=$?
[ "$rc" = 2 ] || fail "--rdzv-conf bogus=1: exit $rc, expected 2"
# torchrun's --log-dir, --redirects and --tee: <dir>/<job>_*/attempt_<n>/<local rank>/
# {stdout,stderr}.log; redirected streams leave the console, tee'd ones reach both
# (with the rank's prefix); TORCHELASTIC_ERROR_FILE points beside them
out=$(timeout 30 "$run" -np 2 --log-dir "$el/logs" --redirects 1 --tee 0:2 --max-restarts 1 sh -c \
    'echo "out $RANK $TUTTI_RESTART_COUNT"; echo "err $RANK" >&2; echo "$TORCHELASTIC_ERROR_FILE" >"$(dirname "$TORCHELASTIC_ERROR_FILE")/ef"
     [ "$RANK$TUTTI_RESTART_COUNT" = 10 ] && exit 3; exit 0' 2>&1) || fail "--log-dir: exit $? ($out)"
d=$(echo "$el"/logs/*_*)
[ -d "$d" ] && [ "$(cat "$d/attempt_1/0/stdout.log")" = "out 0 1" ] && [ "$(cat "$d/attempt_0/1/stdout.log")" = "out 1 0" ] &&
    [ "$(cat "$d/attempt_1/0/stderr.log")" = "err 0" ] && [ ! -e "$d/attempt_1/1/stderr.log" ] &&
    [ "$(cat "$d/attempt_1/1/ef")" = "$d/attempt_1/1/error.json" ] || fail "--log-dir: $(find "$el/logs" -type f)"
echo "$out" | grep -q '^out' && fail "--redirects 1: stdout reached the console: $out"
[ "$(echo "$out" | grep -c '^\[0\] err 0$')" = 2 ] && [ "$(echo "$out" | grep -c '^err 1$')" = 2 ] ||
    fail "--tee 0:2: console: $out"
# a tee'd line reaches the console whole, its prefix with it, however busy the others
# writing there (the prefix and the line were two writes: another rank's line landed
# between them, seen once above beside other suites)
out=$(timeout 60 "$run" -np 2 --log-dir "$el/logs2" --tee 0:2 sh -c \
    'i=0; while [ $i -lt 3000 ]; do echo "line $RANK $i" >&2; i=$((i+1)); done' 2>&1) ||
    fail "--tee 0:2, 3000 lines each: exit $?"
[ "$(echo "$out" | grep -c '^\[0\] line 0 [0-9]*$')" = 3000 ] &&
    [ "$(echo "$out" | grep -c '^line 1 [0-9]*$')" = 3000 ] ||
    fail "--tee 0:2, 3000 lines each: $(echo "$out" | grep -v '^\[0\] line 0 [0-9]*$' | grep -v '^line 1 [0-9]*$' | head -5)"
timeout 30 "$run" -np 2 --tee 4 true 2>/dev/null; rc=$?
[ "$rc" = 2 ] || fail "--tee 4: exit $rc, expected 2"
# --tee with the console gone (its reader left): the log goes on and the rank lives, as
# torchrun's (without a log, the rank gets SIGPIPE as it would without tutti-run)
rm -rf "$el/logs"
{ timeout 30 "$run" -np 1 --log-dir "$el/logs" --tee 1 sh -c 'echo a; sleep .5; echo b; sleep .2; echo c' 2>/dev/null
  echo $? >"$el/rc"; } | head -1 >"$el/tee.out"
rc=$(cat "$el/rc") out=$(cat "$el/tee.out")
[ "$rc" = 0 ] && [ "$out" = "[0] a" ] && [ "$(cat "$el"/logs/*/attempt_0/0/stdout.log | tr '\n' ' ')" = "a b c " ] ||
    fail "--tee, console gone: exit $rc, console \"$out\", log: $(cat "$el"/logs/*/attempt_0/0/stdout.log)"
# torchrun's failure summary. Every rank has a TORCHELASTIC_ERROR_FILE (without --log-dir
# too, in the launch's temporary directory). Ranks 1 and 2 fail while tutti-run is
# stopped (SIGSTOP), so both are found failed at once: both are listed, each with its
# error file's traceback, and the root cause is the earlier by the files' timestamps
# (rank 2, which exits second: after rank 1 is a zombie; the exit status is rank 1's,
# the first to exit); the root cause's file goes to tutti-run's own
# TORCHELASTIC_ERROR_FILE with the exit status as "errorCode" (torchrun's @record)
cat >"$el/fail.sh" <<'EOS'
[ -n "$TORCHELASTIC_ERROR_FILE" ] && [ ! -e "$TORCHELASTIC_ERROR_FILE" ] || exit 9
echo $$ >"$ERR_DIR/pid$RANK"
[ "$RANK" = 0 ] && exec sleep 30
while [ ! -e "$ERR_DIR/go" ]; do sleep .05; done
if [ "$RANK" = 1 ]; then
    printf '{"message": {"message": "ValueError: later", "extraInfo": {"py_callstack": "Traceback:\\n  in later\\nValueError: later\\n", "timestamp": "2000000000"}}}' >"$TORCHELASTIC_ERROR_FILE"
    exit 3
fi
for _ in $(seq 200); do grep -q ') Z' "/proc/$(cat "$ERR_DIR/pid1")/stat" 2>/dev/null && break; sleep .02; done
printf '{"message": {"message": "KeyError: first", "extraInfo": {"py_callstack": "Traceback (most recent call last):\\n  File \\"t.py\\", line 3\\nKeyError: \\u00e9first\\n", "timestamp": "1000000000"}}}' >"$TORCHELASTIC_ERROR_FILE"
exit 4
EOS
mkdir -p "$el/errs" && rm -f "$el"/errs/* "$el/outer.json"
ERR_DIR=$el/errs TORCHELASTIC_ERROR_FILE=$el/outer.json timeout 30 "$run" -np 3 sh "$el/fail.sh" 2>"$el/sum" &
p0=$!
for _ in $(seq 200); do [ -s "$el/errs/pid2" ] && [ -s "$el/errs/pid1" ] && break; sleep .05; done
trun=$(children_of "$p0")
kill -STOP "$trun"
touch "$el/errs/go"
for _ in $(seq 200); do ! alive "$(cat "$el/errs/pid1")" && ! alive "$(cat "$el/errs/pid2")" && break; sleep .05; done
kill -CONT "$trun"
wait "$p0"; rc=$?
sum=$(cat "$el/sum")
root=$(echo "$sum" | sed -n '/^Root Cause (first observed failure):$/,/^====/p')
others=$(echo "$sum" | sed -n '/^Failures:$/,/^----/p')
[ "$rc" = 3 ] && echo "$sum" | grep -qx 'sh FAILED' &&
    echo "$root" | grep -qx '  rank      : 2 (local_rank: 2)' && echo "$root" | grep -q "^  exitcode  : 4 (pid: $(cat "$el/errs/pid2"))$" &&
    echo "$root" | grep -q "^  error_file: $TMPDIR/tutti-run-.*/attempt_0/2/error.json (removed at exit" &&
    echo "$root" | grep -qx '  traceback : Traceback (most recent call last):' &&
    echo "$root" | grep -qx '    File "t.py", line 3' && echo "$root" | grep -qx '  KeyError: éfirst' &&
    echo "$root" | grep -qx '  time      : 2001-09-0[89]_[0-9:]*' &&
    echo "$others" | grep -qx '  rank      : 1 (local_rank: 1)' && echo "$others" | grep -qx '  ValueError: later' &&
    ! echo "$sum" | grep -q 'rank      : 0' ||
    fail "failure summary: exit $rc: $sum"
python3 -c "import json, sys
m = json.load(open(sys.argv[1]))['message']
assert m['errorCode'] == 4 and m['message'] == 'KeyError: first', m
assert m['extraInfo']['py_callstack'].endswith('KeyError: \u00e9first\n'), m" "$el/outer.json" ||
    fail "failure summary: tutti-run's TORCHELASTIC_ERROR_FILE: $(cat "$el/outer.json")"
# a rank that ends on its own while the others are stopped is listed too: rank 0 writes
# its error (an older timestamp), ignores SIGTERM and exits 1 a moment later; rank 1
# crashes (SIGSEGV) first. The root cause is rank 0's, by timestamp, as torch's
out=$(timeout 30 "$run" -np 2 sh -c 'if [ "$RANK" = 0 ]; then trap "" TERM
    printf "{\"message\": {\"message\": \"E0\", \"extraInfo\": {\"py_callstack\": \"Traceback:\\\\nE0: first\", \"timestamp\": \"%s\"}}}" \
        $(($(date +%s) - 100)) >"$TORCHELASTIC_ERROR_FILE"; sleep 1; exit 1; fi
    sleep .3; kill -SEGV $$' 2>&1)
rc=$?
root=$(echo "$out" | sed -n '/^Root Cause (first observed failure):$/,/^====/p')
others=$(echo "$out" | sed -n '/^Failures:$/,/^----/p')
[ "$rc" = 139 ] && echo "$root" | grep -qx '  rank      : 0 (local_rank: 0)' && echo "$root" | grep -qx '  E0: first' &&
    echo "$others" | grep -qx '  exitcode  : -11 (pid: [0-9]*)' &&
    echo "$others" | grep -qx '  traceback : Signal 11 (SIGSEGV) received by PID [0-9]*' ||
    fail "failure summary, a rank failing while stopped: exit $rc: $out"
# a rank killed by a signal leaves no error file: torchrun's words for it, and tutti-run's
# own file says so; torch's @record on a real Python rank (where torch is installed)
out=$(TORCHELASTIC_ERROR_FILE=$el/outer.json timeout 30 "$run" -np 2 sh -c '[ "$RANK" = 1 ] && kill -KILL $$; sleep 30' 2>&1)
rc=$?
[ "$rc" = 137 ] && echo "$out" | grep -qx '  exitcode  : -9 (pid: [0-9]*)' && echo "$out" | grep -qx '  error_file: <N/A>' &&
    echo "$out" | grep -qx '  traceback : Signal 9 (SIGKILL) received by PID [0-9]*' ||
    fail "failure summary, a rank killed: exit $rc: $out"
python3 -c "import json, sys
m = json.load(open(sys.argv[1]))['message']
assert m['errorCode'] == -9 and m['message'].startswith('ChildFailedError: sh FAILED'), m
assert 'Signal 9 (SIGKILL)' in m['extraInfo']['py_callstack'], m" "$el/outer.json" ||
    fail "failure summary, a rank killed: tutti-run's TORCHELASTIC_ERROR_FILE: $(cat "$el/outer.json")"
if /usr/bin/python3 -c "import torch.distributed.elastic.multiprocessing.errors" 2>/dev/null; then
    printf '%s\n' 'import os' 'from torch.distributed.elastic.multiprocessing.errors import record' \
        '@record' 'def main():' '    if os.environ["RANK"] == "1":' '        raise ValueError("boom from rank 1")' \
        '    os.system("sleep 30")' 'main()' >"$el/rec.py"
    out=$(timeout 60 "$run" -np 2 /usr/bin/python3 "$el/rec.py" 2>&1)
    rc=$?
    [ "$rc" = 1 ] && echo "$out" | grep -qx "$el/rec.py FAILED" && echo "$out" | grep -qx '  rank      : 1 (local_rank: 1)' &&
        echo "$out" | grep -q "^    File \"$el/rec.py\", line 6, in main$" && echo "$out" | grep -qx '  ValueError: boom from rank 1' ||
        fail "failure summary, torch's @record: exit $rc: $out"
else
    echo "no torch here: the summary of torch's @record not checked"
fi
# elastic: the node whose ranks failed says it when the restarts are used up
out=$(timeout 30 "$run" -np 2 --nnodes 1:2 --store "file://$el/s20" sh -c '[ "$RANK" = 1 ] && exit 5; sleep 30' 2>&1)
rc=$?
[ "$rc" = 5 ] && echo "$out" | grep -q 'max-restarts 0 used up' && echo "$out" | grep -qx 'Root Cause (first observed failure):' &&
    echo "$out" | grep -qx '  exitcode  : 5 (pid: [0-9]*)' || fail "elastic failure summary: exit $rc: $out"
tmpdir_empty "elastic"

# a rank's child that ignores SIGTERM, left when the other rank's failure stopped the
# run: SIGKILLed at the stop's deadline although no rank runs any more (it outlived the
# launch, one more each restart, found by review), with and without restarts
for restarts in 0 2; do
    m=ignterm-$$-$restarts
    marks="$marks $m"
    t0=$(ms)
    TEST_MARK=$m timeout 60 "$run" -np 2 --max-restarts $restarts sh -c \
        'if [ "$TUTTI_RANK" = 0 ]; then (trap "" TERM; exec sleep 40) & sleep 40; else sleep .3; exit 3; fi' \
        </dev/null >/dev/null 2>&1
    rc=$?
    [ "$rc" = 3 ] || fail "a child ignoring SIGTERM, --max-restarts $restarts: exit $rc"
    left=$(all_gone "$m") || fail "a child ignoring SIGTERM, --max-restarts $restarts: $left"
    took=$(($(ms) - t0))
    [ "$took" -lt $((12000 * (restarts + 1))) ] || fail "a child ignoring SIGTERM: took $took ms"
done
echo "test_run: a rank's child ignoring SIGTERM is SIGKILLed with the stop, restarts too"
# SIGUSR1 and SIGUSR2 to the launcher reach the ranks, which go on (a batch system's
# warning before the end: they took the launcher down, and the ranks with it)
m=usr-$$
marks="$marks $m"
TEST_MARK=$m "$run" -np 2 sh -c \
    'trap "echo usr1 >$0.\$TUTTI_RANK; exit 0" USR1; echo up >$0.up.\$TUTTI_RANK; while :; do sleep .05; done' \
    "$tmp/usr" </dev/null >/dev/null 2>&1 &
lp=$!
for _ in $(seq 100); do [ -e "$tmp/usr.up.0" ] && [ -e "$tmp/usr.up.1" ] && break; sleep .05; done
kill -USR1 "$lp"
wait_bounded "$lp"
rc=$?
[ "$rc" = 0 ] && [ -e "$tmp/usr.0" ] && [ -e "$tmp/usr.1" ] ||
    fail "SIGUSR1 to the launcher: exit $rc, ranks that saw it: $(ls "$tmp" | grep -c '^usr\.[01]$')"
all_gone "$m" >/dev/null || fail "SIGUSR1: something left"
echo "test_run: SIGUSR1 to the launcher reaches every rank, which exit 0"
tmpdir_empty "signals"

# TUTTI_DEBUG as the library reads it (lib/base/log.c, built into tutti-run): its one info
# line (a task of a Slurm step, here two pretend tasks of one node) in any case, with the
# library's prefix "tutti host:pid:rank INFO", and never at warn or error (WARN and none
# printed it, bare)
slurm_tasks() {
    local t
    for t in 0 1; do
        env SLURM_JOB_ID=$$ SLURM_STEP_ID=0 SLURM_PROCID=$t SLURM_STEP_NUM_TASKS=2 \
            SLURM_STEP_TASKS_PER_NODE='1(x2)' SLURM_STEP_NUM_NODES=1 SLURM_STEP_NODELIST=localhost \
            TUTTI_DEBUG=$1 timeout 30 "$run" -np 1 true >"$tmp/task.$t" 2>&1 &
    done
    wait
    cat "$tmp/task.0" "$tmp/task.1"
}
out=$(slurm_tasks INFO)
echo "$out" | grep -q "^tutti [^ ]*:[0-9]*:- INFO tutti-run: Slurm task 0 of 2: node 0 of the job, store tcp://127.0.0.1:[0-9]* (served here)$" &&
    echo "$out" | grep -q "^tutti [^ ]*:[0-9]*:- INFO tutti-run: Slurm task 1 of 2" ||
    fail "TUTTI_DEBUG=INFO, two tasks of a Slurm step: $out"
for level in WARN none error; do
    out=$(slurm_tasks $level)
    echo "$out" | grep -q "Slurm task" && fail "TUTTI_DEBUG=$level printed the info line: $out"
done
echo "test_run: TUTTI_DEBUG read as the library reads it, its line with the library's prefix"
tmpdir_empty "TUTTI_DEBUG"

echo "test_run: all checks passed"
