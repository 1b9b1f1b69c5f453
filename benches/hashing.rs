//! Block hashing throughput (tokens/s) per algorithm at block size 16, chained, with token
//! ids up to 150000: `hash_block_tokens` block by block, and a whole prompt via `Request`.

use criterion::{black_box, criterion_main, BatchSize, Criterion, Throughput};
use kvblocks::hashing::{hash_block_tokens, BlockHasher, HashAlgo};
use kvblocks::request::{Request, RequestOptions};

const BLOCK: usize = 16;
const NUM_TOKENS: usize = 16 * 1024;

/// Deterministic pseudo-random token ids in 0..150000 (xorshift).
fn tokens() -> Vec<u32> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..NUM_TOKENS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 150_000) as u32
        })
        .collect()
}

fn bench_blocks(c: &mut Criterion) {
    let toks = tokens();
    let mut g = c.benchmark_group("hash_block_tokens_bs16");
    g.throughput(Throughput::Elements(NUM_TOKENS as u64));
    for algo in HashAlgo::ALL {
        g.bench_function(algo.name(), |b| {
            b.iter(|| {
                let mut parent = None;
                for block in toks.chunks_exact(BLOCK) {
                    parent = Some(hash_block_tokens(algo, parent.as_ref(), block, None));
                }
                black_box(parent)
            })
        });
    }
    g.finish();
}

fn bench_request(c: &mut Criterion) {
    let toks = tokens();
    let mut g = c.benchmark_group("request_prompt_bs16");
    g.throughput(Throughput::Elements(NUM_TOKENS as u64));
    for algo in HashAlgo::ALL {
        let hasher = BlockHasher::new(BLOCK, algo).ok();
        g.bench_function(algo.name(), |b| {
            b.iter_batched(
                || toks.clone(),
                |t| Request::new("r", t, hasher, RequestOptions::default()),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

/// All benchmarks of this file.
fn benches() {
    let mut c = Criterion::default().configure_from_args();
    bench_blocks(&mut c);
    bench_request(&mut c);
}

criterion_main!(benches);
