//! Prefix block hashing, bit-identical to vLLM 0.33.0 (docs/ARCHITECTURE.md, "Hashing").
//!
//! `hash_i = F((parent, tuple(tokens_i), extra_keys_i))` where `parent` is the previous
//! block's hash (NONE_HASH for the first block) and `F` is one of vLLM's four
//! `prefix_caching_hash_algo`s: serialize (pickle protocol 5 or canonical CBOR), then
//! digest (SHA-256 or xxh3-128).
//!
//! ```
//! use kvblocks::hashing::{hash_block_tokens, HashAlgo};
//! let algo: HashAlgo = "sha256_cbor".parse().unwrap();
//! let h0 = hash_block_tokens(algo, None, &[0, 1, 2, 3], None);
//! let h1 = hash_block_tokens(algo, Some(&h0), &[4, 5, 6, 7], None);
//! assert_eq!(h1.as_bytes().len(), 32);
//! ```

mod cbor;
mod chain;
mod encode;
mod extra_keys;
mod pickle;
mod sha256;
mod tokens;
mod view;

use std::cell::RefCell;
use std::str::FromStr;
use std::sync::OnceLock;

use crate::error::{KvError, Result};
use crate::types::{BlockHash, KeyValue};

use cbor::Cbor;
pub(crate) use encode::Token;
use encode::{encode_block, encode_str, ExtraKeys};
use pickle::{Pickle, Shared};

pub(crate) use extra_keys::{mm_resume_index, KeySources};
pub use extra_keys::{
    to_event_extra_keys, LoraRequest, MmFeature, PromptEmbeds, PromptEmbedsView, StrObjects,
};
pub use view::BlockHashView;

/// vLLM's `prefix_caching_hash_algo`: how a block's hash input is serialized and digested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashAlgo {
    /// `sha256`: pickle protocol 5, SHA-256 (vLLM's default).
    Sha256,
    /// `sha256_cbor`: canonical CBOR, SHA-256 (portable; kvblocks' recommended choice).
    Sha256Cbor,
    /// `xxhash`: pickle protocol 5, xxh3-128.
    Xxhash,
    /// `xxhash_cbor`: canonical CBOR, xxh3-128.
    XxhashCbor,
}

impl HashAlgo {
    /// Every algorithm, in vLLM's order.
    pub const ALL: [HashAlgo; 4] = [
        HashAlgo::Sha256,
        HashAlgo::Sha256Cbor,
        HashAlgo::Xxhash,
        HashAlgo::XxhashCbor,
    ];

    /// vLLM's name for the algorithm.
    pub fn name(self) -> &'static str {
        match self {
            HashAlgo::Sha256 => "sha256",
            HashAlgo::Sha256Cbor => "sha256_cbor",
            HashAlgo::Xxhash => "xxhash",
            HashAlgo::XxhashCbor => "xxhash_cbor",
        }
    }

    /// Length of the digest in bytes (32 for SHA-256, 16 for xxh3-128).
    pub fn digest_len(self) -> usize {
        match self {
            HashAlgo::Sha256 | HashAlgo::Sha256Cbor => 32,
            HashAlgo::Xxhash | HashAlgo::XxhashCbor => 16,
        }
    }

    /// Whether the algorithm is collision resistant (vLLM then uses a fixed NONE_HASH seed).
    pub fn is_cryptographic(self) -> bool {
        matches!(self, HashAlgo::Sha256 | HashAlgo::Sha256Cbor)
    }

    fn index(self) -> usize {
        self as usize
    }

    fn digest(self, data: &[u8]) -> BlockHash {
        let out = match self {
            HashAlgo::Sha256 | HashAlgo::Sha256Cbor => BlockHash::from_slice(&sha256::sha256(data)),
            HashAlgo::Xxhash | HashAlgo::XxhashCbor => {
                BlockHash::from_slice(&xxhash_rust::xxh3::xxh3_128(data).to_be_bytes())
            }
        };
        digest_hash(out)
    }

    /// [`HashAlgo::digest`] of `buf[..len]`, where `buf` holds [`pickle::PLAIN_SLACK`]
    /// bytes more, which SHA-256 overwrites with its padding.
    fn digest_in_place(self, buf: &mut [u8], len: usize) -> BlockHash {
        match self {
            HashAlgo::Sha256 | HashAlgo::Sha256Cbor => {
                digest_hash(BlockHash::from_slice(&sha256::sha256_padded(buf, len)))
            }
            HashAlgo::Xxhash | HashAlgo::XxhashCbor => self.digest(&buf[..len]),
        }
    }
}

