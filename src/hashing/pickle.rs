//! Pickle protocol 5, byte-exact with CPython's C pickler (`pickle.dumps(obj, protocol=5)`)
//! for the value kinds of block-hash inputs.
//!
//! What CPython writes, and this encoder with it:
//! * `PROTO 5`, then the body in frames: a frame is opened by the first write after
//!   `PROTO` (or after a committed frame), and committed (a) at the start of saving any
//!   object when it already holds at least 64 KiB, (b) before a `bytes`/`str` payload of
//!   at least 64 KiB, which is written unframed, and (c) after `STOP`. A committed frame
//!   gets its `FRAME <u64 len>` header only when it holds at least 4 bytes.
//! * ints: `K` (0..=255), `M` (256..=65535), `J` (other int32), else `LONG1` (two's
//!   complement, little endian, shortest); `None` is `N`, bools `\x88`/`\x89`.
//! * `str`: `SHORT_BINUNICODE`/`BINUNICODE`, `bytes`: `SHORT_BINBYTES`/`BINBYTES`, each
//!   followed by `MEMOIZE`; tuples: `)` when empty (not memoized), `TUPLE1/2/3` for 1 to 3
//!   items, else `MARK ... TUPLE`, then `MEMOIZE`.
//!
//! NOTE 1 (memo emulation): CPython memoizes by object identity, and a repeated object is
//! written as `BINGET idx`. Rust values carry no identity, so this encoder treats exactly
//! the objects CPython shares as shared: the interned tag literals `"lora"`, `"mm"`,
//! `"cache_salt"`, `"prompt_embeds"`, the empty `str`, one-character `str`s below U+0100,
//! the empty `bytes` and one-byte `bytes` (CPython singletons). Every other value is a
//! distinct object, unless the caller numbers `str` objects (`Encoder::str_obj`: a binding
//! that reads Python objects knows which are one object, e.g. a LoRA whose name is its
//! path, or one identifier string shared by two multimodal items of a block). Known
//! limit: without such numbers, one Python `str` object repeated in a block (an
//! identifier-like literal repeated in user code, say), or one tuple object repeated in
//! one block, pickles differently in CPython.

use super::encode::Encoder;
use super::tokens::{self as token_words, PickleInt, Words};

const PROTO: u8 = 0x80;
const FRAME: u8 = 0x95;
const MEMOIZE: u8 = 0x94;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const TUPLE: u8 = b't';
const EMPTY_TUPLE: u8 = b')';
const TUPLE1: u8 = 0x85;
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
pub(super) const BININT1: u8 = b'K';
pub(super) const BININT2: u8 = b'M';
pub(super) const BININT: u8 = b'J';
pub(super) const LONG1: u8 = 0x8a;
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const BINUNICODE8: u8 = 0x8d;
const SHORT_BINBYTES: u8 = b'C';
const BINBYTES: u8 = b'B';
const BINBYTES8: u8 = 0x8e;
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

/// CPython's `FRAME_SIZE_TARGET`.
const FRAME_SIZE_TARGET: usize = 64 * 1024;
/// CPython's `FRAME_SIZE_MIN`: smaller frames lose their header.
const FRAME_SIZE_MIN: usize = 4;
/// `FRAME` opcode plus its u64 length.
const FRAME_HEADER: usize = 9;
/// An object CPython shares between all its uses (see NOTE 1).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Shared {
    /// One of the interned tag literals, by index into [`TAGS`].
    Tag(u8),
    /// A `str` of length 0 (`u32::MAX`) or one character below U+0100.
    Str(u32),
    /// A `bytes` of length 0 (`u16::MAX`) or one byte.
    Bytes(u16),
    /// A `str` object the caller numbered (see `Encoder::str_obj`).
    Obj(u32),
}

/// The interned tag literals of vLLM's extra keys.
const TAGS: [&str; 4] = ["lora", "mm", "cache_salt", "prompt_embeds"];

fn shared_str(s: &str) -> Option<Shared> {
    if s.is_empty() {
        return Some(Shared::Str(u32::MAX));
    }
    let mut chars = s.chars();
    if let (Some(c), None) = (chars.next(), chars.next()) {
        if (c as u32) < 0x100 {
            return Some(Shared::Str(c as u32));
        }
        return None;
    }
    TAGS.iter()
        .position(|t| *t == s)
        .map(|i| Shared::Tag(i as u8))
}

