//! The usage scenario: many callers at once, each using a random number of units known only when
//! its call ends, against one budget, in the two flows a limiter can offer them.
//!
//! - **check-then-report** (Envoy's flow, `hits_addend` on the response path): a call asks
//!   whether the budget has room (a check at cost 0, which takes nothing), runs, and reports
//!   what it used, counted even past the limit.
//! - **reserve-then-settle** (Sluice's `/v1/reserve` and `/v1/settle`): a call reserves the most
//!   it may use, runs, and settles with what it used; the rest is given back.
//!
//! Both run on Sluice's own memory store under a simulated clock ([`FakeClock`]), the budget a
//! limit as Envoy's rules give one (units per window, windows on the clock), with the same
//! callers, the same usage and the same call lengths, drawn from one seed: the store's check, its
//! reservations and settles, and its charge past the limit for a report.
//! The answer is how many units the admitted calls used beyond the budget, and the plot shows
//! the units used over time against the budget line: check-then-report admits every caller in
//! flight before any report lands, and overspends by as much as the concurrency allows.
//!
//! ```
//! use sluice_sim::usage::{Flow, UsageSetup, simulate_usage};
//!
//! let setup = UsageSetup { callers: 200, ..UsageSetup::default() };
//! let [report, reserve] = simulate_usage(&setup).unwrap();
//! assert_eq!(report.flow, Flow::CheckThenReport);
//! assert!(report.beyond_budget > 0);
//! assert_eq!(reserve.beyond_budget, 0);
//! ```

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Write as _;
use std::time::Duration;

use plotters::prelude::*;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use sluice_core::{
    Check, FakeClock, Lease, MemoryStore, Policy, PolicyError, ReservationId, Store, StoreResult,
    Timestamp,
};

use crate::report::ReportError;
use crate::rng::Rng;
use crate::run::START;

/// The callers, their usage and the budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageSetup {
    /// Callers at once, each making one call after another (a closed loop).
    pub callers: u32,
    /// The budget: units per `window`.
    pub budget: u64,
    /// The budget's window.
    pub window: Duration,
    /// The fewest units a call uses.
    pub min_use: u64,
    /// The most units a call uses, and what it declares (reserves) up front.
    pub max_use: u64,
    /// The shortest call.
    pub min_call: Duration,
    /// The longest call.
    pub max_call: Duration,
    /// A refused caller waits this long before its next call.
    pub retry: Duration,
    /// No call starts after this.
    pub duration: Duration,
    /// Fixes the callers' draws.
    pub seed: u64,
}

impl Default for UsageSetup {
    /// `sluice bench usage`'s figures: 1,000 callers, 100,000 units an hour, 50 to 500 units a
    /// call (500 declared); calls of 1 to 20 s, for ten minutes.
    fn default() -> Self {
        UsageSetup {
            callers: 1_000,
            budget: 100_000,
            window: Duration::from_secs(3_600),
            min_use: 50,
            max_use: 500,
            min_call: Duration::from_secs(1),
            max_call: Duration::from_secs(20),
            retry: Duration::from_secs(1),
            duration: Duration::from_secs(600),
            seed: 1,
        }
    }
}

/// How a caller is limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Check at cost 0, report the usage when the call ends.
    CheckThenReport,
    /// Reserve the declared maximum, settle with the usage when the call ends.
    ReserveThenSettle,
}

impl Flow {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Flow::CheckThenReport => "check-then-report (Envoy)",
            Flow::ReserveThenSettle => "reserve-then-settle (Sluice)",
        }
    }
}

/// What one flow let through.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageRun {
    /// The flow.
    pub flow: Flow,
    /// Calls admitted.
    pub admitted: u64,
    /// Calls refused.
    pub refused: u64,
    /// Units the admitted calls used.
    pub used: u64,
    /// Units used beyond the budget (0 when within it).
    pub beyond_budget: u64,
    /// Units given back by settles, over what the admitted calls reserved and did not use
    /// (reserve-then-settle only; 1.0 when every refund arrived).
    pub refunded_share: Option<f64>,
    /// The units used so far, after each call that ended: `(seconds, total)`.
    pub series: Vec<(f64, u64)>,
}

