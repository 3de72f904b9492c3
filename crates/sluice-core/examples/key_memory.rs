//! Bytes of resident memory per tracked key at 1M keys: the memory store with token-bucket and
//! GCRA keys, and governor's keyed limiter on the same keys as the baseline.
//!
//! ```text
//! cargo run --release -p sluice-core --example key_memory [-- KEYS]
//! ```
//!
//! Each measurement runs in a child process of its own, so memory one structure freed cannot
//! flatter the next: the child reads its resident set size from `/proc/self/statm`, inserts the
//! keys, reads it again and prints the difference. Linux only. `docs/BENCHMARKS.md` records the
//! results.

use std::num::NonZeroU32;
use std::process::Command;
use std::time::Duration;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use sluice_core::{Check, DEFAULT_MAX_KEYS, Gcra, MemoryStore, Policy, Rate, TokenBucket};

/// What the children measure, by the name passed to them.
const SUBJECTS: [&str; 3] = ["sluice_token_bucket", "sluice_gcra", "governor_keyed"];

fn main() {
    let mut args = std::env::args().skip(1);
    match (args.next(), args.next()) {
        (Some(subject), Some(keys)) if subject.starts_with("--child=") => {
            let keys = keys.parse().expect("the key count is a whole number");
            child(&subject["--child=".len()..], keys);
        }
        (keys, None) => {
            let keys = keys.map_or(1_000_000, |k| k.parse().expect("KEYS is a whole number"));
            parent(keys);
        }
        _ => panic!("usage: key_memory [KEYS]"),
    }
}

fn parent(keys: usize) {
    let me = std::env::current_exe().expect("the example can find its own binary");
    println!(
        "{:<22} {:>10} {:>14} {:>10}",
        "structure", "keys", "RSS growth", "bytes/key"
    );
    for subject in SUBJECTS {
        let out = Command::new(&me)
            .arg(format!("--child={subject}"))
            .arg(keys.to_string())
            .output()
            .expect("the measurement child runs");
        assert!(
            out.status.success(),
            "{subject}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
}

fn child(subject: &str, keys: usize) {
    // 100 an hour: one request takes 36 s to refill, so no key expires while the keys go in.
    let hourly = Rate::new(100, Duration::from_secs(3600)).expect("a non-zero period");
    let before = resident_bytes();
    let tracked = match subject {
        "sluice_token_bucket" => fill_sluice(keys, TokenBucket::new(100, hourly).unwrap().into()),
        "sluice_gcra" => fill_sluice(keys, Gcra::new(hourly, 100).unwrap().into()),
        "governor_keyed" => fill_governor(keys),
        other => panic!("unknown subject {other}"),
    };
    let after = resident_bytes();
    assert_eq!(tracked, keys, "{subject}: keys were evicted");
    let grown = after.saturating_sub(before);
    println!(
        "{subject:<22} {keys:>10} {:>11.1} MB {:>10.1}",
        grown as f64 / 1e6,
        grown as f64 / keys as f64
    );
}

/// Inserts `keys` keys into a memory store under `policy` and returns how many it tracks. The
/// store holds fingerprints, not strings, so the key text is built in one reused buffer.
fn fill_sluice(keys: usize, policy: Policy) -> usize {
    // 1M keys fit the default limit of 2^20. Each shard holds only its share of the limit, so
    // more keys get twice the room they need, lest the fullest shards evict.
    let max_keys = match keys {
        k if k <= DEFAULT_MAX_KEYS => DEFAULT_MAX_KEYS,
        k => k.saturating_mul(2),
    };
    let store = MemoryStore::builder().max_keys(max_keys).build();
    let mut key = String::new();
    for n in 0..keys {
        write_key(&mut key, n);
        let d = store.check_one(Check::new(&key, &policy, 1));
        assert!(d.is_ok_and(|d| d.allowed));
    }
    let tracked = store.len();
    std::mem::forget(store); // measured; no need to pay for freeing it
    tracked
}

/// Inserts `keys` keys into governor's keyed limiter, which stores its own copy of each key.
fn fill_governor(keys: usize) -> usize {
    let quota = Quota::with_period(Duration::from_secs(36))
        .expect("a non-zero period")
        .allow_burst(NonZeroU32::new(100).expect("non-zero"));
    let limiter: DefaultKeyedRateLimiter<String> = RateLimiter::keyed(quota);
    let mut key = String::new();
    for n in 0..keys {
        write_key(&mut key, n);
        assert!(limiter.check_key(&key).is_ok());
    }
    let tracked = limiter.len();
    std::mem::forget(limiter);
    tracked
}

/// Writes `user:{n}` into `buf`, reusing its allocation.
fn write_key(buf: &mut String, n: usize) {
    use std::fmt::Write;
    buf.clear();
    write!(buf, "user:{n}").expect("writing to a String cannot fail");
}

/// This process's resident set size in bytes: the second field of `/proc/self/statm`, in pages.
fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .expect("statm's second field is the resident page count");
    pages * page_size()
}

/// The page size, from the kernel's auxiliary vector (`AT_PAGESZ`), so no libc call is needed.
fn page_size() -> usize {
    const AT_PAGESZ: u64 = 6;
    let auxv = std::fs::read("/proc/self/auxv").expect("Linux /proc/self/auxv");
    auxv.chunks_exact(16)
        .map(|pair| {
            let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().expect("8 bytes"));
            (word(&pair[..8]), word(&pair[8..]))
        })
        .find(|(key, _)| *key == AT_PAGESZ)
        .map_or(4096, |(_, size)| size as usize)
}
