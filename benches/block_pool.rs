//! BlockPool micro-benchmarks, per block: allocate + free, prefix lookups (hit and miss)
//! and caching full blocks. Run with `cargo bench --bench block_pool`.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvblocks::events::event::TokensOnly;
use kvblocks::pool::{BlockPool, RetentionHints, RetentionPolicy};
use kvblocks::{BlockHash, BlockId};

/// A 1M-block pool, as a large GPU would have.
const POOL_BLOCKS: usize = 1 << 20;
const BLOCK_SIZE: usize = 16;

/// `n` distinct pseudo-random 32-byte hashes (xorshift; the bench needs no real digests).
fn random_hashes(n: usize, seed: u64) -> Vec<BlockHash> {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..n)
        .map(|_| {
            let mut bytes = [0u8; 32];
            for chunk in bytes.chunks_mut(8) {
                chunk.copy_from_slice(&next().to_le_bytes());
            }
            BlockHash::from_slice(&bytes).expect("32 bytes")
        })
        .collect()
}

fn alloc_free(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_free");
    for n in [1usize, 16, 256] {
        let mut pool = BlockPool::new(POOL_BLOCKS, true, BLOCK_SIZE, false).unwrap();
        let mut blocks: Vec<BlockId> = Vec::with_capacity(n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(format!("n={n}"), |b| {
            b.iter(|| {
                blocks.clear();
                pool.get_new_blocks_into(black_box(n), &mut blocks).unwrap();
                pool.free_blocks(blocks.iter().rev().copied()).unwrap();
            })
        });
    }
    group.finish();
}

/// Number of cached blocks behind the lookups, and lookups per iteration.
const CACHED: usize = 100_000;
const LOOKUPS: usize = 1024;

fn prefix_lookup(c: &mut Criterion) {
    let hashes = random_hashes(CACHED, 7);
    let mut pool = BlockPool::new(CACHED + 1, true, BLOCK_SIZE, false).unwrap();
    let blocks = pool.get_new_blocks(CACHED).unwrap();
    pool.cache_full_blocks(
        &hashes,
        &blocks,
        0,
        CACHED,
        BLOCK_SIZE,
        0,
        None,
        &TokensOnly(&[]),
    )
    .unwrap();
    // Probe in a scattered order so that lookups do not walk the map sequentially.
    let hits: Vec<BlockHash> = (0..LOOKUPS).map(|i| hashes[(i * 7919) % CACHED]).collect();
    let misses = random_hashes(LOOKUPS, 99);

    let mut group = c.benchmark_group("cached_block");
    group.throughput(Throughput::Elements(LOOKUPS as u64));
    for (name, probes) in [("hit", &hits), ("miss", &misses)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut found = 0usize;
                for h in probes.iter() {
                    found += usize::from(pool.cached_block(black_box(h), 0).is_some());
                }
                found
            })
        });
    }
    group.finish();
}

fn cache_full_blocks(c: &mut Criterion) {
    const N: usize = 256;
    let hashes = random_hashes(N, 3);
    let tokens: Vec<u32> = (0..(N * BLOCK_SIZE) as u32).collect();
    let mut group = c.benchmark_group("cache_full_blocks");
    group.throughput(Throughput::Elements(N as u64));
    for events in [false, true] {
        group.bench_function(format!("n={N}/events={events}"), |b| {
            b.iter_batched_ref(
                || {
                    let mut pool = BlockPool::new(N + 1, true, BLOCK_SIZE, events).unwrap();
                    let blocks = pool.get_new_blocks(N).unwrap();
                    (pool, blocks)
                },
                |(pool, blocks)| {
                    pool.cache_full_blocks(
                        &hashes,
                        blocks,
                        0,
                        N,
                        BLOCK_SIZE,
                        0,
                        None,
                        &TokensOnly(&tokens),
                    )
                    .unwrap();
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

/// A request's life on a full pool of cached blocks, per block: allocate `N` (evicting
/// cached blocks), cache them under new hashes, free them tail first, advance the clock;
/// without a policy and under each kind of policy (docs/retention.md).
fn cached_churn(c: &mut Criterion) {
    const N: usize = 64;
    const BLOCKS: usize = 1 << 16;
    const ROUNDS: usize = 4 * BLOCKS / N;
    let hashes = random_hashes(ROUNDS * N, 11);
    let policies: [(&str, Option<RetentionPolicy>, RetentionHints); 4] = [
        ("none", None, RetentionHints::default()),
        (
            "classes+ttl",
            Some(RetentionPolicy {
                classes: 2,
                priority_classes: vec![(-1, 1)],
                ttl_s: vec![Some(50.0), None],
                ..Default::default()
            }),
            RetentionHints::default(),
        ),
        (
            "session",
            Some(RetentionPolicy {
                session_s: Some(30.0),
                ..Default::default()
            }),
            RetentionHints {
                session: true,
                ..Default::default()
            },
        ),
        (
            "quota",
            Some(RetentionPolicy {
                default_tenant_quota: Some(BLOCKS / 8),
                ..Default::default()
            }),
            RetentionHints {
                tenant: Some("t".into()),
                ..Default::default()
            },
        ),
    ];
    let mut group = c.benchmark_group("cached_churn");
    group.throughput(Throughput::Elements(N as u64));
    for (name, policy, hints) in policies {
        let mut pool = BlockPool::new(BLOCKS + 1, true, BLOCK_SIZE, false).unwrap();
        if let Some(p) = policy {
            pool.set_retention(p).unwrap();
        }
        if let Some(tag) = pool.free_tag_for(&hints) {
            pool.set_free_tag(tag);
        }
        let mut blocks: Vec<BlockId> = Vec::with_capacity(N);
        let mut round = 0usize;
        group.bench_function(format!("n={N}/policy={name}"), |b| {
            b.iter(|| {
                let r = round % ROUNDS;
                round += 1;
                blocks.clear();
                pool.get_new_blocks_into(N, &mut blocks).unwrap();
                let hs = &hashes[r * N..(r + 1) * N];
                pool.cache_full_blocks(hs, &blocks, 0, N, BLOCK_SIZE, 0, None, &TokensOnly(&[]))
                    .unwrap();
                pool.free_blocks(blocks.iter().rev().copied()).unwrap();
                pool.advance_time(round as f64).unwrap();
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    alloc_free,
    prefix_lookup,
    cache_full_blocks,
    cached_churn
);
criterion_main!(benches);
