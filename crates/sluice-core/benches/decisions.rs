//! One rate-limit decision on the memory store, per algorithm, with governor's keyed limiter on
//! the same keys as the baseline measured in the same run.
//!
//! Every benchmark cycles through a key set (one hot key, 100k or 1M distinct `user:{n}` strings)
//! that was inserted, in another order, before timing starts, so the figures are steady-state
//! decisions on tracked keys, not insertions. With 2 threads, each thread makes the reported number of decisions (the
//! figure is per-thread nanoseconds per decision) and the threads start half a key set apart.
//! Times leave out what a thread spent waiting for a CPU held by another process (see
//! [`Stopwatch`]); `SLUICE_BENCH_WALL=1` gives plain wall-clock time.
//!
//! `docs/BENCHMARKS.md` describes the method and records the results.

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::{Criterion, criterion_group};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use sluice_core::{
    Alignment, Check, Decision, DynStore, FakeClock, FixedWindow, FixedWindowState, Gcra,
    LeakyQueue, MemoryStore, Policy, Rate, SlidingCounter, SlidingCounterState, SlidingLog,
    SlidingLogState, Store, Timestamp, TokenBucket,
};

/// The limit of the generous policies: no key reaches it within a run, so every decision is an
/// admission, and one request's refill time (a minute) keeps every key tracked for the run.
const GENEROUS: u32 = 200_000_000;

/// The limit of the denial-heavy policies: every key is refused after its tenth request.
const STINGY: u32 = 10;

/// The key sets, as `(name, how many keys)`. The strings are made once, before any timing.
const KEY_SETS: [(&str, usize); 3] = [("hot", 1), ("100k", 100_000), ("1M", 1_000_000)];

const THREADS: [usize; 2] = [1, 2];

/// The six algorithms with generous parameters.
fn generous_policies() -> Vec<(&'static str, Policy)> {
    let n = u64::from(GENEROUS);
    let minute = Duration::from_secs(60);
    vec![
        (
            "token_bucket",
            TokenBucket::new(n, Rate::per_minute(1)).unwrap().into(),
        ),
        // One unit per 10s rather than per minute: GCRA refuses bursts whose backlog would
        // span over a century, and 200M minutes would.
        (
            "gcra",
            Gcra::new(Rate::new(1, Duration::from_secs(10)).unwrap(), n)
                .unwrap()
                .into(),
        ),
        (
            "leaky_queue",
            // The queue delays rather than refuses: every request is admitted, most with a delay.
            LeakyQueue::new(Rate::per_minute(1), n, Duration::from_secs(n * 60))
                .unwrap()
                .into(),
        ),
        (
            "fixed_window",
            FixedWindow::new(n, minute, Alignment::Clock { utc_offset_secs: 0 })
                .unwrap()
                .into(),
        ),
        (
            "sliding_counter",
            SlidingCounter::new(n, minute).unwrap().into(),
        ),
        (
            // The log keeps one entry per admitted request, and its limit is capped at 1M, so it
            // gets a realistic 1000 per second instead: the hot key is refused most of the time.
            "sliding_log",
            SlidingLog::new(1_000, Duration::from_secs(1))
                .unwrap()
                .into(),
        ),
    ]
}

/// Governor's quota matching [`GENEROUS`] GCRA: `burst` back to back, one more each minute.
fn governor_quota(burst: u32) -> Quota {
    Quota::per_minute(NonZeroU32::MIN).allow_burst(NonZeroU32::new(burst).unwrap())
}

