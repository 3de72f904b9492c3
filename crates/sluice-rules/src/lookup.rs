//! Finding the rule behind a counter key, for the admin API's inspect-a-counter endpoint.

use std::sync::Arc;

use sluice_core::Policy;

use crate::key::policy_id;
use crate::model::DescriptorConfig;
use crate::ruleset::RuleSet;

impl RuleSet {
    /// The policy whose counters are named like `key`, if a rule in force writes it. A key ends
    /// in its policy's hash (see `docs/rules.md`, "Counter keys"), so any rule with that policy
    /// identifies how to read the counter.
    pub fn policy_for_key(&self, key: &str) -> Option<Arc<Policy>> {
        let (_, wanted) = key.rsplit_once("}:")?;
        fn walk(descriptors: &[DescriptorConfig], wanted: &str) -> Option<Arc<Policy>> {
            descriptors.iter().find_map(|d| {
                d.limits
                    .iter()
                    .find(|l| policy_id(&l.policy) == wanted)
                    .map(|l| l.policy.clone())
                    .or_else(|| walk(&d.descriptors, wanted))
            })
        }
        self.domains
            .values()
            .find_map(|d| walk(&d.config.descriptors, wanted))
    }
}

#[cfg(test)]
mod tests {
    use crate::RuleSet;

    #[test]
    fn a_matched_key_leads_back_to_its_policy() {
        let rules = RuleSet::parse(
            "t.yaml",
            "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 7}\n",
        )
        .unwrap();
        let m = rules.checks("api", &[[("user", "alice")]], 1);
        let policy = rules.policy_for_key(&m.checks[0].key).unwrap();
        assert_eq!(policy.limit(), 7);
        assert!(
            rules
                .policy_for_key("{api|user=alice}:0000000000000000")
                .is_none()
        );
        assert!(rules.policy_for_key("garbage").is_none());
    }
}
