//! `concurrency: N`, a limit on requests in flight, with its `ttl`: what it builds, its default
//! ttl, and its errors at their `file:line:col`.

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
fn ten_in_flight_held_two_minutes_at_most() {
    let p = policy(
        "domain: api
descriptors:
  - key: user
    rate_limit: {name: in_flight, concurrency: 10, ttl: 2m}
",
    );
    let Policy::ConcurrencyLimit(p) = p else {
        panic!("{p:?}")
    };
    assert_eq!(p.limit(), 10);
    assert_eq!(p.ttl(), Duration::from_secs(120));
}

#[test]
fn holds_last_five_minutes_when_not_said() {
    let p = policy(
        "domain: api
descriptors:
  - key: user
    limits:
      - {name: slots, concurrency: 3}
",
    );
    assert!(p.concurrent());
    assert_eq!(p.limit(), 3);
    let Policy::ConcurrencyLimit(p) = p else {
        panic!("{p:?}")
    };
    assert_eq!(p.ttl(), Duration::from_secs(300));
}

#[test]
fn a_window_beside_a_concurrency_is_refused_where_it_is_written() {
    let msg = error(
        "domain: api
descriptors:
  - key: user
    rate_limit: {concurrency: 3, unit: minute}
",
    );
    assert!(msg.starts_with("rules.yaml:4:40"), "{msg}");
    assert!(msg.contains("concurrency"), "{msg}");
    assert!(msg.contains("unit"), "{msg}");
}

#[test]
fn a_ttl_on_a_limit_per_window_is_refused() {
    let msg = error(
        "domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5, ttl: 1m}
",
    );
    assert!(msg.starts_with("rules.yaml:4:59"), "{msg}");
    assert!(msg.contains("concurrency limits"), "{msg}");
}

#[test]
fn a_zero_ttl_is_refused_at_the_ttl() {
    let msg = error(
        "domain: api
descriptors:
  - key: user
    rate_limit: {concurrency: 3, ttl: 0s}
",
    );
    assert!(msg.starts_with("rules.yaml:4:39"), "{msg}");
}
