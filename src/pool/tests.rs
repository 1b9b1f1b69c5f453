//! Unit tests of the block pool: free order, hits, bad frees, events, invariants, null-block
//! refs, retention fields and unhashed ids, driven directly.

use super::*;
use crate::events::event::{KvCacheEvent, TokensOnly};

fn h(i: u8) -> BlockHash {
    BlockHash::from_slice(&[i; 32]).unwrap()
}

fn queue(p: &BlockPool) -> Vec<BlockId> {
    p.free_block_ids().collect()
}

const NO_TOKENS: TokensOnly<'static> = TokensOnly(&[]);

/// Section 3.9, trace A (vLLM's `test_prefill`), driven at the pool level.
#[test]
fn trace_a_free_order_is_vllm_033() {
    let mut p = BlockPool::new(11, true, 16, false).unwrap();
    let req0 = p.get_new_blocks(4).unwrap();
    assert_eq!(req0, vec![1, 2, 3, 4]);
    let hashes = [h(0), h(1), h(2)];
    p.cache_full_blocks(&hashes, &req0, 0, 3, 16, 0, None, &NO_TOKENS)
        .unwrap();
    let hit: Vec<_> = hashes
        .iter()
        .map(|x| p.cached_block(x, 0).unwrap())
        .collect();
    assert_eq!(hit, vec![1, 2, 3]);
    p.touch(&hit).unwrap();
    assert_eq!(p.ref_cnt(1).unwrap(), 2);
    let req1_new = p.get_new_blocks(1).unwrap();
    assert_eq!(req1_new, vec![5]);
    p.free_blocks(req0.iter().rev().copied()).unwrap();
    let req1 = [1, 2, 3, 5];
    p.free_blocks(req1.iter().rev().copied()).unwrap();
    assert_eq!(queue(&p), vec![5, 4, 6, 7, 8, 9, 10, 3, 2, 1]);
    assert_eq!(p.num_free_blocks(), 10);
}

/// Section 3.9, trace B: a touched hit leaves the queue; the next allocation evicts the
/// other cached block instead.
#[test]
fn trace_b_hits_are_not_evicted() {
    let mut p = BlockPool::new(3, true, 16, true).unwrap();
    let a = p.get_new_blocks(1).unwrap();
    p.cache_full_blocks(&[h(1)], &a, 0, 1, 16, 0, None, &NO_TOKENS)
        .unwrap();
    let b = p.get_new_blocks(1).unwrap();
    p.cache_full_blocks(&[h(2)], &b, 0, 1, 16, 0, None, &NO_TOKENS)
        .unwrap();
    assert_eq!((a[0], b[0]), (1, 2));
    p.free_blocks([1]).unwrap();
    p.free_blocks([2]).unwrap();
    assert_eq!(queue(&p), vec![1, 2]);
    p.take_events();
    p.touch(&[1]).unwrap();
    assert_eq!(p.get_new_blocks(1).unwrap(), vec![2]);
    assert_eq!(p.cached_block(&h(2), 0), None);
    assert_eq!(
        p.take_events(),
        vec![KvCacheEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![h(2).external()],
            medium: MEDIUM_GPU,
            group_idx: 0
        })]
    );
}

#[test]
fn caching_off_prepends_everything() {
    let mut p = BlockPool::new(6, false, 16, false).unwrap();
    let t = p.get_new_blocks(3).unwrap();
    p.free_blocks(t.iter().rev().copied()).unwrap();
    assert_eq!(queue(&p), vec![3, 2, 1, 4, 5]);
    assert_eq!(p.get_new_blocks(3).unwrap(), vec![3, 2, 1]);
}

