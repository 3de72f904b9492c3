//! A mapping's fields, checked against the names it accepts, and the scalars they hold: strings,
//! names, whole numbers, flags, durations and words from a fixed set.

use std::collections::HashMap;
use std::time::Duration;

use sluice_core::parse_duration;

use super::Decoder;
use crate::error::ErrorKind;
use crate::suggest::closest;
use crate::yaml::{Node, NodeKind, parse_bool};

/// The fields of one mapping, checked against the names it accepts.
pub(super) struct Fields<'n> {
    entries: Vec<(&'static str, &'n Node)>,
    /// Whether the mapping held an unknown field. A misspelled field is then likely the
    /// "missing" one, so missing-field errors are not reported on top of it.
    had_unknown: bool,
}

impl<'n> Fields<'n> {
    pub(super) fn get(&self, name: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, node)| *node)
    }
}

impl Decoder {
    pub(super) fn wrong_type(&mut self, field: &str, node: &Node, expected: &'static str) {
        let kind = ErrorKind::WrongType {
            field: field.to_owned(),
            expected,
            found: node.describe(),
        };
        self.error(node, kind);
    }

    /// Checks that `node` is a mapping of known, unique, scalar keys.
    pub(super) fn mapping<'n>(
        &mut self,
        field: &str,
        node: &'n Node,
        context: &'static str,
        expected: &'static [&'static str],
    ) -> Option<Fields<'n>> {
        let NodeKind::Map(entries) = &node.kind else {
            self.wrong_type(field, node, "a mapping");
            return None;
        };
        let mut fields = Fields {
            entries: Vec::with_capacity(entries.len()),
            had_unknown: false,
        };
        let mut first_lines: HashMap<&'static str, usize> = HashMap::new();
        for (key, value) in entries {
            let NodeKind::Scalar { text, .. } = &key.kind else {
                self.wrong_type("a key", key, "a string");
                continue;
            };
            let Some(name) = expected.iter().copied().find(|e| *e == text) else {
                let kind = ErrorKind::UnknownField {
                    field: text.clone(),
                    context,
                    suggestion: closest(text, expected),
                    expected,
                };
                self.error(key, kind);
                fields.had_unknown = true;
                continue;
            };
            if let Some(first_line) = first_lines.get(name) {
                let kind = ErrorKind::DuplicateField {
                    field: name.to_owned(),
                    first_line: *first_line,
                };
                self.error(key, kind);
                continue;
            }
            first_lines.insert(name, key.line);
            fields.entries.push((name, value));
        }
        Some(fields)
    }

    /// Reports a missing field, unless the mapping's unknown field already explains it.
    pub(super) fn missing(
        &mut self,
        fields: &Fields<'_>,
        node: &Node,
        field: &'static str,
        context: &'static str,
    ) {
        if !fields.had_unknown {
            self.error(node, ErrorKind::MissingField { field, context });
        }
    }

    /// A string: any scalar, as YAML reads `value: 123` into a string field.
    pub(super) fn string(&mut self, field: &str, node: &Node) -> Option<String> {
        match &node.kind {
            NodeKind::Scalar { text, .. } if !node.is_null() => Some(text.clone()),
            _ => {
                self.wrong_type(field, node, "a string");
                None
            }
        }
    }

    /// A string that must not be empty.
    pub(super) fn name(&mut self, field: &'static str, node: &Node) -> Option<String> {
        let s = self.string(field, node)?;
        if s.is_empty() {
            self.error(node, ErrorKind::EmptyString(field));
            return None;
        }
        Some(s)
    }

    pub(super) fn uint(&mut self, field: &str, node: &Node) -> Option<u64> {
        let text = match &node.kind {
            NodeKind::Scalar { text, plain: true } => text.as_str(),
            _ => {
                self.wrong_type(field, node, "a whole number");
                return None;
            }
        };
        let digits = text.strip_prefix('+').unwrap_or(text);
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            return match digits.parse::<u64>() {
                Ok(n) => Some(n),
                Err(_) => {
                    let kind = ErrorKind::TooLarge {
                        field: field.to_owned(),
                        value: text.to_owned(),
                        max: u64::MAX,
                    };
                    self.error(node, kind);
                    None
                }
            };
        }
        let negative = text
            .strip_prefix('-')
            .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit() || b == b'.'));
        if negative {
            let kind = ErrorKind::Negative {
                field: field.to_owned(),
                value: text.to_owned(),
            };
            self.error(node, kind);
            return None;
        }
        self.wrong_type(field, node, "a whole number");
        None
    }

    pub(super) fn boolean(&mut self, field: &str, node: &Node) -> Option<bool> {
        if let NodeKind::Scalar { text, plain: true } = &node.kind {
            if let Some(b) = parse_bool(text) {
                return Some(b);
            }
        }
        self.wrong_type(field, node, "true or false");
        None
    }

    pub(super) fn duration(&mut self, field: &str, node: &Node) -> Option<Duration> {
        let NodeKind::Scalar { text, .. } = &node.kind else {
            self.wrong_type(field, node, "a duration such as 30s");
            return None;
        };
        let parsed = parse_duration(text);
        if parsed.is_none() {
            let kind = ErrorKind::InvalidDuration {
                value: text.clone(),
            };
            self.error(node, kind);
        }
        parsed
    }

    /// One of a fixed set of words.
    pub(super) fn variant(
        &mut self,
        what: &'static str,
        node: &Node,
        expected: &'static [&'static str],
    ) -> Option<&'static str> {
        let text = self.string(what, node)?;
        let found = expected.iter().copied().find(|e| *e == text);
        if found.is_none() {
            let kind = ErrorKind::UnknownVariant {
                what,
                suggestion: closest(&text, expected),
                value: text,
                expected,
            };
            self.error(node, kind);
        }
        found
    }

    /// A list of scalars, or one scalar as a list of one.
    pub(super) fn string_list<'n>(&mut self, field: &str, node: &'n Node) -> Vec<&'n Node> {
        match &node.kind {
            NodeKind::Seq(items) => items.iter().collect(),
            NodeKind::Scalar { .. } => vec![node],
            NodeKind::Map(_) => {
                self.wrong_type(field, node, "a list of strings");
                Vec::new()
            }
        }
    }
}
