//! A script's text, assembled from its `.lua` file, and its SHA1 for `EVALSHA`. Public, so that
//! a store built on this one (the hybrid store's sync) assembles its own scripts with the same
//! prelude and shared parts, and runs them through [`RedisStore::eval_each`](crate::RedisStore::eval_each).

use super::algorithm;

/// The files that scripts include, by name: each `--#include <name>` line of a script is
/// replaced by the file's text.
const PARTS: [(&str, &str); 3] = [
    ("clock.lua", include_str!("lua/clock.lua")),
    ("mul_div.lua", include_str!("lua/mul_div.lua")),
    ("helpers.lua", include_str!("lua/helpers.lua")),
];

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
    /// with its includes expanded (`--#include clock.lua`, `mul_div.lua`, `helpers.lua`).
    ///
    /// # Panics
    ///
    /// When `file` includes a part that does not exist: a mistake in the script's source, met
    /// the first time the script is assembled.
    pub fn assemble(file: &str) -> Script {
        let mut body = algorithm::prelude();
        expand(file, &mut body);
        let sha = redis::Script::new(&body).get_hash().to_owned();
        Script { body, sha }
    }
}

/// Appends `file` to `out`, with every `--#include <name>` line replaced by that part, itself
/// expanded.
fn expand(file: &str, out: &mut String) {
    for line in file.split_inclusive('\n') {
        match line.trim().strip_prefix("--#include ") {
            Some(name) => {
                let (_, part) = PARTS
                    .iter()
                    .find(|(n, _)| *n == name)
                    .unwrap_or_else(|| panic!("a script includes {name}, which is not in PARTS"));
                expand(part, out);
            }
            None => out.push_str(line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
