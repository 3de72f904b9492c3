//! The Redis store on a 3-master Redis Cluster: the shared backend suite, requests whose checks
//! fall in different slots and on different masters, and a master that dies and comes back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::{BreakerState, Check, Policy, Rate, Store, StoreError, TokenBucket};
use sluice_redis::RedisStore;
use sluice_redis::testing::{
    RedisCluster, cluster_backend, fifty_per_hour, name, offset_to_window_start, shared_cluster,
    test_options,
};
use sluice_test_support::eventually_within;

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

/// Of the three masters of `cluster` (one without replicas), the one that serves the counter
/// `identity` of `store`.
fn master_of(cluster: &RedisCluster, store: &RedisStore, identity: &str) -> usize {
    let slot = store.slot_of(identity);
    (0..3)
        .find(|&i| master_slots(cluster, i).iter().any(|r| r.contains(&slot)))
        .expect("a master serves every slot")
}

/// The slots of master `i` as it said the first time it was asked, so that they are known
/// while it is down.
fn master_slots(cluster: &RedisCluster, i: usize) -> Vec<std::ops::RangeInclusive<u16>> {
    type Known = Vec<(u16, Vec<std::ops::RangeInclusive<u16>>)>;
    static KNOWN: std::sync::Mutex<Known> = std::sync::Mutex::new(Vec::new());
    let port = cluster.nodes[i].port;
    let mut known = KNOWN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, slots)) = known.iter().find(|(p, _)| *p == port) {
        return slots.clone();
    }
    let slots = cluster.slots_of(i);
    known.push((port, slots.clone()));
    slots
}

/// `count[i]` identities starting with `base` on master `i`, each in a slot of its own.
fn spread(
    cluster: &RedisCluster,
    store: &RedisStore,
    base: &str,
    count: [usize; 3],
) -> Vec<String> {
    let mut found = [0; 3];
    let mut slots = Vec::new();
    let mut ids = Vec::new();
    for n in 0.. {
        if found == count {
            break;
        }
        let id = format!("{base}:{n}");
        let (slot, master) = (store.slot_of(&id), master_of(cluster, store, &id));
        if found[master] < count[master] && !slots.contains(&slot) {
            found[master] += 1;
            slots.push(slot);
            ids.push(id);
        }
    }
    ids
}

/// Of node `node`, by one `INFO`: the `EVALSHA` calls it ran, and the reads it made from its
/// clients' sockets (`total_reads_processed`).
fn evalshas_and_reads(cluster: &RedisCluster, node: usize) -> (u64, u64) {
    let info = cluster.nodes[node]
        .command(&["INFO", "stats", "commandstats"])
        .expect("INFO answers");
    let field = |line: &str, field: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(line))
            .and_then(|rest| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(field))
                    .map(|v| v.trim().parse::<u64>().expect("a count"))
            })
            .unwrap_or(0)
    };
    (
        field("cmdstat_evalsha:", "calls="),
        field("total_reads_processed:", ""),
    )
}

/// The round trips the store counts to node `node`, a master.
fn round_trips(cluster: &RedisCluster, store: &RedisStore, node: usize) -> u64 {
    let address = format!("127.0.0.1:{}", cluster.nodes[node].port);
    store
        .masters()
        .into_iter()
        .find(|m| m.address == address)
        .map(|m| m.round_trips)
        .expect("the store knows every master")
}

/// A request of five descriptors whose counters fall in five slots on the three masters (two,
/// two and one) is one pipeline per master, sent together: each master reads it in one read
/// and runs its slots' scripts, and the store counts one round trip to each.
#[tokio::test]
async fn a_request_on_three_masters_is_one_round_trip_per_master() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&cluster.url(), test_options())
        .await
        .unwrap();
    let per_master = [2, 2, 1];
    let ids = spread(&cluster, &store, "trips", per_master);
    let policy = Policy::from(TokenBucket::new(100, Rate::per_minute(1)).unwrap());
    let checks: Vec<Check<'_>> = ids.iter().map(|id| Check::new(id, &policy, 1)).collect();
    // The first request loads the script on every master, so the one measured is all EVALSHA.
    let first = store.check(&checks).await.unwrap();
    assert!(first.iter().all(|d| d.allowed));

    let trips = |i: usize| round_trips(&cluster, &store, i);
    let before: Vec<_> = (0..3)
        .map(|i| (trips(i), evalshas_and_reads(&cluster, i)))
        .collect();
    // Asking costs reads of its own (`redis-cli` connecting, asking, closing): as many as this
    // second asking, with no request between, shows.
    let idle: Vec<_> = (0..3).map(|i| evalshas_and_reads(&cluster, i)).collect();
    let decisions = store.check(&checks).await.unwrap();
    assert!(decisions.iter().all(|d| d.allowed && d.remaining == 98));
    for (i, (trips_before, (calls_before, reads_before))) in before.into_iter().enumerate() {
        assert_eq!(trips(i) - trips_before, 1, "round trips to master {i}");
        let (calls, reads) = evalshas_and_reads(&cluster, i);
        assert_eq!(
            calls - calls_before,
            per_master[i] as u64,
            "one script per slot on master {i}"
        );
        let asking = idle[i].1 - reads_before;
        assert_eq!(
            reads - idle[i].1 - asking,
            1,
            "reads of the request on master {i}"
        );
    }
}

