//! Runtime overrides: one descriptor's limit changed while the service runs, through the admin
//! API, without touching the rule files; `docs/overrides.md` is the user's page.
//!
//! An override names a domain, an exact descriptor (`tenant=acme`) and a limit written as a
//! rule's `rate_limit` (any algorithm, decoded by the rule decoder, with its messages). It
//! replaces the limit of the rule that descriptor matches, for that descriptor only. Precedence,
//! in the plan: a request's own Envoy `limit` override, then a runtime override, then the rules.
//!
//! Where they live: a store that shares overrides ([`sluice_core::Store::shares_overrides`], the
//! Redis stores and the hybrid store) keeps them for every instance as an opaque, versioned log;
//! each instance polls the version ([`Overrides::follow`]) and reloads them when it moves, and
//! keeps what it last knew while the store is unreachable. On any other store they are this
//! instance's alone.
//!
//! On the hot path ([`Overrides::apply`]) a request on a limiter with no overrides pays one
//! atomic load; with some, a domain lookup and a descriptor lookup in a table compiled against
//! the rule set in force (`compiled.rs`), built again when the overrides or the rules change.

mod compiled;
mod metrics;
mod record;
mod rfc3339;

pub use record::DescriptorEntry;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use serde::Serialize;
use sluice_core::{DynStore, StoreError};
use sluice_rules::{MatchedCheck, Reloader, RuleSet};
use tokio::sync::watch;

use crate::request::RequestDescriptor;
use compiled::{Compiled, compile, resolve};
use metrics::OverrideMetrics;
use record::{Record, id_of};

/// How often an instance asks a shared store whether the overrides changed: a `GET` of the
/// version, so that every instance enforces a change within a second of it.
pub const POLL_EVERY: Duration = Duration::from_millis(250);

/// The most entries an override's descriptor may have, as a request's descriptor.
const MAX_ENTRIES: usize = 32;

/// An override to set, as the admin API reads it.
#[derive(Debug, Clone)]
pub struct OverridePut {
    /// The domain whose rule it overrides.
    pub domain: String,
    /// The exact descriptor it applies to.
    pub descriptor: Vec<DescriptorEntry>,
    /// The limit, with a rule's `rate_limit` keys.
    pub rate_limit: serde_json::Value,
    /// When it stops applying, as RFC 3339; `None` for never.
    pub expires: Option<String>,
    /// Who sets it, for the log and `GET`.
    pub set_by: String,
}

/// An override as `GET /v1/overrides/{domain}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OverrideView {
    /// The exact descriptor it applies to.
    pub descriptor: Vec<DescriptorEntry>,
    /// Its limit, as set.
    pub rate_limit: serde_json::Value,
    /// When it stops applying, if ever.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// Who set it.
    pub set_by: String,
    /// When it was set.
    pub set_at: String,
    /// `applied`, `expired`, or `unmatched` (its descriptor matches no rule in force).
    pub status: &'static str,
    /// The overridden rule's label, when applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The overridden limit's place in the rule files (`file:line:col`), when applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule_location: Option<String>,
    /// The limit in force, in words, when applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// Why it applies to nothing, when unmatched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Why an override could not be set or removed.
#[derive(Debug, thiserror::Error)]
pub enum OverrideError {
    /// The request is wrong: the reason says what and what to do. Nothing was stored.
    #[error("{0}")]
    Invalid(String),
    /// No override of that descriptor is set.
    #[error("no override of that descriptor is set in domain `{0}`")]
    NotFound(String),
    /// The shared store could not take the change. Nothing changed.
    #[error("the store could not take the change, nothing changed: {0}")]
    Store(#[from] StoreError),
}

/// Where the overrides come from, and how fresh this instance's copy is: for `/readyz` and the
/// metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideSync {
    /// Whether the store shares them with other instances; when not, they are this instance's.
    pub shared: bool,
    /// How long ago this instance last read them from the shared store (`None`: never).
    pub last_sync: Option<Duration>,
    /// Why the last read failed, when it did: the instance enforces what it last knew.
    pub error: Option<String>,
    /// The shared version this instance holds.
    pub version: Option<u64>,
}

