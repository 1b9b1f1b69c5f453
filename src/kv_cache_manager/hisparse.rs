//! HiSparse's coordinator calls on the manager (vLLM 0.33's `HiSparseCoordinator`
//! methods): write-back planning, transfer completions, host publication, residency
//! (pinning, unpinning, losing pages) and the request's release. The state is
//! [`HiSparse`](crate::hisparse::HiSparse); this file lends it the coordinator and the
//! request tables.

use super::slots::RequestSlots;
use super::{AllocateArgs, KvCacheManager};
use crate::attention::hisparse_resident::{adopt_page, drop_page, residency_row, resident_page};
use crate::attention::{RequestBlocks, RequestView};
use crate::coordinator::Coordinator;
use crate::error::{KvError, Result};
use crate::hisparse::publication::{Publication, RequestCopy};
use crate::hisparse::spills::PageTransfer;
use crate::hisparse::state::{pages_to_materialize, RequestResidency};
use crate::hisparse::{HiSparse, ACTIVE_TAIL_PAGES};
use crate::types::{BlockId, NULL_BLOCK_ID};

impl KvCacheManager {
    /// HiSparse's per-step work for the scheduled requests, each with the tokens computed
    /// once the step completes (vLLM's `advance_scheduled`): plan the write-back of
    /// sealed pages (not the last `num_reprefillable_tokens`), then the residency policy.
    /// `Unsupported` without HiSparse groups.
    pub fn hisparse_advance_scheduled(&mut self, requests: &[(&str, usize)]) -> Result<()> {
        let hs = hisparse_of(&mut self.hisparse)?;
        if !hs.has_residency() {
            return Ok(());
        }
        for &(request_id, num_tokens) in requests {
            let computed =
                num_tokens.saturating_sub(hs_ref(&self.hisparse).num_reprefillable_tokens);
            self.hisparse_plan_prefix_materialization(request_id, computed)?;
            self.hisparse_update_residency(request_id)?;
        }
        Ok(())
    }

    /// Plans the write-back of the request's sealed pages within `num_computed_tokens`
    /// and the step's transfer budget (vLLM's `plan_prefix_materialization`).
    pub fn hisparse_plan_prefix_materialization(
        &mut self,
        request_id: &str,
        num_computed_tokens: usize,
    ) -> Result<()> {
        if !hisparse_of(&mut self.hisparse)?.has_residency() {
            return Ok(());
        }
        self.hisparse_drain_reused();
        plan_materialization(
            hisparse_of(&mut self.hisparse)?,
            &mut self.coord,
            &self.slots,
            request_id,
            num_computed_tokens,
        )
    }

    /// The request's residency policy for this step: adopt copies of a host hit, then
    /// unpin clean pages or ask for hot regions (vLLM's `update_residency`).
    pub fn hisparse_update_residency(&mut self, request_id: &str) -> Result<()> {
        if !hisparse_of(&mut self.hisparse)?.has_residency() {
            return Ok(());
        }
        self.hisparse_drain_reused();
        update_residency(
            hisparse_of(&mut self.hisparse)?,
            &mut self.coord,
            &mut self.slots,
            request_id,
        )
    }

    /// HiSparse's groups, settings and state, to read (`None` without HiSparse groups).
    pub fn hisparse(&self) -> Option<&HiSparse> {
        self.hisparse.as_deref()
    }

    /// Sets the transfers one step may plan (vLLM's assignable `max_spill_pages`).
    pub fn hisparse_set_max_spill_pages(&mut self, pages: usize) -> Result<()> {
        hisparse_of(&mut self.hisparse)?.max_spill_pages = pages;
        Ok(())
    }

    /// The transfers planned since the last call, for the worker (vLLM's
    /// `build_offload_command`); `None` without resident groups.
    pub fn hisparse_build_offload_command(&mut self) -> Result<Option<Vec<PageTransfer>>> {
        let hs = hisparse_of(&mut self.hisparse)?;
        Ok(hs.has_residency().then(|| hs.ledger.take_to_send()))
    }

    /// A request's residency state (vLLM's `request_states[request_id]`).
    pub fn hisparse_request_state(&self, request_id: &str) -> Option<&RequestResidency> {
        self.hisparse.as_deref()?.states.get(request_id)
    }

