import sys, statistics as st, collections
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    f=l.split()
    if len(f)<5: continue
    r,arm,size,a,b=f[0],f[1],int(f[2]),float(f[3]),float(f[4])
    d[(size,arm)].append((int(r),a,b))
arms=sorted({k[1] for k in d}); sizes=sorted({k[0] for k in d})
ref=sys.argv[2] if len(sys.argv)>2 else 'ompi'
print("size", *[f"{a}(oop/ip med)" for a in arms], *[f"{a}/{ref} oop med(min-max) ip med(min-max)" for a in arms if a!=ref])
for s in sizes:
    row=[str(s)]
    for a in arms:
        v=d[(s,a)]; row.append(f"{st.median(x[1] for x in v):.1f}/{st.median(x[2] for x in v):.1f}")
    R={x[0]:x for x in d[(s,ref)]}
    for a in arms:
        if a==ref: continue
        ro=[x[1]/R[x[0]][1] for x in d[(s,a)] if x[0] in R]; ri=[x[2]/R[x[0]][2] for x in d[(s,a)] if x[0] in R]
        row.append(f"{st.median(ro):.2f}({min(ro):.2f}-{max(ro):.2f}) {st.median(ri):.2f}({min(ri):.2f}-{max(ri):.2f})")
    print(*row)
