//! Hot reload: keep a [`RuleSet`] current as its files change.
//!
//! [`Reloader::reload_now`] is the one place a reload happens. The file watcher calls it after a
//! quiet period, an admin endpoint may call it directly, and tests call it to check the semantics
//! without waiting on a file system.
//!
//! The watcher watches a file's parent directory rather than the file itself: an editor that
//! saves by renaming a new file over the old one, and Kubernetes, which swaps a `..data` symlink
//! to publish a ConfigMap, both replace the inode a file watch would be attached to. Any change
//! in the directory triggers a reload; one that turns out to leave the rule files as they were
//! (an editor's swap file, say) is counted as unchanged and swaps nothing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};

use crate::error::LoadError;
use crate::ruleset::{LoadOptions, RuleSet};

/// Reload counters, as plain atomics so a metrics exporter can read them without locking.
#[derive(Debug, Default)]
pub struct ReloadStats {
    /// Reloads that swapped in a new rule set.
    pub reloads: AtomicU64,
    /// Reloads that found invalid files, or rules failing the check, and kept the old rules.
    pub failures: AtomicU64,
    /// Reloads that found the files unchanged and swapped nothing.
    pub unchanged: AtomicU64,
}

/// What one reload did. Subscribers receive one per reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadEvent {
    /// A new rule set is in force.
    Reloaded {
        /// The new set's [`RuleSet::fingerprint`].
        fingerprint: u64,
    },
    /// The files were the same as the rules in force; nothing changed.
    Unchanged,
    /// The files are invalid, or their rules fail the reloader's check; the rules in force
    /// stay. The error has every `file:line:col`.
    Failed(LoadError),
}

/// What a rule set must pass, beyond being valid, before it is put in force.
type RuleCheck = Box<dyn Fn(&RuleSet) -> Result<(), LoadError> + Send + Sync>;

/// Holds the rule set in force and replaces it, atomically, when its files change.
pub struct Reloader {
    sources: Vec<PathBuf>,
    /// How the sources are read into one set.
    options: LoadOptions,
    /// Run on every rule set read from the sources, the first included: such as whether the
    /// store can hold every rule. A set that fails it is refused as an invalid file is.
    check: RuleCheck,
    current: ArcSwap<RuleSet>,
    stats: ReloadStats,
    last_error: Mutex<Option<LoadError>>,
    subscribers: Mutex<Vec<mpsc::Sender<ReloadEvent>>>,
    /// Serializes reloads, so two racing reloads cannot swap in an older set after a newer one.
    reloading: Mutex<()>,
}

impl Reloader {
    /// Loads `sources` (files or directories). The first load must succeed: a process should not
    /// start on rules it cannot read.
    pub fn new(sources: Vec<PathBuf>) -> Result<Arc<Self>, LoadError> {
        Self::with_check(sources, |_| Ok(()))
    }

    /// Loads `sources` as [`Reloader::new`] does, and holds every rule set read from them, the
    /// first included, to `check` as well: a set that fails it is refused exactly as an invalid
    /// file is. The first load fails with its error, and a reload keeps the rules in force and
    /// reports it. This is how a service refuses rules its store cannot hold (see
    /// [`RuleSet::check_supported`]).
    pub fn with_check(
        sources: Vec<PathBuf>,
        check: impl Fn(&RuleSet) -> Result<(), LoadError> + Send + Sync + 'static,
    ) -> Result<Arc<Self>, LoadError> {
        Self::with_options(sources, LoadOptions::default(), check)
    }

    /// [`Reloader::with_check`], reading the sources as `options` say, on every reload too.
    pub fn with_options(
        sources: Vec<PathBuf>,
        options: LoadOptions,
        check: impl Fn(&RuleSet) -> Result<(), LoadError> + Send + Sync + 'static,
    ) -> Result<Arc<Self>, LoadError> {
        let check: RuleCheck = Box::new(check);
        let rules = load(&sources, options, &check)?;
        Ok(Arc::new(Reloader {
            sources,
            options,
            check,
            current: ArcSwap::from_pointee(rules),
            stats: ReloadStats::default(),
            last_error: Mutex::new(None),
            subscribers: Mutex::new(Vec::new()),
            reloading: Mutex::new(()),
        }))
    }

    /// A reloader holding a rule set built in code, with no files behind it: a reload keeps it.
    /// How the tower layer limits by a single policy without a rules file.
    pub fn fixed(rules: RuleSet) -> Arc<Self> {
        Arc::new(Reloader {
            sources: Vec::new(),
            options: LoadOptions::default(),
            check: Box::new(|_| Ok(())),
            current: ArcSwap::from_pointee(rules),
            stats: ReloadStats::default(),
            last_error: Mutex::new(None),
            subscribers: Mutex::new(Vec::new()),
            reloading: Mutex::new(()),
        })
    }

