//! A flood of a million distinct keys against a memory store capped at 100,000: the store stays
//! at its cap, its resident memory stays under a stated bound, and a key limited before the
//! flood is still limited after it. Alone in its test binary, so the memory it measures is its
//! own.

use std::time::Duration;

use sluice_core::{Alignment, Check, FakeClock, FixedWindow, MemoryStore, Policy, Timestamp};

/// Resident memory of this process, in bytes (`VmRSS` of /proc/self/status).
fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[test]
fn a_million_new_keys_neither_grow_the_store_nor_free_a_limited_key() {
    const CAP: usize = 100_000;
    // What 100,000 counters may cost at most, table overhead included: far above the ~100 bytes
    // a counter takes (docs/BENCHMARKS.md), far below what a million would.
    const MEMORY_BOUND: u64 = 64 << 20;
    let clock = FakeClock::at(Timestamp::from_secs(1_700_000_000));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .max_keys(CAP)
        .build();
    let hour: Policy = FixedWindow::new(1, Duration::from_secs(3600), Alignment::FirstRequest)
        .unwrap()
        .into();
    // The victim uses its one request an hour: limited.
    assert!(
        store
            .check_one(Check::new("victim", &hour, 1))
            .unwrap()
            .allowed
    );
    assert!(
        !store
            .check_one(Check::new("victim", &hour, 1))
            .unwrap()
            .allowed
    );

    // Each flood key uses one of its two requests: admitted with room left, so never limited
    // and always evictable.
    let flood_policy: Policy =
        FixedWindow::new(2, Duration::from_secs(3600), Alignment::FirstRequest)
            .unwrap()
            .into();
    let before = resident();
    let mut key = String::with_capacity(16);
    for i in 0..1_000_000u32 {
        key.clear();
        key.push_str("flood:");
        key.push_str(&i.to_string());
        let d = store.check_one(Check::new(&key, &flood_policy, 1)).unwrap();
        assert!(d.allowed);
        if i % 100_000 == 0 {
            clock.advance(Duration::from_millis(1));
        }
    }
    let grown = resident().saturating_sub(before);
    println!(
        "1,000,000 keys into a store of {CAP}: {} held, resident memory +{:.1} MiB",
        store.len(),
        grown as f64 / f64::from(1 << 20)
    );
    assert!(store.len() <= CAP + 1024, "{} keys held", store.len());
    assert!(
        grown < MEMORY_BOUND,
        "resident memory grew by {grown} bytes"
    );
    let d = store.check_one(Check::new("victim", &hour, 1)).unwrap();
    assert!(!d.allowed, "the flood freed a limited key");
}
