//! What the hybrid store promises beyond the shared suite: instances share one limit through
//! Redis, a unit stays in the window it was counted in, a key over its limit costs Redis
//! nothing, and decisions go on while Redis is away, with their units reconciled when it
//! returns. Time moves by a fake clock and explicit syncs, never by sleeping.

use std::time::Duration;

use sluice_core::{
    Alignment, Check, FakeClock, FixedWindow, Gcra, Policy, Rate, SlidingCounter, Store, Timestamp,
    TokenBucket,
};
use sluice_hybrid::{HybridOptions, HybridStore};
use sluice_redis::RedisStore;
use sluice_redis::testing::{
    RedisServer, offset_to_window_start, redis_time_nanos, test_options, unique_prefix,
};
use sluice_test_support::eventually;

/// `n` hybrid stores ("instances") on the Redis at `port`, sharing one prefix, each on the same
/// fake clock, which starts 20 ms into a minute of the stores' Redis time.
async fn instances(port: u16, n: usize) -> (FakeClock, Vec<HybridStore<FakeClock>>) {
    instances_with(
        port,
        n,
        HybridOptions::default(),
        Duration::from_millis(500),
    )
    .await
}

/// [`instances`] with `hybrid` as every store's options, and `timeout` for each Redis call.
async fn instances_with(
    port: u16,
    n: usize,
    hybrid: HybridOptions,
    timeout: Duration,
) -> (FakeClock, Vec<HybridStore<FakeClock>>) {
    let url = format!("redis://127.0.0.1:{port}");
    let prefix = unique_prefix();
    let offset = offset_to_window_start(port, Duration::from_secs(60));
    let start = u64::try_from(redis_time_nanos(port) + offset).unwrap();
    let clock = FakeClock::at(Timestamp::from_nanos(start));
    let mut stores = Vec::new();
    for _ in 0..n {
        let options = test_options()
            .prefix(prefix.clone())
            .timeout(timeout)
            .breaker_cool_down(Duration::from_millis(1));
        let redis = RedisStore::connect(&url, options).await.unwrap();
        redis.set_time_offset(offset);
        stores.push(HybridStore::with_clock(
            redis,
            hybrid.clone(),
            clock.clone(),
        ));
    }
    meet(&clock, &stores).await;
    (clock, stores)
}

/// Every instance counts every other as live: two rounds of heartbeats, each half a heartbeat's
/// time to live apart (an instance learns of the others from its own next heartbeat). A fake
/// clock moved by minutes leaves every heartbeat expired, as a real clock never does.
async fn meet(clock: &FakeClock, stores: &[HybridStore<FakeClock>]) {
    for _ in 0..2 {
        advance(clock, stores, Duration::from_millis(260));
        for s in stores {
            let _ = s.sync_now().await;
        }
    }
}

fn advance(clock: &FakeClock, stores: &[HybridStore<FakeClock>], d: Duration) {
    clock.advance(d);
    for s in stores {
        s.redis().advance_time(d);
    }
}

/// Every instance learns of `key`, and reads its global state: what an instance that has served
/// a key for a while knows. (An instance's first request on a key is decided on a fresh counter:
/// see the error bound in `docs/hybrid-store.md`.)
async fn warm(stores: &[HybridStore<FakeClock>], key: &str, policy: &Policy) {
    for s in stores {
        s.peek(key, policy).await.unwrap();
        s.sync_now().await.unwrap();
    }
}

/// Every instance in turn syncs and then admits what it may of 50 requests, round after round,
/// until a round admits none: all the limit had left, taken through the grants of successive
/// syncs.
async fn take_all(stores: &[HybridStore<FakeClock>], key: &str, policy: &Policy) -> u64 {
    let mut total = 0;
    loop {
        let mut round = 0;
        for s in stores {
            s.sync_now().await.unwrap();
            round += admitted(s, key, policy, 50).await;
        }
        if round == 0 {
            return total;
        }
        total += round;
    }
}

async fn admitted(store: &HybridStore<FakeClock>, key: &str, policy: &Policy, n: u64) -> u64 {
    let mut ok = 0;
    for _ in 0..n {
        let d = store.check(&[Check::new(key, policy, 1)]).await.unwrap();
        ok += u64::from(d[0].allowed);
    }
    ok
}

