//! envoyproxy/ratelimit's statistics, under its names, so that the dashboards and alerts built
//! on them keep working when Sluice takes its place: sent to statsd every flush interval
//! (`USE_STATSD`), and shown on the Prometheus listener under the names Envoy's default
//! statsd-exporter mapping gives them (`USE_PROMETHEUS`).
//!
//! For each limit a decision meets, under `ratelimit.service.rate_limit.DOMAIN.KEY_VALUE.`:
//! `total_hits`, `over_limit`, `near_limit`, `within_limit` and `shadow_mode`, counted in hits
//! as Envoy counts them (a request's `hits_addend` of 3 adds 3, and a request that crosses the
//! limit splits its hits between `near_limit` and `over_limit`); `KEY_VALUE` is the matched
//! rule's path in Envoy's shape ([`sluice_rules::Rule::write_stat_key`]). For the calls:
//! `ratelimit_server.ShouldRateLimit.total_requests` and `.response_time` (whole
//! milliseconds), `ratelimit.service.call.should_rate_limit.redis_error` and `.service_error`,
//! `ratelimit.service.global_shadow_mode`, and `ratelimit.service.config_load_success` and
//! `_error`.
//!
//! Counting is a few atomic adds on counters kept in memory, found by the statistics key
//! (built in a buffer each thread reuses, so a decision allocates nothing once its key is
//! known); `statsd.rs` sends what changed as UDP datagrams from a task of its own, so a
//! collector that is down, slow or unknown never delays or fails a decision, and
//! `exposition.rs` writes the Prometheus text. The names are in `stat_name.rs`, the response
//! times in `response_times.rs`.

mod exposition;
mod response_times;
mod stat_name;
mod statsd;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use sluice_core::Decision;
use sluice_limiter::{LimitRequest, MAX_DECISION_SERIES, OVERFLOW_RULE, Outcome, Verdict};
use sluice_rules::Reloader;

use response_times::ResponseTimes;
pub(crate) use statsd::send_every;

/// Which of Envoy's statistics the service keeps, and where it reports them.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyStatsOptions {
    /// Where statsd datagrams go (`STATSD_HOST`, `STATSD_PORT`), when `USE_STATSD` asks.
    pub statsd: Option<StatsdTarget>,
    /// How often statsd is sent what changed (`STATS_FLUSH_INTERVAL`).
    pub flush_interval: Duration,
    /// The share of a limit past which hits count as `near_limit` (`NEAR_LIMIT_RATIO`).
    pub near_limit_ratio: f32,
    /// Tags added to every statsd name (`EXTRA_TAGS`), as `(key, value)`.
    pub extra_tags: Vec<(String, String)>,
    /// Show the statistics on the metrics listener, under the names of Envoy's default
    /// statsd-exporter mapping (`USE_PROMETHEUS`).
    pub prometheus: bool,
}

impl Default for EnvoyStatsOptions {
    /// Envoy's defaults: statsd on `localhost:8125`, flushed every 10 seconds, near the limit
    /// past 80% of it.
    fn default() -> Self {
        EnvoyStatsOptions {
            statsd: Some(StatsdTarget {
                host: "localhost".to_owned(),
                port: 8125,
            }),
            flush_interval: Duration::from_secs(10),
            near_limit_ratio: 0.8,
            extra_tags: Vec::new(),
            prometheus: false,
        }
    }
}

/// A statsd collector's address, resolved at every flush, so that a collector that moves (a
/// sidecar restarted, a name that now points elsewhere) is followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsdTarget {
    /// Its host name or address.
    pub host: String,
    /// Its UDP port.
    pub port: u16,
}

/// The five statistics of a limit, in the order they are written.
const LIMIT_STATS: [&str; 5] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];
const TOTAL_HITS: usize = 0;
const OVER_LIMIT: usize = 1;
const NEAR_LIMIT: usize = 2;
const WITHIN_LIMIT: usize = 3;
const SHADOW_MODE: usize = 4;

