"""Differential test: kvblocks.KVCacheManager against the installed vLLM's (0.32 or 0.33)
KVCacheManager, with that release's rules (`kvblocks.vllm._version_rules`).

Both managers are driven with the same random scheduler-like scenarios (shared-prefix
prompts, chunked prefill, decode, preemption, frees, deferred frees through
`pop_blocks_for_free`, lookahead), and every returned block table, hit length, live block
table, popped table, free-queue order, the null block's ref count and event list is
compared. Run in a vLLM venv (`make test-vllm`); skipped where vLLM is not installed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

import kvblocks as kb  # noqa: E402
from kvblocks.vllm._version_rules import rules  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1 import kv_cache_interface as vi  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.request import Request as VllmRequest  # noqa: E402


@pytest.fixture(autouse=True)
def _vllm_none_hash() -> None:
    """vLLM's NONE_HASH is process-global, and other test modules set it for other
    algorithms: make it sha256_cbor's before every test here."""
    init_none_hash(sha256_cbor)


# (kind, kwargs) per group; kinds: full, swa, chunked, mamba.
GroupDesc = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class Config:
    name: str
    groups: tuple[GroupDesc, ...]
    hash_block_size: int = 16
    num_blocks: int = 80
    max_model_len: int = 1024
    enable_caching: bool = True
    use_eagle: bool = False
    lookahead: int = 0
    retention: int | None = None
    events: bool = True
    # Multi-module MTP's `num_prefill_lookahead` and the hash lookahead (hashers and
    # manager), as vLLM 0.33's scheduler passes them.
    prefill_lookahead: int = 0
    hash_lookahead: int = 0
    dcp: int = 1
    pcp: int = 1


