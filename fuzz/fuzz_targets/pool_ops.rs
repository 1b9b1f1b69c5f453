//! Fuzz target: decodes bytes into a sequence of core API calls on `BlockPool` and
//! `Request`, driving them the way the managers do (prefix hit, touch, allocate, cache,
//! decode, free in reverse) and interleaving raw calls with arbitrary arguments.
//!
//! After every step it checks:
//! * `BlockPool::check_invariants` (queue/ref-count/prefix-map consistency);
//! * ownership: each block's ref count equals the number of live request tables holding
//!   it (no lost block, no block owned without a reference);
//! * isolation: a block held by two requests at the same table position carries the same
//!   content hash for both (a shared block is a shared prefix, never another tenant's);
//! * atomicity: a raw call that returns an error leaves the pool observably unchanged;
//! * hashing: a request's incrementally grown `block_hashes` equal those of a request
//!   built from all its tokens at once.
#![no_main]

use kvblocks::hashing::{BlockHasher, HashAlgo, LoraRequest};
use kvblocks::events::event::TokensOnly;
use kvblocks::pool::BlockPool;
use kvblocks::request::{Request, RequestOptions};
use kvblocks::{BlockHash, BlockId, NULL_BLOCK_ID};
use libfuzzer_sys::fuzz_target;

#[allow(dead_code)] // each target reads only some widths
mod bytes;
use bytes::Bytes;

/// A live request: its tokens/hashes and its block table (group 0).
struct Owner {
    req: Request,
    table: Vec<BlockId>,
    num_cached: usize,
}

/// Free queue, ref counts, cache keys (hash ‖ group) and the number of keys.
type Observed = (Vec<BlockId>, Vec<i64>, Vec<Option<Vec<u8>>>, usize);

/// Everything observable about a pool, to compare before and after a failing call.
fn observe(p: &BlockPool) -> Observed {
    let n = p.num_blocks() as u32;
    (
        p.free_block_ids().collect(),
        (0..n).map(|b| p.ref_cnt(b).unwrap()).collect(),
        (0..n)
            .map(|b| {
                p.block_hash(b)
                    .unwrap()
                    .map(|k| [k.hash.as_bytes(), &k.group.to_le_bytes()].concat())
            })
            .collect(),
        p.num_cached_keys(),
    )
}

fn check(pool: &BlockPool, owners: &[Owner], bs: usize) {
    if let Err(e) = pool.check_invariants() {
        panic!("pool invariant broken: {e}");
    }
    let n = pool.num_blocks();
    let mut held = vec![0i64; n];
    let mut content: Vec<Option<(usize, BlockHash)>> = vec![None; n];
    for o in owners {
        for (i, &b) in o.table.iter().enumerate() {
            if b == NULL_BLOCK_ID {
                continue;
            }
            held[b as usize] += 1;
            // Positions below the request's full-block count have a content hash.
            let Some(h) = o.req.block_hashes().get(i).copied() else {
                continue;
            };
            match content[b as usize] {
                None => content[b as usize] = Some((i, h)),
                Some((j, g)) => assert!(
                    i == j && g == h,
                    "block {b} shared by requests with different content"
                ),
            }
        }
    }
    for (b, &owners) in held.iter().enumerate().skip(1) {
        assert_eq!(
            pool.ref_cnt(b as u32).unwrap(),
            owners,
            "block {b}: ref count differs from its owners"
        );
    }
    for o in owners {
        assert_eq!(o.req.block_hashes().len(), o.req.num_tokens() / bs);
    }
}

/// The cached prefix of `req` (group 0), as the full-attention manager looks it up.
fn hits(pool: &BlockPool, req: &Request) -> Vec<BlockId> {
    req.block_hashes()
        .iter()
        .map_while(|h| pool.cached_block(h, 0))
        .collect()
}

