//! Hash lookahead in `BlockStored` events (vLLM 0.33's `num_hash_lookahead_tokens`, L):
//! a block's hash also covers the L tokens after it, so its event publishes those tokens
//! (`lookahead_token_ids`) and the extra keys of the block and those tokens, from which
//! a consumer rebuilds the hash as `(parent, block tokens, (extra_keys, *lookahead))`.

use crate::events::event::{EventExtraKeys, StoredBlockSource};

/// The tokens after each block that its hash covers (0: none, vLLM's default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HashLookahead(pub usize);

impl HashLookahead {
    /// The event's extra keys of the block `[start, end)`: those of the window its hash
    /// covers, `[start, end + L)`.
    #[inline]
    pub fn extra_keys(
        self,
        source: &dyn StoredBlockSource,
        start: usize,
        end: usize,
    ) -> EventExtraKeys {
        source.event_extra_keys(start, end + self.0)
    }

    /// The `lookahead_token_ids` of blocks ending at `ends`: `tokens[end..end + L]` each,
    /// or `None` without lookahead.
    pub fn token_ids(
        self,
        source: &dyn StoredBlockSource,
        ends: impl IntoIterator<Item = usize>,
    ) -> Option<Vec<Vec<u32>>> {
        if self.0 == 0 {
            return None;
        }
        let tokens = source.token_ids();
        let window = |end: usize| {
            let end = end.min(tokens.len());
            tokens[end..(end + self.0).min(tokens.len())].to_vec()
        };
        Some(ends.into_iter().map(window).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::event::TokensOnly;

    #[test]
    fn no_lookahead_publishes_none() {
        let src = TokensOnly(&[1, 2, 3, 4]);
        assert_eq!(HashLookahead(0).token_ids(&src, [2, 4]), None);
    }

    #[test]
    fn each_block_gets_the_tokens_after_it() {
        let src = TokensOnly(&[0, 1, 2, 3, 4, 5]);
        assert_eq!(
            HashLookahead(2).token_ids(&src, [2, 4]),
            Some(vec![vec![2, 3], vec![4, 5]])
        );
        // Clipped at the request's end, as Python slicing is.
        assert_eq!(
            HashLookahead(3).token_ids(&src, [4, 7]),
            Some(vec![vec![4, 5], vec![]])
        );
    }
}
