//! Running a trace through the real algorithms: each lane is a memory store, the same one the
//! service uses, on a fake clock that the trace moves.

use std::time::Duration;

use sluice_core::algorithm::{ALGORITHMS, PolicyParams};
use sluice_core::{Check, Decision, FakeClock, MemoryStore, Policy, PolicyError, Timestamp};

use crate::trace::Trace;

/// Where simulated time starts: midnight UTC, so clock-aligned windows of any length that
/// divides a day begin with the trace.
pub const START: Timestamp = Timestamp::from_secs(20_000 * 86_400);

/// One algorithm under test, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lane {
    /// A name for the report: the algorithm, or the rule's path.
    pub name: String,
    /// The policy.
    pub policy: Policy,
}

/// How many buckets the compared bucketed window splits its window into.
pub const COMPARE_SUB_WINDOWS: u32 = 10;

/// Every algorithm of the table at the same nominal limit: `limit` requests per `window`, each
/// with the defaults a rule gets. The token bucket and GCRA hold a burst of `limit` and refill at
/// `limit` per window; the queue holds `limit` waiting requests and releases them at that rate;
/// the bucketed window has [`COMPARE_SUB_WINDOWS`] buckets. A concurrency limit is left out: it
/// counts requests in flight, which a trace of arrivals does not tell (`--usage` shows it).
pub fn compare_lanes(limit: u64, window: Duration) -> Result<Vec<Lane>, PolicyError> {
    let params = PolicyParams {
        sub_windows: Some(COMPARE_SUB_WINDOWS),
        ..PolicyParams::new(limit, window)
    };
    ALGORITHMS
        .iter()
        .filter(|spec| !spec.concurrent)
        .map(|spec| {
            Ok(Lane {
                name: spec.name.to_owned(),
                policy: spec.build(&params)?,
            })
        })
        .collect()
}

/// One lane per limit of a rule set, named by the rule's path (and its `name`, when it has one),
/// so an operator sees their own rules on the trace. Concurrency limits are left out, as in
/// [`compare_lanes`]: a trace of arrivals does not say how long each request is in flight.
pub fn rule_lanes(rules: &sluice_rules::RuleSet) -> Vec<Lane> {
    rules
        .rules()
        .filter(|rule| !rule.policy.concurrent())
        .map(|rule| Lane {
            name: match &rule.name {
                Some(name) => format!("{} ({name})", rule.path),
                None => rule.path.to_string(),
            },
            policy: (*rule.policy).clone(),
        })
        .collect()
}

/// How many times a run samples the busiest key's state.
pub const SAMPLES: usize = 400;

/// What one request got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// When it arrived, since the trace began.
    pub at: Duration,
    /// Its key.
    pub key: u32,
    /// Its cost.
    pub cost: u64,
    /// The decision.
    pub decision: Decision,
}

impl Outcome {
    /// The limiter's state after the request, as units of the limit in use: the count in the
    /// window, the log's length, the tokens spent, the requests queued.
    pub fn used(&self) -> u64 {
        self.decision.limit.saturating_sub(self.decision.remaining)
    }
}

/// A lane's run over a trace.
#[derive(Debug, Clone)]
pub struct LaneRun {
    /// The lane.
    pub lane: Lane,
    /// One outcome per request, in trace order.
    pub outcomes: Vec<Outcome>,
    /// The busiest key's state sampled at [`SAMPLES`] even steps up to the trace's
    /// [`end`](Trace::end), each a peek (a cost-0 decision that changes nothing), so plots show
    /// it between requests and after the last one too.
    pub samples: Vec<(Duration, Decision)>,
}

impl LaneRun {
    /// Requests admitted, and units they took.
    pub fn admitted(&self) -> usize {
        self.outcomes.iter().filter(|o| o.decision.allowed).count()
    }

    /// Requests refused.
    pub fn rejected(&self) -> usize {
        self.outcomes.len() - self.admitted()
    }