    /// A reloader whose rules are pushed to it (by an xDS server) through
    /// [`Reloader::install`], held to `check` as files are. It starts with no rules: nothing is
    /// limited until the first set arrives.
    pub fn pushed(
        options: LoadOptions,
        check: impl Fn(&RuleSet) -> Result<(), LoadError> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Reloader {
            sources: Vec::new(),
            options,
            check: Box::new(check),
            current: ArcSwap::from_pointee(RuleSet::empty()),
            stats: ReloadStats::default(),
            last_error: Mutex::new(None),
            subscribers: Mutex::new(Vec::new()),
            reloading: Mutex::new(()),
        })
    }

    /// Puts `rules` in force, as a reload of files would: a valid, changed set that passes the
    /// check replaces the one in force; an error, or a set that fails the check, leaves it in
    /// force and is reported.
    pub fn install(&self, rules: Result<RuleSet, LoadError>) -> ReloadEvent {
        let _serial = lock(&self.reloading);
        self.swap(rules.and_then(|r| {
            (self.check)(&r)?;
            Ok(r)
        }))
    }

    /// How the sources are read.
    pub fn load_options(&self) -> LoadOptions {
        self.options
    }

    /// The rule set in force. Hold the `Arc` for the length of one request, so the request is
    /// matched against one set from start to finish.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.current.load_full()
    }

    /// `read` of the rule set in force, for a look that ends before anything is awaited. It
    /// takes no count of the set's `Arc`, which every thread would otherwise take and give back
    /// on the one shared counter, several times a request.
    pub fn with_rules<R>(&self, read: impl FnOnce(&RuleSet) -> R) -> R {
        read(&self.current.load())
    }

    /// The files and directories this reloader reads.
    pub fn sources(&self) -> &[PathBuf] {
        &self.sources
    }

    /// Reload counters.
    pub fn stats(&self) -> &ReloadStats {
        &self.stats
    }

    /// The error of the last reload, if it failed; cleared by the next one that succeeds.
    pub fn last_error(&self) -> Option<LoadError> {
        lock(&self.last_error).clone()
    }

    /// A channel that receives every later reload's outcome.
    pub fn subscribe(&self) -> mpsc::Receiver<ReloadEvent> {
        let (tx, rx) = mpsc::channel();
        lock(&self.subscribers).push(tx);
        rx
    }

    /// Reads the files again now. A valid, changed set that passes the check replaces the one
    /// in force; any other leaves it in force and is reported.
    pub fn reload_now(&self) -> ReloadEvent {
        let _serial = lock(&self.reloading);
        if self.sources.is_empty() {
            // A fixed rule set built in code: there is nothing to read again.
            self.stats.unchanged.fetch_add(1, Ordering::Relaxed);
            return ReloadEvent::Unchanged;
        }
        self.swap(load(&self.sources, self.options, &self.check))
    }

    /// Puts a loaded set in force unless it is the same as the one in force, or records its
    /// error; tells the subscribers. Called with `reloading` held.
    fn swap(&self, loaded: Result<RuleSet, LoadError>) -> ReloadEvent {
        let event = match loaded {
            Ok(rules) if rules.fingerprint() == self.current.load().fingerprint() => {
                self.stats.unchanged.fetch_add(1, Ordering::Relaxed);
                *lock(&self.last_error) = None;
                ReloadEvent::Unchanged
            }
            Ok(rules) => {
                let fingerprint = rules.fingerprint();
                self.current.store(Arc::new(rules));
                self.stats.reloads.fetch_add(1, Ordering::Relaxed);
                *lock(&self.last_error) = None;
                ReloadEvent::Reloaded { fingerprint }
            }
            Err(e) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                *lock(&self.last_error) = Some(e.clone());
                ReloadEvent::Failed(e)
            }
        };
        lock(&self.subscribers).retain(|s| s.send(event.clone()).is_ok());
        event
    }

    /// Starts watching the sources. After a change, the watcher waits until the files have
    /// been quiet for `debounce`, so a burst of writes (an editor's save, a ConfigMap update's
    /// several renames) costs one reload. Watching stops when the [`Watcher`] is dropped.
    pub fn watch(self: &Arc<Self>, debounce: Duration) -> Result<Watcher, notify::Error> {
        let (tx, rx) = mpsc::channel::<Signal>();
        let fs_tx = tx.clone();
        // Absolute, as the watcher reports paths, but with links unresolved: a ConfigMap's file
        // is a link into the data directory it swaps.
        let sources: Vec<PathBuf> = self
            .sources
            .iter()
            .map(|s| std::path::absolute(s).unwrap_or_else(|_| s.clone()))
            .collect();
        let mut watcher =
            notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
                let relevant = match res {
                    // Reading the files ourselves produces access events; reacting to them would
                    // reload forever.
                    Ok(event) => {
                        !matches!(event.kind, EventKind::Access(_))
                            && concerns_sources(&sources, &event.paths)
                    }
                    // A lost event (an overflowing queue) may hide a change: reload to be sure.
                    Err(_) => true,
                };
                if relevant {
                    let _ = fs_tx.send(Signal::Changed);
                }
            })?;
        for source in &self.sources {
            let (target, mode) = watch_target(source);
            watcher.watch(&target, mode)?;
        }
        let reloader = Arc::clone(self);
        let thread = std::thread::Builder::new()
            .name("sluice-rules-watch".into())
            .spawn(move || debounce_loop(&reloader, &rx, debounce))
            .map_err(|e| notify::Error::generic(&format!("cannot start the watch thread: {e}")))?;
        Ok(Watcher {
            watcher: Some(watcher),
            stop: tx,
            thread: Some(thread),
        })
    }
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("sources", &self.sources)
            .field("current", &self.current)
            .field("stats", &self.stats)
            .field("last_error", &self.last_error)
            .finish_non_exhaustive()
    }
}

