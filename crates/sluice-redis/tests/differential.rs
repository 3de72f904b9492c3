//! The Redis store against the memory store: random sequences of checks, reservations, settles
//! below, at and above what was reserved, refunds and time passing, run on both at the same
//! instants, must get the same answer from each, call by call: every `Decision` and every
//! `Settlement`, to the nanosecond, and after every step the same counters (a peek of each).
//!
//! The two stores implement each algorithm twice, in Rust and in Lua, and this pins them
//! together. The memory store runs on a `FakeClock`; the Redis store on a frozen Redis clock
//! (`RedisStore::freeze_time`) moved by its time offset, so both stand at the same nanosecond.
//! Redis still expires keys on its own clock, so the counters are persisted after each step:
//! a slow machine must not drop a counter whose window, on the test's clock, has not ended.

use std::cell::RefCell;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sluice_core::{
    Alignment, BucketedWindow, Check, Clock, ConcurrencyLimit, FakeClock, FixedWindow, Gcra,
    LeakyQueue, Lease, MemoryStore, Policy, Rate, Refund, ReservationId, Settlement,
    SlidingCounter, SlidingLog, Store, Timestamp, TokenBucket,
};
use sluice_redis::RedisStore;
use sluice_redis::testing::{name, shared_server, test_options};

/// Where every sequence starts: about 2027, on a whole second plus a few microseconds, so that
/// clock-aligned windows start at varied phases as the sequence moves on.
const START: u64 = 1_800_000_000_000_123_000;

/// Random sequences per policy: enough to meet every branch of a refund and a charge, few
/// enough that all policies run in seconds against one redis-server.
const CASES: u32 = 40;

/// The two counters a sequence uses.
const KEYS: [&str; 2] = ["a", "b"];

/// One step of a sequence. Numbers are drawn wide and scaled to the policy when run.
#[derive(Debug, Clone)]
enum Step {
    /// Time moves on: `kind` picks none, a nanosecond, up to a millisecond, up to a third of
    /// the policy's time scale or up to three of it; `amount` how far within that.
    Advance { kind: u8, amount: u64 },
    /// A check of each `(key, cost)`, all or none, as a request with several limits makes.
    Check(Vec<(usize, u64)>),
    /// A reservation of each `(key, cost)`, with a ttl of `ttl` in quarters of the time scale.
    Reserve(Vec<(usize, u64)>, u8),
    /// Settles a reservation made before (the `pick`-th of those still remembered; an unknown
    /// id when there is none, or when `pick` ends in 0) at `used` (see [`used`]).
    Settle { pick: usize, used: u8, extra: u64 },
    /// Gives units back to a counter outside a reservation.
    Refund(usize, u64),
}

/// A cost: mostly small, sometimes 0, sometimes past any of the test's limits.
fn cost() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(0u64),
        4 => Just(1u64),
        4 => 2u64..=4,
        1 => 5u64..=8,
    ]
}

fn checks() -> impl Strategy<Value = Vec<(usize, u64)>> {
    prop::collection::vec((0..KEYS.len(), cost()), 1..=2)
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..10, any::<u64>()).prop_map(|(kind, amount)| Step::Advance { kind, amount }),
        3 => checks().prop_map(Step::Check),
        4 => (checks(), 1u8..=12).prop_map(|(c, ttl)| Step::Reserve(c, ttl)),
        4 => (any::<usize>(), 0u8..6, 1u64..=6)
            .prop_map(|(pick, used, extra)| Step::Settle { pick, used, extra }),
        1 => (0..KEYS.len(), cost()).prop_map(|(k, u)| Step::Refund(k, u)),
    ]
}

/// The units a settle reports as used, for a reservation whose largest check cost `cost`:
/// none, one less, all, one more, `extra` more, or `extra` alone.
fn used(kind: u8, cost: u64, extra: u64) -> u64 {
    match kind {
        0 => 0,
        1 => cost.saturating_sub(1),
        2 => cost,
        3 => cost + 1,
        4 => cost + extra,
        _ => extra,
    }
}