/// What the first of `checks` has left, as `store` answers them.
async fn look(store: &HybridStore<FakeClock>, checks: &[Check<'_>]) -> u64 {
    store.check(checks).await.unwrap()[0].remaining
}

/// A fixed window of `limit` over `secs` seconds, starting at a key's first request.
fn window_from_first_request(limit: u64, secs: u64) -> Policy {
    FixedWindow::new(limit, Duration::from_secs(secs), Alignment::FirstRequest)
        .unwrap()
        .into()
}

fn supported() -> Vec<Policy> {
    let minute = Duration::from_secs(60);
    vec![
        FixedWindow::new(100, minute, Alignment::Clock { utc_offset_secs: 0 })
            .unwrap()
            .into(),
        FixedWindow::new(100, minute, Alignment::FirstRequest)
            .unwrap()
            .into(),
        SlidingCounter::new(100, minute).unwrap().into(),
        TokenBucket::new(100, Rate::per_minute(1)).unwrap().into(),
        Gcra::new(Rate::per_minute(1), 100).unwrap().into(),
    ]
}

/// Three instances share one limit: what one admitted, the others see after a sync, and the
/// total never passes the limit when every instance syncs between bursts.
#[tokio::test]
async fn instances_share_one_limit_after_a_sync() {
    let server = RedisServer::start();
    let (_clock, stores) = instances(server.port, 3).await;
    for p in supported() {
        let key = format!("shared:{p:?}");
        warm(&stores, &key, &p).await;
        let mut total = 0;
        for round in 0..40 {
            let s = &stores[round % 3];
            total += admitted(s, &key, &p, 30).await;
            // The instance that admitted pushes first; the others then read.
            s.sync_now().await.unwrap();
            for s in &stores {
                s.sync_now().await.unwrap();
            }
        }
        // Each instance takes a sixth of what is left (half of an even split), down to a unit
        // while every instance can have one: at most one unit short per instance.
        assert!((97..=100).contains(&total), "{}: {total}", p.algorithm());
        for s in &stores {
            let d = s.peek(&key, &p).await.unwrap();
            assert_eq!(
                d.remaining,
                100 - total,
                "{} everyone sees the limit used",
                p.algorithm()
            );
        }
    }
}

/// A key new to every instance: before its first sync each admits at most its share of the
/// limit, unreserved (half of an even split); after that, grants reserved in Redis take the
/// total to exactly the limit and never past it.
#[tokio::test]
async fn a_new_key_admits_a_share_per_instance_and_then_exactly_the_limit() {
    let server = RedisServer::start();
    let (_clock, stores) = instances(server.port, 2).await;
    let p = window_from_first_request(10, 60);
    // A share of 10 between two live instances: 10 / 4, rounded down.
    assert_eq!(admitted(&stores[0], "burst", &p, 10).await, 2);
    assert_eq!(admitted(&stores[1], "burst", &p, 10).await, 2);
    assert_eq!(take_all(&stores, "burst", &p).await, 6);
    let over: u64 = stores.iter().map(|s| s.stats().over_admitted).sum();
    assert_eq!(over, 0, "nothing admitted past the limit");
}

/// Three instances admit and sync in a seeded random order, some admitting many requests
/// between their syncs and some few: whatever the order, what they admit together never passes
/// the limit (every instance admits only what its last sync reserved for it in Redis, or its
/// first share of a key no sync has reserved), and syncing on takes them to exactly the limit.
#[tokio::test]
async fn in_any_order_of_checks_and_syncs_the_instances_never_pass_the_limit() {
    let server = RedisServer::start();
    let (_clock, stores) = instances(server.port, 3).await;
    let mut seed: u64 = 0x5eed_1234_abcd_0001;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    for p in supported() {
        for round in 0..4 {
            let key = format!("order:{round}:{p:?}");
            let mut total = 0;
            for _ in 0..120 {
                let s = &stores[usize::try_from(next(3)).unwrap()];
                if next(3) == 0 {
                    s.sync_now().await.unwrap();
                } else {
                    total += admitted(s, &key, &p, 1 + next(12)).await;
                    assert!(total <= 100, "{}: {total} admitted", p.algorithm());
                }
            }
            total += take_all(&stores, &key, &p).await;
            assert_eq!(total, 100, "{}: all of the limit, no more", p.algorithm());
        }
    }
}

/// A look at a key (a check of cost 0, alone or beside other checks) on an instance that never
/// served it answers from an empty counter the first time, and has the next sync read the key,
/// so that the next look sees what the other instances took. Before, such a look never tracked
/// the key, and answered the whole limit however much the others had used.
#[tokio::test]
async fn a_look_at_a_key_another_instance_serves_sees_its_usage_after_a_sync() {
    let server = RedisServer::start();
    let (_clock, stores) = instances(server.port, 2).await;
    for (i, p) in supported().into_iter().enumerate() {
        for beside in [false, true] {
            let (key, other) = (format!("looked:{i}:{beside}"), format!("other:{i}"));
            stores[0].peek(&key, &p).await.unwrap();
            stores[0].sync_now().await.unwrap();
            // Within the first share of an instance among two (100 / 4).
            assert_eq!(admitted(&stores[0], &key, &p, 20).await, 20, "{p}");
            stores[0].sync_now().await.unwrap();
            let checks = [Check::new(&key, &p, 0), Check::new(&other, &p, 1)];
            let checks = if beside { &checks[..] } else { &checks[..1] };
            assert_eq!(look(&stores[1], checks).await, 100, "{p}, {beside}: first");
            stores[1].sync_now().await.unwrap();
            assert_eq!(look(&stores[1], checks).await, 80, "{p}, {beside}: synced");
        }
    }
}

/// A key only one of three live instances serves (clients that stick to one instance): while
/// the key is young the others' first shares are set aside for them, in case they are admitting
/// on it unsynced; once it is older than a claim's time to live, the one instance takes the
/// whole limit.
#[tokio::test]
async fn a_key_served_by_one_instance_of_three_gets_its_whole_limit() {
    let server = RedisServer::start();
    let (clock, stores) = instances(server.port, 3).await;
    let p = window_from_first_request(100, 60);
    // Two shares of 16 (100 / 6) set aside for the two instances that have not synced the key.
    assert_eq!(take_all(&stores[..1], "sticky", &p).await, 68);
    // The heartbeats stay live while the key ages past a claim's time to live (500 ms).
    meet(&clock, &stores).await;
    assert_eq!(take_all(&stores[..1], "sticky", &p).await, 32);
}

/// Units counted in one window are never added to the next: a sync that comes after the window
/// ended drops them, and the new window starts from zero everywhere.
#[tokio::test]
async fn units_never_move_to_the_next_window() {
    let server = RedisServer::start();
    let (clock, stores) = instances(server.port, 2).await;
    let minute = Duration::from_secs(60);
    let windows: [Policy; 2] = [
        FixedWindow::new(40, minute, Alignment::Clock { utc_offset_secs: 0 })
            .unwrap()
            .into(),
        SlidingCounter::new(40, minute).unwrap().into(),
    ];
    for p in &windows {
        let key = format!("windows:{}", p.algorithm());
        warm(&stores, &key, p).await;
        assert_eq!(admitted(&stores[0], &key, p, 6).await, 6);
        // The window ends (and, for the sliding counter, the one after too) before any sync.
        advance(&clock, &stores, 2 * minute);
        stores[0].sync_now().await.unwrap();
        meet(&clock, &stores).await;
        warm(&stores, &key, p).await;
        for s in &stores {
            assert_eq!(admitted(s, &key, p, 5).await, 5, "{}", p.algorithm());
        }
    }
    // A fixed window's units synced just after their window ended are not counted in the next.
    let p = &windows[0];
    warm(&stores, "windows:next", p).await;
    assert_eq!(admitted(&stores[0], "windows:next", p, 6).await, 6);
    advance(&clock, &stores, minute);
    stores[0].sync_now().await.unwrap();
    meet(&clock, &stores).await;
    warm(&stores, "windows:next", p).await;
    // The new window has all its 40 left, not the 34 it would have had with the 6 moved over.
    assert_eq!(take_all(&stores, "windows:next", p).await, 40);
    // A sliding counter's units synced one window late still weigh, as the previous window.
    let p = &windows[1];
    warm(&stores, "windows:late", p).await;
    assert_eq!(admitted(&stores[0], "windows:late", p, 8).await, 8);
    advance(&clock, &stores, minute);
    stores[0].sync_now().await.unwrap();
    meet(&clock, &stores).await;
    warm(&stores, "windows:late", p).await;
    // About a second into the next window, the previous window's 8 weigh 7 (rounded down): 33
    // are left (40 had the units been dropped).
    assert_eq!(take_all(&stores, "windows:late", p).await, 33);
}

/// The sync script's calls so far: each reads its keys with one `MGET` (per thousand keys),
/// which Redis counts among its commands though a script calls it. The heartbeat's script,
/// which reads no key, is not counted.
fn script_calls(server: &RedisServer) -> u64 {
    let stats = server.command(&["INFO", "commandstats"]).unwrap();
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_mget:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// A key over its limit is answered locally until its reset: no script call, however many
/// requests and syncs. After the reset, the sync reads it again.
#[tokio::test]
async fn a_key_over_its_limit_costs_redis_nothing_until_its_reset() {
    let server = RedisServer::start();
    let (clock, stores) = instances(server.port, 1).await;
    let store = &stores[0];
    let p = window_from_first_request(5, 10);
    assert_eq!(admitted(store, "hot", &p, 5).await, 5);
    store.sync_now().await.unwrap();
    assert_eq!(store.stats().negative_cached, 1);
    let before = script_calls(&server);
    for _ in 0..10 {
        assert_eq!(admitted(store, "hot", &p, 100).await, 0);
        store.sync_now().await.unwrap();
    }
    assert_eq!(
        script_calls(&server),
        before,
        "no Redis call for a key known over its limit"
    );
    advance(&clock, &stores, Duration::from_secs(11));
    assert_eq!(store.stats().negative_cached, 0);
    assert_eq!(admitted(store, "hot", &p, 1).await, 1);
    store.sync_now().await.unwrap();
    assert!(script_calls(&server) > before);
}

/// A key that sees no request is not read by every sync, only every quarter of a claim's time
/// to live (125 ms here), to renew the instance's claim on it; a request far from the limit and
/// within the claim waits for that renewal too.
#[tokio::test]
async fn an_idle_key_is_read_only_to_renew_its_claim() {
    let server = RedisServer::start();
    let (clock, stores) = instances(server.port, 2).await;
    let p = window_from_first_request(100, 60);
    let store = &stores[0];
    assert_eq!(admitted(store, "idle", &p, 3).await, 3);
    store.sync_now().await.unwrap();
    let before = script_calls(&server);
    for _ in 0..5 {
        advance(&clock, &stores, Duration::from_millis(20));
        store.sync_now().await.unwrap();
    }
    assert_eq!(script_calls(&server), before, "an idle key is not read");
    advance(&clock, &stores, Duration::from_millis(30));
    store.sync_now().await.unwrap();
    assert_eq!(script_calls(&server), before + 1, "its claim is renewed");
    store.sync_now().await.unwrap();
    assert_eq!(script_calls(&server), before + 1, "and then left alone");
    assert_eq!(admitted(store, "idle", &p, 1).await, 1);
    store.sync_now().await.unwrap();
    assert_eq!(script_calls(&server), before + 1, "a cold request waits");
    advance(&clock, &stores, Duration::from_millis(130));
    store.sync_now().await.unwrap();
    assert_eq!(
        script_calls(&server),
        before + 2,
        "and goes with the renewal"
    );
}

/// Among several instances, a key far from its limit keeps its units for the renewal of its
/// claim, and what the instances admit together still never passes the limit: every unit is
/// inside a claim that the others' grants set aside. A key near its limit, or an allowance that
/// runs short, is sent at the next sync.
#[tokio::test]
async fn cold_units_wait_within_their_claim_and_near_the_limit_they_go_at_once() {
    let server = RedisServer::start();
    let (clock, stores) = instances(server.port, 2).await;
    let p = window_from_first_request(100, 60);
    let keys: Vec<String> = (0..20).map(|i| format!("cold:{i}")).collect();
    for key in &keys {
        warm(&stores, key, &p).await;
    }
    // A window that starts at a key's first request: its first units are sent at once, since
    // the instance had no claim in it; later ones wait.
    let mut before = 0;
    for round in 0..4 {
        advance(&clock, &stores, Duration::from_millis(20));
        for key in &keys {
            assert_eq!(admitted(&stores[0], key, &p, 1).await, 1);
        }
        stores[0].sync_now().await.unwrap();
        if round == 0 {
            before = script_calls(&server);
        }
    }
    assert_eq!(script_calls(&server), before, "cold units wait");
    // The other instance takes what its claim and the free units allow: the first's claim,
    // though unsent, is set aside.
    let taken = take_all(&stores[1..], &keys[0], &p).await;
    assert!(taken <= 96, "{taken} taken beside 4 unsent");
    // Near its limit now, as the first instance learns at its renewal: sent at every sync.
    advance(&clock, &stores, Duration::from_millis(70));
    stores[0].sync_now().await.unwrap();
    let total = 4 + taken + take_all(&stores, &keys[0], &p).await;
    assert_eq!(total, 100, "the limit, no more");
    stores[0].sync_now().await.unwrap();
    let sent = script_calls(&server);
    assert_eq!(admitted(&stores[0], &keys[1], &p, 1).await, 1);
    stores[0].sync_now().await.unwrap();
    assert_eq!(script_calls(&server), sent, "a cold request waits");
    // Asked for more than half its allowance since its last sync: sent at once.
    assert!(admitted(&stores[0], &keys[2], &p, 45).await > 2);
    stores[0].sync_now().await.unwrap();
    assert!(
        script_calls(&server) > sent,
        "a short allowance is renewed at once"
    );
}

/// A lone instance sends nothing for units that its counter has refilled since (a bucket) or
/// whose window has ended: they weigh on nothing any more. A key far from its limit waits up to
/// a claim's time to live; once a second instance is live, everything unsent goes at the next
/// sync, and the newcomer sees it.
#[tokio::test]
async fn a_lone_instance_sends_what_still_weighs_and_everything_when_another_joins() {
    let server = RedisServer::start();
    let (clock, stores) = instances(server.port, 2).await;
    // The second instance stops beating: the first counts itself alone again.
    advance(&clock, &stores, Duration::from_millis(600));
    stores[0].sync_now().await.unwrap();
    advance(&clock, &stores, Duration::from_millis(10));
    stores[0].sync_now().await.unwrap();
    assert_eq!(stores[0].stats().instances, 1);
    let fast: Policy = Gcra::new(Rate::per_second(1000), 1000).unwrap().into();
    let p = window_from_first_request(100, 60);
    let before = script_calls(&server);
    for i in 0..50 {
        assert_eq!(
            admitted(&stores[0], &format!("refilled:{i}"), &fast, 1).await,
            1
        );
    }
    advance(&clock, &stores, Duration::from_millis(20));
    stores[0].sync_now().await.unwrap();
    assert_eq!(script_calls(&server), before, "refilled units are not sent");
    assert_eq!(stores[0].tracked_keys(), Some(0));
    // A window far from its limit: read once, then its units wait.
    assert_eq!(admitted(&stores[0], "lone", &p, 3).await, 3);
    stores[0].sync_now().await.unwrap();
    let read = script_calls(&server);
    assert!(read > before);
    assert_eq!(admitted(&stores[0], "lone", &p, 7).await, 7);
    advance(&clock, &stores, Duration::from_millis(20));
    stores[0].sync_now().await.unwrap();
    assert_eq!(
        script_calls(&server),
        read,
        "far from its limit, alone: units wait"
    );
    // The second instance is back: the first, which keeps units unsent, beats at every sync
    // and learns of it one interval later (not half a heartbeat's life), then sends what it
    // kept.
    stores[1].sync_now().await.unwrap();
    advance(&clock, &stores, Duration::from_millis(20));
    stores[0].sync_now().await.unwrap();
    assert_eq!(stores[0].stats().instances, 2);
    stores[0].sync_now().await.unwrap();
    stores[1].peek("lone", &p).await.unwrap();
    stores[1].sync_now().await.unwrap();
    assert_eq!(stores[1].peek("lone", &p).await.unwrap().remaining, 90);
}

/// Redis is killed: decisions go on locally without an error, syncs fail and keep their units;
/// Redis comes back empty, and the next sync puts the count it held and the units admitted
/// meanwhile back into the global count, which another instance then sees.
#[tokio::test]
async fn decisions_go_on_while_redis_is_away_and_units_are_reconciled() {
    let mut server = RedisServer::start();
    let (clock, stores) = instances(server.port, 2).await;
    let p: Policy = FixedWindow::new(
        100,
        Duration::from_secs(60),
        Alignment::Clock { utc_offset_secs: 0 },
    )
    .unwrap()
    .into();
    warm(&stores, "away", &p).await;
    assert_eq!(admitted(&stores[0], "away", &p, 20).await, 20);
    stores[0].sync_now().await.unwrap();
    server.kill();
    // A goes on admitting without Redis within what its last sync reserved for it (B holds a
    // claim on the rest), and then refuses, so that a partition cannot overrun the limit.
    let away = admitted(&stores[0], "away", &p, 80).await;
    assert!(
        away > 0 && away < 80,
        "admitted while Redis was away: {away}"
    );
    assert!(stores[0].sync_now().await.is_err());
    assert!(stores[0].sync_now().await.is_err());
    let stats = stores[0].stats();
    assert_eq!(
        stats.pending_units, away,
        "the units admitted meanwhile are kept"
    );
    assert!(stats.sync_failures >= 2);
    // The local count goes on from the last global one.
    assert_eq!(
        stores[0].peek("away", &p).await.unwrap().remaining,
        80 - away
    );
    // Once its claims would have lapsed in Redis, a request beyond them is the rule's to decide
    // (`on_store_error`): the store reports Redis away instead of refusing.
    advance(&clock, &stores, Duration::from_millis(300));
    let lapsed = stores[0].check(&[Check::new("away", &p, 1)]).await;
    assert!(
        matches!(lapsed, Err(sluice_core::StoreError::Unavailable(_))),
        "{lapsed:?}"
    );
    server.restart();
    for s in &stores {
        eventually("the sync succeeds again", || {
            let s = s.clone();
            async move { s.sync_now().await.is_ok() }
        })
        .await;
    }
    assert_eq!(stores[0].stats().pending_units, 0);
    // Redis came back empty: the units admitted while it was away are in the global count, and
    // so are the 20 pushed before it went, which the instances gave back as their floor.
    warm(&stores[1..], "away", &p).await;
    assert_eq!(
        stores[1].peek("away", &p).await.unwrap().remaining,
        80 - away
    );
}

/// What a rule's `on_store_error` does with a check the store could not decide, as the limiter
/// does it: `deny` refuses; `allow` admits, and tells the store it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnError {
    Deny,
    Allow,
}

/// One request as the limiter makes it: the store's decision, or the rule's `on_store_error`.
async fn request(store: &HybridStore<FakeClock>, key: &str, p: &Policy, on: OnError) -> bool {
    let check = Check::new(key, p, 1);
    match store.check(&[check]).await {
        Ok(d) => d[0].allowed,
        Err(_) if on == OnError::Deny => false,
        Err(_) => {
            Store::admitted_without_store(store, &[check]);
            true
        }
    }
}

/// What [`through_a_fault`] saw: the units admitted, and the time Redis's clock moved
/// meanwhile (the fake clock's steps, and the real time the run took, which Redis's clock counts
/// too: a bucket refills by it).
struct Run {
    admitted: u64,
    redis_elapsed: Duration,
}

/// How Redis goes away in [`through_a_fault`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL, and 3 s later started again, empty.
    Restart,
    /// SIGSTOP, and SIGCONT 5 s later: calls time out, and those that reached it run when it
    /// resumes.
    Stall,
}

