//! Event batches as msgpack bytes, identical to what msgspec 0.22 produces for vLLM
//! 0.33.0's `KVEventBatch` structs.
//!
//! Facts (checked against the oracle, see `tools/gen_event_fixtures.py`):
//! - the envelope `EventBatch(array_like=True, omit_defaults=True)` is always the
//!   3-element array `[ts, events, data_parallel_rank]`: msgspec does not omit defaults of
//!   `array_like` structs, so a `None` rank is written as `nil`;
//! - vLLM 0.33.0's events (`tag=True, omit_defaults=True`, not `array_like`) are maps
//!   whose first key is `"type"` (the class name), followed by the fields in declaration
//!   order, leaving out the defaulted fields whose value is `None`: [`WireFormat::Map`].
//!   msgspec chooses the map header from the struct's entry count (fields + tag) before
//!   leaving fields out, so `BlockStored` (15 fields + tag) always has a `map16` header;
//! - the older positional form is what msgspec emits for the same structs declared with
//!   `array_like=True`: `[class name, every field in order]`, defaults included:
//!   [`WireFormat::Array`]. `BlockStored` thus has 16 elements, `BlockRemoved` 6.
//!
//! `BlockStored`'s last four fields (`locality`, `ownership`, `session_id`,
//! `lookahead_token_ids`) are written as any other defaulted field. `BlockRemoved`'s
//! `locality` and `ownership` are always `None` in kvblocks.

use super::msgpack::MsgpackWriter;
use crate::events::event::{BlockRemoved, BlockStored, KvCacheEvent};

/// How events are laid out on the wire (the envelope is positional in both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WireFormat {
    /// Maps tagged with `"type"`: what vLLM 0.33.0 emits (vLLM after June 2026).
    #[default]
    Map,
    /// Tagged positional arrays (`array_like=True`): vLLM before June 2026.
    Array,
}

impl WireFormat {
    /// Parses `"map"` or `"array"`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "map" => Some(Self::Map),
            "array" => Some(Self::Array),
            _ => None,
        }
    }
}

/// Fields of `BlockRemoved` after `group_idx`, all `None` in kvblocks.
const REMOVED_TRAILING_NONE: usize = 2;

/// Appends the encoded `KVEventBatch(ts, events, data_parallel_rank)` to `out`.
///
/// ```
/// use kvblocks::events::{encode_batch_into, WireFormat};
/// use kvblocks::events::event::KvCacheEvent;
/// let mut out = Vec::new();
/// encode_batch_into(&mut out, 1.0, &[KvCacheEvent::AllBlocksCleared], None, WireFormat::Map);
/// assert_eq!(&out[..10], b"\x93\xcb\x3f\xf0\0\0\0\0\0\0");
/// assert_eq!(&out[10..], b"\x91\x81\xa4type\xb0AllBlocksCleared\xc0");
/// ```
pub fn encode_batch_into(
    out: &mut Vec<u8>,
    ts: f64,
    events: &[KvCacheEvent],
    data_parallel_rank: Option<i64>,
    format: WireFormat,
) {
    let mut w = MsgpackWriter::new(out);
    w.array_len(3);
    w.f64(ts);
    w.array_len(events.len());
    for event in events {
        write_event(&mut w, event, format);
    }
    w.opt(data_parallel_rank, MsgpackWriter::int);
}

/// The encoded `KVEventBatch(ts, events, data_parallel_rank)` as a new buffer.
pub fn encode_batch(
    ts: f64,
    events: &[KvCacheEvent],
    data_parallel_rank: Option<i64>,
    format: WireFormat,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 32 * events.len());
    encode_batch_into(&mut out, ts, events, data_parallel_rank, format);
    out
}

fn write_event(w: &mut MsgpackWriter<'_>, event: &KvCacheEvent, format: WireFormat) {
    match event {
        KvCacheEvent::BlockStored(e) => write_stored(w, e, format),
        KvCacheEvent::BlockRemoved(e) => write_removed(w, e, format),
        KvCacheEvent::AllBlocksCleared => {
            begin(w, format, |w| w.map_len(1), 1, "AllBlocksCleared");
        }
    }
}

