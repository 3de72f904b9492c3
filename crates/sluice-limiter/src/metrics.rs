//! Prometheus metrics: decisions by domain, rule and outcome, decision latency, store errors,
//! tracked keys, rule reloads, the most limited keys, the build, and the store's own series
//! (a Redis store's breaker state and refunds, a hybrid store's sync lag, ...), which the store
//! registers through its [`StoreTelemetry`]. Everything goes through one registry.

use std::collections::HashMap;
use std::hash::Hasher as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};

use siphasher::sip::SipHasher13;

use crate::store_telemetry::StoreTelemetry;

/// What one limit's decision counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Admitted.
    Allowed,
    /// Refused.
    Limited,
    /// Would have been refused; passed because the rule is in shadow mode or soft.
    ShadowLimited,
    /// The store failed; the rule's `on_store_error` decided.
    StoreError,
    /// Units given back (Envoy's `is_negative_hits`): answered `OK`, counted apart from the
    /// decisions, so that refunds neither inflate the admitted nor hide the refused.
    Refunded,
}

impl Outcome {
    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::ShadowLimited => "shadow_limited",
            Outcome::StoreError => "store_error",
            Outcome::Refunded => "refunded",
        }
    }
}

impl EncodeLabelValue for Outcome {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DecisionLabels {
    domain: LabelText,
    rule: LabelText,
    outcome: Outcome,
}

/// A label value that may hold request values: at most [`MAX_LABEL_VALUE_BYTES`] long (see
/// [`LabelText::bounded`]), and escaped when written, since the text format ends a value at
/// its first `"` and a line at its first newline, and `prometheus_client` writes values as
/// they are.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct LabelText(String);

impl LabelText {
    /// `value` itself when it is at most [`MAX_LABEL_VALUE_BYTES`] long; else its first bytes
    /// (cut on a character boundary), `~` and 16 hex digits of a hash of the whole value, in
    /// [`MAX_LABEL_VALUE_BYTES`] in all. Values that share a long prefix stay apart, and a
    /// value gets the same label in every process and after a restart, since the hash's keys
    /// are fixed; two values whose hashes collide only share a counter.
    fn bounded(value: &str) -> Self {
        if value.len() <= MAX_LABEL_VALUE_BYTES {
            return LabelText(value.to_owned());
        }
        let mut h = SipHasher13::new_with_keys(0x736c_7569_6365_6c62, 0x6d65_7472_6963_0001);
        h.write(value.as_bytes());
        let mut cut = MAX_LABEL_VALUE_BYTES - HASH_SUFFIX_BYTES;
        while !value.is_char_boundary(cut) {
            cut -= 1;
        }
        LabelText(format!("{}~{:016x}", &value[..cut], h.finish()))
    }
}

impl EncodeLabelValue for LabelText {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use std::fmt::Write as _;
        let mut rest = self.0.as_str();
        while let Some(at) = rest.find(['\\', '"', '\n']) {
            encoder.write_str(&rest[..at])?;
            encoder.write_str(match rest.as_bytes()[at] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[at + 1..];
        }
        encoder.write_str(rest)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

/// A limited counter in `/metrics`: its key hashed, since a key holds request values (user
/// ids, API keys, addresses) and `/metrics` answers anyone who can reach it. The dashboard, an
/// admin endpoint, shows the keys themselves.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KeyLabels {
    key_hash: String,
}

/// What a [`Metrics::render`] reads from the rest of the service, so that gauges and mirrored
/// counters are current when they are exposed.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Counters the store tracks, if it can tell.
    pub tracked_keys: Option<usize>,
    /// Reloads that put a new rule set in force.
    pub reloads: u64,
    /// Reloads refused.
    pub reload_failures: u64,
}

/// How many limited keys are remembered for the top-limited report; beyond it the least
/// limited are dropped, so a flood of keys cannot grow it.
const TOP_KEYS_CAPACITY: usize = 1024;
/// How many of them are exported.
const TOP_KEYS_EXPORTED: usize = 10;

/// The most distinct decision series (domain, rule label, outcome). `detailed_metric` and
/// `value_to_metric` put request values in the rule label, so without a bound a client sending
/// new values could grow `/metrics`, and this process, without end. Past it, a new series is
/// counted under [`OVERFLOW_RULE`] instead, once per domain and outcome.
pub const MAX_DECISION_SERIES: usize = 10_000;
/// The rule label of decisions whose own series would pass [`MAX_DECISION_SERIES`].
pub const OVERFLOW_RULE: &str = "_overflow";

/// The longest decision label value (domain or rule), in bytes; a longer one is cut and
/// suffixed with a hash of the whole (see [`LabelText::bounded`]). Rule paths with a user id,
/// an address or an API path fit in it; a client's kilobyte value does not make a kilobyte
/// line. With [`MAX_DECISION_SERIES`] it bounds `/metrics` in bytes: a decision line is at most
/// 88 bytes besides its two values, each at most twice this long once escaped, so the decision
/// series take at most 10,000 × (88 + 4 × 128) bytes, 6 MB (plus four `_overflow` lines a
/// domain), and 3.4 MB when the values hold nothing to escape.
pub const MAX_LABEL_VALUE_BYTES: usize = 128;
/// `~` and 16 hex digits.
const HASH_SUFFIX_BYTES: usize = 17;

/// Every metric of the service.
pub struct Metrics {
    registry: Mutex<Registry>,
    decisions: Family<DecisionLabels, Counter>,
    latency: Histogram,
    store_errors: Counter,
    tracked_keys: Gauge,
    reloads: Counter<u64, AtomicU64>,
    reload_failures: Counter<u64, AtomicU64>,
    top_limited: Family<KeyLabels, Gauge>,
    limited_counts: Mutex<HashMap<String, u64>>,
    /// Every decision counter created, in creation order, for the dashboard's history.
    series: Mutex<Series>,
    /// Hashes limited keys for `/metrics` with keys of this process's own, so a hash cannot be
    /// matched against guessed keys elsewhere.
    key_hasher: std::collections::hash_map::RandomState,
}

/// The decision counters in the order they were created, so that a history sample can be a list
/// of totals aligned with them.
#[derive(Default)]
struct Series {
    index: HashMap<DecisionLabels, usize>,
    counters: Vec<(DecisionLabels, Counter)>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// `metric`, registered in `registry` under `name` with `help`.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sluice");
        let decisions = registered(
            &mut registry,
            "decisions",
            "Limit decisions by domain, rule and outcome",
            Family::<DecisionLabels, Counter>::default(),
        );
        // 1µs to ~1s, doubling.
        let latency = registered(
            &mut registry,
            "decision_latency_seconds",
            "Time to decide one request, store included",
            Histogram::new((0..20).map(|i| 1e-6 * f64::from(1u32 << i))),
        );
        let store_errors = registered(
            &mut registry,
            "store_errors",
            "Store calls that failed and fell back to on_store_error",
            Counter::default(),
        );
        let tracked_keys = registered(
            &mut registry,
            "tracked_keys",
            "Counters the store tracks",
            Gauge::default(),
        );
        let reloads = registered(
            &mut registry,
            "rule_reloads",
            "Rule reloads that put a new rule set in force",
            Counter::<u64, AtomicU64>::default(),
        );
        let reload_failures = registered(
            &mut registry,
            "rule_reload_failures",
            "Rule reloads refused for invalid files; the old rules stayed",
            Counter::<u64, AtomicU64>::default(),
        );
        let top_limited = registered(
            &mut registry,
            "top_limited_keys",
            "Refusals of the most limited counters since start, by a hash of the counter key \
             (GET /v1/dashboard, an admin endpoint, names the keys)",
            Family::<KeyLabels, Gauge>::default(),
        );
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
            })
            .set(1);
        registry.register("build_info", "The running build", build);
        Metrics {
            registry: Mutex::new(registry),
            decisions,
            latency,
            store_errors,
            tracked_keys,
            reloads,
            reload_failures,
            top_limited,
            limited_counts: Mutex::new(HashMap::new()),
            series: Mutex::new(Series::default()),
            key_hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    /// Counts one limit's decision.
    ///
    /// This looks the counter up by its labels, which copies and hashes them; a caller that
    /// counts the same limit often keeps [`Metrics::decision_counter`] instead.
    pub fn decision(&self, domain: &str, rule: &str, outcome: Outcome) {
        self.decision_counter(domain, rule, outcome).inc();
    }

    /// The counter of one limit's decisions with this outcome, to keep and increment: it stays
    /// the one [`Metrics::render`] reports.
    pub fn decision_counter(&self, domain: &str, rule: &str, outcome: Outcome) -> Counter {
        let mut labels = DecisionLabels {
            domain: LabelText::bounded(domain),
            rule: LabelText::bounded(rule),
            outcome,
        };
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        if series.index.len() >= MAX_DECISION_SERIES && !series.index.contains_key(&labels) {
            labels.rule = LabelText(OVERFLOW_RULE.to_owned());
        }
        let counter = self.decisions.get_or_create(&labels).clone();
        if !series.index.contains_key(&labels) {
            let at = series.counters.len();
            series.index.insert(labels.clone(), at);
            series.counters.push((labels, counter.clone()));
        }
        counter
    }

    /// Every decision counter so far, as `(domain, rule, outcome, total)`, in the order they
    /// were first counted: a later call lists the same ones first, in the same order.
    pub fn decision_totals(&self) -> Vec<(String, String, Outcome, u64)> {
        let series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        series
            .counters
            .iter()
            .map(|(l, c)| (l.domain.0.clone(), l.rule.0.clone(), l.outcome, c.get()))
            .collect()
    }

    /// The `n` counters refused most often since start, most first.
    pub fn top_limited(&self, n: usize) -> Vec<(String, u64)> {
        let counts = self
            .limited_counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut top: Vec<(String, u64)> = counts.iter().map(|(k, v)| (k.clone(), *v)).collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        top.truncate(n);
        top
    }

    /// Store calls that failed since start.
    pub fn store_errors(&self) -> u64 {
        self.store_errors.get()
    }

    /// How many decisions of this kind were counted (`domain` and `rule` as given to
    /// [`Metrics::decision`], before any cut).
    pub fn decisions_of(&self, domain: &str, rule: &str, outcome: Outcome) -> u64 {
        self.decisions
            .get_or_create(&DecisionLabels {
                domain: LabelText::bounded(domain),
                rule: LabelText::bounded(rule),
                outcome,
            })
            .get()
    }

    /// Records one request's decision time.
    pub fn observe_latency(&self, d: Duration) {
        self.latency.observe(d.as_secs_f64());
    }

    /// Counts a failed store call.
    ///
    /// Returns how many store errors were counted before this one, so that callers can log the
    /// first few of an outage and then fewer, instead of a line per request.
    pub fn store_error(&self) -> u64 {
        self.store_errors.inc()
    }

    /// Counts a refusal of `key`, for the top-limited report.
    pub fn limited_key(&self, key: &str) {
        let mut counts = self
            .limited_counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(key) {
            *n += 1;
            return;
        }
        if counts.len() >= TOP_KEYS_CAPACITY {
            // Make room by forgetting the least limited half; the heavy hitters stay.
            let mut values: Vec<u64> = counts.values().copied().collect();
            let mid = values.len() / 2;
            let (_, median, _) = values.select_nth_unstable(mid);
            let median = *median;
            counts.retain(|_, n| *n > median);
        }
        counts.insert(key.to_owned(), 1);
    }

    /// Registers the store's own series (see [`StoreTelemetry::register`]) after the engine's,
    /// so that `/metrics` lists them last.
    pub fn register_store(&self, telemetry: &dyn StoreTelemetry) {
        let mut registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        telemetry.register(&mut registry);
    }

    /// Registers series kept elsewhere in the engine (the runtime overrides') in the registry.
    pub(crate) fn register_with(&self, register: impl FnOnce(&mut Registry)) {
        let mut registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        register(&mut registry);
    }

    /// The Prometheus text exposition, with gauges and mirrored counters refreshed from
    /// `snapshot`.
    pub fn render(&self, snapshot: &Snapshot) -> String {
        if let Some(n) = snapshot.tracked_keys {
            self.tracked_keys.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.reloads
            .inner()
            .store(snapshot.reloads, Ordering::Relaxed);
        self.reload_failures
            .inner()
            .store(snapshot.reload_failures, Ordering::Relaxed);
        self.top_limited.clear();
        for (key, n) in self.top_limited(TOP_KEYS_EXPORTED) {
            use std::hash::BuildHasher as _;
            let key_hash = format!("{:016x}", self.key_hasher.hash_one(&key));
            self.top_limited
                .get_or_create(&KeyLabels { key_hash })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_values_cannot_grow_the_decision_series_without_bound() {
        let metrics = Metrics::new();
        for i in 0..MAX_DECISION_SERIES + 500 {
            metrics.decision("shop", &format!("shop/user={i}"), Outcome::Allowed);
        }
        // The first MAX_DECISION_SERIES keep their own series; the rest share one.
        let totals = metrics.decision_totals();
        assert_eq!(totals.len(), MAX_DECISION_SERIES + 1);
        assert_eq!(
            metrics.decisions_of("shop", OVERFLOW_RULE, Outcome::Allowed),
            500
        );
        // A series counted before the bound goes on counting under its own label.
        metrics.decision("shop", "shop/user=7", Outcome::Allowed);
        assert_eq!(
            metrics.decisions_of("shop", "shop/user=7", Outcome::Allowed),
            2
        );
        let text = metrics.render(&Snapshot::default());
        assert!(text.contains("rule=\"_overflow\""), "no overflow series");
        assert!(!text.contains(&format!("rule=\"shop/user={}\"", MAX_DECISION_SERIES + 1)));
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("sluice_decisions_total{"))
                .count(),
            MAX_DECISION_SERIES + 1
        );
    }

    #[test]
    fn long_request_values_make_bounded_lines_that_stay_distinct() {
        let metrics = Metrics::new();
        let mut labels = Vec::new();
        for i in 0..12_000 {
            // 1 KiB values that differ only past the cut.
            let label = format!("shop/user={}{i:05}", "x".repeat(1024 - 15));
            metrics.decision("shop", &label, Outcome::Allowed);
            labels.push(label);
        }
        let a = &labels[0];
        let b = &labels[1];
        metrics.decision("shop", a, Outcome::Allowed);
        assert_eq!(metrics.decisions_of("shop", a, Outcome::Allowed), 2);
        assert_eq!(metrics.decisions_of("shop", b, Outcome::Allowed), 1);
        let text = metrics.render(&Snapshot::default());
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("sluice_decisions_total{"))
            .collect();
        assert_eq!(lines.len(), MAX_DECISION_SERIES + 1);
        assert!(
            lines
                .iter()
                .all(|l| l.len() < 88 + 2 * MAX_LABEL_VALUE_BYTES),
            "a line longer than its bound"
        );
        let distinct: std::collections::HashSet<&str> = lines
            .iter()
            .map(|l| l.rsplit_once(' ').map_or(*l, |(labels, _)| labels))
            .collect();
        assert_eq!(distinct.len(), lines.len(), "two values share a series");
        let bound = (MAX_DECISION_SERIES + 4) * (88 + 4 * MAX_LABEL_VALUE_BYTES);
        assert!(text.len() < bound, "{} bytes", text.len());
        assert!(text.len() < 2_000_000, "{} bytes", text.len());
    }

    #[test]
    fn short_values_keep_their_label_and_long_ones_keep_their_prefix() {
        let short = "a".repeat(MAX_LABEL_VALUE_BYTES);
        assert_eq!(LabelText::bounded(&short).0, short);
        // Multi-byte characters across the cut are not split.
        let long = format!("shop/city={}", "é".repeat(200));
        let cut = LabelText::bounded(&long).0;
        assert!(cut.len() <= MAX_LABEL_VALUE_BYTES);
        let (prefix, hash) = cut.rsplit_once('~').unwrap();
        assert!(long.starts_with(prefix));
        assert_eq!(hash.len(), 16);
        assert_eq!(LabelText::bounded(&long), LabelText::bounded(&long.clone()));
    }

    #[test]
    fn request_values_cannot_break_the_exposition_format() {
        let metrics = Metrics::new();
        metrics.decision(
            "shop",
            "shop/user=a\"} 1\nsluice_forged_total 9\n\\",
            Outcome::Allowed,
        );
        let text = metrics.render(&Snapshot::default());
        assert!(
            !text.lines().any(|l| l.starts_with("sluice_forged_total")),
            "{text}"
        );
        assert!(
            text.contains(r#"rule="shop/user=a\"} 1\nsluice_forged_total 9\n\\""#),
            "{text}"
        );
    }
}
