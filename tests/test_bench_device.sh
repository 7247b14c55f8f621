#!/usr/bin/env bash
# tutti-bench --device cuda against the stand-in driver library (tests/fake_libcuda.c,
# found as libcuda.so.1 through LD_LIBRARY_PATH): every rank's buffers in its "device"
# memory, which the host cannot touch, the inputs written and the results read through
# host copies; every result checked by the bench (-c: exit 1 on a wrong value), in and
# out of place, over tcp and shm, for allreduce, allgather and a rooted scatter. The
# header must say where the buffers are. On a GPU the same command runs for real.
#   test_bench_device.sh TUTTI_BENCH LIBFAKECUDA
set -u
bench=$1 fake=$(realpath "$2")
fail() { echo "FAIL: $*" >&2; exit 1; }
dir=$(mktemp -d /tmp/test-bench-device.XXXXXX)
trap 'rm -rf "$dir"' EXIT
ln -s "$fake" "$dir/libcuda.so.1"
for tp in tcp shm; do
    for coll in allreduce allgather scatter; do
        LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} TUTTI_TRANSPORT=$tp \
            timeout 100 "$bench" -np 3 --device cuda --coll "$coll" -r 2 -c -b 4 -e 1M -f 16 \
            -n 4 -w 1 -t 90 >"$dir/out" 2>&1 ||
            fail "$coll over $tp: exit $?: $(tail -n 5 "$dir/out")"
        grep -q "^# buffers in CUDA device memory (--device cuda)" "$dir/out" ||
            fail "$coll over $tp: the header does not say --device cuda: $(head -n 6 "$dir/out")"
        grep -q "^# Out of bounds values : 0 OK" "$dir/out" || fail "$coll over $tp: wrong values"
        rows=$(grep -c '^ *[0-9]' "$dir/out")
        [ "$rows" -ge 4 ] || fail "$coll over $tp: $rows rows, expected 4 or 5"
    done
done
# --stream: the calls stream-ordered (tutti_comm_set_stream), each result checked after
# its stream has run it
LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout 100 "$bench" -np 2 --stream \
    --coll allgather -c -b 4 -e 1M -f 32 -n 4 -w 1 -t 90 >"$dir/out" 2>&1 ||
    fail "--stream: exit $?: $(tail -n 5 "$dir/out")"
grep -q "calls stream-ordered (--stream)" "$dir/out" || fail "--stream: header: $(head -n 6 "$dir/out")"
grep -q "^# Out of bounds values : 0 OK" "$dir/out" || fail "--stream: wrong values"
# no driver to load: a clear error, exit 3
env -u LD_LIBRARY_PATH timeout 60 "$bench" -np 2 --device cuda -b 4 -e 4 -n 1 -t 50 \
    >"$dir/out" 2>&1
rc=$?
if [ -e /dev/nvidiactl ]; then
    [ $rc = 0 ] || fail "on this GPU machine: exit $rc: $(tail -n 3 "$dir/out")"
else
    [ $rc = 3 ] && grep -q "libcuda.so.1" "$dir/out" ||
        fail "without a driver: exit $rc: $(tail -n 3 "$dir/out")"
fi
echo "ok: allreduce, allgather and scatter on --device cuda over tcp and shm, and --stream"
