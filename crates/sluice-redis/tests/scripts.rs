//! The check script against the core's pure functions, call by call, on a frozen Redis clock.
//!
//! The script reads the time from Redis `TIME`, which never stands still. Here that one call is
//! replaced by a read of two keys that the test sets before each call, and `ARGV[1]` (the time
//! offset) adds the nanoseconds below a microsecond, so the script's `now` is set to the
//! nanosecond, and every decision can be compared with what `sluice_core` decides at the same
//! instant: allowed, remaining, reset, retry and delay, the refund token, the stored value
//! byte for byte, and the TTL. Random sequences run each algorithm through single checks (the
//! script's fast path) and through calls of two checks (its general path), including parameters
//! whose products pass 2⁵³.
//!
//! The script, its arguments and the decoding of its reply are the store's own, through
//! `sluice_redis::testing`, so the arguments are exactly those the store sends.

use std::collections::HashMap;
use std::time::Duration;

use sluice_core::algorithm::TokenBucketState;
use sluice_core::algorithm::{
    ConcurrencyLimitState, FixedWindowState, SlidingCounterState, SlidingLogState,
};
use sluice_core::{
    Alignment, BucketedWindow, BucketedWindowState, ConcurrencyLimit, Decision, FixedWindow, Gcra,
    LeakyQueue, Policy, Rate, SlidingCounter, SlidingLog, Timestamp, TokenBucket,
};
use sluice_redis::testing::{self, check_script, decode_replies, push_check};

/// Where the walks start: about 2027, in nanoseconds since the epoch.
const START: u64 = 1_800_000_000_123_456_789;
const E9: u64 = 1_000_000_000;

/// The check script on a frozen clock: `TIME` replaced by the seconds and microseconds stored
/// at `clock:s` and `clock:us`.
fn frozen_check_script(clock: &str) -> String {
    let time = "redis.call('TIME')";
    assert_eq!(
        check_script().matches(time).count(),
        1,
        "the script reads TIME once"
    );
    check_script().replace(
        time,
        &format!("redis.call('MGET', '{clock}:s', '{clock}:us')"),
    )
}

/// A small deterministic generator (splitmix64): the sequences are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=max`.
    fn upto(&mut self, max: u64) -> u64 {
        if max == u64::MAX {
            self.next()
        } else {
            self.next() % (max + 1)
        }
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.upto(99) < percent
    }
}

/// What the model holds for one key: the core's state, and for the log also the list the
/// script is expected to store.
#[derive(Clone, Debug)]
enum State {
    TokenBucket(TokenBucketState),
    /// GCRA's theoretical arrival time, or the queue's next free slot.
    At(Timestamp),
    FixedWindow(FixedWindowState),
    SlidingLog(SlidingLogState, Vec<(u64, u64)>),
    /// The concurrency limit's holds, and the list the script is expected to store, as the log's.
    ConcurrencyLimit(ConcurrencyLimitState, Vec<(u64, u64)>),
    SlidingCounter(SlidingCounterState),
    /// The buckets, and the bucket length in nanoseconds (for their starts).
    BucketedWindow(BucketedWindowState, u64),
}

/// The state of a key never seen, for `policy` at `now`.
fn fresh(policy: &Policy, now: Timestamp) -> State {
    match policy {
        Policy::TokenBucket(tb) => State::TokenBucket(tb.initial(now)),
        Policy::Gcra(_) | Policy::LeakyQueue(_) => State::At(Timestamp::EPOCH),
        Policy::FixedWindow(_) => State::FixedWindow(FixedWindowState::default()),
        Policy::SlidingLog(_) => State::SlidingLog(SlidingLogState::default(), Vec::new()),
        Policy::ConcurrencyLimit(_) => {
            State::ConcurrencyLimit(ConcurrencyLimitState::default(), Vec::new())
        }
        Policy::SlidingCounter(_) => State::SlidingCounter(SlidingCounterState::default()),
        Policy::BucketedWindow(bw) => {
            State::BucketedWindow(BucketedWindowState::default(), nanos(bw.bucket()))
        }
    }
}