    /// Workers' transfer reports (vLLM's `update_spills`): completed transfers drop their
    /// resident references, then their host reference; their pages become valid and,
    /// once a prefix is valid, it is published in the host pool.
    pub fn hisparse_update_spills(
        &mut self,
        enqueued: &[(u64, u64)],
        completed: &[(u64, u64)],
    ) -> Result<()> {
        let update = hisparse_of(&mut self.hisparse)?
            .ledger
            .update(enqueued, completed);
        // One block at a time, as vLLM frees each resident group's block with its own call
        // (two unhashed blocks freed together keep their order at the queue's head; one
        // by one, the second goes ahead of the first).
        for &block in update.enqueue_done.iter().flatten() {
            self.coord.pool_mut().free_blocks([block])?;
        }
        let mut completed_requests: Vec<String> = Vec::new();
        for done in update.completed {
            let hs = hisparse_of(&mut self.hisparse)?;
            let current = hs
                .states
                .get(&done.request_id)
                .is_some_and(|s| s.generation == done.generation);
            if current {
                let state = hs.states.get_mut(&done.request_id).expect("checked");
                state.pending.remove(&done.page);
                if !done.restore {
                    state.valid.insert(done.page);
                }
                if state.valid.contains(&done.page) {
                    let hs = hisparse_of(&mut self.hisparse)?;
                    page_became_clean(
                        hs,
                        &mut self.coord,
                        &self.slots,
                        &done.request_id,
                        done.page,
                    )?;
                    if done.restore {
                        if let Some(tables) = self.slots.tables_of(&done.request_id) {
                            record_copy(hs, &self.coord, tables, done.page);
                        }
                    }
                }
                if !completed_requests.contains(&done.request_id) {
                    completed_requests.push(done.request_id.clone());
                }
            } else if let Some(state) = hs.detached.get_mut(&done.generation) {
                state.pending.remove(&done.page);
                if !done.restore {
                    state.valid.insert(done.page);
                }
                publish_detached(hs, &mut self.coord, done.generation)?;
            }
            if let Some(host) = self.coord.host_pool_mut() {
                host.free_blocks([done.host_block_id])?;
            }
        }
        for request_id in completed_requests {
            let hs = hisparse_of(&mut self.hisparse)?;
            if let Some(state) = hs.states.get_mut(&request_id) {
                while state.valid.contains(&state.ready_prefix_pages) {
                    state.ready_prefix_pages += 1;
                }
            }
            publish_if_ready(hs, &mut self.coord, &mut self.slots, &request_id)?;
        }
        Ok(())
    }

    /// The host-resident group's `cache_blocks` for `num_computed_tokens` (its share of
    /// them): vLLM's `publish_when_ready`.
    pub(super) fn hisparse_cache_host_blocks<R: RequestView>(
        &mut self,
        request: &R,
        num_computed_tokens: usize,
    ) -> Result<()> {
        let host_group = hs_ref(&self.hisparse).host_group;
        let n = self
            .coord
            .num_cacheable_tokens(num_computed_tokens, host_group);
        self.hisparse_publish_when_ready(request, n)
    }

    /// vLLM's `publish_when_ready`, from the host-resident group's `cache_blocks`: the
    /// request's `num_tokens` cacheable host tokens are to be published, as far as the
    /// host holds them now and the rest as transfers complete.
    pub(super) fn hisparse_publish_when_ready<R: RequestView>(
        &mut self,
        request: &R,
        num_tokens: usize,
    ) -> Result<()> {
        let Some(hs) = self.hisparse.as_deref_mut() else {
            return Ok(());
        };
        let num_pages = num_tokens / hs.page_size;
        let page_size = hs.page_size;
        let state = hs.state_of(request.request_id());
        let mut copy = state
            .publication
            .take()
            .map(|p| p.request)
            .or_else(|| state.spare_copy.take())
            .unwrap_or_else(|| RequestCopy::new(request, page_size));
        copy.extend(request, num_pages);
        state.publication = Some(Publication {
            request: copy,
            num_computed_tokens: num_tokens,
            num_pages,
            detached_blocks: None,
            num_cached_blocks: 0,
        });
        publish_if_ready(hs, &mut self.coord, &mut self.slots, request.request_id())
    }

    /// Applies the device pool's reuse of unpinned blocks (vLLM's `_on_block_reused`
    /// callbacks): each (request, page) still reading a reused block loses the page.
    /// Call it after each call made on the pool directly ([`pool_mut`](Self::pool_mut)).
    pub fn hisparse_drain_reused(&mut self) {
        let Some(hs) = self.hisparse.as_deref_mut() else {
            return;
        };
        for block in self.coord.pool_mut().take_reused_watched() {
            hs.copies.drop_block(block);
            for (request_id, page) in hs.owners.remove(&block).unwrap_or_default() {
                lose_page(hs, &mut self.slots, &request_id, page);
            }
        }
    }
}

fn hisparse_of(hs: &mut Option<Box<HiSparse>>) -> Result<&mut HiSparse> {
    hs.as_deref_mut().ok_or_else(no_hisparse)
}

fn hs_ref(hs: &Option<Box<HiSparse>>) -> &HiSparse {
    hs.as_deref().expect("checked by the caller")
}

/// vLLM's `plan_prefix_materialization`.
fn plan_materialization(
    hs: &mut HiSparse,
    coord: &mut Coordinator,
    slots: &RequestSlots,
    request_id: &str,
    num_computed: usize,
) -> Result<()> {
    let Some(tables) = slots.tables_of(request_id) else {
        hs.state_of(request_id);
        return Ok(());
    };
    let importing = hs.pending_imports.get(request_id).copied().unwrap_or(0);
    let budget = hs.max_spill_pages.saturating_sub(hs.ledger.num_to_send());
    let rows: Vec<_> = hs.resident_groups.iter().map(|&g| &tables[g]).collect();
    let host_table = &tables[hs.host_group].table;
    let page_size = hs.page_size;
    let state = hs.state_of(request_id);
    let pages = pages_to_materialize(
        state,
        num_computed,
        page_size,
        importing,
        budget,
        host_table,
        &rows,
    );
    for page in pages {
        plan_transfer(hs, coord, slots, request_id, page, true, false)?;
    }
    Ok(())
}

