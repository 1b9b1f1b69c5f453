"""kvblocks.router against vLLM's own KVCacheManager: four vLLM managers (full attention,
and full + sliding window) run multi-tenant traffic (shared prefixes, cache salts, LoRA
adapters, preemptions, evictions, duplicate blocks), their events go out through vLLM's
own `ZmqEventPublisher` (msgspec encoding, PUB and replay sockets) and come in through
`kvblocks.router.Subscriber`; after every step, each probe's hit per engine from the index
must equal that engine's `get_computed_blocks`. The subscriber connects after the first
batches are sent (PUB drops them): it recovers them from each engine's replay socket.

`KVBLOCKS_ROUTER_PROBES` sets the probes per step (default 4).
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("vllm")
pytest.importorskip("zmq")
pytest.importorskip("torch")

from kvblocks.router import KVIndex, Subscriber
from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1 import kv_cache_interface as vi
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request as VllmRequest

BS = 16
MAX_MODEL_LEN = 1024
PROBES = int(os.environ.get("KVBLOCKS_ROUTER_PROBES", "4"))
LORAS = [None, None, LoRARequest("ad1", 1, "/adapters/ad1"), LoRARequest("ad2", 2, "/ad2")]
SALTS = [None, None, "tenant-a", "tenant-b"]
# (name, sliding window of a second group or None, blocks)
ENGINES = [("full-a", None, 40), ("full-b", None, 64), ("hybrid-a", 48, 48), ("hybrid-b", 32, 80)]


@pytest.fixture(autouse=True)
def _none_hash() -> None:
    init_none_hash(sha256_cbor)


def attention(**kw: Any) -> dict[str, Any]:
    return {"block_size": BS, "num_kv_heads": 1, "head_size": 16, **kw}


@dataclass
class Engine:
    name: str
    mgr: Any
    publisher: Any
    vllm_config: Any
    """vLLM's `KVCacheConfig`: the index registers the engine with it as is."""
    waiting: list[Any] = field(default_factory=list)
    running: list[Any] = field(default_factory=list)
    published: int = 0

    def publish(self) -> None:
        events = self.mgr.take_events()
        if events:  # as vLLM's scheduler: a batch only when there are events
            self.publisher.publish(KVEventBatch(ts=time.time(), events=events))
            self.published += 1


def endpoints(where: str) -> tuple[str, str]:
    """PUB and replay endpoints (ipc: vLLM binds them, and they stay on this machine)."""
    return f"ipc://{where}-pub", f"ipc://{where}-replay"


def make_engine(name: str, window: int | None, blocks: int, where: str) -> Engine:
    vspecs = [vi.FullAttentionSpec(**attention(dtype=_torch_dtype()))]
    if window is not None:
        vspecs.append(
            vi.SlidingWindowSpec(**attention(dtype=_torch_dtype()), sliding_window=window)
        )
    vcfg = vi.KVCacheConfig(
        num_blocks=blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[vi.KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(vspecs)],
    )
    mgr = VllmManager(
        vcfg,
        max_model_len=MAX_MODEL_LEN,
        scheduler_block_size=BS,
        hash_block_size=BS,
        enable_caching=True,
        enable_kv_cache_events=True,
    )
    pub, replay = endpoints(where)
    publisher = ZmqEventPublisher(0, endpoint=pub, replay_endpoint=replay)
    return Engine(name, mgr, publisher, vcfg)


def _torch_dtype() -> Any:
    import torch

    return torch.float16


HASHER = None


def request(rid: str, tokens: list[int], salt: str | None, lora: Any) -> Any:
    global HASHER
    if HASHER is None:
        HASHER = get_request_block_hasher(BS, sha256_cbor)
    return VllmRequest(
        rid,
        tokens,
        SamplingParams(max_tokens=64),
        None,
        lora_request=lora,
        cache_salt=salt,
        block_hasher=HASHER,
    )


