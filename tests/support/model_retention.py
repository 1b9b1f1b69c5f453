"""A plain-Python model of the retention rules of docs/retention.md (pins, priority classes,
TTL, session retention, tenant quotas, the caller's clock), written from the document alone,
independently of kvblocks' Rust code.

`RetentionPoolModel` extends the vLLM pool model (`model.PoolModel`), overriding only where
the rules differ (where a freed block goes, pins, the clock, eviction, reset): with no
policy its single free list is vLLM's free queue, and pins (which work with or without a
policy) only take blocks out of it and give them back. With a policy the free blocks sit in
the lists of the document, popped in the order `front`, `class 0`, ..., `class k-1`,
`session`.
Everything is plain lists and dicts and linear scans: this is a reference, not a fast path.

`RetentionManagerModel` is `model.ManagerModel` over that pool (one override: a request's
blocks are freed under its tags: class, session, tenant), pinning its full prompt blocks in
every group.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from model import GroupModel, Key, ManagerModel, PoolModel


@dataclass(frozen=True)
class PolicyModel:
    """The arguments of `kvblocks.RetentionPolicy`, and what the rules read from them."""

    classes: int = 1
    default_class: int = 0
    priority_classes: dict[int, int] = field(default_factory=dict)
    ttl_s: float | list[float | None] | None = None
    session_s: float | None = None
    tenant_quotas: dict[str, int] = field(default_factory=dict)
    default_tenant_quota: int | None = None

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the equivalent `kvblocks.RetentionPolicy`."""
        return {
            "classes": self.classes,
            "default_class": self.default_class,
            "priority_classes": dict(self.priority_classes),
            "ttl_s": list(self.ttl_s) if isinstance(self.ttl_s, list) else self.ttl_s,
            "session_s": self.session_s,
            "tenant_quotas": dict(self.tenant_quotas),
            "default_tenant_quota": self.default_tenant_quota,
        }

    def ttl(self, cls: int) -> float | None:
        return self.ttl_s[cls] if isinstance(self.ttl_s, list) else self.ttl_s

    def class_of(self, priority: int) -> int:
        return self.priority_classes.get(priority, self.default_class)

    def quota(self, tenant: str | None) -> int | None:
        if tenant is None:
            return None
        return self.tenant_quotas.get(tenant, self.default_tenant_quota)


@dataclass(frozen=True)
class Tags:
    """What a free carries: `BlockPool.free_blocks(priority_class=, session=, tenant=)`."""

    priority_class: int | None = None
    session: bool = False
    tenant: str | None = None


