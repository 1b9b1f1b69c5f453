#!/bin/sh
# Checks one built wheel with the Python on PATH (release.yml runs it for each platform and
# Python; run it by hand the same way): installs the wheel found in the folder $1 (its
# dependencies from the index), imports the package outside the checkout (without torch or
# vLLM being imported), replays the built-in workload, then runs the core tests from tests/
# (the tests that need torch or vLLM skip themselves).
set -eu

python -m pip install "$1"/*.whl
python -m pip install pytest hypothesis numpy msgpack pyzmq prometheus_client

repo=$(pwd)
cd "$(mktemp -d)"
python -c "import sys, kvblocks, kvblocks.vllm; assert not {'torch', 'vllm'} & set(sys.modules)"
kvblocks simulate
cd "$repo"
python -m pytest -q -p no:cacheprovider tests
