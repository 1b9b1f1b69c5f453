//! Merging the specs of a group's layers into one (vLLM's `KVCacheSpec.merge` and its
//! overrides in full attention, sink, MLA and sliding-window MLA).

use super::{
    invalid, AttentionParams, FullAttentionSpec, KvCacheSpec, MlaAttentionSpec, RswaSpec,
    SinkFullAttentionSpec, SlidingWindowMlaSpec, SpecClass,
};
use crate::error::{KvError, Result};

impl KvCacheSpec {
    /// Merges the specs of a group's layers into one spec, with the rules of
    /// `type(specs[0]).merge(specs)` in vLLM.
    pub fn merge(specs: &[KvCacheSpec]) -> Result<KvCacheSpec> {
        let first = specs
            .first()
            .ok_or_else(|| KvError::InvalidSpec("cannot merge an empty list of specs".into()))?;
        Self::merge_as(first.class(), specs)
    }

    /// Merges with the rules of `class.merge(specs)` in vLLM:
    /// * full attention (and sink): every spec is full attention but not MLA; the
    ///   attention fields agree; the recorded sliding windows (and chunk sizes) that
    ///   are set agree; not both a window and a chunk. The result is of `class`
    ///   (a sink result takes the first spec's `sink_len`).
    /// * MLA: every spec is MLA with the same `cache_dtype_str` and attention fields;
    ///   the result keeps the first page size and drops alignment and recorded windows.
    /// * R-SWA: every spec is R-SWA with one `rswa_window`, merged as full attention.
    /// * sliding-window MLA: every spec is sliding-window MLA with the same
    ///   `cache_dtype_str`, `tokens_per_state`, window, retained tokens, replay policy
    ///   and DCP sharding;
    ///   the result is the first spec without its alignment (its other attention fields
    ///   are not compared, as in vLLM).
    /// * every other class: all specs must be equal.
    pub fn merge_as(class: SpecClass, specs: &[KvCacheSpec]) -> Result<KvCacheSpec> {
        let first = specs
            .first()
            .ok_or_else(|| KvError::InvalidSpec("cannot merge an empty list of specs".into()))?;
        match class {
            SpecClass::FullAttention | SpecClass::SinkFullAttention => {
                let full = merge_full(specs)?;
                if class == SpecClass::FullAttention {
                    return Ok(KvCacheSpec::FullAttention(full));
                }
                let KvCacheSpec::SinkFullAttention(s) = first else {
                    return invalid("SinkFullAttentionSpec.merge needs a sink spec first");
                };
                Ok(KvCacheSpec::SinkFullAttention(SinkFullAttentionSpec {
                    full,
                    sink_len: s.sink_len,
                }))
            }
            SpecClass::Rswa => {
                let mut windows = specs.iter().map(|s| match s {
                    KvCacheSpec::Rswa(r) => Some(r.rswa_window),
                    _ => None,
                });
                let Some(Some(rswa_window)) = windows.next() else {
                    return invalid(
                        "All attention layers in the same KV cache group must be RSWASpec.",
                    );
                };
                if !windows.all(|w| w == Some(rswa_window)) {
                    return invalid(
                        "All attention layers in the same KV cache group must be RSWASpec \
                         with the same rswa_window.",
                    );
                }
                Ok(KvCacheSpec::Rswa(RswaSpec {
                    full: merge_full(specs)?,
                    rswa_window,
                }))
            }
            SpecClass::MlaAttention => merge_mla(specs),
            SpecClass::SlidingWindowMla => merge_sliding_window_mla(specs),
            _ => {
                if specs[1..].iter().any(|s| s != first) {
                    return invalid("All layers in the same KV cache group must be the same.");
                }
                Ok(first.clone())
            }
        }
    }
}

/// The one value of a set of recorded window sizes, if any (`merge_window_sizes`).
fn merge_window_sizes(sizes: impl Iterator<Item = Option<usize>>) -> Result<Option<usize>> {
    let mut merged = None;
    for size in sizes.flatten() {
        match merged {
            Some(m) if m != size => return invalid(
                "All attention layers in the same KV cache group must have the same window size.",
            ),
            _ => merged = Some(size),
        }
    }
    Ok(merged)
}

