//! Running as envoyproxy/ratelimit: when the binary is started under the name `ratelimit` (a
//! symlink or a copy, so an image whose command is `/bin/ratelimit` works), or as `sluice serve
//! --envoy-env`, the service takes its settings from envoyproxy/ratelimit's environment
//! variables and needs nothing else. Every variable that is set and that Sluice does not honour
//! is named in one warning at start; a setting that cannot work at all (a memcache backend,
//! rules over xDS, Redis over a Unix socket) stops the start with what to do instead.
//!
//! [`launch`] is a pure function of the variables, so that every mapping is tested without a
//! process; `docs/envoy.md` lists the variables and what each becomes. The variables are read
//! in `variables.rs`, the Redis ones become a store URL in `redis.rs`, the host and port
//! ones become listening addresses in `addresses.rs`, and the statistics ones become Envoy's
//! statistics in `stats.rs`.

mod addresses;
mod redis;
mod stats;
mod variables;

use std::collections::BTreeMap;
use std::path::Path;

use crate::compat::{EnvoyAnswers, LimitHeaderNames};
use crate::xds::{XdsOptions, XdsTls};
use crate::{GrpcTls, ServeOptions};
use addresses::{address, listen_addr};
use redis::store_url;
use stats::stats_options;
use variables::{Env, NOT_HONOURED, NOT_NEEDED, go_duration};

/// What the environment asks for.
#[derive(Debug)]
pub struct Launch {
    /// The service's settings.
    pub options: ServeOptions,
    /// The log filter (`warn`, `info`, …) from `LOG_LEVEL`.
    pub log_filter: &'static str,
    /// JSON logs (`LOG_FORMAT=json`).
    pub log_json: bool,
    /// Variables set but not honoured, each with why: one warning at start.
    pub not_honoured: Vec<String>,
    /// Variables that need nothing from Sluice (connection pools, pipelining), for one info
    /// line.
    pub not_needed: Vec<&'static str>,
}

impl Launch {
    /// Logs, once the log is set up, the variables set but not honoured (one warning) and those
    /// with nothing to do (one info line).
    pub fn log_unused_variables(&self) {
        if !self.not_honoured.is_empty() {
            tracing::warn!(
                "environment variables not honoured: {}",
                self.not_honoured.join("; ")
            );
        }
        if !self.not_needed.is_empty() {
            tracing::info!(
                "environment variables with nothing to do (one multiplexed connection per Redis node): {}",
                self.not_needed.join(", ")
            );
        }
    }
}

