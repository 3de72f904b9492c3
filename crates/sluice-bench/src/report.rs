//! What a run counted: answers by kind, latency percentiles and throughput.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::time::Instant;

use super::{Answer, Load};

/// Latencies are recorded in nanoseconds, to three significant figures, from 1 µs to 2 minutes.
const LOWEST_NS: u64 = 1_000;
const HIGHEST_NS: u64 = 120_000_000_000;
const FIGURES: u8 = 3;

fn histogram() -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts.
    Histogram::new_with_bounds(LOWEST_NS, HIGHEST_NS, FIGURES).expect("valid histogram bounds")
}

/// One worker's counts.
pub(crate) struct Tally {
    answers: Counts,
    latency: Histogram<u64>,
    last_done: Option<Instant>,
}

#[derive(Debug, Default, Clone, Serialize)]
struct Counts {
    allowed: u64,
    limited: u64,
    errors: BTreeMap<String, u64>,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.allowed += other.allowed;
        self.limited += other.limited;
        for (k, v) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
    }

    fn errors(&self) -> u64 {
        self.errors.values().sum()
    }

    fn total(&self) -> u64 {
        self.allowed + self.limited + self.errors()
    }
}

impl Tally {
    pub(crate) fn new() -> Self {
        Tally {
            answers: Counts::default(),
            latency: histogram(),
            last_done: None,
        }
    }

    /// Counts one answer; its latency only when it is `measured` (due after the warm-up).
    pub(crate) fn count(
        &mut self,
        answer: &Answer,
        measured: bool,
        latency: Duration,
        done: Instant,
    ) {
        match answer {
            Answer::Allowed => self.answers.allowed += 1,
            Answer::Limited => self.answers.limited += 1,
            Answer::Error(why) => *self.answers.errors.entry(why.clone()).or_default() += 1,
        }
        if measured {
            let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
            self.latency.saturating_record(ns.max(LOWEST_NS));
            self.last_done = Some(self.last_done.map_or(done, |l| l.max(done)));
        }
    }
}

/// Latency percentiles, in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Slowest.
    pub max_us: f64,
    /// Mean.
    pub mean_us: f64,
}

/// What a run did.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The target as given.
    pub target: String,
    /// Offered rate in requests per second, or `None` for a closed loop.
    pub rate: Option<f64>,
    /// Workers.
    pub concurrency: usize,
    /// Answers, warm-up included.
    pub requests: u64,
    /// Admitted answers (HTTP 2xx, gRPC `OK`), warm-up included.
    pub allowed: u64,
    /// Limited answers (HTTP 429, gRPC `OVER_LIMIT`), warm-up included.
    pub limited: u64,
    /// Failed requests, by cause, warm-up included.
    pub errors: BTreeMap<String, u64>,
    /// Answers after the warm-up.
    pub measured: u64,
    /// Measured answers per second.
    pub throughput: f64,
    /// Latency of measured answers.
    pub latency: Latency,
    /// Workers that ended abnormally (a bug in the generator, not the target).
    pub failed_workers: Vec<String>,
    #[serde(skip)]
    answers: Counts,
    #[serde(skip)]
    histogram: Histogram<u64>,
    #[serde(skip)]
    last_done: Option<Instant>,
}

impl Report {
    pub(crate) fn new(target: String, load: Load) -> Self {
        Report {
            target,
            rate: load.rate,
            concurrency: load.concurrency,
            requests: 0,
            allowed: 0,
            limited: 0,
            errors: BTreeMap::new(),
            measured: 0,
            throughput: 0.0,
            latency: Latency::default(),
            failed_workers: Vec::new(),
            answers: Counts::default(),
            histogram: histogram(),
            last_done: None,
        }
    }

