//! [`RequestSlots`]: the manager's request table. Each request holding blocks has a slot,
//! and a slot holds the request's table in every group, back to back.

use rustc_hash::FxHashMap;

use crate::attention::{RequestBlocks, RequestView};

/// Request id -> slot, and each slot's per-group tables (`num_groups` of them). A freed
/// slot is reused; a request's `SlotHint` finds its slot without hashing its id.
#[derive(Debug, Clone)]
pub(super) struct RequestSlots {
    num_groups: usize,
    /// Request id -> slot.
    ids: FxHashMap<String, usize>,
    /// Slot `s`'s tables are `tables[s * num_groups..(s + 1) * num_groups]`.
    tables: Vec<RequestBlocks>,
    /// Per slot, the `SlotHint` token of the request it was last found for (0: free).
    hint_tokens: Vec<u64>,
    free: Vec<usize>,
    /// Empty tables standing in for a request without a slot.
    empty: Vec<RequestBlocks>,
}

impl RequestSlots {
    /// An empty table for `num_groups` groups.
    pub(super) fn new(num_groups: usize) -> Self {
        Self {
            num_groups,
            ids: FxHashMap::default(),
            tables: Vec::new(),
            hint_tokens: Vec::new(),
            free: Vec::new(),
            empty: vec![RequestBlocks::default(); num_groups],
        }
    }

    /// Number of groups (tables per slot).
    #[inline]
    pub(super) fn num_groups(&self) -> usize {
        self.num_groups
    }

    /// The slot of the request `request_id`, if it has one.
    #[inline]
    pub(super) fn get(&self, request_id: &str) -> Option<usize> {
        self.ids.get(request_id).copied()
    }

    /// The slot of `request`, if it has one: from its hint when the hint is current,
    /// else by id (then the hint is refreshed).
    pub(super) fn find<R: RequestView>(&mut self, request: &R) -> Option<usize> {
        if let Some(hint) = request.slot_hint() {
            let s = hint.slot();
            if s < self.hint_tokens.len() && self.hint_tokens[s] == hint.token() {
                return Some(s);
            }
        }
        let s = self.get(request.request_id())?;
        self.remember(request, s);
        Some(s)
    }

    /// Records that `request` is at slot `s`, in the slot and in the request's hint.
    fn remember<R: RequestView>(&mut self, request: &R, s: usize) {
        if let Some(hint) = request.slot_hint() {
            self.hint_tokens[s] = hint.token();
            hint.set_slot(s);
        }
    }

    /// Gives `request`, which has no slot, one (reusing a freed one) with empty tables.
    pub(super) fn insert<R: RequestView>(&mut self, request: &R) -> usize {
        let s = self.free.pop().unwrap_or_else(|| {
            let s = self.hint_tokens.len();
            self.tables
                .resize_with(self.tables.len() + self.num_groups, RequestBlocks::default);
            self.hint_tokens.push(0);
            s
        });
        self.ids.insert(request.request_id().to_owned(), s);
        self.remember(request, s);
        s
    }

    /// Removes the request and returns its slot, whose tables the caller empties before
    /// anything else can reuse it.
    pub(super) fn release(&mut self, request_id: &str) -> Option<usize> {
        let s = self.ids.remove(request_id)?;
        self.hint_tokens[s] = 0;
        self.free.push(s);
        Some(s)
    }

    /// The tables of the request in `slot`, in group order.
    #[inline]
    pub(super) fn tables(&self, slot: usize) -> &[RequestBlocks] {
        &self.tables[slot * self.num_groups..(slot + 1) * self.num_groups]
    }

    /// The tables of the request in `slot`, mutably.
    #[inline]
    pub(super) fn tables_mut(&mut self, slot: usize) -> &mut [RequestBlocks] {
        &mut self.tables[slot * self.num_groups..(slot + 1) * self.num_groups]
    }

    /// The tables of the request in `slot`, or empty tables for a request without one.
    #[inline]
    pub(super) fn tables_or_empty(&self, slot: Option<usize>) -> &[RequestBlocks] {
        match slot {
            Some(s) => self.tables(s),
            None => &self.empty,
        }
    }

    /// The tables of the request `request_id`, if it has a slot.
    #[inline]
    pub(super) fn tables_of(&self, request_id: &str) -> Option<&[RequestBlocks]> {
        self.get(request_id).map(|s| self.tables(s))
    }

    /// The ids of the requests holding a slot (in no particular order).
    pub(super) fn ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.ids.keys().map(String::as_str)
    }

    /// Number of requests holding a slot.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }
}
