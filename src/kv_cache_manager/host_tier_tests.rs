//! HiSparse's host tier through the facade, each step checked against vLLM 0.33.0: a
//! `KVCacheManager` with a source group (role `hisparse_source`, host resident) and an
//! indexer group, its `HiSparseCoordinator` bound, driven by the same calls (the source's
//! blocks published with `HiSparseSourceManager.publish_blocks`, as HiSparse does once the
//! host holds them). vLLM's sentinel reads `coordinator.gpu_pool`, set there to the device
//! pool as resident groups would.

use super::tests::{step, TestReq};
use super::*;
use crate::attention::{AttentionKind as K, ManagerParams};
use crate::events::event::KvCacheEvent;

/// Source (group 0, host resident) and indexer (group 1): equal full-attention specs.
fn hisparse(num_blocks: usize, host_num_blocks: Option<usize>) -> Result<KvCacheManager> {
    let mut source = ManagerParams::new(K::FullAttention, 16, 0);
    source.host_resident = true;
    let indexer = ManagerParams::new(K::FullAttention, 16, 0);
    let opts = ManagerOptions {
        enable_kv_cache_events: true,
        host_num_blocks,
        ..ManagerOptions::new(128, 16)
    };
    KvCacheManager::new(vec![source, indexer], num_blocks, None, opts)
}

fn req(id: &str, start: u32, n: usize) -> TestReq {
    TestReq::new(id, (start..start + n as u32).collect(), 16)
}

/// `(kind, group, medium, hashes)` of each event: `S`tored, `R`emoved, `C`leared.
fn events(m: &mut KvCacheManager) -> Vec<(char, u32, &'static str, usize)> {
    m.take_events()
        .into_iter()
        .map(|e| match e {
            KvCacheEvent::BlockStored(s) => ('S', s.group_idx, s.medium, s.block_hashes.len()),
            KvCacheEvent::BlockRemoved(r) => ('R', r.group_idx, r.medium, r.block_hashes.len()),
            KvCacheEvent::AllBlocksCleared => ('C', 0, "", 0),
        })
        .collect()
}

/// The host and device free queues.
fn queues(m: &KvCacheManager) -> (Vec<BlockId>, Vec<BlockId>) {
    let host = m.host_pool().unwrap().free_block_ids().collect();
    (host, m.pool().free_block_ids().collect())
}

#[test]
fn host_pool_allocation_events_hits_frees_and_reset() {
    let mut m = hisparse(12, Some(8)).unwrap();
    let mut a = req("a", 0, 40);
    assert_eq!(
        step(&mut m, &mut a, 40),
        Some(vec![vec![1, 2, 3], vec![1, 2, 3]])
    );
    // The source caches nothing on its own; publishing stores its blocks as CPU.
    assert_eq!(events(&mut m), vec![('S', 1, "GPU", 2)]);
    m.publish_host_blocks(&a, 40).unwrap();
    assert_eq!(events(&mut m), vec![('S', 0, "CPU", 2)]);
    assert_eq!(m.host_pool().unwrap().num_free_blocks(), 4);
    assert_eq!(m.pool().num_free_blocks(), 8);

    // 6 host blocks do not fit in 4, though the device has 8 free: the sentinel.
    let mut b = req("b", 1000, 90);
    assert_eq!(step(&mut m, &mut b, 90), None);

    m.free("a").unwrap();
    assert_eq!(
        queues(&m),
        (
            vec![3, 4, 5, 6, 7, 2, 1],
            vec![3, 4, 5, 6, 7, 8, 9, 10, 11, 2, 1]
        )
    );

    // The source's hit is looked up in the host pool, and kept longer than the
    // reconciled one; the request adopts it only up to the tokens it reuses.
    let c = req("c", 0, 40);
    assert_eq!(
        m.get_computed_blocks(&c).unwrap(),
        (vec![vec![1, 2], vec![1, 2]], 32)
    );
    m.evict_blocks(&[1]).unwrap();
    assert_eq!(events(&mut m), vec![('R', 1, "GPU", 1)]);
    let (hits, hit) = m.get_computed_blocks(&c).unwrap();
    assert_eq!((&hits, hit), (&vec![vec![1, 2], vec![]], 0));
    let mut c = c;
    let mut args = AllocateArgs::new(40);
    args.new_computed_blocks = Some(&hits);
    let new = m.allocate_slots(&c, &args).unwrap();
    c.computed = 40;
    assert_eq!(new, Some(vec![vec![3, 4, 5], vec![3, 4, 5]]));
    assert_eq!(m.get_block_ids("c"), vec![vec![3, 4, 5], vec![3, 4, 5]]);
    assert_eq!(events(&mut m), vec![('S', 1, "GPU", 2)]);
    assert_eq!(
        queues(&m),
        (vec![6, 7, 2, 1], vec![6, 7, 8, 9, 10, 11, 2, 1])
    );

    // Host evictions report CPU, in call order among the device's events.
    let mut d = req("d", 5000, 60);
    assert_eq!(
        step(&mut m, &mut d, 60),
        Some(vec![vec![6, 7, 2, 1], vec![6, 7, 8, 9]])
    );
    m.publish_host_blocks(&d, 60).unwrap();
    assert_eq!(
        events(&mut m),
        vec![
            ('R', 0, "CPU", 1),
            ('R', 0, "CPU", 1),
            ('S', 1, "GPU", 3),
            ('S', 0, "CPU", 3)
        ]
    );
    assert_eq!(queues(&m), (vec![], vec![10, 11, 2, 1]));
    m.free("c").unwrap();
    m.free("d").unwrap();
    assert_eq!(
        queues(&m),
        (
            vec![1, 5, 4, 3, 2, 7, 6],
            vec![9, 5, 10, 11, 2, 1, 4, 3, 8, 7, 6]
        )
    );
    let mut e = req("e", 7000, 50);
    assert_eq!(
        step(&mut m, &mut e, 50),
        Some(vec![vec![1, 5, 4, 3], vec![9, 5, 10, 11]])
    );
    assert_eq!(events(&mut m), vec![('S', 1, "GPU", 3)]);
    m.free("e").unwrap();

    // A reset clears both pools, each once, and keeps both queues' order.
    assert!(m.reset_prefix_cache());
    assert_eq!(events(&mut m), vec![('C', 0, "", 0), ('C', 0, "", 0)]);
    assert_eq!(
        queues(&m),
        (
            vec![3, 4, 5, 1, 2, 7, 6],
            vec![11, 2, 1, 4, 3, 8, 7, 6, 10, 5, 9]
        )
    );
    assert!(m.get_computed_blocks(&req("c2", 0, 40)).unwrap().1 == 0);
}

