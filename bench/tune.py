#!/usr/bin/env python3
"""Write a tuning file for TUTTI_COST_MODEL=tune=FILE: for each transport, rank count and
collective, time every algorithm with `tutti-bench --algo all` R times, take per size
the algorithm with the least median p50, and write one line per (transport, ranks):

    <transport> <ranks> <TUTTI_ALGO spec>     e.g.  shm 2 allreduce:rd@<64K,hd@<16M,ring

A measured size's winner serves from that size up to the next measured size (TUTTI_ALGO
bounds are "below"); sizes under the first measured one take the first winner. Lines of
FILE for other (transport, ranks) pairs are kept; the rest is replaced.

  bench/tune.py [-o FILE] [--build DIR] [--transports "shm tcp"] [--ranks "2 4"]
                [--colls "allreduce broadcast ..."] [-b 4] [-e 256M] [-f 4] [-n 20] [-w 5]
                [-R 3] [--fresh] [--window] [--from-json F.json ...]

--fresh passes tutti-bench's --fresh: each call on input just rewritten, after a barrier;
without it calls run back to back, and a rooted collective's calls overlap across ranks
(a chain's root is free after one send). --window passes its --window: every rank starts
each call at one instant, no barrier (with --fresh, as bench/peers times every system
since session 59).

--from-json builds the file from `tutti-bench --algo all --json` outputs instead of
running anything (repeats of one configuration are medianed); --save DIR keeps each
run's JSON there.

--check (with runs or --from-json) writes no file: per (transport, ranks, collective)
and size it prints how much slower the model's pick (the JSON's "model": the cost model
the runs had, --model SPEC sets their TUTTI_COST_MODEL, e.g. tune=FILE; none: the table)
was than the fastest algorithm, each by its median p50 over the repeats, and lists the
sizes where that exceeds --slack (default 10 %).

--cross (repeats of each configuration needed) tests the tuning out of sample: each
repeat in turn is held out, the pick measured on the others is timed against that
repeat's fastest, and the table model's pick (the runs' "model") likewise."""
import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLS = "allreduce broadcast reduce allgather reduce_scatter gather scatter alltoall scan exscan"
PER_RANK_BLOCK = {"gather", "scatter", "alltoall"}  # selection sees one rank's block


def selection_bytes(row):
    """What the library's selection sees for this row (tutti-bench's select_bytes)."""
    if row["coll"] in PER_RANK_BLOCK:
        return row["size"] // row["ranks"]
    return row["size"]


def run_bench(a, transport, ranks, coll):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [os.path.join(a.build, "bench", "tutti-bench"), "-np", str(ranks), "--coll", coll,
           "--transport", transport, "--algo", "all", "-b", a.b, "-e", a.e, "-f", str(a.f),
           "-n", str(a.n), "-w", str(a.w), "--json", path] + (["--fresh"] if a.fresh else []) + (
               ["--window"] if a.window else [])
    env = dict(os.environ)
    env.pop("TUTTI_COST_MODEL", None)
    env.pop("TUTTI_ALGO", None)
    if a.model:
        env["TUTTI_COST_MODEL"] = a.model
    try:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, timeout=3600)
        with open(path) as f:
            rows = json.load(f)
        if a.save:
            os.makedirs(a.save, exist_ok=True)
            with open(os.path.join(a.save, f"{transport}-{ranks}-{coll}-{a.rep}.json"), "w") as f:
                json.dump(rows, f)
        return rows
    finally:
        os.unlink(path)


def medians(rows):
    """size -> algorithm -> median p50 over the repeats, and size -> the model's picks."""
    times = collections.defaultdict(lambda: collections.defaultdict(list))
    picks = collections.defaultdict(list)
    for r in rows:
        for algo, t in r["algos"].items():
            if t and t.get("p50_us") is not None:
                times[r["size"]][algo].append(t["p50_us"])
        if r.get("model"):
            picks[r["size"]].append(r["model"])
    return ({s: {al: statistics.median(v) for al, v in d.items()} for s, d in times.items()},
            picks)


