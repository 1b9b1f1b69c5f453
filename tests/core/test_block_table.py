"""`KVCacheManager.block_table`: one C-contiguous int32 buffer for a batch of requests that
numpy views without a copy (docs/ARCHITECTURE.md: "a batch's block tables as one buffer")."""

from __future__ import annotations

import kvblocks as kb
import pytest
from test_bad_input import BS, full, swa

np = pytest.importorskip("numpy")


def manager() -> tuple[kb.KVCacheManager, dict[str, list[int]]]:
    """A hybrid manager (full attention + sliding window) holding three requests."""
    groups = [kb.KVCacheGroupSpec(["f"], full()), kb.KVCacheGroupSpec(["s"], swa())]
    mgr = kb.KVCacheManager(kb.KVCacheConfig(64, [], groups), 256, BS)
    for rid, n in [("a", 3 * BS + 1), ("b", 1), ("c", 6 * BS)]:
        req = kb.Request(rid, list(range(100 * len(rid) + n, 100 * len(rid) + 2 * n)), None)
        assert mgr.allocate_slots(req, n) is not None
    return mgr, {rid: mgr.get_block_ids(rid)[0] for rid in "abc"}


def padded(rows: list[list[int]]) -> list[list[int]]:
    width = max([len(r) for r in rows] + [1])
    return [r + [0] * (width - len(r)) for r in rows]


def test_shape_format_and_rows() -> None:
    mgr, tables = manager()
    ids = ["c", "a", "unknown", "b", "a"]
    view = memoryview(mgr.block_table(ids))
    assert view.format == "i" and view.itemsize == 4 and view.ndim == 2
    assert view.shape == (5, len(tables["c"])) and view.c_contiguous
    assert view.tolist() == padded([tables["c"], tables["a"], [], tables["b"], tables["a"]])


def test_group_id_selects_the_group() -> None:
    mgr, _ = manager()
    for group in (0, 1):
        rows = [mgr.get_block_ids(r)[group] for r in "abc"]
        assert mgr.block_table(list("abc"), group).tolist() == padded(rows)
        assert mgr.block_table(list("abc"), group_id=group).tolist() == padded(rows)
    with pytest.raises(kb.InvalidArgumentError, match="group id 2"):
        mgr.block_table(["a"], 2)


def test_empty_shapes() -> None:
    """No rows, or rows without blocks: the table is one null column wide."""
    mgr, _ = manager()
    assert mgr.block_table([]).shape == (0, 1)
    assert np.asarray(mgr.block_table([])).shape == (0, 1)
    assert mgr.block_table(("x", "y")).tolist() == [[0], [0]]


def test_bad_ids() -> None:
    mgr, _ = manager()
    with pytest.raises(TypeError):
        mgr.block_table("a")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        mgr.block_table([1])  # type: ignore[list-item]
    with pytest.raises(OverflowError):
        mgr.block_table(["a"], -1)


def test_numpy_views_it_without_a_copy() -> None:
    mgr, tables = manager()
    buf = mgr.block_table(["a", "b"])
    arr = np.asarray(buf)
    assert arr.dtype == np.int32 and arr.shape == (2, len(tables["a"]))
    assert arr.flags.c_contiguous
    view = memoryview(buf)
    assert np.shares_memory(arr, np.asarray(view))
    pointer = arr.__array_interface__["data"][0]
    assert np.frombuffer(buf, dtype=np.int32).__array_interface__["data"][0] == pointer
    # A write through the memoryview is seen through numpy's array: the same memory.
    view[1, 0] = 12345
    assert arr[1, 0] == 12345
    # Each call is a new table: the manager's own tables are unchanged.
    assert mgr.get_block_ids("b")[0] == tables["b"]
    assert mgr.block_table(["b"]).tolist()[0][: len(tables["b"])] == tables["b"]


def test_follows_the_manager() -> None:
    mgr, tables = manager()
    before = mgr.block_table(["a"]).tolist()
    mgr.free(kb.Request("a", [0], None))
    assert mgr.block_table(["a"]).tolist() == [[0]]
    assert before == padded([tables["a"]])
