//! An override as it is stored and shared: the JSON body every instance reads, and its id. The
//! store keeps both opaque; only this file writes and reads them.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::rfc3339;

/// One entry of an override's descriptor, as the admin API and the stored body write it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescriptorEntry {
    /// The entry's key, such as `tenant`.
    pub key: String,
    /// Its value, such as `acme`.
    pub value: String,
}

/// An override as stored: what was asked, by whom and when. Written by the instance that set
/// it and read back by every instance, so its fields are plain JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// The domain whose rule it overrides.
    pub(crate) domain: String,
    /// The exact descriptor it applies to.
    pub(crate) descriptor: Vec<DescriptorEntry>,
    /// The limit, with a rule's `rate_limit` keys, as sent.
    pub(crate) rate_limit: serde_json::Value,
    /// When it stops applying (RFC 3339), if ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires: Option<String>,
    /// Who set it: the admin client's address, and whether it presented the token.
    pub(crate) set_by: String,
    /// When it was set (RFC 3339, UTC).
    pub(crate) set_at: String,
}

impl Record {
    /// The id the store keeps it under: the domain and the descriptor, as JSON, so that two
    /// overrides share an id exactly when they apply to the same descriptor of the same domain.
    pub(crate) fn id(&self) -> String {
        id_of(&self.domain, &self.descriptor)
    }

    /// The descriptor as the matcher and the requests hold it.
    pub(crate) fn entries(&self) -> Vec<(String, String)> {
        self.descriptor
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect()
    }

    /// When it stops applying. A stored expiry that does not read is taken as already passed,
    /// so a damaged entry never applies for ever.
    pub(crate) fn expiry(&self) -> Option<SystemTime> {
        self.expires
            .as_deref()
            .map(|e| rfc3339::parse(e).unwrap_or(SystemTime::UNIX_EPOCH))
    }
}

/// The id of the override of `descriptor` in `domain`.
pub(crate) fn id_of(domain: &str, descriptor: &[DescriptorEntry]) -> String {
    let pairs: Vec<[&str; 2]> = descriptor
        .iter()
        .map(|e| [e.key.as_str(), e.value.as_str()])
        .collect();
    serde_json::to_string(&(domain, pairs)).unwrap_or_default()
}
