//! The hot loop of both serializers: a block's token ids, each an int in its shortest
//! form, as CBOR unsigned ints (`sha256_cbor`, `xxhash_cbor`: 1, 2, 3 or 5 bytes) or pickle
//! int opcodes (`sha256`, `xxhash`: `K`, `M`, `J` with 1, 2 or 4 bytes, `LONG1` past
//! `2**31 - 1`).
//!
//! NOTE 1: two implementations with one output. The portable one writes each token as one
//! 8-byte little-endian word and advances by the token's length. Where the CPU has
//! AVX-512 VBMI2 (checked once, at run time), eight tokens at a time are widened to
//! 8-byte lanes, encoded lane-wise, and packed by one byte-compress instruction.
//! NOTE 2: both write up to `SLACK` bytes past the encoding's end; callers reserve
//! `max_len(n)` bytes and then keep only the returned length.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::__m512i;

use super::pickle;

/// Bytes that may be written past the end of the encoding.
const SLACK: usize = 64;

/// One serializer's encoding of a token id.
pub(crate) trait Words {
    /// The longest encoding of one token, in bytes.
    const MAX: usize;
    /// The encoding of `t` as a little-endian word, and its length.
    fn word(t: u32) -> (u64, usize);
    /// [`Words::word`] of eight tokens in 64-bit lanes: the words and the lengths.
    ///
    /// # Safety
    /// The CPU has the features `avx512::available` checks.
    #[cfg(target_arch = "x86_64")]
    unsafe fn lanes(t: __m512i) -> (__m512i, __m512i);
}

/// CBOR unsigned ints.
pub(crate) struct CborUint;

/// Pickle int opcodes.
pub(crate) struct PickleInt;

/// Capacity to reserve for the encoding of `n` tokens.
pub(crate) fn max_len<W: Words>(n: usize) -> usize {
    W::MAX * n + SLACK
}

