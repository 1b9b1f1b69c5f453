//! Per-request token and block-hash state (vLLM's `v1.request.Request`, the parts the KV
//! cache manager reads).
//!
//! `block_hashes` grows as vLLM's does: the constructor hashes every full block of the
//! prompt, and each `append_output_token_ids` hashes the blocks it completes, chaining from
//! the last hash. Hence `block_hashes().len() == (num_tokens() - L) / hash_block_size`,
//! `L` being the hasher's `num_hash_lookahead_tokens` (usually 0).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::attention::RequestView;
use crate::error::{KvError, Result};
use crate::events::event::{EventExtraKeys, StoredBlockSource};
use crate::hashing::{
    effective_parent, mm_resume_index, to_event_extra_keys, BlockHashView, BlockHasher, KeySources,
    LoraRequest, MmFeature, PromptEmbeds,
};
use crate::pool::RetentionHints;
use crate::types::{BlockHash, KeyValue};

/// Optional per-request inputs that enter the block hashes as extra keys.
#[derive(Debug, Clone, Default)]
pub struct RequestOptions {
    /// The request's LoRA adapter.
    pub lora: Option<LoraRequest>,
    /// `cache_salt`: isolates this request's prefix cache (first block only).
    pub cache_salt: Option<String>,
    /// Multimodal items, sorted by offset, non-overlapping, within the prompt.
    pub mm_features: Vec<MmFeature>,
    /// Prompt embeddings; with no prompt token ids the prompt is that many zero tokens.
    pub prompt_embeds: Option<PromptEmbeds>,
}

/// A request's memo of the slot a manager last found it at, with a token naming the
/// request. A manager trusts the memo only while its slot still carries the same token,
/// which it sets when it finds or inserts the request and clears when the slot is freed;
/// any other case falls back to the id lookup. Clones share the token, and their id.
#[derive(Debug)]
pub struct SlotHint {
    token: u64,
    slot: AtomicUsize,
}

impl SlotHint {
    /// A hint with a token no other request has, and no slot.
    pub fn new() -> Self {
        static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);
        Self {
            token: NEXT_TOKEN.fetch_add(1, Ordering::Relaxed),
            slot: AtomicUsize::new(usize::MAX),
        }
    }

    /// The token (never 0, the mark of a free slot).
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// The remembered slot (`usize::MAX` for none).
    pub(crate) fn slot(&self) -> usize {
        self.slot.load(Ordering::Relaxed)
    }

    pub(crate) fn set_slot(&self, slot: usize) {
        self.slot.store(slot, Ordering::Relaxed);
    }
}

impl Default for SlotHint {
    fn default() -> Self {
        Self::new()
    }
}

impl Clone for SlotHint {
    fn clone(&self) -> Self {
        Self {
            token: self.token,
            slot: AtomicUsize::new(self.slot()),
        }
    }
}

/// One request as the KV cache manager sees it.
///
/// ```
/// use kvblocks::hashing::{BlockHasher, HashAlgo};
/// use kvblocks::request::{Request, RequestOptions};
/// let hasher = BlockHasher::new(4, HashAlgo::Sha256Cbor).unwrap();
/// let mut req = Request::new("r0", (0..10).collect(), Some(hasher), RequestOptions::default()).unwrap();
/// assert_eq!(req.block_hashes().len(), 2);
/// req.append_output_token_ids(&[10, 11]);
/// assert_eq!(req.block_hashes().len(), 3);
/// ```
#[derive(Debug, Clone)]
pub struct Request {
    request_id: String,
    /// Prompt tokens, then output tokens.
    all_token_ids: Vec<u32>,
    num_prompt_tokens: usize,
    /// Tokens whose KV is computed (or scheduled); the scheduler owns it.
    pub num_computed_tokens: usize,
    /// Tokens of steps whose output is not yet processed (async scheduling); 0 under
    /// vLLM's synchronous scheduler. 0.33's `remove_skipped_blocks` subtracts it.
    pub num_in_flight_tokens: usize,
    /// Times the scheduler preempted this request.
    pub num_preemptions: u32,
    /// Whether prefix-cache hits are ignored for this request (sampling/pooling param).
    pub skip_reading_prefix_cache: bool,
    /// vLLM's scheduling priority (lower is more urgent); a retention policy maps it to
    /// a class.
    pub priority: i64,
    /// The session the request belongs to (a retention policy keeps its blocks).
    pub session_id: Option<String>,
    block_hashes: Vec<BlockHash>,
    hasher: Option<BlockHasher>,
    options: RequestOptions,
    /// Where the last manager that saw this request keeps it.
    slot_hint: SlotHint,
}

