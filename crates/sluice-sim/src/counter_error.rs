//! The sliding counter's error, measured: how often its estimate decides differently from the
//! exact sliding log. The bucketed window, whose granularity is its own approximation, is
//! measured the same way.
//!
//! Method. A trace of many keys with heavy-tailed popularity (Zipf) and bursts runs through a
//! memory store holding the sliding counter, exactly as the service would decide it. Beside it,
//! for each key, an exact sliding log holds the requests the counter admitted. For every request
//! the log's pure decision on that same history says what an exact limiter would have answered
//! at that instant. The two agree, or the counter admitted a request the exact rule refuses
//! (wrongly admitted), or refused one it admits (wrongly rejected). Comparing on the counter's own
//! history measures each decision, rather than two runs that drift apart after one difference.

use std::time::Duration;

use sluice_core::{
    ALGORITHMS, Algorithm, Check, FakeClock, MemoryStore, Param, Policy, PolicyError, PolicyParams,
    SlidingLog, SlidingLogState,
};

use crate::rng::Rng;
use crate::run::START;

/// The algorithm whose decisions are compared with the exact log's: one that the algorithm table
/// says estimates the sliding log, with its sub-windows when it takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimator {
    algorithm: Algorithm,
    sub_windows: Option<u32>,
}

impl Estimator {
    /// The algorithm that estimates the sliding log: the first in the table that takes
    /// sub-windows when `sub_windows` is given (the bucketed window), the first that does not
    /// otherwise (the sliding counter). `None` when the table has no such algorithm.
    pub fn of_log(sub_windows: Option<u32>) -> Option<Estimator> {
        ALGORITHMS
            .iter()
            .find(|s| {
                s.estimates == Some(Algorithm::SlidingLog)
                    && s.takes(Param::SubWindows) == sub_windows.is_some()
            })
            .map(|s| Estimator {
                algorithm: s.algorithm,
                sub_windows,
            })
    }

    /// The algorithm's name, with its buckets.
    pub fn describe(self) -> String {
        let name = self.algorithm.name();
        match self.sub_windows {
            Some(sub_windows) => format!("{name} ({sub_windows} sub-windows)"),
            None => name.to_owned(),
        }
    }

    fn policy(self, limit: u64, window: Duration) -> Result<Policy, PolicyError> {
        self.algorithm.spec().build(&PolicyParams {
            sub_windows: self.sub_windows,
            ..PolicyParams::new(limit, window)
        })
    }
}

/// The traffic and the limit to measure with.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    /// The algorithm measured against the exact log.
    pub estimator: Estimator,
    /// Requests in the trace.
    pub requests: u64,
    /// Distinct keys.
    pub keys: u32,
    /// The Zipf exponent of key popularity: 1.0 makes the k-th key k times rarer than the first.
    pub zipf: f64,
    /// Share of arrivals that start a burst instead of a single request.
    pub burst_share: f64,
    /// Largest burst, in requests within one second.
    pub burst_max: u64,
    /// The limit per window, for every key.
    pub limit: u64,
    /// The window.
    pub window: Duration,
    /// How long the trace lasts.
    pub duration: Duration,
    /// Fixes the trace.
    pub seed: u64,
}

impl Default for Setup {
    /// One million requests over 10,000 keys in an hour, Zipf 1.0, 1% of arrivals a burst of
    /// up to 50, at 100 a minute: the busiest keys are far over, hundreds hover around the limit,
    /// and the long tail is far under.
    fn default() -> Self {
        Setup {
            estimator: Estimator::of_log(None)
                .unwrap_or_else(|| panic!("the algorithm table names no estimator of the log")),
            requests: 1_000_000,
            keys: 10_000,
            zipf: 1.0,
            burst_share: 0.01,
            burst_max: 50,
            limit: 100,
            window: Duration::from_secs(60),
            duration: Duration::from_secs(3600),
            seed: 1,
        }
    }
}

/// How hard a key pushes on its limit: its requests over the whole trace against what the limit
/// admits over the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Offered less than half of what the limit admits.
    Under,
    /// Offered between half and twice what the limit admits.
    Near,
    /// Offered more than twice what the limit admits.
    Over,
}