/// vLLM's `_plan_page_transfer`: references on the page's host block and resident
/// blocks until the transfer completes. `false` if the page has no host block or is not
/// resident in every group.
fn plan_transfer(
    hs: &mut HiSparse,
    coord: &mut Coordinator,
    slots: &RequestSlots,
    request_id: &str,
    page: usize,
    after_forward: bool,
    restore: bool,
) -> Result<bool> {
    let Some(tables) = slots.tables_of(request_id) else {
        return Ok(false);
    };
    if hs.state_of(request_id).pending.contains_key(&page) {
        return Ok(false);
    }
    let host_block = match tables[hs.host_group].table.get(page) {
        Some(&b) if b != NULL_BLOCK_ID => b,
        _ => return Ok(false),
    };
    let Some(resident) = hs
        .resident_groups
        .iter()
        .map(|&g| resident_page(&tables[g], page))
        .collect::<Option<Vec<BlockId>>>()
    else {
        return Ok(false);
    };
    if let Some(host) = coord.host_pool_mut() {
        host.touch(&[host_block])?;
    }
    coord.pool_mut().touch(&resident)?;
    let generation = hs.state_of(request_id).generation;
    let id = hs.ledger.plan(
        request_id,
        page,
        generation,
        host_block,
        resident,
        after_forward,
        restore,
    );
    hs.state_of(request_id).pending.insert(page, id);
    Ok(true)
}

/// Whether the request reads from the host: it holds every hot region (vLLM's
/// `_can_read_from_host`).
fn can_read_from_host(hs: &HiSparse, slots: &RequestSlots, request_id: &str) -> bool {
    let Some(tables) = slots.tables_of(request_id) else {
        return false;
    };
    !hs.hot_groups.is_empty()
        && hs
            .hot_groups
            .iter()
            .all(|&(g, n)| tables[g].table.len() == n)
}

/// vLLM's `update_residency` (copies are not adopted yet).
fn update_residency(
    hs: &mut HiSparse,
    coord: &mut Coordinator,
    slots: &mut RequestSlots,
    request_id: &str,
) -> Result<()> {
    let to_adopt = std::mem::take(&mut hs.state_of(request_id).pages_to_adopt);
    if to_adopt > 0 {
        adopt_copies(hs, coord, slots, request_id, to_adopt)?;
    }
    if !can_read_from_host(hs, slots, request_id) {
        let fills_window = slots.tables_of(request_id).is_some_and(|tables| {
            hs.resident_groups.iter().any(|&g| {
                coord.managers()[g]
                    .max_admission_blocks()
                    .is_some_and(|cap| tables[g].table.len() >= cap)
            })
        });
        if coord.pool().num_free_blocks() >= hs.transition_watermark && !fills_window {
            return Ok(());
        }
        require_hot(hs, slots, request_id);
        return Ok(());
    }
    let pages: Vec<usize> = hs
        .state_of(request_id)
        .pinned_clean
        .iter()
        .rev()
        .copied()
        .collect();
    for page in pages {
        unpin_page(hs, coord, slots, request_id, page)?;
    }
    Ok(())
}

fn require_hot(hs: &HiSparse, slots: &mut RequestSlots, request_id: &str) {
    if let Some(s) = slots.get(request_id) {
        let tables = slots.tables_mut(s);
        for &(g, _) in &hs.hot_groups {
            tables[g].hisparse.hot_required = true;
        }
    }
}

/// vLLM's `_unpin_page`: a clean page's references go, its blocks stay readable until the
/// pool reuses them.
fn unpin_page(
    hs: &mut HiSparse,
    coord: &mut Coordinator,
    slots: &RequestSlots,
    request_id: &str,
    page: usize,
) -> Result<bool> {
    let state = hs.state_of(request_id);
    if state.pending.contains_key(&page) || !state.valid.contains(&page) {
        return Ok(false);
    }
    let Some(tables) = slots.tables_of(request_id) else {
        return Ok(false);
    };
    let mut blocks = Vec::with_capacity(hs.resident_groups.len());
    for &g in &hs.resident_groups {
        let num_pages = tables[g].table.len();
        match resident_page(&tables[g], page) {
            Some(b) if page + ACTIVE_TAIL_PAGES < num_pages => blocks.push(b),
            _ => return Ok(false),
        }
    }
    for &b in &blocks {
        hs.owners
            .entry(b)
            .or_default()
            .push((request_id.to_owned(), page));
        coord.pool_mut().release_watched(&[b])?;
    }
    let state = hs.state_of(request_id);
    state.pinned_clean.remove(&page);
    state.unpinned.insert(page);
    Ok(true)
}

/// vLLM's `_page_became_clean`.
fn page_became_clean(
    hs: &mut HiSparse,
    coord: &mut Coordinator,
    slots: &RequestSlots,
    request_id: &str,
    page: usize,
) -> Result<()> {
    hs.state_of(request_id).pinned_clean.insert(page);
    if can_read_from_host(hs, slots, request_id) {
        unpin_page(hs, coord, slots, request_id, page)?;
    }
    Ok(())
}

