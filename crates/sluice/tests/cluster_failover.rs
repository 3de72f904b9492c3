//! A Redis Cluster master killed (SIGKILL) under steady load, and its replica promoted: a real
//! `sluice serve` on `redis+cluster://` keeps answering every request with a decision (the dead
//! master's keys fall to `on_store_error` until the replica takes over), and once the Cluster
//! has failed over, limits are exact again on the promoted replica. Real processes, a real
//! 3-master, 3-replica Cluster, real HTTP.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_redis::testing::{RedisCluster, unique_prefix};
use sluice_test_support::{ServeProcess, eventually, rules_file};

/// `load` never refuses while the test runs; `fresh` admits exactly 50 an hour.
const RULES: &str = "domain: failover
descriptors:
  - key: load
    rate_limit: {algorithm: fixed_window, alignment: first_request, requests_per_unit: 1000000, window: 1h}
  - key: fresh
    rate_limit: {algorithm: fixed_window, alignment: first_request, requests_per_unit: 50, window: 1h}
";

/// How long a silent node takes to be flagged as failing; a replica takes over about twice
/// that after its master dies.
const NODE_TIMEOUT: Duration = Duration::from_millis(1_000);

/// Where the load is in the failover, so answers can be counted by phase.
const BEFORE: usize = 0;
const MASTER_DOWN: usize = 1;
const PROMOTED: usize = 2;

fn body(key: &str, value: &str) -> Value {
    json!({"domain": "failover", "descriptors": [{"entries": [{"key": key, "value": value}]}]})
}

/// `count` values of `key` whose counters fall (`inside`) or do not fall in `slots`.
fn values_in(
    cluster: &RedisCluster,
    key: &str,
    slots: &[std::ops::RangeInclusive<u16>],
    inside: bool,
    count: usize,
) -> Vec<String> {
    (0..)
        .map(|i| format!("v{i}"))
        .filter(|v| {
            // Every key of a descriptor carries the hash tag `{domain|key=value}`.
            let slot = cluster.slot_of_key(&format!("{{failover|{key}={v}}}"));
            slots.iter().any(|r| r.contains(&slot)) == inside
        })
        .take(count)
        .collect()
}

async fn store_errors(client: &reqwest::Client, http: &str) -> u64 {
    counter(client, http, "sluice_store_errors_total").await
}

