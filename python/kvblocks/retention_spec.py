"""A retention policy for the prefix cache as one line of text: ``kvblocks simulate
--retention SPEC`` and ``KVBLOCKS_VLLM_RETENTION=SPEC`` for ``kvblocks.vllm``.

The rules are ``docs/retention.md``'s; this module only reads and writes the spec, and
leaves every check of the values to the core (``kvblocks.RetentionPolicy``)::

    SPEC  := "lru" | ITEM (SEP ITEM)*            SEP := "," | ";" | "+"
    ITEM  := "session=" SECONDS                  blocks of a session kept SECONDS after a turn
           | "ttl=" SECONDS                      one TTL for every class
           | "ttl=" CLASS ":" SECONDS ("," ...)  a TTL per class ("none": no TTL)
           | "classes=" K                        priority classes (class 0 evicted first)
           | "default-class=" CLASS              the class of a priority not mapped
           | "priority=" PRIO ":" CLASS ("," ...)  request priority -> class
           | "quota=" BLOCKS                     every tenant's quota (default_tenant_quota)
           | "quota=" TENANT ":" BLOCKS ("," ...)  per-tenant quotas (a bare BLOCKS among
                                                   them is the default quota)

A piece without ``=`` continues the list of the item before it (``quota=a:10,b:20``), so
``,`` both separates items and lists. ``classes`` defaults to one more than the highest
class named. ``lru`` (also ``none``) is vLLM's order: no policy.

In ``--sweep retention=V1,V2,...`` the commas separate the policies, a piece without ``=``
still continues the one before, and the items of one policy are joined with ``+`` (or
``;``): ``--sweep retention=lru,session=30,quota=burst:0,classes=2+priority=0:1``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["RetentionSpec", "SpecError", "parse_retention", "split_sweep"]

LRU_WORDS = ("lru", "none")
_KEYS = ("classes", "default-class", "priority", "ttl", "session", "quota")
_LIST_KEYS = ("priority", "ttl", "quota")


class SpecError(ValueError):
    """A retention spec that cannot be read (the message is one line)."""


@dataclass(frozen=True)
class RetentionSpec:
    """A parsed ``--retention`` spec; all defaults = ``lru`` (no policy).

    Attributes are ``kvblocks.RetentionPolicy.FIELDS``, in that order (a test checks it),
    with tuples for its lists and sorted item tuples for its dicts; ``ttl_s`` is None, one
    float for every class, or one entry per class.
    """

    classes: int = 1
    default_class: int = 0
    priority_classes: tuple[tuple[int, int], ...] = ()
    ttl_s: float | tuple[float | None, ...] | None = None
    session_s: float | None = None
    tenant_quotas: tuple[tuple[str, int], ...] = ()
    default_tenant_quota: int | None = None

    @property
    def is_lru(self) -> bool:
        """No policy: vLLM's LRU order."""
        return self == RetentionSpec()

    @property
    def spec(self) -> str:
        """The canonical spec text (``lru`` for no policy); parses back to ``self``."""
        if self.is_lru:
            return "lru"
        items = []
        if self.classes != 1:
            items.append(f"classes={self.classes}")
        if self.default_class:
            items.append(f"default-class={self.default_class}")
        if self.priority_classes:
            items.append("priority=" + ",".join(f"{p}:{c}" for p, c in self.priority_classes))
        if isinstance(self.ttl_s, tuple):
            ttl = [f"{c}:{_num(t)}" for c, t in enumerate(self.ttl_s) if t is not None]
            items.append("ttl=" + ",".join(ttl))
        elif self.ttl_s is not None:
            items.append(f"ttl={_num(self.ttl_s)}")
        if self.session_s is not None:
            items.append(f"session={_num(self.session_s)}")
        quotas = [f"{t}:{q}" for t, q in self.tenant_quotas]
        if self.default_tenant_quota is not None:
            quotas.insert(0, str(self.default_tenant_quota))
        if quotas:
            items.append("quota=" + ",".join(quotas))
        return ";".join(items)

    @classmethod
    def from_policy(cls, policy: Any) -> RetentionSpec:
        """The spec of a ``kvblocks.RetentionPolicy``: ``from_policy(p).build() == p``.

        Raises:
            SpecError: The policy has no spec that builds it back identically.
        """
        spec = cls(**{f.name: _spec_value(getattr(policy, f.name)) for f in fields(cls)})
        text = spec.spec
        if parse_retention(text).build() != policy:
            raise SpecError(f"no retention spec builds {policy!r} back identically ({text!r})")
        return spec

    def policy_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``kvblocks.RetentionPolicy``."""
        return {f.name: _policy_value(getattr(self, f.name)) for f in fields(self)}

    def as_json(self) -> dict[str, Any]:
        """``{"spec": str, "policy": {...} | null}`` (``runs[i].retention`` in the JSON)."""
        if self.is_lru:
            return {"spec": "lru", "policy": None}
        kw = self.policy_kwargs()
        kw["priority_classes"] = {str(p): c for p, c in self.priority_classes}
        return {"spec": self.spec, "policy": kw}

    def build(self) -> Any:
        """A ``kvblocks.RetentionPolicy``, or None for ``lru``.

        Raises:
            SpecError: The core rejects the policy.
        """
        if self.is_lru:
            return None
        import kvblocks

        try:
            return kvblocks.RetentionPolicy(**self.policy_kwargs())
        except (ValueError, TypeError) as e:
            raise SpecError(f"retention {self.spec!r}: {e}") from None


def _policy_value(value: Any) -> Any:
    """A spec attribute as ``kvblocks.RetentionPolicy`` takes it: item tuples as a dict,
    other tuples as a list."""
    if isinstance(value, tuple):
        return dict(value) if all(isinstance(v, tuple) for v in value) else list(value)
    return value


def _spec_value(value: Any) -> Any:
    """A ``kvblocks.RetentionPolicy`` attribute as a spec holds it: a dict as its sorted
    items, a list as a tuple (None if it holds no value: ``ttl_s`` without a TTL)."""
    if isinstance(value, dict):
        return tuple(sorted(value.items()))
    if isinstance(value, list):
        return tuple(value) if any(v is not None for v in value) else None
    return value


def _num(x: float) -> str:
    """Short when that is exact (``30``), else every digit (``0.1234567``)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))


