//! Feeding the parser garbage: it must answer with errors, never panic. Also the counter-key
//! promise, stated as a property: different descriptors never share a key.

use proptest::prelude::*;
use sluice_rules::RuleSet;

const FIXTURES: &[&str] = &[
    include_str!("fixtures/envoy/nested.yaml"),
    include_str!("fixtures/envoy/wildcards.yaml"),
    include_str!("fixtures/envoy/accounts.yaml"),
    include_str!("fixtures/envoy/units.yaml"),
    include_str!("fixtures/sluice/extensions.yaml"),
];

/// Characters that matter to YAML, and a few that matter to the decoder.
const ALPHABET: &[char] = &[
    ' ', ' ', '\n', '\t', '-', ':', '[', ']', '{', '}', ',', '*', '&', '!', '|', '>', '\'', '"',
    '#', '%', '@', '?', '~', '.', '0', '1', '9', 'a', 'k', 'e', 'y', 's', 'é', '\u{0}', '\u{feff}',
];

fn garbage() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(ALPHABET), 0..400)
        .prop_map(|chars| chars.into_iter().collect())
}

#[derive(Debug, Clone)]
enum Edit {
    Insert(usize, char),
    Delete(usize, usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), prop::sample::select(ALPHABET)).prop_map(|(p, c)| Edit::Insert(p, c)),
        (any::<usize>(), 0usize..20).prop_map(|(p, n)| Edit::Delete(p, n)),
        any::<usize>().prop_map(Edit::DuplicateLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for e in edits {
        match *e {
            Edit::Insert(p, c) => {
                let p = p % (chars.len() + 1);
                chars.insert(p, c);
            }
            Edit::Delete(p, n) => {
                if !chars.is_empty() {
                    let p = p % chars.len();
                    let end = (p + n).min(chars.len());
                    chars.drain(p..end);
                }
            }
            Edit::DuplicateLine(i) | Edit::SwapLines(i, _) => {
                let s: String = chars.iter().collect();
                let mut lines: Vec<&str> = s.lines().collect();
                if lines.is_empty() {
                    continue;
                }
                let i = i % lines.len();
                match *e {
                    Edit::SwapLines(_, j) => {
                        let j = j % lines.len();
                        lines.swap(i, j);
                    }
                    _ => lines.insert(i, lines[i]),
                }
                chars = lines.join("\n").chars().collect();
            }
        }
    }
    chars.into_iter().collect()
}

/// Parsing must not panic, and whatever parses must match without panicking.
fn parse_and_match(text: &str) {
    if let Ok(rules) = RuleSet::parse("fuzz.yaml", text) {
        for domain in rules.domain_names() {
            for entries in [
                vec![("path", "/api/v1/x")],
                vec![("route", "checkout"), ("tenant", "acme")],
                vec![("account", "a"), ("tier", "gold")],
                vec![("user", "é|{}")],
            ] {
                let m = rules.checks(domain, &[entries], 1);
                for c in &m.checks {
                    assert!(c.key.len() <= sluice_rules::MAX_KEY_LEN);
                }
            }
        }
    } else if let Err(e) = RuleSet::parse("fuzz.yaml", text) {
        for err in e.errors() {
            assert!(err.location.line >= 1 && err.location.col >= 1, "{err}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn garbage_never_panics(text in garbage()) {
        parse_and_match(&text);
    }

    #[test]
    fn mutated_fixtures_never_panic(
        which in 0..FIXTURES.len(),
        edits in prop::collection::vec(edit(), 1..8),
    ) {
        parse_and_match(&apply(FIXTURES[which], &edits));
    }

    #[test]
    fn different_descriptors_never_share_a_key(
        a in prop::collection::vec(("[a-c|=%{}*:]{0,4}", "[a-c|=%{}*: ]{0,4}"), 1..4),
        b in prop::collection::vec(("[a-c|=%{}*:]{0,4}", "[a-c|=%{}*: ]{0,4}"), 1..4),
    ) {
        prop_assume!(a != b);
        // Key-only rules for every generated key at every depth, so both descriptors match.
        let keys: std::collections::BTreeSet<&str> =
            a.iter().chain(&b).map(|(k, _)| k.as_str()).filter(|k| !k.is_empty()).collect();
        prop_assume!(a.iter().chain(&b).all(|(k, _)| !k.is_empty()));
        // Three levels (the longest descriptor generated) of key-only rules for every key.
        let mut text = String::from("domain: d\ndescriptors:\n");
        fn nest(text: &mut String, depth: usize, keys: &[&str]) {
            let pad = "    ".repeat(depth);
            for k in keys {
                text.push_str(&format!("{pad}  - key: {k:?}\n{pad}    rate_limit: {{unit: second, requests_per_unit: 1}}\n"));
                if depth < 2 {
                    text.push_str(&format!("{pad}    descriptors:\n"));
                    nest(text, depth + 1, keys);
                }
            }
        }
        let keys: Vec<&str> = keys.into_iter().collect();
        nest(&mut text, 0, &keys);
        let rules = RuleSet::parse("p.yaml", &text).unwrap();
        let ka = rules.checks("d", std::slice::from_ref(&a), 1);
        let kb = rules.checks("d", std::slice::from_ref(&b), 1);
        prop_assert_eq!(ka.checks.len(), 1, "{:?}", a);
        prop_assert_eq!(kb.checks.len(), 1, "{:?}", b);
        prop_assert_ne!(&ka.checks[0].key, &kb.checks[0].key);
    }
}