/// Policies of every algorithm (fixed windows of each alignment) with small limits that refuse
/// often, each beside the time scale it acts on and the unit its costs are counted in: 1, or
/// for the large policies so many that the scripts' products and counts pass 2³² and 2⁵³ (a
/// refill at a billion a second, buckets and counters near `u32::MAX`).
fn policies() -> Vec<(Policy, Duration, u64)> {
    let sec = Duration::from_secs(1);
    let ten = Duration::from_secs(10);
    vec![
        (
            TokenBucket::new(4, Rate::per_second(2)).map(Policy::from),
            sec,
            1,
        ),
        (
            TokenBucket::new(5, Rate::new(3, Duration::from_millis(700)).unwrap())
                .map(Policy::from),
            sec,
            1,
        ),
        (Gcra::new(Rate::per_second(2), 3).map(Policy::from), sec, 1),
        (
            Gcra::new(Rate::new(3, Duration::from_millis(700)).unwrap(), 4).map(Policy::from),
            sec,
            1,
        ),
        (
            LeakyQueue::new(Rate::per_second(4), 3, sec).map(Policy::from),
            sec,
            1,
        ),
        // A maximum wait shorter than the queue: the wait bounds it, not the queue's size.
        (
            LeakyQueue::new(Rate::per_second(4), 5, Duration::from_millis(600)).map(Policy::from),
            sec,
            1,
        ),
        (
            FixedWindow::new(4, ten, Alignment::FirstRequest).map(Policy::from),
            ten,
            1,
        ),
        (
            FixedWindow::new(4, ten, Alignment::Clock { utc_offset_secs: 0 }).map(Policy::from),
            ten,
            1,
        ),
        // Windows of 7 s on a grid shifted by a zone 5 h 30 min east of UTC.
        (
            FixedWindow::new(
                4,
                Duration::from_secs(7),
                Alignment::Clock {
                    utc_offset_secs: 19_800,
                },
            )
            .map(Policy::from),
            ten,
            1,
        ),
        (SlidingLog::new(3, ten).map(Policy::from), ten, 1),
        (SlidingCounter::new(5, ten).map(Policy::from), ten, 1),
        (BucketedWindow::new(4, ten, 5).map(Policy::from), ten, 1),
        (ConcurrencyLimit::new(3, ten).map(Policy::from), ten, 1),
        (
            TokenBucket::new(4_000_000_000, Rate::per_second(1_000_000_000)).map(Policy::from),
            sec,
            1_000_000_000,
        ),
        (
            Gcra::new(Rate::per_second(1_000_000_000), 4_000_000_000).map(Policy::from),
            sec,
            1_000_000_000,
        ),
        (
            LeakyQueue::new(Rate::per_second(1_000_000_000), 3_999_999_999, sec).map(Policy::from),
            sec,
            1_000_000_000,
        ),
        (
            FixedWindow::new(40_000_000_000_000, ten, Alignment::FirstRequest).map(Policy::from),
            ten,
            10_000_000_000_000,
        ),
        (
            SlidingLog::new(1_000_000, ten).map(Policy::from),
            ten,
            250_000,
        ),
        (
            SlidingCounter::new(4_000_000_000, ten).map(Policy::from),
            ten,
            1_000_000_000,
        ),
        (
            BucketedWindow::new(4_000_000_000, ten, 5).map(Policy::from),
            ten,
            1_000_000_000,
        ),
        (
            ConcurrencyLimit::new(1_000_000, ten).map(Policy::from),
            ten,
            250_000,
        ),
    ]
    .into_iter()
    .map(|(p, scale, unit)| (p.expect("a valid policy"), scale, unit))
    .collect()
}

