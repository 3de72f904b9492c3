//! What a request gets when a limit turns it away (`action`), and when the store cannot answer
//! (`on_store_error`). A domain or descriptor sets both for everything below it.

use super::Decoder;
use crate::error::ErrorKind;
use crate::model::{Action, OnStoreError};
use crate::yaml::{Node, NodeKind};

const ACTIONS: &[&str] = &["reject", "shadow", "fake", "delay", "soft"];
const FAKE_FIELDS: &[&str] = &["status", "content_type", "body"];
const DELAY_FIELDS: &[&str] = &["max_wait"];
const SOFT_FIELDS: &[&str] = &["header"];
const EMPTY_FIELDS: &[&str] = &[];

/// The body type of a `fake` answer when none is given.
const DEFAULT_FAKE_CONTENT_TYPE: &str = "text/plain; charset=utf-8";
/// The warning header of a `soft` action when none is given.
const DEFAULT_SOFT_HEADER: &str = "X-RateLimit-Warning";

/// Settings a descriptor passes to its limits and children, each overridable lower down.
#[derive(Clone)]
pub(super) struct Inherited {
    pub(super) action: Option<Action>,
    pub(super) on_store_error: Option<OnStoreError>,
}

impl Decoder {
    pub(super) fn on_store_error(&mut self, node: &Node) -> Option<OnStoreError> {
        match self.variant("on_store_error", node, &OnStoreError::NAMES)? {
            "deny" => Some(OnStoreError::Deny),
            "local" => Some(OnStoreError::Local),
            _ => Some(OnStoreError::Allow),
        }
    }

    /// `action: reject`, or a one-key mapping with the action's parameters:
    /// `action: {fake: {status: 200, body: "ok"}}`.
    pub(super) fn action(&mut self, node: &Node) -> Option<Action> {
        let (kind, params) = match &node.kind {
            NodeKind::Scalar { .. } => (self.variant("action", node, ACTIONS)?, None),
            NodeKind::Map(entries) if entries.len() == 1 => {
                let (k, v) = &entries[0];
                (self.variant("action", k, ACTIONS)?, Some(v))
            }
            _ => {
                self.wrong_type("action", node, "an action name, or a mapping of one action");
                return None;
            }
        };
        let params = params.filter(|p| !p.is_null());
        let expected = match kind {
            "fake" => FAKE_FIELDS,
            "delay" => DELAY_FIELDS,
            "soft" => SOFT_FIELDS,
            _ => EMPTY_FIELDS,
        };
        let fields = match params {
            Some(p) => Some(self.mapping(kind, p, "the action's parameters", expected)?),
            None => None,
        };
        let get = |name: &str| fields.as_ref().and_then(|f| f.get(name));
        Some(match kind {
            "reject" => Action::Reject,
            "shadow" => Action::Shadow,
            "fake" => {
                let status = match get("status") {
                    Some(n) => {
                        let s = self.uint("status", n)?;
                        if !(100..=599).contains(&s) {
                            let kind = ErrorKind::OutOfRange {
                                field: "status".into(),
                                value: s.to_string(),
                                range: "the HTTP status range 100 to 599",
                            };
                            self.error(n, kind);
                            return None;
                        }
                        u16::try_from(s).ok()?
                    }
                    None => 200,
                };
                let content_type = match get("content_type") {
                    Some(n) => self.name("content_type", n)?,
                    None => DEFAULT_FAKE_CONTENT_TYPE.to_owned(),
                };
                let body = match get("body") {
                    Some(n) if n.is_null() => String::new(),
                    Some(n) => self.string("body", n)?,
                    None => String::new(),
                };
                Action::Fake {
                    status,
                    content_type,
                    body,
                }
            }
            "delay" => Action::Delay {
                max_wait: match get("max_wait") {
                    Some(n) => Some(self.duration("max_wait", n)?),
                    None => None,
                },
            },
            _ => Action::Soft {
                header: match get("header") {
                    Some(n) => self.name("header", n)?,
                    None => DEFAULT_SOFT_HEADER.to_owned(),
                },
            },
        })
    }
}