/// The process id of the `redis-server` of `server`, as it reports it.
fn redis_pid(server: &RedisServer) -> String {
    let info = server.command(&["INFO", "server"]).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .to_owned()
}

/// Sends `signal` to the process `pid` (a `redis-server` this test started).
fn signal(pid: &str, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, pid])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// The outages of issue 28 on one key of 1,000: three instances take 60 requests a second
/// between them, each syncing every 50 ms; Redis goes away 8 s in (about 480 admitted and
/// synced) by `fault`; the requests go on to 25 s, past the limit. The windows are an hour
/// long, so that the whole run is in one.
async fn through_a_fault(p: &Policy, on: OnError, fault: Fault) -> Run {
    let mut server = RedisServer::start();
    let step = Duration::from_millis(50);
    let hybrid = HybridOptions {
        sync_interval: step,
        ..HybridOptions::default()
    };
    // A stalled Redis costs each call its timeout in real time: a short one keeps the test short.
    let timeout = match fault {
        Fault::Restart => Duration::from_millis(500),
        Fault::Stall => Duration::from_millis(20),
    };
    let (clock, stores) = instances_with(server.port, 3, hybrid, timeout).await;
    let key = format!("fault:{on:?}");
    let pid = redis_pid(&server);
    let began = std::time::Instant::now();
    let mut admitted = 0;
    let steps = 500u32;
    let (away, back) = match fault {
        Fault::Restart => (160, 220),
        Fault::Stall => (160, 260),
    };
    for n in 0..steps {
        if n == away {
            match fault {
                Fault::Restart => server.kill(),
                Fault::Stall => signal(&pid, "-STOP"),
            }
        }
        if n == back {
            match fault {
                Fault::Restart => server.restart(),
                Fault::Stall => signal(&pid, "-CONT"),
            }
            // Reconnecting takes the client a moment of real time; the fake clock waits for it.
            for s in &stores {
                eventually("a sync reaches the new Redis", || {
                    let s = s.clone();
                    async move { s.sync_now().await.is_ok() }
                })
                .await;
            }
        }
        for s in &stores {
            admitted += u64::from(request(s, &key, p, on).await);
        }
        advance(&clock, &stores, step);
        for s in &stores {
            let _ = s.sync_now().await;
        }
    }
    Run {
        admitted,
        redis_elapsed: step * steps + began.elapsed(),
    }
}

