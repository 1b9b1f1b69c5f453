//! The router index (`kvblocks::router`): ingest from wire bytes, a 32k-token lookup over
//! a fleet, readers beside a writer, and memory per residency. A plain harness: each
//! figure is the median of alternated rounds (docs/router.md has the table).
//!
//! `cargo bench --bench router` (`-- quick` for fewer rounds)

#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use kvblocks::attention::{AttentionKind, ManagerParams};
use kvblocks::events::event::{BlockRemoved, BlockStored, KvCacheEvent};
use kvblocks::events::{encode_batch, WireFormat};
use kvblocks::hashing::{none_hash_for_seed, BlockHasher, HashAlgo};
use kvblocks::request::{Request, RequestOptions};
use kvblocks::router::{EngineConfig, KvIndex};
use kvblocks::BlockHash;

const BS: usize = 16;
const PROMPT_TOKENS: usize = 32 * 1024;

fn config() -> EngineConfig {
    let full = ManagerParams::new(AttentionKind::FullAttention, BS, 0);
    EngineConfig::new(vec![full], 128 * 1024, BS)
}

/// Synthetic stores carry a parent, so the index's hash check (first blocks of a chain
/// only) passes them over; the prompt's first store carries its real tokens.
fn stored(hashes: &[u64], parent: Option<u64>, first_token: u32) -> KvCacheEvent {
    let tokens = (0..(hashes.len() * BS) as u32)
        .map(|t| first_token.wrapping_add(t) % 150_000)
        .collect();
    stored_tokens(hashes, parent, tokens)
}

fn stored_tokens(hashes: &[u64], parent: Option<u64>, token_ids: Vec<u32>) -> KvCacheEvent {
    KvCacheEvent::BlockStored(Box::new(BlockStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids,
        block_size: BS as u32,
        lora_id: None,
        medium: "GPU",
        lora_name: None,
        extra_keys: Some(vec![None; hashes.len()]),
        group_idx: 0,
        kv_cache_spec_kind: Some("full_attention"),
        kv_cache_spec_sliding_window: None,
        locality: None,
        ownership: None,
        session_id: None,
        lookahead_token_ids: None,
    }))
}

fn removed(hash: u64) -> KvCacheEvent {
    KvCacheEvent::BlockRemoved(BlockRemoved {
        block_hashes: vec![hash],
        medium: "GPU",
        group_idx: 0,
    })
}

