//! The Lua scripts that decide and update counters inside Redis, one call per Cluster slot.
//!
//! Each script is a `.lua` file in `lua/`, assembled once into a named static ([`CHECK`],
//! [`REFUND`], and for reservations [`RESERVE`], [`RECORD`] and [`CLAIM`]) and called by `EVALSHA`, loaded again transparently on `NOSCRIPT` (see
//! `connection.rs`). Assembly (`load.rs`) puts a prelude in front that names the algorithm codes
//! (`algorithm.rs`, from the algorithm table of `sluice-core`), replaces each `--#include <file>`
//! line with a part the scripts share: the reading of the time (`clock.lua`), exact `a · b / c`
//! (`mul_div.lua`), and the helpers that convert between the stored and the computed forms of
//! timestamps (`helpers.lua`), the check script's body, which the reserve script runs too
//! (`decide_checks.lua`), and the writing of a reservation's record (`write_reservation.lua`),
//! and puts in each algorithm's own Lua from its file in
//! `lua/algorithm/` (one per algorithm, named as in the table, listed by `build.rs`). The sliding
//! log's and the concurrency limit's files take each of their sections from the log they both
//! keep (`expiring_log.lua`), by a `--#include <file> <section>` line.
//!
//! ## Cost per call
//!
//! `EVALSHA` runs a script's whole body on every call, so every `local function` and every table
//! in it is created anew and then collected. An algorithm's file therefore holds its decision as
//! blocks of straight-line Lua on locals, which [`CHECK`] runs two ways: inline for a call of one
//! check (nearly every call), in a branch of one `if` chain on the algorithm code, with no
//! function created but the algorithm's own helpers (`mul_div` for the token bucket and the
//! sliding counter, the log's entry parser) and no table but the sliding log's state and the
//! bucketed window's counts; and wrapped as functions for calls of several checks, which thread
//! each key's state from check to check, created only for the algorithms the call uses. One
//! source, so the two paths cannot decide differently; `tests/scripts.rs` runs both against the
//! core's pure functions on a frozen clock, nanosecond for nanosecond. On Redis 7.0 each C
//! function call or string conversion in a script also costs a few hundred nanoseconds, so the
//! blocks convert numbers by arithmetic (`x + 0`), take remainders with `%`, compare the algorithm
//! code as a string, and split timestamps with `string.sub` rather than a pattern that backtracks.
//!
//! ## Numbers in Lua
//!
//! Redis runs Lua 5.1, whose only number type is a double: integers are exact up to 2⁵³. A
//! timestamp in nanoseconds since the epoch (about 1.7·10¹⁸) is not, so the scripts never hold
//! one as a number:
//!
//! - timestamps are **stored** as decimal strings of nanoseconds since the epoch, exactly what
//!   `sluice_core::Timestamp` holds;
//! - they are **computed** on as nanoseconds relative to `S`, the whole second of Redis time the
//!   call runs in. A counter's timestamps lie within a window or two of now, so these numbers are
//!   exact, and every algorithm decides exactly as the core's pure functions do;
//! - every division is done on exact integers: the remainder first, then the exact quotient
//!   `(a - r) / b`. The check script takes the remainder with Lua's `a % b`, an operator rather than
//!   a function call: it is `a - floor(a / b) · b`, exact for integers `0 ≤ a < 2⁵³` (the
//!   rounded quotient cannot cross an integer: the distance to the next one, at least `1 / b`,
//!   exceeds half an ulp of `a / b`), and for negative `a` when `b` is 10⁹ or 10⁶ (every multiple
//!   of those below 4·10¹⁸ is a double). A remainder of anything else, such as the distance from
//!   a reference window start, uses `math.fmod`, which is always exact;
//! - a product `a · b / c` that passes 2⁵³ (a refill at a high rate, a weighted count of a
//!   large sliding counter) is divided exactly in parts (`mul_div`);
//! - GCRA and the queue compare backlogs (how far their time lies after now), and compute
//!   `backlog + n·T > horizon` as `backlog > horizon - n·T`, so no sum passes 2⁵³;
//! - numbers written back to Redis go through `string.format('%d')` where they can be large,
//!   because Lua would print one as `1e+15`; concatenation only for TTLs in milliseconds.
//!
//! The Rust side keeps every parameter below 2⁵³ (see `exact.rs`): windows and periods up to
//! about 104 days (fixed windows up to about 417 days in whole microseconds, whose every number
//! is a multiple of 8 below 2⁵⁶), limits up to 9·10¹⁵, and GCRA's burst and the queue's capacity
//! times their interval (the longest backlog) below 2⁵³ ns too. Durations in replies beyond
//! 2⁵³ ns, such as the time a huge bucket takes to refill, are rounded; no decision depends on
//! them.
//!
//! ## Layout of the arguments
//!
//! The check and refund scripts take the same arguments (the reserve script adds its record):
//!
//! - `KEYS[i]`: the counter key of check `i` (`prefix:{identity}`, or `prefix:{tag}rest`; see
//!   `keys.rs`). A key may appear more than once; its later checks see what the earlier ones
//!   would leave.
//! - `ARGV[1]`: nanoseconds added to Redis `TIME`: 0 in production. A test hook, and the way to
//!   simulate an instance whose store clock is off.
//! - `ARGV[2]`: for [`CHECK`], `1` to commit when every check admits, `0` to only decide (peek).
//!   Unused by [`REFUND`].
//! - `ARGV[3 + 7(i-1)] ..= ARGV[9 + 7(i-1)]`: check `i`: algorithm code, cost, four parameters
//!   and a refund token (see `args.rs` for each algorithm's parameters).
//!
//! ## What is stored
//!
//! One key per counter. Every algorithm but the sliding log keeps a string, `"<alg> <x> [<y>
//! [<z>]]"`: the algorithm code (see `algorithm.rs`; a counter found under another algorithm
//! counts as fresh, as in the memory store) and up to three state fields; the bucketed window's
//! string holds its newest bucket's start and then one count per bucket, newest first, without
//! the trailing (oldest) empty ones. A string is read with
//! one `GET` and written with one `SET … PX`, state and TTL together. The sliding log keeps a
//! list: a header holding the total of its units, then one `"<nanos> <units>"` entry per
//! distinct arrival time, oldest first. Every write sets the key's TTL to when the counter is
//! full again, plus a second, so that idle counters vanish.
//!
//! A reservation's record is a list of its own, `prefix:reservation:{id}` (see [`RESERVE`] and
//! `store/reservations.rs`), which lives twice the reservation's ttl plus a second.

