import json,glob,statistics,collections,subprocess,sys,re
# fine sweeps: files <tag>-<size>-<rep>.json in the dirs given; tag tcp/shm = allreduce, else coll over tcp;
# z: <coll>.<tp>.<np>-...
groups=collections.defaultdict(list)
for d in sys.argv[1:]:
    for f in glob.glob(d+"/*.json"):
        tag=re.match(r"(.*)-\w+-\d+\.json",f.split("/")[-1]).group(1)
        if "." in tag: coll,tp,np_=tag.split("."); np_=int(np_)
        elif tag in ("tcp","shm"): coll,tp,np_="allreduce",tag,4
        else: coll,tp,np_=tag,"tcp",4
        groups[(tp,np_,coll)]+=json.load(open(f))
tot=collections.Counter()
for (tp,ranks,coll),rows in sorted(groups.items()):
    times=collections.defaultdict(lambda: collections.defaultdict(list))
    for r in rows:
        for a,t in r["algos"].items():
            if t and t.get("p50_us") is not None: times[r["size"]][a].append(t["p50_us"])
    sizes=sorted(times)
    picks={}
    for tag,prog in (("old","/tmp/s68/pick/pickq0"),("new","/tmp/s68/pick/pickq")):
        out=subprocess.run([prog,tp,str(ranks),"2",coll]+[str(x) for x in sizes],capture_output=True,text=True).stdout.split("\n")
        picks[tag]=[l.split()[1] for l in out if l]
    for i,s in enumerate(sizes):
        med={a:statistics.median(v) for a,v in times[s].items()}
        best=min(med,key=med.get)
        o,n=picks["old"][i],picks["new"][i]
        ro=med[o]/med[best]; rn=med[n]/med[best]
        k=f"{tp} np{ranks}"
        tot[k+" sizes"]+=1; tot[k+" old"]+= ro<=1.1; tot[k+" new"]+= rn<=1.1
        print(f"{tp} {ranks} {coll:14s} {s:>7}: old {o:8s} {ro:.2f}  new {n:8s} {rn:.2f}  (fastest {best}){'' if o==n else '  *'}")
for k in sorted(tot): print(k, tot[k])
