//! The matcher: from a request's descriptors to the checks a store decides.
//!
//! Each domain compiles into a tree of hash maps, one level per descriptor depth: entry key →
//! (exact value → node, wildcard prefixes by length → node, wildcard patterns → node, key-only
//! node). Matching an entry is a few hash lookups whatever the number of exact and prefix rules,
//! and a descriptor of `n` entries walks `n` levels. Only wildcards with a `*` before the end
//! (`/api/*/action`) are tried one by one, in file order, and only when no exact value or
//! prefix matched.
//!
//! The semantics are envoyproxy/ratelimit's:
//! - at each level an exact value wins over a wildcard, and a wildcard over a key-only rule;
//!   among wildcards the longest prefix wins, then the first pattern in file order;
//! - the walk never backtracks: once an entry picked a rule, the next entry is looked up among
//!   that rule's children only;
//! - a limit applies only when the request's descriptor ends exactly at a rule that has one. A
//!   descriptor that is longer or shorter than any configured path is not limited;
//! - `unlimited` yields no check; `replaces` drops, from the whole request, every matched limit
//!   whose `name` another matched limit names.

use std::collections::HashSet;
use std::sync::Arc;

use sluice_core::Check;

use crate::key::{KEY_SUFFIX_LEN, close_key, policy_id, push_encoded};

/// The matcher's maps hash only strings from rule files on insert, and request strings on
/// lookup, which cannot grow a chain; a fast hasher is safe here and halves a lookup's cost.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
use crate::model::{DescriptorConfig, DomainConfig, LimitConfig, Metadata, Mode, ValueMatch};

/// One limit as the matcher hands it out: the limit as its file states it, placed in its domain
/// (its path, mode and its descriptor's settings). Shared (`Arc`) between the rule set, every
/// check it produces and every result of a decision, so that one type carries a limit from the
/// rule file to the answer and nothing downstream copies its policy, mode or name.
///
/// A rule reads as its limit: `rule.policy`, `rule.action`, `rule.name` are [`Rule::limit`]'s,
/// through `Deref`.
#[derive(Debug)]
pub struct Rule {
    /// The limit: its policy, name, action, `shadow`, `on_store_error`, location and `replaces`.
    pub limit: LimitConfig,
    /// How its denials count: enforced, shadow or soft, from `shadow` and `action`.
    pub mode: Mode,
    /// Envoy's `detailed_metric`: label metrics with the request's values, not only the rule.
    pub detailed_metric: bool,
    /// The rule's path in its domain, such as `api/user/path=/login`: a stable, bounded label
    /// for metrics that does not grow with request values.
    pub path: Arc<str>,
    /// The same path as envoyproxy/ratelimit names the rule's statistics, `api.user.path_/login`
    /// (levels joined by `.`, a value after its key and `_`); empty for a standalone rule.
    stat_path: Arc<str>,
    /// Envoy's `quota_mode`: a denial refuses the request only when every quota descriptor
    /// of the request is denied.
    pub quota: bool,
    /// Envoy's `metadata` of the rule's descriptor, returned in dynamic metadata when a
    /// request passes it.
    pub metadata: Option<Arc<Metadata>>,
    /// How the metric label is built from the request when `detailed_metric` or
    /// `value_to_metric` puts request values in it; `None` when the label is [`Rule::path`]
    /// (or the name).
    metric_parts: Option<Box<[LabelPart]>>,
    /// The policy's part of counter keys; empty for a standalone rule, whose key its maker
    /// builds.
    policy_id: String,
    /// Made in code for one use ([`Rule::standalone`]), not part of a rule set.
    standalone: bool,
    /// For a rule made by [`Rule::overridden_by`], the rule of the set whose limit a runtime
    /// override replaced; this one is not itself part of the set.
    overridden: Option<Arc<Rule>>,
}

impl std::ops::Deref for Rule {
    type Target = LimitConfig;

    fn deref(&self) -> &LimitConfig {
        &self.limit
    }
}

