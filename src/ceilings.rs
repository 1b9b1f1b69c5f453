//! The simulator's hit-rate ceilings (`kvblocks.sim.ceilings`): block keys, the infinite
//! cache and Belady's cache over a run's log of stores and lookups.
//!
//! This is bookkeeping of `kvblocks simulate`, not a rule of the KV cache manager: the
//! Python module documents the model (what a store and a lookup are, and why Belady's
//! rule here is a strong policy rather than a proven optimum). Rust only makes it fast
//! enough for traces of millions of blocks; `tests/sim/test_ceilings.py` checks it against
//! naive references.

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Hashes a `u64` key (already a hash, or a small test int) with one multiply: enough to
/// spread small ints over the table.
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, k: u64) {
        let z = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = z ^ (z >> 29);
    }
}

type KeyBuild = BuildHasherDefault<KeyHasher>;

/// One key per full block of `tokens`; equal keys mean equal prefixes (and salts).
///
/// Key `i` is xxh3-64 of block `i`'s tokens (little-endian `u32`s) seeded with key
/// `i - 1`; the first block's seed hashes the cache salt, so two token lists' keys agree
/// exactly up to their first differing block (a collision needs about 2**32 blocks).
pub fn block_keys(tokens: &[u32], block_size: usize, salt: Option<&str>) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut seed_bytes = b"kvblocks-sim".to_vec();
    if let Some(s) = salt {
        seed_bytes.push(1);
        seed_bytes.extend_from_slice(s.as_bytes());
    }
    let mut prev = xxh3_64(&seed_bytes);
    let mut buf = Vec::with_capacity(4 * block_size);
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    for block in tokens.chunks_exact(block_size) {
        buf.clear();
        for t in block {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        prev = xxh3_64_with_seed(&buf, prev);
        out.push(prev);
    }
    out
}

/// A run's prefix-cache events in order: stores (blocks entering the cache) and lookups
/// (a first admission's blocks), with the infinite cache's hits computed as it goes.
#[derive(Default)]
pub struct CeilingLog {
    keys: Vec<u64>,
    /// Per event: the end of its keys in `keys`, and whether it is a lookup.
    events: Vec<(usize, bool)>,
    stored: HashSet<u64, KeyBuild>,
}

