//! Three `sluice serve` processes sharing one store, as the reservation and concurrency tests
//! run them: how they start, the requests they are sent in domain `llm`, and how a test waits
//! for a ttl to run out, on the clock of the Redis server that decides it rather than on the
//! test's own.

use std::path::Path;

use serde_json::{Value, json};
use sluice_redis::testing::redis_time_nanos;
use sluice_test_support::{ServeProcess, eventually_within};

/// One `sluice serve` on `store` under `prefix`, serving `rules`. Its store timeout is long
/// (5 s): on a loaded machine the default would open the circuit breaker and let the rules'
/// `on_store_error` answer instead of the store.
pub fn start(rules: &Path, store: &str, prefix: &str) -> ServeProcess {
    builder(rules, store, prefix).start()
}

fn builder(rules: &Path, store: &str, prefix: &str) -> sluice_test_support::ServeBuilder {
    ServeProcess::builder(env!("CARGO_BIN_EXE_sluice"))
        .args(["--store", store, "--store-prefix", prefix])
        .args(["--store-timeout-ms", "5000"])
        .config(rules)
}

/// Three `sluice serve` on `store` under `prefix`, and their HTTP base URLs. The first runs on
/// a single-threaded runtime, as a process with one CPU does.
pub fn three(rules: &Path, store: &str, prefix: &str) -> (Vec<ServeProcess>, Vec<String>) {
    let single_threaded = builder(rules, store, prefix).env("TOKIO_WORKER_THREADS", "1");
    let instances = vec![
        single_threaded.start(),
        start(rules, store, prefix),
        start(rules, store, prefix),
    ];
    let urls = instances.iter().map(url).collect();
    (instances, urls)
}

/// The HTTP base URL of `instance`.
pub fn url(instance: &ServeProcess) -> String {
    format!("http://{}", instance.http())
}

/// A request of domain `llm` with one descriptor, `key` = `value`.
pub fn body(key: &str, value: &str) -> Value {
    json!({"domain": "llm", "descriptors": [{"entries": [{"key": key, "value": value}]}]})
}

/// What the counter of `key` = `value` has left (for a concurrency limit, its free slots), by a
/// look that consumes nothing.
pub async fn remaining(client: &reqwest::Client, url: &str, key: &str, value: &str) -> u64 {
    let limit = sluice_testing::look(client, url, body(key, value)).await;
    limit["remaining"]
        .as_u64()
        .unwrap_or_else(|| panic!("no remaining in {limit}"))
}

/// `POST {url}{path}` with `body`: the status and the answer's JSON.
pub async fn post(client: &reqwest::Client, url: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = client
        .post(format!("{url}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// 150 reservations of 10 on `key` = `acme`, from 30 concurrent callers spread over `urls`: the
/// admitted ones, each with the index of its call and its reservation id. A refusal carries no
/// reservation.
pub async fn reserve_from_all(
    client: &reqwest::Client,
    urls: &[String],
    key: &'static str,
) -> Vec<(usize, String)> {
    let tasks: Vec<_> = (0..30)
        .map(|c| {
            let (client, urls) = (client.clone(), urls.to_vec());
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for i in (c..150).step_by(30) {
                    let mut reserve = body(key, "acme");
                    reserve["amount"] = json!(10);
                    let (status, answer) =
                        post(&client, &urls[i % urls.len()], "/v1/reserve", &reserve).await;
                    match status {
                        200 => ids.push((i, answer["reservation"].as_str().unwrap().to_owned())),
                        429 => assert_eq!(answer["reservation"], Value::Null),
                        other => panic!("unexpected {other}: {answer}"),
                    }
                }
                ids
            })
        })
        .collect();
    let mut ids = Vec::new();
    for t in tasks {
        ids.extend(t.await.unwrap());
    }
    ids
}

/// Waits until Redis `TIME` on the server at `port` reads `at` (ns since the epoch) or later,
/// polling it: a ttl that ends at `at` by that clock (the one every store on Redis judges a ttl
/// by; a Cluster's masters share this machine's) has then run out for every instance. `at` is
/// at most a few seconds ahead: the wait allows a minute.
pub async fn until_redis_time(port: u16, at: i64) {
    eventually_within(
        "Redis's clock reaches the end of the ttl",
        std::time::Duration::from_secs(60),
        || async {
            let now = redis_time_nanos(port);
            (now >= at)
                .then_some(())
                .ok_or_else(|| format!("{} ms to go", (at - now) / 1_000_000))
        },
    )
    .await;
}
