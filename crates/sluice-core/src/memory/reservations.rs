//! The memory store's reservations: what each took, until it is settled or forgotten.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use super::fingerprint::Fingerprint;
use crate::{Check, Policy, ReservationId, Settlement, StoreError, StoreResult, Timestamp};

/// What one check of a reservation took: which counter, under which policy, how many units.
/// The counter by its fingerprint, as the store's map holds it: no copy of the key to allocate
/// at the reserve, nothing to hash again at the settle.
#[derive(Debug, Clone)]
pub(crate) struct Hold {
    pub(crate) fp: Fingerprint,
    pub(crate) policy: Policy,
    pub(crate) cost: u64,
}

impl Hold {
    /// What `check` of the counter with fingerprint `fp` takes.
    pub(crate) fn of(check: &Check<'_>, fp: Fingerprint) -> Self {
        Hold {
            fp,
            policy: check.policy.clone(),
            cost: check.cost,
        }
    }
}

/// What a reservation took: most take from one counter, whose hold is kept inline, so that a
/// reservation allocates nothing of its own.
#[derive(Debug)]
pub(crate) enum Holds {
    /// One check.
    One(Hold),
    /// Several, in the order of the checks.
    Many(Box<[Hold]>),
}

impl Holds {
    /// The holds, in the order of the checks.
    pub(crate) fn as_slice(&self) -> &[Hold] {
        match self {
            Holds::One(hold) => std::slice::from_ref(hold),
            Holds::Many(holds) => holds,
        }
    }
}

/// One reservation not yet settled (expired ones included, until they are forgotten).
#[derive(Debug)]
struct Open {
    holds: Holds,
    /// When its checks took their units: what a window's refund compares with its start.
    taken_at: Timestamp,
    /// Unsettled by then, it counts as used in full.
    expires: Timestamp,
    /// From then on a settle answers [`Settlement::Unknown`]: the record is dropped.
    forget_at: Timestamp,
}

/// A settle that claimed its reservation: what to give back or charge, counter by counter.
#[derive(Debug)]
pub(crate) struct Claim {
    pub(crate) holds: Holds,
    pub(crate) taken_at: Timestamp,
}

/// How many generations of settled records a shard's share of the bound is cut into: the
/// settled records of a full shard give way a generation at a time, the one settled first.
const GENERATIONS: usize = 16;

/// Every live reservation of one store, up to a bound, in shards by id.
///
/// A reservation and its settle lock one shard, and a shard's maps grow by doubling on their
/// own: one map of a million records stopped every reservation for a third of a second each
/// time it doubled, while a shard moves at most its share. Each shard holds at most its equal
/// share of the bound; ids are uniformly random, so the shares fill evenly.
#[derive(Debug)]
pub(crate) struct Reservations {
    shards: Box<[PaddedRecords]>,
    /// `shards.len() - 1`; the shard count is a power of two.
    mask: usize,
    /// The most records one shard holds.
    share: usize,
    /// The most settled records of one generation.
    generation: usize,
    /// The bound, as a refusal reports it.
    max: usize,
}

/// The fewest records a shard's share of the bound is, while there is more than one shard:
/// a small registry is one shard, whose bound is exact.
const MIN_SHARE: usize = 2_048;

/// The most shards: a million records (the default bound) in shares of about 4,000.
const MAX_SHARDS: usize = 256;

/// One shard's records on a cache line of its own, so that threads locking neighbouring
/// shards do not share it.
#[derive(Debug)]
#[repr(align(128))]
struct PaddedRecords(Mutex<Records>);

/// Maps by reservation id. The ids are random, but a store's caller chooses them, so they are
/// hashed (with a seed of the process's) rather than taken as their own hash.
type ById<V> = HashMap<u128, V, foldhash::fast::RandomState>;

/// The records, and when the first of them can be forgotten once the bound is reached.
///
/// Open and settled records are kept apart. The open ones are the reservations in flight, a
/// small map that the reserve and its settle find in the cache; a settled one is only read
/// again by a repeated settle, so all it keeps is when it is forgotten. The settled ones are
/// kept in generations, in the order they were settled: a settle adds to the newest, a small
/// map, and a full shard drops the oldest whole. A busy registry sits at its bound with
/// settled records (they are kept twice their ttl), and when they were one map per shard,
/// each reservation added to and removed from a map of the shard's whole share, all the
/// shards' maps together tens of megabytes, one cache miss or more each time.
#[derive(Debug, Default)]
struct Records {
    open: ById<Open>,
    /// The settled records, oldest generation first.
    settled: VecDeque<Generation>,
    /// How many settled records the generations hold together.
    settled_len: usize,
    /// When a sweep that freed nothing saw the bound reached, the earliest `expires` left:
    /// until then another sweep cannot free anything, so a full registry refuses without
    /// scanning every record again for each request.
    nothing_to_forget_before: Timestamp,
}

