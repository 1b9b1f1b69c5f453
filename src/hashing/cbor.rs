//! Canonical CBOR, byte-exact with `cbor2.dumps(obj, canonical=True)` for the value kinds
//! of block-hash inputs: tuples become arrays, ints use the shortest head, `None` is
//! `0xf6`, bools `0xf4`/`0xf5`, `str` a text string, `bytes` a byte string.

use super::encode::Encoder;
use super::tokens::{self as token_words, CborUint};

/// CBOR encoder writing into a caller-owned, reused buffer.
pub(crate) struct Cbor<'b> {
    buf: &'b mut Vec<u8>,
}

impl<'b> Cbor<'b> {
    /// An encoder appending to `buf` (cleared by [`Encoder::begin`]).
    pub(crate) fn new(buf: &'b mut Vec<u8>) -> Self {
        Self { buf }
    }

    /// Writes a data item head: major type `major` with argument `arg`, shortest form.
    #[inline]
    fn head(&mut self, major: u8, arg: u64) {
        let m = major << 5;
        if arg < 24 {
            self.buf.push(m | arg as u8);
        } else if arg <= 0xff {
            self.buf.extend_from_slice(&[m | 24, arg as u8]);
        } else if arg <= 0xffff {
            let b = (arg as u16).to_be_bytes();
            self.buf.extend_from_slice(&[m | 25, b[0], b[1]]);
        } else if arg <= 0xffff_ffff {
            let b = (arg as u32).to_be_bytes();
            self.buf
                .extend_from_slice(&[m | 26, b[0], b[1], b[2], b[3]]);
        } else {
            self.buf.push(m | 27);
            self.buf.extend_from_slice(&arg.to_be_bytes());
        }
    }
}

impl Encoder for Cbor<'_> {
    fn begin(&mut self) {
        self.buf.clear();
    }

    fn finish(&mut self) -> &[u8] {
        self.buf
    }

    fn none(&mut self) {
        self.buf.push(0xf6);
    }

    fn boolean(&mut self, v: bool) {
        self.buf.push(if v { 0xf5 } else { 0xf4 });
    }

    fn int(&mut self, v: i64) {
        if v >= 0 {
            self.head(0, v as u64);
        } else {
            // -1 - v, computed without overflow for i64::MIN.
            self.head(1, !(v as u64));
        }
    }

    fn str(&mut self, s: &str) {
        self.head(3, s.len() as u64);
        self.buf.extend_from_slice(s.as_bytes());
    }

    fn bytes(&mut self, b: &[u8]) {
        self.head(2, b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    fn tuple_begin(&mut self, n: usize) {
        self.head(4, n as u64);
    }

    fn tuple_end(&mut self, _n: usize) {}

    fn tokens(&mut self, tokens: &[u32]) {
        self.head(4, tokens.len() as u64);
        let start = self.buf.len();
        self.buf
            .reserve(token_words::max_len::<CborUint>(tokens.len()));
        // SAFETY: `reserve` made room for `max_len` bytes after `start`; `write` returns
        // how many of them it wrote, all initialized.
        unsafe {
            let n = token_words::write::<CborUint>(self.buf.as_mut_ptr().add(start), tokens);
            self.buf.set_len(start + n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::encode::{encode_block, write_value};
    use crate::types::KeyValue;

    fn enc(v: &KeyValue) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut e = Cbor::new(&mut buf);
        e.begin();
        write_value(&mut e, v);
        e.finish().to_vec()
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn ints_use_the_shortest_head() {
        // cbor2.dumps((0,1,255,256,65535,65536,2**32,-1,-24,-25,-2**63), canonical=True)
        let v = KeyValue::Tuple(
            [
                0,
                1,
                255,
                256,
                65535,
                65536,
                1 << 32,
                -1,
                -24,
                -25,
                i64::MIN,
            ]
            .into_iter()
            .map(KeyValue::Int)
            .collect(),
        );
        assert_eq!(
            hex(&enc(&v)),
            "8b000118ff19010019ffff1a000100001b0000000100000000203738183b7fffffffffffffff"
        );
    }

    #[test]
    fn atoms_and_strings() {
        // cbor2.dumps((None, True, False, 'abc', b'xx', ()), canonical=True)
        let v = KeyValue::Tuple(vec![
            KeyValue::None,
            KeyValue::Bool(true),
            KeyValue::Bool(false),
            KeyValue::Str("abc".into()),
            KeyValue::Bytes(b"xx".to_vec()),
            KeyValue::Tuple(vec![]),
        ]);
        assert_eq!(hex(&enc(&v)), "86f6f5f46361626342787880");
    }

    #[test]
    fn block_layout_matches_the_reference_vector() {
        // (NONE_HASH, (0,1,2,3), None) -> 83 5820 <32B> 84 00 01 02 03 f6
        let parent = [0xabu8; 32];
        let mut buf = Vec::new();
        let mut e = Cbor::new(&mut buf);
        let out = encode_block::<_, [KeyValue]>(&mut e, &parent, &[0u32, 1, 2, 3], None);
        let mut want = vec![0x83, 0x58, 0x20];
        want.extend_from_slice(&parent);
        want.extend_from_slice(&[0x84, 0, 1, 2, 3, 0xf6]);
        assert_eq!(out, &want[..]);
    }

    #[test]
    fn token_widths() {
        let mut buf = Vec::new();
        let mut e = Cbor::new(&mut buf);
        e.begin();
        e.tokens(&[23, 24, 255, 256, 65535, 65536, u32::MAX]);
        assert_eq!(
            hex(e.finish()),
            "8717181818ff19010019ffff1a000100001affffffff"
        );
    }
}