/// A digest as a [`BlockHash`] (digests are at most 32 bytes, so it always is one).
fn digest_hash(h: Result<BlockHash>) -> BlockHash {
    match h {
        Ok(h) => h,
        Err(_) => unreachable!("digests are at most 32 bytes"),
    }
}

impl FromStr for HashAlgo {
    type Err = KvError;

    fn from_str(s: &str) -> Result<Self> {
        HashAlgo::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| KvError::UnknownAlgorithm(s.to_owned()))
    }
}

impl std::fmt::Display for HashAlgo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Reused serialization buffers (one set per thread), so hashing allocates nothing per
/// block in steady state.
#[derive(Default)]
pub(crate) struct Scratch {
    buf: Vec<u8>,
    memo: Vec<(Shared, u32)>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch { buf: Vec::new(), memo: Vec::new() })
    };
}

/// Runs `f` with this thread's scratch buffers (fresh ones if they are already in use).
pub(crate) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::default()),
    })
}

impl Scratch {
    /// `F((parent, tuple(tokens), extra_keys))` with this scratch's buffers.
    pub(crate) fn hash_block<K: ExtraKeys + ?Sized>(
        &mut self,
        algo: HashAlgo,
        parent: &BlockHash,
        tokens: &[impl Token],
        extra_keys: Option<&K>,
    ) -> BlockHash {
        let parent = parent.as_bytes();
        match algo {
            HashAlgo::Sha256Cbor | HashAlgo::XxhashCbor => {
                let mut e = Cbor::new(&mut self.buf);
                algo.digest(encode_block(&mut e, parent, tokens, extra_keys))
            }
            HashAlgo::Sha256 | HashAlgo::Xxhash => {
                let plain = match extra_keys {
                    None => Token::as_u32s(tokens)
                        .and_then(|t| pickle::plain_block(&mut self.buf, parent, t)),
                    Some(_) => None,
                };
                if let Some(len) = plain {
                    return algo.digest_in_place(&mut self.buf, len);
                }
                let mut e = Pickle::new(&mut self.buf, &mut self.memo);
                algo.digest(encode_block(&mut e, parent, tokens, extra_keys))
            }
        }
    }

    /// `F(s)` for a lone string.
    fn hash_str(&mut self, algo: HashAlgo, s: &str) -> BlockHash {
        match algo {
            HashAlgo::Sha256Cbor | HashAlgo::XxhashCbor => {
                algo.digest(encode_str(&mut Cbor::new(&mut self.buf), s))
            }
            HashAlgo::Sha256 | HashAlgo::Xxhash => algo.digest(encode_str(
                &mut Pickle::new(&mut self.buf, &mut self.memo),
                s,
            )),
        }
    }
}

/// The parent to chain from: vLLM replaces any falsy parent (None or `b""`) by NONE_HASH.
pub(crate) fn effective_parent(algo: HashAlgo, parent: Option<&BlockHash>) -> BlockHash {
    match parent {
        Some(p) if !p.as_bytes().is_empty() => *p,
        _ => none_hash(algo),
    }
}

/// vLLM's `hash_block_tokens`: the hash of one full block chained to its parent.
///
/// `parent` None (or empty) means the first block, chained from [`none_hash`].
/// `extra_keys` None serializes as Python `None`; `Some(&[])` as the empty tuple.
pub fn hash_block_tokens(
    algo: HashAlgo,
    parent: Option<&BlockHash>,
    tokens: &[u32],
    extra_keys: Option<&[KeyValue]>,
) -> BlockHash {
    let parent = effective_parent(algo, parent);
    with_scratch(|s| s.hash_block(algo, &parent, tokens, extra_keys))
}

