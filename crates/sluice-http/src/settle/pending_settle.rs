//! A reservation a front end still has to settle. Whatever happens to the request, it is
//! settled once: with the usage read, or, when the request is dropped on the way (the client
//! went away while the upstream answered), in full.

use std::sync::Arc;

use sluice_core::{ReservationId, Settlement};
use sluice_limiter::Limiter;

/// A reservation of `reserved` units, not yet settled.
#[derive(Debug)]
pub struct PendingSettle {
    limiter: Arc<Limiter>,
    /// `None` once settled (or handed to the task that settles it).
    id: Option<ReservationId>,
    reserved: u64,
}

impl PendingSettle {
    /// The reservation `id` of `reserved` units, to settle through `limiter`.
    pub fn new(limiter: Arc<Limiter>, id: ReservationId, reserved: u64) -> Self {
        PendingSettle {
            limiter,
            id: Some(id),
            reserved,
        }
    }

    /// The units reserved.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Settles at `used` units, now.
    pub async fn settle(mut self, used: u64) {
        if let Some(id) = self.id.take() {
            settle(&self.limiter, &id, used, self.reserved).await;
        }
    }

    /// Settles at `used` units in a task of its own, for where nothing can wait (a body being
    /// dropped). Without a runtime to run it, the reservation expires, which counts it in full.
    pub fn settle_later(mut self, used: u64) {
        let Some(id) = self.id.take() else {
            return;
        };
        let reserved = self.reserved;
        let limiter = Arc::clone(&self.limiter);
        spawn(async move { settle(&limiter, &id, used, reserved).await });
    }
}

impl Drop for PendingSettle {
    /// A request dropped before it settled may have used everything it reserved.
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let (limiter, reserved) = (Arc::clone(&self.limiter), self.reserved);
            spawn(async move { settle(&limiter, &id, reserved, reserved).await });
        }
    }
}

/// Runs `task` on the current runtime, if there is one.
pub fn spawn(task: impl Future<Output = ()> + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(task);
        }
        Err(_) => tracing::warn!(
            "no runtime to settle a reservation on; it will count in full when its ttl ends"
        ),
    }
}

async fn settle(limiter: &Limiter, id: &ReservationId, used: u64, reserved: u64) {
    match limiter.settle(id, used).await {
        Ok(Settlement::Settled {
            refunded, charged, ..
        }) => {
            tracing::debug!(%id, reserved, used, refunded, charged, "reservation settled");
        }
        Ok(other) => {
            tracing::warn!(%id, reserved, used, outcome = ?other, "reservation not settled");
        }
        Err(e) => {
            tracing::warn!(%id, reserved, used, error = %e, "the store failed to settle a reservation; it will count in full when its ttl ends");
        }
    }
}
