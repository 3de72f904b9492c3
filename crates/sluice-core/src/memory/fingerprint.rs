//! Keys are stored as 128-bit keyed fingerprints, not as strings.
//!
//! A key of up to [`MAX_WORDS`] 8-byte words is fingerprinted by the multilinear hash family,
//! twice over with independent random keys chosen per store: for each half,
//! `h(s) = ⌊(k₀ + k₁·len + Σ kᵢ₊₂·sᵢ mod 2¹²⁸) / 2⁶⁴⌋`, where `sᵢ` are the key's bytes read as
//! little-endian words (the last one zero-padded) and the `k` are 128-bit. The family is strongly
//! universal (Lemire and Kaser, "Strongly universal string hashing is fast", 2014): for two
//! distinct keys chosen without knowing the random `k`, each half collides with probability
//! 2⁻⁶⁴, the two halves together with 2⁻¹²⁸. So two distinct keys share a counter with
//! probability about `n² / 2¹²⁹` among `n` keys (10⁻²¹ for a billion), and an outsider cannot
//! aim for a collision, or for one shard or bucket, without the random key. Longer keys, which
//! are rare, use SipHash-1-3 with 128-bit output under a random key of their own.
//!
//! The family is linear in its key, so unlike SipHash it is not a pseudo-random function: the
//! guarantee holds as long as fingerprints are not shown to the outside, and the store never
//! shows them. It costs about a fifth of SipHash-1-3 on short keys. `docs/memory-store.md` has
//! the numbers.

use std::hash::{BuildHasher, Hasher};

use siphasher::sip128::{Hasher128, SipHasher13};

/// A counter key's fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    /// Used as the hash-table hash.
    pub(crate) lo: u64,
    /// Used to pick the shard, and to tell keys apart.
    pub(crate) hi: u64,
}

impl std::hash::Hash for Fingerprint {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.lo);
    }
}

/// The longest key, in 8-byte words, that the multilinear family fingerprints: 256 bytes, which
/// every realistic counter key fits in. Each word needs 16 bytes of random key per half.
pub(crate) const MAX_WORDS: usize = 32;

/// The random keys of one half of the multilinear hash: the constant term, the length's
/// coefficient, then one coefficient per word.
type HalfKey = [u128; MAX_WORDS + 2];

/// Computes fingerprints under one random key.
#[derive(Clone)]
pub(crate) struct Fingerprinter {
    /// The multilinear keys of the low and the high half.
    halves: Box<[HalfKey; 2]>,
    /// `k₀ + k₁·len` of each half for every length the multilinear hash takes, computed once:
    /// the same sum, two multiplications fewer per half and key (8 KiB per store).
    starts: Box<[[u128; 2]; MAX_WORDS * 8 + 1]>,
    /// SipHash's key, for keys longer than [`MAX_WORDS`] words.
    k0: u64,
    k1: u64,
}

impl std::fmt::Debug for Fingerprinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys stay out of logs.
        f.write_str("Fingerprinter")
    }
}

impl Fingerprinter {
    /// A fingerprinter with keys from the operating system's random source. Should that fail,
    /// the keys fall back to the addresses and time of this process, which an outsider cannot
    /// predict well either.
    pub(crate) fn random() -> Self {
        let mut words = [0u64; 2 * 2 * (MAX_WORDS + 2) + 2];
        let mut seed = vec![0u8; words.len() * 8];
        if getrandom::fill(&mut seed).is_err() {
            let fallback = std::collections::hash_map::RandomState::new();
            for (i, chunk) in seed.chunks_exact_mut(8).enumerate() {
                chunk.copy_from_slice(&fallback.hash_one(i).to_le_bytes());
            }
        }
        for (w, chunk) in words.iter_mut().zip(seed.chunks_exact(8)) {
            *w = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        }
        let mut halves = Box::new([[0u128; MAX_WORDS + 2]; 2]);
        let mut next = words.iter();
        for k in halves.iter_mut().flatten() {
            let lo = next.next().copied().unwrap_or_default();
            let hi = next.next().copied().unwrap_or_default();
            *k = u128::from(lo) | (u128::from(hi) << 64);
        }
        let mut starts = Box::new([[0u128; 2]; MAX_WORDS * 8 + 1]);
        for (len, start) in starts.iter_mut().enumerate() {
            for (half, k) in start.iter_mut().zip(halves.iter()) {
                *half = k[0].wrapping_add(k[1].wrapping_mul(len as u128));
            }
        }
        Fingerprinter {
            halves,
            starts,
            k0: next.next().copied().unwrap_or_default(),
            k1: next.next().copied().unwrap_or_default(),
        }
    }