/// vLLM's NONE_HASH for `algo`: the parent of every first block.
///
/// The seed string is `PYTHONHASHSEED` if set; otherwise `"vllm-none-hash"` for the
/// SHA-256 kinds and a random per-process `os.urandom(32).hex()`-like string for the
/// xxhash kinds. NONE_HASH is `F(seed)`, computed once per process per algorithm (as
/// vLLM's `init_none_hash`, which runs once at engine start).
pub fn none_hash(algo: HashAlgo) -> BlockHash {
    static NONE_HASHES: [OnceLock<BlockHash>; 4] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    *NONE_HASHES[algo.index()].get_or_init(|| {
        let seed = none_hash_seed(algo, std::env::var_os("PYTHONHASHSEED"));
        with_scratch(|s| s.hash_str(algo, &seed))
    })
}

/// NONE_HASH of `algo` in an engine whose `PYTHONHASHSEED` is `seed` (`None`: unset), for
/// a process other than that engine (the router). Unset, the SHA-256 kinds use vLLM's
/// fixed seed; the xxhash kinds draw a random one in each process, which no other process
/// can know: `None` for them.
pub fn none_hash_for_seed(algo: HashAlgo, seed: Option<&str>) -> Option<BlockHash> {
    let seed = match seed {
        Some(s) => s.to_owned(),
        None if algo.is_cryptographic() => none_hash_seed(algo, None),
        None => return None,
    };
    Some(with_scratch(|s| s.hash_str(algo, &seed)))
}

/// vLLM 0.33's `resolve_none_hash_seed`.
fn none_hash_seed(algo: HashAlgo, env: Option<std::ffi::OsString>) -> String {
    if let Some(v) = env {
        return v.to_string_lossy().into_owned();
    }
    if algo.is_cryptographic() {
        return "vllm-none-hash".to_owned();
    }
    random_hex_32()
}

