//! The memory store's own promises: exactness under threads, deadlock-free multi-key checks,
//! expiry, and the hard key limit with its eviction policy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::{
    Alignment, Check, FakeClock, FixedWindow, Gcra, MemoryStore, Policy, Rate, StoreError,
    Timestamp, TokenBucket,
};

fn frozen_store() -> (FakeClock, MemoryStore<FakeClock>) {
    let clock = FakeClock::at(Timestamp::from_secs(1_000_000));
    (clock.clone(), MemoryStore::builder().clock(clock).build())
}

fn per_hour(limit: u64) -> Policy {
    FixedWindow::new(limit, Duration::from_secs(3600), Alignment::FirstRequest)
        .unwrap()
        .into()
}

#[test]
fn threads_hammering_one_key_get_exactly_the_limit() {
    let (_, store) = frozen_store();
    for policy in [
        per_hour(1000),
        TokenBucket::new(1000, Rate::per_second(1)).unwrap().into(),
        Gcra::new(Rate::per_second(1), 1000).unwrap().into(),
    ] {
        let admitted = AtomicU64::new(0);
        let key = format!("hot:{}", policy.algorithm());
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..500 {
                        let d = store.check_one(Check::new(&key, &policy, 1)).unwrap();
                        admitted.fetch_add(u64::from(d.allowed), Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(
            admitted.load(Ordering::Relaxed),
            1000,
            "{}",
            policy.algorithm()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_multi_key_requests_consume_all_or_nothing() {
    use sluice_core::Store;
    let (_, store) = frozen_store();
    let store = std::sync::Arc::new(store);
    let (user, global) = (per_hour(10), per_hour(40));
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let (store, user, global) = (store.clone(), user.clone(), global.clone());
            tokio::spawn(async move {
                let own = format!("user:{t}");
                let mut admitted = 0u64;
                for _ in 0..50 {
                    let checks = [Check::new(&own, &user, 1), Check::new("global", &global, 1)];
                    let ds = store.check(&checks).await.unwrap();
                    admitted += u64::from(ds.iter().all(|d| d.allowed));
                }
                (own, admitted)
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        let (own, admitted) = h.await.unwrap();
        total += admitted;
        // Each user's counter moved exactly by its admitted requests: no refused request took
        // from it, even when the global limit refused it.
        let left = store.peek(&own, &user).await.unwrap().remaining;
        assert_eq!(10 - left, admitted, "{own}");
    }
    assert_eq!(total, 40);
    assert_eq!(store.peek("global", &global).await.unwrap().remaining, 0);
}

#[test]
fn opposite_key_orders_do_not_deadlock() {
    let (_, store) = frozen_store();
    let policy = per_hour(u64::MAX);
    let store = &store;
    std::thread::scope(|s| {
        for t in 0..4 {
            let policy = &policy;
            s.spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                for i in 0..2000 {
                    let (a, b) = (format!("k{}", i % 7), format!("k{}", (i + t) % 11));
                    let mut checks = vec![Check::new(&a, policy, 1), Check::new(&b, policy, 1)];
                    if t % 2 == 1 {
                        checks.reverse();
                    }
                    let ds = rt
                        .block_on(sluice_core::Store::check(store, &checks))
                        .unwrap();
                    assert!(ds.iter().all(|d| d.allowed));
                }
            });
        }
    });
}

#[test]
fn idle_keys_expire_once_full_again() {
    let (clock, store) = frozen_store();
    let policy: Policy = TokenBucket::new(10, Rate::per_second(10)).unwrap().into();
    for i in 0..1000 {
        store
            .check_one(Check::new(&format!("k{i}"), &policy, 3))
            .unwrap();
    }
    assert_eq!(store.len(), 1000);
    // A cost-0 check on a new key creates nothing.
    store
        .check_one(Check::new("just-asking", &policy, 0))
        .unwrap();
    assert_eq!(store.len(), 1000);
    clock.advance(Duration::from_millis(200));
    assert_eq!(store.sweep(), 0, "not yet refilled");
    clock.advance(Duration::from_secs(1));
    assert_eq!(store.sweep(), 1000);
    assert!(store.is_empty());
}

#[test]
fn the_key_limit_holds_against_a_flood_of_new_keys() {
    let (_, store) = {
        let clock = FakeClock::at(Timestamp::from_secs(1_000_000));
        (
            clock.clone(),
            MemoryStore::builder().clock(clock).max_keys(1024).build(),
        )
    };
    let policy: Policy = TokenBucket::new(100, Rate::per_second(1)).unwrap().into();
    for i in 0..100_000 {
        let d = store
            .check_one(Check::new(&format!("flood:{i}"), &policy, 1))
            .unwrap();
        assert!(d.allowed);
    }
    assert!(store.len() <= 1024, "{} keys tracked", store.len());
}

#[test]
fn eviction_never_resets_a_limited_key() {
    let clock = FakeClock::at(Timestamp::from_secs(1_000_000));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(1)
        .max_keys(16)
        .build();
    let strict = per_hour(1);
    let loose = per_hour(100);
    for i in 0..8 {
        assert!(
            store
                .check_one(Check::new(&format!("blocked:{i}"), &strict, 1))
                .unwrap()
                .allowed
        );
    }
    for i in 0..8 {
        store
            .check_one(Check::new(&format!("loose:{i}"), &loose, 1))
            .unwrap();
    }
    // The table is full; new keys push out the loose ones, never the blocked ones.
    for i in 0..100 {
        store
            .check_one(Check::new(&format!("new:{i}"), &loose, 1))
            .unwrap();
        assert!(store.len() <= 16);
    }
    for i in 0..8 {
        let d = store
            .check_one(Check::new(&format!("blocked:{i}"), &strict, 1))
            .unwrap();
        assert!(!d.allowed, "blocked:{i} was reset by eviction");
    }
}

#[test]
fn a_table_full_of_limited_keys_refuses_new_ones_until_they_expire() {
    let clock = FakeClock::at(Timestamp::from_secs(1_000_000));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(1)
        .max_keys(8)
        .build();
    let strict = per_hour(1);
    for i in 0..8 {
        store
            .check_one(Check::new(&format!("blocked:{i}"), &strict, 1))
            .unwrap();
    }
    let err = store
        .check_one(Check::new("newcomer", &strict, 1))
        .unwrap_err();
    assert_eq!(err, StoreError::Full { max_keys: 8 });
    assert!(err.is_transient());
    assert!(err.to_string().contains("maximum of 8 keys"));
    // Known keys are still decided.
    assert!(
        !store
            .check_one(Check::new("blocked:0", &strict, 1))
            .unwrap()
            .allowed
    );
    clock.advance(Duration::from_secs(3600));
    assert!(
        store
            .check_one(Check::new("newcomer", &strict, 1))
            .unwrap()
            .allowed
    );
}

#[test]
fn a_changed_policy_on_a_key_starts_from_full() {
    let (_, store) = frozen_store();
    let bucket: Policy = TokenBucket::new(1, Rate::per_second(1)).unwrap().into();
    assert!(
        store
            .check_one(Check::new("k", &bucket, 1))
            .unwrap()
            .allowed
    );
    assert!(
        !store
            .check_one(Check::new("k", &bucket, 1))
            .unwrap()
            .allowed
    );
    let window = per_hour(2);
    let d = store.check_one(Check::new("k", &window, 1)).unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 1);
}

#[test]
fn a_clock_stepping_back_gives_nothing_away() {
    let (clock, store) = frozen_store();
    let policy: Policy = Gcra::new(Rate::per_second(1), 2).unwrap().into();
    for _ in 0..2 {
        assert!(
            store
                .check_one(Check::new("k", &policy, 1))
                .unwrap()
                .allowed
        );
    }
    clock.set(Timestamp::from_secs(999_000));
    assert!(
        !store
            .check_one(Check::new("k", &policy, 1))
            .unwrap()
            .allowed
    );
}

#[tokio::test]
async fn without_a_store_each_check_follows_its_mode() {
    use sluice_core::{OnStoreError, decide_without_store};
    let (_, local) = frozen_store();
    let policy = per_hour(2);
    let checks = [Check::new("a", &policy, 1), Check::new("b", &policy, 1)];
    let retry = Duration::from_millis(500);

    let allow_local = [OnStoreError::Allow, OnStoreError::Local];
    for expected in [true, true, false] {
        let ds = decide_without_store(&checks, &allow_local, &local, retry).await;
        assert!(ds[0].allowed);
        assert_eq!(ds[1].allowed, expected, "local limiting counts in memory");
    }

    let deny_local = [OnStoreError::Deny, OnStoreError::Local];
    let ds = decide_without_store(&checks, &deny_local, &local, retry).await;
    assert!(!ds[0].allowed);
    assert_eq!(ds[0].retry_after, retry);
    assert_eq!(
        local
            .check_one(Check::new("b", &policy, 0))
            .unwrap()
            .remaining,
        0
    );
    let fresh = [Check::new("a", &policy, 1), Check::new("c", &policy, 1)];
    decide_without_store(&fresh, &deny_local, &local, retry).await;
    let c = local.check_one(Check::new("c", &policy, 0)).unwrap();
    assert_eq!(c.remaining, 2, "a denied request consumes nothing locally");
    assert_eq!(
        "local".parse::<OnStoreError>().unwrap(),
        OnStoreError::Local
    );
    assert!("fail-open".parse::<OnStoreError>().is_err());
}

#[test]
fn eviction_frees_an_eighth_even_when_expiries_tie() {
    // Every key is touched in the same second, so all expire in the same second: a pass must
    // still drop only what it needs, not the whole shard.
    let clock = FakeClock::at(Timestamp::from_secs(1_000_000));
    let store = MemoryStore::builder()
        .clock(clock)
        .shards(1)
        .max_keys(800)
        .build();
    let policy = per_hour(100);
    for i in 0..800 {
        store
            .check_one(Check::new(&format!("k{i}"), &policy, 1))
            .unwrap();
    }
    assert_eq!(store.len(), 800);
    store.check_one(Check::new("one-more", &policy, 1)).unwrap();
    assert_eq!(
        store.len(),
        800 - 100 + 1,
        "one pass drops an eighth of the shard"
    );
}

/// The memory store holds what the redis store cannot: windows and backlogs beyond 104 days, and
/// limits beyond 2⁵³. It says so through `Store` and `DynStore` alike.
#[test]
fn the_memory_store_holds_every_policy() {
    let (_, store) = frozen_store();
    let year = Duration::from_secs(365 * 86_400);
    let shared: &dyn sluice_core::DynStore = &store;
    for policy in [
        Policy::from(FixedWindow::new(u64::MAX, year, Alignment::FirstRequest).unwrap()),
        Gcra::new(Rate::per_second(1), 10_000_000).unwrap().into(),
    ] {
        assert_eq!(sluice_core::Store::supports(&store, &policy), Ok(()));
        assert_eq!(shared.supports(&policy), Ok(()));
    }
}

#[test]
fn check_now_counts_on_the_same_counter_as_check() {
    // The front ends' single-check path (`DynStore::check_now`) and the general one
    // (`DynStore::check`) must be one counter, whichever a request takes.
    use sluice_core::DynStore;

    let (_, store) = frozen_store();
    let store: &dyn DynStore = &store;
    let policy = per_hour(3);
    let check = Check::new("k", &policy, 1);
    let now = |s: &dyn DynStore| {
        s.check_now(check)
            .expect("the memory store decides at once")
    };
    let through_check = |s: &dyn DynStore| {
        let mut ready = s.check(std::slice::from_ref(&check));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match ready.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(ds) => ds.unwrap()[0],
            std::task::Poll::Pending => panic!("the memory store never waits"),
        }
    };
    assert_eq!(now(store).unwrap().remaining, 2);
    assert_eq!(through_check(store).remaining, 1);
    assert_eq!(now(store).unwrap().remaining, 0);
    assert!(!through_check(store).allowed);
    let refused = now(store).unwrap();
    assert!(!refused.allowed);
    assert_eq!(refused.limit, 3);
}
