//! Usage known only afterwards: reserve a request's amount against every enforced limit at
//! once, then settle with what it used. What was reserved and not used is given back; usage
//! beyond the reservation is charged past the limit. The store records each reservation, so any
//! instance that shares it can settle it (see `Store::reserve`).

use std::time::Duration;

use sluice_core::{Lease, ReservationId, Settlement, StoreError};

use super::Limiter;
use super::check::{Answer, Answers, Checked};
use super::plan::Plan;
use crate::request::{InvalidRequest, LimitRequest};
use crate::verdict::Verdict;

/// How long reservations hold: the default for a request that does not say, and the most one
/// may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservationTtls {
    /// A reservation's ttl when its request names none.
    pub default: Duration,
    /// The longest ttl a request may ask for.
    pub max: Duration,
}

impl Default for ReservationTtls {
    /// Five minutes, at most an hour: long enough for a streamed model answer, short enough
    /// that units held by a crashed caller come back the same hour.
    fn default() -> Self {
        ReservationTtls {
            default: Duration::from_secs(300),
            max: Duration::from_secs(3600),
        }
    }
}

/// The answer to a reservation.
#[derive(Debug)]
pub struct Reserved {
    /// The verdict, as a check of the same request would have it.
    pub verdict: Verdict,
    /// The reservation to settle, when the request was admitted and the store recorded it.
    /// `None` when it was refused, or admitted by a rule's `on_store_error` while the store
    /// failed: then nothing was taken that a settle could give back.
    pub reservation: Option<ReservationId>,
    /// How long the reservation holds.
    pub ttl: Duration,
    /// The store failed and each limit's `on_store_error` decided: an admitted request then
    /// holds no reservation, and its answer must say so rather than leave a bare `null`.
    pub store_failed: bool,
}

/// Why a reservation could not be made. Nothing was taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidReservation {
    /// The request itself is invalid.
    #[error(transparent)]
    Request(#[from] InvalidRequest),
    /// The amount is zero.
    #[error("`amount` is 0; reserve at least 1 unit")]
    ZeroAmount,
    /// The amount is above `u32::MAX`.
    #[error("`amount` is {0}, above the largest amount of {max}", max = u32::MAX)]
    AmountTooLarge(u64),
    /// The ttl is zero.
    #[error("`ttl` is 0; a reservation must hold for some time")]
    ZeroTtl,
    /// The store cannot hold reservations, or refused this one for good: retrying will not
    /// help, and no rule's `on_store_error` should pretend it was made.
    #[error("{0}")]
    Unsupported(String),
    /// The ttl is above the maximum.
    #[error("`ttl` is {got:?}, above the maximum of {max:?} (`--max-reservation-ttl`)")]
    TtlTooLong {
        /// What was asked.
        got: Duration,
        /// The maximum.
        max: Duration,
    },
}

