//! Runtime overrides through the admin API on the memory store: set, listed, shown in the
//! rules, the metrics and `/readyz`, removed; bad input refused with its reason and nothing
//! stored.

use serde_json::{Value, json};

use crate::harness::{Harness, json_one};

/// `method path` with `body` as JSON: the status and the answer's JSON.
async fn call(h: &Harness, method: reqwest::Method, path: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .request(method, h.url(path))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The limit `/v1/check` reports for `tenant`.
async fn limit(h: &Harness, tenant: &str) -> u64 {
    let (_, r, _) = h.post("/v1/check", &json_one("tenant", tenant)).await;
    r["descriptors"][0]["limits"][0]["limit"].as_u64().unwrap()
}

fn acme(rate_limit: Value) -> Value {
    json!({"descriptor": [{"key": "tenant", "value": "acme"}], "rate_limit": rate_limit})
}

#[tokio::test]
async fn an_override_is_set_shown_and_removed_through_the_admin_api() {
    let h = Harness::start().await;
    assert_eq!(limit(&h, "acme").await, 10);
    let (status, set) = call(
        &h,
        reqwest::Method::PUT,
        "/v1/overrides/shop",
        &acme(json!({"unit": "minute", "requests_per_unit": 3})),
    )
    .await;
    assert_eq!(status, 200, "{set}");
    assert_eq!(set["before"], Value::Null);
    assert_eq!(set["after"]["status"], "applied");
    assert!(
        set["scope"]
            .as_str()
            .unwrap()
            .starts_with("local to this instance")
    );
    assert_eq!(limit(&h, "acme").await, 3);
    assert_eq!(limit(&h, "beta").await, 10);

    let listed: Value = h.get("/v1/overrides/shop").await.json().await.unwrap();
    let one = &listed["overrides"][0];
    assert_eq!(one["set_by"], "127.0.0.1 (loopback)");
    assert_eq!(one["rate_limit"]["requests_per_unit"], 3);
    assert!(one["set_at"].as_str().unwrap().ends_with('Z'));
    let rules: Value = h.get("/v1/rules").await.json().await.unwrap();
    let tenant = rules["domains"][0]["descriptors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["key"] == "tenant")
        .unwrap();
    assert_eq!(
        tenant["limits"][0]["overrides"][0]["descriptor"][0]["value"],
        "acme"
    );
    let ready = h.get("/readyz").await.text().await.unwrap();
    assert!(
        ready.starts_with("ready\noverrides: 1 set, local to this instance"),
        "{ready}"
    );
    assert!(
        h.metrics()
            .await
            .contains("sluice_overrides{domain=\"shop\"} 1")
    );

    // Replaced: the answer shows before and after.
    let (_, again) = call(
        &h,
        reqwest::Method::PUT,
        "/v1/overrides/shop",
        &acme(json!({"unit": "minute", "requests_per_unit": 4})),
    )
    .await;
    assert_eq!(again["before"]["rate_limit"]["requests_per_unit"], 3);
    assert_eq!(again["after"]["rate_limit"]["requests_per_unit"], 4);

    let descriptor = json!({"descriptor": [{"key": "tenant", "value": "acme"}]});
    let (status, removed) = call(
        &h,
        reqwest::Method::DELETE,
        "/v1/overrides/shop",
        &descriptor,
    )
    .await;
    assert_eq!(status, 200, "{removed}");
    assert_eq!(removed["removed"]["rate_limit"]["requests_per_unit"], 4);
    assert_eq!(limit(&h, "acme").await, 10);
    let (status, _) = call(
        &h,
        reqwest::Method::DELETE,
        "/v1/overrides/shop",
        &descriptor,
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(h.get("/readyz").await.text().await.unwrap(), "ready");
}

#[tokio::test]
async fn bad_overrides_are_refused_with_the_reason_and_nothing_is_stored() {
    let h = Harness::start().await;
    let minute = json!({"unit": "minute", "requests_per_unit": 3});
    let cases = [
        (
            "/v1/overrides/shop",
            {
                let mut b = acme(minute.clone());
                b["expiry"] = json!("2030-01-01T00:00:00Z");
                b
            },
            "unknown field `expiry`",
        ),
        (
            "/v1/overrides/nowhere",
            acme(minute.clone()),
            "unknown domain `nowhere`",
        ),
        (
            "/v1/overrides/shop",
            acme(json!({"unit": "fortnight", "requests_per_unit": 3})),
            "rate_limit: unknown unit `fortnight`",
        ),
        (
            "/v1/overrides/shop",
            acme(json!({"unit": "minute", "requests_per_unit": -1})),
            "rate_limit: `requests_per_unit`",
        ),
        (
            "/v1/overrides/shop",
            {
                let mut b = acme(minute.clone());
                b["expires"] = json!("2001-01-01T00:00:00Z");
                b
            },
            "in the past",
        ),
        (
            "/v1/overrides/shop",
            json!({"descriptor": "tenant=acme", "rate_limit": minute.clone()}),
            "invalid JSON",
        ),
        (
            "/v1/overrides/shop",
            json!({"descriptor": [{"key": "nope", "value": "x"}], "rate_limit": minute.clone()}),
            "matches no rule of domain `shop`",
        ),
        (
            "/v1/overrides/shop",
            json!({"descriptor": [{"key": "health", "value": "x"}], "rate_limit": minute.clone()}),
            "`unlimited` rule",
        ),
    ];
    for (path, body, reason) in cases {
        let (status, problem) = call(&h, reqwest::Method::PUT, path, &body).await;
        assert_eq!(status, 400, "{body}: {problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(reason), "{body}: {detail}");
    }
    let listed: Value = h.get("/v1/overrides/shop").await.json().await.unwrap();
    assert_eq!(listed["overrides"], json!([]));
    assert_eq!(h.get("/v1/overrides/nowhere").await.status().as_u16(), 400);
    assert_eq!(limit(&h, "acme").await, 10);
}