fn shared_bytes(b: &[u8]) -> Option<Shared> {
    match b {
        [] => Some(Shared::Bytes(u16::MAX)),
        [x] => Some(Shared::Bytes(u16::from(*x))),
        _ => None,
    }
}

/// Pickle encoder writing into caller-owned, reused buffers.
pub(crate) struct Pickle<'b> {
    buf: &'b mut Vec<u8>,
    /// Memo entries of shared objects: (object, memo index).
    memo: &'b mut Vec<(Shared, u32)>,
    /// Number of memo entries so far (the next `MEMOIZE` index).
    memo_len: u32,
    /// Offset of the open frame's header placeholder.
    frame_start: Option<usize>,
}

impl<'b> Pickle<'b> {
    /// An encoder appending to `buf`, with `memo` as scratch (both cleared by `begin`).
    pub(crate) fn new(buf: &'b mut Vec<u8>, memo: &'b mut Vec<(Shared, u32)>) -> Self {
        Self {
            buf,
            memo,
            memo_len: 0,
            frame_start: None,
        }
    }

    /// Makes sure a frame is open (CPython opens one lazily on the first write).
    #[inline]
    fn open_frame(&mut self) {
        if self.frame_start.is_none() {
            self.frame_start = Some(self.buf.len());
            self.buf.extend_from_slice(&[0; FRAME_HEADER]);
        }
    }

    #[inline]
    fn write(&mut self, data: &[u8]) {
        self.open_frame();
        self.buf.extend_from_slice(data);
    }

    fn frame_len(&self) -> usize {
        self.frame_start
            .map_or(0, |s| self.buf.len() - s - FRAME_HEADER)
    }

    fn commit_frame(&mut self) {
        if let Some(start) = self.frame_start.take() {
            let len = self.buf.len() - start - FRAME_HEADER;
            if len >= FRAME_SIZE_MIN {
                self.buf[start] = FRAME;
                self.buf[start + 1..start + FRAME_HEADER]
                    .copy_from_slice(&(len as u64).to_le_bytes());
            } else {
                self.buf.drain(start..start + FRAME_HEADER);
            }
        }
    }

    /// CPython's `_Pickler_OpcodeBoundary`, run at the start of every `save()`.
    #[inline]
    fn save_start(&mut self) {
        if self.frame_len() >= FRAME_SIZE_TARGET {
            self.commit_frame();
        }
    }

    fn memoize(&mut self, shared: Option<Shared>) {
        if let Some(s) = shared {
            self.memo.push((s, self.memo_len));
        }
        self.memo_len += 1;
        self.write(&[MEMOIZE]);
    }

    /// Writes `BINGET` for an already memoized shared object; false if it is not memoized.
    fn memo_get(&mut self, shared: Option<Shared>) -> bool {
        let Some(s) = shared else { return false };
        let Some(&(_, idx)) = self.memo.iter().find(|(k, _)| *k == s) else {
            return false;
        };
        if idx < 256 {
            self.write(&[BINGET, idx as u8]);
        } else {
            let b = idx.to_le_bytes();
            self.write(&[LONG_BINGET, b[0], b[1], b[2], b[3]]);
        }
        true
    }

    /// Writes a `bytes`/`str` opcode and payload; large payloads go unframed.
    fn write_payload(&mut self, short_op: u8, op4: u8, op8: u8, data: &[u8]) {
        let n = data.len();
        let mut head = [0u8; 9];
        let head_len = if n < 256 {
            head[0] = short_op;
            head[1] = n as u8;
            2
        } else if n <= u32::MAX as usize {
            head[0] = op4;
            head[1..5].copy_from_slice(&(n as u32).to_le_bytes());
            5
        } else {
            head[0] = op8;
            head[1..9].copy_from_slice(&(n as u64).to_le_bytes());
            9
        };
        if n >= FRAME_SIZE_TARGET {
            self.commit_frame();
            self.buf.extend_from_slice(&head[..head_len]);
            self.buf.extend_from_slice(data);
        } else {
            self.write(&head[..head_len]);
            self.buf.extend_from_slice(data);
        }
    }

