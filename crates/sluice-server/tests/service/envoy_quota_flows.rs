//! Envoy's quota flows as envoyproxy/ratelimit's own repository runs them, step by step over
//! gRPC and `/json`: a request spread over two services by their token quotas (each quota
//! descriptor checked with a `hits_addend` of 0, the usage reported after the response with 1),
//! and the reset a check with 0 reports on a counter that holds nothing yet.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use serde_json::{Value, json};

use crate::harness::{Harness, Rls, addend, descriptor, request};

/// How a test talks to the service.
#[derive(Clone, Copy, Debug)]
enum Via {
    Grpc,
    Json,
}

/// What one answer says: whether the request passes, each descriptor's code and remainder,
/// the whole seconds until each one's reset, and the name of the plan in the answer's metadata
/// (what Envoy routes the request by).
#[derive(Debug, PartialEq)]
struct Seen {
    ok: bool,
    codes: Vec<bool>,
    remaining: Vec<u32>,
    resets: Vec<i64>,
    plan: Option<String>,
}

/// Asks about `descriptors`, each `(key, value, its own hits_addend)`, in the `shop` domain.
async fn ask(h: &Harness, rls: &mut Rls, via: Via, descriptors: &[(&str, &str, u64)]) -> Seen {
    match via {
        Via::Grpc => {
            let ds = descriptors
                .iter()
                .map(|(k, v, n)| {
                    let mut d = descriptor(&[(k, v)]);
                    d.hits_addend = addend(*n);
                    d
                })
                .collect();
            seen_grpc(&rls.ask(request(ds)).await)
        }
        Via::Json => {
            let ds: Vec<Value> = descriptors
                .iter()
                .map(|(k, v, n)| json!({"entries": [{"key": k, "value": v}], "hits_addend": n}))
                .collect();
            let (status, j, _) = h
                .post("/json", &json!({"domain": "shop", "descriptors": ds}))
                .await;
            let seen = seen_json(&j);
            assert_eq!(status == 200, seen.ok, "the status follows the answer: {j}");
            seen
        }
    }
}

fn seen_grpc(r: &RateLimitResponse) -> Seen {
    let plan = r.dynamic_metadata.as_ref().and_then(|m| {
        let j = sluice_server::metadata::struct_json(m);
        j["metadata"]["plan"]["name"].as_str().map(str::to_owned)
    });
    Seen {
        ok: r.overall_code == Code::Ok as i32,
        codes: r
            .statuses
            .iter()
            .map(|s| s.code == Code::Ok as i32)
            .collect(),
        remaining: r.statuses.iter().map(|s| s.limit_remaining).collect(),
        resets: r
            .statuses
            .iter()
            .map(|s| s.duration_until_reset.map_or(-1, |d| d.seconds))
            .collect(),
        plan,
    }
}

fn seen_json(j: &Value) -> Seen {
    let statuses = j["statuses"].as_array().cloned().unwrap_or_default();
    Seen {
        ok: j["overallCode"] == "OK",
        codes: statuses.iter().map(|s| s["code"] == "OK").collect(),
        remaining: statuses
            .iter()
            .map(|s| s["limitRemaining"].as_u64().map_or(0, |n| n as u32))
            .collect(),
        resets: statuses
            .iter()
            .map(|s| match s["durationUntilReset"].as_str() {
                Some(d) => d.trim_end_matches('s').parse().unwrap(),
                None => -1,
            })
            .collect(),
        plan: j["dynamicMetadata"]["metadata"]["plan"]["name"]
            .as_str()
            .map(str::to_owned),
    }
}

