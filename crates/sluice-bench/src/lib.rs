//! `sluice bench`: a load generator for HTTP and gRPC, with latency percentiles, and the trivial
//! upstream other runs are compared with.
//!
//! It drives any HTTP endpoint (the service's `/json` or `/v1/check`, a gateway, or the API
//! behind it) or the Envoy rate-limit gRPC service, in one of two ways:
//!
//! - **closed loop** (no rate given): `concurrency` workers each send their next request as soon
//!   as the previous one is answered. This finds the maximum throughput.
//! - **open loop** (`rate`): requests are due at evenly spaced instants, `rate` per second in
//!   all, dealt round robin to the workers. A worker still busy when its next request is due
//!   sends it late, and that request's latency counts from when it was due, so a stalled server
//!   cannot hide its stall by slowing the generator down (coordinated omission). When the worker
//!   was idle, latency counts from the actual send: the timer's own lateness is the generator's,
//!   not the server's.
//!
//! A third way, **usage** (`run_usage`), makes each request one call that spends units known
//! only afterwards, reserve-then-settle or Envoy's check-then-report, and reports what the
//! admitted calls spent against a budget.
//!
//! `{n}` in a URL, header, body or descriptor value is replaced by the request's key number,
//! `sequence % keys`, so one run can hit one hot key or spread over many.
//!
//! Every answer is counted as allowed (HTTP 2xx, gRPC `OK`), limited (HTTP 429, gRPC
//! `OVER_LIMIT`) or an error, named by its status or cause.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod grpc;
mod http;
mod listening;
mod relay;
mod report;
mod upstream;
mod usage;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

pub use grpc::GrpcTarget;
pub use http::{HttpTarget, Version};
pub use listening::Listening;
pub use relay::serve_relay;
pub use report::{Latency, Report};
pub use upstream::serve_trivial_upstream;
pub use usage::{Flow, Usage, UsageReport, UsageTarget, run_usage};

/// How much load to offer, and for how long.
#[derive(Debug, Clone)]
pub struct Load {
    /// Requests per second in all, or `None` for a closed loop.
    pub rate: Option<f64>,
    /// Workers, each with at most one request in flight.
    pub concurrency: usize,
    /// How long to send for, after the warm-up. `None` with `requests` set: until they are sent.
    pub duration: Option<Duration>,
    /// Stop after this many requests in all (warm-up included).
    pub requests: Option<u64>,
    /// Requests due in this first stretch are sent but not measured.
    pub warmup: Duration,
    /// How many distinct keys `{n}` cycles through.
    pub keys: u64,
    /// How long one request may take before it counts as an error.
    pub timeout: Duration,
}

impl Default for Load {
    fn default() -> Self {
        Load {
            rate: None,
            concurrency: 32,
            duration: Some(Duration::from_secs(10)),
            requests: None,
            warmup: Duration::ZERO,
            keys: 1,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The options do not describe a run.
    #[error("{0}")]
    Invalid(String),
    /// The first connection to the target failed.
    #[error("cannot connect to {target}: {reason}")]
    Connect {
        /// The target as given.
        target: String,
        /// What went wrong.
        reason: String,
    },
}

/// How one request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Admitted: HTTP 2xx or gRPC `OK`.
    Allowed,
    /// Limited: HTTP 429 or gRPC `OVER_LIMIT`.
    Limited,
    /// Anything else, named: `"HTTP 503"`, `"timeout"`, `"connection: …"`.
    Error(String),
}

/// One worker's connection to the target. `send` makes request number `key` and waits for its
/// whole answer.
pub(crate) trait Sender: Send + 'static {
    fn send(&mut self, key: u64) -> impl Future<Output = Answer> + Send;
}

/// A target that can open senders for workers.
pub(crate) trait Target: Send + Sync {
    type Sender: Sender;

    /// A sender for worker `index`; `Err` names why the target cannot be reached.
    fn open(&self, index: usize) -> impl Future<Output = Result<Self::Sender, String>> + Send;

    /// The target as given, for errors and the report.
    fn describe(&self) -> String;
}

/// What the workers share: the clock origin and the closed loop's sequence counter.
struct Plan {
    load: Load,
    start: Instant,
    /// When measuring starts: `start + warmup`.
    measure_from: Instant,
    /// When no more requests are sent.
    end: Option<Instant>,
    next: AtomicU64,
}

