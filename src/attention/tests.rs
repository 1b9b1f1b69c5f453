//! Per-type lookups and window bookkeeping (blocks to allocate, sliding window, chunked
//! local), driven directly.

use super::*;
use crate::events::event::TokensOnly;
use crate::spec::KvCacheSpec;
use crate::types::{BlockHash, NULL_BLOCK_ID};

const NO_TOKENS: TokensOnly<'static> = TokensOnly(&[]);

fn hashes(n: usize) -> Vec<BlockHash> {
    (0..n)
        .map(|i| BlockHash::from_slice(&[i as u8 + 1; 32]).unwrap())
        .collect()
}

/// A pool where hash `i` is cached (group 0) iff `pattern[i]`.
fn pool_with(pattern: &[bool], bs: usize) -> (BlockPool, Vec<BlockHash>) {
    let mut pool = BlockPool::new(100, true, bs, false).unwrap();
    let hs = hashes(pattern.len());
    let table: Vec<BlockId> = pattern
        .iter()
        .map(|&t| {
            if t {
                pool.get_new_blocks(1).unwrap()[0]
            } else {
                0
            }
        })
        .collect();
    pool.cache_full_blocks(&hs, &table, 0, table.len(), bs, 0, None, &NO_TOKENS)
        .unwrap();
    (pool, hs)
}

fn manager(kind: AttentionKind, bs: usize, pool: &mut BlockPool) -> SingleTypeManager {
    SingleTypeManager::new(
        ManagerParams::new(kind, bs, 0),
        0,
        true,
        bs,
        8192,
        8192,
        pool,
    )
    .unwrap()
}

const SW4: AttentionKind = AttentionKind::SlidingWindow {
    sliding_window: 4,
    extra_retained_tokens: 0,
};

/// Section 4.9 table (`test_sliding_window_possible_cached_prefix`, bs 2, sw 4).
#[test]
fn sliding_window_hit_patterns() {
    let (t, f) = (true, false);
    let cases: [(&[bool], usize, &[usize]); 5] = [
        (&[t], 1, &[0]),
        (&[t, f], 1, &[0]),
        (&[t, t, f], 2, &[0, 1]),
        (&[t, t, f, t, f, f, t, t, f, t, t, t], 12, &[10, 11]),
        (&[t, t, f, t, f, f, t, t, f, f, f], 8, &[6, 7]),
    ];
    for (pattern, want, real) in cases {
        let (mut pool, hs) = pool_with(pattern, 2);
        let m = manager(SW4, 2, &mut pool);
        let q = HitQuery {
            hashes: &hs,
            hash_block_size: 2,
            max_length: hs.len() * 2,
            groups: &[0],
            drop_eagle: false,
            alignment: 2,
        };
        let mut out = vec![Vec::new()];
        let hit = m.find_longest_cache_hit(&q, &pool, &mut out).unwrap();
        assert_eq!(hit, want * 2, "{pattern:?}");
        assert_eq!(out[0].len(), want);
        for (i, &b) in out[0].iter().enumerate() {
            assert_eq!(b != NULL_BLOCK_ID, real.contains(&i), "{pattern:?} at {i}");
        }
    }
}

/// Section 4.10 docstring (chunk 8, bs 4): out-of-chunk blocks are nulls without lookup.
#[test]
fn chunked_local_hit_patterns() {
    let kind = AttentionKind::ChunkedLocal {
        attention_chunk_size: 8,
    };
    for (cached2, max_length, want) in [(true, 15, 3), (false, 15, 2), (false, 16, 4)] {
        let (mut pool, hs) = pool_with(&[false, false, cached2, false], 4);
        let m = manager(kind, 4, &mut pool);
        let q = HitQuery {
            hashes: &hs,
            hash_block_size: 4,
            max_length,
            groups: &[0],
            drop_eagle: false,
            alignment: 4,
        };
        let mut out = vec![Vec::new()];
        let hit = m.find_longest_cache_hit(&q, &pool, &mut out).unwrap();
        assert_eq!(hit, want * 4);
        assert_eq!(out[0][..2], [0, 0]);
    }
}

/// Section 4.9: the nulling schedule (bs 2, sw 4); 3 is freed before 2.
#[test]
fn sliding_window_remove_skipped_blocks() {
    let mut pool = BlockPool::new(20, true, 2, false).unwrap();
    let m = manager(SW4, 2, &mut pool);
    let mut rb = RequestBlocks::default();
    pool.get_new_blocks_into(11, &mut rb.table).unwrap();
    let ids = rb.table.clone();
    let nulls = |rb: &RequestBlocks| rb.table.iter().filter(|&&b| b == 0).count();
    for (n, want_nulls) in [(4, 0), (5, 1), (6, 1), (7, 2)] {
        m.remove_skipped_blocks(&mut rb, n, None, &mut pool)
            .unwrap();
        assert_eq!(nulls(&rb), want_nulls, "n = {n}");
    }
    m.remove_skipped_blocks(&mut rb, 11, None, &mut pool)
        .unwrap();
    assert_eq!(nulls(&rb), 4);
    let head: Vec<_> = pool.free_block_ids().take(4).collect();
    assert_eq!(head, vec![ids[3], ids[2], ids[1], ids[0]]);
}

