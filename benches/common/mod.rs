//! Request and manager builders shared by `benches/manager.rs` and the decode driver
//! (`tools/decode_driver`, which builds this file against older trees too).

use kvblocks::attention::{AttentionKind, ManagerParams};
use kvblocks::hashing::{BlockHasher, HashAlgo};
use kvblocks::kv_cache_manager::{KvCacheManager, ManagerOptions};
use kvblocks::request::{Request, RequestOptions};

/// The block size (and hash block size) of every bench layout.
pub const BS: usize = 16;

/// A request of `n` tokens hashed at block size 16.
pub fn request(id: &str, n: usize) -> Request {
    let hasher = BlockHasher::new(BS, HashAlgo::Sha256Cbor).unwrap();
    Request::new(
        id,
        (0..n as u32).collect(),
        Some(hasher),
        RequestOptions::default(),
    )
    .unwrap()
}

/// A manager of one group per kind, all at block size 16.
// Older trees' `AttentionKind` is not `Copy`, and the decode driver builds against them.
#[allow(clippy::clone_on_copy)]
pub fn layout(num_blocks: usize, kinds: &[AttentionKind]) -> KvCacheManager {
    let groups = kinds
        .iter()
        .enumerate()
        .map(|(i, k)| ManagerParams::new(k.clone(), BS, i))
        .collect();
    KvCacheManager::new(groups, num_blocks, None, ManagerOptions::new(1 << 20, BS)).unwrap()
}
