"""KV cache layouts: one description, built as a kvblocks or a vLLM ``KVCacheManager``.

A :class:`KVLayout` names the attention groups of a model and the manager options; the
same layout builds ``kvblocks.KVCacheManager`` (:func:`build_kvblocks_manager`) and vLLM
0.33's ``KVCacheManager`` (:func:`build_vllm_manager`, vLLM imported only then), so both
implementations always replay the very same configuration.

Two families of layouts:

* replay configs (:data:`REPLAY_CONFIGS`, :func:`replay_layout`): the small one- or
  two-layer configurations of the conformance driver (``full``, ``hybrid``, ``swa``,
  ``chunked``, ``mamba``, ``eagle``, ``bs32``);
* model presets (:data:`MODEL_PRESETS`, :func:`model_layout`): whole models for
  ``kvblocks simulate``, with a GPU memory budget turned into a block count.

Memory rule (vLLM's, for groups with equal layer counts): every KV cache group owns block
ids from one shared pool, so the pool needs one tensor per layer *position* of a group,
shared by the groups; a block costs ``layers_per_group * max(page size of a layer)``
bytes, and ``num_blocks = budget // that``. For one group this is the sum of the page
sizes of all layers.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from kvblocks._core import InvalidArgumentError

__all__ = [
    "MODEL_PRESETS",
    "REPLAY_CONFIGS",
    "GroupDesc",
    "KVLayout",
    "ModelPreset",
    "build_kvblocks_config",
    "build_kvblocks_manager",
    "build_vllm_manager",
    "hisparse_min_host_blocks",
    "model_layout",
    "parse_memory",
    "replay_layout",
    "resolve_block_sizes",
]

GroupKind = Literal[
    "full",
    "mla",
    "sliding_window",
    "sliding_window_mla",
    "chunked_local",
    "circular_buffer",
    "mamba",
    "hisparse_resident",
    "hisparse_hot",
]

#: Per attention kind: the spec class (one name in kvblocks and in vLLM) and the
#: ``GroupDesc`` field it takes besides the attention fields. MLA kinds store one latent
#: (``head_size_v`` 0, as vLLM's classes default it); a circular buffer is one ring block
#: per request.
_ATTENTION_SPECS: dict[str, tuple[str, str | None]] = {
    "full": ("FullAttentionSpec", None),
    "mla": ("MLAAttentionSpec", None),
    "sliding_window": ("SlidingWindowSpec", "sliding_window"),
    "sliding_window_mla": ("SlidingWindowMLASpec", "sliding_window"),
    "chunked_local": ("ChunkedLocalAttentionSpec", "attention_chunk_size"),
    "circular_buffer": ("CircularBufferSpec", None),
}

#: HiSparse's device groups (vLLM 0.33): the spec class (one name in kvblocks and in
#: vLLM) and whether it takes ``blocks_per_request``. Their pages are ``page_size`` bytes.
_HISPARSE_SPECS: dict[str, tuple[str, bool]] = {
    "hisparse_resident": ("HiSparseResidentSpec", False),
    "hisparse_hot": ("HiSparseHotSpec", True),
}


@dataclass(frozen=True)
class GroupDesc:
    """One KV cache group: layers sharing a block table.

    Attributes:
        kind: Attention type of the group.
        num_layers: Layers in the group (only for memory sizing and layer names).
        block_size: Tokens per block.
        num_kv_heads: KV heads per layer (attention kinds).
        head_size: Head size (attention kinds).
        dtype: KV dtype name (``bfloat16``, ``float16``, ``float32``, ...).
        sliding_window: Window of a ``sliding_window`` group.
        attention_chunk_size: Chunk of a ``chunked_local`` group.
        mamba_shapes: State shapes of a ``mamba`` group.
        mamba_dtypes: State dtype names of a ``mamba`` group.
        mamba_cache_mode: ``"align"`` (prefix caching) or ``"none"``.
        mamba_speculative_blocks: Extra state blocks of a ``mamba`` group for speculative
            decoding.
        mamba_checkpoint_alignment: ``"align"`` mode: with a value, the group has one
            prefill-checkpoint block, exported at multiples of this many tokens.
        layer_offset: Index of the group's first layer in the model's layer names.
        tokens_per_state: Tokens one stored state covers (compressed MLA indexers).
        page_size: Bytes of one page of a HiSparse resident or hot group.
        blocks_per_request: Blocks of a HiSparse hot group's region per request.
        host_resident: The group's blocks live in HiSparse's host pool (its source group).
        role: vLLM 0.33's ``KVCacheGroupRole`` value (``default``, ``hisparse_source``,
            ``hisparse_indexer``).
    """

    kind: GroupKind
    num_layers: int
    block_size: int
    num_kv_heads: int = 8
    head_size: int = 128
    dtype: str = "bfloat16"
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    mamba_shapes: tuple[tuple[int, ...], ...] = ()
    mamba_dtypes: tuple[str, ...] = ()
    mamba_cache_mode: str = "none"
    mamba_speculative_blocks: int = 0
    mamba_checkpoint_alignment: int | None = None
    layer_offset: int = 0
    tokens_per_state: int = 1
    page_size: int = 0
    blocks_per_request: int = 0
    host_resident: bool = False
    role: str = "default"

    @property
    def layer_names(self) -> list[str]:
        """Layer names, ``model.layers.<i>.self_attn`` (``.mixer`` for mamba)."""
        suffix = "mixer" if self.kind == "mamba" else "self_attn"
        first = self.layer_offset
        return [f"model.layers.{first + i}.{suffix}" for i in range(self.num_layers)]

    def kvblocks_spec(self) -> Any:
        """The group's ``kvblocks`` KV cache spec (the core owns page sizes and dtypes).

        Raises:
            ValueError: The core rejects the spec (an unknown dtype, a zero size).
        """
        import kvblocks as kb

        k: Any = kb
        common: dict[str, Any] = {"block_size": self.block_size}
        if self.kind == "mamba":
            return k.MambaSpec(
                shapes=[list(s) for s in self.mamba_shapes],
                dtypes=list(self.mamba_dtypes),
                **self.mamba_options,
                **common,
            )
        return self.attention_spec(k, self.dtype)

    def attention_spec(self, module: Any, dtype: Any) -> Any:
        """The group's attention (or HiSparse) spec from ``module`` (``kvblocks`` or vLLM's
        ``kv_cache_interface``, whose classes share names and keywords), with ``dtype``
        as that module takes it."""
        if self.kind in _HISPARSE_SPECS:
            name, per_request = _HISPARSE_SPECS[self.kind]
            extra = {"blocks_per_request": self.blocks_per_request} if per_request else {}
            return getattr(module, name)(
                block_size=self.block_size, page_size=self.page_size, **extra
            )
        cls, field = _ATTENTION_SPECS[self.kind]
        kwargs: dict[str, Any] = {
            "block_size": self.block_size,
            "num_kv_heads": self.num_kv_heads,
            "head_size": self.head_size,
            "dtype": dtype,
        }
        if self.tokens_per_state != 1:
            kwargs["tokens_per_state"] = self.tokens_per_state
        if field is not None:
            kwargs[field] = getattr(self, field)
        return getattr(module, cls)(**kwargs)

    @property
    def mamba_options(self) -> dict[str, Any]:
        """The keyword arguments of a ``mamba`` group's ``MambaSpec`` besides its block
        size, shapes and dtypes (the same in kvblocks and vLLM)."""
        return {
            "mamba_cache_mode": self.mamba_cache_mode,
            "num_speculative_blocks": self.mamba_speculative_blocks,
            "num_prefill_checkpoint_blocks": int(self.mamba_checkpoint_alignment is not None),
            "prefill_checkpoint_alignment": self.mamba_checkpoint_alignment,
        }

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of one layer (K and V for attention, all states for mamba),
        as the core's spec computes it."""
        size: int = self.kvblocks_spec().page_size_bytes
        return size


