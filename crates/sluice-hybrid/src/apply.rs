//! Applying a sync's reply: each key's global state, with the units admitted here since laid on
//! top, becomes its local state; its negative cache, expiry and allowance follow from it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use sluice_core::{Clock, Decision, Timestamp};

use crate::entry::Entry;
use crate::local::{add_units, decide, from_global, give_back, over_limit};
use crate::sync::{SyncEntry, Synced};
use crate::{HybridStore, lock};

/// How a sync's grants may be used.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grants {
    /// Until when: their claims could expire after that.
    pub(crate) until: Timestamp,
    /// Whether the sync was made as a lone instance, which reserves only what it kept.
    pub(crate) claimed_alone: bool,
}

/// How many keys a sync's answer updates under one hold of the key map's lock, and between two
/// yields of the sync task: small enough that a request waits tens of microseconds behind it,
/// large enough that the lock is taken rarely.
const APPLY_CHUNK: usize = 64;

impl<C: Clock + 'static> HybridStore<C> {
    /// Lays the global states a sync returned under each key's units admitted since.
    pub(crate) async fn apply(&self, entries: &[SyncEntry], states: &[Synced], grants: Grants) {
        let inner = &self.inner;
        let now = inner.clock.now();
        let mut over = 0u64;
        // A key pushed in two windows appears twice, one entry after the other (see
        // `sync_now`); its last reply is the latest state.
        let last: Vec<(&str, usize)> = entries
            .iter()
            .enumerate()
            .filter(|&(i, s)| entries.get(i + 1).is_none_or(|next| next.key != s.key))
            .map(|(i, s)| (s.key.as_str(), i))
            .collect();
        // The keys are updated a chunk at a time, each under the lock on its own, and the task
        // yields between chunks, so that requests served on the same thread are not held up
        // behind a sync of many keys; every key's update reads its entry as it is then, so none
        // depends on the others.
        for (n, chunk) in last.chunks(APPLY_CHUNK).enumerate() {
            if n > 0 {
                tokio::task::yield_now().await;
            }
            let mut keys = lock(&inner.keys);
            for &(key, i) in chunk {
                over = over.saturating_add(self.apply_one(
                    &mut keys,
                    key,
                    &entries[i],
                    states[i],
                    now,
                    grants,
                ));
            }
        }
        inner.over_admitted.fetch_add(over, Ordering::Relaxed);
        inner.last_sync.store(now.as_nanos(), Ordering::Relaxed);
    }

    /// Lays one key's global state under its units admitted since; the units the state shows
    /// beyond the limit.
    fn apply_one(
        &self,
        keys: &mut HashMap<String, Entry>,
        key: &str,
        sent: &SyncEntry,
        synced: Synced,
        now: Timestamp,
        grants: Grants,
    ) -> u64 {
        let global = synced.state;
        let over = over_limit(&sent.policy, global);
        let Some(entry) = keys.get_mut(key) else {
            return over; // reset while the sync was on its way
        };
        if entry.policy != sent.policy {
            return over;
        }
        let Some(mut state) = from_global(&entry.policy, global, Some(&entry.state), now) else {
            return over;
        };
        for &(end, units) in &entry.pending {
            add_units(&entry.policy, &mut state, end, units, now);
        }
        // What was given back here while the sync was on its way.
        for &(_, units, taken_at) in &entry.refunds {
            give_back(&entry.policy, &mut state, units, taken_at, now);
        }
        entry.state = state;
        // What Redis held after this sync, the floor of the next: already raised to the last
        // one, so a key's known usage goes down only as its window or backlog runs out.
        entry.known = synced.floor;
        if let Some((_, d)) = decide(&entry.policy, Some(&state), now, 1) {
            entry.quiet_until = if d.allowed || d.retry_after == Decision::NEVER {
                Timestamp::EPOCH
            } else {
                now.saturating_add(d.retry_after)
            };
        }
        if let Some((_, d)) = decide(&entry.policy, Some(&state), now, 0) {
            entry.expires = entry.expires.max(now.saturating_add(d.reset_after));
            // What is left of what the instance kept, and the grant reserved for it; a lone
            // instance is bounded by the limit alone, and a key with no live window to claim in
            // starts afresh. A sync made as a lone instance reserved only what was kept: if
            // others have joined since, that is all the instance may use, until the next sync
            // (at once) claims its part among them.
            entry.allowance = match synced.grant {
                _ if self.alone() => u64::MAX,
                _ if grants.claimed_alone => {
                    entry.renew_at = Timestamp::EPOCH;
                    entry.allowance
                }
                Some(grant) => entry.allowance.saturating_add(grant),
                None => self.share(entry.policy.limit()),
            };
            entry.allowance_until = grants.until;
        }
        over
    }
}
