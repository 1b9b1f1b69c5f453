//! Decoding one ZMQ payload of an engine's KV event stream: the msgpack `KVEventBatch`
//! (`[ts, events, data_parallel_rank]`) of vLLM 0.32 and 0.33 and of kvblocks' own
//! publisher, with events as tagged maps (vLLM after June 2026) or tagged positional
//! arrays (before). Markers and lengths are read with the `rmp` crate.
//!
//! Only what the index needs is kept: each event's hashes, parent, tokens, block size,
//! group, medium and whether its blocks carry extra keys or a LoRA adapter. Fields the
//! index does not read are skipped, and so are map keys it does not know (a newer vLLM
//! may add fields).
//!
//! Hash values: vLLM's `ExternalBlockHash` is an int (the low 64 bits of the digest, the
//! default) or the digest bytes; bytes are reduced the same way (the last 8 bytes read
//! big-endian), and a negative int is taken as its two's-complement `u64` (some
//! publishers write `i64`).

use rmp::decode::{self, RmpRead};
use rmp::Marker;

use crate::error::{KvError, Result};

/// Payloads larger than this are refused before decoding (vLLM's batches are a few KiB
/// to a few MiB).
pub const MAX_PAYLOAD_BYTES: usize = 256 << 20;

/// The medium a `BlockStored` / `BlockRemoved` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Medium {
    /// `"GPU"` (or no medium: vLLM before `medium` existed).
    Gpu,
    /// `"CPU"`: a host-memory tier (vLLM's CPU offloading, LMCache).
    Cpu,
    /// `"STORAGE"`: a disk tier.
    Storage,
}

impl Medium {
    /// Number of media.
    pub const COUNT: usize = 3;

    /// Index in `0..COUNT`.
    #[inline]
    pub fn index(self) -> usize {
        self as usize
    }

    fn parse(s: &[u8]) -> Result<Self> {
        match s {
            b"GPU" => Ok(Self::Gpu),
            b"CPU" => Ok(Self::Cpu),
            b"STORAGE" | b"DISK" => Ok(Self::Storage),
            other => Err(invalid(format!(
                "unknown medium {:?}",
                String::from_utf8_lossy(other)
            ))),
        }
    }
}

/// A `BlockStored` event, as the index reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// External hashes of the stored blocks, in table order.
    pub block_hashes: Vec<u64>,
    /// External hash of the parent of the first block (`None`: the chain's first block).
    pub parent: Option<u64>,
    /// The tokens of the stored range (skipped blocks of a sliding window included);
    /// empty when the event has a parent (NOTE 2).
    pub token_ids: Vec<u32>,
    /// Tokens per block of the group.
    pub block_size: u32,
    /// The KV cache group (0 when absent).
    pub group_idx: u32,
    /// Where the blocks are.
    pub medium: Medium,
    /// Whether a LoRA adapter or any block's extra keys entered the hashes.
    pub has_extra_keys: bool,
}

/// One decoded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireEvent {
    /// Blocks stored.
    Stored(Stored),
    /// Blocks removed (one entry each).
    Removed {
        /// External hashes removed.
        block_hashes: Vec<u64>,
        /// The KV cache group (0 when absent).
        group_idx: u32,
        /// Where they were.
        medium: Medium,
    },
    /// The whole cache was reset.
    Cleared,
}

/// One decoded payload.
#[derive(Debug, Clone, PartialEq)]
pub struct WireBatch {
    /// The publisher's timestamp.
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<WireEvent>,
    /// The data-parallel rank the publisher stamped, if any.
    pub data_parallel_rank: Option<i64>,
}

fn invalid(msg: String) -> KvError {
    KvError::InvalidEvent(msg)
}

fn malformed<E: std::fmt::Display>(e: E) -> KvError {
    invalid(format!("malformed msgpack: {e}"))
}

type Rd<'a> = &'a [u8];

/// Decodes one payload. Nothing is applied anywhere: a payload that fails to decode is
/// refused whole.
pub fn decode_batch(payload: &[u8]) -> Result<WireBatch> {
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(invalid(format!(
            "payload of {} bytes exceeds the limit of {MAX_PAYLOAD_BYTES}",
            payload.len()
        )));
    }
    let mut rd: Rd<'_> = payload;
    let n = array_len(&mut rd)?;
    if !(2..=3).contains(&n) {
        return Err(invalid(format!(
            "a KVEventBatch is [ts, events, data_parallel_rank]; got an array of {n}"
        )));
    }
    let ts = read_f64(&mut rd)?;
    let num_events = array_len(&mut rd)?;
    let mut events = Vec::with_capacity(num_events.min(rd.len()));
    for _ in 0..num_events {
        events.push(read_event(&mut rd)?);
    }
    let data_parallel_rank = if n == 3 { read_opt_i64(&mut rd)? } else { None };
    if !rd.is_empty() {
        return Err(invalid(format!(
            "{} trailing bytes after the KVEventBatch",
            rd.len()
        )));
    }
    Ok(WireBatch {
        ts,
        events,
        data_parallel_rank,
    })
}

