//! A YAML document as a tree of nodes that remember where they start.
//!
//! The rule decoder walks this tree by hand instead of deriving a deserializer, so that every
//! field, including one that is wrong, knows its line and column. The tree is built from
//! saphyr-parser's event stream with an explicit stack, so a deeply nested or hostile document
//! cannot overflow the call stack.

use std::sync::Arc;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

use crate::error::{ConfigError, ErrorKind, Location};

/// The deepest nesting of YAML collections accepted. A rule file nests two collections per
/// descriptor level (a list and a mapping), so this allows well over a hundred descriptor levels
/// while keeping the recursive decoder's stack small.
pub(crate) const MAX_DEPTH: usize = 256;

/// One YAML node and where it starts.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) kind: NodeKind,
    pub(crate) line: usize,
    pub(crate) col: usize,
}

/// The three YAML node kinds. Scalars keep their text; whether it is a number, a boolean or null
/// depends on the field it fills, as in YAML's core schema.
#[derive(Debug, Clone)]
pub(crate) enum NodeKind {
    Scalar {
        text: String,
        /// Plain (unquoted). Only plain scalars can be numbers, booleans or null.
        plain: bool,
    },
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// A short description of what the node is, for "expected X, found Y" messages.
    pub(crate) fn describe(&self) -> &'static str {
        match &self.kind {
            NodeKind::Seq(_) => "a list",
            NodeKind::Map(_) => "a mapping",
            NodeKind::Scalar { text, plain: true } if is_null(text) => "nothing (null)",
            NodeKind::Scalar { text, plain: true } if parse_bool(text).is_some() => "a boolean",
            NodeKind::Scalar { text, plain: true } if looks_numeric(text) => "a number",
            NodeKind::Scalar { .. } => "a string",
        }
    }

    /// Whether the node is YAML null (`~`, `null` or nothing).
    pub(crate) fn is_null(&self) -> bool {
        matches!(&self.kind, NodeKind::Scalar { text, plain: true } if is_null(text))
    }

    pub(crate) fn location(&self, file: &Arc<str>) -> Location {
        Location::new(file.clone(), self.line, self.col)
    }
}

pub(crate) fn is_null(text: &str) -> bool {
    matches!(text, "" | "~" | "null" | "Null" | "NULL")
}

/// YAML 1.2 core-schema booleans.
pub(crate) fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

fn looks_numeric(text: &str) -> bool {
    let t = text.strip_prefix(['-', '+']).unwrap_or(text);
    !t.is_empty()
        && t.chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c == '.')
}

enum Frame {
    Seq(Node),
    Map(Node, Option<Node>),
}

fn location(file: &Arc<str>, span: &Span) -> Location {
    Location::new(file.clone(), span.start.line(), span.start.col() + 1)
}

/// Parses `text` into its single document's root node, or `None` for an empty document.
pub(crate) fn parse(file: &Arc<str>, text: &str) -> Result<Option<Node>, ConfigError> {
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Frame> = Vec::new();
    let mut root: Option<Node> = None;
    let mut documents = 0usize;
    while let Some(event) = parser.next_event() {
        let (event, span) = event.map_err(|e| {
            let m = e.marker();
            ConfigError::new(
                Location::new(file.clone(), m.line(), m.col() + 1),
                ErrorKind::Syntax(e.info().to_owned()),
            )
        })?;
        let node = |kind| Node {
            kind,
            line: span.start.line(),
            col: span.start.col() + 1,
        };
        let complete = match event {
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => None,
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(ConfigError::new(
                        location(file, &span),
                        ErrorKind::MultipleDocuments,
                    ));
                }
                None
            }
            Event::Alias(_) => {
                return Err(ConfigError::new(location(file, &span), ErrorKind::Alias));
            }
            Event::Scalar(text, style, _, _) => Some(node(NodeKind::Scalar {
                text: text.into_owned(),
                plain: style == ScalarStyle::Plain,
            })),
            Event::SequenceStart(_, _) | Event::MappingStart(_, _) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(ConfigError::new(
                        location(file, &span),
                        ErrorKind::TooDeep { max: MAX_DEPTH },
                    ));
                }
                stack.push(if matches!(event, Event::SequenceStart(..)) {
                    Frame::Seq(node(NodeKind::Seq(Vec::new())))
                } else {
                    Frame::Map(node(NodeKind::Map(Vec::new())), None)
                });
                None
            }
            Event::SequenceEnd | Event::MappingEnd => match stack.pop() {
                Some(Frame::Seq(n)) | Some(Frame::Map(n, None)) => Some(n),
                // The parser never ends a mapping between a key and its value.
                Some(Frame::Map(n, Some(_))) => Some(n),
                None => None,
            },
        };
        if let Some(done) = complete {
            match stack.last_mut() {
                None => root = Some(done),
                Some(Frame::Seq(Node {
                    kind: NodeKind::Seq(items),
                    ..
                })) => items.push(done),
                Some(Frame::Map(map, pending)) => match pending.take() {
                    None => *pending = Some(done),
                    Some(key) => {
                        if let NodeKind::Map(entries) = &mut map.kind {
                            entries.push((key, done));
                        }
                    }
                },
                Some(Frame::Seq(_)) => {}
            }
        }
    }
    Ok(root.filter(|r| !r.is_null()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> Arc<str> {
        Arc::from("t.yaml")
    }

    #[test]
    fn positions_are_one_based() {
        let root = parse(&file(), "domain: a\ndescriptors:\n  - key: k\n")
            .unwrap()
            .unwrap();
        let NodeKind::Map(entries) = &root.kind else {
            panic!("not a map")
        };
        assert_eq!((entries[0].0.line, entries[0].0.col), (1, 1));
        assert_eq!((entries[0].1.line, entries[0].1.col), (1, 9));
        let NodeKind::Seq(items) = &entries[1].1.kind else {
            panic!("not a seq")
        };
        assert_eq!((items[0].line, items[0].col), (3, 5));
    }

    #[test]
    fn empty_and_null_documents_have_no_root() {
        assert!(parse(&file(), "").unwrap().is_none());
        assert!(parse(&file(), "# only a comment\n").unwrap().is_none());
        assert!(parse(&file(), "~\n").unwrap().is_none());
    }

    #[test]
    fn aliases_are_refused_where_they_appear() {
        let e = parse(&file(), "a: &x 1\nb: *x\n").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Alias);
        assert_eq!((e.location.line, e.location.col), (2, 4));
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        // The parser bounds flow nesting itself...
        let e = parse(&file(), &"[".repeat(10_000)).unwrap_err();
        assert!(matches!(e.kind, ErrorKind::Syntax(_)), "{e}");
        // ...and the tree builder bounds block nesting.
        let text: String = (0..300).map(|i| format!("{}a:\n", " ".repeat(i))).collect();
        let e = parse(&file(), &text).unwrap_err();
        assert_eq!(e.kind, ErrorKind::TooDeep { max: MAX_DEPTH });
        assert_eq!(e.location.line, MAX_DEPTH + 1);
    }
}