impl Plan {
    /// The sequence number and due time of worker `w`'s `k`-th request, or `None` when the
    /// run is over.
    fn due(&self, w: usize, k: u64) -> Option<(u64, Instant)> {
        let seq = match self.load.rate {
            Some(_) => k * self.load.concurrency as u64 + w as u64,
            None => self.next.fetch_add(1, Ordering::Relaxed),
        };
        if self.load.requests.is_some_and(|n| seq >= n) {
            return None;
        }
        let due = match self.load.rate {
            Some(rate) => self.start + Duration::from_secs_f64(seq as f64 / rate),
            None => Instant::now(),
        };
        if self.end.is_some_and(|end| due >= end) {
            return None;
        }
        Some((seq, due))
    }
}

/// Runs `load` against an HTTP target and reports what happened.
pub async fn run_http(target: HttpTarget, load: Load) -> Result<Report, BenchError> {
    run(&Arc::new(target), load).await
}

/// Runs `load` against a gRPC target and reports what happened.
pub async fn run_grpc(target: GrpcTarget, load: Load) -> Result<Report, BenchError> {
    run(&Arc::new(target), load).await
}

/// Runs a load against `target` and reports what happened.
async fn run<T: Target>(target: &T, load: Load) -> Result<Report, BenchError> {
    validate(&load)?;
    let connect = |reason| BenchError::Connect {
        target: target.describe(),
        reason,
    };
    let mut senders = Vec::with_capacity(load.concurrency);
    for w in 0..load.concurrency {
        senders.push(target.open(w).await.map_err(connect)?);
    }
    let start = Instant::now();
    let measure_from = start + load.warmup;
    let plan = Arc::new(Plan {
        end: load.duration.map(|d| measure_from + d),
        load,
        start,
        measure_from,
        next: AtomicU64::new(0),
    });
    let workers: Vec<_> = senders
        .into_iter()
        .enumerate()
        .map(|(w, sender)| tokio::spawn(worker(sender, plan.clone(), w)))
        .collect();
    let mut report = Report::new(target.describe(), plan.load.clone());
    for handle in workers {
        match handle.await {
            Ok(tally) => report.merge(tally),
            Err(e) => report.worker_failed(e.to_string()),
        }
    }
    report.finish(plan.measure_from);
    Ok(report)
}

fn validate(load: &Load) -> Result<(), BenchError> {
    let invalid = |m: &str| Err(BenchError::Invalid(m.into()));
    if load.concurrency == 0 {
        return invalid("concurrency must be at least 1");
    }
    if load.keys == 0 {
        return invalid("keys must be at least 1");
    }
    if load.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return invalid("rate must be a positive number of requests per second");
    }
    if load.duration.is_none() && load.requests.is_none() {
        return invalid("give a duration, a number of requests, or both");
    }
    if load.timeout.is_zero() {
        return invalid("timeout must be above zero");
    }
    Ok(())
}

async fn worker<S: Sender>(mut sender: S, plan: Arc<Plan>, w: usize) -> report::Tally {
    let mut tally = report::Tally::new();
    let mut idle_since = plan.start;
    let mut k = 0;
    while let Some((seq, due)) = plan.due(w, k) {
        k += 1;
        if plan.load.rate.is_some() {
            tokio::time::sleep_until(due).await;
        }
        let sent = Instant::now();
        // Busy past the due time: the wait was the server's doing, so it counts.
        let from = if idle_since > due { due } else { sent };
        let answer = match tokio::time::timeout(
            plan.load.timeout,
            sender.send(seq % plan.load.keys),
        )
        .await
        {
            Ok(answer) => answer,
            Err(_) => Answer::Error("timeout".into()),
        };
        let done = Instant::now();
        idle_since = done;
        tally.count(&answer, due >= plan.measure_from, done - from, done);
    }
    tally
}

/// The placeholder as `--help` of sluice 0.1 showed it: `{n}` with an invisible word joiner
/// (U+2060) after the brace, which a copy from that help carries along.
const SHOWN_PLACEHOLDER: &str = "{\u{2060}n}";

