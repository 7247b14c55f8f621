"""oldnew.py DIR...: the old table's picks (pickq0) and the new table's (pickq) against the
fastest algorithm by the median p50 in the same runs, per (transport, ranks, collective)
and size. DIR holds tutti-bench --algo all --json outputs, named as tune.py --save names
them (<transport>-<ranks>-<coll>-<run>.json) or as the fine sweeps did (<tag>-<size>-
<run>.json: tag tcp or shm for the 4-rank allreduce, <coll> for its tcp runs at 4 ranks,
<coll>.<transport>.<ranks> in z/). A pick within 10 % of the fastest counts."""
import collections
import glob
import json
import re
import statistics
import subprocess
import sys

PROGS = (("old", "/tmp/s68/pick/pickq0"), ("new", "/tmp/s68/pick/pickq"))


def key_of(name):
    parts = name[:-5].split("-")
    if len(parts) == 4 and parts[1].isdigit():  # tune.py --save
        return parts[0], int(parts[1]), parts[2]
    tag = re.match(r"(.*)-\w+-\d+$", name[:-5]).group(1)
    if "." in tag:
        coll, tp, ranks = tag.split(".")
        return tp, int(ranks), coll
    return (tag, 4, "allreduce") if tag in ("tcp", "shm") else ("tcp", 4, tag)


groups = collections.defaultdict(list)
for d in sys.argv[1:]:
    for f in glob.glob(d + "/*.json"):
        groups[key_of(f.split("/")[-1])] += json.load(open(f))
tot = collections.Counter()
for (tp, ranks, coll), rows in sorted(groups.items()):
    times = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in rows:
        for a, t in r["algos"].items():
            if t and t.get("p50_us") is not None:
                times[r["size"]][a].append(t["p50_us"])
    sizes = sorted(times)
    sel = [s // ranks if coll == "alltoall" else s for s in sizes]  # a rank's block
    picks = {}
    for tag, prog in PROGS:
        out = subprocess.run([prog, tp, str(ranks), "2", coll] + [str(x) for x in sel],
                             capture_output=True, text=True).stdout.split("\n")
        picks[tag] = [line.split()[1] for line in out if line]
    for i, s in enumerate(sizes):
        med = {a: statistics.median(v) for a, v in times[s].items()}
        best = min(med, key=med.get)
        o, n = picks["old"][i], picks["new"][i]
        ro, rn = med[o] / med[best], med[n] / med[best]
        k = f"{tp} np{ranks}"
        tot[k + " sizes"] += 1
        tot[k + " old"] += ro <= 1.1
        tot[k + " new"] += rn <= 1.1
        print(f"{tp} {ranks} {coll:14s} {s:>8}: old {o:8s} {ro:.2f}  new {n:8s} {rn:.2f}  "
              f"(fastest {best}){'' if o == n else '  *'}")
for k in sorted(tot):
    print(k, tot[k])
