//! The hybrid store's side of Redis: one batched, atomic call per Cluster slot that pushes the
//! units each instance admitted locally and returns every key's global state.
//!
//! The store that decides locally is the rest of this crate; this module only knows the wire:
//! [`SyncEntry`] in, [`GlobalState`] out, through the same connection, timeout and circuit
//! breaker as [`RedisStore::check`](sluice_core::Store::check)
//! ([`RedisStore::eval_each`]). The script is `sync.lua`, assembled by `sluice-redis` with the
//! prelude and parts every script shares.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use foldhash::fast::FixedState;
use sluice_core::{
    ALGORITHMS, AlgorithmSpec, Policy, StoreError, StoreResult, Support, Timestamp,
    UnsupportedPolicy,
};
use sluice_redis::algorithm_code as code;
use sluice_redis::{RedisStore, Script, Value, app_now, slot};

use crate::local::{from_reply, is_bucket, reply_width, sync_params};

/// Pushes each key's locally admitted units and returns its global state; see `sync.lua` for
/// `KEYS`, `ARGV` and the reply, and [`sync_batch`] for the caller.
static SYNC: LazyLock<Script> = LazyLock::new(|| Script::assemble(include_str!("sync.lua")));

/// One key's part of a sync: what the instance admitted since its last sync, and when.
#[derive(Debug, Clone)]
pub struct SyncEntry {
    /// The counter's identity, as [`RedisStore::key_of`] takes it.
    pub key: String,
    /// The counter's policy: one that [`hybrid_supports`] accepts.
    pub policy: Policy,
    /// Units admitted locally since the last successful sync; 0 to only read.
    pub units: u64,
    /// Units given back locally (a settled reservation, a refund), taken from the window that
    /// `to_end_nanos` names, or from a bucket's backlog: the count goes down by them, never
    /// below zero. Sent in an entry of its own, with no `units`.
    pub refund: u64,
    /// For the windowed algorithms: from the instance's now to the end of the window the units
    /// were counted in, negative once it has ended. Units whose window Redis no longer counts
    /// are dropped, never moved to the next window. For the buckets: from now to when the
    /// latest unit was admitted (zero or negative), so that refill since then is not lost.
    pub to_end_nanos: i64,
    /// Units of the instance's last grant it keeps for what it admits while the sync is on its
    /// way; the rest of its claim is given back.
    pub keep: u64,
    /// Units the instance expects to be asked for on this key until its next sync: the grant it
    /// asks for, when the limit has that much free.
    pub want: u64,
    /// The units an instance may admit on a key it has not synced yet, without a claim: the
    /// sync sets that much aside for every live instance that has no claim on the key.
    pub share: u64,
    /// The key's state as the instance's last sync of it found it ([`Synced::floor`]): Redis
    /// raises the key to at least this before adding the units, so that a Redis that lost the
    /// key (a restart, a failover to a replica behind, a flush) does not hand back less than it
    /// held. `None` for a key this instance has not synced.
    pub floor: Option<Floor>,
    /// The sync attempt that first sent these units ([`Claimant::attempt`], or an earlier one
    /// that failed): Redis skips them if it has run that attempt, or a later one, of this
    /// instance on the key, so that units sent again after a call that timed out but ran are
    /// counted once. 0: always counted.
    pub tag: u64,
}

/// A key's state as a sync found it, in the form Redis takes it back as a floor: where the state
/// lies on Redis's clock, which birth of the key it belongs to, and its counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Floor {
    /// Microseconds since the epoch on Redis's clock, rounded down: the window's end (fixed
    /// window), the current window's start (sliding counter), or the theoretical arrival time
    /// (token bucket, GCRA).
    pub at_micros: i64,
    /// When the key (or its window) was first synced, in ms on Redis's clock: a floor is only
    /// laid on the key it was read from, or on a key Redis no longer holds.
    pub born_millis: i64,
    /// The fixed window's count, or the sliding counter's current count; 0 for the buckets.
    pub first: u64,
    /// The sliding counter's previous count; 0 for the others.
    pub second: u64,
}

