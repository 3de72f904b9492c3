//! Token budgets at the gateway, end to end: a fake LLM API on a loopback port (JSON answers
//! with `usage`, and event streams whose last event carries it), `sluice proxy` in front with
//! routes that reserve `max_tokens` and settle with the usage, and a real HTTP client.
//!
//! Nothing here sleeps: the upstream holds its answers until the test releases them, and what
//! happens after an answer is cut waits on a condition with a deadline.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use futures_util::StreamExt;
use serde_json::{Value, json};
use sluice_gateway::GatewayOptions;
use sluice_limiter::{LimitRequest, Limiter, RequestDescriptor};
use sluice_redis::testing::{shared_server, store_at_hour_start};
use sluice_test_support::eventually;
use sluice_testing::{closed_port, header, limiter, limiter_with};
use tokio::sync::Semaphore;

const RULES: &str = r#"
domain: llm
descriptors:
  - key: tenant
    rate_limit: {name: tokens, unit: hour, requests_per_unit: 1000}
  - key: client
    rate_limit: {name: calls, unit: hour, requests_per_unit: 1000}
routes:
  - path: /v1/json
    usage:
      reserve: {from: max_tokens, default: 100, max: 1000}
    descriptors: [[{key: tenant, from: "header:x-tenant"}]]
  - path: /v1/sse
    usage:
      reserve: {from: "$.max_tokens", default: 100}
      settle: {from: usage.total_tokens}
      ttl: 10m
    descriptors: [[{key: tenant, from: "header:x-tenant"}]]
  - path: /v1/small
    usage:
      reserve: {from: max_tokens, default: 10, max_body: 64}
    descriptors: [[{key: tenant, from: "header:x-tenant"}]]
  - path: /v1/plain
    descriptors: [[{key: client, from: "header:x-tenant"}]]
"#;

/// The fake LLM API and what it saw.
#[derive(Clone)]
struct Llm {
    /// Answers asked to wait (`"hold": true`, and every stream after its first chunk) take a
    /// permit first: the test releases them.
    release: Arc<Semaphore>,
    /// Requests that reached the upstream.
    arrived: Arc<AtomicUsize>,
    /// The request bodies, as received.
    bodies: Arc<Mutex<Vec<Bytes>>>,
    /// Streams whose reader went away before they ended.
    dropped: Arc<AtomicUsize>,
}