/// The types that do not free skipped blocks (the coordinator skips their
/// `remove_skipped_blocks`) indeed free nothing, at any length, with or without the
/// prompt length; the windowed types do.
#[test]
fn only_windowed_types_free_skipped_blocks() {
    let whole_sequence = [
        AttentionKind::FullAttention,
        AttentionKind::SinkFullAttention { sink_len: 4 },
        AttentionKind::CrossAttention,
        AttentionKind::CircularBuffer,
    ];
    for kind in whole_sequence {
        assert!(!kind.frees_skipped_blocks(), "{kind:?}");
        let mut pool = BlockPool::new(40, true, 2, false).unwrap();
        let m = manager(kind, 2, &mut pool);
        let mut rb = RequestBlocks::default();
        pool.get_new_blocks_into(16, &mut rb.table).unwrap();
        let (ids, free) = (rb.table.clone(), pool.num_free_blocks());
        for n in 0..=64 {
            for prompt in [None, Some(3), Some(n)] {
                m.remove_skipped_blocks(&mut rb, n, prompt, &mut pool)
                    .unwrap();
                assert_eq!(
                    (&rb.table, pool.num_free_blocks()),
                    (&ids, free),
                    "{kind:?} n={n}"
                );
            }
        }
    }
    for kind in [SW4, AttentionKind::Rswa { rswa_window: 8 }] {
        assert!(kind.frees_skipped_blocks(), "{kind:?}");
    }
}

/// The types that count and allocate by the common rules (the coordinator then skips
/// the per-type dispatch) give, through that dispatch, the common count and the same
/// allocation, at every length, held table and prefill end; each type outside them
/// departs from the common rules somewhere.
#[test]
fn common_rule_types_count_and_allocate_as_dispatched() {
    let common = [
        AttentionKind::FullAttention,
        AttentionKind::SinkFullAttention { sink_len: 4 },
        AttentionKind::Rswa { rswa_window: 8 },
        SW4,
        AttentionKind::ChunkedLocal {
            attention_chunk_size: 8,
        },
    ];
    for kind in common {
        assert!(kind.allocates_by_common_rules(), "{kind:?}");
        for held in 0..4 {
            for n in held * 2..=24 {
                for end in [0, n, 30] {
                    let mut pool = BlockPool::new(64, true, 2, false).unwrap();
                    let m = manager(kind, 2, &mut pool);
                    let mut rb = RequestBlocks::default();
                    pool.get_new_blocks_into(held, &mut rb.table).unwrap();
                    let total = held * 2;
                    for cap in [false, true] {
                        assert_eq!(
                            m.get_num_blocks_to_allocate(
                                &rb,
                                n,
                                n,
                                end,
                                &[],
                                total,
                                total,
                                cap,
                                &pool
                            ),
                            m.num_blocks_by_common_rules(&rb, n, &[], total, total, cap, &pool),
                            "{kind:?} held={held} n={n} end={end}"
                        );
                    }
                    let (mut m2, mut rb2, mut pool2) = (m.clone(), rb.clone(), pool.clone());
                    let mut m = m;
                    let a = m.allocate_new_blocks(&mut rb, "r", n, total, n, end, &mut pool);
                    let b = m2.allocate_by_common_rules(&mut rb2, n, &mut pool2);
                    assert_eq!(a.unwrap(), b.unwrap(), "{kind:?}");
                    assert_eq!(
                        (&rb.table, pool.num_free_blocks()),
                        (&rb2.table, pool2.num_free_blocks()),
                        "{kind:?} held={held} n={n} end={end}"
                    );
                }
            }
        }
    }
    // Outside: encoder tokens, Mamba's own counts (align mode's state blocks; both
    // modes defer a hit cached this step), a ring of one block.
    assert!(AttentionKind::CrossAttention.counts_encoder_tokens());
    let others = [
        AttentionKind::Mamba {
            num_speculative_blocks: 0,
            align: true,
            checkpoint_alignment: None,
        },
        AttentionKind::CircularBuffer,
    ];
    for kind in others.into_iter().chain([AttentionKind::CrossAttention]) {
        assert!(!kind.allocates_by_common_rules(), "{kind:?}");
    }
    for kind in others {
        let mut pool = BlockPool::new(64, true, 2, false).unwrap();
        let m = manager(kind, 2, &mut pool);
        let rb = RequestBlocks::default();
        assert!(
            (1..=24).any(
                |n| m.get_num_blocks_to_allocate(&rb, n, n, 0, &[], 0, 0, false, &pool)
                    != m.num_blocks_by_common_rules(&rb, n, &[], 0, 0, false, &pool)
            ),
            "{kind:?}"
        );
    }
}