class Traffic:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.prefixes = [
            [self.rng.randrange(5000) for _ in range(self.rng.randrange(40, 260))] for _ in range(4)
        ]
        self.n = 0

    def prompt(self) -> tuple[list[int], str | None, Any]:
        rng = self.rng
        prefix = rng.choice(self.prefixes)
        tokens = prefix[: rng.randrange(1, len(prefix) + 1)]
        tokens = tokens + [rng.randrange(5000) for _ in range(rng.randrange(0, 60))]
        return tokens, rng.choice(SALTS), rng.choice(LORAS)

    def step(self, e: Engine) -> None:
        rng = self.rng
        if rng.random() < 0.6:
            self.n += 1
            e.waiting.append(request(f"{e.name}-r{self.n}", *self.prompt()))
        if e.waiting:
            req = e.waiting[0]
            blocks, hit = e.mgr.get_computed_blocks(req)[:2]  # 0.33 adds a third
            new = e.mgr.allocate_slots(req, req.num_tokens - hit, hit, blocks)
            if new is not None:
                e.waiting.pop(0)
                req.num_computed_tokens = req.num_tokens
                req.append_output_token_ids(rng.randrange(5000))
                e.running.append(req)
        for req in list(e.running):
            if req not in e.running:
                continue
            if e.mgr.allocate_slots(req, 1) is None:
                victim = e.running.pop()
                e.mgr.free(victim)
                victim.num_computed_tokens = 0
                victim.num_preemptions += 1
                e.waiting.insert(0, victim)
                continue
            req.num_computed_tokens += 1
            req.append_output_token_ids(rng.randrange(5000))
            if rng.random() < 0.08 or req.num_tokens >= MAX_MODEL_LEN - 2:
                e.running.remove(req)
                e.mgr.free(req)
        if rng.random() < 0.03:
            e.mgr.evict_blocks(
                {rng.randrange(1, e.mgr.block_pool.num_gpu_blocks) for _ in range(3)}
            )
        e.publish()


def wait_until_ingested(sub: Subscriber, index: KVIndex, engines: list[Engine]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        sub.poll(20)
        states = [index.status(e.name) for e in engines if e.published]
        published = [e.published for e in engines if e.published]
        if all(
            st["freshness"] == "exact" and st["last_seq"] is not None and st["last_seq"] + 1 >= n
            for st, n in zip(states, published, strict=True)
        ):
            return
    raise AssertionError({e.name: (index.status(e.name), e.published) for e in engines})


def assert_exact(index: KVIndex, engines: list[Any]) -> None:
    """Every engine ends exact, none with a hash mismatch."""
    for e in engines:
        st = index.status(e.name)
        assert (st["freshness"], st["hash_mismatches"]) == ("exact", 0), (e.name, st)


def test_the_index_answers_what_vllm_would(tmp_path: Any) -> None:
    index = KVIndex()
    engines = [make_engine(n, w, b, f"{tmp_path}/{n}") for n, w, b in ENGINES]
    traffic = Traffic(11)
    try:
        for e in engines:
            index.add_engine(e.name, e.vllm_config, max_model_len=MAX_MODEL_LEN, hash_block_size=BS)
        for _ in range(5):  # sent before anyone subscribes: PUB drops them
            for e in engines:
                traffic.step(e)
        time.sleep(0.2)
        sub = Subscriber(index)
        for e in engines:
            sub.add(e.name, *endpoints(f"{tmp_path}/{e.name}"))
        time.sleep(0.3)  # the SUB sockets connect
        probes = bad = 0
        for _ in range(120):
            for e in engines:
                traffic.step(e)
            wait_until_ingested(sub, index, engines)
            for i in range(PROBES):
                tokens, salt, lora = traffic.prompt()
                kw: dict[str, Any] = {"cache_salt": salt}
                if lora is not None:
                    kw |= {"lora_name": lora.lora_name, "lora_path": lora.lora_path}
                hits = index.hits(tokens, **kw)
                for e in engines:
                    probe = request(f"p{i}", tokens, salt, lora)
                    want = e.mgr.get_computed_blocks(probe)[1]
                    probes += 1
                    bad += hits[e.name].gpu_tokens != want
        assert probes == 120 * PROBES * len(engines)
        assert bad == 0, f"{bad} of {probes} probes differ"
        assert sum(sub.replayed.values()) > 0, "the first batches come from the replay sockets"
        assert_exact(index, engines)
        sub.stop()
    finally:
        for e in engines:
            e.publisher.shutdown()
