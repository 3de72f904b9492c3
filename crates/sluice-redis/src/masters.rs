//! [`Masters`]: the masters of a Cluster as the store routes to them. Which master serves each
//! slot (from `CLUSTER SLOTS`), and for each master a connection of its own, a circuit breaker
//! and a count of round trips.
//!
//! The store groups a request's script calls by master with this map, and sends each master's
//! calls as one pipeline on that master's connection, the masters in parallel
//! (`store/master_calls.rs`). Over plain TCP the script calls go through a batch task per
//! master with a connection of its own, as on a standalone server: the pipelines of concurrent
//! requests to one master leave in one write, and the master wakes once for all of them. The
//! `redis` crate's Cluster connection cannot do this: it refuses a pipeline whose commands fall
//! in different slots, and it sends a whole pipeline again when one of its commands is
//! redirected, which would run the others twice.
//!
//! Each master has its own breaker, so that while one master is down only the calls on its slots
//! fail at once; the keys of the others stay exact. A breaker belongs to the master's address:
//! when a failover promotes a replica, the map names the new master, whose breaker starts closed,
//! and the old master's breaker goes with it out of the map.
//!
//! The map is read again whenever it may be stale: after a call is redirected (`MOVED`, `ASK`,
//! `READONLY`), after a transient failure, and while a breaker refuses, at most once per
//! [`REFRESH_EVERY`], in a task of its own, so that no request waits for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisResult, Value};
use sluice_core::BreakerState;

use crate::RedisOptions;
use crate::breaker::Breaker;
use crate::connection::{Batches, Home, Sink, open_manager, timed_out};
use crate::pipe::Dial;
use crate::url::RedisUrl;

/// How many slots a Cluster has.
const SLOTS: usize = 16_384;

/// The owner of a slot no master is known to serve.
const NO_MASTER: u16 = u16::MAX;

/// The least time between two reads of the slot map.
const REFRESH_EVERY: Duration = Duration::from_millis(100);

/// The masters of one Cluster, and which serves each slot. Shared by a store's clones.
pub(crate) struct Masters {
    current: RwLock<Arc<SlotMap>>,
    /// The `redis` crate's Cluster connection, which `CLUSTER SLOTS` goes through.
    cluster: ClusterConnection,
    url: RedisUrl,
    options: RedisOptions,
    /// The runtime that connected, where each master's shared batch task runs.
    home: Home,
    /// Whether a read of the map is under way.
    refreshing: AtomicBool,
    /// When the last read of the map started, in nanoseconds after `origin`.
    refreshed_at: AtomicU64,
    origin: Instant,
}

/// Which master serves each slot, as `CLUSTER SLOTS` said.
pub(crate) struct SlotMap {
    masters: Vec<Arc<Master>>,
    /// For each slot, the index of its master in `masters`, or [`NO_MASTER`].
    owner: Vec<u16>,
}

/// One master: its address, its connection, its breaker.
pub(crate) struct Master {
    /// `host:port`, as the Cluster names it: the label of its metrics.
    pub(crate) address: String,
    host: (String, u16),
    pub(crate) breaker: Breaker,
    /// Opened on the first call; a `ConnectionManager` reconnects by itself after a failure.
    conn: tokio::sync::OnceCell<ConnectionManager>,
    /// Over plain TCP, the batch tasks that carry script calls on a connection of their own,
    /// started by the first call (see [`Masters::batches`]).
    batches: OnceLock<Arc<Batches>>,
    /// Requests written to this master: one per request's pipeline, however many calls it
    /// carries (a batch task may write the pipelines of concurrent requests together).
    round_trips: AtomicU64,
}

impl Master {
    /// Counts a request's pipeline sent to this master.
    pub(crate) fn count_round_trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }
}

/// One master's health, for metrics and tests: see [`crate::RedisStore::masters`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterHealth {
    /// The master's address, `host:port`, as the Cluster names it.
    pub address: String,
    /// Its circuit breaker's state.
    pub breaker: BreakerState,
    /// Calls failed at once because its breaker was open.
    pub short_circuited: u64,
    /// Requests written to it by the store's script calls: one per pipeline, however many
    /// calls (and slots) the pipeline carries.
    pub round_trips: u64,
}

impl Masters {
    /// The masters of the Cluster behind `cluster`, as it answers `CLUSTER SLOTS` now. If it does
    /// not answer, the map starts empty, calls go through `cluster` one by one, and the map is
    /// read again on the first call.
    pub(crate) async fn load(
        cluster: ClusterConnection,
        url: RedisUrl,
        options: RedisOptions,
        home: Home,
    ) -> Arc<Self> {
        let masters = Arc::new(Masters {
            current: RwLock::new(Arc::new(SlotMap {
                masters: Vec::new(),
                owner: vec![NO_MASTER; SLOTS],
            })),
            cluster,
            url,
            options,
            home,
            refreshing: AtomicBool::new(false),
            refreshed_at: AtomicU64::new(0),
            origin: Instant::now(),
        });
        let _ = masters.refresh().await;
        masters
    }

