//! The HTTP listener end to end: the dashboard (its page served from the binary with a policy
//! that allows nothing from elsewhere, its data moving with traffic and recording a failed
//! reload), and bodies that cannot be read, over a raw socket (a broken chunked encoding is the
//! client's error, 400; only an oversized body is too large, 413).

use std::sync::Arc;

use serde_json::{Value, json};
use sluice_core::MemoryStore;
use sluice_server::{ServeOptions, Server};
use sluice_test_support::{eventually, rules_file};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Two an hour, in a window that starts at the key's first request: the store reads the real
/// clock, and a window aligned to it could end among the three checks and admit all three.
const RULES: &str = "domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2, alignment: first_request}
";

async fn start() -> (Server, tempfile::TempDir) {
    let (rules, dir) = rules_file("rules.yaml", RULES);
    let mut options = ServeOptions::new(vec![rules]);
    options.http_addr = "127.0.0.1:0".parse().unwrap();
    options.grpc_addr = "127.0.0.1:0".parse().unwrap();
    let server = Server::start_with_store(options, Arc::new(MemoryStore::new()))
        .await
        .unwrap();
    (server, dir)
}

/// Polls `/v1/dashboard` until `done` holds, for at most 20 s (the history is sampled once a
/// second by the server); a timeout quotes the last data seen.
async fn dashboard_until(server: &Server, done: impl Fn(&Value) -> bool) -> Value {
    let url = format!("http://{}/v1/dashboard", server.http_addr());
    eventually("the dashboard shows it", || async {
        let v: Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
        if done(&v) { Ok(v) } else { Err(v) }
    })
    .await
}

fn total(v: &Value, outcome: &str) -> u64 {
    v["decisions"]["series"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["outcome"] == outcome)
        .flat_map(|s| s["per_interval"].as_array().unwrap().iter())
        .map(|n| n.as_u64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_self_contained_and_its_data_follows_traffic_and_reloads() {
    let (server, dir) = start().await;
    let page = reqwest::get(format!("http://{}/dashboard", server.http_addr()))
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(csp.starts_with("default-src 'none'"), "{csp}");
    let html = page.text().await.unwrap();
    assert!(html.contains("/v1/dashboard") && html.contains("<script>"));
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "no outside resource"
    );

    let client = reqwest::Client::new();
    for _ in 0..3 {
        client
            .post(format!("http://{}/json", server.http_addr()))
            .json(&json!({"domain": "shop", "descriptors": [{"entries": [{"key": "user", "value": "bob"}]}]}))
            .send()
            .await
            .unwrap();
    }
    let v = dashboard_until(&server, |v| {
        total(v, "allowed") == 2 && total(v, "limited") == 1
    })
    .await;
    assert_eq!(v["top_limited"][0]["refusals"], 1);
    assert!(
        v["top_limited"][0]["key"]
            .as_str()
            .unwrap()
            .contains("user=bob")
    );
    assert_eq!(v["store"]["kind"], "memory");
    assert_eq!(v["rules"]["domains"][0]["domain"], "shop");

    std::fs::write(dir.path().join("rules.yaml"), "domain: [\n").unwrap();
    // The count moves as the reload fails; the list of recent reloads follows from the
    // reloader's events a moment later: both are waited for.
    let last_failed = |v: &Value| {
        v["reloads"]["recent"]
            .as_array()
            .and_then(|recent| recent.last())
            .is_some_and(|last| last["outcome"] == "failed")
    };
    let v = dashboard_until(&server, |v| v["reloads"]["failed"] == 1 && last_failed(v)).await;
    let last = v["reloads"]["recent"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        last["detail"].as_str().unwrap().contains("rules.yaml:"),
        "{last}"
    );
    server.shutdown().await;
}

/// The status line of the answer to `raw`.
async fn status_of(server: &Server, raw: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(server.http_addr())
        .await
        .unwrap();
    s.write_all(raw).await.unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    text.lines().next().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_body_sent_in_several_chunks_is_read_whole() {
    let (server, _dir) = start().await;
    // Each request is its key's first, so each is admitted whenever the test runs; the answer
    // names the rule's limit only if the domain, key and value all arrived.
    for (path, value, named) in [
        ("/json", "chunked-json", r#""requestsPerUnit":2"#),
        ("/v1/check", "chunked-check", r#""limit":2"#),
    ] {
        let body = format!(
            r#"{{"domain":"shop","descriptors":[{{"entries":[{{"key":"user","value":"{value}"}}]}}]}}"#
        );
        // Three chunks, the first two ending inside a name and inside a string, each written
        // and flushed on its own.
        let (a, rest) = body.split_at(10);
        let (b, c) = rest.split_at(40);
        let mut s = tokio::net::TcpStream::connect(server.http_addr())
            .await
            .unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        for chunk in [a, b, c] {
            s.write_all(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes())
                .await
                .unwrap();
            s.flush().await.unwrap();
        }
        s.write_all(b"0\r\n\r\n").await.unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer).await;
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{path}: {text}");
        assert!(text.contains(named), "{path}: {text}");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_broken_chunked_body_is_a_bad_request_and_a_huge_one_too_large() {
    let (server, _dir) = start().await;
    for path in ["/json", "/v1/check"] {
        let broken = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\n\r\n5\r\n{{\"dom\r\nZZ\r\nnot hex\r\n0\r\n\r\n"
        );
        assert_eq!(
            status_of(&server, broken.as_bytes()).await,
            "HTTP/1.1 400 Bad Request",
            "{path}"
        );
        let huge = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n\
             Content-Length: 10000000\r\n\r\n{}",
            "x".repeat(1 << 20)
        );
        assert_eq!(
            status_of(&server, huge.as_bytes()).await,
            "HTTP/1.1 413 Payload Too Large",
            "{path}"
        );
    }
    server.shutdown().await;
}