#[test]
fn host_tier_refusals() {
    // vLLM: "HiSparse host group needs host capacity."
    let err = hisparse(12, None).unwrap_err();
    assert!(matches!(err, KvError::InvalidArgument(_)), "{err}");
    let mut twice = ManagerParams::new(K::FullAttention, 16, 0);
    twice.host_resident = true;
    let opts = ManagerOptions {
        host_num_blocks: Some(8),
        ..ManagerOptions::new(128, 16)
    };
    let err = KvCacheManager::new(vec![twice.clone(), twice], 12, None, opts).unwrap_err();
    assert!(err.to_string().contains("only one"), "{err}");
    // Without a host tier there is no host pool to publish to or evict from.
    let mut m = KvCacheManager::new(
        vec![ManagerParams::new(K::FullAttention, 16, 0)],
        12,
        None,
        ManagerOptions::new(128, 16),
    )
    .unwrap();
    assert!(m.host_pool().is_none());
    assert!(matches!(
        m.evict_host_blocks(&[1]),
        Err(KvError::Unsupported(_))
    ));
    // An unknown request has nothing to publish.
    let mut h = hisparse(12, Some(8)).unwrap();
    assert!(matches!(
        h.publish_host_blocks(&req("x", 0, 16), 16),
        Err(KvError::UnknownRequest(_))
    ));
}

#[test]
fn host_resident_group_must_be_full_attention() {
    let mut swa = ManagerParams::new(
        K::SlidingWindow {
            sliding_window: 32,
            extra_retained_tokens: 0,
        },
        16,
        0,
    );
    swa.host_resident = true;
    let opts = ManagerOptions {
        host_num_blocks: Some(8),
        ..ManagerOptions::new(128, 16)
    };
    let err = KvCacheManager::new(vec![swa], 12, None, opts).unwrap_err();
    assert!(err.to_string().contains("must be full attention"), "{err}");
}

/// vLLM's HiSparse layout: source (host), indexer, resident, hot (2 blocks a request).
fn hisparse_layout() -> KvCacheManager {
    let mut source = ManagerParams::new(K::FullAttention, 16, 0);
    source.host_resident = true;
    let groups = vec![
        source,
        ManagerParams::new(K::FullAttention, 16, 0),
        ManagerParams::new(K::HiSparseResident, 16, 2),
        ManagerParams::new(
            K::HiSparseHot {
                blocks_per_request: 2,
                always_hot: false,
            },
            16,
            3,
        ),
    ];
    let opts = ManagerOptions {
        host_num_blocks: Some(16),
        ..ManagerOptions::new(128, 16)
    };
    KvCacheManager::new(groups, 32, None, opts).unwrap()
}