impl Request {
    /// A new request; hashes all full prompt blocks when `hasher` is given.
    ///
    /// Fails (and builds nothing) on invalid multimodal features or prompt embeddings
    /// whose size does not match the prompt.
    pub fn new(
        request_id: impl Into<String>,
        prompt_token_ids: Vec<u32>,
        hasher: Option<BlockHasher>,
        options: RequestOptions,
    ) -> Result<Self> {
        let mut all_token_ids = prompt_token_ids;
        if let Some(pe) = &options.prompt_embeds {
            if pe.bytes_per_token == 0 || pe.data.len() % pe.bytes_per_token != 0 {
                return Err(KvError::InvalidArgument(format!(
                    "prompt_embeds: {} bytes is not a whole number of {}-byte rows",
                    pe.data.len(),
                    pe.bytes_per_token
                )));
            }
            let rows = pe.data.len() / pe.bytes_per_token;
            if all_token_ids.is_empty() {
                all_token_ids = vec![0; rows];
            } else if rows != all_token_ids.len() {
                return Err(KvError::InvalidArgument(format!(
                    "prompt_embeds has {rows} rows but the prompt has {} tokens",
                    all_token_ids.len()
                )));
            }
        }
        if all_token_ids.is_empty() {
            return Err(KvError::InvalidArgument(
                "a request needs at least one prompt token (or prompt embedding)".into(),
            ));
        }
        MmFeature::validate_all(&options.mm_features)?;
        let mut req = Self {
            request_id: request_id.into(),
            num_prompt_tokens: all_token_ids.len(),
            all_token_ids,
            num_computed_tokens: 0,
            num_in_flight_tokens: 0,
            num_preemptions: 0,
            skip_reading_prefix_cache: false,
            priority: 0,
            session_id: None,
            block_hashes: Vec::new(),
            hasher,
            options,
            slot_hint: SlotHint::new(),
        };
        req.update_block_hashes();
        Ok(req)
    }

    /// The request id.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// Prompt tokens followed by output tokens.
    pub fn all_token_ids(&self) -> &[u32] {
        &self.all_token_ids
    }

    /// The output tokens appended so far.
    pub fn output_token_ids(&self) -> &[u32] {
        &self.all_token_ids[self.num_prompt_tokens..]
    }

    /// `len(all_token_ids)`.
    pub fn num_tokens(&self) -> usize {
        self.all_token_ids.len()
    }

