//! Reservations on Redis, standalone and on a 3-master Cluster: reserve then settle gives back
//! exactly what was not used or charges what was used beyond, once, from any instance sharing
//! the store, and only before the ttl ends; `Store::refund` gives back to the current window,
//! never past the limit.

use std::time::Duration;

use sluice_core::{
    BucketedWindow, Check, Decision, Lease, Policy, Refund, ReservationId, Settlement, SlidingLog,
    Store, Timestamp,
};
use sluice_redis::RedisStore;
use sluice_redis::testing::{
    fifty_per_hour, name, offset_to_window_start, shared_cluster, shared_server, test_options,
};

const HOUR: Duration = Duration::from_secs(3600);
const MINUTE: Duration = Duration::from_secs(60);

/// Where the stores of a test run.
#[derive(Clone, Copy, Debug)]
enum Topology {
    Standalone,
    Cluster,
}

/// `count` stores on one Redis (or the Cluster) under one prefix, as many instances sharing it,
/// their time 20 ms into an hour of Redis time, so that no hourly window ends mid-test.
async fn stores(topology: Topology, count: usize) -> Vec<RedisStore> {
    let (url, port) = match topology {
        Topology::Standalone => (shared_server().url(), shared_server().port),
        Topology::Cluster => (shared_cluster().url(), shared_cluster().nodes[0].port),
    };
    let options = test_options();
    let offset = offset_to_window_start(port, HOUR);
    let mut stores = Vec::new();
    for _ in 0..count {
        let store = RedisStore::connect(&url, options.clone()).await.unwrap();
        store.set_time_offset(offset);
        stores.push(store);
    }
    stores
}

async fn store(topology: Topology) -> RedisStore {
    stores(topology, 1).await.remove(0)
}

fn lease(id: &ReservationId) -> Lease<'_> {
    Lease { id, ttl: MINUTE }
}

/// [`fifty_per_hour`] less the concurrency limit, whose settle releases its hold whatever was
/// used rather than refunding or charging the difference: `tests/concurrency_limit.rs` holds it.
fn usage_policies() -> Vec<Policy> {
    fifty_per_hour()
        .into_iter()
        .filter(|p| !p.concurrent())
        .collect()
}

async fn remaining(store: &RedisStore, key: &str, policy: &Policy) -> u64 {
    store.peek(key, policy).await.unwrap().remaining
}

async fn reserve(store: &RedisStore, key: &str, policy: &Policy, cost: u64) -> ReservationId {
    let id = ReservationId::random();
    let ds = store
        .reserve(&[Check::new(key, policy, cost)], lease(&id))
        .await
        .unwrap();
    assert!(ds[0].allowed, "{}: {:?}", name(policy), ds[0]);
    id
}

/// Settling at less than reserved gives back exactly the rest, for every algorithm.
async fn settling_below_the_reservation_gives_back_the_rest(topology: Topology) {
    let store = store(topology).await;
    for policy in usage_policies() {
        let key = format!("under:{}", name(&policy));
        let full = remaining(&store, &key, &policy).await;
        let id = reserve(&store, &key, &policy, 10).await;
        assert_eq!(remaining(&store, &key, &policy).await, full - 10);
        let settled = store.settle(&id, 3).await.unwrap();
        assert_eq!(
            settled,
            Settlement::Settled {
                reserved: 10,
                refunded: 7,
                charged: 0
            },
            "{}",
            name(&policy)
        );
        assert_eq!(
            remaining(&store, &key, &policy).await,
            full - 3,
            "{}: the 7 unused units came back",
            name(&policy)
        );
    }
}

#[tokio::test]
async fn standalone_settling_below_the_reservation_gives_back_the_rest() {
    settling_below_the_reservation_gives_back_the_rest(Topology::Standalone).await;
}

#[tokio::test]
async fn cluster_settling_below_the_reservation_gives_back_the_rest() {
    settling_below_the_reservation_gives_back_the_rest(Topology::Cluster).await;
}

