//! HiSparse's coordinator (vLLM 0.33's `vllm.v1.hisparse.coordinator.HiSparseCoordinator`):
//! the residency state machine over the host tier (`crate::host_tier`) and the resident
//! and hot groups (`crate::attention::hisparse_resident`, `hisparse_hot`). Built piece by
//! piece (docs/hisparse-plan.md, section 8); so far the page-transfer ledger
//! ([`spills`]), a request's residency state with the write-back planner ([`state`]),
//! the deferred publication's copy of the request ([`publication`]) and the index of GPU
//! copies of published host pages ([`copies`]).

pub mod copies;
pub mod publication;
pub mod spills;
pub mod state;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::attention::AttentionKind;
use crate::coordinator::Coordinator;
use crate::types::BlockId;
use copies::CopyIndex;
use spills::SpillLedger;
use state::RequestResidency;

/// HiSparse's coordinator state: its groups, its per-request residency and the page
/// transfers in flight. The manager (`kv_cache_manager/hisparse.rs`) lends it the
/// coordinator and the request tables on each call.
#[derive(Debug, Clone)]
pub struct HiSparse {
    /// The host-resident (source) group.
    pub(crate) host_group: usize,
    /// The resident groups, in group order.
    pub(crate) resident_groups: Vec<usize>,
    /// The hot groups, in group order, with their regions' sizes.
    pub(crate) hot_groups: Vec<(usize, usize)>,
    /// Tokens per page (the host and resident block size).
    pub(crate) page_size: usize,
    /// Transfers one step may plan, all requests together (vLLM's `max_spill_pages`).
    pub(crate) max_spill_pages: usize,
    /// Free device blocks below which requests start reading from the host.
    pub(crate) transition_watermark: usize,
    /// Computed tokens multi-module MTP may re-prefill, never written back.
    pub(crate) num_reprefillable_tokens: usize,
    /// Per live request.
    pub(crate) states: FxHashMap<String, RequestResidency>,
    /// States of requests freed with a publication waiting on transfers, by generation.
    pub(crate) detached: FxHashMap<u64, RequestResidency>,
    pub(crate) next_generation: u64,
    pub(crate) ledger: SpillLedger,
    /// Prefix lengths an external load is filling in, per request.
    pub(crate) pending_imports: FxHashMap<String, usize>,
    /// Requests whose resident pages were all non-null when last scanned.
    pub(crate) resident_requests: FxHashSet<String>,
    /// Unpinned device block -> the (request, page) pairs still reading it.
    pub(crate) owners: FxHashMap<BlockId, Vec<(String, usize)>>,
    /// GPU copies of published host pages.
    pub(crate) copies: CopyIndex,
    /// Host copy-on-write pairs handed to the worker, `(destination, source)` in hand-over
    /// order, until it reports them run (vLLM's `_retained_copies`).
    pub(crate) retained_copies: Vec<(BlockId, BlockId)>,
}

/// ACTIVE_TAIL_PAGES of vLLM: the last pages of a row a step may still write, never
/// unpinned.
pub(crate) const ACTIVE_TAIL_PAGES: usize = 2;

impl HiSparse {
    /// The first of HiSparse's own groups (source, resident, hot): vLLM's coordinator
    /// reaches `HiSparseCoordinator.free` from that group's `pop_blocks_for_free`, after
    /// the groups before it freed their blocks.
    pub(crate) fn first_group(&self) -> usize {
        let resident = self.resident_groups.iter().copied();
        let hot = self.hot_groups.iter().map(|&(g, _)| g);
        resident.chain(hot).fold(self.host_group, usize::min)
    }

    /// The HiSparse state of `coord`'s groups, if it has a host tier (vLLM's
    /// `get_hisparse_coordinator`, built with the manager). `num_blocks` is the device
    /// pool's size.
    pub fn new(
        coord: &Coordinator,
        max_model_len: usize,
        num_blocks: usize,
        num_reprefillable_tokens: usize,
    ) -> Option<Box<Self>> {
        let host_group = coord.host_group()?;
        let managers = coord.managers();
        let resident_groups: Vec<usize> = (0..managers.len())
            .filter(|&g| managers[g].params().kind == AttentionKind::HiSparseResident)
            .collect();
        let hot_groups: Vec<(usize, usize)> = managers
            .iter()
            .enumerate()
            .filter_map(|(g, m)| match m.params().kind {
                AttentionKind::HiSparseHot {
                    blocks_per_request, ..
                } => Some((g, blocks_per_request)),
                _ => None,
            })
            .collect();
        let page_size = managers[host_group].block_size();
        let (max_spill_pages, transition_watermark) = if resident_groups.is_empty() {
            (0, 0)
        } else {
            let hot_cost: usize = hot_groups.iter().map(|&(_, n)| n).sum();
            (max_model_len / page_size, hot_cost.max(num_blocks / 10))
        };
        Some(Box::new(Self {
            host_group,
            resident_groups,
            hot_groups,
            page_size,
            max_spill_pages,
            transition_watermark,
            num_reprefillable_tokens,
            states: FxHashMap::default(),
            detached: FxHashMap::default(),
            next_generation: 0,
            ledger: SpillLedger::default(),
            pending_imports: FxHashMap::default(),
            resident_requests: FxHashSet::default(),
            owners: FxHashMap::default(),
            copies: CopyIndex::default(),
            retained_copies: Vec::new(),
        }))
    }

    /// The request's state, made on first use.
    pub(crate) fn state_of(&mut self, request_id: &str) -> &mut RequestResidency {
        if !self.states.contains_key(request_id) {
            self.next_generation += 1;
            let state = RequestResidency {
                generation: self.next_generation,
                ..RequestResidency::default()
            };
            self.states.insert(request_id.to_owned(), state);
        }
        self.states.get_mut(request_id).expect("inserted above")
    }

    /// The host-resident (source) group (vLLM's `host_group_id`).
    pub fn host_group(&self) -> usize {
        self.host_group
    }

    /// The resident groups, in group order.
    pub fn resident_groups(&self) -> &[usize] {
        &self.resident_groups
    }

    /// The hot groups, in group order, each with its region's size in blocks.
    pub fn hot_groups(&self) -> &[(usize, usize)] {
        &self.hot_groups
    }

    /// Transfers one step may plan, all requests together (vLLM's `max_spill_pages`).
    pub fn max_spill_pages(&self) -> usize {
        self.max_spill_pages
    }

    /// Free device blocks below which requests start reading from the host (vLLM's
    /// `transition_watermark`).
    pub fn transition_watermark(&self) -> usize {
        self.transition_watermark
    }

    /// The requests with a residency state, in no particular order (vLLM's
    /// `request_states` keys).
    pub fn state_ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.states.keys().map(String::as_str)
    }

    /// The transfers in flight, by id (vLLM's `pending_spills`), and those planned and not
    /// yet handed over (`spills_to_send`).
    pub fn ledger(&self) -> &SpillLedger {
        &self.ledger
    }

    /// Whether HiSparse does residency work (it has resident groups).
    #[inline]
    pub(crate) fn has_residency(&self) -> bool {
        !self.resident_groups.is_empty()
    }
}
