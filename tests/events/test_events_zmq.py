"""End to end over loopback: ZmqEventPublisher -> subscribers written like vLLM's example
subscriber (SUB for batches, a replay socket for gaps), plus a late subscriber that
rebuilds its index from a snapshot. Every wait is bounded; nothing listens beyond
127.0.0.1."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import kvblocks
import pytest
from event_fixtures import AllBlocksCleared, BlockRemoved, BlockStored, event, steps

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")
from kvblocks.events import END_SEQ, ZmqEventPublisher  # noqa: E402

TOPIC = "kv@pod-0@model"
DEADLINE_S = 10.0


class Subscriber:
    """Tracks the last sequence number, replays gaps, keeps a counted (hash, group) index."""

    def __init__(self, ctx: Any, pub: ZmqEventPublisher) -> None:
        self.sub = ctx.socket(zmq.SUB)
        self.sub.connect(pub.endpoint)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        self.replay = ctx.socket(zmq.DEALER)
        assert pub.replay_endpoint is not None
        self.replay.connect(pub.replay_endpoint)
        self.last_seq = -1
        self.seqs: list[int] = []
        self.payloads: list[bytes] = []
        self.replayed: list[int] = []
        self.index: Counter[tuple[int, int]] = Counter()

    def close(self) -> None:
        self.sub.close(linger=0)
        self.replay.close(linger=0)

    def apply(self, seq: int, payload: bytes) -> None:
        self.seqs.append(seq)
        self.payloads.append(payload)
        self.last_seq = seq
        _ts, events, _rank = msgpack.unpackb(payload)
        for e in events:
            if e["type"] == "BlockStored":
                for h in e["block_hashes"]:
                    self.index[(h, e["group_idx"])] += 1
            elif e["type"] == "BlockRemoved":
                for h in e["block_hashes"]:
                    key = (h, e["group_idx"])
                    self.index[key] -= 1
                    if self.index[key] <= 0:
                        del self.index[key]
            else:
                self.index.clear()

    def fill_gap(self, upto: int) -> None:
        """Asks the replay socket for everything after last_seq, applies up to `upto`."""
        self.replay.send_multipart((b"", (self.last_seq + 1).to_bytes(8, "big")))
        while self.replay.poll(int(DEADLINE_S * 1000)):
            _, _topic, seq_bytes, payload = self.replay.recv_multipart()
            if seq_bytes == END_SEQ:
                return
            seq = int.from_bytes(seq_bytes, "big")
            if self.last_seq < seq < upto:
                self.replayed.append(seq)
                self.apply(seq, payload)
        raise AssertionError("replay did not end")

    def receive(self, lose: set[int], until: int) -> None:
        """Receives until seq `until` was applied, pretending the seqs in `lose` were lost."""
        deadline = time.monotonic() + DEADLINE_S
        while self.last_seq < until:
            assert time.monotonic() < deadline, f"stuck after seq {self.last_seq}"
            if not self.sub.poll(50):
                continue
            topic, seq_bytes, payload = self.sub.recv_multipart()
            assert topic == TOPIC.encode()
            seq = int.from_bytes(seq_bytes, "big")
            if seq in lose:
                lose.discard(seq)
                continue
            if seq > self.last_seq + 1:
                self.fill_gap(seq)
            if seq > self.last_seq:
                self.apply(seq, payload)


def _publisher(**kw: Any) -> ZmqEventPublisher:
    return ZmqEventPublisher(
        endpoint="tcp://127.0.0.1:0",
        replay_endpoint="tcp://127.0.0.1:0",
        topic=TOPIC,
        bind=True,
        **kw,
    )


def _drain(pub: ZmqEventPublisher) -> None:
    """Waits until every queued batch was published."""
    deadline = time.monotonic() + DEADLINE_S
    while pub.stats()["published_batches"] < pub.stats()["pushed_batches"]:
        assert time.monotonic() < deadline, "publisher did not drain"
        time.sleep(0.01)


def _receive_snapshot(pub: ZmqEventPublisher, sub: Subscriber) -> None:
    """Requests snapshots until one arrives (the subscription takes a moment to reach the
    PUB socket; snapshots are idempotent). `sub` must have connected after the last batch
    was published, so that the first message it receives is a snapshot."""
    _drain(pub)
    deadline = time.monotonic() + DEADLINE_S
    while not sub.seqs:
        assert time.monotonic() < deadline, "no snapshot received"
        pub.publish_snapshot()
        if sub.sub.poll(200):
            _, seq_bytes, payload = sub.sub.recv_multipart()
            sub.apply(int.from_bytes(seq_bytes, "big"), payload)


def _wait_until_subscribed(pub: ZmqEventPublisher, sub: Subscriber) -> None:
    """PUB drops messages until the subscription arrives: send probes (empty batches are
    not queued, so probe with a clear on an empty cache) until one is seen."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        pub.publish_events([AllBlocksCleared()], ts=0.0)
        if sub.sub.poll(100):
            _, seq_bytes, payload = sub.sub.recv_multipart()
            sub.apply(int.from_bytes(seq_bytes, "big"), payload)
            return
    raise AssertionError("subscription never became active")