    /// Appends one int opcode for `v` to `out` (no framing logic) and returns its length.
    #[inline(always)]
    fn put_int(out: &mut [u8], v: i64) -> usize {
        if (0..=0xff).contains(&v) {
            out[0] = BININT1;
            out[1] = v as u8;
            2
        } else if (0..=0xffff).contains(&v) {
            out[0] = BININT2;
            out[1..3].copy_from_slice(&(v as u16).to_le_bytes());
            3
        } else if (i64::from(i32::MIN)..=i64::from(i32::MAX)).contains(&v) {
            out[0] = BININT;
            out[1..5].copy_from_slice(&(v as i32).to_le_bytes());
            5
        } else {
            // LONG1: nbytes = bit_length(|v|) / 8 + 1, minus one redundant sign byte.
            let mut le = [0u8; 9];
            le[..8].copy_from_slice(&v.to_le_bytes());
            le[8] = if v < 0 { 0xff } else { 0 };
            let nbits = 64 - v.unsigned_abs().leading_zeros() as usize;
            let mut n = nbits / 8 + 1;
            if v < 0 && n > 1 && le[n - 1] == 0xff && le[n - 2] & 0x80 != 0 {
                n -= 1;
            }
            out[0] = LONG1;
            out[1] = n as u8;
            out[2..2 + n].copy_from_slice(&le[..n]);
            2 + n
        }
    }
}

impl Encoder for Pickle<'_> {
    fn begin(&mut self) {
        self.buf.clear();
        self.memo.clear();
        self.memo_len = 0;
        self.frame_start = None;
        self.buf.extend_from_slice(&[PROTO, 5]);
    }

    fn finish(&mut self) -> &[u8] {
        self.write(&[STOP]);
        self.commit_frame();
        self.buf
    }

    fn none(&mut self) {
        self.save_start();
        self.write(&[NONE]);
    }

    fn boolean(&mut self, v: bool) {
        self.save_start();
        self.write(&[if v { NEWTRUE } else { NEWFALSE }]);
    }

    fn int(&mut self, v: i64) {
        self.save_start();
        let mut tmp = [0u8; 11];
        let n = Self::put_int(&mut tmp, v);
        self.write(&tmp[..n]);
    }

    fn str(&mut self, s: &str) {
        self.str_obj(s, None);
    }

    fn str_obj(&mut self, s: &str, obj: Option<u32>) {
        self.save_start();
        // NOTE 3: a CPython singleton is one object whatever the caller numbered it.
        let shared = shared_str(s).or(obj.map(Shared::Obj));
        if self.memo_get(shared) {
            return;
        }
        self.write_payload(SHORT_BINUNICODE, BINUNICODE, BINUNICODE8, s.as_bytes());
        self.memoize(shared);
    }

    fn bytes(&mut self, b: &[u8]) {
        self.save_start();
        let shared = shared_bytes(b);
        if self.memo_get(shared) {
            return;
        }
        self.write_payload(SHORT_BINBYTES, BINBYTES, BINBYTES8, b);
        self.memoize(shared);
    }

    fn tuple_begin(&mut self, n: usize) {
        self.save_start();
        if n > 3 {
            self.write(&[MARK]);
        }
    }

    fn tuple_end(&mut self, n: usize) {
        match n {
            0 => self.write(&[EMPTY_TUPLE]),
            1..=3 => {
                self.write(&[TUPLE1 + (n as u8 - 1)]);
                self.memoize(None);
            }
            _ => {
                self.write(&[TUPLE]);
                self.memoize(None);
            }
        }
    }

    fn tokens(&mut self, tokens: &[u32]) {
        self.tuple_begin(tokens.len());
        if self.frame_len() + PickleInt::MAX * tokens.len() < FRAME_SIZE_TARGET {
            // No frame boundary can fall inside: write all ints in one go.
            self.open_frame();
            let start = self.buf.len();
            self.buf
                .resize(start + token_words::max_len::<PickleInt>(tokens.len()), 0);
            let n = put_tokens(&mut self.buf[start..], tokens);
            self.buf.truncate(start + n);
        } else {
            for &t in tokens {
                self.int(i64::from(t));
            }
        }
        self.tuple_end(tokens.len());
    }
}

