//! Extra keys per block (vLLM 0.33 `generate_block_hash_extra_keys`) and their untagged
//! event form (`to_event_extra_keys`).
//!
//! Order and shapes (tagged, as hashed): `("lora", name, path)` on every block of a LoRA
//! request, then `("mm", identifier, offset - start)` per overlapping multimodal feature,
//! then `("cache_salt", salt)` on the block starting at token 0 (non-empty salt only), then
//! `("prompt_embeds", sha256(embeds of the block))`. No keys at all is `None`, not `()`.

use std::ops::Range;

use sha2::{Digest, Sha256};

use super::encode::{Encoder, ExtraKeys};
use crate::error::{KvError, Result};
use crate::types::KeyValue;

/// A LoRA adapter, as the fields of vLLM's `LoRARequest` that hashing and events use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraRequest {
    /// `lora_name` (hashed, and published in events).
    pub name: String,
    /// `lora_path` (hashed; vLLM's default is `""`).
    pub path: String,
    /// `lora_int_id` (the event's `lora_id`), >= 1, if known.
    pub id: Option<u32>,
}

impl LoraRequest {
    /// Validates as vLLM's `LoRARequest.__post_init__`: id >= 1, non-empty path.
    pub fn new(name: String, path: String, id: u32) -> Result<Self> {
        if id < 1 {
            return Err(KvError::InvalidArgument(format!(
                "lora_id must be > 0, got {id}"
            )));
        }
        if path.is_empty() {
            return Err(KvError::InvalidArgument(
                "lora_path cannot be empty".to_owned(),
            ));
        }
        Ok(Self {
            name,
            path,
            id: Some(id),
        })
    }

    /// A LoRA adapter from optional parts: all absent is no adapter. A name alone is an
    /// adapter with vLLM's default path `""` (hashed as `("lora", name, "")`, as vLLM's
    /// extra key is) and no id (events publish `lora_id` None); a path or an id needs a
    /// name, and an id must be >= 1.
    pub fn from_parts(
        name: Option<String>,
        path: Option<String>,
        id: Option<i64>,
    ) -> Result<Option<Self>> {
        let Some(name) = name else {
            if path.is_none() && id.is_none() {
                return Ok(None);
            }
            return Err(KvError::InvalidArgument(
                "a LoRA request needs lora_name (lora_path and lora_id are optional)".to_owned(),
            ));
        };
        let id = id
            .map(|id| match u32::try_from(id) {
                Ok(id) if id >= 1 => Ok(id),
                _ => Err(KvError::InvalidArgument(format!(
                    "lora_id must be in 1..=2**32-1, got {id}"
                ))),
            })
            .transpose()?;
        Ok(Some(Self {
            name,
            path: path.unwrap_or_default(),
            id,
        }))
    }
}

/// One multimodal item of a prompt: its cache identifier and placeholder token range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmFeature {
    /// `MultiModalFeatureSpec.identifier`.
    pub identifier: String,
    /// `mm_position.offset`: first placeholder token.
    pub offset: usize,
    /// `mm_position.length`: number of placeholder tokens (>= 1).
    pub length: usize,
}

impl MmFeature {
    /// One past the last placeholder token.
    pub fn end(&self) -> usize {
        self.offset + self.length
    }

    /// Checks what vLLM assumes of a request's features: each has length >= 1, and they
    /// are sorted by offset and do not overlap. A placeholder may end past the prompt
    /// (encoder-decoder models: vLLM accepts it, and only full blocks are keyed).
    pub fn validate_all(features: &[MmFeature]) -> Result<()> {
        let mut prev_end = 0;
        for (i, f) in features.iter().enumerate() {
            let bad = |why: &str| {
                Err(KvError::InvalidArgument(format!(
                    "mm_features[{i}] ({:?}, offset {}, length {}): {why}",
                    f.identifier, f.offset, f.length
                )))
            };
            if f.length == 0 {
                return bad("length must be >= 1");
            }
            let Some(end) = f.offset.checked_add(f.length) else {
                return bad("offset + length overflows");
            };
            if f.offset < prev_end {
                return bad("features must be sorted by offset and must not overlap");
            }
            prev_end = end;
        }
        Ok(())
    }
}