def test_in_order_delivery_gap_replay_and_late_snapshot() -> None:
    ctx = zmq.Context()
    pub = _publisher(data_parallel_rank=0)
    early = Subscriber(ctx, pub)
    late: Subscriber | None = None
    try:
        _wait_until_subscribed(pub, early)
        first = pub.stats()["pushed_batches"]  # the next batch's seq (no drops, no snapshots)
        trace = steps()
        for step in trace:
            pub.publish_events([event(e) for e in step["events"]], ts=step["ts"])
        last = first + len(trace) - 1
        early.receive(lose={first + 2, first + 3}, until=last)

        # every batch, in order, with the bytes vLLM's encoder gives (rank 0 filled in)
        assert early.seqs == list(range(early.seqs[0], last + 1))
        assert early.replayed == [first + 2, first + 3]
        want = [
            kvblocks.encode_event_batch(s["ts"], [event(e) for e in s["events"]], 0) for s in trace
        ]
        assert early.payloads[-len(trace) :] == want

        # a late subscriber rebuilds the index from a snapshot (repeated until it is
        # subscribed; snapshots are idempotent)
        late = Subscriber(ctx, pub)
        _receive_snapshot(pub, late)
        _, events, _ = msgpack.unpackb(late.payloads[0])
        assert events[0] == {"type": "AllBlocksCleared"}
        assert len(events) > 1 and {e["type"] for e in events[1:]} == {"BlockStored"}
        assert set(late.index) == set(early.index) == pub.sink.cached_keys()
        assert set(late.index) == _oracle_final_keys(trace)
        assert pub.stats()["dropped_batches"] == 0
    finally:
        pub.shutdown()
        early.close()
        if late is not None:
            late.close()
        ctx.term()


def _oracle_final_keys(steps: list[dict[str, Any]]) -> set[tuple[int, int]]:
    """The cached (hash, group) set at the end of vLLM's event stream."""
    held: Counter[tuple[int, int]] = Counter()
    for step in steps:
        for e in step["events"]:
            if e["type"] == "AllBlocksCleared":
                held.clear()
            for h in e.get("block_hashes", []):
                key = (h, e["group_idx"])
                held[key] += 1 if e["type"] == "BlockStored" else -1
    return {k for k, n in held.items() if n > 0}


def test_replay_serves_only_the_last_buffersteps() -> None:
    ctx = zmq.Context()
    pub = _publisher(buffer_steps=3)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(pub.replay_endpoint)
    try:
        for i in range(6):
            pub.publish_events([BlockRemoved([i], "GPU", 0)], ts=float(i))
        deadline = time.monotonic() + DEADLINE_S
        while pub.stats()["published_batches"] < 6:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        dealer.send_multipart((b"", (0).to_bytes(8, "big")))
        got = []
        while dealer.poll(int(DEADLINE_S * 1000)):
            _, topic, seq, payload = dealer.recv_multipart()
            if seq == END_SEQ:
                assert (topic, payload) == (b"", b"")
                break
            assert topic == TOPIC.encode()
            got.append(int.from_bytes(seq, "big"))
        assert got == [3, 4, 5]
    finally:
        pub.shutdown()
        dealer.close(linger=0)
        ctx.term()


def test_full_queue_drops_oldest_and_snapshot_waits_for_a_clear() -> None:
    sink = kvblocks.EventSink(max_queue_size=2)
    stored = BlockStored([1, 2], None, [1, 2, 3, 4], 2, None, "GPU", None, [None, None], 0)
    assert sink.publish([stored])
    assert sink.publish([BlockRemoved([2], "GPU", 0)])
    assert not sink.publish([BlockRemoved([1], "GPU", 0)])  # drops the BlockStored batch
    stats = sink.stats()
    assert (stats["dropped_batches"], stats["dropped_events"]) == (1, 1)
    while sink.next_payload(0.0) is not None:
        pass
    assert sink.stale
    sink.request_snapshot()
    assert sink.next_payload(0.0) is None
    assert sink.stats()["snapshots_refused"] == 1
    sink.publish([AllBlocksCleared(), stored])
    sink.next_payload(0.0)
    assert not sink.stale
    sink.request_snapshot()
    item = sink.next_payload(0.0)
    assert item is not None
    _, events, rank = msgpack.unpackb(item[1])
    assert rank == 0
    assert events[0] == {"type": "AllBlocksCleared"}
    assert [(e["block_hashes"], e["parent_block_hash"], e["token_ids"]) for e in events[1:]] == [
        ([1], None, [1, 2]),
        ([2], 1, [3, 4]),
    ]


