//! What a store built on this one (the hybrid store's sync) calls Redis with: its own scripts,
//! one call per Cluster slot (one pipeline per master), and a delete, each through this store's
//! connection, timeout and circuit breaker (the master's, on a Cluster), so that Redis's health
//! counts once whichever store asks.

use futures_util::future::join_all;
use redis::Value;
use sluice_core::{StoreError, StoreResult};

use crate::RedisStore;
use crate::scripts::Script;

impl RedisStore {
    /// Runs `script` once for each call, every call sent at once (pipelined over the multiplexed
    /// connections), and returns their replies in order, or the first error. Each call is atomic;
    /// its keys must share a Cluster slot (see [`crate::slot`]): a caller groups them first.
    ///
    /// Redis runs the calls one after another, so the store's timeout is for each of them: the
    /// whole may take it as many times as there are calls. One breaker permit covers them all;
    /// on a Cluster, one permit of each master's breaker, and the calls of each master go as one
    /// pipeline, the masters in parallel. If any of the masters' breakers is open, nothing is
    /// sent.
    pub async fn eval_each<A: AsRef<[u8]> + Sync>(
        &self,
        script: &'static Script,
        calls: &[(&[String], &[A])],
    ) -> StoreResult<Vec<Value>> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let conn = self.connection();
        let script = self.script(script);
        let limit = self
            .call_timeout()
            .saturating_mul(u32::try_from(calls.len()).unwrap_or(u32::MAX));
        if let Some(masters) = conn.masters() {
            return self
                .eval_by_master(masters, script, calls, limit)
                .await
                .into_iter()
                .collect();
        }
        self.guarded_by(limit, |deadline| async move {
            let replies =
                join_all(calls.iter().map(|(k, a)| conn.eval(script, k, a, deadline))).await;
            replies.into_iter().collect::<Result<Vec<Value>, _>>()
        })
        .await
    }

    /// Deletes the Redis key `key` (a key as [`RedisStore::key_of`] or
    /// [`RedisStore::key_of_with`] names it). Returns whether it existed.
    pub async fn delete(&self, key: &str) -> StoreResult<bool> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(key);
        let map = self.connection().masters().map(|m| m.map());
        let master = map
            .as_ref()
            .and_then(|m| m.master_of(crate::slot(key.as_bytes())));
        match self
            .guarded_on(master, self.connection().send(&cmd))
            .await?
        {
            Value::Int(n) => Ok(n > 0),
            other => Err(StoreError::Rejected(format!(
                "redis answered DEL with {other:?}"
            ))),
        }
    }
}
