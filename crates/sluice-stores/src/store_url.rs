//! Opening a store from its URL (`--store`): `memory`, `memory://?max_keys=N`, a Redis URL, or
//! a hybrid one: `hybrid+` before a Redis URL, options in its query
//! (`hybrid+redis://host:6379?sync_interval=20ms&batch=512&max_keys=100000`).

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{MemoryStore, parse_duration};
use sluice_hybrid::{HybridOptions, HybridStore};
use sluice_limiter::{OpenStore, StartError, StoreOpenError};
use sluice_redis::{ConnectError, RedisOptions, RedisStore};
use sluice_rules::{LoadError, RuleSet};

use crate::hybrid_telemetry::HybridTelemetry;
use crate::redis_telemetry::RedisTelemetry;

/// The `--store` value could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreUrlError {
    /// A scheme Sluice does not know.
    #[error(
        "unknown store `{0}`; expected `memory`, `memory://?max_keys=N`, `redis://`, \
         `rediss://`, `redis+sentinel://` or `redis+cluster://`, or one of the Redis URLs \
         after `hybrid+` (`hybrid+redis://host:6379?sync_interval=20ms`)"
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

/// A limiter that starts from a store URL fails to start when the store cannot be opened.
impl From<StoreUrlError> for StartError {
    fn from(e: StoreUrlError) -> Self {
        StartError::Store(StoreOpenError::new(e))
    }
}

/// How the service talks to Redis, when it does.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    /// The first part of every Redis key.
    pub prefix: String,
    /// How long one store call may take before it counts as failed.
    pub timeout: Duration,
    /// A CA certificate (PEM) to trust for `rediss://`, beside the public roots.
    pub tls_root_cert: Option<Vec<u8>>,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            prefix: "sluice".to_owned(),
            timeout: Duration::from_millis(50),
            tls_root_cert: None,
        }
    }
}

impl StoreSettings {
    /// The Redis store's options for these settings.
    fn redis_options(&self) -> RedisOptions {
        let options = RedisOptions::default()
            .prefix(self.prefix.clone())
            .timeout(self.timeout);
        match &self.tls_root_cert {
            Some(pem) => options.tls_root_cert(pem.clone()),
            None => options,
        }
    }
}

/// The kinds of store a URL can name.
enum Kind {
    Memory,
    Redis,
    Hybrid,
}

/// The kind of store `url` names, and what follows its `scheme://`.
fn kind(url: &str) -> Result<(Kind, &str), StoreUrlError> {
    let (scheme, rest) = url.split_once("://").unwrap_or((url, ""));
    match scheme {
        "memory" => Ok((Kind::Memory, rest)),
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" | "redis+cluster"
        | "rediss+cluster" => Ok((Kind::Redis, rest)),
        hybrid
            if hybrid
                .strip_prefix("hybrid+")
                .is_some_and(|s| s.starts_with("redis")) =>
        {
            Ok((Kind::Hybrid, rest))
        }
        _ => Err(StoreUrlError::Unknown(url.to_owned())),
    }
}

/// The check that the store `url` names puts every rule through when rules load, without
/// opening the store: `sluice validate --store` runs it where no Redis is reachable. A Redis URL
/// is parsed, so that a mistyped one is reported too.
pub fn supports_check_for(
    url: &str,
) -> Result<impl Fn(&RuleSet) -> Result<(), LoadError>, StoreUrlError> {
    let kind = match kind(url)? {
        (Kind::Memory, rest) => {
            memory(url, rest)?;
            Kind::Memory
        }
        (Kind::Redis, _) => {
            sluice_redis::RedisUrl::parse(url)?;
            Kind::Redis
        }
        (Kind::Hybrid, _) => {
            let (redis_url, _) = hybrid_options(url)?;
            sluice_redis::RedisUrl::parse(redis_url)?;
            Kind::Hybrid
        }
    };
    Ok(move |rules: &RuleSet| match kind {
        Kind::Memory => Ok(()),
        Kind::Redis => rules.check_supported(sluice_redis::supports),
        Kind::Hybrid => rules.check_supported(sluice_hybrid::hybrid_supports),
    })
}

