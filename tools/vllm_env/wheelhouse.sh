# Sourced by the scripts of tools/vllm_env/: installs from the shared wheelhouse $WHEELS
# (default ~/.cache/kvblocks-wheels, the one the Makefile keeps).
WHEELS=${WHEELS:-$HOME/.cache/kvblocks-wheels}

# wheelhouse_install PYTHON DEPS TARGET REQUIREMENT...: install the requirements with
# PYTHON's pip from the wheelhouse alone, downloading into it first only if something is
# missing there. DEPS is `deps` or `no-deps`; TARGET is a folder for `pip install --target`,
# or empty for PYTHON's own environment.
wheelhouse_install() {
  local python=$1 deps=$2 target=$3
  shift 3
  local pip=("$python" -m pip --disable-pip-version-check -q) flags=() into=()
  [[ $deps == no-deps ]] && flags=(--no-deps)
  [[ -n $target ]] && into=(--target "$target")
  mkdir -p "$WHEELS"
  if ! "${pip[@]}" install "${flags[@]}" "${into[@]}" --no-index --find-links "$WHEELS" "$@" \
    2>/dev/null; then
    echo "[wheelhouse] downloading what $WHEELS lacks" >&2
    "${pip[@]}" download "${flags[@]}" --only-binary=:all: -d "$WHEELS" "$@"
    [[ -n $target ]] && rm -rf "$target"
    "${pip[@]}" install "${flags[@]}" "${into[@]}" --no-index --find-links "$WHEELS" "$@"
  fi
}
