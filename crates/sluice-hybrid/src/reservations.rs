//! Reservations on the hybrid store: [`Store::reserve`](sluice_core::Store::reserve),
//! [`Store::settle`](sluice_core::Store::settle) and [`Store::refund`](sluice_core::Store::refund).
//!
//! A reservation is decided here like a check of its amount (within this instance's allowance,
//! all or none), and its record is written to Redis in the Redis store's record format (a list
//! under [`RedisStore::reservation_key`](sluice_redis::RedisStore::reservation_key): `open`, the
//! end of its ttl on Redis time, then the items) by `record.lua`, so that every instance that
//! shares the Redis can settle it. A settle claims the record atomically (`claim.lua`: of two
//! settles on any instances, one gets the items and the other finds it settled), then gives back
//! or charges each counter here, as local units that the sync carries to the others.
//!
//! The items are `hybrid`, then five per check: the counter's identity, its policy in the form
//! of [`policy_text`], the cost, when it was taken and the end of the window it was taken in (ns
//! on the application clock; for a bucket, when it was taken). The policy travels with the
//! record, so that an instance that does not track the counter can still give back to it.

use std::sync::LazyLock;

use sluice_core::{
    Adjustment, Check, Clock, Decision, Lease, Policy, Refund, ReservationId, Settlement, Store,
    StoreError, StoreResult, Timestamp,
};
use sluice_redis::{Script, Value};

use crate::entry::Entry;
use crate::local::{
    current_window_end, decide, is_bucket, parse_policy, policy_text, span, window_end,
};
use crate::{HybridStore, lock};

/// Writes a reservation's record: see `record.lua`.
static RECORD: LazyLock<Script> = LazyLock::new(|| Script::assemble(include_str!("record.lua")));

/// Claims a reservation's record for one settle: see `claim.lua`.
static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::assemble(include_str!("claim.lua")));

/// The first item of a hybrid record: a record of the Redis store under the same prefix, whose
/// items mean otherwise, is told apart.
const MARK: &str = "hybrid";

/// The record's items per check: identity, policy, cost, taken at, window end.
const ITEMS_PER_CHECK: usize = 5;

/// The longest ttl the record script holds exactly: Lua's doubles, below 2^53 ns (104 days).
const MAX_TTL_NANOS: u64 = 1 << 53;

