//! `algorithm: bucketed_window` with `sub_windows`: what it builds, its default, and its errors
//! at their `file:line:col`.

use std::time::Duration;

use sluice_core::Policy;
use sluice_rules::RuleSet;

fn policy(text: &str) -> Policy {
    let rules = RuleSet::parse("rules.yaml", text).unwrap_or_else(|e| panic!("{e}"));
    let m = rules.checks("api", &[[("user", "u")]], 1);
    (*m.checks[0].rule.policy).clone()
}

fn error(text: &str) -> String {
    let err = RuleSet::parse("rules.yaml", text).expect_err("the text must be rejected");
    assert_eq!(err.errors().len(), 1, "{err}");
    err.errors()[0].to_string()
}

#[test]
fn an_hour_in_sixty_minutes() {
    let p = policy(
        "domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: bucketed_window, sub_windows: 60}
",
    );
    let Policy::BucketedWindow(p) = p else {
        panic!("{p:?}")
    };
    assert_eq!(p.limit(), 1000);
    assert_eq!(p.window(), Duration::from_secs(3600));
    assert_eq!(p.sub_windows(), 60);
    assert_eq!(p.bucket(), Duration::from_secs(60));
}

#[test]
fn sixty_buckets_when_not_said() {
    let p = policy(
        "domain: api
descriptors:
  - key: user
    rate_limit: {window: 10m, requests_per_unit: 5, algorithm: bucketed_window}
",
    );
    let Policy::BucketedWindow(p) = p else {
        panic!("{p:?}")
    };
    assert_eq!(p.sub_windows(), 60);
    assert_eq!(p.bucket(), Duration::from_secs(10));
}

#[test]
fn a_count_out_of_range_is_refused_where_it_is_written() {
    let msg = error(
        "domain: api
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 5
      algorithm: bucketed_window
      sub_windows: 5000
",
    );
    assert!(msg.starts_with("rules.yaml:8:20:"), "{msg}");
    assert!(msg.contains("1 to 1024"), "{msg}");
}

#[test]
fn a_count_that_does_not_divide_the_window_is_refused() {
    let msg = error(
        "domain: api
descriptors:
  - key: user
    rate_limit: {window: 1s, requests_per_unit: 5, algorithm: bucketed_window, sub_windows: 7}
",
    );
    assert!(msg.starts_with("rules.yaml:4:"), "{msg}");
    assert!(msg.contains("do not divide"), "{msg}");
}

#[test]
fn sub_windows_belongs_to_the_bucketed_window_alone() {
    let msg = error(
        "domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_log, sub_windows: 6}
",
    );
    assert!(msg.starts_with("rules.yaml:4:"), "{msg}");
    assert!(msg.contains("bucketed_window"), "{msg}");
}