/// The core's decision on `state`, the state an admission leaves, and the refund token.
fn decide(policy: &Policy, state: &State, now: Timestamp, cost: u64) -> (Decision, State, String) {
    let abs = |t: Timestamp| t.as_nanos().to_string();
    match (policy, state) {
        (Policy::TokenBucket(tb), State::TokenBucket(s)) => {
            let (s, d) = tb.decide(*s, now, cost);
            (d, State::TokenBucket(s), String::new())
        }
        (Policy::Gcra(g), State::At(t)) => {
            let (t, d) = g.decide(*t, now, cost);
            (d, State::At(t), String::new())
        }
        (Policy::LeakyQueue(q), State::At(t)) => {
            let (t, d) = q.decide(*t, now, cost);
            (d, State::At(t), String::new())
        }
        (Policy::FixedWindow(fw), State::FixedWindow(s)) => {
            let (s, d) = fw.decide(*s, now, cost);
            (d, State::FixedWindow(s), abs(s.start))
        }
        (Policy::SlidingCounter(sc), State::SlidingCounter(s)) => {
            let (s, d) = sc.decide(*s, now, cost);
            (d, State::SlidingCounter(s), abs(s.start))
        }
        (Policy::SlidingLog(sl), State::SlidingLog(s, list)) => {
            let d = sl.decide(s, now, cost);
            let (mut s, mut list) = (s.clone(), list.clone());
            if d.allowed && cost > 0 {
                sl.record(&mut s, now, cost);
                let w = u64::try_from(sl.window().as_nanos()).unwrap();
                list.retain(|&(at, _)| at + w > now.as_nanos());
                match list.last_mut() {
                    Some((at, units)) if *at >= now.as_nanos() => *units += cost,
                    _ => list.push((now.as_nanos(), cost)),
                }
            }
            let token = list
                .last()
                .map(|(at, _)| at.to_string())
                .unwrap_or_default();
            (d, State::SlidingLog(s, list), token)
        }
        (Policy::ConcurrencyLimit(f), State::ConcurrencyLimit(s, list)) => {
            let d = f.decide(s, now, cost);
            let (mut s, mut list) = (s.clone(), list.clone());
            if d.allowed && cost > 0 {
                f.record(&mut s, now, cost);
                let w = u64::try_from(f.ttl().as_nanos()).unwrap();
                list.retain(|&(at, _)| at + w > now.as_nanos());
                match list.last_mut() {
                    Some((at, units)) if *at >= now.as_nanos() => *units += cost,
                    _ => list.push((now.as_nanos(), cost)),
                }
            }
            let token = list
                .last()
                .map(|(at, _)| at.to_string())
                .unwrap_or_default();
            (d, State::ConcurrencyLimit(s, list), token)
        }
        (Policy::BucketedWindow(bw), State::BucketedWindow(s, bucket)) => {
            let d = bw.decide(s, now, cost);
            let mut s = s.clone();
            if d.allowed && cost > 0 {
                bw.record(&mut s, now, cost);
            }
            let token = (s.buckets().0 * bucket).to_string();
            (d, State::BucketedWindow(s, *bucket), token)
        }
        (p, s) => panic!("{p:?} cannot decide on {s:?}"),
    }
}

/// The stored form of a string state, as the script must write it.
fn stored(state: &State, queue: bool) -> Option<String> {
    Some(match state {
        State::TokenBucket(s) => format!("1 {} {}", s.tokens, s.last.as_nanos()),
        State::At(t) => format!("{} {}", if queue { 3 } else { 2 }, t.as_nanos()),
        State::FixedWindow(s) => format!("4 {} {}", s.start.as_nanos(), s.count),
        State::SlidingCounter(s) => {
            format!("6 {} {} {}", s.start.as_nanos(), s.current, s.previous)
        }
        State::BucketedWindow(s, bucket) => {
            // The newest bucket's start, then the counts newest first, older zeros left off.
            let (newest, counts) = s.buckets();
            let mut counts: Vec<u32> = counts.into_iter().rev().collect();
            while counts.len() > 1 && counts.last() == Some(&0) {
                counts.pop();
            }
            let counts: Vec<String> = counts.iter().map(u32::to_string).collect();
            format!("7 {} {}", newest * bucket, counts.join(" "))
        }
        State::SlidingLog(..) | State::ConcurrencyLimit(..) => return None,
    })
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

/// The list the script must store for a sliding log.
fn stored_list(state: &State) -> Vec<String> {
    let (mark, list) = match state {
        State::SlidingLog(_, list) => ("", list),
        State::ConcurrencyLimit(_, list) => ("c", list),
        _ => unreachable!(),
    };
    let total: u64 = list.iter().map(|(_, u)| u).sum();
    std::iter::once(format!("{mark}{total}"))
        .chain(list.iter().map(|(at, u)| format!("{at} {u}")))
        .collect()
}

/// One policy's random walk through time and costs against one Redis.
struct Walk<'a> {
    conn: &'a mut redis::Connection,
    script: &'a redis::Script,
    rng: Rng,
    /// Nanoseconds since the epoch.
    now: u64,
    /// Whether time moves in whole microseconds, as Redis `TIME` does: the script holds fixed
    /// windows past 2⁵³ ns exactly only then.
    micros: bool,
    /// The model of every key written so far.
    states: HashMap<String, State>,
    prefix: String,
}