@dataclass(frozen=True)
class KVLayout:
    """A KV cache configuration plus the ``KVCacheManager`` options to build it with."""

    groups: tuple[GroupDesc, ...]
    num_blocks: int
    max_model_len: int
    hash_block_size: int
    scheduler_block_size: int
    enable_caching: bool = True
    use_eagle: bool = False
    max_in_flight_tokens: int | None = None
    num_prefill_lookahead: int = 0
    """Multi-module MTP's prefill lookahead (vLLM's ``num_prefill_lookahead_tokens``)."""
    num_hash_lookahead_tokens: int = 0
    """Tokens after each block that its hash covers (the request hashers' too)."""
    dcp_world_size: int = 1
    retention_interval: int | None = None
    """vLLM 0.33's ``prefix_cache_retention_interval`` (sparse caching of sliding-window
    and Mamba states; None: dense)."""
    hisparse_host_num_blocks: int | None = None
    """Blocks of HiSparse's host pool (the host-resident group's); None without one."""

    @property
    def bytes_per_block(self) -> int:
        """Memory of one pool block across all layers (see the module docs)."""
        slots = max(g.num_layers for g in self.groups)
        return slots * max(g.page_size_bytes for g in self.groups)

    def with_num_blocks(self, num_blocks: int) -> KVLayout:
        """A copy with another pool size."""
        return replace(self, num_blocks=num_blocks)


