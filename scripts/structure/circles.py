#!/usr/bin/env python3
"""File-level import cycles in a crate's src: an edge A->B when file A names a path
(crate::.., super::.., self::.., or a child module's name) that resolves to file B.
Re-export lines (`pub use`, `pub(crate) use`), `mod x;` declarations and the
`#[cfg(test)] mod tests { .. }` block are not edges. Prints each strongly connected
component of more than one file, with its edges; the count goes to stderr.
usage: python3 scripts/structure/circles.py CRATE/src [...]"""
import sys, os, re
def modpath(src, p):
    rel = os.path.relpath(p, src)[:-3].split(os.sep)
    if rel[-1] in ('lib', 'main', 'mod'): rel = rel[:-1]
    return rel
def resolve(files, segs):
    # longest prefix that is a module file
    for k in range(len(segs), -1, -1):
        key = tuple(segs[:k])
        if key in files: return files[key]
    return None
def analyse(src):
    files = {}
    for dp, dn, fn in os.walk(src):
        for f in fn:
            if f.endswith('.rs'):
                p = os.path.join(dp, f); files[tuple(modpath(src, p))] = p
    # skip bin dirs: a file under src/bin is its own crate
    edges = {p: set() for p in files.values()}
    pathre = re.compile(r'\b(crate|super|self)((?:::\w+)+)')
    for key, p in files.items():
        if key and key[0] == 'bin': continue
        text = open(p).read()
        text = re.sub(r'//[^\n]*', '', text)
        # drop #[cfg(test)] mod tests { ... } blocks crudely: lines after '#[cfg(test)]\nmod tests'
        m = re.search(r'#\[cfg\(test\)\]\s*mod tests\s*\{', text)
        if m: text = text[:m.start()]
        # expand grouped use statements
        stmts = re.findall(r'(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);', text)
        body = re.sub(r'(pub(?:\([^)]*\))?\s+)?use\s+[^;]+;', '', text)
        names = []
        def expand(prefix, tree):
            tree = tree.strip()
            mm = re.match(r'^([\w:]*?)::\{(.*)\}$', tree, re.S)
            if mm:
                pre = mm.group(1); inner = mm.group(2)
                depth = 0; cur = ''; parts = []
                for ch in inner:
                    if ch == '{': depth += 1
                    if ch == '}': depth -= 1
                    if ch == ',' and depth == 0: parts.append(cur); cur = ''
                    else: cur += ch
                parts.append(cur)
                for q in parts:
                    if q.strip(): expand(prefix + pre + '::', q)
            else:
                names.append(prefix + re.split(r'\s+as\s+', tree)[0])
        for pub, tree in stmts:
            if pub and pub.strip().startswith('pub'): continue
            expand('', tree.replace('\n', ' '))
        for mm in pathre.finditer(body):
            names.append(mm.group(1) + mm.group(2))
        for mm in re.finditer(r'(?<![:\w])(\w+)((?:::\w+)+)', body):
            if tuple(list(key) + [mm.group(1)]) in files:
                names.append(mm.group(1) + mm.group(2))
        here = list(key) if os.path.basename(p) in ('mod.rs', 'lib.rs') else list(key[:-1])
        # `here` = the module whose children are siblings; super of a file mod = parent
        self_mod = list(key)
        for n in names:
            segs = [s for s in n.split('::') if s]
            if segs and tuple(self_mod + [segs[0]]) in files:
                segs = ['self'] + segs
            if not segs or segs[0] not in ('crate', 'super', 'self'): continue
            base = []
            if segs[0] == 'crate': base = []; rest = segs[1:]
            else:
                cur = list(self_mod); rest = segs
                while rest and rest[0] in ('super', 'self'):
                    if rest[0] == 'super': cur = cur[:-1]
                    rest = rest[1:]
                base = cur
            t = resolve(files, base + rest)
            if t and t != p: edges[p].add(t)
    # tarjan
    idx = {}; low = {}; st = []; on = set(); out = []; c = [0]
    sys.setrecursionlimit(10000)
    def sc(v):
        idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
        for w in edges[v]:
            if w not in idx: sc(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(comp)
    for v in edges:
        if v not in idx: sc(v)
    return out, edges
total = 0
for src in sys.argv[1:]:
    comps, edges = analyse(src)
    for comp in comps:
        total += 1
        s = set(comp)
        print(f"cycle in {src}: " + ", ".join(os.path.relpath(x, src) for x in sorted(comp)))
        for a in sorted(comp):
            for b in sorted(edges[a] & s):
                print(f"    {os.path.relpath(a, src)} -> {os.path.relpath(b, src)}")
print(f"{total} cycles", file=sys.stderr)