/// Settled records, settled one after another: when each is forgotten.
#[derive(Debug)]
struct Generation {
    forget_at: ById<Timestamp>,
    /// The latest of them: when the whole generation is forgotten.
    last_forget_at: Timestamp,
}

impl Records {
    /// Records held, open and settled.
    fn len(&self) -> usize {
        self.open.len() + self.settled_len
    }

    /// Remembers `id` as settled until `forget_at`, in the newest generation, which is closed
    /// at `generation` records and a new one begun.
    fn settle(&mut self, id: u128, forget_at: Timestamp, generation: usize) {
        if self
            .settled
            .back()
            .is_none_or(|newest| newest.forget_at.len() >= generation)
        {
            // Sized at once: it fills to `generation` and is dropped whole.
            self.settled.push_back(Generation {
                forget_at: ById::with_capacity_and_hasher(generation, Default::default()),
                last_forget_at: Timestamp::EPOCH,
            });
        }
        let Some(newest) = self.settled.back_mut() else {
            return;
        };
        if newest.forget_at.insert(id, forget_at).is_none() {
            self.settled_len += 1;
        }
        newest.last_forget_at = newest.last_forget_at.max(forget_at);
    }

    /// When settled record `id` is forgotten, if it is remembered.
    fn settled_forget_at(&self, id: u128) -> Option<Timestamp> {
        // Newest first: a repeated settle most often follows its first closely.
        self.settled
            .iter()
            .rev()
            .find_map(|g| g.forget_at.get(&id).copied())
    }

    /// Forgets settled record `id`: the one [`Records::settled_forget_at`] finds, should a
    /// caller have reused an id.
    fn forget_settled(&mut self, id: u128) {
        for g in self.settled.iter_mut().rev() {
            if g.forget_at.remove(&id).is_some() {
                self.settled_len -= 1;
                return;
            }
        }
    }

    /// Drops the oldest generation of settled records; answers how many records went.
    fn drop_first_settled(&mut self) -> usize {
        let dropped = self.settled.pop_front().map_or(0, |g| g.forget_at.len());
        self.settled_len -= dropped;
        dropped
    }

    /// Drops every record forgotten by `now`. Generations left less than half full on the
    /// whole are poured into as few as hold them, in order: records of mixed ttls would
    /// otherwise leave a shard of many generations that each keep a few records in a map sized
    /// for `generation`, and never fill the shard to drop them.
    fn drop_forgotten(&mut self, now: Timestamp, generation: usize) {
        self.open.retain(|_, r| r.forget_at > now);
        // A generation whose last record is forgotten goes whole, unread.
        self.settled.retain_mut(|g| {
            g.last_forget_at > now && {
                g.forget_at.retain(|_, &mut forget_at| forget_at > now);
                !g.forget_at.is_empty()
            }
        });
        self.settled_len = self.settled.iter().map(|g| g.forget_at.len()).sum();
        if self.settled_len.saturating_mul(2) < self.settled.len().saturating_mul(generation) {
            let sparse = std::mem::take(&mut self.settled);
            self.settled_len = 0;
            for (id, forget_at) in sparse.into_iter().flat_map(|g| g.forget_at) {
                self.settle(id, forget_at, generation);
            }
        }
    }

    /// Drops up to `most` (at least one) of the open records expired by `now`, those
    /// forgotten soonest first; answers how many went. A quarter of the bound at a time, so
    /// that a registry kept full by a high rate of reservations sorts its records once per
    /// quarter of the bound reserved, not once per reservation. (Settled records have all
    /// gone first.)
    fn drop_oldest_expired(&mut self, now: Timestamp, most: usize) -> usize {
        let mut expired: Vec<(Timestamp, u128)> = self
            .open
            .iter()
            .filter(|(_, r)| now >= r.expires)
            .map(|(&id, r)| (r.forget_at, id))
            .collect();
        let most = most.max(1);
        if expired.len() > most {
            expired.select_nth_unstable(most - 1);
            expired.truncate(most);
        }
        for (_, id) in &expired {
            self.open.remove(id);
        }
        expired.len()
    }
}

