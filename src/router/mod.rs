//! The router's index: which blocks each engine of a fleet holds, fed only by the
//! engines' KV event streams, answering for a request how many leading tokens each engine
//! would hit right now, per tier, with the engine's own rules (docs/router.md).
//!
//! - **Engines** are registered with what their events do not carry ([`EngineConfig`]).
//! - **Ingest** ([`KvIndex::ingest`]) decodes one ZMQ payload (vLLM 0.32/0.33 and
//!   kvblocks, map and array layouts; [`wire`]), checks it against the registration
//!   (groups, block sizes, a sample of hashes: [`verify`]), orders it by its sequence
//!   number ([`freshness`]) and applies it. Residency is an inverted index: per (group,
//!   medium), each hash's engines, with counts ([`residency`]).
//! - **Queries** ([`KvIndex::hits`]) hash the request once per hash configuration, look
//!   each of its blocks up once for all engines of a shard of 64, and run each engine's hit
//!   rules, the manager's own, over what it holds ([`engine`]).
//!
//! Concurrency: the fleet is kept twice by the `left-right` crate. Readers work on one
//! copy with no lock (each takes a read handle from a lock-free pool); the one writer at a
//! time (a mutex among writers only) applies a batch to the other copy, swaps, and applies
//! it again once the last reader has left the old copy. A reader never waits for a
//! writer, and sees each batch whole or not at all.
//!
//! ```
//! use kvblocks::attention::{AttentionKind, ManagerParams};
//! use kvblocks::events::event::{BlockStored, KvCacheEvent};
//! use kvblocks::events::{encode_batch, WireFormat};
//! use kvblocks::hashing::{BlockHasher, HashAlgo};
//! use kvblocks::request::{Request, RequestOptions};
//! use kvblocks::router::{EngineConfig, KvIndex};
//!
//! let index = KvIndex::new();
//! let full = ManagerParams::new(AttentionKind::FullAttention, 16, 0);
//! index.add_engine("engine-0", EngineConfig::new(vec![full], 4096, 16)).unwrap();
//!
//! // What engine-0 would publish after caching the first two blocks of a prompt.
//! let prompt: Vec<u32> = (0..40).collect();
//! let hasher = BlockHasher::new(16, HashAlgo::Sha256Cbor).unwrap();
//! let req = Request::new("r", prompt.clone(), Some(hasher), RequestOptions::default()).unwrap();
//! let stored = BlockStored {
//!     block_hashes: req.block_hashes().iter().map(|h| h.external()).collect(),
//!     parent_block_hash: None,
//!     token_ids: prompt[..32].to_vec(),
//!     block_size: 16,
//!     lora_id: None,
//!     medium: "GPU",
//!     lora_name: None,
//!     extra_keys: None,
//!     group_idx: 0,
//!     kv_cache_spec_kind: Some("full_attention"),
//!     kv_cache_spec_sliding_window: None,
//!     locality: None,
//!     ownership: None,
//!     session_id: None,
//!     lookahead_token_ids: None,
//! };
//! let payload = encode_batch(0.0, &[KvCacheEvent::BlockStored(Box::new(stored))], None, WireFormat::Map);
//! index.ingest("engine-0", Some(0), &payload).unwrap();
//!
//! let hits = index.hits(&prompt, &RequestOptions::default(), None).unwrap();
//! assert_eq!(hits[0].gpu_tokens, 32);
//! assert_eq!(hits[0].freshness.name(), "exact");
//! ```

pub mod engine;
pub mod freshness;
pub mod residency;
pub mod verify;
pub mod wire;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crossbeam_queue::SegQueue;
use left_right::{ReadHandle, ReadHandleFactory, WriteHandle};
use rustc_hash::FxHashMap;

use crate::error::{KvError, Result};
use crate::request::{Request, RequestOptions};
use crate::types::BlockHash;

