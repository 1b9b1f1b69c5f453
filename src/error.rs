//! The crate's one error type. Running out of blocks during allocation is *not* an error
//! at the manager level (`allocate_slots` returns `None`, as vLLM does); these variants
//! are for bad input and broken invariants, each mapped to a Python exception in
//! `src/python/`.

use crate::types::BlockId;

/// Every error the core can report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// An argument is out of its domain (negative count, zero tokens, bad size, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// `get_new_blocks(n)` asked for more blocks than are free (vLLM raises ValueError).
    #[error("Cannot get {requested} free blocks from the pool (only {available} free)")]
    OutOfBlocks {
        /// Blocks asked for.
        requested: usize,
        /// Blocks free at the time.
        available: usize,
    },
    /// A block id outside `0..num_blocks`.
    #[error("block id {block_id} is out of range for a pool of {num_blocks} blocks")]
    BlockOutOfRange {
        /// The offending id.
        block_id: u64,
        /// Pool size.
        num_blocks: usize,
    },
    /// Freeing a block whose ref count is already 0.
    #[error("block {0} is already free (ref_cnt == 0): double free")]
    DoubleFree(BlockId),
    /// A hash algorithm name kvblocks does not know.
    #[error(
        "unknown hash algorithm {0:?}; expected one of sha256, sha256_cbor, xxhash, xxhash_cbor"
    )]
    UnknownAlgorithm(String),
    /// A request id the manager does not know, where the call needs one.
    #[error("unknown request {0:?}")]
    UnknownRequest(String),
    /// A KV cache spec or config that cannot be built or merged.
    #[error("invalid KV cache spec: {0}")]
    InvalidSpec(String),
    /// Unpinning a prefix key that is not pinned.
    #[error("not pinned: {0}")]
    NotPinned(String),
    /// A KV event payload that cannot be decoded or applied (truncated, garbled,
    /// oversized, or naming a group or block size the engine was not registered with).
    #[error("invalid KV event payload: {0}")]
    InvalidEvent(String),
    /// An engine id the router index does not know.
    #[error("unknown engine {0:?}")]
    UnknownEngine(String),
    /// An engine's events hash blocks otherwise than its registration says.
    #[error("hash mismatch: {0}")]
    HashMismatch(String),
    /// A feature of vLLM 0.33 that kvblocks does not implement.
    #[error("not supported: {0}")]
    Unsupported(String),
}

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, KvError>;
