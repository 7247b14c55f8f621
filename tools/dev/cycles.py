#!/usr/bin/env python3
"""Circles between lib/ files, two ways:
  cycles.py includes [REPO]   include circles (x.c + x.h is one module)
  cycles.py calls BUILD       call circles between libtutti's objects (nm: A
                              calls a function defined in B)
Prints "cycles: none" or the strongly connected components, then each node's edges;
exits 1 when it found any (the test suite's `cycles` runs both ways)."""
import collections
import glob
import os
import re
import subprocess
import sys


def sccs(graph):
    index, low, stack, on, out, count = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = count[0]
        count[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def include_graph(root):
    lib = os.path.join(root, 'lib')
    g = collections.defaultdict(set)
    for dp, _, fn in os.walk(lib):
        for f in fn:
            if not f.endswith(('.c', '.h')):
                continue
            p = os.path.join(dp, f)
            m = os.path.relpath(p, lib).rsplit('.', 1)[0]
            g[m]
            for inc in re.findall(r'#include "([^"]+)"', open(p).read()):
                t = inc.rsplit('.', 1)[0]
                if os.path.exists(os.path.join(lib, inc)) and t != m:
                    g[m].add(t)
    return g


def call_graph(build):
    # the objects of both libraries (one compile: lib/meson.build's both_libraries)
    found = glob.glob(os.path.join(build, 'lib', 'libtutti.so.*.p'))
    if not found:
        sys.exit(f"cycles.py: no lib/libtutti.so.*.p in {build} (not built?)")
    d = found[0]
    defs, und = {}, collections.defaultdict(set)
    for f in os.listdir(d):
        if not f.endswith('.o'):
            continue
        name = f.replace('.c.o', '').replace('.._algorithms_', 'algo_')
        for line in subprocess.check_output(['nm', os.path.join(d, f)]).decode().split('\n'):
            p = line.split()
            if len(p) == 3 and p[1] in 'TDBRV':
                defs[p[2]] = name
            elif len(p) == 2 and p[0] == 'U':
                und[name].add(p[1])
    g = collections.defaultdict(set)
    for o, us in und.items():
        g[o] |= {defs[u] for u in us if u in defs and defs[u] != o}
    return g


if __name__ == '__main__':
    mode = sys.argv[1] if len(sys.argv) > 1 else 'includes'
    arg = sys.argv[2] if len(sys.argv) > 2 else ('.' if mode == 'includes' else 'build')
    graph = include_graph(arg) if mode == 'includes' else call_graph(arg)
    found = sccs(graph)
    print('cycles:', found if found else 'none')
    for k in sorted(graph):
        print(k, '->', sorted(graph[k]))
    sys.exit(1 if found else 0)