fn same_attention(specs: &[KvCacheSpec], merged: &AttentionParams) -> Result<()> {
    if specs.iter().any(|s| s.attention() != Some(merged)) {
        return invalid(
            "All attention layers in the same KV cache group must have the same attention spec.",
        );
    }
    Ok(())
}

fn merge_full(specs: &[KvCacheSpec]) -> Result<FullAttentionSpec> {
    let mut fulls = Vec::with_capacity(specs.len());
    for s in specs {
        match s {
            KvCacheSpec::MlaAttention(_) => {
                return invalid("MLAAttentionSpec should be merged in MLAAttentionSpec.merge")
            }
            _ => match s.full_attention() {
                Some(f) => fulls.push(f),
                None => return invalid(
                    "All attention layers in the same KV cache group must be FullAttentionSpec.",
                ),
            },
        }
    }
    let merged = FullAttentionSpec {
        attn: fulls[0].attn.clone(),
        sliding_window: merge_window_sizes(fulls.iter().map(|f| f.sliding_window))?,
        attention_chunk_size: merge_window_sizes(fulls.iter().map(|f| f.attention_chunk_size))?,
    };
    same_attention(specs, &merged.attn)?;
    if merged.sliding_window.is_some() && merged.attention_chunk_size.is_some() {
        return invalid(
            "Model with both sliding window layers and chunked local attention layers is not supported.",
        );
    }
    Ok(merged)
}

fn merge_mla(specs: &[KvCacheSpec]) -> Result<KvCacheSpec> {
    let mut mlas = Vec::with_capacity(specs.len());
    for s in specs {
        let KvCacheSpec::MlaAttention(m) = s else {
            return invalid(
                "All attention layers in the same KV cache group must be MLAAttentionSpec.",
            );
        };
        mlas.push(m);
    }
    if mlas
        .iter()
        .any(|m| m.cache_dtype_str != mlas[0].cache_dtype_str)
    {
        return invalid(
            "All attention layers in the same KV cache group must use the same quantization method.",
        );
    }
    let merged = MlaAttentionSpec {
        full: FullAttentionSpec::new(mlas[0].full.attn.clone()),
        cache_dtype_str: mlas[0].cache_dtype_str.clone(),
        alignment: None,
    };
    same_attention(specs, &merged.full.attn)?;
    Ok(KvCacheSpec::MlaAttention(merged))
}

fn merge_sliding_window_mla(specs: &[KvCacheSpec]) -> Result<KvCacheSpec> {
    let mut windows = Vec::with_capacity(specs.len());
    for s in specs {
        let KvCacheSpec::SlidingWindowMla(w) = s else {
            return invalid(
                "All attention layers in the same KV cache group must be SlidingWindowMLASpec.",
            );
        };
        windows.push(w);
    }
    let first = windows[0];
    let agree = |w: &&SlidingWindowMlaSpec| {
        w.cache_dtype_str == first.cache_dtype_str
            && w.window.attn.tokens_per_state == first.window.attn.tokens_per_state
            && w.window.attn.dcp_sharded == first.window.attn.dcp_sharded
            && w.window.sliding_window == first.window.sliding_window
            && w.window.extra_retained_tokens == first.window.extra_retained_tokens
            && w.bounded_replay == first.bounded_replay
    };
    if !windows.iter().all(agree) {
        return invalid(
            "All attention layers in the same KV cache group must use the same quantization \
             method, tokens per state, sliding window size, retained token count, and \
             replay policy.",
        );
    }
    Ok(KvCacheSpec::SlidingWindowMla(SlidingWindowMlaSpec {
        window: first.window.clone(),
        cache_dtype_str: first.cache_dtype_str.clone(),
        alignment: None,
        bounded_replay: first.bounded_replay,
    }))
}
