//! Script calls on a Cluster, grouped by master: each master's calls go as one pipeline on its
//! own connection, every master at once, each through its own circuit breaker (see
//! `masters.rs`). A request of five descriptors on three masters costs three pipelines sent
//! together, one round trip in all, where it cost a call per slot.
//!
//! Each call is still its own atomic script on its own slot; only the trip is shared, so the
//! guarantees across slots are those of `docs/redis-store.md` ("Atomicity across Cluster
//! slots"). The calls of one request are admitted by every breaker they need before anything is
//! sent: when one master's breaker refuses, the request fails at once and the other masters
//! consume nothing (before, the healthy slots reserved and were refunded).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, join_all};
use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};
use sluice_core::{StoreError, StoreResult};
use tokio::time::Instant;

use super::RedisStore;
use crate::breaker::Breaker;
use crate::connection::{eval_sha_cmd, is_no_script, is_transient, with_body};
use crate::keys::slot;
use crate::masters::{Master, Masters};
use crate::scripts::Script;

impl RedisStore {
    /// Runs `script` once for each call (each call's keys in one slot) on the Cluster of
    /// `masters`, and returns each call's result in order: one pipeline per master, the masters
    /// in parallel, every call answered by `limit` from now.
    ///
    /// Each master's breaker records how its own pipeline went. A call whose slot has no known
    /// master goes alone through the `redis` crate's Cluster connection, under the store's own
    /// breaker; so does a call its master redirected (`MOVED`, `ASK`, `READONLY`: it did not
    /// run), which also has the map read again.
    ///
    /// The future is boxed, its type erased: the state machines of the joined pipelines, nested
    /// in the callers', are too deep for the compiler to prove them `Send` otherwise.
    pub(crate) fn eval_by_master<'a, A: AsRef<[u8]> + Sync>(
        &'a self,
        masters: &'a Arc<Masters>,
        script: &'static Script,
        calls: &'a [(&'a [String], &'a [A])],
        limit: Duration,
    ) -> BoxFuture<'a, Vec<StoreResult<Value>>> {
        Box::pin(self.eval_grouped(masters, script, calls, limit))
    }

    async fn eval_grouped<A: AsRef<[u8]> + Sync>(
        &self,
        masters: &Arc<Masters>,
        script: &'static Script,
        calls: &[(&[String], &[A])],
        limit: Duration,
    ) -> Vec<StoreResult<Value>> {
        let map = masters.map();
        // Call indices by master, in order of first appearance; `None` gathers the calls whose
        // slot has no known master.
        let mut groups: Vec<(Option<&Arc<Master>>, Vec<usize>)> = Vec::new();
        for (i, (keys, _)) in calls.iter().enumerate() {
            let master = keys.first().and_then(|k| map.master_of(slot(k.as_bytes())));
            match groups.iter_mut().find(|(m, _)| same_master(*m, master)) {
                Some((_, members)) => members.push(i),
                None => groups.push((master, vec![i])),
            }
        }
        let mut permits = Vec::with_capacity(groups.len());
        for (master, _) in &groups {
            match self.breaker_of(*master).admit() {
                Some(permit) => permits.push(permit),
                None => {
                    for ((m, _), permit) in groups.iter().zip(permits) {
                        self.breaker_of(*m).release(permit);
                    }
                    // A master replaced by its replica stays refused until the map names the
                    // replica: read it again.
                    masters.refresh_soon();
                    let refusal = self.breaker_refusal_of(*master);
                    return calls.iter().map(|_| Err(refusal.clone())).collect();
                }
            }
        }
        let deadline = Instant::now() + limit;
        let sent = join_all(groups.iter().map(|(master, members)| {
            self.send_group(masters, *master, script, calls, members, deadline)
        }))
        .await;
        let mut results: Vec<Option<StoreResult<Value>>> =
            std::iter::repeat_with(|| None).take(calls.len()).collect();
        let mut stale = false;
        for (((master, members), permit), replies) in groups.iter().zip(permits).zip(sent) {
            let breaker = self.breaker_of(*master);
            if replies
                .iter()
                .any(|r| matches!(r, Err(e) if is_transient(e)))
            {
                breaker.failure(permit);
                stale = true;
            } else {
                breaker.success(permit);
            }
            for (&i, reply) in members.iter().zip(replies) {
                results[i] = Some(reply.map_err(|e| self.master_error(&e, limit, *master)));
            }
        }
        if stale {
            masters.refresh_soon();
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(StoreError::Rejected(
                        "a script call was left unanswered".to_owned(),
                    ))
                })
            })
            .collect()
    }

    /// Sends the calls `members` of `calls` to `master` as one pipeline (through its batch
    /// task over plain TCP, the `redis` crate's connection over TLS), and then through the
    /// Cluster connection those that were redirected.
    async fn send_group<A: AsRef<[u8]> + Sync>(
        &self,
        masters: &Arc<Masters>,
        master: Option<&Arc<Master>>,
        script: &'static Script,
        calls: &[(&[String], &[A])],
        members: &[usize],
        deadline: Instant,
    ) -> Vec<RedisResult<Value>> {
        let conn = &self.inner.conn;
        let Some(master) = master else {
            return join_all(members.iter().map(|&i| {
                let (keys, args) = calls[i];
                conn.eval(script, keys, args, deadline)
            }))
            .await;
        };
        let mut results = match masters.batches(master) {
            // Queued together, before the batch task runs: one pipeline. A call whose script
            // the master does not know is sent again by the task itself.
            Some(batches) => {
                master.count_round_trip();
                join_all(members.iter().map(|&i| {
                    let (keys, args) = calls[i];
                    batches.eval(script, keys, args, deadline)
                }))
                .await
            }
            None => {
                self.send_through_crate(masters, master, script, calls, members, deadline)
                    .await
            }
        };
        let redirected: Vec<usize> = (0..results.len())
            .filter(|&n| matches!(&results[n], Err(e) if is_redirect(e)))
            .collect();
        if !redirected.is_empty() {
            masters.refresh_soon();
            let retried = join_all(redirected.iter().map(|&n| {
                let (keys, args) = calls[members[n]];
                conn.eval(script, keys, args, deadline)
            }))
            .await;
            for (n, result) in redirected.into_iter().zip(retried) {
                results[n] = result;
            }
        }
        results
    }

    /// Sends the calls `members` of `calls` to `master` as one pipeline on the `redis` crate's
    /// connection (TLS), then sends again with the script's body those that found no script
    /// (`NOSCRIPT`).
    async fn send_through_crate<A: AsRef<[u8]> + Sync>(
        &self,
        masters: &Arc<Masters>,
        master: &Master,
        script: &'static Script,
        calls: &[(&[String], &[A])],
        members: &[usize],
        deadline: Instant,
    ) -> Vec<RedisResult<Value>> {
        let cmds: Vec<redis::Cmd> = members
            .iter()
            .map(|&i| eval_sha_cmd(script, calls[i].0, calls[i].1))
            .collect();
        let mut results = masters.send(master, &cmds, deadline).await;
        let unknown: Vec<usize> = (0..results.len())
            .filter(|&n| matches!(&results[n], Err(e) if is_no_script(e)))
            .collect();
        if !unknown.is_empty() {
            let bodies: Vec<redis::Cmd> = unknown
                .iter()
                .map(|&n| with_body(&cmds[n], script))
                .collect();
            let retried = masters.send(master, &bodies, deadline).await;
            for (n, result) in unknown.into_iter().zip(retried) {
                results[n] = result;
            }
        }
        results
    }

    /// The breaker that guards calls to `master`: its own, or the store's for calls that go
    /// through the Cluster connection.
    pub(crate) fn breaker_of<'a>(&'a self, master: Option<&'a Arc<Master>>) -> &'a Breaker {
        master.map_or(&self.inner.breaker, |m| &m.breaker)
    }

    pub(crate) fn breaker_refusal_of(&self, master: Option<&Arc<Master>>) -> StoreError {
        match master {
            None => self.breaker_refusal(),
            Some(m) => StoreError::Unavailable(format!(
                "the circuit breaker of redis master {} is open after repeated failures; a probe \
                 call will try again within {:?}",
                m.address, self.inner.cool_down
            )),
        }
    }

    /// The store's error for a call to `master` that failed with `e`.
    fn master_error(
        &self,
        e: &RedisError,
        limit: Duration,
        master: Option<&Arc<Master>>,
    ) -> StoreError {
        if e.is_timeout() {
            return StoreError::Timeout(limit);
        }
        let Some(m) = master else {
            return self.store_error(e);
        };
        let message = format!("redis master {} of {}: {e}", m.address, self.inner.target);
        if is_transient(e) {
            StoreError::Unavailable(message)
        } else {
            StoreError::Rejected(message)
        }
    }
}

/// Whether a call was refused because its slot is served elsewhere (or its master was demoted):
/// it did not run, and may be sent again where the Cluster says.
fn is_redirect(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved | ServerErrorKind::Ask | ServerErrorKind::ReadOnly
        )
    )
}

fn same_master(a: Option<&Arc<Master>>, b: Option<&Arc<Master>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}