pub(crate) mod algorithm;
pub(crate) mod args;
pub(crate) mod exact;
mod load;
pub(crate) mod reply;

use std::sync::LazyLock;

pub use load::Script;

/// Decides a request's checks that fall in one slot, atomically, and commits them only if all
/// admit.
///
/// - `KEYS[i]`: the counter key of check `i`.
/// - `ARGV[1]`: the time offset in nanoseconds (0 in production).
/// - `ARGV[2]`: `1` to commit when every check admits; `0` to decide without writing (peek).
/// - `ARGV[3 + 7(i-1)]..`: check `i`: algorithm code (see [`algorithm::code`]), cost, parameters
///   `p1..p4`, unused token.
///
/// Returns one string of six fields per check, every field and check separated by a space:
/// allowed (1 or 0), remaining, `reset_after` in nanoseconds, `retry_after` in nanoseconds (-1
/// for never), delay in nanoseconds, and the refund token: the stored timestamp that identifies
/// what this check consumed (a window start or a log entry), which [`REFUND`] needs to give it
/// back, or `-` when nothing was consumed. One string rather than an array: the client parses a
/// reply value by value, and six values per check cost it more than the script's formatting.
pub(crate) static CHECK: LazyLock<Script> =
    LazyLock::new(|| Script::assemble(include_str!("lua/check.lua")));

