//! Envoy-style rule files load and match as envoyproxy/ratelimit's documentation describes.

use std::path::PathBuf;
use std::time::Duration;

use sluice_core::{Alignment, FakeClock, MemoryStore, Policy, Store, Timestamp};
use sluice_rules::{Action, DescriptorEntries, MatchedCheck, Matches, RuleSet};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/envoy")
}

fn rules() -> RuleSet {
    RuleSet::load(&fixtures()).unwrap_or_else(|e| panic!("fixtures must load:\n{e}"))
}

fn one(rules: &RuleSet, domain: &str, entries: &[(&str, &str)]) -> Matches {
    rules.checks(domain, &[entries], 1)
}

/// The (limit, window) of a single matched fixed-window limit aligned on the epoch.
fn epoch_window(check: &MatchedCheck) -> (u64, Duration) {
    match &*check.rule.policy {
        Policy::FixedWindow(p) => {
            assert_eq!(p.alignment(), Alignment::Clock { utc_offset_secs: 0 });
            (p.limit(), p.window())
        }
        other => panic!("Envoy limits are epoch-aligned fixed windows, got {other:?}"),
    }
}

fn only(m: &Matches) -> &MatchedCheck {
    assert_eq!(m.checks.len(), 1, "{m:#?}");
    &m.checks[0]
}

#[test]
fn a_directory_loads_as_a_set_of_domains() {
    assert_eq!(
        rules().domain_names(),
        ["accounts", "edge_proxy", "paths", "units"]
    );
}

#[test]
fn every_unit_is_a_fixed_epoch_window_with_envoys_lengths() {
    let rules = rules();
    let day = 86_400;
    let expected = [
        ("second", 1, 1),
        ("minute", 2, 60),
        ("hour", 3, 3_600),
        ("day", 4, day),
        ("week", 5, 7 * day),
        ("month", 6, 30 * day),
        ("year", 7, 365 * day),
    ];
    for (unit, limit, secs) in expected {
        let m = one(&rules, "units", &[("unit", unit)]);
        assert_eq!(
            epoch_window(only(&m)),
            (limit, Duration::from_secs(secs)),
            "{unit}"
        );
    }
}

#[test]
fn key_only_rules_count_each_value_apart() {
    let rules = rules();
    let a = one(&rules, "edge_proxy", &[("remote_address", "10.0.0.1")]);
    let b = one(&rules, "edge_proxy", &[("remote_address", "10.0.0.2")]);
    assert_eq!(epoch_window(only(&a)), (60, Duration::from_secs(60)));
    assert_ne!(only(&a).key, only(&b).key);
    assert!(
        only(&a)
            .key
            .starts_with("{edge_proxy|remote_address=10.0.0.1}:")
    );
}

#[test]
fn nested_rules_apply_where_the_descriptor_ends() {
    let rules = rules();
    let route = one(&rules, "edge_proxy", &[("route", "checkout")]);
    assert_eq!(epoch_window(only(&route)), (100, Duration::from_secs(1)));

    let tenant = one(
        &rules,
        "edge_proxy",
        &[("route", "checkout"), ("tenant", "globex")],
    );
    assert_eq!(
        epoch_window(only(&tenant)),
        (1000, Duration::from_secs(3600))
    );

    // The value-specific sibling wins over the key-only one.
    let acme = one(
        &rules,
        "edge_proxy",
        &[("route", "checkout"), ("tenant", "acme")],
    );
    assert_eq!(
        epoch_window(only(&acme)),
        (50_000, Duration::from_secs(3600))
    );

    // A route other than checkout falls to the key-only route rule, which has no limit itself...
    assert!(
        one(&rules, "edge_proxy", &[("route", "search")])
            .checks
            .is_empty()
    );
    // ...but limits its POSTs.
    let post = one(
        &rules,
        "edge_proxy",
        &[("route", "search"), ("method", "POST")],
    );
    assert_eq!(epoch_window(only(&post)), (20, Duration::from_secs(86_400)));
    // The walk does not backtrack: checkout picked the exact rule, which has no `method` child.
    assert!(
        one(
            &rules,
            "edge_proxy",
            &[("route", "checkout"), ("method", "POST")]
        )
        .checks
        .is_empty()
    );
}

#[test]
fn descriptors_longer_or_shorter_than_the_rules_are_not_limited() {
    let rules = rules();
    let longer = [("remote_address", "10.0.0.1"), ("path", "/")];
    assert!(one(&rules, "edge_proxy", &longer).checks.is_empty());
    assert!(
        one(&rules, "edge_proxy", &[("method", "POST")])
            .checks
            .is_empty()
    );
    assert!(one(&rules, "edge_proxy", &[]).checks.is_empty());
}