/// Writes the int opcodes of `tokens` at the start of `out`, which holds at least
/// `max_len::<PickleInt>(tokens.len())` bytes, and returns their length.
#[inline]
fn put_tokens(out: &mut [u8], tokens: &[u32]) -> usize {
    assert!(out.len() >= token_words::max_len::<PickleInt>(tokens.len()));
    // SAFETY: `out` is valid for writes of `max_len` bytes (checked just above).
    unsafe { token_words::write::<PickleInt>(out.as_mut_ptr(), tokens) }
}

/// Bytes [`plain_block`] keeps writable past the message (SHA-256 pads in place).
pub(crate) const PLAIN_SLACK: usize = 72;

/// `pickle.dumps((parent, tuple(tokens), None), protocol=5)`, the hash input of a block
/// without extra keys (the hot path of `sha256` and `xxhash`), written to the start of
/// `buf` in one pass: the bytes the generic encoder writes for it, without its framing and
/// memo bookkeeping. Returns the length; `buf` then holds at least [`PLAIN_SLACK`] more
/// bytes. None when the block could reach a frame boundary (the generic encoder splits
/// it) or the parent is not a short `bytes`.
///
/// The layout: `PROTO 5`, `FRAME <len>`, the parent (`SHORT_BINBYTES`, `MEMOIZE`), the
/// tokens (`MARK` ints `TUPLE`, or `TUPLE1..3` for up to 3 items; `MEMOIZE`), `NONE`,
/// `TUPLE3`, `MEMOIZE`, `STOP`; the frame is everything after its header.
pub(crate) fn plain_block(buf: &mut Vec<u8>, parent: &[u8], tokens: &[u32]) -> Option<usize> {
    const HEAD: usize = 2 + FRAME_HEADER;
    let n = tokens.len();
    // Frame: parent, MARK, tokens, TUPLE, MEMOIZE, NONE, TUPLE3, MEMOIZE, STOP.
    let max_frame = 2 + parent.len() + 1 + 1 + PickleInt::MAX * n + 6;
    if n == 0 || parent.len() > 0xff || max_frame >= FRAME_SIZE_TARGET {
        return None;
    }
    let room = HEAD + max_frame + token_words::max_len::<PickleInt>(0) + PLAIN_SLACK;
    if buf.len() < room {
        buf.resize(room, 0);
    }
    let out = &mut buf[..];
    out[..HEAD].copy_from_slice(&[PROTO, 5, FRAME, 0, 0, 0, 0, 0, 0, 0, 0]);
    let mut pos = HEAD;
    out[pos] = SHORT_BINBYTES;
    out[pos + 1] = parent.len() as u8;
    pos += 2;
    out[pos..pos + parent.len()].copy_from_slice(parent);
    pos += parent.len();
    out[pos] = MEMOIZE;
    pos += 1;
    if n > 3 {
        out[pos] = MARK;
        pos += 1;
    }
    pos += put_tokens(&mut out[pos..], tokens);
    out[pos] = if n > 3 { TUPLE } else { TUPLE1 + (n as u8 - 1) };
    out[pos + 1..pos + 6].copy_from_slice(&[MEMOIZE, NONE, TUPLE1 + 2, MEMOIZE, STOP]);
    pos += 6;
    out[3..HEAD].copy_from_slice(&((pos - HEAD) as u64).to_le_bytes());
    Some(pos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::encode::{encode_block, encode_str, write_value};
    use crate::types::KeyValue;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn dumps(v: &KeyValue) -> Vec<u8> {
        let (mut buf, mut memo) = (Vec::new(), Vec::new());
        let mut e = Pickle::new(&mut buf, &mut memo);
        e.begin();
        write_value(&mut e, v);
        e.finish().to_vec()
    }

    fn s(x: &str) -> KeyValue {
        KeyValue::Str(x.into())
    }

    #[test]
    fn numbered_strs_repeat_as_memo_references() {
        // x = "abc"; y = "".join(["ab", "c"]); pickle.dumps((x, y, x), protocol=5)
        let (mut buf, mut memo) = (Vec::new(), Vec::new());
        let mut e = Pickle::new(&mut buf, &mut memo);
        e.begin();
        e.tuple_begin(3);
        e.str_obj("abc", Some(0));
        e.str_obj("abc", Some(1));
        e.str_obj("abc", Some(0));
        e.tuple_end(3);
        assert_eq!(
            hex(e.finish()),
            "80059511000000000000008c03616263948c0361626394680087942e"
        );
        // Unnumbered strs are distinct objects; singletons are shared whatever the number.
        e.begin();
        e.tuple_begin(3);
        e.str_obj("a", Some(5));
        e.str_obj("a", None);
        e.str("abc");
        e.tuple_end(3);
        let single = hex(e.finish());
        e.begin();
        e.tuple_begin(3);
        e.str("a");
        e.str("a");
        e.str("abc");
        e.tuple_end(3);
        assert_eq!(single, hex(e.finish()));
    }

    #[test]
    fn block_layout_matches_the_reference_vector() {
        // pickle.dumps((b'x'*32, (0,1,2,3), None), protocol=5)
        let (mut buf, mut memo) = (Vec::new(), Vec::new());
        let mut e = Pickle::new(&mut buf, &mut memo);
        let out = encode_block::<_, [KeyValue]>(&mut e, &[b'x'; 32], &[0u32, 1, 2, 3], None);
        assert_eq!(
            hex(out),
            format!(
                "80059532000000000000004320{}94284b004b014b024b0374944e87942e",
                "78".repeat(32)
            )
        );
    }

    #[test]
    fn small_frames_lose_their_header() {
        // pickle.dumps('a', protocol=5): frame of 5 bytes keeps its header.
        assert_eq!(hex(&dumps(&s("a"))), "80059505000000000000008c0161942e");
        // pickle.dumps(None, protocol=5): 2 bytes, no header.
        assert_eq!(hex(&dumps(&KeyValue::None)), "80054e2e");
    }

    #[test]
    fn ints_pick_the_cpython_opcodes() {
        // pickle.dumps((-1,-2**31,-2**31-1,2**31,2**32,-2**39,2**63-1,-2**63,True,False), 5)
        let v = KeyValue::Tuple(vec![
            KeyValue::Int(-1),
            KeyValue::Int(-(1 << 31)),
            KeyValue::Int(-(1 << 31) - 1),
            KeyValue::Int(1 << 31),
            KeyValue::Int(1 << 32),
            KeyValue::Int(-(1 << 39)),
            KeyValue::Int(i64::MAX),
            KeyValue::Int(i64::MIN),
            KeyValue::Bool(true),
            KeyValue::Bool(false),
        ]);
        assert_eq!(
            hex(&dumps(&v)),
            "8005954000000000000000284affffffff4a000000808a05ffffff7fff8a0500000080008a05000000\
             00018a0500000000808a08ffffffffffffff7f8a080000000000000080888974942e"
        );
    }

    #[test]
    fn shared_strings_are_memo_gets_others_are_not() {
        // s = ''.join(['a','b']); pickle.dumps(('a','a','ab',s,s2), 5) where 'ab' is a
        // literal and s, s2 are fresh: only the one-character string is shared.
        let v = KeyValue::Tuple(vec![s("a"), s("a"), s("ab"), s("ab"), s("ab")]);
        assert_eq!(
            hex(&dumps(&v)),
            "8005951900000000000000288c01619468008c026162948c026162948c0261629474942e"
        );
    }

    #[test]
    fn repeated_tags_are_memo_gets() {
        // pickle.dumps((("mm","x1",0),("mm","x2",-3)), 5)
        let mm = |id: &str, off| KeyValue::Tuple(vec![s("mm"), s(id), KeyValue::Int(off)]);
        let v = KeyValue::Tuple(vec![mm("x1", 0), mm("x2", -3)]);
        assert_eq!(
            hex(&dumps(&v)),
            "8005951f000000000000008c026d6d948c027831944b00879468008c027832944afdffffff879486942e"
        );
    }

    #[test]
    fn token_words_match_the_generic_int_path() {
        let cases = [
            0,
            1,
            255,
            256,
            65535,
            65536,
            (1 << 31) - 1,
            1 << 31,
            u32::MAX,
        ];
        for t in cases {
            let mut want = [0u8; 11];
            let n = Pickle::put_int(&mut want, i64::from(t));
            let (word, len) = PickleInt::word(t);
            assert_eq!(
                (&word.to_le_bytes()[..len], len),
                (&want[..n], n),
                "token {t}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn plain_blocks_equal_the_generic_encoder(
            parent in proptest::collection::vec(proptest::num::u8::ANY, 0..33),
            tokens in proptest::collection::vec(
                proptest::prop_oneof![0u32..300, 0u32..70000, proptest::num::u32::ANY],
                0..70,
            ),
        ) {
            let (mut buf, mut memo) = (Vec::new(), Vec::new());
            let mut e = Pickle::new(&mut buf, &mut memo);
            let want = encode_block::<_, [KeyValue]>(&mut e, &parent, &tokens, None).to_vec();
            let mut plain = vec![0xee; 3];
            match plain_block(&mut plain, &parent, &tokens) {
                Some(n) => {
                    proptest::prop_assert_eq!(&plain[..n], &want[..]);
                    proptest::prop_assert!(plain.len() >= n + PLAIN_SLACK);
                }
                None => proptest::prop_assert!(tokens.is_empty()),
            }
        }
    }

    #[test]
    fn plain_blocks_leave_frame_splits_to_the_generic_encoder() {
        // 7 bytes a token: 9300 fit one frame, 9360 could not.
        let tokens = vec![u32::MAX; 9360];
        let (mut buf, mut memo) = (Vec::new(), Vec::new());
        let mut e = Pickle::new(&mut buf, &mut memo);
        let want = encode_block::<_, [KeyValue]>(&mut e, &[b'x'; 32], &tokens[..9300], None);
        let mut plain = Vec::new();
        let n = plain_block(&mut plain, &[b'x'; 32], &tokens[..9300]);
        assert_eq!((n, &plain[..65153]), (Some(65153), want));
        assert_eq!(plain_block(&mut plain, &[b'x'; 32], &tokens), None);
    }

    #[test]
    fn none_hash_seed_string() {
        let (mut buf, mut memo) = (Vec::new(), Vec::new());
        let mut e = Pickle::new(&mut buf, &mut memo);
        assert_eq!(
            hex(encode_str(&mut e, "vllm-none-hash")),
            "80059512000000000000008c0e766c6c6d2d6e6f6e652d68617368942e"
        );
    }

    #[test]
    fn large_frames_split_like_cpython() {
        // pickle.dumps((b'x'*65530, b'x'*65530), 5): the first frame is committed at the
        // start of saving the second bytes object.
        let big = KeyValue::Bytes(vec![b'x'; 65530]);
        let out = dumps(&KeyValue::Tuple(vec![big.clone(), big]));
        assert_eq!(hex(&out[..11]), "8005950000010000000000");
        let second = 2 + 9 + 65536;
        assert_eq!(
            hex(&out[second..second + 14]),
            "95030001000000000042faff0000"
        );
        assert_eq!(out.len(), 131095);
        assert_eq!(hex(&out[out.len() - 4..]), "9486942e");
        // pickle.dumps((b'x'*70000, 1), 5): the payload is unframed, the rest reframed.
        let out = dumps(&KeyValue::Tuple(vec![
            KeyValue::Bytes(vec![b'x'; 70000]),
            KeyValue::Int(1),
        ]));
        assert_eq!(hex(&out[..7]), "80054270110100");
        assert_eq!(
            hex(&out[out.len() - 15..]),
            "950600000000000000944b0186942e"
        );
    }

    #[test]
    fn long_token_tuples_split_frames_between_ints() {
        // pickle.dumps((b'x'*32, tuple(range(40000)), None), 5): frames of 65537 and 54249.
        let tokens: Vec<u32> = (0..40000).collect();
        let (mut buf, mut memo) = (Vec::new(), Vec::new());
        let mut e = Pickle::new(&mut buf, &mut memo);
        let out = encode_block::<_, [KeyValue]>(&mut e, &[b'x'; 32], &tokens, None);
        assert_eq!(hex(&out[2..11]), "950100010000000000");
        let second = 2 + 9 + 65537;
        assert_eq!(hex(&out[second..second + 9]), "95e9d3000000000000");
        assert_eq!(out.len(), second + 9 + 54249);
    }
}
