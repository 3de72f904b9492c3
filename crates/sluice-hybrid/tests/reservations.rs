//! Reservations on the hybrid store, against a real `redis-server`: a reservation made on one
//! instance is settled on another, what was not used comes back to every instance once the syncs
//! carry it, a second settle anywhere is refused, a late one finds it expired, and usage beyond
//! the reservation is charged. Time moves by a fake clock and explicit syncs.

use std::time::Duration;

use sluice_core::{
    Alignment, Check, FakeClock, FixedWindow, Gcra, Lease, Policy, Rate, Refund, ReservationId,
    Settlement, SlidingCounter, Store, Timestamp, TokenBucket,
};
use sluice_hybrid::{HybridOptions, HybridStore};
use sluice_redis::RedisStore;
use sluice_redis::testing::{
    RedisServer, offset_to_window_start, redis_time_nanos, test_options, unique_prefix,
};

/// `n` hybrid stores on the Redis at `port`, sharing one prefix and one fake clock, which every
/// instance counts as live.
async fn instances(port: u16, n: usize) -> (FakeClock, Vec<HybridStore<FakeClock>>) {
    let url = format!("redis://127.0.0.1:{port}");
    let prefix = unique_prefix();
    let offset = offset_to_window_start(port, Duration::from_secs(60));
    let start = u64::try_from(redis_time_nanos(port) + offset).unwrap();
    let clock = FakeClock::at(Timestamp::from_nanos(start));
    let mut stores = Vec::new();
    for _ in 0..n {
        let options = test_options()
            .prefix(prefix.clone())
            .timeout(Duration::from_millis(500));
        let redis = RedisStore::connect(&url, options).await.unwrap();
        redis.set_time_offset(offset);
        stores.push(HybridStore::with_clock(
            redis,
            HybridOptions::default(),
            clock.clone(),
        ));
    }
    for _ in 0..2 {
        advance(&clock, &stores, Duration::from_millis(260));
        for s in &stores {
            s.sync_now().await.unwrap();
        }
    }
    (clock, stores)
}

fn advance(clock: &FakeClock, stores: &[HybridStore<FakeClock>], d: Duration) {
    clock.advance(d);
    for s in stores {
        s.redis().advance_time(d);
    }
}

/// What every instance sees left of `key` once the syncs have carried what each did: every
/// instance watches the key (a peek registers it) and syncs when its claim's renewal comes due
/// (a key with nothing to push is read only then), twice.
async fn left(
    clock: &FakeClock,
    stores: &[HybridStore<FakeClock>],
    key: &str,
    p: &Policy,
) -> Vec<u64> {
    // Twice: an instance that read the key before another pushed reads it again.
    for _ in 0..2 {
        advance(clock, stores, Duration::from_millis(130));
        for s in stores {
            s.peek(key, p).await.unwrap();
        }
        for s in stores {
            s.sync_now().await.unwrap();
        }
    }
    let mut seen = Vec::new();
    for s in stores {
        seen.push(s.peek(key, p).await.unwrap().remaining);
    }
    seen
}

async fn reserve(
    store: &HybridStore<FakeClock>,
    key: &str,
    p: &Policy,
    amount: u64,
) -> Option<ReservationId> {
    let id = ReservationId::random();
    let lease = Lease {
        id: &id,
        ttl: Duration::from_secs(60),
    };
    let d = store
        .reserve(&[Check::new(key, p, amount)], lease)
        .await
        .unwrap();
    d[0].allowed.then_some(id)
}

fn held() -> Vec<Policy> {
    let hour = Duration::from_secs(3600);
    vec![
        FixedWindow::new(100, hour, Alignment::Clock { utc_offset_secs: 0 })
            .unwrap()
            .into(),
        FixedWindow::new(100, hour, Alignment::FirstRequest)
            .unwrap()
            .into(),
        SlidingCounter::new(100, hour).unwrap().into(),
        TokenBucket::new(100, Rate::per_minute(1)).unwrap().into(),
        Gcra::new(Rate::per_minute(1), 100).unwrap().into(),
    ]
}

/// Reserved on one instance, settled on another: what was not used comes back to the counter
/// every instance sees, and a second settle, on either, changes nothing.
#[tokio::test]
async fn a_reservation_made_on_one_instance_is_settled_once_on_another() {
    let server = RedisServer::start();
    let (clock, stores) = instances(server.port, 2).await;
    for p in held() {
        let key = format!("budget:{p:?}");
        let id = reserve(&stores[0], &key, &p, 10).await.expect("admitted");
        assert_eq!(
            left(&clock, &stores, &key, &p).await,
            [90, 90],
            "{}",
            p.algorithm()
        );
        assert_eq!(
            stores[1].settle(&id, 4).await.unwrap(),
            Settlement::Settled {
                reserved: 10,
                refunded: 6,
                charged: 0
            }
        );
        assert_eq!(
            left(&clock, &stores, &key, &p).await,
            [96, 96],
            "{}",
            p.algorithm()
        );
        for s in &stores {
            assert_eq!(s.settle(&id, 0).await.unwrap(), Settlement::AlreadySettled);
        }
        assert_eq!(
            left(&clock, &stores, &key, &p).await,
            [96, 96],
            "{}",
            p.algorithm()
        );
    }
}

