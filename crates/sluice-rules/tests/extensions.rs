//! Sluice's extensions: algorithms with their parameters, windows, several limits per
//! descriptor, actions and store-error policies, and how counter keys behave across changes.

use std::path::PathBuf;
use std::time::Duration;

use sluice_core::{Alignment, Policy, Rate};
use sluice_rules::{Action, Matches, OnStoreError, RuleSet};

fn rules() -> RuleSet {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sluice");
    RuleSet::load(&path).unwrap_or_else(|e| panic!("fixtures must load:\n{e}"))
}

fn api(rules: &RuleSet, key: &str, value: &str) -> Matches {
    rules.checks("api", &[[(key, value)]], 1)
}

#[test]
fn several_limits_on_one_descriptor() {
    let rules = rules();
    let m = api(&rules, "api_key", "k1");
    assert_eq!(m.checks.len(), 2);
    let burst = &m.checks[0].rule;
    let daily = &m.checks[1].rule;
    assert_eq!(burst.name.as_deref(), Some("burst"));
    match &*burst.policy {
        Policy::TokenBucket(p) => {
            assert_eq!(p.capacity(), 40);
            assert_eq!(p.rate(), Rate::per_second(20));
        }
        other => panic!("{other:?}"),
    }
    match &*daily.policy {
        Policy::FixedWindow(p) => {
            assert_eq!(p.limit(), 10_000);
            assert_eq!(p.window(), Duration::from_secs(86_400));
            assert_eq!(
                p.alignment(),
                Alignment::Clock {
                    utc_offset_secs: 10_800
                }
            );
        }
        other => panic!("{other:?}"),
    }
    // One descriptor, one hash tag: both counters land in one Redis Cluster slot.
    let tag = |k: &str| k[..k.find('}').unwrap() + 1].to_owned();
    assert_eq!(tag(&m.checks[0].key), tag(&m.checks[1].key));
    assert_ne!(m.checks[0].key, m.checks[1].key);
    // The descriptor's on_store_error overrides the domain's.
    assert!(
        m.checks
            .iter()
            .all(|c| c.rule.on_store_error == OnStoreError::Local)
    );
}

#[test]
fn each_algorithm_maps_onto_its_policy() {
    let rules = rules();
    let ip = api(&rules, "ip", "10.0.0.1");
    assert!(matches!(&*ip.checks[0].rule.policy, Policy::Gcra(p) if p.burst() == 5));
    assert!(matches!(&*ip.checks[1].rule.policy,
        Policy::SlidingCounter(p) if p.limit() == 1000 && p.window() == Duration::from_secs(900)));
    assert_eq!(ip.checks[0].rule.on_store_error, OnStoreError::Allow);

    let upload = api(&rules, "upload", "u");
    match &*upload.checks[0].rule.policy {
        Policy::LeakyQueue(p) => {
            assert_eq!(p.queue_size(), 10);
            assert_eq!(p.max_wait(), Duration::from_secs(5));
        }
        other => panic!("{other:?}"),
    }
    // A queue delays by default.
    assert_eq!(
        upload.checks[0].rule.action,
        Action::Delay { max_wait: None }
    );

    let login = api(&rules, "login", "l");
    assert!(matches!(&*login.checks[0].rule.policy,
        Policy::SlidingLog(p) if p.limit() == 5 && p.window() == Duration::from_secs(30)));

    let search = api(&rules, "search", "s");
    assert!(matches!(&*search.checks[0].rule.policy,
        Policy::FixedWindow(p) if p.alignment() == Alignment::FirstRequest
            && p.window() == Duration::from_secs(36 * 3600)));
}

#[test]
fn actions_and_their_parameters() {
    let rules = rules();
    assert_eq!(
        api(&rules, "login", "l").checks[0].rule.action,
        Action::Fake {
            status: 200,
            content_type: "application/json".into(),
            body: r#"{"ok":true}"#.into()
        }
    );
    assert_eq!(
        api(&rules, "search", "s").checks[0].rule.action,
        Action::Soft {
            header: "X-Search-Quota".into()
        }
    );
    let export = &api(&rules, "export", "e").checks[0].rule;
    assert_eq!(export.action, Action::Delay { max_wait: None });
    assert_eq!(export.on_store_error, OnStoreError::Deny);
    assert_eq!(api(&rules, "ip", "x").checks[0].rule.action, Action::Reject);
}

#[test]
fn action_shadow_marks_the_check_as_shadow() {
    let rules = RuleSet::parse(
        "r.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    action: shadow\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    let m = rules.checks("d", &[[("k", "v")]], 1);
    assert!(m.checks[0].rule.shadow);
}

#[test]
fn nested_descriptors_inherit_the_action() {
    let rules = RuleSet::parse(
        "r.yaml",
        "domain: d
action: {fake: {status: 202}}
descriptors:
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: c
        action: reject
        rate_limit: {unit: second, requests_per_unit: 1}
",
    )
    .unwrap();
    let b = rules.checks("d", &[[("a", "1"), ("b", "2")]], 1);
    assert!(matches!(
        b.checks[0].rule.action,
        Action::Fake { status: 202, .. }
    ));
    let c = rules.checks("d", &[[("a", "1"), ("c", "2")]], 1);
    assert_eq!(c.checks[0].rule.action, Action::Reject);
}

const BEFORE: &str = "domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 5}
";

#[test]
fn unchanged_rules_keep_their_keys_and_changed_ones_do_not() {
    let before = RuleSet::parse("r.yaml", BEFORE).unwrap();
    // The ip rule changes its limit; the user rule moves but is otherwise the same.
    let after = RuleSet::parse(
        "r.yaml",
        "domain: d
descriptors:
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 6}
  # a comment that shifts every line
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10, name: renamed}
",
    )
    .unwrap();
    let key = |set: &RuleSet, k: &str| set.checks("d", &[[(k, "x")]], 1).checks[0].key.clone();
    assert_eq!(key(&before, "user"), key(&after, "user"));
    assert_ne!(key(&before, "ip"), key(&after, "ip"));
}

#[test]
fn keys_are_injective_and_bounded_for_hostile_values() {
    let rules = RuleSet::parse(
        "r.yaml",
        "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    let key = |a: &str, b: &str| {
        rules.checks("d", &[[("a", a), ("b", b)]], 1).checks[0]
            .key
            .clone()
    };
    // Values that would collide under naive joining.
    assert_ne!(key("x|b=y", "z"), key("x", "y|b=z"));
    assert_ne!(key("x}", "y"), key("x", "}y"));
    assert_ne!(key("%7C", "y"), key("|", "y"));
    let huge = "v".repeat(100_000);
    let k = key(&huge, "y");
    assert!(k.len() <= sluice_rules::MAX_KEY_LEN, "{}", k.len());
    assert_ne!(k, key(&"v".repeat(99_999), "y"));
    // Only one brace pair: the hash tag cannot be closed early by a value.
    for k in [key("{", "}"), key("a}b{c", "x")] {
        assert_eq!(k.matches('{').count(), 1, "{k}");
        assert_eq!(k.matches('}').count(), 1, "{k}");
    }
}