    /// Prompt length.
    pub fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }

    /// Number of output tokens appended.
    pub fn num_output_tokens(&self) -> usize {
        self.all_token_ids.len() - self.num_prompt_tokens
    }

    /// The request's memo of its manager slot.
    pub fn slot_hint(&self) -> &SlotHint {
        &self.slot_hint
    }

    /// Hashes of the full blocks at the hasher's `hash_block_size` (empty without hasher).
    pub fn block_hashes(&self) -> &[BlockHash] {
        &self.block_hashes
    }

    /// The block hashes seen at `block_size` (a multiple of the hash block size).
    pub fn block_hashes_for(&self, block_size: usize) -> Result<BlockHashView<'_>> {
        let hbs = self.hasher.map_or(block_size, |h| h.hash_block_size());
        BlockHashView::new(&self.block_hashes, hbs, block_size)
    }

    /// The hasher, if the request hashes its blocks.
    pub fn hasher(&self) -> Option<BlockHasher> {
        self.hasher
    }

    /// The LoRA adapter.
    pub fn lora(&self) -> Option<&LoraRequest> {
        self.options.lora.as_ref()
    }

    /// The cache salt.
    pub fn cache_salt(&self) -> Option<&str> {
        self.options.cache_salt.as_deref()
    }

    /// The multimodal features (sorted by offset).
    pub fn mm_features(&self) -> &[MmFeature] {
        &self.options.mm_features
    }

    /// The prompt embeddings.
    pub fn prompt_embeds(&self) -> Option<&PromptEmbeds> {
        self.options.prompt_embeds.as_ref()
    }

    /// Appends output tokens and hashes the blocks they complete.
    pub fn append_output_token_ids(&mut self, token_ids: &[u32]) {
        self.all_token_ids.extend_from_slice(token_ids);
        self.update_block_hashes();
    }

    fn key_sources(options: &RequestOptions) -> KeySources<'_> {
        KeySources {
            lora: options.lora.as_ref(),
            mm_features: &options.mm_features,
            cache_salt: options.cache_salt.as_deref(),
            prompt_embeds: options.prompt_embeds.as_ref().map(PromptEmbeds::as_view),
            objs: None,
        }
    }

    /// The hashes of every full block of a prompt of `tokens` with `options`' extra keys,
    /// chained from `root`: what the request hasher of an engine whose NONE_HASH is `root`
    /// computes (the router hashes for engines of other processes). Fails on invalid
    /// multimodal features, as [`Request::new`].
    pub fn hash_prompt(
        hasher: &BlockHasher,
        root: BlockHash,
        tokens: &[u32],
        options: &RequestOptions,
    ) -> Result<Vec<BlockHash>> {
        MmFeature::validate_all(&options.mm_features)?;
        let mut out = Vec::new();
        hasher.hash_new_blocks(root, 0, tokens, &Self::key_sources(options), &mut out);
        Ok(out)
    }

    /// vLLM's `request_block_hasher`: hashes every newly completed full block.
    fn update_block_hashes(&mut self) {
        let Some(hasher) = self.hasher else { return };
        let Some(span) = hasher.pending_tokens(self.block_hashes.len(), self.num_tokens()) else {
            return;
        };
        let parent = effective_parent(hasher.algo(), self.block_hashes.last());
        let src = Self::key_sources(&self.options);
        let tokens = &self.all_token_ids[span.clone()];
        hasher.hash_new_blocks(parent, span.start, tokens, &src, &mut self.block_hashes);
    }

    /// The tagged extra keys of token range `[start, end)`, as hashed (None if none).
    pub fn block_extra_keys(&self, start: usize, end: usize) -> Option<Vec<KeyValue>> {
        self.options.block_extra_keys(start, end)
    }

    /// The untagged extra keys of token range `[start, end)` that a `BlockStored` event
    /// publishes (vLLM's `to_event_extra_keys` of the block's keys; None if none).
    pub fn event_extra_keys(&self, start: usize, end: usize) -> Option<Vec<KeyValue>> {
        self.options.event_extra_keys(start, end)
    }
}

impl RequestOptions {
    /// The tagged extra keys of token range `[start, end)` of a request with these
    /// options, as hashed (None if none).
    pub fn block_extra_keys(&self, start: usize, end: usize) -> Option<Vec<KeyValue>> {
        let src = Request::key_sources(self);
        let idx = mm_resume_index(src.mm_features, start);
        src.block_keys(start, end, idx).0.map(|k| k.to_tagged())
    }