impl Limiter {
    /// How long reservations hold.
    pub fn reservation_ttls(&self) -> ReservationTtls {
        *self
            .reservation_ttls
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sets how long reservations hold.
    pub fn set_reservation_ttls(&self, ttls: ReservationTtls) {
        *self
            .reservation_ttls
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = ttls;
    }

    /// Reserves `amount` units of `request` (its `cost` is ignored) against every enforced
    /// limit that applies, all or none, for `ttl` (the default when `None`). Shadow and soft
    /// limits are looked at without consuming: a reservation never takes what it would not be
    /// refused for. Envoy's quota mode does not apply: every enforced limit must admit.
    pub async fn reserve(
        &self,
        request: &LimitRequest,
        amount: u64,
        ttl: Option<Duration>,
    ) -> Result<Reserved, InvalidReservation> {
        let ttls = self.reservation_ttls();
        let ttl = ttl.unwrap_or(ttls.default);
        if amount == 0 {
            return Err(InvalidReservation::ZeroAmount);
        }
        if amount > u64::from(u32::MAX) {
            return Err(InvalidReservation::AmountTooLarge(amount));
        }
        if ttl.is_zero() {
            return Err(InvalidReservation::ZeroTtl);
        }
        if ttl > ttls.max {
            return Err(InvalidReservation::TtlTooLong {
                got: ttl,
                max: ttls.max,
            });
        }
        // The request as sent, its own cost aside: checked, and planned below, at `amount`.
        request.validate_costing(amount)?;
        let rules = self.rules.rules();
        let mut plan = Plan::new(&rules, request, false, &self.overrides);
        let (enforced, observed): (Vec<usize>, Vec<usize>) =
            (0..plan.checks.len()).partition(|&i| plan.checks[i].rule.mode.enforces());

        // Every check costs `amount`, but where a descriptor names its own cost, as it would
        // had the request's cost been `amount`.
        for c in &mut plan.checks {
            if request.descriptors[c.descriptor].cost.is_none() {
                c.cost = amount;
            }
        }

        // A reservation never outlives a concurrency limit's hold (its `ttl`, the policy's
        // window): when the slot comes back by itself, the reservation has expired too.
        let ttl = enforced
            .iter()
            .map(|&i| &plan.checks[i].rule.policy)
            .filter(|p| p.concurrent())
            .map(|p| p.window())
            .fold(ttl, Duration::min);

        let id = ReservationId::random();
        let batch: Vec<_> = enforced
            .iter()
            .map(|&i| plan.checks[i].as_reservation())
            .collect();
        let (held, store_failed) = match self.store.reserve(&batch, Lease { id: &id, ttl }).await {
            Ok(decisions) => (decisions, false),
            Err(e) if !e.is_transient() => {
                return Err(InvalidReservation::Unsupported(e.to_string()));
            }
            Err(e) => {
                let on_error = |k: usize| plan.checks[enforced[k]].rule.on_store_error;
                // On the heap, as the rare paths below: this future is in every reservation's.
                (
                    Box::pin(self.without_store(&batch, on_error, &e)).await,
                    true,
                )
            }
        };
        // Shadow and soft limits, looked at: most reservations have none.
        let (seen, seen_failed) = if observed.is_empty() {
            (Vec::new(), false)
        } else {
            Box::pin(self.check_group(&plan.checks, &observed, true)).await
        };

        let allowed = held.iter().all(|d| d.allowed);
        let mut answers = vec![None; plan.checks.len()];
        for (&i, decision) in enforced.iter().zip(held) {
            answers[i] = Some(Answer {
                decision,
                store_failed,
            });
        }
        for (&i, decision) in observed.iter().zip(seen) {
            answers[i] = Some(Answer {
                decision,
                store_failed: seen_failed,
            });
        }
        let checked = Checked {
            allowed,
            over_reported: false,
            answers: Answers::Each(answers),
        };
        let verdict = self.assemble(&rules, request, plan, checked);
        let recorded = verdict.allowed && !store_failed;
        Ok(Reserved {
            verdict,
            reservation: recorded.then_some(id),
            ttl,
            store_failed,
        })
    }

    /// Settles reservation `id` at `used` units: see [`sluice_core::Store::settle`].
    pub async fn settle(&self, id: &ReservationId, used: u64) -> Result<Settlement, StoreError> {
        self.store.settle(id, used).await
    }

    /// Settles the reservation a client names, `reservation` as sent, at `used` units: the
    /// settle of every front end, so that each refuses the same settles with the same words
    /// and only maps them to its own status codes.
    pub async fn settle_named(
        &self,
        reservation: &str,
        used: u64,
    ) -> Result<Settled, SettleRefused> {
        if used > u64::from(u32::MAX) {
            return Err(SettleRefused::UsedTooLarge(used));
        }
        // A garbled id names no reservation, as an unknown one does.
        let unknown = || SettleRefused::Unknown(reservation.chars().take(64).collect());
        let id = reservation
            .parse::<ReservationId>()
            .map_err(|_| unknown())?;
        match self.settle(&id, used).await {
            Ok(Settlement::Settled {
                reserved,
                refunded,
                charged,
            }) => Ok(Settled {
                reserved,
                used,
                refunded,
                charged,
            }),
            Ok(Settlement::AlreadySettled) => Err(SettleRefused::AlreadySettled),
            Ok(Settlement::Expired) => Err(SettleRefused::Expired),
            Ok(Settlement::Unknown) => Err(unknown()),
            Err(e) if e.is_transient() => Err(SettleRefused::StoreFailed(e)),
            Err(e) => Err(SettleRefused::Unsupported(e)),
        }
    }
}

/// A settle that changed the counters: what each limit the reservation took from got back, or
/// was charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// The units the reservation took from each limit.
    pub reserved: u64,
    /// The units used, as the settle said.
    pub used: u64,
    /// The units given back to each limit: reserved minus used.
    pub refunded: u64,
    /// The units charged to each limit beyond the reservation.
    pub charged: u64,
}

/// Why a settle changed nothing, in the words every front end answers with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettleRefused {
    /// `used` is above the largest amount.
    #[error("`used` is {0}; send the units used, a whole number from 0 to {max}", max = u32::MAX)]
    UsedTooLarge(u64),
    /// No such reservation on this store; the id as sent, cut to 64 characters.
    #[error(
        "no reservation `{0}` on this store: it was never made here, or was forgotten twice its \
         ttl after it was made"
    )]
    Unknown(String),
    /// Settled before.
    #[error("this reservation was settled before; this settle refunded and charged nothing")]
    AlreadySettled,
    /// Its ttl ran out first.
    #[error(
        "this reservation's ttl ran out before it was settled: it counted as used in full, and \
         nothing was refunded"
    )]
    Expired,
    /// The store failed; the settle may be retried (a `AlreadySettled` then means the first
    /// attempt settled it).
    #[error("the store failed; retry the settle: {0}")]
    StoreFailed(StoreError),
    /// The store holds no reservations.
    #[error("{0}")]
    Unsupported(StoreError),
}

/// The limiter's field of reservation ttls, set at start-up and read per reservation.
pub(super) type Ttls = std::sync::RwLock<ReservationTtls>;