/// Reads `sources` and holds the rule set to `check`.
fn load(
    sources: &[PathBuf],
    options: LoadOptions,
    check: &RuleCheck,
) -> Result<RuleSet, LoadError> {
    let rules = RuleSet::load_all_with(sources, options)?;
    check(&rules)?;
    Ok(rules)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The longest a stream of changes delays a reload, in debounce periods.
const MAX_DEBOUNCES: u32 = 10;

enum Signal {
    Changed,
    Stop,
}

/// Whether a change to `paths` can change the rules from `sources`. A file source is watched
/// through its directory, where other files change too (a log written beside the rules would
/// otherwise reload them on every line, and a failing reload log about it, forever): only the
/// file itself counts, and the `..`-named entries through which a Kubernetes ConfigMap swaps
/// its files (`..data`, `..2026_11_23_…`). Anything inside a directory source counts.
fn concerns_sources(sources: &[PathBuf], paths: &[PathBuf]) -> bool {
    // An event without paths says nothing about where: reload to be sure.
    if paths.is_empty() {
        return true;
    }
    paths.iter().any(|path| {
        sources.iter().any(|source| {
            if path.starts_with(source) {
                return true;
            }
            let (Some(dir), Some(name)) = (source.parent(), source.file_name()) else {
                return false;
            };
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            let in_dir = path.parent() == Some(dir);
            let configmap = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(".."));
            in_dir && (path.file_name() == Some(name) || configmap)
        })
    })
}

/// A directory is watched whole; a file through its parent, so replacing the file is seen too.
fn watch_target(source: &Path) -> (PathBuf, RecursiveMode) {
    if source.is_dir() {
        return (source.to_path_buf(), RecursiveMode::Recursive);
    }
    let parent = match source.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    (parent, RecursiveMode::NonRecursive)
}

fn debounce_loop(reloader: &Reloader, rx: &mpsc::Receiver<Signal>, debounce: Duration) {
    loop {
        match rx.recv() {
            Ok(Signal::Changed) => {}
            Ok(Signal::Stop) | Err(_) => return,
        }
        // Wait for quiet, but not forever: a directory that never stops changing (a log
        // written beside the rules) must not hold back reloads indefinitely.
        let deadline = Instant::now() + debounce.saturating_mul(MAX_DEBOUNCES);
        loop {
            let wait = debounce.min(deadline.saturating_duration_since(Instant::now()));
            match rx.recv_timeout(wait) {
                Ok(Signal::Changed) if Instant::now() < deadline => continue,
                Ok(Signal::Changed) | Err(RecvTimeoutError::Timeout) => break,
                Ok(Signal::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        reloader.reload_now();
    }
}

/// A running file watch. Dropping it stops the watch and joins its thread.
#[derive(Debug)]
pub struct Watcher {
    watcher: Option<RecommendedWatcher>,
    stop: mpsc::Sender<Signal>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Signal::Changed => "Changed",
            Signal::Stop => "Stop",
        })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        drop(self.watcher.take());
        let _ = self.stop.send(Signal::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changes_to_the_rule_files_concern_them() {
        let file = vec![PathBuf::from("/etc/sluice/rules.yaml")];
        let p = |s: &str| vec![PathBuf::from(s)];
        assert!(concerns_sources(&file, &p("/etc/sluice/rules.yaml")));
        // A ConfigMap's swap of its data directory, seen from the mounted directory.
        assert!(concerns_sources(&file, &p("/etc/sluice/..data")));
        assert!(concerns_sources(
            &file,
            &p("/etc/sluice/..2026_11_23_06_00_00.123")
        ));
        // A log or an editor's backup beside the rules is not a change to them.
        assert!(!concerns_sources(&file, &p("/etc/sluice/sluice.log")));
        assert!(!concerns_sources(&file, &p("/etc/sluice/rules.yaml.swp")));
        assert!(!concerns_sources(&file, &p("/etc/other/rules.yaml")));
        // Anything in a directory of rules counts; an event without paths does too.
        let dir = vec![PathBuf::from("/etc/sluice/rules.d")];
        assert!(concerns_sources(&dir, &p("/etc/sluice/rules.d/api.yaml")));
        assert!(!concerns_sources(&dir, &p("/etc/sluice/sluice.log")));
        assert!(concerns_sources(&file, &[]));
    }
}
