#!/usr/bin/env python3
"""Rust functions longer than N lines (env N, default 80), by brace matching (strings
and `//` comments are blanked first); longest first, the count to stderr.
usage: python3 scripts/structure/fnlen.py DIR [...]"""
import sys, os, re
N = int(os.environ.get("N", "80"))
fnre = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"[^"]*"\s+)?fn\s+(\w+)')
out = []
for root in sys.argv[1:]:
    for dp, dn, fn in os.walk(root):
        for f in fn:
            if not f.endswith('.rs'): continue
            p = os.path.join(dp, f)
            lines = open(p).read().split('\n')
            i = 0
            while i < len(lines):
                m = fnre.match(lines[i])
                if m:
                    # find opening brace
                    depth = 0; started = False; j = i
                    while j < len(lines):
                        l = re.sub(r'//.*', '', lines[j])
                        l = re.sub(r'"([^"\\]|\\.)*"', '""', l)
                        l = re.sub(r"'([^'\\]|\\.)'", "''", l)
                        if not started and ';' in l and '{' not in l:
                            break
                        for ch in l:
                            if ch == '{': depth += 1; started = True
                            elif ch == '}': depth -= 1
                        if started and depth <= 0: break
                        j += 1
                    if started:
                        n = j - i + 1
                        if n > N: out.append((n, p, m.group(7), i+1))
                    i += 1
                    continue
                i += 1
for n, p, name, ln in sorted(out, reverse=True):
    print(f"{n:5} {p}:{ln} {name}")
print(f"total {len(out)}", file=sys.stderr)
