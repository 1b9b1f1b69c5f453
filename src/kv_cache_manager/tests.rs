//! Worked examples, each verified against vLLM 0.33.0: pool order, every attention type,
//! the hybrid hit search, scheduler and hash block sizes, and `allocate_slots`, driven
//! through the facade.

use super::*;
use crate::attention::{AttentionKind as K, ManagerParams, RequestView};
use crate::events::event::{EventExtraKeys, StoredBlockSource};
use crate::request::Request;
use crate::types::{BlockHash, NULL_BLOCK_ID};

/// A request with a toy hash chain (equal prefixes give equal hashes).
pub(crate) struct TestReq {
    id: String,
    tokens: Vec<u32>,
    prompt: usize,
    pub(crate) computed: usize,
    hash_bs: usize,
    hashes: Vec<BlockHash>,
    pub(crate) preemptions: usize,
}

impl TestReq {
    pub(crate) fn new(id: &str, tokens: Vec<u32>, hash_bs: usize) -> Self {
        let mut r = Self {
            id: id.into(),
            prompt: tokens.len(),
            tokens,
            computed: 0,
            hash_bs,
            hashes: Vec::new(),
            preemptions: 0,
        };
        r.rehash();
        r
    }

    fn rehash(&mut self) {
        while (self.hashes.len() + 1) * self.hash_bs <= self.tokens.len() {
            let i = self.hashes.len();
            let mut x: u64 = self.hashes.last().map_or(0x9e37, |h| h.external());
            for &t in &self.tokens[i * self.hash_bs..(i + 1) * self.hash_bs] {
                x = (x ^ u64::from(t))
                    .wrapping_mul(0x100_0000_01b3)
                    .rotate_left(17);
            }
            let mut b = [0u8; 32];
            b[24..].copy_from_slice(&x.to_be_bytes());
            self.hashes.push(BlockHash::from_slice(&b).unwrap());
        }
    }

    pub(crate) fn append(&mut self, t: u32) {
        self.tokens.push(t);
        self.rehash();
    }
}

impl StoredBlockSource for TestReq {
    fn token_ids(&self) -> &[u32] {
        &self.tokens
    }
    fn event_extra_keys(&self, _start: usize, _end: usize) -> EventExtraKeys {
        None
    }
}

impl RequestView for TestReq {
    fn request_id(&self) -> &str {
        &self.id
    }
    fn num_tokens(&self) -> usize {
        self.tokens.len()
    }
    fn num_prompt_tokens(&self) -> usize {
        self.prompt
    }
    fn num_computed_tokens(&self) -> usize {
        self.computed
    }
    fn block_hashes(&self) -> &[BlockHash] {
        &self.hashes
    }
    fn num_preemptions(&self) -> usize {
        self.preemptions
    }
}

fn toks(start: u32, n: usize) -> Vec<u32> {
    (start..start + n as u32).collect()
}

fn full(bs: usize) -> ManagerParams {
    ManagerParams::new(K::FullAttention, bs, 0)
}

fn swa(bs: usize, window: usize, class: usize) -> ManagerParams {
    ManagerParams::new(
        K::SlidingWindow {
            sliding_window: window,
            extra_retained_tokens: 0,
        },
        bs,
        class,
    )
}

fn mgr(groups: Vec<ManagerParams>, n: usize, hash_bs: usize) -> KvCacheManager {
    KvCacheManager::new(groups, n, None, ManagerOptions::new(8192, hash_bs)).unwrap()
}

fn queue(m: &KvCacheManager) -> Vec<BlockId> {
    m.pool().free_block_ids().collect()
}

type Tables = Vec<Vec<BlockId>>;

/// `get_computed_blocks` then `allocate_slots` for the rest of the prompt, as the
/// scheduler admits a waiting request; returns (hit blocks, hit, new blocks).
fn admit(m: &mut KvCacheManager, r: &mut TestReq) -> (Tables, usize, Option<Tables>) {
    let (hits, n) = m.get_computed_blocks(r).unwrap();
    let mut args = AllocateArgs::new(r.num_tokens() - n);
    args.num_new_computed_tokens = n;
    args.new_computed_blocks = Some(&hits);
    let new = m.allocate_slots(r, &args).unwrap();
    if new.is_some() {
        r.computed = r.num_tokens();
    }
    (hits.clone(), n, new)
}

/// `allocate_slots` for `n` new tokens; on success the request has computed them.
pub(crate) fn step(m: &mut KvCacheManager, r: &mut TestReq, n: usize) -> Option<Vec<Vec<BlockId>>> {
    let new = m.allocate_slots(r, &AllocateArgs::new(n)).unwrap();
    if new.is_some() {
        r.computed += n;
    }
    new
}

/// Section 3.9 trace A (`test_prefill`): ids, shared hits, the 0.33 free order, reuse.
#[test]
fn trace_a_prefill_hits_and_free_order() {
    let mut m = mgr(vec![full(16)], 11, 16);
    let common = toks(0, 48);
    let mut r0 = TestReq::new("0", [common.clone(), toks(100, 7)].concat(), 16);
    let (_, hit, new) = admit(&mut m, &mut r0);
    assert_eq!((hit, new), (0, Some(vec![vec![1, 2, 3, 4]])));
    let mut r1 = TestReq::new("1", [common.clone(), toks(200, 5)].concat(), 16);
    let (hits, hit, new) = admit(&mut m, &mut r1);
    assert_eq!(
        (hits, hit, new),
        (vec![vec![1, 2, 3]], 48, Some(vec![vec![5]]))
    );
    assert_eq!(m.pool().ref_cnt(1).unwrap(), 2);
    m.free("0").unwrap();
    m.free("1").unwrap();
    assert_eq!(queue(&m), vec![5, 4, 6, 7, 8, 9, 10, 3, 2, 1]);
    let mut r2 = TestReq::new("2", [common, toks(300, 6)].concat(), 16);
    let (hits, _, new) = admit(&mut m, &mut r2);
    assert_eq!((hits, new), (vec![vec![1, 2, 3]], Some(vec![vec![5]])));
    m.free("2").unwrap();
    let mut r3 = TestReq::new("3", toks(1000, 160), 16);
    let (_, _, new) = admit(&mut m, &mut r3);
    assert_eq!(new, Some(vec![vec![5, 4, 6, 7, 8, 9, 10, 3, 2, 1]]));
    // A second free and a free of an unknown request are no-ops.
    m.free("3").unwrap();
    m.free("3").unwrap();
    m.free("nope").unwrap();
    assert_eq!(m.pool().num_free_blocks(), 10);
}