/// Allocates `owner`'s missing blocks for its current length and caches its full blocks.
/// Returns false (pool unchanged) if the pool is too small.
fn grow(pool: &mut BlockPool, o: &mut Owner, bs: usize, source: &[u32]) -> bool {
    let need = o
        .req
        .num_tokens()
        .div_ceil(bs)
        .saturating_sub(o.table.len());
    if need > pool.num_free_blocks() {
        let before = observe(pool);
        assert!(pool.get_new_blocks(need).is_err());
        assert_eq!(
            before,
            observe(pool),
            "failed get_new_blocks changed the pool"
        );
        return false;
    }
    let got = pool.get_new_blocks(need).unwrap();
    o.table.extend(got);
    let full = o.req.num_tokens() / bs;
    pool.cache_full_blocks(
        o.req.block_hashes(),
        &o.table,
        o.num_cached,
        full,
        bs,
        0,
        None,
        &TokensOnly(source),
    )
    .unwrap();
    o.num_cached = o.num_cached.max(full);
    true
}

fn tokens(d: &mut Bytes<'_>, n: usize, alphabet: u8) -> Vec<u32> {
    // A small alphabet makes shared prefixes (and so prefix hits) common.
    (0..n)
        .map(|_| u32::from(d.u8() % alphabet.max(1)))
        .collect()
}