impl Reservations {
    /// At most `max` reservations remembered at once.
    pub(crate) fn new(max: usize) -> Self {
        let max = max.max(1);
        let shards = match max / MIN_SHARE {
            0 => 1,
            n => (1 << n.ilog2()).min(MAX_SHARDS),
        };
        Reservations {
            shards: (0..shards)
                .map(|_| PaddedRecords(Mutex::new(Records::default())))
                .collect(),
            mask: shards - 1,
            share: max.div_ceil(shards),
            generation: max.div_ceil(shards).div_ceil(GENERATIONS),
            max,
        }
    }

    /// Which shard holds reservation `id`: its lowest bits, random in every id.
    fn index(&self, id: ReservationId) -> usize {
        (id.as_u128() as usize) & self.mask
    }

    /// The shard holding reservation `id`, locked.
    fn shard(&self, id: ReservationId) -> std::sync::MutexGuard<'_, Records> {
        lock(&self.shards[self.index(id)].0)
    }

    /// Makes sure reservation `id` can be recorded at `now`, dropping records of its shard if
    /// the shard's share of the bound is reached, records only kept to tell a later settle why
    /// it is refused (a second settle of one dropped early answers [`Settlement::Unknown`]
    /// instead, and gives back nothing either way): first settled ones, those settled first, a
    /// generation (a sixteenth of the share) at a time; when there are none, the forgotten
    /// ones, then the expired ones forgotten soonest. Only open reservations hold the bound. Called before the checks consume, so
    /// that a full registry refuses the request rather than consuming units nobody could give
    /// back.
    pub(crate) fn make_room(&self, id: ReservationId, now: Timestamp) -> StoreResult<()> {
        let mut records = self.shard(id);
        let (share, generation) = (self.share, self.generation);
        let full = Err(StoreError::Full { max_keys: self.max });
        if records.len() < share {
            return Ok(());
        }
        // Settled records first, a generation at a time: no pass over the whole shard.
        while !records.settled.is_empty() {
            if records.drop_first_settled() > 0 {
                return Ok(());
            }
        }
        if now < records.nothing_to_forget_before {
            return full;
        }
        records.drop_forgotten(now, generation);
        if records.len() < share {
            return Ok(());
        }
        if records.drop_oldest_expired(now, share / 4) > 0 {
            return Ok(());
        }
        // Every record is open: the first to close is the first that can go.
        records.nothing_to_forget_before = records
            .open
            .values()
            .map(|r| r.expires)
            .min()
            .unwrap_or(now);
        full
    }

    /// Records a reservation whose checks consumed at `now`. It is remembered, settled or not,
    /// for twice its ttl, so that a late or repeated settle is told what happened to it.
    pub(crate) fn insert(&self, id: ReservationId, holds: Holds, now: Timestamp, ttl: Duration) {
        let expires = now.saturating_add(ttl);
        let record = Open {
            holds,
            taken_at: now,
            expires,
            forget_at: expires.saturating_add(ttl),
        };
        self.shard(id).open.insert(id.as_u128(), record);
    }

    /// Claims the reservation `id` for a settle at `now`: only the first settle of a live
    /// reservation gets its holds; every other is told why not.
    pub(crate) fn claim(&self, id: ReservationId, now: Timestamp) -> Result<Claim, Settlement> {
        let generation = self.generation;
        let mut guard = self.shard(id);
        let records = &mut *guard;
        let key = id.as_u128();
        let Entry::Occupied(record) = records.open.entry(key) else {
            return match records.settled_forget_at(key) {
                Some(forget_at) if now < forget_at => Err(Settlement::AlreadySettled),
                Some(_) => {
                    records.forget_settled(key);
                    Err(Settlement::Unknown)
                }
                None => Err(Settlement::Unknown),
            };
        };
        if now >= record.get().forget_at {
            record.remove();
            return Err(Settlement::Unknown);
        }
        if now >= record.get().expires {
            return Err(Settlement::Expired);
        }
        // Settled, it answers only `AlreadySettled` from now on: its holds go to the settle.
        let record = record.remove();
        records.settle(key, record.forget_at, generation);
        // A settled record can make room at once.
        records.nothing_to_forget_before = Timestamp::EPOCH;
        Ok(Claim {
            holds: record.holds,
            taken_at: record.taken_at,
        })
    }

    /// Drops every record forgotten by `now`; returns how many.
    pub(crate) fn sweep(&self, now: Timestamp) -> usize {
        let generation = self.generation;
        let sweep_one = |shard: &PaddedRecords| {
            let mut records = lock(&shard.0);
            let before = records.len();
            records.drop_forgotten(now, generation);
            before - records.len()
        };
        self.shards.iter().map(sweep_one).sum()
    }

    /// How many reservations are remembered, settled and expired ones included.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(&s.0).len()).sum()
    }
}

