//! Reservations across three `sluice serve` processes sharing one Redis, a real 3-master
//! Cluster, or one Redis under the hybrid store: concurrent reservations never take more than
//! the budget, each settled on another instance than the one that made it gives back exactly
//! what was not used, and a second settle anywhere is refused. Real processes, a real
//! `redis-server`, real HTTP.

use std::path::Path;

use serde_json::{Value, json};
use sluice_redis::testing::{RedisCluster, RedisServer, unique_prefix};
use sluice_test_support::{ServeProcess, eventually, rules_file};
use sluice_testing::metric;

/// A budget of 1,000 units an hour in a window that starts with the first request, and a bucket
/// of 1,000 that refills one an hour: neither gains a unit while a test runs.
const RULES: &str = r#"
domain: llm
descriptors:
  - key: tenant
    rate_limit: {algorithm: fixed_window, alignment: first_request, requests_per_unit: 1000, window: 1h}
  - key: bucket
    rate_limit: {algorithm: token_bucket, requests_per_unit: 1, unit: hour, burst: 1000}
"#;

fn start(rules: &Path, store: &str, prefix: &str) -> ServeProcess {
    ServeProcess::builder(env!("CARGO_BIN_EXE_sluice"))
        .args(["--store", store, "--store-prefix", prefix])
        .args(["--store-timeout-ms", "5000"])
        .config(rules)
        .start()
}

fn body(key: &str, value: &str) -> Value {
    json!({"domain": "llm", "descriptors": [{"entries": [{"key": key, "value": value}]}]})
}

/// What the counter has left, by a look that consumes nothing.
async fn remaining(client: &reqwest::Client, url: &str, key: &str, value: &str) -> u64 {
    let mut look = body(key, value);
    look["descriptors"][0]["cost"] = json!(0);
    let r: Value = client
        .post(format!("{url}/v1/check"))
        .json(&look)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    r["descriptors"][0]["limits"][0]["remaining"]
        .as_u64()
        .unwrap()
}

/// Three `sluice serve` on `store` under `prefix`, and their HTTP base URLs.
fn three(rules: &Path, store: &str, prefix: &str) -> (Vec<ServeProcess>, Vec<String>) {
    let instances: Vec<ServeProcess> = (0..3).map(|_| start(rules, store, prefix)).collect();
    let urls = instances
        .iter()
        .map(|i| format!("http://{}", i.http()))
        .collect();
    (instances, urls)
}

/// 150 reservations of 10 on `key`, from 30 concurrent callers spread over `urls`: the
/// admitted ones, each with the index of its call and its reservation id. A refusal carries no
/// reservation.
async fn reserve_from_all(
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
                    let r = client
                        .post(format!("{}/v1/reserve", urls[i % 3]))
                        .json(&reserve)
                        .send()
                        .await
                        .unwrap();
                    let status = r.status().as_u16();
                    let answer: Value = r.json().await.unwrap();
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

async fn shared_budget(store: &str) {
    let (rules, _dir) = rules_file("rules.yaml", RULES);
    let prefix = unique_prefix();
    let (_instances, urls) = three(&rules, store, &prefix);
    let client = sluice_testing::long_lived_client();

    for key in ["tenant", "bucket"] {
        // 150 reservations of 10 from 30 concurrent callers over three instances, against a
        // budget of 1,000: exactly 100 are admitted, whatever the interleaving.
        let ids = reserve_from_all(&client, &urls, key).await;
        assert_eq!(
            ids.len(),
            100,
            "{key}: admitted beyond the budget or short of it"
        );
        assert_eq!(remaining(&client, &urls[0], key, "acme").await, 0, "{key}");

        // Each settled on the next instance with 4 used: 6 come back from each, 600 in all.
        for (i, id) in &ids {
            let settle = json!({"reservation": id, "used": 4});
            let r = client
                .post(format!("{}/v1/settle", urls[(i + 1) % 3]))
                .json(&settle)
                .send()
                .await
                .unwrap();
            assert_eq!(
                r.status().as_u16(),
                200,
                "{key}: {}",
                r.text().await.unwrap()
            );
        }
        assert_eq!(
            remaining(&client, &urls[2], key, "acme").await,
            600,
            "{key}"
        );

        // A second settle, on any instance, refunds nothing.
        for url in &urls {
            let settle = json!({"reservation": ids[0].1, "used": 0});
            let r = client
                .post(format!("{url}/v1/settle"))
                .json(&settle)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 409, "{key}");
        }
        assert_eq!(
            remaining(&client, &urls[1], key, "acme").await,
            600,
            "{key}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_redis_share_reservations() {
    let redis = RedisServer::start();
    shared_budget(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_a_cluster_share_reservations() {
    let cluster = RedisCluster::start();
    shared_budget(&cluster.url()).await;
}

/// The hybrid store decides each reservation on the instance that receives it, within that
/// instance's claim on the limit, so concurrent reservations over three instances never take
/// more than the budget but may take less (a reservation beyond an instance's claim is refused
/// until its next sync); each settled on another instance gives back what was not used to every
/// instance once the syncs carry it, and a second settle anywhere is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_a_hybrid_store_share_reservations() {
    let redis = RedisServer::start();
    let store = format!("hybrid+{}", redis.url());
    let (rules, _dir) = rules_file("rules.yaml", RULES);
    let prefix = unique_prefix();
    let (_instances, urls) = three(&rules, &store, &prefix);
    let client = sluice_testing::long_lived_client();
    // An instance that has not yet heard of the others decides as if alone, on the whole
    // limit: the bound below is the one among instances that know each other (an instance
    // starting beside others is the overshoot docs/hybrid-store.md bounds apart).
    for url in &urls {
        eventually("every instance counts three live instances", || async {
            metric(&client, url, "sluice_hybrid_instances").await == Some(3.0)
        })
        .await;
    }

    for key in ["tenant", "bucket"] {
        let ids = reserve_from_all(&client, &urls, key).await;
        let n = ids.len() as u64;
        // Never beyond the budget; before any sync each instance has a sixth of it unreserved
        // (half of an even split), 16 reservations of 10.
        assert!(
            (48..=100).contains(&n),
            "{key}: {n} reservations of 10 admitted"
        );

        // Each settled on the next instance with 4 used: 6 come back from each.
        for (i, id) in &ids {
            let settle = json!({"reservation": id, "used": 4});
            let r = client
                .post(format!("{}/v1/settle", urls[(i + 1) % 3]))
                .json(&settle)
                .send()
                .await
                .unwrap();
            assert_eq!(
                r.status().as_u16(),
                200,
                "{key}: {}",
                r.text().await.unwrap()
            );
        }
        let expected = 1000 - 4 * n;
        for url in &urls {
            eventually(&format!("{key}: {url} sees {expected} left"), || async {
                let left = remaining(&client, url, key, "acme").await;
                (left == expected).then_some(()).ok_or(left)
            })
            .await;
        }

        // A second settle, on any instance, refunds nothing.
        for url in &urls {
            let settle = json!({"reservation": ids[0].1, "used": 0});
            let r = client
                .post(format!("{url}/v1/settle"))
                .json(&settle)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 409, "{key}");
        }
        for url in &urls {
            assert_eq!(
                remaining(&client, url, key, "acme").await,
                expected,
                "{key}"
            );
        }
    }
}