/// One statistics key's counters since start, and what statsd was last sent of them.
#[derive(Default)]
struct LimitStats {
    counts: [AtomicU64; 5],
    /// Written by the statsd flush alone.
    flushed: [AtomicU64; 5],
}

impl LimitStats {
    fn add(&self, stat: usize, n: u64) {
        if n > 0 {
            self.counts[stat].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counts a decision of `hits` hits that `decision` answered, as Envoy counts one against
    /// a counter that went from `before` to `after`. A store that failed counts its hits only,
    /// as Envoy counts them before it asks Redis.
    fn count(&self, hits: u64, decision: &Decision, outcome: Outcome, near_limit_ratio: f32) {
        self.add(TOTAL_HITS, hits);
        if outcome == Outcome::StoreError {
            return;
        }
        let limit = decision.limit;
        // Envoy multiplies in single precision, then floors.
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
        let near = ((limit as f32) * near_limit_ratio).floor().max(0.0) as u64;
        // What the counter held before and after the hits: an admitted request consumed them,
        // a refused one did not (Envoy's counter takes them anyway, which changes only the
        // next request's `before`, and that already reads as over the limit).
        let (before, after) = if decision.allowed {
            let after = limit.saturating_sub(decision.remaining);
            (after.saturating_sub(hits), after)
        } else {
            let before = limit.saturating_sub(decision.remaining);
            (before, before.saturating_add(hits))
        };
        if decision.allowed {
            if after > near {
                self.add(NEAR_LIMIT, if before >= near { hits } else { after - near });
            }
            self.add(WITHIN_LIMIT, hits);
            return;
        }
        let over = if before >= limit {
            hits
        } else {
            after.saturating_sub(limit)
        };
        self.add(OVER_LIMIT, over);
        if before < limit {
            // The hits up to the limit were near it.
            self.add(NEAR_LIMIT, limit - near.max(before).min(limit));
        }
        if outcome == Outcome::ShadowLimited {
            self.add(SHADOW_MODE, over);
        }
    }
}

/// The statistics keys' map. Keys may hold request values (`detailed_metric`), so the hasher is
/// seeded per process; the map's size is bounded ([`MAX_DECISION_SERIES`]) too.
type KeyMap<V> = HashMap<Box<str>, V, foldhash::quality::RandomState>;

thread_local! {
    /// The statistics key being built, reused by every decision on this thread.
    static KEY: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The service-wide counters, in the order they are written, with their statsd names.
const SERVICE_STATS: [&str; 6] = [
    "ratelimit_server.ShouldRateLimit.total_requests",
    "ratelimit.service.call.should_rate_limit.redis_error",
    "ratelimit.service.call.should_rate_limit.service_error",
    "ratelimit.service.global_shadow_mode",
    "ratelimit.service.config_load_success",
    "ratelimit.service.config_load_error",
];

/// Envoy's statistics of one service, counted as decisions are made.
pub struct EnvoyStats {
    near_limit_ratio: f32,
    /// `EXTRA_TAGS` as a suffix of every statsd name.
    tags: String,
    limits: RwLock<KeyMap<LimitStats>>,
    total_requests: AtomicU64,
    response_times: ResponseTimes,
    redis_errors: AtomicU64,
    service_errors: AtomicU64,
    global_shadow: AtomicU64,
    /// The rules, for the loads and reloads.
    reloader: Arc<Reloader>,
    /// 1 when the rules were loaded once at start (from files), which Envoy counts as a load.
    initial_load: u64,
}

impl std::fmt::Debug for EnvoyStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvoyStats").finish_non_exhaustive()
    }
}

impl EnvoyStats {
    /// Statistics as `options` describe them, of the service whose rules `reloader` holds;
    /// `loaded_at_start` when the rules were loaded once before the service started (from
    /// files, not pushed over xDS).
    pub fn new(
        options: &EnvoyStatsOptions,
        reloader: Arc<Reloader>,
        loaded_at_start: bool,
    ) -> Self {
        EnvoyStats {
            near_limit_ratio: options.near_limit_ratio,
            tags: stat_name::tag_suffix(&options.extra_tags),
            limits: RwLock::new(KeyMap::default()),
            total_requests: AtomicU64::new(0),
            response_times: ResponseTimes::new(),
            redis_errors: AtomicU64::new(0),
            service_errors: AtomicU64::new(0),
            global_shadow: AtomicU64::new(0),
            reloader,
            initial_load: u64::from(loaded_at_start),
        }
    }

