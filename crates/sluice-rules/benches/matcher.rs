//! The matcher with 10,000 rules and a 32-level nesting, against two baselines measured in the
//! same run: one `HashMap` lookup of a prebuilt key (the floor of any indexed matcher), and a
//! linear scan over the same 10,000 rules (what an unindexed matcher pays).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_rules::RuleSet;

const TENANTS: usize = 1_000;
const ROUTES: usize = 9;
const DEPTH: usize = 32;

/// 1,000 tenants with a limit each and 9 routes under each (10,000 limited rules), 50 path
/// wildcards with a key-only fallback, and a 32-level chain.
fn rules_text() -> String {
    let mut t = String::from("domain: bench\ndescriptors:\n");
    for i in 0..TENANTS {
        let _ = write!(
            t,
            "  - key: tenant\n    value: t{i}\n    rate_limit: {{unit: minute, requests_per_unit: {}}}\n    descriptors:\n",
            100 + i
        );
        for r in 0..ROUTES {
            let _ = write!(
                t,
                "      - key: route\n        value: r{r}\n        limits:\n          - {{algorithm: gcra, unit: second, requests_per_unit: 10}}\n          - {{window: 1d, requests_per_unit: 10000}}\n"
            );
        }
    }
    for p in 0..50 {
        let _ = write!(
            t,
            "  - key: path\n    value: /api/v{p}/{}*\n    rate_limit: {{unit: second, requests_per_unit: 5}}\n",
            "x".repeat(p % 7)
        );
    }
    t.push_str("  - key: path\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
    let mut pad = String::from("  ");
    for d in 0..DEPTH {
        let _ = write!(
            t,
            "{pad}- key: l{d}\n{pad}  value: v\n{pad}  rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        );
        if d + 1 < DEPTH {
            let _ = writeln!(t, "{pad}  descriptors:");
            pad.push_str("    ");
        }
    }
    t
}

fn bench(c: &mut Criterion) {
    let text = rules_text();
    let rules = RuleSet::parse("bench.yaml", &text).expect("bench rules load");

    let mut g = c.benchmark_group("rules_matcher");
    let exact = [("tenant", "t517"), ("route", "r4")];
    g.bench_function("exact_2_levels_2_limits", |b| {
        b.iter(|| rules.checks(black_box("bench"), black_box(&[exact]), 1))
    });
    let tenant_only = [("tenant", "t999")];
    g.bench_function("exact_1_level", |b| {
        b.iter(|| rules.checks(black_box("bench"), black_box(&[tenant_only]), 1))
    });
    let miss = [("tenant", "nobody"), ("route", "r4")];
    g.bench_function("miss", |b| {
        b.iter(|| rules.checks(black_box("bench"), black_box(&[miss]), 1))
    });
    let wildcard = [("path", "/api/v43/xxxxorders")];
    g.bench_function("wildcard_50_prefixes", |b| {
        b.iter(|| rules.checks(black_box("bench"), black_box(&[wildcard]), 1))
    });
    let deep: Vec<(String, &str)> = (0..DEPTH).map(|d| (format!("l{d}"), "v")).collect();
    g.bench_function("deep_32_levels", |b| {
        b.iter(|| {
            rules.checks(
                black_box("bench"),
                black_box(std::slice::from_ref(&deep)),
                1,
            )
        })
    });
    let request = [
        vec![("tenant", "t3")],
        vec![("tenant", "t3"), ("route", "r8")],
        vec![("path", "/api/v2/xxorders")],
    ];
    g.bench_function("request_3_descriptors_4_limits", |b| {
        b.iter(|| rules.checks(black_box("bench"), black_box(&request), 1))
    });

    // Baselines over the same 10,000 (tenant, route) rules.
    let flat: Vec<(String, String)> = (0..TENANTS)
        .flat_map(|i| (0..ROUTES).map(move |r| (format!("t{i}"), format!("r{r}"))))
        .collect();
    let map: HashMap<String, u64> = flat
        .iter()
        .enumerate()
        .map(|(n, (t, r))| (format!("tenant={t}|route={r}"), n as u64))
        .collect();
    g.bench_function("baseline_hashmap_lookup", |b| {
        b.iter(|| map.get(black_box("tenant=t517|route=r4")))
    });
    g.bench_function("baseline_linear_scan_10k", |b| {
        b.iter(|| {
            let (t, r) = black_box(("t517", "r4"));
            flat.iter().position(|(ft, fr)| ft == t && fr == r)
        })
    });
    g.finish();

    let mut g = c.benchmark_group("rules_load");
    g.sample_size(10);
    g.bench_function("parse_10k_rules", |b| {
        b.iter(|| RuleSet::parse("bench.yaml", black_box(&text)).map(|r| r.fingerprint()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