/// Runs `decide` on `iters` keys in turn from `keys`, starting at `first`. Returns the time taken
/// and how many decisions admitted.
fn drive<F>(keys: &[String], first: usize, iters: u64, decide: &F) -> (Duration, u64)
where
    F: Fn(&String) -> bool + Sync,
{
    let mut i = first;
    let mut admitted = 0;
    let watch = Stopwatch::start();
    for _ in 0..iters {
        admitted += u64::from(decide(&keys[i]));
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
    (watch.elapsed(), admitted)
}

/// Times `iters` calls of `f` on this thread.
fn repeat<T>(iters: u64, mut f: impl FnMut() -> T) -> Duration {
    let watch = Stopwatch::start();
    for _ in 0..iters {
        black_box(f());
    }
    watch.elapsed()
}

/// Measures the calling thread's elapsed time, less the time it spent waiting for a CPU while
/// other processes held both: on a shared machine that wait is most of the noise, and it says
/// nothing about the code. Time blocked on a lock still counts. `SLUICE_BENCH_WALL=1` measures
/// plain wall-clock time instead.
struct Stopwatch {
    wall: Instant,
    /// The thread's run-queue wait so far, or `None` when measuring wall-clock time.
    waited: Option<Duration>,
}

impl Stopwatch {
    fn start() -> Self {
        let waited = match std::env::var_os("SLUICE_BENCH_WALL") {
            Some(_) => None,
            None => run_queue_wait(),
        };
        Stopwatch {
            wall: Instant::now(),
            waited,
        }
    }

    fn elapsed(&self) -> Duration {
        let wall = self.wall.elapsed();
        match (self.waited, run_queue_wait()) {
            (Some(before), Some(after)) => wall.saturating_sub(after.saturating_sub(before)),
            _ => wall,
        }
    }
}

/// How long this thread has waited on a run queue, from the second field of
/// `/proc/thread-self/schedstat` (Linux with `CONFIG_SCHED_INFO`). It is brought up to date
/// each time the thread gets a CPU, so the running thread reads an exact figure.
fn run_queue_wait() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = stat.split_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

/// Tallies of one benchmark's decisions, to show how many were admissions.
#[derive(Default)]
struct Tally {
    decisions: AtomicU64,
    admitted: AtomicU64,
}

impl Tally {
    fn add(&self, decisions: u64, admitted: u64) {
        self.decisions.fetch_add(decisions, Ordering::Relaxed);
        self.admitted.fetch_add(admitted, Ordering::Relaxed);
    }

    fn report(&self, id: &str) {
        let n = self.decisions.load(Ordering::Relaxed).max(1);
        let a = self.admitted.load(Ordering::Relaxed);
        println!(
            "{id}: {:.2}% of {n} decisions admitted",
            100.0 * a as f64 / n as f64
        );
    }
}

/// Makes `iters` decisions on each of `threads` threads and returns the longest thread's time,
/// so the figure is per-thread time per decision.
fn timed<F>(keys: &[String], threads: usize, iters: u64, tally: &Tally, decide: &F) -> Duration
where
    F: Fn(&String) -> bool + Sync,
{
    if threads == 1 {
        let (elapsed, admitted) = drive(keys, 0, iters, decide);
        tally.add(iters, admitted);
        return elapsed;
    }
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    drive(keys, t * keys.len() / threads, iters, decide)
                })
            })
            .collect();
        let mut longest = Duration::ZERO;
        for w in workers {
            let (elapsed, admitted) = w.join().expect("a benchmark thread panicked");
            tally.add(iters, admitted);
            longest = longest.max(elapsed);
        }
        longest
    })
}

/// Benchmarks `decide` over `keys` after `passes` untimed passes over every key: one inserts
/// them, and more exhaust a stingy limit.
fn bench_decisions<F>(
    c: &mut Criterion,
    id: &str,
    keys: &[String],
    threads: usize,
    passes: u32,
    decide: F,
) where
    F: Fn(&String) -> bool + Sync,
{
    let tally = Tally::default();
    let mut filled = false;
    c.bench_function(id, |b| {
        // Inside the routine, so that a benchmark left out by a filter costs nothing.
        if !filled {
            let order = shuffled(keys.len());
            for _ in 0..passes {
                for &i in &order {
                    let _ = decide(&keys[i]);
                }
            }
            filled = true;
        }
        b.iter_custom(|iters| timed(keys, threads, iters, &tally, &decide))
    });
    if filled {
        tally.report(id);
    }
}

