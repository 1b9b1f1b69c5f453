//! KVCacheManager benches: prefix lookup of a fully cached prompt (8k..128k tokens,
//! bs 16) and decode-step `allocate_slots`.
#![allow(missing_docs)] // criterion_group! generates undocumented public functions

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvblocks::manager::{AllocateArgs, KvCacheManager, ManagerOptions};
use kvblocks::managers::{AttentionKind, ManagerParams, RequestView};
use kvblocks::pool::events::{EventExtraKeys, StoredBlockSource};
use kvblocks::BlockHash;
use std::hint::black_box;

const BS: usize = 16;

/// A request with precomputed, distinct chained hashes (hashing is benched elsewhere).
struct BenchReq {
    id: String,
    tokens: Vec<u32>,
    prompt: usize,
    computed: usize,
    hashes: Vec<BlockHash>,
}

impl BenchReq {
    fn new(id: &str, n: usize) -> Self {
        let mut r = Self {
            id: id.into(),
            tokens: (0..n as u32).collect(),
            prompt: n,
            computed: 0,
            hashes: Vec::new(),
        };
        r.rehash();
        r
    }

    fn rehash(&mut self) {
        while (self.hashes.len() + 1) * BS <= self.tokens.len() {
            let i = self.hashes.len() as u64;
            let mut b = [0u8; 32];
            b[..8].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
            b[24..].copy_from_slice(&i.to_be_bytes());
            self.hashes.push(BlockHash::from_slice(&b).unwrap());
        }
    }
}

impl StoredBlockSource for BenchReq {
    fn token_ids(&self) -> &[u32] {
        &self.tokens
    }
    fn event_extra_keys(&self, _start: usize, _end: usize) -> EventExtraKeys {
        None
    }
}

impl RequestView for BenchReq {
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
}

fn manager(num_blocks: usize) -> KvCacheManager {
    let groups = vec![ManagerParams::new(AttentionKind::FullAttention, BS, 0)];
    KvCacheManager::new(groups, num_blocks, None, ManagerOptions::new(1 << 20, BS)).unwrap()
}

fn lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("get_computed_blocks_cached");
    for k in [8usize, 16, 32, 64, 128] {
        let n = k * 1024;
        let mut mgr = manager(n / BS + 64);
        let owner = BenchReq::new("owner", n);
        mgr.allocate_slots(&owner, &AllocateArgs::new(n))
            .unwrap()
            .unwrap();
        let probe = BenchReq::new("probe", n);
        let (_, hit) = mgr.get_computed_blocks(&probe).unwrap();
        assert_eq!(hit, n - BS);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("{k}k")),
            &probe,
            |b, p| b.iter(|| black_box(mgr.get_computed_blocks(p).unwrap())),
        );
    }
    g.finish();
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("allocate_slots_decode");
    let mut mgr = manager(4096);
    let mut reqs: Vec<BenchReq> = (0..64)
        .map(|i| BenchReq::new(&format!("r{i}"), 512))
        .collect();
    for r in &mut reqs {
        mgr.allocate_slots(r, &AllocateArgs::new(512))
            .unwrap()
            .unwrap();
        r.computed = 512;
    }
    g.throughput(Throughput::Elements(reqs.len() as u64));
    g.bench_function("64_requests_one_step", |b| {
        b.iter(|| {
            for r in reqs.iter_mut() {
                if r.tokens.len() >= 2048 {
                    mgr.free(&r.id).unwrap();
                    r.tokens.truncate(512);
                    r.hashes.truncate(512 / BS);
                    r.computed = 0;
                    mgr.allocate_slots(r, &AllocateArgs::new(512))
                        .unwrap()
                        .unwrap();
                    r.computed = 512;
                }
                r.tokens.push(7);
                r.rehash();
                black_box(mgr.allocate_slots(r, &AllocateArgs::new(1)).unwrap());
                r.computed += 1;
            }
        })
    });
    g.finish();
}

criterion_group!(benches, lookup, decode);
criterion_main!(benches);