fn marker(rd: &mut Rd<'_>) -> Result<Marker> {
    decode::read_marker(rd).map_err(|e| malformed(e.0))
}

/// A collection length, checked against the bytes left (each element takes one at
/// least), so a forged length cannot make us allocate.
fn checked_len(rd: &Rd<'_>, n: u32) -> Result<usize> {
    let n = n as usize;
    if n > rd.len() {
        return Err(invalid(format!(
            "truncated payload: {n} elements announced, {} bytes left",
            rd.len()
        )));
    }
    Ok(n)
}

fn array_len(rd: &mut Rd<'_>) -> Result<usize> {
    let n = decode::read_array_len(rd).map_err(malformed)?;
    checked_len(rd, n)
}

fn take<'a>(rd: &mut Rd<'a>, n: usize) -> Result<&'a [u8]> {
    if rd.len() < n {
        return Err(invalid("truncated payload".to_owned()));
    }
    let (head, tail) = rd.split_at(n);
    *rd = tail;
    Ok(head)
}

fn be_u64(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = bytes.len().min(8);
    b[8 - n..].copy_from_slice(&bytes[bytes.len() - n..]);
    u64::from_be_bytes(b)
}

/// An integer of any msgpack width, as `i128` (covers `u64` and `i64`).
fn int_after(rd: &mut Rd<'_>, m: Marker) -> Result<Option<i128>> {
    let v = match m {
        Marker::FixPos(v) => i128::from(v),
        Marker::FixNeg(v) => i128::from(v),
        Marker::U8 => i128::from(rd.read_data_u8().map_err(malformed)?),
        Marker::U16 => i128::from(rd.read_data_u16().map_err(malformed)?),
        Marker::U32 => i128::from(rd.read_data_u32().map_err(malformed)?),
        Marker::U64 => i128::from(rd.read_data_u64().map_err(malformed)?),
        Marker::I8 => i128::from(rd.read_data_i8().map_err(malformed)?),
        Marker::I16 => i128::from(rd.read_data_i16().map_err(malformed)?),
        Marker::I32 => i128::from(rd.read_data_i32().map_err(malformed)?),
        Marker::I64 => i128::from(rd.read_data_i64().map_err(malformed)?),
        _ => return Ok(None),
    };
    Ok(Some(v))
}

fn read_f64(rd: &mut Rd<'_>) -> Result<f64> {
    let m = marker(rd)?;
    match m {
        Marker::F64 => rd.read_data_f64().map_err(malformed),
        Marker::F32 => rd.read_data_f32().map(f64::from).map_err(malformed),
        m => int_after(rd, m)?
            .map(|v| v as f64)
            .ok_or_else(|| invalid(format!("expected a timestamp, got {m:?}"))),
    }
}

fn read_opt_i64(rd: &mut Rd<'_>) -> Result<Option<i64>> {
    let m = marker(rd)?;
    if m == Marker::Null {
        return Ok(None);
    }
    match int_after(rd, m)?.map(i64::try_from) {
        Some(Ok(v)) => Ok(Some(v)),
        _ => Err(invalid(format!("expected an int or nil, got {m:?}"))),
    }
}

fn read_u32(rd: &mut Rd<'_>, what: &str) -> Result<u32> {
    let m = marker(rd)?;
    match int_after(rd, m)?.map(u32::try_from) {
        Some(Ok(v)) => Ok(v),
        _ => Err(invalid(format!(
            "{what}: expected a non-negative int, got {m:?}"
        ))),
    }
}

fn read_opt_u32(rd: &mut Rd<'_>, what: &str) -> Result<Option<u32>> {
    if rd.first() == Some(&0xc0) {
        *rd = &rd[1..];
        return Ok(None);
    }
    read_u32(rd, what).map(Some)
}

fn str_after<'a>(rd: &mut Rd<'a>, m: Marker) -> Result<Option<&'a [u8]>> {
    let n = match m {
        Marker::FixStr(n) => usize::from(n),
        Marker::Str8 => usize::from(rd.read_data_u8().map_err(malformed)?),
        Marker::Str16 => usize::from(rd.read_data_u16().map_err(malformed)?),
        Marker::Str32 => rd.read_data_u32().map_err(malformed)? as usize,
        _ => return Ok(None),
    };
    take(rd, n).map(Some)
}