/// Settling at more than reserved charges the excess past the limit: the next request is
/// refused, for every algorithm.
async fn settling_above_the_reservation_charges_past_the_limit(topology: Topology) {
    let store = store(topology).await;
    for policy in usage_policies() {
        let key = format!("over:{}", name(&policy));
        let id = reserve(&store, &key, &policy, 10).await;
        let settled = store.settle(&id, 60).await.unwrap();
        assert_eq!(
            settled,
            Settlement::Settled {
                reserved: 10,
                refunded: 0,
                charged: 50
            },
            "{}",
            name(&policy)
        );
        let d = store.check(&[Check::new(&key, &policy, 1)]).await.unwrap();
        assert!(!d[0].allowed, "{}: refused after the charge", name(&policy));
        assert_eq!(d[0].remaining, 0, "{}", name(&policy));
        assert!(
            d[0].retry_after > Duration::ZERO,
            "{}: {:?}",
            name(&policy),
            d[0]
        );
        if let Topology::Standalone = topology {
            // The key lives until the counter is full again, as after a check, and no longer.
            let pttl: u64 = shared_server()
                .command(&["PTTL", &store.key_of(&key)])
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let bound = d[0].reset_after.as_millis() as u64 + 1_001;
            assert!(
                pttl + 1_000 >= bound && pttl <= bound,
                "{}: {pttl} ms for {bound} ms",
                name(&policy)
            );
        }
    }
}

#[tokio::test]
async fn standalone_settling_above_the_reservation_charges_past_the_limit() {
    settling_above_the_reservation_charges_past_the_limit(Topology::Standalone).await;
}

#[tokio::test]
async fn cluster_settling_above_the_reservation_charges_past_the_limit() {
    settling_above_the_reservation_charges_past_the_limit(Topology::Cluster).await;
}

/// A token bucket charged beyond what it holds is in debt: it earns no token until its refill
/// has paid the debt, then refills as before.
#[tokio::test]
async fn a_token_bucket_pays_its_debt_before_it_refills() {
    let store = store(Topology::Standalone).await;
    let policy = fifty_per_hour().remove(0); // 50, one a minute
    let id = reserve(&store, "debt", &policy, 50).await;
    store.settle(&id, 53).await.unwrap();
    // Three tokens owed take three minutes to pay; the first token comes a minute later.
    store.advance_time(3 * MINUTE + Duration::from_secs(30));
    assert_eq!(remaining(&store, "debt", &policy).await, 0);
    store.advance_time(MINUTE);
    assert_eq!(remaining(&store, "debt", &policy).await, 1);
}

/// A second settle changes nothing and says so; so does a settle after the ttl, and an id the
/// store never saw is unknown.
#[tokio::test]
async fn only_the_first_settle_of_a_live_reservation_counts() {
    let store = store(Topology::Standalone).await;
    for policy in usage_policies() {
        let key = format!("once:{}", name(&policy));
        let id = reserve(&store, &key, &policy, 10).await;
        assert!(matches!(
            store.settle(&id, 3).await.unwrap(),
            Settlement::Settled { .. }
        ));
        let after = remaining(&store, &key, &policy).await;
        assert_eq!(
            store.settle(&id, 0).await.unwrap(),
            Settlement::AlreadySettled,
            "{}",
            name(&policy)
        );
        assert_eq!(
            store.settle(&id, 20).await.unwrap(),
            Settlement::AlreadySettled
        );
        assert_eq!(
            remaining(&store, &key, &policy).await,
            after,
            "{}",
            name(&policy)
        );
    }
    assert_eq!(
        store.settle(&ReservationId::random(), 1).await.unwrap(),
        Settlement::Unknown
    );
}

/// A reservation not settled within its ttl counts as used in full: a settle after it answers
/// Expired and gives nothing back, on the store's own time.
#[tokio::test]
async fn a_settle_after_the_ttl_is_expired_and_changes_nothing() {
    let store = store(Topology::Standalone).await;
    for policy in usage_policies() {
        let key = format!("late:{}", name(&policy));
        let id = ReservationId::random();
        let ttl = Duration::from_secs(1);
        let ds = store
            .reserve(&[Check::new(&key, &policy, 10)], Lease { id: &id, ttl })
            .await
            .unwrap();
        assert!(ds[0].allowed);
        store.advance_time(ttl);
        let before = remaining(&store, &key, &policy).await;
        assert_eq!(
            store.settle(&id, 0).await.unwrap(),
            Settlement::Expired,
            "{}",
            name(&policy)
        );
        assert_eq!(store.settle(&id, 0).await.unwrap(), Settlement::Expired);
        assert_eq!(
            remaining(&store, &key, &policy).await,
            before,
            "{}",
            name(&policy)
        );
    }
}

/// A reservation made through one instance is settled through another on the same Redis.
async fn another_instance_settles(topology: Topology) {
    let stores = stores(topology, 2).await;
    for policy in usage_policies() {
        let key = format!("across:{}", name(&policy));
        let full = remaining(&stores[1], &key, &policy).await;
        let id = reserve(&stores[0], &key, &policy, 10).await;
        assert_eq!(
            stores[1].settle(&id, 4).await.unwrap(),
            Settlement::Settled {
                reserved: 10,
                refunded: 6,
                charged: 0
            }
        );
        assert_eq!(
            stores[0].settle(&id, 4).await.unwrap(),
            Settlement::AlreadySettled
        );
        assert_eq!(
            remaining(&stores[0], &key, &policy).await,
            full - 4,
            "{}",
            name(&policy)
        );
    }
}

