//! Hot reload. Semantic tests drive [`Reloader::reload_now`] directly; watcher tests change real
//! files in a temporary directory and poll for the reload with a generous deadline, never sleep
//! for a guessed time.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use sluice_core::{Policy, UnsupportedPolicy};
use sluice_rules::{ErrorKind, LoadError, LoadOptions, ReloadEvent, Reloader};
use sluice_test_support::{rules_file, wait_within};

const DEBOUNCE: Duration = Duration::from_millis(20);
/// How long a watcher test waits for its reload: far beyond any healthy machine's need, so the
/// tests are not timing-sensitive, while a broken watcher still fails instead of hanging.
const DEADLINE: Duration = Duration::from_secs(30);

fn rules(limit: u64) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {{unit: second, requests_per_unit: {limit}}}\n"
    )
}

const INVALID: &str =
    "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: sec, requests_per_unit: 1}\n";

fn limit(reloader: &Reloader) -> u64 {
    let set = reloader.rules();
    set.checks("d", &[[("user", "x")]], 1).checks[0]
        .rule
        .policy
        .limit()
}

fn write(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
}

/// Waits until a reload leaves the rules at `want`, ignoring intermediate outcomes (a watcher
/// may catch a file half-written and report a failure before the complete one); the events
/// that came meanwhile are taken off the channel.
fn wait_for_limit(reloader: &Reloader, events: &Receiver<ReloadEvent>, want: u64) {
    let what = format!("a reload leaves the limit at {want}");
    wait_within(&what, DEADLINE, || {
        events.try_iter().for_each(drop);
        limit(reloader) == want
    });
}

/// Waits for a failed reload whose message contains `needle` (a half-written file may fail
/// differently first).
fn wait_for_failure(events: &Receiver<ReloadEvent>, needle: &str) -> sluice_rules::LoadError {
    let what = format!("a reload fails with {needle:?}");
    wait_within(&what, DEADLINE, || {
        events.try_iter().find_map(|event| match event {
            ReloadEvent::Failed(e) if e.to_string().contains(needle) => Some(e),
            _ => None,
        })
    })
}

fn single_file(limit: u64) -> (tempfile::TempDir, PathBuf, Arc<Reloader>) {
    let (file, dir) = rules_file("rules.yaml", &rules(limit));
    let reloader = Reloader::new(vec![file.clone()]).unwrap();
    (dir, file, reloader)
}

#[test]
fn reload_now_swaps_in_a_valid_change() {
    let (_dir, file, reloader) = single_file(1);
    let events = reloader.subscribe();
    let old = reloader.rules();
    write(&file, &rules(2));
    assert!(matches!(
        reloader.reload_now(),
        ReloadEvent::Reloaded { .. }
    ));
    assert_eq!(limit(&reloader), 2);
    // A reader that took the old set keeps it whole.
    assert_eq!(
        old.checks("d", &[[("user", "x")]], 1).checks[0]
            .rule
            .policy
            .limit(),
        1
    );
    assert_eq!(reloader.stats().reloads.load(Ordering::Relaxed), 1);
    assert!(matches!(
        events.try_recv(),
        Ok(ReloadEvent::Reloaded { .. })
    ));
}

#[test]
fn reload_now_with_the_same_files_changes_nothing() {
    let (_dir, _file, reloader) = single_file(1);
    let before = reloader.rules();
    assert_eq!(reloader.reload_now(), ReloadEvent::Unchanged);
    assert!(Arc::ptr_eq(&before, &reloader.rules()));
    assert_eq!(reloader.stats().unchanged.load(Ordering::Relaxed), 1);
    assert_eq!(reloader.stats().reloads.load(Ordering::Relaxed), 0);
}

#[test]
fn an_invalid_file_keeps_the_old_rules_and_reports_where() {
    let (_dir, file, reloader) = single_file(1);
    write(&file, INVALID);
    let ReloadEvent::Failed(err) = reloader.reload_now() else {
        panic!("an invalid file must fail")
    };
    let e = err.first().unwrap();
    assert_eq!(&*e.location.file, file.display().to_string());
    assert_eq!((e.location.line, e.location.col), (4, 24));
    assert!(matches!(e.kind, ErrorKind::UnknownUnit { .. }));
    assert_eq!(limit(&reloader), 1);
    assert_eq!(reloader.stats().failures.load(Ordering::Relaxed), 1);
    assert_eq!(reloader.last_error(), Some(err));

    write(&file, &rules(3));
    assert!(matches!(
        reloader.reload_now(),
        ReloadEvent::Reloaded { .. }
    ));
    assert_eq!(limit(&reloader), 3);
    assert_eq!(reloader.last_error(), None);
}

