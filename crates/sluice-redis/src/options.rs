//! How a Redis store behaves: key prefix, timeouts and circuit breaker.

use std::time::Duration;

/// Options of a [`crate::RedisStore`]. The defaults suit a store on the same network.
///
/// ```
/// use std::time::Duration;
/// use sluice_redis::RedisOptions;
///
/// let options = RedisOptions::default()
///     .prefix("ratelimit")
///     .timeout(Duration::from_millis(20));
/// assert_eq!(options.get_prefix(), "ratelimit");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) breaker_threshold: u32,
    pub(crate) breaker_cool_down: Duration,
    pub(crate) tls_root_cert: Option<Vec<u8>>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "sluice".to_owned(),
            timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(2),
            breaker_threshold: 3,
            breaker_cool_down: Duration::from_millis(500),
            tls_root_cert: None,
        }
    }
}

impl RedisOptions {
    /// The first part of every key (`prefix:{identity}`), so that several deployments, or
    /// Sluice and other programs, can share one Redis. Default `sluice`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one store call may take, round trips included, before it fails with
    /// `StoreError::Timeout` and the rule's `on_store_error` decides. Default 50 ms: a limiter
    /// must not add more latency than that to a request when Redis is slow.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long connecting may take, at start and on reconnection. Default 2 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How many consecutive transient failures open the circuit breaker. Default 3: enough to
    /// ride out one dropped connection, few enough that an outage costs only a handful of
    /// timeouts.
    pub fn breaker_threshold(mut self, failures: u32) -> Self {
        self.breaker_threshold = failures.max(1);
        self
    }

    /// How long an open breaker fails calls at once before it lets one probe through. Default
    /// 500 ms, so limiting resumes within a second of Redis coming back.
    pub fn breaker_cool_down(mut self, cool_down: Duration) -> Self {
        self.breaker_cool_down = cool_down;
        self
    }

    /// For `rediss` URLs: the certificate authority (PEM) that signed the servers' certificates,
    /// when it is a private one. Without it, servers are verified against the public web roots
    /// compiled in (`webpki-roots`), so no system certificate store is needed.
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_cert = Some(pem.into());
        self
    }

    /// The key prefix.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// The timeout of one store call.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }
}
