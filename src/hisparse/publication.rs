//! HiSparse's deferred host publication (vLLM 0.33's `_PendingPublication`): the source
//! group's blocks are cached in the host pool only once the host holds them, which a
//! transfer may report after the request's own call, or after the request is gone. vLLM
//! keeps the `Request` for that; the core keeps what caching reads of it
//! ([`RequestCopy`]), extended on each call rather than copied again.

use crate::attention::RequestView;
use crate::events::event::{EventExtraKeys, StoredBlockSource};
use crate::types::{BlockHash, BlockId};

/// What the host pool's `cache_full_blocks` reads of a request: its tokens, hashes,
/// LoRA, session, and the events' extra keys of each page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestCopy {
    request_id: String,
    num_prompt_tokens: usize,
    token_ids: Vec<u32>,
    block_hashes: Vec<BlockHash>,
    lora_id: Option<i64>,
    lora_name: Option<String>,
    session_id: Option<String>,
    page_size: usize,
    /// The extra keys of page `i`, tokens `[i * page_size, (i + 1) * page_size)`.
    page_extra_keys: Vec<EventExtraKeys>,
}

impl RequestCopy {
    /// An empty copy of `request`, for pages of `page_size` tokens.
    pub fn new<R: RequestView>(request: &R, page_size: usize) -> Self {
        Self {
            request_id: request.request_id().to_owned(),
            num_prompt_tokens: request.num_prompt_tokens(),
            lora_id: request.lora_id(),
            lora_name: request.lora_name().map(str::to_owned),
            session_id: request.session_id().map(str::to_owned),
            page_size,
            ..Self::default()
        }
    }

    /// Brings the copy up to `request`'s first `num_pages` pages: their tokens, the hashes
    /// of the request, and the pages' extra keys. Only what is new is copied.
    pub fn extend<R: RequestView>(&mut self, request: &R, num_pages: usize) {
        let tokens = request.token_ids();
        let end = (num_pages * self.page_size).min(tokens.len());
        if end > self.token_ids.len() {
            self.token_ids
                .extend_from_slice(&tokens[self.token_ids.len()..end]);
        }
        let hashes = request.block_hashes();
        if hashes.len() > self.block_hashes.len() {
            self.block_hashes
                .extend_from_slice(&hashes[self.block_hashes.len()..]);
        }
        while self.page_extra_keys.len() < num_pages {
            let start = self.page_extra_keys.len() * self.page_size;
            let keys = request.event_extra_keys(start, start + self.page_size);
            self.page_extra_keys.push(keys);
        }
    }
}

impl StoredBlockSource for RequestCopy {
    fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }

    /// The extra keys of a page the copy holds (the host pool caches whole pages).
    fn event_extra_keys(&self, start: usize, end: usize) -> EventExtraKeys {
        let page = start / self.page_size;
        debug_assert!(start.is_multiple_of(self.page_size) && end == start + self.page_size);
        self.page_extra_keys.get(page).cloned().flatten()
    }

    fn lora_id(&self) -> Option<i64> {
        self.lora_id
    }

    fn lora_name(&self) -> Option<&str> {
        self.lora_name.as_deref()
    }

    fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }
}

impl RequestView for RequestCopy {
    fn request_id(&self) -> &str {
        &self.request_id
    }

    fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }

    fn num_computed_tokens(&self) -> usize {
        self.token_ids.len()
    }

    fn block_hashes(&self) -> &[BlockHash] {
        &self.block_hashes
    }
}

/// A publication waiting for the host to hold its pages (vLLM's `_PendingPublication`).
#[derive(Debug, Clone, PartialEq)]
pub struct Publication {
    /// What caching reads of the request.
    pub request: RequestCopy,
    /// The request's computed tokens when it was asked for.
    pub num_computed_tokens: usize,
    /// Its pages: the sealed ones of those tokens.
    pub num_pages: usize,
    /// The request's host blocks, held after it was freed with transfers in flight
    /// (vLLM's `detached_blocks`).
    pub detached_blocks: Option<Vec<BlockId>>,
    /// Leading host blocks already cached when it was detached.
    pub num_cached_blocks: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache_manager::tests::TestReq;
    use crate::types::KeyValue;

    /// A request with a LoRA, a session and per-page extra keys.
    struct Tagged(TestReq);

    impl StoredBlockSource for Tagged {
        fn token_ids(&self) -> &[u32] {
            self.0.token_ids()
        }
        fn event_extra_keys(&self, start: usize, end: usize) -> EventExtraKeys {
            Some(vec![KeyValue::Int((start * 1000 + end) as i64)])
        }
        fn lora_id(&self) -> Option<i64> {
            Some(7)
        }
        fn lora_name(&self) -> Option<&str> {
            Some("adapter")
        }
        fn session_id(&self) -> Option<&str> {
            Some("s1")
        }
    }

    impl RequestView for Tagged {
        fn request_id(&self) -> &str {
            self.0.request_id()
        }
        fn num_tokens(&self) -> usize {
            self.0.num_tokens()
        }
        fn num_prompt_tokens(&self) -> usize {
            self.0.num_prompt_tokens()
        }
        fn num_computed_tokens(&self) -> usize {
            self.0.num_computed_tokens()
        }
        fn block_hashes(&self) -> &[BlockHash] {
            self.0.block_hashes()
        }
    }

    #[test]
    fn the_copy_answers_as_the_request_did_for_its_pages() {
        let mut r = Tagged(TestReq::new("r", (0..40).collect(), 16));
        let mut copy = RequestCopy::new(&r, 16);
        copy.extend(&r, 2);
        assert_eq!(copy.token_ids(), &r.token_ids()[..32]);
        assert_eq!(copy.block_hashes(), r.block_hashes());
        assert_eq!(
            copy.event_extra_keys(16, 32),
            r.event_extra_keys(16, 32),
            "page 1"
        );
        assert_eq!(
            (copy.lora_id(), copy.lora_name(), copy.session_id()),
            (Some(7), Some("adapter"), Some("s1"))
        );
        assert_eq!((copy.request_id(), copy.num_prompt_tokens()), ("r", 40));
        // Later calls add only what is new; what was copied stays.
        for t in 40..64 {
            r.0.append(t);
        }
        copy.extend(&r, 4);
        assert_eq!(copy.token_ids(), &r.token_ids()[..64]);
        assert_eq!(copy.block_hashes(), r.block_hashes());
        assert_eq!(copy.event_extra_keys(48, 64), r.event_extra_keys(48, 64));
        copy.extend(&r, 3);
        assert_eq!(copy.num_tokens(), 64, "a smaller extension changes nothing");
    }
}
