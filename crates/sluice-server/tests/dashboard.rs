//! The dashboard over real HTTP: the page is served from the binary with a policy that allows
//! nothing from elsewhere, and its data moves with traffic and records a failed reload.

use std::sync::Arc;

use serde_json::{Value, json};
use sluice_core::MemoryStore;
use sluice_server::{ServeOptions, Server};

const RULES: &str = "domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
";

async fn start() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let mut options = ServeOptions::new(vec![rules]);
    options.http_addr = "127.0.0.1:0".parse().unwrap();
    options.grpc_addr = "127.0.0.1:0".parse().unwrap();
    let server = Server::start_with_store(options, Arc::new(MemoryStore::new()))
        .await
        .unwrap();
    (server, dir)
}

/// Polls `/v1/dashboard` until `done` holds, for at most 20 s (the history is sampled once a
/// second by the server).
async fn dashboard_until(server: &Server, done: impl Fn(&Value) -> bool) -> Value {
    let url = format!("http://{}/v1/dashboard", server.http_addr());
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let v: Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
        if done(&v) {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "never: {v:#}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
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
    let v = dashboard_until(&server, |v| v["reloads"]["failed"] == 1).await;
    let last = v["reloads"]["recent"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["outcome"], "failed");
    assert!(
        last["detail"].as_str().unwrap().contains("rules.yaml:"),
        "{last}"
    );
    server.shutdown().await;
}
