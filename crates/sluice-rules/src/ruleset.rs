//! A loaded set of domains, ready to match requests.

use std::fs;
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use siphasher::sip::SipHasher13;
use sluice_core::{Policy, UnsupportedPolicy};

use crate::decode::decode_file;
use crate::error::{ConfigError, ErrorKind, LoadError, Location};
use crate::gateway::Gateway;
use crate::matcher::{CompiledDomain, DescriptorEntries, Matches, Rule, match_request};
use crate::model::DomainConfig;

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// How deep a rules directory is searched for files. Kubernetes mounts are flat; the bound only
/// keeps a symlink loop from running forever.
const MAX_DIR_DEPTH: usize = 8;

/// Every domain of a rule file or directory, compiled for matching.
///
/// A rule set is immutable: a reload builds a new one and swaps it in whole (see
/// [`crate::Reloader`]), so a request always sees one set, never a mix of two.
#[derive(Debug)]
pub struct RuleSet {
    pub(crate) domains: HashMap<String, CompiledDomain>,
    /// A hash of every source file's name and text, so a reload that finds the same files can
    /// skip the swap.
    fingerprint: u64,
    /// The gateway section, from the one file that has it.
    gateway: Option<Arc<Gateway>>,
}

impl RuleSet {
    /// A rule set with no domains: nothing is limited.
    pub fn empty() -> Self {
        RuleSet {
            domains: HashMap::default(),
            fingerprint: 0,
            gateway: None,
        }
    }

    /// A rule set built in code from domain configurations, for embedders that have no rule
    /// file. A later domain of the same name replaces an earlier one; there are no routes.
    pub fn from_domains(domains: impl IntoIterator<Item = DomainConfig>) -> Self {
        let mut set = Self::empty();
        let mut fingerprint = SipHasher13::new();
        for d in domains {
            fingerprint.write(d.name.as_bytes());
            set.domains
                .insert(d.name.clone(), CompiledDomain::compile(d));
        }
        set.fingerprint = fingerprint.finish();
        set
    }

    /// Whether `domain` has a concurrency limit: its requests are then held with a reservation
    /// that the answer's end releases, not only checked (`sluice-http`'s layer and the gateway).
    pub fn limits_concurrency(&self, domain: &str) -> bool {
        self.domains.get(domain).is_some_and(|d| d.concurrent)
    }

    /// Parses one file's text. `name` is how errors refer to it.
    pub fn parse(name: &str, text: &str) -> Result<Self, LoadError> {
        Self::from_sources([(name, text)])
    }

