//! The HTTP API: Envoy's `/json`, the native `/v1/check` with its decisions and header fields,
//! problems that name the bad field, health, readiness and metrics.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{Harness, json_one};

#[tokio::test]
async fn json_endpoint_speaks_envoys_json() {
    let h = Harness::start().await;
    let body = json!({"domain": "shop", "descriptors": [{"entries": [{"key": "client", "value": "j"}]}], "hits_addend": 3});
    let (status, r, _) = h.post("/json", &body).await;
    assert_eq!(status, 200);
    assert_eq!(r["overallCode"], "OK");
    assert_eq!(r["statuses"][0]["code"], "OK");
    assert_eq!(
        r["statuses"][0]["currentLimit"],
        json!({"requestsPerUnit": 3, "unit": "MINUTE"})
    );
    assert_eq!(r["statuses"][0]["durationUntilReset"], "60s");
    assert!(
        r["statuses"][0].get("limitRemaining").is_none(),
        "zero is omitted, as protobuf JSON does"
    );
    let (status, r, _) = h.post("/json", &body).await;
    assert_eq!(status, 429);
    assert_eq!(r["overallCode"], "OVER_LIMIT");
}

#[tokio::test]
async fn native_check_returns_decisions_and_headers() {
    let h = Harness::start().await;
    let body = json_one("user", "n");
    for _ in 0..2 {
        let (status, _, _) = h.post("/v1/check", &body).await;
        assert_eq!(status, 200);
    }
    let (status, r, headers) = h.post("/v1/check", &body).await;
    assert_eq!(status, 429);
    assert_eq!(r["allowed"], false);
    let limits = &r["descriptors"][0]["limits"];
    assert_eq!(limits[0]["name"], "burst");
    assert_eq!(limits[0]["allowed"], false);
    assert_eq!(limits[0]["retry_after"], 0.5);
    assert_eq!(limits[1]["name"], "daily");
    assert_eq!(
        limits[1]["remaining"], 3,
        "the burst refusal did not burn the daily quota"
    );
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(
        headers["ratelimit"],
        r#""burst";r=0;t=1, "daily";r=3;t=86400"#
    );
    // A cost of its own per descriptor.
    h.clock.advance(Duration::from_secs(1));
    let body = json!({"domain": "shop", "descriptors": [{"entries": [{"key": "user", "value": "n"}], "cost": 2}]});
    let (_, r, _) = h.post("/v1/check", &body).await;
    assert_eq!(r["descriptors"][0]["limits"][1]["remaining"], 1);
}