/// One request through Envoy as envoyproxy/ratelimit's multi-service token-quota example
/// routes it: both services' quota descriptors (`gold` 1 a minute, `silver` 2, both
/// `quota_mode`) checked with a `hits_addend` of 0; the request goes to the service named by
/// the answer's metadata, and once its response is done, that service's usage is reported
/// with 1. The request path's answer, and the report's (which Envoy does not act on).
async fn route(h: &Harness, rls: &mut Rls, via: Via) -> (Seen, Option<Seen>) {
    let checked = ask(
        h,
        rls,
        via,
        &[("service", "gold", 0), ("service", "silver", 0)],
    )
    .await;
    let report = match (&checked.ok, &checked.plan) {
        (true, Some(service)) => Some(ask(h, rls, via, &[("service", service, 1)]).await),
        _ => None,
    };
    (checked, report)
}

#[tokio::test]
async fn envoys_multi_service_token_quota_passes_through_the_service_with_quota_left() {
    for via in [Via::Grpc, Via::Json] {
        let h = Harness::start_with(|o| o.envoy.dynamic_metadata = true).await;
        let mut rls = h.grpc().await;
        let mut served = Vec::new();
        let mut checks = Vec::new();
        let mut reports = Vec::new();
        for _ in 0..6 {
            let (checked, report) = route(&h, &mut rls, via).await;
            served.push(checked.plan.clone().filter(|_| checked.ok));
            checks.push((checked.ok, checked.codes, checked.remaining));
            reports.push(report.map(|r| r.codes[0]));
        }
        let (gold, silver) = (Some("gold".to_owned()), Some("silver".to_owned()));
        // gold's one a minute is debited after the response, so it serves two requests (the
        // second check finds it exactly at its limit, which passes); then silver, over
        // quota on the second check, serves three; the sixth finds both over and is refused.
        assert_eq!(
            served,
            [
                gold.clone(),
                gold.clone(),
                silver.clone(),
                silver.clone(),
                silver,
                None
            ],
            "{via:?}"
        );
        assert_eq!(
            checks,
            [
                (true, vec![true, true], vec![1, 2]),
                (true, vec![true, true], vec![0, 2]),
                (true, vec![false, true], vec![0, 2]),
                (true, vec![false, true], vec![0, 1]),
                (true, vec![false, true], vec![0, 0]),
                (false, vec![false, false], vec![0, 0]),
            ],
            "{via:?}: a check with 0 consumes nothing, and gold over does not refuse"
        );
        // The reports that take a service past its quota answer OVER_LIMIT, as envoyproxy/
        // ratelimit answers them; they are counted all the same.
        assert_eq!(
            reports,
            [
                Some(true),
                Some(false),
                Some(true),
                Some(true),
                Some(false),
                None
            ],
            "{via:?}"
        );
        // The next minute both quotas are back, and gold serves again.
        h.clock.advance(Duration::from_secs(60));
        let (checked, report) = route(&h, &mut rls, via).await;
        assert_eq!(
            (checked.ok, checked.plan.as_deref()),
            (true, Some("gold")),
            "{via:?}"
        );
        assert_eq!(report.map(|r| r.ok), Some(true), "{via:?}");
    }
}

/// A descriptor of one entry with its own `hits_addend` of `n`, or none.
fn hits(key: &str, value: &str, n: Option<u64>) -> RateLimitDescriptor {
    let mut d = descriptor(&[(key, value)]);
    d.hits_addend = n.and_then(addend);
    d
}