pub use engine::{EngineConfig, EngineInfo, HashDomain, Hit};
pub use freshness::{Action, Batch, Freshness, StatusCell, Stream};
pub use residency::{place, BlockOp, Fleet, FleetOp, Probe, Slot};
pub use verify::HashCheck;
pub use wire::{decode_batch, Medium, WireBatch, WireEvent};

/// One engine's answer to a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineHit {
    /// The engine.
    pub engine: Arc<str>,
    /// Tokens its `get_computed_blocks` would return now.
    pub gpu_tokens: usize,
    /// Tokens past those that its host tier (CPU offloading) would load.
    pub host_tokens: usize,
    /// Tokens per block in the counts below (its hit unit: the scheduler block size).
    pub block_size: usize,
    /// How far its state can be trusted.
    pub freshness: Freshness,
}

impl EngineHit {
    /// `gpu_tokens` in blocks.
    pub fn gpu_blocks(&self) -> usize {
        self.gpu_tokens / self.block_size.max(1)
    }

    /// `host_tokens` in blocks.
    pub fn host_blocks(&self) -> usize {
        self.host_tokens / self.block_size.max(1)
    }
}

/// What one `ingest` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestReport {
    /// Batches applied by this call (0 when held behind a gap or dropped as a duplicate;
    /// more than 1 when it closed a gap).
    pub batches_applied: usize,
    /// The engine's freshness afterwards.
    pub freshness: Freshness,
}

/// An engine's counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineStatus {
    /// Freshness.
    pub freshness: Freshness,
    /// Last sequence number applied.
    pub last_seq: Option<u64>,
    /// Batches applied.
    pub batches: u64,
    /// Events applied.
    pub events: u64,
    /// Batches dropped as duplicates.
    pub duplicates: u64,
    /// Gaps seen.
    pub gaps: u64,
    /// Restarts seen and resets.
    pub resets: u64,
    /// Batches held behind the open gap.
    pub held: u64,
    /// Stored events whose hashes were checked.
    pub hash_checks: u64,
    /// Checks that failed.
    pub hash_mismatches: u64,
    /// Blocks held, over every group and medium.
    pub blocks: usize,
    /// Data-parallel rank.
    pub data_parallel_rank: Option<i64>,
}

struct WriterEngine {
    slot: u32,
    info: Arc<EngineInfo>,
    stream: Stream,
    checks: HashCheck,
}

struct Writer {
    handle: WriteHandle<Fleet, FleetOp>,
    engines: FxHashMap<Arc<str>, WriterEngine>,
    free_slots: Vec<u32>,
    next_slot: u32,
}

/// The index (see the module docs). `Send + Sync`: share it by reference or `Arc`.
pub struct KvIndex {
    writer: Mutex<Writer>,
    factory: ReadHandleFactory<Fleet>,
    idle_readers: SegQueue<ReadHandle<Fleet>>,
}

impl std::fmt::Debug for KvIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvIndex").finish_non_exhaustive()
    }
}

impl Default for KvIndex {
    fn default() -> Self {
        Self::new()
    }
}

fn unknown(engine: &str) -> KvError {
    KvError::UnknownEngine(engine.to_owned())
}

impl KvIndex {
    /// An index of no engines.
    pub fn new() -> Self {
        let (handle, reader) = left_right::new::<Fleet, FleetOp>();
        let factory = reader.factory();
        let idle_readers = SegQueue::new();
        idle_readers.push(reader);
        let mut handle = handle;
        handle.publish();
        Self {
            writer: Mutex::new(Writer {
                handle,
                engines: FxHashMap::default(),
                free_slots: Vec::new(),
                next_slot: 0,
            }),
            factory,
            idle_readers,
        }
    }