/// The numbers `0..n` in a fixed pseudo-random order. Keys go in in this order and are then
/// visited in order, so that governor's own copies of the keys, allocated one after another as
/// they go in, do not lie in the order of the visits: real traffic would not give it those cache
/// hits. (Sluice stores no key text, so the order does not matter to it.)
fn shuffled(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in (1..n).rev() {
        // xorshift64: reproducible, and random enough to scatter the allocations.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

/// Polls a future that is ready at once, as every memory-store future is, with no runtime.
fn ready<F: Future>(f: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a memory-store future was not ready at once"),
    }
}

fn all_keys() -> Vec<String> {
    let most = KEY_SETS.iter().map(|(_, n)| *n).max().unwrap_or(1);
    (0..most).map(|n| format!("user:{n}")).collect()
}

fn decisions(c: &mut Criterion) {
    let keys = all_keys();
    for (set, n) in KEY_SETS {
        let keys = &keys[..n];
        for threads in THREADS {
            for (name, policy) in generous_policies() {
                let store = MemoryStore::new();
                bench_decisions(
                    c,
                    &format!("{name}/{set}/{threads}t"),
                    keys,
                    threads,
                    1,
                    |k| {
                        let d = store.check_one(Check::new(k, &policy, 1));
                        black_box(d).is_ok_and(|d| d.allowed)
                    },
                );
                if !store.is_empty() && store.len() != n {
                    // Only the sliding log's keys expire within a run (after a second unseen).
                    println!(
                        "{name}/{set}/{threads}t: {} of {n} keys tracked",
                        store.len()
                    );
                }
            }
            let governor: DefaultKeyedRateLimiter<String> =
                RateLimiter::keyed(governor_quota(GENEROUS));
            bench_decisions(
                c,
                &format!("governor/{set}/{threads}t"),
                keys,
                threads,
                1,
                |k| black_box(governor.check_key(k)).is_ok(),
            );
        }
    }
}

/// Decisions that are nearly all refusals: a hot key or 100k keys, each past its limit.
fn denials(c: &mut Criterion) {
    let keys = all_keys();
    for (set, n) in &KEY_SETS[..2] {
        let keys = &keys[..*n];
        let policy = Policy::from(TokenBucket::new(STINGY.into(), Rate::per_minute(1)).unwrap());
        let store = MemoryStore::new();
        bench_decisions(
            c,
            &format!("token_bucket_denied/{set}/1t"),
            keys,
            1,
            STINGY,
            |k| {
                let d = store.check_one(Check::new(k, &policy, 1));
                black_box(d).is_ok_and(|d| d.allowed)
            },
        );
        let governor: DefaultKeyedRateLimiter<String> = RateLimiter::keyed(governor_quota(STINGY));
        bench_decisions(
            c,
            &format!("governor_denied/{set}/1t"),
            keys,
            1,
            STINGY,
            |k| black_box(governor.check_key(k)).is_ok(),
        );
    }
}

/// The same token-bucket decision through `Store::check` (a future and a one-element vector) and
/// through `DynStore::check` (a boxed future as well), next to `check_one`.
fn trait_paths(c: &mut Criterion) {
    let keys = all_keys();
    let policy = Policy::from(TokenBucket::new(GENEROUS.into(), Rate::per_minute(1)).unwrap());
    for (set, n) in [KEY_SETS[0], KEY_SETS[2]] {
        let keys = &keys[..n];
        let store = MemoryStore::new();
        bench_decisions(c, &format!("store_check/{set}/1t"), keys, 1, 1, |k| {
            let d = ready(Store::check(&store, &[Check::new(k, &policy, 1)]));
            black_box(d).is_ok_and(|d| d[0].allowed)
        });
        let dyn_store: &dyn DynStore = &store;
        bench_decisions(c, &format!("dyn_store_check/{set}/1t"), keys, 1, 1, |k| {
            let d = ready(dyn_store.check(&[Check::new(k, &policy, 1)]));
            black_box(d).is_ok_and(|d| d[0].allowed)
        });
    }
}

/// Each algorithm's decision alone, on one state in a local variable, with `now` moving 100 ns a
/// call: what the store adds to it is the clock, the fingerprint, the lock and the lookup.
fn algorithms_alone(c: &mut Criterion) {
    for (name, policy) in generous_policies() {
        let id = format!("decide_only/{name}");
        match policy {
            Policy::TokenBucket(p) => {
                decide_only(c, &id, p.initial(START), |s, now| p.decide(s, now, 1));
            }
            Policy::Gcra(p) => decide_only(c, &id, Timestamp::EPOCH, |s, now| p.decide(s, now, 1)),
            Policy::LeakyQueue(p) => {
                decide_only(c, &id, Timestamp::EPOCH, |s, now| p.decide(s, now, 1));
            }
            Policy::FixedWindow(p) => {
                decide_only(c, &id, FixedWindowState::default(), |s, now| {
                    p.decide(s, now, 1)
                });
            }
            Policy::SlidingCounter(p) => {
                let state = SlidingCounterState::default();
                decide_only(c, &id, state, |s, now| p.decide(s, now, 1));
            }
            // Their state is on the heap and recorded in place: the log's cost grows with its
            // length (see `sliding_log_length`), the buckets' with their number, the holds'
            // with the requests in flight.
            Policy::SlidingLog(_) | Policy::BucketedWindow(_) | Policy::ConcurrencyLimit(_) => {}
        }
    }
}

/// Where [`decide_only`] starts its clock.
const START: Timestamp = Timestamp::from_secs(1_700_000_000);

/// Benchmarks `decide` on one state held in a local, threading each call's state into the next,
/// with `now` moving 100 ns a call.
fn decide_only<S: Copy>(
    c: &mut Criterion,
    id: &str,
    mut state: S,
    decide: impl Fn(S, Timestamp) -> (S, Decision),
) {
    let step = Duration::from_nanos(100);
    let mut now = START;
    c.bench_function(id, |b| {
        b.iter_custom(|iters| {
            repeat(iters, || {
                now = now.saturating_add(step);
                let (next, d) = decide(state, black_box(now));
                state = next;
                d
            })
        })
    });
}

/// The hot-key decision on a store whose clock is read from memory, kept current by a thread
/// that sets it every millisecond: the difference from `{name}/hot/1t` is the clock read.
fn cached_clock(c: &mut Criterion) {
    let clock = FakeClock::at(wall_clock());
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
                clock.set(wall_clock());
            }
        });
        let keys = [String::from("user:0")];
        for (name, policy) in generous_policies().into_iter().take(2) {
            let store = MemoryStore::builder().clock(clock.clone()).build();
            bench_decisions(
                c,
                &format!("cached_clock/{name}/hot/1t"),
                &keys,
                1,
                1,
                |k| {
                    let d = store.check_one(Check::new(k, &policy, 1));
                    black_box(d).is_ok_and(|d| d.allowed)
                },
            );
        }
        stop.store(true, Ordering::Relaxed);
    });
}

