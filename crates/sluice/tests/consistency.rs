//! One engine, five front ends: the same requests sent through gRPC (`--grpc-headers both`),
//! `/json`, `/v1/check` (`--http-headers both`), the gateway and the tower layer get the same
//! decisions, the same chosen limit per descriptor and the same rate-limit fields. A shadow
//! limit over its limit never shows in any field.
//!
//! Every front end runs on its own memory store, on a fake clock stopped at the same instant, so
//! every count and every reset is exact.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};
use sluice_core::{FakeClock, MemoryStore, Timestamp};
use sluice_gateway::{Gateway, GatewayOptions};
use sluice_http::{PeerAddr, SharedLimitLayer};
use sluice_limiter::HeaderStyle;
use sluice_server::{ServeOptions, Server};
use tower::ServiceExt;

const RULES: &str = r#"
domain: same
descriptors:
  - key: user
    limits:
      - {name: per_user_burst, requests_per_unit: 2, unit: minute}
      - {name: per_user_hour, requests_per_unit: 3, unit: hour}
  - key: dark
    shadow_mode: true
    rate_limit: {name: dark_launch, requests_per_unit: 1, unit: minute}
  - key: soft
    action: {soft: {header: X-Quota-Warning}}
    rate_limit: {name: soft_warn, requests_per_unit: 1, unit: minute}
  - key: spam
    action: {fake: {status: 200, content_type: text/plain, body: "thanks"}}
    rate_limit: {name: spam_trap, requests_per_unit: 1, unit: minute}
  - key: export
    action: {delay: {max_wait: 1ms}}
    rate_limit: {name: export_queue, requests_per_unit: 1, unit: minute}
routes:
  - path: /r/{user}
    headers: both
    descriptors:
      - [{key: user, from: "param:user"}]
      - [{key: dark, value: d}]
      - [{key: soft, value: s}]
  - path: /spam
    headers: both
    descriptors: [[{key: spam, value: x}]]
  - path: /export
    headers: both
    descriptors: [[{key: export, value: x}]]
"#;

/// A whole minute, so clock-aligned windows report their full length.
const START: u64 = 1_700_000_040;

/// The rate-limit fields every front end reports, by lower-case name.
const FIELDS: [&str; 6] = [
    "ratelimit-policy",
    "ratelimit",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "retry-after",
];

/// One request: the gateway path, and the same descriptors as entries.
struct Step {
    path: &'static str,
    descriptors: Vec<Vec<(&'static str, &'static str)>>,
    /// A `fake` refusal looks like any other answer through the gateway: no fields.
    fake: bool,
}

fn steps() -> Vec<Step> {
    let r = || Step {
        path: "/r/alice",
        descriptors: vec![
            vec![("user", "alice")],
            vec![("dark", "d")],
            vec![("soft", "s")],
        ],
        fake: false,
    };
    let spam = |fake| Step {
        path: "/spam",
        descriptors: vec![vec![("spam", "x")]],
        fake,
    };
    let export = || Step {
        path: "/export",
        descriptors: vec![vec![("export", "x")]],
        fake: false,
    };
    vec![r(), r(), r(), spam(false), spam(true), export(), export()]
}

/// What a front end answered to one step.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    allowed: bool,
    /// The limit each descriptor's status describes, where the front end reports it.
    chosen: Option<Vec<Option<String>>>,
    /// The rate-limit fields, where the front end sends them.
    fields: Option<BTreeMap<String, String>>,
}

fn fields<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> BTreeMap<String, String> {
    pairs
        .filter(|(k, _)| FIELDS.contains(&k.to_ascii_lowercase().as_str()))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
        .collect()
}

fn http_fields(headers: &http::HeaderMap) -> BTreeMap<String, String> {
    fields(
        headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap())),
    )
}

fn clock_store() -> Arc<MemoryStore<FakeClock>> {
    Arc::new(
        MemoryStore::builder()
            .clock(FakeClock::at(Timestamp::from_secs(START)))
            .build(),
    )
}

async fn service() -> (Server, tempfile::TempDir) {
    let (path, dir) = sluice_test_support::rules_file("rules.yaml", RULES);
    let mut options = ServeOptions::new(vec![path]);
    options.http_addr = "127.0.0.1:0".parse().unwrap();
    options.grpc_addr = "127.0.0.1:0".parse().unwrap();
    options.http_headers = HeaderStyle::Both;
    options.grpc_headers = HeaderStyle::Both;
    (
        Server::start_with_store(options, clock_store())
            .await
            .unwrap(),
        dir,
    )
}