#[test]
fn unknown_domains_and_keys_are_not_limited() {
    let rules = rules();
    assert!(
        one(&rules, "nope", &[("remote_address", "x")])
            .checks
            .is_empty()
    );
    assert!(
        one(&rules, "edge_proxy", &[("unknown", "x")])
            .checks
            .is_empty()
    );
}

#[test]
fn wildcards_match_prefixes_longest_first_and_exact_values_win() {
    let rules = rules();
    let v1 = one(&rules, "paths", &[("path", "/api/v1/orders")]);
    assert_eq!(epoch_window(only(&v1)).0, 30);
    let admin = one(&rules, "paths", &[("path", "/api/v1/admin/users")]);
    assert_eq!(epoch_window(only(&admin)).0, 5);
    let health = one(&rules, "paths", &[("path", "/api/v1/health")]);
    assert!(health.checks.is_empty());
    assert_eq!(health.unlimited, [0]);
    let other = one(&rules, "paths", &[("path", "/about")]);
    assert_eq!(epoch_window(only(&other)).0, 10);
    // Without share_threshold, each value matched by a wildcard has its own counter.
    let v2 = one(&rules, "paths", &[("path", "/api/v1/users")]);
    assert_ne!(only(&v1).key, only(&v2).key);
}

#[test]
fn share_threshold_gives_every_wildcard_value_one_counter() {
    let rules = rules();
    let a = one(&rules, "paths", &[("path", "/static/app.js")]);
    let b = one(&rules, "paths", &[("path", "/static/img/logo.png")]);
    assert_eq!(only(&a).key, only(&b).key);
    assert!(only(&a).key.starts_with("{paths|path=/static/*}:"));
    // A literal value `/static/*` cannot collide with the shared pattern.
    let literal = one(&rules, "paths", &[("path", "/static/*")]);
    assert_eq!(
        only(&literal).key,
        only(&a).key,
        "it matches the wildcard, so it shares"
    );
    let lookalike = one(&rules, "paths", &[("path", "/static*")]);
    assert_eq!(epoch_window(only(&lookalike)).0, 10);
    assert!(only(&lookalike).key.contains("path=/static%2A}"));
}

#[test]
fn replaces_removes_the_named_limit_from_the_request() {
    let rules = rules();
    let account = [("account", "a1")];
    let gold = [("account", "a1"), ("tier", "gold")];
    let silver = [("account", "a1"), ("tier", "silver")];

    let m = rules.checks("accounts", &[&account[..], &gold[..]], 1);
    assert_eq!(epoch_window(only(&m)).0, 5000);
    assert_eq!(only(&m).descriptor, 1);

    let m = rules.checks("accounts", &[&account[..], &silver[..]], 1);
    assert_eq!(epoch_window(only(&m)).0, 100);
    assert_eq!(only(&m).rule.name.as_deref(), Some("per_account"));
}

#[test]
fn shadow_mode_and_detailed_metric_are_carried_to_the_check() {
    let rules = rules();
    let m = one(&rules, "accounts", &[("experiment", "stricter_search")]);
    let rule = &only(&m).rule;
    assert!(rule.shadow);
    assert!(rule.detailed_metric);
    assert_eq!(rule.action, Action::Reject);
    assert_eq!(&*rule.path, "accounts/experiment=stricter_search");
    let m = one(&rules, "accounts", &[("account", "a1")]);
    assert!(!only(&m).rule.shadow);
}

#[test]
fn unlimited_yields_no_check() {
    let rules = rules();
    let m = one(&rules, "accounts", &[("user", "ops-bot")]);
    assert!(m.checks.is_empty());
    assert_eq!(m.unlimited, [0]);
}

/// A request descriptor with a cost of its own, as Envoy's `hits_addend` gives one. The engine's
/// descriptor type lives in another crate; the matcher reads any [`DescriptorEntries`].
struct Costed {
    entries: [(&'static str, &'static str); 1],
    cost: Option<u64>,
}

impl DescriptorEntries for Costed {
    fn entry_count(&self) -> usize {
        self.entries.len()
    }
    fn entry(&self, i: usize) -> (&str, &str) {
        self.entries[i]
    }
    fn cost(&self) -> Option<u64> {
        self.cost
    }
}

#[test]
fn costs_come_from_the_descriptor_or_the_request() {
    let rules = rules();
    let own = Costed {
        entries: [("account", "a1")],
        cost: Some(7),
    };
    let plain = Costed {
        entries: [("account", "a2")],
        cost: None,
    };
    let m = rules.checks("accounts", &[own, plain], 3);
    assert_eq!(m.checks.iter().map(|c| c.cost).collect::<Vec<_>>(), [7, 3]);
}

