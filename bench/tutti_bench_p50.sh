#!/usr/bin/env bash
# One tutti-bench row as one line of JSON (for bench/ab_cmd.py): the in-place p50 (us) of
# an allreduce of SIZE bytes on NP local ranks, ITERS timed after WARMUP.
#   bench/tutti_bench_p50.sh NP SIZE ITERS WARMUP [TRANSPORT]
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$here/build/bench/tutti-bench" --coll allreduce -np "$1" -b "$2" -e "$2" -n "$3" -w "$4" \
    --transport "${5:-shm}" --json "$out" > /dev/null
/usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[0]; print(json.dumps({"p50_us": r["in_place"]["p50_us"]}))' "$out"
