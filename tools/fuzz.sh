#!/usr/bin/env bash
# Runs the kvblocks fuzz targets (fuzz/, cargo fuzz + libFuzzer) for a set time.
#
#   tools/fuzz.sh [SECONDS] [TARGET]      defaults: 300 seconds, pool_ops
#
# cargo fuzz needs a nightly toolchain (-Zsanitizer=address); the script installs
# cargo-fuzz if missing and uses `cargo +nightly`. It first replays the inputs of past
# crashes (fuzz/regressions/TARGET/, each also a unit test in src/), then fuzzes. New
# crashes land in fuzz/artifacts/TARGET/; reproduce one with
#   cargo +nightly fuzz run TARGET fuzz/artifacts/TARGET/crash-...
# fix it, add a unit test and copy the input to fuzz/regressions/TARGET/.
# Targets: pool_ops (BlockPool + Request hashing), manager_ops (KvCacheManager).
# Not part of CI.
set -euo pipefail
seconds="${1:-300}"
target="${2:-pool_ops}"
cd "$(dirname "$0")/.."
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
mkdir -p "fuzz/corpus/$target"
if compgen -G "fuzz/regressions/$target/*" >/dev/null; then
    cargo +nightly fuzz run "$target" fuzz/regressions/"$target"/* -- -runs=0
fi
cargo +nightly fuzz run "$target" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -max_len=4096 -print_final_stats=1
