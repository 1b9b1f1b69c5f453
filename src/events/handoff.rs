//! The hand-off between the scheduler thread and the network thread.
//!
//! The scheduler calls [`EventSink::push`]: an O(1), lock-free push of the step's event
//! `Vec` (moved, not copied) into a bounded queue; when the queue is full the oldest batch
//! is dropped and counted. The network thread calls [`EventSink::pop`] and hands the batch
//! to a [`PayloadEncoder`], which numbers it, encodes it and keeps the [`CacheIndex`] that
//! snapshots are built from.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

use super::encode::{encode_batch_into, WireFormat};
use super::index::CacheIndex;
use crate::error::{KvError, Result};
use crate::events::event::KvCacheEvent;

/// One scheduler step's events (`KVEventBatch`).
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// Seconds since the epoch (`time.time()`).
    pub ts: f64,
    /// The events, in emission order.
    pub events: Vec<KvCacheEvent>,
    /// The data-parallel rank; `None` lets the publisher fill in its own.
    pub data_parallel_rank: Option<i64>,
}

/// What the network thread receives.
#[derive(Debug)]
pub enum Work {
    /// A batch to publish; `id` counts pushes, so a jump reveals dropped batches.
    Batch {
        /// Push number (0, 1, ...), across drops.
        id: u64,
        /// The batch.
        batch: EventBatch,
    },
    /// Publish the whole cache as `BlockStored` events.
    Snapshot,
}

/// Counters of an [`EventSink`] (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SinkStats {
    /// Batches accepted by `push`.
    pub pushed_batches: u64,
    /// Events in those batches.
    pub pushed_events: u64,
    /// Batches dropped because the queue was full (oldest first).
    pub dropped_batches: u64,
    /// Events in the dropped batches.
    pub dropped_events: u64,
}

/// The largest `max_queue_size` accepted (the queue's slots are allocated up front).
pub const MAX_QUEUE_SIZE: usize = 1 << 24;

/// A bounded, lock-free, multi-producer queue of event batches with drop-oldest overflow.
#[derive(Debug)]
pub struct EventSink {
    queue: ArrayQueue<(u64, EventBatch)>,
    snapshot_requested: AtomicBool,
    closed: AtomicBool,
    next_id: AtomicU64,
    pushed_events: AtomicU64,
    dropped_batches: AtomicU64,
    dropped_events: AtomicU64,
    /// The thread parked in `pop`, woken by producers (skipped while being registered).
    consumer: Mutex<Option<Thread>>,
}

impl EventSink {
    /// A sink holding at most `capacity` batches.
    pub fn new(capacity: usize) -> Result<Self> {
        if capacity == 0 {
            return Err(KvError::InvalidArgument(
                "max_queue_size must be positive".into(),
            ));
        }
        // The queue is allocated up front: a size beyond memory aborted the process
        // (found by tests/core/test_no_panic.py).
        if capacity > MAX_QUEUE_SIZE {
            return Err(KvError::InvalidArgument(format!(
                "max_queue_size must be at most {MAX_QUEUE_SIZE}, got {capacity}"
            )));
        }
        Ok(Self {
            queue: ArrayQueue::new(capacity),
            snapshot_requested: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            pushed_events: AtomicU64::new(0),
            dropped_batches: AtomicU64::new(0),
            dropped_events: AtomicU64::new(0),
            consumer: Mutex::new(None),
        })
    }

    /// Queues `batch` without blocking; returns `false` when the oldest batch was dropped
    /// to make room. Empty batches are not queued (vLLM publishes only non-empty steps).
    pub fn push(&self, batch: EventBatch) -> bool {
        if batch.events.is_empty() {
            return true;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.pushed_events
            .fetch_add(batch.events.len() as u64, Ordering::Relaxed);
        let displaced = self.queue.force_push((id, batch));
        let kept = match displaced {
            Some((_, old)) => {
                self.dropped_batches.fetch_add(1, Ordering::Relaxed);
                self.dropped_events
                    .fetch_add(old.events.len() as u64, Ordering::Relaxed);
                false
            }
            None => true,
        };
        self.wake();
        kept
    }

    /// Asks the network thread to publish a snapshot after the batches it has taken.
    pub fn request_snapshot(&self) {
        self.snapshot_requested.store(true, Ordering::Release);
        self.wake();
    }

    /// Stops the sink: `pop` returns what is queued, then `None` at once.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake();
    }

    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Batches waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no batch is waiting.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The counters.
    pub fn stats(&self) -> SinkStats {
        let dropped_batches = self.dropped_batches.load(Ordering::Relaxed);
        SinkStats {
            pushed_batches: self.next_id.load(Ordering::Relaxed),
            pushed_events: self.pushed_events.load(Ordering::Relaxed),
            dropped_batches,
            dropped_events: self.dropped_events.load(Ordering::Relaxed),
        }
    }