/// The overrides as this instance knows them.
#[derive(Debug, Default)]
struct State {
    /// The shared store's version they were read at (`None` before the first read, and always
    /// for a store that does not share them).
    version: Option<u64>,
    /// Every override, by id.
    records: BTreeMap<String, Record>,
    /// Raised on every change, so that a compiled table knows it is stale.
    generation: u64,
}

/// When this instance last heard from the shared store.
#[derive(Debug, Default)]
struct SyncHealth {
    last_ok: Option<Instant>,
    error: Option<String>,
}

/// The runtime overrides of one limiter.
pub struct Overrides {
    store: Arc<dyn DynStore>,
    rules: Arc<Reloader>,
    /// How many overrides are set (expired ones until they are noticed included): the hot
    /// path's one atomic load, 0 on a limiter that has none.
    active: AtomicUsize,
    /// [`State::generation`], read on the hot path without the lock.
    generation: AtomicU64,
    state: Mutex<State>,
    /// The table the hot path reads, compiled against one rule set.
    compiled: ArcSwap<Compiled>,
    /// Held while compiling, so that a reload compiles once, not once per request.
    compiling: Mutex<()>,
    health: Mutex<SyncHealth>,
    /// Held while reading the shared store, so that two reads (a poll and a change's read-back)
    /// never finish out of order: a snapshot older than the one held then means the store
    /// itself went back.
    reading: tokio::sync::Mutex<()>,
    metrics: OverrideMetrics,
}

