//! The rule model: what a rule file says once it has been read and validated.
//!
//! Every limit already holds its validated [`Policy`], so a model that exists is a model that
//! works: nothing is checked again when requests arrive.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::Policy;

use crate::error::Location;

/// Envoy's rate-limit units. Each is a fixed length aligned on the Unix epoch, exactly as
/// envoyproxy/ratelimit counts them: a month is 30 days and a year 365, not calendar ones, so a
/// file moved from Envoy to Sluice limits the same windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days, as Envoy counts a month.
    Month,
    /// 365 days, as Envoy counts a year.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The names the configuration uses, in the order of [`Unit::ALL`].
    pub const NAMES: [&'static str; 7] =
        ["second", "minute", "hour", "day", "week", "month", "year"];

    /// The unit's name in a rule file.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The unit's length.
    pub fn duration(self) -> Duration {
        const DAY: u64 = 86_400;
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        })
    }

    /// Looks a unit up by name, ignoring case as Envoy does (`SECOND` and `second` both work).
    pub fn parse(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a descriptor matches a request entry's value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ValueMatch {
    /// No `value`: any value matches, and each distinct value gets its own counter.
    Any,
    /// `value: foo`: only this value.
    Exact(String),
    /// `value: foo*`: any value starting with `foo`. Each distinct value gets its own counter
    /// unless the descriptor sets `share_threshold`, in which case they share one.
    Prefix(String),
    /// `value: /api/*/action` or `foo*bar*baz`: wildcards elsewhere than at the end, each
    /// matching any run of characters (none included). Held as the literal parts between the
    /// `*`s: the value starts with the first, ends with the last, and holds the others in order
    /// between. Counters as for [`ValueMatch::Prefix`].
    Pattern(Vec<String>),
}

impl ValueMatch {
    /// Whether `value` matches a [`ValueMatch::Pattern`]'s `parts`, as Envoy matches a
    /// wildcard: the first part leads, the last ends, the middle ones follow in order, without
    /// overlapping.
    pub fn pattern_matches(parts: &[String], value: &str) -> bool {
        let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
            return false;
        };
        if parts.len() == 1 {
            return first == value;
        }
        let fixed: usize = parts.iter().map(String::len).sum();
        if value.len() < fixed
            || !value.starts_with(first.as_str())
            || !value.ends_with(last.as_str())
        {
            return false;
        }
        let mut rest = &value[first.len()..value.len() - last.len()];
        for part in &parts[1..parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

impl fmt::Display for ValueMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueMatch::Any => Ok(()),
            ValueMatch::Exact(v) => f.write_str(v),
            ValueMatch::Prefix(p) => write!(f, "{p}*"),
            ValueMatch::Pattern(parts) => f.write_str(&parts.join("*")),
        }
    }
}

/// A value of a descriptor's `metadata`, as a protobuf `Struct` holds it: what Envoy receives
/// in an answer's dynamic metadata.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// `null`, `~` or nothing.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number; protobuf's `Struct` holds every number as a double.
    Number(f64),
    /// Any other scalar.
    String(String),
    /// A list.
    List(Vec<MetaValue>),
    /// A mapping, in file order; keys are unique.
    Map(Metadata),
}

/// A descriptor's `metadata`: its fields in file order.
pub type Metadata = Vec<(String, MetaValue)>;

/// What happens to a request that a limit turns away.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum Action {
    /// `429 Too Many Requests` with `Retry-After`. The default.
    #[default]
    Reject,
    /// The request passes; the would-be denial is logged and counted. Envoy's `shadow_mode`.
    Shadow,
    /// A canned answer that never reaches the API, so a spammer cannot tell it was limited.
    Fake {
        /// The HTTP status, 200 unless set.
        status: u16,
        /// The body's media type.
        content_type: String,
        /// The body.
        body: String,
    },
    /// The request waits for its turn, up to a bound, instead of being rejected.
    Delay {
        /// The longest a request waits; past it, the request is rejected. `None` lets the
        /// algorithm decide (the leaky queue's own `max_wait`).
        max_wait: Option<Duration>,
    },
    /// The request passes with a warning header, so well-behaved clients can slow down before
    /// the limit is enforced.
    Soft {
        /// The header that carries the warning.
        header: String,
    },
}

impl Action {
    /// The action's name in a rule file.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Reject => "reject",
            Action::Shadow => "shadow",
            Action::Fake { .. } => "fake",
            Action::Delay { .. } => "delay",
            Action::Soft { .. } => "soft",
        }
    }
}