/// vLLM's `_lose_page`: the pool reused the block a page was read from.
fn lose_page(hs: &mut HiSparse, slots: &mut RequestSlots, request_id: &str, page: usize) {
    hs.resident_requests.remove(request_id);
    if !hs.states.contains_key(request_id) {
        return;
    }
    if let Some(s) = slots.get(request_id) {
        let tables = slots.tables_mut(s);
        for &g in &hs.resident_groups {
            if let Some(block) = drop_page(&mut tables[g], page) {
                if let Some(owners) = hs.owners.get_mut(&block) {
                    owners.retain(|(r, p)| !(r == request_id && *p == page));
                }
            }
        }
    }
    let state = hs.states.get_mut(request_id).expect("checked");
    state.unpinned.remove(&page);
    if page < state.synced_pages {
        state.stale.insert(page);
    }
    require_hot(hs, slots, request_id);
}

/// vLLM's `_publish_host_blocks_if_ready`: publishes the valid prefix of the pending
/// publication.
fn publish_if_ready(
    hs: &mut HiSparse,
    coord: &mut Coordinator,
    slots: &mut RequestSlots,
    request_id: &str,
) -> Result<()> {
    let page_size = hs.page_size;
    let Some(state) = hs.states.get_mut(request_id) else {
        return Ok(());
    };
    let Some(publication) = state.publication.as_ref() else {
        return Ok(());
    };
    let num_tokens = publication
        .num_computed_tokens
        .min(state.ready_prefix_pages * page_size);
    if let Some(s) = slots.get(request_id) {
        coord.publish_host_blocks(slots.tables_mut(s), &publication.request, num_tokens)?;
    }
    if state.ready_prefix_pages >= publication.num_pages {
        state.spare_copy = state.publication.take().map(|p| p.request);
    }
    record_copies(hs, coord, slots, request_id, num_tokens);
    Ok(())
}

/// vLLM's `_record_copies`: indexes the resident blocks of the request's just-published
/// host pages (up to `num_tokens`), past those indexed before, skipping pages in
/// transfer.
fn record_copies(
    hs: &mut HiSparse,
    coord: &Coordinator,
    slots: &RequestSlots,
    request_id: &str,
    num_tokens: usize,
) {
    if !hs.has_residency() {
        return;
    }
    let Some(tables) = slots.tables_of(request_id) else {
        return;
    };
    let host_len = tables[hs.host_group].table.len();
    if host_len == 0 {
        return;
    }
    let num_host = (num_tokens / hs.page_size).min(host_len);
    let state = hs.state_of(request_id);
    let from = state.copies_recorded_blocks;
    let pending: Vec<usize> = state.pending.keys().copied().collect();
    for page in from..num_host {
        if !pending.contains(&page) {
            record_copy(hs, coord, tables, page);
        }
    }
    let state = hs.state_of(request_id);
    state.copies_recorded_blocks = state.copies_recorded_blocks.max(num_host);
}

/// vLLM's `_record_copy`: the page's resident blocks become the copies of its host block,
/// if that block is cached and the page is resident in every group.
fn record_copy(hs: &mut HiSparse, coord: &Coordinator, tables: &[RequestBlocks], page: usize) {
    let Some(&host_block) = tables[hs.host_group].table.get(page) else {
        return;
    };
    if host_block == NULL_BLOCK_ID {
        return;
    }
    let Some(Ok(Some(hash))) = coord.host_pool().map(|p| p.block_hash(host_block)) else {
        return;
    };
    let Some(blocks) = hs
        .resident_groups
        .iter()
        .map(|&g| resident_page(&tables[g], page))
        .collect::<Option<Vec<BlockId>>>()
    else {
        return;
    };
    hs.copies.record(hash, blocks);
}

/// vLLM's `_adopt_copies`: the request's host-only prefix pages point at readable GPU
/// copies of their contents, which it now holds.
fn adopt_copies(
    hs: &mut HiSparse,
    coord: &mut Coordinator,
    slots: &mut RequestSlots,
    request_id: &str,
    num_pages: usize,
) -> Result<()> {
    if hs.copies.is_empty() {
        return Ok(());
    }
    let Some(s) = slots.get(request_id) else {
        return Ok(());
    };
    let host: Vec<BlockId> = slots.tables(s)[hs.host_group]
        .table
        .iter()
        .take(num_pages)
        .copied()
        .collect();
    for (page, host_block) in host.into_iter().enumerate() {
        if host_block == NULL_BLOCK_ID {
            continue;
        }
        let Some(Ok(Some(hash))) = coord.host_pool().map(|p| p.block_hash(host_block)) else {
            continue;
        };
        let Some(copies) = hs.copies.get(&hash).map(<[BlockId]>::to_vec) else {
            continue;
        };
        let groups = hs.resident_groups.clone();
        for (g, block) in groups.into_iter().zip(copies) {
            if adopt_page(&mut slots.tables_mut(s)[g], page, block) {
                coord.pool_mut().touch(&[block])?;
                let state = hs.state_of(request_id);
                state.pinned_clean.insert(page);
                if page < state.synced_pages {
                    state.stale.insert(page);
                }
            }
        }
    }
    Ok(())
}