/// The process's environment, every variable whose name and value are Unicode: what
/// [`launch`] reads when the binary runs as envoyproxy/ratelimit.
pub fn process_variables() -> BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// The settings that the environment `vars` asks for.
pub fn launch(vars: &BTreeMap<String, String>) -> Result<Launch, String> {
    let env = Env::new(vars);
    let xds = match env.or("CONFIG_TYPE", "FILE").to_ascii_uppercase().as_str() {
        "FILE" => None,
        "GRPC_XDS_SOTW" => Some(xds_options(&env)?),
        other => {
            return Err(format!(
                "CONFIG_TYPE={other}: expected FILE or GRPC_XDS_SOTW"
            ));
        }
    };
    let mut not_honoured = Vec::new();
    if xds.is_none() && env.flag("FORCE_START_WITHOUT_INITIAL_CONFIG", false)? {
        not_honoured.push(
            "FORCE_START_WITHOUT_INITIAL_CONFIG (rule files must load for the service to start)"
                .to_owned(),
        );
    }
    for (name, why) in NOT_HONOURED {
        // A flag set to false asks for nothing.
        if env.get(name).is_some() && env.flag(name, true) != Ok(false) {
            not_honoured.push(format!("{name} ({why})"));
        }
    }
    if !env.flag("RUNTIME_IGNOREDOTFILES", false)? && env.get("RUNTIME_IGNOREDOTFILES").is_some() {
        not_honoured
            .push("RUNTIME_IGNOREDOTFILES=false (dot-files are never read as rules)".to_owned());
    }
    if env.flag("REDIS_PERSECOND", false)? {
        not_honoured.push(
            "REDIS_PERSECOND (every limit is kept in the one store, per-second ones too)"
                .to_owned(),
        );
    }
    // The watcher follows a swapped root symlink and changes inside the directory alike.
    env.flag("RUNTIME_WATCH_ROOT", true)?;

    let config = Path::new(env.or("RUNTIME_ROOT", "/srv/runtime_data/current"))
        .join(env.or("RUNTIME_SUBDIRECTORY", ""))
        .join(env.or("RUNTIME_APPDIRECTORY", "config"));
    let mut options = ServeOptions::new(vec![config]);
    options.xds = xds;
    options.http_addr = address(&env, "HOST", "PORT", 8080)?;
    options.grpc_addr = address(&env, "GRPC_HOST", "GRPC_PORT", 8081)?;
    options.debug_addr = Some(address(&env, "DEBUG_HOST", "DEBUG_PORT", 6070)?);
    if env.flag("USE_PROMETHEUS", false)? {
        let addr = env.or("PROMETHEUS_ADDR", ":9090");
        options.metrics_addr =
            Some(listen_addr(addr).map_err(|e| format!("PROMETHEUS_ADDR={addr}: {e}"))?);
        options.metrics_path = env.or("PROMETHEUS_PATH", "/metrics").to_owned();
    }
    options.envoy_stats = stats_options(&env, &mut not_honoured)?;

    // Sluice's own variable wins: the memory store, or any store URL, without REDIS_*.
    options.store = match env.get("SLUICE_STORE") {
        Some(store) => store.to_owned(),
        None => store_url(&env)?,
    };
    if let Some(prefix) = env.get("CACHE_KEY_PREFIX") {
        options.store_settings.prefix = prefix.to_owned();
    }
    if let Some(timeout) = env.get("REDIS_TIMEOUT") {
        options.store_settings.timeout = go_duration(timeout)
            .ok_or_else(|| format!("REDIS_TIMEOUT={timeout}: expected a duration such as 10s"))?;
    }
    if env.get("REDIS_TLS_CACERT").is_some() {
        options.store_settings.tls_root_cert = Some(env.file("REDIS_TLS_CACERT")?);
    }

    if env.flag("GRPC_SERVER_USE_TLS", false)? {
        options.grpc_tls = Some(GrpcTls {
            cert: env.file("GRPC_SERVER_TLS_CERT")?,
            key: env.file("GRPC_SERVER_TLS_KEY")?,
            client_ca: match env.get("GRPC_CLIENT_TLS_CACERT") {
                Some(_) => Some(env.file("GRPC_CLIENT_TLS_CACERT")?),
                None => None,
            },
        });
    }

    options.load.merge_domains = env.flag("MERGE_DOMAIN_CONFIG", false)?;
    options.envoy = EnvoyAnswers {
        shadow_mode: env.flag("SHADOW_MODE", false)?,
        quota_mode: env.flag("QUOTA_MODE", false)?,
        dynamic_metadata: env.flag("RESPONSE_DYNAMIC_METADATA", false)?,
        healthy_needs_rules: env.flag("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?,
        limit_headers: if env.flag("LIMIT_RESPONSE_HEADERS_ENABLED", false)? {
            let defaults = LimitHeaderNames::default();
            Some(LimitHeaderNames {
                limit: env.or("LIMIT_LIMIT_HEADER", &defaults.limit).to_owned(),
                remaining: env
                    .or("LIMIT_REMAINING_HEADER", &defaults.remaining)
                    .to_owned(),
                reset: env.or("LIMIT_RESET_HEADER", &defaults.reset).to_owned(),
            })
        } else {
            None
        },
    };
    // envoyproxy/ratelimit asks Envoy to add no headers of its own otherwise.
    options.grpc_headers = sluice_limiter::HeaderStyle::None;

    let log_filter = match env.or("LOG_LEVEL", "WARN").to_ascii_lowercase().as_str() {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warn" | "warning" => "warn",
        "error" | "fatal" | "panic" => "error",
        other => {
            return Err(format!(
                "LOG_LEVEL={other}: expected debug, info, warn or error"
            ));
        }
    };
    let log_json = match env.or("LOG_FORMAT", "text").to_ascii_lowercase().as_str() {
        "json" => true,
        "text" => false,
        other => return Err(format!("LOG_FORMAT={other}: expected text or json")),
    };
    let not_needed = NOT_NEEDED
        .iter()
        .copied()
        .filter(|name| env.get(name).is_some())
        .collect();
    Ok(Launch {
        options,
        log_filter,
        log_json,
        not_honoured,
        not_needed,
    })
}

/// Where rules come from with `CONFIG_TYPE=GRPC_XDS_SOTW`.
fn xds_options(env: &Env<'_>) -> Result<XdsOptions, String> {
    let duration = |name: &str, default: &str| {
        let text = env.or(name, default);
        go_duration(text).ok_or_else(|| format!("{name}={text}: expected a duration such as 10s"))
    };
    let tls = if env.flag("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)? {
        let identity = match (
            env.get("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
            env.get("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
        ) {
            (None, None) => None,
            _ => Some((
                env.file("CONFIG_GRPC_XDS_CLIENT_TLS_CERT")?,
                env.file("CONFIG_GRPC_XDS_CLIENT_TLS_KEY")?,
            )),
        };
        Some(XdsTls {
            ca: match env.get("CONFIG_GRPC_XDS_SERVER_TLS_CACERT") {
                Some(_) => Some(env.file("CONFIG_GRPC_XDS_SERVER_TLS_CACERT")?),
                None => None,
            },
            identity,
            server_name: env.get("CONFIG_GRPC_XDS_SERVER_TLS_SAN").map(str::to_owned),
        })
    } else {
        None
    };
    Ok(XdsOptions {
        server: env
            .or("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000")
            .to_owned(),
        node_id: env.or("CONFIG_GRPC_XDS_NODE_ID", "default").to_owned(),
        tls,
        backoff_initial: duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s")?,
        backoff_max: duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s")?,
        wait_for_rules: !env.flag("FORCE_START_WITHOUT_INITIAL_CONFIG", false)?,
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn redis_tcp(extra: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut v = vars(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.ns:6379"),
            ("USE_STATSD", "false"),
        ]);
        v.extend(vars(extra));
        v
    }

    #[test]
    fn envoy_gateway_style_settings_map_onto_the_service() {
        let l = launch(&redis_tcp(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("GRPC_PORT", "8081"),
            ("PORT", "8080"),
            ("DEBUG_PORT", "6070"),
            ("LOG_LEVEL", "info"),
            ("LOG_FORMAT", "json"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("PROMETHEUS_PATH", "/metrics"),
            ("REDIS_TYPE", "single"),
            ("REDIS_AUTH", "user:p@ss"),
            ("REDIS_TLS", "true"),
            ("REDIS_POOL_SIZE", "10"),
            ("CACHE_KEY_PREFIX", "rl_"),
            ("REDIS_TIMEOUT", "2s"),
        ]))
        .unwrap();
        let o = &l.options;
        assert_eq!(o.config, vec![PathBuf::from("/data/ratelimit/config")]);
        assert_eq!(o.http_addr, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(o.grpc_addr, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(o.debug_addr, Some("0.0.0.0:6070".parse().unwrap()));
        assert_eq!(o.metrics_addr, Some("0.0.0.0:19001".parse().unwrap()));
        assert_eq!(o.store, "rediss://user:p%40ss@redis.ns:6379");
        assert_eq!(o.store_settings.prefix, "rl_");
        assert_eq!(o.store_settings.timeout, std::time::Duration::from_secs(2));
        assert_eq!((l.log_filter, l.log_json), ("info", true));
        assert!(l.not_honoured.is_empty(), "{:?}", l.not_honoured);
        assert_eq!(l.not_needed, vec!["REDIS_POOL_SIZE"]);
        assert_eq!(o.envoy, EnvoyAnswers::default());
    }

    #[test]
    fn the_defaults_are_envoys() {
        let l = launch(&redis_tcp(&[])).unwrap();
        assert_eq!(
            l.options.config,
            vec![PathBuf::from("/srv/runtime_data/current/config")]
        );
        assert_eq!(l.options.store, "redis://redis.ns:6379");
        assert_eq!(l.options.metrics_addr, None);
        assert_eq!(l.log_filter, "warn");
        assert!(!l.log_json);
    }

    #[test]
    fn cluster_and_sentinel_urls() {
        let l = launch(&redis_tcp(&[
            ("REDIS_TYPE", "CLUSTER"),
            ("REDIS_URL", "a:7000, b:7000,c:7000"),
            ("REDIS_AUTH", "secret"),
        ]))
        .unwrap();
        assert_eq!(
            l.options.store,
            "redis+cluster://:secret@a:7000,b:7000,c:7000"
        );
        let l = launch(&redis_tcp(&[
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
        ]))
        .unwrap();
        assert_eq!(
            l.options.store,
            "redis+sentinel://s1:26379,s2:26379/mymaster"
        );
        let e = launch(&redis_tcp(&[("REDIS_TYPE", "SENTINEL")])).unwrap_err();
        assert!(e.contains("master's name"), "{e}");
    }

    #[test]
    fn answers_settings_and_header_names() {
        let l = launch(&redis_tcp(&[
            ("SHADOW_MODE", "true"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REMAINING_HEADER", "X-Left"),
        ]))
        .unwrap();
        assert!(l.options.envoy.shadow_mode);
        assert!(!l.options.envoy.quota_mode && !l.options.envoy.dynamic_metadata);
        assert!(!l.options.load.merge_domains);
        let names = l.options.envoy.limit_headers.unwrap();
        assert_eq!(names.limit, "RateLimit-Limit");
        assert_eq!(names.remaining, "X-Left");
        assert_eq!(names.reset, "RateLimit-Reset");
    }

    #[test]
    fn quota_mode_dynamic_metadata_and_merged_domains_are_honoured() {
        let l = launch(&redis_tcp(&[
            ("QUOTA_MODE", "true"),
            ("RESPONSE_DYNAMIC_METADATA", "true"),
            ("MERGE_DOMAIN_CONFIG", "true"),
        ]))
        .unwrap();
        assert!(l.options.envoy.quota_mode);
        assert!(l.options.envoy.dynamic_metadata);
        assert!(l.options.load.merge_domains);
        assert!(l.not_honoured.is_empty(), "{:?}", l.not_honoured);
    }

    #[test]
    fn what_is_not_honoured_is_named_and_what_cannot_work_stops_the_start() {
        let l = launch(&redis_tcp(&[
            ("USE_STATSD", "true"),
            ("STATSD_PROTOCOL", "tcp"),
            ("TRACING_ENABLED", "true"),
            ("DISABLE_STATS", "false"),
            ("REDIS_PERSECOND", "true"),
        ]))
        .unwrap();
        let named: Vec<&str> = l
            .not_honoured
            .iter()
            .map(|w| w.split(' ').next().unwrap())
            .collect();
        assert_eq!(
            named,
            ["TRACING_ENABLED", "REDIS_PERSECOND", "STATSD_PROTOCOL=tcp"]
        );

        let refused = [
            (vec![("CONFIG_TYPE", "XDS")], "CONFIG_TYPE=XDS"),
            (
                vec![
                    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "later"),
                ],
                "XDS_CLIENT_BACKOFF_MAX_INTERVAL=later",
            ),
            (vec![("BACKEND_TYPE", "memcache")], "memcache"),
            (vec![("REDIS_SOCKET_TYPE", "unix")], "REDIS_SOCKET_TYPE=tcp"),
            (vec![("LOG_LEVEL", "loud")], "LOG_LEVEL=loud"),
            (vec![("SHADOW_MODE", "maybe")], "SHADOW_MODE=maybe"),
            (vec![("PORT", "http")], "PORT=http"),
            (vec![("STATSD_PORT", "udp")], "STATSD_PORT=udp"),
            (
                vec![("STATS_FLUSH_INTERVAL", "0s")],
                "STATS_FLUSH_INTERVAL=0s",
            ),
            (vec![("NEAR_LIMIT_RATIO", "most")], "NEAR_LIMIT_RATIO=most"),
            (vec![("EXTRA_TAGS", "team")], "EXTRA_TAGS=team"),
            (vec![("DISABLE_STATS", "yes")], "DISABLE_STATS=yes"),
            (vec![("REDIS_TIMEOUT", "soon")], "REDIS_TIMEOUT=soon"),
            (
                vec![("GRPC_SERVER_USE_TLS", "true")],
                "GRPC_SERVER_TLS_CERT",
            ),
        ];
        for (extra, expected) in refused {
            let e = launch(&redis_tcp(&extra)).unwrap_err();
            assert!(e.contains(expected), "{extra:?}: {e}");
        }
        // With no Redis named at all, the default Unix socket is refused with what to set.
        let e = launch(&vars(&[])).unwrap_err();
        assert!(e.contains("REDIS_SOCKET_TYPE=tcp"), "{e}");
    }

    #[test]
    fn statistics_follow_envoys_variables() {
        // statsd is Envoy's default.
        let mut v = redis_tcp(&[]);
        v.remove("USE_STATSD");
        let s = launch(&v).unwrap().options.envoy_stats.unwrap();
        assert_eq!(s, crate::envoy_stats::EnvoyStatsOptions::default());

        let l = launch(&redis_tcp(&[
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "statsd.ns"),
            ("STATSD_PORT", "9125"),
            ("STATS_FLUSH_INTERVAL", "250ms"),
            ("NEAR_LIMIT_RATIO", "0.9"),
            ("EXTRA_TAGS", "env:prod,version:1.2"),
            ("USE_PROMETHEUS", "true"),
        ]))
        .unwrap();
        assert!(l.not_honoured.is_empty(), "{:?}", l.not_honoured);
        let s = l.options.envoy_stats.unwrap();
        let statsd = s.statsd.unwrap();
        assert_eq!((statsd.host.as_str(), statsd.port), ("statsd.ns", 9125));
        assert_eq!(s.flush_interval, std::time::Duration::from_millis(250));
        assert!((s.near_limit_ratio - 0.9).abs() < f32::EPSILON);
        assert_eq!(
            s.extra_tags,
            [
                ("env".to_owned(), "prod".to_owned()),
                ("version".to_owned(), "1.2".to_owned())
            ]
        );
        assert!(s.prometheus);

        // Prometheus alone keeps them for the listener, without statsd.
        let l = launch(&redis_tcp(&[("USE_PROMETHEUS", "true")])).unwrap();
        let s = l.options.envoy_stats.unwrap();
        assert!(s.prometheus && s.statsd.is_none());
        // Neither, or DISABLE_STATS: none kept; Sluice's own metrics stay.
        assert!(
            launch(&redis_tcp(&[]))
                .unwrap()
                .options
                .envoy_stats
                .is_none()
        );
        let l = launch(&redis_tcp(&[
            ("USE_STATSD", "true"),
            ("USE_PROMETHEUS", "true"),
            ("DISABLE_STATS", "true"),
        ]))
        .unwrap();
        assert!(l.options.envoy_stats.is_none());
        assert!(l.options.metrics_addr.is_some());
    }

    #[test]
    fn rules_over_xds() {
        let l = launch(&redis_tcp(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "eg.ns:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "ratelimit-0"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "250ms"),
        ]))
        .unwrap();
        let xds = l.options.xds.unwrap();
        assert_eq!(xds.server, "eg.ns:18001");
        assert_eq!(xds.node_id, "ratelimit-0");
        assert!(xds.tls.is_none());
        assert_eq!(xds.backoff_initial, std::time::Duration::from_millis(250));
        assert_eq!(xds.backoff_max, std::time::Duration::from_secs(60));
        let e = launch(&redis_tcp(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/nonexistent/cert.pem"),
        ]))
        .unwrap_err();
        assert!(
            e.contains("CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/nonexistent/cert.pem"),
            "{e}"
        );
    }

    #[test]
    fn sluice_store_replaces_the_redis_variables() {
        let l = launch(&vars(&[("SLUICE_STORE", "memory"), ("USE_STATSD", "0")])).unwrap();
        assert_eq!(l.options.store, "memory");
    }
}