fn run(data: &[u8]) {
    let mut d = Bytes(data);
    let num_blocks = 1 + usize::from(d.u8() % 48);
    let bs = 1 + usize::from(d.u8() % 8);
    let algo = HashAlgo::ALL[usize::from(d.u8() % 4)];
    let events = d.u8() % 2 == 0;
    let alphabet = 1 + d.u8() % 4;
    let hasher = BlockHasher::new(bs, algo).unwrap();
    let mut pool = BlockPool::new(num_blocks, true, bs, events).unwrap();
    let mut owners: Vec<Owner> = Vec::new();
    let mut next_id = 0u32;
    let mut steps = 0;
    while !d.done() && steps < 400 {
        steps += 1;
        match d.u8() % 11 {
            0 | 1 => {
                // A new request with a prefix hit, as `get_computed_blocks` + allocate.
                let len = 1 + usize::from(d.u8() % 40);
                let toks = tokens(&mut d, len, alphabet);
                let salt = d.u8();
                let lora = match salt % 4 {
                    1 => Some(LoraRequest::new("a".into(), "/a".into(), 1).unwrap()),
                    2 => Some(LoraRequest::new("b".into(), "/b".into(), 2).unwrap()),
                    _ => None,
                };
                let opts = RequestOptions {
                    lora,
                    cache_salt: (salt % 3 == 1).then(|| format!("s{}", salt % 2)),
                    ..RequestOptions::default()
                };
                next_id += 1;
                let req = Request::new(format!("r{next_id}"), toks, Some(hasher), opts).unwrap();
                let mut hit = hits(&pool, &req);
                // Never a hit on the last token: at least one token is computed.
                hit.truncate((req.num_tokens() - 1) / bs);
                let need = req.num_tokens().div_ceil(bs) - hit.len();
                let free_after_touch = pool.num_free_blocks()
                    - hit
                        .iter()
                        .filter(|&&b| pool.ref_cnt(b).unwrap() == 0)
                        .count();
                if need > free_after_touch {
                    continue;
                }
                pool.touch(&hit).unwrap();
                let mut o = Owner {
                    num_cached: hit.len(),
                    table: hit,
                    req,
                };
                let src = o.req.all_token_ids().to_vec();
                assert!(grow(&mut pool, &mut o, bs, &src));
                owners.push(o);
            }
            2 | 3 => {
                // Decode: append tokens to a live request.
                if owners.is_empty() {
                    continue;
                }
                let i = usize::from(d.u8()) % owners.len();
                let k = 1 + usize::from(d.u8() % (2 * bs as u8).max(1));
                let toks = tokens(&mut d, k, alphabet);
                let before = owners[i].req.clone();
                owners[i].req.append_output_token_ids(&toks);
                let src = owners[i].req.all_token_ids().to_vec();
                if !grow(&mut pool, &mut owners[i], bs, &src) {
                    owners[i].req = before; // no room: the step is not scheduled
                }
            }
            4 | 5 => {
                // Finish (or preempt) a request: free its table in reverse.
                if owners.is_empty() {
                    continue;
                }
                let i = usize::from(d.u8()) % owners.len();
                let o = owners.swap_remove(i);
                pool.free_blocks(o.table.iter().rev().copied()).unwrap();
            }
            6 => {
                let ids: Vec<BlockId> = (0..d.u8() % 4)
                    .map(|_| u32::from(d.u8()) % (num_blocks as u32 + 2))
                    .collect();
                let before = observe(&pool);
                if pool.evict_blocks(&ids).is_err() {
                    assert_eq!(before, observe(&pool), "failed evict changed the pool");
                }
            }
            7 => {
                let held = owners
                    .iter()
                    .any(|o| o.table.iter().any(|&b| b != NULL_BLOCK_ID));
                assert_eq!(pool.reset_prefix_cache(), !held);
            }
            8 => {
                // Raw free/touch of arbitrary ids on a copy: errors must change nothing.
                let ids: Vec<BlockId> = (0..d.u8() % 5)
                    .map(|_| u32::from(d.u8()) % (num_blocks as u32 + 2))
                    .collect();
                let mut copy = pool.clone();
                let before = observe(&copy);
                let res = if d.u8() % 2 == 0 {
                    copy.free_blocks(ids.iter().copied())
                } else {
                    copy.touch(&ids)
                };
                match res {
                    Ok(()) => copy.check_invariants().unwrap(),
                    Err(_) => assert_eq!(before, observe(&copy), "failed call changed the pool"),
                }
            }
            9 => {
                // Raw cache_full_blocks with arbitrary arguments on a copy.
                let hashes: Vec<BlockHash> = (0..d.u8() % 6)
                    .map(|_| BlockHash::from_slice(&d.u32().to_le_bytes()).unwrap())
                    .collect();
                let ids: Vec<BlockId> = (0..d.u8() % 6)
                    .map(|_| u32::from(d.u8()) % (num_blocks as u32 + 2))
                    .collect();
                let (nc, nf) = (usize::from(d.u8() % 7), usize::from(d.u8() % 7));
                let bsz = usize::from(d.u8() % 17);
                let group = u32::from(d.u8() % 3);
                let mut copy = pool.clone();
                let before = observe(&copy);
                let ntoks = usize::from(d.u8() % 20);
                let toks = tokens(&mut d, ntoks, alphabet);
                match copy.cache_full_blocks(
                    &hashes,
                    &ids,
                    nc,
                    nf,
                    bsz,
                    group,
                    None,
                    &TokensOnly(&toks),
                ) {
                    Ok(()) => copy.check_invariants().unwrap(),
                    Err(_) => assert_eq!(before, observe(&copy), "failed cache changed the pool"),
                }
                let _ = copy.take_events();
            }
            _ => {
                // Hashing: incremental growth equals hashing everything at once.
                if let Some(o) = owners.first() {
                    let fresh = Request::new(
                        "fresh",
                        o.req.all_token_ids().to_vec(),
                        Some(hasher),
                        RequestOptions {
                            lora: o.req.lora().cloned(),
                            cache_salt: o.req.cache_salt().map(str::to_owned),
                            ..RequestOptions::default()
                        },
                    )
                    .unwrap();
                    assert_eq!(fresh.block_hashes(), o.req.block_hashes());
                }
                let _ = pool.take_events();
            }
        }
        check(&pool, &owners, bs);
    }
    // Draining every request returns every block.
    for o in owners.drain(..) {
        pool.free_blocks(o.table.iter().rev().copied()).unwrap();
    }
    check(&pool, &owners, bs);
    assert_eq!(pool.num_free_blocks(), num_blocks - 1);
    assert!(pool.reset_prefix_cache());
    assert_eq!(pool.num_cached_keys(), 0);
}

fuzz_target!(|data: &[u8]| run(data));
