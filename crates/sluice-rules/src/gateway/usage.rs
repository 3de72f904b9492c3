//! A route's token budget: what `sluice proxy` reserves before forwarding a request, and where
//! it reads what the request really used, so that it settles the reservation. See
//! `docs/usage-limits.md`, "Gateway".

use std::fmt;
use std::time::Duration;

/// Request bodies read for an estimate are at most this large unless a route says otherwise:
/// large enough for a long prompt, small enough that a few hundred uploads at once fit in memory.
pub const DEFAULT_MAX_BODY: u64 = 4 * 1024 * 1024;

/// How a route reserves and settles usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteUsage {
    /// Where the estimate comes from.
    pub reserve: ReserveFrom,
    /// Where the real usage is read in the answer: the JSON body, or each event of a
    /// `text/event-stream` answer.
    pub settle: JsonPath,
    /// How long the reservation holds; the limiter's default when `None`.
    pub ttl: Option<Duration>,
}

/// The estimate a request reserves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveFrom {
    /// The field of the JSON request body that holds the estimate, such as `max_tokens`.
    /// `None` reserves `default` for every request, and leaves the body unread.
    pub from: Option<JsonPath>,
    /// The estimate of a request whose body lacks the field, or is not JSON.
    pub default: u64,
    /// The largest estimate: a larger field reserves this much, and usage beyond it is charged
    /// when the request settles.
    pub max: u64,
    /// The largest request body read for the estimate, in bytes; a larger one is refused
    /// with `413`, so that reading it cannot take unbounded memory.
    pub max_body: u64,
}

/// A path into a JSON document: object keys and array indices, written `usage.total_tokens`,
/// `$.usage.total_tokens` or `choices[0].usage.total_tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPath {
    segments: Vec<JsonStep>,
}

/// One step of a [`JsonPath`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonStep {
    /// The field of an object.
    Key(String),
    /// The element of an array.
    Index(usize),
}

impl JsonPath {
    /// How paths are written, for error messages.
    pub const FORM: &'static str = "a JSON path such as `usage.total_tokens`, `$.max_tokens` or \
                                    `choices[0].usage.total_tokens`: keys separated by dots, \
                                    array indices in brackets";

    /// Parses `usage.total_tokens`, with an optional leading `$` or `$.`. `None` for an empty
    /// path, an empty key, or a bracket that does not hold an index.
    pub fn parse(text: &str) -> Option<JsonPath> {
        let rest = text.strip_prefix('$').unwrap_or(text);
        let rest = rest.strip_prefix('.').unwrap_or(rest);
        let mut segments = Vec::new();
        for part in rest.split('.') {
            let (key, mut indices) = match part.find('[') {
                Some(at) => (&part[..at], &part[at..]),
                None => (part, ""),
            };
            if !key.is_empty() {
                segments.push(JsonStep::Key(key.to_owned()));
            } else if !segments.is_empty() || indices.is_empty() {
                // Only `$[0].x`, an index into a top-level array, starts without a key.
                return None;
            }
            while !indices.is_empty() {
                let close = indices.find(']')?;
                let index = indices.get(1..close)?;
                if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                segments.push(JsonStep::Index(index.parse().ok()?));
                indices = &indices[close + 1..];
                if !indices.is_empty() && !indices.starts_with('[') {
                    return None;
                }
            }
        }
        (!segments.is_empty()).then_some(JsonPath { segments })
    }

    /// The steps, from the document's root.
    pub fn steps(&self) -> &[JsonStep] {
        &self.segments
    }

    /// The last key of the path, if it ends in one: a document that does not hold it as a
    /// string cannot hold the path, which lets a reader skip parsing most stream events.
    pub fn last_key(&self) -> Option<&str> {
        self.segments.iter().rev().find_map(|s| match s {
            JsonStep::Key(k) => Some(k.as_str()),
            JsonStep::Index(_) => None,
        })
    }
}

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, step) in self.segments.iter().enumerate() {
            match step {
                JsonStep::Key(k) if i == 0 => f.write_str(k)?,
                JsonStep::Key(k) => write!(f, ".{k}")?,
                JsonStep::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_with_or_without_the_root_and_with_indices() {
        let p = JsonPath::parse("usage.total_tokens").unwrap();
        assert_eq!(
            p.steps(),
            [
                JsonStep::Key("usage".into()),
                JsonStep::Key("total_tokens".into())
            ]
        );
        assert_eq!(JsonPath::parse("$.usage.total_tokens"), Some(p));
        let indexed = JsonPath::parse("choices[0][2].n").unwrap();
        assert_eq!(
            indexed.steps(),
            [
                JsonStep::Key("choices".into()),
                JsonStep::Index(0),
                JsonStep::Index(2),
                JsonStep::Key("n".into())
            ]
        );
        assert_eq!(indexed.to_string(), "choices[0][2].n");
        assert_eq!(indexed.last_key(), Some("n"));
        assert_eq!(
            JsonPath::parse("$[1].n").unwrap().steps(),
            [JsonStep::Index(1), JsonStep::Key("n".into())]
        );
        for bad in [
            "", "$", "$.", "a..b", "a.", ".a.b.", "a[", "a[]", "a[x]", "a[1]b", "a[-1]", "a.[0]",
        ] {
            assert_eq!(JsonPath::parse(bad), None, "{bad:?}");
        }
    }
}