    /// Counts every limit of `verdict`, the answer to `request`, under its rule's statistics
    /// key, and a call that met a store error as Envoy's `redis_error`.
    pub fn count_verdict(&self, request: &LimitRequest, verdict: &Verdict) {
        let mut store_failed = false;
        KEY.with_borrow_mut(|key| {
            for limit in &verdict.limits {
                store_failed |= limit.outcome == Outcome::StoreError;
                let Some(descriptor) = request.descriptors.get(limit.descriptor) else {
                    continue;
                };
                let hits = descriptor.cost.unwrap_or(request.cost.max(1));
                key.clear();
                if limit.rule.is_standalone() {
                    stat_name::write_override_key(&request.domain, descriptor, key);
                } else {
                    limit.rule.write_stat_key(descriptor, key);
                }
                stat_name::sanitize(key);
                self.with_limit(&request.domain, key, |stats| {
                    stats.count(hits, &limit.decision, limit.outcome, self.near_limit_ratio);
                });
            }
        });
        if store_failed {
            self.redis_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one `ShouldRateLimit` call that took `took`, answered or failed.
    pub fn count_call(&self, took: Duration) {
        self.total_requests.fetch_add(1, Ordering::Relaxed);
        self.response_times.record(took);
    }

    /// Counts a call refused as invalid, Envoy's `service_error`.
    pub fn count_service_error(&self) {
        self.service_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an answer that the service-wide shadow mode turned from `OVER_LIMIT` to `OK`.
    pub fn count_global_shadow(&self) {
        self.global_shadow.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text of the statistics, under the names and labels of Envoy's default
    /// statsd-exporter mapping, in the OpenMetrics form of the rest of the metrics listener.
    pub fn render_prometheus(&self, out: &mut String) {
        exposition::render(self, out);
    }

    /// Runs `f` on the counters of statistics key `key`, made for it if it is new. Past
    /// [`MAX_DECISION_SERIES`] keys, a new one (`detailed_metric` and `value_to_metric` put
    /// request values in keys) is counted under `DOMAIN._overflow` instead, so that clients
    /// cannot grow the statistics without bound.
    fn with_limit(&self, domain: &str, key: &str, f: impl FnOnce(&LimitStats)) {
        {
            let limits = self.limits.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(stats) = limits.get(key) {
                return f(stats);
            }
        }
        let mut limits = self.limits.write().unwrap_or_else(PoisonError::into_inner);
        let key: Box<str> = if limits.len() >= MAX_DECISION_SERIES && !limits.contains_key(key) {
            let mut overflow = domain.to_owned();
            stat_name::sanitize(&mut overflow);
            format!("{overflow}.{OVERFLOW_RULE}").into()
        } else {
            key.into()
        };
        f(limits.entry(key).or_default());
    }

    /// The service-wide counters' totals since start, in [`SERVICE_STATS`]' order.
    fn service_totals(&self) -> [u64; 6] {
        let reloads = self.reloader.stats();
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        [
            load(&self.total_requests),
            load(&self.redis_errors),
            load(&self.service_errors),
            load(&self.global_shadow),
            self.initial_load + load(&reloads.reloads) + load(&reloads.unchanged),
            load(&reloads.failures),
        ]
    }

    /// Every statistics key with its counters' totals since start, in key order.
    fn limit_totals(&self) -> Vec<(Box<str>, [u64; 5])> {
        let limits = self.limits.read().unwrap_or_else(PoisonError::into_inner);
        let mut totals: Vec<(Box<str>, [u64; 5])> = limits
            .iter()
            .map(|(key, stats)| {
                (
                    key.clone(),
                    std::array::from_fn(|i| stats.counts[i].load(Ordering::Relaxed)),
                )
            })
            .collect();
        totals.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        totals
    }
}

#[cfg(test)]
mod tests {
    use sluice_limiter::{LimitResult, RequestDescriptor};
    use sluice_rules::{Rule, RuleSet};

    use super::*;

    fn decision(allowed: bool, limit: u64, remaining: u64) -> Decision {
        Decision {
            allowed,
            limit,
            remaining,
            reset_after: Duration::ZERO,
            retry_after: Duration::ZERO,
            delay: Duration::ZERO,
        }
    }

    fn counted(hits: u64, d: Decision, outcome: Outcome) -> [u64; 5] {
        let stats = LimitStats::default();
        stats.count(hits, &d, outcome, 0.8);
        std::array::from_fn(|i| stats.counts[i].load(Ordering::Relaxed))
    }

    #[test]
    fn hits_are_split_as_envoy_splits_them() {
        // [total_hits, over_limit, near_limit, within_limit, shadow_mode], limit 10, near at 8.
        assert_eq!(
            counted(1, decision(true, 10, 5), Outcome::Allowed),
            [1, 0, 0, 1, 0]
        );
        // From 7 to 9: the hits past 8 are near the limit.
        assert_eq!(
            counted(2, decision(true, 10, 1), Outcome::Allowed),
            [2, 0, 1, 2, 0]
        );
        assert_eq!(
            counted(1, decision(true, 10, 0), Outcome::Allowed),
            [1, 0, 1, 1, 0]
        );
        // From 9 to 12 (refused): 2 over the limit, 1 near it.
        assert_eq!(
            counted(3, decision(false, 10, 1), Outcome::Limited),
            [3, 2, 1, 0, 0]
        );
        // Already full: every hit is over.
        assert_eq!(
            counted(2, decision(false, 10, 0), Outcome::Limited),
            [2, 2, 0, 0, 0]
        );
        assert_eq!(
            counted(1, decision(false, 10, 0), Outcome::ShadowLimited),
            [1, 1, 0, 0, 1]
        );
        assert_eq!(
            counted(4, decision(true, 10, 10), Outcome::StoreError),
            [4, 0, 0, 0, 0]
        );
        assert_eq!(counted(0, decision(true, 10, 3), Outcome::Allowed), [0; 5]);
    }

    const RULES: &str = "domain: rl
descriptors:
  - key: route
    value: api
    descriptors:
      - key: method
        descriptors:
          - key: user
            rate_limit: {unit: minute, requests_per_unit: 10}
";

    /// A verdict on `request` under `rules`, each limit answered `decision` with `outcome`.
    fn verdict(
        rules: &RuleSet,
        request: &LimitRequest,
        decision: Decision,
        outcome: Outcome,
    ) -> Verdict {
        let matches = rules.checks(&request.domain, &request.descriptors, 1);
        Verdict {
            allowed: true,
            limits: matches
                .checks
                .into_iter()
                .map(|c| LimitResult {
                    descriptor: c.descriptor,
                    key: c.key,
                    rule: c.rule,
                    decision,
                    outcome,
                })
                .collect(),
            unlimited: Vec::new(),
        }
    }

    fn stats(rules: RuleSet, tags: &[(&str, &str)]) -> EnvoyStats {
        let options = EnvoyStatsOptions {
            extra_tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..EnvoyStatsOptions::default()
        };
        EnvoyStats::new(&options, Reloader::fixed(rules), true)
    }

    fn request(entries: &[(&str, &str)]) -> LimitRequest {
        LimitRequest {
            domain: "rl".into(),
            descriptors: vec![RequestDescriptor::new(entries.iter().copied())],
            cost: 1,
        }
    }

    #[test]
    fn a_deep_key_is_sent_whole_and_shown_with_two_key_labels() {
        let rules = RuleSet::parse("rules.yaml", RULES).unwrap();
        let stats = stats(
            RuleSet::parse("rules.yaml", RULES).unwrap(),
            &[("env", "prod")],
        );
        let request = request(&[("route", "api"), ("method", "GET"), ("user", "a")]);
        stats.count_verdict(
            &request,
            &verdict(&rules, &request, decision(true, 10, 9), Outcome::Allowed),
        );

        let mut flushed = statsd::Flushed::default();
        let sent = statsd::datagrams(&stats, &mut flushed).concat();
        let sent = String::from_utf8(sent).unwrap();
        for line in [
            "ratelimit.service.rate_limit.rl.route_api.method.user.total_hits.__env=prod:1|c",
            "ratelimit.service.rate_limit.rl.route_api.method.user.within_limit.__env=prod:1|c",
            "ratelimit.service.config_load_success.__env=prod:1|c",
        ] {
            assert!(sent.lines().any(|l| l == line), "no {line} in {sent}");
        }
        // A second flush with nothing new sends nothing.
        assert!(statsd::datagrams(&stats, &mut flushed).is_empty());

        let mut text = String::new();
        stats.render_prometheus(&mut text);
        assert!(
            text.contains(
                "ratelimit_service_rate_limit_total_hits{domain=\"rl\",key1=\"route_api\",key2=\"method\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("ratelimit_service_config_load_success 1\n"),
            "{text}"
        );
    }

    #[test]
    fn a_store_error_counts_the_hits_and_the_call_as_envoys_redis_error() {
        let rules = RuleSet::parse("rules.yaml", RULES).unwrap();
        let stats = stats(RuleSet::parse("rules.yaml", RULES).unwrap(), &[]);
        let request = request(&[("route", "api"), ("method", "GET"), ("user", "a")]);
        let failed = verdict(
            &rules,
            &request,
            decision(true, 10, 10),
            Outcome::StoreError,
        );
        stats.count_verdict(&request, &failed);
        let mut flushed = statsd::Flushed::default();
        let sent = String::from_utf8(statsd::datagrams(&stats, &mut flushed).concat()).unwrap();
        assert!(
            sent.contains("ratelimit.service.rate_limit.rl.route_api.method.user.total_hits:1|c\n"),
            "{sent}"
        );
        assert!(
            sent.contains("ratelimit.service.call.should_rate_limit.redis_error:1|c\n"),
            "{sent}"
        );
        assert!(!sent.contains("within_limit"), "{sent}");
    }

    #[test]
    fn a_per_request_limit_is_named_by_its_descriptor() {
        let rules = RuleSet::parse("rules.yaml", RULES).unwrap();
        let stats = stats(rules, &[]);
        let request = request(&[("remote_address", "192.168.0.1"), ("path", "/a:b")]);
        let template = RuleSet::parse(
            "one.yaml",
            "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        )
        .unwrap();
        let limit = template
            .checks("x", &[[("k", "v")]], 1)
            .checks
            .remove(0)
            .rule
            .limit
            .clone();
        let rule = Arc::new(Rule::standalone(limit, Arc::from("override")));
        let verdict = Verdict {
            allowed: false,
            limits: vec![LimitResult {
                descriptor: 0,
                key: String::new(),
                rule,
                decision: decision(false, 1, 0),
                outcome: Outcome::Limited,
            }],
            unlimited: Vec::new(),
        };
        stats.count_verdict(&request, &verdict);
        let mut flushed = statsd::Flushed::default();
        let sent = String::from_utf8(statsd::datagrams(&stats, &mut flushed).concat()).unwrap();
        assert!(
            sent.contains("ratelimit.service.rate_limit.rl.remote_address_192_168_0_1.path_/a_b.over_limit:1|c\n"),
            "{sent}"
        );
    }
}