/// A reservation made in a sequence, on both stores under the same id.
struct Made {
    id: ReservationId,
    /// The largest cost of its checks: what a settle reports as reserved.
    cost: u64,
    /// Until when a settle must find it (expired or settled), rather than unknown: the memory
    /// store forgets it then, while Redis forgets it on its own clock, which does not move here.
    remembered_until: Timestamp,
}

/// The kinds of settlement the sequences of one algorithm's policies have met: so that a generator that
/// stopped reaching one (a refund, a charge, a late or second settle) fails the test rather
/// than leave that path unchecked.
#[derive(Debug, Default)]
struct Met {
    refunded: bool,
    charged: bool,
    already_settled: bool,
    expired: bool,
    unknown: bool,
}

impl Met {
    fn saw(&mut self, s: Settlement) {
        match s {
            Settlement::Settled {
                refunded, charged, ..
            } => {
                self.refunded |= refunded > 0;
                self.charged |= charged > 0;
            }
            Settlement::AlreadySettled => self.already_settled = true,
            Settlement::Expired => self.expired = true,
            Settlement::Unknown => self.unknown = true,
        }
    }

    fn all(&self) -> bool {
        self.refunded && self.charged && self.already_settled && self.expired && self.unknown
    }
}

/// Both stores at one instant.
struct Pair {
    memory: MemoryStore<FakeClock>,
    redis: RedisStore,
    /// A plain connection, to persist the counters.
    conn: redis::aio::MultiplexedConnection,
    policy: Policy,
    scale: Duration,
    /// What one unit of a step's cost is under this policy.
    unit: u64,
}

impl Pair {
    fn now(&self) -> Timestamp {
        self.memory.clock().now()
    }

    /// Moves both clocks by `d`.
    fn advance(&self, d: Duration) {
        self.memory.clock().advance(d);
        let offset = self.now().as_nanos() - START;
        self.redis
            .set_time_offset(i64::try_from(offset).expect("a test shorter than 292 years"));
    }

    /// Takes the counters' TTLs away, so that Redis keeps them however slowly the test runs;
    /// the algorithms themselves treat a counter that has run out as fresh.
    async fn persist(&mut self) {
        for key in KEYS {
            let _: i64 = redis::cmd("PERSIST")
                .arg(self.redis.key_of(key))
                .query_async(&mut self.conn)
                .await
                .expect("PERSIST");
        }
    }

    fn checks(&self, c: &[(usize, u64)]) -> Vec<Check<'_>> {
        c.iter()
            .map(|&(k, cost)| Check::new(KEYS[k], &self.policy, cost * self.unit))
            .collect()
    }
}

/// A memory store and a Redis store (on the shared test server, under a prefix of its own), both
/// standing at [`START`].
async fn stores() -> (MemoryStore<FakeClock>, RedisStore) {
    let memory = MemoryStore::builder()
        .clock(FakeClock::at(Timestamp::from_nanos(START)))
        .build();
    let redis = RedisStore::connect(&shared_server().url(), test_options())
        .await
        .expect("a store on the test server");
    redis.freeze_time(Timestamp::from_nanos(START));
    (memory, redis)
}