/// Concurrent requests whose keys live on one master share its pipeline: their calls, queued
/// before the master's batch task runs, leave together, so the master reads 32 requests in a
/// few reads, and each request is still decided exactly and counted as its own round trip.
#[tokio::test]
async fn concurrent_requests_to_one_master_share_its_writes() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&cluster.url(), test_options())
        .await
        .unwrap();
    let mut ids = spread(&cluster, &store, "shared", [33, 0, 0]);
    let policy = Policy::from(TokenBucket::new(100, Rate::per_minute(1)).unwrap());
    // Loads the script on the master, so the requests measured are all EVALSHA.
    let warm = ids.pop().unwrap();
    store.check(&[Check::new(&warm, &policy, 1)]).await.unwrap();
    let trips = || round_trips(&cluster, &store, 0);
    let (trips_before, (calls_before, reads_before)) = (trips(), evalshas_and_reads(&cluster, 0));
    // Asking costs reads of its own: as many as a second asking with no request between shows.
    let asking = evalshas_and_reads(&cluster, 0).1 - reads_before;
    let decisions = futures_util::future::join_all(
        ids.iter()
            .map(|id| async { store.check(&[Check::new(id, &policy, 1)]).await }),
    )
    .await;
    for d in decisions {
        let d = d.expect("decided");
        assert!(d[0].allowed && d[0].remaining == 99, "{d:?}");
    }
    let (calls, reads) = evalshas_and_reads(&cluster, 0);
    assert_eq!(calls - calls_before, 32, "one script per request");
    let reads = reads - reads_before - 2 * asking;
    assert!(reads <= 4, "the master read 32 requests in {reads} reads");
    assert_eq!(
        trips() - trips_before,
        32,
        "a round trip counted per request"
    );
}

/// A master's shared batch task runs on the runtime that connected, whichever runtime makes the
/// first call to it: a first request from a single-threaded runtime that then stops (as a
/// worker's may) leaves every master working for the runtime that connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_call_from_a_runtime_that_stops_leaves_the_masters_working() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&cluster.url(), test_options())
        .await
        .unwrap();
    let ids = spread(&cluster, &store, "home", [1, 1, 1]);
    let policy = Policy::from(TokenBucket::new(100, Rate::per_minute(1)).unwrap());
    let (first_store, first_ids, first_policy) = (store.clone(), ids.clone(), policy.clone());
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let checks: Vec<Check<'_>> = first_ids
            .iter()
            .map(|id| Check::new(id, &first_policy, 1))
            .collect();
        let first = runtime.block_on(first_store.check(&checks)).unwrap();
        assert!(first.iter().all(|d| d.allowed));
    })
    .await
    .unwrap();
    // That runtime has stopped; this one's requests still reach every master.
    let checks: Vec<Check<'_>> = ids.iter().map(|id| Check::new(id, &policy, 1)).collect();
    let decisions = store
        .check(&checks)
        .await
        .expect("decided after the runtime stopped");
    assert!(decisions.iter().all(|d| d.allowed && d.remaining == 98));
}

