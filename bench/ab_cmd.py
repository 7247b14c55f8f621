#!/usr/bin/env python3
"""Two benchmark commands in alternating runs (A B, then B A, ... for N pairs); each
prints one line of JSON holding KEY. Prints each side's median, the median B/A ratio and
its spread (min..max over the pairs), one line of JSON. Only same-run ratios mean
anything on a shared machine.

  ab_cmd.py --key step_ms [-p PAIRS] -- 'command A' 'command B'"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys


def run(cmd, key):
    out = subprocess.run(shlex.split(cmd), capture_output=True, text=True, timeout=1800)
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)[key]
    sys.exit(f"ab_cmd: {cmd!r} printed no JSON (rc {out.returncode}): {out.stderr[-2000:]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--key", required=True)
    p.add_argument("-p", "--pairs", type=int, default=5)
    p.add_argument("a")
    p.add_argument("b")
    args = p.parse_args()
    va, vb, ratios = [], [], []
    for i in range(args.pairs):
        order = [(args.a, va), (args.b, vb)] if i % 2 == 0 else [(args.b, vb), (args.a, va)]
        for cmd, into in order:
            into.append(run(cmd, args.key))
        ratios.append(vb[-1] / va[-1])
    print(json.dumps({"key": args.key, "a": args.a, "b": args.b, "pairs": args.pairs,
                      "median_a": statistics.median(va), "median_b": statistics.median(vb),
                      "ratio_b_over_a": statistics.median(ratios),
                      "spread": [min(ratios), max(ratios)], "all_a": va, "all_b": vb}))


if __name__ == "__main__":
    main()