/// Gives units back to counters of one slot, or charges them more: what [`CHECK`] consumed when
/// another slot of the same request refused it, what a settled reservation did not use or used
/// beyond what it reserved, and what `Store::refund` gives back. Each check is adjusted in
/// reverse order. A refund gives back as far as the counter still holds what was taken: a window
/// that has ended, or a log entry that has expired, has nothing left to give back; a charge takes
/// the units at now whatever the counter holds, past its limit.
///
/// - `KEYS[i]`: the counter key of check `i`.
/// - `ARGV[1]`: the time offset in nanoseconds (0 in production).
/// - `ARGV[2]`: which checks to charge: check `i` is charged when the `i`-th character is `c`,
///   and given back otherwise (so `0` gives every check back).
/// - `ARGV[3 + 7(i-1)]..`: check `i` as for [`CHECK`], its cost the units to give back or charge,
///   with the token [`CHECK`] returned for it, or an empty one for the window that holds now.
///
/// Returns the number of checks adjusted.
pub(crate) static REFUND: LazyLock<Script> =
    LazyLock::new(|| Script::assemble(include_str!("lua/refund.lua")));

/// Decides a request's checks as [`CHECK`] does and, when every check admits, commits them and
/// records the reservation under its own key, in one atomic call: a record exists exactly when
/// its checks consumed. Off a Cluster only: on one, the record's key is in a slot of its own,
/// and [`RECORD`] writes it after the checks.
///
/// - `KEYS[1..n]`: the counter keys of the checks; `KEYS[n + 1]`: the record's key.
/// - `ARGV[1]`..`ARGV[2 + 7n]`: as for [`CHECK`], committing (`ARGV[2]` is `1`).
/// - `ARGV[3 + 7n]`: the reservation's ttl in nanoseconds.
///
/// Returns [`CHECK`]'s reply, or an error when a record of the id exists already (then nothing
/// is decided or consumed). The record is a list: `open`, the time the ttl ends (absolute ns
/// of Redis time plus the offset), then eight items per check: counter key, algorithm code, cost,
/// `p1..p4` and refund token (empty for none). It lives twice the ttl, plus a second.
pub(crate) static RESERVE: LazyLock<Script> =
    LazyLock::new(|| Script::assemble(include_str!("lua/reserve.lua")));

/// Records a reservation whose checks [`CHECK`] committed, on a Cluster, as [`RESERVE`] does.
///
/// - `KEYS[1]`: the record's key.
/// - `ARGV[1]`: the time offset in nanoseconds (0 in production).
/// - `ARGV[2]`: the reservation's ttl in nanoseconds.
/// - `ARGV[3..]`: eight items per check, as the record holds them.
///
/// Returns 1, or an error when a record of the id exists already.
pub(crate) static RECORD: LazyLock<Script> =
    LazyLock::new(|| Script::assemble(include_str!("lua/record.lua")));

/// Claims a reservation for its settle: marks its record settled, atomically, so that of
/// concurrent settles from any instances only one goes on to adjust the counters.
///
/// - `KEYS[1]`: the record's key.
/// - `ARGV[1]`: the time offset in nanoseconds (0 in production).
///
/// Returns `unknown` (no record), `settled` (claimed before), `expired` (its ttl has ended;
/// nothing changes), or, having claimed it, the record's items after its header: eight per
/// check, as [`RESERVE`] wrote them.
pub(crate) static CLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::assemble(include_str!("lua/claim.lua")));

/// The registry of live instances under a prefix (the hybrid store splits what a limit has left
/// among them): records an instance as alive and returns how many are; see `lua/heartbeat.lua`
/// and `crate::heartbeat`.
pub(crate) static HEARTBEAT: LazyLock<Script> =
    LazyLock::new(|| Script::assemble(include_str!("lua/heartbeat.lua")));
