//! The shared backend suite, run against the memory store.

use std::time::Duration;

use sluice_core::testing::Backend;
use sluice_core::{FakeClock, MemoryStore, Timestamp};

struct Memory {
    clock: FakeClock,
    store: MemoryStore<FakeClock>,
}

impl Backend for Memory {
    type Store = MemoryStore<FakeClock>;

    fn store(&self) -> &Self::Store {
        &self.store
    }

    fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }
}

async fn memory() -> Memory {
    // An instant that is not aligned to any round window, so alignment bugs show.
    let clock = FakeClock::at(Timestamp::from_nanos(1_700_000_123_456_789_012));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    Memory { clock, store }
}

sluice_core::backend_suite!(memory());