impl Rule {
    /// A rule outside any rule set, for a limit made in code rather than read from a file, such
    /// as Envoy's per-request `limit` override: labelled `path`, with none of a descriptor's
    /// settings (no quota mode, metadata or per-value metric labels). Its counter key is its
    /// maker's to build.
    pub fn standalone(limit: LimitConfig, path: Arc<str>) -> Rule {
        Rule {
            mode: Mode::of(&limit.action, limit.shadow),
            limit,
            detailed_metric: false,
            path,
            stat_path: Arc::from(""),
            quota: false,
            metadata: None,
            metric_parts: None,
            policy_id: String::new(),
            standalone: true,
            overridden: None,
        }
    }

    /// This rule with its limit replaced by `limit`, set at run time (a runtime override): the
    /// same place in its domain (path, quota mode, metadata, metric labels) and the same `name`
    /// and `replaces`, so that it is reported, counted and replaced as this rule is, under
    /// `limit`'s policy, action and modes. The new rule is not the set's
    /// ([`Rule::is_overridden`]).
    pub fn overridden_by(self: &Arc<Self>, limit: LimitConfig) -> Rule {
        let limit = LimitConfig {
            name: self.limit.name.clone(),
            replaces: self.limit.replaces.clone(),
            ..limit
        };
        Rule {
            mode: Mode::of(&limit.action, limit.shadow),
            limit,
            detailed_metric: self.detailed_metric,
            path: Arc::clone(&self.path),
            stat_path: Arc::clone(&self.stat_path),
            quota: self.quota,
            metadata: self.metadata.clone(),
            metric_parts: self.metric_parts.clone(),
            policy_id: self.policy_id.clone(),
            standalone: false,
            overridden: Some(Arc::clone(self)),
        }
    }

    /// Whether the rule was made by [`Rule::overridden_by`]: a rule set's rule under a limit set
    /// at run time. Like a standalone rule, it is not one of the set's, so nothing may be cached
    /// by its address.
    pub fn is_overridden(&self) -> bool {
        self.overridden.is_some()
    }

    /// The rule of the set this one overrides ([`Rule::overridden_by`]), if it is an override.
    /// Both have the same labels, so the set's rule names the series its decisions count in.
    pub fn overridden_rule(&self) -> Option<&Arc<Rule>> {
        self.overridden.as_ref()
    }

    /// Whether the rule was made by [`Rule::standalone`]: it belongs to no rule set, so its
    /// address names no rule beyond its own short life and nothing may be cached by it.
    pub fn is_standalone(&self) -> bool {
        self.standalone
    }

    /// The name the rate-limit fields and metrics show: the limit's `name`, else the rule's
    /// path.
    pub fn label(&self) -> &str {
        self.limit.name.as_deref().unwrap_or(&self.path)
    }

    /// The limits this one removes from a request.
    pub fn replaces(&self) -> &[Arc<str>] {
        &self.limit.replaces
    }

    /// Appends to `out` the key envoyproxy/ratelimit names this rule's statistics by for a
    /// decision on `descriptor` (a request descriptor this rule matched), the `KEY_VALUE` of
    /// `ratelimit.service.rate_limit.DOMAIN.KEY_VALUE.total_hits`, unsanitized: the domain, then
    /// each level as `key` or `key_value`, joined by `.`, with the request's values where
    /// `detailed_metric` or `value_to_metric` ask for them, as Envoy places them (a
    /// `detailed_metric` level always reads `key_value`, even for an empty value). Dashboards
    /// built on Envoy's statistics read these names, so they follow Envoy's shape rather than
    /// [`Rule::path`]'s. Nothing is appended for a standalone rule, which has no place in a
    /// domain: its maker names it.
    pub fn write_stat_key<D: DescriptorEntries + ?Sized>(&self, descriptor: &D, out: &mut String) {
        let Some(parts) = self.metric_parts.as_deref() else {
            out.push_str(&self.stat_path);
            return;
        };
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                out.push('.');
            }
            match part {
                LabelPart::Fixed { stat, .. } => out.push_str(stat),
                LabelPart::Value => {
                    let (key, value) = descriptor.entry(i - 1);
                    out.push_str(key);
                    if self.detailed_metric || !value.is_empty() {
                        out.push('_');
                        out.push_str(value);
                    }
                }
            }
        }
    }

    /// The metric label of a decision on `descriptor` (a request descriptor this rule
    /// matched), when `detailed_metric` or `value_to_metric` asks for the request's values in
    /// it: the rule's path with those values in place, such as `api/user=alice/path=/login`.
    /// `None` when the label does not depend on the request.
    pub fn metric_label<D: DescriptorEntries + ?Sized>(&self, descriptor: &D) -> Option<String> {
        let parts = self.metric_parts.as_deref()?;
        let mut label = String::new();
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                label.push('/');
            }
            match part {
                LabelPart::Fixed { label: text, .. } => label.push_str(text),
                LabelPart::Value => {
                    // Parts after the domain follow the request's entries one to one.
                    let (key, value) = descriptor.entry(i - 1);
                    label.push_str(key);
                    if !value.is_empty() {
                        label.push('=');
                        label.push_str(value);
                    }
                }
            }
        }
        Some(label)
    }
}

