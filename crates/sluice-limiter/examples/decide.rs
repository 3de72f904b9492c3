//! Decides a number of requests on the memory store, for counting what one decision costs:
//! `valgrind --tool=callgrind target/release/examples/decide 10000` against `... 20000`, the
//! difference divided by 10,000 is the instructions of one round, start-up excluded.
//!
//! A round decides the usual request (one descriptor, one enforced limit) and a request of two
//! descriptors with a shadow limit beside two enforced ones, so both of `Limiter::decide`'s
//! paths are counted; a second argument, `usual` or `two`, decides only that one.

use std::sync::Arc;

use sluice_core::MemoryStore;
use sluice_limiter::{LimitRequest, Limiter, Metrics, RequestDescriptor};
use sluice_rules::{Reloader, RuleSet};

const RULES: &str = "
domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: second, requests_per_unit: 1000000000}
  - key: ip
    limits:
      - {requests_per_unit: 1000000000, unit: minute}
      - {requests_per_unit: 10, unit: hour, action: shadow}
";

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(10_000);
    let only = args.next();
    let rules = RuleSet::parse("rules.yaml", RULES).expect("the example's rules are valid");
    let limiter = Limiter::new(
        Reloader::fixed(rules),
        Arc::new(MemoryStore::new()),
        Arc::new(Metrics::new()),
    );
    let usual = LimitRequest {
        domain: "api".into(),
        descriptors: vec![RequestDescriptor::new([("user", "alice")])],
        cost: 1,
    };
    let two = LimitRequest {
        domain: "api".into(),
        descriptors: vec![
            RequestDescriptor::new([("user", "bob")]),
            RequestDescriptor::new([("ip", "10.0.0.1")]),
        ],
        cost: 1,
    };
    let requests: Vec<&LimitRequest> = match only.as_deref() {
        Some("usual") => vec![&usual],
        Some("two") => vec![&two],
        _ => vec![&usual, &two],
    };
    let mut allowed = 0usize;
    for _ in 0..rounds {
        for &request in &requests {
            let verdict = limiter.decide(request).await.expect("the request is valid");
            allowed += usize::from(verdict.allowed);
        }
    }
    println!("{allowed} of {} requests allowed", requests.len() * rounds);
}
