# shellcheck shell=bash
# shellcheck disable=SC2154 # run and bench: the sourcing test's
# What tests/test_hosts.sh (a stand-in for ssh) and tests/test_ssh.sh (OpenSSH) share:
# the same launches of tutti-run -H on hosts A and B (bench/netns-lib.sh's namespaces),
# B reached through a remote shell. Sourced after netns_setup, with run, bench, A, B, NS,
# WORK, inA and fail set; HB: B as -H names it (default B; test_ssh: root@B).
#
#   hosts_job_procs I JOB       the processes on host I whose environment has TUTTI_JOB_ID
#                               JOB (the launch's agents and ranks there)
#   hosts_check_job RSH JOB     3 ranks, 2 on A and 1 on B, of tutti-bench -c (an allreduce
#                               whose every value is checked): exit 0
#   hosts_check_agent RSH [SH]  the agent on B, as its rank reads it (its parent's command
#                               line): the launch's store, and no secret (which the rank
#                               has, 48 hex digits in TUTTI_AUTH_TOKEN); SH: more for the
#                               rank on B to run, its output left in $agent_out
#   hosts_check_fail RSH JOB    -np 3 on A:1,B:2, the rank on B exits 3: the launch exits 3
#                               within 15 s, and nothing of the job is left on either host

hosts_job_procs() {
    local p
    for p in $(ip netns pids "${NS[$1]}"); do
        grep -qxzs "TUTTI_JOB_ID=$2.*" "/proc/$p/environ" && echo "$p"
    done
}

hosts_check_job() { # rsh name [tutti-run option]
    local t0 rc ms rows
    t0=$(date +%s%N)
    # shellcheck disable=SC2086
    inA timeout 60 "$run" -H "$A:2,${HB:-$B}:1" --rsh "$1" -x LD_LIBRARY_PATH ${3:-} --job-id "$2" \
        "$bench" -b 4 -e 1M -f 16 -n 3 -w 1 -c >"$WORK/$2.txt" 2>&1
    rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    rows=$(grep -cE '^ +[0-9]+ ' "$WORK/$2.txt")
    [ "$rc" = 0 ] && [ "$rows" -ge 4 ] ||
        { cat "$WORK/$2.txt"; fail "3 ranks on A and B: exit $rc, $rows rows"; }
    echo "3 ranks on $A (2) and $B (1, through $1): exit 0, $rows sizes right, $ms ms"
}

hosts_check_agent() {
    local rc line
    agent_out=$(inA timeout 30 "$run" -H "$A:1,${HB:-$B}:1" --rsh "$1" -x LD_LIBRARY_PATH --tag sh -c \
        '[ "$RANK" = 1 ] && { tr "\0" " " </proc/$PPID/cmdline; echo; echo "token ${#TUTTI_AUTH_TOKEN}"; '"${2:-:}"'; }; true' 2>&1)
    rc=$?
    line=$(echo "$agent_out" | grep '^\[1\] .*--agent')
    [ "$rc" = 0 ] && echo "$line" | grep -q -- "--store tcp://$A:[0-9]* " &&
        echo "$agent_out" | grep -qx '\[1\] token 48' || fail "the agent on B: exit $rc: $agent_out"
    echo "$line" | grep -qiE '[0-9a-f]{32}' && fail "a secret on the agent's command line: $line"
    echo "the agent on $B: the store at $A on its command line, the secret only in its ranks' environment"
}

hosts_check_fail() {
    local t0 rc ms
    t0=$(date +%s%N)
    inA timeout 60 "$run" -H "$A:1,${HB:-$B}:2" -np 3 --rsh "$1" -x LD_LIBRARY_PATH --job-id "$2" \
        sh -c '[ "$RANK" = 2 ] && exit 3; exec sleep 30' >"$WORK/$2.txt" 2>&1
    rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    [ "$rc" = 3 ] && grep -q "host ${HB:-$B} (ranks 1..2) exited with status 3" "$WORK/$2.txt" ||
        { cat "$WORK/$2.txt"; fail "a rank on B exits 3: launch exit $rc"; }
    [ "$ms" -lt 15000 ] || fail "a rank on B exits 3: the launch took $ms ms"
    for _ in $(seq 50); do
        [ -z "$(hosts_job_procs 0 "$2")$(hosts_job_procs 1 "$2")" ] && break
        sleep .1
    done
    [ -z "$(hosts_job_procs 0 "$2")$(hosts_job_procs 1 "$2")" ] ||
        fail "left after the failure: $(hosts_job_procs 0 "$2") $(hosts_job_procs 1 "$2")"
    echo "a rank on $B exits 3: the launch exits 3 in $ms ms, nothing left on either host"
}
