#!/usr/bin/env python3
"""Functions over 100 body lines outside tests/ and fuzz/. Usage: long_functions.py REPO"""
import sys,re,subprocess,os
root=sys.argv[1]
files=subprocess.check_output(['git','-C',root,'ls-files','*.c']).decode().split()
for f in files:
    if f.startswith(('tests/','fuzz/')): continue
    L=open(os.path.join(root,f)).read().split('\n')
    start=None
    for i,l in enumerate(L):
        if l=='{' : start=i; name=L[i-1] if i else ''
        elif l=='}' and start is not None:
            n=i-start-1
            if n>100: print(n,f,name.strip()[:70])
            start=None
