//! Reservations on Redis: [`Store::reserve`](sluice_core::Store::reserve),
//! [`Store::settle`](sluice_core::Store::settle) and [`Store::refund`](sluice_core::Store::refund).
//!
//! A reservation is a record under its own key, [`RedisStore::reservation_key`], so that every
//! instance sharing the Redis can settle it: a list of `open` (then `settled`), the time its ttl
//! ends on Redis time, and eight items per check, the counter key, the algorithm code, the cost,
//! the four script parameters and the refund token, which are all a settle needs to adjust the
//! counter, without the rules. Off a Cluster the checks and the record are one script call
//! ([`scripts::RESERVE`]): a record exists exactly when its checks consumed. On a Cluster the
//! record's key has a slot of its own, so it is written after the checks ([`scripts::RECORD`]);
//! if that write fails, the units stay consumed and the reservation counts as used in full.
//!
//! A settle claims the record first ([`scripts::CLAIM`], atomic: of concurrent settles from any
//! instances only one goes on), then gives back or charges each counter, one call per slot
//! ([`scripts::REFUND`]). On a Cluster every step's calls go through
//! [`RedisStore::eval_each`] or the checks' own path, so they are grouped by master: one pipeline
//! per master, the masters in parallel, each through its master's breaker.
//! `docs/redis-store.md` describes the record and the guarantees.

use redis::Value;
use sluice_core::{Adjustment, Algorithm, StoreResult, Timestamp};
use sluice_core::{Check, Decision, Lease, Refund, ReservationId, Settlement, StoreError};

use super::RedisStore;
use crate::scripts;
use crate::scripts::args::{ARGS_PER_CHECK, Arg, push_check};
use crate::scripts::exact::EXACT;
use crate::scripts::reply::decode_replies;

/// The record's items per check: the counter key, then the check's script arguments.
const ITEMS_PER_CHECK: usize = 1 + ARGS_PER_CHECK;

impl RedisStore {
    /// The Redis key of the reservation `id`'s record: `prefix:reservation:{rsv_…}`. The id is
    /// its hash tag, so records spread over a Cluster's slots. No counter key has this form
    /// (each has a `{` right after the prefix), so a record never meets a counter.
    pub fn reservation_key(&self, id: &ReservationId) -> String {
        format!("{}:reservation:{{{id}}}", self.inner.prefix)
    }