/// The value of the counter `name` on `/metrics`.
async fn counter(client: &reqwest::Client, http: &str, name: &str) -> u64 {
    let metrics = client
        .get(format!("{http}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
}

/// Answers by phase (when the answer came) and side (`0` for keys on the killed master,
/// `1` for keys elsewhere).
#[derive(Default)]
struct Answers {
    /// Decisions.
    answered: [[AtomicU64; 2]; 3],
    /// Of them, those the store failed and `on_store_error` (here `allow`) decided.
    fell_back: [[AtomicU64; 2]; 3],
}

impl Answers {
    fn answered(&self, phase: usize, side: usize) -> u64 {
        self.answered[phase][side].load(Ordering::Relaxed)
    }

    fn fell_back(&self, phase: usize, side: usize) -> u64 {
        self.fell_back[phase][side].load(Ordering::Relaxed)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_fails_over_while_every_request_is_answered() {
    let mut cluster = RedisCluster::start_with_replicas(NODE_TIMEOUT);
    let victim = (0..cluster.nodes.len())
        .find(|&i| cluster.is_master(i))
        .expect("a master");
    let replica = cluster
        .replica_of(victim)
        .expect("the master has a replica");
    let slots = cluster.slots_of(victim);
    assert!(!slots.is_empty(), "the master serves slots");
    let on_victim = values_in(&cluster, "load", &slots, true, 8);
    let elsewhere = values_in(&cluster, "load", &slots, false, 8);

    let (rules, _dir) = rules_file("rules.yaml", RULES);
    let serve = ServeProcess::builder(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "--store",
            &cluster.url(),
            "--store-prefix",
            &unique_prefix(),
        ])
        // Generous for a debug build on a busy machine: a call that timed out after Redis
        // counted it would make the exact counts below inexact. The dead master refuses
        // connections at once, so no call waits this out.
        .args(["--store-timeout-ms", "2000"])
        .config(&rules)
        .start();
    let http = format!("http://{}", serve.http());
    let client = sluice_testing::long_lived_client();

    // Steady load: 16 clients, each on one key, half of them on the master about to die.
    let phase = Arc::new(AtomicUsize::new(BEFORE));
    let stop = Arc::new(AtomicBool::new(false));
    let answers: Arc<Answers> = Arc::default();
    let load: Vec<_> = on_victim
        .iter()
        .map(|v| (v.clone(), 0))
        .chain(elsewhere.iter().map(|v| (v.clone(), 1)))
        .map(|(value, side)| {
            let (client, url) = (client.clone(), format!("{http}/v1/check"));
            let (phase, stop, answers) = (phase.clone(), stop.clone(), answers.clone());
            tokio::spawn(async move {
                let body = body("load", &value);
                // Bounded, in case the test fails before it stops the load.
                for _ in 0..1_000_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let r = client.post(&url).json(&body).send().await.unwrap();
                    let status = r.status().as_u16();
                    let text = r.text().await.unwrap();
                    assert!(
                        status == 200 || status == 429,
                        "an answer that is not a decision: {status} {text}"
                    );
                    let answer: Value = serde_json::from_str(&text).unwrap();
                    let outcome = &answer["descriptors"][0]["limits"][0]["outcome"];
                    // The phase is moved on before the kill and after the promotion, so an
                    // answer counted before the kill was given before it.
                    let came_in = phase.load(Ordering::Relaxed);
                    answers.answered[came_in][side].fetch_add(1, Ordering::Relaxed);
                    if outcome == "store_error" {
                        answers.fell_back[came_in][side].fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let answered = |p: usize, side: usize| answers.answered(p, side);
    eventually("the load runs on both sides", || async {
        answered(BEFORE, 0) > 100 && answered(BEFORE, 1) > 100
    })
    .await;
    let errors_before = store_errors(&client, &http).await;
    assert_eq!(errors_before, 0, "store errors before the kill");

    // SIGKILL, no goodbye; then wait for the Cluster to fail over, as Redis reports it.
    let killed = Instant::now();
    phase.store(MASTER_DOWN, Ordering::Relaxed);
    cluster.nodes[victim].kill();
    let live: Vec<usize> = (0..cluster.nodes.len()).filter(|&i| i != victim).collect();
    eventually(
        "the replica is promoted and the Cluster is ok again",
        || {
            let ok = cluster.is_master(replica)
                && live.iter().all(|&i| {
                    cluster.nodes[i]
                        .command(&["CLUSTER", "INFO"])
                        .is_some_and(|info| info.contains("cluster_state:ok"))
                });
            async move { ok }
        },
    )
    .await;
    let promoted = killed.elapsed();
    phase.store(PROMOTED, Ordering::Relaxed);
    assert_eq!(
        cluster.slots_of(replica),
        slots,
        "the replica took the dead master's slots"
    );
    eventually("the load runs on after the failover", || async {
        answered(PROMOTED, 0) > 100 && answered(PROMOTED, 1) > 100
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }

    // Answers continued while the master was down, on its keys as on the others'.
    let down = (answered(MASTER_DOWN, 0), answered(MASTER_DOWN, 1));
    assert!(down.0 > 0 && down.1 > 0, "answers while down: {down:?}");
    // The store finds the promoted replica: a call on its keys no longer fails.
    let probe = body("load", &on_victim[0]);
    eventually("calls on the dead master's slots succeed again", || {
        let (client, probe, http) = (client.clone(), probe.clone(), http.clone());
        async move {
            let before = store_errors(&client, &http).await;
            let r = client.post(format!("{http}/v1/check")).json(&probe);
            assert_eq!(r.send().await.unwrap().status().as_u16(), 200);
            store_errors(&client, &http).await == before
        }
    })
    .await;
    let recovered = killed.elapsed();
    let errors_after = store_errors(&client, &http).await;
    let total: u64 = (0..3)
        .flat_map(|p| [answers.answered(p, 0), answers.answered(p, 1)])
        .sum();
    let fell_back: Vec<(u64, u64)> = (0..3)
        .map(|p| (answers.fell_back(p, 0), answers.fell_back(p, 1)))
        .collect();
    eprintln!(
        "{total} answers, every one a decision; promoted {promoted:?} after the kill, the store \
         on it after {recovered:?}; answered while down {down:?} (the dead master's keys, the \
         others'); fell to on_store_error before/down/after {fell_back:?}; \
         sluice_store_errors_total +{}, of them short-circuited by the breaker {}",
        errors_after - errors_before,
        counter(&client, &http, "sluice_store_short_circuited_total").await
    );
    assert_eq!(fell_back[BEFORE], (0, 0), "store errors before the kill");

    // Exact limits again, on a fresh key on the promoted replica and on one elsewhere.
    let fresh_on_replica = values_in(&cluster, "fresh", &slots, true, 1).remove(0);
    let fresh_elsewhere = values_in(&cluster, "fresh", &slots, false, 1).remove(0);
    let fresh = [fresh_on_replica, fresh_elsewhere];
    // First a look at each at cost 0, which takes nothing, until the store answers it without
    // an error: each master has its own breaker and the store its own map of the masters, so a
    // slot the probe above did not touch may still be on its way to the promoted replica.
    for value in &fresh {
        let mut look = body("fresh", value);
        look["descriptors"][0]["cost"] = json!(0);
        eventually(&format!("calls on fresh={value} succeed"), || {
            let (client, look, http) = (client.clone(), look.clone(), http.clone());
            async move {
                let before = store_errors(&client, &http).await;
                let r = client.post(format!("{http}/v1/check")).json(&look);
                assert_eq!(r.send().await.unwrap().status().as_u16(), 200);
                store_errors(&client, &http).await == before
            }
        })
        .await;
    }
    let settled = store_errors(&client, &http).await;
    for value in fresh {
        let mut admitted = 0;
        for _ in 0..60 {
            let r = client
                .post(format!("{http}/v1/check"))
                .json(&body("fresh", &value))
                .send()
                .await
                .unwrap();
            match r.status().as_u16() {
                200 => admitted += 1,
                429 => {}
                other => panic!("unexpected status {other}: {}", r.text().await.unwrap()),
            }
        }
        assert_eq!(admitted, 50, "fresh={value}");
    }
    assert_eq!(
        store_errors(&client, &http).await,
        settled,
        "no call failed once the store found the promoted replica"
    );
}