async fn through_grpc() -> Vec<Answer> {
    let (server, _dir) = service().await;
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr()))
        .await
        .unwrap();
    let mut answers = Vec::new();
    for step in steps() {
        let request = RateLimitRequest {
            domain: "same".into(),
            descriptors: step
                .descriptors
                .iter()
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .iter()
                        .map(|(k, v)| Entry {
                            key: (*k).into(),
                            value: (*v).into(),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        };
        let r = client
            .should_rate_limit(request)
            .await
            .unwrap()
            .into_inner();
        answers.push(Answer {
            allowed: r.overall_code == Code::Ok as i32,
            chosen: Some(
                r.statuses
                    .iter()
                    .map(|s| s.current_limit.as_ref().map(|l| l.name.clone()))
                    .collect(),
            ),
            fields: Some(fields(
                r.response_headers_to_add
                    .iter()
                    .map(|h| (h.key.as_str(), h.value.as_str())),
            )),
        });
    }
    server.shutdown().await;
    answers
}

fn json_request(step: &Step) -> Value {
    let descriptors: Vec<Value> = step
        .descriptors
        .iter()
        .map(|entries| {
            let entries: Vec<Value> = entries
                .iter()
                .map(|(k, v)| json!({"key": k, "value": v}))
                .collect();
            json!({ "entries": entries })
        })
        .collect();
    json!({"domain": "same", "descriptors": descriptors})
}

async fn through_json() -> Vec<Answer> {
    let (server, _dir) = service().await;
    let client = sluice_testing::long_lived_client();
    let mut answers = Vec::new();
    for step in steps() {
        let r = client
            .post(format!("http://{}/json", server.http_addr()))
            .json(&json_request(&step))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap();
        let chosen = body["statuses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["currentLimit"]["name"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(status == 200, body["overallCode"] == "OK", "{body}");
        answers.push(Answer {
            allowed: body["overallCode"] == "OK",
            chosen: Some(chosen),
            fields: None,
        });
    }
    server.shutdown().await;
    answers
}

async fn through_check() -> Vec<Answer> {
    let (server, _dir) = service().await;
    let client = sluice_testing::long_lived_client();
    let mut answers = Vec::new();
    for step in steps() {
        let r = client
            .post(format!("http://{}/v1/check", server.http_addr()))
            .json(&json_request(&step))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let headers = http_fields(r.headers());
        let body: Value = r.json().await.unwrap();
        let chosen = body["descriptors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["tightest"].as_str().map(str::to_owned))
            .collect();
        // The body repeats the fields it sets.
        let in_body = fields(
            body["headers"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str().unwrap())),
        );
        assert_eq!(headers, in_body);
        assert_eq!(status == 200, body["allowed"] == true, "{body}");
        answers.push(Answer {
            allowed: body["allowed"] == true,
            chosen: Some(chosen),
            fields: Some(headers),
        });
    }
    server.shutdown().await;
    answers
}

/// A gateway answer: a 429, or a 200 from the upstream, or a 200 canned by a `fake` rule.
fn gateway_answer(step: &Step, status: u16, body: &str, headers: &http::HeaderMap) -> Answer {
    let fields = http_fields(headers);
    if step.fake && body == "thanks" {
        assert!(
            fields.is_empty(),
            "a fake answer carries no fields: {fields:?}"
        );
        return Answer {
            allowed: false,
            chosen: None,
            fields: None,
        };
    }
    Answer {
        allowed: status == 200,
        chosen: None,
        fields: Some(fields),
    }
}

async fn through_gateway() -> Vec<Answer> {
    let upstream = sluice_testing::upstream().await;
    let (limiter, _clock, _dir) = sluice_testing::limiter(RULES);
    let options = GatewayOptions::new(
        Vec::new(),
        format!("http://{}", upstream.addr).parse().unwrap(),
    );
    let mut options = options;
    options.listen = "127.0.0.1:0".parse().unwrap();
    let gateway = Gateway::start_with_limiter(options, limiter).await.unwrap();
    let client = sluice_testing::long_lived_client();
    let mut answers = Vec::new();
    for step in steps() {
        let r = client
            .get(format!("http://{}{}", gateway.local_addr(), step.path))
            .send()
            .await
            .unwrap();
        let (status, headers) = (r.status().as_u16(), r.headers().clone());
        let body = r.text().await.unwrap();
        answers.push(gateway_answer(&step, status, &body, &headers));
    }
    gateway.shutdown().await;
    answers
}

async fn through_layer() -> Vec<Answer> {
    let (limiter, _clock, _dir) = sluice_testing::limiter(RULES);
    let app = axum::Router::new()
        .fallback(|| async { "from the app" })
        .layer(SharedLimitLayer::new(limiter));
    let mut answers = Vec::new();
    for step in steps() {
        let mut request = http::Request::get(step.path)
            .body(axum::body::Body::empty())
            .unwrap();
        request
            .extensions_mut()
            .insert(PeerAddr("127.0.0.1:5000".parse().unwrap()));
        let r = app.clone().oneshot(request).await.unwrap();
        let (parts, body) = r.into_parts();
        let body = axum::body::to_bytes(body, 1 << 16).await.unwrap();
        let body = String::from_utf8_lossy(&body).into_owned();
        answers.push(gateway_answer(
            &step,
            parts.status.as_u16(),
            &body,
            &parts.headers,
        ));
    }
    answers
}

#[tokio::test]
async fn every_front_end_gives_the_same_decisions_limits_and_fields() {
    let grpc = through_grpc().await;
    let json = through_json().await;
    let check = through_check().await;
    let gateway = through_gateway().await;
    let layer = through_layer().await;

    // What the engine decided, stated once, so that five front ends agreeing on a wrong answer
    // still fail.
    let allowed: Vec<bool> = grpc.iter().map(|a| a.allowed).collect();
    assert_eq!(allowed, [true, true, false, true, false, true, false]);
    let chosen = |i: usize| grpc[i].chosen.clone().unwrap();
    let some = |names: &[&str]| -> Vec<Option<String>> {
        names.iter().map(|n| Some((*n).to_owned())).collect()
    };
    // The refusing burst limit is the tightest of the user's two limits, ahead of the soft
    // limit's denial; a descriptor with only a shadow limit reports it, as Envoy does.
    assert_eq!(
        chosen(2),
        some(&["per_user_burst", "dark_launch", "soft_warn"])
    );
    assert_eq!(chosen(4), some(&["spam_trap"]));
    let third = grpc[2].fields.clone().unwrap();
    assert_eq!(
        third["ratelimit-policy"],
        r#""per_user_burst";q=2;w=60, "per_user_hour";q=3;w=3600, "soft_warn";q=1;w=60"#
    );
    assert_eq!(third["x-ratelimit-limit"], "2");
    assert_eq!(third["x-ratelimit-remaining"], "0");
    assert_eq!(third["retry-after"], "60");
    // On the second request the soft limit is over and the tightest shown, but it refuses
    // nothing: no Retry-After.
    let second = grpc[1].fields.clone().unwrap();
    assert_eq!(second["x-ratelimit-limit"], "1");
    assert!(!second.contains_key("retry-after"), "{second:?}");

    for (name, answers) in [
        ("/json", &json),
        ("/v1/check", &check),
        ("gateway", &gateway),
        ("tower layer", &layer),
    ] {
        for (i, (theirs, ours)) in answers.iter().zip(&grpc).enumerate() {
            assert_eq!(theirs.allowed, ours.allowed, "{name}, request {i}");
            if let Some(chosen) = &theirs.chosen {
                assert_eq!(Some(chosen), ours.chosen.as_ref(), "{name}, request {i}");
            }
            if let Some(fields) = &theirs.fields {
                let mut expected = ours.fields.clone().unwrap();
                // A request that passes has no Retry-After anywhere.
                if ours.allowed {
                    expected.remove("retry-after");
                }
                assert_eq!(fields, &expected, "{name}, request {i}");
            }
        }
        assert_eq!(answers.len(), grpc.len(), "{name}");
    }
    // The gateway and the layer hid the fake refusal; the others told it.
    assert!(gateway[4].fields.is_none() && layer[4].fields.is_none());

    // The shadow limit, over its limit from the second request on, shows in no field.
    for answers in [&grpc, &check, &gateway, &layer] {
        for a in answers.iter() {
            for value in a.fields.iter().flat_map(|f| f.values()) {
                assert!(!value.contains("dark_launch"), "{value}");
            }
        }
    }
}
