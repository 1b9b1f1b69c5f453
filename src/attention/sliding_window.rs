//! Sliding-window attention: blocks before the window are nulled and
//! freed, and a hit needs `cdiv(sw - 1, bs)` contiguous cached blocks ending at the hit.

use super::caching::reachable_boundaries;
use super::{AttentionKind, CachedBlocks, HitQuery, RequestView, SingleTypeManager, SparseCaching};
use crate::arith::cdiv;
use crate::spec::SlidingWindowSpec;
use crate::types::{BlockId, NULL_BLOCK_ID};

/// The `kv_cache_spec_kind` of this type's events.
pub(crate) const SPEC_KIND: &str = "sliding_window";

/// The `kv_cache_spec_kind` of a sliding-window MLA spec's events (vLLM maps
/// `SlidingWindowMLASpec` to the same manager; only the page and the kind differ).
pub(crate) const MLA_SPEC_KIND: &str = "sliding_window_mla";

/// The manager parameters of a sliding window spec.
pub(crate) fn kind(s: &SlidingWindowSpec) -> AttentionKind {
    AttentionKind::SlidingWindow {
        sliding_window: s.sliding_window,
        extra_retained_tokens: s.extra_retained_tokens,
    }
}

/// `max(0, n - sw + 1 - extra)`: tokens before the window of token `n`.
#[inline]
pub(crate) fn num_skipped_tokens(n: usize, sliding_window: usize, extra: usize) -> usize {
    (n + 1).saturating_sub(sliding_window + extra)
}

/// `max_admission_blocks_per_request`: `cdiv(min(sw - 1 + extra + T, L), bs) + 1`, the
/// most blocks a request holds at once (it is also the spec's maximum memory per request).
pub(crate) fn max_admission_blocks(
    sliding_window: usize,
    extra_retained_tokens: usize,
    bs: usize,
    max_in_flight_tokens: usize,
    max_model_len: usize,
) -> usize {
    let held = sliding_window
        .saturating_sub(1)
        .saturating_add(extra_retained_tokens)
        .saturating_add(max_in_flight_tokens);
    // +1: the window need not start on a block boundary.
    cdiv(held.min(max_model_len), bs) + 1
}

/// Contiguous blocks a hit needs (one more with EAGLE, which drops it afterwards).
#[inline]
fn contiguous_blocks_for_hit(sliding_window: usize, bs: usize, use_eagle: bool) -> usize {
    cdiv(sliding_window.saturating_sub(1), bs) + usize::from(use_eagle)
}

/// Scans right to left for the last run of `need` contiguous hits; positions before the
/// run are nulls. Without such a run, a run starting at block 0 still counts.
pub(crate) fn find_longest_cache_hit<P: CachedBlocks + ?Sized>(
    q: &HitQuery<'_>,
    bs: usize,
    sliding_window: usize,
    pool: &P,
    out: &mut [Vec<BlockId>],
) -> usize {
    let need = contiguous_blocks_for_hit(sliding_window, bs, q.drop_eagle);
    let max_blocks = q.max_blocks(bs);
    for o in out.iter_mut() {
        o.resize(max_blocks, NULL_BLOCK_ID);
    }
    let aligned = |n: usize| (n * bs).is_multiple_of(q.alignment);
    let mut run = 0usize;
    let mut found = false;
    for i in (0..max_blocks).rev() {
        let h = q.hash(bs, i);
        let mut hit = true;
        for (j, &g) in q.groups.iter().enumerate() {
            match pool.cached_block(h, g) {
                Some(b) => out[j][i] = b,
                None => {
                    for o in &mut out[..j] {
                        o[i] = NULL_BLOCK_ID;
                    }
                    hit = false;
                    break;
                }
            }
        }
        if !hit {
            run = 0;
            continue;
        }
        if run == 0 && bs != q.alignment && !aligned(if q.drop_eagle { i } else { i + 1 }) {
            for o in out.iter_mut() {
                o[i] = NULL_BLOCK_ID;
            }
            continue;
        }
        run += 1;
        if run >= need {
            for o in out.iter_mut() {
                o.truncate(i + run);
            }
            found = true;
            break;
        }
    }
    let realign = |out: &mut [Vec<BlockId>]| {
        while bs != q.alignment && !aligned(out[0].len()) {
            for o in out.iter_mut() {
                o.pop();
            }
        }
    };
    if !found {
        for o in out.iter_mut() {
            o.truncate(run);
        }
        realign(out);
    }
    if q.drop_eagle && !out[0].is_empty() {
        for o in out.iter_mut() {
            o.pop();
        }
        realign(out);
    }
    out[0].len() * bs
}

/// Which of the request's blocks `start..end` get cached: the reachable blocks of the
/// replay boundaries and of the request's shared-prefix junction
/// ([`reachable_boundaries`], [`reachable_block_mask`]).
pub(crate) fn cache_mask<R: RequestView>(
    mgr: &SingleTypeManager,
    request: &R,
    start: usize,
    end: usize,
    sliding_window: usize,
    sparse_caching: SparseCaching,
    replay_boundaries: &[usize],
) -> Option<Vec<bool>> {
    let bs = mgr.block_size();
    let mut boundaries = [0usize; 4];
    let n = reachable_boundaries(mgr, request, replay_boundaries, &mut boundaries);
    reachable_block_mask(
        start,
        end,
        mgr.alignment_tokens,
        sliding_window,
        bs,
        mgr.use_eagle,
        sparse_caching,
        &boundaries[..n],
    )
}

/// Which of the blocks `start..end` get cached (vLLM 0.33's `reachable_block_mask`);
/// `None` caches them all. `boundaries` are the replay boundaries (used only under
/// sparse caching).
#[allow(clippy::too_many_arguments)]
fn reachable_block_mask(
    start: usize,
    end: usize,
    alignment: usize,
    sliding_window: usize,
    bs: usize,
    use_eagle: bool,
    sparse_caching: SparseCaching,
    boundaries: &[usize],
) -> Option<Vec<bool>> {
    if !alignment.is_multiple_of(bs) {
        return None;
    }
    let need = contiguous_blocks_for_hit(sliding_window, bs, use_eagle);
    let shift = usize::from(use_eagle);
    let mut mask = vec![false; end - start];
    let segment = match sparse_caching {
        SparseCaching::Dense => Some(alignment),
        SparseCaching::Interval(0) => None,
        SparseCaching::Interval(n) => Some(n),
    };
    if let Some(segment) = segment {
        let per_segment = segment / bs;
        if need >= per_segment {
            return None;
        }
        for i in start.max(shift)..end {
            if (i - shift) % per_segment >= per_segment - need {
                mask[i - start] = true;
            }
        }
    }
    if sparse_caching != SparseCaching::Dense {
        for &b in boundaries {
            let e = (b / alignment * alignment) / bs + shift;
            for j in start.max(e.saturating_sub(need))..end.min(e) {
                mask[j - start] = true;
            }
        }
    }
    Some(mask)
}
