//! Unit tests of the spec module.

use super::*;
use crate::attention::AttentionKind;

fn attn(bs: usize, heads: usize, head: usize, dtype: Dtype) -> AttentionParams {
    AttentionParams::new(bs, heads, head, dtype)
}

fn full(bs: usize) -> KvCacheSpec {
    KvCacheSpec::from(FullAttentionSpec::new(attn(bs, 8, 128, Dtype::Bfloat16)))
        .build()
        .unwrap()
}

fn swa(bs: usize, sw: usize) -> KvCacheSpec {
    KvCacheSpec::from(SlidingWindowSpec {
        attn: attn(bs, 8, 128, Dtype::Bfloat16),
        sliding_window: sw,
        extra_retained_tokens: 0,
    })
    .build()
    .unwrap()
}

fn mla(align: Option<usize>) -> KvCacheSpec {
    let mut a = attn(16, 1, 576, Dtype::Bfloat16);
    a.head_size_v = 0;
    KvCacheSpec::from(MlaAttentionSpec {
        full: FullAttentionSpec::new(a),
        cache_dtype_str: None,
        alignment: align,
    })
    .build()
    .unwrap()
}

#[test]
fn attention_page_size() {
    // 8 heads * 16 tokens * (128 + 128) * 2 bytes.
    assert_eq!(full(16).page_size_bytes(), 65_536);
    let mut a = attn(16, 8, 128, Dtype::Float32);
    a.head_size_v = 64;
    let s = KvCacheSpec::from(FullAttentionSpec::new(a))
        .build()
        .unwrap();
    assert_eq!(s.page_size_bytes(), 8 * 16 * 192 * 4);
}

#[test]
fn packed_attention_page_size() {
    let page = |slots: Option<usize>, content: Option<usize>, tps: TokensPerState| {
        let mut a = attn(16, 8, 128, Dtype::Bfloat16);
        a.num_head_slots = slots;
        a.state_content_bytes = content;
        a.tokens_per_state = tps;
        KvCacheSpec::from(FullAttentionSpec::new(a))
            .build()
            .map(|s| s.page_size_bytes())
    };
    // num_heads * floor(block_size / tokens_per_state) * state_content.
    assert_eq!(page(Some(2), None, 1.into()).unwrap(), 2 * 16 * 256 * 2);
    assert_eq!(page(None, Some(656), 1.into()).unwrap(), 8 * 16 * 656);
    assert_eq!(page(None, None, 4.into()).unwrap(), 8 * 4 * 256 * 2);
    assert_eq!(page(None, None, 3.into()).unwrap(), 8 * 5 * 256 * 2);
    // Whisper's block pooling, `Fraction(1, 4)` (given as 2/8): four states per token.
    assert_eq!(
        page(None, None, TokensPerState::new(2, 8)).unwrap(),
        8 * 64 * 256 * 2
    );
    assert_eq!(
        page(None, None, TokensPerState::new(3, 2)).unwrap(),
        8 * 10 * 256 * 2
    );
    assert!(page(None, None, TokensPerState::new(1, 0)).is_err());
    assert!(page(None, None, 0.into()).is_err());
}

#[test]
fn mla_page_is_single_latent_padded_to_alignment() {
    assert_eq!(mla(None).page_size_bytes(), 16 * 576 * 2);
    // 18432 rounded up to a multiple of 1000.
    assert_eq!(mla(Some(1000)).page_size_bytes(), 19_000);
    assert_eq!(mla(Some(512)).page_size_bytes(), 18_432);
}

#[test]
fn mamba_page_sums_states() {
    let mut m = MambaSpec::new(
        16,
        vec![vec![3, 4], vec![2, 5, 7]],
        vec![Dtype::Float32, Dtype::Bfloat16],
    );
    let s = KvCacheSpec::from(m.clone()).build().unwrap();
    assert_eq!(s.page_size_bytes(), 12 * 4 + 70 * 2);
    m.page_size_padded = Some(1024);
    assert_eq!(
        KvCacheSpec::from(m.clone())
            .build()
            .unwrap()
            .page_size_bytes(),
        1024
    );
    m.page_size_padded = Some(100);
    assert!(KvCacheSpec::from(m).build().is_err());
}