/// The resident and hot groups' own rules, before any residency work (no spills were
/// planned, so vLLM's coordinator touches no block): host prefixes as null pages, hot
/// regions for host hits and imports, an import's writable last page, and the free order
/// of all four groups.
#[test]
fn resident_and_hot_groups_allocate_and_free() {
    let mut m = hisparse_layout();
    let mut a = req("a", 0, 40);
    let got = step(&mut m, &mut a, 40);
    assert_eq!(
        got,
        Some(vec![vec![1, 2, 3], vec![1, 2, 3], vec![4, 5, 6], vec![]])
    );
    m.publish_host_blocks(&a, 32).unwrap();

    // A host hit: the resident group holds null pages for it, the hot group its region.
    let mut b = req("b", 0, 50);
    let (hits, hit) = m.get_computed_blocks(&b).unwrap();
    assert_eq!(
        (&hits, hit),
        (&vec![vec![1, 2], vec![1, 2], vec![], vec![]], 32)
    );
    let mut args = AllocateArgs::new(18);
    args.num_new_computed_tokens = 32;
    args.new_computed_blocks = Some(&hits);
    let got = m.allocate_slots(&b, &args).unwrap();
    b.computed = 50;
    assert_eq!(
        got,
        Some(vec![vec![4, 5], vec![7, 8], vec![9, 10], vec![11, 12]])
    );
    assert_eq!(
        m.get_block_ids("b"),
        vec![
            vec![1, 2, 4, 5],
            vec![1, 2, 7, 8],
            vec![0, 0, 9, 10],
            vec![11, 12]
        ]
    );

    // An import of 32 tokens: host pages, a writable last resident page, a hot region.
    let c = req("c", 3000, 60);
    let mut args = AllocateArgs::new(28);
    args.num_external_computed_tokens = 32;
    let got = m.allocate_slots(&c, &args).unwrap();
    assert_eq!(
        got,
        Some(vec![vec![8, 9], vec![16, 17], vec![18, 19], vec![20, 21]])
    );
    assert_eq!(
        m.get_block_ids("c"),
        vec![
            vec![6, 7, 8, 9],
            vec![13, 14, 16, 17],
            vec![0, 15, 18, 19],
            vec![20, 21]
        ]
    );
    assert_eq!(
        queues(&m),
        (
            vec![10, 11, 12, 13, 14, 15],
            vec![22, 23, 24, 25, 26, 27, 28, 29, 30, 31]
        )
    );
    for id in ["a", "b", "c"] {
        m.free(id).unwrap();
    }
    assert_eq!(
        queues(&m),
        (
            vec![9, 8, 7, 6, 5, 4, 3, 10, 11, 12, 13, 14, 15, 2, 1],
            vec![
                21, 20, 19, 18, 15, 17, 12, 11, 10, 9, 8, 6, 5, 4, 3, 22, 23, 24, 25, 26, 27, 28,
                29, 30, 31, 7, 2, 1, 16, 14, 13
            ]
        )
    );
    let mut d = req("d", 5000, 100);
    assert_eq!(
        step(&mut m, &mut d, 100),
        Some(vec![
            vec![9, 8, 7, 6, 5, 4, 3],
            vec![21, 20, 19, 18, 15, 17, 12],
            vec![11, 10, 9, 8, 6, 5, 4],
            vec![]
        ])
    );
}

