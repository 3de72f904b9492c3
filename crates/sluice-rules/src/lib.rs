//! Sluice's rules: which requests are limited, by how much, with which algorithm, and what a
//! limited request gets.
//!
//! Rule files are YAML in a superset of envoyproxy/ratelimit's format, so an Envoy rule file
//! loads unchanged and means the same thing. Sluice adds the algorithm, any window length,
//! several limits per descriptor, an action, and what to do when the store fails. See
//! `docs/rules.md` for the format.
//!
//! - [`RuleSet`] loads files and directories. Every error names `file:line:col` and says what to
//!   do, and all errors of a load are reported together.
//! - [`RuleSet::checks`] turns a request's descriptors into [`MatchedCheck`]s: a counter key, a
//!   cost and the shared [`Rule`] (the limit: its policy, mode and action), ready for
//!   [`sluice_core::Store::check`]. The rule goes on to the decision's result unchanged.
//! - [`Reloader`] keeps a rule set current as its files change, swapping it atomically and
//!   keeping the old one when the new files are invalid, or hold a rule the store cannot
//!   ([`RuleSet::check_supported`]).
//!
//! ```
//! use sluice_rules::RuleSet;
//!
//! let rules = RuleSet::parse("rules.yaml", r#"
//! domain: api
//! descriptors:
//!   - key: user
//!     limits:
//!       - algorithm: gcra
//!         requests_per_unit: 20
//!         unit: second
//!       - requests_per_unit: 10000
//!         window: 1d
//! "#).unwrap();
//!
//! let matched = rules.checks("api", &[[("user", "alice")]], 1);
//! assert_eq!(matched.checks.len(), 2);
//! assert!(matched.checks[0].key.starts_with("{api|user=alice}:"));
//!
//! let err = RuleSet::parse("bad.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").unwrap_err();
//! assert!(err.to_string().starts_with("bad.yaml:4:24: unknown unit `fortnight`"));
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod decode;
mod error;
mod gateway;
mod key;
mod lookup;
mod matcher;
mod model;
mod reload;
mod route_keys;
mod ruleset;
mod suggest;
mod yaml;

pub use decode::decode_limit;
pub use error::{ConfigError, ErrorKind, LoadError, Location};
pub use gateway::{
    Cidr, DEFAULT_MAX_BODY, EntrySpec, Gateway, HostMatch, JsonPath, JsonStep, PathPattern,
    ReserveFrom, Route, RouteHeaders, RouteUsage, ValueSource, strip_port,
};
pub use key::{MAX_IDENTITY_LEN, MAX_KEY_LEN};
pub use matcher::{DescriptorEntries, MatchedCheck, Matches, Rule};
pub use model::{
    Action, DescriptorConfig, DomainConfig, LimitConfig, MetaValue, Metadata, Mode, OnStoreError,
    Unit, ValueMatch,
};
pub use reload::{ReloadEvent, ReloadStats, Reloader, Watcher};
pub use route_keys::UnmatchedRouteKey;
pub use ruleset::{LoadOptions, RuleSet};
