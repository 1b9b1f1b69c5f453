//! Prefix-cache stats: vLLM 0.33's `PrefixCacheStats` and the manager's recording of
//! them (with `log_stats`).

use super::KvCacheManager;
use crate::attention::RequestView;

/// vLLM 0.33's `PrefixCacheStats` (without the connector's `hits_by_source`). The Python
/// class is a copy made by the binding layer (`src/python/stats.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Whether `reset_prefix_cache` succeeded since the last snapshot.
    pub reset: bool,
    /// Requests recorded (not previously preempted).
    pub requests: u64,
    /// Tokens queried by those requests.
    pub queries: u64,
    /// Tokens hit by those requests.
    pub hits: u64,
    /// Previously preempted requests recorded.
    pub preempted_requests: u64,
    /// Tokens queried by preempted requests.
    pub preempted_queries: u64,
    /// Tokens hit by preempted requests.
    pub preempted_hits: u64,
}

impl PrefixCacheStats {
    /// Adds one request's lookup.
    pub fn record(&mut self, num_tokens: usize, num_hits: usize, preempted: bool) {
        let (t, h) = (num_tokens as u64, num_hits as u64);
        if preempted {
            self.preempted_requests += 1;
            self.preempted_queries += t;
            self.preempted_hits += h;
        } else {
            self.requests += 1;
            self.queries += t;
            self.hits += h;
        }
    }
}

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