/// Section 3.9 trace B (`test_computed_blocks_not_evicted`).
#[test]
fn trace_b_hits_are_not_evicted() {
    let mut m = mgr(vec![full(16)], 3, 16);
    let mut r0 = TestReq::new("0", toks(0, 16), 16);
    assert_eq!(admit(&mut m, &mut r0).2, Some(vec![vec![1]]));
    let mut r1 = TestReq::new("1", toks(100, 16), 16);
    assert_eq!(admit(&mut m, &mut r1).2, Some(vec![vec![2]]));
    m.free("0").unwrap();
    m.free("1").unwrap();
    let mut r2 = TestReq::new("2", toks(0, 17), 16);
    let (hits, hit, new) = admit(&mut m, &mut r2);
    assert_eq!((hits, hit, new), (vec![vec![1]], 16, Some(vec![vec![2]])));
}

/// Section 4.8 (bs 4): a 17-token prompt hits 4 blocks, 3 with EAGLE; a 12-token prompt
/// hits only 2 (the last token is always recomputed).
#[test]
fn full_attention_hits_and_eagle_drop() {
    for (eagle, len, want) in [(false, 17, 16), (true, 17, 12), (false, 12, 8)] {
        let mut opts = ManagerOptions::new(1024, 4);
        opts.use_eagle = eagle;
        let mut m = KvCacheManager::new(vec![full(4)], 20, None, opts).unwrap();
        let mut r0 = TestReq::new("0", toks(0, 16), 4);
        admit(&mut m, &mut r0);
        let r1 = TestReq::new("1", toks(0, len), 4);
        let (hits, hit) = m.get_computed_blocks(&r1).unwrap();
        assert_eq!(hit, want, "eagle={eagle} len={len}");
        assert_eq!(hits[0], (1..=(want / 4) as u32).collect::<Vec<_>>());
    }
}

/// Section 4.9 end-to-end (bs 4, sw 8): chunked prefill frees out-of-window blocks
/// before allocating; the free order and the following hit.
#[test]
fn sliding_window_end_to_end() {
    let mut m = mgr(vec![swa(4, 8, 0)], 20, 4);
    let mut r = TestReq::new("a", toks(0, 20), 4);
    assert_eq!(step(&mut m, &mut r, 8), Some(vec![vec![1, 2]]));
    assert_eq!(step(&mut m, &mut r, 8), Some(vec![vec![3, 4]]));
    assert_eq!(step(&mut m, &mut r, 4), Some(vec![vec![5]]));
    assert_eq!(m.get_block_ids("a"), vec![vec![0, 0, 3, 4, 5]]);
    let q = queue(&m);
    assert_eq!(
        &q[q.len() - 2..],
        &[2, 1],
        "hashed 2 then 1 appended, descending"
    );
    r.append(99);
    assert_eq!(step(&mut m, &mut r, 1), Some(vec![vec![6]]));
    assert_eq!(m.get_block_ids("a"), vec![vec![0, 0, 0, 4, 5, 6]]);
    m.free("a").unwrap();
    let q = queue(&m);
    assert_eq!(q[0], 6);
    assert_eq!(&q[q.len() - 2..], &[5, 4]);
    let mut b = TestReq::new("b", [toks(0, 20), toks(500, 3)].concat(), 4);
    let (hits, hit) = m.get_computed_blocks(&b).unwrap();
    assert_eq!((hits[0].clone(), hit), (vec![0, 0, 0, 4, 5], 20));
    let rbs = m.slots.tables_or_empty(None);
    let need = m.coordinator().get_num_blocks_to_allocate(
        rbs,
        23,
        23,
        Some(&hits),
        20,
        0,
        20,
        20,
        false,
        0,
    );
    assert_eq!(need, 3, "1 new + 2 evictable hits");
    admit(&mut m, &mut b);
    assert_eq!(m.get_block_ids("b"), vec![vec![0, 0, 0, 4, 5, 6]]);
}

/// R-SWA through `allocate_slots` (bs 4, window 8, prompt 16): the prompt's blocks stay,
/// and the decode step after 28 computed tokens frees the gap's first block (tokens
/// 16..20), as `rswa_removes_the_gap_after_the_prompt` does given the prompt length; so
/// `allocate_slots` hands the group the request's prompt length.
#[test]
fn rswa_frees_its_gap_through_allocate_slots() {
    let rswa = ManagerParams::new(K::Rswa { rswa_window: 8 }, 4, 0);
    for groups in [vec![rswa.clone()], vec![full(4), rswa]] {
        let g = groups.len() - 1;
        let mut m = mgr(groups, 40, 4);
        let mut r = TestReq::new("a", toks(0, 16), 4);
        step(&mut m, &mut r, 16).unwrap();
        let prompt_blocks = m.get_block_ids("a")[g].clone();
        for t in 0..12 {
            r.append(100 + t);
            step(&mut m, &mut r, 1).unwrap();
        }
        assert_eq!(r.computed, 28);
        let before = m.get_block_ids("a")[g].clone();
        assert!(!before.contains(&NULL_BLOCK_ID), "{before:?}");
        let free = m.pool().num_free_blocks();
        r.append(200);
        step(&mut m, &mut r, 1).unwrap();
        let after = m.get_block_ids("a")[g].clone();
        assert_eq!(after[..4], prompt_blocks[..], "the prompt is kept");
        assert_eq!(after[4], NULL_BLOCK_ID, "{after:?}");
        assert_eq!(after[5..7], before[5..7]);
        assert!(
            m.pool().free_block_ids().any(|b| b == before[4]),
            "the gap block is free"
        );
        // one block freed, one new block per group for token 28
        assert_eq!(m.pool().num_free_blocks(), free + 1 - (g + 1));
    }
}

/// Section 4.10 end-to-end (bs 4, chunk 8): a decode at n = 20 frees 4, 3, 2, 1.
#[test]
fn chunked_local_end_to_end() {
    let g = ManagerParams::new(
        K::ChunkedLocal {
            attention_chunk_size: 8,
        },
        4,
        0,
    );
    let mut m = mgr(vec![g], 20, 4);
    let mut r = TestReq::new("a", toks(0, 20), 4);
    assert_eq!(step(&mut m, &mut r, 20), Some(vec![vec![1, 2, 3, 4, 5]]));
    r.append(7);
    assert_eq!(step(&mut m, &mut r, 1), Some(vec![vec![6]]));
    assert_eq!(m.get_block_ids("a"), vec![vec![0, 0, 0, 0, 5, 6]]);
    // 4, 3, 2, 1 were hashed: appended in that (descending) order.
    assert_eq!(&queue(&m)[queue(&m).len() - 4..], &[4, 3, 2, 1]);
}

