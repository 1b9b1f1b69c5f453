"""Run a vLLM release's own scheduler tests, stock or on kvblocks, and compare the outcomes.

    python tools/vllm_tests.py fetch             # vLLM's tests/ from its sdist into .vllm-tests/V/
    python tools/vllm_tests.py run               # stock vLLM -> .vllm-tests/V/results/stock.*
    python tools/vllm_tests.py run --kvblocks    # install() active -> results/kvblocks.*
    python tools/vllm_tests.py run --kvblocks --build   # a fresh wheel into the site first
    python tools/vllm_tests.py run --kvblocks --tree    # python/ of this tree, no wheel
    python tools/vllm_tests.py compare           # tests that pass stock but not on kvblocks
    python tools/vllm_tests.py all               # fetch if missing, both runs, compare
    python tools/vllm_tests.py all --vllm 0.32   # the same for vLLM 0.32 (default: 0.33)
    python tools/vllm_tests.py run --kvblocks -- -k preempt -x    # after --: pytest's own
    python tools/vllm_tests.py all --offload     # the offload tests, kvblocks' cache policies
    python tools/vllm_tests.py all --core        # all of tests/v1/core, kvblocks' manager everywhere

`--offload` runs vLLM's offload tests (tests/v1/kv_offload/cpu and
tests/v1/kv_connector/unit/offloading_connector) instead, stock and with kvblocks' cache
policies selected in place of vLLM's `lru` and `arc` (tools/kvblocks_offload_pytest.py),
with their results in .vllm-tests/V/results-offload/.

`--core` runs all of vLLM's tests/v1/core, and with `--kvblocks` puts kvblocks' manager
wherever vLLM's is named: the scheduler module and `vllm.v1.core.kv_cache_manager`, which
vLLM's manager tests import it from (strict unless `--fallback`). Results go to
.vllm-tests/V/results-core/.

`--vllm V` picks one of the releases kvblocks supports (kvblocks.vllm._versions.SUPPORTED):
its venv, .venv-vllm-V (tools/vllm_env/setup.sh V; `--venv` for another), the sdist of the
exact vLLM version installed there, and .vllm-tests/V/ for the tests and results. The tests
run unedited in that venv; the tool itself needs only Python 3.11. kvblocks and pytest come
from a site folder put first on PYTHONPATH (default .oracle-site.harness-V), never from the
venv itself. `run` writes junit xml and a plain `OUTCOME NODEID` list per run; `compare`
(and `run --compare`) exits 1 when any test that passes on stock fails on kvblocks, and
writes those tests grouped by cause, with the head of a traceback each, to
.vllm-tests/V/failures.md (failures-offload.md, failures-core.md).

The vLLM sdist cannot be built here, so pip is only asked to unpack it: `pip download
--no-binary :all: --no-deps --no-clean --no-build-isolation` fails at "Preparing metadata"
and leaves the unpacked sdist in its temporary folder, from which tests/ is copied.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILES = ("tests/v1/core/test_scheduler.py", "tests/v1/core/test_async_scheduler.py")
# vLLM 0.33's tests of the host-memory (CPU offload) tier: `--offload`.
OFFLOAD_FILES = ("tests/v1/kv_offload/cpu", "tests/v1/kv_connector/unit/offloading_connector")
# `--core`: every test of the KV cache manager, the scheduler and the coordinators.
CORE_FILES = ("tests/v1/core",)
WHEELS = Path.home() / ".cache" / "kvblocks-wheels"
PYTEST_DEPS = ("pytest", "iniconfig", "pluggy", "packaging")

# facebook/opt-125m's published config.json (the tests name the model; no hub here).
OPT_125M_CONFIG = {
    "_name_or_path": "facebook/opt-125m",
    "activation_dropout": 0.0,
    "activation_function": "relu",
    "architectures": ["OPTForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 2,
    "do_layer_norm_before": True,
    "dropout": 0.1,
    "eos_token_id": 2,
    "ffn_dim": 3072,
    "hidden_size": 768,
    "init_std": 0.02,
    "layerdrop": 0.0,
    "max_position_embeddings": 2048,
    "model_type": "opt",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 1,
    "prefix": "</s>",
    "torch_dtype": "float16",
    "transformers_version": "4.21.0.dev0",
    "use_cache": True,
    "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}

# vLLM 0.33.0's pyproject.toml [tool.pytest.ini_options] markers, used when the fetched
# copy of its pyproject.toml is missing.
VLLM_MARKERS = [
    "slow_test",
    "skip_global_cleanup",
    "core_model: enable this model test in each PR instead of only nightly",
    "hybrid_model: models that contain mamba layers (including pure SSM and hybrid architectures)",
    "cpu_model: enable this model test in CPU tests",
    "cpu_test: mark test as CPU-only test",
    "split: run this test as part of a split",
    "distributed: run this test only in distributed GPU tests",
    "optional: optional tests that are automatically skipped, include --optional to run them",
]


def log(msg: str) -> None:
    print(f"[vllm_tests] {msg}", file=sys.stderr, flush=True)


def supported_releases() -> list[str]:
    """The releases in kvblocks.vllm._versions.SUPPORTED, as `0.33`, read from this tree
    (the module imports nothing else, so no kvblocks build is needed)."""
    path = ROOT / "python" / "kvblocks" / "vllm" / "_versions.py"
    spec = importlib.util.spec_from_file_location("_kvblocks_vllm_versions", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [f"{major}.{minor}" for major, minor in module.SUPPORTED]


def installed_vllm(python: Path) -> str:
    """The version of the vLLM that `python` imports, e.g. `0.32.0` (local part dropped)."""
    out = subprocess.run(
        [str(python), "-c", "import vllm; print(vllm.__version__)"],
        env=dict(os.environ, VLLM_TARGET_DEVICE="cpu"),
        capture_output=True,
        text=True,
    )
    if out.returncode:
        sys.stderr.write(out.stderr[-2000:])
        raise SystemExit(f"{python} cannot import vllm")
    return out.stdout.strip().splitlines()[-1].split("+")[0]


def fetch(dest: Path, python: Path, force: bool = False) -> None:
    """Unpack the sdist of the vLLM that `python` imports with pip and copy its tests/
    (and pyproject.toml) into dest."""
    version = installed_vllm(python)
    have = dest / "VERSION"
    if (
        (dest / "tests" / "v1" / "core" / "test_scheduler.py").exists()
        and have.exists()
        and have.read_text().strip() == version
        and not force
    ):
        log(f"{dest}/tests of vLLM {version} already there (fetch --force to replace)")
        return
    with tempfile.TemporaryDirectory(prefix="vllm-sdist-") as tmp:
        env = dict(os.environ, TMPDIR=tmp, PIP_NO_INPUT="1")
        cmd = [
            str(python), "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
            "--no-clean", "--no-build-isolation", f"vllm=={version}",
            "-d", str(Path(tmp) / "dl"),
        ]  # fmt: skip
        log("pip download (expected to stop at 'Preparing metadata'): " + " ".join(cmd[1:]))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        srcs = sorted(Path(tmp).glob("pip-*/vllm_*/tests"))
        if not srcs:
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
            raise SystemExit("no unpacked vLLM sdist found in pip's temporary folder")
        src = srcs[0].parent
        if (src / "PKG-INFO").exists() and f"Version: {version}" not in (
            src / "PKG-INFO"
        ).read_text(errors="replace"):
            raise SystemExit(f"unpacked sdist at {src} is not vLLM {version}")
        dest.mkdir(parents=True, exist_ok=True)
        if (dest / "tests").exists():
            shutil.rmtree(dest / "tests")
        shutil.copytree(src / "tests", dest / "tests")
        shutil.copy2(src / "pyproject.toml", dest / "vllm-pyproject.toml")
        (dest / "VERSION").write_text(version + "\n")
        log(f"copied tests/ of vLLM {version} into {dest}")


def markers(dest: Path) -> list[str]:
    pyproject = dest / "vllm-pyproject.toml"
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return VLLM_MARKERS
    if pyproject.exists():
        with pyproject.open("rb") as f:
            ini = tomllib.load(f).get("tool", {}).get("pytest", {}).get("ini_options", {})
        if ini.get("markers"):
            return list(ini["markers"])
    return VLLM_MARKERS


def prepare(dest: Path, python: Path, site: Path) -> None:
    """The local model config, pytest.ini with vLLM's markers, einops, pytest in the site."""
    cfg = dest / "facebook" / "opt-125m" / "config.json"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(json.dumps(OPT_125M_CONFIG, indent=2) + "\n")
    lines = ["[pytest]", "markers ="] + [f"    {m}" for m in markers(dest)]
    (dest / "pytest.ini").write_text("\n".join(lines) + "\n")
    missing = [
        m
        for m in ("einops", "tblib")
        if subprocess.run([str(python), "-c", f"import {m}"], capture_output=True).returncode
    ]
    if missing:
        log(f"installing {' '.join(missing)} into the vLLM venv")
        subprocess.run([str(python), "-m", "pip", "install", "-q", *missing], check=True)
    site.mkdir(parents=True, exist_ok=True)
    if not (site / "pytest").exists():
        log(f"installing pytest into {site}")
        base = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
        local = subprocess.run([*base, "--no-index", "--find-links", str(WHEELS), *PYTEST_DEPS])
        if local.returncode:
            subprocess.run([*base, *PYTEST_DEPS], check=True)


