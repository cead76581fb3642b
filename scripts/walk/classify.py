"""Map each function symbol's entry address to its source file (outermost frame of
addr2line -i: the function's own file even when its first instruction is inlined code).
usage: classify.py SYMS A2L OUT"""
import re, sys, subprocess
syms, a2l, out = sys.argv[1:4]
CRATE = re.compile(r'(?:^|/)((?:burn-freeze|burn-pipe|burn-elastic-dp)/src/.*)$')
names = {}
for line in open(syms):
    a, size, name = line.split(None, 2)
    names[int(a, 16)] = (int(size, 16), name.strip())
blocks = []; cur = None
for line in open(a2l):
    line = line.rstrip('\n')
    if line.startswith('0x'):
        cur = [int(line, 16), []]; blocks.append(cur); continue
    cur[1].append(line)
n_in = n_out = n_diff = 0
rows = []
for addr, lines in blocks:
    pairs = list(zip(lines[0::2], lines[1::2]))
    inner_file = pairs[0][1].rsplit(':', 1)[0]
    outer_file = pairs[-1][1].rsplit(':', 1)[0]
    mi, mo = CRATE.search(inner_file), CRATE.search(outer_file)
    if bool(mi) != bool(mo): n_diff += 1
    if mo:
        size, name = names[addr]
        if size == 0: continue
        rows.append((addr, mo.group(1), name, len(pairs) > 1, bool(mi)))
dem = subprocess.run(['c++filt'], input='\n'.join(r[2] for r in rows), capture_output=True,
                     text=True).stdout.split('\n')
rows = [(a, f, re.sub(r'::h[0-9a-f]{16}(\.llvm\.\d+)?$', '', d), i, m) for (a, f, _, i, m), d in zip(rows, dem)]
with open(out, 'w') as f:
    for addr, file, name, inl, mi in rows:
        f.write(f"{addr:#x}\t{file}\t{int(inl)}\t{int(mi)}\t{name}\n")
print("functions in crates:", len(rows), "entry inside inlined code:", sum(r[3] for r in rows),
      "inner/outer classification differs (all syms):", n_diff)