/// A master killed (SIGKILL) on a Cluster that serves the slots it still covers: the keys of the
/// two others are decided exactly throughout, with no store error; the dead master's keys fail
/// until its own breaker opens, then at once. A request that needs the dead master fails at once
/// and consumes nothing on the others. Restarted, the master's breaker closes again and its keys
/// are decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_fails_only_its_own_keys() {
    let mut cluster = RedisCluster::start();
    for node in &cluster.nodes {
        node.command(&["CONFIG", "SET", "cluster-require-full-coverage", "no"])
            .expect("CONFIG SET answers");
    }
    let options = test_options().breaker_cool_down(Duration::from_millis(200));
    let store = RedisStore::connect(&cluster.url(), options).await.unwrap();
    let policy = fifty_per_hour().remove(0); // token bucket: no window to cross
    let on = spread(&cluster, &store, "down", [1, 1, 1]);
    let on_master: Vec<usize> = on
        .iter()
        .map(|id| master_of(&cluster, &store, id))
        .collect();
    let (dead, healthy) = (on_master[0], [on_master[1], on_master[2]]);
    for id in &on {
        assert!(store.check(&[Check::new(id, &policy, 1)]).await.unwrap()[0].allowed);
    }

    cluster.nodes[dead].kill();
    let mut failures = 0;
    loop {
        match store.check(&[Check::new(&on[0], &policy, 1)]).await {
            Err(StoreError::Unavailable(m)) if m.contains("circuit breaker") => break,
            Err(_) => failures += 1,
            Ok(d) => panic!("a dead master decided: {d:?}"),
        }
        assert!(failures < 100, "the dead master's breaker never opened");
    }
    let dead_address = format!("127.0.0.1:{}", cluster.nodes[dead].port);
    for m in store.masters() {
        let open = m.address == dead_address;
        assert_eq!(m.breaker == BreakerState::Open, open, "{m:?}");
    }
    assert_eq!(
        store.breaker_state(),
        BreakerState::Open,
        "open while any master's is"
    );

    // The two healthy masters' keys: exact, with no error.
    for (id, master) in on[1..].iter().zip(healthy) {
        let mut admitted = 1;
        for _ in 0..60 {
            let d = store.check(&[Check::new(id, &policy, 1)]).await;
            admitted += u32::from(d.unwrap_or_else(|e| panic!("master {master}: {e}"))[0].allowed);
        }
        assert_eq!(admitted, 50, "master {master}");
    }
    // A request that needs the dead master and a healthy one: refused at once, and the healthy
    // one consumes nothing.
    let fresh = spread(&cluster, &store, "fresh", {
        let mut c = [0; 3];
        c[healthy[0]] = 1;
        c
    })
    .remove(0);
    let both = [
        Check::new(&fresh, &policy, 1),
        Check::new(&on[0], &policy, 1),
    ];
    assert!(matches!(
        store.check(&both).await,
        Err(StoreError::Unavailable(_))
    ));
    assert_eq!(store.peek(&fresh, &policy).await.unwrap().remaining, 50);

    // Back, empty: its breaker probes, closes, and its keys are decided again.
    cluster.nodes[dead].restart();
    let decided = eventually_within(
        "the restarted master decides",
        Duration::from_secs(60),
        || {
            let (store, id, policy) = (&store, &on[0], &policy);
            async move { store.check(&[Check::new(id, policy, 1)]).await.ok() }
        },
    )
    .await;
    assert!(decided[0].allowed, "a restarted master starts afresh");
    assert!(
        store
            .masters()
            .iter()
            .all(|m| m.breaker == BreakerState::Closed),
        "{:?}",
        store.masters()
    );
    assert_eq!(store.breaker_state(), BreakerState::Closed);
}

/// A master killed and its replica promoted, on a Cluster that serves the slots it still covers:
/// the store's map follows the promotion, so the dead master's keys are decided again on the
/// replica, under a breaker of the replica's own, while another master's key is decided without
/// an error throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breakers_follow_a_failover() {
    let mut cluster = RedisCluster::start_with_replicas(Duration::from_millis(1_000));
    for node in &cluster.nodes {
        node.command(&["CONFIG", "SET", "cluster-require-full-coverage", "no"])
            .expect("CONFIG SET answers");
    }
    let options = test_options().breaker_cool_down(Duration::from_millis(200));
    let store = RedisStore::connect(&cluster.url(), options).await.unwrap();
    let victim = (0..cluster.nodes.len())
        .find(|&i| cluster.is_master(i))
        .expect("a master");
    let replica = cluster
        .replica_of(victim)
        .expect("the master has a replica");
    let slots = cluster.slots_of(victim);
    let on_victim = |inside: bool| {
        (0..)
            .map(|n| format!("failover:{inside}:{n}"))
            .find(|id| slots.iter().any(|r| r.contains(&store.slot_of(id))) == inside)
            .expect("an identity")
    };
    let (dead_key, live_key) = (on_victim(true), on_victim(false));
    let policy = fifty_per_hour().remove(0);
    let check = |id: &str| {
        let (store, policy, id) = (store.clone(), policy.clone(), id.to_owned());
        async move { store.check(&[Check::new(&id, &policy, 1)]).await }
    };
    assert!(check(&dead_key).await.unwrap()[0].allowed);
    let live_admitted = AtomicU64::new(u64::from(check(&live_key).await.unwrap()[0].allowed));

    cluster.nodes[victim].kill();
    let replica_address = format!("127.0.0.1:{}", cluster.nodes[replica].port);
    eventually_within(
        "the dead master's keys are decided on the promoted replica",
        Duration::from_secs(60),
        || {
            let (dead, live, admitted) = (check(&dead_key), check(&live_key), &live_admitted);
            async move {
                let live = live.await.expect("another master's key never fails");
                admitted.fetch_add(u64::from(live[0].allowed), Ordering::Relaxed);
                dead.await.ok()
            }
        },
    )
    .await;
    let masters = store.masters();
    assert!(
        masters.iter().any(|m| m.address == replica_address)
            && masters.iter().all(|m| m.breaker == BreakerState::Closed),
        "{masters:?}"
    );
    assert!(
        !masters
            .iter()
            .any(|m| m.address == format!("127.0.0.1:{}", cluster.nodes[victim].port)),
        "the dead master left the map: {masters:?}"
    );
    assert!(live_admitted.load(Ordering::Relaxed) <= 50);
}