    /// [`Store::reserve`](sluice_core::Store::reserve): the checks and, when all admit, the
    /// record.
    pub(super) async fn reserve_all(
        &self,
        checks: &[Check<'_>],
        lease: Lease<'_>,
    ) -> StoreResult<Vec<Decision>> {
        let ttl = u64::try_from(lease.ttl.as_nanos())
            .ok()
            .filter(|&ttl| ttl < EXACT)
            .ok_or_else(|| {
                StoreError::Rejected(format!(
                    "a reservation's ttl of {:?} is longer than the redis store can hold (about \
                     104 days: its scripts compute in Lua doubles, exact below 2^53 ns)",
                    lease.ttl
                ))
            })?;
        let offset = self.time_offset();
        let now = self.app_now(offset);
        let record = self.reservation_key(lease.id);
        let mut keys: Vec<String> = checks.iter().map(|c| self.key_of(c.key)).collect();
        if !self.inner.cluster {
            let every: Vec<usize> = (0..checks.len()).collect();
            let mut args = self.script_args(checks, &every, "1", now, offset, None)?;
            args.push(Arg::uint(ttl));
            keys.push(record);
            let mut values = self
                .eval_each(&scripts::RESERVE, &[(keys.as_slice(), args.as_slice())])
                .await?;
            let value = values.pop().unwrap_or(Value::Nil);
            let replies = decode_replies(value, checks.iter().map(|c| c.policy.limit()))?;
            let decisions: Vec<Decision> = replies.into_iter().map(|r| r.decision).collect();
            if decisions.iter().all(|d| d.allowed) {
                return Ok(decisions);
            }
            return Ok(sluice_core::unconsumed(checks, decisions));
        }
        let (replies, all_allowed) = if checks.is_empty() {
            (Vec::new(), true)
        } else {
            self.decide_groups(checks, &keys, now, offset, |r| r)
                .await?
        };
        let decisions: Vec<Decision> = replies.iter().map(|r| r.decision).collect();
        if !all_allowed {
            return Ok(sluice_core::unconsumed(checks, decisions));
        }
        let mut args = Vec::with_capacity(2 + checks.len() * ITEMS_PER_CHECK);
        args.push(Arg::int(offset));
        args.push(Arg::uint(ttl));
        for ((check, key), reply) in checks.iter().zip(keys).zip(&replies) {
            args.push(Arg::Text(key));
            push_check(&mut args, check.policy, check.cost, now, &reply.token)?;
        }
        // Should this fail, the checks stay consumed: the reservation counts as used in full,
        // which never admits more than the limits. Giving them back instead could give back
        // twice, should the record have been written after all (a timeout) and be settled.
        self.eval_each(&scripts::RECORD, &[(&[record][..], args.as_slice())])
            .await?;
        Ok(decisions)
    }

    /// [`Store::settle`](sluice_core::Store::settle): claims the record, then adjusts each
    /// counter it names.
    pub(super) async fn settle_one(
        &self,
        id: &ReservationId,
        used: u64,
    ) -> StoreResult<Settlement> {
        let offset = self.time_offset();
        let record = [self.reservation_key(id)];
        let args = [offset.to_string()];
        let mut values = self
            .eval_each(&scripts::CLAIM, &[(&record[..], &args[..])])
            .await?;
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
            Some(Value::Array(items)) if items.len() % ITEMS_PER_CHECK == 0 => items
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
        let entries: Vec<&[String]> = items.chunks(ITEMS_PER_CHECK).collect();
        let mut reserved = 0;
        let mut keys = Vec::with_capacity(entries.len());
        // Per check: its key, whether it is charged, and its arguments with the units in place
        // of the cost.
        let mut adjustments = Vec::with_capacity(entries.len());
        for entry in &entries {
            let cost: u64 = entry[2]
                .parse()
                .map_err(|_| bad("a cost that is not a count"))?;
            reserved = reserved.max(cost);
            let algorithm = Algorithm::ALL
                .into_iter()
                .find(|a| a.spec().code.to_string() == entry[1])
                .ok_or_else(|| bad("an unknown algorithm code"))?;
            let (charge, units) = match Adjustment::of(algorithm, cost, used) {
                Some(Adjustment::Refund(units)) => (false, units),
                Some(Adjustment::Charge(units)) => (true, units),
                None => continue,
            };
            let mut args: Vec<String> = entry[1..].to_vec();
            args[1] = units.min(EXACT).to_string();
            keys.push(entry[0].clone());
            adjustments.push((charge, args));
        }
        let groups = self.groups(&keys);
        let group_keys: Vec<Vec<String>> = groups
            .iter()
            .map(|group| group.iter().map(|&i| keys[i].clone()).collect())
            .collect();
        let group_args: Vec<Vec<Arg>> = groups
            .iter()
            .map(|group| {
                let mut args = Vec::with_capacity(2 + group.len() * ARGS_PER_CHECK);
                args.push(Arg::int(offset));
                args.push(Arg::Text(
                    group
                        .iter()
                        .map(|&i| if adjustments[i].0 { 'c' } else { '-' })
                        .collect(),
                ));
                for &i in group {
                    args.extend(adjustments[i].1.iter().map(|a| Arg::text(a)));
                }
                args
            })
            .collect();
        self.eval_each(&scripts::REFUND, &calls_of(&group_keys, &group_args))
            .await?;
        Ok(Settlement::Settled {
            reserved,
            refunded: reserved.saturating_sub(used),
            charged: used.saturating_sub(reserved),
        })
    }

    /// [`Store::refund`](sluice_core::Store::refund): gives the units back to the window that
    /// holds now, one call per slot, then peeks at each counter.
    pub(super) async fn refund_now(&self, refunds: &[Refund<'_>]) -> StoreResult<Vec<Decision>> {
        if refunds.is_empty() {
            return Ok(Vec::new());
        }
        let offset = self.time_offset();
        let now = self.app_now(offset);
        let gives: Vec<Check<'_>> = refunds
            .iter()
            .map(|r| Check::new(r.key, r.policy, r.units))
            .collect();
        let peeks: Vec<Check<'_>> = refunds
            .iter()
            .map(|r| Check::new(r.key, r.policy, 0))
            .collect();
        let keys: Vec<String> = refunds.iter().map(|r| self.key_of(r.key)).collect();
        let groups = self.groups(&keys);
        let group_keys: Vec<Vec<String>> = groups
            .iter()
            .map(|group| group.iter().map(|&i| keys[i].clone()).collect())
            .collect();
        let calls = |checks: &[Check<'_>], mode: &str, now: Timestamp| {
            groups
                .iter()
                .map(|group| self.script_args(checks, group, mode, now, offset, None))
                .collect::<StoreResult<Vec<Vec<Arg>>>>()
        };
        let given = calls(&gives, "", now)?;
        let peeked = calls(&peeks, "0", now)?;
        self.eval_each(&scripts::REFUND, &calls_of(&group_keys, &given))
            .await?;
        let values = self
            .eval_each(&scripts::CHECK, &calls_of(&group_keys, &peeked))
            .await?;
        let mut decisions = vec![None; refunds.len()];
        for (group, value) in groups.iter().zip(values) {
            let replies = decode_replies(value, group.iter().map(|&i| refunds[i].policy.limit()))?;
            for (&i, r) in group.iter().zip(replies) {
                decisions[i] = Some(r.decision);
            }
        }
        decisions
            .into_iter()
            .map(|d| {
                d.ok_or_else(|| {
                    StoreError::Rejected("the check script left a counter undecided".to_owned())
                })
            })
            .collect()
    }
}

/// Script calls for [`RedisStore::eval_each`]: each group's keys beside its arguments.
fn calls_of<'a>(keys: &'a [Vec<String>], args: &'a [Vec<Arg>]) -> Vec<(&'a [String], &'a [Arg])> {
    keys.iter()
        .zip(args)
        .map(|(k, a)| (k.as_slice(), a.as_slice()))
        .collect()
}