# ------------------------------------------------------------------ builders
def _kvblocks_config(
    groups: tuple[GroupDesc, ...],
    num_blocks: int,
    retention_interval: int | None = None,
    host_num_blocks: int | None = None,
) -> Any:
    import kvblocks as kb

    k: Any = kb
    specs = [
        k.KVCacheGroupSpec(
            g.layer_names, g.kvblocks_spec(), host_resident=g.host_resident, role=g.role
        )
        for g in groups
    ]
    return k.KVCacheConfig(
        num_blocks,
        [],
        specs,
        prefix_cache_retention_interval=retention_interval,
        hisparse_host_num_blocks=host_num_blocks,
    )


def build_kvblocks_config(layout: KVLayout) -> Any:
    """``kvblocks.KVCacheConfig`` for ``layout`` (no tensors: the manager needs none)."""
    return _kvblocks_config(
        layout.groups, layout.num_blocks, layout.retention_interval, layout.hisparse_host_num_blocks
    )


def resolve_block_sizes(
    groups: tuple[GroupDesc, ...], enable_caching: bool, dcp_world_size: int = 1
) -> tuple[int, int]:
    """``(scheduler_block_size, hash_block_size)`` of ``groups``, as the core resolves them
    (``KVCacheConfig.resolve_block_sizes``, vLLM 0.33's ``resolve_kv_cache_block_sizes``),
    with decode context parallelism over ``dcp_world_size`` ranks.

    Raises:
        ValueError: The core rejects the groups (no group, block sizes it cannot combine).
    """
    sizes: tuple[int, int] = _kvblocks_config(groups, 1).resolve_block_sizes(
        enable_prefix_caching=enable_caching, dcp_world_size=dcp_world_size
    )
    return sizes


def build_kvblocks_manager(layout: KVLayout, events: bool = False, retention: Any = None) -> Any:
    """``kvblocks.KVCacheManager`` for ``layout``; ``events`` publishes KV cache events
    (``take_events()``), as a fleet's prefix-aware router needs; ``retention`` is a
    ``kvblocks.RetentionPolicy`` (None: vLLM's LRU order)."""
    import kvblocks as kb

    k: Any = kb
    extra = {} if retention is None else {"retention": retention}
    return k.KVCacheManager(
        build_kvblocks_config(layout),
        layout.max_model_len,
        layout.hash_block_size,
        scheduler_block_size=layout.scheduler_block_size,
        max_in_flight_tokens=layout.max_in_flight_tokens,
        enable_caching=layout.enable_caching,
        use_eagle=layout.use_eagle,
        enable_kv_cache_events=events,
        num_prefill_lookahead=layout.num_prefill_lookahead,
        num_hash_lookahead_tokens=layout.num_hash_lookahead_tokens,
        dcp_world_size=layout.dcp_world_size,
        **extra,
    )


