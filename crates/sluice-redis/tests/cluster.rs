//! The Redis store on a 3-master Redis Cluster: the shared backend suite, and requests whose
//! checks fall in different slots.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::{Check, Policy, Rate, Store, TokenBucket};
use sluice_redis::RedisStore;
use sluice_redis::testing::{
    cluster_backend, fifty_per_hour, name, offset_to_window_start, shared_cluster, test_options,
};

sluice_core::backend_suite!(cluster_backend());

/// Two identities whose counters fall in different slots.
fn two_slots(store: &RedisStore, base: &str) -> (String, String) {
    let a = format!("{base}:a");
    let b = (0..)
        .map(|i| format!("{base}:b{i}"))
        .find(|b| store.slot_of(b) != store.slot_of(&a))
        .expect("some identity lands elsewhere");
    (a, b)
}

async fn cluster_store() -> RedisStore {
    let cluster = shared_cluster();
    let store = RedisStore::connect(&cluster.url(), test_options())
        .await
        .unwrap();
    store.set_time_offset(offset_to_window_start(
        cluster.nodes[0].port,
        Duration::from_secs(3600),
    ));
    store
}

/// 64 concurrent clients send requests with a tight limit in one slot and a loose one in
/// another. Exactly the tight limit gets through, and the loose counter, after the refunds of
/// every refused request, has consumed exactly as many: all-or-nothing across slots, for every
/// algorithm on either side.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_spanning_slots_stay_all_or_nothing() {
    let store = cluster_store().await;
    let loose = Arc::new(Policy::from(
        TokenBucket::new(1_000, Rate::per_minute(1)).unwrap(),
    ));
    for tight in fifty_per_hour() {
        let tight = Arc::new(tight);
        let (a, b) = two_slots(&store, &format!("span:{}", name(&tight)));
        let (a, b) = (Arc::new(a), Arc::new(b));
        let clients: Vec<_> = (0..64)
            .map(|i| {
                let (store, tight, loose) = (store.clone(), tight.clone(), loose.clone());
                let (a, b) = (a.clone(), b.clone());
                tokio::spawn(async move {
                    let mut admitted = 0;
                    for _ in 0..2 {
                        let checks = [Check::new(&a, &tight, 1), Check::new(&b, &loose, 1)];
                        let ds = if i % 2 == 0 {
                            store.check(&checks).await.unwrap()
                        } else {
                            store.check(&[checks[1], checks[0]]).await.unwrap()
                        };
                        admitted += u32::from(ds.iter().all(|d| d.allowed));
                    }
                    admitted
                })
            })
            .collect();
        let mut admitted = 0;
        for c in clients {
            admitted += c.await.unwrap();
        }
        assert_eq!(admitted, 50, "{}", name(&tight));
        let left = store.peek(&b, &loose).await.unwrap();
        assert_eq!(
            left.remaining,
            1_000 - 50,
            "{}: refunds are exact",
            name(&tight)
        );
        assert_eq!(store.stats().refund_failures, 0);
    }
    assert!(
        store.stats().refunds > 0,
        "the refused requests were refunded"
    );
}

/// The same with the loose limit under every algorithm, so that every algorithm's refund is
/// exercised: the refused requests give back exactly what they reserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_algorithm_refunds_exactly() {
    let store = cluster_store().await;
    let tight = Policy::from(TokenBucket::new(5, Rate::per_minute(1)).unwrap());
    for loose in fifty_per_hour() {
        let (a, b) = two_slots(&store, &format!("refund:{}", name(&loose)));
        let mut admitted = 0;
        for _ in 0..20 {
            let ds = store
                .check(&[Check::new(&b, &loose, 1), Check::new(&a, &tight, 1)])
                .await
                .unwrap();
            admitted += u32::from(ds.iter().all(|d| d.allowed));
        }
        assert_eq!(admitted, 5, "{}", name(&loose));
        let left = store.peek(&b, &loose).await.unwrap();
        assert_eq!(left.remaining, 45, "{}", name(&loose));
        // A cost above the loose capacity is refused there and refunds the tight one.
        let ds = store
            .check(&[Check::new(&b, &loose, 51), Check::new(&a, &tight, 0)])
            .await
            .unwrap();
        assert!(ds[0].is_permanent_denial(), "{}", name(&loose));
    }
}

/// Exactness across instances on the Cluster: three stores, 64 clients, one key per algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_sharing_the_cluster_admit_exactly_the_limit() {
    let cluster = shared_cluster();
    let offset = offset_to_window_start(cluster.nodes[0].port, Duration::from_secs(3600));
    let options = test_options();
    let mut stores = Vec::new();
    for _ in 0..3 {
        let s = RedisStore::connect(&cluster.url(), options.clone())
            .await
            .unwrap();
        s.set_time_offset(offset);
        stores.push(s);
    }
    for policy in fifty_per_hour() {
        let policy = Arc::new(policy);
        let key = Arc::new(format!("instances:{}", name(&policy)));
        let clients: Vec<_> = (0..64)
            .map(|i| {
                let (store, policy, key) = (stores[i % 3].clone(), policy.clone(), key.clone());
                tokio::spawn(async move {
                    let mut admitted = 0;
                    for _ in 0..2 {
                        let d = store.check(&[Check::new(&key, &policy, 1)]).await.unwrap();
                        admitted += u32::from(d[0].allowed);
                    }
                    admitted
                })
            })
            .collect();
        let mut admitted = 0;
        for c in clients {
            admitted += c.await.unwrap();
        }
        assert_eq!(admitted, 50, "{}", name(&policy));
    }
}

/// `SCRIPT FLUSH` on every master while requests run: the store reloads its scripts on
/// `NOSCRIPT` without a single error, and limits stay exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_flush_on_every_node_under_load_causes_no_errors() {
    let cluster = shared_cluster();
    let store = cluster_store().await;
    let policy = Arc::new(fifty_per_hour().remove(5)); // sliding log, the longest script path
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..16)
        .map(|i| {
            let (store, policy, errors) = (store.clone(), policy.clone(), errors.clone());
            tokio::spawn(async move {
                let mut admitted = 0;
                for n in 0..40 {
                    let key = format!("flush:{}", (i + n) % 4);
                    match store.check(&[Check::new(&key, &policy, 1)]).await {
                        Ok(d) => admitted += u32::from(d[0].allowed),
                        Err(e) => {
                            eprintln!("{e}");
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                admitted
            })
        })
        .collect();
    let flusher = {
        let stop = stop.clone();
        let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
        tokio::task::spawn_blocking(move || {
            let mut flushes = 0;
            while !stop.load(Ordering::Relaxed) && flushes < 200 {
                for port in &ports {
                    let _ = std::process::Command::new("redis-cli")
                        .args(["-p", &port.to_string(), "SCRIPT", "FLUSH"])
                        .output();
                }
                flushes += 1;
            }
            flushes
        })
    };
    let mut admitted = 0;
    for c in clients {
        admitted += c.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(flusher.await.unwrap() > 0);
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    assert_eq!(admitted, 4 * 50, "four keys, fifty each");
}
