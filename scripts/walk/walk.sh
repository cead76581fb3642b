#!/bin/bash
# The walk of one training step: every entry into a function of burn-freeze, burn-pipe and
# burn-elastic-dp between the 3rd and the 4th `train_batch` of a debug build (line tables), under
# gdb. Needs gdb, binutils (nm, addr2line, readelf) and python3.
# usage: walk.sh BINARY SOURCE_CHECKOUT TAG   (e.g. target/debug/examples/quickstart . after)
#  -> $WALK_OUT/TAG.log (primary: out-of-line functions), TAG_inl.log (+ inlined instances);
#     then: python3 scripts/walk/analyze.py $WALK_OUT/TAG.log   (files, moves, crate crossings)
set -euo pipefail
B=$(realpath "$1"); SRC=$(realpath "$2"); T=$3
S=$(cd "$(dirname "$0")" && pwd)
W=$(realpath -m "${WALK_OUT:-target/walk}"); mkdir -p "$W"
cd "$W"
# 1. function symbols (entry address, size, name), one per address
nm -S --defined-only "$B" | awk '$3 ~ /^[tTwW]$/ {print $1, $2, $4}' | sort -u -k1,1 > ${T}_syms.txt
# 2. file of each entry address: outermost frame of the inline chain (the function's own file)
awk '{print "0x"$1}' ${T}_syms.txt | addr2line -e "$B" -a -i -f > ${T}_a2l.txt
python3 $S/classify.py ${T}_syms.txt ${T}_a2l.txt ${T}_funcs.tsv
# 2b. inlined instances of the crates' functions (secondary measure)
python3 $S/inline_funcs.py "$B" ${T}_syms.txt ${T}_inl.tsv
# 3. train_batch's DWARF name(s) (it may be inlined): gdb breaks on its entry either way
readelf -wi "$B" 2>/dev/null | grep -o 'DW_AT_name *: (indirect string, offset: 0x[0-9a-f]*): train_batch\b.*' \
  | sed 's/^.*): //' | sort -u > ${T}_markers.txt
echo "markers: $(wc -l < ${T}_markers.txt)"
# 4. trace (cwd: the build's worktree)
cd "$SRC"
for run in "$T:$W/${T}_funcs.tsv" "${T}_inl:$W/${T}_funcs.tsv,$W/${T}_inl.tsv"; do
  L=${run%%:*}; F=${run#*:}
  WALK_FUNCS=$F WALK_MARKERS=$W/${T}_markers.txt WALK_LOG=$W/$L.log \
    timeout 1800 gdb -batch -x $S/trace.py "$B" > $W/${L}_gdb.out 2>&1
  echo "[$L]"; grep -E 'load base|marker breakpoints|trace breakpoints|traced in|marker hits' $W/${L}_gdb.out | cut -c1-200
done
