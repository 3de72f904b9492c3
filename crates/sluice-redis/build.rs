//! Lists the scripts' per-algorithm Lua files (`src/scripts/lua/algorithm/*.lua`) for
//! `scripts/load.rs`, each by its file stem and its text, so that adding an algorithm's file is
//! all the scripts need: no list of them to keep in Rust. `load.rs` checks the list against the
//! algorithm table of `sluice-core`.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/scripts/lua/algorithm");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("src/scripts/lua/algorithm exists")
        .map(|e| e.expect("a readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "lua"))
        .collect();
    files.sort();
    let mut list = String::from("&[\n");
    for path in files {
        println!("cargo:rerun-if-changed={}", path.display());
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a file name in UTF-8");
        writeln!(list, "    ({stem:?}, include_str!({:?})),", path.display()).unwrap();
    }
    list.push(']');
    let out = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("algorithm_files.rs");
    std::fs::write(out, list).expect("OUT_DIR is writable");
}