/// Prompt embeddings given instead of (or with) token ids: `bytes_per_token` raw bytes
/// per prompt position, as `tensor_data(prompt_embeds)` lays them out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptEmbeds {
    /// Row-major embeddings, `bytes_per_token` bytes per prompt token.
    pub data: Vec<u8>,
    /// Bytes of one token's embedding (hidden size times element size), >= 1.
    pub bytes_per_token: usize,
}

impl PromptEmbeds {
    /// `sha256(tensor_data(prompt_embeds[start:end]))`; the slice is clipped to the prompt
    /// as Python slicing is.
    pub fn block_digest(&self, start: usize, end: usize) -> [u8; 32] {
        self.as_view().block_digest(start, end)
    }

    /// The embeddings, borrowed.
    pub fn as_view(&self) -> PromptEmbedsView<'_> {
        PromptEmbedsView {
            data: &self.data,
            bytes_per_token: self.bytes_per_token,
            first_row: 0,
        }
    }
}

/// Rows of prompt embeddings borrowed from their owner (a [`PromptEmbeds`], or the rows a
/// binding copied out of a tensor): `bytes_per_token` raw bytes per prompt position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptEmbedsView<'a> {
    /// Row-major embeddings of rows `first_row..`, `bytes_per_token` bytes per row; the
    /// rows end where the prompt does, or past every row a digest is asked for.
    pub data: &'a [u8],
    /// Bytes of one token's embedding.
    pub bytes_per_token: usize,
    /// The prompt position of the first row of `data` (no digest starts before it).
    pub first_row: usize,
}

impl PromptEmbedsView<'_> {
    /// `sha256(tensor_data(prompt_embeds[start:end]))`; the slice is clipped to the rows
    /// held, as Python slicing clips to the prompt.
    pub fn block_digest(&self, start: usize, end: usize) -> [u8; 32] {
        let n = self.data.len();
        let row = |i: usize| {
            i.saturating_sub(self.first_row)
                .saturating_mul(self.bytes_per_token)
                .min(n)
        };
        let (lo, hi) = (row(start), row(end));
        Sha256::digest(&self.data[lo..hi.max(lo)]).into()
    }
}

/// Which of a request's key strings are one Python object: a number per string, equal
/// numbers for one object. Pickle (vLLM's `sha256` and `xxhash`) writes an object repeated
/// within a block as a memo reference, so a LoRA whose name object is its path object, or
/// one identifier object shared by two multimodal items of a block, hashes differently
/// from equal but distinct strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StrObjects {
    /// The LoRA adapter's name.
    pub lora_name: u32,
    /// The LoRA adapter's path.
    pub lora_path: u32,
    /// The cache salt.
    pub cache_salt: u32,
    /// Each multimodal feature's identifier, by feature index.
    pub mm: Vec<u32>,
}

/// Where a request's extra keys come from (borrowed from the request).
#[derive(Clone, Copy, Default)]
pub(crate) struct KeySources<'a> {
    /// The request's LoRA adapter.
    pub lora: Option<&'a LoraRequest>,
    /// Validated multimodal features.
    pub mm_features: &'a [MmFeature],
    /// `cache_salt` (an empty salt adds no key).
    pub cache_salt: Option<&'a str>,
    /// Prompt embeddings.
    pub prompt_embeds: Option<PromptEmbedsView<'a>>,
    /// Which key strings are one object (None: each is its own).
    pub objs: Option<&'a StrObjects>,
}

/// One block's extra keys, borrowed from the request (nothing allocated).
pub(crate) struct BlockKeys<'a> {
    lora: Option<&'a LoraRequest>,
    /// The features overlapping the block, in order.
    mm: &'a [MmFeature],
    /// The index of `mm[0]` among the request's features.
    mm_first: usize,
    objs: Option<&'a StrObjects>,
    /// The block's first token (mm offsets are relative to it).
    start: usize,
    salt: Option<&'a str>,
    embeds: Option<[u8; 32]>,
}

