//! vLLM 0.33's `PrefixCacheStats`: what the manager counts of its prefix-cache lookups.
//!
//! The fields are listed once, in `with_prefix_cache_stats_fields!`: the struct here, its
//! [`fields`](PrefixCacheStats::fields) and the Python class (`src/python/stats.rs`) are
//! all made from that list, so a field added there reaches every one of them.

/// Calls `$then!` with the fields of [`PrefixCacheStats`] (`docs name: type`, in vLLM's
/// order): the one list of them.
macro_rules! with_prefix_cache_stats_fields {
    ($then:ident) => {
        $then! {
            /// Whether `reset_prefix_cache` succeeded since the last snapshot.
            reset: bool,
            /// Requests recorded (not previously preempted).
            requests: u64,
            /// Tokens queried by those requests.
            queries: u64,
            /// Tokens hit by those requests.
            hits: u64,
            /// Previously preempted requests recorded.
            preempted_requests: u64,
            /// Tokens queried by preempted requests.
            preempted_queries: u64,
            /// Tokens hit by preempted requests.
            preempted_hits: u64,
        }
    };
}
#[cfg(feature = "python")]
pub(crate) use with_prefix_cache_stats_fields;

/// The value of one stats field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatValue {
    /// A flag (`reset`).
    Flag(bool),
    /// A count.
    Count(u64),
}

impl From<bool> for StatValue {
    fn from(v: bool) -> Self {
        Self::Flag(v)
    }
}

impl From<u64> for StatValue {
    fn from(v: u64) -> Self {
        Self::Count(v)
    }
}

macro_rules! prefix_cache_stats_struct {
    ($($(#[doc = $doc:literal])* $field:ident: $ty:ty),* $(,)?) => {
        /// vLLM 0.33's `PrefixCacheStats` (without the connector's `hits_by_source`).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct PrefixCacheStats {
            $($(#[doc = $doc])* pub $field: $ty,)*
        }

        impl PrefixCacheStats {
            /// Every field's name and value, in declaration order.
            pub fn fields(&self) -> impl Iterator<Item = (&'static str, StatValue)> {
                [$((stringify!($field), StatValue::from(self.$field))),*].into_iter()
            }
        }
    };
}
with_prefix_cache_stats_fields!(prefix_cache_stats_struct);

impl PrefixCacheStats {
    /// Adds one request's lookup (previously preempted requests count apart).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_follow_the_declaration() {
        let mut s = PrefixCacheStats::default();
        s.record(10, 4, false);
        s.record(8, 8, true);
        let fields: Vec<_> = s.fields().collect();
        assert_eq!(
            fields,
            [
                ("reset", StatValue::Flag(false)),
                ("requests", StatValue::Count(1)),
                ("queries", StatValue::Count(10)),
                ("hits", StatValue::Count(4)),
                ("preempted_requests", StatValue::Count(1)),
                ("preempted_queries", StatValue::Count(8)),
                ("preempted_hits", StatValue::Count(8)),
            ]
        );
    }
}
