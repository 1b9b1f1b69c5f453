"""The simulator's Mamba block-aligned chunk split (kvblocks.sim.mamba_split) against vLLM 0.33's
``Scheduler._mamba_block_aligned_split``, and its effect on a ``mamba-partial`` replay."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace
from typing import Any

import kvblocks
import pytest
from kvblocks.sim.backends import make_backend
from kvblocks.sim.engine import replay
from kvblocks.sim.mamba_split import MambaSplit, mamba_split_for
from kvblocks.sim.presets import replay_layout
from kvblocks.sim.workloads import WorkloadParams, generate

HAVE_KB = hasattr(kvblocks, "KVCacheManager")


def _vllm_split() -> Any:
    vllm = pytest.importorskip("vllm")
    if not str(vllm.__version__).startswith("0.33"):
        # vLLM 0.32 splits by other rules; the simulator follows 0.33's.
        pytest.skip(f"the simulator splits by vLLM 0.33's rules, not {vllm.__version__}'s")
    sched = pytest.importorskip("vllm.v1.core.sched.scheduler")
    fn = getattr(sched.Scheduler, "_mamba_block_aligned_split", None)
    if fn is None:
        pytest.skip("the installed vLLM has no Mamba block-aligned split")
    return fn


# vLLM's Scheduler attribute -> the MambaSplit field it is
_SCHEDULER_ATTRS = {
    "hash_block_size": "hash_block_size",
    "use_eagle_block_drop": "eagle_block_drop",
    "num_hash_lookahead_tokens": "hash_lookahead_tokens",
    "mamba_prefill_checkpoint_alignment": "checkpoint_alignment",
    "mamba_has_prefill_checkpoint_blocks": "has_checkpoint_blocks",
    "mamba_partial_cache_hit": "partial_hits",
    "mamba_shared_prefix_checkpoint": "shared_prefix_checkpoint",
    "max_num_scheduled_tokens": "max_prefill_tokens",
}


def _stand_in(split: MambaSplit) -> SimpleNamespace:
    """The attributes of vLLM's Scheduler that the split reads (scheduler block = Mamba
    block, no long-prefill threshold)."""
    return SimpleNamespace(
        cache_config=SimpleNamespace(block_size=split.block_size),
        block_size=split.block_size,
        scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
        **{attr: getattr(split, name) for attr, name in _SCHEDULER_ATTRS.items()},
    )


def _splits() -> list[MambaSplit]:
    out = []
    grid = itertools.product(
        (16, 32, 64),  # Mamba block size (hash blocks of 16)
        (False, True),  # EAGLE block drop
        (0, 1, 3),  # hash lookahead
        (None, 16),  # checkpoint alignment
        (False, True),  # prefill-checkpoint blocks
        (False, True),  # partial hits
        (False, True),  # shared-prefix checkpoint
        (8, 48, 2048),  # max tokens of a chunk
    )
    for bs, drop, ahead, align, ckpt, partial, junction_ckpt, max_tokens in grid:
        partial = partial and bs > 16
        out.append(
            MambaSplit(
                block_size=bs,
                hash_block_size=16,
                checkpoint_block_size=16 if partial else bs,
                eagle_block_drop=drop,
                hash_lookahead_tokens=ahead,
                checkpoint_alignment=align,
                has_checkpoint_blocks=ckpt,
                partial_hits=partial,
                shared_prefix_checkpoint=partial and junction_ckpt,
                max_prefill_tokens=max_tokens,
            )
        )
    return out


@pytest.mark.vllm
def test_split_matches_vllm_scheduler() -> None:
    theirs = _vllm_split()
    rng = random.Random(22)
    cases = clipped = 0
    for split in _splits():
        sched = _stand_in(split)
        for _ in range(40):
            prompt = rng.randint(1, 300)
            num_tokens = prompt + rng.choice((0, 0, rng.randint(1, 40)))
            computed = rng.choice((0, rng.randint(0, num_tokens - 1)))
            hit = rng.choice((0, rng.randint(0, num_tokens - computed - 1)))
            ext = rng.choice((0, 0, rng.randint(0, num_tokens - computed - hit - 1)))
            left = num_tokens - computed - hit - ext
            n = rng.randint(1, left) if left > 0 else 0
            junction = rng.choice((0, rng.randint(0, num_tokens), rng.randint(0, 20) * 16))
            req = SimpleNamespace(
                num_computed_tokens=computed,
                num_prompt_tokens=prompt,
                num_tokens=num_tokens,
                shared_prefix_boundary=junction,
            )
            want = theirs(sched, req, n, hit, ext)
            got = split.clip(computed, n, prompt, num_tokens, hit, ext, junction)
            assert got == want, (split, computed, n, prompt, num_tokens, hit, ext, junction)
            cases += 1
            clipped += got < n
    assert clipped > cases // 10  # the grid exercises the clipping, not only pass-through


def test_split_only_for_mamba_align() -> None:
    for config in ("full", "hybrid", "eagle", "bs32", "mtp"):
        assert mamba_split_for(replay_layout(config, num_blocks=100), False, 8192) is None
    assert (
        mamba_split_for(replay_layout("mamba", num_blocks=100, enable_caching=False), False, 8192)
        is None
    )
    split = mamba_split_for(replay_layout("mamba-partial", num_blocks=100), True, 8192)
    assert split is not None
    assert split.partial_hits
    assert split.block_size == 2 * split.hash_block_size
    assert split.checkpoint_block_size == split.hash_block_size
    spec = mamba_split_for(replay_layout("mamba-spec", num_blocks=100), False, 8192)
    assert spec is not None
    assert spec.has_checkpoint_blocks
    assert spec.checkpoint_alignment == spec.block_size


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_KB, reason="kvblocks manager not built")
@pytest.mark.parametrize("retention_interval", [None, 0])
def test_mamba_partial_replay_copies_on_write(retention_interval: int | None) -> None:
    pytest.importorskip("vllm")
    trace = generate("shared-prefix", 3, WorkloadParams(num_requests=60, rate=0.5))
    layout = replay_layout("mamba-partial", num_blocks=4096, retention_interval=retention_interval)
    ours = replay(trace, make_backend("kvblocks", layout, batch=True))
    theirs = replay(trace, make_backend("vllm", layout))
    # chunks now stop at the prompts' hash-aligned tails inside a Mamba block, whose states
    # are cached and then copied on write (by later hits and by the request writing on)
    assert ours.block_copies > 0
    if retention_interval is None:  # keeping only the reachable states loses this trace's hits
        assert ours.hit_tokens > 0
    assert ours.block_copies == theirs.block_copies
    assert ours.digest == theirs.digest
    assert ours.hit_tokens == theirs.hit_tokens


@pytest.mark.skipif(not HAVE_KB, reason="kvblocks._core not built")
def test_checkpoint_rules_from_the_core() -> None:
    """The split reads the core's checkpoint rules: a position is aligned, leaves a token
    (or the hash lookahead) after it, and EAGLE's drop gives up one alignment more; a
    checkpoint is exportable only inside the query, aligned from its start; zero sizes are
    refused."""
    from kvblocks._core import mamba_checkpoint_exportable, mamba_checkpoint_position

    for n, a, ahead in itertools.product(range(0, 40), (1, 4, 8), (0, 2, 5)):
        p = mamba_checkpoint_position(n, a, False, ahead)
        assert p % a == 0 and p <= max(n - max(1, ahead), 0), (n, a, ahead)
        assert p + a > n - max(1, ahead), (n, a, ahead)
        assert mamba_checkpoint_position(n, a, True, ahead) == max(n // a * a - a, 0)
    assert mamba_checkpoint_exportable(16, 64, 32, 16, 16, 16)
    assert not mamba_checkpoint_exportable(16, 64, 64, 16, 16, 16)  # at the query's end
    assert not mamba_checkpoint_exportable(16, 64, 40, 16, 16, 16)  # not aligned from start
    assert not mamba_checkpoint_exportable(8, 64, 32, 16, 16, 16)  # start off a hash block
    for bad in ((0, 16, 16), (16, 0, 16), (16, 16, 0)):
        with pytest.raises(ValueError):
            mamba_checkpoint_exportable(16, 64, 32, *bad)
    with pytest.raises(ValueError):
        mamba_checkpoint_position(16, 0, False, 0)
