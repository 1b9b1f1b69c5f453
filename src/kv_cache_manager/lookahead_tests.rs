//! Multi-module MTP (`num_prefill_lookahead`) and hash lookahead
//! (`num_hash_lookahead_tokens`) through the facade, each against vLLM 0.33.0's rule
//! (`KVCacheCoordinator.get_num_cacheable_tokens`, `BlockPool.cache_full_blocks`).

use super::tests::TestReq;
use super::*;
use crate::attention::{AttentionKind as K, ManagerParams};
use crate::events::event::KvCacheEvent;
use crate::hashing::{hash_block_tokens, BlockHasher, HashAlgo};
use crate::request::{Request, RequestOptions};
use crate::types::KeyValue;

fn full(bs: usize) -> ManagerParams {
    ManagerParams::new(K::FullAttention, bs, 0)
}

fn opts(hash_bs: usize, prefill_lookahead: usize, hash_lookahead: usize) -> ManagerOptions {
    ManagerOptions {
        num_prefill_lookahead: prefill_lookahead,
        num_hash_lookahead_tokens: hash_lookahead,
        ..ManagerOptions::new(8192, hash_bs)
    }
}

/// Prefills `tokens` in one step and frees the request; then the hit of a second
/// request with the same tokens.
fn hit_after_prefill(m: &mut KvCacheManager, tokens: &[u32], hash_bs: usize) -> usize {
    let mut first = TestReq::new("first", tokens.to_vec(), hash_bs);
    assert!(m
        .allocate_slots(&first, &AllocateArgs::new(tokens.len()))
        .unwrap()
        .is_some());
    first.computed = tokens.len();
    m.free("first").unwrap();
    let second = TestReq::new("second", tokens.to_vec(), hash_bs);
    m.get_computed_blocks(&second).unwrap().1
}

/// Unitary: the last `num_prefill_lookahead - 1` computed tokens are not cached.
#[test]
fn mtp_keeps_reprefillable_tokens_out_of_the_cache() {
    let tokens: Vec<u32> = (0..13).collect();
    for (lookahead, hit) in [(0, 12), (1, 12), (2, 12), (3, 8)] {
        let mut m = KvCacheManager::new(vec![full(4)], 16, None, opts(4, lookahead, 0)).unwrap();
        assert_eq!(
            m.coordinator().num_reprefillable_tokens(),
            lookahead.saturating_sub(1)
        );
        assert_eq!(
            hit_after_prefill(&mut m, &tokens, 4),
            hit,
            "lookahead {lookahead}"
        );
    }
}

/// Hybrid: an EAGLE group caches one group block past the scheduler-aligned finalized
/// prefix, within the finalized tokens; a group without EAGLE keeps the aligned count.
#[test]
fn mtp_hybrid_cacheable_tokens() {
    let groups = || vec![full(8), ManagerParams::new(K::FullAttention, 4, 1)];
    let build = |use_eagle: bool, lookahead: usize| {
        let o = ManagerOptions {
            use_eagle,
            ..opts(4, lookahead, 0)
        };
        KvCacheManager::new(groups(), 32, None, o).unwrap()
    };
    // (use_eagle, lookahead, computed) -> per group.
    for (eagle, la, n, want) in [
        (true, 0, 21, [21, 20]),
        (true, 3, 21, [19, 19]),
        (true, 3, 17, [15, 12]),
        (true, 3, 9, [7, 4]),
        (true, 3, 7, [0, 0]),
        (false, 3, 21, [16, 16]),
    ] {
        let m = build(eagle, la);
        let got = [0, 1].map(|g| m.coordinator().num_cacheable_tokens(n, g));
        assert_eq!(got, want, "eagle {eagle} lookahead {la} computed {n}");
    }
}

/// vLLM's ValueError: with caching and an EAGLE group, the scheduler block must hold
/// the prefill lookahead.
#[test]
fn mtp_lookahead_past_the_scheduler_block_is_rejected() {
    let build = |use_eagle: bool, enable_caching: bool, lookahead: usize| {
        let o = ManagerOptions {
            use_eagle,
            enable_caching,
            ..opts(4, lookahead, 0)
        };
        KvCacheManager::new(vec![full(4)], 16, None, o)
    };
    let err = build(true, true, 5).unwrap_err();
    assert!(err.to_string().contains("Multi-module MTP"), "{err}");
    assert!(build(true, true, 4).is_ok());
    assert!(build(false, true, 5).is_ok());
    assert!(build(true, false, 5).is_ok());
    let mut flagged = full(4);
    flagged.is_eagle_group = true;
    let o = opts(4, 5, 0);
    assert!(KvCacheManager::new(vec![flagged], 16, None, o).is_err());
}

/// `BlockStored` carries each block's lookahead tokens and the extra keys its hash
/// covers, from which the request's hashes rebuild (vLLM's
/// `test_kv_events_reconstruct_lookahead_block_hashes`).
#[test]
fn hash_lookahead_events_rebuild_the_hashes() {
    for la in [1usize, 2] {
        let bs = 2;
        let o = ManagerOptions {
            enable_kv_cache_events: true,
            ..opts(bs, 0, la)
        };
        let mut m = KvCacheManager::new(vec![full(bs)], 20, None, o).unwrap();
        let tokens: Vec<u32> = (0..(2 * bs + la) as u32).collect();
        let hasher = BlockHasher::new(bs, HashAlgo::Sha256)
            .unwrap()
            .with_lookahead(la);
        let r = Request::new("r", tokens.clone(), Some(hasher), RequestOptions::default()).unwrap();
        assert_eq!(r.block_hashes().len(), 2);
        assert!(m
            .allocate_slots(&r, &AllocateArgs::new(tokens.len()))
            .unwrap()
            .is_some());
        let events = m.take_events();
        let [KvCacheEvent::BlockStored(e)] = events.as_slice() else {
            panic!("one BlockStored expected, got {events:?}");
        };
        assert_eq!(e.token_ids, vec![0, 1, 2, 3]);
        let ends = [2usize, 4];
        let want: Vec<Vec<u32>> = ends.iter().map(|&e| tokens[e..e + la].to_vec()).collect();
        assert_eq!(e.lookahead_token_ids.as_ref(), Some(&want));
        let extra = e.extra_keys.as_ref().expect("one entry per block");
        let mut parent = None;
        for (i, (keys, ahead)) in extra.iter().zip(&want).enumerate() {
            assert_eq!(keys, &None);
            let mut k = vec![KeyValue::None];
            k.extend(ahead.iter().map(|&t| KeyValue::Int(t.into())));
            let h = hash_block_tokens(
                HashAlgo::Sha256,
                parent.as_ref(),
                &e.token_ids[i * bs..(i + 1) * bs],
                Some(&k),
            );
            assert_eq!(h, r.block_hashes()[i]);
            parent = Some(h);
        }
    }
}

/// Without hash lookahead the events carry no lookahead tokens.
#[test]
fn no_hash_lookahead_no_lookahead_token_ids() {
    let o = ManagerOptions {
        enable_kv_cache_events: true,
        ..opts(4, 0, 0)
    };
    let mut m = KvCacheManager::new(vec![full(4)], 16, None, o).unwrap();
    let r = TestReq::new("r", (0..9).collect(), 4);
    assert!(m
        .allocate_slots(&r, &AllocateArgs::new(9))
        .unwrap()
        .is_some());
    let events = m.take_events();
    let [KvCacheEvent::BlockStored(e)] = events.as_slice() else {
        panic!("one BlockStored expected, got {events:?}");
    };
    assert_eq!(e.lookahead_token_ids, None);
}
