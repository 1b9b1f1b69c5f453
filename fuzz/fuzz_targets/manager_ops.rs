//! Fuzz target: decodes bytes into a scheduler's sequence of `KvCacheManager` calls over
//! full-attention, sliding-window and hybrid layouts (admission with prefix hits, chunked
//! prefill, decode with lookahead, preemption, finish, evict, reset, cache salts, LoRA
//! adapters) and raw calls with arbitrary arguments.
//!
//! After every step it checks:
//! * `BlockPool::check_invariants`;
//! * ownership: each block's ref count equals the number of live tables holding it, and no
//!   block sits in two groups;
//! * isolation: no block is held by requests of two tenants (salt, LoRA);
//! * atomicity: a call that returns an error leaves the manager observably unchanged.
#![no_main]

use kvblocks::hashing::{BlockHasher, HashAlgo, LoraRequest};
use kvblocks::kv_cache_manager::{AllocateArgs, KvCacheManager, ManagerOptions};
use kvblocks::attention::{AttentionKind, ManagerParams};
use kvblocks::request::{Request, RequestOptions};
use kvblocks::{BlockId, NULL_BLOCK_ID};
use libfuzzer_sys::fuzz_target;

#[allow(dead_code)] // each target reads only some widths
mod bytes;
use bytes::Bytes;

const HBS: usize = 4;

struct Live {
    req: Request,
    tenant: u8,
}

fn full(bs: usize, class: usize) -> ManagerParams {
    ManagerParams::new(AttentionKind::FullAttention, bs, class)
}

fn swa(bs: usize, window: usize, class: usize) -> ManagerParams {
    let kind = AttentionKind::SlidingWindow {
        sliding_window: window,
        extra_retained_tokens: 0,
    };
    ManagerParams::new(kind, bs, class)
}

fn layout(i: usize) -> Vec<ManagerParams> {
    match i {
        0 => vec![full(4, 0)],
        1 => vec![swa(4, 8, 0)],
        2 => vec![full(4, 0), swa(4, 8, 1)],
        3 => vec![full(8, 0), swa(4, 8, 1)],
        4 => vec![full(4, 0), swa(4, 8, 1), swa(4, 8, 1)],
        _ => vec![full(4, 0), swa(4, 8, 1), swa(4, 13, 2)],
    }
}

type Observed = (Vec<Vec<Vec<BlockId>>>, Vec<BlockId>, Vec<i64>);

fn observe(m: &KvCacheManager, live: &[Live]) -> Observed {
    let p = m.pool();
    (
        live.iter()
            .map(|l| m.get_block_ids(l.req.request_id()))
            .collect(),
        p.free_block_ids().collect(),
        (0..p.num_blocks() as u32)
            .map(|b| p.ref_cnt(b).unwrap())
            .collect(),
    )
}

fn check(m: &KvCacheManager, live: &[Live]) {
    let p = m.pool();
    if let Err(e) = p.check_invariants() {
        panic!("pool invariant broken: {e}");
    }
    let n = p.num_blocks();
    let mut held = vec![0i64; n];
    let mut group_of = vec![usize::MAX; n];
    let mut tenant_of = vec![None; n];
    for l in live {
        for (g, table) in m.get_block_ids(l.req.request_id()).iter().enumerate() {
            for &b in table {
                if b == NULL_BLOCK_ID {
                    continue;
                }
                let i = b as usize;
                held[i] += 1;
                assert!(
                    group_of[i] == usize::MAX || group_of[i] == g,
                    "block {b} in two groups"
                );
                group_of[i] = g;
                assert!(
                    *tenant_of[i].get_or_insert(l.tenant) == l.tenant,
                    "block {b} held by two tenants"
                );
            }
        }
    }
    for (b, &owners) in held.iter().enumerate().skip(1) {
        assert_eq!(
            p.ref_cnt(b as u32).unwrap(),
            owners,
            "block {b}: ref count != owners"
        );
    }
}