def test_shutdown_publishes_queued_batches_and_rejects_more() -> None:
    pub = _publisher()
    for i in range(50):
        pub.publish_events([BlockRemoved([i], "GPU", 0)])
    pub.shutdown()
    assert pub.stats()["published_batches"] == 50
    with pytest.raises(RuntimeError):
        pub.publish_events([AllBlocksCleared()])


def test_pool_traffic_late_subscriber_matches_the_pool() -> None:
    """BlockPool traffic (shared prefixes, evictions) published with publish_from: a late
    subscriber's index, rebuilt from a snapshot and the batches after it, equals the
    pool's cached (hash, group) set."""
    import random

    rng = random.Random(5)
    bs = 4
    pool = kvblocks.BlockPool(40, True, bs, True)
    group_of: dict[int, int] = {}
    live: list[list[int]] = []
    ctx = zmq.Context()
    pub = _publisher()
    late: Subscriber | None = None

    def traffic(steps: int) -> None:
        for _ in range(steps):
            n = rng.randint(1, 5)
            if live and rng.random() < 0.4:
                pool.free_blocks(list(reversed(live.pop(rng.randrange(len(live))))))
            while pool.get_num_free_blocks() < n:
                pool.free_blocks(list(reversed(live.pop(0))))
            prefix = rng.randrange(4)
            tokens = [prefix * 1000 + t for t in range(n * bs)]
            hashes, parent = [], None
            for i in range(n):
                parent = kvblocks.hash_block_tokens("sha256", parent, tokens[i * bs : (i + 1) * bs])
                hashes.append(parent)
            ids = pool.get_new_blocks(n)
            group = rng.randrange(2)
            pool.cache_full_blocks(hashes, ids, 0, n, bs, group, tokens)
            group_of.update(dict.fromkeys(ids, group))
            live.append(ids)
            pub.publish_from(pool)

    def pool_keys() -> set[tuple[int, int]]:
        out = set()
        for b in range(1, 40):
            h = pool.get_block_hash(b)
            if h is not None:
                out.add((int.from_bytes(h[-8:], "big"), group_of[b]))
        return out

    try:
        traffic(30)
        _drain(pub)
        late = Subscriber(ctx, pub)
        _receive_snapshot(pub, late)
        traffic(30)
        last = pub.stats()["pushed_batches"] + pub.stats()["snapshots"] - 1
        late.receive(lose=set(), until=last)
        assert pub.stats()["removed_blocks"] > 0  # evictions happened
        assert pool_keys() and set(late.index) == pool_keys() == pub.sink.cached_keys()
    finally:
        pub.shutdown()
        if late is not None:
            late.close()
        ctx.term()


def test_manager_late_subscriber_matches_the_manager() -> None:
    """KVCacheManager traffic (shared prefixes, evictions, a reset) published each step with
    publish_from: a late subscriber's snapshot equals the manager's cached-hash set."""
    import random

    rng = random.Random(11)
    spec = kvblocks.FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
    config = kvblocks.KVCacheConfig(24, [], [kvblocks.KVCacheGroupSpec(["l0"], spec)])
    mgr = kvblocks.KVCacheManager(config, 256, 4, enable_kv_cache_events=True)
    hasher = kvblocks.BlockHasher(4, "sha256")
    prefixes = [list(range(100, 140)), list(range(300, 320)), [7] * 30]
    ctx = zmq.Context()
    pub = _publisher()
    late: Subscriber | None = None

    def traffic(steps: int, start: int) -> None:
        for i in range(start, start + steps):
            tokens = rng.choice(prefixes)[: rng.randint(5, 30)] + [900 + i] * rng.randint(0, 6)
            req = kvblocks.Request(f"r{i}", tokens, hasher)
            blocks, hit = mgr.get_computed_blocks(req)
            if mgr.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None:
                mgr.free(req)
            if i == start + 5 and start == 0:
                assert mgr.reset_prefix_cache()
            pub.publish_from(mgr)

    def manager_keys() -> set[tuple[int, int]]:
        view = mgr.block_pool
        hashes = (view.get_block_hash(b) for b in range(view.num_gpu_blocks))
        return {(int.from_bytes(h[-8:], "big"), 0) for h in hashes if h is not None}

    try:
        traffic(40, 0)
        _drain(pub)
        late = Subscriber(ctx, pub)
        _receive_snapshot(pub, late)
        assert set(late.index) == manager_keys()
        traffic(20, 40)
        late.receive(lose=set(), until=pub.stats()["pushed_batches"] + pub.stats()["snapshots"] - 1)
        stats = pub.stats()
        assert stats["removed_blocks"] > 0 and stats["cleared"] == 1
        assert manager_keys() and set(late.index) == manager_keys()
    finally:
        pub.shutdown()
        if late is not None:
            late.close()
        ctx.term()
