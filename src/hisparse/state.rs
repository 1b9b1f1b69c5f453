//! One request's HiSparse residency (vLLM 0.33's `_HiSparseRequestState`), and the pages
//! a step writes back to the host (`plan_prefix_materialization`).
//!
//! A resident page is dirty (only its GPU copy exists), clean (`valid`: the host copy is
//! complete) or unpinned (`unpinned`: clean, and its reference released so the pool may
//! reuse its block). Sets are ordered by page: vLLM sorts wherever their order reaches a
//! pool.

use std::collections::{BTreeMap, BTreeSet};

use super::publication::{Publication, RequestCopy};
use crate::attention::hisparse_resident::resident_page;
use crate::attention::RequestBlocks;
use crate::types::{BlockId, NULL_BLOCK_ID};

/// One request's residency bookkeeping.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestResidency {
    /// Which admission of the request this is (a request freed and admitted again under
    /// the same id gets a new state; transfers planned for the old one keep its number).
    pub generation: u64,
    /// Pages whose host copy is complete.
    pub valid: BTreeSet<usize>,
    /// Leading pages all valid: the prefix that may be published.
    pub ready_prefix_pages: usize,
    /// Pages with a transfer in flight, and its id.
    pub pending: BTreeMap<usize, u64>,
    /// Clean pages still holding their reference.
    pub pinned_clean: BTreeSet<usize>,
    /// Clean pages whose reference was released.
    pub unpinned: BTreeSet<usize>,
    /// Prefix pages whose GPU copies are adopted after the admitting allocation.
    pub pages_to_adopt: usize,
    /// Pages whose GPU copies were indexed for later hits.
    pub copies_recorded_blocks: usize,
    /// Pages below this the worker holds, except the stale ones.
    pub synced_pages: usize,
    /// Pages changed since the worker was sent them.
    pub stale: BTreeSet<usize>,
    /// The host publication waiting for transfers, if any.
    pub publication: Option<Publication>,
    /// The copy of the request that the last publication finished with: the next one
    /// extends it instead of copying the request again (a decode step publishes every
    /// call).
    pub spare_copy: Option<RequestCopy>,
}

/// The pages of a request with `num_computed` computed tokens that a step writes back
/// (vLLM's `plan_prefix_materialization`), at most `budget` of them: each sealed page
/// from the ready prefix (or past the tokens an import is filling in) on that has no
/// transfer in flight, no host copy yet, a GPU copy in every resident group
/// (`resident_rows`) and a host block (`host_table`).
pub fn pages_to_materialize(
    state: &RequestResidency,
    num_computed: usize,
    block_size: usize,
    importing_tokens: usize,
    budget: usize,
    host_table: &[BlockId],
    resident_rows: &[&RequestBlocks],
) -> Vec<usize> {
    let first = state
        .ready_prefix_pages
        .max(importing_tokens.div_ceil(block_size));
    // Pages past the host row have no host block: the range stops there.
    (first..(num_computed / block_size).min(host_table.len()))
        .filter(|page| !state.pending.contains_key(page) && !state.valid.contains(page))
        .filter(|&page| {
            resident_rows
                .iter()
                .all(|rb| resident_page(rb, page).is_some())
        })
        .filter(|&page| host_table.get(page).is_some_and(|&b| b != NULL_BLOCK_ID))
        .take(budget)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(table: Vec<BlockId>) -> RequestBlocks {
        RequestBlocks {
            table,
            ..RequestBlocks::default()
        }
    }

    /// vLLM 0.33.0, source + indexer + resident + hot, 16-token pages: 40 tokens plan
    /// pages 0 and 1 (host 1 and 2, resident 4 and 5); at 64 tokens, with those in
    /// flight, pages 2 and 3.
    #[test]
    fn sealed_pages_without_a_host_copy() {
        let mut state = RequestResidency::default();
        let res = row(vec![4, 5, 6]);
        assert_eq!(
            pages_to_materialize(&state, 40, 16, 0, 8, &[1, 2, 3], &[&res]),
            vec![0, 1]
        );
        state.pending.extend([(0, 0), (1, 1)]);
        let res = row(vec![4, 5, 6, 8]);
        assert_eq!(
            pages_to_materialize(&state, 64, 16, 0, 8, &[1, 2, 3, 4], &[&res]),
            vec![2, 3]
        );
        // The per-step budget, valid pages, the ready prefix and an import's pages.
        assert_eq!(
            pages_to_materialize(&state, 64, 16, 0, 1, &[1, 2, 3, 4], &[&res]),
            vec![2]
        );
        state.valid.insert(2);
        assert_eq!(
            pages_to_materialize(&state, 64, 16, 0, 8, &[1, 2, 3, 4], &[&res]),
            vec![3]
        );
        state.pending.clear();
        state.ready_prefix_pages = 1;
        assert_eq!(
            pages_to_materialize(&state, 64, 16, 40, 8, &[1, 2, 3, 4], &[&res]),
            vec![3]
        );
        // A host-only page (no GPU copy) or a page without a host block is skipped,
        // and spends no budget.
        let res = row(vec![4, 0, 6, 8]);
        assert_eq!(
            pages_to_materialize(&state, 64, 16, 0, 1, &[1, 2, 0, 4], &[&res]),
            vec![3]
        );
    }
}
