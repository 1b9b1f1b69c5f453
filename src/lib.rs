//! kvblocks: the KV-cache block manager of an LLM serving engine, bit-compatible with
//! vLLM 0.33.0's v1 KV cache manager.
//!
//! The crate decides which KV pages ("blocks", addressed by `u32` ids) each request owns
//! and which cached prefix it can reuse. Blocks are rows in arrays; the free queue is an
//! intrusive doubly linked list over those rows; the prefix cache maps
//! (block hash, group id) to block ids. Python bindings live in `src/python/` behind the
//! `python` feature and only convert; every rule of behaviour lives here.
//!
//! With default features the crate is plain Rust (no Python): a Rust scheduler or router
//! uses [`kv_cache_manager::KvCacheManager`] directly, as the Python package's
//! `kvblocks.KVCacheManager` does.
//!
//! # Example
//!
//! One group of full attention with 16-token blocks: a 40-token prompt takes three
//! blocks; once it is freed, a request with the same first 32 tokens reuses its two full
//! blocks from the prefix cache.
//!
//! ```
//! use kvblocks::attention::{AttentionKind, ManagerParams};
//! use kvblocks::hashing::{BlockHasher, HashAlgo};
//! use kvblocks::kv_cache_manager::{AllocateArgs, KvCacheManager, ManagerOptions};
//! use kvblocks::request::{Request, RequestOptions};
//!
//! # fn main() -> kvblocks::Result<()> {
//! let groups = vec![ManagerParams::new(AttentionKind::FullAttention, 16, 0)];
//! let mut mgr = KvCacheManager::new(groups, 1024, None, ManagerOptions::new(8192, 16))?;
//! let hasher = BlockHasher::new(16, HashAlgo::Sha256Cbor)?;
//! let request = |id: &str, tokens: Vec<u32>| {
//!     Request::new(id, tokens, Some(hasher), RequestOptions::default())
//! };
//!
//! let r0 = request("r0", (0..40).collect())?;
//! let (_, hit) = mgr.get_computed_blocks(&r0)?;
//! assert_eq!(hit, 0);
//! let new = mgr.allocate_slots(&r0, &AllocateArgs::new(40))?;
//! assert_eq!(new, Some(vec![vec![1, 2, 3]])); // None: it does not fit
//! mgr.free("r0")?;
//!
//! let r1 = request("r1", (0..40).chain([7]).collect())?;
//! let (blocks, hit) = mgr.get_computed_blocks(&r1)?;
//! assert_eq!((blocks, hit), (vec![vec![1, 2]], 32));
//! # Ok(())
//! # }
//! ```
//!
//! The map of the modules, and which file holds each rule, is the repository's
//! [`docs/ARCHITECTURE.md`](https://github.com/kvblocks/kvblocks/blob/main/docs/ARCHITECTURE.md).

#![deny(missing_docs)]

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
pub mod router;
pub mod spec;
pub mod stats;
pub mod types;
pub mod zeroing;

#[cfg(feature = "python")]
mod python;

// crates.io's page (README-crate.md) runs as a doctest too.
#[cfg(doctest)]
#[doc = include_str!("../README-crate.md")]
struct ReadmeCrate;

pub use error::{KvError, Result};
pub use types::{BlockHash, BlockId, GroupId, KeyValue, NULL_BLOCK_ID};