/// Runs `steps` on both stores under `policy`, comparing every answer and, after each step,
/// both counters.
async fn run(
    policy: &Policy,
    scale: Duration,
    unit: u64,
    steps: &[Step],
    met: &RefCell<Met>,
) -> Result<(), TestCaseError> {
    let (memory, redis) = stores().await;
    let conn = redis::Client::open(shared_server().url())
        .expect("the server's URL")
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    let mut pair = Pair {
        memory,
        redis,
        conn,
        policy: policy.clone(),
        scale,
        unit,
    };
    let mut made: Vec<Made> = Vec::new();
    let scale_ns = u64::try_from(pair.scale.as_nanos()).expect("a short scale");
    for (i, step) in steps.iter().enumerate() {
        let at = format!(
            "step {i} ({step:?}) at {} ns into the sequence",
            pair.now().as_nanos() - START
        );
        match step {
            Step::Advance { kind, amount } => {
                let ns = match kind {
                    0 | 1 => 0,
                    2 => 1,
                    3 => amount % 1_000_000,
                    4..=7 => amount % (scale_ns / 3 + 1),
                    _ => amount % (3 * scale_ns + 1),
                };
                pair.advance(Duration::from_nanos(ns));
            }
            Step::Check(c) => {
                let checks = pair.checks(c);
                let m = pair.memory.check(&checks).await.expect("memory check");
                let r = pair.redis.check(&checks).await.expect("redis check");
                prop_assert_eq!(m, r, "the decisions of {}", at);
            }
            Step::Reserve(c, ttl) => {
                let checks = pair.checks(c);
                let id = ReservationId::random();
                let ttl = pair.scale / 4 * u32::from(*ttl);
                let lease = Lease { id: &id, ttl };
                let m = pair
                    .memory
                    .reserve(&checks, lease)
                    .await
                    .expect("memory reserve");
                let r = pair
                    .redis
                    .reserve(&checks, lease)
                    .await
                    .expect("redis reserve");
                prop_assert_eq!(&m, &r, "the decisions of {}", at);
                if m.iter().all(|d| d.allowed) {
                    made.push(Made {
                        id,
                        cost: c.iter().map(|&(_, cost)| cost * unit).max().unwrap_or(0),
                        remembered_until: pair.now().saturating_add(2 * ttl),
                    });
                }
            }
            Step::Settle {
                pick,
                used: kind,
                extra,
            } => {
                let now = pair.now();
                let live: Vec<&Made> = made.iter().filter(|r| now < r.remembered_until).collect();
                // One settle in ten names an id neither store has seen.
                let known = live
                    .get(pick % live.len().max(1))
                    .filter(|_| pick % 10 != 0);
                let (id, cost) = match known {
                    Some(r) => (r.id, r.cost),
                    None => (ReservationId::random(), 0),
                };
                let used = used(*kind, cost, *extra * unit);
                let m = pair.memory.settle(&id, used).await.expect("memory settle");
                let r = pair.redis.settle(&id, used).await.expect("redis settle");
                prop_assert_eq!(m, r, "the settlement of {} at {} used", at, used);
                met.borrow_mut().saw(m);
            }
            Step::Refund(k, units) => {
                let refund = [Refund {
                    key: KEYS[*k],
                    policy: &pair.policy,
                    units: *units * unit,
                }];
                let m = pair.memory.refund(&refund).await.expect("memory refund");
                let r = pair.redis.refund(&refund).await.expect("redis refund");
                prop_assert_eq!(m, r, "the decisions after {}", at);
            }
        }
        pair.persist().await;
        for key in KEYS {
            let m = pair
                .memory
                .peek(key, &pair.policy)
                .await
                .expect("memory peek");
            let r = pair
                .redis
                .peek(key, &pair.policy)
                .await
                .expect("redis peek");
            prop_assert_eq!(m, r, "counter {} after {}", key, at);
        }
    }
    Ok(())
}

/// Runs [`CASES`] random sequences of each policy of `algorithm` on both stores.
fn differential(algorithm: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let met = RefCell::new(Met::default());
    for (policy, scale, unit) in policies()
        .into_iter()
        .filter(|(p, _, _)| p.algorithm().to_string() == algorithm)
    {
        let mut runner = TestRunner::new(Config {
            cases: CASES,
            failure_persistence: None,
            ..Config::default()
        });
        let steps = prop::collection::vec(step(), 1..40);
        let result = runner.run(&steps, |steps| {
            runtime.block_on(run(&policy, scale, unit, &steps, &met))
        });
        if let Err(e) = result {
            panic!("{}: the stores disagree: {e}", name(&policy));
        }
    }
    let met = met.into_inner();
    assert!(met.all(), "{algorithm}: the sequences never met {met:?}");
}

#[test]
fn token_bucket_answers_alike_on_both_stores() {
    differential("token_bucket");
}