/// Opens the store `url` names.
pub async fn open(url: &str, settings: &StoreSettings) -> Result<OpenStore, StoreUrlError> {
    match kind(url)? {
        (Kind::Memory, rest) => Ok(OpenStore::plain(Arc::new(memory(url, rest)?))),
        (Kind::Redis, _) => {
            let options = settings.redis_options();
            let redis = RedisStore::connect(url, options).await?;
            // The script's SHA lets an operator (or a benchmark) find it with EVALSHA; the URL
            // is not logged, since it may hold a password.
            tracing::info!(
                check_script = redis.check_script_sha(),
                "redis store connected"
            );
            Ok(OpenStore {
                store: Arc::new(redis.clone()),
                telemetry: Arc::new(RedisTelemetry::new(redis)),
            })
        }
        (Kind::Hybrid, _) => {
            let (redis_url, hybrid) = hybrid_options(url)?;
            let options = settings.redis_options();
            let redis = RedisStore::connect(redis_url, options).await?;
            tracing::info!(
                sync_interval = ?hybrid.sync_interval,
                batch = hybrid.batch,
                max_keys = hybrid.max_keys,
                "hybrid store connected"
            );
            let store = HybridStore::new(redis, hybrid);
            // The task holds the store weakly and ends when the last handle is dropped.
            store.spawn_sync();
            Ok(OpenStore {
                store: Arc::new(store.clone()),
                telemetry: Arc::new(HybridTelemetry::new(store)),
            })
        }
    }
}

/// A hybrid URL's Redis URL (the URL without `hybrid+` and its query) and its options:
/// `sync_interval` (a duration such as `20ms`, at most 1s), `batch` and `max_keys` (whole
/// numbers, at least 1).
fn hybrid_options(url: &str) -> Result<(&str, HybridOptions), StoreUrlError> {
    let bad = |reason: String| StoreUrlError::BadParameter {
        url: url.to_owned(),
        reason,
    };
    let redis_url = url.strip_prefix("hybrid+").unwrap_or(url);
    let (redis_url, query) = redis_url.split_once('?').unwrap_or((redis_url, ""));
    let mut options = HybridOptions::default();
    let whole = |name: &str, v: &str| -> Result<usize, StoreUrlError> {
        v.parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| bad(format!("{name} `{v}` is not a whole number of at least 1")))
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("sync_interval", v)) => {
                options.sync_interval = parse_duration(v)
                    .filter(|d| !d.is_zero() && *d <= Duration::from_secs(1))
                    .ok_or_else(|| {
                        bad(format!(
                            "sync_interval `{v}` is not a duration from 1ms to 1s, such as 20ms"
                        ))
                    })?;
            }
            Some(("batch", v)) => options.batch = whole("batch", v)?,
            Some(("max_keys", v)) => options.max_keys = whole("max_keys", v)?,
            _ => {
                return Err(bad(format!(
                    "unknown parameter `{pair}`; hybrid takes sync_interval, batch and max_keys"
                )));
            }
        }
    }
    Ok((redis_url, options))
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

    #[test]
    fn hybrid_urls_take_their_options_from_the_query() {
        let (redis, o) =
            hybrid_options("hybrid+redis+cluster://a:1,b:2?sync_interval=10ms&batch=64&max_keys=9")
                .unwrap();
        assert_eq!(redis, "redis+cluster://a:1,b:2");
        assert_eq!(o.sync_interval, Duration::from_millis(10));
        assert_eq!((o.batch, o.max_keys), (64, 9));
        let (redis, o) = hybrid_options("hybrid+redis://h:6379").unwrap();
        assert_eq!(redis, "redis://h:6379");
        assert_eq!(o, HybridOptions::default());
        assert!(o.sync_interval <= Duration::from_millis(50));
        for (url, reason) in [
            ("hybrid+redis://h?sync_interval=0ms", "from 1ms to 1s"),
            ("hybrid+redis://h?sync_interval=5s", "from 1ms to 1s"),
            ("hybrid+redis://h?batch=0", "at least 1"),
            ("hybrid+redis://h?max_keys=x", "whole number"),
            ("hybrid+redis://h?interval=1ms", "unknown parameter"),
        ] {
            let e = hybrid_options(url).unwrap_err().to_string();
            assert!(e.contains(reason), "{url}: {e}");
        }
        assert!(supports_check_for("hybrid+redis+sentinel://s:26379/m").is_ok());
        assert!(matches!(
            supports_check_for("hybrid+memory://"),
            Err(StoreUrlError::Unknown(_))
        ));
    }
}
