//! The one table of the algorithms: what each is called in rules, which optional parameters it
//! takes, which stores and costs it supports, the fields that identify one of its policies, and
//! its number in stored state.
//!
//! Everything outside an algorithm's own module that needs to know one of these facts reads it
//! here: the rules decoder (names, parameters, the default action), the unknown-algorithm
//! message, the simulator's comparison, the counter keys, and the stores' gates. A new algorithm
//! is its module, its Lua file in `sluice-redis`, and one entry below.

use std::time::Duration;

use super::{BucketedWindow, FixedWindow, Gcra, LeakyQueue, SlidingCounter, SlidingLog};
use super::{TokenBucket, fixed_window::Alignment};
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
    /// The fields that identify one of its policies, in the order of the counter key's policy
    /// id (`token_bucket;capacity=10;rate=10/1000000000`). Changing them moves every counter.
    pub key_fields: &'static [&'static str],
    /// Its number in stored state that outlives a process (a Redis counter's first field and
    /// the check script's first argument). Instances of two versions share those counters
    /// during a rolling upgrade: a code never changes, and a new algorithm takes a new one.
    pub code: u8,
    /// Builds a policy from a rule's numbers.
    build: fn(&PolicyParams) -> Result<Policy, PolicyError>,
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

/// Every algorithm, in documentation order; `Algorithm::ALL` follows it.
pub const ALGORITHMS: [AlgorithmSpec; 7] = [
    AlgorithmSpec {
        algorithm: Algorithm::TokenBucket,
        name: "token_bucket",
        params: &[Param::Burst],
        stores: Stores {
            memory: Support::Held,
            redis: Support::Held,
            hybrid: Support::Held,
        },
        costs: Costs {
            zero: true,
            many: true,
            delays: false,
        },
        key_fields: &["capacity", "rate"],
        code: 1,
        build: TokenBucket::from_params,
    },
    AlgorithmSpec {
        algorithm: Algorithm::Gcra,
        name: "gcra",
        params: &[Param::Burst],
        stores: Stores {
            memory: Support::Held,
            redis: Support::Held,
            hybrid: Support::Held,
        },
        costs: Costs {
            zero: true,
            many: true,
            delays: false,
        },
        key_fields: &["burst", "rate"],
        code: 2,
        build: Gcra::from_params,
    },
    AlgorithmSpec {
        algorithm: Algorithm::LeakyQueue,
        name: "leaky_queue",
        params: &[Param::QueueSize, Param::MaxWait],
        stores: Stores {
            memory: Support::Held,
            redis: Support::Held,
            hybrid: Support::Refused("a release time per request"),
        },
        costs: Costs {
            zero: true,
            many: true,
            delays: true,
        },
        key_fields: &["queue", "max_wait", "rate"],
        code: 3,
        build: LeakyQueue::from_params,
    },
    AlgorithmSpec {
        algorithm: Algorithm::FixedWindow,
        name: "fixed_window",
        params: &[Param::Alignment, Param::UtcOffset],
        stores: Stores {
            memory: Support::Held,
            redis: Support::Held,
            hybrid: Support::Held,
        },
        costs: Costs {
            zero: true,
            many: true,
            delays: false,
        },
        key_fields: &["limit", "window", "align"],
        code: 4,
        build: FixedWindow::from_params,
    },
    AlgorithmSpec {
        algorithm: Algorithm::SlidingLog,
        name: "sliding_log",
        params: &[],
        stores: Stores {
            memory: Support::Held,
            redis: Support::Held,
            hybrid: Support::Refused("one entry per request"),
        },
        costs: Costs {
            zero: true,
            many: true,
            delays: false,
        },
        key_fields: &["limit", "window"],
        code: 5,
        build: SlidingLog::from_params,
    },
    AlgorithmSpec {
        algorithm: Algorithm::SlidingCounter,
        name: "sliding_counter",
        params: &[],
        stores: Stores {
            memory: Support::Held,
            redis: Support::Held,
            hybrid: Support::Held,
        },
        costs: Costs {
            zero: true,
            many: true,
            delays: false,
        },
        key_fields: &["limit", "window"],
        code: 6,
        build: SlidingCounter::from_params,
    },
    AlgorithmSpec {
        algorithm: Algorithm::BucketedWindow,
        name: "bucketed_window",
        params: &[Param::SubWindows],
        stores: Stores {
            memory: Support::Held,
            redis: Support::Held,
            hybrid: Support::Refused("a count per sub-window, which the sync does not carry"),
        },
        costs: Costs {
            zero: true,
            many: true,
            delays: false,
        },
        key_fields: &["limit", "window", "sub_windows"],
        code: 7,
        build: BucketedWindow::from_params,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_sits_at_its_algorithms_place() {
        for (i, spec) in ALGORITHMS.iter().enumerate() {
            assert_eq!(spec.algorithm as usize, i, "{}", spec.name);
            assert_eq!(Algorithm::ALL[i], spec.algorithm);
        }
    }

    #[test]
    fn names_and_codes_are_unique() {
        for (i, a) in ALGORITHMS.iter().enumerate() {
            for b in &ALGORITHMS[i + 1..] {
                assert_ne!(a.name, b.name);
                assert_ne!(a.code, b.code);
            }
        }
    }

    #[test]
    fn a_parameter_names_the_algorithms_it_applies_to() {
        assert_eq!(Param::Burst.applies_to(), "token_bucket and gcra");
        assert_eq!(Param::MaxWait.applies_to(), "leaky_queue");
        assert_eq!(Param::UtcOffset.applies_to(), "fixed_window");
    }

    #[test]
    fn every_default_builds_each_algorithm() {
        let params = PolicyParams::new(10, Duration::from_secs(60));
        for spec in &ALGORITHMS {
            let policy = spec.build(&params).unwrap();
            assert_eq!(policy.algorithm(), spec.algorithm);
            assert_eq!(policy.window(), Duration::from_secs(60));
        }
    }

    #[test]
    fn the_unknown_algorithm_message_lists_every_algorithm() {
        let message = crate::UnknownAlgorithm("token_buckt".into()).to_string();
        for spec in &ALGORITHMS {
            assert!(message.contains(spec.name), "{message}");
        }
    }

    /// The policy ids in counter keys, pinned: a change to any of them would reset every
    /// counter of that algorithm in every deployment on upgrade.
    #[test]
    fn key_ids_are_the_stored_forms() {
        let minute = Duration::from_secs(60);
        let params = PolicyParams {
            burst: Some(7),
            queue_size: Some(3),
            max_wait: Some(Duration::from_secs(2)),
            alignment: Some(Alignment::Clock {
                utc_offset_secs: -3600,
            }),
            sub_windows: Some(6),
            ..PolicyParams::new(10, minute)
        };
        let ids: Vec<String> = ALGORITHMS
            .iter()
            .map(|s| s.build(&params).unwrap().key_id())
            .collect();
        assert_eq!(
            ids,
            [
                "token_bucket;capacity=7;rate=10/60000000000",
                "gcra;burst=7;rate=10/60000000000",
                "leaky_queue;queue=3;max_wait=2000000000;rate=10/60000000000",
                "fixed_window;limit=10;window=60000000000;align=clock-3600",
                "sliding_log;limit=10;window=60000000000",
                "sliding_counter;limit=10;window=60000000000",
                "bucketed_window;limit=10;window=60000000000;sub_windows=6",
            ]
        );
        let first = PolicyParams {
            alignment: Some(Alignment::FirstRequest),
            ..PolicyParams::new(10, minute)
        };
        assert_eq!(
            FixedWindow::from_params(&first).unwrap().key_id(),
            "fixed_window;limit=10;window=60000000000;align=first_request"
        );
    }
}