/// vLLM's `_publish_detached_blocks`: a freed request's publication, once no transfer of
/// it is in flight.
fn publish_detached(hs: &mut HiSparse, coord: &mut Coordinator, generation: u64) -> Result<()> {
    let page_size = hs.page_size;
    let host_group = hs.host_group;
    let Some(state) = hs.detached.get_mut(&generation) else {
        return Ok(());
    };
    if !state.pending.is_empty() {
        return Ok(());
    }
    let Some(publication) = state.publication.take() else {
        hs.detached.remove(&generation);
        return Ok(());
    };
    let Some(blocks) = publication.detached_blocks.clone() else {
        return Ok(());
    };
    while state.valid.contains(&state.ready_prefix_pages) {
        state.ready_prefix_pages += 1;
    }
    let num_full = state.ready_prefix_pages.min(publication.num_pages);
    coord.publish_detached_host_blocks(
        &publication.request,
        &blocks,
        publication.num_cached_blocks,
        num_full,
        page_size,
        host_group,
    )?;
    if let Some(host) = coord.host_pool_mut() {
        host.free_blocks(blocks.iter().rev().copied())?;
    }
    hs.detached.remove(&generation);
    Ok(())
}

impl KvCacheManager {
    /// HiSparse's part of an allocation (`args`) of the request in slot `s`, after the
    /// groups allocated (vLLM runs these inside the groups' calls; none of them
    /// allocates): an adopted host prefix of `local_computed` tokens commits its pages,
    /// an import records the prefix it fills in, and the device pool's reuse of unpinned
    /// blocks is applied. Then, unless caching is delayed, every group caches up to
    /// `total_computed` tokens and the new ones, with HiSparse's publication in its
    /// group's place.
    #[inline(never)]
    pub(super) fn hisparse_after_allocation<R: RequestView>(
        &mut self,
        s: usize,
        request: &R,
        args: &AllocateArgs<'_>,
        took_hit: bool,
        local_computed: usize,
        total_computed: usize,
    ) -> Result<()> {
        let external_computed = args.num_external_computed_tokens;
        let adopted = took_hit || external_computed > 0;
        if let Some(hs) = self.hisparse.as_deref_mut() {
            let request_id = request.request_id();
            if adopted && hs.has_residency() {
                hs.resident_requests.remove(request_id);
                commit_computed_blocks(hs, &self.slots, request_id, local_computed);
            }
            if external_computed > 0 {
                hs.resident_requests.remove(request_id);
                hs.pending_imports
                    .insert(request_id.to_owned(), local_computed + external_computed);
            }
        }
        self.hisparse_drain_reused();
        if args.delay_cache_blocks {
            return Ok(());
        }
        let n = (total_computed + args.num_new_tokens).min(request.num_tokens());
        self.cache_blocks_with_publication(s, request, n)
    }

    /// Every group's `cache_blocks` of the request in slot `s` for `num_computed_tokens`,
    /// in group order, as vLLM's coordinator calls them: the host-resident group's is
    /// HiSparse's publication (`publish_when_ready`), which runs only with caching on.
    /// Events of the groups before the host group come before the host pool's.
    pub(super) fn cache_blocks_with_publication<R: RequestView>(
        &mut self,
        s: usize,
        request: &R,
        num_computed_tokens: usize,
    ) -> Result<()> {
        let host_group = match self.hisparse.as_deref() {
            Some(hs) if self.enable_caching => hs.host_group,
            _ => {
                let rbs = self.slots.tables_mut(s);
                return self.coord.cache_blocks(rbs, request, num_computed_tokens);
            }
        };
        let before = &mut self.slots.tables_mut(s)[..host_group];
        self.coord
            .cache_blocks_from(0, before, request, num_computed_tokens)?;
        self.hisparse_cache_host_blocks(request, num_computed_tokens)?;
        let rest = &mut self.slots.tables_mut(s)[host_group..];
        self.coord
            .cache_blocks_from(host_group, rest, request, num_computed_tokens)
    }

    /// The part of freeing a request up to HiSparse's hook: the groups before
    /// HiSparse's first group free their blocks, then HiSparse's free runs (vLLM reaches
    /// `HiSparseCoordinator.free` from that group's `pop_blocks_for_free`). Returns that
    /// group; the caller frees the groups from it on.
    pub(super) fn hisparse_free_through_hook(
        &mut self,
        request_id: &str,
        finished: bool,
    ) -> Result<usize> {
        let first = hs_ref(&self.hisparse).first_group();
        if let Some(s) = self.slots.get(request_id).filter(|_| first > 0) {
            self.set_free_tag_of_slot(s);
            self.coord
                .free_from(0, &mut self.slots.tables_mut(s)[..first])?;
        }
        self.hisparse_free(request_id, finished)?;
        Ok(first)
    }

