//! The hybrid store's sync on one `redis-server`: one call carries many policies and keys, and
//! every key's state and grant come back in its place.

use std::time::Duration;

use sluice_core::{Alignment, FixedWindow, Policy, SlidingCounter};
use sluice_hybrid::sync::{Claimant, sync_batch};
use sluice_redis::RedisStore;
use sluice_redis::testing::{RedisServer, store_at_hour_start};

/// A hybrid instance that counts itself alone.
const ALONE: Claimant<'static> = Claimant {
    id: "instance-a",
    ttl: Duration::from_millis(500),
    instances: 1,
    attempt: 0,
};

/// The application clock the store dates windows by, in ns: 20 ms into an hour, as Redis's is.
fn store_now(store: &RedisStore) -> i128 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    i128::try_from(wall).unwrap() + i128::from(store.time_offset())
}

/// One sync call carries entries of several policies, each policy's parameters sent once, and
/// a key twice (a sliding counter's units of the previous window and of the current one): each
/// entry's state and grant are its own, and a call cut into one-entry calls answers the same.
#[tokio::test]
async fn a_sync_call_carries_many_policies_and_a_key_twice() {
    use sluice_core::{Gcra, Rate, TokenBucket};
    use sluice_hybrid::sync::{GlobalState, SyncEntry, Synced};

    let server = RedisServer::start();
    let hour = Duration::from_secs(3600);
    let store = store_at_hour_start(&server).await;
    let gcra_slow: Policy = Gcra::new(Rate::per_minute(60), 10).unwrap().into();
    let gcra_fast: Policy = Gcra::new(Rate::per_second(10), 5).unwrap().into();
    let bucket: Policy = TokenBucket::new(20, Rate::per_minute(60)).unwrap().into();
    let fixed: Policy = FixedWindow::new(100, hour, Alignment::Clock { utc_offset_secs: 0 })
        .unwrap()
        .into();
    let sliding: Policy = SlidingCounter::new(100, hour).unwrap().into();
    for (batch, prefix) in [(512, "one-call"), (1, "one-each")] {
        let now = store_now(&store);
        let start = now - now % hour.as_nanos() as i128;
        let to = |t: i128| i64::try_from(t - now).unwrap();
        let entry = |key: &str, policy: &Policy, units: u64, to_end_nanos: i64| SyncEntry {
            key: format!("{prefix}:{key}"),
            policy: policy.clone(),
            units,
            refund: 0,
            to_end_nanos,
            keep: 0,
            want: 0,
            share: 0,
            floor: None,
            tag: 0,
        };
        let entries = [
            entry("gcra-slow", &gcra_slow, 3, 0),
            entry("fixed", &fixed, 5, to(start + hour.as_nanos() as i128)),
            entry("sliding", &sliding, 4, to(start)),
            entry("gcra-fast", &gcra_fast, 2, 0),
            entry("sliding", &sliding, 6, to(start + hour.as_nanos() as i128)),
            entry("bucket", &bucket, 4, 0),
        ];
        let synced = sync_batch(&store, &entries, batch, ALONE).await.unwrap();
        let backlog = |s: &Synced| match s.state {
            GlobalState::Backlog(b) => b,
            other => panic!("{other:?}"),
        };
        assert_eq!(backlog(&synced[0]), Duration::from_secs(3), "{prefix}");
        assert_eq!(synced[0].grant, Some(7), "{prefix}");
        assert_eq!(backlog(&synced[3]), Duration::from_millis(200), "{prefix}");
        assert_eq!(synced[3].grant, Some(3), "{prefix}");
        assert_eq!(backlog(&synced[5]), Duration::from_secs(4), "{prefix}");
        assert_eq!(synced[5].grant, Some(16), "{prefix}");
        let GlobalState::Window { count, to_end } = synced[1].state else {
            panic!("{:?}", synced[1])
        };
        assert_eq!(count, 5, "{prefix}");
        assert!(to_end <= hour && to_end > hour - Duration::from_secs(60));
        assert_eq!(synced[1].grant, Some(95), "{prefix}");
        // The key's first entry sees the previous window's 4 alone; its second, 20 ms or so into
        // the window, both: the previous window's 4 weigh 3 (rounded down), so 9 are used.
        let GlobalState::Sliding {
            current, previous, ..
        } = synced[2].state
        else {
            panic!("{:?}", synced[2])
        };
        assert_eq!((current, previous), (0, 4), "{prefix}");
        let GlobalState::Sliding {
            current,
            previous,
            to_end,
        } = synced[4].state
        else {
            panic!("{:?}", synced[4])
        };
        assert_eq!((current, previous), (6, 4), "{prefix}");
        assert!(to_end <= hour && to_end > hour - Duration::from_secs(60));
        assert_eq!(synced[4].grant, Some(91), "{prefix}");
    }
}