/// Who a sync claims for, and how the rest of a limit is split.
#[derive(Debug, Clone, Copy)]
pub struct Claimant<'a> {
    /// The instance's id, as its heartbeat names it.
    pub id: &'a str,
    /// How long a claim holds unless the instance's next sync renews it: an instance that
    /// stops takes its claims with it after this.
    pub ttl: Duration,
    /// The live instances, among which what a limit has left is split.
    pub instances: u64,
    /// This attempt's number, increasing with each sync of the instance: Redis keeps the last
    /// it ran on each key in the instance's claim. 0: none kept.
    pub attempt: u64,
}

/// A key after a sync: its global state, and the units granted to the instance until its next
/// sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Synced {
    /// The key's global state.
    pub state: GlobalState,
    /// The units this instance may admit until its next sync, beyond what it kept, reserved for
    /// it in Redis so that no other instance counts them as free. `None` when there is no live
    /// window to claim in (a window that starts at a key's first request, with none yet).
    pub grant: Option<u64>,
    /// The state to send back as the key's floor at the next sync; `None` when there is no live
    /// window.
    pub floor: Option<Floor>,
}

/// A key's global state as Redis holds it after a sync, in durations from the moment the script
/// ran, so that an instance puts it on its own clock without comparing clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalState {
    /// A fixed window: the count in the live window, and the time to its end (zero when no
    /// window is live).
    Window {
        /// Units counted in the window.
        count: u64,
        /// Time to the window's end.
        to_end: Duration,
    },
    /// A sliding counter: the current and previous windows' counts, and the time to the current
    /// window's end.
    Sliding {
        /// Units in the current window.
        current: u64,
        /// Units in the previous window.
        previous: u64,
        /// Time to the current window's end.
        to_end: Duration,
    },
    /// A token bucket or GCRA: how far the theoretical arrival time lies after now. The bucket
    /// is full again after `backlog`; a backlog past the burst is debt from over-admission.
    Backlog(Duration),
}

/// Whether the hybrid store can hold `policy`: the algorithms whose table entry the hybrid store
/// holds (a state that instances can add up between syncs), within the numbers Redis's Lua can
/// hold exactly. Any other is refused with what it keeps that cannot be added up.
pub fn hybrid_supports(policy: &Policy) -> Result<(), UnsupportedPolicy> {
    let spec = policy.algorithm().spec();
    match spec.stores.hybrid {
        Support::Refused(why) => Err(UnsupportedPolicy {
            store: "hybrid",
            reason: format!(
                "{} ({why}) has no state that instances can add up between syncs; use {} with \
                 the hybrid store, or use the redis store",
                spec.name,
                held_names()
            ),
        }),
        Support::Held => sluice_redis::supports(policy).map_err(|e| UnsupportedPolicy {
            store: "hybrid",
            reason: e.reason,
        }),
    }
}