    /// Takes the next work item, waiting up to `timeout`. A snapshot request is served
    /// before queued batches; `None` after the timeout, or once closed and drained.
    pub fn pop(&self, timeout: Duration) -> Option<Work> {
        // A timeout past the end of `Instant` means no deadline (it panicked with an
        // overflow before; found by tests/core/test_no_panic.py).
        let deadline = Instant::now().checked_add(timeout);
        let mut registered = false;
        loop {
            if self.snapshot_requested.swap(false, Ordering::AcqRel) {
                return Some(Work::Snapshot);
            }
            if let Some((id, batch)) = self.queue.pop() {
                return Some(Work::Batch { id, batch });
            }
            if self.is_closed() {
                return None;
            }
            if !registered {
                // Register, then look again before parking (an unpark in between is kept).
                *self.consumer.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(std::thread::current());
                registered = true;
                continue;
            }
            match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return None;
                    }
                    std::thread::park_timeout(deadline - now);
                }
                None => std::thread::park(),
            }
        }
    }

    fn wake(&self) {
        if let Ok(guard) = self.consumer.try_lock() {
            if let Some(t) = guard.as_ref() {
                t.unpark();
            }
        }
    }
}

/// Counters of a [`PayloadEncoder`] (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncoderStats {
    /// Payloads produced (batches and snapshots); the next sequence number.
    pub published_batches: u64,
    /// Events encoded, snapshot events included.
    pub published_events: u64,
    /// Snapshots published.
    pub snapshots: u64,
    /// Snapshot requests refused because dropped batches left the index incomplete.
    pub snapshots_refused: u64,
    /// Block hashes announced by `BlockStored` events of batches (snapshots excluded).
    pub stored_blocks: u64,
    /// Block hashes dropped from the prefix cache (`BlockRemoved`): evictions.
    pub removed_blocks: u64,
    /// `AllBlocksCleared` events (prefix-cache resets).
    pub cleared: u64,
}

/// The network thread's state: sequence numbers, the wire format, the cache index.
#[derive(Debug)]
pub struct PayloadEncoder {
    format: WireFormat,
    data_parallel_rank: Option<i64>,
    index: CacheIndex,
    /// Push id expected next; a larger one means batches were dropped.
    expected_id: u64,
    /// The index missed dropped batches; exact again after the next `AllBlocksCleared`.
    stale: bool,
    stats: EncoderStats,
    buf: Vec<u8>,
}

impl PayloadEncoder {
    /// An encoder writing `format`, stamping `data_parallel_rank` on batches without one.
    pub fn new(format: WireFormat, data_parallel_rank: Option<i64>) -> Self {
        Self {
            format,
            data_parallel_rank,
            index: CacheIndex::new(),
            expected_id: 0,
            stale: false,
            stats: EncoderStats::default(),
            buf: Vec::new(),
        }
    }

    /// Numbers and encodes one work item: `(seq, payload)`, or `None` for a refused
    /// snapshot. The payload borrows an internal buffer reused across calls.
    pub fn encode(&mut self, work: Work, now: f64) -> Option<(u64, &[u8])> {
        let (ts, events, rank) = match work {
            Work::Batch { id, batch } => {
                if id != self.expected_id {
                    self.stale = true;
                }
                self.expected_id = id + 1;
                self.count(&batch.events);
                self.index.apply(&batch.events);
                if batch.events.contains(&KvCacheEvent::AllBlocksCleared) {
                    // Everything before the last clear is gone: the index is exact again.
                    self.stale = false;
                }
                (batch.ts, batch.events, batch.data_parallel_rank)
            }
            Work::Snapshot => {
                if self.stale {
                    self.stats.snapshots_refused += 1;
                    return None;
                }
                self.stats.snapshots += 1;
                (now, self.index.snapshot(), None)
            }
        };
        let seq = self.stats.published_batches;
        self.stats.published_batches += 1;
        self.stats.published_events += events.len() as u64;
        self.buf.clear();
        encode_batch_into(
            &mut self.buf,
            ts,
            &events,
            rank.or(self.data_parallel_rank),
            self.format,
        );
        Some((seq, &self.buf))
    }

    fn count(&mut self, events: &[KvCacheEvent]) {
        for event in events {
            match event {
                KvCacheEvent::BlockStored(e) => {
                    self.stats.stored_blocks += e.block_hashes.len() as u64
                }
                KvCacheEvent::BlockRemoved(e) => {
                    self.stats.removed_blocks += e.block_hashes.len() as u64
                }
                KvCacheEvent::AllBlocksCleared => self.stats.cleared += 1,
            }
        }
    }