#[tokio::test]
async fn standalone_another_instance_settles() {
    another_instance_settles(Topology::Standalone).await;
}

#[tokio::test]
async fn cluster_another_instance_settles() {
    another_instance_settles(Topology::Cluster).await;
}

/// Two instances settle the same reservations at once: each is settled once, and its counter
/// gets back exactly one refund.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_settles_from_two_instances_refund_once() {
    let stores = stores(Topology::Standalone, 2).await;
    let policy = fifty_per_hour().remove(3); // fixed window from the first request
    let key = "race";
    let full = remaining(&stores[0], key, &policy).await;
    for _ in 0..10 {
        let id = reserve(&stores[0], key, &policy, 5).await;
        let (a, b) = tokio::join!(
            tokio::spawn({
                let store = stores[0].clone();
                async move { store.settle(&id, 1).await.unwrap() }
            }),
            tokio::spawn({
                let store = stores[1].clone();
                async move { store.settle(&id, 1).await.unwrap() }
            }),
        );
        let mut outcomes = [a.unwrap(), b.unwrap()];
        outcomes.sort_by_key(|s| matches!(s, Settlement::AlreadySettled));
        assert!(matches!(
            outcomes[0],
            Settlement::Settled { refunded: 4, .. }
        ));
        assert_eq!(outcomes[1], Settlement::AlreadySettled);
    }
    assert_eq!(remaining(&stores[1], key, &policy).await, full - 10);
}

/// Two identities whose counters fall in different slots.
fn two_slots(store: &RedisStore, base: &str) -> (String, String) {
    let a = format!("{base}:a");
    let b = (0..)
        .map(|i| format!("{base}:b{i}"))
        .find(|b| store.slot_of(b) != store.slot_of(&a))
        .expect("some identity lands elsewhere");
    (a, b)
}

/// On a Cluster, a reservation one slot refuses is no reservation: nothing is consumed on the
/// slots that admitted, and no record is left to settle.
#[tokio::test]
async fn a_reservation_one_slot_refuses_consumes_nothing_and_records_nothing() {
    let store = store(Topology::Cluster).await;
    let tight = fifty_per_hour().remove(0);
    for loose in usage_policies() {
        let (a, b) = two_slots(&store, &format!("refused:{}", name(&loose)));
        let spent = store.check(&[Check::new(&a, &tight, 50)]).await.unwrap();
        assert!(spent[0].allowed);
        let full = remaining(&store, &b, &loose).await;
        let id = ReservationId::random();
        let ds = store
            .reserve(
                &[Check::new(&b, &loose, 5), Check::new(&a, &tight, 1)],
                lease(&id),
            )
            .await
            .unwrap();
        assert!(!ds[1].allowed, "{}", name(&loose));
        assert_eq!(
            remaining(&store, &b, &loose).await,
            full,
            "{}",
            name(&loose)
        );
        assert_eq!(store.settle(&id, 0).await.unwrap(), Settlement::Unknown);
        store.reset(&a).await.unwrap();
    }
}

/// Off a Cluster, the same in one script: a refused reservation leaves no record.
#[tokio::test]
async fn a_refused_reservation_records_nothing() {
    let store = store(Topology::Standalone).await;
    let policy = fifty_per_hour().remove(5);
    let id = ReservationId::random();
    let ds = store
        .reserve(&[Check::new("too-much", &policy, 51)], lease(&id))
        .await
        .unwrap();
    assert!(!ds[0].allowed);
    assert_eq!(store.settle(&id, 0).await.unwrap(), Settlement::Unknown);
    assert_eq!(remaining(&store, "too-much", &policy).await, 50);
}

