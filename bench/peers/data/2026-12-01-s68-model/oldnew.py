import json,glob,statistics,collections,subprocess,sys
D=sys.argv[1]
groups=collections.defaultdict(list)
for f in glob.glob(D+"/*.json"):
    tp,ranks,coll,rep=f.split("/")[-1][:-5].split("-")
    groups[(tp,int(ranks),coll)]+=json.load(open(f))
tot=collections.Counter()
for (tp,ranks,coll),rows in sorted(groups.items()):
    times=collections.defaultdict(lambda: collections.defaultdict(list)); live={}
    for r in rows:
        for a,t in r["algos"].items():
            if t and t.get("p50_us") is not None: times[r["size"]][a].append(t["p50_us"])
        live[r["size"]]=r.get("model")
    sizes=sorted(times)
    sel=[s//ranks if coll in ("alltoall",) else s for s in sizes]
    picks={}
    for tag,prog in (("old","/tmp/s68/pick/pickq0"),("new","/tmp/s68/pick/pickq")):
        out=subprocess.run([prog,tp,str(ranks),"2",coll]+[str(x) for x in sel],capture_output=True,text=True).stdout.split("\n")
        picks[tag]=[l.split()[1] for l in out if l]
    for i,s in enumerate(sizes):
        med={a:statistics.median(v) for a,v in times[s].items()}
        best=min(med,key=med.get)
        o,n=picks["old"][i],picks["new"][i]
        if n!=live[s]: print("MISMATCH live",tp,ranks,coll,s,n,live[s])
        ro=med[o]/med[best]; rn=med[n]/med[best]
        tot["sizes"]+=1; tot["old"]+= ro<=1.1; tot["new"]+= rn<=1.1
        if o!=n: print(f"{tp} {ranks} {coll} {s}: old {o} {ro:.2f}  new {n} {rn:.2f}  (fastest {best})")
print(dict(tot))
