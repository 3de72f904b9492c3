//! The local check path: every decision is made here, from the key's local state and this
//! instance's allowance, all or nothing, without waiting for Redis.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use sluice_core::{Check, Clock, Decision, Policy, StoreError, StoreResult, Timestamp};

use crate::entry::Entry;
use crate::local::{Local, decide};
use crate::sync::hybrid_supports;
use crate::{HybridStore, lock};

impl<C: Clock + 'static> HybridStore<C> {
    /// Decides every check locally, all or nothing.
    pub(crate) fn check_local(&self, checks: &[Check<'_>]) -> StoreResult<Vec<Decision>> {
        if let [one] = checks {
            return self.check_one(one).map(|d| vec![d]);
        }
        let now = self.inner.clock.now();
        let mut keys = lock(&self.inner.keys);
        self.check_with(&mut keys, checks, now)
    }

    /// Decides one check as [`Self::check_with`] would, with one lookup of the key (two for a
    /// key this instance does not track yet).
    pub(crate) fn check_one(&self, c: &Check<'_>) -> StoreResult<Decision> {
        let inner = &self.inner;
        let now = inner.clock.now();
        let mut keys = lock(&inner.keys);
        let e = match keys.get_mut(c.key) {
            Some(e) if e.policy == *c.policy => e,
            Some(_) => {
                // The key's policy changed with the rules: the general path starts it afresh.
                let mut d = self.check_with(&mut keys, std::slice::from_ref(c), now)?;
                return d.pop().ok_or_else(|| unheld(c.policy));
            }
            None => {
                if c.cost > 0 {
                    self.make_room(&mut keys, 1, now)?;
                }
                let Some((state, d)) = decide(c.policy, None, now, c.cost) else {
                    return Err(unheld(c.policy));
                };
                let share = self.share(c.policy.limit());
                let d = self.within_share(d, c.cost, share, now)?;
                if c.cost == 0 {
                    self.watch(&mut keys, c.key, c.policy, state, now);
                } else if d.allowed {
                    let mut fresh = Entry::new(c.policy, state, now, share);
                    fresh.wanted = c.cost;
                    fresh.commit(c.policy, state, c.cost, d, now, &inner.dropped);
                    keys.insert(c.key.to_owned(), fresh);
                }
                return Ok(d);
            }
        };
        if c.cost > 0 {
            e.wanted = e.wanted.saturating_add(c.cost);
        } else {
            e.expires = e.expires.max(self.watched_until(now));
        }
        let Some((state, d)) = decide(c.policy, Some(&e.state), now, c.cost) else {
            return Err(unheld(c.policy));
        };
        let share = if self.alone() {
            u64::MAX
        } else {
            e.allowance_at(now)
        };
        let d = self.within_share(d, c.cost, share, now)?;
        if d.allowed && c.cost > 0 {
            e.commit(c.policy, state, c.cost, d, now, &self.inner.dropped);
        }
        Ok(d)
    }

    /// Has the next syncs read `key`'s global state, consuming nothing: a key this instance
    /// does not track is tracked from `fresh` for a few sync intervals, and a tracked one is kept
    /// at least as long. A look at a key (a peek, a check of cost 0) on an instance that never
    /// served it would otherwise answer from an empty counter every time, blind to what the
    /// other instances took. When the map is full, the key is answered untracked.
    pub(crate) fn watch(
        &self,
        keys: &mut HashMap<String, Entry>,
        key: &str,
        policy: &Policy,
        fresh: Local,
        now: Timestamp,
    ) {
        let until = self.watched_until(now);
        if let Some(e) = keys.get_mut(key).filter(|e| e.policy == *policy) {
            e.expires = e.expires.max(until);
        } else if !keys.contains_key(key) && keys.len() < self.inner.options.max_keys {
            keys.insert(
                key.to_owned(),
                Entry::new(policy, fresh, until, self.share(policy.limit())),
            );
        }
    }

    /// How long a watched key stays tracked: long enough for the next syncs to read it.
    fn watched_until(&self, now: Timestamp) -> Timestamp {
        now.saturating_add(self.inner.options.sync_interval * 4)
    }

    /// Room in `keys` for `new` more keys: when the map is full, the spent entries go first;
    /// [`StoreError::Full`] if that is not enough.
    fn make_room(
        &self,
        keys: &mut HashMap<String, Entry>,
        new: usize,
        now: Timestamp,
    ) -> StoreResult<()> {
        let max_keys = self.inner.options.max_keys;
        if new == 0 || keys.len() + new <= max_keys {
            return Ok(());
        }
        keys.retain(|_, e| !e.spent(now));
        if keys.len() + new > max_keys {
            return Err(StoreError::Full { max_keys });
        }
        Ok(())
    }

    /// `d` as this instance may answer it: a request the limit admits but whose cost does not
    /// fit the instance's `share` is refused until the next sync brings a new one, or, when
    /// syncs have failed for so long that the claims this instance held have lapsed, left to the
    /// rule's `on_store_error` (Redis is away).
    fn within_share(
        &self,
        d: Decision,
        cost: u64,
        share: u64,
        now: Timestamp,
    ) -> StoreResult<Decision> {
        if !d.allowed || cost <= share {
            return Ok(d);
        }
        let inner = &self.inner;
        let lag = now.saturating_since(Timestamp::from_nanos(
            inner.last_sync.load(Ordering::Relaxed),
        ));
        if inner.away.load(Ordering::Relaxed) && lag >= self.claim_ttl() / 2 {
            return Err(StoreError::Unavailable(format!(
                "the hybrid store has not synced with Redis for {lag:?}, and this \
                 instance's share of the limit is used up or has lapsed"
            )));
        }
        Ok(Decision {
            allowed: false,
            remaining: d.remaining.min(share),
            retry_after: inner.options.sync_interval,
            ..d
        })
    }

    /// Decides `checks` on `keys`, all or nothing: the general path, for requests of several
    /// checks and for keys not tracked yet.
    fn check_with(
        &self,
        keys: &mut HashMap<String, Entry>,
        checks: &[Check<'_>],
        now: Timestamp,
    ) -> StoreResult<Vec<Decision>> {
        let inner = &self.inner;
        // Room for the keys this request would create, made before anything is decided.
        let new = checks
            .iter()
            .filter(|c| c.cost > 0 && !keys.contains_key(c.key))
            .count();
        self.make_room(keys, new, now)?;
        for c in checks.iter().filter(|c| c.cost > 0) {
            if let Some(e) = keys.get_mut(c.key) {
                e.wanted = e.wanted.saturating_add(c.cost);
            }
        }
        // Each check sees what the earlier checks of this request would leave on its key.
        let mut after: Vec<(&str, &Policy, Local)> = Vec::with_capacity(checks.len());
        let mut decisions = Vec::with_capacity(checks.len());
        for (i, c) in checks.iter().enumerate() {
            let earlier = after
                .iter()
                .rev()
                .find(|(k, p, _)| *k == c.key && *p == c.policy);
            let stored = match earlier {
                Some((_, _, s)) => Some(*s),
                None => keys
                    .get(c.key)
                    .filter(|e| e.policy == *c.policy)
                    .map(|e| e.state),
            };
            let Some((state, d)) = decide(c.policy, stored.as_ref(), now, c.cost) else {
                return Err(unheld(c.policy));
            };
            // This instance's share, less what earlier checks of this request on the key take.
            let share = if self.alone() {
                u64::MAX
            } else {
                keys.get(c.key)
                    .filter(|e| e.policy == *c.policy)
                    .map_or_else(|| self.share(c.policy.limit()), |e| e.allowance_at(now))
            };
            let taken: u64 = checks[..i]
                .iter()
                .filter(|e| e.key == c.key && e.policy == c.policy)
                .map(|e| e.cost)
                .sum();
            let d = self.within_share(d, c.cost, share.saturating_sub(taken), now)?;
            if d.allowed && c.cost > 0 {
                after.push((c.key, c.policy, state));
            }
            decisions.push(d);
        }
        // A look at a key (cost 0) has the next syncs read its global state.
        for c in checks.iter().filter(|c| c.cost == 0) {
            if let Some((fresh, _)) = decide(c.policy, None, now, 0) {
                self.watch(keys, c.key, c.policy, fresh, now);
            }
        }
        if !decisions.iter().all(|d| d.allowed) {
            return Ok(sluice_core::unconsumed(checks, decisions));
        }
        for (c, d) in checks.iter().zip(&decisions) {
            if c.cost == 0 {
                continue;
            }
            let Some(&(_, _, state)) = after.iter().find(|(k, p, _)| *k == c.key && *p == c.policy)
            else {
                continue;
            };
            let entry = match keys.get_mut(c.key) {
                Some(e) => e,
                None => {
                    let mut fresh = Entry::new(c.policy, state, now, self.share(c.policy.limit()));
                    fresh.wanted = c.cost;
                    keys.entry(c.key.to_owned()).or_insert(fresh)
                }
            };
            if entry.policy != *c.policy {
                // The key's policy changed with the rules: start it afresh.
                entry.policy = c.policy.clone();
                entry.pending.clear();
                entry.doubt.clear();
            }
            entry.commit(c.policy, state, c.cost, *d, now, &inner.dropped);
        }
        // A key repeated in the request keeps the state its last check left.
        for (k, p, state) in after.iter().rev() {
            if let Some(e) = keys.get_mut(*k) {
                if e.policy == **p {
                    e.state = *state;
                    break;
                }
            }
        }
        Ok(decisions)
    }
}

/// The error for a check of a policy this store does not hold. Rules are refused at load by
/// [`Store::supports`](sluice_core::Store::supports), so this is only met by a caller that
/// skipped that gate.
pub(crate) fn unheld(policy: &Policy) -> StoreError {
    StoreError::Rejected(hybrid_supports(policy).err().map_or_else(
        || format!("the hybrid store does not hold {}", policy.algorithm()),
        |u| u.to_string(),
    ))
}