    #[inline(always)]
    pub(crate) fn of(&self, key: &str) -> Fingerprint {
        let bytes = key.as_bytes();
        if bytes.len() > MAX_WORDS * 8 {
            return self.long(bytes);
        }
        let [a, b] = &*self.halves;
        let [mut lo, mut hi] = self.starts[bytes.len()];
        let mut add = |i: usize, word: u64| {
            lo = lo.wrapping_add(a[i + 2].wrapping_mul(u128::from(word)));
            hi = hi.wrapping_add(b[i + 2].wrapping_mul(u128::from(word)));
        };
        let chunks = bytes.chunks_exact(8);
        let tail = chunks.remainder();
        let full = bytes.len() / 8;
        for (i, chunk) in chunks.enumerate() {
            add(i, u64::from_le_bytes(chunk.try_into().unwrap_or_default()));
        }
        if !tail.is_empty() {
            add(full, tail_word(tail));
        }
        Fingerprint {
            lo: (lo >> 64) as u64,
            hi: (hi >> 64) as u64,
        }
    }

    /// SipHash-1-3 for keys beyond the multilinear keys' reach.
    #[cold]
    fn long(&self, bytes: &[u8]) -> Fingerprint {
        let mut h = SipHasher13::new_with_keys(self.k0, self.k1);
        h.write(bytes);
        let hash = h.finish128();
        Fingerprint {
            lo: hash.h1,
            hi: hash.h2,
        }
    }
}

/// The 1 to 7 bytes of a key's last, partial word as a little-endian word padded with zeros,
/// read without a loop: two overlapping reads put every byte in its place, and where they
/// overlap they carry the same byte.
#[inline]
fn tail_word(tail: &[u8]) -> u64 {
    let r = tail.len();
    debug_assert!((1..8).contains(&r));
    if r >= 4 {
        let first = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
        let last = u32::from_le_bytes([tail[r - 4], tail[r - 3], tail[r - 2], tail[r - 1]]);
        u64::from(first) | (u64::from(last) << (8 * (r - 4)))
    } else {
        u64::from(tail[0])
            | (u64::from(tail[r / 2]) << (8 * (r / 2)))
            | (u64::from(tail[r - 1]) << (8 * (r - 1)))
    }
}

/// The hash-table hasher for fingerprints: they are already uniformly random, so it passes the
/// value through.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by `Fingerprint`; fold anything else in for completeness.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Builds [`PassThrough`] hashers.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BuildPassThrough;

impl BuildHasher for BuildPassThrough {
    type Hasher = PassThrough;

    fn build_hasher(&self) -> PassThrough {
        PassThrough(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key's words as the multilinear hash reads them, the slow and obvious way.
    fn words_of(bytes: &[u8]) -> Vec<u64> {
        bytes
            .chunks(8)
            .map(|c| {
                let mut w = [0u8; 8];
                w[..c.len()].copy_from_slice(c);
                u64::from_le_bytes(w)
            })
            .collect()
    }

    #[test]
    fn the_tail_is_read_as_a_zero_padded_word() {
        let bytes = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77];
        for r in 1..8 {
            assert_eq!(
                tail_word(&bytes[..r]),
                words_of(&bytes[..r])[0],
                "{r} bytes"
            );
        }
    }

    #[test]
    fn fingerprints_are_the_multilinear_hash() {
        let f = Fingerprinter::random();
        for len in 0..=MAX_WORDS * 8 {
            let key: String = (0..len)
                .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
                .collect();
            let half = |k: &HalfKey| {
                let mut h = k[0].wrapping_add(k[1].wrapping_mul(len as u128));
                for (i, w) in words_of(key.as_bytes()).into_iter().enumerate() {
                    h = h.wrapping_add(k[i + 2].wrapping_mul(u128::from(w)));
                }
                (h >> 64) as u64
            };
            let fp = f.of(&key);
            assert_eq!(
                (fp.lo, fp.hi),
                (half(&f.halves[0]), half(&f.halves[1])),
                "{len} bytes"
            );
        }
    }

    #[test]
    fn keys_that_differ_only_in_length_or_padding_differ() {
        let f = Fingerprinter::random();
        let keys = [
            "",
            "\0",
            "\0\0",
            "a",
            "a\0",
            "a\0\0\0\0\0\0\0",
            "a\0\0\0\0\0\0\0\0",
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(f.of(a), f.of(b), "{a:?} and {b:?}");
            }
        }
    }

    #[test]
    fn long_keys_use_siphash_and_stay_distinct() {
        let f = Fingerprinter::random();
        let long = "k".repeat(MAX_WORDS * 8 + 1);
        let longer = "k".repeat(MAX_WORDS * 8 + 2);
        assert_eq!(f.of(&long), f.of(&long.clone()));
        assert_ne!(f.of(&long), f.of(&longer));
        assert_ne!(f.of(&long), f.of(&long[..MAX_WORDS * 8]));
    }

    #[test]
    fn two_stores_fingerprint_the_same_key_differently() {
        assert_ne!(
            Fingerprinter::random().of("user:1"),
            Fingerprinter::random().of("user:1")
        );
    }
}
