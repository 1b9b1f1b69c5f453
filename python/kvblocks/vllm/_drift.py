"""The drift guard: `install()` checks, once per process and before it replaces anything,
that the installed vLLM is one kvblocks supports and still has the shape kvblocks was built
for.

What it checks, each against the declaration the code itself uses:

- the version, against `_versions.SUPPORTED`;
- the callables `install()` swaps (`_install._TARGETS`): every call vLLM's own admits must
  bind the same way on kvblocks' replacement (`KVCacheManager.__init__` against kvblocks'
  manager, `get_request_block_hasher` against kvblocks');
- the public methods and properties of vLLM's `KVCacheManager` and `KVCacheBlocks`, and
  those of vLLM's `KVCacheCoordinator` and `BlockPool` that kvblocks' views of them have,
  which the scheduler calls on kvblocks' objects, by the same rule;
- the attributes and `RequestStatus` values the Rust request view and hasher read
  (`kvblocks._core.VLLM_ATTRIBUTES_READ`, `VLLM_REQUEST_STATUSES`), on a real `Request`;
- the fields of vLLM's spec and config classes that `_config.py` reads (`SPECS`,
  `CONFIG_FIELDS`);
- vLLM's event classes that kvblocks' events become (`_manager._to_vllm_events`), the
  stats class it fills, and the other vLLM names kvblocks calls.

A mismatch is an `UnsupportedVLLMError` naming the installed version and the first
mismatch; `install(fallback=True)` then leaves vLLM as it is.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import kvblocks as kb
from kvblocks import _core


class UnsupportedVLLMError(kb.UnsupportedError):
    """The installed vLLM is outside the supported range, or differs from what kvblocks
    was built for in something kvblocks replaces or reads (a `kvblocks.UnsupportedError`,
    so also a `NotImplementedError`). The message names the version and the first
    mismatch."""


#: Where each vLLM class named in `kvblocks._core.VLLM_ATTRIBUTES_READ` lives.
CLASS_MODULES = {
    "Request": "vllm.v1.request",
    "LoRARequest": "vllm.lora.request",
    "MultiModalFeatureSpec": "vllm.multimodal.inputs",
    "PlaceholderRange": "vllm.multimodal.inputs",
}

#: vLLM's classes whose methods its scheduler calls on the objects kvblocks hands it:
#: vLLM's module and class, kvblocks' module and class, and whether kvblocks' stands in
#: for every public method and property (True) or is a view of the ones vLLM's callers
#: use, checked where it has them (False).
_STAND_INS = (
    (
        "vllm.v1.core.kv_cache_manager",
        "KVCacheManager",
        "kvblocks.vllm._manager",
        "KVCacheManager",
        True,
    ),
    ("vllm.v1.core.kv_cache_manager", "KVCacheBlocks", "kvblocks", "KVCacheBlocks", True),
    (
        "vllm.v1.core.kv_cache_coordinator",
        "KVCacheCoordinator",
        "kvblocks.vllm._manager",
        "CoordinatorView",
        False,
    ),
    ("vllm.v1.core.block_pool", "BlockPool", "kvblocks.vllm._manager", "BlockPool", False),
)

#: kvblocks' event classes, each turned into vLLM's class of the same name in
#: `vllm.distributed.kv_events` (`_manager._to_vllm_events`).
_EVENTS = (kb.BlockStored, kb.BlockRemoved, kb.AllBlocksCleared)


def check() -> None:
    """Checks the installed vLLM (imports it); the result is kept for the process.

    Raises:
        UnsupportedVLLMError: naming the installed version and the first mismatch.
    """
    problem = mismatch()
    if problem is not None:
        raise UnsupportedVLLMError(problem)


@functools.cache
def mismatch() -> str | None:
    """The first way the installed vLLM differs from what kvblocks supports, as a
    sentence naming its version, or None. Computed once per process
    (`mismatch.cache_clear()` forgets it)."""
    from kvblocks.vllm._versions import SUPPORTED, parse_version, supported_range

    version = str(importlib.import_module("vllm").__version__)
    try:
        major, minor, _ = parse_version(version)
    except ValueError:
        return f"vLLM {version!r} has a version kvblocks cannot read"
    if (major, minor) not in SUPPORTED:
        return f"vLLM {version} is outside the supported range {supported_range()}"
    problem = next(_problems(), None)
    return None if problem is None else f"vLLM {version}: {problem}"


def _problems() -> Iterator[str]:
    """Every mismatch, lazily, in the order checked."""
    yield from _swapped()
    yield from _stand_ins()
    yield from _request()
    yield from _config_classes()
    yield from _events()
    yield from _other_names()


def _swapped() -> Iterator[str]:
    """vLLM's callables that `install()` replaces, against kvblocks' replacements."""
    from kvblocks.vllm import _hashing, _manager
    from kvblocks.vllm._install import _TARGETS, vllm_original

    ours: dict[str, tuple[Callable[..., Any], str]] = {
        "KVCacheManager": (_manager.KVCacheManager.__new__, "kvblocks' KVCacheManager"),
        "get_request_block_hasher": (
            _hashing.get_request_block_hasher,
            "kvblocks' get_request_block_hasher",
        ),
    }
    for module, name in _TARGETS:
        theirs = vllm_original(module, name)
        replacement, what = ours[name]
        if inspect.isclass(theirs):
            problem = _incompatible(theirs.__init__, replacement, what, method=True)
            label = f"{module}.{name}.__init__"
        else:
            problem = _incompatible(theirs, replacement, what, method=False)
            label = f"{module}.{name}"
        if problem is not None:
            yield f"{label} {problem}"


def _stand_ins() -> Iterator[str]:
    """vLLM's classes whose methods the scheduler calls on kvblocks' objects."""
    for module, name, our_module, our_name, whole in _STAND_INS:
        theirs = getattr(importlib.import_module(module), name)
        ours = getattr(importlib.import_module(our_module), our_name)
        # Their own attributes and their bases', the nearest last, as lookup finds them.
        found = {a: v for c in reversed(theirs.__mro__[:-1]) for a, v in vars(c).items()}
        for attr, value in found.items():
            if attr.startswith("_"):
                continue
            label = f"{name}.{attr}"
            if not hasattr(ours, attr):
                if whole:
                    yield f"{label} has no counterpart in kvblocks' {our_name}"
            elif inspect.isfunction(value):
                what = f"kvblocks' {our_name}.{attr}"
                problem = _incompatible(value, getattr(ours, attr), what, method=True)
                if problem is not None:
                    yield f"{label} {problem}"


def _request() -> Iterator[str]:
    """The attributes and status values the Rust view and hasher read."""
    for class_name, attributes in _core.VLLM_ATTRIBUTES_READ:
        cls = getattr(importlib.import_module(CLASS_MODULES[class_name]), class_name)
        if class_name == "Request":
            # Request sets its attributes in __init__: look at one. Any failure to build
            # one is itself the mismatch to report.
            try:
                obj: Any = _sample_request(cls)
            except Exception as e:
                yield f"cannot build a Request to check the attributes kvblocks reads ({e!r})"
                return
        else:
            obj = cls
        for attribute in attributes:
            if not _has_field(obj, attribute):
                yield f"{class_name} has no attribute {attribute!r} (kvblocks reads it)"
    status = importlib.import_module("vllm.v1.request").RequestStatus
    for member, value in _core.VLLM_REQUEST_STATUSES:
        theirs = status.__members__.get(member)
        if theirs is None:
            yield f"RequestStatus has no member {member} (kvblocks compares with it)"
        elif int(theirs) != value:
            yield f"RequestStatus.{member} is {int(theirs)}, kvblocks compares with {value}"


def _sample_request(cls: type) -> Any:
    """A vLLM `Request` built as cheaply as vLLM allows (no hashing, one token)."""
    sampling_params = importlib.import_module("vllm.sampling_params").SamplingParams
    return cls(
        request_id="kvblocks-drift-guard",
        prompt_token_ids=[0],
        sampling_params=sampling_params(max_tokens=1),
        pooling_params=None,
    )


def _config_classes() -> Iterator[str]:
    """The fields `_config.py` reads of vLLM's spec and config classes."""
    from kvblocks.vllm._config import CONFIG_FIELDS, SPECS

    interface = importlib.import_module("vllm.v1.kv_cache_interface")
    declared = {**{name: fields for name, (_, fields) in SPECS.items()}, **CONFIG_FIELDS}
    for name, fields in declared.items():
        cls = getattr(interface, name, None)
        if cls is None:
            yield f"vllm.v1.kv_cache_interface has no {name} (kvblocks converts it)"
            continue
        for field in fields:
            if not _has_field(cls, field):
                yield f"{name} has no field {field!r} (kvblocks reads it)"


