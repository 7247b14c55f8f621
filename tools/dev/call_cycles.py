#!/usr/bin/env python3
"""Call circles between lib/ object files (A calls a function defined in B), from nm over
libtutti_internal.a's objects. Run in BUILD/lib: python3 ../../tools/dev/call_cycles.py"""
import subprocess,collections,sys
import os; objs=['libtutti_internal.a.p/'+f for f in os.listdir('libtutti_internal.a.p') if f.endswith('.o')]
defs={};und=collections.defaultdict(set)
for o in objs:
    name=o.split('/')[-1].replace('.c.o','').replace('.._.._algorithms_','algo_').replace('.._algorithms_','algo_')
    for l in subprocess.check_output(['nm',o]).decode().split('\n'):
        p=l.split()
        if len(p)==3 and p[1] in 'TDBRV': defs[p[2]]=name
        elif len(p)==2 and p[0]=='U': und[name].add(p[1])
g=collections.defaultdict(set)
for o,us in und.items():
    for u in us:
        if u in defs and defs[u]!=o: g[o].add(defs[u])
idx={};low={};st=[];on=set();out=[];c=[0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
    for w in g[v]:
        if w not in idx: sc(w);low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],idx[w])
    if low[v]==idx[v]:
        comp=[]
        while True:
            w=st.pop();on.discard(w);comp.append(w)
            if w==v:break
        if len(comp)>1: out.append(sorted(comp))
for v in list(g):
    if v not in idx: sc(v)
print("cycles:",out if out else "none")
for k in sorted(g):
    if not k.startswith('algo_'): print(k,'->',sorted(x for x in g[k] if not x.startswith('algo_')), '+algorithms' if any(x.startswith('algo_') for x in g[k]) else '')