def _seconds(key: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise SpecError(f"{key}: expected seconds, got {text!r}") from None


def _int(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise SpecError(f"{key}: expected an integer, got {text!r}") from None


def _pair(key: str, text: str) -> tuple[str, str]:
    name, sep, value = text.rpartition(":")
    if not sep or not name.strip() or not value.strip():
        raise SpecError(f"{key}: expected NAME:VALUE, got {text!r}")
    return name.strip(), value.strip()


def parse_retention(text: str) -> RetentionSpec:
    """Reads a ``--retention`` spec (grammar in the module docs); the core checks the
    values (``RetentionSpec.build``).

    Raises:
        SpecError: A one-line message naming the bad piece, or the core's refusal.
    """
    items: list[tuple[str, list[str]]] = []
    for raw in re.split(r"[,;+]", text):
        piece = raw.strip()
        if not piece:
            raise SpecError(f"empty item in {text!r}")
        if "=" in piece:
            key, _, value = piece.partition("=")
            key = key.strip().lower().replace("_", "-")
            if key not in _KEYS:
                raise SpecError(
                    f"unknown key {key!r} in {text!r} (keys: {', '.join(_KEYS)}; or lru)"
                )
            if any(k == key for k, _ in items):
                raise SpecError(f"{key} given twice in {text!r}")
            items.append((key, [value.strip()]))
        elif piece.lower() in LRU_WORDS:
            items.append(("lru", []))
        elif items and items[-1][0] in _LIST_KEYS:
            items[-1][1].append(piece)
        else:
            raise SpecError(f"expected KEY=VALUE or lru, got {piece!r} in {text!r}")
    if any(k == "lru" for k, _ in items):
        if len(items) > 1:
            raise SpecError(f"lru (no policy) takes no other items: {text!r}")
        return RetentionSpec()
    got = dict(items)
    classes: int | None = None
    if "classes" in got:
        classes = _int("classes", got["classes"][0])
    default_class = _int("default-class", got["default-class"][0]) if "default-class" in got else 0
    named = [default_class]
    prio: dict[int, int] = {}
    for entry in got.get("priority", []):
        p, c = _pair("priority", entry)
        pv = _int("priority", p)
        if pv in prio:
            raise SpecError(f"priority: {pv} mapped twice")
        prio[pv] = _int("priority", c)
        named.append(prio[pv])
    ttl_one: float | None = None
    ttl_per: dict[int, float | None] = {}
    for entry in got.get("ttl", []):
        if ":" not in entry:
            if ttl_one is not None or ttl_per or len(got["ttl"]) > 1:
                raise SpecError(
                    f"ttl: one SECONDS for every class, or CLASS:SECONDS items: {entry!r}"
                )
            ttl_one = _seconds("ttl", entry)
            continue
        c, t = _pair("ttl", entry)
        cv = _int("ttl", c)
        if cv in ttl_per:
            raise SpecError(f"ttl: class {cv} given twice")
        ttl_per[cv] = None if t.lower() == "none" else _seconds("ttl", t)
        named.append(cv)
    named_classes = 1 + max(named)
    if classes is None:
        classes = named_classes
    ttl: float | tuple[float | None, ...] | None = ttl_one
    if any(t is not None for t in ttl_per.values()):
        ttl = tuple(ttl_per.get(c) for c in range(max(classes, named_classes)))
    session = _seconds("session", got["session"][0]) if "session" in got else None
    quotas: dict[str, int] = {}
    default_quota: int | None = None
    for entry in got.get("quota", []):
        if ":" not in entry:
            if default_quota is not None:
                raise SpecError(f"quota: two default quotas in {text!r}")
            default_quota = _int("quota", entry)
            continue
        t, q = _pair("quota", entry)
        if t in quotas:
            raise SpecError(f"quota: tenant {t!r} given twice")
        quotas[t] = _int("quota", q)
    spec = RetentionSpec(
        classes,
        default_class,
        tuple(sorted(prio.items())),
        ttl,
        session,
        tuple(sorted(quotas.items())),
        default_quota,
    )
    spec.build()
    return spec


def split_sweep(text: str) -> list[str]:
    """The policies of ``--sweep retention=...``: split at commas, a piece without ``=``
    (other than ``lru``) continuing the policy before it."""
    out: list[str] = []
    for raw in text.split(","):
        piece = raw.strip()
        if out and piece and "=" not in piece and piece.lower() not in LRU_WORDS:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out
