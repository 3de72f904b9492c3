//! The seven algorithms, each a pure function of `(state, now, policy, cost)`, and the table
//! that describes them to the rest of Sluice (`table.rs`).
//!
//! None of them reads a clock, allocates on the common path, or panics on any input: a clock
//! that steps backwards is treated as no time passing, and arithmetic saturates.

mod bucketed_window;
mod divisor;
mod fixed_window;
mod gcra;
mod leaky_queue;
mod sliding_counter;
mod sliding_log;
mod store_form;
mod table;
mod token_bucket;

pub use bucketed_window::{BucketedWindow, BucketedWindowState};
pub use fixed_window::{Alignment, FixedWindow, FixedWindowState};
pub use gcra::Gcra;
pub use leaky_queue::LeakyQueue;
pub use sliding_counter::{SlidingCounter, SlidingCounterState};
pub use sliding_log::{SlidingLog, SlidingLogState};
pub use store_form::{Magnitude, StoreParams};
pub use table::{
    ALGORITHMS, AlgorithmSpec, Costs, DEFAULT_SUB_WINDOWS, Param, PolicyParams, Stores, Support,
};
pub use token_bucket::{TokenBucket, TokenBucketState};