def build_vllm_manager(layout: KVLayout) -> Any:
    """vLLM's ``KVCacheManager`` (0.33 or 0.32) for ``layout`` (imports vLLM and torch)."""
    # importlib keeps vLLM and torch (optional, untyped here) out of the type check.
    torch = importlib.import_module("torch")
    iface = importlib.import_module("vllm.v1.kv_cache_interface")
    KVCacheManager = importlib.import_module("vllm.v1.core.kv_cache_manager").KVCacheManager
    KVCacheConfig, KVCacheGroupSpec, MambaSpec = (
        iface.KVCacheConfig,
        iface.KVCacheGroupSpec,
        iface.MambaSpec,
    )

    groups = []
    for g in layout.groups:
        spec: Any
        if g.kind == "mamba":
            spec = MambaSpec(
                block_size=g.block_size,
                shapes=g.mamba_shapes,
                dtypes=tuple(getattr(torch, d) for d in g.mamba_dtypes),
                **g.mamba_options,
            )
        else:
            spec = g.attention_spec(iface, getattr(torch, g.dtype))
        role = iface.KVCacheGroupRole(g.role)
        groups.append(
            KVCacheGroupSpec(g.layer_names, spec, host_resident=g.host_resident, role=role)
        )
    cfg = KVCacheConfig(
        num_blocks=layout.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
        prefix_cache_retention_interval=layout.retention_interval,
        hisparse_host_num_blocks=layout.hisparse_host_num_blocks,
    )
    # vLLM 0.32's manager has no `num_hash_lookahead_tokens`: passed only when set.
    n_hash = layout.num_hash_lookahead_tokens
    lookahead: dict[str, Any] = {"num_hash_lookahead_tokens": n_hash} if n_hash else {}
    return KVCacheManager(
        kv_cache_config=cfg,
        max_model_len=layout.max_model_len,
        scheduler_block_size=layout.scheduler_block_size,
        hash_block_size=layout.hash_block_size,
        max_in_flight_tokens=layout.max_in_flight_tokens,
        enable_caching=layout.enable_caching,
        use_eagle=layout.use_eagle,
        num_prefill_lookahead=layout.num_prefill_lookahead,
        log_stats=False,
        dcp_world_size=layout.dcp_world_size,
        **lookahead,
    )


# ------------------------------------------------------------- replay configs
REPLAY_CONFIGS = (
    "full",
    "hybrid",
    "swa",
    "chunked",
    "mamba",
    "mamba-spec",
    "mamba-partial",
    "eagle",
    "bs32",
    "mtp",
    "spec-lookahead",
    "deepseek-v4",
    "glm5-next",
    "hisparse",
    "hisparse-mamba",
)

# Speculative configs as vLLM 0.33's scheduler builds the manager for them, with prefix
# caching: config -> (num_prefill_lookahead, num_hash_lookahead_tokens). Lookahead hashes
# clear `use_eagle`. "mtp": multi-module MTP with 3 speculative tokens; "spec-lookahead":
# EAGLE (one token) on full + sliding-window attention.
_SPEC_LOOKAHEAD = {"mtp": (3, 3), "spec-lookahead": (1, 1)}

# A small Mamba2-like state: conv (3, 2048) bf16 and SSM (32, 64, 128) fp32.
_MAMBA_SHAPES = ((3, 2048), (32, 64, 128))
_MAMBA_DTYPES = ("bfloat16", "float32")

#: HiSparse's hot region: the tokens a DeepSeek-V3.2-like sparse indexer selects (its
#: ``index_topk``), which vLLM 0.33 sizes the region from.
_HISPARSE_TOPK = 2048


def _mamba_group(
    block_size: int, caching: bool, max_model_len: int, num_layers: int, offset: int
) -> GroupDesc:
    """The mamba group.

    vLLM 0.33's KVCacheManager asserts mode "align" when prefix caching is on (then the
    mamba block size is the attention block size); without caching vLLM uses mode "none"
    with one state block per request (block size = max_model_len), which makes the
    scheduler block size lcm(attention block size, max_model_len) (see
    :func:`resolve_block_sizes`).
    """
    mode, bs = ("align", block_size) if caching else ("none", max_model_len)
    return GroupDesc(
        "mamba",
        num_layers,
        bs,
        mamba_shapes=_MAMBA_SHAPES,
        mamba_dtypes=_MAMBA_DTYPES,
        mamba_cache_mode=mode,
        layer_offset=offset,
    )