fn run(data: &[u8]) {
    let mut d = Bytes(data);
    let groups = layout(d.pick(6));
    let num_blocks = 1 + d.pick(64);
    let max_model_len = 16 + 4 * d.pick(32);
    let mut opts = ManagerOptions::new(max_model_len, HBS);
    opts.enable_caching = d.u8() % 4 != 0;
    opts.enable_kv_cache_events = d.u8() % 2 == 0;
    let retention = (d.u8() % 3 == 0).then_some(0);
    let Ok(mut m) = KvCacheManager::new(groups, num_blocks, retention, opts) else {
        return;
    };
    let hasher = BlockHasher::new(HBS, HashAlgo::Sha256Cbor).unwrap();
    let mut live: Vec<Live> = Vec::new();
    let mut next = 0u32;
    let mut steps = 0;
    while !d.done() && steps < 300 {
        steps += 1;
        match d.u8() % 10 {
            0..=2 => {
                // Admission: hit lookup, then the first chunk (maybe with lookahead).
                let len = 1 + d.pick(60);
                let prefix = d.pick(3);
                let tokens: Vec<u32> = (0..len)
                    .map(|i| {
                        if i < 12 * prefix {
                            prefix as u32
                        } else {
                            u32::from(d.u8() % 3)
                        }
                    })
                    .collect();
                let tenant = d.u8() % 5;
                let lora = match tenant {
                    3 => Some(LoraRequest::new("a".into(), "/a".into(), 1).unwrap()),
                    4 => Some(LoraRequest::new("b".into(), "/b".into(), 2).unwrap()),
                    _ => None,
                };
                let salt = (tenant == 1 || tenant == 2).then(|| format!("salt{tenant}"));
                let options = RequestOptions {
                    lora,
                    cache_salt: salt,
                    ..RequestOptions::default()
                };
                next += 1;
                let req = Request::new(format!("r{next}"), tokens, Some(hasher), options).unwrap();
                let (hits, n) = m.get_computed_blocks(&req).unwrap();
                assert!(n < req.num_tokens().max(1));
                let num_new = (1 + d.pick(64))
                    .min(req.num_tokens().saturating_sub(n))
                    .max(1);
                let args = AllocateArgs {
                    num_new_computed_tokens: n,
                    new_computed_blocks: Some(&hits),
                    num_lookahead_tokens: d.pick(6),
                    ..AllocateArgs::new(num_new)
                };
                let before = observe(&m, &live);
                match m.allocate_slots(&req, &args) {
                    Ok(Some(_)) => {
                        let mut req = req;
                        req.num_computed_tokens = n + num_new;
                        live.push(Live { req, tenant });
                    }
                    Ok(None) => {
                        // Only out-of-window blocks may be freed on a refusal; a new
                        // request has none, so nothing changed.
                        assert_eq!(before, observe(&m, &live));
                        m.free(&format!("r{next}")).unwrap();
                    }
                    Err(e) => panic!("admission failed: {e}"),
                }
            }
            3..=5 => {
                // A step of a running request: next chunk or one decode token.
                if live.is_empty() {
                    continue;
                }
                let i = d.pick(live.len());
                let l = &mut live[i];
                if l.req.num_computed_tokens >= l.req.num_tokens() {
                    let t = u32::from(d.u8() % 3);
                    l.req.append_output_token_ids(&[t]);
                }
                let left = l.req.num_tokens().saturating_sub(l.req.num_computed_tokens);
                let num_new = (1 + d.pick(16)).min(left);
                let args = AllocateArgs {
                    num_lookahead_tokens: d.pick(4),
                    ..AllocateArgs::new(num_new.max(1))
                };
                match m.allocate_slots(&l.req, &args) {
                    Ok(Some(_)) => l.req.num_computed_tokens += num_new,
                    Ok(None) => {
                        // Preempted.
                        let l = live.swap_remove(i);
                        m.free(l.req.request_id()).unwrap();
                    }
                    Err(e) => panic!("running step failed: {e}"),
                }
            }
            6 => {
                if !live.is_empty() {
                    let l = live.swap_remove(d.pick(live.len()));
                    m.free(l.req.request_id()).unwrap();
                }
            }
            7 => {
                let ids: Vec<BlockId> = (0..d.pick(4))
                    .map(|_| d.pick(num_blocks + 2) as BlockId)
                    .collect();
                let before = observe(&m, &live);
                if m.evict_blocks(&ids).is_err() {
                    assert_eq!(before, observe(&m, &live), "failed evict changed state");
                }
            }
            8 => {
                let held = live.iter().any(|l| {
                    m.get_block_ids(l.req.request_id())
                        .iter()
                        .flatten()
                        .any(|&b| b != NULL_BLOCK_ID)
                });
                assert_eq!(m.reset_prefix_cache(), !held);
            }
            _ => {
                // Raw allocate_slots / cache_blocks with arbitrary arguments on a copy.
                let mut copy = m.clone();
                let before = observe(&copy, &live);
                let hits: Vec<Vec<BlockId>> = (0..d.pick(4))
                    .map(|_| {
                        (0..d.pick(4))
                            .map(|_| d.pick(num_blocks + 2) as BlockId)
                            .collect()
                    })
                    .collect();
                let target = if live.is_empty() || d.u8() % 2 == 0 {
                    Request::new(
                        "raw",
                        vec![1; d.pick(40)],
                        Some(hasher),
                        RequestOptions::default(),
                    )
                    .unwrap()
                } else {
                    live[d.pick(live.len())].req.clone()
                };
                let res = if d.u8() % 3 == 0 {
                    copy.cache_blocks(&target, d.pick(80))
                } else {
                    let args = AllocateArgs {
                        num_new_computed_tokens: 4 * d.pick(8),
                        new_computed_blocks: Some(&hits),
                        num_lookahead_tokens: d.pick(8),
                        ..AllocateArgs::new(d.pick(40))
                    };
                    copy.allocate_slots(&target, &args).map(|_| ())
                };
                match res {
                    Ok(()) => copy.pool().check_invariants().unwrap(),
                    Err(_) => {
                        assert_eq!(before, observe(&copy, &live), "failed call changed state")
                    }
                }
            }
        }
        check(&m, &live);
    }
    for l in live.drain(..) {
        m.free(l.req.request_id()).unwrap();
    }
    check(&m, &live);
    assert_eq!(m.pool().num_free_blocks(), num_blocks - 1, "blocks lost");
}

fuzz_target!(|data: &[u8]| run(data));
