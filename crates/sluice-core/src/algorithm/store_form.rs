//! A policy as a store outside the process sees it: the numbers its scripts decide on, and the
//! numbers it must hold exactly. Each algorithm's module says which they are for its policies,
//! so that a store encodes and bounds any policy without naming an algorithm.

use std::time::Duration;

use crate::policy::Rate;

/// The four parameters a store's script decides a policy on (the Redis scripts' `p1..p4`), in
/// the order of the algorithm's Lua; `None` where the algorithm takes fewer.
pub type StoreParams = [Option<u64>; 4];

/// One number of a policy that a store computing in limited precision (Redis's Lua, in doubles)
/// must hold exactly, named for its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Magnitude {
    /// A count, such as a limit or a capacity.
    Count(&'static str, u64),
    /// A length of time, such as a window or an interval.
    Length(&'static str, Duration),
    /// The length of a window that starts on whole microseconds (of the clock, or of a key's
    /// first request): its every time is then a multiple of the clock's step when the length is
    /// whole microseconds, which lets a store hold longer ones.
    LongWindow(Duration),
    /// The longest backlog: `count` intervals of `interval` ahead of now.
    Backlog(&'static str, u64, Duration),
    /// A refill rate, held in its lowest terms.
    Rate(Rate),
}
