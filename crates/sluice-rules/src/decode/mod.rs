//! Decoding the located YAML tree into the rule model, by hand, so every error has a position.
//!
//! The decoder keeps going after an error where it can, collecting every problem in the file, so
//! `sluice validate` shows them all at once. [`Decoder`] is the one state they share; each file
//! adds the methods for one part of the format:
//!
//! - `fields.rs`: a mapping's known fields, and the scalars they hold;
//! - `domain.rs`: the top level and its tree of descriptors;
//! - `value_match.rs`: a descriptor's `value`, exact or a wildcard;
//! - `limit.rs`: one limit: its window, amount, name and `replaces`;
//! - `algorithm.rs`: the algorithm, its parameters, and the core policy they build;
//! - `utc_offset.rs`: where a fixed window's clock-aligned windows start;
//! - `outcome.rs`: what a request gets when limited (`action`) or when the store fails
//!   (`on_store_error`), both inherited down the tree;
//! - `gateway.rs`: `routes` and `trusted_proxies`.

use std::sync::Arc;

use crate::error::{ConfigError, ErrorKind, LoadError, Location};
use crate::model::{Action, DomainConfig, LimitConfig, OnStoreError};
use crate::yaml::{self, Node};

mod algorithm;
mod domain;
mod fields;
mod gateway;
mod limit;
mod metadata;
mod outcome;
mod utc_offset;
mod value_match;

/// Reads one rule file's text into its domain.
pub(crate) fn decode_file(file: &Arc<str>, text: &str) -> Result<DomainConfig, LoadError> {
    let root = yaml::parse(file, text)?;
    let Some(root) = root else {
        return Err(ConfigError::new(Location::start_of(file.clone()), ErrorKind::Empty).into());
    };
    let mut decoder = Decoder {
        file: file.clone(),
        errors: Vec::new(),
    };
    let domain = decoder.domain(&root);
    match domain {
        Some(d) if decoder.errors.is_empty() => Ok(d),
        _ => {
            decoder
                .errors
                .sort_by_key(|e| (e.location.line, e.location.col));
            Err(LoadError::new(decoder.errors))
        }
    }
}

/// Reads one limit from `text` (YAML or JSON, such as a rule's `rate_limit` sent to the admin
/// API), exactly as a rule file's `rate_limit` entry is read: the same keys, any algorithm, and
/// the same errors, which name `source` as their file. A limit changed at run time replaces a
/// rule's, so `action` and `on_store_error`, when the text does not state them, are `inherit`'s
/// (the rule's), as a rule's own are its descriptor's. `unlimited` is refused: an override sets
/// a limit.
pub fn decode_limit(
    source: &Arc<str>,
    text: &str,
    inherit: (Option<Action>, Option<OnStoreError>),
) -> Result<LimitConfig, LoadError> {
    let root = yaml::parse(source, text)?;
    let Some(root) = root else {
        return Err(ConfigError::new(Location::start_of(source.clone()), ErrorKind::Empty).into());
    };
    let mut decoder = Decoder {
        file: source.clone(),
        errors: Vec::new(),
    };
    let inherited = outcome::Inherited {
        action: inherit.0,
        on_store_error: inherit.1,
    };
    let entry = decoder.limit("rate_limit", &root, &inherited, false);
    match entry {
        Some(limit::LimitEntry::Limit(l)) if decoder.errors.is_empty() => Ok(l),
        Some(limit::LimitEntry::Unlimited(at)) if decoder.errors.is_empty() => {
            Err(ConfigError::new(
                at,
                ErrorKind::Invalid {
                    field: "unlimited".to_owned(),
                    value: "true".to_owned(),
                    reason: "an override sets a limit; to lift one, set a high limit or \
                             remove the rule",
                },
            )
            .into())
        }
        _ => {
            decoder
                .errors
                .sort_by_key(|e| (e.location.line, e.location.col));
            Err(LoadError::new(decoder.errors))
        }
    }
}

/// One file's decoding: where its nodes are, and every error found so far.
struct Decoder {
    file: Arc<str>,
    errors: Vec<ConfigError>,
}

impl Decoder {
    fn at(&self, node: &Node) -> Location {
        node.location(&self.file)
    }

    fn error(&mut self, node: &Node, kind: ErrorKind) {
        let location = self.at(node);
        self.errors.push(ConfigError::new(location, kind));
    }
}
