//! Runtime overrides in one limiter on the memory store: precedence, counting, validation,
//! reloads and expiry. The shared stores are tested with real instances in
//! `crates/sluice/tests/override_instances.rs`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use sluice_core::MemoryStore;
use sluice_limiter::{
    DescriptorEntry, LimitOverride, LimitRequest, Limiter, Metrics, Outcome, OverrideError,
    OverridePut, RequestDescriptor,
};
use sluice_rules::{Reloader, Unit};
use sluice_test_support::wait::eventually;

const RULES: &str = "domain: plans
descriptors:
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 2}
  - key: bucket
    rate_limit: {algorithm: token_bucket, unit: minute, requests_per_unit: 2}
  - key: open
    rate_limit: {unlimited: true}
";

struct Fixture {
    limiter: Limiter,
    reloader: Arc<Reloader>,
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, RULES).unwrap();
    let reloader = Reloader::new(vec![path.clone()]).unwrap();
    let limiter = Limiter::new(
        reloader.clone(),
        Arc::new(MemoryStore::new()),
        Arc::new(Metrics::new()),
    );
    Fixture {
        limiter,
        reloader,
        path,
        _dir: dir,
    }
}

fn entry(key: &str, value: &str) -> DescriptorEntry {
    DescriptorEntry {
        key: key.into(),
        value: value.into(),
    }
}

fn put(key: &str, value: &str, rate_limit: serde_json::Value) -> OverridePut {
    OverridePut {
        domain: "plans".into(),
        descriptor: vec![entry(key, value)],
        rate_limit,
        expires: None,
        set_by: "test".into(),
    }
}

fn request(key: &str, value: &str) -> LimitRequest {
    LimitRequest {
        domain: "plans".into(),
        descriptors: vec![RequestDescriptor::new([(key, value)])],
        cost: 1,
    }
}

/// How many of `n` requests pass.
async fn passes(limiter: &Limiter, request: &LimitRequest, n: usize) -> usize {
    let mut passed = 0;
    for _ in 0..n {
        if limiter.decide(request).await.unwrap().allowed {
            passed += 1;
        }
    }
    passed
}

#[tokio::test]
async fn an_override_replaces_the_rules_limit_for_its_descriptor_only() {
    let f = fixture();
    let (before, after) = f
        .limiter
        .overrides()
        .put(put(
            "tenant",
            "acme",
            json!({"unit": "minute", "requests_per_unit": 5}),
        ))
        .await
        .unwrap();
    assert_eq!(before, None);
    assert_eq!(after.status, "applied");
    assert_eq!(after.rule.as_deref(), Some("per_tenant"));
    assert_eq!(passes(&f.limiter, &request("tenant", "acme"), 8).await, 5);
    assert_eq!(passes(&f.limiter, &request("tenant", "beta"), 8).await, 2);
    // Reported under the rule's own name, with the override's limit, and counted in the
    // rule's series.
    let verdict = f.limiter.decide(&request("tenant", "acme")).await.unwrap();
    assert_eq!(verdict.limits[0].rule.label(), "per_tenant");
    assert_eq!(verdict.limits[0].rule.policy.limit(), 5);
    let metrics = f.limiter.metrics();
    assert_eq!(
        metrics.decisions_of("plans", "per_tenant", Outcome::Allowed),
        7
    );
    assert_eq!(
        metrics.decisions_of("plans", "per_tenant", Outcome::Limited),
        10
    );
}

#[tokio::test]
async fn a_requests_own_envoy_limit_wins_over_a_runtime_override() {
    let f = fixture();
    f.limiter
        .overrides()
        .put(put(
            "tenant",
            "acme",
            json!({"unit": "minute", "requests_per_unit": 50}),
        ))
        .await
        .unwrap();
    let mut own = request("tenant", "acme");
    own.descriptors[0].limit_override = Some(LimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour,
    });
    assert_eq!(passes(&f.limiter, &own, 3).await, 1);
    // Without its own limit, the runtime override is in force: 50 a minute.
    assert_eq!(passes(&f.limiter, &request("tenant", "acme"), 10).await, 10);
}

#[tokio::test]
async fn raising_a_windows_limit_keeps_its_count() {
    let f = fixture();
    let acme = request("tenant", "acme");
    assert_eq!(passes(&f.limiter, &acme, 3).await, 2);
    f.limiter
        .overrides()
        .put(put(
            "tenant",
            "acme",
            json!({"unit": "minute", "requests_per_unit": 5}),
        ))
        .await
        .unwrap();
    // The two already counted stay counted: three more, not five.
    assert_eq!(passes(&f.limiter, &acme, 6).await, 3);
    // Removed, the rule's limit of 2 finds the window's 5.
    f.limiter
        .overrides()
        .remove("plans", &[entry("tenant", "acme")])
        .await
        .unwrap();
    assert_eq!(passes(&f.limiter, &acme, 2).await, 0);
}

#[tokio::test]
async fn raising_a_buckets_capacity_keeps_its_level() {
    let f = fixture();
    let mine = request("bucket", "mine");
    assert_eq!(passes(&f.limiter, &mine, 3).await, 2);
    f.limiter
        .overrides()
        .put(put(
            "bucket",
            "mine",
            json!({"algorithm": "token_bucket", "unit": "minute", "requests_per_unit": 100}),
        ))
        .await
        .unwrap();
    // The emptied bucket stays empty under the larger capacity and refills at the new rate
    // (100 a minute): no fresh bucket of 100 handed out.
    let passed = passes(&f.limiter, &mine, 20).await;
    assert!(passed <= 2, "{passed} passed of an emptied bucket");
}

