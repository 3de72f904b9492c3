//! Runtime overrides shared by every instance on one Redis: [`Store::put_override`],
//! [`Store::remove_override`], [`Store::override_version`] and [`Store::overrides`]
//! (`sluice_core::Store`).
//!
//! Two keys under one hash tag, so a Cluster keeps both on one slot and one script changes
//! them together: a hash of every override (its id to its body, both opaque here), and a
//! version counter. A change is one script ([`PUT`]): `HSET` or `HDEL`, then `INCR` of the
//! version, atomically, so concurrent changes from any instances are totally ordered and the
//! version names the state after each. Instances poll the version (a `GET`), and read the hash
//! and the version together ([`SNAPSHOT`]) only when it moved, so every instance ends on the
//! state of the highest version. `docs/overrides.md` describes the guarantees.

use std::sync::LazyLock;

use redis::Value;
use sluice_core::{SharedOverrides, StoreError, StoreResult};

use super::RedisStore;
use crate::scripts::Script;

/// The identity both keys are named from; its braces make it their hash tag.
const TAG: &str = "{sluice-overrides}";

/// Changes one override and raises the version, atomically.
///
/// - `KEYS[1]`: the hash of overrides, id to body.
/// - `KEYS[2]`: the version counter.
/// - `ARGV[1]`: `put` or `remove`.
/// - `ARGV[2]`: the override's id.
/// - `ARGV[3]`: its body, for `put`.
///
/// Returns the version after the change.
static PUT: LazyLock<Script> = LazyLock::new(|| {
    Script::assemble(
        "if ARGV[1] == 'put' then\n\
         \x20 redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])\n\
         else\n\
         \x20 redis.call('HDEL', KEYS[1], ARGV[2])\n\
         end\n\
         return redis.call('INCR', KEYS[2])\n",
    )
});

/// Reads every override and the version they are at, in one atomic step.
///
/// - `KEYS[1]`: the hash of overrides.
/// - `KEYS[2]`: the version counter.
///
/// Returns `{version, {id, body, id, body, …}}`, the version as a string (`0` when unset).
static SNAPSHOT: LazyLock<Script> = LazyLock::new(|| {
    Script::assemble(
        "local version = redis.call('GET', KEYS[2]) or '0'\n\
         return {version, redis.call('HGETALL', KEYS[1])}\n",
    )
});

impl RedisStore {
    /// The Redis keys of the overrides' hash and of their version.
    fn override_keys(&self) -> [String; 2] {
        [
            self.key_of_with(TAG, ":entries"),
            self.key_of_with(TAG, ":version"),
        ]
    }

    /// [`Store::put_override`](sluice_core::Store::put_override) and
    /// [`Store::remove_override`](sluice_core::Store::remove_override): `body` is `None` to
    /// remove.
    pub(super) async fn change_override(&self, id: &str, body: Option<&str>) -> StoreResult<u64> {
        let keys = self.override_keys().to_vec();
        let args = vec![
            if body.is_some() { "put" } else { "remove" }.to_owned(),
            id.to_owned(),
            body.unwrap_or_default().to_owned(),
        ];
        let mut replies = self
            .eval_each(&PUT, &[(keys.as_slice(), args.as_slice())])
            .await?;
        match replies.pop() {
            Some(Value::Int(v)) => Ok(u64::try_from(v).unwrap_or(0)),
            other => Err(StoreError::Rejected(format!(
                "the override script answered {other:?}, not the new version"
            ))),
        }
    }

    /// [`Store::override_version`](sluice_core::Store::override_version): one `GET`.
    pub(super) async fn read_override_version(&self) -> StoreResult<u64> {
        let [_, version] = self.override_keys();
        let mut cmd = redis::cmd("GET");
        cmd.arg(version);
        let reply = self.guarded(self.connection().send(&cmd)).await?;
        match reply {
            Value::Nil => Ok(0),
            other => number(&other).ok_or_else(|| {
                StoreError::Rejected(format!("the overrides' version reads {other:?}"))
            }),
        }
    }

    /// [`Store::overrides`](sluice_core::Store::overrides): the hash and the version together.
    pub(super) async fn read_overrides(&self) -> StoreResult<SharedOverrides> {
        let keys = self.override_keys().to_vec();
        let no_args: [&str; 0] = [];
        let mut replies = self
            .eval_each(&SNAPSHOT, &[(keys.as_slice(), &no_args[..])])
            .await?;
        let malformed =
            |what: &Value| StoreError::Rejected(format!("the overrides read as {what:?}"));
        let reply = replies.pop().unwrap_or(Value::Nil);
        let Value::Array(mut parts) = reply else {
            return Err(malformed(&reply));
        };
        let (Some(flat), Some(version)) = (parts.pop(), parts.pop()) else {
            return Err(malformed(&Value::Array(parts)));
        };
        let version = number(&version).ok_or_else(|| malformed(&version))?;
        let Value::Array(flat) = flat else {
            return Err(malformed(&flat));
        };
        let mut entries = Vec::with_capacity(flat.len() / 2);
        let mut items = flat.into_iter();
        while let (Some(id), Some(body)) = (items.next(), items.next()) {
            match (text(&id), text(&body)) {
                (Some(id), Some(body)) => entries.push((id, body)),
                _ => return Err(malformed(&id)),
            }
        }
        Ok(SharedOverrides { version, entries })
    }
}

/// A reply's text, for a bulk or simple string.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// A reply's number, for an integer or a string holding one.
fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        other => text(other)?.parse().ok(),
    }
}