/// Section 4.12: cross-attention allocates once for the encoder tokens; with caching
/// off, everything is prepended on free.
#[test]
fn cross_attention_encoder_blocks() {
    let groups = vec![full(4), ManagerParams::new(K::CrossAttention, 4, 1)];
    let mut opts = ManagerOptions::new(1024, 4);
    opts.enable_caching = false;
    let mut m = KvCacheManager::new(groups, 12, None, opts).unwrap();
    let mut r = TestReq::new("a", toks(0, 5), 4);
    let mut args = AllocateArgs::new(5);
    args.num_encoder_tokens = 10;
    assert_eq!(
        m.allocate_slots(&r, &args).unwrap(),
        Some(vec![vec![1, 2], vec![3, 4, 5]])
    );
    r.computed = 5;
    for t in 0..4 {
        r.append(t);
    }
    let mut args = AllocateArgs::new(4);
    args.num_encoder_tokens = 10;
    assert_eq!(
        m.allocate_slots(&r, &args).unwrap(),
        Some(vec![vec![6], vec![]])
    );
    assert_eq!(m.get_block_ids("a"), vec![vec![1, 2, 6], vec![3, 4, 5]]);
    m.free("a").unwrap();
    assert_eq!(&queue(&m)[..7], &[5, 4, 3, 6, 2, 1, 7]);
}

/// A one-layer Mamba group in mode "none" with `num_speculative_blocks`.
fn mamba_none(block_size: usize, num_speculative_blocks: usize) -> ManagerParams {
    ManagerParams::new(
        K::Mamba {
            num_speculative_blocks,
            align: false,
            checkpoint_alignment: None,
        },
        block_size,
        1,
    )
}

/// Section 4.11 (mode "none"): one state block per request plus speculative blocks;
/// nothing is freed while the block covers the context.
#[test]
fn mamba_none_mode_blocks() {
    let mamba = mamba_none(64, 1);
    let mut opts = ManagerOptions::new(64, 16);
    opts.enable_caching = false;
    let mut m = KvCacheManager::new(vec![full(16), mamba], 20, None, opts).unwrap();
    let mut r = TestReq::new("a", toks(0, 40), 16);
    assert_eq!(
        step(&mut m, &mut r, 40),
        Some(vec![vec![1, 2, 3], vec![4, 5]])
    );
    r.append(1);
    assert_eq!(step(&mut m, &mut r, 1), Some(vec![vec![], vec![]]));
    let mut opts = ManagerOptions::new(64, 16);
    opts.enable_caching = true;
    let mamba = mamba_none(64, 0);
    assert!(KvCacheManager::new(vec![full(16), mamba], 20, None, opts).is_err());
}

/// vLLM 0.32's rule (`mamba_none_prefix_caching`): mode "none" with caching caches
/// every full state block; a hit is the last cached one behind nulls, and a hit cached
/// during the step defers the request to the next step.
#[test]
fn mamba_none_mode_prefix_caching() {
    let mamba = mamba_none(64, 0);
    let mut opts = ManagerOptions::new(256, 16);
    opts.mamba_none_prefix_caching = true;
    let mut m = KvCacheManager::new(vec![full(16), mamba], 30, None, opts).unwrap();
    let mut a = TestReq::new("a", toks(0, 130), 16);
    let (_, hit, new) = admit(&mut m, &mut a);
    assert_eq!(hit, 0);
    assert_eq!(new, Some(vec![(1..=9).collect(), vec![10, 11, 12]]));
    let mut b = TestReq::new("b", [toks(0, 128), toks(500, 10)].concat(), 16);
    let (hits, hit, new) = admit(&mut m, &mut b);
    assert_eq!(hit, 128);
    assert_eq!(hits, vec![(1..=8).collect(), vec![NULL_BLOCK_ID, 11]]);
    assert_eq!(new, None);
    m.new_step_starts();
    let (_, hit, new) = admit(&mut m, &mut b);
    assert_eq!(hit, 128);
    assert_eq!(new, Some(vec![vec![13], vec![14]]));
    assert_eq!(m.get_block_ids("b")[1], vec![NULL_BLOCK_ID, 11, 14]);
}

/// Section 5.5 (`test_prefill_hybrid_model`): FA + 2 SWA groups sharing one spec.
#[test]
fn hybrid_full_plus_two_swa() {
    let build = || {
        let mut m = mgr(vec![full(16), swa(16, 32, 1), swa(16, 32, 1)], 40, 16);
        let mut r0 = TestReq::new("0", [toks(0, 48), toks(900, 7)].concat(), 16);
        let (_, _, new) = admit(&mut m, &mut r0);
        assert_eq!(
            new,
            Some(vec![
                vec![1, 2, 3, 4],
                vec![5, 6, 7, 8],
                vec![9, 10, 11, 12]
            ])
        );
        m
    };
    let r1 = TestReq::new("1", [toks(0, 48), toks(700, 7)].concat(), 16);
    let m = build();
    let (hits, hit) = m.get_computed_blocks(&r1).unwrap();
    assert_eq!(
        (hits, hit),
        (vec![vec![1, 2, 3], vec![0, 6, 7], vec![0, 10, 11]], 48)
    );
    let mut m = build();
    m.evict_blocks(&[7, 11]).unwrap();
    let (hits, hit) = m.get_computed_blocks(&r1).unwrap();
    assert_eq!((hits, hit), (vec![vec![1, 2], vec![5, 6], vec![9, 10]], 32));
    let mut m = build();
    m.evict_blocks(&[3, 5, 9]).unwrap();
    assert_eq!(m.get_computed_blocks(&r1).unwrap().1, 0);
}

/// Section 5.5: FA + SW64 + SW32 needs a second pass of the fixed point.
#[test]
fn hybrid_multiple_windows_fixed_point() {
    let mut m = mgr(vec![full(16), swa(16, 64, 1), swa(16, 32, 2)], 40, 16);
    let mut r0 = TestReq::new("0", toks(0, 80), 16);
    let (_, _, new) = admit(&mut m, &mut r0);
    let new = new.unwrap();
    let r1 = TestReq::new("1", toks(0, 80), 16);
    assert_eq!(m.get_computed_blocks(&r1).unwrap().1, 64);
    m.evict_blocks(&[new[2][2]]).unwrap();
    let (hits, hit) = m.get_computed_blocks(&r1).unwrap();
    assert_eq!(hit, 32);
    assert_eq!(hits[0], new[0][..2].to_vec());
}

