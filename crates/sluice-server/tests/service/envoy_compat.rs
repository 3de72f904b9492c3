//! envoyproxy/ratelimit's answers and settings, over gRPC and `/json` alike: unlimited and
//! refused descriptors, resets, quota mode (per rule and service-wide), dynamic metadata,
//! request values in metric labels, and Envoy's token quota flow.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitResponse, rate_limit_response::Code, rate_limit_response::rate_limit::Unit,
};
use serde_json::json;

use crate::harness::{Harness, addend, codes, descriptor, json_one, key_path, one, request};

/// envoyproxy/ratelimit's answers, over gRPC and `POST /json` alike: an unlimited descriptor
/// reports 4294967295 remaining and no limit; a refusal reports 0 remaining even when a cheaper
/// request would still fit; a descriptor with no entries is not limited and not an error.
#[tokio::test]
async fn envoy_answer_rules_hold_on_grpc_and_json() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;

    // Unlimited.
    let r = client.ask(one(&[("health", "x")])).await;
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert!(r.statuses[0].current_limit.is_none());
    let body = json_one("health", "x");
    let (status, j, _) = h.post("/json", &body).await;
    assert_eq!(status, 200);
    assert_eq!(j["statuses"][0]["limitRemaining"], json!(u32::MAX));
    assert!(j["statuses"][0].get("currentLimit").is_none(), "{j}");

    // Refused with room left for a cheaper request: 3 a minute, 2 used, a request of 2.
    for (path, user) in [("grpc", "r1"), ("/json", "r2")] {
        let one = |addend: u64| {
            let mut req = one(&[("client", user)]);
            req.hits_addend = addend as u32;
            req
        };
        if path == "grpc" {
            client.ask(one(2)).await;
            let r = client.ask(one(2)).await;
            assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
            assert_eq!(r.statuses[0].limit_remaining, 0, "over the limit reads 0");
        } else {
            let body = |n: u64| json!({"domain": "shop", "hits_addend": n, "descriptors": [{"entries": [{"key": "client", "value": user}]}]});
            h.post("/json", &body(2)).await;
            let (status, j, _) = h.post("/json", &body(2)).await;
            assert_eq!(status, 429);
            assert_eq!(j["statuses"][0]["code"], "OVER_LIMIT");
            assert!(
                j["statuses"][0].get("limitRemaining").is_none(),
                "0, omitted: {j}"
            );
            // The native answer keeps the true remainder.
            let (_, c, _) = h
                .post("/v1/check", &json!({"domain": "shop", "cost": 2, "descriptors": [{"entries": [{"key": "client", "value": user}]}]}))
                .await;
            assert_eq!(c["descriptors"][0]["limits"][0]["remaining"], 1, "{c}");
        }
    }

    // The reset in whole seconds, rounded up: 58.5 s left of the minute reads 59 s.
    h.clock.advance(std::time::Duration::from_millis(1500));
    let r = client.ask(one(&[("client", "reset")])).await;
    let reset = r.statuses[0].duration_until_reset.unwrap();
    assert_eq!((reset.seconds, reset.nanos), (59, 0));
    let body = json_one("client", "reset");
    let (_, j, _) = h.post("/json", &body).await;
    assert_eq!(j["statuses"][0]["durationUntilReset"], "59s");

    // A limit override for a domain no rule defines applies no limit.
    let mut d = descriptor(&[("client", "o")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour as i32,
    });
    let mut unknown = request(vec![d]);
    unknown.domain = "nobody".into();
    for _ in 0..3 {
        let r = client.ask(unknown.clone()).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert!(r.statuses[0].current_limit.is_none());
    }

    // A descriptor with no entries beside a limited one: not limited, not an error.
    let r = client
        .ask(request(vec![
            RateLimitDescriptor::default(),
            descriptor(&[("client", "e")]),
        ]))
        .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 2);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(r.statuses[1].limit_remaining, 2);
    let body = json!({"domain": "shop", "descriptors": [{"entries": []}]});
    let (status, j, _) = h.post("/json", &body).await;
    assert_eq!((status, j["overallCode"].clone()), (200, json!("OK")));
}

