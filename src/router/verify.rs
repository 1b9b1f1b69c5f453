//! The hash check: a sample of an engine's `BlockStored` events is hashed again from their
//! tokens with the engine's registered hash configuration, and must give the hashes the
//! engine published. Another `PYTHONHASHSEED`, hash algorithm or hash block size gives
//! other hashes from the first block on, and would otherwise show as a silent 0 % hit.
//!
//! Only events that can be recomputed from what they carry are checked: the first blocks
//! of a chain (no parent: the chain starts at NONE_HASH), on the GPU, with no extra keys
//! or LoRA adapter (the event carries a LoRA's name, not the path its hash covers), and
//! a token per stored block position (no skipped sliding-window blocks). The first
//! [`ALWAYS`] such events are checked, then one in [`EVERY`].

use crate::error::{KvError, Result};
use crate::request::{Request, RequestOptions};

use super::engine::EngineInfo;
use super::wire::{Medium, Stored};

/// Checkable events always checked first.
pub const ALWAYS: u64 = 16;
/// Then one checkable event in this many.
pub const EVERY: u64 = 64;

/// An engine's sampling state.
#[derive(Debug, Default)]
pub struct HashCheck {
    seen: u64,
}

impl HashCheck {
    /// Checks `s` if it is checkable and sampled; returns whether it was checked, or
    /// `HashMismatch`.
    pub fn check(&mut self, info: &EngineInfo, s: &Stored) -> Result<bool> {
        if !checkable(info, s) {
            return Ok(false);
        }
        self.seen += 1;
        if self.seen > ALWAYS && !self.seen.is_multiple_of(EVERY) {
            return Ok(false);
        }
        verify(info, s).map(|()| true)
    }
}

fn checkable(info: &EngineInfo, s: &Stored) -> bool {
    let hasher = info.domain().hasher;
    let bs = s.block_size as usize;
    s.parent.is_none()
        && !s.has_extra_keys
        && s.medium == Medium::Gpu
        && !s.block_hashes.is_empty()
        && hasher.num_hash_lookahead_tokens() == 0
        && bs.is_multiple_of(hasher.hash_block_size())
        && s.token_ids.len() == s.block_hashes.len() * bs
}

fn verify(info: &EngineInfo, s: &Stored) -> Result<()> {
    let d = info.domain();
    let scale = s.block_size as usize / d.hasher.hash_block_size();
    let ours = Request::hash_prompt(&d.hasher, d.root, &s.token_ids, &RequestOptions::default())?;
    for (k, &theirs) in s.block_hashes.iter().enumerate() {
        let mine = ours[(k + 1) * scale - 1].external();
        if mine != theirs {
            return Err(KvError::HashMismatch(format!(
                "engine {:?} published hash {theirs:#018x} for block {k} of a {}-token \
                 chain; its registration ({}, hash block size {}, its PYTHONHASHSEED) gives \
                 {mine:#018x}",
                &*info.id,
                s.token_ids.len(),
                d.hasher.algo(),
                d.hasher.hash_block_size(),
            )));
        }
    }
    Ok(())
}
