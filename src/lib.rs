//! kvblocks: the KV-cache block manager of an LLM serving engine, bit-compatible with
//! vLLM 0.33.0's v1 KV cache manager.
//!
//! The crate decides which KV pages ("blocks", addressed by `u32` ids) each request owns
//! and which cached prefix it can reuse. Blocks are rows in arrays; the free queue is an
//! intrusive doubly linked list over those rows; the prefix cache maps
//! (block hash, group id) to block ids. Python bindings live in `src/python/` behind the
//! `python` feature and only convert; every rule of behaviour lives here.

pub mod admission;
mod arith;
pub mod attention;
pub mod ceilings;
pub mod config;
pub mod coordinator;
pub mod device_ids;
pub mod error;
pub mod events;
pub mod hashing;
pub mod hisparse;
mod host_tier;
pub mod kv_cache_manager;
pub mod offload;
mod partial_hits;
pub mod pool;
pub mod request;
pub mod request_fields;
pub mod spec;
pub mod stats;
pub mod types;
pub mod zeroing;

#[cfg(feature = "python")]
mod python;

pub use error::{KvError, Result};
pub use types::{BlockHash, BlockId, GroupId, KeyValue, NULL_BLOCK_ID};
