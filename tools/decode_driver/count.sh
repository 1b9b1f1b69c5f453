#!/usr/bin/env bash
# Instructions per decode call of the deterministic decode loop (src/main.rs), whole loop
# (hashing, setup and frees included) divided by its 38,400 decode calls, for each tree
# given (a kvblocks checkout: this one is ../..), under callgrind, which load on the
# machine does not disturb. Each tree builds in its own copy of this project under
# ${TMPDIR:-/tmp}. Usage: tools/decode_driver/count.sh TREE [TREE ...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for tree in "$@"; do
  tree=$(cd "$tree" && pwd)
  # this checkout's driver and its shared builders (benches/common), at the same relative
  # paths, built against the tree under test
  work=$(mktemp -d)
  mkdir -p "$work/tools/decode_driver" "$work/benches"
  cp -r "$here/src" "$work/tools/decode_driver/"
  cp -r "$here/../../benches/common" "$work/benches/"
  cp "$tree/Cargo.lock" "$work/tools/decode_driver/" # the tree's dependency versions
  sed "s#path = \"../..\"#path = \"$tree\"#" "$here/Cargo.toml" > "$work/tools/decode_driver/Cargo.toml"
  cargo build --release -q --manifest-path "$work/tools/decode_driver/Cargo.toml"
  for layout in full swa; do
    out="$work/callgrind.$layout"
    valgrind --tool=callgrind --callgrind-out-file="$out" "$work/tools/decode_driver/target/release/kvblocks-decode-driver" "$layout" >/dev/null 2>&1
    total=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    awk -v t="$tree" -v l="$layout" -v n="$total" 'BEGIN { printf "%s %s %.1f\n", t, l, n / 38400 }'
  done
  rm -rf "$work"
done