    fn writer(&self) -> MutexGuard<'_, Writer> {
        // NOTE 1: a writer that panicked left both copies as they were before its
        // batch's publish; the state is consistent, so the lock is taken over.
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the current copy of the fleet, without waiting for any writer.
    fn read<R>(&self, f: impl FnOnce(&Fleet) -> Result<R>) -> Result<R> {
        let handle = self
            .idle_readers
            .pop()
            .unwrap_or_else(|| self.factory.handle());
        let out = match handle.enter() {
            Some(fleet) => f(&fleet),
            None => Err(KvError::InvalidArgument("the index is closed".into())),
        };
        self.idle_readers.push(handle);
        out
    }

    /// Registers engine `id`; fails if it is known or its layout cannot be built.
    pub fn add_engine(&self, id: &str, config: EngineConfig) -> Result<()> {
        let info = Arc::new(EngineInfo::new(id, config)?);
        let mut w = self.writer();
        if w.engines.contains_key(id) {
            return Err(KvError::InvalidArgument(format!(
                "engine {id:?} is already registered"
            )));
        }
        let slot = w.free_slots.pop().unwrap_or_else(|| {
            w.next_slot += 1;
            w.next_slot - 1
        });
        let stream = Stream::new(info.started_empty, &info.status);
        w.handle.append(FleetOp::Add {
            slot,
            info: info.clone(),
        });
        w.handle.publish();
        w.engines.insert(
            info.id.clone(),
            WriterEngine {
                slot,
                info,
                stream,
                checks: HashCheck::default(),
            },
        );
        Ok(())
    }

    /// Drops engine `id` and what it holds.
    pub fn remove_engine(&self, id: &str) -> Result<()> {
        let mut w = self.writer();
        let e = w.engines.remove(id).ok_or_else(|| unknown(id))?;
        w.handle.append(FleetOp::Remove { slot: e.slot });
        w.handle.publish();
        w.free_slots.push(e.slot);
        Ok(())
    }

    /// The registered engines, in slot order (read without waiting for a writer).
    pub fn engines(&self) -> Vec<Arc<str>> {
        self.read(|fleet| Ok(fleet.iter().map(|(_, s)| s.info.id.clone()).collect()))
            .unwrap_or_default()
    }

    /// Applies one payload of engine `id`'s event stream, `seq` being its sequence
    /// number (`None`: the next one). A payload that does not decode, names a group the
    /// engine does not have, or a block size other than its group's, is refused whole
    /// and changes nothing; a hash that does not match the registration marks the engine
    /// mismatched and is refused ([`KvError::HashMismatch`]).
    pub fn ingest(&self, id: &str, seq: Option<u64>, payload: &[u8]) -> Result<IngestReport> {
        let batch = wire::decode_batch(payload)?;
        let mut guard = self.writer();
        let w = &mut *guard;
        let e = w.engines.get_mut(id).ok_or_else(|| unknown(id))?;
        let ops = block_ops(&e.info, &batch)?;
        for ev in &batch.events {
            if let WireEvent::Stored(s) = ev {
                match e.checks.check(&e.info, s) {
                    Ok(true) => StatusCell::bump(&e.info.status.hash_checks, 1),
                    Ok(false) => {}
                    Err(err) => {
                        StatusCell::bump(&e.info.status.hash_checks, 1);
                        StatusCell::bump(&e.info.status.hash_mismatches, 1);
                        e.stream.mismatch(&e.info.status);
                        return Err(err);
                    }
                }
            }
        }
        let clears = batch.events.contains(&WireEvent::Cleared);
        let offered = Batch {
            ops: ops.into(),
            clears,
            events: batch.events.len(),
        };
        let actions = e.stream.offer(seq, offered, &e.info.status);
        let applied = apply(&mut w.handle, e.slot, actions);
        Ok(IngestReport {
            batches_applied: applied,
            freshness: e.info.status.freshness(),
        })
    }

    /// Gives up on engine `id`'s open gap (no replay can fill it): the held batches are
    /// applied and the engine is stale until its next `AllBlocksCleared` (a snapshot).
    pub fn skip_gap(&self, id: &str) -> Result<Freshness> {
        self.with_stream(id, |s, status| s.skip_gap(status))
    }

