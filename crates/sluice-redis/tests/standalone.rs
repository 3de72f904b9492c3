//! The Redis store on one `redis-server`: the shared backend suite, and what only a shared
//! store can show: exactness across instances, skewed application clocks, key layout and TTLs.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Alignment, Check, FixedWindow, Policy, SlidingCounter, Store, StoreError};
use sluice_redis::RedisStore;
use sluice_redis::testing::{
    RedisServer, fifty_per_hour, name, offset_to_window_start, shared_server, standalone_backend,
    store_at_hour_start, test_options,
};
use sluice_test_support::{eventually, wait_until};

sluice_core::backend_suite!(standalone_backend());

/// Three stores (three instances' worth of connections) on one Redis, with 64 concurrent clients
/// spread over them on one key: exactly the limit gets through, for every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_sharing_one_redis_admit_exactly_the_limit() {
    let server = shared_server();
    let options = test_options();
    let offset = offset_to_window_start(server.port, Duration::from_secs(3600));
    let mut stores = Vec::new();
    for _ in 0..3 {
        let store = RedisStore::connect(&server.url(), options.clone())
            .await
            .unwrap();
        store.set_time_offset(offset);
        stores.push(store);
    }
    for policy in fifty_per_hour() {
        let policy = Arc::new(policy);
        let key = format!("instances:{}", name(&policy));
        let clients: Vec<_> = (0..64)
            .map(|i| {
                let store = stores[i % 3].clone();
                let (policy, key) = (policy.clone(), key.clone());
                tokio::spawn(async move {
                    let mut admitted = 0;
                    for _ in 0..3 {
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
        let left = stores[1].peek(&key, &policy).await.unwrap();
        assert_eq!(left.remaining, 0, "{}", name(&policy));
    }
}

/// Instances whose own clocks are hours apart decide clock-aligned windows identically: the
/// scripts read Redis TIME, and the application clock only names some window start near now.
#[tokio::test]
async fn skewed_application_clocks_do_not_matter() {
    let server = shared_server();
    let options = test_options();
    let offset = offset_to_window_start(server.port, Duration::from_secs(60));
    let hour = 3_600_000_000_000_i64;
    let mut stores = Vec::new();
    for skew in [-5 * hour, 0, 7 * hour + 123_456_789] {
        let store = RedisStore::connect(&server.url(), options.clone())
            .await
            .unwrap();
        store.set_time_offset(offset);
        store.set_app_clock_skew(skew);
        stores.push(store);
    }
    let minute = Duration::from_secs(60);
    let policies = [
        Policy::from(FixedWindow::new(6, minute, Alignment::Clock { utc_offset_secs: 0 }).unwrap()),
        Policy::from(
            FixedWindow::new(
                6,
                minute,
                Alignment::Clock {
                    utc_offset_secs: 19_800,
                },
            )
            .unwrap(),
        ),
        Policy::from(SlidingCounter::new(6, minute).unwrap()),
    ];
    for policy in &policies {
        let key = format!("skew:{}", name(policy));
        let mut admitted = 0;
        let mut resets = Vec::new();
        for i in 0..12 {
            let d = stores[i % 3]
                .check(&[Check::new(&key, policy, 1)])
                .await
                .unwrap();
            admitted += u32::from(d[0].allowed);
            if d[0].allowed {
                resets.push(d[0].reset_after);
            }
        }
        assert_eq!(admitted, 6, "{}", name(policy));
        // Every instance sees the same window end (to within the milliseconds between calls).
        let spread = resets
            .iter()
            .max()
            .unwrap()
            .saturating_sub(*resets.iter().min().unwrap());
        assert!(
            spread < Duration::from_secs(1),
            "{}: {resets:?}",
            name(policy)
        );
        // One minute later, by Redis time, every instance sees a fresh window.
        for s in &stores {
            s.advance_time(minute * 2);
        }
        let d = stores[2]
            .check(&[Check::new(&key, policy, 1)])
            .await
            .unwrap();
        assert!(d[0].allowed, "{}", name(policy));
        for s in &stores {
            s.set_time_offset(offset);
        }
    }
}

/// Keys are `prefix:{identity}`, braces in the identity are escaped, and every written key has a
/// TTL no longer than the time until its counter is full again (plus a second).
#[tokio::test]
async fn keys_carry_the_prefix_the_tag_and_a_ttl() {
    let server = shared_server();
    let store = RedisStore::connect(&server.url(), test_options().prefix("layout"))
        .await
        .unwrap();
    let identity = "api|user={evil}";
    assert_eq!(store.key_of(identity), "layout:{api|user=\\(evil\\)}");
    for policy in fifty_per_hour() {
        let key = format!("{identity}:{}", name(&policy));
        let d = store.check(&[Check::new(&key, &policy, 1)]).await.unwrap();
        assert!(d[0].allowed);
        let ttl: i64 = server
            .command(&["PTTL", &store.key_of(&key)])
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(ttl > 0, "{}: a TTL is set", name(&policy));
        let bound = d[0].reset_after.as_millis() as i64 + 1_001;
        assert!(ttl <= bound, "{}: {ttl} ms > {bound} ms", name(&policy));
        assert!(store.reset(&key).await.unwrap());
    }
    // A denial or a cost-0 check on a new key writes nothing.
    let p = &fifty_per_hour()[0];
    store.check(&[Check::new("never", p, 0)]).await.unwrap();
    store.check(&[Check::new("never", p, 51)]).await.unwrap();
    assert_eq!(
        server
            .command(&["EXISTS", &store.key_of("never")])
            .unwrap()
            .trim(),
        "0"
    );
}

/// A counter whose policy changes algorithm starts afresh, as in the memory store (one whose
/// parameters change keeps its state), and the
/// other shape of state (hash or list) does not get in the way. The store's time starts just
/// after an hour of Redis time, so that no hour aligned to the clock ends between the checks
/// that use a counter and the one that reads it.
#[tokio::test]
async fn a_key_that_changes_algorithm_starts_afresh() {
    let store = store_at_hour_start(shared_server()).await;
    let policies = fifty_per_hour();
    for a in &policies {
        for b in &policies {
            let key = format!("switch:{}:{}", name(a), name(b));
            for _ in 0..3 {
                store.check(&[Check::new(&key, a, 1)]).await.unwrap();
            }
            let d = store.check(&[Check::new(&key, b, 1)]).await.unwrap();
            assert!(d[0].allowed);
            let expected = if a.algorithm() == b.algorithm() {
                46
            } else {
                49
            };
            assert_eq!(d[0].remaining, expected, "{} then {}", name(a), name(b));
        }
    }
}

/// A policy whose numbers Lua's doubles cannot hold is refused up front through the store
/// contract, which is how rules are refused when they load; a check of it is refused with the
/// same reason, never rounded.
#[tokio::test]
async fn policies_beyond_lua_doubles_are_refused_up_front() {
    let server = shared_server();
    let store = RedisStore::connect(&server.url(), test_options())
        .await
        .unwrap();
    let day = Duration::from_secs(86_400);
    let held = Policy::from(SlidingCounter::new(10, 30 * day).unwrap());
    let too_long = Policy::from(SlidingCounter::new(10, 200 * day).unwrap());
    assert_eq!(Store::supports(&store, &held), Ok(()));
    let shared: Arc<dyn sluice_core::DynStore> = Arc::new(store.clone());
    let refused = shared.supports(&too_long).unwrap_err();
    // Without a connection, the same answer.
    assert_eq!(sluice_redis::supports(&held), Ok(()));
    assert_eq!(sluice_redis::supports(&too_long), Err(refused.clone()));
    assert_eq!(refused.store, "redis");
    assert!(refused.reason.contains("window of 200d"), "{refused}");
    let err = store
        .check(&[Check::new("too_long", &too_long, 1)])
        .await
        .unwrap_err();
    assert_eq!(err, StoreError::Rejected(refused.reason));
}

/// `redis+sentinel://` finds the master through a real Sentinel and limits on it.
#[tokio::test]
async fn sentinel_urls_find_the_master() {
    let master = RedisServer::start();
    let sentinel = RedisServer::start_sentinel(&master);
    let url = format!("redis+sentinel://127.0.0.1:{}/mymaster", sentinel.port);
    let store = RedisStore::connect(&url, test_options()).await.unwrap();
    let policy = &fifty_per_hour()[1];
    let mut admitted = 0;
    for _ in 0..60 {
        let d = store
            .check(&[Check::new("via-sentinel", policy, 1)])
            .await
            .unwrap();
        admitted += u32::from(d[0].allowed);
    }
    assert_eq!(admitted, 50);
    let key = store.key_of("via-sentinel");
    assert_eq!(master.command(&["EXISTS", &key]).unwrap().trim(), "1");
}

/// An instance restarted mid-window keeps its limits: the state lives in Redis, so a new store
/// (a new process's) carries on where the old one stopped.
#[tokio::test]
async fn a_restarted_instance_keeps_its_limits() {
    let server = shared_server();
    let options = test_options();
    let offset = offset_to_window_start(server.port, Duration::from_secs(3600));
    for policy in fifty_per_hour() {
        let key = format!("restart:{}", name(&policy));
        {
            let before = RedisStore::connect(&server.url(), options.clone())
                .await
                .unwrap();
            before.set_time_offset(offset);
            for _ in 0..30 {
                before.check(&[Check::new(&key, &policy, 1)]).await.unwrap();
            }
        }
        let after = RedisStore::connect(&server.url(), options.clone())
            .await
            .unwrap();
        after.set_time_offset(offset);
        let d = after.check(&[Check::new(&key, &policy, 1)]).await.unwrap();
        assert_eq!(d[0].remaining, 19, "{}", name(&policy));
    }
}

/// A Sentinel failover moves the store to the new master: the first write to the demoted one
/// fails (`READONLY`, transient), the store asks the Sentinels again, and the counter carries on
/// from its replicated state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_moves_the_store_to_the_new_master() {
    let master = RedisServer::start();
    let replica = RedisServer::start_replica(&master);
    let sentinel = RedisServer::start_sentinel(&master);
    wait_until("the sentinel knows the replica", || {
        sentinel
            .command(&["SENTINEL", "replicas", "mymaster"])
            .is_some_and(|r| r.contains(&replica.port.to_string()))
    });
    let url = format!("redis+sentinel://127.0.0.1:{}/mymaster", sentinel.port);
    let options = test_options().breaker_cool_down(Duration::from_millis(20));
    let store = RedisStore::connect(&url, options).await.unwrap();
    let policy = &fifty_per_hour()[0];
    let check = [Check::new("failover", policy, 10)];
    assert_eq!(store.check(&check).await.unwrap()[0].remaining, 40);
    let key = store.key_of("failover");
    wait_until("the counter is replicated", || {
        replica
            .command(&["EXISTS", &key])
            .is_some_and(|r| r.trim() == "1")
    });

    // The Sentinel refuses until it has heard from the replica itself (NOGOODSLAVE).
    wait_until("the sentinel starts a failover", || {
        sentinel
            .command(&["SENTINEL", "FAILOVER", "mymaster"])
            .is_some_and(|r| r.contains("OK") || r.contains("INPROG"))
    });
    wait_until("the sentinels name the new master", || {
        sentinel
            .command(&["SENTINEL", "get-master-addr-by-name", "mymaster"])
            .is_some_and(|r| r.contains(&replica.port.to_string()))
    });
    // Sentinel demotes the old master when it next polls it (every 10 s).
    wait_until("the old master is demoted", || {
        master
            .command(&["INFO", "replication"])
            .is_some_and(|i| i.contains("role:slave"))
    });
    let one = [Check::new("failover", policy, 1)];
    eventually("the store writes to the new master", || async {
        store.check(&one).await.is_ok()
    })
    .await;
    let d = store.peek("failover", policy).await.unwrap();
    assert_eq!(
        d.remaining, 39,
        "the state moved with the failover, charged once"
    );
}

/// Redis's count of reads from its clients' sockets (`INFO stats`).
fn reads_processed(server: &RedisServer) -> u64 {
    stat(server, "total_reads_processed")
}

/// A counter of `INFO stats`.
fn stat(server: &RedisServer, name: &str) -> u64 {
    let info = server.command(&["INFO", "stats"]).expect("INFO stats");
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in INFO stats"))
}

/// `n` checks of one unit on `key`, each in a task of its own, spawned together on the caller's
/// runtime; how many were admitted. Every call must be answered.
async fn concurrent_checks(
    store: &RedisStore,
    policy: &Arc<Policy>,
    key: &'static str,
    n: usize,
) -> u32 {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                store
                    .check(&[Check::new(key, &policy, 1)])
                    .await
                    .map(|d| d[0].allowed)
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += u32::from(t.await.unwrap().expect("no call fails"));
    }
    admitted
}

/// Checks made by many tasks at once leave as a few pipelines, not one write each, and each
/// still decides on its own: 200 tasks on one worker thread (where tokio runs a woken task right
/// after its waker, which without the batch task sent every call alone) check one key with a
/// limit of 50. Exactly 50 are admitted, and Redis reads them in a few reads. Then the same after
/// `SCRIPT FLUSH`: every call of the pipeline gets `NOSCRIPT` and is sent again, none fails, and
/// the script's body goes with the first of them only, the others behind it as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn concurrent_checks_share_pipelines_and_each_decides_alone() {
    let server = RedisServer::start();
    let offset = offset_to_window_start(server.port, Duration::from_secs(3600));
    let store = RedisStore::connect(&server.url(), test_options())
        .await
        .unwrap();
    store.set_time_offset(offset);
    let policy = Arc::new(fifty_per_hour().remove(0));
    // The tasks are spawned from a task on the worker, so that all of them are queued before
    // any runs, whatever the machine's load.
    let burst = |key: &'static str| {
        let (store, policy) = (store.clone(), policy.clone());
        async move {
            tokio::spawn(async move { concurrent_checks(&store, &policy, key, 200).await })
                .await
                .unwrap()
        }
    };
    // The first call loads the script, so that the burst below finds it.
    store
        .check(&[Check::new("warm", &policy, 1)])
        .await
        .unwrap();
    let before = reads_processed(&server);
    assert_eq!(burst("pipelined").await, 50);
    // The INFO command's own connection is one read.
    let reads = reads_processed(&server) - before - 1;
    assert!(reads <= 20, "200 concurrent checks took {reads} reads");

    // What Redis reads for 200 calls that find the script: about 300 bytes each.
    let before = stat(&server, "total_net_input_bytes");
    assert_eq!(burst("known").await, 50);
    let known = stat(&server, "total_net_input_bytes") - before;

    server.command(&["SCRIPT", "FLUSH"]).expect("SCRIPT FLUSH");
    let before = stat(&server, "total_net_input_bytes");
    assert_eq!(burst("after-flush").await, 50);
    let after_flush = stat(&server, "total_net_input_bytes") - before;
    // Every call twice, the body once (and the INFO commands' few bytes): each call sent
    // again with the whole script was 200 of them.
    let body = sluice_redis::testing::check_script().len() as u64;
    assert!(
        after_flush < 2 * known + 2 * body,
        "{after_flush} bytes after the flush, {known} before, the script {body}"
    );
}