#[test]
fn a_deleted_file_keeps_the_old_rules() {
    let (_dir, file, reloader) = single_file(1);
    fs::remove_file(&file).unwrap();
    let ReloadEvent::Failed(err) = reloader.reload_now() else {
        panic!("a missing file must fail")
    };
    assert!(matches!(err.first().unwrap().kind, ErrorKind::Io(_)));
    assert_eq!(limit(&reloader), 1);
}

#[test]
fn the_first_load_must_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    write(&file, INVALID);
    assert!(Reloader::new(vec![file]).is_err());
}

/// A store that holds windows of up to an hour, as the redis store holds up to about 104 days.
fn hourly_store(policy: &Policy) -> Result<(), UnsupportedPolicy> {
    if policy.window() <= Duration::from_secs(3600) {
        Ok(())
    } else {
        Err(UnsupportedPolicy {
            store: "hourly",
            reason: "windows up to an hour only".to_owned(),
        })
    }
}

/// A reloader that holds every rule set to what [`hourly_store`] can hold.
fn held_by_hourly_store(file: &Path) -> Result<Arc<Reloader>, LoadError> {
    Reloader::with_check(vec![file.to_path_buf()], |rules| {
        rules.check_supported(hourly_store)
    })
}

/// Valid rules, with one limit (line 6) that [`hourly_store`] cannot hold.
const DAILY_TEAM: &str = "domain: d
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: team
    rate_limit: {name: per_team, unit: day, requests_per_unit: 5}
";

#[test]
fn rules_the_check_refuses_keep_the_old_rules_and_report_where() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    write(&file, &rules(1));
    let reloader = held_by_hourly_store(&file).unwrap();
    let events = reloader.subscribe();
    write(&file, DAILY_TEAM);
    let ReloadEvent::Failed(err) = reloader.reload_now() else {
        panic!("rules the store cannot hold must not be reloaded")
    };
    assert_eq!(
        err.to_string(),
        format!(
            "{}:6:17: rule \"per_team\" cannot be held by the hourly store: windows up to an \
             hour only",
            file.display()
        )
    );
    assert!(matches!(
        err.first().unwrap().kind,
        ErrorKind::Unsupported { .. }
    ));
    assert_eq!(limit(&reloader), 1, "the old rules stay in force");
    assert_eq!(reloader.stats().failures.load(Ordering::Relaxed), 1);
    assert_eq!(reloader.last_error(), Some(err.clone()));
    assert_eq!(events.try_recv(), Ok(ReloadEvent::Failed(err)));

    write(&file, &rules(2));
    assert!(matches!(
        reloader.reload_now(),
        ReloadEvent::Reloaded { .. }
    ));
    assert_eq!(limit(&reloader), 2);
    assert_eq!(reloader.last_error(), None);
}

#[test]
fn the_first_load_must_pass_the_check_too() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    write(&file, DAILY_TEAM);
    let err = held_by_hourly_store(&file).unwrap_err();
    let e = err.first().unwrap();
    assert_eq!((e.location.line, e.location.col), (6, 17));
    assert!(matches!(e.kind, ErrorKind::Unsupported { .. }));
}

#[test]
fn an_unchanged_rule_keeps_its_counter_key_across_a_reload() {
    let (_dir, file, reloader) = single_file(1);
    let key = |r: &Reloader| {
        r.rules().checks("d", &[[("user", "x")]], 1).checks[0]
            .key
            .clone()
    };
    let before = key(&reloader);
    write(&file, &format!("# edited\n{}", rules(1)));
    assert!(matches!(
        reloader.reload_now(),
        ReloadEvent::Reloaded { .. }
    ));
    assert_eq!(key(&reloader), before);
    write(&file, &rules(5));
    reloader.reload_now();
    assert_ne!(key(&reloader), before);
}

#[test]
fn watcher_sees_an_edit_in_place() {
    let (_dir, file, reloader) = single_file(1);
    let events = reloader.subscribe();
    let _watch = reloader.watch(DEBOUNCE).unwrap();
    write(&file, &rules(2));
    wait_for_limit(&reloader, &events, 2);
}

