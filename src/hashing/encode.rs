//! The serializer interface shared by the CBOR and pickle encoders, and the one function
//! that lays out vLLM's hash input `(parent, tuple(tokens), extra_keys)` on top of it.

use crate::types::KeyValue;

/// A serializer of the Python values that appear in block-hash inputs.
///
/// Each method appends one value (or the start/end of a tuple) to the encoder's buffer,
/// exactly as vLLM's serializer (cbor2 canonical or CPython pickle protocol 5) writes the
/// corresponding Python object.
pub(crate) trait Encoder {
    /// Clears the buffer and writes the stream header, if any.
    fn begin(&mut self);
    /// Writes the stream trailer, if any, and returns the finished bytes.
    fn finish(&mut self) -> &[u8];
    /// Python `None`.
    fn none(&mut self);
    /// Python `bool`.
    fn boolean(&mut self, v: bool);
    /// Python `int`.
    fn int(&mut self, v: i64);
    /// Python `str`.
    fn str(&mut self, s: &str);
    /// Python `str` that is one object with every other `str` written with the same `obj`
    /// in this stream (`None`: an object of its own). Only pickle tells them apart: it
    /// memoizes by identity and writes a repeated object as a memo reference.
    fn str_obj(&mut self, s: &str, obj: Option<u32>) {
        let _ = obj;
        self.str(s);
    }
    /// Python `bytes`.
    fn bytes(&mut self, b: &[u8]);
    /// Starts a tuple of `n` items; the items follow, then [`Encoder::tuple_end`].
    fn tuple_begin(&mut self, n: usize);
    /// Ends a tuple of `n` items.
    fn tuple_end(&mut self, n: usize);
    /// `tuple(tokens)`: a tuple of non-negative ints (the hot path).
    fn tokens(&mut self, tokens: &[u32]);
}

/// A source of a block's extra keys: the tuple's length, then its items.
pub(crate) trait ExtraKeys {
    /// Number of items in the extra-keys tuple.
    fn count(&self) -> usize;
    /// Writes the items (not the enclosing tuple).
    fn write_items<E: Encoder>(&self, e: &mut E);
}

impl ExtraKeys for [KeyValue] {
    fn count(&self) -> usize {
        self.len()
    }

    fn write_items<E: Encoder>(&self, e: &mut E) {
        for v in self {
            write_value(e, v);
        }
    }
}

/// vLLM's lookahead extra keys `(E, *next_tokens)`: the block's own keys `E` (`None` when
/// it has none) followed by the `num_hash_lookahead_tokens` tokens after the block.
pub(crate) struct LookaheadKeys<'k, K: ?Sized, T> {
    /// `E`, the keys of the block and its lookahead tokens.
    pub(crate) keys: Option<&'k K>,
    /// The tokens after the block.
    pub(crate) tokens: &'k [T],
}

impl<K: ExtraKeys + ?Sized, T: Token> ExtraKeys for LookaheadKeys<'_, K, T> {
    fn count(&self) -> usize {
        1 + self.tokens.len()
    }

    fn write_items<E: Encoder>(&self, e: &mut E) {
        write_optional_keys(e, self.keys);
        for &t in self.tokens {
            e.int(t.to_i64());
        }
    }
}

/// Writes one value tree.
pub(crate) fn write_value<E: Encoder>(e: &mut E, v: &KeyValue) {
    match v {
        KeyValue::None => e.none(),
        KeyValue::Bool(b) => e.boolean(*b),
        KeyValue::Int(i) => e.int(*i),
        KeyValue::Str(s) => e.str(s),
        KeyValue::Bytes(b) => e.bytes(b),
        KeyValue::Tuple(items) => {
            e.tuple_begin(items.len());
            for item in items {
                write_value(e, item);
            }
            e.tuple_end(items.len());
        }
    }
}

/// A token id as a block-hash input holds it: `u32` (every real token id; the encoders'
/// fast path) or `i64` (any Python int that fits, such as the `-1` placeholders of vLLM's
/// own tests, written one int at a time).
pub(crate) trait Token: Copy + Send + Sync {
    /// Writes `tuple(block)`.
    fn write_tuple<E: Encoder>(e: &mut E, block: &[Self]);
    /// The Python int.
    fn to_i64(self) -> i64;
    /// The block as `u32`s, when it is (the single-pass pickle path).
    fn as_u32s(block: &[Self]) -> Option<&[u32]>;
}

impl Token for u32 {
    fn write_tuple<E: Encoder>(e: &mut E, block: &[Self]) {
        e.tokens(block);
    }

    fn to_i64(self) -> i64 {
        i64::from(self)
    }

    fn as_u32s(block: &[Self]) -> Option<&[u32]> {
        Some(block)
    }
}

impl Token for i64 {
    fn write_tuple<E: Encoder>(e: &mut E, block: &[Self]) {
        e.tuple_begin(block.len());
        for &t in block {
            e.int(t);
        }
        e.tuple_end(block.len());
    }

    fn to_i64(self) -> i64 {
        self
    }

    fn as_u32s(_: &[Self]) -> Option<&[u32]> {
        None
    }
}

/// Writes extra keys as a tuple of their items, or `None` when there are none.
#[inline]
fn write_optional_keys<E: Encoder, K: ExtraKeys + ?Sized>(e: &mut E, keys: Option<&K>) {
    match keys {
        None => e.none(),
        Some(keys) => {
            let n = keys.count();
            e.tuple_begin(n);
            keys.write_items(e);
            e.tuple_end(n);
        }
    }
}

/// Serializes `(parent, tuple(tokens), extra_keys)` (extra keys `None` when absent) and
/// returns the bytes vLLM's hash function would digest.
pub(crate) fn encode_block<'e, E: Encoder, K: ExtraKeys + ?Sized>(
    e: &'e mut E,
    parent: &[u8],
    tokens: &[impl Token],
    extra_keys: Option<&K>,
) -> &'e [u8] {
    e.begin();
    e.tuple_begin(3);
    e.bytes(parent);
    Token::write_tuple(e, tokens);
    write_optional_keys(e, extra_keys);
    e.tuple_end(3);
    e.finish()
}

/// Serializes a lone string (the NONE_HASH seed).
pub(crate) fn encode_str<'e, E: Encoder>(e: &'e mut E, s: &str) -> &'e [u8] {
    e.begin();
    e.str(s);
    e.finish()
}
