//! The debug listener envoyproxy/ratelimit users know (its `DEBUG_PORT`): `GET /rlconfig`, the
//! rules in force as one line per limit, plus the admin and operations endpoints.

use std::fmt::Write as _;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use sluice_http::admin::{self, AdminState};
use sluice_rules::{DescriptorConfig, RuleSet, Unit};

/// The debug router: `/rlconfig` and the admin router.
pub(crate) fn router(state: AdminState) -> Router {
    Router::new()
        .route("/rlconfig", get(rlconfig))
        .with_state(state.clone())
        .merge(admin::router(state))
}

async fn rlconfig(State(state): State<AdminState>) -> String {
    dump(&state.limiter.reloader().rules())
}

/// One line per limit, `domain.key_value.key2: …`, in the order the rules list them: the
/// composite key as envoyproxy/ratelimit names it, then the limit.
pub fn dump(rules: &RuleSet) -> String {
    let mut out = String::new();
    for name in rules.domain_names() {
        if let Some(domain) = rules.domain(name) {
            for d in &domain.descriptors {
                dump_descriptor(&mut out, &domain.name, d);
            }
        }
    }
    out
}

fn dump_descriptor(out: &mut String, parent: &str, d: &DescriptorConfig) {
    let value = d.value.to_string();
    let path = if value.is_empty() {
        format!("{parent}.{}", d.key)
    } else {
        format!("{parent}.{}_{value}", d.key)
    };
    if d.unlimited {
        let _ = writeln!(out, "{path}: unlimited");
    }
    for limit in &d.limits {
        let policy = &limit.policy;
        let (requests, per) = policy.requests_per();
        let unit = Unit::ALL
            .into_iter()
            .find(|u| u.duration() == per)
            .map_or_else(
                || format!("{}s", per.as_secs_f64()),
                |u| u.name().to_ascii_uppercase(),
            );
        let _ = write!(
            out,
            "{path}: unit={unit} requests_per_unit={requests}, shadow_mode: {}",
            limit.shadow
        );
        if let Some(name) = &limit.name {
            let _ = write!(out, ", name: {name}");
        }
        let _ = write!(out, ", algorithm: {}", policy.algorithm().name());
        // A rate's burst has no place in Envoy's two numbers: the whole limit follows.
        if policy.rate().is_some() {
            let _ = write!(out, " ({policy})");
        }
        out.push('\n');
    }
    for child in &d.descriptors {
        dump_descriptor(out, &path, child);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limit_is_one_line_under_its_composite_key() {
        let rules = RuleSet::from_sources([(
            "rules.yaml",
            "domain: rl\ndescriptors:\n  - key: generic_key\n    value: slowpath\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: client\n    descriptors:\n      - key: path\n        value: /api/*\n        rate_limit: {name: api, unit: hour, requests_per_unit: 500}\n      - key: bot\n        rate_limit: {unlimited: true}\n",
        )])
        .unwrap();
        assert_eq!(
            dump(&rules),
            "rl.generic_key_slowpath: unit=MINUTE requests_per_unit=10, shadow_mode: false, algorithm: fixed_window\n\
             rl.client.path_/api/*: unit=HOUR requests_per_unit=500, shadow_mode: false, name: api, algorithm: fixed_window\n\
             rl.client.bot: unlimited\n"
        );
    }

    #[test]
    fn a_rate_is_listed_as_its_rate_then_its_whole_limit() {
        let rules = RuleSet::from_sources([(
            "rules.yaml",
            "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 20, burst: 40}\n",
        )])
        .unwrap();
        assert_eq!(
            dump(&rules),
            "rl.user: unit=SECOND requests_per_unit=20, shadow_mode: false, algorithm: token_bucket \
             (20 per second, burst 40)\n"
        );
    }
}
