#!/bin/sh
# Builds the wheel from the sdist alone, offline, as a distributor without network builds
# it, then checks it: the sdist ($1, or a fresh `maturin sdist` of this checkout) unpacked
# in a scratch folder, its crates vendored there (`cargo vendor`, the one step that reaches
# crates.io), then `maturin build --release --locked --offline` with an empty CARGO_HOME
# and only the vendored sources, so that a file or crate missing from the sdist fails the
# build. The wheel then goes through .github/check-wheel.sh (import, `kvblocks simulate`,
# tests/package) in a fresh venv of the Python on PATH.
#
# Needs maturin and python on PATH (`make wheel`'s .venv-wheel has both) and cargo; with
# WHEELHOUSE set, the Python dependencies come from that folder. Run from the root:
#
#     PATH=$PWD/.venv-wheel/bin:$PATH WHEELHOUSE=~/.cache/kvblocks-wheels sh .github/check-sdist.sh
set -eu

repo=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$#" -gt 0 ]; then
  sdist=$1
else
  maturin sdist -o "$work/sdist"
  sdist=$(ls "$work"/sdist/kvblocks-*.tar.gz)
fi
mkdir "$work/src"
tar -xzf "$sdist" -C "$work/src"
cd "$work"/src/kvblocks-*/

mkdir -p .cargo
cargo vendor --locked --versioned-dirs vendor > .cargo/config.toml
# Offline from here: no registry cache, no network, only ./vendor.
CARGO_HOME="$work/cargo-home" CARGO_NET_OFFLINE=true CARGO_TARGET_DIR="$work/target" \
  maturin build --release --locked --offline -o "$work/wheel"

python -m venv "$work/venv"
cd "$repo"
PATH="$work/venv/bin:$PATH" sh .github/check-wheel.sh "$work/wheel" tests/package