    pub(crate) fn merge(&mut self, tally: Tally) {
        self.answers.add(&tally.answers);
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.histogram.add(&tally.latency);
        self.last_done = match (self.last_done, tally.last_done) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    pub(crate) fn worker_failed(&mut self, why: String) {
        self.failed_workers.push(why);
    }

    /// Fills the public figures in, measuring throughput from `measure_from` to the last answer.
    pub(crate) fn finish(&mut self, measure_from: Instant) {
        self.requests = self.answers.total();
        self.allowed = self.answers.allowed;
        self.limited = self.answers.limited;
        self.errors = self.answers.errors.clone();
        self.measured = self.histogram.len();
        let us = |ns: u64| ns as f64 / 1_000.0;
        let h = &self.histogram;
        if self.measured > 0 {
            self.latency = Latency {
                p50_us: us(h.value_at_quantile(0.5)),
                p90_us: us(h.value_at_quantile(0.9)),
                p99_us: us(h.value_at_quantile(0.99)),
                p999_us: us(h.value_at_quantile(0.999)),
                max_us: us(h.max()),
                mean_us: h.mean() / 1_000.0,
            };
        }
        let span = self.last_done.map_or(Duration::ZERO, |last| {
            last.saturating_duration_since(measure_from)
        });
        if !span.is_zero() {
            self.throughput = self.measured as f64 / span.as_secs_f64();
        }
    }

    /// Failed requests in all.
    pub fn error_count(&self) -> u64 {
        self.answers.errors()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "target      {}", self.target)?;
        match self.rate {
            Some(rate) => writeln!(
                f,
                "load        open loop, {rate:.0} requests/s offered by {} workers",
                self.concurrency
            )?,
            None => writeln!(f, "load        closed loop, {} workers", self.concurrency)?,
        }
        write!(
            f,
            "answers     {} in all: {} allowed, {} limited, {} errors",
            self.requests,
            self.allowed,
            self.limited,
            self.error_count()
        )?;
        for (why, n) in &self.errors {
            write!(f, "\n              {n} × {why}")?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "throughput  {:.0} answers/s over {} measured",
            self.throughput, self.measured
        )?;
        let l = &self.latency;
        writeln!(
            f,
            "latency µs  p50 {:.0}  p90 {:.0}  p99 {:.0}  p99.9 {:.0}  max {:.0}  mean {:.0}",
            l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us, l.mean_us
        )?;
        for why in &self.failed_workers {
            writeln!(f, "worker failed: {why}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_tallies_add_up_and_only_measured_answers_have_latency() {
        let now = Instant::now();
        let mut a = Tally::new();
        a.count(&Answer::Allowed, false, Duration::from_secs(9), now);
        a.count(
            &Answer::Allowed,
            true,
            Duration::from_micros(100),
            now + Duration::from_secs(1),
        );
        let mut b = Tally::new();
        b.count(
            &Answer::Limited,
            true,
            Duration::from_micros(300),
            now + Duration::from_secs(2),
        );
        b.count(
            &Answer::Error("HTTP 503".into()),
            true,
            Duration::from_micros(200),
            now,
        );
        b.count(
            &Answer::Error("HTTP 503".into()),
            true,
            Duration::from_micros(200),
            now,
        );
        let mut r = Report::new("t".into(), Load::default());
        r.merge(a);
        r.merge(b);
        r.finish(now);
        assert_eq!(
            (r.requests, r.allowed, r.limited, r.error_count()),
            (5, 2, 1, 2)
        );
        assert_eq!(r.errors.get("HTTP 503"), Some(&2));
        assert_eq!(r.measured, 4, "the warm-up answer has no latency");
        assert!((r.latency.max_us - 300.0).abs() < 1.0, "{:?}", r.latency);
        assert!((r.latency.p50_us - 200.0).abs() < 1.0, "{:?}", r.latency);
        // 4 measured answers, the last 2 s after measuring began.
        assert!((r.throughput - 2.0).abs() < 1e-9, "{}", r.throughput);
        let text = r.to_string();
        assert!(text.contains("2 × HTTP 503"), "{text}");
    }
}