/// A call in flight, ordered by when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// This caller starts a call.
    Start(u32),
    /// Caller's call ends: it used `used` units.
    End { caller: u32, used: u64 },
}

/// Runs both flows on the same callers; check-then-report first.
pub fn simulate_usage(setup: &UsageSetup) -> Result<[UsageRun; 2], PolicyError> {
    let policy = budget_policy(setup)?;
    Ok([
        run(setup, &policy, Flow::CheckThenReport),
        run(setup, &policy, Flow::ReserveThenSettle),
    ])
}

/// The budget as Envoy's rules give it: `budget` units per `window`, on windows aligned on the
/// clock (each run starts at the start of one, [`first_window`]).
fn budget_policy(setup: &UsageSetup) -> Result<Policy, PolicyError> {
    Policy::envoy_limit(setup.budget, setup.window)
}

/// The first start of a window of length `window`, aligned on the clock, at or after [`START`]:
/// where a run begins, so that the whole run falls in one window when the budget's window is
/// longer than the run.
fn first_window(window: Duration) -> Timestamp {
    let w = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX).max(1);
    Timestamp::from_nanos(START.as_nanos().div_ceil(w).saturating_mul(w))
}

/// The answer of a memory store's call, which never waits: its future is ready when first
/// polled.
fn at_once<T>(call: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
    match pin!(call).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(answer) => answer,
        Poll::Pending => unreachable!("the memory store answers without waiting"),
    }
}

/// The units the budget has left at the clock's time.
fn remaining(store: &MemoryStore<FakeClock>, policy: &Policy) -> u64 {
    store.peek_one(KEY, policy).remaining
}

/// The one counter every caller shares.
const KEY: &str = "budget";

fn run(setup: &UsageSetup, policy: &Policy, flow: Flow) -> UsageRun {
    // One draw sequence per caller, so both flows give each call the same usage and length.
    let mut draws: Vec<Rng> = (0..setup.callers)
        .map(|c| {
            Rng::new(
                setup
                    .seed
                    .wrapping_mul(1_000_003)
                    .wrapping_add(u64::from(c)),
            )
        })
        .collect();
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let (min_call, max_call) = (nanos(setup.min_call), nanos(setup.max_call).max(1));
    let end_of_starts = nanos(setup.duration);
    let mut events: BinaryHeap<Reverse<(u64, Event)>> = BinaryHeap::new();
    for (c, rng) in (0..setup.callers).zip(draws.iter_mut()) {
        // The callers arrive within the first second.
        events.push(Reverse((rng.below(1_000_000_000), Event::Start(c))));
    }
    let begin = first_window(setup.window);
    let clock = FakeClock::at(begin);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        // Room for every caller's reservation: the store bounds its records by its keys.
        .max_keys(2 * setup.callers as usize + 16)
        .build();
    // A call lasts at most `max_call`: its reservation outlives it.
    let ttl = setup.max_call.saturating_mul(2).max(Duration::from_secs(1));
    let mut held: Vec<Option<ReservationId>> = vec![None; setup.callers as usize];
    let mut out = UsageRun {
        flow,
        admitted: 0,
        refused: 0,
        used: 0,
        beyond_budget: 0,
        refunded_share: None,
        series: vec![(0.0, 0)],
    };
    let (mut refunded, mut unused) = (0u64, 0u64);
    while let Some(Reverse((at, event))) = events.pop() {
        clock.set(Timestamp::from_nanos(begin.as_nanos().saturating_add(at)));
        match event {
            Event::Start(caller) => {
                if at > end_of_starts {
                    continue;
                }
                let rng = &mut draws[caller as usize];
                let used = setup.min_use + rng.below(setup.max_use - setup.min_use + 1);
                let length = min_call + rng.below(max_call.saturating_sub(min_call) + 1);
                let allowed = match flow {
                    Flow::CheckThenReport => store
                        .check_one(Check::new(KEY, policy, 0))
                        .is_ok_and(|d| d.allowed),
                    Flow::ReserveThenSettle => {
                        let id = ReservationId::random();
                        let checks = [Check::new(KEY, policy, setup.max_use)];
                        let lease = Lease { id: &id, ttl };
                        let admitted = at_once(store.reserve(&checks, lease))
                            .is_ok_and(|d| d.iter().all(|d| d.allowed));
                        held[caller as usize] = admitted.then_some(id);
                        admitted
                    }
                };
                if allowed {
                    out.admitted += 1;
                    let end = Event::End { caller, used };
                    events.push(Reverse((at + length, end)));
                } else {
                    out.refused += 1;
                    let again = at + nanos(setup.retry);
                    events.push(Reverse((again, Event::Start(caller))));
                }
            }
            Event::End { caller, used } => {
                match flow {
                    Flow::CheckThenReport => {
                        // Counted even past the limit, as Envoy's report is: the store has
                        // room for the one counter, so the charge cannot fail.
                        let _ = store.charge_one(KEY, policy, used);
                    }
                    Flow::ReserveThenSettle => {
                        let back = setup.max_use - used;
                        let before = remaining(&store, policy);
                        if let Some(id) = held[caller as usize].take() {
                            let _ = at_once(store.settle(&id, used));
                        }
                        refunded += remaining(&store, policy) - before;
                        unused += back;
                    }
                }
                out.used += used;
                out.series.push((at as f64 / 1e9, out.used));
                events.push(Reverse((at, Event::Start(caller))));
            }
        }
    }
    out.beyond_budget = out.used.saturating_sub(setup.budget);
    if flow == Flow::ReserveThenSettle && unused > 0 {
        out.refunded_share = Some(refunded as f64 / unused as f64);
    }
    out
}

