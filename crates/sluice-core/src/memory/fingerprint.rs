//! Keys are stored as 128-bit keyed fingerprints, not as strings.
//!
//! A fingerprint is SipHash-1-3 with a random 128-bit key chosen per store, so an attacker who
//! does not know the key cannot construct colliding counter keys, and two distinct keys share a
//! counter with probability about `n² / 2¹²⁹`: for a billion keys, 10⁻²¹. In exchange every
//! tracked key costs 16 bytes whatever its length, and a flood of long random keys cannot grow
//! memory beyond the key limit times the entry size. `docs/memory-store.md` has the numbers.

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

/// Computes fingerprints under one random key.
#[derive(Debug, Clone)]
pub(crate) struct Fingerprinter {
    k0: u64,
    k1: u64,
}

impl Fingerprinter {
    /// A fingerprinter with a key from the operating system's random source. Should that fail,
    /// the key falls back to the addresses and time of this process, which an outsider cannot
    /// predict well either.
    pub(crate) fn random() -> Self {
        let mut seed = [0u8; 16];
        if getrandom::fill(&mut seed).is_err() {
            let fallback = std::collections::hash_map::RandomState::new();
            seed[..8].copy_from_slice(&fallback.hash_one(0u8).to_le_bytes());
            seed[8..].copy_from_slice(&fallback.hash_one(1u8).to_le_bytes());
        }
        let (a, b) = seed.split_at(8);
        Fingerprinter {
            k0: u64::from_le_bytes(a.try_into().unwrap_or_default()),
            k1: u64::from_le_bytes(b.try_into().unwrap_or_default()),
        }
    }

    pub(crate) fn of(&self, key: &str) -> Fingerprint {
        let mut h = SipHasher13::new_with_keys(self.k0, self.k1);
        h.write(key.as_bytes());
        let hash = h.finish128();
        Fingerprint {
            lo: hash.h1,
            hi: hash.h2,
        }
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
