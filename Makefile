# The one command surface. `make test` is what CI runs (.ci/run); `make simulate` is the
# main job. `make test` fills the development venv .venv (torch included); `make simulate`
# builds a light one, .venv-sim, with only what the simulator needs (no torch).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.deps-stamp
# The package registry here sends no cacheable responses, so pip's own cache stays empty;
# keep the downloaded wheels (torch is ~3 GB) in a local wheelhouse and install from it.
WHEELS ?= $(HOME)/.cache/kvblocks-wheels
DEPS := "maturin>=1.5,<2" "pytest>=8" "hypothesis>=6" numpy msgpack pyzmq matplotlib ruff mypy \
	prometheus_client torch tqdm

.PHONY: venv deps dev test test-rust test-python lint fmt bench simulate sim-dev oracle test-vllm \
	vllm-scheduler-tests

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(PIP) download -d $(WHEELS) $(DEPS)
	$(PIP) install --no-index --find-links $(WHEELS) $(DEPS)
	touch $(STAMP)

deps: $(STAMP)

# Build the extension in release mode and install it into the venv.
dev: deps
	VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/maturin develop --release -q

test-rust:
	cargo test --release -q

test-python: dev
	$(BIN)/python -m pytest -q

test: test-rust test-python

lint: deps
	cargo fmt --all -- --check
	cargo clippy --all-targets --all-features -- -D warnings
	$(BIN)/ruff check python tests benches
	$(BIN)/ruff format --check python tests benches
	$(BIN)/mypy

fmt:
	cargo fmt --all
	$(BIN)/ruff format python tests benches

bench:
	cargo bench

# The simulator's own venv: maturin to build, the package's runtime dependency (tqdm), the
# extension in release mode. No torch, no test tools.
SIM_VENV ?= .venv-sim
SIM_BIN := $(SIM_VENV)/bin
SIM_PIP := $(SIM_BIN)/python -m pip --disable-pip-version-check -q
SIM_DEPS := "maturin>=1.5,<2" tqdm

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

# vLLM 0.33.0 as a reference oracle (CPU venv; a few minutes the first time).
VREF ?= $(abspath .venv-vllm-oracle)
VLLM_TESTS ?= .
ORACLE_SITE := $(abspath .oracle-site)

oracle:
	VREF=$(VREF) bash ../shared/tools/vllm-oracle/setup.sh

# The tests that compare with vLLM, run inside the oracle venv with this build of kvblocks.
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
	cd tests && PYTHONPATH=$(ORACLE_SITE) $(VREF)/bin/python -m pytest -q -p no:cacheprovider \
		-c ../pyproject.toml --rootdir .. $(VLLM_TESTS)

# vLLM 0.33.0's own scheduler tests (from its sdist, unedited), stock and with
# kvblocks.vllm.install() active; lists the tests that pass stock but not on kvblocks.
vllm-scheduler-tests: deps
	$(VREF)/bin/python tools/vllm_tests.py all --build --python $(VREF)/bin/python