impl CeilingLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of events recorded (empty stores are not recorded).
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether no event was recorded.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Blocks that entered the cache, in block order.
    pub fn store(&mut self, keys: &[u64]) {
        if keys.is_empty() {
            return;
        }
        self.stored.extend(keys.iter().copied());
        self.keys.extend_from_slice(keys);
        self.events.push((self.keys.len(), false));
    }

    /// A lookup of `keys` (distinct, in block order); returns how many leading keys the
    /// infinite cache (every block ever stored) holds.
    pub fn lookup(&mut self, keys: &[u64]) -> usize {
        let hits = keys.iter().take_while(|k| self.stored.contains(k)).count();
        self.keys.extend_from_slice(keys);
        self.events.push((self.keys.len(), true));
        hits
    }

    /// Hit blocks of every lookup under Belady's rule with `capacity` blocks: when full,
    /// evict the block whose next lookup is farthest (of two keys next wanted by the same
    /// lookup, the later one in it); a stored block that is itself the farthest is not
    /// kept.
    pub fn belady(&self, capacity: usize) -> Vec<u32> {
        let keys = &self.keys;
        let mut width = 1usize;
        let mut start = 0usize;
        for &(end, _) in &self.events {
            width = width.max(end - start + 1);
            start = end;
        }
        let width = width as u64;
        let never = (self.events.len() as u64 + 1) * width;
        // The next use of each key occurrence: the next lookup (after its event) listing it.
        let mut next_use = vec![never; keys.len()];
        let mut upcoming: HashMap<u64, u64, KeyBuild> = HashMap::default();
        for (e, &(end, lookup)) in self.events.iter().enumerate().rev() {
            let start = if e == 0 { 0 } else { self.events[e - 1].0 };
            for p in start..end {
                let k = keys[p];
                next_use[p] = upcoming.get(&k).copied().unwrap_or(never);
                if lookup {
                    upcoming.insert(k, e as u64 * width + (p - start) as u64);
                }
            }
        }
        drop(upcoming);

        // key -> the next use its live heap entry carries; stale heap entries are skipped.
        let mut cached: HashMap<u64, u64, KeyBuild> = HashMap::default();
        let mut heap: BinaryHeap<(u64, u64)> = BinaryHeap::new();
        let mut out = Vec::new();
        let mut start = 0usize;
        for &(end, lookup) in &self.events {
            let range = start..end;
            start = end;
            if heap.len() > 2 * cached.len() + 4096 {
                heap = cached.iter().map(|(&k, &nu)| (nu, k)).collect();
            }
            if lookup {
                let mut hits = 0u32;
                let mut missed = false;
                for p in range {
                    let k = keys[p];
                    if let Some(nu) = cached.get_mut(&k) {
                        if !missed {
                            hits += 1;
                        }
                        *nu = next_use[p];
                        heap.push((next_use[p], k));
                    } else {
                        missed = true;
                    }
                }
                out.push(hits);
                continue;
            }
            if capacity == 0 {
                continue;
            }
            for p in range {
                let k = keys[p];
                if cached.contains_key(&k) {
                    continue;
                }
                let nu = next_use[p];
                if cached.len() >= capacity {
                    // The farthest next use among the cached keys.
                    let (far, victim) = loop {
                        let &(far, victim) = heap.peek().expect("a full cache has heap entries");
                        if cached.get(&victim) == Some(&far) {
                            break (far, victim);
                        }
                        heap.pop();
                    };
                    if far <= nu {
                        continue; // the new block is the one used farthest away: keep none
                    }
                    heap.pop();
                    cached.remove(&victim);
                }
                cached.insert(k, nu);
                heap.push((nu, k));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(events: &[(bool, &[u64])]) -> CeilingLog {
        let mut l = CeilingLog::new();
        for &(lookup, keys) in events {
            if lookup {
                l.lookup(keys);
            } else {
                l.store(keys);
            }
        }
        l
    }

    #[test]
    fn belady_by_hand() {
        // Capacity 2: a, b, then c into the full cache; b is used last, so it goes.
        let l = log(&[
            (false, &[1]),
            (false, &[2]),
            (false, &[3]),
            (true, &[1]),
            (true, &[3]),
            (true, &[2]),
        ]);
        assert_eq!(l.belady(2), vec![1, 1, 0]);
        // A new block used farther away than everything cached is not kept.
        let l = log(&[
            (false, &[1, 2]),
            (false, &[3]),
            (true, &[1, 2]),
            (true, &[3]),
        ]);
        assert_eq!(l.belady(2), vec![2, 0]);
        // A hit needs every block before it.
        let l = log(&[(false, &[2]), (true, &[1, 2])]);
        assert_eq!(l.belady(4), vec![0]);
        let l = log(&[(false, &[2, 3]), (false, &[1]), (true, &[1, 2, 3])]);
        assert_eq!(l.belady(2), vec![2]);
    }

    #[test]
    fn infinite_cache_counts_the_stored_prefix() {
        let mut l = CeilingLog::new();
        l.store(&[5, 6]);
        assert_eq!(l.lookup(&[5, 7, 6]), 1);
        assert_eq!(l.lookup(&[5, 6]), 2);
        assert_eq!(l.len(), 3);
    }

    #[test]
    fn block_keys_share_exactly_the_common_prefix() {
        let a = block_keys(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4, None);
        let b = block_keys(&[1, 2, 3, 4, 5, 6, 7, 0, 9, 9, 9, 9], 4, None);
        assert_eq!((a.len(), b.len()), (2, 3));
        assert!(a[0] == b[0] && a[1] != b[1]);
        assert_ne!(
            block_keys(&[1, 2, 3, 4], 4, Some("")),
            block_keys(&[1, 2, 3, 4], 4, None)
        );
    }
}