    /// Parses several files' texts as one set. Every file is decoded even after an error, so all
    /// problems are reported together.
    pub fn from_sources<'a, I>(sources: I) -> Result<Self, LoadError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        Self::from_sources_with(sources, LoadOptions::default())
    }

    /// [`RuleSet::from_sources`], reading the files as `options` say.
    pub fn from_sources_with<'a, I>(sources: I, options: LoadOptions) -> Result<Self, LoadError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut errors = Vec::new();
        let mut configs: Vec<DomainConfig> = Vec::new();
        let mut fingerprint = SipHasher13::new();
        let mut gateway: Option<Gateway> = None;
        for (name, text) in sources {
            fingerprint.write(name.as_bytes());
            fingerprint.write_u8(0);
            fingerprint.write(text.as_bytes());
            fingerprint.write_u8(0);
            let file: Arc<str> = Arc::from(name);
            match decode_file(&file, text) {
                Ok(mut domain) => {
                    if let Some(g) = domain.gateway.take() {
                        take_gateway(&mut gateway, g, &mut errors);
                    }
                    match configs.iter_mut().find(|d| d.name == domain.name) {
                        None => configs.push(domain),
                        Some(first) if options.merge_domains => {
                            merge_domain(first, domain, &mut errors);
                        }
                        Some(first) => errors.push(ConfigError::new(
                            domain.location.clone(),
                            ErrorKind::DuplicateDomain {
                                domain: domain.name.clone(),
                                first: first.location.clone(),
                            },
                        )),
                    }
                }
                Err(e) => errors.extend(e.errors().iter().cloned()),
            }
        }
        let domains: HashMap<String, CompiledDomain> = configs
            .into_iter()
            .map(|d| (d.name.clone(), CompiledDomain::compile(d)))
            .collect();
        if let Some(g) = &gateway {
            for route in &g.routes {
                if !domains.contains_key(&route.domain) {
                    errors.push(ConfigError::new(
                        route.location.clone(),
                        ErrorKind::Undefined {
                            what: "domain",
                            name: route.domain.clone(),
                            hint: "define it in a rule file, or leave `domain` out to use this file's",
                        },
                    ));
                }
            }
        }
        if errors.is_empty() {
            Ok(RuleSet {
                domains,
                fingerprint: fingerprint.finish(),
                gateway: gateway.map(Arc::new),
            })
        } else {
            Err(LoadError::new(errors))
        }
    }

    /// Loads a file, or every `.yaml`/`.yml` file under a directory. Names starting with `.` are
    /// skipped, which skips Kubernetes' `..data` and `..2024_…` internals while still reading
    /// the visible symlinks that point into them.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        Self::load_all(std::slice::from_ref(&path.to_path_buf()))
    }

    /// Loads several files and directories as one set, as `sluice validate PATH...` does.
    pub fn load_all(paths: &[PathBuf]) -> Result<Self, LoadError> {
        Self::load_all_with(paths, LoadOptions::default())
    }

    /// [`RuleSet::load_all`], reading the files as `options` say.
    pub fn load_all_with(paths: &[PathBuf], options: LoadOptions) -> Result<Self, LoadError> {
        let mut files = Vec::new();
        let mut errors = Vec::new();
        for path in paths {
            collect_files(path, 0, true, &mut files, &mut errors);
        }
        let mut texts = Vec::with_capacity(files.len());
        for file in files {
            let name = file.display().to_string();
            match fs::read_to_string(&file) {
                Ok(text) => texts.push((name, text)),
                Err(e) => errors.push(io_error(&name, &e)),
            }
        }
        let loaded =
            Self::from_sources_with(texts.iter().map(|(n, t)| (n.as_str(), t.as_str())), options);
        match loaded {
            Ok(set) if errors.is_empty() => Ok(set),
            Ok(_) => Err(LoadError::new(errors)),
            Err(e) => {
                errors.extend(e.errors().iter().cloned());
                Err(LoadError::new(errors))
            }
        }
    }

    /// The checks a request makes: for each descriptor that ends at a limited rule, one check
    /// per limit, costing the descriptor's own cost or else `cost`. An unknown domain yields
    /// nothing, as in envoyproxy/ratelimit.
    pub fn checks<D: DescriptorEntries>(
        &self,
        domain: &str,
        descriptors: &[D],
        cost: u64,
    ) -> Matches {
        match self.domains.get(domain) {
            Some(d) => match_request(d, descriptors, cost),
            None => Matches::default(),
        }
    }

    /// The domain's configuration as it was read.
    pub fn domain(&self, name: &str) -> Option<&DomainConfig> {
        self.domains.get(name).map(|d| &d.config)
    }

    /// Every domain name, sorted.
    pub fn domain_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.domains.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Every rule (one per limit) of every domain, in no particular order. The gateway's routes
    /// hold no limits of their own: they name domains, whose rules these are.
    pub fn rules(&self) -> impl Iterator<Item = &Arc<Rule>> {
        self.domains.values().flat_map(CompiledDomain::rules)
    }

    /// Checks every rule's policy with `supports`, a store's
    /// [`Store::supports`](sluice_core::Store::supports), so that a rule the store cannot hold
    /// is refused when the rules load instead of failing each request. The error names every
    /// such rule with its `file:line:col`, in file order.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice_core::UnsupportedPolicy;
    /// use sluice_rules::RuleSet;
    ///
    /// let rules = RuleSet::parse("rules.yaml", r#"
    /// domain: api
    /// descriptors:
    ///   - key: user
    ///     rate_limit: {unit: year, requests_per_unit: 1000}
    /// "#).unwrap();
    /// // A store that holds windows of up to a week.
    /// let week = Duration::from_secs(7 * 86_400);
    /// let err = rules
    ///     .check_supported(|policy| {
    ///         if policy.window() <= week {
    ///             Ok(())
    ///         } else {
    ///             Err(UnsupportedPolicy { store: "weekly", reason: "too long".into() })
    ///         }
    ///     })
    ///     .unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "rules.yaml:5:17: rule \"api/user\" cannot be held by the weekly store: too long"
    /// );
    /// ```
    pub fn check_supported(
        &self,
        supports: impl Fn(&Policy) -> Result<(), UnsupportedPolicy>,
    ) -> Result<(), LoadError> {
        let mut errors: Vec<ConfigError> = self
            .rules()
            .filter_map(|rule| {
                let unsupported = supports(&rule.policy).err()?;
                let name = rule.label();
                Some(ConfigError::new(
                    rule.location.clone(),
                    ErrorKind::Unsupported {
                        rule: name.to_owned(),
                        unsupported,
                    },
                ))
            })
            .collect();
        if errors.is_empty() {
            return Ok(());
        }
        errors.sort_by(|a, b| a.location.cmp(&b.location));
        Err(LoadError::new(errors))
    }

    /// The gateway's routes and trusted proxies, if a file set them.
    pub fn gateway(&self) -> Option<&Arc<Gateway>> {
        self.gateway.as_ref()
    }

    /// A hash of the source files; equal fingerprints mean the same files with the same text.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }
}

