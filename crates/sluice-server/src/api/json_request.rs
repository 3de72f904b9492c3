//! The request body `/json` and `/v1/check` take: Envoy's `RateLimitRequest` in protobuf's JSON
//! form, with Sluice's `cost` beside `hits_addend`.
//!
//! A field the message does not have is refused, as protobuf's JSON parser refuses it: a
//! misspelt name would otherwise drop what it carries, and a request stripped of its entries
//! is one no limit applies to, answered "allowed" without a word.

use serde::Deserialize;
use serde_json::Value;
use sluice_http::problem::Problem;
use sluice_limiter::{LimitOverride, LimitRequest, RequestDescriptor};
use sluice_rules::Unit;

use crate::envoy::EnvoyUnit;

/// An unsigned integer as protobuf's JSON mapping writes it: a number (`5`, or `5.0` with no
/// fraction) or a decimal string (`"5"`, how 64-bit integers are usually sent).
fn flex_u64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    use serde::de::Error;
    let v = Option::<Value>::deserialize(d)?;
    let n = match &v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= 2f64.powi(53))
                .map(|f| f as u64)
        }),
        Some(Value::String(s)) => s.parse::<u64>().ok(),
        Some(_) => None,
    };
    n.map(Some).ok_or_else(|| {
        D::Error::custom(format!(
            "expected a non-negative whole number, found {}",
            v.unwrap_or(Value::Null)
        ))
    })
}

#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(alias = "requestsPerUnit", deserialize_with = "flex_u64", default)]
    requests_per_unit: Option<u64>,
    unit: Value,
}

#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    /// `None` when the field is missing, which is refused; an empty list, sent on purpose, is
    /// a descriptor no rule matches, as Envoy's is.
    #[serde(default)]
    entries: Option<Vec<JsonEntry>>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hitsAddend", deserialize_with = "flex_u64")]
    hits_addend: Option<u64>,
    /// Sluice's native name for the descriptor's own cost.
    #[serde(default, deserialize_with = "flex_u64")]
    cost: Option<u64>,
    /// Envoy's refund: the descriptor's `hits_addend` is given back instead of taken.
    #[serde(default, alias = "isNegativeHits")]
    is_negative_hits: Option<bool>,
}

#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hitsAddend", deserialize_with = "flex_u64")]
    hits_addend: Option<u64>,
    /// Sluice's native name for the request's cost.
    #[serde(default, deserialize_with = "flex_u64")]
    cost: Option<u64>,
}

impl JsonDescriptor {
    /// One descriptor, for [`JsonRequest::parse_plain`].
    fn parse_plain(c: &mut Cursor<'_>) -> Option<JsonDescriptor> {
        let mut d = JsonDescriptor {
            entries: None,
            limit: None,
            hits_addend: None,
            cost: None,
            is_negative_hits: None,
        };
        c.object(|c, field| {
            match field {
                "entries" => {
                    // Room for the usual descriptor's entries, so that the first few do not
                    // grow the vector one by one.
                    let mut entries = Vec::with_capacity(2);
                    c.array(|c| {
                        entries.push(JsonEntry::parse_plain(c)?);
                        Some(())
                    })?;
                    set_once(&mut d.entries, entries)?;
                }
                "hits_addend" | "hitsAddend" => set_once(&mut d.hits_addend, c.count()?)?,
                "cost" => set_once(&mut d.cost, c.count()?)?,
                _ => return None,
            }
            Some(())
        })?;
        Some(d)
    }
}

impl JsonEntry {
    /// One entry, for [`JsonRequest::parse_plain`]: a key is required, as serde requires it.
    fn parse_plain(c: &mut Cursor<'_>) -> Option<JsonEntry> {
        let (mut key, mut value) = (None, None);
        c.object(|c, field| {
            let slot = match field {
                "key" => &mut key,
                "value" => &mut value,
                _ => return None,
            };
            set_once(slot, c.string()?.to_owned())
        })?;
        Some(JsonEntry {
            key: key?,
            value: value.unwrap_or_default(),
        })
    }
}

/// Marks a field as read; `None` if it was already (serde refuses a duplicate field).
fn once(seen: &mut bool) -> Option<()> {
    (!std::mem::replace(seen, true)).then_some(())
}

/// Sets a field read once; `None` if it was already set.
fn set_once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    slot.is_none().then(|| *slot = Some(value))
}

