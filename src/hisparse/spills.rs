//! HiSparse's page transfers (vLLM 0.33's `HiSparseCoordinator.pending_spills`,
//! `spills_to_send` and `update_spills`): the ledger of planned copies between a
//! request's resident (GPU) blocks and its host block, and when each one's references
//! may go.
//!
//! A planned transfer holds a reference on its host block and on each resident block
//! (the caller touches them when it plans). Workers report each transfer twice: how many
//! of them enqueued it (the completions to expect) and how many completed it. Once all
//! the expected completions are in, the resident references go first
//! ([`SpillLedger::update`]'s `enqueue_done`), then, in the same call, the host reference
//! and the page's fate ([`Completed`]). The ledger only counts; the caller frees the
//! blocks and updates the request's residency, in the order the ledger reports.

use std::collections::BTreeMap;

use crate::types::BlockId;

/// One page transfer for the worker (vLLM's `SparseKVPageTransfer`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageTransfer {
    /// The transfer's id, unique for the manager's life.
    pub transfer_id: u64,
    /// The host block of the page.
    pub host_block_id: BlockId,
    /// The page's block in each resident group.
    pub resident_block_ids: Vec<BlockId>,
    /// Whether the copy runs after the step's forward pass (a write-back of KV the step
    /// computes) rather than before it.
    pub after_forward: bool,
    /// Whether it copies host to GPU (a restore) rather than GPU to host.
    pub restore: bool,
}

/// A transfer whose completions are all in: its host reference may go, and its page is
/// durable on the host unless it was a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// The transfer's id.
    pub transfer_id: u64,
    /// The request and page it copied.
    pub request_id: String,
    /// The page.
    pub page: usize,
    /// The generation of the request's residency state when it was planned: a request
    /// freed and admitted again under the same id has a new one.
    pub generation: u64,
    /// The host block whose reference goes.
    pub host_block_id: BlockId,
    /// Whether it was a restore.
    pub restore: bool,
}

/// What one [`SpillLedger::update`] lets go, in vLLM's order: first the resident blocks
/// of every transfer whose enqueues are all complete (transfer by transfer, in id
/// order), then the transfers that completed, in id order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpillUpdate {
    /// Per transfer whose completions are all in (first time only): its resident blocks,
    /// to free.
    pub enqueue_done: Vec<Vec<BlockId>>,
    /// The transfers that completed, removed from the ledger.
    pub completed: Vec<Completed>,
}

#[derive(Debug, Clone)]
struct Pending {
    request_id: String,
    page: usize,
    generation: u64,
    host_block_id: BlockId,
    resident_block_ids: Vec<BlockId>,
    restore: bool,
    expected: u64,
    completions: u64,
    enqueue_applied: bool,
}

impl Pending {
    fn all_in(&self) -> bool {
        self.expected > 0 && self.completions >= self.expected
    }
}

/// The planned and in-flight page transfers.
#[derive(Debug, Clone, Default)]
pub struct SpillLedger {
    /// In flight, by id (ids only grow, so this is also vLLM's dict order).
    pending: BTreeMap<u64, Pending>,
    /// Planned since the last [`take_to_send`](Self::take_to_send).
    to_send: Vec<PageTransfer>,
    next_id: u64,
}

impl SpillLedger {
    /// Records a transfer of `request_id`'s page `page` (its residency state of
    /// generation `generation`) and returns its id. The caller holds the references.
    #[allow(clippy::too_many_arguments)]
    pub fn plan(
        &mut self,
        request_id: &str,
        page: usize,
        generation: u64,
        host_block_id: BlockId,
        resident_block_ids: Vec<BlockId>,
        after_forward: bool,
        restore: bool,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.to_send.push(PageTransfer {
            transfer_id: id,
            host_block_id,
            resident_block_ids: resident_block_ids.clone(),
            after_forward,
            restore,
        });
        self.pending.insert(
            id,
            Pending {
                request_id: request_id.to_owned(),
                page,
                generation,
                host_block_id,
                resident_block_ids,
                restore,
                expected: 0,
                completions: 0,
                enqueue_applied: false,
            },
        );
        id
    }

    /// Transfers planned since the last call and not yet handed over (vLLM's
    /// `spills_to_send`, which bounds the next step's planning budget).
    pub fn num_to_send(&self) -> usize {
        self.to_send.len()
    }

    /// The transfers planned and not yet handed over, in plan order.
    pub fn to_send(&self) -> &[PageTransfer] {
        &self.to_send
    }

