//! Concurrency limits across three `sluice serve` processes sharing one Redis or a real
//! 3-master Cluster: concurrent reservations over all instances hold exactly the limit's slots,
//! a settle on another instance frees one slot for exactly one more, and the slots of an
//! instance killed mid-request (SIGKILL) stay held until their ttl, by Redis's clock, and then
//! come back. The hybrid store refuses such a limit when it starts. Real processes, a real
//! `redis-server`, real HTTP.

mod instances;

use std::io::Read;
use std::process::{Command, Stdio};

use serde_json::json;
use sluice_redis::testing::{RedisCluster, RedisServer, redis_time_nanos, unique_prefix};
use sluice_test_support::{ServeProcess, Spawned, free_addr, rules_file, wait_until};

use instances::{body, post, remaining, reserve_from_all, start, three, until_redis_time, url};

/// `slots`: 10 in flight, held for an hour when nothing settles them, so none comes back while
/// a test runs. `crash`: 5 in flight, held for [`CRASH_TTL`] seconds.
const RULES: &str = r#"
domain: llm
descriptors:
  - key: slots
    rate_limit: {name: in_flight, concurrency: 10, ttl: 1h}
  - key: crash
    rate_limit: {name: in_flight, concurrency: 5, ttl: 3s}
"#;

/// The `crash` limit's ttl, in seconds: a reservation that takes its slot holds as long, and its
/// record answers 410 for a ttl and a second after that, before it is forgotten (404).
const CRASH_TTL: i64 = 3;
/// The `crash` limit's slots.
const CRASH_SLOTS: usize = 5;
const NANOS: i64 = 1_000_000_000;

/// A reservation of one on `crash` = `value` at `url`: the status and the reservation id.
async fn reserve_crash(client: &reqwest::Client, url: &str, value: &str) -> (u16, Option<String>) {
    let mut reserve = body("crash", value);
    reserve["amount"] = json!(1);
    let (status, r) = post(client, url, "/v1/reserve", &reserve).await;
    assert!(status == 200 || status == 429, "{status}: {r}");
    (status, r["reservation"].as_str().map(str::to_owned))
}

/// `victim` takes every slot of `crash` = `value` and is killed (SIGKILL) with them in flight;
/// the slots stay held, refusing reservations on the `survivors`, until their ttl has run out
/// by Redis's clock (on `port`), and then all come back; the victim's reservations expired with
/// them, so a late settle of one answers 410. False when the machine was too slow to show the
/// slots held: the ttl ran out before a survivor's reservation was answered, and it took a slot
/// (the caller tries again with a fresh value).
async fn crashed_slots_come_back(
    client: &reqwest::Client,
    survivors: &[String],
    victim: ServeProcess,
    port: u16,
    value: &str,
) -> bool {
    let at = url(&victim);
    // Every hold is taken at this time or later, so none has expired before `before + ttl`.
    let before = redis_time_nanos(port);
    let mut ids = Vec::new();
    for _ in 0..CRASH_SLOTS {
        let (status, id) = reserve_crash(client, &at, value).await;
        assert_eq!(status, 200, "the victim's reservation");
        ids.push(id.unwrap());
    }
    // Every hold and record was written before this: all have expired by `end`.
    let end = redis_time_nanos(port) + CRASH_TTL * NANOS;
    // Dropping a `ServeProcess` kills it by its PID with SIGKILL and reaps it: no settle, no
    // goodbye to the store.
    drop(victim);

    for url in survivors {
        match reserve_crash(client, url, value).await {
            (429, _) => {}
            (200, _) if redis_time_nanos(port) >= before + CRASH_TTL * NANOS => return false,
            (200, id) => panic!("{url}: a slot of the killed instance was free: {id:?}"),
            (status, _) => unreachable!("{status}"),
        }
    }

    until_redis_time(port, end).await;
    let (status, r) = post(
        client,
        &survivors[0],
        "/v1/settle",
        &json!({"reservation": ids[0], "used": 1}),
    )
    .await;
    assert_eq!(status, 410, "the killed instance's reservation: {r}");
    for i in 0..CRASH_SLOTS {
        let (status, _) = reserve_crash(client, &survivors[i % survivors.len()], value).await;
        assert_eq!(status, 200, "slot {i} after the ttl");
    }
    true
}

