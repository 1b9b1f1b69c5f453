//! vLLM 0.33's record of newly allocated blocks for worker-side zeroing
//! (`KVCacheConfig.needs_kv_cache_zeroing`: Mamba layers and mixed-precision caches read
//! a block before it is fully written). Attention groups record every block they take
//! from the pool for new tokens or KV-connector tokens; Mamba groups record none. The
//! scheduler drains the record once per step, group after group.

use crate::types::BlockId;

/// Per group, the blocks allocated since the last drain (`None`: the group does not
/// record).
#[derive(Debug, Clone, Default)]
pub struct ZeroingLog {
    groups: Vec<Option<Vec<BlockId>>>,
}

impl ZeroingLog {
    /// A log in which the groups flagged `true` record.
    pub fn new(recording: impl IntoIterator<Item = bool>) -> Self {
        Self {
            groups: recording.into_iter().map(|r| r.then(Vec::new)).collect(),
        }
    }

    /// Whether `group` records its new blocks.
    pub fn records(&self, group: usize) -> bool {
        matches!(self.groups.get(group), Some(Some(_)))
    }

    /// Records blocks of `group` (a no-op for a group that does not record).
    pub fn record(&mut self, group: usize, ids: &[BlockId]) {
        if let Some(Some(g)) = self.groups.get_mut(group) {
            g.extend_from_slice(ids);
        }
    }

    /// Everything recorded since the last call, group after group, and clears it.
    pub fn take(&mut self) -> Vec<BlockId> {
        let mut out = Vec::new();
        for g in self.groups.iter_mut().flatten() {
            out.append(g);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_group_after_group_and_skips_silent_groups() {
        let mut log = ZeroingLog::new([true, false, true]);
        log.record(2, &[7, 8]);
        log.record(1, &[5]);
        log.record(0, &[3]);
        assert!(log.records(0) && !log.records(1));
        assert_eq!(log.take(), vec![3, 7, 8]);
        assert!(log.take().is_empty());
    }
}