#[tokio::test]
async fn another_algorithm_counts_on_a_counter_of_its_own() {
    let f = fixture();
    let acme = request("tenant", "acme");
    assert_eq!(passes(&f.limiter, &acme, 2).await, 2);
    f.limiter
        .overrides()
        .put(put(
            "tenant",
            "acme",
            json!({"algorithm": "sliding_log", "unit": "minute", "requests_per_unit": 3}),
        ))
        .await
        .unwrap();
    assert_eq!(passes(&f.limiter, &acme, 5).await, 3);
    let verdict = f.limiter.decide(&acme).await.unwrap();
    assert!(
        verdict.limits[0].key.contains('~'),
        "{}",
        verdict.limits[0].key
    );
}

async fn refused(f: &Fixture, put: OverridePut) -> String {
    match f.limiter.overrides().put(put).await {
        Err(OverrideError::Invalid(reason)) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn five() -> serde_json::Value {
    json!({"unit": "minute", "requests_per_unit": 5})
}

#[tokio::test]
async fn bad_overrides_are_refused_with_the_reason_and_nothing_is_stored() {
    let f = fixture();
    let mut other_domain = put("tenant", "acme", five());
    other_domain.domain = "nowhere".into();
    assert!(
        refused(&f, other_domain)
            .await
            .contains("unknown domain `nowhere`")
    );
    let no_rule = put("user", "alice", five());
    assert!(
        refused(&f, no_rule)
            .await
            .contains("matches no rule of domain `plans`")
    );
    let unlimited = put("open", "x", five());
    assert!(refused(&f, unlimited).await.contains("`unlimited` rule"));
    // The rule decoder's own message.
    let bad_unit = put(
        "tenant",
        "acme",
        json!({"unit": "fortnight", "requests_per_unit": 5}),
    );
    let reason = refused(&f, bad_unit).await;
    assert!(
        reason.starts_with("rate_limit: unknown unit `fortnight`"),
        "{reason}"
    );
    let unknown_key = put(
        "tenant",
        "acme",
        json!({"unit": "minute", "requests_per_unit": 5, "burts": 3}),
    );
    assert!(
        refused(&f, unknown_key)
            .await
            .contains("unknown field `burts`")
    );
    let mut past = put("tenant", "acme", five());
    past.expires = Some("2001-01-01T00:00:00Z".into());
    assert!(refused(&f, past).await.contains("in the past"));
    let mut garbled = put("tenant", "acme", five());
    garbled.expires = Some("next tuesday".into());
    assert!(refused(&f, garbled).await.contains("not an RFC 3339 time"));
    let mut empty = put("tenant", "acme", five());
    empty.descriptor.clear();
    assert!(refused(&f, empty).await.contains("`descriptor` is empty"));
    assert!(f.limiter.overrides().list("plans").is_empty());
    assert_eq!(passes(&f.limiter, &request("tenant", "acme"), 3).await, 2);
}

#[tokio::test]
async fn on_the_memory_store_overrides_are_local_and_say_so() {
    let f = fixture();
    assert!(!f.limiter.overrides().shared());
    assert!(
        f.limiter
            .overrides()
            .readiness()
            .contains("local to this instance")
    );
    assert!(!f.limiter.overrides().sync_now().await.unwrap());
}

#[tokio::test]
async fn a_rule_reload_keeps_overrides_and_reports_those_left_unmatched() {
    let f = fixture();
    f.limiter
        .overrides()
        .put(put("tenant", "acme", five()))
        .await
        .unwrap();
    // The rule's limit changes: the override still replaces it.
    let changed = RULES.replace("requests_per_unit: 2}", "requests_per_unit: 3}");
    std::fs::write(&f.path, changed).unwrap();
    f.reloader.reload_now();
    assert_eq!(passes(&f.limiter, &request("tenant", "acme"), 8).await, 5);
    // The rule goes: the override is kept, shown unmatched, and counted.
    let without = "domain: plans\ndescriptors:\n  - key: bucket\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    std::fs::write(&f.path, without).unwrap();
    f.reloader.reload_now();
    assert_eq!(passes(&f.limiter, &request("tenant", "acme"), 3).await, 3);
    let listed = f.limiter.overrides().list("plans");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].status, "unmatched");
    assert!(
        listed[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("matches no rule")
    );
    assert!(
        f.limiter
            .render_metrics()
            .contains("sluice_overrides_unmatched 1")
    );
    // The rule comes back: so does the override.
    std::fs::write(&f.path, RULES).unwrap();
    f.reloader.reload_now();
    assert_eq!(f.limiter.overrides().list("plans")[0].status, "applied");
    assert!(
        f.limiter
            .render_metrics()
            .contains("sluice_overrides{domain=\"plans\"} 1")
    );
}

#[tokio::test]
async fn an_expired_override_gives_the_rule_its_limit_back() {
    let f = fixture();
    let soon = SystemTime::now() + Duration::from_secs(2);
    let secs = soon.duration_since(UNIX_EPOCH).unwrap().as_secs() + 1;
    let mut until = put(
        "tenant",
        "acme",
        json!({"unit": "minute", "requests_per_unit": 1000}),
    );
    until.expires = Some(rfc3339(secs));
    f.limiter.overrides().put(until).await.unwrap();
    let acme = request("tenant", "acme");
    assert_eq!(passes(&f.limiter, &acme, 5).await, 5);
    eventually("the override expired and the rule refuses", || async {
        !f.limiter.decide(&acme).await.unwrap().allowed
    })
    .await;
    assert_eq!(f.limiter.overrides().list("plans")[0].status, "expired");
}

/// `secs` since the epoch in RFC 3339, UTC.
fn rfc3339(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap();
    let rem = secs % 86_400;
    // The civil date from days since 1970 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
