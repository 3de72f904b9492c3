//! Located errors: every problem in a rule file names its `file:line:col` and says what to do.

use std::fmt;
use std::sync::Arc;

use sluice_core::{PolicyError, UnsupportedPolicy};

/// A position in a rule file. Lines and columns count from 1, as editors and compilers show them.
/// Positions order by file, then line, then column.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location {
    /// The file as it was given (not canonicalized), so the message matches what the operator
    /// typed or mounted.
    pub file: Arc<str>,
    /// The line, from 1.
    pub line: usize,
    /// The column, from 1, in characters.
    pub col: usize,
}

impl Location {
    /// A position in `file`.
    pub fn new(file: Arc<str>, line: usize, col: usize) -> Self {
        Location { file, line, col }
    }

    /// The start of `file`, for errors about the file as a whole (it cannot be read, it is empty).
    pub fn start_of(file: Arc<str>) -> Self {
        Location {
            file,
            line: 1,
            col: 1,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// One problem in a rule file, with where it is. Its message is one line: characters from the
/// file that would break it (a key holding a newline, a tab) are written escaped, so that every
/// error of a load is one line of output, and a log line cannot be forged by a rule file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", one_line(&format!("{}: {}", .location, .kind)))]
pub struct ConfigError {
    /// Where the problem is: the offending key or value.
    pub location: Location,
    /// What the problem is.
    pub kind: ErrorKind,
}

/// `text` with control characters escaped as Rust writes them (`\n`, `\t`, `\u{1b}`).
fn one_line(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

impl ConfigError {
    pub(crate) fn new(location: Location, kind: ErrorKind) -> Self {
        ConfigError { location, kind }
    }
}

/// What is wrong. Each message says what was found and what would be accepted instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ErrorKind {
    /// The file could not be read.
    #[error("cannot read the file: {0}")]
    Io(String),
    /// The text is not valid YAML.
    #[error("invalid YAML: {0}")]
    Syntax(String),
    /// The file holds no document, or only `null`.
    #[error("the file is empty; a rule file needs at least `domain:`")]
    Empty,
    /// More than one YAML document (`---`) in one file.
    #[error("a rule file holds one YAML document; move this one to a file of its own")]
    MultipleDocuments,
    /// YAML anchors and aliases are not supported, because expanding them lets a tiny file grow
    /// into an enormous rule set.
    #[error("YAML aliases (`*name`) are not supported in rule files; write the value out")]
    Alias,
    /// Nesting deeper than the parser accepts.
    #[error("the document is nested more than {max} levels deep")]
    TooDeep {
        /// The deepest nesting accepted.
        max: usize,
    },
    /// A field that this place does not know.
    #[error("unknown field `{field}` in {context}{}; {}",
            suggestion.map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default(),
            expected_fields(expected))]
    UnknownField {
        /// The field as written.
        field: String,
        /// Where it appeared, such as "a descriptor".
        context: &'static str,
        /// The closest known field, when one is close enough to be a likely typo.
        suggestion: Option<&'static str>,
        /// Every field this place accepts.
        expected: &'static [&'static str],
    },
    /// The same field twice in one mapping.
    #[error("field `{field}` is set twice; the first is at line {first_line}")]
    DuplicateField {
        /// The field.
        field: String,
        /// The line of the first occurrence.
        first_line: usize,
    },
    /// A required field is absent.
    #[error("{context} needs `{field}`")]
    MissingField {
        /// The missing field.
        field: &'static str,
        /// What needs it.
        context: &'static str,
    },
    /// A value of the wrong YAML type.
    #[error("`{field}` must be {expected}, found {found}")]
    WrongType {
        /// The field whose value is wrong.
        field: String,
        /// What the field takes, such as "a whole number".
        expected: &'static str,
        /// What was given, such as "a list".
        found: &'static str,
    },
    /// A count below zero.
    #[error("`{field}` is {value}, but it cannot be negative; use 0 to block outright")]
    Negative {
        /// The field.
        field: String,
        /// The value as written.
        value: String,
    },
    /// A whole number too large to represent.
    #[error("`{field}` is {value}, which is too large (the most is {max})")]
    TooLarge {
        /// The field.
        field: String,
        /// The value as written.
        value: String,
        /// The largest value accepted.
        max: u64,
    },
    /// A whole number outside the range the field accepts.
    #[error("`{field}` is {value}, outside {range}")]
    OutOfRange {
        /// The field.
        field: String,
        /// The value as written.
        value: String,
        /// The accepted range, in words.
        range: &'static str,
    },
    /// Two descriptors with the same key and value under the same parent.
    #[error("duplicate descriptor {what}; the first is at line {first_line}, merge the two")]
    DuplicateDescriptor {
        /// The descriptor, as `key=value` or `key`.
        what: String,
        /// The line of the first one.
        first_line: usize,
    },
    /// A rate-limit unit that does not exist.
    #[error("unknown unit `{unit}`{}; expected second, minute, hour, day, week, month or year, \
             or use `window:` for any other length",
            suggestion.map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default())]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The closest unit, if any is close.
        suggestion: Option<&'static str>,
    },
    /// An algorithm name that does not exist.
    #[error("unknown algorithm `{name}`{}; expected one of {}",
            suggestion.map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default(),
            sluice_core::Algorithm::NAMES.join(", "))]
    UnknownAlgorithm {
        /// The name as written.
        name: String,
        /// The closest algorithm, if any is close.
        suggestion: Option<&'static str>,
    },
    /// A value outside a fixed set, such as an unknown action.
    #[error("unknown {what} `{value}`{}; expected one of: {}",
            suggestion.map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default(),
            expected.join(", "))]
    UnknownVariant {
        /// What kind of value, such as "action".
        what: &'static str,
        /// The value as written.
        value: String,
        /// The closest accepted value, if any is close.
        suggestion: Option<&'static str>,
        /// Every accepted value.
        expected: &'static [&'static str],
    },
    /// A duration that does not parse.
    #[error(
        "`{value}` is not a duration; write a whole number and a unit, such as 500ms, 30s, \
             15m, 36h, 7d or 1w"
    )]
    InvalidDuration {
        /// The text as written.
        value: String,
    },
    /// A UTC offset that does not parse or is out of range.
    #[error("`{value}` is not a UTC offset; write it as +03:00, -05:30 or Z, or in seconds")]
    InvalidUtcOffset {
        /// The text as written.
        value: String,
    },
    /// `share_threshold` on a descriptor whose value has no wildcard, as Envoy refuses it.
    #[error(
        "`share_threshold` shares one counter among the values a wildcard matches, but this \
             descriptor's value {value} has no `*`; remove it, or use a wildcard value"
    )]
    ShareWithoutWildcard {
        /// The descriptor's value, quoted, or "is absent".
        value: String,
    },
    /// Two fields that exclude each other.
    #[error("`{first}` and `{second}` cannot both be set; {hint}")]
    Conflict {
        /// One field.
        first: &'static str,
        /// The other.
        second: &'static str,
        /// Which to keep.
        hint: &'static str,
    },
    /// A parameter that the chosen algorithm does not use.
    #[error("`{param}` does not apply to the {algorithm} algorithm; it applies to {applies_to}")]
    ParamNotForAlgorithm {
        /// The parameter.
        param: &'static str,
        /// The algorithm chosen.
        algorithm: &'static str,
        /// The algorithms that take it.
        applies_to: String,
    },
    /// The algorithm refused its parameters.
    #[error("invalid limit: {0}")]
    Policy(#[from] PolicyError),
    /// A limit that replaces itself.
    #[error("limit `{0}` replaces itself; `replaces` names other limits")]
    ReplacesItself(String),
    /// An empty string where a name or key is needed.
    #[error("`{0}` cannot be empty")]
    EmptyString(&'static str),
    /// The same domain in two files, when domains are not merged.
    #[error(
        "domain `{domain}` is already defined at {first}; each domain lives in one file, \
             unless domains are merged (`--merge-domains`, envoyproxy/ratelimit's \
             MERGE_DOMAIN_CONFIG)"
    )]
    DuplicateDomain {
        /// The domain.
        domain: String,
        /// Where it was first defined.
        first: Location,
    },
    /// A top-level descriptor of a merged domain that another file of the domain defines.
    #[error("duplicate descriptor {what} in domain `{domain}`; the first is at {first}")]
    DuplicateMergedDescriptor {
        /// The descriptor, as `key: value`.
        what: String,
        /// The domain.
        domain: String,
        /// Where the first one is.
        first: Location,
    },
    /// Two limits of one descriptor that would share one counter.
    #[error(
        "this limit is the same as the one at line {first_line}; one descriptor cannot \
             carry the same limit twice"
    )]
    DuplicateLimit {
        /// The line of the first one.
        first_line: usize,
    },
    /// A value of the right type whose content is wrong, such as a malformed path pattern or
    /// network.
    #[error("`{field}` is `{value}`, which is not valid: {reason}")]
    Invalid {
        /// The field.
        field: String,
        /// The value as written.
        value: String,
        /// What is wrong, and what would be accepted.
        reason: &'static str,
    },
    /// A route names something that is not there, such as a domain no file defines.
    #[error("{what} `{name}` is not defined; {hint}")]
    Undefined {
        /// What kind of thing, such as "domain".
        what: &'static str,
        /// The name as written.
        name: String,
        /// Where it should be defined.
        hint: &'static str,
    },
    /// A limit that the store in use cannot hold, found when the rules are checked against it.
    #[error(
        "rule \"{rule}\" cannot be held by the {} store: {}",
        .unsupported.store,
        .unsupported.reason
    )]
    Unsupported {
        /// The limit's `name`, or else its descriptor path, such as `api/user`.
        rule: String,
        /// Which store, and why it cannot.
        unsupported: UnsupportedPolicy,
    },
    /// The gateway section (`routes`, `trusted_proxies`) in two files.
    #[error("`{field}` is already set at {first}; the gateway's routes live in one file")]
    DuplicateGateway {
        /// The field.
        field: &'static str,
        /// Where it was first set.
        first: Location,
    },
}

fn expected_fields(expected: &[&str]) -> String {
    if expected.is_empty() {
        "it takes no fields".to_owned()
    } else {
        format!("expected one of: {}", expected.join(", "))
    }
}

/// Every problem found while loading rule files. A load reports them all at once, so the operator
/// fixes a file in one pass rather than one error per run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    errors: Vec<ConfigError>,
}

impl LoadError {
    pub(crate) fn new(errors: Vec<ConfigError>) -> Self {
        debug_assert!(!errors.is_empty());
        LoadError { errors }
    }

    /// The problems, in file order.
    pub fn errors(&self) -> &[ConfigError] {
        &self.errors
    }

    /// The first problem.
    pub fn first(&self) -> Option<&ConfigError> {
        self.errors.first()
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {}

impl From<ConfigError> for LoadError {
    fn from(e: ConfigError) -> Self {
        LoadError { errors: vec![e] }
    }
}