    /// The most units admitted for one key within any stretch of `span`: for a fixed window
    /// at the boundary attack this is twice its limit; for the log it never exceeds the limit.
    /// Queued requests count when they are released, not when they arrive.
    pub fn peak_within(&self, span: Duration) -> u64 {
        let mut by_key: std::collections::HashMap<u32, Vec<(Duration, u64)>> =
            std::collections::HashMap::new();
        for o in self.outcomes.iter().filter(|o| o.decision.allowed) {
            by_key
                .entry(o.key)
                .or_default()
                .push((o.at + o.decision.delay, o.cost));
        }
        let mut peak = 0;
        for times in by_key.values_mut() {
            times.sort_by_key(|t| t.0);
            // Two pointers: the units in (t - span, t] for each admitted t.
            let (mut first, mut sum) = (0, 0u64);
            for (i, &(t, cost)) in times.iter().enumerate() {
                sum += cost;
                while times[first].0 + span <= t {
                    sum -= times[first].1;
                    first += 1;
                }
                debug_assert!(first <= i);
                peak = peak.max(sum);
            }
        }
        peak
    }

    /// The longest a queued request waited.
    pub fn max_delay(&self) -> Duration {
        self.outcomes
            .iter()
            .filter(|o| o.decision.allowed)
            .map(|o| o.decision.delay)
            .max()
            .unwrap_or_default()
    }
}

