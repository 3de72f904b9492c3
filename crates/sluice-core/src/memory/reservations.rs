//! The memory store's reservations: what each took, until it is settled or forgotten.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::{Policy, ReservationId, Settlement, StoreError, StoreResult, Timestamp};

/// What one check of a reservation took: which counter, under which policy, how many units.
#[derive(Debug, Clone)]
pub(crate) struct Hold {
    pub(crate) key: Box<str>,
    pub(crate) policy: Policy,
    pub(crate) cost: u64,
}

/// One reservation.
#[derive(Debug)]
struct Record {
    holds: Box<[Hold]>,
    /// When its checks took their units: what a window's refund compares with its start.
    taken_at: Timestamp,
    /// Unsettled by then, it counts as used in full.
    expires: Timestamp,
    /// From then on a settle answers [`Settlement::Unknown`]: the record is dropped.
    forget_at: Timestamp,
    settled: bool,
}

/// A settle that claimed its reservation: what to give back or charge, counter by counter.
#[derive(Debug)]
pub(crate) struct Claim {
    pub(crate) holds: Box<[Hold]>,
    pub(crate) taken_at: Timestamp,
}

/// Every live reservation of one store, up to a bound.
#[derive(Debug)]
pub(crate) struct Reservations {
    records: Mutex<HashMap<u128, Record>>,
    max: usize,
}

impl Reservations {
    /// At most `max` reservations remembered at once.
    pub(crate) fn new(max: usize) -> Self {
        Reservations {
            records: Mutex::new(HashMap::new()),
            max: max.max(1),
        }
    }

    /// Makes sure one more can be recorded at `now`, dropping forgotten records if the bound is
    /// reached. Called before the checks consume, so that a full registry refuses the request
    /// rather than consuming units nobody could give back.
    pub(crate) fn make_room(&self, now: Timestamp) -> StoreResult<()> {
        let mut records = lock(&self.records);
        if records.len() < self.max {
            return Ok(());
        }
        records.retain(|_, r| r.forget_at > now);
        if records.len() < self.max {
            return Ok(());
        }
        Err(StoreError::Full { max_keys: self.max })
    }

    /// Records a reservation whose checks consumed at `now`. It is remembered, settled or not,
    /// for twice its ttl, so that a late or repeated settle is told what happened to it.
    pub(crate) fn insert(
        &self,
        id: ReservationId,
        holds: Box<[Hold]>,
        now: Timestamp,
        ttl: Duration,
    ) {
        let expires = now.saturating_add(ttl);
        let record = Record {
            holds,
            taken_at: now,
            expires,
            forget_at: expires.saturating_add(ttl),
            settled: false,
        };
        lock(&self.records).insert(id.as_u128(), record);
    }

    /// Claims the reservation `id` for a settle at `now`: only the first settle of a live
    /// reservation gets its holds; every other is told why not.
    pub(crate) fn claim(&self, id: ReservationId, now: Timestamp) -> Result<Claim, Settlement> {
        let mut records = lock(&self.records);
        let Some(record) = records.get_mut(&id.as_u128()) else {
            return Err(Settlement::Unknown);
        };
        if now >= record.forget_at {
            records.remove(&id.as_u128());
            return Err(Settlement::Unknown);
        }
        if record.settled {
            return Err(Settlement::AlreadySettled);
        }
        if now >= record.expires {
            return Err(Settlement::Expired);
        }
        record.settled = true;
        Ok(Claim {
            holds: record.holds.clone(),
            taken_at: record.taken_at,
        })
    }

    /// Drops every record forgotten by `now`; returns how many.
    pub(crate) fn sweep(&self, now: Timestamp) -> usize {
        let mut records = lock(&self.records);
        let before = records.len();
        records.retain(|_, r| r.forget_at > now);
        before - records.len()
    }

    /// How many reservations are remembered, settled and expired ones included.
    pub(crate) fn len(&self) -> usize {
        lock(&self.records).len()
    }
}

/// Locks the records. Every update is one map operation, so a poisoned lock is still consistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