/// Section 5.6 (`test_different_block_size`): FA bs 32 + SWA bs 16 over H = 16.
#[test]
fn hybrid_different_block_sizes() {
    let mut m = mgr(vec![full(32), swa(16, 32, 1)], 20, 16);
    assert_eq!(m.coordinator().scheduler_block_size(), 32);
    let mut r0 = TestReq::new("0", toks(0, 112), 16);
    let (_, _, new) = admit(&mut m, &mut r0);
    assert_eq!(new, Some(vec![vec![1, 2, 3, 4], (5..=11).collect()]));
    assert_eq!(
        m.pool().num_cached_keys(),
        3 + 6,
        "FA 3 blocks, SWA hashes 0..=5"
    );
    let r1 = TestReq::new("1", toks(0, 113), 16);
    let (hits, hit) = m.get_computed_blocks(&r1).unwrap();
    assert_eq!(
        (hits, hit),
        (vec![vec![1, 2, 3], vec![0, 0, 0, 0, 9, 10]], 96)
    );
    m.evict_blocks(&[10]).unwrap();
    let (hits, hit) = m.get_computed_blocks(&r1).unwrap();
    assert_eq!((hits, hit), (vec![vec![1, 2], vec![0, 0, 7, 8]], 64));
}

/// Section 6.3: lookahead slots enlarge the allocation, capped by max_model_len.
#[test]
fn lookahead_slots() {
    for (new, la, max_len, want) in [(3, 2, 1024, 2), (3, 4, 1024, 2), (17, 8, 20, 5)] {
        let mut m =
            KvCacheManager::new(vec![full(4)], 20, None, ManagerOptions::new(max_len, 4)).unwrap();
        let r = TestReq::new("a", toks(0, new), 4);
        let mut args = AllocateArgs::new(new);
        args.num_lookahead_tokens = la;
        let got = m.allocate_slots(&r, &args).unwrap().unwrap();
        assert_eq!(got[0].len(), want, "{new} + {la} lookahead, max {max_len}");
    }
}

/// Section 6.3: `None` when the blocks do not fit, and the hits are left untouched.
#[test]
fn does_not_fit_leaves_hits_untouched() {
    let mut m = mgr(vec![full(16)], 5, 16);
    let mut r0 = TestReq::new("0", toks(0, 48), 16);
    admit(&mut m, &mut r0);
    m.free("0").unwrap();
    let mut r1 = TestReq::new("1", toks(0, 100), 16);
    let (hits, hit, new) = admit(&mut m, &mut r1);
    assert_eq!((hits, hit, new), (vec![vec![1, 2, 3]], 48, None));
    assert_eq!(m.pool().ref_cnt(1).unwrap(), 0);
    assert_eq!(m.pool().num_free_blocks(), 4);
    assert_eq!(m.get_block_ids("1"), vec![Vec::<BlockId>::new()]);
    assert_eq!(m.num_requests(), 0);
}

/// Bad arguments raise and change nothing.
#[test]
fn bad_arguments_leave_state_unchanged() {
    let mut m = mgr(vec![full(16)], 11, 16);
    let mut r0 = TestReq::new("0", toks(0, 40), 16);
    admit(&mut m, &mut r0);
    let before = (queue(&m), m.get_block_ids("0"));
    assert!(m.allocate_slots(&r0, &AllocateArgs::new(0)).is_err());
    let hits = vec![vec![1]];
    let mut args = AllocateArgs::new(4);
    args.num_new_computed_tokens = 16;
    args.new_computed_blocks = Some(&hits);
    assert!(
        m.allocate_slots(&r0, &args).is_err(),
        "running request with hits"
    );
    let bad = vec![vec![99]];
    let r1 = TestReq::new("1", toks(0, 40), 16);
    args.new_computed_blocks = Some(&bad);
    assert!(m.allocate_slots(&r1, &args).is_err(), "out-of-range hit");
    let two = vec![vec![], vec![]];
    args.new_computed_blocks = Some(&two);
    assert!(m.allocate_slots(&r1, &args).is_err(), "wrong group count");
    assert_eq!(before, (queue(&m), m.get_block_ids("0")));
    assert_eq!(m.num_requests(), 1);
}

/// Section 1.4 admission caps and `full_sequence_must_fit`.
#[test]
fn admission_caps() {
    use crate::attention::{chunked_local, sliding_window};
    assert_eq!(
        sliding_window::max_admission_blocks(4096, 0, 16, 8192, 32768),
        769
    );
    assert_eq!(
        chunked_local::max_admission_blocks(8192, 16, 8192, 32768),
        1024
    );
    let mut opts = ManagerOptions::new(8192, 4);
    opts.max_in_flight_tokens = Some(8);
    let mut m = KvCacheManager::new(vec![swa(4, 8, 0)], 10, None, opts).unwrap();
    let r = TestReq::new("a", toks(0, 400), 4);
    let mut args = AllocateArgs::new(8);
    args.full_sequence_must_fit = true;
    // cap = cdiv(7 + 8, 4) + 1 = 5 blocks <= 9 free, although the prompt needs 100.
    assert_eq!(m.allocate_slots(&r, &args).unwrap(), Some(vec![vec![1, 2]]));
    let mut m = mgr(vec![full(4)], 10, 4);
    assert_eq!(m.allocate_slots(&r, &args).unwrap(), None);
}

/// Stats as vLLM 0.33: recorded only with log_stats, preempted requests apart.
#[test]
fn prefix_cache_stats() {
    let mut opts = ManagerOptions::new(1024, 16);
    opts.log_stats = true;
    let mut m = KvCacheManager::new(vec![full(16)], 11, None, opts).unwrap();
    let mut r = TestReq::new("a", toks(0, 40), 16);
    m.record_prefix_cache_stats(&r, 16);
    r.preemptions = 1;
    m.record_prefix_cache_stats(&r, 32);
    let s = m.make_prefix_cache_stats().unwrap();
    assert_eq!(
        (
            s.requests,
            s.queries,
            s.hits,
            s.preempted_requests,
            s.preempted_hits
        ),
        (1, 40, 16, 1, 32)
    );
    assert!(m.reset_prefix_cache());
    assert!(m.make_prefix_cache_stats().unwrap().reset);
    assert!(mgr(vec![full(16)], 11, 16)
        .make_prefix_cache_stats()
        .is_none());
}

/// Sink groups pre-allocate their sink blocks (seed behaviour).
#[test]
fn sink_blocks_are_preallocated() {
    let sink = ManagerParams::new(K::SinkFullAttention { sink_len: 32 }, 16, 0);
    let mut m = mgr(vec![sink], 11, 16);
    assert_eq!(m.coordinator().managers()[0].sink_blocks(), &[1, 2]);
    let r = TestReq::new("a", toks(0, 20), 16);
    assert_eq!(
        m.allocate_slots(&r, &AllocateArgs::new(20)).unwrap(),
        Some(vec![vec![3, 4]])
    );
    assert_eq!(NULL_BLOCK_ID, 0);
}