/// The table of both runs, in Markdown.
pub fn markdown(setup: &UsageSetup, runs: &[UsageRun]) -> String {
    let mut out = format!(
        "{} callers, {} to {} units a call ({} declared), budget {} per {:?}\n\n\
         | flow | calls admitted | calls refused | units used | beyond the budget | refunded / expected |\n\
         |---|---:|---:|---:|---:|---:|\n",
        setup.callers, setup.min_use, setup.max_use, setup.max_use, setup.budget, setup.window
    );
    for r in runs {
        let share = r
            .refunded_share
            .map_or(String::new(), |s| format!("{s:.4}"));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            r.flow.name(),
            r.admitted,
            r.refused,
            r.used,
            r.beyond_budget,
            share
        );
    }
    out
}

/// A self-contained HTML page: the table, and the units used over time by each flow against
/// the budget line.
pub fn html(setup: &UsageSetup, runs: &[UsageRun]) -> Result<String, ReportError> {
    let fail = |e: &dyn std::fmt::Display| ReportError {
        lane: "usage".to_owned(),
        message: e.to_string(),
    };
    let span = runs
        .iter()
        .filter_map(|r| r.series.last())
        .map(|(t, _)| *t)
        .fold(1.0, f64::max);
    let top = runs
        .iter()
        .map(|r| r.used)
        .chain([setup.budget])
        .max()
        .unwrap_or(1) as f64;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "units used by admitted calls: check-then-report (red), reserve-then-settle \
                 (green), the budget (grey)",
                ("sans-serif", 15),
            )
            .margin(8)
            .margin_right(24)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..span, 0f64..top * 1.1)
            .map_err(|e| fail(&e))?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc("units used")
            .draw()
            .map_err(|e| fail(&e))?;
        for r in runs {
            let color = match r.flow {
                Flow::CheckThenReport => RGBColor(0xc0, 0x39, 0x2b),
                Flow::ReserveThenSettle => RGBColor(0x1b, 0x9e, 0x4b),
            };
            let points = r.series.iter().map(|&(t, u)| (t, u as f64));
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(|e| fail(&e))?;
        }
        let budget = setup.budget as f64;
        chart
            .draw_series(LineSeries::new(
                [(0.0, budget), (span, budget)],
                BLACK.mix(0.4).stroke_width(1),
            ))
            .map_err(|e| fail(&e))?;
        root.present().map_err(|e| fail(&e))?;
    }
    let table = markdown_to_html(runs);
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>Sluice simulation: usage against a budget</title>\n<style>\n\
         body {{ font-family: sans-serif; margin: 2em auto; max-width: 960px; color: #222; }}\n\
         table {{ border-collapse: collapse; margin: 1em 0; }}\n\
         td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}\n\
         td:first-child, th:first-child {{ text-align: left; }}\n</style>\n</head>\n<body>\n\
         <h1>Sluice simulation: usage against a budget</h1>\n\
         <p>{} callers at once, each call using {} to {} units (declaring {}), against a budget \
         of {} per {:?}, on a simulated clock with the real fixed-window algorithm. A call \
         lasts {:?} to {:?}; a refused caller tries again {:?} later; no call starts after \
         {:?}.</p>\n{table}<figure>\n{svg}\n</figure>\n</body>\n</html>\n",
        setup.callers,
        setup.min_use,
        setup.max_use,
        setup.max_use,
        setup.budget,
        setup.window,
        setup.min_call,
        setup.max_call,
        setup.retry,
        setup.duration,
    ))
}