#[test]
fn full_memory_with_and_without_dcp() {
    let p = MemoryParams::new(1000);
    assert_eq!(full(16).max_memory_usage_bytes(&p).unwrap(), 63 * 65_536);
    let p = MemoryParams {
        dcp_world_size: 4,
        ..p
    };
    // cdiv(1000, 4) = 250 tokens -> 16 blocks.
    assert_eq!(full(16).max_memory_usage_bytes(&p).unwrap(), 16 * 65_536);
}

#[test]
fn swa_and_chunked_admission() {
    let s = swa(16, 4096);
    assert_eq!(s.max_admission_blocks_per_request(8192, 32_768), Some(769));
    let p = MemoryParams {
        max_num_batched_tokens: 8192,
        ..MemoryParams::new(32_768)
    };
    assert_eq!(s.max_memory_usage_bytes(&p).unwrap(), 769 * 65_536);
    // Capped by max_model_len: cdiv(1000, 16) + 1.
    assert_eq!(s.max_admission_blocks_per_request(8192, 1000), Some(64));
    let c = KvCacheSpec::from(ChunkedLocalAttentionSpec {
        attn: attn(16, 8, 128, Dtype::Bfloat16),
        attention_chunk_size: 8192,
    })
    .build()
    .unwrap();
    assert_eq!(c.max_admission_blocks_per_request(8192, 32_768), Some(1024));
    let two = MemoryParams {
        max_concurrent_batches: 2,
        ..p
    };
    // min(8192 + 16384, 32768) / 16.
    assert_eq!(c.max_memory_usage_bytes(&two).unwrap(), 1536 * 65_536);
    let dcp = MemoryParams {
        dcp_world_size: 2,
        ..p
    };
    assert!(s.max_memory_usage_bytes(&dcp).is_err());
    assert_eq!(full(16).max_admission_blocks_per_request(1, 1), None);
}

#[test]
fn mamba_cross_and_uniform_memory() {
    let mut m = MambaSpec::new(16, vec![vec![10]], vec![Dtype::Float32]);
    m.num_speculative_blocks = 2;
    let p = MemoryParams::new(4096);
    let none = KvCacheSpec::from(m.clone()).build().unwrap();
    assert_eq!(none.max_memory_usage_bytes(&p).unwrap(), 40 * 3);
    m.mamba_cache_mode = MambaCacheMode::Align;
    m.num_prefill_checkpoint_blocks = 1;
    let align = KvCacheSpec::from(m).build().unwrap();
    assert_eq!(align.max_memory_usage_bytes(&p).unwrap(), 40 * 5);

    let cross = KvCacheSpec::from(CrossAttentionSpec {
        attn: attn(16, 8, 128, Dtype::Bfloat16),
    })
    .build()
    .unwrap();
    let p = MemoryParams {
        max_num_encoder_input_tokens: 1500,
        ..p
    };
    assert_eq!(cross.max_memory_usage_bytes(&p).unwrap(), 94 * 65_536);

    let half = KvCacheSpec::from(FullAttentionSpec::new(attn(16, 4, 128, Dtype::Bfloat16)))
        .build()
        .unwrap();
    let u = KvCacheSpec::from(UniformTypeSpecs {
        block_size: 16,
        kv_cache_specs: LayerSpecs(vec![("a".into(), full(16)), ("b".into(), half)]),
    })
    .build()
    .unwrap();
    assert_eq!(u.page_size_bytes(), 65_536 + 32_768);
    // Both need cdiv(4096, 16) = 256 pages.
    assert_eq!(u.max_memory_usage_bytes(&p).unwrap(), 256 * 98_304);
    assert_eq!(u.kind(), "full_attention");
    assert_eq!(
        AttentionKind::from_spec(&u).unwrap(),
        AttentionKind::FullAttention
    );
}