def build(site: Path, python: Path) -> None:
    """A fresh release wheel of this tree, installed into the site (not the venv)."""
    wheels = site.with_name(site.name + "-wheels")
    shutil.rmtree(wheels, ignore_errors=True)
    maturin = Path(sys.executable).parent / "maturin"
    subprocess.run(
        [str(maturin), "build", "--release", "-q", "-o", str(wheels)], cwd=ROOT, check=True
    )
    for old in list(site.glob("kvblocks")) + list(site.glob("kvblocks-*.dist-info")):
        shutil.rmtree(old)
    (site / "bin" / "kvblocks").unlink(missing_ok=True)
    whl = sorted(wheels.glob("kvblocks-*.whl"))[-1]
    pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
    subprocess.run([*pip, str(whl)], check=True)


def cases(xml_path: Path) -> dict[str, tuple[str, str]]:
    """nodeid -> (passed / failed / error / skipped, failure text), from a junit xml report."""
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        # classname is the dotted module path (plus class names); turn it back into a path.
        i = next((i for i in range(len(parts), 0, -1) if parts[i - 1].startswith("test_")), 1)
        nodeid = "::".join(["/".join(parts[:i]) + ".py", *parts[i:], case.get("name", "")])
        outcome, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                text = (child.text or child.get("message") or "").strip()
                if outcome != "skipped":
                    break
        out[nodeid] = (outcome, text)
    return out