/// Runs `trace` through each lane: a fresh memory store per lane, its clock set to each
/// request's arrival before the store decides it.
pub fn simulate(trace: &Trace, lanes: &[Lane]) -> Vec<LaneRun> {
    let busiest = trace.busiest_key();
    // Samples run to the end of the report's time axis, past the last request, so the plots
    // show the limiter recovering from the last burst.
    let step = trace.end() / SAMPLES as u32;
    lanes
        .iter()
        .map(|lane| {
            let clock = FakeClock::at(START);
            let store = MemoryStore::builder()
                .clock(clock.clone())
                // One shard holding every key: nothing is evicted, and the run is the same on
                // every machine (no per-process hash seed decides which shard fills first).
                .shards(1)
                .max_keys(trace.keys.len().max(1))
                .build();
            let busiest_name = trace.keys.get(busiest as usize).map_or("", String::as_str);
            let mut samples = Vec::with_capacity(SAMPLES + 1);
            let mut next_sample = Duration::ZERO;
            let mut sample_until = |at: Duration, samples: &mut Vec<(Duration, Decision)>| {
                while next_sample < at && !step.is_zero() {
                    clock.set(START.saturating_add(next_sample));
                    samples.push((next_sample, store.peek_one(busiest_name, &lane.policy)));
                    next_sample += step;
                }
            };
            let mut outcomes = Vec::with_capacity(trace.arrivals.len());
            for a in &trace.arrivals {
                sample_until(a.at, &mut samples);
                clock.set(START.saturating_add(a.at));
                let key = &trace.keys[a.key as usize];
                let decision = store
                    .check_one(Check::new(key, &lane.policy, a.cost))
                    .unwrap_or_else(|e| panic!("the memory store refused a check: {e}"));
                outcomes.push(Outcome {
                    at: a.at,
                    key: a.key,
                    cost: a.cost,
                    decision,
                });
            }
            sample_until(trace.end() + step, &mut samples);
            LaneRun {
                lane: lane.clone(),
                outcomes,
                samples,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Pattern, Shape, generate};

    const MINUTE: Duration = Duration::from_secs(60);

    fn run(pattern: Pattern) -> Vec<LaneRun> {
        let trace = generate(pattern, &Shape::around(5, MINUTE));
        simulate(&trace, &compare_lanes(5, MINUTE).unwrap())
    }

    fn lane<'a>(runs: &'a [LaneRun], name: &str) -> &'a LaneRun {
        runs.iter().find(|r| r.lane.name == name).unwrap()
    }

    /// A trace of arrivals says nothing of how long a request is in flight, so a concurrency
    /// limit has no lane: in one, every admission would hold its slot for the whole ttl.
    #[test]
    fn a_concurrency_limit_gets_no_lane() {
        let lanes = compare_lanes(5, MINUTE).unwrap();
        assert_eq!(lanes.len(), ALGORITHMS.len() - 1);
        assert!(lanes.iter().all(|l| !l.policy.concurrent()));
        let rules = sluice_rules::RuleSet::parse(
            "rules.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    limits:\n      \
             - {unit: minute, requests_per_unit: 5}\n      - {concurrency: 2}\n",
        )
        .unwrap();
        assert_eq!(rule_lanes(&rules).len(), 1);
    }

    #[test]
    fn the_boundary_attack_gets_twice_the_limit_through_a_fixed_window_and_not_the_log() {
        let runs = run(Pattern::Boundary);
        // At 5 a minute, the fixed window admits 5 just before the boundary and 5 just after:
        // 10 within a minute.
        assert_eq!(lane(&runs, "fixed_window").peak_within(MINUTE), 10);
        assert_eq!(lane(&runs, "sliding_log").peak_within(MINUTE), 5);
        // Buckets of 6 s: the burst before the boundary and the one after share a window.
        assert_eq!(lane(&runs, "bucketed_window").peak_within(MINUTE), 5);
        // The counter weighs the previous window, so it stays at the limit here too.
        assert!(lane(&runs, "sliding_counter").peak_within(MINUTE) <= 6);
    }

    #[test]
    fn the_log_never_exceeds_its_limit_on_any_pattern() {
        for pattern in Pattern::ALL {
            let runs = run(pattern);
            let log = lane(&runs, "sliding_log");
            assert!(log.admitted() > 0, "{pattern:?}");
            assert!(log.peak_within(MINUTE) <= 5, "{pattern:?}");
        }
    }

    #[test]
    fn the_queue_delays_instead_of_refusing_a_burst() {
        let runs = run(Pattern::Burst);
        let queue = lane(&runs, "leaky_queue");
        let bucket = lane(&runs, "token_bucket");
        assert!(queue.max_delay() > Duration::ZERO);
        assert_eq!(bucket.max_delay(), Duration::ZERO);
        // Released at 5 a minute, the queue's admissions never bunch beyond its queue size.
        assert!(
            queue.peak_within(MINUTE) <= 6,
            "{}",
            queue.peak_within(MINUTE)
        );
    }

    #[test]
    fn a_rule_set_gives_a_lane_per_limit() {
        let rules = sluice_rules::RuleSet::parse(
            "r.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_log}\n  - key: b\n    rate_limit: {name: bee, unit: second, requests_per_unit: 2}\n",
        )
        .unwrap();
        let mut lanes = rule_lanes(&rules);
        lanes.sort_by(|x, y| x.name.cmp(&y.name));
        let names: Vec<&str> = lanes.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["d/a", "d/b (bee)"]);
        assert_eq!(lanes[0].policy.limit(), 5);
        assert_eq!(lanes[0].policy.algorithm().name(), "sliding_log");
    }

    #[test]
    fn samples_show_a_bucket_refilling_between_requests() {
        let runs = run(Pattern::Boundary);
        let bucket = lane(&runs, "token_bucket");
        assert!(bucket.samples.len() >= SAMPLES);
        assert!(bucket.samples.windows(2).all(|w| w[0].0 < w[1].0));
        // Emptied by the burst at 2 minutes, full again (nothing in use) a minute later, before
        // the next burst at 4.
        let used_at = |secs: u64| {
            let (_, d) = bucket
                .samples
                .iter()
                .find(|(at, _)| *at >= Duration::from_secs(secs))
                .unwrap();
            d.limit - d.remaining
        };
        assert!(used_at(122) >= 4, "{}", used_at(122));
        assert_eq!(used_at(230), 0);
    }

    /// The plots do not stop at the last burst: the samples go on to the trace's end, where the
    /// bucket the burst emptied is full again.
    #[test]
    fn samples_show_the_recovery_from_the_last_burst() {
        let runs = run(Pattern::Boundary);
        let bucket = lane(&runs, "token_bucket");
        let (last, state) = bucket.samples.last().unwrap();
        assert!(*last >= Duration::from_secs(599), "{last:?}");
        assert_eq!(state.limit - state.remaining, 0);
        let just_after = bucket
            .samples
            .iter()
            .find(|(at, _)| *at >= Duration::from_secs(481))
            .unwrap();
        assert!(just_after.1.remaining < just_after.1.limit);
    }

    #[test]
    fn state_is_what_the_limit_has_in_use() {
        let runs = run(Pattern::Steady);
        let window = lane(&runs, "fixed_window");
        // Steady at 7.5 a minute: the first window's count climbs 1, 2, ... to 5, then stays.
        let used: Vec<u64> = window.outcomes.iter().take(7).map(Outcome::used).collect();
        assert_eq!(used, [1, 2, 3, 4, 5, 5, 5]);
        assert_eq!(window.admitted() + window.rejected(), window.outcomes.len());
    }
}
