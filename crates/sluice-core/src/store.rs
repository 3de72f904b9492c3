//! The store contract: every front end ends in [`Store::check`].

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::{Algorithm, Decision, Policy, ReservationId};

/// One limit to check for a request: which counter, under which policy, at what cost.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// The counter's identity. Two checks with the same key share one counter.
    pub key: &'a str,
    /// How the counter is limited.
    pub policy: &'a Policy,
    /// How many units the request takes. 0 asks whether one more request would pass, and
    /// consumes nothing.
    pub cost: u64,
}

impl<'a> Check<'a> {
    /// A check of `cost` units on `key` under `policy`.
    pub fn new(key: &'a str, policy: &'a Policy, cost: u64) -> Self {
        Check { key, policy, cost }
    }
}

/// A reservation to record with the checks it reserves: its id and how long it holds before it
/// counts as used in full.
#[derive(Debug, Clone, Copy)]
pub struct Lease<'a> {
    /// The id a settle names it by.
    pub id: &'a ReservationId,
    /// How long the reservation holds. Not settled by then, it counts as used in full: nothing
    /// of it is ever given back.
    pub ttl: Duration,
}

/// Units to give back to one counter outside a reservation: Envoy's `is_negative_hits`.
#[derive(Debug, Clone, Copy)]
pub struct Refund<'a> {
    /// The counter's identity, as in [`Check::key`].
    pub key: &'a str,
    /// How the counter is limited.
    pub policy: &'a Policy,
    /// How many units to give back, as taken now: a window gives them back to its current
    /// window, never below zero.
    pub units: u64,
}

/// What settling a reservation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Settled now. Each counter the reservation took from got back `refunded` units, as far as
    /// it still held them (a window that has ended has nothing to give back), or was charged
    /// `charged` more, past its limit if need be.
    Settled {
        /// The units reserved per counter.
        reserved: u64,
        /// The units given back to each counter: reserved minus used, when less was used.
        refunded: u64,
        /// The units charged to each counter beyond the reservation, when more was used.
        charged: u64,
    },
    /// It was settled before; this settle changed nothing.
    AlreadySettled,
    /// Its ttl ran out before this settle: it counted as used in full, and still does.
    Expired,
    /// The store holds no reservation of this id: never made on this store, or forgotten
    /// long after it expired or was settled.
    Unknown,
}

/// The runtime overrides a store shares between the instances that use it, as one read sees
/// them: opaque entries (an id and a body the engine writes) and the version they are at. The
/// store never reads a body; the engine decodes them, so a store needs no rules to share them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedOverrides {
    /// The version the entries are at: every change raises it by one, so an instance that has
    /// seen this version has seen every change up to it.
    pub version: u64,
    /// Each override's id and body, in no particular order.
    pub entries: Vec<(String, String)>,
}

/// What a settle does to one counter a reservation took from: every store settles through
/// [`Adjustment::of`], so that they all give back and charge alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adjustment {
    /// Give back this many units, taken when the reservation was made.
    Refund(u64),
    /// Take this many more, past the limit if need be.
    Charge(u64),
}

impl Adjustment {
    /// What settling at `used` does to a counter of `algorithm` that the reservation took
    /// `reserved` units from; `None` when nothing changes. Usage limits get back what was
    /// reserved and not used, or are charged what was used beyond it. A limit on requests in
    /// flight gets back everything it held, whatever was used: the request is no longer in
    /// flight, and what it used is no concern of a concurrency limit.
    pub fn of(algorithm: Algorithm, reserved: u64, used: u64) -> Option<Adjustment> {
        let adjustment = if algorithm.spec().concurrent {
            Adjustment::Refund(reserved)
        } else if used < reserved {
            Adjustment::Refund(reserved - used)
        } else {
            Adjustment::Charge(used - reserved)
        };
        match adjustment {
            Adjustment::Refund(0) | Adjustment::Charge(0) => None,
            other => Some(other),
        }
    }
}