/// One level of a metric label: the rule's own text, or the request's entry at that level.
#[derive(Debug, Clone)]
enum LabelPart {
    /// As the rule reads: the domain, `key`, `key=value` or `key=pattern*` (`label`), and the
    /// same as Envoy's statistics name it: the domain, `key`, `key_value` or `key_pattern*`
    /// (`stat`).
    Fixed {
        /// Sluice's form.
        label: Box<str>,
        /// Envoy's form.
        stat: Box<str>,
    },
    /// The request's `key=value` at this level.
    Value,
}

/// The metric label parts of the path down to a node, under both of Envoy's rules: with
/// `value_to_metric` (values only where a level asks for them) and with `detailed_metric` on
/// the leaf (every value, but a `share_threshold` wildcard's pattern).
#[derive(Debug, Clone)]
struct LabelPath {
    by_value: Vec<LabelPart>,
    detailed: Vec<LabelPart>,
}

/// One check to make for a request: a counter, its rule, and the cost.
#[derive(Debug, Clone)]
pub struct MatchedCheck {
    /// Which of the request's descriptors produced it, for per-descriptor answers (Envoy's
    /// `descriptor_statuses`).
    pub descriptor: usize,
    /// The counter key, at most [`crate::MAX_KEY_LEN`] bytes.
    pub key: String,
    /// How many units the request takes.
    pub cost: u64,
    /// The rule that limits it: the matched one, or one made for the request
    /// ([`Rule::standalone`]).
    pub rule: Arc<Rule>,
}

impl MatchedCheck {
    /// The check in the form [`sluice_core::Store::check`] takes, for a decision without a
    /// reservation: at its cost, except a concurrency limit, which nothing would release, so it
    /// is asked at cost 0 whether a slot is free ([`sluice_core::Policy::units`]).
    pub fn as_check(&self) -> Check<'_> {
        Check::new(&self.key, &self.rule.policy, self.units(false))
    }

    /// The check in the form [`sluice_core::Store::reserve`] takes: at its cost, except a
    /// concurrency limit, of which a reservation takes one slot whatever its amount.
    pub fn as_reservation(&self) -> Check<'_> {
        Check::new(&self.key, &self.rule.policy, self.units(true))
    }

    /// The units this check takes from its counter.
    pub fn units(&self, reserving: bool) -> u64 {
        self.rule.policy.units(self.cost, reserving)
    }
}

/// Whether `d` or a descriptor nested in it has a concurrency limit.
fn limits_concurrency(d: &DescriptorConfig) -> bool {
    d.limits.iter().any(|l| l.policy.concurrent()) || d.descriptors.iter().any(limits_concurrency)
}

/// A request descriptor the matcher can read: an ordered list of key/value entries, and
/// optionally its own cost (Envoy's per-descriptor `hits_addend`).
pub trait DescriptorEntries {
    /// How many entries.
    fn entry_count(&self) -> usize;
    /// The `i`th entry's key and value.
    fn entry(&self, i: usize) -> (&str, &str);
    /// This descriptor's own cost, overriding the request's.
    fn cost(&self) -> Option<u64> {
        None
    }
}

