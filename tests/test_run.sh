#!/usr/bin/env bash
# tutti-run: ranks get their variables and meet; a failing rank, a timeout and a bad
# command line each give the right exit status promptly; the temporary store goes away.
#   test_run.sh TUTTI_RUN LAUNCH_CHILD
set -u
run=$1 child=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$run" -np 3 "$child") || fail "3 ranks: exit $?"
[ "$(echo "$out" | grep -c ' of 3 ok')" = 3 ] || fail "3 ranks: output: $out"

out=$("$run" -np 2 --tag -- "$child") || fail "--tag: exit $?"
echo "$out" | grep -q '^\[1\] rank 1 of 2 ok$' || fail "--tag: output: $out"

t0=$(date +%s)
"$run" -np 3 "$child" fail=1 2>/tmp/test-run-err.$$; rc=$?
t1=$(date +%s)
[ "$rc" = 3 ] || fail "fail=1: exit $rc, expected 3 ($(cat /tmp/test-run-err.$$))"
grep -q 'rank 1 exited with status 3' /tmp/test-run-err.$$ || fail "fail=1: no rank named: $(cat /tmp/test-run-err.$$)"
[ $((t1 - t0)) -lt 20 ] || fail "fail=1 took $((t1 - t0)) s"
rm -f /tmp/test-run-err.$$

t0=$(date +%s)
"$run" -np 2 --timeout 2 "$child" hang 2>/dev/null; rc=$?
t1=$(date +%s)
[ "$rc" = 124 ] || fail "--timeout: exit $rc, expected 124"
[ $((t1 - t0)) -lt 15 ] || fail "--timeout took $((t1 - t0)) s"

"$run" -np 0 "$child" 2>/dev/null; [ $? = 2 ] || fail "-np 0 accepted"
"$run" -np 2 2>/dev/null; [ $? = 2 ] || fail "no program accepted"
"$run" -np 2 --nnodes 2 --node-rank 0 "$child" 2>/dev/null; [ $? = 2 ] || fail "2 nodes without a tcp store accepted"
"$run" -np 1 /nonexistent/program 2>/dev/null; [ $? = 127 ] || fail "missing program: not 127"

# the temporary store: file://DIR while the ranks run, gone afterwards (also after a failure)
for how in ok fail; do
    url=$("$run" -np 1 sh -c 'echo "$TUTTI_STORE"; [ '"$how"' = ok ]' 2>/dev/null)
    dir=${url#file://}
    case $url in file:///tmp/tutti-run-*) ;; *) fail "store URL \"$url\"" ;; esac
    [ ! -e "$dir" ] || fail "$how: temporary store $dir left behind"
done
echo "test_run: all checks passed"