def _events() -> Iterator[str]:
    """vLLM's event classes: each must exist, and take no required field kvblocks lacks."""
    kv_events = importlib.import_module("vllm.distributed.kv_events")
    for ours in _EVENTS:
        name = ours.__name__
        theirs = getattr(kv_events, name, None)
        if theirs is None:
            yield f"vllm.distributed.kv_events has no {name} (kvblocks builds it)"
            continue
        fields = tuple(theirs.__struct_fields__)
        required = fields[: len(fields) - len(theirs.__struct_defaults__)]
        for field in required:
            if field not in ours.__struct_fields__:
                yield f"kv_events.{name} requires {field!r}, which kvblocks' events lack"


def _other_names() -> Iterator[str]:
    """The other vLLM names kvblocks calls or fills."""
    from kvblocks.vllm._hashing import ALGORITHMS

    hashing = importlib.import_module("vllm.utils.hashing")
    for algorithm in ALGORITHMS:
        if not callable(getattr(hashing, algorithm, None)):
            yield f"vllm.utils.hashing has no {algorithm} (kvblocks hashes with it)"
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    if not callable(getattr(utils, "init_none_hash", None)):
        yield "kv_cache_utils has no init_none_hash (kvblocks reads the NONE_HASH it sets)"
    coordinators = importlib.import_module("vllm.v1.core.kv_cache_coordinator")
    for name in (
        "KVCacheCoordinatorNoPrefixCache",
        "UnitaryKVCacheCoordinator",
        "HybridKVCacheCoordinator",
    ):
        if not callable(getattr(getattr(coordinators, name, None), "register", None)):
            yield f"kv_cache_coordinator.{name} is not an ABC (kvblocks registers its view)"
    registry = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
    get_manager_class = getattr(
        getattr(registry, "KVCacheSpecRegistry", None), "get_manager_class", None
    )
    if get_manager_class is None or not _binds(get_manager_class, None, None):
        yield "KVCacheSpecRegistry.get_manager_class(spec, role) is gone (kvblocks calls it)"
    tensor_data = getattr(importlib.import_module("vllm.v1.utils"), "tensor_data", None)
    if tensor_data is None or not _binds(tensor_data, None):
        yield "vllm.v1.utils.tensor_data(tensor) is gone (kvblocks hashes embeddings with it)"
    stats = importlib.import_module("vllm.v1.metrics.stats").PrefixCacheStats
    for field in _stat_fields():
        if not _has_field(stats, field):
            yield f"PrefixCacheStats has no field {field!r} (kvblocks fills it)"


