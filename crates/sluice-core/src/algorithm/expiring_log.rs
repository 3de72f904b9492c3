//! A log of entries that each count for a fixed time after they were taken: the state of the
//! sliding log, whose entries are admitted requests counting for its window, and of the
//! concurrency limit, whose entries are holds counting for their ttl. The two decide, record,
//! give back and charge alike, through [`LogLimit`]; they differ in what they advise a refused
//! request and in what gives units back (a refund, or a settle whatever was used).
//!
//! Entries taken at the same instant share one, so a log never holds more than `limit` entries:
//! its memory is bounded by the limit. A charge (usage settled beyond what was reserved) adds one
//! entry more, so with charges the bound is `limit` plus one per charge that still counts.

use std::collections::VecDeque;
use std::time::Duration;

use crate::{Decision, Timestamp};

/// One counter's log: `(taken at, units)` pairs, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExpiringLog {
    entries: VecDeque<(Timestamp, u64)>,
    /// The units of every entry, kept so that a decision need not sum the whole log.
    total: u64,
}

impl ExpiringLog {
    /// How many entries the log holds (units taken at one instant share one).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the log holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What a log is held to: at most `limit` units in the entries that still count, each counting
/// for `lifetime` nanoseconds after it was taken.
#[derive(Debug, Clone, Copy)]
pub(super) struct LogLimit {
    pub(super) limit: u64,
    pub(super) lifetime: u64,
}

impl LogLimit {
    /// Whether an entry taken at `at` still counts at `now`.
    fn live(self, at: Timestamp, now: Timestamp) -> bool {
        at.as_nanos().saturating_add(self.lifetime) > now.as_nanos()
    }

    /// Time from `now` until the entry taken at `at` stops counting.
    fn expiry(self, at: Timestamp, now: Timestamp) -> Duration {
        let end = at.as_nanos().saturating_add(self.lifetime);
        Duration::from_nanos(end.saturating_sub(now.as_nanos()))
    }

    /// Decides a request of `cost` against `log` at `now`, without changing it; `record` admits
    /// it. A cost of 0 asks whether one more unit would pass. `reset_after` is the time until the
    /// newest entry stops counting; a refusal's `retry_after` is when enough of the oldest
    /// entries will have stopped counting to make room.
    pub(super) fn decide(self, log: &ExpiringLog, now: Timestamp, cost: u64) -> Decision {
        // Entries are in the order taken, so the expired ones are a prefix: subtract only those.
        let expired = log
            .entries
            .iter()
            .take_while(|(at, _)| !self.live(*at, now));
        let used = log.total - expired.clone().map(|(_, n)| n).sum::<u64>();
        let live = log.entries.iter().skip(expired.count());
        let remaining = self.limit.saturating_sub(used);
        let need = cost.max(1);
        let last_expiry = |extra: bool| match log.entries.back() {
            _ if extra => Duration::from_nanos(self.lifetime),
            Some((at, _)) if self.live(*at, now) => self.expiry(*at, now),
            _ => Duration::ZERO,
        };
        if need > self.limit {
            return Decision::deny(self.limit, remaining, last_expiry(false), Decision::NEVER);
        }
        if need <= remaining {
            return Decision::allow(self.limit, remaining - cost, last_expiry(cost > 0));
        }
        // Wait until enough of the oldest entries expire to make room. A charge may have taken
        // the log past its limit, so room is what is left of `used`, not `remaining` plus it.
        let mut freed = 0;
        let mut retry = Duration::ZERO;
        for (at, units) in live {
            freed += units;
            retry = self.expiry(*at, now);
            if (used - freed).saturating_add(need) <= self.limit {
                break;
            }
        }
        Decision::deny(self.limit, remaining, last_expiry(false), retry)
    }

    /// Records `cost` units taken at `now`, dropping entries that no longer count.
    pub(super) fn record(self, log: &mut ExpiringLog, now: Timestamp, cost: u64) {
        self.forget_expired(log, now);
        if cost == 0 {
            return;
        }
        match log.entries.back_mut() {
            Some((at, units)) if *at >= now => *units += cost,
            _ => log.entries.push_back((now, cost)),
        }
        log.total += cost;
    }

    /// Gives back up to `units` taken at `taken_at`: removes them from the newest entries taken
    /// at or before `taken_at` that still count at `now`, newest first. Entries that no longer
    /// count give nothing back: their units count no more, and crediting them to later entries
    /// would let the log admit more than its limit. Entries after `taken_at` were taken for other
    /// requests, so they are left alone.
    pub(super) fn refund(
        self,
        log: &mut ExpiringLog,
        units: u64,
        taken_at: Timestamp,
        now: Timestamp,
    ) {
        self.forget_expired(log, now);
        let mut left = units;
        let mut i = log.entries.len();
        while left > 0 && i > 0 {
            i -= 1;
            let Some((at, held)) = log.entries.get_mut(i) else {
                break;
            };
            if *at > taken_at {
                continue;
            }
            let back = left.min(*held);
            *held -= back;
            left -= back;
            log.total -= back;
            if *held == 0 {
                log.entries.remove(i);
            }
        }
    }

    /// Takes `units` at `now` whatever the log holds, past the limit if need be: they are logged
    /// as an admission would be, so requests are refused until enough entries stop counting. The
    /// total is held at `u64::MAX`, far past any limit, so that it cannot overflow.
    pub(super) fn charge(self, log: &mut ExpiringLog, units: u64, now: Timestamp) {
        self.record(log, now, units.min(u64::MAX - log.total));
    }

    /// Drops entries that no longer count at `now`.
    pub(super) fn forget_expired(self, log: &mut ExpiringLog, now: Timestamp) {
        while let Some((at, _)) = log.entries.front() {
            if self.live(*at, now) {
                break;
            }
            if let Some((_, units)) = log.entries.pop_front() {
                log.total -= units;
            }
        }
    }
}