fn mix(x: u64) -> u64 {
    (x ^ 0x5851_F42D_4C95_7F2D).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// Payloads of `steps` batches: each stores 64 blocks (4 events of 16, chained) and
/// removes 32 of an earlier batch, as a busy engine's step does.
fn ingest_payloads(steps: u64, seed: u64) -> (Vec<Vec<u8>>, u64) {
    let mut out = Vec::new();
    let mut blocks = 0;
    for s in 0..steps {
        let mut events = Vec::new();
        for e in 0..4u64 {
            let hashes: Vec<u64> = (0..16)
                .map(|b| mix(seed ^ (s << 20) ^ (e << 8) ^ b))
                .collect();
            events.push(stored(
                &hashes,
                Some(mix(seed ^ s)),
                (s * 64 + e * 16) as u32,
            ));
            blocks += 16;
        }
        if s >= 2 {
            for b in 0..32u64 {
                events.push(removed(mix(seed
                    ^ ((s - 2) << 20)
                    ^ ((b / 16) << 8)
                    ^ (b % 16))));
                blocks += 1;
            }
        }
        out.push(encode_batch(s as f64, &events, Some(0), WireFormat::Map));
    }
    (out, blocks)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bench_ingest(rounds: usize) {
    let (payloads, blocks) = ingest_payloads(2_000, 1);
    let mut rates = Vec::new();
    for _ in 0..rounds {
        let index = KvIndex::new();
        let mut cfg = config();
        cfg.data_parallel_rank = Some(0);
        index.add_engine("e", cfg).unwrap();
        let t = Instant::now();
        for (seq, p) in payloads.iter().enumerate() {
            index.ingest("e", Some(seq as u64), p).unwrap();
        }
        rates.push(blocks as f64 / t.elapsed().as_secs_f64());
    }
    println!(
        "ingest from wire bytes (store 64 + remove 32 blocks a batch, one engine): {:.2} M blocks/s",
        median(rates) / 1e6
    );
}

/// `engines` engines, each holding the prompt's first `held` blocks and `extra` others.
fn fleet(engines: usize, prompt: &[BlockHash], tokens: &[u32], held: usize, extra: u64) -> KvIndex {
    let index = KvIndex::new();
    for e in 0..engines {
        let id = format!("e{e}");
        index.add_engine(&id, config()).unwrap();
        let ext: Vec<u64> = prompt[..held].iter().map(BlockHash::external).collect();
        let mut events: Vec<KvCacheEvent> = ext
            .chunks(16)
            .enumerate()
            .map(|(k, c)| {
                let parent = k.checked_sub(1).map(|p| ext[p * 16 + 15]);
                stored_tokens(
                    c,
                    parent,
                    tokens[k * 256..(k * 256 + c.len() * BS)].to_vec(),
                )
            })
            .collect();
        for chunk in 0..extra / 16 {
            let hashes: Vec<u64> = (0..16)
                .map(|b| mix(((e as u64) << 40) ^ (chunk << 8) ^ b))
                .collect();
            events.push(stored(&hashes, Some(chunk), 0));
        }
        let payload = encode_batch(0.0, &events, None, WireFormat::Map);
        index.ingest(&id, Some(0), &payload).unwrap();
    }
    index
}

fn bench_query(rounds: usize) {
    let hasher = BlockHasher::new(BS, HashAlgo::Sha256Cbor).unwrap();
    let root = none_hash_for_seed(HashAlgo::Sha256Cbor, None).unwrap();
    let tokens: Vec<u32> = (0..PROMPT_TOKENS as u32).map(|t| t * 7 % 150_000).collect();
    let opts = RequestOptions::default();
    let prompt = Request::hash_prompt(&hasher, root, &tokens, &opts).unwrap();
    for (engines, held, label) in [
        (64, prompt.len(), "every engine holds the whole prompt"),
        (64, prompt.len() / 8, "every engine holds its first eighth"),
        (64, 0, "no engine holds any of it"),
    ] {
        let index = fleet(engines, &prompt, &tokens, held, 4_096);
        let (mut bare, mut hashed) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = Instant::now();
            black_box(index.hits_from_hashes(&prompt, tokens.len(), None).unwrap());
            bare.push(t.elapsed().as_secs_f64() * 1e6);
            let t = Instant::now();
            black_box(index.hits(&tokens, &opts, None).unwrap());
            hashed.push(t.elapsed().as_secs_f64() * 1e6);
        }
        println!(
            "32k-token prompt (2,048 blocks) over {engines} engines, {label}: {:.1} us \
             without hashing, {:.1} us with sha256_cbor",
            median(bare),
            median(hashed)
        );
    }
}

fn bench_threads(seconds: f64) {
    let hasher = BlockHasher::new(BS, HashAlgo::Sha256Cbor).unwrap();
    let root = none_hash_for_seed(HashAlgo::Sha256Cbor, None).unwrap();
    let tokens: Vec<u32> = (0..4_096u32).collect();
    let prompt = Request::hash_prompt(&hasher, root, &tokens, &RequestOptions::default()).unwrap();
    let index = Arc::new(fleet(8, &prompt, &tokens, prompt.len() / 2, 4_096));
    let (payloads, _) = ingest_payloads(200_000, 9);
    for readers in [1usize, 2, 8] {
        let stop = Arc::new(AtomicBool::new(false));
        let queries = Arc::new(AtomicU64::new(0));
        let writer = {
            let (index, stop) = (index.clone(), stop.clone());
            let payloads = payloads.clone();
            std::thread::spawn(move || {
                let id = format!("w{readers}");
                index.add_engine(&id, config()).unwrap();
                let mut n = 0u64;
                for (seq, p) in payloads.iter().enumerate() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    index.ingest(&id, Some(seq as u64), p).unwrap();
                    n += 1;
                }
                index.remove_engine(&id).unwrap();
                n
            })
        };
        let threads: Vec<_> = (0..readers)
            .map(|_| {
                let (index, stop, queries) = (index.clone(), stop.clone(), queries.clone());
                let prompt = prompt.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        black_box(index.hits_from_hashes(&prompt, 4_096, None).unwrap());
                        queries.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        threads.into_iter().for_each(|t| t.join().unwrap());
        let batches = writer.join().unwrap();
        println!(
            "{readers} reader thread(s) beside one writer (4k-token prompt, 9 engines): \
             {:.0} queries/s, writer {:.0} batches/s",
            queries.load(Ordering::Relaxed) as f64 / seconds,
            batches as f64 / seconds
        );
    }
}

fn bench_memory() {
    let engines = 64;
    let per_engine: u64 = 10_000_000 / engines as u64;
    let index = KvIndex::new();
    for e in 0..engines {
        let id = format!("e{e}");
        index.add_engine(&id, config()).unwrap();
        let chunks = per_engine / 16;
        for (seq, start) in (0..chunks).step_by(256).enumerate() {
            let events: Vec<KvCacheEvent> = (start..(start + 256).min(chunks))
                .map(|chunk| {
                    let hashes: Vec<u64> = (0..16)
                        .map(|b| mix(((e as u64) << 40) ^ (chunk << 8) ^ b))
                        .collect();
                    stored(&hashes, Some(chunk), 0)
                })
                .collect();
            let payload = encode_batch(0.0, &events, None, WireFormat::Map);
            index.ingest(&id, Some(seq as u64), &payload).unwrap();
        }
    }
    let (bytes, residencies) = index.memory().unwrap();
    println!(
        "memory: {residencies} residencies over {engines} engines, {:.1} MiB of tables \
         (both copies): {:.1} bytes per residency",
        bytes as f64 / (1 << 20) as f64,
        bytes as f64 / residencies as f64
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "quick");
    let rounds = if quick { 5 } else { 21 };
    let sections = ["ingest", "query", "threads", "memory"];
    let run = |name: &str| {
        let named: Vec<&String> = args
            .iter()
            .filter(|a| sections.contains(&a.as_str()))
            .collect();
        named.is_empty() || named.iter().any(|a| *a == name)
    };
    if run("ingest") {
        bench_ingest(rounds);
    }
    if run("query") {
        bench_query(rounds);
    }
    if run("threads") {
        bench_threads(if quick { 1.0 } else { 3.0 });
    }
    if run("memory") {
        bench_memory();
    }
}
