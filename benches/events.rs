//! KV event publishing costs: encoding throughput (both wire forms) and the scheduler
//! thread's cost of handing a 1,000-event step to the publisher queue.
//!
//! `cargo bench --bench events`

#![allow(missing_docs)] // criterion_group! generates an undocumented function

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvblocks::events::event::{BlockRemoved, BlockStored, KvCacheEvent, MEDIUM_GPU};
use kvblocks::events::{
    encode_batch_into, EventBatch, EventSink, PayloadEncoder, WireFormat, Work,
};

const EVENTS_PER_STEP: usize = 1_000;

/// A step's events: one-block `BlockStored` (16 tokens, as a decode step caching a block)
/// alternating with `BlockRemoved` (its eviction), hashes spread over u64.
fn step_events(seed: u64) -> Vec<KvCacheEvent> {
    (0..EVENTS_PER_STEP as u64)
        .map(|i| {
            let h = (seed ^ i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            if i % 2 == 0 {
                KvCacheEvent::BlockStored(Box::new(BlockStored {
                    block_hashes: vec![h],
                    parent_block_hash: Some(h ^ 1),
                    token_ids: (0..16)
                        .map(|t| (h as u32).wrapping_add(t) % 150_000)
                        .collect(),
                    block_size: 16,
                    lora_id: None,
                    medium: MEDIUM_GPU,
                    lora_name: None,
                    extra_keys: Some(vec![None]),
                    group_idx: 0,
                    kv_cache_spec_kind: Some("full_attention"),
                    kv_cache_spec_sliding_window: None,
                    locality: None,
                    ownership: None,
                    session_id: None,
                    lookahead_token_ids: None,
                }))
            } else {
                KvCacheEvent::BlockRemoved(BlockRemoved {
                    block_hashes: vec![h],
                    medium: MEDIUM_GPU,
                    group_idx: 0,
                })
            }
        })
        .collect()
}

fn encode(c: &mut Criterion) {
    let events = step_events(7);
    let mut g = c.benchmark_group("encode");
    g.throughput(Throughput::Elements(EVENTS_PER_STEP as u64));
    for (name, format) in [("map", WireFormat::Map), ("array", WireFormat::Array)] {
        let mut buf = Vec::new();
        g.bench_function(name, |b| {
            b.iter(|| {
                buf.clear();
                encode_batch_into(&mut buf, 1.0, black_box(&events), Some(0), format);
                black_box(buf.len())
            })
        });
    }
    g.finish();
}

/// The network side: number, mirror into the cache index (snapshots), encode.
fn network_side(c: &mut Criterion) {
    let mut enc = PayloadEncoder::new(WireFormat::Map, Some(0));
    let mut id = 0;
    let mut g = c.benchmark_group("network_side");
    g.throughput(Throughput::Elements(EVENTS_PER_STEP as u64));
    g.bench_function("index_and_encode_map", |b| {
        b.iter_batched(
            || {
                id += 1;
                Work::Batch {
                    id: id - 1,
                    batch: EventBatch {
                        ts: 1.0,
                        events: step_events(id),
                        data_parallel_rank: None,
                    },
                }
            },
            |work| enc.encode(work, 0.0).map(|(_, p)| p.len()),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// The scheduler side: move a step's event Vec into the queue. The batch is popped back
/// in the timed routine and freed outside it (the network thread frees it in production).
fn hand_off(c: &mut Criterion) {
    let sink = EventSink::new(1024).unwrap();
    c.bench_function("sink_push_pop_1000_events", |b| {
        b.iter_batched(
            || EventBatch {
                ts: 1.0,
                events: step_events(3),
                data_parallel_rank: None,
            },
            |batch| {
                sink.push(batch);
                sink.pop(Duration::ZERO)
            },
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, encode, network_side, hand_off);
criterion_main!(benches);