    /// Clears engine `id`'s residency and expects its stream from batch 0 again (an
    /// engine known to have restarted; a replay from 0 makes it exact).
    pub fn reset_engine(&self, id: &str) -> Result<Freshness> {
        self.with_stream(id, |s, status| s.reset(status))
    }

    fn with_stream(
        &self,
        id: &str,
        f: impl FnOnce(&mut Stream, &StatusCell) -> Vec<Action>,
    ) -> Result<Freshness> {
        let mut guard = self.writer();
        let w = &mut *guard;
        let e = w.engines.get_mut(id).ok_or_else(|| unknown(id))?;
        let actions = f(&mut e.stream, &e.info.status);
        apply(&mut w.handle, e.slot, actions);
        Ok(e.info.status.freshness())
    }

    /// Engine `id`'s counters.
    pub fn status(&self, id: &str) -> Result<EngineStatus> {
        self.read(|fleet| {
            let (_, slot) = fleet.get(id).ok_or_else(|| unknown(id))?;
            let st = &slot.info.status;
            let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
            Ok(EngineStatus {
                freshness: st.freshness(),
                last_seq: st.last_seq(),
                batches: n(&st.batches),
                events: n(&st.events),
                duplicates: n(&st.duplicates),
                gaps: n(&st.gaps),
                resets: n(&st.resets),
                held: n(&st.held),
                hash_checks: n(&st.hash_checks),
                hash_mismatches: n(&st.hash_mismatches),
                blocks: slot.blocks,
                data_parallel_rank: slot.info.data_parallel_rank,
            })
        })
    }

    /// Bytes of residency tables (both copies) and the residencies they hold.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.read(|fleet| {
            let blocks = fleet.iter().map(|(_, s)| s.blocks).sum();
            Ok((2 * fleet.memory_bytes(), blocks))
        })
    }

    /// Every engine's hit (or those of `engines`) for a request of `tokens` with
    /// `options`' extra keys (LoRA, multimodal items, cache salt). The request is hashed
    /// once per hash configuration among the engines.
    pub fn hits(
        &self,
        tokens: &[u32],
        options: &RequestOptions,
        engines: Option<&[&str]>,
    ) -> Result<Vec<EngineHit>> {
        if tokens.is_empty() {
            return Err(KvError::InvalidArgument(
                "a request needs at least one token".into(),
            ));
        }
        self.read(|fleet| {
            let chosen = selected(fleet, engines)?;
            let mut domains: Vec<(HashDomain, Vec<BlockHash>)> = Vec::new();
            let mut which = Vec::with_capacity(chosen.len());
            for (_, slot) in &chosen {
                let d = slot.info.domain();
                let i = match domains.iter().position(|(k, _)| *k == d) {
                    Some(i) => i,
                    None => {
                        let h = Request::hash_prompt(&d.hasher, d.root, tokens, options)?;
                        domains.push((d, h));
                        domains.len() - 1
                    }
                };
                which.push(i);
            }
            answer(fleet, &chosen, |k| &domains[which[k]].1, tokens.len())
        })
    }

    /// [`hits`](Self::hits) of a request of `num_tokens` tokens whose block hashes (at
    /// each engine's hash block size, in each engine's hash configuration) are `hashes`.
    pub fn hits_from_hashes(
        &self,
        hashes: &[BlockHash],
        num_tokens: usize,
        engines: Option<&[&str]>,
    ) -> Result<Vec<EngineHit>> {
        self.read(|fleet| {
            let chosen = selected(fleet, engines)?;
            answer(fleet, &chosen, |_| hashes, num_tokens)
        })
    }
}

/// The engines a query asks (all of them for `None`), with their slots.
fn selected<'f>(fleet: &'f Fleet, engines: Option<&[&str]>) -> Result<Vec<(u32, &'f Slot)>> {
    match engines {
        None => Ok(fleet.iter().collect()),
        Some(ids) => ids
            .iter()
            .map(|id| fleet.get(id).ok_or_else(|| unknown(id)))
            .collect(),
    }
}