impl Load {
    /// Every class, in the table's order.
    pub const ALL: [Load; 3] = [Load::Under, Load::Near, Load::Over];

    fn of(offered: u64, admissible: f64) -> Load {
        let ratio = offered as f64 / admissible.max(f64::MIN_POSITIVE);
        if ratio < 0.5 {
            Load::Under
        } else if ratio <= 2.0 {
            Load::Near
        } else {
            Load::Over
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Load::Under => "keys offering under half the limit",
            Load::Near => "keys offering half to twice the limit",
            Load::Over => "keys offering over twice the limit",
        }
    }
}

/// Decisions and disagreements within one class of keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassTally {
    /// Keys in the class.
    pub keys: u64,
    /// Decisions on those keys.
    pub decisions: u64,
    /// Admitted by the counter, refused by the exact log.
    pub wrongly_admitted: u64,
    /// Refused by the counter, admitted by the exact log.
    pub wrongly_rejected: u64,
}

/// What the comparison found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// By [`Load`], in the order of [`Load::ALL`].
    pub by_load: [ClassTally; 3],
    /// Decisions compared.
    pub decisions: u64,
    /// Requests the counter admitted.
    pub counter_admitted: u64,
    /// Admitted by the counter, refused by the exact log on the same history.
    pub wrongly_admitted: u64,
    /// Refused by the counter, admitted by the exact log on the same history.
    pub wrongly_rejected: u64,
    /// Decisions where the exact count was within 10% of the limit: where an estimate can err.
    pub near_limit: u64,
    /// Keys that saw at least one request.
    pub keys_seen: u64,
}

impl Tally {
    /// Decisions on which the two differ.
    pub fn disagreements(&self) -> u64 {
        self.wrongly_admitted + self.wrongly_rejected
    }

    /// `n` as a percentage of all decisions.
    pub fn percent(&self, n: u64) -> f64 {
        100.0 * n as f64 / self.decisions.max(1) as f64
    }

    /// The result as a Markdown table.
    pub fn markdown(&self, setup: &Setup) -> String {
        let row = |what: &str, n: u64| format!("| {what} | {n} | {:.4}% |\n", self.percent(n));
        let mut out = format!(
            "{} against the exact sliding log: {} requests over {} keys ({} seen), \
             Zipf {}, {}% of arrivals a burst of up to {}, {} per {:?} for {:?}, seed {}.\n\n",
            setup.estimator.describe(),
            setup.requests,
            setup.keys,
            self.keys_seen,
            setup.zipf,
            setup.burst_share * 100.0,
            setup.burst_max,
            setup.limit,
            setup.window,
            setup.duration,
            setup.seed
        );
        out.push_str("| | decisions | share of all |\n|---|---:|---:|\n");
        out.push_str(&row("compared", self.decisions));
        out.push_str(&row("admitted", self.counter_admitted));
        out.push_str(&row(
            "within 10% of the limit (exact count)",
            self.near_limit,
        ));
        out.push_str(&row("**disagree**", self.disagreements()));
        out.push_str(&row(
            "wrongly admitted (estimate yes, log no)",
            self.wrongly_admitted,
        ));
        out.push_str(&row(
            "wrongly rejected (estimate no, log yes)",
            self.wrongly_rejected,
        ));
        out.push_str(
            "\n| keys by offered load | keys | decisions | disagree | wrongly admitted \
             | wrongly rejected |\n|---|---:|---:|---:|---:|---:|\n",
        );
        for (load, c) in Load::ALL.iter().zip(&self.by_load) {
            let share = |n: u64| 100.0 * n as f64 / c.decisions.max(1) as f64;
            out.push_str(&format!(
                "| {} | {} | {} | {:.4}% | {:.4}% | {:.4}% |\n",
                load.describe(),
                c.keys,
                c.decisions,
                share(c.wrongly_admitted + c.wrongly_rejected),
                share(c.wrongly_admitted),
                share(c.wrongly_rejected),
            ));
        }
        out
    }
}