    /// The map as it stands.
    pub(crate) fn map(&self) -> Arc<SlotMap> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Asks for the map to be read again, in the background, unless a read is under way or one
    /// started less than [`REFRESH_EVERY`] ago.
    pub(crate) fn refresh_soon(self: &Arc<Self>) {
        let now = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let every = u64::try_from(REFRESH_EVERY.as_nanos()).unwrap_or(u64::MAX);
        if now.saturating_sub(self.refreshed_at.load(Ordering::Acquire)) < every
            || self.refreshing.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.refreshing.store(false, Ordering::Release);
            return;
        };
        let masters = self.clone();
        runtime.spawn(async move {
            let _ = masters.refresh().await;
        });
    }

    /// Reads the map with `CLUSTER SLOTS`, keeping the master, connection and breaker of every
    /// address that is still a master.
    async fn refresh(&self) -> RedisResult<()> {
        let now = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.refreshed_at.store(now, Ordering::Release);
        let answer = self.read_slots().await;
        let result = answer.map(|value| {
            let old = self.map();
            let map = SlotMap::parse(value, &old, &self.options);
            *self
                .current
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(map);
        });
        self.refreshing.store(false, Ordering::Release);
        result
    }

    /// `CLUSTER SLOTS`, asked first of the masters in the map whose breaker is closed, in turn,
    /// then of any node the `redis` crate picks. After a failover the healthy masters know the
    /// promoted replica at once (they voted for it), where a node picked at random may be the dead
    /// master itself, whose call waits for the connect timeout, or a replica not told yet; either
    /// left the keys of the promoted replica failing until a later read.
    async fn read_slots(&self) -> RedisResult<Value> {
        let map = self.map();
        let deadline = tokio::time::Instant::now() + self.options.connect_timeout;
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        for master in &map.masters {
            if master.breaker.state() != BreakerState::Closed {
                continue;
            }
            let asked = async {
                let mut conn = self.connection(master).await?;
                cmd.query_async::<Value>(&mut conn).await
            };
            if let Ok(Ok(value)) = tokio::time::timeout_at(deadline, asked).await {
                return Ok(value);
            }
        }
        tokio::time::timeout_at(
            deadline,
            self.cluster
                .clone()
                .route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random)),
        )
        .await
        .unwrap_or_else(|_| Err(timed_out()))
    }

    /// The batch tasks of `master`'s script calls, started by the first call (the shared one on
    /// the runtime that connected, whichever runtime makes that call): each call joins
    /// the next pipeline its runtime's task writes to the master, with the calls of concurrent
    /// requests, as the batch task of a standalone server does (`connection.rs`). `None` over
    /// TLS, where calls keep the `redis` crate's connection ([`Masters::send`]).
    pub(crate) fn batches<'a>(&self, master: &'a Master) -> Option<&'a Arc<Batches>> {
        if self.url.tls {
            return None;
        }
        Some(master.batches.get_or_init(|| {
            let dial = Dial::new(&self.url, &master.host, self.options.connect_timeout);
            Batches::start(Sink::Own(Arc::new(dial)), &self.home)
        }))
    }

    /// Opens the connection of `master`, or returns it if it is open.
    async fn connection(&self, master: &Master) -> RedisResult<ConnectionManager> {
        master
            .conn
            .get_or_try_init(|| open_manager(&self.url, &master.host, &self.options))
            .await
            .cloned()
    }

    /// Sends `cmds` to `master` as one pipeline (or one command, for one), and returns each
    /// command's result, or a timeout for each if `deadline` passes first.
    pub(crate) async fn send(
        &self,
        master: &Master,
        cmds: &[Cmd],
        deadline: tokio::time::Instant,
    ) -> Vec<RedisResult<Value>> {
        let sent = async {
            let mut conn = self.connection(master).await?;
            master.count_round_trip();
            if let [cmd] = cmds {
                return Ok(vec![cmd.query_async::<Value>(&mut conn).await]);
            }
            let mut pipe = Pipeline::with_capacity(cmds.len());
            pipe.ignore_errors();
            for cmd in cmds {
                pipe.add_command(cmd.clone());
            }
            let results: Vec<RedisResult<Value>> = pipe.query_async(&mut conn).await?;
            if results.len() == cmds.len() {
                Ok(results)
            } else {
                Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "a pipeline of script calls",
                    format!("{} replies to {} calls", results.len(), cmds.len()),
                )))
            }
        };
        match tokio::time::timeout_at(deadline, sent).await {
            Ok(Ok(results)) => results,
            Ok(Err(e)) => vec![Err(e); cmds.len()],
            Err(_) => vec![Err(timed_out()); cmds.len()],
        }
    }

    /// Each master's health, in the map's order.
    pub(crate) fn health(&self) -> Vec<MasterHealth> {
        self.map()
            .masters
            .iter()
            .map(|m| MasterHealth {
                address: m.address.clone(),
                breaker: m.breaker.state(),
                short_circuited: m.breaker.short_circuited(),
                round_trips: m.round_trips.load(Ordering::Relaxed),
            })
            .collect()
    }
}

