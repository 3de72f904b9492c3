//! The concurrency limit in the memory store: a reservation holds one slot, its settle releases
//! it whatever was used (while a usage limit of the same reservation is refunded or charged as
//! usual), and a slot never released comes back once its hold's ttl has passed.

use std::time::Duration;

use sluice_core::{
    Check, ConcurrencyLimit, FakeClock, FixedWindow, Lease, MemoryStore, Policy, ReservationId,
    Settlement, Store, Timestamp,
};

const TTL: Duration = Duration::from_secs(60);

fn store() -> (FakeClock, MemoryStore<FakeClock>) {
    let clock = FakeClock::at(Timestamp::from_secs(1_000));
    (clock.clone(), MemoryStore::builder().clock(clock).build())
}

async fn reserve(store: &MemoryStore<FakeClock>, checks: &[Check<'_>]) -> Option<ReservationId> {
    let id = ReservationId::random();
    let lease = Lease { id: &id, ttl: TTL };
    let ds = store.reserve(checks, lease).await.unwrap();
    ds.iter().all(|d| d.allowed).then_some(id)
}

#[tokio::test]
async fn a_settle_releases_the_slot_whatever_was_used() {
    let (_, store) = store();
    let slots: Policy = ConcurrencyLimit::new(2, TTL).unwrap().into();
    let budget: Policy = FixedWindow::new(1_000, TTL, sluice_core::Alignment::FirstRequest)
        .unwrap()
        .into();
    let checks = [
        Check::new("tenant", &budget, 500),
        Check::new("tenant:in_flight", &slots, 1),
    ];
    let first = reserve(&store, &checks).await.unwrap();
    let second = reserve(&store, &[checks[1]]).await.unwrap();
    assert!(
        reserve(&store, &[checks[1]]).await.is_none(),
        "two in flight"
    );
    // Used beyond the reservation: the budget is charged 200, the slot released all the same.
    assert_eq!(
        store.settle(&first, 700).await.unwrap(),
        Settlement::Settled {
            reserved: 500,
            refunded: 0,
            charged: 200
        }
    );
    assert_eq!(store.peek("tenant", &budget).await.unwrap().remaining, 300);
    assert_eq!(
        store
            .peek("tenant:in_flight", &slots)
            .await
            .unwrap()
            .remaining,
        1
    );
    // Used exactly what it took (one unit): released too.
    store.settle(&second, 1).await.unwrap();
    assert_eq!(
        store
            .peek("tenant:in_flight", &slots)
            .await
            .unwrap()
            .remaining,
        2
    );
}

#[tokio::test]
async fn a_slot_never_released_comes_back_after_its_ttl() {
    let (clock, store) = store();
    let slots: Policy = ConcurrencyLimit::new(1, TTL).unwrap().into();
    let check = [Check::new("crashed", &slots, 1)];
    let lost = reserve(&store, &check).await.unwrap();
    clock.advance(TTL - Duration::from_nanos(1));
    assert!(reserve(&store, &check).await.is_none());
    clock.advance(Duration::from_nanos(1));
    let next = reserve(&store, &check).await.unwrap();
    // The lost reservation's late settle releases nothing: the slot is the new request's.
    assert_eq!(store.settle(&lost, 0).await.unwrap(), Settlement::Expired);
    assert!(reserve(&store, &check).await.is_none());
    store.settle(&next, 0).await.unwrap();
    assert!(reserve(&store, &check).await.is_some());
}

#[tokio::test]
async fn a_check_at_cost_zero_takes_no_slot() {
    let (_, store) = store();
    let slots: Policy = ConcurrencyLimit::new(1, TTL).unwrap().into();
    for _ in 0..3 {
        let d = store.check(&[Check::new("k", &slots, 0)]).await.unwrap();
        assert!(d[0].allowed);
    }
    reserve(&store, &[Check::new("k", &slots, 1)])
        .await
        .unwrap();
    let d = store.check(&[Check::new("k", &slots, 0)]).await.unwrap();
    assert!(!d[0].allowed);
    assert_eq!(d[0].retry_after, ConcurrencyLimit::RETRY_HINT);
}