class RetentionPoolModel(PoolModel):
    """BlockPool with a retention policy (or none) and pins."""

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool = True,
        events: bool = False,
        policy: PolicyModel | None = None,
    ) -> None:
        self.policy = policy
        self.classes: list[list[int]] = []
        self.session: list[int] = []
        self.front: list[int] = []
        super().__init__(num_blocks, enable_caching, events)  # sets `queue`, i.e. `front`
        n = num_blocks
        self.now = 0.0
        self.pins: dict[Key, int] = {}
        self.pinned = [False] * n  # the block holds its pin's reference
        # What the last free that released a block to a free list said about it.
        self.cls_of = [0] * n
        self.freed_at = [0.0] * n
        self.idle_since = [0.0] * n
        self.tenant_of: list[str | None] = [None] * n
        self.freed_seq = [0] * n  # order of frees, for "least recently freed"
        self.seq = 0

    # --- the free lists ------------------------------------------------------------
    @property
    def queue(self) -> list[int]:
        """Every free block in the order `get_new_blocks` takes them."""
        out = list(self.front)
        for lst in self.classes:
            out += lst
        return out + self.session

    @queue.setter
    def queue(self, blocks: list[int]) -> None:
        self.front = list(blocks)
        k = 0 if self.policy is None else self.policy.classes
        self.classes = [[] for _ in range(k)]
        self.session = []

    def _lists(self) -> list[list[int]]:
        return [self.front, *self.classes, self.session]

    def _unlink(self, block: int) -> None:
        """Takes a free block out of whichever list holds it."""
        for lst in self._lists():
            if block in lst:
                lst.remove(block)
                self.tenant_of[block] = None
                return
        raise AssertionError(f"block {block} is not free")

    @property
    def num_pinned_blocks(self) -> int:
        return sum(self.pinned)

    def unheld_cached(self, tenant: str) -> list[int]:
        """The tenant's cached blocks that no request and no pin holds."""
        return [
            b
            for b in range(1, self.num_blocks)
            if self.ref_cnt[b] == 0 and self.hash_of[b] is not None and self.tenant_of[b] == tenant
        ]

    # --- where a block goes when its last reference drops ---------------------------
    def _park(self, block: int, tags: Tags) -> None:
        """A cached block whose last reference dropped under `tags`."""
        self.seq += 1
        self.freed_seq[block] = self.seq
        self.tenant_of[block] = tags.tenant
        policy = self.policy
        if policy is None:
            self.front.append(block)  # vLLM: the tail of the free queue
            return
        cls = policy.default_class if tags.priority_class is None else tags.priority_class
        self.cls_of[block] = cls
        if tags.session and policy.session_s is not None:
            self.freed_at[block] = self.now
            self.session.append(block)
        else:
            self.idle_since[block] = self.now
            self.classes[cls].append(block)

    def _enforce_quota(self, tenant: str | None) -> None:
        """Drops the tenant's least recently freed unheld blocks until it is at its quota."""
        if self.policy is None:
            return
        quota = self.policy.quota(tenant)
        if tenant is None or quota is None:
            return
        while len(mine := self.unheld_cached(tenant)) > quota:
            victim = min(mine, key=lambda b: self.freed_seq[b])
            self._unlink(victim)
            self._evict(victim)
            self.front.insert(0, victim)

    def _release(self, block: int) -> None:
        """A block whose last reference was a pin's: freed as an untagged request frees."""
        if self._is_cached(block):
            self._park(block, Tags())
        else:
            self.front.insert(0, block)

    def _sync_pin(self, block: int) -> None:
        """Gives the block its pin's reference iff it is cached under a pinned key."""
        key = self.hash_of[block]
        want = key is not None and self.pins.get(key, 0) > 0
        if want and not self.pinned[block]:
            if self.ref_cnt[block] == 0:
                self._unlink(block)
            self.pinned[block] = True
            self.ref_cnt[block] += 1
        elif self.pinned[block] and not want:
            self.pinned[block] = False
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                self._release(block)

    def _blocks_of(self, key: Key) -> list[int]:
        return list(self.map.get(key, []))

    # --- the pool's API ------------------------------------------------------------
    def free_blocks(self, blocks: list[int], tags: Tags | None = None) -> None:
        tags = tags or Tags()
        first: list[int] = []
        for b in self._drop_refs(blocks):
            if self._is_cached(b):
                self._park(b, tags)
            else:
                first.append(b)
        self.front[:0] = first  # vLLM: the uncached blocks of a free go to the head
        self._enforce_quota(tags.tenant)  # once the free is done: its victims go ahead

    def _on_cached(self, block: int) -> None:
        self._sync_pin(block)  # a pinned key takes the block that now carries it

    def evict_blocks(self, blocks: list[int]) -> None:
        for b in blocks:
            self._check(b)
        for b in blocks:
            if self.hash_of[b] is None:
                continue
            was_free = self.ref_cnt[b] == 0
            self._evict(b)
            if self.pinned[b]:
                self._sync_pin(b)  # no longer carries the key: the pin lets go of it
            elif was_free and self.policy is not None:
                self._unlink(b)
                self.front.insert(0, b)  # "front: blocks whose hash was dropped"

    def reset_prefix_cache(self) -> bool:
        if any(self.ref_cnt[b] - self.pinned[b] > 0 for b in range(1, self.num_blocks)):
            return False
        released = [b for b in range(1, self.num_blocks) if self.pinned[b]]
        for b in released:
            self.pinned[b] = False
            self.ref_cnt[b] = 0
        # Nothing is cached any more: one list, in the same order, and the blocks the pins
        # held after it, by block id.
        self.queue = self.queue + released
        self.tenant_of = [None] * self.num_blocks
        return super().reset_prefix_cache()

    # --- pins ------------------------------------------------------------------------
    def pin_keys(self, keys: Sequence[Key]) -> None:
        for key in keys:
            self.pins[key] = self.pins.get(key, 0) + 1
            for b in self._blocks_of(key):
                self._sync_pin(b)

    def unpin_keys(self, keys: Sequence[Key]) -> None:
        for key, n in Counter(keys).items():
            if self.pins.get(key, 0) < n:
                raise KeyError(key)
        for key in keys:
            self.pins[key] -= 1
            if self.pins[key] == 0:
                del self.pins[key]
                for b in self._blocks_of(key):
                    self._sync_pin(b)

    def pin(self, hashes: Sequence[bytes], group_ids: Sequence[int]) -> None:
        self.pin_keys([(h, g) for g in group_ids for h in hashes])

    def unpin(self, hashes: Sequence[bytes], group_ids: Sequence[int]) -> None:
        """Keys group by group, as given (the order in which released blocks are freed)."""
        self.unpin_keys([(h, g) for g in group_ids for h in hashes])

    # --- the clock -------------------------------------------------------------------
    def advance_time(self, now: float) -> None:
        if not now >= self.now:
            raise ValueError(f"time goes back: {now} < {self.now}")
        self.now = now
        policy = self.policy
        if policy is None:
            return
        # 1. Session windows that ended, in the order they were freed.
        window = policy.session_s
        if window is not None:
            while self.session and self.freed_at[self.session[0]] + window <= now:
                b = self.session.pop(0)
                self.idle_since[b] = self.freed_at[b] + window
                self.classes[self.cls_of[b]].append(b)
        # 2. Expired TTLs, class by class, from the heads.
        for cls, lst in enumerate(self.classes):
            ttl = policy.ttl(cls)
            if ttl is None:
                continue
            while lst and self.idle_since[lst[0]] + ttl <= now:
                self.front.append(lst.pop(0))


