//! A script's text, assembled from its `.lua` file, and its SHA1 for `EVALSHA`. Public, so that
//! a store built on this one (the hybrid store's sync) assembles its own scripts with the same
//! prelude and shared parts, and runs them through [`RedisStore::eval_each`](crate::RedisStore::eval_each).
//!
//! Assembly puts the algorithm codes' prelude in front, then copies the file with its directive
//! lines replaced:
//!
//! - `--#include <file>`: a part the scripts share, from [`PARTS`].
//! - `--#include <file> <section>`: only that section of the part: how two algorithms that keep
//!   the same state (the sliding log and the concurrency limit, `expiring_log.lua`) write each of
//!   their sections once.
//! - `--#decide_one`: an `if alg == CODE then` chain with, in each branch, the algorithm's
//!   `helpers`, `check` and (when it admits and `write` is set) `store` sections inline, from
//!   its file in `lua/algorithm/`: what the check script runs for a call of one check, with no
//!   function made and no call.
//! - `--#decide_functions`: for every algorithm the call uses (`used[CODE]`), the same sections
//!   as two functions, `name(key, raw, cost, need, p1, p2, p3, p4, write)` returning the check's
//!   outputs and `name_store(key, state, reset)`: what the check script runs for several.
//! - `--#algorithms <section>`: for every algorithm the call uses, that section, which assigns
//!   functions (`name = function` at the start of a line), declared as locals in front of it.
//! - `--#dispatch <var>=<suffix> ...`: an `if alg == CODE then` chain that sets each `var` to the
//!   algorithm's function `<name><suffix>`.
//!
//! A section runs from its `--#section <name>` line to the next; `check.lua` states what the
//! `helpers`, `check` and `store` sections hold, and `refund.lua` the `refund` and `charge` ones. A store section is optional: without one, the state is a string, which
//! `set_value.lua` stores.

use sluice_core::algorithm::ALGORITHMS;

use super::algorithm;

/// The files that scripts include, by name: each `--#include <name>` line of a script is
/// replaced by the file's text, and each `--#include <name> <section>` line by that section.
const PARTS: [(&str, &str); 7] = [
    ("clock.lua", include_str!("lua/clock.lua")),
    ("mul_div.lua", include_str!("lua/mul_div.lua")),
    ("helpers.lua", include_str!("lua/helpers.lua")),
    ("set_value.lua", include_str!("lua/set_value.lua")),
    ("decide_checks.lua", include_str!("lua/decide_checks.lua")),
    (
        "write_reservation.lua",
        include_str!("lua/write_reservation.lua"),
    ),
    ("expiring_log.lua", include_str!("lua/expiring_log.lua")),
];

/// Every file of `lua/algorithm/`, by its stem (the algorithm's name): listed by `build.rs`.
const ALGORITHM_FILES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/algorithm_files.rs"));

/// A script as Redis runs it, and its SHA1.
#[derive(Debug)]
pub struct Script {
    /// The text `EVAL` sends, when Redis does not know the script by its SHA1.
    pub(crate) body: String,
    /// What `EVALSHA` sends on every call.
    pub(crate) sha: String,
}

impl Script {
    /// The script in `file` (a `.lua` file's text): the algorithm codes' prelude, then the file
    /// with its directives expanded.
    ///
    /// # Panics
    ///
    /// When `file` includes a part that does not exist: a mistake in the script's source, met
    /// the first time the script is assembled.
    pub fn assemble(file: &str) -> Script {
        let mut body = algorithm::prelude();
        expand(file, &mut body, &mut Vec::new());
        let sha = redis::Script::new(&body).get_hash().to_owned();
        Script { body, sha }
    }
}

/// The Lua file of the algorithm named `name`.
fn algorithm_file(name: &str) -> &'static str {
    ALGORITHM_FILES
        .iter()
        .find(|(stem, _)| *stem == name)
        .map(|(_, text)| *text)
        .unwrap_or_else(|| panic!("the algorithm {name} has no file lua/algorithm/{name}.lua"))
}

/// The lines of `file` under `--#section <name>`, up to the next section.
fn section<'f>(file: &'f str, name: &str) -> &'f str {
    let marker = format!("--#section {name}\n");
    let Some(start) = file.find(&marker).map(|at| at + marker.len()) else {
        return "";
    };
    let rest = &file[start..];
    &rest[..rest.find("--#section ").unwrap_or(rest.len())]
}