#[test]
fn bad_frees_change_nothing() {
    let mut p = BlockPool::new(6, true, 16, false).unwrap();
    let t = p.get_new_blocks(2).unwrap();
    let before = queue(&p);
    // 1 is held once: freeing it twice in one call underflows on the second occurrence.
    assert_eq!(p.free_blocks([2, 1, 1]), Err(KvError::DoubleFree(1)));
    assert!(matches!(
        p.free_blocks([2, 9]),
        Err(KvError::BlockOutOfRange { .. })
    ));
    assert_eq!(queue(&p), before);
    assert_eq!((p.ref_cnt(1).unwrap(), p.ref_cnt(2).unwrap()), (1, 1));
    p.free_blocks([0, 2, 1]).unwrap();
    assert_eq!(queue(&p), vec![2, 1, 3, 4, 5]);
    assert_eq!(p.free_blocks(t.clone()), Err(KvError::DoubleFree(t[0])));
    assert!(p.get_new_blocks(6).is_err());
    assert_eq!(p.num_free_blocks(), 5);
}

#[test]
fn duplicate_hashes_and_eviction_events() {
    let mut p = BlockPool::new(8, true, 4, true).unwrap();
    let a = p.get_new_blocks(2).unwrap();
    let b = p.get_new_blocks(2).unwrap();
    let hs = [h(1), h(2)];
    p.cache_full_blocks(&hs, &a, 0, 2, 4, 0, None, &TokensOnly(&[9; 8]))
        .unwrap();
    p.cache_full_blocks(&hs, &b, 1, 2, 4, 0, None, &TokensOnly(&[9; 8]))
        .unwrap();
    assert_eq!(p.cached_block(&h(2), 0), Some(a[1]));
    assert_eq!(p.num_cached_keys(), 2);
    let ev = p.take_events();
    let KvCacheEvent::BlockStored(s) = &ev[1] else {
        panic!("expected BlockStored, got {ev:?}")
    };
    assert_eq!(s.parent_block_hash, Some(h(1).external()));
    assert_eq!(s.token_ids, vec![9; 4]);
    assert_eq!(s.extra_keys, Some(vec![None]));
    p.evict_blocks(&[a[1]]).unwrap();
    assert_eq!(p.cached_block(&h(2), 0), Some(b[1]));
    assert!(p.evict_blocks(&[1, 99]).is_err());
    assert_eq!(
        p.cached_block(&h(1), 0),
        Some(a[0]),
        "a failed evict evicts nothing"
    );
    assert!(!p.reset_prefix_cache());
    p.free_blocks(a.iter().chain(&b).copied()).unwrap();
    assert!(p.reset_prefix_cache());
    assert_eq!(p.num_cached_keys(), 0);
    assert_eq!(p.block_hash(b[1]).unwrap(), None);
    assert_eq!(
        p.take_events().last(),
        Some(&KvCacheEvent::AllBlocksCleared)
    );
}

#[test]
fn group_view_uses_last_hash_of_each_big_block() {
    let mut p = BlockPool::new(8, true, 16, false).unwrap();
    let blocks = p.get_new_blocks(2).unwrap();
    let hs = [h(1), h(2), h(3), h(4)];
    p.cache_full_blocks(&hs, &blocks, 0, 2, 32, 1, None, &NO_TOKENS)
        .unwrap();
    assert_eq!(p.get_cached_block(&h(2), &[1]), Some(vec![blocks[0]]));
    assert_eq!(p.get_cached_block(&h(4), &[1]), Some(vec![blocks[1]]));
    assert_eq!(p.get_cached_block(&h(4), &[0, 1]), None);
    assert!(p
        .cache_full_blocks(&hs, &blocks, 0, 3, 32, 1, None, &NO_TOKENS)
        .is_err());
}

/// `check_invariants` accepts every state the public API reaches and names a corrupted one.
#[test]
fn check_invariants_detects_corruption() {
    let mut p = BlockPool::new(6, true, 16, false).unwrap();
    let blocks = p.get_new_blocks(3).unwrap();
    p.cache_full_blocks(&[h(0), h(1)], &blocks, 0, 2, 16, 0, None, &NO_TOKENS)
        .unwrap();
    p.free_blocks(blocks.iter().rev().copied()).unwrap();
    assert_eq!(p.check_invariants(), Ok(()));

    let mut leaked = p.clone();
    leaked.ref_cnt[4] = 1; // referenced yet still linked in the free queue
    assert!(leaked.check_invariants().unwrap_err().contains("block 4"));

    let mut stale = p.clone();
    stale.hash_of[5] = Some(HashKey {
        hash: h(9),
        group: 0,
    });
    assert!(stale.check_invariants().is_err());

    let mut null = p.clone();
    null.ref_cnt[0] = 1;
    assert!(null.check_invariants().is_err());
}

