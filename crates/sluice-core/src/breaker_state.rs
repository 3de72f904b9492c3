//! A store's circuit breaker, as the service reports it: `/readyz` answers not ready while it is
//! open, and `/metrics` and the dashboard show it. A store that talks to a server over the
//! network keeps one (the Redis store does); the engine knows only this state, never the store.

/// A circuit breaker's state, for metrics and readiness probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls go to the store's server.
    Closed,
    /// Calls fail at once with `StoreError::Unavailable` until the cool-down ends.
    Open,
    /// One probe call is in flight; the others fail at once until it answers.
    HalfOpen,
}

impl BreakerState {
    /// Every state, in the order `/metrics` lists them.
    pub const ALL: [BreakerState; 3] = [
        BreakerState::Closed,
        BreakerState::Open,
        BreakerState::HalfOpen,
    ];

    /// A lower-case name for metrics labels: `closed`, `open` or `half_open`.
    pub fn name(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}
