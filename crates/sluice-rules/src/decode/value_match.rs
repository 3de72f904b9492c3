//! A descriptor's `value` in Envoy's forms: empty is no value, a trailing `*` a prefix
//! wildcard, a `*` anywhere else a wildcard pattern, anything else an exact value.

use crate::model::ValueMatch;

/// Envoy's value forms: empty is no value, a lone trailing `*` is a prefix wildcard, and `*`s
/// elsewhere make a pattern.
pub(super) fn value_match(value: &str) -> ValueMatch {
    if value.is_empty() {
        return ValueMatch::Any;
    }
    match value.strip_suffix('*') {
        Some(prefix) if !prefix.contains('*') => ValueMatch::Prefix(prefix.to_owned()),
        _ if value.contains('*') => {
            ValueMatch::Pattern(value.split('*').map(str::to_owned).collect())
        }
        _ => ValueMatch::Exact(value.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_forms() {
        assert_eq!(value_match(""), ValueMatch::Any);
        assert_eq!(value_match("a*"), ValueMatch::Prefix("a".into()));
        assert_eq!(value_match("*"), ValueMatch::Prefix(String::new()));
        let parts = |p: &[&str]| ValueMatch::Pattern(p.iter().map(|s| (*s).to_owned()).collect());
        assert_eq!(value_match("a*b"), parts(&["a", "b"]));
        assert_eq!(value_match("/api/*/action"), parts(&["/api/", "/action"]));
        assert_eq!(value_match("foo*bar*baz"), parts(&["foo", "bar", "baz"]));
        assert_eq!(value_match("*bar*"), parts(&["", "bar", ""]));
        assert_eq!(value_match("ab"), ValueMatch::Exact("ab".into()));
    }

    #[test]
    fn patterns_match_as_envoy_matches_them() {
        let m = |pattern: &str, value: &str| match value_match(pattern) {
            ValueMatch::Pattern(parts) => ValueMatch::pattern_matches(&parts, value),
            other => panic!("{other:?}"),
        };
        assert!(m("/api/*/action", "/api/v1/action"));
        assert!(m("/api/*/action", "/api//action"));
        assert!(!m("/api/*/action", "/api/v1/other"));
        assert!(
            !m("/api/*/action", "/api/action"),
            "the parts may not overlap"
        );
        assert!(m("foo*bar*baz", "foobarbaz"));
        assert!(m("foo*bar*baz", "foo-x-bar-y-baz"));
        assert!(!m("foo*bar*baz", "foobazbar"));
        assert!(m("*bar*", "xbary"));
        assert!(!m("*bar*", "xbay"));
        assert!(m("a**b", "ab"));
    }
}
