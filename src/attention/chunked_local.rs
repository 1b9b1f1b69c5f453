//! Chunked local attention: only the current chunk is attended; blocks
//! of earlier chunks are nulled, and count as hits without a lookup.

use super::{AttentionKind, CachedBlocks, HitQuery};
use crate::arith::cdiv;
use crate::error::{KvError, Result};
use crate::spec::ChunkedLocalAttentionSpec;
use crate::types::{BlockId, NULL_BLOCK_ID};

/// The `kv_cache_spec_kind` of this type's events.
pub(crate) const SPEC_KIND: &str = "chunked_local_attention";

/// The manager parameters of a chunked local attention spec.
pub(crate) fn kind(s: &ChunkedLocalAttentionSpec) -> AttentionKind {
    AttentionKind::ChunkedLocal {
        attention_chunk_size: s.attention_chunk_size,
    }
}

/// `(n // chunk) * chunk`: tokens before the current chunk.
#[inline]
pub(crate) fn num_skipped_tokens(n: usize, chunk: usize) -> usize {
    n / chunk * chunk
}

/// `max_admission_blocks_per_request`: `cdiv(min(chunk + T, L), bs)`, the most blocks a
/// request holds at once (it is also the spec's maximum memory per request).
pub(crate) fn max_admission_blocks(
    chunk: usize,
    bs: usize,
    max_in_flight_tokens: usize,
    max_model_len: usize,
) -> usize {
    let held = chunk.saturating_add(max_in_flight_tokens);
    cdiv(held.min(max_model_len), bs)
}

/// Nulls for every block before the last chunk boundary at or below `max_length`, then
/// the cached run from there.
pub(crate) fn find_longest_cache_hit<P: CachedBlocks + ?Sized>(
    q: &HitQuery<'_>,
    bs: usize,
    chunk: usize,
    pool: &P,
    out: &mut [Vec<BlockId>],
) -> Result<usize> {
    if q.drop_eagle || bs != q.alignment {
        return Err(KvError::Unsupported(
            "chunked local attention supports neither EAGLE nor hit alignments other than \
             its block size (as vLLM 0.33)"
                .into(),
        ));
    }
    let max_blocks = q.max_blocks(bs);
    let first = num_skipped_tokens(q.max_length, chunk) / bs;
    for o in out.iter_mut() {
        o.resize(first, NULL_BLOCK_ID);
    }
    let mut i = first;
    while i < max_blocks && q.push_hit(pool, bs, i, out) {
        i += 1;
    }
    Ok(out[0].len() * bs)
}