/// A text with `{n}` placeholders, rendered per key number.
#[derive(Debug, Clone)]
pub struct Template {
    /// The literal pieces between placeholders: one more than there are placeholders.
    pieces: Vec<String>,
}

impl Template {
    /// Parses `text`; every `{n}` is a placeholder. So is `{n}` with a word joiner after the
    /// brace, as an older `--help` showed it, so that a placeholder copied from there works too.
    pub fn new(text: &str) -> Self {
        Template {
            pieces: text
                .replace(SHOWN_PLACEHOLDER, "{n}")
                .split("{n}")
                .map(str::to_owned)
                .collect(),
        }
    }

    /// Whether the text has any placeholder.
    pub fn varies(&self) -> bool {
        self.pieces.len() > 1
    }

    /// The text with every placeholder replaced by `n`.
    pub fn render(&self, n: u64) -> String {
        let mut out = String::with_capacity(self.pieces.iter().map(String::len).sum::<usize>() + 8);
        let mut number = itoa::Buffer::new();
        self.render_into(number.format(n), &mut out);
        out
    }

    /// Appends the text with `number` (a key, already in decimal) for each `{n}` to `out`.
    pub fn render_into(&self, number: &str, out: &mut String) {
        for (i, piece) in self.pieces.iter().enumerate() {
            if i > 0 {
                out.push_str(number);
            }
            out.push_str(piece);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_replace_every_placeholder() {
        let t = Template::new("/api/{n}/items?user=u{n}");
        assert!(t.varies());
        assert_eq!(t.render(0), "/api/0/items?user=u0");
        assert_eq!(
            t.render(18_446_744_073_709_551_615),
            "/api/18446744073709551615/items?user=u18446744073709551615"
        );
        let fixed = Template::new("/healthz");
        assert!(!fixed.varies());
        assert_eq!(fixed.render(7), "/healthz");
        // The placeholder as an older --help showed it, copied from there.
        let copied = Template::new("user=u{\u{2060}n}");
        assert_eq!(copied.render(5), "user=u5");
    }

    #[test]
    fn open_loop_deals_due_times_round_robin_and_stops_at_the_end() {
        let load = Load {
            rate: Some(1000.0),
            concurrency: 4,
            duration: Some(Duration::from_millis(10)),
            ..Load::default()
        };
        let start = Instant::now();
        let plan = Plan {
            end: Some(start + Duration::from_millis(10)),
            load,
            start,
            measure_from: start,
            next: AtomicU64::new(0),
        };
        // Worker 1's requests are numbers 1, 5, 9, due 1 ms apart in all, 4 ms apart for it.
        assert_eq!(plan.due(1, 0), Some((1, start + Duration::from_millis(1))));
        assert_eq!(plan.due(1, 1), Some((5, start + Duration::from_millis(5))));
        assert_eq!(plan.due(1, 2), Some((9, start + Duration::from_millis(9))));
        assert_eq!(plan.due(1, 3), None, "request 13 is due after the end");
    }

    #[test]
    fn closed_loop_stops_after_the_requests_asked_for() {
        let load = Load {
            duration: None,
            requests: Some(3),
            ..Load::default()
        };
        let start = Instant::now();
        let plan = Plan {
            end: None,
            load,
            start,
            measure_from: start,
            next: AtomicU64::new(0),
        };
        let seqs: Vec<_> = (0..5)
            .filter_map(|k| plan.due(k % 2, 0))
            .map(|(s, _)| s)
            .collect();
        assert_eq!(seqs, [0, 1, 2]);
    }

    #[test]
    fn nonsense_loads_are_refused_with_a_reason() {
        let bad = [
            Load {
                concurrency: 0,
                ..Load::default()
            },
            Load {
                keys: 0,
                ..Load::default()
            },
            Load {
                rate: Some(0.0),
                ..Load::default()
            },
            Load {
                rate: Some(f64::NAN),
                ..Load::default()
            },
            Load {
                duration: None,
                requests: None,
                ..Load::default()
            },
            Load {
                timeout: Duration::ZERO,
                ..Load::default()
            },
        ];
        for load in bad {
            let e = validate(&load).expect_err("refused");
            assert!(!e.to_string().is_empty());
        }
        validate(&Load::default()).unwrap();
    }
}