/// Each chosen engine's hit, the `k`-th engine's request hashed as `hashes_of(k)` (one
/// slice per hash domain). Engines of one shard and domain share one [`Probe`]: each of
/// the request's blocks is looked up once for all of them.
fn answer<'h>(
    fleet: &Fleet,
    chosen: &[(u32, &Slot)],
    hashes_of: impl Fn(usize) -> &'h [BlockHash],
    num_tokens: usize,
) -> Result<Vec<EngineHit>> {
    let mut probes: Vec<((usize, usize), Probe<'_>)> = Vec::new();
    let mut out = Vec::with_capacity(chosen.len());
    for (k, &(slot, s)) in chosen.iter().enumerate() {
        let hashes = hashes_of(k);
        let (shard, bit) = place(slot);
        let key = (hashes.as_ptr() as usize, shard);
        let p = match probes.iter().position(|(pk, _)| *pk == key) {
            Some(p) => p,
            None => {
                probes.push((key, Probe::new(fleet.shard(shard), hashes)));
                probes.len() - 1
            }
        };
        let hit = s.info.hit(&probes[p].1, bit, hashes, num_tokens)?;
        out.push(EngineHit {
            engine: s.info.id.clone(),
            gpu_tokens: hit.gpu_tokens,
            host_tokens: hit.host_tokens,
            block_size: s.info.hit_block_size(),
            freshness: s.info.status.freshness(),
        });
    }
    Ok(out)
}

/// Appends the stream's actions for the engine in `slot` and publishes them; returns
/// the batches applied.
fn apply(handle: &mut WriteHandle<Fleet, FleetOp>, slot: u32, actions: Vec<Action>) -> usize {
    let mut applied = 0;
    for a in actions {
        let ops = match a {
            Action::ClearAll => Arc::from(vec![BlockOp::Clear]),
            Action::Apply(b) => {
                applied += 1;
                b.ops
            }
        };
        handle.append(FleetOp::Apply { slot, ops });
    }
    handle.publish();
    applied
}

/// The block changes of a decoded batch, checked against the engine's registration.
fn block_ops(info: &EngineInfo, batch: &WireBatch) -> Result<Vec<BlockOp>> {
    if let (Some(want), Some(got)) = (info.data_parallel_rank, batch.data_parallel_rank) {
        if want != got {
            return Err(KvError::InvalidEvent(format!(
                "a batch of data-parallel rank {got} for engine {:?} of rank {want}",
                &*info.id
            )));
        }
    }
    let sizes = info.group_block_sizes();
    let table = |group: u32, medium: Medium| -> Result<u32> {
        if group as usize >= sizes.len() {
            return Err(KvError::InvalidEvent(format!(
                "group_idx {group} out of range: engine {:?} has {} groups",
                &*info.id,
                sizes.len()
            )));
        }
        Ok(residency::table_of(group, medium))
    };
    let mut ops = Vec::new();
    for ev in &batch.events {
        match ev {
            WireEvent::Stored(s) => {
                let t = table(s.group_idx, s.medium)?;
                let bs = sizes[s.group_idx as usize];
                if s.medium == Medium::Gpu && s.block_size as usize != bs {
                    return Err(KvError::InvalidEvent(format!(
                        "block_size {} in group {} of engine {:?}, registered with {bs}",
                        s.block_size, s.group_idx, &*info.id
                    )));
                }
                ops.extend(
                    s.block_hashes
                        .iter()
                        .map(|&hash| BlockOp::Store { table: t, hash }),
                );
            }
            WireEvent::Removed {
                block_hashes,
                group_idx,
                medium,
            } => {
                let t = table(*group_idx, *medium)?;
                ops.extend(
                    block_hashes
                        .iter()
                        .map(|&hash| BlockOp::Remove { table: t, hash }),
                );
            }
            WireEvent::Cleared => ops.push(BlockOp::Clear),
        }
    }
    Ok(ops)
}