def cross(groups, slack):
    """Leave-one-out over the repeats: the choice measured on the other repeats (the
    tuning file's pick) against the fastest of the held-out repeat, per size; and the
    table model's pick (the runs' "model") the same way. Return (misses, sizes) of the
    tuned picks."""
    misses = total = tmiss = 0
    worst = (0.0, None)
    for (tp, ranks, coll), rows in sorted(groups.items()):
        seen = collections.Counter()
        reps = collections.defaultdict(list)  # the k-th row of a size is repeat k's
        for r in rows:
            reps[seen[r["size"]]].append(r)
            seen[r["size"]] += 1
        if len(reps) < 2:
            continue
        line = []
        for k, held in sorted(reps.items()):
            train, _ = medians([r for j, rs in reps.items() if j != k for r in rs])
            for r in held:
                t = {al: v["p50_us"] for al, v in r["algos"].items()
                     if v and v.get("p50_us") is not None}
                if r["size"] not in train or not t:
                    continue
                pick = min(train[r["size"]], key=train[r["size"]].get)
                best = min(t, key=t.get)
                over = t[pick] / t[best] - 1 if pick in t else 0.0
                total += 1
                if r.get("model") in t and t[r["model"]] / t[best] - 1 > slack:
                    tmiss += 1
                if over > slack:
                    misses += 1
                    line.append(f"{r['size']} B {pick} +{100 * over:.0f}% ({best}, run {k + 1})")
                if over > worst[0]:
                    worst = (over, f"{tp} {ranks} {coll} {r['size']} B run {k + 1}: {pick} "
                                   f"against {best}")
        print(f"{tp} {ranks} {coll:14s} x{len(reps)}: " + ("; ".join(line) if line else "within"))
    print(f"# leave-one-out: the tuned pick within {100 * slack:.0f}% of the held-out run's "
          f"fastest at {total - misses} of {total} (size, run)s; the table model's at "
          f"{total - tmiss}" + (f"; worst +{100 * worst[0]:.1f}% ({worst[1]})" if worst[1] else ""))
    return misses, total


def check(groups, slack):
    """Print the model's pick against the fastest per size; return (misses, sizes).

    A miss is the pick's median p50 over more than (1 + slack) x the fastest's. Beside it
    the range of the same ratio repeat by repeat (each run's pick against that run's
    time of the median's fastest): a miss is "in every repeat" when the lowest of them is
    over 1 + slack too, else the repeats disagree and the two are within the run-to-run
    drift of each other."""
    misses = total = every = 0
    worst = (0.0, None)
    for (tp, ranks, coll), rows in sorted(groups.items()):
        med, picks = medians(rows)
        per_run = collections.defaultdict(list)  # size -> [{algo: p50}] in run order
        for r in rows:
            per_run[r["size"]].append({al: t["p50_us"] for al, t in r["algos"].items()
                                       if t and t.get("p50_us") is not None})
        line = []
        for size in sorted(med):
            if not picks[size]:
                continue
            pick = collections.Counter(picks[size]).most_common(1)[0][0]
            best = min(med[size], key=med[size].get)
            if pick not in med[size]:
                continue
            over = med[size][pick] / med[size][best] - 1
            total += 1
            if over > slack:
                misses += 1
                ratios = [t[pick] / t[best] for t in per_run[size]
                          if t.get(pick) and t.get(best)]
                spread = f"; repeats {min(ratios):.2f}-{max(ratios):.2f}" if ratios else ""
                if ratios and min(ratios) > 1 + slack:
                    every += 1
                    spread += ", every one over"
                line.append(f"{size} B {pick} +{100 * over:.0f}% (fastest {best}{spread})")
            if over > worst[0]:
                worst = (over, f"{tp} {ranks} {coll} {size} B: {pick} against {best}")
        n = len(rows) // max(1, len(med))
        print(f"{tp} {ranks} {coll:14s} x{n}: " + ("; ".join(line) if line else "within"))
    print(f"# the model's pick within {100 * slack:.0f}% of the fastest at {total - misses} of "
          f"{total} sizes; over it in every repeat at {every}" +
          (f"; worst +{100 * worst[0]:.1f}% ({worst[1]})" if worst[1] else ""))
    return misses, total


