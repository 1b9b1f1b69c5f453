#!/bin/sh
# Checks one built wheel with the Python on PATH, as a user meets it: installs the wheel
# found in the folder $1 (release.yml runs this for each platform and Python; `make wheel`
# for the manylinux2014 wheel on Python 3.10 and 3.13), imports the package outside the
# checkout (without torch or vLLM being imported), replays the built-in workload, then runs
# pytest from the repository root on the installed package: on the paths given after $1,
# or on all of tests/ (the tests that need torch or vLLM skip themselves). Any failure
# fails the script, pytest's exit code 5 (no test collected) included.
#
# With WHEELHOUSE set (`make wheel`), the dependencies are first downloaded into that folder
# and installed from it alone; otherwise from the package index.
set -eu

wheels=$1
shift
# The wheel's own dependency (tqdm, pyproject.toml) and the tests'.
deps="tqdm>=4.64 pytest hypothesis numpy msgpack pyzmq prometheus_client"
if [ -n "${WHEELHOUSE:-}" ]; then
  # shellcheck disable=SC2086 # $deps is a list of requirements
  python -m pip download -q -d "$WHEELHOUSE" $deps
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE"
fi
python -m pip install -q "$wheels"/*.whl
# shellcheck disable=SC2086
python -m pip install -q $deps

repo=$(pwd)
cd "$(mktemp -d)"
python -c "import sys, kvblocks, kvblocks.vllm; assert not {'torch', 'vllm'} & set(sys.modules)"
kvblocks simulate
cd "$repo"
# From the root, `import kvblocks` must still be the installed wheel, not python/kvblocks.
python -c "
import os, kvblocks
where = os.path.dirname(os.path.abspath(kvblocks.__file__))
assert not where.startswith(os.path.abspath('python')), where
print('kvblocks', kvblocks.__version__, 'from', where)
"
if [ "$#" -eq 0 ]; then
  set -- tests
fi
python -m pytest -q -p no:cacheprovider "$@"
