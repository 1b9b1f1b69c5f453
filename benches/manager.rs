//! KVCacheManager benches: prefix lookup of a fully cached prompt (8k..128k tokens,
//! bs 16) and decode-step `allocate_slots`, for full attention and for full attention
//! plus a 1024-token sliding window (two groups).
#![allow(missing_docs)] // criterion_group! generates undocumented public functions

mod common;

use common::{layout, request, BS};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvblocks::attention::AttentionKind;
use kvblocks::kv_cache_manager::{AllocateArgs, KvCacheManager};
use kvblocks::request::Request;
use std::hint::black_box;

fn manager(num_blocks: usize) -> KvCacheManager {
    layout(num_blocks, &[AttentionKind::FullAttention])
}

fn lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("get_computed_blocks_cached");
    for k in [8usize, 16, 32, 64, 128] {
        let n = k * 1024;
        let mut mgr = manager(n / BS + 64);
        let owner = request("owner", n);
        mgr.allocate_slots(&owner, &AllocateArgs::new(n))
            .unwrap()
            .unwrap();
        let probe = request("probe", n);
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
    let swa = AttentionKind::SlidingWindow {
        sliding_window: 1024,
        extra_retained_tokens: 0,
    };
    let full = AttentionKind::FullAttention;
    for (group, kinds) in [
        ("allocate_slots_decode", &[full][..]),
        ("allocate_slots_decode_full_swa1024", &[full, swa][..]),
    ] {
        decode_steps(c, group, layout(4096 * kinds.len(), kinds));
    }
}

/// 64 requests decoding one token per step; a request that reaches 2048 tokens is freed
/// and its prompt admitted again.
fn decode_steps(c: &mut Criterion, group: &str, mut mgr: KvCacheManager) {
    let mut g = c.benchmark_group(group);
    let mut reqs: Vec<Request> = (0..64).map(|i| request(&format!("r{i}"), 512)).collect();
    for r in &mut reqs {
        mgr.allocate_slots(r, &AllocateArgs::new(512))
            .unwrap()
            .unwrap();
        r.num_computed_tokens = 512;
    }
    g.throughput(Throughput::Elements(reqs.len() as u64));
    g.bench_function("64_requests_one_step", |b| {
        b.iter(|| {
            for r in reqs.iter_mut() {
                if r.num_tokens() >= 2048 {
                    // Finished: free it and start the same prompt again.
                    mgr.free(r.request_id()).unwrap();
                    *r = request(r.request_id(), 512);
                    mgr.allocate_slots(r, &AllocateArgs::new(512))
                        .unwrap()
                        .unwrap();
                    r.num_computed_tokens = 512;
                }
                r.append_output_token_ids(&[7]);
                black_box(mgr.allocate_slots(r, &AllocateArgs::new(1)).unwrap());
                r.num_computed_tokens += 1;
            }
        })
    });
    g.finish();
}

criterion_group!(benches, lookup, decode);
criterion_main!(benches);
