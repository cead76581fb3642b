#!/bin/bash
# public declarations per crate (pub fn|struct|enum|trait|type|const|static, not pub(crate)/pub(super), not `pub use`/`pub mod`), in src
cd "$(dirname "$0")/../.."
for c in burn-freeze burn-pipe burn-elastic-dp models examples examples/jobs examples/harness; do
  [ -d $c/src ] || continue
  n=$(grep -rhE '^\s*pub (async |const |unsafe )*(fn|struct|enum|trait|type|const|static) ' $c/src | wc -l)
  echo "$c $n"
done
