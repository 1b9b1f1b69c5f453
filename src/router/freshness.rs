//! Whether an engine's index state is exact: the order of its event batches, by the
//! sequence number its publisher puts on each (ZMQ's second frame), and what a gap, a
//! duplicate or a restart does.
//!
//! An engine is `exact` only while the index has applied every batch from the start of
//! its stream, in order, or every batch since an `AllBlocksCleared` that followed a loss.
//! A registered engine starts `catching_up`, expecting batch 0 (`exact` if it is
//! registered before it starts: [`Stream::new`]):
//!
//! - the expected batch is applied, then any held batches that now follow in order;
//! - a later batch (a gap) is held, and the engine is `catching_up` until the missing
//!   ones arrive (a replay); more than [`MAX_HELD`] held batches give up on the gap;
//! - an earlier batch is a duplicate (a replay overlapping live batches) and is dropped,
//!   unless it is batch 0 or more than [`RESTART_WINDOW`] behind: then the publisher has
//!   restarted (a restarted vLLM engine starts empty and counts from 0), so the engine's
//!   residency is cleared and the stream starts again at 0;
//! - giving up on a gap ([`Stream::skip_gap`]) applies the held batches and marks the
//!   engine `stale`; an `AllBlocksCleared` applied after that (a snapshot starts with one)
//!   makes it `exact` again;
//! - a hash mismatch marks it `mismatched` until it is reset or registered again.
//!
//! A batch offered without a sequence number is taken as the next one (in-process
//! feeds, which cannot lose or reorder batches).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use super::residency::BlockOp;

/// Held batches beyond which a gap is given up (vLLM's replay buffer is 10,000 steps).
pub const MAX_HELD: usize = 10_000;
/// A batch this far behind the expected one is a restarted publisher, not a duplicate.
pub const RESTART_WINDOW: u64 = 100_000;

/// How far the index's view of an engine can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Freshness {
    /// Every batch applied, in order: hits are the engine's.
    Exact = 0,
    /// A gap is open (or batch 0 not seen yet): hits may be wrong until a replay fills it.
    CatchingUp = 1,
    /// Batches were lost for good: hits may be wrong until the next `AllBlocksCleared`.
    Stale = 2,
    /// The engine's hashes do not match its registration: hits are meaningless.
    Mismatched = 3,
}

impl Freshness {
    /// Its name: `"exact"`, `"catching_up"`, `"stale"` or `"mismatched"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::CatchingUp => "catching_up",
            Self::Stale => "stale",
            Self::Mismatched => "mismatched",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Exact,
            1 => Self::CatchingUp,
            2 => Self::Stale,
            _ => Self::Mismatched,
        }
    }
}

/// One decoded batch, ready to apply.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Its block changes.
    pub ops: Arc<[BlockOp]>,
    /// Whether it holds an `AllBlocksCleared`.
    pub clears: bool,
    /// Its number of events.
    pub events: usize,
}

/// What the writer does with an offered batch, in order.
#[derive(Debug, Clone)]
pub enum Action {
    /// Empty every table of the engine (a restart).
    ClearAll,
    /// Apply a batch.
    Apply(Batch),
}

/// The engine's counters, readable without the writer (atomics; a reader may see one
/// counter of a batch updated before another).
#[derive(Debug)]
pub struct StatusCell {
    state: AtomicU8,
    /// Last applied sequence number + 1 (0: none).
    next_seq: AtomicU64,
    /// Batches applied.
    pub batches: AtomicU64,
    /// Events applied.
    pub events: AtomicU64,
    /// Batches dropped as duplicates.
    pub duplicates: AtomicU64,
    /// Gaps seen.
    pub gaps: AtomicU64,
    /// Publisher restarts seen (and explicit resets).
    pub resets: AtomicU64,
    /// Batches held behind a gap.
    pub held: AtomicU64,
    /// `BlockStored` events whose hashes were recomputed and checked.
    pub hash_checks: AtomicU64,
    /// Checks that failed.
    pub hash_mismatches: AtomicU64,
}