impl<T: DescriptorEntries + ?Sized> DescriptorEntries for &T {
    fn entry_count(&self) -> usize {
        (**self).entry_count()
    }
    fn entry(&self, i: usize) -> (&str, &str) {
        (**self).entry(i)
    }
    fn cost(&self) -> Option<u64> {
        (**self).cost()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> DescriptorEntries for [(K, V)] {
    fn entry_count(&self) -> usize {
        self.len()
    }
    fn entry(&self, i: usize) -> (&str, &str) {
        (self[i].0.as_ref(), self[i].1.as_ref())
    }
}

impl<K: AsRef<str>, V: AsRef<str>> DescriptorEntries for Vec<(K, V)> {
    fn entry_count(&self) -> usize {
        self.len()
    }
    fn entry(&self, i: usize) -> (&str, &str) {
        (self[i].0.as_ref(), self[i].1.as_ref())
    }
}

impl<K: AsRef<str>, V: AsRef<str>, const N: usize> DescriptorEntries for [(K, V); N] {
    fn entry_count(&self) -> usize {
        N
    }
    fn entry(&self, i: usize) -> (&str, &str) {
        (self[i].0.as_ref(), self[i].1.as_ref())
    }
}

/// One compiled rule: its limits and its children.
#[derive(Debug, Default)]
struct Node {
    limits: Vec<Arc<Rule>>,
    unlimited: bool,
    /// For a wildcard rule with `share_threshold`, the encoded pattern that stands in for the
    /// value in counter keys, so every matching value shares one counter.
    shared_value: Option<String>,
    children: Level,
}

/// The rules at one depth, indexed by entry key.
#[derive(Debug, Default)]
struct Level {
    keys: HashMap<Box<str>, KeyRules>,
}

impl Level {
    /// The nodes at this depth, not their children.
    fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.keys.values().flat_map(|k| {
            k.exact
                .values()
                .chain(k.prefixes.iter().flat_map(|(_, map)| map.values()))
                .chain(k.patterns.iter().map(|(_, n)| n))
                .chain(k.any.as_deref())
        })
    }
}

/// The rules for one entry key at one depth.
#[derive(Debug, Default)]
struct KeyRules {
    exact: HashMap<Box<str>, Node>,
    /// Wildcards grouped by prefix length, longest first: one lookup per distinct length.
    prefixes: Vec<(usize, HashMap<Box<str>, Node>)>,
    /// Wildcards elsewhere than at the end, as their literal parts, in file order: the first
    /// that matches wins, after every prefix.
    patterns: Vec<(Vec<String>, Node)>,
    any: Option<Box<Node>>,
}

impl KeyRules {
    fn find(&self, value: &str) -> Option<&Node> {
        if let Some(n) = self.exact.get(value) {
            return Some(n);
        }
        for (len, map) in &self.prefixes {
            if let Some(n) = value.get(..*len).and_then(|p| map.get(p)) {
                return Some(n);
            }
        }
        if let Some((_, n)) = self
            .patterns
            .iter()
            .find(|(parts, _)| ValueMatch::pattern_matches(parts, value))
        {
            return Some(n);
        }
        self.any.as_deref()
    }
}

/// A compiled domain.
#[derive(Debug)]
pub(crate) struct CompiledDomain {
    pub(crate) config: DomainConfig,
    /// The encoded domain, the first component of every key.
    key_prefix: String,
    root: Level,
    /// Whether any of its limits is a concurrency limit, which a front end can only hold with
    /// a reservation that the answer's end releases.
    pub(crate) concurrent: bool,
}

impl CompiledDomain {
    pub(crate) fn compile(config: DomainConfig) -> Self {
        let mut key_prefix = String::new();
        push_encoded(&mut key_prefix, &config.name);
        let mut root = Level::default();
        let name = || LabelPart::Fixed {
            label: config.name.as_str().into(),
            stat: config.name.as_str().into(),
        };
        let domain = LabelPath {
            by_value: vec![name()],
            detailed: vec![name()],
        };
        let parent = ParentPath {
            path: &config.name,
            stat_path: &config.name,
            labels: &domain,
        };
        for d in &config.descriptors {
            insert(&mut root, d, &parent);
        }
        let concurrent = config.descriptors.iter().any(limits_concurrency);
        CompiledDomain {
            config,
            key_prefix,
            root,
            concurrent,
        }
    }

    /// Every rule of the domain, in no particular order.
    pub(crate) fn rules(&self) -> impl Iterator<Item = &Arc<Rule>> {
        let mut pending: Vec<&Node> = self.root.nodes().collect();
        std::iter::from_fn(move || {
            let node = pending.pop()?;
            pending.extend(node.children.nodes());
            Some(node)
        })
        .flat_map(|node| &node.limits)
    }