/// Redis killed and restarted empty mid-window, for every algorithm: the instances give Redis
/// back the count they last read from it, and push what they admitted meanwhile, so the window
/// admits no more than the limit with `on_store_error: deny`, nor with `allow`, whose admissions
/// during the outage are counted once Redis is back. Before, the instances adopted Redis's empty
/// state: 1,480 or so with `deny`, more with `allow`. What may be missing is what the other
/// instances pushed in the last round of syncs before the kill after the read of the instance
/// that knew most: at most one sync interval of traffic (3 requests here). A bucket refills
/// meanwhile, so its bound is its capacity plus the refill over Redis's clock.
#[tokio::test]
async fn a_redis_restarted_empty_mid_window_is_given_back_its_count() {
    let hour = Duration::from_secs(3600);
    let per_hour = Rate::new(1_000, hour).unwrap();
    let policies: [Policy; 5] = [
        FixedWindow::new(1_000, hour, Alignment::Clock { utc_offset_secs: 0 })
            .unwrap()
            .into(),
        window_from_first_request(1_000, 3600),
        SlidingCounter::new(1_000, hour).unwrap().into(),
        TokenBucket::new(1_000, per_hour).unwrap().into(),
        Gcra::new(per_hour, 1_000).unwrap().into(),
    ];
    let interval = 3;
    let mut over = Vec::new();
    for p in &policies {
        for on in [OnError::Deny, OnError::Allow] {
            let run = through_a_fault(p, on, Fault::Restart).await;
            let refill = match p {
                Policy::TokenBucket(_) | Policy::Gcra(_) => {
                    (run.redis_elapsed.as_secs_f64() * 1_000.0 / 3_600.0).ceil() as u64
                }
                _ => 0,
            };
            let bound = 1_000 + refill + interval;
            eprintln!(
                "{} {on:?}: {} admitted of 1,000 (refill {refill}, bound {bound})",
                p.algorithm(),
                run.admitted
            );
            if run.admitted > bound {
                over.push(format!(
                    "{} {on:?}: {} > {bound}",
                    p.algorithm(),
                    run.admitted
                ));
            }
        }
    }
    assert!(over.is_empty(), "{over:?}");
}