async fn slots_across_instances(store: &str, port: u16) {
    let (rules, _dir) = rules_file("rules.yaml", RULES);
    let prefix = unique_prefix();
    let (mut instances, urls) = three(&rules, store, &prefix);
    let client = sluice_testing::long_lived_client();

    // 150 concurrent reservations over three instances, against 10 slots: exactly 10 are in
    // flight, whatever the interleaving.
    let mut ids = reserve_from_all(&client, &urls, "slots").await;
    assert_eq!(ids.len(), 10, "admitted beyond the slots or short of them");
    for url in &urls {
        assert_eq!(remaining(&client, url, "slots", "acme").await, 0, "{url}");
    }

    // One settled on another instance than the one that took it frees one slot, for exactly
    // one of the next 150.
    let (i, id) = ids.remove(0);
    let settle = json!({"reservation": id, "used": 10});
    let (status, r) = post(&client, &urls[(i + 1) % 3], "/v1/settle", &settle).await;
    assert_eq!(status, 200, "{r}");
    for url in &urls {
        assert_eq!(remaining(&client, url, "slots", "acme").await, 1, "{url}");
    }
    let more = reserve_from_all(&client, &urls, "slots").await;
    assert_eq!(more.len(), 1, "a freed slot admitted {}", more.len());
    ids.extend(more);

    // Each settled on the next instance: every slot is free again, on every instance.
    for (i, id) in &ids {
        let settle = json!({"reservation": id, "used": 0});
        let (status, r) = post(&client, &urls[(i + 1) % 3], "/v1/settle", &settle).await;
        assert_eq!(status, 200, "{r}");
    }
    for url in &urls {
        assert_eq!(remaining(&client, url, "slots", "acme").await, 10, "{url}");
    }

    // The third instance is the first victim; should the machine be too slow to show its slots
    // held, a fresh one is started for a fresh value.
    let mut victim = instances.pop();
    for attempt in 0..3 {
        let v = victim
            .take()
            .unwrap_or_else(|| start(&rules, store, &prefix));
        let value = format!("crash-{attempt}");
        if crashed_slots_come_back(&client, &urls[..2], v, port, &value).await {
            return;
        }
    }
    panic!("three times the ttl ran out before the slots could be shown held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_redis_share_slots() {
    let redis = RedisServer::start();
    slots_across_instances(&redis.url(), redis.port).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_a_cluster_share_slots() {
    let cluster = RedisCluster::start();
    slots_across_instances(&cluster.url(), cluster.nodes[0].port).await;
}

/// The hybrid store cannot hold a concurrency limit (its syncs carry sums, not one hold per
/// request), so `sluice serve` on it refuses such rules at start, naming where the limit is
/// written and why.
#[test]
fn the_hybrid_store_refuses_a_concurrency_limit_at_start() {
    let redis = RedisServer::start();
    let (rules, _dir) = rules_file("rules.yaml", RULES);
    let store = format!("hybrid+{}", redis.url());
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command
        .arg("serve")
        .arg("--config")
        .arg(&rules)
        .args(["--store", &store])
        .args(["--http-addr", &free_addr(), "--grpc-addr", &free_addr()])
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut serve = Spawned::spawn(&mut command);
    let status = wait_until("sluice serve exits", || serve.0.try_wait().unwrap());
    assert!(!status.success());
    let mut stderr = String::new();
    serve
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let expected = format!(
        "{}:5:17: rule \"in_flight\" cannot be held by the hybrid store: concurrency_limit \
         (one hold per request in flight",
        rules.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
}