    /// The node where a request descriptor ends, if any.
    fn find<D: DescriptorEntries + ?Sized>(&self, descriptor: &D) -> Option<(&Node, bool)> {
        let mut level = &self.root;
        let mut node = None;
        let mut shared = false;
        for i in 0..descriptor.entry_count() {
            let (key, value) = descriptor.entry(i);
            let found = level.keys.get(key)?.find(value)?;
            shared |= found.shared_value.is_some();
            level = &found.children;
            node = Some(found);
        }
        node.map(|n| (n, shared))
    }

    /// The counter identity of a descriptor that [`Self::find`] matched, after a `{`. Built
    /// only once a match is certain, so a miss allocates nothing; the path is walked again only
    /// when a `share_threshold` wildcard on it replaces a value by its pattern.
    fn identity<D: DescriptorEntries + ?Sized>(&self, descriptor: &D, shared: bool) -> String {
        let n = descriptor.entry_count();
        let mut identity =
            String::with_capacity(1 + self.key_prefix.len() + 24 * n + KEY_SUFFIX_LEN);
        identity.push('{');
        identity.push_str(&self.key_prefix);
        let mut level = Some(&self.root);
        for i in 0..n {
            let (key, value) = descriptor.entry(i);
            identity.push('|');
            push_encoded(&mut identity, key);
            identity.push('=');
            let found = if shared {
                level.and_then(|l| l.keys.get(key)?.find(value))
            } else {
                None
            };
            match found.and_then(|f| f.shared_value.as_deref()) {
                Some(pattern) => identity.push_str(pattern),
                None => push_encoded(&mut identity, value),
            }
            level = found.map(|f| &f.children);
        }
        identity
    }
}

/// Where a descriptor sits: its parent's path in both forms, and its parent's label parts.
struct ParentPath<'a> {
    path: &'a str,
    stat_path: &'a str,
    labels: &'a LabelPath,
}

fn insert(level: &mut Level, d: &DescriptorConfig, parent: &ParentPath<'_>) {
    let (own, stat_own) = match &d.value {
        ValueMatch::Any => (d.key.clone(), d.key.clone()),
        v => (format!("{}={v}", d.key), format!("{}_{v}", d.key)),
    };
    let path: Arc<str> = format!("{}/{own}", parent.path).into();
    let stat_path: Arc<str> = format!("{}.{stat_own}", parent.stat_path).into();
    let wildcard = matches!(d.value, ValueMatch::Prefix(_) | ValueMatch::Pattern(_));
    let fixed = || LabelPart::Fixed {
        label: own.as_str().into(),
        stat: stat_own.as_str().into(),
    };
    let mut labels = parent.labels.clone();
    labels.by_value.push(match &d.value {
        ValueMatch::Exact(_) => fixed(),
        _ if wildcard && d.share_threshold => fixed(),
        _ if d.value_to_metric => LabelPart::Value,
        _ => fixed(),
    });
    labels.detailed.push(if wildcard && d.share_threshold {
        fixed()
    } else {
        LabelPart::Value
    });
    let metric_parts: Option<Box<[LabelPart]>> = if d.detailed_metric {
        Some(labels.detailed.clone().into())
    } else if labels
        .by_value
        .iter()
        .any(|p| matches!(p, LabelPart::Value))
    {
        Some(labels.by_value.clone().into())
    } else {
        None
    };
    let mut node = Node {
        unlimited: d.unlimited,
        limits: d
            .limits
            .iter()
            .map(|l| {
                Arc::new(compile_limit(
                    l,
                    d,
                    [path.clone(), stat_path.clone()],
                    metric_parts.clone(),
                ))
            })
            .collect(),
        ..Node::default()
    };
    if d.share_threshold {
        // Every value the wildcard matches shares the counter named by the wildcard itself.
        let mut pattern = String::new();
        match &d.value {
            ValueMatch::Prefix(p) => {
                push_encoded(&mut pattern, p);
                pattern.push('*');
            }
            ValueMatch::Pattern(parts) => {
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        pattern.push('*');
                    }
                    push_encoded(&mut pattern, part);
                }
            }
            ValueMatch::Any | ValueMatch::Exact(_) => {}
        }
        if !pattern.is_empty() {
            node.shared_value = Some(pattern);
        }
    }
    let here = ParentPath {
        path: &path,
        stat_path: &stat_path,
        labels: &labels,
    };
    for child in &d.descriptors {
        insert(&mut node.children, child, &here);
    }
    let rules = level.keys.entry(d.key.as_str().into()).or_default();
    // Duplicates were refused while decoding, so each slot is filled once.
    match &d.value {
        ValueMatch::Any => rules.any = Some(Box::new(node)),
        ValueMatch::Exact(v) => {
            rules.exact.insert(v.as_str().into(), node);
        }
        ValueMatch::Prefix(p) => {
            let i = match rules.prefixes.iter().position(|(len, _)| *len <= p.len()) {
                Some(i) if rules.prefixes[i].0 == p.len() => i,
                Some(i) => {
                    rules.prefixes.insert(i, (p.len(), HashMap::default()));
                    i
                }
                None => {
                    rules.prefixes.push((p.len(), HashMap::default()));
                    rules.prefixes.len() - 1
                }
            };
            rules.prefixes[i].1.insert(p.as_str().into(), node);
        }
        ValueMatch::Pattern(parts) => rules.patterns.push((parts.clone(), node)),
    }
}