#[tokio::test]
async fn quota_mode_refuses_only_when_every_quota_descriptor_does() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let both = || {
        request(vec![
            descriptor(&[("service", "gold")]),
            descriptor(&[("service", "silver")]),
        ])
    };
    let mut answers = Vec::new();
    for _ in 0..3 {
        let r = client.ask(both()).await;
        answers.push(codes(&r));
    }
    // gold allows 1 a minute and silver 2: the second request passes on silver alone, and
    // gold, refused, consumed nothing; the third finds both spent.
    assert_eq!(
        answers,
        [vec![ok, ok, ok], vec![ok, over, ok], vec![over, over, over]]
    );

    // Beside an ordinary limit: every quota descriptor refused refuses the request, and the
    // ordinary limit consumes nothing.
    let mixed = request(vec![
        descriptor(&[("client", "q")]),
        descriptor(&[("service", "gold")]),
    ]);
    let r = client.ask(mixed).await;
    assert_eq!(codes(&r), [over, ok, over]);
    assert_eq!(
        r.statuses[0].limit_remaining, 3,
        "all 3 left, nothing consumed: {r:?}"
    );

    // The same over /json, and /v1/check follows the same verdict.
    let body = json!({"domain": "shop", "descriptors": [
        {"entries": [{"key": "service", "value": "gold"}]},
        {"entries": [{"key": "service", "value": "silver"}]}]});
    let (status, j, _) = h.post("/json", &body).await;
    assert_eq!(status, 429, "{j}");
    let (status, _, _) = h.post("/v1/check", &body).await;
    assert_eq!(status, 429);
    h.clock.advance(Duration::from_secs(60));
    let (status, j, _) = h.post("/json", &body).await;
    assert_eq!(
        (status, j["overallCode"].clone()),
        (200, json!("OK")),
        "{j}"
    );
}

#[tokio::test]
async fn the_service_wide_quota_mode_makes_every_limit_a_quota_limit() {
    let h = Harness::start_with(|o| o.envoy.quota_mode = true).await;
    let mut client = h.grpc().await;
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let one = || one(&[("bot", "evil")]);
    let r = client.ask(one()).await;
    assert_eq!(codes(&r), [over, over], "its only descriptor refused");
    let with_other = request(vec![
        descriptor(&[("bot", "evil")]),
        descriptor(&[("client", "g")]),
    ]);
    let r = client.ask(with_other).await;
    assert_eq!(codes(&r), [ok, over, ok]);
    assert_eq!(r.statuses[1].limit_remaining, 2, "the passing one consumed");
}

#[tokio::test]
async fn dynamic_metadata_carries_the_request_and_the_passed_rules_metadata() {
    let h = Harness::start_with(|o| o.envoy.dynamic_metadata = true).await;
    let mut client = h.grpc().await;
    let mut req = request(vec![
        descriptor(&[("service", "gold")]),
        descriptor(&[("service", "silver")]),
    ]);
    req.hits_addend = 1;
    req.descriptors[1].hits_addend = addend(1);
    let first = client.ask(req.clone()).await;
    let second = client.ask(req).await;
    let json_of = |r: &RateLimitResponse| {
        sluice_server::metadata::struct_json(r.dynamic_metadata.as_ref().expect("metadata"))
    };
    // Both passed: their metadata merge, the first's field kept where both have one.
    assert_eq!(
        json_of(&first),
        json!({
            "domain": "shop",
            "hitsAddend": 1.0,
            "descriptors": [
                {"entries": ["service=gold"]},
                {"entries": ["service=silver"], "hitsAddend": 1.0}
            ],
            "metadata": {"plan": {"name": "gold", "tier": 1.0}, "shared": ["a", 2.0, true]}
        })
    );
    // gold refused (quota mode): only silver's metadata.
    assert_eq!(
        json_of(&second)["metadata"],
        json!({"plan": {"name": "silver"}, "shared": ["a", 2.0, true]})
    );

    // /json carries it too; a refused request's metadata names no rule's.
    let body = json!({"domain": "shop", "descriptors": [
        {"entries": [{"key": "service", "value": "gold"}]}]});
    let (status, j, _) = h.post("/json", &body).await;
    assert_eq!(status, 429);
    assert_eq!(
        j["dynamicMetadata"],
        json!({"domain": "shop", "descriptors": [{"entries": ["service=gold"]}]})
    );

    // Off, there is none.
    let off = Harness::start().await;
    let r = off.grpc().await.ask(one(&[("service", "gold")])).await;
    assert!(r.dynamic_metadata.is_none());
}