impl<C: Clock + 'static> HybridStore<C> {
    /// [`Store::reserve`](sluice_core::Store::reserve): decides `checks` here, and when all
    /// admit, writes the record. Should the write fail, the units stay taken and the
    /// reservation counts as used in full: giving them back could give back twice, should the
    /// record have been written after all (a call that timed out) and be settled.
    pub(crate) async fn reserve_here(
        &self,
        checks: &[Check<'_>],
        lease: Lease<'_>,
    ) -> StoreResult<Vec<Decision>> {
        let ttl = u64::try_from(lease.ttl.as_nanos())
            .ok()
            .filter(|&ttl| ttl < MAX_TTL_NANOS)
            .ok_or_else(|| {
                StoreError::Rejected(format!(
                    "a reservation's ttl of {:?} is longer than the hybrid store can hold (about \
                     104 days: its scripts compute in Lua doubles, exact below 2^53 ns)",
                    lease.ttl
                ))
            })?;
        let inner = &self.inner;
        if inner.away.load(std::sync::atomic::Ordering::Relaxed) {
            // The record could not be written: nothing is taken, and the rule's
            // `on_store_error` decides as for a check.
            return Err(StoreError::Unavailable(
                "the hybrid store's last sync with Redis failed, so a reservation cannot be \
                 recorded"
                    .to_owned(),
            ));
        }
        let now = inner.clock.now();
        let decisions = self.check_local(checks)?;
        if !decisions.iter().all(|d| d.allowed) {
            return Ok(decisions);
        }
        // The clock's offset and the ttl, then the record's items.
        let mut args = Vec::with_capacity(3 + ITEMS_PER_CHECK * checks.len());
        args.push(inner.redis.time_offset().to_string());
        args.push(ttl.to_string());
        args.push(MARK.to_owned());
        {
            let keys = lock(&inner.keys);
            for c in checks {
                // The window the units were counted in, as this instance's state holds it now.
                let end = keys
                    .get(c.key)
                    .filter(|e| e.policy == *c.policy)
                    .map_or(now, |e| match window_end(&e.policy, &e.state) {
                        Timestamp::EPOCH => now,
                        end => end,
                    });
                let policy = policy_text(c.policy).ok_or_else(|| crate::check::unheld(c.policy))?;
                args.push(c.key.to_owned());
                args.push(policy);
                args.push(c.cost.to_string());
                args.push(now.as_nanos().to_string());
                args.push(end.as_nanos().to_string());
            }
        }
        let record = [inner.redis.reservation_key(lease.id)];
        inner
            .redis
            .eval_each(&RECORD, &[(&record[..], args.as_slice())])
            .await?;
        Ok(decisions)
    }

    /// [`Store::settle`](sluice_core::Store::settle): claims the record, then gives back or
    /// charges each counter it names, last check first, here.
    pub(crate) async fn settle_here(
        &self,
        id: &ReservationId,
        used: u64,
    ) -> StoreResult<Settlement> {
        let redis = &self.inner.redis;
        let record = [redis.reservation_key(id)];
        let args = [redis.time_offset().to_string()];
        let mut values = redis.eval_each(&CLAIM, &[(&record[..], &args[..])]).await?;
        let bad = |what: &str| {
            StoreError::Rejected(format!(
                "the claim script answered {what}; is another program using this key prefix?"
            ))
        };
        let items = match values.pop() {
            Some(Value::BulkString(status)) => {
                return match status.as_slice() {
                    b"unknown" => Ok(Settlement::Unknown),
                    b"settled" => Ok(Settlement::AlreadySettled),
                    b"expired" => Ok(Settlement::Expired),
                    _ => Err(bad("an unknown status")),
                };
            }
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    Value::BulkString(text) => {
                        String::from_utf8(text).map_err(|_| bad("an item not in UTF-8"))
                    }
                    _ => Err(bad("an item that is not a string")),
                })
                .collect::<StoreResult<Vec<String>>>()?,
            _ => return Err(bad("something other than a status or a record")),
        };
        let holds = match items.split_first() {
            Some((mark, rest)) if mark == MARK && rest.len() % ITEMS_PER_CHECK == 0 => rest
                .chunks(ITEMS_PER_CHECK)
                .map(|h| parse_hold(h).ok_or_else(|| bad("a hold it cannot read")))
                .collect::<StoreResult<Vec<Hold>>>()?,
            _ => {
                return Err(bad(
                    "a record of another store (the redis store's, under the same prefix?)",
                ));
            }
        };
        let reserved = holds.iter().map(|h| h.cost).max().unwrap_or(0);
        let now = self.inner.clock.now();
        // Last check first, as the other stores adjust them (docs/algorithms.md, "Refunds and
        // charges").
        for h in holds.iter().rev() {
            match Adjustment::of(h.policy.algorithm(), h.cost, used) {
                Some(Adjustment::Refund(units)) => {
                    self.give_back_here(&h.key, &h.policy, units, h.end, h.taken_at, now);
                }
                Some(Adjustment::Charge(units)) => {
                    // Charged past the limit: laid on the counter whatever it holds, and pushed.
                    self.admitted_without_store(&[Check::new(&h.key, &h.policy, units)]);
                }
                None => {}
            }
        }
        Ok(Settlement::Settled {
            reserved,
            refunded: reserved.saturating_sub(used),
            charged: used.saturating_sub(reserved),
        })
    }

    /// [`Store::refund`](sluice_core::Store::refund): gives each refund's units back here as
    /// taken now, and answers what a cost-0 check of each would get after it.
    pub(crate) fn refund_here(&self, refunds: &[Refund<'_>]) -> StoreResult<Vec<Decision>> {
        let now = self.inner.clock.now();
        refunds
            .iter()
            .map(|r| {
                if r.units > 0 {
                    let end = self.current_end(r.key, r.policy, now);
                    if let Some(end) = end {
                        self.give_back_here(r.key, r.policy, r.units, end, now, now);
                    }
                }
                let keys = lock(&self.inner.keys);
                let stored = keys
                    .get(r.key)
                    .filter(|e| e.policy == *r.policy)
                    .map(|e| e.state);
                decide(r.policy, stored.as_ref(), now, 0)
                    .map(|(_, d)| d)
                    .ok_or_else(|| crate::check::unheld(r.policy))
            })
            .collect()
    }

    /// The end of the window that holds `now` for `key`: for a clock-aligned window or a
    /// sliding counter, from the clock; for a window that starts at a key's first request, from
    /// this instance's state of the key, if it has a live one (`None` otherwise: nothing here
    /// says where that window lies, so nothing is given back); for a bucket, now.
    fn current_end(&self, key: &str, policy: &Policy, now: Timestamp) -> Option<Timestamp> {
        current_window_end(policy, now, || {
            let keys = lock(&self.inner.keys);
            let e = keys.get(key).filter(|e| e.policy == *policy)?;
            let end = window_end(policy, &e.state);
            (end > now).then_some(end)
        })
    }

    /// Gives `units` taken at `taken_at`, in the window ending at `end`, back to `key` at `now`:
    /// on its local state, and to the global count with the next sync. A key this instance does
    /// not track is tracked from now on, so that the refund reaches Redis.
    fn give_back_here(
        &self,
        key: &str,
        policy: &Policy,
        units: u64,
        end: Timestamp,
        taken_at: Timestamp,
        now: Timestamp,
    ) {
        if units == 0 || crate::hybrid_supports(policy).is_err() {
            return;
        }
        let mut keys = lock(&self.inner.keys);
        if !keys.contains_key(key) {
            if keys.len() >= self.inner.options.max_keys {
                return;
            }
            let Some((fresh, _)) = decide(policy, None, now, 0) else {
                return;
            };
            // Kept until the refund can no longer matter: its window's end, or a bucket's
            // whole refill, so that the sync sends it before the entry goes.
            let until = if is_bucket(policy.algorithm()) {
                now.saturating_add(span(policy))
            } else {
                end.max(now)
            };
            let share = self.share(policy.limit());
            keys.insert(key.to_owned(), Entry::new(policy, fresh, until, share));
        }
        if let Some(e) = keys.get_mut(key).filter(|e| e.policy == *policy) {
            e.give_back(units, end, taken_at, now);
            e.expires = e.expires.max(end);
        }
    }
}

