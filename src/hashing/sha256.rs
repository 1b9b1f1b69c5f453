//! One-shot SHA-256 of a short message, as block hashing needs it: this module pads the
//! message itself and runs `sha2`'s compression function on the 64-byte blocks.
//!
//! NOTE 1: a block of 16 tokens encodes to about 100 bytes, two compressions. Through
//! `Sha256::digest` (buffering, then finalization) the hash took 128 ns on the project's
//! machine; padding here and compressing directly takes 115 ns. The two compressions,
//! the second depending on the first, are the rest of it. [`sha256_padded`] pads in the
//! caller's buffer, for messages written there with room to spare (no copy of the tail).
//!
//! NOTE 2 (the floor of `sha256`): a block's first compression needs its parent, the
//! previous block's digest, so a request's blocks are one serial run of compressions, each
//! 32 dependent `sha256rnds2` (SHA-NI). vLLM's pickle of a 32k-token prompt in blocks of 16
//! (ids below 150000) is 2048 messages of 119 bytes on average, 4905 compressions with
//! their padding: 205-210 µs on the project's machine (43 ns each, 33 ns of which the
//! `sha256rnds2` latency), timed alone over exactly those bytes. vLLM's own `Request()`
//! with that prompt takes ~3000 µs there, of which ~46 µs is its own work (no-op hasher)
//! and ~32 µs the 2048 `bytes` objects any hasher returns; so no `sha256` hasher can make
//! it more than ~10.6x faster on that machine, even before reading a token.

use sha2::digest::generic_array::GenericArray;

/// SHA-256's initial state.
const H0: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// The SHA-256 digest of `data`.
pub(crate) fn sha256(data: &[u8]) -> [u8; 32] {
    let mut state = H0;
    let full = data.len() - data.len() % 64;
    compress(&mut state, &data[..full]);
    // The rest, the 0x80 marker and the bit length fill one or two more blocks.
    let rest = &data[full..];
    let mut tail = [0u8; 128];
    tail[..rest.len()].copy_from_slice(rest);
    let end = pad(&mut tail, rest.len(), data.len());
    compress(&mut state, &tail[..end]);
    digest_of(state)
}

/// The SHA-256 digest of `buf[..len]`, padded in place: `buf` must hold at least
/// `len + 72` bytes, and those past `len` are overwritten.
pub(crate) fn sha256_padded(buf: &mut [u8], len: usize) -> [u8; 32] {
    let mut state = H0;
    buf[len + 1..padded_len(len) - 8].fill(0);
    let end = pad(buf, len, len);
    compress(&mut state, &buf[..end]);
    digest_of(state)
}

/// Writes SHA-256's padding for a message of `total` bytes whose last `rest` bytes start
/// `buf` (`rest == total` when all of it does), where the bytes after them are zeros: the
/// 0x80 marker and the bit length. Returns where the padded message ends (a multiple of 64).
fn pad(buf: &mut [u8], rest: usize, total: usize) -> usize {
    let end = padded_len(rest);
    buf[rest] = 0x80;
    buf[end - 8..end].copy_from_slice(&(total as u64 * 8).to_be_bytes());
    end
}

/// The length of a message of `n` bytes with its padding (the 0x80 marker and the 8-byte
/// bit length), rounded up to 64-byte blocks.
fn padded_len(n: usize) -> usize {
    (n + 9).next_multiple_of(64)
}

fn digest_of(state: [u32; 8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (o, word) in out.chunks_exact_mut(4).zip(state) {
        o.copy_from_slice(&word.to_be_bytes());
    }
    out
}

/// Runs the compression function over `blocks`, whose length is a multiple of 64.
fn compress(state: &mut [u32; 8], blocks: &[u8]) {
    for block in blocks.chunks_exact(64) {
        sha2::compress256(state, std::slice::from_ref(GenericArray::from_slice(block)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn equals_sha2_at_every_padding_boundary() {
        for len in 0..300 {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
            let want: [u8; 32] = Sha256::digest(&data).into();
            assert_eq!(sha256(&data), want, "length {len}");
            let mut padded = data.clone();
            padded.resize(len + 72, 0xee);
            assert_eq!(
                sha256_padded(&mut padded, len),
                want,
                "padded, length {len}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn equals_sha2(data in proptest::collection::vec(proptest::num::u8::ANY, 0..1000)) {
            let want: [u8; 32] = Sha256::digest(&data).into();
            proptest::prop_assert_eq!(sha256(&data), want);
        }
    }
}