/// An algorithm's `store` section, or `set_value.lua` when it has none.
fn store_section(file: &'static str) -> &'static str {
    match section(file, "store") {
        "" => PARTS[3].1,
        store => store,
    }
}

/// The functions a section assigns: the names at the start of its `name = function` lines.
fn assigned(section: &str) -> impl Iterator<Item = &str> {
    section.lines().filter_map(|line| {
        let (name, rest) = line.split_once(" = function")?;
        let is_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        (is_name && (rest.is_empty() || rest.starts_with('('))).then_some(name)
    })
}

/// Appends `file` to `out` with every directive line expanded. `declared` collects the
/// functions the `--#algorithms` lines so far have declared, for `--#dispatch`.
fn expand(file: &str, out: &mut String, declared: &mut Vec<String>) {
    for line in file.split_inclusive('\n') {
        let directive = line.trim();
        let indent = &line[..line.len() - line.trim_start().len()];
        if let Some(include) = directive.strip_prefix("--#include ") {
            let (name, part_section) = match include.split_once(' ') {
                Some((name, part_section)) => (name, Some(part_section)),
                None => (include, None),
            };
            let (_, part) = PARTS
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("a script includes {name}, which is not in PARTS"));
            let text = match part_section {
                None => part,
                Some(wanted) => match section(part, wanted) {
                    "" => panic!("a script includes section {wanted} of {name}, which has none"),
                    text => text,
                },
            };
            expand(text, out, declared);
        } else if let Some(name) = directive.strip_prefix("--#algorithms ") {
            for spec in &ALGORITHMS {
                let text = section(algorithm_file(spec.name), name);
                let names: Vec<&str> = assigned(text).collect();
                if names.is_empty() {
                    continue;
                }
                let code = spec.name.to_ascii_uppercase();
                out.push_str(&format!("local {}\n", names.join(", ")));
                out.push_str(&format!("if used[{code}] then\n"));
                expand(text, out, declared);
                out.push_str("end\n");
                declared.extend(names.into_iter().map(str::to_owned));
            }
        } else if directive == "--#decide_one" {
            let mut keyword = "if";
            for spec in &ALGORITHMS {
                let file = algorithm_file(spec.name);
                let code = spec.name.to_ascii_uppercase();
                out.push_str(&format!("{indent}{keyword} alg == {code} then\n"));
                expand(section(file, "helpers"), out, declared);
                expand(section(file, "check"), out, declared);
                out.push_str(&format!("{indent}  if allowed == 1 and write then\n"));
                expand(store_section(file), out, declared);
                out.push_str(&format!("{indent}  end\n"));
                keyword = "elseif";
            }
            out.push_str(&format!("{indent}end\n"));
        } else if directive == "--#decide_functions" {
            for spec in &ALGORITHMS {
                let (file, name) = (algorithm_file(spec.name), spec.name);
                let code = spec.name.to_ascii_uppercase();
                out.push_str(&format!(
                    "local {name}, {name}_store\nif used[{code}] then\n"
                ));
                expand(section(file, "helpers"), out, declared);
                out.push_str(&format!(
                    "{name} = function(key, raw, cost, need, p1, p2, p3, p4, write)\n\
                     local allowed, remaining, reset, retry, delay, token, state = \
                     0, 0, 0, 0, 0, '', nil\n"
                ));
                expand(section(file, "check"), out, declared);
                out.push_str("return allowed, remaining, reset, retry, delay, token, state\nend\n");
                out.push_str(&format!("{name}_store = function(key, state, reset)\n"));
                expand(store_section(file), out, declared);
                out.push_str("end\nend\n");
                declared.extend([name.to_owned(), format!("{name}_store")]);
            }
        } else if let Some(vars) = directive.strip_prefix("--#dispatch ") {
            let vars = assignments(vars);
            let mut keyword = "if";
            for spec in &ALGORITHMS {
                let code = spec.name.to_ascii_uppercase();
                let set = set_vars(&vars, spec.name, declared);
                out.push_str(&format!("{indent}{keyword} alg == {code} then {set}\n"));
                keyword = "elseif";
            }
            out.push_str(&format!("{indent}end\n"));
        } else {
            out.push_str(line);
        }
    }
}

