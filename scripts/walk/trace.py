# gdb -batch -x trace.py EXE   (env: WALK_FUNCS=funcs.tsv WALK_MARKERS=markers.txt WALK_LOG=out.log
#                                 WALK_START=3 WALK_STOP=4 WALK_MODE=trace|count)
# Records every entry (breakpoint at the symbol's entry address) into the out-of-line
# functions listed in WALK_FUNCS between the START-th and STOP-th entries of train_batch.
import gdb, os, re, time
# WALK_FUNCS: comma-separated TSVs; *_inl.tsv rows are inlined instances (column 3: depth),
# others out-of-line functions (depth 0). Several functions may start at one address.
FUNCS = {}
for path in os.environ['WALK_FUNCS'].split(','):
    inlined = path.endswith('_inl.tsv')
    for line in open(path):
        addr, file, c3, mi, name = line.rstrip('\n').split('\t')
        FUNCS.setdefault(int(addr, 16), []).append((int(c3) if inlined else 0, file, name))
for v in FUNCS.values():
    v.sort()
MARKERS = [l.rstrip('\n') for l in open(os.environ['WALK_MARKERS']) if l.strip()]
START = int(os.environ.get('WALK_START', 3)); STOP = int(os.environ.get('WALK_STOP', 4))
MODE = os.environ.get('WALK_MODE', 'trace')
LOG = []; state = {'hits': 0, 'base': 0}

for c in ["set pagination off", "set print thread-events off", "set confirm off",
          "handle SIGPIPE nostop noprint", "set width 0"]:
    gdb.execute(c)

class Marker(gdb.Breakpoint):
    def stop(self):
        state['hits'] += 1
        th = gdb.selected_thread()
        LOG.append(('MARK', state['hits'], th.num, th.ptid[1], gdb.newest_frame().pc()))
        if MODE == 'count':
            return False
        return state['hits'] in (START, STOP)

class Trace(gdb.Breakpoint):
    def stop(self):
        th = gdb.selected_thread()
        f = gdb.newest_frame()
        pc = f.pc()
        sal = f.find_sal()
        salf = sal.symtab.filename if sal.symtab else '?'
        for depth, file, name in FUNCS.get(pc - state['base'], [(0, '?', '?')]):
            LOG.append(('E', th.num, th.ptid[1], th.name or '', file, salf, name,
                        hex(pc - state['base']), depth))
        return False

gdb.execute("starti", to_string=True)
exe = gdb.current_progspace().filename
maps = gdb.execute("info proc mappings", to_string=True)
for line in maps.splitlines():
    parts = line.split()
    if len(parts) >= 5 and parts[-1] == exe:
        state['base'] = int(parts[0], 16); break
print("load base", hex(state['base']))
marks = []
for m in MARKERS:
    b = Marker("-function '%s'" % m)
    marks.append(b)
print("marker breakpoints:", len(marks), [ (b.number, b.location[:40]) for b in marks])
t0 = time.time()
gdb.execute("continue")
if MODE == 'trace':
    if state['hits'] != START:
        raise SystemExit("marker hit %d times only" % state['hits'])
    print("bt at start:\n" + gdb.execute("bt 4", to_string=True)[:3000])
    traces = [Trace("*%#x" % (state['base'] + a), internal=True) for a in FUNCS]
    print("trace breakpoints:", len(traces)); t1 = time.time()
    gdb.execute("continue")
    print("bt at stop (hits=%d):\n" % state['hits'] + gdb.execute("bt 4", to_string=True)[:3000])
    print("traced in %.1fs, %d records" % (time.time() - t1, len(LOG)))
    gdb.execute("kill")
print("marker hits:", state['hits'], "elapsed %.1fs" % (time.time() - t0))
with open(os.environ['WALK_LOG'], 'w') as out:
    for r in LOG:
        out.write('\t'.join(map(str, r)) + '\n')