/// The matched checks go straight into a store: Envoy's windows are aligned on the epoch, and
/// `requests_per_unit: 0` blocks outright.
#[test]
fn matched_checks_decide_in_a_store_like_envoy() {
    let rules = rules();
    // 30 seconds into a minute.
    let clock = FakeClock::at(Timestamp::from_secs(1_700_000_010));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let m = one(&rules, "edge_proxy", &[("remote_address", "10.1.1.1")]);
        let checks: Vec<_> = m.checks.iter().map(MatchedCheck::as_check).collect();
        for _ in 0..60 {
            assert!(store.check(&checks).await.unwrap()[0].allowed);
        }
        let denied = store.check(&checks).await.unwrap()[0];
        assert!(!denied.allowed);
        // The window ends on the minute, not 60s after the first request.
        assert_eq!(denied.retry_after, Duration::from_secs(30));
        clock.advance(Duration::from_secs(30));
        assert!(store.check(&checks).await.unwrap()[0].allowed);

        let banned = one(&rules, "accounts", &[("user", "banned-user")]);
        let checks: Vec<_> = banned.checks.iter().map(MatchedCheck::as_check).collect();
        assert!(!store.check(&checks).await.unwrap()[0].allowed);
    });
}

#[test]
fn wildcards_anywhere_in_a_value_match_as_envoy_matches_them() {
    let rules = sluice_rules::RuleSet::parse(
        "w.yaml",
        r#"domain: w
descriptors:
  - key: path
    value: "/api/*/action"
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: "/api/*"
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: name
    value: "foo*bar*baz"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let limit = |key: &str, value: &str| {
        let m = rules.checks("w", &[[(key, value)]], 1);
        m.checks
            .first()
            .map(|c| (c.rule.policy.limit(), c.key.clone()))
    };
    // The longest prefix wins over a pattern, as envoy prefers its longer match.
    assert_eq!(limit("path", "/api/v1/other").map(|l| l.0), Some(2));
    assert_eq!(limit("path", "/api/x").map(|l| l.0), Some(2));
    // A middle wildcard, where no prefix reaches: the pattern.
    let rules_mid = sluice_rules::RuleSet::parse(
        "m.yaml",
        "domain: m\ndescriptors:\n  - key: path\n    value: \"/api/*/action\"\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )
    .unwrap();
    let m = |v: &str| rules_mid.checks("m", &[[("path", v)]], 1).checks.len();
    assert_eq!(
        (m("/api/v1/action"), m("/api/v1/other"), m("/api/action")),
        (1, 0, 0)
    );
    // Several wildcards, with share_threshold: every matching value shares one counter.
    let (a, b) = (
        limit("name", "foo1bar2baz").unwrap(),
        limit("name", "fooXbarYbaz").unwrap(),
    );
    assert_eq!(a.0, 3);
    assert_eq!(a.1, b.1, "share_threshold: one counter for the pattern");
    assert_eq!(limit("name", "foobazbar"), None);
}

#[test]
fn quota_mode_metadata_and_value_to_metric_are_read_onto_the_rule() {
    let rules = RuleSet::parse(
        "quota.yaml",
        r#"
domain: rl
descriptors:
  - key: service
    value: gold
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota: {name: "gold", weight: 2, tags: [a, 0x10], off: false, none: ~}
  - key: team
    value_to_metric: true
    descriptors:
      - key: path
        value: /api/*
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let gold = only(&one(&rules, "rl", &[("service", "gold")]))
        .rule
        .clone();
    assert!(gold.quota);
    use sluice_rules::MetaValue as M;
    let expected = vec![(
        "service_with_quota".to_owned(),
        M::Map(vec![
            ("name".into(), M::String("gold".into())),
            ("weight".into(), M::Number(2.0)),
            (
                "tags".into(),
                M::List(vec![M::String("a".into()), M::Number(16.0)]),
            ),
            ("off".into(), M::Bool(false)),
            ("none".into(), M::Null),
        ]),
    )];
    assert_eq!(gold.metadata.as_deref(), Some(&expected));

    // value_to_metric on the key-only level puts the request's value there; the wildcard
    // level below keeps its pattern; a rule without either keeps its path.
    let entries = [("team", "red"), ("path", "/api/v1")];
    let team = only(&one(&rules, "rl", &entries)).rule.clone();
    assert_eq!(
        team.metric_label(&entries[..]).as_deref(),
        Some("rl/team=red/path=/api/*")
    );
    let plain = only(&one(&rules, "rl", &[("plain", "x")])).rule.clone();
    assert_eq!(plain.metric_label(&[("plain", "x")][..]), None);
    assert!(!plain.quota && plain.metadata.is_none());
}

#[test]
fn detailed_metric_names_every_value_but_a_shared_wildcards_pattern() {
    let rules = RuleSet::parse(
        "detailed.yaml",
        r#"
domain: rl
descriptors:
  - key: files
    value: "docs/*"
    share_threshold: true
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
"#,
    )
    .unwrap();
    let entries = [("files", "docs/a.pdf"), ("user", "alice")];
    let rule = only(&one(&rules, "rl", &entries)).rule.clone();
    assert_eq!(
        rule.metric_label(&entries[..]).as_deref(),
        Some("rl/files=docs/*/user=alice")
    );
}

/// The statistics key of the one limit `entries` match in domain `rl` of `rules`.
fn stat_key(rules: &RuleSet, entries: &[(&str, &str)]) -> String {
    let mut key = String::new();
    only(&one(rules, "rl", entries))
        .rule
        .write_stat_key(entries, &mut key);
    key
}

#[test]
fn statistics_keys_take_envoys_shape() {
    let rules = RuleSet::parse(
        "stats.yaml",
        r#"
domain: rl
descriptors:
  - key: route
    value: api
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: team
    value_to_metric: true
    descriptors:
      - key: path
        value: /api/*
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: method
    value: GET*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: files
    value: "docs/*"
    share_threshold: true
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: client
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // Without either flag: the rule's own levels, a value only where the rule names one.
    assert_eq!(
        stat_key(&rules, &[("route", "api"), ("user", "alice")]),
        "rl.route_api.user"
    );
    // value_to_metric puts the request's value on a key-only level, and on a wildcard one.
    assert_eq!(
        stat_key(&rules, &[("team", "red"), ("path", "/api/v1")]),
        "rl.team_red.path_/api/*"
    );
    assert_eq!(stat_key(&rules, &[("method", "GETX")]), "rl.method_GETX");
    // detailed_metric names every value but a shared wildcard's pattern.
    assert_eq!(
        stat_key(&rules, &[("files", "docs/a.pdf"), ("user", "bob")]),
        "rl.files_docs/*.user_bob"
    );
    // A detailed level keeps Envoy's `key_` for an empty value.
    assert_eq!(stat_key(&rules, &[("client", "")]), "rl.client_");
}

#[test]
fn metadata_that_is_not_a_mapping_is_refused_where_it_is() {
    for (text, at, says) in [
        (
            "domain: d\ndescriptors:\n  - key: k\n    metadata: [a]\n",
            "m.yaml:4:15",
            "`metadata` must be a mapping",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    metadata: {a: 1, a: 2}\n",
            "m.yaml:4:22",
            "metadata.a",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    quota_mode: maybe\n",
            "m.yaml:4:17",
            "quota_mode",
        ),
        // As Envoy refuses it: share_threshold only means something on a wildcard.
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
            "m.yaml:5:22",
            "has no `*`",
        ),
    ] {
        let e = RuleSet::parse("m.yaml", text).unwrap_err().to_string();
        assert!(e.starts_with(at) && e.contains(says), "{e}");
    }
}

#[test]
fn files_of_one_domain_merge_only_when_asked() {
    use sluice_rules::LoadOptions;
    let first = (
        "a.yaml",
        "domain: d\ndescriptors:\n  - key: one\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    let second = (
        "b.yaml",
        "domain: d\ndescriptors:\n  - key: two\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
    );
    let e = RuleSet::from_sources([first, second])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("b.yaml:1:9: domain `d` is already defined at a.yaml:1:9"),
        "{e}"
    );

    let merge = LoadOptions {
        merge_domains: true,
    };
    let rules = RuleSet::from_sources_with([first, second], merge).unwrap();
    assert_eq!(epoch_window(only(&one(&rules, "d", &[("one", "x")]))).0, 1);
    assert_eq!(epoch_window(only(&one(&rules, "d", &[("two", "x")]))).0, 2);

    // A top-level descriptor in both files is refused, naming both places.
    let again = (
        "c.yaml",
        "domain: d\ndescriptors:\n  - key: one\n    rate_limit: {unit: hour, requests_per_unit: 9}\n",
    );
    let e = RuleSet::from_sources_with([first, second, again], merge)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("c.yaml:3:5: duplicate descriptor `one` (no value) in domain `d`; the first is at a.yaml:3:5"),
        "{e}"
    );
}