/// Regression (found by tests/core/test_no_panic.py): a pool too large for memory is an error,
/// not an allocation-failure abort of the process.
#[test]
fn unallocatable_pool_is_an_error() {
    // ~190 GB of block rows: more than any test machine's memory and swap.
    let err = BlockPool::new((u32::MAX - 8) as usize, true, 16, false).unwrap_err();
    assert!(matches!(err, KvError::InvalidArgument(_)));
}

/// Regression (found by the `pool_ops` fuzz target): a block listed twice in the range to
/// cache was cached under two keys while carrying one, leaving a stale prefix-cache entry
/// that would later hand the block to a request with other content. It is now an error
/// that changes nothing.
#[test]
fn caching_a_block_twice_in_one_call_is_an_error() {
    let mut p = BlockPool::new(6, true, 16, true).unwrap();
    let blocks = p.get_new_blocks(2).unwrap();
    let dup = [blocks[0], blocks[1], blocks[0]];
    let before = p.clone();
    let err = p.cache_full_blocks(&[h(0), h(1), h(2)], &dup, 0, 3, 16, 0, None, &NO_TOKENS);
    assert!(matches!(err, Err(KvError::InvalidArgument(_))));
    assert_eq!(p.check_invariants(), Ok(()));
    assert_eq!(p.num_cached_keys(), 0);
    assert!((0..6).all(|b| p.block_hash(b).unwrap() == before.block_hash(b).unwrap()));
    assert!(p.take_events().is_empty());
    // The same blocks listed once still cache.
    p.cache_full_blocks(&[h(0), h(1)], &blocks, 0, 2, 16, 0, None, &NO_TOKENS)
        .unwrap();
    assert_eq!(p.check_invariants(), Ok(()));
    assert_eq!(p.cached_block(&h(1), 0), Some(blocks[1]));
}

/// vLLM 0.33 partial entries (`cache_partial_block`): a hashed partial block is appended
/// on free, promoted (old key removed) by `cache_full_blocks`, then kept as an extra key;
/// eviction removes every key.
#[test]
fn partial_entries_promote_and_evict_all_keys() {
    let mut p = BlockPool::new(6, true, 16, true).unwrap();
    let hashes = [h(0), h(1), h(2), h(3)];
    let b = p.get_new_blocks(2).unwrap();
    // Block b[1] covers tokens 32..64; the prompt's last hash boundary is 48.
    p.cache_partial_block(&hashes, b[1], 48, 0, &NO_TOKENS)
        .unwrap();
    assert_eq!(p.cached_block(&hashes[2], 0), Some(b[1]));
    p.cache_partial_block(&hashes, b[1], 48, 0, &NO_TOKENS)
        .unwrap();
    assert_eq!(
        p.take_events().len(),
        1,
        "an existing entry is not re-announced"
    );
    p.cache_full_blocks(&hashes, &b, 0, 2, 32, 0, None, &NO_TOKENS)
        .unwrap();
    let ev = p.take_events();
    assert!(
        matches!(&ev[0], KvCacheEvent::BlockRemoved(r) if r.block_hashes == [hashes[2].external()])
    );
    assert!(matches!(&ev[1], KvCacheEvent::BlockStored(s) if s.block_hashes.len() == 2));
    assert_eq!(p.cached_block(&hashes[2], 0), None);
    p.cache_partial_block(&hashes, b[1], 48, 0, &NO_TOKENS)
        .unwrap();
    assert_eq!(p.cached_block(&hashes[2], 0), Some(b[1]), "an extra key");
    assert_eq!(p.block_hash(b[1]).unwrap().unwrap().hash, hashes[3]);
    p.free_blocks(b.iter().rev().copied()).unwrap();
    assert_eq!(&queue(&p)[3..], &[b[1], b[0]], "hashed blocks are appended");
    p.take_events();
    p.evict_blocks(&[b[1]]).unwrap();
    assert_eq!(p.take_events().len(), 2, "primary and extra key removed");
    assert_eq!(p.num_cached_keys(), 1);
}

