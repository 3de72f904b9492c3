//! `sluice proxy` end to end: a real upstream (axum on a loopback port), the gateway in front
//! of it, and a real HTTP client.

use std::time::Duration;

use sluice_gateway::GatewayOptions;
use sluice_limiter::{Limiter, Outcome};
use sluice_testing::{BIG, closed_port, header, limiter, upstream};

const RULES: &str = r#"
domain: gw
descriptors:
  - key: client_ip
    rate_limit: {name: per_ip, unit: minute, requests_per_unit: 5}
  - key: shadow
    shadow_mode: true
    rate_limit: {name: dark, unit: minute, requests_per_unit: 1}
  - key: fake
    action: {fake: {status: 200, content_type: application/json, body: '{"ok":true}'}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: soft
    action: {soft: {header: X-Slow-Down}}
    rate_limit: {name: gentle, unit: minute, requests_per_unit: 1}
  - key: global
    rate_limit: {name: global, unit: minute, requests_per_unit: 100}
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
  - key: ip
    rate_limit: {name: users_per_ip, unit: minute, requests_per_unit: 3}
  - key: queue
    action: delay
    limits:
      - {algorithm: leaky_queue, requests_per_unit: 20, unit: second, queue_size: 2}
trusted_proxies: [10.0.0.0/8]
routes:
  - path: /api/*
    methods: [GET]
    descriptors:
      - [{key: client_ip, from: client_ip}]
  - path: /shadow
    descriptors: [[{key: shadow, value: x}]]
  - path: /fake
    descriptors: [[{key: fake, from: client_ip}]]
  - path: /soft
    descriptors: [[{key: soft, from: client_ip}]]
  - path: /queue
    descriptors: [[{key: queue, value: all}]]
  - path: /users/{id}
    headers: both
    descriptors:
      - [{key: global, value: all}]
      - [{key: user, from: "param:id"}]
      - [{key: ip, from: client_ip}]
"#;

struct Gateway {
    proxy: sluice_gateway::Gateway,
    client: reqwest::Client,
}

impl Gateway {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.proxy.local_addr())
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(self.url(path)).send().await.unwrap()
    }
}

async fn gateway(
    limiter: std::sync::Arc<Limiter>,
    upstream: std::net::SocketAddr,
    tune: impl FnOnce(&mut GatewayOptions),
) -> Gateway {
    let mut options =
        GatewayOptions::new(Vec::new(), format!("http://{upstream}").parse().unwrap());
    options.listen = "127.0.0.1:0".parse().unwrap();
    tune(&mut options);
    let proxy = sluice_gateway::Gateway::start_with_limiter(options, limiter)
        .await
        .unwrap();
    Gateway {
        proxy,
        client: reqwest::Client::new(),
    }
}

#[tokio::test]
async fn reject_answers_429_with_fields_and_a_problem_body_and_unrouted_paths_pass() {
    let up = upstream().await;
    let (limiter, _clock, _dir) = limiter(RULES);
    let gw = gateway(limiter, up.addr, |_| {}).await;
    for i in 0..5u64 {
        let r = gw.get("/api/things").await;
        assert_eq!(r.status(), 200);
        assert_eq!(
            header(&r, "ratelimit-policy").as_deref(),
            Some("\"per_ip\";q=5;w=60")
        );
        assert_eq!(
            header(&r, "ratelimit").unwrap(),
            format!("\"per_ip\";r={};t=60", 4 - i)
        );
        assert!(header(&r, "retry-after").is_none());
        assert_eq!(r.text().await.unwrap(), "upstream GET /api/things");
    }
    let r = gw.get("/api/things").await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "retry-after").as_deref(), Some("60"));
    assert_eq!(
        header(&r, "content-type").as_deref(),
        Some("application/problem+json")
    );
    assert_eq!(
        header(&r, "ratelimit").as_deref(),
        Some("\"per_ip\";r=0;t=60")
    );
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!(["per_ip"]));
    assert_eq!(
        up.hits(),
        5,
        "the refused request never reached the upstream"
    );

    // POST is not routed, and neither is anything outside /api: both pass, without fields.
    let r = gw.client.post(gw.url("/api/things")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(header(&r, "ratelimit").is_none());
    let r = gw.get("/elsewhere").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "upstream GET /elsewhere");
    gw.proxy.shutdown().await;
}

#[tokio::test]
async fn shadow_passes_and_is_counted_without_showing() {
    let up = upstream().await;
    let (limiter, _clock, _dir) = limiter(RULES);
    let gw = gateway(limiter.clone(), up.addr, |_| {}).await;
    for _ in 0..3 {
        let r = gw.get("/shadow").await;
        assert_eq!(r.status(), 200);
        assert!(
            header(&r, "ratelimit").is_none(),
            "a dark launch is not visible"
        );
    }
    assert_eq!(up.hits(), 3);
    assert_eq!(
        limiter
            .metrics()
            .decisions_of("gw", "dark", Outcome::ShadowLimited),
        2
    );
}

#[tokio::test]
async fn fake_answers_the_canned_body_without_reaching_the_upstream() {
    let up = upstream().await;
    let (limiter, _clock, _dir) = limiter(RULES);
    let gw = gateway(limiter, up.addr, |_| {}).await;
    let r = gw.get("/fake").await;
    assert_eq!(r.text().await.unwrap(), "upstream GET /fake");
    let r = gw.get("/fake").await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "content-type").as_deref(),
        Some("application/json")
    );
    assert!(header(&r, "ratelimit").is_none() && header(&r, "retry-after").is_none());
    assert_eq!(r.text().await.unwrap(), r#"{"ok":true}"#);
    assert_eq!(up.hits(), 1);
}

#[tokio::test]
async fn soft_passes_with_a_warning_header() {
    let up = upstream().await;
    let (limiter, _clock, _dir) = limiter(RULES);
    let gw = gateway(limiter, up.addr, |_| {}).await;
    let r = gw.get("/soft").await;
    assert!(header(&r, "x-slow-down").is_none());
    let r = gw.get("/soft").await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "x-slow-down").as_deref(),
        Some("limit \"gentle\" exceeded; retry after 60s")
    );
    assert_eq!(
        header(&r, "ratelimit").as_deref(),
        Some("\"gentle\";r=0;t=60")
    );
    assert!(header(&r, "retry-after").is_none());
    assert_eq!(up.hits(), 2);
}

#[tokio::test]
async fn delay_queues_within_the_bound_and_rejects_beyond_it() {
    let up = upstream().await;
    // The store's clock stands still, so the shaper hands out slots 0, 50 and 100 ms ahead; the
    // gateway sleeps those out for real (briefly), and the fourth finds the queue full.
    let (limiter, _clock, _dir) = limiter(RULES);
    let gw = gateway(limiter, up.addr, |_| {}).await;
    let responses = futures_util::future::join_all((0..3).map(|_| gw.get("/queue"))).await;
    for r in &responses {
        assert_eq!(r.status(), 200);
    }
    let r = gw.get("/queue").await;
    assert_eq!(r.status(), 429);
    assert_eq!(up.hits(), 3);
}

#[tokio::test]
async fn routes_build_multi_tier_descriptors() {
    let up = upstream().await;
    let (limiter, _clock, _dir) = limiter(RULES);
    let gw = gateway(limiter, up.addr, |_| {}).await;
    // Per user: 2 a minute.
    for _ in 0..2 {
        let r = gw.get("/users/alice").await;
        assert_eq!(r.status(), 200);
        assert_eq!(
            header(&r, "ratelimit-policy").as_deref(),
            Some("\"global\";q=100;w=60, \"per_user\";q=2;w=60, \"users_per_ip\";q=3;w=60")
        );
    }
    let r = gw.get("/users/alice").await;
    assert_eq!(r.status(), 429);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["violated-policies"], serde_json::json!(["per_user"]));
    // The refusal consumed nothing, so this IP has one request left across users.
    let r = gw.get("/users/bob").await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-remaining").as_deref(), Some("0"));
    let r = gw.get("/users/carol").await;
    assert_eq!(r.status(), 429);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        body["violated-policies"],
        serde_json::json!(["users_per_ip"])
    );
    assert_eq!(up.hits(), 3);
}

#[tokio::test]
async fn a_spoofed_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let up = upstream().await;
    let (limiter, _clock, _dir) = limiter(RULES);
    // The rules trust 10.0.0.0/8 only; this client is 127.0.0.1.
    let gw = gateway(limiter.clone(), up.addr, |_| {}).await;
    for i in 0..5 {
        let r = gw
            .client
            .get(gw.url("/api/x"))
            .header("x-forwarded-for", format!("203.0.113.{i}"))
            .header("forwarded", format!("for=198.51.100.{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        // The upstream sees the claim with the real peer appended.
        assert_eq!(
            header(&r, "x-seen-xff").unwrap(),
            format!("203.0.113.{i}, 127.0.0.1")
        );
    }
    let r = gw
        .client
        .get(gw.url("/api/x"))
        .header("x-forwarded-for", "203.0.113.99")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        429,
        "a new X-Forwarded-For did not escape the limit"
    );

    // Behind a trusted proxy the header is believed: each forwarded client has its own counter.
    let trusted = gateway(limiter, up.addr, |o| {
        o.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    })
    .await;
    for i in 0..6 {
        let r = trusted
            .client
            .get(trusted.url("/api/x"))
            .header("x-forwarded-for", format!("192.0.2.{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

#[tokio::test]
async fn large_bodies_stream_through_both_ways() {
    let up = upstream().await;
    let (limiter, _clock, _dir) = limiter(RULES);
    let gw = gateway(limiter, up.addr, |_| {}).await;
    let r = gw.get("/big").await;
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let mut n = 0;
    while let Some(chunk) = futures_util::StreamExt::next(&mut stream).await {
        n += chunk.unwrap().len();
    }
    assert_eq!(n, BIG);

    let chunk = bytes::Bytes::from(vec![b'y'; 64 * 1024]);
    let upload = futures_util::stream::iter(
        (0..BIG / chunk.len()).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
    );
    let r = gw
        .client
        .post(gw.url("/count"))
        .body(reqwest::Body::wrap_stream(upload))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), BIG.to_string());
}

#[tokio::test]
async fn an_upstream_that_is_down_gives_502_and_one_that_hangs_504() {
    let (limiter, _clock, _dir) = limiter(RULES);
    let down = gateway(limiter.clone(), closed_port().await, |_| {}).await;
    let r = down.get("/anything").await;
    assert_eq!(r.status(), 502);
    assert_eq!(
        header(&r, "content-type").as_deref(),
        Some("application/problem+json")
    );
    assert!(r.text().await.unwrap().contains("unreachable"));

    let up = upstream().await;
    let slow = gateway(limiter, up.addr, |o| {
        o.upstream_timeout = Duration::from_millis(200);
    })
    .await;
    let r = slow.get("/slow").await;
    assert_eq!(r.status(), 504);
    assert!(r.text().await.unwrap().contains("did not answer in time"));
}

#[tokio::test]
async fn h2_clients_are_served() {
    let up = upstream().await;
    let (limiter, _clock, _dir) = limiter(RULES);
    let gw = gateway(limiter, up.addr, |_| {}).await;
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let r = client.get(gw.url("/api/h2")).send().await.unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "ratelimit").as_deref(),
        Some("\"per_ip\";r=4;t=60")
    );
    assert_eq!(r.text().await.unwrap(), "upstream GET /api/h2");
}

/// An upstream that tells which connections its requests came on, by the gateway's end of each.
struct Peers {
    addr: std::net::SocketAddr,
    seen: Seen,
}

type Seen = std::sync::Arc<std::sync::Mutex<std::collections::HashSet<std::net::SocketAddr>>>;

impl Peers {
    async fn start() -> Peers {
        use axum::extract::{ConnectInfo, Request};
        use axum::routing::get;
        let seen: Seen = Default::default();
        let record = seen.clone();
        // Answers only when 8 requests are in at once: a burst that needs 8 connections.
        let gather = std::sync::Arc::new(tokio::sync::Barrier::new(8));
        let app = axum::Router::new()
            .route("/ok", get(|| async { "ok" }))
            .route(
                "/gather",
                get(move || async move {
                    gather.wait().await;
                    "ok"
                }),
            )
            .route(
                "/close",
                get(|| async { ([("connection", "close")], "closing") }),
            )
            .route(
                "/big",
                get(|| async {
                    let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
                    axum::body::Body::from_stream(futures_util::stream::iter(
                        (0..BIG / chunk.len()).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
                    ))
                }),
            )
            .layer(axum::middleware::from_fn(
                move |ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
                      req: Request,
                      next: axum::middleware::Next| {
                    record.lock().unwrap().insert(peer);
                    next.run(req)
                },
            ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
            let _ = axum::serve(listener, app).await;
        });
        Peers { addr, seen }
    }

    /// How many connections the gateway has made so far.
    fn connections(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

#[tokio::test]
async fn upstream_connections_are_kept_alive_and_reused() {
    let up = Peers::start().await;
    let (limiter, _clock, _dir) = limiter(RULES);
    let gw = gateway(limiter, up.addr, |_| {}).await;
    for _ in 0..20 {
        let r = gw.get("/ok").await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().await.unwrap(), "ok");
    }
    assert_eq!(up.connections(), 1, "one connection carried them all");

    // A burst needs as many connections as it has requests at once (the upstream answers
    // them only when all 8 are in); the next burst as large reuses them instead of opening more.
    let burst = || futures_util::future::join_all((0..8).map(|_| gw.get("/gather")));
    for r in burst().await {
        assert_eq!(r.status(), 200);
    }
    let after_first = up.connections();
    assert_eq!(after_first, 8, "the idle one and 7 new");
    for r in burst().await {
        assert_eq!(r.status(), 200);
    }
    assert_eq!(up.connections(), after_first);
}

#[tokio::test]
async fn a_connection_the_upstream_closes_is_not_reused() {
    let up = Peers::start().await;
    let (limiter, _clock, _dir) = limiter(RULES);
    let gw = gateway(limiter, up.addr, |_| {}).await;
    for _ in 0..5 {
        let r = gw.get("/close").await;
        assert_eq!(r.status(), 200);
        assert!(
            header(&r, "connection").is_none_or(|v| v != "close"),
            "the upstream's Connection field is its own"
        );
        assert_eq!(r.text().await.unwrap(), "closing");
    }
    assert_eq!(up.connections(), 5);
}

#[tokio::test]
async fn an_answer_abandoned_midway_closes_its_upstream_connection() {
    let up = Peers::start().await;
    let (limiter, _clock, _dir) = limiter(RULES);
    let gw = gateway(limiter, up.addr, |_| {}).await;
    let r = gw.get("/big").await;
    let mut stream = r.bytes_stream();
    assert!(futures_util::StreamExt::next(&mut stream).await.is_some());
    drop(stream);
    // Whether or not the gateway has noticed yet, that connection cannot carry this request.
    let r = gw.get("/ok").await;
    assert_eq!(r.text().await.unwrap(), "ok");
    assert_eq!(up.connections(), 2);
    let r = gw.get("/ok").await;
    assert_eq!(r.text().await.unwrap(), "ok");
    assert_eq!(
        up.connections(),
        2,
        "the finished exchange's connection is reused"
    );
}

#[tokio::test]
async fn an_h2_upstream_carries_every_request_on_one_connection() {
    let up = Peers::start().await;
    let (limiter, _clock, _dir) = limiter(RULES);
    let gw = gateway(limiter, up.addr, |o| o.upstream_h2 = true).await;
    let answers = futures_util::future::join_all((0..8).map(|_| gw.get("/ok"))).await;
    for r in answers {
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().await.unwrap(), "ok");
    }
    let r = gw.get("/api/h2-upstream").await;
    assert_eq!(r.status(), 404, "routed, limited and forwarded over h2");
    assert_eq!(
        header(&r, "ratelimit").as_deref(),
        Some("\"per_ip\";r=4;t=60")
    );
    assert_eq!(up.connections(), 1);
}

/// 100 kept-alive clients of the gateway each send a request as it stops: every one is
/// answered, forwarded to the upstream as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_answers_every_request_sent_on_a_kept_alive_connection() {
    let (limiter, _clock, _dir) = limiter(RULES);
    let up = upstream().await;
    let gw = gateway(limiter, up.addr, |_| {}).await;
    let addr = gw.proxy.local_addr();
    let request = b"POST /count HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nsent";
    let (unanswered, statuses) =
        sluice_testing::stopping::sent_while_stopping(addr, 100, request, gw.proxy.shutdown())
            .await;
    assert_eq!(unanswered, 0, "of 100 requests sent while stopping");
    assert!(
        statuses.iter().all(|s| s == "http/1.1 200 ok"),
        "{statuses:?}"
    );
}
