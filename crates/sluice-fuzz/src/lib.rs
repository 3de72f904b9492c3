//! The fuzz targets' bodies. Each takes arbitrary bytes, drives one parser of untrusted input
//! through the real code path, and panics only when Sluice breaks a promise: a panic inside
//! Sluice, a 5xx answer to a malformed request, or a request built from headers that the
//! limiter then refuses as out of bounds.
//!
//! `fuzz/` wraps each in a libFuzzer target (`scripts/fuzz` builds and runs them);
//! `tests/corpus.rs` runs every seed and every saved crash through them in the test suite, so a
//! crash once found stays fixed.
//!
//! ```
//! sluice_fuzz::rules_yaml(b"domain: x\ndescriptors: [");
//! sluice_fuzz::envoy_proto(&[0x0a, 0x01, b'x']);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use http::{Request, StatusCode};
use prost::Message as _;
use sluice_core::MemoryStore;
use sluice_limiter::{HeaderStyle, Limiter, Metrics};
use sluice_rules::{Cidr, Reloader, RuleSet};
use sluice_server::api::{ApiState, router};
use sluice_server::envoy::{RateLimitRequest, to_limit_request, to_response};
use tower::ServiceExt as _;

/// The service's example rules, which the request targets are decided against.
const RULES: &str = include_str!("../../../examples/rules.yaml");
/// Routes that read every kind of value a gateway extracts, for the header target.
const GATEWAY: &str = r#"
domain: fuzz
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: client_ip
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: key
    rate_limit: {unit: minute, requests_per_unit: 5}