mod retention {
    use super::*;
    use crate::pool::RetentionPolicy;

    /// A pool of `n` blocks under `policy`, with `k` cached blocks (hashes `h(0..k)`)
    /// held by the caller.
    fn cached(n: usize, policy: Option<RetentionPolicy>, k: u8) -> (BlockPool, Vec<BlockId>) {
        let mut p = BlockPool::new(n, true, 16, true).unwrap();
        if let Some(policy) = policy {
            p.set_retention(policy).unwrap();
        }
        let blocks = p.get_new_blocks(k as usize).unwrap();
        let hashes: Vec<_> = (0..k).map(h).collect();
        p.cache_full_blocks(&hashes, &blocks, 0, k as usize, 16, 0, None, &NO_TOKENS)
            .unwrap();
        p.take_events();
        (p, blocks)
    }

    fn free_one(
        p: &mut BlockPool,
        b: BlockId,
        class: Option<usize>,
        session: bool,
        tenant: Option<&str>,
    ) {
        if let Some(tag) = p.free_tag_with(class, session, tenant).unwrap() {
            p.set_free_tag(tag);
        }
        p.free_blocks([b]).unwrap();
        p.check_invariants().unwrap();
    }

    #[test]
    fn classes_then_session_lru_within_each() {
        let policy = RetentionPolicy {
            classes: 2,
            session_s: Some(10.0),
            ..Default::default()
        };
        let (mut p, b) = cached(8, Some(policy), 5);
        free_one(&mut p, b[0], Some(1), false, None);
        free_one(&mut p, b[1], None, true, None);
        free_one(&mut p, b[2], Some(0), false, None);
        free_one(&mut p, b[3], Some(1), false, None);
        free_one(&mut p, b[4], Some(0), false, None);
        // Uncached 6, 7 first; class 0 (3, 5); class 1 (1, 4); the session's 2.
        assert_eq!(queue(&p), vec![6, 7, 3, 5, 1, 4, 2]);
        assert_eq!(p.get_new_blocks(4).unwrap(), vec![6, 7, 3, 5]);
    }

    #[test]
    fn ttl_and_session_windows_move_at_the_clock() {
        let policy = RetentionPolicy {
            classes: 2,
            ttl_s: vec![Some(5.0), None],
            session_s: Some(2.0),
            ..Default::default()
        };
        let (mut p, b) = cached(6, Some(policy), 4);
        free_one(&mut p, b[0], Some(1), false, None);
        free_one(&mut p, b[1], Some(0), false, None);
        free_one(&mut p, b[2], None, true, None);
        p.advance_time(1.0).unwrap();
        free_one(&mut p, b[3], Some(0), false, None);
        assert_eq!(queue(&p), vec![5, 2, 4, 1, 3]);
        // The session window ends at 2: block 3 joins class 0 idle since 2.
        p.advance_time(5.0).unwrap();
        // Block 2 (idle since 0) expired at 5: to the tail of the front.
        assert_eq!(queue(&p), vec![5, 2, 4, 3, 1]);
        p.advance_time(7.0).unwrap();
        assert_eq!(queue(&p), vec![5, 2, 4, 3, 1]);
        assert!(p.advance_time(6.0).is_err());
        assert_eq!(p.now(), 7.0);
        p.check_invariants().unwrap();
    }