def _stat_fields() -> list[str]:
    """The counters of kvblocks' `PrefixCacheStats`, which the manager copies into vLLM's
    by the same names."""
    return [
        n
        for n in dir(kb.PrefixCacheStats)
        if not n.startswith("_") and not callable(getattr(kb.PrefixCacheStats, n))
    ]


def _has_field(obj: Any, name: str) -> bool:
    """Whether `obj` (a class or an instance) has `name`: a dataclass or msgspec field,
    or any attribute (a property, a class attribute, an instance attribute)."""
    if dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
        return True
    return name in getattr(obj, "__struct_fields__", ()) or hasattr(obj, name)


def _binds(fn: Callable[..., Any], *args: Any) -> bool:
    """Whether `fn` can be called with `len(args)` positional arguments."""
    try:
        inspect.signature(fn).bind(*args)
    except (TypeError, ValueError):
        return False
    return True


def _incompatible(
    theirs: Callable[..., Any], ours: Callable[..., Any], what: str, method: bool
) -> str | None:
    """Why a call to vLLM's `theirs`, as vLLM's callers make them, might not bind the
    same way on `ours`, or None when every such call does.

    vLLM's callers pass the required arguments by position and the optional ones by
    keyword (0.32 inserts none of 0.33's optional parameters at the same place). So: each
    required positional parameter of theirs has one of ours at the same position, with
    the same name; each of their parameters that can be passed by keyword is one of
    ours; and each of ours that vLLM's callers cannot know has a default.

    Args:
        theirs: vLLM's callable.
        ours: kvblocks' stand-in for it.
        what: how a message names `ours`.
        method: skip the first parameter (self / cls) of each.
    """
    p = inspect.Parameter
    try:
        t_params = list(inspect.signature(theirs).parameters.values())
        o_params = list(inspect.signature(ours).parameters.values())
    except ValueError as e:
        return f"has a signature kvblocks cannot read ({e})"
    if method:
        t_params, o_params = t_params[1:], o_params[1:]
    positional = (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    keyword = (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    o_positional = [q for q in o_params if q.kind in positional]
    o_keyword = {q.name for q in o_params if q.kind in keyword}
    o_kinds = {q.kind for q in o_params}
    t_names = {q.name for q in t_params}
    for i, q in enumerate(x for x in t_params if x.kind in positional):
        if q.default is not p.empty:
            break
        if i >= len(o_positional):
            if p.VAR_POSITIONAL not in o_kinds:
                return f"takes {q.name!r} at position {i + 1}, which {what} does not"
        elif q.kind is p.POSITIONAL_OR_KEYWORD and o_positional[i].name != q.name:
            return (
                f"takes {q.name!r} at position {i + 1}, where {what} takes {o_positional[i].name!r}"
            )
    for q in t_params:
        if q.kind in keyword and q.name not in o_keyword and p.VAR_KEYWORD not in o_kinds:
            return f"takes {q.name!r}, which {what} does not accept"
        if q.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and q.kind not in o_kinds:
            return f"takes {q}, which {what} does not accept"
    for q in o_params:
        if (
            q.default is p.empty
            and q.kind in (*positional, p.KEYWORD_ONLY)
            and q.name not in t_names
        ):
            return f"has no {q.name!r}, which {what} requires"
    return None
