//! Specs printed as vLLM's dataclass `repr`s (`FullAttentionSpec(block_size=16, ...)`).

use std::fmt;

use super::{AttentionParams, Dtype, FullAttentionSpec, KvCacheSpec};

/// Formats an optional value as Python prints it (`None` when absent).
struct Opt<T>(Option<T>);

impl<T: fmt::Display> fmt::Display for Opt<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("None"),
        }
    }
}

/// Formats a string as Python's `repr` does for plain text: `'text'`.
fn py_str(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Formats a Python bool.
fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

impl fmt::Display for AttentionParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "block_size={}, num_kv_heads={}, head_size={}, dtype={}, head_size_v={}, \
             page_size_padded={}, num_head_slots={}, state_content_bytes={}, \
             tokens_per_state={}, dcp_sharded={}",
            self.block_size,
            self.num_kv_heads,
            self.head_size,
            self.dtype,
            self.head_size_v,
            Opt(self.page_size_padded),
            Opt(self.num_head_slots),
            Opt(self.state_content_bytes),
            self.tokens_per_state,
            py_bool(self.dcp_sharded)
        )
    }
}

impl fmt::Display for FullAttentionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, sliding_window={}, attention_chunk_size={}",
            self.attn,
            Opt(self.sliding_window),
            Opt(self.attention_chunk_size)
        )
    }
}

impl fmt::Display for KvCacheSpec {
    /// A dataclass-style repr with vLLM's class and field names, e.g.
    /// `FullAttentionSpec(block_size=16, num_kv_heads=8, ...)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvCacheSpec::FullAttention(s) => write!(f, "FullAttentionSpec({s})"),
            KvCacheSpec::MlaAttention(m) => write!(
                f,
                "MLAAttentionSpec({}, cache_dtype_str={}, alignment={})",
                m.full,
                Opt(m.cache_dtype_str.as_deref().map(py_str)),
                Opt(m.alignment)
            ),
            KvCacheSpec::SinkFullAttention(s) => {
                write!(
                    f,
                    "SinkFullAttentionSpec({}, sink_len={})",
                    s.full, s.sink_len
                )
            }
            KvCacheSpec::Rswa(r) => {
                write!(f, "RSWASpec({}, rswa_window={})", r.full, r.rswa_window)
            }
            KvCacheSpec::SlidingWindow(s) => write!(
                f,
                "SlidingWindowSpec({}, sliding_window={}, extra_retained_tokens={})",
                s.attn, s.sliding_window, s.extra_retained_tokens
            ),
            KvCacheSpec::SlidingWindowMla(s) => write!(
                f,
                "SlidingWindowMLASpec({}, sliding_window={}, extra_retained_tokens={}, \
                 cache_dtype_str={}, alignment={}, bounded_replay={})",
                s.window.attn,
                s.window.sliding_window,
                s.window.extra_retained_tokens,
                Opt(s.cache_dtype_str.as_deref().map(py_str)),
                Opt(s.alignment),
                py_bool(s.bounded_replay)
            ),
            KvCacheSpec::ChunkedLocalAttention(c) => write!(
                f,
                "ChunkedLocalAttentionSpec({}, attention_chunk_size={})",
                c.attn, c.attention_chunk_size
            ),
            KvCacheSpec::CrossAttention(c) => write!(f, "CrossAttentionSpec({})", c.attn),
            KvCacheSpec::CircularBuffer(c) => write!(f, "CircularBufferSpec({})", c.attn),
            KvCacheSpec::HiSparseHot(h) => write!(
                f,
                "HiSparseHotSpec(block_size={}, page_size={}, blocks_per_request={})",
                h.block_size, h.page_size, h.blocks_per_request
            ),
            KvCacheSpec::HiSparseResident(r) => write!(
                f,
                "HiSparseResidentSpec(block_size={}, page_size={})",
                r.block_size, r.page_size
            ),
            KvCacheSpec::Mamba(m) => {
                let shapes: Vec<String> = m
                    .shapes
                    .iter()
                    .map(|s| match s.as_slice() {
                        [one] => format!("({one},)"),
                        _ => format!(
                            "({})",
                            s.iter()
                                .map(usize::to_string)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    })
                    .collect();
                let dtypes: Vec<String> = m.dtypes.iter().map(Dtype::to_string).collect();
                let tuple = |items: &[String]| match items {
                    [one] => format!("({one},)"),
                    _ => format!("({})", items.join(", ")),
                };
                write!(
                    f,
                    "MambaSpec(block_size={}, shapes={}, dtypes={}, page_size_padded={}, \
                     mamba_type={}, mamba_cache_mode={}, num_speculative_blocks={}, \
                     num_prefill_checkpoint_blocks={}, prefill_checkpoint_alignment={})",
                    m.block_size,
                    tuple(&shapes),
                    tuple(&dtypes),
                    Opt(m.page_size_padded),
                    py_str(&m.mamba_type),
                    py_str(m.mamba_cache_mode.as_str()),
                    m.num_speculative_blocks,
                    m.num_prefill_checkpoint_blocks,
                    Opt(m.prefill_checkpoint_alignment)
                )
            }
            KvCacheSpec::UniformType(u) => {
                let layers: Vec<String> = u
                    .kv_cache_specs
                    .0
                    .iter()
                    .map(|(name, spec)| format!("{}: {spec}", py_str(name)))
                    .collect();
                write!(
                    f,
                    "UniformTypeKVCacheSpecs(block_size={}, kv_cache_specs={{{}}})",
                    u.block_size,
                    layers.join(", ")
                )
            }
        }
    }
}