/// One check of a reservation, as its record holds it.
#[derive(Debug)]
struct Hold {
    key: String,
    policy: Policy,
    cost: u64,
    taken_at: Timestamp,
    end: Timestamp,
}

fn parse_hold(items: &[String]) -> Option<Hold> {
    let [key, policy, cost, taken_at, end] = items else {
        return None;
    };
    Some(Hold {
        key: key.clone(),
        policy: parse_policy(policy)?,
        cost: cost.parse().ok()?,
        taken_at: Timestamp::from_nanos(taken_at.parse().ok()?),
        end: Timestamp::from_nanos(end.parse().ok()?),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sluice_core::{Alignment, FixedWindow, Gcra, Rate};

    use super::*;

    /// Every policy the hybrid store holds comes back from its record as it went in, and one it
    /// does not hold is never written.
    #[test]
    fn a_record_carries_every_held_policy_exactly() {
        let hour = Duration::from_secs(3600);
        let mut policies: Vec<Policy> = sluice_core::testing::five_per_second();
        policies.push(
            FixedWindow::new(
                7,
                hour,
                Alignment::Clock {
                    utc_offset_secs: -10_800,
                },
            )
            .unwrap()
            .into(),
        );
        policies.push(
            FixedWindow::new(7, hour, Alignment::FirstRequest)
                .unwrap()
                .into(),
        );
        policies.push(Gcra::new(Rate::new(3, hour).unwrap(), 9).unwrap().into());
        for policy in policies {
            match policy_text(&policy) {
                Some(text) => assert_eq!(parse_policy(&text), Some(policy), "{text}"),
                None => assert!(crate::hybrid_supports(&policy).is_err(), "{policy}"),
            }
        }
        for garbled in [
            "", "fw", "fw 1 2", "fw 1 2 x", "sc a 1", "tb 1 0 5", "zz 1 2",
        ] {
            assert_eq!(parse_policy(garbled), None, "{garbled}");
        }
    }
}