#[test]
fn merge_full_windows() {
    let mut a = FullAttentionSpec::new(attn(16, 8, 128, Dtype::Bfloat16));
    let plain = KvCacheSpec::from(a.clone()).build().unwrap();
    a.sliding_window = Some(128);
    let windowed = KvCacheSpec::from(a.clone()).build().unwrap();
    let merged = KvCacheSpec::merge(&[plain.clone(), windowed.clone()]).unwrap();
    assert_eq!(merged, windowed);
    a.sliding_window = Some(256);
    let other = KvCacheSpec::from(a.clone()).build().unwrap();
    assert!(KvCacheSpec::merge(&[windowed.clone(), other]).is_err());
    a.sliding_window = None;
    a.attention_chunk_size = Some(64);
    let chunked = KvCacheSpec::from(a).build().unwrap();
    assert!(KvCacheSpec::merge(&[windowed, chunked]).is_err());
    assert!(KvCacheSpec::merge(&[plain.clone(), full(32)]).is_err());
    assert!(KvCacheSpec::merge(&[plain.clone(), mla(None)]).is_err());
    assert!(KvCacheSpec::merge(&[plain.clone(), swa(16, 8)]).is_err());
    assert!(KvCacheSpec::merge(&[]).is_err());
}

#[test]
fn merge_sink_mla_and_base() {
    let sink = |n| {
        KvCacheSpec::from(SinkFullAttentionSpec {
            full: FullAttentionSpec::new(attn(16, 8, 128, Dtype::Bfloat16)),
            sink_len: n,
        })
        .build()
        .unwrap()
    };
    // Sink merge keeps the first sink_len; full merge drops it.
    let m = KvCacheSpec::merge(&[sink(32), sink(16)]).unwrap();
    assert_eq!(m, sink(32));
    let m = KvCacheSpec::merge_as(SpecClass::FullAttention, &[sink(32), full(16)]).unwrap();
    assert_eq!(m, full(16));
    assert!(KvCacheSpec::merge_as(SpecClass::SinkFullAttention, &[full(16)]).is_err());
    // MLA merge drops alignment but keeps the padded page.
    let m = KvCacheSpec::merge(&[mla(Some(1000)), mla(Some(1000))]).unwrap();
    assert_eq!(m.page_size_bytes(), 19_000);
    assert_ne!(m, mla(Some(1000)));
    assert!(KvCacheSpec::merge(&[mla(None), mla(Some(1000))]).is_err());
    assert_eq!(
        KvCacheSpec::merge(&[swa(16, 8), swa(16, 8)]).unwrap(),
        swa(16, 8)
    );
    assert!(KvCacheSpec::merge(&[swa(16, 8), swa(16, 4)]).is_err());
}

#[test]
fn hisparse_pages_memory_and_kinds() {
    let hot = KvCacheSpec::from(HiSparseHotSpec {
        block_size: 16,
        page_size: 64,
        blocks_per_request: 2,
    })
    .build()
    .unwrap();
    let resident = KvCacheSpec::from(HiSparseResidentSpec {
        block_size: 16,
        page_size: 64,
    })
    .build()
    .unwrap();
    assert_eq!(
        (hot.page_size_bytes(), resident.page_size_bytes()),
        (64, 64)
    );
    assert!(!hot.dcp_sharded() && !resident.dcp_sharded());
    // Two batches of 300 tokens in flight under a 4096-token model: cdiv(600, 16) pages.
    let p = MemoryParams {
        max_num_batched_tokens: 300,
        max_concurrent_batches: 2,
        ..MemoryParams::new(4096)
    };
    assert_eq!(hot.max_memory_usage_bytes(&p).unwrap(), 2 * 64);
    assert_eq!(resident.max_memory_usage_bytes(&p).unwrap(), 38 * 64);
    assert_eq!(resident.max_admission_blocks_per_request(600, 100), Some(7));
    assert_eq!(hot.max_admission_blocks_per_request(600, 100), None);
    assert_eq!((hot.kind(), resident.kind()), ("unknown", "unknown"));
    assert_eq!(
        AttentionKind::from_spec(&hot).unwrap(),
        AttentionKind::HiSparseHot {
            blocks_per_request: 2,
            always_hot: false
        }
    );
    assert_eq!(
        AttentionKind::from_spec(&resident).unwrap(),
        AttentionKind::HiSparseResident
    );
    assert!(KvCacheSpec::from(HiSparseResidentSpec {
        block_size: 0,
        page_size: 64
    })
    .build()
    .is_err());
}