/// Section 4.11 align-mode trace (bs 8, a 30-token prompt in chunks 16/8/6, decodes),
/// the later hit, and the same-step deferral of hits on freshly cached states.
#[test]
fn mamba_align_trace() {
    let g = ManagerParams::new(
        K::Mamba {
            num_speculative_blocks: 0,
            align: true,
            checkpoint_alignment: None,
        },
        8,
        0,
    );
    let mut m = mgr(vec![g], 10, 8);
    let mut r = TestReq::new("a", toks(0, 30), 8);
    let mut tables = Vec::new();
    for n in [16, 8, 6] {
        step(&mut m, &mut r, n).unwrap();
        tables.push(m.get_block_ids("a")[0].clone());
    }
    for _ in 0..4 {
        r.append(5);
        step(&mut m, &mut r, 1).unwrap();
        tables.push(m.get_block_ids("a")[0].clone());
    }
    let want: [&[BlockId]; 7] = [
        &[0, 1],
        &[0, 1, 2],
        &[0, 0, 2, 3],
        &[0, 0, 0, 3],
        &[0, 0, 0, 3],
        &[0, 0, 0, 3, 4],
        &[0, 0, 0, 0, 4],
    ];
    assert_eq!(tables, want);
    let b = TestReq::new("b", [toks(0, 30), toks(100, 5)].concat(), 8);
    let (hits, hit) = m.get_computed_blocks(&b).unwrap();
    assert_eq!((hits, hit), (vec![vec![0, 0, 2]], 24));
    // A hit on a state cached during this step waits for the next step.
    let mut c = TestReq::new("c", toks(500, 20), 8);
    step(&mut m, &mut c, 16).unwrap();
    let mut d = TestReq::new("d", toks(500, 20), 8);
    let (hits, hit, new) = admit(&mut m, &mut d);
    assert_eq!((hits[0].len(), hit, new), (2, 16, None));
    m.new_step_starts();
    assert!(admit(&mut m, &mut d).2.is_some());
}

/// An align-mode Mamba manager (bs 8, 12 blocks) with `spec` speculative blocks and,
/// with `checkpoint`, a prefill-checkpoint block aligned to 8 tokens.
fn mamba_align(spec: usize, checkpoint: bool, use_eagle: bool) -> KvCacheManager {
    mamba_align_retained(spec, checkpoint, use_eagle, None)
}

/// [`mamba_align`] under `prefix_cache_retention_interval` `retention`.
fn mamba_align_retained(
    spec: usize,
    checkpoint: bool,
    use_eagle: bool,
    retention: Option<usize>,
) -> KvCacheManager {
    let g = ManagerParams::new(
        K::Mamba {
            num_speculative_blocks: spec,
            align: true,
            checkpoint_alignment: checkpoint.then_some(8),
        },
        8,
        0,
    );
    let mut opts = ManagerOptions::new(8192, 8);
    opts.use_eagle = use_eagle;
    KvCacheManager::new(vec![g], 12, retention, opts).unwrap()
}

/// Boundary offloads as `(request, block, tokens)`.
type Offloads = Vec<(String, BlockId, usize)>;

/// Runs a 30-token prompt in `chunks`, then `decodes` one-token steps; returns the
/// table after each step and the boundary offloads.
fn mamba_steps(m: &mut KvCacheManager, chunks: &[usize], decodes: usize) -> (Tables, Offloads) {
    let mut r = TestReq::new("a", toks(0, 30), 8);
    let mut tables = Vec::new();
    for &n in chunks {
        step(m, &mut r, n).unwrap();
        tables.push(m.get_block_ids("a")[0].clone());
    }
    for _ in 0..decodes {
        r.append(5);
        step(m, &mut r, 1).unwrap();
        tables.push(m.get_block_ids("a")[0].clone());
    }
    let offloads = m
        .take_boundary_offloads()
        .into_iter()
        .map(|o| (o.request_id, o.block, o.num_tokens))
        .collect();
    (tables, offloads)
}

/// Align mode with a speculative block (tables as vLLM 0.33 gives them): a chunk that
/// leaves the speculative block behind moves it to the table's end; every cached state
/// is offered for offload once; a sibling hits the last prompt state.
#[test]
fn mamba_align_speculative_block_moves_to_the_end() {
    let mut m = mamba_align(1, false, false);
    let (tables, offloads) = mamba_steps(&mut m, &[8, 22], 2);
    let want: [&[BlockId]; 4] = [
        &[1, 2],
        &[1, 0, 0, 2, 3],
        &[0, 0, 0, 2, 3],
        &[0, 0, 0, 2, 3],
    ];
    assert_eq!(tables, want);
    assert_eq!(offloads, [("a".into(), 1, 8), ("a".into(), 2, 32)]);
    assert!(m.take_boundary_offloads().is_empty());
    m.new_step_starts();
    let b = TestReq::new("b", [toks(0, 30), toks(100, 5)].concat(), 8);
    assert_eq!(m.get_computed_blocks(&b).unwrap(), (vec![vec![1]], 8));
    assert_eq!(queue(&m), [4, 5, 6, 7, 8, 9, 10, 11, 1]);
    // A freed request's offers are dropped with its blocks.
    let mut c = TestReq::new("c", toks(200, 20), 8);
    step(&mut m, &mut c, 20).unwrap();
    m.free("c").unwrap();
    assert!(m.take_boundary_offloads().is_empty());
}

/// Align mode with a prefill-checkpoint block: the prompt chunk reserves the column
/// before the running state for the state at the checkpoint (EAGLE: one block lower),
/// which is cached there and hit later.
#[test]
fn mamba_align_prefill_checkpoint() {
    for (eagle, spec, first) in [(false, 0, &[0, 1, 2][..]), (true, 1, &[0, 1, 2, 3][..])] {
        let mut m = mamba_align(spec, true, eagle);
        let (tables, offloads) = mamba_steps(&mut m, &[24, 6], 2);
        assert_eq!(tables[0], first, "eagle={eagle}");
        let states: Vec<_> = offloads.iter().map(|o| (o.1, o.2)).collect();
        assert_eq!(states, [(1, 16), (2, 24), (3, 32)], "eagle={eagle}");
        m.new_step_starts();
        let b = TestReq::new("b", [toks(0, 30), toks(100, 5)].concat(), 8);
        assert_eq!(
            m.get_computed_blocks(&b).unwrap(),
            (vec![vec![0, 0, 2]], 24)
        );
    }
}