impl<'a> KeySources<'a> {
    /// True when no block can have extra keys (plain text request).
    pub(crate) fn is_empty(&self) -> bool {
        self.lora.is_none()
            && self.mm_features.is_empty()
            && self.cache_salt.is_none_or(str::is_empty)
            && self.prompt_embeds.is_none()
    }

    /// `generate_block_hash_extra_keys(request, start, end, mm_idx)`: the keys of block
    /// `[start, end)` (None when there are none) and the next multimodal index.
    pub(crate) fn block_keys(
        &self,
        start: usize,
        end: usize,
        mm_idx: usize,
    ) -> (Option<BlockKeys<'a>>, usize) {
        let (mm, next) = mm_scan(self.mm_features, start, end, mm_idx);
        let keys = BlockKeys {
            lora: self.lora,
            mm_first: mm.start,
            mm: &self.mm_features[mm],
            objs: self.objs,
            start,
            salt: self.cache_salt.filter(|s| start == 0 && !s.is_empty()),
            embeds: self.prompt_embeds.map(|p| p.block_digest(start, end)),
        };
        let any = keys.count() > 0;
        (any.then_some(keys), next)
    }
}

/// vLLM's `_gen_mm_extra_hash_keys` scan over features sorted by offset: the range of
/// features that overlap `[start, end)` and the index to resume from for the next block.
pub(crate) fn mm_scan(
    features: &[MmFeature],
    start: usize,
    end: usize,
    start_idx: usize,
) -> (Range<usize>, usize) {
    match features.last() {
        Some(last) if last.end() > start => {}
        _ => return (0..0, start_idx),
    }
    let mut idx = start_idx;
    let mut first: Option<usize> = None;
    let mut stop = start_idx;
    while let Some(f) = features.get(idx) {
        if end <= f.offset {
            break;
        }
        if start >= f.end() {
            idx += 1;
            continue;
        }
        first.get_or_insert(idx);
        stop = idx + 1;
        if end >= f.end() {
            idx += 1;
        } else {
            break;
        }
    }
    // NOTE 1: with validated (sorted, non-overlapping) features the overlapping ones are
    // contiguous, so a range describes them.
    (first.map_or(0..0, |f| f..stop), idx)
}

/// vLLM's `get_mm_features_in_window(...)[0]`: the first feature ending after `start`,
/// where the request hasher resumes its scan.
pub(crate) fn mm_resume_index(features: &[MmFeature], start: usize) -> usize {
    features.partition_point(|f| f.end() <= start)
}

const LORA: &str = "lora";
const MM: &str = "mm";
const CACHE_SALT: &str = "cache_salt";
const PROMPT_EMBEDS: &str = "prompt_embeds";

impl BlockKeys<'_> {
    fn mm_offset(&self, f: &MmFeature) -> i64 {
        f.offset as i64 - self.start as i64
    }

    /// The tagged keys, as hashed.
    pub(crate) fn to_tagged(&self) -> Vec<KeyValue> {
        let s = |x: &str| KeyValue::Str(x.to_owned());
        let mut out = Vec::with_capacity(self.count());
        if let Some(l) = self.lora {
            out.push(KeyValue::Tuple(vec![s(LORA), s(&l.name), s(&l.path)]));
        }
        for f in self.mm {
            out.push(KeyValue::Tuple(vec![
                s(MM),
                s(&f.identifier),
                KeyValue::Int(self.mm_offset(f)),
            ]));
        }
        if let Some(salt) = self.salt {
            out.push(KeyValue::Tuple(vec![s(CACHE_SALT), s(salt)]));
        }
        if let Some(d) = self.embeds {
            out.push(KeyValue::Tuple(vec![
                s(PROMPT_EMBEDS),
                KeyValue::Bytes(d.to_vec()),
            ]));
        }
        out
    }
}