/// A reader over a JSON text for [`JsonRequest::parse_plain`]. Every method returns `None` on
/// anything outside the plain shape it reads, valid JSON or not.
pub(super) struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(text: &'a str) -> Self {
        Cursor { text, at: 0 }
    }

    /// The next byte after whitespace, not consumed.
    pub(super) fn peek(&mut self) -> Option<u8> {
        let bytes = self.text.as_bytes();
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = bytes.get(self.at) {
            self.at += 1;
        }
        bytes.get(self.at).copied()
    }

    /// Consumes `byte` after whitespace.
    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// Nothing but whitespace left.
    pub(super) fn end(&mut self) -> Option<()> {
        self.peek().is_none().then_some(())
    }

    /// A string without escapes or control characters, as the text holds it.
    pub(super) fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let rest = &self.text.as_bytes()[self.at..];
        let len = plain_len(rest);
        if rest.get(len) != Some(&b'"') {
            return None;
        }
        let s = &self.text[self.at..self.at + len];
        self.at += len + 1;
        Some(s)
    }

    /// A whole number written as plain digits (no sign, fraction, exponent or leading zero)
    /// that fits in 64 bits.
    pub(super) fn count(&mut self) -> Option<u64> {
        self.peek()?;
        let rest = &self.text.as_bytes()[self.at..];
        let len = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if len == 0
            || (len > 1 && rest[0] == b'0')
            || matches!(rest.get(len), Some(b'.' | b'e' | b'E'))
        {
            return None;
        }
        let n = rest[..len].iter().try_fold(0u64, |n, &d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })?;
        self.at += len;
        Some(n)
    }

    /// An object: `field` reads each member's value after its name.
    pub(super) fn object(
        &mut self,
        mut field: impl FnMut(&mut Self, &'a str) -> Option<()>,
    ) -> Option<()> {
        self.list(b'{', b'}', |c| {
            let name = c.string()?;
            c.eat(b':')?;
            field(c, name)
        })
    }

    /// An array: `item` reads each element.
    fn array(&mut self, item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.list(b'[', b']', item)
    }

    /// `open`, then elements read by `item` and separated by commas, then `close`.
    fn list(
        &mut self,
        open: u8,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        self.eat(open)?;
        if self.eat(close).is_some() {
            return Some(());
        }
        loop {
            item(self)?;
            match self.peek()? {
                b',' => self.at += 1,
                b if b == close => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

/// How many bytes of `bytes` come before the first `"`, `\` or control character (all of them
/// when none does): eight bytes at a time, which cost the strings of a `/json` body about half
/// the instructions of a byte-by-byte search (1,000 per request).
fn plain_len(bytes: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // The high bit of each byte of `w` below `n` (at most 128), with bytes of 128 and above
    // (UTF-8) masked out by `!w`: the classic bit trick. A borrow can mark a byte above the
    // first one below `n`, never one before it, so the lowest mark is exact.
    let below = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGHS;
    let mut chunks = bytes.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        let marks = below(w, 0x20) | below(w ^ (ONES * 0x22), 1) | below(w ^ (ONES * 0x5c), 1);
        if marks != 0 {
            // The lowest marked byte, in memory order (little-endian).
            return at + (marks.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    let rest = chunks.remainder();
    at + rest
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .unwrap_or(rest.len())
}

fn parse_unit(v: &Value, field: String) -> Result<Unit, Problem> {
    let unit = match v {
        Value::String(s) => Unit::parse(s),
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| EnvoyUnit::try_from(i32::try_from(n).ok()?).ok())
            .and_then(|u| Unit::parse(u.as_str_name())),
        _ => None,
    };
    unit.ok_or_else(|| {
        Problem::bad_request(format!(
            "unknown unit {v}; expected one of {}",
            Unit::NAMES.join(", ")
        ))
        .with_field(field)
    })
}

impl JsonRequest {
    /// Reads `text` the way serde reads it, for the bodies clients send every time: fields of
    /// this shape only (no limit override), strings without escapes, counts as plain digits,
    /// each field at most once. `None` for anything else, which [`serde_json`] then reads (and
    /// refuses, naming the fault, when it is not a valid request); a unit test holds the two
    /// to the same result.
    pub(super) fn parse_plain(text: &str) -> Option<JsonRequest> {
        Self::parse_plain_with(text, |_, _| None)
    }

    /// [`parse_plain`](Self::parse_plain) of a body that has more fields than the request's:
    /// `extra` reads the value of each field the request does not have (`None` for one it does
    /// not know either, or whose value is not in the plain shape).
    pub(super) fn parse_plain_with<'a>(
        text: &'a str,
        mut extra: impl FnMut(&mut Cursor<'a>, &'a str) -> Option<()>,
    ) -> Option<JsonRequest> {
        let mut c = Cursor::new(text);
        let mut request = JsonRequest {
            domain: String::new(),
            descriptors: Vec::with_capacity(1),
            hits_addend: None,
            cost: None,
        };
        let (mut domain, mut descriptors) = (false, false);
        c.object(|c, field| {
            match field {
                "domain" => {
                    once(&mut domain)?;
                    request.domain = c.string()?.to_owned();
                }
                "descriptors" => {
                    once(&mut descriptors)?;
                    c.array(|c| {
                        request.descriptors.push(JsonDescriptor::parse_plain(c)?);
                        Some(())
                    })?;
                }
                "hits_addend" | "hitsAddend" => set_once(&mut request.hits_addend, c.count()?)?,
                "cost" => set_once(&mut request.cost, c.count()?)?,
                other => extra(c, other)?,
            }
            Some(())
        })?;
        c.end()?;
        Some(request)
    }

    /// The request to decide, and the request-level cost as sent (0 when unset), which the
    /// Envoy answer's dynamic metadata repeats.
    pub(super) fn into_limit_request(self) -> Result<(LimitRequest, u64), Problem> {
        let mut descriptors = Vec::with_capacity(self.descriptors.len());
        for (i, d) in self.descriptors.into_iter().enumerate() {
            let entries = d.entries.ok_or_else(|| {
                Problem::bad_request(
                    "a descriptor needs `entries`: without them no limit applies to it",
                )
                .with_field(format!("descriptors[{i}].entries"))
            })?;
            let limit_override = match d.limit {
                Some(o) => Some(LimitOverride {
                    requests_per_unit: o.requests_per_unit.ok_or_else(|| {
                        Problem::bad_request("a limit override needs requests_per_unit")
                            .with_field(format!("descriptors[{i}].limit.requests_per_unit"))
                    })?,
                    unit: parse_unit(&o.unit, format!("descriptors[{i}].limit.unit"))?,
                }),
                None => None,
            };
            if d.cost.is_some() && d.hits_addend.is_some() {
                return Err(
                    Problem::bad_request("give `cost` or `hits_addend`, not both")
                        .with_field(format!("descriptors[{i}].cost")),
                );
            }
            descriptors.push(RequestDescriptor {
                entries: entries.into_iter().map(|e| (e.key, e.value)).collect(),
                envoy_hits: d.hits_addend.is_some(),
                cost: d.cost.or(d.hits_addend),
                limit_override,
                refund: d.is_negative_hits.unwrap_or(false),
            });
        }
        if self.cost.is_some() && self.hits_addend.is_some() {
            return Err(
                Problem::bad_request("give `cost` or `hits_addend`, not both").with_field("cost"),
            );
        }
        let sent = self.cost.or(self.hits_addend).unwrap_or(0);
        let request = LimitRequest {
            domain: self.domain,
            descriptors,
            cost: sent.max(1),
        };
        Ok((request, sent))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What serde makes of `text`, the reference the hand reader must agree with.
    fn by_serde(text: &str) -> Result<JsonRequest, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    proptest! {
        /// The word-at-a-time search stops where a byte-by-byte one does, UTF-8 included.
        #[test]
        fn plain_len_finds_the_first_quote_backslash_or_control_character(
            s in "(\\PC|[\\x00-\\x7f]){0,40}",
        ) {
            let bytes = s.as_bytes();
            let expected = bytes
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
                .unwrap_or(bytes.len());
            prop_assert_eq!(plain_len(bytes), expected);
        }
    }

    #[test]
    fn the_bodies_clients_send_are_read_by_hand_as_serde_reads_them() {
        let bodies = [
            r#"{"domain":"bench","descriptors":[{"entries":[{"key":"user","value":"u7"}]}]}"#,
            "{ \"descriptors\" : [ { \"entries\" : [ { \"value\" : \"é日本\" , \"key\" : \"k\" } ,\n\
             {\"key\":\"path\"} ] , \"hitsAddend\" : 3 } , {\"entries\":[],\"cost\":0} ] ,\r\n\
             \t\"domain\" : \"shop\" , \"hits_addend\" : 18446744073709551615 }  ",
            r#"{"domain":"d","descriptors":[]}"#,
            r#"{}"#,
            r#"{"domain":"d","descriptors":[{},{"entries":[{"key":""}]}],"cost":12}"#,
        ];
        for text in bodies {
            let plain = JsonRequest::parse_plain(text);
            assert!(plain.is_some(), "read by hand: {text}");
            assert_eq!(plain.ok_or_else(String::new), by_serde(text), "{text}");
        }
    }

    #[test]
    fn anything_else_is_left_to_serde() {
        let bodies = [
            // Escapes, a control character, a limit override, an unknown field.
            r#"{"domain":"a\"b","descriptors":[]}"#,
            r#"{"domain":"\u0041","descriptors":[]}"#,
            "{\"domain\":\"a\u{1}b\"}",
            r#"{"domain":"d","descriptors":[{"entries":[],"limit":{"requests_per_unit":1,"unit":"SECOND"}}]}"#,
            r#"{"domain":"d","extra":1}"#,
            // Counts as strings, fractions, exponents, signs, leading zeros, past 64 bits.
            r#"{"cost":"5"}"#,
            r#"{"cost":5.0}"#,
            r#"{"cost":1e2}"#,
            r#"{"cost":-1}"#,
            r#"{"cost":05}"#,
            r#"{"cost":18446744073709551616}"#,
            // Duplicates, under one name or under both of an alias.
            r#"{"domain":"a","domain":"b"}"#,
            r#"{"hits_addend":1,"hitsAddend":2}"#,
            r#"{"descriptors":[{"entries":[{"key":"a","key":"b"}]}]}"#,
            // A missing key, nulls, trailing text, broken syntax.
            r#"{"descriptors":[{"entries":[{"value":"v"}]}]}"#,
            r#"{"domain":null}"#,
            r#"{"domain":"d"} {"#,
            r#"{"domain":"d",}"#,
            r#"{"descriptors":[{"entries":[],}]}"#,
            r#"{"domain":"d""#,
            "",
        ];
        for text in bodies {
            assert_eq!(JsonRequest::parse_plain(text), None, "{text}");
        }
    }

    /// The text of an object of `members`, `(name, value)` pairs as written, with `space`
    /// between every token.
    fn object(members: &[(&str, String)], space: &str) -> String {
        let members: Vec<String> = members
            .iter()
            .map(|(name, value)| format!("\"{name}\"{space}:{space}{value}"))
            .collect();
        format!(
            "{{{space}{}{space}}}",
            members.join(&format!("{space},{space}"))
        )
    }

    fn array(items: &[String], space: &str) -> String {
        format!(
            "[{space}{}{space}]",
            items.join(&format!("{space},{space}"))
        )
    }

    fn any_string() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            r#""user""#,
            r#""""#,
            r#""a b""#,
            r#""é日本""#,
            r#""q\"uote""#,
            r#""\u0041""#,
            "\"raw\ttab\"",
            "null",
            "7",
        ])
        .prop_map(str::to_owned)
    }

    fn any_count() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "0",
            "5",
            "05",
            "5.0",
            "1e2",
            "-1",
            "2.5",
            "9007199254740993",
            "18446744073709551615",
            "18446744073709551616",
            r#""7""#,
            "null",
        ])
        .prop_map(str::to_owned)
    }

    fn any_space() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec!["", " ", "\n  ", "\t", "\r\n"])
    }

    fn any_entry(space: &'static str) -> impl Strategy<Value = String> {
        let member = prop_oneof![
            any_string().prop_map(|v| ("key", v)),
            any_string().prop_map(|v| ("value", v)),
            Just(("other", "1".to_owned())),
        ];
        prop::collection::vec(member, 0..4).prop_map(move |m| object(&m, space))
    }

    fn any_descriptor(space: &'static str) -> impl Strategy<Value = String> {
        let entries = prop::collection::vec(any_entry(space), 0..3);
        let member = prop_oneof![
            4 => entries.prop_map(move |e| ("entries", array(&e, space))),
            1 => any_count().prop_map(|v| ("hits_addend", v)),
            1 => any_count().prop_map(|v| ("hitsAddend", v)),
            1 => any_count().prop_map(|v| ("cost", v)),
            1 => Just(("limit", r#"{"requests_per_unit":5,"unit":"SECOND"}"#.to_owned())),
        ];
        prop::collection::vec(member, 0..4).prop_map(move |m| object(&m, space))
    }

    fn any_request() -> impl Strategy<Value = String> {
        any_space().prop_flat_map(|space| {
            let descriptors = prop::collection::vec(any_descriptor(space), 0..3);
            let member = prop_oneof![
                3 => any_string().prop_map(|v| ("domain", v)),
                3 => descriptors.prop_map(move |d| ("descriptors", array(&d, space))),
                1 => any_count().prop_map(|v| ("hits_addend", v)),
                1 => any_count().prop_map(|v| ("hitsAddend", v)),
                1 => any_count().prop_map(|v| ("cost", v)),
                1 => Just(("extra", "true".to_owned())),
            ];
            (
                prop::collection::vec(member, 0..5),
                any_space(),
                any::<bool>(),
            )
                .prop_map(move |(m, tail, trailing)| {
                    let text = object(&m, space) + tail;
                    if trailing { text + "x" } else { text }
                })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Whatever the hand reader accepts, serde reads to the same request; whatever serde
        /// refuses, the hand reader does not accept.
        #[test]
        fn the_hand_reader_agrees_with_serde(text in any_request()) {
            if let Some(plain) = JsonRequest::parse_plain(&text) {
                prop_assert_eq!(Ok(plain), by_serde(&text), "{}", text);
            }
        }
    }
}