/// Redis stalled for 5 s (SIGSTOP) mid-window: with `on_store_error: allow`, what the fallback
/// admitted while the calls timed out is counted once Redis answers again, so the window
/// admits no more than the limit (before: +28% in the run, never counted). Calls that
/// reached Redis before it stopped run when it resumes, and their units are pushed again by the
/// next sync: counted more than once, never less, so `deny` may admit less than the limit.
#[tokio::test]
async fn a_redis_stalled_mid_window_counts_what_allow_admitted() {
    let p = FixedWindow::new(
        1_000,
        Duration::from_secs(3600),
        Alignment::Clock { utc_offset_secs: 0 },
    )
    .unwrap()
    .into();
    for on in [OnError::Deny, OnError::Allow] {
        let run = through_a_fault(&p, on, Fault::Stall).await;
        eprintln!(
            "fixed_window {on:?}, stalled: {} admitted of 1,000",
            run.admitted
        );
        assert!(run.admitted <= 1_003, "{on:?}: {}", run.admitted);
    }
}

/// A flush (`FLUSHALL`) is a loss like a restart: the instances give the count back. A reset is
/// not: its marker starts the key afresh, and no instance lays the count it read before on it.
#[tokio::test]
async fn a_flush_is_given_back_and_a_reset_is_not() {
    let server = RedisServer::start();
    let (clock, stores) = instances(server.port, 2).await;
    // Every instance reads every key it tracks, as it does every quarter of a claim's time to
    // live.
    let renew = || async {
        advance(&clock, &stores, Duration::from_millis(130));
        for s in &stores {
            s.sync_now().await.unwrap();
        }
    };
    for p in supported() {
        let key = format!("flush:{p:?}");
        warm(&stores, &key, &p).await;
        let used =
            admitted(&stores[0], &key, &p, 30).await + admitted(&stores[1], &key, &p, 5).await;
        assert!(used > 5, "{}", p.algorithm());
        for s in &stores {
            s.sync_now().await.unwrap();
        }
        renew().await;
        server.command(&["FLUSHALL"]).unwrap();
        // Both instances sync the lost key: it holds what they read, once, not twice.
        renew().await;
        let left = |s: &HybridStore<FakeClock>| {
            let s = s.clone();
            let p = p.clone();
            let key = key.clone();
            async move { s.peek(&key, &p).await.unwrap().remaining }
        };
        let after_flush = left(&stores[1]).await;
        assert!(
            (100 - used..=100 - used + 1).contains(&after_flush),
            "{}: {after_flush} left after a flush, {used} used",
            p.algorithm()
        );
        assert!(Store::reset(&stores[0], &key).await.unwrap());
        renew().await;
        warm(&stores[..1], &key, &p).await;
        assert_eq!(
            left(&stores[0]).await,
            100,
            "{} after a reset",
            p.algorithm()
        );
        assert_eq!(
            left(&stores[1]).await,
            100,
            "{} after a reset",
            p.algorithm()
        );
    }
}

