//! Errors of setting up a Redis store. Errors of a running store are `sluice_core::StoreError`.

/// Why a Redis store could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The `--store` URL is malformed.
    #[error("invalid redis store URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL, with any password masked.
        url: String,
        /// What is wrong and how to write it.
        reason: String,
    },
    /// Redis could not be reached, or refused the connection.
    #[error("cannot connect to redis at {target}: {source}; check that it runs and is reachable")]
    Connect {
        /// Where the store tried to connect, with any password masked.
        target: String,
        /// The client's error.
        #[source]
        source: redis::RedisError,
    },
    /// Connecting took longer than the connect timeout.
    #[error("connecting to redis at {target} took longer than {timeout:?}; check the address")]
    Timeout {
        /// Where the store tried to connect.
        target: String,
        /// The connect timeout.
        timeout: std::time::Duration,
    },
}
