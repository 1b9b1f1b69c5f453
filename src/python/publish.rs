//! Python bindings for the `events` module: `encode_event_batch` and `EventSink` (the
//! scheduler-to-network hand-off; the ZMQ transport is `kvblocks.events`).
//!
//! Python event objects are read by attribute (vLLM's `BlockStored` / `BlockRemoved` /
//! `AllBlocksCleared` or kvblocks' own, recognised by class name).

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::python::errors::{invalid_argument, invalid_type};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PySet};

use super::events::key_value_from_py;
use super::manager::PyKVCacheManager;
use super::pool::PyBlockPool;

use crate::attention::SPEC_KINDS;
use crate::events::event::{BlockRemoved, BlockStored, EventExtraKeys, KvCacheEvent, MEDIA};
use crate::events::{encode_batch, EventBatch, EventSink, PayloadEncoder, WireFormat};

/// `BlockRemoved` fields kvblocks' encoder does not write; a value other than `None` is
/// refused.
const REMOVED_UNSUPPORTED: [&str; 2] = ["locality", "ownership"];

fn parse_format(name: &str) -> PyResult<WireFormat> {
    WireFormat::parse(name)
        .ok_or_else(|| invalid_argument(format!("format must be 'map' or 'array', got {name:?}")))
}

fn interned(value: &str, known: &[&'static str], what: &str) -> PyResult<&'static str> {
    known
        .iter()
        .copied()
        .find(|k| *k == value)
        .ok_or_else(|| invalid_argument(format!("unsupported {what} {value:?}")))
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn opt<'py, T: FromPyObject<'py>>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Option<T>> {
    obj.getattr(name)?.extract()
}

/// A field that an older vLLM's event class lacks (vLLM 0.32 has no
/// `lookahead_token_ids`): `None` when absent.
fn newer<'py, T: FromPyObject<'py>>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Option<T>> {
    if obj.hasattr(name)? {
        opt(obj, name)
    } else {
        Ok(None)
    }
}

fn medium(obj: &Bound<'_, PyAny>) -> PyResult<&'static str> {
    let m: Option<String> = opt(obj, "medium")?;
    let m = m.ok_or_else(|| invalid_argument("events without a medium are not supported"))?;
    interned(&m, &MEDIA, "medium")
}

fn group_idx(obj: &Bound<'_, PyAny>) -> PyResult<u32> {
    opt::<u32>(obj, "group_idx")?
        .ok_or_else(|| invalid_argument("events without a group_idx are not supported"))
}

fn extra_keys(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<EventExtraKeys>>> {
    let value = obj.getattr("extra_keys")?;
    if value.is_none() {
        return Ok(None);
    }
    let mut out = Vec::new();
    for block in value.try_iter()? {
        let block = block?;
        out.push(if block.is_none() {
            None
        } else {
            Some(
                block
                    .try_iter()?
                    .map(|k| key_value_from_py(&k?))
                    .collect::<PyResult<Vec<_>>>()?,
            )
        });
    }
    Ok(Some(out))
}

fn event_from_py(obj: &Bound<'_, PyAny>) -> PyResult<KvCacheEvent> {
    let ty = obj.get_type().name()?;
    match ty.to_str()? {
        "BlockStored" => {
            let kind: Option<String> = opt(obj, "kv_cache_spec_kind")?;
            Ok(KvCacheEvent::BlockStored(Box::new(BlockStored {
                block_hashes: obj.getattr("block_hashes")?.extract()?,
                parent_block_hash: opt(obj, "parent_block_hash")?,
                token_ids: obj.getattr("token_ids")?.extract()?,
                block_size: obj.getattr("block_size")?.extract()?,
                lora_id: opt(obj, "lora_id")?,
                medium: medium(obj)?,
                lora_name: opt(obj, "lora_name")?,
                extra_keys: extra_keys(obj)?,
                group_idx: group_idx(obj)?,
                kv_cache_spec_kind: kind
                    .map(|k| interned(&k, &SPEC_KINDS, "kv_cache_spec_kind"))
                    .transpose()?,
                kv_cache_spec_sliding_window: opt(obj, "kv_cache_spec_sliding_window")?,
                locality: newer(obj, "locality")?,
                ownership: newer(obj, "ownership")?,
                session_id: newer(obj, "session_id")?,
                lookahead_token_ids: newer(obj, "lookahead_token_ids")?,
            })))
        }
        "BlockRemoved" => {
            for name in REMOVED_UNSUPPORTED {
                if obj.hasattr(name)? && !obj.getattr(name)?.is_none() {
                    return Err(invalid_argument(format!(
                        "BlockRemoved.{name} is not supported by kvblocks' encoder"
                    )));
                }
            }
            Ok(KvCacheEvent::BlockRemoved(BlockRemoved {
                block_hashes: obj.getattr("block_hashes")?.extract()?,
                medium: medium(obj)?,
                group_idx: group_idx(obj)?,
            }))
        }
        "AllBlocksCleared" => Ok(KvCacheEvent::AllBlocksCleared),
        other => Err(invalid_type(format!(
            "expected BlockStored, BlockRemoved or AllBlocksCleared, got {other}"
        ))),
    }
}

fn events_from_py(events: &Bound<'_, PyAny>) -> PyResult<Vec<KvCacheEvent>> {
    events.try_iter()?.map(|e| event_from_py(&e?)).collect()
}

/// `encode_event_batch(ts, events, data_parallel_rank=None, *, format="map") -> bytes`:
/// vLLM 0.33.0's msgpack bytes for `KVEventBatch(ts, events, data_parallel_rank)`.
#[pyfunction]
#[pyo3(signature = (ts, events, data_parallel_rank=None, *, format="map"))]
fn encode_event_batch<'py>(
    py: Python<'py>,
    ts: f64,
    events: &Bound<'py, PyAny>,
    data_parallel_rank: Option<i64>,
    format: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let format = parse_format(format)?;
    let events = events_from_py(events)?;
    let bytes = py.allow_threads(|| encode_batch(ts, &events, data_parallel_rank, format));
    Ok(PyBytes::new(py, &bytes))
}

/// The scheduler-to-network hand-off: a bounded lock-free queue (drop-oldest) plus the
/// network side's numbering, encoding and cache mirror.
#[pyclass(name = "EventSink", module = "kvblocks._core", frozen)]
struct PyEventSink {
    sink: EventSink,
    encoder: Mutex<PayloadEncoder>,
}

impl PyEventSink {
    fn encoder(&self) -> std::sync::MutexGuard<'_, PayloadEncoder> {
        self.encoder.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl PyEventSink {
    #[new]
    #[pyo3(
        signature = (*, max_queue_size=100_000, format="map", data_parallel_rank=Some(0)),
        text_signature = "(*, max_queue_size=100000, format='map', data_parallel_rank=0)"
    )]
    fn new(max_queue_size: usize, format: &str, data_parallel_rank: Option<i64>) -> PyResult<Self> {
        let format = parse_format(format)?;
        Ok(Self {
            sink: EventSink::new(max_queue_size)?,
            encoder: Mutex::new(PayloadEncoder::new(format, data_parallel_rank)),
        })
    }

    /// Queues one batch of events without blocking; `False` when the oldest queued batch
    /// was dropped to make room. `ts` defaults to now.
    #[pyo3(signature = (events, ts=None, data_parallel_rank=None))]
    fn publish(
        &self,
        events: &Bound<'_, PyAny>,
        ts: Option<f64>,
        data_parallel_rank: Option<i64>,
    ) -> PyResult<bool> {
        let ts = ts.unwrap_or_else(now);
        let events = events_from_py(events)?;
        Ok(self.sink.push(EventBatch {
            ts,
            events,
            data_parallel_rank,
        }))
    }

    /// Moves the pending events of a `BlockPool` (or `KVCacheManager`) into the queue
    /// without making Python objects: O(1) for the batch, never blocks. `False` when the
    /// oldest queued batch was dropped to make room. `ts` defaults to now.
    #[pyo3(signature = (source, ts=None))]
    fn publish_from(&self, source: &Bound<'_, PyAny>, ts: Option<f64>) -> PyResult<bool> {
        let events = if let Ok(mgr) = source.downcast::<PyKVCacheManager>() {
            mgr.try_borrow_mut()?.take_core_events()
        } else if let Ok(pool) = source.downcast::<PyBlockPool>() {
            pool.try_borrow_mut()?.take_core_events(source.py())?
        } else {
            return Err(invalid_type(format!(
                "publish_from takes a BlockPool or KVCacheManager, not {}",
                source.get_type().name()?
            )));
        };
        Ok(self.sink.push(EventBatch {
            ts: ts.unwrap_or_else(now),
            events,
            data_parallel_rank: None,
        }))
    }

    /// Asks the network side to publish the whole cache as `BlockStored` events.
    fn request_snapshot(&self) {
        self.sink.request_snapshot();
    }

    /// Network side: waits up to `timeout` seconds for work and returns `(seq, payload)`,
    /// or `None` (timeout, refused snapshot, or closed and drained). Releases the GIL.
    fn next_payload<'py>(
        &self,
        py: Python<'py>,
        timeout: f64,
    ) -> PyResult<Option<(u64, Bound<'py, PyBytes>)>> {
        let timeout = Duration::try_from_secs_f64(timeout)
            .map_err(|_| invalid_argument("timeout must be a non-negative number"))?;
        let out = py.allow_threads(|| {
            let work = self.sink.pop(timeout)?;
            let mut enc = self.encoder();
            enc.encode(work, now())
                .map(|(seq, payload)| (seq, payload.to_vec()))
        });
        Ok(out.map(|(seq, payload)| (seq, PyBytes::new(py, &payload))))
    }

    /// Stops accepting work once drained: `next_payload` returns `None` at once.
    fn close(&self) {
        self.sink.close();
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.sink.is_closed()
    }

    /// Batches waiting in the queue.
    #[getter]
    fn pending(&self) -> usize {
        self.sink.len()
    }

    /// Whether dropped batches left the cache mirror incomplete (snapshots are refused
    /// until the next `AllBlocksCleared`).
    #[getter]
    fn stale(&self) -> bool {
        self.encoder().is_stale()
    }

    /// The counters, as a dict of ints.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.sink.stats();
        let e = self.encoder().stats();
        let d = PyDict::new(py);
        for (k, v) in [
            ("pushed_batches", s.pushed_batches),
            ("pushed_events", s.pushed_events),
            ("dropped_batches", s.dropped_batches),
            ("dropped_events", s.dropped_events),
            ("published_batches", e.published_batches),
            ("published_events", e.published_events),
            ("snapshots", e.snapshots),
            ("snapshots_refused", e.snapshots_refused),
            ("stored_blocks", e.stored_blocks),
            ("removed_blocks", e.removed_blocks),
            ("cleared", e.cleared),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// The (external hash, group) keys of the cache mirror built from published batches.
    fn cached_keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PySet>> {
        let keys: Vec<(u64, u32)> = self.encoder().index().keys().collect();
        PySet::new(py, keys)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(encode_event_batch, m)?)?;
    m.add_class::<PyEventSink>()?;
    Ok(())
}
