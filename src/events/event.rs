//! KV cache events, with vLLM 0.33.0's fields (`vllm.distributed.kv_events`). Hashes are
//! in vLLM's default external form: the low 8 digest bytes as an unsigned int.

use crate::types::KeyValue;

/// The medium every event of a GPU block pool reports.
pub const MEDIUM_GPU: &str = "GPU";
/// The medium of a host pool's events.
pub const MEDIUM_CPU: &str = "CPU";
/// The media an event may name (vLLM's `MEDIUM_GPU`, `MEDIUM_CPU`, `MEDIUM_STORAGE`).
pub const MEDIA: [&str; 3] = [MEDIUM_GPU, MEDIUM_CPU, "STORAGE"];

/// One block's extra keys in the untagged event form, or `None` when it has none.
pub type EventExtraKeys = Option<Vec<KeyValue>>;

/// Blocks newly cached by one `cache_full_blocks` call.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockStored {
    /// External hashes of the cached (non-skipped) blocks, in table order.
    pub block_hashes: Vec<u64>,
    /// External hash of the logical parent (`hashes[num_cached - 1]`), if any.
    pub parent_block_hash: Option<u64>,
    /// The request's tokens over the whole cached range, skipped blocks included.
    pub token_ids: Vec<u32>,
    /// Tokens per block of the group.
    pub block_size: u32,
    /// The LoRA adapter id of the request, if any.
    pub lora_id: Option<i64>,
    /// Storage medium (`"GPU"`).
    pub medium: &'static str,
    /// The LoRA name of the request, if any.
    pub lora_name: Option<String>,
    /// One entry per cached block, or `None` when no block was cached.
    pub extra_keys: Option<Vec<EventExtraKeys>>,
    /// The KV cache group.
    pub group_idx: u32,
    /// The group's spec kind, filled in by the manager (`"full_attention"`, ...).
    pub kv_cache_spec_kind: Option<&'static str>,
    /// The group's sliding window, filled in by the manager.
    pub kv_cache_spec_sliding_window: Option<u32>,
    /// `"LOCAL"` or `"REMOTE"` relative to the publisher (offloading tiers); `None` from
    /// a GPU pool.
    pub locality: Option<String>,
    /// The secondary offloading tier that generated the event; `None` from a GPU pool.
    pub ownership: Option<String>,
    /// The session of the request whose blocks are stored (its `session_id`).
    pub session_id: Option<String>,
    /// Per stored block, the tokens after it that its hash covers; `None` without hash
    /// lookahead (always, from kvblocks' pool: its manager refuses lookahead).
    pub lookahead_token_ids: Option<Vec<Vec<u32>>>,
}

/// One cached (hash, group) entry dropped from the prefix cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRemoved {
    /// External hashes removed (vLLM emits one per event).
    pub block_hashes: Vec<u64>,
    /// Storage medium (`"GPU"`).
    pub medium: &'static str,
    /// The KV cache group of the removed entry.
    pub group_idx: u32,
}

/// A KV cache event, in emission order.
#[derive(Debug, Clone, PartialEq)]
pub enum KvCacheEvent {
    /// See [`BlockStored`] (boxed: it is several times the size of the other variants).
    BlockStored(Box<BlockStored>),
    /// See [`BlockRemoved`].
    BlockRemoved(BlockRemoved),
    /// The whole prefix cache was reset.
    AllBlocksCleared,
}

/// What a `BlockStored` event needs from the request whose blocks are being cached.
pub trait StoredBlockSource {
    /// All of the request's tokens (prompt then outputs).
    fn token_ids(&self) -> &[u32];
    /// The untagged extra keys of the block covering tokens `[start, end)`.
    fn event_extra_keys(&self, start: usize, end: usize) -> EventExtraKeys;
    /// The request's LoRA adapter id.
    fn lora_id(&self) -> Option<i64> {
        None
    }
    /// The request's LoRA name.
    fn lora_name(&self) -> Option<&str> {
        None
    }
    /// The request's session.
    fn session_id(&self) -> Option<&str> {
        None
    }
}

/// A source that knows only the tokens (the pool-level Python API).
#[derive(Debug, Clone, Copy)]
pub struct TokensOnly<'a>(pub &'a [u32]);

impl StoredBlockSource for TokensOnly<'_> {
    fn token_ids(&self) -> &[u32] {
        self.0
    }
    fn event_extra_keys(&self, _start: usize, _end: usize) -> EventExtraKeys {
        None
    }
}
