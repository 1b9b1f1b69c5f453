//! Vocabulary types shared by every module: block ids, group ids and block hashes.

use crate::error::{KvError, Result};

/// A block (KV page) id: the row index in every layer's KV tensor of a group.
pub type BlockId = u32;

/// The index of a KV cache group in `KVCacheConfig.kv_cache_groups`.
pub type GroupId = u32;

/// Block 0 is the null block: popped at pool construction, never handed out, never freed.
pub const NULL_BLOCK_ID: BlockId = 0;

/// Longest digest kvblocks stores (sha256: 32 bytes; xxh3-128: 16 bytes).
pub const MAX_HASH_LEN: usize = 32;

/// A block hash: the raw digest bytes, as vLLM's `BlockHash` (`bytes`).
///
/// Stored inline (no heap) so hashes can live in arrays and map keys.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash {
    len: u8,
    bytes: [u8; MAX_HASH_LEN],
}

impl BlockHash {
    /// Builds a hash from raw digest bytes (at most 32).
    ///
    /// ```
    /// use kvblocks::BlockHash;
    /// let h = BlockHash::from_slice(&[0u8; 16]).unwrap();
    /// assert_eq!(h.as_bytes().len(), 16);
    /// ```
    pub fn from_slice(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > MAX_HASH_LEN {
            return Err(KvError::InvalidArgument(format!(
                "a block hash is at most {MAX_HASH_LEN} bytes, got {}",
                bytes.len()
            )));
        }
        let mut out = [0u8; MAX_HASH_LEN];
        out[..bytes.len()].copy_from_slice(bytes);
        Ok(Self {
            len: bytes.len() as u8,
            bytes: out,
        })
    }

    /// The digest bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// vLLM's external (event) form with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`, the default:
    /// `int.from_bytes(hash, "big") & (2**64 - 1)`, i.e. the last 8 bytes as a big-endian u64.
    ///
    /// ```
    /// use kvblocks::BlockHash;
    /// let h = BlockHash::from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 1]).unwrap();
    /// assert_eq!(h.external(), 1);
    /// ```
    #[inline]
    pub fn external(&self) -> u64 {
        self.as_bytes()
            .iter()
            .rev()
            .take(8)
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
    }
}

impl std::fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockHash(")?;
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// A Python-like value as it appears in block-hash extra keys and in events
/// (`("lora", name, path)`, `("mm", identifier, offset)`, a salt string, a digest, ...).
///
/// Hash functions serialize this tree exactly as vLLM serializes the Python objects
/// (CBOR or pickle), so the same extra keys give the same digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyValue {
    /// Python `None`.
    None,
    /// Python `bool`.
    Bool(bool),
    /// Python `int` within i64.
    Int(i64),
    /// Python `str`.
    Str(String),
    /// Python `bytes`.
    Bytes(Vec<u8>),
    /// Python `tuple`.
    Tuple(Vec<KeyValue>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_is_low_eight_bytes_big_endian() {
        let bytes: Vec<u8> = (1..=32).collect();
        let h = BlockHash::from_slice(&bytes).unwrap();
        assert_eq!(h.external(), u64::from_be_bytes([25, 26, 27, 28, 29, 30, 31, 32]));
    }

    #[test]
    fn rejects_long_hashes() {
        assert!(BlockHash::from_slice(&[0u8; 33]).is_err());
    }
}
