#!/usr/bin/env bash
# Set-up under a limit of open files (ulimit -n) too low for the job: a rank needs a few
# descriptors per peer (shm: its pidfd and wake-up socket, and with TUTTI_SHM_RESERVE=
# fallocate the pair's segment until its first use; tcp: the socket). Before, a rank
# hit EMFILE half-way through set-up and its peers waited, or failed naming another
# rank; now each transport counts what it needs first:
#   1. 24 ranks over shm, hard limit 48: init fails at once (well within the timeout)
#      on every rank, saying how many descriptors are needed, how many the limit allows
#      and what to do;
#   2. the same with the transport left to auto: shm refuses, the local peers go over tcp
#      (a socket each, two while set-up hands it over; one warning) and the results are
#      right;
#   3. soft limit 30, hard 4096: the soft limit is raised (the log says so) and the job
#      runs over shm, results right;
#   4. 24 ranks over tcp, hard limit 20: fails at once, saying so;
#   5. rank 1 of 3 alone short of descriptors, over tcp: rank 2, which reads rank 1's
#      address, fails at once with rank 1's reason;
#   6. case 4 with TUTTI_TCP_CONNECT=lazy and ring allreduces: a rank connects only the
#      two peers it talks to, so the job runs under 20, results right.
#
#   tests/test_fd_limit.sh BUILD/bench/tutti-bench
set -u
bench=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
    echo "test_fd_limit: FAIL: $*"
    exit 1
}
export TUTTI_SOCKET_IFNAME=lo
# run SOFT HARD OUT ARGS...: tutti-bench under that limit; sets rc and secs
run() {
    local soft=$1 hard=$2 out=$3
    shift 3
    local t0=$SECONDS
    (ulimit -Sn "$soft" && ulimit -Hn "$hard" && exec timeout 120 "$bench" "$@") >"$out" 2>&1
    rc=$?
    secs=$((SECONDS - t0))
}
args=(-np 24 -b 4 -e 64K -f 64 -n 2 -w 1 -c -t 60)

# 1. shm, hard limit 48
out="$work/shm.txt"
run 48 48 "$out" --transport shm "${args[@]}"
[ $rc != 0 ] || { cat "$out"; fail "24 ranks over shm under 48 open files ran"; }
[ $secs -lt 20 ] || { cat "$out"; fail "shm: failed after $secs s (timeout 60 s)"; }
said=$(grep -c "shm: 23 peers need at least [0-9]* more open files ([23] each), [0-9]* are open and the limit is 48 (ulimit -n; hard limit 48, ulimit -Hn): raise it, or run fewer ranks" "$out")
[ "$said" -ge 1 ] || { cat "$out"; fail "shm: no error that says what the limit is short of"; }
! grep -v "need at least" "$out" | grep -q "Too many open files" ||
    { cat "$out"; fail "shm: a rank ran out of descriptors anyway"; }
echo "1. 24 ranks over shm, limit 48: exit $rc after $secs s; $said lines say what is short"

# 2. auto: shm refuses, tcp carries the job
out="$work/auto.txt"
run 48 48 "$out" "${args[@]}"
[ $rc = 0 ] || { cat "$out"; fail "auto under 48 open files: exit $rc"; }
grep -q "WARN transports: shm could not connect the 23 local peers (shm: 23 peers need at least" "$out" ||
    { cat "$out"; fail "auto: no warning that shm refused"; }
grep -q "^# cost model table tcp" "$out" || { cat "$out"; fail "auto: the job did not run over tcp"; }
echo "2. auto, limit 48: $(grep -cE '^ +[0-9]+ ' "$out") sizes right over tcp"

# 3. a soft limit below what shm needs, the hard one above: raised
out="$work/raise.txt"
TUTTI_DEBUG=info run 30 4096 "$out" --transport shm "${args[@]}"
[ $rc = 0 ] || { cat "$out"; fail "soft 30, hard 4096: exit $rc"; }
raised=$(grep -c "INFO shm: raised this process's limit of open files from 30 to [0-9]* for 23 peers" "$out")
[ "$raised" = 24 ] || { cat "$out"; fail "soft 30: $raised ranks said they raised the limit"; }
echo "3. soft 30, hard 4096: every rank raised its limit, $(grep -cE '^ +[0-9]+ ' "$out") sizes right over shm"