impl Default for StatusCell {
    fn default() -> Self {
        Self {
            state: AtomicU8::new(Freshness::CatchingUp as u8),
            next_seq: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            events: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            gaps: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            held: AtomicU64::new(0),
            hash_checks: AtomicU64::new(0),
            hash_mismatches: AtomicU64::new(0),
        }
    }
}

impl StatusCell {
    /// The engine's freshness.
    #[inline]
    pub fn freshness(&self) -> Freshness {
        Freshness::from_u8(self.state.load(Ordering::Acquire))
    }

    /// The last sequence number applied, if any.
    pub fn last_seq(&self) -> Option<u64> {
        self.next_seq.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Adds one to a counter.
    pub fn bump(counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }
}

/// The writer's view of one engine's stream.
#[derive(Debug, Default)]
pub struct Stream {
    next: u64,
    held: BTreeMap<u64, Batch>,
    state: Option<Freshness>,
}

impl Stream {
    /// The stream of an engine registered before it started (exact, expecting batch 0),
    /// or not (`catching_up` until batch 0).
    pub fn new(started_empty: bool, status: &StatusCell) -> Self {
        let s = Self {
            state: started_empty.then_some(Freshness::Exact),
            ..Self::default()
        };
        s.publish(status, &[]);
        s
    }

    fn state(&self) -> Freshness {
        self.state.unwrap_or(Freshness::CatchingUp)
    }

    /// Offers batch `seq` (`None`: the next one); returns what to do, in order, and
    /// publishes the new state and counters to `status`.
    pub fn offer(&mut self, seq: Option<u64>, batch: Batch, status: &StatusCell) -> Vec<Action> {
        let seq = seq.unwrap_or(self.next);
        let mut out = Vec::new();
        if seq < self.next {
            let restart = seq == 0 || self.next - seq > RESTART_WINDOW;
            if !restart {
                StatusCell::bump(&status.duplicates, 1);
                return out;
            }
            StatusCell::bump(&status.resets, 1);
            self.restart(&mut out);
        }
        if seq > self.next {
            if !self.held.contains_key(&seq) && self.held.is_empty() {
                StatusCell::bump(&status.gaps, 1);
            }
            self.held.insert(seq, batch);
            if self.state() == Freshness::Exact {
                self.state = Some(Freshness::CatchingUp);
            }
            if self.held.len() > MAX_HELD {
                self.skip_gap_into(&mut out);
            }
        } else {
            self.apply(batch, &mut out);
            self.drain(&mut out);
        }
        self.publish(status, &out);
        out
    }

    /// Gives up on the open gap: applies the held batches in order and marks the engine
    /// stale (until an `AllBlocksCleared`).
    pub fn skip_gap(&mut self, status: &StatusCell) -> Vec<Action> {
        let mut out = Vec::new();
        self.skip_gap_into(&mut out);
        self.publish(status, &out);
        out
    }

    /// Forgets the stream: the residency is cleared and batch 0 is expected (an engine
    /// known to have restarted; a replay from 0 makes it exact again).
    pub fn reset(&mut self, status: &StatusCell) -> Vec<Action> {
        let mut out = Vec::new();
        StatusCell::bump(&status.resets, 1);
        self.restart(&mut out);
        self.state = Some(Freshness::CatchingUp);
        self.publish(status, &out);
        out
    }

    /// Marks the engine mismatched (sticky until [`reset`](Self::reset)).
    pub fn mismatch(&mut self, status: &StatusCell) {
        self.state = Some(Freshness::Mismatched);
        self.publish(status, &[]);
    }

    fn restart(&mut self, out: &mut Vec<Action>) {
        self.held.clear();
        self.next = 0;
        out.push(Action::ClearAll);
    }

    fn skip_gap_into(&mut self, out: &mut Vec<Action>) {
        let Some((&first, _)) = self.held.first_key_value() else {
            return;
        };
        self.next = first;
        if self.state() != Freshness::Mismatched {
            self.state = Some(Freshness::Stale);
        }
        self.drain(out);
    }