/// How rule files are read into one set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Several files of one domain add their descriptors to it, as envoyproxy/ratelimit's
    /// `MERGE_DOMAIN_CONFIG` does; a top-level descriptor defined in two of them is an error.
    /// Off, a domain in a second file is an error.
    pub merge_domains: bool,
}

/// Adds `more`'s descriptors to `into`, a domain of the same name from an earlier file. Each
/// file's settings (its `action`, `on_store_error`) already sit on its own descriptors.
fn merge_domain(into: &mut DomainConfig, more: DomainConfig, errors: &mut Vec<ConfigError>) {
    for d in more.descriptors {
        if let Some(first) = into
            .descriptors
            .iter()
            .find(|f| f.key == d.key && f.value == d.value)
        {
            let what = d.what();
            errors.push(ConfigError::new(
                d.location.clone(),
                ErrorKind::DuplicateMergedDescriptor {
                    what,
                    domain: into.name.clone(),
                    first: first.location.clone(),
                },
            ));
            continue;
        }
        into.descriptors.push(d);
    }
}

/// Keeps the first file's gateway section; a second is an error pointing back at the first.
fn take_gateway(slot: &mut Option<Gateway>, new: Gateway, errors: &mut Vec<ConfigError>) {
    match (
        slot.as_ref().and_then(|g| g.location.clone()),
        new.location.clone(),
    ) {
        (Some(first), Some(at)) => errors.push(ConfigError::new(
            at,
            ErrorKind::DuplicateGateway {
                field: "routes",
                first,
            },
        )),
        _ => *slot = Some(new),
    }
}

impl Default for RuleSet {
    fn default() -> Self {
        Self::empty()
    }
}

fn io_error(name: &str, e: &std::io::Error) -> ConfigError {
    ConfigError::new(
        Location::start_of(Arc::from(name)),
        ErrorKind::Io(e.to_string()),
    )
}

fn is_rule_file(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    )
}

/// Adds `path`'s rule files, sorted by name so the load order (and so which of two duplicate
/// domains is "first") does not depend on the file system.
fn collect_files(
    path: &Path,
    depth: usize,
    explicit: bool,
    files: &mut Vec<PathBuf>,
    errors: &mut Vec<ConfigError>,
) {
    let name = path.display().to_string();
    // `metadata` follows symlinks: a Kubernetes file is a symlink into `..data`.
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) => {
            errors.push(io_error(&name, &e));
            return;
        }
    };
    if meta.is_file() {
        // A file named on the command line is read whatever its extension.
        if explicit || is_rule_file(path) {
            files.push(path.to_path_buf());
        }
        return;
    }
    if !meta.is_dir() || depth >= MAX_DIR_DEPTH {
        return;
    }
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) => {
            errors.push(io_error(&name, &e));
            return;
        }
    };
    let mut children: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    children.sort();
    for child in children {
        collect_files(&child, depth + 1, false, files, errors);
    }
}