/// The sliding log and the queue are refused when rules load, with a reason.
#[tokio::test]
async fn unsupported_algorithms_are_refused_with_a_reason() {
    let log: Policy = sluice_core::SlidingLog::new(5, Duration::from_secs(1))
        .unwrap()
        .into();
    let queue: Policy =
        sluice_core::LeakyQueue::new(Rate::per_second(5), 4, Duration::from_secs(1))
            .unwrap()
            .into();
    for p in [log, queue] {
        let e = sluice_hybrid::hybrid_supports(&p).unwrap_err();
        assert_eq!(e.store, "hybrid");
        assert!(e.reason.contains("fixed_window"), "{}", e.reason);
    }
    for p in supported() {
        assert!(sluice_hybrid::hybrid_supports(&p).is_ok());
    }
}

/// Checks of one request on one key take from the instance's share by their costs: two checks
/// of 3 units cannot pass on a share of 4.
#[tokio::test]
async fn repeated_checks_of_a_request_take_their_costs_from_the_share() {
    let server = RedisServer::start();
    let (_clock, stores) = instances(server.port, 2).await;
    let p = window_from_first_request(16, 60);
    // Two live instances: each holds a quarter of what is left, 4 of 16.
    warm(&stores, "costly", &p).await;
    warm(&stores, "costly", &p).await;
    let twice = [Check::new("costly", &p, 3), Check::new("costly", &p, 3)];
    let ds = stores[0].check(&twice).await.unwrap();
    assert!(!ds[1].allowed, "6 units passed on a share of 4: {ds:?}");
    let once = stores[0].check(&twice[..1]).await.unwrap();
    assert!(once[0].allowed, "3 units fit the share of 4: {once:?}");
}

