//! The eight algorithms, each a pure function of `(state, now, policy, cost)` in its own module,
//! and [`ALGORITHMS`], the one table that describes them to the rest of Sluice.
//!
//! The sliding log and the concurrency limit keep the same state, an [`ExpiringLog`] of entries
//! that each count for a fixed time, and decide, record, refund and charge through its one
//! implementation, each with its own parameters and its own advice to a refused request.
//!
//! None of them reads a clock, allocates on the common path, or panics on any input: a clock
//! that steps backwards is treated as no time passing, and arithmetic saturates.
//!
//! Everything outside an algorithm's own module that needs to know what it is called, which
//! parameters it takes, which stores hold it, which costs it takes, what identifies one of its
//! policies or its stored code reads the table: the rules decoder (names, parameters, the default
//! action), the unknown-algorithm messages, the simulator's comparison, the counter keys, the
//! stores' gates and the Redis scripts' codes. A new algorithm is its module here, its Lua file in
//! `sluice-redis`, and one entry in the table.

mod bucketed_window;
mod concurrency_limit;
mod divisor;
mod expiring_log;
mod fixed_window;
mod gcra;
mod leaky_queue;
mod sliding_counter;
mod sliding_log;
mod spec;
mod store_form;
mod token_bucket;

pub use bucketed_window::{BucketedWindow, BucketedWindowState};
pub use concurrency_limit::{ConcurrencyLimit, ConcurrencyLimitState};
pub use expiring_log::ExpiringLog;
pub use fixed_window::{Alignment, FixedWindow, FixedWindowState};
pub use gcra::Gcra;
pub use leaky_queue::LeakyQueue;
pub use sliding_counter::{SlidingCounter, SlidingCounterState};
pub use sliding_log::{SlidingLog, SlidingLogState};
pub use spec::{
    AlgorithmSpec, Costs, DEFAULT_CONCURRENCY_TTL, DEFAULT_SUB_WINDOWS, Param, PolicyParams,
    Stores, Support,
};
pub use store_form::{Magnitude, Magnitudes, StoreParams};
pub use token_bucket::{TokenBucket, TokenBucketState};

use crate::policy::Algorithm;
use sliding_counter::INSTEAD_OF_A_LARGE_LOG;

/// Every algorithm, in documentation order; `Algorithm::ALL` follows it.
pub const ALGORITHMS: [AlgorithmSpec; 8] = [
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
        concurrent: false,
        estimates: None,
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
        concurrent: false,
        estimates: None,
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
        concurrent: false,
        estimates: None,
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
        concurrent: false,
        estimates: None,
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
        concurrent: false,
        estimates: None,
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
        concurrent: false,
        estimates: Some(Algorithm::SlidingLog),
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
        concurrent: false,
        estimates: Some(Algorithm::SlidingLog),
        key_fields: &["limit", "window", "sub_windows"],
        code: 7,
        build: BucketedWindow::from_params,
    },
    AlgorithmSpec {
        algorithm: Algorithm::ConcurrencyLimit,
        name: "concurrency_limit",
        params: &[],
        stores: Stores {
            memory: Support::Held,
            redis: Support::Held,
            hybrid: Support::Refused(
                "one hold per request in flight, which the sync, carrying sums, does not hold",
            ),
        },
        costs: Costs {
            zero: true,
            many: true,
            delays: false,
        },
        concurrent: true,
        estimates: None,
        key_fields: &["limit", "ttl"],
        code: 8,
        build: ConcurrencyLimit::from_params,
    },
];

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
            assert_eq!(policy.requests_per().1, Duration::from_secs(60));
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
                "concurrency_limit;limit=10;ttl=60000000000",
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
