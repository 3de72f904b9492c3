//! The simulator: Sluice's real algorithms, in the memory store the service uses, run on a fake
//! clock against a traffic trace, so that an operator can see what a rule would do to their
//! traffic before deploying it.
//!
//! - [`trace`]: requests from a file (`SECONDS[,KEY[,COST]]`) or a generated [`Pattern`].
//! - [`run`]: one [`Lane`] per algorithm or rule; [`simulate`] decides every request in each.
//! - [`report`]: a self-contained HTML page with one SVG plot per lane, and a CSV of decisions.
//! - [`counter_error`]: how often the sliding counter decides differently from the exact
//!   sliding log on the same history.
//! - [`usage`]: many callers with random usage against one budget, check-then-report against
//!   reserve-then-settle, plotted.
//!
//! ```
//! use std::time::Duration;
//! use sluice_sim::{Pattern, Shape, compare_lanes, generate, simulate};
//!
//! let minute = Duration::from_secs(60);
//! let trace = generate(Pattern::Boundary, &Shape::around(5, minute));
//! let runs = simulate(&trace, &compare_lanes(5, minute).unwrap());
//! let fixed = runs.iter().find(|r| r.lane.name == "fixed_window").unwrap();
//! assert_eq!(fixed.peak_within(minute), 10); // twice the limit within one minute
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod counter_error;
pub mod report;
pub mod rng;
pub mod run;
pub mod trace;
pub mod usage;

pub use run::{Lane, LaneRun, Outcome, compare_lanes, rule_lanes, simulate};
pub use trace::{Arrival, Pattern, Shape, Trace, TraceError, generate};