CONFIGS = [
    Config("full", (("full", {"block_size": 16}),), num_blocks=40),
    Config(
        "full_swa",
        (("full", {"block_size": 16}), ("swa", {"block_size": 16, "sliding_window": 48})),
    ),
    Config("swa", (("swa", {"block_size": 16, "sliding_window": 40}),), num_blocks=20),
    Config(
        "full_chunked",
        (
            ("full", {"block_size": 16}),
            ("chunked", {"block_size": 16, "attention_chunk_size": 64}),
        ),
    ),
    Config(
        "full_mamba_nocache",
        (("full", {"block_size": 16}), ("mamba", {"block_size": 1024})),
        enable_caching=False,
    ),
    Config(
        "full_mamba_align",
        (("full", {"block_size": 16}), ("mamba", {"block_size": 16, "align": 1})),
        num_blocks=60,
    ),
    Config("mamba_align", (("mamba", {"block_size": 16, "align": 1}),), num_blocks=30),
    # A Mamba block of two hash blocks: partial hits, copied on write.
    Config(
        "full_mamba_partial",
        (("full", {"block_size": 16}), ("mamba", {"block_size": 32, "align": 1})),
        num_blocks=60,
    ),
    Config(
        "full_mamba_partial_checkpoint",
        (("full", {"block_size": 16}), ("mamba", {"block_size": 32, "align": 1, "ckpt": 16})),
        num_blocks=70,
    ),
    Config(
        "full_mamba_align_spec",
        (("full", {"block_size": 16}), ("mamba", {"block_size": 16, "align": 1, "spec": 2})),
        num_blocks=70,
        lookahead=2,
    ),
    Config(
        "full_mamba_align_checkpoint",
        (("full", {"block_size": 16}), ("mamba", {"block_size": 16, "align": 1, "ckpt": 16})),
        num_blocks=70,
    ),
    Config(
        "mamba_align_spec_checkpoint_eagle",
        (("mamba", {"block_size": 16, "align": 1, "spec": 1, "ckpt": 16}),),
        num_blocks=40,
        use_eagle=True,
        lookahead=1,
    ),
    Config(
        "full_eagle", (("full", {"block_size": 16}),), num_blocks=40, use_eagle=True, lookahead=2
    ),
    Config(
        "full_swa_eagle",
        (("full", {"block_size": 16}), ("swa", {"block_size": 16, "sliding_window": 32})),
        use_eagle=True,
        lookahead=1,
    ),
    Config(
        "bs32_over_hash16",
        (("full", {"block_size": 32}), ("swa", {"block_size": 16, "sliding_window": 32})),
        num_blocks=50,
    ),
    Config(
        "bs32_over_hash16_small_window",
        (("full", {"block_size": 32}), ("swa", {"block_size": 16, "sliding_window": 16})),
        num_blocks=50,
    ),
    Config(
        "full_swa_retention0",
        (("full", {"block_size": 16}), ("swa", {"block_size": 16, "sliding_window": 48})),
        retention=0,
    ),
    Config(
        "bs32_swa16_retention64_eagle",
        (("full", {"block_size": 32}), ("swa", {"block_size": 16, "sliding_window": 16})),
        num_blocks=50,
        retention=64,
        use_eagle=True,
        lookahead=1,
    ),
    # Mamba "align" under sparse retention: only the replay boundary's state (0), or
    # also the last state of every 64-token segment, is cached; retention 0 reserves a
    # prefill checkpoint only on the chunk reaching the prompt's end.
    Config(
        "full_mamba_align_retention0",
        (("full", {"block_size": 16}), ("mamba", {"block_size": 16, "align": 1})),
        num_blocks=60,
        retention=0,
    ),
    Config(
        "full_mamba_partial_checkpoint_retention0",
        (("full", {"block_size": 16}), ("mamba", {"block_size": 32, "align": 1, "ckpt": 16})),
        num_blocks=70,
        retention=0,
    ),
    Config(
        "full_mamba_align_checkpoint_retention64",
        (("full", {"block_size": 16}), ("mamba", {"block_size": 16, "align": 1, "ckpt": 16})),
        num_blocks=70,
        retention=64,
    ),
    Config(
        "full_swa_nocache",
        (("full", {"block_size": 16}), ("swa", {"block_size": 16, "sliding_window": 48})),
        enable_caching=False,
    ),
    Config("full_mtp", (("full", {"block_size": 16}),), num_blocks=40, prefill_lookahead=3),
    Config(
        "full_swa_eagle_mtp",
        (("full", {"block_size": 16}), ("swa", {"block_size": 16, "sliding_window": 32})),
        use_eagle=True,
        lookahead=3,
        prefill_lookahead=3,
    ),
    *(
        [
            Config(
                "full_mtp_hash_lookahead",
                (("full", {"block_size": 16}),),
                num_blocks=40,
                lookahead=3,
                prefill_lookahead=3,
                hash_lookahead=3,
            ),
            Config(
                "full_swa_hash_lookahead",
                (("full", {"block_size": 16}), ("swa", {"block_size": 16, "sliding_window": 48})),
                lookahead=1,
                prefill_lookahead=1,
                hash_lookahead=1,
            ),
        ]
        if rules().hash_lookahead
        else []
    ),
    # Decode context parallelism: a sharded group's blocks hold block_size * dcp tokens,
    # the hashes follow (hash_block_size = the effective block size).
    Config("full_dcp2", (("full", {"block_size": 16}),), hash_block_size=32, dcp=2),
    Config(
        "full_dcp4_pcp2",
        (("full", {"block_size": 8}),),
        hash_block_size=32,
        num_blocks=30,
        dcp=4,
        pcp=2,
    ),
    Config(
        "full_dcp2_eagle",
        (("full", {"block_size": 16}),),
        hash_block_size=32,
        use_eagle=True,
        lookahead=2,
        dcp=2,
    ),
    # A replicated (dcp_sharded=False) sliding-window draft beside a sharded target.
    Config(
        "full_dcp2_swa_replicated",
        (
            ("full", {"block_size": 16}),
            ("swa", {"block_size": 16, "sliding_window": 48, "dcp_sharded": False}),
        ),
        dcp=2,
    ),
    Config(
        "full_dcp2_swa_sharded_nocache",
        (("full", {"block_size": 16}), ("swa", {"block_size": 16, "sliding_window": 48})),
        hash_block_size=32,
        enable_caching=False,
        dcp=2,
    ),
]

ATTN: dict[str, Any] = {"num_kv_heads": 2, "head_size": 8}


