//! A minimal msgpack writer that picks the same encodings as msgspec 0.22 (vLLM 0.33.0's
//! encoder): the shortest integer form (unsigned forms for non-negative values), `float64`
//! for every float, `str8` from 32 bytes on, `bin8`, fixarray/fixmap up to 15 entries.

use crate::types::KeyValue;

/// Writes msgpack values into a byte buffer.
#[derive(Debug)]
pub struct MsgpackWriter<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> MsgpackWriter<'a> {
    /// A writer appending to `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        Self { out }
    }

    /// `nil`.
    #[inline]
    pub fn nil(&mut self) {
        self.out.push(0xc0);
    }

    /// `true` / `false`.
    #[inline]
    pub fn bool(&mut self, v: bool) {
        self.out.push(if v { 0xc3 } else { 0xc2 });
    }

    /// A non-negative integer in its shortest form.
    #[inline]
    pub fn uint(&mut self, v: u64) {
        if v < 0x80 {
            self.out.push(v as u8);
        } else if v <= u64::from(u8::MAX) {
            self.out.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= u64::from(u16::MAX) {
            self.out.push(0xcd);
            self.out.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= u64::from(u32::MAX) {
            self.out.push(0xce);
            self.out.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            self.out.push(0xcf);
            self.out.extend_from_slice(&v.to_be_bytes());
        }
    }

    /// A signed integer: unsigned forms when non-negative, else the shortest signed form.
    #[inline]
    pub fn int(&mut self, v: i64) {
        if v >= 0 {
            self.uint(v as u64);
        } else if v >= -32 {
            self.out.push(v as i8 as u8);
        } else if v >= i64::from(i8::MIN) {
            self.out.extend_from_slice(&[0xd0, v as i8 as u8]);
        } else if v >= i64::from(i16::MIN) {
            self.out.push(0xd1);
            self.out.extend_from_slice(&(v as i16).to_be_bytes());
        } else if v >= i64::from(i32::MIN) {
            self.out.push(0xd2);
            self.out.extend_from_slice(&(v as i32).to_be_bytes());
        } else {
            self.out.push(0xd3);
            self.out.extend_from_slice(&v.to_be_bytes());
        }
    }

    /// A float, always as `float64`.
    #[inline]
    pub fn f64(&mut self, v: f64) {
        self.out.push(0xcb);
        self.out.extend_from_slice(&v.to_bits().to_be_bytes());
    }

    /// A utf-8 string.
    #[inline]
    pub fn str(&mut self, s: &str) {
        let n = s.len();
        if n < 32 {
            self.out.push(0xa0 | n as u8);
        } else {
            self.len_header(n, 0xd9, 0xda, 0xdb);
        }
        self.out.extend_from_slice(s.as_bytes());
    }

    /// A byte string.
    #[inline]
    pub fn bin(&mut self, b: &[u8]) {
        self.len_header(b.len(), 0xc4, 0xc5, 0xc6);
        self.out.extend_from_slice(b);
    }

    /// An array header for `n` elements.
    #[inline]
    pub fn array_len(&mut self, n: usize) {
        if n < 16 {
            self.out.push(0x90 | n as u8);
        } else {
            self.len_header16(n, 0xdc, 0xdd);
        }
    }

    /// A map header for `n` key/value pairs.
    #[inline]
    pub fn map_len(&mut self, n: usize) {
        if n < 16 {
            self.out.push(0x80 | n as u8);
        } else {
            self.len_header16(n, 0xde, 0xdf);
        }
    }

    /// A map header for `n` pairs in the `map16` form, whatever `n`: msgspec picks the
    /// header form from a struct's field count (tag included), before leaving fields out.
    #[inline]
    pub fn map16_len(&mut self, n: u16) {
        self.out.push(0xde);
        self.out.extend_from_slice(&n.to_be_bytes());
    }

    /// An array of non-negative integers.
    #[inline]
    pub fn uint_array<T: Copy + Into<u64>>(&mut self, items: &[T]) {
        self.array_len(items.len());
        for &v in items {
            self.uint(v.into());
        }
    }

    /// An optional value: `nil` for `None`.
    #[inline]
    pub fn opt<T>(&mut self, v: Option<T>, f: impl FnOnce(&mut Self, T)) {
        match v {
            Some(v) => f(self, v),
            None => self.nil(),
        }
    }

    /// A [`KeyValue`] tree (tuples become arrays, as msgspec encodes Python tuples).
    pub fn key_value(&mut self, v: &KeyValue) {
        match v {
            KeyValue::None => self.nil(),
            KeyValue::Bool(b) => self.bool(*b),
            KeyValue::Int(i) => self.int(*i),
            KeyValue::Str(s) => self.str(s),
            KeyValue::Bytes(b) => self.bin(b),
            KeyValue::Tuple(items) => {
                self.array_len(items.len());
                for item in items {
                    self.key_value(item);
                }
            }
        }
    }

    fn len_header(&mut self, n: usize, m8: u8, m16: u8, m32: u8) {
        if n <= usize::from(u8::MAX) {
            self.out.extend_from_slice(&[m8, n as u8]);
        } else {
            self.len_header16(n, m16, m32);
        }
    }

    fn len_header16(&mut self, n: usize, m16: u8, m32: u8) {
        if n <= usize::from(u16::MAX) {
            self.out.push(m16);
            self.out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.out.push(m32);
            self.out.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(f: impl FnOnce(&mut MsgpackWriter<'_>)) -> Vec<u8> {
        let mut out = Vec::new();
        f(&mut MsgpackWriter::new(&mut out));
        out
    }

    // Expected bytes are the msgpack specification's encodings, as msgspec 0.22 emits them.
    #[test]
    fn integers_use_the_shortest_form() {
        assert_eq!(enc(|w| w.uint(127)), [0x7f]);
        assert_eq!(enc(|w| w.uint(128)), [0xcc, 0x80]);
        assert_eq!(enc(|w| w.uint(256)), [0xcd, 1, 0]);
        assert_eq!(enc(|w| w.uint(65536)), [0xce, 0, 1, 0, 0]);
        assert_eq!(
            enc(|w| w.uint(u64::MAX)),
            [0xcf, 255, 255, 255, 255, 255, 255, 255, 255]
        );
        assert_eq!(enc(|w| w.int(-1)), [0xff]);
        assert_eq!(enc(|w| w.int(-32)), [0xe0]);
        assert_eq!(enc(|w| w.int(-33)), [0xd0, 0xdf]);
        assert_eq!(enc(|w| w.int(-129)), [0xd1, 0xff, 0x7f]);
        assert_eq!(enc(|w| w.int(-32769)), [0xd2, 0xff, 0xff, 0x7f, 0xff]);
        assert_eq!(enc(|w| w.int(i64::MIN))[0], 0xd3);
        assert_eq!(enc(|w| w.int(300)), [0xcd, 1, 44]);
    }

    #[test]
    fn strings_bins_and_containers() {
        assert_eq!(enc(|w| w.str("GPU")), b"\xa3GPU");
        assert_eq!(enc(|w| w.str(&"a".repeat(32)))[..2], [0xd9, 32]);
        assert_eq!(enc(|w| w.str(&"a".repeat(256)))[..3], [0xda, 1, 0]);
        assert_eq!(enc(|w| w.bin(b"x")), [0xc4, 1, b'x']);
        assert_eq!(enc(|w| w.array_len(15)), [0x9f]);
        assert_eq!(enc(|w| w.array_len(16)), [0xdc, 0, 16]);
        assert_eq!(enc(|w| w.map_len(16)), [0xde, 0, 16]);
        assert_eq!(enc(|w| w.map16_len(10)), [0xde, 0, 10]);
        assert_eq!(enc(|w| w.array_len(70000)), [0xdd, 0, 1, 0x11, 0x70]);
        assert_eq!(enc(|w| w.f64(1.5)), [0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn key_value_tuples_are_arrays() {
        let v = KeyValue::Tuple(vec![
            KeyValue::Str("a".into()),
            KeyValue::Tuple(vec![KeyValue::Str("mm".into()), KeyValue::Int(3)]),
            KeyValue::None,
            KeyValue::Bool(true),
        ]);
        assert_eq!(enc(|w| w.key_value(&v)), b"\x94\xa1a\x92\xa2mm\x03\xc0\xc3");
    }
}