def spec_of(rows):
    """The TUTTI_ALGO spec of one collective from its rows (one per size and repeat)."""
    times = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in rows:
        for algo, t in r["algos"].items():
            if t and t.get("p50_us") is not None:
                times[selection_bytes(r)][algo].append(t["p50_us"])
    sizes = sorted(times)
    if not sizes:
        return None
    best = [min(times[s], key=lambda al: statistics.median(times[s][al])) for s in sizes]
    parts = []
    for i, algo in enumerate(best):
        if i + 1 < len(best) and best[i + 1] == algo:
            continue  # the next size's winner is the same: one range
        parts.append(algo if i + 1 == len(best) else f"{algo}@<{sizes[i + 1]}")
    return f"{rows[0]['coll']}:" + ",".join(parts)


def write_file(out, lines):
    kept = []
    if os.path.exists(out):
        with open(out) as f:
            for line in f:
                words = line.split("#", 1)[0].split()
                if len(words) >= 2 and (words[0], words[1]) in lines:
                    continue
                kept.append(line.rstrip("\n"))
    with open(out, "w") as f:
        if not kept:
            f.write("# tutti tuning file (bench/tune.py): <transport> <ranks> <TUTTI_ALGO spec>\n")
        for line in kept:
            f.write(line + "\n")
        for (tp, ranks), specs in sorted(lines.items()):
            f.write(f"{tp} {ranks} {';'.join(specs)}\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-o", default="tutti-tune.txt")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--transports", default="shm tcp")
    p.add_argument("--ranks", default="2 4")
    p.add_argument("--colls", default=COLLS)
    p.add_argument("-b", default="4")
    p.add_argument("-e", default="64M")
    p.add_argument("-f", type=int, default=4)
    p.add_argument("-n", type=int, default=20)
    p.add_argument("-w", type=int, default=5)
    p.add_argument("-R", type=int, default=3)
    p.add_argument("--from-json", nargs="+")
    p.add_argument("--save")
    p.add_argument("--model")
    p.add_argument("--check", action="store_true")
    p.add_argument("--cross", action="store_true")
    p.add_argument("--slack", type=float, default=0.10)
    p.add_argument("--fresh", action="store_true")
    p.add_argument("--window", action="store_true")
    a = p.parse_args()

    groups = collections.defaultdict(list)  # (transport, ranks, coll) -> rows
    if a.from_json:
        for path in a.from_json:
            with open(path) as f:
                for r in json.load(f):
                    if r.get("mode") == "algo_all":
                        groups[(r["transport"], r["ranks"], r["coll"])].append(r)
    else:
        for rep in range(a.R):
            a.rep = rep
            for tp in a.transports.split():
                for ranks in map(int, a.ranks.split()):
                    for coll in a.colls.split():
                        print(f"tune: {tp} {ranks} ranks {coll} (run {rep + 1} of {a.R})",
                              file=sys.stderr)
                        for r in run_bench(a, tp, ranks, coll):
                            groups[(tp, ranks, coll)].append(r)
    if a.check:
        check(groups, a.slack)
        return
    if a.cross:
        cross(groups, a.slack)
        return
    lines = collections.defaultdict(list)
    for (tp, ranks, coll), rows in sorted(groups.items()):
        spec = spec_of(rows)
        if spec:
            lines[(tp, str(ranks))].append(spec)
    write_file(a.o, lines)
    for (tp, ranks), specs in sorted(lines.items()):
        print(f"{tp} {ranks} {';'.join(specs)}")


if __name__ == "__main__":
    main()
