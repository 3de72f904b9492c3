//! What a check gets when its store cannot answer.
//!
//! A limiter failure must never become a service failure, so every rule says what happens when
//! its store is down: admit (fail open, the default), refuse (fail closed), or limit in this
//! process's memory until the store is back.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::{Check, Clock, Decision, MemoryStore, Store};

/// A rule's behaviour while its store is unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnStoreError {
    /// Admit the request: a limiter outage does not become an API outage.
    #[default]
    Allow,
    /// Refuse the request, for limits that protect something that must not be overrun.
    Deny,
    /// Limit per instance, in memory, until the store answers again.
    Local,
}

impl OnStoreError {
    /// The names the configuration uses.
    pub const NAMES: [&'static str; 3] = ["allow", "deny", "local"];

    /// The configuration name.
    pub fn name(self) -> &'static str {
        match self {
            OnStoreError::Allow => "allow",
            OnStoreError::Deny => "deny",
            OnStoreError::Local => "local",
        }
    }
}

impl fmt::Display for OnStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The name given is not `allow`, `deny` or `local`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown on_store_error `{0}`; expected allow, deny or local")]
pub struct UnknownOnStoreError(pub String);

impl FromStr for OnStoreError {
    type Err = UnknownOnStoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allow" => Ok(OnStoreError::Allow),
            "deny" => Ok(OnStoreError::Deny),
            "local" => Ok(OnStoreError::Local),
            other => Err(UnknownOnStoreError(other.to_owned())),
        }
    }
}

/// Decides `checks` without their store, each by its mode in `modes` (same length and order).
///
/// `Local` checks are decided together in `local`, atomically among themselves, and consume
/// only if no `Deny` check refuses the request. A `Deny` check is refused with
/// `retry_after = deny_retry`, which callers set to when they will try the store again.
pub async fn decide_without_store<C: Clock + 'static>(
    checks: &[Check<'_>],
    modes: &[OnStoreError],
    local: &MemoryStore<C>,
    deny_retry: Duration,
) -> Vec<Decision> {
    let denies = modes.contains(&OnStoreError::Deny);
    let local_checks: Vec<Check<'_>> = checks
        .iter()
        .zip(modes)
        .filter(|(_, m)| **m == OnStoreError::Local)
        .map(|(c, _)| Check {
            cost: if denies { 0 } else { c.cost },
            ..*c
        })
        .collect();
    // A local store that is itself full admits, as `Allow` would: it is the fallback's fallback.
    let mut local_decisions = Store::check(local, &local_checks)
        .await
        .unwrap_or_default()
        .into_iter();
    checks
        .iter()
        .zip(modes)
        .map(|(c, mode)| {
            let limit = c.policy.limit();
            match mode {
                OnStoreError::Allow => Decision::allow(limit, limit, Duration::ZERO),
                OnStoreError::Deny => Decision::deny(limit, 0, deny_retry, deny_retry),
                OnStoreError::Local => local_decisions
                    .next()
                    .unwrap_or_else(|| Decision::allow(limit, limit, Duration::ZERO)),
            }
        })
        .collect()
}