/// How a limit's denials count, resolved once from `shadow_mode` and the action when rules load,
/// so that no front end works it out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// A denial refuses the request, as the action says (`reject`, `fake` or `delay`). Enforced
    /// limits of one request are checked all-or-nothing together.
    Enforce,
    /// A denial is only logged and counted; the request passes and the client never sees the
    /// limit (a dark launch: Envoy's `shadow_mode`, or `action: shadow`).
    Shadow,
    /// A denial passes with a warning header; the limit shows in the rate-limit fields.
    Soft,
}

impl Mode {
    /// The mode of a limit with `action`, in shadow mode or not.
    pub fn of(action: &Action, shadow: bool) -> Mode {
        match action {
            _ if shadow => Mode::Shadow,
            Action::Shadow => Mode::Shadow,
            Action::Soft { .. } => Mode::Soft,
            Action::Reject | Action::Fake { .. } | Action::Delay { .. } => Mode::Enforce,
        }
    }

    /// Whether a denial refuses the request.
    pub fn enforces(self) -> bool {
        self == Mode::Enforce
    }

    /// Whether the limit may show in the answer's rate-limit fields.
    pub fn shown(self) -> bool {
        self != Mode::Shadow
    }
}

/// What a rule does when the store cannot answer (Redis is down, a timeout, a full store): the
/// core's type, so the rule and the fallback that applies it cannot drift apart.
pub use sluice_core::OnStoreError;

/// One domain: a namespace of descriptors, as Envoy's `domain:`.
#[derive(Debug, Clone)]
pub struct DomainConfig {
    /// The domain name.
    pub name: String,
    /// Where `domain:` is, so a second definition can point back to it.
    pub location: Location,
    /// The top-level descriptors.
    pub descriptors: Vec<DescriptorConfig>,
    /// The gateway's `routes` and `trusted_proxies`, when this file holds them.
    pub gateway: Option<crate::gateway::Gateway>,
}

/// One descriptor rule: a key, an optional value, its limits and its children.
#[derive(Debug, Clone)]
pub struct DescriptorConfig {
    /// The entry key this rule matches.
    pub key: String,
    /// How it matches the entry's value.
    pub value: ValueMatch,
    /// Where the descriptor starts.
    pub location: Location,
    /// The limits that apply when a request's descriptor ends here. Empty when the descriptor
    /// only groups children, or is unlimited.
    pub limits: Vec<LimitConfig>,
    /// `rate_limit: {unlimited: true}`: a request ending here is never limited.
    pub unlimited: bool,
    /// Envoy's `detailed_metric`: report metrics per full descriptor value, not per rule.
    pub detailed_metric: bool,
    /// Envoy's `share_threshold`: every value matching a `foo*` wildcard shares one counter.
    pub share_threshold: bool,
    /// Envoy's `value_to_metric`: when this descriptor matched by its key alone or by a
    /// wildcard, metrics name the request's value at this level instead of the rule's.
    pub value_to_metric: bool,
    /// Envoy's `quota_mode`: a denial of this descriptor's limits refuses the request only
    /// when every quota descriptor of the request is denied too.
    pub quota_mode: bool,
    /// Envoy's `metadata`: returned in the answer's dynamic metadata when a request passes
    /// this descriptor's limits (and the service is asked to return it).
    pub metadata: Option<Arc<Metadata>>,
    /// Nested descriptors, matched against the request's next entry.
    pub descriptors: Vec<DescriptorConfig>,
}

impl DescriptorConfig {
    /// How errors name the descriptor: `` `key: value` ``, or `` `key` (no value) ``.
    pub(crate) fn what(&self) -> String {
        match &self.value {
            ValueMatch::Any => format!("`{}` (no value)", self.key),
            v => format!("`{}: {v}`", self.key),
        }
    }
}

/// One limit, with its policy validated and its defaults resolved.
#[derive(Debug, Clone)]
pub struct LimitConfig {
    /// Envoy's `name`: what `replaces` refers to, and a label for metrics.
    pub name: Option<Arc<str>>,
    /// The algorithm and its parameters.
    pub policy: Arc<Policy>,
    /// The names of limits this one removes from a request it applies to.
    pub replaces: Vec<Arc<str>>,
    /// What a denied request gets.
    pub action: Action,
    /// Whether a denial is only recorded (`shadow_mode: true` or `action: shadow`).
    pub shadow: bool,
    /// What happens when the store fails.
    pub on_store_error: OnStoreError,
    /// Where the limit is written.
    pub location: Location,
}
