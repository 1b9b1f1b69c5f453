//! Unit tests of the host tier's structures; the decisions are checked against vLLM
//! itself in tests/offload/test_offload_vllm.py.

use rustc_hash::FxHashSet;

use super::*;
use crate::pool::RetentionPolicy;

fn key(i: u8) -> Key {
    Key::from(vec![i, 0, 0, 0, 0])
}

fn keys(ids: &[u8]) -> Vec<Key> {
    ids.iter().map(|&i| key(i)).collect()
}

/// Stores `ids` (ready at once) and returns the evicted ids.
fn store(m: &mut OffloadManager, req: &str, ids: &[u8]) -> Vec<u8> {
    let ks = keys(ids);
    let out = m.prepare_store(&ks, req).unwrap().expect("room");
    m.complete_store(&out.keys_to_store, true);
    out.evicted.iter().map(|k| k[0]).collect()
}

#[test]
fn linked_map_keeps_order_and_place() {
    let mut m: LinkedMap<u32> = LinkedMap::default();
    for i in 0..4 {
        m.insert(key(i), u32::from(i));
    }
    m.insert(key(1), 10); // keeps its place
    assert!(m.move_to_end(&key(0)));
    assert_eq!(m.remove(&key(2)), Some(2));
    let order: Vec<(u8, u32)> = m.iter().map(|(k, v)| (k[0], *v)).collect();
    assert_eq!(order, vec![(1, 10), (3, 3), (0, 0)]);
    assert_eq!(m.pop_front().map(|(k, _)| k[0]), Some(1));
    assert_eq!(m.len(), 2);
}

#[test]
fn lru_evicts_least_recent_skipping_protected() {
    let mut m = OffloadManager::new(3, &PolicyKind::Lru, false, 0, 100).unwrap();
    assert!(store(&mut m, "a", &[1, 2, 3]).is_empty());
    m.touch(&keys(&[1]));
    // 2 is the least recent, 3 next; 1 was touched.
    assert_eq!(store(&mut m, "b", &[4]), vec![2]);
    let out = m.prepare_store(&keys(&[3, 5]), "c").unwrap().unwrap();
    assert_eq!(out.evicted, keys(&[1]), "3 is offered again, so protected");
}

#[test]
fn arc_promotes_reuse_and_adapts_to_ghost_hits() {
    let mut m = OffloadManager::new(2, &PolicyKind::Arc, false, 0, 100).unwrap();
    store(&mut m, "a", &[1, 2]);
    m.on_request_finished("a");
    m.prepare_load(&keys(&[1]), "b").unwrap();
    m.complete_load(&keys(&[1])).unwrap();
    m.on_request_finished("b"); // 1 reused: T2
    assert_eq!(
        store(&mut m, "c", &[3]),
        vec![2],
        "T1 goes first at target 0"
    );
    assert_eq!(store(&mut m, "d", &[2]), vec![3], "2 is a B1 ghost hit");
}

#[test]
fn retention_quota_takes_the_tenants_own_chunks_first() {
    let policy = RetentionPolicy {
        tenant_quotas: vec![("t".into(), 1)],
        ..RetentionPolicy::default()
    };
    let mut m = OffloadManager::new(4, &PolicyKind::Retention(policy), false, 0, 100).unwrap();
    store(&mut m, "a", &[1, 2]);
    m.set_hints("t", 0, Some("t".into()));
    store(&mut m, "t", &[3, 4]);
    assert_eq!(
        store(&mut m, "b", &[5]),
        vec![3],
        "t holds 2 > 1: its oldest goes"
    );
    assert_eq!(
        store(&mut m, "b", &[6]),
        vec![1],
        "t is at its quota: LRU order"
    );
}

#[test]
fn protected_keys_and_failed_stores() {
    let mut m = OffloadManager::new(2, &PolicyKind::Lru, true, 0, 100).unwrap();
    let out = m.prepare_store(&keys(&[1, 2]), "a").unwrap().unwrap();
    assert_eq!(m.lookup(&key(1)), LookupResult::HitPending);
    assert!(
        m.prepare_store(&keys(&[3]), "a").unwrap().is_none(),
        "nothing evictable"
    );
    m.complete_store(&out.keys_to_store[..1], false);
    assert_eq!(m.lookup(&key(1)), LookupResult::Miss);
    let events = m.take_events();
    assert_eq!(events.len(), 1);
    assert!(events[0].removed && events[0].metadata_only);
    let none: FxHashSet<Key> = FxHashSet::default();
    let mut lru = Lru::default();
    assert!(lru.evict(1, &none).is_none());
}
