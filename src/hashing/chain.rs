//! vLLM's `request_block_hasher` (the closure `get_request_block_hasher` returns): the
//! hashes of the full blocks a request completed since the last call, chained from the
//! last hash it holds.
//!
//! With `num_hash_lookahead_tokens = L > 0`, block `[s, e)` is emitted only once tokens
//! `[e, e + L)` exist; its hashed tokens stay `[s, e)`, and its extra keys become
//! `(E, *tokens[e:e+L])`, where `E` are the keys of `[s, e + L)` (multimodal features,
//! prompt-embedding digest) or `None`. The multimodal scan then rewinds to the first
//! feature that ends after `e`, so the next block sees the features it shares with the
//! lookahead window.

use std::ops::Range;

use super::encode::LookaheadKeys;
use super::extra_keys::{mm_resume_index, KeySources, MmFeature};
use super::{with_scratch, BlockHasher, Token};
use crate::types::{BlockHash, KeyValue};

impl BlockHasher {
    /// The tokens the next call reads for a request holding `num_hashes` hashes and
    /// `num_tokens` tokens: the new full blocks plus their lookahead tokens; `None` when no
    /// new block is complete (vLLM's early return).
    ///
    /// ```
    /// use kvblocks::hashing::{BlockHasher, HashAlgo};
    /// let h = BlockHasher::new(4, HashAlgo::Sha256Cbor).unwrap().with_lookahead(2);
    /// assert_eq!(h.pending_tokens(0, 5), None);
    /// assert_eq!(h.pending_tokens(0, 11), Some(0..10));
    /// assert_eq!(h.pending_tokens(2, 11), None);
    /// ```
    pub fn pending_tokens(&self, num_hashes: usize, num_tokens: usize) -> Option<Range<usize>> {
        let hbs = self.hash_block_size;
        let start = num_hashes.checked_mul(hbs)?;
        let hashable = num_tokens.checked_sub(self.lookahead)?;
        let end = start.checked_add(hbs)?;
        if end > hashable {
            return None;
        }
        let blocks = (hashable - start) / hbs;
        Some(start..start + blocks * hbs + self.lookahead)
    }

    /// Appends to `out` the hashes of the full blocks of `tokens`, which are the request's
    /// tokens from `start` (a multiple of the block size: the first token without a hash)
    /// on, chained from `parent` (the request's last hash, or NONE_HASH for its first
    /// block). Blocks whose lookahead tokens are not all in `tokens` are left for later.
    pub(crate) fn hash_new_blocks<T: Token>(
        &self,
        parent: BlockHash,
        start: usize,
        tokens: &[T],
        src: &KeySources<'_>,
        out: &mut Vec<BlockHash>,
    ) {
        let (hbs, algo, la) = (self.hash_block_size, self.algo, self.lookahead);
        let blocks = tokens.len().saturating_sub(la) / hbs;
        if blocks == 0 {
            return;
        }
        out.reserve(blocks);
        let mm = src.mm_features;
        let mut mm_idx = 0;
        if start > 0 && mm.last().is_some_and(|f| f.end() > start) {
            mm_idx = mm_resume_index(mm, start);
        }
        let mut parent = parent;
        with_scratch(|s| {
            if src.is_empty() && la == 0 {
                for block in tokens.chunks_exact(hbs).take(blocks) {
                    parent = s.hash_block::<[KeyValue]>(algo, &parent, block, None);
                    out.push(parent);
                }
                return;
            }
            for i in 0..blocks {
                let (lo, hi) = (i * hbs, (i + 1) * hbs);
                let (b0, b1) = (start + lo, start + hi);
                let block = &tokens[lo..hi];
                parent = if la == 0 {
                    let (keys, next) = src.block_keys(b0, b1, mm_idx);
                    mm_idx = next;
                    s.hash_block(algo, &parent, block, keys.as_ref())
                } else {
                    let (keys, next) = src.block_keys(b0, b1 + la, mm_idx);
                    mm_idx = rewind(mm, next, b1);
                    let keys = LookaheadKeys {
                        keys: keys.as_ref(),
                        tokens: &tokens[hi..hi + la],
                    };
                    s.hash_block(algo, &parent, block, Some(&keys))
                };
                out.push(parent);
            }
        });
    }
}

