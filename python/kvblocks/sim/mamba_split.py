"""vLLM 0.33's Mamba block-aligned chunk split, for the simulator's scheduler loop.

In Mamba "align" cache mode vLLM's scheduler clips every prefill chunk so that it ends where
a reusable Mamba state must be written (``Scheduler._mamba_block_aligned_split``): chunk
ends are Mamba-block aligned, a chunk starting mid-block stops at the next boundary, and a
chunk stops before the last cacheable block boundary, at the prompt's hash-aligned partial
tail (partial prefix hits, unless a prefill-checkpoint block saves it inside the final
chunk) and at a shared-prefix junction. :class:`MambaSplit` is that rule as a pure function
of a request's counts; :func:`mamba_split_for` builds it once from a layout, or returns
None where the layout needs no split (so the loop runs exactly the calls it runs without).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvblocks._core import mamba_checkpoint_exportable, mamba_checkpoint_position
from kvblocks.sim.presets import KVLayout

__all__ = ["MambaSplit", "mamba_split_for"]


@dataclass(frozen=True)
class MambaSplit:
    """The scheduler settings the split reads (vLLM 0.33's ``Scheduler`` attributes).

    Attributes:
        block_size: The Mamba block size (vLLM's ``cache_config.block_size``).
        hash_block_size: Tokens per block hash.
        checkpoint_block_size: Granularity of the prompt checkpoint: the hash block size
            with partial hits, else the scheduler block size.
        eagle_block_drop: EAGLE drops the last matching block (cleared by hash lookahead).
        hash_lookahead_tokens: Tokens after each block that its hash covers.
        checkpoint_alignment: The first Mamba group's ``prefill_checkpoint_alignment``.
        has_checkpoint_blocks: Every Mamba group has prefill-checkpoint blocks.
        partial_hits: Prefix hits may end on a hash boundary inside a Mamba block.
        shared_prefix_checkpoint: The manager checkpoints a shared-prefix junction itself.
        max_prefill_tokens: The most tokens of one chunk (max scheduled tokens, capped by
            the long-prefill threshold).
    """

    block_size: int
    hash_block_size: int
    checkpoint_block_size: int
    eagle_block_drop: bool
    hash_lookahead_tokens: int
    checkpoint_alignment: int | None
    has_checkpoint_blocks: bool
    partial_hits: bool
    shared_prefix_checkpoint: bool
    max_prefill_tokens: int

    def _internal_checkpoint(self, start: int, end: int, position: int) -> bool:
        """Whether the backend exports the prompt checkpoint at ``position`` inside the
        chunk ``[start, end)`` (the core's rule, vLLM 0.33's
        ``is_mamba_prefill_checkpoint_valid``)."""
        alignment = self.checkpoint_alignment
        if alignment is None:
            return False
        return mamba_checkpoint_exportable(
            start, end, position, self.hash_block_size, self.block_size, alignment
        )

    def clip(
        self,
        num_computed: int,
        num_new_tokens: int,
        num_prompt_tokens: int,
        num_tokens: int,
        num_new_local_computed: int = 0,
        num_external_computed: int = 0,
        junction: int = 0,
    ) -> int:
        """The chunk of ``num_new_tokens`` clipped to end where Mamba state must be cached.

        Args:
            num_computed: The request's computed tokens.
            num_new_tokens: The chunk the budget allows.
            num_prompt_tokens: The request's prompt tokens.
            num_tokens: The request's tokens (prompt and outputs).
            num_new_local_computed: A waiting request's prefix-cache hit.
            num_external_computed: A waiting request's external (connector) hit.
            junction: The request's shared-prefix boundary (0: none).

        Returns:
            The tokens to schedule; 0 when no aligned chunk fits (vLLM then skips a running
            request and stops admitting waiting ones). Decode steps are never clipped.
        """
        start = num_computed + num_new_local_computed + num_external_computed
        # resumed requests replay their outputs as prefill
        prefill_end = max(num_prompt_tokens, num_tokens - 1)
        if start >= prefill_end:
            return num_new_tokens
        bs, drop, ahead = self.block_size, self.eagle_block_drop, self.hash_lookahead_tokens
        last_cache_position = mamba_checkpoint_position(num_tokens, bs, drop, ahead)
        end = start + num_new_tokens
        internal = (
            self.has_checkpoint_blocks
            and end >= prefill_end
            and self._internal_checkpoint(
                start,
                end,
                mamba_checkpoint_position(prefill_end, self.checkpoint_block_size, drop, ahead),
            )
        )
        if internal:
            last_cache_position = 0
        # chunk ends are block aligned, except the prompt's last chunk; a block wider than
        # one chunk advances sub-block and re-aligns at the next boundary
        if end < prefill_end:
            aligned_end = end // bs * bs
            if aligned_end > start or bs <= self.max_prefill_tokens:
                end = aligned_end
        tail = (
            mamba_checkpoint_position(num_prompt_tokens, self.hash_block_size, drop, ahead)
            if self.partial_hits and not internal
            else 0
        )
        if self.shared_prefix_checkpoint and junction <= num_prompt_tokens:
            junction_stop = junction
        else:  # a sub-block junction's state is not separately cacheable
            junction_stop = start + (junction - start) // bs * bs
        stops = (
            (start // bs + 1) * bs if start % bs and not internal else 0,
            last_cache_position,
            tail if last_cache_position < tail < num_prompt_tokens else 0,
            junction_stop if start < junction < end else 0,
        )
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)


def mamba_split_for(
    layout: KVLayout,
    partial_hash_hits: bool,
    max_num_scheduled_tokens: int,
    long_prefill_token_threshold: int = 0,
    shared_prefix_checkpoint: bool = False,
) -> MambaSplit | None:
    """The split of ``layout``'s scheduler, or None unless a Mamba group caches in "align"
    mode.

    Args:
        layout: The KV cache layout.
        partial_hash_hits: The manager's ``enable_partial_hash_hits``.
        max_num_scheduled_tokens: The scheduler's token budget per step.
        long_prefill_token_threshold: vLLM's long-prefill chunk cap (0: none).
        shared_prefix_checkpoint: The manager's ``mamba_shared_prefix_checkpoint``.
    """
    mambas = [g for g in layout.groups if g.kind == "mamba"]
    if not any(g.mamba_cache_mode == "align" for g in mambas):
        return None
    block_size = mambas[0].block_size
    hbs = layout.hash_block_size
    partial = hbs < layout.scheduler_block_size and partial_hash_hits
    max_prefill = max_num_scheduled_tokens
    if long_prefill_token_threshold > 0:
        max_prefill = min(max_prefill, long_prefill_token_threshold)
    return MambaSplit(
        block_size=block_size,
        hash_block_size=hbs,
        checkpoint_block_size=hbs if partial else layout.scheduler_block_size,
        eagle_block_drop=layout.use_eagle and not layout.num_hash_lookahead_tokens,
        hash_lookahead_tokens=layout.num_hash_lookahead_tokens,
        checkpoint_alignment=mambas[0].mamba_checkpoint_alignment,
        has_checkpoint_blocks=all(g.mamba_checkpoint_alignment is not None for g in mambas),
        partial_hits=partial,
        shared_prefix_checkpoint=partial and shared_prefix_checkpoint,
        max_prefill_tokens=max_prefill,
    )