/// A reservation of three counters settles each: on a Cluster, one on each of its three
/// masters; off one, in one script's multi-check path.
async fn a_reservation_of_three_counters_settles_each(topology: Topology) {
    let store = store(topology).await;
    for policy in usage_policies() {
        let keys: Vec<String> = (0..3)
            .map(|node| {
                let slots = match topology {
                    Topology::Standalone => vec![0..=u16::MAX],
                    Topology::Cluster => shared_cluster().slots_of(node),
                };
                (0..)
                    .map(|i| format!("three:{}:{node}:{i}", name(&policy)))
                    .find(|id| slots.iter().any(|r| r.contains(&store.slot_of(id))))
                    .expect("some identity lands on every master")
            })
            .collect();
        let checks: Vec<Check<'_>> = keys
            .iter()
            .zip([10, 20, 30])
            .map(|(k, cost)| Check::new(k, &policy, cost))
            .collect();
        let id = ReservationId::random();
        let ds = store.reserve(&checks, lease(&id)).await.unwrap();
        assert!(ds.iter().all(|d| d.allowed), "{}", name(&policy));
        assert_eq!(
            store.settle(&id, 15).await.unwrap(),
            Settlement::Settled {
                reserved: 30,
                refunded: 15,
                charged: 0
            }
        );
        // Each counter ends at what was used: 10 reserved and 5 more charged, 20 and 30
        // reserved and the rest given back.
        for key in &keys {
            assert_eq!(
                remaining(&store, key, &policy).await,
                35,
                "{} {key}",
                name(&policy)
            );
        }
    }
}

#[tokio::test]
async fn standalone_a_reservation_of_three_counters_settles_each() {
    a_reservation_of_three_counters_settles_each(Topology::Standalone).await;
}

#[tokio::test]
async fn cluster_a_reservation_across_three_masters_settles_on_each() {
    a_reservation_of_three_counters_settles_each(Topology::Cluster).await;
}

/// `Store::refund` gives units back to the window that holds now, and never past the limit;
/// its decisions are the counters after it.
async fn refunds_floor_at_zero(topology: Topology) {
    let store = store(topology).await;
    for policy in usage_policies() {
        let key = format!("refund:{}", name(&policy));
        let full = remaining(&store, &key, &policy).await;
        let d = store.check(&[Check::new(&key, &policy, 5)]).await.unwrap();
        assert!(d[0].allowed);
        let back = store
            .refund(&[Refund {
                key: &key,
                policy: &policy,
                units: 2,
            }])
            .await
            .unwrap();
        assert_eq!(back[0].remaining, full - 3, "{}", name(&policy));
        let back: Vec<Decision> = store
            .refund(&[
                Refund {
                    key: &key,
                    policy: &policy,
                    units: 100,
                },
                Refund {
                    key: "never-used",
                    policy: &policy,
                    units: 100,
                },
            ])
            .await
            .unwrap();
        assert_eq!(back[0].remaining, full, "{}", name(&policy));
        assert_eq!(back[1].remaining, full, "{}", name(&policy));
        assert_eq!(remaining(&store, &key, &policy).await, full);
        let d = store.check(&[Check::new(&key, &policy, 51)]).await.unwrap();
        assert!(
            !d[0].allowed,
            "{}: never more than the limit",
            name(&policy)
        );
    }
}

#[tokio::test]
async fn standalone_refunds_floor_at_zero() {
    refunds_floor_at_zero(Topology::Standalone).await;
}

#[tokio::test]
async fn cluster_refunds_floor_at_zero() {
    refunds_floor_at_zero(Topology::Cluster).await;
}

/// The record of a reservation is a list under `prefix:reservation:{id}` that lives twice its
/// ttl and a second, and a settled one says so.
#[tokio::test]
async fn the_record_is_a_list_that_outlives_the_ttl() {
    let server = shared_server();
    let store = store(Topology::Standalone).await;
    let policy = fifty_per_hour().remove(3);
    let id = reserve(&store, "record", &policy, 7).await;
    let key = store.reservation_key(&id);
    assert!(key.ends_with(&format!(":reservation:{{{id}}}")));
    let pttl: u64 = server
        .command(&["PTTL", &key])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(pttl > 110_000 && pttl <= 121_000, "{pttl}");
    let items = server.command(&["LRANGE", &key, "0", "-1"]).unwrap();
    let items: Vec<&str> = items.lines().collect();
    assert_eq!(items.len(), 2 + 8, "{items:?}");
    assert_eq!(items[0], "open");
    assert_eq!(items[2], store.key_of("record"));
    assert_eq!(items[4], "7");
    store.settle(&id, 7).await.unwrap();
    let head = server.command(&["LINDEX", &key, "0"]).unwrap();
    assert_eq!(head.trim(), "settled");
}

