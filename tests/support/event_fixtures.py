"""Shared by the event tests: stand-ins for vLLM's event classes and the oracle fixtures
(tests/data/events_*, written by tools/gen_event_fixtures.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from paths import DATA


# Stand-ins with vLLM's class names and fields: the encoder reads events by attribute.
@dataclass
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


@dataclass
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


@dataclass
class AllBlocksCleared:
    pass


def from_json(value: Any) -> Any:
    if isinstance(value, dict):
        return bytes.fromhex(value["bytes"])
    if isinstance(value, list):
        return tuple(from_json(v) for v in value)
    return value


def event(d: dict[str, Any], classes: Any = None) -> object:
    """The event of a fixture record, built with `classes` (a namespace with BlockStored,
    BlockRemoved, AllBlocksCleared; the stand-ins here by default)."""
    fields = {k: v for k, v in d.items() if k != "type"}
    if d["type"] == "BlockStored" and fields["extra_keys"] is not None:
        fields["extra_keys"] = [
            None if keys is None else from_json(keys) for keys in fields["extra_keys"]
        ]
    cls = getattr(classes, d["type"]) if classes is not None else globals()[d["type"]]
    return cls(**fields)


def payloads(name: str) -> list[bytes]:
    blob = (DATA / f"events_{name}.bin").read_bytes()
    out = []
    while blob:
        n = int.from_bytes(blob[:4], "big")
        out.append(blob[4 : 4 + n])
        blob = blob[4 + n :]
    return out


def steps() -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = json.loads((DATA / "events_trace.json").read_text())["steps"]
    return steps