    /// vLLM's `HiSparseCoordinator.free`, before the request's blocks go: a finished
    /// request with transfers in flight keeps its host blocks for the publication; each
    /// resident page with a durable host copy is unpinned (the others are freed with the
    /// table), tail first.
    #[inline(never)]
    pub(super) fn hisparse_free(&mut self, request_id: &str, finished: bool) -> Result<()> {
        let Some(hs) = self.hisparse.as_deref_mut() else {
            return Ok(());
        };
        hs.resident_requests.remove(request_id);
        hs.pending_imports.remove(request_id);
        let Some(mut state) = hs.states.remove(request_id) else {
            return Ok(());
        };
        let Some(s) = self.slots.get(request_id) else {
            return Ok(());
        };
        let detach = finished && state.publication.is_some() && !state.pending.is_empty();
        if detach {
            let host = &self.slots.tables(s)[hs.host_group];
            let publication = state.publication.as_mut().expect("checked");
            let blocks: Vec<BlockId> = host
                .table
                .iter()
                .take(publication.num_pages)
                .copied()
                .collect();
            publication.num_cached_blocks = host.num_cached.unwrap_or(0);
            if let Some(pool) = self.coord.host_pool_mut() {
                pool.touch(&blocks)?;
            }
            publication.detached_blocks = Some(blocks);
        } else {
            state.publication = None;
        }
        let tables = self.slots.tables_mut(s);
        for &g in &hs.resident_groups {
            let row = &mut tables[g];
            for page in (0..row.table.len()).rev() {
                let Some(block) = resident_page(row, page) else {
                    continue;
                };
                if state.unpinned.contains(&page) {
                    if let Some(owners) = hs.owners.get_mut(&block) {
                        owners.retain(|(r, p)| !(r == request_id && *p == page));
                    }
                } else if state.valid.contains(&page) && !state.pending.contains_key(&page) {
                    self.coord.pool_mut().release_watched(&[block])?;
                } else {
                    continue;
                }
                drop_page(row, page);
            }
        }
        if detach {
            hs.detached.insert(state.generation, state);
        }
        Ok(())
    }
}

/// vLLM's `commit_computed_blocks`: a prefix hit on host pages the request now holds.
fn commit_computed_blocks(
    hs: &mut HiSparse,
    slots: &RequestSlots,
    request_id: &str,
    local_computed: usize,
) {
    let host_pages = slots
        .tables_of(request_id)
        .map_or(0, |t| t[hs.host_group].table.len());
    let num = local_computed.div_ceil(hs.page_size).min(host_pages);
    if num == 0 {
        return;
    }
    let state = hs.state_of(request_id);
    state.valid.extend(0..num);
    state.ready_prefix_pages = state.ready_prefix_pages.max(num);
    state.pages_to_adopt = state.pages_to_adopt.max(num);
    state.copies_recorded_blocks = state.copies_recorded_blocks.max(num);
}

/// One request's resident pages the worker lacks (vLLM's `SparseKVResidencyUpdate`):
/// the pages, and per resident group the block each is read from (the null block: from
/// the host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResidencyUpdate {
    /// The request.
    pub request_id: String,
    /// Its pages: the stale ones, sorted, then those appended since the last update.
    pub pages: Vec<usize>,
    /// Per resident group, one block per page.
    pub block_ids: Vec<Vec<BlockId>>,
}

/// One contiguous span of a resident row mirrored into the host cache (vLLM's
/// `SparseKVRowMirror`), in rows (tokens) of the caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMirror {
    /// Where the span starts in each resident group's cache.
    pub source_starts: Vec<usize>,
    /// Where it goes in the host cache.
    pub destination_start: usize,
    /// Its length.
    pub num_rows: usize,
}

impl KvCacheManager {
    /// The resident pages the worker lacks for the scheduled `request_ids`: stale pages
    /// and pages appended since the last update (vLLM's `take_residency_updates`).
    /// Requests with nothing new are left out; a request not scheduled keeps its changes.
    pub fn hisparse_take_residency_updates(
        &mut self,
        request_ids: &[&str],
    ) -> Result<Vec<ResidencyUpdate>> {
        let hs = hisparse_of(&mut self.hisparse)?;
        let mut out = Vec::new();
        if !hs.has_residency() {
            return Ok(out);
        }
        for &request_id in request_ids {
            let tables = self.slots.tables_of(request_id);
            let first = hs.resident_groups[0];
            let num_pages = tables.map_or(0, |t| t[first].table.len());
            let state = hs.state_of(request_id);
            let start = state.synced_pages;
            if state.stale.is_empty() && start >= num_pages {
                continue;
            }
            let stale: Vec<usize> = state.stale.iter().copied().collect();
            let block_ids = hs
                .resident_groups
                .iter()
                .map(|&g| {
                    let row = tables.map(|t| &t[g]);
                    let mut ids: Vec<BlockId> = stale
                        .iter()
                        .map(|&p| {
                            row.and_then(|r| resident_page(r, p))
                                .unwrap_or(NULL_BLOCK_ID)
                        })
                        .collect();
                    if let Some(r) = row {
                        ids.extend(residency_row(r, start));
                    }
                    ids
                })
                .collect();
            let state = hs.state_of(request_id);
            state.stale.clear();
            state.synced_pages = num_pages;
            out.push(ResidencyUpdate {
                request_id: request_id.to_owned(),
                pages: stale.into_iter().chain(start..num_pages).collect(),
                block_ids,
            });
        }
        Ok(out)
    }