/// Writes the encodings of `tokens` at `dst` and returns their length.
///
/// # Safety
/// `dst` must be valid for writes of `max_len::<W>(tokens.len())` bytes.
pub(crate) unsafe fn write<W: Words>(dst: *mut u8, tokens: &[u32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if tokens.len() >= 8 && avx512::available() {
        // SAFETY: the features were detected; the caller's guarantee carries over.
        return unsafe { avx512::write::<W>(dst, tokens) };
    }
    // SAFETY: the caller's guarantee.
    unsafe { write_portable::<W>(dst, tokens) }
}

impl Words for CborUint {
    const MAX: usize = 5;

    /// NOTE: branch-free, because token widths are random and a mispredicted branch per
    /// token costs more than the whole encoding. The class
    /// `c = [t >= 24] + [t >= 256] + [t >= 65536]` picks the head byte (`t` itself, or
    /// 0x18/0x19/0x1a) and the payload length `(1 << c) >> 1` (0, 1, 2 or 4 bytes, big
    /// endian).
    #[inline(always)]
    fn word(t: u32) -> (u64, usize) {
        let c = u32::from(t >= 24) + u32::from(t >= 256) + u32::from(t >= 65536);
        let plen = (1u32 << c) >> 1;
        let head = if c == 0 { t } else { 0x17 + c };
        let payload = u64::from(t.swap_bytes()) >> (32 - 8 * plen);
        (u64::from(head) | (payload << 8), 1 + plen as usize)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vbmi2")]
    #[inline]
    unsafe fn lanes(t: __m512i) -> (__m512i, __m512i) {
        use std::arch::x86_64::*;
        // Per 128-bit lane: the low 4 bytes of each 8-byte lane reversed (a 32-bit byte
        // swap), the other bytes zeroed.
        let bswap = _mm512_broadcast_i32x4(_mm_setr_epi8(
            3, 2, 1, 0, -1, -1, -1, -1, 11, 10, 9, 8, -1, -1, -1, -1,
        ));
        let ge24 = _mm512_cmpge_epu64_mask(t, _mm512_set1_epi64(24));
        let ge256 = _mm512_cmpge_epu64_mask(t, _mm512_set1_epi64(256));
        let ge64k = _mm512_cmpge_epu64_mask(t, _mm512_set1_epi64(65536));
        // Head byte: the value itself below 24, else 0x18 / 0x19 / 0x1a.
        let mut head = _mm512_mask_mov_epi64(t, ge24, _mm512_set1_epi64(0x18));
        head = _mm512_mask_mov_epi64(head, ge256, _mm512_set1_epi64(0x19));
        head = _mm512_mask_mov_epi64(head, ge64k, _mm512_set1_epi64(0x1a));
        // Payload length in bytes: 0, 1, 2 or 4.
        let mut plen = _mm512_maskz_mov_epi64(ge24, _mm512_set1_epi64(1));
        plen = _mm512_mask_mov_epi64(plen, ge256, _mm512_set1_epi64(2));
        plen = _mm512_mask_mov_epi64(plen, ge64k, _mm512_set1_epi64(4));
        // The payload: the value big endian, its low `plen` bytes.
        let shift = _mm512_sub_epi64(_mm512_set1_epi64(32), _mm512_slli_epi64(plen, 3));
        let payload = _mm512_srlv_epi64(_mm512_shuffle_epi8(t, bswap), shift);
        let word = _mm512_or_si512(head, _mm512_slli_epi64(payload, 8));
        (word, _mm512_add_epi64(plen, _mm512_set1_epi64(1)))
    }
}

const BININT1: u64 = pickle::BININT1 as u64;
const BININT2: u64 = pickle::BININT2 as u64;
const BININT: u64 = pickle::BININT as u64;
/// `LONG1 5`: a token of 2**31 or more takes five bytes, the fifth a zero sign byte.
const LONG1_5: u64 = pickle::LONG1 as u64 | (5 << 8);

impl Words for PickleInt {
    const MAX: usize = 7;

    /// NOTE: branch-free for `t < 2**31` (random widths would mispredict): the class
    /// `c = [t >= 256] + [t >= 65536]` picks `K`/`M`/`J` and a payload of `1 << c` bytes.
    /// `t >= 2**31` is `LONG1 5 <t as 5 bytes>`, rare enough for a branch.
    #[inline(always)]
    fn word(t: u32) -> (u64, usize) {
        if t >= 1 << 31 {
            return (LONG1_5 | (u64::from(t) << 16), 7);
        }
        let c = u32::from(t >= 256) + u32::from(t >= 65536);
        // [BININT1, BININT2, BININT][c], as a shift so that it stays branch-free.
        let ops = BININT1 | (BININT2 << 8) | (BININT << 16);
        let op = (ops >> (8 * c)) & 0xff;
        (op | (u64::from(t) << 8), 1 + (1usize << c))
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vbmi2")]
    #[inline]
    unsafe fn lanes(t: __m512i) -> (__m512i, __m512i) {
        use std::arch::x86_64::*;
        let ge256 = _mm512_cmpge_epu64_mask(t, _mm512_set1_epi64(256));
        let ge64k = _mm512_cmpge_epu64_mask(t, _mm512_set1_epi64(65536));
        let long = _mm512_cmpge_epu64_mask(t, _mm512_set1_epi64(1 << 31));
        let mut op = _mm512_set1_epi64(BININT1 as i64);
        op = _mm512_mask_mov_epi64(op, ge256, _mm512_set1_epi64(BININT2 as i64));
        op = _mm512_mask_mov_epi64(op, ge64k, _mm512_set1_epi64(BININT as i64));
        let mut word = _mm512_or_si512(op, _mm512_slli_epi64(t, 8));
        let long_word =
            _mm512_or_si512(_mm512_set1_epi64(LONG1_5 as i64), _mm512_slli_epi64(t, 16));
        word = _mm512_mask_mov_epi64(word, long, long_word);
        let mut len = _mm512_set1_epi64(2);
        len = _mm512_mask_mov_epi64(len, ge256, _mm512_set1_epi64(3));
        len = _mm512_mask_mov_epi64(len, ge64k, _mm512_set1_epi64(5));
        len = _mm512_mask_mov_epi64(len, long, _mm512_set1_epi64(7));
        (word, len)
    }
}

/// [`write`] one token at a time.
///
/// # Safety
/// As [`write`].
unsafe fn write_portable<W: Words>(dst: *mut u8, tokens: &[u32]) -> usize {
    let mut pos = 0;
    for &t in tokens {
        let (word, len) = W::word(t);
        // SAFETY: `pos <= W::MAX * i` before token `i`, so the store ends within `max_len`.
        unsafe { dst.add(pos).cast::<u64>().write_unaligned(word.to_le()) };
        pos += len;
    }
    pos
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::Words;
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    /// Whether this CPU runs [`write`].
    pub(super) fn available() -> bool {
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512dq")
                && is_x86_feature_detected!("avx512vbmi2")
        })
    }

    /// [`super::write`] eight tokens at a time; the last `len % 8` go one by one.
    ///
    /// # Safety
    /// The CPU has the features [`available`] checks, and `dst` is valid for writes of
    /// `max_len::<W>(tokens.len())` bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vbmi2")]
    pub(super) unsafe fn write<W: Words>(dst: *mut u8, tokens: &[u32]) -> usize {
        // Each byte's index within its 8-byte lane.
        let byte_index = _mm512_set1_epi64(0x0706_0504_0302_0100);
        let ones = _mm512_set1_epi64(0x0101_0101_0101_0101);
        let mut pos = 0;
        let mut chunks = tokens.chunks_exact(8);
        for chunk in &mut chunks {
            // SAFETY: `chunk` holds 8 u32 (32 bytes).
            let t = _mm512_cvtepu32_epi64(unsafe { _mm256_loadu_si256(chunk.as_ptr().cast()) });
            // SAFETY: the features were detected (the caller's guarantee).
            let (word, len) = unsafe { W::lanes(t) };
            // Keep the first `len` bytes of every lane, packed.
            let keep = _mm512_cmplt_epu8_mask(byte_index, _mm512_mullo_epi64(len, ones));
            let packed = _mm512_maskz_compress_epi8(keep, word);
            // SAFETY: `pos <= W::MAX * i` before token `i`, so these 64 bytes end within
            // `max_len`.
            unsafe { _mm512_storeu_si512(dst.add(pos).cast(), packed) };
            pos += keep.count_ones() as usize;
        }
        // SAFETY: the tail starts at `pos`, within the same bounds.
        pos + unsafe { super::write_portable::<W>(dst.add(pos), chunks.remainder()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn portable<W: Words>(tokens: &[u32]) -> Vec<u8> {
        let mut out = vec![0u8; max_len::<W>(tokens.len())];
        // SAFETY: `out` holds `max_len` bytes.
        let n = unsafe { write_portable::<W>(out.as_mut_ptr(), tokens) };
        out.truncate(n);
        out
    }

    fn dispatched<W: Words>(tokens: &[u32]) -> Vec<u8> {
        let mut out = vec![0u8; max_len::<W>(tokens.len())];
        // SAFETY: `out` holds `max_len` bytes.
        let n = unsafe { write::<W>(out.as_mut_ptr(), tokens) };
        out.truncate(n);
        out
    }

    #[test]
    fn shortest_forms() {
        // cbor2.dumps(0), (23), (24), (255), (256), (65535), (65536), (2**32 - 1)
        let got = portable::<CborUint>(&[0, 23, 24, 255, 256, 65535, 65536, u32::MAX]);
        let want = [
            vec![0x00],
            vec![0x17],
            vec![0x18, 24],
            vec![0x18, 0xff],
            vec![0x19, 0x01, 0x00],
            vec![0x19, 0xff, 0xff],
            vec![0x1a, 0x00, 0x01, 0x00, 0x00],
            vec![0x1a, 0xff, 0xff, 0xff, 0xff],
        ]
        .concat();
        assert_eq!(got, want);
        // pickle.dumps((0, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1), 5), items
        let got =
            portable::<PickleInt>(&[0, 255, 256, 65535, 65536, (1 << 31) - 1, 1 << 31, u32::MAX]);
        let want = [
            vec![b'K', 0],
            vec![b'K', 0xff],
            vec![b'M', 0x00, 0x01],
            vec![b'M', 0xff, 0xff],
            vec![b'J', 0x00, 0x00, 0x01, 0x00],
            vec![b'J', 0xff, 0xff, 0xff, 0x7f],
            vec![0x8a, 5, 0x00, 0x00, 0x00, 0x80, 0x00],
            vec![0x8a, 5, 0xff, 0xff, 0xff, 0xff, 0x00],
        ]
        .concat();
        assert_eq!(got, want);
    }

    #[test]
    fn every_width_boundary_in_every_lane() {
        let edges = [
            0u32,
            1,
            23,
            24,
            25,
            255,
            256,
            257,
            65535,
            65536,
            65537,
            (1 << 31) - 1,
            1 << 31,
            u32::MAX,
        ];
        for shift in 0..edges.len() {
            let tokens: Vec<u32> = (0..27).map(|i| edges[(i + shift) % edges.len()]).collect();
            for n in 0..=tokens.len() {
                let t = &tokens[..n];
                assert_eq!(dispatched::<CborUint>(t), portable::<CborUint>(t), "n {n}");
                assert_eq!(
                    dispatched::<PickleInt>(t),
                    portable::<PickleInt>(t),
                    "n {n}"
                );
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn simd_equals_portable(
            tokens in proptest::collection::vec(
                proptest::prop_oneof![0u32..30, 0u32..300, 0u32..70000, proptest::num::u32::ANY],
                0..80,
            )
        ) {
            proptest::prop_assert_eq!(dispatched::<CborUint>(&tokens), portable::<CborUint>(&tokens));
            proptest::prop_assert_eq!(dispatched::<PickleInt>(&tokens), portable::<PickleInt>(&tokens));
        }
    }
}
