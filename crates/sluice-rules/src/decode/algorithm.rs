//! A limit's algorithm and its optional parameters (`burst`, `queue_size`, `max_wait`,
//! `alignment`, `utc_offset`, `sub_windows`), each refused where it is written when it belongs to another
//! algorithm, and the core [`Policy`] they build.

use std::time::Duration;

use sluice_core::{
    Algorithm, Alignment, BucketedWindow, FixedWindow, Gcra, LeakyQueue, Policy, PolicyError, Rate,
    SlidingCounter, SlidingLog, TokenBucket,
};

use super::Decoder;
use super::fields::Fields;
use super::limit::param_name;
use crate::error::ErrorKind;
use crate::suggest::closest;
use crate::yaml::Node;

const ALIGNMENTS: &[&str] = &["clock", "first_request"];
const ALGORITHM_NAMES: &[&str] = &[
    "token_bucket",
    "gcra",
    "leaky_queue",
    "fixed_window",
    "sliding_log",
    "sliding_counter",
    "bucketed_window",
];

/// How many buckets a `bucketed_window` has when the rule does not say: an hour in minutes, a
/// minute in seconds.
pub(crate) const DEFAULT_SUB_WINDOWS: u32 = 60;

/// The optional algorithm parameters of one limit.
#[derive(Default)]
pub(super) struct Params<'n> {
    burst: Option<u64>,
    queue_size: Option<u64>,
    max_wait: Option<Duration>,
    first_request: Option<bool>,
    utc_offset: Option<(i32, &'n Node)>,
    sub_windows: Option<u32>,
}

impl Decoder {
    pub(super) fn algorithm(&mut self, node: &Node) -> Option<Algorithm> {
        let text = self.string("algorithm", node)?;
        match text.parse::<Algorithm>() {
            Ok(a) => Some(a),
            Err(_) => {
                let kind = ErrorKind::UnknownAlgorithm {
                    suggestion: closest(&text, ALGORITHM_NAMES),
                    name: text,
                };
                self.error(node, kind);
                None
            }
        }
    }

    /// The optional parameters of a limit of `algorithm` (`None` when the algorithm itself
    /// did not decode, so no parameter can be refused for it).
    pub(super) fn params<'n>(
        &mut self,
        fields: &Fields<'n>,
        algorithm: Option<Algorithm>,
    ) -> Params<'n> {
        let mut params = Params::default();
        for param in [
            "burst",
            "queue_size",
            "max_wait",
            "alignment",
            "utc_offset",
            "sub_windows",
        ] {
            let Some(n) = fields.get(param) else { continue };
            if let Some(algorithm) = algorithm.filter(|a| !param_applies(param, *a)) {
                let kind = ErrorKind::ParamNotForAlgorithm {
                    param: param_name(param),
                    algorithm: algorithm.name(),
                    applies_to: applies_to(param),
                };
                self.error(n, kind);
                continue;
            }
            match param {
                "burst" => params.burst = self.uint("burst", n),
                "queue_size" => params.queue_size = self.uint("queue_size", n),
                "max_wait" => params.max_wait = self.duration("max_wait", n),
                "alignment" => params.first_request = self.alignment(n),
                // Past u32 it is refused by the policy with the largest count it takes.
                "sub_windows" => {
                    params.sub_windows = self
                        .uint("sub_windows", n)
                        .map(|v| u32::try_from(v).unwrap_or(u32::MAX));
                }
                _ => params.utc_offset = self.utc_offset(n).map(|o| (o, n)),
            }
        }
        if let (Some(true), Some((_, n))) = (params.first_request, params.utc_offset) {
            let kind = ErrorKind::Conflict {
                first: "alignment: first_request",
                second: "utc_offset",
                hint: "a UTC offset only places clock-aligned windows",
            };
            self.error(n, kind);
        }
        params
    }

    /// `Some(true)` for first-request alignment.
    fn alignment(&mut self, node: &Node) -> Option<bool> {
        self.variant("alignment", node, ALIGNMENTS)
            .map(|a| a == "first_request")
    }
}

fn param_applies(param: &str, algorithm: Algorithm) -> bool {
    match param {
        "burst" => matches!(algorithm, Algorithm::TokenBucket | Algorithm::Gcra),
        "queue_size" | "max_wait" => algorithm == Algorithm::LeakyQueue,
        "sub_windows" => algorithm == Algorithm::BucketedWindow,
        _ => algorithm == Algorithm::FixedWindow,
    }
}

fn applies_to(param: &str) -> &'static str {
    match param {
        "burst" => "token_bucket and gcra",
        "queue_size" | "max_wait" => "leaky_queue",
        "sub_windows" => "bucketed_window",
        _ => "fixed_window",
    }
}

/// Maps one limit onto a core policy. `requests_per_unit` is the amount per window for every
/// algorithm; the rate-based ones default their burst or queue to that same amount, so switching
/// the algorithm alone keeps the long-run rate.
pub(super) fn build_policy(
    algorithm: Algorithm,
    window: Duration,
    requests: u64,
    params: &Params<'_>,
) -> Result<Policy, PolicyError> {
    Ok(match algorithm {
        Algorithm::TokenBucket => Policy::from(TokenBucket::new(
            params.burst.unwrap_or(requests),
            Rate::new(requests, window)?,
        )?),
        Algorithm::Gcra => Policy::from(Gcra::new(
            Rate::new(requests, window)?,
            params.burst.unwrap_or(requests),
        )?),
        Algorithm::LeakyQueue => Policy::from(LeakyQueue::new(
            Rate::new(requests, window)?,
            params.queue_size.unwrap_or(requests),
            match params.max_wait {
                Some(w) if w.is_zero() => {
                    return Err(PolicyError::ZeroDuration {
                        what: "maximum wait",
                    });
                }
                Some(w) => w,
                None => window,
            },
        )?),
        Algorithm::FixedWindow => {
            let alignment = if params.first_request == Some(true) {
                Alignment::FirstRequest
            } else {
                Alignment::Clock {
                    utc_offset_secs: params.utc_offset.map_or(0, |(o, _)| o),
                }
            };
            Policy::from(FixedWindow::new(requests, window, alignment)?)
        }
        Algorithm::SlidingLog => Policy::from(SlidingLog::new(requests, window)?),
        Algorithm::SlidingCounter => Policy::from(SlidingCounter::new(requests, window)?),
        Algorithm::BucketedWindow => Policy::from(BucketedWindow::new(
            requests,
            window,
            params.sub_windows.unwrap_or(DEFAULT_SUB_WINDOWS),
        )?),
    })
}
