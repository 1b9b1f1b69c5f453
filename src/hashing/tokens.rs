//! The CBOR items of a block's token ids, the hot loop of `sha256_cbor` and `xxhash_cbor`:
//! each id is an unsigned int in its shortest form (1, 2, 3 or 5 bytes).
//!
//! NOTE 1: two implementations with one output. The portable one writes each token as one
//! 8-byte little-endian word and advances by the token's length. Where the CPU has
//! AVX-512 VBMI2 (checked once, at run time), eight tokens at a time are widened to
//! 8-byte lanes, encoded lane-wise, and packed by one byte-compress instruction.
//! NOTE 2: both write up to `SLACK` bytes past the encoding's end; callers reserve
//! `max_len(n)` bytes and then keep only the returned length.

/// Bytes that may be written past the end of the encoding.
const SLACK: usize = 64;

/// Capacity to reserve for the encoding of `n` tokens.
pub(crate) fn max_len(n: usize) -> usize {
    5 * n + SLACK
}

/// Writes the CBOR items of `tokens` at `dst` and returns their length.
///
/// # Safety
/// `dst` must be valid for writes of `max_len(tokens.len())` bytes.
pub(crate) unsafe fn write(dst: *mut u8, tokens: &[u32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if tokens.len() >= 8 && avx512::available() {
        // SAFETY: the features were detected; the caller's guarantee carries over.
        return unsafe { avx512::write(dst, tokens) };
    }
    // SAFETY: the caller's guarantee.
    unsafe { write_portable(dst, tokens) }
}

/// The CBOR encoding of the unsigned int `t` as a little-endian word, and its length.
///
/// NOTE: branch-free, because token widths are random and a mispredicted branch per
/// token costs more than the whole encoding. The class
/// `c = [t >= 24] + [t >= 256] + [t >= 65536]` picks the head byte (`t` itself, or
/// 0x18/0x19/0x1a) and the payload length `(1 << c) >> 1` (0, 1, 2 or 4 bytes, big endian).
#[inline(always)]
fn uint32_word(t: u32) -> (u64, usize) {
    let c = u32::from(t >= 24) + u32::from(t >= 256) + u32::from(t >= 65536);
    let plen = (1u32 << c) >> 1;
    let head = if c == 0 { t } else { 0x17 + c };
    let payload = u64::from(t.swap_bytes()) >> (32 - 8 * plen);
    (u64::from(head) | (payload << 8), 1 + plen as usize)
}

/// [`write`] one token at a time.
///
/// # Safety
/// As [`write`].
unsafe fn write_portable(dst: *mut u8, tokens: &[u32]) -> usize {
    let mut pos = 0;
    for &t in tokens {
        let (word, len) = uint32_word(t);
        // SAFETY: `pos <= 5 * i` before token `i`, so the store ends within `max_len`.
        unsafe { dst.add(pos).cast::<u64>().write_unaligned(word.to_le()) };
        pos += len;
    }
    pos
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
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
    /// `max_len(tokens.len())` bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vbmi2")]
    pub(super) unsafe fn write(dst: *mut u8, tokens: &[u32]) -> usize {
        // Per 128-bit lane: the low 4 bytes of each 8-byte lane reversed (a 32-bit byte
        // swap), the other bytes zeroed.
        let bswap = _mm512_broadcast_i32x4(_mm_setr_epi8(
            3, 2, 1, 0, -1, -1, -1, -1, 11, 10, 9, 8, -1, -1, -1, -1,
        ));
        // Each byte's index within its 8-byte lane.
        let byte_index = _mm512_set1_epi64(0x0706_0504_0302_0100);
        let ones = _mm512_set1_epi64(0x0101_0101_0101_0101);
        let mut pos = 0;
        let mut chunks = tokens.chunks_exact(8);
        for chunk in &mut chunks {
            // SAFETY: `chunk` holds 8 u32 (32 bytes).
            let t = _mm512_cvtepu32_epi64(unsafe { _mm256_loadu_si256(chunk.as_ptr().cast()) });
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
            // Keep the first `1 + plen` bytes of every lane, packed.
            let len = _mm512_mullo_epi64(_mm512_add_epi64(plen, _mm512_set1_epi64(1)), ones);
            let keep = _mm512_cmplt_epu8_mask(byte_index, len);
            let packed = _mm512_maskz_compress_epi8(keep, word);
            // SAFETY: `pos <= 5 * i` before token `i`, so these 64 bytes end within
            // `max_len`.
            unsafe { _mm512_storeu_si512(dst.add(pos).cast(), packed) };
            pos += keep.count_ones() as usize;
        }
        // SAFETY: the tail starts at `pos`, within the same bounds.
        pos + unsafe { super::write_portable(dst.add(pos), chunks.remainder()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn portable(tokens: &[u32]) -> Vec<u8> {
        let mut out = vec![0u8; max_len(tokens.len())];
        // SAFETY: `out` holds `max_len` bytes.
        let n = unsafe { write_portable(out.as_mut_ptr(), tokens) };
        out.truncate(n);
        out
    }

    fn dispatched(tokens: &[u32]) -> Vec<u8> {
        let mut out = vec![0u8; max_len(tokens.len())];
        // SAFETY: `out` holds `max_len` bytes.
        let n = unsafe { write(out.as_mut_ptr(), tokens) };
        out.truncate(n);
        out
    }

    #[test]
    fn shortest_forms() {
        // cbor2.dumps(0), (23), (24), (255), (256), (65535), (65536), (2**32 - 1)
        let got = portable(&[0, 23, 24, 255, 256, 65535, 65536, u32::MAX]);
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
            u32::MAX,
        ];
        for shift in 0..edges.len() {
            let tokens: Vec<u32> = (0..27).map(|i| edges[(i + shift) % edges.len()]).collect();
            for n in 0..=tokens.len() {
                assert_eq!(dispatched(&tokens[..n]), portable(&tokens[..n]), "n {n}");
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
            proptest::prop_assert_eq!(dispatched(&tokens), portable(&tokens));
        }
    }
}
