"""KV cache pages in torch, moved by block id (needs the `torch` extra).

`KVPages` allocates the KV cache of a `KVCacheConfig` (one raw byte buffer per KVCacheTensor,
shared by the layers it names, as vLLM), hands out typed per-layer views, and moves pages by
block id. Buffers of the same shape sit at one stride in a single allocation, so one kernel
moves a block of every layer of such a group, whatever the number of blocks or layers; on
CUDA that kernel is a Triton page copy that touches each byte once (torch index ops
elsewhere, see `_kernels`). Only the config's attributes are used and spec kinds are told
apart by class name, so kvblocks' own classes and vLLM's dataclasses both work.

Example::

    import torch
    from kvblocks.device import KVPages, block_table, slot_mapping

    pages = KVPages(config, "cuda", host_blocks=4096)      # config: a KVCacheConfig
    kv = pages.kv_cache("model.layers.0.self_attn")         # [2, num_blocks, 16, heads, dim]
    pages.zero_blocks(new_block_ids)
    table = block_table([[1, 2, 3], [4]], max_blocks=8, device="cuda")
    slots = slot_mapping(table, num_computed_tokens=[40, 0], num_scheduled_tokens=[1, 7],
                         block_size=16)
    pages.write_slots("model.layers.0.self_attn", key, value, slots)
    pages.copy_blocks(src=[5, 6], dst=[7, 8])               # copy-on-write / prefix fork
    out = pages.swap_out([7, 8], [0, 1])                     # device -> host pool, async
    out.synchronize()
    back = pages.swap_in([0, 1], [9, 10])
    back.wait()                                              # current stream waits
    blob = pages.gather([9, 10])                             # uint8 [2, pages.block_bytes]
    pages.scatter([11, 12], blob)
"""

from __future__ import annotations

try:
    import torch  # noqa: F401 (the check; the submodules use it)
except ImportError:
    raise ModuleNotFoundError(
        "kvblocks.device needs torch, which is not installed: pip install 'kvblocks[torch]'",
        name="torch",
    ) from None

from kvblocks.device._layout import Layout
from kvblocks.device._pages import Ids, KVPages, Transfer
from kvblocks.device._tables import block_table, slot_mapping

__all__ = ["Ids", "KVPages", "Layout", "Transfer", "block_table", "slot_mapping"]