#[tokio::test]
async fn value_to_metric_and_detailed_metric_put_request_values_in_the_label() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    for d in [
        descriptor(&[("team", "red"), ("path", "/a")]),
        descriptor(&[("team", "blue"), ("path", "/a")]),
        descriptor(&[("tenant", "acme")]),
        descriptor(&[("client", "plain")]),
    ] {
        client.ask(request(vec![d])).await;
    }
    let text = h.metrics().await;
    for rule in [
        "shop/team=red/path",
        "shop/team=blue/path",
        "shop/tenant=acme",
        "shop/client",
    ] {
        let series =
            format!(r#"sluice_decisions_total{{domain="shop",rule="{rule}",outcome="allowed"}} 1"#);
        assert!(text.contains(&series), "{series} in {text}");
    }
}

#[tokio::test]
async fn envoys_token_quota_flow_checks_with_0_and_reports_usage_past_the_limit() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    // One descriptor with its own hits_addend, as Envoy sends a token quota.
    let hits = |n: u64, user: &str| {
        let mut d = descriptor(&[("tokens", user)]);
        d.hits_addend = addend(n);
        request(vec![d])
    };
    let mut seen = Vec::new();
    for n in [0, 60, 40, 0, 1, 0] {
        let r = client.ask(hits(n, "u")).await;
        seen.push((n, r.statuses[0].code, r.statuses[0].limit_remaining));
    }
    assert_eq!(
        seen,
        [
            (0, ok, 100),
            (60, ok, 40),
            (40, ok, 0),
            // Exactly at the limit a check passes, as count + 0 > limit is false.
            (0, ok, 0),
            // Usage past the limit is counted, and from then on a check is over.
            (1, over, 0),
            (0, over, 0),
        ]
    );
    // An ordinary request on the same counter is refused too.
    let plain = one(&[("tokens", "u")]);
    let r = client.ask(plain).await;
    assert_eq!(r.overall_code, over);

    // A report larger than the whole limit, in a fresh window, over /json: counted, and over.
    h.clock.advance(Duration::from_secs(60));
    let body = |n: u64| {
        json!({"domain": "shop", "descriptors": [
        {"entries": [{"key": "tokens", "value": "u"}], "hits_addend": n}]})
    };
    let (status, j, _) = h.post("/json", &body(0)).await;
    assert_eq!(
        (status, j["statuses"][0]["limitRemaining"].clone()),
        (200, json!(100))
    );
    let (status, _, _) = h.post("/json", &body(150)).await;
    assert_eq!(status, 429);
    let (status, j, _) = h.post("/json", &body(0)).await;
    assert_eq!(
        (status, j["overallCode"].clone()),
        (429, json!("OVER_LIMIT"))
    );
    // An admin reset clears the usage past the limit with the counter.
    let check = json!({"domain": "shop", "cost": 0, "descriptors": [{"entries": [{"key": "tokens", "value": "u"}]}]});
    let (_, c, _) = h.post("/v1/check", &check).await;
    let key = c["descriptors"][0]["limits"][0]["key"].as_str().unwrap();
    let reset = h.delete(&format!("/v1/keys/{}", key_path(key))).await;
    assert_eq!(reset.status().as_u16(), 200);
    let (status, j, _) = h.post("/json", &body(0)).await;
    assert_eq!(
        (status, j["statuses"][0]["limitRemaining"].clone()),
        (200, json!(100))
    );
    h.post("/json", &body(150)).await;

    // A report that goes over refuses its request, and the request's other limits consume
    // nothing; a request-level hits_addend keeps the rule that a refused request consumes
    // nothing.
    let mut mixed = hits(1, "u");
    mixed.descriptors.push(descriptor(&[("client", "m")]));
    let r = client.ask(mixed).await;
    assert_eq!(codes(&r), [over, over, ok]);
    assert_eq!(r.statuses[1].limit_remaining, 3, "not consumed: {r:?}");
    let mut whole = one(&[("tokens", "w")]);
    whole.hits_addend = 150;
    let r = client.ask(whole).await;
    assert_eq!(r.overall_code, over);
    let r = client.ask(hits(0, "w")).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (ok, 100));
}