def vllm_spec(kind: str, kw: dict[str, Any]) -> Any:
    if kind == "full":
        return vi.FullAttentionSpec(**ATTN, dtype=torch.float16, **kw)
    if kind == "swa":
        return vi.SlidingWindowSpec(**ATTN, dtype=torch.float16, **kw)
    if kind == "chunked":
        return vi.ChunkedLocalAttentionSpec(**ATTN, dtype=torch.float16, **kw)
    return vi.MambaSpec(
        shapes=((4,),), dtypes=(torch.float32,), block_size=kw["block_size"], **mamba_options(kw)
    )


def kb_spec(kind: str, kw: dict[str, Any]) -> Any:
    if kind == "full":
        return kb.FullAttentionSpec(**ATTN, dtype="float16", **kw)
    if kind == "swa":
        return kb.SlidingWindowSpec(**ATTN, dtype="float16", **kw)
    if kind == "chunked":
        return kb.ChunkedLocalAttentionSpec(**ATTN, dtype="float16", **kw)
    return kb.MambaSpec(
        shapes=[[4]], dtypes=["float32"], block_size=kw["block_size"], **mamba_options(kw)
    )


def mamba_options(kw: dict[str, Any]) -> dict[str, Any]:
    """Mode, speculative blocks (`spec`) and a prefill checkpoint alignment (`ckpt`)."""
    return {
        "mamba_cache_mode": "align" if kw.get("align") else "none",
        "num_speculative_blocks": kw.get("spec", 0),
        "num_prefill_checkpoint_blocks": int("ckpt" in kw),
        "prefill_checkpoint_alignment": kw.get("ckpt"),
    }


def scheduler_block_size(cfg: Config) -> int:
    """The lcm of the groups' effective block sizes (attention is DCP-sharded unless
    `dcp_sharded=False`; Mamba never)."""
    return math.lcm(
        *(
            kw["block_size"] * (cfg.dcp if k != "mamba" and kw.get("dcp_sharded", True) else 1)
            for k, kw in cfg.groups
        )
    )


def build(cfg: Config) -> tuple[Any, Any]:
    vcfg = vi.KVCacheConfig(
        num_blocks=cfg.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            vi.KVCacheGroupSpec([f"l{i}"], vllm_spec(k, kw)) for i, (k, kw) in enumerate(cfg.groups)
        ],
        prefix_cache_retention_interval=cfg.retention,
    )
    vm = VllmManager(
        vcfg,
        max_model_len=cfg.max_model_len,
        scheduler_block_size=scheduler_block_size(cfg),
        hash_block_size=cfg.hash_block_size,
        enable_caching=cfg.enable_caching,
        use_eagle=cfg.use_eagle,
        enable_kv_cache_events=cfg.events,
        log_stats=True,
        num_prefill_lookahead=cfg.prefill_lookahead,
        **({"num_hash_lookahead_tokens": cfg.hash_lookahead} if cfg.hash_lookahead else {}),
        dcp_world_size=cfg.dcp,
        pcp_world_size=cfg.pcp,
    )
    kcfg = kb.KVCacheConfig(
        cfg.num_blocks,
        [],
        [kb.KVCacheGroupSpec([f"l{i}"], kb_spec(k, kw)) for i, (k, kw) in enumerate(cfg.groups)],
        cfg.retention,
    )
    km = kb.KVCacheManager(
        kcfg,
        cfg.max_model_len,
        cfg.hash_block_size,
        enable_caching=cfg.enable_caching,
        use_eagle=cfg.use_eagle,
        enable_kv_cache_events=cfg.events,
        log_stats=True,
        count_null_block_refs=rules().count_null_block_refs,
        mamba_none_prefix_caching=rules().mamba_none_prefix_caching,
        num_prefill_lookahead=cfg.prefill_lookahead,
        num_hash_lookahead_tokens=cfg.hash_lookahead,
        dcp_world_size=cfg.dcp,
        pcp_world_size=cfg.pcp,
    )
    return vm, km


@dataclass
class Pair:
    v: Any
    k: Any
    max_out: int

    @property
    def rid(self) -> str:
        return str(self.v.request_id)