impl Walk<'_> {
    /// Runs one call of `checks` (key suffix, policy, cost) and compares everything with the
    /// model.
    fn call(&mut self, checks: &[(&str, &Policy, u64)], commit: bool, what: &str) {
        let now = Timestamp::from_nanos(self.now);
        // Any application clock picks the same windows: skew it by up to a day either way.
        let skew = self.rng.upto(2 * 86_400 * E9);
        let app_now = Timestamp::from_nanos(self.now + skew - 86_400 * E9);
        let clock = &self.prefix;
        let _: () = redis::cmd("MSET")
            .arg(format!("{clock}:s"))
            .arg(self.now / E9)
            .arg(format!("{clock}:us"))
            .arg(self.now % E9 / 1_000)
            .query(self.conn)
            .unwrap();
        let mut args = vec![
            (self.now % 1_000).to_string(),
            if commit { "1" } else { "0" }.to_owned(),
        ];
        let keys: Vec<String> = checks
            .iter()
            .map(|(k, _, _)| format!("{}:{k}", self.prefix))
            .collect();
        for (_, policy, cost) in checks {
            push_check(&mut args, policy, *cost, app_now, "").unwrap();
        }
        let mut invocation = self.script.prepare_invoke();
        for k in &keys {
            invocation.key(k);
        }
        for a in &args {
            invocation.arg(a);
        }
        let value: redis::Value = invocation.invoke(self.conn).unwrap();
        let replies = decode_replies(value, checks.iter().map(|(_, p, _)| p.limit())).unwrap();

        let mut threaded: HashMap<&str, State> = HashMap::new();
        let mut written: HashMap<&str, Duration> = HashMap::new();
        let mut all = true;
        for (i, ((key, policy, cost), (reply, reply_token))) in
            checks.iter().zip(&replies).enumerate()
        {
            let state = threaded
                .get(key)
                .or_else(|| self.states.get(*key))
                .cloned()
                .unwrap_or_else(|| fresh(policy, now));
            let (decision, after, token) = decide(policy, &state, now, *cost);
            let context = format!(
                "{what}: check {i} of {checks:?} (commit {commit}) at {} on {state:?}",
                self.now
            );
            assert_eq!(*reply, decision, "{context}");
            let consumed = decision.allowed && *cost > 0;
            let token = if consumed { token } else { String::new() };
            assert_eq!(*reply_token, token, "the refund token of {context}");
            all &= decision.allowed;
            if consumed {
                threaded.insert(key, after);
                written.insert(key, decision.reset_after);
            }
        }
        if !(commit && all) {
            return;
        }
        for (key, reset) in written {
            let state = threaded.remove(key).unwrap();
            let policy = checks.iter().find(|c| c.0 == key).unwrap().1;
            let redis_key = format!("{}:{key}", self.prefix);
            match stored(&state, matches!(policy, Policy::LeakyQueue(_))) {
                Some(expected) => {
                    let value: String = redis::cmd("GET").arg(&redis_key).query(self.conn).unwrap();
                    assert_eq!(value, expected, "{what}: the stored {key} at {}", self.now);
                }
                None => {
                    let list: Vec<String> = redis::cmd("LRANGE")
                        .arg(&redis_key)
                        .arg(0)
                        .arg(-1)
                        .query(self.conn)
                        .unwrap();
                    assert_eq!(
                        list,
                        stored_list(&state),
                        "{what}: the log {key} at {}",
                        self.now
                    );
                }
            }
            // The TTL runs on Redis's real clock; remove it so that the model stays the truth
            // however slowly this test runs.
            let ttl: i64 = redis::cmd("PTTL").arg(&redis_key).query(self.conn).unwrap();
            let bound = i64::try_from(reset.as_nanos().div_ceil(1_000_000)).unwrap() + 1_000;
            assert!(
                ttl <= bound && ttl > bound - 5_000,
                "{what}: the TTL of {key} is {ttl} ms, for {bound} ms"
            );
            let _: i64 = redis::cmd("PERSIST")
                .arg(&redis_key)
                .query(self.conn)
                .unwrap();
            self.states.insert(key.to_owned(), state);
        }
    }

    /// Moves time forward by a random step: none, a nanosecond, a little, a fraction of
    /// `scale`, or a few `scale`s.
    fn tick(&mut self, scale: u64) {
        self.now += match self.rng.upto(9) {
            0 | 1 => 0,
            2 => 1,
            3 => self.rng.upto(1_000_000),
            4..=7 => self.rng.upto(scale / 3),
            _ => self.rng.upto(3 * scale),
        };
        if self.micros {
            self.now = self.now.next_multiple_of(1_000);
        }
    }

    /// A random cost: mostly 1, sometimes 0, sometimes anything up to just past `limit`.
    fn cost(&mut self, limit: u64) -> u64 {
        match self.rng.upto(9) {
            0 => 0,
            1..=5 => 1,
            6 => limit.saturating_add(1),
            _ => self.rng.upto(limit.saturating_add(1) / 2 + 1),
        }
    }
}

