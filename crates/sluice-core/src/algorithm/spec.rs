//! What the algorithm table ([`ALGORITHMS`](super::ALGORITHMS)) says of each algorithm: what it
//! is called in rules, which optional parameters it takes, which stores and costs it supports, the
//! fields that identify one of its policies, its number in stored state, and how a rule's numbers
//! build its policy.

use std::time::Duration;

use super::{ALGORITHMS, Alignment};
use crate::policy::{Algorithm, Policy, PolicyError};
use crate::store::UnsupportedPolicy;

/// One algorithm as the rest of Sluice sees it.
#[derive(Debug)]
pub struct AlgorithmSpec {
    /// The algorithm this entry describes.
    pub algorithm: Algorithm,
    /// Its name in rules (`algorithm: token_bucket`), in messages and in metrics.
    pub name: &'static str,
    /// The optional rule parameters it takes besides `requests_per_unit` and the window; any
    /// other is refused where it is written.
    pub params: &'static [Param],
    /// Which stores hold its counters.
    pub stores: Stores,
    /// Which costs a request may have.
    pub costs: Costs,
    /// Whether it limits requests in flight rather than usage over time. Such a limit is
    /// taken only by a reservation, one unit per request whatever the amount, and its settle
    /// gives the unit back whatever was used; a decision without a reservation (a check, which
    /// nothing could release) asks it at cost 0, whether a slot is free. Its ttl cuts the
    /// ttl of a reservation that takes from it, and the IETF fields name its quota unit
    /// `concurrent-requests`.
    pub concurrent: bool,
    /// The exact algorithm whose decisions this one estimates in less memory, if any: the
    /// simulator measures how often the two decide differently (`simulate --counter-error`).
    pub estimates: Option<Algorithm>,
    /// The fields that identify one of its policies, in the order of the counter key's policy
    /// id (`token_bucket;capacity=10;rate=10/1000000000`). Changing them moves every counter.
    pub key_fields: &'static [&'static str],
    /// Its number in stored state that outlives a process (a Redis counter's first field and
    /// the check script's first argument). Instances of two versions share those counters
    /// during a rolling upgrade: a code never changes, and a new algorithm takes a new one.
    pub code: u8,
    /// Builds a policy from a rule's numbers.
    pub(super) build: fn(&PolicyParams) -> Result<Policy, PolicyError>,
}

impl AlgorithmSpec {
    /// The policy a rule's numbers describe: `requests` per `window`, with the optional
    /// parameters filled in as [`PolicyParams`] says.
    pub fn build(&self, params: &PolicyParams) -> Result<Policy, PolicyError> {
        (self.build)(params)
    }

    /// Whether it takes `param`.
    pub fn takes(&self, param: Param) -> bool {
        self.params.contains(&param)
    }
}

/// An optional parameter of a limit in rules, which only some algorithms take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// `burst`: how many requests at once, when not the requests per window.
    Burst,
    /// `queue_size`: how many requests may wait.
    QueueSize,
    /// `max_wait`: the longest a request may wait.
    MaxWait,
    /// `alignment`: windows on the clock, or from a key's first request.
    Alignment,
    /// `utc_offset`: where clock-aligned windows start.
    UtcOffset,
    /// `sub_windows`: how many buckets the window is split into.
    SubWindows,
}

impl Param {
    /// Every parameter, in the order the rules decoder reads them.
    pub const ALL: [Param; 6] = [
        Param::Burst,
        Param::QueueSize,
        Param::MaxWait,
        Param::Alignment,
        Param::UtcOffset,
        Param::SubWindows,
    ];

    /// Its field name in rules.
    pub fn name(self) -> &'static str {
        match self {
            Param::Burst => "burst",
            Param::QueueSize => "queue_size",
            Param::MaxWait => "max_wait",
            Param::Alignment => "alignment",
            Param::UtcOffset => "utc_offset",
            Param::SubWindows => "sub_windows",
        }
    }

    /// The algorithms that take it, by name, for messages: `token_bucket and gcra`.
    pub fn applies_to(self) -> String {
        let names: Vec<&str> = ALGORITHMS
            .iter()
            .filter(|s| s.takes(self))
            .map(|s| s.name)
            .collect();
        match names.split_last() {
            None => String::new(),
            Some((last, [])) => (*last).to_owned(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        }
    }
}

/// Whether a store holds an algorithm's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// It does, within the store's own bounds on numbers.
    Held,
    /// It does not, for this reason (what of the algorithm's state the store cannot keep).
    Refused(&'static str),
}

impl Support {
    /// `Ok` when held, or the refusal of `algorithm` by `store` with its reason.
    pub fn check(self, store: &'static str, algorithm: Algorithm) -> Result<(), UnsupportedPolicy> {
        match self {
            Support::Held => Ok(()),
            Support::Refused(why) => Err(UnsupportedPolicy {
                store,
                reason: format!("{algorithm} keeps {why}; use another algorithm, or another store"),
            }),
        }
    }
}

/// Which stores hold an algorithm's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stores {
    /// The memory store.
    pub memory: Support,
    /// The Redis store, standalone, Sentinel or Cluster.
    pub redis: Support,
    /// The hybrid store, which adds up instances' usage between syncs: only a state that is a
    /// sum can be held.
    pub hybrid: Support,
}

/// Which costs a request may have under an algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Costs {
    /// A cost of 0 decides without consuming (a peek).
    pub zero: bool,
    /// A cost above 1 takes that many units at once, all or none (Envoy's `hits_addend`).
    pub many: bool,
    /// An admitted request may be told to wait its turn (`Decision::delay`) rather than go
    /// at once; such a limit delays unless its rule names another action.
    pub delays: bool,
}

/// A rule's numbers for one limit, which [`AlgorithmSpec::build`] turns into a policy. Each
/// optional parameter is `None` when the rule leaves it out; an algorithm reads only those it
/// takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyParams {
    /// The requests per window (`requests_per_unit`).
    pub requests: u64,
    /// The window, or the period of the rate.
    pub window: Duration,
    /// `burst`; the requests per window when absent.
    pub burst: Option<u64>,
    /// `queue_size`; the requests per window when absent.
    pub queue_size: Option<u64>,
    /// `max_wait`; the window when absent. Zero is refused.
    pub max_wait: Option<Duration>,
    /// `alignment` with `utc_offset`; windows on the UTC clock when absent.
    pub alignment: Option<Alignment>,
    /// `sub_windows`; [`DEFAULT_SUB_WINDOWS`] when absent.
    pub sub_windows: Option<u32>,
}

/// How long a concurrency limit's hold counts when its reservation is never settled, when the
/// rule does not say: the default reservation ttl, so that a reservation made with the defaults
/// holds exactly as long as its slot.
pub const DEFAULT_CONCURRENCY_TTL: Duration = Duration::from_secs(300);

/// How many buckets a bucketed window has when the rule does not say: an hour in minutes, a
/// minute in seconds.
pub const DEFAULT_SUB_WINDOWS: u32 = 60;

impl PolicyParams {
    /// `requests` per `window`, every optional parameter left out.
    pub fn new(requests: u64, window: Duration) -> Self {
        PolicyParams {
            requests,
            window,
            burst: None,
            queue_size: None,
            max_wait: None,
            alignment: None,
            sub_windows: None,
        }
    }
}
