//! Gateway routes whose descriptor keys no rule of their domain has: such a route builds
//! descriptors that never match, so its requests pass unlimited without a word. A warning, not
//! an error, because a domain may gain the key in a later file or reload.

use std::collections::BTreeSet;
use std::fmt;

use crate::Location;
use crate::model::DescriptorConfig;
use crate::ruleset::RuleSet;
use crate::suggest::closest;

/// A route's descriptor key that no rule of the route's domain has, at any depth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnmatchedRouteKey {
    /// Where the route starts.
    pub location: Location,
    /// The route's name.
    pub route: String,
    /// The domain its descriptors are checked against.
    pub domain: String,
    /// The key no rule has.
    pub key: String,
    /// The domain's key closest to it, when one is a likely typo.
    pub suggestion: Option<String>,
}

impl fmt::Display for UnmatchedRouteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: route `{}` uses descriptor key `{}`, which no rule of domain `{}` has, so it \
             is never limited",
            self.location,
            self.route.escape_debug(),
            self.key.escape_debug(),
            self.domain.escape_debug()
        )?;
        if let Some(s) = &self.suggestion {
            write!(f, " (did you mean `{}`?)", s.escape_debug())?;
        }
        Ok(())
    }
}

impl RuleSet {
    /// Every gateway route key that no rule of its domain has, in route order. A route whose
    /// domain has no rules at all is left out: that is reported where domains are.
    pub fn unmatched_route_keys(&self) -> Vec<UnmatchedRouteKey> {
        let Some(gateway) = self.gateway() else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for route in &gateway.routes {
            let Some(domain) = self.domain(&route.domain) else {
                continue;
            };
            let mut keys = BTreeSet::new();
            collect_keys(&domain.descriptors, &mut keys);
            let known: Vec<&str> = keys.into_iter().collect();
            let mut reported = BTreeSet::new();
            for entry in route.descriptors.iter().flatten() {
                if known.contains(&entry.key.as_str()) || !reported.insert(entry.key.as_str()) {
                    continue;
                }
                found.push(UnmatchedRouteKey {
                    location: route.location.clone(),
                    route: route.name.to_string(),
                    domain: route.domain.clone(),
                    key: entry.key.clone(),
                    suggestion: closest(&entry.key, &known).map(str::to_owned),
                });
            }
        }
        found
    }
}

/// Every key of `descriptors` and their children.
fn collect_keys<'a>(descriptors: &'a [DescriptorConfig], keys: &mut BTreeSet<&'a str>) {
    for d in descriptors {
        keys.insert(d.key.as_str());
        collect_keys(&d.descriptors, keys);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keys_no_rule_has_at_any_depth_are_reported() {
        let text = "domain: d\ndescriptors:\n  - key: tenant\n    descriptors:\n      - key: user\n        rate_limit: {unit: second, requests_per_unit: 1}\n\
                    routes:\n  - name: r\n    descriptors:\n      - [{key: tenant, from: \"header:t\"}, {key: user, from: \"header:u\"}]\n      - [{key: colour, from: \"header:c\"}, {key: colour, from: \"header:c\"}]\n";
        let rules = RuleSet::parse("g.yaml", text).unwrap();
        let found = rules.unmatched_route_keys();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].key.as_str(), found[0].suggestion.as_deref()),
            ("colour", None)
        );
        assert_eq!(found[0].location.to_string(), "g.yaml:8:5");
    }
}