/// Write-back through HiSparse's coordinator calls, against vLLM 0.33.0's
/// `HiSparseCoordinator` on the same calls: the transfers planned, the references they
/// hold, the pages they make valid, the host prefix published, and the unpins of a freed
/// request's clean pages ahead of its other blocks in the free queue.
#[test]
fn write_back_transfers_publish_the_host_prefix() {
    let mut m = hisparse_layout();
    let mut a = req("a", 0, 40);
    assert_eq!(
        step(&mut m, &mut a, 40),
        Some(vec![vec![1, 2, 3], vec![1, 2, 3], vec![4, 5, 6], vec![]])
    );
    m.hisparse_advance_scheduled(&[("a", 40)]).unwrap();
    let sent = m.hisparse_build_offload_command().unwrap().unwrap();
    let brief: Vec<_> = sent
        .iter()
        .map(|t| {
            (
                t.transfer_id,
                t.host_block_id,
                t.resident_block_ids.clone(),
                t.after_forward,
                t.restore,
            )
        })
        .collect();
    assert_eq!(
        brief,
        vec![(0, 1, vec![4], true, false), (1, 2, vec![5], true, false)]
    );
    let refs = |m: &KvCacheManager, ids: &[BlockId], host: bool| -> Vec<i64> {
        let pool = if host {
            m.host_pool().unwrap()
        } else {
            m.pool()
        };
        ids.iter().map(|&b| pool.ref_cnt(b).unwrap()).collect()
    };
    assert_eq!(refs(&m, &[1, 2, 3], true), vec![2, 2, 1]);
    assert_eq!(refs(&m, &[4, 5, 6], false), vec![2, 2, 1]);
    let state = m.hisparse_request_state("a").unwrap();
    assert_eq!((state.valid.len(), state.ready_prefix_pages), (0, 0));
    assert_eq!(
        state
            .pending
            .iter()
            .map(|(&p, &id)| (p, id))
            .collect::<Vec<_>>(),
        vec![(0, 0), (1, 1)]
    );

    for t in 100..124 {
        a.append(t);
    }
    assert_eq!(
        step(&mut m, &mut a, 24),
        Some(vec![vec![4], vec![7], vec![8], vec![]])
    );
    m.hisparse_advance_scheduled(&[("a", 64)]).unwrap();
    let sent = m.hisparse_build_offload_command().unwrap().unwrap();
    let brief: Vec<_> = sent
        .iter()
        .map(|t| (t.transfer_id, t.host_block_id, t.resident_block_ids.clone()))
        .collect();
    assert_eq!(brief, vec![(2, 3, vec![6]), (3, 4, vec![8])]);
    // What the worker lacks, once; the rows to mirror; whether only resident KV is read.
    let updates = m.hisparse_take_residency_updates(&["a"]).unwrap();
    assert_eq!(
        updates
            .iter()
            .map(|u| (u.request_id.as_str(), u.pages.clone(), u.block_ids.clone()))
            .collect::<Vec<_>>(),
        vec![("a", vec![0, 1, 2, 3], vec![vec![4, 5, 6, 8]])]
    );
    assert!(m
        .hisparse_take_residency_updates(&["a"])
        .unwrap()
        .is_empty());
    let mirrors = m
        .hisparse_build_row_mirrors(&[("a", 40, 24), ("zz", 0, 5)])
        .unwrap();
    assert_eq!(
        mirrors
            .iter()
            .map(|x| (x.source_starts.clone(), x.destination_start, x.num_rows))
            .collect::<Vec<_>>(),
        vec![(vec![104], 56, 8), (vec![128], 64, 16)]
    );
    assert!(m
        .hisparse_all_context_pages_resident(&[("a", 40, 24)])
        .unwrap());
    assert!(!m
        .hisparse_all_context_pages_resident(&[("a", 40, 40)])
        .unwrap());
    assert!(m.hisparse_has_pending_work());
    assert!(!m.hisparse_has_pending_reclamation());

    m.hisparse_update_spills(&[(0, 1), (1, 1)], &[(0, 1)])
        .unwrap();
    let state = m.hisparse_request_state("a").unwrap();
    assert_eq!(state.valid.iter().copied().collect::<Vec<_>>(), vec![0]);
    assert_eq!(state.ready_prefix_pages, 1);
    assert_eq!(
        state.pending.keys().copied().collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(state.publication.is_some());
    assert_eq!(refs(&m, &[1, 2, 3, 4], true), vec![1, 2, 2, 2]);
    assert_eq!(refs(&m, &[4, 5, 6, 8], false), vec![1, 2, 2, 2]);

    m.hisparse_update_spills(&[(2, 1), (3, 2)], &[(1, 1), (2, 1), (3, 2)])
        .unwrap();
    let state = m.hisparse_request_state("a").unwrap();
    assert_eq!(
        state.valid.iter().copied().collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert_eq!(state.ready_prefix_pages, 4);
    assert!(state.pending.is_empty() && state.publication.is_none());
    assert_eq!(
        state.pinned_clean.iter().copied().collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert!(state.unpinned.is_empty());
    assert_eq!(refs(&m, &[1, 2, 3, 4], true), vec![1, 1, 1, 1]);
    assert_eq!(refs(&m, &[4, 5, 6, 8], false), vec![1, 1, 1, 1]);
    let host = m.host_pool().unwrap();
    assert!([1, 2, 3, 4]
        .iter()
        .all(|&b| host.block_hash(b).unwrap().is_some()));

    assert!(!m.hisparse_has_pending_work() && !m.hisparse_has_pending_reclamation());
    m.free_request("a", false).unwrap();
    assert_eq!(
        queues(&m),
        (
            vec![5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 4, 3, 2, 1],
            vec![
                9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29,
                30, 31, 8, 6, 5, 4, 7, 3, 2, 1
            ]
        )
    );
}

/// A host hit adopts the GPU copies of the pages another request wrote back, against
/// vLLM 0.33.0's `HiSparseCoordinator` on the same calls: the copies indexed on
/// publication, the adopted row, the references (the active tail stays pinned, the rest
/// is unpinned once the request has its hot region), and the free order.
#[test]
fn host_hit_adopts_gpu_copies() {
    let mut m = hisparse_layout();
    let mut a = req("a", 0, 64);
    assert_eq!(
        step(&mut m, &mut a, 64),
        Some(vec![
            vec![1, 2, 3, 4],
            vec![1, 2, 3, 4],
            vec![5, 6, 7, 8],
            vec![]
        ])
    );
    m.hisparse_advance_scheduled(&[("a", 64)]).unwrap();
    let sent = m.hisparse_build_offload_command().unwrap().unwrap();
    assert_eq!(
        sent.iter()
            .map(|t| (t.transfer_id, t.host_block_id, t.resident_block_ids.clone()))
            .collect::<Vec<_>>(),
        vec![
            (0, 1, vec![5]),
            (1, 2, vec![6]),
            (2, 3, vec![7]),
            (3, 4, vec![8])
        ]
    );
    let all: Vec<(u64, u64)> = (0..4).map(|i| (i, 1)).collect();
    m.hisparse_update_spills(&all, &all).unwrap();
    let mut copies: Vec<BlockId> = m
        .hisparse
        .as_deref()
        .unwrap()
        .copies
        .iter()
        .map(|(_, b)| b[0])
        .collect();
    copies.sort_unstable();
    assert_eq!(copies, vec![5, 6, 7, 8]);

    let mut b = req("b", 0, 80);
    let (hits, hit) = m.get_computed_blocks(&b).unwrap();
    assert_eq!(
        (&hits, hit),
        (
            &vec![vec![1, 2, 3, 4], vec![1, 2, 3, 4], vec![], vec![]],
            64
        )
    );
    let mut args = AllocateArgs::new(16);
    args.num_new_computed_tokens = 64;
    args.new_computed_blocks = Some(&hits);
    assert_eq!(
        m.allocate_slots(&b, &args).unwrap(),
        Some(vec![vec![5], vec![9], vec![10], vec![11, 12]])
    );
    b.computed = 80;
    m.hisparse_advance_scheduled(&[("b", 80)]).unwrap();
    let resident = |m: &KvCacheManager, id: &str| {
        let s = m.slots.get(id).unwrap();
        crate::attention::hisparse_resident::residency_row(&m.slots.tables(s)[2], 0)
    };
    assert_eq!(resident(&m, "b"), vec![5, 6, 7, 8, 10]);
    let refs: Vec<i64> = [5, 6, 7, 8]
        .iter()
        .map(|&x| m.pool().ref_cnt(x).unwrap())
        .collect();
    assert_eq!(refs, vec![1, 1, 1, 2]);
    let state = m.hisparse_request_state("b").unwrap();
    assert_eq!(
        state.valid.iter().copied().collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert_eq!(state.ready_prefix_pages, 4);
    assert_eq!(
        state.pinned_clean.iter().copied().collect::<Vec<_>>(),
        vec![3]
    );
    let sent = m.hisparse_build_offload_command().unwrap().unwrap();
    assert_eq!(
        sent.iter()
            .map(|t| (t.transfer_id, t.host_block_id, t.resident_block_ids.clone()))
            .collect::<Vec<_>>(),
        vec![(4, 5, vec![10])]
    );
    let updates = m.hisparse_take_residency_updates(&["b"]).unwrap();
    assert_eq!(
        (updates[0].pages.clone(), updates[0].block_ids.clone()),
        (vec![0, 1, 2, 3, 4], vec![vec![5, 6, 7, 8, 10]])
    );
    m.free_request("a", false).unwrap();
    m.free_request("b", false).unwrap();
    assert_eq!(
        queues(&m),
        (
            vec![6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 4, 3, 2, 1],
            vec![
                12, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                7, 6, 5, 8, 9, 4, 3, 2, 1
            ]
        )
    );
}