/// Align mode under sparse retention (vLLM 0.33's `MambaManager.reachable_block_mask`),
/// the 30-token prompt of [`mamba_steps`] in chunks 16/8/6 and 4 decodes: retention 0
/// caches only the state at the replay boundary (29 tokens, floored to 24); an interval
/// of 16 also the last state of every 16-token segment (16, 32), as dense caching here;
/// one of 24 the state at 24 alone. A later prompt sharing 16 tokens hits them only
/// where the state at 16 was cached.
#[test]
fn mamba_align_sparse_retention() {
    type States = &'static [(BlockId, usize)];
    let cases: [(Option<usize>, States, usize); 4] = [
        (None, &[(1, 16), (2, 24), (3, 32)], 16),
        (Some(0), &[(2, 24)], 0),
        (Some(16), &[(1, 16), (2, 24), (3, 32)], 16),
        (Some(24), &[(2, 24)], 0),
    ];
    for (retention, want, hit_16) in cases {
        let mut m = mamba_align_retained(0, false, false, retention);
        let (_, offloads) = mamba_steps(&mut m, &[16, 8, 6], 4);
        let states: Vec<_> = offloads.iter().map(|o| (o.1, o.2)).collect();
        assert_eq!(states, want, "retention {retention:?}");
        m.new_step_starts();
        let b = TestReq::new("b", [toks(0, 30), toks(100, 5)].concat(), 8);
        assert_eq!(m.get_computed_blocks(&b).unwrap().1, 24);
        let c = TestReq::new("c", [toks(0, 16), toks(200, 10)].concat(), 8);
        assert_eq!(
            m.get_computed_blocks(&c).unwrap().1,
            hit_16,
            "{retention:?}"
        );
        assert_eq!(m.pool().check_invariants(), Ok(()));
    }
}

/// Under retention 0 a prefill checkpoint is reserved only on the chunk reaching the
/// prefill's end (vLLM's coordinator passes `prefill_end` then, 0 otherwise): the first
/// 24-token chunk of a 30-token prompt reserves one densely, none under retention 0.
#[test]
fn mamba_retention_zero_reserves_checkpoints_at_the_prefill_end() {
    for (retention, reserved) in [(None, true), (Some(16), true), (Some(0), false)] {
        let mut m = mamba_align_retained(0, true, false, retention);
        let mut r = TestReq::new("a", toks(0, 30), 8);
        let need = |m: &KvCacheManager, r: &TestReq| {
            let end = r.num_prompt_tokens();
            m.get_num_blocks_to_allocate("a", 24, 24, None, 0, 0, 0, false, end)
                .unwrap()
        };
        assert_eq!(need(&m, &r), 1 + isize::from(reserved), "{retention:?}");
        step(&mut m, &mut r, 24).unwrap();
        assert_eq!(
            m.mamba_checkpoint("a", 0).is_some(),
            reserved,
            "{retention:?}"
        );
    }
}

/// `set_retention_interval` after construction: checked as at construction (a multiple
/// of the scheduler block size where a group caches sparsely, else only 0); a refused
/// interval changes nothing, an accepted one is read by the next `cache_blocks`.
#[test]
fn retention_interval_set_after_construction() {
    let mut m = mamba_align(0, false, false);
    assert_eq!(m.coordinator().retention_interval(), None);
    assert!(matches!(
        m.set_retention_interval(Some(12)),
        Err(KvError::InvalidArgument(_))
    ));
    assert_eq!(m.coordinator().retention_interval(), None);
    m.set_retention_interval(Some(0)).unwrap();
    assert_eq!(m.coordinator().retention_interval(), Some(0));
    let (_, offloads) = mamba_steps(&mut m, &[16, 8, 6], 0);
    let states: Vec<_> = offloads.iter().map(|o| (o.1, o.2)).collect();
    assert_eq!(states, [(2, 24)]);
    let mut f = mgr(vec![full(8)], 12, 8);
    assert!(matches!(
        f.set_retention_interval(Some(8)),
        Err(KvError::InvalidArgument(_))
    ));
    assert_eq!(f.coordinator().retention_interval(), None);
    f.set_retention_interval(Some(0)).unwrap();
    assert_eq!(f.coordinator().retention_interval(), Some(0));
}

/// Regression (found by tests/core/test_bad_input.py): a request hashed at another block size
/// than the manager's named other token spans with its hashes, and hit a block holding
/// another request's tokens. With caching on it is now rejected, changing nothing.
#[test]
fn request_hashed_at_another_block_size_is_rejected() {
    use crate::hashing::{BlockHasher, HashAlgo};
    use crate::request::RequestOptions;
    let mut m = mgr(vec![full(4)], 16, 4);
    let at = |id: &str, tokens: Vec<u32>, bs: usize| {
        let hasher = BlockHasher::new(bs, HashAlgo::Sha256).unwrap();
        Request::new(id, tokens, Some(hasher), RequestOptions::default()).unwrap()
    };
    let a = at("a", vec![1, 2, 3, 4, 5], 4);
    assert!(m
        .allocate_slots(&a, &AllocateArgs::new(5))
        .unwrap()
        .is_some());
    let b = at("b", vec![1, 2, 9, 9, 9], 2);
    assert!(m.get_computed_blocks(&b).is_err());
    assert!(m.allocate_slots(&b, &AllocateArgs::new(5)).is_err());
    assert!(m.cache_blocks(&b, 4).is_err());
    assert_eq!(m.coord.pool().num_free_blocks(), 13);
    assert_eq!(m.coord.pool().check_invariants(), Ok(()));
}

/// Regression (found by the `manager_ops` fuzz target): hit tokens passed without hit
/// blocks, on a sliding-window request whose tokens fall out of the window, passed the capacity check and then failed to
/// allocate after freeing the out-of-window blocks. Now rejected before any change.
#[test]
fn hit_tokens_without_hit_blocks_are_rejected() {
    let mut opts = ManagerOptions::new(112, 4);
    opts.enable_caching = false; // the request is never "known": vLLM's new-request count
    let mut m = KvCacheManager::new(vec![swa(4, 8, 0)], 7, None, opts).unwrap();
    let mut r = TestReq::new("r", toks(0, 20), 4);
    assert!(m
        .allocate_slots(&r, &AllocateArgs::new(20))
        .unwrap()
        .is_some());
    r.computed = 20;
    let before = (
        m.get_block_ids("r"),
        m.pool().free_block_ids().collect::<Vec<_>>(),
    );
    let empty = vec![Vec::new()];
    let args = AllocateArgs {
        num_new_computed_tokens: 28,
        new_computed_blocks: Some(&empty),
        num_lookahead_tokens: 7,
        ..AllocateArgs::new(1)
    };
    assert!(matches!(
        m.allocate_slots(&r, &args),
        Err(KvError::InvalidArgument(_))
    ));
    let after = (
        m.get_block_ids("r"),
        m.pool().free_block_ids().collect::<Vec<_>>(),
    );
    assert_eq!(before, after);
}