    /// The spans of the scheduled rows, `(request, computed, scheduled)`, to mirror from
    /// the resident groups into the host cache (vLLM's `build_row_mirrors`). A page
    /// without a GPU copy or a host block is skipped alone.
    pub fn hisparse_build_row_mirrors(
        &self,
        requests: &[(&str, usize, usize)],
    ) -> Result<Vec<RowMirror>> {
        let hs = self.hisparse.as_deref().ok_or_else(no_hisparse)?;
        let mut out = Vec::new();
        if !hs.has_residency() {
            return Ok(out);
        }
        let bs = hs.page_size;
        for &(request_id, computed, scheduled) in requests {
            let Some(tables) = self.slots.tables_of(request_id) else {
                continue;
            };
            let host = &tables[hs.host_group];
            let (mut pos, end) = (computed, computed + scheduled);
            while pos < end {
                let (page, offset) = (pos / bs, pos % bs);
                let num_rows = (bs - offset).min(end - pos);
                let sources: Option<Vec<usize>> = hs
                    .resident_groups
                    .iter()
                    .map(|&g| resident_page(&tables[g], page).map(|b| b as usize * bs + offset))
                    .collect();
                let host_block = host
                    .table
                    .get(page)
                    .copied()
                    .filter(|&b| b != NULL_BLOCK_ID);
                if let (Some(source_starts), Some(h)) = (sources, host_block) {
                    out.push(RowMirror {
                        source_starts,
                        destination_start: h as usize * bs + offset,
                        num_rows,
                    });
                }
                pos += num_rows;
            }
        }
        Ok(out)
    }

    /// Whether every scheduled request, `(request, computed, scheduled)`, reads only
    /// resident KV (vLLM's `all_context_pages_resident`); `false` without resident groups.
    pub fn hisparse_all_context_pages_resident(
        &mut self,
        requests: &[(&str, usize, usize)],
    ) -> Result<bool> {
        let hs = hisparse_of(&mut self.hisparse)?;
        if !hs.has_residency() {
            return Ok(false);
        }
        let first = hs.resident_groups[0];
        for &(request_id, computed, scheduled) in requests {
            let tables = self.slots.tables_of(request_id);
            let num_pages = (computed + scheduled).div_ceil(hs.page_size);
            if tables.map_or(0, |t| t[first].table.len()) < num_pages {
                return Ok(false);
            }
            if hs.resident_requests.contains(request_id) {
                continue;
            }
            let all = tables.is_some_and(|t| {
                hs.resident_groups
                    .iter()
                    .all(|&g| residency_row(&t[g], 0).iter().all(|&b| b != NULL_BLOCK_ID))
            });
            if !all {
                return Ok(false);
            }
            hs.resident_requests.insert(request_id.to_owned());
        }
        Ok(true)
    }

    /// Whether a transfer in flight will free device or host blocks when it completes
    /// (vLLM's `has_pending_reclamation`).
    pub fn hisparse_has_pending_reclamation(&self) -> bool {
        let Some(hs) = self.hisparse.as_deref() else {
            return false;
        };
        let host = self.coord.host_pool();
        hs.ledger.in_flight().any(|(host_block, request_id)| {
            host.is_some_and(|p| p.ref_cnt(host_block).is_ok_and(|r| r == 1))
                || (hs.states.contains_key(request_id)
                    && can_read_from_host(hs, &self.slots, request_id))
        })
    }

    /// Whether transfers are planned or in flight (vLLM's `has_pending_work`).
    pub fn hisparse_has_pending_work(&self) -> bool {
        self.hisparse
            .as_deref()
            .is_some_and(|hs| hs.ledger.has_work() || !hs.retained_copies.is_empty())
    }

    /// The host copy-on-write work of partial host hits since the last call, `(source,
    /// destination)` host blocks; both keep their reference until
    /// [`hisparse_release_completed_host_copies`](Self::hisparse_release_completed_host_copies)
    /// (vLLM's `take_host_block_copies`).
    pub fn hisparse_take_host_block_copies(&mut self) -> Result<Vec<(BlockId, BlockId)>> {
        hisparse_of(&mut self.hisparse)?;
        let pairs = self.coord.take_host_block_copies();
        let hs = hisparse_of(&mut self.hisparse)?;
        for &(src, dst) in &pairs {
            // A destination handed over again keeps its place (a Python dict's update).
            match hs.retained_copies.iter_mut().find(|(d, _)| *d == dst) {
                Some(entry) => entry.1 = src,
                None => hs.retained_copies.push((dst, src)),
            }
        }
        Ok(pairs)
    }

    /// Drops the references of the host copies the worker ran, by destination; unknown
    /// ids are skipped (vLLM's `release_completed_host_copies`).
    pub fn hisparse_release_completed_host_copies(
        &mut self,
        dst_block_ids: &[BlockId],
    ) -> Result<()> {
        let hs = hisparse_of(&mut self.hisparse)?;
        let mut taken: Vec<usize> = Vec::new();
        let mut blocks = Vec::new();
        for dst in dst_block_ids {
            if taken.iter().any(|&i| hs.retained_copies[i].0 == *dst) {
                continue;
            }
            if let Some(i) = hs.retained_copies.iter().position(|(d, _)| d == dst) {
                taken.push(i);
                blocks.extend([hs.retained_copies[i].1, *dst]);
            }
        }
        if blocks.is_empty() {
            return Ok(());
        }
        blocks.reverse();
        let pool = self
            .coord
            .host_pool_mut()
            .expect("HiSparse has a host pool");
        pool.free_blocks(blocks.iter().copied())?;
        self.coord.forward_host_events();
        let hs = hisparse_of(&mut self.hisparse)?;
        taken.sort_unstable();
        for i in taken.into_iter().rev() {
            hs.retained_copies.remove(i);
        }
        Ok(())
    }

