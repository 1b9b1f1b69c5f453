"""kvblocks.router against vLLM's CPU offloading tier (0.33, and 0.32): four vLLM
schedulers, each with vLLM's `OffloadingConnector` on its CPU offloading manager (LRU,
small enough to evict), with one or two full-attention groups, run shared-prefix traffic
with cache salts, chunked prefills and preemptions. Their GPU and CPU events go out
through vLLM's own `ZmqEventPublisher` (the scheduler's, as an engine runs it) and come in
through `kvblocks.router.Subscriber`. After every step, each probe's hit per engine from
the index must equal the engine's: on the GPU its `get_computed_blocks`, on the host tier
its connector's `get_num_new_matched_tokens` after that GPU hit, as the scheduler asks it.

The engines differ in chunk size (one and two blocks a chunk), in the connector's event
form (self-describing, with every block's hash and tokens, or the placeholder form, one
hash a chunk) and in pool sizes. The model runner is a fake that samples a token for every
request whose prefill completes and reports every transfer job of the step done.

`KVBLOCKS_ROUTER_PROBES` sets the probes per engine and step (default 2).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("vllm")
torch = pytest.importorskip("torch")
pytest.importorskip("zmq")
pytest.importorskip(
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.events",
    reason="needs the offloading connector's event tracker (vLLM 0.32 and later)",
)

import kvblocks.vllm  # noqa: E402
import vllm.v1.core.kv_cache_utils as kv_cache_utils  # noqa: E402
from kvblocks.router import KVIndex, Subscriber  # noqa: E402
from test_vllm_router import assert_exact, wait_until_ingested  # noqa: E402
from test_vllm_scheduler import BLOCK_SIZE as BS  # noqa: E402
from test_vllm_scheduler import OPT_125M, make_scheduler  # noqa: E402
from vllm.config import KVEventsConfig, KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: E402
    OffloadingWorkerMetadata,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

MAX_MODEL_LEN = 2048  # make_scheduler's
EOS = 2
PROBES = int(os.environ.get("KVBLOCKS_ROUTER_PROBES", "2"))
STEPS = 150
# vLLM's CPU tier has a cache policy factory (kvblocks registers in 0.33's).
POLICY_FACTORY = importlib.util.find_spec("vllm.v1.kv_offload.cpu.policies.factory") is not None
SALTS = [None, None, None, "tenant-a"]
# (name, GPU blocks, blocks a chunk, CPU chunks, self-describing events, groups)
ENGINES = [
    ("cpu-a", 48, 1, 40, True, 1),
    ("cpu-b", 100, 2, 24, True, 2),
    ("cpu-c", 90, 1, 40, False, 2),
    ("cpu-d", 80, 2, 48, False, 1),
]


@dataclass
class Engine:
    name: str
    sched: Any
    chunk: int
    vllm_config: Any
    published: int = 0
    cpu_events: dict[str, int] = field(default_factory=dict)


def make_engine(
    name: str,
    blocks: int,
    per_chunk: int,
    cpu_chunks: int,
    described: bool,
    groups: int,
    policy: str,
    model: Path,
    where: str,
) -> Engine:
    # Groups of full attention differ in head size (as a model's layers of two shapes).
    specs = [
        FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=g + 1, dtype=torch.float32)
        for g in range(groups)
    ]
    stride = max(s.page_size_bytes for s in specs)
    kv_cache_config = KVCacheConfig(
        num_blocks=blocks,
        kv_cache_tensors=[
            KVCacheTensor(stride * blocks, [f"l{g}"], s.page_size_bytes * blocks, s.page_size_bytes)
            for g, s in enumerate(specs)
        ],
        kv_cache_groups=[KVCacheGroupSpec([f"l{g}"], s) for g, s in enumerate(specs)],
    )
    pub, replay = endpoints(where)
    sched = make_scheduler(
        model,
        False,
        kv_cache_config=kv_cache_config,
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            kv_connector_extra_config={
                # The CPU spec sizes its pool in 4 KiB-aligned chunks.
                "cpu_bytes_to_use": 4096 * cpu_chunks,
                "block_size": BS * per_chunk,
                "self_describing_kv_events": described,
                "eviction_policy": policy,
            },
        ),
        kv_events_config=KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=pub, replay_endpoint=replay
        ),
    )
    cpu = sched.connector.connector_scheduler.manager
    assert cpu._num_chunks == cpu_chunks
    assert type(cpu._policy).__module__.startswith("kvblocks") == (policy != "lru")
    engine = Engine(name, sched, BS * per_chunk, kv_cache_config)
    publish = sched.kv_event_publisher.publish

    def counted(batch: Any) -> None:  # the batches sent, for wait_until_ingested
        engine.published += 1
        for ev in batch.events:
            if getattr(ev, "medium", None) == "CPU":
                kind = type(ev).__name__
                engine.cpu_events[kind] = engine.cpu_events.get(kind, 0) + 1
        publish(batch)

    sched.kv_event_publisher.publish = counted
    return engine


def endpoints(where: str) -> tuple[str, str]:
    return f"ipc://{where}-pub", f"ipc://{where}-replay"


def request(rid: str, tokens: list[int], salt: str | None, max_tokens: int = 1) -> Any:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    params.update_from_generation_config({}, EOS)
    # Looked up now: install() swaps the module attribute.
    hasher = kv_cache_utils.get_request_block_hasher(BS, sha256)
    return Request(rid, tokens, params, None, cache_salt=salt, block_hasher=hasher)


class Traffic:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.prefixes = [
            [self.rng.randrange(100, 5000) for _ in range(self.rng.randrange(40, 300))]
            for _ in range(4)
        ]
        self.n = 0
        self.sent: list[Any] = []

    def preemptions(self) -> int:
        return sum(r.num_preemptions for r in self.sent)

    def prompt(self) -> tuple[list[int], str | None]:
        rng = self.rng
        prefix = rng.choice(self.prefixes)
        tokens = prefix[: rng.randrange(1, len(prefix) + 1)]
        tokens = tokens + [rng.randrange(100, 5000) for _ in range(rng.randrange(0, 60))]
        return tokens, rng.choice(SALTS)

    def step(self, e: Engine) -> None:
        """One engine step: maybe an arrival, schedule, the fake runner, update."""
        rng, sched = self.rng, e.sched
        if rng.random() < 0.3:
            self.n += 1
            rid = f"{e.name}-r{self.n}"
            self.sent.append(request(rid, *self.prompt(), max_tokens=rng.randrange(1, 40)))
            sched.add_request(self.sent[-1])
        out = sched.schedule()
        meta = out.kv_connector_metadata
        ids = list(out.num_scheduled_tokens)
        sampled = [
            [] if sched.requests[r].is_prefill_chunk else [rng.randrange(100, 5000)] for r in ids
        ]
        # Every transfer of the step completes; async loads release their requests.
        jobs = {**meta.load_jobs, **meta.store_jobs}
        runner = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
            kv_connector_output=KVConnectorOutput(
                finished_sending=set(),
                finished_recving={
                    j.req_id for j in meta.load_jobs.values() if not getattr(j, "sync", False)
                },
                kv_connector_worker_meta=OffloadingWorkerMetadata({j: 1 for j in jobs}),
            ),
        )
        sched.update_from_output(out, runner)


def truth(e: Engine, tokens: list[int], salt: str | None) -> tuple[int, int | None]:
    """The engine's hit for a new request: GPU tokens (`get_computed_blocks`) and the
    host tier's tokens after them (the connector's answer as the scheduler asks it;
    None where the connector defers). The probe leaves no state behind."""
    probe = request("probe", tokens, salt)
    gpu = e.sched.kv_cache_manager.get_computed_blocks(probe)[1]
    assert gpu % BS == 0  # one hash block a block: the hit is block-aligned
    cs = e.sched.connector.connector_scheduler
    cs.on_new_request(probe)
    try:
        host = cs.get_num_new_matched_tokens(probe, gpu)[0]
    finally:
        del cs._req_status[probe.request_id]
        getattr(cs, "_release_step", lambda: None)()  # 0.33 holds the manager per step
    return gpu, host


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("opt-125m")
    (path / "config.json").write_text(json.dumps(OPT_125M))
    return path


@pytest.fixture(params=["vllm", "kvblocks"])
def source(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """Whose code the engines run, and the CPU tier's cache policy: vLLM's own, or
    kvblocks installed in vLLM (its KVCacheManager and hashing, and kvblocks' LRU policy
    for the CPU tier where vLLM takes it, 0.33). Uninstalled afterwards whatever happened."""
    policy = "lru"
    if request.param == "kvblocks":
        if POLICY_FACTORY:
            from kvblocks.vllm import _offload
            from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

            _offload.register()  # kvblocks' CPU tier policies in vLLM's factory (0.33)
            if "kvblocks-lru" in CachePolicyFactory._registry:
                policy = "kvblocks-lru"
        kvblocks.vllm.install()
    try:
        yield request.param, policy
    finally:
        kvblocks.vllm.uninstall()


def test_the_index_answers_what_the_cpu_tier_would(
    tmp_path: Path, model_dir: Path, source: tuple[str, str]
) -> None:
    kv_cache_utils.init_none_hash(sha256)
    who, policy = source
    engines = [make_engine(*spec, policy, model_dir, f"{tmp_path}/{spec[0]}") for spec in ENGINES]
    manager = type(engines[0].sched.kv_cache_manager).__module__
    assert manager.startswith("kvblocks") == (who == "kvblocks"), manager
    index = KVIndex()
    traffic = Traffic(5)
    try:
        for e in engines:
            index.add_engine(
                e.name,
                e.vllm_config,
                max_model_len=MAX_MODEL_LEN,
                hash_block_size=BS,
                hash_algo="sha256",
                host_tier=True,
                host_block_size=e.chunk,
            )
        sub = Subscriber(index)
        for e in engines:
            sub.add(e.name, *endpoints(f"{tmp_path}/{e.name}"))
        time.sleep(0.3)
        probes = bad = host_hits = deferred = 0
        for _ in range(STEPS):
            for e in engines:
                traffic.step(e)
            wait_until_ingested(sub, index, engines)
            for _ in range(PROBES):
                tokens, salt = traffic.prompt()
                hits = index.hits(tokens, cache_salt=salt)
                for e in engines:
                    gpu, host = truth(e, tokens, salt)
                    if host is None:
                        deferred += 1
                        continue
                    probes += 1
                    host_hits += host > 0
                    got = hits[e.name]
                    bad += (got.gpu_tokens, got.host_tokens) != (gpu, host)
        print(
            f"{probes} probes, {host_hits} hit the CPU tier;",
            [e.cpu_events for e in engines],
            f"{traffic.preemptions()} preemptions",
        )
        assert bad == 0, f"{bad} of {probes} probes differ"
        assert deferred == 0
        assert probes == STEPS * PROBES * len(engines)
        assert host_hits > probes // 50, f"only {host_hits} of {probes} probes hit the CPU tier"
        # Every CPU tier filled up and evicted, and the GPU pools preempted.
        assert all(e.cpu_events.get("BlockRemoved", 0) > 0 for e in engines)
        assert traffic.preemptions() > 0
        assert_exact(index, engines)
        sub.stop()
    finally:
        for e in engines:
            e.sched.kv_event_publisher.shutdown()
