//! [`RequestView`]: what the managers read from a request.

use crate::events::event::StoredBlockSource;
use crate::pool::RetentionHints;
use crate::request::SlotHint;
use crate::types::BlockHash;

/// What the managers read from a request.
pub trait RequestView: StoredBlockSource {
    /// The request id.
    fn request_id(&self) -> &str;
    /// Prompt plus output tokens.
    fn num_tokens(&self) -> usize;
    /// Prompt tokens.
    fn num_prompt_tokens(&self) -> usize;
    /// Tokens whose KV is computed (the scheduler advances it).
    fn num_computed_tokens(&self) -> usize;
    /// The prefix hashes at `hash_block_size` granularity.
    fn block_hashes(&self) -> &[BlockHash];
    /// Whether the request skips the prefix-cache lookup (prompt logprobs, pooling).
    fn skip_reading_prefix_cache(&self) -> bool {
        false
    }
    /// How many times the request was preempted.
    fn num_preemptions(&self) -> usize {
        0
    }
    /// vLLM 0.33's `num_in_flight_tokens`: scheduled but not yet settled (0 under
    /// synchronous scheduling).
    fn num_in_flight_tokens(&self) -> usize {
        0
    }
    /// vLLM's `shared_prefix_boundary`: the junction `get_computed_blocks` reported, which
    /// vLLM's scheduler stores on the request. Under sparse caching a sliding-window
    /// group keeps the blocks ending on it, so a sibling request sharing the prefix hits
    /// (0: none).
    fn shared_prefix_boundary(&self) -> usize {
        0
    }
    /// The block size the request's hashes were computed at, if known. With caching on,
    /// the manager rejects a request hashed at another size: its hashes would name the
    /// wrong token spans and hit blocks holding other content.
    fn hash_block_size(&self) -> Option<usize> {
        None
    }
    /// Whether the request is waiting for admission (vLLM's status `WAITING` or
    /// `PREEMPTED`): only such requests keep the admission watermark free.
    fn awaiting_admission(&self) -> bool {
        false
    }
    /// Whether the manager clamps this request to `max_model_len` silently, as vLLM's
    /// manager does for the requests of vLLM's scheduler (which never sends a longer
    /// one), instead of rejecting a longer request (`check_length`).
    fn clamps_to_max_model_len(&self) -> bool {
        false
    }
    /// The request's memo of its manager slot, if it keeps one: saves the manager a
    /// hash of the id and a table probe on every call.
    fn slot_hint(&self) -> Option<&SlotHint> {
        None
    }
    /// What a retention policy reads from the request (its priority, session and
    /// tenant); read once, when the request first gets a slot, and only with a policy.
    fn retention_hints(&self) -> RetentionHints {
        RetentionHints::default()
    }
}