/// The rule of limit `l` of descriptor `d`, at `path` (Sluice's form, then Envoy's).
fn compile_limit(
    l: &LimitConfig,
    d: &DescriptorConfig,
    [path, stat_path]: [Arc<str>; 2],
    metric_parts: Option<Box<[LabelPart]>>,
) -> Rule {
    Rule {
        quota: d.quota_mode,
        metadata: d.metadata.clone(),
        metric_parts,
        policy_id: policy_id(&l.policy),
        mode: Mode::of(&l.action, l.shadow),
        limit: l.clone(),
        detailed_metric: d.detailed_metric,
        path,
        stat_path,
        standalone: false,
        overridden: None,
    }
}

/// What matching found for one request: every check to make, and which descriptors were
/// explicitly unlimited (a front end answers those `OK` without asking the store).
#[derive(Debug, Clone, Default)]
pub struct Matches {
    /// The checks, in descriptor order, after `replaces` has removed what it names.
    pub checks: Vec<MatchedCheck>,
    /// Indexes of descriptors that ended at an `unlimited` rule.
    pub unlimited: Vec<usize>,
}

fn matched(descriptor: usize, key: String, cost: u64, rule: &Arc<Rule>) -> MatchedCheck {
    MatchedCheck {
        descriptor,
        key,
        cost,
        rule: Arc::clone(rule),
    }
}

pub(crate) fn match_request<D: DescriptorEntries>(
    domain: &CompiledDomain,
    descriptors: &[D],
    default_cost: u64,
) -> Matches {
    // Most descriptors make one check: room for them, so that pushing them does not grow the
    // vector step by step.
    let mut out = Matches {
        checks: Vec::with_capacity(descriptors.len()),
        unlimited: Vec::new(),
    };
    let mut any_replaces = false;
    for (i, d) in descriptors.iter().enumerate() {
        let Some((node, shared)) = domain.find(d) else {
            continue;
        };
        if node.unlimited {
            out.unlimited.push(i);
            continue;
        }
        let cost = d.cost().unwrap_or(default_cost);
        let Some((last, others)) = node.limits.split_last() else {
            continue;
        };
        let identity = domain.identity(d, shared);
        for rule in others.iter() {
            out.checks.push(matched(
                i,
                close_key(identity.clone(), &rule.policy_id),
                cost,
                rule,
            ));
        }
        out.checks
            .push(matched(i, close_key(identity, &last.policy_id), cost, last));
        any_replaces |= node.limits.iter().any(|r| !r.replaces().is_empty());
    }
    if any_replaces {
        let replaced: HashSet<&str> = out
            .checks
            .iter()
            .flat_map(|c| c.rule.replaces().iter().map(|r| &**r))
            .collect();
        let keep: Vec<bool> = out
            .checks
            .iter()
            .map(|c| c.rule.name.as_deref().is_none_or(|n| !replaced.contains(n)))
            .collect();
        let mut keep = keep.into_iter();
        out.checks.retain(|_| keep.next().unwrap_or(true));
    }
    out
}
