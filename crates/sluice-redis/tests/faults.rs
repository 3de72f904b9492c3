//! The Redis store when Redis fails: killed under load, hung, or flushed of its scripts. Each
//! test starts its own `redis-server`, since it breaks it.
//!
//! No assertion is about time: "answers are fast while Redis is down" is shown by what the
//! breaker did (calls refused without touching the network), not by a stopwatch.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::{BreakerState, Check, Policy, Store, StoreError};
use sluice_redis::RedisStore;
use sluice_redis::testing::{
    RedisServer, fifty_per_hour, name, offset_to_window_start, test_options,
};
use sluice_test_support::eventually;

fn breaker_refusal(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(m) if m.contains("circuit breaker is open"))
}

/// Redis is killed while 8 clients hammer it: calls fail, the breaker opens and then refuses
/// calls without touching the network (so they cost microseconds, not a timeout each), and
/// after a restart exact limiting resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_redis_opens_the_breaker_and_limiting_resumes_after_restart() {
    let mut server = RedisServer::start();
    let options = test_options()
        .timeout(Duration::from_millis(500))
        .breaker_cool_down(Duration::from_millis(100));
    let store = RedisStore::connect(&server.url(), options).await.unwrap();
    let policy = Arc::new(fifty_per_hour().remove(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (oks, errors, refused) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let load: Vec<_> = (0..8)
        .map(|i| {
            let (store, policy, stop) = (store.clone(), policy.clone(), stop.clone());
            let (oks, errors, refused) = (oks.clone(), errors.clone(), refused.clone());
            tokio::spawn(async move {
                let key = format!("load:{i}");
                // Bounded, in case the test fails before it stops the load.
                for _ in 0..1_000_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    match store.check(&[Check::new(&key, &policy, 0)]).await {
                        Ok(_) => oks.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            if breaker_refusal(&e) {
                                refused.fetch_add(1, Ordering::Relaxed);
                            }
                            // Pace the loop: a refusal returns at once.
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            errors.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        })
        .collect();
    eventually("the load is running", || async {
        oks.load(Ordering::Relaxed) > 100
    })
    .await;

    server.kill();
    eventually("the breaker opens", || async {
        store.breaker_state() != BreakerState::Closed
    })
    .await;
    let short_before = store.stats().short_circuited;
    eventually("calls are refused by the open breaker", || async {
        refused.load(Ordering::Relaxed) > 200
    })
    .await;
    // Most failures never reached the network: the breaker answered them.
    let stats = store.stats();
    assert!(stats.short_circuited > short_before);
    assert!(stats.short_circuited * 2 > errors.load(Ordering::Relaxed));
    // A call of our own while it is down fails as transient: refused, or the one probe.
    let p = fifty_per_hour().remove(3);
    match store.check(&[Check::new("direct", &p, 1)]).await {
        Err(e) => assert!(e.is_transient(), "{e}"),
        Ok(d) => panic!("redis is dead, yet {d:?}"),
    }

    server.restart();
    eventually("the store answers again", || async {
        store.check(&[Check::new("probe", &p, 0)]).await.is_ok()
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    assert_eq!(store.breaker_state(), BreakerState::Closed);

    // The restarted Redis is empty; limits are exact on it again, for every algorithm. The store's
    // time starts just after an hour of Redis time, so that no hour aligned to the clock ends
    // during a count.
    store.set_time_offset(offset_to_window_start(
        server.port,
        Duration::from_secs(3600),
    ));
    for policy in fifty_per_hour() {
        let key = format!("after:{}", name(&policy));
        let mut admitted = 0;
        for _ in 0..60 {
            let d = store.check(&[Check::new(&key, &policy, 1)]).await.unwrap();
            admitted += u32::from(d[0].allowed);
        }
        assert_eq!(admitted, 50, "{}", name(&policy));
    }
}

/// A Redis that stops answering (`CLIENT PAUSE`) makes calls time out; after the threshold the
/// breaker opens, and from then on calls are refused at once instead of each waiting out its
/// timeout.
#[tokio::test]
async fn hung_redis_times_out_then_the_breaker_refuses_at_once() {
    let server = RedisServer::start();
    let options = test_options()
        .timeout(Duration::from_millis(100))
        .breaker_threshold(3)
        .breaker_cool_down(Duration::from_secs(3600));
    let store = RedisStore::connect(&server.url(), options).await.unwrap();
    let p = fifty_per_hour().remove(1);
    let check = [Check::new("hung", &p, 1)];
    assert!(store.check(&check).await.unwrap()[0].allowed);

    server
        .command(&["CLIENT", "PAUSE", "20000", "ALL"])
        .unwrap();
    for _ in 0..3 {
        match store.check(&check).await {
            Err(StoreError::Timeout(t)) => assert_eq!(t, Duration::from_millis(100)),
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
    assert_eq!(store.breaker_state(), BreakerState::Open);
    for _ in 0..1_000 {
        match store.check(&check).await {
            Err(e) => assert!(breaker_refusal(&e), "{e}"),
            Ok(d) => panic!("redis is paused, yet {d:?}"),
        }
    }
    assert_eq!(store.stats().short_circuited, 1_000);
    // Readiness reports the same.
    assert!(store.ping().await.is_err());
}

/// `SCRIPT FLUSH` (as after a restart or failover) while 16 clients run: every call succeeds,
/// reloading the scripts on `NOSCRIPT`, and the limit stays exact. The store's time starts just
/// after an hour of Redis time, so that no hour aligned to the clock ends during the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_flush_under_load_causes_no_errors() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), test_options())
        .await
        .unwrap();
    store.set_time_offset(offset_to_window_start(
        server.port,
        Duration::from_secs(3600),
    ));
    let policies: Vec<Arc<Policy>> = fifty_per_hour().into_iter().map(Arc::new).collect();
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let flusher = {
        let (stop, port) = (stop.clone(), server.port);
        tokio::task::spawn_blocking(move || {
            let mut flushes = 0;
            while !stop.load(Ordering::Relaxed) && flushes < 500 {
                let _ = std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "SCRIPT", "FLUSH"])
                    .output();
                flushes += 1;
            }
            flushes
        })
    };
    let clients: Vec<_> = (0..16)
        .map(|i| {
            let (store, policies, errors) = (store.clone(), policies.clone(), errors.clone());
            tokio::spawn(async move {
                let mut admitted = vec![0u32; policies.len()];
                for n in 0..70 {
                    let which = (i + n) % policies.len();
                    let key = format!("flush:{which}");
                    match store.check(&[Check::new(&key, &policies[which], 1)]).await {
                        Ok(d) => admitted[which] += u32::from(d[0].allowed),
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
    let mut admitted = vec![0u32; policies.len()];
    for c in clients {
        for (total, n) in admitted.iter_mut().zip(c.await.unwrap()) {
            *total += n;
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert!(flusher.await.unwrap() > 0);
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    for (p, n) in policies.iter().zip(admitted) {
        assert_eq!(n, 50, "{}", name(p));
    }
}

/// Connecting to nothing fails with a message that names the target, promptly.
#[tokio::test]
async fn connecting_to_nothing_fails_with_the_target_named() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("redis://:secret@127.0.0.1:{port}");
    let err = RedisStore::connect(&url, test_options()).await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
    assert!(!msg.contains("secret"), "{msg}");
}

/// `rediss://` connects over TLS, verifying the server against a private CA given in the
/// options, and refuses a server it cannot verify.
#[tokio::test]
async fn tls_urls_connect_to_a_verified_server() {
    let server = RedisServer::start_tls();
    let tls_port = server.tls_port.unwrap();
    let ca = std::fs::read(server.dir().join("ca.crt")).unwrap();
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let store = RedisStore::connect(&url, test_options().tls_root_cert(ca))
        .await
        .unwrap();
    let p = fifty_per_hour().remove(0);
    let d = store.check(&[Check::new("tls", &p, 1)]).await.unwrap();
    assert_eq!(d[0].remaining, 49);
    assert_eq!(
        server
            .command(&["EXISTS", &store.key_of("tls")])
            .unwrap()
            .trim(),
        "1"
    );
    // Without the CA, the certificate does not verify, and nothing is sent in clear.
    let err = RedisStore::connect(&url, test_options().connect_timeout(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&tls_port.to_string()), "{err}");
}