/// Policies for every algorithm and the time scale they act on: small limits that deny often,
/// and parameters whose products pass 2⁵³ (the script's exact arithmetic for large values).
fn policies() -> Vec<(Policy, u64)> {
    let sec = Duration::from_secs(1);
    let hour = Duration::from_secs(3600);
    let day = Duration::from_secs(86_400);
    // The longest fixed window the script holds: whole microseconds below 2⁵⁵ ns.
    let longest_window = Duration::from_micros(((1 << 55) - 1) / 1_000);
    // The largest burst whose backlog (burst × interval) stays below 2⁵³ ns at 1 per second.
    let largest_gcra_burst = ((1_u64 << 53) - 1) / E9;
    let p = |r: Result<Policy, sluice_core::PolicyError>| r.unwrap();
    vec![
        (
            p(TokenBucket::new(5, Rate::per_second(3)).map(Policy::from)),
            E9,
        ),
        (
            p(TokenBucket::new(7, Rate::new(2, 3 * sec).unwrap()).map(Policy::from)),
            3 * E9,
        ),
        // Refill products beyond 2⁵³ within milliseconds.
        (
            p(TokenBucket::new(10_000_000, Rate::per_second(999_999_937)).map(Policy::from)),
            10_000_000,
        ),
        (
            p(TokenBucket::new(0, Rate::per_second(0)).map(Policy::from)),
            E9,
        ),
        (p(Gcra::new(Rate::per_second(5), 3).map(Policy::from)), E9),
        (
            p(Gcra::new(Rate::per_second(1), largest_gcra_burst).map(Policy::from)),
            1 << 53,
        ),
        (p(Gcra::new(Rate::per_second(7), 0).map(Policy::from)), E9),
        (
            p(
                LeakyQueue::new(Rate::per_second(4), 3, Duration::from_millis(500))
                    .map(Policy::from),
            ),
            E9,
        ),
        (
            p(LeakyQueue::new(Rate::per_second(4), 10, hour).map(Policy::from)),
            4 * E9,
        ),
        (
            p(LeakyQueue::new(Rate::new(0, sec).unwrap(), 3, sec).map(Policy::from)),
            E9,
        ),
        (
            p(
                LeakyQueue::new(Rate::per_second(1), largest_gcra_burst - 1, Duration::MAX)
                    .map(Policy::from),
            ),
            1 << 53,
        ),
        (
            p(FixedWindow::new(5, sec, Alignment::FirstRequest).map(Policy::from)),
            E9,
        ),
        (
            p(FixedWindow::new(5, sec, Alignment::Clock { utc_offset_secs: 0 }).map(Policy::from)),
            E9,
        ),
        (
            p(FixedWindow::new(
                3,
                hour,
                Alignment::Clock {
                    utc_offset_secs: 19_800,
                },
            )
            .map(Policy::from)),
            3_600 * E9,
        ),
        // Windows past 2⁵³ ns, which the script holds exactly in whole microseconds: Envoy's
        // `unit: year` on the clock, and the longest window, from the first request and on a
        // clock east of UTC.
        (
            p(
                FixedWindow::new(4, 365 * day, Alignment::Clock { utc_offset_secs: 0 })
                    .map(Policy::from),
            ),
            365 * 86_400 * E9,
        ),
        (
            p(FixedWindow::new(3, longest_window, Alignment::FirstRequest).map(Policy::from)),
            (1 << 55) - 1_000,
        ),
        (
            p(FixedWindow::new(
                3,
                longest_window,
                Alignment::Clock {
                    utc_offset_secs: 19_800,
                },
            )
            .map(Policy::from)),
            (1 << 55) - 1_000,
        ),
        (p(SlidingLog::new(5, sec).map(Policy::from)), E9),
        (
            p(SlidingLog::new(3, Duration::from_millis(250)).map(Policy::from)),
            250_000_000,
        ),
        (p(SlidingCounter::new(5, sec).map(Policy::from)), E9),
        (p(ConcurrencyLimit::new(5, sec).map(Policy::from)), E9),
        // Holds that outlast the second a refusal is told to wait.
        (
            p(ConcurrencyLimit::new(3, Duration::from_secs(3)).map(Policy::from)),
            3 * E9,
        ),
        (p(BucketedWindow::new(5, sec, 4).map(Policy::from)), E9),
        (p(BucketedWindow::new(3, sec, 1).map(Policy::from)), E9),
        // An hour in minutes, and the most buckets a window may have.
        (
            p(BucketedWindow::new(20, hour, 60).map(Policy::from)),
            3_600 * E9,
        ),
        (
            p(BucketedWindow::new(1_000, Duration::from_millis(1024), 1024).map(Policy::from)),
            E9,
        ),
        // Weighted counts whose products pass 2⁵³.
        (
            p(SlidingCounter::new(4_000_000, Duration::from_secs(60)).map(Policy::from)),
            60 * E9,
        ),
    ]
}