/// vLLM's `generate_lookahead_block_hash_extra_keys` rewind: back to the first feature
/// that ends after the block's end `e` (it may overlap the next block too).
fn rewind(features: &[MmFeature], mut idx: usize, e: usize) -> usize {
    while idx > 0 && features[idx - 1].end() > e {
        idx -= 1;
    }
    idx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::extra_keys::tests::feat;
    use crate::hashing::{hash_block_tokens, none_hash, HashAlgo, LoraRequest, PromptEmbeds};

    /// The plain model: every block hashed from scratch, extra keys from every feature
    /// that overlaps the block's window (no scan state).
    fn model(
        algo: HashAlgo,
        hbs: usize,
        la: usize,
        tokens: &[u32],
        src: &KeySources<'_>,
    ) -> Vec<BlockHash> {
        let mut out = Vec::new();
        let mut parent: Option<BlockHash> = None;
        let mut b0 = 0;
        while b0 + hbs + la <= tokens.len() {
            let b1 = b0 + hbs;
            let w1 = b1 + la;
            let s = |x: &str| KeyValue::Str(x.to_owned());
            let mut keys = Vec::new();
            if let Some(l) = src.lora {
                keys.push(KeyValue::Tuple(vec![s("lora"), s(&l.name), s(&l.path)]));
            }
            for f in src.mm_features {
                if f.offset < w1 && f.end() > b0 {
                    keys.push(KeyValue::Tuple(vec![
                        s("mm"),
                        s(&f.identifier),
                        KeyValue::Int(f.offset as i64 - b0 as i64),
                    ]));
                }
            }
            if let Some(salt) = src.cache_salt.filter(|x| b0 == 0 && !x.is_empty()) {
                keys.push(KeyValue::Tuple(vec![s("cache_salt"), s(salt)]));
            }
            if let Some(pe) = src.prompt_embeds {
                keys.push(KeyValue::Tuple(vec![
                    s("prompt_embeds"),
                    KeyValue::Bytes(pe.block_digest(b0, w1).to_vec()),
                ]));
            }
            let e = (!keys.is_empty()).then_some(KeyValue::Tuple(keys));
            let extra: Option<Vec<KeyValue>> = if la == 0 {
                e.map(|k| match k {
                    KeyValue::Tuple(items) => items,
                    _ => unreachable!(),
                })
            } else {
                let mut v = vec![e.unwrap_or(KeyValue::None)];
                v.extend(tokens[b1..w1].iter().map(|&t| KeyValue::Int(i64::from(t))));
                Some(v)
            };
            let h = hash_block_tokens(algo, parent.as_ref(), &tokens[b0..b1], extra.as_deref());
            out.push(h);
            parent = Some(h);
            b0 = b1;
        }
        out
    }

    /// Feeds `tokens` to the hasher in pieces of `step` tokens, as appends would.
    fn incremental(
        hasher: BlockHasher,
        tokens: &[u32],
        step: usize,
        src: &KeySources<'_>,
    ) -> Vec<BlockHash> {
        let mut out = Vec::new();
        let mut n = 0;
        while n < tokens.len() {
            n = (n + step).min(tokens.len());
            if let Some(span) = hasher.pending_tokens(out.len(), n) {
                assert_eq!(span.start, out.len() * hasher.hash_block_size());
                let parent = out.last().copied().unwrap_or(none_hash(hasher.algo()));
                hasher.hash_new_blocks(parent, span.start, &tokens[span.clone()], src, &mut out);
            }
            let la = hasher.num_hash_lookahead_tokens();
            assert_eq!(out.len(), n.saturating_sub(la) / hasher.hash_block_size());
        }
        out
    }

    #[test]
    fn pending_tokens_wait_for_the_lookahead() {
        let h = BlockHasher::new(4, HashAlgo::Sha256).unwrap();
        assert_eq!(h.pending_tokens(0, 3), None);
        assert_eq!(h.pending_tokens(0, 9), Some(0..8));
        assert_eq!(h.pending_tokens(2, 9), None);
        let h = h.with_lookahead(1);
        assert_eq!(h.num_hash_lookahead_tokens(), 1);
        assert_eq!(h.pending_tokens(0, 0), None);
        assert_eq!(h.pending_tokens(0, 4), None);
        assert_eq!(h.pending_tokens(0, 5), Some(0..5));
        assert_eq!(h.pending_tokens(1, 9), Some(4..9));
        assert_eq!(h.pending_tokens(usize::MAX, 9), None);
    }

    #[test]
    fn chains_match_the_model_for_every_lookahead_and_step() {
        let tokens: Vec<u32> = (0..61).map(|i| (i * 7919 + 3) % 70_000).collect();
        let lora = LoraRequest::new("L".into(), "/p".into(), 1).unwrap();
        let feats = [
            feat("a", 2, 3),
            feat("b", 7, 9),
            feat("c", 16, 1),
            feat("d", 30, 12),
        ];
        let embeds = PromptEmbeds {
            data: (0..=255).cycle().take(40 * 3).collect(),
            bytes_per_token: 3,
        };
        let sources = [
            KeySources::default(),
            KeySources {
                lora: Some(&lora),
                mm_features: &feats,
                cache_salt: Some("salt"),
                ..KeySources::default()
            },
            KeySources {
                lora: None,
                mm_features: &feats[1..],
                cache_salt: None,
                prompt_embeds: Some(embeds.as_view()),
                objs: None,
            },
        ];
        for algo in HashAlgo::ALL {
            for src in &sources {
                for hbs in [1, 4, 5] {
                    for la in [0, 1, 2, 3] {
                        let hasher = BlockHasher::new(hbs, algo).unwrap().with_lookahead(la);
                        let want = model(algo, hbs, la, &tokens, src);
                        for step in [1, 3, 64] {
                            let got = incremental(hasher, &tokens, step, src);
                            assert_eq!(got, want, "{algo} hbs={hbs} la={la} step={step}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn lookahead_keys_take_vllms_shape() {
        // (None, t) for L=1 and (None, t, u) for L=2 when the block has no keys.
        let tokens = [1u32, 2, 3, 4, 5, 6];
        let src = KeySources::default();
        for algo in HashAlgo::ALL {
            let h = BlockHasher::new(2, algo).unwrap();
            let mut out = Vec::new();
            h.with_lookahead(2)
                .hash_new_blocks(none_hash(algo), 0, &tokens, &src, &mut out);
            let extra = [KeyValue::None, KeyValue::Int(3), KeyValue::Int(4)];
            let h0 = hash_block_tokens(algo, None, &[1, 2], Some(&extra));
            assert_eq!(out.len(), 2);
            assert_eq!(out[0], h0);
            out.clear();
            h.with_lookahead(1)
                .hash_new_blocks(none_hash(algo), 0, &tokens[..3], &src, &mut out);
            let h0 = hash_block_tokens(algo, None, &[1, 2], Some(&extra[..2]));
            assert_eq!(out, vec![h0]);
        }
    }

    #[test]
    fn any_int_tokens_hash_as_python_ints() {
        // The i64 path writes what the u32 fast path writes for u32 tokens...
        let tokens: Vec<u32> = (0..40)
            .map(|i| (i * 104_729 % (1 << 31)) | ((i % 2) << 31))
            .collect();
        let wide: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
        let lora = LoraRequest::new("L".into(), "/p".into(), 1).unwrap();
        let feats = [feat("a", 2, 9)];
        let src = KeySources {
            lora: Some(&lora),
            mm_features: &feats,
            cache_salt: Some("s"),
            ..KeySources::default()
        };
        for algo in HashAlgo::ALL {
            for la in [0, 1, 2] {
                let h = BlockHasher::new(4, algo).unwrap().with_lookahead(la);
                let (mut a, mut b) = (Vec::new(), Vec::new());
                h.hash_new_blocks(none_hash(algo), 0, &tokens, &src, &mut a);
                h.hash_new_blocks(none_hash(algo), 0, &wide, &src, &mut b);
                assert_eq!(a, b);
            }
        }
        // ... and negative or wide ints as CPython's pickle and cbor2 do:
        // sha256(dumps((b"x" * 32, (-1, 0, 70000, -300, 2**40), None))).
        let parent = BlockHash::from_slice(&[b'x'; 32]).unwrap();
        let block: [i64; 5] = [-1, 0, 70000, -300, 1 << 40];
        let hex =
            |h: BlockHash| -> String { h.as_bytes().iter().map(|x| format!("{x:02x}")).collect() };
        let src = KeySources::default();
        for (algo, want) in [
            (
                HashAlgo::Sha256,
                "df8eb1b47918a79c66b1471979cc47628dd3f30a3baca36105a584f9b4b7f7b5",
            ),
            (
                HashAlgo::Sha256Cbor,
                "df7cc2a1dbcc25101582b170b8d92bbfb7dc9e617dce559c4c1c28f1f6a6a759",
            ),
        ] {
            let mut out = Vec::new();
            BlockHasher::new(5, algo)
                .unwrap()
                .hash_new_blocks(parent, 0, &block, &src, &mut out);
            assert_eq!(hex(out[0]), want);
        }
    }

    #[test]
    fn rewind_keeps_features_that_reach_past_the_block() {
        let feats = [feat("a", 0, 2), feat("b", 3, 4), feat("c", 8, 1)];
        assert_eq!(rewind(&feats, 3, 5), 1);
        assert_eq!(rewind(&feats, 3, 9), 3);
        assert_eq!(rewind(&feats, 2, 7), 2);
        assert_eq!(rewind(&feats, 0, 0), 0);
    }
}
