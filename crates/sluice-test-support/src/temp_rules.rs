//! Rules written to a file in a temporary directory, as a test hands them to a reloader, a
//! server or the binary: the YAML text is the test's, the file must only exist.

use std::path::PathBuf;

/// `rules` (YAML text) written to `name` in a new temporary directory: the file's path, and
/// the directory, which removes the file when dropped and so must outlive its use.
pub fn rules_file(name: &str, rules: &str) -> (PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join(name);
    std::fs::write(&path, rules).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (path, dir)
}
