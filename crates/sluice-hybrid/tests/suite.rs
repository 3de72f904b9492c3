//! The shared backend suite on the hybrid store, over the shared Redis server and the shared
//! Cluster. The store under test syncs before every call, so each decision is made on a state
//! that went through Redis; time moves by the fake clock (and Redis's by the store's offset
//! hook), never by sleeping.

use std::time::Duration;

use sluice_core::testing::Backend;
use sluice_core::{Check, Decision, FakeClock, Policy, Store, StoreResult, Timestamp};
use sluice_hybrid::{HybridOptions, HybridStore};
use sluice_redis::RedisStore;
use sluice_redis::testing::{
    offset_to_second_start, redis_time_nanos, shared_cluster, shared_server, test_options,
    unique_prefix,
};

/// A hybrid store that syncs with Redis before every call, unless a sync is already on its way
/// (as the background loop would be): so each decision is made on a state that went through
/// Redis, and concurrent callers do not queue behind one sync each.
struct Syncing(HybridStore<FakeClock>, tokio::sync::Mutex<()>);

impl Syncing {
    async fn sync(&self) {
        if let Ok(_one) = self.1.try_lock() {
            self.0.sync_now().await.expect("sync");
        }
    }
}

impl Store for Syncing {
    async fn check(&self, checks: &[Check<'_>]) -> StoreResult<Vec<Decision>> {
        self.sync().await;
        Store::check(&self.0, checks).await
    }

    async fn peek(&self, key: &str, policy: &Policy) -> StoreResult<Decision> {
        self.sync().await;
        Store::peek(&self.0, key, policy).await
    }

    async fn reset(&self, key: &str) -> StoreResult<bool> {
        Store::reset(&self.0, key).await
    }

    fn supports(&self, policy: &Policy) -> Result<(), sluice_core::UnsupportedPolicy> {
        Store::supports(&self.0, policy)
    }
}

struct Hybrid {
    clock: FakeClock,
    store: Syncing,
}

impl Backend for Hybrid {
    type Store = Syncing;

    fn store(&self) -> &Syncing {
        &self.store
    }

    fn advance(&self, d: Duration) {
        self.clock.advance(d);
        self.store.0.redis().advance_time(d);
    }
}

/// A hybrid store on the Redis at `url` (`port`: one of its servers). The fake clock starts
/// where the store's Redis time does, 20 ms into a second, as instances kept in time by NTP
/// would see it; both then move together.
async fn on(url: String, port: u16) -> Hybrid {
    let redis = RedisStore::connect(&url, test_options().prefix(unique_prefix()))
        .await
        .expect("connect");
    let offset = offset_to_second_start(port);
    redis.set_time_offset(offset);
    let start = redis_time_nanos(port) + offset;
    let clock = FakeClock::at(Timestamp::from_nanos(
        u64::try_from(start).expect("after 1970"),
    ));
    let store = HybridStore::with_clock(redis, HybridOptions::default(), clock.clone());
    Hybrid {
        clock,
        store: Syncing(store, tokio::sync::Mutex::new(())),
    }
}

mod standalone {
    use super::*;
    sluice_core::backend_suite!(on(shared_server().url(), shared_server().port));
}

mod cluster {
    use super::*;
    sluice_core::backend_suite!(on(shared_cluster().url(), shared_cluster().nodes[0].port));
}