#[tokio::test]
async fn a_quota_descriptor_over_by_envoys_count_drops_out_like_any_refused_one() {
    let h = Harness::start().await;
    let mut rls = h.grpc().await;
    let mut ask = async |ds: Vec<RateLimitDescriptor>| seen_grpc(&rls.ask(request(ds)).await);
    // gold past its quota by a report.
    ask(vec![hits("service", "gold", Some(2))]).await;

    // Beside an ordinary limit only, gold refuses the request, and the ordinary limit
    // consumes nothing.
    let s = ask(vec![
        hits("service", "gold", Some(0)),
        hits("client", "c", None),
    ])
    .await;
    assert_eq!(
        (s.ok, s.codes, s.remaining),
        (false, vec![false, true], vec![0, 3]),
        "gold was the only quota descriptor"
    );
    // Beside silver, checked the ordinary way: gold drops out, the rest pass and consume.
    let s = ask(vec![
        hits("service", "gold", Some(0)),
        hits("service", "silver", None),
        hits("client", "c", None),
    ])
    .await;
    assert_eq!(
        (s.ok, s.codes, s.remaining),
        (true, vec![false, true, true], vec![0, 1, 2])
    );
    // Beside silver checked Envoy's way and passing, the ordinary limit is counted.
    let s = ask(vec![
        hits("service", "gold", Some(0)),
        hits("service", "silver", Some(0)),
        hits("client", "c", None),
    ])
    .await;
    assert_eq!(
        (s.ok, s.codes, s.remaining),
        (true, vec![false, true, true], vec![0, 1, 1])
    );

    // An ordinary limit over by a report still refuses the request, quota descriptors or not.
    ask(vec![hits("tokens", "t", Some(101))]).await;
    let s = ask(vec![
        hits("tokens", "t", Some(0)),
        hits("service", "silver", Some(0)),
    ])
    .await;
    assert_eq!((s.ok, s.codes), (false, vec![false, true]));

    // Under the service-wide QUOTA_MODE every limit is a quota limit: a report over drops its
    // descriptor out, and the request passes on another that stands.
    let h = Harness::start_with(|o| o.envoy.quota_mode = true).await;
    let mut rls = h.grpc().await;
    let mut ask = async |ds: Vec<RateLimitDescriptor>| seen_grpc(&rls.ask(request(ds)).await);
    ask(vec![hits("tokens", "t", Some(101))]).await;
    let s = ask(vec![
        hits("tokens", "t", Some(0)),
        hits("client", "c", None),
    ])
    .await;
    assert_eq!(
        (s.ok, s.codes, s.remaining),
        (true, vec![false, true], vec![0, 2])
    );
    let s = ask(vec![hits("tokens", "t", Some(5))]).await;
    assert_eq!((s.ok, s.codes), (false, vec![false]), "alone, it refuses");
}

#[tokio::test]
async fn a_check_with_0_on_a_fresh_counter_reports_the_rest_of_its_window() {
    for via in [Via::Grpc, Via::Json] {
        let h = Harness::start().await;
        let mut rls = h.grpc().await;
        // 20.5 s into the minute (and the hour): 39.5 s left, reported as 40.
        h.clock.advance(Duration::from_millis(20_500));
        let fresh = ask(
            &h,
            &mut rls,
            via,
            &[("tokens", "fresh", 0), ("account", "fresh", 0)],
        )
        .await;
        assert_eq!(
            (fresh.ok, fresh.remaining, fresh.resets),
            (true, vec![100, 100], vec![40, 3580]),
            "{via:?}"
        );
        // As for any matched limit: one that counted, and one over.
        h.clock.advance(Duration::from_secs(10));
        let counted = ask(&h, &mut rls, via, &[("tokens", "fresh", 100)]).await;
        assert_eq!((counted.remaining, counted.resets), (vec![0], vec![30]));
        let at_limit = ask(&h, &mut rls, via, &[("tokens", "fresh", 0)]).await;
        assert_eq!((at_limit.ok, at_limit.resets), (true, vec![30]));
        ask(&h, &mut rls, via, &[("tokens", "fresh", 1)]).await;
        let over = ask(&h, &mut rls, via, &[("tokens", "fresh", 0)]).await;
        assert_eq!((over.ok, over.resets), (false, vec![30]), "{via:?}");
        // The next window starts afresh, its whole length ahead.
        h.clock.advance(Duration::from_millis(29_500));
        let next = ask(&h, &mut rls, via, &[("tokens", "fresh", 0)]).await;
        assert_eq!(
            (next.ok, next.remaining, next.resets),
            (true, vec![100], vec![60]),
            "{via:?}"
        );
    }
}
