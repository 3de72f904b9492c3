//! The bottom layer of Sluice's test support: what any test needs, whichever crate it is in.
//! It depends on nothing of Sluice's, so `sluice-core`, `sluice-rules`, `sluice-redis` and
//! `sluice-hybrid` can use it as well as the crates above them.
//!
//! - [`free_port`] and [`free_addr`]: loopback ports for processes that bind them themselves,
//!   below the kernel's range for outgoing connections ([`ports`]);
//! - [`Spawned`]: a child process killed by PID when dropped, stopped with SIGTERM by
//!   [`Spawned::terminate`], and [`spawn_listening`] to wait until one listens ([`process`]);
//! - [`wait_until`] and [`eventually`]: polling until something holds, with a deadline and a
//!   message naming what never came ([`wait`]);
//! - [`ServeProcess`]: `sluice serve` as a real process, on free addresses, waited for until it
//!   listens ([`serve_process`]);
//! - [`rules_file`]: rules written to a file in a temporary directory ([`temp_rules`]);
//! - [`window`]: the answers of counters whose windows are aligned to the real clock.
//!
//! What needs the engine (limiters on fake clocks, a counting upstream, TLS certificates) is one
//! layer up, in `sluice-testing`; real `redis-server`s are in `sluice-redis`'s `testing` feature,
//! which builds on this crate. Dev-only: nothing published depends on it.
//!
//! ```
//! use std::process::Command;
//! use sluice_test_support::{Spawned, free_addr, listening, wait_until};
//!
//! // A port nothing listens on, and a process that is stopped as an orchestrator would.
//! let addr = free_addr();
//! assert!(!listening(&addr));
//! let mut sleeper = Spawned::spawn(Command::new("sleep").arg("60"));
//! let status = sleeper.terminate();
//! assert!(!status.success(), "ended by the signal");
//!
//! // A wait returns what the attempt that succeeded gave.
//! let mut tries = 0;
//! let third = wait_until("the third try", || {
//!     tries += 1;
//!     (tries == 3).then_some(tries)
//! });
//! assert_eq!(third, 3);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod ports;
pub mod process;
pub mod serve_process;
pub mod temp_rules;
pub mod wait;
pub mod window;

/// Held by this crate's own tests that spawn a process, and by the one that binds again the ports
/// it was handed: a child forked between a port's probe and that bind holds a copy of the probe's
/// socket until it execs, so the bind can find the port taken. The two must not overlap.
#[cfg(test)]
fn spawning() -> std::sync::MutexGuard<'static, ()> {
    static SPAWNING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SPAWNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub use ports::{free_addr, free_port, listening};
pub use process::{Spawned, spawn_captured_listening, spawn_command_listening, spawn_listening};
pub use serve_process::{Listener, ServeBuilder, ServeProcess};
pub use temp_rules::rules_file;
pub use wait::{PATIENCE, eventually, eventually_within, wait_until, wait_within};