fn read_str<'a>(rd: &mut Rd<'a>, what: &str) -> Result<&'a [u8]> {
    let m = marker(rd)?;
    str_after(rd, m)?.ok_or_else(|| invalid(format!("{what}: expected a string, got {m:?}")))
}

/// An `ExternalBlockHash`: an int, or the digest bytes.
fn hash_after(rd: &mut Rd<'_>, m: Marker) -> Result<Option<u64>> {
    if let Some(v) = int_after(rd, m)? {
        // NOTE 1: i64 publishers write hashes above i64::MAX as negatives; the bits are
        // the same u64.
        return Ok(Some(v as u64));
    }
    let n = match m {
        Marker::Bin8 => usize::from(rd.read_data_u8().map_err(malformed)?),
        Marker::Bin16 => usize::from(rd.read_data_u16().map_err(malformed)?),
        Marker::Bin32 => rd.read_data_u32().map_err(malformed)? as usize,
        Marker::Null => return Ok(None),
        m => return Err(invalid(format!("expected a block hash, got {m:?}"))),
    };
    take(rd, n).map(|b| Some(be_u64(b)))
}

fn read_hashes(rd: &mut Rd<'_>) -> Result<Vec<u64>> {
    let n = array_len(rd)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let m = marker(rd)?;
        out.push(hash_after(rd, m)?.ok_or_else(|| invalid("a nil block hash".to_owned()))?);
    }
    Ok(out)
}

fn read_tokens(rd: &mut Rd<'_>) -> Result<Vec<u32>> {
    let n = array_len(rd)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(read_u32(rd, "token_ids")?);
    }
    Ok(out)
}

fn read_medium(rd: &mut Rd<'_>) -> Result<Medium> {
    let m = marker(rd)?;
    if m == Marker::Null {
        return Ok(Medium::Gpu);
    }
    let s = str_after(rd, m)?.ok_or_else(|| invalid(format!("medium: got {m:?}")))?;
    Medium::parse(s)
}

/// Whether a value is present and not nil (skipping it).
fn non_nil(rd: &mut Rd<'_>) -> Result<bool> {
    let m = marker(rd)?;
    if m == Marker::Null {
        return Ok(false);
    }
    skip_after(rd, m)?;
    Ok(true)
}

/// `extra_keys`: nil, or one entry (nil or a tuple) per block; true if any is set.
fn any_extra_keys(rd: &mut Rd<'_>) -> Result<bool> {
    let m = marker(rd)?;
    if m == Marker::Null {
        return Ok(false);
    }
    let n = array_len_after(rd, m)?;
    let mut any = false;
    for _ in 0..checked_len(rd, n)? {
        any |= non_nil(rd)?;
    }
    Ok(any)
}

fn skip(rd: &mut Rd<'_>) -> Result<()> {
    let m = marker(rd)?;
    skip_after(rd, m)
}

fn skip_after(rd: &mut Rd<'_>, m: Marker) -> Result<()> {
    let bytes = match m {
        Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => 0,
        Marker::U8 | Marker::I8 => 1,
        Marker::U16 | Marker::I16 => 2,
        Marker::U32 | Marker::I32 | Marker::F32 => 4,
        Marker::U64 | Marker::I64 | Marker::F64 => 8,
        Marker::FixStr(n) => usize::from(n),
        Marker::Str8 | Marker::Bin8 => usize::from(rd.read_data_u8().map_err(malformed)?),
        Marker::Str16 | Marker::Bin16 => usize::from(rd.read_data_u16().map_err(malformed)?),
        Marker::Str32 | Marker::Bin32 => rd.read_data_u32().map_err(malformed)? as usize,
        Marker::FixExt1 => 2,
        Marker::FixExt2 => 3,
        Marker::FixExt4 => 5,
        Marker::FixExt8 => 9,
        Marker::FixExt16 => 17,
        Marker::Ext8 => usize::from(rd.read_data_u8().map_err(malformed)?) + 1,
        Marker::Ext16 => usize::from(rd.read_data_u16().map_err(malformed)?) + 1,
        Marker::Ext32 => rd.read_data_u32().map_err(malformed)? as usize + 1,
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
            let n = array_len_after(rd, m)?;
            for _ in 0..checked_len(rd, n)? {
                skip(rd)?;
            }
            return Ok(());
        }
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
            let n = decode::marker_to_len(rd, m).map_err(malformed)?;
            for _ in 0..checked_len(rd, n)? {
                skip(rd)?;
                skip(rd)?;
            }
            return Ok(());
        }
        Marker::Reserved => return Err(invalid("reserved msgpack marker 0xc1".to_owned())),
    };
    take(rd, bytes).map(drop)
}