    #[test]
    fn a_tenant_over_its_quota_loses_its_least_recently_freed_blocks() {
        let policy = RetentionPolicy {
            tenant_quotas: vec![("a".into(), 2)],
            ..Default::default()
        };
        let (mut p, b) = cached(6, Some(policy), 4);
        for &x in &b[..3] {
            free_one(&mut p, x, None, false, Some("a"));
        }
        free_one(&mut p, b[3], None, false, Some("b"));
        assert_eq!(p.tenant_cached_blocks(), vec![("a".to_owned(), 2)]);
        assert_eq!(p.block_hash(b[0]).unwrap(), None);
        let removed: Vec<_> = p.take_events().into_iter().collect();
        assert_eq!(removed.len(), 1);
        // The evicted block is free space at the head; the rest keep LRU order.
        assert_eq!(queue(&p), vec![1, 5, 2, 3, 4]);
    }

    #[test]
    fn a_pinned_block_is_never_evicted_until_unpinned() {
        let (mut p, b) = cached(5, None, 2);
        let key = HashKey {
            hash: h(0),
            group: 0,
        };
        p.pin(&[key, key]);
        p.free_blocks(b.iter().rev().copied()).unwrap();
        assert_eq!(p.ref_cnt(b[0]).unwrap(), 1);
        assert_eq!(p.get_new_blocks(3).unwrap(), vec![3, 4, 2]);
        assert!(p.get_new_blocks(1).is_err());
        p.unpin(&[key]).unwrap();
        assert_eq!(p.num_pinned_blocks(), 1);
        p.unpin(&[key]).unwrap();
        assert_eq!(p.num_pinned_blocks(), 0);
        assert_eq!(queue(&p), vec![1]);
        assert!(matches!(p.unpin(&[key]), Err(KvError::NotPinned(_))));
        // A pin taken before the block is cached holds it once it is.
        let key9 = HashKey {
            hash: h(9),
            group: 0,
        };
        p.pin(&[key9]);
        let x = p.get_new_blocks(1).unwrap();
        p.cache_full_blocks(&[h(9)], &x, 0, 1, 16, 0, None, &NO_TOKENS)
            .unwrap();
        p.free_blocks(x.iter().copied()).unwrap();
        assert_eq!(p.ref_cnt(x[0]).unwrap(), 1);
        p.check_invariants().unwrap();
    }

    #[test]
    fn reset_lets_pins_go_and_keeps_them_registered() {
        let (mut p, b) = cached(4, None, 1);
        p.pin(&[HashKey {
            hash: h(0),
            group: 0,
        }]);
        p.free_blocks(b.iter().copied()).unwrap();
        assert!(p.reset_prefix_cache());
        assert_eq!(p.num_pinned_blocks(), 0);
        assert_eq!(p.num_pinned_keys(), 1);
        assert_eq!(queue(&p), vec![2, 3, 1]);
        p.check_invariants().unwrap();
    }

    #[test]
    fn bad_policies_are_refused() {
        let bad = [
            RetentionPolicy {
                classes: 65,
                ..Default::default()
            },
            RetentionPolicy {
                default_class: 1,
                ..Default::default()
            },
            RetentionPolicy {
                priority_classes: vec![(0, 3)],
                classes: 2,
                ..Default::default()
            },
            RetentionPolicy {
                ttl_s: vec![Some(1.0), None],
                ..Default::default()
            },
            RetentionPolicy {
                ttl_s: vec![Some(-1.0)],
                ..Default::default()
            },
            RetentionPolicy {
                session_s: Some(f64::NAN),
                ..Default::default()
            },
        ];
        for policy in bad {
            let mut p = BlockPool::new(4, true, 16, false).unwrap();
            assert!(p.set_retention(policy).is_err());
        }
        let (mut used, _) = cached(4, None, 1);
        assert!(used.set_retention(RetentionPolicy::default()).is_err());
    }
}

