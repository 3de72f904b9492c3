//! Reading a number of units at a [`JsonPath`] of a JSON document: the estimate in a request,
//! the usage in an answer.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use sluice_rules::{JsonPath, JsonStep};

/// The whole, non-negative number at `path` in the JSON text `bytes`; `None` when the text is
/// not JSON, or the path leads nowhere or to anything else (a fraction, a string, a negative).
///
/// The document is walked, not built: everything off the path is skipped without being kept,
/// so reading `max_tokens` from a request with a long prompt allocates nothing for the prompt.
pub(crate) fn units_in(bytes: &[u8], path: &JsonPath) -> Option<u64> {
    let mut document = serde_json::Deserializer::from_slice(bytes);
    let found = Seek(path.steps()).deserialize(&mut document).ok()?;
    document.end().ok()?;
    found
}

/// Whether an object's key is the one wanted, compared where it lies: no key is copied.
struct KeyIs<'k>(Option<&'k str>);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, key: &str) -> Result<bool, E> {
        Ok(self.0 == Some(key))
    }
}

/// Walks the rest of a path into the value being read: the units at its end, or `None`.
struct Seek<'p>(&'p [JsonStep]);

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = Option<u64>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<u64>, A::Error> {
        let wanted = match self.0.split_first() {
            Some((JsonStep::Key(k), rest)) => Some((k.as_str(), rest)),
            _ => None,
        };
        // The last of duplicate keys wins, as it does for most JSON readers.
        let mut found = None;
        while let Some(is_wanted) = map.next_key_seed(KeyIs(wanted.map(|(k, _)| k)))? {
            match wanted {
                Some((_, rest)) if is_wanted => found = map.next_value_seed(Seek(rest))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<u64>, A::Error> {
        let wanted = match self.0.split_first() {
            Some((JsonStep::Index(i), rest)) => Some((*i, rest)),
            _ => None,
        };
        let mut found = None;
        let mut index = 0usize;
        loop {
            let more = match wanted {
                Some((i, rest)) if i == index => seq
                    .next_element_seed(Seek(rest))?
                    .map(|units| found = units),
                _ => seq.next_element::<IgnoredAny>()?.map(|_| ()),
            };
            if more.is_none() {
                return Ok(found);
            }
            index = index.saturating_add(1);
        }
    }

    fn visit_u64<E>(self, n: u64) -> Result<Option<u64>, E> {
        Ok(self.0.is_empty().then_some(n))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Option<u64>, E> {
        Ok(u64::try_from(n).ok().filter(|_| self.0.is_empty()))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Option<u64>, E> {
        // `12.0` is a whole number written as a float, as some encoders write every number.
        let whole = f >= 0.0 && f.fract() == 0.0 && f <= u64::MAX as f64;
        Ok((whole && self.0.is_empty()).then_some(f as u64))
    }

    fn visit_str<E>(self, _: &str) -> Result<Option<u64>, E> {
        Ok(None)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Option<u64>, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Option<u64>, E> {
        Ok(None)
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
        assert_eq!(units_in(b"{\"a\":1} trailing", &path("a")), None);
        assert_eq!(units_in(b"{\"a\":1,\"a\":2}", &path("a")), Some(2));
        assert_eq!(
            units_in(br#"{"a\u0062":3}"#, &path("ab")),
            Some(3),
            "escaped key"
        );
        assert_eq!(units_in(b"[5,[6,7]]", &path("$[1][1]")), Some(7));
        assert_eq!(
            units_in(b"{\"a\":18446744073709551615}", &path("a")),
            Some(u64::MAX)
        );
        assert_eq!(units_in(b"", &path("a")), None);
    }
}
