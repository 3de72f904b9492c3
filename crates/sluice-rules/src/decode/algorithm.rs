//! A limit's algorithm and its optional parameters (`burst`, `queue_size`, `max_wait`,
//! `alignment`, `utc_offset`, `sub_windows`), each refused where it is written when it belongs to another
//! algorithm, and the core [`Policy`] they build.

use std::time::Duration;

use sluice_core::algorithm::{Param, PolicyParams};
use sluice_core::{Algorithm, Alignment, Policy, PolicyError};

use super::Decoder;
use super::fields::Fields;
use super::limit::param_name;
use crate::error::ErrorKind;
use crate::suggest::closest;
use crate::yaml::Node;

const ALIGNMENTS: &[&str] = &["clock", "first_request"];

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
                    suggestion: closest(&text, &Algorithm::NAMES),
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
        for param in Param::ALL {
            let Some(n) = fields.get(param.name()) else {
                continue;
            };
            if let Some(algorithm) = algorithm.filter(|a| !a.spec().takes(param)) {
                let kind = ErrorKind::ParamNotForAlgorithm {
                    param: param_name(param.name()),
                    algorithm: algorithm.name(),
                    applies_to: param.applies_to(),
                };
                self.error(n, kind);
                continue;
            }
            match param {
                Param::Burst => params.burst = self.uint("burst", n),
                Param::QueueSize => params.queue_size = self.uint("queue_size", n),
                Param::MaxWait => params.max_wait = self.duration("max_wait", n),
                Param::Alignment => params.first_request = self.alignment(n),
                // Past u32 it is refused by the policy with the largest count it takes.
                Param::SubWindows => {
                    params.sub_windows = self
                        .uint("sub_windows", n)
                        .map(|v| u32::try_from(v).unwrap_or(u32::MAX));
                }
                Param::UtcOffset => params.utc_offset = self.utc_offset(n).map(|o| (o, n)),
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

/// Maps one limit onto a core policy, as the algorithm table builds it. `requests_per_unit` is
/// the amount per window for every algorithm; the rate-based ones default their burst or queue
/// to that same amount, so switching the algorithm alone keeps the long-run rate.
pub(super) fn build_policy(
    algorithm: Algorithm,
    window: Duration,
    requests: u64,
    params: &Params<'_>,
) -> Result<Policy, PolicyError> {
    let alignment = match (params.first_request, params.utc_offset) {
        (Some(true), _) => Some(Alignment::FirstRequest),
        (_, Some((utc_offset_secs, _))) => Some(Alignment::Clock { utc_offset_secs }),
        _ => None,
    };
    algorithm.spec().build(&PolicyParams {
        burst: params.burst,
        queue_size: params.queue_size,
        max_wait: params.max_wait,
        alignment,
        sub_windows: params.sub_windows,
        ..PolicyParams::new(requests, window)
    })
}