/// Runs the comparison described in the module's documentation.
pub fn measure(setup: &Setup) -> Result<Tally, PolicyError> {
    let counter = setup.estimator.policy(setup.limit, setup.window)?;
    let exact = SlidingLog::new(setup.limit, setup.window)?;
    let arrivals = zipf_trace(setup);
    let names: Vec<String> = (0..setup.keys).map(|k| format!("k{k}")).collect();
    let clock = FakeClock::at(START);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(1)
        .max_keys(setup.keys as usize)
        .build();
    let mut logs: Vec<SlidingLogState> = vec![SlidingLogState::default(); setup.keys as usize];
    let mut tally = Tally::default();
    let near = setup.limit / 10;
    let mut offered = vec![0u64; setup.keys as usize];
    for &(_, key) in &arrivals {
        offered[key as usize] += 1;
    }
    let windows = setup.duration.as_secs_f64() / setup.window.as_secs_f64();
    let load: Vec<usize> = offered
        .iter()
        .map(|&n| {
            let class = Load::of(n, windows * setup.limit as f64);
            Load::ALL.iter().position(|&l| l == class).unwrap_or(0)
        })
        .collect();
    for (k, &n) in offered.iter().enumerate() {
        if n > 0 {
            tally.by_load[load[k]].keys += 1;
        }
    }
    for (at, key) in arrivals {
        let now = START.saturating_add(at);
        clock.set(now);
        let log = &mut logs[key as usize];
        let truth = exact.decide(log, now, 1);
        // What the window holds before this request: an admitted one took 1 from `remaining`.
        let before = truth.remaining + u64::from(truth.allowed);
        let used = setup.limit.saturating_sub(before);
        if used.abs_diff(setup.limit) <= near {
            tally.near_limit += 1;
        }
        let decided = store
            .check_one(Check::new(&names[key as usize], &counter, 1))
            .unwrap_or_else(|e| panic!("the memory store refused a check: {e}"));
        tally.decisions += 1;
        let class = &mut tally.by_load[load[key as usize]];
        class.decisions += 1;
        match (decided.allowed, truth.allowed) {
            (true, false) => {
                tally.wrongly_admitted += 1;
                class.wrongly_admitted += 1;
            }
            (false, true) => {
                tally.wrongly_rejected += 1;
                class.wrongly_rejected += 1;
            }
            _ => {}
        }
        if decided.allowed {
            tally.counter_admitted += 1;
            exact.record(log, now, 1);
        }
    }
    tally.keys_seen = offered.iter().filter(|&&n| n > 0).count() as u64;
    Ok(tally)
}