fn array_len_after(rd: &mut Rd<'_>, m: Marker) -> Result<u32> {
    match m {
        Marker::FixArray(n) => Ok(u32::from(n)),
        Marker::Array16 => rd.read_data_u16().map(u32::from).map_err(malformed),
        Marker::Array32 => rd.read_data_u32().map_err(malformed),
        m => Err(invalid(format!("expected an array, got {m:?}"))),
    }
}

fn read_event(rd: &mut Rd<'_>) -> Result<WireEvent> {
    let m = marker(rd)?;
    match m {
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
            let n = decode::marker_to_len(rd, m).map_err(malformed)?;
            let n = checked_len(rd, n)?;
            read_map_event(rd, n)
        }
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
            let n = array_len_after(rd, m)?;
            let n = checked_len(rd, n)?;
            read_array_event(rd, n)
        }
        m => Err(invalid(format!("an event is a map or an array; got {m:?}"))),
    }
}

/// The fields an event may carry, gathered from either layout.
#[derive(Default)]
struct Fields {
    hashes: Option<Vec<u64>>,
    parent: Option<u64>,
    tokens: Vec<u32>,
    block_size: Option<u32>,
    lora: bool,
    medium: Option<Medium>,
    extra_keys: bool,
    group_idx: u32,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stored,
    Removed,
    Cleared,
}

fn kind_of(tag: &[u8]) -> Result<Kind> {
    match tag {
        b"BlockStored" => Ok(Kind::Stored),
        b"BlockRemoved" => Ok(Kind::Removed),
        b"AllBlocksCleared" => Ok(Kind::Cleared),
        other => Err(invalid(format!(
            "unknown event type {:?}",
            String::from_utf8_lossy(other)
        ))),
    }
}

/// Reads the field `name` of an event into `f`; unknown names are skipped.
fn read_field(rd: &mut Rd<'_>, f: &mut Fields, name: &[u8]) -> Result<()> {
    match name {
        b"block_hashes" => f.hashes = Some(read_hashes(rd)?),
        b"parent_block_hash" => {
            let m = marker(rd)?;
            f.parent = hash_after(rd, m)?;
        }
        // NOTE 2: only a chain's first blocks can be hash-checked (`verify.rs`); the
        // tokens of a store with a parent are skipped, not collected.
        b"token_ids" if f.parent.is_some() => skip(rd)?,
        b"token_ids" => f.tokens = read_tokens(rd)?,
        b"block_size" => f.block_size = Some(read_u32(rd, "block_size")?),
        b"lora_id" | b"lora_name" => f.lora |= non_nil(rd)?,
        b"medium" => f.medium = Some(read_medium(rd)?),
        b"extra_keys" => f.extra_keys = any_extra_keys(rd)?,
        b"group_idx" => f.group_idx = read_opt_u32(rd, "group_idx")?.unwrap_or(0),
        _ => skip(rd)?,
    }
    Ok(())
}

/// Positional field names after the tag (vLLM's declaration order).
const STORED_FIELDS: [&[u8]; 15] = [
    b"block_hashes",
    b"parent_block_hash",
    b"token_ids",
    b"block_size",
    b"lora_id",
    b"medium",
    b"lora_name",
    b"extra_keys",
    b"group_idx",
    b"kv_cache_spec_kind",
    b"kv_cache_spec_sliding_window",
    b"locality",
    b"ownership",
    b"session_id",
    b"lookahead_token_ids",
];
const REMOVED_FIELDS: [&[u8]; 5] = [
    b"block_hashes",
    b"medium",
    b"group_idx",
    b"locality",
    b"ownership",
];

fn read_map_event(rd: &mut Rd<'_>, n: usize) -> Result<WireEvent> {
    let mut kind = None;
    let mut f = Fields::default();
    for _ in 0..n {
        let key = read_str(rd, "event key")?;
        if key == b"type" {
            kind = Some(kind_of(read_str(rd, "type")?)?);
        } else {
            read_field(rd, &mut f, key)?;
        }
    }
    let kind = kind.ok_or_else(|| invalid("an event map without \"type\"".to_owned()))?;
    finish(kind, f)
}

