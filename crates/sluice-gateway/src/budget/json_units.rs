//! Reading a number of units at a [`JsonPath`] of a JSON document: the estimate in a request,
//! the usage in an answer.

use serde_json::Value;
use sluice_rules::{JsonPath, JsonStep};

/// The whole, non-negative number at `path` in the JSON text `bytes`; `None` when the text is
/// not JSON, or the path leads nowhere or to anything else (a fraction, a string, a negative).
pub(crate) fn units_in(bytes: &[u8], path: &JsonPath) -> Option<u64> {
    let document: Value = serde_json::from_slice(bytes).ok()?;
    units_at(&document, path)
}

/// The whole, non-negative number at `path` in `document`.
pub(crate) fn units_at(document: &Value, path: &JsonPath) -> Option<u64> {
    let mut at = document;
    for step in path.steps() {
        at = match step {
            JsonStep::Key(k) => at.as_object()?.get(k)?,
            JsonStep::Index(i) => at.as_array()?.get(*i)?,
        };
    }
    match at {
        Value::Number(n) => n.as_u64().or_else(|| {
            // `12.0` is a whole number written as a float, as some encoders write every number.
            let f = n.as_f64()?;
            (f >= 0.0 && f.fract() == 0.0 && f <= u64::MAX as f64).then_some(f as u64)
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> JsonPath {
        JsonPath::parse(p).unwrap()
    }

    #[test]
    fn whole_numbers_are_read_at_the_path_and_anything_else_is_none() {
        let doc = br#"{"usage":{"total_tokens":42,"f":7.0,"neg":-1,"frac":1.5,"s":"9"},
                       "choices":[{"n":1},{"n":2}]}"#;
        assert_eq!(units_in(doc, &path("usage.total_tokens")), Some(42));
        assert_eq!(units_in(doc, &path("$.usage.f")), Some(7));
        assert_eq!(units_in(doc, &path("choices[1].n")), Some(2));
        for missing in [
            "usage.neg",
            "usage.frac",
            "usage.s",
            "usage",
            "usage.nothing",
            "choices[2].n",
            "choices.n",
            "usage[0]",
        ] {
            assert_eq!(units_in(doc, &path(missing)), None, "{missing}");
        }
        assert_eq!(units_in(b"not json", &path("a")), None);
        assert_eq!(units_in(b"", &path("a")), None);
    }
}