/// `(arrival, key)` pairs in time order: a Poisson stream of arrivals over the duration, each
/// for a Zipf-chosen key, a share of them bursts of several requests within one second.
fn zipf_trace(setup: &Setup) -> Vec<(Duration, u32)> {
    let mut rng = Rng::new(setup.seed);
    // The cumulative popularity of keys 0..k, for choosing a key by binary search.
    let mut cdf = Vec::with_capacity(setup.keys as usize);
    let mut total = 0.0;
    for rank in 1..=setup.keys {
        total += 1.0 / f64::from(rank).powf(setup.zipf);
        cdf.push(total);
    }
    let mean_burst = (2 + setup.burst_max) as f64 / 2.0;
    let arrivals_per_request = 1.0 / (1.0 - setup.burst_share + setup.burst_share * mean_burst);
    let rate = setup.requests as f64 * arrivals_per_request / setup.duration.as_secs_f64();
    let mut out = Vec::with_capacity(setup.requests as usize);
    let mut t = 0.0;
    while (out.len() as u64) < setup.requests {
        t += rng.exponential(rate);
        let pick = rng.unit() * total;
        let key = cdf.partition_point(|&c| c < pick).min(cdf.len() - 1) as u32;
        let size = if rng.unit() < setup.burst_share {
            2 + rng.below(setup.burst_max - 1)
        } else {
            1
        };
        for _ in 0..size.min(setup.requests - out.len() as u64) {
            out.push((Duration::from_secs_f64(t + rng.unit()), key));
        }
    }
    out.sort_by_key(|a| a.0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Setup {
        Setup {
            requests: 60_000,
            keys: 500,
            duration: Duration::from_secs(600),
            ..Setup::default()
        }
    }

    #[test]
    fn the_counter_is_close_to_the_log_and_the_tally_adds_up() {
        let setup = small();
        let t = measure(&setup).unwrap();
        assert_eq!(t.decisions, setup.requests);
        // Heavy-tailed traffic: many requests are refused, many near the limit, and a few
        // decisions differ, both ways, far fewer than those near the limit.
        assert!(t.counter_admitted > t.decisions / 10 && t.counter_admitted < t.decisions);
        assert!(t.near_limit > 100, "{t:?}");
        assert!(
            t.disagreements() > 0 && t.disagreements() < t.near_limit / 2,
            "{t:?}"
        );
        // Keys far under their limit meet it only in a burst, so the estimate errs far less
        // often for them than for keys pressing on it.
        let rate =
            |c: ClassTally| (c.wrongly_admitted + c.wrongly_rejected) as f64 / c.decisions as f64;
        let (under, over) = (t.by_load[0], t.by_load[2]);
        assert!(under.keys > 0 && over.keys > 0, "{t:?}");
        assert!(rate(under) * 10.0 < rate(over), "{t:?}");
        let classes: u64 = t.by_load.iter().map(|c| c.decisions).sum();
        assert_eq!(classes, t.decisions);
        let wrong: u64 = t
            .by_load
            .iter()
            .map(|c| c.wrongly_admitted + c.wrongly_rejected)
            .sum();
        assert_eq!(wrong, t.disagreements());
        assert!(t.keys_seen > 100 && t.keys_seen <= 500, "{t:?}");
        let table = t.markdown(&setup);
        assert!(table.contains("| **disagree** |"), "{table}");
    }

    #[test]
    fn finer_buckets_err_less_and_only_by_admitting() {
        let with = |sub_windows| {
            measure(&Setup {
                estimator: Estimator::of_log(Some(sub_windows)).unwrap(),
                ..small()
            })
            .unwrap()
        };
        let (coarse, fine) = (with(2), with(60));
        assert!(
            fine.disagreements() < coarse.disagreements(),
            "{fine:?} {coarse:?}"
        );
        // The live buckets span less than a window (the oldest one is dropped whole as soon as
        // the window's start passes its start), so they never count more than the log: they
        // may admit what the log refuses, never the reverse.
        assert_eq!(fine.wrongly_rejected, 0, "{fine:?}");
        assert!(fine.wrongly_admitted > 0, "{fine:?}");
    }

    #[test]
    fn the_table_names_the_sliding_counter_and_the_bucketed_window_as_estimators() {
        assert_eq!(Setup::default().estimator.describe(), "sliding_counter");
        let buckets = Estimator::of_log(Some(60)).unwrap();
        assert_eq!(buckets.describe(), "bucketed_window (60 sub-windows)");
        assert_eq!(
            buckets.policy(10, Duration::from_secs(60)),
            Ok(
                sluice_core::BucketedWindow::new(10, Duration::from_secs(60), 60)
                    .unwrap()
                    .into()
            )
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_figures() {
        let a = measure(&small()).unwrap();
        let b = measure(&small()).unwrap();
        assert_eq!(a, b);
        let c = measure(&Setup { seed: 2, ..small() }).unwrap();
        assert_ne!(a, c);
    }

    #[test]
    fn a_trace_has_the_requests_asked_for_with_popular_keys_first() {
        let setup = small();
        let trace = zipf_trace(&setup);
        assert_eq!(trace.len() as u64, setup.requests);
        assert!(trace.windows(2).all(|w| w[0].0 <= w[1].0));
        let first = trace.iter().filter(|a| a.1 == 0).count();
        let hundredth = trace.iter().filter(|a| a.1 == 99).count();
        assert!(first > 20 * hundredth.max(1), "{first} {hundredth}");
    }
}