/// Why a store could not decide. A denial is not an error: it is a [`Decision`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Every slot the key could take holds a counter that is limited and not yet expired, so the
    /// store cannot track a new key without resetting one. Transient: slots free as keys expire.
    #[error(
        "the store tracks its maximum of {max_keys} keys and all candidates for eviction are \
             limited; raise the key limit, or wait for counters to expire"
    )]
    Full {
        /// The store's configured key limit.
        max_keys: usize,
    },
    /// The store did not answer in time.
    #[error("the store did not answer within {0:?}; check its health and network")]
    Timeout(Duration),
    /// The store could not be reached or failed while answering.
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    /// The store refused the request itself; retrying the same request will not help.
    #[error("the store rejected the request: {0}")]
    Rejected(String),
}

impl StoreError {
    /// Whether retrying later may succeed. Callers use it to decide between a fallback (a
    /// transient outage) and a bug report (a permanent refusal).
    pub fn is_transient(&self) -> bool {
        !matches!(self, StoreError::Rejected(_))
    }
}

/// A policy that a store cannot hold, and why. Stores report it when rules load, so that such a
/// rule is refused with its location instead of failing every request it applies to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {store} store cannot hold this policy: {reason}")]
pub struct UnsupportedPolicy {
    /// The store, by the scheme of its `--store` URL, such as `redis`.
    pub store: &'static str,
    /// What the store cannot hold, and what to do instead.
    pub reason: String,
}

/// The result of a store call.
pub type StoreResult<T> = Result<T, StoreError>;