fn read_array_event(rd: &mut Rd<'_>, n: usize) -> Result<WireEvent> {
    if n == 0 {
        return Err(invalid("an empty event array".to_owned()));
    }
    let kind = kind_of(read_str(rd, "event tag")?)?;
    let names: &[&[u8]] = match kind {
        Kind::Stored => &STORED_FIELDS,
        Kind::Removed => &REMOVED_FIELDS,
        Kind::Cleared => &[],
    };
    let mut f = Fields::default();
    for i in 0..n - 1 {
        match names.get(i) {
            Some(name) => read_field(rd, &mut f, name)?,
            None => skip(rd)?,
        }
    }
    finish(kind, f)
}

fn finish(kind: Kind, f: Fields) -> Result<WireEvent> {
    let missing = |what: &str| invalid(format!("an event without {what}"));
    Ok(match kind {
        Kind::Cleared => WireEvent::Cleared,
        Kind::Removed => WireEvent::Removed {
            block_hashes: f.hashes.ok_or_else(|| missing("block_hashes"))?,
            group_idx: f.group_idx,
            medium: f.medium.unwrap_or(Medium::Gpu),
        },
        Kind::Stored => WireEvent::Stored(Stored {
            block_hashes: f.hashes.ok_or_else(|| missing("block_hashes"))?,
            parent: f.parent,
            token_ids: f.tokens,
            block_size: f.block_size.ok_or_else(|| missing("block_size"))?,
            group_idx: f.group_idx,
            medium: f.medium.unwrap_or(Medium::Gpu),
            has_extra_keys: f.extra_keys || f.lora,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::event::{BlockRemoved, BlockStored, KvCacheEvent};
    use crate::events::{encode_batch, WireFormat};

    fn stored(hashes: Vec<u64>, parent: Option<u64>, group: u32) -> KvCacheEvent {
        KvCacheEvent::BlockStored(Box::new(BlockStored {
            block_hashes: hashes.clone(),
            parent_block_hash: parent,
            token_ids: (0..hashes.len() as u32 * 4).collect(),
            block_size: 4,
            lora_id: None,
            medium: "GPU",
            lora_name: None,
            extra_keys: None,
            group_idx: group,
            kv_cache_spec_kind: Some("full_attention"),
            kv_cache_spec_sliding_window: None,
            locality: None,
            ownership: None,
            session_id: Some("s".into()),
            lookahead_token_ids: None,
        }))
    }

    #[test]
    fn both_layouts_decode_to_the_same_events() {
        let events = vec![
            stored(vec![u64::MAX, 7], None, 1),
            KvCacheEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![7],
                medium: "CPU",
                group_idx: 2,
            }),
            KvCacheEvent::AllBlocksCleared,
        ];
        for format in [WireFormat::Map, WireFormat::Array] {
            let b = decode_batch(&encode_batch(1.5, &events, Some(3), format)).unwrap();
            assert_eq!(b.ts, 1.5);
            assert_eq!(b.data_parallel_rank, Some(3));
            let WireEvent::Stored(s) = &b.events[0] else {
                panic!("{:?}", b.events[0])
            };
            assert_eq!(s.block_hashes, vec![u64::MAX, 7]);
            assert_eq!((s.parent, s.group_idx, s.block_size), (None, 1, 4));
            assert_eq!(s.token_ids.len(), 8);
            let with_parent = stored(vec![5], Some(4), 0);
            let b2 = decode_batch(&encode_batch(0.0, &[with_parent], None, format)).unwrap();
            let WireEvent::Stored(s2) = &b2.events[0] else {
                panic!("{:?}", b2.events[0])
            };
            assert_eq!((s2.parent, s2.token_ids.len()), (Some(4), 0));
            assert!(!s.has_extra_keys);
            assert_eq!(
                b.events[1],
                WireEvent::Removed {
                    block_hashes: vec![7],
                    group_idx: 2,
                    medium: Medium::Cpu
                }
            );
            assert_eq!(b.events[2], WireEvent::Cleared);
        }
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let events = vec![
            stored(vec![1, 2, 3], Some(9), 0),
            KvCacheEvent::AllBlocksCleared,
        ];
        let bytes = encode_batch(0.0, &events, None, WireFormat::Map);
        for n in 0..bytes.len() {
            assert!(decode_batch(&bytes[..n]).is_err(), "prefix of {n} bytes");
        }
        let mut garbled = bytes.clone();
        garbled.push(0);
        assert!(decode_batch(&garbled).is_err());
    }

    #[test]
    fn digest_bytes_reduce_to_the_low_64_bits() {
        assert_eq!(be_u64(&[0xff; 32]), u64::MAX);
        assert_eq!(be_u64(&[1, 2]), 0x0102);
    }
}