/// vLLM 0.32's null-block counting (`null_block.rs`): touch and free move the count, a
/// failed free leaves it, the null block never enters the queue; off, it stays 0.
#[test]
fn null_block_refs_are_counted_only_when_asked() {
    for counted in [false, true] {
        let mut p = BlockPool::new(6, true, 16, false).unwrap();
        p.set_count_null_block_refs(counted);
        let b = p.get_new_blocks(1).unwrap()[0];
        p.touch(&[NULL_BLOCK_ID, NULL_BLOCK_ID]).unwrap();
        p.free_blocks([NULL_BLOCK_ID, NULL_BLOCK_ID, NULL_BLOCK_ID, b])
            .unwrap();
        let want = if counted { -1 } else { 0 };
        assert_eq!(p.ref_cnt(NULL_BLOCK_ID).unwrap(), want);
        assert!(p.free_blocks([NULL_BLOCK_ID, b]).is_err());
        assert_eq!(p.ref_cnt(NULL_BLOCK_ID).unwrap(), want);
        assert_eq!(p.num_free_blocks(), 5);
        p.check_invariants().unwrap();
    }
}

#[test]
fn retention_policy_fields_name_the_struct_fields_in_order() {
    let debug = format!("{:?}", crate::pool::RetentionPolicy::default());
    let body = debug
        .strip_prefix("RetentionPolicy { ")
        .and_then(|b| b.strip_suffix(" }"))
        .unwrap();
    let names: Vec<&str> = body
        .split(", ")
        .map(|f| f.split(':').next().unwrap())
        .collect();
    assert_eq!(names, crate::pool::RetentionPolicy::FIELDS);
}

#[test]
fn unhashed_block_ids_keep_nulls_for_one_group_and_drop_them_for_all() {
    let mut p = BlockPool::new(6, true, 16, false).unwrap();
    let blocks = p.get_new_blocks(3).unwrap();
    p.cache_full_blocks(&[h(0)], &blocks[..1], 0, 1, 16, 0, None, &NO_TOKENS)
        .unwrap();
    let group = vec![NULL_BLOCK_ID, blocks[0], blocks[1], blocks[2]];
    assert_eq!(
        p.unhashed_block_ids(&group).unwrap(),
        [NULL_BLOCK_ID, blocks[1], blocks[2]]
    );
    let all = p
        .unhashed_block_ids_all_groups(&[group, vec![blocks[0]]])
        .unwrap();
    assert_eq!(all, [vec![blocks[1], blocks[2]], vec![]]);
    assert!(p.unhashed_block_ids(&[99]).is_err());
}

/// The collector calls of vLLM 0.33's pool: each handed-out block evicted then allocated
/// (caching on), touches without the null block, every block named to `evict_blocks`;
/// nothing recorded before `record_block_metrics` or after a failed call.
#[test]
fn block_metrics_follow_vllm_pool_calls() {
    use BlockMetricsOp::{Accessed, Allocated, Evicted};
    let mut p = BlockPool::new(6, true, 16, false).unwrap();
    p.get_new_blocks(1).unwrap();
    assert!(p.take_block_metrics().is_empty());
    p.record_block_metrics();
    let b = p.get_new_blocks(2).unwrap();
    assert_eq!(b, vec![2, 3]);
    p.touch(&[NULL_BLOCK_ID, 2]).unwrap();
    p.evict_blocks(&[3, 1]).unwrap();
    assert!(p.get_new_blocks(9).is_err());
    assert!(p.touch(&[99]).is_err());
    assert_eq!(
        p.take_block_metrics(),
        vec![
            (Evicted, 2),
            (Allocated, 2),
            (Evicted, 3),
            (Allocated, 3),
            (Accessed, 2),
            (Evicted, 3),
            (Evicted, 1),
        ]
    );
    assert!(p.take_block_metrics().is_empty());
    let mut off = BlockPool::new(4, false, 16, false).unwrap();
    off.record_block_metrics();
    off.get_new_blocks(2).unwrap();
    assert_eq!(
        off.take_block_metrics(),
        vec![(Allocated, 1), (Allocated, 2)]
    );
}