    /// The counters.
    pub fn stats(&self) -> EncoderStats {
        self.stats
    }

    /// The mirror of the cache built from the published batches.
    pub fn index(&self) -> &CacheIndex {
        &self.index
    }

    /// Whether dropped batches left the index incomplete (snapshots are refused).
    pub fn is_stale(&self) -> bool {
        self.stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::event::{BlockRemoved, MEDIUM_GPU};

    fn batch(hashes: &[u64]) -> EventBatch {
        EventBatch {
            ts: 1.0,
            events: hashes
                .iter()
                .map(|&h| {
                    KvCacheEvent::BlockRemoved(BlockRemoved {
                        block_hashes: vec![h],
                        medium: MEDIUM_GPU,
                        group_idx: 0,
                    })
                })
                .collect(),
            data_parallel_rank: None,
        }
    }

    fn popped_ids(sink: &EventSink) -> Vec<u64> {
        std::iter::from_fn(|| match sink.pop(Duration::ZERO) {
            Some(Work::Batch { id, .. }) => Some(id),
            _ => None,
        })
        .collect()
    }

    #[test]
    fn full_queue_drops_the_oldest_and_counts() {
        let sink = EventSink::new(2).unwrap();
        assert!(sink.push(batch(&[1])));
        assert!(sink.push(batch(&[2, 3])));
        assert!(!sink.push(batch(&[4])));
        assert!(sink.push(batch(&[])));
        let s = sink.stats();
        assert_eq!((s.pushed_batches, s.pushed_events), (3, 4));
        assert_eq!((s.dropped_batches, s.dropped_events), (1, 1));
        assert_eq!(popped_ids(&sink), vec![1, 2]);
        assert!(EventSink::new(0).is_err());
    }

    #[test]
    fn pop_waits_for_a_producer_and_ends_when_closed() {
        let sink = std::sync::Arc::new(EventSink::new(4).unwrap());
        let producer = {
            let sink = sink.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                sink.push(batch(&[7]));
                sink.close();
            })
        };
        let got = sink.pop(Duration::from_secs(5));
        assert!(matches!(got, Some(Work::Batch { id: 0, .. })));
        producer.join().unwrap();
        assert!(sink.pop(Duration::from_secs(5)).is_none());
        assert!(sink.is_closed());
    }

    #[test]
    fn encoder_numbers_batches_and_refuses_stale_snapshots() {
        let sink = EventSink::new(1).unwrap();
        let mut enc = PayloadEncoder::new(WireFormat::Map, Some(3));
        sink.push(batch(&[1]));
        let (seq, payload) = enc.encode(sink.pop(Duration::ZERO).unwrap(), 0.0).unwrap();
        assert_eq!(seq, 0);
        assert_eq!(payload.last(), Some(&3)); // the publisher's rank is filled in
        sink.push(batch(&[2]));
        sink.push(batch(&[3])); // drops [2]
        let (seq, _) = enc.encode(sink.pop(Duration::ZERO).unwrap(), 0.0).unwrap();
        assert_eq!(seq, 1);
        assert!(enc.is_stale());
        sink.request_snapshot();
        assert!(enc.encode(sink.pop(Duration::ZERO).unwrap(), 0.0).is_none());
        sink.push(EventBatch {
            ts: 2.0,
            events: vec![KvCacheEvent::AllBlocksCleared],
            data_parallel_rank: None,
        });
        enc.encode(sink.pop(Duration::ZERO).unwrap(), 0.0).unwrap();
        assert!(!enc.is_stale());
        sink.request_snapshot();
        let (seq, _) = enc.encode(sink.pop(Duration::ZERO).unwrap(), 0.0).unwrap();
        assert_eq!(seq, 3);
        let s = enc.stats();
        assert_eq!(
            (s.snapshots, s.snapshots_refused, s.published_batches),
            (1, 1, 4)
        );
    }

    /// Regression (found by tests/core/test_no_panic.py): a timeout past the end of `Instant`
    /// panicked with an overflow, and a huge queue size aborted on allocation.
    #[test]
    fn huge_timeout_and_queue_size_are_safe() {
        let sink = EventSink::new(2).unwrap();
        sink.push(batch(&[1]));
        assert!(matches!(sink.pop(Duration::MAX), Some(Work::Batch { .. })));
        sink.close();
        assert!(sink.pop(Duration::MAX).is_none());
        assert!(EventSink::new(MAX_QUEUE_SIZE + 1).is_err());
        assert!(EventSink::new(usize::MAX).is_err());
    }
}