impl SlotMap {
    /// The master of `slot`, if one is known.
    pub(crate) fn master_of(&self, slot: u16) -> Option<&Arc<Master>> {
        let i = *self.owner.get(usize::from(slot))?;
        self.masters.get(usize::from(i))
    }

    /// The map `CLUSTER SLOTS` answered, keeping the [`Master`]s of `old` whose address is
    /// still a master's. Ranges without a usable address (an unknown endpoint, `?`) stay without
    /// a master: their calls go through the `redis` crate's connection.
    fn parse(value: Value, old: &SlotMap, options: &RedisOptions) -> SlotMap {
        let mut masters: Vec<Arc<Master>> = Vec::new();
        let mut owner = vec![NO_MASTER; SLOTS];
        let Value::Array(ranges) = value else {
            return SlotMap { masters, owner };
        };
        for range in ranges {
            let Value::Array(range) = range else { continue };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(node))) =
                (range.first(), range.get(1), range.get(2))
            else {
                continue;
            };
            let host = match node.first() {
                Some(Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
                Some(Value::SimpleString(h)) => h.clone(),
                _ => continue,
            };
            let Some(Value::Int(port)) = node.get(1) else {
                continue;
            };
            let Ok(port) = u16::try_from(*port) else {
                continue;
            };
            if host.is_empty() || host == "?" {
                continue;
            }
            let address = format!("{host}:{port}");
            let index = match masters.iter().position(|m| m.address == address) {
                Some(i) => i,
                None => {
                    let kept = old.masters.iter().find(|m| m.address == address).cloned();
                    masters.push(kept.unwrap_or_else(|| {
                        Arc::new(Master {
                            address,
                            host: (host, port),
                            breaker: Breaker::new(
                                options.breaker_threshold,
                                options.breaker_cool_down,
                            ),
                            conn: tokio::sync::OnceCell::new(),
                            batches: OnceLock::new(),
                            round_trips: AtomicU64::new(0),
                        })
                    }));
                    masters.len() - 1
                }
            };
            let Ok(index) = u16::try_from(index) else {
                continue;
            };
            let (Ok(start), Ok(end)) = (usize::try_from(*start), usize::try_from(*end)) else {
                continue;
            };
            for slot in owner.iter_mut().take(end.saturating_add(1)).skip(start) {
                *slot = index;
            }
        }
        SlotMap { masters, owner }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
        ])
    }

    #[test]
    fn a_master_keeps_its_breaker_while_it_serves_slots() {
        let options = RedisOptions::default().breaker_threshold(1);
        let empty = SlotMap {
            masters: Vec::new(),
            owner: vec![NO_MASTER; SLOTS],
        };
        let first = SlotMap::parse(
            Value::Array(vec![
                range(0, 5460, "10.0.0.1", 7000),
                range(5461, 10922, "10.0.0.2", 7000),
                range(10923, 16383, "?", 7000),
                range(16000, 16010, "10.0.0.1", 7000),
            ]),
            &empty,
            &options,
        );
        assert_eq!(first.masters.len(), 2);
        assert_eq!(first.master_of(0).unwrap().address, "10.0.0.1:7000");
        assert_eq!(first.master_of(5461).unwrap().address, "10.0.0.2:7000");
        assert!(first.master_of(10923).is_none(), "an unknown endpoint");
        assert_eq!(first.master_of(16005).unwrap().address, "10.0.0.1:7000");
        let down = first.master_of(5461).unwrap();
        down.breaker.failure(down.breaker.admit().unwrap());
        // 10.0.0.2 stays a master, 10.0.0.3 replaces 10.0.0.1 (a failover).
        let second = SlotMap::parse(
            Value::Array(vec![
                range(5461, 10922, "10.0.0.2", 7000),
                range(0, 5460, "10.0.0.3", 7000),
            ]),
            &first,
            &options,
        );
        assert_eq!(
            second.master_of(5461).unwrap().breaker.state(),
            BreakerState::Open
        );
        assert_eq!(second.master_of(0).unwrap().address, "10.0.0.3:7000");
        assert_eq!(second.masters.len(), 2, "the old master left the map");
        assert!(second.master_of(16005).is_none());
    }
}