/// The gRPC service calls the store from single-threaded runtimes of its own, one per thread.
/// A store connected on a multi-threaded runtime serves such calls through a batch task started
/// on the caller's runtime, and when that runtime stops and another starts on the same thread,
/// the next call starts a new task there: 30 concurrent checks on the first runtime, 30 more on
/// the second, every call answered, and exactly the limit of 50 admitted.
#[test]
fn calls_from_single_threaded_runtimes_are_batched_where_they_run() {
    let server = RedisServer::start();
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let store = main
        .block_on(RedisStore::connect(&server.url(), test_options()))
        .unwrap();
    store.set_time_offset(offset_to_window_start(
        server.port,
        Duration::from_secs(3600),
    ));
    let policy = Arc::new(fifty_per_hour().remove(0));
    let admitted: Vec<u32> = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                (0..2)
                    .map(|_| {
                        let runtime = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .unwrap();
                        runtime.block_on(concurrent_checks(&store, &policy, "own-runtime", 30))
                    })
                    .collect()
            })
            .join()
            .unwrap()
    });
    assert_eq!(admitted, [30, 20]);
}

/// Script calls go over the store's own connection: it authenticates as the URL's user, works
/// in the URL's database, and dials again after the server closes it, idle or not. A password
/// refused on a new connection fails the calls with the server's reason, and nothing hangs.
#[tokio::test]
async fn script_calls_use_the_urls_user_and_database_and_survive_a_closed_connection() {
    let server = RedisServer::start();
    server
        .command(&[
            "ACL", "SETUSER", "limiter", "on", ">s3cret", "~*", "&*", "+@all",
        ])
        .unwrap();
    let url = format!("redis://limiter:s3cret@127.0.0.1:{}/5", server.port);
    let store = RedisStore::connect(&url, test_options()).await.unwrap();
    let p = fifty_per_hour().remove(0);
    let check = |n: u64| {
        let (store, p) = (store.clone(), p.clone());
        async move { store.check(&[Check::new("authed", &p, n)]).await }
    };
    assert_eq!(check(1).await.unwrap()[0].remaining, 49);
    let key = store.key_of("authed");
    let exists = |db: &str| {
        server
            .command(&["-n", db, "EXISTS", &key])
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!((exists("5"), exists("0")), ("1".to_owned(), "0".to_owned()));

    // Closed while idle: noticed before the next call is written, which goes on a new one.
    server
        .command(&["CLIENT", "KILL", "USER", "limiter"])
        .unwrap();
    assert_eq!(check(1).await.unwrap()[0].remaining, 48);

    // A new password: the next connection's AUTH is refused, and the calls say why.
    server
        .command(&["ACL", "SETUSER", "limiter", "resetpass", ">other"])
        .unwrap();
    server
        .command(&["CLIENT", "KILL", "USER", "limiter"])
        .unwrap();
    let err = check(1).await.unwrap_err();
    assert!(
        err.to_string().contains("WRONGPASS") || err.to_string().contains("invalid"),
        "{err}"
    );
    server
        .command(&["ACL", "SETUSER", "limiter", ">s3cret"])
        .unwrap();
    assert_eq!(check(1).await.unwrap()[0].remaining, 47);
}

/// Replies larger than the connection's read buffer, in pieces and many at once, each reach the
/// call that asked for it, after `SCRIPT FLUSH` too (every call first answered `NOSCRIPT`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_replies_in_pieces_reach_their_calls() {
    static REPEAT: std::sync::LazyLock<sluice_redis::Script> = std::sync::LazyLock::new(|| {
        sluice_redis::Script::assemble("return string.rep(ARGV[1], tonumber(ARGV[2]))")
    });
    let server = RedisServer::start();
    let store = RedisStore::connect(
        &server.url(),
        test_options().timeout(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    for round in 0..2 {
        if round == 1 {
            server.command(&["SCRIPT", "FLUSH"]).unwrap();
        }
        let tasks: Vec<_> = (0..40u32)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    // Every fourth reply is short; the others from 20 KiB to about 800 KiB.
                    let len = if i % 4 == 0 { 3 } else { 20_000 * i as usize };
                    let byte = char::from(b'a' + (i % 26) as u8).to_string();
                    let key = [format!("big{i}")];
                    let args = [byte.clone(), len.to_string()];
                    let calls = [(&key[..], &args[..])];
                    let reply = store.eval_each(&REPEAT, &calls).await.unwrap();
                    (byte, len, reply)
                })
            })
            .collect();
        for task in tasks {
            let (byte, len, mut reply) = task.await.unwrap();
            let sluice_redis::Value::BulkString(bytes) = reply.remove(0) else {
                panic!("not a string");
            };
            assert_eq!(bytes.len(), len);
            assert!(bytes.iter().all(|b| *b == byte.as_bytes()[0]));
        }
    }
}
