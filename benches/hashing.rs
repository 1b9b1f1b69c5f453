//! Block hashing throughput (tokens/s) per algorithm at block size 16, chained, with token
//! ids up to 150000: `hash_block_tokens` block by block, and a whole prompt via `Request`.
//!
//! Each group runs twice: wall-clock time, and this thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`), which stays meaningful on a shared, loaded machine.

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
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

/// This thread's CPU time in ns, or None where the clock is unavailable.
fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// Criterion measurement of thread CPU time, shown like wall time (ns).
struct CpuTime(WallTime);

impl Measurement for CpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns().unwrap_or(0)
    }

    fn end(&self, i: u64) -> u64 {
        thread_cpu_ns().unwrap_or(0).saturating_sub(i)
    }

    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }

    fn zero(&self) -> u64 {
        0
    }

    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        self.0.formatter()
    }
}

fn bench_blocks<M: Measurement>(c: &mut Criterion<M>, suffix: &str) {
    let toks = tokens();
    let mut g = c.benchmark_group(format!("hash_block_tokens_bs16{suffix}"));
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

fn bench_request<M: Measurement>(c: &mut Criterion<M>, suffix: &str) {
    let toks = tokens();
    let mut g = c.benchmark_group(format!("request_prompt_bs16{suffix}"));
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
    bench_blocks(&mut c, "");
    bench_request(&mut c, "");
    if thread_cpu_ns().is_some() {
        let mut c = Criterion::default()
            .with_measurement(CpuTime(WallTime))
            .configure_from_args();
        bench_blocks(&mut c, "_cpu");
        bench_request(&mut c, "_cpu");
    }
}

criterion_main!(benches);
