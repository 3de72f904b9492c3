//! The order in which a settle adjusts a reservation's counters: last check first, on every
//! store, so that a reservation whose checks share a counter settles alike on each.

use std::time::Duration;

use sluice_core::{
    Check, FakeClock, Lease, MemoryStore, Policy, Rate, ReservationId, Settlement, Store,
    Timestamp, TokenBucket,
};

/// Two checks of one bucket, of 1 and 3 tokens, settled at 2 once the bucket is full again:
/// the second check gets 1 back, which the full bucket cannot take, and then the first is
/// charged 1, leaving 4. In the other order (charge, then refund) it would be full at 5.
#[tokio::test]
async fn a_settle_adjusts_the_last_check_first() {
    let clock = FakeClock::at(Timestamp::from_secs(1_000));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let bucket: Policy = TokenBucket::new(5, Rate::per_second(5)).unwrap().into();
    let id = ReservationId::random();
    let checks = [Check::new("k", &bucket, 1), Check::new("k", &bucket, 3)];
    let lease = Lease {
        id: &id,
        ttl: Duration::from_secs(60),
    };
    let reserved = store.reserve(&checks, lease).await.unwrap();
    assert!(reserved.iter().all(|d| d.allowed));
    assert_eq!(store.peek("k", &bucket).await.unwrap().remaining, 1);
    clock.advance(Duration::from_secs(1));
    assert_eq!(store.peek("k", &bucket).await.unwrap().remaining, 5);
    assert_eq!(
        store.settle(&id, 2).await.unwrap(),
        Settlement::Settled {
            reserved: 3,
            refunded: 1,
            charged: 0
        }
    );
    assert_eq!(store.peek("k", &bucket).await.unwrap().remaining, 4);
}
