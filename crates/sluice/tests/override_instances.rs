//! Runtime overrides across three `sluice serve` processes sharing one Redis, or a real
//! 3-master Cluster: an override set on one instance is enforced by the others within a
//! second, a restarted instance enforces it from its first request, a rule reload keeps it, an
//! expiry gives the rule its limit back everywhere, and concurrent `PUT`s end on one value on
//! every instance; on the hybrid store, an override is held within its 5% bound. Real
//! processes, a real `redis-server`, real HTTP.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sluice_redis::testing::{RedisCluster, RedisServer, unique_prefix};
use sluice_test_support::wait::{eventually, eventually_within};
use sluice_test_support::{ServeProcess, free_addr, rules_file, spawn_listening};
use sluice_testing::metric;

const RULES: &str = "
domain: plans
descriptors:
  - key: tenant
    rate_limit: {name: per_tenant, unit: hour, requests_per_unit: 50}
";

/// How soon every instance must enforce a change made on one of them.
const WITHIN: Duration = Duration::from_secs(1);

fn start(rules: &Path, store: &str, prefix: &str) -> ServeProcess {
    ServeProcess::builder(env!("CARGO_BIN_EXE_sluice"))
        .args(["--store", store, "--store-prefix", prefix])
        .args(["--store-timeout-ms", "5000"])
        .config(rules)
        .start()
}

/// The limit `url` enforces on `tenant`, by a look that consumes nothing.
async fn limit(client: &reqwest::Client, url: &str, tenant: &str) -> u64 {
    let look = json!({"domain": "plans", "descriptors": [
        {"entries": [{"key": "tenant", "value": tenant}]}
    ]});
    sluice_testing::look(client, url, look).await["limit"]
        .as_u64()
        .unwrap()
}