#[test]
fn kinds_windows_and_managers() {
    assert_eq!(full(16).kind(), "full_attention");
    assert_eq!(mla(None).kind(), "mla_attention");
    assert_eq!(
        AttentionKind::from_spec(&mla(None)).unwrap(),
        AttentionKind::FullAttention
    );
    assert_eq!(swa(16, 8).kind(), "sliding_window");
    assert_eq!(swa(16, 8).sliding_window(), Some(8));
    assert_eq!(
        AttentionKind::from_spec(&swa(16, 8)).unwrap(),
        AttentionKind::SlidingWindow {
            sliding_window: 8,
            extra_retained_tokens: 0
        }
    );
    let u = KvCacheSpec::from(UniformTypeSpecs {
        block_size: 16,
        kv_cache_specs: LayerSpecs(vec![("a".into(), full(16)), ("b".into(), mla(None))]),
    })
    .build()
    .unwrap();
    assert_eq!(u.kind(), "full_attention");
    assert_eq!(u.sliding_window(), None);
    let w = KvCacheSpec::from(UniformTypeSpecs {
        block_size: 16,
        kv_cache_specs: LayerSpecs(vec![("a".into(), swa(16, 8)), ("b".into(), swa(16, 8))]),
    })
    .build()
    .unwrap();
    assert_eq!((w.kind(), w.sliding_window()), ("sliding_window", Some(8)));
    assert_eq!(
        AttentionKind::from_spec(&w).unwrap(),
        AttentionKind::SlidingWindow {
            sliding_window: 8,
            extra_retained_tokens: 0
        }
    );
    assert!(mla(None).is_instance(SpecClass::FullAttention));
    assert!(mla(None).is_instance(SpecClass::Base));
    assert!(!swa(16, 8).is_instance(SpecClass::FullAttention));
    assert!(!full(16).is_instance(SpecClass::MlaAttention));
}

#[test]
fn uniform_type_rules_and_order_free_equality() {
    assert!(is_uniform_type([&full(16), &mla(None)]));
    assert!(!is_uniform_type([&full(16), &full(32)]));
    assert!(!is_uniform_type([&swa(16, 8), &swa(16, 4)]));
    assert!(!is_uniform_type([&full(16), &swa(16, 8)]));
    assert!(!is_uniform_type(std::iter::empty()));
    let ab = LayerSpecs(vec![("a".into(), full(16)), ("b".into(), mla(None))]);
    let ba = LayerSpecs(vec![("b".into(), mla(None)), ("a".into(), full(16))]);
    assert_eq!(ab, ba);
    let bad = UniformTypeSpecs {
        block_size: 16,
        kv_cache_specs: LayerSpecs(vec![("a".into(), full(16)), ("b".into(), swa(16, 8))]),
    };
    assert!(KvCacheSpec::from(bad).build().is_err());
}

#[test]
fn display_reads_like_vllm_repr() {
    assert_eq!(
        swa(16, 8).to_string(),
        "SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=128, \
         dtype=torch.bfloat16, head_size_v=128, page_size_padded=None, num_head_slots=None, \
         state_content_bytes=None, tokens_per_state=1, dcp_sharded=True, \
         sliding_window=8, extra_retained_tokens=0)"
    );
    let mut m = MambaSpec::new(16, vec![vec![4]], vec![Dtype::Int8]);
    m.mamba_type = "it's".into();
    let text = KvCacheSpec::from(m).build().unwrap().to_string();
    assert!(
        text.contains("shapes=((4,),), dtypes=(torch.int8,)"),
        "{text}"
    );
    assert!(text.contains(r"mamba_type='it\'s'"), "{text}");
}