/// A single check is decided at once, with no future (`check_now`), on the same counter and
/// within the same allowance as `check`.
#[tokio::test]
async fn a_single_check_is_decided_at_once_on_the_same_counter() {
    let server = RedisServer::start();
    let (_clock, stores) = instances(server.port, 1).await;
    let store = &stores[0];
    let p = window_from_first_request(5, 60);
    assert_eq!(admitted(store, "now", &p, 3).await, 3);
    let now = |n: u64| {
        (0..n)
            .filter(|_| {
                let d = store.check_now(Check::new("now", &p, 1)).unwrap();
                d.unwrap().allowed
            })
            .count()
    };
    assert_eq!(now(5), 2, "the 2 left after 3 through check");
    assert_eq!(admitted(store, "now", &p, 1).await, 0);
    store.sync_now().await.unwrap();
    assert_eq!(store.stats().negative_cached, 1);
}

/// A store holds at most `max_keys` keys, units not yet pushed included: a new key beyond them is
/// refused with `Full`, alone or within a request of several checks, and once the units are
/// pushed and the counters are full again, their entries make room.
#[tokio::test]
async fn at_max_keys_a_new_key_is_refused_until_spent_entries_make_room() {
    let server = RedisServer::start();
    let clock = FakeClock::at(Timestamp::from_nanos(1_000_000_000_000));
    let redis = RedisStore::connect(&server.url(), test_options())
        .await
        .unwrap();
    let options = HybridOptions {
        max_keys: 2,
        ..HybridOptions::default()
    };
    let store = HybridStore::with_clock(redis, options, clock.clone());
    let p: Policy = Gcra::new(Rate::per_second(10), 10).unwrap().into();
    for key in ["a", "b"] {
        assert!(store.check(&[Check::new(key, &p, 1)]).await.unwrap()[0].allowed);
    }
    let full = |r: sluice_core::StoreResult<Vec<sluice_core::Decision>>| {
        matches!(r, Err(sluice_core::StoreError::Full { max_keys: 2 }))
    };
    assert!(full(store.check(&[Check::new("c", &p, 1)]).await));
    assert!(full(
        store
            .check(&[Check::new("a", &p, 1), Check::new("c", &p, 1)])
            .await
    ));
    // Pushed, and a second later every counter is full again: both entries are spent.
    store.sync_now().await.unwrap();
    clock.advance(Duration::from_secs(1));
    assert!(store.check(&[Check::new("c", &p, 1)]).await.unwrap()[0].allowed);
    assert!(
        store
            .check(&[Check::new("d", &p, 1), Check::new("c", &p, 1)])
            .await
            .unwrap()
            .iter()
            .all(|d| d.allowed)
    );
    assert!(full(store.check(&[Check::new("e", &p, 1)]).await));
}
