//! What the dashboard shows over time: decision totals sampled once a period, and the last rule
//! reloads with their errors. Both are bounded rings, so a long-running instance holds a few
//! minutes of history and a handful of reloads, never more.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_rules::{ReloadEvent, Reloader};

use crate::Limiter;
use crate::metrics::Outcome;

/// Samples kept: five minutes at one a second.
pub const HISTORY_SAMPLES: usize = 300;
/// Reloads kept.
pub const RELOADS_KEPT: usize = 20;

/// One sample: when it was taken, and each decision counter's total then, aligned with
/// [`History::series`] (a series that appeared later is missing from earlier samples).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Totals, by series index.
    pub totals: Vec<u64>,
}

/// Decision totals over the last minutes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// What each series counts, in the order samples list their totals.
    pub series: Vec<SeriesLabels>,
    /// Oldest first.
    pub samples: Vec<Sample>,
}

/// `(domain, rule, outcome)`: what one series counts.
pub type SeriesLabels = (String, String, Outcome);

/// A ring of decision samples.
#[derive(Debug, Default)]
pub struct DecisionHistory {
    series: Mutex<(Vec<SeriesLabels>, VecDeque<Sample>)>,
}

impl DecisionHistory {
    /// Records the limiter's decision totals as of `at_ms`.
    pub fn sample(&self, limiter: &Limiter, at_ms: u64) {
        let totals = limiter.metrics().decision_totals();
        let mut guard = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let (series, samples) = &mut *guard;
        // Totals come in creation order, so new series only ever append.
        for (domain, rule, outcome, _) in totals.iter().skip(series.len()) {
            series.push((domain.clone(), rule.clone(), *outcome));
        }
        if samples.len() == HISTORY_SAMPLES {
            samples.pop_front();
        }
        samples.push_back(Sample {
            at_ms,
            totals: totals.into_iter().map(|t| t.3).collect(),
        });
    }

    /// The samples kept.
    pub fn history(&self) -> History {
        let guard = self.series.lock().unwrap_or_else(|p| p.into_inner());
        History {
            series: guard.0.clone(),
            samples: guard.1.iter().cloned().collect(),
        }
    }
}

/// One reload's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadRecord {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// `reloaded`, `unchanged` or `failed`.
    pub outcome: &'static str,
    /// The new rules' fingerprint, or every error with its `file:line:col`.
    pub detail: String,
}

/// The last reloads, newest last.
#[derive(Debug, Default)]
pub struct ReloadLog {
    records: Mutex<VecDeque<ReloadRecord>>,
}

impl ReloadLog {
    /// Records every later reload of `reloader`, on a thread that ends with the reloader.
    pub fn follow(reloader: &Reloader) -> Arc<ReloadLog> {
        let log = Arc::new(ReloadLog::default());
        let events = reloader.subscribe();
        let weak: Weak<ReloadLog> = Arc::downgrade(&log);
        let spawned = std::thread::Builder::new()
            .name("sluice-reload-history".into())
            .spawn(move || {
                for event in events {
                    let Some(log) = weak.upgrade() else { break };
                    log.record(&event, now_ms());
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot follow reloads for the dashboard");
        }
        log
    }

    /// Records one reload's outcome at `at_ms`.
    pub fn record(&self, event: &ReloadEvent, at_ms: u64) {
        let (outcome, detail) = match event {
            ReloadEvent::Reloaded { fingerprint } => {
                ("reloaded", format!("rules {fingerprint:016x} in force"))
            }
            ReloadEvent::Unchanged => ("unchanged", String::new()),
            ReloadEvent::Failed(e) => ("failed", e.to_string()),
        };
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        if records.len() == RELOADS_KEPT {
            records.pop_front();
        }
        records.push_back(ReloadRecord {
            at_ms,
            outcome,
            detail,
        });
    }

    /// The reloads kept, oldest first.
    pub fn records(&self) -> Vec<ReloadRecord> {
        let records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        records.iter().cloned().collect()
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Samples `limiter`'s decisions every `period` into its history, until `stopped` turns true or
/// the limiter is dropped. Runs on the current tokio runtime.
pub fn sample_every(
    limiter: &Arc<Limiter>,
    period: Duration,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let weak = Arc::downgrade(limiter);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopped.wait_for(|s| *s) => break,
            }
            let Some(limiter) = weak.upgrade() else { break };
            limiter.history().sample(&limiter, now_ms());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_keeps_the_last_samples_with_new_series_appended() {
        let limiter = Limiter::new(
            Reloader::fixed(sluice_rules::RuleSet::empty()),
            Arc::new(sluice_core::MemoryStore::new()),
            Arc::new(crate::Metrics::new()),
        );
        let history = DecisionHistory::default();
        history.sample(&limiter, 1);
        limiter.metrics().decision("d", "a", Outcome::Allowed);
        history.sample(&limiter, 2);
        limiter.metrics().decision("d", "b", Outcome::Limited);
        limiter.metrics().decision("d", "a", Outcome::Allowed);
        history.sample(&limiter, 3);
        let h = history.history();
        assert_eq!(
            h.series,
            [
                ("d".to_owned(), "a".to_owned(), Outcome::Allowed),
                ("d".to_owned(), "b".to_owned(), Outcome::Limited)
            ]
        );
        let totals: Vec<Vec<u64>> = h.samples.iter().map(|s| s.totals.clone()).collect();
        assert_eq!(totals, [vec![], vec![1], vec![2, 1]]);
        for i in 0..HISTORY_SAMPLES as u64 {
            history.sample(&limiter, 10 + i);
        }
        let h = history.history();
        assert_eq!(h.samples.len(), HISTORY_SAMPLES);
        assert_eq!(h.samples[0].at_ms, 10);
    }

    #[test]
    fn the_reload_log_keeps_the_last_reloads_with_their_errors() {
        let log = ReloadLog::default();
        log.record(&ReloadEvent::Reloaded { fingerprint: 0xab }, 5);
        let bad = sluice_rules::RuleSet::parse("r.yaml", "domain: [").unwrap_err();
        log.record(&ReloadEvent::Failed(bad), 6);
        let records = log.records();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].outcome, "reloaded");
        assert!(records[0].detail.contains("00000000000000ab"));
        assert_eq!(records[1].outcome, "failed");
        assert!(
            records[1].detail.contains("r.yaml:"),
            "{}",
            records[1].detail
        );
        for i in 0..RELOADS_KEPT as u64 {
            log.record(&ReloadEvent::Unchanged, 100 + i);
        }
        assert_eq!(log.records().len(), RELOADS_KEPT);
        assert_eq!(log.records()[0].at_ms, 100);
    }
}
