#!/usr/bin/env python3
"""Walk metrics from a trace log written by trace.py.
usage: analyze.py LOG [LOG2 ...]   (prints a report per log)
Log rows: E <gdb thread num> <lwp> <thread name> <file> <sal file> <function> <addr>
          MARK <hit#> <thread> <lwp> <pc>
The window is [3rd train_batch entry, 4th train_batch entry); entries of train_batch
itself (only possible if it is out of line) are dropped: they are the window's bounds."""
import sys, collections

def crate(f):
    return f.split('/', 1)[0]

def load(path):
    rows = []
    for line in open(path):
        p = line.rstrip('\n').split('\t')
        if p[0] == 'MARK' and int(p[1]) >= 4:
            break          # the 4th train_batch entry closes the window
        if p[0] != 'E':
            continue
        th, lwp, tname, file, salf, func, addr = p[1:8]
        if '::train_batch' in func or func.startswith('train_batch'):
            continue
        rows.append((int(th), tname, file, func))
    return rows

def metrics(rows):
    seqs = collections.OrderedDict()
    for th, _, f, _ in rows:
        seqs.setdefault(th, []).append(f)
    moves = back = crossings = 0
    for seq in seqs.values():
        seen = set()
        for i, f in enumerate(seq):
            if i and f != seq[i - 1]:
                moves += 1
                if f in seen:
                    back += 1
                if crate(f) != crate(seq[i - 1]):
                    crossings += 1
            seen.add(f)
    files = collections.Counter(f for _, _, f, _ in rows)
    return dict(entries=len(rows), threads=len(seqs), files=len(files),
                crates=sorted({crate(f) for f in files}), moves=moves, moves_back=back,
                crate_crossings=crossings, file_counts=files,
                functions=len({fn for *_, fn in rows}))

def show(name, m, top=None):
    print(f"  [{name}] entries={m['entries']} threads={m['threads']} distinct functions={m['functions']}")
    print(f"    1. files visited: {m['files']}")
    print(f"    2. crates visited: {len(m['crates'])} {m['crates']}")
    print(f"    3. moves between files: {m['moves']} (back to a file left earlier: {m['moves_back']})")
    print(f"    4. crate crossings: {m['crate_crossings']}")
    print(f"    5. entries per file:")
    for f, n in m['file_counts'].most_common(top):
        print(f"       {n:6d}  {f}")

for path in sys.argv[1:]:
    rows = load(path)
    print(f"== {path}")
    show('all threads', metrics(rows))
    show('main thread (gdb thread 1)', metrics([r for r in rows if r[0] == 1]))
    workers = collections.Counter((r[0], r[1]) for r in rows if r[0] != 1)
    print("  entries per non-main thread:", ', '.join(f"{t}({n})={c}" for (t, n), c in sorted(workers.items())))
