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

/// The most settled records one reservation makes give way for it when the bound is reached.
const SETTLED_BATCH: usize = 64;

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
/// again by a repeated settle, so all it keeps is when it is forgotten. A registry kept at its
/// bound by settled records (the normal state of a busy one, as they are kept twice their
/// ttl) then touches a map of a million 32-byte entries once per reservation to add one and
/// once to drop one, where it touched one of a million full records (and their holds, on the
/// heap) three times.
#[derive(Debug, Default)]
struct Records {
    open: ById<Open>,
    /// The settled records: when each is forgotten.
    settled: ById<Timestamp>,
    /// The settled records' ids, in the order they were settled: the first to give way when
    /// the bound is reached. An id whose record has gone meanwhile is skipped.
    settle_order: VecDeque<u128>,
    /// When a sweep that freed nothing saw the bound reached, the earliest `expires` left:
    /// until then another sweep cannot free anything, so a full registry refuses without
    /// scanning every record again for each request.
    nothing_to_forget_before: Timestamp,
}

impl Records {
    /// Records held, open and settled.
    fn len(&self) -> usize {
        self.open.len() + self.settled.len()
    }

    /// Drops up to `most` (at least one) settled records, those settled first; answers how
    /// many went. Each costs one map removal, so a registry kept full by a high rate of
    /// reservations gives way a few records at a time, never all at once.
    fn drop_first_settled(&mut self, most: usize) -> usize {
        let mut dropped = 0;
        while dropped < most.max(1) {
            let Some(id) = self.settle_order.pop_front() else {
                break;
            };
            if self.settled.remove(&id).is_some() {
                dropped += 1;
            }
        }
        dropped
    }

    /// Drops every record forgotten by `now`.
    fn drop_forgotten(&mut self, now: Timestamp) {
        self.open.retain(|_, r| r.forget_at > now);
        self.settled.retain(|_, &mut forget_at| forget_at > now);
        let settled = &self.settled;
        self.settle_order.retain(|id| settled.contains_key(id));
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
    /// few at a time; when there are none, the forgotten ones, then the expired ones forgotten
    /// soonest. Only open reservations hold the bound. Called before the checks consume, so
    /// that a full registry refuses the request rather than consuming units nobody could give
    /// back.
    pub(crate) fn make_room(&self, id: ReservationId, now: Timestamp) -> StoreResult<()> {
        let mut records = self.shard(id);
        let share = self.share;
        let full = Err(StoreError::Full { max_keys: self.max });
        if records.len() < share {
            return Ok(());
        }
        // Settled records first, a few at a time: no pass over the whole shard.
        if records.drop_first_settled(share.div_ceil(4).min(SETTLED_BATCH)) > 0 {
            return Ok(());
        }
        if now < records.nothing_to_forget_before {
            return full;
        }
        records.drop_forgotten(now);
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
        let mut guard = self.shard(id);
        let Records {
            open,
            settled,
            settle_order,
            nothing_to_forget_before,
        } = &mut *guard;
        let key = id.as_u128();
        let Entry::Occupied(record) = open.entry(key) else {
            return match settled.get(&key) {
                Some(&forget_at) if now < forget_at => Err(Settlement::AlreadySettled),
                Some(_) => {
                    settled.remove(&key);
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
        settled.insert(key, record.forget_at);
        settle_order.push_back(key);
        // A settled record can make room at once.
        *nothing_to_forget_before = Timestamp::EPOCH;
        Ok(Claim {
            holds: record.holds,
            taken_at: record.taken_at,
        })
    }

    /// Drops every record forgotten by `now`; returns how many.
    pub(crate) fn sweep(&self, now: Timestamp) -> usize {
        let sweep_one = |shard: &PaddedRecords| {
            let mut records = lock(&shard.0);
            let before = records.len();
            records.drop_forgotten(now);
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

    /// Settled records give way to new reservations, those settled first; open ones never do.
    #[test]
    fn a_full_registry_drops_settled_records_before_refusing() {
        let registry = full(8);
        let later = at(1_000);
        for id in [5, 1, 3] {
            registry.claim(ReservationId::from_u128(id), later).unwrap();
        }
        // Full: a quarter of the bound goes, the two records settled first.
        registry.make_room(NEW, later).unwrap();
        assert_eq!(registry.len(), 6);
        let settle = |id: u128| registry.claim(ReservationId::from_u128(id), later).err();
        assert_eq!(settle(5), Some(Settlement::Unknown), "dropped");
        assert_eq!(settle(1), Some(Settlement::Unknown), "dropped");
        assert_eq!(settle(3), Some(Settlement::AlreadySettled), "kept");
        for open in [0, 2, 4, 6, 7] {
            assert!(settle(open).is_none(), "{open} is still open and settles");
        }
    }

    /// A registry kept full by reservations settled as they come gives way a few settled
    /// records at a time, each in turn, and never refuses: no reservation waits for a pass
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
                registry.len() >= 1_024 - SETTLED_BATCH,
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