impl ExtraKeys for BlockKeys<'_> {
    fn count(&self) -> usize {
        usize::from(self.lora.is_some())
            + self.mm.len()
            + usize::from(self.salt.is_some())
            + usize::from(self.embeds.is_some())
    }

    fn write_items<E: Encoder>(&self, e: &mut E) {
        let objs = self.objs;
        if let Some(l) = self.lora {
            e.tuple_begin(3);
            e.str(LORA);
            e.str_obj(&l.name, objs.map(|o| o.lora_name));
            e.str_obj(&l.path, objs.map(|o| o.lora_path));
            e.tuple_end(3);
        }
        for (i, f) in self.mm.iter().enumerate() {
            e.tuple_begin(3);
            e.str(MM);
            let obj = objs.and_then(|o| o.mm.get(self.mm_first + i).copied());
            e.str_obj(&f.identifier, obj);
            e.int(self.mm_offset(f));
            e.tuple_end(3);
        }
        if let Some(salt) = self.salt {
            e.tuple_begin(2);
            e.str(CACHE_SALT);
            e.str_obj(salt, objs.map(|o| o.cache_salt));
            e.tuple_end(2);
        }
        if let Some(d) = &self.embeds {
            e.tuple_begin(2);
            e.str(PROMPT_EMBEDS);
            e.bytes(d);
            e.tuple_end(2);
        }
    }
}