def outcomes(xml_path: Path) -> dict[str, str]:
    return {nodeid: outcome for nodeid, (outcome, _) in cases(xml_path).items()}


def cause(text: str) -> str:
    """The exception a failure ended on: its last `E   Name: message` line."""
    lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    named = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Exit)\b", ln)]
    pick = (named or lines or text.splitlines()[-1:] or ["?"])[-1]
    return pick[:200]


def write_failures(path: Path, regressed: list[str], kvb: dict[str, tuple[str, str]]) -> None:
    """The regressed tests grouped by cause, with the head of the first traceback each."""
    groups: dict[str, list[str]] = {}
    for t in regressed:
        groups.setdefault(cause(kvb.get(t, ("missing", "not run"))[1]), []).append(t)
    md = [f"# vLLM scheduler tests that pass stock and fail with kvblocks: {len(regressed)}", ""]
    for n, (why, tests) in enumerate(sorted(groups.items(), key=lambda g: -len(g[1])), 1):
        md += [f"## {n}. {why} ({len(tests)} tests)", ""]
        md += [f"- `{t}`" for t in tests] + ["", "```"]
        tb = kvb.get(tests[0], ("", ""))[1].splitlines()
        head = tb[:25] + (["..."] if len(tb) > 40 else []) + tb[max(25, len(tb) - 15) :]
        md += [*head, "```", ""]
    path.write_text("\n".join(md))


