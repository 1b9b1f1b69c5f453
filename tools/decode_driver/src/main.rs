//! A deterministic decode loop for counting instructions per `allocate_slots` under
//! callgrind (`count.sh`): 64 requests (prompts of 128 to 632 tokens, hashed at block
//! size 16) decode one token per step for 600 steps, one `allocate_slots` each; a
//! request reaching 1,000 tokens is freed and its 256-token prompt admitted again. The
//! pool (4,096 blocks per group) never runs out, so every call allocates or finds its
//! slots. `full` is one full-attention group; `swa` adds a 1024-token sliding window.
//! The first argument picks the layout; the last line printed is the call count.

#[path = "../../../benches/common/mod.rs"]
mod common;

use common::{layout, request};
use kvblocks::attention::AttentionKind;
use kvblocks::kv_cache_manager::AllocateArgs;
use kvblocks::request::Request;
use std::hint::black_box;

fn main() {
    let name = std::env::args().nth(1).unwrap_or_else(|| "full".into());
    let swa = AttentionKind::SlidingWindow {
        sliding_window: 1024,
        extra_retained_tokens: 0,
    };
    let kinds = match name.as_str() {
        "full" => vec![AttentionKind::FullAttention],
        "swa" => vec![AttentionKind::FullAttention, swa],
        other => panic!("layout {other:?}: expected full or swa"),
    };
    let mut mgr = layout(4096 * kinds.len(), &kinds);
    let mut reqs: Vec<Request> = (0..64)
        .map(|i| request(&format!("r{i}"), 128 + 8 * i))
        .collect();
    for r in &mut reqs {
        let n = r.num_tokens();
        mgr.allocate_slots(r, &AllocateArgs::new(n))
            .unwrap()
            .unwrap();
        r.num_computed_tokens = n;
    }
    let mut calls = 0u64;
    for _ in 0..600 {
        for r in reqs.iter_mut() {
            if r.num_tokens() >= 1000 {
                mgr.free(r.request_id()).unwrap();
                *r = request(r.request_id(), 256);
                mgr.allocate_slots(r, &AllocateArgs::new(256))
                    .unwrap()
                    .unwrap();
                r.num_computed_tokens = 256;
            }
            r.append_output_token_ids(&[7]);
            let fitted = black_box(mgr.allocate_slots(r, &AllocateArgs::new(1)).unwrap());
            assert!(fitted.is_some(), "the pool ran out");
            r.num_computed_tokens += 1;
            calls += 1;
        }
    }
    println!("{name}: {calls} decode calls");
}
