//! The concurrency limit on Redis, standalone and on a 3-master Cluster: each reservation holds
//! one slot, a settle from any instance releases it whatever was used, and a slot whose
//! reservation is never settled (its instance crashed) comes back once the hold's ttl has
//! passed, on a frozen store clock moved by hand.

use std::time::Duration;

use sluice_core::{
    Check, ConcurrencyLimit, FixedWindow, Lease, Policy, ReservationId, Settlement, Store,
    Timestamp,
};
use sluice_redis::RedisStore;
use sluice_redis::testing::{shared_cluster, shared_server, test_options};

const TTL: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug)]
enum Topology {
    Standalone,
    Cluster,
}

/// Two instances on one Redis (or the Cluster) under one prefix, both frozen at one instant.
async fn instances(topology: Topology) -> [RedisStore; 2] {
    let url = match topology {
        Topology::Standalone => shared_server().url(),
        Topology::Cluster => shared_cluster().url(),
    };
    let options = test_options();
    let open = || async {
        let store = RedisStore::connect(&url, options.clone()).await.unwrap();
        store.freeze_time(Timestamp::from_secs(1_800_000_000));
        store
    };
    [open().await, open().await]
}

/// A key no earlier run has used: the servers are shared between tests and runs.
fn fresh(name: &str) -> String {
    format!("{name}:{}", ReservationId::random())
}

/// Reserves one slot of `slots` on `key` for `ttl`; the id when admitted.
async fn take(
    store: &RedisStore,
    key: &str,
    slots: &Policy,
    ttl: Duration,
) -> Option<ReservationId> {
    let id = ReservationId::random();
    let ds = store
        .reserve(&[Check::new(key, slots, 1)], Lease { id: &id, ttl })
        .await
        .unwrap();
    ds[0].allowed.then_some(id)
}

async fn a_settle_from_any_instance_releases_the_slot(topology: Topology) {
    let [a, b] = instances(topology).await;
    let slots: Policy = ConcurrencyLimit::new(2, TTL).unwrap().into();
    let key = fresh("slots");
    let first = take(&a, &key, &slots, TTL).await.unwrap();
    let second = take(&b, &key, &slots, TTL).await.unwrap();
    assert!(take(&a, &key, &slots, TTL).await.is_none(), "two in flight");
    // Settled on the other instance, at more than the one unit held: released, not charged.
    assert!(matches!(
        b.settle(&first, 700).await.unwrap(),
        Settlement::Settled { .. }
    ));
    assert_eq!(a.peek(&key, &slots).await.unwrap().remaining, 1);
    let third = take(&a, &key, &slots, TTL).await.unwrap();
    assert!(take(&b, &key, &slots, TTL).await.is_none());
    // At nothing used: released too, and a second settle releases nothing more.
    a.settle(&second, 0).await.unwrap();
    assert_eq!(
        b.settle(&second, 0).await.unwrap(),
        Settlement::AlreadySettled
    );
    assert_eq!(a.peek(&key, &slots).await.unwrap().remaining, 1);
    b.settle(&third, 1).await.unwrap();
    assert_eq!(a.peek(&key, &slots).await.unwrap().remaining, 2);
}

#[tokio::test]
async fn standalone_a_settle_from_any_instance_releases_the_slot() {
    a_settle_from_any_instance_releases_the_slot(Topology::Standalone).await;
}

#[tokio::test]
async fn cluster_a_settle_from_any_instance_releases_the_slot() {
    a_settle_from_any_instance_releases_the_slot(Topology::Cluster).await;
}

async fn the_slots_of_a_crashed_instance_come_back_after_their_ttl(topology: Topology) {
    let [crashed, alive] = instances(topology).await;
    let slots: Policy = ConcurrencyLimit::new(1, TTL).unwrap().into();
    let key = fresh("crash");
    let lost = take(&crashed, &key, &slots, TTL).await.unwrap();
    drop(crashed);
    alive.advance_time(TTL - Duration::from_millis(1));
    assert!(take(&alive, &key, &slots, TTL).await.is_none());
    alive.advance_time(Duration::from_millis(1));
    let next = take(&alive, &key, &slots, TTL).await.unwrap();
    // The lost reservation has expired with its hold: a late settle releases nothing.
    assert_eq!(alive.settle(&lost, 0).await.unwrap(), Settlement::Expired);
    assert!(take(&alive, &key, &slots, TTL).await.is_none());
    alive.settle(&next, 0).await.unwrap();
    assert!(take(&alive, &key, &slots, TTL).await.is_some());
}

#[tokio::test]
async fn standalone_the_slots_of_a_crashed_instance_come_back_after_their_ttl() {
    the_slots_of_a_crashed_instance_come_back_after_their_ttl(Topology::Standalone).await;
}

#[tokio::test]
async fn cluster_the_slots_of_a_crashed_instance_come_back_after_their_ttl() {
    the_slots_of_a_crashed_instance_come_back_after_their_ttl(Topology::Cluster).await;
}

/// A reservation that takes a budget and a slot at once: the settle refunds the budget what was
/// not used and releases the slot, each by its own rule.
#[tokio::test]
async fn a_budget_and_a_slot_settle_each_by_their_own_rule() {
    let [store, _] = instances(Topology::Standalone).await;
    let budget: Policy = FixedWindow::new(1_000, TTL, sluice_core::Alignment::FirstRequest)
        .unwrap()
        .into();
    let slots: Policy = ConcurrencyLimit::new(1, TTL).unwrap().into();
    let (tokens, in_flight) = (fresh("tokens"), fresh("in-flight"));
    let id = ReservationId::random();
    let checks = [
        Check::new(&tokens, &budget, 500),
        Check::new(&in_flight, &slots, 1),
    ];
    let ds = store
        .reserve(&checks, Lease { id: &id, ttl: TTL })
        .await
        .unwrap();
    assert!(ds.iter().all(|d| d.allowed));
    assert_eq!(
        store.settle(&id, 120).await.unwrap(),
        Settlement::Settled {
            reserved: 500,
            refunded: 380,
            charged: 0
        }
    );
    assert_eq!(store.peek(&tokens, &budget).await.unwrap().remaining, 880);
    assert_eq!(store.peek(&in_flight, &slots).await.unwrap().remaining, 1);
}
