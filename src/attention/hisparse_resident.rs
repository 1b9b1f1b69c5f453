//! HiSparse resident groups (vLLM 0.33's `HiSparseResidentManager`): GPU copies of the
//! host source's pages. Pages only on the host are the null block: a prefix hit on the
//! host, or an import's earlier pages. The table is append-only; pages adopted from a
//! copy or dropped when the pool reuses them go to the row's residency overlay
//! ([`HiSparseRow::residency`](super::hisparse::HiSparseRow)). Never prefix cached.

use super::RequestBlocks;
use crate::arith::cdiv;
use crate::error::Result;
use crate::pool::BlockPool;
use crate::types::{BlockId, NULL_BLOCK_ID};

/// The per-request admission cap (vLLM's
/// `HiSparseResidentSpec.max_admission_blocks_per_request`): the blocks of the tokens in
/// flight, at most the model length; older pages live on the host.
#[inline]
pub(crate) fn max_admission_blocks(
    bs: usize,
    max_in_flight_tokens: usize,
    max_model_len: usize,
) -> usize {
    cdiv(max_in_flight_tokens.min(max_model_len), bs)
}

/// The block page `page` is read from, with the overlay applied; `None` if it is only
/// on the host (vLLM's `get_resident_page`).
pub fn resident_page(rb: &RequestBlocks, page: usize) -> Option<BlockId> {
    let &block = rb.table.get(page)?;
    let block = rb.hisparse.residency.get(&page).copied().unwrap_or(block);
    (block != NULL_BLOCK_ID).then_some(block)
}

/// The row from page `start` on with the overlay applied; host-only pages stay the null
/// block (vLLM's `get_residency_row`).
pub fn residency_row(rb: &RequestBlocks, start: usize) -> Vec<BlockId> {
    let from = start.min(rb.table.len());
    rb.table[from..]
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            let page = from + i;
            rb.hisparse.residency.get(&page).copied().unwrap_or(b)
        })
        .collect()
}

/// Points host-only page `page` at `block`, a pinned GPU copy of its contents; false if
/// the row has no such page or the page is resident already (vLLM's
/// `adopt_resident_page`).
pub fn adopt_page(rb: &mut RequestBlocks, page: usize, block: BlockId) -> bool {
    if page >= rb.table.len() || resident_page(rb, page).is_some() {
        return false;
    }
    rb.hisparse.residency.insert(page, block);
    true
}

/// Stops reading page `page` from the GPU; returns the block it was read from (vLLM's
/// `drop_resident_page`).
pub fn drop_page(rb: &mut RequestBlocks, page: usize) -> Option<BlockId> {
    let block = resident_page(rb, page)?;
    rb.hisparse.residency.insert(page, NULL_BLOCK_ID);
    Some(block)
}

/// Blocks an allocation for `num_tokens` takes (vLLM's
/// `HiSparseResidentManager.get_num_blocks_to_allocate`). An import (`total_computed`
/// past `local_computed`) keeps its last page writable; only its earlier pages stay on
/// the host. Otherwise the host prefix of `local_computed` tokens needs no blocks, and
/// the admission cap bounds the pages.
pub(crate) fn num_blocks_to_allocate(
    rb: &RequestBlocks,
    bs: usize,
    num_tokens: usize,
    total_computed: usize,
    local_computed: usize,
    admission_cap: Option<usize>,
) -> isize {
    let existing = rb.table.len();
    let required = cdiv(num_tokens, bs);
    if total_computed > local_computed {
        let imported = cdiv(total_computed, bs);
        let needs_tail = resident_page(rb, imported - 1).is_none();
        return (usize::from(needs_tail) + required.saturating_sub(imported.max(existing)))
            as isize;
    }
    let required = admission_cap.map_or(required, |cap| required.min(cap));
    required.saturating_sub(existing.max(cdiv(local_computed, bs))) as isize
}

/// A new request's host prefix of `local_computed` tokens: null pages (vLLM's
/// `add_local_computed_blocks`; the group takes no hit blocks).
pub(crate) fn add_host_prefix(rb: &mut RequestBlocks, bs: usize, local_computed: usize) {
    debug_assert!(rb.table.is_empty());
    rb.table
        .extend(std::iter::repeat_n(NULL_BLOCK_ID, cdiv(local_computed, bs)));
    rb.num_cached = Some(0);
}

/// An import of `num_tokens` tokens: the pages up to its last exist (nulls: on the host)
/// and the last one has a GPU block to write (vLLM's
/// `allocate_external_computed_blocks`).
pub(crate) fn reserve_import_tail(
    rb: &mut RequestBlocks,
    bs: usize,
    num_tokens: usize,
    pool: &mut BlockPool,
) -> Result<()> {
    let tail = (num_tokens - 1) / bs;
    if rb.table.len() <= tail {
        rb.table.resize(tail + 1, NULL_BLOCK_ID);
    }
    if resident_page(rb, tail).is_none() {
        let block = pool.get_new_blocks(1)?[0];
        rb.table[tail] = block;
    }
    Ok(())
}

/// Applies the overlay to the table, before the request's blocks are freed (vLLM's
/// `pop_blocks_for_free` returns the residency row).
pub(crate) fn settle(rb: &mut RequestBlocks) {
    for (&page, &block) in &rb.hisparse.residency {
        if let Some(slot) = rb.table.get_mut(page) {
            *slot = block;
        }
    }
    rb.hisparse.residency.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vLLM's `adopt_resident_page`, `drop_resident_page`, `get_resident_page` and
    /// `get_residency_row` on a row with two host pages.
    #[test]
    fn residency_overlay() {
        let mut rb = RequestBlocks {
            table: vec![0, 0, 9, 10],
            ..RequestBlocks::default()
        };
        assert_eq!(resident_page(&rb, 0), None);
        assert_eq!(resident_page(&rb, 2), Some(9));
        assert_eq!(resident_page(&rb, 4), None);
        assert!(adopt_page(&mut rb, 0, 5));
        assert!(!adopt_page(&mut rb, 0, 6), "page 0 is resident now");
        assert!(!adopt_page(&mut rb, 2, 7), "page 2 was resident");
        assert!(!adopt_page(&mut rb, 4, 7), "no page 4");
        assert_eq!(drop_page(&mut rb, 2), Some(9));
        assert_eq!(drop_page(&mut rb, 2), None);
        assert_eq!(drop_page(&mut rb, 1), None);
        assert_eq!(residency_row(&rb, 0), vec![5, 0, 0, 10]);
        assert_eq!(residency_row(&rb, 1), vec![0, 0, 10]);
        assert_eq!(rb.table, vec![0, 0, 9, 10], "the table is append-only");
        settle(&mut rb);
        assert_eq!(rb.table, vec![5, 0, 0, 10]);
        assert!(rb.hisparse.residency.is_empty());
    }
}
