//! vLLM 0.33's `BlockHashListWithBlockSize`: block hashes computed at `hash_block_size` H,
//! seen by a group whose block size is B = k*H.

use crate::error::{KvError, Result};
use crate::types::BlockHash;

/// A borrowed view of a request's block hashes at a coarser block size.
///
/// `view[i] = hashes[(i+1)*k - 1]`, the last H-hash inside big block `i` (it already
/// chains over the whole prefix); `len = hashes.len() / k`. Identity when k == 1.
///
/// ```
/// use kvblocks::hashing::BlockHashView;
/// use kvblocks::BlockHash;
/// let h: Vec<BlockHash> = (0u8..4).map(|i| BlockHash::from_slice(&[i; 32]).unwrap()).collect();
/// let v = BlockHashView::new(&h, 16, 32).unwrap();
/// assert_eq!(v.len(), 2);
/// assert_eq!(v.get(0), Some(&h[1]));
/// assert_eq!(v.get(1), Some(&h[3]));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct BlockHashView<'a> {
    hashes: &'a [BlockHash],
    scale: usize,
}

impl<'a> BlockHashView<'a> {
    /// A view of `hashes` (computed at `hash_block_size`) for blocks of `block_size`
    /// tokens; `block_size` must be a positive multiple of `hash_block_size`.
    pub fn new(hashes: &'a [BlockHash], hash_block_size: usize, block_size: usize) -> Result<Self> {
        if hash_block_size == 0 || block_size == 0 || !block_size.is_multiple_of(hash_block_size) {
            return Err(KvError::InvalidArgument(format!(
                "block_size {block_size} must be a positive multiple of hash_block_size \
                 {hash_block_size}"
            )));
        }
        Ok(Self {
            hashes,
            scale: block_size / hash_block_size,
        })
    }

    /// A view with `scale` hashes per big block, for callers that checked the block
    /// sizes already (a group of a built manager); `scale` must be positive.
    #[inline]
    pub(crate) fn scaled(hashes: &'a [BlockHash], scale: usize) -> Self {
        debug_assert!(scale > 0);
        Self { hashes, scale }
    }

    /// The identity view (block size == hash block size).
    pub fn identity(hashes: &'a [BlockHash]) -> Self {
        Self { hashes, scale: 1 }
    }

    /// `k = block_size / hash_block_size`.
    pub fn scale_factor(&self) -> usize {
        self.scale
    }

    /// Number of full big blocks.
    pub fn len(&self) -> usize {
        self.hashes.len() / self.scale
    }

    /// Whether there is no full big block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The hash of big block `i`, if it is full.
    pub fn get(&self, i: usize) -> Option<&'a BlockHash> {
        (i < self.len()).then(|| self.at(i))
    }

    /// The hash of big block `i`, which must be full (`i < len()`): the one place the
    /// index `hashes[(i + 1) * k - 1]` is written. Panics past the hashes, as indexing.
    #[inline]
    pub fn at(&self, i: usize) -> &'a BlockHash {
        &self.hashes[(i + 1) * self.scale - 1]
    }

    /// The hashes of all full big blocks, in order: every `k`-th hash from the `k`-th
    /// (a strided walk, with no index to compute or check per block).
    #[inline]
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &'a BlockHash> + 'a {
        let last_of_first = self.hashes.get(self.scale - 1..).unwrap_or_default();
        last_of_first.iter().step_by(self.scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(n: u8) -> Vec<BlockHash> {
        (0..n)
            .map(|i| BlockHash::from_slice(&[i; 16]).unwrap())
            .collect()
    }

    #[test]
    fn picks_the_last_hash_of_each_big_block() {
        let h = hashes(7);
        let v = BlockHashView::new(&h, 4, 12).unwrap();
        assert_eq!(v.len(), 2);
        let got: Vec<_> = v.iter().copied().collect();
        assert_eq!(got, vec![h[2], h[5]]);
        assert_eq!(v.get(2), None);
    }

    #[test]
    fn identity_when_sizes_match() {
        let h = hashes(3);
        let v = BlockHashView::new(&h, 16, 16).unwrap();
        assert_eq!(v.iter().copied().collect::<Vec<_>>(), h);
        assert_eq!(BlockHashView::identity(&h).len(), 3);
    }

    #[test]
    fn rejects_non_multiples() {
        assert!(BlockHashView::new(&[], 16, 24).is_err());
        assert!(BlockHashView::new(&[], 0, 16).is_err());
        assert!(BlockHashView::new(&[], 16, 0).is_err());
    }
}