#[test]
fn watcher_sees_a_rename_over_the_file() {
    let (dir, file, reloader) = single_file(1);
    let events = reloader.subscribe();
    let _watch = reloader.watch(DEBOUNCE).unwrap();
    let tmp = dir.path().join(".rules.yaml.swp");
    write(&tmp, &rules(4));
    fs::rename(&tmp, &file).unwrap();
    wait_for_limit(&reloader, &events, 4);
}

#[test]
fn watcher_keeps_the_old_rules_when_the_new_file_is_invalid() {
    let (_dir, file, reloader) = single_file(1);
    let events = reloader.subscribe();
    let _watch = reloader.watch(DEBOUNCE).unwrap();
    write(&file, INVALID);
    let err = wait_for_failure(&events, "unknown unit");
    assert!(
        err.to_string().contains(":4:24: unknown unit `sec`"),
        "{err}"
    );
    assert_eq!(limit(&reloader), 1);
    assert!(reloader.stats().failures.load(Ordering::Relaxed) >= 1);
}

/// Lays out a directory the way Kubernetes mounts a ConfigMap: the data in a timestamped
/// directory, `..data` a symlink to it, and each visible file a symlink through `..data`.
#[cfg(unix)]
fn configmap(dir: &Path, version: &str, limit: u64) {
    use std::os::unix::fs::symlink;
    let data = dir.join(version);
    fs::create_dir(&data).unwrap();
    write(&data.join("rules.yaml"), &rules(limit));
    let tmp = dir.join("..data_tmp");
    symlink(version, &tmp).unwrap();
    // The atomic step: the new `..data` replaces the old in one rename.
    fs::rename(&tmp, dir.join("..data")).unwrap();
    let visible = dir.join("rules.yaml");
    if fs::symlink_metadata(&visible).is_err() {
        symlink("..data/rules.yaml", &visible).unwrap();
    }
}

#[cfg(unix)]
#[test]
fn watcher_sees_a_kubernetes_configmap_swap_of_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    configmap(dir.path(), "..2024_01_01_00_00_00.000000001", 1);
    let reloader = Reloader::new(vec![dir.path().to_path_buf()]).unwrap();
    assert_eq!(limit(&reloader), 1);
    assert_eq!(
        reloader.rules().domain_names(),
        ["d"],
        "the hidden directories are skipped"
    );
    let events = reloader.subscribe();
    let _watch = reloader.watch(DEBOUNCE).unwrap();
    configmap(dir.path(), "..2024_01_01_00_00_00.000000002", 6);
    wait_for_limit(&reloader, &events, 6);
}

#[cfg(unix)]
#[test]
fn watcher_sees_a_kubernetes_configmap_swap_of_a_single_file() {
    let dir = tempfile::tempdir().unwrap();
    configmap(dir.path(), "..2024_01_01_00_00_00.000000001", 1);
    let reloader = Reloader::new(vec![dir.path().join("rules.yaml")]).unwrap();
    let events = reloader.subscribe();
    let _watch = reloader.watch(DEBOUNCE).unwrap();
    configmap(dir.path(), "..2024_01_01_00_00_00.000000002", 7);
    wait_for_limit(&reloader, &events, 7);
}

/// Rules pushed from elsewhere (an xDS server) go through the same gate as files: a valid set
/// is put in force, an invalid one or one failing the check leaves the old in force.
#[test]
fn pushed_rules_are_installed_or_refused_like_files() {
    use sluice_rules::RuleSet;
    let reloader = Reloader::pushed(LoadOptions::default(), |set: &RuleSet| {
        set.check_supported(hourly_store)
    });
    let events = reloader.subscribe();
    assert!(reloader.rules().domain_names().is_empty());
    let event = reloader.install(RuleSet::parse("xds:a", &rules(7)));
    assert!(matches!(event, ReloadEvent::Reloaded { .. }), "{event:?}");
    assert_eq!(limit(&reloader), 7);
    assert_eq!(
        reloader.install(RuleSet::parse("xds:a", &rules(7))),
        ReloadEvent::Unchanged
    );
    let invalid = reloader.install(RuleSet::parse("xds:a", INVALID));
    assert!(matches!(invalid, ReloadEvent::Failed(_)), "{invalid:?}");
    let refused = reloader.install(RuleSet::parse(
        "xds:b",
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1}\n",
    ));
    assert!(matches!(refused, ReloadEvent::Failed(e) if e.to_string().contains("an hour only")));
    assert_eq!(limit(&reloader), 7);
    assert_eq!(reloader.stats().failures.load(Ordering::Relaxed), 2);
    assert_eq!(events.try_iter().count(), 4);
}