def summary(results: dict[str, str]) -> str:
    by_file: dict[str, dict[str, int]] = {}
    for nodeid, outcome in results.items():
        counts = by_file.setdefault(nodeid.split("::")[0], {})
        counts[outcome] = counts.get(outcome, 0) + 1
    return "\n".join(
        f"  {f}: {c.get('passed', 0)} of {sum(c.values())} passed "
        + " ".join(f"{k}={v}" for k, v in sorted(c.items()) if k != "passed")
        for f, c in sorted(by_file.items())
    )


def run(args: argparse.Namespace) -> int:
    dest: Path = args.dest
    if not (dest / "tests").exists():
        fetch(dest, args.python)
    prepare(dest, args.python, args.site)
    if args.kvblocks and not args.tree and (args.build or not (args.site / "kvblocks").exists()):
        build(args.site, args.python)
    name = "kvblocks" if args.kvblocks else "stock"
    results = results_dir(args)
    results.mkdir(exist_ok=True)
    xml_path = results / f"{name}.xml"
    env = dict(os.environ)
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(
            [str(ROOT / "python")] * args.tree + [str(args.site), str(ROOT / "tools")]
        ),
        KVBLOCKS_VLLM_TESTS_FALLBACK="1" if args.fallback else "0",
        KVBLOCKS_VLLM_TESTS_EVERYWHERE="1" if args.core else "0",
    )
    cmd = [str(args.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "pytest.ini"]
    cmd += ["--rootdir", ".", f"--junitxml={xml_path}", "-o", "junit_family=xunit1"]
    if args.kvblocks:
        cmd += ["-p", "kvblocks_offload_pytest" if args.offload else "kvblocks_vllm_pytest"]
    files = args.files or (
        OFFLOAD_FILES if args.offload else CORE_FILES if args.core else DEFAULT_FILES
    )
    if args.core:
        # A few of tests/v1/core's modules need what the venv lacks (httpx, a server): they
        # count as errors instead of stopping the run.
        cmd.append("--continue-on-collection-errors")
    cmd += [*args.pytest_args, *files]
    log(f"{name}: {' '.join(cmd[1:])}")
    start = time.monotonic()
    with (results / f"{name}.log").open("w") as logf:
        proc = subprocess.run(cmd, cwd=dest, env=env, stdout=logf, stderr=subprocess.STDOUT)
    log(f"{name}: pytest ran {time.monotonic() - start:.0f} s")
    lines = (results / f"{name}.log").read_text(errors="replace").splitlines()
    for line in [*(x for x in lines if x.startswith("kvblocks: ")), *lines[-1:]]:
        print(line)
    if not xml_path.exists():
        log(f"pytest wrote no report (exit {proc.returncode}); see {results / name}.log")
        return 2
    res = outcomes(xml_path)
    (results / f"{name}.txt").write_text(
        "".join(f"{outcome} {nodeid}\n" for nodeid, outcome in sorted(res.items()))
    )
    print(f"{name}:\n{summary(res)}")
    if args.compare:
        return compare(dest, results)
    return 0


def results_dir(args: argparse.Namespace) -> Path:
    """Where a run's results go: results/, or results-offload/ (`--offload`), or
    results-core/ (`--core`)."""
    return args.dest / ("results-offload" if args.offload else "results-core" if args.core else "results")


def compare(dest: Path, results: Path) -> int:
    """List the tests that pass on stock vLLM and do not pass with kvblocks installed."""
    failures = dest / results.name.replace("results", "failures", 1)
    failures = failures.with_name(failures.name + ".md")
    runs = {}
    for name in ("stock", "kvblocks"):
        path = results / f"{name}.xml"
        if not path.exists():
            flag = " --kvblocks" if name == "kvblocks" else ""
            raise SystemExit(f"no {path}: run `tools/vllm_tests.py run{flag}` first")
        runs[name] = cases(path)
    stock = {t: o for t, (o, _) in runs["stock"].items()}
    kvb = {t: o for t, (o, _) in runs["kvblocks"].items()}
    regressed = sorted(t for t, o in stock.items() if o == "passed" and kvb.get(t) != "passed")
    gained = sorted(t for t, o in kvb.items() if o == "passed" and stock.get(t) != "passed")
    print(f"stock:\n{summary(stock)}\nkvblocks:\n{summary(kvb)}")
    for t in gained:
        print(f"passes only with kvblocks: {t}")
    for t in regressed:
        print(f"REGRESSED ({kvb.get(t, 'missing')}): {t}")
    n_stock = sum(o == "passed" for o in stock.values())
    print(f"{n_stock - len(regressed)} of {n_stock} stock-passing tests pass with kvblocks")
    if regressed:
        write_failures(failures, regressed, runs["kvblocks"])
        print(f"grouped by cause in {failures}")
    else:
        failures.unlink(missing_ok=True)
    return 1 if regressed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("command", choices=["fetch", "run", "compare", "all"])
    p.add_argument("--kvblocks", action="store_true", help="run with kvblocks.vllm.install()")
    p.add_argument("--build", action="store_true", help="build a fresh kvblocks wheel first")
    p.add_argument(
        "--tree",
        action="store_true",
        help="kvblocks from python/ of this tree (its extension as `make dev` last built it) "
        "instead of a wheel in the site",
    )
    p.add_argument("--compare", action="store_true", help="after `run`, compare the runs")
    p.add_argument("--force", action="store_true", help="fetch again even if present")
    p.add_argument(
        "--offload",
        action="store_true",
        help="vLLM's offload tests; --kvblocks selects kvblocks' cache policies",
    )
    p.add_argument(
        "--core",
        action="store_true",
        help="all of vLLM's tests/v1/core; --kvblocks puts kvblocks' manager wherever vLLM's "
        "is named",
    )
    p.add_argument(
        "--fallback",
        action="store_true",
        help="install(fallback=True): configurations kvblocks refuses run on vLLM's manager "
        "(default: strict, they fail)",
    )
    releases = supported_releases()
    p.add_argument(
        "--vllm",
        choices=releases,
        default=releases[-1],
        help="the vLLM release whose venv and tests to use (default: the newest)",
    )
    p.add_argument("--venv", type=Path, help="the vLLM venv (default .venv-vllm-VLLM)")
    p.add_argument("--dest", type=Path, help="tests and results (default .vllm-tests/VLLM)")
    p.add_argument("--site", type=Path, help="kvblocks and pytest (.oracle-site.harness-VLLM)")
    p.add_argument("--files", nargs="*", help=f"test files (default: {' '.join(DEFAULT_FILES)})")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:split])
    args.pytest_args = argv[split + 1 :]  # after `--`: passed to pytest
    args.venv = (args.venv or ROOT / f".venv-vllm-{args.vllm}").resolve()
    args.python = args.venv / "bin" / "python"
    args.dest = (args.dest or ROOT / ".vllm-tests" / args.vllm).resolve()
    args.site = (args.site or ROOT / f".oracle-site.harness-{args.vllm}").resolve()
    if args.command == "fetch":
        fetch(args.dest, args.python, force=args.force)
        return 0
    if args.command == "compare":
        return compare(args.dest, results_dir(args))
    if args.command == "run":
        return run(args)
    fetch(args.dest, args.python, force=args.force)
    args.kvblocks, args.compare = False, False
    rc = run(args)
    args.kvblocks = True
    rc = max(rc, run(args))
    return max(rc, compare(args.dest, results_dir(args)))


if __name__ == "__main__":
    sys.exit(main())