#[test]
fn construction_validates() {
    assert!(
        KvCacheSpec::from(FullAttentionSpec::new(attn(0, 8, 128, Dtype::Int8)))
            .build()
            .is_err()
    );
    assert!(
        KvCacheSpec::from(FullAttentionSpec::new(attn(16, 0, 128, Dtype::Int8)))
            .build()
            .is_err()
    );
    let sink = |n| {
        KvCacheSpec::from(SinkFullAttentionSpec {
            full: FullAttentionSpec::new(attn(16, 8, 128, Dtype::Int8)),
            sink_len: n,
        })
        .build()
    };
    assert!(sink(0).is_err());
    assert!(sink(24).is_err());
    assert!(sink(48).is_ok());
    let huge = attn(usize::MAX / 2, 8, 128, Dtype::Float64);
    assert!(KvCacheSpec::from(FullAttentionSpec::new(huge))
        .build()
        .is_err());
    let m = MambaSpec::new(16, vec![vec![1]], vec![]);
    assert!(KvCacheSpec::from(m).build().is_err());
}

fn swa_mla(sw: usize, align: Option<usize>, bounded_replay: bool) -> KvCacheSpec {
    let mut a = attn(64, 1, 584, Dtype::Uint8);
    a.head_size_v = 0;
    a.tokens_per_state = 2.into();
    KvCacheSpec::from(SlidingWindowMlaSpec {
        window: SlidingWindowSpec {
            attn: a,
            sliding_window: sw,
            extra_retained_tokens: 0,
        },
        cache_dtype_str: None,
        alignment: align,
        bounded_replay,
    })
    .build()
    .unwrap()
}

/// DeepSeek-V4's sliding-window MLA (`test_contiguous_kv_packing.py`): 32 states of 584
/// bytes padded to 576's next multiple; a sliding window for the manager, its own kind.
#[test]
fn sliding_window_mla_page_kind_and_family() {
    let s = swa_mla(128, Some(576), false);
    assert_eq!(s.page_size_bytes(), (32 * 584usize).next_multiple_of(576));
    assert_eq!(s.kind(), "sliding_window_mla");
    assert_eq!(s.sliding_window(), Some(128));
    assert!(s.is_instance(SpecClass::SlidingWindow) && s.prefix_cacheable());
    assert!(!swa_mla(128, None, true).prefix_cacheable());
    assert_eq!(
        AttentionKind::from_spec(&s).unwrap(),
        AttentionKind::from_spec(&swa(64, 128)).unwrap()
    );
    // vLLM's `is_uniform_with_collection`: a sliding window takes sliding-window MLA
    // members of its window, not the reverse; replay policies must agree.
    let plain = swa(64, 128);
    assert!(is_uniform_type([&plain, &s]));
    assert!(!is_uniform_type([&s, &plain]));
    assert!(!is_uniform_type([&s, &swa_mla(128, Some(576), true)]));
    let merged = KvCacheSpec::merge(&[s.clone(), swa_mla(128, None, false)]).unwrap();
    assert_eq!(merged.page_size_bytes(), s.page_size_bytes());
    assert!(KvCacheSpec::merge(&[s, swa_mla(64, None, false)]).is_err());
}

/// A circular buffer: one page per request at most, never prefix cached, no event kind.
#[test]
fn circular_buffer_memory_and_caching() {
    let mut a = attn(8, 1, 1024, Dtype::Float32);
    a.head_size_v = 0;
    let ring = KvCacheSpec::from(CircularBufferSpec { attn: a })
        .build()
        .unwrap();
    let page = 8 * 1024 * 4;
    assert_eq!(ring.page_size_bytes(), page);
    assert_eq!(
        ring.max_memory_usage_bytes(&MemoryParams::new(100_000))
            .unwrap(),
        page
    );
    assert!(!ring.prefix_cacheable());
    assert_eq!(ring.kind(), "unknown");
}
