//! One shard of the memory store: a hash map from fingerprints to entries, with expiry and the
//! eviction policy.

use std::collections::HashMap;

use super::fingerprint::{BuildPassThrough, Fingerprint};
use super::state::{Meta, State};
use crate::StoreError;

/// A tracked counter: its state with the shard's bookkeeping inside, 24 bytes, so a map slot
/// with its 16-byte fingerprint is 40.
pub(crate) type Entry = State;

/// The fewest entries a shard holds before it sweeps expired ones on insertion.
const MIN_SWEEP_LEN: usize = 64;

/// A fraction of a full shard's capacity freed by one eviction pass, so that the linear pass is
/// paid once per many insertions.
const EVICT_FRACTION: usize = 8;

#[derive(Debug)]
pub(crate) struct Shard {
    pub(crate) map: HashMap<Fingerprint, Entry, BuildPassThrough>,
    /// The most entries this shard may hold.
    cap: usize,
    /// Sweep expired entries when an insertion finds the map this long: twice its length after
    /// the last sweep, so sweeping costs O(1) amortized per insertion.
    next_sweep: usize,
    /// After a pass found nothing to evict (every entry limited), new keys are refused without
    /// another pass until this second: a flood of keys that each exhaust their limit would
    /// otherwise make every new key scan the whole shard.
    refuse_until: u32,
    /// Eviction passes made, for tests.
    passes: usize,
}

impl Shard {
    pub(crate) fn new(cap: usize) -> Self {
        Shard {
            map: HashMap::with_hasher(BuildPassThrough),
            cap,
            next_sweep: MIN_SWEEP_LEN,
            refuse_until: 0,
            passes: 0,
        }
    }

    /// Drops every entry expired at `now_secs`. Returns how many were dropped.
    pub(crate) fn sweep(&mut self, now_secs: u32) -> usize {
        let before = self.map.len();
        self.map.retain(|_, e| e.meta().expires > now_secs);
        self.next_sweep = (self.map.len() * 2).max(MIN_SWEEP_LEN);
        before - self.map.len()
    }

    /// Makes room for `extra` new entries at `now_secs`, or says the shard is full.
    ///
    /// First expired entries go, which changes nothing any caller can observe. If that is not
    /// enough, entries that are not limited go, those closest to expiring first: they are the
    /// nearest to full, so forgetting them gives away the least. A limited entry is never
    /// dropped before it expires; if only such entries remain, the new key is refused.
    pub(crate) fn make_room(
        &mut self,
        extra: usize,
        now_secs: u32,
        max_keys: usize,
    ) -> Result<(), StoreError> {
        let wanted = self.map.len() + extra;
        if wanted > self.cap && now_secs < self.refuse_until {
            return Err(StoreError::Full { max_keys });
        }
        if wanted >= self.next_sweep || wanted > self.cap {
            self.sweep(now_secs);
        }
        if self.map.len() + extra <= self.cap {
            return Ok(());
        }
        let goal = (self.cap / EVICT_FRACTION).max(extra);
        self.passes += 1;
        let mut expiries: Vec<u32> = self
            .map
            .values()
            .map(Entry::meta)
            .filter(|m| !m.limited)
            .map(|m| m.expires)
            .collect();
        if !expiries.is_empty() {
            let nth = goal.min(expiries.len()) - 1;
            let (below, threshold, _) = expiries.select_nth_unstable(nth);
            let threshold = *threshold;
            // Expiries are whole seconds, so many entries may tie at the threshold: drop those
            // strictly below it, then only as many at it as the goal still needs.
            let strictly_below = below.iter().filter(|&&x| x < threshold).count();
            let mut at_threshold = (nth + 1).saturating_sub(strictly_below);
            self.map.retain(|_, e| {
                let Meta { expires, limited } = e.meta();
                if limited || expires > threshold {
                    true
                } else if expires < threshold {
                    false
                } else if at_threshold > 0 {
                    at_threshold -= 1;
                    false
                } else {
                    true
                }
            });
        }
        if self.map.len() + extra <= self.cap {
            Ok(())
        } else {
            // Every entry is limited: nothing frees before the next second (a limited entry
            // expires, or one is admitted again and stops being limited).
            self.refuse_until = now_secs.saturating_add(1);
            Err(StoreError::Full { max_keys })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(expires: u32) -> Entry {
        let meta = Meta {
            expires,
            limited: true,
        };
        State::Gcra(meta, crate::Timestamp::EPOCH)
    }

    #[test]
    fn a_shard_full_of_limited_entries_refuses_without_scanning_again_within_a_second() {
        let mut shard = Shard::new(4);
        for i in 0..4u32 {
            let i = i as u64;
            shard.map.insert(Fingerprint { lo: i, hi: i }, limited(100));
        }
        assert!(shard.make_room(1, 10, 4).is_err());
        assert_eq!(shard.passes, 1);
        // The same second: refused at once.
        for _ in 0..1000 {
            assert!(shard.make_room(1, 10, 4).is_err());
        }
        assert_eq!(shard.passes, 1);
        // The next second scans again; an entry that stopped being limited makes room.
        shard.map.values_mut().next().unwrap().meta_mut().limited = false;
        assert!(shard.make_room(1, 11, 4).is_ok());
        assert_eq!(shard.passes, 2);
        // Room already there is never refused, whatever the last pass found.
        assert!(shard.make_room(1, 11, 4).is_ok());
    }

    #[test]
    fn entries_stay_compact() {
        // A map slot is the 16-byte fingerprint plus the entry: 40 bytes, which keeps a tracked
        // token-bucket or GCRA key under 100 bytes with the map's spare capacity included (a
        // table just past a doubling is under half full: 2.2 slots of 41 bytes per key).
        assert_eq!(std::mem::size_of::<Meta>(), 5);
        assert_eq!(std::mem::size_of::<Entry>(), 24);
        assert_eq!(std::mem::size_of::<(Fingerprint, Entry)>(), 40);
    }
}