/// vLLM 0.33 takes hit tokens without `new_computed_blocks` as a hit of no blocks: the
/// request gets new blocks for every token, the claimed ones included, and caches them
/// (here a full-attention group and a sliding window wide enough to skip nothing).
#[test]
fn hit_tokens_without_hit_blocks_allocate_every_block() {
    let mut m = mgr(vec![full(4), swa(4, 16, 0)], 16, 4);
    let r = TestReq::new("r", toks(0, 12), 4);
    let args = AllocateArgs {
        num_new_computed_tokens: 4,
        ..AllocateArgs::new(8)
    };
    let new = m.allocate_slots(&r, &args).unwrap().unwrap();
    assert_eq!(new.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3]);
    assert_eq!(m.get_block_ids("r"), new);
    assert_eq!(m.pool().num_free_blocks(), 16 - 1 - 6);
    let again = TestReq::new("again", toks(0, 12), 4);
    let (hit, n) = m.get_computed_blocks(&again).unwrap();
    assert_eq!((hit[0].len(), n), (2, 8));
}

/// A request's slot hint is only a cache: stale hints (slot freed and reused), two
/// request values with one id, and one request used with two managers all resolve to
/// the slot the id names.
#[test]
fn slot_hints_never_name_another_requests_slot() {
    use crate::hashing::{BlockHasher, HashAlgo};
    use crate::request::RequestOptions;
    let make = |id: &str, t: u32| {
        let hasher = BlockHasher::new(4, HashAlgo::Sha256Cbor).unwrap();
        Request::new(id, vec![t; 6], Some(hasher), RequestOptions::default()).unwrap()
    };
    let mut m = mgr(vec![full(4)], 32, 4);
    let mut other = mgr(vec![full(4)], 32, 4);
    let a = make("a", 1);
    let b = make("b", 2);
    let new = |m: &mut KvCacheManager, r: &Request, n| {
        m.allocate_slots(r, &AllocateArgs::new(n)).unwrap().unwrap()
    };
    let a_blocks = new(&mut m, &a, 6);
    // `a` freed: its hint names a free slot, which `b` then takes.
    m.free("a").unwrap();
    let b_blocks = new(&mut m, &b, 6);
    assert_eq!(a.slot_hint().slot(), b.slot_hint().slot());
    // `a` again: a new slot, not `b`'s.
    let a_again = new(&mut m, &a, 6);
    assert_eq!(m.get_block_ids("b"), vec![b_blocks[0].clone()]);
    assert_eq!(m.get_block_ids("a"), vec![a_again[0].clone()]);
    assert_ne!(a_blocks, vec![Vec::<BlockId>::new()]);
    // A second value with the same id shares the id's slot (and its blocks).
    let mut a2 = a.clone();
    a2.num_computed_tokens = 6;
    let a1 = make("a", 1);
    assert!(new(&mut m, &a1, 1).iter().all(Vec::is_empty));
    assert_eq!(m.get_block_ids("a"), vec![a_again[0].clone()]);
    // The same request in a second manager: its own slot there, and back again here.
    let in_other = new(&mut other, &a, 6);
    assert_eq!(other.get_block_ids("a"), in_other);
    assert!(new(&mut m, &a2, 2).iter().all(Vec::is_empty));
    assert_eq!(m.get_block_ids("a"), vec![a_again[0].clone()]);
    assert_eq!(m.coord.pool().check_invariants(), Ok(()));
}

#[test]
fn block_table_rows_padded_with_nulls() {
    let mut m = mgr(vec![full(4), swa(4, 4, 1)], 32, 4);
    let mut a = TestReq::new("a", toks(0, 10), 4);
    let mut b = TestReq::new("b", toks(100, 3), 4);
    admit(&mut m, &mut a);
    admit(&mut m, &mut b);
    let ta = m.block_table("a", 0).to_vec();
    let tb = m.block_table("b", 0).to_vec();
    assert_eq!((ta.len(), tb.len()), (3, 1));
    let mut out = vec![7; 2];
    let width = m.block_table_into(&["b", "zz", "a"], 0, &mut out).unwrap();
    assert_eq!(width, 3);
    let row = |t: &[BlockId]| {
        let mut r: Vec<i32> = t.iter().map(|&x| x as i32).collect();
        r.resize(3, 0);
        r
    };
    assert_eq!(out, [row(&tb), vec![0; 3], row(&ta)].concat());
    // The second group: the sliding window's nulls stay in place.
    let width = m.block_table_into(&["a"], 1, &mut out).unwrap();
    assert_eq!(width, m.block_table("a", 1).len());
    assert_eq!(out, row(m.block_table("a", 1)));
    // No rows, or only empty tables: one column of nulls.
    assert_eq!(m.block_table_into::<&str>(&[], 0, &mut out), Ok(1));
    assert!(out.is_empty());
    assert_eq!(m.block_table_into(&["x", "y"], 0, &mut out), Ok(1));
    assert_eq!(out, [0, 0]);
    assert!(matches!(
        m.block_table_into(&["a"], 2, &mut out),
        Err(KvError::InvalidArgument(_))
    ));
}

/// `allocate_slots_batch` allocates in order and stops at the first request that does
/// not fit; a bad batch is refused before anything changes.
#[test]
fn allocate_slots_batch_stops_at_first_miss() {
    let mut m = KvCacheManager::new(vec![full(4)], 20, None, ManagerOptions::new(1024, 4)).unwrap();
    let reqs: Vec<TestReq> = ["a", "b", "c", "d"]
        .iter()
        .map(|id| TestReq::new(id, toks(0, 40), 4))
        .collect();
    let refs: Vec<&TestReq> = reqs.iter().collect();
    let mut blocks = NewBlocks::default();
    let mut seen = Vec::new();
    let mut record = |b: &NewBlocks| -> Result<()> {
        seen.push(b.groups().map(<[BlockId]>::to_vec).collect::<Vec<_>>());
        Ok(())
    };
    assert!(m
        .allocate_slots_batch(&refs, &[8, 0, 8, 8], &mut blocks, &mut record)
        .is_err());
    assert!(m
        .allocate_slots_batch(&refs, &[8, 8], &mut blocks, &mut record)
        .is_err());
    assert_eq!(m.pool().num_free_blocks(), 19);
    let fitted = m
        .allocate_slots_batch(&refs, &[8, 40, 40, 4], &mut blocks, &mut record)
        .unwrap();
    assert_eq!(fitted, 2);
    assert_eq!(
        seen,
        vec![vec![vec![1, 2]], vec![(3..=12).collect::<Vec<_>>()]]
    );
    assert!(m.get_block_ids("c").iter().all(Vec::is_empty));
    assert!(m.get_block_ids("d").iter().all(Vec::is_empty));
}