def event_view(e: Any) -> tuple[Any, ...]:
    name = type(e).__name__
    if name == "BlockStored":
        return (
            name,
            list(e.block_hashes),
            e.parent_block_hash,
            list(e.token_ids),
            e.block_size,
            e.group_idx,
            e.kv_cache_spec_kind,
            e.kv_cache_spec_sliding_window,
            e.session_id,
            getattr(e, "lookahead_token_ids", None),
            None if e.extra_keys is None else [tuple(x) if x else x for x in e.extra_keys],
        )
    if name == "BlockRemoved":
        return (name, list(e.block_hashes), e.group_idx)
    return (name,)


def ids(blocks: Any) -> tuple[list[int], ...] | None:
    return None if blocks is None else tuple(list(g) for g in blocks.get_block_ids())


class Driver:
    def __init__(self, cfg: Config, seed: int) -> None:
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.vm, self.km = build(cfg)
        la = (cfg.hash_lookahead,) if cfg.hash_lookahead else ()
        self.hasher = get_request_block_hasher(cfg.hash_block_size, sha256_cbor, *la)
        self.khasher = kb.BlockHasher(cfg.hash_block_size, "sha256_cbor", cfg.hash_lookahead)
        self.prefixes = [
            [self.rng.randrange(1000) for _ in range(self.rng.randrange(30, 300))] for _ in range(3)
        ]
        self.waiting: list[Pair] = []
        self.running: list[Pair] = []
        self.next_id = 0
        self.calls = 0

    def new_request(self) -> Pair:
        prefix = self.rng.choice(self.prefixes)
        prompt = prefix[: self.rng.randrange(1, len(prefix) + 1)]
        prompt = prompt + [self.rng.randrange(1000) for _ in range(self.rng.randrange(0, 40))]
        return self.make_pair(prompt, self.rng.randrange(1, 40))

    def make_pair(self, prompt: list[int], max_out: int) -> Pair:
        rid = f"r{self.next_id}"
        self.next_id += 1
        session = self.rng.choice([None, "s0", "s1"])
        v = VllmRequest(
            rid,
            prompt,
            SamplingParams(max_tokens=64),
            None,
            block_hasher=self.hasher,
            session_id=session,
        )
        k = kb.Request(rid, prompt, self.khasher, session_id=session)
        assert list(v.block_hashes) == list(k.block_hashes)
        return Pair(v, k, max_out)

    def check_state(self) -> None:
        vq = [b.block_id for b in self.vm.block_pool.free_block_queue.get_all_free_blocks()]
        assert self.km.block_pool.get_free_block_ids() == vq
        for p in self.running + self.waiting:
            v_ids = tuple(list(g) for g in self.vm.get_block_ids(p.rid))
            assert self.km.get_block_ids(p.rid) == v_ids, p.rid
        assert [event_view(e) for e in self.km.take_events()] == [
            event_view(e) for e in self.vm.take_events()
        ]
        assert self.km.take_boundary_state_offloads() == self.vm.take_boundary_state_offloads()
        assert self.km.usage == pytest.approx(self.vm.usage)
        null_ref_cnt = self.km.block_objects([0])[0].ref_cnt
        assert null_ref_cnt == self.vm.block_pool.null_block.ref_cnt

    def allocate(self, p: Pair, n: int, **kw: Any) -> bool:
        self.calls += 1
        la = self.cfg.lookahead
        vb = self.vm.allocate_slots(p.v, n, num_lookahead_tokens=la, **kw.get("v", {}))
        kb_ = self.km.allocate_slots(p.k, n, num_lookahead_tokens=la, **kw.get("k", {}))
        assert ids(kb_) == ids(vb), (p.rid, n)
        return vb is not None

    def advance(self, p: Pair, n: int) -> None:
        p.v.num_computed_tokens += n
        p.k.num_computed_tokens += n
        if p.v.num_computed_tokens >= p.v.num_tokens:
            tok = self.rng.randrange(1000)
            p.v.append_output_token_ids(tok)
            p.k.append_output_token_ids([tok])
            assert list(p.v.block_hashes) == list(p.k.block_hashes)

    def preempt(self, p: Pair) -> None:
        self.vm.free(p.v)
        self.km.free(p.k)
        for r in (p.v, p.k):
            r.num_computed_tokens = 0
            r.num_preemptions += 1
        self.running.remove(p)
        self.waiting.insert(0, p)

    def finish(self, p: Pair) -> None:
        if self.rng.random() < 0.5:
            self.vm.free(p.v)
            self.km.free(p.k)
        else:  # the scheduler's deferred free: pop now, free in reverse later
            vblocks = self.vm.pop_blocks_for_free(p.v)
            kids = self.km.pop_blocks_for_free(p.k)
            assert kids == [b.block_id for b in vblocks], p.rid
            self.vm.block_pool.free_blocks(reversed(vblocks))
            self.km.block_pool.free_blocks(kids[::-1])
        self.running.remove(p)

    def chunk(self, p: Pair, start: int, n: int) -> int:
        """`n` tokens from `start`, ended at the prompt's last hash boundary where that is
        inside a Mamba block coarser than a hash block, as vLLM 0.33's scheduler does
        there (`mamba_partial_cache_hit`) so the state is cached for partial hits."""
        h = self.cfg.hash_block_size
        coarse = any(k == "mamba" and kw["block_size"] > h for k, kw in self.cfg.groups)
        boundary = (p.v.num_prompt_tokens - 1) // h * h
        return boundary - start if coarse and start < boundary < start + n else n

    def release_copies(self) -> None:
        """The step's partial-hit copies agree; both drop their references, as vLLM's
        scheduler does once it handed them to the worker."""
        vcopies, vretained = self.vm.take_kv_cache_block_copies()
        kpairs = self.km.take_block_copies()
        assert kpairs == [(c.src_block_id, c.dst_block_id) for c in vcopies]
        assert [b for pair in kpairs for b in pair] == [b.block_id for b in vretained]
        self.vm.block_pool.free_blocks(vretained)
        self.km.block_pool.free_blocks([b for pair in kpairs for b in pair])

    def step(self) -> None:
        self.vm.new_step_starts()
        self.km.new_step_starts()
        budget = 256
        scheduled: list[tuple[Pair, int]] = []
        delayed: list[tuple[Pair, int]] = []
        for p in list(self.running):
            if p not in self.running:
                continue
            remaining = p.v.num_tokens - p.v.num_computed_tokens
            n = min(remaining, self.rng.randrange(1, 96), budget) if remaining > 1 else 1
            n = self.chunk(p, p.v.num_computed_tokens, n)
            if n <= 0:
                continue
            while not self.allocate(p, n):
                victim = self.running[-1]
                scheduled = [(q, m) for q, m in scheduled if q is not victim]
                self.preempt(victim)
                if victim is p:
                    break
            else:
                scheduled.append((p, n))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < 8:
            p = self.waiting[0]
            vblocks, vhit, _ = self.vm.get_computed_blocks(p.v)
            kblocks, khit = self.km.get_computed_blocks(p.k)
            assert (ids(kblocks), khit) == (ids(vblocks), vhit), p.rid
            self.vm.record_prefix_cache_stats(p.v, vhit)
            self.km.record_prefix_cache_stats(p.k, khit)
            ext = 0
            # (No connector tokens with Mamba: vLLM 0.33 then allocates a block per
            # external block but counts one, and runs out of blocks.)
            mamba = any(k == "mamba" for k, _ in self.cfg.groups)
            if self.cfg.enable_caching and not mamba and self.rng.random() < 0.15:
                unit = scheduler_block_size(self.cfg)
                ext = self.rng.randrange(0, (p.v.num_tokens - 1 - vhit) // unit + 1) * unit
            n = min(p.v.num_tokens - vhit - ext, budget)
            if self.rng.random() < 0.3:
                n = max(1, n // 2)
            n = self.chunk(p, vhit + ext, n)
            extra = {
                "num_external_computed_tokens": ext,
                "delay_cache_blocks": self.rng.random() < 0.15,
                "full_sequence_must_fit": self.rng.random() < 0.3,
            }
            ok = self.allocate(
                p,
                n,
                v={"num_new_computed_tokens": vhit, "new_computed_blocks": vblocks, **extra},
                k={"num_new_computed_tokens": khit, "new_computed_blocks": kblocks, **extra},
            )
            if not ok:
                break
            self.waiting.pop(0)
            self.running.append(p)
            for r in (p.v, p.k):
                r.num_computed_tokens = vhit + ext
            if extra["delay_cache_blocks"]:
                delayed.append((p, vhit + ext + n))
            scheduled.append((p, n))
            budget -= n
        self.release_copies()
        for p, n in scheduled:
            self.advance(p, n)
        for p, t in delayed:
            if p in self.running:
                self.vm.cache_blocks(p.v, t)
                self.km.cache_blocks(p.k, t)
        for p in list(self.running):
            outputs = p.v.num_tokens - p.v.num_prompt_tokens
            if outputs >= p.max_out or self.rng.random() < 0.02:
                self.finish(p)
        if self.rng.random() < 0.7:
            self.waiting.append(self.new_request())
        self.check_state()

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()
        vs, ks = self.vm.make_prefix_cache_stats(), self.km.make_prefix_cache_stats()
        for f in ("requests", "queries", "hits", "preempted_requests", "preempted_hits"):
            assert getattr(ks, f) == getattr(vs, f), f


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_tables_as_vllm(cfg: Config, seed: int) -> None:
    d = Driver(cfg, seed)
    d.run(200)
    assert d.calls > 200


# Mamba in mode "none" with prefix caching: vLLM 0.32 caches every full state block.
MAMBA_NONE_CACHING_CONFIGS = [
    Config("full_mamba_none", (("full", {"block_size": 16}), ("mamba", {"block_size": 16}))),
    Config(
        "full_mamba_none_coarse_spec",
        (("full", {"block_size": 16}), ("mamba", {"block_size": 64, "spec": 1})),
        lookahead=1,
    ),
    Config(
        "swa_mamba_none",
        (("swa", {"block_size": 16, "sliding_window": 48}), ("mamba", {"block_size": 32})),
    ),
]


@pytest.mark.skipif(
    not rules().mamba_none_prefix_caching,
    reason="vLLM 0.33 asserts prefix caching with mamba_cache_mode='none' away (0.32 only)",
)
@pytest.mark.parametrize("cfg", MAMBA_NONE_CACHING_CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mamba_none_prefix_caching_matches_vllm(cfg: Config, seed: int) -> None:
    d = Driver(cfg, seed)
    d.run(200)
    assert d.calls > 200


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=lambda c: c.name)
def test_batch_decode_matches_vllm(cfg: Config) -> None:
    """allocate_slots_batch equals vLLM's allocate_slots one by one, stopping at None."""
    d = Driver(cfg, 7)
    d.run(40)
    pairs = list(d.running)
    if not pairs:
        pytest.skip("no running requests")
    counts = [1] * len(pairs)
    got = d.km.allocate_slots_batch([p.k for p in pairs], counts)
    want: list[tuple[tuple[int, ...], ...] | None] = []
    for p in pairs:
        v = d.vm.allocate_slots(p.v, 1)
        want.append(None if v is None else tuple(tuple(g) for g in v.get_block_ids()))
        if v is None:
            break
    assert got == want
    d.check_state()


def test_lora_and_salt_events_match_vllm() -> None:
    """BlockStored events carry the request's LoRA and untagged extra keys, as vLLM's."""
    from vllm.lora.request import LoRARequest

    cfg = Config("full", (("full", {"block_size": 16}),), num_blocks=40)
    vm, km = build(cfg)
    hasher = get_request_block_hasher(16, sha256_cbor)
    khasher = kb.BlockHasher(16, "sha256_cbor")
    prompt = list(range(70))
    v = VllmRequest(
        "a",
        prompt,
        SamplingParams(max_tokens=4),
        None,
        block_hasher=hasher,
        lora_request=LoRARequest("adapter", 3, "/path/a"),
        cache_salt="salt",
    )
    k = kb.Request(
        "a", prompt, khasher, lora_name="adapter", lora_path="/path/a", lora_id=3, cache_salt="salt"
    )
    assert list(v.block_hashes) == list(k.block_hashes)
    assert ids(vm.allocate_slots(v, 70)) == ids(km.allocate_slots(k, 70))
    vev, kev = vm.take_events(), km.take_events()
    assert len(vev) == len(kev) == 1
    for f in ("block_hashes", "parent_block_hash", "token_ids", "lora_id", "lora_name"):
        assert getattr(kev[0], f) == getattr(vev[0], f), f
    assert [tuple(x) if x else x for x in kev[0].extra_keys] == [
        tuple(x) if x else x for x in vev[0].extra_keys
    ]
