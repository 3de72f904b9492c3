//! The registry of live instances under a prefix: each records itself as alive, and learns how
//! many are. The hybrid store splits what a limit has left between two syncs among them.

use std::time::Duration;

use redis::Value;
use sluice_core::{StoreError, StoreResult};

use crate::RedisStore;
use crate::scripts;

impl RedisStore {
    /// Records the instance `id` as alive for `ttl` and returns how many instances under this
    /// prefix are: each takes that share of what a limit has left between two syncs.
    pub async fn heartbeat(&self, id: &str, ttl: Duration) -> StoreResult<u64> {
        let key = vec![self.key_of("hybrid-instances")];
        let args = vec![
            self.time_offset().to_string(),
            id.to_owned(),
            whole_millis(ttl).to_string(),
        ];
        let conn = self.connection();
        let answer = match conn.masters() {
            Some(masters) => {
                let call = [(&key[..], args.as_slice())];
                let mut results = self
                    .eval_by_master(masters, &scripts::HEARTBEAT, &call, self.call_timeout())
                    .await;
                results.pop().unwrap_or(Ok(Value::Nil))?
            }
            None => {
                self.guarded_by(self.call_timeout(), |deadline| {
                    conn.eval(&scripts::HEARTBEAT, &key, &args, deadline)
                })
                .await?
            }
        };
        match answer {
            Value::Int(n) => Ok(u64::try_from(n).unwrap_or(1).max(1)),
            other => Err(StoreError::Rejected(format!(
                "the heartbeat script answered {other:?}"
            ))),
        }
    }
}

/// `d` in whole milliseconds, at least 1: a time to live as the scripts take it.
fn whole_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