/// Usage beyond the reservation is charged past the limit, wherever it is settled.
#[tokio::test]
async fn usage_beyond_the_reservation_is_charged_everywhere() {
    let server = RedisServer::start();
    let (clock, stores) = instances(server.port, 2).await;
    for p in held() {
        let key = format!("charged:{p:?}");
        let id = reserve(&stores[0], &key, &p, 10).await.expect("admitted");
        assert_eq!(
            stores[1].settle(&id, 30).await.unwrap(),
            Settlement::Settled {
                reserved: 10,
                refunded: 0,
                charged: 20
            }
        );
        assert_eq!(
            left(&clock, &stores, &key, &p).await,
            [70, 70],
            "{}",
            p.algorithm()
        );
    }
}

/// A reservation not settled within its ttl counts as used in full: a late settle, on any
/// instance, gives nothing back. An id no instance made names nothing; a refused reservation
/// takes nothing and leaves no record.
#[tokio::test]
async fn expired_unknown_and_refused_reservations_give_nothing_back() {
    let server = RedisServer::start();
    let (clock, stores) = instances(server.port, 2).await;
    let p = FixedWindow::new(100, Duration::from_secs(3600), Alignment::FirstRequest)
        .unwrap()
        .into();
    let id = ReservationId::random();
    let lease = Lease {
        id: &id,
        ttl: Duration::from_secs(1),
    };
    let d = stores[0]
        .reserve(&[Check::new("late", &p, 10)], lease)
        .await
        .unwrap();
    assert!(d[0].allowed);
    advance(&clock, &stores, Duration::from_secs(2));
    assert_eq!(stores[1].settle(&id, 0).await.unwrap(), Settlement::Expired);
    assert_eq!(left(&clock, &stores, "late", &p).await, [90, 90]);

    let forged = ReservationId::random();
    assert_eq!(
        stores[1].settle(&forged, 0).await.unwrap(),
        Settlement::Unknown
    );

    // More than this instance's share of a fresh key: refused, nothing taken, no record.
    let id = ReservationId::random();
    let lease = Lease {
        id: &id,
        ttl: Duration::from_secs(60),
    };
    let d = stores[0]
        .reserve(&[Check::new("refused", &p, 101)], lease)
        .await
        .unwrap();
    assert!(!d[0].allowed);
    assert_eq!(stores[1].settle(&id, 0).await.unwrap(), Settlement::Unknown);
    assert_eq!(left(&clock, &stores, "refused", &p).await, [100, 100]);
}

/// Envoy's refund (`is_negative_hits`) on one instance gives back to the counter every instance
/// sees, never past the limit.
#[tokio::test]
async fn a_refund_reaches_every_instance() {
    let server = RedisServer::start();
    let (clock, stores) = instances(server.port, 2).await;
    for p in held() {
        let key = format!("refund:{p:?}");
        let mut admitted = 0;
        for _ in 0..20 {
            let d = stores[0].check(&[Check::new(&key, &p, 1)]).await.unwrap();
            admitted += u64::from(d[0].allowed);
        }
        assert_eq!(admitted, 20, "{}", p.algorithm());
        assert_eq!(
            left(&clock, &stores, &key, &p).await,
            [80, 80],
            "{}",
            p.algorithm()
        );
        let d = stores[1]
            .refund(&[Refund {
                key: &key,
                policy: &p,
                units: 5,
            }])
            .await
            .unwrap();
        assert_eq!(d[0].remaining, 85, "{}", p.algorithm());
        assert_eq!(
            left(&clock, &stores, &key, &p).await,
            [85, 85],
            "{}",
            p.algorithm()
        );
        // Never past the limit.
        stores[1]
            .refund(&[Refund {
                key: &key,
                policy: &p,
                units: 500,
            }])
            .await
            .unwrap();
        assert_eq!(
            left(&clock, &stores, &key, &p).await,
            [100, 100],
            "{}",
            p.algorithm()
        );
    }
}

/// Two refunds in a row, with an instance reading the key between them (most likely in the same
/// millisecond of Redis time): the floor that instance read after the first refund does not
/// raise the key back over the second, since each refund gives the key a later birth.
#[tokio::test]
async fn a_floor_read_between_two_refunds_does_not_undo_the_second() {
    let server = RedisServer::start();
    let (clock, stores) = instances(server.port, 2).await;
    for p in held() {
        let key = format!("twice:{p:?}");
        let first = reserve(&stores[0], &key, &p, 10).await.expect("admitted");
        let second = reserve(&stores[0], &key, &p, 10).await.expect("admitted");
        assert_eq!(
            left(&clock, &stores, &key, &p).await,
            [80, 80],
            "{}",
            p.algorithm()
        );
        // A request the limit refuses makes an instance read the key at its next sync.
        let read = |s: &HybridStore<FakeClock>| {
            let (s, key, p) = (s.clone(), key.clone(), p.clone());
            async move {
                s.check(&[Check::new(&key, &p, 1000)]).await.unwrap();
                s.sync_now().await.unwrap();
            }
        };
        stores[1].settle(&first, 4).await.unwrap();
        read(&stores[1]).await;
        read(&stores[0]).await;
        stores[1].settle(&second, 4).await.unwrap();
        read(&stores[1]).await;
        read(&stores[0]).await;
        assert_eq!(
            left(&clock, &stores, &key, &p).await,
            [92, 92],
            "{}",
            p.algorithm()
        );
    }
}