/// Locks the records. Every update is one map operation, so a poisoned lock is still consistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);
    const START: Timestamp = Timestamp::from_secs(1_000);
    /// An id no test records, for a reservation that only asks for room.
    const NEW: ReservationId = ReservationId::from_u128(u128::MAX);

    /// A registry of `max` records, full of open reservations `0..max` taken a millisecond
    /// apart from [`START`] for [`TTL`].
    fn full(max: u64) -> Reservations {
        let registry = Reservations::new(usize::try_from(max).unwrap());
        for id in 0..max {
            let at = START.saturating_add(Duration::from_millis(id));
            let id = ReservationId::from_u128(id.into());
            registry.make_room(id, at).unwrap();
            registry.insert(id, Holds::Many(Box::new([])), at, TTL);
        }
        registry
    }

    fn at(millis: u64) -> Timestamp {
        START.saturating_add(Duration::from_millis(millis))
    }

    /// Settled records give way to new reservations, those settled first, a generation at a
    /// time; open ones never do.
    #[test]
    fn a_full_registry_drops_settled_records_before_refusing() {
        // One shard of 32, in generations of two settled records.
        let registry = full(32);
        assert_eq!(registry.generation, 2);
        let later = at(1_000);
        for id in [5, 1, 3] {
            registry.claim(ReservationId::from_u128(id), later).unwrap();
        }
        // Full: the first generation goes, the two records settled first.
        registry.make_room(NEW, later).unwrap();
        assert_eq!(registry.len(), 30);
        let settle = |id: u128| registry.claim(ReservationId::from_u128(id), later).err();
        assert_eq!(settle(5), Some(Settlement::Unknown), "dropped");
        assert_eq!(settle(1), Some(Settlement::Unknown), "dropped");
        assert_eq!(settle(3), Some(Settlement::AlreadySettled), "kept");
        for open in (0..32).filter(|id| ![5, 1, 3].contains(id)) {
            assert!(settle(open).is_none(), "{open} is still open and settles");
        }
    }

    /// A generation's records are each forgotten at their own time: a sweep between two of
    /// them drops the first and keeps the second, which still answers a second settle.
    #[test]
    fn settled_records_of_one_generation_are_forgotten_each_at_its_time() {
        let registry = Reservations::new(32);
        let (short, long) = (ReservationId::from_u128(1), ReservationId::from_u128(2));
        registry.insert(short, Holds::Many(Box::new([])), at(0), TTL);
        registry.insert(long, Holds::Many(Box::new([])), at(0), 3 * TTL);
        registry.claim(short, at(1)).unwrap();
        registry.claim(long, at(1)).unwrap();
        // Twice the short ttl on: only the short one is forgotten.
        assert_eq!(registry.sweep(at(20_000)), 1);
        assert_eq!(registry.len(), 1);
        assert_eq!(
            registry.claim(short, at(20_000)).err(),
            Some(Settlement::Unknown)
        );
        assert_eq!(
            registry.claim(long, at(59_999)).err(),
            Some(Settlement::AlreadySettled)
        );
        assert_eq!(registry.sweep(at(60_000)), 1);
        assert_eq!(registry.len(), 0);
    }

    /// A registry kept full by reservations settled as they come gives way a generation of
    /// settled records at a time, each in turn, and never refuses: no reservation waits for a pass
    /// over the whole registry.
    #[test]
    fn a_registry_kept_full_gives_way_a_few_records_at_a_time() {
        let max = 1_024;
        let registry = full(max);
        for id in 0..max {
            registry
                .claim(ReservationId::from_u128(id.into()), at(id))
                .unwrap();
        }
        for id in max..4 * max {
            let now = at(id);
            registry
                .make_room(ReservationId::from_u128(id.into()), now)
                .expect("a settled record gives way");
            assert!(registry.len() < 1_024);
            assert!(
                registry.len() >= 1_024 - 1_024 / GENERATIONS,
                "{} left",
                registry.len()
            );
            registry.insert(
                ReservationId::from_u128(id.into()),
                Holds::Many(Box::new([])),
                now,
                TTL,
            );
            registry
                .claim(ReservationId::from_u128(id.into()), now)
                .unwrap();
        }
        // The records settled last are still told apart from ones never seen.
        let last = ReservationId::from_u128((4 * max - 1).into());
        assert_eq!(
            registry.claim(last, at(4 * max)).err(),
            Some(Settlement::AlreadySettled)
        );
    }

    /// Random ids, the same in every run.
    fn ids() -> impl FnMut() -> ReservationId {
        use proptest::prelude::Rng;
        use proptest::test_runner::{RngAlgorithm, TestRng};
        let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
        move || {
            let (hi, lo) = (rng.next_u64(), rng.next_u64());
            ReservationId::from_u128(u128::from(hi) << 64 | u128::from(lo))
        }
    }

    /// A small registry is one shard, so its bound is exact; the default bound of a million
    /// is 256 shares of 3,907.
    #[test]
    fn shards_follow_the_bound() {
        for (max, shards, share) in [
            (1, 1, 1),
            (4_095, 1, 4_095),
            (4_096, 2, 2_048),
            (65_536, 32, 2_048),
            (1_000_000, 256, 3_907),
        ] {
            let registry = Reservations::new(max);
            assert_eq!(
                (registry.shards.len(), registry.share),
                (shards, share),
                "{max}"
            );
        }
    }

    /// A registry in shards fills them evenly: the first refusal comes within a few percent of
    /// the bound (95% here), never past it, and only for ids whose shard is full; a settle in
    /// that shard makes room for it again.
    #[test]
    fn a_registry_in_shards_holds_its_bound_evenly() {
        let max = 65_536;
        let registry = Reservations::new(max);
        let now = at(0);
        let mut next = ids();
        let mut recorded = Vec::new();
        let refused = loop {
            let id = next();
            if registry.make_room(id, now).is_err() {
                break id;
            }
            registry.insert(id, Holds::Many(Box::new([])), now, TTL);
            recorded.push(id);
        };
        let held = registry.len();
        assert!(
            held <= max && held * 10 >= max * 9,
            "refused at {held} of {max}"
        );
        let full_shard = registry.index(refused);
        // Another shard still has room.
        let elsewhere = std::iter::repeat_with(&mut next)
            .find(|&id| registry.index(id) != full_shard)
            .unwrap();
        registry
            .make_room(elsewhere, now)
            .expect("its shard has room");
        // A settle in the full shard makes room there.
        let neighbour = *recorded
            .iter()
            .find(|&&id| registry.index(id) == full_shard)
            .unwrap();
        registry.claim(neighbour, now).unwrap();
        registry
            .make_room(refused, now)
            .expect("the settled record gives way");
        assert_eq!(
            registry.claim(neighbour, now).err(),
            Some(Settlement::Unknown)
        );
    }

    /// Open records hold the bound until the first of them expires.
    #[test]
    fn a_registry_full_of_open_records_refuses_until_one_expires() {
        let registry = full(2);
        let full_error = Err(StoreError::Full { max_keys: 2 });
        assert_eq!(registry.make_room(NEW, at(9_999)), full_error);
        registry
            .make_room(NEW, at(10_000))
            .expect("an expired record makes room");
        assert_eq!(registry.len(), 1);
    }

    /// A settle on a registry that refused for want of room makes room at once.
    #[test]
    fn a_settle_makes_room_in_a_full_registry() {
        let registry = full(2);
        assert!(registry.make_room(NEW, at(5)).is_err());
        registry.claim(ReservationId::from_u128(1), at(5)).unwrap();
        registry
            .make_room(NEW, at(5))
            .expect("the settled record gives way");
        assert_eq!(registry.len(), 1);
    }

    /// A settled record answers a second settle until twice its ttl has passed, then is
    /// forgotten like an open one; it keeps no holds.
    #[test]
    fn a_settled_record_tells_a_second_settle_until_it_is_forgotten() {
        let registry = Reservations::new(8);
        let id = ReservationId::from_u128(7);
        let hold = Hold {
            fp: Fingerprint { lo: 1, hi: 2 },
            policy: Policy::FixedWindow(
                crate::FixedWindow::new(10, TTL, crate::Alignment::FirstRequest).unwrap(),
            ),
            cost: 3,
        };
        registry.insert(id, Holds::One(hold), at(0), TTL);
        let claim = registry
            .claim(id, at(1))
            .expect("the first settle claims it");
        assert_eq!(claim.holds.as_slice().len(), 1);
        assert_eq!(claim.holds.as_slice()[0].cost, 3);
        assert_eq!(claim.taken_at, at(0));
        assert_eq!(registry.len(), 1, "still remembered, as settled");
        assert_eq!(
            registry.claim(id, at(19_999)).err(),
            Some(Settlement::AlreadySettled)
        );
        assert_eq!(
            registry.claim(id, at(20_000)).err(),
            Some(Settlement::Unknown)
        );
        assert_eq!(
            registry.len(),
            0,
            "forgotten by the settle that found it too old"
        );
        assert_eq!(
            registry.claim(id, at(20_001)).err(),
            Some(Settlement::Unknown)
        );
    }

    /// A full shard whose oldest generation was emptied by settles that found its records
    /// forgotten drops the next generation rather than refusing.
    #[test]
    fn an_emptied_generation_gives_way_to_the_next() {
        // One shard of 32, in generations of two settled records.
        let registry = Reservations::new(32);
        let id = |n: u128| ReservationId::from_u128(n);
        for n in 0..30 {
            let ttl = if n < 2 { TTL / 10 } else { TTL };
            registry.insert(id(n), Holds::Many(Box::new([])), at(0), ttl);
        }
        for n in 0..3 {
            registry.claim(id(n), at(500)).unwrap();
        }
        // Reservations 0 and 1 are forgotten at 2 s: their second settles empty the oldest
        // generation. Reservation 2 is alone in the next.
        for n in 0..2 {
            assert_eq!(
                registry.claim(id(n), at(2_000)).err(),
                Some(Settlement::Unknown)
            );
        }
        for n in 30..34 {
            registry.insert(id(n), Holds::Many(Box::new([])), at(2_000), TTL);
        }
        assert_eq!(registry.len(), 32);
        registry
            .make_room(NEW, at(2_000))
            .expect("the settled reservation 2 gives way");
        assert_eq!(
            registry.claim(id(2), at(2_000)).err(),
            Some(Settlement::Unknown)
        );
    }

    /// A sweep that leaves generations mostly empty pours their records into as few as hold
    /// them, each still answering a second settle until its own time.
    #[test]
    fn a_sweep_gathers_sparse_generations() {
        // One shard of 64, in generations of four settled records.
        let registry = Reservations::new(64);
        assert_eq!(registry.generation, 4);
        let id = |n: u128| ReservationId::from_u128(n);
        // Every generation: one reservation of three times the ttl, three of the ttl.
        for n in 0..16 {
            let ttl = if n % 4 == 0 { 3 * TTL } else { TTL };
            registry.insert(id(n), Holds::Many(Box::new([])), at(0), ttl);
            registry.claim(id(n), at(1)).unwrap();
        }
        let generations = || lock(&registry.shards[0].0).settled.len();
        assert_eq!(generations(), 4);
        assert_eq!(registry.sweep(at(20_000)), 12);
        assert_eq!(generations(), 1, "four records, one generation");
        for n in (0..16).step_by(4) {
            assert_eq!(
                registry.claim(id(n), at(20_000)).err(),
                Some(Settlement::AlreadySettled)
            );
        }
        assert_eq!(registry.sweep(at(60_000)), 4);
        assert_eq!(generations(), 0);
    }

    /// Twice their ttl on, records are forgotten by one sweep, all at once.
    #[test]
    fn forgotten_records_all_go_at_once() {
        let registry = full(2);
        assert!(registry.make_room(NEW, at(5_000)).is_err());
        assert_eq!(registry.len(), 2);
        registry.make_room(NEW, at(20_001)).unwrap();
        assert_eq!(registry.len(), 0, "both forgotten at once");
    }
}
