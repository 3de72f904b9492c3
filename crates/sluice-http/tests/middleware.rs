//! `SharedLimitLayer` inside an axum app, and the delay queue under paused time.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::{Request, StatusCode};
use sluice_core::MemoryStore;
use sluice_http::extract::Extracted;
use sluice_http::{PeerAddr, SharedLimitLayer};
use sluice_limiter::{HeaderStyle, LimitRequest, RequestDescriptor};
use sluice_testing::{TokioClock, header, limiter, limiter_with};
use tower::{Layer, Service, ServiceExt};

const RULES: &str = r#"
domain: app
descriptors:
  - key: client_ip
    rate_limit: {name: per_ip, unit: minute, requests_per_unit: 3}
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
routes:
  - path: /limited
    headers: legacy
    descriptors: [[{key: client_ip, from: client_ip}]]
"#;

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    addr
}

#[tokio::test]
async fn the_limit_holds_across_router_clones_and_connections() {
    let (limiter, _clock, _dir) = limiter(RULES);
    let app = Router::new()
        .route("/limited", get(|| async { "hello" }))
        .route("/free", get(|| async { "free" }))
        .layer(SharedLimitLayer::new(limiter));
    let addr = serve(app).await;
    // axum clones the router for every connection; a fresh client is a fresh connection.
    for i in 0..3 {
        let client = reqwest::Client::new();
        let r = client
            .get(format!("http://{addr}/limited"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-ratelimit-limit").as_deref(), Some("3"));
        assert_eq!(
            header(&r, "x-ratelimit-remaining").unwrap(),
            (2 - i).to_string()
        );
        assert!(
            header(&r, "ratelimit").is_none(),
            "the route asked for legacy fields"
        );
        assert_eq!(r.text().await.unwrap(), "hello");
    }
    let r = reqwest::Client::new()
        .get(format!("http://{addr}/limited"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "retry-after").as_deref(), Some("60"));
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["violated-policies"], serde_json::json!(["per_ip"]));
    let r = reqwest::get(format!("http://{addr}/free")).await.unwrap();
    assert_eq!(r.status(), 200);
}

/// A service made for one connection's peer limits by that peer, with no `PeerAddr` on the
/// requests, and before one a request carries: the listener's word is the connection's.
#[tokio::test]
async fn a_service_for_one_peer_limits_by_that_peer() {
    let (limiter, _clock, _dir) = limiter(RULES);
    let inner = tower::service_fn(|_: Request<String>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::from("ok")))
    });
    let service = SharedLimitLayer::new(limiter).layer(inner);
    let ann = service.for_peer("192.0.2.1".parse().unwrap());
    let bob = service.for_peer("192.0.2.2".parse().unwrap());
    let bare = || Request::get("/limited").body(String::new()).unwrap();
    let mut remaining = Vec::new();
    for _ in 0..2 {
        let r = ann.clone().oneshot(bare()).await.unwrap();
        remaining.push(
            r.headers()["x-ratelimit-remaining"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    // Said to come from Bob, but on Ann's connection: Ann's counter.
    let mut claimed = bare();
    claimed
        .extensions_mut()
        .insert(PeerAddr("192.0.2.2:1".parse().unwrap()));
    let r = ann.clone().oneshot(claimed).await.unwrap();
    remaining.push(
        r.headers()["x-ratelimit-remaining"]
            .to_str()
            .unwrap()
            .to_owned(),
    );
    assert_eq!(remaining, ["2", "1", "0"]);
    assert_eq!(
        ann.clone().oneshot(bare()).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let r = bob.clone().oneshot(bare()).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "another peer, another counter");
    assert_eq!(r.headers()["x-ratelimit-remaining"], "2");
}

#[tokio::test]
async fn a_custom_extractor_limits_by_what_the_application_says() {
    let (limiter, _clock, _dir) = limiter(RULES);
    let layer = SharedLimitLayer::with_extractor(limiter, |parts, _ip| {
        let user = parts.headers.get("x-user")?.to_str().ok()?.to_owned();
        Some(Extracted {
            request: LimitRequest {
                domain: "app".into(),
                descriptors: vec![RequestDescriptor {
                    entries: vec![("user".into(), user)],
                    ..RequestDescriptor::default()
                }],
                cost: 1,
            },
            style: HeaderStyle::Ietf,
        })
    });
    let app = Router::new()
        .route("/x", get(|| async { "x" }))
        .layer(layer);
    let call = |user: &'static str| {
        let app = app.clone();
        async move {
            app.oneshot(
                Request::get("/x")
                    .header("x-user", user)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap()
        }
    };
    assert_eq!(call("ann").await.status(), StatusCode::OK);
    let r = call("ann").await;
    assert_eq!(r.headers()["ratelimit"], "\"per_user\";r=0;t=60");
    assert_eq!(call("ann").await.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(call("ben").await.status(), StatusCode::OK);
}

const QUEUE: &str = r#"
domain: q
descriptors:
  - key: shaped
    limits:
      - {algorithm: leaky_queue, requests_per_unit: 1, unit: second, queue_size: 2}
  - key: waits
    action: {delay: {max_wait: 3s}}
    rate_limit: {algorithm: token_bucket, requests_per_unit: 1, unit: second}
routes:
  - path: /shaped
    descriptors: [[{key: shaped, value: all}]]
  - path: /waits
    descriptors: [[{key: waits, value: all}]]
"#;

/// The layer over a service that records when each request reached it, on paused time.
// The service's type cannot be named (it holds a closure), so it is spelled as a bound.
#[allow(clippy::type_complexity)]
fn recording(
    max_delayed: usize,
) -> (
    impl Service<
        Request<String>,
        Response = http::Response<sluice_http::middleware::SharedLimitBody<String>>,
        Error = std::convert::Infallible,
        Future = impl Send,
    > + Clone
    + Send
    + 'static,
    Arc<Mutex<Vec<(String, Duration)>>>,
    sluice_http::Enforcer,
    tempfile::TempDir,
) {
    let store = MemoryStore::builder().clock(TokioClock::new()).build();
    let (limiter, dir) = limiter_with(QUEUE, Arc::new(store));
    let start = tokio::time::Instant::now();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let inner = tower::service_fn(move |r: Request<String>| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push((r.into_body(), start.elapsed()));
            Ok::<_, std::convert::Infallible>(http::Response::new(String::from("ok")))
        }
    });
    let layer = SharedLimitLayer::new(limiter).max_delayed(max_delayed);
    let enforcer = layer.enforcer().clone();
    (layer.layer(inner), seen, enforcer, dir)
}

fn request(path: &str, tag: &str) -> Request<String> {
    let mut r = Request::get(path).body(tag.to_owned()).unwrap();
    r.extensions_mut()
        .insert(PeerAddr("127.0.0.1:1".parse().unwrap()));
    r
}

#[tokio::test(start_paused = true)]
async fn the_shaper_releases_in_arrival_order_at_the_rate_and_rejects_past_the_queue() {
    let (service, seen, _enforcer, _dir) = recording(16);
    let mut tasks = Vec::new();
    for tag in ["a", "b", "c", "d"] {
        let svc = service.clone();
        tasks.push(tokio::spawn(svc.oneshot(request("/shaped", tag))));
        // Let each decide before the next arrives.
        tokio::task::yield_now().await;
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap().unwrap().status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            ("a".to_owned(), Duration::ZERO),
            ("b".to_owned(), Duration::from_secs(1)),
            ("c".to_owned(), Duration::from_secs(2)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_delay_action_waits_for_the_limit_up_to_max_wait() {
    let (service, seen, _enforcer, _dir) = recording(16);
    let mut tasks = Vec::new();
    for tag in ["a", "b", "c"] {
        tasks.push(tokio::spawn(
            service.clone().oneshot(request("/waits", tag)),
        ));
        tokio::task::yield_now().await;
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    let mut times: Vec<Duration> = seen.lock().unwrap().iter().map(|(_, d)| *d).collect();
    times.sort();
    assert_eq!(
        times,
        [
            Duration::ZERO,
            Duration::from_secs(1),
            Duration::from_secs(2)
        ]
    );
    // Five more at once: with a 3 s bound, the ones that would wait longer are rejected.
    let start = tokio::time::Instant::now();
    let results = futures_util::future::join_all(
        (0..5).map(|i| service.clone().oneshot(request("/waits", &format!("x{i}")))),
    )
    .await;
    let ok = results
        .iter()
        .filter(|r| r.as_ref().unwrap().status() == StatusCode::OK)
        .count();
    assert!((1..=4).contains(&ok), "{ok} passed");
    assert!(start.elapsed() <= Duration::from_secs(4));
}

#[tokio::test(start_paused = true)]
async fn the_delay_queue_is_bounded_and_a_client_that_leaves_frees_its_place() {
    let (service, _seen, enforcer, _dir) = recording(1);
    assert_eq!(
        service
            .clone()
            .oneshot(request("/shaped", "a"))
            .await
            .unwrap()
            .status(),
        200
    );
    // b waits for its slot and holds the one place.
    let waiting = tokio::spawn(service.clone().oneshot(request("/shaped", "b")));
    tokio::task::yield_now().await;
    assert_eq!(enforcer.free_delay_places(), 0);
    // c would wait too, but there is no place for it.
    let r = service
        .clone()
        .oneshot(request("/shaped", "c"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // b's client goes away: its place comes back.
    waiting.abort();
    let _ = waiting.await;
    assert_eq!(enforcer.free_delay_places(), 1);
}

#[tokio::test]
async fn a_single_policy_and_a_key_closure_need_no_rules_file() {
    use sluice_core::{Alignment, FakeClock, FixedWindow, Policy, Timestamp};
    let clock = FakeClock::at(Timestamp::from_secs(1_000_000));
    let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    let policy = Policy::from(
        FixedWindow::new(3, Duration::from_secs(60), Alignment::FirstRequest).unwrap(),
    );
    let layer = SharedLimitLayer::with_policy(policy, store, |parts, ip| {
        if parts.uri.path() == "/free" {
            return None;
        }
        let user = parts.headers.get("x-user").and_then(|v| v.to_str().ok());
        Some(user.map_or_else(|| ip.to_string(), str::to_owned))
    });
    let app = Router::new()
        .route("/limited", get(|| async { "hello" }))
        .route("/free", get(|| async { "free" }))
        .layer(layer);
    let addr = serve(app).await;
    let get = |path: &'static str, user: &'static str| async move {
        // A fresh client per request: a fresh connection, so a fresh clone of the router.
        reqwest::Client::new()
            .get(format!("http://{addr}{path}"))
            .header("x-user", user)
            .send()
            .await
            .unwrap()
    };
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(get("/limited", "ann").await.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let refused = get("/limited", "ann").await;
    assert_eq!(refused.headers()["ratelimit"], r#""limit";r=0;t=60"#);
    assert_eq!(refused.headers()["retry-after"], "60");
    assert_eq!(
        get("/limited", "bob").await.status(),
        200,
        "another key, another counter"
    );
    assert_eq!(get("/free", "ann").await.status(), 200, "no key, no limit");
    clock.advance(Duration::from_secs(60));
    assert_eq!(get("/limited", "ann").await.status(), 200);
}
