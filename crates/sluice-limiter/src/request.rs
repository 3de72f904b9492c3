//! A request to decide, as every front end builds it: a domain, descriptors of key/value
//! entries, and costs. Its bounds are checked before anything is counted.

use sluice_rules::{DescriptorEntries, Unit};

use crate::limits::{MAX_COST, MAX_DESCRIPTORS, MAX_ENTRIES, MAX_FIELD_LEN};

/// One descriptor of a request, as every front end parses it.
#[derive(Debug, Clone, Default)]
pub struct RequestDescriptor {
    /// Ordered key/value entries.
    pub entries: Vec<(String, String)>,
    /// The descriptor's own cost (Envoy's per-descriptor `hits_addend`); a present 0 checks
    /// without consuming.
    pub cost: Option<u64>,
    /// A limit sent with the request, replacing whatever the rules say for this descriptor
    /// (Envoy's `RateLimitOverride`).
    pub limit_override: Option<LimitOverride>,
    /// `cost` is Envoy's per-descriptor `hits_addend`, counted on Envoy-style limits (fixed
    /// windows aligned on the clock) as envoyproxy/ratelimit counts it: usage that is always
    /// added, past the limit if it must be, and a 0 that is over the limit only once the count
    /// is above it. This is how Envoy's token quotas work: check with 0 before the request,
    /// then report what it used.
    pub envoy_hits: bool,
    /// The descriptor gives its cost back instead of taking it (Envoy's `is_negative_hits`):
    /// each limit it matches gets the units back in its current window, never past what it
    /// can hold, and the descriptor is answered `OK`.
    pub refund: bool,
}

/// A per-request limit (Envoy's `RateLimitOverride`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Requests per unit.
    pub requests_per_unit: u64,
    /// The unit.
    pub unit: Unit,
}

impl RequestDescriptor {
    /// A descriptor of `entries`, with no cost or limit of its own.
    pub fn new<K: Into<String>, V: Into<String>>(
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        RequestDescriptor {
            entries: entries
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            cost: None,
            limit_override: None,
            envoy_hits: false,
            refund: false,
        }
    }
}

impl DescriptorEntries for RequestDescriptor {
    fn entry_count(&self) -> usize {
        self.entries.len()
    }
    fn entry(&self, i: usize) -> (&str, &str) {
        (&self.entries[i].0, &self.entries[i].1)
    }
    fn cost(&self) -> Option<u64> {
        self.cost
    }
}

/// A request to decide.
#[derive(Debug, Clone, Default)]
pub struct LimitRequest {
    /// The rules domain.
    pub domain: String,
    /// The descriptors, each checked against the domain's rules.
    pub descriptors: Vec<RequestDescriptor>,
    /// The cost of each descriptor that has none of its own.
    pub cost: u64,
}

/// Why a request cannot be decided. Every message names the field and the bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    /// No domain.
    #[error("`domain` is missing or empty; name the rules domain to check against")]
    MissingDomain,
    /// No descriptors.
    #[error("`descriptors` is missing or empty; send at least one descriptor")]
    NoDescriptors,
    /// An entry without a key.
    #[error("`descriptors[{0}].entries[{1}].key` is empty")]
    EmptyKey(usize, usize),
    /// Something too large.
    #[error("`{field}` has {got}, more than the limit of {max}")]
    TooLarge {
        /// The field.
        field: String,
        /// What was sent.
        got: usize,
        /// The bound.
        max: usize,
    },
    /// A cost out of range.
    #[error("`{field}` is {got}, above the largest cost of {max}")]
    CostTooLarge {
        /// The field.
        field: String,
        /// What was sent.
        got: u64,
        /// The bound.
        max: u64,
    },
}

impl LimitRequest {
    /// Checks the request against the bounds in [`crate::limits`].
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        self.validate_costing(self.cost)
    }

    /// [`validate`](Self::validate) as if the request's cost were `cost`: how a reservation,
    /// which takes its amount instead of the request's cost, is checked without a copy.
    pub(crate) fn validate_costing(&self, cost: u64) -> Result<(), InvalidRequest> {
        if self.domain.is_empty() {
            return Err(InvalidRequest::MissingDomain);
        }
        within(&self.domain, || "domain".into())?;
        if self.descriptors.is_empty() {
            return Err(InvalidRequest::NoDescriptors);
        }
        at_most(self.descriptors.len(), MAX_DESCRIPTORS, || {
            "descriptors".into()
        })?;
        if cost > MAX_COST {
            return Err(InvalidRequest::CostTooLarge {
                field: "hits_addend".into(),
                got: cost,
                max: MAX_COST,
            });
        }
        for (i, d) in self.descriptors.iter().enumerate() {
            // A descriptor without entries matches no rule, so it is not limited: envoyproxy/
            // ratelimit answers it `OK`, and so does Sluice.
            at_most(d.entries.len(), MAX_ENTRIES, || {
                format!("descriptors[{i}].entries")
            })?;
            if let Some(cost) = d.cost.filter(|c| *c > MAX_COST) {
                return Err(InvalidRequest::CostTooLarge {
                    field: format!("descriptors[{i}].hits_addend"),
                    got: cost,
                    max: MAX_COST,
                });
            }
            for (j, (k, v)) in d.entries.iter().enumerate() {
                if k.is_empty() {
                    return Err(InvalidRequest::EmptyKey(i, j));
                }
                within(k, || format!("descriptors[{i}].entries[{j}].key"))?;
                within(v, || format!("descriptors[{i}].entries[{j}].value"))?;
            }
        }
        Ok(())
    }
}

/// `got` against `max`. The field is named only when it is too large: every request is
/// validated, and naming each field on the way costs more than the check.
fn at_most(got: usize, max: usize, field: impl FnOnce() -> String) -> Result<(), InvalidRequest> {
    if got > max {
        return Err(InvalidRequest::TooLarge {
            field: field(),
            got,
            max,
        });
    }
    Ok(())
}

/// A text field's length in characters against [`MAX_FIELD_LEN`].
fn within(text: &str, field: impl FnOnce() -> String) -> Result<(), InvalidRequest> {
    // No more characters than bytes: a short text needs no counting.
    if text.len() <= MAX_FIELD_LEN {
        return Ok(());
    }
    at_most(text.chars().count(), MAX_FIELD_LEN, field)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> LimitRequest {
        LimitRequest {
            domain: "d".into(),
            descriptors: vec![RequestDescriptor {
                entries: vec![("k".into(), "v".into())],
                ..Default::default()
            }],
            cost: 1,
        }
    }

    #[test]
    fn an_invalid_request_names_the_field_and_the_bound() {
        let mut r = request();
        r.descriptors[0].entries[0].1 = "é".repeat(MAX_FIELD_LEN + 1);
        let e = r.validate().unwrap_err();
        assert_eq!(
            e,
            InvalidRequest::TooLarge {
                field: "descriptors[0].entries[0].value".into(),
                got: MAX_FIELD_LEN + 1,
                max: MAX_FIELD_LEN,
            }
        );
        // Longer in bytes than the bound, but not in characters: valid.
        r.descriptors[0].entries[0].1 = "é".repeat(MAX_FIELD_LEN / 2 + 1);
        assert!(r.validate().is_ok());
        r.descriptors[0].entries = vec![("k".into(), "v".into()); MAX_ENTRIES + 1];
        assert!(
            r.validate()
                .unwrap_err()
                .to_string()
                .contains("descriptors[0].entries")
        );
    }
}
