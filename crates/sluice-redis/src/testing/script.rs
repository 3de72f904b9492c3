//! The crate's own script arguments and replies, for the check script's differential test
//! (`tests/scripts.rs`), which runs the script on a frozen clock and compares it with the core.

use sluice_core::{Decision, Policy, StoreError, Timestamp};

use crate::scripts;
use crate::scripts::{args, reply};

/// The check script, exactly as the store sends it to Redis.
pub fn check_script() -> &'static str {
    &scripts::CHECK.body
}

/// Appends the script arguments of one check to `args`, exactly as the store does: algorithm
/// code, cost, four parameters and the refund `token` (empty for a check). `now` is the
/// application's clock, used only to pick a reference window start.
pub fn push_check(
    args: &mut Vec<String>,
    policy: &Policy,
    cost: u64,
    now: Timestamp,
    token: &str,
) -> Result<(), StoreError> {
    let mut pushed = Vec::new();
    args::push_check(&mut pushed, policy, cost, now, token)?;
    args.extend(
        pushed
            .iter()
            .map(|a| String::from_utf8_lossy(a.as_ref()).into_owned()),
    );
    Ok(())
}

/// Decodes the check script's reply for checks with these `limits`, in order, as the store
/// does: each check's decision, and its refund token (empty when nothing was consumed).
pub fn decode_replies(
    value: redis::Value,
    limits: impl ExactSizeIterator<Item = u64>,
) -> Result<Vec<(Decision, String)>, StoreError> {
    let replies = reply::decode_replies(value, limits)?;
    Ok(replies.into_iter().map(|r| (r.decision, r.token)).collect())
}