/// Every policy walks 400 steps of single checks, then 400 steps of two checks per call: the
/// same key twice, or the key and a second key under another policy.
#[test]
fn the_check_script_decides_as_the_core_does() {
    let server = testing::shared_server();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let policies = policies();
    let other = Policy::from(TokenBucket::new(3, Rate::per_second(2)).unwrap());
    let mut failed = Vec::new();
    for (n, (policy, scale)) in policies.iter().enumerate() {
        let prefix = testing::unique_prefix();
        let script = redis::Script::new(&frozen_check_script(&prefix));
        let micros = policy.requests_per().1 >= Duration::from_nanos(1 << 53);
        let mut walk = Walk {
            conn: &mut conn,
            script: &script,
            rng: Rng(n as u64 + 1),
            now: if micros {
                START.next_multiple_of(1_000)
            } else {
                START
            },
            micros,
            states: HashMap::new(),
            prefix,
        };
        let what = format!("{policy:?}");
        // Every policy walks even when an earlier one failed, so one run shows every mismatch.
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for _ in 0..400 {
                walk.tick(*scale);
                let cost = walk.cost(policy.limit());
                let commit = walk.rng.chance(90);
                walk.call(&[("k", policy, cost)], commit, &what);
            }
            for _ in 0..400 {
                walk.tick(*scale);
                let (a, b) = (walk.cost(policy.limit()), walk.cost(policy.limit()));
                let commit = walk.rng.chance(90);
                if walk.rng.chance(50) {
                    walk.call(&[("k", policy, a), ("k", policy, b)], commit, &what);
                } else {
                    let c = walk.cost(3);
                    walk.call(&[("k", policy, a), ("o", &other, c)], commit, &what);
                }
            }
        }));
        if run.is_err() {
            failed.push(what);
        }
    }
    assert!(
        failed.is_empty(),
        "the script and the core disagree for {failed:#?}"
    );
}