    /// An external load into the request's host pages finished (vLLM's
    /// `finish_host_import`): if it did not fail, its pages are published and its last
    /// page restored to the GPU.
    pub fn hisparse_finish_host_import(&mut self, request_id: &str, failed: bool) -> Result<()> {
        let hs = hisparse_of(&mut self.hisparse)?;
        match hs.pending_imports.remove(request_id) {
            Some(n) if !failed => self.hisparse_complete_host_import(request_id, n),
            _ => Ok(()),
        }
    }

    /// Host pages filled by a connector, up to `num_computed` tokens (vLLM's
    /// `complete_host_import`): they are valid, the page holding the last token is
    /// restored to its GPU block, and the prefix is published. More tokens than the
    /// model's length are refused (`InvalidArgument`).
    pub fn hisparse_complete_host_import(
        &mut self,
        request_id: &str,
        num_computed: usize,
    ) -> Result<()> {
        if num_computed > self.max_model_len {
            return Err(KvError::InvalidArgument(format!(
                "num_computed_tokens {num_computed} exceeds max_model_len {}",
                self.max_model_len
            )));
        }
        let hs = hisparse_of(&mut self.hisparse)?;
        if !hs.has_residency() {
            return Ok(());
        }
        let num_pages = num_computed / hs.page_size;
        let page_size = hs.page_size;
        let state = hs.state_of(request_id);
        state.valid = (0..num_pages).collect();
        state.ready_prefix_pages = num_pages;
        if num_computed > 0 {
            plan_transfer(
                hs,
                &mut self.coord,
                &self.slots,
                request_id,
                (num_computed - 1) / page_size,
                false,
                true,
            )?;
        }
        publish_if_ready(hs, &mut self.coord, &mut self.slots, request_id)
    }

    /// Whether the request holds the whole region of every hot group (vLLM's `has_hot`
    /// of each), and whether it needs them (`hot_required`).
    pub fn hisparse_hot(&self, request_id: &str) -> (bool, bool) {
        let Some(hs) = self.hisparse.as_deref() else {
            return (false, false);
        };
        let Some(tables) = self.slots.tables_of(request_id) else {
            return (false, false);
        };
        let has = hs
            .hot_groups
            .iter()
            .all(|&(g, n)| tables[g].table.len() == n);
        let required = hs
            .hot_groups
            .iter()
            .any(|&(g, _)| tables[g].hisparse.hot_required);
        (has && !hs.hot_groups.is_empty(), required)
    }

    /// The GPU copies of published host pages: `(host hash, its group, one resident block
    /// per resident group)` each, in no particular order (vLLM's `copies`).
    pub fn hisparse_copies(&self) -> Vec<(crate::pool::HashKey, Vec<BlockId>)> {
        self.hisparse.as_deref().map_or_else(Vec::new, |hs| {
            hs.copies.iter().map(|(k, b)| (*k, b.to_vec())).collect()
        })
    }

    /// The request's row of resident group `group` from page `start` on, with adopted
    /// and dropped pages applied; host-only pages are the null block; empty for a request
    /// without blocks (vLLM's `get_residency_row`).
    pub fn hisparse_residency_row(
        &self,
        request_id: &str,
        group: usize,
        start: usize,
    ) -> Result<Vec<BlockId>> {
        let hs = self.hisparse.as_deref().ok_or_else(no_hisparse)?;
        if !hs.resident_groups.contains(&group) {
            return Err(KvError::InvalidArgument(format!(
                "group {group} is not a HiSparse resident group"
            )));
        }
        Ok(self
            .slots
            .tables_of(request_id)
            .map_or_else(Vec::new, |t| residency_row(&t[group], start)))
    }

    /// Fills the request's region in hot group `group` if it needs one, returning the new
    /// blocks (vLLM's `HiSparseHotManager.allocate_new_blocks`, called on the group
    /// directly).
    pub fn hisparse_allocate_hot(
        &mut self,
        request_id: &str,
        group: usize,
    ) -> Result<Vec<BlockId>> {
        let hs = hisparse_of(&mut self.hisparse)?;
        let Some(&(_, blocks_per_request)) = hs.hot_groups.iter().find(|&&(g, _)| g == group)
        else {
            return Err(KvError::InvalidArgument(format!(
                "group {group} is not a HiSparse hot group"
            )));
        };
        let Some(s) = self.slots.get(request_id) else {
            return Err(KvError::UnknownRequest(request_id.to_owned()));
        };
        let rb = &mut self.slots.tables_mut(s)[group];
        let start = rb.table.len();
        crate::attention::hisparse_hot::allocate(rb, blocks_per_request, self.coord.pool_mut())?;
        let new = rb.table[start..].to_vec();
        self.hisparse_drain_reused();
        Ok(new)
    }

    /// Marks the request as needing its hot regions (vLLM's `require_hot` on every hot
    /// group).
    pub fn hisparse_require_hot(&mut self, request_id: &str) -> Result<()> {
        let hs = hisparse_of(&mut self.hisparse)?;
        require_hot(hs, &mut self.slots, request_id);
        Ok(())
    }
}

fn no_hisparse() -> KvError {
    KvError::Unsupported("no HiSparse groups: the config has no hisparse_source group".into())
}