impl std::fmt::Debug for Overrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overrides")
            .field("active", &self.active.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Overrides {
    /// The overrides of a limiter over `rules` and `store`, none yet.
    pub(crate) fn new(rules: Arc<Reloader>, store: Arc<dyn DynStore>) -> Self {
        Overrides {
            store,
            rules,
            active: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            state: Mutex::new(State::default()),
            compiled: ArcSwap::from_pointee(Compiled::default()),
            compiling: Mutex::new(()),
            health: Mutex::new(SyncHealth::default()),
            reading: tokio::sync::Mutex::new(()),
            metrics: OverrideMetrics::default(),
        }
    }

    /// Whether the store shares the overrides with every instance that uses it.
    pub fn shared(&self) -> bool {
        self.store.shares_overrides()
    }

    /// Whether any override is set, applied or not.
    pub fn any(&self) -> bool {
        !self.lock_state().records.is_empty()
    }

    /// Puts the overrides in force on `checks`, the checks `rules` made for `descriptors`.
    #[inline]
    pub(crate) fn apply(
        &self,
        rules: &Arc<RuleSet>,
        domain: &str,
        descriptors: &[RequestDescriptor],
        checks: &mut [MatchedCheck],
    ) {
        if self.active.load(Ordering::Relaxed) == 0 || checks.is_empty() {
            return;
        }
        let current = self.compiled.load();
        if current.is_for(rules, self.generation.load(Ordering::Acquire)) {
            current.apply(domain, descriptors, checks);
        } else {
            self.compiled_for(rules).apply(domain, descriptors, checks);
        }
    }

    /// The table compiled against `rules` and the overrides as they are, compiled now if the
    /// one in force is for other rules or older overrides.
    fn compiled_for(&self, rules: &Arc<RuleSet>) -> Arc<Compiled> {
        let generation = self.generation.load(Ordering::Acquire);
        let current = self.compiled.load_full();
        if current.is_for(rules, generation) {
            return current;
        }
        let _compiling = self
            .compiling
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let state = self.lock_state();
        let current = self.compiled.load_full();
        if current.is_for(rules, state.generation) {
            return current;
        }
        let before: Vec<&String> = current.unmatched.keys().collect();
        let fresh = Arc::new(compile(rules, state.generation, state.records.iter()));
        for (id, reason) in &fresh.unmatched {
            if !before.contains(&id) {
                tracing::warn!(
                    override_id = %id,
                    reason = %reason,
                    "runtime override matches no rule in force: kept, and applied again when \
                     a rule matches it"
                );
            }
        }
        self.metrics.set(&state.records, &fresh);
        self.compiled.store(Arc::clone(&fresh));
        fresh
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets an override, replacing any of the same descriptor, after checking it against the
    /// rules in force and the store: a bad one is refused with the reason and nothing is
    /// stored. Returns the override before (if any) and after. Every change is logged.
    pub async fn put(
        &self,
        put: OverridePut,
    ) -> Result<(Option<OverrideView>, OverrideView), OverrideError> {
        let invalid = |m: String| OverrideError::Invalid(m);
        if put.descriptor.is_empty() {
            return Err(invalid(
                "`descriptor` is empty; name the entries of the descriptor to override, such as \
                 [{\"key\": \"tenant\", \"value\": \"acme\"}]"
                    .into(),
            ));
        }
        if put.descriptor.len() > MAX_ENTRIES {
            return Err(invalid(format!(
                "`descriptor` has {} entries; the most is {MAX_ENTRIES}",
                put.descriptor.len()
            )));
        }
        if let Some(i) = put.descriptor.iter().position(|e| e.key.is_empty()) {
            return Err(invalid(format!("`descriptor[{i}].key` is empty")));
        }
        if !put.rate_limit.is_object() {
            return Err(invalid(
                "`rate_limit` must be an object with a rule's keys, such as {\"unit\": \
                 \"minute\", \"requests_per_unit\": 100}"
                    .into(),
            ));
        }
        if let Some(expires) = &put.expires {
            let Some(at) = rfc3339::parse(expires) else {
                return Err(invalid(format!(
                    "`expires` is `{expires}`, which is not an RFC 3339 time such as \
                     2026-12-31T00:00:00Z"
                )));
            };
            if at <= SystemTime::now() {
                return Err(invalid(format!(
                    "`expires` is `{expires}`, which is in the past; leave it out for an \
                     override that does not expire"
                )));
            }
        }
        let record = Record {
            domain: put.domain,
            descriptor: put.descriptor,
            rate_limit: put.rate_limit,
            expires: put.expires,
            set_by: put.set_by,
            set_at: rfc3339::format(SystemTime::now()),
        };
        let rules = self.rules.rules();
        let applied = resolve(&rules, &record).map_err(invalid)?;
        self.store
            .supports(&applied.rule.policy)
            .map_err(|e| invalid(format!("rate_limit: {e}")))?;
        let id = record.id();
        let body = serde_json::to_string(&record).unwrap_or_default();
        let before = self.view_of(&id);
        if self.shared() {
            self.store.put_override(&id, &body).await?;
        }
        let shared = self.shared();
        self.change(|state| {
            state.records.insert(id.clone(), record);
            // A read of the store may have landed between the write above and this change,
            // holding a later version without this record: forget the version, so that the
            // read below (or the next poll) takes the store's whole view, whoever won.
            if shared {
                state.version = None;
            }
        });
        if shared {
            // Read back at once, so that this instance holds the version its change made and
            // does not wait for the next poll; on failure the change already holds here.
            let _ = self.sync_now().await;
        }
        let after = self.view_of(&id).ok_or_else(|| {
            OverrideError::Invalid("the override was replaced while it was set".into())
        })?;
        tracing::info!(
            override_id = %id,
            before = %view_text(before.as_ref()),
            after = %view_text(Some(&after)),
            "runtime override set"
        );
        Ok((before, after))
    }

    /// Removes the override of `descriptor` in `domain`. Returns it as it was.
    pub async fn remove(
        &self,
        domain: &str,
        descriptor: &[DescriptorEntry],
    ) -> Result<OverrideView, OverrideError> {
        let id = id_of(domain, descriptor);
        let Some(before) = self.view_of(&id) else {
            return Err(OverrideError::NotFound(domain.to_owned()));
        };
        if self.shared() {
            self.store.remove_override(&id).await?;
        }
        let shared = self.shared();
        self.change(|state| {
            state.records.remove(&id);
            // As in `put`: the store's view, read next, is the one that holds.
            if shared {
                state.version = None;
            }
        });
        if shared {
            let _ = self.sync_now().await;
        }
        tracing::info!(
            override_id = %id,
            before = %view_text(Some(&before)),
            after = "none",
            "runtime override removed"
        );
        Ok(before)
    }

    /// Every override of `domain`, as `GET` shows them, in id order.
    pub fn list(&self, domain: &str) -> Vec<OverrideView> {
        let ids: Vec<String> = {
            let state = self.lock_state();
            state
                .records
                .iter()
                .filter(|(_, r)| r.domain == domain)
                .map(|(id, _)| id.clone())
                .collect()
        };
        ids.iter().filter_map(|id| self.view_of(id)).collect()
    }

    /// The overrides applied to the limit at `location` (`file:line:col`) of `domain`, for
    /// `GET /v1/rules` and the dashboard.
    pub fn applied_to(&self, domain: &str, location: &str) -> Vec<OverrideView> {
        self.list(domain)
            .into_iter()
            .filter(|v| v.status == "applied" && v.rule_location.as_deref() == Some(location))
            .collect()
    }

    /// The override `id` as `GET` shows it.
    fn view_of(&self, id: &str) -> Option<OverrideView> {
        let rules = self.rules.rules();
        let compiled = self.compiled_for(&rules);
        let state = self.lock_state();
        let record = state.records.get(id)?;
        let applied = compiled.applied(&record.domain, &record.entries());
        let expired = record.expiry().is_some_and(|e| e <= SystemTime::now());
        let status = match (applied, expired) {
            (_, true) => "expired",
            (Some(_), false) => "applied",
            (None, false) => "unmatched",
        };
        Some(OverrideView {
            descriptor: record.descriptor.clone(),
            rate_limit: record.rate_limit.clone(),
            expires: record.expires.clone(),
            set_by: record.set_by.clone(),
            set_at: record.set_at.clone(),
            status,
            rule: applied.map(|a| a.target.label().to_owned()),
            rule_location: applied.map(|a| a.target.location.to_string()),
            limit: applied.map(|a| a.rule.policy.to_string()),
            reason: compiled.unmatched.get(id).cloned(),
        })
    }

    /// Changes the state and compiles it against the rules in force.
    fn change(&self, f: impl FnOnce(&mut State)) {
        {
            let mut state = self.lock_state();
            f(&mut state);
            state.generation += 1;
            let now = SystemTime::now();
            let live = state
                .records
                .values()
                .filter(|r| r.expiry().is_none_or(|e| e > now))
                .count();
            self.active.store(live, Ordering::Relaxed);
            self.generation.store(state.generation, Ordering::Release);
        }
        self.compiled_for(&self.rules.rules());
    }

    /// Reads the shared overrides when their version moved since this instance last read them.
    /// Returns whether anything changed. An error leaves the overrides as they were.
    pub async fn sync_now(&self) -> Result<bool, StoreError> {
        if !self.shared() {
            return Ok(false);
        }
        let result = {
            let _one_read = self.reading.lock().await;
            self.read_shared().await
        };
        let mut health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        match &result {
            Ok(_) => {
                health.last_ok = Some(Instant::now());
                if health.error.take().is_some() {
                    tracing::info!("the store answers again: runtime overrides are in sync");
                }
            }
            Err(e) => {
                if health.error.is_none() {
                    tracing::warn!(
                        error = %e,
                        "cannot read the runtime overrides from the store; enforcing the ones \
                         last read until it answers"
                    );
                }
                health.error = Some(e.to_string());
            }
        }
        result
    }

    async fn read_shared(&self) -> Result<bool, StoreError> {
        let version = self.store.override_version().await?;
        if self.lock_state().version == Some(version) {
            return Ok(false);
        }
        let snapshot = self.store.overrides().await?;
        let mut records = BTreeMap::new();
        for (id, body) in snapshot.entries {
            match serde_json::from_str::<Record>(&body) {
                Ok(record) => {
                    records.insert(id, record);
                }
                Err(e) => tracing::warn!(
                    override_id = %id,
                    error = %e,
                    "a stored runtime override does not read; it is ignored"
                ),
            }
        }
        let mut changed = false;
        {
            let state = self.lock_state();
            if let Some(held) = state.version.filter(|&v| v > snapshot.version) {
                // Reads are one at a time, so the store itself went back: it lost its data (a
                // restart without persistence) or failed over to a replica that lagged. The
                // store is the one copy every instance follows, so this one follows it too.
                tracing::warn!(
                    held,
                    read = snapshot.version,
                    "the store's runtime overrides went back to an older version (did it lose \
                     its data?); following the store"
                );
            }
            for (id, record) in &records {
                let before = state.records.get(id);
                if before != Some(record) {
                    changed = true;
                    tracing::info!(
                        override_id = %id,
                        before = %before.map_or("none".into(), record_text),
                        after = %record_text(record),
                        "runtime override read from the store"
                    );
                }
            }
            for (id, record) in &state.records {
                if !records.contains_key(id) {
                    changed = true;
                    tracing::info!(
                        override_id = %id,
                        before = %record_text(record),
                        after = "none",
                        "runtime override removed in the store"
                    );
                }
            }
        }
        self.change(|state| {
            state.version = Some(snapshot.version);
            state.records = records;
        });
        Ok(changed)
    }

    /// Follows the shared overrides until `stop` turns true: reads them every [`POLL_EVERY`]
    /// when their version moved, and notices overrides that expired, so that they leave the
    /// table, the metrics and `GET` on every instance. Returns at once for a store that does
    /// not share them, whose overrides only expire.
    pub async fn follow(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(POLL_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            let _ = self.sync_now().await;
            self.notice_expired();
        }
    }

    /// Logs each override that expired since the last look, once, and refreshes the table so
    /// that the metrics count only those in force. The entry stays in the store until replaced
    /// or removed; expired, it never applies.
    fn notice_expired(&self) {
        let now = SystemTime::now();
        let compiled = self.compiled.load_full();
        let expired: Vec<String> = {
            let state = self.lock_state();
            state
                .records
                .iter()
                .filter(|(_, r)| r.expiry().is_some_and(|e| e <= now))
                .filter(|(_, r)| compiled.applied(&r.domain, &r.entries()).is_some())
                .map(|(id, _)| id.clone())
                .collect()
        };
        if expired.is_empty() {
            return;
        }
        for id in &expired {
            tracing::info!(override_id = %id, "runtime override expired: the rule's limit applies again");
        }
        // Compiled again, the table leaves them out; the entries stay, shown as expired.
        self.change(|_| {});
    }

    /// Where the overrides come from and how fresh this instance's copy is.
    pub fn sync_status(&self) -> OverrideSync {
        let health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        OverrideSync {
            shared: self.shared(),
            last_sync: health.last_ok.map(|t| t.elapsed()),
            error: health.error.clone(),
            version: self.lock_state().version,
        }
    }

    /// One line for `/readyz`: where the overrides live, and whether this copy is current.
    pub fn readiness(&self) -> String {
        let n = self.lock_state().records.len();
        let sync = self.sync_status();
        match (sync.shared, sync.error) {
            (false, _) => format!(
                "overrides: {n} set, local to this instance (the store does not share them)"
            ),
            (true, None) => format!(
                "overrides: {n} set, shared through the store at version {}",
                sync.version.unwrap_or(0)
            ),
            (true, Some(e)) => format!(
                "overrides: {n} set, as last read {} ago; the store does not answer ({e})",
                sync.last_sync
                    .map_or("never".to_owned(), |d| format!("{:.1}s", d.as_secs_f64()))
            ),
        }
    }

    /// Registers the `sluice_overrides*` series.
    pub(crate) fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        self.metrics.register(registry);
    }

    /// Brings the `sluice_overrides*` series up to date.
    pub(crate) fn refresh_metrics(&self) {
        let rules = self.rules.rules();
        let compiled = self.compiled_for(&rules);
        let state = self.lock_state();
        self.metrics.set(&state.records, &compiled);
        drop(state);
        self.metrics.set_sync(&self.sync_status());
    }
}

/// An override in one line for the change log.
fn view_text(view: Option<&OverrideView>) -> String {
    view.map_or_else(
        || "none".to_owned(),
        |v| {
            format!(
                "{} until {} (set by {} at {})",
                v.rate_limit,
                v.expires.as_deref().unwrap_or("removed"),
                v.set_by,
                v.set_at
            )
        },
    )
}

/// A stored override in one line for the change log.
fn record_text(r: &Record) -> String {
    format!(
        "{} until {} (set by {} at {})",
        r.rate_limit,
        r.expires.as_deref().unwrap_or("removed"),
        r.set_by,
        r.set_at
    )
}