    /// The untagged extra keys of token range `[start, end)` that a `BlockStored` event
    /// publishes (vLLM's `to_event_extra_keys` of the block's keys; None if none).
    pub fn event_extra_keys(&self, start: usize, end: usize) -> Option<Vec<KeyValue>> {
        self.block_extra_keys(start, end)
            .map(|tagged| match to_event_extra_keys(&tagged) {
                Ok(keys) => keys,
                Err(_) => unreachable!("generated keys are always (tag, value, ...) tuples"),
            })
    }
}

/// The events of a request's blocks: its tokens, untagged extra keys, LoRA and session.
impl StoredBlockSource for Request {
    fn token_ids(&self) -> &[u32] {
        self.all_token_ids()
    }
    fn event_extra_keys(&self, start: usize, end: usize) -> EventExtraKeys {
        Request::event_extra_keys(self, start, end)
    }
    fn lora_id(&self) -> Option<i64> {
        self.lora().and_then(|l| l.id).map(i64::from)
    }
    fn lora_name(&self) -> Option<&str> {
        self.lora().map(|l| l.name.as_str())
    }
    fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }
}

/// The manager's view of the crate's request type.
impl RequestView for Request {
    fn request_id(&self) -> &str {
        Request::request_id(self)
    }
    fn num_tokens(&self) -> usize {
        Request::num_tokens(self)
    }
    fn num_prompt_tokens(&self) -> usize {
        Request::num_prompt_tokens(self)
    }
    fn num_computed_tokens(&self) -> usize {
        self.num_computed_tokens
    }
    fn block_hashes(&self) -> &[BlockHash] {
        Request::block_hashes(self)
    }
    fn skip_reading_prefix_cache(&self) -> bool {
        self.skip_reading_prefix_cache
    }
    fn num_preemptions(&self) -> usize {
        self.num_preemptions as usize
    }
    fn num_in_flight_tokens(&self) -> usize {
        self.num_in_flight_tokens
    }
    fn hash_block_size(&self) -> Option<usize> {
        self.hasher().map(|h| h.hash_block_size())
    }
    fn slot_hint(&self) -> Option<&SlotHint> {
        Some(Request::slot_hint(self))
    }
    fn retention_hints(&self) -> RetentionHints {
        RetentionHints::new(
            self.priority,
            self.session_id.is_some(),
            self.cache_salt(),
            self.lora().map(|l| l.name.as_str()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::{hash_block_tokens, HashAlgo};

    fn hasher(hbs: usize) -> Option<BlockHasher> {
        Some(BlockHasher::new(hbs, HashAlgo::Sha256Cbor).unwrap())
    }

    fn s(x: &str) -> KeyValue {
        KeyValue::Str(x.to_owned())
    }

    #[test]
    fn hashes_grow_with_full_blocks_only() {
        let mut r =
            Request::new("r", (0..7).collect(), hasher(3), RequestOptions::default()).unwrap();
        assert_eq!(r.block_hashes().len(), 2);
        r.append_output_token_ids(&[7]);
        assert_eq!(r.block_hashes().len(), 2);
        r.append_output_token_ids(&[8, 9, 10, 11, 12]);
        assert_eq!(r.block_hashes().len(), 4);
        assert_eq!(r.num_output_tokens(), 6);
        // The chain equals hashing block by block.
        let mut parent = None;
        for (i, h) in r.block_hashes().iter().enumerate() {
            let toks = &r.all_token_ids()[i * 3..i * 3 + 3];
            let want = hash_block_tokens(HashAlgo::Sha256Cbor, parent.as_ref(), toks, None);
            assert_eq!(*h, want);
            parent = Some(want);
        }
    }

    #[test]
    fn no_hasher_no_hashes() {
        let r = Request::new("r", (0..64).collect(), None, RequestOptions::default()).unwrap();
        assert!(r.block_hashes().is_empty());
    }

    #[test]
    fn extra_keys_enter_the_hash_and_the_events() {
        let opts = RequestOptions {
            lora: Some(LoraRequest::new("L".into(), "/p".into(), 3).unwrap()),
            cache_salt: Some("salt".into()),
            mm_features: vec![MmFeature {
                identifier: "img".into(),
                offset: 2,
                length: 4,
            }],
            prompt_embeds: None,
        };
        let r = Request::new("r", (0..8).collect(), hasher(4), opts).unwrap();
        let k0 = r.block_extra_keys(0, 4).unwrap();
        assert_eq!(
            k0,
            vec![
                KeyValue::Tuple(vec![s("lora"), s("L"), s("/p")]),
                KeyValue::Tuple(vec![s("mm"), s("img"), KeyValue::Int(2)]),
                KeyValue::Tuple(vec![s("cache_salt"), s("salt")]),
            ]
        );
        let h0 = hash_block_tokens(HashAlgo::Sha256Cbor, None, &[0, 1, 2, 3], Some(&k0));
        assert_eq!(r.block_hashes()[0], h0);
        let k1 = r.block_extra_keys(4, 8).unwrap();
        let h1 = hash_block_tokens(HashAlgo::Sha256Cbor, Some(&h0), &[4, 5, 6, 7], Some(&k1));
        assert_eq!(r.block_hashes()[1], h1);
        assert_eq!(
            r.event_extra_keys(4, 8).unwrap(),
            vec![s("L"), KeyValue::Tuple(vec![s("img"), KeyValue::Int(-2)])]
        );
    }

    #[test]
    fn rejects_bad_inputs() {
        let bad_mm = RequestOptions {
            mm_features: vec![
                MmFeature {
                    identifier: "x".into(),
                    offset: 3,
                    length: 4,
                },
                MmFeature {
                    identifier: "y".into(),
                    offset: 1,
                    length: 1,
                },
            ],
            ..Default::default()
        };
        assert!(Request::new("r", vec![0; 5], hasher(2), bad_mm).is_err());
        assert!(Request::new("r", vec![], hasher(2), RequestOptions::default()).is_err());
        let bad_pe = RequestOptions {
            prompt_embeds: Some(PromptEmbeds {
                data: vec![0; 10],
                bytes_per_token: 4,
            }),
            ..Default::default()
        };
        assert!(Request::new("r", vec![], hasher(2), bad_pe).is_err());
    }

    #[test]
    fn a_placeholder_may_end_past_the_prompt() {
        let opts = RequestOptions {
            mm_features: vec![MmFeature {
                identifier: "enc".into(),
                offset: 2,
                length: 100,
            }],
            ..Default::default()
        };
        let r = Request::new("r", vec![0; 6], hasher(2), opts).unwrap();
        assert_eq!(r.block_hashes().len(), 3);
        assert!(r.block_extra_keys(4, 6).is_some());
    }

    #[test]
    fn prompt_embeds_without_tokens_hash_zeros_plus_digest() {
        let pe = PromptEmbeds {
            data: (0..16).collect(),
            bytes_per_token: 2,
        };
        let opts = RequestOptions {
            prompt_embeds: Some(pe.clone()),
            ..Default::default()
        };
        let r = Request::new("r", vec![], hasher(4), opts).unwrap();
        assert_eq!(r.all_token_ids(), &[0; 8]);
        let key = KeyValue::Tuple(vec![
            s("prompt_embeds"),
            KeyValue::Bytes(pe.block_digest(0, 4).to_vec()),
        ]);
        let h0 = hash_block_tokens(HashAlgo::Sha256Cbor, None, &[0; 4], Some(&[key]));
        assert_eq!(r.block_hashes()[0], h0);
    }

    #[test]
    fn coarse_view_uses_hash_block_size() {
        let r = Request::new("r", (0..32).collect(), hasher(4), RequestOptions::default()).unwrap();
        let v = r.block_hashes_for(16).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v.get(1), Some(&r.block_hashes()[7]));
        assert!(r.block_hashes_for(6).is_err());
    }
}