# 4. tcp, hard limit 20
out="$work/tcp.txt"
run 20 20 "$out" --transport tcp "${args[@]}"
[ $rc != 0 ] || { cat "$out"; fail "24 ranks over tcp under 20 open files ran"; }
[ $secs -lt 20 ] || { cat "$out"; fail "tcp: failed after $secs s (timeout 60 s)"; }
grep -q "tcp: 23 peers need at least [0-9]* more open files (1 each), [0-9]* are open and the limit is 20 (ulimit -n; hard limit 20, ulimit -Hn)" "$out" ||
    { cat "$out"; fail "tcp: no error that says what the limit is short of"; }
echo "4. 24 ranks over tcp, limit 20: exit $rc after $secs s, saying why"

# 5. one rank short (rank 1 of 3, started by hand, each with its own limit): over tcp the
# higher rank reads its refusal where its address would be and fails at once naming
# it; the lower one waits for its connection until the timeout (4 s here), naming it
store="$work/store5"
pids=()
for r in 0 1 2; do
    lim=4096
    [ $r = 1 ] && lim=9
    (ulimit -Sn $lim && ulimit -Hn $lim && TUTTI_RANK=$r TUTTI_WORLD_SIZE=3 \
        TUTTI_STORE="file://$store" TUTTI_JOB_ID="fd-limit-$$" TUTTI_TRANSPORT=tcp \
        TUTTI_TIMEOUT_MS=4000 exec timeout 60 "$bench" -b 4 -e 4 -n 1 -w 0) \
        >"$work/r$r.txt" 2>&1 &
    pids+=($!)
done
t0=$SECONDS
wait "${pids[2]}"
rc2=$? secs2=$((SECONDS - t0))
wait "${pids[0]}" "${pids[1]}"
[ $rc2 != 0 ] || { cat "$work"/r?.txt; fail "one rank short: rank 2 ran"; }
[ $secs2 -lt 3 ] || { cat "$work"/r?.txt; fail "rank 2 failed after $secs2 s (timeout 4 s)"; }
grep -q "tcp: rank 1 could not set up: tcp: 2 peers need at least [0-9]* more open files (1 each), [0-9]* are open and the limit is 9" "$work/r2.txt" ||
    { cat "$work"/r?.txt; fail "rank 2 does not say why rank 1 could not set up"; }
# rank 0 waits to accept rank 1's connection: it stops at rank 1's failed set-up (session
# 95; before, at its timeout naming rank 1 as missing) and gives its reason. Rank 2 learns
# of rank 1's failure from the refusal and may post its own report first: rank 0 then
# stops at rank 2's report, which names rank 1 and the reason (a CI run, session 102)
grep -Eq "rank 1 (failed its set-up|could not set up): .*open files" "$work/r0.txt" ||
    { cat "$work"/r?.txt; fail "rank 0 does not name rank 1 and why"; }
echo "5. rank 1 short of descriptors: rank 2 failed after $secs2 s naming rank 1's reason"
# 6. lazily, a ring needs two links a rank
out="$work/lazy.txt"
TUTTI_TCP_CONNECT=lazy TUTTI_DEBUG=info run 20 20 "$out" --transport tcp --algo ring "${args[@]}"
[ $rc = 0 ] || { cat "$out"; fail "24 ranks over tcp connected lazily under 20: exit $rc"; }
grep -q "INFO tcp: 23 peers need at least [0-9]* more open files (1 each), [0-9]* are open and the limit is 20 .*; connecting lazily, set-up goes on" "$out" ||
    { cat "$out"; fail "lazy: no line that says the limit is short of a full mesh"; }
links=$(grep -c "INFO tcp: rank 0 connected to rank" "$out")
[ "$links" = 2 ] || { cat "$out"; fail "lazy: rank 0 connected $links links for a ring"; }
echo "6. 24 ranks over tcp connected lazily, limit 20: $(grep -cE '^ +[0-9]+ ' "$out") sizes right, rank 0 holds $links links"
echo "test_fd_limit: ok"