fn markdown_to_html(runs: &[UsageRun]) -> String {
    let mut out = String::from(
        "<table>\n<tr><th>flow</th><th>calls admitted</th><th>calls refused</th>\
         <th>units used</th><th>beyond the budget</th><th>refunded / expected</th></tr>\n",
    );
    for r in runs {
        let share = r
            .refunded_share
            .map_or(String::new(), |s| format!("{s:.4}"));
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            r.flow.name(),
            r.admitted,
            r.refused,
            r.used,
            r.beyond_budget,
            share
        );
    }
    out.push_str("</table>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_then_report_overspends_and_reserve_then_settle_does_not() {
        let setup = UsageSetup::default();
        let [report, reserve] = simulate_usage(&setup).unwrap();
        // Every caller in flight passes its check before any report lands.
        assert!(report.admitted >= u64::from(setup.callers));
        assert!(report.beyond_budget > 100_000, "{report:?}");
        assert_eq!(reserve.beyond_budget, 0);
        // It spends most of the budget: refunds let other callers in.
        assert!(reserve.used > setup.budget / 2, "{}", reserve.used);
        assert_eq!(reserve.refunded_share, Some(1.0));
        // The series ends at the total, and never goes down.
        for r in [&report, &reserve] {
            assert_eq!(r.series.last().unwrap().1, r.used);
            assert!(
                r.series
                    .windows(2)
                    .all(|w| w[0].1 <= w[1].1 && w[0].0 <= w[1].0)
            );
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_runs() {
        let setup = UsageSetup {
            callers: 50,
            ..UsageSetup::default()
        };
        assert_eq!(
            simulate_usage(&setup).unwrap(),
            simulate_usage(&setup).unwrap()
        );
    }

    #[test]
    fn the_page_holds_the_table_and_the_plot_with_the_budget_line() {
        let setup = UsageSetup {
            callers: 100,
            budget: 10_000,
            ..UsageSetup::default()
        };
        let runs = simulate_usage(&setup).unwrap();
        let page = html(&setup, &runs).unwrap();
        assert!(page.contains("<svg"), "an inline plot");
        assert!(page.contains("check-then-report (Envoy)"));
        assert!(page.contains("reserve-then-settle (Sluice)"));
        assert!(
            page.contains("<td>0</td><td>1.0000</td>"),
            "nothing beyond with reserves"
        );
        let table = markdown(&setup, &runs);
        assert!(table.contains("| reserve-then-settle (Sluice) |"));
    }
}
