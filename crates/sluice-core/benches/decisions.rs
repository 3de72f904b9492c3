//! One rate-limit decision on the memory store, per algorithm, with governor's keyed limiter on
//! the same keys as the baseline measured in the same run.
//!
//! Every benchmark cycles through a key set (one hot key, 100k or 1M distinct `user:{n}` strings)
//! that was inserted before timing starts, so the figures are steady-state decisions on tracked
//! keys, not insertions. With 2 threads, each thread makes the reported number of decisions (the
//! figure is per-thread nanoseconds per decision) and the threads start half a key set apart.
//! `docs/BENCHMARKS.md` describes the method and records the results.

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use sluice_core::{
    Alignment, Check, DynStore, FixedWindow, Gcra, LeakyQueue, MemoryStore, Policy, Rate,
    SlidingCounter, SlidingLog, SlidingLogState, Store, Timestamp, TokenBucket,
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
        ("gcra", Gcra::new(Rate::per_minute(1), n).unwrap().into()),
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
    let start = Instant::now();
    for _ in 0..iters {
        admitted += u64::from(decide(&keys[i]));
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
    (start.elapsed(), admitted)
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
            for _ in 0..passes {
                for k in keys {
                    let _ = decide(k);
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
            b.iter(|| log.decide(black_box(&state), now, 1))
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
    targets = decisions, denials, trait_paths, sliding_log_length
}
criterion_main!(benches);