    /// The ids of the transfers in flight, in id order (vLLM's `pending_spills` keys).
    pub fn pending_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.pending.keys().copied()
    }

    /// Hands the planned transfers over, in plan order (vLLM's `build_offload_command`).
    pub fn take_to_send(&mut self) -> Vec<PageTransfer> {
        std::mem::take(&mut self.to_send)
    }

    /// Transfers in flight.
    pub fn num_pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether transfers are planned or in flight.
    pub fn has_work(&self) -> bool {
        !self.to_send.is_empty() || !self.pending.is_empty()
    }

    /// The host block and request of each transfer in flight, in id order.
    pub fn in_flight(&self) -> impl Iterator<Item = (BlockId, &str)> + '_ {
        self.pending
            .values()
            .map(|p| (p.host_block_id, p.request_id.as_str()))
    }

    /// Applies workers' reports (vLLM's `update_spills`): `enqueued` sets, once, how many
    /// completions a transfer waits for; `completed` adds completions. Unknown ids are
    /// ignored, as vLLM does.
    pub fn update(&mut self, enqueued: &[(u64, u64)], completed: &[(u64, u64)]) -> SpillUpdate {
        for &(id, count) in enqueued {
            if let Some(p) = self.pending.get_mut(&id) {
                if p.expected == 0 {
                    p.expected = count;
                }
            }
        }
        for &(id, count) in completed {
            if let Some(p) = self.pending.get_mut(&id) {
                p.completions += count;
            }
        }
        let mut out = SpillUpdate::default();
        for p in self.pending.values_mut() {
            if !p.enqueue_applied && p.all_in() {
                out.enqueue_done.push(p.resident_block_ids.clone());
                p.enqueue_applied = true;
            }
        }
        let done: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.enqueue_applied && p.all_in())
            .map(|(&id, _)| id)
            .collect();
        for id in done {
            let p = self.pending.remove(&id).expect("listed above");
            out.completed.push(Completed {
                transfer_id: id,
                request_id: p.request_id,
                page: p.page,
                generation: p.generation,
                host_block_id: p.host_block_id,
                restore: p.restore,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger_of_three() -> SpillLedger {
        let mut l = SpillLedger::default();
        assert_eq!(l.plan("a", 0, 1, 10, vec![20], true, false), 0);
        assert_eq!(l.plan("a", 1, 1, 11, vec![21], true, false), 1);
        assert_eq!(l.plan("b", 0, 2, 12, vec![22], false, true), 2);
        l
    }

    #[test]
    fn planned_transfers_are_handed_over_once_in_order() {
        let mut l = ledger_of_three();
        assert_eq!((l.num_to_send(), l.num_pending()), (3, 3));
        let sent = l.take_to_send();
        assert_eq!(
            sent.iter().map(|t| t.transfer_id).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(
            sent[2],
            PageTransfer {
                transfer_id: 2,
                host_block_id: 12,
                resident_block_ids: vec![22],
                after_forward: false,
                restore: true,
            }
        );
        assert!(l.take_to_send().is_empty());
        assert!(l.has_work(), "still in flight");
    }

    /// vLLM's `update_spills`: the expected count is set once, completions add up, and
    /// a transfer completes only once all of them are in; resident blocks go first.
    #[test]
    fn completions_wait_for_every_worker() {
        let mut l = ledger_of_three();
        l.take_to_send();
        // Two workers enqueued transfer 1, one of them completed it; transfer 0 is done.
        let u = l.update(&[(0, 1), (1, 2), (1, 5), (9, 1)], &[(0, 1), (1, 1), (9, 1)]);
        assert_eq!(u.enqueue_done, vec![vec![20]]);
        assert_eq!(
            u.completed
                .iter()
                .map(|c| c.transfer_id)
                .collect::<Vec<_>>(),
            vec![0]
        );
        // Completions without an enqueue report do not complete transfer 2.
        let u = l.update(&[], &[(2, 3), (1, 1)]);
        assert_eq!(u.enqueue_done, vec![vec![21]]);
        assert_eq!(
            u.completed,
            vec![Completed {
                transfer_id: 1,
                request_id: "a".into(),
                page: 1,
                generation: 1,
                host_block_id: 11,
                restore: false,
            }]
        );
        let u = l.update(&[(2, 3)], &[]);
        assert_eq!(u.enqueue_done, vec![vec![22]]);
        assert_eq!(u.completed[0].transfer_id, 2);
        assert!(u.completed[0].restore);
        assert!(!l.has_work());
        assert_eq!(l.update(&[(2, 1)], &[(2, 1)]), SpillUpdate::default());
    }
}