/// A settle in the window after the reservation's: a fixed window has nothing to give back (the
/// window that counted it has ended), while a sliding counter gives back to its previous
/// window, which still weighs.
#[tokio::test]
async fn a_settle_in_the_next_window_gives_back_where_the_units_still_count() {
    let store = store(Topology::Standalone).await;
    let ttl = 2 * HOUR;
    let policies = fifty_per_hour();
    let (fixed, sliding) = (&policies[4], &policies[6]); // clock-aligned windows of an hour
    let start = store.time_offset();
    for policy in [fixed, sliding] {
        store.set_time_offset(start);
        let key = format!("next:{}", name(policy));
        let id = ReservationId::random();
        let ds = store
            .reserve(&[Check::new(&key, policy, 10)], Lease { id: &id, ttl })
            .await
            .unwrap();
        assert!(ds[0].allowed);
        store.advance_time(HOUR);
        let before = remaining(&store, &key, policy).await;
        assert!(matches!(
            store.settle(&id, 0).await.unwrap(),
            Settlement::Settled { refunded: 10, .. }
        ));
        let after = remaining(&store, &key, policy).await;
        if policy == fixed {
            assert_eq!((before, after), (50, 50), "{}", name(policy));
        } else {
            assert!(before < 50, "{}: the previous window weighs", name(policy));
            assert_eq!(after, 50, "{}", name(policy));
        }
    }
}

/// The sliding log gives back from its newest entries first, across entries, and never from
/// an entry newer than the reservation's.
#[tokio::test]
async fn the_sliding_log_gives_back_newest_first() {
    let store = store(Topology::Standalone).await;
    let log = fifty_per_hour().remove(5);
    let units = |n| Refund {
        key: "log",
        policy: &log,
        units: n,
    };
    let id = reserve(&store, "log", &log, 5).await;
    store.advance_time(Duration::from_secs(1));
    store.check(&[Check::new("log", &log, 3)]).await.unwrap();
    store.advance_time(Duration::from_secs(1));
    store.check(&[Check::new("log", &log, 2)]).await.unwrap();
    // The settle gives back only from the reservation's entry: the later two stay.
    store.settle(&id, 1).await.unwrap();
    assert_eq!(remaining(&store, "log", &log).await, 50 - 1 - 3 - 2);
    // 4 from now back: the newest entry's 2, then 2 of the 3 before it.
    let d = store.refund(&[units(4)]).await.unwrap();
    assert_eq!(d[0].remaining, 50 - 1 - 1);
    let entries = shared_server()
        .command(&["LRANGE", &store.key_of("log"), "0", "-1"])
        .unwrap();
    let entries: Vec<&str> = entries.lines().collect();
    assert_eq!(entries.len(), 3, "{entries:?}");
    assert_eq!(entries[0], "2", "the header holds the total");
    assert!(
        entries[1].ends_with(" 1") && entries[2].ends_with(" 1"),
        "{entries:?}"
    );
}

/// A log or a ring of buckets charged past its limit refuses until enough has left the window
/// to bring it back under the limit, not as soon as anything has: a log of 2 holding 3 (one
/// unit logged at 0 s, two at 10 s, one of them charged) has room again at 70 s, when the
/// units of 10 s leave, though the unit of 0 s leaves at 60 s. On a frozen clock, so that the
/// `retry_after` is exact.
#[tokio::test]
async fn a_charge_past_the_limit_waits_until_the_excess_has_left_the_window() {
    let store = store(Topology::Standalone).await;
    store.freeze_time(Timestamp::from_secs(1_800_000_000));
    let policies: [Policy; 2] = [
        SlidingLog::new(2, MINUTE).unwrap().into(),
        BucketedWindow::new(2, MINUTE, 6).unwrap().into(),
    ];
    for policy in policies {
        let key = format!("excess:{}", name(&policy));
        store.set_time_offset(0);
        reserve(&store, &key, &policy, 1).await;
        store.set_time_offset(10_000_000_000);
        let id = reserve(&store, &key, &policy, 1).await;
        store.settle(&id, 2).await.unwrap();
        let refused = store.peek(&key, &policy).await.unwrap();
        assert!(!refused.allowed, "{}: {refused:?}", name(&policy));
        assert_eq!(refused.remaining, 0, "{}", name(&policy));
        assert_eq!(refused.retry_after, MINUTE, "{}", name(&policy));
        // At 60 s the unit of 0 s has left, and the log still holds 3 - 1 = 2.
        store.set_time_offset(60_000_000_000);
        let still = store.peek(&key, &policy).await.unwrap();
        assert!(!still.allowed, "{}: {still:?}", name(&policy));
        assert_eq!(
            still.retry_after,
            Duration::from_secs(10),
            "{}",
            name(&policy)
        );
        store.set_time_offset(70_000_000_000);
        assert!(
            store.peek(&key, &policy).await.unwrap().allowed,
            "{}",
            name(&policy)
        );
    }
}