/// Where counters live. Every front end, in process or over the wire, ends in [`Store::check`].
pub trait Store: Send + Sync + 'static {
    /// Decides every check at once, atomically: either every check admits the request and all of
    /// them consume, or none consumes. Returns one decision per check, in order.
    fn check(
        &self,
        checks: &[Check<'_>],
    ) -> impl Future<Output = StoreResult<Vec<Decision>>> + Send;

    /// Decides one check at once, when the store can without waiting because its counters are
    /// in this process: the decision [`Store::check`] gives for `&[check]`, without its future
    /// and vector. `None` when the store has to wait (on a network, say); the caller then goes
    /// through [`Store::check`]. The single-check path of every front end tries it first, so
    /// the memory store decides there without an allocation.
    ///
    /// The default is `None`, for stores that always wait.
    fn check_now(&self, _check: Check<'_>) -> Option<StoreResult<Decision>> {
        None
    }

    /// The decision a cost-0 check would get, without creating or changing any state.
    fn peek(
        &self,
        key: &str,
        policy: &Policy,
    ) -> impl Future<Output = StoreResult<Decision>> + Send;

    /// Forgets the counter `key`, so its next request finds it full. Returns whether it existed.
    fn reset(&self, key: &str) -> impl Future<Output = StoreResult<bool>> + Send;

    /// How many counters the store tracks, where it can tell cheaply.
    fn tracked_keys(&self) -> Option<usize> {
        None
    }

    /// Whether the store can hold `policy` at all. Callers ask once per rule when rules load,
    /// and refuse a rule the store cannot hold then: its checks would otherwise each fail with
    /// [`StoreError::Rejected`], and the rule's `on_store_error` would quietly decide instead.
    /// A store that delegates to another asks the store that holds the counters.
    ///
    /// The default accepts every policy, as the memory store does.
    fn supports(&self, _policy: &Policy) -> Result<(), UnsupportedPolicy> {
        Ok(())
    }

    /// Decides `checks` as [`Store::check`] does and, when every check admits, records what
    /// each took under `lease`, in the same atomic step: a reservation exists exactly when its
    /// checks consumed. [`Store::settle`] later gives back what was not used. Every instance
    /// that shares the store can settle it.
    ///
    /// The default refuses: a store that cannot record reservations says so rather than
    /// admitting usage it could never give back.
    fn reserve(
        &self,
        checks: &[Check<'_>],
        lease: Lease<'_>,
    ) -> impl Future<Output = StoreResult<Vec<Decision>>> + Send {
        let _ = (checks, lease);
        std::future::ready(Err(StoreError::Rejected(
            "this store does not hold reservations: usage limits need the memory or a Redis store"
                .to_owned(),
        )))
    }

    /// Settles the reservation `id` at `used` units: every counter it took from gets back what
    /// was reserved and not used, or is charged what was used beyond it. Only the first settle
    /// of a reservation changes anything, and only before its ttl ends. The counters are
    /// adjusted last check first, on every store: where two checks share a counter, the other
    /// order could leave it otherwise (docs/algorithms.md, "Refunds and charges").
    fn settle(
        &self,
        id: &ReservationId,
        used: u64,
    ) -> impl Future<Output = StoreResult<Settlement>> + Send {
        let _ = (id, used);
        std::future::ready(Err(StoreError::Rejected(
            "this store does not hold reservations: usage limits need the memory or a Redis store"
                .to_owned(),
        )))
    }

    /// Gives units back to counters outside a reservation (Envoy's `is_negative_hits`), never
    /// past what a counter can hold. Returns the decision a cost-0 check of each would get
    /// after it.
    fn refund(
        &self,
        refunds: &[Refund<'_>],
    ) -> impl Future<Output = StoreResult<Vec<Decision>>> + Send {
        let _ = refunds;
        std::future::ready(Err(StoreError::Rejected(
            "this store does not give units back".to_owned(),
        )))
    }

    /// Whether the store shares runtime overrides between the instances that use it (the
    /// Redis stores and those built on one do). The engine keeps the overrides of a store that
    /// does not in its own process, local to that instance, and says so.
    fn shares_overrides(&self) -> bool {
        false
    }

    /// Stores the override `id` with `body`, replacing any of that id, and returns the version
    /// this change made. Changes are totally ordered: of concurrent puts to one id, the one with
    /// the higher version is what every instance ends up with.
    ///
    /// The default refuses, for a store that does not share overrides.
    fn put_override(&self, id: &str, body: &str) -> impl Future<Output = StoreResult<u64>> + Send {
        let _ = (id, body);
        std::future::ready(Err(no_shared_overrides()))
    }

    /// Removes the override `id`, if stored, and returns the version this change made.
    fn remove_override(&self, id: &str) -> impl Future<Output = StoreResult<u64>> + Send {
        let _ = id;
        std::future::ready(Err(no_shared_overrides()))
    }

    /// The version the shared overrides are at, a cheap read that instances poll to learn
    /// whether to read [`Store::overrides`] again. 0 when none was ever stored.
    fn override_version(&self) -> impl Future<Output = StoreResult<u64>> + Send {
        std::future::ready(Err(no_shared_overrides()))
    }

    /// Every shared override and the version they are at, read atomically.
    fn overrides(&self) -> impl Future<Output = StoreResult<SharedOverrides>> + Send {
        std::future::ready(Err(no_shared_overrides()))
    }

    /// Told that `checks`, which this store failed to decide, were admitted all the same by
    /// their rules' `on_store_error` (`allow`, or `local` within its own limit). A store that
    /// keeps usage to push later (the hybrid store) counts them, so that what a fallback admitted
    /// during an outage is counted against the limit once the store is back.
    ///
    /// The default forgets them: a store that could not be reached has nowhere to put them.
    fn admitted_without_store(&self, _checks: &[Check<'_>]) {}
}

/// A boxed future, for [`DynStore`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`Store`] in a form that can sit behind `Arc<dyn DynStore>`, for callers that choose the store
/// at run time. Every `Store` is a `DynStore`; the price is one allocation per call.
pub trait DynStore: Send + Sync + 'static {
    /// See [`Store::check`].
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> BoxFuture<'a, StoreResult<Vec<Decision>>>;
    /// See [`Store::check_now`]: a single check without a box, where the store can.
    fn check_now(&self, check: Check<'_>) -> Option<StoreResult<Decision>>;
    /// See [`Store::peek`].
    fn peek<'a>(&'a self, key: &'a str, policy: &'a Policy)
    -> BoxFuture<'a, StoreResult<Decision>>;
    /// See [`Store::reset`].
    fn reset<'a>(&'a self, key: &'a str) -> BoxFuture<'a, StoreResult<bool>>;
    /// See [`Store::tracked_keys`].
    fn tracked_keys(&self) -> Option<usize>;
    /// See [`Store::supports`].
    fn supports(&self, policy: &Policy) -> Result<(), UnsupportedPolicy>;
    /// See [`Store::reserve`].
    fn reserve<'a>(
        &'a self,
        checks: &'a [Check<'a>],
        lease: Lease<'a>,
    ) -> BoxFuture<'a, StoreResult<Vec<Decision>>>;
    /// See [`Store::settle`].
    fn settle<'a>(
        &'a self,
        id: &'a ReservationId,
        used: u64,
    ) -> BoxFuture<'a, StoreResult<Settlement>>;
    /// See [`Store::refund`].
    fn refund<'a>(&'a self, refunds: &'a [Refund<'a>])
    -> BoxFuture<'a, StoreResult<Vec<Decision>>>;
    /// See [`Store::admitted_without_store`].
    fn admitted_without_store(&self, checks: &[Check<'_>]);
    /// See [`Store::shares_overrides`].
    fn shares_overrides(&self) -> bool;
    /// See [`Store::put_override`].
    fn put_override<'a>(&'a self, id: &'a str, body: &'a str) -> BoxFuture<'a, StoreResult<u64>>;
    /// See [`Store::remove_override`].
    fn remove_override<'a>(&'a self, id: &'a str) -> BoxFuture<'a, StoreResult<u64>>;
    /// See [`Store::override_version`].
    fn override_version(&self) -> BoxFuture<'_, StoreResult<u64>>;
    /// See [`Store::overrides`].
    fn overrides(&self) -> BoxFuture<'_, StoreResult<SharedOverrides>>;
}

