//! A descriptor's `value` in Envoy's forms: empty is no value, a trailing `*` a prefix
//! wildcard, anything else an exact value.

use crate::model::ValueMatch;

/// Envoy's value forms: empty is no value, a trailing `*` is a prefix wildcard.
pub(super) fn value_match(value: &str) -> ValueMatch {
    if value.is_empty() {
        ValueMatch::Any
    } else if let Some(prefix) = value.strip_suffix('*') {
        ValueMatch::Prefix(prefix.to_owned())
    } else {
        ValueMatch::Exact(value.to_owned())
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
        assert_eq!(value_match("a*b"), ValueMatch::Exact("a*b".into()));
    }
}