def hisparse_min_host_blocks(max_model_len: int, block_size: int) -> int:
    """The smallest host pool vLLM 0.33 lays out for HiSparse (``create_hisparse_layout``):
    every computed page needs a host block, so one sequence of ``max_model_len`` tokens
    must fit beside the pool's null block and a copy-on-write tail."""
    return -(-max_model_len // block_size) + 2


def replay_layout(
    config: str,
    *,
    num_blocks: int,
    block_size: int = 16,
    max_model_len: int = 262144,
    sliding_window: int = 1024,
    chunk_size: int = 8192,
    enable_caching: bool = True,
    max_in_flight_tokens: int | None = None,
    dcp_world_size: int = 1,
    retention_interval: int | None = None,
    hisparse_host_blocks: int | None = None,
) -> KVLayout:
    """The layout of one of :data:`REPLAY_CONFIGS` (one layer per group, 8 heads x 128, bf16).

    ``full``: full attention; ``hybrid``: full + sliding window; ``swa``: sliding window
    only; ``chunked``: full + chunked local; ``mamba``: full + mamba; ``eagle``: full with
    ``use_eagle``; ``mamba-spec``: ``mamba`` with two speculative state blocks and (with
    caching) a prefill-checkpoint block aligned to the block size; ``mamba-partial``:
    ``mamba`` with (with caching) a Mamba block of twice the block size, so hits end on
    hash boundaries inside it (vLLM 0.33's partial hits, copied on write); ``bs32``: full attention
    with 32-token blocks over 16-token hashes (plus a 16-token full-attention group: vLLM
    0.33 accepts mixed block sizes only in the hybrid coordinator), scheduler block size 32;
    ``mtp``: full attention with multi-module MTP (3 tokens of prefill and hash lookahead);
    ``spec-lookahead``: full + sliding window with EAGLE's lookahead hashes (1 token);
    ``deepseek-v4``: DeepSeek-V4-like, full MLA + sliding-window MLA (``sliding_window``) +
    an 8-token compressor ring; ``glm5-next``: GLM-5-next-like (vLLM 0.33's
    ``models/glm5next``), full MLA + its indexer (an MLA group storing one state per 4
    tokens) + a 4-token tail ring. ``dcp_world_size`` shards every attention group over that
    many decode context parallel ranks (its blocks then hold ``block_size * dcp_world_size``
    tokens). ``retention_interval`` is vLLM 0.33's ``prefix_cache_retention_interval``
    (sparse caching of the sliding-window and Mamba groups' states; None: dense).
    ``hisparse``: a DeepSeek-V3.2-like HiSparse stack as vLLM 0.33 lays it out
    (``vllm/v1/hisparse/layout.py``): the MLA source group resident in a host pool of
    ``hisparse_host_blocks`` blocks (default ``num_blocks``), its indexer (an MLA group of
    128-wide keys), and the source's GPU resident pages and hot region (2,048 tokens);
    ``hisparse-mamba``: the same with pages of two blocks, beside a full-attention group
    and a Mamba "align" group of four blocks (partial prefix hits, copied on write).
    """
    if config not in REPLAY_CONFIGS:
        raise InvalidArgumentError(
            f"unknown config {config!r}; choose from {', '.join(REPLAY_CONFIGS)}"
        )
    full = GroupDesc("full", 1, block_size)
    groups: tuple[GroupDesc, ...] = (full,)
    if config in ("hybrid", "spec-lookahead"):
        groups = (
            full,
            GroupDesc(
                "sliding_window", 1, block_size, sliding_window=sliding_window, layer_offset=1
            ),
        )
    elif config == "swa":
        groups = (GroupDesc("sliding_window", 1, block_size, sliding_window=sliding_window),)
    elif config == "chunked":
        chunked = GroupDesc(
            "chunked_local", 1, block_size, attention_chunk_size=chunk_size, layer_offset=1
        )
        groups = (full, chunked)
    elif config in ("mamba", "mamba-spec", "mamba-partial"):
        mamba = _mamba_group(block_size, enable_caching, max_model_len, 1, 1)
        if config == "mamba-partial" and enable_caching:
            mamba = replace(mamba, block_size=2 * block_size)
        if config == "mamba-spec":
            mamba = replace(
                mamba,
                mamba_speculative_blocks=2,
                mamba_checkpoint_alignment=block_size if enable_caching else None,
            )
        groups = (full, mamba)
    elif config == "deepseek-v4":
        mla = GroupDesc("mla", 1, block_size, num_kv_heads=1, head_size=576)
        groups = (
            mla,
            replace(mla, kind="sliding_window_mla", sliding_window=sliding_window, layer_offset=1),
            GroupDesc("circular_buffer", 1, 8, num_kv_heads=1, head_size=512, layer_offset=2),
        )
    elif config == "glm5-next":
        groups = (
            GroupDesc("mla", 1, block_size, num_kv_heads=1, head_size=576),
            GroupDesc(
                "mla",
                1,
                block_size,
                num_kv_heads=1,
                head_size=128,
                tokens_per_state=4,
                layer_offset=1,
            ),
            GroupDesc("circular_buffer", 1, 4, num_kv_heads=2, head_size=128, layer_offset=2),
        )
    elif config in ("hisparse", "hisparse-mamba"):
        # hisparse-mamba: HiSparse pages of two hash blocks beside a full-attention group of
        # one and a Mamba group of four, so partial hits end inside host pages (host copy
        # on write)
        bs = block_size * (2 if config == "hisparse-mamba" else 1)
        source = GroupDesc(
            "mla", 1, bs, num_kv_heads=1, head_size=576, host_resident=True,
            role="hisparse_source",
        )  # fmt: skip
        page = source.page_size_bytes
        groups = (
            source,
            replace(source, head_size=128, host_resident=False, role="hisparse_indexer",
                    layer_offset=1),
            GroupDesc("hisparse_resident", 1, bs, page_size=page, layer_offset=2),
            GroupDesc("hisparse_hot", 1, bs, page_size=page, layer_offset=3,
                      blocks_per_request=-(-_HISPARSE_TOPK // bs)),
        )  # fmt: skip
        if config == "hisparse-mamba":
            mamba = _mamba_group(block_size, enable_caching, max_model_len, 1, 5)
            if enable_caching:
                mamba = replace(mamba, block_size=4 * block_size)
            groups += (replace(full, layer_offset=4), mamba)
    elif config == "bs32":
        # vLLM 0.33's unitary coordinator asserts hash_block_size == block_size, so blocks
        # coarser than the hash need the hybrid coordinator: a second full-attention group.
        groups = (GroupDesc("full", 1, 2 * block_size), replace(full, layer_offset=1))
    sched_bs, hash_bs = resolve_block_sizes(groups, enable_caching, dcp_world_size)
    prefill_lookahead, hash_lookahead = _SPEC_LOOKAHEAD.get(config, (0, 0))
    return KVLayout(
        groups,
        num_blocks,
        max_model_len,
        hash_bs,
        sched_bs,
        enable_caching=enable_caching,
        use_eagle=config == "eagle",
        max_in_flight_tokens=max_in_flight_tokens,
        num_prefill_lookahead=prefill_lookahead,
        num_hash_lookahead_tokens=hash_lookahead if enable_caching else 0,
        dcp_world_size=dcp_world_size,
        retention_interval=retention_interval,
        hisparse_host_num_blocks=(hisparse_host_blocks or num_blocks)
        if config in ("hisparse", "hisparse-mamba")
        else None,
    )


# --------------------------------------------------------------- model presets
@dataclass(frozen=True)
class ModelPreset:
    """A model's KV cache shape, for ``kvblocks simulate --model``.

    Attributes:
        name: The preset's key.
        model: The model it stands for (a Hugging Face id), or a note that it is synthetic.
        description: The KV cache shape in words.
        groups: The attention groups.
        max_model_len: The model's context length (the default ``--max-model-len``).
        params: Parameters (all experts of a mixture of experts).
        active_params: Parameters a token passes through (the FLOPs of the step-time
            model); None = ``params``.
        weight_bytes: Bytes of the weights on the GPUs; None = 2 bytes per parameter.
        hidden_size: Hidden size.
        num_q_heads: Query heads of an attention layer (KV heads and head size are the
            groups').
        intermediate_size: The gated MLP's intermediate size (the step-time model's
            gate/up and down GEMMs); None: the parameters outside attention and embeddings
            are one GEMM per layer (mixtures of experts, synthetic models).
        vocab_size: Vocabulary (the embeddings and the logits GEMM).
    """

    name: str
    model: str
    description: str
    groups: tuple[GroupDesc, ...]
    max_model_len: int
    params: int = 8_030_261_248
    active_params: int | None = None
    weight_bytes: int | None = None
    hidden_size: int = 4096
    num_q_heads: int = 32
    intermediate_size: int | None = None
    vocab_size: int = 128256

    @property
    def flop_params(self) -> int:
        """Parameters per token: ``active_params`` or ``params``."""
        return self.active_params if self.active_params is not None else self.params

    @property
    def weights_bytes(self) -> int:
        """``weight_bytes`` or 2 bytes per parameter (bf16)."""
        return self.weight_bytes if self.weight_bytes is not None else 2 * self.params


def _llama(name: str, model: str, layers: int, max_model_len: int, **sizes: int) -> ModelPreset:
    """A Llama-3 family preset: full attention, 8 KV heads x 128, bf16; ``sizes`` override
    the 8B's parameters, hidden size, heads and MLP size."""
    note = " (needs --tp 2 or more on 80 GB)" if layers > 32 else ""
    return ModelPreset(
        name,
        model,
        f"{layers} full-attention layers, 8 KV heads x 128, bf16{note}",
        (GroupDesc("full", layers, 16, 8, 128),),
        max_model_len,
        **{"intermediate_size": 14336, **sizes},
    )


def _gpt_oss(
    name: str, num_layers: int, params: int, active: int, weight_bytes: int
) -> ModelPreset:
    half = num_layers // 2
    return ModelPreset(
        name,
        f"openai/{name}",
        f"{num_layers} layers alternating full attention / sliding window 128, "
        "8 KV heads x 64, bf16",
        (
            GroupDesc("full", half, 16, 8, 64),
            GroupDesc("sliding_window", half, 16, 8, 64, sliding_window=128, layer_offset=half),
        ),
        131072,
        params=params,
        active_params=active,
        weight_bytes=weight_bytes,
        hidden_size=2880,
        num_q_heads=64,
        vocab_size=201088,
    )


MODEL_PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        # config.json: hidden 4096, 32 heads, 8 KV heads, intermediate 14336, vocabulary
        # 128256; 8.03 B parameters
        _llama("llama-3-8b", "meta-llama/Meta-Llama-3-8B", 32, 8192),
        _llama("llama-3.1-8b", "meta-llama/Llama-3.1-8B", 32, 131072),
        # config.json: hidden 8192, 64 heads, 8 KV heads, intermediate 28672, vocabulary
        # 128256, untied embeddings: 70.55 B parameters
        _llama(
            "llama-3.1-70b",
            "meta-llama/Llama-3.1-70B",
            80,
            131072,
            params=70_553_706_496,
            hidden_size=8192,
            num_q_heads=64,
            intermediate_size=28672,
        ),
        # OpenAI's gpt-oss model card: 20.9 B / 3.6 B active, 116.8 B / 5.1 B active;
        # MXFP4 MoE weights, checkpoints of 12.8 GiB and 60.8 GiB.
        _gpt_oss("gpt-oss-20b", 24, 20_900_000_000, 3_600_000_000, 13_800_000_000),
        _gpt_oss("gpt-oss-120b", 36, 116_800_000_000, 5_100_000_000, 65_300_000_000),
        ModelPreset(
            "hybrid-mamba",
            "synthetic (no released model)",
            "1:1 hybrid: 8 full-attention layers (8 KV heads x 128, bf16) + 8 Mamba2 layers "
            "(conv 3x2048 bf16, SSM 32x64x128 fp32)",
            (GroupDesc("full", 8, 16, 8, 128), GroupDesc("mamba", 8, 16, layer_offset=8)),
            32768,
            params=1_500_000_000,  # synthetic
            hidden_size=2048,
            num_q_heads=16,
        ),
    )
}

_MEMORY_UNITS = {
    "": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20,
    "mib": 2**20, "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40,
}  # fmt: skip


def parse_memory(text: str) -> int:
    """Bytes of a size such as ``40GiB``, ``512MiB``, ``1.5G`` or ``1000000``.

    Units are binary, as GPU memory is quoted (an "80 GB" H100 holds 80 GiB): ``K``, ``KB``
    and ``KiB`` all mean 2**10 bytes, and so on for ``M``, ``G`` and ``T``; a bare number
    is bytes.

    Raises:
        ValueError: Not a positive size.
    """
    s = text.strip().lower().replace(" ", "")
    num = s.rstrip("abgikmt")
    unit = s[len(num) :]
    try:
        value = float(num)
    except ValueError:
        raise InvalidArgumentError(f"not a memory size: {text!r} (e.g. 40GiB)") from None
    if unit not in _MEMORY_UNITS or value <= 0 or not math.isfinite(value):
        raise InvalidArgumentError(f"not a memory size: {text!r} (e.g. 40GiB)")
    return int(value * _MEMORY_UNITS[unit])


_OVERRIDABLE = ("num_layers", "num_kv_heads", "head_size", "dtype", "sliding_window")


def _with_overrides(
    groups: tuple[GroupDesc, ...], overrides: dict[str, Any]
) -> tuple[GroupDesc, ...]:
    unknown = set(overrides) - set(_OVERRIDABLE)
    if unknown:
        raise InvalidArgumentError(f"cannot override {', '.join(sorted(unknown))}")
    out = []
    offset = 0
    for g in groups:
        if g.kind != "mamba":
            fields = {k: v for k, v in overrides.items() if k != "sliding_window"}
            if g.kind == "sliding_window" and "sliding_window" in overrides:
                fields["sliding_window"] = overrides["sliding_window"]
            g = replace(g, **fields)
            g.kvblocks_spec()  # the core's check: an unknown dtype, a zero size
        out.append(replace(g, layer_offset=offset))
        offset += g.num_layers
    return tuple(out)


def _default_block_size(groups: tuple[GroupDesc, ...]) -> int:
    """16, or with mamba layers vLLM's choice: the smallest multiple of 16 whose attention
    page holds a mamba state (so that all groups share one page size)."""
    mamba = [g for g in groups if g.kind == "mamba"]
    if not mamba:
        return 16
    state = _mamba_group(16, False, 16, 1, 0).page_size_bytes
    per_token = max(g.page_size_bytes // g.block_size for g in groups if g.kind != "mamba")
    return 16 * -(-state // (16 * per_token))


def model_layout(
    preset: str,
    *,
    block_size: int | None = None,
    num_blocks: int | None = None,
    gpu_memory: int | None = None,
    max_model_len: int | None = None,
    enable_caching: bool = True,
    max_in_flight_tokens: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> KVLayout:
    """The layout of a model preset, sized by ``num_blocks`` or a ``gpu_memory`` budget.

    Args:
        preset: A key of :data:`MODEL_PRESETS`.
        block_size: Attention block size (default 16).
        num_blocks: Pool size; exclusive with ``gpu_memory``.
        gpu_memory: KV cache memory budget in bytes (``num_blocks = budget // bytes per
            block``, see the module docs).
        max_model_len: Longest sequence (default: the preset's context length).
        enable_caching: Prefix caching.
        max_in_flight_tokens: Tokens in flight (the step's token budget).
        overrides: Explicit attention-layer fields replacing the preset's in every
            attention group: ``num_layers``, ``num_kv_heads``, ``head_size``, ``dtype``,
            ``sliding_window`` (sliding-window groups only).

    Raises:
        ValueError: Unknown preset, or neither / both of ``num_blocks`` and ``gpu_memory``,
            or a budget too small for two blocks.
    """
    if preset not in MODEL_PRESETS:
        raise InvalidArgumentError(
            f"unknown model preset {preset!r}; choose from {', '.join(MODEL_PRESETS)}"
        )
    if (num_blocks is None) == (gpu_memory is None):
        raise InvalidArgumentError("give exactly one of num_blocks and gpu_memory")
    spec_groups = _with_overrides(MODEL_PRESETS[preset].groups, overrides or {})
    if max_model_len is None:
        max_model_len = MODEL_PRESETS[preset].max_model_len
    bs = block_size or _default_block_size(spec_groups)
    groups = tuple(
        _mamba_group(bs, enable_caching, max_model_len, g.num_layers, g.layer_offset)
        if g.kind == "mamba"
        else replace(g, block_size=bs)
        for g in spec_groups
    )
    sched_bs, hash_bs = resolve_block_sizes(groups, enable_caching)
    layout = KVLayout(
        groups,
        num_blocks or 0,
        max_model_len,
        hash_bs,
        sched_bs,
        enable_caching=enable_caching,
        max_in_flight_tokens=max_in_flight_tokens,
    )
    if gpu_memory is not None:
        n = gpu_memory // layout.bytes_per_block
        if n < 2:
            raise InvalidArgumentError(
                f"gpu memory {gpu_memory} bytes holds {n} blocks of "
                f"{layout.bytes_per_block} bytes; need at least 2"
            )
        layout = layout.with_num_blocks(n)
    return layout