/// vLLM's `to_event_extra_keys` for one block: tagged keys to the untagged shapes that
/// KV events publish (`("mm", id, off)` -> `(id, off)`, any other `(tag, v)` -> `v`).
pub fn to_event_extra_keys(tagged: &[KeyValue]) -> Result<Vec<KeyValue>> {
    tagged
        .iter()
        .map(|key| match key {
            KeyValue::Tuple(items) if items.len() >= 2 => {
                if items[0] == KeyValue::Str(MM.to_owned()) {
                    Ok(KeyValue::Tuple(items[1..].to_vec()))
                } else {
                    Ok(items[1].clone())
                }
            }
            other => Err(KvError::InvalidArgument(format!(
                "an extra key must be a (tag, value, ...) tuple, got {other:?}"
            ))),
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A multimodal feature (shared with the chain's tests).
    pub(crate) fn feat(id: &str, offset: usize, length: usize) -> MmFeature {
        MmFeature {
            identifier: id.to_owned(),
            offset,
            length,
        }
    }

    fn s(x: &str) -> KeyValue {
        KeyValue::Str(x.to_owned())
    }

    /// Worked examples, checked against vLLM 0.33.0 (features hash1@[0,5), hash2@[10,15),
    /// LoRA L,/p, salt s).
    #[test]
    fn reference_examples() {
        let feats = [feat("hash1", 0, 5), feat("hash2", 10, 5)];
        let lora = LoraRequest::new("L".into(), "/p".into(), 1).unwrap();
        let src = KeySources {
            lora: Some(&lora),
            mm_features: &feats,
            cache_salt: Some("s"),
            ..KeySources::default()
        };
        let lora_key = KeyValue::Tuple(vec![s("lora"), s("L"), s("/p")]);
        let mm = |id: &str, off: i64| KeyValue::Tuple(vec![s("mm"), s(id), KeyValue::Int(off)]);
        let salt = KeyValue::Tuple(vec![s("cache_salt"), s("s")]);
        let keys = |a, b| src.block_keys(a, b, 0).0.unwrap().to_tagged();
        assert_eq!(
            keys(0, 5),
            vec![lora_key.clone(), mm("hash1", 0), salt.clone()]
        );
        assert_eq!(keys(3, 8), vec![lora_key.clone(), mm("hash1", -3)]);
        assert_eq!(keys(6, 10), vec![lora_key.clone()]);
        assert_eq!(
            keys(0, 15),
            vec![lora_key, mm("hash1", 0), mm("hash2", 10), salt]
        );
    }

    #[test]
    fn no_keys_is_none_and_scan_resumes() {
        let feats = [feat("a", 4, 8)];
        let src = KeySources {
            lora: None,
            mm_features: &feats,
            cache_salt: Some(""),
            ..KeySources::default()
        };
        assert!(src.block_keys(0, 4, 0).0.is_none());
        // Block [8,12) ends the feature: the next block resumes past it.
        let (k, next) = src.block_keys(8, 12, 0);
        assert_eq!(k.unwrap().count(), 1);
        assert_eq!(next, 1);
        assert_eq!(mm_resume_index(&feats, 11), 0);
        assert_eq!(mm_resume_index(&feats, 12), 1);
    }

    #[test]
    fn lora_parts() {
        assert_eq!(LoraRequest::from_parts(None, None, None), Ok(None));
        assert!(LoraRequest::from_parts(None, Some("/p".into()), None).is_err());
        assert!(LoraRequest::from_parts(None, None, Some(1)).is_err());
        assert!(LoraRequest::from_parts(Some("a".into()), Some("/p".into()), Some(0)).is_err());
        let l = LoraRequest::from_parts(Some("a".into()), Some("/p".into()), Some(7)).unwrap();
        assert_eq!(l.unwrap().id, Some(7));
        let by_name = LoraRequest::from_parts(Some("a".into()), None, None)
            .unwrap()
            .unwrap();
        assert_eq!((by_name.path.as_str(), by_name.id), ("", None));
    }

    #[test]
    fn validation_rejects_bad_features() {
        assert!(MmFeature::validate_all(&[feat("a", 0, 0)]).is_err());
        assert!(MmFeature::validate_all(&[feat("a", 5, 2), feat("b", 0, 2)]).is_err());
        assert!(MmFeature::validate_all(&[feat("a", 0, 3), feat("b", 2, 2)]).is_err());
        assert!(MmFeature::validate_all(&[feat("a", 0, 3), feat("b", 3, 7)]).is_ok());
        // Past the prompt, as vLLM allows for encoder-decoder models.
        assert!(MmFeature::validate_all(&[feat("a", 8, 300)]).is_ok());
    }

    #[test]
    fn event_form_is_untagged() {
        let tagged = vec![
            KeyValue::Tuple(vec![s("lora"), s("L"), s("/p")]),
            KeyValue::Tuple(vec![s("mm"), s("h"), KeyValue::Int(-3)]),
            KeyValue::Tuple(vec![s("cache_salt"), s("x")]),
            KeyValue::Tuple(vec![s("prompt_embeds"), KeyValue::Bytes(vec![1, 2])]),
        ];
        assert_eq!(
            to_event_extra_keys(&tagged).unwrap(),
            vec![
                s("L"),
                KeyValue::Tuple(vec![s("h"), KeyValue::Int(-3)]),
                s("x"),
                KeyValue::Bytes(vec![1, 2]),
            ]
        );
        assert!(to_event_extra_keys(&[KeyValue::Int(1)]).is_err());
    }

    #[test]
    fn embeds_digest_is_clipped_to_the_prompt() {
        let pe = PromptEmbeds {
            data: (0..12).collect(),
            bytes_per_token: 4,
        };
        let want: [u8; 32] = Sha256::digest([8u8, 9, 10, 11]).into();
        assert_eq!(pe.block_digest(2, 4), want);
        let empty: [u8; 32] = Sha256::digest([]).into();
        assert_eq!(pe.block_digest(4, 6), empty);
        // A view of rows 1.. digests the same rows by their prompt positions.
        let tail = PromptEmbedsView {
            data: &pe.data[4..],
            bytes_per_token: 4,
            first_row: 1,
        };
        assert_eq!(tail.block_digest(2, 4), want);
        assert_eq!(tail.block_digest(1, 3), pe.block_digest(1, 3));
        assert_eq!(tail.block_digest(4, 6), empty);
    }
}
