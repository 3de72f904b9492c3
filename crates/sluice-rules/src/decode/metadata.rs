//! A descriptor's `metadata`: any YAML mapping, kept as the protobuf `Struct` Envoy receives in
//! an answer's dynamic metadata. Nothing in it is interpreted; it is only checked to be a
//! mapping with scalar, unique keys.

use super::Decoder;
use crate::error::ErrorKind;
use crate::model::{MetaValue, Metadata};
use crate::yaml::{Node, NodeKind, is_null, parse_bool};

impl Decoder {
    pub(super) fn metadata(&mut self, node: &Node) -> Option<Metadata> {
        match self.meta_value("metadata", node)? {
            MetaValue::Map(fields) => Some(fields),
            _ => {
                self.wrong_type("metadata", node, "a mapping");
                None
            }
        }
    }

    fn meta_value(&mut self, field: &str, node: &Node) -> Option<MetaValue> {
        Some(match &node.kind {
            NodeKind::Scalar { text, plain: true } if is_null(text) => MetaValue::Null,
            NodeKind::Scalar { text, plain: true } => match parse_bool(text) {
                Some(b) => MetaValue::Bool(b),
                None => {
                    number(text).map_or_else(|| MetaValue::String(text.clone()), MetaValue::Number)
                }
            },
            NodeKind::Scalar { text, plain: false } => MetaValue::String(text.clone()),
            NodeKind::Seq(items) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    out.push(self.meta_value(field, item)?);
                }
                MetaValue::List(out)
            }
            NodeKind::Map(entries) => {
                let mut out: Metadata = Vec::with_capacity(entries.len());
                let mut lines: Vec<usize> = Vec::with_capacity(entries.len());
                for (key, value) in entries {
                    let NodeKind::Scalar { text, .. } = &key.kind else {
                        self.wrong_type(&format!("a key of `{field}`"), key, "a string");
                        return None;
                    };
                    if let Some(i) = out.iter().position(|(k, _)| k == text) {
                        let kind = ErrorKind::DuplicateField {
                            field: format!("{field}.{text}"),
                            first_line: lines[i],
                        };
                        self.error(key, kind);
                        return None;
                    }
                    let inner = format!("{field}.{text}");
                    let value = self.meta_value(&inner, value)?;
                    out.push((text.clone(), value));
                    lines.push(key.line);
                }
                MetaValue::Map(out)
            }
        })
    }
}

/// A plain scalar as a number, as YAML's core schema reads one: decimal integers and floats,
/// `0x`/`0o` integers, and `.inf`/`.nan`. Anything else is a string.
fn number(text: &str) -> Option<f64> {
    let (sign, digits) = match text.strip_prefix('-') {
        Some(rest) => (-1.0, rest),
        None => (1.0, text.strip_prefix('+').unwrap_or(text)),
    };
    let radix = |prefix: &str, radix: u32| {
        digits
            .strip_prefix(prefix)
            .and_then(|d| u64::from_str_radix(d, radix).ok())
            // A metadata number is a double in protobuf; a larger integer rounds, as there.
            .map(|n| sign * n as f64)
    };
    if let Some(n) = radix("0x", 16).or_else(|| radix("0o", 8)) {
        return Some(n);
    }
    match digits {
        ".inf" | ".Inf" | ".INF" => return Some(sign * f64::INFINITY),
        ".nan" | ".NaN" | ".NAN" if sign > 0.0 => return Some(f64::NAN),
        _ => {}
    }
    let numeric = digits
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'))
        && digits.starts_with(|c: char| c.is_ascii_digit() || c == '.');
    if !numeric {
        return None;
    }
    digits.parse::<f64>().ok().map(|n| sign * n)
}

#[cfg(test)]
mod tests {
    use super::number;

    #[test]
    fn numbers_follow_the_core_schema() {
        assert_eq!(number("42"), Some(42.0));
        assert_eq!(number("-1.5"), Some(-1.5));
        assert_eq!(number("1e3"), Some(1000.0));
        assert_eq!(number("0x1F"), Some(31.0));
        assert_eq!(number("0o17"), Some(15.0));
        assert_eq!(number("-.inf"), Some(f64::NEG_INFINITY));
        assert!(number(".nan").is_some_and(f64::is_nan));
        for text in ["service_1", "1.2.3.4", "v2", "", "-", "e5", "12abc"] {
            assert_eq!(number(text), None, "{text}");
        }
    }
}