impl<S: Store> DynStore for S {
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> BoxFuture<'a, StoreResult<Vec<Decision>>> {
        Box::pin(Store::check(self, checks))
    }

    fn check_now(&self, check: Check<'_>) -> Option<StoreResult<Decision>> {
        Store::check_now(self, check)
    }

    fn peek<'a>(
        &'a self,
        key: &'a str,
        policy: &'a Policy,
    ) -> BoxFuture<'a, StoreResult<Decision>> {
        Box::pin(Store::peek(self, key, policy))
    }

    fn reset<'a>(&'a self, key: &'a str) -> BoxFuture<'a, StoreResult<bool>> {
        Box::pin(Store::reset(self, key))
    }

    fn tracked_keys(&self) -> Option<usize> {
        Store::tracked_keys(self)
    }

    fn supports(&self, policy: &Policy) -> Result<(), UnsupportedPolicy> {
        Store::supports(self, policy)
    }

    fn reserve<'a>(
        &'a self,
        checks: &'a [Check<'a>],
        lease: Lease<'a>,
    ) -> BoxFuture<'a, StoreResult<Vec<Decision>>> {
        Box::pin(Store::reserve(self, checks, lease))
    }

    fn settle<'a>(
        &'a self,
        id: &'a ReservationId,
        used: u64,
    ) -> BoxFuture<'a, StoreResult<Settlement>> {
        Box::pin(Store::settle(self, id, used))
    }

    fn refund<'a>(
        &'a self,
        refunds: &'a [Refund<'a>],
    ) -> BoxFuture<'a, StoreResult<Vec<Decision>>> {
        Box::pin(Store::refund(self, refunds))
    }

    fn admitted_without_store(&self, checks: &[Check<'_>]) {
        Store::admitted_without_store(self, checks)
    }

    fn shares_overrides(&self) -> bool {
        Store::shares_overrides(self)
    }

    fn put_override<'a>(&'a self, id: &'a str, body: &'a str) -> BoxFuture<'a, StoreResult<u64>> {
        Box::pin(Store::put_override(self, id, body))
    }

    fn remove_override<'a>(&'a self, id: &'a str) -> BoxFuture<'a, StoreResult<u64>> {
        Box::pin(Store::remove_override(self, id))
    }

    fn override_version(&self) -> BoxFuture<'_, StoreResult<u64>> {
        Box::pin(Store::override_version(self))
    }

    fn overrides(&self) -> BoxFuture<'_, StoreResult<SharedOverrides>> {
        Box::pin(Store::overrides(self))
    }
}

/// What a store that does not share overrides answers when asked to.
fn no_shared_overrides() -> StoreError {
    StoreError::Rejected(
        "this store does not share overrides between instances: the engine keeps them in \
         its own process"
            .to_owned(),
    )
}
