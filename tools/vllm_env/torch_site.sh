#!/usr/bin/env bash
# Give a venv the torch of tools/vllm_env/torch.txt without a copy of its own.
#
#   bash tools/vllm_env/torch_site.sh VENV
#
# torch with its CUDA libraries is about 4 GB installed. Every kvblocks venv that needs it
# (.venv, .venv-vllm-0.33, .venv-vllm-0.32) shares one install, the torch site $TORCH_SITE
# (default .site-torch in the repository root): torch and its own dependencies, installed
# once from the wheelhouse with `pip install --target`. VENV gets a .pth file naming that
# folder, which Python appends to sys.path after VENV's own site-packages, so a package
# that VENV pins itself (vLLM 0.33's triton, say) still wins over the site's copy.
#
# Idempotent: a site whose stamp matches torch.txt is kept; it is rebuilt when the pin
# changes. Needs Python 3.11 in VENV (the CUDA libraries' wheels are cp311 or py3).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=tools/vllm_env/wheelhouse.sh
source "$HERE/wheelhouse.sh"
VENV=${1:?usage: torch_site.sh VENV}
SITE=${TORCH_SITE:-$ROOT/.site-torch}
TORCH=$(grep -v '^\s*#' "$HERE/torch.txt" | head -1)
stamp=$(sha256sum <"$HERE/torch.txt" | cut -c1-16)

if [[ ! -f "$SITE/.kvblocks-stamp" || "$(cat "$SITE/.kvblocks-stamp")" != "$stamp" ]]; then
  echo "[torch_site] installing $TORCH and its dependencies into $SITE" >&2
  rm -rf "$SITE"
  wheelhouse_install "$VENV/bin/python" deps "$SITE" "$TORCH"
  echo "$stamp" >"$SITE/.kvblocks-stamp"
fi
purelib=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$SITE" >"$purelib/kvblocks-torch-site.pth"