    fn apply(&mut self, batch: Batch, out: &mut Vec<Action>) {
        self.next += 1;
        if batch.clears && self.state() == Freshness::Stale {
            self.state = Some(Freshness::CatchingUp);
        }
        out.push(Action::Apply(batch));
    }

    fn drain(&mut self, out: &mut Vec<Action>) {
        while let Some(batch) = self.held.remove(&self.next) {
            self.apply(batch, out);
        }
        if self.held.is_empty() && self.state() == Freshness::CatchingUp {
            self.state = Some(Freshness::Exact);
        }
    }

    fn publish(&self, status: &StatusCell, out: &[Action]) {
        for a in out {
            if let Action::Apply(b) = a {
                StatusCell::bump(&status.batches, 1);
                StatusCell::bump(&status.events, b.events as u64);
            }
        }
        status.held.store(self.held.len() as u64, Ordering::Relaxed);
        status.next_seq.store(self.next, Ordering::Relaxed);
        status.state.store(self.state() as u8, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(clears: bool) -> Batch {
        Batch {
            ops: Arc::from(Vec::new()),
            clears,
            events: 1,
        }
    }

    fn applied(out: &[Action]) -> usize {
        out.iter().filter(|a| matches!(a, Action::Apply(_))).count()
    }

    #[test]
    fn an_engine_registered_before_it_starts_is_exact() {
        let st = StatusCell::default();
        let mut s = Stream::new(true, &st);
        assert_eq!(st.freshness(), Freshness::Exact);
        s.offer(Some(1), batch(false), &st);
        assert_eq!(st.freshness(), Freshness::CatchingUp);
    }

    #[test]
    fn in_order_from_zero_is_exact() {
        let (mut s, st) = (Stream::default(), StatusCell::default());
        assert_eq!(st.freshness(), Freshness::CatchingUp);
        assert_eq!(applied(&s.offer(Some(0), batch(false), &st)), 1);
        assert_eq!(st.freshness(), Freshness::Exact);
        assert_eq!(st.last_seq(), Some(0));
    }

    #[test]
    fn a_gap_holds_until_the_replay_fills_it() {
        let (mut s, st) = (Stream::default(), StatusCell::default());
        s.offer(Some(0), batch(false), &st);
        assert_eq!(applied(&s.offer(Some(2), batch(false), &st)), 0);
        assert_eq!(st.freshness(), Freshness::CatchingUp);
        assert_eq!(applied(&s.offer(Some(1), batch(false), &st)), 2);
        assert_eq!(st.freshness(), Freshness::Exact);
        assert_eq!(applied(&s.offer(Some(2), batch(false), &st)), 0);
        assert_eq!(st.duplicates.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_skipped_gap_is_stale_until_a_clear() {
        let (mut s, st) = (Stream::default(), StatusCell::default());
        s.offer(Some(0), batch(false), &st);
        s.offer(Some(5), batch(false), &st);
        assert_eq!(applied(&s.skip_gap(&st)), 1);
        assert_eq!(st.freshness(), Freshness::Stale);
        s.offer(Some(6), batch(false), &st);
        assert_eq!(st.freshness(), Freshness::Stale);
        s.offer(Some(7), batch(true), &st);
        assert_eq!(st.freshness(), Freshness::Exact);
    }

    #[test]
    fn batch_zero_again_is_a_restart() {
        let (mut s, st) = (Stream::default(), StatusCell::default());
        s.offer(Some(0), batch(false), &st);
        s.offer(Some(1), batch(false), &st);
        let out = s.offer(Some(0), batch(false), &st);
        assert!(matches!(out[0], Action::ClearAll));
        assert_eq!(applied(&out), 1);
        assert_eq!(st.resets.load(Ordering::Relaxed), 1);
        assert_eq!(st.freshness(), Freshness::Exact);
    }
}
