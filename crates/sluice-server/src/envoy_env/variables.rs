//! Reading envoyproxy/ratelimit's variables as it reads them (blank is unset, its booleans, Go
//! durations), and the variables Sluice needs nothing for or does not honour.

use std::collections::BTreeMap;

use sluice_core::parse_duration;

/// Variables whose intent Sluice meets without them: it multiplexes one connection per Redis
/// node and pipelines on its own.
pub(super) const NOT_NEEDED: &[&str] = &[
    "REDIS_POOL_SIZE",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_POOL_ON_EMPTY_WAIT_DURATION",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
];

/// Variables that, when set, ask for something Sluice does not do, with what it does instead.
pub(super) const NOT_HONOURED: &[(&str, &str)] = &[
    ("GRPC_UDS", "gRPC listens on TCP only"),
    ("GRPC_MAX_CONNECTION_AGE", "connections are not aged out"),
    (
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "connections are not aged out",
    ),
    (
        "GRPC_CLIENT_TLS_SAN",
        "client certificates are checked against the CA only",
    ),
    (
        "USE_DOG_STATSD",
        "no DogStatsD tags; plain statsd names are sent with USE_STATSD",
    ),
    (
        "USE_DOG_STATSD_MOGRIFIERS",
        "no DogStatsD tags; plain statsd names are sent with USE_STATSD",
    ),
    (
        "PROMETHEUS_MAPPER_YAML",
        "the names of Envoy's default mapping are served",
    ),
    (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "latency is in seconds",
    ),
    ("TRACING_ENABLED", "no OpenTelemetry tracing"),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "counters expire when they are full again",
    ),
    (
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "use the hybrid store for local decisions",
    ),
    ("REDIS_TLS_CLIENT_CERT", "no client certificate to Redis"),
    ("REDIS_TLS_CLIENT_KEY", "no client certificate to Redis"),
    (
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "Redis TLS always verifies the host name",
    ),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "the breaker and /readyz watch Redis",
    ),
    (
        "REDIS_SENTINEL_AUTH",
        "Sentinels are reached without credentials",
    ),
    (
        "CONFIG_GRPC_XDS_NODE_METADATA",
        "the node presents its id only",
    ),
    (
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        "no extra headers to the xDS server",
    ),
    (
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "reconnecting follows XDS_CLIENT_BACKOFF_*",
    ),
    (
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        "the back-off doubles without jitter",
    ),
    (
        "XDS_CLIENT_BACKOFF_JITTER",
        "the back-off doubles without jitter",
    ),
    ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "tonic's limit applies"),
];

/// The environment as read once.
pub(super) struct Env<'a> {
    vars: &'a BTreeMap<String, String>,
}

impl<'a> Env<'a> {
    /// The environment `vars`.
    pub(super) fn new(vars: &'a BTreeMap<String, String>) -> Self {
        Env { vars }
    }

    /// The value of `name`, unless unset or blank.
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .get(name)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    pub(super) fn or<'s>(&'s self, name: &str, default: &'s str) -> &'s str {
        self.get(name).unwrap_or(default)
    }

    /// A boolean as envoyproxy/ratelimit reads one (`1`, `t`, `true`, `0`, `f`, `false`, any
    /// case), or `default` when unset.
    pub(super) fn flag(&self, name: &str, default: bool) -> Result<bool, String> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "1" | "t" | "true" => Ok(true),
                "0" | "f" | "false" => Ok(false),
                _ => Err(format!("{name}={v}: expected true or false")),
            },
        }
    }

    /// The contents of the file that `name` names.
    pub(super) fn file(&self, name: &str) -> Result<Vec<u8>, String> {
        let path = self
            .get(name)
            .ok_or_else(|| format!("{name} must name a PEM file"))?;
        std::fs::read(path).map_err(|e| format!("{name}={path}: {e}"))
    }
}

/// A Go duration (`10s`, `500ms`, `1m30s`, `1.5s`).
pub(super) fn go_duration(text: &str) -> Option<std::time::Duration> {
    if let Some(d) = parse_duration(text) {
        return Some(d);
    }
    let secs: f64 = text.strip_suffix('s')?.parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| std::time::Duration::from_secs_f64(secs))
}