/// One sync call larger than the script's chunks: more keys than one `MGET` reads (a thousand)
/// and more integers than one packing of the reply holds (a thousand), ending on a partial
/// chunk. Every key's own count comes back in its own place, and a second call reads what the
/// first wrote.
#[tokio::test]
async fn a_sync_call_of_thousands_of_keys_answers_every_key_in_its_place() {
    use sluice_hybrid::sync::{GlobalState, SyncEntry};

    let server = RedisServer::start();
    let hour = Duration::from_secs(3600);
    let store = store_at_hour_start(&server).await;
    let sliding: Policy = SlidingCounter::new(1_000, hour).unwrap().into();
    let now = store_now(&store);
    let end = now - now % hour.as_nanos() as i128 + hour.as_nanos() as i128;
    // 1,501 keys of 4 integers each: 6,004 integers, the last chunk of the reply holds 4.
    let units = |i: usize| (i % 97 + 1) as u64;
    let entries: Vec<SyncEntry> = (0..1_501)
        .map(|i| SyncEntry {
            key: format!("many:{i}"),
            policy: sliding.clone(),
            units: units(i),
            refund: 0,
            to_end_nanos: i64::try_from(end - now).unwrap(),
            keep: 0,
            want: 0,
            share: 0,
            floor: None,
            tag: 0,
        })
        .collect();
    for round in 1..=2u64 {
        let synced = sync_batch(&store, &entries, 2_000, ALONE).await.unwrap();
        assert_eq!(synced.len(), entries.len());
        for (i, s) in synced.iter().enumerate() {
            let GlobalState::Sliding {
                current, previous, ..
            } = s.state
            else {
                panic!("key {i}: {s:?}")
            };
            assert_eq!((current, previous), (round * units(i), 0), "key {i}");
            assert_eq!(s.grant, Some(1_000 - round * units(i)), "key {i}");
        }
    }
}

/// Units sent again under the attempt that first sent them are counted once: Redis keeps the
/// last attempt it ran of the instance on the key, so a call that timed out but ran, followed
/// by the next attempt with the same units, or by the late run of an older attempt, adds nothing
/// twice; units of a later attempt are counted.
#[tokio::test]
async fn units_sent_again_under_their_attempt_are_counted_once() {
    use sluice_hybrid::sync::{GlobalState, SyncEntry};

    let server = RedisServer::start();
    let store = store_at_hour_start(&server).await;
    let hour = Duration::from_secs(3600);
    let fixed: Policy = FixedWindow::new(100, hour, Alignment::Clock { utc_offset_secs: 0 })
        .unwrap()
        .into();
    let now = store_now(&store);
    let end = now - now % hour.as_nanos() as i128 + hour.as_nanos() as i128;
    let entry = |units: u64, tag: u64| SyncEntry {
        key: "attempts".to_owned(),
        policy: fixed.clone(),
        units,
        refund: 0,
        to_end_nanos: i64::try_from(end - now).unwrap(),
        keep: 0,
        want: 0,
        share: 0,
        floor: None,
        tag,
    };
    let count = |entries: Vec<SyncEntry>, attempt: u64| {
        let store = store.clone();
        async move {
            let claimant = Claimant { attempt, ..ALONE };
            let synced = sync_batch(&store, &entries, 512, claimant).await.unwrap();
            match synced.last().unwrap().state {
                GlobalState::Window { count, .. } => count,
                other => panic!("{other:?}"),
            }
        }
    };
    // Attempt 1 runs (its answer lost, say); attempt 2 sends its 5 again with 3 of its own.
    assert_eq!(count(vec![entry(5, 1)], 1).await, 5);
    assert_eq!(count(vec![entry(5, 1), entry(3, 2)], 2).await, 8);
    // Attempt 1 again, late: nothing; attempt 3 with units of its own, and 2's again.
    assert_eq!(count(vec![entry(5, 1)], 1).await, 8);
    assert_eq!(count(vec![entry(3, 2), entry(4, 3)], 3).await, 12);
    // Untagged units are always counted, as an instance of an earlier layout sends them.
    assert_eq!(count(vec![entry(1, 0)], 0).await, 13);
}