fn wall_clock() -> Timestamp {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp::from_nanos(u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX))
}

/// The sliding log's decision alone, on logs of growing length: it sums the whole log each time.
fn sliding_log_length(c: &mut Criterion) {
    let log = SlidingLog::new(SlidingLog::MAX_LIMIT, Duration::from_secs(3600)).unwrap();
    for len in [10u64, 100, 1_000, 10_000] {
        let mut state = SlidingLogState::default();
        for t in 0..len {
            log.record(&mut state, Timestamp::from_secs(1_000 + t), 1);
        }
        let now = Timestamp::from_secs(1_000 + len);
        c.bench_function(&format!("sliding_log_decide/len_{len}"), |b| {
            b.iter_custom(|iters| repeat(iters, || log.decide(black_box(&state), now, 1)))
        });
    }
}

fn config() -> Criterion {
    // Short enough to repeat on two shared cores; docs/BENCHMARKS.md takes the median of runs.
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500))
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = decisions, denials, trait_paths, algorithms_alone, sliding_log_length, cached_clock
}

/// Counts instructions instead of timing, for `valgrind --tool=callgrind`: with
/// `SLUICE_BENCH_COUNT=<algorithm>/<key set>` (such as `gcra/hot`, `governor/1M`) the binary
/// fills one store as the timed benchmark does, then makes [`COUNTED`] decisions in
/// [`counted`] and exits. Instruction counts do not move with the neighbours' load, so they
/// compare two builds where timings on a shared machine cannot:
///
/// ```sh
/// SLUICE_BENCH_COUNT=gcra/hot valgrind --tool=callgrind --toggle-collect='*counted*' \
///     target/release/deps/decisions-<hash>
/// ```
///
/// The total of the collected instructions over [`COUNTED`] is the cost of one decision.
fn count_instructions(case: &str) {
    let (name, set) = case
        .split_once('/')
        .expect("SLUICE_BENCH_COUNT is <algorithm>/<key set>, such as gcra/hot");
    let n = KEY_SETS
        .iter()
        .find(|(s, _)| *s == set)
        .map(|(_, n)| *n)
        .expect("the key set is hot, 100k or 1M");
    let keys = &all_keys()[..n];
    let order = shuffled(n);
    let admitted = if name == "governor" {
        let governor: DefaultKeyedRateLimiter<String> =
            RateLimiter::keyed(governor_quota(GENEROUS));
        let decide = |k: &String| black_box(governor.check_key(k)).is_ok();
        for &i in &order {
            decide(&keys[i]);
        }
        counted(keys, &decide)
    } else {
        let (_, policy) = generous_policies()
            .into_iter()
            .find(|(p, _)| *p == name)
            .expect("the algorithm is one of the generous policies, or governor");
        let store = MemoryStore::new();
        let decide = |k: &String| {
            let d = store.check_one(Check::new(k, &policy, 1));
            black_box(d).is_ok_and(|d| d.allowed)
        };
        for &i in &order {
            decide(&keys[i]);
        }
        counted(keys, &decide)
    };
    println!("{case}: {admitted} of {COUNTED} decisions admitted");
}

/// How many decisions [`count_instructions`] counts.
const COUNTED: u64 = 100_000;

/// The decisions whose instructions are counted; not inlined so that callgrind can collect
/// exactly them.
#[inline(never)]
fn counted(keys: &[String], decide: &impl Fn(&String) -> bool) -> u64 {
    (0..COUNTED)
        .map(|i| u64::from(decide(&keys[i as usize % keys.len()])))
        .sum()
}

fn main() {
    if let Ok(case) = std::env::var("SLUICE_BENCH_COUNT") {
        count_instructions(&case);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