#[test]
fn gcra_answers_alike_on_both_stores() {
    differential("gcra");
}

#[test]
fn leaky_queue_answers_alike_on_both_stores() {
    differential("leaky_queue");
}

#[test]
fn fixed_window_answers_alike_on_both_stores() {
    differential("fixed_window");
}

#[test]
fn sliding_log_answers_alike_on_both_stores() {
    differential("sliding_log");
}

#[test]
fn sliding_counter_answers_alike_on_both_stores() {
    differential("sliding_counter");
}

#[test]
fn bucketed_window_answers_alike_on_both_stores() {
    differential("bucketed_window");
}

#[test]
fn concurrency_limit_answers_alike_on_both_stores() {
    differential("concurrency_limit");
}

/// What a cost-0 check of `key` under `policy` gets from each store.
async fn peeks(
    memory: &MemoryStore<FakeClock>,
    redis: &RedisStore,
    key: &str,
    policy: &Policy,
) -> (sluice_core::Decision, sluice_core::Decision) {
    let m = memory.peek(key, policy).await.expect("memory peek");
    let r = redis.peek(key, policy).await.expect("redis peek");
    (m, r)
}

/// A sliding log and a concurrency limit on one key (a caller of the store that changed a key's
/// policy): Redis keeps both as lists, told apart by their header, and must leave the other's
/// list as the memory store leaves the other's state. The log's refund gives nothing back from
/// the holds, and its charge starts a log afresh rather than count the holds as its entries.
#[test]
fn a_log_and_holds_on_one_key_answer_alike() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let ten = Duration::from_secs(10);
        let log: Policy = SlidingLog::new(3, ten).unwrap().into();
        let holds: Policy = ConcurrencyLimit::new(3, ten).unwrap().into();
        let (memory, redis) = stores().await;

        // A hold, then the log's refund on its key: the hold stays.
        let hold = [Check::new("refunded", &holds, 1)];
        assert!(memory.check(&hold).await.unwrap()[0].allowed);
        assert!(redis.check(&hold).await.unwrap()[0].allowed);
        let refund = [Refund {
            key: "refunded",
            policy: &log,
            units: 1,
        }];
        let m = memory.refund(&refund).await.expect("memory refund");
        let r = redis.refund(&refund).await.expect("redis refund");
        assert_eq!(m, r, "the decisions after the log's refund");
        let (m, r) = peeks(&memory, &redis, "refunded", &holds).await;
        assert_eq!(m.remaining, 2, "the memory store keeps the hold");
        assert_eq!(m, r, "the holds after the log's refund");

        // A reservation on the log, a hold in its place, then a settle beyond the reservation:
        // the log's charge starts afresh, and once it has left the window the log is full again.
        let id = ReservationId::random();
        let lease = Lease { id: &id, ttl: ten };
        let taken = [Check::new("charged", &log, 1)];
        assert!(memory.reserve(&taken, lease).await.unwrap()[0].allowed);
        assert!(redis.reserve(&taken, lease).await.unwrap()[0].allowed);
        let hold = [Check::new("charged", &holds, 1)];
        assert!(memory.check(&hold).await.unwrap()[0].allowed);
        assert!(redis.check(&hold).await.unwrap()[0].allowed);
        let m = memory.settle(&id, 3).await.expect("memory settle");
        let r = redis.settle(&id, 3).await.expect("redis settle");
        assert_eq!(m, r, "the settlement beyond the reservation");
        let (m, r) = peeks(&memory, &redis, "charged", &log).await;
        assert_eq!(m, r, "the log after its charge");
        let later = Duration::from_secs(11);
        memory.clock().advance(later);
        redis.set_time_offset(i64::try_from(later.as_nanos()).unwrap());
        let (m, r) = peeks(&memory, &redis, "charged", &log).await;
        assert_eq!(m.remaining, 3, "the memory store's log is full again");
        assert_eq!(m, r, "the log once its charge has left the window");
    });
}
