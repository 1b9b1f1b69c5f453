"""The replay loop with HiSparse's connector (kvblocks.sim.hisparse): the ``hisparse``
layout keeps its source group in a host pool, and only the connector's transfers make
host pages valid, publish them for prefix hits and release the GPU pages they pinned.
On vLLM 0.33 the same trace must give the same digest, which covers the connector's
answers (``H`` lines) and the host pool's free count (``h`` lines) each step."""

from __future__ import annotations

import ast
import io

import kvblocks
import pytest
from kvblocks.sim.backends import make_backend
from kvblocks.sim.engine import ReplayError, ReplayOptions, replay
from kvblocks.sim.presets import replay_layout
from kvblocks.sim.workloads import Trace, TraceRequest, WorkloadParams, generate

pytestmark = pytest.mark.skipif(
    not hasattr(kvblocks, "KVCacheManager"), reason="kvblocks manager not built"
)


def _trace() -> Trace:
    return generate("shared-prefix", 3, WorkloadParams(num_requests=40, rate=0.5))


def _quoting_trace() -> Trace:
    """Prompts of 216, 248 and 180 tokens (13.5, 15.5 and 11.25 hash blocks of 16), each
    quoted by a later request that adds 50 tokens of its own.

    In ``hisparse-mamba`` the source's host pages hold 32 tokens and the Mamba group
    keeps its state at the prompt's last hash block (208, 240, 176 tokens): an odd
    number of hash blocks, so the quoting request's hit ends halfway into a host page
    that the first request filled with its output and the connector published. The
    source group then copies that page on write, in the host pool.
    """
    requests = []
    for k, prompt in enumerate((216, 248, 180)):
        first = TraceRequest(f"a{k}", 40 * k, ((1000 + k, prompt),), 2000 + k, 40)
        quote = TraceRequest(
            f"b{k}", 40 * k + 30, ((1000 + k, prompt), (3000 + k, 50)), 4000 + k, 10
        )
        requests += [first, quote]
    return Trace(requests, "quoting")


def _host_copies(lines: list[str]) -> list[tuple[int, int]]:
    """The host copy-on-write pairs of the ``H`` lines."""
    return [
        pair
        for _, rest in _connector_lines(lines)
        for pair in ast.literal_eval(rest.split("] ", 1)[0] + "]")
    ]


def _layout(host_blocks: int, config: str = "hisparse"):  # type: ignore[no-untyped-def]
    return replay_layout(config, num_blocks=1200, hisparse_host_blocks=host_blocks)


def _connector_lines(lines: list[str]) -> list[list[object]]:
    """Each ``H`` line's transfers, host copies, row mirrors, all-resident flag and
    residency updates."""
    out = []
    for line in lines:
        if line.startswith("H "):
            text = line.split(" ", 2)[2]
            transfers, rest = text.split("] ", 1)
            out.append([ast.literal_eval(transfers + "]"), rest])
    return out


def test_connector_moves_pages_to_the_host_and_hits_come_from_there() -> None:
    host_blocks = 400
    out = io.StringIO()
    backend = make_backend("kvblocks", _layout(host_blocks))
    res = replay(_trace(), backend, ReplayOptions(events_out=out))
    lines = out.getvalue().splitlines()
    steps = _connector_lines(lines)
    assert len(steps) == res.steps
    transfers = [t for transfers, _ in steps for t in transfers]
    assert transfers
    # every transfer writes a host block of the pool, from one resident page per group
    assert all(0 < t[1] < host_blocks and len(t[2]) == 1 for t in transfers)
    assert len({t[0] for t in transfers}) == len(transfers)  # ids are never reused
    host_free = [int(line.split()[1]) for line in lines if line.startswith("h ")]
    assert min(host_free) == 0  # the host pool fills and evicts
    assert res.hit_tokens > 0  # prefixes published from the host pool are hit
    assert len(res.samples["hisparse_connector"]) >= 6 * res.steps
    # replay's end check: every device and host block is back in its pool
    assert backend.hisparse is not None
    assert backend.hisparse.host_pool.get_num_free_blocks() == host_blocks - 1


def test_partial_hits_inside_a_host_page_copy_it_on_write() -> None:
    out = io.StringIO()
    backend = make_backend("kvblocks", _layout(1200, "hisparse-mamba"))
    replay(_quoting_trace(), backend, ReplayOptions(events_out=out))
    copies = _host_copies(out.getvalue().splitlines())
    assert len(copies) == 3  # one per quoting request
    # each copy reads a published host block into a fresh one of the same pool
    assert all(0 < src < 1200 and 0 < dst < 1200 and src != dst for src, dst in copies)
    assert backend.hisparse is not None
    assert backend.hisparse.host_pool.get_num_free_blocks() == 1200 - 1


def test_without_completions_the_pinned_pages_never_come_back() -> None:
    """A worker that never reports its transfers leaves their resident pages pinned: the
    GPU pool drains until even an idle cache cannot admit the next request."""
    backend = make_backend("kvblocks", _layout(1200))
    assert backend.hisparse is not None
    backend.hisparse.complete = lambda out: None  # type: ignore[method-assign]
    with pytest.raises(ReplayError, match="into an idle cache"):
        replay(_trace(), backend)


def test_layouts_without_a_host_pool_have_no_connector() -> None:
    backend = make_backend("kvblocks", replay_layout("full", num_blocks=64))
    assert backend.hisparse is None
    assert backend.free_finished == backend.manager.free
    assert backend.free_preempted == backend.manager.free


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("config", "host_blocks", "quoting"),
    [("hisparse", 1200, False), ("hisparse", 400, False), ("hisparse-mamba", 1200, False),
     ("hisparse-mamba", 1200, True)],
)  # fmt: skip
def test_kvblocks_matches_vllm(config: str, host_blocks: int, quoting: bool) -> None:
    pytest.importorskip("vllm")
    iface = pytest.importorskip("vllm.v1.kv_cache_interface")
    if not hasattr(iface, "HiSparseHotSpec"):
        pytest.skip("this vLLM has no HiSparse")
    trace = _quoting_trace() if quoting else _trace()
    layout = _layout(host_blocks, config)
    theirs = replay(trace, make_backend("vllm", layout))
    for batch in (False, True):
        ours = replay(trace, make_backend("kvblocks", layout, batch=batch))
        assert ours.digest == theirs.digest
        assert ours.hit_tokens == theirs.hit_tokens
