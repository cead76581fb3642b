#!/usr/bin/env python3
"""Entry addresses of *inlined* instances of the three crates' functions (secondary measure).
usage: inline_funcs.py BINARY SYMS OUT_TSV
Parses `readelf -wi` (DW_TAG_inlined_subroutine: entry = low_pc or first non-empty range,
as gdb does) and `readelf --debug-dump=Ranges`; the file of an inlined instance at depth d
is the location addr2line -i reports for frame (L-1-d) of the chain at its entry pc."""
import re, sys, subprocess, bisect, collections
B, SYMS, OUT = sys.argv[1:4]
CRATE = re.compile(r'(?:^|/)((?:burn-freeze|burn-pipe|burn-elastic-dp)/src/.*)$')
# text ranges of function symbols (to drop GC'd code at address 0/1)
syms = sorted((int(a, 16), int(s, 16)) for a, s, _ in (l.split(None, 2) for l in open(SYMS)))
starts = [a for a, _ in syms]
def in_text(pc):
    i = bisect.bisect_right(starts, pc) - 1
    return i >= 0 and syms[i][0] <= pc < syms[i][0] + max(syms[i][1], 1)
# first non-empty range of each list
first = {}
for line in subprocess.run(['readelf', '--debug-dump=Ranges', B], capture_output=True, text=True).stdout.splitlines():
    p = line.split()
    if len(p) >= 3 and re.fullmatch(r'[0-9a-f]{8}', p[0]) and re.fullmatch(r'[0-9a-f]{16}', p[1]):
        off, lo, hi = int(p[0], 16), int(p[1], 16), int(p[2], 16)
        if hi > lo and off not in first:
            first[off] = lo
names = {}; inl = []   # (entry, depth, origin)
stack = []  # (level, tag, die) ; die dict
cur = None
hdr = re.compile(r'^ <(\d+)><([0-9a-f]+)>: Abbrev Number: (\d+)(?: \((DW_TAG_\w+)\))?')
attr = re.compile(r'^    <[0-9a-f]+>\s+(DW_AT_\w+)\s*: (.*)$')
def finish(d):
    if d is None: return
    if d['tag'] in ('DW_TAG_subprogram',) and 'name' in d:
        names[d['off']] = (d['ns'], d['name'])
    if d['tag'] == 'DW_TAG_inlined_subroutine':
        e = d.get('low_pc')
        if e is None and 'ranges' in d: e = first.get(d['ranges'])
        if e is not None and in_text(e):
            inl.append((e, d['depth'], d['origin']))
proc = subprocess.Popen(['readelf', '-wi', B], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
for line in proc.stdout:
    m = hdr.match(line)
    if m:
        finish(cur); cur = None
        lvl, off, tag = int(m.group(1)), int(m.group(2), 16), m.group(4)
        while stack and stack[-1][0] >= lvl: stack.pop()
        if tag is None: continue   # null entry
        ns = tuple(s[2].get('name', '') for s in stack if s[1] == 'DW_TAG_namespace')
        depth = sum(1 for s in stack if s[1] == 'DW_TAG_inlined_subroutine') + 1
        cur = {'tag': tag, 'off': off, 'ns': ns, 'depth': depth}
        stack.append((lvl, tag, cur))
        continue
    if cur is None: continue
    m = attr.match(line)
    if not m: continue
    k, v = m.groups()
    if k == 'DW_AT_name': cur['name'] = v.split('): ', 1)[-1] if v.startswith('(indirect') else v.strip()
    elif k == 'DW_AT_low_pc': cur['low_pc'] = int(v.split()[0], 16)
    elif k == 'DW_AT_ranges': cur['ranges'] = int(v.split()[0], 16)
    elif k == 'DW_AT_abstract_origin': cur['origin'] = int(v.strip().strip('<>'), 16)
finish(cur)
print("inlined instances with an entry in .text:", len(inl))
# addr2line chains
pcs = sorted({e for e, _, _ in inl})
out = subprocess.run(['addr2line', '-e', B, '-a', '-i', '-f'], input='\n'.join(hex(p) for p in pcs),
                     capture_output=True, text=True).stdout.splitlines()
chain = {}; key = None
for line in out:
    if line.startswith('0x'): key = int(line, 16); chain[key] = []; continue
    chain[key].append(line)
rows = []; bad = 0
for e, d, o in inl:
    c = chain[e]; pairs = list(zip(c[0::2], c[1::2])); L = len(pairs)
    i = L - 1 - d
    if i < 0: bad += 1; continue
    fn, loc = pairs[i]
    ns, nm = names.get(o, ((), '?'))
    if i > 0 and not fn.startswith(nm.split('<')[0]): bad += 1   # frame 0's name is the ELF symbol's
    mo = CRATE.search(loc.rsplit(':', 1)[0])
    if mo:
        rows.append((e, d, mo.group(1), '::'.join(ns + (nm,))))
print("chain/name mismatches:", bad, "crate inlined instances:", len(rows),
      "distinct entry pcs:", len({r[0] for r in rows}))
with open(OUT, 'w') as f:
    for e, d, file, name in sorted(rows):
        f.write(f"{e:#x}\t{file}\t{d}\t1\t{name}\n")
