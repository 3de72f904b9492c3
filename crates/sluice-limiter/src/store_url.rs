//! Opening a store from its URL (`--store`): `memory`, `memory://?max_keys=N`, or a Redis URL.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{DynStore, MemoryStore};
use sluice_redis::{ConnectError, RedisOptions, RedisStore};
use sluice_rules::{LoadError, RuleSet};

/// The `--store` value could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreUrlError {
    /// A scheme Sluice does not know.
    #[error(
        "unknown store `{0}`; expected `memory`, `memory://?max_keys=N`, `redis://`, \
         `rediss://`, `redis+sentinel://` or `redis+cluster://`"
    )]
    Unknown(String),
    /// A bad parameter.
    #[error("bad store parameter in `{url}`: {reason}")]
    BadParameter {
        /// The URL.
        url: String,
        /// What was wrong.
        reason: String,
    },
    /// Redis could not be set up.
    #[error(transparent)]
    Redis(#[from] ConnectError),
}

/// How the service talks to Redis, when it does.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    /// The first part of every Redis key.
    pub prefix: String,
    /// How long one store call may take before it counts as failed.
    pub timeout: Duration,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            prefix: "sluice".to_owned(),
            timeout: Duration::from_millis(50),
        }
    }
}

/// An open store, and what the service can ask of it beyond decisions.
#[derive(Clone)]
pub struct OpenStore {
    /// The store every decision goes to.
    pub store: Arc<dyn DynStore>,
    /// The Redis store behind it, for breaker state and statistics.
    pub redis: Option<RedisStore>,
}

impl std::fmt::Debug for OpenStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenStore")
            .field("redis", &self.redis.is_some())
            .finish_non_exhaustive()
    }
}

impl OpenStore {
    /// A store that is not Redis.
    pub fn plain(store: Arc<dyn DynStore>) -> Self {
        OpenStore { store, redis: None }
    }

    /// What every rule set must pass before it is put in force, at startup and on each reload
    /// (see [`sluice_rules::Reloader::with_check`]): that this store can hold every rule. The
    /// redis store, for one, cannot hold a window longer than about 104 days.
    pub fn supports_check(
        &self,
    ) -> impl Fn(&RuleSet) -> Result<(), LoadError> + Send + Sync + 'static {
        let store = Arc::clone(&self.store);
        move |rules| rules.check_supported(|policy| store.supports(policy))
    }
}

/// The kinds of store a URL can name.
enum Kind {
    Memory,
    Redis,
}

/// The kind of store `url` names, and what follows its `scheme://`.
fn kind(url: &str) -> Result<(Kind, &str), StoreUrlError> {
    let (scheme, rest) = url.split_once("://").unwrap_or((url, ""));
    match scheme {
        "memory" => Ok((Kind::Memory, rest)),
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" | "redis+cluster"
        | "rediss+cluster" => Ok((Kind::Redis, rest)),
        _ => Err(StoreUrlError::Unknown(url.to_owned())),
    }
}

/// The check that the store `url` names puts every rule through when rules load, without
/// opening the store: `sluice validate --store` runs it where no Redis is reachable. A Redis URL
/// is parsed, so that a mistyped one is reported too.
pub fn supports_check_for(
    url: &str,
) -> Result<impl Fn(&RuleSet) -> Result<(), LoadError>, StoreUrlError> {
    let redis = match kind(url)? {
        (Kind::Memory, rest) => {
            memory(url, rest)?;
            false
        }
        (Kind::Redis, _) => {
            sluice_redis::RedisUrl::parse(url)?;
            true
        }
    };
    Ok(move |rules: &RuleSet| {
        if redis {
            rules.check_supported(sluice_redis::supports)
        } else {
            Ok(())
        }
    })
}

/// Opens the store `url` names.
pub async fn open(url: &str, settings: &StoreSettings) -> Result<OpenStore, StoreUrlError> {
    match kind(url)? {
        (Kind::Memory, rest) => Ok(OpenStore::plain(Arc::new(memory(url, rest)?))),
        (Kind::Redis, _) => {
            let options = RedisOptions::default()
                .prefix(settings.prefix.clone())
                .timeout(settings.timeout);
            let redis = RedisStore::connect(url, options).await?;
            // The script's SHA lets an operator (or a benchmark) find it with EVALSHA; the URL
            // is not logged, since it may hold a password.
            tracing::info!(
                check_script = redis.check_script_sha(),
                "redis store connected"
            );
            Ok(OpenStore {
                store: Arc::new(redis.clone()),
                redis: Some(redis),
            })
        }
    }
}

fn memory(url: &str, rest: &str) -> Result<MemoryStore, StoreUrlError> {
    let mut builder = MemoryStore::builder();
    let query = rest.strip_prefix('?').unwrap_or(rest);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("max_keys", n)) => {
                let n: usize = n.parse().map_err(|_| StoreUrlError::BadParameter {
                    url: url.to_owned(),
                    reason: format!("max_keys `{n}` is not a whole number"),
                })?;
                builder = builder.max_keys(n);
            }
            _ => {
                return Err(StoreUrlError::BadParameter {
                    url: url.to_owned(),
                    reason: format!("unknown parameter `{pair}`; memory takes max_keys"),
                });
            }
        }
    }
    Ok(builder.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn urls_are_checked_with_a_reason() {
        let s = StoreSettings::default();
        assert!(open("memory", &s).await.is_ok());
        assert!(open("memory://?max_keys=10", &s).await.is_ok());
        let e = open("memory://?max_keys=ten", &s)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a whole number"), "{e}");
        let e = open("memory://?size=1", &s).await.unwrap_err().to_string();
        assert!(e.contains("unknown parameter"), "{e}");
        let e = open("postgres://x", &s).await.unwrap_err().to_string();
        assert!(e.contains("unknown store"), "{e}");
        let e = open("redis+cluster://", &s).await.unwrap_err().to_string();
        assert!(e.contains("invalid redis store URL"), "{e}");
    }
}
