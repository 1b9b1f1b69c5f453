//! The manager's recording of prefix-cache stats (with `log_stats`); the stats type and
//! its field list are `src/stats.rs`.

use super::KvCacheManager;
use crate::attention::RequestView;
use crate::stats::PrefixCacheStats;

impl KvCacheManager {
    /// Records a lookup in the prefix-cache stats (if `log_stats` and the request did
    /// look the cache up).
    pub fn record_prefix_cache_stats<R: RequestView>(&mut self, request: &R, num_hits: usize) {
        if !self.log_stats || !self.lookup_enabled(request) {
            return;
        }
        self.stats.record(
            request.num_tokens(),
            num_hits,
            request.num_preemptions() > 0,
        );
    }

    /// Returns the stats since the last call and starts new ones (`None` without
    /// `log_stats`).
    pub fn make_prefix_cache_stats(&mut self) -> Option<PrefixCacheStats> {
        self.log_stats.then(|| std::mem::take(&mut self.stats))
    }

    /// The stats recorded since the last `make_prefix_cache_stats` (`None` without
    /// `log_stats`).
    pub fn prefix_cache_stats(&self) -> Option<PrefixCacheStats> {
        self.log_stats.then_some(self.stats)
    }
}
