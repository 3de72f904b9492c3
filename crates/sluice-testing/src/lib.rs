//! The engine layer of Sluice's test support: limiters over rules on fake clocks, a clock that
//! follows tokio's paused time, a real upstream on a loopback port, a closed port, an HTTP client
//! for long tests, certificates for TLS tests ([`tls`]), and kept-alive clients that send a
//! request as a service stops ([`stopping`]).
//!
//! It may depend on the engine (`sluice-limiter`), so only the crates above the engine use it.
//! What needs nothing of Sluice's (free ports, processes killed by PID, polling until a deadline,
//! `sluice serve` as a process, rules in a temp dir, clock-aligned windows) is the layer below,
//! `sluice-test-support`, which every crate's tests may use. Dev-only: no published crate
//! depends on it.

#![forbid(unsafe_code)]
#![allow(missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::routing::{any, get, post};
use futures_util::StreamExt;
use sluice_core::{Clock, DynStore, FakeClock, MemoryStore, Timestamp};
use sluice_limiter::{Limiter, Metrics};
use sluice_rules::Reloader;
use sluice_test_support::rules_file;

pub mod stopping;
pub mod tls;

/// A limiter over `rules` (YAML text) and `store`. The temp dir must outlive the limiter.
pub fn limiter_with(rules: &str, store: Arc<dyn DynStore>) -> (Arc<Limiter>, tempfile::TempDir) {
    let (path, dir) = rules_file("gateway.yaml", rules);
    let reloader = Reloader::new(vec![path]).unwrap();
    (
        Arc::new(Limiter::new(reloader, store, Arc::new(Metrics::new()))),
        dir,
    )
}

/// A limiter on a memory store whose clock only moves when the test says. It starts on a whole
/// minute, so clock-aligned windows report their full length.
pub fn limiter(rules: &str) -> (Arc<Limiter>, FakeClock, tempfile::TempDir) {
    let clock = FakeClock::at(Timestamp::from_secs(1_700_000_040));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let (l, dir) = limiter_with(rules, Arc::new(store));
    (l, clock, dir)
}

/// A clock that follows tokio's, so that under `tokio::time::pause()` the store sees time move
/// exactly as the delay queue's sleeps do.
#[derive(Debug, Clone)]
pub struct TokioClock {
    base: Timestamp,
    start: tokio::time::Instant,
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl TokioClock {
    pub fn new() -> Self {
        TokioClock {
            base: Timestamp::from_secs(1_700_000_040),
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.base.saturating_add(self.start.elapsed())
    }
}

/// An API for the gateway to stand in front of, counting the requests that reach it.
pub struct CountingUpstream {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
}

impl CountingUpstream {
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// Bytes `/big` streams, in 64 KiB chunks.
pub const BIG: usize = 32 * 1024 * 1024;

pub async fn upstream() -> CountingUpstream {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app = Router::new()
        .route(
            "/big",
            get(|| async {
                let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
                let stream = futures_util::stream::iter(
                    (0..BIG / chunk.len()).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
                );
                Body::from_stream(stream)
            }),
        )
        .route(
            "/count",
            post(|body: Body| async move {
                let mut stream = body.into_data_stream();
                let mut n = 0usize;
                while let Some(chunk) = stream.next().await {
                    n += chunk.map(|c| c.len()).unwrap_or(0);
                }
                n.to_string()
            }),
        )
        .route(
            "/slow",
            get(|| async {
                std::future::pending::<()>().await;
                "never"
            }),
        )
        .fallback(any(|headers: HeaderMap, request: Request| async move {
            let xff = headers
                .get("x-forwarded-for")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            (
                [("x-seen-xff", xff)],
                format!("upstream {} {}", request.method(), request.uri().path()),
            )
        }))
        .layer(axum::middleware::from_fn(
            move |req: Request, next: axum::middleware::Next| {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    next.run(req).await
                }
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    CountingUpstream { addr, hits }
}

/// A port nothing listens on.
pub async fn closed_port() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}

/// An HTTP client for a test that talks to `sluice serve` or `sluice proxy` for longer than
/// their 10 s header timeout. The server closes a kept-alive connection that sends nothing for
/// that long, and `reqwest` keeps idle connections 90 s by default: a request sent on one just
/// as the server closes it fails. This client lets idle connections go after 5 s instead.
pub fn long_lived_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(5))
        .build()
        .expect("an HTTP client")
}

/// The value of the first series of `/metrics` on `url` whose line starts with `name`, or `None`
/// while the service does not answer or has no such series.
pub async fn metric(client: &reqwest::Client, url: &str, name: &str) -> Option<f64> {
    let text = client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.starts_with(name))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// The first limit of the first descriptor that `url`'s `POST /v1/check` answers for
/// `request`, asked as a look: every descriptor's `cost` is set to 0, so nothing is consumed.
/// Its `limit`, `remaining` and the rest, as the answer's JSON has them.
pub async fn look(
    client: &reqwest::Client,
    url: &str,
    mut request: serde_json::Value,
) -> serde_json::Value {
    if let Some(descriptors) = request["descriptors"].as_array_mut() {
        for d in descriptors {
            d["cost"] = serde_json::json!(0);
        }
    }
    let mut answer: serde_json::Value = client
        .post(format!("{url}/v1/check"))
        .json(&request)
        .send()
        .await
        .expect("the service answers")
        .json()
        .await
        .expect("a JSON answer");
    answer["descriptors"][0]["limits"][0].take()
}

pub fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

pub const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