/// The algorithms the hybrid store holds, for messages: the windows, then the buckets, each in
/// the table's order (`fixed_window, sliding_counter, token_bucket or gcra`).
fn held_names() -> String {
    let mut held: Vec<&AlgorithmSpec> = ALGORITHMS
        .iter()
        .filter(|s| s.stores.hybrid == Support::Held)
        .collect();
    held.sort_by_key(|s| is_bucket(s.algorithm));
    let names: Vec<&str> = held.iter().map(|s| s.name).collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// The script arguments of one policy, with the share of a key not synced yet under it; `now`
/// (the application clock) is used only to name a window start near now for clock-aligned
/// windows.
fn push_policy(
    args: &mut Vec<String>,
    policy: &Policy,
    share: u64,
    now: Timestamp,
) -> StoreResult<()> {
    hybrid_supports(policy).map_err(|u| StoreError::Rejected(u.to_string()))?;
    let (a, b, reference) = sync_params(policy, now).ok_or_else(|| {
        StoreError::Rejected(format!(
            "the sync script has no arguments for a {} key",
            policy.algorithm()
        ))
    })?;
    args.push(code(policy.algorithm()).to_string());
    args.push(a.to_string());
    args.push(b.to_string());
    args.push(reference);
    args.push(policy.limit().to_string());
    args.push(share.to_string());
    Ok(())
}

/// The numbers of one entry, packed, in the script's argument of entries.
const ENTRY_BYTES: usize = 10 * 8;

/// The script arguments of one call: the claimant's, then each policy the call's entries name,
/// once, then every entry packed into one argument, with its policy's number (see `sync.lua`).
fn call_args(
    entries: &[SyncEntry],
    members: &[usize],
    claimant: Claimant<'_>,
    offset: i64,
    now: Timestamp,
) -> StoreResult<Vec<Vec<u8>>> {
    // Policies come from the rules, not from clients: a fast hasher will do.
    let mut policies: HashMap<(&Policy, u64), usize, FixedState> = HashMap::default();
    let mut policy_args = Vec::new();
    let mut packed = Vec::with_capacity(ENTRY_BYTES * members.len());
    let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    for &i in members {
        let e = &entries[i];
        let next = policies.len() + 1;
        let number = *policies.entry((&e.policy, e.share)).or_insert(next);
        if number == next {
            push_policy(&mut policy_args, &e.policy, e.share, now)?;
        }
        let floor = e.floor.unwrap_or(Floor {
            at_micros: 0,
            born_millis: 0,
            first: 0,
            second: 0,
        });
        let fields = [
            signed(number as u64),
            signed(e.units).saturating_sub(signed(e.refund)),
            e.to_end_nanos,
            signed(e.keep),
            signed(e.want),
            floor.at_micros,
            floor.born_millis,
            signed(floor.first),
            signed(floor.second),
            signed(e.tag),
        ];
        for n in fields {
            packed.extend_from_slice(&n.to_le_bytes());
        }
    }
    let mut args = Vec::with_capacity(8 + policy_args.len());
    args.push(offset.to_string().into_bytes());
    args.push(claimant.id.as_bytes().to_vec());
    args.push(whole_millis(claimant.ttl).to_string().into_bytes());
    args.push(claimant.instances.max(1).to_string().into_bytes());
    args.push(policies.len().to_string().into_bytes());
    args.extend(policy_args.into_iter().map(String::into_bytes));
    args.push(packed);
    args.push(claimant.attempt.to_string().into_bytes());
    Ok(args)
}

/// `d` in whole milliseconds, at least 1: a time to live as the scripts take it.
fn whole_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// One entry's integers of the sync script's reply (see `sync.lua`), [`reply_width`] of them
/// packed, 8 bytes each.
fn decode(policy: &Policy, reply: &[u8]) -> StoreResult<Synced> {
    let mut n = [0i64; 6];
    for (slot, bytes) in n.iter_mut().zip(reply.chunks_exact(8)) {
        let mut le = [0u8; 8];
        le.copy_from_slice(bytes);
        *slot = i64::from_le_bytes(le);
    }
    let (state, grant, floor) = from_reply(policy, n).ok_or_else(|| {
        StoreError::Rejected(format!(
            "the sync script has no state for a {} key",
            policy.algorithm()
        ))
    })?;
    Ok(Synced {
        state,
        grant: u64::try_from(grant).ok(),
        floor,
    })
}

/// The Redis key of a hybrid counter: the counter key with `:h` appended, so that it shares the
/// counter's slot and never meets a counter of the exact store under the same prefix.
fn hybrid_key(redis: &RedisStore, identity: &str) -> String {
    redis.key_of_with(identity, ":h")
}

/// Pushes every entry's units, renews `claimant`'s claim on each key, and returns every entry's
/// global state and grant, in order. Entries are grouped by Cluster slot, each group cut into
/// calls of at most `batch` entries, and every call sent at once (pipelined over the multiplexed
/// connections). Each call is atomic.
///
/// All or nothing as far as the caller can tell: on an error, the caller keeps every entry's
/// units and pushes them again later. A call that did reach Redis before another failed has
/// applied its units, which are then counted twice: only ever more counted, never less.
pub async fn sync_batch(
    redis: &RedisStore,
    entries: &[SyncEntry],
    batch: usize,
    claimant: Claimant<'_>,
) -> StoreResult<Vec<Synced>> {
    if entries.is_empty() {
        return Ok(Vec::new());
    }
    let offset = redis.time_offset();
    let now = app_now(offset);
    // Group by slot on a Cluster; elsewhere one group, cut by the batch size alike. Each group
    // holds its entries' indices and their keys.
    let mut groups: Vec<(Vec<usize>, Vec<String>)> = Vec::new();
    // Each slot's group that still has room, so that grouping is linear in the keys.
    let mut open: HashMap<u16, usize> = HashMap::new();
    let cluster = redis.is_cluster();
    for (i, e) in entries.iter().enumerate() {
        let key = hybrid_key(redis, &e.key);
        let s = if cluster { slot(key.as_bytes()) } else { 0 };
        let g = match open.get(&s) {
            Some(&g) if groups[g].0.len() < batch.max(1) => g,
            _ => {
                open.insert(s, groups.len());
                groups.push(Default::default());
                groups.len() - 1
            }
        };
        groups[g].0.push(i);
        groups[g].1.push(key);
    }
    let args = groups
        .iter()
        .map(|(members, _)| call_args(entries, members, claimant, offset, now))
        .collect::<StoreResult<Vec<_>>>()?;
    let calls: Vec<(&[String], &[Vec<u8>])> = groups
        .iter()
        .zip(&args)
        .map(|((_, keys), a)| (keys.as_slice(), a.as_slice()))
        .collect();
    let replies = redis.eval_each(&SYNC, &calls).await?;
    let mut states: Vec<Option<Synced>> = vec![None; entries.len()];
    for ((members, _), reply) in groups.iter().zip(replies) {
        let packed = match reply {
            Value::BulkString(bytes) => bytes,
            Value::Nil => Vec::new(),
            other => {
                return Err(StoreError::Rejected(format!(
                    "the sync script answered {other:?}; expected a string"
                )));
            }
        };
        let widths: usize = members
            .iter()
            .map(|&i| reply_width(&entries[i].policy))
            .sum();
        if packed.len() != 8 * widths {
            return Err(StoreError::Rejected(format!(
                "the sync script answered {} bytes for {} keys; expected {}",
                packed.len(),
                members.len(),
                8 * widths
            )));
        }
        let mut rest = packed.as_slice();
        for &i in members {
            let (these, after) = rest.split_at(8 * reply_width(&entries[i].policy));
            states[i] = Some(decode(&entries[i].policy, these)?);
            rest = after;
        }
    }
    Ok(states.into_iter().flatten().collect())
}

/// Replaces a hybrid counter's value with a reset marker (`reset.lua`).
static RESET: LazyLock<Script> = LazyLock::new(|| Script::assemble(include_str!("reset.lua")));

/// How long a reset's marker stays at least: while it does, an instance that read the key before
/// the reset cannot lay that count back on it (see `sync.lua`).
const RESET_MARKER_MIN: Duration = Duration::from_secs(24 * 3600);

/// Forgets a hybrid counter in Redis, leaving a marker for `span` (at least
/// [`RESET_MARKER_MIN`]) so that the floors other instances read before are not laid on it.
/// Returns whether it held a count.
pub(crate) async fn reset_hybrid(
    redis: &RedisStore,
    identity: &str,
    span: Duration,
) -> StoreResult<bool> {
    let key = [hybrid_key(redis, identity)];
    let args = [
        redis.time_offset().to_string(),
        whole_millis(span.max(RESET_MARKER_MIN)).to_string(),
    ];
    let replies = redis.eval_each(&RESET, &[(&key[..], &args[..])]).await?;
    match replies.first() {
        Some(Value::Int(n)) => Ok(*n > 0),
        other => Err(StoreError::Rejected(format!(
            "the reset script answered {other:?}; expected an integer"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sluice_core::{BucketedWindow, LeakyQueue, Rate, SlidingLog};

    use super::*;

    /// The refusals read from the table say what the algorithm keeps and list the algorithms
    /// the hybrid store holds, windows first.
    #[test]
    fn refusals_name_what_cannot_be_added_up_and_what_to_use() {
        let second = Duration::from_secs(1);
        let refused: [(Policy, &str); 3] = [
            (
                SlidingLog::new(5, second).unwrap().into(),
                "sliding_log (one entry per request)",
            ),
            (
                LeakyQueue::new(Rate::per_second(5), 4, second)
                    .unwrap()
                    .into(),
                "leaky_queue (a release time per request)",
            ),
            (
                BucketedWindow::new(5, second, 1).unwrap().into(),
                "bucketed_window (a count per sub-window, which the sync does not carry)",
            ),
        ];
        for (policy, what) in refused {
            let e = hybrid_supports(&policy).unwrap_err();
            assert_eq!(e.store, "hybrid");
            assert_eq!(
                e.reason,
                format!(
                    "{what} has no state that instances can add up between syncs; use \
                     fixed_window, sliding_counter, token_bucket or gcra with the hybrid store, \
                     or use the redis store"
                )
            );
        }
    }
}