/// Writes an event's head: the map form's header (`map_header`) and `type` key, or the
/// array form's length; then the tag.
fn begin(
    w: &mut MsgpackWriter<'_>,
    format: WireFormat,
    map_header: impl FnOnce(&mut MsgpackWriter<'_>),
    array_len: usize,
    tag: &str,
) {
    match format {
        WireFormat::Map => {
            map_header(w);
            w.str("type");
        }
        WireFormat::Array => w.array_len(array_len),
    }
    w.str(tag);
}

/// Writes the array form's trailing `None` fields (the map form omits them).
fn end(w: &mut MsgpackWriter<'_>, format: WireFormat, trailing_none: usize) {
    if format == WireFormat::Array {
        for _ in 0..trailing_none {
            w.nil();
        }
    }
}

/// Writes one field: its key first in the map form.
#[inline]
fn key(w: &mut MsgpackWriter<'_>, format: WireFormat, name: &str) {
    if format == WireFormat::Map {
        w.str(name);
    }
}

fn write_stored(w: &mut MsgpackWriter<'_>, e: &BlockStored, format: WireFormat) {
    // Map form: type + 7 fields without defaults + group_idx (never None in kvblocks). The
    // struct has 16 entries with the tag, so msgspec always writes a map16 header.
    let map_len = 9
        + u16::from(e.extra_keys.is_some())
        + u16::from(e.kv_cache_spec_kind.is_some())
        + u16::from(e.kv_cache_spec_sliding_window.is_some())
        + u16::from(e.locality.is_some())
        + u16::from(e.ownership.is_some())
        + u16::from(e.session_id.is_some())
        + u16::from(e.lookahead_token_ids.is_some());
    let array_len = 16;
    begin(
        w,
        format,
        |w| w.map16_len(map_len),
        array_len,
        "BlockStored",
    );
    key(w, format, "block_hashes");
    w.uint_array(&e.block_hashes);
    key(w, format, "parent_block_hash");
    w.opt(e.parent_block_hash, MsgpackWriter::uint);
    key(w, format, "token_ids");
    w.uint_array(&e.token_ids);
    key(w, format, "block_size");
    w.uint(e.block_size.into());
    key(w, format, "lora_id");
    w.opt(e.lora_id, MsgpackWriter::int);
    key(w, format, "medium");
    w.str(e.medium);
    key(w, format, "lora_name");
    w.opt(e.lora_name.as_deref(), MsgpackWriter::str);
    if format == WireFormat::Array || e.extra_keys.is_some() {
        key(w, format, "extra_keys");
        w.opt(e.extra_keys.as_deref(), |w, per_block| {
            w.array_len(per_block.len());
            for keys in per_block {
                w.opt(keys.as_deref(), |w, items| {
                    w.array_len(items.len());
                    for item in items {
                        w.key_value(item);
                    }
                });
            }
        });
    }
    key(w, format, "group_idx");
    w.uint(e.group_idx.into());
    if format == WireFormat::Array || e.kv_cache_spec_kind.is_some() {
        key(w, format, "kv_cache_spec_kind");
        w.opt(e.kv_cache_spec_kind, MsgpackWriter::str);
    }
    if format == WireFormat::Array || e.kv_cache_spec_sliding_window.is_some() {
        key(w, format, "kv_cache_spec_sliding_window");
        w.opt(e.kv_cache_spec_sliding_window, |w, v| w.uint(v.into()));
    }
    for (name, value) in [
        ("locality", &e.locality),
        ("ownership", &e.ownership),
        ("session_id", &e.session_id),
    ] {
        if format == WireFormat::Array || value.is_some() {
            key(w, format, name);
            w.opt(value.as_deref(), MsgpackWriter::str);
        }
    }
    if format == WireFormat::Array || e.lookahead_token_ids.is_some() {
        key(w, format, "lookahead_token_ids");
        w.opt(e.lookahead_token_ids.as_deref(), |w, per_block| {
            w.array_len(per_block.len());
            for tokens in per_block {
                w.uint_array(tokens);
            }
        });
    }
}

fn write_removed(w: &mut MsgpackWriter<'_>, e: &BlockRemoved, format: WireFormat) {
    begin(
        w,
        format,
        |w| w.map_len(4),
        4 + REMOVED_TRAILING_NONE,
        "BlockRemoved",
    );
    key(w, format, "block_hashes");
    w.uint_array(&e.block_hashes);
    key(w, format, "medium");
    w.str(e.medium);
    key(w, format, "group_idx");
    w.uint(e.group_idx.into());
    end(w, format, REMOVED_TRAILING_NONE);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::event::MEDIUM_GPU;
    use crate::types::KeyValue;

    fn stored() -> BlockStored {
        BlockStored {
            block_hashes: vec![1, u64::MAX],
            parent_block_hash: None,
            token_ids: vec![1, 2, 3],
            block_size: 16,
            lora_id: None,
            medium: MEDIUM_GPU,
            lora_name: None,
            extra_keys: Some(vec![
                None,
                Some(vec![
                    KeyValue::Str("a".into()),
                    KeyValue::Tuple(vec![KeyValue::Str("mm".into()), KeyValue::Int(3)]),
                ]),
            ]),
            group_idx: 0,
            kv_cache_spec_kind: None,
            kv_cache_spec_sliding_window: None,
            locality: None,
            ownership: None,
            session_id: None,
            lookahead_token_ids: None,
        }
    }

    fn removed() -> BlockRemoved {
        BlockRemoved {
            block_hashes: vec![5],
            medium: MEDIUM_GPU,
            group_idx: 0,
        }
    }

    // Bytes printed by msgspec 0.22 for vLLM 0.33.0's KVEventBatch of the same events.
    #[test]
    fn map_form_matches_msgspec() {
        let events = [
            KvCacheEvent::BlockStored(Box::new(stored())),
            KvCacheEvent::BlockRemoved(removed()),
            KvCacheEvent::AllBlocksCleared,
        ];
        let got = encode_batch(1.0, &events, None, WireFormat::Map);
        let want: &[u8] = b"\x93\xcb?\xf0\x00\x00\x00\x00\x00\x00\x93\xde\x00\n\xa4type\
\xabBlockStored\xacblock_hashes\x92\x01\xcf\xff\xff\xff\xff\xff\xff\xff\xff\xb1parent_block_hash\
\xc0\xa9token_ids\x93\x01\x02\x03\xaablock_size\x10\xa7lora_id\xc0\xa6medium\xa3GPU\xa9lora_name\
\xc0\xaaextra_keys\x92\xc0\x92\xa1a\x92\xa2mm\x03\xa9group_idx\x00\x84\xa4type\xacBlockRemoved\
\xacblock_hashes\x91\x05\xa6medium\xa3GPU\xa9group_idx\x00\x81\xa4type\xb0AllBlocksCleared\xc0";
        assert_eq!(got, want);
    }

    #[test]
    fn array_form_keeps_every_field() {
        let got = encode_batch(
            1.0,
            &[KvCacheEvent::BlockRemoved(removed())],
            Some(2),
            WireFormat::Array,
        );
        assert_eq!(
            &got[10..],
            b"\x91\x96\xacBlockRemoved\x91\x05\xa3GPU\x00\xc0\xc0\x02"
        );
        let got = encode_batch(
            1.0,
            &[KvCacheEvent::BlockStored(Box::new(stored()))],
            None,
            WireFormat::Array,
        );
        assert_eq!(&got[10..16], b"\x91\xdc\x00\x10\xabB");
        assert!(got.ends_with(b"\x00\xc0\xc0\xc0\xc0\xc0\xc0\xc0"));
    }

    #[test]
    fn map_form_includes_set_optional_fields() {
        let mut e = stored();
        e.extra_keys = None;
        e.kv_cache_spec_kind = Some("sliding_window");
        e.kv_cache_spec_sliding_window = Some(128);
        e.lora_id = Some(-3);
        let got = encode_batch(
            0.0,
            &[KvCacheEvent::BlockStored(Box::new(e))],
            None,
            WireFormat::Map,
        );
        // type + 7 + group_idx + kind + window = 11 entries, in a map16 header
        assert_eq!(got[11..14], [0xde, 0, 11]);
        let tail: &[u8] = b"\xa9group_idx\x00\xb2kv_cache_spec_kind\xaesliding_window\
\xbckv_cache_spec_sliding_window\xcc\x80\xc0";
        assert!(got.ends_with(tail));
        assert!(got.windows(9).any(|s| s == b"lora_id\xfd\xa6"));
    }

    // Bytes printed by msgspec 0.22 for vLLM 0.33.0's `BlockStored` with its last four
    // fields set (an offloading tier's locality and ownership, a session, lookahead).
    #[test]
    fn map_form_writes_session_tier_and_lookahead() {
        let e = BlockStored {
            block_hashes: vec![1],
            token_ids: vec![1, 2],
            block_size: 2,
            extra_keys: None,
            locality: Some("LOCAL".into()),
            ownership: Some("kvcr".into()),
            session_id: Some("s1".into()),
            lookahead_token_ids: Some(vec![vec![3, 70000]]),
            ..stored()
        };
        let got = encode_batch(
            0.0,
            &[KvCacheEvent::BlockStored(Box::new(e.clone()))],
            None,
            WireFormat::Map,
        );
        let want: &[u8] = b"\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x91\xde\x00\r\xa4type\
\xabBlockStored\xacblock_hashes\x91\x01\xb1parent_block_hash\xc0\xa9token_ids\x92\x01\x02\
\xaablock_size\x02\xa7lora_id\xc0\xa6medium\xa3GPU\xa9lora_name\xc0\xa9group_idx\x00\
\xa8locality\xa5LOCAL\xa9ownership\xa4kvcr\xaasession_id\xa2s1\xb3lookahead_token_ids\x91\
\x92\x03\xce\x00\x01\x11p\xc0";
        assert_eq!(got, want);
        let got = encode_batch(
            0.0,
            &[KvCacheEvent::BlockStored(Box::new(e))],
            None,
            WireFormat::Array,
        );
        assert!(got.ends_with(b"\xa5LOCAL\xa4kvcr\xa2s1\x91\x92\x03\xce\x00\x01\x11p\xc0"));
    }

    #[test]
    fn format_names() {
        assert_eq!(WireFormat::parse("map"), Some(WireFormat::Map));
        assert_eq!(WireFormat::parse("array"), Some(WireFormat::Array));
        assert_eq!(WireFormat::parse("json"), None);
    }
}