/// 32 random bytes from the OS as 64 lowercase hex digits (`os.urandom(32).hex()`).
fn random_hex_32() -> String {
    let mut bytes = [0u8; 32];
    if getrandom::fill(&mut bytes).is_err() {
        // NOTE 1: no OS randomness; fall back to std's randomly keyed SipHash, which is
        // still unpredictable per process.
        use std::hash::{BuildHasher, Hasher};
        for (i, chunk) in bytes.chunks_mut(8).enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(i);
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// vLLM's `get_request_block_hasher(hash_block_size, F, num_hash_lookahead_tokens)`: the
/// hash granularity, algorithm and lookahead a [`crate::request::Request`] hashes its full
/// blocks with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHasher {
    hash_block_size: usize,
    algo: HashAlgo,
    /// NOTE 2: with `L > 0` a block's hash also covers the `L` tokens after it, so it is
    /// emitted only once they exist (vLLM's drafter lookahead).
    lookahead: usize,
}

impl BlockHasher {
    /// A hasher for blocks of `hash_block_size` tokens (must be > 0).
    pub fn new(hash_block_size: usize, algo: HashAlgo) -> Result<Self> {
        if hash_block_size == 0 {
            return Err(KvError::InvalidArgument(
                "hash_block_size must be > 0".to_owned(),
            ));
        }
        Ok(Self {
            hash_block_size,
            algo,
            lookahead: 0,
        })
    }

    /// The same hasher with `num_hash_lookahead_tokens` tokens of lookahead: block `i`'s
    /// hash is emitted once the `L` tokens after it exist, and its extra keys become
    /// `(E, *next_L_tokens)` where `E` are the keys of the block and those tokens.
    pub fn with_lookahead(self, num_hash_lookahead_tokens: usize) -> Self {
        Self {
            lookahead: num_hash_lookahead_tokens,
            ..self
        }
    }

    /// vLLM's `num_hash_lookahead_tokens` (0: none).
    pub fn num_hash_lookahead_tokens(&self) -> usize {
        self.lookahead
    }

    /// Tokens per hashed block.
    pub fn hash_block_size(&self) -> usize {
        self.hash_block_size
    }

    /// The hash algorithm.
    pub fn algo(&self) -> HashAlgo {
        self.algo
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(h: &BlockHash) -> String {
        h.as_bytes().iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn parses_vllm_names_only() {
        for a in HashAlgo::ALL {
            assert_eq!(a.name().parse::<HashAlgo>().unwrap(), a);
        }
        assert_eq!(
            "md5".parse::<HashAlgo>(),
            Err(KvError::UnknownAlgorithm("md5".into()))
        );
    }

    #[test]
    fn default_seeds_give_the_reference_none_hashes() {
        let mut s = Scratch::default();
        let seed = none_hash_seed(HashAlgo::Sha256, None);
        assert_eq!(
            hex(&s.hash_str(HashAlgo::Sha256, &seed)),
            "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"
        );
        assert_eq!(
            hex(&s.hash_str(HashAlgo::Sha256Cbor, &seed)),
            "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
        );
    }

    #[test]
    fn seeds_follow_pythonhashseed_then_the_algorithm() {
        assert_eq!(none_hash_seed(HashAlgo::Xxhash, Some("42".into())), "42");
        assert_eq!(none_hash_seed(HashAlgo::Sha256Cbor, None), "vllm-none-hash");
        let (a, b) = (
            none_hash_seed(HashAlgo::XxhashCbor, None),
            none_hash_seed(HashAlgo::XxhashCbor, None),
        );
        assert_eq!(a.len(), 64);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }

    #[test]
    fn worked_vectors_chain_from_none_hash() {
        // Section 2.3: sha256 without PYTHONHASHSEED.
        let mut s = Scratch::default();
        let nh = s.hash_str(HashAlgo::Sha256, "vllm-none-hash");
        let h0 = s.hash_block::<[KeyValue]>(HashAlgo::Sha256, &nh, &[0u32, 1, 2, 3], None);
        let h1 = s.hash_block::<[KeyValue]>(HashAlgo::Sha256, &h0, &[4u32, 5, 6, 7], None);
        assert!(hex(&h0).starts_with("9da1c530") && hex(&h0).ends_with("a4a195dd"));
        assert!(hex(&h1).starts_with("1c9b6c06") && hex(&h1).ends_with("074b8d43"));
        assert_eq!(h0.external(), 10429158316690216413);
        let nh = s.hash_str(HashAlgo::Sha256Cbor, "vllm-none-hash");
        let h0 = s.hash_block::<[KeyValue]>(HashAlgo::Sha256Cbor, &nh, &[0u32, 1, 2, 3], None);
        assert!(hex(&h0).starts_with("c49ab11f") && hex(&h0).ends_with("20741898"));
    }

    #[test]
    fn falsy_parent_is_none_hash() {
        let empty = BlockHash::from_slice(&[]).unwrap();
        let a = hash_block_tokens(HashAlgo::Sha256Cbor, Some(&empty), &[1, 2], None);
        let b = hash_block_tokens(HashAlgo::Sha256Cbor, None, &[1, 2], None);
        assert_eq!(a, b);
    }

    #[test]
    fn empty_extra_keys_differ_from_none() {
        for algo in HashAlgo::ALL {
            let a = hash_block_tokens(algo, None, &[1, 2], Some(&[]));
            let b = hash_block_tokens(algo, None, &[1, 2], None);
            assert_ne!(a, b);
            assert_eq!(a.as_bytes().len(), algo.digest_len());
        }
    }

    #[test]
    fn hasher_rejects_zero_block_size() {
        assert!(BlockHasher::new(0, HashAlgo::Sha256).is_err());
        assert_eq!(
            BlockHasher::new(16, HashAlgo::Xxhash)
                .unwrap()
                .hash_block_size(),
            16
        );
    }
}