impl Llm {
    async fn start() -> (Llm, std::net::SocketAddr) {
        let llm = Llm {
            release: Arc::new(Semaphore::new(0)),
            arrived: Arc::default(),
            bodies: Arc::default(),
            dropped: Arc::default(),
        };
        let app = Router::new()
            .route("/v1/json", post(json_answer))
            .route("/v1/small", post(json_answer))
            .route("/v1/plain", post(json_answer))
            .route("/v1/sse", post(event_stream))
            .with_state(llm.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (llm, addr)
    }

    /// Takes in a request: counts it, keeps its body, and reads it as JSON.
    fn arrive(&self, body: &Bytes) -> Value {
        self.bodies.lock().unwrap().push(body.clone());
        self.arrived.fetch_add(1, Ordering::SeqCst);
        serde_json::from_slice(body).unwrap_or(Value::Null)
    }

    async fn wait_for_release(&self) {
        self.release.acquire().await.unwrap().forget();
    }
}

/// `{"use": N}` answers with `usage.total_tokens` N, after a release when `"hold": true`.
async fn json_answer(State(llm): State<Llm>, body: Bytes) -> impl IntoResponse {
    let request = llm.arrive(&body);
    if request["hold"] == json!(true) {
        llm.wait_for_release().await;
    }
    axum::Json(json!({
        "id": "cmpl-1",
        "choices": [{"message": {"content": "Hello"}}],
        "usage": {"prompt_tokens": 1, "total_tokens": request["use"]},
    }))
}

/// Counts the streams dropped before their end; taken empty when a stream ends.
struct DropSignal(Option<Arc<AtomicUsize>>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        if let Some(dropped) = self.0.take() {
            dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// An event stream: a first chunk at once (a content event, and a usage event of `"mid"`
/// tokens if asked), then, once released, by `"end"`: `"usage"` (more content, the usage
/// event of `"use"` tokens, `[DONE]`), `"cut"` (the stream breaks), or `"endless"` (content
/// events until the reader goes away).
async fn event_stream(State(llm): State<Llm>, body: Bytes) -> impl IntoResponse {
    let request = llm.arrive(&body);
    let mut first = String::from("data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n");
    if let Some(mid) = request["mid"].as_u64() {
        first.push_str(&format!(
            "data: {{\"usage\":{{\"total_tokens\":{mid}}}}}\n\n"
        ));
    }
    let end = request["end"].as_str().unwrap_or("usage").to_owned();
    let used = request["use"].as_u64().unwrap_or(0);
    let signal = DropSignal(Some(llm.dropped.clone()));
    let stream =
        futures_util::stream::unfold((0u32, llm, signal), move |(step, llm, mut signal)| {
            let end = end.clone();
            let first = first.clone();
            async move {
                let chunk = match (step, end.as_str()) {
                    (0, _) => first,
                    (1, _) => {
                        llm.wait_for_release().await;
                        match end.as_str() {
                            "cut" => {
                                let cut = std::io::Error::other("the model crashed");
                                return Some((Err(cut), (2, llm, signal)));
                            }
                            "endless" => {
                                "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n"
                                    .to_owned()
                            }
                            _ => format!(
                                "data: {{\"choices\":[{{\"delta\":{{\"content\":\"lo\"}}}}]}}\n\n\
                                 data: {{\"choices\":[],\"usage\":{{\"total_tokens\":{used}}}}}\n\n"
                            ),
                        }
                    }
                    (_, "endless") => {
                        tokio::task::yield_now().await;
                        "data: {\"choices\":[{\"delta\":{\"content\":\"...\"}}]}\n\n".to_owned()
                    }
                    (2, "usage") => "data: [DONE]\n\n".to_owned(),
                    _ => {
                        signal.0.take();
                        return None;
                    }
                };
                let next = if end == "endless" && step >= 1 {
                    2
                } else {
                    step + 1
                };
                Some((
                    Ok::<_, std::io::Error>(Bytes::from(chunk)),
                    (next, llm, signal),
                ))
            }
        });
    (
        [("content-type", "text/event-stream")],
        Body::from_stream(stream),
    )
}

struct Harness {
    gateway: sluice_gateway::Gateway,
    limiter: Arc<Limiter>,
    llm: Llm,
    client: reqwest::Client,
    _rules: tempfile::TempDir,
}

impl Harness {
    /// The gateway on a memory store whose clock stands still.
    async fn start() -> Harness {
        let (limiter, _clock, dir) = limiter(RULES);
        Self::with(limiter, dir).await
    }

    /// The gateway on a real Redis, at the start of an hour, so that refunds land in the
    /// window they were taken from.
    async fn on_redis() -> Harness {
        let store = store_at_hour_start(shared_server()).await;
        let (limiter, dir) = limiter_with(RULES, Arc::new(store));
        Self::with(limiter, dir).await
    }

    async fn with(limiter: Arc<Limiter>, dir: tempfile::TempDir) -> Harness {
        let (llm, upstream) = Llm::start().await;
        Self::forwarding_to(upstream, llm, limiter, dir).await
    }

    async fn forwarding_to(
        upstream: std::net::SocketAddr,
        llm: Llm,
        limiter: Arc<Limiter>,
        dir: tempfile::TempDir,
    ) -> Harness {
        let mut options =
            GatewayOptions::new(Vec::new(), format!("http://{upstream}").parse().unwrap());
        options.listen = "127.0.0.1:0".parse().unwrap();
        let gateway = sluice_gateway::Gateway::start_with_limiter(options, limiter.clone())
            .await
            .unwrap();
        Harness {
            gateway,
            limiter,
            llm,
            client: reqwest::Client::new(),
            _rules: dir,
        }
    }

    fn post(&self, path: &str, tenant: &str, body: &Value) -> reqwest::RequestBuilder {
        self.client
            .post(format!("http://{}{path}", self.gateway.local_addr()))
            .header("x-tenant", tenant)
            .json(body)
    }

    /// What the tenant's token budget has left, by a look that consumes nothing.
    async fn remaining(&self, tenant: &str) -> u64 {
        let look = LimitRequest {
            domain: "llm".into(),
            descriptors: vec![RequestDescriptor {
                entries: vec![("tenant".into(), tenant.into())],
                cost: Some(0),
                limit_override: None,
                envoy_hits: false,
                refund: false,
            }],
            cost: 1,
        };
        self.limiter.decide(&look).await.unwrap().limits[0]
            .decision
            .remaining
    }

    async fn eventually_remaining(&self, tenant: &str, expected: u64, what: &str) {
        eventually(what, || async {
            let left = self.remaining(tenant).await;
            if left == expected {
                Ok(())
            } else {
                Err(format!("{left} left, not {expected}"))
            }
        })
        .await;
    }
}

#[tokio::test]
async fn a_json_answer_settles_its_usage_and_the_rest_is_refunded() {
    let h = Harness::start().await;
    let body = json!({"model": "m", "max_tokens": 300, "use": 120, "messages": ["héllo"]});
    let r = h.post("/v1/json", "acme", &body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // The reservation's fields, as a check's: what was left after reserving 300.
    assert_eq!(
        header(&r, "ratelimit-policy").as_deref(),
        Some("\"tokens\";q=1000;w=3600")
    );
    assert!(header(&r, "ratelimit").unwrap().contains(";r=700;"));
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["usage"]["total_tokens"], 120);
    // Settled before the answer's last bytes were passed on: 1000 - 120.
    assert_eq!(h.remaining("acme").await, 880);
    // The upstream got the very bytes the client sent.
    let sent = serde_json::to_vec(&body).unwrap();
    assert_eq!(h.llm.bodies.lock().unwrap()[0], sent);
}

#[tokio::test]
async fn fifty_concurrent_requests_never_take_more_than_the_budget() {
    fifty_concurrent_requests(Arc::new(Harness::start().await)).await;
}

#[tokio::test]
async fn on_redis_fifty_concurrent_requests_never_take_more_than_the_budget() {
    fifty_concurrent_requests(Arc::new(Harness::on_redis().await)).await;
}

async fn fifty_concurrent_requests(h: Arc<Harness>) {
    // Every request reserves 100 of 1000 and holds it until the upstream is released: exactly
    // ten fit at once, and the other forty are refused whatever the order.
    let tasks: Vec<_> = (0..50u64)
        .map(|i| {
            let h = h.clone();
            tokio::spawn(async move {
                let used = 10 + (i * 37) % 91; // 10 to 100: within the reservation
                let body = json!({"max_tokens": 100, "use": used, "hold": true});
                let r = h.post("/v1/json", "busy", &body).send().await.unwrap();
                let status = r.status().as_u16();
                let _ = r.bytes().await;
                (status, used)
            })
        })
        .collect();
    eventually("ten requests reach the upstream", || async {
        let arrived = h.llm.arrived.load(Ordering::SeqCst);
        if arrived == 10 {
            Ok(())
        } else {
            Err(format!("{arrived} arrived"))
        }
    })
    .await;
    assert_eq!(h.remaining("busy").await, 0, "ten reservations of 100");
    h.llm.release.add_permits(10);
    let mut admitted_usage = 0;
    let mut statuses = std::collections::BTreeMap::new();
    for t in tasks {
        let (status, used) = t.await.unwrap();
        *statuses.entry(status).or_insert(0) += 1;
        if status == 200 {
            admitted_usage += used;
        }
    }
    assert_eq!(statuses, [(200, 10), (429, 40)].into_iter().collect());
    assert_eq!(
        h.llm.arrived.load(Ordering::SeqCst),
        10,
        "no refused request was forwarded"
    );
    assert!(admitted_usage <= 1000, "admitted {admitted_usage} of 1000");
    // Every unused unit came back.
    assert_eq!(h.remaining("busy").await, 1000 - admitted_usage);
}

#[tokio::test]
async fn a_request_that_fits_only_after_a_refund_passes_then() {
    let h = Harness::start().await;
    let hold = json!({"max_tokens": 900, "use": 50, "hold": true});
    let held = {
        let request = h.post("/v1/json", "refund", &hold);
        tokio::spawn(async move { request.send().await.unwrap().bytes().await.unwrap() })
    };
    eventually("the first request reaches the upstream", || async {
        h.llm.arrived.load(Ordering::SeqCst) == 1
    })
    .await;
    // 900 of 1000 reserved: 500 does not fit, and the refusal is the gateway's 429.
    let r = h
        .post("/v1/json", "refund", &json!({"max_tokens": 500, "use": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(
        header(&r, "content-type").as_deref(),
        Some("application/problem+json")
    );
    assert!(
        header(&r, "ratelimit")
            .unwrap()
            .starts_with("\"tokens\";r=100;t=")
    );
    assert!(header(&r, "retry-after").is_some());
    h.llm.release.add_permits(1);
    held.await.unwrap();
    // 850 came back: now it fits.
    let r = h
        .post("/v1/json", "refund", &json!({"max_tokens": 500, "use": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    assert_eq!(h.remaining("refund").await, 1000 - 50 - 1);
}

#[tokio::test]
async fn usage_beyond_the_reservation_is_charged() {
    let h = Harness::start().await;
    let r = h
        .post("/v1/json", "over", &json!({"max_tokens": 100, "use": 700}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    assert_eq!(h.remaining("over").await, 300, "700 charged, not 100");
    let r = h
        .post("/v1/json", "over", &json!({"max_tokens": 301, "use": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    // A request without the field reserves the route's default, 100.
    let r = h
        .post("/v1/json", "over", &json!({"use": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    assert_eq!(h.remaining("over").await, 200);
}

#[tokio::test]
async fn the_first_event_reaches_the_client_before_the_upstream_sends_the_rest() {
    first_event_first(Harness::start().await).await;
}

#[tokio::test]
async fn on_redis_the_stream_settles_at_its_last_usage_event() {
    first_event_first(Harness::on_redis().await).await;
}

async fn first_event_first(h: Harness) {
    let r = h
        .post("/v1/sse", "stream", &json!({"max_tokens": 200, "use": 42}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "content-type").as_deref(),
        Some("text/event-stream")
    );
    let mut body = r.bytes_stream();
    // The upstream holds everything after its first chunk until released: this chunk came
    // through while the rest did not exist yet.
    // A gateway that held the stream back would wait here for ever: bounded, to fail instead.
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), body.next())
        .await
        .expect("the first event did not come through while the upstream held the rest")
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&first).contains("\"content\":\"Hel\""),
        "{first:?}"
    );
    assert_eq!(h.remaining("stream").await, 800, "200 reserved meanwhile");
    h.llm.release.add_permits(1);
    let mut rest = Vec::new();
    while let Some(chunk) = body.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    let rest = String::from_utf8(rest).unwrap();
    assert!(rest.contains("\"total_tokens\":42") && rest.ends_with("data: [DONE]\n\n"));
    // Settled at the last usage event before the stream's end reached the client.
    assert_eq!(h.remaining("stream").await, 1000 - 42);
}

#[tokio::test]
async fn a_stream_cut_mid_way_settles_at_least_the_reservation() {
    let h = Harness::start().await;
    for (tenant, mid, settled) in [("cut-a", 5, 200), ("cut-b", 350, 350)] {
        let body = json!({"max_tokens": 200, "mid": mid, "end": "cut"});
        let r = h.post("/v1/sse", tenant, &body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let mut stream = r.bytes_stream();
        let first = stream.next().await.unwrap().unwrap();
        assert!(String::from_utf8_lossy(&first).contains("total_tokens"));
        h.llm.release.add_permits(1);
        let mut broken = false;
        while let Some(chunk) = stream.next().await {
            broken |= chunk.is_err();
        }
        assert!(broken, "the client sees the cut, not a clean end");
        // The upstream may have used everything reserved, or more than it said before the cut.
        h.eventually_remaining(
            tenant,
            1000 - settled,
            &format!("the cut stream of {tenant} settles at {settled}"),
        )
        .await;
    }
}

#[tokio::test]
async fn a_client_that_leaves_mid_stream_settles_and_the_upstream_is_let_go() {
    let h = Harness::start().await;
    let body = json!({"max_tokens": 200, "mid": 350, "end": "endless"});
    let r = h.post("/v1/sse", "gone", &body).send().await.unwrap();
    let mut stream = r.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("\"total_tokens\":350"));
    assert_eq!(h.remaining("gone").await, 800);
    drop(stream);
    // The upstream goes on talking; the gateway, writing to a client that left, stops.
    h.llm.release.add_permits(1);
    eventually("the gateway lets the upstream's stream go", || async {
        h.llm.dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    h.eventually_remaining(
        "gone",
        1000 - 350,
        "the reservation settles at the last usage seen",
    )
    .await;
}

#[tokio::test]
async fn request_bodies_are_bounded_and_routes_without_usage_count_requests() {
    let h = Harness::start().await;
    let small = json!({"max_tokens": 7, "use": 3});
    let r = h.post("/v1/small", "small", &small).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    assert_eq!(h.remaining("small").await, 997);
    // Larger than the route's `max_body` of 64 bytes: refused before anything is reserved.
    let big = json!({"max_tokens": 7, "use": 3, "padding": "x".repeat(100)});
    let r = h.post("/v1/small", "small", &big).send().await.unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(h.remaining("small").await, 997);
    assert_eq!(h.llm.arrived.load(Ordering::SeqCst), 1);
    // A chunked body that grows past the bound is refused as well.
    let chunks = futures_util::stream::iter(
        ["{\"max_tokens\": 7, \"pad\": \"", &"y".repeat(100), "\"}"]
            .map(|s| Ok::<_, std::io::Error>(Bytes::from(s.to_owned()))),
    );
    let r = h
        .client
        .post(format!("http://{}/v1/small", h.gateway.local_addr()))
        .header("x-tenant", "small")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    // A route without `usage` checks one per request, as it always did.
    let r = h
        .post(
            "/v1/plain",
            "plain",
            &json!({"max_tokens": 500, "use": 400}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        header(&r, "ratelimit")
            .unwrap()
            .starts_with("\"calls\";r=999;")
    );
}

#[tokio::test]
async fn an_upstream_that_cannot_be_reached_used_nothing() {
    let (limiter, _clock, dir) = limiter(RULES);
    let (llm, _) = Llm::start().await;
    let h = Harness::forwarding_to(closed_port().await, llm, limiter, dir).await;
    let r = h
        .post("/v1/json", "down", &json!({"max_tokens": 300}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    // Settled at 0 before the answer: the upstream never saw the request.
    assert_eq!(h.remaining("down").await, 1000);
}