/// The `var=suffix` pairs of a directive.
fn assignments(text: &str) -> Vec<(&str, &str)> {
    text.split_whitespace()
        .filter_map(|v| v.split_once('='))
        .collect()
}

/// `a, b = name_a, name_b`: each var set to the algorithm's function with its suffix, or to nil
/// when none of that name is `declared`.
fn set_vars(vars: &[(&str, &str)], algorithm: &str, declared: &[String]) -> String {
    let targets: Vec<&str> = vars.iter().map(|(var, _)| *var).collect();
    let values: Vec<String> = vars
        .iter()
        .map(|(_, suffix)| {
            let function = format!("{algorithm}{suffix}");
            if declared.contains(&function) {
                function
            } else {
                "nil".to_owned()
            }
        })
        .collect();
    format!("{} = {}", targets.join(", "), values.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_include_of_a_section_takes_that_section_only() {
        let script = Script::assemble("a\n--#include expiring_log.lua refund\nb\n");
        // The refund's body, and nothing of the charge that follows it in the file.
        assert!(script.body.contains("redis.call('LREM', key, 0, '-')"));
        assert!(!script.body.contains("after_now(0)"));
        assert!(!script.body.contains("--#"));
        assert!(script.body.ends_with("return true\n\nb\n"));
    }

    #[test]
    fn includes_are_expanded_in_place_and_in_depth() {
        let script = Script::assemble("a\n  --#include helpers.lua\nb\n");
        assert!(script.body.starts_with(&algorithm::prelude()));
        assert!(script.body.contains("local function divmod(a, b)"));
        // helpers.lua includes mul_div.lua in turn.
        assert!(script.body.contains("local function mul_div(a, b, c, up)"));
        assert!(!script.body.contains("--#include"));
        assert!(script.body.ends_with("end\nb\n"));
        assert_eq!(script.sha, redis::Script::new(&script.body).get_hash());
    }

    /// One file per algorithm of the table, and no other: the scripts decide every algorithm.
    #[test]
    fn every_algorithm_has_its_file_and_every_file_its_algorithm() {
        for spec in &ALGORITHMS {
            let file = algorithm_file(spec.name);
            assert!(
                !section(file, "check").is_empty(),
                "{}.lua has a check section",
                spec.name
            );
            for kind in ["refund", "charge"] {
                let function = format!("{}_{kind}", spec.name);
                assert!(
                    assigned(section(file, kind)).any(|f| f == function),
                    "{}.lua assigns {function} in its {kind} section",
                    spec.name
                );
            }
        }
        for (stem, _) in ALGORITHM_FILES {
            assert!(
                ALGORITHMS.iter().any(|s| s.name == *stem),
                "lua/algorithm/{stem}.lua is no algorithm of the table"
            );
        }
    }

    #[test]
    fn one_check_has_each_algorithm_inline_and_several_have_functions() {
        let script = Script::assemble("  --#decide_one\n--#decide_functions\n");
        assert!(script.body.contains("  if alg == TOKEN_BUCKET then\n"));
        assert!(script.body.contains("  elseif alg == SLIDING_LOG then\n"));
        assert!(
            script
                .body
                .contains("local token_bucket, token_bucket_store\nif used[TOKEN_BUCKET] then\n")
        );
        assert!(
            script
                .body
                .contains("token_bucket = function(key, raw, cost, need, p1, p2, p3, p4, write)\n")
        );
        assert!(
            script
                .body
                .contains("sliding_log_store = function(key, state, reset)\n")
        );
        assert!(!script.body.contains("--#"));
    }

    #[test]
    fn algorithms_and_dispatch_take_what_each_section_assigns() {
        let script = Script::assemble("--#algorithms refund\n  --#dispatch f=_refund\n");
        assert!(
            script
                .body
                .contains("local token_bucket_refund\nif used[TOKEN_BUCKET] then\n")
        );
        assert!(
            script
                .body
                .contains("  if alg == TOKEN_BUCKET then f = token_bucket_refund\n")
        );
        assert!(!script.body.contains("--#"));
    }
}
