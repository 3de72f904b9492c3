//! The algorithm codes: which algorithm a check uses, as the scripts know it.
//!
//! A code is a check's first script argument and the first field of every counter stored as a
//! string. It is defined once, in the algorithm table of `sluice-core`: the scripts see each code
//! as a local of a prelude made from [`code`] (`local GCRA = '2'`), never as a literal of their
//! own.

use sluice_core::Algorithm;

/// The code of `algorithm` in script arguments and stored counters: its entry's in the
/// algorithm table, which never changes.
pub fn code(algorithm: Algorithm) -> u8 {
    algorithm.spec().code
}

/// The Lua that names every code, put in front of each script: one local per algorithm, named
/// by its configuration name in capitals, holding its code as a string. A string, because the
/// scripts compare the code as it arrives in `ARGV` and as it is stored, without converting it.
pub(crate) fn prelude() -> String {
    let mut lua =
        String::from("-- The algorithm codes, made from `scripts::algorithm::code` in Rust.\n");
    for algorithm in Algorithm::ALL {
        let name = algorithm.name().to_ascii_uppercase();
        lua.push_str(&format!("local {name} = '{}'\n", code(algorithm)));
    }
    lua
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes are a stored format: this pins them.
    #[test]
    fn the_prelude_names_every_code() {
        assert_eq!(
            prelude(),
            "-- The algorithm codes, made from `scripts::algorithm::code` in Rust.\n\
             local TOKEN_BUCKET = '1'\n\
             local GCRA = '2'\n\
             local LEAKY_QUEUE = '3'\n\
             local FIXED_WINDOW = '4'\n\
             local SLIDING_LOG = '5'\n\
             local SLIDING_COUNTER = '6'\n\
             local BUCKETED_WINDOW = '7'\n\
             local CONCURRENCY_LIMIT = '8'\n"
        );
    }
}