class RetentionManagerModel(ManagerModel):
    """ManagerModel over a RetentionPoolModel: a request's blocks are freed under its tags,
    in every group, sliding-window blocks that leave the window included."""

    def __init__(
        self,
        groups: list[GroupModel],
        num_blocks: int,
        max_model_len: int,
        hash_block_size: int,
        scheduler_block_size: int,
        enable_caching: bool = True,
        policy: PolicyModel | None = None,
    ) -> None:
        super().__init__(
            groups, num_blocks, max_model_len, hash_block_size, scheduler_block_size, enable_caching
        )
        self.pool: RetentionPoolModel = RetentionPoolModel(
            num_blocks, enable_caching, False, policy
        )
        self.policy = policy
        self.tags: dict[str, Tags] = {}

    def set_request(
        self, rid: str, priority: int, session_id: str | None, tenant: str | None
    ) -> None:
        """What the request carries (read by the manager when it first allocates)."""
        cls = None if self.policy is None else self.policy.class_of(priority)
        self.tags[rid] = Tags(cls, session_id is not None, tenant)

    def _free_blocks(self, rid: str, blocks: list[int]) -> None:
        self.pool.free_blocks(blocks, self.tags.get(rid))

    def prompt_keys(self, req: Any) -> list[Key]:
        """The keys of the request's full prompt blocks, in every group."""
        hashes = list(req.block_hashes)
        keys: list[Key] = []
        for gid, g in enumerate(self.groups):
            view = self._hashes(hashes, g.block_size)
            keys += [(h, gid) for h in view[: req.num_prompt_tokens // g.block_size]]
        return keys

    def hash_keys(self, hashes: list[bytes]) -> list[Key]:
        """The keys `pin_hashes` names: the full blocks of each group the hashes cover."""
        keys: list[Key] = []
        for gid, g in enumerate(self.groups):
            keys += [(h, gid) for h in self._hashes(hashes, g.block_size)]
        return keys

    def pin(self, req: Any) -> None:
        self.pool.pin_keys(self.prompt_keys(req))

    def unpin(self, req: Any) -> None:
        self.pool.unpin_keys(self.prompt_keys(req))
