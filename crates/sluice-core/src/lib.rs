//! The core of Sluice: rate-limiting algorithms as pure functions of time, the [`Store`]
//! contract every backend implements, and [`MemoryStore`], the in-process backend.
//!
//! A request becomes a list of [`Check`]s (a counter key, a [`Policy`] and a cost), and a store
//! answers them with one [`Decision`] each, atomically: either every check admits the request
//! and all of them consume, or none does. A request turned away by a per-second limit does not
//! burn its daily quota.
//!
//! ```
//! use std::time::Duration;
//! use sluice_core::{Alignment, Check, FakeClock, FixedWindow, MemoryStore, Policy, Rate, Store,
//!                   Timestamp, TokenBucket};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let clock = FakeClock::at(Timestamp::from_secs(1_700_000_000));
//! let store = MemoryStore::builder().clock(clock.clone()).build();
//!
//! // 10 per second in bursts, and 12 per day.
//! let burst = Policy::from(TokenBucket::new(10, Rate::per_second(10)).unwrap());
//! let daily = Policy::from(
//!     FixedWindow::new(12, Duration::from_secs(86_400), Alignment::Clock { utc_offset_secs: 0 })
//!         .unwrap(),
//! );
//! let checks = [Check::new("user:7:burst", &burst, 1), Check::new("user:7:day", &daily, 1)];
//!
//! let admitted = {
//!     let mut n = 0;
//!     for _ in 0..20 {
//!         let decisions = store.check(&checks).await.unwrap();
//!         if decisions.iter().all(|d| d.allowed) { n += 1 }
//!     }
//!     n
//! };
//! assert_eq!(admitted, 10); // the burst limit stops the rest...
//! clock.advance(Duration::from_secs(1));
//! let decisions = store.check(&checks).await.unwrap();
//! assert_eq!(decisions[1].remaining, 1); // ...and they did not count against the day.
//! # });
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod algorithm;
mod arith;
mod breaker_state;
mod clock;
mod decision;
pub mod duration;
mod fallback;
mod memory;
mod policy;
mod reservation;
mod store;
#[cfg(feature = "testing")]
pub mod testing;

// Every algorithm's policy and state type, and the algorithm table's types.
pub use algorithm::*;
pub use breaker_state::BreakerState;
pub use clock::{Clock, FakeClock, SystemClock, Timestamp};
pub use decision::Decision;
pub use duration::{parse_duration, parse_duration_or_error};
pub use fallback::{OnStoreError, UnknownOnStoreError, decide_without_store};
pub use memory::{DEFAULT_MAX_KEYS, MemoryStore, MemoryStoreBuilder, unconsumed};
pub use policy::{Algorithm, Policy, PolicyError, Rate, UnknownAlgorithm};
pub use reservation::{MalformedReservationId, ReservationId};
pub use store::{
    Adjustment, BoxFuture, Check, DynStore, Lease, Refund, Settlement, SharedOverrides, Store,
    StoreError, StoreResult, UnsupportedPolicy,
};