trusted_proxies: [127.0.0.0/8, "::1"]
routes:
  - path: /users/{id}/{*rest}
    host: "*.example.com"
    descriptors:
      - [{key: user, from: "param:id"}]
      - [{key: client_ip, from: client_ip}, {key: method, from: method}]
  - path: /api/*
    descriptors:
      - [{key: key, from: api_key}]
      - [{key: key, from: bearer}]
      - [{key: key, from: "cookie:session"}]
      - [{key: key, from: "query:token"}]
      - [{key: key, from: "header:X-Tenant"}, {key: user, from: host}]
      - [{key: client_ip, from: client_ip}, {key: user, from: path, default: none}]
"#;

/// The names of the targets, as `fuzz/` and `tests/corpus.rs` know them.
pub const TARGETS: [&str; 6] = [
    "rules_yaml",
    "http_api",
    "envoy_proto",
    "gateway_keys",
    "redis_reply",
    "http1_connection",
];

/// Runs target `name` on `data`. Panics on an unknown name.
pub fn run(name: &str, data: &[u8]) {
    match name {
        "rules_yaml" => rules_yaml(data),
        "http_api" => http_api(data),
        "envoy_proto" => envoy_proto(data),
        "gateway_keys" => gateway_keys(data),
        "redis_reply" => redis_reply(data),
        "http1_connection" => http1_connection(data),
        other => panic!("no fuzz target named {other}"),
    }
}

struct Shared {
    runtime: tokio::runtime::Runtime,
    limiter: Arc<Limiter>,
    gateway_rules: RuleSet,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let rules = RuleSet::parse("examples/rules.yaml", RULES).expect("the example rules load");
        Shared {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a runtime"),
            limiter: Arc::new(Limiter::new(
                Reloader::fixed(rules),
                Arc::new(MemoryStore::new()),
                Arc::new(Metrics::new()),
            )),
            gateway_rules: RuleSet::parse("gateway.yaml", GATEWAY).expect("the gateway rules load"),
        }
    })
}

/// Rule files: any text loads or is refused with a location inside the file.
pub fn rules_yaml(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match RuleSet::parse("fuzz.yaml", &text) {
        Ok(rules) => {
            // What loads can be listed and fingerprinted like any rule set.
            let _ = rules.rules().count();
            let _ = rules.fingerprint();
        }
        Err(e) => {
            // YAML breaks lines at CR LF, LF and a lone CR alike (an error may point just past
            // the last line, at the end of the input).
            let breaks = text.matches('\n').count() + text.matches('\r').count()
                - text.matches("\r\n").count();
            let lines = breaks + 2;
            for error in e.errors() {
                assert!(
                    error.location.line >= 1 && error.location.line <= lines,
                    "an error located outside the file: {error}"
                );
            }
        }
    }
}

/// The HTTP API: the first byte picks `/json` or `/v1/check`, the rest is the body. Any body
/// gets a 2xx, 400, 413 or 429, never a 5xx.
pub fn http_api(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let path = if pick % 2 == 0 { "/json" } else { "/v1/check" };
    let s = shared();
    let app = router(ApiState {
        limiter: s.limiter.clone(),
        admin_token: None,
        headers: HeaderStyle::Ietf,
        envoy: Default::default(),
        envoy_stats: None,
    });
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("a valid request");
    let response = s
        .runtime
        .block_on(app.oneshot(request))
        .expect("the router is infallible");
    let status = response.status();
    assert!(
        status.is_success()
            || status == StatusCode::BAD_REQUEST
            || status == StatusCode::PAYLOAD_TOO_LARGE
            || status == StatusCode::TOO_MANY_REQUESTS,
        "{path} answered {status} to {:?}",
        String::from_utf8_lossy(body)
    );
}

/// Envoy's `RateLimitRequest` as protobuf: decoded, converted, decided and answered, or refused
/// as invalid. A message the wire check refuses (too many descriptors or entries, counted
/// before decoding) is one the whole path refuses too.
pub fn envoy_proto(data: &[u8]) {
    let refused_on_the_wire = sluice_server::wire_bounds::check(data).is_err();
    let Ok(message) = RateLimitRequest::decode(data) else {
        return;
    };
    let descriptors = message.descriptors.len();
    let Ok(request) = to_limit_request(message) else {
        return;
    };
    assert!(
        !refused_on_the_wire || request.validate().is_err(),
        "refused on the wire, valid once decoded"
    );
    let s = shared();
    if let Ok(verdict) = s.runtime.block_on(s.limiter.decide(&request)) {
        let response = to_response(&verdict, descriptors);
        assert_eq!(response.statuses.len(), descriptors);
    }
}

/// The gateway's key extraction from a request's headers. The input is text: a first line
/// `METHOD PATH`, then `name: value` lines. The client IP comes from the headers as the proxy
/// would read them behind a trusted loopback hop, and whatever descriptors extraction builds
/// are within the limiter's bounds.
pub fn gateway_keys(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let first = lines.next().unwrap_or_default();
    let (method, path) = first.split_once(' ').unwrap_or(("GET", first));
    let mut builder = Request::builder().method(method.trim()).uri(path.trim());
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            builder = builder.header(name.trim(), value.trim());
        }
    }
    // Headers and targets that HTTP itself refuses never reach Sluice.
    let Ok(request) = builder.body(()) else {
        return;
    };
    let (parts, ()) = request.into_parts();
    let s = shared();
    let Some(gateway) = s.gateway_rules.gateway() else {
        return;
    };
    let peer = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let trusted: Vec<Cidr> = vec!["127.0.0.0/8".parse().expect("a CIDR")];
    let client = sluice_http::client_ip::client_ip(
        peer,
        &parts.headers,
        &trusted,
        sluice_http::client_ip::ForwardedHeader::XForwardedFor,
    );
    if let Some(extracted) = sluice_http::extract::extract(gateway, &parts, client) {
        if let Err(e) = extracted.request.validate() {
            panic!("extraction built a request the limiter refuses: {e}");
        }
    }
}

/// The check script's reply as Redis would send it (RESP), for one to four checks: decoded to
/// that many decisions, or refused.
pub fn redis_reply(data: &[u8]) {
    let Some((&n, resp)) = data.split_first() else {
        return;
    };
    let limits: Vec<u64> = (0..u64::from(n % 4) + 1).map(|i| 10 * (i + 1)).collect();
    assert!(sluice_redis::fuzzing::reply_readers_agree(resp));
    if let Some(decoded) = sluice_redis::fuzzing::check_reply(resp, &limits) {
        assert_eq!(decoded, limits.len());
    }
}

/// The bytes a client sends on an HTTP/1.1 connection, whatever they are, to the listeners'
/// own HTTP/1.1 server (`sluice_http::h1_server`, which hands what it does not serve to hyper
/// with the bytes read): it answers with HTTP/1.x answers or closes, and the connection ends
/// once the client has sent everything and closed its side. It never panics, never answers
/// with anything but an HTTP/1 status line (h2's frames to h2's preface), and never hangs.
pub fn http1_connection(data: &[u8]) {
    use std::convert::Infallible;
    use std::time::Duration;

    use http_body_util::{BodyExt as _, Full};
    use hyper_util::rt::TokioExecutor;
    use hyper_util::server::conn::auto::Builder;
    use sluice_http::RequestBody;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    // A clock of its own that moves only when nothing can run: a connection that would wait
    // for ever makes the timeout below fire at once instead of holding the fuzzer.
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime")
    });
    runtime.block_on(async {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (mut from_server, mut to_server) = tokio::io::split(client);
        let answer = |request: Request<RequestBody>| async move {
            let target = request.uri().to_string();
            let body = request
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().len())
                .unwrap_or(0);
            Ok::<_, Infallible>(http::Response::new(Full::new(axum::body::Bytes::from(
                format!("{target} {body}"),
            ))))
        };
        let connection = sluice_http::h1_server::serve(
            server,
            answer,
            // `POST /json` comes without its fields, as the service's decision endpoints do:
            // both ways of building a request are fuzzed.
            sluice_http::h1_server::Fields::UnreadFor(|method, path| {
                method == http::Method::POST && path == b"/json"
            }),
            Arc::new(Builder::new(TokioExecutor::new())),
        );
        let serving = tokio::spawn(connection);
        let reading = tokio::spawn(async move {
            let mut out = Vec::new();
            let _ = from_server.read_to_end(&mut out).await;
            out
        });
        // The server may stop reading (a request it refuses): what is left unsent is dropped.
        let _ = to_server.write_all(data).await;
        let _ = to_server.shutdown().await;
        let out = tokio::time::timeout(Duration::from_secs(600), reading)
            .await
            .expect("the connection ends once the client has sent everything and closed")
            .expect("the reader does not panic");
        let ended = tokio::time::timeout(Duration::from_secs(600), serving)
            .await
            .expect("the server's side ends too");
        assert!(ended.is_ok(), "the connection's task panicked");
        // h2's preface is answered in h2, by hyper: its first frame is the server's SETTINGS.
        let h2 = data.starts_with(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") && out.get(3) == Some(&0x4);
        assert!(
            out.is_empty() || out.starts_with(b"HTTP/1.") || h2,
            "answered {:?} to {:?}",
            String::from_utf8_lossy(&out[..out.len().min(80)]),
            String::from_utf8_lossy(&data[..data.len().min(200)])
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fuzz_gateway_rules_load_with_routes() {
        let gateway = shared().gateway_rules.gateway().expect("routes");
        assert_eq!(gateway.routes.len(), 2);
    }

    #[test]
    fn a_valid_json_request_is_decided() {
        // `/json` (first byte even) with a request the example rules limit: it is counted.
        let before = shared().limiter.render_metrics();
        http_api(
            b"\x00{\"domain\":\"example\",\"descriptors\":[{\"entries\":\
              [{\"key\":\"remote_address\",\"value\":\"10.0.0.1\"}]}]}",
        );
        assert_ne!(shared().limiter.render_metrics(), before);
    }

    #[test]
    #[should_panic(expected = "no fuzz target named")]
    fn an_unknown_target_is_refused() {
        run("nope", b"");
    }
}