/// A token bucket of 20 a second with a burst of 40 is shown as both numbers, never as "40 per
/// second": `RateLimit-Policy` advertises the 40 over the 2 s the rate takes to grant them,
/// `/json` (Envoy's message, which has no burst) the rate, and `/v1/check` and `/v1/rules`
/// describe it whole.
#[tokio::test]
async fn a_bucket_shows_its_rate_and_its_burst_as_what_they_are() {
    let h = Harness::start().await;
    let body = json_one("spender", "s");
    let (status, r, headers) = h.post("/v1/check", &body).await;
    assert_eq!(status, 200);
    assert_eq!(headers["ratelimit-policy"], r#""refill";q=40;w=2"#);
    let limit = &r["descriptors"][0]["limits"][0];
    assert_eq!(limit["description"], "20 per second, burst 40");
    assert_eq!(
        (&limit["limit"], &limit["window"]),
        (&json!(40), &json!(2.0))
    );
    assert_eq!(limit["remaining"], 39);
    let (_, r, _) = h.post("/json", &body).await;
    assert_eq!(
        r["statuses"][0]["currentLimit"],
        json!({"name": "refill", "requestsPerUnit": 20, "unit": "SECOND"})
    );
    let rules: Value = h.get("/v1/rules").await.json().await.unwrap();
    let spender = rules["domains"][0]["descriptors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["key"] == "spender")
        .unwrap();
    assert_eq!(
        spender["limits"][0]["description"],
        "20 per second, burst 40"
    );
}

#[tokio::test]
async fn bad_http_input_gets_a_problem_naming_the_field() {
    let h = Harness::start().await;
    let cases = [
        (json!({"domain": 7, "descriptors": []}), 400, "domain"),
        (
            json!({"domain": "shop", "descriptors": [{"entries": [{"key": "a", "value": 1}]}]}),
            400,
            "descriptors[0].entries[0].value",
        ),
        (json!({"domain": "shop"}), 400, ""),
        (
            json!({"domain": "shop", "descriptors": [{"entries": [{"key": "a"}], "limit": {"requests_per_unit": 1, "unit": "fortnight"}}]}),
            400,
            "descriptors[0].limit.unit",
        ),
    ];
    for (body, status, field) in cases {
        for path in ["/json", "/v1/check"] {
            let r = h.post_json(path, &body).await;
            assert_eq!(r.status().as_u16(), status, "{path} {body}");
            assert_eq!(r.headers()["content-type"], "application/problem+json");
            let problem: Value = r.json().await.unwrap();
            assert!(!problem["detail"].as_str().unwrap().is_empty());
            if !field.is_empty() {
                assert_eq!(problem["field"], field, "{problem}");
            }
        }
    }
    let r = h.post_body("/json", "{not json").await;
    assert_eq!(r.status().as_u16(), 400);
    // A valid request followed by anything else is not a valid body.
    let r = h
        .post_body("/json", r#"{"domain": "shop", "descriptors": []} {"#)
        .await;
    assert_eq!(r.status().as_u16(), 400);
    let problem: Value = r.json().await.unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("trailing"),
        "{problem}"
    );
    // A string that is not UTF-8 (a lone continuation byte in the value).
    for path in ["/json", "/v1/check"] {
        let mut body =
            br#"{"domain": "shop", "descriptors": [{"entries": [{"key": "a", "value": "x"#.to_vec();
        body.extend_from_slice(b"\x80\"}]}]}");
        let r = h.post_body(path, body).await;
        assert_eq!(r.status().as_u16(), 400, "{path}");
        let problem: Value = r.json().await.unwrap();
        assert!(
            problem["detail"].as_str().unwrap().contains("not UTF-8"),
            "{path} {problem}"
        );
    }
    let r = h.post_body("/json", vec![b' '; 100_000]).await;
    assert_eq!(r.status().as_u16(), 413);
    let r = h.get("/nope").await;
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let h = Harness::start().await;
    for path in ["/healthz", "/readyz"] {
        let r = h.get(path).await;
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    let body = json_one("bot", "evil");
    h.post("/json", &body).await;
    let text = h.metrics().await;
    assert!(
        text.contains(
            r#"sluice_decisions_total{domain="shop",rule="shop/bot=evil",outcome="limited"} 1"#
        ),
        "{text}"
    );
    assert!(text.contains("sluice_decision_latency_seconds_count 1"));
    assert!(text.contains("sluice_tracked_keys"));
    assert!(text.contains("sluice_rule_reloads_total 0"));
    assert!(text.contains("sluice_rule_reload_failures_total 0"));
    assert!(text.contains(r#"sluice_build_info{version="#));
    // Limited counters are listed by a hash: their keys hold request values.
    assert!(
        text.contains(r#"sluice_top_limited_keys{key_hash=""#),
        "{text}"
    );
    assert!(
        !text.contains("bot=evil}:"),
        "a counter key in /metrics: {text}"
    );
}

/// A misspelt field or a descriptor without entries would otherwise be a request no limit
/// applies to, answered "allowed" without a word: both are refused, naming the field.
#[tokio::test]
async fn unknown_fields_and_descriptors_without_entries_are_refused() {
    let h = Harness::start().await;
    let cases = [
        (
            json!({"domain": "shop", "descriptors": [{"key": "user", "value": "alice"}]}),
            "descriptors[0].key",
            "unknown field `key`",
        ),
        (
            json!({"domain": "shop", "descriptor": [{"entries": [{"key": "user", "value": "a"}]}]}),
            "descriptor",
            "unknown field `descriptor`",
        ),
        (
            json!({"domain": "shop", "descriptors": [{"entries": [{"key": "user", "valeu": "a"}]}]}),
            "descriptors[0].entries[0].valeu",
            "unknown field `valeu`",
        ),
        (
            json!({"domain": "shop", "descriptors": [{"entries": [{"key": "user", "value": "a"}], "limit": {"requests_per_unit": 1, "unit": "SECOND", "per": 1}}]}),
            "descriptors[0].limit.per",
            "unknown field `per`",
        ),
        (
            json!({"domain": "shop", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}, {"hits_addend": 1}]}),
            "descriptors[1].entries",
            "entries",
        ),
    ];
    for (body, field, detail) in cases {
        for path in ["/json", "/v1/check"] {
            let r = h.post_json(path, &body).await;
            assert_eq!(r.status().as_u16(), 400, "{path} {body}");
            assert_eq!(r.headers()["content-type"], "application/problem+json");
            let problem: Value = r.json().await.unwrap();
            assert_eq!(problem["field"], field, "{path} {problem}");
            assert!(
                problem["detail"].as_str().unwrap().contains(detail),
                "{path} {problem}"
            );
        }
    }
}

/// Every field of Envoy's `RateLimitRequest`, under both names protobuf's JSON reads, is still
/// accepted.
#[tokio::test]
async fn every_field_of_envoys_request_is_still_accepted() {
    let h = Harness::start().await;
    let entries = json!([{"key": "client", "value": "every"}]);
    let bodies = [
        json!({"domain": "shop", "hits_addend": 1, "descriptors": [{"entries": entries,
            "limit": {"requests_per_unit": 9, "unit": "MINUTE"}, "hits_addend": 1,
            "is_negative_hits": false}]}),
        json!({"domain": "shop", "hitsAddend": 1, "descriptors": [{"entries": entries,
            "limit": {"requestsPerUnit": 9, "unit": 4}, "hitsAddend": "1",
            "isNegativeHits": false}]}),
        json!({"domain": "shop", "descriptors": [{"entries": [], "cost": 1}], "cost": 1}),
    ];
    for body in bodies {
        for path in ["/json", "/v1/check"] {
            let (status, r, _) = h.post(path, &body).await;
            assert_eq!(status, 200, "{path} {body} {r}");
        }
    }
}