async fn put(client: &reqwest::Client, url: &str, tenant: &str, body: Value) -> Value {
    let mut body = body;
    body["descriptor"] = json!([{"key": "tenant", "value": tenant}]);
    let r = client
        .put(format!("{url}/v1/overrides/plans"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let answer: Value = r.json().await.unwrap();
    assert_eq!(status, 200, "{answer}");
    answer
}

/// Waits until every one of `urls` enforces `expected` on `tenant`, at most `within`.
async fn all_enforce(
    client: &reqwest::Client,
    urls: &[String],
    tenant: &str,
    expected: u64,
    within: Duration,
) {
    for url in urls {
        eventually_within(
            &format!("{url} enforces {expected} on {tenant}"),
            within,
            || async move {
                let seen = limit(client, url, tenant).await;
                if seen == expected {
                    Ok(())
                } else {
                    Err(format!("limit {seen}"))
                }
            },
        )
        .await;
    }
}

/// `at` in RFC 3339, UTC, to the second.
fn rfc3339(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let days = i64::try_from(secs / 86_400).unwrap();
    let rem = secs % 86_400;
    // The civil date from days since 1970 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

async fn shared_overrides(store: &str) {
    let (rules, _dir) = rules_file("rules.yaml", RULES);
    let prefix = unique_prefix();
    let mut instances: Vec<ServeProcess> = (0..3).map(|_| start(&rules, store, &prefix)).collect();
    let urls: Vec<String> = instances
        .iter()
        .map(|i| format!("http://{}", i.http()))
        .collect();
    let client = sluice_testing::long_lived_client();
    assert_eq!(limit(&client, &urls[1], "acme").await, 50);

    // Set on the first, enforced by the other two within a second of the answer.
    let set = put(
        &client,
        &urls[0],
        "acme",
        json!({"rate_limit": {"unit": "hour", "requests_per_unit": 5000}}),
    )
    .await;
    let answered = Instant::now();
    assert_eq!(set["after"]["status"], "applied", "{set}");
    assert_eq!(set["scope"], "shared by every instance on the store");
    all_enforce(&client, &urls[1..], "acme", 5000, WITHIN).await;
    assert!(answered.elapsed() <= WITHIN, "{:?}", answered.elapsed());
    assert_eq!(limit(&client, &urls[0], "acme").await, 5000);
    assert_eq!(limit(&client, &urls[2], "beta").await, 50);
    let listed: Value = client
        .get(format!("{}/v1/overrides/plans", urls[2]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["overrides"][0]["set_by"], "127.0.0.1 (loopback)");
    assert_eq!(listed["overrides"][0]["rule"], "per_tenant");

    // A restarted instance enforces it from its first request.
    instances[2].terminate();
    instances[2] = start(&rules, store, &prefix);
    let restarted = format!("http://{}", instances[2].http());
    assert_eq!(limit(&client, &restarted, "acme").await, 5000);
    let urls = [urls[0].clone(), urls[1].clone(), restarted];

    // A reload of the rules keeps it; the rule's new limit holds for the others.
    std::fs::write(
        &rules,
        RULES.replace("requests_per_unit: 50", "requests_per_unit: 70"),
    )
    .unwrap();
    all_enforce(&client, &urls, "beta", 70, Duration::from_secs(20)).await;
    all_enforce(&client, &urls, "acme", 5000, WITHIN).await;

    // Concurrent PUTs from every instance: one value ends on all of them.
    let puts: Vec<_> = (0..12u64)
        .map(|i| {
            let (client, url) = (client.clone(), urls[(i % 3) as usize].clone());
            tokio::spawn(async move {
                let body = json!({"rate_limit": {"unit": "hour", "requests_per_unit": 1000 + i}});
                put(&client, &url, "acme", body).await
            })
        })
        .collect();
    for p in puts {
        p.await.unwrap();
    }
    let first = &urls[0];
    let settled = eventually("the instances agree on acme's limit", || async {
        let mut seen = Vec::new();
        for url in &urls {
            seen.push(limit(&client, url, "acme").await);
        }
        if seen.iter().all(|&s| s == seen[0]) && (1000..1012).contains(&seen[0]) {
            Ok(seen[0])
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await;
    let listed: Value = client
        .get(format!("{first}/v1/overrides/plans"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed["overrides"][0]["rate_limit"]["requests_per_unit"],
        settled
    );

    // An expiry a few seconds ahead: the rule's limit comes back on every instance.
    let expires = rfc3339(SystemTime::now() + Duration::from_secs(3));
    put(
        &client,
        &urls[1],
        "short",
        json!({"rate_limit": {"unit": "hour", "requests_per_unit": 900}, "expires": expires}),
    )
    .await;
    all_enforce(&client, &urls, "short", 900, WITHIN).await;
    all_enforce(&client, &urls, "short", 70, Duration::from_secs(20)).await;

    // Removed on one, gone from all.
    let r = client
        .delete(format!("{}/v1/overrides/plans", urls[2]))
        .json(&json!({"descriptor": [{"key": "tenant", "value": "acme"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    all_enforce(&client, &urls, "acme", 70, WITHIN).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_redis_share_overrides() {
    let redis = RedisServer::start();
    shared_overrides(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_a_cluster_share_overrides() {
    let cluster = RedisCluster::start();
    shared_overrides(&cluster.url()).await;
}

/// Sends `total` checks of `tenant` from 64 concurrent clients spread over `urls`; returns how
/// many were admitted, and how many answered neither 200 nor 429.
async fn send(client: &reqwest::Client, urls: &[String], tenant: &str, total: u64) -> (u64, u64) {
    let (ok, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let body = json!({"domain": "plans", "descriptors": [
        {"entries": [{"key": "tenant", "value": tenant}]}
    ]});
    let tasks: Vec<_> = (0..64u64)
        .map(|c| {
            let (client, body) = (client.clone(), body.clone());
            let (ok, errors) = (ok.clone(), errors.clone());
            let urls: Vec<String> = urls.iter().map(|u| format!("{u}/v1/check")).collect();
            tokio::spawn(async move {
                for i in (c..total).step_by(64) {
                    let url = &urls[usize::try_from(i).unwrap() % urls.len()];
                    match client.post(url).json(&body).send().await {
                        Ok(r) if r.status() == 200 => ok.fetch_add(1, Ordering::Relaxed),
                        Ok(r) if r.status() == 429 => 0,
                        _ => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (ok.load(Ordering::Relaxed), errors.load(Ordering::Relaxed))
}

/// A window that starts at its first request and lasts an hour: no count resets mid-test.
const HYBRID_RULES: &str = "
domain: plans
descriptors:
  - key: tenant
    rate_limit: {algorithm: fixed_window, alignment: first_request, requests_per_unit: 100, window: 1h}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hybrid_store_holds_an_override_within_five_percent() {
    let redis = RedisServer::start();
    let store = format!("hybrid+{}", redis.url());
    let (rules, _dir) = rules_file("rules.yaml", HYBRID_RULES);
    let prefix = unique_prefix();
    let instances: Vec<ServeProcess> = (0..3).map(|_| start(&rules, &store, &prefix)).collect();
    let urls: Vec<String> = instances
        .iter()
        .map(|i| format!("http://{}", i.http()))
        .collect();
    let client = sluice_testing::long_lived_client();
    for url in &urls {
        eventually("every instance counts three live instances", || async {
            metric(&client, url, "sluice_hybrid_instances").await == Some(3.0)
        })
        .await;
    }
    let (_, errors) = send(&client, &urls, "warm-up", 600).await;
    assert_eq!(errors, 0, "warm-up");

    put(
        &client,
        &urls[0],
        "acme",
        json!({"rate_limit": {"algorithm": "fixed_window", "alignment": "first_request",
            "requests_per_unit": 1000, "window": "1h"}}),
    )
    .await;
    all_enforce(&client, &urls, "acme", 1000, WITHIN).await;
    let (ok, errors) = send(&client, &urls, "acme", 1600).await;
    assert_eq!(errors, 0);
    println!("hybrid override of 1000: admitted {ok}");
    assert!(
        (950..=1050).contains(&ok),
        "admitted {ok} under an override of 1000, beyond 5%"
    );
    // The rule's limit holds for the others.
    let (ok, _) = send(&client, &urls, "beta", 400).await;
    assert!(
        (95..=105).contains(&ok),
        "admitted {ok} under the rule's 100"
    );
}

/// A rule that falls back to a local count when the store fails, so an instance cut off from
/// Redis still enforces a limit, and shows which.
const LOCAL_RULES: &str = "
domain: plans
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 50, on_store_error: local}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_cut_off_from_the_store_keeps_the_overrides_it_read_and_says_so() {
    let mut redis = RedisServer::start();
    let (rules, _dir) = rules_file("rules.yaml", LOCAL_RULES);
    let instance = start(&rules, &redis.url(), &unique_prefix());
    let url = format!("http://{}", instance.http());
    let client = sluice_testing::long_lived_client();
    put(
        &client,
        &url,
        "acme",
        json!({"rate_limit": {"unit": "hour", "requests_per_unit": 5000}}),
    )
    .await;
    let text = |path: &'static str| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let r = client.get(format!("{url}{path}")).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (status, ready) = text("/readyz").await;
    assert_eq!(status, 200);
    assert!(
        ready.contains("overrides: 1 set, shared through the store"),
        "{ready}"
    );

    redis.kill();
    eventually("the instance reports its overrides stale", || async {
        metric(&client, &url, "sluice_overrides_stale").await == Some(1.0)
    })
    .await;
    let (status, ready) = text("/readyz").await;
    assert_eq!(status, 503);
    assert!(ready.contains("as last read"), "{ready}");
    assert!(ready.contains("the store does not answer"), "{ready}");
    // The local fallback counts under the override it last read.
    assert_eq!(limit(&client, &url, "acme").await, 5000);
    assert_eq!(limit(&client, &url, "beta").await, 50);

    // Back empty (no persistence): the instance follows the store, which holds no override
    // now, and a new one is enforced although its version is lower than the one it held.
    redis.restart();
    eventually("the instance reads the store again", || async {
        metric(&client, &url, "sluice_overrides_stale").await == Some(0.0)
    })
    .await;
    all_enforce(&client, std::slice::from_ref(&url), "acme", 50, WITHIN).await;
    put(
        &client,
        &url,
        "acme",
        json!({"rate_limit": {"unit": "hour", "requests_per_unit": 700}}),
    )
    .await;
    assert_eq!(limit(&client, &url, "acme").await, 700);
}

/// `sluice proxy` follows the overrides its store shares, as `sluice serve` does: one set on a
/// `serve` instance of the same Redis is enforced by a gateway in front of a real upstream
/// within a second, and its deletion too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_follows_overrides_set_on_another_instance() {
    let redis = RedisServer::start();
    let prefix = unique_prefix();
    let (rules, _dir) = rules_file(
        "gateway.yaml",
        "domain: plans
descriptors:
  - key: tenant
    rate_limit: {name: per_tenant, unit: hour, requests_per_unit: 50}
routes:
  - path: /api/*
    descriptors: [[{key: tenant, from: 'header:x-tenant'}]]
",
    );
    let service = start(&rules, &redis.url(), &prefix);
    let service_url = format!("http://{}", service.http());
    let (upstream, listen) = (free_addr(), free_addr());
    let _upstream = spawn_listening(
        env!("CARGO_BIN_EXE_sluice"),
        &["bench", "upstream", "--listen", &upstream],
        &upstream,
    );
    let upstream_url = format!("http://{upstream}");
    let _gateway = spawn_listening(
        env!("CARGO_BIN_EXE_sluice"),
        &[
            "proxy",
            "--listen",
            &listen,
            "--upstream",
            &upstream_url,
            "--store",
            &redis.url(),
            "--store-prefix",
            &prefix,
            "--store-timeout-ms",
            "5000",
            "--config",
            rules.to_str().unwrap(),
        ],
        &listen,
    );
    let client = reqwest::Client::new();
    // The limit the gateway enforces on `tenant`, read from its RateLimit-Policy field.
    let gateway_limit = |tenant: &'static str| {
        let (client, listen) = (client.clone(), listen.clone());
        async move {
            let r = client
                .get(format!("http://{listen}/api/items"))
                .header("x-tenant", tenant)
                .send()
                .await
                .unwrap();
            let policy = r
                .headers()
                .get("ratelimit-policy")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            policy
                .split(';')
                .find_map(|p| p.trim().strip_prefix("q="))
                .and_then(|q| q.parse::<u64>().ok())
        }
    };
    assert_eq!(
        gateway_limit("acme").await,
        Some(50),
        "the rule's limit first"
    );
    put(
        &client,
        &service_url,
        "acme",
        json!({"rate_limit": {"unit": "hour", "requests_per_unit": 500}}),
    )
    .await;
    eventually_within(
        "the gateway enforces the override",
        WITHIN + Duration::from_millis(500),
        || {
            let look = gateway_limit("acme");
            async move { (look.await == Some(500)).then_some(()) }
        },
    )
    .await;
    let deleted = client
        .delete(format!("{service_url}/v1/overrides/plans"))
        .json(&json!({"descriptor": [{"key": "tenant", "value": "acme"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status().as_u16(), 200);
    eventually_within(
        "the gateway drops the deleted override",
        WITHIN + Duration::from_millis(500),
        || {
            let look = gateway_limit("acme");
            async move { (look.await == Some(50)).then_some(()) }
        },
    )
    .await;
}
