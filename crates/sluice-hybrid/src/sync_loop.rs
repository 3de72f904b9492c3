//! The sync loop: every interval, the units each key admitted here go to Redis, with the
//! instance's heartbeat, and what comes back is laid under the keys (`apply.rs`). On failure the
//! units stay pending for the next sync and local decisions go on.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use sluice_core::{Clock, StoreResult, Timestamp};

use crate::apply::Grants;
use crate::sync::{Claimant, SyncEntry, sync_batch};
use crate::{HybridStore, Inner, lock};

impl<C: Clock + 'static> HybridStore<C> {
    /// Syncs every [`HybridOptions::sync_interval`](crate::HybridOptions::sync_interval) on the
    /// current Tokio runtime, until the store is dropped (the task holds only a weak reference)
    /// or the handle is aborted.
    pub fn spawn_sync(&self) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner<C>> = Arc::downgrade(&self.inner);
        let interval = self.inner.options.sync_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let _ = (HybridStore { inner }).sync_now().await;
            }
        })
    }

    /// Pushes every key's unsynchronised units to Redis and brings back every tracked key's
    /// global state, except keys in the negative cache with nothing to push. On failure the units
    /// stay pending for the next sync and local decisions go on.
    pub async fn sync_now(&self) -> StoreResult<()> {
        let inner = &self.inner;
        let _one = inner.syncing.lock().await;
        let now = inner.clock.now();
        let ttl = self.claim_ttl();
        // This attempt's number: the units it sends first carry it, and Redis keeps the last it
        // ran with this instance's claim on each key.
        let attempt = inner.attempts.fetch_add(1, Ordering::Relaxed) + 1;
        let mut entries: Vec<SyncEntry> = Vec::new();
        // A lone instance needs no claims; once others join, every key it kept unsent is sent
        // at this sync, so that the others' grants count its units.
        let alone = self.alone();
        let joined = inner.synced_alone.swap(alone, Ordering::Relaxed) && !alone;
        // Whether this lone instance keeps units unsent: then it beats at every sync, so that it
        // learns of an instance that starts within one interval, not half a heartbeat's life.
        let mut unsent = false;
        {
            let mut keys = lock(&inner.keys);
            // One pass: entries with nothing to push whose counter is full again go, the others
            // are listed.
            keys.retain(|key, e| {
                if e.spent(now) || e.outlived(now, alone) {
                    return false;
                }
                if joined {
                    e.renew_at = Timestamp::EPOCH;
                }
                // A key with nothing to push is read if it was asked for since the last sync,
                // and otherwise only every quarter of a claim's time to live, to renew its
                // claim: a key that sees a request now and then costs Redis a few reads a
                // second, not one every interval. A key in the negative cache is not read, nor,
                // by a lone instance, a key it has read once (it has no claim to renew).
                let idle = e.wanted == 0 && now < e.renew_at;
                let nothing = e.pending.is_empty() && e.doubt.is_empty() && e.refunds.is_empty();
                if nothing && (e.quiet_until > now || idle || (alone && e.known.is_some())) {
                    return true;
                }
                // A key far from its limit, within its claim, keeps its units for a later sync.
                if !e.due(now, alone) {
                    unsent |= alone && !e.pending.is_empty();
                    return true;
                }
                e.renew_at = now.saturating_add(if alone { ttl } else { ttl / 4 });
                // Of its allowance, the instance keeps twice what this key was asked for since
                // the last sync, for the requests it admits while this one is on its way (which
                // may take longer than the last); the rest is given back. It asks for as much
                // again until the next sync.
                let want = e.wanted.saturating_mul(2);
                let keep = e.allowance_at(now).min(want);
                e.allowance = keep;
                e.wanted = 0;
                let share = self.share(e.policy.limit()).min(e.policy.limit());
                if nothing {
                    entries.push(SyncEntry {
                        key: key.clone(),
                        policy: e.policy.clone(),
                        units: 0,
                        refund: 0,
                        to_end_nanos: 0,
                        keep,
                        want,
                        share,
                        floor: e.known,
                        tag: attempt,
                    });
                    return true;
                }
                // Batches in doubt first, each under the attempt that first sent it, then the
                // units admitted since, under this one: a key's entries follow each other.
                let fresh = e
                    .pending
                    .drain(..)
                    .map(|(end, units)| (attempt, end, units));
                let batches: Vec<(u64, Timestamp, u64)> = e.doubt.drain(..).chain(fresh).collect();
                // Then what was given back, each refund an entry of its own, after the units
                // (a key's last entry is its latest state).
                let given: Vec<(u64, Timestamp, u64)> = e
                    .refunds
                    .drain(..)
                    .map(|(end, units, _)| (attempt, end, units))
                    .collect();
                let signed = batches
                    .into_iter()
                    .map(|b| (b, false))
                    .chain(given.into_iter().map(|b| (b, true)));
                for ((tag, end, units), back) in signed {
                    let to_end = i128::from(end.as_nanos()) - i128::from(now.as_nanos());
                    let (units, refund) = if back { (0, units) } else { (units, 0) };
                    entries.push(SyncEntry {
                        key: key.clone(),
                        policy: e.policy.clone(),
                        units,
                        refund,
                        to_end_nanos: i64::try_from(to_end).unwrap_or(i64::MIN),
                        keep,
                        want,
                        share,
                        floor: e.known,
                        tag,
                    });
                }
                true
            });
        }
        // The heartbeat goes with every sync that has keys to push or read, and on its own when
        // half its time to live has passed: an idle instance stays counted, at one call per
        // quarter of a second, and every key idle or negative-cached costs nothing. A lone
        // instance that keeps units unsent beats at every sync: until it hears of a newcomer,
        // the newcomer decides on a count that lacks them.
        let beat_due = unsent
            || now
                .as_nanos()
                .saturating_sub(inner.last_beat.load(Ordering::Relaxed))
                >= u64::try_from((ttl / 2).as_nanos()).unwrap_or(u64::MAX);
        if entries.is_empty() && !beat_due {
            inner.last_sync.store(now.as_nanos(), Ordering::Relaxed);
            return Ok(());
        }
        let claimant = Claimant {
            id: &inner.id,
            ttl,
            instances: inner.instances.load(Ordering::Relaxed),
            attempt,
        };
        let claimed_alone = claimant.instances <= 1;
        let (beat, synced) = tokio::join!(
            inner.redis.heartbeat(&inner.id, ttl),
            sync_batch(&inner.redis, &entries, inner.options.batch, claimant)
        );
        if let Ok(n) = beat {
            inner.instances.store(n, Ordering::Relaxed);
            inner.last_beat.store(now.as_nanos(), Ordering::Relaxed);
        }
        if entries.is_empty() {
            inner.last_sync.store(now.as_nanos(), Ordering::Relaxed);
            return beat.map(|_| ());
        }
        match synced {
            Ok(states) => {
                // A grant may be used until its claim could expire: half the claim's time to
                // live after the sync left, which leaves room for clocks and latency.
                let grants = Grants {
                    until: now.saturating_add(ttl / 2),
                    claimed_alone,
                };
                self.apply(&entries, &states, grants).await;
                inner.syncs.fetch_add(1, Ordering::Relaxed);
                inner.away.store(false, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                inner.sync_failures.fetch_add(1, Ordering::Relaxed);
                inner.away.store(true, Ordering::Relaxed);
                // Redis may have run the calls (one that timed out may still run): their units
                // are in doubt, sent again under the attempt that first sent them, which Redis
                // counts only if it has not run that attempt or a later one on the key. Units
                // given back are not sent again: they stay counted (more, never less), and the
                // next sync's global state takes them off the local state too.
                let mut keys = lock(&inner.keys);
                for s in entries.into_iter().filter(|s| s.units > 0) {
                    let Some(entry) = keys.get_mut(&s.key) else {
                        continue;
                    };
                    let at = i128::from(now.as_nanos()) + i128::from(s.to_end_nanos);
                    let end = Timestamp::from_nanos(u64::try_from(at.max(1)).unwrap_or(u64::MAX));
                    entry.add_doubt(s.tag, end, s.units);
                }
                Err(e)
            }
        }
    }
}
