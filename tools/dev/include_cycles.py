#!/usr/bin/env python3
"""Include circles between lib/ modules (x.c + x.h is one module). Usage: include_cycles.py [REPO]"""
import os,re,sys,collections
root=sys.argv[1] if len(sys.argv)>1 else '.'
lib=os.path.join(root,'lib')
mods=collections.defaultdict(set)
for dp,dn,fn in os.walk(lib):
    for f in fn:
        if not f.endswith(('.c','.h')): continue
        p=os.path.join(dp,f); m=os.path.relpath(p,lib).rsplit('.',1)[0]
        for inc in re.findall(r'#include "([^"]+)"',open(p).read()):
            t=inc.rsplit('.',1)[0]
            if os.path.exists(os.path.join(lib,inc)) and t!=m: mods[m].add(t)
        mods[m]
# tarjan
idx={};low={};st=[];on=set();out=[];c=[0]
def sc(v):
    idx[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
    for w in mods[v]:
        if w not in idx: sc(w);low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],idx[w])
    if low[v]==idx[v]:
        comp=[]
        while True:
            w=st.pop();on.discard(w);comp.append(w)
            if w==v:break
        if len(comp)>1: out.append(sorted(comp))
sys.setrecursionlimit(10000)
for v in list(mods):
    if v not in idx: sc(v)
print("cycles:",out if out else "none")
rooms=collections.defaultdict(set)
for a,bs in mods.items():
    for b in bs:
        ra,rb=a.split('/')[0],b.split('/')[0]
        if ra!=rb: rooms[ra].add(rb)
for r in sorted(rooms): print(r,'->',sorted(rooms[r]))
