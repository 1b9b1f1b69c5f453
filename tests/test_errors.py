"""One exception tree: every error kvblocks raises for bad input is a `kvblocks.KVBlocksError`
and still an instance of the builtin it raised before (vLLM's type in the same case)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import kvblocks as kb
import pytest
from test_bad_input import BS, TABLE, World, config, full

# Each class of the tree and the builtin it also derives from.
CLASSES: list[tuple[type[kb.KVBlocksError], type[Exception]]] = [
    (kb.InvalidArgumentError, ValueError),
    (kb.OutOfBlocksError, ValueError),
    (kb.BlockOutOfRangeError, ValueError),
    (kb.DoubleFreeError, ValueError),
    (kb.UnknownAlgorithmError, ValueError),
    (kb.UnknownRequestError, KeyError),
    (kb.InvalidSpecError, ValueError),
    (kb.UnsupportedError, NotImplementedError),
    (kb.NotPinnedError, KeyError),
]

# Rows of the bad-input table whose error Python or PyO3 raises before the core sees the
# call: argument conversion (wrong type, out of an integer range), read-only attributes,
# a request borrowed twice by one call.
CONVERSION_ERRORS = (TypeError, OverflowError, AttributeError, RuntimeError)


def test_base_class() -> None:
    assert issubclass(kb.KVBlocksError, Exception)
    assert not issubclass(kb.KVBlocksError, (ValueError, KeyError, NotImplementedError))
    assert kb.KVBlocksError.__module__ == "kvblocks._core"
    assert kb.KVBlocksError.__doc__


@pytest.mark.parametrize(("cls", "builtin"), CLASSES, ids=[c.__name__ for c, _ in CLASSES])
def test_class_bases(cls: type[kb.KVBlocksError], builtin: type[Exception]) -> None:
    assert cls.__bases__ == (kb.KVBlocksError, builtin)
    assert issubclass(cls, kb.KVBlocksError) and issubclass(cls, builtin)
    assert cls.__module__ == "kvblocks._core" and cls.__doc__
    assert getattr(kb, cls.__name__) is cls
    assert cls.__name__ in kb.__all__
    err = cls("message")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and back.args == ("message",)
    with pytest.raises(builtin):
        raise err


def test_one_class_per_variant() -> None:
    """Every exported subclass is in CLASSES (one per `KvError` variant)."""
    exported = {
        v
        for v in vars(kb).values()
        if isinstance(v, type) and issubclass(v, kb.KVBlocksError) and v is not kb.KVBlocksError
    }
    assert exported == {c for c, _ in CLASSES}


@pytest.mark.parametrize(("label", "call", "exc"), TABLE, ids=[row[0] for row in TABLE])
def test_bad_input_errors_are_kvblocks_errors(
    label: str, call: Callable[[World], Any], exc: type[Exception]
) -> None:
    """The bad-input table, swept: each row still raises its builtin type, and every error
    that is not an argument conversion is a KVBlocksError."""
    with pytest.raises(exc) as info:
        call(World())
    if exc in CONVERSION_ERRORS:
        return
    assert isinstance(info.value, kb.KVBlocksError), f"{label}: {info.value!r}"


def test_specific_classes() -> None:
    world = World()
    with pytest.raises(kb.OutOfBlocksError):
        world.pool.get_new_blocks(5)
    with pytest.raises(kb.DoubleFreeError):
        world.pool.free_blocks([world.free])
    with pytest.raises(kb.BlockOutOfRangeError):
        world.pool.touch([99])
    with pytest.raises(kb.UnknownAlgorithmError):
        kb.BlockHasher(BS, "md5")
    mgr = kb.KVCacheManager(config(full()), 64, BS)
    with pytest.raises(kb.UnknownRequestError):
        mgr.cache_blocks(kb.Request("stranger", list(range(2 * BS)), kb.BlockHasher(BS)), 2 * BS)
    with pytest.raises(kb.InvalidArgumentError):
        mgr.block_table(["x"], group_id=1)


def test_vllm_unsupported_config_error_is_in_the_tree() -> None:
    from kvblocks.vllm import UnsupportedConfigError

    assert issubclass(UnsupportedConfigError, kb.UnsupportedError)
    assert issubclass(UnsupportedConfigError, kb.KVBlocksError)
    assert issubclass(UnsupportedConfigError, NotImplementedError)