/// vLLM 0.33's `test_rswa_remove_skipped_blocks_gap_range` (bs 4, window 8, prompt
/// 16): nothing without the prompt length; then the gap block 4, then 5 and 6, freed
/// highest first and stopping at the block already nulled.
#[test]
fn rswa_removes_the_gap_after_the_prompt() {
    let mut pool = BlockPool::new(20, true, 4, false).unwrap();
    let m = manager(AttentionKind::Rswa { rswa_window: 8 }, 4, &mut pool);
    let mut rb = RequestBlocks::default();
    pool.get_new_blocks_into(10, &mut rb.table).unwrap();
    let ids = rb.table.clone();
    m.remove_skipped_blocks(&mut rb, 28, None, &mut pool)
        .unwrap();
    assert_eq!(rb.table, ids);
    m.remove_skipped_blocks(&mut rb, 28, Some(16), &mut pool)
        .unwrap();
    let mut want = ids.clone();
    want[4] = NULL_BLOCK_ID;
    assert_eq!(rb.table, want);
    m.remove_skipped_blocks(&mut rb, 36, Some(16), &mut pool)
        .unwrap();
    want[5] = NULL_BLOCK_ID;
    want[6] = NULL_BLOCK_ID;
    assert_eq!(rb.table, want);
    let head: Vec<_> = pool.free_block_ids().take(3).collect();
    assert_eq!(head, vec![ids[6], ids[5], ids[4]]);
}

/// Section 4.10: chunked local keeps only the current chunk (bs 2, chunk 4).
#[test]
fn chunked_local_remove_skipped_blocks() {
    let mut pool = BlockPool::new(20, true, 2, false).unwrap();
    let kind = AttentionKind::ChunkedLocal {
        attention_chunk_size: 4,
    };
    let m = manager(kind, 2, &mut pool);
    let mut rb = RequestBlocks::default();
    pool.get_new_blocks_into(8, &mut rb.table).unwrap();
    let nulls = |rb: &RequestBlocks| rb.table.iter().take_while(|&&b| b == 0).count();
    for (n, want) in [(4, 2), (6, 2), (12, 6)] {
        m.remove_skipped_blocks(&mut rb, n, None, &mut pool)
            .unwrap();
        assert_eq!(nulls(&rb), want, "n = {n}");
    }
}

/// Section 4.2 (`test_get_num_blocks_to_allocate`): evictable hits count.
#[test]
fn blocks_to_allocate_counts_evictable_hits() {
    let mut pool = BlockPool::new(100, true, 2, false).unwrap();
    let m = manager(SW4, 2, &mut pool);
    let real = pool.get_new_blocks(10).unwrap();
    pool.free_blocks(real.iter().copied()).unwrap();
    let mut hits = vec![NULL_BLOCK_ID; 5];
    hits.extend_from_slice(&real[..5]);
    let rb = RequestBlocks::default();
    assert_eq!(
        m.get_num_blocks_to_allocate(&rb, 40, 40, 0, &hits, 0, 0, false, &pool),
        15
    );
    assert_eq!(
        m.get_num_blocks_to_allocate(&rb, 40, 40, 0, &real, 0, 0, false, &pool),
        20
    );
}

/// Specs map to managers; equal specs share a lookup class; events get the spec kind.
#[test]
fn params_from_config() {
    use crate::config::{KvCacheConfig, KvCacheGroupSpec};
    use crate::spec::{AttentionParams, Dtype, FullAttentionSpec, SlidingWindowSpec};
    let attn = |heads| AttentionParams::new(16, heads, 64, Dtype::Float16);
    let full = KvCacheSpec::from(FullAttentionSpec::new(attn(2)))
        .build()
        .unwrap();
    let swa = |heads| {
        KvCacheSpec::from(SlidingWindowSpec {
            attn: attn(heads),
            sliding_window: 32,
            extra_retained_tokens: 0,
        })
        .build()
        .unwrap()
    };
    let group =
        |name: &str, spec: KvCacheSpec| KvCacheGroupSpec::new(vec![name.into()], spec, false);
    let cfg = KvCacheConfig::new(
        10,
        vec![],
        vec![
            group("a", full),
            group("b", swa(2)),
            group("c", swa(2)),
            group("d", swa(4)),
        ],
        None,
    )
    .unwrap();
    let params = ManagerParams::from_config(&cfg).unwrap();
    let classes: Vec<_> = params.iter().map(|p| p.spec_class).collect();
    assert_eq!(classes, vec![0, 1, 1, 3]);
    assert_eq!(params[0].kind, AttentionKind::FullAttention);
    assert_eq!(params[1].spec_kind, "sliding_window");
    assert_eq!(params[1].event_sliding_window, Some(32));
    assert_eq!(
        params[3].kind,
        AttentionKind::SlidingWindow {
            sliding_window: 32,
            extra_retained_tokens: 0
        }
    );
}