/// vLLM 0.33's `CircularBufferManager` beside full attention: one ring block per
/// request, claimed by its first allocation and kept as it grows; the ring takes no
/// part in hits or hashing (the hash block size is the full group's 4, the scheduler's
/// lcm 8), and is freed with the request (unhashed: to the queue head).
#[test]
fn circular_buffer_one_ring_block_per_request() {
    let ring = ManagerParams::new(K::CircularBuffer, 8, 1);
    let mut m = mgr(vec![full(4), ring], 20, 4);
    let mut r0 = TestReq::new("0", toks(0, 10), 4);
    let (_, hit, new) = admit(&mut m, &mut r0);
    assert_eq!((hit, new), (0, Some(vec![vec![1, 2, 3], vec![4]])));
    assert_eq!(step(&mut m, &mut r0, 3), Some(vec![vec![5], vec![]]));
    let r1 = TestReq::new("1", toks(0, 10), 4);
    assert_eq!(
        m.get_computed_blocks(&r1).unwrap(),
        (vec![vec![1, 2], vec![]], 8)
    );
    m.free("0").unwrap();
    assert_eq!(queue(&m)[..2], [4, 5]);
}

/// DeepSeek-V4.1's bounded replay: a sliding-window group that is not prefix cached
/// (`prefix_cacheable` false) leaves the hit to full attention and fills its own table
/// with nulls below the window.
#[test]
fn uncached_sliding_window_leaves_hits_to_full_attention() {
    let mut replay = swa(4, 8, 1);
    replay.prefix_cacheable = false;
    let mut m = mgr(vec![full(4), replay], 40, 4);
    let mut r0 = TestReq::new("0", toks(0, 17), 4);
    admit(&mut m, &mut r0);
    let mut r1 = TestReq::new("1", toks(0, 17), 4);
    let (hits, hit, new) = admit(&mut m, &mut r1);
    assert_eq!((hits, hit), (vec![vec![1, 2, 3, 4], vec![]], 16));
    let new = new.unwrap();
    assert_eq!(m.get_block_ids("1")[1][..2], [0, 0]);
    assert_eq!(new[1].len(), 3);
}

/// Full attention (bs 16) + align-mode Mamba (bs 32) over 16-token hashes: partial hits
/// are on, hits align to 16 tokens.
fn mamba_partial(use_eagle: bool) -> KvCacheManager {
    let g = ManagerParams::new(
        K::Mamba {
            num_speculative_blocks: 0,
            align: true,
            checkpoint_alignment: None,
        },
        32,
        1,
    );
    let mut opts = ManagerOptions::new(1024, 16);
    opts.scheduler_block_size = Some(32);
    opts.use_eagle = use_eagle;
    KvCacheManager::new(vec![full(16), g], 20, None, opts).unwrap()
}

/// vLLM 0.33's partial-hit trace (checked against its `KVCacheManager`): a 56-token
/// prompt computed as 48 + 8 keys its Mamba state at the last hash boundary (48, inside
/// the second Mamba block); its next step copies that state out of the block it keeps
/// writing (the key moves to the copy, which is offered for offload). A sibling sharing
/// 48 tokens hits 48, and its first allocation copies the shared tail into its own block.
#[test]
fn mamba_partial_hit_copy_on_write() {
    let mut m = mamba_partial(false);
    assert!(m.partial_hits_enabled());
    assert_eq!(m.coordinator().hit_alignment(), 16);
    let mut a = TestReq::new("a", toks(0, 56), 16);
    assert_eq!(
        step(&mut m, &mut a, 48),
        Some(vec![vec![1, 2, 3], vec![0, 4]])
    );
    assert_eq!(m.num_cached_blocks("a", 1), Some(1));
    assert!(m.take_block_copies().is_empty());
    m.new_step_starts();
    assert_eq!(step(&mut m, &mut a, 8), Some(vec![vec![5], vec![]]));
    assert_eq!(m.get_block_ids("a"), vec![vec![1, 2, 3, 5], vec![0, 4]]);
    assert_eq!(m.take_block_copies(), vec![(4, 6)]);
    assert_eq!(
        (m.pool().ref_cnt(4).unwrap(), m.pool().ref_cnt(6).unwrap()),
        (2, 1)
    );
    let offloads: Vec<_> = m
        .take_boundary_offloads()
        .into_iter()
        .map(|o| (o.request_id, o.group, o.block, o.num_tokens))
        .collect();
    assert_eq!(offloads, vec![("a".to_owned(), 1, 6, 48)]);
    m.pool_mut().free_blocks([4, 6]).unwrap();
    assert_eq!(
        (m.pool().ref_cnt(4).unwrap(), m.pool().ref_cnt(6).unwrap()),
        (1, 0)
    );
    m.new_step_starts();
    let mut b = TestReq::new("b", [toks(0, 48), toks(900, 20)].concat(), 16);
    let (hits, hit, new) = admit(&mut m, &mut b);
    assert_eq!((hits, hit), (vec![vec![1, 2, 3], vec![0, 6]], 48));
    assert_eq!(new, Some(vec![vec![7, 8], vec![9, 10]]));
    assert_eq!(
        m.get_block_ids("b"),
        vec![vec![1, 2, 3, 7, 8], vec![0, 9, 10]]
    );
    assert_eq!(m.take_block_copies(), vec![(6, 9)]);
    assert_eq!(
        (m.pool().ref_cnt(6).unwrap(), m.pool().ref_cnt(9).unwrap()),
        (1, 2)
    );
    m.pool_mut().free_blocks([6, 9]).unwrap();
    assert_eq!(m.pool().num_free_blocks(), 10);
    assert!(m.finalize_partial_tail_offloads("a", 56, 0).is_empty());
}

/// Without a Mamba block coarser than the hash block, hits stay scheduler-block aligned
/// and a hit ending inside a block is refused.
#[test]
fn partial_hits_need_a_coarse_mamba_block() {
    let g = ManagerParams::new(
        K::Mamba {
            num_speculative_blocks: 0,
            align: true,
            checkpoint_alignment: None,
        },
        32,
        1,
    );
    let mut opts = ManagerOptions::new(1024, 32);
    opts.scheduler_block_size = Some(32);
    let m = KvCacheManager::new(vec![full(32), g], 20, None, opts).unwrap();
    assert!(!m.partial_hits_enabled());
    assert_eq!(m.coordinator().hit_alignment(), 32);
}

/// vLLM's Mamba shared-prefix checkpoint is armed only with an EAGLE group and partial
/// hits.
#[test]
fn mamba_shared_prefix_checkpoint_needs_eagle_and_partial_hits() {
    assert!(!mamba_partial(false).arm_mamba_shared_prefix_checkpoint());
    assert!(mamba_partial(true).arm_mamba_shared_prefix_checkpoint());
    assert!(!mamba_align(0, false, true).arm_mamba_shared_prefix_checkpoint());
}
